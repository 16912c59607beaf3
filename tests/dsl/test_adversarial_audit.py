"""Bugs found by an adversarial kernel author (helper audit): each test is a program
docs/language.md allows (or forbids) that the compiler got wrong, run through the
front end or the emulator and compared with numpy written from docs/numerics.md."""

from __future__ import annotations

import numpy as np
import pytest

from mkemu.dsl.compiler import compile_text
from mkemu.errors import SourceError
from tests.dsl.test_compiler import PROFILE, run, same


def compile_error(text: str) -> str:
    with pytest.raises(SourceError) as info:
        compile_text(text, "t.mk", PROFILE, None)
    return info.value.render()


KERNEL = """
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem a: f32[8, 128];
    smem q: i32[4];
    sem s;
    start copy(x, a, s); wait copy(x, a, s);
    CALL
    start copy(a, y, s); wait copy(a, y, s);
}
"""

# An fn whose body needs a scalar parameter as a compile-time value only through a let
# computed from it, or through an fn it calls (whose parameter is such a let), is checked
# at its calls only, as one that needs the parameter directly is (docs/language.md,
# Functions). Its own check reported "must be a compile-time integer", called or not.
FORWARDING_FNS = {
    "let_length": ("fn f(x: vmem f32[8, 128], n: i32) { let m = n * 2; x[:, 0 +: m] = 1.0; }", "f(a, 32);", 64),
    "let_step": ("fn f(x: vmem f32[8, 128], n: i32) { let m = n + 1; for i in 0..8 step m { x[i, 0:8] = 1.0; } }",
                 "f(a, 1);", 32),
    "forwarded_length": ("fn inner(x: vmem f32[8, 128], n: i32) { x[:, 0 +: n] = 1.0; }\n"
                         "fn f(x: vmem f32[8, 128], n: i32) { inner(x, n * 2); }", "f(a, 32);", 64),
    "forwarded_as_is": ("fn inner(x: vmem f32[8, 128], n: i32) { x[:, 0 +: n] = 1.0; }\n"
                        "fn f(x: vmem f32[8, 128], n: i32) { inner(x, n); }", "f(a, 32);", 32),
}


@pytest.mark.parametrize("name", sorted(FORWARDING_FNS))
def test_fn_needing_a_param_through_a_let_or_call_is_checked_at_calls(name):
    fns, call, cols = FORWARDING_FNS[name]
    compile_text(fns + KERNEL.replace("CALL", ""), "t.mk", PROFILE, None)   # never called: no error
    x = np.zeros((8, 128), np.float32)
    outs, _, _ = run(fns + KERNEL.replace("CALL", call), {"x": x})
    expected = x.copy()
    if name == "let_step":
        expected[::2, 0:8] = 1.0
    else:
        expected[:, :cols] = 1.0
    same(expected, outs["y"])


def test_fn_needing_a_param_through_a_let_still_checks_each_call():
    fns = ("fn f(x: vmem f32[8, 128], n: i32) { let m = n * 2; x[:, 0 +: m] = 1.0; }\n"
           "fn g(x: vmem f32[8, 128], n: i32) { f(x, n + 1); }")
    msg = compile_error(fns + KERNEL.replace("CALL", "g(a, 64);"))
    assert "t.mk:1:57: error: slice 0:130 is out of range for dimension 1 of 'a' (size 128)" in msg
    msg = compile_error(fns + KERNEL.replace("CALL", "f(a, q[0]);"))
    assert "t.mk:1:62: error: the length after '+:' must be a compile-time integer (in fn 'f' inlined at t.mk:8:5)" in msg


# The same for the other compile-time needs of a body: a compile-time select on a bool
# parameter (which picks one expression, "anything": views of other shapes, tiles,
# semaphores), a mesh axis and a let-bound tile's index.
CONST_NEEDS = {
    "select_views": ("fn f(x: vmem f32[8, 128], b: bool) { let v = select(b, x[0:1, :], x[0:2, :]); v = 3.0; }",
                     "f(a, true);", lambda x: np.concatenate([np.full((1, 128), 3, np.float32), x[1:]])),
    "select_tiles": ("fn f(x: vmem f32[8, 128], b: bool) { x = select(b, x * 2.0, x); }", "f(a, true);",
                     lambda x: x * np.float32(2)),
    "select_sems": ("fn f(x: vmem f32[8, 128], b: bool, s1: sem, s2: sem) { signal(select(b, s1, s2), 1); "
                    "wait(s1, 1); }", "f(a, true, t[0], t[1]);", lambda x: x),
    "mesh_axis": ("fn f(x: vmem f32[8, 128], n: i32) { x = x + f32(mesh_dim(n) + chip_coord(n)); }", "f(a, 0);",
                  lambda x: x + np.float32(1)),
    "tile_index": ("fn f(x: vmem f32[8, 128], n: i32) { let t = x * 2.0; x[0:1, 0:1] = t[n, 5]; }", "f(a, 2);",
                   lambda x: np.concatenate([np.concatenate([x[2:3, 5:6] * 2, x[0:1, 1:]], axis=1), x[1:]])),
}


