"""An audit of docs/language.md (Tutorial, Lexical structure, Top level, Tunable params,
Types, Structs, MXFP4 weights, Declarations, Views, Tile expressions, Scalars, Booleans
and select, Assignment): each test is one stated rule, example or quoted error, run
through the front end or the emulator and compared with numpy written from
docs/numerics.md."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mkemu.dsl.compiler import compile_text
from mkemu.emulator.machine import Machine
from mkemu.emulator.topology import Mesh
from mkemu.errors import EmulatorFault, SourceError
from mkemu.isa import numerics as nx
from mkemu.runner import from_storage, to_storage
from tests.dsl.test_compiler import PROFILE, run, same
from tests.dsl.test_errors import errors

DOC = Path(__file__).parents[2] / "docs" / "language.md"
RNG = np.random.default_rng(2024)


def mm(a, w):
    return nx.mxu_matmul(np.zeros((a.shape[0], w.shape[1]), np.float32), a, w)


def tile_kernel(body: str, ins: dict, outs: dict, pre: str = "") -> str:
    """A kernel copying HBM inputs `NAME_h` into VMEM `NAME`, running `body`, and
    copying VMEM outputs `NAME` out to HBM `NAME_o`."""
    def dims(s):
        return ", ".join(map(str, s))
    params = [f"{n}_h: hbm {d}[{dims(s)}]" for n, (d, s, _) in ins.items()]
    params += [f"{n}_o: hbm {d}[{dims(s)}]" for n, (d, s) in outs.items()]
    decls = [f"    vmem {n}: {d}[{dims(s)}];" for n, (d, s, _) in ins.items()]
    decls += [f"    vmem {n}: {d}[{dims(s)}];" for n, (d, s) in outs.items()]
    copies_in = [f"    start copy({n}_h, {n}, ds); wait copy({n}_h, {n}, ds);" for n in ins]
    copies_out = [f"    start copy({n}, {n}_o, ds); wait copy({n}, {n}_o, ds);" for n in outs]
    return (f"{pre}\nkernel kk({', '.join(params)}) {{\n" + "\n".join(decls) + "\n    sem ds;\n"
            + "\n".join(copies_in) + "\n" + textwrap.indent(textwrap.dedent(body), "    ") + "\n"
            + "\n".join(copies_out) + "\n}\n")


def run_tiles(body: str, ins: dict, outs: dict, pre: str = "") -> dict:
    o, _, _ = run(tile_kernel(body, ins, outs, pre), {f"{n}_h": a for n, (_, _, a) in ins.items()})
    return {n: o[f"{n}_o"] for n in outs}


def compile_error(text: str) -> str:
    with pytest.raises(SourceError) as info:
        compile_text(text, "t.mk", PROFILE, None)
    return info.value.render()


def scalars(exprs: list[str], vals: list[int], pre: str = "") -> list[int]:
    """Run-time scalar expressions over a, b, c, d (read from SMEM), stored to SMEM."""
    n = len(exprs)
    body = "\n".join(f"    o[{i}] = {e};" for i, e in enumerate(exprs))
    src = f"""
kernel kk(p: hbm i32[8], y: hbm i32[{n}]) {{
    smem s: i32[8];
    smem o: i32[{n}];
    sem ds;
    start copy(p, s, ds);
    wait copy(p, s, ds);
    let a = s[0]; let b = s[1]; let c = s[2]; let d = s[3];
    {pre}
{body}
    start copy(o, y, ds);
    wait copy(o, y, ds);
}}
"""
    v = np.zeros(8, np.int32)
    v[:len(vals)] = vals
    outs, _, _ = run(src, {"p": v})
    return [int(x) for x in outs["y"]]


# ------------------------------------------------------------------ tutorial


DOC_BLOCKS = dict(re.findall(r"```mk\n// file: (\S+)\n(.*?)```", DOC.read_text(), re.S))


def doc_program(tmp_path, name: str, params=None):
    for n, body in DOC_BLOCKS.items():
        (tmp_path / n).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / n).write_text(body)
    (tmp_path / "vector_add_ref.py").write_text(
        "def reference(inputs, *, chips, cores_per_chip):\n    return {'out': inputs['a@0'] + inputs['b@0']}\n")
    import mkemu
    return mkemu.compile_source((tmp_path / name).read_text(), filename=tmp_path / name, hw="test", mesh="1",
                                params=params or {})


def test_tutorial_vector_adds_run_bit_exact_and_n_can_be_set(tmp_path):
    k = doc_program(tmp_path, "vector_add.mk", {"N": 256})
    a, b = RNG.standard_normal((2, 8, 256)).astype(np.float32)
    r = k(a=a, b=b)
    same(a + b, r.outputs["out@0"])
    assert r.check() is None                      # the named reference agrees
    k = doc_program(tmp_path, "vector_add_tiled.mk", {"N": 1024})
    a, b = RNG.standard_normal((2, 8, 1024)).astype(np.float32)
    same(a + b, k(a=a, b=b).outputs["out@0"])


def test_tutorial_rmsnorm_matches_numpy(tmp_path):
    k = doc_program(tmp_path, "rmsnorm.mk")
    x = RNG.standard_normal((8, 512)).astype(np.float32)
    w = nx.bf16_round(RNG.standard_normal((1, 512)).astype(np.float32))
    ss = nx.tree_sum_f32(x * x, axis=1, keepdims=True)
    same(x * nx.rsqrt(ss / np.float32(512) + np.float32(1e-5)) * w, k(x=x, w=w).outputs["y@0"])


@pytest.mark.parametrize("name", ["matmul_single_buffered.mk", "matmul_double_buffered.mk", "matmul_pipelined.mk"])
def test_tutorial_matmuls_match_the_matrix_unit_contract(tmp_path, name):
    k = doc_program(tmp_path, name, {"K": 512, "N": 512})
    x = nx.bf16_round(RNG.standard_normal((8, 512)).astype(np.float32))
    w = nx.bf16_round(RNG.standard_normal((512, 512)).astype(np.float32))
    y = k(x=x, w=w).outputs["y@0"]
    if name == "matmul_pipelined.mk":
        same(mm(x, w), y)                         # one matmul over all of K
    else:                                         # acc += per K tile: a sum of partial products
        acc = np.zeros((8, 512), np.float32)
        for k0 in range(0, 512, 256):
            acc = acc + mm(x[:, k0:k0 + 256], w[k0:k0 + 256])
        same(acc, y)


def test_tutorial_expert_mxfp4_multiplies_the_decoded_expert(tmp_path):
    k = doc_program(tmp_path, "expert_mxfp4.mk", {"E": 2, "K": 64, "N": 512})
    sel = np.array([1, 0, 0, 0, 0, 0, 0, 0], np.int32)
    x = nx.bf16_round(RNG.standard_normal((8, 64)).astype(np.float32))
    w = RNG.standard_normal((2, 64, 512)).astype(np.float32)
    r = k(sel=sel, x=x, w=w)
    wd = nx.mxfp4_from_bytes(nx.mxfp4_to_bytes(w), w.shape)
    same(mm(x, wd[1]), r.outputs["y@0"])
    with pytest.raises(EmulatorFault, match=r"index 2 of dimension 0 of the values of 'w'"):
        k(sel=np.array([2, 0, 0, 0, 0, 0, 0, 0], np.int32), x=x, w=w)


# ---------------------------------------------------------- lexical structure


@pytest.mark.parametrize("literal, bits", [
    ("3.40282356e38", 0x7F7FFFFF),                       # below the midpoint to 2^128: the largest f32
    ("1e-45", 0x00000001), ("7e-46", 0x00000000), ("7.1e-46", 0x00000001),
    ("16777217.0", 0x4B800000),                          # a tie: to even
    # just above the tie 1 + 2^-24: rounded once it is 1 + 2^-23 (through float64 it would tie to 1.0)
    ("1.000000059604644775390625001", 0x3F800001),
    ("1.000000059604644775390625", 0x3F800000),
    ("0.1", 0x3DCCCCCD), ("2.0e3", 0x44FA0000), ("1E3", 0x447A0000),
])
def test_a_float_literal_is_the_nearest_f32_rounded_once(literal, bits):
    x = np.zeros((8, 128), np.float32)
    y = run_tiles(f"y = {literal};", {"a": ("f32", (8, 128), x)}, {"y": ("f32", (8, 128))})["y"]
    assert int(y[0, 0].view(np.uint32)) == bits


@pytest.mark.parametrize("literal", ["3.5e38", "1e400", "3.4028236e38", "340282356779733661637539395458142568448.0"])
def test_a_float_literal_past_the_f32_range_is_an_error(literal):
    out = compile_error(tile_kernel(f"y = {literal};", {}, {"y": ("f32", (8, 128))}))
    assert (f"error: float literal {literal} is beyond the f32 range (the largest f32 is 3.4028235e38); "
            "write inf for infinity") in out


def test_integer_literal_forms_and_inf():
    z = np.zeros((8, 128), np.float32)
    got = run_tiles("n = iota(1, 128) * 0 + 1_000_000 + 0xff; p = z + inf; q = z - inf; r = -inf + z;",
                    {"z": ("f32", (8, 128), z)},
                    {"n": ("i32", (8, 128)), "p": ("f32", (8, 128)), "q": ("f32", (8, 128)), "r": ("f32", (8, 128))})
    assert (got["n"] == 1_000_255).all()
    assert np.isposinf(got["p"]).all() and np.isneginf(got["q"]).all() and np.isneginf(got["r"]).all()


def test_contextual_keywords_are_names_elsewhere():
    z = np.zeros((8, 128), np.float32)
    body = """\
