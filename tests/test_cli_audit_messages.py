"""Regressions from an audit of error messages: each names the flag, argument or file
that was wrong (not another one), says what is wrong with it, and stays one line with
a non-zero exit; and two cosmetic ones of `mkemu compare` and `mkemu run`."""

from __future__ import annotations

from pathlib import Path

import pytest

import mkemu
from mkemu.cli import main
from mkemu.runner import check_dump_folder, check_writable
from tests.test_cli_fuzz_regressions import cli, failed

EXAMPLES = Path(__file__).parent.parent / "programs" / "examples"
K3_TINY = ("k3_megakernel", "--model", "k3-tiny", "--mesh", "1", "--prompt-len", "1", "--steps", "1")


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "rr.json"
    path.write_text("{}")
    return path


def test_a_tune_resume_that_is_a_directory_names_resume(capsys, tmp_path):
    # (it said `--out: error:`, a flag not given: the record is written back to --resume)
    failed(capsys, "tune", "vector_add", "--hw", "test", "--mesh", "1", "--resume", str(tmp_path),
           naming=f"--resume: error: {tmp_path} is a directory, not a file to write")
    failed(capsys, "tune", "vector_add", "--hw", "test", "--mesh", "1", "--resume", str(tmp_path),
           "--out", str(tmp_path), naming=f"--out: error: {tmp_path} is a directory")