@pytest.mark.parametrize("name", sorted(CONST_NEEDS))
def test_fn_needing_a_param_as_compile_time_value_is_checked_at_calls(name):
    fn, call, expected = CONST_NEEDS[name]
    kernel = KERNEL.replace("sem s;", "sem s;\n    sem t[2];")
    compile_text(fn + kernel.replace("CALL", ""), "t.mk", PROFILE, None)   # never called: no error
    x = np.random.default_rng(3).standard_normal((8, 128)).astype(np.float32)
    outs, _, _ = run(fn + kernel.replace("CALL", call), {"x": x})
    same(expected(x), outs["y"])


def test_fn_select_on_a_run_time_bool_argument_is_still_an_error_at_the_call():
    fn = "fn f(x: vmem f32[8, 128], b: bool) { let v = select(b, x[0:1, :], x[0:2, :]); v = 3.0; }"
    msg = compile_error(fn + KERNEL.replace("CALL", "f(a, q[0] > 1);"))
    assert ("t.mk:1:46: error: select() between views needs one dtype and shape, got f32[1, 128] and f32[2, 128] "
            "(in fn 'f' inlined at t.mk:7:5)") in msg
    fn = "fn g(x: vmem f32[8, 128], n: i32) { x = x + f32(mesh_dim(n)); }"
    msg = compile_error(fn + KERNEL.replace("CALL", "g(a, q[1]);"))
    assert "error: the axis of mesh_dim() must be a compile-time integer (in fn 'g' inlined at t.mk:7:5)" in msg


# An `if` on a scalar parameter is a compile-time `if` at a call that passes a constant:
# only the taken branch is checked, and a loop variable compared with the parameter is
# narrowed (docs/language.md, Control flow, Views). The fn's own check, with the
# parameter unknown, reported the untaken branch's errors.
IF_ON_PARAM = {
    "dead_branch": ("fn f(x: vmem f32[8, 128], n: i32) { if n > 8 { x[0, 0 +: 256] = 1.0; } else { x = 2.0; } }",
                    "f(a, 3);", lambda x: np.full((8, 128), 2, np.float32)),
    "narrowed_by_param": ("fn f(x: vmem f32[8, 128], n: i32) { for i in 0..8 { if i < n { x[i + 1, :] = 1.0; } } }",
                          "f(a, 7);", lambda x: np.concatenate([x[:1], np.ones((7, 128), np.float32)])),
    "narrowed_by_let": ("fn f(x: vmem f32[8, 128], n: i32) { let m = n - 1; for i in 0..8 { if i < m { "
                        "x[i + 2, :] = 1.0; } } }", "f(a, 7);",
                        lambda x: np.concatenate([x[:2], np.ones((6, 128), np.float32)])),
    "bool_param": ("fn f(x: vmem f32[8, 128], b: bool) { let c = !b; if c { x[:, 0 +: 200] = 1.0; } }", "f(a, true);",
                   lambda x: x),
}


@pytest.mark.parametrize("name", sorted(IF_ON_PARAM))
def test_fn_if_on_a_param_is_checked_at_calls(name):
    fn, call, expected = IF_ON_PARAM[name]
    compile_text(fn + KERNEL.replace("CALL", ""), "t.mk", PROFILE, None)   # never called: no error
    x = np.random.default_rng(4).standard_normal((8, 128)).astype(np.float32)
    outs, _, _ = run(fn + KERNEL.replace("CALL", call), {"x": x})
    same(expected(x), outs["y"])


def test_fn_if_on_a_param_still_reports_the_taken_branch_at_the_call():
    fn = "fn f(x: vmem f32[8, 128], n: i32) { if n > 8 { x[0, 0 +: 256] = 1.0; } else { x = 2.0; } }"
    msg = compile_error(fn + KERNEL.replace("CALL", "f(a, 9);"))
    assert ("t.mk:1:53: error: slice 0:256 is out of range for dimension 1 of 'a' (size 128) "
            "(in fn 'f' inlined at t.mk:7:5)") in msg
    fn = "fn f(x: vmem f32[8, 128], n: i32) { for i in 0..8 { if i < n { x[i + 1, :] = 1.0; } } }"
    msg = compile_error(fn + KERNEL.replace("CALL", "f(a, q[0]);"))
    assert "error: index ranging over 1..8 is out of range for dimension 0 of 'a' (size 8) (in fn 'f'" in msg
    # An error that does not depend on the parameter is still the fn's own, reported once.
    fn = "fn f(x: vmem f32[8, 128], n: i32) { x[0, 0 +: 256] = 1.0; if n > 8 { x = 2.0; } }"
    msg = compile_error(fn + KERNEL.replace("CALL", ""))
    assert msg.startswith("t.mk:1:42: error: slice 0:256 is out of range for dimension 1 of 'x' (size 128)\n")


