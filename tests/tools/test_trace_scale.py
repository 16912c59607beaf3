"""The trace tools on long traces: per-pc tables of several kernels gathered in one
pass, the streamed reader and its narrow columns, and the piecewise passes giving the
figures of a single pass (tools/trace_reader.py, trace_summary.py, view.py, plot.py,
perfetto.py, intervals.py)."""

from __future__ import annotations

import types
import zlib

import numpy as np
import pytest
from mkemu.emulator.trace import Recorder
from mkemu.tools import trace_reader, trace_summary
from mkemu.tools.intervals import Spans
from mkemu.tools.perfetto import _Events, to_perfetto
from mkemu.tools.plot import to_html
from mkemu.tools.trace_reader import parse_trace
from mkemu.tools.trace_summary import summarize
from mkemu.tools.view import core_rows, unit_runs, view

# Two kernels whose per-pc tables differ: the same pc means another unit, occupancy
# and latency depending on which kernel the launch ran.
KERNELS = {
    "a": {"unit": [0, 1, 2], "occupancy": [1, 2, 3], "latency": [4, 5, 6]},
    "b": {"unit": [2, 0], "occupancy": [7, 8], "latency": [9, 10]},
}
ORDER = ("a", "b", "b", "a", "b")        # the launches


def _multi_launch_trace(issue_base: int = 0, rows_per_core: int = 40) -> tuple[bytes, list]:
    """A trace written by the real writer: 2 cores, 5 launches of kernels a and b.
    Returns the bytes and, per instruction row, (launch, pc)."""
    rec = Recorder()
    rec.meta = {"profile": "test", "clock_hz": 1e9, "mesh": [1, 1, 1], "cores_per_chip": 2,
                "units": ["scalar", "valu", "mxu0"],
                "cores": [{"gid": g, "chip": 0, "core": g} for g in range(2)],
                "resources": [{"id": 0, "kind": "hbm", "chip": 0, "name": "chip0 HBM", "bw_bytes_per_cycle": 64.0}],
                "spaces": ["hbm", "vmem", "smem"], "program": None}
    for name, k in KERNELS.items():
        n = len(k["unit"])
        rec.kernels[name] = {**k, "text": [f"{name}{pc} x" for pc in range(n)], "source": [None] * n,
                             "regions": []}
    rng = np.random.default_rng(5)
    expected = []
    t = issue_base
    for index, name in enumerate(ORDER):
        start = t
        for core in range(2):
            n = len(KERNELS[name]["unit"])
            pcs = rng.integers(0, n, rows_per_core)
            issue = t + np.arange(rows_per_core) * 4
            rows = np.stack([pcs, issue, rng.integers(0, 3, rows_per_core), rng.integers(0, 3, rows_per_core)], 1)
            rec.instr.append((core, index, [rows.astype(np.int64)]))
            expected += [(index, int(pc)) for pc in pcs]
        t += rows_per_core * 4 + 10
        rec.launches.append({"kernel": name, "args": [], "start": start, "end": t})
    rec.end_cycle = t
    return rec.to_bytes(), expected


def test_per_pc_columns_follow_each_launchs_kernel():
    data, expected = _multi_launch_trace()
    t = parse_trace(data)
    for key in ("unit", "occupancy", "latency"):
        want = [KERNELS[ORDER[launch]][key][pc] for launch, pc in expected]
        assert t.instr[key].tolist() == want, key
    assert t.instr["chip"].tolist() == [0] * len(expected)
    # The busy cycles per unit add up the right kernel's occupancies.
    s = summarize(t)
    occ = {u: 0 for u in t.units}
    for launch, pc in expected:
        k = KERNELS[ORDER[launch]]
        occ[t.units[k["unit"][pc]]] += k["occupancy"][pc]
    for u, cycles in occ.items():
        assert sum(row["busy_cycles"][u] for row in s["units"]) == cycles


