"""Fluid model of bandwidth sharing: flows of bytes through shared resources.

Owns the answer to "how fast does each transfer go right now, and when does it end".
A *resource* is anything with a bandwidth (bytes per cycle): a chip's HBM, a core's
DMA engine, one directed mesh link. A *flow* moves `size_bytes` through an ordered
set of resources (all at the same rate) and may carry its own rate cap.

Rates are the max-min fair allocation, found by progressive filling (water-filling):
all unfrozen flows grow at the same rate; when a resource runs out of capacity the
flows crossing it freeze at that rate, and when a flow reaches its cap it freezes
there; repeat until every flow is frozen. Rates are piecewise constant: they are
recomputed only when a flow starts or ends, and only over the flows that share
resources (transitively) with the one that changed — max-min fairness of a disjoint
union is the union of the per-part allocations, so that is exact, not a heuristic.

A DMA engine that round-robins its outstanding descriptors is simply one more
resource (capacity = the engine's bytes per cycle) that every descriptor of that
engine crosses: max-min fairness gives each descriptor an equal share unless it is
held back elsewhere, in which case the others get what it leaves. So "more in flight
means all land later" falls out with no extra machinery.

Time is float cycles. The network keeps its own clock: `advance(now)` drains bytes up
to `now`, ending flows at their exact (fractional) completion times and re-dividing
bandwidth at those instants, so a caller may advance past a completion without
losing accuracy. The event loop works in integer cycles: schedule the completion
event at `completion_cycle(t)` (a ceiling that ignores float noise of a few ulps),
and at that cycle call `pop_completed(cycle)` to collect the flows that have ended.

Determinism: flows are ordered by a start sequence number, resources by id; there
are no sets of objects and no randomness, so the same calls give identical floats.
Ties between completions at the same time are broken by start order.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Sequence

#: A flow whose remaining bytes are at most this fraction of its size is done.
DONE_FRACTION = 1e-6


def completion_cycle(time_cycles: float) -> int:
    """The integer cycle at which an event for a float completion time should fire.

    The ceiling of `time_cycles`, except that a value a few ulps above an integer
    (float noise from summing rates) rounds down to that integer. The tolerance is
    a few ulps (at least 1e-9 of a cycle), not relative: late in a long run a real
    fraction of a cycle can be smaller than a relative tolerance.
    """
    nearest = round(time_cycles)
    if abs(time_cycles - nearest) <= max(64 * math.ulp(max(1.0, abs(time_cycles))), 1e-9):
        return int(nearest)
    return math.ceil(time_cycles)


class _Resource:
    __slots__ = (
        "rid",
        "name",
        "capacity",
        "flows",
        "sum_rate",
        "t_ref",
        "settled_bytes",
        "busy_since",
        "settled_busy",
    )

    def __init__(self, rid: int, name: str, capacity: float):
        self.rid = rid
        self.name = name
        self.capacity = capacity
        # seq -> flow, in start order (dicts keep insertion order).
        self.flows: dict[int, _Flow] = {}
        self.sum_rate = 0.0
        self.t_ref = 0.0
        self.settled_bytes = 0.0
        self.busy_since = 0.0
        self.settled_busy = 0.0


class _Flow:
    __slots__ = ("key", "seq", "size", "resources", "cap", "rate", "rem", "t_ref", "version", "done_at")

    def __init__(self, key, seq: int, size: int, resources: tuple[int, ...], cap: float | None, now: float):
        self.key = key
        self.seq = seq
        self.size = size
        self.resources = resources
        self.cap = cap
        self.rate = 0.0
        # Remaining bytes as of t_ref; remaining at t is rem - rate * (t - t_ref).
        self.rem = float(size)
        self.t_ref = now
        # Bumped whenever the rate changes; older heap entries become stale.
        self.version = 0
        self.done_at: float | None = None

    def settle(self, t: float) -> None:
        if t != self.t_ref:
            self.rem = max(self.rem - self.rate * (t - self.t_ref), 0.0)
            self.t_ref = t

    def nearly_done(self) -> bool:
        return self.rem <= DONE_FRACTION * self.size


class FlowNetwork:
    """Resources with capacities and the flows crossing them, advanced in float cycles."""

    def __init__(self) -> None:
        self._resources: list[_Resource] = []
        self._flows: dict[Hashable, _Flow] = {}  # active and completed-not-popped, by key
        self._by_seq: dict[int, _Flow] = {}  # active flows only, in start order
        self._completed: list[_Flow] = []  # ended, not yet popped, in completion order
        self._heap: list[tuple[float, int, int]] = []  # (predicted end, seq, version)
        self._next_seq = 0
        self._now = 0.0

    # -- resources ---------------------------------------------------------------

    def add_resource(self, name: str, capacity_bytes_per_cycle: float) -> int:
        """Register a resource and return its id (0, 1, 2, ... in call order)."""
        capacity = float(capacity_bytes_per_cycle)
        if not capacity > 0 or math.isinf(capacity):
            raise ValueError(f"resource {name!r}: capacity must be a positive finite number, got {capacity_bytes_per_cycle!r}")
        rid = len(self._resources)
        res = _Resource(rid, name, capacity)
        res.t_ref = self._now
        self._resources.append(res)
        return rid

    def resource_name(self, resource_id: int) -> str:
        return self._resources[resource_id].name

    def capacity(self, resource_id: int) -> float:
        return self._resources[resource_id].capacity

    @property
    def num_resources(self) -> int:
        return len(self._resources)

    def bytes_through(self, resource_id: int) -> float:
        """Bytes carried by a resource up to the network's clock."""
        res = self._resources[resource_id]
        return res.settled_bytes + res.sum_rate * (self._now - res.t_ref)

    def busy_cycles(self, resource_id: int) -> float:
        """Cycles (up to the network's clock) during which at least one flow crossed it."""
        res = self._resources[resource_id]
        busy = res.settled_busy
        if res.flows:
            busy += self._now - res.busy_since
        return busy

    def load(self, resource_id: int) -> float:
        """Sum of the current rates of the flows crossing a resource (bytes per cycle)."""
        return self._resources[resource_id].sum_rate

    # -- flows -------------------------------------------------------------------

    @property
    def now(self) -> float:
        """The network's clock: the last time passed to `advance` (or `start`)."""
        return self._now

    def start(
        self,
        flow_key: Hashable,
        size_bytes: int,
        resources: Sequence[int],
        now: float,
        cap_bytes_per_cycle: float | None = None,
    ) -> None:
        """Start a flow at time `now` (advancing the network to `now` first).

        A flow of 0 bytes completes at `now`. A flow must cross at least one resource
        or carry a cap, else its rate would be unbounded.
        """
        if flow_key in self._flows:
            raise ValueError(f"flow {flow_key!r} is already in the network")
        if size_bytes < 0:
            raise ValueError(f"flow {flow_key!r}: size is {size_bytes} bytes, must be >= 0")
        rids = tuple(int(r) for r in resources)
        for r in rids:
            if not 0 <= r < len(self._resources):
                raise ValueError(f"flow {flow_key!r}: no resource {r} (have {len(self._resources)})")
        if len(set(rids)) != len(rids):
            raise ValueError(f"flow {flow_key!r}: resource listed twice in {list(rids)}")
        cap = None
        if cap_bytes_per_cycle is not None:
            cap = float(cap_bytes_per_cycle)
            if not cap > 0 or math.isinf(cap):
                raise ValueError(f"flow {flow_key!r}: cap must be a positive finite number, got {cap_bytes_per_cycle!r}")
        if not rids and cap is None:
            raise ValueError(f"flow {flow_key!r} crosses no resource and has no cap: its rate would be unbounded")

        self.advance(now)
        flow = _Flow(flow_key, self._next_seq, size_bytes, rids, cap, self._now)
        self._next_seq += 1
        self._flows[flow_key] = flow
        if size_bytes == 0:
            flow.done_at = self._now
            flow.rem = 0.0
            self._completed.append(flow)
            return
        self._by_seq[flow.seq] = flow
        if not rids:
            self._set_rate(flow, cap, self._now)
            return
        for r in rids:
            res = self._resources[r]
            if not res.flows:
                res.busy_since = self._now
            res.flows[flow.seq] = flow
        self._rebalance(rids, self._now)

    def advance(self, now: float) -> None:
        """Drain bytes up to time `now`, ending flows (and re-dividing rates) on the way."""
        if now < self._now:
            raise ValueError(f"time went backwards: network is at cycle {self._now}, asked for {now}")
        heap = self._heap
        while heap:
            t, seq, version = heap[0]
            flow = self._by_seq.get(seq)
            if flow is None or flow.version != version:
                heapq.heappop(heap)
                continue
            if t > now:
                break
            # Every flow predicted to end at exactly t ends now, in start order.
            ending: list[_Flow] = []
            while heap and heap[0][0] == t:
                _, seq, version = heapq.heappop(heap)
                flow = self._by_seq.get(seq)
                if flow is not None and flow.version == version:
                    ending.append(flow)
            self._now = t
            touched: dict[int, None] = {}
            for flow in sorted(ending, key=lambda f: f.seq):
                flow.settle(t)
                self._end(flow, t)
                for r in flow.resources:
                    touched[r] = None
            if touched:
                self._rebalance(tuple(touched), t)
        self._now = float(now)
        if len(heap) > 64 and len(heap) > 4 * len(self._by_seq):
            self._compact_heap()

    def next_completion(self) -> tuple[float, Hashable] | None:
        """Earliest completion (time, key), counting ended flows not yet popped; None if idle.

        Ties go to the flow started first.
        """
        best: tuple[float, int, _Flow] | None = None
        if self._completed:
            f = min(self._completed, key=lambda f: (f.done_at, f.seq))
            best = (f.done_at, f.seq, f)
        heap = self._heap
        while heap:
            t, seq, version = heap[0]
            flow = self._by_seq.get(seq)
            if flow is None or flow.version != version:
                heapq.heappop(heap)
                continue
            if best is None or (t, seq) < best[:2]:
                best = (t, seq, flow)
            break
        if best is None:
            return None
        return best[0], best[2].key

    def pop_completed(self, now: float) -> list[Hashable]:
        """Advance to `now` and remove every flow that has ended by then.

        Returns their keys ordered by completion time, then start order.
        """
        self.advance(now)
        done = sorted(self._completed, key=lambda f: (f.done_at, f.seq))
        self._completed = []
        for flow in done:
            del self._flows[flow.key]
        return [flow.key for flow in done]

    def rate(self, flow_key: Hashable) -> float:
        """Current rate in bytes per cycle (0 once the flow has ended)."""
        return self._flows[flow_key].rate

    def remaining(self, flow_key: Hashable) -> float:
        """Bytes still to move as of the network's clock."""
        flow = self._flows[flow_key]
        if flow.done_at is not None:
            return 0.0
        return max(flow.rem - flow.rate * (self._now - flow.t_ref), 0.0)

    def completion_time(self, flow_key: Hashable) -> float:
        """When the flow ends (or ended) if rates stay as they are now."""
        flow = self._flows[flow_key]
        if flow.done_at is not None:
            return flow.done_at
        return flow.t_ref + flow.rem / flow.rate

    def active(self) -> list[Hashable]:
        """Keys of the flows still moving bytes, in start order."""
        return [flow.key for flow in self._by_seq.values()]

    # -- internals ---------------------------------------------------------------

    def _end(self, flow: _Flow, t: float) -> None:
        flow.rem = 0.0
        flow.rate = 0.0
        flow.version += 1
        flow.done_at = t
        del self._by_seq[flow.seq]
        for r in flow.resources:
            res = self._resources[r]
            del res.flows[flow.seq]
            if not res.flows:
                res.settled_busy += t - res.busy_since
        self._completed.append(flow)

    def _set_rate(self, flow: _Flow, rate: float, t: float) -> None:
        flow.settle(t)
        flow.rate = rate
        flow.version += 1
        heapq.heappush(self._heap, (t + flow.rem / rate, flow.seq, flow.version))

    def _component(self, seeds: Sequence[int]) -> tuple[list[_Resource], list[_Flow]]:
        """Resources and active flows connected to the seed resources through shared flows.

        The order of the result does not matter: `_water_fill` breaks every tie by
        resource id or start order.
        """
        resources = self._resources
        comp_res: list[_Resource] = []
        comp_flows: list[_Flow] = []
        seen_res: set[int] = set()
        seen_flows: set[int] = set()
        stack = list(seeds)
        while stack:
            r = stack.pop()
            if r in seen_res:
                continue
            seen_res.add(r)
            res = resources[r]
            comp_res.append(res)
            for seq, flow in res.flows.items():
                if seq not in seen_flows:
                    seen_flows.add(seq)
                    comp_flows.append(flow)
                    stack.extend(flow.resources)
        return comp_res, comp_flows

    def _rebalance(self, seeds: Sequence[int], t: float) -> None:
        """Recompute max-min fair rates of everything connected to `seeds`, at time t."""
        seeds = tuple(seeds)
        while True:
            comp_res, comp_flows = self._component(seeds)
            rates, left = _water_fill(comp_res, comp_flows)
            # A flow within float noise of its end finishes now rather than linger
            # at a new rate for a vanishing number of bytes; that frees bandwidth,
            # so divide again.
            lingering = []
            for flow, rate in zip(comp_flows, rates):
                if rate != flow.rate:
                    flow.settle(t)
                    if flow.nearly_done():
                        lingering.append(flow)
            if not lingering:
                break
            for flow in lingering:
                self._end(flow, t)
                seeds += flow.resources
        for res, res_left in zip(comp_res, left):
            res.settled_bytes += res.sum_rate * (t - res.t_ref)
            res.t_ref = t
            res.sum_rate = res.capacity - res_left if res.flows else 0.0
        for flow, rate in zip(comp_flows, rates):
            if rate != flow.rate:
                self._set_rate(flow, rate, t)

    def _compact_heap(self) -> None:
        live = []
        for entry in self._heap:
            flow = self._by_seq.get(entry[1])
            if flow is not None and flow.version == entry[2]:
                live.append(entry)
        heapq.heapify(live)
        self._heap = live