var t: i32 = 0;
for step in 0..3 { t += step; }
let in = 1; let depth = 2; let via = 3; let part = 4; let recv = 5; let input = 6; let output = 7;
y = z + f32(t * 100 + in + depth + via + part + recv + input + output);
"""
    y = run_tiles(body, {"z": ("f32", (8, 128), z)}, {"y": ("f32", (8, 128))})["y"]
    assert (y == 328).all()


def test_operator_precedence_at_run_time_and_compile_time():
    exprs = ["i32(a & 1 == 0)", "a - b - c", "a / b / c", "a << 1 + 1", "a | b ^ c & d", "-a * b", "a % b * c",
             "i32(!(a < b) || a == b && c != d)", "a >> b - 1"]
    want = [1, 1, 1, 24, 7, -12, 0, 1, 3]
    assert scalars(exprs, [6, 2, 3, 5]) == want
    consts = [re.sub(r"\b[a-d]\b", lambda m: {"a": "6", "b": "2", "c": "3", "d": "5"}[m.group()], e) for e in exprs]
    pre = "\n".join(f"const C{i} = {e};" for i, e in enumerate(consts))
    src = pre + "\nkernel kk(y: hbm i32[9]) {\n    smem o: i32[9];\n    sem ds;\n" + "".join(
        f"    o[{i}] = C{i};\n" for i in range(9)) + "    start copy(o, y, ds);\n    wait copy(o, y, ds);\n}\n"
    assert [int(v) for v in run(src, {})[0]["y"]] == want
    assert "unexpected '<'" in compile_error(tile_kernel("let q = 1 < 2 < 3;", {}, {}))


# ------------------------------------------------------------------ top level


def test_params_and_consts_report_their_errors_before_a_failed_top_level_assert(tmp_path, monkeypatch):
    src = """\
param D = 100;
assert D % 128 == 0, "D must be a multiple of 128";
assert D > 0;
const Z = nope;
kernel k(a: hbm f32[8, 128]) { let q = zz; }
"""
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:2:1: error: assertion failed: D must be a multiple of 128\n"
        "  assert D % 128 == 0, \"D must be a multiple of 128\";\n"
        "  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "prog.mk:4:11: error: unknown name 'nope'\n"
        "  const Z = nope;\n"
        "            ^^^^"
    )


def test_compile_time_expressions_truncate_and_mix_bools_only_through_select():
    pre = "const A = B * 2;\nparam B = 3;\nconst SPLIT = B > 2;\n"   # used before its definition
    exprs = ["A + B", "min(A, B)", "max(A, -B)", "select(SPLIT, 1, 2)", "i32(SPLIT)", "-7 / 2", "-7 % 2", "7 % -2",
             "5 ^ 3", "-8 >> 1"]
    src = pre + "".join(f"const C{i} = {e};\n" for i, e in enumerate(exprs)) + (
        f"kernel kk(y: hbm i32[{len(exprs)}]) {{\n    smem o: i32[{len(exprs)}];\n    sem ds;\n"
        + "".join(f"    o[{i}] = C{i};\n" for i in range(len(exprs)))
        + "    start copy(o, y, ds);\n    wait copy(o, y, ds);\n}\n")
    assert [int(v) for v in run(src, {})[0]["y"]] == [9, 3, 6, 1, 1, -3, -1, 1, 6, -4]


# -------------------------------------------------------------- tunable params


def test_tunable_param_examples_and_their_errors(tmp_path, monkeypatch):
    src = """\
param WR = 12 in {4, 6, 8, 12} "slots of the weight ring";
param TN = 256 in 128..1025 step 128 "N tile";   // 128, 256, ..., 1024
param BIG = 0 in {0, (1 << 21), N} "bytes";      // literals, names, (expressions)
param N = 1024 "columns";                        // a description alone is fine too
param NEG = -1 in {-1, 0, 1};
kernel k(a: hbm f32[8, 128]) { }
"""
    from mkemu.dsl.frontend import load_program
    (tmp_path / "ok.mk").write_text(src)
    info = {p.name: p for p in load_program(tmp_path / "ok.mk").param_info}
    assert info["TN"].values == (128, 256, 384, 512, 640, 768, 896, 1024)
    assert info["BIG"].values == (0, 2097152, 1024) and info["N"].values is None
    assert info["WR"].description == "slots of the weight ring" and info["NEG"].value == -1
    assert errors(src, tmp_path, monkeypatch, params={"WR": 5}) == (
        "prog.mk:1:15: error: WR = 5 (set from outside) is not one of its declared values: 4, 6, 8, 12\n"
        "  param WR = 12 in {4, 6, 8, 12} \"slots of the weight ring\";\n"
        "                ^^^^^^^^^^^^^^^^"
    )
    bad = src.replace("{4, 6, 8, 12}", "{4, 6, 4}").replace("128..1025 step 128", "5..5")
    out = errors(bad, tmp_path, monkeypatch)
    assert "error: the value 4 is listed twice" in out
    assert "error: the range 5..5 holds no value (its end is excluded, as in `for`)" in out
    assert "error: a param takes at most 4096 values; this range holds 5000" in errors(
        src.replace("128..1025 step 128", "0..5000"), tmp_path, monkeypatch)


# ---------------------------------------------------------------------- types


@pytest.mark.parametrize("decl, message", [
    (", w: hbm f32[2, 2, 8, 128]", "hbm arrays can have at most 3 dimension(s), got 4"),
    (", w: hbm f32[0, 128]", "dimensions must be positive, got 0"),
    ("vmem x: f32[2, 8, 128];", "vmem arrays can have at most 2 dimension(s), got 3"),
    ("smem x: i32[2, 3, 4];", "smem arrays can have at most 2 dimension(s), got 3"),
    ("smem x: f32[4];", "an smem buffer's dtype is i32 (SMEM holds i32 only), not f32"),
    ("vmem x: f32[0][8, 128];", "count must be positive, got 0"),
    ("smem s: i32[2]; let n = s[0]; vmem x: f32[n, 128];", "a dimension must be a compile-time integer"),
    (", n: f32", "dtype 'f32' is not allowed here (expected i32, bool)"),
])
def test_type_limits(tmp_path, monkeypatch, decl, message):
    params, body = (decl, "") if decl.startswith(",") else ("", decl)
    src = f"kernel k(a: hbm f32[8, 128]{params}) {{\n    {body}\n}}\n"
    assert f"error: {message}" in errors(src, tmp_path, monkeypatch)


def test_scalar_vars_default_to_zero_and_false_each_time_their_block_runs():
    assert scalars(["o[0]", "o[1]", "o[2]", "o[3]"], [], pre=(
        "for i in 0..3 { var q: i32; q += i + 1; o[i] = q; } var f: bool; o[3] = i32(f);")) == [1, 2, 3, 0]


# -------------------------------------------------------------------- structs


def test_struct_example_runs_and_vmem_bytes_counts_the_laid_out_slots():
    src = """
