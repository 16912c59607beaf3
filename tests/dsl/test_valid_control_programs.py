"""Valid control-flow and memory programs, as docs/language.md describes them, compiled
and run through the public API and compared bit for bit with numpy."""

from __future__ import annotations

import numpy as np
import pytest

import mkemu
from mkemu.errors import SourceError

RNG = np.random.default_rng(7)


def run(src: str, mesh: str = "1", **inputs):
    return mkemu.compile_source(src, "/tmp/valid_control.mk", hw="test", mesh=mesh)(**inputs)


def same(expected, got) -> None:
    expected, got = np.asarray(expected), np.asarray(got)
    assert expected.shape == got.shape
    if expected.dtype.kind == "f":
        np.testing.assert_array_equal(expected.astype(np.float32).view(np.uint32),
                                      got.astype(np.float32).view(np.uint32))
    else:
        np.testing.assert_array_equal(expected, got)


def test_let_from_loop_variable_is_narrowed_by_an_enclosing_if():
    # "Static starts, and starts that are affine in loop variables with static bounds, are
    # checked ... (narrowed by enclosing `if i + 1 < N`-style conditions)": a let holding
    # t + 1, bound before the `if`, is narrowed with t.
    src = """
param T = 6;
kernel k(x: hbm f32[T, 8, 128], y: hbm f32[T, 8, 128]) {
    vmem b: f32[2][8, 128];
    sem ws[2];
    sem s;
    start copy(x[0], b[0], ws[0]);
    for t in 0..T {
        let nt = t + 1;
        if t + 1 < T {
            start copy(x[nt], b[nt % 2], ws[nt % 2]);
        }
        wait copy(x[t], b[t % 2], ws[t % 2]);
        b[t % 2] = b[t % 2] + f32(nt);
        start copy(b[t % 2], y[t], s);
        wait copy(b[t % 2], y[t], s);
    }
}
"""
    x = RNG.standard_normal((6, 8, 128)).astype(np.float32)
    same(x + np.arange(1, 7, dtype=np.float32)[:, None, None], run(src, x=x).output("y"))


def test_else_branch_is_narrowed_by_the_negated_condition():
    src = """
kernel k(x: hbm f32[6, 8, 128], y: hbm f32[6, 8, 128]) {
    vmem b: f32[8, 128];
    sem s;
    for t in 0..6 {
        let prev = t - 1;
        if t == 0 {
            b = 0.0;
        } else {
            start copy(x[prev], b, s);
            wait copy(x[prev], b, s);
        }
        if t + 1 >= 6 {
        } else if t > 2 {
            start copy(x[t + 1, 0:1, :], b[0:1, :], s);
            wait copy(x[t + 1, 0:1, :], b[0:1, :], s);
        }
        start copy(b, y[t], s);
        wait copy(b, y[t], s);
    }
}
"""
    x = RNG.standard_normal((6, 8, 128)).astype(np.float32)
    expected = np.zeros_like(x)
    expected[1:] = x[:-1]
    for t in (3, 4):
        expected[t, 0] = x[t + 1, 0]
    same(expected, run(src, x=x).output("y"))


def test_narrowing_a_let_still_reports_a_slice_out_of_range():
    src = """
kernel k(x: hbm f32[6, 8, 128]) {
    vmem b: f32[8, 128];
    sem s;
    for t in 0..6 {
        let nt = t + 2;
        if t + 1 < 6 {
            start copy(x[nt], b, s);
            wait copy(x[nt], b, s);
        }
    }
}
"""
    with pytest.raises(SourceError, match="index ranging over 2..6 is out of range"):
        mkemu.compile_source(src, "/tmp/valid_control.mk", hw="test", mesh="1")


