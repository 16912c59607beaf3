"""Regressions found by fuzzing the day's compiler changes (float literals rounded from
their decimal text, f32 folding, T(x) conversions, reserved names, SMEM selects, launch
views, run-time semaphore indices).

- A float literal with more digits than Python's int() accepts from a string (4,300) or
  an exponent as long crashed the compiler with a ValueError traceback, from the exact
  rounding of its decimal text. It is rounded exactly (a sticky digit stands for the
  digits past the 200th, more than any float32 midpoint has), and one past the range is
  the usual located error.
"""

from __future__ import annotations

import numpy as np
import pytest

import mkemu
from mkemu.dsl.folding import decimal_f32
from mkemu.errors import SourceError

KERNEL = """\
kernel k(a: hbm f32[8, 128], y: hbm f32[8, 128]) {{ vmem v: f32[8, 128]; sem s;
    start copy(a, v, s); wait copy(a, v, s);
    v = v * 0.0 + {literal};
    start copy(v, y, s); wait copy(v, y, s); }}
host {{ input a: f32[8, 128]; output y: f32[8, 128]; launch k(a, y); }}
"""


def run_literal(literal: str) -> np.float32:
    kernel = mkemu.compile_source(KERNEL.format(literal=literal), filename="prog.mk", hw="test", mesh="1")
    return np.float32(kernel({"a": np.ones((8, 128), np.float32)}).outputs["y@0"][0, 0])


# (literal, the float32 it is): each used to raise ValueError (int() of over 4,300 digits)
LONG_LITERALS = {
    "thousands of fraction digits": ("1." + "0" * 5000 + "1", np.float32(1.0)),
    "thousands of integer digits in range": ("1" + "0" * 30 + "." + "0" * 4400, np.float32(1e30)),
    "thousands of significant digits": ("0." + "3" * 4400, np.float32(1 / 3)),
    "a long exponent below the range": ("1.5e-" + "9" * 5000, np.float32(0.0)),
    "a long exponent of zeros": ("2.5e" + "0" * 5000 + "1", np.float32(25.0)),
}


@pytest.mark.parametrize("case", sorted(LONG_LITERALS))
def test_a_float_literal_of_thousands_of_digits_compiles_to_its_float32(case):
    literal, expected = LONG_LITERALS[case]
    got = run_literal(literal)
    assert got.view(np.uint32) == expected.view(np.uint32), (got, expected)


def test_a_long_literal_past_the_range_is_the_located_error():
    literal = "3.5e" + "0" * 4999 + "38"
    with pytest.raises(SourceError) as info:
        mkemu.compile_source(KERNEL.format(literal=literal), filename="prog.mk", hw="test", mesh="1")
    text = info.value.render()
    shown = f"{literal[:20]}...{literal[-12:]}"     # (not all 5,005 characters)
    assert text.startswith(f"prog.mk:3:19: error: float literal {shown} is beyond the f32 range"), text[:200]
    assert "^" in text


@pytest.mark.parametrize("digits", [60, 250, 700])
def test_long_decimals_round_exactly_at_float32_midpoints(digits):
    # The midpoint between 1.0 and the next float32 rounds to even (1.0); a 1 in the last
    # of many digits past it rounds up; a digit past the 200 kept still counts.
    mid = "1.000000059604644775390625"
    up = np.nextafter(np.float32(1.0), np.float32(2.0))
    assert decimal_f32(mid + "0" * digits) == 1.0
    assert np.float32(decimal_f32(mid + "0" * digits + "1")) == up
    assert np.float32(decimal_f32("1.000000059604644775390624" + "9" * digits)) == 1.0


# -- 'const inside a block' ------------------------------------------------------------
# A top-level declaration after a statement that a top-level item may also end (an
# `assert ...;`, a nested block's `}`) was lexed as the keyword and reported as
# "unexpected 'const'; expected one of: '}', a statement", not as the message the same
# mistake gets after any other statement.

IN_BLOCK = {
    "after a nested block": ("kernel k() { if true { } const X = 1; }", 1, 26, "const"),
    "after an assert": ("kernel k() { assert true, \"x\"; fn g() {} }", 1, 32, "fn"),
    "in a host loop's block": ("host { for i in 0..2 { } kernel q() {} }", 1, 26, "kernel"),
    "after if/else in an fn": ("fn f() { if true { } else { } struct S { a: sem; } }", 1, 31, "struct"),
    "after an assert, a string holding '}'": ("fn f() { assert true, \"}\"; param P = 1; }", 1, 28, "param"),
}


@pytest.mark.parametrize("case", sorted(IN_BLOCK))
def test_a_declaration_inside_a_block_is_told_so_after_any_statement(case):
    source, line, column, word = IN_BLOCK[case]
    with pytest.raises(SourceError) as info:
        mkemu.compile_source(source, filename="prog.mk", hw="test", mesh="1")
    first = info.value.render().splitlines()
    assert first[0] == (f"prog.mk:{line}:{column}: error: '{word}' declarations belong at the top level of a "
                        "file, not inside a block"), first
    assert first[2] == " " * (column + 1) + "^" * len(word)


def test_a_call_of_a_binding_in_error_adds_no_second_error():
    # `let FT2 = FT;` (a dtype is no value) is one error; calling FT2 said again that it
    # "is a let binding, not a function".
    src = KERNEL.format(literal="1.0").replace("    v = v", "    let FT2 = FT;\n    v = FT2(v);\n    v = v")
    with pytest.raises(SourceError) as info:
        mkemu.compile_source("const FT = f32;\n" + src, filename="prog.mk", hw="test", mesh="1")
    text = info.value.render()
    assert text.count("error:") == 1 and "'FT' names a dtype (f32), not a value" in text, text