param D = 128;
struct Mlp { w1: hbm bf16[D, D]; w2: hbm bf16[D, D]; }
struct Slots { wv: vmem bf16[2][D, D]; xv: vmem f32[8, D]; ws: sem[2]; ix: smem i32[4]; }
fn mlp(m: Mlp, b: Slots, x: hbm f32[8, D], y: hbm f32[8, D]) {
    start copy(m.w1, b.wv[0], b.ws[0]);
    start copy(m.w2[0:128, :], b.wv[1], b.ws[1]);
    start copy(x, b.xv, b.ws[0]);
    wait copy(m.w1, b.wv[0], b.ws[0]);
    wait copy(m.w2, b.wv[1], b.ws[1]);
    wait copy(x, b.xv, b.ws[0]);
    b.xv = matmul(bf16(b.xv), b.wv[0]);
    b.xv = matmul(bf16(b.xv), b.wv[1]);
    start copy(b.xv, y, b.ws[0]);
    wait copy(b.xv, y, b.ws[0]);
}
kernel run(m: Mlp, x: hbm f32[8, D], y: hbm f32[8, D]) {
    let b = Slots();
    mlp(m, b, x, y);
}
assert vmem_bytes(Slots) == 2 * 128 * 256 + 8 * 512, "SMEM members and semaphores are not counted";
host {
    input m: Mlp;
    input x: f32[8, D];
    output y: f32[8, D];
    launch run(m, x, y);
}
"""
    w1, w2 = (nx.bf16_round(RNG.standard_normal((128, 128)).astype(np.float32)) for _ in range(2))
    x = RNG.standard_normal((8, 128)).astype(np.float32)
    outs, _, program = run(src, {"w1": w1, "w2": w2, "x": x})
    same(mm(nx.bf16_round(mm(nx.bf16_round(x), w1)), w2), outs["y"])
    assert [b.name for b in program.buffers] == ["w1", "w2", "x", "y"]     # named like the members


# -------------------------------------------------------------- MXFP4 weights


def test_mxfp4_special_scales_decode_as_numerics_states():
    k_, n_ = 64, 256
    src = f"""
kernel kk(w: hbm mxfp4[{k_}, {n_}], x: hbm bf16[8, {k_}], y: hbm f32[8, {n_}]) {{
    vmem wv: mxfp4[{k_}, {n_}]; vmem xv: bf16[8, {k_}]; vmem yv: f32[8, {n_}];
    sem s;
    start copy(w, wv, s); start copy(x, xv, s); wait copy(w, wv, s); wait copy(x, xv, s);
    yv = matmul(xv, wv);
    start copy(yv, y, s); wait copy(yv, y, s);
}}
"""
    values = RNG.integers(0, 256, (k_, n_ // 2)).astype(np.uint8)
    scales = RNG.integers(120, 135, (k_ // 32, n_)).astype(np.uint8)
    scales[0, :8] = [253, 254, 255, 0, 1, 252, 253, 254]
    x = nx.bf16_round(RNG.standard_normal((8, k_)).astype(np.float32))
    machine = Machine(PROFILE, Mesh((1, 1, 1)))
    machine.load(compile_text(src, "t.mk", PROFILE, None))
    machine.write_buffer(0, "w", np.concatenate([values.ravel(), scales.ravel()]))
    machine.write_buffer(0, "x", to_storage(x, "bf16"))
    machine.run()
    wd = nx.mxfp4_decode(values, scales)
    assert np.isinf(wd).any() and np.isnan(wd).any()
    finite = wd[np.isfinite(wd)]
    assert np.array_equal(nx.bf16_round(finite), finite)            # every finite weight is a bf16 value
    same(mm(x, wd), from_storage(machine.read_buffer(0, "y"), "f32"))


def test_mxfp4_copies_hbm_vmem_vmem_hbm_with_run_time_offsets():
    src = """
const TK = 64;
kernel kk(w: hbm mxfp4[2, 128, 256], x: hbm bf16[8, 64], o: hbm mxfp4[2, 128, 256], y: hbm f32[2, 8, 128]) {
    vmem a: mxfp4[2][128, 256];
    vmem b: mxfp4[64, 128];
    vmem xv: bf16[8, 64];
    vmem yv: f32[8, 128];
    sem s;
    start copy(x, xv, s); wait copy(x, xv, s);
    for e in 0..2 {
        start copy(w[e], a[e], s); wait copy(w[e], a[e], s);
        start copy(a[e], o[1 - e], s); wait copy(a[e], o[1 - e], s);
        start copy(a[e][TK +: TK, 64 + 2 * e +: 128], b, s);
        wait copy(a[e][TK +: TK, 64 + 2 * e +: 128], b, s);
        yv = matmul(xv, b);
        start copy(yv, y[e], s); wait copy(yv, y[e], s);
    }
}
host {
    input w: mxfp4[2, 128, 256];
    input x: bf16[8, 64];
    output o: mxfp4[2, 128, 256];
    output y: f32[2, 8, 128];
    launch kk(w, x, o, y);
}
"""
    import mkemu
    w = RNG.standard_normal((2, 128, 256)).astype(np.float32)
    x = nx.bf16_round(RNG.standard_normal((8, 64)).astype(np.float32))
    r = mkemu.compile_source(src, filename="mx.mk", hw="test", mesh="1")(w=w, x=x)
    wd = nx.mxfp4_from_bytes(nx.mxfp4_to_bytes(w), w.shape)
    same(wd[::-1], r.outputs["o@0"])
    same(np.stack([mm(x, wd[e][64:128, 64 + 2 * e:192 + 2 * e]) for e in range(2)]), r.outputs["y@0"])


MX = "kernel kk(w: hbm mxfp4[2, 64, 256], x: hbm bf16[8, 64], y: hbm f32[8, 256]) {{\n" \
     "    vmem wv: mxfp4[64, 256]; vmem xv: bf16[8, 64]; vmem yv: f32[8, 256];\n    sem s;\n    {}\n}}\n"


@pytest.mark.parametrize("body, message", [
    ("yv = f32(wv);", "'wv' is mxfp4 (matrix-unit weights): it can only be copied or be the right operand of "
                      "matmul(x, wv)"),
    ("vmem w2: bf16[256, 64]; vmem o: f32[64, 64]; o = matmul(wv, w2);",
     "'wv' is mxfp4 (matrix-unit weights): it can only be copied or be the right operand of matmul(x, wv)"),
    ("wv[0:32, :] = 1.0;", "'wv' is mxfp4 (matrix-unit weights): only a DMA (copy) writes it"),
    ("yv = matmul(xv, w[0]);", "matmul reads mxfp4 weights from VMEM"),
    ("vmem xf: f32[8, 64]; yv = matmul(xf, wv);", "matmul with mxfp4 weights takes a bf16 left operand"),
    ("start copy(w[0, 16:48, :], wv[0:32, :], s);", "must start its rows at a multiple of 32"),
    ("start copy(w[0, :, 1:3], wv[:, 0:2], s);", "must start its columns at a multiple of 2"),
    ("for i in 0..2 { start copy(w[0, i +: 32, :], wv[0:32, :], s); wait copy(w[0, i +: 32, :], wv[0:32, :], s); }",
     "it starts at an offset not known to be a multiple of 32"),
    ("sem r; start copy(wv, wv @ 1, s, r); wait copy(wv, wv @ 1, s, r);", "a remote copy of mxfp4 is not supported"),
])
def test_mxfp4_misuse_is_reported(tmp_path, monkeypatch, body, message):
    assert message in errors(MX.format(body), tmp_path, monkeypatch)


def test_dtype_consts_and_absent_members(tmp_path, monkeypatch):
    pre = """\
