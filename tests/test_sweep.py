"""`mkemu sweep`: every program at every point of the hardware and mesh axes, what
each is bound by, the record and the plot, on this process, local processes or Dask."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mkemu.cli import main

ROOT = Path(__file__).parents[1]
SCALE = str(Path(__file__).parent / "data" / "tune_scale.mk")


def sweep(capsys, tmp_path, *argv) -> tuple[int, str, str, dict]:
    code = main(["sweep", *argv, "--out", str(tmp_path / "sweep.json")])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    path = tmp_path / "sweep.json"
    return code, out, err, json.loads(path.read_text()) if path.is_file() else {}


def figures(record: dict) -> list:
    return [(p["hw_set"], p["mesh"], [(r["status"], r.get("us_per_step"), r.get("bound_by")) for r in p["results"]])
            for p in record["points"]]


def test_every_point_of_every_axis_runs_and_says_what_bounds_it(capsys, tmp_path):
    code, out, _, record = sweep(capsys, tmp_path, SCALE, "--hw", "test", "--hw-set",
                                 "hbm_bw_bytes_per_s=8e9,64e9", "--hw-set", "dma.start_latency_cycles=10,1000",
                                 "--mesh", "1,2")
    assert code == 0
    assert record["axes"] == {"chip.hbm_bw_bytes_per_s": [8e9, 64e9], "dma.start_latency_cycles": [10, 1000],
                              "mesh": ["1", "2"]}
    assert len(record["points"]) == 8
    us = {}
    for point in record["points"]:
        (result,) = point["results"]
        assert result["status"] == "ok" and result["report"]["bit_exact"] is True
        assert result["bound_by"] == max(result["breakdown"]["parts"], key=result["breakdown"]["parts"].get)
        assert result["report"]["hw"].startswith("test ")
        assert result["report"]["chips"] == int(point["mesh"])
        us[(point["hw_set"]["chip.hbm_bw_bytes_per_s"], point["hw_set"]["dma.start_latency_cycles"],
            point["mesh"])] = result["us_per_step"]
    # More bandwidth or a shorter DMA start never makes the step slower.
    for latency in (10, 1000):
        for mesh in ("1", "2"):
            assert us[(64e9, latency, mesh)] <= us[(8e9, latency, mesh)]
            assert us[(8e9, 10, mesh)] <= us[(8e9, 1000, mesh)]
    assert len(out.splitlines()) == 1 + 8 + 1 and "semaphore wait" in out


def test_a_timing_class_number_is_an_axis_merged_into_the_base_class(capsys, tmp_path):
    # (`timing.valu.latency_cycles` was refused as "no profile value", suggesting a [chip] key)
    code, out, _, record = sweep(capsys, tmp_path, SCALE, "--hw", "test", "--mesh", "1", "--hw-set",
                                 "timing.valu.latency_cycles=2,40", "--hw-set", "valu.occupancy_cycles=1,8")
    assert code == 0
    assert record["axes"] == {"timing.valu.latency_cycles": [2, 40], "timing.valu.occupancy_cycles": [1, 8],
                              "mesh": ["1"]}
    us = {(p["hw_set"]["timing.valu.latency_cycles"], p["hw_set"]["timing.valu.occupancy_cycles"]):
          p["results"][0]["us_per_step"] for p in record["points"]}
    assert all(p["results"][0]["status"] == "ok" for p in record["points"])
    assert us[(2, 1)] < us[(40, 1)] and us[(2, 1)] <= us[(2, 8)]
    # Each point's profile is the base's with only that number changed (the other one kept).
    report = record["points"][1]["results"][0]["report"]
    assert report["hw"] == "test valu.latency_cycles=2 valu.occupancy_cycles=8"
    assert "\nvalu.latency_cycles=40 valu.occupancy_cycles=1 mesh=1 " in out


def test_a_point_profile_keeps_the_base_timing_class_number_it_does_not_set(tmp_path):
    from mkemu.isa.hardware import load_profile
    from mkemu.sweep import parse_axis, variant_toml

    axis = parse_axis("timing.mxu_mac.occupancy_cycles=3")
    path = tmp_path / "point.toml"
    path.write_text(variant_toml("test", {axis.key: axis.values[0]}))
    base, point = load_profile("test"), load_profile(path)
    assert point.timing["mxu_mac"].occupancy_cycles == 3
    assert point.timing["mxu_mac"].latency_cycles == base.timing["mxu_mac"].latency_cycles
    assert {k: v for k, v in point.timing.items() if k != "mxu_mac"} == {k: v for k, v in base.timing.items()
                                                                        if k != "mxu_mac"}


def test_k3_programs_report_their_floor_and_breakdown(capsys, tmp_path):
    k3 = [str(ROOT / "programs" / f"k3_{name}.mk") for name in ("per_op", "megakernel")]
    code, out, _, record = sweep(capsys, tmp_path, *k3, "--model", "k3-tiny", "--prompt-len", "1", "--steps", "1",
                                 "--hw-set", "ici.hop_latency_s=0.1e-6,2e-6", "--mesh", "2x1x1")
    assert code == 0
    for point in record["points"]:
        per_op, mega = point["results"]
        assert per_op["program"].endswith("k3_per_op.mk") and mega["program"].endswith("k3_megakernel.mk")
        for r in (per_op, mega):
            assert 0 < r["fraction_of_floor"] <= 1
            assert r["bound_by"] in r["report"]["breakdown_us"]
        assert mega["us_per_step"] < per_op["us_per_step"]
    slow, fast = (next(p for p in record["points"] if p["hw_set"]["ici.hop_latency_s"] == v) for v in (2e-6, 0.1e-6))
    assert fast["results"][1]["us_per_step"] < slow["results"][1]["us_per_step"]
    assert "% of floor" in out


def test_the_plot_is_a_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    code = main(["sweep", SCALE, "--hw", "test", "--hw-set", "hbm_bw_bytes_per_s=8e9,16e9,64e9", "--mesh", "1",
                 "--plot", str(tmp_path / "sweep.png")])
    out, _ = capsys.readouterr()
    assert code == 0 and f"plot: {tmp_path / 'sweep.png'}" in out
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_programs_of_one_name_in_two_folders_are_told_apart(capsys, tmp_path):
    # Their columns, progress lines and plot lines were all named by the file's name.
    for folder in ("base", "tuned"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "k.mk").write_text(Path(SCALE).read_text().replace(
            "param N = 2048;", "param N = 2048;" if folder == "base" else "param N = 4096;"))
        (tmp_path / folder / "tune_scale_ref.py").write_text((Path(SCALE).parent / "tune_scale_ref.py").read_text())
    code, out, err, record = sweep(capsys, tmp_path, str(tmp_path / "base" / "k.mk"), str(tmp_path / "tuned" / "k.mk"),
                                   "--hw", "test", "--mesh", "1,2")
    assert code == 0 and out.splitlines()[0].split()[1:] == ["base/k.mk", "tuned/k.mk"]
    assert "mesh=1 base/k.mk:" in err and "mesh=1 tuned/k.mk:" in err
    from mkemu.sweep import program_names
    assert program_names(["/a/x/k.mk", "/b/x/k.mk", "/b/y.mk"]) == ["a/x/k.mk", "b/x/k.mk", "y.mk"]


def test_without_matplotlib_the_plot_is_a_clear_error(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # import matplotlib now fails
    code, _, err, record = sweep(capsys, tmp_path, SCALE, "--hw", "test", "--mesh", "1", "--plot",
                                 str(tmp_path / "p.png"))
    assert code == 1 and record == {}
    assert err.strip() == ("--plot: error: --plot needs matplotlib, which is not installed: "
                           "pip install 'mkemu[plot]' (the JSON record has every figure)")


def test_local_processes_and_dask_give_the_same_sweep(capsys, tmp_path):
    distributed = pytest.importorskip("distributed")
    argv = (SCALE, "--hw", "test", "--hw-set", "hbm_bw_bytes_per_s=8e9,64e9", "--mesh", "1,2")
    _, _, _, alone = sweep(capsys, tmp_path, *argv)
    _, _, _, pool = sweep(capsys, tmp_path, *argv, "--jobs", "2")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=":0") as cluster:
        code, _, _, remote = sweep(capsys, tmp_path, *argv, "--scheduler", cluster.scheduler_address)
    assert code == 0
    assert figures(pool) == figures(alone) == figures(remote)


@pytest.mark.parametrize("argv, message", [
    (("--hw-set", "hbm_bw=1e9"), "--hw-set hbm_bw: error: no profile value 'hbm_bw' (did you mean 'hbm_bytes'?)"),
    # A timing class's numbers are values too; a wrong one is said as such, not as another section's key.
    (("--hw-set", "timing.scalr.latency_cycles=1"),
     ("--hw-set timing.scalr.latency_cycles: error: no timing value 'timing.scalr.latency_cycles' (did you mean "
      "'timing.scalar.latency_cycles'?)")),
    (("--hw-set", "timing.valu=1"),
     ("--hw-set timing.valu: error: no timing value 'timing.valu' (did you mean 'timing.valu.latency_cycles' or "
      "'timing.valu.occupancy_cycles'?); a timing class is varied by one of its two numbers")),
    (("--hw-set", "timing.valu.latency_cycles=0"), "--hw-set timing.valu.latency_cycles=0: error: must be at least 1"),
    (("--hw-set", "hbm_bw_bytes_per_s=-1"), "--hw-set chip.hbm_bw_bytes_per_s=-1: error: must be positive, "
                                            "got -1"),
    (("--hw-set", "vmem_bytes=1x"), "--hw-set core.vmem_bytes: error: '1x' is not a value a profile takes"),
    (("--hw-set", "vmem_bytes"), "--hw-set: error: --hw-set wants KEY=V1,V2,..., got 'vmem_bytes'"),
    # A TOML date or table: the error was the point's own profile, "invalid TOML", naming datetime.date(...).
    (("--hw-set", "clock_hz=1979-05-27"), "--hw-set chip.clock_hz: error: '1979-05-27' is not a value a profile"),
    (("--hw-set", "mesh.dims=[{{x=1}}]"), "--hw-set mesh.dims: error: '[{x=1}]' is not a value a profile takes"),
    (("--mesh", "2x0"), "--mesh: error: bad mesh '2x0'"),
    # One value in both its units: the point's profile took the last one silently.
    (("--hw-set", "hbm_bw_bytes_per_s=1e12", "--hw-set", "hbm_bw_bytes_per_cycle=100"),
     "--hw-set: error: chip.hbm_bw_bytes_per_s and chip.hbm_bw_bytes_per_cycle are one profile value in two units"),
    (("--hw-set", "ici.hop_latency_cycles=10", "--hw-set", "hop_latency_s=1e-6"),
     "--hw-set: error: ici.hop_latency_cycles and ici.hop_latency_s are one profile value in two units"),
    ((), "--hw-set: error: nothing to sweep: give --hw-set KEY=V1,V2,... and/or --mesh M1,M2,..."),
    (("--mesh", "1", "--plot", "{out}"), "--plot: error: --out and --plot both write"),
    # A value given twice was two points at one x; the profile's dims beside --mesh varied nothing.
    (("--hw-set", "clock_hz=1e9,2e9,1e9"), "--hw-set chip.clock_hz: error: 1e9 is given twice"),
    (("--mesh", "1,2,1"), "--mesh: error: 1 is given twice"),
    # Two spellings of one point were two points (the same run twice, one x twice); both are named.
    (("--mesh", "1,2,1x1x1"), "--mesh: error: 1 and 1x1x1 are one mesh, given twice: each value is one point"),
    (("--mesh", "2x1, 2X1x1"), "--mesh: error: 2x1 and 2X1x1 are one mesh, given twice"),
    (("--hw-set", "clock_hz=1e9,1_000_000_000"),
     "--hw-set chip.clock_hz: error: 1e9 and 1_000_000_000 are one value, given twice"),
    (("--hw-set", "mesh.dims=[2,1,1],[2, 1, 1]"), "--hw-set mesh.dims: error: [2,1,1] and [2, 1, 1] are one value"),
    # true is not 1: the 1 is the loader's error, not a duplicate of true.
    (("--hw-set", "per_core_links=true,1"),
     "--hw-set ici.per_core_links=1: error: expected true or false, got an integer (1)"),
    (("--hw-set", "mesh.dims=[1,1,1],[2,1,1]", "--mesh", "1,2"),
     "--hw-set mesh.dims: error: --mesh and --hw-set mesh.dims both vary the mesh"),
])
def test_bad_sweep_options_are_one_line_errors(capsys, tmp_path, argv, message):
    argv = [a.format(out=tmp_path / "sweep.json") for a in argv]
    code, _, err, _ = sweep(capsys, tmp_path, SCALE, "--hw", "test", *argv)
    assert code == 1 and err.startswith(message) and len(err.strip().splitlines()) == 1


def test_an_unreadable_routing_record_is_one_error_before_any_point_runs(capsys, tmp_path):
    # It was read by every point's run, each rejected with the path twice in Python's errno text.
    missing = str(tmp_path / "nothing.json")
    code, out, err, record = sweep(capsys, tmp_path, "k3_megakernel", "--model", "k3-tiny", "--steps", "1",
                                   "--prompt-len", "1", "--timing-only", "--routing", missing, "--mesh", "1,2")
    assert code == 1 and record == {} and out == ""
    assert err == f"{missing}: error: cannot read the routing record: No such file or directory\n"


def test_a_mesh_past_the_chip_limit_is_refused_before_any_point_runs(capsys):
    # It was rejected as a point, after the good points had run (tuning.md: every point
    # is checked before the first run).
    code = main(["sweep", str(Path(__file__).parents[1] / "programs" / "examples" / "vector_add.mk"), "--hw", "test",
                 "--mesh", "2x1x1,64x64x64"])
    out, err = capsys.readouterr()
    assert code == 1 and err.strip() == "--mesh: error: mesh 64x64x64 has 262,144 chips; the emulator takes at most 1,024"
    assert "vector_add" not in out


def test_a_value_past_float_s_range_is_named_as_typed(capsys, tmp_path):
    # (1e400 reads as inf: the error said "hbm_bw_bytes_per_s=inf ... got inf")
    code, _, err, _ = sweep(capsys, tmp_path, "vector_add", "--hw", "test", "--hw-set", "hbm_bw_bytes_per_s=1e400,2e9")
    assert code == 1
    assert err.strip() == ("--hw-set chip.hbm_bw_bytes_per_s: error: 1e400 is not a finite number (every profile value "
                           "must be one)")
