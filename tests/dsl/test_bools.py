"""Booleans and select(): the flags example runs bit-exact; bools and integers do not mix
silently (every misuse is a caret error)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mkemu.dsl.frontend import load_program
from tests.dsl.test_compiler import f32, run, same
from tests.dsl.test_errors import errors, kernel_errors

DATA = Path(__file__).with_name("data")


def flags_expected(a: np.ndarray, n_blocks: int, negate_odd: bool) -> np.ndarray:
    out = a.copy()
    tn = a.shape[1] // n_blocks
    for j in range(n_blocks):
        k = 3 if j == n_blocks - 1 else 2
        if negate_odd and j % 2 == 1:
            k = -k
        out[:, j * tn:(j + 1) * tn] = a[:, j * tn:(j + 1) * tn] * np.float32(k)
    return out


def test_flags_example_runs_with_both_settings_of_its_compile_time_flag():
    text = (DATA / "flags.mk").read_text()
    a = f32(8, 1024)
    for split, blocks in ((1, 2), (0, 1)):
        outs, _, _ = run(text, {"a": a}, params={"SPLIT": split})
        same(flags_expected(a, blocks, True), outs["out"])


def test_runtime_select_of_scalars_and_bool_variables():
    body = """
    var acc: i32 = 0;
    var flip: bool = false;
    for i in 0..8 {
        flip = !flip;
        acc += select(flip && i < 6, i, 100);
        idx[i] = i32(flip);
    }
    idx[8] = acc;
    idx[9] = select(acc > 50, 1, 0);
    """
    text = f"""
kernel k(y: hbm i32[16]) {{
    smem idx: i32[16];
    sem s;
{body}
    start copy(idx, y, s);
    wait copy(idx, y, s);
}}
"""
    outs, _, _ = run(text, {})
    flips = [1, 0, 1, 0, 1, 0, 1, 0]
    acc = sum(i if f and i < 6 else 100 for i, f in zip(range(8), flips))
    assert outs["y"][:10].tolist() == flips + [acc, int(acc > 50)]


def test_compile_time_select_checks_only_the_chosen_side(tmp_path, monkeypatch):
    src = "const BIG = 0 == 1;\nconst N = select(BIG, 1 / 0, 4);\nassert N == 4;\n"
    (tmp_path / "p.mk").write_text(src)
    monkeypatch.chdir(tmp_path)
    assert load_program("p.mk").consts["N"] == 4


def test_if_needs_a_bool(tmp_path, monkeypatch):
    assert kernel_errors("let n = 3;\nif n { x = x * 2.0; }", tmp_path, monkeypatch) == (
        "prog.mk:6:8: error: expected a scalar condition (a bool), got an integer; compare it (e.g. x != 0)\n"
        "      if n { x = x * 2.0; }\n"
        "         ^"
    )


def test_arithmetic_on_a_bool(tmp_path, monkeypatch):
    assert kernel_errors("let n = 2 + (core_id() < 1);", tmp_path, monkeypatch) == (
        "prog.mk:5:13: error: '+' needs integers, got a bool; convert it with i32(...) or choose with select(...)\n"
        "      let n = 2 + (core_id() < 1);\n"
        "              ^^^^^^^^^^^^^^^^^^^"
    )


def test_logic_on_integers_and_mixed_comparison(tmp_path, monkeypatch):
    out = kernel_errors("let p = core_id() && true;\nlet b = (core_id() > 0) == 1;\nlet c = !core_id();",
                        tmp_path, monkeypatch)
    assert out == (
        "prog.mk:5:13: error: '&&' needs bools, got an integer; compare it (e.g. x != 0)\n"
        "      let p = core_id() && true;\n"
        "              ^^^^^^^^^^^^^^^^^\n"
        "prog.mk:6:13: error: '==' compares a bool with an integer; convert the bool with i32(...)\n"
        "      let b = (core_id() > 0) == 1;\n"
        "              ^^^^^^^^^^^^^^^^^^^^\n"
        "prog.mk:7:13: error: '!' needs a bool, got an integer; compare it (e.g. x == 0)\n"
        "      let c = !core_id();\n"
        "              ^^^^^^^^^^"
    )


def test_select_with_a_runtime_condition_picks_scalars_only(tmp_path, monkeypatch):
    out = kernel_errors("x = select(core_id() == 0, x, x * 2.0);\nlet n = select(core_id() == 0, 1, true);\n"
                        "let v = select(core_id() == 0, a, a[:, 0:128]);", tmp_path, monkeypatch)
    assert out == (
        "prog.mk:5:9: error: with a run-time condition, select() picks between two scalars or two views (for a "
        "copy), got a tile f32[8, 256] (for tiles use where(mask, a, b))\n"
        "      x = select(core_id() == 0, x, x * 2.0);\n"
        "          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "prog.mk:6:13: error: select() needs two values of one type, got a bool and an integer\n"
        "      let n = select(core_id() == 0, 1, true);\n"
        "              ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "prog.mk:7:13: error: select() between views needs one dtype and shape, got f32[8, 256] and f32[8, 128]\n"
        "      let v = select(core_id() == 0, a, a[:, 0:128]);\n"
        "              ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^"
    )


def test_bool_where_an_integer_is_needed_and_the_reverse(tmp_path, monkeypatch):
    src = ("const F = 3 > 2;\nparam P = 1 < 2;\nassert 4;\n"
           "kernel k(a: hbm f32[8, 128], n: bool) { vmem x: f32[8, 128];\n"
           "    x[0:F, :] = 0.0; }\n"
           "host { input a: f32[8, 128]; launch k(a, 1); }\n")
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:2:11: error: the value of param 'P' must be an integer (params are set from outside as "
        "integers), got a bool\n"
        "  param P = 1 < 2;\n"
        "            ^^^^^\n"
        "prog.mk:3:8: error: an assert condition must be a bool, got an integer; compare it (e.g. x != 0)\n"
        "  assert 4;\n"
        "         ^\n"
        "prog.mk:5:9: error: expected an integer slice end, got a bool; convert it with i32(...) or choose "
        "with select(...)\n"
        "      x[0:F, :] = 0.0; }\n"
        "          ^\n"
        "prog.mk:6:42: error: argument 'n' must be a compile-time bool, got a compile-time integer\n"
        "  host { input a: f32[8, 128]; launch k(a, 1); }\n"
        "                                           ^"
    )