param MX = 0 in {0, 1} "weights stored as MXFP4";
const WT = select(MX == 1, mxfp4, bf16);
const NX = select(MX == 1, 2, 0);
struct Ring { b: vmem bf16[2][64, 128]; bs: sem[2]; x: vmem mxfp4[NX][64, 128]; xs: sem[NX]; }
"""
    ok = pre + "kernel k(a: hbm WT[64, 128]) { let r = Ring(); if MX == 1 { sem s; start copy(a, r.x[0], s); " \
               "wait copy(a, r.x[0], s); } }\nconst VB = vmem_bytes(Ring);\n"
    from mkemu.dsl.frontend import load_program
    (tmp_path / "ok.mk").write_text(ok)
    assert load_program(tmp_path / "ok.mk").consts["VB"] == 2 * 64 * 256
    assert load_program(tmp_path / "ok.mk", {"MX": 1}).consts["VB"] == 2 * 64 * 256 + 2 * 4608
    out = errors(pre + "kernel k(a: hbm f32[8, 128]) { let r = Ring(); sem s; start copy(r.x[0], r.b[0], s); }",
                 tmp_path, monkeypatch)
    assert "error: member 'x' of struct 'Ring' has a count of 0 here: it is absent" in out
    assert "error: param 'T' must be an integer" in errors("param T = bf16;\n", tmp_path, monkeypatch)
    assert "error: 'T' names a dtype (bf16), not a value" in errors(
        "const T = bf16;\nconst U = T + 1;\n", tmp_path, monkeypatch)


# ------------------------------------------------------ views: indexing, slicing


def test_view_forms_read_and_write_the_numpy_windows():
    x = np.arange(16 * 512, dtype=np.float32).reshape(16, 512)
    body = """\
