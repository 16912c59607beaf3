"""The trace tools against hand-computed figures, and their outputs' validity."""

from __future__ import annotations

import json
import re
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from mkemu.cli import main
from mkemu.errors import ConfigError, TraceError
from mkemu.tools import trace_diff
from mkemu.tools.perfetto import to_perfetto
from mkemu.tools.plot import LEGEND, SCREEN_PX, timeline, to_html, to_png
from mkemu.tools.view import view
from mkemu.tools.trace_reader import HEADER, parse_trace, read_trace
from mkemu.tools.trace_summary import render_text, summarize

from protobuf_wire import read_perfetto
from trace_programs import DMA_BOUND, DMA_BOUND_BYTES_PER_CORE, MXU_ROUNDS, record


def _hbm(summary):
    return next(b for b in summary["bandwidth"] if b["kind"] == "hbm")


def test_dma_bound_loop_keeps_hbm_busy(dma_bound):
    s = summarize(dma_bound.trace)
    window = dma_bound.result.cycles - 1000            # the launch overhead is not kernel time
    assert s["window_cycles"] == window
    hbm = _hbm(s)
    assert hbm["bytes"] == 2 * DMA_BOUND_BYTES_PER_CORE
    # 1 MiB at 64 B/cycle is 16384 cycles; only the first DMA's start latency is idle.
    assert hbm["active"] * window == pytest.approx(16384)
    assert hbm["utilisation"] == pytest.approx(16384 / window)
    assert hbm["utilisation"] > 0.99
    # Both cores wait for their DMAs almost the whole time.
    assert s["stalls"]["cycles"]["dma"] == sum(dma_bound.result.stall_cycles.values())
    assert s["bubbles"][0]["cycles"] == window - 16384
    assert "dma.start" in s["bubbles"][0]["next_dma"]["instruction"]
    copy = next(r for r in s["regions"] if r["region"] == "copy")
    assert copy["instances"] == 2 and copy["dma_bytes"] == 2 * DMA_BOUND_BYTES_PER_CORE


def test_mxu_bound_loop_keeps_the_matrix_unit_busy(mxu_bound):
    s = summarize(mxu_bound.trace)
    window = mxu_bound.result.cycles - 1000
    # ldw: 16 cycles on the weight path from 1002; then 4*ROUNDS MACs of 8 cycles
    # back to back on the array from 1018 (after the weights are ready); the kernel
    # halts at 1018 + (4*ROUNDS - 1)*8 + 3, cutting the last MAC's busy time short.
    last_mac = 1018 + (4 * MXU_ROUNDS - 1) * 8
    assert mxu_bound.result.cycles == last_mac + 3
    busy_in_window = mxu_bound.result.cycles - 1018
    for core in s["units"]:
        assert core["busy_cycles"]["mxu0.w"] == 16
        assert core["busy_cycles"]["mxu0"] == busy_in_window
        assert core["busy"]["mxu0"] == pytest.approx(busy_in_window / window)
        assert core["busy"]["mxu1"] == 0
    assert _hbm(s)["bytes"] == 0
    assert s["stalls"]["cycles"]["unit"] == mxu_bound.result.stall_cycles["unit"]
    assert any(r["region"] == "region1" for r in s["regions"])   # no names in a .s kernel


def test_filters(dma_bound):
    t = dma_bound.trace
    one = summarize(t, cores=[1])
    assert [(u["chip"], u["core"]) for u in one["units"]] == [(0, 1)]
    early = summarize(t, start=1000, end=1016)
    assert early["window_cycles"] == 16 and _hbm(early)["bytes"] == 0
    # One open end: the window runs to the launches' own start or end (it was 0 cycles).
    assert summarize(t, end=1016)["window_cycles"] == 16
    assert summarize(t, start=1016)["window_cycles"] == dma_bound.result.cycles - 1016
    region = summarize(t, region="copy")
    assert region["window_cycles"] == 8 * 4              # 8 rounds of 4 one-cycle instructions
    assert summarize(t, region="kernel:main")["window_cycles"] == dma_bound.result.cycles - 1000
    with pytest.raises(ConfigError, match="no region 'nope'"):
        summarize(t, region="nope")
    with pytest.raises(ConfigError, match="no core"):
        summarize(t, chips=[3])
    assert "top HBM bubbles" in render_text(summarize(t))


