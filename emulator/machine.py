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

from mkemu.errors import EmulatorFault
from mkemu.isa.encoding import BARRIER_SCOPES, SPACES
from mkemu.isa.hardware import HardwareProfile
from mkemu.isa.program import Program

from mkemu.emulator.config import RunConfig
from mkemu.emulator.core import Core
from mkemu.emulator.decode import decode_kernel, unit_names
from mkemu.emulator.flows import FlowNetwork, completion_cycle
from mkemu.emulator.hbm import ChipMemories
from mkemu.emulator.memory import Trap, block_ranges, read_block, write_block
from mkemu.emulator.topology import Mesh

RESUME, DMA_BEGIN, FLOWS, SIGNAL = range(4)
DESC_WORDS = 7
NP_DTYPES = {"bf16": np.uint16, "f32": np.float32, "i32": np.int32}


@attrs.define
class Dma:
    seq: int
    src_core: Core
    dst_core: Core            # the core whose memory (VMEM/SMEM) or chip (HBM) receives
    src_space: str
    dst_space: str
    dst_addr: int
    shape: tuple[int, int, int, int, int]   # inner, n1, dst_stride1, n2, dst_stride2
    data: np.ndarray
    size_bytes: int
    sem: int                  # on src_core: bytes sent (== completion for local copies)
    rsem: int | None          # on dst_core: bytes received (remote copies)
    resources: tuple[int, ...]
    latency_cycles: int
    issued_at: int
    pc: int
    text: str
    dst_range: tuple[int, int] = (0, 0)
    src_range: tuple[int, int] = (0, 0)
    begun_at: int | None = None
    done_at: int | None = None


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
    region_entries: dict[str, int]
    dma_wait_cycles: dict[str, int]
    idle_cycles: int

    def to_json(self) -> dict:
        return attrs.asdict(self, recurse=True)


