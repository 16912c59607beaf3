"""The compiled issue loop: generated from the instruction table, compiled once by numba.

`compiled_loop()` returns `run(C, I, V, M, VMEM, SMEM, MXWU, MXLU, MXAU, RSTACK,
RSTAT, RACES, LOG, RB, TR, TRR) -> exit code`. It runs one core's local instructions from
`I[H_PC]` with the timing rules of docs/architecture.md (an instruction issues when
its unit is free and its sources are ready; it books the unit for its occupancy and
its results for its latency) and executes each one by its table row's exec clause.
It returns at a global instruction (EXIT_GLOBAL, with its issue cycle in
`I[H_ISSUE]`), at a fault (EXIT_FAULT, the fault in `I[H_E:]`), or when a trace
buffer or the access log is full (EXIT_TRACE_FULL, EXIT_LOG_FULL). The same loop
records traces (flag bit 0: one (pc, issue, unit stall, operand stall) row per
instruction into TR, region rows into TRR) and checks races (flag bit 1): every VMEM
and SMEM access against the DMAs in flight for the core (RACES rows: outer lo, hi,
whether the DMA only reads, space, its block), and into LOG (issue cycle, pc, space,
footprint, write) for the checks made when another core's DMA lands later. With
flag bit 2 (timing-only) it computes nothing: vector-side rows only take their
cycles, and a value read back into a scalar (`vextract`) is taken from the queue RB
(EXIT_READBACK when it runs dry); with flag bit 3 it records those values into RB.

The source of the loop is generated from the table: one branch per row, holding the
row's operand names, its race check (from its memory footprint) and its exec
clause, dispatched by a balanced tree of comparisons on the row's exec id. The
generated module is written to a user cache directory under a name that hashes
everything it is made from, so numba's on-disk cache (next to it) compiles it once
per machine and version, and neither a non-editable install nor a read-only
checkout gets written to.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import os
import sys
import threading
import time

from mkemu.cache import compiled_in_cache, module_in_cache
from mkemu.emulator import decode as dec
from mkemu.emulator import footprint
from mkemu.isa import semantics
from mkemu.emulator.footprint import block_span, blocks_overlap
from mkemu.emulator.warm import alongside
from mkemu.isa.semantics import E_REGION_DEEP, E_REGION_POP, LANES, ROWS, fault, jitable

# --- the layout of I, the core's int64 state --------------------------------------
H_PC, H_T, H_COUNT, H_STALL_UNIT, H_STALL_DEP, H_NTR, H_NTRR, H_RDEPTH = range(8)
H_NRACE, H_FLAGS, H_LIMIT, H_EXIT, H_ISSUE, H_NREGNAMES = range(8, 14)
H_DIRTY = 14          # VMEM [lo, hi) written since the launch began (two words)
H_SDIRTY = 16         # SMEM [lo, hi) likewise
H_E = 18              # a fault: code, a, b, c, d
H_O_S, H_O_READY, H_O_UFREE, H_O_BUSY, H_O_SPEC, H_O_MR, H_O_MXR = range(24, 31)
H_NSREG, H_NREADY, H_NUNITS, H_NMREG, H_NMXU, H_MXD = range(31, 37)
H_NLOG = 37           # accesses logged in this run-ahead
H_ILIMIT = 38         # the instruction count at which this launch faults
H_IMAX = 39           # the instructions a core may run per launch
H_RB_N, H_RB_I = 40, 41   # readback queue: values in it, next to take (recording: values kept)
H_RACE_FROM = 42      # the first live row of RACES (the rows before it are dropped DMAs')
HEADER = 48

EXIT_GLOBAL, EXIT_FAULT, EXIT_TRACE_FULL, EXIT_LOG_FULL, EXIT_READBACK = 1, 2, 3, 4, 5
FLAG_TRACE, FLAG_RACES, FLAG_TIMING_ONLY, FLAG_RECORD = 1, 2, 4, 8
# Faults the loop itself raises (the rows' own are in isa/semantics.py).
E_RAN_OFF, E_MAX_CYCLES, E_RACE, E_MAX_INSTRUCTIONS = 40, 41, 42, 43
E_BUFFER, E_RANGE = 44, 45   # the compiler's run-time checks: a buffer's bounds, a value's range
REGION_DEPTH = 64
REGION_OPEN, REGION_CLOSE = 0, 1
# Compiled eagerly for exactly these array types (all C-contiguous).
SIGNATURE = ("int64(int64[:, ::1], int64[::1], uint32[:, ::1], uint8[:, ::1], uint8[::1], uint8[::1], "
             "uint16[:, :, ::1], uint32[:, :, ::1], uint32[:, :, :, ::1], int64[:, ::1], int64[:, ::1], "
             "int64[:, ::1], int64[:, ::1], int64[::1], int64[:, ::1], int64[:, ::1])")


def layout(nsreg: int, nready: int, nunits: int, nmreg: int, nmxu: int) -> dict[str, int]:
    """Offsets of the register file and scoreboard inside I, and I's length."""
    offsets, at = {}, HEADER
    for name, size in (("S", nsreg), ("READY", nready), ("UFREE", nunits), ("BUSY", nunits),
                       ("SPEC", 16), ("MR", 2 * nmreg), ("MXR", 2 * nmxu)):
        offsets[name] = at
        at += size
    offsets["size"] = at
    return offsets


