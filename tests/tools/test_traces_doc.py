"""docs/traces.md, checked through the public interfaces (`mkemu.compile_source(...,
trace=...)`, `mkemu trace`): the text summary's unit table, the bandwidth rows it
lists, its filters' errors, the instruction count and the file's metadata."""

from __future__ import annotations

import json
import struct
import zlib

import pytest

import mkemu
from mkemu.cli import main

# Core 0 of chip 0 pushes 64 KiB into core 0 of chip 1 (global core 2) and both wait
# for it; the other cores only halt. On tpu-v7-like (per-core links) the DMA crosses
# core 0's own port into link 0->1, then the link.
REMOTE = """
.kernel main
    .smem 0 65536 1 0 0 1 0 0
    rdsr s9, gcore
    li s6, 65536
    li s1, 1
    li s7, 2
    bne s9, s0, other
    dma.start.r vmem[s0]@s7, vmem[s0], s0, s0, s1
    sem.wait s0, s6
    halt
other:
    bne s9, s7, done
    sem.wait s1, s6
done:
    halt
"""

# Both matrix units of both cores: unit names up to `mxu1.lhs` (8 characters).
MXU = """
.kernel main
    li s1, 256
    li s2, 8388736
    mxu.ldw x0, 0(s0), s1, s2
    mxu.ldw x1, 0(s0), s1, s2
    mxu.push x0, v1, 0
    mxu.push x1, v1, 0
    mxu.mac x0, a0, 1
    mxu.mac x1, a0, 1
    mxu.pop v2, x0, a0, 0
    mxu.pop v3, x1, a0, 0
    halt
"""


def _record(source: str, path, hw="test", mesh="1x1x1"):
    run = mkemu.compile_source(source, "doc.s", hw=hw, mesh=mesh, trace=str(path))()
    return run


def _summary_text(path, *args, capsys) -> str:
    capsys.readouterr()
    assert main(["trace", str(path), *args]) == 0
    return capsys.readouterr().out


def test_unit_busy_columns_are_as_wide_as_their_names(tmp_path, capsys):
    path = tmp_path / "mxu.mkt"
    _record(MXU, path)
    lines = _summary_text(path, capsys=capsys).splitlines()
    at = lines.index("unit busy (% of window)")
    header, rows = lines[at + 1], lines[at + 2:at + 4]
    units = header.split()[1:]
    # Every name is its own column: none run together ("mxu1.wmxu0.lhs").
    assert units[:6] == ["scalar", "vld", "vst", "valu", "xlu", "eup"]
    assert {"mxu0", "mxu1", "mxu0.w", "mxu1.w", "mxu0.lhs", "mxu1.lhs", "dma", "sync"} <= set(units)
    for row in rows:
        assert row.startswith("  chip 0 core ")
        values = row.split()[4:]
        assert len(values) == len(units)
        # Each value is right-aligned under its name, with a space before the name.
        for name, value in zip(units, values):
            end = header.index(f" {name} " if f" {name} " in header else f" {name}") + 1 + len(name)
            assert row[:end].endswith(value)
    # The MAC unit of each core was busy, and the figure sits under mxu0 / mxu1.
    s = json.loads(_summary_text(path, "--json", capsys=capsys))
    assert s["units"][0]["busy_cycles"]["mxu0.lhs"] == 1


def test_bandwidth_lists_used_links_and_the_selected_cores_ports(tmp_path, capsys):
    path = tmp_path / "remote.mkt"
    _record(REMOTE, path, hw="tpu-v7-like", mesh="2x1x1")
    s = json.loads(_summary_text(path, "--json", capsys=capsys))
    rows = {b["resource"]: b for b in s["bandwidth"]}
    kinds = [b["kind"] for b in s["bandwidth"]]
    # Every HBM and DMA engine; of the links, ports and core-to-core paths only the used ones.
    assert kinds.count("hbm") == 2 and kinds.count("engine") == 4
    assert [b["resource"] for b in s["bandwidth"] if b["kind"] in ("link", "port", "sibling")] == [
        "link 0->1 (x+)", "core 0 port link 0->1 (x+)"]
    assert rows["link 0->1 (x+)"]["bytes"] == rows["core 0 port link 0->1 (x+)"]["bytes"] == 65536
    # A port belongs to one core, like its DMA engine: --core 1 shows neither of core 0's.
    one = json.loads(_summary_text(path, "--json", "--core", "1", capsys=capsys))
    names = [b["resource"] for b in one["bandwidth"]]
    assert "link 0->1 (x+)" in names
    assert not any("port" in n or "core0 DMA engine" in n for n in names)
    text = _summary_text(path, capsys=capsys)
    assert "core 1 port" not in text and "core 0 port link 0->1 (x+)" in text


