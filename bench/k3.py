"""K3 decode: per-op vs super-operators vs megakernel, tensor- vs expert-parallel, at
several batch sizes, and the emulator's own speed.

    python bench/k3.py [--batches 1,2,4,8] [--schemes 0,1] [--model k3-mini] [--profile] [--json OUT]

Prints the comparison table (emulated µs per step, speedup of the super-operators and
the megakernel over per-op in the same scheme, kernels per step, HBM bytes, fraction of both floors, time
breakdown), with the wall time and simulated instructions per wall second of each
run; with --profile, where the wall time of the default main job goes (cProfile, top
functions by own time). Writes JSON to bench/out/k3.json by default.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
from pathlib import Path

from mkemu.options import Options
from mkemu.run import execute

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = {"per-op": "programs/k3_per_op.mk", "super-op": "programs/k3_superop.mk",
            "megakernel": "programs/k3_megakernel.mk"}


SCHEMES = {0: "TP", 1: "EP"}


def run(program: str, model: str, batch: int, scheme: int = 0) -> dict:
    report, _ = execute(str(ROOT / program), Options(params={"SCHEME": scheme}, model=model, batch=batch))
    return report


def table(results: dict) -> str:
    head = ("| batch | program | scheme | bit-exact | µs/step | tok/s/seq | kernels/step | HBM MB/step | "
            "% of floor | % of mesh floor | launch | collectives | weight streaming | compute | idle | "
            "wall s | instr/s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for (batch, scheme), pair in results.items():
        for name, r in pair.items():
            b = r["breakdown_us"]
            ips = r["instructions_per_step"] * r["steps_run"] / r["wall_s"]
            lines.append(
                f"| {batch} | {name} | {SCHEMES[scheme]} | {r['bit_exact']} | {r['us_per_step']:.1f} | "
                f"{r['tokens_per_s']:.0f} | {r['kernels_per_step']} | {r['hbm_bytes_per_step'] / 1e6:.1f} | "
                f"{r['fraction_of_floor'] * 100:.1f} | {r['fraction_of_mesh_floor'] * 100:.1f} | "
                f"{b['launch_overhead']:.1f} | {b['collectives']:.1f} | {b['weight_streaming']:.1f} | "
                f"{b['compute']:.1f} | {b['idle']:.1f} | {r['wall_s']:.1f} | {ips:,.0f} |")
        if "per-op" in pair:
            for name, r in pair.items():
                if name != "per-op":
                    speedup = pair["per-op"]["us_per_step"] / r["us_per_step"]
                    lines.append(f"| {batch} | **speedup, {name}** | {SCHEMES[scheme]} | | **{speedup:.2f}x** |"
                                 + " |" * (head.count("|") - 6))
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
    ap.add_argument("--schemes", default="0,1", help="0 tensor parallel, 1 expert parallel")
    ap.add_argument("--programs", default="per-op,super-op,megakernel")
    ap.add_argument("--model", default="k3-mini")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", default=str(ROOT / "bench" / "out" / "k3.json"))
    args = ap.parse_args(argv)
    results = {}
    names = args.programs.split(",")
    for batch in (int(b) for b in args.batches.split(",")):
        for scheme in (int(s) for s in args.schemes.split(",")):
            results[batch, scheme] = {name: run(PROGRAMS[name], args.model, batch, scheme) for name in names}
            print(f"batch {batch} scheme {scheme} done", file=sys.stderr, flush=True)
    print(table(results))
    data = {"model": args.model,
            "results": {f"batch{b}_{SCHEMES[sc]}": v for (b, sc), v in results.items()}}
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