NESTED = """
.buffer a f32 8x128 input
.kernel main
    .smem 0 4096 1 0 0 1 0 0
    li s1, @a
    li s3, 0
    li s4, 0
    li s5, 2
    li s8, 0
layer:
    mark.push 0, s8
    mark.push 1, s8
    dma.start vmem[s0], hbm[s1], s3, s4
    li s6, 4096
    sem.wait s4, s6
    mark.pop
    mark.push 2, s8
    mark.pop
    mark.pop
    addi s8, s8, 1
    bne s8, s5, layer
    mark.push 0, s8
    halt
"""


def test_nested_regions_and_per_index_rows():
    rec = record(NESTED, regions=("layer", "load", "empty"))
    r = rec.trace.region
    names = [rec.trace.region_names[i] for i in r["name"]]
    assert names.count("layer") == 2 * 2 + 2        # 2 layers per core, plus one left open at halt
    assert set(r["depth"][np.array(names) == "load"]) == {1}
    s = summarize(rec.trace, cores=[0])
    labels = {row["region"] for row in s["regions"]}
    assert {"layer", "layer[0]", "layer[1]", "load", "empty"} <= labels
    load0 = next(row for row in s["regions"] if row["region"] == "load[0]")
    assert load0["dma_bytes"] == 4096


def test_html_and_timeline(dma_bound):
    page = to_html(dma_bound.trace)
    assert page.startswith("<!DOCTYPE html>")
    svgs = re.findall(r"<svg.*?</svg>", page, re.S)
    for svg in svgs:
        ET.fromstring(svg)                                # well-formed
    rows = [r for g in timeline(dma_bound.trace)["groups"] for r in g["rows"]]
    hbm = next(r for r in rows if r["kind"] == "hbm")
    assert hbm["values"].max() == pytest.approx(1.0)


def test_diff_same_and_different(dma_bound, mxu_bound):
    same = trace_diff.diff(dma_bound.trace, dma_bound.trace)
    assert same["emulated_cycles"]["delta"] == 0
    assert all(r["delta_cycles"] == 0 for r in same["regions"])
    other = trace_diff.diff(dma_bound.trace, mxu_bound.trace)
    main_row = next(r for r in other["regions"] if r["region"] == "kernel:main")
    assert main_row["delta_cycles"] == (mxu_bound.result.cycles - dma_bound.result.cycles)
    assert "kernel:main" in trace_diff.render_text(other)


@pytest.mark.parametrize("damage", ["truncate", "flip", "magic", "version", "flags", "empty", "extra"])
def test_damaged_trace_gives_a_clear_error(dma_bound, tmp_path, damage, capsys):
    data = bytearray(dma_bound.data)
    if damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "flip":
        data[-10] ^= 0xFF
    elif damage == "magic":
        data[:8] = b"NOTATRCE"
    elif damage == "version":
        data[8:12] = struct.pack("<I", 99)
    elif damage == "flags":   # "flags (u32), 0": a flag this reader does not know is refused
        data[12:16] = struct.pack("<I", 1)
    elif damage == "empty":
        data = bytearray()
    else:
        data += b"junk"
    path = tmp_path / "bad.mkt"
    path.write_bytes(bytes(data))
    with pytest.raises(TraceError) as info:
        read_trace(str(path))
    assert str(path) in info.value.render()
    assert main(["trace", str(path)]) == 1
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


def test_reader_rejects_inconsistent_metadata(dma_bound):
    # A well-formed container whose tables point outside the metadata.
    import zlib

    magic, version, flags, raw_size, packed_size, crc = HEADER.unpack_from(dma_bound.data)
    raw = bytearray(zlib.decompress(dma_bound.data[HEADER.size:]))
    (meta_size,) = struct.unpack_from("<Q", raw)
    meta = json.loads(raw[8:8 + meta_size])
    meta["cores"] = meta["cores"][:1]
    head = json.dumps(meta).encode()
    raw = struct.pack("<Q", len(head)) + head + bytes(raw[8 + meta_size:])
    packed = zlib.compress(raw)
    data = HEADER.pack(magic, version, flags, len(raw), len(packed), zlib.crc32(packed)) + packed
    with pytest.raises(TraceError, match="outside"):
        parse_trace(data)


