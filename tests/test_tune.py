"""`mkemu tune`: only bit-exact variants win, rejections carry their reason, the search
is deterministic for a seed, resumable from its record, and runs the same in this
process, in local processes and on a Dask cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mkemu.cli import main
from tune_scale import run_tune as tune

ROOT = Path(__file__).parents[1]
SCALE = str(Path(__file__).parent / "data" / "tune_scale.mk")
TEST_HW = ("--hw", "test", "--mesh", "1")


def outcome(record: dict) -> list[tuple]:
    """What a tune found, without the host's wall times."""
    return [(t["index"], t["params"], t["status"], t["objective"], t["reason"]) for t in record["trials"]]


def test_planted_synchronisation_bugs_are_rejected_with_their_reason(capsys, tmp_path):
    code, out, _, record = tune(capsys, tmp_path, SCALE, *TEST_HW, "--param", "SYNC", "--param", "TN=512,1024")
    assert code == 0
    assert record["search"] == "exhaustive" and record["finished"] is True
    by_sync = {}
    for t in record["trials"]:
        by_sync.setdefault(t["params"]["SYNC"], []).append(t)
    assert all(t["status"] == "ok" and t["report"]["bit_exact"] is True for t in by_sync[0])
    reasons = {sync: {t["reason"].split(" ")[0] for t in trials} for sync, trials in by_sync.items() if sync}
    assert reasons == {1: {"[race]"}, 2: {"[deadlock]"}, 3: {"wrong"}}
    assert all(t["objective"] is None for sync in (1, 2, 3) for t in by_sync[sync])
    assert "tune_scale.mk:17" in by_sync[1][0]["reason"]          # the racing line
    best = next(t for t in record["trials"] if t["index"] == record["best"])
    assert best["params"]["SYNC"] == 0
    # The ranked table lists the bit-exact variants only; the rest under "rejected".
    ranked, rejected = out.split("rejected (")
    assert "SYNC" in ranked.splitlines()[0]
    assert len([line for line in ranked.splitlines()[1:] if line.strip()]) == len(by_sync[0])
    assert rejected.startswith("6):")


def test_a_variant_that_does_not_compile_is_rejected(capsys, tmp_path):
    code, out, _, record = tune(capsys, tmp_path, SCALE, *TEST_HW, "--param", "TN")
    assert code == 0
    (bad,) = [t for t in record["trials"] if t["status"] == "rejected"]
    assert bad["params"] == {"TN": 768}
    assert bad["reason"].startswith("compile error: ") and "TN must divide N" in bad["reason"]
    ok = sorted((t["objective"], t["params"]["TN"]) for t in record["trials"] if t["status"] == "ok")
    assert [tn for _, tn in ok][0] == record["trials"][record["best"]]["params"]["TN"]
    default = record["trials"][0]
    assert default["default"] is True and default["params"] == {"TN": 512}
    assert "speedup" in out.splitlines()[0]


def test_without_a_reference_check_nothing_can_win(capsys, tmp_path):
    program = tmp_path / "noref.mk"
    program.write_text(Path(SCALE).read_text().replace('reference "tune_scale_ref.py:reference";', ""))
    code, out, _, record = tune(capsys, tmp_path, str(program), *TEST_HW, "--param", "TN=512,1024")
    assert code == 1
    assert {t["reason"] for t in record["trials"]} == {"no reference check: the program names no reference"}
    assert record["best"] is None and "no variant was bit-exact" in out


def test_the_search_is_deterministic_and_resumable(capsys, tmp_path):
    argv = (SCALE, *TEST_HW, "--param", "SYNC", "--param", "TN", "--budget", "7", "--seed", "3")
    _, _, _, first = tune(capsys, tmp_path, *argv, out="a.json")
    assert first["search"] == "optuna-tpe" and len(first["trials"]) == 7
    assert first["trials"][0]["default"] is True
    assert len({json.dumps(t["params"], sort_keys=True) for t in first["trials"]}) == 7
    _, _, _, again = tune(capsys, tmp_path, *argv, out="b.json")
    assert outcome(again) == outcome(first)
    # An interrupted tune: its record holds the first trials only.
    cut = dict(first, trials=first["trials"][:3], finished=False)
    (tmp_path / "cut.json").write_text(json.dumps(cut))
    code = main(["tune", *argv, "--resume", str(tmp_path / "cut.json")])
    _, err = capsys.readouterr()
    resumed = json.loads((tmp_path / "cut.json").read_text())
    assert code == 0 and resumed["finished"] is True
    assert outcome(resumed) == outcome(first)
    assert [bool(t.get("resumed")) for t in resumed["trials"]] == [True] * 3 + [False] * 4
    assert err.count("(from the record)") == 3


