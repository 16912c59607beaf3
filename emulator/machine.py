"""The machine: chips on a mesh, their cores, DMA engines and links, and the event loop.

One heap of `(cycle, sequence, kind, payload)` events drives everything; the
sequence number makes ties deterministic. Cores run ahead on their own (see
`core.py`) and come back to the heap only for instructions that involve others:
DMA starts, semaphores, barriers and halt. DMAs are flows in a `FlowNetwork` whose
resources are each chip's HBM, each core's DMA engine, each chip's on-chip path
between its cores, and the mesh links; bandwidth is re-divided whenever a flow
starts or ends. Nothing steps through idle cycles.
"""

from __future__ import annotations

import heapq

import attrs
import numpy as np

from mkemu.errors import ConfigError, EmulatorFault
from mkemu.isa.encoding import BARRIER_SCOPES
from mkemu.isa.hardware import HardwareProfile, too_many_cores
from mkemu.isa.program import Program

from mkemu.emulator import loop as lp
from mkemu.emulator.config import RunConfig
from mkemu.emulator.core import Core, fault_place, max_cycles_message
from mkemu.emulator.decode import decode_kernel, unit_names
from mkemu.emulator.dma import DMA_BEGIN, FLOWS, LAND, Dma, DmaMixin
from mkemu.emulator.flows import FAR_CYCLE, FlowNetwork
from mkemu.emulator.hbm import ChipMemories
from mkemu.emulator.memory import Trap
from mkemu.emulator.safety import Safety
from mkemu.emulator.topology import Mesh

RESUME, SIGNAL, FAULT = 0, 3, 5
# Faults that guard the run's wall time rather than report the program's behaviour: raised
# as soon as found (every core of an SPMD program that never ends would otherwise run its
# own instruction budget out first).
GUARDS = ("max-instructions", "max-cycles")
NP_DTYPES = {"bf16": np.uint16, "f32": np.float32, "i32": np.int32, "mxfp4": np.uint8}


@attrs.frozen
class RunResult:
    cycles: int
    seconds: float
    instructions: int
    unit_busy_cycles: dict[str, int]
    hbm_bytes: int
    dma_count: int
    stall_cycles: dict[str, int]
    launch_cycles: tuple[int, ...]
    link_bytes: int
    per_core: tuple[dict, ...]
    region_cycles: dict[str, int]
    region_own_cycles: dict[str, int]
    region_entries: dict[str, int]
    dma_wait_cycles: dict[str, int]
    idle_cycles: int

    def to_json(self) -> dict:
        """As `mkemu run --json` prints it: lists where this holds tuples."""
        out = attrs.asdict(self, recurse=True)
        out.update(launch_cycles=list(self.launch_cycles), per_core=[dict(c) for c in self.per_core])
        return out