class Machine:
    def __init__(self, profile: HardwareProfile, mesh: Mesh | None = None,
                 config: RunConfig | None = None, trace=None):
        self.profile = profile
        self.mesh = mesh or Mesh(profile.mesh_dims, profile.mesh_wrap, profile.links_per_neighbor)
        self.config = config or RunConfig()
        p = profile
        self.cores: list[Core] = []
        for chip in range(self.mesh.num_chips):
            for index in range(p.cores_per_chip):
                core = Core(p, chip, index, len(self.cores))
                x, y, z = self.mesh.coords(chip)
                core.special = dict(core=index, chip=chip, chip_x=x, chip_y=y, chip_z=z,
                                    mesh_x=self.mesh.dims[0], mesh_y=self.mesh.dims[1],
                                    mesh_z=self.mesh.dims[2], cores=p.cores_per_chip,
                                    chips=self.mesh.num_chips, gcore=core.gid)
                self.cores.append(core)
        self.net = FlowNetwork()
        self.hbm_shared = p.cores_per_chip * p.dma_engine_bw_bytes_per_cycle > p.hbm_bw_bytes_per_cycle
        self.hbm_res = [self.net.add_resource(f"chip{c} HBM", p.hbm_bw_bytes_per_cycle)
                        for c in range(self.mesh.num_chips)]
        self.sibling_res = [self.net.add_resource(f"chip{c} core-to-core", p.sibling_bw_bytes_per_cycle)
                            for c in range(self.mesh.num_chips)]
        self.engine_res = [self.net.add_resource(f"chip{c.chip} core{c.index} DMA engine",
                                                 p.dma_engine_bw_bytes_per_cycle) for c in self.cores]
        self.links = self.mesh.link_resources(self.net, p.link_bw_bytes_per_cycle)
        self._hbm = ChipMemories(self.mesh.num_chips, 0)
        self.program: Program | None = None
        self.decoded: dict = {}
        self.now = 0
        self.hbm_bytes = 0
        self.link_bytes = 0
        self.dma_count = 0
        self.launch_cycles: list[int] = []
        self.region_cycles: dict[str, int] = {}    # summed over cores
        self.region_entries: dict[str, int] = {}   # summed over cores
        self.core_region_entries: list[dict[str, int]] = [{} for _ in self.cores]   # per core
        self.dma_wait_cycles: dict[str, int] = {}  # waits ended by a DMA, by innermost region
        self.idle_cycles = 0                       # halted cores waiting for the launch to end
        # An `emulator.trace.Recorder`, or None: every hook below is one `is not None` test.
        self.trace = trace

    # -- loading and data ----------------------------------------------------

    def load(self, program: Program) -> None:
        self.program = program
        if self.trace is not None:
            self.trace.attach(self)
        self.decoded = {name: decode_kernel(kernel, self.profile) for name, kernel in program.kernels.items()}
        if program.hbm_bytes > self.profile.hbm_bytes:
            raise EmulatorFault("out-of-memory", f"program needs {program.hbm_bytes} bytes of HBM, "
                                                 f"the chip has {self.profile.hbm_bytes}")
        self._hbm = ChipMemories(self.mesh.num_chips, program.hbm_bytes)

    @property
    def hbm(self) -> list[np.ndarray]:
        """Each chip's HBM as a byte array."""
        return self._hbm.arrays

    def _buffer_data(self, name: str, array: np.ndarray):
        buf = self.program.buffer(name)
        data = np.ascontiguousarray(array, dtype=NP_DTYPES[buf.dtype])
        if data.shape != buf.shape:
            raise ValueError(f"buffer {name}: shape {data.shape} != declared {buf.shape}")
        return buf, data.view(np.uint8).reshape(-1)

    def write_buffer(self, chip: int, name: str, array: np.ndarray) -> None:
        buf, raw = self._buffer_data(name, array)
        lo, hi = buf.offset_bytes, buf.offset_bytes + buf.size_bytes
        self._hbm.for_write(chip, lo, hi)[lo:hi] = raw

    def write_buffer_all(self, name: str, array: np.ndarray) -> None:
        """The same data into every chip's copy of a buffer (stored once until written)."""
        buf, raw = self._buffer_data(name, array)
        self._hbm.write_all(buf.offset_bytes, raw)

    def read_buffer(self, chip: int, name: str) -> np.ndarray:
        buf = self.program.buffer(name)
        raw = self.hbm[chip][buf.offset_bytes:buf.offset_bytes + buf.size_bytes]
        return raw.view(NP_DTYPES[buf.dtype]).reshape(buf.shape).copy()

    # -- running -------------------------------------------------------------

    def run(self) -> RunResult:
        with np.errstate(all="ignore"):
            for launch in self.program.launches:
                start = self.now + self.profile.kernel_launch_cycles
                self._launch(launch, start)
                self.launch_cycles.append(self.now - start + self.profile.kernel_launch_cycles)
        return self.result()

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
        self.flow_version = 0
        if self.trace is not None:
            self.trace.on_launch(self, launch, start)
        races = "races" in self.config.checks
        for core in self.cores:
            core.start(kernel, decoded, launch.args, start, self.config.max_cycles, races)
            core.pending = None
            core.waiting = None
            core.end_time = None
            self._push(start, RESUME, core)
        self.now = start
        while self.events:
            t, _, kind, payload = heapq.heappop(self.events)
            if t > self.config.max_cycles:
                core = payload if kind == RESUME else None
                raise self._fault(core, "max-cycles",
                                  f"the run passed the max-cycle guard of {self.config.max_cycles} cycles", t)
            self.now = max(self.now, t)
            if kind == RESUME:
                self._resume(payload, t)
            elif kind == DMA_BEGIN:
                self._begin_dma(payload, t)
            elif kind == FLOWS:
                if payload == self.flow_version:
                    self._complete_flows(t)
            elif kind == SIGNAL:
                core, sem, value = payload
                self._add_sem(core, sem, value, t)
        waiting = [c for c in self.cores if not c.halted]
        if waiting:
            raise self._deadlock(waiting)
        self.now = max([self.now] + [c.end_time for c in self.cores])
        self._fold_region_stats(kernel)
        if self.trace is not None:
            self.trace.on_launch_end(self)
        if "semaphores" in self.config.checks:
            for core in self.cores:
                left = [(i, v) for i, v in enumerate(core.sems) if v]
                if left:
                    text = ", ".join(f"semaphore {i} = {v}" for i, v in left)
                    raise EmulatorFault("semaphore-nonzero", f"kernel {kernel.name} ended with {text} "
                                        "(every semaphore must be 0 at exit: a DMA or signal was never waited for)",
                                        chip=core.chip, core=core.index, cycle=core.end_time)

    def _fold_region_stats(self, kernel) -> None:
        """Add this launch's per-core region times (summed over cores) to the run's."""
        def name(rid: int) -> str:
            if rid < 0:
                return "(outside regions)"
            return kernel.regions[rid] if rid < len(kernel.regions) else f"region{rid}"

        for core in self.cores:
            mine = self.core_region_entries[core.gid]
            for rid, (cycles, count) in core.region_stats().items():
                self.region_cycles[name(rid)] = self.region_cycles.get(name(rid), 0) + cycles
                self.region_entries[name(rid)] = self.region_entries.get(name(rid), 0) + count
                mine[name(rid)] = mine.get(name(rid), 0) + count
            for rid, cycles in core.dma_wait_cycles.items():
                self.dma_wait_cycles[name(rid)] = self.dma_wait_cycles.get(name(rid), 0) + cycles
            self.idle_cycles += self.now - core.end_time

    def _push(self, t: int, kind: int, payload) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, payload))

    def _resume(self, core: Core, t: int) -> None:
        while True:
            if core.pending is None:
                try:
                    core.pending = core.run_local()
                except Trap as trap:
                    raise self._fault(core, trap.kind, trap.message) from None
            op, issue = core.pending
            if issue > t:
                self._push(issue, RESUME, core)
                return
            core.pending = None
            core.retire(op, issue)
            try:
                blocked = self._global(core, op, issue)
            except Trap as trap:
                raise self._fault(core, trap.kind, trap.message, issue) from None
            if blocked:
                return
            core.pc += 1

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
        self._add_sem(core, sem, value, t)
        if self.trace is not None:
            self.trace.on_signal(core, core, sem, value, t, t)
        return False

    def _signal_remote(self, core: Core, op, t: int) -> bool:
        s = core.s
        sem, value = s[op.args[0]], s[op.args[1]]
        target = self._target_core(core, s[op.args[2]])
        self._check_sem(target, sem)
        arrival = t + self._path_latency(core, target)
        self._push(arrival, SIGNAL, (target, sem, value))
        if self.trace is not None:
            self.trace.on_signal(core, target, sem, value, t, arrival)
        return False

    def _wait(self, core: Core, op, t: int) -> bool:
        s = core.s
        sem, value = s[op.args[0]], s[op.args[1]]
        self._check_sem(core, sem)
        if core.sems[sem] >= value:
            core.sems[sem] -= value
            self._retire_dmas(core, sem)
            if self.trace is not None:
                self.trace.on_wait(core, 0, sem, value, t, t)
            return False
        core.waiting = (sem, value, t, op)
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
            raise Trap("bad-target", f"target core {gid} is outside the mesh ({len(self.cores)} cores on "
                                     f"{self.mesh.num_chips} chips of {self.profile.cores_per_chip})")
        return self.cores[gid]

    def _path_latency(self, src: Core, dst: Core) -> int:
        if src.chip != dst.chip:
            return self.mesh.hops(src.chip, dst.chip) * self.profile.hop_latency_cycles
        if src.index != dst.index:
            return self.profile.sibling_latency_cycles
        return 0

    def _add_sem(self, core: Core, sem: int, value: int, t: int, by_dma: bool = False) -> None:
        core.sems[sem] += value
        waiting = core.waiting
        if waiting and waiting[0] == sem and core.sems[sem] >= waiting[1]:
            core.sems[sem] -= waiting[1]
            core.sync_stalls["semaphore"] += t - waiting[2]
            if by_dma:
                region = core.innermost_region()
                core.dma_wait_cycles[region] = core.dma_wait_cycles.get(region, 0) + t - waiting[2]
            core.waiting = None
            if self.trace is not None:
                self.trace.on_wait(core, 0, sem, waiting[1], waiting[2], t)
            self._retire_dmas(core, sem)
            core.t = max(core.t, t)
            core.pc += 1
            self._push(t, RESUME, core)

    def _barrier(self, core: Core, scope: str, t: int, op) -> bool:
        members = self._barrier_members(core, scope)
        key = (scope, tuple(members))
        arrived = self.barriers.setdefault(key, {})
        arrived[core.gid] = (t, op)
        if len(arrived) < len(members):
            core.waiting = ("barrier", scope, t, op)
            return True
        del self.barriers[key]
        for gid, (since, _) in arrived.items():
            other = self.cores[gid]
            if other is core:
                continue
            other.sync_stalls["barrier"] += t - since
            other.waiting = None
            if self.trace is not None:
                self.trace.on_wait(other, 1, BARRIER_SCOPES.index(scope), 0, since, t)
            other.t = max(other.t, t)
            other.pc += 1
            self._push(t, RESUME, other)
        return False

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
        for (scope, members), arrived in self.barriers.items():
            if core.gid in members and core.gid not in arrived:
                waiters = ", ".join(f"chip {self.cores[g].chip} core {self.cores[g].index}" for g in arrived)
                raise EmulatorFault(
                    "barrier-not-reached",
                    f"this core halted without reaching the {scope} barrier that {waiters} wait at",
                    chip=core.chip, core=core.index, cycle=t, pc=core.pc,
                    instruction=self.decoded_op_text(core.pc), source=self.kernel.source_line(core.pc))

    # -- DMA -----------------------------------------------------------------

    def _start_dma(self, core: Core, op, t: int) -> None:
        s = core.s
        remote = op.global_kind == "dma_remote"
        if remote:
            dsp, dst, tgt, ssp, src, desc, sem, rsem = op.args
            target = self._target_core(core, s[tgt])
            rsem_id = s[rsem]
            self._check_sem(target, rsem_id)
        else:
            dsp, dst, ssp, src, desc, sem = op.args
            target, rsem_id = core, None
        sem_id = s[sem]
        self._check_sem(core, sem_id)
        daddr = s[desc]
        if daddr % 4 or not 0 <= daddr <= core.smem.size - 4 * DESC_WORDS:
            raise Trap("out-of-bounds", f"DMA descriptor at SMEM {daddr} is outside SMEM or misaligned")
        inner, n1, ss1, ds1, n2, ss2, ds2 = core.smem[daddr:daddr + 4 * DESC_WORDS].view(np.int32).tolist()
        if inner <= 0 or n1 <= 0 or n2 <= 0:
            raise Trap("bad-descriptor", f"DMA descriptor at SMEM {daddr} has shape {inner}x{n1}x{n2} "
                                         "(every count must be positive)")
        src_space, dst_space = SPACES[ssp], SPACES[dsp]
        src_addr, dst_addr = s[src], s[dst]
        src_range = block_ranges(src_addr, inner, n1, ss1, n2, ss2)
        src_mem = self._memory(core, src_space, *src_range)
        dst_mem = self._memory(target, dst_space)
        data = read_block(src_mem, f"{src_space.upper()} (DMA source)", src_addr, inner, n1, ss1, n2, ss2)
        if src_space == "vmem" and core.in_flight:
            # The source bytes are read now: reading another DMA's unfinished destination is a race.
            self._race(core, *src_range, write=False)
        dst_range = block_ranges(dst_addr, inner, n1, ds1, n2, ds2)
        if dst_range[0] < 0 or dst_range[1] > dst_mem.size:
            raise Trap("out-of-bounds", f"DMA destination {dst_space.upper()} [{dst_range[0]}, {dst_range[1]}) "
                                        f"is outside {dst_space.upper()} of {dst_mem.size} bytes"
                                        + (f" on chip {target.chip} core {target.index}" if remote else ""))
        size = inner * n1 * n2
        resources = self._dma_resources(core, target, src_space, dst_space)
        latency = self.profile.dma_start_latency_cycles + self._path_latency(core, target)
        self.dma_count += 1
        dma = Dma(seq=self.dma_count, src_core=core, dst_core=target, src_space=src_space,
                  dst_space=dst_space, dst_addr=dst_addr, shape=(inner, n1, ds1, n2, ds2), data=data,
                  size_bytes=size, sem=sem_id, rsem=rsem_id, resources=tuple(resources),
                  latency_cycles=latency, issued_at=t, pc=core.pc, text=op.text, dst_range=dst_range,
                  src_range=src_range)
        if src_space == "hbm":
            self.hbm_bytes += size
        if dst_space == "hbm":
            self.hbm_bytes += size
        if target.chip != core.chip:
            self.link_bytes += size * self.mesh.hops(core.chip, target.chip)
        self.dmas[dma.seq] = dma
        if self.trace is not None:
            self.trace.on_dma_issue(dma)
        if "races" in self.config.checks:
            if dst_space == "vmem":
                target.add_in_flight("dst", dma)
            if src_space == "vmem":
                core.add_in_flight("src", dma)
        limit = 1 if self.config.dma_order == "fifo" else self.profile.dma_max_in_flight
        if self.engine_active[core.gid] < limit:
            self.engine_active[core.gid] += 1
            self._push(t + latency, DMA_BEGIN, dma)
        else:
            self.engine_queue[core.gid].append(dma)

    def _dma_resources(self, core: Core, target: Core, src_space: str, dst_space: str) -> list[int]:
        """The flow resources a DMA crosses.

        A chip's HBM is a resource only where its DMA engines together could
        outrun it; otherwise it can never be the bottleneck and leaving it out keeps
        the flows of different cores independent (much cheaper to re-divide). Remote
        writes into HBM are limited by the links long before the remote HBM.
        """
        resources = [self.engine_res[core.gid]]
        if self.hbm_shared and "hbm" in (src_space, dst_space):
            resources.append(self.hbm_res[core.chip])
        if target.chip != core.chip:
            resources += self.links.path_resources(core.chip, target.chip)
        elif target is not core:
            resources.append(self.sibling_res[core.chip])
        return resources

    def _memory(self, core: Core, space: str, lo: int = 0, hi: int = 0, write: bool = False) -> np.ndarray:
        """The array holding `space` of `core` (HBM: of its chip) for an access to [lo, hi)."""
        if space == "hbm":
            if write:
                return self._hbm.for_write(core.chip, lo, hi)
            return self._hbm.for_read(core.chip, lo, hi) if hi > lo else self._hbm.arrays[core.chip]
        return core.vmem if space == "vmem" else core.smem

    def _begin_dma(self, dma: Dma, t: int) -> None:
        dma.begun_at = t
        self.net.start(dma.seq, dma.size_bytes, dma.resources, t)
        self._schedule_flows()
        if self.trace is not None:
            self.trace.on_dma_begin(dma, t)
            self.trace.on_rates(self.net, t)

    def _schedule_flows(self) -> None:
        self.flow_version += 1
        nxt = self.net.next_completion()
        if nxt is not None:
            self._push(max(completion_cycle(nxt[0]), self.now), FLOWS, self.flow_version)

    def _complete_flows(self, t: int) -> None:
        done = self.net.pop_completed(t)
        if not done:
            # The completion lies a hair after t: look again one cycle later, never at t.
            self.flow_version += 1
            self._push(t + 1, FLOWS, self.flow_version)
            return
        for key in done:
            dma = self.dmas.pop(key)
            dma.done_at = t
            if self.trace is not None:
                self.trace.on_dma_done(dma, t)
            inner, n1, ds1, n2, ds2 = dma.shape
            write_block(self._memory(dma.dst_core, dma.dst_space, *dma.dst_range, write=True),
                        dma.dst_space.upper(), dma.dst_addr, inner, n1, ds1, n2, ds2, dma.data)
            if dma.dst_space != "hbm":
                dma.dst_core.note_write(dma.dst_space, *dma.dst_range)
            issuer = dma.src_core
            queue = self.engine_queue[issuer.gid]
            if queue:
                nxt = queue.pop(0)
                self._push(max(t, nxt.issued_at + nxt.latency_cycles), DMA_BEGIN, nxt)
            else:
                self.engine_active[issuer.gid] -= 1
            self._add_sem(issuer, dma.sem, dma.size_bytes, t, by_dma=True)
            if dma.rsem is not None:
                self._add_sem(dma.dst_core, dma.rsem, dma.size_bytes, t, by_dma=True)
        self._schedule_flows()
        if self.trace is not None:
            self.trace.on_rates(self.net, t)

    def _retire_dmas(self, core: Core, sem: int) -> None:
        """A successful wait on `sem` ends the race window of the DMAs it counted."""
        if core.in_flight:
            core.keep_in_flight(lambda role, d: d.done_at is None or (
                d.sem if d.src_core is core and role == "src" else (d.rsem if d.rsem is not None else d.sem)) != sem)

    def _race(self, core: Core, lo: int, hi: int, write: bool) -> None:
        for k, (role, dma) in enumerate(core.in_flight):
            rlo, rhi = dma.dst_range if role == "dst" else dma.src_range
            if lo < rhi and rlo < hi and (role == "dst" or write):
                raise core.race_trap(k, lo, hi)

    # -- faults and results --------------------------------------------------

    def decoded_op_text(self, pc: int) -> str | None:
        decoded = self.decoded.get(self.kernel.name)
        return decoded.ops[pc].text if decoded is not None and 0 <= pc < len(decoded.ops) else None

    def _fault(self, core: Core | None, kind: str, message: str, cycle: int | None = None) -> EmulatorFault:
        if core is None:
            return EmulatorFault(kind, message, cycle=cycle)
        return EmulatorFault(kind, f"kernel {self.kernel.name}: {message}", chip=core.chip, core=core.index,
                             cycle=core.t if cycle is None else cycle, pc=core.pc,
                             instruction=self.decoded_op_text(core.pc),
                             source=self.kernel.source_line(core.pc))

    def _deadlock(self, waiting: list[Core]) -> EmulatorFault:
        lines = []
        for core in waiting:
            w = core.waiting
            where = f"chip {core.chip} core {core.index} pc {core.pc:#06x}"
            src = self.kernel.source_line(core.pc)
            if w and w[0] == "barrier":
                what = f"waits at the {w[1]} barrier since cycle {w[2]}"
            elif w:
                what = (f"waits for semaphore {w[0]} to reach {w[1]} (it is {core.sems[w[0]]}) "
                        f"since cycle {w[2]}")
            else:
                what = "is stuck"
            lines.append(f"{where} `{self.decoded_op_text(core.pc)}` {what}" + (f" [{src}]" if src else ""))
        first = waiting[0]
        return EmulatorFault("deadlock", f"kernel {self.kernel.name}: no core can make progress and nothing "
                             f"is in flight; {len(waiting)} core(s) wait forever",
                             cycle=self.now, details=tuple(lines), chip=first.chip, core=first.index,
                             pc=first.pc, instruction=self.decoded_op_text(first.pc),
                             source=self.kernel.source_line(first.pc))

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
            region_cycles=dict(self.region_cycles), region_entries=dict(self.region_entries),
            dma_wait_cycles=dict(self.dma_wait_cycles),
            idle_cycles=self.idle_cycles)


# What the machine does for each global kind of the instruction table.
GLOBAL_OPS = {"halt": Machine._halt, "signal": Machine._signal, "signal_remote": Machine._signal_remote,
              "wait": Machine._wait, "barrier": Machine._barrier_op, "dma": Machine._dma_op,
              "dma_remote": Machine._dma_op}