def _meta_altered(data: bytes, tmp_path, where: tuple, value) -> Path:
    """A well-formed container (right checksum) of trace `data` whose metadata at `where`
    holds `value` ("delete": the key is gone)."""
    import zlib

    magic, version, flags, raw_size, packed_size, crc = HEADER.unpack_from(data)
    raw = bytearray(zlib.decompress(data[HEADER.size:]))
    (meta_size,) = struct.unpack_from("<Q", raw)
    meta = json.loads(raw[8:8 + meta_size])
    inner = meta
    for key in where[:-1]:
        inner = inner[key]
    if value == "delete":
        del inner[where[-1]]
    else:
        inner[where[-1]] = value
    head = json.dumps(meta).encode()
    raw = struct.pack("<Q", len(head)) + head + bytes(raw[8 + meta_size:])
    packed = zlib.compress(raw)
    path = tmp_path / "odd.mkt"
    path.write_bytes(HEADER.pack(magic, version, flags, len(raw), len(packed), zlib.crc32(packed)) + packed)
    return path


@pytest.mark.parametrize("where, value", [
    (("units",), [1, 2]), (("units",), []), (("spaces",), "x"), (("cores", 0, "core"), None),
    (("cores", 0, "gid"), None), (("launches", 0, "end"), "x"), (("launches", 0, "kernel"), []),
    (("launches", 0, "end"), 10**15),     # a launch past the run's end (the summary's window would take it)
    (("resources", 0, "name"), None), (("resources", 0, "chip"), None), (("resources", 0, "kind"), "x"),
    (("kernels", "main", "source"), "x"), (("kernels", "main", "text"), None),
    (("tables", "dma", "seq", "delta"), None), (("tables", "dma", "res_start", "dtype"), None),
    (("tables", "region", "depth"), "delete"), (("format",), "other-trace"), (("version",), 2),
    (("fault",), {"kind": "race"}), (("fault",), "x"),
    # (numbers the exports would write as `inf` or `nan`, which is not JSON)
    (("resources", 0, "bw_bytes_per_cycle"), float("inf")), (("resources", 0, "bw_bytes_per_cycle"), 10**400),
    (("clock_hz",), 10**400),
    (("tables", "dma", "seq", "length"), float("inf")),   # (int(inf): an OverflowError traceback)
    (("fault",), {"kind": "race", "message": "m", "chip": 0, "core": 0, "cycle": 5, "pc": -2**63,
                  "instruction": None, "source": None}),      # (printed as `pc -0x8000000000000000`)
])
def test_reader_rejects_metadata_of_the_wrong_shape(dma_bound, tmp_path, capsys, where, value):
    # A well-formed container (right checksum) whose metadata the tools could not read.
    path = _meta_altered(dma_bound.data, tmp_path, where, value)
    for argv in ([], ["--json"], ["--html", str(tmp_path / "o.html")], ["--perfetto", str(tmp_path / "o.pf")]):
        assert main(["trace", str(path), *argv]) == 1
        out, err = capsys.readouterr()
        assert f"{path}: error: corrupted trace" in err and "Traceback" not in out + err


def test_a_clock_so_slow_the_nanoseconds_pass_int64_is_refused_by_the_perfetto_export_only(dma_bound, tmp_path,
                                                                                            capsys):
    # (a real, if absurd, profile: the summary reads it; the timestamps wrapped negative, an IndexError)
    path = _meta_altered(dma_bound.data, tmp_path, ("clock_hz",), 1e-6)
    assert main(["trace", str(path)]) == 0
    capsys.readouterr()
    assert main(["trace", str(path), "--perfetto", str(tmp_path / "o.pf")]) == 1
    out, err = capsys.readouterr()
    assert f"{path}: error: a time of " in err and "past what a Perfetto timestamp holds" in err
    assert "Traceback" not in out + err and not (tmp_path / "o.pf").exists()


