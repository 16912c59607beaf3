"""What instructions do, in the form the emulator's compiled issue loop runs.

The instruction table (`table.py`) gives each row an `exec` clause: a few Python
statements over the core's state arrays and the row's operands. Those statements
call the helpers below. Every helper is plain Python written in the subset numba
compiles (scalars, loops, numpy arrays, no objects), so the emulator can compile
the whole issue loop with them, and the same code also runs uncompiled
(NUMBA_DISABLE_JIT=1) for debugging.

The numeric helpers are a second, element-at-a-time implementation of the numeric
contract in `numerics.py` (which stays the definition the numpy references use);
tests/isa/test_semantics_numerics.py and tests/emulator/test_semantics.py prove them
bit-identical, including NaN, infinities, signed zeros and subnormals. The memory helpers implement vector tile loads and
stores with the exact bounds and alignment checks and fault reports of the ISA.

Faults: a helper that finds a problem stores a fault code and its numbers in the
`E` array (`fault`) and returns the code; the loop stops at once and the emulator
turns the code into a message naming the numbers (`FAULTS`).
"""

from __future__ import annotations

import math
from fractions import Fraction
from math import factorial

import numpy as np
from numba import njit
from numba.extending import register_jitable

# Plain Python functions that numba compiles into any jitted caller (the loop), with
# IEEE results instead of exceptions for float division by zero.
jitable = register_jitable(error_model="numpy")

# Helpers that loop over a whole register or tile are compiled on their own (njit),
# not inlined as source into the issue loop: small functions vectorise well.
compiled = njit(error_model="numpy", nogil=True)

ROWS, LANES = 8, 128
TILE = ROWS * LANES

# --- faults -------------------------------------------------------------------
# code -> (kind, message template over the fault's numbers a, b, c, d)
FAULTS = {
    1: ("out-of-bounds", "{name} access [{a}, {b}) is outside {name} of {c} bytes"),
    2: ("misaligned", "{name} address {a} / stride {b} not {c}-byte aligned"),
    3: ("misaligned", "SMEM address {a} is not 4-byte aligned"),
    4: ("out-of-bounds", "SMEM access at {a} is outside SMEM of {b} bytes"),
    5: ("divide-by-zero", "{op} by zero (s{a} = 0)"),
    6: ("divide-by-zero", "{op} by zero (immediate 0)"),
    7: ("bad-branch", "branch target {a} is past the end of the kernel ({b} instructions)"),
    8: ("bad-operand", "lane index {a} >= 128"),
    9: ("bad-operand", "sublane index {a} >= 8"),
    10: ("bad-operand", "vcol block {a} is beyond lane 127"),
    11: ("bad-operand", "element index {a} is outside 0..1023"),
    12: ("bad-operand", "weight tile shape {a}x{b} does not fit the {c}x{c} matrix unit "
                        "(rows must be 1 to {c}, columns a multiple of 128 from 128 to {c})"),
    13: ("bad-operand", "mxu.mac on x{a} before any weight tile was loaded"),
    14: ("illegal-instruction", "{problem}"),
    15: ("bad-region", "mark.pop without a matching mark.push"),
    16: ("bad-region", "regions nested deeper than {a}"),
}
E_OOB, E_ALIGN, E_SMEM_ALIGN, E_SMEM_OOB, E_DIV_REG, E_DIV_IMM, E_BRANCH = 1, 2, 3, 4, 5, 6, 7
E_LANE, E_SUBLANE, E_VCOL, E_ELEMENT, E_WSHAPE, E_NOWEIGHTS, E_ILLEGAL = 8, 9, 10, 11, 12, 13, 14
E_REGION_POP, E_REGION_DEEP = 15, 16


@jitable
def fault(E, code, a, b, c, d):
    E[0] = code
    E[1] = a
    E[2] = b
    E[3] = c
    E[4] = d
    return code


# --- integers -----------------------------------------------------------------

@jitable
def w32(x):
    """Two's complement wraparound of an integer to int32."""
    x &= 0xFFFFFFFF
    return x - 0x100000000 if x >= 0x80000000 else x


@jitable
def idiv(a, b):
    """int32 division truncating toward zero (C); b != 0 (the caller faults first).
    The operands are the registers' 64-bit values (the result is wrapped by the
    caller), so -2^63 may occur: no abs() (it stays negative there), and no division
    of -2^63 by -1 (it traps); -(-2^63) wraps to -2^63, whose low 32 bits are those
    of 2^63."""
    if b == -1:
        return -a
    q = a // b
    if q * b != a and (a < 0) != (b < 0):
        q += 1
    return q


@jitable
def irem(a, b):
    return a - b * idiv(a, b)


# --- float32 elements -----------------------------------------------------------

# The element helpers below are branch-free (each side computed, then one picked):
# an early return stops LLVM vectorising the loop over a register that calls them.

