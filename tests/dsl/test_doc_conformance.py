"""Behaviour docs/language.md states that a sweep of the documentation found missing or
wrong: each test is one documented rule, checked through the front end or a run."""

from __future__ import annotations

import numpy as np
import pytest

import mkemu
from tests.dsl.test_compiler import bf16, mm, run, same
from tests.dsl.test_errors import errors

COPY_KERNEL = """\
kernel k(a: hbm f32[8, 128], out: hbm f32[8, 128], n: i32) {
    vmem x: f32[8, 128];
    sem s;
    start copy(a, x, s);
    wait copy(a, x, s);
    start copy(x, out, s);
    wait copy(x, out, s);
}
"""


# -- generics: "A generic that no parameter type fixes is an error at its declaration"


def test_unfixed_generic_is_an_error_at_its_declaration_even_if_never_called(tmp_path, monkeypatch):
    src = """\
fn f<Q>(a: vmem f32[8, 128]) { }
kernel g<R>(a: hbm f32[8, 128]) { }
""" + COPY_KERNEL
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:1:6: error: generic 'Q' of fn 'f' cannot be inferred from the arguments (use it as a whole "
        "dimension, count or dtype of a buffer or semaphore parameter)\n"
        "  fn f<Q>(a: vmem f32[8, 128]) { }\n"
        "       ^\n"
        "prog.mk:2:10: error: generic 'R' of kernel 'g' cannot be inferred from the arguments (use it as a whole "
        "dimension, count or dtype of a buffer or semaphore parameter)\n"
        "  kernel g<R>(a: hbm f32[8, 128]) { }\n"
        "           ^"
    )


def test_generic_names_are_declared_once_and_do_not_shadow_globals(tmp_path, monkeypatch):
    src = """\
param N = 8;
fn f<Q, Q>(a: vmem f32[8, Q]) { }
fn g<N>(a: vmem f32[N, 128]) { }
""" + COPY_KERNEL
    out = errors(src, tmp_path, monkeypatch)
    assert "prog.mk:2:9: error: redefinition of 'Q' (first defined at prog.mk:2:6)" in out
    assert "prog.mk:3:6: error: redefinition of 'N' (first defined at prog.mk:1:7)" in out


def test_an_argument_in_error_does_not_also_report_its_generic_as_uninferable(tmp_path, monkeypatch):
    src = """\
fn f<S>(t: sem[S]) { }
kernel k() {
    f(nope);
}
"""
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:3:7: error: unknown name 'nope'\n"
        "      f(nope);\n"
        "        ^^^^"
    )


# -- structs: members are hbm/vmem/smem arrays and sems; checked where declared


def test_struct_members_are_checked_at_the_declaration_even_if_never_instantiated(tmp_path, monkeypatch):
    src = """\
struct A { x: vmem f33[8]; }
struct B { x: vmem f32[8]; x: vmem f32[8]; }
struct C { n: i32; }
struct D { a: C; }
""" + COPY_KERNEL
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:1:15: error: unknown dtype 'f33' (expected bf16, f32, i32, mxfp4)\n"
        "  struct A { x: vmem f33[8]; }\n"
        "                ^^^^^^^^^^^\n"
        "prog.mk:2:28: error: struct 'B' has two members named 'x'\n"
        "  struct B { x: vmem f32[8]; x: vmem f32[8]; }\n"
        "                             ^\n"
        "prog.mk:3:15: error: struct members are buffers or semaphores; 'n' is a scalar type (pass scalars as "
        "parameters)\n"
        "  struct C { n: i32; }\n"
        "                ^^^\n"
        "prog.mk:4:15: error: struct members are buffers or semaphores; 'a' is an instance of struct 'C' "
        "(structs do not nest)\n"
        "  struct D { a: C; }\n"
        "                ^"
    )


# -- host: launch arguments and host array names


def test_an_i32_launch_argument_must_fit_in_32_bits(tmp_path, monkeypatch):
    src = COPY_KERNEL + """\
host {
    input a: f32[8, 128];
    output out: f32[8, 128];
    launch k(a, out, 1 << 40);
}
"""
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:12:22: error: argument 'n' is 1,099,511,627,776, which does not fit in 32 bits (int32 is "
        "-2,147,483,648..2,147,483,647)\n"
        "      launch k(a, out, 1 << 40);\n"
        "                       ^^^^^^^"
    )


