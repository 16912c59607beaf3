"""docs/language.md, second half, as a kernel author reads it: "DMAs and semaphores",
"SPMD and remote operations", "Pipelines", "Control flow and regions", "Functions",
"Generics", "Host", "Errors", "For the back end" and "Back end rules". Each documented
example and rule is written as a small program, run on the `test` profile and compared
with numpy; each quoted message must appear as quoted; each documented fault must be the
documented kind."""

from __future__ import annotations

import re

import numpy as np
import pytest

import mkemu
from mkemu.errors import EmulatorFault, SourceError


def build(tmp_path, src, mesh="1", hw="test", **options):
    path = tmp_path / "prog.mk"
    path.write_text(src)
    return mkemu.compile_source(src, filename=path, hw=hw, mesh=mesh, **options)


def errors(tmp_path, src, mesh="1", **options) -> str:
    with pytest.raises(SourceError) as info:
        build(tmp_path, src, mesh, **options)
    return str(info.value)


def fault(kernel, **inputs) -> str:
    with pytest.raises(EmulatorFault) as info:
        kernel(**inputs)
    return str(info.value)


# ---------------------------------------------------------------- DMAs and semaphores

GATHER = """
kernel k(x: hbm f32[16, 128], ix: hbm i32[5], y: hbm f32[4, 128], z: hbm f32[16, 128]) {
    smem idx: i32[5];
    vmem rows: f32[4, 128];
    vmem a: f32[16, 128];
    sem s;
    let h = copy(ix, idx, s);
    start h;
    wait 1 * h;                                   // a bound copy counts too
    let count = idx[4];
    rows = 0.0;
    for r in 0..count {
        start copy(x[idx[r]], rows[r:r + 1, :], s);
    }
    wait count * copy(x[0], rows[0:1, :], s);     // count x the copy's bytes
    start copy(x, a, s);
    wait(s, bytes(a));                            // bytes(view)
    signal(s, 1);
    wait(s, 1);
    start copy(rows, y, s);
    wait copy(rows, y, s) * 1;                    // copy(...) * n
    start copy(a, z, s);
    wait(s, bytes(copy(a, z, s)));                // bytes(copy)
}
"""


def test_counted_waits_bytes_and_bound_copies(tmp_path):
    k = build(tmp_path, GATHER)
    x = np.arange(16 * 128, dtype=np.float32).reshape(16, 128)
    for count in (0, 2, 4):
        ix = np.array([3, 1, 7, 15, count], np.int32)
        run = k(x=x, ix=ix)
        expected = np.zeros((4, 128), np.float32)
        expected[:count] = x[ix[:count]]
        np.testing.assert_array_equal(run.output("y"), expected)
        np.testing.assert_array_equal(run.output("z"), x)


def test_dma_errors_the_compiler_reports(tmp_path):
    text = errors(tmp_path, """
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem a: f32[8, 128];
    vmem b: f32[128, 8];
    var v: f32[8, 128];
    sem s;
    sem t;
    sem u;
    sem ws[2];
    start 2 * copy(x, a, s);
    wait -1 * copy(x, a, s);
    signal(s, -1);
    wait(s, -2);
    wait(t, 1);
    start copy(x, a, u);
    let h = copy(a, y, s);
    start copy(x, v, s);
    start copy(x, b, s);
    signal(ws[2], 1);
    for i in 0..3 { wait(ws[i], 1); }
}
""")
    for message in [
        "start issues one copy; a count of copies (n * copy(...)) is for wait",
        "the count of copies to wait for must not be negative, got -1",
        "the amount of a signal must not be negative, got -1",
        "the amount of a wait must not be negative, got -2",
        "wait on semaphore 't', but no started DMA or signal ever targets it",
        "DMA started on semaphore 'u' is never waited (every semaphore must be back to 0 when the kernel ends)",
        "DMA 'h' is described but never started or waited",
        "'v' is a var (placed by the compiler); DMAs need a vmem, smem or hbm buffer",
        "shape mismatch: copy from [8, 128] to [128, 8]",
        "index 2 is out of range for semaphore array 'ws' (size 2)",
        "index ranging over 0..2 is out of range for semaphore array 'ws' (size 2)",
    ]:
        assert message in text, message


def test_schedule_faults_the_run_reports(tmp_path):
    # A semaphore left non-zero.
    k = build(tmp_path, """
kernel k(x: hbm f32[8, 128]) {
    sem s;
    signal(s, 2);
    wait(s, 1);
}
""")
    assert fault(k).startswith("fault [semaphore-nonzero]")
    # Reading a buffer before waiting for the copy that fills it: a race in every schedule.
    k = build(tmp_path, """
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem a: f32[8, 128];
    sem s;
    start copy(x, a, s);
    a = a + 1.0;
    wait copy(x, a, s);
    start copy(a, y, s);
    wait copy(a, y, s);
}
""")
    assert fault(k).startswith("fault [race]")
    # A wait for more bytes than were started: a deadlock.
    k = build(tmp_path, """
kernel k(x: hbm f32[16, 128]) {
    vmem a: f32[16, 128];
    sem s;
    start copy(x[0:8, :], a[0:8, :], s);
    wait copy(x, a, s);
}
""")
    assert fault(k).startswith("fault [deadlock]")
    # A negative count at run time.
    k = build(tmp_path, """
kernel k(x: hbm f32[8, 128]) {
    vmem a: f32[8, 128];
    sem s;
    start copy(x, a, s);
    wait copy(x, a, s);
    wait (num_chips() - 2) * copy(x, a, s);
}
""")
    assert fault(k).startswith("fault [bad-operand]")