@jitable
def f32_max(a, b):
    """`numerics.f32_max` for one element: max(+0, -0) = +0; a NaN operand gives a's
    NaN if a is NaN, else b's (its bits unchanged). (A NaN compares false: b is taken
    unless a is NaN; of equal values a is taken unless its sign bit is set.)"""
    take_a = (a > b) | ((a == b) & (np.float32(a).view(np.int32) >= 0)) | (a != a)
    return a if take_a else b


@jitable
def f32_min(a, b):
    """`numerics.f32_min` for one element: min(+0, -0) = -0, NaN as in f32_max."""
    take_a = (a < b) | ((a == b) & (np.float32(a).view(np.int32) < 0)) | (a != a)
    return a if take_a else b


@jitable
def bf16_round_bits(bits):
    """`numerics.bf16_round` on float32 bits (uint32 in, uint32 out): a NaN becomes the
    quiet NaN of its sign, anything else rounds to nearest even (the magnitude is
    rounded, so no sum wraps around 32 bits, even for the NaNs whose rounding is thrown
    away)."""
    bits = np.uint32(bits)
    mag = bits & np.uint32(0x7FFFFFFF)
    nan = ((bits >> np.uint32(16)) & np.uint32(0x8000) | np.uint32(0x7FC0)) << np.uint32(16)
    lsb = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = ((mag + lsb + np.uint32(0x7FFF)) & np.uint32(0x7FFF0000)) | (bits & np.uint32(0x80000000))
    return nan if mag > np.uint32(0x7F800000) else rounded


@jitable
def f32_to_i32(x):
    """float32 -> int32 truncating toward zero, saturating; NaN -> 0. In float32:
    every float32 below 2^31 truncates to an int32 exactly, 2147483520 is the largest
    of them, -2^31 the smallest int32."""
    x = np.float32(x)
    xs = x if x == x else np.float32(0.0)
    xs = xs if xs > np.float32(-2147483648.0) else np.float32(-2147483648.0)
    xs = xs if xs < np.float32(2147483520.0) else np.float32(2147483520.0)
    r = np.int32(xs)
    return np.int32(2147483647) if x >= np.float32(2147483648.0) else r


@jitable
def i32_to_f32(x):
    return np.float32(np.float64(x))


# --- transcendentals (float64 kernels of numerics.py, one element at a time) ----

# Arrays, not tuples: compiled code indexes a constant array directly.
_EXPM1 = np.array([float(Fraction(1, factorial(n))) for n in range(1, 15)])
_ATANH = np.array([float(Fraction(1, 2 * n + 1)) for n in range(12)])
_LN2 = float(Fraction(6931471805599453094172321214581765680755, 10**40))
_LN2_HI = math.ldexp(math.floor(math.ldexp(_LN2, 32)), -32)
_LN2_LO = float(Fraction(6931471805599453094172321214581765680755, 10**40) - Fraction(_LN2_HI))
_LOG2E = float(1 / Fraction(6931471805599453094172321214581765680755, 10**40))
_SQRT_HALF = math.sqrt(0.5)
_INF = math.inf


# Like the element helpers above, these compute every case and pick one at the end
# (no early return), so that the loops over a register calling them vectorise.

@jitable
def _scale2(m, k):
    """m * 2^k for m in [0.7, 1.42] (1 + expm1 of a reduced argument), as `math.ldexp`
    gives it wherever a float32 result can tell: exact while m * 2^k is a normal float64;
    below that the value rounds to float32 zero, above 2^200 to infinity, either way.
    The power of two, exact, is built from its bits: libm's ldexp costs more than the
    rest of exp, and a table of them needs a gather in a vectorised loop."""
    kc = min(max(k, -1021), 200)
    v = m * np.int64((kc + 1023) << 52).view(np.float64)
    v = 0.0 if k < -1021 else v
    return _INF if k > 200 else v


@jitable
def _expm1_small(r):
    acc = _EXPM1[13]
    for i in range(12, -1, -1):
        acc = acc * r + _EXPM1[i]
    return r * acc


@jitable
def _exp_f64(t):
    nan = t != t
    tc = min(max(0.0 if nan else t, -1500.0), 1500.0)
    k = np.rint(tc * _LOG2E)
    r = (tc - k * _LN2_HI) - k * _LN2_LO
    v = _scale2(1.0 + _expm1_small(r), int(k))
    return t if nan else v


@jitable
def _expm1_f64(t):
    """expm1: the series itself for |t| <= 0.34, else exp(t) - 1. (One series, on t or
    on exp's reduced argument: evaluating both and picking one does not vectorise.)"""
    nan = t != t
    small = abs(t) <= 0.34
    tc = min(max(0.0 if nan else t, -1500.0), 1500.0)
    k = np.rint(tc * _LOG2E)
    r = (tc - k * _LN2_HI) - k * _LN2_LO
    p = _expm1_small(t if small else r)
    big = _scale2(1.0 + p, int(k))
    big = t if nan else big
    return p if small else big - 1.0


