"""MXFP4 weights in the language: arrays of them in HBM and VMEM, copies (a values DMA
and a scales DMA on one semaphore, so waits and bytes() count both), matmul on the
matrix unit's MXFP4 weight path, bit-exact against numpy with the weights decoded;
every other use is a caret error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mkemu
from mkemu.errors import EmulatorFault
from mkemu.isa import numerics as nx
from tests.dsl.test_compiler import same
from tests.dsl.test_errors import errors

DATA = Path(__file__).with_name("data")
E, M, K, N, TN = 4, 8, 256, 512, 128


def held(w):
    """The values an MXFP4 array holds after the runner stores `w` (quantised)."""
    return nx.mxfp4_from_bytes(nx.mxfp4_to_bytes(w), w.shape)


def mm(a, w):
    return nx.mxu_matmul_numpy(np.zeros((a.shape[0], w.shape[1]), np.float32), a, w)


@pytest.fixture(scope="module")
def example():
    path = DATA / "mxfp4.mk"
    kernel = mkemu.compile_source(path.read_text(), str(path), hw="test", mesh="1")
    rng = np.random.default_rng(5)
    w = rng.standard_normal((E, K, N)).astype(np.float32)
    x = nx.bf16_round(rng.standard_normal((M, K)).astype(np.float32))
    return kernel, x, w


def run_example(example, e: int):
    kernel, x, w = example
    return kernel(sel=np.array([e] + [0] * 7, np.int32), x=x, w=w)


@pytest.mark.parametrize("e", [0, 2, E - 1])
def test_run_time_expert_streams_through_a_pipeline_bit_exact(example, e):
    _, x, w = example
    run = run_example(example, e)
    W = held(w)
    same(mm(x, W[e]), run.outputs["y@0"])                               # pipeline + mxu.ldw.mx
    same(W[E - 1][:, :TN], run.output("wlast"))                         # 32-row blocks, VMEM -> HBM
    same(mm(x[:, K // 4:K // 4 + K // 2], W[E - 1][K // 4:K // 4 + K // 2, :TN]),
         run.outputs["y2@0"])                                           # VMEM -> VMEM, a slot


def test_hbm_layout_is_the_storage_layout_and_every_copy_is_two_dmas(example):
    kernel, _, _ = example
    buf = kernel.program.buffer("w")
    assert buf.dtype == "mxfp4" and buf.size_bytes == E * (K * N // 2 + K // 32 * N)
    run = run_example(example, 1)
    # sel, x; a values and a scales DMA per pipeline tile, per 32-row block, for
    # wlast and for the pair; y and y2.
    per_core = 2 + 2 * (N // TN) + 2 * (K // 32) + 2 + 2 + 2
    assert run.report.figures["dma_count"] == per_core * run.report.figures["cores"]


@pytest.mark.parametrize("schedule", ["late", "shuffle"])
def test_waits_count_both_parts_under_late_and_shuffled_landing(schedule):
    # Every DMA lands as late as the waits allow (or in a shuffled order): a wait that
    # counted only the values would let the matrix unit read scales not yet landed.
    path = DATA / "mxfp4.mk"
    kernel = mkemu.compile_source(path.read_text(), str(path), hw="test", mesh="1", schedule=schedule)
    rng = np.random.default_rng(6)
    w = rng.standard_normal((E, K, N)).astype(np.float32)
    x = nx.bf16_round(rng.standard_normal((M, K)).astype(np.float32))
    run = kernel(sel=np.array([3] + [0] * 7, np.int32), x=x, w=w)
    W = held(w)
    same(mm(x, W[3]), run.outputs["y@0"])
    same(W[E - 1][:, :TN], run.output("wlast"))


def test_an_expert_index_past_the_array_faults_naming_it(example):
    with pytest.raises(EmulatorFault) as info:
        run_example(example, E)
    text = info.value.render()
    assert info.value.kind == "out-of-bounds"
    assert ("index 4 of dimension 0 of the values of 'w' (mxfp4[4, 256, 512], values as bytes "
            "[4, 256, 256]) is outside 0..3") in text, text


def test_mxfp4_weights_stream_fewer_bytes_than_bf16():
    # The same pipelined matmul with bf16 and with MXFP4 weights: MXFP4 moves 4.25
    # bits a weight and waits less for them; the bits are those of the decoded weights.
    text = """