@pytest.mark.parametrize("table, col, value", [
    ("wait", "start", 10**12), ("region", "start", 10**12), ("instr", "stall_dep", -5), ("instr", "stall_unit", -1),
    ("dma", "begun", 0), ("rate", "bytes_per_cycle", float("nan")), ("rate", "bytes_per_cycle", float("inf")),
    ("rate", "bytes_per_cycle", -1.0),
    ("dma", "done", 2**63 - 1),      # (the Perfetto export's nanoseconds wrapped negative: an IndexError)
])
def test_reader_rejects_times_and_rates_no_run_writes(dma_bound, tmp_path, capsys, table, col, value):
    # A well-formed container whose first row of a column was altered: the summary had
    # printed negative stalls and dropped regions, the Perfetto export wrote `nan`.
    import zlib

    magic, version, flags, raw_size, packed_size, crc = HEADER.unpack_from(dma_bound.data)
    raw = bytearray(zlib.decompress(dma_bound.data[HEADER.size:]))
    (meta_size,) = struct.unpack_from("<Q", raw)
    spec = json.loads(raw[8:8 + meta_size])["tables"][table][col]
    assert spec["length"] > 0    # (in a delta-coded column too, the first value is the value itself)
    at = 8 + meta_size + spec["offset"]
    dtype = np.dtype(spec["dtype"])
    raw[at:at + dtype.itemsize] = np.array([value], dtype).tobytes()
    packed = zlib.compress(bytes(raw))
    path = tmp_path / "odd.mkt"
    path.write_bytes(HEADER.pack(magic, version, flags, len(raw), len(packed), zlib.crc32(packed)) + packed)
    for argv in ([], ["--json"], ["--perfetto", str(tmp_path / "o.json")], ["--perfetto", str(tmp_path / "o.pf")]):
        assert main(["trace", str(path), *argv]) == 1
        out, err = capsys.readouterr()
        assert f"{path}: error: corrupted trace" in err and "Traceback" not in out + err
    assert not (tmp_path / "o.json").exists()


