"""A dtype generic or a dtype const converts as the dtype name it stands for:
`T(x)` is `f32(x)`, `bf16(x)` or `i32(x)` (docs/language.md, "Generics" and "Choosing
the dtype at compile time")."""

from __future__ import annotations

import numpy as np
import pytest

from mkemu.isa import numerics as nx
from tests.dsl.test_compiler import run, same
from tests.dsl.test_errors import errors

RNG = np.random.default_rng(7)

GENERIC = """
fn cast<T>(src: vmem f32[8, 128], dst: vmem T[8, 128]) { dst = T(src * 2.0); }

kernel k(x: hbm f32[8, 128], a: hbm bf16[8, 128], b: hbm f32[8, 128], c: hbm i32[8, 128]) {
    vmem xv: f32[8, 128];
    vmem av: bf16[8, 128];
    vmem bv: f32[8, 128];
    vmem cv: i32[8, 128];
    sem s;
    start copy(x, xv, s);
    wait copy(x, xv, s);
    cast(xv, av);
    cast(xv, bv);
    cast(xv, cv);
    start copy(av, a, s);
    start copy(bv, b, s);
    start copy(cv, c, s);
    wait copy(av, a, s);
    wait copy(bv, b, s);
    wait copy(cv, c, s);
}
"""


def test_a_dtype_generic_converts_like_the_dtype_it_is_bound_to():
    # (`T(src * 2.0)` was "unknown function 'T'")
    x = (RNG.standard_normal((8, 128)) * 100).astype(np.float32)
    outs, _, _ = run(GENERIC, {"x": x})
    twice = x * np.float32(2)
    same(nx.bf16_round(twice), outs["a"])
    same(twice, outs["b"])
    same(nx.f32_to_i32(twice), outs["c"])


CONST = """
param BF = 1 in {0, 1} "weights in bf16";
const WT = select(BF == 1, bf16, f32);
const IT = i32;
const K = IT(3) + 1;                  // a compile-time integer, as i32(3) + 1

kernel k(x: hbm f32[8, 128], y: hbm WT[8, 128], n: hbm i32[8, 128]) {
    vmem xv: f32[8, 128];
    vmem yv: WT[8, 128];
    vmem nv: i32[8, 128];
    sem s;
    start copy(x, xv, s);
    wait copy(x, xv, s);
    yv = WT(xv * f32(K));
    nv = IT(xv) + IT(K > 3) + IT(2.5);
    start copy(yv, y, s);
    start copy(nv, n, s);
    wait copy(yv, y, s);
    wait copy(nv, n, s);
}
"""


@pytest.mark.parametrize("bf", [0, 1])
def test_a_dtype_const_converts_like_the_dtype_it_names(bf):
    x = (RNG.standard_normal((8, 128)) * 100).astype(np.float32)
    outs, _, program = run(CONST, {"x": x}, params={"BF": bf})
    assert program.buffer("y").dtype == ("bf16" if bf else "f32")
    four = x * np.float32(4)
    same(nx.bf16_round(four) if bf else four, outs["y"])
    same(nx.f32_to_i32(x) + 1 + 2, outs["n"])


def test_a_dtype_that_has_no_conversion_or_used_as_a_value_is_an_error(tmp_path, monkeypatch):
    src = """\
param MX = 1 in {0, 1};
const WT = select(MX == 1, mxfp4, bf16);
fn f<T>(x: vmem T[8, 128]) { let t = T; }
kernel k() {
    vmem x: f32[8, 128];
    vmem w: bf16[8, 128];
    x = WT(x);
    f(w);
}
"""
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:3:38: error: 'T' names a dtype (bf16), not a value: use it as the dtype of a buffer (T[...]) "
        "(in fn 'f' inlined at prog.mk:8:5)\n"
        "  fn f<T>(x: vmem T[8, 128]) { let t = T; }\n"
        "                                       ^\n"
        "prog.mk:7:9: error: 'WT' is mxfp4 here, which has no conversion: mxfp4 holds matrix-unit weights "
        "(only copied, or the right operand of matmul)\n"
        "      x = WT(x);\n"
        "          ^^"
    )


def test_a_name_that_is_neither_a_function_nor_a_dtype_is_not_called(tmp_path, monkeypatch):
    src = "const N = 3;\nkernel k() {\n    vmem x: f32[8, 128];\n    x = N(x);\n}\n"
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:4:9: error: 'N' is a const, not a function\n"
        "      x = N(x);\n"
        "          ^"
    )
