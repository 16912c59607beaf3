"""DMAs: descriptors, the engines that move them, and when their bytes land.

A DMA reads its 7-word descriptor from the issuing core's SMEM, checks both ends,
and takes its source bytes as they are when it is issued: VMEM and SMEM bytes are
copied then; HBM bytes are copied when it lands, straight into the destination,
unless a DMA landing before it writes some of them, which first makes it copy them
(weights in the shared mapping no chip writes never change). After the start latency (plus the
path latency to a remote target) its bytes flow through the `FlowNetwork`, sharing
each resource max-min fairly with the other flows; an engine moves at most
`dma_max_in_flight` descriptors at once (one with `dma_order = "fifo"`). When the
bytes have moved the DMA *lands*: its destination is written and its semaphores are
raised (the issuer's by the bytes sent, a remote target's by the bytes received).

In a timing-only run (`RunConfig.timing_only`) only SMEM and the i32 HBM buffers hold
data: a DMA between them copies bytes, any other moves nothing but still takes its
time. A DMA of computed bytes into them (from VMEM or another HBM buffer), which a
data run can record (`record_readbacks`), takes the recorded bytes instead.

When a DMA lands depends on the run's schedule (`RunConfig.schedule`): "normal" lands
it as soon as its bytes have moved; "shuffle" adds a seeded random delay to each
landing, so DMAs in flight together land in a permuted order; "late" holds every DMA
back until a core blocks waiting on a semaphore it raises and the DMAs held for it can
satisfy the wait (then only as many as it needs land, oldest first), or nothing else
can happen, so it lands as late as the program's synchronisation allows. A program that
is correctly synchronised computes the same bits under every schedule.
"""

from __future__ import annotations

import attrs
import numpy as np

from mkemu.emulator.core import UNSUPPLIED, Core
from mkemu.emulator.footprint import block_span
from mkemu.emulator.memory import Trap, block_view, read_block, write_block
from mkemu.isa.encoding import SPACES

DESC_WORDS = 7
# Event kinds of the machine's heap that concern DMAs.
DMA_BEGIN, FLOWS, LAND = 1, 2, 4


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
    kernel: object            # the kernel it was issued by (its source lines)
    dst_range: tuple[int, int] = (0, 0)
    src_range: tuple[int, int] = (0, 0)
    begun_at: int | None = None
    done_at: int | None = None
    knowledge: tuple[int, int] = (0, 0)   # DMAs its issuer knew had landed when it issued it (`Safety`: mask, base)
    cap: float | None = None  # a copy within one core's VMEM and SMEM: the profile's VMEM copy bandwidth

    @property
    def source(self) -> str | None:
        """The source line that issued it (looked up only when a message needs it)."""
        return self.kernel.source_line(self.pc)


