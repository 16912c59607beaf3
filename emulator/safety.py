"""Schedule safety: races judged in simulated time, by the exact bytes touched.

A DMA is *in flight for* a core from the cycle it is issued until that core knows it
has landed. A core knows a DMA has landed when it waits on a semaphore the DMA
counted (the issuer's byte count, or the receiver's), or learns it from a core that
knew: a semaphore signal carries what the signaller knew to the core whose wait it
satisfies, a DMA carries what its issuer knew when it issued it to whoever waits on
its semaphores (so the news travels along chains of pushes, as in a ring), a barrier
shares what every member knew. A semaphore keeps what each arrival (a DMA landing, a
signal) carried with its amount; a wait takes its amount from the oldest arrivals
left and learns what those carried, no more (a wait of 0 takes and learns nothing).
Nothing else orders anything
(not how long ago a DMA was issued, not the order the emulator happens to run cores
in).

What races, in simulated time:

- a core's own access (vector load/store, weight-tile load, scalar load/store) to its
  VMEM or SMEM bytes that a DMA in flight for it writes, or a write to bytes such a
  DMA reads. Checked by the compiled loop against `Core.races` as each access issues,
  and, because a core runs its local instructions ahead of the machine's clock,
  again when a DMA issued by another core lands in its list: every access of the
  core's current run-ahead logged at or after the DMA's issue cycle is checked then;
- two DMAs on the same memory (a core's VMEM or SMEM, a chip's HBM) where at least
  one writes the bytes they share and the later one's issuer did not know the earlier
  one had landed: two copies into one VMEM buffer, a copy reading what another is
  still writing, a copy into HBM another is still reading. Two DMAs both writing the
  same HBM bytes are not reported: SPMD programs commonly have every core of a chip
  store the same result there (the last to land wins, deterministically).

A DMA leaves a memory's list once the memory's owner knows it landed (the core for
its VMEM and SMEM; for HBM, every core of the chip for a DMA writing it, since any of
them may read those bytes next, and the DMA's issuer for one reading it). Every report
names both sides: chip, core, cycle, pc, instruction and source line of the access and
of the DMA's start.
"""

from __future__ import annotations

import bisect
from collections import deque

from mkemu.emulator import loop as lp
from mkemu.emulator.memory import Trap


class Entry:
    """A DMA's footprint on one memory: (dma, writes?, block)."""

    __slots__ = ("dma", "write", "block", "lo", "hi")

    def __init__(self, dma, write: bool, block: tuple[int, int, int, int, int, int], span: tuple[int, int]):
        self.dma = dma
        self.write = write
        self.block = block
        self.lo, self.hi = span      # the block's outer [lo, hi) (`footprint.block_span`)


