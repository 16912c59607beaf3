"""K3 decode: per-op vs megakernel at several batch sizes, and the emulator's own speed.

    python bench/k3.py [--batches 1,2,4,8] [--model k3-mini] [--profile] [--json OUT]

Prints the comparison table (emulated µs per step, speedup, kernels per step, HBM
bytes, fraction of the floor, time breakdown), then the wall time and simulated
instructions per wall second of each run; with --profile, where the wall time of
the default main job goes (cProfile, top functions by own time). Writes JSON to
bench/out/k3.json by default.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
from pathlib import Path

from mkemu.run import RunOptions, execute

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = {"per-op": "programs/k3_per_op.mk", "megakernel": "programs/k3_megakernel.mk"}


def run(program: str, model: str, batch: int) -> dict:
    opts = RunOptions(file=str(ROOT / program), driver={"model": model, "batch": batch})
    report, _ = execute(opts)
    return report


def table(results: dict) -> str:
    head = ("| batch | program | bit-exact | µs/step | tok/s/seq | kernels/step | HBM MB/step | "
            "% of floor | launch | collectives | weight streaming | compute | idle | wall s | instr/s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for batch, pair in results.items():
        for name, r in pair.items():
            b = r["breakdown_us"]
            ips = r["instructions_per_step"] * r["steps_run"] / r["wall_s"]
            lines.append(
                f"| {batch} | {name} | {r['bit_exact']} | {r['us_per_step']:.1f} | {r['tokens_per_s']:.0f} | "
                f"{r['kernels_per_step']} | {r['hbm_bytes_per_step'] / 1e6:.1f} | "
                f"{r['fraction_of_floor'] * 100:.1f} | {b['launch_overhead']:.1f} | {b['collectives']:.1f} | "
                f"{b['weight_streaming']:.1f} | {b['compute']:.1f} | {b['idle']:.1f} | {r['wall_s']:.1f} | "
                f"{ips:,.0f} |")
        speedup = pair["per-op"]["us_per_step"] / pair["megakernel"]["us_per_step"]
        lines.append(f"| {batch} | **speedup** | | **{speedup:.2f}x** | | | | | | | | | | | |")
    return "\n".join(lines)


def profile_main_job(model: str) -> str:
    prof = cProfile.Profile()
    prof.enable()
    run(PROGRAMS["megakernel"], model, 1)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
    return out.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--model", default="k3-mini")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", default=str(ROOT / "bench" / "out" / "k3.json"))
    args = ap.parse_args(argv)
    results = {}
    for batch in (int(b) for b in args.batches.split(",")):
        results[batch] = {name: run(path, args.model, batch) for name, path in PROGRAMS.items()}
        print(f"batch {batch} done", file=sys.stderr, flush=True)
    print(table(results))
    data = {"model": args.model, "results": {str(k): v for k, v in results.items()}}
    if args.profile:
        text = profile_main_job(args.model)
        print(text)
        data["profile"] = text
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(data, indent=1, default=str))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
