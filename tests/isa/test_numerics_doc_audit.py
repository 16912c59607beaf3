"""docs/numerics.md audited claim by claim (what tests/isa/test_numerics_doc.py does not
already hold): the page's tables read from the page itself, each stated rule through
the public functions of `mkemu.isa.numerics`, and the same bits from the emulator
running small `.mk` and `.s` programs."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import mkemu
from mkemu.errors import EmulatorFault, SourceError
from mkemu.isa import numerics as nx

from tests.test_api import MXFP4_KERNEL

F32 = np.float32
DOC = (Path(__file__).parents[2] / "docs" / "numerics.md").read_text()


def bits(x) -> np.ndarray:
    return np.asarray(x, F32).view(np.uint32)


def same_bits(a, b) -> bool:
    a, b = np.asarray(a, F32), np.asarray(b, F32)
    return a.shape == b.shape and bool(np.all((bits(a) == bits(b)) | (np.isnan(a) & np.isnan(b))))


def kernel(src: str, filename: str = "/tmp/numerics_audit.mk"):
    return mkemu.compile_source(src, filename=filename, hw="test", mesh="1")


def random_f32(shape, seed: int) -> np.ndarray:
    """Random bit patterns: every binade, subnormals, infinities and NaNs included."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32).view(F32)


# ------------------------------------------------------------------ the page's tables


def _table_rows(header: str) -> list[str]:
    start = DOC.index(header)
    rows = []
    for line in DOC[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_the_stated_bounds_are_max_ulp_error():
    stated = {}
    for row in _table_rows("| function | algorithm | stated bound | measured max |"):
        name = re.match(r"\| `(\w+)\(x\)`", row).group(1)
        bound = row.rstrip(" |").split("|")[-2].strip()
        stated[name] = float(bound.split()[0])
    assert stated == nx.MAX_ULP_ERROR


CELL = {"1": 1.0, "0.5": 0.5, "inf": np.inf, "−inf": -np.inf, "+0": 0.0, "−0": -0.0, "NaN": np.nan, "−1": -1.0}
SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -2.5], F32)


def test_the_special_values_table_as_printed():
    rows = _table_rows("| | `+0` | `-0` | `+inf` | `-inf` | NaN | `x < 0` |")
    assert len(rows) == 8
    checked = 0
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        names = re.findall(r"`(\w+)`", cells[0])
        for name in names:
            got = getattr(nx, name)(SPECIALS)
            for column, cell in enumerate(cells[1:7]):
                if cell in ("", "—"):
                    continue
                want = np.array(CELL[cell], F32)
                assert same_bits(got[column], want), (name, column, cell, got[column])
                checked += 1
    assert checked == 54


def test_the_overflow_and_underflow_column():
    # log of subnormals is exact in its reduction: log2 of a power of two is the exponent
    powers = np.ldexp(F32(1), np.arange(-149, 128)).astype(F32)
    assert np.array_equal(nx.log2(powers), np.arange(-149, 128).astype(F32))
    assert float(nx.log(F32(2.0**-149))) == float(F32(-149 * math.log(2)))
    # tiny x: tanh(x) is x (normal and subnormal), with its sign
    tiny = np.array([1e-30, -1e-30, 1e-45, -1e-40, 2.0**-126], F32)
    assert np.array_equal(bits(nx.tanh(tiny)), bits(tiny))
    # sigmoid underflows through the subnormals, silu of a large negative x is -0
    s = nx.sigmoid(np.array([-100, -103], F32))
    assert (s > 0).all() and (s < np.finfo(F32).tiny).all()
    assert bits(nx.sigmoid(F32(-104))) == 0
    assert (bits(nx.silu(np.array([-200, -1e30, -3e38], F32))) == 0x80000000).all()
    # exp underflows gradually: a subnormal just above the threshold
    assert 0 < nx.exp(F32(-103.0)) < np.finfo(F32).tiny


# ------------------------------------------------------------------------- bf16


