"""docs/tuning.md as a reader runs it: `mkemu tune` and `mkemu sweep` through
`mkemu.cli.main` on the tuner's test program. The order of an enumerated search,
the default build as trial 0 (also outside the space and with a budget of 1), the
output and record a tune writes, resuming from a finished record, the order and
record of a sweep's points, a program without a reference, the plot's log scales,
and that a bad option value is a usage error, not a traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mkemu.cli import main

SCALE = str(Path(__file__).parent / "data" / "tune_scale.mk")
TEST_HW = ("--hw", "test", "--mesh", "1")
SETTINGS = {"program", "hw", "mesh", "seed", "max_cycles", "max_instructions", "dma_order", "checks", "inputs",
            "set", "driver", "objective", "identity"}


def cli(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def tune(capsys, out: Path, *argv) -> tuple[int, str, str, dict]:
    code, stdout, stderr = cli(capsys, "tune", SCALE, *TEST_HW, *argv, "--out", out)
    return code, stdout, stderr, json.loads(out.read_text()) if out.is_file() else {}


def test_an_enumerated_tune_its_output_and_its_record(capsys, tmp_path):
    out = tmp_path / "t.json"
    code, stdout, stderr, record = tune(capsys, out, "--param", "TN=512,1024", "--param", "SYNC=0,3")
    assert code == 0
    # Default first, then every combination, the last param varying fastest.
    assert [(t["params"]["TN"], t["params"]["SYNC"]) for t in record["trials"]] == [
        (512, 0), (512, 3), (1024, 0), (1024, 3)]
    assert [t["index"] for t in record["trials"]] == [0, 1, 2, 3]
    assert [t["default"] for t in record["trials"]] == [True, False, False, False]
    assert [t["status"] for t in record["trials"]] == ["ok", "rejected", "ok", "rejected"]
    # The record, key by key as the table in the doc.
    assert set(record) == {"format", "settings", "search", "budget", "space", "default", "finished", "best", "schedules",
                           "wall_s", "trials"}
    assert record["format"] == "mkemu-tune/1" and set(record["settings"]) == SETTINGS
    assert record["settings"]["program"] == str(Path(SCALE).resolve())
    assert (record["search"], record["budget"], record["finished"]) == ("exhaustive", 32, True)
    assert record["space"] == {"TN": [512, 1024], "SYNC": [0, 3]} and record["default"] == {"TN": 512, "SYNC": 0}
    ok = [t for t in record["trials"] if t["status"] == "ok"]
    assert record["best"] == min(ok, key=lambda t: t["objective"])["index"]
    for t in record["trials"]:
        assert set(t) == {"index", "params", "default", "status", "reason", "objective", "breakdown", "wall_s",
                          "report"}
        assert set(t["breakdown"]) == {"total", "parts", "bound_by"}
        assert not {"per_core", "program", "trace", "dump"} & set(t["report"])
        if t["status"] == "ok":
            assert t["reason"] is None and t["objective"] == pytest.approx(t["report"]["seconds"] * 1e6)
        else:
            assert t["objective"] is None and t["reason"].startswith("wrong bits: y on chip 0 differs at index")
    # On stderr: what is searched, then one line per trial.
    lines = stderr.splitlines()
    assert lines[0] == (f"tune {SCALE}: 4 variants of TN, SYNC, budget 32, objective us_per_step, seed 0, "
                        "on this process")
    assert [line.split(":")[0] for line in lines[1:]] == ["[0] TN=512 SYNC=0", "[1] TN=512 SYNC=3",
                                                          "[2] TN=1024 SYNC=0", "[3] TN=1024 SYNC=3"]
    # On stdout: the ranked table, the rejected variants, the best, the search.
    lines = stdout.splitlines()
    assert lines[0].split() == ["rank", "TN", "SYNC", "us_per_step", "speedup", "bound", "by", "(share", "of",
                                "the", "step)"]
    default_row = next(line for line in lines[1:3] if line.endswith("(default)"))
    assert default_row.split()[4] == "1.000x"
    assert lines[3] == "rejected (2):" and lines[4].startswith("  TN=512 SYNC=3: wrong bits: ")
    assert lines[6].startswith("best: ")
    assert re.fullmatch(rf"exhaustive search, 4 trials, wall [0-9.]+ s; record: {re.escape(str(out))}", lines[7])


def test_trial_0_is_the_default_build_even_outside_the_space(capsys, tmp_path):
    # 2 variants + the default: enumerated within a budget of 3.
    code, _, _, record = tune(capsys, tmp_path / "a.json", "--param", "TN=256,1024", "--budget", "3")
    assert code == 0 and record["search"] == "exhaustive"
    assert [(t["params"], t["default"]) for t in record["trials"]] == [
        ({"TN": 512}, True), ({"TN": 256}, False), ({"TN": 1024}, False)]
    # A budget of 1 is the default build alone, however big the space.
    code, stdout, _, record = tune(capsys, tmp_path / "b.json", "--budget", "1")
    assert code == 0
    assert [(t["params"], t["default"]) for t in record["trials"]] == [({"TN": 512, "SYNC": 0}, True)]
    assert "best: the default (TN=512 SYNC=0); no variant was faster" in stdout


def test_the_cycles_objective(capsys, tmp_path):
    code, stdout, _, record = tune(capsys, tmp_path / "c.json", "--param", "TN=512,1024", "--objective", "cycles")
    assert code == 0 and record["settings"]["objective"] == "cycles"
    assert all(t["objective"] == t["report"]["cycles"] for t in record["trials"])
    assert stdout.splitlines()[0].split()[:4] == ["rank", "TN", "cycles", "speedup"]


def test_resuming_a_finished_record_runs_nothing_and_writes_it_back(capsys, tmp_path):
    first = tmp_path / "t.json"
    argv = ("tune", SCALE, *TEST_HW, "--param", "TN=512,1024")
    assert cli(capsys, *argv, "--out", first)[0] == 0
    before = json.loads(first.read_text())
    code, stdout, stderr = cli(capsys, *argv, "--resume", first)        # no --out: the record itself
    after = json.loads(first.read_text())
    assert code == 0 and stdout.endswith(f"record: {first}\n")
    assert stderr.count("(from the record)") == 2 and all(t["resumed"] for t in after["trials"])
    keep = ("index", "params", "status", "objective", "reason")
    assert [{k: t[k] for k in keep} for t in after["trials"]] == [{k: t[k] for k in keep} for t in before["trials"]]


@pytest.mark.parametrize("argv", [
    ("tune", SCALE, "--objective", "fastest"),
    ("tune", SCALE, "--dma-order", "random"),
    ("sweep", SCALE, "--mesh", "1", "--no-check", "deadlocks"),
])
def test_an_unknown_option_value_is_a_usage_error(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and "invalid choice" in err and "Traceback" not in out + err


def sweep(capsys, out: Path, *argv) -> tuple[int, str, str, dict]:
    code, stdout, stderr = cli(capsys, "sweep", *argv, "--out", out)
    return code, stdout, stderr, json.loads(out.read_text()) if out.is_file() else {}


def test_sweep_points_the_hw_sets_in_order_then_the_mesh_fastest(capsys, tmp_path):
    out = tmp_path / "s.json"
    # (--mesh given first: it is still the last axis)
    code, stdout, stderr, record = sweep(capsys, out, SCALE, "--hw", "test", "--mesh", "1,2",
                                         "--hw-set", "clock_hz=1e9,2e9")
    assert code == 0
    assert list(record["axes"]) == ["chip.clock_hz", "mesh"]
    assert [(p["hw_set"]["chip.clock_hz"], p["mesh"]) for p in record["points"]] == [
        (1e9, "1"), (1e9, "2"), (2e9, "1"), (2e9, "2")]
    assert set(record) == {"format", "programs", "hw", "axes", "points", "wall_s"}
    assert record["format"] == "mkemu-sweep/1" and record["hw"] == "test"
    assert record["programs"] == [str(Path(SCALE).resolve())]
    for point in record["points"]:
        assert set(point) == {"hw_set", "mesh", "results"}
        (r,) = point["results"]
        assert set(r) == {"program", "status", "reason", "wall_s", "us_per_step", "bound_by", "breakdown",
                          "fraction_of_floor", "report"}
        assert r["status"] == "ok" and r["fraction_of_floor"] is None              # a plain program
        assert r["report"]["hw"] == f"test clock_hz={point['hw_set']['chip.clock_hz']:g}"
    lines = stdout.splitlines()
    assert lines[0].split() == ["point", "tune_scale.mk"] and lines[1].startswith("clock_hz=1e+09 mesh=1 ")
    assert re.fullmatch(rf"4 points, wall [0-9.]+ s; record: {re.escape(str(out))}", lines[-1])
    assert len(stderr.splitlines()) == 4
    # Without a --mesh axis a point's mesh is null.
    _, _, _, record = sweep(capsys, out, SCALE, "--hw", "test", "--hw-set", "clock_hz=1e9")
    assert [p["mesh"] for p in record["points"]] == [None]


def test_a_sweep_rejects_a_program_without_a_reference(capsys, tmp_path):
    program = tmp_path / "noref.mk"
    program.write_text(Path(SCALE).read_text().replace('reference "tune_scale_ref.py:reference";', ""))
    code, stdout, _, record = sweep(capsys, tmp_path / "s.json", program, "--hw", "test", "--mesh", "1")
    (r,) = record["points"][0]["results"]
    assert code == 1 and r["status"] == "rejected"
    assert r["reason"] == "no reference check: the program names no reference"
    assert "rejected: no reference check" in stdout


@pytest.mark.parametrize("argv, message", [
    (("--mesh", ""), "--mesh: error: bad mesh ''"),
    (("--hw-set", "clock_hz=1e9,"), "--hw-set chip.clock_hz: error: '' is not a value a profile takes"),
    (("--hw-set", "clock_hz="), "--hw-set: error: --hw-set wants KEY=V1,V2,..., got 'clock_hz='"),
])
def test_an_empty_axis_value_is_a_one_line_error(capsys, tmp_path, argv, message):
    code, stdout, stderr, record = sweep(capsys, tmp_path / "s.json", SCALE, "--hw", "test", *argv)
    assert code == 1 and stdout == "" and record == {}
    assert stderr.startswith(message) and len(stderr.strip().splitlines()) == 1


def test_the_plot_takes_a_log_scale_on_an_axis_that_spans_10x(monkeypatch, tmp_path):
    """"--plot draws µs per step against the first axis (... either axis on a log scale
    when its values span 10x or more)"."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from mkemu.sweep import Axis, Sweep, plot
    from mkemu.trials import Trial

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)

    def scales(values, times) -> tuple[str, str]:
        axis = Axis("chip.clock_hz", tuple(values))
        points = [{"hw_set": {"chip.clock_hz": v}, "mesh": None,
                   "results": [{"program": SCALE, "status": "ok", "us_per_step": us, "bound_by": "mxu busy"}]}
                  for v, us in zip(values, times)]
        plot(Sweep([Trial(SCALE, None)], [axis], points=points), str(tmp_path / "p.png"))
        (ax,) = figures.pop().axes
        return ax.get_xscale(), ax.get_yscale()

    assert scales((1e8, 1e9), (5.0, 6.0)) == ("log", "linear")
    assert scales((1e9, 2e9), (50.0, 5.0)) == ("linear", "log")
    assert scales((1e9, 2e9), (5.0, 6.0)) == ("linear", "linear")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
