"""Malformed .mk programs a fuzzing campaign (mutated shipped and test programs) found
mishandled, minimised: each must end in a `SourceError` naming the place (or, for a
program that is only too big to run, an `EmulatorFault`), never a Python exception
(MemoryError, OverflowError, ValueError, a lark VisitError) or a hang."""

from __future__ import annotations

import textwrap

import numpy as np

import pytest

import mkemu
from mkemu.dsl.frontend import load_program
from mkemu.errors import EmulatorFault, SourceError

# A kernel and host to hang a malformed declaration or statement on.
TAIL = """\
kernel k(x: hbm f32[8, 128]) {
    vmem v: f32[8, 128];
}
host {
    input x: f32[8, 128];
    launch k(x);
}
"""


def error_of(source: str, hw: str = "test") -> str:
    with pytest.raises(SourceError) as info:
        mkemu.compile_source(textwrap.dedent(source), "prog.mk", hw=hw, mesh="1")
    return info.value.render()


def first_line(source: str, hw: str = "test") -> str:
    return error_of(source, hw).splitlines()[0]


# -- compile-time integers: Python's are unbounded ----------------------------------------


def test_huge_shift_is_an_error_not_a_memory_error():
    # MemoryError in folding.fold_int: 1 << 10**12 is a number of 10**12 bits.
    assert first_line("const C = 1 << 1000000000000;\n" + TAIL) == (
        "prog.mk:1:11: error: the result of '<<' is too large for a compile-time integer (at most 512 bits)")


def test_huge_shift_in_a_dimension():
    # ValueError (integer too long to print) in values.describe, OverflowError in
    # isa/program.storage_bytes and compiler.int32 for results of a few thousand bits.
    src = "kernel k(o: hbm f32[8, (8 << 65535)]) {\n    vmem v: f32[8, 128];\n}\n"
    assert first_line(src) == (
        "prog.mk:1:25: error: the result of '<<' is too large for a compile-time integer (at most 512 bits)")


def test_huge_product_is_an_error():
    src = "const A = 1 << 500;\nconst C = A * A;\n" + TAIL
    assert first_line(src) == (
        "prog.mk:2:11: error: the result of '*' is too large for a compile-time integer (at most 512 bits)")


@pytest.mark.parametrize("digits", [200, 5000])
def test_huge_integer_literal(digits):
    # 5000 digits: int() refused it inside the parse-tree builder (a lark VisitError).
    assert first_line(f"const C = {'9' * digits};\n" + TAIL) == (
        "prog.mk:1:11: error: integer literal is too large (at most 512 bits)")


def test_hex_literal_without_digits():
    # ValueError from int('0x', 16), wrapped in a lark VisitError.
    assert error_of("const C = 0x_;\n" + TAIL) == (
        "prog.mk:1:11: error: integer literal has no digits\n"
        "  const C = 0x_;\n"
        "            ^^^"
    )


def test_big_values_that_fit_still_fold():
    src = "const A = 1 << 500;\nconst C = (A * 4) >> 500;\nkernel k(x: hbm f32[8, C * 32]) {\n" \
          "    vmem v: f32[8, 128];\n}\nhost {\n    input x: f32[8, 128];\n    launch k(x);\n}\n"
    kernel = mkemu.compile_source(src, "prog.mk", hw="test", mesh="1")
    assert kernel.buffers["x"].shape == (8, 128)


# -- loops unrolled at compile time ------------------------------------------------------------


def test_pipeline_depth_beyond_the_semaphore_limit():
    # A depth of 2**63 unrolled its prefetch forever (a runtime tile count).
    src = """\
    kernel kp(x: hbm f32[24, 128], y: hbm f32[24, 128], n: i32) {
        pipeline t in 0..n depth 9223372036854775808 {
            input xt = x[t * 8 +: 8, :];
            output yt = y[t * 8 +: 8, :];
            yt = xt * 3.0;
        }
    }
    """
    assert first_line(src) == ("prog.mk:2:30: error: the pipeline depth must be at most 65,536 (a semaphore per "
                               "slot), got 9,223,372,036,854,775,808")