class Machine(DmaMixin):
    def __init__(self, profile: HardwareProfile, mesh: Mesh | None = None,
                 config: RunConfig | None = None, trace=None):
        self.profile = profile
        # (a mesh that leaves its link count to the profile, e.g. `Mesh((4, 1, 1))`, takes
        # the profile's: the physical links are the hardware's)
        self.mesh = (mesh or Mesh(profile.mesh_dims, profile.mesh_wrap)).with_links(profile.links_per_neighbor)
        problem = too_many_cores(self.mesh.num_chips, profile.cores_per_chip, f" (profile '{profile.name}')")
        if problem:     # (before any core's memory is allocated)
            raise ConfigError(problem, key="mesh")
        self.config = config or RunConfig()
        p = profile
        lp.compiled_machine()      # (first: loading the loop holds numba's compiler lock, which this takes too)
        lp.load_ahead()
        self.cores: list[Core] = []
        for chip in range(self.mesh.num_chips):
            for index in range(p.cores_per_chip):
                core = Core(p, chip, index, len(self.cores))
                x, y, z = self.mesh.coords(chip)
                core.set_special(dict(core=index, chip=chip, chip_x=x, chip_y=y, chip_z=z,
                                      mesh_x=self.mesh.dims[0], mesh_y=self.mesh.dims[1],
                                      mesh_z=self.mesh.dims[2], cores=p.cores_per_chip,
                                      chips=self.mesh.num_chips, gcore=core.gid))
                self.cores.append(core)
        self.barrier_roots: dict[tuple[int, ...], Core] = {}   # members -> their barrier's root
        self.net = FlowNetwork()
        self.hbm_shared = p.cores_per_chip * p.dma_engine_bw_bytes_per_cycle > p.hbm_bw_bytes_per_cycle
        self.hbm_res = [self.net.add_resource(f"chip{c} HBM", p.hbm_bw_bytes_per_cycle)
                        for c in range(self.mesh.num_chips)]
        self.sibling_res = [self.net.add_resource(f"chip{c} core-to-core", p.sibling_bw_bytes_per_cycle)
                            for c in range(self.mesh.num_chips)]
        self.engine_res = [self.net.add_resource(f"chip{c.chip} core{c.index} DMA engine",
                                                 p.dma_engine_bw_bytes_per_cycle) for c in self.cores]
        self.links = self.mesh.link_resources(self.net, p.link_bw_bytes_per_cycle, p.cores_per_chip,
                                              p.per_core_links)
        self.routes: dict = {}    # (issuer, target, reads HBM, writes HBM) -> `DmaMixin._route`
        self._hbm = ChipMemories(self.mesh.num_chips, 0)
        self.program: Program | None = None
        self.decoded: dict = {}
        self.now = 0
        self.hbm_bytes = 0
        self.link_bytes = 0
        self.dma_count = 0
        self.launch_cycles: list[int] = []
        self.region_cycles: dict[str, int] = {}    # summed over cores
        self.region_own_cycles: dict[str, int] = {}  # ... outside the regions nested in each
        self.region_entries: dict[str, int] = {}   # summed over cores
        self.core_region_entries: list[dict[str, int]] = [{} for _ in self.cores]   # per core
        self.dma_wait_cycles: dict[str, int] = {}  # waits ended by a DMA, by innermost region
        self.idle_cycles = 0                       # halted cores waiting for the launch to end
        # An `emulator.trace.Recorder`, or None: every hook below is one `is not None` test.
        self.trace = trace
        # The shuffle schedule's landing delays: seeded, so a schedule is repeatable. Up to
        # twice the start latency plus the mesh's diameter in hops: enough to move a landing
        # past that of a DMA issued about as early from any chip (pushes from a near and a
        # far chip land in either order).
        self.schedule_rng = np.random.default_rng([self.config.seed, self.config.schedule_seed])
        self.shuffle_cycles = 2 * (p.dma_start_latency_cycles + self.mesh.diameter() * p.hop_latency_cycles)
        # Race checks in simulated time (`safety.py`), or None with --no-check races.
        races = "races" in self.config.checks and not self.config.timing_only
        self.safety = Safety(self.cores) if races else None

    # -- loading and data ----------------------------------------------------

    def load(self, program: Program) -> None:
        self.program = program
        if self.trace is not None:
            self.trace.attach(self)
        self.decoded = {name: decode_kernel(kernel, self.profile) for name, kernel in program.kernels.items()}
        if program.hbm_bytes > self.profile.hbm_bytes:
            largest = sorted(program.buffers, key=lambda b: -b.size_bytes)[:3]
            names = ", ".join(f"'{b.name}' {b.dtype}[{', '.join(map(str, b.shape))}] {b.size_bytes:,} bytes"
                              + (f" (declared at {b.declared})" if b.declared else "") for b in largest)
            raise EmulatorFault("out-of-memory", f"the program's HBM buffers take {program.hbm_bytes:,} bytes, "
                                                 f"the chip has {self.profile.hbm_bytes:,} (profile "
                                                 f"'{self.profile.name}'); the largest: {names}")
        # Initial SMEM words and launch arguments must fit the core's SMEM (the assembler
        # checks them when it is told the profile's size; a program assembled without it,
        # or built by hand, is checked here rather than failing while a launch starts).
        smem = self.profile.smem_bytes
        for kernel in program.kernels.values():
            if len(kernel.smem_init) > smem:
                raise EmulatorFault("out-of-bounds", f"kernel {kernel.name}: its initial SMEM words reach byte "
                                                     f"{len(kernel.smem_init):,}, past SMEM of {smem:,} bytes "
                                                     f"(profile '{self.profile.name}')")
        for launch in program.launches:
            if 4 * len(launch.args) > smem:
                raise EmulatorFault("out-of-bounds", f"a launch of kernel {launch.kernel} has {len(launch.args)} "
                                                     f"arguments ({4 * len(launch.args):,} bytes), past SMEM of "
                                                     f"{smem:,} bytes (profile '{self.profile.name}')")
        # What holds data in a timing-only run besides SMEM: the i32 HBM buffers.
        self.data_regions = [(b.offset_bytes, b.offset_bytes + b.size_bytes)
                             for b in program.buffers if b.dtype == "i32"]
        self._hbm = ChipMemories(self.mesh.num_chips, program.hbm_bytes,
                                 self.data_regions if self.config.timing_only else None)
        # Computed bytes DMAs moved into SMEM or i32 buffers: kept by a recording data
        # run, taken by a timing-only run (per issuing core, in issue order).
        self.payloads_out: list[list[bytes]] = [[] for _ in self.cores]
        self.payloads_in: list[list[bytes]] = [[] for _ in self.cores]
        self.payloads_fed = False   # has a driver supplied any (`Session.feed_payloads`)?

    @property
    def hbm(self) -> list[np.ndarray]:
        """Each chip's HBM as a byte array (not in a timing-only run: see `read_buffer`)."""
        return self._hbm.arrays

    def _buffer_data(self, name: str, array: np.ndarray):
        buf = self.program.buffer(name)
        data = np.asarray(array, dtype=NP_DTYPES[buf.dtype])
        buf.check_storage_shape(data.shape)   # (before ascontiguousarray, which makes a 0-d array 1-d)
        return buf, np.ascontiguousarray(data).view(np.uint8).reshape(-1)

    def _check_chip(self, chip) -> None:
        """A chip of this mesh (not a negative index, which would name another chip)."""
        if isinstance(chip, bool) or not isinstance(chip, (int, np.integer)) or not 0 <= chip < self.mesh.num_chips:
            raise ValueError(f"chip {chip!r} is not a chip of this mesh "
                             f"({'x'.join(map(str, self.mesh.dims))}: chips 0..{self.mesh.num_chips - 1})")

    def write_buffer(self, chip: int, name: str, array: np.ndarray) -> None:
        """Write a buffer on one chip (a timing-only run keeps only i32 buffers' bytes)."""
        self._check_chip(chip)
        buf, raw = self._buffer_data(name, array)
        lo, hi = buf.offset_bytes, buf.offset_bytes + buf.size_bytes
        mem, base = self._hbm.for_write(chip, lo, hi)
        if mem is not None:
            mem[lo - base:hi - base] = raw

    def write_buffer_all(self, name: str, array: np.ndarray) -> None:
        """The same data into every chip's copy of a buffer (stored once until written)."""
        buf, raw = self._buffer_data(name, array)
        self._hbm.write_all(buf.offset_bytes, raw)

    def holds_data(self, name: str) -> bool:
        """Does buffer `name` keep its bytes (every buffer does, except in a timing-only
        run, where only the i32 ones do)?"""
        return not self.config.timing_only or self.program.buffer(name).dtype == "i32"

    def read_buffer(self, chip: int, name: str) -> np.ndarray:
        self._check_chip(chip)
        buf = self.program.buffer(name)
        lo, hi = buf.offset_bytes, buf.offset_bytes + buf.size_bytes
        mem, base = self._hbm.for_read(chip, lo, hi)
        if mem is None:
            raise ValueError(f"buffer {name} ({buf.dtype}) holds no data in a timing-only run")
        return mem[lo - base:hi - base].view(NP_DTYPES[buf.dtype]).reshape(buf.storage_shape).copy()

    # -- running -------------------------------------------------------------

    def run(self) -> RunResult:
        launches = self.program.launches
        with np.errstate(all="ignore"):
            for index, launch in enumerate(launches):
                start = self.now + self.profile.kernel_launch_cycles
                try:
                    if start > self.config.max_cycles:
                        # (as the core loop would at the launch's first instruction, before a
                        # start past 2^63 overflows a core's 64-bit clock)
                        raise self._launch_past_guard(launch, start)
                    self._launch(launch, start)
                except EmulatorFault as fault:
                    _name_the_launch(fault, launches, index)
                    raise
                self.launch_cycles.append(self.now - start + self.profile.kernel_launch_cycles)
        return self.result()

    def _launch_past_guard(self, launch, start: int) -> EmulatorFault:
        """The max-cycle guard passed before a launch starts: named by chip 0 core 0 at
        the kernel's first instruction, the one that would issue at `start`."""
        self.kernel = kernel = self.program.kernels[launch.kernel]
        ops = self.decoded[launch.kernel].ops
        return EmulatorFault("max-cycles", f"kernel {kernel.name}: "
                             f"{max_cycles_message(self.config.max_cycles, self.profile)}",
                             chip=0, core=0, cycle=start, pc=0, instruction=ops[0].text if ops else None,
                             **(fault_place(kernel, 0) if ops else {}))

    def _launch(self, launch, start: int) -> None:
        kernel = self.program.kernels[launch.kernel]
        decoded = self.decoded[launch.kernel]
        self.kernel = kernel
        self.events: list = []
        self.seq = 0
        self.barriers: dict = {}
        self.engine_queue = {c.gid: [] for c in self.cores}
        self.engine_active = {c.gid: 0 for c in self.cores}
        self.dmas: dict[int, Dma] = {}
        self.lazy_sources: dict[int, dict[int, Dma]] = {}   # chip -> DMAs reading its own HBM bytes at landing
        self.held: list[Dma] = []      # the late schedule's DMAs that moved but have not landed
        self.flow_version = 0
        if self.trace is not None:
            self.trace.on_launch(self, launch, start)
        flags = 0
        if self.safety is not None:
            self.safety.launch(self.dma_count)
            flags |= lp.FLAG_RACES
        if self.config.timing_only:
            flags |= lp.FLAG_TIMING_ONLY
        if self.config.record_readbacks:
            flags |= lp.FLAG_RECORD
        for core in self.cores:
            core.start(kernel, decoded, launch.args, start, self.config.max_cycles,
                       self.config.max_instructions, flags)
            core.pending = None
            core.waiting = None
            core.end_time = None
            self._push(start, RESUME, core)
        self.now = start
        events, max_cycles, pop = self.events, self.config.max_cycles, heapq.heappop
        while events or self.held:
            if not events:
                # Every core halted or blocks, and DMAs are held back: now they land.
                self.release_all(self.now)
                continue
            t, _, kind, payload = pop(events)
            if t > max_cycles and kind != FAULT:
                raise self._max_cycles(kind, payload, t)
            if t > self.now:
                self.now = t
            if kind == RESUME:
                self._resume(payload, t)
            elif kind == DMA_BEGIN:
                self._begin_dma(payload, t)
            elif kind == FLOWS:
                if payload == self.flow_version:
                    self._complete_flows(t)
            elif kind == SIGNAL:
                core, sem, value, carried, raiser = payload
                if self.safety is not None:
                    self.safety.signal_arrived(core, sem, value, carried)
                self._add_sem(core, sem, value, t, raiser=raiser)
            elif kind == LAND:
                self._land(payload, t)
            elif kind == FAULT:
                raise payload() if callable(payload) else payload
        waiting = [c for c in self.cores if not c.halted]
        if waiting:
            raise self._deadlock(waiting)
        self.now = max([self.now] + [c.end_time for c in self.cores])
        self._fold_region_stats(kernel)
        if self.trace is not None:
            self.trace.on_launch_end(self)
        if "semaphores" in self.config.checks:
            raised = [c for c in self.cores if any(c.sems)]
            if raised:
                core = raised[0]
                left = [(i, v) for i, v in enumerate(core.sems) if v]
                raise self._nonzero_semaphores(kernel, core, left, raised[1:])

    def _nonzero_semaphores(self, kernel, core: Core, left: list[tuple[int, int]],
                            others: list[Core]) -> EmulatorFault:
        """Name each semaphore left raised and the instruction that last raised it (on
        `core`, the first such; `others` are the other cores that ended so, named after)."""
        parts = []
        for sem, value in left:
            raiser = core.sem_raisers.get(sem)
            part = f"semaphore {sem} = {value}"
            if raiser is not None:
                (chip, index), pc, text, cycle = raiser
                source = kernel.source_line(pc)
                part += (f" (last raised at cycle {cycle} by `{text}` of chip {chip} core {index}, "
                         f"pc {pc:#06x}{', ' + source if source else ''})")
            part += kernel.semaphore_named(sem, ", which is {name}")
            parts.append(part)
        first = core.sem_raisers.get(left[0][0])
        also = ""
        if others:
            shown = [f"chip {c.chip} core {c.index} (" + ", ".join(f"semaphore {i} = {v}" for i, v in
                                                             enumerate(c.sems) if v) + ")" for c in others[:4]]
            more = f" and {len(others) - 4} more core{'s' if len(others) > 5 else ''}" if len(others) > 4 else ""
            also = f"; other cores ended with semaphores raised too: {', '.join(shown)}{more}"
        return EmulatorFault("semaphore-nonzero", f"kernel {kernel.name} ended with {'; '.join(parts)} "
                             f"(every semaphore must be 0 at exit: a DMA or signal was never waited for){also}",
                             chip=core.chip, core=core.index, cycle=self.now,   # (the launch's end: its last landing)
                             pc=first[1] if first else None, instruction=first[2] if first else None,
                             **(fault_place(kernel, first[1]) if first else {}))

    def _fold_region_stats(self, kernel) -> None:
        """Add this launch's per-core region times (summed over cores) to the run's."""
        def name(rid: int) -> str:
            if rid < 0:
                return "(outside regions)"
            return kernel.regions[rid] if rid < len(kernel.regions) else f"region{rid}"

        totals, own_totals, entries = self.region_cycles, self.region_own_cycles, self.region_entries
        for core in self.cores:
            mine = self.core_region_entries[core.gid]
            core.close_open_regions(core.end_time)     # (a region a .s kernel left open ends at the halt)
            for rid, (cycles, count, own) in core.region_stats().items():
                key = name(rid)
                totals[key] = totals.get(key, 0) + cycles
                own_totals[key] = own_totals.get(key, 0) + own
                entries[key] = entries.get(key, 0) + count
                mine[key] = mine.get(key, 0) + count
            for rid, cycles in core.dma_wait_cycles.items():
                key = name(rid)
                self.dma_wait_cycles[key] = self.dma_wait_cycles.get(key, 0) + cycles
            self.idle_cycles += self.now - core.end_time

    def _defer_fault(self, fault: EmulatorFault) -> None:
        """A fault found ahead of the machine's clock (in a core's run-ahead, or a logged
        access that races with a DMA issued since, at an earlier cycle): raised when
        simulated time reaches its cycle, after whatever happens before it (other cores,
        DMAs, another core's earlier fault)."""
        self._push(max(self.now, fault.cycle), FAULT, fault)

    def _push(self, t: int, kind: int, payload) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, payload))

    def _resume(self, core: Core, t: int) -> None:
        while True:
            if core.pending is None:
                try:
                    core.pending = core.run_local()
                except Trap as trap:
                    fault = self._fault(core, trap.kind, trap.message, trap.cycle)
                    if trap.kind in GUARDS:
                        raise fault from None
                    # Found while the core ran ahead of the machine's clock: raised once
                    # simulated time reaches it (`_defer_fault`). The core stops here.
                    self._defer_fault(fault)
                    return
            op, issue = core.pending
            if issue > t:
                events = self.events
                if (events and events[0][0] <= issue) or issue > self.config.max_cycles:
                    self._push(issue, RESUME, core)
                    return
                # Nothing happens before the core's next global instruction: go on at
                # once, as the event loop would after popping its resume next.
                t = issue
                self.now = max(self.now, issue)
            core.pending = None
            if op is None:
                # Paused with its access log full: the machine has caught up with the core.
                core.drop_logged_before(self.now)
                continue
            try:
                core.retire(op, issue)    # (a Trap: the max-instructions guard of global instructions)
                blocked = self._global(core, op, issue)
            except Trap as trap:
                raise self._fault(core, trap.kind, trap.message, issue) from None
            if blocked:
                return
            core.I[lp.H_PC] += 1

    # -- global instructions -------------------------------------------------

    def _global(self, core: Core, op, t: int) -> bool:
        """Execute global `op` of `core` at cycle t; True if the core now blocks."""
        return GLOBAL_OPS[op.global_kind](self, core, op, t)

    def _halt(self, core: Core, op, t: int) -> bool:
        core.halted = True
        core.end_time = t
        self._check_barrier_after_halt(core, t)
        return True

    def _signal(self, core: Core, op, t: int) -> bool:
        s = core.s
        sem, value = s[op.args[0]], s[op.args[1]]
        self._check_sem(core, sem)
        _check_amount("signal", value, sem, self.kernel)
        if self.safety is not None:
            self.safety.signal_arrived(core, sem, value, self.safety.signal_payload(core))
        self._add_sem(core, sem, value, t, raiser=self._raiser(core, op))
        if self.trace is not None:
            self.trace.on_signal(core, core, sem, value, t, t)
        return False

    def _signal_remote(self, core: Core, op, t: int) -> bool:
        s = core.s
        sem, value = s[op.args[0]], s[op.args[1]]
        target = self._target_core(core, s[op.args[2]])
        self._check_sem(target, sem)
        _check_amount("signal", value, sem, self.kernel)
        arrival = t + self._signal_latency(core, target)
        carried = self.safety.signal_payload(core) if self.safety is not None else None
        self._push(arrival, SIGNAL, (target, sem, value, carried, self._raiser(core, op)))
        if self.trace is not None:
            self.trace.on_signal(core, target, sem, value, t, arrival)
        return False

    def _wait(self, core: Core, op, t: int) -> bool:
        s = core.s
        sem, value = s[op.args[0]], s[op.args[1]]
        self._check_sem(core, sem)
        _check_amount("wait", value, sem, self.kernel)
        if core.sems[sem] >= value:
            core.sems[sem] -= value
            if self.safety is not None:
                self.safety.waited(core, sem, value)
            if self.trace is not None:
                self.trace.on_wait(core, 0, sem, value, t, t)
            return False
        core.waiting = (sem, value, t, op)
        if self.held:
            self.release_for(core, sem, t)
        return True

    def _barrier_op(self, core: Core, op, t: int) -> bool:
        return self._barrier(core, BARRIER_SCOPES[op.args[0]], t, op)

    def _dma_op(self, core: Core, op, t: int) -> bool:
        self._start_dma(core, op, t)
        return False

    def _check_sem(self, core: Core, sem: int) -> None:
        if not 0 <= sem < len(core.sems):
            raise Trap("bad-semaphore", f"semaphore {sem} does not exist (chip {core.chip} core {core.index} "
                                        f"has {len(core.sems)})")

    def _target_core(self, core: Core, gid: int) -> Core:
        if not 0 <= gid < len(self.cores):
            chips, per_chip = self.mesh.num_chips, self.profile.cores_per_chip
            raise Trap("bad-target", f"target core {gid} is outside the mesh ({len(self.cores)} cores: {chips} "
                                     f"chip{'s' if chips != 1 else ''} of {per_chip} core{'s' if per_chip != 1 else ''})")
        return self.cores[gid]

    def _path_latency(self, src: Core, dst: Core) -> int:
        """How much later a DMA's bytes start to arrive at `dst` than at `src` itself."""
        if src.chip != dst.chip:
            return self.mesh.hops(src.chip, dst.chip) * self.profile.hop_latency_cycles
        if src.index != dst.index:
            return self.profile.sibling_latency_cycles
        return 0

    def _signal_latency(self, src: Core, dst: Core) -> int:
        """How long a semaphore signal (or a barrier's message) takes from `src` to `dst`."""
        if src.chip != dst.chip:
            return self.mesh.hops(src.chip, dst.chip) * self.profile.hop_latency_cycles
        if src.index != dst.index:
            return self.profile.sibling_signal_latency_cycles
        return 0

    def _raiser(self, core: Core, op) -> tuple:
        return ((core.chip, core.index), core.pc, op.text)

    def _add_sem(self, core: Core, sem: int, value: int, t: int, by_dma: bool = False, raiser=None) -> None:
        """Raise semaphore `sem` of `core` (by a DMA landing or a signal; `raiser` is
        the DMA, or ((chip, core), pc, text) of the signal), waking a core that waits."""
        count = core.sems[sem] + value
        if count >= 2**63:     # (a 64-bit counter; never negative: amounts are >= 0, a wait takes what is there)
            raise self._sem_overflow(core, sem, value, t, raiser, by_dma)
        core.sems[sem] = count
        if by_dma:
            core.sem_raisers[sem] = ((raiser.src_core.chip, raiser.src_core.index), raiser.pc, raiser.text, t)
        elif raiser is not None:
            core.sem_raisers[sem] = (*raiser, t)
        waiting = core.waiting
        if waiting and waiting[0] == sem and core.sems[sem] >= waiting[1]:
            core.sems[sem] -= waiting[1]
            core.sync_stalls["semaphore"] += t - waiting[2]
            if by_dma and t > waiting[2]:   # (a landing in the wait's own cycle ended no wait)
                region = core.innermost_region()
                core.dma_wait_cycles[region] = core.dma_wait_cycles.get(region, 0) + t - waiting[2]
            core.waiting = None
            if self.trace is not None:
                self.trace.on_wait(core, 0, sem, waiting[1], waiting[2], t)
            if self.safety is not None:
                self.safety.waited(core, sem, waiting[1])
            I = core.I
            if I[lp.H_T] < t:
                I[lp.H_T] = t
            I[lp.H_PC] += 1
            self._push(t, RESUME, core)
        elif waiting and waiting[0] == sem and self.held and not by_dma:
            # The late schedule: a signal raised the semaphore a core blocks on, so the
            # DMAs held for it may now satisfy the wait (land those it needs, no others).
            self.release_for(core, sem, t)

    def _barrier(self, core: Core, scope: str, t: int, op) -> bool:
        """A barrier is messages over the mesh: each member's arrival goes to a root
        member, which releases every member once all have arrived; each message takes
        a signal's latency (`_signal_latency`: hops of the dimension-order route, or the
        on-chip path). The root is the member nearest to all others (`_barrier_root`).
        Messages carry no bytes, so they share no link bandwidth."""
        members = self._barrier_members(core, scope)
        key = (scope, tuple(members))
        arrived = self.barriers.setdefault(key, {})
        arrived[core.gid] = (t, op)
        core.waiting = ("barrier", scope, t, op)
        if len(arrived) < len(members):
            return True
        del self.barriers[key]
        if self.safety is not None:
            self.safety.barrier([self.cores[gid] for gid in arrived])
        root = self._barrier_root(key[1])
        all_in = max(since + self._signal_latency(self.cores[gid], root) for gid, (since, _) in arrived.items())
        for gid, (since, _) in arrived.items():
            member = self.cores[gid]
            release = all_in + self._signal_latency(root, member)
            member.sync_stalls["barrier"] += release - since
            member.waiting = None
            if self.trace is not None:
                self.trace.on_wait(member, 1, BARRIER_SCOPES.index(scope), 0, since, release)
            member.t = max(member.t, release)
            member.pc += 1
            self._push(release, RESUME, member)
        return True

    def _barrier_root(self, members: tuple[int, ...]) -> Core:
        """The member whose farthest member is nearest (lowest id on a tie): arrivals
        gathered there and the release sent back out take twice that farthest path,
        about the mesh diameter the last arrival's news must cross anyway."""
        root = self.barrier_roots.get(members)
        if root is None:
            cores = [self.cores[gid] for gid in members]
            root = min(cores, key=lambda c: (max(self._signal_latency(m, c) for m in cores), c.gid))
            self.barrier_roots[members] = root
        return root

    def _barrier_members(self, core: Core, scope: str) -> list[int]:
        if scope == "chip":
            return [c.gid for c in self.cores if c.chip == core.chip]
        if scope == "all":
            return [c.gid for c in self.cores]
        axis = "xyz".index(scope)
        here = self.mesh.coords(core.chip)
        return [c.gid for c in self.cores if c.index == core.index and all(
            a == axis or self.mesh.coords(c.chip)[a] == here[a] for a in range(3))]

    def _check_barrier_after_halt(self, core: Core, t: int) -> None:
        """A core halts while others wait at a barrier it belongs to: a fault, made once
        the rest of cycle t has run (a member reaching the barrier at t is named among
        the waiters, whatever order the cores of that cycle run in)."""
        for key, arrived in self.barriers.items():
            if core.gid in key[1] and core.gid not in arrived:
                self._push(t, FAULT, lambda: self._barrier_not_reached(core, t, key))
                return

    def _barrier_not_reached(self, core: Core, t: int, key: tuple) -> EmulatorFault:
        """The fault of `core`, halted at cycle t, never reaching barrier `key`: it points
        at that barrier (where the others wait) and names the core that skipped it."""
        (scope, members), arrived = key, self.barriers[key]
        first = self.cores[next(iter(arrived))]
        waiters = ", ".join(f"chip {self.cores[g].chip} core {self.cores[g].index}" for g in arrived)
        halt_src = self.kernel.source_line(core.pc)
        others = [self.cores[g] for g in members if g != core.gid and g not in arrived and self.cores[g].halted]
        also = "".join(f"; chip {c.chip} core {c.index} halted at cycle {c.end_time} without reaching it too"
                       for c in others)
        return EmulatorFault(
            "barrier-not-reached",
            f"kernel {self.kernel.name}: chip {core.chip} core {core.index} halted at cycle {t} "
            f"(pc {core.pc:#06x}{', ' + halt_src if halt_src else ''}) without reaching this {scope} "
            f"barrier, which {waiters} {'waits' if len(arrived) == 1 else 'wait'} at{also}",
            chip=first.chip, core=first.index, cycle=t, pc=first.pc,
            instruction=self.decoded_op_text(first.pc), **fault_place(self.kernel, first.pc))

    # -- DMA -----------------------------------------------------------------

    def decoded_op_text(self, pc: int) -> str | None:
        decoded = self.decoded.get(self.kernel.name)
        return decoded.ops[pc].text if decoded is not None and 0 <= pc < len(decoded.ops) else None

    def _sem_overflow(self, core: Core, sem: int, value: int, t: int, raiser, by_dma: bool) -> EmulatorFault:
        """A signal's amount (a 64-bit register value) or a DMA's landing would carry
        semaphore `sem` of `core` past 2^63 - 1: named by the signal or DMA that raised it."""
        if by_dma:
            (chip, index), pc, text, what = (raiser.src_core.chip, raiser.src_core.index), raiser.pc, raiser.text, "DMA"
        else:
            (chip, index), pc, text = raiser
            what = "signal"
        target = "" if (chip, index) == (core.chip, core.index) else f" of chip {core.chip} core {core.index}"
        return EmulatorFault("bad-operand", f"kernel {self.kernel.name}: this {what} adds {value:,} to semaphore "
                                            f"{sem}{target}, which holds {core.sems[sem]:,}: the sum passes the "
                                            "largest count, 2^63 - 1",
                             chip=chip, core=index, cycle=t, pc=pc, instruction=text, **fault_place(self.kernel, pc))

    def _fault(self, core: Core | None, kind: str, message: str, cycle: int | None = None) -> EmulatorFault:
        if core is None:
            return EmulatorFault(kind, message, cycle=cycle)
        pc = core.pc
        if kind == "ran-off-end" and pc > 0:
            pc -= 1     # (past the end: named by the last instruction, which fell through)
        return EmulatorFault(kind, f"kernel {self.kernel.name}: {message}", chip=core.chip, core=core.index,
                             cycle=core.t if cycle is None else cycle, pc=pc,
                             instruction=self.decoded_op_text(pc),
                             **fault_place(self.kernel, pc))

    def _max_cycles(self, kind: int, payload, t: int) -> EmulatorFault:
        """The max-cycle guard, passed by the next event: named by the core it resumes, or
        by the instruction that caused it (a DMA's issue, a signal); a flow's completion
        by the oldest DMA still in flight."""
        message = max_cycles_message(self.config.max_cycles, self.profile)
        if kind == RESUME:
            return self._fault(payload, "max-cycles", message, t)
        what, late = ("signal" if kind == SIGNAL else "DMA"), ""
        if kind in (DMA_BEGIN, LAND):
            by = (payload.src_core, payload.pc, payload.text)
        elif kind == SIGNAL:
            (chip, index), pc, text = payload[4]     # (the signal's `_raiser`)
            by = (self.cores[chip * self.profile.cores_per_chip + index], pc, text)
        else:
            oldest = min(self.dmas.values(), key=lambda d: d.seq, default=None)
            by = (oldest.src_core, oldest.pc, oldest.text) if oldest is not None else None
            # No flow moves its last byte before `t`, a prediction the run never reaches
            # (FAR_CYCLE: never, in 64-bit cycles): the fault is at the first cycle past
            # the guard, and says how late the DMA would be.
            late = (": at the profile's bandwidths it would not finish "
                    + ("within 2^62 cycles" if t >= FAR_CYCLE else f"before cycle {t}"))
            t = self.config.max_cycles + 1
        if by is None:
            return EmulatorFault("max-cycles", message, cycle=t)
        core, pc, text = by
        return EmulatorFault("max-cycles",
                             f"kernel {self.kernel.name}: {message}, with this {what} still in flight{late}",
                             chip=core.chip, core=core.index, cycle=t, pc=pc, instruction=text,
                             **fault_place(self.kernel, pc))

    def _deadlock(self, waiting: list[Core]) -> EmulatorFault:
        lines = []
        for core in waiting:
            w = core.waiting
            where = f"chip {core.chip} core {core.index} pc {core.pc:#06x}"
            src = self.kernel.source_line(core.pc)
            if w and w[0] == "barrier":
                what = f"waits at the {w[1]} barrier since cycle {w[2]}"
                skipped = [self.cores[g] for g in self._barrier_members(core, w[1]) if self.cores[g].halted]
                if skipped:
                    what += " (" + ", ".join(f"chip {c.chip} core {c.index} halted at cycle {c.end_time}"
                                             for c in skipped) + " without reaching it)"
            elif w:
                what = (f"waits for semaphore {w[0]} to reach {w[1]} (it is {core.sems[w[0]]}) "
                        f"since cycle {w[2]}")
            else:
                what = "is stuck"
            # (where the line is a library fn's, the calls it was inlined at name the caller's)
            calls = self.kernel.calls_of(core.pc)
            place = f"{src} ({calls})" if src and calls else src or calls
            lines.append(f"{where} `{self.decoded_op_text(core.pc)}` {what}" + (f" [{place}]" if place else ""))
        first = waiting[0]
        # The semaphores waited on, by their .mk names.
        sems = dict.fromkeys(c.waiting[0] for c in waiting if c.waiting and c.waiting[0] != "barrier")
        named = "; ".join(filter(None, (self.kernel.semaphore_named(s, "semaphore {sem} is {name}")
                                        for s in sorted(sems))))
        return EmulatorFault("deadlock", f"kernel {self.kernel.name}: no core can make progress and nothing "
                             f"is in flight; {len(waiting)} core(s) wait forever" + (f" ({named})" if named else ""),
                             cycle=self.now, details=tuple(lines), chip=first.chip, core=first.index,
                             pc=first.pc, instruction=self.decoded_op_text(first.pc),
                             **fault_place(self.kernel, first.pc))

    def result(self) -> RunResult:
        names = unit_names(self.profile)
        busy = {name: 0 for name in names if name != "meta"}
        stalls: dict[str, int] = {}
        per_core = []
        for core in self.cores:
            for name, cycles in zip(names, core.unit_busy.tolist()):
                if name in busy:
                    busy[name] += cycles
            for reason, cycles in core.stalls.items():
                stalls[reason] = stalls.get(reason, 0) + cycles
            per_core.append({"chip": core.chip, "core": core.index, "instructions": core.instructions,
                             "unit_busy_cycles": {n: c for n, c in zip(names, core.unit_busy.tolist()) if n in busy},
                             "stall_cycles": core.stalls,
                             "region_entries": dict(self.core_region_entries[core.gid])})
        return RunResult(
            cycles=self.now, seconds=self.profile.cycles_to_seconds(self.now),
            instructions=sum(c.instructions for c in self.cores), unit_busy_cycles=busy,
            hbm_bytes=self.hbm_bytes, dma_count=self.dma_count, stall_cycles=stalls,
            launch_cycles=tuple(self.launch_cycles), link_bytes=self.link_bytes, per_core=tuple(per_core),
            region_cycles=dict(self.region_cycles), region_own_cycles=dict(self.region_own_cycles),
            region_entries=dict(self.region_entries),
            dma_wait_cycles=dict(self.dma_wait_cycles),
            idle_cycles=self.idle_cycles)