# --- helpers of the loop's own bookkeeping (compiled with the loop) ---------------

@jitable
def region_enter(RSTACK, I, region, index, issue, pc, E):
    """mark.push: push (region, index, start cycle, pc); a traced run notes a region id
    the kernel has no name for when it opens, so names are assigned in opening order."""
    d = I[H_RDEPTH]
    if d >= RSTACK.shape[0]:
        return fault(E, E_REGION_DEEP, RSTACK.shape[0], 0, 0, 0)
    RSTACK[d, 0] = region
    RSTACK[d, 1] = index
    RSTACK[d, 2] = issue
    RSTACK[d, 3] = pc
    RSTACK[d, 4] = 0
    I[H_RDEPTH] = d + 1
    return 0


@jitable
def region_leave(RSTACK, RSTAT, TRR, I, issue, E):
    """mark.pop: time spent in the innermost region (all of it, and outside the regions
    nested in it), and its trace row."""
    d = I[H_RDEPTH]
    if d == 0:
        return fault(E, E_REGION_POP, 0, 0, 0, 0)
    d -= 1
    I[H_RDEPTH] = d
    rid = RSTACK[d, 0]
    spent = issue - RSTACK[d, 2]
    RSTAT[rid, 0] += spent
    RSTAT[rid, 1] += 1
    RSTAT[rid, 2] += spent - RSTACK[d, 4]
    if d > 0:
        RSTACK[d - 1, 4] += spent
    if I[H_FLAGS] & FLAG_TRACE:
        n = I[H_NTRR]
        TRR[n, 0] = REGION_CLOSE
        TRR[n, 1] = rid
        TRR[n, 2] = RSTACK[d, 1]
        TRR[n, 3] = d
        TRR[n, 4] = RSTACK[d, 2]
        TRR[n, 5] = issue
        TRR[n, 6] = RSTACK[d, 3]
        I[H_NTRR] = n + 1
    return 0


@jitable
def region_named(TRR, I, region):
    """Trace row noting that region id `region` (unnamed by the kernel) opens now."""
    n = I[H_NTRR]
    TRR[n, 0] = REGION_OPEN
    TRR[n, 1] = region
    I[H_NTRR] = n + 1


@jitable
def tile_footprint(MR, M, mask, size):
    """(first row, rows, first byte, end byte within a row) a tile access under `mask`
    touches: the mask's rectangle, or for any other mask the rows from its first active
    one to its last and the range of its active lanes."""
    rows, lanes = MR[mask, 0], MR[mask, 1]
    if rows >= 0:
        return 0, rows, 0, lanes * size
    first_row, last_row, first_lane, last_lane = -1, -1, LANES, -1
    for e in range(ROWS * LANES):
        if M[mask, e]:
            if first_row < 0:
                first_row = e // LANES
            last_row = e // LANES
            first_lane = min(first_lane, e % LANES)
            last_lane = max(last_lane, e % LANES)
    if last_row < 0:
        return 0, 0, 0, 0
    return first_row, last_row - first_row + 1, first_lane * size, (last_lane + 1) * size