def test_a_host_array_declared_twice_is_a_plain_redefinition(tmp_path, monkeypatch):
    src = COPY_KERNEL + """\
host {
    input a: f32[8, 128];
    input a: f32[8, 128];
    output out: f32[8, 128];
    for l in 0..2 { hbm t: f32[8, 128]; launch k(a, t, l); }
    launch k(a, out, 0);
}
"""
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:11:11: error: redefinition of 'a' (first defined at prog.mk:10:11)\n"
        "      input a: f32[8, 128];\n"
        "            ^\n"
        "prog.mk:13:21: error: host array 't' would be declared once per iteration of a host loop; declare it "
        "before the loop\n"
        "      for l in 0..2 { hbm t: f32[8, 128]; launch k(a, t, l); }\n"
        "                      ^^^^^^^^^^^^^^^^^^^"
    )


# -- assignment: "let bindings, parameters and loop variables are immutable"


def test_assigning_an_immutable_name_names_it_as_written(tmp_path, monkeypatch):
    src = """\
param N = 4;
kernel k(y: hbm f32[8, 128]) {
    let q = 3;
    q = 4;
    N = 5;
    pipeline j in 0..1 {
        output yt = y[:, j * 128 +: 128];
        j = 2;
        yt = 0.0;
    }
}
"""
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:4:5: error: cannot assign to 'q': it is a compile-time constant (let binding); declare a var to "
        "update it\n"
        "      q = 4;\n"
        "      ^\n"
        "prog.mk:5:5: error: cannot assign to 'N': it is a compile-time constant (param); declare a var to "
        "update it\n"
        "      N = 5;\n"
        "      ^\n"
        "prog.mk:8:9: error: cannot assign to 'j': it is a pipeline variable (declare it with var)\n"
        "          j = 2;\n"
        "          ^"
    )


# -- counted waits


def test_a_negative_constant_count_of_copies_is_an_error(tmp_path, monkeypatch):
    src = """\
kernel k(a: hbm f32[8, 128]) {
    vmem x: f32[8, 128];
    sem s;
    start copy(a, x, s);
    wait (0 - 1) * copy(a, x, s);
}
"""
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:5:10: error: the count of copies to wait for must not be negative, got -1\n"
        "      wait (0 - 1) * copy(a, x, s);\n"
        "           ^^^^^^^^^^^^^^^^^^^^^^^"
    )


# -- where(mask, a, b): messages name where(), not an operator


def test_where_operand_errors_name_where(tmp_path, monkeypatch):
    src = """\
kernel k(a: hbm f32[8, 128]) {
    vmem x: f32[8, 128];
    vmem b: bf16[8, 128];
    x = where(x > 0.0, x, iota(1, 128));
    x = where(x > 0.0, x, x[:, 0:64]);
    b = where(x > 0.0, b, b);
}
"""
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:4:9: error: dtype mismatch: where() of f32[8, 128] and i32[1, 128]; convert one side with "
        "f32(), i32() or bf16()\n"
        "      x = where(x > 0.0, x, iota(1, 128));\n"
        "          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "prog.mk:5:9: error: shape mismatch: where() of f32[8, 128] and f32[8, 64] cannot be broadcast together\n"
        "      x = where(x > 0.0, x, x[:, 0:64]);\n"
        "          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "prog.mk:6:9: error: where() is not defined on bf16 tiles; convert with f32() first\n"
        "      b = where(x > 0.0, b, b);\n"
        "          ^^^^^^^^^^^^^^^^^^^^"
    )


# -- pipelines


def test_pipeline_streams_after_the_body_are_one_error(tmp_path, monkeypatch):
    src = """\
kernel k(x: hbm f32[8, 256], y: hbm f32[8, 256]) {
    pipeline j in 0..2 {
        input xt = x[:, j * 128 +: 128];
        let q = 1;
        output yt = y[:, j * 128 +: 128];
        yt = xt;
    }
}
"""
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:5:9: error: a pipeline's streams (input/output) come first, before its body\n"
        "          output yt = y[:, j * 128 +: 128];\n"
        "          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^"
    )


def test_a_pipeline_stream_out_of_range_is_reported_alone(tmp_path, monkeypatch):
    src = """\
kernel k(y: hbm f32[8, 256]) {
    pipeline j in 0..3 {
        output yt = y[:, j * 128 +: 128];
        yt = 0.0;
    }
}
"""
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:3:26: error: slice reaching 0..384 is out of range for dimension 1 of 'y' (size 256)\n"
        "          output yt = y[:, j * 128 +: 128];\n"
        "                           ^^^^^^^^^^^^^^"
    )


