"""What README.md (Commands), docs/api.md and docs/tuning.md promise, held to the letter:
the places where the code and the documents had parted."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import mkemu
from mkemu.cli import main

ROOT = Path(__file__).parents[1]
SCALE = str(Path(__file__).parent / "data" / "tune_scale.mk")
TEST = dict(hw="test", mesh="2")
A = np.arange(8 * 1024, dtype=np.float32).reshape(8, 1024)


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def one_line_error(capsys, argv, message: str) -> None:
    code, out, err = cli(capsys, *argv)
    assert code == 1 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------- docs/api.md: options


def test_a_trace_path_given_to_the_api_is_written(tmp_path):
    """`trace`: "record a trace: a path to write it to" (it was kept in memory only)."""
    path = tmp_path / "api.mkt"
    kernel = mkemu.compile("vector_add", **TEST, trace=str(path))
    run = kernel(a=A, b=A)
    assert path.is_file() and run.report.figures["trace"] == str(path)
    from mkemu.tools.trace_reader import read_trace

    assert read_trace(str(path)).end_cycle == run.report.cycles == run.report.trace.end_cycle
    assert main(["trace", str(path), "--json"]) == 0


def test_the_cli_trace_is_the_same_file_as_the_api_trace(tmp_path, capsys):
    api, cli_path = tmp_path / "api.mkt", tmp_path / "cli.mkt"
    mkemu.compile("vector_add", hw="test", mesh="1", trace=str(api))()
    code, out, _ = cli(capsys, "run", "vector_add", "--hw", "test", "--mesh", "1", "--trace", str(cli_path), "--json")
    assert code == 0 and json.loads(out)["trace"] == str(cli_path)
    assert api.read_bytes() == cli_path.read_bytes()


@pytest.mark.parametrize("changes, message", [
    ({"checks": None}, "checks must be a set of check names"),
    ({"checks": "races"}, "checks must be a set of check names"),
    ({"params": [("N", 1)]}, "params must be a dict NAME -> integer"),
    ({"check_layers": "yes"}, "check_layers must be True or False"),
    ({"timing_only": 1}, "timing_only must be True or False"),
    ({"routing": "r.bin", "routing_skew": 1.0}, "give one of them"),
])
def test_bad_option_values_are_config_errors(changes, message):
    """"unknown names and bad values are one-line mkemu.ConfigErrors" (some were TypeErrors
    or were taken as something else)."""
    with pytest.raises(mkemu.ConfigError, match=re.escape(message)):
        mkemu.Options(**changes)


def test_options_must_be_an_options_object():
    with pytest.raises(mkemu.ConfigError, match=re.escape("options must be an mkemu.Options")):
        mkemu.compile("vector_add", {"hw": "test"})
    assert mkemu.compile("vector_add", mkemu.Options(hw="test"), mesh="1").chips == 1


def test_compile_takes_a_path_or_a_name_and_compile_source_takes_text(tmp_path):
    kernel = mkemu.compile(ROOT / "programs" / "examples" / "vector_add.mk", hw="test", mesh="1")
    assert kernel().check() is None
    with pytest.raises(mkemu.ConfigError, match="program must be a file path or a shipped program's name"):
        mkemu.compile(3)
    with pytest.raises(mkemu.ConfigError, match=re.escape("compile_source takes the program's text (a str)")):
        mkemu.compile_source(b"kernel k() {}")


def test_routing_and_routing_skew_do_not_go_together(capsys):
    """README: `--timing-only [--routing FILE | --routing-skew S]` (the skew was ignored)."""
    one_line_error(capsys, ["run", "k3_megakernel", "--model", "k3-tiny", "--mesh", "1", "--timing-only",
                            "--routing", "r.bin", "--routing-skew", "1"],
                   "--routing-skew: error: --routing-skew, --routing: give one of them")


# ---------------------------------------------------------------- docs/api.md: calling


@pytest.mark.parametrize("given, key", [
    ({"a@1": A[:4]}, "a@1"),
    ({"a": A, "b@0": A, "b@1": A[:, :8]}, "b@1"),
])
def test_a_wrong_shape_names_the_key_it_was_given_under(given, key):
    """"an array of the wrong shape is an error naming the file and the key" (it named the
    buffer, not the `name@chip` key)."""
    kernel = mkemu.compile("vector_add", **TEST)
    with pytest.raises(mkemu.ConfigError) as exc:
        kernel(given)
    assert exc.value.key == key and "shape" in exc.value.message


def test_a_wrong_shape_in_an_inputs_file_names_the_file_and_the_key(capsys, tmp_path):
    np.savez(tmp_path / "in.npz", **{"a": A, "b@1": A[:4]})
    one_line_error(capsys, ["run", "vector_add", "--hw", "test", "--mesh", "2", "--inputs", str(tmp_path / "in.npz")],
                   f"{tmp_path / 'in.npz'}: b@1: error: buffer b: shape (4, 1024)")


@pytest.mark.parametrize("key", ["a@01", "a@+1", "a@ 1", "a@"])
def test_a_chip_that_is_not_a_plain_number_is_an_error(key):
    """A key `a@01` passed the check and was then never written: the buffer stayed zeros."""
    kernel = mkemu.compile("vector_add", **TEST)
    with pytest.raises(mkemu.ConfigError, match=re.escape("chip must be 0..1, written as a plain decimal number")):
        kernel({key: A})


def test_an_input_key_that_is_not_a_string_is_an_error():
    kernel = mkemu.compile("vector_add", **TEST)
    with pytest.raises(mkemu.ConfigError, match=re.escape("inputs are named by buffer")):
        kernel({1: A})


def test_output_and_check_name_a_chip_outside_the_mesh():
    kernel = mkemu.compile("vector_add", **TEST)
    run = kernel(a=A, b=A)
    np.testing.assert_array_equal(run.output("out", chip=np.int64(1)), A + A)
    for chip in (2, -1, "1"):
        with pytest.raises(mkemu.ConfigError, match=re.escape("chip must be 0..1")):
            run.output("out", chip=chip)
    for key in ("out@2", "out@x", "out@-1"):
        with pytest.raises(mkemu.ConfigError, match=re.escape("chip must be 0..1")):
            run.check({key: A + A})
    with pytest.raises(mkemu.ConfigError, match=re.escape("check() takes a dict of expected outputs")):
        run.check([A + A])
    assert run.check({"out@1": A + A}) is None and run.report.bit_exact is True


def test_a_bad_expected_output_given_to_check_is_named_by_its_key_not_the_reference():
    run = mkemu.compile("vector_add", **TEST)(a=A, b=A)
    with pytest.raises(mkemu.ConfigError) as caught:
        run.check({"zz@1": A})
    assert str(caught.value) == "zz@1: error: expected output 'zz' is not a buffer of the program"
    with pytest.raises(mkemu.ConfigError) as caught:
        run.check({"out": [[1.0], [1.0, 2.0]]})
    assert str(caught.value).startswith("out: error: expected output 'out' is not an array")


def test_a_reference_that_returns_no_dict_is_an_error_naming_it(tmp_path):
    (tmp_path / "ref.py").write_text("def reference(inputs, *, chips, cores_per_chip):\n    return None\n")
    source = (ROOT / "programs" / "examples" / "vector_add.mk").read_text()
    source = re.sub(r'reference "[^"]+";', 'reference "ref.py:reference";', source)
    kernel = mkemu.compile_source(source, filename=str(tmp_path / "va.mk"), hw="test", mesh="1")
    run = kernel()
    with pytest.raises(mkemu.ConfigError, match=re.escape("reference function reference returned NoneType, "
                                                          "not a dict of expected outputs")):
        run.check()


def test_a_timing_only_run_reads_no_float_buffer_but_says_so():
    kernel = mkemu.compile("vector_add", hw="test", mesh="1", timing_only=True)
    run = kernel()
    with pytest.raises(mkemu.ConfigError, match="holds no data in a timing-only run"):
        run.output("out")


def test_a_session_names_a_chip_outside_the_mesh():
    """`write(name, array, chip=None)`, `read(name, chip=0)`: chip -1 wrote the last chip."""
    session = mkemu.compile("vector_add", **TEST).session()
    for chip in (2, -1):
        with pytest.raises(mkemu.ConfigError, match=re.escape("buffer a: chip must be 0..1")):
            session.write("a", A, chip=chip)
        with pytest.raises(mkemu.ConfigError, match=re.escape("buffer a: chip must be 0..1")):
            session.read("a", chip=chip)
    session.write("a", A, chip=1)
    np.testing.assert_array_equal(session.read("a", 1), A)
    assert not session.read("a", 0).any()


def test_checking_a_driven_run_says_its_driver_checks():
    kernel = mkemu.compile("k3_megakernel", model="k3-tiny", mesh="1", prompt_len=1, steps=1)
    with pytest.raises(mkemu.ConfigError, match="run by its driver, which checks the outputs itself"):
        kernel.expected({})


# ---------------------------------------------------------------- README: commands


def test_compare_of_plain_programs_shows_the_speedups_over_the_first(capsys):
    """`mkemu compare A B [C ...]`: "programs side by side, speedups over the first"."""
    code, out, _ = cli(capsys, "compare", "vector_add", "vector_add.s", "--hw", "test", "--mesh", "1", "--json")
    assert code == 0
    cycles = [r["cycles"] for r in json.loads(out)["reports"]]
    code, out, _ = cli(capsys, "compare", "vector_add", "vector_add.s", "--hw", "test", "--mesh", "1")
    rows = {line[:32].strip(): line[32:].split() for line in out.splitlines()[1:]}
    assert rows["speedup (vs vector_add.mk)"] == ["1.00x", f"{cycles[0] / cycles[1]:.2f}x"]


def test_compare_takes_the_run_options_including_inputs(capsys, tmp_path):
    """`[same options]`: --inputs too, one file for every program."""
    np.savez(tmp_path / "in.npz", a=A[:, :128], b=-A[:, :128])
    code, out, _ = cli(capsys, "compare", "vector_add.s", "vector_add.s", "--hw", "test", "--mesh", "1",
                       "--inputs", str(tmp_path / "in.npz"), "--json")
    assert code == 0
    reports = json.loads(out)["reports"]
    assert all(r["bit_exact"] is True for r in reports)
    assert reports[0]["outputs_sha256"] == reports[1]["outputs_sha256"]
    code, out, _ = cli(capsys, "run", "vector_add.s", "--hw", "test", "--mesh", "1", "--json")
    assert json.loads(out)["outputs_sha256"] != reports[0]["outputs_sha256"], "the file's inputs were used"


I32_OUT = """
kernel k(x: hbm i32[8, 128], y: hbm i32[8, 128], z: hbm f32[8, 128]) {
    sem s;
    start copy(x, y, s); wait copy(x, y, s);     // (i32 to i32: bytes a timing-only run keeps)
}
host { input x: i32[8, 128]; output y: i32[8, 128]; output z: f32[8, 128]; launch k(x, y, z); }
"""


def test_a_timing_only_runs_outputs_hash_covers_the_outputs_it_keeps(capsys, tmp_path):
    """api.md: a timing-only run hashes the i32 outputs it keeps, and gives null when it
    keeps none (the hash of nothing would look like every other such run's)."""
    code, out, _ = cli(capsys, "run", "vector_add", "--hw", "test", "--mesh", "1", "--timing-only", "--json")
    assert code == 0 and json.loads(out)["outputs_sha256"] is None
    program = tmp_path / "i32.mk"
    program.write_text(I32_OUT)
    hashes = []
    for extra in ([], ["--timing-only"]):
        code, out, _ = cli(capsys, "run", str(program), "--hw", "test", "--mesh", "1", "--json", *extra)
        hashes.append(json.loads(out)["outputs_sha256"])
    assert None not in hashes and hashes[0] != hashes[1]      # (the data run hashes z too)


def test_api_md_names_every_figure_of_a_plain_run(capsys):
    """The table of a plain run's figures in docs/api.md names every key `mkemu run
    --json` prints (and only those), besides the paths and times the command adds."""
    text = (Path(__file__).parents[1] / "docs" / "api.md").read_text()
    table = text[text.index("| `cycles`, `seconds` |"):]
    table = table[:table.index("\n\n")]
    documented = {key for row in table.splitlines() for key in re.findall(r"`(\w+)`", row.split("|")[1])}
    code, out, _ = cli(capsys, "run", "all_reduce", "--hw", "test", "--mesh", "2", "--json")
    shown = set(json.loads(out)) - {"program", "reference", "compile_s", "wall_s"}
    assert code == 0 and shown == documented
    code, out, _ = cli(capsys, "run", "all_reduce", "--hw", "test", "--mesh", "2", "--json", "--timing-only")
    assert set(json.loads(out)) - {"program", "compile_s", "wall_s"} == documented


def test_an_empty_trace_window_is_an_error(capsys, tmp_path):
    trace = str(tmp_path / "t.mkt")
    assert main(["run", "vector_add", "--hw", "test", "--mesh", "1", "--trace", trace]) == 0
    capsys.readouterr()
    for argv in (["--from", "3000", "--to", "1000"], ["--from", "2000", "--to", "2000"]):
        one_line_error(capsys, ["trace", trace, *argv], "--to: error: --to")
        one_line_error(capsys, ["trace", "diff", trace, trace, *argv], "the window [from, to) is empty")
    assert main(["trace", trace, "--from", "1000", "--to", "2000"]) == 0


@pytest.mark.parametrize("command", ["hw", "model"])
def test_a_command_without_its_action_shows_its_own_usage(capsys, command):
    code, out, err = cli(capsys, command)
    assert code == 2 and f"usage: mkemu {command}" in err and "list" in err and "show" in err


# ---------------------------------------------------------------- docs/tuning.md


def test_a_param_given_twice_is_an_error(capsys, tmp_path):
    one_line_error(capsys, ["tune", SCALE, "--hw", "test", "--mesh", "1", "--param", "TN=256",
                            "--param", "TN=512", "--out", str(tmp_path / "t.json")],
                   "--param TN: error: --param TN is given twice")


@pytest.mark.parametrize("values, said", [("256,256", "256 is given twice"),
                                          ("256,0x100", "256 and 0x100 are one value given twice")])
def test_a_value_given_twice_in_one_param_is_an_error(capsys, tmp_path, values, said):
    # (it was dropped silently; a sweep's axis and a param's declaration refuse it too)
    one_line_error(capsys, ["tune", SCALE, "--hw", "test", "--mesh", "1", "--param", f"TN={values}",
                            "--out", str(tmp_path / "t.json")],
                   f"--param TN: error: {said}: each value is one point of the search")
    assert not (tmp_path / "t.json").exists()


def test_resume_refuses_a_record_run_with_another_instruction_limit(capsys, tmp_path):
    """settings: "what makes two tunes' trials interchangeable": with a lower
    --max-instructions every variant faults, so the record's trials are not this tune's."""
    record = tmp_path / "t.json"
    argv = ["tune", SCALE, "--hw", "test", "--mesh", "1", "--param", "TN=512,1024"]
    assert main([*argv, "--out", str(record)]) == 0
    capsys.readouterr()
    settings = json.loads(record.read_text())["settings"]
    assert settings["max_instructions"] == 50_000_000
    one_line_error(capsys, [*argv, "--resume", str(record), "--max-instructions", "10"],
                   "max_instructions: error: the record is of another tune: its max_instructions is 50000000, "
                   "this tune's is 10")
    # A record written before the setting existed ran with the default limit.
    doc = json.loads(record.read_text())
    del doc["settings"]["max_instructions"]
    record.write_text(json.dumps(doc))
    code, _, err = cli(capsys, *argv, "--resume", str(record))
    assert code == 0 and err.count("(from the record)") == 2


def test_a_profile_value_varied_twice_is_an_error(capsys, tmp_path):
    one_line_error(capsys, ["sweep", SCALE, "--hw", "test", "--hw-set", "chip.clock_hz=1e9",
                            "--hw-set", "clock_hz=2e9"],
                   "--hw-set: error: chip.clock_hz is varied twice")


def test_a_timing_only_sweep_reports_the_time_of_every_point(capsys, tmp_path):
    """`--timing-only` is for what is too big to compute, which is what a hardware sweep
    is for; every point was rejected as having "no reference"."""
    out = tmp_path / "sweep.json"
    code, stdout, _ = cli(capsys, "sweep", "k3_megakernel", "--model", "k3-tiny", "--prompt-len", "1", "--steps",
                          "1", "--timing-only", "--mesh", "1,2", "--out", str(out))
    assert code == 0 and "rejected" not in stdout
    points = json.loads(out.read_text())["points"]
    results = [r for p in points for r in p["results"]]
    assert [r["status"] for r in results] == ["ok", "ok"]
    assert all(r["us_per_step"] > 0 and r["report"]["timing_only"] is True for r in results)


def test_a_timing_only_tune_is_refused_before_any_run(capsys, tmp_path):
    one_line_error(capsys, ["tune", "k3_megakernel", "--model", "k3-tiny", "--timing-only", "--param", "WR_MAX",
                            "--out", str(tmp_path / "t.json")],
                   "--timing-only: error: a --timing-only run computes nothing")
    assert not (tmp_path / "t.json").exists()


def test_a_rejection_reason_says_error_once(capsys, tmp_path):
    out = tmp_path / "sweep.json"
    code, _, _ = cli(capsys, "sweep", SCALE, "--hw", "test", "--mesh", "1", "--model", "k3-tiny", "--out", str(out))
    assert code == 1
    reason = json.loads(out.read_text())["points"][0]["results"][0]["reason"]
    assert reason.count("error:") == 1 and "model: error: model applies only to programs run by a driver" in reason


@pytest.mark.parametrize("argv, message", [
    (["--from", "-100", "--to", "50"], "--from: error: --from must be 0 or more, not -100"),
    (["--to", "-1"], "--to: error: --to must be 0 or more, not -1"),
    (["--top", "-1"], "--top: error: --top must be 0 or more, not -1"),
])
def test_negative_trace_bounds_are_errors(capsys, tmp_path, argv, message):
    trace = str(tmp_path / "t.mkt")
    assert main(["run", "vector_add", "--hw", "test", "--mesh", "1", "--trace", trace]) == 0
    capsys.readouterr()
    one_line_error(capsys, ["trace", trace, *argv], message)


# ---------------------------------------------------------------- docs/api.md: inputs, files


@pytest.mark.parametrize("inputs", [[1, 2], 3, np.zeros((8, 1024), np.float32)])
def test_inputs_that_are_neither_a_dict_nor_a_path_are_config_errors(inputs):
    """"given as a dict, as keyword arguments, or as the path of a .npz file" (a list or a
    number was a TypeError traceback)."""
    kernel = mkemu.compile("vector_add", hw="test", mesh="1")
    with pytest.raises(mkemu.ConfigError, match=re.escape("inputs are a dict of arrays by buffer")):
        kernel(inputs)


def test_paths_are_taken_as_inputs_file_and_as_source_filename(tmp_path):
    np.savez(tmp_path / "in.npz", a=A, b=A)
    assert mkemu.compile("vector_add", hw="test", mesh="1")(tmp_path / "in.npz").check() is None
    source = (ROOT / "programs" / "examples" / "vector_add.mk").read_text()
    kernel = mkemu.compile_source(source, ROOT / "programs" / "examples" / "copy_of_vector_add.mk",
                                  hw="test", mesh="1")
    assert kernel(a=A, b=A).check() is None           # its reference found beside that path


def test_bf16_inputs_are_rounded_once_to_the_nearest_bf16():
    """"others are rounded to the nearest bf16, ties to even": a float64 (or a wide integer)
    was rounded to float32 first, which can land on a bf16 tie the value is not on."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    kernel = mkemu.compile("matmul_single_buffered", hw="test", mesh="1")
    x = np.zeros((8, 2048))
    x[0, :4] = [1 + 2**-8 + 2**-40, 1 + 2**-8 - 2**-40, 1 + 2**-8, -(1 + 2**-7 + 2**-8 + 2**-40)]
    x[1:] = np.random.default_rng(0).standard_normal((7, 2048)) * 2.0 ** np.linspace(-20, 20, 2048)
    got = kernel(x=x).inputs["x@0"]
    assert list(got[0, :4]) == [1 + 2**-7, 1, 1, -(1 + 2**-6)]
    want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    wide = np.zeros((8, 2048), np.int64)
    wide[0, :3] = [2**24 + 2**16 + 1, 2**24 + 2**16, 2**60 + 2**52 + 1]
    assert list(kernel(x=wide).inputs["x@0"][0, :3]) == [2**24 + 2**17, 2**24, 2**60 + 2**53]
    # A longdouble was rounded to float64 first, landing on the tie 1 + 2^-8 it is not on.
    if np.finfo(np.longdouble).nmant > 52:
        long = np.zeros((8, 2048), np.longdouble)
        long[0, :2] = [np.longdouble(1) + np.longdouble(2)**-8 + np.longdouble(2)**-60,
                       np.longdouble(1) + np.longdouble(2)**-8 - np.longdouble(2)**-60]
        assert list(kernel(x=long).inputs["x@0"][0, :2]) == [1 + 2**-7, 1]


def test_an_inputs_file_that_is_not_an_npz_says_so(capsys, tmp_path):
    """"one that cannot be read as an .npz" is an error naming the file (a text file was
    reported as pickled data that could be loaded with allow_pickle)."""
    bad = tmp_path / "in.npz"
    bad.write_text("a = 1\n")
    code, out, err = cli(capsys, "run", "vector_add", "--hw", "test", "--mesh", "1", "--inputs", str(bad))
    assert code == 1 and not out
    assert err.startswith(f"{bad}: error: inputs must be a .npz file") and "pickle" not in err, err


def test_files_written_after_a_run_are_named_by_their_flag_before_it(capsys, tmp_path):
    missing = str(tmp_path / "nope" / "out")
    one_line_error(capsys, ["run", "vector_add", "--hw", "test", "--mesh", "1", "--trace", ""],
                   "--trace: error: wants the path of a file to write")
    one_line_error(capsys, ["run", "vector_add", "--hw", "test", "--mesh", "1", "--trace", missing],
                   "--trace: error: cannot write")
    # A driver's routing record is checked before the run too (it was written, and failed, after it).
    one_line_error(capsys, ["run", "k3_megakernel", "--model", "k3-tiny", "--steps", "1", "--record-routing",
                            missing], "--record-routing: error: cannot write")
    kernel = mkemu.compile("k3_megakernel", model="k3-tiny", steps=1, record_routing=missing)
    with pytest.raises(mkemu.ConfigError, match="record_routing: error: cannot write"):
        kernel()


def test_a_buffer_named_by_a_non_string_is_a_config_error():
    """`output(name, chip=0)` / a session's `read` and `write`: "a buffer the program lacks is
    a ConfigError" (one named by a number raised a TypeError while the error was built), and
    `expected(inputs)` takes a dict."""
    kernel = mkemu.compile("vector_add", hw="test", mesh="1")
    run = kernel(a=A, b=A)
    for call in (lambda: run.output(3), lambda: kernel.session().read(3), lambda: kernel.session().write(3, A)):
        with pytest.raises(mkemu.ConfigError, match="no .*buffer 3"):
            call()
    with pytest.raises(mkemu.ConfigError, match=re.escape("expected() takes the inputs as a dict")):
        kernel.expected(None)


@pytest.mark.parametrize("command", [
    ["run", "vector_add"], ["asm", "vector_add"], ["tune", SCALE, "--param", "TN=512"],
    ["sweep", "vector_add", "--hw-set", "clock_hz=1e9"], ["sweep", "vector_add", "--mesh", "1"],
])
def test_an_unknown_profile_is_the_hw_flags_error_before_any_run(capsys, tmp_path, command):
    """`hw`: "a shipped name (mkemu hw list) or a TOML file". An unknown name named no flag;
    a sweep blamed its first --hw-set point, or ran and rejected every --mesh point."""
    one_line_error(capsys, [*command, "--hw", "nope", *(["--out", str(tmp_path / "o.json")]
                                                         if command[0] in ("tune", "sweep") else [])],
                   "--hw: error: unknown hardware profile 'nope'")
    with pytest.raises(mkemu.ConfigError, match="^hw: error: unknown hardware profile"):
        mkemu.compile("vector_add", hw="nope")
