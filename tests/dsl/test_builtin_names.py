"""Names the language defines (docs/language.md, "Lexical structure"): the dtypes and
the builtin functions cannot be declared, as the literals cannot; the pipeline part
names `whole`, `prefetch`, `primed` may name anything but an integer."""

from __future__ import annotations

import numpy as np

from tests.dsl.test_compiler import run, same
from tests.dsl.test_errors import errors


def test_a_dtype_or_a_builtin_function_cannot_be_declared(tmp_path, monkeypatch):
    # (each was accepted: `const f32 = 3;` then made `const T = f32;` the integer 3, and a
    # kernel named `exp` turned every exp(x) into "kernel 'exp' can only be launched")
    src = """\
const f32 = 3;
struct copy { a: hbm bf16[8, 128]; }
kernel exp(x: hbm bf16[8, 128]) { }
fn g<mxfp4>(a: vmem bf16[8, mxfp4], sum: i32) { }
kernel k() {
    let max = 3;
    sem barrier;
}
"""
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:1:7: error: 'f32' is a dtype; it cannot be declared as a name\n"
        "  const f32 = 3;\n"
        "        ^^^\n"
        "prog.mk:2:8: error: 'copy' is a builtin function; it cannot be declared as a name\n"
        "  struct copy { a: hbm bf16[8, 128]; }\n"
        "         ^^^^\n"
        "prog.mk:3:8: error: 'exp' is a builtin function; it cannot be declared as a name\n"
        "  kernel exp(x: hbm bf16[8, 128]) { }\n"
        "         ^^^\n"
        "prog.mk:4:6: error: 'mxfp4' is a dtype; it cannot be declared as a name\n"
        "  fn g<mxfp4>(a: vmem bf16[8, mxfp4], sum: i32) { }\n"
        "       ^^^^^\n"
        "prog.mk:4:37: error: 'sum' is a builtin function; it cannot be declared as a name\n"
        "  fn g<mxfp4>(a: vmem bf16[8, mxfp4], sum: i32) { }\n"
        "                                      ^^^\n"
        "prog.mk:6:9: error: 'max' is a builtin function; it cannot be declared as a name\n"
        "      let max = 3;\n"
        "          ^^^\n"
        "prog.mk:7:9: error: 'barrier' is a builtin function; it cannot be declared as a name\n"
        "      sem barrier;\n"
        "          ^^^^^^^"
    )


PARTS = """\
param N = 512;
const TN = 128;

fn doubled(part: i32, w: hbm f32[8, N], y: hbm f32[8, N], ring: vmem f32[2][8, TN], rs: sem[2]) {
    pipeline j in 0..N / TN part part {
        input wt = w[:, j * TN +: TN] via ring, rs;
        output yt = y[:, j * TN +: TN];
        yt = wt * 2.0;
    }
}

kernel k(w: hbm f32[8, N], y: hbm f32[8, N]) {
    vmem ring: f32[2][8, TN];
    sem rs[2];
    {binding}
    doubled(prefetch, w, y, ring, rs);
    doubled(primed, w, y, ring, rs);
}
"""


def test_an_integer_named_like_a_pipeline_part_is_an_error(tmp_path, monkeypatch):
    # (`let prefetch = 2;` made the first call run part 2, primed, without a prefetch)
    assert errors(PARTS.replace("{binding}", "let prefetch = 2;"), tmp_path, monkeypatch) == (
        "prog.mk:15:9: error: 'prefetch' is the pipeline part 1; an integer may not take its name "
        "(`part prefetch` or `f(prefetch, ...)` would silently mean the integer)\n"
        "      let prefetch = 2;\n"
        "          ^^^^^^^^"
    )


def test_integer_params_consts_loop_variables_and_parameters_named_like_parts_are_errors(tmp_path, monkeypatch):
    src = """\
param whole = 0;
const primed = 2;
const prefetch_ok = true;
fn g<S>(a: vmem bf16[S][8, 128], whole: i32, prefetch: bool) { }
kernel k() {
    for primed in 0..2 { }
}
"""
    out = errors(src, tmp_path, monkeypatch)
    assert [line.split(": error: ")[0] for line in out.splitlines() if ": error: " in line] == [
        "prog.mk:1:7", "prog.mk:2:7", "prog.mk:4:34", "prog.mk:6:9"]
    assert "'whole' is the pipeline part 0; an integer may not take its name" in out
    assert "'primed' is the pipeline part 2; an integer may not take its name" in out


def test_anything_but_an_integer_may_take_a_part_name():
    # As in the K3 programs (`let whole = EXPERT_PARALLEL || REP_UP;`): a bool, a buffer
    # (in its own block: where it is visible, `primed` is the buffer, not the part).
    src = PARTS.replace("{binding}", "let whole = N > 256;\n    if whole { vmem primed: f32[8, TN]; primed = 0.0; }")
    w = np.random.default_rng(3).standard_normal((8, 512)).astype(np.float32)
    outs, _, _ = run(src, {"w": w})
    same(w * np.float32(2), outs["y"])