@jitable
def _log_m(x):
    """(e, log(m)) for finite x > 0 with x = m 2^e, m in [sqrt(1/2), sqrt(2)). (m and e
    from x's bits, as `math.frexp` gives them for a normal float64, which any float32
    is: frexp is a call to libm, which stops the loop over a register vectorising.)"""
    bits = np.float64(x).view(np.int64)
    e = ((bits >> 52) & 0x7FF) - 1022
    m = np.int64((bits & 0x000FFFFFFFFFFFFF) | (1022 << 52)).view(np.float64)
    low = m < _SQRT_HALF
    m = m * 2.0 if low else m
    e = e - 1 if low else e
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    acc = _ATANH[11]
    for i in range(10, -1, -1):
        acc = acc * z + _ATANH[i]
    return float(e), 2.0 * s * acc


@jitable
def _log_special(x):
    """log's value where it is fixed: NaN and x < 0 -> NaN, 0 -> -inf, +inf -> +inf;
    0.5 (not a possible log value) marks "finite x > 0: compute it"."""
    r = _INF if x == _INF else 0.5
    r = -_INF if x == 0.0 else r
    return math.nan if (x != x) | (x < 0.0) else r


@jitable
def _sigmoid_f64(x):
    e = _exp_f64(-abs(x))
    pos = 1.0 / (1.0 + e)
    return pos if x >= 0.0 else e * pos


# A NaN argument comes back as itself, quieted (x + x), as the contract's numpy gives
# it; spelled out because the compiler may drop a float32 -> float64 -> float32 round
# trip, and with it the quieting, or reorder a product's NaN operands.

@jitable
def exp_f32(x):
    y = np.float32(_exp_f64(np.float64(x)))
    return x + x if x != x else y


@jitable
def exp2_f32(x):
    x64 = np.float64(x)
    xc = min(max(0.0 if x != x else x64, -1500.0), 1500.0)
    k = np.rint(xc)
    y = np.float32(_scale2(1.0 + _expm1_small((xc - k) * _LN2), int(k)))
    return x + x if x != x else y


# (log of 1.0 stands in for the special values, whose log is not computed but fixed)

@jitable
def log_f32(x):
    x64 = np.float64(x)
    special = _log_special(x64)
    e, lm = _log_m(x64 if special == 0.5 else 1.0)
    y = np.float32(e * _LN2 + lm)
    return np.float32(special) if special != 0.5 else y


@jitable
def log2_f32(x):
    x64 = np.float64(x)
    special = _log_special(x64)
    e, lm = _log_m(x64 if special == 0.5 else 1.0)
    y = np.float32(e + lm * _LOG2E)
    return np.float32(special) if special != 0.5 else y


@jitable
def rcp_f32(x):
    return np.float32(1.0) / x


@jitable
def sqrt_f32(x):
    return np.sqrt(x)


@jitable
def rsqrt_f32(x):
    # np.sqrt, not math.sqrt: the same NaN for x < 0 as numpy, and no exception uncompiled.
    return np.float32(np.float64(1.0) / np.sqrt(np.float64(x)))


@jitable
def sigmoid_f32(x):
    return np.float32(_sigmoid_f64(np.float64(x)))


@jitable
def silu_f32(x):
    x64 = np.float64(x)
    y = np.float32(x64 * _sigmoid_f64(x64))
    y = np.float32(-0.0) if x64 == -_INF else y
    return x + x if x != x else y


@jitable
def tanh_f32(x):
    x64 = np.float64(x)
    m = _expm1_f64(-2.0 * abs(x64))
    return np.float32(math.copysign(-m / (2.0 + m), x64))


def _row_of(fn):
    """A compiled loop applying fn to every element of a vector register (from a copy
    when vd == va: LLVM vectorises the loop only for rows that do not overlap)."""
    @compiled
    def row(VF, vd, va):
        src = VF[va].copy() if vd == va else VF[va]
        dst = VF[vd]
        for i in range(TILE):
            dst[i] = fn(src[i])
    return row


exp_row, log_row, exp2_row, log2_row = (_row_of(f) for f in (exp_f32, log_f32, exp2_f32, log2_f32))
rcp_row, rsqrt_row, sqrt_row = (_row_of(f) for f in (rcp_f32, rsqrt_f32, sqrt_f32))
sigmoid_row, tanh_row, silu_row = (_row_of(f) for f in (sigmoid_f32, tanh_f32, silu_f32))


# --- cross-lane -----------------------------------------------------------------
# Reductions in the contract's halving order (numerics.tree_sum_f32): while n > 1,
# x[i] = combine(x[i], x[i + n/2]) for i < n/2. `kind` 0 sum, 1 max, 2 min.

@jitable
def _add_f32(a, b):
    """a + b; where both are NaN, a's (quieted) in every pass and lane. x86 gives its
    first operand's NaN, but LLVM orders the operands of `+` as it likes (a payload is
    not part of the numeric contract, but the same program should give the same bits)."""
    total = a + b
    return a + a if a != a else total