def test_resume_refuses_the_record_of_another_tune(capsys, tmp_path):
    tune(capsys, tmp_path, SCALE, *TEST_HW, "--param", "TN=512", out="a.json")
    code = main(["tune", SCALE, *TEST_HW, "--param", "TN=512", "--seed", "5", "--resume", str(tmp_path / "a.json")])
    _, err = capsys.readouterr()
    assert code == 1
    assert err.strip() == (f"{tmp_path / 'a.json'}: seed: error: the record is of another tune: its seed is 0, "
                           "this tune's is 5")


def _report_seconds(record: dict, seconds: float) -> dict:
    trial = record["trials"][0]
    return dict(record, trials=[dict(trial, report=dict(trial["report"], seconds=seconds))])


@pytest.mark.parametrize("damage, message", [
    (lambda r: b"\xff\xfe", "not a tune record (not UTF-8 text (byte 0xff at offset 0))"),
    (lambda r: dict(r, settings=None), "settings: error: bad tune record: \"settings\" is not an object"),
    (lambda r: dict(r, trials=None), "trials: error: bad tune record: \"trials\" is not a list"),
    (lambda r: dict(r, trials=[5]), "trials[0]: error: bad tune record: a trial is not an object"),
    (lambda r: dict(r, trials=[dict(r["trials"][0], params=None)]), "\"params\" is not an object of integers"),
    (lambda r: dict(r, trials=[dict(r["trials"][0], status="weird")]), "\"status\" is 'weird'"),
    (lambda r: dict(r, trials=[{k: v for k, v in r["trials"][0].items() if k != "wall_s"}]),
     "the trial lacks \"wall_s\""),
    (lambda r: dict(r, trials=[dict(r["trials"][0], report="x")]), "\"report\" is not an object"),
    # (two results of one variant: the later one was taken, the default's figure from another variant)
    (lambda r: dict(r, trials=[r["trials"][0], dict(r["trials"][0], wall_s=0.5)]),
     "trials[1]: error: bad tune record: trials[0] and trials[1] both hold a result of"),
    (lambda r: dict(r, trials=[dict(r["trials"][0], report={})]), "its report cannot be read"),
    # (a time of 0 made the ranked table divide by zero; NaN, inf or a string were ranked as they were)
    (lambda r: _report_seconds(r, 0), "its us_per_step is 0.0, not more than 0"),
    (lambda r: _report_seconds(r, -1e-6), "its us_per_step is -1.0, not more than 0"),
    (lambda r: _report_seconds(r, float("nan")), "its report's times are not all finite numbers"),
    (lambda r: _report_seconds(r, float("inf")), "its report's times are not all finite numbers"),
    (lambda r: dict(r, trials=[dict(r["trials"][0], report=dict(r["trials"][0]["report"], us_per_step="5"))]),
     "its report's times are not all finite numbers"),
])
def test_resume_refuses_a_damaged_record(capsys, tmp_path, damage, message):
    tune(capsys, tmp_path, SCALE, *TEST_HW, "--param", "TN=512", out="a.json")
    damaged = damage(json.loads((tmp_path / "a.json").read_text()))
    path = tmp_path / "bad.json"
    path.write_bytes(damaged if isinstance(damaged, bytes) else json.dumps(damaged).encode())
    code, stdout, stderr, _ = tune(capsys, tmp_path, SCALE, *TEST_HW, "--param", "TN=512", "--resume", str(path),
                                   out="b.json")
    assert code == 1 and message in stderr and stderr.startswith(f"{path}: ")


def test_local_processes_give_the_same_tune(capsys, tmp_path):
    argv = (SCALE, *TEST_HW, "--param", "TN=256,512,1024", "--param", "SYNC=0,1")
    _, _, _, alone = tune(capsys, tmp_path, *argv, out="one.json")
    code, _, err, pool = tune(capsys, tmp_path, *argv, "--jobs", "2", out="two.json")
    assert code == 0 and "on 2 local processes" in err
    assert outcome(pool) == outcome(alone)


def test_a_dask_cluster_gives_the_same_tune(capsys, tmp_path):
    distributed = pytest.importorskip("distributed")
    argv = (SCALE, *TEST_HW, "--param", "TN=512,1024", "--param", "SYNC=0,2")
    _, _, _, alone = tune(capsys, tmp_path, *argv, out="one.json")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=":0") as cluster:
        code, _, err, remote = tune(capsys, tmp_path, *argv, "--scheduler", cluster.scheduler_address,
                                    out="dask.json")
    assert code == 0 and f"on Dask scheduler {cluster.scheduler_address}" in err
    assert outcome(remote) == outcome(alone)


def test_tune_the_k3_megakernel(capsys, tmp_path):
    code, out, _, record = tune(capsys, tmp_path, str(ROOT / "programs" / "k3_megakernel.mk"), "--model",
                                "k3-tiny", "--prompt-len", "1", "--steps", "1", "--param", "SCHEME")
    assert code == 0
    assert [t["params"] for t in record["trials"]] == [{"SCHEME": 0}, {"SCHEME": 1}]
    for t in record["trials"]:
        assert t["status"] == "ok" and t["objective"] == t["report"]["us_per_step"]
        assert set(t["breakdown"]["parts"]) == set(t["report"]["breakdown_us"])
    assert record["settings"]["driver"] == {"model": "k3-tiny", "prompt_len": 1, "steps": 1}
    assert "collectives" in out


