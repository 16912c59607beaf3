"""Exact footprints: the overlap tests agree with the sets of bytes, for any strides."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mkemu.emulator import loop
from mkemu.emulator.footprint import _direct_work, _sorted_rows_overlap, block_span, blocks_overlap, interval_hits_block


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


@settings(max_examples=400, deadline=None)
@given(blocks, blocks)
def test_the_sorted_rows_check_of_large_blocks_agrees_with_the_bytes(a, b):
    # Blocks past _DIRECT_ROWS row-against-plane tests are compared this way.
    assert _sorted_rows_overlap(*a, *b) == bool(byte_set(*a) & byte_set(*b))


def test_two_interleaved_blocks_of_a_million_rows_are_compared_at_once():
    # Found while fuzzing: two DMAs of 1,024,000 one-byte rows in 1,024 planes 4 bytes
    # apart, interleaved byte by byte, took the race check half a minute (a row of one
    # against every plane of the other); the machine's compiled check is used here.
    overlap = loop.compiled("overlap")
    a = (0, 1, 1000, 4096, 1024, 4)
    b = (1, 1, 1000, 4096, 1024, 4)
    assert not overlap(*a, *b)
    last = 999 * 4096 + 1023 * 4
    assert overlap(*a, last, 1, 1, 0, 1, 0)                            # a's last byte
    assert not overlap(*a, last + 1, 1, 1, 0, 1, 0)                    # past it
    # That pair takes the sorted check; a tile's 8 rows against such a DMA stay direct.
    assert _direct_work(1, 1000 * 1024, 1, 1000, 4096, 1024, 4) > 4 * 2 * 1000 * 1024
    assert _direct_work(512, 8, 4, 1, 0, 10**6, 8) < 1 << 16