COVERED = """
kernel k(x: hbm f32[8, 128], big: hbm f32[64, 128], y: hbm f32[8, 128]) {
    vmem a: f32[8, 128];
    vmem b: f32[64, 128];
    sem s;
    start copy(big, b, s);
    start copy(x, a, s);
    wait copy(big, b, s);
    a = a + 1.0;                 // the wait for x is missing here
    wait copy(x, a, s);
    start copy(a, y, s);
    wait copy(a, y, s);
}
"""


def test_a_missing_wait_another_wait_covers_is_caught_by_the_late_schedule(tmp_path):
    build(tmp_path, COVERED)()                      # the normal schedule runs clean
    assert fault(build(tmp_path, COVERED, schedule="late")).startswith("fault [race]")


# ---------------------------------------------------------------- SPMD and remote operations

SPMD = """
kernel k(y: hbm i32[2, 16]) {
    smem v: i32[16];
    sem s;
    v[0] = chip_id();      v[1] = core_id();      v[2] = num_chips();    v[3] = num_cores();
    v[4] = mesh_dim(0);    v[5] = mesh_dim(1);    v[6] = mesh_dim(2);    v[7] = chip_coord(0);
    v[8] = chip_coord(1);  v[9] = chip_coord(2);  v[10] = peer(0, 1);    v[11] = peer(0, -1);
    v[12] = peer(1, 1);    v[13] = peer(1, -1);   v[14] = global_core(chip_id(), core_id());
    v[15] = peer(0, 5);
    start copy(v, y[core_id()], s);
    wait copy(v, y[core_id()], s);
}
"""


def test_spmd_builtins_on_a_2x3_mesh(tmp_path):
    k = build(tmp_path, SPMD, mesh="2x3")
    run = k()
    X, Y, cores = 2, 3, 2

    def gcore(x, y, core):
        return ((x % X) + X * (y % Y)) * cores + core

    for chip in range(X * Y):
        x, y = chip % X, chip // X
        for core in range(cores):
            expected = [chip, core, X * Y, cores, X, Y, 1, x, y, 0,
                        gcore(x + 1, y, core), gcore(x - 1, y, core), gcore(x, y + 1, core),
                        gcore(x, y - 1, core), chip * cores + core, gcore(x + 5, y, core)]
            assert run.output("y", chip=chip)[core].tolist() == expected


RING = """
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem xv: f32[8, 128];
    vmem inbox: f32[8, 128];
    sem s;
    sem send;
    sem recv;
    sem flag;
    start copy(x, xv, s);
    wait copy(x, xv, s);
    xv = xv + f32(chip_id() * 10 + core_id());
    barrier();
    let h = copy(xv, inbox @ peer(0, 1), send, recv);   // push into the peer's inbox
    start h;
    wait h;                 // our side: the bytes have left
    wait recv h;            // the matching copy from our neighbour arrived
    signal(flag @ peer(0, -1), 1);
    wait(flag, 1);
    barrier(2);
    if core_id() == 0 {
        start copy(inbox, y, s);
        wait copy(inbox, y, s);
    }
}
"""


@pytest.mark.parametrize("schedule", ["normal", "late"])
def test_the_documented_remote_push_around_a_ring(tmp_path, schedule):
    k = build(tmp_path, RING, mesh="4", schedule=schedule)
    run = k(x=np.zeros((8, 128), np.float32))
    for chip in range(4):
        np.testing.assert_array_equal(run.output("y", chip=chip), np.full((8, 128), ((chip - 1) % 4) * 10.0))


GATHER_TO_ZERO = """
param CHIPS = 4;
kernel k(x: hbm f32[1, 128], y: hbm f32[CHIPS, 128]) {
    vmem rows: f32[1, 128];
    vmem all: f32[CHIPS][1, 128];
    sem s;
    sem sent;
    sem got;
    let me = chip_id();
    if core_id() == 0 {
        start copy(x, rows, s);
        wait copy(x, rows, s);
        rows = rows + f32(me);
        if me != 0 {
            start copy(rows, all[me] @ 0, sent, got);
            wait copy(rows, all[me] @ 0, sent, got);
        } else {
            all[0] = rows;
            wait recv (CHIPS - 1) * copy(rows, all[me] @ 0, sent, got);   // the peers' pushes to us
            for c in 0..CHIPS {
                start copy(all[c], y[c:c+1, :], s);
            }
            wait(s, CHIPS * bytes(all[0]));
        }
    }
}
"""


def test_counted_receive_and_remote_hbm_and_smem_destinations(tmp_path):
    run = build(tmp_path, GATHER_TO_ZERO, mesh="4", schedule="late")(x=np.zeros((1, 128), np.float32))
    np.testing.assert_array_equal(run.output("y")[:, 0], [0, 1, 2, 3])
    # A push straight into the next chip's HBM array, and one into an SMEM buffer.
    run = build(tmp_path, """
kernel k(y: hbm f32[8, 128], z: hbm i32[2]) {
    vmem xv: f32[8, 128];
    smem q: i32[2];
    smem box: i32[2];
    sem send;
    sem recv;
    sem s;
    xv = f32(chip_id()) + 0.5;
    q[0] = chip_id();
    q[1] = core_id();
    if core_id() == 0 {
        let h = copy(xv, y @ peer(0, 1), send, recv);
        start h;
        wait h;
        wait recv h;
    }
    let g = copy(q, box @ peer(0, 1), send, recv);
    start g;
    wait g;
    wait recv g;
    if core_id() == 1 {
        start copy(box, z, s);
        wait copy(box, z, s);
    }
}
""", mesh="3")()
    for chip in range(3):
        np.testing.assert_array_equal(run.output("y", chip=chip), np.full((8, 128), (chip - 1) % 3 + 0.5))
        assert run.output("z", chip=chip).tolist() == [(chip - 1) % 3, 1]


