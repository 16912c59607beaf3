"""Valid matmul, MXFP4 and host programs, as docs/language.md ("Tile expressions",
"MXFP4 weights", "Host", tutorial steps 4 and 5), docs/numerics.md ("The matrix unit",
"MXFP4 weights") and docs/api.md ("Calling", "--inputs files") describe them: compiled
and run through the public API (and `mkemu run`), compared bit for bit with numpy
written independently from those pages (no `mkemu.isa.numerics` in the references)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mkemu
from mkemu.errors import EmulatorFault, SourceError

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "language.md").read_text()
RNG = np.random.default_rng(11)
F32 = np.float32


# ------------------------------------------------------------- independent numpy


def bf16(x) -> np.ndarray:
    """Round to the nearest bf16, ties to even (docs/numerics.md): add 0x7FFF plus the
    lowest kept bit, keep the high 16 bits; NaN becomes the quiet NaN, sign kept."""
    x = np.asarray(x, F32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    rounded = np.where(np.isnan(x), (bits & 0x80000000) | 0x7FC00000, rounded)
    return (rounded & 0xFFFFFFFF).astype(np.uint32).view(F32).reshape(x.shape)


def mm(a, w, acc=None) -> np.ndarray:
    """The matrix unit: operands to bf16, then acc = f32(acc + f32(a[:, k] * w[k, :]))
    for k = 0, 1, ... in order, from +0 (docs/numerics.md, "The matrix unit")."""
    a, w = bf16(a), bf16(w)
    out = np.zeros((a.shape[0], w.shape[1]), F32) if acc is None else np.array(acc, F32)
    with np.errstate(all="ignore"):
        for k in range(a.shape[1]):
            out = (out + (a[:, k, None] * w[None, k, :]).astype(F32)).astype(F32)
    return out


E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _e2m1(v: float) -> float:
    """The nearest e2m1 value, ties to the even code, saturating at 6; NaN is -0."""
    if math.isnan(v):
        return -0.0
    sign = math.copysign(1.0, v)
    a = abs(v)
    if a >= 6.0:
        return sign * 6.0
    i = max(j for j in range(8) if E2M1[j] <= a)
    lo, hi = E2M1[i], E2M1[i + 1]
    if a - lo != hi - a:
        return sign * (lo if a - lo < hi - a else hi)
    return sign * (lo if i % 2 == 0 else hi)


def held(w) -> np.ndarray:
    """The values an MXFP4 array holds after the runner stores `w` (docs/numerics.md,
    "MXFP4 weights": encoding, then exact decoding), for every matrix of [..., K, N]."""
    w = np.asarray(w, F32)
    if w.ndim > 2:
        return np.stack([held(m) for m in w])
    K, N = w.shape
    out = np.zeros((K, N), F32)
    for b in range(0, K, 32):
        for n in range(N):
            block = w[b:b + 32, n].astype(np.float64)
            mag = np.abs(block)
            if np.isnan(mag).any() or mag.max() == 0:
                e = -2
            elif np.isinf(mag).any():
                e = -3
            else:
                e = min(127, max(-127, math.frexp(mag.max())[1] - 1 - 2))
            for i, v in enumerate(block):
                q = _e2m1(float(F32(v / 2.0 ** e)))
                out[b + i, n] = F32(q * 2.0 ** e)
    return out


def b16(*shape) -> np.ndarray:
    return bf16(RNG.standard_normal(shape).astype(F32))


def normal(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(F32)


def same(expected, got) -> None:
    """Bit for bit, any NaN equal to any NaN (docs/api.md)."""
    expected, got = np.asarray(expected), np.asarray(got)
    assert expected.shape == got.shape, (expected.shape, got.shape)
    if expected.dtype.kind == "f":
        e, g = expected.astype(F32), got.astype(F32)
        differ = (e.view(np.uint32) != g.view(np.uint32)) & ~(np.isnan(e) & np.isnan(g))
        assert not differ.any(), (np.argwhere(differ)[:5], e[differ][:5], g[differ][:5])
    else:
        np.testing.assert_array_equal(expected, got)


def compile_(src: str, mesh: str = "1", name: str = "matmul_host.mk", folder: Path | None = None, **options):
    path = (folder or Path("/tmp")) / name
    return mkemu.compile_source(src, str(path), hw="test", mesh=mesh, **options)


def run(src: str, mesh: str = "1", params=None, **inputs):
    return compile_(src, mesh, params=params or {})(**inputs)


def error_of(src: str, **options) -> str:
    with pytest.raises(SourceError) as info:
        compile_(src, name="bad.mk", **options)
    return info.value.render()


def doc_block(name: str) -> str:
    found = re.search(r"```mk\n// file: " + re.escape(name) + r"\n(.*?)```", DOC, re.S)
    assert found, name
    return found.group(1)


# ------------------------------------------------------------- matmul shapes

PLAIN = """
param M = 8;
param K = 128;
param N = 128;
kernel k(x: hbm DT[M, K], w: hbm DT[K, N], y: hbm f32[M, N]) {
    vmem xv: DT[M, K];
    vmem wv: DT[K, N];
    vmem yv: f32[M, N];
    sem s;
    start copy(x, xv, s);
    start copy(w, wv, s);
    wait copy(x, xv, s);
    wait copy(w, wv, s);
    yv = matmul(xv, wv);
    start copy(yv, y, s);
    wait copy(yv, y, s);
}
"""


@pytest.mark.parametrize("m, k, n", [
    (1, 128, 128),      # one row
    (8, 128, 1),        # one column
    (3, 100, 5),        # K not a multiple of the 128-deep tile
    (8, 1, 8),          # K = 1
    (9, 129, 257),      # one past every boundary
    (33, 64, 128),      # more row blocks than the 4 accumulators
    (40, 256, 256),     # 256 boundaries, two K tiles, both matrix units
    (8, 384, 130),
    (16, 255, 127),     # one short of every boundary
])
def test_bf16_matmul_shapes(m, k, n):
    x, w = b16(m, k), b16(k, n)
    got = run(PLAIN.replace("DT", "bf16"), params={"M": m, "K": k, "N": n}, x=x, w=w).output("y")
    same(mm(x, w), got)


def test_f32_operands_are_rounded_to_bf16_by_the_matrix_unit():
    # "both bf16 or both f32": f32 operands are rounded to bf16 (RNE) before the products.
    x, w = normal(5, 40), normal(40, 24)
    x[0, :4] = [1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 3.0e38]      # ties, and one to inf
    got = run(PLAIN.replace("DT", "f32"), params={"M": 5, "K": 40, "N": 24}, x=x, w=w).output("y")
    same(mm(bf16(x), bf16(w)), got)
    with np.errstate(all="ignore"):
        assert not np.array_equal(mm(bf16(x), bf16(w)), (x.astype(np.float64) @ w).astype(F32))


def test_special_values_follow_the_matrix_unit_contract():
    # -0 products from a +0 start, overflow to inf, subnormal products (rounded by the
    # IEEE multiply), inf * 0 = NaN, a NaN operand, and products below the smallest
    # subnormal rounding to zero.
    for k in (1, 64, 130):
        x, w = np.zeros((8, k), F32), np.zeros((k, 128), F32)
        x[0, :] = -1.0
        x[1, :] = 2.0 ** 100
        w[:, 1] = 2.0 ** 30
        x[2, :] = 2.0 ** -100
        w[:, 2] = 2.0 ** -40
        x[2, 0] = 1.5 * 2.0 ** -100
        w[0, 3] = 1.25 * 2.0 ** -30
        x[3, :] = np.inf
        x[4, :] = -2.0 ** -75
        w[:, 5] = 2.0 ** -75
        x[5, :] = 3.0
        w[:, 6] = -0.0
        x[6, 0] = np.nan
        w[:, 7] = 1e-2
        x[7, :] = 1e-38
        x, w = bf16(x), bf16(w)
        got = run(PLAIN.replace("DT", "bf16"), params={"K": k}, x=x, w=w).output("y")
        same(mm(x, w), got)
        assert got[0, 0].view(np.uint32) == 0                      # +0, not -0
        assert got[1, 1] == np.inf and np.isnan(got[3, 4])
        assert 0 < got[2, 2] < np.finfo(F32).tiny                  # subnormal kept


MATMUL_FORMS = """
kernel k(x: hbm bf16[8, 256], w: hbm bf16[256, 128], w2: hbm bf16[128, 64], b: hbm f32[1, 128],
         y: hbm f32[8, 128], z: hbm f32[8, 64], v: hbm f32[1, 128], t: hbm f32[3, 128]) {
    vmem xv: bf16[8, 256];
    vmem wv: bf16[256, 128];
    vmem w2v: bf16[128, 64];
    vmem bv: f32[1, 128];
    vmem row: bf16[256];
    vmem yv: f32[8, 128];
    vmem zv: f32[8, 64];
    vmem vv: f32[1, 128];
    vmem tv: f32[3, 128];
    var wf: f32[128, 64];
    sem s;
    start copy(x, xv, s);
    start copy(w, wv, s);
    start copy(w2, w2v, s);
    start copy(b, bv, s);
    start copy(x[2], row, s);
    wait copy(x, xv, s);
    wait copy(w, wv, s);
    wait copy(w2, w2v, s);
    wait copy(b, bv, s);
    wait copy(x[2], row, s);
    yv = matmul(xv, wv) * 2.0 + bv;                  // a matmul inside a larger expression
    let h = bf16(matmul(xv, wv));                    // a let tile as the next left operand
    wf = f32(w2v);
    zv = matmul(f32(h), wf);                         // f32 x f32 (a var on the right)
    zv += matmul(h, w2v);                            // accumulate: a separate f32 addition
    vv = matmul(row, wv);                            // a 1-D [256] view is a [1, 256] tile
    tv = matmul(xv[2:5, 100 +: 60], wv[100 +: 60, :]);   // sliced operands
    start copy(yv, y, s);
    start copy(zv, z, s);
    start copy(vv, v, s);
    start copy(tv, t, s);
    wait copy(yv, y, s);
    wait copy(zv, z, s);
    wait copy(vv, v, s);
    wait copy(tv, t, s);
}
"""


def test_matmul_operand_forms_and_expressions():
    x, w, w2, b = b16(8, 256), b16(256, 128), b16(128, 64), normal(1, 128)
    r = run(MATMUL_FORMS, x=x, w=w, w2=w2, b=b)
    p = mm(x, w)
    same(p * F32(2.0) + b, r.output("y"))
    h = bf16(p)
    same(mm(h, w2) + mm(h, w2), r.output("z"))
    same(mm(x[2:3], w), r.output("v"))
    same(mm(x[2:5, 100:160], w[100:160]), r.output("t"))


TRANSPOSED = """
kernel k(x: hbm bf16[8, K], w: hbm bf16[N, K], y: hbm f32[8, N]) {
    vmem xv: bf16[8, K];
    vmem wv: bf16[N, K];
    vmem yv: f32[8, N];
    sem s;
    start copy(x, xv, s);
    start copy(w, wv, s);
    wait copy(x, xv, s);
    wait copy(w, wv, s);
    yv = matmul(xv, transpose(wv));
    start copy(yv, y, s);
    wait copy(yv, y, s);
}
"""


@pytest.mark.parametrize("k, n", [(128, 8), (256, 136)])
def test_transposed_weights(k, n):
    x, w = b16(8, k), b16(n, k)
    src = f"param K = {k};\nparam N = {n};\n" + TRANSPOSED
    same(mm(x, w.T), run(src, x=x, w=w).output("y"))


def test_transposed_weights_need_k_a_multiple_of_128():
    text = error_of("param K = 100;\nparam N = 64;\n" + TRANSPOSED)
    assert text.startswith("/tmp/bad.mk:13:21: error: "), text
    assert "K % 128" in text


# A row or a column transposes anywhere (docs/language.md), as a matmul's right operand
# too, whatever K: a dot product and an outer product, of f32 and of bf16 rows.
ROW_TRANSPOSED = """
kernel k(a: hbm T[8, 256], y: hbm f32[1, 1], z: hbm f32[K, 8]) {
    vmem av: T[8, 256];
    vmem yv: f32[1, 1];
    vmem zv: f32[K, 8];
    sem s;
    start copy(a, av, s);
    wait copy(a, av, s);
    yv = matmul(av[0:1, 0:K], transpose(av[1:2, 0:K]));
    zv = matmul(transpose(av[2:3, 0:K]), av[3:4, 0:8]);
    start copy(yv, y, s);
    wait copy(yv, y, s);
    start copy(zv, z, s);
    wait copy(zv, z, s);
}
"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("k", [16, 100, 128, 200])
def test_a_transposed_row_is_a_matmul_operand_whatever_k(dtype, k):
    a = b16(8, 256) if dtype == "bf16" else normal(8, 256)
    src = f"const T = {dtype};\nparam K = {k};\n" + ROW_TRANSPOSED
    r = run(src, a=a)
    same(mm(a[0:1, :k], a[1:2, :k].T), r.output("y"))
    same(mm(a[2:3, :k].T, a[3:4, 0:8]), r.output("z"))