@compiled
def reduce_f32(VF, vd, va, axis, kind):
    """Each pass combines a run of elements (a loop that vectorises); each element is
    combined with the same others, in the same order, as one lane at a time."""
    tmp = VF[va].copy()
    if axis == 1:
        n = LANES
        while n > 1:
            n //= 2
            for r in range(ROWS):
                row = tmp[r * LANES:(r + 1) * LANES]
                if kind == 0:
                    for i in range(n):
                        row[i] = _add_f32(row[i], row[i + n])
                elif kind == 1:
                    for i in range(n):
                        row[i] = f32_max(row[i], row[i + n])
                else:
                    for i in range(n):
                        row[i] = f32_min(row[i], row[i + n])
        _spread_lanes(VF, vd, tmp)
    else:
        n = ROWS
        while n > 1:
            n //= 2
            for r in range(n):
                lo = tmp[r * LANES:(r + 1) * LANES]
                hi = tmp[(r + n) * LANES:(r + n + 1) * LANES]
                if kind == 0:
                    for i in range(LANES):
                        lo[i] = _add_f32(lo[i], hi[i])
                elif kind == 1:
                    for i in range(LANES):
                        lo[i] = f32_max(lo[i], hi[i])
                else:
                    for i in range(LANES):
                        lo[i] = f32_min(lo[i], hi[i])
        _spread_rows(VF, vd, tmp)


@compiled
def reduce_i32(VI, vd, va, axis, kind):
    tmp = VI[va].copy()
    if axis == 1:
        n = LANES
        while n > 1:
            n //= 2
            for r in range(ROWS):
                row = tmp[r * LANES:(r + 1) * LANES]
                if kind == 0:
                    for i in range(n):
                        row[i] = row[i] + row[i + n]
                elif kind == 1:
                    for i in range(n):
                        row[i] = max(row[i], row[i + n])
                else:
                    for i in range(n):
                        row[i] = min(row[i], row[i + n])
        _spread_lanes(VI, vd, tmp)
    else:
        n = ROWS
        while n > 1:
            n //= 2
            for r in range(n):
                lo = tmp[r * LANES:(r + 1) * LANES]
                hi = tmp[(r + n) * LANES:(r + n + 1) * LANES]
                if kind == 0:
                    for i in range(LANES):
                        lo[i] = lo[i] + hi[i]
                elif kind == 1:
                    for i in range(LANES):
                        lo[i] = max(lo[i], hi[i])
                else:
                    for i in range(LANES):
                        lo[i] = min(lo[i], hi[i])
        _spread_rows(VI, vd, tmp)


@jitable
def _spread_lanes(V, vd, tmp):
    """Every lane of row r of V[vd] = tmp[r * LANES] (a lane reduction's result)."""
    dst = V[vd]
    for r in range(ROWS):
        value = tmp[r * LANES]
        row = dst[r * LANES:(r + 1) * LANES]
        for i in range(LANES):
            row[i] = value


@jitable
def _spread_rows(V, vd, tmp):
    """Every row of V[vd] = tmp[:LANES] (a sublane reduction's result)."""
    dst = V[vd]
    for r in range(ROWS):
        row = dst[r * LANES:(r + 1) * LANES]
        for i in range(LANES):
            row[i] = tmp[i]


# The permutes read each source element before anything can overwrite it when vd ==
# va, and copy whole rows (loops that vectorise).

@compiled
def bcast_index(V, vd, va, idx, axis, E):
    if axis == 1:
        if idx >= LANES:
            return fault(E, E_LANE, idx, 0, 0, 0)
        for r in range(ROWS):
            value = V[va, r * LANES + idx]
            row = V[vd, r * LANES:(r + 1) * LANES]
            for i in range(LANES):
                row[i] = value
    else:
        if idx >= ROWS:
            return fault(E, E_SUBLANE, idx, 0, 0, 0)
        src = V[va, idx * LANES:(idx + 1) * LANES]
        for r in range(ROWS):
            if vd == va and r == idx:
                continue        # (that row stays as it is)
            row = V[vd, r * LANES:(r + 1) * LANES]
            for i in range(LANES):
                row[i] = src[i]
    return 0


@compiled
def rotate(V, vd, va, amount, axis):
    """np.roll(va, amount, axis): vd[s, l] = va[s, (l - amount) mod 128] (lanes)."""
    src = V[va].copy() if vd == va else V[va]
    dst = V[vd]
    if axis == 1:
        k = amount % LANES
        for r in range(ROWS):
            s = src[r * LANES:(r + 1) * LANES]
            d = dst[r * LANES:(r + 1) * LANES]
            for i in range(LANES - k):
                d[k + i] = s[i]
            for i in range(k):
                d[i] = s[LANES - k + i]
    else:
        k = amount % ROWS
        for r in range(ROWS):
            f = (r - k) % ROWS
            s = src[f * LANES:(f + 1) * LANES]
            d = dst[r * LANES:(r + 1) * LANES]
            for i in range(LANES):
                d[i] = s[i]


