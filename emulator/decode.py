"""Pre-decoding: a kernel's words become flat integer arrays the compiled loop runs.

Decoding happens once per kernel (all cores of an SPMD launch share the result),
and a word once per profile and process (`_words_of`).
Everything comes from the instruction's table row: its exec clause id (or that it
is global), its unit and timing class (a latency and an occupancy from the hardware
profile), its scoreboard sources and destinations (its register operands plus the
matrix-unit state in its access sets), and its operand values.

A word that is not a valid instruction for this machine does not stop the load:
it becomes an illegal op that faults when executed, as on hardware, so the fault
names the core, cycle and pc that reached it (and unreachable data words are fine).
"""

from __future__ import annotations

import threading

import attrs
import numpy as np

from mkemu.isa.asm import EncodingError, decode, format_instr
from mkemu.isa.hardware import HardwareProfile
from mkemu.isa.program import Kernel
from mkemu.isa.table import TABLE, Instr

# Scoreboard slots: scalar, vector and mask registers, then per matrix unit its
# weight tile, its LHS staging buffer and each accumulator.
SB_S, SB_V, SB_M, SB_MXU = 0, 32, 64, 72

# The rows the compiled loop executes, in opcode order; ILLEGAL_XID faults.
LOCAL_ROWS: tuple[Instr, ...] = tuple(sorted((i for i in TABLE.values() if not i.is_global),
                                             key=lambda i: i.opcode))
XID = {instr.mnemonic: n for n, instr in enumerate(LOCAL_ROWS)}
ILLEGAL_XID = len(LOCAL_ROWS)

# Columns of the code array, one row per instruction.
MAX_SRCS, MAX_DSTS, MAX_ARGS = 8, 4, 8
C_XID, C_UNIT, C_LAT, C_OCC, C_GLOBAL, C_NSRC = range(6)
C_SRC = 6
C_NDST = C_SRC + MAX_SRCS
C_DST = C_NDST + 1
C_ARG = C_DST + MAX_DSTS
# Run-time checks the compiler attached (free of cycles): the buffers of up to two
# VMEM/SMEM footprints (count, then [lo, hi) each), and a register that must lie in
# [lo, hi) (register + 1, or 0 for none).
MAX_BOUNDS = 2
C_NBOUND = C_ARG + MAX_ARGS
C_BOUND = C_NBOUND + 1
C_RREG = C_BOUND + 2 * MAX_BOUNDS
C_RLO, C_RHI = C_RREG + 1, C_RREG + 2
C_WIDTH = C_RHI + 1


def unit_names(profile: HardwareProfile) -> tuple[str, ...]:
    mxus = tuple(f"mxu{i}{path}" for path in ("", ".w", ".lhs") for i in range(profile.mxus_per_core))
    return ("scalar", "vld", "vst", "valu", "xlu", "eup") + mxus + ("dma", "sync", "meta")


def mxu_slot(profile: HardwareProfile, x: int, which: str, acc: int = 0) -> int:
    base = SB_MXU + x * (2 + profile.mxu_accumulators)
    return {"mxu.w": base, "mxu.lhs": base + 1, "mxu.acc": base + 2 + acc}[which]


def mxu_state(profile: HardwareProfile, slot: int) -> tuple[str, int, int]:
    """(which, unit, accumulator) of a matrix-unit scoreboard slot (`mxu_slot` inverted)."""
    x, k = divmod(slot - SB_MXU, 2 + profile.mxu_accumulators)
    return ("mxu.w", x, 0) if k == 0 else ("mxu.lhs", x, 0) if k == 1 else ("mxu.acc", x, k - 2)


def scoreboard_size(profile: HardwareProfile) -> int:
    return SB_MXU + profile.mxus_per_core * (2 + profile.mxu_accumulators)


@attrs.frozen
class Op:
    """What the Python side needs of one instruction: global ops, faults, listings."""

    instr: Instr | None        # None: an illegal word
    args: tuple[int, ...]      # operand values in declaration order
    text: str
    unit: int
    latency: int
    occupancy: int
    problem: str | None = None  # why an illegal word is illegal
    dsts: tuple[int, ...] = ()  # the scoreboard slots it writes

    @property
    def global_kind(self) -> str | None:
        return self.instr.global_kind if self.instr is not None else None


@attrs.frozen(eq=False)
class DecodedKernel:
    code: np.ndarray             # int64 [n, C_WIDTH]
    ops: tuple[Op, ...]
    region_slots: int            # 1 + the largest region id any mark.push names
    vregs_written: np.ndarray    # the vector registers some instruction writes
    mregs_written: np.ndarray    # ... and the mask registers
    lhs_written: np.ndarray      # ... the matrix units whose LHS buffer one writes
    acc_written: np.ndarray      # ... and the accumulators, (unit, accumulator) rows
    smem_image: np.ndarray       # the kernel's initial SMEM bytes (read-only)