def test_cli_run_trace_and_commands(tmp_path, capsys):
    src = tmp_path / "copy.s"
    src.write_text(DMA_BOUND)
    a, b = tmp_path / "a.mkt", tmp_path / "b.mkt"
    for out in (a, b):
        assert main(["run", str(src), "--hw", "test", "--mesh", "1x1x1", "--trace", str(out)]) == 0
    assert a.read_bytes() == b.read_bytes()
    capsys.readouterr()
    assert main(["trace", str(a), "--json", "--core", "0"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["filters"]["cores"] == [0] and _hbm(s)["utilisation"] > 0.99
    assert main(["trace", str(a), "--from", "1000", "--to", "5000", "--chip", "0"]) == 0
    assert "window: 4,000 cycles" in capsys.readouterr().out
    perf, page = tmp_path / "p.pftrace", tmp_path / "p.html"
    assert main(["trace", str(a), "--perfetto", str(perf), "--html", str(page)]) == 0
    tracks, events = read_perfetto(perf.read_bytes())
    assert events and {e["track"] for e in events} <= set(tracks)
    assert "<svg" in page.read_text()
    assert main(["trace", "diff", str(a), str(b)]) == 0
    assert "B-A" in capsys.readouterr().out
    assert main(["trace", "diff", str(a)]) == 1
    assert "two traces" in capsys.readouterr().err


def test_window_narrows_instruction_and_region_counts():
    t = record(NESTED, regions=("layer", "load", "empty")).trace
    whole = summarize(t)
    lo, hi = t.launches[0]["start"], t.launches[0]["end"]
    mid = int(t.region["end"][0])                      # the end of the first layer
    first, second = summarize(t, start=lo, end=mid), summarize(t, start=mid, end=hi)
    assert first["instructions"] + second["instructions"] == whole["instructions"]
    assert 0 < first["instructions"] < whole["instructions"]

    def instances(s, label):
        return next((r["instances"] for r in s["regions"] if r["region"] == label), 0)
    # Each core runs layer 0 then layer 1: the first window holds only layer 0.
    assert instances(first, "layer[0]") == instances(whole, "layer[0]") == 2
    assert instances(first, "layer[1]") == 0 and instances(second, "layer[1]") == 2
    assert instances(first, "layer") < instances(whole, "layer")


def test_bubbles_at_one_site_are_listed_once():
    # Both layers' DMAs start from the same instruction: the HBM idles before each of
    # them, and the summary lists that site once with both occurrences.
    s = summarize(record(NESTED, regions=("layer", "load", "empty")).trace)
    sites = [(b.get("next_dma") or {}).get("pc") for b in s["bubbles"]]
    assert len(sites) == len(set(sites))
    top = s["bubbles"][0]
    assert top["count"] == 2 and top["next_dma"]["instruction"].startswith("dma.start")
    assert top["total_cycles"] > top["cycles"] > 0
    assert "2 bubble(s)" in render_text(s)


def _slices(events):
    """Per track: (name, begin, end) of every slice; checks begins and ends nest."""
    out, stacks = {}, {}
    for e in events:
        if e["type"] == 1:
            stacks.setdefault(e["track"], []).append(e)
        elif e["type"] == 2:
            begin = stacks[e["track"]].pop()
            out.setdefault(e["track"], []).append((begin["name"], begin["ts"], e["ts"]))
    assert not any(stacks.values()), "a slice without its end"
    return out


def _check_perfetto(data: bytes):
    tracks, events = read_perfetto(data)
    chips = {u for u, t in tracks.items() if t["pid"] is not None}
    assert all(t["parent"] in chips for u, t in tracks.items() if u not in chips)
    assert {e["track"] for e in events} <= set(tracks) - chips
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)
    for e in events:
        if e["type"] == 4:
            assert tracks[e["track"]]["unit"] == "GB/s" and e["value"] >= 0
    flows = [f for e in events for f in e["flows"]]
    assert len(flows) == len(set(flows))
    assert {f for e in events for f in e["ends"]} <= set(flows)
    return tracks, events, _slices(events)


def test_perfetto_protobuf_units_as_busy_runs(mxu_bound):
    tracks, events, slices = _check_perfetto(to_perfetto(mxu_bound.trace))
    # test profile: 1 GHz, so nanoseconds are cycles. The array mxu0 is busy back to back
    # from the first MAC (cycle 1018, when the weights are ready) to the end of the run:
    # one slice per core; the weight load is a slice of its own path.
    for core in (0, 1):
        track = next(u for u, t in tracks.items() if t["name"] == f"core {core} mxu0")
        assert slices[track] == [(f"mxu.mac +{4 * MXU_ROUNDS - 1}", 1018, mxu_bound.result.cycles)]
        track = next(u for u, t in tracks.items() if t["name"] == f"core {core} mxu0.w")
        assert slices[track] == [("mxu.ldw", 1002, 1018)]
    names = [t["name"] for t in tracks.values()]
    assert "chip 0" in names and "core 0 regions" in names and "core 1 stalls" in names


def test_perfetto_protobuf_dmas_flows_regions_and_counters(dma_bound):
    tracks, events, slices = _check_perfetto(to_perfetto(dma_bound.trace))
    dmas = [e for e in events if e["type"] == 1 and e["flows"]]
    assert len(dmas) == dma_bound.trace.dma["seq"].size == 16
    assert all(e["args"]["bytes"] == 65536 and e["name"] == "hbm->vmem" for e in dmas)
    landed = [e for e in events if e["type"] == 3]
    assert sorted(f for e in landed for f in e["ends"]) == sorted(f for e in dmas for f in e["flows"])
    # All 8 DMAs of a core are issued at once and the test profile's engine moves 4 at
    # a time (dma.max_in_flight): 4 rows of DMA slices per core, never overlapping.
    engine_rows = {t["name"] for u, t in tracks.items() if "DMA engine" in t["name"] and u in slices}
    assert engine_rows == {f"core {c} DMA engine {lane}" for c in (0, 1) for lane in range(4)}
    regions = [s for u, t in tracks.items() if t["name"].endswith("regions") for s in slices.get(u, [])]
    assert sorted(name for name, _, _ in regions) == ["copy[0]", "copy[0]"]
    hbm = next(u for u, t in tracks.items() if t["name"] == "chip 0 HBM GB/s")
    # 64 B/cycle at 1 GHz; segments are scaled to add up to each DMA's bytes (within 0.1%).
    assert max(e["value"] for e in events if e["track"] == hbm) == pytest.approx(64.0, rel=1e-3)


def test_exports_honour_chips_cores_and_the_window(dma_bound):
    t = dma_bound.trace
    v = view(t, cores=[1], start=1100, end=1500)
    tracks, events, slices = _check_perfetto(to_perfetto(t, v))
    assert not any(name["name"].startswith("core 0") for name in tracks.values())
    assert events and all(1100 <= e["ts"] <= 1500 for e in events)
    rows = [r["label"] for g in timeline(t, v)["groups"] for r in g["rows"]]
    assert rows and not any("core 0" in label for label in rows)
    assert timeline(t, v)["t0"] == 1100 and timeline(t, v)["t1"] == 1500
    with pytest.raises(ConfigError, match="select no kernel time"):
        view(t, start=10**9)


def test_html_groups_fit_a_screen_with_axis_stalls_and_legend(tmp_path):
    rec = record(NESTED, regions=("layer", "load", "empty"), mesh=(4, 2, 1))
    tl = timeline(rec.trace)
    assert len(tl["groups"]) > 1 and sorted(c for g in tl["groups"] for c in g["chips"]) == list(range(8))
    for group in tl["groups"]:
        rows = group["rows"]
        assert sum(13 if "spans" in r else 9 for r in rows) <= SCREEN_PX
        for chip in group["chips"]:
            for core in (0, 1):
                assert f"chip {chip} core {core} stalls" in [r["label"] for r in rows]
    page = to_html(rec.trace)
    assert page.count('class="axis"') == len(tl["groups"])
    assert all(LEGEND[k] in page for k in ("mxu", "stall", "layer", "op", "hbm", "engine"))
    labels = re.findall(r'<text class="lbl"[^>]*>([^<]*)</text>', page)
    assert "layer[0]" in labels and "load[1]" in labels


def test_png_and_its_missing_dependency(dma_bound, monkeypatch, tmp_path, capsys):
    assert to_png(dma_bound.trace).startswith(b"\x89PNG")
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    path = tmp_path / "t.mkt"
    path.write_bytes(dma_bound.data)
    assert main(["trace", str(path), "--plot", str(tmp_path / "t.png")]) == 1
    assert "pip install 'mkemu[plot]'" in capsys.readouterr().err


def test_exports_refuse_a_region_filter(dma_bound, tmp_path, capsys):
    path = tmp_path / "t.mkt"
    path.write_bytes(dma_bound.data)
    assert main(["trace", str(path), "--perfetto", str(tmp_path / "t.pftrace"), "--region", "copy"]) == 1
    assert "--region narrows the summary" in capsys.readouterr().err


FAULTS_MID_COPY = """\
kernel k(x: hbm f32[64, 1024], y: hbm f32[8, 128], n: i32) {
    vmem v: f32[64, 1024];
    vmem w: f32[8, 128];
    sem s;
    sem t;
    region "load" {
        start copy(x, v, s);
        for i in 0..100 { w = w + 1.0; }
        let z = 5 / n;
    }
    wait copy(x, v, s);
    start copy(w, y, t);
    wait copy(w, y, t);
}
host { input x: f32[64, 1024]; output y: f32[8, 128]; launch k(x, y, 0); }
"""


def test_a_run_that_faults_writes_its_trace_up_to_the_fault(tmp_path, capsys, dma_bound):
    src, out = tmp_path / "f.mk", tmp_path / "f.mkt"
    src.write_text(FAULTS_MID_COPY)
    assert main(["run", str(src), "--hw", "test", "--mesh", "1", "--trace", str(out)]) == 1
    err = capsys.readouterr().err
    assert "fault [divide-by-zero] at chip 0, core 0" in err and f"trace up to the fault: {out}" in err
    t = read_trace(str(out))
    fault = t.meta["fault"]
    assert fault["kind"] == "divide-by-zero" and fault["source"].endswith("let z = 5 / n;")
    assert t.end_cycle == fault["cycle"] and t.launches[-1]["end"] == fault["cycle"]
    # The copy was still moving: begun, not done; the bytes it moved so far count.
    assert t.dma["begun"][0] >= 0 and t.dma["done"][0] == -1
    s = summarize(t)
    assert s["fault"] == fault
    moved = _hbm(s)["bytes"]
    assert 0 < moved < 64 * 1024 * 4
    # Both cores ran the loop up to the fault; the region still open closes there.
    assert {r["region"]: r["instances"] for r in s["regions"]}["load"] == 2
    assert "the run ended in a fault: [divide-by-zero] at chip 0, core 0, cycle" in render_text(s)
    for export in ("--perfetto", "--html"):
        assert main(["trace", str(out), export, str(tmp_path / f"e{export[2:]}")]) == 0
    # A run that ended normally has none.
    assert summarize(dma_bound.trace)["fault"] is None and "fault" not in render_text(summarize(dma_bound.trace))
    # A diff says which side faulted (its fewer cycles are no speed-up); its JSON is unchanged.
    clean = tmp_path / "clean.mkt"
    clean.write_bytes(dma_bound.data)
    assert main(["trace", "diff", str(clean), str(out)]) == 0
    text = capsys.readouterr().out
    assert "B ended in a fault, so its figures stop there: [divide-by-zero] at chip 0, core 0" in text
    assert "A ended in a fault" not in text
    with pytest.raises(SystemExit) as info:
        main(["trace", "diff", "--help"])
    assert info.value.code == 0 and "diff compares two traces' figures" in capsys.readouterr().out


def test_a_fault_at_a_launchs_end_keeps_one_row_per_region(tmp_path, capsys):
    # semaphore-nonzero is found after the launch's end was recorded (regions still open
    # at halt closed there): the fault's trace does not close them a second time.
    src, out = tmp_path / "r.s", tmp_path / "r.mkt"
    src.write_text(".kernel main\n    li s1, 3\n    li s2, 5\n    mark.push 0, s0\n    sem.signal s1, s2\n    halt\n")
    assert main(["run", str(src), "--hw", "test", "--mesh", "1", "--trace", str(out)]) == 1
    assert "fault [semaphore-nonzero]" in capsys.readouterr().err
    t = read_trace(str(out))
    assert t.meta["fault"]["kind"] == "semaphore-nonzero"
    assert sorted(t.region["core"].tolist()) == [0, 1]


def test_a_trace_of_a_run_stopped_before_its_first_launch_says_so(tmp_path, capsys):
    src = tmp_path / "copy.s"
    src.write_text(DMA_BOUND)
    out = tmp_path / "early.mkt"
    assert main(["run", str(src), "--hw", "test", "--mesh", "1", "--max-cycles", "100", "--trace", str(out)]) == 1
    capsys.readouterr()
    assert main(["trace", str(out)]) == 0
    text = capsys.readouterr().out
    assert "emulated time: 1,000 cycles" in text and "window: 0 cycles" in text
    assert main(["trace", str(out), "--html", str(tmp_path / "p.html")]) == 1
    assert "before its first launch began" in capsys.readouterr().err


def test_a_trace_of_a_program_without_launches_says_it_has_none(tmp_path, capsys):
    src = tmp_path / "none.mk"
    src.write_text("kernel k(x: hbm f32[8, 128]) {\n}\nhost {\n    input x: f32[8, 128];\n}\n")
    out = tmp_path / "none.mkt"
    assert main(["run", str(src), "--hw", "test", "--mesh", "1", "--trace", str(out)]) == 0
    capsys.readouterr()
    for argv in (["--html", str(tmp_path / "p.html")], ["--from", "0", "--to", "10"]):
        assert main(["trace", str(out), *argv]) == 1
        err = capsys.readouterr().err
        assert "the program launches no kernel" in err and "first launch" not in err


# A loop whose every iteration stalls at the same vadd (waiting for vexp), before the
# one DMA that ends the HBM's idle time from the launch's start.
STALLS_THEN_DMA = """
.buffer a f32 8x128 input
.kernel main
    .smem 0 4096 1 0 0 1 0 0
    li s5, 20
    vli.f32 v1, 1.0
loop:
    vexp.f32 v2, v1
    vadd.f32 v1, v2, v2
    addi s5, s5, -1
    bne s5, s0, loop
    li s1, @a
    dma.start vmem[s0], hbm[s1], s0, s0
    li s7, 4096
    sem.wait s0, s7
    halt
"""


def test_a_bubble_names_the_instruction_whose_stalls_in_it_add_up_to_the_most():
    t = record(STALLS_THEN_DMA).trace
    bubble = summarize(t)["bubbles"][0]
    waited = bubble["waited_on"]
    assert waited["instruction"].startswith("vadd.f32") and waited["reason"] == "dependency"
    rows = (t.instr["core"] == 0) & (t.instr["pc"] == waited["pc"])
    stalls = (t.instr["stall_dep"] + t.instr["stall_unit"])[rows]
    assert rows.sum() == 20 and waited["cycles"] == stalls.sum() > stalls.max()
    assert f"{waited['cycles']:,.0f} of its {bubble['cycles']:,.0f} cycles" in render_text(summarize(t))


def test_top_0_lists_no_bubble_site_and_says_so(dma_bound, tmp_path, capsys):
    path = tmp_path / "t.mkt"
    path.write_bytes(dma_bound.data)
    assert main(["trace", str(path), "--top", "0"]) == 0
    assert "top HBM bubbles (HBM idle), by the site that ended them\n  not listed (--top 0)" in capsys.readouterr().out


def test_a_window_of_a_trace_without_kernel_time_selects_none(tmp_path, capsys):
    path = tmp_path / "t.mkt"
    path.write_bytes(record(".kernel main\n    halt\n").data)      # a launch of 0 cycles
    assert main(["trace", str(path), "--from", "0", "--to", "5000"]) == 1
    assert "select no kernel time: the trace has none (its launches take no cycles)" in capsys.readouterr().err


def test_region_instances_of_equal_cycles_are_listed_in_index_order():
    # Ties were listed as strings: load[0], load[10], load[11], load[1], ...
    source = """
    .kernel main
        li s1, 0
        li s2, 12
    loop:
        mark.push 0, s1
        addi s3, s3, 1
        mark.pop
        addi s1, s1, 1
        bne s1, s2, loop
        halt
    """
    text = render_text(summarize(record(source, regions=("load",)).trace))
    listed = re.findall(r"load\[(\d+)\]", text)
    assert len(listed) == 12 and listed == sorted(listed, key=int), listed


def test_a_metadata_length_past_the_data_is_said_to_be(dma_bound):
    # (it was read as metadata lacking every key)
    import zlib

    magic, version, flags, raw_size, packed_size, crc = HEADER.unpack_from(dma_bound.data)
    raw = bytearray(zlib.decompress(dma_bound.data[HEADER.size:]))
    raw[:8] = struct.pack("<Q", 2**40)
    packed = zlib.compress(bytes(raw))
    with pytest.raises(TraceError, match=r"the metadata's length \(1,099,511,627,776 bytes\) runs past the data"):
        parse_trace(HEADER.pack(magic, version, flags, len(raw), len(packed), zlib.crc32(packed)) + packed)


def test_trace_json_is_valid_json_when_an_absurd_profile_makes_a_figure_infinite(dma_bound, tmp_path, capsys):
    # (a bandwidth of 1e308 bytes a cycle, a real if absurd profile's: its GB/s came out
    # as `Infinity` in --json, which is not JSON)
    path = _meta_altered(dma_bound.data, tmp_path, ("resources", 0, "bw_bytes_per_cycle"), 1e308)
    assert main(["trace", str(path), "--json"]) == 0
    out = capsys.readouterr().out
    json.loads(out, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))


