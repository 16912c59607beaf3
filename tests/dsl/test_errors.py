"""Golden error text (with carets) for every kind of compile error the front end reports."""

import textwrap

import pytest

from mkemu.dsl.frontend import load_program
from mkemu.errors import ConfigError, SourceError


def errors(source: str, tmp_path, monkeypatch, files: dict[str, str] | None = None, params=None) -> str:
    monkeypatch.chdir(tmp_path)
    for name, text in (files or {}).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    (tmp_path / "prog.mk").write_text(textwrap.dedent(source))
    with pytest.raises(SourceError) as info:
        load_program("prog.mk", params)
    return info.value.render()


KERNEL = """\
kernel kern(a: hbm f32[8, 256], w: hbm bf16[256, 256]) {{
    vmem x: f32[8, 256];
    vmem wb: bf16[256, 256];
    sem s;
{body}
}}
"""


def kernel_errors(body: str, tmp_path, monkeypatch) -> str:
    body = textwrap.indent(textwrap.dedent(body), "    ")
    return errors(KERNEL.format(body=body.rstrip("\n")), tmp_path, monkeypatch)


def test_unknown_name(tmp_path, monkeypatch):
    assert kernel_errors("x = x * scale;", tmp_path, monkeypatch) == (
        "prog.mk:5:13: error: unknown name 'scale'\n"
        "      x = x * scale;\n"
        "              ^^^^^"
    )


def test_unknown_function(tmp_path, monkeypatch):
    assert kernel_errors("x = gelu(x);", tmp_path, monkeypatch) == (
        "prog.mk:5:9: error: unknown function 'gelu'\n"
        "      x = gelu(x);\n"
        "          ^^^^"
    )


def test_redefinition(tmp_path, monkeypatch):
    assert kernel_errors("vmem x: f32[8, 8];", tmp_path, monkeypatch) == (
        "prog.mk:5:10: error: redefinition of 'x' (first defined at prog.mk:2:10)\n"
        "      vmem x: f32[8, 8];\n"
        "           ^"
    )


def test_global_redefinition_across_files(tmp_path, monkeypatch):
    out = errors('import "lib.mk";\nconst D = 2;\n', tmp_path, monkeypatch, {"lib.mk": "param D = 1;\n"})
    assert out == (
        "prog.mk:2:7: error: redefinition of 'D' (first defined at lib.mk:1:7)\n"
        "  const D = 2;\n"
        "        ^"
    )


def test_wrong_argument_count(tmp_path, monkeypatch):
    src = "fn f(x: vmem f32[8, 256]) { x = x * 2.0; }\n" + KERNEL.format(body="    f(x, x);\n    x = exp(x, 2);")
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:6:5: error: fn 'f' takes 1 argument, got 2\n"
        "      f(x, x);\n"
        "      ^^^^^^^\n"
        "prog.mk:7:9: error: exp() takes 1 argument, got 2\n"
        "      x = exp(x, 2);\n"
        "          ^^^^^^^^^"
    )


def test_wrong_launch_argument_count(tmp_path, monkeypatch):
    src = KERNEL.format(body="") + "host {\n    input a: f32[8, 256];\n    launch kern(a);\n}\n"
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:9:5: error: kernel 'kern' takes 2 arguments, got 1\n"
        "      launch kern(a);\n"
        "      ^^^^^^^^^^^^^^^"
    )


def test_shape_mismatch(tmp_path, monkeypatch):
    assert kernel_errors("x = x + x[:, 0:128];", tmp_path, monkeypatch) == (
        "prog.mk:5:9: error: shape mismatch: f32[8, 256] + f32[8, 128] cannot be broadcast together\n"
        "      x = x + x[:, 0:128];\n"
        "          ^^^^^^^^^^^^^^^"
    )


def test_broadcasting_is_allowed(tmp_path, monkeypatch):
    src = KERNEL.format(body="    x = x * sum(x, axis=1) + f32(wb[0:1, :]) + 1.0;\n    start copy(a, x, s);\n    wait copy(a, x, s);")
    (tmp_path / "prog.mk").write_text(src)
    monkeypatch.chdir(tmp_path)
    load_program("prog.mk")