@jitable
def first_conflict_in_flight(RACES, n, start, space, write, addr, inner, n1, s1, n2, s2):
    """The first row k >= start of `RACES[:n]` (the DMAs in flight for a core: lo, hi,
    reads-only, space, block) in `space` that shares a byte with the block, where it
    writes the bytes or the block is written; -1 if none."""
    lo, hi = block_span(addr, inner, n1, s1, n2, s2)
    for k in range(start, n):
        if RACES[k, 3] != space or not (write or RACES[k, 2] == 0):
            continue
        if RACES[k, 0] < hi and lo < RACES[k, 1] and \
                blocks_overlap(RACES[k, 4], RACES[k, 5], RACES[k, 6], RACES[k, 7], RACES[k, 8], RACES[k, 9],
                               addr, inner, n1, s1, n2, s2):
            return k
    return -1


@jitable
def access_race(RACES, n, start, space, addr, stride, rows, lo_off, hi_off, write, E):
    """Fault if this access shares a byte with a DMA in flight where either writes it
    (rows from `start`: those before it are dropped)."""
    if rows <= 0 or hi_off <= lo_off:
        return 0
    k = first_conflict_in_flight(RACES, n, start, space, write, addr + lo_off, hi_off - lo_off, rows, stride, 1, 0)
    if k < 0:
        return 0
    lo, hi = block_span(addr + lo_off, hi_off - lo_off, rows, stride, 1, 0)
    return fault(E, E_RACE, k, lo, hi, write)


@jitable
def log_access(LOG, I, issue, pc, space, addr, stride, rows, lo_off, hi_off, write):
    n = I[H_NLOG]
    LOG[n, 0] = issue
    LOG[n, 1] = pc
    LOG[n, 2] = space
    LOG[n, 3] = addr
    LOG[n, 4] = stride
    LOG[n, 5] = rows
    LOG[n, 6] = lo_off
    LOG[n, 7] = hi_off
    LOG[n, 8] = write
    I[H_NLOG] = n + 1


@jitable
def first_logged_conflict(LOG, n, since, space, dma_writes, addr, inner, n1, s1, n2, s2):
    """The first access in `LOG[:n]` at or after cycle `since`, in `space`, that shares
    a byte with the block (a write, if the DMA only reads), or -1."""
    for k in range(n):
        if LOG[k, 0] < since or LOG[k, 2] != space or not (dma_writes or LOG[k, 8]):
            continue
        a, stride, rows, lo_off, hi_off = LOG[k, 3], LOG[k, 4], LOG[k, 5], LOG[k, 6], LOG[k, 7]
        if blocks_overlap(a + lo_off, hi_off - lo_off, rows, stride, 1, 0, addr, inner, n1, s1, n2, s2):
            return k
    return -1


@jitable
def mark_dirty(I, at, lo, hi):
    """Widen the written range [I[at], I[at + 1]) by [lo, hi)."""
    if lo < I[at]:
        I[at] = lo
    if hi > I[at + 1]:
        I[at + 1] = hi


_SUPPORT = (region_enter, region_leave, region_named, tile_footprint, access_race, log_access,
            first_logged_conflict, first_conflict_in_flight, mark_dirty)
_HELPERS = ("fault", "w32", "idiv", "irem", "f32_max", "f32_min", "bf16_round_bits", "f32_to_i32",
            "i32_to_f32", "exp_f32", "exp2_f32", "log_f32", "log2_f32", "rcp_f32", "sqrt_f32",
            "rsqrt_f32", "sigmoid_f32", "silu_f32", "tanh_f32", "exp_row", "log_row", "exp2_row",
            "log2_row", "rcp_row", "rsqrt_row", "sqrt_row", "sigmoid_row", "tanh_row", "silu_row",
            "reduce_f32", "reduce_i32", "bcast_index", "rotate", "column", "element_ok",
            "smem_addr_ok", "smem_load", "smem_store", "smem_pair_ok", "smem_load_d",
            "smem_store_d", "vload", "vstore", "vtile_span", "rows_span", "wtile_shape",
            "load_weights", "load_weights_mx", "push_lhs", "mac", "pop_acc", "mask_rect")


# --- the generated source ---------------------------------------------------------

def _indent(text: str, levels: int) -> str:
    pad = "    " * levels
    return "\n".join(pad + line if line.strip() else line for line in text.splitlines())


