"""Valid DMA, semaphore, SPMD and remote-operation programs, as docs/language.md ("DMAs
and semaphores", "SPMD and remote operations") and docs/safety.md describe them,
compiled and run through the public API and compared bit for bit with numpy results
worked out from the docs; plus the errors and faults those sections name, and the
adversarial schedules a correctly synchronised program must survive."""

from __future__ import annotations

import re

import numpy as np
import pytest

import mkemu
from mkemu.errors import EmulatorFault, SourceError
from mkemu.isa import numerics

FILE = "/tmp/valid_dma.mk"
RNG = np.random.default_rng(11)


def kernel(src: str, mesh: str = "1", hw: str = "test", **options):
    return mkemu.compile_source(src, FILE, hw=hw, mesh=mesh, **options)


def run(src: str, mesh: str = "1", hw: str = "test", options: dict | None = None, **inputs):
    return kernel(src, mesh, hw, **(options or {}))(**inputs)


def same(expected, got) -> None:
    expected, got = np.asarray(expected), np.asarray(got)
    assert expected.shape == got.shape, (expected.shape, got.shape)
    if expected.dtype.kind == "f":
        np.testing.assert_array_equal(expected.astype(np.float32).view(np.uint32),
                                      got.astype(np.float32).view(np.uint32))
    else:
        np.testing.assert_array_equal(expected, got)


def compile_error(src: str, mesh: str = "1") -> str:
    with pytest.raises(SourceError) as info:
        kernel(src, mesh)
    return info.value.render()


def line_of(src: str, needle: str) -> int:
    """The 1-based line of `src` holding `needle` (exactly one)."""
    hits = [n for n, text in enumerate(src.splitlines(), 1) if needle in text]
    assert len(hits) == 1, (needle, hits)
    return hits[0]


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def schedules(src: str, mesh: str, inputs: dict, outputs: list[str], hw: str = "test"):
    """Run under the normal, the late and two shuffled schedules: every output of every
    chip must have the same bits; returns the normal run."""
    normal = run(src, mesh, hw, **inputs)
    for opts in (dict(schedule="late"), dict(schedule="shuffle", schedule_seed=1),
                 dict(schedule="shuffle", schedule_seed=2)):
        other = run(src, mesh, hw, options=opts, **inputs)
        for key, value in normal.outputs.items():
            if key.split("@")[0] in outputs:
                same(value, other.outputs[key])
    return normal


# ---------------------------------------------------------------- DMAs and semaphores


def test_a_described_copy_does_nothing_until_started():
    # `let h = copy(src, dst, sem);` describes it (no effect yet): the bytes it moves are
    # those of `v` when `start h` runs, not when it was described.
    src = """
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem v: f32[8, 128];
    sem s;
    let out = copy(v, y, s);
    let inp = copy(x, v, s);
    start inp;
    wait inp;
    v = v * 3.0;
    start out;
    wait out;
}
"""
    x = f32(8, 128)
    same(x * np.float32(3.0), run(src, x=x).output("y"))


def test_whole_buffer_round_trip_hbm_vmem_hbm():
    src = """
kernel k(x: hbm f32[24, 384], y: hbm f32[24, 384]) {
    vmem v: f32[24, 384];
    sem s;
    start copy(x, v, s);
    wait copy(x, v, s);
    start copy(v, y, s);
    wait copy(v, y, s);
}
"""
    x = f32(24, 384)
    same(x, run(src, x=x).output("y"))


def test_row_and_column_blocks_between_hbm_and_vmem():
    # Row blocks and column blocks (strided on one side or both) of HBM and VMEM.
    src = """
kernel k(x: hbm f32[16, 512], y: hbm f32[16, 512]) {
    vmem v: f32[16, 256];
    sem s;
    v = 0.0;
    start copy(x[4:12, 128:256], v[8:16, 0:128], s);      // a block into a block
    start copy(x[0:3, 300:400], v[1:4, 150:250], s);      // unaligned columns
    wait copy(x[4:12, 128:256], v[8:16, 0:128], s);
    wait copy(x[0:3, 300:400], v[1:4, 150:250], s);
    start copy(v, y[0:16, 256:512], s);                   // a column block of HBM
    start copy(v[:, 0:128], y[:, 0:128], s);
    wait copy(v, y[0:16, 256:512], s);
    wait copy(v[:, 0:128], y[:, 0:128], s);
}
"""
    x = f32(16, 512)
    v = np.zeros((16, 256), np.float32)
    v[8:16, 0:128] = x[4:12, 128:256]
    v[1:4, 150:250] = x[0:3, 300:400]
    y = np.zeros((16, 512), np.float32)
    y[:, 256:512] = v
    y[:, 0:128] = v[:, 0:128]
    same(y, run(src, x=x).output("y"))


def test_dynamic_row_and_column_starts():
    # Starts may be any scalar expression (here loop variables and an SMEM value).
    src = """
kernel k(x: hbm f32[8, 1024], sh: hbm i32[4], y: hbm f32[8, 1024]) {
    vmem v: f32[8, 1024];
    smem p: i32[4];
    sem s;
    start copy(sh, p, s);
    wait copy(sh, p, s);
    let off = p[0];
    for j in 0..8 {
        start copy(x[j, j * 128 +: 128], v[7 - j, ((j + off) % 8) * 128 +: 128], s);
    }
    wait 8 * copy(x[0, 0:128], v[0, 0:128], s);
    start copy(v, y, s);
    wait copy(v, y, s);
}
"""
    x = f32(8, 1024)
    off = 3
    y = np.zeros((8, 1024), np.float32)
    for j in range(8):
        c = (j + off) % 8
        y[7 - j, c * 128:(c + 1) * 128] = x[j, j * 128:(j + 1) * 128]
    same(y, run(src, x=x, sh=np.array([off, 0, 0, 0], np.int32)).output("y"))


def test_three_d_hbm_views_and_leading_ones():
    # A point index drops a dimension; leading 1s aside, shapes must be equal:
    # x[1:2] is [1, 8, 128] and fills v[8, 128]; x[2, 5] ([128]) fills a [1, 128] row.
    program = """
kernel k(x: hbm f32[4, 8, 128], y: hbm f32[3, 8, 128]) {
    vmem v: f32[8, 128];
    vmem r: f32[1, 128];
    sem s;
    start copy(x[1:2], v, s);
    wait copy(x[1:2], v, s);
    start copy(x[2, 5], r, s);
    wait copy(x[2, 5], r, s);
    v[3:4, :] = r;
    start copy(v, y[0:1, :, :], s);
    wait copy(v, y[0:1, :, :], s);
    start copy(x[3], y[1], s);                           // HBM to HBM
    wait copy(x[3], y[1], s);
LAST
}
"""
    src = program.replace("LAST", "    start copy(x[0:2, 2:6, 64:128], y[2, 0:8, 0:64], s) ;\n"
                                  "    wait copy(x[0:2, 2:6, 64:128], y[2, 0:8, 0:64], s);")
    err = compile_error(src)
    assert "shape mismatch: copy from [2, 4, 64] to [8, 64]" in err, err
    assert f"{FILE}:{line_of(src, 'y[2, 0:8, 0:64], s) ;')}:11: error" in err, err
    src = program.replace("LAST", "    start copy(x[0:2, 2:6, 64:128], y[1:3, 4:8, 0:64], s);   "
                                  "// 3-D strided, both sides\n"
                                  "    wait copy(x[0:2, 2:6, 64:128], y[1:3, 4:8, 0:64], s);")
    x = f32(4, 8, 128)
    y = np.zeros((3, 8, 128), np.float32)
    y[0] = x[1]
    y[0, 3] = x[2, 5]
    y[1] = x[3]
    y[1:3, 4:8, 0:64] = x[0:2, 2:6, 64:128]
    same(y, run(src, x=x).output("y"))


def test_vmem_to_vmem_copies_and_slots():
    src = """
kernel k(x: hbm f32[8, 256], y: hbm f32[16, 256]) {
    vmem a: f32[8, 256];
    vmem b: f32[16, 256];
    vmem c: f32[2][8, 256];
    sem s;
    start copy(x, a, s);
    wait copy(x, a, s);
    start copy(a, c[1], s);
    wait copy(a, c[1], s);
    c[1] = c[1] + 1.0;
    start copy(c[1], b[8:16, :], s);
    start copy(a[:, 128:256], b[0:8, 0:128], s);
    start copy(a[:, 0:128], b[0:8, 128:256], s);
    wait copy(c[1], b[8:16, :], s);
    wait 2 * copy(a[:, 0:128], b[0:8, 128:256], s);
    start copy(b, y, s);
    wait copy(b, y, s);
}
"""
    x = f32(8, 256)
    y = np.concatenate([np.concatenate([x[:, 128:], x[:, :128]], axis=1), x + np.float32(1.0)])
    same(y, run(src, x=x).output("y"))


