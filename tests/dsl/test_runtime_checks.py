"""Run-time checks the compiler attaches to what it emits (free of cycles): an index of
a view whose start is known only at run time that leaves its own dimension (the slot
index: the buffer's slots) faults naming the buffer, the dimension, the index and the
source line; an access through a named buffer outside that buffer faults naming the
buffer, the index and the source line, even when it stays inside the memory (VMEM,
SMEM, HBM, both ends of a DMA); `global_core` with a run-time core index outside the
chip faults."""

from __future__ import annotations

import re

import attrs
import numpy as np
import pytest

import mkemu
from mkemu.errors import EmulatorFault

# `r` comes from the input at run time; each ACCESS uses it.
DIMS = """
kernel k(idx: hbm i32[8], x: hbm f32[16, 512], y: hbm f32[8, 128]) {{
    smem si: i32[8];
    smem m: i32[4, 8];
    vmem a: f32[8, 128];
    vmem v: f32[8, 256];
    vmem w: f32[16, 128];
    vmem b: f32[3][8, 128];
    vmem xb: bf16[8, 128];
    vmem wt: bf16[256, 128];
    sem s;
    start copy(idx, si, s);
    wait copy(idx, si, s);
    a = 0.0;
    v = 1.0;
    w = 2.0;
    xb = 1.0;
    wt = 0.5;
    let r = si[0];
    {access}
    start copy(a, y, s);
    wait copy(a, y, s);
}}
host {{
    input idx: i32[8];
    input x: f32[16, 512];
    output y: f32[8, 128];
    launch k(idx, x, y);
}}
"""
DIMS_LINE = DIMS.splitlines().index("    {access}") + 1
X512 = np.arange(16 * 512, dtype=np.float32).reshape(16, 512)


def copy(src: str, dst: str) -> str:
    return f"start copy({src}, {dst}, s);\n    wait copy({src}, {dst}, s);"


def window(n: int, length: int) -> str:
    return f"is outside 0..{n - length}: a window of {length} from it would leave the dimension"


# name -> (access, values of r that must run, values that must fault, the fault's message)
DIM_CASES = {
    # docs/language.md: a row overrun inside the buffer (400 + 128 reaches row 1's columns)
    "hbm dma source, columns": (copy("x[0:8, r +: 128]", "a"), (0, 384), (400, 385, -1),
                                lambda v: f"index {v} of dimension 1 of 'x' (f32[16, 512]) {window(512, 128)}"),
    "hbm dma destination": (copy("a[0:1, :]", "x[3, r +: 128]"), (0, 384), (385, -1),
                            lambda v: f"index {v} of dimension 1 of 'x' (f32[16, 512]) {window(512, 128)}"),
    "vmem load, columns": ("a[0:1, :] = v[0:1, r +: 128];", (0, 128), (129, -1),
                           lambda v: f"index {v} of dimension 1 of 'v' (f32[8, 256]) {window(256, 128)}"),
    "vmem store, rows": ("w[r +: 2, :] = a[0:2, :];", (0, 14), (15, -1, -8),
                         lambda v: f"index {v} of dimension 0 of 'w' (f32[16, 128]) {window(16, 2)}"),
    "vmem dma destination": (copy("x[0:1, 0:128]", "v[0:1, r +: 128]"), (0, 128), (129, -1),
                             lambda v: f"index {v} of dimension 1 of 'v' (f32[8, 256]) {window(256, 128)}"),
    "smem load, a point index": ("si[1] = m[0, r];", (0, 7), (8, -1),
                                 lambda v: f"index {v} of dimension 1 of 'm' (i32[4, 8]) is outside 0..7"),
    "smem store, a point index": ("m[2, r] = 5;", (0, 7), (8, -1),
                                  lambda v: f"index {v} of dimension 1 of 'm' (i32[4, 8]) is outside 0..7"),
    "slot, vmem dma destination": (copy("x[0:8, 0:128]", "b[r]"), (0, 2), (3, -1),
                                   lambda v: f"slot {v} of 'b' (f32[3][8, 128]) is outside 0..2"),
    "slot, vmem load": ("a = b[r];", (0, 2), (3, -1),
                        lambda v: f"slot {v} of 'b' (f32[3][8, 128]) is outside 0..2"),
    "a coefficient": ("a[0:2, :] = w[r * 2 +: 2, :];", (0, 7), (8, -1),
                      lambda v: f"index 2*v = {2 * v} (v = {v}) of dimension 0 of 'w' (f32[16, 128]) "
                                f"{window(16, 2)}"),
    "a coefficient and a constant": ("a[0:2, :] = w[r * 2 + 3 +: 2, :];", (-1, 5), (6, -2),
                                     lambda v: f"index 2*v + 3 = {2 * v + 3} (v = {v}) of dimension 0 of 'w' "
                                               f"(f32[16, 128]) {window(16, 2)}"),
    "a negative coefficient": ("a[0:2, :] = w[r * -2 + 13 +: 2, :];", (0, 6), (7, -1),
                               lambda v: f"index -2*v + 13 = {13 - 2 * v} (v = {v}) of dimension 0 of 'w' "
                                         f"(f32[16, 128]) {window(16, 2)}"),
    "matmul weights": ("a = matmul(xb, wt[r +: 128, :]);", (0, 128), (129, -1),
                       lambda v: f"index {v} of dimension 0 of 'wt' (bf16[256, 128]) {window(256, 128)}"),
}