def test_trace_without_arguments_asks_only_for_what_its_usage_shows(capsys):
    # (a hidden positional of `trace diff A B` was listed too: "required: PATH, B")
    with pytest.raises(SystemExit) as exit_:
        main(["trace"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.splitlines()[-1] == "mkemu trace: error: the following arguments are required: PATH"


@pytest.mark.parametrize("flag", ["--trace", "--record-routing"])
def test_an_output_under_a_file_names_the_file_not_a_missing_folder(capsys, a_file, flag):
    # (`rr.json/../x` said "the folder rr.json/.. does not exist")
    for path in (f"{a_file}/../x.out", f"{a_file}/sub/x.out", f"{a_file}/x.out"):
        failed(capsys, "run", *K3_TINY, flag, path, naming=f"{flag}: error: cannot write {path}: {a_file} is a file, "
                                                          "not a folder")


def test_every_output_flag_shares_the_check(capsys, tmp_path, a_file):
    path = f"{a_file}/../o.json"
    naming = f"cannot write {path}: {a_file} is a file, not a folder"
    failed(capsys, "tune", "vector_add", "--hw", "test", "--mesh", "1", "--out", path, naming=f"--out: error: {naming}")
    failed(capsys, "sweep", "vector_add", "--hw", "test", "--mesh", "1", "--out", path,
           naming=f"--out: error: {naming}")
    failed(capsys, "asm", "vector_add", "-o", path, naming=f"-o: error: {naming}")
    with pytest.raises(mkemu.ConfigError, match=f"^trace: error: {naming}"):
        check_writable(path, "trace")
    with pytest.raises(mkemu.ConfigError, match="the folder .*missing does not exist"):
        check_writable(str(tmp_path / "missing" / "x.json"), "trace")   # (a folder that is just not there)


def test_a_dump_into_a_file_says_it_is_a_file(capsys, a_file):
    # (it said "cannot create dump directory: File exists")
    failed(capsys, "run", *K3_TINY, "--dump", str(a_file),
           naming=f"--dump: error: {a_file} is a file, not a folder to dump into")
    with pytest.raises(mkemu.ConfigError, match=f"^{a_file}/../sub: error: cannot create dump directory: "
                                                f"{a_file} is a file, not a folder$"):
        check_dump_folder(f"{a_file}/../sub", "dump")
    check_dump_folder(str(a_file.parent / "new" / "sub"), "dump")   # made by the run: not an error


@pytest.mark.parametrize("command, naming", [
    (("model", "show", "nosuch"), "model show: error: unknown model 'nosuch'. Known models: k3-full, "),
    (("hw", "show", "nosuch"), "hw show: error: unknown hardware profile 'nosuch'. Known profiles: test, "),
])
def test_show_of_an_unknown_name_names_the_command_not_a_flag_it_lacks(capsys, command, naming):
    # (`model show` said `--model: error:`; `hw show` a bare `error:`)
    err = failed(capsys, *command, naming=naming)
    assert err.startswith(naming)


def test_an_unknown_profile_section_is_a_sentence_then_the_known_ones(capsys, tmp_path):
    profile = Path(__file__).parent.parent / "isa" / "profiles" / "test.toml"
    path = tmp_path / "p.toml"
    path.write_text(profile.read_text() + "\n[bogus]\nx = 1\n")
    failed(capsys, "hw", "show", str(path), naming=f"{path}: bogus: error: unknown key 'bogus'; known sections: "
                                                   "chip, core, dma, ici, mesh, launch, timing")
    path.write_text(profile.read_text() + "\n[chp]\nx = 1\n")
    failed(capsys, "hw", "show", str(path), naming="unknown key 'chp' (did you mean 'chip'?); known sections: chip,")


def test_a_program_path_with_a_nul_is_said_as_the_other_path_options_say_it():
    with pytest.raises(mkemu.ConfigError, match=r"^program: error: program must be a path or a name, and no path "
                                                r"holds a NUL character: 'a\\x00b.mk'$"):
        mkemu.compile("a\0b.mk")
    with pytest.raises(mkemu.ConfigError, match="no path holds a NUL character"):
        mkemu.atomic_write("a\0b", b"")


def test_compare_lays_the_speedup_row_out_under_its_columns(capsys):
    # (the label column was 32 wide: a longer "speedup (vs NAME)" pushed its row right)
    code, out, _ = cli(capsys, "compare", str(EXAMPLES / "vector_add.mk"), str(EXAMPLES / "vector_add.s"),
                       "--hw", "test", "--mesh", "1", "--timing-only")
    assert code == 0
    short = out.splitlines()[1:]
    code, out, _ = cli(capsys, "compare", "matmul_single_buffered", "matmul_double_buffered", "--hw", "test",
                       "--mesh", "1")
    assert code == 0
    lines = out.splitlines()
    assert lines[-1].startswith("speedup (vs matmul_single_buffered.mk) ")
    assert len({len(line) for line in lines}) == 1   # every row ends under its columns
    assert len({len(line) for line in short}) == 1 and short[-1].startswith("speedup (vs vector_add.mk)" + " " * 6)


def test_a_run_with_no_launch_says_no_unit_was_busy(capsys, tmp_path):
    program = tmp_path / "nolaunch.mk"
    program.write_text("kernel k(x: hbm f32[8, 128]) {\n    sem s;\n}\nhost {\n    input x: f32[8, 128];\n}\n")
    code, out, _ = cli(capsys, "run", str(program), "--hw", "test", "--mesh", "1")
    assert code == 0
    assert "unit busy cycles (all cores): none\n" in out and "stall cycles (all cores): none\n" in out


# A program that imports a file and names a reference file next to it.
IMPORTING = """\
import "lib.mk";
reference "ref.py:reference";
kernel va(a: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem x: f32[8, 128];
    sem s;
    start copy(a, x, s);
    wait copy(a, x, s);
    x = x * f32(Q);
    start copy(x, y, s);
    wait copy(x, y, s);
}
"""


@pytest.mark.parametrize("argv, flag, victim", [
    (("tune", "--param", "Q"), "--out", "ref.py"),
    (("tune", "--param", "Q"), "--out", "lib.mk"),
    (("sweep", "--hw-set", "clock_hz=1e9,2e9"), "--out", "lib.mk"),
    (("run",), "--trace", "lib.mk"),
])
def test_no_output_replaces_a_file_the_program_imports_or_names_as_its_reference(capsys, tmp_path, argv, flag, victim):
    # (tune's record replaced ref.py after the first trial, so every later variant was
    # rejected and the default "won"; sweep's record replaced an import)
    (tmp_path / "lib.mk").write_text('param Q = 1 in {1, 2} "a factor";\n')
    (tmp_path / "ref.py").write_text("def reference(a, **_):\n    return {'y': a}\n")
    program = tmp_path / "va.mk"
    program.write_text(IMPORTING)
    before = (tmp_path / victim).read_text()
    command, *rest = argv
    failed(capsys, command, str(program), *rest, "--hw", "test", "--mesh", "1", flag, str(tmp_path / victim),
           naming=f"{flag}: error: {tmp_path / victim} is read by va.mk; write {flag} to another file")
    assert (tmp_path / victim).read_text() == before


def test_a_rejection_reason_is_one_line_when_the_compile_error_has_notes():
    from mkemu.errors import Diagnostic, SourceError, SourceSpan
    from mkemu.trials import rejection

    error = SourceError([Diagnostic(SourceSpan("p.mk", 3, 5), "kernel 'k' needs 9 bytes\nthis buffer brings it to 9")])
    assert rejection(error) == "compile error: p.mk:3:5: kernel 'k' needs 9 bytes; this buffer brings it to 9"


@pytest.mark.parametrize("argv, message", [
    (["run", "vector_add", "--hw", "test", "--mesh", "-2x1x1"], "--mesh: error: bad mesh '-2x1x1'"),
    (["sweep", "vector_add", "--hw", "test", "--mesh", "-2x1x1"], "--mesh: error: bad mesh '-2x1x1'"),
    (["run", "vector_add", "--hw", "test", "--seed", "-5"], "--seed: error: --seed must be an integer >= 0"),
    (["run", "vector_add", "--hw", "-test"], "--hw: error: unknown hardware profile '-test'"),
    (["run", "vector_add", "--hw", "test", "--set", "-N=1"], "--set: error: --set wants NAME=INTEGER, got '-N=1'"),
    (["run", "k3_megakernel", "--model", "-k3-tiny"], "--model: error: unknown model '-k3-tiny'"),
])
def test_a_value_that_starts_with_a_dash_is_the_option_s_own_one_line_error(capsys, argv, message):
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert err.strip().startswith(message) and len(err.strip().splitlines()) == 1 and "usage:" not in err, err