def test_smem_copies_from_and_to_hbm_and_vmem():
    # SMEM holds i32; it is a DMA end like VMEM and HBM (2-D SMEM, row slices).
    src = """
kernel k(x: hbm i32[4, 16], y: hbm i32[4, 16], z: hbm i32[8, 128]) {
    smem t: i32[4, 16];
    vmem v: i32[8, 128];
    sem s;
    start copy(x, t, s);
    wait copy(x, t, s);
    t[1, 3] = t[1, 3] + 100;
    start copy(t[2:4, :], y[0:2, :], s);
    start copy(t[0:2, :], y[2:4, :], s);
    wait 2 * copy(t[0:2, :], y[2:4, :], s);
    v = 7;
    start copy(t[1], v[2, 32:48], s);                    // SMEM to VMEM
    wait copy(t[1], v[2, 32:48], s);
    start copy(v[2, 32:48], t[3], s);                    // and back
    wait copy(v[2, 32:48], t[3], s);
    v[0:1, 0:16] = v[2:3, 32:48] * 2;
    start copy(v, z, s);
    wait copy(v, z, s);
}
"""
    x = RNG.integers(-1000, 1000, (4, 16)).astype(np.int32)
    r = run(src, x=x)
    t = x.copy()
    t[1, 3] += 100
    same(np.concatenate([t[2:4], t[0:2]]), r.output("y"))
    z = np.full((8, 128), 7, np.int32)
    z[2, 32:48] = t[1]
    z[0, 0:16] = t[1] * 2
    same(z, r.output("z"))


def test_bf16_copies_move_bits_and_stores_round():
    src = """
kernel k(x: hbm bf16[8, 256], y: hbm bf16[8, 256], z: hbm f32[8, 256]) {
    vmem a: bf16[8, 256];
    vmem f: f32[8, 256];
    sem s;
    start copy(x, a, s);
    wait copy(x, a, s);
    f = f32(a) * 1.3;
    a = bf16(f);
    start copy(a, y, s);
    start copy(f, z, s);
    wait copy(a, y, s);
    wait copy(f, z, s);
}
"""
    x = numerics.bf16_round(f32(8, 256))
    r = run(src, x=x)
    f = x * np.float32(1.3)
    same(f, r.output("z"))
    same(numerics.bf16_round(f), r.output("y"))


def test_double_buffered_copies_on_a_semaphore_array():
    # The doc's own line: start copy(w[l], wbuf[l % 2], ws[l % 2]) one step ahead.
    src = """
param L = 5;
kernel k(w: hbm f32[L, 8, 128], y: hbm f32[8, 128]) {
    vmem wbuf: f32[2][8, 128];
    vmem acc: f32[8, 128];
    sem ws[2];
    sem s;
    acc = 0.0;
    start copy(w[0], wbuf[0], ws[0]);
    for l in 0..L {
        if l + 1 < L {
            start copy(w[l + 1], wbuf[(l + 1) % 2], ws[(l + 1) % 2]);
        }
        wait copy(w[l], wbuf[l % 2], ws[l % 2]);
        acc = acc * 0.5 + wbuf[l % 2];
    }
    start copy(acc, y, s);
    wait copy(acc, y, s);
}
"""
    w = f32(5, 8, 128)
    acc = np.zeros((8, 128), np.float32)
    for layer in range(5):
        acc = acc * np.float32(0.5) + w[layer]
    normal = schedules(src, "1", dict(w=w), ["y"])
    same(acc, normal.output("y"))


def test_wait_subtracts_the_copys_byte_count_from_a_plain_wait():
    # DMA semaphores count bytes: two copies of different shapes on one semaphore,
    # taken by one plain wait of their byte counts; bytes() of a view or a copy.
    src = """
kernel k(x: hbm f32[8, 256], q: hbm bf16[4, 128], y: hbm f32[8, 256], n: hbm i32[8]) {
    vmem v: f32[8, 256];
    vmem b: bf16[4, 128];
    smem m: i32[8];
    sem s;
    let a = copy(x, v, s);
    start a;
    start copy(q, b, s);
    wait(s, bytes(a) + bytes(copy(q, b, s)));
    m[0] = bytes(a);
    m[1] = bytes(v[0:3, 0:5]);
    m[2] = bytes(b);
    m[3] = bytes(q[1, 0:7]);
    m[4] = bytes(m);
    m[5] = bytes(x[1:2, :]);
    m[6] = bytes(copy(m[0:2], n[0:2], s));
    m[7] = 0;
    start copy(v, y, s);
    wait(s, 8192);
    start copy(m, n, s);
    wait copy(m, n, s);
}
"""
    x = f32(8, 256)
    q = numerics.bf16_round(f32(4, 128))
    r = run(src, x=x, q=q)
    same(x, r.output("y"))
    same(np.array([8192, 60, 1024, 14, 32, 1024, 8, 0], np.int32), r.output("n"))


def test_counted_wait_of_a_run_time_number_of_row_gathers():
    # The doc's gather: `for r in 0..count { start copy(x[ix[r]], rows[r:r + 1, :], s); }`
    # then `wait count * copy(x[0], rows[0:1, :], s);`, count read at run time.
    src = """
kernel k(x: hbm f32[32, 256], idx: hbm i32[9], y: hbm f32[8, 256]) {
    smem ix: i32[9];
    vmem rows: f32[8, 256];
    sem s;
    start copy(idx, ix, s);
    wait copy(idx, ix, s);
    rows = 0.0;
    let count = ix[8];
    for r in 0..count {
        start copy(x[ix[r]], rows[r:r + 1, :], s);
    }
    wait count * copy(x[0], rows[0:1, :], s);
    start copy(rows, y, s);
    wait copy(rows, y, s);
}
"""
    x = f32(32, 256)
    for count in (0, 3, 8):
        idx = np.array([31, 0, 7, 7, 19, 2, 30, 1, count], np.int32)
        y = np.zeros((8, 256), np.float32)
        y[:count] = x[idx[:count]]
        same(y, run(src, x=x, idx=idx).output("y"))


def test_counted_wait_forms_copy_times_n_and_one_times_a_bound_copy():
    src = """
const N = 4;
kernel k(x: hbm f32[N, 8, 128], y: hbm f32[N, 8, 128]) {
    vmem v: f32[N * 8, 128];
    sem s;
    for i in 0..N {
        start copy(x[i], v[i * 8 +: 8, :], s);
    }
    wait copy(x[0], v[0:8, :], s) * (N - 1);             // copy(...) * n
    let h = copy(x[0], v[0:8, :], s);
    wait 1 * h;                                          // a bound copy counts too
    v = v + 1.0;
    for i in 0..N {
        start copy(v[i * 8 +: 8, :], y[N - 1 - i], s);
    }
    wait 0 * h;                                          // zero copies: nothing to wait for
    wait N * copy(v[0:8, :], y[0], s);
}
"""
    x = f32(4, 8, 128)
    same((x + np.float32(1.0))[::-1], run(src, x=x).output("y"))


def test_semaphore_arrays_indexed_at_run_time_waited_in_any_order():
    src = """
kernel k(x: hbm f32[4, 8, 128], y: hbm f32[4, 8, 128]) {
    vmem v: f32[4][8, 128];
    sem ws[4];
    sem s;
    for i in 0..4 {
        start copy(x[i], v[i], ws[i]);
    }
    for i in 0..4 {
        let j = 3 - i;
        wait copy(x[j], v[j], ws[j]);
        v[j] = v[j] * f32(j + 1);
        start copy(v[j], y[i], s);
    }
    wait 4 * copy(v[0], y[0], s);
}
"""
    x = f32(4, 8, 128)
    y = np.stack([x[j] * np.float32(j + 1) for j in (3, 2, 1, 0)])
    same(y, schedules(src, "1", dict(x=x), ["y"]).output("y"))


def test_plain_signal_and_wait_count_units():
    # signal(s, n) adds n; wait(s, n) blocks until s >= n and subtracts n.
    src = """
kernel k(y: hbm i32[8]) {
    smem t: i32[8];
    sem a;
    sem b[3];
    sem s;
    signal(a, 5);
    wait(a, 2);
    wait(a, 3);
    for i in 0..3 {
        signal(b[i], i + 1);
    }
    for i in 0..3 {
        wait(b[2 - i], 3 - i);
        t[i] = 10 * (i + 1);
    }
    t[3] = 1; t[4] = 2; t[5] = 3; t[6] = 4; t[7] = 5;
    start copy(t, y, s);
    wait copy(t, y, s);
}
"""
    same(np.array([10, 20, 30, 1, 2, 3, 4, 5], np.int32), run(src).output("y"))


