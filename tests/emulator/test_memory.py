"""A machine's VMEM starts zero, even where a machine before it wrote: the buffers of
cores that are gone are reused (their pages already faulted in) with what they wrote
zeroed, and never while something still refers to them."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from mkemu.emulator import memory

WRITER = """
    li s1, @x
    li s2, 4096
    dma.start vmem[s2], hbm[s1], s0, s0
    li s3, 4096
    sem.wait s0, s3
    li s6, 512
    vld.w v1, 4096(s0), s6, m0
    vst.w v1, 8192(s0), s6, m0
"""
# Reads back VMEM [4096, 12288), where the writer's DMA and store went.
READER = """
    li s1, @y
    li s2, 4096
    dma.start hbm[s1], vmem[s2], s0, s0
    li s3, 8192
    sem.wait s0, s3
"""


@pytest.fixture
def quiet_gc():
    """No collection in the test: the buffers given back are the test's own (a
    collection might free a machine of an earlier test, whose buffers come back last)."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def run_writer(emu):
    source = emu.kernel(WRITER, buffers=".buffer x f32 8x128 input\n", smem="0 4096 1 0 0 1 0 0")
    x = np.arange(1, 1 + 8 * 128, dtype=np.float32).reshape(8, 128)
    return emu.run(source, inputs={"x": x})


def run_reader(emu):
    source = emu.kernel(READER, buffers=".buffer y f32 16x128 output\n", smem="0 8192 1 0 0 1 0 0")
    return emu.run(source)


def test_a_machine_reads_zero_vmem_where_a_dropped_machine_wrote_and_reuses_its_memory(emu, quiet_gc):
    writer = run_writer(emu)
    assert writer.core.vmem[4096:12288].any()
    used = {address(core.vmem) for core in writer.machine.cores}
    del writer        # (a machine without a trace is freed at once: nothing refers back to it)
    reader = run_reader(emu)
    assert address(reader.core.vmem) in used
    assert not reader.buffer("y").any()
    assert not reader.core.vmem[:1 << 20].any()


def test_vmem_a_caller_still_views_is_never_reused(emu, quiet_gc):
    writer = run_writer(emu)
    kept = writer.core.vmem[8192:8200]
    before = kept.copy()
    mine = address(writer.core.vmem)
    del writer
    reader = run_reader(emu)
    assert address(reader.core.vmem) != mine
    assert not reader.buffer("y").any()
    assert np.array_equal(kept, before) and kept.any()


def test_a_spare_is_zeroed_where_it_was_written_and_kept_only_within_the_bound():
    size = 3 << 20
    buffer = memory.reused(size)
    buffer[100:200] = 7
    where = address(buffer)
    memory.give_back(buffer, 100, 200, 4096)
    del buffer
    again = memory.reused(size)
    assert address(again) == where and not again.any()
    held = memory.spare_bytes()
    memory.give_back(again, 0, 0, memory.SPARE_BYTES + 1)    # touched more than the spares may hold
    assert memory.spare_bytes() == held
    memory.give_back(again, 0, 0, 4096)
    assert memory.spare_bytes() == held + 4096


def test_hbm_larger_than_the_host_will_map_is_a_memory_error_saying_how_much():
    # Chips share one backing file, each mapping it privately: a mapping the host refuses
    # is a MemoryError (the command line reports it in one line), not an OSError.
    from mkemu.emulator.hbm import ChipMemories

    with pytest.raises(MemoryError, match=r"cannot map 1,152,921,504,606,846,976 bytes of host memory"):
        ChipMemories(2, 1 << 60).arrays


def _block_addresses(addr, inner, n1, s1, n2, s2):
    return [addr + i2 * s2 + i1 * s1 + j for i2 in range(n2) for i1 in range(n1) for j in range(inner)]


@st.composite
def _blocks(draw):
    """A 3-D block with any strides (zero, negative, overlapping rows) inside 256 bytes."""
    inner, n1, n2 = draw(st.integers(1, 8)), draw(st.integers(1, 5)), draw(st.integers(1, 4))
    s1, s2 = draw(st.integers(-40, 40)), draw(st.integers(-120, 120))
    lo = min(0, (n1 - 1) * s1) + min(0, (n2 - 1) * s2)
    hi = max(0, (n1 - 1) * s1) + max(0, (n2 - 1) * s2) + inner
    assume(hi - lo <= 256)
    return draw(st.integers(-lo, 256 - hi)), inner, n1, s1, n2, s2


@given(_blocks(), st.integers(0, 2**32 - 1))
def test_read_and_write_block_move_each_byte_of_any_block_in_its_order(block, seed):
    """A block of any strides is read as a snapshot in its order (one row per plane
    had come back as a view of the memory) and written with each byte's last write
    winning; without an index array per byte where the rows and planes lie apart."""
    rng = np.random.default_rng(seed)
    mem = rng.integers(0, 256, 256, dtype=np.uint8)
    addresses = _block_addresses(*block)
    got = memory.read_block(mem, *block)
    assert got.tolist() == mem[addresses].tolist() and not np.shares_memory(got, mem)
    data = rng.integers(0, 256, len(addresses), dtype=np.uint8)
    expected = mem.copy()
    for a, value in zip(addresses, data):
        expected[a] = value
    memory.write_block(mem, *block, data)
    assert mem.tolist() == expected.tolist()
