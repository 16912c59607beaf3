"""docs/traces.md as a reader runs it: `mkemu trace` through `mkemu.cli.main`, on
traces recorded with `mkemu.compile_source(..., trace=PATH)`. The keys of `--json`
and of `diff --json`, what `--core`, `--top` and an export print, the order and
length of the text's region table, the window's label, the errors of filters that
select nothing, and that the same run gives the same file."""

from __future__ import annotations

import json
import struct
import zlib

import pytest

import mkemu
from mkemu.cli import main

# 2 chips of 2 cores (`test` profile, mesh 2): every core loads, then doubles its
# tile in 45 instances of region "step" (one index each), then stores it.
STEPS = 45
LOOP = f"""
param N = 128;

kernel scale(x: hbm f32[8, N], y: hbm f32[8, N]) {{
    vmem v: f32[8, N];
    sem s;
    region "load" {{ start copy(x, v, s); wait copy(x, v, s); }}
    for i in 0..{STEPS} {{
        region "step" (i) {{ v = v + v; }}
    }}
    start copy(v, y, s);
    wait copy(v, y, s);
}}

host {{
    input x: f32[8, N];
    output y: f32[8, N];
    launch scale(x, y);
}}
"""

SUMMARY_KEYS = {"trace", "profile", "clock_hz", "emulated_cycles", "emulated_seconds", "filters", "window_cycles",
                "fault", "instructions", "units", "bandwidth", "stalls", "regions", "bubbles", "overlap"}


def _record(path, program=None):
    program = program or path.with_suffix(".mk")     # (the trace records the program's path)
    return mkemu.compile_source(LOOP, str(program), hw="test", mesh="2", trace=str(path))()


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    path = tmp_path_factory.mktemp("loop") / "loop.mkt"
    run = _record(path)
    return path, run


