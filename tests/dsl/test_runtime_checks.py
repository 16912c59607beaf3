"""Run-time checks the compiler attaches to what it emits (free of cycles): an access
through a named buffer outside that buffer faults naming the buffer, the index and
the source line, even when it stays inside the memory (VMEM, SMEM, HBM, both ends of
a DMA); `global_core` with a run-time core index outside the chip faults."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import mkemu
from mkemu.errors import EmulatorFault

# `r` comes from the input at run time; each ACCESS uses it.
PROGRAM = """
kernel k(idx: hbm i32[8], x: hbm f32[16, 128], y: hbm f32[8, 128]) {{
    smem si: i32[8];
    smem other: i32[8];
    vmem a: f32[8, 128];
    vmem b: f32[8, 128];
    sem s;
    start copy(idx, si, s);
    wait copy(idx, si, s);
    start copy(x[0:8, :], a, s);
    wait copy(x[0:8, :], a, s);
    b = a * 2.0;
    let r = si[0];
    {access}
    start copy(a, y, s);
    wait copy(a, y, s);
}}
host {{
    input idx: i32[8];
    input x: f32[16, 128];
    output y: f32[8, 128];
    launch k(idx, x, y);
}}
"""
X = np.arange(16 * 128, dtype=np.float32).reshape(16, 128)

CASES = {
    "vmem store": ("a[r +: 1, :] = b[0:1, :];", 7, 9, "VMEM", "'a'", "[9, 0]"),
    "vmem load": ("a[0:1, :] = b[r +: 1, :];", 7, -1, "VMEM", "'b'", "[-1, 0]"),
    "smem load": ("si[1] = si[r];", 7, 8, "SMEM", "'si'", "[8]"),
    "smem store": ("si[r] = 5;", 7, 12, "SMEM", "'si'", "[12]"),
    "hbm dma source": ("start copy(x[r +: 8, :], a, s);\n    wait copy(x[r +: 8, :], a, s);", 8, 9,
                       "HBM", "'x'", "[9, 0]"),
    "vmem dma destination": ("start copy(x[0:1, :], b[r +: 1, :], s);\n    wait copy(x[0:1, :], b[r +: 1, :], s);",
                             7, 8, "VMEM", "'b'", "[8, 0]"),
}


def run(access: str, r: int):
    kernel = mkemu.compile_source(PROGRAM.format(access=access), "checks.mk", hw="tpu-v7-like")
    return kernel(idx=np.array([r] + [0] * 7, np.int32), x=X)


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_index_outside_its_buffer_faults_naming_it(case):
    access, good, bad, space, name, index = CASES[case]
    run(access, good)                                   # the last index inside: clean
    with pytest.raises(EmulatorFault) as info:
        run(access, bad)
    text = info.value.render()
    assert info.value.kind == "out-of-bounds"
    assert f"{space} access" in text and f"outside buffer {name}" in text, text
    assert f"starts at index {index}" in text, text
    assert "checks.mk:14" in text, text                # the access's source line


def test_the_checks_cost_no_cycles():
    # The same program run with its checks and with them stripped: same bits, cycles
    # and instruction count.
    kernel = mkemu.compile_source(PROGRAM.format(access=CASES["vmem store"][0]), "checks.mk",
                                  hw="tpu-v7-like")
    inputs = dict(idx=np.array([3] + [0] * 7, np.int32), x=X)
    checked = kernel(**inputs)
    program = kernel.program
    assert any(k.extents for k in program.kernels.values())
    kernel.program = attrs.evolve(program, kernels={
        name: attrs.evolve(k, extents={}, ranges={}) for name, k in program.kernels.items()})
    unchecked = kernel(**inputs)
    assert np.array_equal(checked.outputs["y@0"], unchecked.outputs["y@0"])
    for key in ("cycles", "instructions"):
        assert checked.report.figures[key] == unchecked.report.figures[key], key


GLOBAL_CORE = """
kernel k(idx: hbm i32[8], y: hbm i32[8]) {
    smem si: i32[8];
    sem s;
    start copy(idx, si, s);
    wait copy(idx, si, s);
    let c = si[0];
    si[1] = global_core(chip_id(), c);
    start copy(si, y, s);
    wait copy(si, y, s);
}
host {
    input idx: i32[8];
    output y: i32[8];
    launch k(idx, y);
}
"""


def test_global_core_with_a_run_time_core_outside_the_chip_faults():
    kernel = mkemu.compile_source(GLOBAL_CORE, "gc.mk", hw="tpu-v7-like", mesh="2x1x1")
    ok = kernel(idx=np.array([1] + [0] * 7, np.int32))
    assert [int(ok.outputs[f"y@{chip}"][1]) for chip in (0, 1)] == [1, 3]   # chip * 2 + 1
    with pytest.raises(EmulatorFault) as info:
        kernel(idx=np.array([2] + [0] * 7, np.int32))
    assert info.value.kind == "out-of-range"
    text = info.value.render()
    assert "global_core: core 2 does not exist (the chip has 2 cores, 0..1)" in text, text
    assert "gc.mk:8" in text, text


# HBM past 2 GiB: `big` (2.5 GiB of i32, the only buffer that holds data in a
# timing-only run besides idx and y) lies before idx and y, so their addresses need
# 64 bits too. Row 4 starts at 2 GiB: written through a run-time row index (shift
# path), read back through a constant one (a constant offset past int32).
WIDE = """
kernel k(idx: hbm i32[8], big: hbm i32[5, 134217728], y: hbm i32[8]) {
    smem si: i32[8];
    sem s;
    start copy(idx, si, s);
    wait copy(idx, si, s);
    let r = si[0];
    start copy(si, big[r, 1024:1032], s);
    wait copy(si, big[r, 1024:1032], s);
    start copy(big[4, 1024:1032], y, s);
    wait copy(big[4, 1024:1032], y, s);
}
host {
    hbm big: i32[5, 134217728];
    input idx: i32[8];
    output y: i32[8];
    launch k(idx, big, y);
}
"""


def test_hbm_addresses_past_2_gib_use_64_bits():
    kernel = mkemu.compile_source(WIDE, "wide.mk", hw="tpu-v7-like", timing_only=True)
    assert kernel.program.buffer("y").offset_bytes > 1 << 31
    idx = np.array([4, 11, 22, 33, 44, 55, 66, 77], np.int32)
    run = kernel(idx=idx)
    assert np.array_equal(run.outputs["y@0"], idx)
    with pytest.raises(EmulatorFault, match=r"outside buffer 'big' .* starts at index \[5, 1024\]"):
        kernel(idx=np.array([5, 0, 0, 0, 0, 0, 0, 0], np.int32))