@compiled
def column(V, vd, va, block, E):
    if block * ROWS >= LANES:
        return fault(E, E_VCOL, block, 0, 0, 0)
    # The values are row 0 of va: rows 7 .. 1 of vd first, then row 0 (read just before).
    for r in range(ROWS - 1, -1, -1):
        value = V[va, block * ROWS + r]
        row = V[vd, r * LANES:(r + 1) * LANES]
        for i in range(LANES):
            row[i] = value
    return 0


@jitable
def element_ok(index, E):
    if index < 0 or index >= TILE:
        return fault(E, E_ELEMENT, index, 0, 0, 0)
    return 0


# --- scalar memory --------------------------------------------------------------

@jitable
def smem_addr_ok(SMEM, addr, E):
    if addr % 4:
        return fault(E, E_SMEM_ALIGN, addr, 0, 0, 0)
    if addr < 0 or addr > SMEM.size - 4:
        return fault(E, E_SMEM_OOB, addr, SMEM.size, 0, 0)
    return 0


@jitable
def smem_load(SMEM32, addr):
    """The int32 word at aligned byte address addr (SMEM32: SMEM as 32-bit words)."""
    return w32(int(SMEM32[addr >> 2]))


@jitable
def smem_store(SMEM32, addr, value):
    SMEM32[addr >> 2] = value & 0xFFFFFFFF


@jitable
def smem_pair_ok(SMEM, addr, E):
    """Bounds and alignment of a 64-bit SMEM access: two words at addr, addr + 4."""
    if addr % 4:
        return fault(E, E_SMEM_ALIGN, addr, 0, 0, 0)
    if addr < 0 or addr > SMEM.size - 8:
        return fault(E, E_SMEM_OOB, addr, SMEM.size, 0, 0)
    return 0


@jitable
def smem_load_d(SMEM32, addr):
    """The 64-bit value at aligned byte address addr: the low word first."""
    return int(SMEM32[addr >> 2]) | (w32(int(SMEM32[(addr >> 2) + 1])) << 32)


@jitable
def smem_store_d(SMEM32, addr, value):
    SMEM32[addr >> 2] = value & 0xFFFFFFFF
    SMEM32[(addr >> 2) + 1] = (value >> 32) & 0xFFFFFFFF


# --- vector memory --------------------------------------------------------------
# Tiles are 8 rows of 128 elements (4-byte words, or bf16 widened to the high half
# of a word), row r at addr + r * stride. A mask known to be a rectangle of rows x
# lanes (from mrows; m0 is 8 x 128) touches only that rectangle, so only its bytes
# are bounds-checked; any other mask touches exactly its true elements.

@jitable
def _check(mem_size, lo, hi, E):
    if lo < 0 or hi > mem_size:
        return fault(E, E_OOB, lo, hi, mem_size, 0)
    return 0


@jitable
def _align(addr, stride, size, E):
    if addr % size or stride % size:
        return fault(E, E_ALIGN, addr, stride, size, 0)
    return 0


# Beyond every memory, and far enough inside int64 that no sum of the few terms of an
# address wraps around: an address (or span end) past it is reported at this bound.
_FAR = 1 << 62
# An address and a stride both inside +-_NEAR give spans exact in int64 (rows and row
# bytes are at most a few thousand): the usual case, checked with two comparisons.
_NEAR = 1 << 48


@jitable
def _saturate(value):
    """A float estimate of an address as an int64, clamped to -_FAR .. _FAR."""
    return int(max(min(value, float(_FAR)), -float(_FAR)))


@jitable
def _near(addr, stride):
    """Are both inside +-_NEAR, so that the span's ends are exact in int64?"""
    return -_NEAR < addr < _NEAR and -_NEAR < stride < _NEAR


@jitable
def rows_span(addr, stride, rows, row_bytes):
    """[lo, hi) of `rows` rows of `row_bytes` bytes, `stride` bytes apart. Where the
    exact span reaches past +-2^62 (a 64-bit address or stride from a register), its
    ends are clamped there instead of wrapping around int64 into some memory."""
    if _near(addr, stride):
        last = (rows - 1) * stride
        return addr + min(0, last), addr + max(0, last) + row_bytes
    last_f = float(rows - 1) * float(stride)
    return (_saturate(float(addr) + min(0.0, last_f)),
            _saturate(float(addr) + max(0.0, last_f) + float(row_bytes)))


