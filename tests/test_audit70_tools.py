"""Regressions from helper-70's audit of the user-facing tools against docs/api.md,
docs/traces.md and docs/tuning.md: outputs never left half-written, paths of any
name, a tune resumable whatever its outputs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mkemu.cli import main

ROOT = Path(__file__).parent.parent
EXAMPLE = str(ROOT / "programs" / "examples" / "vector_add.s")
RUN = ["run", EXAMPLE, "--hw", "test", "--mesh", "1"]
K3 = ("k3_megakernel", "--model", "k3-tiny", "--prompt-len", "1", "--steps", "1")


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


@pytest.fixture
def trace_file(tmp_path, capsys) -> Path:
    path = tmp_path / "t.mkt"
    assert cli(capsys, *RUN, "--trace", path)[0] == 0
    return path


# ------------------------------------------------------------ atomic outputs


@pytest.mark.parametrize("flag", ["--perfetto", "--html"])
def test_an_export_interrupted_while_written_leaves_no_file_behind(capsys, tmp_path, trace_file, monkeypatch,
                                                                  flag):
    """docs/traces.md: outputs are written atomically. A Ctrl-C between writing the
    temporary file and renaming it left `.out.tmpPID` in the folder: a half-written file
    under another name, never cleaned up."""
    out = tmp_path / "export.out"

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    assert cli(capsys, "trace", trace_file, flag, out)[0] == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.mkt"]


def test_a_trace_write_interrupted_keeps_the_old_file_whole(capsys, tmp_path, trace_file, monkeypatch):
    """The old trace stays as it was and nothing else is left in its folder."""
    before = trace_file.read_bytes()

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    assert cli(capsys, *RUN, "--trace", trace_file)[0] == 130
    assert trace_file.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.mkt"]


# ------------------------------------------------------------ sweep: the base profile's path


def test_a_sweep_extends_a_profile_in_a_folder_named_with_an_emoji(capsys, tmp_path):
    """A sweep point's profile `extends` the base profile by its path. The path was
    written with json.dumps, which spells a character beyond U+FFFF as a surrogate
    pair: every point was "invalid TOML: Escaped character is not a Unicode scalar
    value" and nothing ran."""
    folder = tmp_path / "profiles \U0001F600 é"
    folder.mkdir()
    profile = folder / "mine\U0001F680.toml"
    profile.write_text('extends = "test"\nname = "mine"\n')
    out = folder / "sweep.json"
    code, stdout, err = cli(capsys, "sweep", EXAMPLE, "--hw", profile, "--hw-set", "clock_hz=1e9,2e9",
                            "--mesh", "1", "--out", out)
    assert code == 0, err
    record = json.loads(out.read_text())
    assert record["hw"] == str(profile)
    results = [p["results"][0] for p in record["points"]]
    assert [r["status"] for r in results] == ["ok", "ok"]
    # The points are the profile with its clock changed: twice the clock, fewer microseconds.
    assert results[1]["us_per_step"] < results[0]["us_per_step"]
    assert results[0]["report"]["hw"] == "mine\U0001F680 clock_hz=1e+09"


def test_a_sweep_of_a_profile_whose_path_is_not_utf8_is_one_error_naming_it(capfd, tmp_path):
    """A file name of bytes that are not UTF-8 cannot be written in TOML text: one line
    naming --hw and the file, before any run (not a TOML parser's complaint)."""
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/hw\xff"))
    try:
        folder.mkdir()
    except (OSError, UnicodeEncodeError):
        pytest.skip("this file system takes only UTF-8 names")
    profile = folder / "p.toml"
    profile.write_text('extends = "test"\n')
    # (capfd: the process's own stderr, which writes such a name escaped, as a terminal shows it)
    code = main(["sweep", EXAMPLE, "--hw", str(profile), "--hw-set", "clock_hz=1e9,2e9", "--mesh", "1"])
    err = capfd.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert "--hw: error: " in err and "not UTF-8" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------ tune --resume and its outputs


def test_a_tune_resumes_with_another_routing_record_or_none(capsys, tmp_path):
    """docs/tuning.md: `settings` are "what makes two tunes' trials interchangeable".
    They held the --record-routing path, an output: resuming the tune without it (or
    with another file) was refused as "the record is of another tune"."""
    record = tmp_path / "t.json"
    code, _, err = cli(capsys, "tune", *K3, "--param", "SCHEME=0,1", "--record-routing", tmp_path / "r.json",
                       "--out", record)
    assert code == 0, err
    first = json.loads(record.read_text())
    code, out, err = cli(capsys, "tune", *K3, "--param", "SCHEME=0,1", "--resume", record,
                         "--out", tmp_path / "again.json")
    assert code == 0, err
    again = json.loads((tmp_path / "again.json").read_text())
    assert all(t.get("resumed") for t in again["trials"])
    assert [t["objective"] for t in again["trials"]] == [t["objective"] for t in first["trials"]]
    # ... and with another routing file.
    code, _, err = cli(capsys, "tune", *K3, "--param", "SCHEME=0,1", "--resume", record,
                       "--record-routing", tmp_path / "other.json")
    assert code == 0, err
    # ... but a setting that changes the trials still makes it another tune's record.
    code, _, err = cli(capsys, "tune", *K3, "--param", "SCHEME=0,1", "--resume", record, "--batch", "2")
    assert code == 1 and "the record is of another tune: its driver is" in err


# ------------------------------------------------------------ plots of names with a dollar sign

DOLLARS = """
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem v: f32[8, 128];
    sem s;
    region "p$^$q" {
        start copy(x, v, s);
        wait copy(x, v, s);
    }
    start copy(v, y, s);
    wait copy(v, y, s);
}
host { input x: f32[8, 128]; output y: f32[8, 128]; launch k(x, y); }
"""


def test_a_timeline_plot_draws_a_region_named_with_dollar_signs(capsys, tmp_path):
    """matplotlib reads text between two `$` as a formula: `--plot` of a trace with a
    region named `p$^$q` ended in a mathtext ParseSyntaxException traceback."""
    pytest.importorskip("matplotlib")
    src, trace, png = tmp_path / "d.mk", tmp_path / "d.mkt", tmp_path / "d.png"
    src.write_text(DOLLARS)
    assert cli(capsys, "run", src, "--hw", "test", "--mesh", "1", "--trace", trace)[0] == 0
    code, _, err = cli(capsys, "trace", trace, "--plot", png)
    assert code == 0, err
    assert png.read_bytes().startswith(b"\x89PNG")


def test_a_sweep_plot_draws_a_program_named_with_dollar_signs(capsys, tmp_path):
    """The sweep's legend names each program by its file: `p$^$q.mk` crashed the plot
    after every run had finished."""
    pytest.importorskip("matplotlib")
    src, png = tmp_path / "p$^$q.mk", tmp_path / "sweep.png"
    src.write_text(DOLLARS)
    code, out, err = cli(capsys, "sweep", src, "--hw", "test", "--hw-set", "clock_hz=1e9,2e9", "--mesh", "1",
                         "--timing-only", "--plot", png)
    assert code == 0, err
    assert png.read_bytes().startswith(b"\x89PNG") and f"plot: {png}" in out