def _footprint_where(instr, shape: str) -> str:
    """Code setting one footprint as (fa, fs, fn, flo, fhi): fn rows fs bytes apart from
    fa, bytes [flo, fhi) of each."""
    if shape == "tile":
        return (f"fs = S[stride]\nfr, fn, flo, fhi = tile_footprint(MR, M, mask, {instr.elem_bytes})\n"
                "fa = S[sa] + off + fr * fs")
    if shape == "span":      # the weight tile's rows x cols bf16 values
        return "fa = S[sa] + off\nfs = S[stride]\nfn, flo, fhi = rows, 0, cols * 2"
    if shape == "mxspan":    # MXFP4 values: rows x cols/2 bytes
        return "fa = S[sa] + off\nfs = S[stride]\nfn, flo, fhi = rows, 0, cols // 2"
    if shape == "mxscale":   # MXFP4 scales: a row of cols bytes per 32 rows
        return "fa = S[sc]\nfs = 2 * S[stride]\nfn, flo, fhi = (rows + 31) // 32, 0, cols"
    size = 8 if shape == "dword" else 4     # one or two SMEM words
    return f"fa = S[sa] + off\nfs = 0\nfn, flo, fhi = 1, 0, {size}"


def _footprint_check(instr) -> str:
    """The checks of a row's memory footprints: inside the buffers the compiler named
    (when it named them), and the race check against the DMAs in flight for this core
    and into the log of this run-ahead."""
    checks = []
    for k, (space, access, shape) in enumerate(instr.memory):
        if space not in ("vmem", "smem"):
            continue
        write = 1 if access == "w" else 0
        code = 0 if space == "vmem" else 1
        bound = (f"if C[pc, C_NBOUND] > {k} and fn > 0 and fhi > flo:\n"
                 f"    blo, bhi = block_span(fa + flo, fhi - flo, fn, fs, 1, 0)\n"
                 f"    if blo < C[pc, C_BOUND + {2 * k}] or bhi > C[pc, C_BOUND + {2 * k + 1}]:\n"
                 f"        err = fault(E, E_BUFFER, blo, bhi, {k}, 0)")
        race = (f"if races and err == 0:\n"
                f"    if I[H_NRACE] > 0:\n"
                f"        err = access_race(RACES, I[H_NRACE], I[H_RACE_FROM], {code}, fa, fs, fn, flo, fhi, {write}, E)\n"
                f"    log_access(LOG, I, issue, pc, {code}, fa, fs, fn, flo, fhi, {write})")
        check = "\n".join([_footprint_where(instr, shape), bound, race])
        if checks:
            check = "if err == 0:\n" + _indent(check, 1)
        checks.append(check)
    if not checks:
        return ""
    return "if races or C[pc, C_NBOUND] > 0:\n" + _indent("\n".join(checks), 1)


def _dirty_update(instr) -> str:
    """Note the VMEM/SMEM bytes a row writes, so the next launch clears only those."""
    for space, access, shape in instr.memory:
        if access == "w" and shape == "tile":
            return (f"if err == 0:\n    lo, hi = vtile_span(S[sa] + off, S[stride], {instr.elem_bytes})\n"
                    "    mark_dirty(I, H_DIRTY, lo, hi)")
        if access == "w" and shape in ("word", "dword"):
            size = 8 if shape == "dword" else 4
            return f"if err == 0:\n    mark_dirty(I, H_SDIRTY, S[sa] + off, S[sa] + off + {size})"
    return ""


