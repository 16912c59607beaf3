"""Float constants (docs/language.md, "Tile expressions"): a literal is the float32
nearest its decimal value and one past float32's range is an error; constant float
expressions fold with the vector unit's f32 arithmetic, so they give the bits the same
operations give at run time (docs/numerics.md: IEEE binary32, one rounding per
operation, division by zero is +-inf or NaN)."""

from __future__ import annotations

import numpy as np
import pytest

from mkemu.isa.encoding import parse_f32_bits
from tests.dsl.test_compiler import copy_kernel, run, same
from tests.dsl.test_errors import errors, kernel_errors

F = np.float32


def bits(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


# -- literals


@pytest.mark.parametrize("literal", ["1e400", "3.5e38", "3.4028236e38"])
def test_a_float_literal_past_the_f32_range_is_an_error_naming_it(tmp_path, monkeypatch, literal):
    # (each was +inf without a word)
    assert kernel_errors(f"x = x * {literal};", tmp_path, monkeypatch) == (
        f"prog.mk:5:13: error: float literal {literal} is beyond the f32 range (the largest f32 is "
        "3.4028235e38); write inf for infinity\n"
        f"      x = x * {literal};\n"
        f"              {'^' * len(literal)}"
    )


def test_literals_past_the_range_are_each_reported_where_they_are(tmp_path, monkeypatch):
    # A negative one is `-` of a literal past the range; 2e38 * 2e38 is no error (the
    # product of two f32 values is inf, as at run time).
    assert kernel_errors("x = x * -1e39;\nx = x + (4e38 + 2e38 * 2e38);", tmp_path, monkeypatch) == (
        "prog.mk:5:14: error: float literal 1e39 is beyond the f32 range (the largest f32 is 3.4028235e38); "
        "write inf for infinity\n"
        "      x = x * -1e39;\n"
        "               ^^^^\n"
        "prog.mk:6:14: error: float literal 4e38 is beyond the f32 range (the largest f32 is 3.4028235e38); "
        "write inf for infinity\n"
        "      x = x + (4e38 + 2e38 * 2e38);\n"
        "               ^^^^"
    )


def test_an_integer_constant_past_the_f32_range_in_float_arithmetic_is_an_error(tmp_path, monkeypatch):
    out = kernel_errors("x = x * (1 << 128);\nx = x + f32(1 << 200);", tmp_path, monkeypatch)
    assert "prog.mk:5:14: error: the integer 340,282,366,920,938,463,463,374,607,431,768,211,456 is beyond " \
           "the f32 range (the largest f32 is 3.4028235e38)" in out
    assert "prog.mk:6:17: error: the integer 1,606,938,044,258,990,275,541,962,092,341,162,602,522,202,993,782," \
           "792,835,301,376 is beyond the f32 range" in out


# A literal is rounded once from its exact decimal value, as the assembler rounds a
# float32 immediate: the largest f32 written as usual, a decimal just above a midpoint
# (through float64 it lands on the midpoint and rounds down), subnormals and underflow.
LITERALS = ["3.4028235e38", "3.4028235677973366e38", "1.0000000596046448", "1.000000059604644775390625",
            "7.1e-46", "1e-46", "1e-45", "0.1", "1e-5", "16777217.0"]


def test_a_literal_is_the_f32_nearest_its_exact_decimal_value():
    n = len(LITERALS)
    body = "\n    ".join(f"yv[{i}:{i + 1}, :] = {text};" for i, text in enumerate(LITERALS))
    outs, _, _ = run(copy_kernel("k", "f32", (n, 128), body), {"x": np.zeros((n, 128), F)})
    want = np.array([parse_f32_bits(text) for text in LITERALS], np.uint32)   # the assembler's rounding
    assert (bits(outs["y"]) == want[:, None]).all()
    assert list(want[:6]) == [0x7F7FFFFF, 0x7F7FFFFF, 0x3F800001, 0x3F800000, 1, 0]


# -- folding


# A folded expression, the same operations at run time on operands a, b, c (read from
# x), and the operands. The first three differ from folding in float64 and rounding once.
FOLDS = [
    ("0.1 + 0.2 - 0.3", "{a} + {b} - {c}", (0.1, 0.2, 0.3)),                   # +0.0 (float64: 5.6e-17)
    ("16777216.0 + 1.0 + 1.0", "{a} + {b} + {b}", (16777216.0, 1.0, 0.0)),     # 2^24 (float64: 2^24 + 2)
    ("1e20 * 1e20 / 1e30", "{a} * {a} / {c}", (1e20, 0.0, 1e30)),             # inf (float64: 1e10)
    ("1.0 / 0.0", "{a} / {b}", (1.0, 0.0, 0.0)),                               # inf (was a compile error)
    ("-1.0 / 0.0", "{a} / {b}", (-1.0, 0.0, 0.0)),                             # -inf
    ("0.0 / 0.0", "{a} / {b}", (0.0, 0.0, 0.0)),                               # NaN
    ("1.0 / 3.0 * 3.0", "{a} / {b} * {b}", (1.0, 3.0, 0.0)),
    ("max(0.0 / 0.0, 1.0) + min(1.0, 0.0 / 0.0)", "max({b} / {b}, {a}) + min({a}, {b} / {b})",
     (1.0, 0.0, 0.0)),                                                          # NaN (f32_max, f32_min)
]


def test_constant_float_expressions_fold_to_the_run_time_bits():
    rows = len(FOLDS)
    x = np.zeros((rows, 128), F)
    lines = []
    for r, (folded, at_run_time, operands) in enumerate(FOLDS):
        x[r, :3] = operands
        cols = {name: f"xv[{r}:{r + 1}, {k}:{k + 1}]" for k, name in enumerate("abc")}
        lines.append(f"yv[{r}:{r + 1}, :] = {folded};")
        lines.append(f"zv[{r}:{r + 1}, :] = {at_run_time.format(**cols)};")
    body = "\n    ".join(lines)
    src = f"""
kernel k(x: hbm f32[{rows}, 128], y: hbm f32[{rows}, 128], z: hbm f32[{rows}, 128]) {{
    vmem xv: f32[{rows}, 128];
    vmem yv: f32[{rows}, 128];
    vmem zv: f32[{rows}, 128];
    sem s;
    start copy(x, xv, s);
    wait copy(x, xv, s);
    {body}
    start copy(yv, y, s);
    start copy(zv, z, s);
    wait copy(yv, y, s);
    wait copy(zv, z, s);
}}
"""
    outs, _, _ = run(src, {"x": x})
    same(outs["z"], outs["y"])   # folded == computed by the vector unit
    with np.errstate(all="ignore"):
        want = [F(0.1) + F(0.2) - F(0.3), F(16777216) + F(1) + F(1), F(1e20) * F(1e20) / F(1e30),
                F(np.inf), F(-np.inf), F(np.nan), F(1) / F(3) * F(3), F(np.nan)]
    same(np.repeat(np.array(want, F)[:, None], 128, axis=1), outs["y"])
    assert bits(outs["y"][0, 0]) == 0 and outs["y"][1, 0] == 2.0 ** 24 and np.isposinf(outs["y"][2, 0])


def test_an_integer_constant_in_float_arithmetic_is_rounded_once_to_f32():
    # 2^60 + 2^36 + 1 is just above the midpoint between two float32 values: through
    # float64 (2^60 + 2^36, a tie) it would round down to even.
    src = copy_kernel("k", "f32", (8, 128), "yv = f32((1 << 60) + (1 << 36) + 1); yv[1:2, :] = 0.0 + 16777217;")
    outs, _, _ = run(src, {"x": np.zeros((8, 128), F)})
    assert outs["y"][0, 0] == F(2.0 ** 60 + 2.0 ** 37) and outs["y"][1, 0] == F(16777216)


def test_a_float_constant_divided_by_zero_is_not_an_error_but_an_integer_one_is(tmp_path, monkeypatch):
    out = errors("const X = 1 / 0;\nkernel k(x: hbm f32[8, 128]) {\n    vmem xv: f32[8, 128];\n"
                 "    xv = xv * (1.0 / 0.0) + 1 / 0.0;\n}\n", tmp_path, monkeypatch)
    assert out == (
        "prog.mk:1:11: error: division by zero in a compile-time expression\n"
        "  const X = 1 / 0;\n"
        "            ^^^^^"
    )