def test_a_semaphore_left_non_zero_faults_at_kernel_end_naming_it():
    # "Every semaphore must be back at 0 when a kernel ends": a run-time count that
    # waits for fewer copies than were started leaves bytes on the semaphore.
    src = """
kernel k(x: hbm f32[2, 8, 128], n: hbm i32[1], y: hbm f32[8, 128]) {
    smem c: i32[1];
    vmem v: f32[2][8, 128];
    sem s;
    sem done;
    start copy(n, c, done);
    wait copy(n, c, done);
    start copy(x[0], v[0], s);
    start copy(x[1], v[1], s);
    wait c[0] * copy(x[0], v[0], s);
    start copy(v[0], y, done);
    wait copy(v[0], y, done);
}
"""
    x = f32(2, 8, 128)
    k = kernel(src)
    same(x[0], k(x=x, n=np.array([2], np.int32)).output("y"))
    with pytest.raises(EmulatorFault) as info:
        k(x=x, n=np.array([1], np.int32))
    text = info.value.render()
    assert info.value.kind == "semaphore-nonzero", text
    assert "4096" in text and f"{FILE}:{line_of(src, 'start copy(x[1], v[1], s)')}" in text, text
    # --no-check semaphores turns it off
    k2 = kernel(src, checks={"races"})
    same(x[0], k2(x=x, n=np.array([1], np.int32)).output("y"))


def fault(src: str, mesh: str = "1", options: dict | None = None, **inputs) -> EmulatorFault:
    with pytest.raises(EmulatorFault) as info:
        run(src, mesh, options=options, **inputs)
    return info.value


def where(src: str, needle: str) -> str:
    """`file:line` of the source line holding `needle`."""
    return f"{FILE}:{line_of(src, needle)}"


# ---------------------------------------------------------------- DMA errors


DMA_ERRORS = {
    "dtype": ("vmem v: f32[8, 128];\nvmem b: bf16[8, 128];\nstart copy(b, v, s);\nwait copy(b, v, s);",
              "start copy(b, v, s)", "dtype mismatch: copy from bf16 to f32 (DMAs do not convert)"),
    "shape": ("vmem v: f32[8, 128];\nstart copy(x[0:8, 0:64], v, s);\nwait copy(x[0:8, 0:64], v, s);",
              "start copy(x[0:8, 0:64]", "shape mismatch: copy from [8, 64] to [8, 128]"),
    "var": ("var t: f32[8, 128] = 0.0;\nstart copy(x, t, s);\nwait copy(x, t, s);",
            "start copy(x, t, s)", "'t' is a var (placed by the compiler); DMAs need a vmem, smem or hbm buffer"),
    "slot": ("vmem w: f32[2][8, 128];\nstart copy(x, w, s);\nwait copy(x, w, s);",
             "start copy(x, w, s)", "buffer array 'w' needs a slot index: w[slot]"),
    "sem array": ("vmem v: f32[8, 128];\nsem ws[2];\nstart copy(x, v, ws);\nwait copy(x, v, ws[0]);",
                  "start copy(x, v, ws)", "semaphore array 'ws' needs an index: ws[i]"),
    "start count": ("vmem v: f32[8, 128];\nstart 2 * copy(x, v, s);\nwait copy(x, v, s);",
                    "start 2 * copy", "start issues one copy; a count of copies (n * copy(...)) is for wait"),
    "negative count": ("vmem v: f32[8, 128];\nstart copy(x, v, s);\nwait -1 * copy(x, v, s);",
                       "wait -1 *", "negative"),
    "no target": ("vmem v: f32[8, 128];\nsem t;\nstart copy(x, v, s);\nwait copy(x, v, s);\nwait(t, 1);",
                  "wait(t, 1)", "wait on semaphore 't', but no started DMA or signal ever targets it"),
    "never waited": ("vmem v: f32[8, 128];\nsem t;\nstart copy(x, v, t);",
                     "start copy(x, v, t)", "semaphore 't' is never waited"),
    "never used": ("vmem v: f32[8, 128];\nlet h = copy(x, v, s);",
                   "let h = copy", "DMA 'h' is described but never started or waited"),
    "signal never waited": ("signal(s, 1);", "signal(s, 1)", "signal on semaphore 's' is never waited"),
    "copy statement": ("vmem v: f32[8, 128];\ncopy(x, v, s);", "copy(x, v, s);",
                       "copy() only describes a DMA: write `start copy(...)`"),
    "recv of local": ("vmem v: f32[8, 128];\nstart copy(x, v, s);\nwait recv copy(x, v, s);",
                      "wait recv", "'wait recv' is for remote copies (copy(src, dst @ core, send, recv))"),
    "remote source, 3 arguments": ("vmem v: f32[8, 128];\nstart copy(v @ 1, v, s);\nwait copy(v @ 1, v, s);",
                                   "start copy(v @ 1", "only the destination of copy() can be remote (DMAs push)"),
    "remote source": ("vmem v: f32[8, 128];\nsem r;\nstart copy(v @ 1, v, s, r);\nwait copy(v @ 1, v, s, r);",
                      "start copy(v @ 1", "only the destination of copy() can be remote (DMAs push)"),
    "remote arity": ("vmem v: f32[8, 128];\nstart copy(x, v @ 1, s);\nwait copy(x, v @ 1, s);",
                     "start copy(x, v @ 1, s)", "copy() takes 4 arguments (copy(src, dst @ core, send_sem, recv_sem)), got 3"),
    "barrier axis": ("barrier(3);", "barrier(3)", "mesh axis must be 0, 1 or 2, got 3"),
    "global_core": ("smem t: i32[1];\nt[0] = global_core(0, 2);", "global_core(0, 2)", "core"),
}


@pytest.mark.parametrize("case", sorted(DMA_ERRORS))
def test_dma_and_semaphore_errors_name_file_line_and_what(case):
    body, needle, message = DMA_ERRORS[case]
    src = ("kernel k(x: hbm f32[8, 128]) {\n    sem s;\n"
           + "".join(f"    {line}\n" for line in body.splitlines()) + "}\n")
    err = compile_error(src)
    pattern = re.escape(where(src, needle)) + r":\d+: error: .*" + re.escape(message)
    assert any(re.match(pattern, line) for line in err.splitlines()), err


# ---------------------------------------------------------------- SPMD builtins

IDS = """
kernel k(off: hbm i32[1], y: hbm i32[2, 20]) {
    smem t: i32[20];
    smem o: i32[1];
    sem s;
    start copy(off, o, s);
    wait copy(off, o, s);
    t[0] = chip_id(); t[1] = core_id(); t[2] = num_chips(); t[3] = num_cores();
    t[4] = mesh_dim(0); t[5] = mesh_dim(1); t[6] = mesh_dim(2);
    t[7] = chip_coord(0); t[8] = chip_coord(1); t[9] = chip_coord(2);
    t[10] = peer(0, 1); t[11] = peer(0, -1); t[12] = peer(1, 1); t[13] = peer(1, -1);
    t[14] = peer(2, 1); t[15] = peer(2, -1); t[16] = peer(0, o[0]);
    t[17] = global_core(chip_id(), core_id()); t[18] = global_core(o[0] % num_chips(), 1);
    t[19] = peer(1, 0 - o[0]);
    start copy(t, y[core_id()], s);
    wait copy(t, y[core_id()], s);
}
"""


@pytest.mark.parametrize("mesh, dims", [("1", (1, 1, 1)), ("4", (4, 1, 1)), ("2x2", (2, 2, 1)),
                                        ("3x2x2", (3, 2, 2))])
def test_chip_and_core_ids_coordinates_peers_and_global_cores(mesh, dims):
    X, Y, Z = dims
    chips, cores, off = X * Y * Z, 2, 5
    r = run(IDS, mesh, off=np.array([off], np.int32))

    def chip_of(x, y, z):
        return x + X * (y + Y * z)

    def peer(coords, axis, step, core):
        c = list(coords)
        c[axis] = (c[axis] + step) % dims[axis]            # wraps around the axis
        return chip_of(*c) * cores + core

    for z in range(Z):
        for y in range(Y):
            for x in range(X):
                chip = chip_of(x, y, z)
                rows = []
                for core in range(cores):
                    xyz = (x, y, z)
                    rows.append([chip, core, chips, cores, X, Y, Z, x, y, z,
                                 peer(xyz, 0, 1, core), peer(xyz, 0, -1, core), peer(xyz, 1, 1, core),
                                 peer(xyz, 1, -1, core), peer(xyz, 2, 1, core), peer(xyz, 2, -1, core),
                                 peer(xyz, 0, off, core), chip * cores + core, (off % chips) * cores + 1,
                                 peer(xyz, 1, -off, core)])
                same(np.array(rows, np.int32), r.output("y", chip=chip))


# ---------------------------------------------------------------- remote DMAs

