"""`mkemu tune` after an audit: a default build that does not compile is trial 0,
rejected, and the tune goes on; a record is resumed only by a tune of the same
program, hardware profile and inputs; an ok trial without a report is a bad record."""

from __future__ import annotations

import json

import pytest

from mkemu.cli import main

from tune_scale import scale_copy

TEST_HW = ("--hw", "test", "--mesh", "1")


def tune(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["tune", *map(str, argv)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err



def test_a_default_build_that_does_not_fit_is_rejected_and_the_tune_goes_on(capsys, tmp_path):
    program = scale_copy(tmp_path)
    small = tmp_path / "small.toml"
    # TN=512 (the default) needs 16 KiB of VMEM; 8 KiB holds TN=256 only.
    small.write_text('extends = "test"\nname = "small-vmem"\n[core]\nvmem_bytes = 8192\n')
    out = tmp_path / "t.json"
    code, stdout, stderr = tune(capsys, program, "--hw", small, "--mesh", "1", "--param", "TN=256,1024",
                                "--param", "SYNC=0", "--out", out)
    assert code == 0, stderr
    record = json.loads(out.read_text())
    trials = {t["params"]["TN"]: t for t in record["trials"]}
    assert record["trials"][0]["default"] and record["trials"][0]["params"]["TN"] == 512
    assert trials[512]["status"] == "rejected" and "VMEM" in trials[512]["reason"]
    assert trials[1024]["status"] == "rejected"
    assert trials[256]["status"] == "ok" and record["best"] == trials[256]["index"]
    assert "(the default was rejected)" in stdout


def test_an_error_of_the_program_itself_still_stops_the_tune_up_front(capsys, tmp_path):
    program = scale_copy(tmp_path)
    program.write_text(program.read_text() + "\nkernel broken( {\n")
    out = tmp_path / "t.json"
    code, stdout, stderr = tune(capsys, program, *TEST_HW, "--param", "TN=256,512", "--out", out)
    assert code != 0 and "error" in stderr and not out.exists() and "[0]" not in stderr


def test_a_default_build_that_fails_an_assert_is_rejected_and_the_tune_goes_on(capsys, tmp_path):
    program = scale_copy(tmp_path)
    # TN=768 does not divide N: the program's own assert says so, for the default build.
    program.write_text(program.read_text().replace("param TN = 512 in", "param TN = 768 in"))
    out = tmp_path / "t.json"
    code, stdout, stderr = tune(capsys, program, *TEST_HW, "--param", "TN=256,512,768", "--param", "SYNC=0",
                                "--out", out)
    assert code == 0, stderr
    record = json.loads(out.read_text())
    default = record["trials"][0]
    assert default["default"] and default["params"]["TN"] == 768 and default["status"] == "rejected"
    assert "tune_scale.mk:9:1" in default["reason"] and "TN must divide N" in default["reason"]
    assert {t["params"]["TN"]: t["status"] for t in record["trials"][1:]} == {256: "ok", 512: "ok"}
    assert "(the default was rejected)" in stdout


def test_a_searched_space_is_not_judged_by_its_first_variants_in_order(capsys, tmp_path):
    # The default fails an assert, and so do the first variants in order (FIRST=0, the
    # last param varying fastest): a search reaches the others, so the tune goes on.
    program = scale_copy(tmp_path)
    program.write_text(program.read_text().replace(
        "param N = 2048;", 'param N = 2048;\nparam FIRST = 0 in 0..7 "first";\n'
        'assert FIRST >= 1, "FIRST must be at least 1";\nparam OTHER = 0 in 0..7 "no effect";', 1))
    out = tmp_path / "t.json"
    code, stdout, stderr = tune(capsys, program, *TEST_HW, "--param", "FIRST", "--param", "OTHER",
                                "--budget", "5", "--out", out)
    assert code == 0, stderr
    record = json.loads(out.read_text())
    assert record["search"] == "optuna-tpe" and record["trials"][0]["status"] == "rejected"
    assert any(t["status"] == "ok" for t in record["trials"]) and "(the default was rejected)" in stdout


def test_an_error_every_variant_has_stops_the_tune_up_front_even_when_the_default_fails_first(capsys, tmp_path):
    program = scale_copy(tmp_path)
    text = program.read_text().replace("param TN = 512 in", "param TN = 768 in")
    program.write_text(text.replace("start copy(xv, y[", "start copy(undeclared, y["))
    out = tmp_path / "t.json"
    code, _, stderr = tune(capsys, program, *TEST_HW, "--param", "TN=256,512,768", "--param", "SYNC=0",
                           "--out", out)
    # Named by the error the variants have, not by the default's failed assert.
    assert code != 0 and "unknown name 'undeclared'" in stderr and "[0]" not in stderr and not out.exists()


def test_resuming_after_the_program_changed_is_refused(capsys, tmp_path):
    program = scale_copy(tmp_path)
    out = tmp_path / "t.json"
    argv = (program, *TEST_HW, "--param", "TN=256,512", "--param", "SYNC=0")
    assert tune(capsys, *argv, "--out", out)[0] == 0
    text = program.read_text()
    assert "xv = xv * 3.0;" in text
    program.write_text(text.replace("xv = xv * 3.0;", "xv = xv * 4.0;"))   # (SYNC=3's bits, not run here)
    code, _, stderr = tune(capsys, *argv, "--resume", out)
    assert code != 0
    assert "different version of tune_scale.mk" in stderr and "start a new tune or restore it" in stderr


def test_resuming_after_the_reference_or_the_hw_file_changed_is_refused(capsys, tmp_path):
    program = scale_copy(tmp_path)
    hw = tmp_path / "hw.toml"
    hw.write_text('extends = "test"\nname = "mine"\n')
    out = tmp_path / "t.json"
    argv = (program, "--hw", hw, "--mesh", "1", "--param", "TN=256,512", "--param", "SYNC=0")
    assert tune(capsys, *argv, "--out", out)[0] == 0
    assert tune(capsys, *argv, "--resume", out)[0] == 0          # unchanged: resumed
    ref = tmp_path / "tune_scale_ref.py"
    ref.write_text(ref.read_text() + "\n# edited\n")
    code, _, stderr = tune(capsys, *argv, "--resume", out)
    assert code != 0 and "different version of tune_scale.mk" in stderr
    assert tune(capsys, *argv, "--out", out)[0] == 0              # a new tune of the edited files
    hw.write_text('extends = "test"\nname = "mine"\n[core]\nvmem_bytes = 65536\n')
    code, _, stderr = tune(capsys, *argv, "--resume", out)
    assert code != 0 and "different hardware profile" in stderr


def resumed_after_editing(capsys, tmp_path, edit) -> tuple[int, str]:
    """Tune two variants, edit the record (`edit(record)`), resume from it: (exit, stderr)."""
    program = scale_copy(tmp_path)
    out = tmp_path / "t.json"
    argv = (program, *TEST_HW, "--param", "TN=256,512", "--param", "SYNC=0")
    assert tune(capsys, *argv, "--out", out)[0] == 0
    record = json.loads(out.read_text())
    edit(record)
    out.write_text(json.dumps(record))
    code, _, stderr = tune(capsys, *argv, "--resume", out)
    return code, stderr


def test_a_record_without_identity_is_resumed_as_before(capsys, tmp_path):
    code, stderr = resumed_after_editing(capsys, tmp_path, lambda record: record["settings"].pop("identity"))
    assert code == 0 and stderr.count("(from the record)") == 2


def test_an_ok_trial_without_a_report_is_a_bad_record(capsys, tmp_path):
    def drop_report(record):
        assert record["trials"][0]["status"] == "ok"
        record["trials"][0]["report"] = None

    code, stderr = resumed_after_editing(capsys, tmp_path, drop_report)
    assert code != 0 and 'bad tune record: an "ok" trial has no report' in stderr
    assert "TypeError" not in stderr


def _set_in_first(key: str, value, where: str = "report"):
    def edit(record):
        assert record["trials"][0]["status"] == "ok"
        trial = record["trials"][0]
        (trial[where] if where else trial)[key] = value
    return edit


@pytest.mark.parametrize("edit, says", [
    # (it won the tune: the record's own report said its bits were wrong)
    (_set_in_first("bit_exact", False), "an \"ok\" trial's report is not bit-exact"),
    (_set_in_first("cycles", -5), "its report's \"cycles\" is -5, not a whole number of cycles"),
    (_set_in_first("cycles", True), "its report's \"cycles\" is True, not a whole number of cycles"),
    (_set_in_first("wall_s", float("nan"), where=""), "its \"wall_s\" is nan, not a number of seconds"),
    # (an OverflowError traceback from the breakdown's float())
    (_set_in_first("seconds", 10**400), "its report cannot be read (OverflowError"),
])
def test_a_record_holding_figures_no_run_writes_is_a_bad_record(capsys, tmp_path, edit, says):
    code, stderr = resumed_after_editing(capsys, tmp_path, edit)
    assert code == 1 and "bad tune record: " + says in stderr and "Traceback" not in stderr, stderr


def test_a_record_with_a_number_past_pythons_digit_limit_is_not_a_tune_record(capsys, tmp_path):
    # (json.loads raised ValueError: a traceback)
    program = scale_copy(tmp_path)
    out = tmp_path / "t.json"
    argv = (program, *TEST_HW, "--param", "TN=256,512", "--param", "SYNC=0")
    assert tune(capsys, *argv, "--out", out)[0] == 0
    out.write_text(out.read_text().replace('"cycles": ', '"cycles": ' + "9" * 5000 + ", \"was\": ", 1))
    code, _, stderr = tune(capsys, *argv, "--resume", out)
    assert code == 1 and "not a tune record (a number of thousands of digits)" in stderr, stderr
