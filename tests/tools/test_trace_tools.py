"""The trace tools against hand-computed figures, and their outputs' validity."""

from __future__ import annotations

import json
import struct
import xml.etree.ElementTree as ET
from collections import defaultdict

import numpy as np
import pytest

from mkemu.cli import main
from mkemu.errors import ConfigError, TraceError
from mkemu.tools import trace_diff
from mkemu.tools.perfetto import to_perfetto
from mkemu.tools.plot import timeline, to_html
from mkemu.tools.trace_reader import HEADER, parse_trace, read_trace
from mkemu.tools.trace_summary import render_text, summarize

from trace_programs import DMA_BOUND, DMA_BOUND_BYTES_PER_CORE, MXU_BOUND, MXU_ROUNDS, record


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
    # ldw: 16 cycles from 1002; then 4*ROUNDS MACs of 8 cycles back to back from 1018
    # (after the weights are ready); the kernel halts at 1018 + (4*ROUNDS - 1)*8 + 3,
    # cutting the last MAC's busy time short.
    last_mac = 1018 + (4 * MXU_ROUNDS - 1) * 8
    assert mxu_bound.result.cycles == last_mac + 3
    busy_in_window = 16 + (mxu_bound.result.cycles - 1018)
    for core in s["units"]:
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
    region = summarize(t, region="copy")
    assert region["window_cycles"] == 8 * 4              # 8 rounds of 4 one-cycle instructions
    assert summarize(t, region="kernel:main")["window_cycles"] == dma_bound.result.cycles - 1000
    with pytest.raises(ConfigError, match="no region 'nope'"):
        summarize(t, region="nope")
    with pytest.raises(ConfigError, match="no core"):
        summarize(t, chips=[3])
    assert "top HBM bubbles" in render_text(summarize(t))


def _check_trace_events(doc):
    tracks = defaultdict(list)
    stacks = defaultdict(list)
    open_async = {}
    for ev in doc["traceEvents"]:
        for field in ("ph", "ts", "pid", "tid", "name"):
            assert field in ev, (field, ev)
        assert isinstance(ev["ts"], (int, float)) and ev["ts"] >= 0
        if ev["ph"] == "M":
            continue
        key = (ev["pid"], ev["tid"])
        if tracks[key]:
            assert ev["ts"] >= tracks[key][-1], f"timestamps go backwards on track {key}"
        tracks[key].append(ev["ts"])
        if ev["ph"] == "B":
            stacks[key].append(ev["name"])
        elif ev["ph"] == "E":
            assert stacks[key] and stacks[key].pop() == ev["name"], f"unmatched E on {key}"
        elif ev["ph"] == "X":
            assert ev["dur"] >= 0
        elif ev["ph"] == "b":
            open_async[(ev["cat"], ev["id"])] = ev["ts"]
        elif ev["ph"] == "e":
            assert open_async.pop((ev["cat"], ev["id"])) <= ev["ts"]
        elif ev["ph"] == "C":
            assert ev["args"]
        else:
            raise AssertionError(f"unexpected phase {ev['ph']}")
    assert not any(stacks.values()), "B without E"
    assert not open_async, "async begin without end"


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


def test_perfetto_json_is_valid(dma_bound, mxu_bound):
    for rec in (dma_bound, mxu_bound, record(NESTED, regions=("layer", "load", "empty"))):
        doc = json.loads(json.dumps(to_perfetto(rec.trace)))
        _check_trace_events(doc)
        phases = {e["ph"] for e in doc["traceEvents"]}
        assert {"M", "X"} <= phases
    assert {"b", "e", "C", "B", "E"} <= {e["ph"] for e in to_perfetto(record(
        NESTED, regions=("layer", "load", "empty")).trace)["traceEvents"]}


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
    svg = page[page.index("<svg"):page.index("</svg>") + 6]
    ET.fromstring(svg)                                    # well-formed
    rows = timeline(dma_bound.trace)["rows"]
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


@pytest.mark.parametrize("damage", ["truncate", "flip", "magic", "version", "empty", "extra"])
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
    perf, page = tmp_path / "p.json", tmp_path / "p.html"
    assert main(["trace", str(a), "--perfetto", str(perf), "--html", str(page)]) == 0
    _check_trace_events(json.loads(perf.read_text()))
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
