"""Exactly which bytes an access touches, and whether two accesses share a byte.

A DMA touches a 3-D strided block: `n2` planes `s2` bytes apart, each of `n1` rows
`s1` bytes apart, each row `inner` contiguous bytes from `addr`. A vector tile access
touches up to 8 rows `stride` bytes apart, each the byte range of its active lanes; a
weight-tile load, `rows` rows of `cols` bf16 values; a scalar access, one word. All of
them are blocks (a tile is a block with one plane), and two blocks conflict when some
byte is in both: disjoint column blocks of one buffer, or interleaved rows, do not.

The functions are plain Python that numba also compiles into the issue loop, so the
loop's race checks and the machine's agree byte for byte.
"""

from __future__ import annotations

import numpy as np

from mkemu.isa.semantics import jitable


@jitable
def _floor_div(a, b):
    return a // b


@jitable
def _ceil_div(a, b):
    return -((-a) // b)


@jitable
def rows_hit(lo, hi, base, inner, n, s):
    """Does [lo, hi) share a byte with rows [base + k*s, base + k*s + inner), k < n?"""
    if hi <= lo or inner <= 0 or n <= 0:
        return False
    if s < 0:
        base = base + (n - 1) * s
        s = -s
    if s == 0 or n == 1:
        return base < hi and base + inner > lo
    # Row k hits iff k*s < hi - base and k*s > lo - base - inner.
    k_max = _ceil_div(hi - base, s) - 1
    k_min = _floor_div(lo - base - inner, s) + 1
    return max(k_min, 0) <= min(k_max, n - 1)


@jitable
def interval_hits_block(lo, hi, addr, inner, n1, s1, n2, s2):
    """Does [lo, hi) share a byte with the block?"""
    if n2 <= 1 or s2 == 0:
        return rows_hit(lo, hi, addr, inner, n1, s1)
    plane_lo = min(0, (n1 - 1) * s1)
    plane_hi = max(0, (n1 - 1) * s1) + inner
    if s2 < 0:
        addr = addr + (n2 - 1) * s2
        s2 = -s2
    # Only planes whose outer range meets [lo, hi) can hit.
    first = max(0, _floor_div(lo - addr - plane_hi, s2) + 1)
    last = min(n2 - 1, _ceil_div(hi - addr - plane_lo, s2) - 1)
    for i2 in range(first, last + 1):
        if rows_hit(lo, hi, addr + i2 * s2, inner, n1, s1):
            return True
    return False


@jitable
def block_span(addr, inner, n1, s1, n2, s2):
    """The outer [lo, hi) of a block."""
    last1, last2 = (n1 - 1) * s1, (n2 - 1) * s2
    return addr + min(0, last1) + min(0, last2), addr + max(0, last1) + max(0, last2) + inner


# Row-against-plane tests the direct check may make (each O(1)); past this, and past
# 4x the rows of both blocks, the rows of the smaller block are sorted instead and
# every row of the other looked up among them, O((rows_a + rows_b) log rows_a): two
# DMAs of a million one-byte rows each in interleaved planes took half a minute the
# direct way. (A tile's 8 rows against a DMA in flight stay direct.)
_DIRECT_ROWS = 1 << 16


@jitable
def _direct_work(a_inner, a_rows, b_inner, b_n1, b_s1, b_n2, b_s2):
    """About how many row-against-plane tests the direct check makes: for each row of
    a, the planes of b whose outer range can meet it (interval_hits_block)."""
    if b_n2 <= 1 or b_s2 == 0:
        return a_rows
    extent = abs((b_n1 - 1) * b_s1) + b_inner + a_inner
    return a_rows * min(b_n2, extent // abs(b_s2) + 2)


@jitable
def _sorted_rows_overlap(a_addr, a_inner, a_n1, a_s1, a_n2, a_s2, b_addr, b_inner, b_n1, b_s1, b_n2, b_s2):
    """blocks_overlap by sorting a's row starts: a row [x, x + b_inner) of b shares a
    byte with a iff some row start of a lies in (x - a_inner, x + b_inner)."""
    starts = np.empty(a_n1 * a_n2, np.int64)
    k = 0
    for i2 in range(a_n2):
        for i1 in range(a_n1):
            starts[k] = a_addr + i2 * a_s2 + i1 * a_s1
            k += 1
    starts.sort()
    n = starts.size
    for i2 in range(b_n2):
        for i1 in range(b_n1):
            x = b_addr + i2 * b_s2 + i1 * b_s1
            # The first start above x - a_inner (binary search), then is it below x + b_inner?
            lo, hi = 0, n
            while lo < hi:
                mid = (lo + hi) >> 1
                if starts[mid] <= x - a_inner:
                    lo = mid + 1
                else:
                    hi = mid
            if lo < n and starts[lo] < x + b_inner:
                return True
    return False


@jitable
def blocks_overlap(a_addr, a_inner, a_n1, a_s1, a_n2, a_s2, b_addr, b_inner, b_n1, b_s1, b_n2, b_s2):
    """Do two blocks share a byte? (Each row of the block with fewer rows is tested
    against the other block.)"""
    a_lo, a_hi = block_span(a_addr, a_inner, a_n1, a_s1, a_n2, a_s2)
    b_lo, b_hi = block_span(b_addr, b_inner, b_n1, b_s1, b_n2, b_s2)
    if a_hi <= b_lo or b_hi <= a_lo:
        return False
    if a_n1 * a_n2 > b_n1 * b_n2:
        a_addr, a_inner, a_n1, a_s1, a_n2, a_s2, b_addr, b_inner, b_n1, b_s1, b_n2, b_s2 = (
            b_addr, b_inner, b_n1, b_s1, b_n2, b_s2, a_addr, a_inner, a_n1, a_s1, a_n2, a_s2)
    if _direct_work(a_inner, a_n1 * a_n2, b_inner, b_n1, b_s1, b_n2, b_s2) > \
            max(_DIRECT_ROWS, 4 * (a_n1 * a_n2 + b_n1 * b_n2)):
        return _sorted_rows_overlap(a_addr, a_inner, a_n1, a_s1, a_n2, a_s2, b_addr, b_inner, b_n1, b_s1, b_n2, b_s2)
    for i2 in range(a_n2):
        for i1 in range(a_n1):
            row = a_addr + i2 * a_s2 + i1 * a_s1
            if row < b_hi and row + a_inner > b_lo and \
                    interval_hits_block(row, row + a_inner, b_addr, b_inner, b_n1, b_s1, b_n2, b_s2):
                return True
    return False