def test_shape_mismatch_in_matmul(tmp_path, monkeypatch):
    assert kernel_errors("x = matmul(bf16(x), wb[0:128, :]);", tmp_path, monkeypatch) == (
        "prog.mk:5:9: error: shape mismatch: matmul [8, 256] x [128, 256] (inner dimensions differ)\n"
        "      x = matmul(bf16(x), wb[0:128, :]);\n"
        "          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^"
    )


def test_dtype_mismatch_matmul(tmp_path, monkeypatch):
    assert kernel_errors("x = matmul(x, wb);", tmp_path, monkeypatch) == (
        "prog.mk:5:9: error: dtype mismatch: matmul operands must both be bf16 or both f32, got f32 and bf16\n"
        "      x = matmul(x, wb);\n"
        "          ^^^^^^^^^^^^^"
    )


def test_dtype_mismatch_store(tmp_path, monkeypatch):
    body = "vmem o: i32[8, 256];\no = x;\nwb = x;"
    assert kernel_errors(body, tmp_path, monkeypatch) == (
        "prog.mk:6:5: error: dtype mismatch: storing f32 into i32 buffer 'o'; convert explicitly with i32(...)\n"
        "      o = x;\n"
        "      ^^^^^^\n"
        "prog.mk:7:5: error: dtype mismatch: storing f32 into bf16 buffer 'wb'; round explicitly with bf16(...)\n"
        "      wb = x;\n"
        "      ^^^^^^^"
    )


def test_dtype_mismatch_bf16_arithmetic(tmp_path, monkeypatch):
    assert kernel_errors("x = x * wb[0:8, :];", tmp_path, monkeypatch) == (
        "prog.mk:5:9: error: dtype mismatch: f32[8, 256] * bf16[8, 256]; convert one side with f32(), i32() or bf16()\n"
        "      x = x * wb[0:8, :];\n"
        "          ^^^^^^^^^^^^^^"
    )


def test_out_of_range_static_slice(tmp_path, monkeypatch):
    assert kernel_errors("x = x[:, 200:300] * 2.0;", tmp_path, monkeypatch) == (
        "prog.mk:5:14: error: slice 200:300 is out of range for dimension 1 of 'x' (size 256)\n"
        "      x = x[:, 200:300] * 2.0;\n"
        "               ^^^^^^^"
    )


def test_out_of_range_loop_slice(tmp_path, monkeypatch):
    body = "for k in 0..3 {\n    x[:, k*128 +: 128] = 1.0;\n}"
    assert kernel_errors(body, tmp_path, monkeypatch) == (
        "prog.mk:6:14: error: slice reaching 0..384 is out of range for dimension 1 of 'x' (size 256)\n"
        "          x[:, k*128 +: 128] = 1.0;\n"
        "               ^^^^^^^^^^^^"
    )


def test_loop_slice_guarded_by_if_is_fine(tmp_path, monkeypatch):
    body = "for k in 0..3 {\n    if k < 2 { x[:, k*128 +: 128] = 1.0; }\n}"
    src = KERNEL.format(body=textwrap.indent(body, "    "))
    (tmp_path / "prog.mk").write_text(src)
    monkeypatch.chdir(tmp_path)
    load_program("prog.mk")


def test_slice_length_must_be_static(tmp_path, monkeypatch):
    body = "for k in 0..2 {\n    x[:, 0:k] = 1.0;\n}"
    assert kernel_errors(body, tmp_path, monkeypatch) == (
        "prog.mk:6:14: error: slice length must be known at compile time; write start +: LENGTH\n"
        "          x[:, 0:k] = 1.0;\n"
        "               ^^^"
    )


def test_wait_on_semaphore_never_started(tmp_path, monkeypatch):
    body = "sem t;\nwait(t, 4);\nwait copy(a, x, s);"
    assert kernel_errors(body, tmp_path, monkeypatch) == (
        "prog.mk:6:5: error: wait on semaphore 't', but no started DMA or signal ever targets it\n"
        "      wait(t, 4);\n"
        "      ^^^^^^^^^^^\n"
        "prog.mk:7:5: error: wait on semaphore 's', but no started DMA or signal ever targets it\n"
        "      wait copy(a, x, s);\n"
        "      ^^^^^^^^^^^^^^^^^^^"
    )


