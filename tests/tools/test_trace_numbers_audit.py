"""The trace tools' figures against independent counts from the raw records
(docs/traces.md), where a figure was once wrong."""

from __future__ import annotations

import pytest

from mkemu.cli import main
from mkemu.tools.perfetto import to_perfetto
from mkemu.tools.trace_reader import read_trace
from mkemu.tools.trace_summary import summarize
from mkemu.tools.view import view

from protobuf_wire import read_perfetto
from test_trace_tools import FAULTS_MID_COPY   # (both cores fault while a 256 KiB copy still moves)


@pytest.fixture(scope="module")
def faulted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fault")
    src, out = tmp / "f.mk", tmp / "f.mkt"
    src.write_text(FAULTS_MID_COPY)
    assert main(["run", str(src), "--hw", "test", "--mesh", "1", "--trace", str(out)]) == 1
    t = read_trace(str(out))
    assert (t.dma["begun"] >= 0).all() and (t.dma["done"] == -1).all()   # both copies still moving
    return t


def test_overlap_counts_a_dma_still_moving_at_the_fault(faulted):
    # "DMA/compute overlap: per core, cycles with DMAs it issued moving": a DMA the fault
    # caught in flight moved from its start to the end of the trace (its bytes so far are
    # in the bandwidth figures, and its engine reads active all that time). It read 0.
    t = faulted
    s = summarize(t)
    engines = {b["resource"]: b for b in s["bandwidth"] if b["kind"] == "engine"}
    for row in s["overlap"]:
        g = row["chip"] * 2 + row["core"]
        mine = t.dma["src_core"] == g
        moving = float(t.end_cycle - t.dma["begun"][mine].min())
        assert row["dma_cycles"] == moving > 0
        engine = engines[f"chip{row['chip']} core{row['core']} DMA engine"]
        assert row["dma_cycles"] == pytest.approx(engine["active"] * s["window_cycles"])
        # The vector adds ran while the copy moved: all but those before its start.
        assert 0 < row["both_cycles"] <= row["compute_cycles"]
        assert row["dma_hidden"] == pytest.approx(row["both_cycles"] / row["dma_cycles"])


def test_perfetto_draws_a_dma_still_moving_at_the_fault(faulted):
    # "its DMA engine (... each DMA a slice with its bytes, destination and pc)": the
    # copies the fault caught in flight were left out; they run to the trace's end and,
    # never having landed, have no landing instant or flow arrow.
    t = faulted
    tracks, events = read_perfetto(to_perfetto(t))
    begins = [e for e in events if e["type"] == 1 and tracks[e["track"]]["name"].startswith("core ")
              and "DMA engine" in tracks[e["track"]]["name"]]
    assert sorted(tracks[e["track"]]["name"] for e in begins) == ["core 0 DMA engine 0", "core 1 DMA engine 0"]
    assert all(e["args"]["bytes"] == 64 * 1024 * 4 and not e["flows"] for e in begins)
    for e in begins:
        end = next(x for x in events if x["type"] == 2 and x["track"] == e["track"])
        assert (e["ts"], end["ts"]) == (int(t.dma["begun"].min()), t.end_cycle)   # 1 GHz: ns are cycles
    assert not any(e["type"] == 3 for e in events)          # nothing landed
    # A window after the copies began cuts their slices, as any other slice.
    v = view(t, start=1500, end=1800)
    tracks, events = read_perfetto(to_perfetto(t, v))
    cut = [e["ts"] for e in events if e["track"] in tracks and "DMA engine" in tracks[e["track"]]["name"]]
    assert sorted(cut) == [1500, 1500, 1800, 1800]
