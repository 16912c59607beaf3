"""The IR interpreter against hand-written numpy: every construct, and the contract's
corner cases (reduction order and padding, argmax ties, RNE, wrapping, truncation)."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ir_interp import InterpError, run_program

from mkemu.dsl.frontend import load_program
from mkemu.errors import SourceError
from mkemu.isa import numerics as nx


def run(text: str, params=None, **inputs) -> dict[str, np.ndarray]:
    program = load_program("prog.mk", params, text=textwrap.dedent(text))
    return run_program(program, inputs)


def bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


def one_tile(body: str, inputs: dict[str, tuple[str, tuple[int, int]]], out: tuple[str, tuple[int, int]]) -> str:
    """A kernel loading each input into VMEM, running `body` and copying `vo` out."""
    params = ", ".join(f"{n}: hbm {d}[{r}, {c}]" for n, (d, (r, c)) in inputs.items())
    od, (orows, ocols) = out
    lines = [f"kernel k({params}, out: hbm {od}[{orows}, {ocols}]) {{"]
    lines += [f"    vmem {n}v: {d}[{r}, {c}];" for n, (d, (r, c)) in inputs.items()]
    lines += [f"    vmem vo: {od}[{orows}, {ocols}];", "    sem s;"]
    lines += [f"    start copy({n}, {n}v, s);\n    wait copy({n}, {n}v, s);" for n in inputs]
    lines += [f"    {line}" for line in textwrap.dedent(body).strip().splitlines()]
    lines += ["    start copy(vo, out, s);", "    wait copy(vo, out, s);", "}", "host {"]
    lines += [f"    input {n}: {d}[{r}, {c}];" for n, (d, (r, c)) in inputs.items()]
    lines += [f"    output out: {od}[{orows}, {ocols}];", f"    launch k({', '.join(inputs)}, out);", "}"]
    return "\n".join(lines)


def tile(body, out=("f32", (1, 1)), **inputs):
    """Run `body` over inputs given as name=(dtype, array); returns `out`."""
    decl = {n: (d, a.shape) for n, (d, a) in inputs.items()}
    return run(one_tile(body, decl, out), **{n: a for n, (d, a) in inputs.items()})["out"]


F = np.float32


def test_vector_add():
    a = np.arange(16, dtype=F).reshape(2, 8)
    got = tile("vo = xv + yv;", ("f32", (2, 8)), x=("f32", a), y=("f32", -2 * a))
    assert np.array_equal(got, -a)


def test_tiled_loop_with_dynamic_slices():
    text = """
        param N = 512;
        const TN = 128;
        kernel add(a: hbm f32[8, N], b: hbm f32[8, N], out: hbm f32[8, N]) {
            vmem xa: f32[8, TN];
            vmem xb: f32[8, TN];
            sem s;
            for k in 0..N / TN {
                start copy(a[:, k * TN +: TN], xa, s);
                start copy(b[:, k*TN:(k+1)*TN], xb, s);
                wait copy(a[:, k * TN +: TN], xa, s);
                wait copy(b[:, k * TN +: TN], xb, s);
                xa = xa * f32(k) + xb;
                start copy(xa, out[:, k * TN +: TN], s);
                wait copy(xa, out[:, k * TN +: TN], s);
            }
        }
        host { input a: f32[8, N]; input b: f32[8, N]; output out: f32[8, N]; launch add(a, b, out); }
    """
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 8, 512)).astype(F)
    k = np.repeat(np.arange(4, dtype=F), 128)
    assert np.array_equal(run(text, a=a, b=b)["out"], a * k + b)


def test_sum_pads_to_a_power_of_two_and_halves():
    # 3 columns are padded to 128: ((x0 + x2) + x1), not ((x0 + x1) + x2).
    x = np.array([[1e8, 1.0, -1e8]], F)
    assert tile("vo = sum(xv, axis=1);", x=("f32", x))[0, 0] == 1.0
    assert tile("vo = sum(xv, axis=0);", x=("f32", x.T.copy()))[0, 0] == 1.0
    assert ((F(1e8) + F(1.0)) + F(-1e8)) == 0.0  # the order that would be wrong


def test_sum_of_negative_zero_is_positive_zero():
    # The padding is +0.0, and -0 + +0 = +0.
    got = tile("vo = sum(xv, axis=1);", x=("f32", np.array([[-0.0]], F)))
    assert bits(got)[0, 0] == 0


def test_max_min_propagate_nan_and_order_zeros():
    x = np.array([[1.0, np.nan, 3.0], [-0.0, 0.0, -0.0]], F)
    got = tile("vo = max(xv, axis=1);", ("f32", (2, 1)), x=("f32", x))
    assert np.isnan(got[0, 0]) and bits(got)[1, 0] == 0
    got = tile("vo = min(xv, axis=1);", ("f32", (2, 1)), x=("f32", x))
    assert bits(got)[1, 0] == 0x80000000
    got = tile("vo = max(xv, 0.0);", ("f32", (2, 3)), x=("f32", x))  # max(-0, +0) = +0
    assert np.array_equal(bits(got)[1], [0, 0, 0])


def test_argmax_takes_the_first_maximum():
    x = np.array([[1.0, 3.0, 3.0, 2.0], [5.0, -1.0, 5.0, 7.0]], F)
    got = tile("vo = argmax(xv, axis=1);", ("i32", (2, 1)), x=("f32", x))
    assert got.ravel().tolist() == [1, 3]
    got = tile("vo = argmax(xv, axis=0);", ("i32", (1, 4)), x=("f32", x))
    assert got.ravel().tolist() == [1, 0, 1, 1]
    got = tile("vo = argmax(xv, axis=1);", ("i32", (1, 1)), x=("f32", np.array([[1.0, np.nan, np.nan]], F)))
    assert got[0, 0] == 1


def test_matmul_follows_the_matrix_unit():
    rng = np.random.default_rng(1)
    x = nx.bf16_round(rng.standard_normal((8, 40)).astype(F))
    w = nx.bf16_round(rng.standard_normal((40, 24)).astype(F))
    want = nx.mxu_matmul(np.zeros((8, 24), F), x, w)
    got = tile("vo = matmul(xv, wv);", ("f32", (8, 24)), x=("bf16", x), w=("bf16", w))
    assert np.array_equal(bits(got), bits(want))
    # Split along K: each piece is a matmul from zero, added to acc in float32.
    body = """
        var acc: f32[8, 24] = 0.0;
        for i in 0..4 {
            acc += matmul(xv[:, i * 10 +: 10], wv[i * 10 +: 10, :]);
        }
        vo = acc;
    """
    acc = np.zeros((8, 24), F)
    for i in range(4):
        acc = acc + nx.mxu_matmul(np.zeros((8, 24), F), x[:, i * 10:(i + 1) * 10], w[i * 10:(i + 1) * 10])
    got = tile(body, ("f32", (8, 24)), x=("bf16", x), w=("bf16", w))
    assert np.array_equal(bits(got), bits(acc))
    assert not np.array_equal(bits(got), bits(want))  # not the same bits as one matmul over all of K


def test_transpose_iota_where_and_tile_slices():
    x = np.arange(12, dtype=F).reshape(3, 4)
    got = tile("vo = transpose(xv);", ("f32", (4, 3)), x=("f32", x))
    assert np.array_equal(got, x.T)
    got = tile("vo = where(iota(1, 4) == 2, xv, -1.0);", ("f32", (3, 4)), x=("f32", x))
    assert np.array_equal(got, np.where(np.arange(4) == 2, x, -1))
    got = tile("vo = f32(iota(0, 3));", ("f32", (3, 1)), x=("f32", x))
    assert got.ravel().tolist() == [0, 1, 2]
    got = tile("let m = xv * 2.0;\nvo = m[1:3, 2:4];", ("f32", (2, 2)), x=("f32", x))
    assert np.array_equal(got, 2 * x[1:3, 2:4])


def test_conversions_round_and_truncate():
    halfway = F(1 + 2**-8)          # exactly between two bf16 values: ties to even (1.0)
    above = F(1 + 3 * 2**-8)        # rounds up to 1 + 2**-6
    x = np.array([[halfway, above, 3.4e38, -2.7]], F)  # 3.4e38: above the largest bf16
    got = tile("vo = f32(bf16(xv));", ("f32", (1, 4)), x=("f32", x))
    assert got[0, :2].tolist() == [1.0, 1 + 2**-6] and np.isinf(got[0, 2])
    got = tile("vo = i32(xv);", ("i32", (1, 4)), x=("f32", np.array([[2.7, -2.7, 3e9, np.nan]], F)))
    assert got.ravel().tolist() == [2, -2, 2**31 - 1, 0]
    got = tile("vo = f32(xv);", ("f32", (1, 2)), x=("i32", np.array([[2**24 + 1, 2**24 + 3]], np.int32)))
    assert got.ravel().tolist() == [2**24, 2**24 + 4]
    got = tile("vo = bf16(xv);", ("bf16", (1, 4)), x=("f32", x))
    assert got[0, :2].tolist() == [1.0, 1 + 2**-6]


def test_integers_wrap_and_shift():
    x = np.array([[2**31 - 1, -8, 1, -(2**31)]], np.int32)
    assert tile("vo = xv + 1;", ("i32", (1, 4)), x=("i32", x)).ravel().tolist() == [-(2**31), -7, 2, -(2**31) + 1]
    assert tile("vo = xv >> 1;", ("i32", (1, 4)), x=("i32", x)).ravel().tolist() == [2**30 - 1, -4, 0, -(2**30)]
    assert tile("vo = xv << 33;", ("i32", (1, 4)), x=("i32", x)).ravel().tolist() == [-2, -16, 2, 0]
    assert tile("vo = -xv;", ("i32", (1, 4)), x=("i32", x)).ravel().tolist() == [-(2**31) + 1, 8, -1, -(2**31)]
    # (integer tiles have no / or %: the front end refuses them, docs/language.md)
    for op in "/%":
        with pytest.raises(SourceError, match=f"'{op}' is not defined on an i32 tile"):
            tile(f"vo = xv {op} 3;", ("i32", (1, 4)), x=("i32", x))


def test_transcendentals_are_the_contract_functions():
    x = np.linspace(-5, 5, 24, dtype=F).reshape(2, 12)
    for op, fn in (("exp", nx.exp), ("sigmoid", nx.sigmoid), ("silu", nx.silu), ("tanh", nx.tanh),
                   ("rsqrt", nx.rsqrt), ("recip", nx.reciprocal), ("log", nx.log)):
        got = tile(f"vo = {op}(xv);", ("f32", (2, 12)), x=("f32", x))
        assert np.array_equal(bits(got), bits(fn(x))), op


def test_rmsnorm_through_a_function():
    text = """
        param D = 256;
        fn rmsnorm(x: vmem f32[8, D], w: vmem bf16[1, D], out: vmem f32[8, D]) {
            let ss = sum(x * x, axis=1);
            out = x * rsqrt(ss / D + 1e-5) * f32(w);
        }
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
        host { input x: f32[8, D]; input w: bf16[1, D]; output y: f32[8, D]; launch norm(x, w, y); }
    """
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 256)).astype(F)
    w = nx.bf16_round(rng.standard_normal((1, 256)).astype(F))
    ss = nx.tree_sum_f32(x * x, axis=1, keepdims=True)
    want = x * nx.rsqrt(ss / F(256) + F(1e-5)) * w
    assert np.array_equal(bits(run(text, x=x, w=w)["y"]), bits(want))


def test_smem_scalars_slots_and_control_flow():
    text = """
        kernel k(sel: hbm i32[4], w: hbm f32[4, 8, 128], out: hbm f32[8, 128], n: i32) {
            smem idx: i32[4];
            vmem buf: f32[2][8, 128];
            vmem acc: f32[8, 128];
            sem s;
            sem ws[2];
            var total: i32 = 0;
            start copy(sel, idx, s);
            wait copy(sel, idx, s);
            acc = 0.0;
            for t in 0..n {
                let e = idx[t];
                start copy(w[e], buf[t % 2], ws[t % 2]);
                wait copy(w[e], buf[t % 2], ws[t % 2]);
                if e % 2 == 0 {
                    acc += buf[t % 2];
                } else {
                    acc -= buf[t % 2];
                }
                total += e;
            }
            idx[0] = total;
            acc[0:1, 0:1] = f32(idx[0]);
            start copy(acc, out, s);
            wait copy(acc, out, s);
        }
        host {
            input sel: i32[4];
            input w: f32[4, 8, 128];
            output out: f32[8, 128];
            launch k(sel, w, out, 3);
        }
    """
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 8, 128)).astype(F)
    sel = np.array([2, 1, 3, 0], np.int32)
    want = ((np.zeros((8, 128), F) + w[2]) - w[1]) - w[3]
    want[0, 0] = 6.0
    assert np.array_equal(bits(run(text, sel=sel, w=w)["out"]), bits(want))


def test_host_launches_views_and_scratch():
    text = """
        param L = 3;
        kernel step(x: hbm f32[8, 128], w: hbm f32[8, 128], y: hbm f32[8, 128], l: i32) {
            vmem xv: f32[8, 128];
            vmem wv: f32[8, 128];
            sem s;
            start copy(x, xv, s);
            start copy(w, wv, s);
            wait copy(x, xv, s);
            wait copy(w, wv, s);
            xv = xv * wv + f32(l);
            start copy(xv, y, s);
            wait copy(xv, y, s);
        }
        host {
            input x: f32[8, 128];
            input w: f32[L, 8, 128];
            output y: f32[8, 128];
            hbm tmp: f32[8, 128];
            launch step(x, w[0], tmp, 0);
            for l in 1..L {
                launch step(tmp, w[l], tmp, l);
            }
            launch step(tmp, w[0], y, 10);
        }
    """
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 128)).astype(F)
    w = rng.standard_normal((3, 8, 128)).astype(F)
    tmp = x
    for l in range(3):
        tmp = tmp * w[l] + F(l)
    got = run(text, x=x, w=w)
    assert set(got) == {"x", "w", "y", "tmp"}
    assert np.array_equal(bits(got["tmp"]), bits(tmp))
    assert np.array_equal(bits(got["y"]), bits(tmp * w[0] + F(10)))


def test_spmd_builtins_see_the_chosen_core():
    text = """
        kernel k(out: hbm i32[1, 8]) {
            vmem o: i32[1, 8];
            sem s;
            o = 0;
            o[0:1, 0:1] = chip_id();
            o[0:1, 1:2] = core_id();
            o[0:1, 2:3] = num_chips();
            o[0:1, 3:4] = num_cores();
            o[0:1, 4:5] = chip_coord(1);
            o[0:1, 5:6] = mesh_dim(2);
            o[0:1, 6:7] = peer(0, 1);
            o[0:1, 7:8] = global_core(2, 1);
            start copy(o, out, s);
            wait copy(o, out, s);
        }
        host { output out: i32[1, 8]; launch k(out); }
    """
    program = load_program("prog.mk", text=textwrap.dedent(text))
    got = run_program(program, {}, chip=3, core=1, mesh_dims=(2, 2, 2), cores_per_chip=2)["out"]
    # chip 3 = (1, 1, 0); its peer along axis 0 wraps to chip 2, core 1 -> global core 5.
    assert got.ravel().tolist() == [3, 1, 8, 2, 1, 2, 5, 5]


def test_out_of_range_dynamic_slice_is_an_error():
    text = """
        kernel k(x: hbm f32[8, 256], n: i32) {
            vmem xv: f32[8, 128];
            sem s;
            start copy(x[:, n +: 128], xv, s);
            wait copy(x[:, n +: 128], xv, s);
        }
        host { input x: f32[8, 256]; launch k(x, 200); }
    """
    with pytest.raises(InterpError, match=r"reaches 200\.\.328 in dimension 1 of size 256"):
        run(text, x=np.zeros((8, 256), F))


EXAMPLES = Path(__file__).parents[2] / "programs" / "examples"


SINGLE_CORE_EXAMPLES = ["vector_add", "rmsnorm", "softmax", "matmul_single_buffered", "matmul_double_buffered"]


@pytest.mark.parametrize("name", SINGLE_CORE_EXAMPLES)
def test_examples_agree_with_their_numpy_references(name):
    """Two independent readings of the contract: the interpreter of the program text
    and the numpy reference the program names."""
    path = EXAMPLES / f"{name}.mk"
    program = load_program(path)
    rng = np.random.default_rng(5)
    inputs = {}
    for buf in program.host.inputs:
        x = rng.standard_normal(buf.shape).astype(F)
        inputs[buf.name] = nx.bf16_round(x) if buf.dtype == "bf16" else x
    got = run_program(program, inputs)
    ref_path = path.parent / program.reference.path
    spec = importlib.util.spec_from_file_location(f"example_ref_{path.stem}", ref_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    reference = getattr(module, program.reference.function)
    expected = reference({f"{k}@0": v for k, v in inputs.items()}, chips=1, cores_per_chip=1)
    assert expected
    for key, value in expected.items():
        name = key.partition("@")[0]
        assert np.array_equal(bits(value), bits(got[name])), name