def run_dims(access: str, r: int, **options):
    kernel = mkemu.compile_source(DIMS.format(access=access), "dims.mk", hw="tpu-v7-like", **options)
    return kernel(idx=np.array([r] + [0] * 7, np.int32), x=X512)


@pytest.mark.parametrize("case", sorted(DIM_CASES))
def test_a_run_time_start_that_leaves_its_dimension_faults_naming_it(case):
    access, good, bad, message = DIM_CASES[case]
    for r in good:                                      # the first and last starts inside: clean
        run_dims(access, r)
    for r in bad:
        with pytest.raises(EmulatorFault) as info:
            run_dims(access, r)
        text = info.value.render()
        assert info.value.kind == "out-of-bounds", text
        assert message(r) in text, text
        assert f"dims.mk:{DIMS_LINE}:" in text, text    # the access's source line


def test_the_docs_example_reads_the_next_row_only_without_the_dimension_check():
    # x[0:8, i +: 128] on f32[16, 512] with i = 400: inside the buffer, past row 0's end.
    access = copy("x[0:8, r +: 128]", "a")
    kernel = mkemu.compile_source(DIMS.format(access=access), "dims.mk", hw="tpu-v7-like")
    (check,) = [c for k in kernel.program.kernels.values() for c in k.ranges.values()]
    assert (check.lo, check.hi, check.kind) == (0, 385, "out-of-bounds")
    kernel.program = attrs.evolve(kernel.program, kernels={
        name: attrs.evolve(k, ranges={}) for name, k in kernel.program.kernels.items()})
    kernel(idx=np.array([400] + [0] * 7, np.int32), x=X512)          # only the whole buffer: clean


def test_a_timing_only_run_checks_dimensions_too():
    access, _, _, message = DIM_CASES["hbm dma source, columns"]
    run_dims(access, 384, timing_only=True)
    with pytest.raises(EmulatorFault, match=re.escape(message(400))):
        run_dims(access, 400, timing_only=True)


SELECT = """
kernel k(idx: hbm i32[4, 8], y: hbm i32[8]) {
    smem m: i32[4, 8];
    smem o: i32[8];
    sem s;
    start copy(idx, m, s);
    wait copy(idx, m, s);
    for j in 0..8 {
        o[j] = select(j + 1 < 8, m[0, j + 1], 0);
    }
    start copy(o, y, s);
    wait copy(o, y, s);
}
host { input idx: i32[4, 8]; output y: i32[8]; launch k(idx, y); }
"""


def test_the_sides_of_a_run_time_select_get_no_dimension_check():
    # Both sides are read whichever is picked: at j = 7 the unpicked m[0, 8] (m[1, 0],
    # inside m) is read and dropped. The side was checked at compile time under
    # j + 1 < 8, so the program runs.
    kernel = mkemu.compile_source(SELECT, "select.mk", hw="tpu-v7-like")
    m = np.arange(32, dtype=np.int32).reshape(4, 8)
    assert list(kernel(idx=m).outputs["y@0"]) == [1, 2, 3, 4, 5, 6, 7, 0]
    whats = [c.what for k in kernel.program.kernels.values() for c in k.ranges.values()]
    assert any("'o'" in w for w in whats) and not any("'m'" in w for w in whats), whats   # o[j]: checked


def test_the_unpicked_side_of_a_select_may_read_past_its_buffer_at_the_last_row():
    # At row 3, j = 7, the unpicked side reads m[3, 8]: past the end of m. Its indices
    # were proven in range under j + 1 < 8, so it has no run-time check at all (it used
    # to fault through the whole-buffer check).
    kernel = mkemu.compile_source(SELECT.replace("m[0, j + 1]", "m[3, j + 1]"), "select.mk", hw="tpu-v7-like")
    m = np.arange(32, dtype=np.int32).reshape(4, 8)
    assert list(kernel(idx=m).outputs["y@0"]) == [25, 26, 27, 28, 29, 30, 31, 0]