def test_filters_that_select_nothing_are_errors(tmp_path, capsys):
    path = tmp_path / "remote.mkt"
    run = _record(REMOTE, path, mesh="2x1x1")
    end = run.report.cycles
    capsys.readouterr()
    # A window with no kernel time in it (the launch starts at cycle 1000 on `test`).
    for args in (["--from", str(end + 10)], ["--to", "1000"], ["--from", "10", "--to", "500"]):
        assert main(["trace", str(path), *args]) == 1
        err = capsys.readouterr().err
        assert "select no kernel time" in err and f"1,000 to {end:,}" in err
    assert main(["trace", "diff", str(path), str(path), "--from", str(end + 10)]) == 1
    assert "select no kernel time" in capsys.readouterr().err
    # The window's cycles within the launch are fine, however few.
    assert "window: 1 cycles" in _summary_text(path, "--from", str(end - 1), capsys=capsys)
    assert main(["trace", str(path), "--chip", "5", "--core", "0"]) == 1
    err = capsys.readouterr().err
    assert "no core matches --chip 5 --core 0" in err and "None" not in err and "[" not in err


def test_instruction_count_is_the_runs_less_halts_ending_a_launch(tmp_path, capsys):
    path = tmp_path / "remote.mkt"
    run = _record(REMOTE, path, mesh="2x1x1")
    s = json.loads(_summary_text(path, "--json", capsys=capsys))
    trace = run.report.trace
    at_end = sum(1 for issue in trace.instr["issue"].tolist() if issue == trace.launches[0]["end"])
    assert at_end >= 1
    assert s["instructions"] == run.report.figures["instructions"] - at_end
    assert s["emulated_cycles"] == run.report.cycles == trace.end_cycle
    assert s["window_cycles"] == run.report.cycles - 1000          # launch overhead: not kernel time


def test_file_header_and_metadata_as_documented(tmp_path):
    path = tmp_path / "remote.mkt"
    _record(REMOTE, path, hw="tpu-v7-like", mesh="2x1x1")
    data = path.read_bytes()
    magic, version, flags, raw_size, packed_size, crc = struct.unpack_from("<8sIIQQI", data)
    assert (magic, version, flags) == (b"MKTRACE\0", 1, 0)
    assert packed_size == len(data) - 36 and crc == zlib.crc32(data[36:])
    payload = zlib.decompress(data[36:])
    assert len(payload) == raw_size
    (meta_size,) = struct.unpack_from("<Q", payload)
    text = payload[8:8 + meta_size].decode()
    meta = json.loads(text)
    assert json.dumps(meta, sort_keys=True, separators=(",", ":")) == text
    assert {"format", "version", "profile", "clock_hz", "mesh", "cores_per_chip", "cores", "units", "resources",
            "spaces", "kernels", "launches", "region_names", "end_cycle", "program", "tables"} <= set(meta)
    assert meta["format"] == "mkemu-trace" and meta["version"] == 1
    kinds = {r["kind"] for r in meta["resources"]}
    assert {"hbm", "sibling", "engine", "link", "port"} <= kinds
    for r in meta["resources"]:
        assert {"id", "name", "kind", "chip", "bw_bytes_per_cycle"} <= set(r)
        if r["kind"] in ("engine", "port"):
            assert r["core"] // meta["cores_per_chip"] == r["chip"]      # a global core id
    for table, columns in meta["tables"].items():
        for column in columns.values():
            assert set(column) == {"dtype", "length", "offset", "delta"}
    assert {"text", "unit", "latency", "occupancy", "source"} <= set(meta["kernels"]["main"])


@pytest.mark.parametrize("scope, index", [("chip", 0), ("all", 1), ("x", 2)])
def test_barrier_scope_ids_in_the_wait_table(tmp_path, scope, index):
    run = mkemu.compile_source(f".kernel main\n    barrier {scope}\n    halt\n", "b.s", hw="test",
                               mesh="2x1x1", trace=True)()
    wait = run.report.trace.wait
    assert set(wait["kind"].tolist()) == {1} and set(wait["sem"].tolist()) == {index}


