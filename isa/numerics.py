"""The numeric contract: the one definition of how numbers are rounded and combined.

Both the emulator (vector and matrix instructions) and the independent numpy
references of kernels call these functions, so they must give the same bits on every
machine. Everything here is vectorised numpy built only from operations IEEE 754
defines exactly: + - * / sqrt, comparisons, conversions, ldexp/frexp, rint/trunc
and integer bit manipulation. No libm transcendental (np.exp, np.log, np.tanh, ...)
is used, because those differ between libm/SVML builds. Transcendentals are
evaluated in float64 with a range reduction and a fixed polynomial, then rounded
once to float32. No fused multiply-add anywhere. See docs/numerics.md.
"""

from __future__ import annotations

from fractions import Fraction
from math import factorial

import numpy as np

__all__ = [
    "MAX_ULP_ERROR",
    "bf16_bits_to_f32",
    "bf16_round",
    "exp",
    "exp2",
    "f32_max",
    "f32_min",
    "f32_to_bf16_bits",
    "f32_to_i32",
    "i32_div",
    "i32_rem",
    "i32_to_f32",
    "i32_wrap",
    "log",
    "log2",
    "mxfp4_decode",
    "mxfp4_encode",
    "mxfp4_from_bytes",
    "mxfp4_nbytes",
    "mxfp4_to_bytes",
    "mxu_matmul",
    "mxu_matmul_numpy",
    "reciprocal",
    "rsqrt",
    "sigmoid",
    "silu",
    "sqrt",
    "tanh",
    "to_f32",
    "tree_max_f32",
    "tree_min_f32",
    "tree_sum_f32",
]

# Guaranteed bound, in float32 ulps of the true value, for each function. The tests
# check it over sweeps and hypothesis; the measured maxima are in docs/numerics.md.
# 0.5 means correctly rounded.
MAX_ULP_ERROR: dict[str, float] = {
    "exp": 1.0,
    "exp2": 1.0,
    "log": 1.0,
    "log2": 1.0,
    "tanh": 1.0,
    "sigmoid": 1.0,
    "silu": 1.0,
    "rsqrt": 1.0,
    "reciprocal": 0.5,
    "sqrt": 0.5,
}

_F32 = np.float32
_F64 = np.float64


def to_f32(x) -> np.ndarray:
    """`x` as a float32 array; wider floats are rounded to nearest even (IEEE cast)."""
    return np.asarray(x).astype(_F32, copy=False)


def _f32_bits(x) -> np.ndarray:
    """The float32 bit patterns of `x`, C-contiguous and of `x`'s shape (a scalar gives a
    0-d array: `np.ascontiguousarray` alone would make it 1-d)."""
    x = to_f32(x)
    return np.ascontiguousarray(x).reshape(x.shape).view(np.uint32)


# --------------------------------------------------------------------------- bf16