def test_large_values_keep_a_wide_type_and_small_ones_a_narrow_one():
    data, _ = _multi_launch_trace(issue_base=3 << 31)
    t = parse_trace(data)
    assert t.instr["issue"].dtype == np.int64 and int(t.instr["issue"].min()) == 3 << 31
    assert t.instr["core"].dtype == np.int8 and t.instr["pc"].dtype == np.int8
    # Other tables keep their int64 columns.
    assert t.wait["start"].dtype == np.int64 and t.dma["seq"].dtype == np.int64
    assert trace_reader._narrowest(-64, 63) == np.int8
    assert trace_reader._narrowest(0, 64) == np.int16
    assert trace_reader._narrowest(0, 1 << 30) == np.int64
    assert trace_reader._narrowest(-(1 << 30), (1 << 30) - 1) == np.int32


def _reference_tables(data: bytes) -> dict:
    """The columns as the reader always decoded them: int64 (float64), delta summed."""
    import json
    import struct

    raw = zlib.decompress(data[trace_reader.HEADER.size:])
    (size,) = struct.unpack_from("<Q", raw)
    meta = json.loads(raw[8:8 + size])
    out = {}
    for table, spec in meta["tables"].items():
        for name, col in spec.items():
            dtype = np.dtype(col["dtype"])
            values = np.frombuffer(raw, dtype, col["length"], 8 + size + col["offset"])
            values = values.astype(np.float64 if dtype.kind == "f" else np.int64)
            out[table, name] = np.cumsum(values) if col["delta"] else values
    return out


@pytest.mark.parametrize("chunk", [3, 1 << 20])
def test_streamed_reader_in_pieces_gives_the_written_columns(monkeypatch, chunk, dma_bound):
    monkeypatch.setattr(trace_reader, "CHUNK", chunk)
    monkeypatch.setattr(trace_reader._Stream, "INPUT", 97)

    def whole(*_):
        raise AssertionError("a well-formed trace is streamed, not decompressed whole")
    monkeypatch.setattr(trace_reader, "zlib", types.SimpleNamespace(
        decompress=whole, decompressobj=zlib.decompressobj, crc32=zlib.crc32, error=zlib.error))
    for data in (_multi_launch_trace(issue_base=(1 << 31) - 100)[0], dma_bound.data):
        t = parse_trace(data)
        reference = _reference_tables(data)
        for (table, name), values in reference.items():
            got = t.tables[table][name]
            assert np.array_equal(got, values) and (got.dtype == values.dtype or table == "instr"), (table, name)
        # Tables and columns in the order the metadata lists them (then the derived columns).
        assert list(t.tables) == list(dict.fromkeys(table for table, _ in reference))
        for table in t.tables:
            listed = [name for tb, name in reference if tb == table]
            assert list(t.tables[table])[:len(listed)] == listed


def test_whole_payload_reader_gives_the_same_trace(monkeypatch, dma_bound):
    streamed = parse_trace(dma_bound.data)

    def refuse(*_):
        raise trace_reader._Refused("test")
    monkeypatch.setattr(trace_reader._Stream, "head", refuse)
    whole = parse_trace(dma_bound.data)
    for table, cols in streamed.tables.items():
        assert list(cols) == list(whole.tables[table])
        for name, values in cols.items():
            assert np.array_equal(values, whole.tables[table][name]) and values.dtype == whole.tables[table][name].dtype


