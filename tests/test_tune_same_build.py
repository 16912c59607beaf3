"""`mkemu tune` runs each build once: a variant that compiles to the same program as a
trial already tried (the default build included) is not run again but reported as
that trial's build, with its result, and does not count toward --budget."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import mkemu.tune
from mkemu.cli import main
from tune_scale import run_tune as tune

DATA = Path(__file__).parent / "data"
TEST_HW = ("--hw", "test", "--mesh", "1")


@pytest.fixture
def program(tmp_path) -> str:
    """tune_scale.mk with EXTRA: 0 and 1 compile to the same program; 2 adds a `* 1.0`
    (another build, the same bits), and only where SYNC is not 1."""
    shutil.copy(DATA / "tune_scale_ref.py", tmp_path / "tune_scale_ref.py")
    text = (DATA / "tune_scale.mk").read_text()
    text = text.replace('reference "', 'param EXTRA = 0 in {0, 1, 2} "no effect but at 2";\nreference "', 1)
    text = text.replace("            if SYNC == 3 {", "            if EXTRA == 2 {\n                xv = xv * 1.0;\n"
                                                     "            }\n            if SYNC == 3 {", 1)
    path = tmp_path / "extra.mk"
    path.write_text(text)
    return str(path)


@pytest.fixture
def runs(monkeypatch) -> list[dict]:
    """The params of every trial actually run."""
    seen: list[dict] = []
    real = mkemu.tune.run_trials

    def counting(trials, on_done, **kwargs):
        seen.extend({k: t.options.params[k] for k in t.options.params} for t in trials)
        return real(trials, on_done, **kwargs)

    monkeypatch.setattr(mkemu.tune, "run_trials", counting)
    return seen


def outcome(record: dict) -> list[tuple]:
    return [(t["index"], t["params"], t["status"], t["objective"], t["reason"], t.get("same_as"))
            for t in record["trials"]]


def test_a_variant_of_a_build_already_tried_is_not_run_again(capsys, tmp_path, program, runs):
    code, out, err, record = tune(capsys, tmp_path, program, *TEST_HW, "--param", "TN=512,1024",
                                  "--param", "EXTRA", "--param", "SYNC=0,1")
    assert code == 0 and record["search"] == "exhaustive" and len(record["trials"]) == 12
    same = {t["index"]: t["same_as"] for t in record["trials"] if "same_as" in t}
    by_index = {t["index"]: t for t in record["trials"]}
    # EXTRA=1 is EXTRA=0's build; so is EXTRA=2 where SYNC=1 (the scaling it adds is not compiled).
    for index, original in same.items():
        t, o = by_index[index], by_index[original]
        assert original < index and "same_as" not in o
        assert {**t["params"], "EXTRA": 0} == o["params"] and (t["params"]["EXTRA"] == 1 or t["params"]["SYNC"] == 1)
        assert (t["status"], t["reason"], t["objective"], t["report"]) == (o["status"], o["reason"], o["objective"],
                                                                           o["report"])
        assert t["wall_s"] == 0.0
    assert same == {2: 0, 3: 1, 5: 1, 8: 6, 9: 7, 11: 7}   # trial 2, TN=512 EXTRA=1 SYNC=0: the default's build
    assert len(runs) == 6 and all(p["EXTRA"] == 0 or (p["EXTRA"], p["SYNC"]) == (2, 0) for p in runs)
    # The table and the progress lines say so; the best is never such a trial.
    assert "(same build as the default)" in out and "(same build as trial 6)" in out
    assert "exhaustive search, 12 trials (6 the same build as an earlier one: not run)" in out
    assert f"] TN=512 EXTRA=1 SYNC=0: {by_index[0]['objective']:.3f} (same build as the default: not run)" in err
    assert "same_as" not in by_index[record["best"]]
    rows = out.split("rejected (")[0].splitlines()[1:]
    assert [row.split()[0] for row in rows] == ["1", "1", "2", "2", "3", "4"]   # a build's trials share its rank
    # Each progress line is numbered by its trial's record index (the N of "same build as
    # trial N"), once each; a count of finished trials repeated and skipped numbers.
    progress = {int(line[1:line.index("]")]): line for line in err.splitlines()[1:]}
    assert sorted(progress) == list(range(12)) and len(err.splitlines()) == 13
    for index, t in by_index.items():
        assert progress[index].startswith(f"[{index}] {' '.join(f'{k}={v}' for k, v in t['params'].items())}: ")
    assert progress[8].endswith("(same build as trial 6: not run)")


def test_the_budget_counts_builds_run_and_the_search_stays_deterministic(capsys, tmp_path, program, runs):
    argv = (program, *TEST_HW, "--param", "TN=256,512,1024", "--param", "EXTRA", "--budget", "4", "--seed", "0")
    _, _, _, first = tune(capsys, tmp_path, *argv, out="a.json")
    assert first["search"] == "optuna-tpe"
    run = [t for t in first["trials"] if "same_as" not in t]
    assert len(run) == 4 == len(runs) and first["trials"][0]["default"] is True
    # (with this seed the sampler proposes a variant of a build already tried: 5 trials;
    # another optuna may propose others, but every trial past the 4 runs is such a variant)
    assert len(first["trials"]) >= 4 and all(t["same_as"] < i for i, t in enumerate(first["trials"]) if "same_as" in t)
    assert len({json.dumps(t["params"], sort_keys=True) for t in first["trials"]}) == len(first["trials"])
    _, _, _, pool = tune(capsys, tmp_path, *argv, "--jobs", "2", out="b.json")
    assert outcome(pool) == outcome(first)
    # Resumed from a record cut after three trials: the same tune, the rest run or matched again.
    cut = dict(first, trials=first["trials"][:3], finished=False)
    (tmp_path / "cut.json").write_text(json.dumps(cut))
    runs.clear()
    assert main(["tune", *argv, "--resume", str(tmp_path / "cut.json")]) == 0
    capsys.readouterr()
    resumed = json.loads((tmp_path / "cut.json").read_text())
    assert outcome(resumed) == outcome(first)
    assert len(runs) == 4 - sum(1 for t in first["trials"][:3] if "same_as" not in t)


def test_a_search_ends_when_every_variant_is_known(capsys, tmp_path, program, runs):
    # 4 variants, 2 builds, a budget of 3 builds: the sampler's search, which ends once it
    # has every variant (before, it ran 3 variants, the third of a build already run).
    code, _, _, record = tune(capsys, tmp_path, program, *TEST_HW, "--param", "TN=512,1024", "--param", "EXTRA=0,1",
                              "--budget", "3")
    assert code == 0 and record["search"] == "optuna-tpe" and record["finished"] is True
    assert len(record["trials"]) == 4 and len(runs) == 2
    assert sorted(t.get("same_as") is None for t in record["trials"]) == [False, False, True, True]


SEMAPHORE_BY_VARIANT = """param V = 0 in {0, 1} "which semaphore";
reference "ref.py:reference";