def _water_fill(resources: list[_Resource], flows: list[_Flow]) -> tuple[list[float], list[float]]:
    """Max-min fair rates of `flows` (same order), which use only `resources`.

    Also returns the capacity left on each resource (same order as `resources`).
    Progressive filling: each round takes the lowest saturation level (capacity left /
    unfrozen flows crossing it) over the resources, or the lowest unreached flow cap if
    that is no higher, and freezes the flows there at that level. Ties go to the lower
    resource id, then start order. Components are small (a core's engine, the links of
    a route), so a linear scan per round beats a heap; every float is computed in the
    same order as before, so the rates are identical to the last bit.
    """
    nres = len(resources)
    if not flows:
        return [], [res.capacity for res in resources]
    if nres == 1 and all(flow.cap is None for flow in flows):
        # One resource (a core's DMA engine with its descriptors): an equal split, the
        # same floats the general loop below computes.
        res = resources[0]
        level = res.capacity / len(res.flows)
        left = res.capacity
        for _ in range(len(res.flows)):
            left -= level
        return [level] * len(flows), [left]
    if len(flows) == 1:
        # One flow: the tightest of its resources' capacities and its cap.
        flow = flows[0]
        level = min((res.capacity for res in resources if res.flows), default=math.inf)
        if flow.cap is not None and flow.cap <= level:
            level = flow.cap
        return [level], [res.capacity - level if res.flows else res.capacity for res in resources]
    local = {res.rid: i for i, res in enumerate(resources)}
    rids = [res.rid for res in resources]
    left = [res.capacity for res in resources]
    count = [len(res.flows) for res in resources]
    position = {flow.seq: i for i, flow in enumerate(flows)}
    rates: list[float | None] = [None] * len(flows)
    caps = sorted((flow.cap, flow.seq, i) for i, flow in enumerate(flows) if flow.cap is not None)
    cap_i = 0
    todo = len(flows)
    inf = math.inf
    if nres > _SCAN_MAX:
        return _water_fill_heap(resources, flows, local, left, count, position, rates, caps), left
    order = sorted(range(nres), key=rids.__getitem__)   # scan in id order: ties go to the lower id

    while todo:
        while cap_i < len(caps) and rates[caps[cap_i][2]] is not None:
            cap_i += 1
        res_level = inf
        best = -1
        for i in order:
            n = count[i]
            if n:
                level = max(left[i], 0.0) / n
                if level < res_level:
                    res_level, best = level, i
        level, frozen, _ = _freeze(flows, resources, position, rates, caps, cap_i, res_level, best)
        todo -= len(frozen)
        for flow in frozen:
            for r in flow.resources:
                i = local[r]
                left[i] -= level
                count[i] -= 1
    return rates, left