@jitable
def vload(mem, mem16, mem32, V, M, MR, vd, addr, stride, mask, size, E):
    """vld: V[vd] = 8 rows at addr (words, or bf16 widened); masked-off elements load 0.
    mem16 and mem32 are the same bytes as mem, as 16- and 32-bit words."""
    err = _align(addr, stride, size, E)
    if err:
        return err
    rows, lanes = MR[mask, 0], MR[mask, 1]
    if rows >= 0:
        if rows and lanes:
            if stride == 0:
                lo, hi = rows_span(addr, 0, 1, lanes * size)
            else:
                lo, hi = rows_span(addr, stride, rows, lanes * size)
            err = _check(mem.size, lo, hi, E)
            if err:
                return err
        for r in range(ROWS):
            row = V[vd, r * LANES:(r + 1) * LANES]
            if r < rows:
                base = addr + r * stride
                if size == 4:
                    src32 = mem32[base >> 2:(base >> 2) + lanes]
                    for i in range(lanes):
                        row[i] = src32[i]
                else:
                    src16 = mem16[base >> 1:(base >> 1) + lanes]
                    for i in range(lanes):
                        row[i] = np.uint32(src16[i]) << np.uint32(16)
                row[lanes:] = 0
            else:
                row[:] = 0
        return 0
    lo, hi = _masked_span(M, mask, addr, stride, size)
    if hi > lo:
        err = _check(mem.size, lo, hi, E)
        if err:
            return err
    # (the checks passed: only now is V[vd] written; a masked-off element's address,
    # which may be anywhere, is never read)
    for r in range(ROWS):
        row = V[vd, r * LANES:(r + 1) * LANES]
        on = M[mask, r * LANES:(r + 1) * LANES]
        base = addr + r * stride
        if size == 4:
            for i in range(LANES):
                row[i] = mem32[(base >> 2) + i] if on[i] else np.uint32(0)
        else:
            for i in range(LANES):
                row[i] = np.uint32(mem16[(base >> 1) + i]) << np.uint32(16) if on[i] else np.uint32(0)
    return 0


@jitable
def _masked_span(M, mask, addr, stride, size):
    """[lo, hi) of the bytes of the elements `mask` selects. Within a row an element's
    address grows with its lane, so a row's first and last selected lanes bound it."""
    lo, hi = 1 << 62, -(1 << 62)
    near = _near(addr, stride)
    for r in range(ROWS):
        on = M[mask, r * LANES:(r + 1) * LANES]
        first, last = LANES, -1
        for i in range(LANES):      # (without branches: the loop vectorises)
            first = min(first, i if on[i] else LANES)
            last = max(last, i if on[i] else -1)
        if last < 0:
            continue
        for i in (first, last):
            if near:
                start = addr + r * stride + i * size
            else:
                # (far outside memory: the estimate, clamped, not the int64 wraparound)
                start = _saturate(float(addr) + float(r) * float(stride) + float(i * size))
            lo = min(lo, start)
            hi = max(hi, start + size)
    return lo, hi


@jitable
def vstore(mem, mem16, mem32, V, M, MR, va, addr, stride, mask, size, E):
    """vst: 8 rows to addr (bf16: rounded to nearest even); masked-off elements untouched.
    Where rows overlap, later rows win. A one-row buffer (stride 0) gets the last row."""
    err = _align(addr, stride, size, E)
    if err:
        return err
    rows, lanes = MR[mask, 0], MR[mask, 1]
    if rows >= 0 and (stride == 0 or stride >= lanes * size):
        if rows and lanes:
            first = rows - 1 if stride == 0 else 0
            step = stride if stride else lanes * size
            lo, hi = rows_span(addr, step, rows - first, lanes * size)
            err = _check(mem.size, lo, hi, E)
            if err:
                return err
            for r in range(first, rows):
                base = addr + (r - first) * step
                src = V[va, r * LANES:r * LANES + lanes]
                if size == 4:
                    dst32 = mem32[base >> 2:(base >> 2) + lanes]
                    for i in range(lanes):
                        dst32[i] = src[i]
                else:
                    dst16 = mem16[base >> 1:(base >> 1) + lanes]
                    for i in range(lanes):
                        dst16[i] = bf16_round_bits(src[i]) >> np.uint32(16)
        return 0
    lo, hi = _masked_span(M, mask, addr, stride, size)
    if hi <= lo:
        return 0
    err = _check(mem.size, lo, hi, E)
    if err:
        return err
    for r in range(ROWS):        # (in order: where rows overlap, later rows win)
        src = V[va, r * LANES:(r + 1) * LANES]
        on = M[mask, r * LANES:(r + 1) * LANES]
        base = addr + r * stride
        if size == 4:
            for i in range(LANES):
                if on[i]:
                    mem32[(base >> 2) + i] = src[i]
        else:
            for i in range(LANES):
                if on[i]:
                    mem16[(base >> 1) + i] = bf16_round_bits(src[i]) >> np.uint32(16)
    return 0


@jitable
def vtile_span(addr, stride, size):
    """The outer byte range a tile access may touch (the race check's footprint)."""
    return addr + min(0, 7 * stride), addr + max(0, 7 * stride) + 128 * size


@jitable
def mask_rect(M, MR, md, rows, lanes):
    """mrows: md = the elements with sublane < rows and lane < lanes; m0 is read-only."""
    if md:
        rows = min(max(rows, 0), ROWS)
        lanes = min(max(lanes, 0), LANES)
        for e in range(TILE):
            M[md, e] = 1 if e // LANES < rows and e % LANES < lanes else 0
        MR[md, 0] = rows
        MR[md, 1] = lanes


# --- matrix unit ----------------------------------------------------------------

