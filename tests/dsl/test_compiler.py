"""The back end: small .mk programs compiled and run on the emulator, bit-exact
against numpy written with the numeric contract (`mkemu.isa.numerics`)."""

from __future__ import annotations

import numpy as np
import pytest

from mkemu.dsl.compiler import compile_text
from mkemu.emulator.machine import Machine
from mkemu.emulator.topology import Mesh
from mkemu.errors import SourceError
from mkemu.isa import numerics as nx
from mkemu.isa.hardware import load_profile
from mkemu.runner import from_storage, to_storage

PROFILE = load_profile("test")


def run(text: str, inputs: dict, mesh=(1, 1, 1), params=None, per_chip=False):
    program = compile_text(text, "t.mk", PROFILE, params)
    machine = Machine(PROFILE, Mesh(mesh))
    machine.load(program)
    for chip in range(machine.mesh.num_chips):
        for name, array in inputs.items():
            buf = program.buffer(name)
            machine.write_buffer(chip, name, to_storage(array, buf.dtype))
    result = machine.run()
    outs = {}
    for buf in program.buffers:
        chips = range(machine.mesh.num_chips) if per_chip else [0]
        for chip in chips:
            value = from_storage(machine.read_buffer(chip, buf.name), buf.dtype)
            outs[f"{buf.name}@{chip}" if per_chip else buf.name] = value
    return outs, result, program


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    if a.dtype.kind == "f":
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        ok = (a32.view(np.uint32) == b32.view(np.uint32)) | (np.isnan(a32) & np.isnan(b32))
    else:
        ok = a == b
    if not ok.all():
        idx = tuple(np.argwhere(~ok)[0])
        raise AssertionError(f"{(~ok).sum()} differ; first at {idx}: expected {a[idx]!r}, got {b[idx]!r}")


RNG = np.random.default_rng(1)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def bf16(*shape):
    return nx.bf16_round(f32(*shape))


def copy_kernel(name, dtype, shape_in, body, shape_out=None, dtype_out=None, extra=""):
    """A kernel that copies `x` into VMEM `xv`, runs `body`, and copies `yv` out."""
    shape_out = shape_out or shape_in
    dtype_out = dtype_out or dtype
    si = ", ".join(map(str, shape_in))
    so = ", ".join(map(str, shape_out))
    return f"""
kernel {name}(x: hbm {dtype}[{si}], y: hbm {dtype_out}[{so}]) {{
    vmem xv: {dtype}[{si}];
    vmem yv: {dtype_out}[{so}];
    {extra}
    sem ds;
    start copy(x, xv, ds);
    wait copy(x, xv, ds);
    {body}
    start copy(yv, y, ds);
    wait copy(yv, y, ds);
}}
"""


def tree(x, axis, op="sum"):
    """The contract's reduction: pad to the next power of two >= 128 lanes (axis 1)
    or >= 8 rows (axis 0) with the identity, then the halving tree."""
    x = np.asarray(x)
    n = x.shape[axis]
    p = 1 << max(0, (max(n, 128 if axis == 1 else 8) - 1).bit_length())
    if x.dtype == np.int32:
        ident = {"sum": 0, "max": np.iinfo(np.int32).min, "min": np.iinfo(np.int32).max}[op]
    else:
        ident = {"sum": 0.0, "max": -np.inf, "min": np.inf}[op]
    pad = [(0, 0), (0, 0)]
    pad[axis] = (0, p - n)
    x = np.pad(x, pad, constant_values=ident)
    if x.dtype == np.int32:
        fn = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
        while x.shape[axis] > 1:
            lo, hi = np.split(x, 2, axis=axis)
            x = nx.i32_wrap(fn(lo.astype(np.int64), hi.astype(np.int64)))
        return x
    fn = {"sum": nx.tree_sum_f32, "max": nx.tree_max_f32, "min": nx.tree_min_f32}[op]
    return fn(x, axis=axis, keepdims=True)


# --------------------------------------------------------------- elementwise