# Decoded words (row, (table row, Op, operand values)) of each machine profile (by its
# values, `values_key`), kept across kernels and loads: a tuner, a sweep or a test suite loads the same
# programs again and again, and most of a kernel's decoding is its words'. A word kept
# takes about 1 KB; the three K3 programs have about 7,000 distinct words. Past
# MAX_KEPT_WORDS words in all, the profiles used least recently are dropped (and the
# current one's words start afresh if they alone are more).
_kept_words: dict[str, dict[int, tuple[np.ndarray, tuple]]] = {}
MAX_KEPT_WORDS = 1 << 15
_kept_lock = threading.Lock()   # (threads of one process may load programs at once)


def _words_of(profile: HardwareProfile) -> dict[int, tuple[np.ndarray, tuple]]:
    key = profile.values_key()
    with _kept_lock:
        words = _kept_words.pop(key, None)
        if words is None or len(words) > MAX_KEPT_WORDS:
            words = {}
        total = len(words) + sum(len(other) for other in _kept_words.values())
        while total > MAX_KEPT_WORDS:
            total -= len(_kept_words.pop(next(iter(_kept_words))))
        _kept_words[key] = words          # (now the most recently used)
    return words


def decode_kernel(kernel: Kernel, profile: HardwareProfile) -> DecodedKernel:
    units = {name: i for i, name in enumerate(unit_names(profile))}
    # A kernel repeats words (a third of k3's are distinct): each is decoded once, and
    # kept for the next kernel on this profile (`_words_of`).
    kept = _words_of(profile)
    distinct: dict[int, int] = {}
    rows: list[np.ndarray] = []
    decoded: list[tuple[Instr | None, Op, dict]] = []
    index = np.empty(len(kernel.code), np.int64)
    for pc, word in enumerate(np.asarray(kernel.code).tolist()):
        n = distinct.get(word)
        if n is None:
            n = distinct[word] = len(rows)
            known = kept.get(word)
            if known is None:
                row = np.zeros(C_WIDTH, np.int64)
                known = kept[word] = (row, _decode_word(row, word, profile, units))
            rows.append(known[0])      # (np.stack below copies: the kept row stays as it is)
            decoded.append(known[1])
        index[pc] = n
    code = np.stack(rows)[index] if rows else np.zeros((0, C_WIDTH), np.int64)
    ops = tuple(decoded[n][1] for n in index.tolist())
    regions = 1
    for pc, n in enumerate(index.tolist()):
        instr, _, values = decoded[n]
        if instr is None:
            continue
        _encode_checks(code[pc], instr, kernel, pc)
        if instr.mnemonic == "mark.push":
            regions = max(regions, values["region"] + 1)
    # What a launch can leave behind in registers and matrix units (the next launch
    # clears exactly that: `Core.start`).
    written = {slot for instr, op, _ in decoded if instr is not None for slot in op.dsts}
    vregs = sorted(slot - SB_V for slot in written if SB_V <= slot < SB_M)
    mregs = sorted(slot - SB_M for slot in written if SB_M <= slot < SB_MXU)
    mxu = [mxu_state(profile, slot) for slot in sorted(written) if slot >= SB_MXU]
    return DecodedKernel(code=code, ops=ops, region_slots=regions, vregs_written=np.array(vregs, np.int64),
                         mregs_written=np.array(mregs, np.int64),
                         lhs_written=np.array([x for which, x, _ in mxu if which == "mxu.lhs"], np.int64),
                         acc_written=np.array([(x, a) for which, x, a in mxu if which == "mxu.acc"],
                                              np.int64).reshape(-1, 2),
                         smem_image=np.frombuffer(kernel.smem_init, np.uint8))


def _decode_word(row: np.ndarray, word: int, profile: HardwareProfile,
                 units: dict) -> tuple[Instr | None, Op, dict]:
    """Fill `row` for `word`: (its table row, or None if it is illegal here, its Op,
    its operand values)."""
    try:
        instr, values = decode(word)
    except EncodingError as exc:
        return None, _illegal(row, units, f".word {word:#018x}", str(exc)), {}
    problem = _check_ranges(instr, values, profile)
    if problem:
        return None, _illegal(row, units, format_instr(instr, values), problem), values
    return instr, _encode_row(row, instr, values, profile, units), values