def test_host_loop_of_absurd_length():
    # Unrolled at compile time: it never ended.
    src = """\
    kernel k(x: hbm f32[8, 128], i: i32) {
        vmem v: f32[8, 128];
    }
    host {
        input x: f32[8, 128];
        for i in 0..10000000000000 {
            launch k(x, i);
        }
    }
    """
    assert error_of(src) == (
        "prog.mk:6:5: error: a host loop is unrolled at compile time; this one runs 10,000,000,000,000 times "
        "(at most 1,000,000)\n"
        "      for i in 0..10000000000000 {\n"
        "      ^^^^^^^^^^^^^^^^^^^^^^^^^^^^"
    )


# -- HBM arrays too big for int64 --------------------------------------------------------------


@pytest.mark.parametrize("rows", [4611686018427387904, 10 ** 24])
def test_hbm_array_beyond_int64_faults_out_of_memory(rows):
    # OverflowError (compile) or a negative size and a numpy error (inputs) from
    # np.prod(shape, dtype=int64) in isa/program.storage_bytes.
    src = TAIL.replace("    input x: f32[8, 128];\n", f"    input x: f32[8, 128];\n    input big: f32[{rows}, 128];\n")
    kernel = mkemu.compile_source(src, "prog.mk", hw="test", mesh="1")
    with pytest.raises(EmulatorFault, match="out-of-memory"):
        kernel()


# -- recursion: Python's stack is the limit ----------------------------------------------------


@pytest.mark.parametrize("expr, column", [("-" * 3000 + "1", 108), (" + ".join(["1"] * 3000), 11)])
def test_expression_nested_too_deeply(expr, column):
    # RecursionError inside Lark's tree builder (wrapped in a VisitError) or the elaborator.
    assert first_line(f"const C = {expr};\n" + TAIL) == (
        f"prog.mk:1:{column}: error: nested too deeply (more than 100 levels of blocks and expressions)")


def test_blocks_nested_too_deeply():
    body = "".join("    if n > 0 {\n" for _ in range(300)) + "    v = v + 1.0;\n" + "    }\n" * 300
    src = "kernel k(x: hbm f32[8, 128], n: i32) {\n    vmem v: f32[8, 128];\n" + body + "}\n"
    # (a nested `if` and its block are one level)
    assert first_line(src) == "prog.mk:99:8: error: nested too deeply (more than 100 levels of blocks and expressions)"


def test_nesting_below_the_limit_compiles():
    expr = " + ".join(["v"] * 30)
    body = "".join(f"    if n > {i} {{\n" for i in range(25)) + f"    v = {expr};\n" + "    }\n" * 25
    src = ("kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128], n: i32) {\n    vmem v: f32[8, 128];\n    sem s;\n"
           "    start copy(x, v, s);\n    wait copy(x, v, s);\n" + body +
           "    start copy(v, y, s);\n    wait copy(v, y, s);\n}\n"
           "host {\n    input x: f32[8, 128];\n    output y: f32[8, 128];\n    launch k(x, y, 1);\n}\n")
    mkemu.compile_source(src, "prog.mk", hw="test", mesh="1")


def test_nested_host_loops_of_absurd_length():
    # Each loop was checked on its own (a million trips at most), so three nested loops of a
    # thousand unrolled a billion launches: the compile never ended.
    src = """\
    kernel k(x: hbm f32[8, 128]) { }
    host {
        input x: f32[8, 128];
        for i in 0..1000 { for j in 0..1000 { for l in 0..1000 { launch k(x); } } }
    }
    """
    assert first_line(src) == (
        "prog.mk:4:43: error: a host loop is unrolled at compile time; this one runs 1,000 times, "
        "1,000,000,000 with the loops around it (at most 1,000,000)")
    program = load_program("prog.mk", text=textwrap.dedent(src).replace("0..1000", "0..3"))
    assert len(program.host.launches) == 27


def test_fn_call_tree_that_doubles_at_each_level():
    # Every call of g(i) inlines g(i+1) twice: 2**30 copies of the leaf, and no end to the
    # compile (the depth of 31 is well within the nesting limit).
    fns = "fn g30(v: vmem f32[8, 128]) { v = v + 1.0; }\n" + "".join(
        f"fn g{i}(v: vmem f32[8, 128]) {{ g{i + 1}(v); g{i + 1}(v); }}\n" for i in range(30))
    src = fns + "kernel k(x: hbm f32[8, 128]) {\n    vmem v: f32[8, 128];\n    g0(v);\n}\n"
    assert first_line(src).split(": ", 1)[1].startswith(
        "error: more than 50,000 fn calls to inline in this program (a fn is inlined at every call, so calls "
        "nested in calls multiply) (in fn 'g")


