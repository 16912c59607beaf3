"""What part of a trace an export draws: chips, cores and a window of cycles.

`--chip/--core/--from/--to` give a `View`; the Perfetto export and the timeline
pictures keep only the selected cores and cut every interval to the window.
"""

from __future__ import annotations

import attrs
import numpy as np

from mkemu.errors import ConfigError
from mkemu.tools.trace_reader import Trace
from mkemu.tools.trace_summary import NO_ROWS, index_by, no_launches, pieces, selected_cores, window


@attrs.frozen
class View:
    gids: tuple[int, ...]       # selected cores (global ids)
    chips: tuple[int, ...]      # their chips
    t0: int                     # window [t0, t1) in cycles
    t1: int

    def clip(self, starts, ends) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Which intervals [start, end) touch the window (an empty one where it starts),
        and their starts and ends cut to the window."""
        starts = np.asarray(starts, np.int64)
        ends = np.asarray(ends, np.int64)
        keep = (starts < self.t1) & (np.maximum(ends, starts + 1) > self.t0)
        return keep, np.clip(starts[keep], self.t0, self.t1), np.clip(ends[keep], self.t0, self.t1)

    def has_core(self, cores) -> np.ndarray:
        return np.isin(np.asarray(cores), self.gids)


def view(trace: Trace, chips=None, cores=None, start=None, end=None) -> View:
    """The cores and cycles to draw; by default every core over the launches' cycles."""
    gids = selected_cores(trace, chips, cores)
    if start is not None or end is not None:
        window(trace, gids, start=start, end=end)   # a window with no kernel time in it is an error, as for the summary
    t0 = trace.start_cycle if start is None else max(int(start), 0)
    t1 = trace.end_cycle if end is None else min(int(end), trace.end_cycle)
    if t1 <= t0 and start is None and end is None:   # (no flag to name: the run itself had none)
        raise ConfigError("nothing to draw: the trace has no kernel time " + (
            f"(its launches run cycles {trace.start_cycle:,} to {trace.end_cycle:,})" if trace.launches else
            f"({no_launches(trace)})"), file=trace.path)
    if t1 <= t0:
        raise ConfigError(f"--from/--to select no cycles: the trace runs cycles {trace.start_cycle:,} to "
                          f"{trace.end_cycle:,}", key="--from")
    return View(tuple(gids), tuple(sorted({trace.cores[g]["chip"] for g in gids})), t0, t1)


def unit_runs(trace: Trace, v: View) -> dict[str, np.ndarray]:
    """Each unit's busy time as runs: back-to-back instructions on one unit of one core
    (the next issued when the previous one frees the unit, or earlier) become one run.
    Columns: core, unit, start, end (cut to the window), count (instructions in the
    run), first (row in the `instr` table of its first instruction)."""
    parts = [runs for _, runs in core_unit_runs(trace, v) if runs is not None]
    if not parts:
        empty = np.zeros(0, np.int64)
        return {"core": empty, "unit": empty, "start": empty, "end": empty, "count": empty, "first": empty}
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def core_unit_runs(trace: Trace, v: View, gids=None):
    """`unit_runs` one core at a time: (gid, runs, or None if it has none) for each of
    `gids` in that order (default: the selected cores in the order of their ids, whose
    runs together are `unit_runs`). Only one core's rows and runs are held at once."""
    for gid, rows in core_rows(trace, sorted(set(v.gids)) if gids is None else gids):
        yield gid, _core_runs(trace.instr, v, rows)


def _core_runs(instr: dict, v: View, rows: np.ndarray) -> dict[str, np.ndarray] | None:
    """`unit_runs` of one core, given its rows of the `instr` table in order."""
    rows = rows[instr["occupancy"][rows] > 0]
    start = instr["issue"][rows].astype(np.int64)
    end = start + instr["occupancy"][rows]
    keep, _, _ = v.clip(start, end)
    rows, start, end = rows[keep], start[keep], end[keep]
    core, unit = instr["core"][rows].astype(np.int64), instr["unit"][rows].astype(np.int64)
    order = np.lexsort((start, unit))
    rows, core, unit, start, end = rows[order], core[order], unit[order], start[order], end[order]
    if not rows.size:
        return None
    reach = end.copy()
    new = np.ones(rows.size, bool)
    same = (core[1:] == core[:-1]) & (unit[1:] == unit[:-1])
    # A unit is in order: its instructions never overlap, so a run continues while the
    # next one starts no later than the previous one ends.
    new[1:] = ~(same & (start[1:] <= reach[:-1]))
    heads = np.flatnonzero(new)
    run_end = np.maximum.reduceat(end, heads)
    count = np.diff(np.append(heads, rows.size))
    return {"core": core[heads], "unit": unit[heads], "start": np.clip(start[heads], v.t0, v.t1),
            "end": np.clip(run_end, v.t0, v.t1), "count": count, "first": rows[heads]}


def core_rows(trace: Trace, gids):
    """(gid, its rows of the `instr` table in order) for each of `gids`, one at a time,
    found without a full-length sort: the table comes in blocks of one core (a
    launch's instructions core by core), so only the blocks' bounds are looked for."""
    core = trace.instr["core"]
    cuts = [np.flatnonzero(core[rows.start + 1:rows.stop + 1] != core[rows.start:rows.stop]) + rows.start + 1
            for rows in pieces(max(core.size - 1, 0))]
    bounds = np.concatenate([[0], *cuts, [core.size]]) if core.size else np.zeros(1, np.int64)
    starts, ends = bounds[:-1], bounds[1:]
    if starts.size > 4096 + core.size // 64:
        # Not in blocks after all: one stable sort.
        by_core = index_by(core)
        for g in gids:
            yield g, by_core.get(g, NO_ROWS)
        return
    owner = core[starts] if starts.size else NO_ROWS
    for g in gids:
        blocks = np.flatnonzero(owner == g).tolist()
        yield g, (np.concatenate([np.arange(starts[b], ends[b]) for b in blocks]) if blocks else NO_ROWS)
