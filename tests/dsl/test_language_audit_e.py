"""Gaps found by checking docs/language.md against the compiler (helper audit e, and the
error-handling audit that went with it): each test failed before its fix."""

import pytest

from mkemu.dsl.compiler import compile_text
from mkemu.errors import SourceError

STORE = "kernel k(y: hbm i32[4]) {\n    smem m: i32[4];\n    sem s;\n    m[0] = %s;\n" \
        "    start copy(m, y, s);\n    wait copy(m, y, s);\n}\n"


def error_lines(source: str) -> list[str]:
    """The rendered `file:line:col: error: ...` lines of compiling `source`."""
    with pytest.raises(SourceError) as info:
        compile_text(source, "prog.mk", "test")
    return [line for line in info.value.render().splitlines() if ": error: " in line]


def chain(n: int, value, reverse: bool = False) -> str:
    """Consts C0 .. Cn, each defined through the one before (`value(i)`), in order or not."""
    decls = [f"const C0 = {value(0)};"] + [f"const C{i} = {value(i)};" for i in range(1, n + 1)]
    return "\n".join(reversed(decls) if reverse else decls) + "\n" + STORE % f"C{n}"


# -- Errors: "consts and params defined through a chain of more than 100 others" is an
#    error whichever order the text defines them in (in the order of their uses, each was
#    evaluated at once and a chain of any length passed)

@pytest.mark.parametrize("reverse", [False, True])
def test_a_const_chain_of_more_than_100_others_is_an_error_in_either_order(reverse):
    value = lambda i: "1" if i == 0 else f"C{i - 1} + 1"   # noqa: E731
    compile_text(chain(100, value, reverse), "prog.mk", "test")          # 100 others: fine
    (line,) = error_lines(chain(150, value, reverse))
    assert "is defined through a chain of more than 100 consts and params" in line


@pytest.mark.parametrize("value", [
    lambda i: "1" if i == 0 else f"C{i - 1}",                                  # bare names
    lambda i: "1" if i == 0 else f"select(true, C{i - 1}, C{i - 1})",          # each naming the last twice
    lambda i: "bf16" if i == 0 else f"select(true, C{i - 1}, f32)",            # dtypes
])
@pytest.mark.parametrize("reverse", [False, True])
def test_chains_of_a_thousand_consts_are_the_chain_error_not_a_recursion_error(value, reverse):
    # (a chain of bare names recursed once per name; one of selects naming the last const
    # twice took time exponential in its length)
    lines = error_lines(chain(1000, value, reverse))
    assert len(lines) == 1 and "chain of more than 100 consts and params" in lines[0], lines


# -- Errors: "statements nested more than 100 deep, a nested loop, if, ... each a level"
#    (each nested statement counted two of the text's 100 levels: 48 loops were too deep)

def test_sixty_nested_loops_compile():
    loops = "".join(f"for v{k} in 0..1 {{ " for k in range(60)) + "m[0] += 1;" + " }" * 60
    compile_text(STORE.replace("    m[0] = %s;\n", f"    {loops}\n"), "prog.mk", "test")


# -- Lexical structure: the type name `bool` cannot be declared (a struct named bool took
#    over every `x: bool` parameter, with errors far from it)

@pytest.mark.parametrize("declaration, column", [("struct bool { w: hbm f32[8, 128]; }\n", 8),
                                                 ("const bool = 1;\n", 7)])
def test_bool_cannot_be_declared(declaration, column):
    lines = error_lines(declaration + "kernel k(y: hbm i32[4], flag: bool) { }\n")
    assert lines == [f"prog.mk:1:{column}: error: 'bool' is a type; it cannot be declared as a name"]


# -- Types: "SMEM buffer (i32)": another dtype is a known one, not in SMEM

def test_an_smem_buffer_of_another_dtype_says_smem_holds_i32():
    assert error_lines("kernel k(y: hbm i32[4]) {\n    smem t: f32[4];\n}\n") == [
        "prog.mk:2:5: error: an smem buffer's dtype is i32 (SMEM holds i32 only), not f32"]


# -- Errors: "all errors of a program are reported together" (after one stream of a
#    pipeline in error, its other streams and its body were not checked)

PIPELINE = """const TN = 128;
kernel k(x: hbm f32[16, 512], y: hbm f32[16, 512]) {
    vmem v: f32[8, 256];
    pipeline j in 0..4 {
        input xt = x[16 +: 8, j * TN +: TN];
        output yt = y[16 +: 8, j * TN +: TN];
        v = v + v[:, 0:128];
        yt = xt;
    }
}
"""


def test_every_stream_of_a_pipeline_and_its_body_are_checked_after_one_stream_fails():
    assert error_lines(PIPELINE) == [
        "prog.mk:5:22: error: slice 16:24 is out of range for dimension 0 of 'x' (size 16)",
        "prog.mk:6:23: error: slice 16:24 is out of range for dimension 0 of 'y' (size 16)",
        "prog.mk:7:13: error: shape mismatch: f32[8, 256] + f32[8, 128] cannot be broadcast together"]


# -- Host: a host array that is neither input nor output is declared `hbm` (the docs call
#    it scratch, its role: `scratch y: ...` said only "unexpected name 'y'")

def test_a_scratch_declaration_in_the_host_says_to_write_hbm():
    (line,) = error_lines("kernel k(x: hbm f32[8, 128]) { }\nhost {\n    input x: f32[8, 128];\n"
                          "    scratch y: f32[8, 128];\n    launch k(x);\n}\n")
    assert line == ("prog.mk:4:13: error: unexpected name 'y'; 'scratch' is the role of a host array that is "
                    "neither input nor output, not a keyword: declare one `hbm NAME: TYPE;`")


def test_a_kernel_named_like_a_builtin_is_one_error_not_two():
    # Its launch said "unknown kernel 'matmul'" as well.
    assert error_lines("kernel matmul(x: hbm f32[8, 128]) { }\nhost {\n    input x: f32[8, 128];\n"
                       "    launch matmul(x);\n}\n") == [
        "prog.mk:1:8: error: 'matmul' is a builtin function; it cannot be declared as a name"]