def test_bf16_rounding_edges_and_ml_dtypes_over_a_sweep():
    edges = {0x7F7F8000: 0x7F80,   # the tie above the largest bf16: to even, which is inf
             0x7F7F7FFF: 0x7F7F,
             0x00008000: 0x0000,   # a subnormal tie: to even (0)
             0x00018000: 0x0002,   # ... (odd 1 rounds up to 2)
             0x3F808000: 0x3F80, 0x3F818000: 0x3F82,
             0xFF800001: 0xFFC0, 0x7F800001: 0x7FC0}
    x = np.array(list(edges), np.uint32).view(F32)
    assert nx.f32_to_bf16_bits(x).tolist() == list(edges.values())
    sweep = np.concatenate([np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32), x.view(np.uint32)])
    with np.errstate(invalid="ignore"):
        want = sweep.view(F32).astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(nx.f32_to_bf16_bits(sweep.view(F32)), want)
    assert np.array_equal(bits(nx.bf16_round(sweep.view(F32))), want.astype(np.uint32) << 16)
    b = np.arange(0, 2**16, dtype=np.uint32).astype(np.uint16)
    assert np.array_equal(bits(nx.bf16_bits_to_f32(b)), b.astype(np.uint32) << 16)     # exact widening


# ------------------------------------------------------------------- conversions


def test_conversion_table_examples():
    x = np.array([1.9, -1.9, np.nan, np.inf, -np.inf, 3e9, -3e9, 2147483520.0, -0.0], F32)
    assert nx.f32_to_i32(x).tolist() == [1, -1, 0, 2**31 - 1, -2**31, 2**31 - 1, -2**31, 2147483520, 0]
    assert nx.i32_to_f32(np.array([2**24 + 1, 2**24 + 3], np.int32)).tolist() == [2**24, 2**24 + 4]
    v = np.int32(2**24 + 2**16 + 1)
    assert float(nx.i32_to_f32(v)) == 2**24 + 2**16
    assert float(nx.bf16_round(nx.i32_to_f32(v))) == 2**24
    assert float(np.float64(v).astype(ml_dtypes.bfloat16)) == 2**24 + 2**17      # one rounding


CONVERT = """
kernel k(a: hbm f32[8, 128], n: hbm i32[8, 128], h: hbm bf16[8, 128], oi: hbm i32[8, 128],
         of: hbm f32[8, 128], ob: hbm bf16[2, 8, 128], ow: hbm f32[8, 128]) {
    vmem av: f32[8, 128]; vmem nv: i32[8, 128]; vmem hv: bf16[8, 128];
    vmem oiv: i32[8, 128]; vmem ofv: f32[8, 128]; vmem obv: bf16[2][8, 128]; vmem owv: f32[8, 128];
    sem t;
    start copy(a, av, t); wait copy(a, av, t);
    start copy(n, nv, t); wait copy(n, nv, t);
    start copy(h, hv, t); wait copy(h, hv, t);
    oiv = i32(av);
    ofv = f32(nv);
    obv[0] = bf16(av);
    obv[1] = bf16(nv);
    owv = f32(hv);
    start copy(oiv, oi, t); wait copy(oiv, oi, t);
    start copy(ofv, of, t); wait copy(ofv, of, t);
    for i in 0..2 { start copy(obv[i], ob[i], t); wait copy(obv[i], ob[i], t); }
    start copy(owv, ow, t); wait copy(owv, ow, t);
}
host { input a: f32[8, 128]; input n: i32[8, 128]; input h: bf16[8, 128]; output oi: i32[8, 128];
       output of: f32[8, 128]; output ob: bf16[2, 8, 128]; output ow: f32[8, 128];
       launch k(a, n, h, oi, of, ob, ow); }
"""