RING = """
kernel k(x: hbm f32[2, 8, 128], y: hbm f32[2, 8, 128]) {
    vmem xv: f32[8, 128];
    vmem inbox: f32[8, 128];
    sem send;
    sem recv;
    sem s;
    start copy(x[core_id()], xv, s);
    wait copy(x[core_id()], xv, s);
    let h = copy(xv, inbox @ peer(AXIS, 1), send, recv);   // push into the peer's inbox
    start h;
    wait h;                 // our side: the bytes have left
    wait recv h;            // the matching copy from our neighbour arrived
    inbox = inbox * 2.0 + xv;
    start copy(inbox, y[core_id()], s);
    wait copy(inbox, y[core_id()], s);
}
"""


def per_chip(chips: int, shape, name: str = "x"):
    return {f"{name}@{c}": f32(*shape) for c in range(chips)}


@pytest.mark.parametrize("mesh, dims, axis", [("2", (2, 1, 1), 0), ("4", (4, 1, 1), 0),
                                              ("2x2", (2, 2, 1), 1), ("2x2x2", (2, 2, 2), 2)])
def test_remote_push_to_the_peer_along_an_axis(mesh, dims, axis):
    src = RING.replace("AXIS", str(axis))
    chips = int(np.prod(dims))
    xs = per_chip(chips, (2, 8, 128))
    r = schedules(src, mesh, xs, ["y"])
    stride = [1, dims[0], dims[0] * dims[1]][axis]
    for chip in range(chips):
        coord = chip // stride % dims[axis]
        sender = chip + (((coord - 1) % dims[axis]) - coord) * stride   # the chip one step back
        same(xs[f"x@{sender}"] * np.float32(2.0) + xs[f"x@{chip}"], r.output("y", chip=chip))


def test_remote_push_to_the_sibling_core_and_into_hbm_of_other_chips():
    # The destination is the buffer of the same name on the target core: VMEM of the
    # sibling core, HBM of this chip (through the sibling) and HBM of the next chip.
    src = """
kernel k(x: hbm f32[2, 8, 128], y: hbm f32[2, 8, 128], z: hbm f32[2, 8, 128]) {
    vmem xv: f32[8, 128];
    vmem inbox: f32[8, 128];
    sem send;
    sem recv;
    sem s;
    start copy(x[core_id()], xv, s);
    wait copy(x[core_id()], xv, s);
    let sib = global_core(chip_id(), 1 - core_id());
    start copy(xv, inbox @ sib, send, recv);
    wait copy(xv, inbox @ sib, send, recv);
    wait recv copy(xv, inbox @ sib, send, recv);
    start copy(inbox, y[1 - core_id()], s);
    wait copy(inbox, y[1 - core_id()], s);
    let next = global_core((chip_id() + 1) % num_chips(), core_id());
    start copy(xv[0:4, :], z[core_id(), 4:8, :] @ next, send, recv);
    wait copy(xv[0:4, :], z[core_id(), 4:8, :] @ next, send, recv);
    wait recv copy(xv[0:4, :], z[core_id(), 4:8, :] @ next, send, recv);
    start copy(xv[4:8, :], z[core_id(), 0:4, :], s);
    wait copy(xv[4:8, :], z[core_id(), 0:4, :], s);
}
"""
    xs = per_chip(3, (2, 8, 128))
    r = schedules(src, "3", xs, ["y", "z"])
    for chip in range(3):
        x = xs[f"x@{chip}"]
        prev = xs[f"x@{(chip - 1) % 3}"]
        same(x, r.output("y", chip=chip))                    # y[1 - c] = the sibling's x[1 - c]
        z = np.concatenate([x[:, 4:8], prev[:, 0:4]], axis=1)
        same(z, r.output("z", chip=chip))


def test_counted_receive_gathers_every_chips_rows_on_core_0():
    # `wait recv (CHIPS - 1) * copy(rows, all[me] @ 0, sent, got);`: the peers' pushes
    # to us, counted; every other core pushes its rows to global core 0.
    src = """
const CORES = 2;
kernel k(x: hbm f32[8, 128], out: hbm f32[8, 8, 128]) {
    vmem rows: f32[8, 128];
    vmem all: f32[8][8, 128];
    sem s;
    sem sent;
    sem got;
    let me = global_core(chip_id(), core_id());
    let parts = num_chips() * num_cores();
    start copy(x, rows, s);
    wait copy(x, rows, s);
    rows = rows + f32(me);
    if me == 0 {
        all[0] = rows;
        wait recv (parts - 1) * copy(rows, all[me] @ 0, sent, got);
        for p in 0..parts {
            start copy(all[p], out[p], s);
        }
        wait parts * copy(all[0], out[0], s);
    } else {
        start copy(rows, all[me] @ 0, sent, got);
        wait copy(rows, all[me] @ 0, sent, got);
    }
}
"""
    xs = per_chip(4, (8, 128))
    r = schedules(src, "2x2", xs, ["out"])
    expected = np.stack([xs[f"x@{g // 2}"] + np.float32(g) for g in range(8)])
    same(expected, r.output("out", chip=0))
    same(np.zeros((8, 8, 128), np.float32), r.output("out", chip=1))


def test_all_gather_by_pushing_to_every_chip_with_counted_waits():
    src = """
kernel k(x: hbm f32[4, 128], out: hbm f32[16, 128]) {
    vmem mine: f32[4, 128];
    vmem all: f32[16, 128];
    sem s;
    sem sent;
    sem got;
    let me = chip_id();
    let chips = num_chips();
    start copy(x, mine, s);
    wait copy(x, mine, s);
    start copy(mine, all[me * 4 +: 4, :], s);
    for d in 1..chips {
        let to = global_core((me + d) % chips, core_id());
        start copy(mine, all[me * 4 +: 4, :] @ to, sent, got);
    }
    wait (chips - 1) * copy(mine, all[0:4, :] @ 0, sent, got);
    wait recv (chips - 1) * copy(mine, all[0:4, :] @ 0, sent, got);
    wait copy(mine, all[me * 4 +: 4, :], s);
    start copy(all, out, s);
    wait copy(all, out, s);
}
"""
    for mesh, chips in (("4", 4), ("2x2", 4), ("2", 2)):
        xs = per_chip(chips, (4, 128))
        r = schedules(src, mesh, xs, ["out"])
        expected = np.zeros((16, 128), np.float32)
        expected[:4 * chips] = np.concatenate([xs[f"x@{c}"] for c in range(chips)])
        for chip in range(chips):
            same(expected, r.output("out", chip=chip))


# ---------------------------------------------------------------- signals and barriers

RING_SUM = """
// A ring over the chips of axis 0 with an "inbox free" credit: each round pushes what
// we received last round to the next chip, after it said its inbox is free.
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem buf: f32[8, 128];
    vmem acc: f32[8, 128];
    vmem inbox: f32[8, 128];
    sem send;
    sem recv;
    sem credit;
    sem s;
    start copy(x, buf, s);
    wait copy(x, buf, s);
    acc = buf;
    let rounds = mesh_dim(0) - 1;
    signal(credit @ peer(0, -1), 1);                     // our inbox is free
    for r in 0..rounds {
        wait(credit, 1);                                 // the next chip's inbox is free
        let h = copy(buf, inbox @ peer(0, 1), send, recv);
        start h;
        wait h;
        wait recv h;
        acc = acc + inbox;
        buf = inbox;
        if r + 1 < rounds {
            signal(credit @ peer(0, -1), 1);
        }
    }
    if rounds == 0 {
        wait(credit, 1);
    }
    start copy(acc, y, s);
    wait copy(acc, y, s);
}
"""


@pytest.mark.parametrize("mesh, n", [("4", 4), ("3", 3), ("2", 2)])
def test_ring_accumulation_with_remote_credit_signals(mesh, n):
    xs = per_chip(n, (8, 128))
    r = schedules(RING_SUM, mesh, xs, ["y"])
    for chip in range(n):
        acc = xs[f"x@{chip}"].copy()
        for step in range(1, n):
            acc = acc + xs[f"x@{(chip - step) % n}"]         # received in this order
        same(acc, r.output("y", chip=chip))


SIBLING_HANDOFF = """
// Core 0 writes the chip's result to HBM; core 1 reads it back after a signal.
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128], z: hbm f32[8, 128]) {
    vmem v: f32[8, 128];
    sem s;
    sem flag;
    if core_id() == 0 {
        start copy(x, v, s);
        wait copy(x, v, s);
        v = v + 1.0;
        start copy(v, y, s);
        ORDER
    } else {
        wait(flag, 1);
        start copy(y, v, s);
        wait copy(y, v, s);
        v = v * 2.0;
        start copy(v, z, s);
        wait copy(v, z, s);
    }
}
"""


def test_a_signal_to_the_sibling_after_the_wait_orders_an_hbm_handoff():
    src = SIBLING_HANDOFF.replace("ORDER", "wait copy(v, y, s);\n        signal(flag @ global_core(chip_id(), 1), 1);")
    x = f32(8, 128)
    r = schedules(src, "2", dict(x=x), ["y", "z"])
    for chip in range(2):
        same((x + np.float32(1.0)) * np.float32(2.0), r.output("z", chip=chip))