y = 0.0;
y[0:8, 128:256] = x[8:16, 0:128];
for k in 0..2 { y[8:16, k*128:(k+1)*128] = x[0:8, (3-k)*128 +: 128]; }
for e in 0..3 { y[e:e+2, 300 + e*7:300 + e*7+100] = x[e:e+2, e*7:e*7+100] + 1.0; }
y[12] = x[5];
y[13, 10:20] = x[6, 0:10];
y[:, 500:] = x[:, :12];
y[1, 2] = x[3, 4];
"""
    want = np.zeros_like(x)
    want[0:8, 128:256] = x[8:16, 0:128]
    for k in range(2):
        want[8:16, k * 128:(k + 1) * 128] = x[0:8, (3 - k) * 128:(4 - k) * 128]
    for e in range(3):
        want[e:e + 2, 300 + e * 7:400 + e * 7] = x[e:e + 2, e * 7:e * 7 + 100] + 1
    want[12] = x[5]
    want[13, 10:20] = x[6, 0:10]
    want[:, 500:] = x[:, :12]
    want[1, 2] = x[3, 4]
    same(want, run_tiles(body, {"x": ("f32", (16, 512), x)}, {"y": ("f32", (16, 512))})["y"])


@pytest.mark.parametrize("body, ok", [
    ("for i in 0..8 { yv[i + 1] = xv[i]; }", False),
    ("for i in 0..8 { if i + 1 < 8 { yv[i + 1] = xv[i]; } }", True),
    ("for i in 0..8 { if 2 * i < 7 { yv[2 * i + 1] = xv[i]; } }", True),
    ("for i in 0..8 { if 8 - i > 1 { yv[i + 1] = xv[i]; } }", True),
    ("for i in 0..8 { if i != 0 { yv[i - 1] = xv[i]; } }", True),
    ("for i in 0..8 { let k = 2 * i + 1; if k < 8 { yv[k] = xv[i]; yv[i + 4] = xv[i]; } }", True),
    ("for i in 0..8 { let k = 2 * i + 1; if k < 8 { yv[i + 5] = xv[i]; } }", False),
    ("for i in 0..8 { if i > 0 && i < 7 { yv[i + 1] = xv[i - 1]; } }", True),
    ("for i in 0..8 { if !(i >= 7) { yv[i + 1] = xv[i]; } }", True),
    ("for i in 0..8 { if i == 0 || i >= 7 { } else { yv[i + 1] = xv[i - 1]; } }", True),
    ("for i in 0..8 { if i < 7 { yv[i + 1] = xv[i]; } else { yv[i + 1] = xv[i]; } }", False),
    ("smem m: i32[8, 8]; for i in 0..8 { for j in 0..8 { m[i, j] = select(j + 1 < 8, m[i, j + 1], 0); } }", True),
    ("smem m: i32[8, 8]; for i in 0..8 { for j in 0..8 { m[i, j] = select(j + 1 < 8, 0, m[i, j + 1]); } }", False),
    ("for i in 0..7 step 3 { yv[i + 2] = xv[i]; }", False),
])
def test_static_bounds_are_narrowed_by_enclosing_conditions(body, ok):
    src = tile_kernel(body, {"xv": ("f32", (8, 128), None)}, {"yv": ("f32", (8, 128))})
    if ok:
        compile_text(src, "t.mk", PROFILE, None)
    else:
        assert "is out of range for dimension" in compile_error(src)


RT = """
kernel kk(p: hbm i32[8], y: hbm f32[16, 512]) {{
    smem s: i32[8];
    vmem x: f32[16, 512];
    vmem b: f32[2][16, 512];
    sem ds;
    start copy(p, s, ds);
    wait copy(p, s, ds);
    let v = s[0];
    let w = s[1];
    x = 0.0;
    {}
    start copy(x, y, ds);
    wait copy(x, y, ds);
}}
"""


@pytest.mark.parametrize("body, vals, fault", [
    ("x[0:8, v +: 128] = 1.0;", [400], "index 400 of dimension 1 of 'x' (f32[16, 512]) is outside 0..384: a window "
                                       "of 128 from it would leave the dimension"),
    ("x[0:8, v +: 128] = 1.0;", [384], None),
    ("x[2*v + 3 +: 2, 0:128] = 1.0;", [6], "index 2*v + 3 = 15 (v = 6) of dimension 0 of 'x' (f32[16, 512]) is "
                                          "outside 0..14"),
    ("x[v, 0:128] = 1.0;", [16], "index 16 of dimension 0 of 'x' (f32[16, 512]) is outside 0..15"),
    ("let u = x[4:12, :]; u[v +: 2, :] = 1.0;", [-4], None),          # checked against x: r in -4..10
    ("let u = x[4:12, :]; u[v +: 2, :] = 1.0;", [10], None),
    ("let u = x[4:12, :]; u[v +: 2, :] = 1.0;", [11], "index v + 4 = 15 (v = 11)"),
    ("b[v] = 1.0;", [2], "slot 2 of 'b' (f32[2][16, 512]) is outside 0..1"),
    ("x[0:8, v + w +: 128] = 1.0;", [500, 100], None),                # several terms: per buffer only
    ("x[8:16, v + w +: 128] = 1.0;", [400, 100], "is outside buffer 'x'"),
])
def test_run_time_starts_are_checked_per_dimension_or_per_buffer(body, vals, fault):
    p = np.zeros(8, np.int32)
    p[:len(vals)] = vals
    if fault is None:
        run(RT.format(body), {"p": p})
    else:
        with pytest.raises(EmulatorFault, match=re.escape(fault)):
            run(RT.format(body), {"p": p})


def test_a_window_longer_than_its_dimension_and_run_time_lengths_are_compile_errors():
    assert "a window of 1024 is longer than dimension 1 of 'x' (size 512): no start fits" in compile_error(
        RT.format("x[0:8, v +: 1024] = 1.0;"))
    assert "slice length must be known at compile time; write start +: LENGTH" in compile_error(
        RT.format("x[0:8, v:w] = 1.0;"))


def test_a_window_longer_than_its_dimension_is_refused_when_the_view_is_sliced_again():
    # It used to compile when bound with let (or sliced again at once) and only the
    # outer view was used: the back end saw a window of 128, not 600.
    for body in ("let u = x[0:1, v +: 600];\n    u[0:1, 0:128] = 1.0;", "x[0:1, v +: 600][0:1, 0:128] = 1.0;"):
        assert "a window of 600 is longer than dimension 1 of 'x' (size 512): no start fits" in compile_error(
            RT.format(body))


def test_a_run_time_window_in_a_view_of_a_view_may_be_longer_than_the_view_but_not_the_buffer():
    # "A view indexed again is checked against the buffer's dimension, not the outer view's"
    p = np.array([-4, 0, 0, 0, 0, 0, 0, 0], np.int32)
    out = run(RT.format("let u = x[4:12, :];\n    u[v +: 10, 0:128] = 1.0;"), {"p": p})[0]["y"]
    assert out[:10, :128].min() == 1.0 and out[10:].max() == 0.0
    assert "a window of 17 is longer than dimension 0 of 'x' (size 16): no start fits" in compile_error(
        RT.format("let u = x[4:12, :];\n    u[v +: 17, :] = 1.0;"))


# ------------------------------------------------------------ tile expressions


def test_tile_operators_and_functions_on_special_values():
    sp = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.5, -1.5, 3e9, -3e9, 2.5, -2.5, 1e-45, -1e-45,
                   3.4028235e38, -3.4028235e38, 0.49999997] * 16, np.float32).reshape(8, 32)
    sq = np.roll(sp, 3, axis=1)
    ie = np.array([-2**31, 2**31 - 1, 0, -1, 1, 7, -7, 2**24 + 1, 2**24 + 3, 2**24 + 2**16 + 1, -(2**24 + 1), 100,
                   2**30, -2**30, 5, 6] * 16, np.int32).reshape(8, 32)
    ib = np.roll(ie, 5, axis=1)
    ins = {"a": ("f32", (8, 32), sp), "b": ("f32", (8, 32), sq), "ia": ("i32", (8, 32), ie), "ib": ("i32", (8, 32), ib)}
    with np.errstate(all="ignore"):
        cases = {
            "-a": ("f32", -sp), "abs(a)": ("f32", np.abs(sp)), "max(a, b)": ("f32", nx.f32_max(sp, sq)),
            "min(a, b)": ("f32", nx.f32_min(sp, sq)), "a / b": ("f32", sp / sq), "a * b": ("f32", sp * sq),
            "i32(a)": ("i32", nx.f32_to_i32(sp)), "f32(ia)": ("f32", nx.i32_to_f32(ie)),
            "bf16(a)": ("bf16", nx.bf16_round(sp)), "bf16(ia)": ("bf16", nx.bf16_round(nx.i32_to_f32(ie))),
            "-ia": ("i32", nx.i32_wrap(-ie.astype(np.int64))), "abs(ia)": ("i32", nx.i32_wrap(np.abs(ie.astype(np.int64)))),
            "ia * 3": ("i32", nx.i32_wrap(ie.astype(np.int64) * 3)), "ia << ib": ("i32", nx.i32_wrap(
                ie.astype(np.int64) << (ib & 31))), "ia >> ib": ("i32", ie >> (ib & 31)),
            "ia & ib": ("i32", ie & ib), "ia | ib": ("i32", ie | ib), "ia ^ ib": ("i32", ie ^ ib),
            "max(ia, ib)": ("i32", np.maximum(ie, ib)), "min(ia, 7)": ("i32", np.minimum(ie, 7)),
            "exp(a)": ("f32", nx.exp(sp)), "log(a)": ("f32", nx.log(sp)), "exp2(a)": ("f32", nx.exp2(sp)),
            "log2(a)": ("f32", nx.log2(sp)), "sqrt(a)": ("f32", nx.sqrt(sp)), "rsqrt(a)": ("f32", nx.rsqrt(sp)),
            "recip(a)": ("f32", nx.reciprocal(sp)), "sigmoid(a)": ("f32", nx.sigmoid(sp)),
            "tanh(a)": ("f32", nx.tanh(sp)), "silu(a)": ("f32", nx.silu(sp)),
            "f32(a != b)": ("f32", (sp != sq).astype(np.float32)), "i32(a >= b)": ("i32", (sp >= sq).astype(np.int32)),
            "f32(!(a < b) & (a == a) | (b > 1.0) ^ (a < 0.0))": ("f32", ((~(sp < sq) & (sp == sp)) | (
                (sq > 1) ^ (sp < 0))).astype(np.float32)),
            "where(a > b, a, -1.0)": ("f32", np.where(sp > sq, sp, np.float32(-1))),
            "where(ia >= ib, 1, 2)": ("i32", np.where(ie >= ib, 1, 2).astype(np.int32)),
        }
    names = {e: f"o{i}" for i, e in enumerate(cases)}
    got = run_tiles("\n".join(f"{names[e]} = {e};" for e in cases), ins,
                    {names[e]: (d, (8, 32)) for e, (d, _) in cases.items()})
    for e, (_, want) in cases.items():
        same(want, got[names[e]])


def test_broadcasting_literals_and_run_time_scalars():
    a = RNG.standard_normal((8, 256)).astype(np.float32)
    ins = {"a": ("f32", (8, 256), a), "p": ("i32", (8,), np.array([5, -3, 0, 0, 0, 0, 0, 0], np.int32))}
    body = """\
