"""One TensorCore: its state as numpy arrays, and running it through the compiled loop.

The core runs ahead of the machine's clock on its own: an instruction issues at
the first cycle where the previous one has issued, its unit is free and its
source registers are ready; it then occupies its unit for `occupancy` cycles and
its results are ready `latency` cycles later. Local instructions execute at once,
in program order, in the compiled loop (`loop.py`). When the core meets an
instruction that touches other cores or the DMA engines (a global row), it stops
and reports that instruction's issue time; the machine executes it when global
time gets there. Waiting therefore costs no wall time: nothing steps through idle
cycles.

All state lives in a few arrays the loop takes: `I` (int64: pc, cycle, counters,
scalar registers, the scoreboard, unit-free times, special registers, mask
rectangles, fault details), `V` (vector registers as raw 32-bit words), `M`
(masks), `VMEM`, `SMEM`, the matrix units' weight, LHS and accumulator arrays, and
the region stack. They are allocated once per machine; a launch clears only what
the previous one touched.
"""

from __future__ import annotations

import functools
import weakref

import numpy as np

from mkemu.emulator import loop as lp
from mkemu.emulator.config import GLOBAL_SHARE, global_budget
from mkemu.emulator.footprint import block_span
from mkemu.emulator.decode import C_ARG, DecodedKernel, Op, scoreboard_size, unit_names
from mkemu.emulator.memory import Trap, give_back, reused
from mkemu.emulator.safety import describe_dma, listed_in
from mkemu.errors import EmulatorFault
from mkemu.isa.encoding import SPECIAL_REGS, TARGET
from mkemu.isa.hardware import HardwareProfile
from mkemu.isa.program import Kernel
from mkemu.isa.semantics import _FAR, E_OOB, FAULTS, LANES, ROWS

TRACE_ROWS = 1 << 16       # instruction rows per trace buffer before the loop hands them over
TRACE_REGION_ROWS = 1 << 12
RACE_SLOTS = 64            # DMAs in flight a core's race check sees at once (grown on demand)
LOG_ROWS = 1 << 12         # accesses logged before the loop hands them over (`Core.run_local`)
# A timing-only run computes nothing: what control reads back (a scalar, or bytes a DMA
# moves into SMEM or an i32 buffer) must come from a driver.
UNSUPPLIED = ("a timing-only run computes nothing, so a program whose control depends on computed values "
              "needs a driver that supplies them, as the K3 programs' driver supplies the router's choices "
              "(docs/k3.md; in the API, `Session.feed_readbacks` and `Session.feed_payloads`); run this "
              "program as a data run")


@functools.lru_cache(maxsize=256)
def _argument_block(args: tuple[int, ...]) -> np.ndarray:
    """The SMEM bytes of a launch's arguments (the same for every core of the launch)."""
    block = np.array([v & 0xFFFFFFFF for v in args], np.uint32).view(np.uint8)
    block.flags.writeable = False
    return block


