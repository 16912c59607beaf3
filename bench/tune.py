"""`mkemu tune` on the shipped programs: the gain over the shipped defaults, and how
long the tune takes.

    python bench/tune.py [--cases NAME,...] [--jobs 2] [--json OUT]

Runs each case as the user would (`python -m mkemu.cli tune ...`, in a fresh
process), reads the tune's own record and prints a markdown table: the space, the
search, trials run and rejected, the default's and the best variant's objective, the
speedup, and the wall time of the whole command (measured here around it, and as the
command printed it). Writes the figures as JSON (default bench/out/tune.json) and
keeps each tune's record next to it.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
K3 = "programs/k3_megakernel.mk"

CASES = {
    # The must-hold: a 4-value space of the megakernel at k3-tiny, two local processes.
    "k3-tiny-WR": (K3, "--model", "k3-tiny", "--param", "WR_MAX"),
    "k3-tiny-all": (K3, "--model", "k3-tiny", "--budget", "24"),
    "k3-mini-b8-WR": (K3, "--batch", "8", "--prompt-len", "1", "--steps", "2", "--param", "WR_MAX"),
    "k3-mini-b8-repl": (K3, "--batch", "8", "--prompt-len", "1", "--steps", "2", "--param", "REPL_BYTES",
                        "--param", "KDA_ROW_SPLIT", "--budget", "16"),
    "matmul-double-buffered": ("programs/examples/matmul_double_buffered.mk",),
    "matmul-single-buffered": ("programs/examples/matmul_single_buffered.mk",),
    "all-reduce-CL_SLOTS": ("programs/examples/all_reduce.mk", "--param", "CL_SLOTS"),
}


def run_case(name: str, argv: tuple[str, ...], jobs: int) -> dict:
    record_path = OUT / f"tune-{name}.json"
    record_path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "mkemu.cli", "tune", *argv, "--jobs", str(jobs), "--out", str(record_path)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode not in (0, 1):
        raise SystemExit(f"{name}: {' '.join(cmd)} failed:\n{done.stderr}")
    printed = re.search(r"wall ([\d.]+) s", done.stdout)
    record = json.loads(record_path.read_text())
    trials = record["trials"]
    default = next(t for t in trials if t["default"])
    best = next((t for t in trials if t["index"] == record["best"]), None)
    return {
        "case": name, "command": "mkemu tune " + " ".join(argv) + f" --jobs {jobs}",
        "space": record["space"], "search": record["search"], "trials": len(trials),
        "rejected": sum(t["status"] == "rejected" for t in trials),
        "default": default["params"], "default_objective": default["objective"],
        "best": best["params"] if best else None, "best_objective": best["objective"] if best else None,
        "speedup": default["objective"] / best["objective"] if best and default["objective"] else None,
        "wall_s": round(wall, 1), "printed_wall_s": float(printed.group(1)) if printed else None,
        "table": done.stdout,
    }


def table(rows: list[dict]) -> str:
    lines = ["| case | space | search | trials (rejected) | default us/step | best | best us/step | speedup "
             "| wall s (printed) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        space = " x ".join(f"{k}({len(v)})" for k, v in r["space"].items())
        best = "the default" if r["best"] == r["default"] else " ".join(f"{k}={v}" for k, v in r["best"].items())
        speedup = f"{r['speedup']:.3f}x" if r["speedup"] else "-"
        lines.append(f"| {r['case']} | {space} | {r['search']} | {r['trials']} ({r['rejected']}) | "
                     f"{r['default_objective']:.3f} | {best} | {r['best_objective']:.3f} | {speedup} | "
                     f"{r['wall_s']} ({r['printed_wall_s']}) |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, from: " + ", ".join(CASES))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", default=str(OUT / "tune.json"))
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.cases.split(","):
        rows.append(run_case(name, CASES[name], args.jobs))
        print(f"{name}: {rows[-1]['trials']} trials, {rows[-1]['wall_s']} s", file=sys.stderr, flush=True)
    print(table(rows))
    Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
