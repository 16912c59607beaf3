"""The pipeline statement: the example (fresh slots, shared slots with a prefetch, an
output stream) and a run-time strided pipeline run bit-exact under the emulator's race
checks; misuse is a caret error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.dsl.test_compiler import bf16, f32, mm, run, same
from tests.dsl.test_errors import kernel_errors

DATA = Path(__file__).with_name("data")


def test_pipeline_example_streams_weights_and_results():
    x, w = bf16(8, 256), bf16(256, 1024)
    outs, _, _ = run((DATA / "pipeline.mk").read_text(), {"x": x, "w": w})
    expected = mm(x, w)
    same(expected, outs["y"])
    same(expected * np.float32(2.0), outs["y2"])


def test_runtime_strided_pipeline_on_every_core_with_depth_one_and_four():
    # Each core doubles its own row blocks j = core, core + 2, ... of x (8 blocks).
    text = """
kernel k(x: hbm f32[8, 1024], y: hbm f32[8, 1024]) {
    let me = core_id();
    pipeline j in me..1024 / 128 step num_cores() depth D {
        input xt = x[:, j * 128 +: 128];
        output yt = y[:, j * 128 +: 128];
        yt = xt + xt;
    }
}
"""
    x = f32(8, 1024)
    for depth in (1, 4):
        outs, _, _ = run(text.replace("step num_cores()", "step 2").replace(" D ", f" {depth} "), {"x": x})
        same(x * np.float32(2.0), outs["y"])


def test_pipeline_errors(tmp_path, monkeypatch):
    body = """\
vmem ring: bf16[2][128, 128];
vmem small: f32[2][8, 64];
sem rs[2];
sem rs3[3];
pipeline t in 0..2 {
    x = x * 2.0;
    input xt = a[:, t * 128 +: 128];
}
pipeline t in 0..2 { x = x * 2.0; }
pipeline t in 0..2 part 3 {
    input wt = w[0:128, t * 128 +: 128] via ring, rs;
}
pipeline t in 0..2 part primed {
    input wt = w[0:128, t * 128 +: 128];
    x = x * 2.0;
}
pipeline t in 0..2 {
    input xt = a[:, t * 128 +: 128] via small, rs;
}
pipeline t in 0..2 {
    input wt = w[0:128, t * 128 +: 128] via ring, rs3;
}
input q = a[:, 0:128];
"""
    assert kernel_errors(body, tmp_path, monkeypatch) == (
        "prog.mk:11:9: error: a pipeline's streams (input/output) come first, before its body\n"
        "          input xt = a[:, t * 128 +: 128];\n"
        "          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "prog.mk:13:5: error: a pipeline needs at least one stream: `input x = VIEW;` or `output y = VIEW;` at "
        "the top of its block\n"
        "      pipeline t in 0..2 { x = x * 2.0; }\n"
        "      ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "prog.mk:14:29: error: the part of a pipeline is whole (0), prefetch (1) or primed (2), got 3\n"
        "      pipeline t in 0..2 part 3 {\n"
        "                              ^\n"
        "prog.mk:18:9: error: the inputs of a pipeline run in parts (primed) give their slots with `via BUF, "
        "SEMS` (the prefetch and the primed run share them)\n"
        "          input wt = w[0:128, t * 128 +: 128];\n"
        "          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "prog.mk:22:45: error: slots f32[8, 64] of 'small' cannot hold the tile f32[8, 128]\n"
        "          input xt = a[:, t * 128 +: 128] via small, rs;\n"
        "                                              ^^^^^\n"
        "prog.mk:25:55: error: 'ring' has 2 slots but 'rs3' 3 semaphores: one per slot\n"
        "          input wt = w[0:128, t * 128 +: 128] via ring, rs3;\n"
        "                                                        ^^^\n"
        "prog.mk:27:5: error: 'input q = ...' declares a stream of a pipeline: it goes at the top of a pipeline's "
        "block\n"
        "      input q = a[:, 0:128];\n"
        "      ^^^^^^^^^^^^^^^^^^^^^^"
    )


def test_tiles_from_two_arrays_through_a_run_time_select():
    # y = x @ [w1 | w2]: tile j comes from w1 for j < 2, from w2 after; and one copy
    # whose source is picked at run time.
    text = """
