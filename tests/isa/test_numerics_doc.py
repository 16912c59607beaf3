"""docs/numerics.md, claim by claim: the numeric contract as the page states it, checked
through the public functions of `mkemu.isa.numerics` and, where the page speaks of
kernels, through `.mk` programs run on the emulator."""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import mkemu
from mkemu.isa import numerics as nx

F32 = np.float32


def bits(x) -> np.ndarray:
    return np.asarray(x, F32).view(np.uint32)


def same_bits(a, b) -> bool:
    a, b = np.asarray(a, F32), np.asarray(b, F32)
    return a.shape == b.shape and bool(np.all((bits(a) == bits(b)) | (np.isnan(a) & np.isnan(b))))


# --------------------------------------------------------------------------- bf16

@pytest.mark.parametrize("value, high", [(1.3, 0x3FA6), (3.4028235e38, 0x7F80), (-0.0, 0x8000), (1e-40, 0x0001)])
def test_bf16_of_a_scalar_is_a_scalar(value, high):
    """Every function keeps its input's shape: a scalar in, a 0-d array out (one that
    int() and float() take), as the transcendentals already did."""
    rounded = nx.bf16_round(F32(value))
    packed = nx.f32_to_bf16_bits(F32(value))
    assert rounded.shape == () and rounded.dtype == F32
    assert packed.shape == () and packed.dtype == np.uint16
    assert int(packed) == high
    assert float(rounded) == float(np.uint32(high << 16).view(F32))
    assert nx.exp(F32(value)).shape == rounded.shape


def test_bf16_keeps_any_shape_and_layout():
    x = np.arange(24, dtype=F32).reshape(2, 3, 4) / 7
    for view in (x, x[:, ::2, 1:], x.T):
        assert nx.bf16_round(view).shape == view.shape
        assert np.array_equal(nx.f32_to_bf16_bits(view), view.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_bf16_nan_is_the_signed_quiet_nan():
    nans = np.array([0x7F800001, 0xFF800001, 0x7FBFFFFF, 0xFFFFFFFF, 0x7FC00000], np.uint32).view(F32)
    assert nx.f32_to_bf16_bits(nans).tolist() == [0x7FC0, 0xFFC0, 0x7FC0, 0xFFC0, 0x7FC0]
    assert int(nx.f32_to_bf16_bits(np.finfo(F32).max)) == 0x7F80       # float32 max -> inf


def test_a_float64_input_is_rounded_to_float32_first():
    x = 1 + 2.0 ** -8 + 2.0 ** -30          # f32: exactly the midpoint 1 + 2^-8, then even
    assert float(nx.bf16_round(x)) == 1.0
    assert float(np.float64(x).astype(ml_dtypes.bfloat16)) == 1 + 2.0 ** -7     # one rounding there


# ------------------------------------------------------------ min, max, integers

def test_min_max_signed_zero_in_either_order_and_nan():
    z, nz = F32(0.0), F32(-0.0)
    for a, b in ((z, nz), (nz, z)):
        assert bits(nx.f32_max(a, b)) == 0 and bits(nx.f32_min(a, b)) == 0x80000000
    assert np.isnan(nx.f32_max(F32(np.nan), F32(1))) and np.isnan(nx.f32_min(F32(-np.inf), F32(np.nan)))


# ----------------------------------------------------------------- transcendentals

def test_exp_and_exp2_overflow_and_underflow_thresholds():
    assert np.isfinite(nx.exp(F32(88.72283))) and np.isposinf(nx.exp(F32(88.72284)))
    assert nx.exp(F32(-103.97208)) > 0
    below = np.nextafter(F32(-103.97208), F32(-200))
    assert bits(nx.exp(below)) == 0
    assert np.isposinf(nx.exp2(F32(128))) and np.isfinite(nx.exp2(np.nextafter(F32(128), F32(0))))
    assert bits(nx.exp2(F32(-150))) == 0 and bits(nx.exp2(np.nextafter(F32(-150), F32(0)))) == 1


LN2_EXACT = Fraction(6931471805599453094172321214581765680755, 10**40)   # ln 2 to 40 digits


def _doc_exp64(x64):
    """exp as the table states it: clamp, k = rint(x * log2e), Cody-Waite, Taylor to r^14."""
    ln2 = LN2_EXACT
    hi = math.ldexp(math.floor(math.ldexp(float(ln2), 32)), -32)     # 32 significant bits
    lo = float(ln2 - Fraction(hi))                                    # the tail
    t = np.clip(x64, -1500.0, 1500.0)
    k = np.rint(t * float(1 / ln2))
    r = (t - k * hi) - k * lo
    p = np.full_like(r, 1 / math.factorial(14))
    for n in range(13, 0, -1):
        p = p * r + 1 / math.factorial(n)
    return np.ldexp(1.0 + r * p, k.astype(np.int32))


def test_sigmoid_silu_and_log2_follow_the_stated_operations():
    """The table's formulas, written from the page (multiply by log2e, e * (1/(1+e))),
    give the same float32 bits as the functions over a sweep of all float32."""
    x = np.arange(0, 2**32, 65_537, dtype=np.uint64).astype(np.uint32).view(F32)
    x = x[np.isfinite(x)]
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        e = _doc_exp64(-np.abs(x64))
        p = 1.0 / (1.0 + e)
        sig = np.where(x64 >= 0, p, e * p)
        assert same_bits(sig.astype(F32), nx.sigmoid(x))
        assert same_bits((x64 * sig).astype(F32), nx.silu(x))
        assert same_bits(_doc_exp64(x64).astype(F32), nx.exp(x))
        pos = x[x > 0]
        m, ex = np.frexp(pos.astype(np.float64))
        low = m < math.sqrt(0.5)
        m, ex = np.where(low, 2 * m, m), np.where(low, ex - 1, ex).astype(np.float64)
        f = m - 1.0
        s = f / (2.0 + f)
        q = np.full_like(s, 1 / 23)
        for n in range(10, -1, -1):
            q = q * (s * s) + 1 / (2 * n + 1)
        log_m = 2.0 * s * q
        assert same_bits((ex + log_m * float(1 / LN2_EXACT)).astype(F32), nx.log2(pos))
        assert same_bits((ex * float(LN2_EXACT) + log_m).astype(F32), nx.log(pos))


def test_silu_of_minus_inf_is_minus_zero_and_special_rows():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], F32)
    assert bits(nx.silu(x))[:4].tolist() == [0, 0x80000000, 0x7F800000, 0x80000000]
    assert bits(nx.sigmoid(x))[:4].tolist() == [bits(F32(0.5))] * 2 + [bits(F32(1.0)), 0]
    assert bits(nx.tanh(x))[:4].tolist() == [0, 0x80000000, bits(F32(1.0)), bits(F32(-1.0))]


