"""The tuner's test program (data/tune_scale.mk: tests/test_tune.py says what it
plants) and its reference, copied into a folder of a test's own, where a test may
edit them."""

from __future__ import annotations

import shutil
from pathlib import Path

DATA = Path(__file__).parent / "data"


def scale_copy(tmp_path: Path) -> Path:
    """The program and its reference in `tmp_path`; the program's path."""
    for name in ("tune_scale.mk", "tune_scale_ref.py"):
        shutil.copy(DATA / name, tmp_path / name)
    return tmp_path / "tune_scale.mk"