def _branch(instr) -> str:
    """The body run for one row: operands by name, race check, exec clause, bookkeeping;
    in a timing-only run a vector-side row does nothing but take its cycles, and a row
    that reads data back into a scalar takes the value from the readback queue."""
    lines = [f"{op.name} = C[pc, {dec.C_ARG + k}]" for k, op in enumerate(instr.operands)]
    check = _footprint_check(instr)
    body = instr.exec
    if "{check}" in body:
        body = body.replace("{check}", _indent(check, 1).strip() or "pass")
    elif check:
        body = "\n".join([check, "if err == 0:", _indent(body, 1)])
    if instr.mnemonic == "mark.push":
        body += "\nif tracing and region >= I[H_NREGNAMES]:\n    region_named(TRR, I, region)"
    dirty = _dirty_update(instr)
    if dirty:
        body += "\n" + dirty
    if instr.reads_back:
        recorded = (f"{body}\nif recording and err == 0:\n    RB[I[H_RB_N]] = {instr.readback}\n"
                    "    I[H_RB_N] += 1")
        taken = instr.exec.replace(instr.readback, "RB[I[H_RB_I]]") + "\nif err == 0:\n    I[H_RB_I] += 1"
        body = f"if timing_only:\n{_indent(taken, 1)}\nelse:\n{_indent(recorded, 1)}"
    elif instr.vector_side:
        body = f"if not timing_only:\n{_indent(body, 1)}"
    return "\n".join(lines + [body])


def _dispatch(ids: list[int], levels: int) -> str:
    """A balanced tree of comparisons on the exec id `x_id` over `ids`."""
    if len(ids) == 1:
        xid = ids[0]
        if xid == dec.ILLEGAL_XID:
            return _indent("err = fault(E, E_ILLEGAL, pc, 0, 0, 0)", levels)
        instr = dec.LOCAL_ROWS[xid]
        return _indent(f"# {instr.mnemonic}\n" + _branch(instr), levels)
    mid = len(ids) // 2
    return "\n".join([_indent(f"if x_id < {ids[mid]}:", levels), _dispatch(ids[:mid], levels + 1),
                      _indent("else:", levels), _dispatch(ids[mid:], levels + 1)])


_PROLOGUE = '''
@njit(SIGNATURE, cache=True, error_model="numpy", nogil=True)
def run(C, I, V, M, VMEM, SMEM, MXWU, MXLU, MXAU, RSTACK, RSTAT, RACES, LOG, RB, TR, TRR):
    VMEM16 = VMEM.view(np.uint16)
    VMEM32 = VMEM.view(np.uint32)
    SMEM32 = SMEM.view(np.uint32)
    VF = V.view(np.float32)
    VI = V.view(np.int32)
    MXL = MXLU.view(np.float32)
    MXA = MXAU.view(np.float32)
    S = I[I[H_O_S]:I[H_O_S] + I[H_NSREG]]
    READY = I[I[H_O_READY]:I[H_O_READY] + I[H_NREADY]]
    UFREE = I[I[H_O_UFREE]:I[H_O_UFREE] + I[H_NUNITS]]
    BUSY = I[I[H_O_BUSY]:I[H_O_BUSY] + I[H_NUNITS]]
    SPEC = I[I[H_O_SPEC]:I[H_O_SPEC] + 16]
    MR = I[I[H_O_MR]:I[H_O_MR] + 2 * I[H_NMREG]].reshape(I[H_NMREG], 2)
    MXR = I[I[H_O_MXR]:I[H_O_MXR] + 2 * I[H_NMXU]]
    E = I[H_E:H_E + 5]
    MXD = I[H_MXD]
    n_ops = C.shape[0]
    tracing = (I[H_FLAGS] & FLAG_TRACE) != 0
    races = (I[H_FLAGS] & FLAG_RACES) != 0
    timing_only = (I[H_FLAGS] & FLAG_TIMING_ONLY) != 0
    recording = (I[H_FLAGS] & FLAG_RECORD) != 0
    limit = I[H_LIMIT]
    budget = I[H_ILIMIT] - I[H_COUNT]
    pc = I[H_PC]
    t = I[H_T]
    count = 0
    stall_unit = 0
    stall_dep = 0
    code = 0
    while True:
        if tracing and (I[H_NTR] >= TR.shape[0] or I[H_NTRR] >= TRR.shape[0] - 1):
            code = EXIT_TRACE_FULL
            break
        if races and I[H_NLOG] >= LOG.shape[0]:
            code = EXIT_LOG_FULL
            break
        if pc >= n_ops or pc < 0:
            fault(E, E_RAN_OFF, pc, n_ops, 0, 0)
            code = EXIT_FAULT
            break
        if C[pc, C_XID] == XID_READBACK and ((timing_only and I[H_RB_I] >= I[H_RB_N])
                                            or (recording and I[H_RB_N] >= RB.shape[0])):
            code = EXIT_READBACK    # the queue ran dry, or the record is full: before issuing
            break
        issue = t
        u = C[pc, C_UNIT]
        if UFREE[u] > issue:
            issue = UFREE[u]
        unit_ready = issue
        for j in range(C[pc, C_NSRC]):
            r = READY[C[pc, C_SRC + j]]
            if r > issue:
                issue = r
        stall_unit += unit_ready - t
        stall_dep += issue - unit_ready
        if tracing:
            n = I[H_NTR]
            TR[n, 0] = pc
            TR[n, 1] = issue
            TR[n, 2] = unit_ready - t
            TR[n, 3] = issue - unit_ready
            I[H_NTR] = n + 1
        if C[pc, C_GLOBAL]:
            I[H_ISSUE] = issue
            code = EXIT_GLOBAL
            break
        if issue > limit:
            fault(E, E_MAX_CYCLES, limit, issue, 0, 0)
            code = EXIT_FAULT
            break
        if count >= budget:
            fault(E, E_MAX_INSTRUCTIONS, I[H_IMAX], 0, 0, 0)
            code = EXIT_FAULT
            break
        occ = C[pc, C_OCC]
        UFREE[u] = issue + occ
        BUSY[u] += occ
        done = issue + C[pc, C_LAT]
        for j in range(C[pc, C_NDST]):
            READY[C[pc, C_DST + j]] = done
        t = issue + (1 if occ else 0)
        count += 1
        nxt = -1
        err = 0
        if C[pc, C_RREG] > 0:
            v = S[C[pc, C_RREG] - 1]
            if v < C[pc, C_RLO] or v >= C[pc, C_RHI]:
                fault(E, E_RANGE, v, C[pc, C_RLO], C[pc, C_RHI], 0)
                t = issue       # (a fault is named by the cycle its instruction issued)
                code = EXIT_FAULT
                break
        x_id = C[pc, C_XID]
'''