def test_elementwise_broadcast_partial_tiles():
    src = copy_kernel("k", "f32", (5, 200), "yv = exp(xv) * 2.0 + xv[0:1, :] - xv[:, 3:4];")
    x = f32(5, 200)
    outs, _, _ = run(src, {"x": x})
    same(nx.exp(x) * np.float32(2.0) + x[0:1, :] - x[:, 3:4], outs["y"])


def test_elementwise_many_blocks_runs_a_block_loop():
    body = "yv = where(xv > 0.0, sigmoid(xv), -xv) + max(abs(xv), 0.5) / rsqrt(abs(xv) + 1.0);"
    src = copy_kernel("k", "f32", (21, 1100), body)
    x = f32(21, 1100)
    outs, _, prog = run(src, {"x": x})
    ax = np.abs(x)
    exp = np.where(x > 0, nx.sigmoid(x), -x) + nx.f32_max(ax, np.float32(0.5)) / nx.rsqrt(ax + np.float32(1.0))
    same(exp, outs["y"])
    assert len(prog.kernels["k"].code) < 200     # a loop, not 27 unrolled blocks


def test_conversions_and_integer_ops():
    body = """
    let i = i32(xv * 10.0);
    yv = f32((i << 2) + (i >> 1) - (i & 7) + min(i, 3) * max(i, -2)) + f32(bf16(xv));
    """
    src = copy_kernel("k", "f32", (8, 256), body)
    x = f32(8, 256)
    outs, _, _ = run(src, {"x": x})
    i = nx.f32_to_i32(x * np.float32(10.0)).astype(np.int64)
    iv = nx.i32_wrap((i << 2) + (i >> 1) - (i & 7) + np.minimum(i, 3) * np.maximum(i, -2))
    same(nx.i32_to_f32(iv) + nx.bf16_round(x), outs["y"])


def test_bf16_store_rounds_and_iota():
    body = "yv = bf16(xv * f32(iota(1, 300)) + f32(iota(0, 3)));"
    src = copy_kernel("k", "f32", (3, 300), body, dtype_out="bf16")
    x = f32(3, 300)
    outs, _, _ = run(src, {"x": x})
    exp = nx.bf16_round(x * np.arange(300, dtype=np.float32)[None, :] + np.arange(3, dtype=np.float32)[:, None])
    same(exp, outs["y"])


# ----------------------------------------------------------------- reductions


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("cols", [384, 200, 1000])
def test_reduce_axis1(op, cols):
    src = copy_kernel("k", "f32", (11, cols), f"yv = {op}(xv * 3.0, axis=1);", shape_out=(11, 1))
    x = f32(11, cols)
    x[0, :] = -0.0
    outs, _, _ = run(src, {"x": x})
    same(tree(x * np.float32(3.0), 1, op), outs["y"])


@pytest.mark.parametrize("op", ["sum", "max"])
def test_reduce_axis0(op):
    src = copy_kernel("k", "f32", (20, 130), f"yv = {op}(xv, axis=0);", shape_out=(1, 130))
    x = f32(20, 130)
    outs, _, _ = run(src, {"x": x})
    same(tree(x, 0, op), outs["y"])


def test_reduce_i32_and_broadcast_of_result():
    body = "let s = sum(xv, axis=1); yv = xv - s + max(xv, axis=0);"
    src = copy_kernel("k", "i32", (9, 150), body)
    x = RNG.integers(-1000, 1000, size=(9, 150)).astype(np.int32)
    outs, _, _ = run(src, {"x": x})
    exp = nx.i32_wrap(x.astype(np.int64) - tree(x, 1, "sum") + tree(x, 0, "max"))
    same(exp, outs["y"])


def test_rmsnorm_like_fusion():
    body = "yv = xv * rsqrt(sum(xv * xv, axis=1) / 384.0 + 1e-5);"
    src = copy_kernel("k", "f32", (8, 384), body)
    x = f32(8, 384)
    outs, _, _ = run(src, {"x": x})
    ss = tree(x * x, 1)
    same(x * nx.rsqrt(ss / np.float32(384.0) + np.float32(1e-5)), outs["y"])