# Chip 0's cores enter region "solo"; every core enters "load" (test profile, 2 chips).
SOLO = """
param N = 128;

kernel scale(x: hbm f32[8, N], y: hbm f32[8, N]) {
    vmem v: f32[8, N];
    sem s;
    region "load" { start copy(x, v, s); wait copy(x, v, s); }
    if chip_id() == 0 {
        region "solo" { v = v + v; }
    }
    start copy(v, y, s);
    wait copy(v, y, s);
}

host {
    input x: f32[8, N];
    output y: f32[8, N];
    launch scale(x, y);
}
"""


@pytest.fixture
def solo(tmp_path):
    path = tmp_path / "solo.mkt"
    run = mkemu.compile_source(SOLO, str(tmp_path / "solo.mk"), hw="test", mesh="2", trace=str(path))()
    return path, run


def _fails(capsys, argv, message: str) -> str:
    capsys.readouterr()
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in out + err, err
    return err


def test_each_chip_and_core_given_must_select_a_core(solo, capsys):
    """"a --chip/--core that matches no core" is an error, also beside one that does (it
    was ignored)."""
    path, _ = solo
    _fails(capsys, ["trace", str(path), "--chip", "0", "--chip", "5"], "--chip: error: --chip 5 matches no core")
    _fails(capsys, ["trace", str(path), "--core", "1", "--core", "2"], "--core: error: --core 2 matches no core")
    _fails(capsys, ["trace", str(path), "--chip", "1", "--core", "9"], "--core: error: no core matches --chip 1")
    assert "chips 0,1; cores 1" in _summary_text(path, "--chip", "0", "--chip", "1", "--core", "1", capsys=capsys)


@pytest.mark.parametrize("region", ["load[0", "load[0]]", "load[x]", "load[]", "[0]"])
def test_a_region_is_name_name_index_or_kernel_name(solo, capsys, region):
    path, _ = solo
    _fails(capsys, ["trace", str(path), "--region", region], f"bad region {region!r}")


def test_a_region_that_selects_no_cycles_is_an_error(solo, capsys):
    path, run = solo
    assert "region load[0]" in _summary_text(path, "--region", "load[0]", capsys=capsys)
    assert "region solo" in _summary_text(path, "--region", "solo", "--chip", "0", capsys=capsys)
    # On the selected cores the region is never entered: said so, not "not in this trace".
    _fails(capsys, ["trace", str(path), "--region", "solo", "--chip", "1"],
           "no region 'solo' on the selected cores")
    # A window that misses every instance of the region (it gave a 0-cycle summary).
    load = run.report.trace.region
    after = int(load["end"].max()) + 1
    assert after < run.report.cycles
    for argv in (["--region", "load", "--from", str(after)], ["--region", "solo", "--from", str(after)]):
        _fails(capsys, ["trace", str(path), *argv], "takes no cycles in the window")


def test_exports_refuse_a_window_with_no_kernel_time(solo, capsys, tmp_path):
    path, run = solo
    page = tmp_path / "t.html"
    for argv in (["--from", "10", "--to", "500"], ["--from", str(run.report.cycles + 5)]):
        _fails(capsys, ["trace", str(path), "--html", str(page), *argv], "select no kernel time")
        assert not page.exists()
    assert main(["trace", str(path), "--html", str(page), "--from", "500", "--to", "1010"]) == 0
    assert page.is_file()


def test_diff_takes_the_filters_but_not_the_exports_and_names_the_trace_a_filter_fails_in(solo, capsys, tmp_path):
    path, _ = solo
    other = tmp_path / "plain.mkt"
    mkemu.compile("vector_add", hw="test", mesh="2", trace=str(other))()
    out = tmp_path / "d.pftrace"
    for flag, value in (("--perfetto", str(out)), ("--html", str(tmp_path / "d.html")), ("--top", "3")):
        _fails(capsys, ["trace", "diff", str(path), str(other), flag, value], f"{flag}: error: {flag} applies to one")
    assert not out.exists()
    _fails(capsys, ["trace", "diff", str(path), str(other), "--region", "solo"],
           f"{other}: --region: error: no region 'solo' in this trace")


def test_an_export_never_overwrites_the_trace_it_reads(solo, capsys, tmp_path):
    path, _ = solo
    before = path.read_bytes()
    _fails(capsys, ["trace", str(path), "--perfetto", str(path)], "is the trace being read")
    assert path.read_bytes() == before
    page = tmp_path / "t.out"
    _fails(capsys, ["trace", str(path), "--html", str(page), "--perfetto", str(page)],
           "both write")
    assert not page.exists()