WINDOW = """
kernel k(x: hbm bf16[8, 128], w: hbm bf16[128, 256], c: hbm i32[8], y: hbm f32[8, LEN]) {
    vmem xv: bf16[8, 128];
    vmem wv: bf16[128, 256];
    vmem yv: f32[8, LEN];
    smem cs: i32[8];
    sem s;
    start copy(x, xv, s);
    start copy(w, wv, s);
    start copy(c, cs, s);
    wait copy(x, xv, s);
    wait copy(w, wv, s);
    wait copy(c, cs, s);
    yv = matmul(xv, wv[:, START +: LEN]);
    start copy(yv, y, s);
    wait copy(yv, y, s);
}
"""


@pytest.mark.parametrize("start, length, c0", [
    ("200", 56, 200), ("130", 126, 130), ("cs[0]", 56, 200), ("cs[0]", 100, 3), ("cs[0]", 128, 100)])
def test_weight_column_windows_near_the_right_edge(start, length, c0):
    # Static starts near the edge (a shifted load) and run-time starts (a bf16 temporary).
    x, w = b16(8, 128), b16(128, 256)
    c = np.array([c0] + [0] * 7, np.int32)
    got = run(WINDOW.replace("START", start).replace("LEN", str(length)), x=x, w=w, c=c).output("y")
    same(mm(x, w[:, c0:c0 + length]), got)