def test_argmax_lowest_index_of_the_max():
    src = copy_kernel("k", "f32", (10, 300), "yv = argmax(xv, axis=1);", shape_out=(10, 1), dtype_out="i32")
    x = np.round(f32(10, 300) * 2).astype(np.float32)     # many ties
    x[3, :] = 7.0
    outs, _, _ = run(src, {"x": x})
    same(np.argmax(x, axis=1).astype(np.int32)[:, None], outs["y"])


def test_topk_router_with_scalar():
    src = """
kernel k(x: hbm f32[8, 12], y: hbm i32[4]) {
    vmem xv: f32[8, 12];
    smem idx: i32[4];
    var s: f32[8, 12];
    sem sm;
    start copy(x, xv, sm);
    wait copy(x, xv, sm);
    s = xv;
    for t in 0..4 {
        let m = argmax(s, axis=1);
        idx[t] = scalar(m[2, 0]);
        s = where(iota(1, 12) == m, -inf, s);
    }
    start copy(idx, y, sm);
    wait copy(idx, y, sm);
}
"""
    x = f32(8, 12)
    outs, _, _ = run(src, {"x": x})
    same(np.argsort(-x[2], kind="stable")[:4].astype(np.int32), outs["y"])


# --------------------------------------------------------------------- matmul


def mm(a, w):
    """The contract's matmul: bf16 operands, sequential-k f32 accumulation."""
    acc = np.zeros((a.shape[0], w.shape[1]), np.float32)
    return nx.mxu_matmul_numpy(acc, a, w)


@pytest.mark.parametrize("m,k,n", [(5, 300, 200), (8, 128, 128), (20, 256, 384), (1, 130, 5)])
def test_matmul_any_shape(m, k, n):
    src = f"""
kernel k(x: hbm f32[{m}, {k}], w: hbm bf16[{k}, {n}], y: hbm f32[{m}, {n}]) {{
    vmem xv: f32[{m}, {k}];
    vmem wv: bf16[{k}, {n}];
    vmem yv: f32[{m}, {n}];
    sem s;
    start copy(x, xv, s);
    start copy(w, wv, s);
    wait copy(x, xv, s);
    wait copy(w, wv, s);
    yv = matmul(bf16(xv), wv);
    start copy(yv, y, s);
    wait copy(yv, y, s);
}}
"""
    x, w = f32(m, k), bf16(k, n)
    outs, _, _ = run(src, {"x": x, "w": w})
    same(mm(nx.bf16_round(x), w), outs["y"])


def test_matmul_accumulate_and_use_in_expression():
    src = """
kernel k(x: hbm bf16[8, 256], w: hbm bf16[256, 256], y: hbm f32[8, 256]) {
    vmem xv: bf16[8, 256];
    vmem wv: bf16[256, 256];
    vmem yv: f32[8, 256];
    var acc: f32[8, 256] = 1.0;
    sem s;
    start copy(x, xv, s);
    start copy(w, wv, s);
    wait copy(x, xv, s);
    wait copy(w, wv, s);
    for j in 0..2 {
        acc[:, j * 128 +: 128] += matmul(xv, wv[:, j * 128 +: 128]);
    }
    yv = acc * 0.5 + matmul(xv[:, 0:128], wv[0:128, :]);
    start copy(yv, y, s);
    wait copy(yv, y, s);
}
"""
    x, w = bf16(8, 256), bf16(256, 256)
    outs, _, _ = run(src, {"x": x, "w": w})
    acc = np.ones((8, 256), np.float32) + mm(x, w)
    same(acc * np.float32(0.5) + mm(x[:, :128], w[:128, :]), outs["y"])


def test_matmul_transposed_rhs():
    src = """
kernel k(q: hbm bf16[8, 128], kc: hbm bf16[40, 128], y: hbm f32[8, 40]) {
    vmem qv: bf16[8, 128];
    vmem kv: bf16[40, 128];
    vmem yv: f32[8, 40];
    sem s;
    start copy(q, qv, s);
    start copy(kc, kv, s);
    wait copy(q, qv, s);
    wait copy(kc, kv, s);
    yv = matmul(qv, transpose(kv));
    start copy(yv, y, s);
    wait copy(yv, y, s);
}
"""
    q, kc = bf16(8, 128), bf16(40, 128)
    outs, _, _ = run(src, {"q": q, "kc": kc})
    same(mm(q, kc.T), outs["y"])