def _freeze(flows, resources, position, rates, caps, cap_i, res_level, best) -> tuple[float, list[_Flow], bool]:
    """One round of the filling: the lowest unreached cap if it is no higher than the
    lowest resource level `res_level` (of resource `best`), which freezes that flow,
    else every unfrozen flow crossing `best`, at that level. Returns (level, frozen,
    whether a cap set it)."""
    cap_level = caps[cap_i][0] if cap_i < len(caps) else math.inf
    if cap_level <= res_level:
        i = caps[cap_i][2]
        rates[i] = cap_level
        return cap_level, [flows[i]], True
    frozen = []
    for seq, flow in resources[best].flows.items():
        i = position[seq]
        if rates[i] is None:
            rates[i] = res_level
            frozen.append(flow)
    return res_level, frozen, False


#: Components with more resources than this find each round's lowest level with a heap.
_SCAN_MAX = 12


def _water_fill_heap(resources, flows, local, left, count, position, rates, caps) -> list[float]:
    """`_water_fill`'s rounds for a large component: the resources' saturation levels in a
    heap (no decrease-key: freezing flows at a level no higher than a resource's level
    never lowers it, so an entry is stale when it no longer equals the level recomputed
    from `left` and `count`). Same rounds, same floats as the scan. Updates `left`."""
    heap = [(res.capacity / count[i], res.rid, i) for i, res in enumerate(resources) if count[i]]
    heapq.heapify(heap)
    heappop, heappush = heapq.heappop, heapq.heappush
    cap_i = 0
    todo = len(flows)
    inf = math.inf
    while todo:
        while cap_i < len(caps) and rates[caps[cap_i][2]] is not None:
            cap_i += 1
        while heap:
            level, _, i = heap[0]
            n = count[i]
            if n and level == max(left[i], 0.0) / n:
                break
            heappop(heap)
        res_level, _, best = heap[0] if heap else (inf, -1, -1)
        level, frozen, by_cap = _freeze(flows, resources, position, rates, caps, cap_i, res_level, best)
        if not by_cap:
            heappop(heap)
        todo -= len(frozen)
        touched: dict[int, None] = {}
        for flow in frozen:
            for r in flow.resources:
                i = local[r]
                left[i] -= level
                count[i] -= 1
                touched[i] = None
        for i in touched:
            if count[i]:
                heappush(heap, (max(left[i], 0.0) / count[i], resources[i].rid, i))
    return rates
