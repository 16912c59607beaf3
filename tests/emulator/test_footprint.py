"""Exact footprints: the overlap tests agree with the sets of bytes, for any strides."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mkemu.emulator.footprint import block_span, blocks_overlap, interval_hits_block


def byte_set(addr, inner, n1, s1, n2, s2) -> set[int]:
    return {addr + i2 * s2 + i1 * s1 + b for i2 in range(n2) for i1 in range(n1) for b in range(inner)}


blocks = st.tuples(st.integers(-64, 256), st.integers(1, 24), st.integers(1, 6), st.integers(-40, 40),
                   st.integers(1, 4), st.integers(-120, 120))


@settings(max_examples=400, deadline=None)
@given(blocks, blocks)
def test_blocks_overlap_iff_they_share_a_byte(a, b):
    assert blocks_overlap(*a, *b) == bool(byte_set(*a) & byte_set(*b))


@settings(max_examples=400, deadline=None)
@given(st.integers(-80, 300), st.integers(1, 60), blocks)
def test_an_interval_hits_a_block_iff_they_share_a_byte(lo, length, block):
    assert interval_hits_block(lo, lo + length, *block) == bool(set(range(lo, lo + length)) & byte_set(*block))


def test_column_blocks_of_one_buffer_are_disjoint():
    # An [8, 256] f32 buffer (1 KiB rows): column block 0 (bytes 0..511 of each row)
    # and column block 1 (512..1023) interleave but never share a byte.
    left = (0, 512, 8, 1024, 1, 0)
    right = (512, 512, 8, 1024, 1, 0)
    assert block_span(*left)[1] > block_span(*right)[0]      # the outer ranges overlap
    assert not blocks_overlap(*left, *right)
    assert blocks_overlap(*left, 500, 16, 1, 0, 1, 0)