def test_matmul_dtype_and_shape_errors_name_the_place():
    mixed = PLAIN.replace("DT", "f32").replace("w: hbm f32", "w: hbm bf16").replace("wv: f32", "wv: bf16")
    text = error_of(mixed)
    assert text.startswith("/tmp/bad.mk:14:10: error: dtype mismatch"), text
    shapes = PLAIN.replace("DT", "bf16").replace("yv = matmul(xv, wv);", "yv = matmul(xv, wv[0:64, :]);")
    text = error_of(shapes)
    assert text.startswith("/tmp/bad.mk:14:10: error: "), text
    assert "matmul" in text.splitlines()[0]


# ------------------------------------------------------------- accumulation


def test_a_k_split_across_statements_is_a_sum_of_partial_products():
    # `acc += matmul(a, b)` is `acc = acc + matmul(a, b)`: each product is finished first.
    src = """
kernel k(x: hbm bf16[8, 384], w: hbm bf16[384, 128], y: hbm f32[8, 128], y1: hbm f32[8, 128]) {
    vmem xv: bf16[8, 384];
    vmem wv: bf16[384, 128];
    vmem yv: f32[8, 128];
    var acc: f32[8, 128] = 1.5;
    sem s;
    start copy(x, xv, s);
    start copy(w, wv, s);
    wait copy(x, xv, s);
    wait copy(w, wv, s);
    for t in 0..3 {
        acc += matmul(xv[:, t * 128 +: 128], wv[t * 128 +: 128, :]);
    }
    yv = acc;
    start copy(yv, y, s);
    wait copy(yv, y, s);
    yv = matmul(xv, wv);
    start copy(yv, y1, s);
    wait copy(yv, y1, s);
}
"""
    x, w = b16(8, 384), b16(384, 128)
    r = run(src, x=x, w=w)
    split = np.full((8, 128), 1.5, F32)
    for t in range(3):
        split = split + mm(x[:, t * 128:(t + 1) * 128], w[t * 128:(t + 1) * 128])
    same(split, r.output("y"))
    same(mm(x, w), r.output("y1"))                       # one accumulation over all of K
    assert not np.array_equal(mm(x, w), split - F32(1.5))


# ------------------------------------------------------------- tutorial 4 and 5


def _tiled(x, w, tk=256, tn=256):
    M, K = x.shape
    N = w.shape[1]
    y = np.zeros((M, N), F32)
    for j in range(0, N, tn):
        acc = np.zeros((M, tn), F32)
        for k in range(0, K, tk):
            acc = acc + mm(x[:, k:k + tk], w[k:k + tk, j:j + tn])
        y[:, j:j + tn] = acc
    return y


@pytest.mark.parametrize("params", [{"K": 512, "N": 512}, {"M": 3, "K": 768, "N": 256}, {}])
def test_tutorial_matmuls_single_and_double_buffered(params):
    cycles = {}
    for name in ("matmul_single_buffered.mk", "matmul_double_buffered.mk"):
        kernel = compile_(doc_block(name), name=name, params=params)
        M, K = kernel.buffers["x"].shape
        N = kernel.buffers["w"].shape[1]
        rng = np.random.default_rng(M * K + N)
        x = bf16(rng.standard_normal((M, K)).astype(F32))
        w = bf16(rng.standard_normal((K, N)).astype(F32))
        r = kernel(x=x, w=w)
        same(_tiled(x, w), r.output("y"))
        cycles[name] = r.report.cycles
    # Double buffering hides the weight copies the single-buffered loop waits for.
    assert cycles["matmul_double_buffered.mk"] < cycles["matmul_single_buffered.mk"], cycles


# ------------------------------------------------------------- MXFP4 weights


def test_the_runner_quantises_mxfp4_as_documented():
    # Encoding: scale 2^(floor(log2 max|w|) - 2) per 32-row block of a column, clamped
    # to [-127, 127], an all-zero block 2^-2; values the nearest e2m1, ties to even,
    # saturating at 6; NaN -> -0 (block scale 2^-2), inf -> +-6 (block scale 2^-3).
    src = """
kernel k(w: hbm mxfp4[64, 8], o: hbm mxfp4[64, 8]) {
    vmem wv: mxfp4[64, 8];
    sem s;
    start copy(w, wv, s);
    wait copy(w, wv, s);
    start copy(wv, o, s);
    wait(s, bytes(wv));
}
"""
    w = normal(64, 8) * F32(3)
    w[:32, 0] = [6, 2.5, 5, 0.25, 0.75, 1.25, 1.75, 3.5, -2.5, -0.25, 7, 0.1] + [0] * 20
    w[:32, 1], w[32:, 1] = 0.0, -0.0
    w[:32, 2] = 2.0 ** -130
    w[:3, 2] = [-2.0 ** -129, 2.0 ** -128, -1e-45]
    w[:32, 3] = 1.0
    w[5:8, 3] = [np.nan, 100.0, 0.3]
    w[:32, 4] = 0.1
    w[:4, 4] = [np.inf, -np.inf, -0.07, 1e30]
    w[:32, 5] = np.linspace(-7, 7, 32)
    w[32:, 5] = 3.0e38
    w[:32, 6], w[32:, 6] = 1.5 * 2.0 ** -125, 2.0 ** -126
    w[:32, 7], w[32:, 7] = 7.0, -1e-3
    r = run(src, w=w)
    expected = held(w)
    same(expected, r.output("w"))                        # the input, read back as held
    same(expected, r.output("o"))                        # HBM -> VMEM -> HBM unchanged
    assert list(expected[:12, 0]) == [6, 2, 4, 0, 1, 1, 2, 4, -2, -0.0, 6, 0]
    assert expected[0, 2] == 0 and np.signbit(expected[0, 2]) and expected[5, 2].view(np.uint32) == 0
    assert expected[1, 2] == F32(2.0 ** -128)                      # 2^-129 and less: +-0, 2^-128 kept
    assert list(expected[4:8, 3]) == [1.0, -0.0, 1.5, 0.25]        # NaN block: scale 2^-2
    assert list(expected[:4, 4]) == [0.75, -0.75, -0.0625, 0.75]   # inf block: scale 2^-3


