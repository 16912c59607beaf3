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

The state lives in numpy arrays and the work per flow start or end (advancing,
ending, finding the component, water-filling, the heap of predicted completions) is
compiled by numba (`flowcore.py`); this class keeps the flows' keys, checks
arguments and grows the arrays.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Hashable, Sequence
from pathlib import Path

import numba
import numpy as np

from mkemu.cache import module_in_cache


class _Kernels:
    """The compiled kernels (`flowcore.py`), imported from a copy in the user cache
    directory so numba's cache is keyed by their source, not by where mkemu is
    installed; imported at their first use, when this stand-in replaces itself with
    the module. Importing this module (the mesh's topology and so every command does)
    thus compiles nothing and needs no cache folder: `mkemu asm` and `mkemu trace` run
    without one."""

    def __getattr__(self, name: str):
        global fc
        fc = module_in_cache("mkemu_flowcore", Path(__file__).with_name("flowcore.py").read_text(),
                             numba.__version__, sys.version,
                             announce="compiling the flow model, once per version and machine (alongside the "
                                      "issue loop on a first run)")
        return getattr(fc, name)


fc = _Kernels()


def __getattr__(name: str):
    """`completion_cycle`, the integer cycle at which an event for a float completion
    time should fire (the ceiling, except a few ulps above an integer), and `FAR_CYCLE`,
    the `completion_cycle` of a time so late (or infinite) that its bytes never land in
    64-bit cycles (one past 2^62, the largest max-cycle guard): flowcore's, compiled."""
    if name in ("completion_cycle", "FAR_CYCLE"):
        return getattr(fc, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class FlowNetwork:
    """Resources with capacities and the flows crossing them, advanced in float cycles."""

    def __init__(self) -> None:
        self._nres = 0
        self._F = np.zeros((0, fc.NF))
        self._FI = np.zeros((0, fc.FI_RES + 4), np.int64)
        self._R = np.zeros((0, fc.NR))
        self._RI = np.zeros((0, fc.RI_LIST + 8), np.int64)
        self._HT = np.zeros(0)
        self._HI = np.zeros((0, 3), np.int64)
        self._M = np.zeros(fc.NM, np.int64)
        self._M[fc.M_NEXT] = -1
        self._MF = np.zeros(1)
        self._DONE = np.zeros(0, np.int64)
        self._names: list[str] = []
        self._flows: dict[Hashable, int] = {}   # active and ended-not-popped: key -> slot, in start order
        self._keys: list[Hashable] = []         # slot -> key
        self._free: list[int] = []              # free slots
        self._paths: dict[tuple, np.ndarray] = {}   # resource tuples checked, as arrays
        self._next_seq = 0
        self._grow_flows(64)
        self._grow_resources(16)

    # -- resources ---------------------------------------------------------------

    def add_resource(self, name: str, capacity_bytes_per_cycle: float) -> int:
        """Register a resource and return its id (0, 1, 2, ... in call order)."""
        capacity = float(capacity_bytes_per_cycle)
        if not capacity > 0 or math.isinf(capacity):
            raise ValueError(f"resource {name!r}: capacity must be a positive finite number, got {capacity_bytes_per_cycle!r}")
        rid = self._nres
        if rid == self._R.shape[0]:
            self._grow_resources(2 * rid)
        self._nres += 1
        self._names.append(name)
        self._R[rid, fc.R_CAP] = capacity
        self._R[rid, fc.R_TREF] = self._MF[0]
        return rid

    def resource_name(self, resource_id: int) -> str:
        return self._names[resource_id]

    def capacity(self, resource_id: int) -> float:
        return float(self._R[self._rid(resource_id), fc.R_CAP])

    @property
    def num_resources(self) -> int:
        return self._nres

    def bytes_through(self, resource_id: int) -> float:
        """Bytes carried by a resource up to the network's clock."""
        row = self._R[self._rid(resource_id)]
        return float(row[fc.R_SETTLED] + row[fc.R_SUM] * (self._MF[0] - row[fc.R_TREF]))

    def busy_cycles(self, resource_id: int) -> float:
        """Cycles (up to the network's clock) during which at least one flow crossed it."""
        rid = self._rid(resource_id)
        busy = self._R[rid, fc.R_SETTLED_BUSY]
        if self._RI[rid, fc.RI_N]:
            busy += self._MF[0] - self._R[rid, fc.R_BUSY_SINCE]
        return float(busy)

    def load(self, resource_id: int) -> float:
        """Sum of the current rates of the flows crossing a resource (bytes per cycle)."""
        return float(self._R[self._rid(resource_id), fc.R_SUM])

    # -- flows -------------------------------------------------------------------

    @property
    def now(self) -> float:
        """The network's clock: the last time passed to `advance` (or `start`)."""
        return float(self._MF[0])

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
        path = self._paths.get(resources) if type(resources) is tuple else None
        if path is None:
            path = self._path(flow_key, resources)
        has_cap = cap_bytes_per_cycle is not None
        cap = 0.0
        if has_cap:
            cap = float(cap_bytes_per_cycle)
            if not cap > 0 or math.isinf(cap):
                raise ValueError(f"flow {flow_key!r}: cap must be a positive finite number, got {cap_bytes_per_cycle!r}")
        elif not path.size:
            raise ValueError(f"flow {flow_key!r} crosses no resource and has no cap: its rate would be unbounded")
        now = float(now)
        if not self._free:
            self._grow_flows(2 * self._F.shape[0])
        slot = self._free[-1]
        while (code := fc.k_start(self._F, self._FI, *self._state(), slot, now, float(size_bytes), cap, has_cap,
                                  self._next_seq, path)):
            if code == fc.TIME_BACKWARDS:
                self._backwards(now)
            if fc.FI_RES + path.size > self._FI.shape[1]:
                self._FI = _grown(self._FI, self._FI.shape[0], fc.FI_RES + max(path.size, 2 * (self._FI.shape[1] - fc.FI_RES)))
            else:
                self._RI = _grown(self._RI, self._RI.shape[0], fc.RI_LIST + 2 * (self._RI.shape[1] - fc.RI_LIST))
        self._free.pop()
        self._next_seq += 1
        self._flows[flow_key] = slot
        self._keys[slot] = flow_key

    def _path(self, flow_key, resources) -> np.ndarray:
        """The resource ids checked, as the array the compiled code takes (kept for a
        tuple: a DMA's resources are one of a few tuples, checked once each)."""
        rids = [int(r) for r in resources]
        nres = self._nres
        for r in rids:
            if not 0 <= r < nres:
                raise ValueError(f"flow {flow_key!r}: no resource {r} (have {nres})")
        if len(set(rids)) != len(rids):
            raise ValueError(f"flow {flow_key!r}: resource listed twice in {rids}")
        path = np.array(rids, np.int64)
        if type(resources) is tuple:
            self._paths[resources] = path
        return path

    def advance(self, now: float) -> None:
        """Drain bytes up to time `now`, ending flows (and re-dividing rates) on the way."""
        now = float(now)
        if fc.k_advance(self._F, self._FI, *self._state(), now) == fc.TIME_BACKWARDS:
            self._backwards(now)

    def next_completion(self) -> tuple[float, Hashable] | None:
        """Earliest completion (time, key), counting ended flows not yet popped; None if idle.

        Ties go to the flow started first.
        """
        slot, t = fc.k_next(self._F, self._FI, self._HT, self._HI, self._M, self._DONE)
        if slot < 0:
            return None
        return float(t), self._keys[slot]

    def next_completion_cycle(self) -> int | None:
        """`completion_cycle` of the earliest completion's time; None if idle (kept by
        the compiled entry points that change the network)."""
        cycle = int(self._M[fc.M_NEXT])
        return None if cycle < 0 else cycle

    def pop_completed(self, now: float) -> list[Hashable]:
        """Advance to `now` and remove every flow that has ended by then.

        Returns their keys ordered by completion time, then start order.
        """
        n = fc.k_pop(self._F, self._FI, *self._state(), float(now))
        if n <= 0:
            if n == -fc.TIME_BACKWARDS:
                self._backwards(float(now))
            return []
        slots = self._DONE[:n].tolist()
        keys = self._keys
        flows = self._flows
        done = []
        for slot in slots:
            key = keys[slot]
            del flows[key]
            keys[slot] = None
            done.append(key)
        self._free.extend(slots)
        return done

    def rate(self, flow_key: Hashable) -> float:
        """Current rate in bytes per cycle (0 once the flow has ended)."""
        return float(self._F[self._flows[flow_key], fc.F_RATE])

    def remaining(self, flow_key: Hashable) -> float:
        """Bytes still to move as of the network's clock."""
        slot = self._flows[flow_key]
        if self._FI[slot, fc.FI_STATE] != fc.ACTIVE:
            return 0.0
        row = self._F[slot]
        return max(float(row[fc.F_REM] - row[fc.F_RATE] * (self._MF[0] - row[fc.F_TREF])), 0.0)

    def active(self) -> list[Hashable]:
        """Keys of the flows still moving bytes, in start order."""
        return [key for key, _ in self.active_rates()]

    def active_rates(self) -> list[tuple[Hashable, float]]:
        """(key, `rate`) of each flow still moving bytes, in start order."""
        flows = self._flows
        if not flows:
            return []
        slots = np.fromiter(flows.values(), np.int64, len(flows))
        live = self._FI[slots, fc.FI_STATE] == fc.ACTIVE
        rates = self._F[slots[live], fc.F_RATE].tolist()
        return list(zip([key for key, on in zip(flows, live.tolist()) if on], rates))

    # -- internals ---------------------------------------------------------------

    def _state(self) -> tuple:
        """The arrays after F and FI, in the compiled entry points' order."""
        return self._R, self._RI, self._HT, self._HI, self._M, self._MF, self._DONE, self._W, self._WF

    def _backwards(self, now: float):
        raise ValueError(f"time went backwards: network is at cycle {float(self._MF[0])}, asked for {now}")

    def _rid(self, resource_id: int) -> int:
        if not 0 <= resource_id < self._nres:
            raise IndexError(f"no resource {resource_id} (have {self._nres})")
        return resource_id

    def _grow_flows(self, rows: int) -> None:
        old = self._F.shape[0]
        self._F = _grown(self._F, rows, self._F.shape[1])
        self._FI = _grown(self._FI, rows, self._FI.shape[1])
        self._DONE = _grown(self._DONE, rows)
        # The heap holds at most one live entry per active flow, so twice the slots
        # leaves room for as many stale ones (it compacts itself when full).
        self._HT = _grown(self._HT, 2 * rows)
        self._HI = _grown(self._HI, 2 * rows, 3)
        self._keys.extend([None] * (rows - old))
        self._free.extend(range(rows - 1, old - 1, -1))
        self._W, self._WF = fc.scratch(self._R.shape[0], rows)

    def _grow_resources(self, rows: int) -> None:
        self._R = _grown(self._R, rows, self._R.shape[1])
        self._RI = _grown(self._RI, rows, self._RI.shape[1])
        self._W, self._WF = fc.scratch(rows, self._F.shape[0])


def _grown(a: np.ndarray, rows: int, cols: int | None = None) -> np.ndarray:
    """A copy of `a` with at least `rows` rows (and `cols` columns), zero-filled."""
    shape = (max(rows, a.shape[0]),) if cols is None else (max(rows, a.shape[0]), cols)
    out = np.zeros(shape, a.dtype)
    if cols is None:
        out[:a.shape[0]] = a
    else:
        out[:a.shape[0], :a.shape[1]] = a
    return out


def warm_up() -> None:
    """Compile the flow model's kernels for the argument types the machine gives them
    (numba compiles each at its first call; they are cached, so a later process loads
    them): flows with and without a rate cap, sharing a resource, advanced, predicted
    and popped."""
    net = FlowNetwork()
    shared, own = net.add_resource("shared", 4.0), net.add_resource("own", 2.0)
    net.start(1, 64, (shared,), 0)
    net.start(2, 64, (shared, own), 1, 1.5)
    net.advance(2.0)
    net.next_completion()
    net.pop_completed(net.next_completion_cycle())
    net.active_rates()
