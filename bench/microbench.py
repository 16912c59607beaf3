"""Single-chip microbenchmarks of the emulator on tpu-v7-like (issue 2, item 8).

    python bench/microbench.py [--quick] [--json OUT]

Measures, in emulated time: (a) HBM streaming bandwidth per core, (b) DMA latency
of small copies, (c) matrix-unit time per 256x256 bf16 weight tile, (d) vector
unit throughput; and in wall time: (e) the emulator's own speed for a program 1x,
2x and 4x as long. Prints markdown tables and writes JSON (default
bench/out/microbench.json). Every program is generated `.s` text; every emulated
figure is (cycles of the program) - (cycles of the same program without the
measured work), so launch and setup costs drop out.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from benchlib import OUT_DIR, gbps, ns, profile, ratio_verdict, run_asm, table, finish

MEASURED_HBM_PER_CORE = 3.0e12       # B/s, MISSION.md (real TPU7x, tpu-megakernels)
MEASURED_TILE_NS = 20.0              # ns per 256x256 bf16 weight tile through the MXU
CAL_TOL = 0.10                       # issue 17: within 10% (issue 2 asked 20%)

MiB = 1 << 20
KiB = 1 << 10


# --------------------------------------------------------------------------- (a) HBM


def stream_program(total: int, chunk: int, depth: int, cores: int, work: bool = True) -> str:
    """Each of `cores` cores streams `total` bytes HBM -> VMEM in `chunk`-byte DMAs,
    keeping up to `depth` in flight (a ring of `depth` VMEM slots)."""
    n = total // chunk
    elems = total // 2
    body = f"""
    li s1, @src          ; next HBM address
    li s3, 0             ; descriptor
    li s4, 0             ; DMA semaphore
    li s5, {chunk}       ; bytes per chunk
    li s13, {n}          ; chunks to move
    li s14, {depth}      ; in flight at most
    li s10, 0            ; issued
    li s11, 0            ; completed
issue:
    bge s10, s13, drain
    sub s12, s10, s11
    bge s12, s14, waitone
    remi s2, s10, {depth}
    muli s2, s2, {chunk} ; VMEM slot
    dma.start vmem[s2], hbm[s1], s3, s4
    add s1, s1, s5
    addi s10, s10, 1
    jmp issue
waitone:
    sem.wait s4, s5
    addi s11, s11, 1
    jmp issue
drain:
    bge s11, s13, done
    sem.wait s4, s5
    addi s11, s11, 1
    jmp drain
""" if work else ""
    return f"""
.buffer src bf16 {elems} weight
.kernel main
    .smem 0 {chunk} 1 0 0 1 0 0
    rdsr s20, core
    li s21, {cores}
    bge s20, s21, done
{body}
done:
    halt
"""


def staggered_program(total: int, chunk: int, depth: int, cores: int, work: bool = True) -> str:
    """Like `stream_program`, but the first `depth` DMAs have sizes chunk*(k+1)/depth.

    The engine shares its bandwidth fairly among the descriptors in flight, so
    descriptors issued together also land together, and the replacements issued
    then all sit out the start latency at once: the engine idles ~0.5 us per batch.
    Staggered first sizes make the descriptors land one after another, so while one
    replacement waits out its start latency the others keep the engine busy (the
    staggering persists: all moving descriptors drain at the same rate). Unrolled.
    """
    sizes = [chunk * (k + 1) // depth for k in range(depth)]
    while sum(sizes) < total:
        sizes.append(min(chunk, total - sum(sizes)))
    descs = {size: 32 * i for i, size in enumerate(dict.fromkeys(sizes))}
    smem = "\n".join(f"    .smem {off} {size} 1 0 0 1 0 0" for size, off in descs.items())
    lines = []
    if work:
        lines.append("    li s1, @src\n    li s4, 0")
        addr = 0
        for j, size in enumerate(sizes):
            if j >= depth:
                lines.append(f"    li s5, {sizes[j - depth]}\n    sem.wait s4, s5")
            slot = (j % depth) * chunk
            lines.append(f"    li s2, {slot}\n    li s3, {descs[size]}\n    li s1, {addr}\n"
                         "    dma.start vmem[s2], hbm[s1], s3, s4")
            addr += size
        for j in range(max(0, len(sizes) - depth), len(sizes)):
            lines.append(f"    li s5, {sizes[j]}\n    sem.wait s4, s5")
    body = "\n".join(lines)
    return f"""
