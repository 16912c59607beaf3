"""Pre-decoding: a kernel's words become a list of `Op`s the core loop runs.

Decoding happens once per kernel (all cores of an SPMD launch share the result):
each word is decoded through the ISA table, its register reads and writes become
scoreboard indices, its unit and timing class become a unit index, a latency and
an occupancy from the hardware profile, and its semantics become a handler.

A word that is not a valid instruction for this machine does not stop the load:
it becomes an `illegal` op that faults when executed, as on hardware, so the fault
names the core, cycle and pc that reached it (and unreachable data words are fine).
"""

from __future__ import annotations

import attrs

from mkemu.isa.asm import EncodingError, decode, format_instr
from mkemu.isa.hardware import HardwareProfile
from mkemu.isa.program import Kernel
from mkemu.isa.table import Instr

# Scoreboard slots: scalar, vector and mask registers, then per matrix unit its
# weight tile, its LHS staging buffer and each accumulator.
SB_S, SB_V, SB_M, SB_MXU = 0, 32, 64, 72

# Effects that interact with other cores, DMA engines or the event loop: the core
# stops running ahead and lets the machine execute them at their issue time.
GLOBAL_EFFECTS = frozenset({"dma", "dma_remote", "signal", "signal_remote", "wait",
                            "barrier", "halt"})


def unit_names(profile: HardwareProfile) -> tuple[str, ...]:
    mxus = tuple(f"mxu{i}" for i in range(profile.mxus_per_core))
    return ("scalar", "vld", "vst", "valu", "xlu", "eup") + mxus + ("dma", "sync", "meta")


@attrs.define(slots=True)
class Op:
    instr: Instr
    values: dict
    args: tuple           # operand values in declaration order
    unit: int
    latency: int
    occupancy: int
    srcs: tuple[int, ...]
    dsts: tuple[int, ...]
    is_global: bool
    text: str
    run: object = None    # the handler, set by the machine: fn(core, op) -> next pc or None


def mxu_slot(profile: HardwareProfile, x: int, which: str, acc: int = 0) -> int:
    base = SB_MXU + x * (2 + profile.mxu_accumulators)
    return {"w": base, "lhs": base + 1, "acc": base + 2 + acc}[which]


def scoreboard_size(profile: HardwareProfile) -> int:
    return SB_MXU + profile.mxus_per_core * (2 + profile.mxu_accumulators)


# The row an illegal word decodes to; its handler (effect "illegal") faults.
ILLEGAL = Instr(mnemonic=".word", opcode=-1, operands=(), syntax="", unit="scalar",
                timing=None, effect="illegal")


def decode_kernel(kernel: Kernel, profile: HardwareProfile) -> list[Op]:
    units = {name: i for i, name in enumerate(unit_names(profile))}
    ops = []
    for word in kernel.code:
        word = int(word)
        try:
            instr, values = decode(word)
        except EncodingError as exc:
            ops.append(_illegal(word, str(exc), f".word {word:#018x}", units))
            continue
        problem = _check_ranges(instr, values, profile)
        if problem:
            ops.append(_illegal(word, problem, format_instr(instr, values), units))
            continue
        ops.append(_make_op(instr, values, profile, units))
    return ops


def _illegal(word: int, problem: str, text: str, units: dict) -> Op:
    return Op(instr=ILLEGAL, values={"problem": problem}, args=(word,), unit=units["scalar"],
              latency=0, occupancy=1, srcs=(), dsts=(), is_global=False, text=text)


def _check_ranges(instr: Instr, values: dict, profile: HardwareProfile) -> str | None:
    """Operands that fit the encoding but not this machine (e.g. a 5th matrix unit)."""
    limits = {"vreg": profile.vregs, "sreg": profile.sregs, "mreg": profile.mregs,
              "mxu": profile.mxus_per_core, "acc": profile.mxu_accumulators}
    for op in instr.operands:
        limit = limits.get(op.kind.name)
        if limit is not None and values[op.name] >= limit:
            return f"operand {op.name} = {values[op.name]} but this machine has {limit} ({op.kind.name})"
        if op.name == "chunk" and values[op.name] * 128 >= profile.mxu_dim:
            return f"chunk {values[op.name]} is beyond the {profile.mxu_dim}-wide matrix unit"
    return None


def _make_op(instr: Instr, values: dict, profile: HardwareProfile, units: dict) -> Op:
    srcs, dsts = [], []
    for op in instr.operands:
        base = {"sreg": SB_S, "vreg": SB_V, "mreg": SB_M}.get(op.kind.name)
        if base is None:
            continue
        (dsts if op.access == "w" else srcs).append(base + values[op.name])
    effect = instr.effect
    if effect == "vinsert":
        srcs.append(SB_V + values["vd"])   # writes one element: the rest of vd is read
    if effect.startswith("mxu_"):
        x = values["x"]
        if effect == "mxu_ldw":
            dsts.append(mxu_slot(profile, x, "w"))
        elif effect == "mxu_push":
            dsts.append(mxu_slot(profile, x, "lhs"))
        elif effect == "mxu_mac":
            # The array adds into the accumulator where its rows leave it, in order: a
            # mac into an accumulator does not wait for the previous one into it (the
            # unit's in-order occupancy keeps their order); mxu.pop waits for the last.
            srcs += [mxu_slot(profile, x, "w"), mxu_slot(profile, x, "lhs")]
            acc_dst = mxu_slot(profile, x, "acc", values["acc"])
        elif effect == "mxu_pop":
            srcs.append(mxu_slot(profile, x, "acc", values["acc"]))
        unit = units[f"mxu{x}"]
    else:
        unit = units[instr.unit]
    # Writes to s0 are dropped and m0 is constant: neither is a real dependency.
    dsts = [d for d in dsts if d not in (SB_S, SB_M)]
    # In-order issue also waits for an earlier, slower write to the same register
    # (write-after-write), so a result can never be overtaken.
    srcs += [d for d in dsts if d not in srcs]
    if effect == "mxu_mac":
        dsts.append(acc_dst)
    if instr.timing is None:
        latency = occupancy = 0
    else:
        timing = profile.timing[instr.timing]
        latency, occupancy = timing.latency_cycles, timing.occupancy_cycles
    return Op(instr=instr, values=values, args=tuple(values[o.name] for o in instr.operands),
              unit=unit, latency=latency, occupancy=occupancy, srcs=tuple(srcs),
              dsts=tuple(dsts), is_global=effect in GLOBAL_EFFECTS,
              text=format_instr(instr, values))