_EPILOGUE = '''
        if err:
            t = issue           # (a fault is named by the cycle its instruction issued)
            code = EXIT_FAULT
            break
        pc = pc + 1 if nxt < 0 else nxt
    I[H_PC] = pc
    I[H_T] = t
    I[H_COUNT] += count
    I[H_STALL_UNIT] += stall_unit
    I[H_STALL_DEP] += stall_dep
    I[H_EXIT] = code
    return code
'''


# The footprint tests the machine runs outside the loop, and the launch reset: the
# functions of a generated module of their own, compiled apart from the loop (numba
# keeps a function's compiled code next to the file that defines it: here, the user
# cache, never the source tree).
_MACHINE_SIDE = '''

@njit("boolean(" + ", ".join(["int64"] * 12) + ")", cache=True, nogil=True)
def overlap(a_addr, a_inner, a_n1, a_s1, a_n2, a_s2, b_addr, b_inner, b_n1, b_s1, b_n2, b_s2):
    return blocks_overlap(a_addr, a_inner, a_n1, a_s1, a_n2, a_s2, b_addr, b_inner, b_n1, b_s1, b_n2, b_s2)


_SCAN = "int64(int64[:, ::1], int64, int64, int64, boolean, int64, int64, int64, int64, int64, int64)"


@njit(_SCAN, cache=True, nogil=True)
def logged_conflict(LOG, n, since, space, dma_writes, addr, inner, n1, s1, n2, s2):
    return first_logged_conflict(LOG, n, since, space, dma_writes, addr, inner, n1, s1, n2, s2)


@njit(_SCAN, cache=True, nogil=True)
def dma_conflict(RACES, n, start, space, write, addr, inner, n1, s1, n2, s2):
    return first_conflict_in_flight(RACES, n, start, space, write, addr, inner, n1, s1, n2, s2)


# (Typed, so it is compiled when the module is first imported; the SMEM image and
# argument block are read-only arrays, shared by every core.)
_BYTES_RO = types.Array(types.uint8, 1, "C", readonly=True)
_RESET = types.void(types.int64[::1], types.uint8[::1], types.uint8[::1], types.int64[::1],
                    types.uint32[:, ::1], types.uint8[:, ::1], types.uint32[:, :, ::1], types.uint32[:, :, :, ::1],
                    types.int64[::1], types.int64[::1], types.int64[::1], types.int64[:, ::1], _BYTES_RO, _BYTES_RO,
                    types.boolean, types.int64, types.int64, types.int64, types.int64, types.int64)


@njit(_RESET, cache=True, nogil=True)
def launch_reset(I, VMEM, SMEM, SPAN, V, M, MXL, MXA, VD, MD, LHSD, ACCD, IMAGE, ARGS, clear_vector,
                 limit, max_instructions, flags, nregions, t):
    """A core's state for a kernel launch (`Core.start`): the VMEM and SMEM bytes the last
    launch wrote, its header but the run's counters, registers and scoreboard, the mask
    registers MD and (unless clear_vector is false) the vector registers VD and the
    matrix units' LHS buffers LHSD and accumulators ACCD (unit, accumulator) it may have
    written, all zeroed; then the SMEM image and the argument block, and the launch's
    guards, flags and start cycle."""
    lo = I[H_DIRTY]
    hi = I[H_DIRTY + 1]
    if hi > lo:
        # (Zeroed in place, not handed back to the OS: re-faulting the pages costs more.)
        VMEM[max(lo, 0):max(hi, 0)] = 0
        SPAN[0] = min(SPAN[0], lo)
        SPAN[1] = max(SPAN[1], hi)
    lo = I[H_SDIRTY]
    hi = I[H_SDIRTY + 1]
    if hi > lo:
        SMEM[max(lo, 0):max(hi, 0)] = 0
    I[:H_COUNT] = 0
    I[H_STALL_DEP + 1:H_O_S] = 0
    I[I[H_O_S]:I[H_O_BUSY]] = 0
    mr = I[H_O_MR]
    I[mr:] = 0
    I[mr] = ROWS        # m0: every lane
    I[mr + 1] = LANES
    for r in MD:
        M[r, :] = 0
    if clear_vector:
        for r in VD:
            V[r, :] = 0
        for x in LHSD:
            MXL[x] = 0
        for k in range(ACCD.shape[0]):
            MXA[ACCD[k, 0], ACCD[k, 1]] = 0
    SMEM[:IMAGE.size] = IMAGE
    SMEM[:ARGS.size] = ARGS
    I[H_DIRTY] = 1 << 62         # nothing written yet but the SMEM image and the arguments
    I[H_DIRTY + 1] = -(1 << 62)
    I[H_SDIRTY] = 0
    I[H_SDIRTY + 1] = max(IMAGE.size, ARGS.size)
    I[H_LIMIT] = limit
    I[H_ILIMIT] = I[H_COUNT] + max_instructions
    I[H_IMAX] = max_instructions
    I[H_FLAGS] = flags
    I[H_NREGNAMES] = nregions
    I[H_T] = t
'''