# PLAIN with MXFP4 weights (K a multiple of the 32-row scale blocks).
MX_PLAIN = (PLAIN.replace("param K = 128;", "param K = 64;").replace("w: hbm DT", "w: hbm mxfp4")
            .replace("vmem wv: DT", "vmem wv: mxfp4").replace("DT", "bf16"))


@pytest.mark.parametrize("m, k, n", [(1, 32, 2), (8, 32, 128), (33, 96, 130), (3, 160, 258), (40, 256, 256)])
def test_mxfp4_matmul_shapes(m, k, n):
    x, w = b16(m, k), normal(k, n)
    got = run(MX_PLAIN, params={"M": m, "K": k, "N": n}, x=x, w=w).output("y")
    same(mm(x, held(w)), got)


def test_mxfp4_subnormal_weights_and_products():
    # A block below 2^-125 gets the scale 2^-127: decoded weights are float32
    # subnormals, exact bf16 values; their products round as IEEE says.
    x = bf16(np.concatenate([np.full((4, 64), 0.75, F32), normal(4, 64) * F32(1e-3)]))
    w = RNG.uniform(-1, 1, (64, 16)).astype(F32) * F32(2.0 ** -126)     # every block below 2^-126
    w[:, 8:] = normal(64, 8) * F32(2.0 ** -100)
    held_w = held(w)
    small = np.abs(held_w[:, :8])
    assert (small <= 2.0 ** -126).all() and ((small > 0) & (small < 2.0 ** -126)).any()
    same(mm(x, held_w), run(MX_PLAIN, params={"K": 64, "N": 16}, x=x, w=w).output("y"))


MX_VIEW = """
kernel k(x: hbm bf16[8, 128], w: hbm mxfp4[128, 512], y: hbm f32[8, LEN]) {
    vmem xv: bf16[8, 128];
    vmem wv: mxfp4[128, 512];
    vmem yv: f32[8, LEN];
    sem s;
    start copy(x, xv, s);
    start copy(w, wv, s);
    wait copy(x, xv, s);
    wait copy(w, wv, s);
    yv = matmul(xv[:, K0 +: KL], wv[K0 +: KL, N0 +: LEN]);
    start copy(yv, y, s);
    wait copy(yv, y, s);
}
"""


@pytest.mark.parametrize("k0, kl, n0, length", [
    (32, 64, 2, 130), (96, 32, 126, 130), (0, 128, 500, 12), (32, 96, 256, 256), (0, 32, 510, 2)])
def test_mxfp4_vmem_views_at_static_offsets(k0, kl, n0, length):
    x, w = b16(8, 128), normal(128, 512)
    src = MX_VIEW.replace("K0", str(k0)).replace("KL", str(kl)).replace("N0", str(n0)).replace("LEN", str(length))
    same(mm(x[:, k0:k0 + kl], held(w)[k0:k0 + kl, n0:n0 + length]), run(src, x=x, w=w).output("y"))


MX_HBM_VIEW = """
kernel k(x: hbm bf16[8, 128], w: hbm mxfp4[256, 512], y: hbm f32[8, LEN]) {
    vmem xv: bf16[8, 128];
    vmem wv: mxfp4[KL, LEN];
    vmem yv: f32[8, LEN];
    sem s;
    start copy(x, xv, s);
    start copy(w[K0 +: KL, N0 +: LEN], wv, s);
    wait copy(x, xv, s);
    wait copy(w[K0 +: KL, N0 +: LEN], wv, s);
    yv = matmul(xv[:, 0 +: KL], wv);
    start copy(yv, y, s);
    wait copy(yv, y, s);
}
"""


@pytest.mark.parametrize("k0, kl, n0, length", [(32, 64, 2, 130), (224, 32, 510, 2), (128, 128, 100, 300)])
def test_mxfp4_hbm_views_at_static_offsets(k0, kl, n0, length):
    x, w = b16(8, 128), normal(256, 512)
    src = MX_HBM_VIEW.replace("K0", str(k0)).replace("KL", str(kl)).replace("N0", str(n0)).replace("LEN", str(length))
    same(mm(x[:, :kl], held(w)[k0:k0 + kl, n0:n0 + length]), run(src, x=x, w=w).output("y"))


def test_mxfp4_views_at_run_time_offsets():
    # Row starts 32 * i, column starts j * 128: copies into a VMEM view and matmul of
    # a VMEM view, one 32-row scale block at a time, accumulated across statements.
    src = """
kernel k(x: hbm bf16[8, 128], w: hbm mxfp4[128, 512], y: hbm f32[8, 512]) {
    vmem xv: bf16[8, 128];
    vmem wv: mxfp4[128, 512];
    vmem yv: f32[8, 512];
    var acc: f32[8, 128];
    sem s;
    start copy(x, xv, s);
    wait copy(x, xv, s);
    for j in 0..4 {
        acc = 0.0;
        for i in 0..4 {
            start copy(w[32 * i +: 32, j * 128 +: 128], wv[32 * i +: 32, 128 * j +: 128], s);
            wait copy(w[32 * i +: 32, j * 128 +: 128], wv[32 * i +: 32, 128 * j +: 128], s);
            acc += matmul(xv[:, i * 32 +: 32], wv[32 * i +: 32, j * 128 +: 128]);
        }
        yv[:, j * 128 +: 128] = acc;
    }
    start copy(yv, y, s);
    wait copy(yv, y, s);
}
"""
    x, w = b16(8, 128), normal(128, 512)
    W = held(w)
    expected = np.zeros((8, 512), F32)
    for j in range(4):
        acc = np.zeros((8, 128), F32)
        for i in range(4):
            acc = acc + mm(x[:, 32 * i:32 * i + 32], W[32 * i:32 * i + 32, 128 * j:128 * j + 128])
        expected[:, 128 * j:128 * j + 128] = acc
    same(expected, run(src, x=x, w=w).output("y"))


