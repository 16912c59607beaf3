"""The flow network's state as arrays, and its hot paths compiled by numba.

Self-contained (numpy and numba only): flows.py imports it from a copy in the user
cache directory (`mkemu.cache.module_in_cache`).

`FlowNetwork` (flows.py) keeps its keys, checks its arguments and grows these arrays;
everything that runs once per flow start or end (advancing the clock, ending flows,
finding the component a change touches, the water-filling, the heap of predicted
completions) runs here, on:

- `F` (float, one row per flow slot): size, cap, rate, remaining bytes as of `F_TREF`,
  that reference time, and the completion time once ended;
- `FI` (int, one row per flow slot): start sequence number, rate version, number of
  resources, whether it has a cap, state (free / active / ended not yet popped), two
  scratch columns, then the resource ids;
- `R` (float, one row per resource): capacity, sum of rates, reference time, bytes
  settled up to it, start of the current busy period, busy cycles settled;
- `RI` (int, one row per resource): number of active flows, two scratch columns, then
  the slots of its active flows in start order;
- `HT`, `HI`: a binary min-heap of predicted completions (time; sequence number,
  version, slot), ordered by (time, sequence, version). Entries whose flow ended or
  changed rate since are stale and skipped, as in `heapq` use with lazy deletion;
  which live entry comes first is fixed by that order alone, so results do not
  depend on the heap's internal layout;
- `M` (int): heap size, an epoch counter for the scratch marks, the number of ended
  flows not yet popped, the number of active flows, and the integer cycle of the
  earliest completion (`k_next_cycle`) as left by the last entry point that changed
  the network (-1: idle);
  `MF` (float): the network's clock;
- `DONE`: the slots of ended flows not yet popped, in the order they ended;
- `W`, `WF`: int and float scratch, sized from the row counts of `R` and `F`.

Every float is computed with the same operations in the same order as the
pure-Python implementation this replaced (a replay of 546 k recorded calls from the
main job and a k3-full run gave identical results), so rates and completion times
did not move by a bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

F_SIZE, F_CAP, F_RATE, F_REM, F_TREF, F_DONE = range(6)
NF = 6
FI_SEQ, FI_VER, FI_NRES, FI_HASCAP, FI_STATE, FI_MARK, FI_POS = range(7)
FI_RES = 7
FREE, ACTIVE, ENDED = 0, 1, 2
R_CAP, R_SUM, R_TREF, R_SETTLED, R_BUSY_SINCE, R_SETTLED_BUSY = range(6)
NR = 6
RI_N, RI_MARK, RI_SEED, RI_LOCAL = range(4)
RI_LIST = 4
M_HEAP, M_EPOCH, M_NDONE, M_NACTIVE, M_NEXT = range(5)
NM = 5

#: A flow whose remaining bytes are at most this fraction of its size is done.
DONE_FRACTION = 1e-6
#: `k_start`: a resource of the new flow has no room left in its row of `RI`, or the
#: flow has more resources than a row of `FI` holds.
NEED_ROOM = 1
#: `k_start`, `k_advance`, `k_pop` (negated): the time asked for is before the
#: network's clock.
TIME_BACKWARDS = 2
#: `completion_cycle` of a time at or past it (or infinite: a rate so slow its bytes
#: never land in 64-bit cycles): one cycle past 2^62, the largest max-cycle guard, so
#: the run stops at the guard instead of losing the flow to an int64 overflow.
FAR_CYCLE = 2**62 + 1

_jit = njit(cache=True, nogil=True, error_model="numpy")


def scratch(n_res_rows: int, n_flow_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Int and float scratch for the given row counts of `R` and `F` (see `_layout`)."""
    return (np.zeros(4 * n_res_rows + 3 * n_flow_rows, np.int64),
            np.zeros(n_res_rows + n_flow_rows, np.float64))


# --- the heap ----------------------------------------------------------------------