def test_const_chain_too_long():
    # RecursionError: each const evaluated inside the evaluation of the one naming it.
    src = "".join(f"const C{i} = C{i + 1} + 1;\n" for i in range(400)) + "const C400 = 0;\n" + TAIL
    assert error_of(src).splitlines()[:2] == [
        "prog.mk:102:7: error: 'C101' is defined through a chain of more than 100 consts and params (from 'C0')",
        "  const C101 = C102 + 1;",
    ]


def test_fn_calls_nested_too_deeply():
    # RecursionError: each fn inlined inside the one calling it.
    fns = "".join(f"fn g{i}(v: vmem f32[8, 128]) {{ g{i + 1}(v); }}\n" for i in range(400))
    src = fns + "fn g400(v: vmem f32[8, 128]) { v = v + 1.0; }\n" \
        "kernel k(x: hbm f32[8, 128]) {\n    vmem v: f32[8, 128];\n    g0(v);\n}\n"
    assert first_line(src) == (
        "prog.mk:64:31: error: fn calls nested more than 64 deep (fns are inlined): g0 -> g1 -> g2 -> ... -> g64 "
        "(in fn 'g63' inlined at prog.mk:63:31, in fn 'g62' inlined at prog.mk:62:31, 61 calls more, "
        "in fn 'g0' inlined at prog.mk:404:5)")


# -- buffers too big, and pipeline tiles of no dimension ----------------------------------------


def test_vmem_over_capacity_is_reported_before_lowering():
    # MemoryError (and hangs) lowering a reduction or a matmul over a VMEM buffer of 2**63
    # columns: the capacity check came after the kernel's code was generated.
    src = """\
    kernel k(y: hbm f32[8, 1]) {
        vmem xv: f32[8, 9223372036854775808];
        vmem m: f32[8, 1];
        m = max(xv, axis=1);
    }
    """
    assert first_line(src).startswith(   # (at the buffer that does not fit: docs/language.md)
        "prog.mk:2:5: error: kernel 'k' needs 295,147,905,179,352,829,952 bytes of VMEM, "
        "295,147,905,179,348,635,648 bytes more than the 4,194,304 of profile 'test'; largest buffers: ")


def test_pipeline_tile_of_a_single_element():
    # IndexError in layout.buffer_strides: the stream's slots were buffers of shape ().
    src = """\
    kernel kp(x: hbm f32[6, 128], y: hbm bf16[6, 128]) {
        pipeline t in 0..6 {
            input xt = x[t, t];
            output yt = y[t];
            yt = bf16(xt * 1.5);
        }
    }
    """
    assert error_of(src, hw="tpu-v7-like") == (
        "prog.mk:3:20: error: a pipeline tile has at least 1 dimension, got a single element (keep one as a "
        "slice: x[i, j +: 1])\n"
        "          input xt = x[t, t];\n"
        "                     ^^^^^^^"
    )


# -- file names -------------------------------------------------------------------------------


def test_import_name_with_a_nul_character():
    # ValueError (embedded null byte) from Path.resolve() in imports.load_files.
    assert error_of('import "a\0b.mk";\n' + TAIL).splitlines()[0] == (
        "prog.mk:1:1: error: imported file name contains a NUL character")


def test_reference_file_name_with_a_nul_character():
    # ValueError from Path.resolve() in Elaborator.reference (reached when the reference
    # cannot be loaded and the program is compiled for its own errors).
    assert error_of('reference "a\0b.py:f";\n' + TAIL).splitlines()[0] == (
        "prog.mk:1:1: error: reference file name contains a NUL character")


@pytest.mark.parametrize("line, what", [('import "\ud800.mk";', "imported"), ('import "mkemu:\ud800";', "imported"),
                                        ('reference "\ud800.py:f";', "reference")])
def test_a_file_name_with_a_lone_surrogate(line, what):
    # UnicodeEncodeError (a ValueError) from Path.resolve(): a text given as a str may hold one.
    assert error_of(line + "\n" + TAIL).splitlines()[0] == (
        f"prog.mk:1:1: error: {what} file name contains a character no file name can hold (U+D800)")