@pytest.mark.parametrize("schedule", ["normal", "late", "shuffle"])
def test_a_signal_sent_before_the_writer_waited_is_a_race_in_every_schedule(schedule):
    src = SIBLING_HANDOFF.replace("ORDER", "signal(flag @ global_core(chip_id(), 1), 1);\n        wait copy(v, y, s);")
    info = fault(src, "1", options=dict(schedule=schedule, schedule_seed=1), x=f32(8, 128))
    text = info.render()
    assert info.kind == "race", text
    assert "chip 0, core 1" in text and where(src, "start copy(y, v, s)") in text, text   # the reader
    assert where(src, "start copy(v, y, s)") in text and "core 0" in text, text           # the writer


BARRIER_READBACK = """
// Every core stores its half of the chip's result to HBM, then reads the whole back.
kernel k(x: hbm f32[2, 8, 128], y: hbm f32[2, 8, 128], z: hbm f32[2, 8, 128]) {
    vmem v: f32[8, 128];
    vmem w: f32[2][8, 128];
    sem s;
    let c = core_id();
    start copy(x[c], v, s);
    wait copy(x[c], v, s);
    v = v * f32(c + 2);
    start copy(v, y[c], s);
    wait copy(v, y[c], s);
    BARRIER
    start copy(y[1 - c], w[0], s);
    wait copy(y[1 - c], w[0], s);
    w[1] = w[0] + v;
    start copy(w[1], z[c], s);
    wait copy(w[1], z[c], s);
}
"""


@pytest.mark.parametrize("barrier", ["barrier();"])
def test_a_barrier_orders_every_cores_hbm_stores_before_the_readback(barrier):
    src = BARRIER_READBACK.replace("BARRIER", barrier)
    xs = per_chip(2, (2, 8, 128))
    r = schedules(src, "2", xs, ["z"])
    for chip in range(2):
        x = xs[f"x@{chip}"]
        y = np.stack([x[0] * np.float32(2.0), x[1] * np.float32(3.0)])
        same(y, r.output("y", chip=chip))
        same(np.stack([y[1] + y[0], y[0] + y[1]]), r.output("z", chip=chip))


@pytest.mark.parametrize("barrier", ["", "barrier(0);"])
def test_without_a_chip_wide_barrier_the_readback_is_a_race(barrier):
    # barrier(axis) spans the chips along one mesh axis (the cores with the same index):
    # it does not order the sibling core's store.
    src = BARRIER_READBACK.replace("BARRIER", barrier)
    info = fault(src, "2", **per_chip(2, (2, 8, 128)))
    text = info.render()
    assert info.kind == "race", text
    assert where(src, "start copy(y[1 - c], w[0], s)") in text, text
    assert where(src, "start copy(v, y[c], s)") in text, text


AXIS_EXCHANGE = """
// Push our row into the HBM of the next chip along AXIS, then read what arrived there
// after a barrier along AXIS (the sender waited for its push: the barrier shares it).
kernel k(x: hbm f32[8, 128], inb: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem v: f32[8, 128];
    sem s;
    sem send;
    sem recv;
    start copy(x, v, s);
    wait copy(x, v, s);
    let to = peer(AXIS, 1);
    start copy(v[core_id() * 4 +: 4, :], inb[core_id() * 4 +: 4, :] @ to, send, recv);
    wait copy(v[0:4, :], inb[0:4, :] @ to, send, recv);
    BARRIER
    start copy(inb[core_id() * 4 +: 4, :], v[0:4, :], s);
    wait copy(inb[0:4, :], v[0:4, :], s);
    v[0:4, :] = v[0:4, :] + 1.0;
    start copy(v[0:4, :], y[core_id() * 4 +: 4, :], s);
    wait copy(v[0:4, :], y[0:4, :], s);
    wait recv copy(v[0:4, :], inb[0:4, :] @ to, send, recv);
}
"""


@pytest.mark.parametrize("mesh, dims, axis", [("2x2", (2, 2, 1), 0), ("2x2", (2, 2, 1), 1),
                                              ("2x2x2", (2, 2, 2), 2), ("4", (4, 1, 1), 0)])
def test_a_barrier_along_an_axis_orders_a_push_along_that_axis(mesh, dims, axis):
    for barrier in (f"barrier({axis});", "barrier();"):
        src = AXIS_EXCHANGE.replace("AXIS", str(axis)).replace("BARRIER", barrier)
        chips = int(np.prod(dims))
        xs = per_chip(chips, (8, 128))
        r = schedules(src, mesh, xs, ["y"])
        stride = [1, dims[0], dims[0] * dims[1]][axis]
        for chip in range(chips):
            coord = chip // stride % dims[axis]
            sender = chip + (((coord - 1) % dims[axis]) - coord) * stride
            same(xs[f"x@{sender}"] + np.float32(1.0), r.output("y", chip=chip))


def test_a_barrier_along_another_axis_does_not_order_the_push():
    src = AXIS_EXCHANGE.replace("AXIS", "0").replace("BARRIER", "barrier(1);")
    info = fault(src, "2x2", **per_chip(4, (8, 128)))
    text = info.render()
    assert info.kind == "race", text
    assert where(src, "start copy(inb[core_id() * 4 +: 4, :], v[0:4, :], s)") in text, text


# ---------------------------------------------------------------- races and schedules

WRONG_ORDER = """
// Two copies on one semaphore, waited for in the wrong order: the wait for the big one
// also takes the bytes of the small one.
kernel k(a: hbm f32[8, 128], b: hbm f32[64, 128], y: hbm f32[8, 128]) {
    vmem small: f32[8, 128];
    vmem big: f32[64, 128];
    sem s;
    start copy(b, big, s);
    start copy(a, small, s);
    wait copy(b, big, s);
    small = small + 1.0;
    wait copy(a, small, s);
    start copy(small, y, s);
    wait copy(small, y, s);
}
"""


def test_waits_in_the_wrong_order_pass_normally_and_race_when_late():
    a, b = f32(8, 128), f32(64, 128)
    same(a + np.float32(1.0), run(WRONG_ORDER, a=a, b=b).output("y"))
    info = fault(WRONG_ORDER, options=dict(schedule="late"), a=a, b=b)
    text = info.render()
    assert info.kind == "race", text
    assert where(WRONG_ORDER, "small = small + 1.0") in text, text
    assert where(WRONG_ORDER, "start copy(a, small, s)") in text, text
    fixed = WRONG_ORDER.replace("    wait copy(b, big, s);\n    small = small + 1.0;\n    wait copy(a, small, s);",
                                "    wait copy(a, small, s);\n    wait copy(b, big, s);\n    small = small + 1.0;")
    same(a + np.float32(1.0), schedules(fixed, "1", dict(a=a, b=b), ["y"]).output("y"))


RACES = {
    # name: (statements between the first copy's start and its wait, the racing line)
    "read before wait": ("w = v + 1.0;", "w = v + 1.0;", "start copy(x, v, s)"),
    "overwrite an outgoing source": ("start copy(w, y, t);\n    w = 2.0;\n    wait copy(w, y, t);",
                                     "w = 2.0;", "start copy(w, y, t)"),
    "two copies into one buffer": ("start copy(x, v, t);\n    wait copy(x, v, t);",
                                   "start copy(x, v, t)", "start copy(x, v, s)"),
    "copy out what a copy still fills": ("start copy(v, y, t);\n    wait copy(v, y, t);",
                                         "start copy(v, y, t)", "start copy(x, v, s)"),
    "write HBM a copy still reads": ("start copy(w, x, t);\n    wait copy(w, x, t);",
                                     "start copy(w, x, t)", "start copy(x, v, s)"),
}
RACE_KERNEL = """
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem v: f32[8, 128];
    vmem w: f32[8, 128];
    sem s;
    sem t;
    w = 0.0;
    start copy(x, v, s);
    BODY
    wait copy(x, v, s);
}
"""


@pytest.mark.parametrize("case", sorted(RACES))
@pytest.mark.parametrize("schedule", ["normal", "late", "shuffle"])
def test_each_kind_of_race_is_reported_naming_both_sides(case, schedule):
    # A missing wait is a race in every schedule, never silently wrong numbers.
    body, access, dma = RACES[case]
    src = RACE_KERNEL.replace("BODY", body)
    info = fault(src, options=dict(schedule=schedule, schedule_seed=4), x=f32(8, 128))
    text = info.render()
    assert info.kind == "race", text
    assert "chip 0, core 0" in text and "pc 0x" in text and "cycle" in text, text
    assert where(src, access) in text and where(src, dma) in text, text
    # --no-check races turns it off
    run(src, options=dict(checks={"semaphores"}, schedule=schedule, schedule_seed=4), x=f32(8, 128))


