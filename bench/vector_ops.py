"""Time per instruction of the vector, mask and matrix-unit rows in the compiled issue loop.

    python bench/vector_ops.py [--only MNEMONIC ...] [--reps N] [--json OUT] [--baseline JSON]

For every vector-side row of the instruction table (`Instr.vector_side`: vector
loads and stores, the vector ALU with its compares and mask ops, the cross-lane and
transcendental units, the matrix units), a one-core `.s` program runs a loop of 4
copies of the instruction, 1x and 3x as many iterations (2000 and 6000 for a cheap
row, fewer for an expensive one); ns per instruction = the difference of the two
runs' `Machine.run` times (the thread's CPU time, so that other processes on a busy
machine do not count) / the instructions it adds (the loop's own `addi` and `bne` are
included: about 4 ns an instruction). Each figure is the best of `--reps` repetitions
of both runs.

Forms (where the row has the operands):
- `distinct`: every register operand its own register (vd v1, va v2, vb v3);
- `vd=va`, `vd=vb`, `vd=va=vb`: the destination is also a source (md = ma, md = mb
  for the mask ops). So that the data do not drift to fixed points (inf, NaN, 0)
  over thousands of iterations, each copy is preceded by a `vmov` restoring the
  destination from the row's source, and the time of a bare `vmov` is subtracted.
- a few extra variants (`vld`/`vst` under an irregular mask, `mxu.mac` accumulating).

The registers hold seeded random data loaded from VMEM: v2 ~ N(0, 2), v3 uniform
in [0.5, 2), v4 = |N(0, 2)| + 0.01 (the source of log, log2, sqrt and rsqrt), m1
an irregular mask (v2 < v3), m2 a 5 x 100 rectangle (mrows).

Prints a markdown table and writes JSON (default bench/out/vector_ops.json);
`--baseline` takes an earlier JSON of this script and adds before/after columns.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from benchlib import OUT_DIR, finish, profile, table

from mkemu.emulator.config import RunConfig
from mkemu.emulator.machine import Machine
from mkemu.emulator.topology import Mesh
from mkemu.isa.asm import assemble
from mkemu.isa.encoding import (ACC, F32, FLAG, IMM32, MXU, OFF27, REG_M, REG_S, REG_V, UIMM8)
from mkemu.isa.table import TABLE

DATA_WORDS = 4 * 1024          # 4 tiles of f32 data at VMEM 0
SCALE_AT = 65536               # MXFP4 scales (random bytes) for mxu.ldw.mx
HI_ITERS = 6000                # iterations of the long run of a cheap row (the short: a third)
TARGET_S = 0.05                # wall time of the long run of an expensive row
COPIES = 4

# Source register of a unary row's va (log & co. take a positive one).
POSITIVE = {"vlog.f32", "vlog2.f32", "vsqrt.f32", "vrsqrt.f32"}


def data() -> np.ndarray:
    rng = np.random.default_rng(80)
    a = rng.normal(0, 2, 1024).astype(np.float32)
    b = rng.uniform(0.5, 2, 1024).astype(np.float32)
    c = (np.abs(rng.normal(0, 2, 1024)) + 0.01).astype(np.float32)
    d = rng.normal(0, 1, 1024).astype(np.float32)
    return np.concatenate([a, b, c, d]).view(np.int32)


def _scales() -> np.ndarray:
    rng = np.random.default_rng(81)
    return rng.integers(100, 150, 4096, dtype=np.uint8).view(np.int32)


PREAMBLE = f"""
.buffer data i32 {DATA_WORDS} input
.buffer scales i32 1024 input
.kernel main
    .smem 0 {DATA_WORDS * 4} 1 0 0 1 0 0
    .smem 32 4096 1 0 0 1 0 0
    rdsr s31, core
    bne s31, s0, done
    li s1, @data
    dma.start vmem[s0], hbm[s1], s0, s0
    li s1, @scales
    li s2, {SCALE_AT}
    li s3, 32
    dma.start vmem[s2], hbm[s1], s3, s0
    li s3, {DATA_WORDS * 4 + 4096}
    sem.wait s0, s3
    li s6, 512                ; tile row stride (words)
    vld.w v2, 0(s0), s6, m0
    vld.w v3, 4096(s0), s6, m0
    vld.w v4, 8192(s0), s6, m0
    vld.w v5, 12288(s0), s6, m0
    vmov v1, v2
    vcmplt.f32 m1, v2, v3
    li s7, 5
    li s8, 100
    mrows m2, s7, s8
    li s12, {(256 << 16) | 256}  ; weight tile shape 256 x 256
    li s13, {SCALE_AT}
    li s14, 512               ; weight row stride (bytes): 256 bf16
    li s15, 7                 ; element index / broadcast value
    mxu.ldw x0, 0(s0), s14, s12
    mxu.push x0, v5, 0
    mxu.push x0, v2, 1
    mxu.mac x0, a0, 1
    li s10, {{iters}}