class Core:
    def __init__(self, profile: HardwareProfile, chip: int, index: int, gid: int):
        p = profile
        self.profile = profile
        self.chip, self.index, self.gid = chip, index, gid
        self.units = unit_names(p)
        nready = scoreboard_size(p)
        o = lp.layout(p.sregs, nready, len(self.units), p.mregs, p.mxus_per_core)
        self.I = np.zeros(o["size"], np.int64)
        header = {lp.H_O_S: o["S"], lp.H_O_READY: o["READY"], lp.H_O_UFREE: o["UFREE"],
                  lp.H_O_BUSY: o["BUSY"], lp.H_O_SPEC: o["SPEC"], lp.H_O_MR: o["MR"],
                  lp.H_O_MXR: o["MXR"], lp.H_NSREG: p.sregs, lp.H_NREADY: nready,
                  lp.H_NUNITS: len(self.units), lp.H_NMREG: p.mregs, lp.H_NMXU: p.mxus_per_core,
                  lp.H_MXD: p.mxu_dim}
        for at, value in header.items():
            self.I[at] = value
        self.S = self.I[o["S"]:o["S"] + p.sregs]
        self.ready = self.I[o["READY"]:o["READY"] + nready]
        self.unit_free = self.I[o["UFREE"]:o["UFREE"] + len(self.units)]
        self.unit_busy = self.I[o["BUSY"]:o["BUSY"] + len(self.units)]
        self.spec = self.I[o["SPEC"]:o["SPEC"] + 16]
        self.V = np.zeros((p.vregs, ROWS * LANES), np.uint32)
        self.M = np.zeros((p.mregs, ROWS * LANES), np.uint8)
        self.M[0] = 1      # m0: every lane, read-only
        self.vmem = reused(p.vmem_bytes)
        self.vmem_span = np.array([1 << 62, -(1 << 62)], np.int64)   # the bytes of VMEM any launch wrote, over all launches
        weakref.finalize(self, _give_back_vmem, self.vmem, self.I, self.vmem_span).atexit = False
        self.smem = np.zeros(p.smem_bytes, np.uint8)
        self.smem32 = self.smem.view(np.int32)     # its words (DMA descriptors, launch arguments)
        d = p.mxu_dim
        self.mx_w = np.zeros((p.mxus_per_core, d, d), np.uint16)   # bf16 bits
        self.mx_lhs = np.zeros((p.mxus_per_core, ROWS, d), np.uint32)
        self.mx_acc = np.zeros((p.mxus_per_core, p.mxu_accumulators, ROWS, d), np.uint32)
        self.rstack = np.zeros((lp.REGION_DEPTH, 5), np.int64)   # region, index, start, pc, nested time
        self.rstat = np.zeros((1, 3), np.int64)                  # cycles, times left, cycles not nested
        self.races = np.zeros((RACE_SLOTS, 10), np.int64)
        self.access_log = np.zeros((LOG_ROWS, 9), np.int64)
        self.readback = np.zeros(64, np.int64)   # values read back into scalars: queued or recorded
        self.readbacks_fed = False   # has a driver queued any (`feed_readbacks`)?
        self.v_dirty = np.zeros(0, np.int64)   # vector registers a launch may have written
        self.m_dirty = np.zeros(0, np.int64)   # ... mask registers
        self.lhs_dirty = np.zeros(0, np.int64)  # ... matrix units' LHS buffers
        self.acc_dirty = np.zeros((0, 2), np.int64)   # ... and accumulators (unit, accumulator)
        self.trace_rows = np.zeros((1, 4), np.int64)
        self.trace_regions = np.zeros((2, 7), np.int64)
        self.trace = None        # set by a trace recorder: its sink for this core, or None
        self.kernel: Kernel | None = None
        self.decoded: DecodedKernel | None = None
        self.code = np.zeros((0, C_ARG + 8), np.int64)
        self.sems = [0] * p.semaphores
        self.sync_stalls = {"semaphore": 0, "barrier": 0}
        self.dma_wait_cycles: dict[int, int] = {}       # innermost region id (-1: none) -> cycles
        self.clear_in_flight()      # the DMAs in flight for this core, for race checks
        self.halted = True
        self._loop = None          # the compiled loop, taken at the first launch (`loop.load_ahead`)
        self._reset = lp.compiled("launch_reset")

    # -- views for the machine, the trace recorder and tests -----------------

    @property
    def s(self) -> list[int]:
        """The scalar registers as Python ints."""
        return self.S.tolist()

    @property
    def vu(self) -> np.ndarray:
        return self.V.reshape(-1, ROWS, LANES)

    @property
    def vf(self) -> np.ndarray:
        return self.V.view(np.float32).reshape(-1, ROWS, LANES)

    @property
    def vi(self) -> np.ndarray:
        return self.V.view(np.int32).reshape(-1, ROWS, LANES)

    @property
    def m(self) -> np.ndarray:
        return self.M.view(bool).reshape(-1, ROWS, LANES)

    @property
    def pc(self) -> int:
        return int(self.I[lp.H_PC])

    @pc.setter
    def pc(self, value: int) -> None:
        self.I[lp.H_PC] = value

    @property
    def t(self) -> int:
        return int(self.I[lp.H_T])

    @t.setter
    def t(self, value: int) -> None:
        self.I[lp.H_T] = value

    @property
    def instructions(self) -> int:
        return int(self.I[lp.H_COUNT])

    @property
    def stalls(self) -> dict[str, int]:
        return {"unit": int(self.I[lp.H_STALL_UNIT]), "dependency": int(self.I[lp.H_STALL_DEP]),
                **self.sync_stalls}

    def set_special(self, values: dict[str, int]) -> None:
        """The special registers' values (core, chip, mesh coordinates and sizes: set by
        the machine once; no instruction writes them and a launch keeps them)."""
        self.spec[:len(SPECIAL_REGS)] = [values[name] for name in SPECIAL_REGS]

    def innermost_region(self) -> int:
        depth = self.I[lp.H_RDEPTH]
        return int(self.rstack[depth - 1, 0]) if depth else -1

    def open_regions(self) -> list[tuple[int, int, int, int]]:
        """(region id, index, start cycle, pc) of the regions entered and not left."""
        return [tuple(int(v) for v in row[:4]) for row in self.rstack[:self.I[lp.H_RDEPTH]]]

    def close_open_regions(self, t: int) -> None:
        """The regions still open when the core halted, at cycle t, end there, innermost
        first, as `mark.pop`s would (and as the trace closes them): their time goes into
        this launch's `region_stats`. The stack itself is left for the trace recorder."""
        carried = 0      # (the time of the open region nested in the next one out)
        for d in range(int(self.I[lp.H_RDEPTH]) - 1, -1, -1):
            rid, _, start, _, nested = self.rstack[d].tolist()
            spent = t - start
            stat = self.rstat[rid]
            stat[0] += spent
            stat[1] += 1
            stat[2] += spent - nested - carried
            carried = spent

    def region_stats(self) -> dict[int, tuple[int, int, int]]:
        """region id -> (cycles spent inside, times left, cycles inside but not in a
        region nested in it) in this launch."""
        stat = self.rstat
        if stat.shape[0] <= 64:      # (the common table: a few ids, read as one list)
            return {rid: tuple(row) for rid, row in enumerate(stat.tolist()) if row[1]}
        # (Only the rows of regions left: a kernel may name region ids up to 2^24 - 1.)
        rids = np.flatnonzero(stat[:, 1])
        return dict(zip(rids.tolist(), map(tuple, stat[rids].tolist())))

    # -- launches ------------------------------------------------------------

    def start(self, kernel: Kernel, decoded: DecodedKernel, args: tuple[int, ...], t: int,
              limit: int, max_instructions: int, flags: int) -> None:
        """Fresh state for a kernel launch: kernels see nothing of each other's memories.
        Counters (instructions, unit busy and stall cycles) carry over: they are the run's."""
        # Cleared where the earlier launch's kernel could have written (a timing-only run
        # never writes the vector registers or matrix units: vector-side rows compute
        # nothing). A weight tile needs no clearing: `mxu.mac` faults before the launch
        # loads one, and a load writes every column of the rows it loads, the only rows a
        # product reads. (Compiled: a launch runs this for every core.)
        if self._loop is None:
            self._loop = lp.compiled_loop()
        clear_vector = not flags & lp.FLAG_TIMING_ONLY
        self._reset(self.I, self.vmem, self.smem, self.vmem_span, self.V, self.M, self.mx_lhs, self.mx_acc,
                    self.v_dirty, self.m_dirty, self.lhs_dirty, self.acc_dirty, decoded.smem_image,
                    _argument_block(args), clear_vector, limit, max_instructions,
                    (lp.FLAG_TRACE if self.trace is not None else 0) | flags, len(kernel.regions), t)
        self.m_dirty = decoded.mregs_written
        if clear_vector:
            self.v_dirty, self.lhs_dirty, self.acc_dirty = (decoded.vregs_written, decoded.lhs_written,
                                                            decoded.acc_written)
        self.globals_left = global_budget(max_instructions)   # (retire counts them down)
        self.kernel = kernel
        self.decoded = decoded
        self.code = decoded.code
        if self.rstat.shape[0] < decoded.region_slots or self.rstat.shape[0] > 1 << 16:
            # (A region id may be up to 2^24 - 1: a fresh array of that many rows costs
            # nothing until touched, where clearing one would write all of it.)
            self.rstat = np.zeros((decoded.region_slots, 3), np.int64)
        else:
            self.rstat[:] = 0
        self.sems = [0] * self.profile.semaphores
        self.dma_wait_cycles = {}
        self.sem_raisers: dict[int, tuple] = {}   # semaphore -> ((chip, core), pc, text, cycle)
        self.log_paused = False    # the next `run_local` goes on with this run-ahead's log
        self.halted = False

    # -- the issue loop ------------------------------------------------------

    def run_local(self) -> tuple[Op | None, int]:
        """Run until the next global instruction; return it and its issue time. The
        accesses of this run-ahead are logged (for races found after the fact). When the
        log is full, the core pauses instead: (None, its clock), for the machine to catch
        up with it and drop what no DMA issued from then on can race with
        (`drop_logged_before`); the next call goes on with the same run-ahead. So the log
        stays small however long a core runs without a global instruction."""
        if self.log_paused:
            self.log_paused = False
        else:
            self.I[lp.H_NLOG] = 0
        while True:
            code = self._loop(self.code, self.I, self.V, self.M, self.vmem, self.smem, self.mx_w,
                              self.mx_lhs, self.mx_acc, self.rstack, self.rstat, self.races,
                              self.access_log, self.readback, self.trace_rows, self.trace_regions)
            if self.trace is not None:
                self.trace.drain(self, force=code == lp.EXIT_FAULT)
            if code == lp.EXIT_GLOBAL:
                return self.decoded.ops[self.I[lp.H_PC]], int(self.I[lp.H_ISSUE])
            if code == lp.EXIT_FAULT:
                raise self._trap()
            if code == lp.EXIT_LOG_FULL:
                self.log_paused = True
                return None, int(self.I[lp.H_T])
            if code == lp.EXIT_READBACK:
                if self.I[lp.H_FLAGS] & lp.FLAG_TIMING_ONLY:
                    n = int(self.I[lp.H_RB_N])
                    if not self.readbacks_fed:
                        raise Trap("readback", "this timing-only run reads a computed value back into a scalar, "
                                               f"and nothing supplies it: {UNSUPPLIED}")
                    raise Trap("readback", f"this timing-only run reads back value {n + 1} into a scalar, but "
                                           f"only {n} were supplied (the router's choices: see docs/k3.md, "
                                           "timing-only runs)")
                self.readback = np.concatenate([self.readback, np.zeros_like(self.readback)])

    def drop_logged_before(self, now: int) -> None:
        """The machine's clock reached `now`: a DMA from now on is issued at `now` or
        later, so the logged accesses before it can race with none (`Safety`). Drops
        them; grows the log if what is left still fills half of it."""
        log, n = self.access_log, int(self.I[lp.H_NLOG])
        keep = np.flatnonzero(log[:n, 0] >= now)
        log[:keep.size] = log[keep]
        self.I[lp.H_NLOG] = keep.size
        if 2 * keep.size >= log.shape[0]:
            self.access_log = np.concatenate([log, np.zeros_like(log)])

    def retire(self, op: Op, issue: int) -> None:
        """Book the unit and the results of global `op` issued at `issue`."""
        occupancy = op.occupancy
        self.unit_free[op.unit] = issue + occupancy
        self.unit_busy[op.unit] += occupancy
        if op.dsts:
            done = issue + op.latency
            for slot in op.dsts:
                self.ready[slot] = done
        I = self.I
        I[lp.H_T] = issue + (1 if occupancy else 0)
        I[lp.H_COUNT] += 1
        self.globals_left -= 1
        if self.globals_left < 0 and op.global_kind != "halt":
            raise self._global_budget_trap()

    def _global_budget_trap(self) -> Trap:
        """The runaway guard for global instructions (emulator/config.py, GLOBAL_SHARE)."""
        most = int(self.I[lp.H_IMAX])
        return Trap("max-instructions",
                    f"this core ran {global_budget(most):,} global instructions (DMA starts, semaphore waits "
                    "and signals, barriers) in one launch without reaching a halt (a loop that never ends?); "
                    f"a core may run one global instruction per {GLOBAL_SHARE} of --max-instructions "
                    f"({most:,} here), as each costs the wall time of about a thousand local ones; raise "
                    "--max-instructions if the kernel really needs more" + self._loop_note())

    def _loop_note(self) -> str:
        """Where a runaway core is: the innermost loop holding its pc (the backward
        branch at or after it whose target is at or before it), by that branch's source
        line (a `.mk` loop's header), or by pcs where there is none."""
        pc, ops, best = self.pc, self.decoded.ops, None
        for b in range(pc, len(ops)):
            instr = ops[b].instr
            if instr is None:
                continue
            for k, operand in enumerate(instr.operands):
                if operand.kind is TARGET and ops[b].args[k] <= pc and (best is None or ops[b].args[k] > best[1]):
                    best = (b, ops[b].args[k])
        if best is None:
            return ""
        source = self.kernel.source_line(best[0])
        return f"; the loop it is in: {source or f'pc {best[1]:#06x} to {best[0]:#06x}'}"

    def _trap(self) -> Trap:
        code, a, b, c, d = (int(v) for v in self.I[lp.H_E:lp.H_E + 5])
        if code == lp.E_RAN_OFF:
            return Trap("ran-off-end", f"pc {a} is past the end of the kernel ({b} instructions); "
                                       "a kernel must end with halt")
        if code == lp.E_MAX_CYCLES:   # (at the cycle the instruction would issue, past the guard)
            return Trap("max-cycles", max_cycles_message(a, self.profile), cycle=b)
        if code == lp.E_MAX_INSTRUCTIONS:
            return Trap("max-instructions", f"this core ran {a:,} instructions in one launch without reaching "
                                            "a halt (a loop that never ends?); raise the limit with "
                                            "--max-instructions if the kernel really needs more" + self._loop_note())
        if code == lp.E_RACE:
            return self.race_trap(a, b, c, writes=bool(d))
        if code == lp.E_BUFFER:
            return Trap("out-of-bounds", self.kernel.extents[self.pc][c].describe(a, b))
        if code == lp.E_RANGE:
            return Trap(self.kernel.ranges[self.pc].kind, self.kernel.ranges[self.pc].message(a, b, c))
        kind, template = FAULTS[code]
        op = self.decoded.ops[self.pc]
        mnemonic = op.instr.mnemonic if op.instr is not None else ""
        note = ""
        if code == E_OOB and max(abs(a), abs(b)) >= _FAR:
            # (a span reaching past +-2^62, from a 64-bit address or stride, is cut there)
            a, b = (("-2^62" if v < 0 else "2^62") if abs(v) >= _FAR else v for v in (a, b))
            note = " (the span reaches past 2^62, from a 64-bit address or stride: its ends are shown cut there)"
        return Trap(kind, template.format(a=a, b=b, c=c, d=d, name="VMEM", problem=op.problem,
                                          op=mnemonic.rstrip("i")) + note)

    # -- values read back into scalars (timing-only runs take them from here) ------

    def feed_readbacks(self, values) -> None:
        """Queue the values this core's reads back will take (a timing-only run)."""
        values = np.asarray(values, np.int64)
        self.readback = np.concatenate([values, np.zeros(64, np.int64)])
        self.readbacks_fed = True
        self.I[lp.H_RB_N], self.I[lp.H_RB_I] = len(values), 0

    def take_readbacks(self) -> np.ndarray:
        """The values this core read back since the last call (a recording run)."""
        n = int(self.I[lp.H_RB_N])
        out = self.readback[:n].copy()
        self.I[lp.H_RB_N] = 0
        return out

    # -- DMAs in flight, as the loop's race check sees them ----------------------

    def clear_in_flight(self) -> None:
        self.in_flight: list = []  # (safety.Entry, space), or None: a dropped entry's row not yet compacted
        self.rows_of: dict[int, list[int]] = {}   # ... DMA seq -> the rows of its live entries
        self.dead_in_flight = 0    # ... how many are None
        self.live_from = 0         # ... rows before this one are all None (DMAs mostly land oldest first)
        self.smem_writes = 0       # ... live entries of DMAs writing SMEM (a descriptor read checks them)
        self.I[lp.H_NRACE] = 0
        self.I[lp.H_RACE_FROM] = 0    # (the loop's scans start at live_from too)

    def add_in_flight(self, entry, space: str) -> None:
        """A DMA in flight for this core touches its `space` ("vmem" or "smem"): the
        loop checks each access against it (any access if it writes, a write if it reads)."""
        n = len(self.in_flight)
        self.in_flight.append((entry, space))
        self.rows_of.setdefault(entry.dma.seq, []).append(n)
        if n >= self.races.shape[0]:
            self.races = np.concatenate([self.races, np.zeros_like(self.races)])
        smem = space != "vmem"
        self.races[n] = (entry.lo, entry.hi, 0 if entry.write else 1, smem, *entry.block)
        if smem and entry.write:
            self.smem_writes += 1
        self.I[lp.H_NRACE] = n + 1

    def drop_in_flight(self, landed: int, base: int) -> list[tuple[int, int]]:
        """Drop the entries of the DMAs in mask `landed` (bit seq - base: this core now
        knows they landed); (seq, how many entries it had here) for each DMA dropped.

        A dropped entry leaves a dead row (space -1: no scan matches it) in place, so
        the rows need not move at every drop; once dead rows are at least 16 and as
        many as the live ones, the live rows move up, in order. Scans start at the
        first live row (DMAs mostly land oldest first, leaving dead rows in front)."""
        in_flight, races, rows_of = self.in_flight, self.races, self.rows_of
        seqs = listed_in(landed, base, rows_of)
        if not seqs:
            return []
        dead = self.dead_in_flight
        dropped = []
        for seq in seqs:
            rows = rows_of.pop(seq)
            for k in rows:
                entry, space = in_flight[k]
                if space != "vmem" and entry.write:
                    self.smem_writes -= 1
                in_flight[k] = None
                races[k, 3] = -1
            dead += len(rows)
            dropped.append((seq, len(rows)))
        if dead == len(in_flight):
            self.clear_in_flight()
            return dropped
        start = self.live_from
        if dead >= 16 and 2 * dead >= len(in_flight):
            rows = [k for k in range(start, len(in_flight)) if in_flight[k] is not None]
            self.in_flight = [in_flight[k] for k in rows]
            races[:len(rows)] = races[rows]
            self.rows_of = {}
            for k, (entry, _) in enumerate(self.in_flight):
                self.rows_of.setdefault(entry.dma.seq, []).append(k)
            self.I[lp.H_NRACE] = len(rows)
            dead = start = 0
        else:
            while in_flight[start] is None:     # (a live row remains: dead < len)
                start += 1
        self.dead_in_flight = dead
        self.live_from = start
        self.I[lp.H_RACE_FROM] = start
        return dropped

    def race_trap(self, k: int, lo: int, hi: int, access: str = "this access to", writes: bool = False) -> Trap:
        entry, space = self.in_flight[k]
        what = (f"{'writes' if writes else 'reads'} the destination of a DMA that has not been waited for"
                if entry.write else "overwrites the source of a DMA still in flight")
        where = f"{space.upper()} [{lo}, {hi}){self._buffer_at(self.pc, space, lo, hi)}"
        if entry.dma.src_core is not self:
            return Trap("race", f"{access} {where} {what}, a DMA into it from another "
                                f"core: {describe_dma(entry.dma)}; nothing ordered the access and the DMA (a "
                                "semaphore this core waits on, a signal, a barrier)")
        return Trap("race", f"{access} {where} {what}: {describe_dma(entry.dma)}; wait for it first")

    def _buffer_at(self, pc: int, space: str, lo: int, hi: int) -> str:
        """' of buffer NAME' when the compiler named the buffer instruction `pc` accesses
        in `space` (its memory operands' extents) and [lo, hi) lies in it, else ''."""
        for extent in self.kernel.extents.get(pc, ()):
            if extent is not None and extent.space == space and extent.param is None:
                named = self.buffer_named(extent, lo, hi)
                if named:
                    return named
        return ""

    def buffer_named(self, extent, lo: int, hi: int) -> str:
        """' of buffer NAME' if [lo, hi) lies in buffer `extent`, else ''."""
        start = self.extent_start(extent)
        return f" of buffer '{extent.name}'" if start <= lo and hi <= start + extent.size else ""

    def extent_start(self, extent) -> int:
        """Where buffer `extent` starts: an HBM parameter's address is in the launch
        arguments in this core's SMEM."""
        if extent.param is None:
            return extent.lo
        words = self.smem32
        return extent.lo + ((words.item(extent.param) & 0xFFFFFFFF)
                            | (words.item(extent.param + 1) & 0xFFFFFFFF) << 32)

    def logged_race(self, entry, space: str, time: int, pc: int, addr: int, stride: int, rows: int,
                    lo_off: int, hi_off: int, write: int) -> EmulatorFault:
        """A race found after the fact: this core, running ahead, made the access at cycle
        `time`, after another core issued `entry`'s DMA into its memory."""
        lo, hi = block_span(addr + lo_off, hi_off - lo_off, rows, stride, 1, 0)
        what = "writes" if write else "reads"
        return EmulatorFault(
            "race", f"kernel {self.kernel.name}: this access {what} {space.upper()} [{lo}, {hi})"
                    f"{self._buffer_at(pc, space, lo, hi)} while a DMA "
                    f"into it from another core is in flight: {describe_dma(entry.dma)}; nothing ordered "
                    "the access and the DMA (a semaphore this core waits on, a signal, a barrier)",
            chip=self.chip, core=self.index, cycle=time, pc=pc, instruction=self.decoded.ops[pc].text,
            **fault_place(self.kernel, pc))

    def note_write(self, space: str, lo: int, hi: int) -> None:
        """A DMA wrote [lo, hi) of this core's VMEM or SMEM: the next launch clears it."""
        at = lp.H_DIRTY if space == "vmem" else lp.H_SDIRTY
        I = self.I
        if lo < I[at]:
            I[at] = lo
        if hi > I[at + 1]:
            I[at + 1] = hi


def _give_back_vmem(vmem, I, span: np.ndarray) -> None:
    """A core is gone: its VMEM goes back for the next core to reuse (`memory.reused`),
    with the range its last launch wrote (the earlier launches' were zeroed)."""
    lo, hi = int(I[lp.H_DIRTY]), int(I[lp.H_DIRTY + 1])
    give_back(vmem, lo, hi, max(max(int(span[1]), hi) - min(int(span[0]), lo), 0))


def fault_place(kernel: Kernel, pc: int) -> dict[str, str | None]:
    """Where in the source instruction `pc` of `kernel` is, as a fault names it: its
    line (`EmulatorFault.source`) and the calls it was inlined at (`context`)."""
    return {"source": kernel.source_line(pc), "context": kernel.calls_of(pc)}


def max_cycles_message(limit: int, profile: HardwareProfile) -> str:
    message = f"the run passed the max-cycle guard of {limit} cycles"
    if limit < profile.kernel_launch_cycles:
        message += (f" (it counts from the start of the run, and a kernel launch alone takes "
                    f"{profile.kernel_launch_cycles:,} cycles on '{profile.name}')")
    return message