class Safety:
    def __init__(self, cores):
        self.cores = cores
        # A race found after the fact (`_check_run_ahead`) lies at a later cycle than the
        # DMA's issue: it waits here for the machine to raise it when simulated time
        # reaches its cycle (`Machine._defer_fault`), so that a fault of any core between
        # the two is reported first.
        self.late: list = []
        self.overlap = lp.compiled("overlap")
        self.logged_conflict = lp.compiled("logged_conflict")
        self.dma_conflict = lp.compiled("dma_conflict")
        self.chip_cores: dict[int, list[int]] = {}        # chip -> its cores' ids
        for core in self.cores:
            self.chip_cores.setdefault(core.chip, []).append(core.gid)
        self.launch()

    def launch(self, base: int = 0) -> None:
        """A kernel launch starts with nothing in flight and nothing to know; its DMAs
        are numbered from base + 1.

        What a core knows, what a semaphore carries and which DMAs are still listed
        are sets of this launch's DMAs held as bit masks (bit seq - base): their
        unions and differences are single integer operations."""
        self.base = base
        self.known = [0 for _ in self.cores]              # per core: the DMAs it knows landed
        # (core, semaphore) -> its arrivals not yet taken, oldest first: [amount, the DMAs it carries]
        self.sem_known: dict[tuple[int, int], deque[list[int]]] = {}
        self.hbm_reads: dict[int, list[Entry]] = {}       # chip -> DMAs reading its HBM
        self.hbm_issued: dict[int, dict[int, tuple[int, Entry]]] = {}   # issuer -> seq -> (chip, entry) of those
        # A read leaves its list when its issuer knows it landed; a write only when every
        # core of the written chip knows (any of them may read those bytes next).
        self.hbm_writes: dict[int, Listed] = {}           # chip -> DMAs writing its HBM
        self.hbm_write_bits: dict[int, int] = {}          # ... the same DMAs as a mask
        self.live: dict[int, int] = {}                    # seq -> entries of it still listed
        self.live_bits = 0                                # ... the same DMAs as a mask
        self.rebase_at = base + REBASE_SPAN               # renumber the masks after this DMA
        for core in self.cores:
            if core.in_flight or core.rows_of:     # (else already clear: `Core.drop_in_flight`)
                core.clear_in_flight()

    # -- DMAs --------------------------------------------------------------------

    def descriptor_read(self, core, addr: int, size: int) -> None:
        """A DMA's issue reads its descriptor, SMEM [addr, addr + size): a race if a DMA
        in flight for the issuing core still writes those bytes (the descriptor read
        would be stale in one schedule and fresh in another)."""
        if not core.smem_writes:
            return
        k = self.dma_conflict(core.races, len(core.in_flight), core.live_from, SPACE_CODES["smem"], False, addr,
                              size, 1, 0, 1, 0)
        if k >= 0:
            raise core.race_trap(k, addr, addr + size, "this DMA's descriptor at")

    def issued(self, dma, src_block, dst_block) -> None:
        """Check a new DMA against every DMA it may race with (its source, then its
        destination), then list it. (Written out side by side, not as a loop over the
        two: it runs for every DMA.)"""
        issuer, target = dma.src_core, dma.dst_core
        known, base = self.known[issuer.gid], self.base
        src_hbm, dst_hbm = dma.src_space == "hbm", dma.dst_space == "hbm"
        if src_hbm:
            listed = self.hbm_writes.get(issuer.chip)
            if listed:
                self._check_hbm(listed.meeting(*dma.src_range), False, issuer, src_block, dma, known)
        elif issuer.rows_of:
            self._check_rows(issuer, dma.src_space, False, src_block, dma, known)
        if dst_hbm:
            # (Two writes are not reported: a write is checked against the reads only.)
            reads = self.hbm_reads.get(target.chip)
            if reads:
                self._check_hbm(reads, True, target, dst_block, dma, known)
        elif target.rows_of:
            self._check_rows(target, dma.dst_space, True, dst_block, dma, known)
        seq = dma.seq
        entry = Entry(dma, False, src_block, dma.src_range)
        if src_hbm:
            self.hbm_reads.setdefault(issuer.chip, []).append(entry)
            self.hbm_issued.setdefault(issuer.gid, {})[seq] = (issuer.chip, entry)
        else:
            issuer.add_in_flight(entry, dma.src_space)
        entry = Entry(dma, True, dst_block, dma.dst_range)
        if dst_hbm:
            # Only the chip's own cores read its HBM: a write is listed until they all
            # know it landed (a core that was only told by a signal sent before the
            # issuer waited does not know).
            chip = target.chip
            self.hbm_writes.setdefault(chip, Listed()).add(entry)
            self.hbm_write_bits[chip] = self.hbm_write_bits.get(chip, 0) | 1 << (seq - base)
        else:
            if target is not issuer:
                self._check_run_ahead(target, entry, dma.dst_space)
            target.add_in_flight(entry, dma.dst_space)
        self.live[seq] = 2
        self.live_bits |= 1 << (seq - base)
        dma.knowledge = (known, base)
        if seq > self.rebase_at:
            self._rebase(seq)

    def _check_hbm(self, entries, write: bool, owner, block, dma, known: int) -> None:
        """A race if one of the listed HBM `entries` the issuer did not know had landed
        shares bytes with `block` (new DMA `dma`'s source or destination)."""
        lo, hi = dma.dst_range if write else dma.src_range
        base = self.base
        for entry in entries:
            if entry.lo < hi and lo < entry.hi \
                    and not known >> (entry.dma.seq - base) & 1 and self.overlap(*entry.block, *block):
                raise Trap("race", _dma_race(write, "hbm", owner, entry, dma))

    def _check_rows(self, owner, space: str, write: bool, block, dma, known: int) -> None:
        """The same for the DMAs in flight for `owner`'s VMEM or SMEM (its `races` rows,
        by the compiled scan)."""
        n, code, base = len(owner.in_flight), SPACE_CODES[space], self.base
        k = self.dma_conflict(owner.races, n, owner.live_from, code, write, *block)
        while k >= 0:
            entry = owner.in_flight[k][0]
            if not known >> (entry.dma.seq - base) & 1:
                raise Trap("race", _dma_race(write, space, owner, entry, dma))
            k = self.dma_conflict(owner.races, n, k + 1, code, write, *block)

    def landed(self, dma) -> None:
        """A DMA's bytes are in place: its arrival on the semaphores it raises carries
        that, and what its issuer knew when it issued it."""
        known, base = dma.knowledge
        carried = known >> (self.base - base) | 1 << (dma.seq - self.base)
        self._arrive((dma.src_core.gid, dma.sem), dma.size_bytes, carried)
        if dma.rsem is not None:
            self._arrive((dma.dst_core.gid, dma.rsem), dma.size_bytes, carried)
        dma.knowledge = (0, 0)

    def _arrive(self, key: tuple[int, int], amount: int, carried: int) -> None:
        queue = self.sem_known.get(key)
        if queue is None:
            queue = self.sem_known[key] = deque()
        queue.append([amount, carried])

    def _rebase(self, last: int) -> None:
        """Number the masks' bits from the oldest DMA still listed (there is one: DMA
        `last` was just listed); the DMAs before it are in no list and never matter
        again. Keeps a long launch's masks as short as the span of DMAs in flight, not
        as long as the launch."""
        live = self.live_bits
        shift = (live & -live).bit_length() - 1
        self.base += shift
        self.known = [mask >> shift for mask in self.known]
        for queue in self.sem_known.values():
            for arrival in queue:
                arrival[1] >>= shift
        self.hbm_write_bits = {chip: mask >> shift for chip, mask in self.hbm_write_bits.items()}
        self.live_bits = live >> shift
        self.rebase_at = last + REBASE_SPAN

    # -- synchronisation -----------------------------------------------------------

    def waited(self, core, sem: int, amount: int) -> None:
        """`core` took `amount` from `sem`: from its oldest arrivals left, and it knows
        what those carried. (An arrival it takes only part of stays, with the rest of
        its amount, for the next wait, which learns what it carried too.)"""
        queue = self.sem_known.get((core.gid, sem))
        carried = 0
        while amount > 0 and queue:
            arrival = queue[0]
            carried |= arrival[1]
            if arrival[0] > amount:
                arrival[0] -= amount
                break
            amount -= arrival[0]
            queue.popleft()
        if carried:
            self._learn(core, carried)

    def signal_payload(self, core) -> tuple[int, int]:
        """What a signal sent by `core` now carries to its target: its mask and the
        numbering it is in (a remote signal may arrive after a renumbering)."""
        return self.known[core.gid], self.base

    def signal_arrived(self, target, sem: int, amount: int, payload: tuple[int, int]) -> None:
        """A signal of `amount` raised `sem` of `target`: that arrival carries `payload`
        (`signal_payload` of its sender). A signal of 0 adds nothing a wait could take."""
        if amount:
            known, base = payload
            if known and base != self.base:
                known >>= self.base - base
            self._arrive((target.gid, sem), amount, known)

    def barrier(self, members) -> None:
        """Every member knows what any member knew."""
        union = 0
        for core in members:
            union |= self.known[core.gid]
        for core in members:
            self._learn(core, union)

    def _learn(self, core, seqs: int) -> None:
        """`core` now knows the DMAs of mask `seqs` landed (those still listed matter)."""
        mine = self.known[core.gid]
        new = seqs & ~mine & self.live_bits
        if not new:
            return
        self.known[core.gid] = mine | new
        base = self.base
        if core.rows_of:
            for seq, entries in core.drop_in_flight(new, base):
                self._unlisted(seq, entries)
        issued = self.hbm_issued.get(core.gid)
        if issued:
            for seq in listed_in(new, base, issued):
                chip, e = issued.pop(seq)
                self.hbm_reads[chip].remove(e)
                self._unlisted(seq, 1)
        bits = self.hbm_write_bits.get(core.chip)
        if bits and new & bits:
            all_know = -1
            for gid in self.chip_cores[core.chip]:
                if not self.cores[gid].halted:      # (a halted core issues nothing more)
                    all_know &= self.known[gid]
            if all_know & bits:
                self.hbm_write_bits[core.chip] = bits & ~all_know
                for e in self.hbm_writes[core.chip].remove_if(lambda e: all_know >> (e.dma.seq - base) & 1):
                    self._unlisted(e.dma.seq, 1)

    def _unlisted(self, seq: int, entries: int) -> None:
        """The lists no longer hold `entries` of DMA `seq`'s entries; a DMA no list holds
        is forgotten."""
        left = self.live.get(seq, 0) - entries
        if left > 0:
            self.live[seq] = left
        else:
            self.live.pop(seq, None)
            self.live_bits &= ~(1 << (seq - self.base))

    # -- a core that ran ahead -----------------------------------------------------

    def _check_run_ahead(self, core, entry: Entry, space: str) -> None:
        """Accesses `core` already made, in its current run-ahead, at or after the
        cycle another core issued this DMA into its memory."""
        n = int(core.I[lp.H_NLOG])
        if not n:
            return
        k = self.logged_conflict(core.access_log, n, entry.dma.issued_at, SPACE_CODES[space], entry.write,
                                 *entry.block)
        if k >= 0:
            time, pc, _, addr, stride, rows, lo_off, hi_off, write = core.access_log[k].tolist()
            self.late.append(core.logged_race(entry, space, time, pc, addr, stride, rows, lo_off, hi_off, write))