def test_disjoint_column_blocks_and_interleaved_rows_in_flight_together_do_not_race():
    src = """
kernel k(x: hbm f32[16, 256], y: hbm f32[16, 256]) {
    vmem v: f32[16, 256];
    sem s;
    sem t;
    start copy(x[:, 0:128], v[:, 128:256], s);
    start copy(x[:, 128:256], v[:, 0:128], t);
    v[0:8, 0:128] = 0.0;                                // not a byte of either copy? it is: wait first
    wait copy(x[:, 128:256], v[:, 0:128], t);
    v[:, 0:128] = v[:, 0:128] + 1.0;                    // the other copy still fills 128:256
    wait copy(x[:, 0:128], v[:, 128:256], s);
    for r in 0..8 {
        start copy(v[2 * r, :], y[r, :], s);            // even rows out while odd rows are computed
        v[2 * r + 1 : 2 * r + 2, :] = v[2 * r + 1 : 2 * r + 2, :] * 3.0;
    }
    wait 8 * copy(v[0, :], y[0, :], s);
    for r in 0..8 {
        start copy(v[2 * r + 1, :], y[8 + r, :], s);
    }
    wait 8 * copy(v[0, :], y[0, :], s);
}
""".replace("    v[0:8, 0:128] = 0.0;                                // not a byte of either copy? it is: wait first\n", "")
    x = f32(16, 256)
    v = np.concatenate([x[:, 128:256] + np.float32(1.0), x[:, 0:128]], axis=1)
    v[1::2] = v[1::2] * np.float32(3.0)
    y = np.concatenate([v[0::2], v[1::2]])
    same(y, schedules(src, "1", dict(x=x), ["y"]).output("y"))


def test_every_core_storing_the_same_hbm_bytes_is_not_a_race():
    # Not reported: two DMAs that both write the same HBM bytes (the last to land wins).
    src = """
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem v: f32[8, 128];
    sem s;
    start copy(x, v, s);
    wait copy(x, v, s);
    v = v * 0.5;
    start copy(v, y, s);
    start copy(v, y, s);
    wait 2 * copy(v, y, s);
}
"""
    x = f32(8, 128)
    r = schedules(src, "2", dict(x=x), ["y"])
    for chip in range(2):
        same(x * np.float32(0.5), r.output("y", chip=chip))


def test_pushing_into_an_inbox_the_receiver_still_reads_is_a_race():
    # Chip 1 pushes two rounds into chip 0's inbox without an "inbox free" credit;
    # chip 0 is slow to read the first round, so the second push is in flight then.
    src = """
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem v: f32[8, 128];
    vmem inbox: f32[8, 128];
    vmem acc: f32[8, 128];
    sem s;
    sem send;
    sem recv;
    sem credit;
    start copy(x, v, s);
    wait copy(x, v, s);
    acc = 0.0;
    let to = global_core(0, core_id());
    if chip_id() == 1 {
        for r in 0..2 {
            CREDIT
            start copy(v, inbox @ to, send, recv);
            wait copy(v, inbox @ to, send, recv);
        }
    } else {
        FIRST
        for r in 0..2 {
            wait recv copy(v, inbox @ to, send, recv);
            for i in 0..50 {
                acc = acc * 0.5;
            }
            acc = acc + inbox;
            GRANT
        }
    }
    start copy(acc, y, s);
    wait copy(acc, y, s);
}
"""
    bad = src.replace("CREDIT", "").replace("GRANT", "").replace("FIRST", "")
    for schedule in ("normal", "late", "shuffle"):
        info = fault(bad, "2", options=dict(schedule=schedule, schedule_seed=2), x=f32(8, 128))
        text = info.render()
        assert info.kind == "race", text
        assert "chip 0" in text and where(bad, "acc = acc + inbox") in text, text
        assert where(bad, "start copy(v, inbox @ to, send, recv)") in text and "chip 1" in text, text
    grant = "signal(credit @ global_core(1, core_id()), 1);"
    good = src.replace("CREDIT", "wait(credit, 1);").replace("FIRST", grant).replace(
        "GRANT", "if r == 0 { " + grant + " }")
    xs = per_chip(2, (8, 128))
    r = schedules(good, "2", xs, ["y"])
    acc = np.zeros((8, 128), np.float32)
    for _ in range(2):
        for _ in range(50):
            acc = acc * np.float32(0.5)
        acc = acc + xs["x@1"]
    same(acc, r.output("y", chip=0))
    same(np.zeros((8, 128), np.float32), r.output("y", chip=1))


def test_reading_a_pushed_hbm_buffer_before_wait_recv_is_a_race():
    src = """
kernel k(x: hbm f32[8, 128], inb: hbm f32[2, 8, 128], y: hbm f32[2, 8, 128]) {
    vmem v: f32[8, 128];
    sem s;
    sem send;
    sem recv;
    let c = core_id();
    start copy(x, v, s);
    wait copy(x, v, s);
    start copy(v, inb[c] @ peer(0, 1), send, recv);
    wait copy(v, inb[c] @ peer(0, 1), send, recv);
    READ
}
"""
    read = "start copy(inb[c], y[c], s);\n    wait copy(inb[c], y[c], s);"
    recv = "wait recv copy(v, inb[c] @ peer(0, 1), send, recv);"
    bad = src.replace("READ", read + "\n    " + recv)
    for schedule in ("normal", "late", "shuffle"):
        info = fault(bad, "2", options=dict(schedule=schedule, schedule_seed=3), x=f32(8, 128))
        assert info.kind == "race", info.render()
        assert where(bad, "start copy(inb[c], y[c], s)") in info.render(), info.render()
    good = src.replace("READ", recv + "\n    " + read)
    xs = per_chip(2, (8, 128))
    r = schedules(good, "2", xs, ["y"])
    same(np.stack([xs["x@1"]] * 2), r.output("y", chip=0))
    same(np.stack([xs["x@0"]] * 2), r.output("y", chip=1))


# ---------------------------------------------------------------- run-time faults


def test_a_wait_no_one_satisfies_is_a_deadlock_naming_every_waiting_core():
    # A receive whose sender skipped its push (compiles: a started DMA targets `recv`).
    src = """
kernel k(x: hbm f32[8, 128]) {
    vmem v: f32[8, 128];
    sem send;
    sem recv;
    if chip_id() == 5 {
        start copy(v, v @ peer(0, 1), send, recv);
        wait copy(v, v @ peer(0, 1), send, recv);
    }
    wait recv copy(v, v @ peer(0, 1), send, recv);
}
"""
    info = fault(src, "2")
    text = info.render()
    assert info.kind == "deadlock", text
    line = where(src, "wait recv copy")
    for chip in range(2):
        for core in range(2):
            assert re.search(rf"chip {chip} core {core} pc 0x[0-9a-f]+ .* waits for semaphore \d+ to reach 4096 "
                             rf"\(it is 0\) since cycle \d+ \[{re.escape(line)}", text), text


def test_a_core_that_skips_a_barrier_faults_pointing_at_the_barrier():
    src = """
kernel k(x: hbm f32[8, 128]) {
    if global_core(chip_id(), core_id()) != 3 {
        barrier();
    }
}
"""
    info = fault(src, "2")
    text = info.render()
    assert info.kind in ("barrier-not-reached", "deadlock"), text
    assert where(src, "barrier();") in text and "chip 1" in text and "core 1" in text, text


def test_a_remote_copy_leaving_its_destination_buffer_faults_naming_it():
    # Both ends of a DMA are checked, local or remote: a run-time row start past the
    # end of the target's buffer.
    src = """
kernel k(r: hbm i32[1], x: hbm f32[8, 128]) {
    smem t: i32[1];
    vmem v: f32[8, 128];
    vmem inbox: f32[16, 128];
    sem s;
    sem send;
    sem recv;
    start copy(r, t, s);
    wait copy(r, t, s);
    start copy(x, v, s);
    wait copy(x, v, s);
    let row = t[0];
    start copy(v, inbox[row +: 8, :] @ peer(0, 1), send, recv);
    wait copy(v, inbox[0:8, :] @ peer(0, 1), send, recv);
    wait recv copy(v, inbox[0:8, :] @ peer(0, 1), send, recv);
}
"""
    k = kernel(src, "2")
    k(r=np.array([8], np.int32))                                  # the last start inside
    with pytest.raises(EmulatorFault) as info:
        k(r=np.array([9], np.int32))
    text = info.value.render()
    assert info.value.kind == "out-of-bounds", text
    assert "index 9 of dimension 0 of 'inbox' (f32[16, 128]) is outside 0..8" in text, text
    assert where(src, "start copy(v, inbox[row +: 8, :]") in text, text
    assert re.search(r"chip \d+, core \d+, cycle \d+, pc 0x[0-9a-f]+", text), text


