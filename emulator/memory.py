"""Byte-addressed memories and the DMA engines' access to them.

VMEM, SMEM and HBM are numpy uint8 arrays. DMAs move up to 3-D strided byte
blocks; the DMA checks both ends against their memories (`dma.py`) before these
functions copy them, and a bad one raises `Trap`, which the machine turns into a
fault naming chip, core, cycle and instruction. (Vector loads and stores are
instruction semantics: `isa/semantics.py`.)
"""

from __future__ import annotations

import mmap

import numpy as np


class Trap(Exception):
    """A fault found while executing one instruction; the machine adds the context."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


def anonymous(size: int) -> np.ndarray:
    """`size` zero bytes of private memory, pages allocated at first touch, huge pages
    asked for (Linux `madvise`; where the OS offers them)."""
    try:
        m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError as e:     # (ENOMEM: more than the host will promise)
        raise MemoryError(f"cannot map {size:,} bytes of host memory ({e.strerror})") from None
    if hasattr(m, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:     # (a kernel without transparent huge pages)
            pass
    return np.frombuffer(m, np.uint8)


def block_view(mem: np.ndarray, addr: int, inner: int, n1: int, s1: int, n2: int, s2: int):
    """A (n2, n1, inner) view of a 3-D block when strides allow one (non-negative,
    rows and planes not overlapping; the stride of a single row or plane does not
    matter), else None."""
    if n1 == 1:
        s1 = inner
    if n2 == 1:
        s2 = n1 * s1
    if s1 < inner or s2 < (n1 - 1) * s1 + inner:
        return None
    # Memories are contiguous byte arrays: the view built directly (as_strided's
    # result, at a fraction of its cost).
    return np.ndarray((n2, n1, inner), np.uint8, mem, addr, (s2, s1, 1))


def read_block(mem: np.ndarray, addr: int, inner: int, n1: int, s1: int, n2: int, s2: int) -> np.ndarray:
    """A copy of the bytes of a 3-D block starting `addr` bytes into `mem` (the caller
    has checked that the block lies inside the memory)."""
    if n1 * n2 == 1 or (s1 == inner and (n2 == 1 or s2 == inner * n1)):
        return mem[addr:addr + inner * n1 * n2].copy()
    view = block_view(mem, addr, inner, n1, s1, n2, s2)
    if view is not None:
        return view.reshape(-1)   # reshape of a strided view copies
    idx = (addr + np.arange(n2)[:, None, None] * s2 + np.arange(n1)[None, :, None] * s1
           + np.arange(inner)[None, None, :])
    return mem[idx].reshape(-1)


def write_block(mem: np.ndarray, addr: int, inner: int, n1: int, s1: int, n2: int, s2: int,
                data: np.ndarray) -> None:
    """Write `data` (the block's bytes in order, flat or shaped (n2, n1, inner)) into a
    3-D block starting `addr` bytes into `mem` (checked by the caller, as for
    `read_block`)."""
    if n1 * n2 == 1 or (s1 == inner and (n2 == 1 or s2 == inner * n1)):
        size = inner * n1 * n2
        if data.ndim == 1:
            mem[addr:addr + size] = data
        else:
            mem[addr:addr + size].reshape(data.shape)[...] = data
        return
    view = block_view(mem, addr, inner, n1, s1, n2, s2)
    if view is not None:
        view[...] = data.reshape(n2, n1, inner)
        return
    data = data.reshape(-1)
    idx = (addr + np.arange(n2)[:, None, None] * s2 + np.arange(n1)[None, :, None] * s1
           + np.arange(inner)[None, None, :])
    mem[idx.reshape(-1)] = data
