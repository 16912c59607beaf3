"""GEMM utilisation: what fraction of the matrix units' peak a `.mk` matmul reaches.

    python bench/gemm.py [--quick] [--hw NAME ...] [--json OUT]

For each shape M x K x N (bf16 operands, f32 result) and profile, one core computes
`y = x @ W` with the compiler's matmul (dsl/lower_tile.py) from operands already in
VMEM: the part of a GEMM the matrix units bound, not the HBM streaming (bench
microbench.py (a) and (c) measure that). W is held as one K x TN block (TN = one
mxu_dim-wide column block per matrix unit) and multiplied N / TN times, so every
shape fits VMEM and the instructions are those of the full GEMM. The figure is
M*K*N multiply-adds over (cycles of the matmul region x matrix units x mxu_dim^2
multiply-adds per unit and cycle). Prints a markdown table and writes JSON (default
bench/out/gemm.json). Emulated figures are deterministic.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import mkemu
from benchlib import OUT_DIR, finish, table
from mkemu.isa.hardware import load_profile

SHAPES = [(8, 2048, 2048), (32, 2048, 2048), (128, 2048, 2048),
          (8, 7168, 7168), (32, 7168, 7168), (64, 7168, 7168), (128, 7168, 7168)]
QUICK_SHAPES = [(8, 2048, 2048), (128, 2048, 2048)]
PROFILES = ("tpu-v5p-like", "tpu-v7-like")
TARGET = 0.80          # issue 17: a large GEMM reaches at least 80% of peak on tpu-v5p-like


def gemm_source(m: int, k: int, n: int, tn: int) -> str:
    return f"""
kernel gemm(x: hbm bf16[{m}, {k}], w: hbm bf16[{k}, {tn}], y: hbm f32[{m}, {tn}]) {{
    vmem xv: bf16[{m}, {k}];
    vmem wv: bf16[{k}, {tn}];
    vmem yv: f32[{m}, {tn}];
    sem s;
    start copy(x, xv, s);
    wait copy(x, xv, s);
    start copy(w, wv, s);
    wait copy(w, wv, s);
    region "matmul" {{
        for j in 0..{n // tn} {{
            yv = matmul(xv, wv);
        }}
    }}
    start copy(yv, y, s);
    wait copy(yv, y, s);
}}
host {{
    input x: bf16[{m}, {k}];
    input w: bf16[{k}, {tn}];
    output y: f32[{m}, {tn}];
    launch gemm(x, w, y);
}}
"""


def measure(hw: str, m: int, k: int, n: int) -> dict:
    p = load_profile(hw)
    tn = min(n, p.mxus_per_core * p.mxu_dim)
    kernel = mkemu.compile_source(gemm_source(m, k, n, tn), filename="gemm.mk", hw=hw, mesh="1")
    t0 = time.perf_counter()
    run = kernel(x=np.zeros((m, k), np.float32), w=np.zeros((k, tn), np.float32))
    wall = time.perf_counter() - t0
    figures = run.report.figures
    cycles = figures["region_cycles"]["matmul"] / figures["region_entries"]["matmul"]   # per core
    peak = p.mxus_per_core * p.mxu_dim * p.mxu_dim                                     # MACs per cycle
    fraction = m * k * n / (cycles * peak)
    return dict(hw=hw, m=m, k=k, n=n, tn=tn, cycles=cycles, us=cycles / p.clock_hz * 1e6,
                tflops=2 * m * k * n / (cycles / p.clock_hz) / 1e12,
                peak_tflops_core=2 * peak * p.clock_hz / 1e12, fraction_of_peak=fraction,
                mxu_accumulators=p.mxu_accumulators, wall_s=wall)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two small shapes only")
    ap.add_argument("--hw", nargs="+", default=list(PROFILES), help="profiles to measure")
    ap.add_argument("--json", default=str(OUT_DIR / "gemm.json"), help="where to write JSON")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    records, rows = [], []
    for hw in args.hw:
        for m, k, n in QUICK_SHAPES if args.quick else SHAPES:
            r = measure(hw, m, k, n)
            records.append(r)
            rows.append([hw, f"{m}x{k}x{n}", int(r["cycles"]), r["us"], r["tflops"], r["peak_tflops_core"],
                         f"{100 * r['fraction_of_peak']:.1f}%"])
            print(f"  {hw} {m}x{k}x{n}: {100 * r['fraction_of_peak']:.1f}% ({r['wall_s']:.1f} s)", file=sys.stderr)
    text = table("GEMM utilisation: y = x @ W on one core, bf16 operands in VMEM, f32 result (emulated)",
                 ["profile", "M x K x N", "cycles", "us", "TFLOP/s", "peak TFLOP/s (core)", "of peak"], rows)
    big = [r for r in records if (r["hw"], r["m"], r["k"], r["n"]) == ("tpu-v5p-like", 128, 7168, 7168)]
    if big:
        verdict = "ok" if big[0]["fraction_of_peak"] >= TARGET else "MISS"
        text += (f"\n128x7168x7168 on tpu-v5p-like: {100 * big[0]['fraction_of_peak']:.1f}% of peak "
                 f"(target at least {100 * TARGET:.0f}%): {verdict}\n")
    print(text)
    finish({"gemm": {"records": records, "text": text}}, args.json, time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