def test_matmul_f32_operands_round_to_bf16():
    src = copy_kernel("k", "f32", (8, 256), "yv = matmul(xv, transpose(xv * 2.0));", shape_out=(8, 8))
    x = f32(8, 256)
    outs, _, _ = run(src, {"x": x})
    same(mm(x, (x * np.float32(2.0)).T), outs["y"])


# ------------------------------------------------------------------ transposes


def test_transpose_row_to_column_kda_style():
    src = """
kernel k(kk: hbm f32[1, 128], st: hbm f32[128, 128], y: hbm f32[1, 128], z: hbm f32[128, 1]) {
    vmem kv: f32[1, 128];
    vmem sv: f32[128, 128];
    vmem yv: f32[1, 128];
    vmem zv: f32[128, 1];
    sem s;
    start copy(kk, kv, s);
    start copy(st, sv, s);
    wait copy(kk, kv, s);
    wait copy(st, sv, s);
    yv = sum(transpose(kv) * sv, axis=0);
    zv = transpose(yv) + 1.0;
    kv = transpose(zv);
    yv = yv - kv;
    start copy(yv, y, s);
    start copy(zv, z, s);
    wait copy(yv, y, s);
    wait copy(zv, z, s);
}
"""
    kk, st = f32(1, 128), f32(128, 128)
    outs, _, _ = run(src, {"kk": kk, "st": st})
    y = tree(kk.T * st, 0)
    z = y.T + np.float32(1.0)
    same(z, outs["z"])
    same(y - z.T, outs["y"])


# ------------------------------------------------------ DMA, scalars and control


def test_double_buffered_stream_with_dynamic_slices():
    src = """
param N = 2048;
const T = 256;
kernel k(x: hbm f32[8, N], y: hbm f32[8, N]) {
    vmem buf: f32[2][8, T];
    vmem out: f32[8, N];
    sem ws[2];
    sem s;
    start copy(x[:, 0 +: T], buf[0], ws[0]);
    for t in 0..N / T {
        if t + 1 < N / T {
            start copy(x[:, (t + 1) * T +: T], buf[(t + 1) % 2], ws[(t + 1) % 2]);
        }
        wait copy(x[:, t * T +: T], buf[t % 2], ws[t % 2]);
        out[:, t * T +: T] = buf[t % 2] * f32(t + 1);
    }
    start copy(out, y, s);
    wait copy(out, y, s);
}
"""
    x = f32(8, 2048)
    outs, _, _ = run(src, {"x": x})
    scale = np.repeat(np.arange(1, 9, dtype=np.float32), 256)[None, :]
    same(x * scale, outs["y"])


def test_scalar_control_flow_from_smem():
    src = """
kernel k(p: hbm i32[8], y: hbm i32[16]) {
    smem ps: i32[8];
    smem out: i32[16];
    sem s;
    var acc: i32 = 0;
    start copy(p, ps, s);
    wait copy(p, ps, s);
    let n = ps[0];
    for i in ps[1]..n step 2 {
        if i % 3 == 0 && i != 6 {
            acc += i * 10;
        } else if !(i < 5) || i == 1 {
            acc -= i;
        } else {
            acc = acc ^ (i << 2);
        }
        out[i % 16] = acc;
    }
    out[15] = min(acc, 1000) + max(-acc, -3) + (acc / 7) % 5 + (acc >> 1) + i32(ps[2] > 4) + i32(ps[2] >= 4);
    out[14] = -ps[3] / 4 + (7 - ps[3]) + i32(ps[3] <= 5) + i32(5 < ps[3]);
    start copy(out, y, s);
    wait copy(out, y, s);
}
"""
    p = np.array([13, 1, 4, 11, 0, 0, 0, 0], np.int32)
    outs, _, _ = run(src, {"p": p})
    out = np.zeros(16, np.int64)
    acc = 0

    def cdiv(a, b):
        q = abs(a) // abs(b)
        return q if (a < 0) == (b < 0) else -q

    for i in range(1, 13, 2):
        if i % 3 == 0 and i != 6:
            acc += i * 10
        elif not (i < 5) or i == 1:
            acc -= i
        else:
            acc = acc ^ (i << 2)
        out[i % 16] = acc
    q = cdiv(acc, 7)
    out[15] = min(acc, 1000) + max(-acc, -3) + (q - 5 * cdiv(q, 5)) + (acc >> 1) + 0 + 1
    out[14] = cdiv(-11, 4) + (7 - 11) + 0 + 1
    same(out.astype(np.int32), outs["y"])