# ----------------------------------------------------------------- matrix unit

def test_a_bf16_product_of_2_to_the_128_or_more_overflows():
    a = np.full((1, 2), 2.0 ** 64, F32)
    w = np.array([[2.0 ** 64], [-(2.0 ** 63)]], F32)
    for fn in (nx.mxu_matmul, nx.mxu_matmul_numpy):
        out = fn(np.zeros((1, 1), F32), a, w)
        assert np.isposinf(out[0, 0])          # inf + (-2^127) stays inf
    w = np.array([[2.0 ** 63], [2.0 ** 63]], F32)
    assert np.isposinf(nx.mxu_matmul(np.zeros((1, 1), F32), a, w)[0, 0])   # finite products, sum overflows
    assert nx.mxu_matmul(np.zeros((1, 1), F32), a[:, :1], w[:1])[0, 0] == F32(2.0 ** 127)


# ------------------------------------------------------------------------ MXFP4

def test_mxfp4_encode_clamps_the_scale_and_picks_one_for_zero_blocks():
    w = np.zeros((64, 4), F32)
    w[:32, 1] = 2.0 ** -130                # largest below 2^-125: scale 2^-127, rounds to 0
    w[:32, 2] = 1.75 * 2.0 ** -126         # still 2^-127: 3.5 -> 4 (ties to even)
    w[32:, 3] = 1.0
    values, scales = nx.mxfp4_encode(w)
    assert scales[:, 0].tolist() == [125, 125]      # all zero: 2^-2
    assert scales[0, 1] == 0 and scales[0, 2] == 0 and scales[1, 3] == 125
    decoded = nx.mxfp4_decode(values, scales)
    assert (decoded[:32, 1] == 0).all()
    assert (decoded[:32, 2] == F32(4 * 2.0 ** -127)).all()


def test_mxfp4_encode_of_non_finite_weights():
    w = np.ones((32, 2), F32)
    w[0, 0], w[0, 1] = np.nan, -np.inf
    values, scales = nx.mxfp4_encode(w)
    assert scales[0].tolist() == [125, 124]
    decoded = nx.mxfp4_decode(values, scales)
    assert bits(decoded[0, 0]) == 0x80000000 and decoded[0, 1] == F32(-0.75) and decoded[1, 1] == F32(0.75)


# --------------------------------------------------------------- through kernels

def _run(src: str, **inputs):
    return mkemu.compile_source(src, "numerics_doc.mk", hw="test", mesh="1x1x1")(**inputs)