def test_kernel_conversions_give_the_functions_bits():
    a = random_f32((8, 128), 1).copy()
    a[0, :12] = [1.9, -1.9, np.nan, np.inf, -np.inf, 3e9, -3e9, 2147483520.0, -0.0, 1e-40, 3.4028235e38,
                 1 + 2.0**-8]
    a[1, :4] = np.array([0x7F800001, 0xFF800001, 0x7FBFFFFF, 0xFFFFFFFF], np.uint32).view(F32)
    rng = np.random.default_rng(2)
    n = rng.integers(-2**31, 2**31, (8, 128), dtype=np.int64).astype(np.int32)
    n[0, :4] = [2**24 + 1, 2**24 + 3, 2**24 + 2**16 + 1, -2**31]
    h = nx.bf16_bits_to_f32((rng.integers(0, 2**16, (8, 128)) & 0xBF7F).astype(np.uint16))   # finite bf16
    run = kernel(CONVERT)(a=a, n=n, h=h)
    with np.errstate(invalid="ignore"):
        assert np.array_equal(run.output("oi"), nx.f32_to_i32(a))
        assert np.array_equal(bits(run.output("of")), bits(nx.i32_to_f32(n)))
        ob = run.output("ob")
        assert np.array_equal(bits(ob[0]), bits(nx.bf16_round(a)))            # NaNs: 0x7FC0 / 0xFFC0
        assert [hex(b >> 16) for b in bits(ob[0])[1, :4]] == ["0x7fc0", "0xffc0", "0x7fc0", "0xffc0"]
        assert np.array_equal(bits(ob[0]) >> 16, a.astype(ml_dtypes.bfloat16).view(np.uint16))
        assert np.array_equal(bits(ob[1]), bits(nx.bf16_round(nx.i32_to_f32(n))))     # rounded twice
        assert ob[1][0, :3].tolist() == [2**24, 2**24, 2**24]
    assert np.array_equal(bits(run.output("ow")), bits(h))                  # loading bf16 is exact


# ----------------------------------------------------------------- transcendentals

FUNCS = ["exp", "log", "exp2", "log2", "sqrt", "rsqrt", "recip", "sigmoid", "tanh", "silu"]


def test_kernel_transcendentals_give_the_functions_bits():
    body = "\n".join(f"    ov[{i}] = {f}(av);" for i, f in enumerate(FUNCS))
    n = len(FUNCS)
    src = f"""
kernel k(a: hbm f32[8, 128], o: hbm f32[{n}, 8, 128]) {{
    vmem av: f32[8, 128]; vmem ov: f32[{n}][8, 128];
    sem t;
    start copy(a, av, t); wait copy(a, av, t);
{body}
    for i in 0..{n} {{ start copy(ov[i], o[i], t); wait copy(ov[i], o[i], t); }}
}}
host {{ input a: f32[8, 128]; output o: f32[{n}, 8, 128]; launch k(a, o); }}
"""
    a = random_f32((8, 128), 3).copy()
    a[0, :16] = [0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, 1e-45, -1e-45, 88.72284, -103.97208, 1e-40, 2.0,
                 0.5, -200, 128, -150]
    a[1] = np.random.default_rng(4).standard_normal(128) * 3
    out = kernel(src)(a=a).output("o")
    for i, name in enumerate(FUNCS):
        fn = nx.reciprocal if name == "recip" else getattr(nx, name)
        assert same_bits(out[i], fn(a)), name


def _sweep() -> np.ndarray:
    x = np.arange(0, 2**32, 65_521, dtype=np.uint64).astype(np.uint32).view(F32)
    return x[np.isfinite(x)]


def _expm1_taylor(r):
    p = np.full_like(r, 1 / math.factorial(14))
    for n in range(13, 0, -1):
        p = p * r + 1 / math.factorial(n)
    return r * p


def _exp64(t):
    """exp's float64 kernel as the table states it: k = rint(t log2e), Cody-Waite with a
    32-bit head of ln 2, the Taylor series to r^14, ldexp."""
    ln2 = Fraction(6931471805599453094172321214581765680755, 10**40)     # ln 2 to 40 digits
    hi = math.ldexp(math.floor(math.ldexp(float(ln2), 32)), -32)
    lo = float(ln2 - Fraction(hi))
    t = np.clip(t, -1500.0, 1500.0)
    k = np.rint(t * float(1 / ln2))
    r = (t - k * hi) - k * lo
    return np.ldexp(1.0 + _expm1_taylor(r), k.astype(np.int32))