def test_regions_and_spmd_builtins():
    src = """
kernel k(y: hbm i32[8]) {
    smem out: i32[8];
    sem s;
    for l in 0..2 {
        region "layer" (l) {
            out[l] = core_id() * 100 + chip_id() * 10 + l;
        }
    }
    region "tail" {
        out[2] = num_cores();
        out[3] = num_chips();
        out[4] = peer(0, 1);
        out[5] = peer(0, -1);
        out[6] = global_core(chip_id(), 1);
        out[7] = mesh_dim(0) * 10 + chip_coord(0);
    }
    if core_id() == 0 {
        start copy(out, y, s);
        wait copy(out, y, s);
    }
}
"""
    outs, res, prog = run(src, {}, mesh=(3, 1, 1), per_chip=True)
    assert prog.kernels["k"].regions == ("layer", "tail")
    for chip in range(3):
        exp = [chip * 10, chip * 10 + 1, 2, 3, ((chip + 1) % 3) * 2, ((chip - 1) % 3) * 2, chip * 2 + 1,
               30 + chip]
        same(np.array(exp, np.int32), outs[f"y@{chip}"])


def test_remote_copy_between_cores_and_signals():
    src = """
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem xv: f32[8, 128];
    vmem inbox: f32[8, 128];
    sem s;
    sem send;
    sem recv;
    sem flag;
    let other = global_core(chip_id(), 1 - core_id());
    start copy(x, xv, s);
    wait copy(x, xv, s);
    xv = xv + f32(core_id());
    let h = copy(xv, inbox @ other, send, recv);
    start h;
    wait h;
    wait recv h;
    signal(flag @ other, 1);
    wait(flag, 1);
    barrier();
    if core_id() == 0 {
        start copy(inbox, y, s);
        wait copy(inbox, y, s);
    }
}
"""
    x = f32(8, 128)
    outs, _, _ = run(src, {"x": x}, mesh=(2, 1, 1), per_chip=True)
    same(x + np.float32(1.0), outs["y@0"])
    same(x + np.float32(1.0), outs["y@1"])


def test_vmem_over_capacity_is_a_compile_error():
    src = """
kernel k(x: hbm f32[8, 128]) {
    vmem big: f32[1024, 1024];
    vmem huge: bf16[2][1024, 1024];
    vmem small: f32[8, 128];
    sem s;
    start copy(x, small, s);
    wait copy(x, small, s);
}
"""
    with pytest.raises(SourceError) as info:
        compile_text(src, "t.mk", PROFILE)
    text = info.value.render()
    assert "needs 8,392,704 bytes of VMEM, 4,198,400 bytes more than the 4,194,304" in text
    assert "largest buffers: " in text and "VMEM 0x400000 huge bf16[1024,1024] x 2" in text
    # (at the first buffer past the profile: `big` fills VMEM exactly, `huge` goes over)
    assert text.startswith("t.mk:4:5: error:")
    assert "\nthis vmem buffer array of 2 brings the kernel to 8,388,608 bytes of VMEM; the profile 'test' " \
           "has 4,194,304\n" in text


def test_vmem_and_smem_both_over_capacity_are_named_in_one_error():
    src = "kernel k() {\n    vmem x: f32[100000, 1024];\n    smem m: i32[10000000];\n}\n"
    with pytest.raises(SourceError) as info:
        compile_text(src, "t.mk", "tpu-v7-like")
    text = info.value.render()
    assert "needs 409,600,000 bytes of VMEM" in text and ", and 40,000,000 bytes of SMEM" in text, text
    assert "SMEM 0x000000 m i32[10000000]" in text


