"""Byte-addressed memories with bounds- and alignment-checked tile access.

VMEM, SMEM and HBM are numpy uint8 arrays. Vector loads and stores move 8 rows
of 128 elements (4-byte words or 2-byte bf16) with a row stride; DMAs move up to
3-D strided byte blocks. Every access is checked and a bad one raises `Trap`,
which the machine turns into a fault naming chip, core, cycle and instruction.
"""

from __future__ import annotations

import numpy as np

from mkemu.isa.numerics import f32_to_bf16_bits


class Trap(Exception):
    """A fault found while executing one instruction; the machine adds the context."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


ROWS, LANES = 8, 128


def _check(mem: np.ndarray, name: str, lo: int, hi: int) -> None:
    if lo < 0 or hi > mem.size:
        raise Trap("out-of-bounds", f"{name} access [{lo}, {hi}) is outside {name} of {mem.size} bytes")


def _align(name: str, addr: int, stride: int, size: int) -> None:
    if addr % size or stride % size:
        raise Trap("misaligned", f"{name} address {addr} / stride {stride} not {size}-byte aligned")


def row_view(mem: np.ndarray, name: str, addr: int, stride: int, row_bytes: int,
             rows: int = ROWS) -> np.ndarray:
    """A (rows, row_bytes) uint8 view of `rows` rows starting at addr, stride bytes apart.

    A view into `mem` (writable) unless rows overlap or the stride is negative, in
    which case it is a gathered copy (read-only use)."""
    if stride >= row_bytes:
        _check(mem, name, addr, addr + (rows - 1) * stride + row_bytes)
        if addr + rows * stride <= mem.size:
            return mem[addr:addr + rows * stride].reshape(rows, stride)[:, :row_bytes]
        return np.lib.stride_tricks.as_strided(mem[addr:], (rows, row_bytes), (stride, 1))
    if stride == 0:
        _check(mem, name, addr, addr + row_bytes)
        return np.broadcast_to(mem[addr:addr + row_bytes], (rows, row_bytes))
    lo = addr + min(0, (rows - 1) * stride)
    hi = addr + max(0, (rows - 1) * stride) + row_bytes
    _check(mem, name, lo, hi)
    return mem[addr + np.arange(rows)[:, None] * stride + np.arange(row_bytes)[None, :]]


def _whole_rows_inside(mem: np.ndarray, addr: int, stride: int, size: int) -> bool:
    """All 8 rows of 128 elements at addr, stride bytes apart, are inside mem and do not overlap."""
    return stride >= LANES * size and addr >= 0 and addr + (ROWS - 1) * stride + LANES * size <= mem.size


def load_tile(mem: np.ndarray, name: str, addr: int, stride: int, elem: str,
              mask: np.ndarray | None, rect: tuple[int, int] | None = None) -> np.ndarray:
    """Load 8x128 elements as uint32 bits ("w": words, "bf16": widened to f32 bits).

    `rect` (rows, lanes), when the mask is known to be that rectangle, takes the fast
    path: only those rows and lanes are read, the rest load 0."""
    size = 4 if elem == "w" else 2
    _align(name, addr, stride, size)
    dtype = np.uint32 if size == 4 else np.uint16
    if mask is None or rect is not None:
        # A rectangle of rows and lanes (all of them without a mask); the rest load 0.
        rows, lanes = (ROWS, LANES) if mask is None else rect
        bits = np.zeros((ROWS, LANES), np.uint32)
        if rows and lanes:
            if stride == 0:
                # One row read into every row (a vector broadcast over the batch rows).
                _check(mem, name, addr, addr + lanes * size)
                src = mem[addr:addr + lanes * size]
            else:
                src = row_view(mem, name, addr, stride, lanes * size, rows)
            bits[:rows, :lanes] = src.view(dtype)
            if size == 2:
                bits <<= 16
        return bits
    if _whole_rows_inside(mem, addr, stride, size):
        # Every lane of the 8 rows lies inside, so no active lane can be out of bounds.
        bits = np.where(mask, row_view(mem, name, addr, stride, LANES * size).view(dtype), dtype(0))
    else:
        bits = np.zeros((ROWS, LANES), dtype)
        rows, lanes = np.nonzero(mask)
        if rows.size:
            starts = addr + rows * stride + lanes * size
            _check(mem, name, int(starts.min()), int(starts.max()) + size)
            idx = starts[:, None] + np.arange(size)[None, :]
            bits[rows, lanes] = mem[idx].view(bits.dtype)[:, 0]
    if size == 2:
        return bits.astype(np.uint32) << 16
    return bits  # uint32, and a fresh array in both paths above


def store_tile(mem: np.ndarray, name: str, addr: int, stride: int, elem: str,
               bits: np.ndarray, mask: np.ndarray | None, rect: tuple[int, int] | None = None) -> None:
    """Store 8x128 uint32 bits; "bf16" rounds the f32 values to nearest even."""
    size = 4 if elem == "w" else 2
    _align(name, addr, stride, size)
    if mask is None:
        rect = (ROWS, LANES)
    if rect is not None and (stride == 0 or stride >= rect[1] * size):
        rows, lanes = rect
        if rows and lanes:
            # With stride 0 every row lands on the same bytes and the last one wins (a
            # one-row buffer's store): only that row is written (its stride is moot).
            first = rows - 1 if stride == 0 else 0
            part = bits[first:rows, :lanes]
            data = part if size == 4 else f32_to_bf16_bits(part.view(np.float32))
            view = row_view(mem, name, addr, stride or lanes * size, lanes * size, rows - first)
            view.view(data.dtype)[...] = data
        return
    data = bits if size == 4 else f32_to_bf16_bits(bits.view(np.float32))
    if _whole_rows_inside(mem, addr, stride, size):
        # Every lane of the 8 rows lies inside, so no active lane can be out of bounds.
        view = row_view(mem, name, addr, stride, LANES * size).view(data.dtype)
        np.copyto(view, data, where=mask)
        return
    if mask is None:
        mask = np.ones((ROWS, LANES), bool)
    rows, lanes = np.nonzero(mask)
    if not rows.size:
        return
    starts = addr + rows * stride + lanes * size
    _check(mem, name, int(starts.min()), int(starts.max()) + size)
    # Later rows win where rows overlap, as on a machine storing rows in order.
    idx = starts[:, None] + np.arange(size)[None, :]
    mem[idx] = data[rows, lanes].view(np.uint8).reshape(-1, size)


def block_ranges(addr: int, inner: int, n1: int, s1: int, n2: int, s2: int) -> tuple[int, int]:
    """The byte span [lo, hi) a 3-D block touches (also the race checks' bounding range)."""
    offsets = [addr + i2 * s2 + i1 * s1 for i2 in (0, n2 - 1) for i1 in (0, n1 - 1)]
    return min(offsets), max(offsets) + inner


def _block_view(mem: np.ndarray, addr: int, inner: int, n1: int, s1: int, n2: int, s2: int):
    """A (n2, n1, inner) view of a 3-D block when strides allow one (non-negative,
    rows and planes not overlapping), else None."""
    if s1 < inner or s2 < 0 or (n2 > 1 and s2 < (n1 - 1) * s1 + inner):
        return None
    span = (n2 - 1) * s2 + (n1 - 1) * s1 + inner
    return np.lib.stride_tricks.as_strided(mem[addr:addr + span], (n2, n1, inner), (s2, s1, 1))


def read_block(mem: np.ndarray, name: str, addr: int, inner: int, n1: int, s1: int,
               n2: int, s2: int) -> np.ndarray:
    lo, hi = block_ranges(addr, inner, n1, s1, n2, s2)
    _check(mem, name, lo, hi)
    if n1 * n2 == 1 or (s1 == inner and (n2 == 1 or s2 == inner * n1)):
        return mem[addr:addr + inner * n1 * n2].copy()
    view = _block_view(mem, addr, inner, n1, s1, n2, s2)
    if view is not None:
        return view.reshape(-1)   # reshape of a strided view copies
    idx = (addr + np.arange(n2)[:, None, None] * s2 + np.arange(n1)[None, :, None] * s1
           + np.arange(inner)[None, None, :])
    return mem[idx].reshape(-1)


def write_block(mem: np.ndarray, name: str, addr: int, inner: int, n1: int, s1: int,
                n2: int, s2: int, data: np.ndarray) -> None:
    lo, hi = block_ranges(addr, inner, n1, s1, n2, s2)
    _check(mem, name, lo, hi)
    if n1 * n2 == 1 or (s1 == inner and (n2 == 1 or s2 == inner * n1)):
        mem[addr:addr + inner * n1 * n2] = data
        return
    view = _block_view(mem, addr, inner, n1, s1, n2, s2)
    if view is not None:
        view[...] = data.reshape(n2, n1, inner)
        return
    idx = (addr + np.arange(n2)[:, None, None] * s2 + np.arange(n1)[None, :, None] * s1
           + np.arange(inner)[None, None, :])
    mem[idx.reshape(-1)] = data
