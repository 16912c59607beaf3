"""`mkemu trace PATH --perfetto OUT.json`: Chrome trace-event JSON, checked against the
trace-event format (required fields, every B ended by an E on its row with proper
nesting, timestamps in order per row, flows paired and bound to their slices,
numeric counters, named rows) and against the protobuf export of the same view: the
same rows, slices, instants, counters and flows (tools/perfetto.py; docs/traces.md,
"Perfetto")."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from itertools import pairwise
from pathlib import Path

import pytest

import mkemu
from mkemu.cli import main
from mkemu.tools.perfetto import format_for, to_perfetto
from mkemu.tools.trace_reader import read_trace
from mkemu.tools.view import view

from protobuf_wire import read_perfetto

ROOT = Path(__file__).parents[2]
ALL_REDUCE = ROOT / "programs" / "examples" / "all_reduce.mk"
PHASES = {1: "B", 2: "E", 3: "i", 4: "C"}          # protobuf TrackEvent.type -> JSON ph


@pytest.fixture(scope="module")
def all_reduce(tmp_path_factory) -> Path:
    """all_reduce on two test-profile chips (1 GHz: a nanosecond is a cycle), traced."""
    path = tmp_path_factory.mktemp("json") / "ar.mkt"
    assert main(["run", str(ALL_REDUCE), "--mesh", "2x1x1", "--hw", "test", "--trace", str(path)]) == 0
    return path


def _export(tmp_path: Path, trace: Path, name: str, *flags: str):
    out = tmp_path / name
    assert main(["trace", str(trace), "--perfetto", str(out), *flags]) == 0
    return out


def validate(doc: dict) -> dict:
    """Check a trace-event JSON object against the format; returns what it found:
    `rows` ((pid, tid) -> thread name), `processes` (pid -> name), `counters`
    (names), `slices` ((pid, tid) -> [(name, begin ts, end ts)], in order of their
    begins), `flows` (id -> (s event, f event))."""
    assert doc["displayTimeUnit"] == "ns"
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    processes, rows, sort_index = {}, {}, {}
    for e in events:
        assert isinstance(e["ph"], str) and isinstance(e["pid"], int)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index")
            if e["name"] == "process_name":
                processes[e["pid"]] = e["args"]["name"]
            elif e["name"] == "thread_name":
                rows[e["pid"], e["tid"]] = e["args"]["name"]
            elif e["name"] == "thread_sort_index":
                sort_index[e["pid"], e["tid"]] = e["args"]["sort_index"]
    assert set(sort_index) == set(rows) and all(isinstance(i, int) for i in sort_index.values())
    assert all(isinstance(n, str) and n for n in [*processes.values(), *rows.values()])
    assert len({tid for _, tid in rows}) == len(rows) and not {tid for _, tid in rows} & set(processes)

    last_ts: dict = {}
    stacks: dict = defaultdict(list)
    slices: dict = defaultdict(list)
    starts, finishes, counters = {}, {}, set()
    pending_finish: dict = {}                      # row -> an f waiting for the instant it binds to
    for e in events:
        ph = e["ph"]
        if ph == "M":
            continue
        ts = e["ts"]
        assert isinstance(ts, (int, float)) and not isinstance(ts, bool) and ts >= 0
        assert e["pid"] in processes, e
        if ph == "C":
            assert isinstance(e["name"], str) and e["name"] and "tid" not in e
            assert e["args"] and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                     for x in e["args"].values())
            counters.add((e["pid"], e["name"], *e["args"]))
            key = (e["pid"], "C", e["name"])
        else:
            key = (e["pid"], e["tid"])
            assert key in rows, f"an event on an unnamed row: {e}"
        assert ts >= last_ts.get(key, 0), f"time goes back on {key}: {e}"
        last_ts[key] = ts
        if key in pending_finish:
            assert ph == "i" and ts == pending_finish.pop(key)["ts"], "an f binds to the next slice: its landing"
        if ph == "B":
            assert isinstance(e["name"], str) and e["name"]
            stacks[key].append(e)
        elif ph == "E":
            assert stacks[key], f"an E without its B: {e}"
            begin = stacks[key].pop()
            assert begin["ts"] <= ts
            slices[key].append((begin["name"], begin["ts"], ts, len(stacks[key])))
        elif ph == "i":
            assert e["s"] == "t" and isinstance(e["name"], str) and e["name"]
        elif ph == "s":
            assert e["id"] not in starts, "flow ids are unique"
            # Bound to the enclosing slice: the DMA whose B came just before, at its time.
            assert stacks[key] and stacks[key][-1]["ts"] == ts and "args" in stacks[key][-1]
            starts[e["id"]] = e
        elif ph == "f":
            assert e["id"] in starts and e["id"] not in finishes, "every f follows its s, once"
            s = starts[e["id"]]
            assert (s["name"], s["cat"]) == (e["name"], e["cat"]) and s["ts"] <= ts
            finishes[e["id"]] = e
            pending_finish[key] = e
        elif ph != "C":
            raise AssertionError(f"unexpected phase {ph}")
    assert not any(stacks.values()), "a B without its E"
    assert not pending_finish and set(starts) == set(finishes), "every flow has both ends"
    # Nesting: on each row a slice that begins inside another ends inside it too.
    for key, found in slices.items():
        opened = sorted(found, key=lambda s: (s[1], s[3]))
        for (_, b0, e0, d0), (_, b1, e1, d1) in pairwise(opened):
            assert e0 <= b1 or (d1 > d0 and e1 <= e0), f"slices overlap on {rows[key]}"
    return {"rows": rows, "processes": processes, "counters": counters,
            "slices": {k: [s[:3] for s in sorted(v, key=lambda s: (s[1], s[3]))] for k, v in slices.items()},
            "flows": {i: (starts[i], finishes[i]) for i in starts}}


def _json_sequence(doc: dict) -> list[tuple]:
    """The B/E/i/C events in file order as (ph, chip, row, name, ns, args or value)."""
    events = doc["traceEvents"]
    process = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    rows = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    out = []
    for e in events:
        if e["ph"] in "BEi":
            out.append((e["ph"], process[e["pid"]], rows[e["pid"], e["tid"]], e.get("name") if e["ph"] != "E" else None,
                        round(e["ts"] * 1000), e.get("args", {})))
        elif e["ph"] == "C":
            (unit, value), = e["args"].items()
            out.append(("C", process[e["pid"]], f"{e['name']} {unit}", None, round(e["ts"] * 1000), value))
    return out


def _protobuf_sequence(data: bytes) -> tuple[list[tuple], set[int]]:
    """The same from the protobuf export, and the ids of the flows that end in it."""
    tracks, events = read_perfetto(data)
    out = []
    for e in events:
        row = tracks[e["track"]]
        chip = tracks[row["parent"]]["name"]
        ph = PHASES[e["type"]]
        out.append((ph, chip, row["name"], e["name"], e["ts"], e["value"] if ph == "C" else e["args"]))
    return out, {f for e in events for f in e["ends"]}


def _same_content(doc: dict, pb: bytes) -> None:
    seq, ends = _protobuf_sequence(pb)
    assert _json_sequence(doc) == seq
    flows = validate(doc)["flows"]
    assert set(flows) == ends and ends


def test_json_export_is_valid_trace_event_json_with_the_protobufs_content(all_reduce, tmp_path):
    out = _export(tmp_path, all_reduce, "ar.json")
    doc = json.loads(out.read_text())
    found = validate(doc)
    assert sorted(found["processes"].values()) == ["chip 0", "chip 1"]
    names = Counter(found["rows"].values())
    for row in ("core 0 regions", "core 0 stalls", "core 1 scalar", "core 0 DMA engine 0", "core 1 DMAs landed"):
        assert names[row] == 2, row                # one per chip
    counters = {name for _, name, _ in found["counters"]}
    assert {"chip 0 HBM", "chip 1 HBM"} < counters           # and the links the DMAs used
    assert all(unit == "GB/s" for _, _, unit in found["counters"])
    kinds = Counter(e["ph"] for e in doc["traceEvents"])
    assert kinds["B"] == kinds["E"] > 0 and kinds["s"] == kinds["f"] == kinds["i"] > 0 and kinds["C"] > 0
    # The same rows, slices (names and counts), instants, counters and flows as the
    # protobuf export, event for event in the same order (test profile: 1 GHz, so
    # the protobuf's nanoseconds are the JSON's microseconds times 1000 exactly).
    pb = _export(tmp_path, all_reduce, "ar.pftrace")
    _same_content(doc, pb.read_bytes())
    tracks, _ = read_perfetto(pb.read_bytes())
    assert Counter((found["processes"][pid], name) for (pid, _), name in found["rows"].items()) == Counter(
        (tracks[t["parent"]]["name"], t["name"]) for t in tracks.values() if t["parent"] and t["unit"] is None)
    by_name = Counter(name for key in found["slices"] for name, _, _ in found["slices"][key])
    assert by_name["wait semaphore"] > 0 and any(n.startswith("hbm->") or "->" in n for n in by_name)
    # Remote DMAs: flows from one chip's engine to the other chip's landings.
    assert any(s["pid"] != f["pid"] for s, f in found["flows"].values())


def test_json_window_and_core_selection_match_the_protobuf(all_reduce, tmp_path):
    t = read_trace(all_reduce)
    lo, hi = t.start_cycle + 1500, t.start_cycle + 4200
    flags = ["--from", str(lo), "--to", str(hi), "--chip", "1", "--core", "0"]
    doc = json.loads(_export(tmp_path, all_reduce, "w.json", *flags).read_text())
    found = validate(doc)
    assert set(found["processes"].values()) == {"chip 1"}
    assert all(name.startswith("core 0 ") for name in found["rows"].values())
    stamps = [e["ts"] for e in doc["traceEvents"] if e["ph"] != "M"]
    assert stamps and lo / 1000 <= min(stamps) and max(stamps) <= hi / 1000      # 1 GHz: cycles / 1000 us
    _same_content(doc, _export(tmp_path, all_reduce, "w.pftrace", *flags).read_bytes())
    # The library call gives the same bytes.
    assert to_perfetto(t, view(t, [1], [0], lo, hi), "json") == (tmp_path / "w.json").read_bytes()


def test_the_file_name_chooses_the_format(all_reduce, tmp_path):
    t = read_trace(all_reduce)
    protobuf = to_perfetto(t)
    assert to_perfetto(t, fmt="protobuf") == to_perfetto(t, path="x.perfetto-trace") == protobuf
    for name in ("a.pftrace", "a.pb", "json"):
        assert format_for(name) == "protobuf"
        assert _export(tmp_path, all_reduce, name).read_bytes() == protobuf
    for name in ("a.json", "B.JSON"):
        assert format_for(name) == "json"
        assert json.loads(_export(tmp_path, all_reduce, name).read_text())["traceEvents"]
    read_perfetto(protobuf)                    # parses as protobuf
    with pytest.raises(ValueError):
        json.loads(protobuf)                   # ... and is not JSON
    with pytest.raises(ValueError, match="unknown Perfetto format"):
        to_perfetto(t, fmt="xml")


def test_a_one_cycle_slice_has_a_length_in_json():
    # tpu-v7-like runs at 2.2 GHz: a cycle is 0.45 ns, so the protobuf's whole
    # nanoseconds give a one-cycle unit run no length; the JSON's picoseconds do.
    trace = mkemu.compile("vector_add", mesh="1", trace=True)().report.trace
    assert trace.clock_hz > 1e9
    doc = json.loads(to_perfetto(trace, fmt="json"))
    found = validate(doc)
    spans = [(b, e) for key in found["slices"] for _, b, e in found["slices"][key]]
    short = [(b, e) for b, e in spans if 0 < e - b < 1e-3]
    assert short, "no slice under a nanosecond"
    cycle_us = 1e6 / trace.clock_hz
    assert all(e - b > cycle_us / 2 for b, e in short)          # each is at least a cycle long
    # Every slice's and instant's time is its cycle's to the picosecond.
    for e in doc["traceEvents"]:
        if e["ph"] in "BEi":
            assert e["ts"] == pytest.approx(round(e["ts"] / cycle_us) * cycle_us, abs=0.6e-6)
    # The protobuf has the same slices, but many of those under a nanosecond have no length.
    _, events = read_perfetto(to_perfetto(trace))
    open_at, zero = defaultdict(list), 0
    for e in events:
        if e["type"] == 1:
            open_at[e["track"]].append(e["ts"])
        elif e["type"] == 2:
            zero += open_at[e["track"]].pop() == e["ts"]
    assert sum(e["type"] == 1 for e in events) == len(spans)
    assert zero > sum(b == e for b, e in spans)
