"""docs/safety.md, "Exact footprints": a vector access under a mask that is not a
rectangle touches the rows from its first active row to its last, and its lanes' range;
a DMA in flight on other rows of the tile does not race with it."""

from __future__ import annotations

import pytest

from mkemu.errors import EmulatorFault

BUF = ".buffer a f32 8x128 input\n"
ROW = 512      # bytes of one tile row at this stride: 128 f32 lanes

# m3: rows `first`.. of the tile (not mrows(first)); m5: rows 0 and 7 (mrows(1) or m3 with first = 7).
MASKS = """
    li s10, {first}
    li s11, 128
    mrows m2, s10, s11
    mnot m3, m2
    li s10, 1
    mrows m4, s10, s11
    mor m5, m4, m3
    li s6, 512
"""


def kernel(emu, dma_rows: tuple[int, int], access: str, first: int, into_vmem: bool = True) -> str:
    """A DMA into VMEM rows [r0, r1) of the tile at 0 (or out of them into HBM), then
    `access` while it is in flight, then the wait."""
    r0, r1 = dma_rows
    size = (r1 - r0) * ROW
    dma = "dma.start vmem[s2], hbm[s1], s3, s4" if into_vmem else "dma.start hbm[s1], vmem[s2], s3, s4"
    return emu.kernel(f"li s1, @a\nli s2, {r0 * ROW}\nli s3, 0\nli s4, 0\n{dma}\n" + MASKS.format(first=first)
                      + f"{access}\nli s7, {size}\nsem.wait s4, s7", buffers=BUF, smem=f"0 {size} 1 0 0 1 0 0")


@pytest.mark.parametrize("access, into_vmem", [("vld.w v0, 0(s0), s6, m3", True),
                                               ("vst.w v0, 0(s0), s6, m3", False)])
def test_an_access_to_the_last_rows_does_not_race_with_a_dma_on_the_first(emu, access, into_vmem):
    emu.run(kernel(emu, (0, 1), access, first=7, into_vmem=into_vmem))


def test_an_access_to_the_last_rows_races_with_a_dma_on_them_naming_only_those_rows(emu):
    with pytest.raises(EmulatorFault) as info:
        emu.run(kernel(emu, (6, 8), "vld.w v0, 0(s0), s6, m3", first=6))
    assert info.value.kind == "race"
    assert f"VMEM [{6 * ROW}, {8 * ROW})" in info.value.message


def test_rows_a_mask_leaves_off_between_its_first_and_last_still_count(emu):
    # m5 is rows 0 and 7: a DMA on rows 2..5 lies inside the span (documented as coarser).
    with pytest.raises(EmulatorFault) as info:
        emu.run(kernel(emu, (2, 6), "vld.w v0, 0(s0), s6, m5", first=7))
    assert info.value.kind == "race" and f"VMEM [0, {8 * ROW})" in info.value.message
