"""Same program, same inputs, same options: same bits, same cycles, same statistics."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mkemu.cli import main
from mkemu.emulator.config import RunConfig

# Both cores stream their half of `x` through two buffers with overlapping DMAs,
# compute on the vector, transcendental and matrix units, and write `y` back.
PROGRAM = """
    rdsr s20, core
    shli s21, s20, 13
    shli s22, s20, 12
    li s1, @x
    add s1, s1, s21
    li s2, 0
    li s3, 4096
    dma.start vmem[s2], hbm[s1], s0, s0
    addi s1, s1, 4096
    dma.start vmem[s3], hbm[s1], s0, s0
    li s4, 8192
    sem.wait s0, s4
    li s6, 512
    vld.w v1, 0(s0), s6, m0
    vld.w v2, 4096(s0), s6, m0
    vexp.f32 v3, v1
    vmul.f32 v3, v3, v2
    vredsum.lane.f32 v4, v3
    vpack.bf16 v5, v2
    li s7, 65536
    li s8, 1
    mxu.push x0, v1, 0
    vst.w v5, 16384(s0), s6, m0
    li s9, 16384
    li s10, 256
    li s11, 524416
    mxu.ldw x0, 0(s9), s10, s11
    mxu.mac x0, a0, 1
    mxu.pop v6, x0, a0, 0
    vadd.f32 v6, v6, v4
    vst.w v6, 8192(s0), s6, m0
    li s1, @y
    add s1, s1, s22
    li s2, 8192
    dma.start hbm[s1], vmem[s2], s0, s8
    li s4, 4096
    sem.wait s8, s4
    barrier chip
"""


def run_once(emu, order):
    source = emu.kernel(PROGRAM, buffers=".buffer x f32 32x128 input\n.buffer y f32 16x128 output\n",
                        smem="0 4096 1 0 0 1 0 0", solo=False)
    x = np.random.default_rng(5).standard_normal((32, 128)).astype(np.float32)
    ran = emu.run(source, inputs={"x": x}, config=RunConfig(dma_order=order, seed=3))
    return ran.buffer("y"), ran.result.to_json(), [c.vu.copy() for c in ran.machine.cores]


@pytest.mark.parametrize("order", ["round_robin", "fifo"])
def test_two_runs_are_identical(emu, order):
    y1, json1, regs1 = run_once(emu, order)
    y2, json2, regs2 = run_once(emu, order)
    assert y1.tobytes() == y2.tobytes()
    assert json1 == json2
    assert all(np.array_equal(a, b) for a, b in zip(regs1, regs2))
    assert json1["cycles"] > 1000 and json1["dma_count"] == 6
    assert np.isfinite(y1).all() and not np.array_equal(y1[:8], y1[8:])


def test_cli_json_is_identical_across_runs(capsys):
    reports = []
    for _ in range(2):
        assert main(["run", "programs/examples/vector_add.s", "--hw", "test", "--mesh", "2",
                     "--json", "--seed", "11"]) == 0
        report = json.loads(capsys.readouterr().out)
        report.pop("wall_s"), report.pop("compile_s")   # host timings, not emulated figures
        reports.append(report)
    assert reports[0] == reports[1]
    assert reports[0]["bit_exact"] is True