@pytest.mark.parametrize("use, caret", [
    ("t[0] = BIG;", "             ^^^"),
    ("x = x * (BIG + 1);", "               ^^^^^^^"),
    ("var c: i32 = 3000000000;", "                   ^^^^^^^^^^"),
])
def test_a_constant_that_does_not_fit_int32_is_a_compile_error(use, caret):
    src = f"""const BIG = 1 << 40;
kernel k(y: hbm i32[8, 128]) {{
    smem t: i32[4];
    vmem x: i32[8, 128];
    {use}
}}
"""
    with pytest.raises(SourceError) as info:
        compile_text(src, "t.mk", PROFILE)
    lines = info.value.render().splitlines()
    assert lines[0].startswith("t.mk:5:") and "does not fit in 32 bits" in lines[0]
    assert lines[2] == caret


def test_global_core_of_a_core_the_chip_does_not_have_is_a_compile_error():
    src = """kernel k(y: hbm f32[8, 128]) {
    sem s;
    signal(s @ global_core(chip_id(), 2), 1);
    wait(s, 1);
}
"""
    with pytest.raises(SourceError) as info:
        compile_text(src, "t.mk", PROFILE)
    text = info.value.render()
    assert text.startswith("t.mk:3:39: error: global_core: core 2 does not exist")
    assert "has 2 cores per chip" in text


def test_many_scalar_variables_spill_to_smem():
    lets = "\n".join(f"    let v{i} = ps[{i % 8}] * {i + 1} + {i};" for i in range(40))
    total = " + ".join(f"v{i}" for i in range(40))
    src = f"""
kernel k(p: hbm i32[8], y: hbm i32[1]) {{
    smem ps: i32[8];
    smem out: i32[1];
    sem s;
    start copy(p, ps, s);
    wait copy(p, ps, s);
{lets}
    out[0] = {total};
    start copy(out, y, s);
    wait copy(out, y, s);
}}
"""
    p = np.arange(1, 9, dtype=np.int32)
    outs, _, prog = run(src, {"p": p})
    assert any("spilled" in line for line in prog.kernels["k"].allocation)
    same(np.array([sum(int(p[i % 8]) * (i + 1) + i for i in range(40))], np.int32), outs["y"])


def test_3d_hbm_slices_and_smem_copies():
    src = """
kernel k(w: hbm f32[3, 16, 200], ix: hbm i32[2, 4], y: hbm f32[2, 8, 100], yi: hbm i32[4]) {
    vmem a: f32[8, 100];
    vmem b: f32[2][8, 100];
    smem si: i32[2, 4];
    sem s;
    start copy(ix, si, s);
    wait copy(ix, si, s);
    let l = si[1, 2];
    start copy(w[l, 4:12, 50:150], a, s);
    wait copy(w[l, 4:12, 50:150], a, s);
    b[0] = a + 1.0;
    b[1] = a * 2.0;
    start copy(b[0], y[0], s);
    start copy(b[1], y[1], s);
    wait copy(b[0], y[0], s);
    wait copy(b[1], y[1], s);
    start copy(si[1], yi, s);
    wait copy(si[1], yi, s);
}
"""
    w = f32(3, 16, 200)
    ix = np.array([[0, 0, 0, 0], [5, 6, 2, 7]], np.int32)
    outs, _, _ = run(src, {"w": w, "ix": ix})
    a = w[2, 4:12, 50:150]
    same(np.stack([a + np.float32(1.0), a * np.float32(2.0)]), outs["y"])
    same(ix[1], outs["yi"])


def test_bool_let_and_mask_logic():
    body = "let m = (xv > 0.0) & !(xv > 1.0); yv = where(m | (xv < -1.0), xv, 0.0) + f32(m);"
    src = copy_kernel("k", "f32", (8, 130), body)
    x = f32(8, 130)
    outs, _, _ = run(src, {"x": x})
    m = (x > 0) & ~(x > 1)
    same(np.where(m | (x < -1), x, np.float32(0)) + m.astype(np.float32), outs["y"])


