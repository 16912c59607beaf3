"""Timing-only runs at the machine level: HBM holds only the i32 buffers, so a chip
of any size costs their bytes; 64-bit addresses reach past 2 GiB; cycles equal the
data run's."""

from __future__ import annotations

import numpy as np
import pytest

from mkemu.emulator.config import RunConfig

GIB = 1 << 30

# idx (i32) -> SMEM -> res (i32); a 4 KiB block from 3 GiB into `big` -> VMEM.
SOURCE = """
.buffer idx i32 8x128 input
.buffer res i32 8x128 output
.buffer big bf16 1536x1048576 input
.kernel main
    .smem 0 4096 1 0 0 1 0 0
    rdsr s31, core
    bne s31, s0, __end
    li s1, @idx
    li s3, 4096
    dma.start smem[s3], hbm[s1], s0, s0
    sem.wait s0, s3
    li s2, 3
    shli.d s2, s2, 30
    addi.d s2, s2, -4096
    li s4, @big
    add.d s2, s2, s4
    dma.start vmem[s0], hbm[s2], s0, s0
    sem.wait s0, s3
    li s5, @res
    dma.start hbm[s5], smem[s3], s0, s0
    sem.wait s0, s3
__end:
    halt
"""


@pytest.fixture
def big_profile(emu):
    return emu.profile("big_hbm", f"[chip]\nhbm_bytes = {4 * GIB}\n")


def _run(emu, profile, timing_only: bool):
    idx = np.arange(1024, dtype=np.int32).reshape(8, 128) * 7
    machine = emu.machine(SOURCE, profile=profile, config=RunConfig(timing_only=timing_only),
                          inputs={"idx": idx})
    return machine, machine.run(), idx


def test_timing_only_hbm_keeps_only_i32_buffers_and_charges_the_same_cycles(emu, big_profile):
    data_machine, data, idx = _run(emu, big_profile, timing_only=False)
    machine, timed, _ = _run(emu, big_profile, timing_only=True)
    assert timed.cycles == data.cycles
    assert np.array_equal(machine.read_buffer(0, "res"), idx)
    assert np.array_equal(data_machine.read_buffer(0, "res"), idx)
    with pytest.raises(ValueError, match="holds no data in a timing-only run"):
        machine.read_buffer(0, "big")


def test_a_64_bit_address_past_the_chip_faults_in_both_modes(emu, big_profile):
    far = SOURCE.replace("li s2, 3\n", "li s2, 5\n")      # 5 GiB: past the 3 GiB the program has
    for timing_only in (False, True):
        machine = emu.machine(far, profile=big_profile, config=RunConfig(timing_only=timing_only))
        with pytest.raises(Exception, match=r"\[5368713216, 5368717312\) is outside HBM \(DMA source\)"):
            machine.run()
