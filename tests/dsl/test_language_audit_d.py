"""Gaps found by checking docs/language.md against the compiler (helper audit d): each
test failed before its fix."""

import pytest

from mkemu.dsl.compiler import compile_text
from mkemu.errors import SourceError

COPY_IN = "    vmem x: f32[8, 128];\n    sem s;\n    start copy(a, x, s);\n    wait copy(a, x, s);\n"
COPY_OUT = "    start copy(x, out, s);\n    wait copy(x, out, s);\n"


def kernel(body: str) -> str:
    return "kernel k(a: hbm f32[8, 128], out: hbm f32[8, 128]) {\n" + COPY_IN + body + COPY_OUT + "}\n"


def error_lines(source: str, params: dict | None = None) -> list[str]:
    """The rendered `file:line:col: error: ...` lines of compiling `source`."""
    with pytest.raises(SourceError) as info:
        compile_text(source, "prog.mk", "test", params)
    return [line for line in info.value.render().splitlines() if ": error: " in line]


# -- Generics: "a generic kernel exists only through launches, so a program with one needs
#    a host block" (it was silently left out, its body never checked)

def test_a_generic_kernel_beside_the_one_kernel_of_a_program_without_host_is_an_error_at_it():
    source = "kernel g<R>(x: hbm f32[8, R]) { undefined_thing(x); }\n" + kernel("")
    assert error_lines(source) == [(
        "prog.mk:1:1: error: generic kernel 'g' is made only by launches, so a program with one needs a host "
        "block that launches its kernels; add `host { ... launch ...; }` or remove 'g'")]


def test_a_program_of_only_generic_kernels_without_host_points_at_the_generic_kernel():
    lines = error_lines("\nkernel g<R>(x: hbm f32[8, R]) { }\n")
    assert lines == [("prog.mk:2:1: error: a program without a host block must have exactly one kernel (it has 0; "
                      "a generic kernel is made only by launches); add `host { ... launch ...; }`")]



def test_a_scalar_parameter_of_a_program_without_host_asks_for_a_host_block():
    # language.md: "a parameter that is not an HBM array is a compile error asking for a host block"
    lines = error_lines("kernel k(a: hbm f32[8, 128], n: i32) { }\n")
    assert lines == [("prog.mk:1:30: error: kernel 'k' has a scalar parameter 'n': a program without a host block "
                      "passes only HBM arrays; add `host { ... launch ...; }` to pass it")]

# -- Lexical structure: `recv` right after `wait` is the keyword, `input` / `output` at the
#    start of a statement are: a name spelled so is told why it cannot stand there

RECV_AFTER_WAIT = ("'recv' right after 'wait' is the receive keyword (`wait recv h;`), so a count or copy named "
                   "'recv' must be in parentheses there: `wait (recv) * h;`")


@pytest.mark.parametrize("body, where", [
    ("    let recv = 1;\n    start copy(a, x, s);\n    wait recv * copy(a, x, s);\n", "8:15: error: unexpected '*'"),
    ("    let recv = copy(a, x, s);\n    start recv;\n    wait recv;\n", "8:14: error: unexpected ';'"),
])
def test_a_name_recv_right_after_wait_is_told_it_is_the_keyword(body, where):
    assert error_lines(kernel(body)) == [f"prog.mk:{where}; {RECV_AFTER_WAIT}"]


def test_a_name_recv_in_parentheses_after_wait_is_the_name():
    compile_text(kernel("    let recv = 1;\n    start copy(a, x, s);\n    wait (recv) * copy(a, x, s);\n"),
                 "prog.mk", "test")
    compile_text(kernel("    let recv = copy(a, x, s);\n    start recv;\n    wait (recv);\n"), "prog.mk", "test")