def test_unused_dma(tmp_path, monkeypatch):
    body = "let h = copy(a, x, s);\nstart copy(w, wb, s);"
    assert kernel_errors(body, tmp_path, monkeypatch) == (
        "prog.mk:5:5: error: DMA 'h' is described but never started or waited\n"
        "      let h = copy(a, x, s);\n"
        "      ^^^^^^^^^^^^^^^^^^^^^^\n"
        "prog.mk:6:5: error: DMA started on semaphore 's' is never waited (every semaphore must be back to 0 when the kernel ends)\n"
        "      start copy(w, wb, s);\n"
        "      ^^^^^^^^^^^^^^^^^^^^^"
    )


def test_import_cycle(tmp_path, monkeypatch):
    files = {"a.mk": 'import "b.mk";\n', "b.mk": 'import "a.mk";\n'}
    assert errors('import "a.mk";\n', tmp_path, monkeypatch, files) == (
        'b.mk:1:1: error: import cycle: a.mk -> b.mk -> a.mk\n'
        '  import "a.mk";\n'
        '  ^^^^^^^^^^^^^^'
    )


def test_import_of_self(tmp_path, monkeypatch):
    assert errors('import "prog.mk";\n', tmp_path, monkeypatch) == (
        'prog.mk:1:1: error: import cycle: prog.mk -> prog.mk\n'
        '  import "prog.mk";\n'
        '  ^^^^^^^^^^^^^^^^^'
    )


def test_missing_import(tmp_path, monkeypatch):
    out = errors('// header\nimport "lib/missing.mk";\n', tmp_path, monkeypatch)
    first, line, carets = out.split("\n")
    assert first.startswith("prog.mk:2:1: error: cannot find imported file 'lib/missing.mk' (looked for ")
    assert line == '  import "lib/missing.mk";'
    assert carets == "  " + "^" * len('import "lib/missing.mk";')


@pytest.mark.parametrize("statement, what", [
    ('import "loop_a.mk";', "cannot read imported file 'loop_a.mk': "),
    ('reference "ref_a.py:reference";', "cannot read reference file 'ref_a.py': "),
    (f'import "{"a" * 300}.mk";', "cannot read imported file 'aaaa"),
    (f'reference "{"a" * 300}.py:reference";', "cannot read reference file 'aaaa"),
])
def test_an_import_or_reference_the_file_system_cannot_resolve_is_an_error_at_its_line(tmp_path, monkeypatch,
                                                                                      statement, what):
    # A symlink loop (RuntimeError from resolve) and a name too long for the file system
    # (OSError) escaped as Python exceptions.
    for a, b in (("loop_a.mk", "loop_b.mk"), ("loop_b.mk", "loop_a.mk"), ("ref_a.py", "ref_b.py"),
                 ("ref_b.py", "ref_a.py")):
        (tmp_path / a).symlink_to(b)
    out = errors(statement + "\nkernel k(a: hbm f32[8, 128]) { }\n", tmp_path, monkeypatch)
    assert out.startswith("prog.mk:1:1: error: " + what) and len(out.splitlines()) == 3


@pytest.mark.parametrize("target", ["/dev/zero", "folder"])
def test_an_import_of_what_is_not_a_file_is_refused_unread(tmp_path, monkeypatch, target):
    # /dev/zero was read until memory ran out
    (tmp_path / "folder").mkdir()
    out = errors(f'import "{target}";\n', tmp_path, monkeypatch)
    assert out.startswith(f"prog.mk:1:1: error: cannot read imported file '{target}': it is not a regular file")


def test_syntax_error_in_imported_file(tmp_path, monkeypatch):
    out = errors('import "lib.mk";\n', tmp_path, monkeypatch, {"lib.mk": "param D = ;\n"})
    assert out.startswith("lib.mk:1:11: error: unexpected ';'; expected an expression")


def test_all_errors_collected_and_sorted(tmp_path, monkeypatch):
    body = "x = y;\nvmem x: f32[1, 1];\nx = x[:, 0:300];"
    out = kernel_errors(body, tmp_path, monkeypatch)
    heads = [line for line in out.split("\n") if ": error: " in line]
    assert [h.split(": error: ")[0] for h in heads] == ["prog.mk:5:9", "prog.mk:6:10", "prog.mk:7:14"]


def test_error_inside_inlined_fn_names_the_call(tmp_path, monkeypatch):
    src = (
        "fn tile(x: vmem f32[8, n], n: i32) { x[:, 0:128] = 1.0; }\n"
        + KERNEL.format(body="    vmem small: f32[8, 64];\n    tile(small, 64);")
    )
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:1:43: error: slice 0:128 is out of range for dimension 1 of 'small' (size 64)"
        " (in fn 'tile' inlined at prog.mk:7:5)\n"
        "  fn tile(x: vmem f32[8, n], n: i32) { x[:, 0:128] = 1.0; }\n"
        "                                            ^^^^^"
    )