class DmaMixin:
    """The machine's DMA side (mixed into `Machine`)."""

    def _start_dma(self, core: Core, op, t: int) -> None:
        """dma.start / dma.start.r: read the descriptor, check both ends, snapshot the source."""
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
        if self.safety is not None:
            self.safety.descriptor_read(core, daddr, 4 * DESC_WORDS)
        inner, n1, ss1, ds1, n2, ss2, ds2 = core.smem32[daddr >> 2:(daddr >> 2) + DESC_WORDS].tolist()
        if inner <= 0 or n1 <= 0 or n2 <= 0:
            raise Trap("bad-descriptor", f"DMA descriptor at SMEM {daddr} has shape {inner}x{n1}x{n2} "
                                         "(every count must be positive)")
        src_space, dst_space = SPACES[ssp], SPACES[dsp]
        src_addr, dst_addr = s[src], s[dst]
        src_range = _span(src_addr, inner, n1, ss1, n2, ss2)
        dst_range = _span(dst_addr, inner, n1, ds1, n2, ds2)
        pc = core.pc
        extents = self.kernel.extents.get(pc)
        if extents:
            for extent, (lo, hi) in zip(extents, (src_range, dst_range)):
                if extent is not None:
                    _check_extent(core, extent, lo, hi)
        src_size = self._space_size(core, src_space)
        if src_range[0] < 0 or src_range[1] > src_size:
            name = f"{src_space.upper()} (DMA source)"
            raise Trap("out-of-bounds", f"{name} access [{src_range[0]}, {src_range[1]}) is outside {name} "
                                        f"of {src_size} bytes")
        # Both ends are checked before any byte is copied: a block with huge counts
        # (over zero or tiny strides) is refused, never materialised.
        dst_size = self._space_size(target, dst_space)
        if dst_range[0] < 0 or dst_range[1] > dst_size:
            raise Trap("out-of-bounds", f"DMA destination {dst_space.upper()} [{dst_range[0]}, {dst_range[1]}) "
                                        f"is outside {dst_space.upper()} of {dst_size} bytes"
                                        + (f" on chip {target.chip} core {target.index}" if remote else ""))
        size = inner * n1 * n2
        if size > dst_range[1] - dst_range[0]:
            raise Trap("bad-descriptor", f"DMA descriptor at SMEM {daddr} moves {size} bytes ({inner}x{n1}x{n2}) "
                                         f"into a destination block of {dst_range[1] - dst_range[0]} bytes: its "
                                         f"rows overlap (dst_stride1 {ds1}, dst_stride2 {ds2}), so it writes "
                                         "some bytes more than once")
        config = self.config
        src_data = dst_data = True      # (only timing-only runs leave memories without bytes)
        if config.timing_only or config.record_readbacks:
            src_data = self._holds_data(src_space, *src_range)
            dst_data = self._holds_data(dst_space, *dst_range)
        computed = not src_data and dst_data
        lazy = False        # does the DMA copy its source bytes only when it lands?
        if config.timing_only and not (src_data and dst_data):
            # Nothing to move: one end holds no data in a timing-only run, except computed
            # bytes that land where control reads them: those a data run recorded.
            data = self._recorded_payload(core, inner * n1 * n2) if computed else None
        else:
            src_mem, base = self._memory(core, src_space, *src_range)
            data = None
            if src_space == "hbm":
                # HBM bytes are copied once, straight into the destination when the DMA
                # lands: those of the shared mapping (weights no chip wrote) never
                # change; a chip's own are snapshotted first if a landing DMA would
                # overwrite them before (`_keep_sources`).
                data = block_view(src_mem, src_addr - base, inner, n1, ss1, n2, ss2)
                lazy = data is not None and not self._hbm.unchanging(src_mem)
            if data is None:
                data = read_block(src_mem, src_addr - base, inner, n1, ss1, n2, ss2)
            if computed and config.record_readbacks:
                self.payloads_out[core.gid].append(data.tobytes())
        resources, latency, hops, cap = self._route(core, target, src_space == "hbm", dst_space == "hbm")
        self.dma_count += 1
        dma = Dma(seq=self.dma_count, src_core=core, dst_core=target, src_space=src_space,
                  dst_space=dst_space, dst_addr=dst_addr, shape=(inner, n1, ds1, n2, ds2), data=data,
                  size_bytes=size, sem=sem_id, rsem=rsem_id, resources=resources,
                  latency_cycles=latency, issued_at=t, pc=pc, text=op.text,
                  kernel=self.kernel, dst_range=dst_range,
                  src_range=src_range, cap=cap)
        if src_space == "hbm":
            self.hbm_bytes += size
        if dst_space == "hbm":
            self.hbm_bytes += size
        self.link_bytes += size * hops
        self.dmas[dma.seq] = dma
        if lazy:
            self.lazy_sources.setdefault(core.chip, {})[dma.seq] = dma
        if self.trace is not None:
            self.trace.on_dma_issue(dma)
        if self.safety is not None:
            self.safety.issued(dma, (src_addr, inner, n1, ss1, n2, ss2), (dst_addr, inner, n1, ds1, n2, ds2))
            if self.safety.late:
                for fault in self.safety.late:
                    self._defer_fault(fault)
                self.safety.late.clear()
        limit = 1 if self.config.dma_order == "fifo" else self.profile.dma_max_in_flight
        if self.engine_active[core.gid] < limit:
            self.engine_active[core.gid] += 1
            self._push(t + latency, DMA_BEGIN, dma)
        else:
            self.engine_queue[core.gid].append(dma)

    def _recorded_payload(self, core: Core, size: int) -> np.ndarray:
        queue = self.payloads_in[core.gid]
        if not queue:
            what = "this timing-only DMA copies computed bytes into SMEM or an i32 buffer, where control reads them"
            if not (self.payloads_fed or core.readbacks_fed):     # (no driver: a plain program)
                raise Trap("readback", f"{what}, and nothing supplies them: {UNSUPPLIED}")
            raise Trap("readback", f"{what}, and no recorded payload is left for it (a driver supplies them "
                                   "with Session.feed_payloads; the K3 programs record the data run's with "
                                   "--record-routing and replay them with --routing)")
        data = np.frombuffer(queue.pop(0), np.uint8)
        if data.size != size:
            raise Trap("readback", f"the recorded payload has {data.size} bytes, this DMA moves {size}: the "
                                   "record is from another program or run")
        return data

    def _holds_data(self, space: str, lo: int, hi: int) -> bool:
        """In a timing-only run only SMEM and the i32 HBM buffers (indices, tokens,
        positions) hold data; VMEM and every other HBM buffer are sizes without bytes."""
        if space == "smem":
            return True
        if space == "vmem":
            return False
        return any(b_lo <= lo and hi <= b_hi for b_lo, b_hi in self.data_regions)

    def _route(self, core: Core, target: Core, reads_hbm: bool,
               writes_hbm: bool) -> tuple[tuple[int, ...], int, int, float | None]:
        """(flow resources, start latency, chip hops, rate cap) of a DMA `core` issues into
        `target`'s memory; the same for every DMA between the two, so kept. A copy within
        one core's VMEM and SMEM is capped at the profile's VMEM copy bandwidth."""
        key = (core.gid, target.gid, reads_hbm, writes_hbm)
        route = self.routes.get(key)
        if route is None:
            route = self.routes[key] = (
                tuple(self._dma_resources(core, target, reads_hbm, writes_hbm)),
                self.profile.dma_start_latency_cycles + self._path_latency(core, target),
                self.mesh.hops(core.chip, target.chip),
                self.profile.vmem_bw_bytes_per_cycle if target is core and not (reads_hbm or writes_hbm) else None)
        return route

    def _dma_resources(self, core: Core, target: Core, reads_hbm: bool, writes_hbm: bool) -> list[int]:
        """The flow resources a DMA crosses: the issuer's engine; the HBM it reads (the
        issuer's chip's) and the HBM it writes (the target's chip's), once if they are
        one; the links or the core-to-core path to the target.

        A chip's HBM is a resource only where its DMA engines together could
        outrun it; otherwise its own engines never make it the bottleneck, and leaving
        it out keeps the flows of different cores independent (much cheaper to
        re-divide). Pushes from other chips into it are then not charged against it
        either (docs/architecture.md): bound by the links, they add little.
        """
        resources = [self.engine_res[core.gid]]
        if self.hbm_shared:
            if reads_hbm:
                resources.append(self.hbm_res[core.chip])
            if writes_hbm and not (reads_hbm and target.chip == core.chip):
                resources.append(self.hbm_res[target.chip])
        if target.chip != core.chip:
            resources += self.links.path_resources(core.chip, target.chip, core.index)
        elif target is not core:
            resources.append(self.sibling_res[core.chip])
        return resources

    def _space_size(self, core: Core, space: str) -> int:
        if space == "hbm":
            return self._hbm.size_bytes
        return (core.vmem if space == "vmem" else core.smem).size

    def _memory(self, core: Core, space: str, lo: int, hi: int, write: bool = False) -> tuple[np.ndarray, int]:
        """(array, address of its first byte) holding [lo, hi) of `space` of `core`
        (HBM: of its chip)."""
        if space == "hbm":
            return self._hbm.for_write(core.chip, lo, hi) if write else self._hbm.for_read(core.chip, lo, hi)
        return (core.vmem if space == "vmem" else core.smem), 0

    def _begin_dma(self, dma: Dma, t: int) -> None:
        dma.begun_at = t
        self.net.start(dma.seq, dma.size_bytes, dma.resources, t, dma.cap)
        self._schedule_flows()
        if self.trace is not None:
            self.trace.on_dma_begin(dma, t)
            self.trace.on_rates(self.net, t)

    def _schedule_flows(self) -> None:
        self.flow_version += 1
        cycle = self.net.next_completion_cycle()
        if cycle is not None:
            self._push(max(cycle, self.now), FLOWS, self.flow_version)

    def _complete_flows(self, t: int) -> None:
        done = self.net.pop_completed(t)
        if not done:
            # The completion lies a hair after t: look again one cycle later, never at t.
            self.flow_version += 1
            self._push(t + 1, FLOWS, self.flow_version)
            return
        for key in done:
            dma = self.dmas.pop(key)
            issuer = dma.src_core
            queue = self.engine_queue[issuer.gid]
            if queue:
                nxt = queue.pop(0)
                self._push(max(t, nxt.issued_at + nxt.latency_cycles), DMA_BEGIN, nxt)
            else:
                self.engine_active[issuer.gid] -= 1
            schedule = self.config.schedule
            if schedule == "normal":
                self._land(dma, t)
            elif schedule == "shuffle":
                self._push(t + int(self.schedule_rng.integers(0, self.shuffle_cycles + 1)), LAND, dma)
            else:
                self.held.append(dma)
                for core, sem in ((dma.src_core, dma.sem), (dma.dst_core, dma.rsem)):
                    if sem is not None:
                        self.release_for(core, sem, t)
        self._schedule_flows()
        if self.trace is not None:
            self.trace.on_rates(self.net, t)

    def _land(self, dma: Dma, t: int) -> None:
        """The DMA's bytes arrive: its destination is written and its semaphores raised."""
        dma.done_at = t
        if self.safety is not None:
            self.safety.landed(dma)
        if self.trace is not None:
            self.trace.on_dma_done(dma, t)
        if dma.data is not None:
            lazy = self.lazy_sources.get(dma.src_core.chip)
            if dma.dst_space == "hbm":
                self._keep_sources(dma.dst_core.chip, *dma.dst_range)
            if lazy:
                lazy.pop(dma.seq, None)
            # (The destination was checked to lie inside its memory when the DMA was issued.)
            mem, base = self._memory(dma.dst_core, dma.dst_space, *dma.dst_range, write=True)
            write_block(mem, dma.dst_addr - base, *dma.shape, dma.data)
            if dma.dst_space != "hbm":
                dma.dst_core.note_write(dma.dst_space, *dma.dst_range)
        self._add_sem(dma.src_core, dma.sem, dma.size_bytes, t, by_dma=True, raiser=dma)
        if dma.rsem is not None:
            self._add_sem(dma.dst_core, dma.rsem, dma.size_bytes, t, by_dma=True, raiser=dma)

    def _keep_sources(self, chip: int, lo: int, hi: int) -> None:
        """HBM bytes [lo, hi) of `chip` are about to be written: the DMAs in flight that
        read some of them (and copy them only when they land) take their bytes now."""
        lazy = self.lazy_sources.get(chip)
        if not lazy:
            return
        for seq in [seq for seq, d in lazy.items() if d.src_range[0] < hi and lo < d.src_range[1]]:
            d = lazy.pop(seq)
            d.data = d.data.copy()

    # -- the late schedule: a DMA lands only when something waits for it ------------

    def _release(self, dma: Dma, t: int) -> None:
        self.held.remove(dma)
        self._land(dma, t)

    def release_for(self, core: Core, sem: int, t: int) -> None:
        """If `core` blocks on `sem` and the held DMAs that raise it can satisfy the wait,
        land them, oldest first, until it is satisfied; if they cannot, none lands yet
        (a DMA that only part of a wait needs is no more needed than the others)."""
        waiting = core.waiting
        if waiting is None or waiting[0] != sem:
            return
        # (A push to the issuing core itself on sem == rsem raises it twice.)
        raises = [((d.src_core is core and d.sem == sem) + (d.dst_core is core and d.rsem == sem), d)
                  for d in self.held]
        held = [d for n, d in raises if n]
        if sum(n * d.size_bytes for n, d in raises) < waiting[1] - core.sems[sem]:
            return
        for dma in sorted(held, key=lambda d: d.seq):
            if core.waiting is None or core.waiting[0] != sem:
                return
            self._release(dma, t)

    def release_all(self, t: int) -> None:
        """Nothing else can happen: every held DMA lands, oldest first."""
        for dma in sorted(self.held, key=lambda d: d.seq):
            self._release(dma, t)

    # -- faults and results --------------------------------------------------



def _span(addr: int, inner: int, n1: int, s1: int, n2: int, s2: int) -> tuple[int, int]:
    """`block_span`, with the common block (one plane of rows going up) done inline."""
    if n2 == 1 and s1 >= 0:
        return addr, addr + (n1 - 1) * s1 + inner
    return block_span(addr, inner, n1, s1, n2, s2)


def _check_extent(core: Core, extent, lo: int, hi: int) -> None:
    """Fault unless the DMA's bytes [lo, hi) lie inside the buffer the compiler named
    (an HBM parameter's address comes from the launch arguments in SMEM)."""
    start = core.extent_start(extent)
    if lo < start or hi > start + extent.size:
        raise Trap("out-of-bounds", extent.describe(lo, hi, start - extent.lo))