@pytest.mark.parametrize("cond", ["m < 8", "m <= 7", "8 > m", "m - t < 5", "!(m >= 8)"])
def test_a_condition_on_a_let_narrows_the_loop_variable_it_is_computed_from(cond):
    # "narrowed by enclosing `if i + 1 < N`-style conditions: a comparison in which one
    # loop variable, or a `let` computed from loop variables, appears times a constant":
    # `if m < 8` with m = 2 * t + 1 holds for t <= 3, so o[t + 4] is in range (it was
    # rejected: the condition narrowed m only, not t).
    src = """
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem b: f32[8, 128];
    vmem o: f32[8, 128];
    sem s;
    start copy(x, b, s);
    wait copy(x, b, s);
    o = 0.0;
    for t in 0..8 {
        let m = 2 * t + 1;
        if COND {
            o[t + 4, :] = b[t, :] + f32(m);
        }
    }
    start copy(o, y, s);
    wait copy(o, y, s);
}
""".replace("COND", cond)
    x = RNG.standard_normal((8, 128)).astype(np.float32)
    expected = np.zeros_like(x)
    expected[4:] = x[:4] + np.array([1, 3, 5, 7], np.float32)[:, None]
    same(expected, run(src, x=x).output("y"))


def test_a_condition_on_a_let_still_rejects_what_it_leaves_out_of_range():
    src = """
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem o: f32[8, 128];
    sem s;
    o = 0.0;
    for t in 0..8 {
        let m = 2 * t + 1;
        if m < 10 {
            o[t + 4, :] = 1.0;
        } else {
            o[t - 5, :] = 2.0;
        }
    }
    start copy(o, y, s);
    wait copy(o, y, s);
}
"""
    with pytest.raises(SourceError) as e:
        mkemu.compile_source(src, "/tmp/valid_control.mk", hw="test", mesh="1")
    # The then branch (t <= 4) reaches row 8; the else branch (t >= 5) is in range.
    assert "index ranging over 4..8 is out of range" in str(e.value)
    assert str(e.value).count("error:") == 1


def test_a_select_side_is_checked_under_a_condition_on_a_let():
    # "A side is bounds-checked with the loop ranges its condition allows": j < 8 with
    # j = i + 1 allows i <= 6, so sm[i + 1] is in range (it was rejected).
    src = """
kernel k(m: hbm i32[8], z: hbm i32[8]) {
    smem sm: i32[8];
    smem zo: i32[8];
    sem s;
    start copy(m, sm, s);
    wait copy(m, sm, s);
    for i in 0..8 {
        let j = i + 1;
        zo[i] = select(j < 8, sm[i + 1], -5);
    }
    start copy(zo, z, s);
    wait copy(zo, z, s);
}
"""
    m = np.arange(100, 108, dtype=np.int32)
    same(np.array([101, 102, 103, 104, 105, 106, 107, -5], np.int32), run(src, m=m).output("z"))


def test_global_core_assigned_to_the_variable_it_reads():
    src = """
kernel k(y: hbm i32[2, 4]) {
    smem t: i32[4];
    sem s;
    var q: i32 = 1;
    q = global_core(chip_id(), q);
    var c: i32 = 1;
    c = global_core(c, 0);
    var p: i32 = 1;
    p = peer(0, p);
    t[0] = q; t[1] = c; t[2] = p;
    start copy(t, y[core_id()], s);
    wait copy(t, y[core_id()], s);
}
"""
    r = mkemu.compile_source(src, "/tmp/valid_control.mk", hw="tpu-v7-like", mesh="2x1x1")()
    for chip in range(2):
        expected = [[chip * 2 + 1, 2, ((chip + 1) % 2) * 2 + core, 0] for core in range(2)]
        same(np.array(expected, np.int32), r.output("y", chip=chip))


def test_a_copy_bound_by_let_and_only_measured_by_bytes_is_used():
    # `bytes(copy(...))` counts what a wait waits for; a handle used only that way is a
    # size, not a DMA described and forgotten.
    src = """
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem v: f32[8, 128];
    sem s;
    let h = copy(x, v, s);
    start copy(x, v, s);
    wait(s, bytes(h));
    start copy(v, y, s);
    wait copy(v, y, s);
}
"""
    x = RNG.standard_normal((8, 128)).astype(np.float32)
    same(x, run(src, x=x).output("y"))