smem s: i32[8];
start copy(p_h, s, ds); wait copy(p_h, s, ds);
let n = s[0];
let e = s[1];
y1 = a[0:1, :] + a[:, 7:8];
y2 = a * 2 + 1e-5 - a / 256;
y3 = a * f32(n * e);
z1 = i32(iota(1, 256) == n) + iota(0, 8) * 1000;
y4 = 0.0;
y4[0, 0:8] = a[:, 3];
"""
    outs = {"y1": ("f32", (8, 256)), "y2": ("f32", (8, 256)), "y3": ("f32", (8, 256)), "z1": ("i32", (8, 256)),
            "y4": ("f32", (8, 256))}
    got = run_tiles(body, ins, outs)
    same(a[0:1] + a[:, 7:8], got["y1"])
    same(a * np.float32(2) + np.float32(1e-5) - a / np.float32(256), got["y2"])
    same(a * np.float32(-15), got["y3"])
    same((np.arange(256) == 5).astype(np.int32)[None] + np.arange(8, dtype=np.int32)[:, None] * 1000, got["z1"])
    y4 = np.zeros_like(a)
    y4[0, 0:8] = a[:, 3]                                          # x[:, j] is a [1, rows] row
    same(y4, got["y4"])
    assert "storing f32[1, 8] into [8, 1] view" in compile_error(tile_kernel(
        "y[:, 0:1] = a[:, 3];", {"a": ("f32", (8, 256), None)}, {"y": ("f32", (8, 256))}))


def pad(x, axis, val, least):
    n = x.shape[axis]
    p = max(least, 1 << (n - 1).bit_length())
    widths = [(0, 0), (0, 0)]
    widths[axis] = (0, p - n)
    return np.pad(x, widths, constant_values=val)


@pytest.mark.parametrize("rows, cols", [(8, 200), (5, 300), (3, 7), (24, 130)])
def test_reductions_use_the_padded_halving_tree(rows, cols):
    a = RNG.standard_normal((rows, cols)).astype(np.float32) * 1000
    a[0, :3] = -0.0
    ia = RNG.integers(-2**31, 2**31 - 1, (rows, cols)).astype(np.int32)
    outs = {"s1": ("f32", (rows, 1)), "s0": ("f32", (1, cols)), "m1": ("f32", (rows, 1)), "n0": ("f32", (1, cols)),
            "is1": ("i32", (rows, 1)), "am1": ("i32", (rows, 1)), "am0": ("i32", (1, cols))}
    got = run_tiles("s1 = sum(a, axis=1); s0 = sum(a, axis=0); m1 = max(a, axis=1); n0 = min(a, axis=0);\n"
                    "is1 = sum(ia, axis=1); am1 = argmax(a, axis=1); am0 = argmax(a, axis=0);",
                    {"a": ("f32", (rows, cols), a), "ia": ("i32", (rows, cols), ia)}, outs)
    same(nx.tree_sum_f32(pad(a, 1, 0.0, 128), axis=1, keepdims=True), got["s1"])
    same(nx.tree_sum_f32(pad(a, 0, 0.0, 8), axis=0, keepdims=True), got["s0"])
    same(nx.tree_max_f32(pad(a, 1, -np.inf, 128), axis=1, keepdims=True), got["m1"])
    same(nx.tree_min_f32(pad(a, 0, np.inf, 8), axis=0, keepdims=True), got["n0"])
    same(nx.i32_wrap(ia.astype(np.int64).sum(axis=1, keepdims=True)), got["is1"])
    same(a.argmax(1)[:, None].astype(np.int32), got["am1"])
    same(a.argmax(0)[None].astype(np.int32), got["am0"])


@pytest.mark.parametrize("m, k, n", [(5, 200, 300), (1, 32, 8)])
def test_matmul_of_f32_and_bf16_tiles(m, k, n):
    a = RNG.standard_normal((m, k)).astype(np.float32)
    w = RNG.standard_normal((k, n)).astype(np.float32)
    ins = {"a": ("f32", (m, k), a), "w": ("f32", (k, n), w), "ab": ("bf16", (m, k), nx.bf16_round(a)),
           "wb": ("bf16", (k, n), nx.bf16_round(w))}
    got = run_tiles("y = matmul(a, w); yb = 1.0; yb += matmul(ab, wb);", ins,
                    {"y": ("f32", (m, n)), "yb": ("f32", (m, n))})
    same(mm(a, w), got["y"])                                      # f32 operands are rounded to bf16 by the unit
    same(np.float32(1) + mm(nx.bf16_round(a), nx.bf16_round(w)), got["yb"])


@pytest.mark.parametrize("body, message", [
    ("y = h + a;", "dtype mismatch: bf16[8, 128] + f32[8, 128]"),
    ("y = exp(h);", "exp() needs an f32 tile, got bf16; convert with f32() first"),
    ("o = a;", "dtype mismatch: storing f32 into bf16 buffer 'o'; round explicitly with bf16(...)"),
    ("z = ia * 1.5;", "a float constant cannot be used with an i32 tile"),
    ("z = ia / 2;", "integer tile division and remainder are not supported"),
    ("z = !ia;", "'!' needs a mask (a comparison result), got i32"),
    ("y = max(h, h);", "max() is not defined on bf16 tiles; convert with f32() first"),
    ("y = max(a, ia);", "dtype mismatch: max() of f32[8, 128] and i32[8, 128]"),
    ("y = min(a, b);", "shape mismatch: min() of f32[8, 128] and f32[8, 64] cannot be broadcast together"),
    ("y = where(a < 0.0, h, h);", "where() is not defined on bf16 tiles"),
    ("let t = true; y = f32(t);", "f32() of a bool: convert it with i32(...) first"),
    ("smem q: i32[2]; let n = q[0]; let t = a * 2.0; y = t[:, n +: 4];", "a let-bound tile can only be indexed statically"),
])
def test_tile_expression_errors(body, message):
    z = np.zeros((8, 128), np.float32)
    ins = {"a": ("f32", (8, 128), z), "h": ("bf16", (8, 128), z), "ia": ("i32", (8, 128), z), "b": ("f32", (8, 64), z)}
    outs = {"y": ("f32", (8, 128)), "z": ("i32", (8, 128)), "o": ("bf16", (8, 128))}
    assert message in compile_error(tile_kernel(body, ins, outs))


@pytest.mark.parametrize("expr, bits", [
    ("0.1 + 0.2", np.float32(0.1) + np.float32(0.2)), ("1.0 / 3.0", np.float32(1) / np.float32(3)),
    ("16777216.0 + 1.0 + 1.0", np.float32(16777216)), ("1.0 + 1.0 + 16777216.0", np.float32(16777218)),
    ("1.0 / 0.0", np.float32(np.inf)), ("1.0 / 0", np.float32(np.inf)), ("0.0 / 0.0", np.float32(np.nan)),
    ("min(0.0, -0.0)", np.float32(-0.0)), ("max(-0.0, 0.0)", np.float32(0.0)), ("-(1.0 - 1.0)", np.float32(-0.0)),
    ("16777217 + 0.5", np.float32(16777216)), ("3 / 2 + 0.0", np.float32(1)), ("max(0.0 / 0.0, 1.0)", np.float32(np.nan)),
])
def test_constant_float_expressions_fold_with_f32_arithmetic(expr, bits):
    y = run_tiles(f"y = {expr};", {}, {"y": ("f32", (8, 128))})["y"]
    same(np.full((8, 128), bits, np.float32), y)


def test_an_integer_past_the_f32_range_in_a_float_expression_is_an_error():
    assert "is beyond the f32 range" in compile_error(tile_kernel("y = (1 << 128) + 0.0;", {}, {"y": ("f32", (8, 128))}))


# --------------------------------------------------------------------- scalars


def test_scalar_division_shifts_and_wrapping_at_run_time():
    exprs = ["a / b", "a % b", "c / b", "c % b", "a / d", "a % d", "c / d", "c % d", "a << d", "c >> d", "a << 33",
             "a * 1000000000", "2147483647 + a", "e / f", "e % f"]
    got = scalars(exprs, [7, 2, -7, -2, -2**31, -1], pre="let e = s[4]; let f = s[5];")
    assert got == [3, 1, -3, -1, -3, 1, 3, -1, -1073741824, -1, 14, -1589934592, -2147483642, -2**31, 0]


def test_constant_zero_divisors_are_errors_and_run_time_ones_fault():
    for e in ("a / 0", "s[1] % 0", "a / (2 - 2)"):
        with pytest.raises(SourceError, match=r"division by zero: the divisor of '[/%]' is the constant 0"):
            scalars([e], [5, 0])
    with pytest.raises(EmulatorFault, match=r"fault \[divide-by-zero\]"):
        scalars(["a % b"], [5, 0])


def test_compile_time_integers_are_exact_until_an_i32_is_needed():
    with pytest.raises(SourceError, match="the constant 8,589,934,592 does not fit in 32 bits"):
        run("const C = 1 << 33;\nkernel kk(y: hbm i32[1]) {\n smem o: i32[1];\n sem ds;\n o[0] = C;\n"
            " start copy(o, y, ds);\n wait copy(o, y, ds);\n}\n", {})
    assert scalars(["(1 << 33) >> 4", "-2147483647 - 1"], []) == [1 << 29, -2**31]
    with pytest.raises(SourceError, match="negative shift count in a compile-time expression"):
        scalars(["1 << -1"], [])


# ----------------------------------------------------------- booleans, select


def test_booleans_and_select_example_runs():
    src = """