def f32_to_bf16_bits(x) -> np.ndarray:
    """Round float32 to bf16 (round to nearest, ties to even) and return the 16 bits:
    the high half of `bf16_round`'s result."""
    bits = _f32_bits(x)
    if bits.size >= _BF16_COMPILED_FROM:
        out = np.empty(bits.shape, np.uint16)
        _kernels()._round_bf16_loop(bits.reshape(-1), out.reshape(-1), 16)
        return out
    return (bf16_round(x).view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def bf16_bits_to_f32(b) -> np.ndarray:
    """Widen bf16 bit patterns (uint16) to float32. Exact: the bits become the high half."""
    b = np.asarray(b)
    if b.dtype != np.uint16:
        raise TypeError(f"bf16 bits must be uint16, got {b.dtype}")
    return (b.astype(np.uint32) << np.uint32(16)).view(_F32)


def bf16_round(x) -> np.ndarray:
    """Round float32 values to the nearest bf16 value (RNE); the result stays float32.

    Rounding works on the bit pattern: add 0x7FFF plus the lowest kept bit, then clear
    the low half. This is RNE for normals and subnormals, and carries the largest
    finite values over to infinity exactly as RNE does. NaN becomes the quiet NaN
    0x7FC0 (high half) with the input's sign (the same as ml_dtypes). Large arrays (a
    model's weights) take a compiled loop computing the same bits in one pass."""
    bits = _f32_bits(x)
    if bits.size >= _BF16_COMPILED_FROM:
        out = np.empty_like(bits)
        _kernels()._round_bf16_loop(bits.reshape(-1), out.reshape(-1), 0)
        return out.view(_F32)
    flat = bits.reshape(-1)     # (array arithmetic, also for a scalar: no scalar overflow warnings)
    rounded = (flat >> np.uint32(16)) & np.uint32(1)
    rounded += np.uint32(0x7FFF)
    rounded += flat
    rounded &= np.uint32(0xFFFF0000)
    is_nan = (flat & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if is_nan.any():
        quiet = ((flat >> np.uint32(16)) & np.uint32(0x8000) | np.uint32(0x7FC0)) << np.uint32(16)
        rounded = np.where(is_nan, quiet, rounded)
    return rounded.reshape(bits.shape).view(_F32)


_BF16_COMPILED_FROM = 1 << 16


def _round_bf16_loop(bits, out, shift):
    """out = the rounded float32 bits (shift 0), or their high half (shift 16), in one
    pass (compiled: `_kernels`)."""
    for i in range(bits.size):
        b = bits[i]
        if (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
            r = ((b >> np.uint32(16)) & np.uint32(0x8000) | np.uint32(0x7FC0)) << np.uint32(16)
        else:
            r = (((b >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF) + b) & np.uint32(0xFFFF0000)
        out[i] = r >> np.uint32(shift)


# ------------------------------------------------------------------------ MXFP4
# OCP Microscaling (MX) v1.0: MXFP4 stores 4-bit e2m1 elements in blocks of 32 that
# share one 8-bit e8m0 scale (a power of two, 2^(e-127); 255 is NaN). Here a matrix
# [K, N] used as matmul weights is blocked along K (the reduction): values[k, n // 2]
# holds (k, n) in its low nibble for even n and high nibble for odd n, and
# scales[k // 32, n] the scale of rows 32*(k//32) .. +31 of column n.

MX_BLOCK = 32
_E2M1_MAX_EXP = 2   # 6 = 1.5 * 2^2, the largest e2m1 value


def mxfp4_nbytes(rows: int, cols: int) -> tuple[int, int]:
    """Bytes of the values and of the scales of a [rows, cols] MXFP4 matrix."""
    return rows * cols // 2, -(-rows // MX_BLOCK) * cols


def mxfp4_decode(values, scales) -> np.ndarray:
    """The float32 [K, N] matrix stored as MXFP4 `values` (uint8 [K, N/2]) and `scales`
    (uint8 [ceil(K/32), N]): e2m1 times 2^(scale-127), exact in float64 and rounded
    once to float32 (2^128 and above overflow to inf: e2m1 values of 2 and more with
    scale 254); a scale of 255 gives the quiet NaN 0x7FC00000. Every finite weight has at most 3 significant bits, so it is also
    exactly a bf16 value and the matrix unit takes it unrounded."""
    import ml_dtypes

    values = np.asarray(values, np.uint8)
    scales = np.asarray(scales, np.uint8)
    rows, half = values.shape
    codes = np.empty((rows, 2 * half), np.uint8)
    codes[:, 0::2] = values & np.uint8(15)
    codes[:, 1::2] = values >> np.uint8(4)
    if scales.shape != (-(-rows // MX_BLOCK), 2 * half):
        raise ValueError(f"scales of shape {scales.shape} do not match values of shape {values.shape}")
    elems = codes.view(ml_dtypes.float4_e2m1fn).astype(_F64)
    block = np.repeat(scales, MX_BLOCK, axis=0)[:rows]
    power = np.ldexp(1.0, block.astype(np.int64) - 127)
    with np.errstate(over="ignore"):          # 2^128 and above are inf by the rule above
        out = (elems * power).astype(_F32)
    out[block == 255] = np.uint32(0x7FC00000).view(_F32)
    return out


def mxfp4_encode(w) -> tuple[np.ndarray, np.ndarray]:
    """Quantise a float32 [K, N] matrix to MXFP4 (for making weights; not part of any
    computed result): each block of 32 rows of a column takes the scale 2^(floor(log2
    of its largest magnitude) - 2), the OCP choice, and each element its nearest e2m1
    value after dividing by it (ties to even, saturating at 6; ml_dtypes' conversion)."""
    import ml_dtypes

    w = np.asarray(w, _F32)
    rows, cols = w.shape
    if cols % 2:
        raise ValueError(f"MXFP4 columns must be even, got {cols}")
    groups = -(-rows // MX_BLOCK)
    padded = np.zeros((groups * MX_BLOCK, cols), _F64)
    padded[:rows] = w
    amax = np.abs(padded.reshape(groups, MX_BLOCK, cols)).max(axis=1)
    _, exp = np.frexp(np.where(amax > 0, amax, 1.0))     # amax = m * 2^exp, m in [0.5, 1)
    shared = np.clip(exp - 1 - _E2M1_MAX_EXP, -127, 127)
    scales = (shared + 127).astype(np.uint8)
    scaled = padded / np.repeat(np.ldexp(1.0, shared), MX_BLOCK, axis=0)
    codes = scaled[:rows].astype(_F32).astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    # A NaN is -0 whatever its sign (ml_dtypes makes a negative NaN +0).
    codes[np.isnan(scaled[:rows])] = 0x8
    values = (codes[:, 0::2] | (codes[:, 1::2] << np.uint8(4))).astype(np.uint8)
    return values, scales


def mxfp4_to_bytes(w) -> np.ndarray:
    """An MXFP4 array [..., K, N] as it is stored (in HBM or a file): every matrix's values
    (row-major, K rows of N/2 bytes), then every matrix's scales (ceil(K/32) rows of N
    bytes), so a row of scales is twice as long as a row of values."""
    w = np.asarray(w, _F32)
    if w.ndim < 2:
        raise ValueError(f"an MXFP4 array needs at least 2 dimensions, got shape {w.shape}")
    mats = w.reshape(-1, *w.shape[-2:])
    parts = [mxfp4_encode(m) for m in mats]
    return np.concatenate([v.reshape(-1) for v, _ in parts] + [s.reshape(-1) for _, s in parts])


def mxfp4_from_bytes(raw, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 array of `shape` that `mxfp4_to_bytes` stored as `raw`."""
    raw = np.asarray(raw, np.uint8).reshape(-1)
    rows, cols = shape[-2:]
    count = int(np.prod(shape[:-2], dtype=np.int64))
    nv, ns = mxfp4_nbytes(rows, cols)
    if raw.size != count * (nv + ns):
        raise ValueError(f"{raw.size} bytes do not hold an MXFP4 array of shape {tuple(shape)}")
    values = raw[:count * nv].reshape(count, rows, cols // 2)
    scales = raw[count * nv:].reshape(count, -(-rows // MX_BLOCK), cols)
    return np.stack([mxfp4_decode(v, s) for v, s in zip(values, scales)]).reshape(shape)


# ------------------------------------------------------------- float64 kernels
#
# These work on float64 arrays and are accurate to a few float64 ulps, i.e. about
# 1e-15 relative: far below half a float32 ulp (6e-8), so rounding their result to
# float32 gives the correctly rounded value except when the true value lies within
# ~1e-15 relative of a rounding midpoint.

# Taylor coefficients of (exp(r) - 1) / r = sum_{n>=1} r^(n-1) / n!, n = 1..14.
# For |r| <= ln2/2 the first omitted term is < 2e-18 relative.
_EXPM1_COEFFS = tuple(float(Fraction(1, factorial(n))) for n in range(1, 15))
# Coefficients of atanh(s)/s = sum z^n / (2n+1), z = s^2, n = 0..11 (|s| <= 0.1716).
_ATANH_COEFFS = tuple(float(Fraction(1, 2 * n + 1)) for n in range(12))

# ln 2 split for Cody-Waite reduction: _LN2_HI has 32 significant bits, so k*_LN2_HI
# is exact for |k| < 2^21 and x - k*_LN2_HI is exact (Sterbenz).
_LN2 = float(Fraction(6931471805599453094172321214581765680755, 10**40))
_LN2_HI = float(np.ldexp(np.floor(np.ldexp(_LN2, 32)), -32))
_LN2_LO = float(Fraction(6931471805599453094172321214581765680755, 10**40) - Fraction(_LN2_HI))
_LOG2E = float(1 / Fraction(6931471805599453094172321214581765680755, 10**40))
_SQRT_HALF = float(np.sqrt(_F64(0.5)))


def _horner(r: np.ndarray, coeffs: tuple[float, ...]) -> np.ndarray:
    """sum coeffs[i] * r**i, by Horner's rule: separate multiply and add, no FMA."""
    acc = np.full_like(r, coeffs[-1])
    for c in coeffs[-2::-1]:
        acc = acc * r + c
    return acc


def _expm1_small(r: np.ndarray) -> np.ndarray:
    """exp(r) - 1 for |r| <= ln2/2 (accurate relative to the small result)."""
    return r * _horner(r, _EXPM1_COEFFS)


def _exp_f64(t: np.ndarray) -> np.ndarray:
    """exp(t) for float64 t: t = k ln2 + r, |r| <= ln2/2, exp(t) = 2^k (1 + expm1(r))."""
    nan = np.isnan(t)
    tc = np.where(nan, 0.0, np.clip(t, -1500.0, 1500.0))
    k = np.rint(tc * _LOG2E)
    r = (tc - k * _LN2_HI) - k * _LN2_LO
    out = np.ldexp(1.0 + _expm1_small(r), k.astype(np.int32))
    return np.where(nan, t, out)


def _expm1_f64(t: np.ndarray) -> np.ndarray:
    """exp(t) - 1 for float64 t; the Taylor path near 0 keeps relative accuracy."""
    small = np.abs(t) <= 0.34
    return np.where(small, _expm1_small(np.where(small, t, 0.0)), _exp_f64(t) - 1.0)


def _log_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For finite x > 0 (float64): (e, log(m)) with x = m 2^e, m in [sqrt(1/2), sqrt(2))."""
    m, e = np.frexp(x)
    low = m < _SQRT_HALF
    m = np.where(low, m * 2.0, m)
    e = np.where(low, e - 1, e).astype(_F64)
    f = m - 1.0  # exact (Sterbenz)
    s = f / (2.0 + f)  # log(m) = 2 atanh(s)
    log_m = 2.0 * s * _horner(s * s, _ATANH_COEFFS)
    return e, log_m


def _log_specials(x64: np.ndarray, finite_value: np.ndarray) -> np.ndarray:
    """Apply log's special cases: NaN and x<0 -> NaN, 0 -> -inf, +inf -> +inf."""
    out = np.where(x64 == 0.0, -np.inf, finite_value)
    out = np.where(x64 == np.inf, np.inf, out)
    return np.where((x64 < 0.0) | np.isnan(x64), np.nan, out)


def _sigmoid_f64(x64: np.ndarray) -> np.ndarray:
    """1/(1+exp(-x)); for x < 0 the product e * (1/(1+e)), e = exp(x), so nothing
    overflows (a product, not the quotient e/(1+e): numerics.md's order of rounding)."""
    e = _exp_f64(-np.abs(x64))
    pos = 1.0 / (1.0 + e)
    return np.where(x64 >= 0.0, pos, e * pos)


def _round_f32(y64: np.ndarray) -> np.ndarray:
    return y64.astype(_F32)


# ----------------------------------------------------------- transcendentals


def exp(x) -> np.ndarray:
    """e^x. Overflow (x > ~88.72) gives inf, underflow gives subnormals then 0."""
    with np.errstate(all="ignore"):
        return _round_f32(_exp_f64(to_f32(x).astype(_F64)))


def exp2(x) -> np.ndarray:
    """2^x; exact for integer x in range. x = k + f, |f| <= 1/2, 2^x = 2^k e^(f ln2)."""
    with np.errstate(all="ignore"):
        x64 = to_f32(x).astype(_F64)
        nan = np.isnan(x64)
        xc = np.where(nan, 0.0, np.clip(x64, -1500.0, 1500.0))
        k = np.rint(xc)
        f = xc - k  # exact
        y = np.ldexp(1.0 + _expm1_small(f * _LN2), k.astype(np.int32))
        return _round_f32(np.where(nan, x64, y))


def log(x) -> np.ndarray:
    """Natural log: log(m 2^e) = e ln2 + 2 atanh((m-1)/(m+1)). log(0) = -inf, log(<0) = NaN."""
    with np.errstate(all="ignore"):
        x64 = to_f32(x).astype(_F64)
        e, log_m = _log_parts(x64)
        return _round_f32(_log_specials(x64, e * _LN2 + log_m))


def log2(x) -> np.ndarray:
    """Base-2 log: e + log(m)/ln2; exact for powers of two."""
    with np.errstate(all="ignore"):
        x64 = to_f32(x).astype(_F64)
        e, log_m = _log_parts(x64)
        return _round_f32(_log_specials(x64, e + log_m * _LOG2E))


def reciprocal(x) -> np.ndarray:
    """1/x as one IEEE float32 division (correctly rounded); 1/±0 = ±inf."""
    with np.errstate(all="ignore"):
        return _F32(1.0) / to_f32(x)


def sqrt(x) -> np.ndarray:
    """IEEE float32 square root (correctly rounded); sqrt(-0) = -0, sqrt(<0) = NaN."""
    with np.errstate(all="ignore"):
        return np.sqrt(to_f32(x))


def rsqrt(x) -> np.ndarray:
    """1/sqrt(x): IEEE sqrt and division in float64, then one rounding to float32.

    rsqrt(+0) = +inf, rsqrt(-0) = -inf, rsqrt(<0) = NaN, rsqrt(inf) = 0.
    """
    with np.errstate(all="ignore"):
        return _round_f32(1.0 / np.sqrt(to_f32(x).astype(_F64)))


def sigmoid(x) -> np.ndarray:
    """1/(1+e^-x), computed in float64 without overflow, rounded once."""
    with np.errstate(all="ignore"):
        return _round_f32(_sigmoid_f64(to_f32(x).astype(_F64)))


def silu(x) -> np.ndarray:
    """x * sigmoid(x) with ONE rounding: the product is formed in float64 from the
    float64 sigmoid and only then rounded to float32 (not x * float32(sigmoid(x))).
    silu(-inf) = -0, silu(+inf) = +inf."""
    with np.errstate(all="ignore"):
        x64 = to_f32(x).astype(_F64)
        y = x64 * _sigmoid_f64(x64)
        return _round_f32(np.where(x64 == -np.inf, -0.0, y))


def tanh(x) -> np.ndarray:
    """tanh(x) = sign(x) * -m/(2+m), m = expm1(-2|x|); odd, tanh(±0) = ±0, saturates to ±1."""
    with np.errstate(all="ignore"):
        x64 = to_f32(x).astype(_F64)
        m = _expm1_f64(-2.0 * np.abs(x64))
        return _round_f32(np.copysign(-m / (2.0 + m), x64))


# ------------------------------------------------------------- fp32 min/max


def f32_max(a, b) -> np.ndarray:
    """Elementwise max with a fixed answer for every input: max(+0,-0) = +0, and if
    either operand is NaN the result is a NaN (a's if a is NaN, else b's)."""
    a, b = to_f32(a), to_f32(b)
    take_a = (a > b) | ((a == b) & ~np.signbit(a)) | np.isnan(a)
    return np.where(take_a & ~(np.isnan(b) & ~np.isnan(a)), a, b)


def f32_min(a, b) -> np.ndarray:
    """Elementwise min: min(+0,-0) = -0; NaN propagates like `f32_max`."""
    a, b = to_f32(a), to_f32(b)
    take_a = (a < b) | ((a == b) & np.signbit(a)) | np.isnan(a)
    return np.where(take_a & ~(np.isnan(b) & ~np.isnan(a)), a, b)


# ------------------------------------------------------------------ integers

_I32_MIN = -(2**31)
_I32_MAX = 2**31 - 1


def i32_wrap(x) -> np.ndarray:
    """Two's complement wraparound of integers to int32 (keep the low 32 bits)."""
    x = np.asarray(x, dtype=np.int64)
    return (x & np.int64(0xFFFFFFFF)).astype(np.uint32).view(np.int32)


def _check_divisor(b: np.ndarray) -> None:
    if np.any(b == 0):
        raise ValueError("integer division by zero: the caller must check divisors and fault first")


def i32_div(a, b) -> np.ndarray:
    """int32 quotient truncated toward zero (C semantics). INT_MIN / -1 wraps to INT_MIN."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    _check_divisor(b)
    q = np.abs(a) // np.abs(b)
    return i32_wrap(np.where((a < 0) != (b < 0), -q, q))


def i32_rem(a, b) -> np.ndarray:
    """int32 remainder of truncating division: a - b*trunc(a/b); sign follows a."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    _check_divisor(b)
    r = np.abs(a) % np.abs(b)
    return i32_wrap(np.where(a < 0, -r, r))


def f32_to_i32(x) -> np.ndarray:
    """float32 -> int32 truncating toward zero, saturating at the int32 limits; NaN -> 0."""
    x64 = to_f32(x).astype(_F64)
    t = np.clip(np.trunc(np.where(np.isnan(x64), 0.0, x64)), _I32_MIN, _I32_MAX)
    return t.astype(np.int32)


def i32_to_f32(x) -> np.ndarray:
    """int32 -> float32, round to nearest even (exact widening to float64, one rounding)."""
    return np.asarray(x, dtype=np.int32).astype(_F64).astype(_F32)


# ---------------------------------------------------------------- reductions


def _tree(x, axis: int, keepdims: bool, combine) -> np.ndarray:
    x = to_f32(x)
    axis = axis % x.ndim
    n = x.shape[axis]
    if n < 1 or n & (n - 1):
        raise ValueError(f"tree reduction needs a power-of-two length, axis {axis} has {n}")
    lead = (slice(None),) * axis
    with np.errstate(all="ignore"):     # IEEE results (inf + -inf is NaN), no warnings
        while n > 1:
            n //= 2
            x = combine(x[lead + (slice(0, n),)], x[lead + (slice(n, 2 * n),)])
    return x if keepdims else np.squeeze(x, axis)


def tree_sum_f32(x, axis: int = -1, keepdims: bool = False) -> np.ndarray:
    """Sum along `axis` by pairwise halving: while n > 1, x = x[:n/2] + x[n/2:] (float32).

    So element i is first added to element i + n/2, and so on; e.g. for 4 elements
    ((x0 + x2) + (x1 + x3)). n must be a power of two.
    """
    return _tree(x, axis, keepdims, np.add)


def tree_max_f32(x, axis: int = -1, keepdims: bool = False) -> np.ndarray:
    """Max along `axis` in the same halving order as `tree_sum_f32`, with `f32_max`."""
    return _tree(x, axis, keepdims, f32_max)


def tree_min_f32(x, axis: int = -1, keepdims: bool = False) -> np.ndarray:
    """Min along `axis` in the same halving order as `tree_sum_f32`, with `f32_min`."""
    return _tree(x, axis, keepdims, f32_min)


# --------------------------------------------------------------- matrix unit


def _mxu_operands(acc, a, w) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    acc, a, w = to_f32(acc), to_f32(a), to_f32(w)
    if acc.ndim != 2 or a.ndim != 2 or w.ndim != 2:
        raise ValueError(f"mxu_matmul wants 2-D operands, got acc {acc.shape}, a {a.shape}, w {w.shape}")
    (m, k), (k2, n) = a.shape, w.shape
    if k != k2 or acc.shape != (m, n):
        raise ValueError(f"mxu_matmul shapes do not fit: acc {acc.shape}, a {a.shape}, w {w.shape}")
    return np.array(acc, dtype=_F32, order="C"), np.ascontiguousarray(bf16_round(a)), np.ascontiguousarray(bf16_round(w))


def mxu_matmul_numpy(acc, a, w) -> np.ndarray:
    """The matrix-unit contract written as plain numpy; `mxu_matmul` must equal it bit for bit.

    a and w are rounded to bf16; then for k = 0..K-1 in order:
    acc = float32(acc + float32(a[:, k] outer w[k, :])). Returns a new array.
    """
    out, a16, w16 = _mxu_operands(acc, a, w)
    with np.errstate(all="ignore"):
        for k in range(a16.shape[1]):
            out = out + a16[:, k, None] * w16[None, k, :]
    return out


def _mxu_loop(out, a, w):
    """out += a @ w with the matrix unit's order (compiled: `_kernels`): n innermost, so
    each out[r, n] still sums its products in increasing k while the loop over n
    vectorises. No fastmath, so no FMA or reassociation."""
    rows, depth = a.shape
    cols = w.shape[1]
    for r in range(rows):
        for k in range(depth):
            av = a[r, k]
            for n in range(cols):
                out[r, n] = out[r, n] + av * w[k, n]


_compiled_kernels = None


def _kernels():
    """`_round_bf16_loop` and `_mxu_loop` compiled, on first use rather than at import.

    Their source goes into a module of the user cache directory (`mkemu.cache`), and
    numba keeps compiled code next to the module that defines it: there, never in the
    package (which may be read-only, or an install that should stay as installed)."""
    global _compiled_kernels
    if _compiled_kernels is None:
        import inspect
        import sys

        import numba

        from mkemu.cache import module_in_cache

        source = "\n\n".join(["import numpy as np\nfrom numba import njit"]
                             + [f"{inspect.getsource(fn)}\n{fn.__name__} = njit(cache=True, nogil=True)({fn.__name__})"
                                for fn in (_round_bf16_loop, _mxu_loop)])
        _compiled_kernels = module_in_cache("mkemu_numerics", source + "\n", numba.__version__, sys.version)
    return _compiled_kernels


def mxu_matmul(acc, a, w) -> np.ndarray:
    """acc (M,N) + bf16(a) (M,K) @ bf16(w) (K,N) with the matrix-unit accumulation order.

    Identical bits to `mxu_matmul_numpy`; products of two bf16 values are exact in
    float32 unless they fall below the float32 normal range. Returns a new array.
    """
    out, a16, w16 = _mxu_operands(acc, a, w)
    _kernels()._mxu_loop(out, a16, w16)
    return out


def mxu_matmul_bf16(acc, a, w) -> np.ndarray:
    """`mxu_matmul` for operands that already hold bf16 values (no rounding pass).

    Same bits as `mxu_matmul` whenever `a` and `w` are bf16-exact float32 arrays, as
    they are inside the matrix unit (push rounds, weight loads read bf16)."""
    out = np.array(acc, dtype=_F32, order="C")
    _kernels()._mxu_loop(out, np.ascontiguousarray(a, dtype=_F32), np.ascontiguousarray(w, dtype=_F32))
    return out

