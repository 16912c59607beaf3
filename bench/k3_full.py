"""Full-size Kimi K3 on 16 TPU v7 chips, timing only, against the published budget.

    python bench/k3_full.py [--programs megakernel,per-op] [--batches 1,2,4,8]
                            [--mesh 4x2x2] [--model k3-full] [--layers N] [--json OUT]
                            [-- more run options]

Each (program, batch) is one decode step (`--prompt-len 1 --steps 1`) of
`mkemu run PROGRAM --model k3-full --mesh 4x2x2 --timing-only --json` in a fresh
process, whose wall time and peak RSS are measured from outside (os.wait4). Prints two
markdown tables, the step (ms per step, tok/s, fraction of the HBM floor, instructions,
wall, RSS) and the per-layer budget by category next to the published one (MISSION.md:
55 µs per layer = weight streaming 25 + collectives 14 + experts 9 + attention 1.5 +
routing 0.7, plus about 195 µs fixed per step), and writes JSON (default
bench/out/k3_full.json).

`--layers N` runs a cut of the model instead: its first N layers with the same rule for
where MLA goes (0-based layers l % 4 == 3, and the last one) and the same dense layers
below N, everything else as configured. A cut keeps the per-layer figures of the whole
model (its mix of KDA and MLA layers differs a little) at a fraction of the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = {"per-op": "k3_per_op", "super-op": "k3_superop", "megakernel": "k3_megakernel"}
CATEGORIES = ("weight_streaming", "collectives", "experts", "attention", "routing", "other")


def cut_model(model: str, layers: int, folder: Path) -> str:
    """A TOML file with the first `layers` layers of `model` (a shipped name or a path)."""
    src = Path(model) if model.endswith(".toml") else ROOT / "programs" / "k3" / "configs" / f"{model}.toml"
    text = src.read_text()
    dense = [int(x) for x in re.search(r"^dense_layers = \[([^\]]*)\]", text, re.M).group(1).split(",") if x.strip()]
    mla = [lay for lay in range(layers) if lay % 4 == 3 or lay == layers - 1]
    for key, value in (("name", f'"{src.stem}-{layers}l"'), ("n_layers", str(layers)),
                       ("dense_layers", str([d for d in dense if d < layers])), ("mla_layers", str(mla))):
        text, n = re.subn(rf"^{key} = (\[[^\]]*\]|.*)$", f"{key} = {value}", text, count=1, flags=re.M)
        if n != 1:
            raise SystemExit(f"{src}: no `{key} = ...` line to cut")
    out = folder / f"{src.stem}-{layers}l.toml"
    out.write_text(text)
    return str(out)


def run(program: str, batch: int, mesh: str, model: str, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "mkemu.cli", "run", PROGRAMS[program], "--model", model, "--mesh", mesh,
           "--timing-only", "--batch", str(batch), "--prompt-len", "1", "--steps", "1", "--json", *extra]
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        out = child.stdout.read()
        _, status, usage = os.wait4(child.pid, 0)     # this child's own peak RSS
        child.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        if child.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(cmd)} failed ({child.returncode}):\n{err.read()[-3000:]}")
    report = json.loads(out)
    report["process_wall_s"] = wall
    report["max_rss_gb"] = usage.ru_maxrss * 1024 / 1e9      # ru_maxrss is in KiB on Linux
    return report


def step_table(results: list[dict]) -> str:
    head = ("| program | batch | ms/step | tok/s | HBM GB/step | % of HBM floor | per layer µs | fixed µs | "
            "instructions/step | wall s | max RSS GB |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        b = r["budget"]
        lines.append(f"| {r['name']} | {r['batch']} | {r['us_per_step'] / 1000:.2f} | "
                     f"{r['tokens_per_s_aggregate']:.0f} | {r['hbm_bytes_per_step'] / 1e9:.1f} | "
                     f"{r['fraction_of_floor'] * 100:.1f} | {b['layer_us']:.1f} | {b['fixed_us_per_step']:.1f} | "
                     f"{r['instructions_per_step']:,.0f} | {r['process_wall_s']:.0f} | {r['max_rss_gb']:.2f} |")
    pub = results[0]["budget"]["published"] if results else None
    if pub:
        us = pub["layer_us"] * 92 + pub["fixed_us_per_step"]
        lines.append(f"| published megakernel | 1 | {us / 1000:.2f} | {1e6 / us:.0f} | | | {pub['layer_us']:.1f} | "
                     f"{pub['fixed_us_per_step']:.1f} | | | |")
    return "\n".join(lines)


def budget_table(results: list[dict]) -> str:
    head = "| program | batch | " + " | ".join(c.replace("_", " ") for c in CATEGORIES) + " | layer |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        per = r["budget"]["per_layer_us"]
        lines.append(f"| {r['name']} | {r['batch']} | " + " | ".join(f"{per.get(c, 0.0):.1f}" for c in CATEGORIES)
                     + f" | {r['budget']['layer_us']:.1f} |")
    if results:
        pub = results[0]["budget"]["published"]
        lines.append("| published | 1 | " + " | ".join(
            f"{pub['per_layer_us'][c]:.1f}" if c in pub["per_layer_us"] else "" for c in CATEGORIES)
            + f" | {pub['layer_us']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", default="megakernel,per-op")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--mesh", default="4x2x2")
    ap.add_argument("--model", default="k3-full")
    ap.add_argument("--layers", type=int, help="run a cut of the model: its first N layers")
    ap.add_argument("--json", default=str(ROOT / "bench" / "out" / "k3_full.json"))
    ap.add_argument("extra", nargs="*", help="more `mkemu run` options for every run (after --)")
    args = ap.parse_args()

    label = args.model
    if args.layers:
        label = f"{args.model}, first {args.layers} layers"
        args.model = cut_model(args.model, args.layers, Path(tempfile.mkdtemp(prefix="k3cut-")))
    results = []
    for name in args.programs.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            r = run(name, batch, args.mesh, args.model, args.extra)
            r["name"] = name
            results.append(r)
            print(f"{name} batch {batch}: {r['us_per_step'] / 1000:.2f} ms/step, wall {r['process_wall_s']:.0f} s, "
                  f"RSS {r['max_rss_gb']:.2f} GB", file=sys.stderr, flush=True)
    print(f"### {label} on {args.mesh}, timing only, one decode step\n")
    print(step_table(results))
    print("\n### Per-layer budget (µs, averaged over the layers of the step)\n")
    print(budget_table(results))
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"model": label, "mesh": args.mesh, "extra": args.extra, "runs": results},
                              indent=1, default=str))
    tmp.replace(path)
    print(f"\nJSON -> {path}")


if __name__ == "__main__":
    main()