param SPLIT = 1;
param N = 256;
const NB = 4;
const HALVES = SPLIT == 1;
const TN = select(HALVES, N / 2, N);
fn scale(x: vmem f32[8, TN], neg: bool, k: i32) {
    let f = select(neg, 0 - k, k);
    x = x * f32(f);
}
kernel kk(a: hbm f32[8, TN], y: hbm f32[8, TN], flag: bool, k: i32, c: hbm i32[8]) {
    vmem x: f32[8, TN];
    smem cs: i32[8];
    sem s;
    start copy(a, x, s); wait copy(a, x, s);
    scale(x, flag, k);
    var last: bool = false;
    var cnt: i32 = 0;
    for j in 0..NB {
        last = j == NB - 1;
        cnt += i32(last) * 10 + 1;
    }
    let n = i32(core_id() < 4) * 64;
    cs[0] = cnt; cs[1] = n; cs[2] = i32(flag); cs[3] = select(flag && k > 2, 7, 9);
    cs[4] = i32(flag == last); cs[5] = i32(flag != true); cs[6] = i32(!flag || false); cs[7] = 0;
    start copy(x, y, s); wait copy(x, y, s);
    start copy(cs, c, s); wait copy(cs, c, s);
}
host {
    input a: f32[8, TN];
    output y: f32[8, TN];
    output c: i32[8];
    launch kk(a, y, true, 3, c);
}
"""
    a = RNG.standard_normal((8, 128)).astype(np.float32)
    outs, _, _ = run(src, {"a": a})
    same(a * np.float32(-3), outs["y"])
    assert list(outs["c"]) == [14, 64, 1, 7, 1, 0, 0, 0]


def test_a_run_time_select_of_two_smem_elements_is_a_scalar():
    # (was "a run-time choice of views": not storable, bindable or usable in a tile)
    assert scalars(["select(a > 0, s[1], s[2])", "q + 1", "select(a < 0, s[1], s[2]) * 2"], [1, 5, 7],
                   pre="let q = select(a > 0, s[1], s[2]);") == [5, 6, 14]
    assert scalars(["select(a > 0, s[1], s[2])"], [0, 5, 7]) == [7]
    x = np.ones((8, 128), np.float32)
    got = run_tiles("smem s: i32[8]; start copy(p_h, s, ds); wait copy(p_h, s, ds);\n"
                    "y = x * f32(select(s[0] > 0, s[1], s[2]));",
                    {"x": ("f32", (8, 128), x), "p": ("i32", (8,), np.array([0, 5, 7, 0, 0, 0, 0, 0], np.int32))},
                    {"y": ("f32", (8, 128))})
    same(x * 7, got["y"])


def test_a_run_time_select_of_views_is_a_choice_of_copies():
    src = """
const NQ = 3;
const NKV = 2;
kernel kk(wq: hbm f32[8, NQ * 128], wkv: hbm f32[8, NKV * 128], y: hbm f32[8, (NQ + NKV) * 128]) {
    vmem t: f32[8, 128];
    sem s;
    for j in 0..NQ + NKV {
        start copy(select(j < NQ, wq[:, j * 128 +: 128], wkv[:, (j - NQ) * 128 +: 128]), t, s);
        wait copy(select(j < NQ, wq[:, j * 128 +: 128], wkv[:, (j - NQ) * 128 +: 128]), t, s);
        start copy(t, y[:, j * 128 +: 128], s); wait copy(t, y[:, j * 128 +: 128], s);
    }
}
"""
    wq = RNG.standard_normal((8, 384)).astype(np.float32)
    wkv = RNG.standard_normal((8, 256)).astype(np.float32)
    same(np.hstack([wq, wkv]), run(src, {"wq": wq, "wkv": wkv})[0]["y"])
    assert "slice reaching 0..512 is out of range for dimension 1 of 'wq'" in compile_error(
        src.replace("j < NQ,", "j <= NQ,"))


# ----------------------------------------------------------------- assignment


def test_assignment_forms():
    a = RNG.standard_normal((8, 256)).astype(np.float32)
    b = RNG.standard_normal((8, 256)).astype(np.float32)
    ia = RNG.integers(-100, 100, (8, 256)).astype(np.int32)
    body = """\