def test_exp2_tanh_and_rsqrt_follow_the_stated_operations():
    x = _sweep()
    x64 = x.astype(np.float64)
    ln2 = math.log(2)          # the float64 nearest ln 2
    with np.errstate(all="ignore"):
        t = np.clip(x64, -1500.0, 1500.0)
        k = np.rint(t)
        exp2 = np.ldexp(1.0 + _expm1_taylor((t - k) * ln2), k.astype(np.int32))
        assert same_bits(exp2.astype(F32), nx.exp2(x))
        arg = -2.0 * np.abs(x64)
        small = np.abs(arg) <= 0.34
        big = _exp64(arg) - 1.0
        m = np.where(small, _expm1_taylor(np.where(small, arg, 0.0)), big)
        assert same_bits(np.copysign(-m / (2.0 + m), x64).astype(F32), nx.tanh(x))
        assert same_bits((1.0 / np.sqrt(x64)).astype(F32), nx.rsqrt(x))
        assert same_bits(F32(1) / x, nx.reciprocal(x)) and same_bits(np.sqrt(x), nx.sqrt(x))
    k = np.arange(-149, 128)
    assert np.array_equal(nx.exp2(k.astype(F32)), np.ldexp(F32(1), k).astype(F32))   # exact at integers


# ------------------------------------------------------------------------ integers


def test_integer_helpers():
    assert nx.i32_div([-7, 7, -2**31, 7], [2, -2, -1, -2]).tolist() == [-3, -3, -2**31, -3]
    assert nx.i32_rem([-7, 7, -2**31, -7], [2, -2, -1, -2]).tolist() == [-1, 1, 0, -1]
    for fn in (nx.i32_div, nx.i32_rem):
        with pytest.raises(ValueError):
            fn([1, 2], [1, 0])
    assert nx.i32_wrap(np.array([2**31, -2**31 - 1, 2**40 + 5], np.int64)).tolist() == [-2**31, 2**31 - 1, 5]


SCALAR = """
kernel k(a: hbm i32[8], o: hbm i32[8]) {
    smem m: i32[8];
    sem s;
    start copy(a, m, s); wait copy(a, m, s);
    m[2] = m[0] / m[1];
    m[3] = m[0] % m[1];
    m[4] = m[0] << m[5];
    m[6] = m[0] >> m[5];
    start copy(m, o, s); wait copy(m, o, s);
}
host { input a: i32[8]; output o: i32[8]; launch k(a, o); }
"""


def test_kernel_scalar_division_truncates_and_by_zero_faults():
    k = kernel(SCALAR, "/tmp/div_audit.mk")
    for a0, a1, shift in ((-2**31, -1, 33), (-7, 2, -31), (7, -2, 32)):
        o = k(a=np.array([a0, a1, 0, 0, 0, shift, 0, 0], np.int32)).output("o")
        assert o[2] == nx.i32_div(a0, a1) and o[3] == nx.i32_rem(a0, a1)
        assert o[4] == nx.i32_wrap(np.int64(a0) << (shift & 31)) and o[6] == a0 >> (shift & 31)
    with pytest.raises(EmulatorFault) as info:
        k(a=np.array([5, 0, 0, 0, 0, 0, 0, 0], np.int32))
    assert info.value.kind == "divide-by-zero" and info.value.instruction.startswith("div ")
    assert "div_audit.mk:6:" in info.value.source


def test_integer_tiles_have_no_division():
    src = """
kernel k(a: hbm i32[8, 128]) {
    vmem v: i32[8, 128];
    v = v / v;
}
"""
    with pytest.raises(SourceError):
        kernel(src)


# ---------------------------------------------------------- assembly: shifts, bf16 bits, reductions

OPS = ["vshl.i32 v2, v0, v1", "vshr.i32 v2, v0, v1", "vsra.i32 v2, v0, v1", "vpack.bf16 v2, v0",
       "vunpack.bf16 v2, v1", "vredsum.lane.f32 v2, v0", "vredsum.sub.f32 v2, v0", "vredmax.lane.f32 v2, v0",
       "vredmin.sub.f32 v2, v0", "vredsum.lane.i32 v2, v0"]


