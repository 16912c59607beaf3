"""The `mkemu` command line: run (text and --json), asm, hw list/show, and clear errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from mkemu.cli import main
from mkemu.isa.asm import assemble, decode

EXAMPLE = str(Path(__file__).parent.parent / "programs" / "examples" / "vector_add.s")
RUN = ["run", EXAMPLE, "--hw", "test", "--mesh", "1"]


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_run_prints_a_summary(capsys):
    code, out, err = cli(capsys, *RUN)
    assert code == 0 and err == ""
    assert out.startswith("PASS: outputs bit-exact against vector_add_ref.py:reference")
    assert re.search(r"^cycles [\d,]+  \([\d.]+ us emulated\)$", out, re.M)
    assert re.search(r"^instructions \d+, DMAs 6, HBM bytes 24,576$", out, re.M)
    assert "unit busy cycles" in out


def test_run_json_has_the_documented_keys(capsys):
    code, out, _ = cli(capsys, *RUN, "--json")
    assert code == 0
    report = json.loads(out)
    for key in ("cycles", "seconds", "instructions", "unit_busy_cycles", "hbm_bytes", "bit_exact"):
        assert key in report, key
    assert report["bit_exact"] is True
    assert report["seconds"] == pytest.approx(report["cycles"] / 1e9)
    assert report["hbm_bytes"] == 24576 and report["chips"] == 1 and report["cores"] == 2
    assert set(report["unit_busy_cycles"]) >= {"scalar", "vld", "vst", "valu", "dma", "sync", "mxu0"}
    assert report["unit_busy_cycles"]["valu"] == 2


def test_run_json_says_whether_the_run_was_timing_only_for_a_plain_program_too(capsys):
    code, out, _ = cli(capsys, *RUN, "--json")
    assert code == 0 and json.loads(out)["timing_only"] is False
    code, out, _ = cli(capsys, *RUN, "--json", "--timing-only")
    assert code == 0 and json.loads(out)["timing_only"] is True


def test_run_options_change_the_run(capsys, tmp_path):
    _, out, _ = cli(capsys, *RUN, "--json")
    base = json.loads(out)
    _, out, _ = cli(capsys, *RUN, "--json", "--dma-order", "fifo", "--mesh", "2", "--seed", "4")
    other = json.loads(out)
    assert other["chips"] == 2 and other["bit_exact"] is True
    assert other["hbm_bytes"] == 2 * base["hbm_bytes"]


def test_run_with_inputs_file(capsys, tmp_path):
    a = np.arange(1024, dtype=np.float32).reshape(8, 128)
    np.savez(tmp_path / "in.npz", a=a, b=-a)
    code, out, _ = cli(capsys, *RUN, "--inputs", str(tmp_path / "in.npz"))
    assert code == 0 and out.startswith("PASS")
    np.savez(tmp_path / "bad.npz", nope=a)
    code, _, err = cli(capsys, *RUN, "--inputs", str(tmp_path / "bad.npz"))
    assert code == 1 and "no buffer named 'nope'" in err


def test_run_with_a_user_profile_extending_test(capsys, tmp_path):
    profile = tmp_path / "slow.toml"
    profile.write_text('extends = "test"\nname = "slow"\n[dma]\nstart_latency_cycles = 5000\n')
    _, out, _ = cli(capsys, *RUN, "--json")
    fast = json.loads(out)["cycles"]
    code, out, _ = cli(capsys, *RUN, "--json", "--hw", str(profile))
    assert code == 0
    assert json.loads(out)["cycles"] >= fast + 2 * (5000 - 10)


def test_asm_prints_address_encoding_and_disassembly(capsys):
    code, out, _ = cli(capsys, "asm", EXAMPLE)
    assert code == 0
    rows = re.findall(r"^  ([0-9a-f]{6}):  ([0-9a-f]{16})  (.+)$", out, re.M)
    program = assemble(Path(EXAMPLE).read_text(), EXAMPLE)
    code_words = program.kernels["main"].code
    assert len(rows) == len(code_words)
    for (addr, word, text), expected in zip(rows, code_words):
        assert int(word, 16) == int(expected)
        assert decode(int(word, 16))[0].mnemonic == text.split()[0]
    assert f"kernel main: {len(code_words)} instructions" in out
    assert re.search(r"^; .*vector_add\.s:\d+: vadd\.f32 v2, v0, v1$", out, re.M)


def test_asm_stats_and_output_file(capsys, tmp_path):
    code, out, _ = cli(capsys, "asm", EXAMPLE, "--stats", "-o", str(tmp_path / "l.txt"))
    assert code == 0 and out == ""
    text = (tmp_path / "l.txt").read_text()
    assert "statistics:" in text and "HBM 0x00000000 a f32[8x128] input" in text


def test_asm_stats_times_a_fresh_compile_not_the_compile_cache(capsys, monkeypatch):
    # (it timed the compile cache's lookup: 700 ms the first time, 19 ms after)
    import mkemu.cache

    def cached(*args):
        raise AssertionError("the compile cache was asked")

    cli(capsys, "asm", "vector_add")                    # (cached, if it was not already)
    monkeypatch.setattr(mkemu.cache, "cached_program", cached)
    code, out, _ = cli(capsys, "asm", "vector_add", "--stats")
    assert code == 0 and re.search(r"compile time: \d+\.\d ms", out)


def test_asm_params_lists_every_param(capsys, tmp_path):
    root = Path(__file__).parent.parent
    code, out, err = cli(capsys, "asm", str(root / "programs" / "examples" / "all_reduce.mk"), "--params",
                         "--set", "CL_SLOTS=4")
    assert code == 0 and err == ""
    head, *rows = out.splitlines()
    assert head.split() == ["NAME", "VALUE", "DEFAULT", "VALUES", "DESCRIPTION", "WHERE"]
    slots = next(r for r in rows if r.startswith("CL_SLOTS"))
    assert slots.split()[:7] == ["CL_SLOTS", "4", "2", "1,", "2,", "3,", "4"]
    assert "receive slots per ring direction" in slots
    library = root / "programs" / "lib" / "collectives.mk"
    line = 1 + library.read_text().splitlines().index(next(
        t for t in library.read_text().splitlines() if t.startswith("param CL_SLOTS")))
    assert slots.endswith(f"{library}:{line}")
    assert [r.split()[0] for r in rows] == ["CL_SLOTS", "CL_AG_SEMS", "CORES", "ROWS", "COLS"]
    assert next(r for r in rows if r.startswith("ROWS")).split()[1:4] == ["128", "128", "any"]
    code, _, err = cli(capsys, "asm", str(root / "programs" / "examples" / "all_reduce.mk"), "--params",
                       "--set", "CL_SLOTS=5")
    assert code == 1 and "CL_SLOTS = 5 (set from outside) is not one of its declared values: 1, 2, 3, 4" in err


def test_asm_reports_source_errors(capsys, tmp_path):
    path = tmp_path / "bad.s"
    path.write_text(".kernel k\n    vad.f32 v1, v2, v3\n    halt\n")
    code, _, err = cli(capsys, "asm", str(path))
    assert code == 1
    assert f"{path}:2:5: error: unknown instruction 'vad.f32' (did you mean 'vadd.f32'?)" in err
    assert "    ^" in err


def test_hw_list(capsys):
    code, out, _ = cli(capsys, "hw", "list")
    assert code == 0
    names = [line.split()[0] for line in out.splitlines()]
    assert {"test", "tpu-v7-like", "tpu-v5p-like"} <= set(names)


def test_hw_show(capsys):
    code, out, _ = cli(capsys, "hw", "show", "tpu-v7-like")
    assert code == 0
    assert out.startswith("profile tpu-v7-like")
    assert "HBM bandwidth" in out and "MXUs" in out


@pytest.mark.parametrize("argv", [["run", EXAMPLE, "--hw"], ["hw", "show"]])
def test_hw_errors(capsys, tmp_path, argv):
    missing = str(tmp_path / "missing.toml")
    code, _, err = cli(capsys, *argv, missing)
    assert code == 1
    assert err.startswith(f"{missing}: error: cannot read profile")


def test_bad_profile_contents_name_file_and_key(capsys, tmp_path):
    path = tmp_path / "typo.toml"
    path.write_text('extends = "test"\n[dma]\nstart_latncy_cycles = 3\n')
    code, _, err = cli(capsys, "run", EXAMPLE, "--hw", str(path))
    assert code == 1
    assert str(path) in err and "start_latncy_cycles" in err
    code, _, err = cli(capsys, "hw", "show", "no-such-chip")
    assert code == 1 and "no-such-chip" in err


def test_a_folder_named_like_a_shipped_program_does_not_hide_it(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vector_add").mkdir()
    (tmp_path / "mine").mkdir()
    code, out, _ = cli(capsys, "run", "vector_add", "--hw", "test", "--mesh", "1")
    assert code == 0 and out.startswith("PASS")
    code, _, err = cli(capsys, "run", "mine", "--hw", "test", "--mesh", "1")
    assert code == 1 and err.strip() == "mine: error: cannot read program: it is a directory"


def test_missing_program_and_usage(capsys):
    code, _, err = cli(capsys, "run", "/no/such/file.s", "--hw", "test")
    assert code == 1 and "/no/such/file.s: error: cannot read program" in err
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert not out and "usage: mkemu" in err          # (a usage error: nothing on stdout)


K3_TINY = ["--model", "k3-tiny", "--mesh", "1", "--prompt-len", "1", "--steps", "1"]


def test_compare_prints_every_program_side_by_side_with_the_speedups(capsys):
    programs = ["programs/k3_per_op.mk", "programs/k3_superop.mk", "programs/k3_megakernel.mk"]
    code, out, _ = cli(capsys, "compare", *programs, *K3_TINY, "--json")
    assert code == 0
    reports = json.loads(out)["reports"]
    assert [Path(r["program"]).name for r in reports] == [Path(p).name for p in programs]
    assert all(r["bit_exact"] is True for r in reports)
    assert reports[0]["tokens"] == reports[1]["tokens"] == reports[2]["tokens"]
    code, out, _ = cli(capsys, "compare", *programs, *K3_TINY)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["k3_per_op.mk", "k3_superop.mk", "k3_megakernel.mk"]
    rows = {line[:32].strip(): line[32:].split() for line in lines[1:]}
    assert rows["us per step"] == [f"{r['us_per_step']:.2f}" for r in reports]
    assert rows["kernels launched per step"] == [str(r["kernels_per_step"]) for r in reports]
    first = reports[0]["us_per_step"]
    assert rows["speedup (vs k3_per_op.mk)"] == [f"{first / r['us_per_step']:.2f}x" for r in reports]
    for label in ("HBM MB per step", "% of the floor reached", "% of the mesh floor reached",
                  "launch overhead (us)", "collectives (us)", "weight streaming (us)", "idle (us)",
                  "compute (us)"):
        assert len(rows[label]) == 3, label


def test_compare_tells_two_programs_of_one_name_apart(capsys, tmp_path):
    # (both columns read "vector_add.mk": which one failed its bits could not be told)
    source = Path(__file__).parent.parent / "programs" / "examples"
    for folder in ("base", "tuned"):
        (tmp_path / folder).mkdir()
        for name in ("vector_add.mk", "vector_add_ref.py"):
            (tmp_path / folder / name).write_text((source / name).read_text())
    code, out, _ = cli(capsys, "compare", str(tmp_path / "base" / "vector_add.mk"),
                       str(tmp_path / "tuned" / "vector_add.mk"), "--hw", "test")
    assert code == 0
    assert out.splitlines()[0].split() == ["base/vector_add.mk", "tuned/vector_add.mk"]
    assert "speedup (vs base/vector_add.mk)" in out


def test_compare_needs_at_least_two_programs(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["compare", "programs/k3_per_op.mk", *K3_TINY])
    assert exc.value.code == 2
    assert "the following arguments are required: PROGRAM" in capsys.readouterr().err


def test_compare_of_a_missing_program_is_one_clear_error(capsys):
    code, out, err = cli(capsys, "compare", "programs/k3_per_op.mk", "no/such.mk", *K3_TINY)
    assert code != 0 and out == ""
    assert err.strip() == "no/such.mk: error: cannot read program: No such file", "nothing runs first"


@pytest.mark.parametrize("name, content, message", [
    ("binary.mk", b"\xff\xfe\x00kernel", "binary.mk: error: cannot read program: it is not UTF-8 text (byte 0xff at offset 0)"),
    ("binary.s", b".kernel main\n\x80halt\n", "binary.s: error: cannot read program: it is not UTF-8 text (byte 0x80 at offset 13)"),
    ("imports.mk", b'import "binary.mk";\nkernel k() { }\nhost { launch k(); }\n',
     "imported file 'binary.mk' is not UTF-8 text (byte 0xff at offset 0)"),
])
def test_a_program_file_that_is_not_text_is_one_clear_error(capsys, tmp_path, monkeypatch, name, content, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "binary.mk").write_bytes(b"\xff\xfe\x00kernel")
    (tmp_path / name).write_bytes(content)
    for command in ("run", "asm"):
        assert main([command, name]) == 1
        out, err = capsys.readouterr()
        assert message in err and "Traceback" not in out + err


@pytest.mark.parametrize("argv, message", [
    (["--batch", "0"], "--batch: error: --batch must be 1..8, got 0"),
    (["--mesh", "0x2"], "bad mesh '0x2'"),
    (["--mesh=-2x1x1"], "bad mesh '-2x1x1'"),
    (["--max-instructions", "0"], "--max-instructions: error: --max-instructions must be an integer >= 1"),
    (["--max-cycles", "-1"], "--max-cycles: error: --max-cycles must be an integer >= 1, not -1"),
    (["--routing-skew", "-1"], "--routing-skew: error: --routing-skew must be a number >= 0, not -1.0"),
    (["--schedules", "-1"], "--schedules must be 0..1000"),
    (["--seed", "-1"], "--seed: error: --seed must be an integer >= 0, not -1"),
])
def test_bad_run_options_are_one_line_errors(capsys, argv, message):
    assert main(["run", "programs/k3_megakernel.mk", "--model", "k3-tiny", *argv]) == 1
    out, err = capsys.readouterr()
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in out + err


def test_schedules_report_every_adversarial_schedule(capsys):
    assert main(["run", "programs/examples/all_reduce.mk", "--mesh", "2x1x1", "--schedules", "3", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(s["schedule"], s["seed"], s["outcome"]) for s in report["schedules"]] == [
        ("late", 0, "same"), ("shuffle", 1, "same"), ("shuffle", 2, "same")]
    assert main(["run", "programs/examples/all_reduce.mk", "--mesh", "2x1x1", "--schedules", "2"]) == 0
    out = capsys.readouterr().out
    assert "schedules: 2 adversarial" in out and "late: same" in out and "shuffle seed 1: same" in out


def test_asm_output_to_a_device_writes_into_it_and_leaves_it_a_device(capsys):
    # Atomic writes go through a temporary file and a rename, which must not replace
    # /dev/null (or /dev/stdout, a FIFO) with a regular file.
    import stat

    code, out, err = cli(capsys, "asm", EXAMPLE, "--hw", "test", "-o", "/dev/null")
    assert code == 0 and out == ""
    assert stat.S_ISCHR(Path("/dev/null").stat().st_mode)


def test_a_directory_given_as_the_program_is_named_as_one(capsys, tmp_path):
    folder = tmp_path / "kernels.mk"
    folder.mkdir()
    code, out, err = cli(capsys, "run", str(folder))
    assert code == 1 and out == ""
    assert err.strip() == f"{folder}: error: cannot read program: it is a directory"


COPY = """\
reference "r.py:ref";
kernel k(a: hbm f32[8, 128], out: hbm f32[8, 128]) {
    vmem x: f32[8, 128];
    sem s;
    start copy(a, x, s);
    wait copy(a, x, s);
    start copy(x, out, s);
    wait copy(x, out, s);
}
"""


def test_a_reference_that_raises_is_an_error_naming_it_and_its_line(capsys, tmp_path):
    (tmp_path / "r.py").write_text("def ref(inputs, chips, cores_per_chip):\n"
                                   "    return {'out': missing_name}\n")
    (tmp_path / "p.mk").write_text(COPY)
    code, _, err = cli(capsys, "run", str(tmp_path / "p.mk"), "--hw", "test", "--mesh", "1x1x1")
    assert code == 1
    assert "reference function ref raised NameError: name 'missing_name' is not defined" in err, err
    assert f"(at {tmp_path / 'r.py'}:2)" in err, err


def test_a_program_in_error_is_reported_before_its_missing_reference(capsys, tmp_path):
    # The reference is loaded before compiling (a driver's params go into the build), but
    # a program that does not compile is reported as a compile error, with its caret.
    (tmp_path / "p.mk").write_text(COPY.replace("sem s;", "sem s").replace("r.py", "nope.py"))
    code, _, err = cli(capsys, "run", str(tmp_path / "p.mk"), "--hw", "test", "--mesh", "1x1x1")
    assert code == 1
    assert "p.mk:5:5: error: unexpected 'start'" in err, err
    (tmp_path / "p.mk").write_text(COPY.replace("r.py", "nope.py"))
    code, _, err = cli(capsys, "run", str(tmp_path / "p.mk"), "--hw", "test", "--mesh", "1x1x1")
    assert code == 1
    assert "p.mk:1:1: error: reference file 'nope.py' not found" in err and "^^^" in err, err


def test_outputs_written_after_a_run_are_checked_before_it(capsys, tmp_path):
    # A trace, a tune record or a sweep's files in a folder that does not exist (or a
    # directory given as the file) are errors before any run, not after it.
    missing = tmp_path / "nope" / "out"
    code, out, err = cli(capsys, *RUN, "--trace", str(missing) + ".mkt")
    assert code == 1 and "cannot write" in err and "does not exist" in err and not out, err
    code, _, err = cli(capsys, "tune", str(Path(__file__).parent.parent / "programs" / "examples"
                                           / "matmul_double_buffered.mk"), "--param", "TK=256",
                       "--out", str(missing) + ".json")
    assert code == 1 and "--out: error: cannot write" in err and "[1]" not in err, err
    code, _, err = cli(capsys, "sweep", EXAMPLE, "--hw", "test", "--hw-set", "clock_hz=1e9,2e9",
                       "--out", str(tmp_path))
    assert code == 1 and "is a directory, not a file to write" in err, err


def test_inputs_larger_than_the_host_can_hold_are_an_error_not_a_traceback(capsys, tmp_path):
    # 2^40 x 128 float32 (512 TiB) is past any host's address space: numpy refuses it at once.
    src = tmp_path / "huge.mk"
    src.write_text("kernel k(x: hbm f32[8, 128]) {\n    vmem a: f32[8, 128];\n    sem s;\n"
                   "    start copy(x, a, s);\n    wait copy(x, a, s);\n}\n"
                   "host {\n    input x: f32[8, 128];\n    input big: f32[1099511627776, 128];\n    launch k(x);\n}\n")
    hw = tmp_path / "huge-hbm.toml"     # (a chip whose HBM holds it, so the emulator does not refuse it first)
    hw.write_text('extends = "tpu-v7-like"\nname = "huge-hbm"\n[chip]\nhbm_bytes = 1125899906842624\n')
    assert main(["run", str(src), "--mesh", "1", "--hw", str(hw)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the host ran out of memory:") and "Traceback" not in err, err


def test_compare_of_timing_only_runs_says_nothing_was_computed(capsys):
    code, out, _ = cli(capsys, "compare", "k3_per_op", "k3_megakernel", "--model", "k3-tiny", "--steps", "1",
                       "--prompt-len", "1", "--timing-only")
    assert code == 0 and out.startswith("TIMING ONLY: nothing was computed")


def test_compare_records_the_routing_of_its_first_program(capsys, tmp_path, monkeypatch):
    # (each program's run rewrote it, the last one winning)
    import mkemu.run

    recorded = []
    execute = mkemu.run.execute

    def spy(file, options, **kwargs):
        recorded.append(options.record_routing)
        return execute(file, options, **kwargs)

    monkeypatch.setattr(mkemu.run, "execute", spy)
    record = tmp_path / "routing.json"
    code, _, _ = cli(capsys, "compare", "k3_per_op", "k3_megakernel", "--model", "k3-tiny", "--steps", "1",
                     "--prompt-len", "1", "--record-routing", str(record))
    assert code == 0 and recorded == [str(record), None] and record.exists()


@pytest.mark.parametrize("second, extra, message", [
    ("vector_add", (), "--model, --prompt-len, --steps apply only to programs run by a driver"),
    ("k3_per_op", ("--set", "GROT=3"), "error: GROT = 3"),
])
def test_compare_refuses_a_later_program_in_error_before_anything_runs(capsys, tmp_path, monkeypatch, second,
                                                                       extra, message):
    # (the first program ran, and wrote its routing record, before the second was compiled)
    import mkemu.api

    ran = []
    monkeypatch.setattr(mkemu.api.Kernel, "__call__", lambda self, *a, **k: ran.append(self))
    record = tmp_path / "routing.json"
    code, out, err = cli(capsys, "compare", "k3_megakernel", second, "--model", "k3-tiny", "--steps", "1",
                         "--prompt-len", "1", *extra, "--record-routing", str(record))
    assert code == 1 and out == "" and message in err and "Traceback" not in err
    assert ran == [] and not record.exists()


def test_schedules_of_a_timing_only_run_are_refused(capsys):
    # ("same" for every schedule, though no bits were compared)
    code, out, err = cli(capsys, "run", "k3_megakernel", "--model", "k3-tiny", "--steps", "1", "--prompt-len", "1",
                         "--timing-only", "--schedules", "2")
    assert code == 1 and out == "" and err.startswith("--schedules: error: --schedules compares each schedule's")


def test_compare_of_verify_steps_shows_the_accepted_tokens(capsys):
    # A verify step's own tokens/s counts steps, not tokens: what was accepted is the figure.
    args = ["k3_per_op", "k3_megakernel", *K3_TINY[:4], "--steps", "2", "--spec-rows", "4", "--accept", "2"]
    code, out, _ = cli(capsys, "compare", *args, "--json")
    assert code == 0
    reports = json.loads(out)["reports"]
    code, out, _ = cli(capsys, "compare", *args)
    assert code == 0
    rows = {line[:32].strip(): line[32:].split() for line in out.splitlines()[1:]}
    assert rows["accepted tokens per verify step"] == [f"{r['accepted_tokens_per_step']:.2f}" for r in reports]
    assert rows["accepted tokens/s"] == [f"{r['accepted_tokens_per_s']:.0f}" for r in reports]
    # tokens_per_s is then verify steps per second (docs/k3.md), and says so.
    assert rows["verify steps/s"] == [f"{r['tokens_per_s']:.0f}" for r in reports]
    assert "tokens/s per sequence" not in out
    code, out, _ = cli(capsys, "compare", "k3_per_op", "k3_megakernel", *K3_TINY)
    assert "accepted" not in out and "verify" not in out and "tokens/s per sequence" in out


def test_a_verify_step_run_counts_its_progress_in_tokens(capsys, monkeypatch):
    # How many verify steps a run takes depends on what each accepts: its progress line
    # counts the tokens generated (2 steps of 2 accepted tokens: tokens 2/4, then 4/4).
    import mkemu.cli

    monkeypatch.setattr(mkemu.cli._Progress, "QUIET_S", -1.0)
    code, _, err = cli(capsys, "run", "k3_megakernel", "--model", "k3-tiny", "--mesh", "1", "--prompt-len", "1",
                       "--steps", "4", "--spec-rows", "4", "--accept", "2")
    assert code == 0
    assert [line.split(":")[0] for line in err.splitlines() if line.startswith(("tokens", "step"))] \
        == ["tokens 2/4", "tokens 4/4"], err
    code, _, err = cli(capsys, "run", "k3_megakernel", *K3_TINY)
    assert code == 0 and err.startswith("step 1/1: "), err
    # A last step accepting more tokens than were asked for says so (it read "tokens 3/2").
    code, out, err = cli(capsys, "run", "k3_megakernel", "--model", "k3-tiny", "--mesh", "1", "--prompt-len", "1",
                         "--steps", "2", "--spec-rows", "4", "--accept", "3")
    assert code == 0
    assert [line.split(":")[0] for line in err.splitlines() if line.startswith("tokens")] == ["tokens 3 (2 asked)"]
    assert "prompt 1 tokens, 1 verify steps" in out     # (not "decode steps")


def test_plot_wants_a_png_name_before_anything_runs(capsys, tmp_path):
    trace = tmp_path / "t.mkt"
    assert main(["run", "vector_add", "--hw", "test", "--trace", str(trace)]) == 0
    capsys.readouterr()
    for argv in (["trace", str(trace), "--plot", str(tmp_path / "t.svg")],
                 ["sweep", "vector_add", "--hw", "test", "--mesh", "1,2", "--plot", str(tmp_path / "s.pdf")]):
        code, _, err = cli(capsys, *argv)
        assert code == 1 and "--plot: error: --plot writes a PNG image; name the file OUT.png" in err, err
        # (each command names its own other outputs: sweep has no --html or --perfetto)
        assert ("--perfetto" in err) == (argv[0] == "trace") and ("--out" in err) == (argv[0] == "sweep"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.mkt"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc (Linux)")
def test_an_output_folder_that_takes_no_files_is_refused_before_the_run(capsys):
    # (/proc refuses new files even to root, for whom the folder's mode says yes)
    code, out, err = cli(capsys, "run", "vector_add", "--hw", "test", "--trace", "/proc/run.mkt")
    assert code == 1 and "--trace: error: cannot write /proc/run.mkt: the folder /proc is not writable" in err
    assert "wall" not in out


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc (Linux), where no folder can be made")
def test_asm_and_trace_need_no_cache_folder(tmp_path, capsys):
    """Only compiled code needs the cache folder: with none writable, `mkemu asm` and
    `mkemu trace` still run, and `mkemu run` says what is missing in one line."""
    import os
    import subprocess
    import sys

    trace = tmp_path / "t.mkt"
    assert main(["run", "vector_add", "--hw", "test", "--trace", str(trace)]) == 0
    capsys.readouterr()
    temp = tmp_path / "tmp"
    temp.mkdir()
    (temp / f"mkemu-cache-{os.getuid()}").write_text("")    # the per-user fallback, blocked
    env = dict(os.environ, XDG_CACHE_HOME="/proc/no-cache", HOME="/proc/no-home", TMPDIR=str(temp))

    def mkemu(*argv):
        return subprocess.run([sys.executable, "-c", "import sys; from mkemu.cli import main; "
                               "sys.exit(main(sys.argv[1:]))", *argv], capture_output=True, text=True, env=env)

    assert mkemu("asm", "vector_add").returncode == 0
    assert mkemu("trace", str(trace), "--top", "1").returncode == 0
    ran = mkemu("run", "vector_add", "--hw", "test")
    assert ran.returncode == 1 and "no writable cache directory for mkemu" in ran.stderr
    assert "Traceback" not in ran.stderr


def test_a_huge_program_or_a_huge_line_gives_a_short_error(capsys, tmp_path):
    big = tmp_path / "big.mk"
    with open(big, "wb") as fh:
        fh.truncate(17 << 20)            # (sparse: nothing written)
    code, _, err = cli(capsys, "run", str(big))
    assert code == 1 and "is 17,825,792 bytes, and a .mk or .s program is text of at most 16 MiB" in err
    long = tmp_path / "long.mk"
    long.write_text("kernel k() {" + " " * 100_000 + "@ }\n")
    code, _, err = cli(capsys, "run", str(long))
    assert code == 1 and "long.mk:1:100013: error: unexpected '@'" in err, err
    assert len(err) < 1000 and "...   " in err           # the part around the error, its cut end marked
    caret_line = err.splitlines()[-1]
    assert err.splitlines()[-2][len(caret_line) - 1] == "@"   # the caret still under the '@'


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_under_the_standard_output_is_one_line(tmp_path):
    import subprocess
    import sys

    for argv in (["programs"], ["run", "vector_add", "--hw", "test", "--json"]):
        with open("/dev/full", "w") as full:
            done = subprocess.run([sys.executable, "-c", "import sys; from mkemu.cli import entry; sys.exit(entry())",
                                   *argv], stdout=full, stderr=subprocess.PIPE, text=True)
        assert done.returncode == 1 and done.stderr == (
            "error: cannot write the standard output: No space left on device\n"), done.stderr


def test_trace_diff_takes_its_options_before_the_traces_too(capsys, tmp_path):
    trace = tmp_path / "t.mkt"
    assert main(["run", "vector_add", "--hw", "test", "--trace", str(trace)]) == 0
    capsys.readouterr()
    code, out, _ = cli(capsys, "trace", "diff", "--json", "--chip", "0", str(trace), str(trace))
    assert code == 0 and json.loads(out)["emulated_cycles"]["delta"] == 0
    with pytest.raises(SystemExit) as info:
        main(["trace", "diff", "--json", str(trace), str(trace), "--bogus"])
    assert info.value.code == 2


def test_a_param_set_twice_to_different_values_is_an_error(capsys):
    code, _, err = cli(capsys, "run", "matmul_double_buffered", "--set", "TN=1024", "--set", "TN=512")
    assert code == 1 and err.strip() == "--set: error: TN is set twice, to 1024 and to 512: give one value"
    code, _, _ = cli(capsys, "run", "matmul_double_buffered", "--hw", "test", "--set", "TN=512", "--set", "TN=0x200")
    assert code == 0                                   # (the same value twice is one value)


def test_inputs_that_are_a_pipe_or_empty_are_refused_unread(capsys, tmp_path):
    import os

    fifo = tmp_path / "in.npz"
    os.mkfifo(fifo)                                     # (opened, it would block for a writer)
    code, _, err = cli(capsys, "run", "vector_add", "--inputs", str(fifo))
    assert code == 1 and "cannot read inputs: it is not a regular file (a directory, a device or a pipe)" in err
    code, _, err = cli(capsys, "run", "vector_add", "--inputs", "")
    assert code == 1 and err.strip() == "--inputs: error: wants the path of a file to read, got an empty one"
    code, _, err = cli(capsys, "trace", "")
    assert code == 1 and err.strip() == "PATH: error: wants the path of a trace to read, got an empty one"


def test_an_output_onto_a_profile_the_hw_profile_extends_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "base.toml").write_text('extends = "test"\nname = "mybase"\n[dma]\nstart_latency_cycles = 10\n')
    (tmp_path / "my.toml").write_text('extends = "base.toml"\nname = "my"\n')
    before = (tmp_path / "base.toml").read_bytes()
    for argv in (["run", "vector_add", "--hw", "my.toml", "--trace", "base.toml"],
                 ["tune", "matmul_double_buffered", "--hw", "my.toml", "--out", "base.toml"]):
        code, _, err = cli(capsys, *argv)
        assert code == 1 and "base.toml is a profile the --hw profile extends" in err, err
    assert (tmp_path / "base.toml").read_bytes() == before


def test_an_npz_input_saved_from_a_bfloat16_array_says_how_to_save_it(capsys, tmp_path):
    import ml_dtypes

    path = tmp_path / "in.npz"
    np.savez(path, a=np.ones((8, 1024), ml_dtypes.bfloat16), b=np.ones((8, 1024), np.float32))
    code, _, err = cli(capsys, "run", "vector_add", "--hw", "test", "--mesh", "1", "--inputs", str(path))
    assert code == 1 and err.strip().endswith("got an array of |V2, not numbers; a bfloat16 or float8 array saved "
                                              "with np.savez comes back as bytes without its type: save it as float32")


def test_an_npz_array_that_cannot_be_read_is_named(capsys, tmp_path):
    path = tmp_path / "in.npz"
    np.savez(path, a=np.ones((8, 1024), np.float32), b=np.array([1, "x"], dtype=object))
    code, _, err = cli(capsys, "run", "vector_add", "--hw", "test", "--mesh", "1", "--inputs", str(path))
    assert code == 1 and err.strip() == (f"{path}: b: error: cannot read inputs: Object arrays cannot be loaded "
                                         "when allow_pickle=False")


@pytest.mark.parametrize("argv, message", [
    (("--seed", "１"), "argument --seed: invalid int value: '１'"),
    (("--max-cycles", "٥٠٠"), "argument --max-cycles: invalid int value"),
    (("--routing-skew", "１.５"), "argument --routing-skew: invalid float value: '１.５'"),
    (("--set", "N=１０"), "--set wants NAME=INTEGER, got 'N=１０'"),
])
def test_integer_options_take_ascii_digits_only(capsys, argv, message):
    # (int() reads other scripts' digits: `--seed １` ran as seed 1, where `--mesh １` is an error)
    try:
        code = main(["run", "vector_add", "--hw", "test", "--mesh", "1", *argv])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code in (1, 2) and message in err and "Traceback" not in err


@pytest.mark.parametrize("argv, command", [
    (["run", "vector_add", "--bogus"], "run"),
    (["compare", "vector_add", "vector_add", "--trace", "x.mkt"], "compare"),
    (["hw", "show", "test", "extra"], "hw show"),
    (["trace", "diff", "a.mkt", "b.mkt", "--bogus"], "trace"),
])
def test_a_leftover_argument_shows_the_usage_of_its_command(capsys, argv, command):
    # (it showed the top level's, `usage: mkemu [-h] COMMAND ...`, naming no command)
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.startswith(f"usage: mkemu {command} ") and f"mkemu {command}: error: unrecognized arguments: " in err


def test_a_mesh_of_more_cores_than_the_emulator_takes_is_one_error_naming_the_mesh(capsys, tmp_path):
    # 1,024 chips and 16 cores per chip are each allowed; together they would exhaust the host.
    hw = tmp_path / "sixteen.toml"
    hw.write_text('extends = "tpu-v7-like"\nname = "sixteen"\n[chip]\ncores_per_chip = 16\n')
    assert main(["run", EXAMPLE, "--hw", str(hw), "--mesh", "16x16x4"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("--mesh: error: 1,024 chips of 16 cores (profile 'sixteen') are 16,384 cores") and \
        "Traceback" not in err, err
