"""Multi-core, multi-chip programs written as a kernel author would from docs/language.md
("DMAs and semaphores", "SPMD and remote operations") and docs/safety.md alone: remote
pushes around rings (line meshes, whose wrap-around is routed back, and tori), "inbox
free" credits, axis barriers, the two cores of a chip cooperating, counted waits. Each
correct program is compared bit for bit with numpy under every kind of DMA schedule;
each broken variant must fault with the documented kind, naming the place."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import mkemu
from mkemu.errors import EmulatorFault

ROOT = Path(__file__).parents[2]
SCHEDULES = [("normal", 0), ("late", 0), ("shuffle", 1), ("shuffle", 2)]


@pytest.fixture(scope="module")
def torus(tmp_path_factory) -> str:
    """The test profile with every mesh axis wrapped into a ring."""
    text = (ROOT / "isa" / "profiles" / "test.toml").read_text()
    assert "wrap = [false, false, false]" in text
    path = tmp_path_factory.mktemp("hw") / "test_torus.toml"
    path.write_text(text.replace("wrap = [false, false, false]", "wrap = [true, true, true]"))
    return str(path)


def _coords(chip, mesh):
    return [chip % mesh[0], (chip // mesh[0]) % mesh[1], chip // (mesh[0] * mesh[1])]


def _chip(coords, mesh):
    return coords[0] + mesh[0] * (coords[1] + mesh[1] * coords[2])


def _step(chip, mesh, axis, k):
    co = _coords(chip, mesh)
    co[axis] = (co[axis] + k) % mesh[axis]
    return _chip(co, mesh)


def _mesh_text(mesh):
    return "x".join(map(str, mesh))


def _run_all(src, mesh, inputs, hw="test", params=None):
    """Run under every schedule; every run must be clean and give the same outputs."""
    outs = []
    for schedule, seed in SCHEDULES:
        kernel = mkemu.compile_source(src, "prog.mk", hw=hw, mesh=_mesh_text(mesh), params=params or {},
                                      schedule=schedule, schedule_seed=seed)
        outs.append(kernel(inputs).outputs)
    for other in outs[1:]:
        for key in outs[0]:
            np.testing.assert_array_equal(other[key], outs[0][key])
    return outs[0]


def _fault(src, mesh, params, hw="test", schedule="normal") -> EmulatorFault:
    kernel = mkemu.compile_source(src, "prog.mk", hw=hw, mesh=_mesh_text(mesh), params=params, schedule=schedule)
    with pytest.raises(EmulatorFault) as info:
        kernel({})
    return info.value


def _names_place(fault: EmulatorFault, kind: str, line: str) -> str:
    text = fault.render()
    assert fault.kind == kind, text
    assert None not in (fault.chip, fault.core, fault.cycle, fault.pc), text
    assert re.search(r"source: prog\.mk:\d+:\d+: .*" + re.escape(line), text), text
    return text


# ------------------------------------------------------------- ring all-gather

ALL_GATHER = """
param AX = 0;
param R = 8;
param C = 256;
param P = 2;
param BUG = 0;
kernel k(x: hbm f32[2, R, C], out: hbm f32[2, P * R, C]) {
    vmem all: f32[P * R, C];
    sem s;
    sem send;
    sem recv;
    let me = chip_coord(AX);
    let n = mesh_dim(AX);
    start copy(x[core_id()], all[me * R +: R, :], s);
    wait copy(x[core_id()], all[me * R +: R, :], s);
    for st in 0..n - 1 {
        let blk = (me - st + n) % n;
        let h = copy(all[blk * R +: R, :], all[blk * R +: R, :] @ peer(AX, 1), send, recv);
        start h;
        wait h;
        if BUG == 1 { if st + 2 < n { wait recv h; } } else { wait recv h; }
    }
    start copy(all, out[core_id()], s);
    wait copy(all, out[core_id()], s);
}
host {
    input x: f32[2, R, C];
    output out: f32[2, P * R, C];
    launch k(x, out);
}
"""


@pytest.mark.parametrize("mesh, axis, wrapped, rows, cols", [
    ((3, 1, 1), 0, False, 3, 200),     # a line of 3: the wrap-around push is routed back
    ((2, 3, 1), 1, True, 1, 100),      # a ring of 3 along y
    ((2, 1, 2), 2, False, 9, 128),
    ((1, 1, 1), 0, False, 8, 256),     # no steps at all
])
def test_ring_all_gather_is_bit_exact_in_every_schedule(torus, mesh, axis, wrapped, rows, cols):
    rng = np.random.default_rng(1)
    chips = int(np.prod(mesh))
    xs = {f"x@{c}": rng.standard_normal((2, rows, cols)).astype(np.float32) for c in range(chips)}
    n = mesh[axis]
    outs = _run_all(ALL_GATHER, mesh, xs, hw=torus if wrapped else "test",
                    params=dict(AX=axis, R=rows, C=cols, P=n))
    for c in range(chips):
        co = _coords(c, mesh)
        expected = np.concatenate([xs[f"x@{_chip(co[:axis] + [i] + co[axis + 1:], mesh)}"] for i in range(n)], axis=1)
        np.testing.assert_array_equal(outs[f"out@{c}"], expected)


def test_ring_all_gather_without_the_last_recv_wait_is_a_race():
    fault = _fault(ALL_GATHER, (3, 1, 1), dict(AX=0, R=8, C=256, P=3, BUG=1))
    text = _names_place(fault, "race", "start copy(all, out[core_id()], s);")
    assert re.search(r"\[prog\.mk:\d+:\d+: start h;\]", text), text        # the push still in flight


# ---------------------------------------------- a credited double-buffered stream

STREAM = """
param AX = 0;
param R = 8;
param C = 256;
param T = 4;
param BUG = 0;
kernel k(x: hbm f32[2 * T, R, C], out: hbm f32[2, R, C]) {
    vmem src: f32[2][R, C];
    vmem inbox: f32[2][R, C];
    vmem acc: f32[R, C];
    sem ls[2];
    sem send[2];
    sem recv[2];
    sem credit;
    let c = core_id();
    acc = 0.0;
    if BUG == 1 { signal(credit @ peer(AX, -1), min(2, T) - 1); }
    else { signal(credit @ peer(AX, -1), min(2, T)); }
    start copy(x[c * T], src[0], ls[0]);
    for t in 0..T {
        if t + 1 < T {
            if t >= 1 {
                wait copy(src[(t + 1) % 2], inbox[(t + 1) % 2] @ peer(AX, 1), send[(t + 1) % 2], recv[(t + 1) % 2]);
            }
            start copy(x[c * T + t + 1], src[(t + 1) % 2], ls[(t + 1) % 2]);
        }
        wait copy(x[c * T + t], src[t % 2], ls[t % 2]);
        src[t % 2] = src[t % 2] * 2.0;
        wait(credit, 1);
        start copy(src[t % 2], inbox[t % 2] @ peer(AX, 1), send[t % 2], recv[t % 2]);
        wait recv copy(src[t % 2], inbox[t % 2] @ peer(AX, 1), send[t % 2], recv[t % 2]);
        acc = acc + inbox[t % 2];
        if t + 2 < T { signal(credit @ peer(AX, -1), 1); }
    }
    wait copy(src[(T - 1) % 2], inbox[(T - 1) % 2] @ peer(AX, 1), send[(T - 1) % 2], recv[(T - 1) % 2]);
    if T >= 2 {
        wait copy(src[T % 2], inbox[T % 2] @ peer(AX, 1), send[T % 2], recv[T % 2]);
    }
    start copy(acc, out[c], ls[0]);
    wait copy(acc, out[c], ls[0]);
}
host {
    input x: f32[2 * T, R, C];
    output out: f32[2, R, C];
    launch k(x, out);
}
"""


@pytest.mark.parametrize("mesh, axis, wrapped, rows, cols, tiles", [
    ((3, 1, 1), 0, False, 9, 100, 3),
    ((2, 2, 1), 1, True, 3, 200, 5),
    ((1, 1, 1), 0, False, 1, 128, 1),
])
def test_credited_stream_to_the_next_chip_is_bit_exact(torus, mesh, axis, wrapped, rows, cols, tiles):
    rng = np.random.default_rng(2)
    chips = int(np.prod(mesh))
    xs = {f"x@{c}": rng.standard_normal((2 * tiles, rows, cols)).astype(np.float32) for c in range(chips)}
    outs = _run_all(STREAM, mesh, xs, hw=torus if wrapped else "test",
                    params=dict(AX=axis, R=rows, C=cols, T=tiles))
    for c in range(chips):
        up = xs[f"x@{_step(c, mesh, axis, -1)}"].reshape(2, tiles, rows, cols)
        acc = np.zeros((2, rows, cols), np.float32)
        for t in range(tiles):
            acc = acc + up[:, t] * np.float32(2)
        np.testing.assert_array_equal(outs[f"out@{c}"], acc)


def test_stream_short_of_one_credit_deadlocks_at_the_credit_wait():
    fault = _fault(STREAM, (3, 1, 1), dict(AX=0, R=8, C=128, T=3, BUG=1))
    text = _names_place(fault, "deadlock", "wait(credit, 1);")
    assert "waits for semaphore 6" in text


# ------------------------------------- ring all-reduce with an axis barrier

ALL_REDUCE = """
param AX = 0;
param R = 8;
param C = 256;
param NM = 4;
kernel k(x: hbm f32[2, NM * R, C], out: hbm f32[2, NM * R, C]) {
    vmem buf: f32[NM * R, C];
    vmem inbox: f32[2][R, C];
    sem s;
    sem send;
    sem recv[2];
    sem credit;
    let c = core_id();
    let n = mesh_dim(AX);
    let me = chip_coord(AX);
    start copy(x[c], buf, s);
    wait copy(x[c], buf, s);
    signal(credit @ peer(AX, -1), min(2, n - 1));
    for st in 0..n - 1 {
        let sc = (me - st + n) % n;
        let rc = (me - st - 1 + 2 * n) % n;
        wait(credit, 1);
        let h = copy(buf[sc * R +: R, :], inbox[st % 2] @ peer(AX, 1), send, recv[st % 2]);
        start h;
        wait recv h;
        buf[rc * R +: R, :] = buf[rc * R +: R, :] + inbox[st % 2];
        wait h;
        if st + 2 < n - 1 { signal(credit @ peer(AX, -1), 1); }
    }
    barrier(AX);
    for st in 0..n - 1 {
        let sc = (me + 1 - st + 2 * n) % n;
        let h = copy(buf[sc * R +: R, :], buf[sc * R +: R, :] @ peer(AX, 1), send, recv[0]);
        start h;
        wait h;
        wait recv h;
    }
    start copy(buf, out[c], s);
    wait copy(buf, out[c], s);
}
host {
    input x: f32[2, NM * R, C];
    output out: f32[2, NM * R, C];
    launch k(x, out);
}
"""


def _model_all_reduce(xs, mesh, axis, rows):
    n, out, lines = mesh[axis], {}, {}
    for c in range(int(np.prod(mesh))):
        co = _coords(c, mesh)
        lines.setdefault(tuple(co[:axis] + co[axis + 1:]), [None] * n)[co[axis]] = c
    for line in lines.values():
        bufs = [xs[f"x@{c}"].copy() for c in line]
        blk = lambda b: slice(b * rows, (b + 1) * rows)        # noqa: E731
        for st in range(n - 1):
            sent = [bufs[me][:, blk((me - st) % n)].copy() for me in range(n)]
            for me in range(n):
                rc = (me - st - 1) % n
                bufs[me][:, blk(rc)] = bufs[me][:, blk(rc)] + sent[(me - 1) % n]
        final = [bufs[me][:, blk((me + 1) % n)].copy() for me in range(n)]
        for me in range(n):
            for other in range(n):
                bufs[other][:, blk((me + 1) % n)] = final[me]
        out.update({c: bufs[me] for me, c in enumerate(line)})
    return out


@pytest.mark.parametrize("mesh, axis, wrapped, rows, cols", [
    ((4, 1, 1), 0, False, 3, 128),
    ((2, 3, 1), 1, True, 1, 200),
    ((2, 2, 2), 2, False, 8, 100),
])
def test_ring_all_reduce_is_bit_exact_in_every_schedule(torus, mesh, axis, wrapped, rows, cols):
    rng = np.random.default_rng(3)
    chips = int(np.prod(mesh))
    xs = {f"x@{c}": rng.standard_normal((2, 4 * rows, cols)).astype(np.float32) for c in range(chips)}
    outs = _run_all(ALL_REDUCE, mesh, xs, hw=torus if wrapped else "test",
                    params=dict(AX=axis, R=rows, C=cols, NM=4))
    expected = _model_all_reduce(xs, mesh, axis, rows)
    for c in range(chips):
        np.testing.assert_array_equal(outs[f"out@{c}"], expected[c])


# ------------------------------- both cores of a chip, then a gather to chip 0

COOPERATE = """
param R = 8;
param C = 256;
param NCH = 4;
param BUG = 0;
const H = C / 2;
kernel k(x: hbm f32[R, C], tmp: hbm f32[2, R, H], out: hbm f32[R, C]) {
    vmem mine: f32[R, H];
    vmem other: f32[R, H];
    vmem full: f32[R, C];
    vmem gath: f32[NCH][R, C];
    sem s;
    sem send;
    sem recv;
    sem gs;
    sem gr;
    let c = core_id();
    start copy(x[:, c * H +: H], mine, s);
    wait copy(x[:, c * H +: H], mine, s);
    mine = mine * mine + 1.0;
    let h = copy(mine, other @ global_core(chip_id(), 1 - c), send, recv);
    start h;
    wait recv h;
    full[:, c * H +: H] = mine;
    full[:, (1 - c) * H +: H] = other;
    wait h;
    start copy(mine, tmp[c], s);
    wait copy(mine, tmp[c], s);
    if BUG == 0 { barrier(); }
    if c == 0 {
        start copy(tmp[1], other, s);
        wait copy(tmp[1], other, s);
        full[:, H +: H] = full[:, H +: H] + other;
        if chip_id() != 0 {
            let g = copy(full, gath[chip_id()] @ global_core(0, 0), gs, gr);
            start g;
            wait g;
        } else {
            gath[0] = full;
            wait recv (num_chips() - 1) * copy(full, gath[0] @ global_core(0, 0), gs, gr);
            var acc: f32[R, C] = 0.0;
            for i in 0..num_chips() { acc = acc + gath[i]; }
            full = acc;
            start copy(full, out, s);
            wait copy(full, out, s);
        }
    }
    if BUG == 1 { barrier(0); }
}
host {
    input x: f32[R, C];
    hbm tmp: f32[2, R, H];
    output out: f32[R, C];
    launch k(x, out);
}
""".replace("launch k(x, out);", "launch k(x, tmp, out);")


@pytest.mark.parametrize("mesh, rows, cols", [((2, 1, 2), 3, 256), ((3, 1, 1), 9, 200), ((1, 1, 1), 8, 128)])
def test_two_cores_exchange_halves_and_chips_gather_to_chip_0(mesh, rows, cols):
    rng = np.random.default_rng(4)
    chips = int(np.prod(mesh))
    xs = {f"x@{c}": rng.standard_normal((rows, cols)).astype(np.float32) for c in range(chips)}
    outs = _run_all(COOPERATE, mesh, xs, params=dict(R=rows, C=cols, NCH=chips))
    acc = np.zeros((rows, cols), np.float32)
    half = cols // 2
    for c in range(chips):
        v = xs[f"x@{c}"] * xs[f"x@{c}"] + np.float32(1)
        v[:, half:] = v[:, half:] + v[:, half:]
        acc = acc + v
    np.testing.assert_array_equal(outs["out@0"], acc)


def test_reading_the_siblings_hbm_store_without_the_barrier_is_a_race():
    # BUG 1 moves the barrier after the read (and onto axis 0): core 0 reads tmp[1],
    # which core 1's DMA is still writing as far as core 0 knows.
    fault = _fault(COOPERATE, (2, 1, 1), dict(R=8, C=256, NCH=2, BUG=1))
    text = _names_place(fault, "race", "start copy(tmp[1], other, s);")
    assert "start copy(mine, tmp[c], s);" in text


# --------------------------------------------------------------- negative waits

NEGATIVE_WAIT = """
kernel k(x: hbm f32[8, 128], out: hbm f32[8, 128]) {
    vmem v: f32[8, 128];
    vmem box: f32[8, 128];
    sem s;
    sem send;
    sem recv;
    start copy(x, v, s);
    wait copy(x, v, s);
    start copy(v, box @ peer(0, 1), send, recv);
    wait copy(v, box @ peer(0, 1), send, recv);
    wait recv (num_chips() - 2) * copy(v, box @ 0, send, recv);
    start copy(v, out, s);
    wait copy(v, out, s);
}
"""


def test_a_counted_wait_that_comes_out_negative_faults_at_the_wait():
    # On one chip the count is -1: the wait used to *raise* the semaphore by 4096 and
    # the run ended in a semaphore-nonzero report naming no instruction or line.
    fault = _fault(NEGATIVE_WAIT, (1, 1, 1), {})
    text = _names_place(fault, "bad-operand", "wait recv (num_chips() - 2) * copy(v, box @ 0, send, recv);")
    assert "negative amount (-4096)" in text


def test_a_counted_wait_of_zero_is_fine():
    src = NEGATIVE_WAIT.replace("num_chips() - 2", "num_chips() - 1").replace(
        "start copy(v, box @ peer(0, 1), send, recv);\n    wait copy(v, box @ peer(0, 1), send, recv);\n", "")
    src = src.replace("wait recv (num_chips() - 1) * copy(v, box @ 0, send, recv);",
                      "wait (num_chips() - 1) * copy(x, v, s);")
    kernel = mkemu.compile_source(src, "prog.mk", hw="test", mesh="1x1x1")
    x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
    np.testing.assert_array_equal(kernel(x=x).output("out", 0), x)


NEGATIVE_SIGNAL = """\
kernel k(x: hbm f32[8, 128], n: i32) {
    sem flag;
    signal(flag @ peer(0, 1), n - 2);
    wait(flag, 0);
}
"""


@pytest.mark.parametrize("target", ["flag @ peer(0, 1)", "flag"])
def test_a_signal_of_a_negative_run_time_amount_faults_at_the_signal(target):
    # It lowered the semaphore (a signal adds; semaphores count up), remote or local.
    src = NEGATIVE_SIGNAL.replace("flag @ peer(0, 1)", target)
    kernel = mkemu.compile_source(src + "host { input x: f32[8, 128]; launch k(x, 1); }", "prog.mk", hw="test",
                                  mesh="2x1x1")
    with pytest.raises(EmulatorFault) as info:
        kernel()
    assert info.value.kind == "bad-operand" and "signal of a negative amount (-1)" in info.value.message
    assert info.value.source.endswith(f"signal({target}, n - 2);")


PEER_OFFSETS = """
kernel k(out: hbm i32[2, 128], a: i32, b: i32) {
    vmem v: i32[1, 128];
    sem s;
    v = -9;
    v[0:1, 0:1] = peer(0, a);
    v[0:1, 1:2] = peer(0, b);
    v[0:1, 2:3] = peer(0, -2147483648);
    v[0:1, 3:4] = peer(0, 2147483647);
    v[0:1, 4:5] = peer(0, a + chip_id());
    v[0:1, 5:6] = peer(1, b);
    start copy(v, out[core_id() : core_id() + 1, :], s);
    wait copy(v, out[core_id() : core_id() + 1, :], s);
}
host { output out: i32[2, 128]; launch k(out, -2147483648, 2147483647); }
"""


def test_peer_takes_any_offset_around_the_axis_even_near_the_int32_limits():
    """peer(axis, offset) wraps around the axis for any scalar offset: the chip plus an
    offset near 2^31 wrapped in 32 bits, and chips 1 and 2 of three named themselves."""
    run = mkemu.compile_source(PEER_OFFSETS, filename="peer.mk", hw="test", mesh="3x1x1")()
    cores = run.kernel.cores_per_chip
    for chip in range(3):
        def core_of(offset: int) -> int:
            return (chip + offset) % 3 * cores
        expected = [core_of(-2**31), core_of(2**31 - 1), core_of(-2**31), core_of(2**31 - 1),
                    core_of(-2**31 + chip), chip * cores]
        got = run.output("out", chip)
        for core in range(cores):
            assert got[core, :6].tolist() == [e + core for e in expected], (chip, core)
