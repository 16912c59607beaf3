"""Vector tile loads and stores (`vload`/`vstore` of isa/semantics.py, compiled as the
emulator's loop compiles them) against a lane-by-lane model.

They have a rectangle path (m0, or a mask known to be rows x lanes) besides the
general masked one; both must give the same bits, the same memory and the same faults
as moving every active lane on its own: lane (r, l) is at addr + r*stride + l*size,
an access faults iff an active lane falls outside memory (and then writes nothing),
and where rows overlap in a store the later row wins."""

from __future__ import annotations

import numba
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from mkemu.isa import semantics as sem
from mkemu.isa.numerics import f32_to_bf16_bits

ROWS, LANES = sem.ROWS, sem.LANES

SIZES = {"w": 4, "bf16": 2}


@st.composite
def accesses(draw):
    elem = draw(st.sampled_from(["w", "bf16"]))
    size = SIZES[elem]
    mem_bytes = draw(st.sampled_from([1024, 4096, 8192]))
    stride = size * draw(st.sampled_from([0, 1, 64, 128, 129, 256, 512, -128, -256]))
    addr = size * draw(st.integers(-8, mem_bytes // size))
    kind = draw(st.sampled_from(["none", "rect", "random"]))
    rect = None
    if kind == "none":
        mask = None
    elif kind == "rect":
        rect = (draw(st.integers(0, ROWS)), draw(st.integers(0, LANES)))
        mask = (np.arange(ROWS)[:, None] < rect[0]) & (np.arange(LANES)[None, :] < rect[1])
    else:
        seed = draw(st.integers(0, 2**16))
        density = draw(st.sampled_from([0.0, 0.1, 0.9, 1.0]))
        mask = np.random.default_rng(seed).random((ROWS, LANES)) < density
    return elem, mem_bytes, addr, stride, mask, rect


def _lanes(addr, stride, size, mask):
    active = np.ones((ROWS, LANES), bool) if mask is None else mask
    for r, l in zip(*np.nonzero(active)):
        yield r, l, addr + r * stride + l * size


def _out_of_bounds(mem_bytes, addr, stride, size, mask) -> bool:
    return any(start < 0 or start + size > mem_bytes for _, _, start in _lanes(addr, stride, size, mask))


def _memory(mem_bytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, mem_bytes, dtype=np.uint8)


def _registers(mask, rect, bits=None):
    """V, M, MR and the mask register index for a mask (None: m0), as the loop keeps them."""
    V = np.zeros((2, ROWS * LANES), np.uint32)
    if bits is not None:
        V[1] = bits.reshape(-1)
    M = np.zeros((2, ROWS * LANES), np.uint8)
    M[0] = 1
    MR = np.array([[ROWS, LANES], [-1, -1]], np.int64)
    if mask is None:
        return V, M, MR, 0
    M[1] = mask.reshape(-1)
    if rect is not None:
        MR[1] = rect
    return V, M, MR, 1


@numba.njit(error_model="numpy")
def _vload(mem, V, M, MR, mask, addr, stride, size):
    E = np.zeros(5, np.int64)
    return sem.vload(mem, mem.view(np.uint16), mem.view(np.uint32), V, M, MR, 1, addr, stride, mask, size, E)


@numba.njit(error_model="numpy")
def _vstore(mem, V, M, MR, mask, addr, stride, size):
    E = np.zeros(5, np.int64)
    return sem.vstore(mem, mem.view(np.uint16), mem.view(np.uint32), V, M, MR, 1, addr, stride, mask, size, E)


@given(accesses(), st.integers(0, 2**16))
def test_load_tile_moves_every_active_lane_and_zeroes_the_rest(access, seed):
    elem, mem_bytes, addr, stride, mask, rect = access
    size = SIZES[elem]
    mem = _memory(mem_bytes, seed)
    V, M, MR, index = _registers(mask, rect)
    err = _vload(mem, V, M, MR, index, addr, stride, size)
    if _out_of_bounds(mem_bytes, addr, stride, size, mask):
        assert err == sem.E_OOB
        return
    assert err == 0
    expected = np.zeros((ROWS, LANES), np.uint32)
    for r, l, start in _lanes(addr, stride, size, mask):
        word = int.from_bytes(mem[start:start + size].tobytes(), "little")
        expected[r, l] = word if size == 4 else word << 16
    assert np.array_equal(V[1].reshape(ROWS, LANES), expected)


@given(accesses(), st.integers(0, 2**16))
def test_store_tile_writes_every_active_lane_in_row_order(access, seed):
    elem, mem_bytes, addr, stride, mask, rect = access
    size = SIZES[elem]
    mem = _memory(mem_bytes, seed)
    rng = np.random.default_rng(seed + 1)
    bits = (rng.standard_normal((ROWS, LANES)).astype(np.float32) * 100).view(np.uint32)
    before = mem.copy()
    V, M, MR, index = _registers(mask, rect, bits)
    err = _vstore(mem, V, M, MR, index, addr, stride, size)
    if _out_of_bounds(mem_bytes, addr, stride, size, mask):
        assert err == sem.E_OOB
        assert np.array_equal(mem, before), "a faulting store must not write"
        return
    assert err == 0
    stored = bits if size == 4 else f32_to_bf16_bits(bits.view(np.float32))
    expected = before.copy()
    for r, l, start in _lanes(addr, stride, size, mask):
        expected[start:start + size] = np.frombuffer(stored[r, l].tobytes(), np.uint8)
    assert np.array_equal(mem, expected)