# ---------------------------------------------------------------- more combinations


def test_remote_send_and_receive_semaphores_count_bytes_for_plain_waits():
    # `send` counts bytes leaving here, `recv` bytes arriving there: plain waits of
    # bytes() take them, for copies into the slots of a buffer array on a semaphore array.
    src = """
kernel k(x: hbm f32[4, 8, 128], y: hbm f32[4, 8, 128]) {
    vmem v: f32[4, 8 * 128];
    vmem slot: f32[4][8, 128];
    sem s;
    sem send;
    sem recv[4];
    start copy(x, v, s);                                   // [4, 8, 128] into [4, 1024]: not the same shape
    wait copy(x, v, s);
}
"""
    assert "shape mismatch: copy from [4, 8, 128] to [4, 1024]" in compile_error(src)
    src = """
kernel k(x: hbm f32[4, 8, 128], y: hbm f32[8, 8, 128]) {
    vmem slot: f32[4][8, 128];
    vmem mine: f32[4][8, 128];
    sem s;
    sem send;
    sem recv[4];
    let to = global_core(chip_id(), 1 - core_id());
    for i in 0..4 {
        start copy(x[i], mine[i], s);
    }
    wait(s, 4 * bytes(x[0]));
    for i in 0..4 {
        mine[i] = mine[i] + f32(10 * core_id() + i);
        start copy(mine[i], slot[3 - i] @ to, send, recv[3 - i]);
    }
    wait(send, bytes(x));
    for i in 0..4 {
        wait(recv[i], bytes(slot[i]));
        start copy(slot[i], y[core_id() * 4 + i], s);
    }
    wait(s, 4 * 4096);
}
"""
    x = f32(4, 8, 128)
    r = schedules(src, "1", dict(x=x), ["y"])
    expected = np.stack([x[3 - i] + np.float32(10 * (1 - c) + 3 - i) for c in (0, 1) for i in range(4)])
    same(expected, r.output("y"))


def test_copies_inside_an_fn_take_views_and_semaphores_as_arguments():
    src = """
fn fetch(src: hbm f32[8, 128], dst: vmem f32[8, 128], s: sem) {
    start copy(src, dst, s);
    wait copy(src, dst, s);
}
fn push(src: vmem f32[8, 128], to: i32, send: sem, recv: sem) {
    sem local;
    vmem tmp: f32[8, 128];
    vmem box: f32[8, 128];                 // fresh for every call: the same on every core
    start copy(src, tmp, local);
    wait copy(src, tmp, local);
    tmp = tmp * -1.0;
    start copy(tmp, box @ to, send, recv);
    wait copy(tmp, box @ to, send, recv);
    wait recv copy(tmp, box @ to, send, recv);
    src = box;
}
kernel k(x: hbm f32[2, 8, 128], y: hbm f32[2, 8, 128]) {
    vmem v: f32[8, 128];
    sem s;
    sem ss[2];
    fetch(x[core_id()], v, ss[1]);
    push(v, peer(0, 1), s, ss[0]);
    start copy(v, y[core_id()], s);
    wait copy(v, y[core_id()], s);
}
"""
    xs = per_chip(2, (2, 8, 128))
    r = schedules(src, "2", xs, ["y"])
    for chip in range(2):
        same(-xs[f"x@{1 - chip}"], r.output("y", chip=chip))


def test_a_run_time_choice_of_source_views_is_one_copy_and_one_wait():
    src = """
kernel k(a: hbm f32[4, 8, 128], b: hbm f32[4, 8, 128], y: hbm f32[8, 8, 128]) {
    vmem t: f32[8, 128];
    sem s;
    for j in 0..8 {
        start copy(select(j < 4, a[j], b[j - 4]), t, s);
        wait copy(select(j < 4, a[j], b[j - 4]), t, s);
        t = t + f32(j);
        start copy(t, y[7 - j], s);
        wait copy(t, y[7 - j], s);
    }
}
"""
    a, b = f32(4, 8, 128), f32(4, 8, 128)
    ab = np.concatenate([a, b])
    expected = np.stack([ab[j] + np.float32(j) for j in range(8)])[::-1]
    same(expected, run(src, a=a, b=b).output("y"))


def test_every_launch_starts_with_fresh_semaphores_and_vmem():
    src = """
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128], n: i32) {
    vmem v: f32[8, 128];
    sem s;
    sem spare;
    signal(spare, n);
    start copy(x, v, s);
    wait copy(x, v, s);
    v = v + f32(n);
    start copy(v, y, s);
    wait copy(v, y, s);
    wait(spare, n);
}
host {
    input x: f32[8, 128];
    output y: f32[8, 128];
    hbm t: f32[8, 128];
    launch k(x, t, 1);
    launch k(t, y, 2);
}
"""
    x = f32(8, 128)
    same(x + np.float32(1.0) + np.float32(2.0), run(src, x=x).output("y"))