def test_remote_errors_and_faults(tmp_path):
    text = errors(tmp_path, """
kernel k(x: hbm f32[8, 128], n: i32) {
    vmem xv: f32[8, 128];
    smem q: i32[2];
    sem send;
    sem recv;
    let a = copy(x, xv @ peer(0, 1), send);
    let b = copy(x @ 1, xv, send, recv);
    start copy(x, xv, send);
    wait recv copy(x, xv, send);
    q[0] = chip_coord(3);
    q[1] = mesh_dim(n);
}
""")
    for message in [
        "copy() takes 4 arguments (copy(src, dst @ core, send_sem, recv_sem)), got 3",
        "only the destination of copy() can be remote (DMAs push)",
        "'wait recv' is for remote copies (copy(src, dst @ core, send, recv))",
        "mesh axis must be 0, 1 or 2, got 3",
        "the axis of mesh_dim() must be a compile-time integer",
    ]:
        assert message in text, message
    assert "global_core: core 2 does not exist (profile 'test' has 2 cores per chip)" in errors(
        tmp_path, "kernel k(x: hbm f32[8, 128]) {\n    sem f;\n    signal(f @ global_core(0, 2), 1);\n    wait(f, 1);\n}\n")
    k = build(tmp_path, "kernel k(x: hbm f32[8, 128]) {\n    sem f;\n    signal(f @ 99, 1);\n    wait(f, 1);\n}\n")
    assert fault(k).startswith("fault [bad-target]")
    k = build(tmp_path, """
kernel k(n: hbm i32[1]) {
    smem q: i32[1];
    sem s;
    start copy(n, q, s);
    wait copy(n, q, s);
    q[0] = global_core(0, q[0]);
}
""")
    assert fault(k, n=np.array([2], np.int32)).startswith("fault [out-of-range]")


def test_barrier_members(tmp_path):
    ok = build(tmp_path, "kernel k(x: hbm f32[8, 128]) {\n    if core_id() == 0 { barrier(0); }\n}\n", mesh="2")
    ok()
    bad = build(tmp_path, "kernel k(x: hbm f32[8, 128]) {\n    if core_id() == 0 { barrier(); }\n}\n", mesh="2")
    assert fault(bad).startswith("fault [barrier-not-reached]")


# ---------------------------------------------------------------- Pipelines

PIPELINED = """
param D = 3;
kernel matmul_pl(x: hbm bf16[8, 256], w: hbm bf16[256, 1024], y: hbm f32[8, 1024]) {
    vmem xv: bf16[8, 256];
    sem xs;
    start copy(x, xv, xs);
    wait copy(x, xv, xs);
    pipeline j in 0..1024 / 128 depth D {
        input wt = w[:, j * 128 +: 128];
        output yt = y[:, j * 128 +: 128];
        yt = matmul(xv, wt);
    }
}
"""


