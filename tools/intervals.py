"""Sets of half-open cycle intervals [start, end), as sorted numpy arrays, and sums
of piecewise-constant rates (`step_rate`).

The trace tools measure everything as "how much of this interval lies inside the
window": a window is a `Spans` (disjoint, sorted) and `Spans.overlap` answers that
for many intervals at once through the window's cumulative length.
"""

from __future__ import annotations

import numpy as np


class Spans:
    """Disjoint sorted intervals; build with `Spans.union` or `Spans.of`."""

    def __init__(self, starts, ends):
        self.starts = np.asarray(starts, np.float64)
        self.ends = np.asarray(ends, np.float64)
        lengths = self.ends - self.starts
        self._before = np.concatenate([[0.0], np.cumsum(lengths)])

    @classmethod
    def of(cls, start: float, end: float) -> Spans:
        return cls([start], [max(start, end)])

    @classmethod
    def union(cls, starts, ends) -> Spans:
        starts = np.asarray(starts, np.float64)
        ends = np.asarray(ends, np.float64)
        keep = ends > starts
        starts, ends = starts[keep], ends[keep]
        if not starts.size:
            return cls([], [])
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        reach = np.maximum.accumulate(ends)
        new = np.ones(starts.size, bool)
        new[1:] = starts[1:] > reach[:-1]
        groups = np.cumsum(new) - 1
        out_ends = np.zeros(new.sum())
        np.maximum.at(out_ends, groups, reach)
        return cls(starts[new], out_ends)

    @property
    def total(self) -> float:
        return float(self._before[-1])

    def __len__(self) -> int:
        return self.starts.size

    def cumulative(self, t) -> np.ndarray:
        """Length of the spans before time t (vectorised over t)."""
        t = np.asarray(t, np.float64)
        if not self.starts.size:
            return np.zeros_like(t)
        i = np.searchsorted(self.starts, t, side="right") - 1
        ic = np.clip(i, 0, None)
        inside = np.clip(t - self.starts[ic], 0, self.ends[ic] - self.starts[ic])
        return np.where(i < 0, 0.0, self._before[ic] + inside)

    def holds(self, t) -> np.ndarray:
        """For each instant t, whether it lies in a span, its ends included."""
        t = np.asarray(t, np.float64)
        if not self.starts.size:
            return np.zeros(t.shape, bool)
        i = np.searchsorted(self.starts, t, side="right") - 1
        return (i >= 0) & (t <= self.ends[np.clip(i, 0, None)])

    def overlap(self, starts, ends) -> np.ndarray:
        """For each interval, how many of its cycles lie inside these spans."""
        return self.cumulative(ends) - self.cumulative(starts)

    def intersect(self, other: Spans) -> Spans:
        if self._canonical() and other._canonical():
            return self._intersect_canonical(other)
        return self._intersect_points(other)

    def _intersect_points(self, other: Spans) -> Spans:
        """`intersect` for any spans: the pieces between all boundary points that lie in both."""
        points = np.unique(np.concatenate([self.starts, self.ends, other.starts, other.ends]))
        if points.size < 2:
            return Spans([], [])
        a, b = points[:-1], points[1:]
        keep = (self.overlap(a, b) > 0) & (other.overlap(a, b) > 0)
        return Spans.union(a[keep], b[keep])

    def _canonical(self) -> bool:
        """Finite, non-empty, sorted intervals with gaps between them (as `union` gives)."""
        s, e = self.starts, self.ends
        return bool(np.isfinite(s).all() and np.isfinite(e).all() and (e > s).all() and (s[1:] > e[:-1]).all())

    def _intersect_canonical(self, other: Spans) -> Spans:
        """`intersect` for two canonical sets: each pair of intervals that overlap gives
        their common part (no two such parts touch, so this is the set `intersect`
        builds from every boundary point, in O(n log n) without sorting them all)."""
        lo = np.searchsorted(other.ends, self.starts, side="right")     # first interval ending after my start
        hi = np.searchsorted(other.starts, self.ends, side="left")      # first one starting at or after my end
        counts = np.maximum(hi - lo, 0)
        mine = np.repeat(np.arange(self.starts.size), counts)
        theirs = np.repeat(lo - (np.cumsum(counts) - counts), counts) + np.arange(mine.size)
        return Spans.union(np.maximum(self.starts[mine], other.starts[theirs]),
                           np.minimum(self.ends[mine], other.ends[theirs]))

    def gaps(self, within: Spans) -> Spans:
        """The parts of `within` not covered by these spans."""
        points = np.unique(np.concatenate([self.starts, self.ends, within.starts, within.ends]))
        if points.size < 2:
            return Spans([], [])
        a, b = points[:-1], points[1:]
        keep = (within.overlap(a, b) > 0) & (self.overlap(a, b) == 0)
        return Spans.union(a[keep], b[keep])


def step_rate(starts, ends, rates) -> tuple[np.ndarray, np.ndarray]:
    """The sum of piecewise-constant rates as (change times, value from each time on)."""
    times = np.concatenate([starts, ends])
    deltas = np.concatenate([rates, -np.asarray(rates)])
    if not times.size:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(times, kind="stable")
    times, level = times[order], np.cumsum(deltas[order])
    last = np.ones(times.size, bool)
    last[:-1] = times[1:] != times[:-1]
    level = np.where(np.abs(level[last]) < 1e-9, 0.0, level[last])
    return times[last], level