kernel k(x: hbm bf16[8, 512], w: hbm DT[512, 1024], y: hbm f32[8, 1024]) {
    vmem xv: bf16[8, 512];
    vmem yv: f32[8, 1024];
    sem s;
    start copy(x, xv, s);
    wait copy(x, xv, s);
    pipeline j in 0..1024 / 256 depth 2 {
        input wt = w[:, j * 256 +: 256];
        yv[:, j * 256 +: 256] = matmul(xv, wt);
    }
    start copy(yv, y, s);
    wait copy(yv, y, s);
}
host { input x: bf16[8, 512]; input w: DT[512, 1024]; output y: f32[8, 1024]; launch k(x, w, y); }
"""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((512, 1024)).astype(np.float32)
    x = nx.bf16_round(rng.standard_normal((8, 512)).astype(np.float32))
    runs = {}
    for dtype in ("bf16", "mxfp4"):
        kernel = mkemu.compile_source(text.replace("DT", dtype), f"{dtype}.mk", hw="tpu-v7-like", mesh="1")
        runs[dtype] = kernel(x=x, w=w)
    same(mm(x, held(w)), runs["mxfp4"].outputs["y@0"])
    hbm = {d: r.report.figures["hbm_bytes"] for d, r in runs.items()}
    assert hbm["mxfp4"] < 0.3 * hbm["bf16"], hbm
    waits = {d: r.report.figures["per_core"][0]["stall_cycles"]["semaphore"] for d, r in runs.items()}
    assert waits["mxfp4"] < waits["bf16"], waits


ROUND_TRIP = """
kernel k(w: hbm mxfp4[KA, NA], out: hbm mxfp4[TK, TNN]) {{
    vmem big: mxfp4[KB, NB];
    sem s;
    start copy(w[{k0} +: TK, {n0} +: TNN], big[{v0} +: TK, {u0} +: TNN], s);
    wait copy(w[{k0} +: TK, {n0} +: TNN], big[{v0} +: TK, {u0} +: TNN], s);
    start copy(big[{v0} +: TK, {u0} +: TNN], out, s);
    wait(s, bytes(out));
}}
"""


@settings(max_examples=12, deadline=None)
@given(st.data())
def test_a_tile_round_trips_hbm_vmem_hbm(data):
    # Any tile of whole scale blocks and bytes, anywhere in HBM and in a VMEM buffer,
    # comes back as the values it held.
    blocks = st.integers(1, 4)
    ta, tb = data.draw(blocks), data.draw(st.integers(1, 80))
    tk, tn = 32 * ta, 2 * tb
    ka, kb = tk + 32 * data.draw(st.integers(0, 2)), tk + 32 * data.draw(st.integers(0, 2))
    na, nb = tn + 2 * data.draw(st.integers(0, 70)), tn + 2 * data.draw(st.integers(0, 70))
    k0, v0 = 32 * data.draw(st.integers(0, (ka - tk) // 32)), 32 * data.draw(st.integers(0, (kb - tk) // 32))
    n0, u0 = 2 * data.draw(st.integers(0, (na - tn) // 2)), 2 * data.draw(st.integers(0, (nb - tn) // 2))
    text = ROUND_TRIP.format(k0=k0, n0=n0, v0=v0, u0=u0)
    params = {"KA": ka, "NA": na, "KB": kb, "NB": nb, "TK": tk, "TNN": tn}
    for name, value in params.items():
        text = f"param {name} = {value};\n" + text
    w = np.random.default_rng(ka * na + tk).standard_normal((ka, na)).astype(np.float32)
    run = mkemu.compile_source(text, "rt.mk", hw="test", mesh="1")(w=w)
    same(held(w)[k0:k0 + tk, n0:n0 + tn], run.output("out"))


# ------------------------------------------------------------------ errors


MX_KERNEL = """\
kernel kern(a: hbm f32[8, 256], x: hbm bf16[8, 256], w: hbm mxfp4[4, 256, 256], i: hbm i32[8]) {{
    vmem xv: bf16[8, 256];
    vmem xf: f32[8, 256];
    vmem wv: mxfp4[256, 256];
    smem si: i32[8];
    sem s;
{body}
}}
"""


def mx_errors(body: str, tmp_path, monkeypatch) -> str:
    import textwrap
    body = textwrap.indent(textwrap.dedent(body), "    ")
    return errors(MX_KERNEL.format(body=body.rstrip("\n")), tmp_path, monkeypatch)


SHAPE_ERRORS = {
    'odd columns': ('kernel k(w: hbm mxfp4[64, 127]) { }',
        'prog.mk:1:27: error: the last dimension of an mxfp4 array must be even (two 4-bit values a byte), got 127\n'
        '  kernel k(w: hbm mxfp4[64, 127]) { }\n'
        '                            ^^^'),
    'rows not whole blocks': ('kernel k(w: hbm mxfp4[2, 48, 128]) { }',
        'prog.mk:1:26: error: the second-to-last dimension of an mxfp4 array must be a multiple of 32 (the rows sharing one scale), got 48\n'
        '  kernel k(w: hbm mxfp4[2, 48, 128]) { }\n'
        '                           ^^'),
    'one dimension': ('kernel k() { vmem t: mxfp4[128]; }',
        'prog.mk:1:14: error: an mxfp4 array has at least 2 dimensions [K, N] (weights, blocked along K), got 1\n'
        '  kernel k() { vmem t: mxfp4[128]; }\n'
        '               ^^^^^^^^^^^^^^^^^^^'),
    'smem': ('kernel k() { smem t: mxfp4[32, 128]; }',
        'prog.mk:1:14: error: mxfp4 holds matrix-unit weights in hbm arrays and vmem buffers, not in smem\n'
        '  kernel k() { smem t: mxfp4[32, 128]; }\n'
        '               ^^^^^^^^^^^^^^^^^^^^^^^'),
    'var': ('kernel k() { var t: mxfp4[32, 128]; }',
        'prog.mk:1:14: error: mxfp4 holds matrix-unit weights in hbm arrays and vmem buffers, not in a var\n'
        '  kernel k() { var t: mxfp4[32, 128]; }\n'
        '               ^^^^^^^^^^^^^^^^^^^^^^'),
}


@pytest.mark.parametrize("case", sorted(SHAPE_ERRORS))
def test_mxfp4_shapes_and_places(case, tmp_path, monkeypatch):
    source, expected = SHAPE_ERRORS[case]
    assert errors(source + "\n", tmp_path, monkeypatch) == expected


USE_ERRORS = {
    "row offset": ("start copy(w[0, 16 +: 32, :], wv[0 +: 32, :], s);",
                   "a view of mxfp4 'w' must start its rows at a multiple of 32 (the rows sharing one scale); "
                   "it starts at 16", "w[0, 16 +: 32, :]"),
    "run-time row offset": ("let r = si[0];\nstart copy(w[0, r +: 32, :], wv[0 +: 32, :], s);",
                            "a view of mxfp4 'w' must start its rows at a multiple of 32 (the rows sharing one "
                            "scale); it starts at an offset not known to be a multiple of 32; write it as 32 * i "
                            "(or a multiple of 32 times a variable)", "w[0, r +: 32, :]"),
    "rows": ("start copy(w[0, 0 +: 16, :], wv[0 +: 16, :], s);",
             "a view of mxfp4 'w' takes its rows in blocks of 32 (the rows sharing one scale), got 16",
             "w[0, 0 +: 16, :]"),
    "column offset": ("start copy(w[1, :, 1 +: 128], wv[:, 0 +: 128], s);",
                      "a view of mxfp4 'w' must start its columns at a multiple of 2 (two 4-bit values a byte); "
                      "it starts at 1", "w[1, :, 1 +: 128]"),
    "a row": ("start copy(w[1, 0, :], wv[0, :], s);",
              "a view of mxfp4 'w' keeps its last two dimensions (rows k0 +: K, columns n0 +: N): index only "
              "the leading ones", "w[1, 0, :]"),
    "vector load": ("xf = xf + wv[0 +: 8, :];",
                    "'wv' is mxfp4 (matrix-unit weights): it can only be copied or be the right operand of "
                    "matmul(x, wv); it is not a tile", "xf + wv[0 +: 8, :]"),
    "convert": ("xf = f32(wv[0 +: 8, :]);",
                "'wv' is mxfp4 (matrix-unit weights): it can only be copied or be the right operand of "
                "matmul(x, wv); it is not a tile", "wv[0 +: 8, :]"),
    "transpose": ("xf = matmul(xf, transpose(wv));",
                  "'wv' is mxfp4 (matrix-unit weights): it can only be copied or be the right operand of "
                  "matmul(x, wv); it is not a tile", "wv"),
    "store": ("wv = 0.0;", "'wv' is mxfp4 (matrix-unit weights): only a DMA (copy) writes it", "wv"),
    "left operand": ("xf = matmul(wv[0 +: 8, :], wv);",
                     "'wv' is mxfp4 (matrix-unit weights): it can only be copied or be the right operand of "
                     "matmul(x, wv); it is not a tile", "wv[0 +: 8, :]"),
    "f32 left operand": ("xf = matmul(xf, wv);",
                         "dtype mismatch: matmul with mxfp4 weights takes a bf16 left operand, got f32; round it "
                         "with bf16(...)", "matmul(xf, wv)"),
    "from hbm": ("xf = matmul(xv, w[0]);",
                 "matmul reads mxfp4 weights from VMEM: copy the tile of 'w' into a vmem mxfp4 buffer first",
                 "w[0]"),
    "odd view in matmul": ("xf[:, 0 +: 128] = matmul(xv[:, 0 +: 16], wv[0 +: 16, 0 +: 128]);",
                           "a view of mxfp4 'wv' takes its rows in blocks of 32 (the rows sharing one scale), "
                           "got 16", "wv[0 +: 16, 0 +: 128]"),
    "dtype of a copy": ("start copy(w[0, 0 +: 32, :], xf, s);",
                        "dtype mismatch: copy from mxfp4 to f32 (DMAs do not convert)",
                        "copy(w[0, 0 +: 32, :], xf, s)"),
    "rows of a destination": ("start copy(x, wv[0 +: 8, :], s);",
                        "a view of mxfp4 'wv' takes its rows in blocks of 32 (the rows sharing one scale), got 8",
                        "wv[0 +: 8, :]"),
    "remote copy": ("start copy(w[0], wv @ 1, s, s);",
                    "a remote copy of mxfp4 is not supported (copy its tile to a core that holds it in HBM "
                    "instead)", "copy(w[0], wv @ 1, s, s)"),
}


@pytest.mark.parametrize("case", sorted(USE_ERRORS))
def test_mxfp4_misuse_is_a_caret_error(case, tmp_path, monkeypatch):
    body, message, underlined = USE_ERRORS[case]
    text = mx_errors(body, tmp_path, monkeypatch)
    first = text.splitlines()
    assert first[0].endswith("error: " + message), text
    line = first[1][2:]
    carets = first[2][2:]
    start = carets.index("^")
    assert line[start:start + len(carets) - start] == underlined, text


def test_an_mxfp4_launch_argument_is_a_whole_array(tmp_path, monkeypatch):
    source = """\
