"""Gaps found by checking docs/language.md's less-travelled features against the compiler
(helper audit c): each test failed before its fix."""

import pytest

from mkemu.dsl.frontend import load_program
from mkemu.errors import SourceError


def messages(source: str) -> list[str]:
    with pytest.raises(SourceError) as info:
        load_program("prog.mk", text=source)
    return [line.split("error: ", 1)[1] for line in info.value.render().splitlines() if ": error: " in line]


# -- "all errors of a program are reported together": a start, signal or wait that fails
#    to check must not make its correct partner statement an error too (the semaphore
#    checks after the body used to see neither its raise nor its wait)

HEAD = "kernel k(a: hbm f32[8, 128]) {\n    vmem v: f32[8, 128];\n    vmem u: f32[8, 256];\n    sem s;\n    sem r;\n"


@pytest.mark.parametrize("body, message", [
    ("start copy(nope, v, s); wait copy(a, v, s);", "unknown name 'nope'"),
    ("start copy(a, u, s); wait copy(a, v, s);", "shape mismatch: copy from [8, 128] to [8, 256]"),
    ("start copy(a[0:8, 0:200], v, s); wait copy(a, v, s);",
     "slice 0:200 is out of range for dimension 1 of 'a' (size 128)"),
    ("start copy(a, v, q); wait copy(a, v, s);", "unknown name 'q'"),
    ("signal(s, nope); wait(s, 1);", "unknown name 'nope'"),
    ("start copy(a, v, s); wait copy(nope, v, s);", "unknown name 'nope'"),
    ("signal(s, 1); wait(s, nope);", "unknown name 'nope'"),
    ("start copy(a, v, s); wait recv copy(a, v, s);",
     "'wait recv' is for remote copies (copy(src, dst @ core, send, recv))"),
    ("start copy(v, u @ 1, s, r); wait copy(v, v @ 1, s, r); wait recv copy(v, v @ 1, s, r);",
     "shape mismatch: copy from [8, 128] to [8, 256]"),
    ("let h = copy(a, nope, s); start h; wait copy(a, v, s);", "unknown name 'nope'"),
])
def test_a_failed_semaphore_statement_does_not_make_its_partner_an_error(body, message):
    assert messages(HEAD + "    " + body + "\n}\n") == [message]


def test_the_semaphore_checks_still_report_other_semaphores():
    body = "start copy(nope, v, s); wait copy(a, v, s); wait(r, 1);"
    assert messages(HEAD + "    " + body + "\n}\n") == [
        "unknown name 'nope'", "wait on semaphore 'r', but no started DMA or signal ever targets it"]


def test_a_struct_member_typo_in_a_start_is_one_error():
    src = ("struct A { x: hbm f32[8, 128]; }\n"
           "kernel k(a: A) { vmem v: f32[8, 128]; sem s; start copy(a.y, v, s); wait copy(a.x, v, s); }\n")
    assert messages(src) == ["struct 'A' has no member 'y' (its members: x)"]


# -- "a param is an integer": a param's non-integer value is not told it may be a bool


def test_a_float_param_is_told_params_are_integers():
    assert messages("param A = 1.5;\nkernel k(a: hbm f32[8, 128]) { }\n") == [
        "the value of param 'A' must be a compile-time integer (params are set from outside as integers)"]
    assert messages("const A = 1.5;\nkernel k(a: hbm f32[8, 128]) { }\n") == [
        "the value of const 'A' must be a compile-time integer or bool"]


# -- "local names (fn parameters and generic names included) may not shadow globals": an
#    fn checked only at its calls (generic, or sized by a parameter) bound them unchecked


@pytest.mark.parametrize("fn", [
    "fn f(y: vmem f32[r, 128], r: i32) { y[:, :] = y[:, :] + 1.0; }",
    "fn f<R>(y: vmem f32[R, 128]) { y[:, :] = y[:, :] + 1.0; }",
    "fn f<y>(x: vmem f32[y, 128]) { x[:, :] = x[:, :] + 1.0; }",
])
def test_an_fn_checked_at_its_calls_may_not_shadow_a_global(fn):
    src = fn + "\nconst y = 3;\nkernel k() { vmem b: f32[8, 128]; f(b, 8); }\n"
    src = src.replace("f(b, 8)", "f(b)") if "<" in fn else src
    assert "redefinition of 'y' (first defined at prog.mk:2:7)" in messages(src)
