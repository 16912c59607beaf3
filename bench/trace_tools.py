"""The trace tools' wall time and peak memory, side by side with an earlier commit.

    python bench/trace_tools.py [--trace T.mkt ...] [--baseline COMMIT] [--reps N] [--json OUT]

Each trace (default: the main job's, recorded with this checkout) is read by both
trees' `mkemu trace` in fresh processes, interleaved (baseline, current, ...), for
each export: the text summary, `--json` and `--html`. Figures are medians over the
repetitions of the command's wall time and the process's peak RSS; the outputs of
the two trees must be byte-identical (a table column says so). Prints a markdown
table and writes JSON (default bench/out/trace_tools.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import OUT_DIR, finish, table
from core_speed import extract, current_tree

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASELINE = "8617200"   # the last commit before the trace tools read and walk traces in pieces

# One `mkemu trace` command in a fresh process: its wall time, peak RSS and a hash of
# what it wrote (stdout, or the output file).
COMMAND = r"""
import hashlib, io, json, resource, sys, time, contextlib
from mkemu.cli import main
argv, out = json.loads(sys.argv[2]), sys.argv[3]
buf = io.StringIO()
t0 = time.perf_counter()
with contextlib.redirect_stdout(buf):
    code = main(argv)
wall = time.perf_counter() - t0
data = open(out, "rb").read() if out != "-" else buf.getvalue().encode()
print(json.dumps({"code": code, "wall_s": wall, "sha": hashlib.sha256(data).hexdigest()[:16],
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

EXPORTS = {"summary": [], "json": ["--json"], "html": ["--html", "{out}"]}


def record_main_job(path: Path) -> Path:
    """The main job's trace, recorded with this checkout."""
    subprocess.run([sys.executable, "-c", "import sys; from mkemu.cli import main; sys.exit(main(sys.argv[1:]))",
                    "run", "k3_megakernel", "--trace", str(path)], check=True, capture_output=True, cwd=ROOT)
    return path


def run_command(tree: Path, trace: Path, export: str, tmp: Path) -> dict:
    out = tmp / f"out-{export}.html" if "{out}" in EXPORTS[export] else None
    argv = ["trace", str(trace), *[a.format(out=out) for a in EXPORTS[export]]]
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run([sys.executable, "-c", COMMAND, str(tree), json.dumps(argv), str(out or "-")],
                          capture_output=True, text=True, env=env, cwd=tree)
    if proc.returncode:
        raise RuntimeError(f"mkemu trace failed in {tree}:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if result["code"] != 0:
        raise RuntimeError(f"mkemu {' '.join(argv)} exited {result['code']} in {tree}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", action="append", help="a trace file (repeatable; default: the main job's)")
    parser.add_argument("--baseline", default=DEFAULT_BASELINE)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--exports", default=",".join(EXPORTS), help="of " + ", ".join(EXPORTS))
    parser.add_argument("--json", default=str(OUT_DIR / "trace_tools.json"))
    args = parser.parse_args()
    wall0 = time.perf_counter()
    exports = args.exports.split(",")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        trees = {"baseline": extract(args.baseline, tmp / "base"), "current": current_tree(tmp)}
        traces = [Path(t).resolve() for t in args.trace] if args.trace else [record_main_job(tmp / "main.mkt")]
        samples: dict = {}
        for trace in traces:
            for export in exports:
                for _ in range(args.reps):
                    for name, tree in trees.items():
                        got = run_command(tree, trace, export, tmp)
                        samples.setdefault((trace.name, export, name), []).append(got)
                        print(f"{trace.name} {export} {name}: {got['wall_s']:.2f} s, {got['rss_mb']:.0f} MB",
                              file=sys.stderr)
        sizes = {trace.name: trace.stat().st_size / 1e6 for trace in traces}
    rows, records = [], []
    for trace in traces:
        for export in exports:
            med = {name: {k: statistics.median(s[k] for s in samples[(trace.name, export, name)])
                          for k in ("wall_s", "rss_mb")} for name in trees}
            shas = {s["sha"] for name in trees for s in samples[(trace.name, export, name)]}
            b, c = med["baseline"], med["current"]
            records.append({"trace": str(trace), "trace_mb": sizes[trace.name], "export": export,
                            "baseline": b, "current": c, "speedup": b["wall_s"] / c["wall_s"],
                            "rss_ratio": b["rss_mb"] / c["rss_mb"], "same_output": len(shas) == 1})
            rows.append([trace.name, export, f"{b['wall_s']:.2f}", f"{c['wall_s']:.2f}",
                         f"{b['wall_s'] / c['wall_s']:.2f}x", f"{b['rss_mb']:,.0f}", f"{c['rss_mb']:,.0f}",
                         "yes" if len(shas) == 1 else "NO"])
    print(table(f"mkemu trace, baseline {args.baseline} vs this checkout (medians of {args.reps})",
                ["trace", "export", "baseline s", "current s", "speedup", "baseline MB", "current MB",
                 "same output"], rows))
    finish({"baseline": args.baseline, "reps": args.reps, "runs": records}, args.json,
           time.perf_counter() - wall0)


if __name__ == "__main__":
    main()
