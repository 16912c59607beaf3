"""docs/safety.md, "Other run-time checks": what is and is not an alignment fault."""

from __future__ import annotations

import numpy as np
import pytest

import mkemu
from mkemu.errors import EmulatorFault

BUF = ".buffer src i32 8x128 input\n"


def test_a_dma_moves_bytes_at_any_alignment(emu):
    """DMAs need no alignment: 5 bytes from HBM byte 1 into VMEM byte 3, no fault."""
    source = emu.kernel("""
        li s1, @src
        addi s1, s1, 1
        li s2, 3
        dma.start vmem[s2], hbm[s1], s0, s0
        li s3, 5
        sem.wait s0, s3
    """, buffers=BUF, smem="0 5 1 0 0 1 0 0")
    src = np.arange(1, 1025, dtype=np.int32).reshape(8, 128) * 0x01010101
    ran = emu.run(source, inputs={"src": src})
    assert np.array_equal(ran.core.vmem[3:8], src.view(np.uint8).reshape(-1)[1:6])
    assert not ran.core.vmem[:3].any() and not ran.core.vmem[8:16].any()


def test_a_misaligned_dma_descriptor_is_out_of_bounds(emu):
    source = emu.kernel("li s1, @src\nli s2, 2\ndma.start vmem[s0], hbm[s1], s2, s0", buffers=BUF)
    with pytest.raises(EmulatorFault) as info:
        emu.run(source)
    assert info.value.kind == "out-of-bounds"
    assert "descriptor at SMEM 2 is outside SMEM or misaligned" in info.value.render()


@pytest.mark.parametrize("body", ["li s1, 2\nli s2, 512\nvld.w v1, 0(s1), s2, m0",
                                  "li s2, 3\nvst.bf16 v1, 0(s0), s2, m0",
                                  "li s2, 256\nli s3, 8388736\nmxu.ldw x0, 1(s0), s2, s3",
                                  "sts s0, 2(s0)"])
def test_vector_matrix_and_smem_word_accesses_must_be_aligned(emu, body):
    with pytest.raises(EmulatorFault) as info:
        emu.run(emu.kernel(body))
    assert info.value.kind == "misaligned"


def test_a_buffer_access_inside_the_memory_but_outside_the_buffer_faults_at_its_line():
    src = """
kernel k(n: i32, a: hbm f32[8, 256]) {
    vmem av: f32[8, 256];
    av[:, n +: 128] = av[:, 0:128];
}
host { input a: f32[8, 256]; launch k(200, a); }
"""
    kernel = mkemu.compile_source(src, "oob.mk", hw="test", mesh="1x1x1")
    with pytest.raises(EmulatorFault) as info:
        kernel(a=np.zeros((8, 256), np.float32))
    text = info.value.render()
    assert info.value.kind == "out-of-bounds"
    assert ("index 200 of dimension 1 of 'av' (f32[8, 256]) is outside 0..128: a window of 128 from it "
            "would leave the dimension") in text and "oob.mk:4:" in text, text