MX_RUNTIME_COLUMNS = """
kernel k(x: hbm bf16[8, 128], w: hbm mxfp4[128, 512], c: hbm i32[8], y: hbm f32[8, LEN]) {
    vmem xv: bf16[8, 128];
    vmem wv: mxfp4[128, 512];
    vmem yv: f32[8, LEN];
    smem cs: i32[8];
    sem s;
    start copy(x, xv, s);
    start copy(w, wv, s);
    start copy(c, cs, s);
    wait copy(x, xv, s);
    wait copy(w, wv, s);
    wait copy(c, cs, s);
    let j = cs[0];
    yv = matmul(xv[:, 0 +: KL], wv[0 +: KL, 2 * j +: LEN]);
    start copy(yv, y, s);
    wait copy(yv, y, s);
}
"""


@pytest.mark.parametrize("kl, length, j", [(128, 128, 100), (128, 256, 64), (96, 64, 200), (96, 12, 250)])
def test_mxfp4_run_time_column_starts_that_cannot_reach_past_the_buffer(kl, length, j):
    # A width that is a multiple of 128, or rows that stop before the buffer's last
    # scale block: every 128-column row the matrix unit reads stays in the buffer.
    x, w = b16(8, 128), normal(128, 512)
    c = np.array([j] + [0] * 7, np.int32)
    src = MX_RUNTIME_COLUMNS.replace("KL", str(kl)).replace("LEN", str(length))
    same(mm(x[:, :kl], held(w)[:kl, 2 * j:2 * j + length]), run(src, x=x, w=w, c=c).output("y"))


def test_mxfp4_run_time_column_start_in_a_slot_before_the_last():
    # Slot 0 of two: the 128-column rows read past the view stay inside the buffer.
    src = """
kernel k(w: hbm mxfp4[128, 512], c: hbm i32[8], x: hbm bf16[8, 128], y: hbm f32[8, 64]) {
    vmem xv: bf16[8, 128];
    vmem wv: mxfp4[2][128, 512];
    vmem yv: f32[8, 64];
    smem cs: i32[8];
    sem s;
    start copy(x, xv, s);
    start copy(c, cs, s);
    start copy(w, wv[0], s);
    wait copy(x, xv, s);
    wait copy(c, cs, s);
    wait copy(w, wv[0], s);
    let j = cs[0];
    yv = matmul(xv, wv[0][:, 2 * j +: 64]);
    start copy(yv, y, s);
    wait copy(yv, y, s);
}
"""
    x, w = b16(8, 128), normal(128, 512)
    r = run(src, x=x, w=w, c=np.array([224] + [0] * 7, np.int32))
    same(mm(x, held(w)[:, 448:]), r.output("y"))


def test_mxfp4_run_time_column_start_that_could_reach_past_is_an_error():
    text = error_of(MX_RUNTIME_COLUMNS.replace("KL", "128").replace("LEN", "64"))
    assert text.startswith("/tmp/bad.mk:15:34: error: matmul reads mxfp4 weights in tiles of whole 128-column "
                           "rows"), text


EXPERTS = """
param E = 3;
kernel k(sel: hbm i32[8], x: hbm bf16[8, 64], w: hbm mxfp4[E, 64, 256], y: hbm f32[8, 256],
         wo: hbm mxfp4[2, 64, 256], wc: hbm mxfp4[64, 128]) {
    smem si: i32[8];
    vmem xv: bf16[8, 64];
    vmem wb: mxfp4[2][64, 256];
    vmem w2: mxfp4[64, 128];
    vmem yv: f32[8, 256];
    sem s;
    sem ws[2];
    start copy(sel, si, s);
    start copy(x, xv, s);
    wait copy(sel, si, s);
    wait copy(x, xv, s);
    let e = si[0];
    start copy(w[e], wb[0], ws[0]);                              // a run-time expert
    start copy(w[si[1], 32 +: 32, :], wb[1][0 +: 32, :], ws[1]);
    wait copy(w[e], wb[0], ws[0]);
    wait copy(w[0, 0 +: 32, :], wb[1][0 +: 32, :], ws[1]);       // a wait needs only the bytes
    start copy(wb[1][0 +: 32, :], wb[1][32 +: 32, :], s);       // VMEM -> VMEM, slot 1
    wait copy(wb[1][0 +: 32, :], wb[1][32 +: 32, :], s);
    start copy(wb[0][:, 128 +: 128], w2, s);
    wait(s, bytes(w2));                                          // values and scales
    yv = matmul(xv, wb[0]);
    yv[:, 0 +: 128] = yv[:, 0 +: 128] + matmul(xv, w2);
    start copy(wb[0], wo[0], s);                                 // VMEM -> HBM
    start copy(wb[1], wo[1], s);
    wait 2 * copy(wb[0], wo[0], s);
    start copy(w2, wc, s);
    wait copy(w2, wc, s);
    start copy(yv, y, s);
    wait copy(yv, y, s);
}
host {
    input sel: i32[8];
    input x: bf16[8, 64];
    input w: mxfp4[E, 64, 256];
    output y: f32[8, 256];
    output wo: mxfp4[2, 64, 256];
    output wc: mxfp4[64, 128];
    launch k(sel, x, w, y, wo, wc);
}
"""


@pytest.mark.parametrize("e, e1", [(0, 2), (2, 1)])
def test_mxfp4_slots_copies_and_outputs(e, e1):
    x, w = b16(8, 64), normal(3, 64, 256)
    r = run(EXPERTS, sel=np.array([e, e1] + [0] * 6, np.int32), x=x, w=w)
    W = held(w)
    y = mm(x, W[e])
    y[:, :128] = y[:, :128] + mm(x, W[e][:, 128:])
    same(y, r.output("y"))
    same(np.stack([W[e], np.concatenate([W[e1][32:], W[e1][32:]])]), r.output("wo"))
    same(W[e][:, 128:], r.output("wc"))
    assert sorted(r.outputs) == ["wc@0", "wo@0", "y@0"]


def test_an_expert_index_past_the_mxfp4_array_faults_naming_it():
    with pytest.raises(EmulatorFault) as info:
        run(EXPERTS, sel=np.array([3, 0] + [0] * 6, np.int32), x=b16(8, 64), w=normal(3, 64, 256))
    text = info.value.render()
    assert "index 3 of dimension 0 of the values of 'w'" in text and "is outside 0..2" in text, text
    assert "bad" not in text
    assert "matmul_host.mk:17" in text, text