def test_signals_with_run_time_amounts_and_targets():
    src = """
kernel k(y: hbm i32[2, 4]) {
    smem t: i32[4];
    sem got;
    sem s;
    let me = global_core(chip_id(), core_id());
    let n = num_chips() * num_cores();
    for d in 1..n {
        signal(got @ ((me + d) % n), me + 1);              // every other core: our id + 1
    }
    let total = n * (n + 1) / 2 - (me + 1);
    wait(got, total);
    t[0] = me; t[1] = total; t[2] = n; t[3] = 0;
    start copy(t, y[core_id()], s);
    wait copy(t, y[core_id()], s);
}
"""
    r = run(src, "2x2")
    n = 8
    for chip in range(4):
        rows = [[g, n * (n + 1) // 2 - (g + 1), n, 0] for g in (2 * chip, 2 * chip + 1)]
        same(np.array(rows, np.int32), r.output("y", chip=chip))


def test_element_strided_views_point_indices_in_the_middle_and_at_the_end():
    # DMAs move bytes: a point index in the last dimension leaves an element-strided
    # view; one in the middle a view across planes; both ways, HBM and VMEM.
    src = """
kernel k(x: hbm f32[4, 8, 128], y: hbm f32[8, 128], z: hbm f32[4, 8, 128]) {
    vmem v: f32[8, 128];
    sem s;
    v = 0.0;
    start copy(x[:, :, 5], v[0:4, 0:8], s);
    start copy(x[0:2, 3, :], v[4:6, :], s);
    start copy(x[1:3, 2:5, 7], v[6:8, 100:103], s);
    wait copy(x[:, :, 5], v[0:4, 0:8], s);
    wait copy(x[0:2, 3, :], v[4:6, :], s);
    wait copy(x[1:3, 2:5, 7], v[6:8, 100:103], s);
    start copy(v, y, s);
    wait copy(v, y, s);
    start copy(v[0:8, 0:4], z[0, :, 0:4], s);
    start copy(v[0:2, 0:4], z[1:3, 0:4, 4], s);
    start copy(v[5, 0:8], z[3, :, 127], s);
    wait copy(v[0:8, 0:4], z[0, :, 0:4], s);
    wait copy(v[0:2, 0:4], z[1:3, 0:4, 4], s);
    wait copy(v[5, 0:8], z[3, :, 127], s);
}
"""
    x = f32(4, 8, 128)
    y = np.zeros((8, 128), np.float32)
    y[0:4, 0:8] = x[:, :, 5]
    y[4:6] = x[0:2, 3]
    y[6:8, 100:103] = x[1:3, 2:5, 7]
    z = np.zeros((4, 8, 128), np.float32)
    z[0, :, 0:4] = y[:, 0:4]
    z[1:3, 0:4, 4] = y[0:2, 0:4]
    z[3, :, 127] = y[5, 0:8]
    r = run(src, x=x)
    same(y, r.output("y"))
    same(z, r.output("z"))


def test_bf16_copies_at_odd_column_offsets_and_smem_column_blocks():
    src = """
kernel k(x: hbm bf16[4, 300], y: hbm bf16[4, 300], a: hbm i32[4, 8], b: hbm i32[8, 8]) {
    vmem v: bf16[4, 300];
    smem t: i32[4, 8];
    smem u: i32[8, 8];
    sem s;
    sem out;
    v = bf16(-1.5);
    start copy(x[1:3, 3:10], v[0:2, 7:14], s);
    start copy(x[3, 299], v[3, 0], s);
    start copy(a, t, s);
    wait copy(x[1:3, 3:10], v[0:2, 7:14], s);
    wait copy(x[3, 299], v[3, 0], s);
    wait copy(a, t, s);
    start copy(v, y, out);
    for i in 0..8 {
        u[i, 0] = 0; u[i, 1] = 0; u[i, 2] = 0; u[i, 3] = 0;
        u[i, 4] = 0; u[i, 5] = 0; u[i, 6] = 0; u[i, 7] = 0;
    }
    start copy(t[:, 2:5], u[4:8, 5:8], s);                 // strided SMEM on both sides
    wait copy(t[:, 2:5], u[4:8, 5:8], s);
    start copy(u, b, s);
    wait copy(u, b, s);
    wait copy(v, y, out);
}
"""
    x = numerics.bf16_round(f32(4, 300))
    a = RNG.integers(-50, 50, (4, 8)).astype(np.int32)
    r = run(src, x=x, a=a)
    y = np.full((4, 300), -1.5, np.float32)
    y[0:2, 7:14] = x[1:3, 3:10]
    y[3, 0] = x[3, 299]
    same(y, r.output("y"))
    b = np.zeros((8, 8), np.int32)
    b[4:8, 5:8] = a[:, 2:5]
    same(b, r.output("b"))


def test_remote_copies_into_smem_and_from_hbm_and_to_this_core_itself():
    # The source is local (VMEM, SMEM or HBM); `@` may name this very core.
    src = """
kernel k(x: hbm f32[8, 128], y: hbm f32[2, 8, 128], z: hbm i32[2, 4]) {
    vmem v: f32[8, 128];
    smem t: i32[4];
    smem u: i32[4];
    sem a;
    sem b;
    sem f;
    sem s;
    let me = global_core(chip_id(), core_id());
    start copy(x, v @ peer(0, 1), a, b);                   // HBM of this chip to VMEM of a peer
    wait copy(x, v @ peer(0, 1), a, b);
    wait recv copy(x, v @ peer(0, 1), a, b);
    start copy(v, y[core_id()], s);
    t[0] = me; t[1] = 7; t[2] = peer(0, 1); t[3] = 9;
    start copy(t, u @ peer(0, 1), a, b);                   // SMEM to a peer's SMEM
    wait copy(t, u @ peer(0, 1), a, b);
    wait recv copy(t, u @ peer(0, 1), a, b);
    u[3] = u[3] + me;
    start copy(u[1:4], t[0:3] @ me, a, b);                 // to ourselves
    wait copy(u[1:4], t[0:3] @ me, a, b);
    wait recv copy(u[1:4], t[0:3] @ me, a, b);
    signal(f @ me, 3);
    wait(f, 3);
    start copy(t, z[core_id()], s);
    wait copy(t, z[core_id()], s);
    wait copy(v, y[core_id()], s);
}
"""
    xs = per_chip(2, (8, 128))
    r = schedules(src, "2", xs, ["y", "z"])
    for chip in range(2):
        other = 1 - chip
        same(np.stack([xs[f"x@{other}"]] * 2), r.output("y", chip=chip))
        rows = [[7, chip * 2 + core, 9 + chip * 2 + core, 9] for core in (0, 1)]
        same(np.array(rows, np.int32), r.output("z", chip=chip))


def test_mxfp4_copies_count_values_and_scales_in_waits_and_bytes():
    # A copy of mxfp4 moves K*N/2 bytes of values and K/32*N of scales; counted waits
    # and bytes() count both.
    src = """
kernel k(w: hbm mxfp4[2, 64, 256], y: hbm i32[4]) {
    vmem v: mxfp4[2][64, 256];
    smem t: i32[4];
    sem a;
    for i in 0..2 {
        start copy(w[i], v[1 - i], a);
    }
    wait 2 * copy(w[0], v[0], a);
    t[0] = bytes(w[0]);
    t[1] = bytes(copy(w[0], v[0], a));
    t[2] = bytes(v[0][0:32, 0:128]);
    t[3] = bytes(w);
    start copy(t, y, a);
    wait copy(t, y, a);
}
"""
    same(np.array([64 * 256 // 2 + 2 * 256, 8704, 32 * 128 // 2 + 128, 2 * 8704], np.int32),
         run(src).output("y"))


def test_a_barrier_along_an_axis_only_waits_for_its_own_line():
    # On 2x2, barrier(0) joins chips {0, 1} and chips {2, 3} (same core index):
    # one line may pass it twice while the other passes it once.
    src = """
kernel k(y: hbm i32[2, 2]) {
    smem t: i32[2];
    sem s;
    barrier(0);
    if chip_coord(1) == 0 {
        barrier(0);
    }
    if core_id() == 0 {
        barrier(1);
    }
    t[0] = chip_id(); t[1] = core_id();
    start copy(t, y[core_id()], s);
    wait copy(t, y[core_id()], s);
}
"""
    r = run(src, "2x2")
    for chip in range(4):
        same(np.array([[chip, 0], [chip, 1]], np.int32), r.output("y", chip=chip))


def test_a_let_bound_copy_view_or_semaphore_keeps_the_indices_it_was_bound_with():
    # `let` is an immutable binding: `let n = i;` keeps i's value, and so must a view,
    # a semaphore and a copy description whose indices read a var or SMEM
    # (`let h = copy(x[i], v, s); i = 1; start h;` copies x[i] as i was when bound).
    src = """
kernel k(x: hbm f32[4, 8, 128], y: hbm f32[4, 8, 128], z: hbm i32[4]) {
    vmem v: f32[8, 128];
    vmem w: f32[8, 128];
    smem t: i32[4];
    sem s;
    sem ws[2];
    sem send;
    sem recv;
    var i: i32 = 0;
    t[0] = 1; t[1] = 0; t[2] = 0; t[3] = 0;
    let n = i;
    let h = copy(x[i], v, ws[i]);                     // x[0], on ws[0]
    let row = x[t[0]];                                // x[1]
    let g = copy(v, y[i + 2], s);                     // y[2]
    let r = copy(w, y[3] @ global_core(chip_id(), i + core_id()), send, recv);
    let q = ws[i];
    i = 1;
    t[0] = 3;
    start h;
    wait h;
    start g;
    wait g;
    start copy(row, w, s);
    wait copy(row, w, s);
    start r;
    wait r;
    wait recv r;
    signal(q, 1);
    wait(ws[0], 1);
    start copy(w, y[i], s);                           // y[1]: i is 1 now
    wait copy(w, y[i], s);
    t[1] = n; t[2] = i; t[3] = t[0];
    start copy(t, z, s);
    wait copy(t, z, s);
}
"""
    x = np.stack([np.full((8, 128), k + 1, np.float32) for k in range(4)])
    r = run(src, x=x)
    same(np.stack([np.zeros((8, 128), np.float32), x[1], x[0], x[1]]), r.output("y"))
    same(np.array([3, 0, 1, 3], np.int32), r.output("z"))


def test_semaphore_ids_follow_declaration_order_with_arrays_contiguous():
    # "Semaphore ids are static in declaration order, arrays contiguous": a, ws[0..2], b
    # are 0, 1..3, 4; a semaphore left raised is named by its id, with its value and the
    # line that last raised it.
    src = """
kernel k(x: hbm f32[8, 128]) {
    sem a;
    sem ws[3];
    sem b;
    signal(ws[2], 1);
    signal(ws[2], 2);
    wait(ws[2], 2);
    signal(b, 5);
    wait(b, 5);
    signal(a, 1);
    wait(a, 1);
}
"""
    info = fault(src)
    text = info.render()
    assert info.kind == "semaphore-nonzero", text
    assert "semaphore 3 = 1" in text and "), which is 'ws[2]'" in text and where(src, "signal(ws[2], 2)") in text, text
    assert "chip 0, core 0" in text, text


def test_a_let_bound_mxfp4_view_keeps_its_run_time_row_block():
    # A let-bound mxfp4 view with a run-time start `32 * t[1]` keeps its multiple-of-32
    # form (it still compiles) and the block it was bound with.
    src = """
kernel k(w: hbm mxfp4[2, 64, 256], sel: hbm i32[2], x: hbm bf16[8, 32], y: hbm f32[8, 256]) {
    vmem v: mxfp4[32, 256];
    vmem xv: bf16[8, 32];
    vmem out: f32[8, 256];
    smem t: i32[2];
    sem s;
    start copy(sel, t, s);
    start copy(x, xv, s);
    wait copy(sel, t, s);
    wait copy(x, xv, s);
    var e: i32 = t[0];
    VIEW
    e = 0;
    t[1] = 0;
    start copy(wv, v, s);
    wait copy(wv, v, s);
    out = matmul(xv, v);
    start copy(out, y, s);
    wait copy(out, y, s);
}
"""
    inputs = dict(w=f32(2, 64, 256), sel=np.array([1, 1], np.int32), x=numerics.bf16_round(f32(8, 32)))
    bound = run(src.replace("VIEW", "let wv = w[e, 32 * t[1] +: 32, :];"), **inputs).output("y")
    direct = run(src.replace("VIEW", "let wv = w[1, 32:64, :];"), **inputs).output("y")
    other = run(src.replace("VIEW", "let wv = w[0, 0:32, :];"), **inputs).output("y")
    same(direct, bound)
    assert not np.array_equal(direct, other)
