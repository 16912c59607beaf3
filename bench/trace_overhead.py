"""Wall-time cost of trace recording (issue 6: recording on costs at most 2x).

    python bench/trace_overhead.py [--quick] [--json OUT]

Runs four generated `.s` workloads on the `test` profile (1 chip, 2 cores) with
no recorder and with one, best of five each, and prints a markdown table:
plain run, traced run, serialising the trace (`Recorder.to_bytes`), the ratio
(traced run + serialise) / plain, and the trace size per instruction. The
workloads span the cheap end (scalar loop: least work per instruction, so the
largest relative cost) to DMA-heavy event-loop work. Writes the same figures as
JSON (default bench/out/trace_overhead.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from mkemu.emulator.machine import Machine
from mkemu.emulator.topology import Mesh
from mkemu.emulator.trace import Recorder
from mkemu.isa.asm import assemble
from mkemu.isa.hardware import load_profile


def workloads(n: int) -> dict[str, str]:
    return {
        "scalar loop": f"""
.kernel main
    li s1, {n * 4}
    mark.push 0, s0
loop:
    addi s2, s2, 3
    xor s3, s2, s1
    addi s1, s1, -1
    bne s1, s0, loop
    mark.pop
    halt
""",
        "vector loop": f"""
.kernel main
    li s1, {n}
    li s6, 512
loop:
    vld.w v0, 0(s0), s6, m0
    vld.w v1, 4096(s0), s6, m0
    vadd.f32 v2, v0, v1
    vmul.f32 v3, v2, v1
    vst.w v3, 8192(s0), s6, m0
    addi s1, s1, -1
    bne s1, s0, loop
    halt
""",
        "mxu loop": f"""
.kernel main
    li s1, 256
    li s2, 8388736
    mxu.ldw x0, 0(s0), s1, s2
    li s5, {n}
loop:
    mxu.mac x0, a0, 0
    mxu.mac x0, a1, 0
    mxu.pop v1, x0, a0, 0
    addi s5, s5, -1
    bne s5, s0, loop
    halt
""",
        "dma loop": f"""
.buffer a f32 8x128 input
.kernel main
    .smem 0 4096 1 0 0 1 0 0
    li s1, @a
    li s4, 0
    li s5, {max(n // 4, 1)}
    li s6, 4096
loop:
    dma.start vmem[s0], hbm[s1], s0, s4
    sem.wait s4, s6
    addi s5, s5, -1
    bne s5, s0, loop
    halt
""",
    }


def run(program, profile, trace) -> tuple[float, object, float, int]:
    machine = Machine(profile, Mesh((1, 1, 1)), trace=trace)
    machine.load(program)
    t0 = time.perf_counter()
    result = machine.run()
    run_s = time.perf_counter() - t0
    write_s, size = 0.0, 0
    if trace is not None:
        t1 = time.perf_counter()
        size = len(trace.to_bytes())
        write_s = time.perf_counter() - t1
    return run_s, result, write_s, size


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller workloads")
    ap.add_argument("--json", default=str(Path(__file__).resolve().parent / "out" / "trace_overhead.json"))
    args = ap.parse_args(argv)
    profile = load_profile("test")
    n = 500 if args.quick else 4000
    rows = []
    for name, text in workloads(n).items():
        program = assemble(text, f"{name}.s")
        plain = min(run(program, profile, None)[0] for _ in range(5))
        best = None
        for _ in range(5):
            traced = run(program, profile, Recorder())
            if best is None or traced[0] + traced[2] < best[0] + best[2]:
                best = traced
        run_s, result, write_s, size = best
        rows.append({"workload": name, "instructions": result.instructions, "cycles": result.cycles,
                     "plain_s": plain, "traced_run_s": run_s, "serialise_s": write_s,
                     "ratio": (run_s + write_s) / plain, "trace_bytes": size,
                     "bytes_per_instruction": size / result.instructions})
    print("| workload | instructions | plain s | traced s | serialise s | ratio | trace bytes | B/instr |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['workload']} | {r['instructions']:,} | {r['plain_s']:.3f} | {r['traced_run_s']:.3f} | "
              f"{r['serialise_s']:.3f} | {r['ratio']:.2f}x | {r['trace_bytes']:,} | {r['bytes_per_instruction']:.2f} |")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"profile": "test", "rows": rows}, indent=2) + "\n")
    print(json.dumps({"max_ratio": max(r["ratio"] for r in rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