@pytest.mark.parametrize("bw, peak", [("1e308", "inf"), ("1e12", "1e+12")])
def test_bandwidth_rows_of_an_absurdly_fast_profile_keep_every_byte_and_their_columns(tmp_path, capsys, bw, peak):
    # At 1e308 bytes a cycle a DMA moves its bytes within one cycle: the rows counted 0
    # bytes (the HBM rows must add up to the run's hbm_bytes); at 1e12 the peak column
    # (2488711000000000000.0 GB/s) ran into the next one.
    hw = tmp_path / "fast.toml"
    hw.write_text(f'extends = "test"\nname = "fast"\n[chip]\nhbm_bw_bytes_per_cycle = {bw}\n'
                  f'[dma]\nengine_bw_bytes_per_cycle = {bw}\n')
    trace = tmp_path / "t.mkt"
    assert main(["run", "vector_add", "--hw", str(hw), "--json", "--trace", str(trace)]) == 0
    hbm_bytes = json.loads(capsys.readouterr().out)["hbm_bytes"]
    assert main(["trace", str(trace), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["bandwidth"]
    assert sum(r["bytes"] for r in rows if r["resource"].endswith(" HBM")) == hbm_bytes == 393216
    assert main(["trace", str(trace)]) == 0
    text = capsys.readouterr().out
    table = text[text.index("\nbandwidth\n"):].split("\n\n")[0].splitlines()[3:]
    assert len(table) == 6
    for line in table:      # (bytes, GB/s, peak, util %, active %: five columns apart)
        columns = line[36:].split()
        assert len(columns) == 5 and columns[0] == ("196,608" if "HBM" in line else "98,304"), line
        assert columns[2] == (peak if "HBM" in line else columns[2]), line