fn body(b: hbm f32[8, 128], xb: vmem f32[8, 128], out: hbm f32[8, 128], s: sem) {
    start copy(b, xb, s);
    wait 2 * copy(b, xb, s);
    start copy(xb, out, s);
    wait copy(xb, out, s);
}

kernel k(b: hbm f32[8, 128], out: hbm f32[8, 128]) {
    vmem xb: f32[8, 128];
    if V == 0 {
        sem alpha;
        body(b, xb, out, alpha);
    } else {
        sem beta;
        body(b, xb, out, beta);
    }
}

host {
    input b: f32[8, 128];
    output out: f32[8, 128];
    launch k(b, out);
}
"""


def test_variants_whose_faults_name_other_semaphores_are_other_builds(capsys, tmp_path):
    # V=0 and V=1 compile to the same code, but a fault names the semaphore ('alpha' or
    # 'beta') and the call the fn was inlined at: V=1 is run, and its reason is its own.
    (tmp_path / "ref.py").write_text("def reference(inputs):\n    return {'out': inputs['b']}\n")
    path = tmp_path / "sems.mk"
    path.write_text(SEMAPHORE_BY_VARIANT)
    code, _, _, record = tune(capsys, tmp_path, str(path), *TEST_HW)
    reasons = {t["params"]["V"]: t["reason"] for t in record["trials"]}
    assert code == 1 and all("same_as" not in t for t in record["trials"])
    assert "'alpha'" in reasons[0] and "'beta'" in reasons[1]