def test_a_parameter_type_sized_by_bad_arguments_is_one_error_naming_them(tmp_path, monkeypatch):
    # Every parameter the two sized was an error of its own (four for this call), none
    # saying which argument made the dimension 0.
    src = (
        "fn pair(x: vmem f32[m * c, 128], y: vmem f32[m * c, 128], t: smem i32[m], s: sem[m], m: i32, c: i32) { }\n"
        + KERNEL.format(body="    vmem v: f32[8, 128];\n    smem n: i32[8];\n    sem q[8];\n    pair(v, v, n, q, 8, 0);")
    )
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:1:21: error: dimensions must be positive, got 0; the call passes m = 8, c = 0"
        " (in fn 'pair' inlined at prog.mk:9:5)\n"
        "  fn pair(x: vmem f32[m * c, 128], y: vmem f32[m * c, 128], t: smem i32[m], s: sem[m], m: i32, c: i32) { }\n"
        "                      ^^^^^"
    )


def test_a_bad_count_in_an_fn_names_what_the_call_passes(tmp_path, monkeypatch):
    src = "fn f(d: i32) { sem s[d - 2]; }\n" + KERNEL.format(body="    f(2);")
    assert errors(src, tmp_path, monkeypatch).startswith(
        "prog.mk:1:22: error: count must be positive, got 0; the call passes d = 2 (in fn 'f' inlined at prog.mk:6:5)")


def test_param_override_and_unknown_override(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.mk").write_text("param D = 128;\nconst N = D / 64;\n")
    assert load_program("p.mk", {"D": 512}).consts == {"N": 8}
    with pytest.raises(ConfigError, match="unknown program parameter 'X'"):
        load_program("p.mk", {"X": 1})
    with pytest.raises(ConfigError, match="'N' is a const, not a param"):
        load_program("p.mk", {"N": 1})


def test_param_set_from_outside_must_be_a_declared_value(tmp_path, monkeypatch):
    src = 'param ES = 2 in {1, 2, 4} "slots in flight";\nparam TK = 256 in 128..513 step 128;\n'
    assert errors(src, tmp_path, monkeypatch, params={"ES": 3, "TK": 256}) == (
        "prog.mk:1:14: error: ES = 3 (set from outside) is not one of its declared values: 1, 2, 4\n"
        '  param ES = 2 in {1, 2, 4} "slots in flight";\n'
        "               ^^^^^^^^^^^^"
    )
    assert "TK = 64 (set from outside) is not one of its declared values: 128, 256, 384, 512" in errors(
        src, tmp_path, monkeypatch, params={"TK": 64})


def test_a_param_set_outside_its_values_is_the_only_error_it_causes(tmp_path, monkeypatch):
    # The rest of the program is checked with the default: a kernel that only works
    # for the declared values does not add errors of its own (K3's SCHEME=2 gave four
    # misleading "wait ... no started DMA" errors before the real one).
    src = """\
param MODE = 0 in {0, 1};
const EP = MODE == 1;
const N = select(EP, 256, 128);
kernel k(a: hbm f32[8, 128], out: hbm f32[8, 128]) {
    vmem x: f32[8, N];
    sem s;
    if !EP { start copy(a, x[:, 0:128], s); }
    wait(s, 4096);
    start copy(x[:, 0:128], out, s);
    wait copy(x[:, 0:128], out, s);
}
"""
    assert errors(src, tmp_path, monkeypatch, params={"MODE": 2}) == (
        "prog.mk:1:16: error: MODE = 2 (set from outside) is not one of its declared values: 0, 1\n"
        "  param MODE = 0 in {0, 1};\n"
        "                 ^^^^^^^^^"
    )


def test_param_declared_values(tmp_path, monkeypatch):
    src = ("param A = 3 in {1, 2};\nparam B = 1 in {1, 1};\nparam C = 1 in 5..2;\n"
           "param D = 1 in 0..4 step 0;\nparam E = 1 in {E, 1};\nparam F = 0 in 0..5000;\n")
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:1:11: error: the default 3 of param 'A' is not one of its declared values: 1, 2\n"
        "  param A = 3 in {1, 2};\n"
        "            ^\n"
        "prog.mk:2:20: error: the value 1 is listed twice\n"
        "  param B = 1 in {1, 1};\n"
        "                     ^\n"
        "prog.mk:3:13: error: the range 5..2 holds no value (its end is excluded, as in `for`)\n"
        "  param C = 1 in 5..2;\n"
        "              ^^^^^^^\n"
        "prog.mk:4:26: error: the step of a param range must be positive, got 0\n"
        "  param D = 1 in 0..4 step 0;\n"
        "                           ^\n"
        "prog.mk:5:7: error: 'E' is defined in terms of itself: E -> E\n"
        "  param E = 1 in {E, 1};\n"
        "        ^\n"
        "prog.mk:6:13: error: a param takes at most 4096 values; this range holds 5000\n"
        "  param F = 0 in 0..5000;\n"
        "              ^^^^^^^^^^"
    )