def _ops_program() -> str:
    n = len(OPS)
    body = "".join(f"    {op}\n    vst.w v2, {8192 + 4096 * i}(s0), s6, m0\n" for i, op in enumerate(OPS))
    return f""".buffer a i32 8x128 input
.buffer b i32 8x128 input
.buffer out i32 {n}x8x128 output
.kernel main
    .smem 0 4096 1 0 0 1 0 0
    .smem 28 {4096 * n} 1 0 0 1 0 0
    rdsr s31, core
    bne s31, s0, done
    li s1, @a
    dma.start vmem[s0], hbm[s1], s0, s0
    li s1, @b
    li s2, 4096
    dma.start vmem[s2], hbm[s1], s0, s0
    li s5, 8192
    sem.wait s0, s5
    li s6, 512
    vld.w v0, 0(s0), s6, m0
    vld.w v1, 4096(s0), s6, m0
{body}    li s1, @out
    li s2, 8192
    li s3, 28
    dma.start hbm[s1], vmem[s2], s3, s0
    li s5, {4096 * n}
    sem.wait s0, s5
done:
    halt
"""


def test_assembly_shifts_bf16_bits_and_reductions():
    k = kernel(_ops_program(), "/tmp/ops_audit.s")
    rng = np.random.default_rng(5)
    a = rng.integers(-2**31, 2**31, (8, 128), dtype=np.int64).astype(np.int32)
    b = np.tile(np.arange(-64, 64, dtype=np.int32), (8, 1))
    o = k(a=a, b=b).output("out")
    A, B, af = a.astype(np.int64), b.astype(np.int64), a.view(F32)
    assert np.array_equal(o[0], nx.i32_wrap(A << (B & 31)))
    assert np.array_equal(o[1].view(np.uint32), a.view(np.uint32) >> (b & 31).astype(np.uint32))
    assert np.array_equal(o[2], nx.i32_wrap(A >> (B & 31)))
    with np.errstate(invalid="ignore"):
        assert np.array_equal(o[3].view(np.uint32), nx.f32_to_bf16_bits(af).astype(np.uint32))   # low half
    low = (b.view(np.uint32) & 0xFFFF).astype(np.uint16)
    assert np.array_equal(o[4].view(np.uint32), bits(nx.bf16_bits_to_f32(low)))
    assert same_bits(o[5].view(F32), np.repeat(nx.tree_sum_f32(af, 1)[:, None], 128, 1))
    assert same_bits(o[6].view(F32), np.repeat(nx.tree_sum_f32(af, 0)[None, :], 8, 0))
    assert same_bits(o[7].view(F32), np.repeat(nx.tree_max_f32(af, 1)[:, None], 128, 1))
    assert same_bits(o[8].view(F32), np.repeat(nx.tree_min_f32(af, 0)[None, :], 8, 0))
    assert np.array_equal(o[9][:, 0], nx.i32_wrap(A.sum(1)))


# ----------------------------------------------------------------------- reductions


def test_tree_order_and_power_of_two_lengths():
    x = np.array([1e8, 1, -1e8, 1], F32)
    assert float(nx.tree_sum_f32(x)) == float((x[0] + x[2]) + (x[1] + x[3])) == 2.0
    assert float(((x[0] + x[1]) + x[2]) + x[3]) == 1.0          # (left to right differs)
    for fn in (nx.tree_sum_f32, nx.tree_max_f32, nx.tree_min_f32):
        with pytest.raises(ValueError):
            fn(np.zeros(6, F32))