def test_the_documented_expert_example():
    src = doc_block("expert_mxfp4.mk")
    kernel = compile_(src, name="expert_mxfp4.mk", params={"E": 3, "K": 128, "N": 512})
    x, w = b16(8, 128), normal(3, 128, 512)
    W = held(w)
    for e in (0, 2):
        r = kernel(sel=np.array([e] + [7] * 7, np.int32), x=x, w=w)
        same(mm(x, W[e]), r.output("y"))


@pytest.mark.parametrize("body, message", [
    ("start copy(w[0, 0 +: 32, :], xb, s);\n    wait copy(w[0, 0 +: 32, :], xb, s);",
     "dtype mismatch: copy from mxfp4 to bf16"),
    ("xf = matmul(xb, w[0]);", "matmul reads mxfp4 weights from VMEM"),
    ("xf = matmul(xf, wv);", "matmul with mxfp4 weights takes a bf16 left operand"),
    ("let r = si[0];\n    start copy(w[0, 32 * r + 16 +: 32, :], wv[0 +: 32, :], s);\n"
     "    wait copy(w[0, 0 +: 32, :], wv[0 +: 32, :], s);", "must start its rows at a multiple of 32"),
    ("start copy(w[0, :, 0 +: 127], wv[:, 0 +: 127], s);\n    wait copy(w[0, :, 0 +: 127], wv[:, 0 +: 127], s);",
     "a view of mxfp4 'w' takes"),
])
def test_mxfp4_misuse_names_file_and_line(body, message):
    src = f"""
kernel k(w: hbm mxfp4[2, 64, 256], i: hbm i32[8]) {{
    vmem xb: bf16[32, 256];
    vmem xf: f32[32, 256];
    vmem wv: mxfp4[64, 256];
    smem si: i32[8];
    sem s;
    start copy(i, si, s);
    wait copy(i, si, s);
    {body}
}}
"""
    text = error_of(src)
    assert re.match(r"/tmp/bad\.mk:1[01]:\d+: error: ", text), text
    assert message in text.splitlines()[0], text


def test_mxfp4_launch_argument_that_is_part_of_an_array_is_an_error():
    text = error_of("kernel k(w: hbm mxfp4[64, 128]) { }\n"
                    "host {\n    input w: mxfp4[2, 64, 128];\n    launch k(w[1]);\n}\n")
    assert text.startswith("/tmp/bad.mk:4:14: error: an mxfp4 launch argument is a whole host array"), text


# ------------------------------------------------------------- host


HOST = """
param L = 3;
param D = 128;
kernel proj<K, N>(x: hbm f32[8, K], w: hbm bf16[K, N], y: hbm f32[8, N], scale: i32) {
    vmem xv: f32[8, K];
    vmem wv: bf16[K, N];
    vmem yv: f32[8, N];
    sem s;
    start copy(x, xv, s);
    start copy(w, wv, s);
    wait copy(x, xv, s);
    wait copy(w, wv, s);
    yv = matmul(bf16(xv), wv) * f32(scale);
    start copy(yv, y, s);
    wait copy(yv, y, s);
}
kernel acc(t: hbm f32[8, D], y: hbm f32[8, D]) {
    vmem a: f32[8, D];
    vmem b: f32[8, D];
    sem s;
    start copy(t, a, s);
    start copy(y, b, s);
    wait copy(t, a, s);
    wait copy(y, b, s);
    b = b + a;
    start copy(b, y, s);
    wait copy(b, y, s);
}
host {
    input x: f32[8, D];
    input w: bf16[L, D, D];
    input w2: bf16[D, 64];
    output y: f32[8, D];
    output z: f32[8, 64];
    output untouched: f32[8, D];
    hbm t: f32[8, D];
    for l in 0..L {
        launch proj(x, w[l], t, l + 1);
        launch acc(t, y);
    }
    launch proj(y, w2, z, 1);
}
"""


def _host_expected(x, w, w2):
    y = np.zeros((8, 128), F32)
    for l in range(w.shape[0]):
        y = y + mm(bf16(x), w[l]) * F32(l + 1)
    return y, mm(bf16(y), w2)


def test_several_launches_chain_through_hbm_in_one_host_block():
    kernel = compile_(HOST, mesh="2")
    assert [launch.kernel for launch in kernel.program.launches] == \
        ["proj<128,128>", "acc"] * 3 + ["proj<128,64>"]
    assert {n: b.kind for n, b in kernel.buffers.items()} == {
        "x": "input", "w": "input", "w2": "input", "y": "output", "z": "output", "untouched": "output",
        "t": "scratch"}
    x, w, w2 = normal(8, 128), b16(3, 128, 128), b16(128, 64)
    r = kernel(x=x, w=w, w2=w2)
    y, z = _host_expected(x, w, w2)
    for chip in (0, 1):
        same(y, r.output("y", chip=chip))
        same(z, r.output("z", chip=chip))
        same(np.zeros((8, 128), F32), r.output("untouched", chip=chip))     # never written: zeros
    same(mm(bf16(x), w[2]) * F32(3), r.output("t"))                          # scratch, readable
    assert sorted(r.outputs) == [f"{n}@{c}" for n in ("untouched", "y", "z") for c in (0, 1)]


def test_a_param_changes_the_host_loop():
    x, w, w2 = normal(8, 128), b16(2, 128, 128), b16(128, 64)
    r = run(HOST, params={"L": 2}, x=x, w=w, w2=w2)
    y, z = _host_expected(x, w, w2)
    same(y, r.output("y"))
    same(z, r.output("z"))


@pytest.mark.parametrize("launch, message", [
    ("launch proj(x, w, t, 1);", "argument 'w' is bf16[3, 128, 128], kernel 'proj' expects bf16[128, 128]"),
    ("launch acc(x, z);", "argument 'y' is f32[8, 64], kernel 'acc' expects f32[8, 128]"),
    ("launch acc(w2, y);", "argument 't' is bf16[128, 64], kernel 'acc' expects f32[8, 128]"),
    ("launch proj(x, w[0], t);", "kernel 'proj' takes 4 arguments, got 3"),
    ("launch nope(x);", "unknown kernel 'nope'"),
    ("launch proj(x, w[0], t, x);", "argument 'scale' must be a compile-time integer"),
    ("launch proj(x, w[L], t, 1);", "out of range"),
])
def test_launch_errors_name_the_line(launch, message):
    src = HOST.replace("launch proj(y, w2, z, 1);", launch)
    text = error_of(src)
    line = src.splitlines().index("    " + launch) + 1
    assert text.startswith(f"/tmp/bad.mk:{line}:"), text
    assert message in text.splitlines()[0], text