kernel k(w: hbm mxfp4[64, 128]) { }
host {
    input w: mxfp4[2, 64, 128];
    launch k(w[1]);
}
"""
    text = errors(source, tmp_path, monkeypatch)
    assert text.splitlines()[0] == (
        "prog.mk:4:14: error: an mxfp4 launch argument is a whole host array ('w' stores every matrix's values "
        "before all the scales, so a part of it is no array); pass it whole and index it in the kernel"), text


STRUCTS = """
param K = 128;
param N = 512;
const TN = 256;
struct Expert { w: hbm mxfp4[K, N]; }
struct Ring { slots: vmem mxfp4[2][K, TN]; sems: sem[2]; }
assert vmem_bytes(Ring) == 2 * (K * 128 + K / 32 * 256), "value rows, then scale rows twice as long";

fn load<T, R, C>(src: hbm T[R, C], dst: vmem T[R, C], s: sem) {
    start copy(src, dst, s);
    wait copy(src, dst, s);
}

kernel k(ex: Expert, x: hbm bf16[8, K], y: hbm f32[8, N], y2: hbm f32[8, TN]) {
    vmem xv: bf16[8, K];
    vmem one: mxfp4[K, TN];
    vmem y2v: f32[8, TN];
    sem s;
    let r = Ring();
    load(x, xv, s);
    pipeline j in 0..N / TN {
        input wt = ex.w[:, j * TN +: TN] via r.slots, r.sems;
        output yt = y[:, j * TN +: TN];
        yt = matmul(xv, wt);
    }
    load(ex.w[:, TN +: TN], one, s);                 // a generic fn with T = mxfp4
    y2v = matmul(xv, one) * 2.0;
    start copy(y2v, y2, s);
    wait copy(y2v, y2, s);
}
host {
    input ex: Expert;
    input x: bf16[8, K];
    output y: f32[8, N];
    output y2: f32[8, TN];
    launch k(ex, x, y, y2);
}
"""


def test_struct_members_shared_slots_and_generics_of_mxfp4():
    rng = np.random.default_rng(9)
    w = rng.standard_normal((128, 512)).astype(np.float32)
    x = nx.bf16_round(rng.standard_normal((8, 128)).astype(np.float32))
    run = mkemu.compile_source(STRUCTS, "structs_mx.mk", hw="test", mesh="1")(w=w, x=x)
    W = held(w)
    same(mm(x, W), run.outputs["y@0"])
    same(mm(x, W[:, 256:]) * np.float32(2.0), run.outputs["y2@0"])


# A param chooses the dtype of weights (a struct member's included) through a dtype
# const, and a ring that only MXFP4 weights need is an absent member (count 0) with
# bf16 weights: the program's bf16 form has exactly the buffers it had without it.
CHOSEN = """\
param MX = 0 in {0, 1} "weights stored as MXFP4";
const WT = select(MX == 1, mxfp4, bf16);
const NX = select(MX == 1, 2, 0);
param K = 128;
param N = 256;
struct Ws { w: hbm WT[K, N]; }
struct Ring {
    b: vmem bf16[2][K, 128];
    bs: sem[2];
    x: vmem mxfp4[NX][K, 128];
    xs: sem[NX];
}
assert vmem_bytes(Ring) == 2 * K * 256 + NX * (K * 64 + K / 32 * 128), "an absent member takes no VMEM";
kernel k(ws: Ws, x: hbm bf16[8, K], y: hbm f32[8, N]) {
    vmem xv: bf16[8, K];
    sem s;
    let r = Ring();
    start copy(x, xv, s);
    wait copy(x, xv, s);
    if MX == 1 {
        pipeline j in 0..N / 128 {
            input wt = ws.w[:, j * 128 +: 128] via r.x, r.xs;
            output yt = y[:, j * 128 +: 128];
            yt = matmul(xv, wt);
        }
    } else {
        pipeline j in 0..N / 128 {
            input wt = ws.w[:, j * 128 +: 128] via r.b, r.bs;
            output yt = y[:, j * 128 +: 128];
            yt = matmul(xv, wt);
        }
    }
}
host {
    input ws: Ws;
    input x: bf16[8, K];
    output y: f32[8, N];
    launch k(ws, x, y);
}
"""


@pytest.mark.parametrize("mx", [0, 1])
def test_a_dtype_const_chooses_a_member_dtype_and_absent_members_take_nothing(mx):
    rng = np.random.default_rng(3)
    w = nx.bf16_round(rng.standard_normal((128, 256)).astype(np.float32))
    x = nx.bf16_round(rng.standard_normal((8, 128)).astype(np.float32))
    run = mkemu.compile_source(CHOSEN, "chosen.mk", hw="test", mesh="1", params={"MX": mx})(w=w, x=x)
    same(mm(x, held(w) if mx else w), run.outputs["y@0"])


DTYPE_CONST_ERRORS = {
    'a param names a dtype': ('param T = mxfp4;\n',
        "prog.mk:1:11: error: param 'T' must be an integer (params are set from outside as integers); name a dtype "
        "with a const chosen by a param: const T = select(P == 1, mxfp4, bf16);\n"
        "  param T = mxfp4;\n"
        "            ^^^^^"),
    'a choice that is not a dtype': ('const T = select(true, mxfp4, 3);\nkernel k(w: hbm T[32, 2]) { }\n',
        "prog.mk:1:31: error: both choices of a dtype select(...) must be dtypes (bf16, f32, i32, mxfp4) or consts "
        "that name one\n"
        "  const T = select(true, mxfp4, 3);\n"
        "                                ^"),
    'a dtype used as a value': ('const T = bf16;\nconst N = T + 1;\n',
        "prog.mk:2:11: error: 'T' names a dtype (bf16), not a value: use it as the dtype of a buffer (T[...])\n"
        "  const N = T + 1;\n"
        "            ^"),
    'an absent member named': ('struct R { x: vmem bf16[0][8, 128]; }\nkernel k() { let r = R(); r.x[0] = 0.0; }\n',
        "prog.mk:2:29: error: member 'x' of struct 'R' has a count of 0 here: it is absent (only code that a "
        "compile-time condition leaves out may name it)\n"
        "  kernel k() { let r = R(); r.x[0] = 0.0; }\n"
        "                              ^"),
}


@pytest.mark.parametrize("case", sorted(DTYPE_CONST_ERRORS))
def test_dtype_consts_and_absent_members_errors(case, tmp_path, monkeypatch):
    source, expected = DTYPE_CONST_ERRORS[case]
    assert errors(source, tmp_path, monkeypatch) == expected