def test_pipeline_without_depth_takes_the_slot_count_of_its_via_streams():
    """`via BUF, SEMS`: D = its slot count; the pipeline's other streams get D slots too."""
    src = """\
kernel mm(x: hbm bf16[8, 128], w: hbm bf16[128, 512], y: hbm f32[8, 512]) {
    vmem xv: bf16[8, 128];
    vmem ring: bf16[3][128, 256];
    sem rs[3];
    sem xs;
    start copy(x, xv, xs);
    wait copy(x, xv, xs);
    pipeline j in 0..4 {
        input wt = w[:, j * 128 +: 128] via ring, rs;
        output yt = y[:, j * 128 +: 128];
        yt = matmul(xv, wt);
    }
}
"""
    x, w = bf16(8, 128), bf16(128, 512)
    outs, _, program = run(src, {"x": x, "w": w})
    same(mm(x, w), outs["y"])


def test_a_program_of_generic_kernels_without_host_says_why_it_has_no_kernel(tmp_path):
    import pytest

    from mkemu.dsl.compiler import compile_text
    from mkemu.errors import SourceError

    with pytest.raises(SourceError, match=r"exactly one kernel \(it has 0; a generic kernel is made only by "
                                          r"launches\)"):
        compile_text("kernel k<R>(a: hbm f32[R, 128]) { }\n", str(tmp_path / "g.mk"))


# -- lexical structure: keywords and literals


def test_a_reserved_keyword_is_not_a_name_but_contextual_ones_are(tmp_path, monkeypatch):
    src = """\
kernel k(y: hbm i32[8]) {
    smem o: i32[8];
    sem s;
    let step = 2;
    let depth = 3;
    let for = 1;
    for in in 0..2 { o[in] = step + depth; }
    start copy(o, y, s);
    wait copy(o, y, s);
}
"""
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:6:9: error: 'for' is a keyword; it cannot be used as a name\n"
        "      let for = 1;\n"
        "          ^^^"
    )


def test_literals_cannot_be_declared(tmp_path, monkeypatch):
    src = """\
const true = 0;
kernel k() {
    let inf = 1;
}
"""
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:1:7: error: 'true' is a literal; it cannot be declared as a name\n"
        "  const true = 0;\n"
        "        ^^^^\n"
        "prog.mk:3:9: error: 'inf' is a literal; it cannot be declared as a name\n"
        "      let inf = 1;\n"
        "          ^^^"
    )


def test_struct_members_cannot_take_a_literal_or_a_builtins_name(tmp_path, monkeypatch):
    # (the host's `input m: A;` declared host arrays named `true` and `exp`)
    src = """\
struct A { true: hbm f32[8, 128]; exp: hbm f32[8, 128]; prefetch: hbm f32[8, 128]; }
kernel k(m: A) { }
host { input m: A; launch k(m); }
"""
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:1:12: error: 'true' is a literal; it cannot be declared as a name\n"
        "  struct A { true: hbm f32[8, 128]; exp: hbm f32[8, 128]; prefetch: hbm f32[8, 128]; }\n"
        "             ^^^^\n"
        "prog.mk:1:35: error: 'exp' is a builtin function; it cannot be declared as a name\n"
        "  struct A { true: hbm f32[8, 128]; exp: hbm f32[8, 128]; prefetch: hbm f32[8, 128]; }\n"
        "                                    ^^^"
    )


def test_contextual_keywords_work_as_names_in_a_run():
    src = """\
kernel k(y: hbm i32[8]) {
    smem o: i32[8];
    sem s;
    let step = 2;
    for via in 0..8 step 2 { o[via] = step; o[via + 1] = via; }
    start copy(o, y, s);
    wait copy(o, y, s);
}
"""
    outs, _, _ = run(src, {})
    same(np.array([2, 0, 2, 2, 2, 4, 2, 6], np.int32), outs["y"])


# -- fns: "An error inside an inlined fn names the call"


def test_an_error_in_a_parameter_type_at_a_call_names_the_call(tmp_path, monkeypatch):
    src = """\
fn scale(x: vmem f32[8, n], n: i32) { x = x * 2.0; }
kernel k() {
    vmem x: f32[8, 128];
    scale(x, core_id());
}
"""
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:1:25: error: a dimension must be a compile-time integer (in fn 'scale' inlined at prog.mk:4:5)\n"
        "  fn scale(x: vmem f32[8, n], n: i32) { x = x * 2.0; }\n"
        "                          ^"
    )


def test_integer_tiles_have_no_division_or_remainder():
    """The tile table: `/` is f32 only; integer tile `/` and `%` are compile errors."""
    import pytest

    from mkemu.dsl.compiler import compile_text
    from mkemu.errors import SourceError

    for op in ("/", "%"):
        src = f"kernel k() {{ vmem a: i32[8, 128]; a = a {op} a; }}\n"
        with pytest.raises(SourceError, match=f"'{op}' is not defined on an i32 tile: integer tile division and remainder are not supported"):
            compile_text(src, "t.mk", "test")


