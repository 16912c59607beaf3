"""Byte-addressed memories and the DMA engines' access to them.

VMEM, SMEM and HBM are numpy uint8 arrays. DMAs move up to 3-D strided byte
blocks; the DMA checks both ends against their memories (`dma.py`) before these
functions copy them, and a bad one raises `Trap`, which the machine turns into a
fault naming chip, core, cycle and instruction. (Vector loads and stores are
instruction semantics: `isa/semantics.py`.)
"""

from __future__ import annotations

import mmap
import sys
import threading

import numpy as np


class Trap(Exception):
    """A fault found while executing one instruction; the machine adds the context."""

    def __init__(self, kind: str, message: str, cycle: int | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.cycle = cycle      # where the fault lies, if not at the core's clock


def host_mmap(fileno: int, size: int, **kwargs) -> mmap.mmap:
    """`mmap.mmap`, with the host's refusal (ENOMEM: more than it will promise) raised as
    a MemoryError that says how much was asked for."""
    try:
        return mmap.mmap(fileno, size, **kwargs)
    except OSError as e:
        raise MemoryError(f"cannot map {size:,} bytes of host memory ({e.strerror})") from None


def anonymous(size: int) -> np.ndarray:
    """`size` zero bytes of private memory, pages allocated at first touch, huge pages
    asked for (Linux `madvise`; where the OS offers them)."""
    m = host_mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(m, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:     # (a kernel without transparent huge pages)
            pass
    return np.frombuffer(m, np.uint8)


# Recycled memories. A machine's VMEM is tens of MiB of anonymous memory per core, and
# the first touch of each page faults (with huge pages, the OS zeroes 2 MiB at a
# time, or first compacts memory to find them): a fresh machine pays that again for
# every page its kernels touch. So the buffer of a core that is gone comes back here,
# with the range it may have written, and the next core of the same size takes it,
# zeroing just that range. A buffer something still refers to (a view a caller kept)
# is never taken: it is left to be freed as usual.
SPARE_BYTES = 512 << 20     # most touched bytes kept for reuse (resident, not in use)
_spare: list[tuple[np.ndarray, int, int, int]] = []   # (buffer, dirty lo, dirty hi, touched)
_spare_lock = threading.RLock()   # (re-entrant: a collection inside `reused` may give one back)


def _unboxed(box: list) -> tuple[np.ndarray, int, int, int]:
    """The spare in `box`, and how many references its buffer has once the box is
    empty (`_ALONE` if nothing but this function's local holds it)."""
    buffer, lo, hi, _ = box.pop()
    return buffer, lo, hi, sys.getrefcount(buffer)


_ALONE = _unboxed([(np.zeros(1, np.uint8), 0, 0, 0)])[3]


def reused(size: int) -> np.ndarray:
    """`size` zero bytes as `anonymous` gives them, from a buffer given back
    (`give_back`) when one of that size is free."""
    while True:
        with _spare_lock:
            # (the last given back first: the likeliest to be in the CPU's caches)
            found = next((i for i in range(len(_spare) - 1, -1, -1) if _spare[i][0].size == size), None)
            box = [_spare.pop(found)] if found is not None else None
        if box is None:
            return anonymous(size)
        buffer, lo, hi, refs = _unboxed(box)
        if refs == _ALONE:
            if hi > lo:
                buffer[lo:hi] = 0
            return buffer
        # (something still holds it, or a view of it: not ours to reuse)


def give_back(buffer: np.ndarray, lo: int, hi: int, touched: int) -> None:
    """A buffer from `reused` that its owner no longer uses: it may have written bytes
    [lo, hi) of it (every other byte is still zero) and touched about `touched` bytes
    of it over its life. Kept while the spare buffers have touched at most SPARE_BYTES."""
    with _spare_lock:
        if spare_bytes() + touched <= SPARE_BYTES:
            _spare.append((buffer, max(lo, 0), max(hi, 0), touched))


def spare_bytes() -> int:
    """About how many bytes the spare buffers have touched (resident, kept for reuse)."""
    return sum(touched for *_rest, touched in _spare)


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
    return _strided(mem, addr, inner, n1, s1, n2, s2)


def read_block(mem: np.ndarray, addr: int, inner: int, n1: int, s1: int, n2: int, s2: int) -> np.ndarray:
    """A copy of the bytes of a 3-D block starting `addr` bytes into `mem` (the caller
    has checked that the block lies inside the memory), in the block's order."""
    if n1 * n2 == 1 or (s1 == inner and (n2 == 1 or s2 == inner * n1)):
        return mem[addr:addr + inner * n1 * n2].copy()
    # (copied before it is flattened: a strided view numpy finds contiguous, e.g. one row
    # per plane, would flatten to a view of `mem`, not a snapshot of its bytes)
    return _strided(mem, addr, inner, n1, s1, n2, s2).copy().reshape(-1)


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
    if _apart(inner, n1, s1, n2, s2):
        _strided(mem, addr, inner, n1, s1, n2, s2)[...] = data.reshape(n2, n1, inner)
        return
    # A block some of whose bytes are written twice: the last write of a byte wins, in
    # the block's order (an index per byte; a view's assignment may take another order).
    data = data.reshape(-1)
    idx = (addr + np.arange(n2)[:, None, None] * s2 + np.arange(n1)[None, :, None] * s1
           + np.arange(inner)[None, None, :])
    mem[idx.reshape(-1)] = data


def _strided(mem: np.ndarray, addr: int, inner: int, n1: int, s1: int, n2: int, s2: int) -> np.ndarray:
    """The (n2, n1, inner) view of a 3-D block with any strides: overlapping rows, a
    stride of 0, negative strides (numpy refuses one reaching outside `mem`). Memories
    are contiguous byte arrays: the view is built directly (as_strided's result, at a
    fraction of its cost)."""
    return np.ndarray((n2, n1, inner), np.uint8, mem, addr, (s2, s1, 1))


def _apart(inner: int, n1: int, s1: int, n2: int, s2: int) -> bool:
    """Do the block's bytes all differ (no byte in two rows or planes)? Answered for
    rows and planes that do not overlap at all, whatever their strides' signs."""
    rows_apart = n1 == 1 or abs(s1) >= inner
    plane = (n1 - 1) * abs(s1) + inner
    return rows_apart and (n2 == 1 or abs(s2) >= plane)