def test_assert_failure(tmp_path, monkeypatch):
    assert errors('param D = 100;\nassert D % 128 == 0, "D must be a multiple of 128";\n', tmp_path, monkeypatch) == (
        "prog.mk:2:1: error: assertion failed: D must be a multiple of 128\n"
        '  assert D % 128 == 0, "D must be a multiple of 128";\n'
        "  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^"
    )


def test_cyclic_consts(tmp_path, monkeypatch):
    out = errors("const A = B + 1;\nconst B = A;\n", tmp_path, monkeypatch)
    assert "'A' is defined in terms of itself: A -> B -> A" in out


def test_recursive_fn(tmp_path, monkeypatch):
    src = "fn f(x: vmem f32[8, 256]) { f(x); }\n" + KERNEL.format(body="    f(x);")
    assert "recursive fn call: f -> f (fns are inlined)" in errors(src, tmp_path, monkeypatch)


def test_mutually_recursive_fns_are_one_error(tmp_path, monkeypatch):
    src = "fn f(s: sem) { g(s); }\nfn g(s: sem) { f(s); }\nkernel k() {\n    sem a;\n    f(a);\n}\n"
    out = errors(src, tmp_path, monkeypatch)
    assert out.count("recursive fn call") == 1 and ("g -> f -> g" in out or "f -> g -> f" in out)


def test_a_recursion_an_fns_own_check_finds_names_no_call(tmp_path, monkeypatch):
    """docs/language.md: reported once, at the fn, without a call (it named the recursive
    call itself as the call it was inlined at)."""
    src = "fn f(s: sem) { g(s); }\nfn g(s: sem) { f(s); }\nkernel k() {\n    sem a;\n    f(a);\n}\n"
    first = errors(src, tmp_path, monkeypatch).splitlines()[0]
    assert first == "prog.mk:1:16: error: recursive fn call: g -> f -> g (fns are inlined)"


def test_a_recursion_entered_from_outside_its_cycle_names_every_call_its_place_is_inlined_at(tmp_path, monkeypatch):
    src = "fn a(n: i32) { b(n); }\nfn b(n: i32) { c(n); }\nfn c(n: i32) { b(n); }\nkernel k() { a(1); }\n"
    first = errors(src, tmp_path, monkeypatch).splitlines()[0]
    assert first == ("prog.mk:3:16: error: recursive fn call: b -> c -> b (fns are inlined) "
                     "(in fn 'c' inlined at prog.mk:2:16, in fn 'b' inlined at prog.mk:1:16)")


@pytest.mark.parametrize("param, arg, message", [
    ("s: sem", "a", "parameter 's' of fn 'f' takes one semaphore, got the array 'a' of 2: index the array"),
    ("s: sem[3]", "a", "parameter 's' of fn 'f' takes an array of 3 semaphores, got the array 'a' of 2"),
    ("s: sem[3]", "b", "parameter 's' of fn 'f' takes an array of 3 semaphores, got one semaphore"),
])
def test_a_semaphore_argument_of_the_wrong_count_names_the_fn_and_what_it_got(tmp_path, monkeypatch, param, arg,
                                                                                message):
    src = f"fn f({param}) {{ }}\nkernel k() {{\n    sem a[2];\n    sem b;\n    f({arg});\n}}\n"
    assert f"prog.mk:5:7: error: {message}" in errors(src, tmp_path, monkeypatch)