REDUCE = """
kernel k(a: hbm f32[5, 200], n: hbm i32[5, 200], s1: hbm f32[5, 1], s0: hbm f32[1, 200], x1: hbm f32[5, 1],
         i1: hbm i32[3, 5, 1], i0: hbm i32[3, 1, 200]) {
    vmem av: f32[5, 200]; vmem nv: i32[5, 200]; vmem s1v: f32[5, 1]; vmem s0v: f32[1, 200]; vmem x1v: f32[5, 1];
    vmem i1v: i32[3][5, 1]; vmem i0v: i32[3][1, 200];
    sem t;
    start copy(a, av, t); wait copy(a, av, t);
    start copy(n, nv, t); wait copy(n, nv, t);
    s1v = sum(av, axis=1); s0v = sum(av, axis=0); x1v = max(av, axis=1);
    i1v[0] = sum(nv, axis=1); i1v[1] = max(nv, axis=1); i1v[2] = min(nv, axis=1);
    i0v[0] = sum(nv, axis=0); i0v[1] = max(nv, axis=0); i0v[2] = min(nv, axis=0);
    start copy(s1v, s1, t); wait copy(s1v, s1, t);
    start copy(s0v, s0, t); wait copy(s0v, s0, t);
    start copy(x1v, x1, t); wait copy(x1v, x1, t);
    for i in 0..3 { start copy(i1v[i], i1[i], t); wait copy(i1v[i], i1[i], t);
                    start copy(i0v[i], i0[i], t); wait copy(i0v[i], i0[i], t); }
}
host { input a: f32[5, 200]; input n: i32[5, 200]; output s1: f32[5, 1]; output s0: f32[1, 200];
       output x1: f32[5, 1]; output i1: i32[3, 5, 1]; output i0: i32[3, 1, 200]; launch k(a, n, s1, s0, x1, i1, i0); }
"""


def test_kernel_reductions_are_the_tree_of_the_padded_array():
    """200 lanes pad to 256, 5 rows to 8: +0.0 for sum, -inf for max; i32 0, INT_MIN, INT_MAX."""
    rng = np.random.default_rng(6)
    a = (rng.standard_normal((5, 200)) * np.exp2(rng.integers(-30, 30, (5, 200)))).astype(F32)
    a[4] = -0.0
    n = rng.integers(-2**31, 2**31, (5, 200), dtype=np.int64).astype(np.int32)
    run = kernel(REDUCE)(a=a, n=n)
    lanes = np.zeros((5, 256), F32)
    lanes[:, :200] = a
    rows = np.zeros((8, 200), F32)
    rows[:5] = a
    assert same_bits(run.output("s1")[:, 0], nx.tree_sum_f32(lanes, 1))
    assert same_bits(run.output("s0")[0], nx.tree_sum_f32(rows, 0))
    lanes[:, 200:] = -np.inf
    assert same_bits(run.output("x1")[:, 0], nx.tree_max_f32(lanes, 1))
    assert bits(run.output("x1")[4, 0]) == 0x80000000          # max keeps -0
    N = n.astype(np.int64)
    for out, axis in (("i1", 1), ("i0", 0)):
        got = run.output(out).reshape(3, -1)
        assert np.array_equal(got[0], nx.i32_wrap(N.sum(axis)))     # wrapping: any order gives it
        assert np.array_equal(got[1], n.max(axis)) and np.array_equal(got[2], n.min(axis))


def test_sum_needs_an_axis():
    with pytest.raises(SourceError, match=r"sum\(\) needs axis=0 or axis=1"):
        kernel(REDUCE.replace("s1v = sum(av, axis=1);", "s1v = sum(av);"))


# ---------------------------------------------------------------------- matrix unit

MATMUL = """
kernel k(a: hbm f32[8, 384], w: hbm f32[384, 256], c: hbm f32[8, 256], o: hbm f32[2, 8, 256]) {
    vmem av: f32[8, 384]; vmem wv: f32[384, 256]; vmem cv: f32[8, 256]; vmem ov: f32[2][8, 256];
    sem t;
    start copy(a, av, t); wait copy(a, av, t);
    start copy(w, wv, t); wait copy(w, wv, t);
    start copy(c, cv, t); wait copy(c, cv, t);
    ov[0] = matmul(av, wv);
    ov[1] = cv;
    ov[1] += matmul(av, wv);
    for i in 0..2 { start copy(ov[i], o[i], t); wait copy(ov[i], o[i], t); }
}
host { input a: f32[8, 384]; input w: f32[384, 256]; input c: f32[8, 256]; output o: f32[2, 8, 256];
       launch k(a, w, c, o); }
"""