@pytest.mark.parametrize("which", ["dma", "mxu", "multi"])
def test_summary_and_exports_do_not_depend_on_the_piece_size(monkeypatch, which, dma_bound, mxu_bound):
    t = {"dma": dma_bound.trace, "mxu": mxu_bound.trace, "multi": parse_trace(_multi_launch_trace()[0])}[which]
    lo, hi = t.start_cycle, t.end_cycle

    def outputs():
        return ([summarize(t), summarize(t, cores=[1], start=lo + 3, end=(lo + hi) // 2)],
                to_perfetto(t), to_html(t), to_html(t, view(t, cores=[0], start=lo + 5, end=hi - 7)))
    whole = outputs()
    monkeypatch.setattr(trace_summary, "CHUNK", 7)
    assert outputs() == whole


def _unit_runs_one_sort(t, v):
    """unit_runs as it was: one lexsort of every selected busy instruction."""
    instr = {k: np.asarray(c, np.int64) for k, c in t.instr.items()}
    rows = np.flatnonzero((instr["occupancy"] > 0) & v.has_core(instr["core"]))
    start = instr["issue"][rows]
    end = start + instr["occupancy"][rows]
    keep, _, _ = v.clip(start, end)
    rows, start, end = rows[keep], start[keep], end[keep]
    core, unit = instr["core"][rows], instr["unit"][rows]
    order = np.lexsort((start, unit, core))
    rows, core, unit, start, end = rows[order], core[order], unit[order], start[order], end[order]
    new = np.ones(rows.size, bool)
    new[1:] = ~((core[1:] == core[:-1]) & (unit[1:] == unit[:-1]) & (start[1:] <= end[:-1]))
    heads = np.flatnonzero(new)
    return {"core": core[heads], "unit": unit[heads], "start": np.clip(start[heads], v.t0, v.t1),
            "end": np.clip(np.maximum.reduceat(end, heads), v.t0, v.t1) if heads.size else end[heads],
            "count": np.diff(np.append(heads, rows.size)), "first": rows[heads]}


def test_unit_runs_per_core_match_one_sort(dma_bound, mxu_bound):
    for t in (dma_bound.trace, mxu_bound.trace, parse_trace(_multi_launch_trace()[0])):
        lo, hi = t.start_cycle, t.end_cycle
        for v in (view(t), view(t, cores=[1], start=lo + 9, end=hi - 30), view(t, start=hi - 1)):
            runs, want = unit_runs(t, v), _unit_runs_one_sort(t, v)
            assert runs.keys() == want.keys()
            for k in runs:
                assert np.array_equal(runs[k], want[k]) and runs[k].dtype == np.int64, k


def test_core_rows_in_blocks_and_interleaved():
    rng = np.random.default_rng(2)
    blocked = np.repeat(rng.integers(0, 5, 30), rng.integers(1, 9, 30))
    interleaved = rng.integers(0, 5, 20_000)
    for core in (blocked, interleaved, np.zeros(0, np.int64), np.array([3])):
        fake = types.SimpleNamespace(instr={"core": core.astype(np.int16)})
        got = dict(core_rows(fake, range(6)))
        for g in range(6):
            assert np.array_equal(got[g], np.flatnonzero(core == g)), g


def test_intersect_of_unions_matches_the_boundary_point_method():
    rng = np.random.default_rng(3)
    for _ in range(3000):
        sets = []
        for _ in range(2):
            n = int(rng.integers(0, 7))
            s = rng.integers(0, 40, n) + (rng.random(n) * 0.5 if rng.random() < 0.3 else 0)
            sets.append(Spans.union(s, s + rng.integers(0, 9, n)))
        a, b = sets
        fast, slow = a.intersect(b), a._intersect_points(b)
        assert np.array_equal(fast.starts, slow.starts) and np.array_equal(fast.ends, slow.ends)
        assert fast.total == slow.total


def test_events_come_out_by_time_then_order_then_arrival():
    ev = _Events()
    items = [(5, 1, b"c"), (3, 2, b"bb"), (5, 0, b"d"), (3, 2, b"a"), (0, 9, b""), (3, 1, b"eee")]
    for item in items:
        ev.append(item)
    want = b"".join(p for _, _, p in sorted(items, key=lambda e: (e[0], e[1])))   # sorted() is stable
    assert len(ev) == len(items) and ev.in_order([b"head", b"!"]) == b"head!" + want
    assert len(ev) == 0 and ev.in_order() == b""