def _bf16(a):
    """Round to the nearest bf16 (ties to even), kept as float32."""
    a = np.asarray(a, np.float32).view(np.uint32)
    return (((a + 0x7FFF + ((a >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_a_pipelined_matmul_at_each_depth(tmp_path, depth):
    rng = np.random.default_rng(depth)
    x = _bf16(rng.standard_normal((8, 256)))
    w = _bf16(rng.standard_normal((256, 1024)))
    run = build(tmp_path, PIPELINED, params={"D": depth})(x=x, w=w)
    np.testing.assert_allclose(run.output("y"), x.astype(np.float64) @ w, rtol=1e-5, atol=1e-4)


RUNTIME_BOUNDS = """
param D = 3;
param S = 1;
kernel k(p: hbm i32[2], a: hbm f32[8, 1024], b: hbm f32[8, 1024], y: hbm f32[8, 1024]) {
    smem ps: i32[2];
    sem s;
    start copy(p, ps, s);
    wait copy(p, ps, s);
    pipeline t in ps[0]..ps[1] step S depth D {
        input at = a[:, t * 128 +: 128];
        input bt = b[:, t * 128 +: 128];
        output yt = y[:, t * 128 +: 128];
        yt = at + bt;
    }
}
"""


@pytest.mark.parametrize("depth,step", [(1, 1), (3, 2), (4, 3)])
def test_pipelines_with_run_time_bounds_and_steps(tmp_path, depth, step):
    k = build(tmp_path, RUNTIME_BOUNDS, params={"D": depth, "S": step})
    a = np.arange(8 * 1024, dtype=np.float32).reshape(8, 1024)
    for lo, hi in [(0, 8), (0, 0), (2, 3), (1, 8), (3, 2), (5, 7)]:
        run = k(p=np.array([lo, hi], np.int32), a=a, b=a * 0.5)
        expected = np.zeros_like(a)
        for t in range(lo, hi, step):
            expected[:, t * 128:(t + 1) * 128] = (a * 1.5)[:, t * 128:(t + 1) * 128]
        np.testing.assert_array_equal(run.output("y"), expected)


def test_a_run_time_tile_count_guards_the_prologue(tmp_path):
    k = build(tmp_path, """
kernel k(p: hbm i32[1], a: hbm f32[8, 256], y: hbm f32[8, 256]) {
    smem ps: i32[1];
    sem s;
    start copy(p, ps, s);
    wait copy(p, ps, s);
    pipeline t in 0..ps[0] depth 4 {
        input at = a[:, t * 128 +: 128];
        output yt = y[:, t * 128 +: 128];
        yt = at * 2.0;
    }
}
""")
    a = np.ones((8, 256), np.float32)
    for n in (0, 1, 2):                  # tiles 2 and 3 would lie past the array: never issued
        np.testing.assert_array_equal(k(p=np.array([n], np.int32), a=a).output("y")[0, ::128], [2.0] * n + [0.0] * (2 - n))
    text = fault(k, p=np.array([3], np.int32), a=a)
    assert text.startswith("fault [out-of-bounds]") and "prog.mk:7:5: pipeline t in 0..ps[0] depth 4 {" in text


def test_what_a_pipeline_generates(tmp_path):
    from mkemu.dsl import frontend, pretty
    path = tmp_path / "via.mk"
    path.write_text("""
kernel k(a: hbm f32[8, 1024], b: hbm f32[8, 1024], y: hbm f32[8, 1024]) {
    vmem ring: f32[3][16, 256];          // bigger slots than the tile: its leading rows and columns
    vmem ring2: f32[3][8, 128];
    sem rs[3];                           // two streams share one semaphore array
    pipeline t in 0..8 {
        input at = a[:, t * 128 +: 128] via ring, rs;
        input bt = b[:, t * 128 +: 128] via ring2, rs;
        output yt = y[:, t * 128 +: 128];
        yt = at + bt;
    }
}
""")
    text = pretty.program(frontend.load_program(path, {}))
    assert "vmem yt: f32[3][8, 128]" in text and "sem yt.sem[3]" in text       # D from via
    prologue = text.split("for t#tile")[0]
    assert prologue.count("start copy(a{") == 2 and prologue.count("start copy(b{") == 2   # tiles 0 .. D-2
    assert "for yt#drain in 5..8" in text                                       # the last min(n, D) write-backs
    a = np.arange(8 * 1024, dtype=np.float32).reshape(8, 1024)
    run = build(tmp_path, path.read_text(), schedule="late")(a=a, b=-2 * a)
    np.testing.assert_array_equal(run.output("y"), -a)


DOUBLED = """
param M = 8;
param K = 256;
param N = 512;
const TN = 128;

fn doubled(part: i32, xv: vmem bf16[M, K], w: hbm bf16[K, N], y: hbm f32[M, N],
           ring: vmem bf16[2][K, TN], rs: sem[2]) {
    pipeline j in 0..N / TN part part {
        input wt = w[:, j * TN +: TN] via ring, rs;
        output yt = y[:, j * TN +: TN];
        yt = matmul(xv, wt) * 2.0;
    }
}

kernel k(x: hbm bf16[M, K], w: hbm bf16[K, N], y1: hbm f32[M, N], y2: hbm f32[M, N]) {
    vmem xv: bf16[M, K];
    vmem ring: bf16[2][K, TN];
    sem rs[2];
    sem xs;
    start copy(x, xv, xs);
    wait copy(x, xv, xs);
    doubled(whole, xv, w, y1, ring, rs);
    doubled(prefetch, xv, w, y2, ring, rs);    // the first tiles start now ...
    xv = bf16(f32(xv));
    doubled(primed, xv, w, y2, ring, rs);      // ... the rest streams here
}
"""


def test_the_documented_pipeline_in_parts(tmp_path):
    rng = np.random.default_rng(5)
    x = _bf16(rng.standard_normal((8, 256)))
    w = _bf16(rng.standard_normal((256, 512)))
    run = build(tmp_path, DOUBLED, schedule="late")(x=x, w=w)
    np.testing.assert_array_equal(run.output("y2"), run.output("y1"))
    np.testing.assert_allclose(run.output("y1"), 2 * (x.astype(np.float64) @ w), rtol=1e-5, atol=1e-4)
    # Only one of the two parts.
    prefetch_only = DOUBLED.replace("    doubled(primed, xv, w, y2, ring, rs);      // ... the rest streams here\n", "")
    assert fault(build(tmp_path, prefetch_only), x=x, w=w).startswith("fault [semaphore-nonzero]")
    alone = prefetch_only.replace("    doubled(whole, xv, w, y1, ring, rs);\n", "")   # nothing else waits on rs
    assert "pipeline copy started on semaphore 'rs' is never waited" in errors(tmp_path, alone)
    primed_only = DOUBLED.replace("    doubled(prefetch, xv, w, y2, ring, rs);    // the first tiles start now ...\n", "")
    assert fault(build(tmp_path, primed_only), x=x, w=w).startswith("fault [deadlock]")


def test_pipeline_errors(tmp_path):
    text = errors(tmp_path, """
kernel k(a: hbm f32[8, 512], b: hbm f32[4, 8, 512], y: hbm f32[8, 512], n: i32) {
    vmem ring: f32[2][8, 128];
    vmem small: f32[2][8, 64];
    vmem r3: f32[3][8, 128];
    vmem one: f32[8, 128];
    sem rs[2];
    sem rs3[3];
    pipeline t in 0..4 {
        output yt = y[:, t * 128 +: 128];
        yt = 1.0;
        input at = a[:, t * 128 +: 128];
    }
    pipeline t in 0..4 { ring[0] = 1.0; }
    input zz = a[:, 0:128];
    pipeline t in 0..4 { input at = a[:, t * 128 +: 128] via small, rs; }
    pipeline t in 0..4 { input at = a[:, t * 128 +: 128] via ring, rs3; }
    pipeline t in 0..4 depth 3 { input at = a[:, t * 128 +: 128] via ring, rs; }
    pipeline t in 0..4 part 3 { input at = a[:, t * 128 +: 128] via ring, rs; }
    pipeline t in 0..4 part prefetch { input at = a[:, t * 128 +: 128]; }
    pipeline t in 0..4 {
        input at = a[:, t * 128 +: 128] via ring, rs;
        input bt = a[:, t * 128 +: 128] via ring, rs;
    }
    pipeline t in 0..4 { input bt = b[:, :, t * 128 +: 128]; }
    pipeline t in 0..4 {
        input at = a[:, t * 128 +: 128] via ring, rs;
        output yt = y[:, t * 128 +: 128] via r3, rs3;
    }
    pipeline t in 0..4 { input at = a[:, t * 128 +: 128] via one, rs; }
    pipeline t in 0..4 depth 0 { input at = a[:, t * 128 +: 128]; }
    pipeline t in 0..4 depth n { input at = a[:, t * 128 +: 128]; }
    pipeline t in 0..4 step n { input at = a[:, t * 128 +: 128]; }
}
""")
    for message in [
        "a pipeline's streams (input/output) come first, before its body",
        "a pipeline needs at least one stream",
        "'input zz = ...' declares a stream of a pipeline: it goes at the top of a pipeline's block",
        "slots f32[8, 64] of 'small' cannot hold the tile f32[8, 128]",
        "'ring' has 2 slots but 'rs3' 3 semaphores: one per slot",
        "depth 3, but the slots of 'ring' are 2",
        "the part of a pipeline is whole (0), prefetch (1) or primed (2), got 3",
        "the inputs of a pipeline run in parts (prefetch) give their slots with `via BUF, SEMS`",
        "streams 'at' and 'bt' of one pipeline both use the slots of 'ring': each stream needs slots of its own",
        "a pipeline tile has at most 2 dimensions, got [4, 8, 128]",
        "the streams of a pipeline share one depth; their slots have [2, 3]",
        "the slots of a stream are a whole buffer array",
        "the pipeline depth must be positive, got 0",
        "the pipeline depth must be a compile-time integer",
        "the pipeline step must be a compile-time integer",
    ]:
        assert message in text, message


def test_pipeline_semaphores_count_against_the_profile(tmp_path):
    text = errors(tmp_path, PIPELINED, params={"D": 8})       # 2 streams x 8 + xs
    assert "kernel 'matmul_pl' uses 17 semaphores; the profile has 16" in text


# ---------------------------------------------------------------- Control flow and regions

def test_loops_ifs_and_regions(tmp_path):
    src = """
param MODE = 0;
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128], z: hbm i32[4], n: i32) {
    vmem xv: f32[8, 128];
    smem cnt: i32[4];
    sem s;
    start copy(x, xv, s);
    wait copy(x, xv, s);
    var m: i32 = n;
    cnt[0] = 0; cnt[1] = 0; cnt[2] = 0; cnt[3] = 0;
    for i in 0..m { m += 1; cnt[0] = cnt[0] + 1; }     // bounds evaluated once
    for i in 0..n step 3 { cnt[1] = cnt[1] + 1; }
    for i in n..0 { cnt[3] = cnt[3] + 1; }
    for e in 0..5 {
        if e == 3 { cnt[2] = cnt[2] + 1000; } else if e < 2 { cnt[2] = cnt[2] + 10; } else { cnt[2] = cnt[2] + 1; }
    }
    if MODE == 1 {
        xv = not_checked + 1.0;                        // the branch not taken is not checked
    } else {
        region "attn" { xv = xv * 2.0; }
        for l in 0..3 { region "layer" (l) { xv = xv + 1.0; } }
    }
    start copy(xv, y, s);
    wait copy(xv, y, s);
    start copy(cnt, z, s);
    wait copy(cnt, z, s);
}
host {
    input x: f32[8, 128];
    output y: f32[8, 128];
    output z: i32[4];
    launch k(x, y, z, 7);
}
"""
    x = np.linspace(-1, 1, 8 * 128, dtype=np.float32).reshape(8, 128)
    run = build(tmp_path, src)(x=x)
    assert run.output("z").tolist() == [7, 3, 1022, 0]
    np.testing.assert_array_equal(run.output("y"), x * 2 + 1 + 1 + 1)
    figures = run.report.figures
    assert figures["region_entries"] == {"attn": 2, "layer": 6}          # per core, summed
    assert set(figures["region_cycles"]) == {"attn", "layer"}
    assert "unknown name 'not_checked'" in errors(tmp_path, src, params={"MODE": 1})
    text = errors(tmp_path, """
kernel k(x: hbm f32[8, 128], n: i32) {
    vmem xv: f32[8, 128];
    for i in 0..n { i = 3; }
    for i in 0..8 step 0 { }
    for i in 0..8 step n { }
    if xv < 1.0 { }
    if n { }
}
""")
    for message in ["cannot assign to 'i': it is a loop variable (declare it with var)",
                    "the loop step must be positive, got 0", "the loop step must be a compile-time integer",
                    "expected a scalar condition, got a tile bool[8, 128]",
                    "expected a scalar condition (a bool), got an integer; compare it (e.g. x != 0)"]:
        assert message in text, message


# ---------------------------------------------------------------- Functions and generics

def test_functions(tmp_path):
    run = build(tmp_path, """
fn scale(x: vmem f32[8, n], n: i32, factor: i32) { x = x * f32(factor); }
fn once(c: i32, o: smem i32[4]) { o[0] = 7; o[1] = c; }
kernel k(x: hbm f32[8, 512], y: hbm f32[8, 512], z: hbm i32[4]) {
    vmem xv: f32[8, 512];
    smem o: i32[4];
    var acc: f32[8, 128] = 1.0;
    sem s;
    start copy(x, xv, s);
    wait copy(x, xv, s);
    scale(xv, 512, 2);
    scale(xv[:, 0:128], 128, 3);
    scale(acc, 128, 4);                  // a vmem parameter accepts a var
    xv[:, 128:256] = acc;
    o[0] = 1; o[1] = 0; o[2] = 0; o[3] = 0;
    once(o[0] * 10, o);                  // evaluated once, at the call
    start copy(xv, y, s);
    wait copy(xv, y, s);
    start copy(o, z, s);
    wait copy(o, z, s);
}
""")(x=np.ones((8, 512), np.float32))
    np.testing.assert_array_equal(run.output("y")[0, ::128], [6, 4, 2, 2])
    assert run.output("z").tolist() == [7, 10, 0, 0]
    text = errors(tmp_path, """
fn r1(n: i32) { r2(n); }
fn r2(n: i32) { r1(n); }
fn own(x: vmem f32[8, 128]) { x = x + nothere1; }
fn sized(x: vmem f32[8, n], n: i32) { x = x + nothere2; }
fn length(n: i32, x: vmem f32[8, 128]) { x[:, 0 +: n] = nothere3; }
fn setc(c: i32) { c = 3; }
kernel k(z: hbm f32[8, 128], m: i32) {
    vmem a: f32[8, 512];
    r1(1);
    sized(a, m);
}
""")
    assert "recursive fn call: r2 -> r1 -> r2 (fns are inlined)" in text
    assert text.count("unknown name 'nothere1'") == 1                 # checked on its own, never called
    assert "unknown name 'nothere2'" not in text and "unknown name 'nothere3'" not in text         # checked at each call only
    assert "a dimension must be a compile-time integer (in fn 'sized' inlined at" in text
    assert "cannot assign to 'c': it is a parameter" in text
    deep = "\n".join(f"fn g{i}(x: smem i32[4]) {{ g{i + 1}(x); }}" for i in range(65))
    deep += "\nfn g65(x: smem i32[4]) { x[0] = 1; }\nkernel k(z: hbm i32[4]) { smem q: i32[4]; g0(q); }\n"
    assert "fn calls nested more than 64 deep (fns are inlined)" in errors(tmp_path, deep)


def test_generics(tmp_path):
    k = build(tmp_path, """
param M = 8;
fn cp<T, R, C>(mode: i32, src: hbm T[R, C], dst: vmem T[R, C], s: sem) {
    if mode == 0 { start copy(src, dst, s); } else { wait copy(src, dst, s); }
}
kernel proj<K, N>(x: hbm f32[M, K], w: hbm bf16[K, N], y: hbm f32[M, N]) {
    vmem xv: f32[M, K];
    vmem xb: bf16[M, K];
    vmem wv: bf16[K, N];
    vmem yv: f32[M, N];
    sem s;
    cp(0, x, xv, s);
    cp(0, w, wv, s);
    cp(1, x, xv, s);
    cp(1, w, wv, s);
    xb = bf16(xv);
    yv = matmul(xb, wv);
    start copy(yv, y, s);
    wait copy(yv, y, s);
}
kernel twice<T, R>(x: hbm T[R, 128], y: hbm T[R, 128]) {
    vmem v: T[R, 128];
    sem s;
    start copy(x, v, s);
    wait copy(x, v, s);
    v = T(f32(v) * 2.0);
    start copy(v, y, s);
    wait copy(v, y, s);
}
host {
    input x: f32[M, 256];
    input w1: bf16[256, 512];
    input w2: bf16[512, 128];
    hbm h: f32[M, 512];
    output y: f32[M, 128];
    output yb: bf16[M, 128];
    launch proj(x, w1, h);
    launch proj(h, w2, y);
    launch twice(y, y);
    launch twice(yb, yb);
}
""")
    assert list(k.program.kernels) == ["proj<256,512>", "proj<512,128>", "twice<f32,8>",
                                                     "twice<bf16,8>"]
    rng = np.random.default_rng(1)
    x, w1, w2 = rng.standard_normal((8, 256)), _bf16(rng.standard_normal((256, 512))), _bf16(rng.standard_normal((512, 128)))
    run = k(x=x, w1=w1, w2=w2)
    expected = 2 * (_bf16(_bf16(x.astype(np.float32)).astype(np.float64) @ w1) @ w2)
    np.testing.assert_allclose(run.output("y"), expected, rtol=1e-5, atol=1e-3)
    text = errors(tmp_path, """
fn unfixed<R, C>(x: vmem f32[8, R]) { }
fn inexpr<R>(x: vmem f32[8, R * 2]) { }
fn two<R>(a: vmem f32[8, R], b: vmem f32[8, R]) { }
fn slots<S>(ss: sem[S]) { }
fn dims<R, C>(x: vmem f32[R, C]) { }
kernel k(a: hbm f32[8, 128]) {
    vmem p: f32[8, 128];
    vmem q: f32[8, 256];
    vmem v1: f32[128];
    sem s;
    two(p, q);
    slots(s);
    dims(v1);
}
""")
    for message in ["generic 'C' of fn 'unfixed' cannot be inferred from the arguments",
                    "generic 'R' of fn 'inexpr' cannot be inferred from the arguments",
                    "generic 'R' of fn 'two' is 128 from parameter 'a' but 256 here (parameter 'b')",
                    "generic 'S' of fn 'slots' cannot be inferred from argument 'ss'",
                    "generic 'R' of fn 'dims' cannot be inferred from argument 'x'"]:
        assert message in text, message
    assert "a generic kernel is made only by launches" in errors(tmp_path, "kernel k<N>(a: hbm f32[8, N]) { }\n")


# ---------------------------------------------------------------- Host

def test_host_loops_views_bools_and_launch_order(tmp_path):
    k = build(tmp_path, """
param L = 3;
kernel layer(acc: hbm f32[8, 128], w: hbm f32[8, 128], l: i32, neg: bool) {
    vmem a: f32[8, 128];
    vmem b: f32[8, 128];
    sem s;
    start copy(acc, a, s);
    start copy(w, b, s);
    wait copy(acc, a, s);
    wait copy(w, b, s);
    a = a + b * f32(select(neg, 0 - l, l));
    start copy(a, acc, s);
    wait copy(a, acc, s);
}
kernel half(src: hbm f32[4, 128], dst: hbm f32[4, 128]) {
    vmem a: f32[4, 128];
    vmem fresh: f32[4, 128];
    sem s;
    start copy(src, a, s);
    wait copy(src, a, s);
    a = a + fresh;                       // VMEM is fresh at each launch
    fresh = 100.0;
    start copy(a, dst, s);
    wait copy(a, dst, s);
}
host {
    input w: f32[L, 8, 128];
    hbm tmp: f32[8, 128];                // scratch, zero-initialised, kept between launches
    output y: f32[8, 128];
    for l in 0..L {
        if l % 2 == 0 { launch layer(tmp, w[l], l, false); } else { launch layer(tmp, w[l], l, true); }
    }
    launch half(tmp[0:4, :], y[4:8, :]);
    launch half(tmp[4:8], y[0:4]);
}
""")
    w = np.random.default_rng(2).standard_normal((3, 8, 128)).astype(np.float32)
    t = np.zeros((8, 128), np.float32) + w[0] * 0 - w[1] * 1 + w[2] * 2
    np.testing.assert_array_equal(k(w=w).output("y"), np.concatenate([t[4:], t[:4]]))
    text = errors(tmp_path, """
kernel k(a: hbm f32[8, 128], n: i32) { }
kernel b(a: hbm f32[8, 128], f: bool) { }
host {
    input w: f32[2, 8, 128];
    input wb: bf16[8, 128];
    launch k(w, 1);
    launch k(wb, 1);
    launch k(w[0], 1 < 2);
    launch b(w[0], 1);
    launch k(w[2], 0);
    launch k(w[0], 1 << 40);
    for i in 0..1001 { for j in 0..1000 { } }
}
""")
    for message in ["argument 'a' is f32[2, 8, 128], kernel 'k' expects f32[8, 128]",
                    "argument 'a' is bf16[8, 128], kernel 'k' expects f32[8, 128]",
                    "argument 'n' must be a compile-time integer, got a compile-time bool",
                    "argument 'f' must be a compile-time bool, got a compile-time integer",
                    "index 2 is out of range for dimension 0 of 'w' (size 2)",
                    "which does not fit in 32 bits",
                    "this one runs 1,000 times, 1,001,000 with the loops around it (at most 1,000,000)"]:
        assert message in text, message


# ---------------------------------------------------------------- Errors

def test_the_documented_error_example_and_one_report_per_fn_error(tmp_path):
    text = errors(tmp_path, """kernel k(a: hbm f32[8, 256]) {
    vmem x: f32[8, 256];
    sem s;
    x = 0.0;
    x = x + x[:, 0:128];
}
""")
    assert text.endswith("prog.mk:5:9: error: shape mismatch: f32[8, 256] + f32[8, 128] cannot be broadcast together\n"
                         "      x = x + x[:, 0:128];\n"
                         "          ^^^^^^^^^^^^^^^")
    text = errors(tmp_path, """fn tile(x: vmem f32[8, 256], j: i32) {
    x[:, j * 128 +: 128] = 1.0;
    x = x + nothere;
}
kernel k(a: hbm f32[8, 256]) {
    vmem x: f32[8, 256];
    tile(x, 2);
}
""")
    assert f"(in fn 'tile' inlined at {tmp_path / 'prog.mk'}:7:5)" in text and text.count("unknown name 'nothere'") == 1


def test_an_fn_local_error_is_reported_once(tmp_path):
    # (it was reported again at every call, naming the inlined local 'f#1.t')
    text = errors(tmp_path, "fn f() {\n    vmem t: f32[8, 256];\n    t = t[:, 0:128];\n}\n"
                            "kernel k(a: hbm f32[8, 128]) {\n    f();\n    f();\n}\n")
    assert text.count("error:") == 1


def test_the_back_end_reports_its_first_error_alone(tmp_path):
    text = errors(tmp_path, """
kernel k(a: hbm f32[8, 128]) {
    smem q: i32[2];
    for i in 0..3000000000 { q[0] = 1; }
    for i in 2147483000..2147483647 step 1000 { q[0] = 1; }
}
""")
    assert text.count("error:") == 1 and "the loop bound 3,000,000,000 does not fit in 32 bits" in text


# ---------------------------------------------------------------- For the back end / Back end rules

def test_the_front_end_program(tmp_path):
    from mkemu.dsl import frontend, ir
    path = tmp_path / "be.mk"
    path.write_text("""
param D = 128 in {128, 256} "width";
const NT = D / 128;
fn helper(x: vmem f32[8, D]) {
    vmem loc: f32[8, D];
    loc = x;
    x = loc + 1.0;
}
kernel k(a: hbm f32[8, D], y: hbm f32[8, D], n: i32, b: bool) {
    vmem xv: f32[8, D];
    sem s;
    start copy(a, xv, s);
    wait copy(a, xv, s);
    helper(xv);
    region "r" (n) { xv = xv * 2.0; }
    start copy(xv, y @ 0, s, s);
    wait copy(xv, y @ 0, s, s);
    wait recv copy(xv, y @ 0, s, s);
}
host {
    input a: f32[8, D];
    output y: f32[8, D];
    hbm t: f32[8, D];
    launch k(a, y, 2, true);
}
""")
    p = frontend.load_program(path, {"D": 256})
    assert p.params == {"D": 256} and p.consts == {"NT": 2}
    assert p.param_info[0].values == (128, 256) and p.param_info[0].description == "width"
    assert [(a.name, a.role) for a in p.host.arrays] == [("a", "input"), ("y", "output"), ("t", "scratch")]
    (launch,) = p.host.launches
    assert isinstance(launch.args[0], ir.Ref) and launch.args[2:] == (2, 1)
    k = p.kernels["k"]
    assert [b.name for b in k.buffers] == ["xv", "helper#1.loc"]
    assert [type(s).__name__ for s in k.body] == ["DmaStart", "DmaWait", "StoreTile", "StoreTile", "Region",
                                                  "DmaStart", "DmaWait", "DmaWait"]
    assert [s.side for s in k.body if isinstance(s, ir.DmaWait)] == ["local", "send", "recv"]
    dma = k.body[5].dma
    assert dma.sem.sem is k.sems[0] and dma.recv_sem.sem is k.sems[0] and dma.size_bytes == 8 * 256 * 4
    assert frontend.load_program(path, {}, text=path.read_text()).params == {"D": 128}


def test_back_end_limits(tmp_path):
    src = """
kernel k(a: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem x: f32[8, 128];
    sem s;
    start copy(a, x, s);
    wait copy(a, x, s);
    x = where(EXPR, x, 0.0);
    start copy(x, y, s);
    wait copy(x, y, s);
}
"""
    chain = " & ".join(f"(x > {i}.0)" for i in range(1, 9))
    nested = "".join(f"(x > {i}.0) & (" for i in range(1, 8)) + "(x > 8.0)" + ")" * 7
    a = np.linspace(0, 10, 8 * 128, dtype=np.float32).reshape(8, 128)
    np.testing.assert_array_equal(build(tmp_path, src.replace("EXPR", chain))(a=a).output("y"), np.where(a > 8, a, 0))
    assert "this expression needs more than 7 mask registers; split it with `let`" in errors(
        tmp_path, src.replace("EXPR", nested))
    text = errors(tmp_path, """
kernel k(a: hbm f32[8, 128]) {
    vmem a1: f32[1024, 1024];
    vmem a2: f32[8, 128];
}
""")
    assert re.search(r"kernel 'k' needs [\d,]+ bytes of VMEM, [\d,]+ bytes more than the 4,194,304 of profile 'test'", text)


def test_matmul_accumulates_sequentially_in_k_for_weight_views_at_a_buffers_end(tmp_path):
    # The last column block of wv[:, 236:300] reaches past the end of the buffer's last row:
    # a static start is loaded from a shifted window, a run-time one through a temporary.
    k = build(tmp_path, """
kernel k(w: hbm bf16[128, 300], x: hbm bf16[8, 128], p: hbm i32[1], y: hbm f32[8, 64], z: hbm f32[8, 64]) {
    vmem wv: bf16[128, 300];
    vmem xv: bf16[8, 128];
    vmem yv: f32[8, 64];
    vmem zv: f32[8, 64];
    smem q: i32[1];
    sem s;
    start copy(w, wv, s);
    start copy(x, xv, s);
    start copy(p, q, s);
    wait copy(w, wv, s);
    wait copy(x, xv, s);
    wait copy(p, q, s);
    yv = matmul(xv, wv[:, 236:300]);
    zv = matmul(xv, wv[:, q[0] +: 64]);
    start copy(yv, y, s);
    wait copy(yv, y, s);
    start copy(zv, z, s);
    wait copy(zv, z, s);
}
""")
    rng = np.random.default_rng(0)
    w, x = _bf16(rng.standard_normal((128, 300))), _bf16(rng.standard_normal((8, 128)))

    def sequential(a, b):
        acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
        for kk in range(a.shape[1]):          # bf16 x bf16 products are exact in f32
            acc = acc + a[:, kk:kk + 1] * b[kk:kk + 1, :]
        return acc

    for start in (236, 3):
        run = k(w=w, x=x, p=np.array([start], np.int32))
        np.testing.assert_array_equal(run.output("y"), sequential(x, w[:, 236:300]))
        np.testing.assert_array_equal(run.output("z"), sequential(x, w[:, start:start + 64]))