def _constants() -> dict:
    """The constants the generated modules name: fault codes, header slots, flags, the
    decoded code's columns."""
    consts = {name: value for name, value in vars(semantics).items()
              if name.startswith("E_") or name in ("TILE", "ROWS", "LANES")}
    consts.update({name: value for name, value in globals().items()
                   if name.startswith(("H_", "EXIT_", "FLAG_", "E_"))})
    consts.update({name: getattr(dec, name) for name in ("C_UNIT", "C_NSRC", "C_SRC", "C_GLOBAL",
                                                         "C_OCC", "C_LAT", "C_NDST", "C_DST", "C_XID",
                                                         "C_NBOUND", "C_BOUND", "C_RREG", "C_RLO",
                                                         "C_RHI")})
    return consts


@functools.cache
def generate_source() -> str:
    """The loop module's source text, derived from the table and the helpers."""
    consts = _constants()
    readers = [n for n, instr in enumerate(dec.LOCAL_ROWS) if instr.reads_back]
    assert len(readers) == 1, "the loop's readback queue serves one reading row"
    consts["XID_READBACK"] = readers[0]
    head = _head("from the instruction table", "from numba import njit",
                 f"from mkemu.isa.semantics import {', '.join(_HELPERS)}",
                 f"from mkemu.emulator.loop import {', '.join(fn.__name__ for fn in _SUPPORT)}", consts=consts)
    ids = list(range(len(dec.LOCAL_ROWS))) + [dec.ILLEGAL_XID]
    return head + f"SIGNATURE = {SIGNATURE!r}\n" + _PROLOGUE + _dispatch(ids, 2) + "\n" + _EPILOGUE