# ------------------------------------------------------------- calling: inputs


IO = """
kernel k(a: hbm bf16[2, 128], b: hbm f32[2, 128], c: hbm i32[2, 128], m: hbm mxfp4[32, 128],
         a2: hbm bf16[2, 128], b2: hbm f32[2, 128], c2: hbm i32[2, 128], m2: hbm mxfp4[32, 128]) {
    vmem av: bf16[2, 128];
    vmem bv: f32[2, 128];
    vmem cv: i32[2, 128];
    vmem mv: mxfp4[32, 128];
    sem s;
    start copy(a, av, s);
    start copy(b, bv, s);
    start copy(c, cv, s);
    start copy(m, mv, s);
    wait copy(a, av, s);
    wait copy(b, bv, s);
    wait copy(c, cv, s);
    wait copy(m, mv, s);
    start copy(av, a2, s);
    start copy(bv, b2, s);
    start copy(cv, c2, s);
    start copy(mv, m2, s);
    wait copy(av, a2, s);
    wait copy(bv, b2, s);
    wait copy(cv, c2, s);
    wait copy(mv, m2, s);
}
"""


@pytest.fixture(scope="module")
def io_kernel():
    return compile_(IO, mesh="2", name="io.mk")


def _odd_values():
    a = np.zeros((2, 128), np.float64)
    a[0, :9] = [1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -9), 3.4e38, 1e39, np.nan, -0.0, 2.0 ** -140, 1 / 3]
    a[1] = np.linspace(-5, 5, 128)
    return a


def test_each_dtype_takes_numbers_rounded_to_its_format(io_kernel):
    a = _odd_values()
    c = np.arange(256, dtype=np.int64).reshape(2, 128) - 128
    r = io_kernel(a=a, b=a, c=c.astype(np.int16), m=np.tile(a[1], (32, 1)))
    with np.errstate(over="ignore"):
        as_f32 = a.astype(F32)
    for chip in (0, 1):
        same(bf16(as_f32), r.output("a2", chip=chip))          # through float32, then RNE
        same(as_f32, r.output("b2", chip=chip))
        same(c.astype(np.int32), r.output("c2", chip=chip))
        same(held(np.tile(a[1], (32, 1))), r.output("m2", chip=chip))
    assert r.output("c2").dtype == np.int32 and r.output("a2").dtype == F32
    assert sorted(r.outputs) == sorted(f"{n}@{c}" for n in ("a2", "b2", "c2", "m2") for c in (0, 1))


def test_run_inputs_are_the_values_written_as_a_reference_sees_them(io_kernel, tmp_path):
    # docs/api.md: `inputs` is what was written; the reference contract gives bf16
    # buffers as float32 arrays of bf16 values, and run.check() hands it run.inputs.
    a = _odd_values()
    c = np.full((2, 128), 100, np.int8)
    m = np.tile(a[1], (32, 1))
    r = io_kernel(a=a, b=a, c=c, m=m)
    for chip in (0, 1):
        with np.errstate(over="ignore"):
            same(bf16(a.astype(F32)), r.inputs[f"a@{chip}"])
        assert r.inputs[f"b@{chip}"].dtype == F32 and r.inputs[f"c@{chip}"].dtype == np.int32
        same(held(m), r.inputs[f"m@{chip}"])
    # A reference that uses its inputs as the contract says gets the kernel's bits.
    (tmp_path / "ref.py").write_text(
        "import numpy as np\n"
        "def reference(inputs, *, chips, cores_per_chip):\n"
        "    return {'y': inputs['x@0'], 'n': inputs['i@0'] * np.int32(3)}\n")
    src = """
reference "ref.py:reference";
kernel k(x: hbm bf16[1, 128], i: hbm i32[1, 128], y: hbm f32[1, 128], n: hbm i32[1, 128]) {
    vmem xv: bf16[1, 128];
    vmem yv: f32[1, 128];
    vmem iv: i32[1, 128];
    sem s;
    start copy(x, xv, s);
    start copy(i, iv, s);
    wait copy(x, xv, s);
    wait copy(i, iv, s);
    yv = f32(xv);
    iv = iv * 3;
    start copy(yv, y, s);
    start copy(iv, n, s);
    wait copy(yv, y, s);
    wait copy(iv, n, s);
}
"""
    kernel = compile_(src, name="p.mk", folder=tmp_path)
    r = kernel(x=np.full((1, 128), 1 + 2 ** -8), i=np.full((1, 128), 100, np.int8))
    assert r.check() is None and r.report.bit_exact


@pytest.mark.parametrize("inputs, message", [
    ({"c": np.zeros((2, 128))}, "c: error: buffer c (i32): got float64 values"),
    ({"c": np.full((2, 128), 2 ** 31, np.int64)}, "c: error: buffer c (i32): values"),
    ({"a": np.zeros((128, 2), F32)}, "a: error: buffer a"),
    ({"m": np.zeros((64, 128), F32)}, "m: error: buffer m"),
    ({"zz": np.zeros(3)}, "zz: error: no buffer named 'zz'"),
    ({"a@2": np.zeros((2, 128))}, "a@2: error: "),
    ({"a@01": np.zeros((2, 128))}, "a@01: error: "),
    ({"a@-1": np.zeros((2, 128))}, "a@-1: error: "),
    ({"a": np.full((2, 128), "x")}, "a: error: buffer a (bf16): got an array of <U1, not numbers"),
])
def test_bad_inputs_are_one_line_errors_naming_buffer_and_key(io_kernel, inputs, message):
    with pytest.raises(mkemu.ConfigError) as info:
        io_kernel(**inputs)
    text = info.value.render()
    assert text.startswith(message) and "\n" not in text, text


def test_a_chip_key_wins_over_the_plain_name_and_missing_buffers_start_as_zeros(io_kernel):
    b = np.full((2, 128), 1.0, F32)
    r = io_kernel({"b": b, "b@1": b * 7}, a=b * 3)
    same(b, r.output("b2", chip=0))
    same(b * 7, r.output("b2", chip=1))
    same(b * 3, r.output("a2", chip=1))
    same(np.zeros((2, 128), np.int32), r.output("c2", chip=1))          # not given: zeros
    same(np.zeros((32, 128), F32), r.output("m2"))
    assert sorted(r.inputs) == ["a@0", "a@1", "b@0", "b@1"]


def test_output_of_a_chip_or_buffer_the_program_lacks_is_a_config_error(io_kernel):
    r = io_kernel(b=np.ones((2, 128), F32))
    same(np.ones((2, 128), F32), r.output("b", chip=1))                 # any buffer, not only outputs
    for chip in (2, -1, "1"):
        with pytest.raises(mkemu.ConfigError):
            r.output("b2", chip=chip)
    with pytest.raises(mkemu.ConfigError):
        r.output("nope")