@_jit
def _before(HT, HI, a, b):
    if HT[a] != HT[b]:
        return HT[a] < HT[b]
    if HI[a, 0] != HI[b, 0]:
        return HI[a, 0] < HI[b, 0]
    return HI[a, 1] < HI[b, 1]


@_jit
def _swap(HT, HI, a, b):
    t = HT[a]
    HT[a] = HT[b]
    HT[b] = t
    for k in range(3):
        v = HI[a, k]
        HI[a, k] = HI[b, k]
        HI[b, k] = v


@_jit
def _move(HT, HI, dst, src):
    HT[dst] = HT[src]
    for k in range(3):
        HI[dst, k] = HI[src, k]


@_jit
def _sift_down(HT, HI, n, i):
    while True:
        child = 2 * i + 1
        if child >= n:
            return
        if child + 1 < n and _before(HT, HI, child + 1, child):
            child += 1
        if not _before(HT, HI, child, i):
            return
        _swap(HT, HI, i, child)
        i = child


@_jit
def _live(FI, HI, i):
    slot = HI[i, 2]
    return FI[slot, FI_STATE] == ACTIVE and FI[slot, FI_SEQ] == HI[i, 0] and FI[slot, FI_VER] == HI[i, 1]


@_jit
def _compact(FI, HT, HI, M):
    """Drop stale entries and restore the heap order."""
    n = 0
    for i in range(M[M_HEAP]):
        if _live(FI, HI, i):
            _move(HT, HI, n, i)
            n += 1
    M[M_HEAP] = n
    for i in range(n // 2 - 1, -1, -1):
        _sift_down(HT, HI, n, i)


@_jit
def _push(FI, HT, HI, M, t, slot):
    if M[M_HEAP] == HT.shape[0]:
        # Live entries are at most the active flows, half the heap's room at most.
        _compact(FI, HT, HI, M)
    i = M[M_HEAP]
    M[M_HEAP] = i + 1
    HT[i] = t
    HI[i, 0] = FI[slot, FI_SEQ]
    HI[i, 1] = FI[slot, FI_VER]
    HI[i, 2] = slot
    while i > 0:
        parent = (i - 1) // 2
        if not _before(HT, HI, i, parent):
            break
        _swap(HT, HI, i, parent)
        i = parent


@_jit
def _pop(HT, HI, M):
    n = M[M_HEAP] - 1
    M[M_HEAP] = n
    if n > 0:
        _move(HT, HI, 0, n)
        _sift_down(HT, HI, n, 0)


@_jit
def _drop_stale(FI, HT, HI, M):
    """Pop stale entries off the top; True if a live one is left on top."""
    while M[M_HEAP] > 0:
        if _live(FI, HI, 0):
            return True
        _pop(HT, HI, M)
    return False


# --- flows -------------------------------------------------------------------------

@_jit
def _settle(F, s, t):
    if t != F[s, F_TREF]:
        rem = F[s, F_REM] - F[s, F_RATE] * (t - F[s, F_TREF])
        if 0.0 > rem:
            rem = 0.0
        F[s, F_REM] = rem
        F[s, F_TREF] = t


@_jit
def _set_rate(F, FI, HT, HI, M, s, rate, t):
    _settle(F, s, t)
    F[s, F_RATE] = rate
    FI[s, FI_VER] += 1
    _push(FI, HT, HI, M, t + F[s, F_REM] / rate, s)


@_jit
def _end(F, FI, R, RI, M, DONE, s, t):
    F[s, F_REM] = 0.0
    F[s, F_RATE] = 0.0
    FI[s, FI_VER] += 1
    F[s, F_DONE] = t
    FI[s, FI_STATE] = ENDED
    M[M_NACTIVE] -= 1
    for k in range(FI[s, FI_NRES]):
        r = FI[s, FI_RES + k]
        n = RI[r, RI_N]
        j = RI_LIST
        while RI[r, j] != s:
            j += 1
        for j2 in range(j, RI_LIST + n - 1):
            RI[r, j2] = RI[r, j2 + 1]
        RI[r, RI_N] = n - 1
        if n == 1:
            R[r, R_SETTLED_BUSY] += t - R[r, R_BUSY_SINCE]
    DONE[M[M_NDONE]] = s
    M[M_NDONE] += 1


# --- re-dividing bandwidth ---------------------------------------------------------

@_jit
def _layout(R, F):
    """Offsets into W: seeds, component resources, stack, counts, component flows,
    ending flows, capped flows; into WF: capacity left, rates."""
    nr, nf = R.shape[0], F.shape[0]
    return 0, nr, 2 * nr, 3 * nr, 4 * nr, 4 * nr + nf, 4 * nr + 2 * nf


@_jit
def _component(F, FI, R, RI, M, W, nseeds):
    """Resources and active flows connected to the seeds (W[SEEDS:]) through shared
    flows. Resources come back sorted by id; flows in discovery order (`_water_fill`
    breaks every tie by resource id or start order, so that order does not matter)."""
    SEEDS, CRES, STACK, _, CFLOWS, _, _ = _layout(R, F)
    M[M_EPOCH] += 1
    ep = M[M_EPOCH]
    nres = 0
    nfl = 0
    top = 0
    for i in range(nseeds):
        r = W[SEEDS + i]
        if RI[r, RI_MARK] != ep:
            RI[r, RI_MARK] = ep
            W[STACK + top] = r
            top += 1
    while top:
        top -= 1
        r = W[STACK + top]
        W[CRES + nres] = r
        nres += 1
        for j in range(RI_LIST, RI_LIST + RI[r, RI_N]):
            s = RI[r, j]
            if FI[s, FI_MARK] != ep:
                FI[s, FI_MARK] = ep
                W[CFLOWS + nfl] = s
                nfl += 1
                for k in range(FI[s, FI_NRES]):
                    r2 = FI[s, FI_RES + k]
                    if RI[r2, RI_MARK] != ep:
                        RI[r2, RI_MARK] = ep
                        W[STACK + top] = r2
                        top += 1
    W[CRES:CRES + nres].sort()
    return nres, nfl


@_jit
def _water_fill(F, FI, R, RI, W, WF, nres, nfl):
    """Max-min fair rates (WF[nr + j] for component flow j) by progressive filling,
    and the capacity left on each component resource (WF[i]).

    Each round takes the lowest saturation level (capacity left / unfrozen flows
    crossing it; ties to the lower resource id), or the lowest unreached flow cap if
    that is no higher (ties to the earlier start), and freezes the flows there."""
    _, CRES, _, CNT, CFLOWS, _, CAPS = _layout(R, F)
    RATES = R.shape[0]
    for i in range(nres):
        r = W[CRES + i]
        RI[r, RI_LOCAL] = i
        WF[i] = R[r, R_CAP]
        W[CNT + i] = RI[r, RI_N]
    ncaps = 0
    for j in range(nfl):
        s = W[CFLOWS + j]
        FI[s, FI_POS] = j
        WF[RATES + j] = -1.0
        if FI[s, FI_HASCAP]:
            # Insertion into the caps sorted by (cap, start order).
            c = ncaps
            while c > 0:
                prev = W[CFLOWS + W[CAPS + c - 1]]
                if F[prev, F_CAP] < F[s, F_CAP] or (F[prev, F_CAP] == F[s, F_CAP] and FI[prev, FI_SEQ] < FI[s, FI_SEQ]):
                    break
                W[CAPS + c] = W[CAPS + c - 1]
                c -= 1
            W[CAPS + c] = j
            ncaps += 1
    cap_i = 0
    todo = nfl
    while todo:
        while cap_i < ncaps and WF[RATES + W[CAPS + cap_i]] >= 0.0:
            cap_i += 1
        res_level = np.inf
        best = -1
        for i in range(nres):
            n = W[CNT + i]
            if n:
                left = WF[i]
                if 0.0 > left:
                    left = 0.0
                level = left / n
                if level < res_level:
                    res_level = level
                    best = i
        cap_level = np.inf
        if cap_i < ncaps:
            cap_level = F[W[CFLOWS + W[CAPS + cap_i]], F_CAP]
        if cap_level <= res_level:
            j = W[CAPS + cap_i]
            WF[RATES + j] = cap_level
            todo -= 1
            s = W[CFLOWS + j]
            for k in range(FI[s, FI_NRES]):
                i = RI[FI[s, FI_RES + k], RI_LOCAL]
                WF[i] -= cap_level
                W[CNT + i] -= 1
            continue
        r = W[CRES + best]
        for jj in range(RI_LIST, RI_LIST + RI[r, RI_N]):
            s = RI[r, jj]
            j = FI[s, FI_POS]
            if WF[RATES + j] < 0.0:
                WF[RATES + j] = res_level
                todo -= 1
                for k in range(FI[s, FI_NRES]):
                    i = RI[FI[s, FI_RES + k], RI_LOCAL]
                    WF[i] -= res_level
                    W[CNT + i] -= 1


@_jit
def _rebalance(F, FI, R, RI, HT, HI, M, DONE, W, WF, nseeds, t):
    """Recompute the max-min fair rates of everything connected to the seeds
    (W[:nseeds]), at t."""
    RATES = R.shape[0]
    nseeds = _dedupe_seeds(RI, M, W, nseeds)
    ep = M[M_EPOCH]
    while True:
        nres, nfl = _component(F, FI, R, RI, M, W, nseeds)
        _water_fill(F, FI, R, RI, W, WF, nres, nfl)
        # A flow within float noise of its end finishes now rather than linger at a
        # new rate for a vanishing number of bytes; that frees bandwidth, so divide
        # again.
        _, CRES, _, _, CFLOWS, ENDING, _ = _layout(R, F)
        nlinger = 0
        for j in range(nfl):
            s = W[CFLOWS + j]
            if WF[RATES + j] != F[s, F_RATE]:
                _settle(F, s, t)
                if F[s, F_REM] <= DONE_FRACTION * F[s, F_SIZE]:
                    W[ENDING + nlinger] = s
                    nlinger += 1
        if not nlinger:
            break
        for q in range(nlinger):
            s = W[ENDING + q]
            nseeds = _add_seeds(FI, RI, W, nseeds, s, ep)
            _end(F, FI, R, RI, M, DONE, s, t)
    for i in range(nres):
        r = W[CRES + i]
        R[r, R_SETTLED] += R[r, R_SUM] * (t - R[r, R_TREF])
        R[r, R_TREF] = t
        R[r, R_SUM] = R[r, R_CAP] - WF[i] if RI[r, RI_N] else 0.0
    for j in range(nfl):
        s = W[CFLOWS + j]
        rate = WF[RATES + j]
        if rate != F[s, F_RATE]:
            _set_rate(F, FI, HT, HI, M, s, rate, t)


@_jit
def _dedupe_seeds(RI, M, W, nseeds):
    """Keep each seed resource once, marked with a new epoch (M[M_EPOCH])."""
    M[M_EPOCH] += 1
    ep = M[M_EPOCH]
    n = 0
    for i in range(nseeds):
        r = W[i]
        if RI[r, RI_SEED] != ep:
            RI[r, RI_SEED] = ep
            W[n] = r
            n += 1
    return n


@_jit
def _add_seeds(FI, RI, W, nseeds, s, ep):
    """Append the resources of flow s not yet among the seeds (marked `ep`)."""
    for k in range(FI[s, FI_NRES]):
        r = FI[s, FI_RES + k]
        if RI[r, RI_SEED] != ep:
            RI[r, RI_SEED] = ep
            W[nseeds] = r
            nseeds += 1
    return nseeds


# --- entry points ------------------------------------------------------------------

@_jit
def k_advance(F, FI, R, RI, HT, HI, M, MF, DONE, W, WF, now):
    """Drain bytes up to `now`, ending flows (and re-dividing rates) on the way.
    Returns 0, or TIME_BACKWARDS, having changed nothing, if `now` is before the
    network's clock."""
    if now < MF[0]:
        return TIME_BACKWARDS
    _advance(F, FI, R, RI, HT, HI, M, MF, DONE, W, WF, now)
    M[M_NEXT] = k_next_cycle(F, FI, HT, HI, M, DONE)
    return 0


@_jit
def _advance(F, FI, R, RI, HT, HI, M, MF, DONE, W, WF, now):
    _, _, _, _, _, ENDING, _ = _layout(R, F)
    while _drop_stale(FI, HT, HI, M):
        t = HT[0]
        if t > now:
            break
        # Every flow predicted to end at exactly t ends now, in start order.
        nend = 0
        while M[M_HEAP] > 0 and HT[0] == t:
            live = _live(FI, HI, 0)
            s = HI[0, 2]
            _pop(HT, HI, M)
            if live:
                c = nend
                while c > 0 and FI[W[ENDING + c - 1], FI_SEQ] > FI[s, FI_SEQ]:
                    W[ENDING + c] = W[ENDING + c - 1]
                    c -= 1
                W[ENDING + c] = s
                nend += 1
        MF[0] = t
        M[M_EPOCH] += 1
        ep = M[M_EPOCH]
        nseeds = 0
        for q in range(nend):
            s = W[ENDING + q]
            _settle(F, s, t)
            _end(F, FI, R, RI, M, DONE, s, t)
            nseeds = _add_seeds(FI, RI, W, nseeds, s, ep)
        if nseeds:
            _rebalance(F, FI, R, RI, HT, HI, M, DONE, W, WF, nseeds, t)
    MF[0] = now
    if M[M_HEAP] > 64 and M[M_HEAP] > 4 * M[M_NACTIVE]:
        _compact(FI, HT, HI, M)


@_jit
def k_start(F, FI, R, RI, HT, HI, M, MF, DONE, W, WF, s, now, size, cap, has_cap, seq, path):
    """Start a flow in free slot s at `now` (advancing the network to `now` first):
    `size` bytes through the resources `path`, with a rate cap if `has_cap`. Returns
    0, or, having changed nothing, NEED_ROOM if a resource's row of RI is full or
    TIME_BACKWARDS if `now` is before the network's clock."""
    code = _start_flow(F, FI, R, RI, HT, HI, M, MF, DONE, W, WF, s, now, size, cap, has_cap, seq, path)
    if code == 0:
        M[M_NEXT] = k_next_cycle(F, FI, HT, HI, M, DONE)
    return code


@_jit
def _start_flow(F, FI, R, RI, HT, HI, M, MF, DONE, W, WF, s, now, size, cap, has_cap, seq, path):
    if now < MF[0]:
        return TIME_BACKWARDS
    if FI_RES + path.size > FI.shape[1]:
        return NEED_ROOM
    for r in path:
        if RI_LIST + RI[r, RI_N] >= RI.shape[1]:
            return NEED_ROOM
    _advance(F, FI, R, RI, HT, HI, M, MF, DONE, W, WF, now)
    nres = path.size
    FI[s, FI_SEQ] = seq
    FI[s, FI_NRES] = nres
    FI[s, FI_HASCAP] = has_cap
    F[s, F_SIZE] = size
    F[s, F_CAP] = cap
    for k in range(nres):
        FI[s, FI_RES + k] = path[k]
    t = MF[0]
    F[s, F_TREF] = t
    F[s, F_RATE] = 0.0
    F[s, F_REM] = size
    FI[s, FI_VER] = 0
    if size == 0.0:
        F[s, F_DONE] = t
        F[s, F_REM] = 0.0
        FI[s, FI_STATE] = ENDED
        DONE[M[M_NDONE]] = s
        M[M_NDONE] += 1
        return 0
    FI[s, FI_STATE] = ACTIVE
    M[M_NACTIVE] += 1
    if nres == 0:
        _set_rate(F, FI, HT, HI, M, s, cap, t)
        return 0
    for k in range(nres):
        r = path[k]
        n = RI[r, RI_N]
        if n == 0:
            R[r, R_BUSY_SINCE] = t
        RI[r, RI_LIST + n] = s
        RI[r, RI_N] = n + 1
        W[k] = r
    _rebalance(F, FI, R, RI, HT, HI, M, DONE, W, WF, nres, t)
    return 0


@_jit
def k_next(F, FI, HT, HI, M, DONE):
    """The earliest completion, ended flows not yet popped included: (slot, time),
    slot -1 if the network is idle. Ties go to the flow started first."""
    best = -1
    best_t = np.inf
    for q in range(M[M_NDONE]):
        s = DONE[q]
        t = F[s, F_DONE]
        if best < 0 or t < best_t or (t == best_t and FI[s, FI_SEQ] < FI[best, FI_SEQ]):
            best, best_t = s, t
    if _drop_stale(FI, HT, HI, M):
        s = HI[0, 2]
        t = HT[0]
        if best < 0 or t < best_t or (t == best_t and FI[s, FI_SEQ] < FI[best, FI_SEQ]):
            best, best_t = s, t
    return best, best_t


@_jit
def completion_cycle(t):
    """The integer cycle at which an event for a float completion time should fire.

    The ceiling of `t`, except that a value a few ulps above an integer (float noise
    from summing rates) rounds down to that integer. The tolerance is a few ulps (at
    least 1e-9 of a cycle), not relative: late in a long run a real fraction of a
    cycle can be smaller than a relative tolerance. (Where `t` is halfway between
    integers the tolerance is not met, so how the nearest integer is rounded does not
    matter.) A time at or past `FAR_CYCLE`, infinity included, gives `FAR_CYCLE`."""
    if not t < FAR_CYCLE:
        return FAR_CYCLE
    nearest = np.rint(t)
    a = t if t >= 0.0 else -t
    tol = 64.0 * np.spacing(a if a > 1.0 else 1.0)
    if tol < 1e-9:
        tol = 1e-9
    if abs(t - nearest) <= tol:
        return int(nearest)
    return int(np.ceil(t))


@_jit
def k_next_cycle(F, FI, HT, HI, M, DONE):
    """The integer cycle of the earliest completion (`completion_cycle` of its time),
    -1 if the network is idle."""
    s, t = k_next(F, FI, HT, HI, M, DONE)
    if s < 0:
        return -1
    return completion_cycle(t)


@_jit
def k_pop(F, FI, R, RI, HT, HI, M, MF, DONE, W, WF, now):
    """Advance to `now` and free every ended flow; their slots come back in DONE[:n]
    ordered by completion time, then start order. Returns n (TIME_BACKWARDS, having
    changed nothing, if `now` is before the network's clock)."""
    n = _pop_done(F, FI, R, RI, HT, HI, M, MF, DONE, W, WF, now)
    if n >= 0:
        M[M_NEXT] = k_next_cycle(F, FI, HT, HI, M, DONE)
    return n


@_jit
def _pop_done(F, FI, R, RI, HT, HI, M, MF, DONE, W, WF, now):
    if now < MF[0]:
        return -TIME_BACKWARDS
    _advance(F, FI, R, RI, HT, HI, M, MF, DONE, W, WF, now)
    n = M[M_NDONE]
    for q in range(1, n):
        s = DONE[q]
        c = q
        while c > 0:
            p = DONE[c - 1]
            if F[p, F_DONE] < F[s, F_DONE] or (F[p, F_DONE] == F[s, F_DONE] and FI[p, FI_SEQ] < FI[s, FI_SEQ]):
                break
            DONE[c] = p
            c -= 1
        DONE[c] = s
    for q in range(n):
        FI[DONE[q], FI_STATE] = FREE
    M[M_NDONE] = 0
    return n