@pytest.mark.parametrize("argv, message", [
    (("--param", "NOPE"), "--param NOPE: error: the program has no param 'NOPE' (its params: N, TN, SYNC)"),
    (("--param", "TN=512,640"), "--param TN: error: 640 not among the values param 'TN' declares "
                                "(256, 512, 768, 1024, at {file}:6)"),
    (("--param", "N"), "--param N: error: param 'N' declares no values; give them: --param N=V1,V2,..."),
    (("--param", "TN=512", "--set", "TN=256"), "--param TN: error: 'TN' is both fixed with --set and tuned "
                                               "with --param"),
    (("--param", "TN=a"), "--param: error: --param wants NAME or NAME=V1,V2,... with integer values, got 'TN=a'"),
    (("--budget", "0"), "--budget: error: --budget must be at least 1, got 0"),
    (("--jobs", "0"), "--jobs: error: --jobs must be at least 1, got 0"),
    # (--jobs 1 too: the two are alternatives, and the one given second was ignored)
    (("--jobs", "1", "--scheduler", "tcp://127.0.0.1:1"), "--jobs: error: --jobs and --scheduler do not go "
                                                          "together: the cluster's workers run the trials"),
    (("--param", "TN=512", "--scheduler", "foo"), "--scheduler: error: cannot reach the Dask scheduler at foo: "
                                                  "missing port number in address 'foo'"),
])
def test_bad_tune_options_are_one_line_errors(capsys, tmp_path, argv, message):
    code = main(["tune", SCALE, *TEST_HW, *argv, "--out", str(tmp_path / "t.json")])
    _, err = capsys.readouterr()
    assert code == 1
    expected = message.format(file=SCALE)
    assert err.strip() in (expected, f"{SCALE}: {expected}")


def test_files_a_trial_writes_are_given_to_it_by_absolute_path(capsys, tmp_path, monkeypatch):
    """"Each trial is one task whose argument is the run options (absolute paths, ...)": a
    relative --record-routing reached the workers as given, relative to their folder."""
    monkeypatch.chdir(tmp_path)
    code, _, _, record = tune(capsys, tmp_path, "k3_megakernel", "--model", "k3-tiny", "--prompt-len", "1",
                              "--steps", "1", "--param", "WR_MAX=12", "--record-routing", "routing.bin")
    assert code == 0 and (tmp_path / "routing.bin").is_file()
    assert record["settings"]["driver"]["record_routing"] == str(tmp_path / "routing.bin")
    # (a trial's report keeps no host path: the record is the same wherever it was written)
    assert all("routing_record" not in trial["report"] for trial in record["trials"])


@pytest.mark.parametrize("param", ["BATCH=1,2", "SPEC=0,1"])
def test_driver_params_cannot_be_tuned(capsys, tmp_path, param):
    # (SPEC without --spec-rows was searched, each variant but the default rejected as a --set of it)
    out = tmp_path / "t.json"
    code = main(["tune", str(ROOT / "programs" / "k3_megakernel.mk"), "--model", "k3-tiny", "--param", param,
                 "--out", str(out)])
    _, err = capsys.readouterr()
    name = param.partition("=")[0]
    assert code == 1 and f"'{name}' is set by the program's driver" in err and "Traceback" not in err
    assert not out.exists()


def test_a_seed_the_sampler_cannot_take_is_an_error(capsys, tmp_path):
    # (optuna's sampler raised a ValueError traceback for a seed of 2**32 or more)
    code, _, err, record = tune(capsys, tmp_path, SCALE, *TEST_HW, "--param", "SYNC", "--param", "TN",
                                "--budget", "3", "--seed", str(2**32))
    assert code == 1 and err.startswith("--seed: error: --seed of a tune must be 0..4294967295")
    assert record == {}


def test_progress_lines_show_the_objective_as_the_table_does_and_counts_read_in_the_singular(capsys, tmp_path):
    # Progress printed cycles as "4145.000" beside the table's "4,145"; one trial read "1 trials".
    code, stdout, stderr, record = tune(capsys, tmp_path, "vector_add", *TEST_HW, "--param", "N=1024",
                                        "--objective", "cycles")
    cycles = record["trials"][0]["objective"]
    assert code == 0 and cycles > 1000
    assert f"[0] N=1024: {cycles:,.0f} (" in stderr and f"  {cycles:,.0f}  " in stdout
    assert stderr.startswith("tune vector_add: 1 variant of N,")
    assert "exhaustive search, 1 trial, wall" in stdout