loop:
{{body}}
    addi s10, s10, -1
    bne s10, s0, loop
done:
    halt
"""


def operand_text(ins, form: str) -> dict[str, str] | None:
    """Assembly text of each operand of `ins` in `form`, or None if the row has no such form."""
    names = {op.name for op in ins.operands}
    vreg_w = [op.name for op in ins.operands if op.kind is REG_V and op.access == "w"]
    vreg_r = [op.name for op in ins.operands if op.kind is REG_V and op.access == "r"]
    mreg_w = [op.name for op in ins.operands if op.kind is REG_M and op.access == "w"]
    src = "v4" if ins.mnemonic in POSITIVE else "v2"
    text: dict[str, str] = {}
    for op in ins.operands:
        k, n = op.kind, op.name
        if k is REG_V:
            text[n] = {"vd": "v1", "va": src, "vb": "v3"}.get(n, "v1")
        elif k is REG_M:
            text[n] = {"md": "m4", "ma": "m1", "mb": "m2", "mk": "m1", "mask": "m0"}[n]
        elif k is REG_S:
            text[n] = {"sa": "s0", "stride": "s6", "shape": "s12", "sc": "s13", "sd": "s9",
                       "sb": "s15"}[n]
            if ins.mnemonic in ("vbcast", "vinsert") and n == "sa":
                text[n] = "s15"
            if ins.mnemonic == "mrows":
                text[n] = {"sa": "s7", "sb": "s8"}[n]
            if ins.mnemonic.startswith("mxu.ldw") and n == "stride":
                text[n] = "s14"
        elif k is OFF27:
            text[n] = "0" if not ins.mnemonic.startswith("vst") else "32768"
        elif k is MXU:
            text[n] = "x0"
        elif k is ACC:
            text[n] = "a0"
        elif k is FLAG:
            text[n] = "1"
        elif k is UIMM8:
            text[n] = {"chunk": "1", "idx": "3", "amount": "5", "block": "2"}[n]
        elif k is IMM32:
            text[n] = "7"
        elif k is F32:
            text[n] = "1.5"
        else:
            raise ValueError(f"{ins.mnemonic}: no bench value for operand {n} ({k.name})")
    if form == "distinct":
        return text
    if form == "vd=va":
        if vreg_w == ["vd"] and "va" in vreg_r:
            text["va"] = "v1"
            return text
        if mreg_w == ["md"] and "ma" in names:
            text["ma"] = "m4"
            return text
        return None
    if form == "vd=vb":
        if vreg_w == ["vd"] and "vb" in vreg_r:
            text["vb"] = "v1"
            return text
        if mreg_w == ["md"] and "mb" in names:
            text["mb"] = "m4"
            return text
        return None
    if form == "vd=va=vb":
        if vreg_w == ["vd"] and {"va", "vb"} <= set(vreg_r):
            text["va"] = text["vb"] = "v1"
            return text
        if mreg_w == ["md"] and {"ma", "mb"} <= names:
            text["ma"] = text["mb"] = "m4"
            return text
        return None
    raise ValueError(form)


FORMS = ("distinct", "vd=va", "vd=vb", "vd=va=vb")
# Extra variants: (label, mnemonic, operand overrides).
VARIANTS = (
    ("vld.w mask=m1 (irregular)", "vld.w", {"mask": "m1"}),
    ("vld.w mask=m2 (5x100 rect)", "vld.w", {"mask": "m2"}),
    ("vld.bf16 mask=m1 (irregular)", "vld.bf16", {"mask": "m1"}),
    ("vst.w mask=m1 (irregular)", "vst.w", {"mask": "m1"}),
    ("vst.bf16 mask=m1 (irregular)", "vst.bf16", {"mask": "m1"}),
    ("vst.bf16 mask=m2 (5x100 rect)", "vst.bf16", {"mask": "m2"}),
    ("mxu.mac accumulate", "mxu.mac", {"zero": "0"}),
    ("vsel mk=m0", "vsel", {"mk": "m0"}),
)


def rows():
    return [ins for ins in TABLE.values() if ins.vector_side]


def body_of(ins, text: dict[str, str], restore: bool) -> str:
    """COPIES copies of the instruction, each after `vmov v1, SOURCE` if `restore`."""
    line = ins.mnemonic + (" " + ins.syntax.format(**text) if ins.syntax else "")
    source = "v4" if ins.mnemonic in POSITIVE else "v2"
    copy = ([f"    vmov v1, {source}"] if restore else []) + ["    " + line]
    return "\n".join(copy * COPIES)


def wall(body: str, iters: int, inputs) -> float:
    """CPU seconds of this thread in `Machine.run` (not wall time: on a loaded machine the
    wall time counts other processes' turns too)."""
    program = assemble(PREAMBLE.format(iters=iters, body=body), filename="<bench>")
    machine = Machine(profile(), Mesh((1, 1, 1)), RunConfig())
    machine.load(program)
    for (chip, name), array in inputs.items():
        machine.write_buffer(chip, name, array)
    t0 = time.thread_time()
    machine.run()
    return time.thread_time() - t0


def per_instr_ns(body: str, reps: int, inputs, lo: int | None = None, hi: int | None = None):
    """ns per copy of `body`'s line(s): (best long run - best short run) / added copies."""
    if lo is None:
        probe = min(wall(body, 200, inputs) for _ in range(2)) - min(wall(body, 2, inputs) for _ in range(2))
        each = max(probe, 1e-9) / (198 * COPIES)
        hi = int(min(HI_ITERS, max(150, TARGET_S / (each * COPIES))))
        lo = max(hi // 3, 1)
    best_lo = min(wall(body, lo, inputs) for _ in range(reps))
    best_hi = min(wall(body, hi, inputs) for _ in range(reps))
    return (best_hi - best_lo) / ((hi - lo) * COPIES) * 1e9, lo, hi


def measure(reps: int, only: list[str] | None) -> dict:
    inputs = {(0, "data"): data(), (0, "scales"): _scales()}
    profile()
    restore = "\n".join(["    vmov v1, v2"] * COPIES)
    for _ in range(3):
        per_instr_ns(restore, 1, inputs)      # compile or load the loop, warm up
    restore_ns = per_instr_ns(restore, reps, inputs)[0]
    raw: dict[str, dict] = {}
    for ins in rows():
        if only and ins.mnemonic not in only:
            continue
        entry = {}
        for form in FORMS:
            text = operand_text(ins, form)
            if text is None:
                continue
            aliased = form != "distinct" and any(op.kind is REG_V for op in ins.operands)
            entry[form] = (per_instr_ns(body_of(ins, text, aliased), reps, inputs)[0], aliased)
        raw[ins.mnemonic] = entry
        print(f"  {ins.mnemonic:24s} " + "  ".join(f"{f} {v:7.1f}" for f, (v, _) in entry.items()),
              file=sys.stderr, flush=True)
    # The restoring vmov's time: the best of a measurement before and one after the rows.
    restore_ns = min(restore_ns, per_instr_ns(restore, reps, inputs)[0])
    results = {name: {form: round(v - (restore_ns if aliased else 0.0), 1) for form, (v, aliased) in entry.items()}
               for name, entry in raw.items()}
    for label, mnemonic, overrides in VARIANTS:
        if only and mnemonic not in only:
            continue
        ins = TABLE[mnemonic]
        text = operand_text(ins, "distinct")
        text.update(overrides)
        value, lo, hi = per_instr_ns(body_of(ins, text, False), reps, inputs)
        results[label] = {"distinct": round(value, 1)}
        print(f"  {label:24s} distinct {value:7.1f}", file=sys.stderr, flush=True)
    nop, _, _ = per_instr_ns("\n".join(["    nop"] * COPIES), reps, inputs)
    return {"ns_per_instr": results, "restore_vmov_ns": round(restore_ns, 1), "nop_ns": round(nop, 1)}


def render(results: dict, baseline: dict | None) -> str:
    headers = ["instruction"]
    for form in FORMS:
        headers += [f"{form} before", f"{form} after"] if baseline else [form]
    rows_out = []
    for name, entry in results.items():
        row = [name]
        for form in FORMS:
            now = entry.get(form)
            if baseline:
                was = baseline.get(name, {}).get(form)
                row += ["-" if was is None else float(was), "-" if now is None else float(now)]
            else:
                row.append("-" if now is None else float(now))
        rows_out.append(row)
    return table("ns per instruction (compiled loop, tpu-v7-like)", headers, rows_out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="just these mnemonics")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", default=str(OUT_DIR / "vector_ops.json"))
    parser.add_argument("--baseline", help="an earlier JSON of this script: before/after columns")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    section = measure(args.reps, args.only)
    baseline = None
    if args.baseline:
        baseline = json.loads(Path(args.baseline).read_text())["vector_ops"]["ns_per_instr"]
    text = render(section["ns_per_instr"], baseline)
    print(text)
    print(f"nop: {section['nop_ns']} ns; the vmov subtracted from the aliased forms: "
          f"{section['restore_vmov_ns']} ns")
    finish({"vector_ops": dict(section, text=text)}, args.json, time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