@pytest.mark.parametrize("word, body", [
    ("input", "    var input: i32 = 2;\n    input = 3;\n    x = x * f32(input);\n"),
    ("output", "    vmem output: f32[8, 128];\n    output = x;\n    x = output;\n"),
    ("output", "    vmem output: f32[8, 128];\n    if true { output[0, :] = x[0, :]; }\n"),
])
def test_a_name_input_or_output_starting_a_statement_is_told_to_rename_it(word, body):
    [line] = error_lines(kernel(body))
    assert line.startswith("prog.mk:7:")
    assert line.endswith(f"'{word}' at the start of a statement declares an {word} or a pipeline stream "
                         f"(`{word} NAME: TYPE;`, `{word} NAME = VIEW;`), so a name '{word}' cannot start one: "
                         "rename it")


# -- a compile-time bool in a tile expression is told what a run-time one is

BOOL_IN_TILE = "a bool scalar cannot be used in a tile expression; choose with select(...) or if"


@pytest.mark.parametrize("cond", ["1 < 2", "core_id() < 2"])
@pytest.mark.parametrize("use", ["x = x * b;", "x = f32((x > 0.0) & b);"])
def test_a_bool_scalar_in_a_tile_expression_compile_time_or_not(cond, use):
    [line] = error_lines(kernel(f"    let b = {cond};\n    {use}\n"))
    assert line.endswith("error: " + BOOL_IN_TILE)


def test_an_integer_constant_as_a_mask_is_still_told_to_compare_tiles():
    [line] = error_lines(kernel("    x = f32((x > 0.0) & 1);\n"))
    assert line.endswith("error: a constant cannot be used as a mask; compare tiles to make one")


# -- a dtype in a `let` (only a const names a dtype) is told so, not "call it with (...)"

def dtype_message(name: str) -> str:
    return (f"'{name}' is a dtype, not a value: only a const can name one, chosen on a compile-time condition "
            f"(`const T = select(P == 1, bf16, f32);`); to convert, call {name}(...)")


def test_a_let_naming_a_dtype_is_told_only_a_const_can():
    assert error_lines(kernel("    let T = select(core_id() == 0, bf16, f32);\n")) == [
        "prog.mk:6:36: error: " + dtype_message("bf16"), "prog.mk:6:42: error: " + dtype_message("f32")]
    # (and the declaration that uses it is not a second error)
    assert error_lines(kernel("    let T = bf16;\n    var v: T[8, 128];\n")) == ["prog.mk:6:13: error: "
                                                                              + dtype_message("bf16")]


def test_a_const_dtype_select_on_a_run_time_condition_keeps_its_message():
    source = "const T = select(core_id() == 0, bf16, f32);\n" + kernel("    var v: T[8, 128];\n")
    assert error_lines(source) == [
        "prog.mk:1:18: error: a dtype select(...) needs a compile-time bool condition (e.g. P == 1)"]


# -- a VMEM buffer too big is the capacity error, even when its DMA's descriptor would not
#    fit in 32 bits either (the declaration is what to fix)

HUGE = """\
param N = 128;
kernel k(a: hbm f32[8, N], out: hbm f32[8, N]) {
    vmem x: f32[8, N];
    sem s;
    start copy(a, x, s);
    wait copy(a, x, s);
    start copy(x, out, s);
    wait copy(x, out, s);
}
"""


@pytest.mark.parametrize("n", [1 << 20, 1 << 28])   # (at 1 << 28 a DMA's byte count passes 32 bits)
def test_a_vmem_buffer_past_the_capacity_is_the_capacity_error_whatever_its_dma(n):
    total, capacity = 4 * 8 * n, 4 * 1024 * 1024
    [line] = error_lines(HUGE, {"N": n})
    assert line == (f"prog.mk:3:5: error: kernel 'k' needs {total:,} bytes of VMEM, {total - capacity:,} bytes more "
                    f"than the {capacity:,} of profile 'test'; largest buffers: VMEM 0x000000 x f32[8,{n}] x 1 "
                    f"({total:,} bytes)")
