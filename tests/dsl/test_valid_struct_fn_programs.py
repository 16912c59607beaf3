"""Valid struct, fn, generic, param and declaration programs, as docs/language.md
describes them ("Structs", "Functions", "Generics", "Tunable params", "Top level",
"Declarations", "Types", tutorial 3), compiled and run through the public API and
compared bit for bit with numpy; and the errors those sections name."""

from __future__ import annotations

import contextlib
import io
import os
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

import mkemu
from mkemu.cli import main
from mkemu.dsl.frontend import load_program
from mkemu.errors import ConfigError, SourceError
from mkemu.isa import numerics as nx

RNG = np.random.default_rng(11)


def write(folder: Path, files: dict[str, str] | None) -> None:
    for name, text in (files or {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(textwrap.dedent(text))


def build(src: str, tmp_path: Path, files=None, mesh: str = "1", **options):
    write(tmp_path, files)
    return mkemu.compile_source(textwrap.dedent(src), str(tmp_path / "prog.mk"), hw="test",
                                mesh=mesh, **options)


def error(src: str, tmp_path: Path, files=None, **options) -> str:
    with pytest.raises(SourceError) as info:
        build(src, tmp_path, files, **options)
    return str(info.value)


def same(expected, got) -> None:
    expected, got = np.asarray(expected), np.asarray(got)
    assert expected.shape == got.shape, (expected.shape, got.shape)
    if expected.dtype.kind == "f":
        np.testing.assert_array_equal(expected.astype(np.float32).view(np.uint32),
                                      got.astype(np.float32).view(np.uint32))
    else:
        np.testing.assert_array_equal(expected, got)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def bf16(*shape):
    return nx.bf16_round(f32(*shape))


def i32(*shape, lo=-1000, hi=1000):
    return RNG.integers(lo, hi, shape).astype(np.int32)


def mm(a, w):
    return nx.mxu_matmul_numpy(np.zeros((a.shape[0], w.shape[1]), np.float32), a, w)


def row_sum(x):
    """sum(x, axis=1) as a kernel computes it: the row padded with +0 to a power of two >= 128."""
    n = max(128, 1 << (x.shape[1] - 1).bit_length())
    padded = np.zeros((x.shape[0], n), np.float32)
    padded[:, :x.shape[1]] = x
    return nx.tree_sum_f32(padded, 1).reshape(-1, 1)


# ---------------------------------------------------------------------------------------
# Tutorial 3: functions and imports


NN = """\
param D = 512;

fn rmsnorm(x: vmem f32[8, D], w: vmem bf16[1, D], out: vmem f32[8, D]) {
    let ss = sum(x * x, axis=1);                 // [8, 1]
    out = x * rsqrt(ss / D + 1e-5) * f32(w);     // [8, D] * [8, 1] * [1, D]
}
"""

RMSNORM = """\
import "lib/nn.mk";

kernel norm(x: hbm f32[8, D], w: hbm bf16[1, D], y: hbm f32[8, D]) {
    vmem xv: f32[8, D];
    vmem wv: bf16[1, D];
    vmem yv: f32[8, D];
    sem s;
    start copy(x, xv, s);
    start copy(w, wv, s);
    wait copy(x, xv, s);
    wait copy(w, wv, s);
    rmsnorm(xv, wv, yv);
    start copy(yv, y, s);
    wait copy(yv, y, s);
}
"""


def rmsnorm(x, w):
    ss = row_sum(x * x)
    return x * nx.rsqrt(ss / np.float32(x.shape[1]) + np.float32(1e-5)) * w


@pytest.mark.parametrize("d", [None, 256, 384])
def test_tutorial_rmsnorm_from_an_imported_library(tmp_path, d):
    params = {} if d is None else {"D": d}
    kernel = build(RMSNORM, tmp_path, {"lib/nn.mk": NN}, params=params)
    d = d or 512
    x, w = f32(8, d), bf16(1, d)
    same(rmsnorm(x, w), kernel(x=x, w=w).output("y"))


def test_tutorial_library_fn_called_twice_with_fresh_arguments(tmp_path):
    # A fn is inlined at each call; buffers are passed by reference, so the second call
    # reads what the first wrote.
    src = RMSNORM.replace("    rmsnorm(xv, wv, yv);\n", "    rmsnorm(xv, wv, yv);\n    rmsnorm(yv, wv, xv);\n"
                          ).replace("copy(yv, y, s)", "copy(xv, y, s)")
    kernel = build(src, tmp_path, {"lib/nn.mk": NN}, params={"D": 128})
    x, w = f32(8, 128), bf16(1, 128)
    same(rmsnorm(rmsnorm(x, w), w), kernel(x=x, w=w).output("y"))


# ---------------------------------------------------------------------------------------
# Structs

MLP = """\
param D = 128;
struct Mlp {                        // members are typed like parameters
    w1: hbm bf16[D, D];
    w2: hbm bf16[D, D];
}
struct Slots {                      // a kernel's VMEM working set
    wv: vmem bf16[2][D, D];
    xv: vmem f32[8, D];
    ws: sem[2];
}
fn mlp(m: Mlp, b: Slots) {          // an fn takes any instance
    start copy(m.w1, b.wv[0], b.ws[0]);
    start copy(m.w2, b.wv[1], b.ws[1]);
    wait copy(m.w1, b.wv[0], b.ws[0]);
    b.xv = max(matmul(bf16(b.xv), b.wv[0]), 0.0);
    wait copy(m.w2, b.wv[1], b.ws[1]);
    b.xv = matmul(bf16(b.xv), b.wv[1]);
}
kernel run(m: Mlp, x: hbm f32[8, D], y: hbm f32[8, D]) {
    let b = Slots();                // fresh buffers and semaphores: b.wv, b.xv, b.ws
    sem s;
    start copy(x, b.xv, s);
    wait copy(x, b.xv, s);
    mlp(m, b);
    start copy(b.xv, y, s);
    wait copy(b.xv, y, s);
}
host {
    input m: Mlp;                   // host arrays w1 and w2
    input x: f32[8, D];
    output y: f32[8, D];
    launch run(m, x, y);
}
"""


def mlp(x, w1, w2):
    h = nx.f32_max(mm(nx.bf16_round(x), w1), np.float32(0.0))
    return mm(nx.bf16_round(h), w2)


@pytest.mark.parametrize("d", [128, 256])
def test_struct_example_host_arrays_take_the_member_names(tmp_path, d):
    kernel = build(MLP, tmp_path, params={"D": d})
    assert {n: (b.dtype, b.shape, b.kind) for n, b in kernel.buffers.items()} == {
        "w1": ("bf16", (d, d), "input"), "w2": ("bf16", (d, d), "input"),
        "x": ("f32", (8, d), "input"), "y": ("f32", (8, d), "output")}
    x, w1, w2 = f32(8, d), bf16(d, d) / 8, bf16(d, d) / 8
    run = kernel(x=x, w1=w1, w2=w2)
    same(mlp(x, w1, w2), run.output("y"))
    assert sorted(run.outputs) == ["y@0"]


def test_struct_kernel_parameter_is_one_hbm_parameter_per_member_in_order(tmp_path):
    (tmp_path / "mlp.mk").write_text(MLP)
    program = load_program(str(tmp_path / "mlp.mk"))
    assert [p.name for p in program.kernels["run"].params] == ["m.w1", "m.w2", "x", "y"]
    # ... and the compiled kernel takes four arguments, in that order
    kernel = build(MLP, tmp_path)
    assert kernel.program.kernels["run"].allocation[0] == "SMEM 0x000000 arguments x 4 (32 bytes)"


def test_struct_members_are_used_like_the_buffers_they_are(tmp_path):
    # Slices of an HBM member, a slot of a VMEM member, one semaphore of a sem[N]
    # member, an SMEM member's element, a store into a member.
    src = """
    param R = 8;
    const C = R * 16;
    struct IO { x: hbm f32[2, R, C]; y: hbm f32[R, C]; }
    struct Buf { v: vmem f32[2][R, C]; t: smem i32[4]; s: sem; ss: sem[2]; }
    kernel k(io: IO) {
        let b = Buf();
        start copy(io.x[0], b.v[0], b.ss[0]);
        start copy(io.x[1, 0:4, :], b.v[1][4:8, :], b.ss[1]);
        wait copy(io.x[0], b.v[0], b.ss[0]);
        wait copy(io.x[1, 0:4, :], b.v[1][4:8, :], b.ss[1]);
        b.t[2] = 7;
        b.v[1][0:4, :] = f32(b.t[2]);
        b.v[0] = b.v[0] * b.v[1];
        start copy(b.v[0], io.y, b.s);
        wait copy(b.v[0], io.y, b.s);
    }
    host { input io: IO; launch k(io); }
    """
    kernel = build(src, tmp_path)
    assert kernel.buffers["y"].kind == "input" and kernel.buffers["x"].shape == (2, 8, 128)
    x = f32(2, 8, 128)
    other = np.concatenate([np.full((4, 128), 7, np.float32), x[1, 0:4]])
    same(x[0] * other, kernel(x=x).output("y"))


def test_fn_takes_instances_from_a_kernel_parameter_and_from_let(tmp_path):
    src = """
    struct IO { x: hbm f32[8, 128]; y: hbm f32[8, 128]; }
    struct Buf { v: vmem f32[8, 128]; s: sem[2]; }
    fn load(io: IO, b: Buf) {
        start copy(io.x, b.v, b.s[1]);
        wait copy(io.x, b.v, b.s[1]);
    }
    fn store(io: IO, b: Buf) {
        start copy(b.v, io.y, b.s[0]);
        wait copy(b.v, io.y, b.s[0]);
    }
    fn twice(b: Buf, c: Buf) { c.v = b.v + b.v; }
    kernel k(io: IO) {
        let b = Buf();
        let c = Buf();
        load(io, b);
        twice(b, c);
        twice(c, b);
        store(io, b);
    }
    host { input io: IO; launch k(io); }
    """
    x = f32(8, 128)
    same(x * 4, build(src, tmp_path)(x=x).output("y"))


def test_struct_of_semaphores_only_and_of_smem_only(tmp_path):
    src = """
    struct Sems { a: sem; b: sem[3]; }
    struct Tab { t: smem i32[2, 8]; }
    fn fill(t: Tab, v: i32) {
        for i in 0..8 { t.t[1, i] = v * i; t.t[0, i] = i; }
    }
    kernel k(y: hbm i32[2, 8]) {
        let s = Sems();
        let t = Tab();
        fill(t, 3);
        start copy(t.t, y, s.b[2]);
        wait copy(t.t, y, s.b[2]);
    }
    """
    expected = np.stack([np.arange(8), 3 * np.arange(8)]).astype(np.int32)
    same(expected, build(src, tmp_path)().output("y"))


def test_let_instance_in_an_fn_is_fresh_for_every_call(tmp_path):
    # `let b = S();` in an fn body: fresh buffers for every call (the first call's data
    # is not seen by the second, which starts from what it copies itself).
    src = """
    struct Buf { v: vmem f32[8, 128]; s: sem; }
    fn add_into(x: hbm f32[8, 128], acc: vmem f32[8, 128]) {
        let b = Buf();
        start copy(x, b.v, b.s);
        wait copy(x, b.v, b.s);
        acc = acc + b.v;
    }
    kernel k(x: hbm f32[2, 8, 128], y: hbm f32[8, 128]) {
        vmem acc: f32[8, 128];
        sem s;
        acc = 0.0;
        add_into(x[0], acc);
        add_into(x[1], acc);
        start copy(acc, y, s);
        wait copy(acc, y, s);
    }
    """
    kernel = build(src, tmp_path)
    x = f32(2, 8, 128)
    same((np.float32(0) + x[0]) + x[1], kernel(x=x).output("y"))
    vmem = [a for a in kernel.program.kernels["k"].allocation if "b.v f32[8,128]" in a]
    assert len(vmem) == 2, kernel.program.kernels["k"].allocation


def test_host_scratch_instance_passes_data_between_launches(tmp_path):
    src = """
    struct Pair { lo: hbm f32[8, 128]; hi: hbm f32[8, 128]; }
    kernel split(x: hbm f32[8, 256], p: Pair) {
        vmem v: f32[8, 256];
        sem s;
        start copy(x, v, s);
        wait copy(x, v, s);
        start copy(v[:, 0:128], p.lo, s);
        start copy(v[:, 128:256], p.hi, s);
        wait copy(v[:, 0:128], p.lo, s);
        wait copy(v[:, 128:256], p.hi, s);
    }
    kernel join(p: Pair, y: hbm f32[8, 128]) {
        vmem a: f32[8, 128];
        vmem b: f32[8, 128];
        sem s;
        start copy(p.lo, a, s);
        start copy(p.hi, b, s);
        wait copy(p.lo, a, s);
        wait copy(p.hi, b, s);
        a = a - b;
        start copy(a, y, s);
        wait copy(a, y, s);
    }
    host {
        input x: f32[8, 256];
        hbm t: Pair;                    // scratch: host arrays lo and hi
        output y: f32[8, 128];
        launch split(x, t);
        launch join(t, y);
    }
    """
    kernel = build(src, tmp_path)
    assert kernel.buffers["lo"].kind == "hbm" or kernel.buffers["lo"].kind != "input"
    x = f32(8, 256)
    run = kernel(x=x)
    same(x[:, :128] - x[:, 128:], run.output("y"))
    same(x[:, 128:], run.output("hi"))


def test_output_struct_instance(tmp_path):
    src = """
    struct Out { y1: hbm f32[8, 128]; y2: hbm i32[8, 128]; }
    kernel k(x: hbm f32[8, 128], o: Out) {
        vmem v: f32[8, 128];
        vmem n: i32[8, 128];
        sem s;
        start copy(x, v, s);
        wait copy(x, v, s);
        n = i32(v * 100.0);
        v = v + 1.0;
        start copy(v, o.y1, s);
        start copy(n, o.y2, s);
        wait copy(v, o.y1, s);
        wait copy(n, o.y2, s);
    }
    host { input x: f32[8, 128]; output o: Out; launch k(x, o); }
    """
    kernel = build(src, tmp_path)
    assert kernel.buffers["y1"].kind == "output" and kernel.buffers["y2"].dtype == "i32"
    x = f32(8, 128)
    run = kernel(x=x)
    assert sorted(run.outputs) == ["y1@0", "y2@0"]
    same(x + np.float32(1), run.outputs["y1@0"])
    same(nx.f32_to_i32(x * np.float32(100)), run.outputs["y2@0"])


def test_struct_from_an_imported_library(tmp_path):
    lib = """\
    param D = 128;
    struct Io { x: hbm f32[8, D]; y: hbm f32[8, D]; }
    struct Work { v: vmem f32[8, D]; s: sem; }
    fn scale_io(io: Io, w: Work, f: i32) {
        start copy(io.x, w.v, w.s);
        wait copy(io.x, w.v, w.s);
        w.v = w.v * f32(f);
        start copy(w.v, io.y, w.s);
        wait copy(w.v, io.y, w.s);
    }
    """
    src = """
    import "lib/io.mk";
    kernel k(io: Io) { let w = Work(); scale_io(io, w, 3); }
    host { input io: Io; launch k(io); }
    """
    kernel = build(src, tmp_path, {"lib/io.mk": lib}, params={"D": 256})
    x = f32(8, 256)
    same(x * np.float32(3), kernel(x=x).output("y"))


def test_vmem_bytes_sizes_a_buffer_and_an_assert(tmp_path):
    src = """
    struct S { a: vmem f32[8, 128]; b: vmem bf16[2][16, 128]; t: smem i32[8]; s: sem[2]; }
    const B = vmem_bytes(S);
    assert B >= 8 * 128 * 4 + 2 * 16 * 128 * 2, "S does not fit";
    kernel k(y: hbm i32[1, 8]) {
        smem t: i32[8];
        sem s;
        t[0] = B;
        t[1] = vmem_bytes(S) / 4;
        start copy(t, y[0], s);
        wait copy(t, y[0], s);
    }
    """
    kernel = build(src, tmp_path)
    b = kernel.program.consts["B"] if hasattr(kernel.program, "consts") else None
    out = kernel().output("y")
    assert out[0, 0] >= 8 * 128 * 4 + 2 * 16 * 128 * 2 and out[0, 1] == out[0, 0] // 4
    if b is not None:
        assert out[0, 0] == b


def test_vmem_bytes_follows_the_back_end_layout(tmp_path):
    # Rows padded to 128 lanes, rows rounded up to 8 when R > 1, each slot rounded up to
    # 512 bytes; SMEM members and semaphores not counted.
    src = """
    struct S {
        a: vmem f32[8, 100];      // 8 x 128 x 4 = 4096
        b: vmem bf16[2][3, 100];  // 2 x (8 x 128 x 2) = 4096
        c: vmem i32[1, 300];      // 1 x 384 x 4 = 1536
        d: vmem f32[100];         // [1, 100]: 512
        t: smem i32[64];
        s: sem[4];
    }
    struct T { s: sem; t: smem i32[8]; }
    kernel k(y: hbm i32[1, 8]) {
        smem t: i32[8];
        sem s;
        t[0] = vmem_bytes(S);
        t[1] = vmem_bytes(T);
        start copy(t, y[0], s);
        wait copy(t, y[0], s);
    }
    """
    out = build(src, tmp_path)().output("y")
    assert list(out[0, :2]) == [4096 + 4096 + 1536 + 512, 0]


def test_struct_with_absent_members_and_a_dtype_const(tmp_path):
    # A member whose slot or semaphore count is 0 is absent: not allocated, not counted by
    # vmem_bytes, and only code a compile-time `if` leaves out may name it.
    src = """
    param TWO = 0 in {0, 2} "extra slots";
    const WT = select(TWO == 2, bf16, f32);
    struct S { D: vmem f32[8, 128]; w: vmem WT[8, 128]; x: vmem f32[TWO][8, 128]; xs: sem[TWO]; s: sem; }
    kernel k(y: hbm f32[8, 128], z: hbm i32[1, 8]) {
        let b = S();
        smem t: i32[8];
        b.D = 2.0;
        if TWO == 2 {
            b.x[1] = b.D * 3.0;
            b.D = b.x[1];
            b.w = bf16(b.D);
        } else {
            b.w = b.D + 1.0;
            b.D = b.w;
        }
        start copy(b.D, y, b.s);
        wait copy(b.D, y, b.s);
        t[0] = vmem_bytes(S);
        start copy(t, z[0], b.s);
        wait copy(t, z[0], b.s);
    }
    """
    run0 = build(src, tmp_path)()
    same(np.full((8, 128), 3, np.float32), run0.output("y"))
    assert run0.output("z")[0, 0] == 4096 + 4096
    run2 = build(src, tmp_path, params={"TWO": 2})()
    same(np.full((8, 128), 6, np.float32), run2.output("y"))
    assert run2.output("z")[0, 0] == 4096 + 2048 + 2 * 4096
    msg = error(src.replace("if TWO == 2 {", "if TWO + 0 == 2 || true {").replace(
        "b.x[1] = b.D * 3.0;", "b.x[1] = b.D * 3.0; b.x[0] = 1.0;"), tmp_path)
    assert "member 'x' of struct 'S' has a count of 0 here: it is absent" in msg


def test_let_instance_in_a_loop_body_is_one_set_of_buffers(tmp_path):
    src = """
    struct S { v: vmem f32[8, 128]; s: sem; }
    kernel k(y: hbm f32[3, 8, 128]) {
        for i in 0..3 {
            let b = S();
            b.v = f32(i);
            start copy(b.v, y[i], b.s);
            wait copy(b.v, y[i], b.s);
        }
    }
    """
    kernel = build(src, tmp_path)
    same(np.broadcast_to(np.arange(3, dtype=np.float32)[:, None, None], (3, 8, 128)), kernel().output("y"))
    assert len([a for a in kernel.program.kernels["k"].allocation if "b.v" in a]) == 1


def test_struct_member_slots_passed_to_a_plain_fn_with_a_dynamic_slot(tmp_path):
    src = """
    struct S { w: vmem f32[2][8, 128]; s: sem[2]; }
    fn put(v: vmem f32[8, 128], x: i32) { v = f32(x * x); }
    kernel k(y: hbm f32[4, 8, 128]) {
        let b = S();
        for i in 0..4 {
            put(b.w[i % 2], i);
            start copy(b.w[i % 2], y[i], b.s[i % 2]);
            wait copy(b.w[i % 2], y[i], b.s[i % 2]);
        }
    }
    """
    expected = np.broadcast_to((np.arange(4) ** 2).astype(np.float32)[:, None, None], (4, 8, 128))
    same(expected, build(src, tmp_path)().output("y"))


def test_fns_calling_fns_with_a_struct_three_levels_deep(tmp_path):
    src = """
    struct S { v: vmem f32[8, 128]; s: sem; }
    fn a(x: S) { x.v = x.v * 2.0; }
    fn b(x: S) { a(x); x.v = x.v + 1.0; a(x); }
    fn c(x: S, y: hbm f32[8, 128]) { b(x); start copy(x.v, y, x.s); wait copy(x.v, y, x.s); }
    kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
        let z = S();
        start copy(x, z.v, z.s);
        wait copy(x, z.v, z.s);
        c(z, y);
    }
    """
    x = f32(8, 128)
    same((x * np.float32(2) + np.float32(1)) * np.float32(2), build(src, tmp_path)(x=x).output("y"))


@pytest.mark.parametrize("src, message", [
    ("struct A { v: vmem f32[8, 128]; }\nstruct B { a: A; s: sem; }\nkernel k() { }\n",
     "prog.mk:2:15: error: struct members are buffers or semaphores; 'a' is an instance of struct 'A' "
     "(structs do not nest)"),
    ("struct A { v: vmem f32[8, 0]; }\nkernel k() { }\n",           # checked though unused
     "prog.mk:1:27: error: dimensions must be positive, got 0"),
    ("struct A { v: vmem f32[8, Q]; }\nkernel k() { }\n",
     "prog.mk:1:27: error: unknown name 'Q'"),
    ("struct S { v: vmem f32[8, 128]; v: sem; }\nkernel k() { }\n",
     "prog.mk:1:33: error: struct 'S' has two members named 'v'"),
    ("struct W { a: hbm f32[8, 128]; }\nkernel k() { let b = W(); }\n",
     "prog.mk:2:22: error: member 'a' of struct 'W' is in hbm: kernels cannot allocate HBM"),
    ("struct W { a: hbm f32[8, 128]; }\nfn f() { let b = W(); }\nkernel k() { f(); }\n",
     "prog.mk:2:18: error: member 'a' of struct 'W' is in hbm: kernels cannot allocate HBM"),
    ("struct V { v: vmem f32[8, 128]; }\nkernel k(v: V) { }\n",
     "prog.mk:2:13: error: member 'v' of struct 'V' is in vmem: kernel parameters are HBM arrays"),
    ("struct S { a: hbm f32[8, 128]; t: sem; }\nkernel k(s: S) { }\n",
     "prog.mk:2:13: error: member 't' of struct 'S' is a semaphore: kernel parameters are HBM arrays"),
    ("struct V { v: vmem f32[8, 128]; }\nkernel k() { }\nhost { hbm v: V; launch k(); }\n",
     "prog.mk:3:8: error: member 'v' of struct 'V' is in vmem: host arrays are HBM"),
    ("struct S { a: hbm f32[8, 128]; t: smem i32[4]; }\nkernel k() { }\nhost { input s: S; launch k(); }\n",
     "prog.mk:3:8: error: member 't' of struct 'S' is in smem: host arrays are HBM"),
    ("struct IO { x: hbm f32[8, 128]; }\nkernel k(a: IO, b: IO) { }\n"
     "host { input a: IO; output b: IO; launch k(a, b); }\n",
     "prog.mk:3:21: error: host array 'x' (a member of struct 'IO') is already declared at "),
    ("struct IO { x: hbm f32[8, 128]; }\nkernel k(a: IO) { }\n"
     "host { input x: f32[8, 128]; output b: IO; launch k(b); }\n",
     "prog.mk:3:30: error: host array 'x' (a member of struct 'IO') is already declared at "),
    ("struct V { v: vmem f32[8, 128]; s: sem; }\nkernel k() { let b = V(); b.w = 0.0; }\n",
     "prog.mk:2:29: error: struct 'V' has no member 'w' (its members: v, s)"),
    ("struct V { v: vmem f32[8, 128]; }\nstruct U { v: vmem f32[8, 128]; }\n"
     "fn f(a: V) { a.v = 0.0; }\nkernel k() { let b = U(); f(b); }\n",
     "prog.mk:4:29: error: parameter 'a' of fn 'f' is an instance of struct 'V', got an instance of struct 'U'"),
    ("struct V { v: vmem f32[8, 128]; }\nfn f(a: V) { a.v = 0.0; }\nkernel k() { vmem u: f32[8, 128]; f(u); }\n",
     "prog.mk:3:37: error: parameter 'a' of fn 'f' is an instance of struct 'V', got "),
    ("struct W { a: hbm f32[8, 128]; }\nkernel k(w: W) { }\n"
     "host { input x: f32[8, 128]; launch k(x); }\n",
     "prog.mk:3:39: error: argument 'w' must be a host instance of struct 'W', got "),
    ("const A = vmem_bytes(3);\nkernel k() { }\n",
     "prog.mk:1:11: error: vmem_bytes() takes the name of a struct: vmem_bytes(S)"),
    ("const N = 4;\nconst A = vmem_bytes(N);\nkernel k() { }\n",
     "prog.mk:2:22: error: vmem_bytes(): 'N' is not a struct"),
])
def test_struct_errors(tmp_path, src, message):
    msg = error(src, tmp_path)
    assert msg.startswith(str(tmp_path / message.split(": error")[0]) + ": error" + message.split(": error", 1)[1]), msg
    assert "Traceback" not in msg


# ---------------------------------------------------------------------------------------
# Functions


def test_fn_doc_example_constant_scalar_sizes_a_parameter(tmp_path):
    src = """
    const W = 256;
    fn scale(x: vmem f32[8, n], n: i32, factor: i32) { x = x * f32(factor); }
    kernel k(a: hbm f32[8, 512], b: hbm f32[8, 512]) {
        vmem xv: f32[8, 512];
        vmem half: f32[8, W];
        sem s;
        start copy(a, xv, s);
        wait copy(a, xv, s);
        scale(xv, 512, 2);
        let n = W / 2;
        scale(xv[:, 0:n], n, 3);              // a let-bound compile-time int
        scale(xv[:, W:W + W], W * 2 - W, -1);  // a compile-time expression
        half = xv[:, 0:W];
        scale(half, W, 5);
        xv[:, 0:W] = half;
        start copy(xv, b, s);
        wait copy(xv, b, s);
    }
    """
    a = f32(8, 512)
    e = a * np.float32(2)
    e[:, :128] *= np.float32(3)
    e[:, 256:] *= np.float32(-1)
    e[:, :256] *= np.float32(5)
    same(e, build(src, tmp_path)(a=a).output("b"))


def test_fn_runtime_scalar_argument_is_evaluated_once_at_the_call(tmp_path):
    # `n` is t[0] as it was at the call, though the body overwrites t[0] first.
    src = """
    fn f(t: smem i32[4], n: i32) { t[0] = 100; t[1] = n; t[2] = n + t[0]; }
    kernel k(y: hbm i32[4], m: i32) {
        smem t: i32[4];
        sem s;
        t[0] = m * 5;
        t[3] = 9;
        f(t, t[0]);
        start copy(t, y, s);
        wait copy(t, y, s);
    }
    host { output y: i32[4]; launch k(y, 7); }
    """
    same(np.array([100, 35, 135, 9], np.int32), build(src, tmp_path)().output("y"))


def test_fn_vmem_parameter_accepts_a_var_and_a_let_view(tmp_path):
    src = """
    fn dbl(x: vmem f32[8, 128]) { x = x + x; }
    fn put(row: vmem f32[1, 128], s: sem, y: hbm f32[1, 128]) {
        vmem t: f32[1, 128];               // fresh for every call
        t = row * 2.0;
        start copy(t, y, s);
        wait copy(t, y, s);
    }
    kernel k(a: hbm f32[8, 128], b: hbm f32[8, 128], r: hbm f32[2, 1, 128]) {
        vmem xv: f32[8, 128];
        var acc: f32[8, 128] = 1.0;
        sem s;
        sem q;
        start copy(a, xv, s);
        wait copy(a, xv, s);
        acc = acc + xv;
        dbl(acc);
        let row = xv[3:4, :];
        let sm = q;
        put(row, sm, r[0]);
        put(xv[5:6, :], s, r[1]);
        xv = acc;
        start copy(xv, b, s);
        wait copy(xv, b, s);
    }
    """
    a = f32(8, 128)
    kernel = build(src, tmp_path)
    run = kernel(a=a)
    acc = np.float32(1) + a
    same(acc + acc, run.output("b"))
    same(np.stack([a[3:4], a[5:6]]) * np.float32(2), run.output("r"))
    assert len([x for x in kernel.program.kernels["k"].allocation if " t f32[1,128]" in x or ".t f32[1,128]" in x]) == 2


def test_fn_semaphore_bool_and_slot_array_parameters(tmp_path):
    src = """
    fn cp(a: hbm f32[8, 128], v: vmem f32[8, 128], s: sem, ss: sem[2]) {
        start copy(a, v, ss[1]);
        wait copy(a, v, ss[1]);
    }
    fn neg(x: vmem f32[8, 128], flip: bool) { if flip { x = -x; } }
    fn fill(w: vmem f32[2][8, 128], i: i32) { w[i % 2] = f32(i); }
    kernel k(a: hbm f32[8, 128], b: hbm f32[3, 8, 128], f: bool) {
        vmem v: f32[8, 128];
        vmem w: f32[2][8, 128];
        sem s;
        sem ws[2];
        cp(a, v, ws[0], ws);
        neg(v, f);
        neg(v, f && false);
        fill(w, 3);
        fill(w, 4);
        start copy(v, b[0], s);
        wait copy(v, b[0], s);
        start copy(w[0], b[1], s);
        wait copy(w[0], b[1], s);
        start copy(w[1], b[2], s);
        wait copy(w[1], b[2], s);
    }
    host { input a: f32[8, 128]; output b: f32[3, 8, 128]; launch k(a, b, true); }
    """
    a = f32(8, 128)
    out = build(src, tmp_path)(a=a).output("b")
    same(-a, out[0])
    same(np.full((8, 128), 4, np.float32), out[1])
    same(np.full((8, 128), 3, np.float32), out[2])


def test_fn_takes_hbm_views_indexed_and_sliced_at_run_time(tmp_path):
    src = """
    fn load(a: hbm f32[8, 128], v: vmem f32[8, 128], s: sem) { start copy(a, v, s); wait copy(a, v, s); }
    fn store(v: vmem f32[8, 128], a: hbm f32[8, 128], s: sem) { start copy(v, a, s); wait copy(v, a, s); }
    kernel k(x: hbm f32[3, 8, 512], y: hbm f32[8, 512]) {
        vmem v: f32[8, 128];
        vmem acc: f32[8, 128];
        sem s;
        for j in 0..4 {
            acc = 0.0;
            for l in 0..3 {
                load(x[l, :, j * 128 +: 128], v, s);
                acc = acc + v;
            }
            store(acc, y[:, j*128:(j+1)*128], s);
        }
    }
    """
    x = f32(3, 8, 512)
    same(((np.float32(0) + x[0]) + x[1]) + x[2], build(src, tmp_path)(x=x).output("y"))


def test_fn_chain_over_a_library_and_the_main_file(tmp_path):
    # Names join one global namespace: the library uses SCALE from the main file; a file
    # imported twice (also under another relative path) is loaded once; paths are relative
    # to the importing file; an imported file's host and reference do not count.
    files = {
        "lib/a.mk": """\
            import "common.mk";
            reference "nope.py:nothing";
            fn fa(v: vmem f32[8, 128]) { common(v); v = v * f32(SCALE); }
            host { launch nothing(); }
            """,
        "lib/b.mk": """\
            import "common.mk";
            import "../lib/common.mk";
            fn fb(v: vmem f32[8, 128]) { common(v); fa2(v); }
            fn fa2(v: vmem f32[8, 128]) { v = v - f32(ADD); }
            """,
        "lib/common.mk": """\
            const ADD = 2;
            assert ADD > 0, "ADD must be positive";
            fn common(v: vmem f32[8, 128]) { v = v + f32(ADD); }
            """,
    }
    src = """
    import "lib/a.mk";
    import "lib/b.mk";
    const SCALE = 3;
    kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
        vmem v: f32[8, 128];
        sem s;
        start copy(x, v, s);
        wait copy(x, v, s);
        fa(v);
        fb(v);
        start copy(v, y, s);
        wait copy(v, y, s);
    }
    """
    kernel = build(src, tmp_path, files)
    assert kernel.reference is None
    x = f32(8, 128)
    same((((x + np.float32(2)) * np.float32(3)) + np.float32(2)) - np.float32(2), kernel(x=x).output("y"))


@pytest.mark.parametrize("src, message", [
    ("fn f(x: vmem f32[8, 128]) { g(x); }\nfn g(x: vmem f32[8, 128]) { f(x); }\n"
     "kernel k() { vmem x: f32[8, 128]; f(x); }\n",
     "prog.mk:1:29: error: recursive fn call: g -> f -> g (fns are inlined)"),
    ("fn f(x: vmem f32[8, 128]) { f(x); }\nkernel k() { }\n",
     "prog.mk:1:29: error: recursive fn call: f -> f (fns are inlined)"),
    ("fn f(x: vmem f32[8, 128]) { x = x + y; }\nkernel k() { }\n",     # checked though never called
     "prog.mk:1:37: error: unknown name 'y'"),
    ("fn f(x: vmem f32[8, 128]) { x = 0.0; }\nkernel k() { vmem v: f32[8, 256]; f(v); }\n",
     "prog.mk:2:37: error: shape mismatch: parameter 'x' of fn 'f' is [8, 128], got [8, 256]"),
    ("fn f(x: vmem f32[8, 128]) { x = 0.0; }\nkernel k() { vmem v: i32[8, 128]; f(v); }\n",
     "prog.mk:2:37: error: dtype mismatch: parameter 'x' of fn 'f' is f32, got i32"),
    ("fn f(x: vmem f32[8, 128]) { x = 0.0; }\nkernel k() { vmem v: f32[8, 128]; f(v, 1); }\n",
     "prog.mk:2:35: error: fn 'f' takes 1 argument, got 2"),
    ("fn f(x: vmem f32[8, 128]) { x = 0.0; }\nkernel k() { vmem v: f32[8, 128]; let z = f(v); }\n",
     "prog.mk:2:43: error: fn 'f' has no value; call it as a statement"),
    ("fn f(a: hbm f32[8, 128]) { }\nkernel k() { vmem u: f32[8, 128]; f(u); }\n",
     "prog.mk:2:37: error: parameter 'a' of fn 'f' is in hbm, got a vmem buffer 'u'"),
    ("fn f(v: vmem f32[8, 128]) { v = 0.0; }\nkernel k(a: hbm f32[8, 128]) { f(a); }\n",
     "prog.mk:2:34: error: parameter 'v' of fn 'f' is in vmem, got a hbm buffer 'a'"),
    ("fn f(x: vmem f32[8, n], n: i32) { x = 0.0; }\nkernel k(m: i32) { vmem v: f32[8, 128]; f(v, m); }\n"
     "host { launch k(128); }\n",
     "prog.mk:1:21: error: a dimension must be a compile-time integer (in fn 'f' inlined at "),
    ("fn f(t: smem i32[4], n: i32) { t[0] = n; }\nkernel k() { smem t: i32[4]; f(t, 1 < 2); }\n",
     "prog.mk:2:35: error: expected an integer for parameter 'n', got a bool"),
    ("fn f(t: smem i32[4], b: bool) { if b { t[0] = 1; } }\nkernel k() { smem t: i32[4]; f(t, 1); }\n",
     "prog.mk:2:35: error: expected a bool for parameter 'b' (a bool), got an integer"),
    ("fn f(v: vmem f32[8, 128]) { v = 0.0; }\nkernel k() { sem s; f(s); }\n",
     "prog.mk:2:23: error: parameter 'v' of fn 'f' is a vmem buffer, got a semaphore"),
    ("fn f(v: vmem f32[2][8, 128]) { v[0] = 0.0; }\nkernel k() { vmem w: f32[8, 128]; f(w); }\n",
     "prog.mk:2:37: error: parameter 'v' of fn 'f' is an array of 2 buffers [8, 128]"),
    ("const n = 4;\nfn f(x: vmem f32[8, 128], n: i32) { x = 0.0; }\nkernel k() { }\n",
     "prog.mk:2:27: error: redefinition of 'n' (first defined at "),
    ("fn f(x: vmem f32[8, n], n: i32) { assert n > 200, \"n too small\"; }\n"
     "kernel k() { vmem x: f32[8, 128]; f(x, 128); }\n",
     "prog.mk:1:35: error: assertion failed: n too small (in fn 'f' inlined at "),
    ("fn f(x: vmem f32[8, 128]) { x = 0.0; }\nkernel k() { vmem v: f32[8, 128]; g(v); }\n",
     "prog.mk:2:35: error: unknown function 'g'"),
])
def test_fn_errors(tmp_path, src, message):
    msg = error(src, tmp_path)
    where, text = message.split(": error", 1)
    assert msg.startswith(f"{tmp_path / where}: error{text}"), msg


def test_fns_whose_types_are_not_known_on_their_own_are_checked_at_their_calls(tmp_path):
    # An fn whose parameter types depend on a scalar parameter, and a generic fn, are
    # not checked on their own: an error in the body shows only at a call.
    src = """
    fn f(x: vmem f32[8, n], n: i32) { x = x + nope; }
    fn g<C>(x: vmem f32[8, C]) { x = x + nope; }
    kernel k(y: hbm f32[8, 128]) { vmem v: f32[8, 128]; sem s; v = 1.0; start copy(v, y, s); wait copy(v, y, s); }
    """
    same(np.ones((8, 128), np.float32), build(src, tmp_path)().output("y"))
    for call in ("f(v, 128);", "g(v);"):
        msg = error(src.replace("v = 1.0;", "v = 1.0; " + call), tmp_path)
        assert msg.startswith(f"{tmp_path / 'prog.mk'}:2:") or msg.startswith(f"{tmp_path / 'prog.mk'}:3:")
        assert "unknown name 'nope' (in fn " in msg


# ---------------------------------------------------------------------------------------
# Generics


def test_generic_fn_doc_example_at_two_dtypes_and_shapes(tmp_path):
    src = """
    fn cp<T, R, C>(mode: i32, src: hbm T[R, C], dst: vmem T[R, C], s: sem) {
        if mode == 0 { start copy(src, dst, s); } else { wait copy(src, dst, s); }
    }
    kernel k(a: hbm f32[8, 128], b: hbm bf16[16, 256], c: hbm i32[4, 384],
             ya: hbm f32[8, 128], yb: hbm bf16[16, 256], yc: hbm i32[4, 384]) {
        vmem va: f32[8, 128];
        vmem vb: bf16[16, 256];
        vmem vc: i32[4, 384];
        sem s;
        cp(0, a, va, s);
        cp(0, b, vb, s);
        cp(0, c, vc, s);
        cp(1, a, va, s);
        cp(1, b, vb, s);
        cp(1, c, vc, s);
        va = va * 2.0;
        vc = vc - 1;
        start copy(va, ya, s); wait copy(va, ya, s);
        start copy(vb, yb, s); wait copy(vb, yb, s);
        start copy(vc, yc, s); wait copy(vc, yc, s);
    }
    """
    a, b, c = f32(8, 128), bf16(16, 256), i32(4, 384)
    run = build(src, tmp_path)(a=a, b=b, c=c)
    same(a * np.float32(2), run.output("ya"))
    same(b, run.output("yb"))
    same(c - 1, run.output("yc"))


def test_generic_slot_count_and_semaphore_count(tmp_path):
    src = """
    fn fill<S, R, C>(w: vmem f32[S][R, C], ss: sem[S], y: hbm f32[S, R, C]) {
        for i in 0..S { w[i] = f32(i * 10 + S); }
        for i in 0..S { start copy(w[i], y[i], ss[i]); }
        for i in 0..S { wait copy(w[i], y[i], ss[i]); }
    }
    kernel k(y3: hbm f32[3, 8, 128], y2: hbm f32[2, 16, 256]) {
        vmem w: f32[3][8, 128];
        vmem u: f32[2][16, 256];
        sem ws[3];
        sem us[2];
        fill(w, ws, y3);
        fill(u, us, y2);
    }
    """
    run = build(src, tmp_path)()
    same(np.broadcast_to(np.array([3, 13, 23], np.float32)[:, None, None], (3, 8, 128)), run.output("y3"))
    same(np.broadcast_to(np.array([2, 12], np.float32)[:, None, None], (2, 16, 256)), run.output("y2"))


def test_generic_dtype_sizes_local_buffers_and_vars(tmp_path):
    src = """
    fn g<T, R, C>(a: vmem T[R, C], b: vmem T[R, C]) {
        var t: T[R, C] = a;
        vmem u: T[R, C];
        u = t * 2;
        t = u + a;
        b = t;
    }
    kernel k(x: hbm i32[8, 128], y: hbm i32[8, 128], p: hbm f32[16, 256], q: hbm f32[16, 256]) {
        vmem v: i32[8, 128];
        vmem u: i32[8, 128];
        vmem fv: f32[16, 256];
        sem s;
        start copy(x, v, s); wait copy(x, v, s);
        start copy(p, fv, s); wait copy(p, fv, s);
        g(v, u);
        g(fv, fv);
        start copy(u, y, s); wait copy(u, y, s);
        start copy(fv, q, s); wait copy(fv, q, s);
    }
    """
    x, p = i32(8, 128), f32(16, 256)
    run = build(src, tmp_path)(x=x, p=p)
    same(x * 3, run.output("y"))
    same(p * np.float32(2) + p, run.output("q"))


def test_generic_fn_calling_a_generic_fn_at_several_shapes(tmp_path):
    src = """
    fn add1<R, C>(a: vmem f32[R, C]) { a = a + 1.0; }
    fn twice<R, C>(a: vmem f32[R, C]) {
        add1(a);
        add1(a[0:R, 0:C]);
        let n = R * C;                      // a generic is a compile-time integer
        a = a * f32(n);
    }
    fn rowsum<R, C>(x: vmem f32[R, C], out: vmem f32[R, 128]) {
        out = 0.0;
        for j in 0..C / 128 { out = out + x[:, j * 128 +: 128]; }
    }
    kernel k(x: hbm f32[8, 512], y1: hbm f32[8, 128], y2: hbm f32[16, 256], y3: hbm f32[8, 128]) {
        vmem a: f32[8, 128];
        vmem b: f32[16, 256];
        vmem v: f32[8, 512];
        var acc: f32[8, 128];
        sem s;
        a = 0.0;
        b = 1.0;
        twice(a);
        twice(b);
        start copy(x, v, s); wait copy(x, v, s);
        rowsum(v, acc);
        a = a + acc;
        start copy(a, y1, s); wait copy(a, y1, s);
        start copy(b, y2, s); wait copy(b, y2, s);
    }
    """
    x = f32(8, 512)
    run = build(src, tmp_path)(x=x)
    acc = np.zeros((8, 128), np.float32)
    for j in range(4):
        acc = acc + x[:, j * 128:(j + 1) * 128]
    same(np.float32(2 * 8 * 128) + acc, run.output("y1"))
    same(np.full((16, 256), 3 * 16 * 256, np.float32), run.output("y2"))


def test_generic_3d_hbm_smem_and_var_arguments(tmp_path):
    src = """
    fn g<L, R, C>(w: hbm f32[L, R, C], t: smem i32[L], v: vmem f32[R, C], s: sem) {
        for l in 0..L { t[l] = l * R + C; }
        start copy(w[L - 1], v, s);
        wait copy(w[L - 1], v, s);
    }
    fn h<R, C>(a: vmem f32[R, C]) { a = a + f32(R); }
    kernel k(w: hbm f32[3, 8, 128], y: hbm f32[8, 128], z: hbm i32[3]) {
        vmem v: f32[8, 128];
        smem t: i32[3];
        var acc: f32[8, 128] = 1.0;
        sem s;
        g(w, t, v, s);
        h(acc);
        v = v + acc;
        start copy(v, y, s); wait copy(v, y, s);
        start copy(t, z, s); wait copy(t, z, s);
    }
    """
    w = f32(3, 8, 128)
    run = build(src, tmp_path)(w=w)
    same(w[2] + np.float32(9), run.output("y"))
    same(np.array([128, 136, 144], np.int32), run.output("z"))


GENERIC_KERNEL = """
param M = 8;
kernel proj<K, N>(x: hbm f32[M, K], w: hbm bf16[K, N], y: hbm f32[M, N]) {
    vmem xv: f32[M, K];
    vmem wv: bf16[K, N];
    vmem yv: f32[M, N];
    sem s;
    start copy(x, xv, s);
    start copy(w, wv, s);
    wait copy(x, xv, s);
    wait copy(w, wv, s);
    yv = matmul(bf16(xv), wv);
    start copy(yv, y, s);
    wait copy(yv, y, s);
}
host {
    input x: f32[M, 256];
    input w1: bf16[256, 512];
    input w2: bf16[512, 128];
    hbm h: f32[M, 512];
    output y: f32[M, 128];
    launch proj(x, w1, h);      // instance proj<256,512>
    launch proj(h, w2, y);      // instance proj<512,128>
    launch proj(x, w1, h);      // proj<256,512> again: no new instance
}
"""


@pytest.mark.parametrize("m", [8, 16])
def test_generic_kernel_one_instance_per_distinct_set_of_values(tmp_path, m):
    kernel = build(GENERIC_KERNEL, tmp_path, params={"M": m}, trace=True)
    assert sorted(kernel.program.kernels) == ["proj<256,512>", "proj<512,128>"]
    x, w1, w2 = f32(m, 256), bf16(256, 512) / 16, bf16(512, 128) / 16
    run = kernel(x=x, w1=w1, w2=w2)
    same(mm(nx.bf16_round(mm(nx.bf16_round(x), w1)), w2), run.output("y"))
    assert [launch["kernel"] for launch in run.report.trace.launches] == [
        "proj<256,512>", "proj<512,128>", "proj<256,512>"]


def test_generic_kernel_names_in_the_listing(tmp_path):
    (tmp_path / "g.mk").write_text(GENERIC_KERNEL)
    out = mkemu_cli("asm", str(tmp_path / "g.mk"), "--hw", "test", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "kernel proj<256,512>:" in out.stdout and "kernel proj<512,128>:" in out.stdout


def test_generic_kernel_on_dtypes_and_a_scalar_parameter(tmp_path):
    src = """
    kernel cp<T, R, C>(x: hbm T[R, C], y: hbm T[R, C], n: i32) {
        vmem v: T[R, C];
        sem s;
        start copy(x, v, s); wait copy(x, v, s);
        if n > 0 { v[0:1, 0:1] = v[0:1, 0:1]; }
        start copy(v, y, s); wait copy(v, y, s);
    }
    host {
        input a: f32[8, 128]; input b: i32[16, 128]; input c: bf16[8, 256];
        output ya: f32[8, 128]; output yb: i32[16, 128]; output yc: bf16[8, 256]; output yd: f32[8, 128];
        launch cp(a, ya, 1); launch cp(b, yb, 0); launch cp(c, yc, 2); launch cp(ya, yd, 3);
    }
    """
    kernel = build(src, tmp_path)
    assert sorted(kernel.program.kernels) == ["cp<bf16,8,256>", "cp<f32,8,128>", "cp<i32,16,128>"]
    a, b, c = f32(8, 128), i32(16, 128), bf16(8, 256)
    run = kernel(a=a, b=b, c=c)
    same(a, run.output("ya"))
    same(b, run.output("yb"))
    same(c, run.output("yc"))
    same(a, run.output("yd"))


def test_generic_kernel_that_is_never_launched_is_not_checked(tmp_path):
    src = """
    kernel g<C>(x: hbm f32[8, C]) { x = nope; }
    kernel k(y: hbm i32[8]) { smem t: i32[8]; sem s; t[0] = 1; start copy(t, y, s); wait copy(t, y, s); }
    host { output y: i32[8]; launch k(y); }
    """
    assert build(src, tmp_path)().output("y")[0] == 1
    # a plain kernel is checked though never launched
    msg = error(src.replace("kernel g<C>(x: hbm f32[8, C])", "kernel g(x: hbm f32[8, 128])"), tmp_path)
    assert msg.startswith(f"{tmp_path / 'prog.mk'}:2:") and "unknown name 'nope'" in msg


@pytest.mark.parametrize("src, message", [
    ("fn g<N>(a: vmem f32[8, N * 2]) { a = 0.0; }\nkernel k() { }\n",
     "prog.mk:1:6: error: generic 'N' of fn 'g' cannot be inferred from the arguments"),
    ("fn g<N>(a: vmem f32[8, 128]) { a = 0.0; }\nkernel k() { }\n",
     "prog.mk:1:6: error: generic 'N' of fn 'g' cannot be inferred from the arguments"),
    ("kernel g<N>(a: hbm f32[8, 128]) { }\nkernel k() { }\nhost { launch k(); }\n",
     "prog.mk:1:10: error: generic 'N' of kernel 'g' cannot be inferred from the arguments"),
    ("fn g<T>(a: vmem T[8, 128], b: vmem T[8, 128]) { }\n"
     "kernel k() { vmem a: f32[8, 128]; vmem b: i32[8, 128]; g(a, b); }\n",
     "prog.mk:2:61: error: generic 'T' of fn 'g' is f32 from parameter 'a' but i32 here (parameter 'b')"),
    ("fn g<S>(a: vmem f32[S][8, 128], b: sem[S]) { }\nkernel k() { vmem a: f32[2][8, 128]; sem b[3]; g(a, b); }\n",
     "prog.mk:2:53: error: generic 'S' of fn 'g' is 2 from parameter 'a' but 3 here (parameter 'b')"),
    ("fn g<R, C>(a: vmem f32[R, C], b: vmem f32[C, R]) { }\n"
     "kernel k() { vmem a: f32[8, 128]; vmem b: f32[8, 128]; g(a, b); }\n",
     "prog.mk:2:61: error: generic 'C' of fn 'g' is 128 from parameter 'a' but 8 here (parameter 'b')"),
    ("kernel p<K>(x: hbm f32[8, K], y: hbm f32[8, K]) { }\n"
     "host { input x: f32[8, 128]; input y: f32[8, 256]; launch p(x, y); }\n",
     "prog.mk:2:64: error: generic 'K' of kernel 'p' is 128 from parameter 'x' but 256 here (parameter 'y')"),
    ("param D = 128;\nfn g<D>(a: vmem f32[8, D]) { a = 0.0; }\nkernel k() { }\n",
     "prog.mk:2:6: error: redefinition of 'D' (first defined at "),
])
def test_generic_errors(tmp_path, src, message):
    msg = error(src, tmp_path)
    where, text = message.split(": error", 1)
    assert msg.startswith(f"{tmp_path / where}: error{text}"), msg


# ---------------------------------------------------------------------------------------
# Params, consts and compile-time expressions

PARAMS = """
param WR = 12 in {4, 6, 8, 12} "slots of the weight ring";
param TN = 256 in 128..1025 step 128 "N tile";   // 128, 256, ..., 1024
param BIG = 0 in {0, (1 << 21), N} "bytes";      // literals, names, (expressions)
param N = 1024 "columns";                        // a description alone is fine too
param NEG = -1 in {-1, 0, 1};
const NT = N / TN;
kernel k(x: hbm f32[8, N], y: hbm f32[8, N], z: hbm i32[1, 8]) {
    vmem v: f32[8, TN];
    smem t: i32[8];
    sem s;
    for j in 0..NT {
        start copy(x[:, j * TN +: TN], v, s);
        wait copy(x[:, j * TN +: TN], v, s);
        v = v * f32(WR) + f32(j);
        start copy(v, y[:, j*TN:(j+1)*TN], s);
        wait copy(v, y[:, j*TN:(j+1)*TN], s);
    }
    t[0] = WR; t[1] = TN; t[2] = BIG; t[3] = N; t[4] = NEG; t[5] = NT; t[6] = 0; t[7] = 0;
    start copy(t, z[0], s);
    wait copy(t, z[0], s);
}
"""


@pytest.mark.parametrize("params", [{}, {"WR": 4, "TN": 512}, {"TN": 1024, "N": 2048, "BIG": 2048, "NEG": 1},
                                    {"TN": 128, "N": 384, "BIG": 1 << 21, "WR": 6}])
def test_params_size_buffers_and_loops_and_are_set_from_outside(tmp_path, params):
    kernel = build(PARAMS, tmp_path, params=params)
    v = {"WR": 12, "TN": 256, "BIG": 0, "N": 1024, "NEG": -1} | params
    x = f32(8, v["N"])
    run = kernel(x=x)
    expected = x * np.float32(v["WR"]) + np.repeat(np.arange(v["N"] // v["TN"]), v["TN"]).astype(np.float32)
    same(expected, run.output("y"))
    same(np.array([[v["WR"], v["TN"], v["BIG"], v["N"], v["NEG"], v["N"] // v["TN"], 0, 0]], np.int32),
         run.output("z"))
    info = {p.name: p for p in kernel.program.params}
    assert info["WR"].values == (4, 6, 8, 12) and info["WR"].default == 12 and info["WR"].value == v["WR"]
    assert info["WR"].description == "slots of the weight ring"
    assert info["TN"].values == tuple(range(128, 1025, 128))
    assert info["BIG"].values == (0, 1 << 21, v["N"])
    assert info["N"].values is None and info["N"].description == "columns"
    assert info["NEG"].values == (-1, 0, 1) and info["NEG"].description == ""


def test_params_through_load_program_and_the_cli(tmp_path):
    (tmp_path / "p.mk").write_text(PARAMS)
    program = load_program(str(tmp_path / "p.mk"), {"N": 2048, "TN": 1024})
    assert program.params["N"] == 2048 and program.consts["NT"] == 2
    out = mkemu_cli("asm", "p.mk", "--params", "--set", "WR=8", "--set", "TN=128", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()[1:]}
    assert out.stdout.splitlines()[0].split() == ["NAME", "VALUE", "DEFAULT", "VALUES", "DESCRIPTION", "WHERE"]
    assert rows["WR"][:3] == ["WR", "8", "12"] and rows["WR"][-1] == "p.mk:2"
    assert rows["TN"][:3] == ["TN", "128", "256"] and rows["N"][-1] == "p.mk:5"
    out = mkemu_cli("run", "p.mk", "--hw", "test", "--mesh", "1", "--set", "N=512", "--set", "TN=512", "--json",
                    cwd=tmp_path)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("params, message", [
    ({"WR": 5}, "prog.mk:2:15: error: WR = 5 (set from outside) is not one of its declared values: 4, 6, 8, 12"),
    ({"TN": 200}, "prog.mk:3:16: error: TN = 200 (set from outside) is not one of its declared values: "
                  "128, 256, 384, 512, 640, 768, 896, 1024"),
    ({"TN": 1025}, "prog.mk:3:16: error: TN = 1025 (set from outside) is not one of its declared values"),
    ({"BIG": 2048}, "prog.mk:4:15: error: BIG = 2048 (set from outside) is not one of its declared values: "
                    "0, 2097152, 1024"),
])
def test_param_set_from_outside_must_be_a_declared_value(tmp_path, params, message):
    msg = error(PARAMS, tmp_path, params=params)
    where, text = message.split(": error", 1)
    assert msg.startswith(f"{tmp_path / where}: error{text}"), msg


@pytest.mark.parametrize("params", [{}, {"P": 3}, {"P": 9}])
def test_a_default_that_is_not_a_declared_value_is_an_error_even_when_set_from_outside(tmp_path, params):
    # "The default must be one of the values, and so must a value set from outside": the
    # program text is wrong whatever --set says (the default is what --params lists and
    # what a tuner starts from).
    src = "param P = 1 in 0..10 step 3 \"p\";\nkernel k() { }\n"
    msg = error(src, tmp_path, params=params)
    assert msg.startswith(f"{tmp_path / 'prog.mk'}:1:11: error: the default 1 of param 'P' is not one of its "
                          "declared values: 0, 3, 6, 9"), msg


def test_setting_a_const_or_an_unknown_name_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="'NT' is a const, not a param; it cannot be set from outside"):
        build(PARAMS, tmp_path, params={"NT": 2})
    with pytest.raises(ConfigError, match=r"unknown program parameter 'Q' \(the program's params: BIG, N, NEG, TN, WR\)"):
        build(PARAMS, tmp_path, params={"Q": 2})


@pytest.mark.parametrize("src, message", [
    ("param P = 3 in {1, 2} \"x\";\nkernel k() { }\n",
     "prog.mk:1:11: error: the default 3 of param 'P' is not one of its declared values: 1, 2"),
    ("param P = 1 in 0..10 step 3;\nkernel k() { }\n",
     "prog.mk:1:11: error: the default 1 of param 'P' is not one of its declared values: 0, 3, 6, 9"),
    ("param P = 1 in {1, 2, 1} \"x\";\nkernel k() { }\n", "prog.mk:1:23: error: the value 1 is listed twice"),
    ("param P = 1 in 5..5 \"x\";\nkernel k() { }\n",
     "prog.mk:1:13: error: the range 5..5 holds no value (its end is excluded, as in `for`)"),
    ("param P = 1 in 0..5000;\nkernel k() { }\n",
     "prog.mk:1:13: error: a param takes at most 4096 values; this range holds 5000"),
    ("param P = 1 in 0..10 step 0;\nkernel k() { }\n",
     "prog.mk:1:27: error: the step of a param range must be positive, got 0"),
    ("param P = 1 in 0..10 step -2;\nkernel k() { }\n",
     "prog.mk:1:27: error: the step of a param range must be positive, got -2"),
    ("param P = 1 < 2;\nkernel k() { }\n",
     "prog.mk:1:11: error: the value of param 'P' must be an integer"),
    ("const A = B + 1;\nconst B = A * 2;\nkernel k() { }\n",
     "prog.mk:1:7: error: 'A' is defined in terms of itself: A -> B -> A"),
    ("param A = A + 1;\nkernel k() { }\n", "prog.mk:1:7: error: 'A' is defined in terms of itself: A -> A"),
    ("const A = 3;\nassert A % 2 == 0, \"A must be even\";\nkernel k() { }\n",
     "prog.mk:2:1: error: assertion failed: A must be even"),
    ("kernel k() { assert 2 + 2 == 5, \"arithmetic\"; }\n", "prog.mk:1:14: error: assertion failed: arithmetic"),
    ("kernel k() { }\nhost { assert 1 == 2, \"host says no\"; launch k(); }\n",
     "prog.mk:2:8: error: assertion failed: host says no"),
    ("const X = 1 / 0;\nkernel k() { }\n", "prog.mk:1:11: error: division by zero in a compile-time expression"),
    ("const X = 1 < 2;\nconst Y = X + 1;\nkernel k() { }\n", "prog.mk:2:11: error: '+' needs integers, got a bool"),
    ("const X = 1 && 2;\nkernel k() { }\n", "prog.mk:1:11: error: '&&' needs bools, got an integer"),
    ("const X = 1;\nkernel k() { if X { } }\n",
     "prog.mk:2:17: error: expected a scalar condition (a bool), got an integer"),
    ("param D = 1;\nconst D = 2;\nkernel k() { }\n", "prog.mk:2:7: error: redefinition of 'D' (first defined at "),
])
def test_top_level_and_param_errors(tmp_path, src, message):
    msg = error(src, tmp_path)
    where, text = message.split(": error", 1)
    assert msg.startswith(f"{tmp_path / where}: error{text}"), msg


def test_compile_time_expressions_truncate_and_globals_are_used_before_definition(tmp_path):
    src = """
    const A = -7 / 2;
    const B = -7 % 2;
    const C = 7 % -2;
    const D2 = 7 / -2;
    const E = (1 << 4) | 3;
    const F = -16 >> 2;
    const G = (0xff & 0x0f) ^ 0x3;
    const H = min(3, -4) + max(2, 9);
    const I = select(A < 0 && !(B > 0) || false, 100, 200);
    const J = LATER * 2;                 // used before its definition
    const LATER = 1_000;
    const SPLIT = J > 4096;              // a bool const
    const K = select(SPLIT, 1, 2);
    const L = 2 + 3 * 4 - 10 / 3 % 2;
    param P = Q * 2;
    param Q = 64;
    kernel k(y: hbm i32[1, 16]) {
        smem t: i32[16];
        sem s;
        t[0] = A; t[1] = B; t[2] = C; t[3] = D2; t[4] = E; t[5] = F; t[6] = G; t[7] = H;
        t[8] = I; t[9] = J; t[10] = K; t[11] = L; t[12] = i32(SPLIT); t[13] = P; t[14] = Q;
        t[15] = i32(!SPLIT);
        start copy(t, y[0], s);
        wait copy(t, y[0], s);
    }
    """
    expected = [-3, -1, 1, -3, 19, -4, 12, 5, 100, 2000, 2, 13, 0, 128, 64, 1]
    same(np.array([expected], np.int32), build(src, tmp_path)().output("y"))
    # a param set from outside changes the params defined from it
    same(np.array([[64, 32]], np.int32), build(src, tmp_path, params={"Q": 32})().output("y")[:, 13:15])


def test_an_imported_param_is_overridden_and_sizes_the_host(tmp_path):
    files = {"lib/p.mk": 'param P = 5 in {5, 6, 7} "p";\nconst Q = P * 128;\n'}
    src = """
    import "lib/p.mk";
    kernel k(x: hbm f32[8, Q], y: hbm f32[8, Q]) {
        vmem v: f32[8, Q];
        sem s;
        start copy(x, v, s); wait copy(x, v, s);
        v = v + f32(P);
        start copy(v, y, s); wait copy(v, y, s);
    }
    host { input x: f32[8, Q]; output y: f32[8, Q]; launch k(x, y); }
    """
    kernel = build(src, tmp_path, files, params={"P": 7})
    assert kernel.buffers["y"].shape == (8, 7 * 128)
    x = f32(8, 7 * 128)
    same(x + np.float32(7), kernel(x=x).output("y"))
    msg = error(src, tmp_path, files, params={"P": 8})
    assert msg.startswith(f"{tmp_path / 'lib/p.mk'}:1:13: error: P = 8 (set from outside) is not one of its declared values: 5, 6, 7"), msg


# ---------------------------------------------------------------------------------------
# Declarations and types


def test_every_declaration_form(tmp_path):
    src = """
    kernel k(x: hbm f32[8, 256], y: hbm f32[8, 256], z: hbm i32[1, 16]) {
        vmem xa: f32[8, 256];            // a VMEM buffer
        vmem wbuf: f32[2][8, 256];       // two equal buffers
        smem idx: i32[16];               // scalar memory
        sem s;                           // a semaphore
        sem ws[2];                       // an array of semaphores
        var acc: f32[8, 256];            // a tile placed by the compiler
        var acc2: f32[8, 256] = 0.5;     // ... with an initial value
        var count: i32;                  // a mutable scalar (default 0)
        var c2: i32 = 3;
        var done: bool = false;          // a mutable bool
        var d2: bool;
        let n = 4;                       // a compile-time int: sizes a buffer
        vmem small: f32[n, 128];
        start copy(x, xa, s);
        wait copy(x, xa, s);
        acc = xa * 2.0;
        acc2 = acc2 + acc;
        for i in 0..n { count = count + i; }
        done = count == 6;
        d2 = !d2;
        let h = copy(x, wbuf[1], ws[1]); // a DMA description
        start h;
        wait h;
        idx[2] = 40;
        let e = idx[2];                  // a runtime scalar, read here
        idx[0] = count; idx[1] = c2; idx[2] = i32(done); idx[3] = i32(d2);
        let row = wbuf[1][0:1, :];       // a view
        let sm = ws[0];                  // a semaphore
        let ss = sum(row * row, axis=1); // a tile value [1, 1]
        small = 1.0;
        wbuf[0] = acc2 + row;
        wbuf[0][1:2, 0:1] = ss;
        start copy(wbuf[0], y, sm);
        wait copy(wbuf[0], y, sm);
        idx[4] = e + 1;
        idx[5] = n;
        for i in 6..16 { idx[i] = 0; }
        start copy(idx, z[0], s);
        wait copy(idx, z[0], s);
    }
    """
    x = f32(8, 256)
    run = build(src, tmp_path)(x=x)
    expected = (np.float32(0.5) + x * np.float32(2)) + x[0:1]
    expected[1, 0] = row_sum(x[0:1] * x[0:1])[0, 0]
    same(expected, run.output("y"))
    same(np.array([[6, 3, 1, 1, 41, 4] + [0] * 10], np.int32), run.output("z"))


def test_names_are_block_scoped(tmp_path):
    src = """
    kernel k(y: hbm i32[4]) {
        smem t: i32[4];
        sem s;
        for i in 0..2 { let a = i; t[i] = a; }
        for j in 0..2 { let a = j * 10 + 1; t[j + 2] = a; }   // a sibling block: a new 'a'
        start copy(t, y, s);
        wait copy(t, y, s);
    }
    """
    same(np.array([0, 1, 1, 11], np.int32), build(src, tmp_path)().output("y"))


@pytest.mark.parametrize("src, message", [
    ("const G = 1;\nkernel k() { let G = 2; }\n", "prog.mk:2:18: error: redefinition of 'G' (first defined at "),
    ("const G = 1;\nkernel k() { vmem G: f32[8, 128]; }\n", "prog.mk:2:19: error: redefinition of 'G'"),
    ("fn f() { }\nkernel k() { sem f; }\n", "prog.mk:2:18: error: redefinition of 'f'"),
    ("kernel k() { let a = 1; for i in 0..2 { let a = 2; } }\n",
     "prog.mk:1:45: error: redefinition of 'a' (first defined at "),
    ("kernel k() { vmem v: f32[8, 128]; sem v; }\n", "prog.mk:1:39: error: redefinition of 'v'"),
    ("kernel k() { for i in 0..2 { let a = i; } let b = a; }\n", "prog.mk:1:51: error: unknown name 'a'"),
    ("kernel k(x: hbm f32[2, 2, 8, 128]) { }\n",
     "prog.mk:1:13: error: hbm arrays can have at most 3 dimension(s), got 4"),
    ("kernel k() { vmem v: f32[2, 8, 128]; }\n", "prog.mk:1:14: error: vmem arrays can have at most 2 dimension(s), got 3"),
    ("kernel k() { smem v: i32[2, 2, 8]; }\n", "prog.mk:1:14: error: smem arrays can have at most 2 dimension(s), got 3"),
    ("kernel k() { smem v: f32[8]; }\n", "prog.mk:1:14: error: an smem buffer's dtype is i32 (SMEM holds i32 only), not f32"),
    ("kernel k() { vmem v: f32[0, 128]; }\n", "prog.mk:1:26: error: dimensions must be positive, got 0"),
    ("param P = -8;\nkernel k() { vmem v: f32[P, 128]; }\n", "prog.mk:2:26: error: dimensions must be positive, got -8"),
    ("kernel k(n: i32) { vmem v: f32[8, n]; }\n", "prog.mk:1:35: error: a dimension must be a compile-time integer"),
    ("kernel k(v: vmem f32[8, 128]) { }\n",
     "prog.mk:1:13: error: kernel parameters are HBM arrays, i32 or bool scalars"),
    ("kernel k() { let for = 1; }\n", "prog.mk:1:18: error: "),
    ("kernel k() { let true = 1; }\n", "prog.mk:1:18: error: "),
])
def test_declaration_and_type_errors(tmp_path, src, message):
    msg = error(src, tmp_path)
    where, text = message.split(": error", 1)
    assert msg.startswith(f"{tmp_path / where}: error{text}"), msg


def test_every_declared_type(tmp_path):
    # HBM up to 3-D, VMEM up to 2-D (1-D is [1, n]), slot arrays, SMEM i32 up to 2-D,
    # semaphores and arrays of them, i32 and bool scalars; bf16, f32, i32 dtypes.
    src = """
    fn twice(src: hbm bf16[2, 4, 256], dst: vmem bf16[2][4, 256], s: sem[2]) {
        for i in 0..2 { start copy(src[i], dst[i], s[i]); }
        for i in 0..2 { wait copy(src[i], dst[i], s[i]); }
    }
    kernel k(w: hbm bf16[2, 4, 256], v1: hbm f32[256], t2: hbm i32[2, 4], n: i32, flag: bool,
             y: hbm f32[4, 256], yv: hbm f32[256], yt: hbm i32[2, 4]) {
        vmem wb: bf16[2][4, 256];
        vmem one: f32[256];
        smem tab: i32[2, 4];
        sem ss[2];
        sem s;
        twice(w, wb, ss);
        start copy(v1, one, s);
        start copy(t2, tab, s);
        wait copy(v1, one, s);
        wait copy(t2, tab, s);
        one = one * f32(n);
        tab[1, 3] = select(flag, tab[0, 0] + n, -1);
        let sum2 = f32(wb[0]) + f32(wb[1]);
        wb[0] = bf16(sum2);
        let out = f32(wb[0]);
        vmem o: f32[4, 256];
        o = out + one;
        start copy(o, y, s); wait copy(o, y, s);
        start copy(one, yv, s); wait copy(one, yv, s);
        start copy(tab, yt, s); wait copy(tab, yt, s);
    }
    host {
        input w: bf16[2, 4, 256]; input v1: f32[256]; input t2: i32[2, 4];
        output y: f32[4, 256]; output yv: f32[256]; output yt: i32[2, 4];
        launch k(w, v1, t2, 3, true, y, yv, yt);
    }
    """
    w, v1, t2 = bf16(2, 4, 256), f32(256), i32(2, 4)
    run = build(src, tmp_path)(w=w, v1=v1, t2=t2)
    one = v1 * np.float32(3)
    same(nx.bf16_round(w[0] + w[1]) + one[None, :], run.output("y"))
    same(one, run.output("yv"))
    t = t2.copy()
    t[1, 3] = t2[0, 0] + 3
    same(t, run.output("yt"))


# ---------------------------------------------------------------------------------------
# The command line: a program with structs, an imported fn and params, checked against its
# reference; errors are one `file:line:col: error:` message, exit status 1, no traceback.

CLI_LIB = """\
param D = 256 in 128..513 step 128 "columns";
struct Io { x: hbm f32[8, D]; y: hbm f32[8, D]; }
struct Work { v: vmem f32[2][8, D]; s: sem[2]; }
fn axpy<R, C>(a: vmem f32[R, C], b: vmem f32[R, C], scale: i32) { b = a * f32(scale) + b; }
"""

CLI_MAIN = """\
import "lib/io.mk";
param K = 3;
reference "ref.py:reference";
kernel k(io: Io) {
    let w = Work();
    start copy(io.x, w.v[0], w.s[0]);
    wait copy(io.x, w.v[0], w.s[0]);
    w.v[1] = 1.0;
    axpy(w.v[0], w.v[1], K);
    start copy(w.v[1], io.y, w.s[1]);
    wait copy(w.v[1], io.y, w.s[1]);
}
host { input io: Io; launch k(io); }
"""

CLI_REF = """\
import numpy as np
def reference(inputs, *, chips, cores_per_chip):
    return {"y": inputs["x@0"] * np.float32(K) + np.float32(1)}
"""


def mkemu_cli(*args, cwd):
    """`mkemu ARGS` in `cwd`, in this process (a real process: tests/dsl/test_valid_matmul_host_programs.py)."""
    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        os.chdir(here)
    return types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


@pytest.mark.parametrize("sets", [[], ["--set", "D=512", "--set", "K=-2"]])
def test_cli_runs_a_struct_program_bit_exact(tmp_path, sets):
    k = 3 if not sets else -2
    write(tmp_path, {"lib/io.mk": CLI_LIB, "prog.mk": CLI_MAIN, "ref.py": CLI_REF.replace("K)", f"{k})")})
    out = mkemu_cli("run", "prog.mk", "--hw", "test", "--mesh", "1", "--json", *sets, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert '"bit_exact": true' in out.stdout


@pytest.mark.parametrize("main, lib, sets, where, message", [
    (CLI_MAIN.replace("axpy(w.v[0], w.v[1], K);", "axpy(w.v[0], io.y, K);"), CLI_LIB, [], "prog.mk:9:18",
     "parameter 'b' of fn 'axpy' is in vmem, got a hbm buffer 'io.y'"),
    (CLI_MAIN.replace("w.v[1] = 1.0;", "w.u = 1.0;"), CLI_LIB, [], "prog.mk:8:7", "struct 'Work' has no member 'u'"),
    (CLI_MAIN, CLI_LIB.replace("struct Work { v", "struct Work { io: Io; v"), [], "lib/io.mk:3:19",
     "'io' is an instance of struct 'Io' (structs do not nest)"),
    (CLI_MAIN, CLI_LIB, ["--set", "D=100"], "lib/io.mk:1:15",
     "D = 100 (set from outside) is not one of its declared values: 128, 256, 384, 512"),
    (CLI_MAIN.replace("let w = Work();", "let w = Io();"), CLI_LIB, [], "prog.mk:5:13",
     "member 'x' of struct 'Io' is in hbm: kernels cannot allocate HBM"),
    (CLI_MAIN.replace("axpy(w.v[0], w.v[1], K);", "axpy(w.v[0], w.v, K);"), CLI_LIB, [], "prog.mk:9:18",
     "buffer array 'w.v' needs a slot index"),
])
def test_cli_reports_a_compile_error_in_one_message(tmp_path, main, lib, sets, where, message):
    write(tmp_path, {"lib/io.mk": lib, "prog.mk": main, "ref.py": CLI_REF.replace("K)", "3)")})
    out = mkemu_cli("run", "prog.mk", "--hw", "test", "--mesh", "1", *sets, cwd=tmp_path)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    first = out.stderr.splitlines()[0]
    assert first.startswith(f"{where}: error: ") and message in first, out.stderr


@pytest.mark.parametrize("decl, params, value, values", [
    ("param P = 2 in {(1 + 1), -3, Q} \"d\";", {"P": -3}, -3, (2, -3, 4)),
    ("param P = 2 in 0..(2 * 4) step (1 + 1);", {}, 2, (0, 2, 4, 6)),
    ("param P = 3 in 0..Q;", {"P": 0}, 0, (0, 1, 2, 3)),
    ("param P = 4 in 1..5;", {}, 4, (1, 2, 3, 4)),
    ("param P = -1;", {"P": -5}, -5, None),
])
def test_param_value_forms(tmp_path, decl, params, value, values):
    src = decl + """
    const Q = 4;
    kernel k(y: hbm i32[8]) { smem t: i32[8]; sem s; t[0] = P; start copy(t, y, s); wait copy(t, y, s); }
    """
    kernel = build(src, tmp_path, params=params)
    assert kernel().output("y")[0] == value
    assert kernel.program.params[0].values == values and kernel.program.params[0].value == value


def test_an_unparenthesised_expression_is_not_a_param_value(tmp_path):
    msg = error("param P = 2 in {1 + 1, 3};\nkernel k() { }\n", tmp_path)
    assert msg.startswith(f"{tmp_path / 'prog.mk'}:1:19: error: unexpected '+'"), msg


def test_generic_kernel_with_a_struct_parameter_launched_in_a_host_loop(tmp_path):
    # A generic fn taking a struct instance, a generic inferred from a struct member, a
    # generic kernel with a struct parameter, launched from a compile-time host loop.
    src = """
    param L = 3;
    struct IO { w: hbm f32[L, 8, 128]; y: hbm f32[L, 8, 128]; }
    struct B { v: vmem f32[8, 128]; s: sem; }
    fn f<R, C>(b: B, x: vmem f32[R, C]) { x = x + b.v; }
    fn g<R, C>(x: vmem f32[R, C]) { x = x * 2.0; }
    kernel k<C>(io: IO, z: hbm f32[8, C], l: i32) {
        let b = B();
        vmem t: f32[8, C];
        start copy(io.w[l], b.v, b.s); wait copy(io.w[l], b.v, b.s);
        g(b.v);
        t = f32(l);
        f(b, t[:, 0:128]);
        start copy(t, z, b.s); wait copy(t, z, b.s);
        start copy(b.v, io.y[l], b.s); wait copy(b.v, io.y[l], b.s);
    }
    host {
        input io: IO;
        output z: f32[L, 8, 256];
        for l in 0..L { launch k(io, z[l], l); }
    }
    """
    kernel = build(src, tmp_path, params={"L": 4})
    assert sorted(kernel.program.kernels) == ["k<256>"]
    w = f32(4, 8, 128)
    run = kernel(w=w)
    same(w * np.float32(2), run.output("y"))
    z = np.broadcast_to(np.arange(4, dtype=np.float32)[:, None, None], (4, 8, 256)).copy()
    z[:, :, :128] += w * np.float32(2)
    same(z, run.output("z"))