y1 = a; y1[:, 0:128] = exp(y1[:, 0:128]);
y2 = a; y2 += b; y2 -= b[0:1, :]; y2 *= 2.0; y2 /= b;
y3 = 2.5; y3[:, 0:1] = 1;
z1 = ia; z1 += 3; z1 *= 2; z1 -= ia;
y4 = a; let r = y4[1:3, 4:8]; r += 100.0;
h1 = 1.00390625;
var t: f32[8, 256] = a[0:1, :]; t += 1.0; y5 = t;
"""
    outs = {n: ("f32", (8, 256)) for n in ("y1", "y2", "y3", "y4", "y5")}
    outs["z1"] = ("i32", (8, 256))
    outs["h1"] = ("bf16", (8, 256))
    got = run_tiles(body, {"a": ("f32", (8, 256), a), "b": ("f32", (8, 256), b), "ia": ("i32", (8, 256), ia)}, outs)
    same(np.hstack([nx.exp(a[:, :128]), a[:, 128:]]), got["y1"])
    same((a + b - b[0:1]) * np.float32(2) / b, got["y2"])
    y3 = np.full_like(a, 2.5)
    y3[:, 0] = 1
    same(y3, got["y3"])
    same((ia + 3) * 2 - ia, got["z1"])
    y4 = a.copy()
    y4[1:3, 4:8] += np.float32(100)                 # storing through a let-bound view writes the buffer
    same(y4, got["y4"])
    same(np.ones_like(a), got["h1"])                # 1 + 2^-8 rounds to even in bf16
    same(np.broadcast_to(a[0:1] + np.float32(1), a.shape), got["y5"])


@pytest.mark.parametrize("body, message", [
    ("let q = 3; q = 4;", "cannot assign to 'q'"),
    ("for i in 0..2 { i = 3; }", "cannot assign to 'i': it is a loop variable"),
    ("a_h = a;", "HBM array 'a_h' can only be written by a DMA (copy)"),
    ("let t = a * 2.0; t = 1.0;", "cannot assign to the let-bound tile 't'"),
    ("z = 0.0;", "a float constant cannot be used with an i32 tile"),
    ("var f: bool = false; f += 1;", "'+=' is not defined on bool variables"),
    ("var c: i32 = 0; c = 1 < 2;", "expected an integer value, got a bool"),
])
def test_assignment_errors(body, message):
    z = np.zeros((8, 128), np.float32)
    assert message in compile_error(tile_kernel(body, {"a": ("f32", (8, 128), z)}, {"z": ("i32", (8, 128))}))


def test_an_mxfp4_offset_bound_by_let_keeps_its_form():
    # (`let k0 = ps[0] * TK;` was "an offset not known to be a multiple of 32")
    src = """
const TK = 64;
kernel kk(w: hbm mxfp4[2, 128, 256], x: hbm bf16[8, 64], p: hbm i32[8], y: hbm f32[2, 8, 128]) {
    vmem b: mxfp4[64, 128];
    vmem xv: bf16[8, 64];
    vmem yv: f32[8, 128];
    smem ps: i32[8];
    sem s;
    start copy(x, xv, s); wait copy(x, xv, s);
    start copy(p, ps, s); wait copy(p, ps, s);
    for e in 0..2 {
        let k0 = ps[0] * TK;
        let n0 = 2 * ps[1] + 64 * e;
        start copy(w[e, k0 +: TK, n0 +: 128], b, s);
        wait copy(w[e, k0 +: TK, n0 +: 128], b, s);
        yv = matmul(xv, b);
        start copy(yv, y[e], s); wait copy(yv, y[e], s);
    }
}
host {
    input w: mxfp4[2, 128, 256];
    input x: bf16[8, 64];
    input p: i32[8];
    output y: f32[2, 8, 128];
    launch kk(w, x, p, y);
}
"""
    import mkemu
    k = mkemu.compile_source(src, filename="mxlet.mk", hw="test", mesh="1")
    w = RNG.standard_normal((2, 128, 256)).astype(np.float32)
    x = nx.bf16_round(RNG.standard_normal((8, 64)).astype(np.float32))
    wd = nx.mxfp4_from_bytes(nx.mxfp4_to_bytes(w), w.shape)
    r = k(w=w, x=x, p=np.array([1, 3, 0, 0, 0, 0, 0, 0], np.int32))
    same(np.stack([mm(x, wd[e][64:128, 6 + 64 * e:134 + 64 * e]) for e in range(2)]), r.outputs["y@0"])
    bad = src.replace("let n0 = 2 * ps[1] + 64 * e;", "let n0 = ps[1] + 64 * e;")
    assert "must start its columns at a multiple of 2" in compile_error(bad)


def test_shift_counts_modulo_32_at_run_time_and_negative_constant_counts():
    assert scalars(["a << -1", "a >> -31", "a << 33"], [3]) == [-2**31, 1, 6]
    ia = np.arange(-5, 3, dtype=np.int32)[:, None] * np.ones((1, 128), np.int32)
    got = run_tiles("z = ia << 33; q = ia >> 33; r = ia << -1;", {"ia": ("i32", (8, 128), ia)},
                    {"z": ("i32", (8, 128)), "q": ("i32", (8, 128)), "r": ("i32", (8, 128))})
    same(ia << 1, got["z"])
    same(ia >> 1, got["q"])
    same(nx.i32_wrap(ia.astype(np.int64) << 31), got["r"])


def test_a_compile_time_select_may_name_an_absent_member(tmp_path):
    src = """\
param MX = 0 in {0, 1};
const WT = select(MX == 1, mxfp4, bf16);
const NX = select(MX == 1, 2, 0);
struct Ring { b: vmem bf16[2][64, 128]; x: vmem mxfp4[NX][64, 128]; }
kernel k0(a: hbm WT[64, 128]) {
    let r = Ring();
    sem s;
    start copy(a, select(MX == 1, r.x[0], r.b[0]), s);
    wait copy(a, select(MX == 1, r.x[0], r.b[0]), s);
}
"""
    from mkemu.dsl.frontend import load_program
    (tmp_path / "p.mk").write_text(src)
    for mx in (0, 1):
        load_program(tmp_path / "p.mk", {"MX": mx})


def test_a_top_level_declaration_inside_a_body_is_reported_as_misplaced(tmp_path, monkeypatch):
    # (was "'const' is a keyword; it cannot be used as a name", though no name was written)
    src = "kernel k(a: hbm f32[8, 128]) {\n    if true { const F = 2; }\n}\n"
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:2:15: error: 'const' declarations belong at the top level of a file, not inside a block\n"
        "      if true { const F = 2; }\n"
        "                ^^^^^"
    )
    out = errors("kernel k(a: hbm f32[8, 128]) { let const = 1; }\n", tmp_path, monkeypatch)
    assert "error: 'const' is a keyword; it cannot be used as a name" in out


def test_an_error_naming_an_fn_local_is_reported_once_at_the_fn(tmp_path, monkeypatch):
    # (each call renamed the local, `'f#1.t'`, `'f#2.t'`, and so reported the error again)
    src = "fn f() {\n    vmem t: f32[8, 256];\n    t = t[:, 0:128];\n}\nkernel k(a: hbm f32[8, 128]) {\n    f();\n    f();\n}\n"
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:3:5: error: shape mismatch: storing f32[8, 128] into [8, 256] view of 't'\n"
        "      t = t[:, 0:128];\n"
        "      ^^^^^^^^^^^^^^^^"
    )


@pytest.mark.parametrize("body, message", [
    ("x = x[:, 0:64];", "2:5: error: shape mismatch: storing f32[8, 64] into [8, 128] view of 'x'"),
    ("x[0:9, :] = 1.0;", "2:7: error: slice 0:9 is out of range for dimension 0 of 'x' (size 8)"),
])
def test_an_error_naming_an_fn_parameter_is_reported_once_at_the_fn(tmp_path, monkeypatch, body, message):
    """docs/language.md: an error the fn's own check finds is reported once, at the fn,
    without a call. Each call had reported it again, naming its argument (`'xv'`)."""
    src = (f"fn g(x: vmem f32[8, 128]) {{\n    {body}\n}}\n"
           "kernel k(a: hbm f32[8, 128]) {\n    vmem xv: f32[8, 128];\n    vmem yv: f32[8, 128];\n"
           "    g(xv);\n    g(yv);\n}\n")
    out = errors(src, tmp_path, monkeypatch)
    assert out.count("error:") == 1 and out.startswith(f"prog.mk:{message}\n"), out
    assert "inlined at" not in out
