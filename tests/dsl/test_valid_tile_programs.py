"""Valid tile programs as docs/language.md describes them, compiled and run through the
public API (`mkemu.compile_source`) and checked bit for bit against numpy written from
docs/numerics.md."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mkemu
from mkemu.isa import numerics as nx
from tests.dsl.test_compiler import same

RNG = np.random.default_rng(7)


def kernel(ins, outs, body, decls=""):
    """A kernel copying each input `n` into VMEM `nv`, running `body`, copying each `nv` out."""
    def dims(shape):
        return ", ".join(map(str, shape))

    params = ", ".join(f"{n}: hbm {d}[{dims(s)}]" for n, d, s in ins + outs)
    vmem = "\n".join(f"    vmem {n}v: {d}[{dims(s)}];" for n, d, s in ins + outs)
    cin = "\n".join(f"    start copy({n}, {n}v, s);\n    wait copy({n}, {n}v, s);" for n, _, _ in ins)
    cout = "\n".join(f"    start copy({n}v, {n}, s);\n    wait copy({n}v, {n}, s);" for n, _, _ in outs)
    return f"kernel t({params}) {{\n{vmem}\n    sem s;\n{decls}\n{cin}\n{body}\n{cout}\n}}\n"


def run(text, **inputs):
    k = mkemu.compile_source(text, "t.mk", hw="tpu-v7-like", mesh="1x1x1")
    return k(**inputs).output("y")


def bf16(*shape):
    return nx.bf16_round(RNG.standard_normal(shape).astype(np.float32))


def mm(a, w):
    a, w = np.asarray(a, np.float32), np.asarray(w, np.float32)
    return nx.mxu_matmul(np.zeros((a.shape[0], w.shape[1]), np.float32), a, w)


def padded_tree(x, axis, op):
    """The kernel's reduction: padded with the identity to a power of two >= 128 lanes /
    8 rows, then the halving tree (docs/numerics.md, Reductions)."""
    n = x.shape[axis]
    p = max(128 if axis == 1 else 8, 1 << (n - 1).bit_length())
    ident = {"sum": 0.0, "max": -np.inf, "min": np.inf}[op]
    pad = [(0, 0), (0, 0)]
    pad[axis] = (0, p - n)
    xp = np.pad(x, pad, constant_values=ident).astype(np.float32)
    tree = {"sum": nx.tree_sum_f32, "max": nx.tree_max_f32, "min": nx.tree_min_f32}[op]
    return tree(xp, axis=axis, keepdims=True)


# -- matmul producing one column, read broadcast -----------------------------------------


@pytest.mark.parametrize("expr", ["matmul(av, wv[:, 0:1])", "matmul(av, wv[:, 5:6]) + 0.0",
                                  "matmul(av, wv) + matmul(av, wv[:, 0:1])"])
def test_matmul_with_one_column_broadcasts(expr):
    a, w = bf16(16, 256), bf16(256, 200)
    text = kernel([("a", "bf16", (16, 256)), ("w", "bf16", (256, 200))], [("y", "f32", (16, 200))],
                  f"    yv = {expr};")
    col = 5 if "5:6" in expr else 0
    expected = np.broadcast_to(mm(a, w[:, col:col + 1]), (16, 200))
    if "matmul(av, wv) +" in expr:
        expected = mm(a, w) + expected
    same(expected, run(text, a=a, w=w))


def test_let_of_one_column_matmul():
    a, w = bf16(8, 128), bf16(128, 128)
    text = kernel([("a", "bf16", (8, 128)), ("w", "bf16", (128, 128))], [("y", "f32", (8, 128))],
                  "    let p = matmul(av, wv[:, 7:8]);\n    yv = f32(wv[0:8, :]) * p;")
    same(w[0:8] * mm(a, w[:, 7:8]), run(text, a=a, w=w))


# -- transposes of masks --------------------------------------------------------------------


def test_transpose_of_a_column_mask():
    x = RNG.standard_normal((40, 200)).astype(np.float32)
    text = kernel([("x", "f32", (40, 200))], [("y", "f32", (1, 40))],
                  "    yv = where(transpose(xv[:, 0:1] > 0.0), 1.0, 2.0);")
    same(np.where(x[:, 0:1].T > 0, 1.0, 2.0).astype(np.float32), run(text, x=x))


def test_transpose_of_a_row_mask():
    x = RNG.standard_normal((40, 200)).astype(np.float32)
    text = kernel([("x", "f32", (40, 200))], [("y", "i32", (200, 1))],
                  "    let m = transpose(xv[3:4, :] > 0.0);\n    yv = i32(m) + i32(!m) * 5;")
    same(np.where(x[3:4].T > 0, 1, 5).astype(np.int32), run(text, x=x))


# -- weight views ending near their buffer's right edge -----------------------------------


@pytest.mark.parametrize("view, cols", [("wv[:, 200:256]", slice(200, 256)), ("wv[1:, 3:]", slice(3, 256))])
def test_matmul_weight_view_at_the_right_edge(view, cols):
    k0 = 1 if view.startswith("wv[1:") else 0
    a, w = bf16(8, 128), bf16(128, 256)
    n = cols.stop - cols.start
    text = kernel([("a", "bf16", (8, 128)), ("w", "bf16", (128, 256))], [("y", "f32", (8, n))],
                  f"    yv = matmul(av[:, {k0}:], {view});")
    same(mm(a[:, k0:], w[k0:, cols]), run(text, a=a, w=w))


def test_matmul_weight_tiles_with_a_loop_start():
    a, w = bf16(8, 128), bf16(128, 640)
    text = kernel([("a", "bf16", (8, 128)), ("w", "bf16", (128, 640))], [("y", "f32", (8, 640))],
                  "    for j in 0..2 { yv[:, j * 320 +: 320] = matmul(av, wv[:, j * 320 +: 320]); }")
    same(mm(a, w), run(text, a=a, w=w))


def test_mxfp4_weight_view_at_the_right_edge():
    x = bf16(8, 256)
    w = RNG.standard_normal((256, 256)).astype(np.float32)
    decoded = nx.mxfp4_from_bytes(nx.mxfp4_to_bytes(w), w.shape)
    text = kernel([("x", "bf16", (8, 256)), ("w", "mxfp4", (256, 256))], [("y", "f32", (8, 254))],
                  "    yv = matmul(xv[:, 32:], wv[32:, 2:]) + 1.0;")
    same(mm(x[:, 32:], decoded[32:, 2:]) + np.float32(1), run(text, x=x, w=w))


# -- constants -------------------------------------------------------------------------------


@pytest.mark.parametrize("expr, value", [("max(-0.0, 0.0)", 0.0), ("max(0.0, -0.0)", 0.0),
                                         ("min(0.0, -0.0)", -0.0), ("min(-0.0, 0.0)", -0.0)])
def test_max_min_of_float_constants_follow_f32_max(expr, value):
    x = np.ones((8, 128), np.float32)
    text = kernel([("x", "f32", (8, 128))], [("y", "f32", (8, 128))], f"    yv = xv * 0.0 + {expr};")
    same(x * np.float32(0) + np.float32(value), run(text, x=x))


# -- random shapes -----------------------------------------------------------------------------


@settings(max_examples=12, deadline=None)
@given(rows=st.integers(1, 40), cols=st.integers(1, 400), axis=st.sampled_from([0, 1]),
       op=st.sampled_from(["sum", "max", "min"]))
def test_reduction_broadcast_back(rows, cols, axis, op):
    x = RNG.standard_normal((rows, cols)).astype(np.float32)
    r = RNG.standard_normal((1, cols)).astype(np.float32)
    text = kernel([("x", "f32", (rows, cols)), ("r", "f32", (1, cols))], [("y", "f32", (rows, cols))],
                  f"    yv = exp(xv - {op}(xv * rv, axis={axis})) * rv;")
    same(nx.exp(x - padded_tree(x * r, axis, op)) * r, run(text, x=x, r=r))


# -- a point index on a VMEM buffer's column ---------------------------------------------


def test_column_point_index_is_a_row():
    """`x[:, j]` drops the row dimension: a [1, R] tile (docs/language.md, Views)."""
    x = RNG.standard_normal((16, 200)).astype(np.float32)
    text = kernel([("x", "f32", (16, 200))], [("y", "f32", (1, 16))],
                  "    yv = 0.0;\n    for j in 0..2 { yv = yv + xv[:, j * 7] * 2.0; }")
    expected = (np.zeros((1, 16), np.float32) + x[:, 0][None] * 2) + x[:, 7][None] * 2
    same(expected, run(text, x=x))


def test_store_into_a_column_point_view():
    x = RNG.standard_normal((16, 200)).astype(np.float32)
    text = kernel([("x", "f32", (16, 200))], [("y", "f32", (16, 200))],
                  "    yv = 0.0;\n    yv[:, 3] = xv[0:1, 0:16];\n    yv[:, 5] = 1.5;\n    yv[:, 3] += xv[1, 0:16];")
    expected = np.zeros((16, 200), np.float32)
    expected[:, 3] = x[0, :16] + x[1, :16]
    expected[:, 5] = 1.5
    same(expected, run(text, x=x))