@jitable
def wtile_shape(shape_value, d, E):
    """(rows, cols) of a weight-tile shape word (rows << 16 | cols), or a fault. Bits
    above the rows field count (a 64-bit register's high half is not ignored): they make
    rows too large, as does a negative word."""
    rows, cols = shape_value >> 16, shape_value & 0xFFFF
    if not (0 < rows <= d and 0 < cols <= d and cols % LANES == 0):
        fault(E, E_WSHAPE, rows, cols, d, 0)
        return 0, 0
    return rows, cols


@compiled
def load_weights(VMEM, VMEM16, MXWU, MXR, x, addr, step, rows, cols, transposed, E):
    """mxu.ldw / mxu.ldwt: the weight tile of matrix unit x from VMEM bf16 rows
    (MXWU: the weight tiles as bf16 bits, as in memory)."""
    err = _align(addr, step, 2, E)
    if err:
        return err
    lo, hi = rows_span(addr, step, rows, cols * 2)
    err = _check(VMEM.size, lo, hi, E)
    if err:
        return err
    W = MXWU[x]
    if transposed:
        # Memory row k becomes weight column k. Sixteen memory rows at a time are copied
        # into a block, then every weight row takes its 16 values from the block: one
        # value per weight row and memory row at a time (a cache line apiece) is 3x slower.
        block = np.empty((16, cols), np.uint16)
        for k0 in range(0, rows, 16):
            kn = min(16, rows - k0)
            for j in range(kn):
                at = (addr + (k0 + j) * step) >> 1
                src = VMEM16[at:at + cols]
                b = block[j]
                for n in range(cols):
                    b[n] = src[n]
            for n in range(cols):
                dst = W[n, k0:k0 + kn]
                for j in range(kn):
                    dst[j] = block[j, n]
        for n in range(cols):
            W[n, rows:] = 0
        MXR[x] = cols
        MXR[MXR.size // 2 + x] = rows
    else:
        for k in range(rows):
            src = VMEM16[(addr + k * step) >> 1:((addr + k * step) >> 1) + cols]
            dst = W[k]
            for n in range(cols):     # (not `dst[:cols] = src`: numba copies a source that
                dst[n] = src[n]       # may overlap the destination into a temporary first)
            dst[cols:] = 0     # (a slice assignment: a per-element loop here does not vectorise)
        MXR[x] = rows
        MXR[MXR.size // 2 + x] = cols
    return 0


# MXFP4 (OCP microscaling): a 4-bit e2m1 value (sign, 2 exponent bits with bias 1, 1
# mantissa bit) times the power of two of its block's 8-bit e8m0 scale (2^(e-127);
# 255 is NaN). The 16 e2m1 codes as float64:
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
MX_BLOCK = 32   # rows (the matmul's k) sharing one scale


@jitable
def mxfp4_bits(code, scale):
    """float32 bits of e2m1 `code` (0..15) times 2^(scale-127): exact in float64, then
    rounded once to float32 (2^128 and above overflow to inf); scale 255 gives the
    quiet NaN 0x7FC00000. Every finite result has at most 3 significant bits, so it is
    also exactly a bf16."""
    if scale == 255:
        return np.uint32(0x7FC00000)
    # (int: a uint8 scale byte minus 127 would wrap around in plain Python)
    value = np.float32(E2M1_VALUES[code] * _scale2(1.0, int(scale) - 127))
    return np.uint32(value.view(np.uint32))


@compiled
def load_weights_mx(VMEM, MXWU, MXR, x, addr, step, sc, rows, cols, E):
    """mxu.ldw.mx: the weight tile of matrix unit x from MXFP4 values and scales in VMEM."""
    half = cols // 2
    lo, hi = rows_span(addr, step, rows, half)
    err = _check(VMEM.size, lo, hi, E)
    if err:
        return err
    groups = (rows + MX_BLOCK - 1) // MX_BLOCK
    lo, hi = rows_span(sc, 2 * step, groups, cols)
    err = _check(VMEM.size, lo, hi, E)
    if err:
        return err
    table = np.empty((256, 16), np.uint16)   # scale byte -> the 16 codes' weights (bf16 bits)
    seen = np.zeros(256, np.bool_)
    for k in range(rows):
        src = VMEM[addr + k * step:addr + k * step + half]
        srow = sc + (k // MX_BLOCK) * 2 * step
        scales = VMEM[srow:srow + cols]
        if k % MX_BLOCK == 0:      # a new row of scales: their table rows first
            for n in range(cols):
                e = scales[n]
                if not seen[e]:
                    for c in range(16):
                        # (every MXFP4 weight is exactly a bf16: its low 16 bits are zero)
                        table[e, c] = np.uint16(mxfp4_bits(c, e) >> np.uint32(16))
                    seen[e] = True
        dst = MXWU[x, k]
        for h in range(half):      # (byte h: column 2h in its low half, 2h + 1 in its high)
            byte = src[h]
            dst[2 * h] = table[scales[2 * h], byte & 15]
            dst[2 * h + 1] = table[scales[2 * h + 1], byte >> 4]
        dst[cols:] = 0
    MXR[x] = rows
    MXR[MXR.size // 2 + x] = cols
    return 0


@compiled
def push_lhs(V, MXLU, x, va, chunk):
    """mxu.push: stage va, rounded to bf16, as LHS columns chunk*128 ... (MXLU: bits)."""
    for r in range(ROWS):
        src = V[va, r * LANES:(r + 1) * LANES]
        dst = MXLU[x, r, chunk * LANES:(chunk + 1) * LANES]
        for i in range(LANES):
            dst[i] = bf16_round_bits(src[i])


@compiled
def mac(MXWU, MXL, MXA, MXR, x, acc, zero, E):
    """mxu.mac: acc = (zero ? 0 : acc) + LHS @ W, each output summing its products in
    increasing k (the contract's order; `numerics.mxu_matmul`). The weights are bf16
    bits (MXWU): four rows at a time are widened into a float32 buffer, and every pair
    of LHS rows takes those four (one load of a weight feeds two products; one load
    and store of an output, four products).

    `MXR` holds each unit's loaded weight rows, then its loaded columns: the columns
    past those are +0.0, and adding a finite value times +0.0 (a signed zero) to an
    accumulator leaves it as it was, except that -0.0 becomes +0.0 once a product is
    +0.0 (an LHS value with its sign bit clear). So those columns are computed only
    for a pair of rows with an LHS value that is inf or NaN (inf * 0 is NaN)."""
    rows = MXR[x]
    if rows == 0:
        return fault(E, E_NOWEIGHTS, x, 0, 0, 0)
    out = MXA[x, acc]
    if zero:
        out[:] = 0.0
    lhs = MXL[x]
    bits = lhs.view(np.uint32)
    W = MXWU[x]
    d = W.shape[1]
    cols = MXR[MXR.size // 2 + x]
    pairs = ROWS // 2
    ends = np.empty(pairs, np.int64)    # per pair of rows: the columns it computes
    plus = np.empty(ROWS, np.bool_)     # per row: has an LHS value with its sign bit clear
    widest = cols
    for p in range(pairs):
        special = 0
        for r in range(2 * p, 2 * p + 2):
            row = bits[r]
            positive = 0
            for k in range(rows):    # (counts without branches: the loop vectorises)
                v = row[k]
                special += (v & 0x7F800000) == 0x7F800000    # inf or NaN
                positive += v < 0x80000000
            plus[r] = positive > 0
        ends[p] = cols if special == 0 else d
        widest = max(widest, ends[p])
    buf = np.empty((4, d), np.uint32)
    wf = buf.view(np.float32)
    k = 0
    while k < rows:
        g = min(4, rows - k)
        for j in range(g):
            src = W[k + j]
            dst = buf[j]
            for n in range(widest):
                dst[n] = np.uint32(src[n]) << np.uint32(16)
        if g == 4:
            # Each output takes the four products in increasing k (Python's `+` is
            # left-associative and nothing may reassociate it).
            w0, w1, w2, w3 = wf[0], wf[1], wf[2], wf[3]
            for p in range(pairs):
                o0 = out[2 * p]
                o1 = out[2 * p + 1]
                a0 = lhs[2 * p]
                a1 = lhs[2 * p + 1]
                b0, b1, b2, b3 = a0[k], a0[k + 1], a0[k + 2], a0[k + 3]
                c0, c1, c2, c3 = a1[k], a1[k + 1], a1[k + 2], a1[k + 3]
                for n in range(ends[p]):
                    x0, x1, x2, x3 = w0[n], w1[n], w2[n], w3[n]
                    o0[n] = o0[n] + b0 * x0 + b1 * x1 + b2 * x2 + b3 * x3
                    o1[n] = o1[n] + c0 * x0 + c1 * x1 + c2 * x2 + c3 * x3
        else:
            for j in range(g):
                w = wf[j]
                for p in range(pairs):
                    o0 = out[2 * p]
                    o1 = out[2 * p + 1]
                    av0 = lhs[2 * p, k + j]
                    av1 = lhs[2 * p + 1, k + j]
                    for n in range(ends[p]):
                        wv = w[n]
                        o0[n] = o0[n] + av0 * wv
                        o1[n] = o1[n] + av1 * wv
        k += g
    for r in range(ROWS):
        if plus[r]:
            o = out[r]
            for n in range(ends[r // 2], d):
                if o[n] == 0.0:
                    o[n] = 0.0
    return 0


@compiled
def pop_acc(V, MXAU, vd, x, acc, chunk):
    """mxu.pop: V[vd] = accumulator columns chunk*128 ... (MXAU: accumulator bits)."""
    for r in range(ROWS):
        src = MXAU[x, acc, r, chunk * LANES:(chunk + 1) * LANES]
        dst = V[vd, r * LANES:(r + 1) * LANES]
        for i in range(LANES):
            dst[i] = src[i]