def _illegal(row: np.ndarray, units: dict, text: str, problem: str) -> Op:
    row[C_XID], row[C_UNIT], row[C_OCC] = ILLEGAL_XID, units["scalar"], 1
    return Op(instr=None, args=(), text=text, unit=units["scalar"], latency=0, occupancy=1,
              problem=problem)


def _check_ranges(instr: Instr, values: dict, profile: HardwareProfile) -> str | None:
    """Operands that fit the encoding but not this machine (e.g. a 5th matrix unit)."""
    limits = {"vreg": (profile.vregs, "vector registers"), "sreg": (profile.sregs, "scalar registers"),
              "mreg": (profile.mregs, "mask registers"), "mxu": (profile.mxus_per_core, "matrix units per core"),
              "acc": (profile.mxu_accumulators, "accumulators per matrix unit")}
    for op in instr.operands:
        limit, what = limits.get(op.kind.name, (None, ""))
        if limit is not None and values[op.name] >= limit:
            return (f"operand {op.name} = {values[op.name]} but this machine has {limit} {what} "
                    f"(0..{limit - 1})")
        if op.name == "chunk" and values[op.name] * 128 >= profile.mxu_dim:
            return f"chunk {values[op.name]} is beyond the {profile.mxu_dim}-wide matrix unit"
    return None


def scoreboard(instr: Instr, values: dict, profile: HardwareProfile) -> tuple[list[int], list[int]]:
    """The row's scoreboard sources and destinations for these operand values."""
    srcs, dsts = [], []
    for op in instr.operands:
        base = {"sreg": SB_S, "vreg": SB_V, "mreg": SB_M}.get(op.kind.name)
        if base is not None:
            (dsts if op.access == "w" else srcs).append(base + values[op.name])
    for state in instr.reads:
        srcs.append(SB_V + values["vd"] if state == "vd" else
                    mxu_slot(profile, values["x"], state, values.get("acc", 0)))
    accumulated = []
    for state in instr.writes:
        slot = mxu_slot(profile, values["x"], state, values.get("acc", 0))
        (accumulated if instr.accumulates else dsts).append(slot)
    # Writes to s0 are dropped and m0 is constant: neither is a real dependency.
    dsts = [d for d in dsts if d not in (SB_S, SB_M)]
    # In-order issue also waits for an earlier, slower write to the same register
    # (write-after-write), so a result can never be overtaken. An accumulating write
    # does not wait: the array adds into the accumulator as rows leave it, in issue
    # order (the unit's occupancy keeps them in order); a read (mxu.pop) waits for it.
    srcs += [d for d in dsts if d not in srcs]
    return srcs, dsts + accumulated


def _encode_row(row: np.ndarray, instr: Instr, values: dict, profile: HardwareProfile,
                units: dict) -> Op:
    srcs, dsts = scoreboard(instr, values, profile)
    unit = units[instr.unit.replace("mxu", f"mxu{values['x']}", 1)] if instr.unit.startswith("mxu") else units[instr.unit]
    if instr.timing is None:
        latency = occupancy = 0
    else:
        timing = profile.timing[instr.timing]
        latency, occupancy = timing.latency_cycles, timing.occupancy_cycles
    args = tuple(values[o.name] for o in instr.operands)
    row[C_XID] = -1 if instr.is_global else XID[instr.mnemonic]
    row[C_UNIT], row[C_LAT], row[C_OCC], row[C_GLOBAL] = unit, latency, occupancy, instr.is_global
    row[C_NSRC] = len(srcs)
    row[C_SRC:C_SRC + len(srcs)] = srcs
    row[C_NDST] = len(dsts)
    row[C_DST:C_DST + len(dsts)] = dsts
    row[C_ARG:C_ARG + len(args)] = args
    return Op(instr=instr, args=args, text=format_instr(instr, values), unit=unit,
              latency=latency, occupancy=occupancy, dsts=tuple(dsts))


def _encode_checks(row: np.ndarray, instr: Instr, kernel: Kernel, pc: int) -> None:
    """The compiler's run-time checks of this instruction, for the loop to test."""
    extents = kernel.extents.get(pc)
    if extents and not instr.is_global:
        local = [e for (space, _, _), e in zip(instr.memory, extents) if space in ("vmem", "smem")]
        row[C_NBOUND] = len(local)
        for k, e in enumerate(local[:MAX_BOUNDS]):
            lo, hi = (e.lo, e.lo + e.size) if e is not None else (-(1 << 62), 1 << 62)
            row[C_BOUND + 2 * k], row[C_BOUND + 2 * k + 1] = lo, hi
    check = kernel.ranges.get(pc)
    if check is not None:
        row[C_RREG], row[C_RLO], row[C_RHI] = check.reg + 1, check.lo, check.hi