def test_kernel_matmul_is_the_sequential_k_contract():
    """K = 384 is three 128-deep blocks of the matrix unit: still one sequential-k f32
    accumulation (not blockwise sums, not float64); `+=` adds the finished product."""
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((8, 384)) * np.exp2(rng.integers(-20, 20, (8, 384)))).astype(F32)
    w = (rng.standard_normal((384, 256)) * np.exp2(rng.integers(-20, 20, (384, 256)))).astype(F32)
    c = (rng.standard_normal((8, 256)) * 1000).astype(F32)
    o = kernel(MATMUL)(a=a, w=w, c=c).output("o")
    zero = np.zeros((8, 256), F32)
    want = nx.mxu_matmul(zero, a, w)
    assert np.array_equal(bits(o[0]), bits(want)) and np.array_equal(bits(want), bits(nx.mxu_matmul_numpy(zero, a, w)))
    assert np.array_equal(bits(o[1]), bits(c + want))
    assert not np.array_equal(bits(o[1]), bits(nx.mxu_matmul(c, a, w)))
    blocks = zero
    for k0 in (0, 128, 256):
        blocks = blocks + nx.mxu_matmul(zero, a[:, k0:k0 + 128], w[k0:k0 + 128])
    assert not np.array_equal(bits(o[0]), bits(blocks))
    f64 = (nx.bf16_round(a).astype(np.float64) @ nx.bf16_round(w).astype(np.float64)).astype(F32)
    assert not np.array_equal(bits(o[0]), bits(f64))


def test_matrix_unit_products_below_the_normal_range_and_inf_times_zero():
    a = np.array([[2.0**-70, 1.5 * 2.0**-75, np.inf, 1.0]], F32)
    w = np.array([[2.0**-70], [1.5 * 2.0**-75], [0.0], [0.0]], F32)
    for fn in (nx.mxu_matmul, nx.mxu_matmul_numpy):
        first = fn(np.zeros((1, 1), F32), a[:, :1], w[:1])
        assert float(first[0, 0]) == 2.0**-140                      # a subnormal product, exact
        second = fn(np.zeros((1, 1), F32), a[:, 1:2], w[1:2])
        assert float(second[0, 0]) == float(F32(2.25 * 2.0**-150))    # rounded by the multiply: 2^-149
        assert np.isnan(fn(np.zeros((1, 1), F32), a, w)[0, 0])       # inf * 0 is NaN


# ------------------------------------------------------------------------- MXFP4