def test_no_inputs_at_all_are_generated_from_the_seed():
    src = """
kernel k(x: hbm bf16[8, 64], w: hbm mxfp4[64, 128], i: hbm i32[8], b: hbm f32[1, 128], y: hbm f32[8, 128]) {
    vmem xv: bf16[8, 64];
    vmem wv: mxfp4[64, 128];
    vmem bv: f32[1, 128];
    vmem yv: f32[8, 128];
    sem s;
    start copy(x, xv, s);
    start copy(w, wv, s);
    start copy(b, bv, s);
    wait copy(x, xv, s);
    wait copy(w, wv, s);
    wait copy(b, bv, s);
    yv = matmul(xv, wv) + bv;
    start copy(yv, y, s);
    wait copy(yv, y, s);
}
"""
    kernel = compile_(src, mesh="2")
    generated = kernel.generate_inputs()
    assert sorted(generated) == sorted(f"{n}@{c}" for n in ("x", "w", "i", "b") for c in (0, 1))
    r = kernel()
    assert sorted(r.inputs) == sorted(generated)
    for key, value in generated.items():
        same(value, r.inputs[key])
    for chip in (0, 1):
        x, w, b = (generated[f"{n}@{chip}"] for n in ("x", "w", "b"))
        same(bf16(x), x)                                  # bf16 buffers get bf16 values
        same(held(w), w)                                  # mxfp4 ones values MXFP4 holds
        same(mm(x, w) + b, r.output("y", chip=chip))
    assert generated["i@0"].dtype == np.int32
    assert not np.array_equal(generated["x@0"], generated["x@1"])           # per chip
    again = compile_(src, mesh="2", seed=0).generate_inputs()
    other = compile_(src, mesh="2", seed=5).generate_inputs()
    same(generated["x@1"], again["x@1"])
    assert not np.array_equal(generated["x@0"], other["x@0"])
    same(other["x@0"], kernel.generate_inputs(5)["x@0"])
    # Given some inputs, the others are not generated: they start as zeros.
    r = kernel(x=generated["x@0"])
    same(np.zeros((8, 128), F32), r.output("y"))


# ------------------------------------------------------------- --inputs files and the CLI


MX_REF = """\
import numpy as np


def reference(inputs, *, chips, cores_per_chip):
    out = {}
    for c in range(chips):
        x, w = inputs[f"x@{c}"], inputs[f"w@{c}"]
        acc = np.zeros((x.shape[0], w.shape[1]), np.float32)
        for k in range(x.shape[1]):
            acc = acc + x[:, k, None] * w[None, k, :]
        out[f"y@{c}"] = acc
    return out
"""


@pytest.fixture
def mx_program(tmp_path):
    (tmp_path / "ref.py").write_text(MX_REF)
    (tmp_path / "prog.mk").write_text('reference "ref.py:reference";\n' + MX_PLAIN)
    return tmp_path / "prog.mk"


def _cli(capsys, *argv):
    from mkemu.cli import main

    code = main(["run", *map(str, argv), "--hw", "test"])
    out, err = capsys.readouterr()
    return code, out, err


def test_inputs_file_through_the_api_and_the_cli(mx_program, tmp_path, capsys):
    x, w0, w1 = normal(8, 64), np.random.default_rng(1).standard_normal((64, 128)), normal(64, 128)
    npz = tmp_path / "in.npz"
    np.savez(npz, x=x, **{"w@0": w0, "w@1": w1})
    kernel = mkemu.compile(str(mx_program), hw="test", mesh="2")
    r = kernel(str(npz))
    same(mm(bf16(x), held(w0)), r.output("y", chip=0))
    same(mm(bf16(x), held(w1)), r.output("y", chip=1))
    assert r.check() is None
    trace = tmp_path / "out.mkt"
    code, out, err = _cli(capsys, mx_program, "--mesh", "2", "--inputs", npz, "--json", "--trace", trace)
    assert code == 0, err
    report = json.loads(out)
    assert report["bit_exact"] is True and report["cycles"] == r.report.cycles
    from mkemu.tools.trace_reader import read_trace

    assert read_trace(str(trace)).end_cycle == r.report.cycles             # the file mkemu run wrote


def test_a_wrong_reference_fails_the_cli_run(mx_program, tmp_path, capsys):
    (tmp_path / "ref.py").write_text(MX_REF.replace("acc = acc + x", "acc = acc - x"))
    code, out, err = _cli(capsys, mx_program, "--mesh", "1")
    assert code == 1 and out.startswith("FAIL: y on chip 0 differs at index"), out


@pytest.mark.parametrize("arrays, message", [
    ({"q": np.zeros(3)}, "in.npz: q: error: no buffer named 'q'"),
    ({"x@2": np.zeros((8, 64))}, "in.npz: x@2: error: "),
    ({"x": np.zeros((64, 8))}, "in.npz: x: error: buffer x"),
    ({"w": np.zeros((64, 130))}, "in.npz: w: error: buffer w"),
    ({"x": np.zeros((8, 64)), "w@0": np.zeros((64, 128), np.int64) + 2}, None),
])
def test_bad_inputs_files_are_one_line_cli_errors(mx_program, tmp_path, capsys, arrays, message):
    npz = tmp_path / "in.npz"
    np.savez(npz, **arrays)
    code, out, err = _cli(capsys, mx_program, "--mesh", "2", "--inputs", npz)
    if message is None:   # integers for a float buffer are numbers; w@1, not given, is zeros for both sides
        assert code == 0 and out.startswith("PASS"), (out, err)
        return
    assert code == 1 and out == "", out
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line, err
    assert line.startswith(f"{npz}: ") and message.split(": ", 1)[1] in line, err


def test_cli_errors_are_one_line_without_a_traceback(mx_program, tmp_path):
    # A real process: a compile error names file:line:col, an inputs file that is not
    # there is one line; both exit 1.
    bad = tmp_path / "bad.mk"
    bad.write_text(MX_PLAIN.replace("param K = 64;", "param K = 48;"))
    mkemu_cmd = [sys.executable, "-c", "import sys; from mkemu.cli import main; sys.exit(main())"]
    done = subprocess.run([*mkemu_cmd, "run", str(bad), "--hw", "test"], capture_output=True, text=True)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"{bad}:5:42: error: "), done.stderr
    done = subprocess.run([*mkemu_cmd, "run", str(mx_program), "--hw", "test", "--inputs", str(tmp_path / "no.npz")],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "no.npz" in done.stderr, done.stderr