# -- views: starts affine in loop variables are "narrowed by enclosing `if i + 1 < N`-style
#    conditions"; a negated condition, a multiple of the variable and the else branch of
#    an `||` narrow like the plain comparison


def test_negated_scaled_and_or_else_conditions_narrow_a_loop_range():
    src = """\
kernel k(x: hbm f32[8, 512], y: hbm f32[8, 512]) {
    vmem xv: f32[8, 512];
    vmem yv: f32[8, 512];
    sem s;
    start copy(x, xv, s);
    wait copy(x, xv, s);
    yv = 0.0;
    for j in 0..4 {
        if !(j >= 3) { yv[:, j * 128 +: 128] = xv[:, (j + 1) * 128 +: 128]; }
        if 2 * j > 1 { yv[0:1, j * 128 +: 128] = xv[0:1, (j - 1) * 128 +: 128]; }
        if j >= 3 || j < 1 { } else { yv[1:2, j * 128 +: 128] = xv[1:2, (j + 1) * 128 +: 128] * 2.0; }
    }
    start copy(yv, y, s);
    wait copy(yv, y, s);
}
"""
    x = np.arange(8 * 512, dtype=np.float32).reshape(8, 512)
    outs, _, _ = run(src, {"x": x})
    want = np.zeros_like(x)
    for j in range(4):
        if j < 3:
            want[:, j * 128:(j + 1) * 128] = x[:, (j + 1) * 128:(j + 2) * 128]
        if j >= 1:
            want[0, j * 128:(j + 1) * 128] = x[0, (j - 1) * 128:j * 128]
        if 1 <= j < 3:
            want[1, j * 128:(j + 1) * 128] = x[1, (j + 1) * 128:(j + 2) * 128] * 2
    same(want, outs["y"])


def test_a_condition_that_can_wrap_in_int32_does_not_narrow(tmp_path, monkeypatch):
    """`j * 1000000000 < 1` wraps for j >= 3 at run time: it holds there, so it must not
    narrow j to 0 and let the slice past the buffer's end go unchecked."""
    src = """\
kernel k() {
    vmem x: f32[8, 512];
    vmem t: f32[8, 128];
    for j in 0..8 {
        if j * 1000000000 < 1 { t = x[:, j * 128 +: 128]; }
    }
}
"""
    out = errors(src, tmp_path, monkeypatch)
    assert "slice reaching 0..1024 is out of range for dimension 1 of 'x' (size 512)" in out


def test_integer_literals_take_underscores_anywhere_after_the_first_digit_and_a_leading_zero_is_decimal():
    src = """\
kernel k(y: hbm i32[8]) {
    smem o: i32[8];
    sem s;
    o[0] = 1__0;
    o[1] = 10_;
    o[2] = 0x_ff;
    o[3] = 012;
    o[4] = 0xF_F;
    o[5] = 1_000_000;
    o[6] = 0;
    o[7] = 0;
    start copy(o, y, s);
    wait copy(o, y, s);
}
host { output y: i32[8]; launch k(y); }
"""
    run = mkemu.compile_source(src, filename="lex.mk", hw="test", mesh="1")()
    assert run.output("y").tolist() == [10, 10, 255, 12, 255, 1_000_000, 0, 0]


@pytest.mark.parametrize("literal", ["1.", ".5"])
def test_a_float_literal_needs_a_digit_on_both_sides_of_the_point(tmp_path, monkeypatch, literal):
    assert "error: unexpected" in errors(f"kernel k() {{ let a = {literal}; }}\n", tmp_path, monkeypatch)


def test_an_integer_sub_expression_of_a_tile_expression_is_folded_as_an_integer_first():
    """docs/language.md, Tile expressions: `x + 7 / 2` adds 3.0 (the integer `/`), not 3.5."""
    src = """\
kernel k(x: hbm f32[8, 128], o: hbm f32[2, 8, 128]) {
    vmem v: f32[8, 128];
    vmem r: f32[8, 128];
    sem s;
    start copy(x, v, s);
    wait copy(x, v, s);
    r = v + 1 / 2;
    start copy(r, o[0], s);
    wait copy(r, o[0], s);
    r = v + 7 / 2;
    start copy(r, o[1], s);
    wait copy(r, o[1], s);
}
host { input x: f32[8, 128]; output o: f32[2, 8, 128]; launch k(x, o); }
"""
    run = mkemu.compile_source(src, filename="fold.mk", hw="test", mesh="1")(x=np.ones((8, 128), np.float32))
    assert (run.output("o")[0] == 1.0).all() and (run.output("o")[1] == 4.0).all()