def test_kernel_reductions_pad_with_plus_zero():
    """A .mk sum over 8 lanes is the tree over the row padded to 128 lanes with +0.0: a
    row of -0.0 sums to +0.0 (tree_sum_f32 of the 8 values would give -0.0); max and
    min keep -0.0."""
    src = """
kernel k(a: hbm f32[8, 8], s: hbm f32[8, 1], m: hbm f32[8, 1], n: hbm f32[8, 1]) {
    vmem av: f32[8, 8]; vmem sv: f32[8, 1]; vmem mv: f32[8, 1]; vmem nv: f32[8, 1];
    sem t;
    start copy(a, av, t); wait copy(a, av, t);
    sv = sum(av, axis=1); mv = max(av, axis=1); nv = min(av, axis=1);
    start copy(sv, s, t); wait copy(sv, s, t);
    start copy(mv, m, t); wait copy(mv, m, t);
    start copy(nv, n, t); wait copy(nv, n, t);
}
host { input a: f32[8, 8]; output s: f32[8, 1]; output m: f32[8, 1]; output n: f32[8, 1]; launch k(a, s, m, n); }
"""
    a = np.random.default_rng(3).standard_normal((8, 8)).astype(F32)
    a[0] = -0.0
    run = _run(src, a=a)
    padded = np.zeros((8, 128), F32)
    padded[:, :8] = a
    assert same_bits(run.output("s")[:, 0], nx.tree_sum_f32(padded, axis=1))
    assert bits(run.output("s")[0, 0]) == 0 and bits(nx.tree_sum_f32(a, axis=1)[0]) == 0x80000000
    assert same_bits(run.output("s")[1:, 0], nx.tree_sum_f32(a, axis=1)[1:])
    assert same_bits(run.output("m")[:, 0], nx.tree_max_f32(a, axis=1))
    assert same_bits(run.output("n")[:, 0], nx.tree_min_f32(a, axis=1))


def test_kernel_shifts_take_the_amount_modulo_32_and_arithmetic_wraps():
    src = """
kernel k(a: hbm i32[8, 128], b: hbm i32[8, 128], o: hbm i32[3, 8, 128]) {
    vmem av: i32[8, 128]; vmem bv: i32[8, 128]; vmem ov: i32[3][8, 128];
    sem t;
    start copy(a, av, t); wait copy(a, av, t);
    start copy(b, bv, t); wait copy(b, bv, t);
    ov[0] = av << bv;
    ov[1] = av >> bv;
    ov[2] = av * bv + av;
    for i in 0..3 { start copy(ov[i], o[i], t); wait copy(ov[i], o[i], t); }
}
host { input a: i32[8, 128]; input b: i32[8, 128]; output o: i32[3, 8, 128]; launch k(a, b, o); }
"""
    rng = np.random.default_rng(4)
    a = rng.integers(-2**31, 2**31, (8, 128), dtype=np.int64).astype(np.int32)
    b = np.tile(np.arange(-64, 64, dtype=np.int32), (8, 1))
    o = _run(src, a=a, b=b).output("o")
    A, B = a.astype(np.int64), b.astype(np.int64)
    assert np.array_equal(o[0], nx.i32_wrap(A << (B & 31)))
    assert np.array_equal(o[1], nx.i32_wrap(A >> (B & 31)))
    assert np.array_equal(o[2], nx.i32_wrap(nx.i32_wrap(A * B).astype(np.int64) + A))


def test_kernel_max_min_and_fp32_arithmetic_follow_the_contract():
    src = """
kernel k(a: hbm f32[8, 128], b: hbm f32[8, 128], c: hbm f32[8, 128], o: hbm f32[4, 8, 128]) {
    vmem av: f32[8, 128]; vmem bv: f32[8, 128]; vmem cv: f32[8, 128]; vmem ov: f32[4][8, 128];
    sem t;
    start copy(a, av, t); wait copy(a, av, t);
    start copy(b, bv, t); wait copy(b, bv, t);
    start copy(c, cv, t); wait copy(c, cv, t);
    ov[0] = max(av, bv);
    ov[1] = min(av, bv);
    ov[2] = av * bv + cv;
    ov[3] = av / bv;
    for i in 0..4 { start copy(ov[i], o[i], t); wait copy(ov[i], o[i], t); }
}
host { input a: f32[8, 128]; input b: f32[8, 128]; input c: f32[8, 128]; output o: f32[4, 8, 128];
       launch k(a, b, c, o); }
"""
    rng = np.random.default_rng(5)
    a, b, c = (rng.standard_normal((3, 8, 128)) * 10).astype(F32)
    sp = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 0.0], F32)
    a[0, :8], b[0, :8] = sp, sp[::-1]
    a[1, :8], b[1, :8] = sp, np.roll(sp, 1)
    a[2, :4], b[2, :4], c[2, :4] = 1 + 2.0 ** -12, 1 + 2.0 ** -12, -(1 + 2.0 ** -11)   # an FMA gives 2^-24
    a[3, :4], b[3, :4], c[3, :4] = 1e-20, 1e-20, 0.0                         # subnormal products kept
    o = _run(src, a=a, b=b, c=c).output("o")
    with np.errstate(all="ignore"):
        assert same_bits(o[0], nx.f32_max(a, b)) and same_bits(o[1], nx.f32_min(a, b))
        assert same_bits(o[2], a * b + c) and same_bits(o[3], a / b)
    assert (o[2][2, :4] == 0).all() and (o[2][3, :4] > 0).all()