def generate_machine_source() -> str:
    """The source of the module of functions the machine itself calls (`compiled`)."""
    return _head("", "from numba import njit, types",
                 "from mkemu.emulator.loop import first_logged_conflict, first_conflict_in_flight") + _MACHINE_SIDE


def _head(made_from: str, *imports: str, consts: dict | None = None) -> str:
    """The opening of a generated module: its imports and the constants it names."""
    lines = [f"# Generated by mkemu.emulator.loop{' ' + made_from if made_from else ''}: do not edit.",
             "import numpy as np", *imports, ""]
    lines += [f"{name} = {value!r}" for name, value in sorted((consts or _constants()).items())]
    lines.append("from mkemu.emulator.footprint import block_span, blocks_overlap")
    return "\n".join(lines) + "\n"


_compiled = None
_machine = None
_loading: threading.Thread | None = None   # `load_ahead`'s thread
compile_seconds = 0.0   # wall time the last `compiled_loop()` spent loading or compiling


@functools.cache
def _depends() -> tuple[str, ...]:
    import numba

    return (inspect.getsource(semantics), inspect.getsource(sys.modules[__name__]),
            inspect.getsource(footprint), numba.__version__, sys.version)


def compiled_loop():
    """The loop function, generated, written and compiled (or loaded from cache) once
    per process. Compiling it the first time, the machine's other compiled code (its
    own functions and the flow model) is compiled alongside in a child process
    (`emulator/warm.py`), so a first run waits for the longest of them, not their sum."""
    global _compiled, compile_seconds
    if _compiled is None:
        t0 = time.perf_counter()
        _compiled = module_in_cache("mkemu_loop", generate_source(), *_depends(), while_compiling=alongside,
                                    announce="compiling the issue loop, once per version and machine (about a minute)")
        compile_seconds = time.perf_counter() - t0
    return _compiled.run


def load_ahead() -> None:
    """Start loading the loop on a thread of its own, if this machine compiled it before
    and no thread has it yet. Loading it takes a few tenths of a second, most of them
    in LLVM, without Python's lock: a machine that calls this as it is built gets
    its inputs written meanwhile and finds the loop loaded (or waits for the rest) at
    its first launch. A loop never compiled here is left to `compiled_loop()` (which
    says it is compiling and compiles the machine's other code alongside); a load that
    fails is left to it too, to report."""
    global _loading
    if _compiled is not None or _loading is not None or not compiled_in_cache("mkemu_loop", generate_source(),
                                                                               *_depends()):
        return
    _loading = threading.Thread(target=_load_quietly, name="mkemu-loop-load", daemon=True)
    _loading.start()
    # An interpreter that shuts down (an early error, a script's end) while the thread
    # is inside LLVM can crash (assertions in LLVM's teardown): it waits for the load.
    atexit.register(loaded)


def loaded() -> None:
    """Wait for `load_ahead`'s thread, if one is loading the loop (and this is not it)."""
    if _loading is not None and _loading is not threading.current_thread():
        _loading.join()


def _before_fork() -> None:
    """A fork copies the locks the loading thread holds (the module's import lock,
    numba's compiler lock) as held, but not the thread: the child's first launch waited
    for them forever. So a fork waits for the load, unless the forking thread holds
    numba's compiler lock itself (the K3 reference's child is forked so, to have it): the
    loading thread, which needs that lock, would then wait for the fork."""
    if _loading is not None and _loading.is_alive():
        from numba.core.compiler_lock import global_compiler_lock

        if not global_compiler_lock.is_locked():
            loaded()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork)


def _load_quietly() -> None:
    try:
        compiled_loop()
    except Exception:   # (the machine's own call loads it again and reports what fails)
        pass


def compiled_machine():
    """The module of the functions the machine calls outside the loop, compiled (or
    loaded from cache) once per process."""
    global _machine
    if _machine is None:
        _machine = module_in_cache("mkemu_machine", generate_machine_source(), *_depends())
    return _machine


def compiled(name: str):
    """A function compiled for the machine's own use (`overlap`, `logged_conflict`,
    `dma_conflict`, `launch_reset`)."""
    return getattr(compiled_machine(), name)