def test_error_in_a_generic_kernel_instance_names_the_instance_and_its_launch():
    # It named neither: 'xv' (size 128) with xv declared f32[8, K] left the reader to
    # guess which launch made K 128.
    src = """\
kernel proj<K>(x: hbm f32[8, K], y: hbm f32[8, 128]) {
    vmem xv: f32[8, K];
    vmem yv: f32[8, 128];
    sem s;
    start copy(x, xv, s); wait copy(x, xv, s);
    yv = xv[:, 0:128] + xv[:, 128:256];
    start copy(yv, y, s); wait copy(yv, y, s);
}
host {
    input a: f32[8, 256];
    input b: f32[8, 128];
    output y: f32[8, 128];
    launch proj(a, y);
    launch proj(b, y);
}
"""
    assert compile_error(src).splitlines()[0] == (
        "t.mk:6:31: error: slice 128:256 is out of range for dimension 1 of 'xv' (size 128) "
        "(in kernel 'proj<128>' launched at t.mk:14:5)")


VIEWS = """kernel k(x: hbm f32[8, 128], w: hbm f32[3, 16, 128]) {{
    vmem xv: f32[8, 128];
    sem s;
    start copy(x, xv, s); wait copy(x, xv, s);
    {}
}}
"""


@pytest.mark.parametrize("body, message", [
    # A view indexed again is checked against the view's window, and said so: the message
    # named the buffer with the view's size ('xv' (size 4), xv having 8 rows) ...
    ("let t = xv[0:4, :]; xv[4:8, :] = t[2:6, :];", "slice 2:6 is out of range for dimension 0 of a view of 'xv' (size 4)"),
    ("let t = xv[:, 64:128]; xv[:, 0:64] = t[:, 32:96];",
     "slice 32:96 is out of range for dimension 1 of a view of 'xv' (size 64)"),
    # ... or the view's dimension number for the buffer's ('w' has 3 matrices of 16 rows).
    ("let r = w[1]; start copy(r[9:17, :], xv, s); wait copy(r[0:8, :], xv, s);",
     "slice 9:17 is out of range for dimension 1 of 'w' (size 16)"),
    ("xv = xv[:, 0:128][0:9, :];", "slice 0:9 is out of range for dimension 0 of 'xv' (size 8)"),
])
def test_out_of_range_index_of_a_view_names_the_view_or_the_buffer_dimension(body, message):
    assert f"error: {message}\n" in compile_error(VIEWS.format(body))


LINES = """kernel k(x: hbm f32[8, 128]) {
    vmem xv: f32[8, 128];
    sem s;
    start copy(x, xv, s); wait copy(x, xv, s);
    xv = xv + xv[:, 0:64];
}
"""


@pytest.mark.parametrize("odd", ["\x0c", "\x0b", "\u2028", "\x85", "\x1c"])
def test_error_shows_the_line_it_names_after_a_character_splitlines_breaks_at(odd):
    # A form feed (a page break), a Unicode line separator, ... in a comment or the
    # whitespace is not a line end to the lexer, which numbered the lines by '\n' while
    # the message showed str.splitlines()'s line: the one before the error.
    msg = compile_error(f"// page {odd} two\n" + LINES)
    assert msg.splitlines()[:2] == [
        "t.mk:6:10: error: shape mismatch: f32[8, 128] + f32[8, 64] cannot be broadcast together",
        "      xv = xv + xv[:, 0:64];"]
    msg = compile_error(f"// page {odd} two\n" + LINES.replace("0:64];", "0:64]"))
    assert msg.splitlines()[:2] == ["t.mk:7:1: error: unexpected '}'; expected one of: ';', '[', an operator", "  }"]
    # The listing's source lines (a fault's `source:`) likewise.
    program = compile_text(f"// page {odd} two\n" + LINES.replace("0:64]", "0:128]"), "t.mk", PROFILE, None)
    kernel = program.kernels["k"]
    lines = {kernel.source_line(pc) for pc in range(len(kernel.source_map))}
    assert "t.mk:6:5: xv = xv + xv[:, 0:128];" in lines


@pytest.mark.parametrize("newline", ["\r\n", "\r"])
def test_program_text_with_cr_line_ends_numbers_its_lines(newline):
    # A text given to the compiler (compile_source, load_program(text=...)) with CR line
    # ends was one line to the lexer: the error was at 1:125 under the first line.
    msg = compile_error(LINES.replace("\n", newline))
    assert msg.splitlines()[:2] == [
        "t.mk:5:10: error: shape mismatch: f32[8, 128] + f32[8, 64] cannot be broadcast together",
        "      xv = xv + xv[:, 0:64];"]
