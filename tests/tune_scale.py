"""The tuner's test program (data/tune_scale.mk: tests/test_tune.py says what it
plants) and its reference, copied into a folder of a test's own, where a test may
edit them; and `mkemu tune` run as the tests run it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mkemu.cli import main

DATA = Path(__file__).parent / "data"


def scale_copy(tmp_path: Path) -> Path:
    """The program and its reference in `tmp_path`; the program's path."""
    for name in ("tune_scale.mk", "tune_scale_ref.py"):
        shutil.copy(DATA / name, tmp_path / name)
    return tmp_path / "tune_scale.mk"


def run_tune(capsys, tmp_path: Path, *argv, out: str = "tune.json") -> tuple[int, str, str, dict]:
    """`mkemu tune ARGV --out tmp_path/out`: its exit status, stdout, stderr (never a
    traceback) and the record it wrote ({} if none)."""
    code = main(["tune", *argv, "--out", str(tmp_path / out)])
    stdout, stderr = capsys.readouterr()
    assert "Traceback" not in stdout + stderr
    path = tmp_path / out
    return code, stdout, stderr, json.loads(path.read_text()) if path.is_file() else {}