def test_source_map_and_listing():
    from mkemu.isa.listing import listing

    src = copy_kernel("k", "f32", (8, 128), "yv = xv + 1.0;")
    prog = compile_text(src, "t.mk", PROFILE)
    kernel = prog.kernels["k"]
    assert len(kernel.source_map) == len(kernel.code)
    assert all(span is not None and span.file == "t.mk" for span in kernel.source_map)
    text = listing(prog, stats=True)
    assert "; t.mk:9: yv = xv + 1.0;" in text
    assert "vadd.f32" in text and "VMEM 0x000000 xv f32[8,128] x 1" in text
    from mkemu.isa.asm import disassemble

    assert disassemble(int(kernel.code[-1])) == "halt"


def test_cli_run_and_asm(tmp_path, capsys):
    from mkemu.cli import main

    (tmp_path / "ref.py").write_text(
        "import numpy as np\n"
        "from mkemu.isa import numerics as nx\n"
        "def reference(inputs, *, chips, cores_per_chip):\n"
        "    return {f'y@{c}': nx.exp(inputs[f'x@{c}']) for c in range(chips)}\n")
    prog = tmp_path / "p.mk"
    prog.write_text('reference "ref.py:reference";\n' + copy_kernel("k", "f32", (8, 256), "yv = exp(xv);"))
    assert main(["run", str(prog), "--hw", "test", "--mesh", "1x1x1"]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["asm", str(prog), "--hw", "test", "--stats"]) == 0
    out = capsys.readouterr().out
    assert "vexp.f32" in out and "compile time" in out


def test_the_compiled_program_carries_its_params():
    text = ('param N = 256 in {128, 256} "columns";\n' + copy_kernel("k", "f32", (8, "N"), "yv = xv * 2.0;"))
    program = compile_text(text, "p.mk", params={"N": 128})
    (n,) = program.params
    assert (n.name, n.value, n.default, n.values, n.description) == ("N", 128, 256, (128, 256), "columns")
    assert program.buffer("y").shape == (8, 128)


def test_a_float_constant_past_float32_range_is_inf_without_a_numpy_warning():
    """A folded product past float32's range is +-inf, as the run-time multiply makes it
    (a literal past the range is an error: test_float_constants.py), and f32 max stored
    as bf16 rounds to inf; compiling it prints nothing: no numpy overflow warning leaks
    to the user."""
    import warnings

    import mkemu

    src = copy_kernel("k", "f32", (8, 128), "yv = xv * 0.0 + 3e38 * 2.0; yv[0:1, :] = -(3e38 * 2.0);")
    src_bf16 = copy_kernel("k", "bf16", (8, 128), "yv = 3.4028235e38;")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernel = mkemu.compile_source(src, "p.mk", hw="test", mesh="1x1x1")
        mkemu.compile_source(src_bf16, "q.mk", hw="test", mesh="1x1x1")
    outs, _, _ = run(src, {"x": f32(8, 128)})
    assert np.isposinf(outs["y"][1:]).all() and np.isneginf(outs["y"][0]).all()
    assert kernel is not None


@pytest.mark.parametrize("bounds, message", [
    ("0..3000000000", "the loop bound 3,000,000,000 does not fit in 32 bits"),
    ("-3000000000..5", "the loop bound -3,000,000,000 does not fit in 32 bits"),
])
def test_a_loop_bound_outside_int32_is_an_error(bounds, message):
    # (3,000,000,000 was emitted as li -1,294,967,296: the loop silently ran no times)
    src = f"kernel k() {{\n    smem m: i32[8];\n    for i in {bounds} {{\n        m[0] = i;\n    }}\n}}\n"
    with pytest.raises(SourceError) as info:
        compile_text(src, "t.mk", "tpu-v7-like")
    assert message in info.value.render() and "t.mk:3:" in info.value.render()


def test_a_loop_that_ends_exactly_at_the_int32_limit_compiles():
    src = "kernel k() {\n    smem m: i32[8];\n    for i in 1..2147483647 step 2 {\n        m[0] = i;\n    }\n}\n"
    compile_text(src, "t.mk", "tpu-v7-like")