def test_mxfp4_e2m1_codes_and_decoding_limits():
    codes = np.arange(16, dtype=np.uint8)
    values = (codes[0::2] | (codes[1::2] << 4)).reshape(1, 8)              # even column in the low nibble
    decoded = nx.mxfp4_decode(values, np.full((1, 16), 127, np.uint8))
    assert decoded[0].tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    assert bits(decoded[0, 8]) == 0x80000000
    # scale 254: 2 and more overflow; 253: 4 and more; 255: NaN whatever the value
    for scale, finite, overflow in ((254, [0.5, 1, 1.5], [2, 3, 4, 6]), (253, [0.5, 1, 1.5, 2, 3], [4, 6])):
        row = nx.mxfp4_decode(values, np.full((1, 16), scale, np.uint8))[0]
        assert row[1:8][np.isinf(row[1:8])].size == len(overflow)
        assert np.isfinite(row[1:1 + len(finite)]).all() and (row[8 + 8 - len(overflow):] == -np.inf).all()
    nan = nx.mxfp4_decode(values, np.full((1, 16), 255, np.uint8))
    assert (bits(nan) == 0x7FC00000).all()
    sub = nx.mxfp4_decode(values, np.zeros((1, 16), np.uint8))[0]
    assert float(sub[1]) == 2.0**-128                                    # exact, a subnormal
    assert nx.mxfp4_nbytes(40, 6) == (40 * 6 // 2, 2 * 6) and nx.mxfp4_to_bytes(np.zeros((40, 6), F32)).size == 132


def test_mxfp4_encode_rules():
    w = np.zeros((40, 6), F32)
    w[:5, 0] = [7.0, 5.0, -0.75, 0.25, 5.5]              # scale 2^0: saturate, ties to even, nearest
    w[35, 1] = 3.0                                       # a partial last block (rows 32..39)
    w[:2, 2] = [np.nan, 100.0]                           # a NaN: scale 2^-2 whatever else
    w[:3, 3] = [np.inf, np.nan, -np.nan]                 # an infinity and NaNs: 2^-2; NaNs of both signs are -0
    w[:2, 4] = [-np.inf, 1.0]                            # an infinity, no NaN: 2^-3
    w[0, 5] = 1.5 * 2.0**-125                            # below 2^-124: scale 2^-127 (byte 0)
    values, scales = nx.mxfp4_encode(w)
    assert values.shape == (40, 3) and scales.shape == (2, 6)
    assert (scales.astype(int) - 127).tolist() == [[0, -2, -2, -2, -3, -127], [-2, -1, -2, -2, -2, -2]]
    d = nx.mxfp4_decode(values, scales)
    assert d[:5, 0].tolist() == [6.0, 4.0, -1.0, 0.0, 6.0]
    assert d[35, 1] == 3.0
    assert bits(d[0, 2]) == 0x80000000 and d[1, 2] == 1.5
    assert d[0, 3] == 1.5 and bits(d[1, 3]) == 0x80000000 and bits(d[2, 3]) == 0x80000000
    assert d[0, 4] == -0.75 and d[1, 4] == 0.75          # (1.0 saturates too)
    assert float(d[0, 5]) == 1.5 * 2.0**-125
    tiny = np.zeros((32, 2), F32)
    tiny[:3, 0] = [2.0**-125, 2.0**-129, -(2.0**-129)]   # 2^-129 or less encodes as +-0
    tiny[:2, 1] = [2.0**-125, float(np.nextafter(F32(2.0**-129), F32(1)))]
    d = nx.mxfp4_decode(*nx.mxfp4_encode(tiny))
    assert bits(d[1, 0]) == 0 and bits(d[2, 0]) == 0x80000000 and float(d[1, 1]) == 2.0**-128


# tests/test_api.py's MXFP4 kernel with the weights declared as raw words: the bytes go in
# as written (values, then scales at twice the value rows' pitch), not quantised.
MXFP4_RAW = MXFP4_KERNEL.replace(".buffer w mxfp4 64x128 input", ".buffer w i32 1088 input")
assert MXFP4_RAW != MXFP4_KERNEL


def test_the_matrix_unit_decodes_raw_mxfp4_bytes_as_mxfp4_decode():
    """`mxu.ldw.mx` on hand-made bytes: scales 253, 254 (overflow), 255 (NaN), 0
    (subnormal) give the bits of the contract on `mxfp4_decode`'s weights."""
    rng = np.random.default_rng(8)
    codes = rng.integers(0, 16, (64, 128)).astype(np.uint8)
    scales = rng.integers(100, 140, (2, 128)).astype(np.uint8)
    codes[32:, :8] = 0
    for col, (code, scale) in enumerate([(4, 254), (3, 254), (6, 253), (5, 253), (0, 255), (12, 254), (1, 0)]):
        codes[32, col], scales[1, col] = code, scale
    values = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    raw = np.concatenate([values.reshape(-1), scales.reshape(-1)])
    weights = nx.mxfp4_decode(values, scales)
    assert [hex(b) for b in bits(weights[32, :7])] == ["0x7f800000", "0x7f400000", "0x7f800000", "0x7f400000",
                                                       "0x7fc00000", "0xff800000", "0x200000"]
    x = np.zeros((8, 128), F32)
    x[0, 32] = 1.0
    x[1, :32] = rng.standard_normal(32)
    x[2, 32] = -2.0
    k = kernel(MXFP4_RAW, "/tmp/mx_audit.s")
    y = k(w=raw.view(np.int32), x=x).output("y")
    assert same_bits(y, nx.mxu_matmul_numpy(np.zeros((8, 128), F32), x[:, :64], weights))
    assert np.isposinf(y[0, 0]) and float(y[0, 1]) == 1.5 * 2.0**127 and np.isneginf(y[2, 1])