def _name_the_launch(fault: EmulatorFault, launches, index: int) -> None:
    """A fault in a kernel the host block launches more than once says which launch it
    was in, and where that launch is (its kernel's name alone leaves that to the cycle;
    a generic kernel's instance names only the launch that made it)."""
    name, span = launches[index].kernel, launches[index].span
    same = [i for i, launch in enumerate(launches) if launch.kernel == name]
    if len(same) > 1:
        nth = same.index(index) + 1
        fault.details = (*fault.details, f"in kernel {name}'s launch {nth} of {len(same)} (the host "
                                         f"block's launch {index + 1} of {len(launches)})"
                                         + (f", launched at {span}" if span is not None else ""))
        fault.args = (fault.render(),)


# What the machine does for each global kind of the instruction table.
GLOBAL_OPS = {"halt": Machine._halt, "signal": Machine._signal, "signal_remote": Machine._signal_remote,
              "wait": Machine._wait, "barrier": Machine._barrier_op, "dma": Machine._dma_op,
              "dma_remote": Machine._dma_op}


def _check_amount(what: str, value: int, sem: int, kernel) -> None:
    """Semaphores count up: a signal adds, a wait takes away, 0 or more either way. A
    negative amount would do the opposite (e.g. `wait recv (num_chips() - 2) * copy(...)`
    on one chip raised the semaphore, ending in a semaphore-nonzero report that could
    name no raiser)."""
    if value < 0:
        raise Trap("bad-operand", f"{what} of a negative amount ({value}) on semaphore {sem}: "
                                  f"a {what} takes a count of 0 or more{kernel.semaphore_named(sem)}")
