"""The trace summary against the run's own figures (helper-74's audit): the HBM bytes a
run reports (`hbm_bytes`: every byte a DMA reads from or writes to HBM) are the bytes
the trace's HBM rows show, also for a copy from one place of a chip's HBM to another,
which reads and writes that HBM."""

from __future__ import annotations

import json

import pytest

from mkemu.cli import main

# Both cores of the chip copy 4 MiB from HBM to HBM on the same chip, so the chip's HBM
# reads 8 MiB and writes 8 MiB.
SAME_HBM_COPY = """
kernel h2h(a: hbm f32[2048, 1024], out: hbm f32[2048, 1024]) {
    sem s;
    let c = core_id();
    start copy(a[c * 1024 +: 1024, :], out[c * 1024 +: 1024, :], s);
    wait copy(a[c * 1024 +: 1024, :], out[c * 1024 +: 1024, :], s);
}
host {
    input a: f32[2048, 1024];
    output out: f32[2048, 1024];
    launch h2h(a, out);
}
"""


def _json(capsys, *argv) -> dict:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_hbm_bytes_of_a_copy_within_one_hbm_are_read_and_written(tmp_path, capsys):
    program = tmp_path / "h2h.mk"
    program.write_text(SAME_HBM_COPY)
    trace = tmp_path / "h2h.mkt"
    run = _json(capsys, "run", str(program), "--mesh", "1", "--json", "--trace", str(trace))
    summary = _json(capsys, "trace", str(trace), "--json")
    hbm = [b for b in summary["bandwidth"] if b["kind"] == "hbm"]
    assert run["hbm_bytes"] == 2 * 2 * 4 * 2**20            # 2 cores x (read + write) x 4 MiB
    assert [b["bytes"] for b in hbm] == [run["hbm_bytes"]]
    # Utilisation is those bytes over the peak and the window (kernel time only).
    peak = hbm[0]["peak_gb_per_s"] * 1e9 / summary["clock_hz"]
    assert hbm[0]["utilisation"] == pytest.approx(
        run["hbm_bytes"] / (peak * summary["window_cycles"]))


def test_whole_run_bandwidth_rows_are_exact_byte_counts(tmp_path, capsys):
    """Over the whole run each DMA adds exactly its size to every resource it crossed
    (docs/traces.md), however its rate changed while links were shared: the rows are
    whole numbers, the HBM rows add up to `hbm_bytes` and the links to `link_bytes`
    exactly. A window that cuts DMAs takes their share of bytes inside it."""
    trace = tmp_path / "ar.mkt"
    run = _json(capsys, "run", "programs/examples/all_reduce.mk", "--json", "--trace", str(trace))
    rows = _json(capsys, "trace", str(trace), "--json")["bandwidth"]
    assert rows and all(b["bytes"] == int(b["bytes"]) for b in rows)
    assert sum(b["bytes"] for b in rows if b["kind"] == "hbm") == run["hbm_bytes"]
    assert sum(b["bytes"] for b in rows if b["kind"] == "link") == run["link_bytes"]
    # Links shared by several DMAs at changing rates: the rows that drifted off whole numbers.
    assert any(b["kind"] == "link" for b in rows)
    half = _json(capsys, "trace", str(trace), "--json", "--to", str(run["cycles"] // 2))["bandwidth"]
    hbm_half = sum(b["bytes"] for b in half if b["kind"] == "hbm")
    assert 0 < hbm_half < run["hbm_bytes"]
