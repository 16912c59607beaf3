"""`mkemu tune` and adversarial DMA schedules (docs/tuning.md): a variant that is
bit-exact in the normal schedule but races when DMAs land later is never reported
best. By default the best runs again under the late schedule after the search (and the
next best when it fails); `--schedules N` runs every bit-exact trial under N schedules;
the record says which, and --resume refuses a record that checked otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import mkemu.tune
from mkemu.cli import main
from tune_scale import run_tune as tune

TEST_HW = ("--hw", "test", "--mesh", "1")

# y = b, then 60 times y = 1.5 y + b. EARLY = 1 waits for the small copy b only at the
# end: in the normal schedule the wait for the big copy a (started first, landing last)
# also takes b's bytes, which landed first, so the run is bit-exact and race-free; the
# late schedule lands only a for that wait, and `y = xb` races with b's copy. It is the
# fastest variant, ahead of EARLY = 2 (both waited for) and the default EARLY = 0 (one
# copy after the other).
PROGRAM = """\
param EARLY = 0 in {0, 1, 2} "0 serial; 1 b waited for late (a schedule-only race); 2 overlapped";
reference "early_ref.py:reference";

kernel k(a: hbm f32[8, 512], b: hbm f32[8, 128], out: hbm f32[8, 128]) {
    vmem xa: f32[8, 512];
    vmem xb: f32[8, 128];
    vmem y: f32[8, 128];
    sem s;
    sem so;
    if EARLY == 0 {
        start copy(a, xa, s);
        wait copy(a, xa, s);
        start copy(b, xb, s);
        wait copy(b, xb, s);
    } else {
        start copy(a, xa, s);
        start copy(b, xb, s);
        wait copy(a, xa, s);
        if EARLY == 2 {
            wait copy(b, xb, s);
        }
    }
    y = xb;
    for i in 0..60 {
        y = y * 1.5 + xb;
    }
    start copy(y, out, so);
    if EARLY == 1 {
        wait copy(b, xb, s);
    }
    wait copy(y, out, so);
}

host {
    input a: f32[8, 512];
    input b: f32[8, 128];
    output out: f32[8, 128];
    launch k(a, b, out);
}
"""

REFERENCE = """\
import numpy as np


def reference(inputs, *, chips, cores_per_chip):
    out = {}
    for c in range(chips):
        xb = inputs[f"b@{c}"]
        y = xb.copy()
        for _ in range(60):
            y = (y * np.float32(1.5) + xb).astype(np.float32)
        out[f"out@{c}"] = y
    return out
