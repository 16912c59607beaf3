"""Tests of the numeric contract (mkemu.isa.numerics).

libm functions (np.exp, ...) in float64 serve only as the "true value" here; the
module under test must not use them.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mkemu.isa import numerics as nm

F32_MAX = float(np.finfo(np.float32).max)
SPECIAL_BITS = np.array(
    [
        0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000,
        0x3F800000, 0xBF800000, 0x3F808000, 0x3F818000, 0x3F80C000, 0x3F807FFF,
        0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x7F800000, 0xFF800000,
        0x7F800001, 0xFF800001, 0x7FC00000, 0xFFC00000, 0x7FBFFFFF, 0xFFFFFFFF,
    ],
    dtype=np.uint32,
)
RNG_SEED = 20240611


def random_f32(count: int, seed: int = RNG_SEED) -> np.ndarray:
    """Random float32 bit patterns (all classes: subnormals, inf, NaN) plus the specials."""
    bits = np.random.default_rng(seed).integers(0, 2**32, size=count, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([bits, SPECIAL_BITS]).view(np.float32)


finite_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
any_f32 = st.floats(width=32)


# ------------------------------------------------------------------- bf16


def test_bf16_round_matches_ml_dtypes_on_random_bits():
    x = random_f32(200_000)
    ours = nm.f32_to_bf16_bits(x)
    with np.errstate(invalid="ignore"):
        theirs = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(ours, theirs)


def test_bf16_round_compiled_path_equals_the_numpy_path():
    x = random_f32(200_000)[:200_000].reshape(400, 500)   # large: the compiled one-pass loop
    pieces = np.concatenate([nm.bf16_round(row) for row in x])   # small: numpy
    assert nm.bf16_round(x).shape == x.shape
    np.testing.assert_array_equal(nm.bf16_round(x).reshape(-1).view(np.uint32), pieces.view(np.uint32))


@given(any_f32)
def test_bf16_round_matches_ml_dtypes_hypothesis(v):
    x = np.array([v], dtype=np.float32)
    assert nm.f32_to_bf16_bits(x)[0] == x.astype(ml_dtypes.bfloat16).view(np.uint16)[0]


def test_bf16_round_specials():
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, F32_MAX, -0.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8], np.float32)
    y = nm.bf16_round(x)
    assert y.dtype == np.float32
    assert np.isnan(y[0]) and np.isnan(y[1])
    assert y.view(np.uint32)[0] == 0x7FC00000 and y.view(np.uint32)[1] == 0xFFC00000
    assert list(y[2:5]) == [np.inf, -np.inf, np.inf]  # F32_MAX rounds up to inf under RNE
    assert np.signbit(y[5])
    assert y[6] == 1.0  # tie, even is 1.0
    assert y[7] == 1.0 + 4 * 2**-8  # tie, even is up


def test_bf16_bits_round_trip_is_exact():
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    widened = nm.bf16_bits_to_f32(bits)
    assert widened.dtype == np.float32
    np.testing.assert_array_equal(widened.view(np.uint32) >> 16, bits)
    not_nan = ~np.isnan(widened)
    np.testing.assert_array_equal(nm.f32_to_bf16_bits(widened)[not_nan], bits[not_nan])
    np.testing.assert_array_equal(nm.bf16_round(widened[not_nan]).view(np.uint32), widened[not_nan].view(np.uint32))


def test_bf16_bits_to_f32_rejects_other_dtypes():
    with pytest.raises(TypeError):
        nm.bf16_bits_to_f32(np.array([1], dtype=np.int32))


# --------------------------------------------------------- transcendentals


def ulp_error(got: np.ndarray, true: np.ndarray) -> np.ndarray:
    """|got - true| in float32 ulps of the true value (ulp = 2^(e-24), at least 2^-149)."""
    _, e = np.frexp(np.abs(true))
    ulp = np.maximum(np.ldexp(1.0, e - 24), 2.0**-149)
    return np.abs(got.astype(np.float64) - true) / ulp


def _sigmoid64(t):
    return np.where(t >= 0, 1.0 / (1.0 + np.exp(-t)), np.exp(t) / (1.0 + np.exp(t)))


# name -> (function, float64 truth, the input interval that matters)
CASES = {
    "exp": (nm.exp, np.exp, (-105.0, 89.0)),
    "exp2": (nm.exp2, np.exp2, (-151.0, 128.5)),
    "log": (nm.log, np.log, (0.0, 50.0)),
    "log2": (nm.log2, np.log2, (0.0, 50.0)),
    "tanh": (nm.tanh, np.tanh, (-10.0, 10.0)),
    "sigmoid": (nm.sigmoid, _sigmoid64, (-110.0, 20.0)),
    "silu": (nm.silu, lambda t: np.where(t == -np.inf, -0.0, t * _sigmoid64(t)), (-110.0, 20.0)),
    "rsqrt": (nm.rsqrt, lambda t: 1.0 / np.sqrt(t), (0.0, 1e4)),
    "reciprocal": (nm.reciprocal, lambda t: 1.0 / t, (-1e3, 1e3)),
    "sqrt": (nm.sqrt, np.sqrt, (0.0, 1e4)),
}


def sweep_inputs(lo: float, hi: float) -> np.ndarray:
    """A dense grid over the interesting interval, random bit patterns, and edge cases."""
    grid = np.linspace(lo, hi, 60_000, dtype=np.float64).astype(np.float32)
    small = np.geomspace(1e-40, 1.0, 5_000).astype(np.float32)
    near_one = (1.0 + np.arange(-2000, 2000) * 2.0**-23).astype(np.float32)
    return np.concatenate([grid, small, -small, near_one, random_f32(30_000)])


def check_against_truth(name: str, x: np.ndarray) -> float:
    """Assert specials agree with float64 truth and return the max ulp error on the rest."""
    fn, truth, _ = CASES[name]
    got = fn(x)
    assert got.dtype == np.float32 and got.shape == x.shape
    with np.errstate(all="ignore"):
        true = truth(x.astype(np.float64))
        true_f32 = true.astype(np.float32)
    # NaN exactly where the truth is NaN; where the truth is out of float32 range (or
    # infinite) the result is the same infinity; elsewhere measure the error.
    np.testing.assert_array_equal(np.isnan(got), np.isnan(true), err_msg=name)
    big = np.isinf(true_f32)
    np.testing.assert_array_equal(got[big], true_f32[big], err_msg=name)
    rest = ~np.isnan(true) & ~big
    err = ulp_error(got[rest], true[rest])
    worst = int(np.argmax(err)) if err.size else 0
    assert not err.size or err[worst] <= nm.MAX_ULP_ERROR[name], (
        f"{name}({x[rest][worst]!r}) = {got[rest][worst]!r}, true {true[rest][worst]!r}: {err[worst]} ulp"
    )
    return float(err.max()) if err.size else 0.0


@pytest.mark.parametrize("name", sorted(CASES))
def test_transcendental_sweep_within_bound(name):
    lo, hi = CASES[name][2]
    worst = check_against_truth(name, sweep_inputs(lo, hi))
    # What docs/numerics.md reports as measured: correctly rounded on the sweep.
    assert worst <= 0.5 + 1e-6, f"{name}: {worst} ulp"


@pytest.mark.parametrize("name", sorted(CASES))
@given(v=any_f32)
def test_transcendental_hypothesis_within_bound(name, v):
    check_against_truth(name, np.array([v], dtype=np.float32))


def test_transcendental_specials():
    inf, nan = np.inf, np.nan
    x = np.array([0.0, -0.0, inf, -inf, nan], dtype=np.float32)
    def bits(a):
        return list(np.asarray(a, np.float32).view(np.uint32))
    assert bits(nm.exp(x)[:4]) == bits([1.0, 1.0, inf, 0.0])
    assert bits(nm.exp2(x)[:4]) == bits([1.0, 1.0, inf, 0.0])
    assert bits(nm.log(x)[:3]) == bits([-inf, -inf, inf])
    assert np.isnan(nm.log(np.float32([-1.0, -inf, nan]))).all()
    assert bits(nm.log2(x)[:3]) == bits([-inf, -inf, inf])
    assert bits(nm.tanh(x)[:4]) == bits([0.0, -0.0, 1.0, -1.0])
    assert bits(nm.sigmoid(x)[:4]) == bits([0.5, 0.5, 1.0, 0.0])
    assert bits(nm.silu(x)[:4]) == bits([0.0, -0.0, inf, -0.0])
    assert bits(nm.rsqrt(x)[:3]) == bits([inf, -inf, 0.0])
    assert np.isnan(nm.rsqrt(np.float32([-1.0, -inf]))).all()
    assert bits(nm.reciprocal(x)[:4]) == bits([inf, -inf, 0.0, -0.0])
    for fn in (nm.exp, nm.exp2, nm.log, nm.log2, nm.tanh, nm.sigmoid, nm.silu, nm.rsqrt, nm.reciprocal, nm.sqrt):
        assert np.isnan(fn(x[4:]))[0]


def test_exact_cases():
    k = np.arange(-149, 128, dtype=np.float32)
    np.testing.assert_array_equal(nm.exp2(k), np.ldexp(np.float32(1.0), k.astype(np.int32)))
    np.testing.assert_array_equal(nm.log2(np.ldexp(np.float32(1.0), k.astype(np.int32))), k)
    assert nm.exp(np.float32([89.0]))[0] == np.inf
    assert nm.exp(np.float32([-104.0]))[0] == 0.0
    assert nm.exp(np.float32([-103.0]))[0] > 0.0  # subnormal result, not flushed
    tiny = np.float32([1e-42, -1e-42])
    np.testing.assert_array_equal(nm.tanh(tiny), tiny)


def test_transcendentals_keep_shape_and_accept_float64():
    x = np.linspace(-3, 3, 8 * 128).reshape(8, 128)
    for fn in (nm.exp, nm.tanh, nm.sigmoid, nm.silu):
        y = fn(x)
        assert y.shape == (8, 128) and y.dtype == np.float32
        np.testing.assert_array_equal(y, fn(x.astype(np.float32)))


# ------------------------------------------------------------------ min/max


@given(any_f32, any_f32)
def test_f32_max_min_fixed_answers(a, b):
    fa, fb = np.float32(a), np.float32(b)
    hi = nm.f32_max(np.float32([fa]), np.float32([fb]))[0]
    lo = nm.f32_min(np.float32([fa]), np.float32([fb]))[0]
    if np.isnan(fa) or np.isnan(fb):
        assert np.isnan(hi) and np.isnan(lo)
        return
    assert hi == max(fa, fb) and lo == min(fa, fb)
    if fa == 0 and fb == 0:
        assert np.signbit(hi) == (np.signbit(fa) and np.signbit(fb))
        assert np.signbit(lo) == (np.signbit(fa) or np.signbit(fb))


# ------------------------------------------------------------------ integers

i32 = st.integers(-(2**31), 2**31 - 1)


def py_trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def py_wrap(v: int) -> int:
    return (v + 2**31) % 2**32 - 2**31


@given(st.lists(st.integers(-(2**62), 2**62), min_size=1, max_size=20))
def test_i32_wrap(values):
    got = nm.i32_wrap(np.array(values, dtype=np.int64))
    assert got.dtype == np.int32
    assert [int(v) for v in got] == [py_wrap(v) for v in values]


@given(i32, i32.filter(lambda v: v != 0))
def test_i32_div_rem_truncate_toward_zero(a, b):
    q = int(nm.i32_div(np.int32([a]), np.int32([b]))[0])
    r = int(nm.i32_rem(np.int32([a]), np.int32([b]))[0])
    assert q == py_wrap(py_trunc_div(a, b))
    assert r == a - py_trunc_div(a, b) * b
    assert py_wrap(q * b + r) == a


def test_i32_div_edge_cases():
    a = np.int32([-(2**31), 7, -7, 7, -7])
    b = np.int32([-1, 2, 2, -2, -2])
    assert list(nm.i32_div(a, b)) == [-(2**31), 3, -3, -3, 3]
    assert list(nm.i32_rem(a, b)) == [0, 1, -1, 1, -1]
    with pytest.raises(ValueError):
        nm.i32_div(np.int32([1]), np.int32([0]))
    with pytest.raises(ValueError):
        nm.i32_rem(np.int32([1]), np.int32([0]))


def test_f32_to_i32_truncates_and_saturates():
    x = np.float32([1.9, -1.9, 0.5, -0.5, 2.0**31, -(2.0**31), 3e38, -3e38, np.inf, -np.inf, np.nan, 2147483520.0])
    assert list(nm.f32_to_i32(x)) == [1, -1, 0, 0, 2**31 - 1, -(2**31), 2**31 - 1, -(2**31), 2**31 - 1, -(2**31), 0, 2147483520]


@given(any_f32)
def test_f32_to_i32_hypothesis(v):
    got = int(nm.f32_to_i32(np.float32([v]))[0])
    if np.isnan(v):
        assert got == 0
    elif np.isinf(v):
        assert got == (2**31 - 1 if v > 0 else -(2**31))
    else:
        assert got == min(max(int(v), -(2**31)), 2**31 - 1)


@given(i32)
def test_i32_to_f32_round_to_nearest_even(v):
    got = nm.i32_to_f32(np.int32([v]))[0]
    assert got.dtype == np.float32
    assert got == np.float32(float(v))  # Python int->float is exact here; the cast is RNE
    # RNE by hand: nearest representable, ties to even significand.
    lo = np.float32(v)
    assert abs(int(got) - v) <= abs(int(np.nextafter(lo, np.float32(np.inf))) - v)


def test_i32_to_f32_ties():
    x = np.int32([2**24 + 1, 2**24 + 3, -(2**24 + 1), 2**31 - 1])
    assert list(nm.i32_to_f32(x)) == [2.0**24, 2.0**24 + 4, -(2.0**24), 2.0**31]


# ---------------------------------------------------------------- reductions


def loop_tree(values: list, combine) -> object:
    """The documented order, written as plain Python loops over scalars."""
    values = list(values)
    while len(values) > 1:
        half = len(values) // 2
        values = [combine(values[i], values[i + half]) for i in range(half)]
    return values[0]


def _py_max(a, b):
    return nm.f32_max(np.float32([a]), np.float32([b]))[0]


def _py_min(a, b):
    return nm.f32_min(np.float32([a]), np.float32([b]))[0]


@pytest.mark.parametrize("n", [1, 2, 4, 8, 128])
def test_tree_reductions_follow_documented_order(n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((3, n)) * 10.0 ** rng.integers(-8, 8, (3, n))).astype(np.float32)
    for row in range(3):
        want = loop_tree(x[row], lambda a, b: np.float32(np.float32(a) + np.float32(b)))
        assert nm.tree_sum_f32(x, axis=1)[row].view(np.uint32) == np.float32(want).view(np.uint32)
        assert nm.tree_max_f32(x, axis=1)[row] == loop_tree(x[row], _py_max)
        assert nm.tree_min_f32(x, axis=1)[row] == loop_tree(x[row], _py_min)


@given(hnp.arrays(np.float32, (8, 16), elements=any_f32))
def test_tree_sum_hypothesis_vs_loop_and_axes(x):
    over_sublanes = nm.tree_sum_f32(x, axis=0)
    over_lanes = nm.tree_sum_f32(x, axis=-1, keepdims=True)
    assert over_sublanes.shape == (16,) and over_lanes.shape == (8, 1)
    with np.errstate(all="ignore"):
        for col in range(16):
            want = np.float32(loop_tree(x[:, col], lambda a, b: np.float32(a + b)))
            got = over_sublanes[col]
            assert (np.isnan(got) and np.isnan(want)) or got.view(np.uint32) == want.view(np.uint32)
    maxes = nm.tree_max_f32(x, axis=0)
    assert np.array_equal(np.isnan(maxes), np.isnan(x).any(axis=0))


def test_tree_sum_order_is_observable():
    # (1e8 + -1e8) + (1 + 1) = 2, whereas a left-to-right sum would give 0.
    x = np.float32([1e8, 1.0, -1e8, 1.0])
    assert nm.tree_sum_f32(x, axis=0) == 2.0


def test_tree_rejects_non_power_of_two():
    with pytest.raises(ValueError, match="power-of-two"):
        nm.tree_sum_f32(np.zeros((8, 6), np.float32), axis=1)
    with pytest.raises(ValueError):
        nm.tree_max_f32(np.zeros((3,), np.float32), axis=0)


# --------------------------------------------------------------- matrix unit


def test_bf16_products_are_exact_in_f32():
    rng = np.random.default_rng(3)
    a = nm.bf16_round(rng.standard_normal(10_000).astype(np.float32))
    w = nm.bf16_round(rng.standard_normal(10_000).astype(np.float32))
    np.testing.assert_array_equal((a * w).astype(np.float64), a.astype(np.float64) * w.astype(np.float64))


def test_mxu_matmul_matches_numpy_version_and_definition():
    rng = np.random.default_rng(7)
    acc = rng.standard_normal((8, 128)).astype(np.float32)
    a = rng.standard_normal((8, 128)).astype(np.float32)
    w = rng.standard_normal((128, 128)).astype(np.float32)
    fast = nm.mxu_matmul(acc, a, w)
    slow = nm.mxu_matmul_numpy(acc, a, w)
    np.testing.assert_array_equal(fast.view(np.uint32), slow.view(np.uint32))
    # Scalar definition on a few elements.
    a16, w16 = nm.bf16_round(a), nm.bf16_round(w)
    for r, c in [(0, 0), (3, 77), (7, 127)]:
        s = acc[r, c]
        for k in range(128):
            s = np.float32(s + np.float32(a16[r, k] * w16[k, c]))
        assert s.view(np.uint32) == fast[r, c].view(np.uint32)
    assert not np.shares_memory(fast, acc)


@given(
    st.integers(1, 8).flatmap(
        lambda m: st.integers(1, 24).flatmap(
            lambda k: st.integers(1, 24).flatmap(
                lambda n: st.tuples(
                    hnp.arrays(np.float32, (m, n), elements=any_f32),
                    hnp.arrays(np.float32, (m, k), elements=any_f32),
                    hnp.arrays(np.float32, (k, n), elements=any_f32),
                )
            )
        )
    )
)
def test_mxu_numba_equals_numpy_hypothesis(ops):
    acc, a, w = ops
    fast = nm.mxu_matmul(acc, a, w)
    slow = nm.mxu_matmul_numpy(acc, a, w)
    same = (fast.view(np.uint32) == slow.view(np.uint32)) | (np.isnan(fast) & np.isnan(slow))
    assert same.all()


def test_mxu_keeps_subnormal_products():
    a = np.float32([[2.0**-70]])
    w = np.float32([[2.0**-70]])
    acc = np.zeros((1, 1), np.float32)
    assert nm.mxu_matmul(acc, a, w)[0, 0] == np.float32(2.0**-140)
    assert nm.mxu_matmul_numpy(acc, a, w)[0, 0] == np.float32(2.0**-140)


def test_mxu_shape_errors():
    with pytest.raises(ValueError, match="shapes"):
        nm.mxu_matmul(np.zeros((2, 3)), np.zeros((2, 4)), np.zeros((5, 3)))
    with pytest.raises(ValueError, match="2-D"):
        nm.mxu_matmul_numpy(np.zeros(3), np.zeros((2, 4)), np.zeros((4, 3)))


# --------------------------------------------------------------------------- MXFP4

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float64)


@given(hnp.arrays(np.float32, st.tuples(st.integers(1, 70), st.sampled_from([2, 4, 128])),
                  elements=st.floats(-2.0 ** 99, 2.0 ** 99, width=32)))
def test_mxfp4_encode_decode_round_trips_what_it_holds(w):
    values, scales = nm.mxfp4_encode(w)
    assert values.shape == (w.shape[0], w.shape[1] // 2) and scales.shape == (-(-w.shape[0] // 32), w.shape[1])
    decoded = nm.mxfp4_decode(values, scales)
    again = nm.mxfp4_decode(*nm.mxfp4_encode(decoded))   # what MXFP4 holds, it holds exactly
    assert np.array_equal(decoded.view(np.uint32), again.view(np.uint32))
    # Every weight is an e2m1 value times its block's power of two, and exactly a bf16.
    power = np.repeat(np.ldexp(1.0, scales.astype(np.int64) - 127), 32, axis=0)[:w.shape[0]]
    assert np.isin(np.abs(decoded / power), E2M1).all()
    assert np.array_equal(nm.bf16_round(decoded).view(np.uint32), decoded.view(np.uint32))


def test_mxfp4_decode_follows_ml_dtypes_and_the_special_scales():
    codes = np.arange(16, dtype=np.uint8)
    values = (codes[0::2] | (codes[1::2] << 4)).reshape(1, 8)          # one row, 16 columns
    for scale, expect in ((127, 1.0), (0, 2.0 ** -127), (130, 8.0)):   # 1, the smallest, 8
        got = nm.mxfp4_decode(values, np.full((1, 16), scale, np.uint8))
        want = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float64) * expect
        assert np.array_equal(got[0], want.astype(np.float32))
    top = nm.mxfp4_decode(values, np.full((1, 16), 254, np.uint8))
    assert np.isposinf(top[0, 4:8]).all() and np.isneginf(top[0, 12:]).all() and top[0, 3] == np.float32(1.5 * 2.0 ** 127)
    nan = nm.mxfp4_decode(values, np.full((1, 16), 255, np.uint8))
    assert (nan.view(np.uint32) == 0x7FC00000).all()


def test_mxfp4_bytes_hold_values_then_scales_of_every_matrix():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((3, 40, 256)).astype(np.float32)
    raw = nm.mxfp4_to_bytes(w)
    nv, ns = nm.mxfp4_nbytes(40, 256)
    assert raw.size == 3 * (nv + ns) == 3 * (40 * 128 + 2 * 256)
    v1, s1 = nm.mxfp4_encode(w[1])
    assert np.array_equal(raw[nv:2 * nv], v1.reshape(-1))
    assert np.array_equal(raw[3 * nv + ns:3 * nv + 2 * ns], s1.reshape(-1))
    back = nm.mxfp4_from_bytes(raw, w.shape)
    assert np.array_equal(back[2], nm.mxfp4_decode(*nm.mxfp4_encode(w[2])))
    with pytest.raises(ValueError, match="do not hold"):
        nm.mxfp4_from_bytes(raw[:-1], w.shape)
