"""A view's start of several run-time terms (`a[i + j +: 1, :]`) is checked against the
whole buffer only (docs/safety.md, `out-of-bounds` (buffer)). Each term is scaled to bytes
in 32-bit arithmetic, so a term past 2^31 bytes wrapped around and the sum could land back
inside the buffer: i = 2^23, j = 2^23 + 3 over rows of 512 bytes read row 3, silently.
Each such term of a VMEM or SMEM view is now checked, free of cycles, to stay within an
equal share of what the 32-bit address can add without wrapping."""

from __future__ import annotations

import numpy as np
import pytest

import mkemu
from mkemu.errors import EmulatorFault
from mkemu.isa.hardware import load_profile

SOURCE = """
kernel k(n: hbm i32[1, 8], x: hbm f32[8, 128], out: hbm f32[8, 128]) {
    vmem a: f32[8, 128];
    vmem b: f32[8, 128];
    smem v: i32[1, 8];
    sem s;
    start copy(n, v, s);
    wait copy(n, v, s);
    start copy(x, a, s);
    wait copy(x, a, s);
    let i = v[0, 0];
    let j = v[0, 1];
    start copy(a[i + j +: 1, :], b[0:1, :], s);
    wait copy(a[i + j +: 1, :], b[0:1, :], s);
    start copy(b, out, s);
    wait copy(b, out, s);
}
"""
X = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)


def run(i: int, j: int):
    kernel = mkemu.compile_source(SOURCE, "t.mk", hw="test", mesh="1")
    n = np.zeros((1, 8), np.int32)
    n[0, :2] = i, j
    return kernel(n=n, x=X)


def test_an_index_inside_the_buffer_reads_its_row():
    out = run(1, 2).output("out")
    assert out[0].tobytes() == X[3].tobytes()


def test_an_index_past_the_buffer_faults_as_before():
    with pytest.raises(EmulatorFault) as info:
        run(4, 5)
    assert info.value.kind == "out-of-bounds"
    assert "is outside buffer 'a' (f32[8, 128]" in info.value.message and "index [9, 0]" in info.value.message


@pytest.mark.parametrize("i, j", [
    (2**23, 2**23 + 3),            # each term wraps: 2^32 + 3 * 512 bytes
    (2**23 + 3, 2**23),
    (-(2**23) - 1, 3),
    (-(2**22), -(2**22) + 3),      # each term fits in 32 bits, their sum -2^32 + 3 * 512 wraps
])
def test_a_term_whose_byte_offset_could_wrap_faults_at_its_scaling(i, j):
    with pytest.raises(EmulatorFault) as info:
        run(i, j)
    fault = info.value
    assert fault.kind == "out-of-bounds"
    # each of the 2 terms may add (2^31 - 1 - 2 * VMEM) // 2 bytes, VMEM of the test profile
    share = (2**31 - 1 - 2 * load_profile("test").vmem_bytes) // 2
    assert (f"the start in dimension 0 of 'a' (f32[8, 128]) has a run-time term {i:,} that, times its step of "
            f"512 bytes, is past the {share:,} bytes each of the view's 2 run-time terms may add") in fault.message
    assert f"must lie in {-(share // 512):,}..{share // 512:,}" in fault.message
    assert fault.instruction.startswith("shli") and "a[i + j +: 1, :]" in fault.source


def test_large_terms_that_stay_in_their_share_run():
    # 2^20 and -(2^20) + 3 rows: large, within the share, summing to row 3
    out = run(2**20, -(2**20) + 3).output("out")
    assert out[0].tobytes() == X[3].tobytes()