def test_loops_one_after_another_launch_at_most_the_host_blocks_budget(monkeypatch):
    # Each loop within its own limit, many of them unrolled without end (1,000,000 launches
    # took 20 s, and every further loop 20 s more). The budget made small, as the test's.
    from mkemu.dsl import elaborate, statements
    monkeypatch.setattr(elaborate, "MAX_HOST_LAUNCHES", 1000)
    monkeypatch.setattr(statements, "MAX_HOST_LAUNCHES", 1000)
    src = """\
    kernel k(x: hbm f32[8, 128]) { }
    host {
        input x: f32[8, 128];
        for i in 0..600 { launch k(x); }
        for i in 0..600 { for j in 0..10 { launch k(x); } }
        for i in 0..600 { launch k(x); }
    }
    """
    out = error_of(src)
    assert out.count("error:") == 1 and out.splitlines()[0] == (
        "prog.mk:5:40: error: the host block launches more than 1,000 kernels, its loops unrolled (loops one "
        "after another counted together): launch fewer"), out


def test_param_range_past_int64():
    # OverflowError from len() of range(0, 10**30) in the param domain check.
    assert first_line("param P = 1 in 0..1000000000000000000000000000000;\n" + TAIL) == (
        "prog.mk:1:13: error: a param takes at most 4096 values; this range holds 1000000000000000000000000000000")


def test_kernel_loop_step_beyond_int32():
    # EncodingError (a ValueError, not an MkemuError) encoding the loop's addi.
    src = """\
    kernel k(x: hbm f32[8, 128], n: i32) {
        vmem v: f32[8, 128];
        for i in 0..n step (1 << 40) {
            v = v + 1.0;
        }
    }
    """
    assert first_line(src) == (
        "prog.mk:3:5: error: the constant 1,099,511,627,776 does not fit in 32 bits (int32 is "
        "-2,147,483,648..2,147,483,647)")


def test_dma_stride_beyond_int32():
    # OverflowError packing the DMA descriptor into int32 words: the row pitch of an HBM
    # array of 2**32 f32 columns is 2**34 bytes.
    src = """\
    kernel k(z: hbm f32[16, 4294967296]) {
        vmem v: f32[8, 128];
        sem s;
        start copy(z[0 +: 8, 0 +: 128], v, s);
        wait copy(z[0 +: 8, 0 +: 128], v, s);
    }
    """
    assert error_of(src) == (
        "prog.mk:4:11: error: cannot lower this DMA: its descriptor needs 17,179,869,184 (a byte count or stride), "
        "which does not fit in 32 bits\n"
        "      start copy(z[0 +: 8, 0 +: 128], v, s);\n"
        "            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^"
    )


def test_constant_offset_past_the_address_space():
    # EncodingError (lui.d's 32-bit immediate) adding the high half of a constant HBM offset.
    src = """\
    kernel k(z: hbm f32[4, 9223372036854775808]) {
        vmem v: f32[1, 128];
        sem s;
        start copy(z[3, 0 +: 128], v[0, :], s);
        wait copy(z[3, 0 +: 128], v[0, :], s);
    }
    """
    assert first_line(src) == (
        "prog.mk:4:5: error: 'z': a constant offset of 110,680,464,442,257,309,696 bytes is past the 64-bit "
        "address space")


# -- generics -----------------------------------------------------------------------------------


def test_generic_kernel_shadowing_a_global_is_launched():
    # AttributeError in generics.generic_key: the generic was never bound (its definition
    # was refused as a redefinition), and the launch named the instance from it.
    src = """\
    const R = 3;
    kernel g<R>(x: hbm f32[R, 128]) { }
    host { input x: f32[8, 128]; launch g(x); }
    """
    assert error_of(src) == (
        "prog.mk:2:10: error: redefinition of 'R' (first defined at prog.mk:1:7)\n"
        "  kernel g<R>(x: hbm f32[R, 128]) { }\n"
        "           ^"
    )


@pytest.mark.parametrize("arg, got", [("v[2, :]", "vmem view f32[128] of 'v'"), ("s", "a semaphore")])
def test_generic_fixed_by_a_parameter_but_not_by_its_argument(arg, got):
    # Reported at the fn's declaration as a generic no parameter type fixes (which is not
    # so), without naming the call.
    src = f"""\
    fn g<R>(o: vmem f32[R, 128]) {{ o = o + 1.0; }}
    kernel k() {{
        vmem v: f32[8, 128];
        sem s;
        g({arg});
    }}
    """
    assert first_line(src) == (
        f"prog.mk:5:7: error: generic 'R' of fn 'g' cannot be inferred from argument 'o': {got} does not have "
        "the form of the parameter's type")