def _cli(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def _summary(capsys, path, *argv) -> dict:
    code, out, _ = _cli(capsys, "trace", path, "--json", *argv)
    assert code == 0
    return json.loads(out)


def test_json_has_the_documented_keys(loop, capsys):
    path, _ = loop
    s = _summary(capsys, path)
    assert set(s) == SUMMARY_KEYS and s["fault"] is None
    assert set(s["filters"]) == {"chips", "cores", "region", "from", "to"}
    assert all(set(u) == {"chip", "core", "busy", "busy_cycles"} for u in s["units"])
    assert all(set(b) == {"resource", "kind", "chip", "bytes", "utilisation", "active", "achieved_gb_per_s",
                          "peak_gb_per_s"} for b in s["bandwidth"])
    assert set(s["stalls"]) == {"cycles", "fraction"}
    assert set(s["stalls"]["cycles"]) == {"unit", "dependency", "dma", "semaphore", "barrier"}
    assert all(set(r) == {"region", "instances", "cycles", "share", "dma_bytes", "gb_per_s"} for r in s["regions"])
    assert all(set(o) == {"chip", "core", "compute_cycles", "dma_cycles", "both_cycles", "dma_hidden",
                          "compute_overlapped"} for o in s["overlap"])
    assert s["bubbles"]
    for b in s["bubbles"]:
        assert {"count", "total_cycles", "chips", "chip", "start", "end", "cycles"} <= set(b)
        if "next_dma" in b:
            assert set(b["next_dma"]) == {"chip", "core", "issued", "pc", "instruction", "source"}
            assert isinstance(b["next_dma"]["chip"], int) and isinstance(b["next_dma"]["core"], int)
            assert b["waited_on"] is None or set(b["waited_on"]) == {"reason", "cycles", "pc", "instruction",
                                                                     "source"}


def test_core_alone_selects_that_core_of_every_chip(loop, capsys):
    path, _ = loop
    s = _summary(capsys, path, "--core", "1")
    assert s["filters"]["chips"] == [0, 1] and s["filters"]["cores"] == [1]
    assert [(u["chip"], u["core"]) for u in s["units"]] == [(0, 1), (1, 1)]


def test_top_sets_how_many_bubble_sites_are_listed(loop, capsys):
    path, _ = loop
    sites = len(_summary(capsys, path)["bubbles"])            # default 5
    assert 2 <= sites <= 5
    assert len(_summary(capsys, path, "--top", "1")["bubbles"]) == 1
    assert _summary(capsys, path, "--top", "0")["bubbles"] == []
    code, out, _ = _cli(capsys, "trace", path, "--top", "0")
    assert code == 0 and "top HBM bubbles (HBM idle), by the site that ended them\n  not listed (--top 0)\n" in out


def test_the_text_lists_kernels_first_then_regions_by_cycles_at_most_40(loop, capsys):
    path, _ = loop
    regions = _summary(capsys, path)["regions"]
    assert len(regions) == 1 + 2 + STEPS                      # kernel:scale, load, step, step[0..44]
    code, out, _ = _cli(capsys, "trace", path)
    lines = out.splitlines()
    at = lines.index("regions") + 2
    rows = lines[at:at + 40]
    assert rows[0].split()[0] == "kernel:scale"
    cycles = [float(r.split()[2].replace(",", "")) for r in rows[1:]]
    assert cycles == sorted(cycles, reverse=True)
    assert lines[at + 40] == f"  ... {len(regions) - 40} more (use --json or --region)"


def test_an_export_prints_the_summary_only_with_json(loop, capsys, tmp_path):
    path, _ = loop
    code, out, err = _cli(capsys, "trace", path, "--html", tmp_path / "t.html")
    assert code == 0 and out == "" and err == "" and (tmp_path / "t.html").is_file()
    code, out, _ = _cli(capsys, "trace", path, "--perfetto", tmp_path / "t.pftrace", "--json")
    assert code == 0 and json.loads(out) == _summary(capsys, path)


@pytest.mark.parametrize("region", ["", "load"])
def test_any_region_with_an_export_is_an_error_before_anything_is_written(loop, capsys, tmp_path, region):
    # An empty --region was taken as none given: the page was written (and, with --json, then refused).
    path, _ = loop
    code, out, err = _cli(capsys, "trace", path, "--html", tmp_path / "t.html", "--region", region)
    assert code == 1 and out == "" and err.startswith("--region: error: --region narrows the summary and diff")
    assert not (tmp_path / "t.html").exists()


def test_an_open_end_of_the_window_reads_as_the_runs_own(loop, capsys):
    """(it read "cycles [, 1500)" and "cycles [1500, )")"""
    path, run = loop
    end = run.report.cycles
    _, out, _ = _cli(capsys, "trace", path, "--to", "1500")
    assert "; cycles [0, 1500))" in out.splitlines()[2]
    _, out, _ = _cli(capsys, "trace", path, "--from", "1500")
    assert f"; cycles [1500, {end}))" in out.splitlines()[2]
    _, out, _ = _cli(capsys, "trace", path, "--from", "1200", "--to", "1500")
    assert "; cycles [1200, 1500))" in out.splitlines()[2]


@pytest.mark.parametrize("argv, message", [
    (["--region", ""], "--region: error: bad region '': write NAME, NAME[INDEX] (INDEX a number) or kernel:NAME"),
    (["--region", "kernel:"], "--region: error: bad region 'kernel:'"),      # (both read "no region ... in this trace")
    (["--region", "step[x]"], "--region: error: bad region 'step[x]'"),
    (["--region", "step[01]"], "--region: error: bad region 'step[01]'"),    # (was step[1], headed step[01])
    (["--region", "step[-0]"], "--region: error: bad region 'step[-0]'"),
    (["--region", "nope"], "--region: error: no region 'nope' in this trace (regions: kernel:scale, load, step)"),
    (["--region", f"step[{STEPS}]"], f"--region: error: no region 'step[{STEPS}]' in this trace "
                                     f"(step's indices: 0..{STEPS - 1})"),
    (["--region", "load[1]"], "--region: error: no region 'load[1]' in this trace (load's indices: 0)"),
    (["--chip", "2"], "--chip: error: no core matches --chip 2 (the trace has 2 chip(s), 0..1, of 2 cores each)"),
    (["--core", "0", "--core", "2"], "--core: error: --core 2 matches no core"),
    (["--from", "5", "--to", "5"], "--to: error: --to 5 is not after --from 5: the window [from, to) is empty"),
    (["--to", "999"], "--to: error: --from/--to select no kernel time: the launches run cycles 1,000 to"),
    (["--from", "{end}"], "--from: error: --from/--to select no kernel time"),
])
def test_filters_that_select_nothing_are_one_line_errors(loop, capsys, argv, message):
    path, run = loop
    argv = [a.format(end=run.report.cycles) for a in argv]
    for extra in ([], ["--json"]):
        code, out, err = _cli(capsys, "trace", path, *argv, *extra)
        assert code == 1 and out == "" and err.startswith(message) and len(err.strip().splitlines()) == 1, err


def test_a_trace_without_cores_per_chip_in_its_metadata_reads(loop, capsys, tmp_path):
    """The reader does not require `cores_per_chip`; every summary then failed with a
    KeyError traceback."""
    path, _ = loop
    data = path.read_bytes()
    payload = zlib.decompress(data[36:])
    (size,) = struct.unpack_from("<Q", payload)
    meta = json.loads(payload[8:8 + size])
    del meta["cores_per_chip"]
    text = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    payload = struct.pack("<Q", len(text)) + text + payload[8 + size:]
    packed = zlib.compress(payload)
    bare = tmp_path / "bare.mkt"
    bare.write_bytes(data[:16] + struct.pack("<QQI", len(payload), len(packed), zlib.crc32(packed)) + packed)
    assert _summary(capsys, bare)["instructions"] == _summary(capsys, path)["instructions"]
    code, _, err = _cli(capsys, "trace", bare, "--chip", "3")
    assert code == 1 and "(the trace has 2 chip(s), 0..1, of 2 cores each)" in err


def test_the_same_run_gives_the_same_file(loop, tmp_path):
    path, _ = loop
    again = tmp_path / "again.mkt"
    _record(again, program=path.with_suffix(".mk"))
    assert again.read_bytes() == path.read_bytes()


def test_diff_json_has_the_documented_keys_and_nulls_for_a_missing_region(loop, capsys, tmp_path):
    path, _ = loop
    other = tmp_path / "plain.mkt"
    mkemu.compile("vector_add", hw="test", mesh="2", trace=str(other))()
    code, out, _ = _cli(capsys, "trace", "diff", path, other, "--json")
    assert code == 0
    d = json.loads(out)
    assert set(d) == {"a", "b", "emulated_cycles", "window_cycles", "stalls", "hbm_utilisation", "regions"}
    assert set(d["emulated_cycles"]) == {"a", "b", "delta"}
    assert set(d["stalls"]) == {"unit", "dependency", "dma", "semaphore", "barrier"}
    assert set(d["hbm_utilisation"]["a"]) == set(d["hbm_utilisation"]["b"]) == {"chip0 HBM", "chip1 HBM"}
    load = next(r for r in d["regions"] if r["region"] == "load")
    assert load["a_cycles"] > 0 and load["a_dma_bytes"] > 0
    assert (load["b_cycles"], load["delta_cycles"], load["ratio"], load["b_dma_bytes"]) == (None, None, None, None)
    code, out, _ = _cli(capsys, "trace", "diff", path, other)
    row = next(line for line in out.splitlines() if line.split()[:1] == ["load"])
    assert row.split()[2:] == ["-", "-", "-"]