"""

RACING_LINE = PROGRAM.splitlines().index("    y = xb;") + 1      # (the source names the read of xb: column 9)
SCALE = str(Path(__file__).parent / "data" / "tune_scale.mk")


@pytest.fixture
def program(tmp_path) -> str:
    (tmp_path / "early_ref.py").write_text(REFERENCE)
    path = tmp_path / "early.mk"
    path.write_text(PROGRAM)
    return str(path)


@pytest.fixture
def checks(monkeypatch) -> list[tuple[dict, int]]:
    """(params, schedules) of every check of a best (`run_schedules` from the tune)."""
    seen: list[tuple[dict, int]] = []
    real = mkemu.tune.run_schedules

    def counting(trial, count, normal):
        seen.append(({k: trial.options.params[k] for k in trial.options.params}, count))
        return real(trial, count, normal)

    monkeypatch.setattr(mkemu.tune, "run_schedules", counting)
    return seen


def outcome(record: dict) -> list[tuple]:
    return [(t["index"], t["params"], t["status"], t["objective"], t["reason"],
             t["report"].get("schedules") if t["report"] else None) for t in record["trials"]]


def by_early(record: dict) -> dict[int, dict]:
    return {t["params"]["EARLY"]: t for t in record["trials"]}


def test_the_normal_schedule_alone_ranks_the_race_first(capsys, tmp_path, program, checks):
    # (what the tune did before: --schedules 0 asks for the normal schedule only)
    code, out, err, record = tune(capsys, tmp_path, program, *TEST_HW, "--schedules", "0")
    assert code == 0 and all(t["status"] == "ok" for t in record["trials"])
    assert record["trials"][record["best"]]["params"] == {"EARLY": 1}
    assert record["schedules"] == {"trials": 0, "best": 0} and checks == []
    assert "best: EARLY=1, " in out and out.splitlines()[-2].endswith(
        "; not run under other DMA schedules (--schedules 0)")
    assert err.splitlines()[0].endswith(", on this process, no adversarial DMA schedules")


def test_the_best_is_checked_under_the_late_schedule_and_a_race_is_rejected(capsys, tmp_path, program, checks):
    code, out, err, record = tune(capsys, tmp_path, program, *TEST_HW)
    assert code == 0 and record["finished"] is True
    assert record["schedules"] == {"trials": 0, "best": 1}
    trials = by_early(record)
    racing = trials[1]
    assert racing["status"] == "rejected" and racing["objective"] is None
    assert racing["reason"].startswith("under the late schedule: [race] at chip 0, core 0, cycle ")
    assert "buffer 'xb'" in racing["reason"] and racing["reason"].endswith(f"early.mk:{RACING_LINE}:9: y = xb;)")
    assert racing["report"]["bit_exact"] is True        # (its normal run: bit-exact)
    assert [(e["schedule"], e["seed"], e["outcome"]) for e in racing["report"]["schedules"]] == [("late", 0, "fault")]
    # The next best passed; only the two candidates ran again, under the late schedule.
    assert record["trials"][record["best"]]["params"] == {"EARLY": 2}
    assert [(e["schedule"], e["outcome"]) for e in trials[2]["report"]["schedules"]] == [("late", "same")]
    assert "schedules" not in trials[0]["report"]
    assert checks == [({"EARLY": 1}, 1), ({"EARLY": 2}, 1)]
    # The table, the rejected, the best line; a progress line for the rejection.
    ranked, rejected = out.split("rejected (")
    assert [line.split()[1] for line in ranked.splitlines()[1:]] == ["2", "0"]
    assert rejected.startswith("1):\n  EARLY=1: under the late schedule: [race] at ")
    assert "best: EARLY=2, " in out and "; the same bits under the late DMA schedule\n" in out
    check_line = err.splitlines()[-1]
    assert check_line.startswith("[1] EARLY=1: rejected: under the late schedule: [race]")
    assert check_line.endswith("(the best so far, run again under the late DMA schedule)")


def test_a_correct_programs_best_is_unchanged_and_checked_once(capsys, tmp_path, checks):
    argv = (SCALE, *TEST_HW, "--param", "TN=256,512,1024", "--param", "SYNC=0,1")
    code, out, _, unchecked = tune(capsys, tmp_path, *argv, "--schedules", "0", out="a.json")
    assert code == 0 and checks == []
    code, out, err, record = tune(capsys, tmp_path, *argv, out="b.json")
    assert code == 0 and record["best"] == unchecked["best"]
    assert [t["status"] for t in record["trials"]] == [t["status"] for t in unchecked["trials"]]
    best = record["trials"][record["best"]]
    assert checks == [(best["params"], 1)]
    assert [(e["schedule"], e["seed"], e["outcome"], e["detail"]) for e in best["report"]["schedules"]] == [
        ("late", 0, "same", None)]
    assert best["report"]["schedules"][0]["cycles"] == best["report"]["cycles"]
    assert sum("schedules" in t["report"] for t in record["trials"] if t["report"]) == 1
    assert "; the same bits under the late DMA schedule" in out
    assert len(err.splitlines()) == 1 + len(record["trials"])   # (a check that passes adds no progress line)


def test_every_candidate_racing_leaves_nothing_to_recommend(capsys, tmp_path, program, checks):
    Path(program).write_text(PROGRAM.replace("param EARLY = 0 in", "param EARLY = 1 in"))
    code, out, _, record = tune(capsys, tmp_path, program, *TEST_HW, "--param", "EARLY=1")
    assert code == 1 and record["best"] is None and record["finished"] is True
    (only,) = record["trials"]
    assert only["status"] == "rejected" and only["reason"].startswith("under the late schedule: [race]")
    assert "no variant was bit-exact: nothing to recommend" in out and checks == [({"EARLY": 1}, 1)]


@pytest.mark.parametrize("jobs", [(), ("--jobs", "2")])
def test_schedules_n_checks_every_bit_exact_trial_as_it_runs(capsys, tmp_path, program, checks, jobs):
    code, out, err, record = tune(capsys, tmp_path, program, *TEST_HW, "--schedules", "2", *jobs)
    assert code == 0 and record["schedules"] == {"trials": 2, "best": 0}
    trials = by_early(record)
    assert trials[1]["status"] == "rejected" and trials[1]["reason"].startswith("under the late schedule: [race]")
    for early in (0, 2):
        assert trials[early]["status"] == "ok"
        assert [(e["schedule"], e["seed"], e["outcome"]) for e in trials[early]["report"]["schedules"]] == [
            ("late", 0, "same"), ("shuffle", 1, "same")]
    assert record["trials"][record["best"]]["params"] == {"EARLY": 2}
    assert checks == []       # (the best was checked with every trial: not again)
    assert "every bit-exact variant also under 2 adversarial DMA schedules" in err.splitlines()[0]
    assert f"[{trials[1]['index']}] EARLY=1: rejected: under the late schedule: [race]" in err
    assert "; the same bits under 2 adversarial DMA schedules" in out


def test_schedules_n_on_a_dask_cluster(capsys, tmp_path, program):
    distributed = pytest.importorskip("distributed")
    _, _, _, alone = tune(capsys, tmp_path, program, *TEST_HW, "--schedules", "1", out="one.json")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=":0") as cluster:
        code, _, _, remote = tune(capsys, tmp_path, program, *TEST_HW, "--schedules", "1",
                                  "--scheduler", cluster.scheduler_address, out="dask.json")
    assert code == 0 and outcome(remote) == outcome(alone)
    assert by_early(remote)[1]["reason"].startswith("under the late schedule: [race]")


@pytest.mark.parametrize("value, message", [
    ("-1", "--schedules: error: --schedules must be 0..1000 (each is a whole run), not -1"),
    ("1001", "--schedules: error: --schedules must be 0..1000 (each is a whole run), not 1001"),
])
def test_bad_schedules_are_one_line_errors_as_for_run(capsys, tmp_path, program, value, message):
    code, _, err, record = tune(capsys, tmp_path, program, *TEST_HW, "--schedules", value)
    assert code == 1 and err.strip() == message and record == {}
    assert main(["run", program, *TEST_HW, "--schedules", value]) == 1
    assert capsys.readouterr().err.strip() == message


def test_a_schedules_value_that_is_not_a_number_is_a_usage_error(capsys, program):
    with pytest.raises(SystemExit) as exc:
        main(["tune", program, *TEST_HW, "--schedules", "late"])
    _, err = capsys.readouterr()
    assert exc.value.code == 2 and "invalid int value: 'late'" in err


@pytest.mark.parametrize("first, then, recorded, mine", [
    ((), ("--schedules", "2"), "the best variant under the late schedule (no --schedules)",
     "every bit-exact trial under 2 adversarial schedules (--schedules 2)"),
    (("--schedules", "2"), (), "every bit-exact trial under 2 adversarial schedules (--schedules 2)",
     "the best variant under the late schedule (no --schedules)"),
    (("--schedules", "1"), ("--schedules", "0"), "every bit-exact trial under 1 adversarial schedule (--schedules 1)",
     "no adversarial schedule (--schedules 0)"),
])
def test_resume_refuses_a_record_that_checked_other_schedules(capsys, tmp_path, program, first, then, recorded,
                                                              mine):
    tune(capsys, tmp_path, program, *TEST_HW, *first, out="a.json")
    path = tmp_path / "a.json"
    before = path.read_text()
    code, _, err, _ = tune(capsys, tmp_path, program, *TEST_HW, *then, "--resume", str(path), out="b.json")
    assert code == 1 and err.strip() == (
        f"{path}: schedules: error: the record is of another search: it checked {recorded}, this tune checks "
        f"{mine}: resume with the record's --schedules, or start a new tune")
    assert path.read_text() == before and not (tmp_path / "b.json").exists()


def test_a_record_from_before_schedules_resumes_only_without_schedules(capsys, tmp_path, program):
    tune(capsys, tmp_path, program, *TEST_HW, "--schedules", "0", out="a.json")
    old = json.loads((tmp_path / "a.json").read_text())
    del old["schedules"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    code, _, err, _ = tune(capsys, tmp_path, program, *TEST_HW, "--schedules", "1", "--resume",
                           str(tmp_path / "old.json"), out="b.json")
    assert code == 1 and "it checked the best variant under the late schedule (no --schedules)" in err
    # Without --schedules: its trials are taken, and the best is checked as in any tune.
    code, _, _, record = tune(capsys, tmp_path, program, *TEST_HW, "--resume", str(tmp_path / "old.json"),
                              out="c.json")
    assert code == 0 and all(t["resumed"] for t in record["trials"])
    assert record["trials"][record["best"]]["params"] == {"EARLY": 2}
    assert by_early(record)[1]["reason"].startswith("under the late schedule: [race]")


def test_resuming_runs_no_check_the_record_holds_and_ends_as_the_tune_did(capsys, tmp_path, program, checks,
                                                                          monkeypatch):
    _, _, _, first = tune(capsys, tmp_path, program, *TEST_HW, out="a.json")
    checks.clear()
    runs = []
    real = mkemu.tune.run_trials
    monkeypatch.setattr(mkemu.tune, "run_trials", lambda trials, *a, **k: (runs.extend(trials), real(trials, *a, **k)))
    # A finished record: nothing runs again; the race is ranked, then rejected again.
    code, _, err, again = tune(capsys, tmp_path, program, *TEST_HW, "--resume", str(tmp_path / "a.json"),
                               out="b.json")
    assert code == 0 and outcome(again) == outcome(first) and runs == [] and checks == []
    assert "[1] EARLY=1: 2." in err and err.splitlines()[-1].endswith(
        "(the best so far; its late DMA schedule from the record)")
    # Interrupted before the check of the best: the search is taken, the check runs.
    cut = dict(first, finished=False, trials=[dict(t) for t in first["trials"]])
    for t in cut["trials"]:
        if t["report"]:
            t["report"] = {k: v for k, v in t["report"].items() if k != "schedules"}
            if t["status"] == "rejected":
                t.update(status="ok", reason=None, objective=t["report"]["seconds"] * 1e6)
    (tmp_path / "cut.json").write_text(json.dumps(cut))
    code, _, _, resumed = tune(capsys, tmp_path, program, *TEST_HW, "--resume", str(tmp_path / "cut.json"),
                               out="c.json")
    assert code == 0 and runs == [] and checks == [({"EARLY": 1}, 1), ({"EARLY": 2}, 1)]
    assert outcome(resumed) == outcome(first)
    # Interrupted after the race was rejected, before the next best was checked.
    checks.clear()
    cut = dict(first, finished=False, trials=[dict(t) for t in first["trials"]])
    best = cut["trials"][first["best"]]
    best["report"] = {k: v for k, v in best["report"].items() if k != "schedules"}
    (tmp_path / "cut2.json").write_text(json.dumps(cut))
    code, _, _, resumed = tune(capsys, tmp_path, program, *TEST_HW, "--resume", str(tmp_path / "cut2.json"),
                               out="d.json")
    assert code == 0 and runs == [] and checks == [({"EARLY": 2}, 1)]
    assert outcome(resumed) == outcome(first)


def test_a_record_with_damaged_schedules_is_refused(capsys, tmp_path, program):
    tune(capsys, tmp_path, program, *TEST_HW, out="a.json")
    record = json.loads((tmp_path / "a.json").read_text())
    record["trials"][record["best"]]["report"]["schedules"] = [{"schedule": "late", "outcome": "fine"}]
    (tmp_path / "bad.json").write_text(json.dumps(record))
    code, _, err, _ = tune(capsys, tmp_path, program, *TEST_HW, "--resume", str(tmp_path / "bad.json"), out="b.json")
    assert code == 1
    assert err.strip() == (f"{tmp_path / 'bad.json'}: trials[{record['best']}]: error: bad tune record: its report's "
                           "\"schedules\" is not a list of schedule outcomes")
