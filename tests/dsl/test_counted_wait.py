"""Counted waits (`wait n * copy(...)`) and bytes(): the example runs bit-exact on two
chips; misuse is a caret error."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.dsl.test_compiler import f32, run, same
from tests.dsl.test_errors import kernel_errors

DATA = Path(__file__).with_name("data")


def test_counted_waits_gather_rows_and_collect_every_chips_rows():
    x = f32(64, 512)
    idx = np.array([5, 63, 0, 17, 9, 0, 0, 0, 5], np.int32)   # the last entry: how many rows
    outs, _, _ = run((DATA / "counted_wait.mk").read_text(), {"x": x, "idx": idx}, mesh=(2, 1, 1), per_chip=True)
    rows = np.zeros((8, 512), np.float32)
    rows[:5] = x[idx[:5]] * np.float32(2.0)
    for chip in (0, 1):
        same(np.concatenate([rows, rows]), outs[f"y@{chip}"])


def test_a_count_of_copies_is_for_wait_only(tmp_path, monkeypatch):
    out = kernel_errors("start 2 * copy(a, x, s);\nwait copy(a, x, s) * copy(a, x, s);\nlet n = bytes(s);",
                        tmp_path, monkeypatch)
    assert out == (
        "prog.mk:5:11: error: start issues one copy; a count of copies (n * copy(...)) is for wait\n"
        "      start 2 * copy(a, x, s);\n"
        "            ^^^^^^^^^^^^^^^^^\n"
        "prog.mk:6:10: error: '*' of two DMAs: a count times one copy is what a wait takes\n"
        "      wait copy(a, x, s) * copy(a, x, s);\n"
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "prog.mk:7:19: error: bytes() takes a view or a copy, got a semaphore\n"
        "      let n = bytes(s);\n"
        "                    ^"
    )


def test_the_count_is_an_integer(tmp_path, monkeypatch):
    out = kernel_errors("start copy(a, x, s);\nwait (core_id() == 0) * copy(a, x, s);", tmp_path, monkeypatch)
    assert (
        "prog.mk:6:10: error: expected a count of copies, got a bool; convert it with i32(...) or choose with "
        "select(...)\n"
        "      wait (core_id() == 0) * copy(a, x, s);\n"
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^"
    ) in out
