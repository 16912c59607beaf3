"""Gaps found by helper 69's audit of docs/language.md and issues #3 / #14 against the
compiler: each test failed before its fix (a Python traceback or a wrong program)."""

import textwrap

import pytest

import mkemu
from mkemu.errors import SourceError


def errors(source: str, tmp_path) -> str:
    with pytest.raises(SourceError) as info:
        mkemu.compile_source(textwrap.dedent(source), tmp_path / "prog.mk", hw="test", mesh="1")
    return info.value.render()


# -- "a definition that depends on itself is an error" (Top level): a struct member sized by
#    vmem_bytes() of its own struct recursed until Python's stack overflowed (RecursionError),
#    and through a const the chain left the struct out (`C -> C`)


def test_struct_sized_by_its_own_vmem_bytes_is_a_cycle_error(tmp_path):
    assert errors("""\
    struct S { a: vmem f32[8, vmem_bytes(S)]; }
    kernel k(y: hbm f32[8, 128]) { }
    """, tmp_path) == (
        f"{tmp_path}/prog.mk:1:8: error: 'S' is defined in terms of itself: S -> S\n"
        "  struct S { a: vmem f32[8, vmem_bytes(S)]; }\n"
        "         ^"
    )


def test_struct_and_const_cycle_names_the_whole_chain(tmp_path):
    assert errors("""\
    const C = vmem_bytes(S) / 128;
    struct S { a: vmem f32[8, 128]; b: vmem f32[C, 128]; }
    kernel k(y: hbm f32[8, 128]) { }
    """, tmp_path) == (
        f"{tmp_path}/prog.mk:1:7: error: 'C' is defined in terms of itself: C -> S -> C\n"
        "  const C = vmem_bytes(S) / 128;\n"
        "        ^"
    )


def test_two_structs_sized_by_each_other_are_a_cycle_error(tmp_path):
    text = errors("""\
    struct T { a: vmem f32[8, vmem_bytes(S)]; }
    struct S { a: vmem f32[8, vmem_bytes(T)]; }
    kernel k(y: hbm f32[8, 128]) { }
    """, tmp_path)
    assert "error: 'T' is defined in terms of itself: T -> S -> T" in text


def test_vmem_bytes_of_a_struct_used_twice_is_not_a_cycle(tmp_path):
    # (the guard must not mistake two uses, or a use in a kernel, for a cycle)
    k = mkemu.compile_source(textwrap.dedent("""\
    struct S { a: vmem f32[8, 128]; }
    const C = vmem_bytes(S);
    const D = vmem_bytes(S) + C;
    assert D == 8192, "two instances of f32[8, 128] take 8192 bytes";
    kernel k(y: hbm f32[8, 128]) { let b = S(); vmem t: f32[8, vmem_bytes(S) / 32]; }
    """), tmp_path / "prog.mk", hw="test", mesh="1")
    assert k.buffers["y"].shape == (8, 128)


# -- "one that the fn's own check finds (see Functions) is reported once, at the fn, without a
#    call" (Errors): assigning to an fn's scalar parameter, or to a let computed from one, was
#    reported twice at the same place, once by the fn's own check and again, in other words
#    ("it is a compile-time constant (parameter)"), at every call passing a constant


def test_assignment_to_an_fn_parameter_is_reported_once_at_the_fn(tmp_path):
    assert errors("""\
    fn g(a: i32, m: smem i32[4]) { a = 3; }
    fn h(a: i32, m: smem i32[4]) { let n = a + 1; n = 3; m[0] = n; }
    kernel k(y: hbm i32[4]) { smem m: i32[4]; g(1, m); g(m[0], m); h(2, m); }
    """, tmp_path) == (
        f"{tmp_path}/prog.mk:1:32: error: cannot assign to 'a': it is a parameter (declare it with var)\n"
        "  fn g(a: i32, m: smem i32[4]) { a = 3; }\n"
        "                                 ^\n"
        f"{tmp_path}/prog.mk:2:47: error: cannot assign to 'n': it is a let binding (declare it with var)\n"
        "  fn h(a: i32, m: smem i32[4]) { let n = a + 1; n = 3; m[0] = n; }\n"
        "                                                ^"
    )


def test_assignment_in_an_fn_checked_only_at_its_calls_is_still_reported(tmp_path):
    # (n sizes a parameter, so the fn has no check of its own: the call reports it)
    text = errors("""\
    fn w(n: i32, x: vmem f32[8, n]) { n = 3; }
    kernel k(y: hbm i32[4]) { vmem v: f32[8, 128]; w(128, v); }
    """, tmp_path)
    assert text.startswith(f"{tmp_path}/prog.mk:1:35: error: cannot assign to 'n': it is a compile-time constant "
                           f"(parameter); declare a var to update it (in fn 'w' inlined at {tmp_path}/prog.mk:2:48)")


# -- "Functions return nothing and cannot recurse" (Functions): an fn whose own check depends
#    on its scalar parameters (here `if n > 0`) dropped that check's errors but kept its
#    recursion as "already reported", so at the call the recursive call was left out of the
#    program without an error (o[2], o[1], o[0] never written)


def test_recursion_in_an_fn_checked_at_its_calls_is_an_error_not_a_dropped_call(tmp_path):
    assert errors("""\
    fn f(n: i32, o: smem i32[8]) { o[n] = n; if n > 0 { f(n - 1, o); } }
    kernel k(y: hbm i32[8]) { smem o: i32[8]; sem s; f(3, o); start copy(o, y, s); wait copy(o, y, s); }
    """, tmp_path) == (
        f"{tmp_path}/prog.mk:1:53: error: recursive fn call: f -> f (fns are inlined) "
        f"(in fn 'f' inlined at {tmp_path}/prog.mk:2:50)\n"
        "  fn f(n: i32, o: smem i32[8]) { o[n] = n; if n > 0 { f(n - 1, o); } }\n"
        "                                                      ^^^^^^^^^^^"
    )


def test_mutual_recursion_through_a_run_time_argument_is_an_error(tmp_path):
    text = errors("""\
    fn f(n: i32) { f2(n); }
    fn f2(n: i32) { if n > 0 { f(n - 1); } }
    kernel k(y: hbm i32[4]) { smem m: i32[4]; f(m[0]); }
    """, tmp_path)
    assert "error: recursive fn call: f -> f2 -> f (fns are inlined)" in text