def test_a_select_side_with_a_run_time_index_keeps_its_buffer_check():
    # m[3, m[0, 0]]: an index known only at run time is not proven by the condition.
    src = SELECT.replace("m[0, j + 1]", "m[3, m[0, 0] + j]")
    kernel = mkemu.compile_source(src, "select.mk", hw="tpu-v7-like")
    m = np.zeros((4, 8), np.int32)
    m[0, 0] = 1
    with pytest.raises(EmulatorFault, match=r"outside buffer 'm'") as info:
        kernel(idx=m)
    assert "select.mk:9:" in info.value.render()


# `r` and `q` come from the input at run time (q = 0); each ACCESS uses them. A start of
# two run-time terms (r + q) is checked against the whole buffer only.
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
    let r = si[0]; let q = si[1];
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
    "vmem store": ("a[r + q +: 1, :] = b[0:1, :];", 7, 9, "VMEM", "'a'", "[9, 0]"),
    "vmem load": ("a[0:1, :] = b[r + q +: 1, :];", 7, -1, "VMEM", "'b'", "[-1, 0]"),
    "smem load": ("si[2] = si[r + q];", 7, 8, "SMEM", "'si'", "[8]"),
    "smem store": ("si[r + q] = 5;", 7, 12, "SMEM", "'si'", "[12]"),
    "hbm dma source": ("start copy(x[r + q +: 8, :], a, s);\n    wait copy(x[r + q +: 8, :], a, s);", 8, 9,
                       "HBM", "'x'", "[9, 0]"),
    "vmem dma destination": ("start copy(x[0:1, :], b[r + q +: 1, :], s);\n    "
                             "wait copy(x[0:1, :], b[r + q +: 1, :], s);", 7, 8, "VMEM", "'b'", "[8, 0]"),
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


def test_a_start_of_several_run_time_terms_is_checked_against_the_whole_buffer_only():
    # (documented) b[0:1, r + q +: 1] with r + q = 128 is past row 0's 128 columns but
    # inside b (b[1, 0]): not reported; from b's last row it leaves b and faults.
    run("a[0:1, :] = b[0:1, r + q +: 1];", 127)
    with pytest.raises(EmulatorFault, match=r"outside buffer 'b'"):
        run("a[0:1, :] = b[7:8, r + q +: 1];", 128)
    run("a[0:1, :] = b[0:1, r + q +: 1];", 128)         # b[1, 0]: not reported


@pytest.mark.parametrize("program, access, r", [(PROGRAM, CASES["vmem store"][0], 3),
                                                (DIMS, DIM_CASES["hbm dma source, columns"][0], 384),
                                                (DIMS, DIM_CASES["slot, vmem load"][0], 2)])
def test_the_checks_cost_no_cycles(program, access, r):
    # The same program run with its checks and with them stripped: same bits, cycles
    # and instruction count.
    kernel = mkemu.compile_source(program.format(access=access), "checks.mk", hw="tpu-v7-like")
    inputs = dict(idx=np.array([r] + [0] * 7, np.int32), x=X if program is PROGRAM else X512)
    checked = kernel(**inputs)
    compiled = kernel.program
    assert any(k.extents for k in compiled.kernels.values())
    # (range checks: the per-dimension ones of DIMS, and in PROGRAM those of the terms of
    # `r + q`, which may not add enough to wrap the address around)
    assert any(k.ranges for k in compiled.kernels.values())
    kernel.program = attrs.evolve(compiled, kernels={
        name: attrs.evolve(k, extents={}, ranges={}) for name, k in compiled.kernels.items()})
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
    with pytest.raises(EmulatorFault, match=r"index 5 of dimension 0 of 'big' \(i32\[5, 134217728\]\) is "
                                            r"outside 0\.\.4"):
        kernel(idx=np.array([5, 0, 0, 0, 0, 0, 0, 0], np.int32))


def test_a_run_time_window_longer_than_its_dimension_is_a_compile_error():
    # (No start could fit: a run-time check would fault for every value.)
    src = DIMS.replace("    vmem a: f32[8, 128];\n", "    vmem a: f32[8, 128];\n    vmem big: f32[32, 128];\n")
    with pytest.raises(mkemu.errors.SourceError) as info:
        mkemu.compile_source(src.format(access=copy("x[r +: 32, 0:128]", "big")), "dims.mk", hw="tpu-v7-like")
    text = info.value.render()
    assert "a window of 32 is longer than dimension 0 of 'x' (size 16): no start fits" in text, text
    assert "dims.mk:" in text