kernel k(x: hbm bf16[8, 256], w1: hbm bf16[256, 256], w2: hbm bf16[256, 256], y: hbm f32[8, 512],
         z: hbm bf16[2, 256, 128]) {
    vmem xv: bf16[8, 256];
    vmem zv: bf16[256, 128];
    sem s;
    start copy(x, xv, s);
    wait copy(x, xv, s);
    pipeline j in 0..4 depth 3 {
        input wt = select(j < 2, w1[:, j * 128 +: 128], w2[:, (j - 2) * 128 +: 128]);
        output yt = y[:, j * 128 +: 128];
        yt = matmul(xv, wt);
    }
    let h = copy(select(core_id() == 0, w2[:, 128:256], w1[:, 0:128]), zv, s);
    start h;
    wait h;
    start copy(zv, z[core_id()], s);
    wait copy(zv, z[core_id()], s);
}
"""
    x, w1, w2 = bf16(8, 256), bf16(256, 256), bf16(256, 256)
    outs, _, _ = run(text, {"x": x, "w1": w1, "w2": w2})
    same(mm(x, np.concatenate([w1, w2], axis=1)), outs["y"])
    same(np.stack([w2[:, 128:256], w1[:, 0:128]]), outs["z"])   # core 0 picks w2, core 1 w1


def test_prologue_tiles_past_a_run_time_count_are_not_issued():
    # depth 4 starts up to 3 tiles ahead; with n = 2 the third would lie past x's end.
    # Whether it exists is known at run time only, so the prologue guards it and its
    # view is not bounds-checked at compile time (the emulator checks every DMA).
    text = """
kernel k(x: hbm f32[16, 128], y: hbm f32[16, 128], n: i32) {
    pipeline t in 0..n depth 4 {
        input xt = x[t * 8 +: 8, :];
        output yt = y[t * 8 +: 8, :];
        yt = xt * 3.0;
    }
}
host {
    input x: f32[16, 128];
    output y: f32[16, 128];
    launch k(x, y, 2);
}
"""
    x = f32(16, 128)
    outs, _, _ = run(text, {"x": x})
    same(x * np.float32(3.0), outs["y"])


WHOLE_OUT_OF_RANGE = """\
pipeline t in 0..5 {
    input wt = w[0:128, t * 256 +: 256];
    output yt = w[128:256, t * 256 +: 256];
    yt = wt;
}
"""
PRIMED_OUT_OF_RANGE = """\
vmem ring: bf16[2][128, 128];
sem rs[2];
pipeline t in 0..3 part prefetch {
    input wt = w[0:128, t * 128 +: 128] via ring, rs;
}
pipeline t in 0..3 part primed {
    input wt = w[0:128, t * 128 +: 128] via ring, rs;
    output yt = w[128:256, t * 128 +: 128];
    yt = wt;
}
"""


@pytest.mark.parametrize("body, lines", [
    # The input's error gave the range of the tiles the loop prefetches (256..1280), the
    # output's that of every tile (0..1280): both now say every tile's.
    (WHOLE_OUT_OF_RANGE, ((6, 29), (7, 32), "0..1280")),
    # The same in a primed pipeline, whose prefetch part's copies are then not also
    # reported never waited.
    (PRIMED_OUT_OF_RANGE, ((11, 29), (12, 32), "0..384")),
])
def test_a_stream_out_of_range_at_some_tile_is_one_error_over_every_tile(tmp_path, monkeypatch, body, lines):
    (input_at, output_at, reach) = lines
    out = kernel_errors(body, tmp_path, monkeypatch)
    assert [line for line in out.splitlines() if "error" in line] == [
        f"prog.mk:{line}:{column}: error: slice reaching {reach} is out of range for dimension 1 of 'w' (size 256)"
        for line, column in (input_at, output_at)]