.buffer src bf16 {total // 2} weight
.kernel main
{smem}
    rdsr s20, core
    li s21, {cores}
    bge s20, s21, done
{body}
done:
    halt
"""


def bench_hbm(quick: bool) -> dict:
    p = profile()
    total = (16 if quick else 64) * MiB
    rows, records = [], []
    configs = [(1 * MiB, d, 1) for d in (1, 2, 4, 8)] + [(256 * KiB, 8, 1), (4 * MiB, 4, 1), (1 * MiB, 4, 2)]
    configs += [(1 * MiB, 4, 1, "staggered"), (1 * MiB, 8, 1, "staggered"), (1 * MiB, 4, 2, "staggered")]
    for chunk, depth, cores, *how in configs:
        gen = staggered_program if how else stream_program
        base, _, _ = run_asm(gen(total, chunk, depth, cores, work=False))
        res, _, _ = run_asm(gen(total, chunk, depth, cores))
        cyc = res.cycles - base.cycles
        per_core = gbps(p, total, cyc)
        rec = dict(total_bytes=total, chunk_bytes=chunk, in_flight=depth, cores=cores, cycles=cyc,
                   schedule=how[0] if how else "batches",
                   us=ns(p, cyc) / 1e3, gb_s_per_core=per_core, gb_s_chip=per_core * cores)
        records.append(rec)
        rows.append([f"{total // MiB} MiB", f"{chunk // KiB} KiB", depth, rec["schedule"], cores, cyc, rec["us"],
                     per_core, per_core * cores])
    peak_core = p.dma_engine_bw_bytes_per_cycle * p.clock_hz / 1e9
    peak_chip = p.hbm_bw_bytes_per_s / 1e9
    text = table("(a) HBM -> VMEM streaming (emulated)",
                 ["total/core", "chunk", "in flight", "schedule", "cores", "cycles", "us", "GB/s per core", "GB/s chip"],
                 rows)
    text += (f"\nprofile peaks: DMA engine {peak_core:,.0f} GB/s per core, HBM {peak_chip:,.0f} GB/s per chip\n")
    best = max(r["gb_s_per_core"] for r in records if r["cores"] == 1)
    return dict(text=text, records=records, best_gb_s_per_core=best,
                profile_engine_gb_s=peak_core, profile_hbm_gb_s=peak_chip)


# --------------------------------------------------------------------------- (b) DMA latency


def copy_program(nbytes: int, dst: str, src: str, work: bool = True) -> str:
    body = f"""
    li s1, @buf
    li s2, 0
    li s5, {nbytes}
    dma.start {dst}[{'s1' if dst == 'hbm' else 's2'}], {src}[{'s1' if src == 'hbm' else 's2'}], s3, s4
    sem.wait s4, s5
""" if work else ""
    return f"""
.buffer buf bf16 {max(nbytes // 2, 256)} scratch
.kernel main
    .smem 0 {nbytes} 1 0 0 1 0 0
    rdsr s20, core
    bne s20, s0, done
    li s3, 0
    li s4, 0
{body}
done:
    halt
"""


def bench_dma_latency(quick: bool) -> dict:
    p = profile()
    sizes = [512, 4 * KiB, 64 * KiB] if quick else [512, 2 * KiB, 4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB]
    rows, records = [], []
    for nbytes in sizes:
        for dst, src in (("vmem", "hbm"), ("hbm", "vmem")):
            base, _, _ = run_asm(copy_program(nbytes, dst, src, work=False))
            res, _, _ = run_asm(copy_program(nbytes, dst, src))
            cyc = res.cycles - base.cycles
            model = p.dma_start_latency_cycles + nbytes / p.dma_engine_bw_bytes_per_cycle
            rec = dict(bytes=nbytes, direction=f"{src}->{dst}", cycles=cyc, ns=ns(p, cyc),
                       model_cycles=model, gb_s=gbps(p, nbytes, cyc))
            records.append(rec)
            rows.append([nbytes, f"{src.upper()}->{dst.upper()}", cyc, rec["ns"], model, rec["gb_s"]])
    text = table("(b) DMA latency, one copy issued and waited for (emulated)",
                 ["bytes", "path", "cycles", "ns", "model: start + bytes/engine_bw", "effective GB/s"], rows)
    text += (f"\nThe model adds {p.dma_start_latency_cycles} start cycles "
             f"({ns(p, p.dma_start_latency_cycles):.0f} ns, profile `dma.start_latency_s`) plus the issue "
             "and wait instructions (a few cycles).\n")
    return dict(text=text, records=records)


# --------------------------------------------------------------------------- (c) MXU


def mxu_program(mxus: int, iters: int, work: bool = True) -> str:
    """A loop of weight tiles: per iteration each of `mxus` matrix units loads 8 tiles
    (one per accumulator, so no mac waits for the previous mac into the same
    accumulator) and does one 8-row pass (batch 1 padded to one sublane tile) per tile.
    Loads to different MXUs are issued back to back so the units overlap; the LHS is
    pushed once (a decode step multiplies one activation row by many tiles).
    """
    d = profile().mxu_dim
    tile = d * d * 2
    lines = []
    for acc in range(8):
        for x in range(mxus):
            lines.append(f"    mxu.ldw x{x}, {(acc * mxus + x) * tile}(s1), s2, s3")
        for x in range(mxus):
            lines.append(f"    mxu.mac x{x}, a{acc}, 1")
    body = "\n".join(lines)
    pops = "\n".join(f"    mxu.pop v{8 + x}, x{x}, a7, 1" for x in range(mxus))
    pushes = "\n".join(f"    mxu.push x{x}, v0, 0\n    mxu.push x{x}, v1, 1" for x in range(mxus))
    loop = f"""
    li s10, {iters}
loop:
{body}
    addi s10, s10, -1
    bne s10, s0, loop
{pops}
    vadd.f32 v20, v8, v8
""" if work else ""
    return f"""
.kernel main
    rdsr s20, core
    bne s20, s0, done
    li s1, 0
    li s2, {d * 2}       ; row stride of a tile in VMEM
    li s3, {(d << 16) | d}  ; shape: {d} rows x {d} columns
    vli.f32 v0, 1.0
    vli.f32 v1, 1.0
{pushes}
{loop}
done:
    halt
"""


def bench_mxu(quick: bool) -> dict:
    p = profile()
    iters = 8 if quick else 32
    rows, records = [], []
    for mxus in (1, 2, p.mxus_per_core):
        # Slope between two loop lengths: drops setup and the final pop's wait for
        # the last mac (its 264-cycle latency) as well as the launch.
        short, _, _ = run_asm(mxu_program(mxus, iters))
        res, _, _ = run_asm(mxu_program(mxus, 2 * iters))
        cyc = res.cycles - short.cycles
        tiles = iters * 8 * mxus
        per_tile_core = cyc / tiles
        per_tile_mxu = per_tile_core * mxus
        rec = dict(mxus=mxus, tiles=tiles, cycles=cyc, cycles_per_tile_per_mxu=per_tile_mxu,
                   ns_per_tile_per_mxu=ns(p, per_tile_mxu), ns_per_tile_core=ns(p, per_tile_core))
        records.append(rec)
        rows.append([mxus, tiles, cyc, per_tile_mxu, rec["ns_per_tile_per_mxu"], rec["ns_per_tile_core"]])
    t = p.timing
    text = table("(c) matrix unit, 256x256 bf16 weight tiles (ldw + one 8-row mac each), emulated",
                 ["MXUs used", "tiles", "cycles", "cycles/tile/MXU", "ns/tile/MXU", "ns/tile (core)"], rows)
    text += (f"\nprofile: mxu_ldw occupancy {t['mxu_ldw'].occupancy_cycles}, mxu_mac occupancy "
             f"{t['mxu_mac'].occupancy_cycles} (latency {t['mxu_mac'].latency_cycles}) cycles at "
             f"{p.clock_hz / 1e9:.1f} GHz\n")
    return dict(text=text, records=records, ns_per_tile_per_mxu=records[0]["ns_per_tile_per_mxu"])


# --------------------------------------------------------------------------- (d) vector unit


def vector_program(kind: str, iters: int, unroll: int = 32, work: bool = True) -> str:
    ops = []
    for i in range(unroll):
        d = 8 + i % 16
        if kind == "valu":
            ops.append(f"    vadd.f32 v{d}, v1, v2")
        elif kind == "valu-dep":
            ops.append("    vadd.f32 v3, v3, v2")
        elif kind == "eup":
            ops.append(f"    vexp.f32 v{d}, v1")
        elif kind == "xlu":
            ops.append(f"    vredsum.lane.f32 v{d}, v1")
        elif kind == "vld":
            ops.append(f"    vld.w v{d}, {4096 * (i % 16)}(s0), s6, m0")
        elif kind == "vst":
            ops.append(f"    vst.w v1, {4096 * (i % 16)}(s0), s6, m0")
        elif kind == "mix":   # one load, one ALU op, one store per 3 instructions
            j = i % 3
            ops.append([f"    vld.w v{d}, {4096 * (i % 16)}(s0), s6, m0",
                        f"    vmul.f32 v{d}, v1, v2",
                        f"    vst.w v1, {65536 + 4096 * (i % 16)}(s0), s6, m0"][j])
    loop = f"""
    li s10, {iters}
loop:
{chr(10).join(ops)}
    addi s10, s10, -1
    bne s10, s0, loop
""" if work else ""
    return f"""
.kernel main
    rdsr s20, core
    bne s20, s0, done
    li s6, 512
    vli.f32 v1, 0.5
    vli.f32 v2, 1.5
    vli.f32 v3, 0.0
{loop}
done:
    halt
"""


def bench_vector(quick: bool) -> dict:
    p = profile()
    iters = 16 if quick else 64
    unroll = 32
    rows, records = [], []
    labels = {"valu": "vadd.f32, independent", "valu-dep": "vadd.f32, dependent chain",
              "eup": "vexp.f32", "xlu": "vredsum.lane.f32", "vld": "vld.w", "vst": "vst.w",
              "mix": "vld + vmul + vst"}
    for kind, label in labels.items():
        base, _, _ = run_asm(vector_program(kind, iters, unroll, work=False))
        res, _, _ = run_asm(vector_program(kind, iters, unroll))
        cyc = res.cycles - base.cycles
        ops = iters * unroll
        per_cycle = ops / cyc
        rec = dict(kind=kind, ops=ops, cycles=cyc, ops_per_cycle=per_cycle,
                   g_elem_ops_per_s=per_cycle * 1024 * p.clock_hz / 1e9)
        records.append(rec)
        rows.append([label, ops, cyc, per_cycle, rec["g_elem_ops_per_s"]])
    text = table("(d) vector unit throughput, loop of 32 unrolled ops + 2 loop instructions (emulated)",
                 ["op", "ops", "cycles", "ops/cycle", "G element-ops/s (1024 per op)"], rows)
    text += ("\nThe core issues one instruction per cycle (in order), so loop overhead (addi, bne) "
             "costs issue slots; xlu occupancy is 2 cycles, a dependent vadd waits its 2-cycle latency.\n")
    return dict(text=text, records=records)


# --------------------------------------------------------------------------- (e) emulator speed


def speed_program(iters: int) -> str:
    """A mixed loop: scalar work, vector loads/ALU/stores, a transcendental, a reduction,
    and one small DMA per iteration (so the event loop is exercised too)."""
    return f"""
.buffer buf f32 8x128 scratch
.kernel main
    .smem 0 4096 1 0 0 1 0 0
    li s6, 512
    li s3, 0
    li s4, 0
    li s5, 4096
    li s1, @buf
    rdsr s2, core
    muli s2, s2, 0
    addi s2, s2, 131072
    li s10, {iters}
loop:
    vld.w v1, 0(s0), s6, m0
    vld.w v2, 4096(s0), s6, m0
    vadd.f32 v3, v1, v2
    vmul.f32 v4, v3, v2
    vexp.f32 v5, v4
    vredsum.lane.f32 v6, v5
    vst.w v6, 8192(s0), s6, m0
    addi s7, s7, 3
    muli s8, s7, 5
    dma.start vmem[s2], hbm[s1], s3, s4
    sem.wait s4, s5
    addi s10, s10, -1
    bne s10, s0, loop
    halt
"""


def idle_program(mib: int, remote: bool) -> str:
    """Core 0 moves `mib` MiB in one DMA and waits: to its own VMEM from HBM (fast),
    or to chip 1's VMEM over one link (~23x the cycles, about the same instructions)."""
    if remote:
        move = f"""    li s8, 2
    li s7, 1
    dma.start.r vmem[s0]@s8, vmem[s0], s3, s4, s7
    sem.wait s4, s5
done:
    li s8, 2
    bne s23, s8, out
    li s7, 1
    li s5, {mib * MiB}
    sem.wait s7, s5
out:"""
    else:
        move = """    dma.start vmem[s0], hbm[s1], s3, s4
    sem.wait s4, s5
done:"""
    return f"""
.buffer src bf16 {mib * MiB // 2} weight
.kernel main
    .smem 0 {mib * MiB} 1 0 0 1 0 0
    rdsr s20, core
    rdsr s23, gcore
    bne s23, s0, done
    li s1, @src
    li s3, 0
    li s4, 0
    li s5, {mib * MiB}
{move}
    halt
"""


def bench_speed(quick: bool) -> dict:
    base_iters = 1000 if quick else 4000
    reps = 2 if quick else 5
    rows, records = [], []
    run_asm(speed_program(10))  # warm up imports and caches
    walls = {1: [], 2: [], 4: []}
    results = {}
    for _ in range(reps):           # interleaved rounds, best of each: robust to machine load
        for mult in walls:
            results[mult], _, wall = run_asm(speed_program(base_iters * mult))
            walls[mult].append(wall)
    for mult, res in results.items():
        wall = min(walls[mult])
        rec = dict(length=mult, iterations=base_iters * mult, instructions=res.instructions,
                   cycles=res.cycles, wall_s=wall, instr_per_s=res.instructions / wall,
                   cycles_per_s=res.cycles / wall)
        records.append(rec)
    for rec in records:
        rec["wall_ratio"] = rec["wall_s"] / records[0]["wall_s"]
        rows.append([f"{rec['length']}x", rec["instructions"], rec["cycles"], rec["wall_s"],
                     rec["wall_ratio"], rec["instr_per_s"], rec["cycles_per_s"]])
    text = table("(e) emulator speed, mixed loop (13 instructions/iteration incl. one DMA), both cores run it",
                 ["length", "instructions", "cycles", "wall s", "wall ratio", "instr/s", "cycles/s"], rows)
    idle_rows = []
    for remote in (False, True):
        mib = 8
        walls = []
        for _ in range(reps):
            res, _, wall = run_asm(idle_program(mib, remote), dims=(2, 1, 1))
            walls.append(wall)
        wall = min(walls)
        how = "chip0 -> chip1 VMEM over one link" if remote else "HBM -> VMEM on chip 0"
        rec = dict(idle=True, path=how, mib=mib, cycles=res.cycles, instructions=res.instructions,
                   wall_s=wall, cycles_per_s=res.cycles / wall)
        records.append(rec)
        idle_rows.append([f"{mib} MiB", how, res.instructions, res.cycles, wall, rec["cycles_per_s"]])
    text += "\n" + table("(e') idle waiting costs no wall time: the same DMA over a slower path (2x1x1 mesh)",
                         ["DMA size", "path", "instructions", "cycles", "wall s", "cycles/s"], idle_rows)
    return dict(text=text, records=records)


# --------------------------------------------------------------------------- main


def calibration(hbm: dict, mxu: dict) -> dict:
    rows = []
    hbm_val = hbm["best_gb_s_per_core"]
    r1, v1 = ratio_verdict(hbm_val, MEASURED_HBM_PER_CORE / 1e9, CAL_TOL)
    rows.append(["HBM streaming per core", f"{hbm_val:,.0f} GB/s", f"{MEASURED_HBM_PER_CORE / 1e9:,.0f} GB/s",
                 f"{r1:.3f}", f"±{CAL_TOL:.0%}", v1])
    tile = mxu["ns_per_tile_per_mxu"]
    r2, v2 = ratio_verdict(tile, MEASURED_TILE_NS, CAL_TOL)
    rows.append(["256x256 bf16 weight tile through an MXU", f"{tile:.1f} ns", f"{MEASURED_TILE_NS:.0f} ns",
                 f"{r2:.3f}", f"±{CAL_TOL:.0%}", v2])
    text = table("calibration vs measured TPU7x (MISSION.md)",
                 ["figure", "emulated", "TPU7x measured", "ratio", "tolerance", "verdict"], rows)
    return dict(text=text, hbm_ratio=r1, tile_ratio=r2, ok=(v1 == "ok" and v2 == "ok"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer repetitions")
    ap.add_argument("--json", default=str(OUT_DIR / "microbench.json"), help="where to write JSON")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    p = profile()
    print(f"# mkemu microbenchmarks on {p.name} ({p.clock_hz / 1e9:.1f} GHz){' --quick' if args.quick else ''}\n")
    out = {"profile": p.name, "quick": args.quick}
    for name, fn in (("hbm", bench_hbm), ("dma_latency", bench_dma_latency), ("mxu", bench_mxu),
                     ("vector", bench_vector), ("speed", bench_speed)):
        out[name] = fn(args.quick)
        print(out[name]["text"])
        sys.stdout.flush()
    out["calibration"] = calibration(out["hbm"], out["mxu"])
    print(out["calibration"]["text"])
    finish(out, args.json, time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