class Listed:
    """Entries ordered by their outer start, for the ones meeting a byte range."""

    __slots__ = ("los", "entries", "longest")

    def __init__(self):
        self.los: list[int] = []
        self.entries: list[Entry] = []
        self.longest = 0          # the longest outer span ever added

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entry: Entry) -> None:
        i = bisect.bisect_right(self.los, entry.lo)
        self.los.insert(i, entry.lo)
        self.entries.insert(i, entry)
        self.longest = max(self.longest, entry.hi - entry.lo)

    def meeting(self, lo: int, hi: int) -> list[Entry]:
        """The entries whose outer span may meet [lo, hi), oldest first."""
        end = bisect.bisect_left(self.los, hi)
        start = bisect.bisect_right(self.los, lo - self.longest, 0, end)
        if start == end:
            return []
        found = [e for e in self.entries[start:end] if e.hi > lo]
        found.sort(key=lambda e: e.dma.seq)
        return found

    def remove_if(self, drop) -> list[Entry]:
        """Remove the entries `drop` holds for and return them."""
        kept, gone = [], []
        for e in self.entries:
            (gone if drop(e) else kept).append(e)
        if gone:
            self.entries = kept
            self.los = [e.lo for e in kept]
        return gone


def listed_in(mask: int, base: int, listed: dict) -> list[int]:
    """The keys of `listed` (DMA seqs) whose bit (seq - base) is set in `mask`, found by
    walking the shorter of the two: the mask's set bits or the keys."""
    if mask.bit_count() < len(listed):
        seqs = []
        while mask:
            low = mask & -mask
            seq = base + low.bit_length() - 1
            if seq in listed:
                seqs.append(seq)
            mask ^= low
        return seqs
    return [seq for seq in listed if mask >> (seq - base) & 1]


