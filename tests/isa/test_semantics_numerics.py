"""The compiled loop's element-at-a-time numerics equal the numeric contract bit for bit.

`isa/semantics.py` is a second implementation of `isa/numerics.py` (one element at
a time, compiled by numba into the emulator's issue loop). Here both run on the
same float32 bit patterns, compiled exactly as the loop compiles them: special
values (signed zeros, infinities, NaNs, subnormals, the edges of every range) and
hypothesis-chosen bit patterns over all 2^32.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mkemu.isa import numerics as nx
from mkemu.isa import semantics as sem


def _elementwise(fn):
    @numba.njit(error_model="numpy")
    def run(x):
        out = np.empty_like(x)
        for i in range(x.size):
            out[i] = fn(x[i])
        return out
    return run


def _elementwise2(fn):
    @numba.njit(error_model="numpy")
    def run(a, b):
        out = np.empty_like(a)
        for i in range(a.size):
            out[i] = fn(a[i], b[i])
        return out
    return run


UNARY_F32 = {
    "exp": (sem.exp_f32, nx.exp), "exp2": (sem.exp2_f32, nx.exp2), "log": (sem.log_f32, nx.log),
    "log2": (sem.log2_f32, nx.log2), "rcp": (sem.rcp_f32, nx.reciprocal),
    "sqrt": (sem.sqrt_f32, nx.sqrt), "rsqrt": (sem.rsqrt_f32, nx.rsqrt),
    "sigmoid": (sem.sigmoid_f32, nx.sigmoid), "silu": (sem.silu_f32, nx.silu),
    "tanh": (sem.tanh_f32, nx.tanh),
}
COMPILED = {name: _elementwise(fn) for name, (fn, _) in UNARY_F32.items()}
MAX, MIN = _elementwise2(sem.f32_max), _elementwise2(sem.f32_min)
ROUND = _elementwise(sem.bf16_round_bits)


@numba.njit(error_model="numpy")
def TO_I32(x):
    out = np.empty(x.size, np.int32)
    for i in range(x.size):
        out[i] = sem.f32_to_i32(x[i])
    return out


def special_bits() -> np.ndarray:
    edges = [0, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x3F800000, 0xBF800000,
             0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001,
             0xFFFFFFFF, 0x42B17218, 0x42B17217, 0xC2CFF1B5, 0xC2CFF1B4, 0x4B000000, 0x4F000000,
             0xCF000000, 0x4EFFFFFF, 0x3F7FFFFF, 0x3F800001, 0x3EAE147B, 0x3FFFFFFF, 0x7F7F8000,
             0x7F7F7FFF, 0x3F808000, 0x3F818000]
    sweep = np.linspace(-100.0, 100.0, 4001, dtype=np.float32).view(np.uint32)
    return np.concatenate([np.array(edges, np.uint32), sweep])


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


def same_results(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bits, except that any NaN equals any NaN (docs/numerics.md: NaN payloads and
    signs are not part of the contract; numpy's own loops give a NaN input's sign back
    differently by array length, through vectorised or scalar code)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    both_nan = np.isnan(a) & np.isnan(b)
    return bool(np.all(both_nan | (a.view(np.uint32) == b.view(np.uint32))))


@pytest.mark.parametrize("name", sorted(UNARY_F32))
def test_transcendentals_on_special_values(name):
    x = special_bits().view(np.float32)
    with np.errstate(all="ignore"):
        assert same_results(COMPILED[name](x), UNARY_F32[name][1](x)), name


@pytest.mark.parametrize("name", sorted(UNARY_F32))
def test_transcendentals_on_any_bits(name):
    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64))
    def check(bits):
        x = np.array(bits, np.uint32).view(np.float32)
        with np.errstate(all="ignore"):
            expected = UNARY_F32[name][1](x)
        assert same_results(COMPILED[name](x), expected), (name, [hex(b) for b in bits])
    check()


def test_min_max_round_and_convert_on_special_values():
    x = special_bits().view(np.float32)
    y = np.roll(x, 7)
    with np.errstate(all="ignore"):
        assert same_bits(MAX(x, y), nx.f32_max(x, y)) and same_bits(MAX(x, x), nx.f32_max(x, x))
        assert same_bits(MIN(x, y), nx.f32_min(x, y)) and same_bits(MIN(y, x), nx.f32_min(y, x))
        assert same_bits(ROUND(x.view(np.uint32)), nx.bf16_round(x))
        assert np.array_equal(TO_I32(x), nx.f32_to_i32(x))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=2, max_size=64))
def test_min_max_and_rounding_on_any_bits(bits):
    x = np.array(bits, np.uint32).view(np.float32)
    y = x[::-1].copy()
    with np.errstate(all="ignore"):
        assert same_bits(MAX(x, y), nx.f32_max(x, y))
        assert same_bits(MIN(x, y), nx.f32_min(x, y))
        assert same_bits(ROUND(x.view(np.uint32)), nx.bf16_round(x))
        assert np.array_equal(TO_I32(x), nx.f32_to_i32(x))


@numba.njit(error_model="numpy")
def _reduce_rows(x, kind, axis):
    V = np.zeros((2, 1024), np.float32)
    V[0] = x
    sem.reduce_f32(V, 1, 0, axis, kind)
    return V[1]


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("kind, ref", [(0, nx.tree_sum_f32), (1, nx.tree_max_f32), (2, nx.tree_min_f32)])
def test_tree_reductions_follow_the_contract_order(axis, kind, ref):
    rng = np.random.default_rng(axis * 3 + kind)
    x = (rng.standard_normal((8, 128)) * 10.0 ** rng.integers(-20, 20, (8, 128))).astype(np.float32)
    x.reshape(-1)[::97] = np.nan
    got = _reduce_rows(x.reshape(-1), kind, axis).reshape(8, 128)
    with np.errstate(all="ignore"):
        expected = np.broadcast_to(np.expand_dims(ref(x, axis=axis), axis), (8, 128))
    assert same_bits(got, expected)