def test_a_keyword_argument_given_twice_is_an_error(tmp_path, monkeypatch):
    """`sum(x, axis=1, axis=0)` is not `sum(x, axis=0)`: the second axis is an error at it."""
    src = "kernel k() {\n    vmem x: f32[8, 128];\n    vmem y: f32[8, 1];\n    y = max(x, axis=1, axis=0);\n}\n"
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:4:24: error: max() is given keyword argument 'axis' twice\n"
        "      y = max(x, axis=1, axis=0);\n"
        "                         ^^^^^^"
    )


def test_a_run_time_integer_divided_by_the_constant_zero_is_an_error(tmp_path, monkeypatch):
    src = "kernel k() {\n    smem m: i32[4];\n    m[0] = m[1] / 0;\n    m[2] = m[3] % (2 - 2);\n}\n"
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:3:12: error: division by zero: the divisor of '/' is the constant 0\n"
        "      m[0] = m[1] / 0;\n"
        "             ^^^^^^^^\n"
        "prog.mk:4:12: error: division by zero: the divisor of '%' is the constant 0\n"
        "      m[2] = m[3] % (2 - 2);\n"
        "             ^^^^^^^^^^^^^^"
    )


def test_a_positional_argument_after_a_keyword_is_an_error(tmp_path, monkeypatch):
    src = "kernel k() {\n    vmem x: f32[8, 128];\n    vmem y: f32[8, 1];\n    y = sum(axis=1, x);\n}\n"
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:4:21: error: a positional argument follows a keyword argument\n"
        "      y = sum(axis=1, x);\n"
        "                      ^"
    )


# A branch that never runs (its condition false whatever the run-time operands: `&&`
# evaluates both sides, so `V == 1 && core_id() == 0` is no constant) counts for nothing
# in the semaphore checks; a branch that may run counts as before.
DEAD_BRANCH = """\
param V = 0;
kernel k(x: hbm f32[8, 128]) {
    vmem a: f32[8, 128];
    sem flag;
    sem s;
    if V == 1 && core_id() == 0 { signal(flag, 1); }
    if V == 1 { wait(flag, 1); }
    if !(V == 0 || core_id() == 1) { start copy(x, a, s); }
    if V == 1 || core_id() == 1 { wait copy(x, a, s); }
}
"""


def test_a_branch_that_never_runs_counts_for_nothing_in_the_semaphore_checks(tmp_path, monkeypatch):
    # The first two branches balance out only at V = 1; the start is dead at V = 0 while
    # its wait may still run: a wait that nothing raises.
    assert errors(DEAD_BRANCH, tmp_path, monkeypatch, params={"V": 0}) == (
        "prog.mk:9:35: error: wait on semaphore 's', but no started DMA or signal ever targets it\n"
        "      if V == 1 || core_id() == 1 { wait copy(x, a, s); }\n"
        "                                    ^^^^^^^^^^^^^^^^^^^")
    monkeypatch.chdir(tmp_path)
    load_program("prog.mk", {"V": 1})   # every branch may run: balanced


@pytest.mark.parametrize("cond, truth", [
    ("false", False), ("true", True), ("false && x", False), ("x && false", False), ("x && true", None),
    ("true || x", True), ("x || false", None), ("!(x || true)", False), ("!(false && x)", True),
    ("(false || false) && x", False), ("x", None)])
def test_provably_decides_only_what_no_run_time_operand_can_change(cond, truth):
    from mkemu.dsl import ir
    from mkemu.dsl.statements import provably

    span = None
    x = ir.ScalarOp("==", (ir.ScalarVar("v", "loop", span), ir.Const(0, span)), span)

    def parse(text: str):
        text = text.strip()
        if text.startswith("!("):
            return ir.ScalarOp("!", (parse(text[2:-1]),), span)
        if text.startswith("(") and ")" in text:
            inner, rest = text[1:].split(")", 1)
            if not rest.strip():
                return parse(inner)
            op, right = rest.strip().split(" ", 1)
            return ir.ScalarOp(op, (parse(inner), parse(right)), span)
        for op in ("||", "&&"):
            if f" {op} " in text:
                left, right = text.split(f" {op} ", 1)
                return ir.ScalarOp(op, (parse(left), parse(right)), span)
        return {"false": ir.Const(0, span, "bool"), "true": ir.Const(1, span, "bool"), "x": x}[text]

    node = parse(cond)
    assert provably(node, False) == (truth is False)
    assert provably(node, True) == (truth is True)