SPACE_CODES = {"vmem": 0, "smem": 1}
REBASE_SPAN = 8192   # DMAs between renumberings of the masks (`Safety._rebase`)


def _dma_race(write: bool, space: str, owner, entry: Entry, dma) -> str:
    """The report of new DMA `dma` racing with listed `entry` on `space` of `owner`
    (`dma` writes there if `write`, else reads)."""
    what = ("both write" if write and entry.write else "it writes what the earlier one still reads"
            if write else "it reads what the earlier one still writes")
    where = f"{space.upper()} of chip {owner.chip}" + ("" if space == "hbm" else f" core {owner.index}")
    lo, hi = dma.dst_range if write else dma.src_range
    extents = dma.kernel.extents.get(dma.pc)
    extent = extents[1 if write else 0] if extents else None
    named = dma.src_core.buffer_named(extent, lo, hi) if extent is not None else ""
    return (f"this DMA and an earlier one in flight share bytes of {where} and {what} (this DMA's are "
            f"{space.upper()} [{lo}, {hi}){named}): "
            f"{describe_dma(entry.dma)}; this DMA's issuer did not know the earlier one had landed (nothing "
            f"ordered them: a wait on its semaphore, a signal or barrier from a core that knew)")


def describe_dma(dma) -> str:
    src = dma.source     # (in brackets, as a deadlock's lines quote it: a line may end in a comma)
    return (f"`{dma.text}` of chip {dma.src_core.chip} core {dma.src_core.index} "
            f"(pc {dma.pc:#06x}, issued at cycle {dma.issued_at}){f' [{src}]' if src else ''}")