# -- pipelines ----------------------------------------------------------------------------------


def run_y(src: str, x):
    kernel = mkemu.compile_source(textwrap.dedent(src), "prog.mk", hw="test", mesh="1")
    return kernel(x=x).output("y")


@pytest.mark.parametrize("bounds, n", [("4..4", 0), ("4..0", 0), ("4..n", 4)])
def test_pipeline_without_tiles_is_not_checked_at_its_first_tile(bounds, n):
    # The first tile's views were bounds-checked statically though no tile (or, with a run-time
    # count, maybe no tile) exists: t = 4 makes x[2*t +: 2] rows 8:10 of 8, an error.
    src = f"""\
    kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128], n: i32) {{
        vmem v: f32[8, 128];
        sem s;
        start copy(x, v, s);
        wait copy(x, v, s);
        start copy(v, y, s);
        wait copy(v, y, s);
        pipeline t in {bounds} {{
            input xt = x[2 * t +: 2, :];
            output yt = y[2 * t +: 2, :];
            yt = xt * 2.0;
        }}
    }}
    host {{ input x: f32[8, 128]; output y: f32[8, 128]; launch k(x, y, {n}); }}
    """
    x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
    np.testing.assert_array_equal(run_y(src, x), x)
    # A window that fits at no start is still an error.
    assert "a window of 9 is longer than dimension 0 of 'x'" in first_line(src.replace("t +: 2", "t +: 9"))


# -- semaphore amounts --------------------------------------------------------------------------


@pytest.mark.parametrize("stmt, what", [("signal(s, -3);", "signal"), ("wait(s, 2 - 5);", "wait"),
                                        ("signal(s @ peer(0, 1), -1);", "signal")])
def test_negative_constant_semaphore_amount_is_an_error(stmt, what):
    # Semaphores count up: a negative signal took bytes away and a negative wait added them.
    src = f"""\
    kernel k(x: hbm f32[8, 128]) {{
        sem s;
        {stmt}
        signal(s, 1);
        wait(s, 1);
    }}
    host {{ input x: f32[8, 128]; launch k(x); }}
    """
    assert f"error: the amount of a {what} must not be negative" in first_line(src)
    # Zero is fine.
    kernel = mkemu.compile_source(textwrap.dedent(src.replace(stmt, "signal(s, 0); wait(s, 0);")), "prog.mk",
                                  hw="test", mesh="1")
    kernel(x=np.zeros((8, 128), np.float32))


def test_statements_after_a_failed_assert_are_not_checked():
    # An assert states what the rest of its block relies on: the errors the rest would give
    # (here an out-of-range row in an fn defined above, so reported first) only repeat it.
    src = """\
    fn row(level: i32, v: vmem f32[4, 128]) { v[level:level + 1, :] = v[0:1, :]; }
    fn pick(level: i32, v: vmem f32[4, 128]) {
        assert level < 4, "level is 0 .. 3";
        row(level, v);
    }
    kernel k(x: hbm f32[4, 128]) { vmem v: f32[4, 128]; pick(7, v); pick(2, v); }
    host { input x: f32[4, 128]; launch k(x); }
    """
    text = error_of(src)
    assert text.startswith("prog.mk:3:5: error: assertion failed: level is 0 .. 3"), text
    assert text.count("error:") == 1, text


def test_a_failed_top_level_assert_is_the_only_error_besides_the_other_top_level_asserts():
    # A program's precondition on its params: checking kernels and host after it failed
    # printed the index errors it causes (seven of them for k3_per_op with a wrong layout).
    src = """\
    param L = 3;
    assert L % 2 == 0, "L must be even";
    assert L < 2, "L must be below 2";
    assert L > 0, "L must be positive";
    kernel k(x: hbm f32[2, 128]) { vmem v: f32[2, 128]; v[L:L + 1, :] = v[0:1, :]; }
    host { input x: f32[2, 128]; launch k(x); }
    """
    text = error_of(src)
    assert text.startswith("prog.mk:2:1: error: assertion failed: L must be even"), text
    assert "prog.mk:3:1: error: assertion failed: L must be below 2" in text
    assert text.count("error:") == 2, text
    # Asserts that hold leave the rest checked: the index error is reported then.
    assert "out of range" in error_of(src.replace("assert L % 2 == 0, \"L must be even\";\n", "")
                                      .replace("assert L < 2, \"L must be below 2\";\n", ""))
