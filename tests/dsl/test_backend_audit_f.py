"""Three back-end gaps (helper audit f); the tests of each fix failed before it, besides
the guards of what it keeps (marked so):

- a back-end error in a statement of an inlined fn did not name the call, as
  docs/language.md (Errors) promises and the front end's errors do (nor one in a generic
  kernel's instance the instance);
- running out of scalar, vector or mask registers blamed the program alone: the error
  names the profile and how many it has, as the capacity errors do (a profile may have as
  few as 2 scalar registers);
- a `for` with both bounds compile-time whose step from its last value would pass
  2,147,483,647 was a compile error ("would pass 2,147,483,647 and wrap"), while the same
  loop with a run-time start ran; both run as "Control flow and regions" says.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import mkemu
from mkemu.cli import main
from mkemu.dsl.compiler import compile_text
from mkemu.errors import SourceError
from mkemu.isa import hardware
from tests.dsl.test_audit79_loops_capacity import expected, loop_source, run_loop

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT32 = "(int32 is -2,147,483,648..2,147,483,647)"
TEST_PROFILE = Path(hardware.__file__).parent / "profiles" / "test.toml"
VECTOR_ADD = Path(__file__).parents[2] / "programs" / "examples" / "vector_add.mk"


def error_line(source: str, profile: str = "test") -> str:
    """The one `file:line:col: error: ...` line of compiling `source` (the back end reports
    its first error alone)."""
    with pytest.raises(SourceError) as info:
        compile_text(source, "prog.mk", profile)
    [line] = [line for line in info.value.render().splitlines() if ": error: " in line]
    return line


# -- Errors: "An error inside an inlined fn that depends on the call (its arguments, or
#    compile-time values from its scalar parameters) names the call"

FN_CONST = """\
fn f(n: i32, y: smem i32[1]) {
    var t: i32 = 1;
    if t < n {
        y[0] = 1;
    }
}

kernel k(out: hbm i32[1]) {
    smem y: i32[1];
    sem s;
    y[0] = 0;
    f(1, y);
    f(3000000000, y);
    KERNEL_CODE
    start copy(y, out, s);
    wait copy(y, out, s);
}
"""


def test_a_back_end_error_in_an_inlined_fn_names_the_call_that_passed_the_value():
    # (the first call compiles: the error is the second one's)
    assert error_line(FN_CONST.replace("KERNEL_CODE", "")) == (
        f"prog.mk:3:12: error: the constant 3,000,000,000 does not fit in 32 bits {INT32} "
        "(in fn 'f' inlined at prog.mk:13:5)")


def test_code_of_the_kernel_after_an_inlined_call_names_no_call():
    # (a guard: the kernel's own statements have no call to name)
    source = FN_CONST.replace("f(3000000000, y);", "f(2, y);").replace(
        "KERNEL_CODE", "var u: i32 = 1;\n    if u < 4000000000 { y[0] = 2; }")
    assert error_line(source) == f"prog.mk:15:12: error: the constant 4,000,000,000 does not fit in 32 bits {INT32}"


def test_a_back_end_error_in_an_fn_called_from_an_fn_names_every_call():
    source = """\
fn f(n: i32, y: smem i32[1]) {
    for i in 0..n {
        y[0] = y[0] + 1;
    }
}

fn g(m: i32, y: smem i32[1]) {
    y[0] = 0;
    f(m * 2, y);
}

kernel k(out: hbm i32[1]) {
    smem y: i32[1];
    sem s;
    g(2500000000, y);
    start copy(y, out, s);
    wait copy(y, out, s);
}
"""
    assert error_line(source) == (
        "prog.mk:2:17: error: the loop bound 5,000,000,000 does not fit in 32 bits (a loop variable is an int32, "
        "-2,147,483,648..2,147,483,647) (in fn 'f' inlined at prog.mk:9:5, in fn 'g' inlined at prog.mk:15:5)")


def test_an_error_a_loop_of_an_fn_finds_after_its_body_names_the_call():
    # (the step is lowered after the body, whose statements have their own context)
    source = """\
fn f(y: smem i32[2]) {
    for i in 0..y[1] step 3000000000 {
        y[0] = y[0] + 1;
    }
}

kernel k(out: hbm i32[2]) {
    smem y: i32[2];
    sem s;
    y[0] = 0;
    y[1] = 5;
    f(y);
    start copy(y, out, s);
    wait copy(y, out, s);
}
"""
    assert error_line(source) == (
        f"prog.mk:2:5: error: the constant 3,000,000,000 does not fit in 32 bits {INT32} "
        "(in fn 'f' inlined at prog.mk:12:5)")


def test_a_dma_of_an_fn_that_cannot_be_lowered_names_the_call():
    source = """\
fn f(x: hbm f32[2, 600000000], v: vmem f32[2, 128], s: sem) {
    start copy(x[:, 0:128], v, s);
    wait copy(x[:, 0:128], v, s);
}

kernel k(x: hbm f32[2, 600000000]) {
    vmem v: f32[2, 128];
    sem s;
    f(x, v, s);
}
"""
    assert error_line(source) == (
        "prog.mk:2:11: error: cannot lower this DMA: its descriptor needs 2,400,000,000 (a byte count or stride), "
        "which does not fit in 32 bits (in fn 'f' inlined at prog.mk:9:5)")


def test_a_temporary_of_an_fn_past_vmem_names_the_call():
    source = """\
fn f(x: vmem f32[512, 1024]) {
    let t = x + 1.0;
    let u = t * 2.0;
    x = u;
}

kernel k(a: hbm f32[512, 1024]) {
    vmem x: f32[512, 1024];
    sem s;
    start copy(a, x, s);
    wait copy(a, x, s);
    f(x);
    start copy(x, a, s);
    wait copy(x, a, s);
}
"""
    with pytest.raises(SourceError) as info:
        compile_text(source, "prog.mk", "test")
    assert ("\na temporary computed here brings the kernel to 6,291,456 bytes of VMEM; the profile 'test' has "
            "4,194,304 (in fn 'f' inlined at prog.mk:12:5)\n") in info.value.render()


def test_a_back_end_error_in_a_generic_kernel_names_the_instance():
    source = """\
kernel g<N>(y: hbm i32[N]) {
    smem m: i32[4];
    sem s;
    var t: i32 = 1;
    if t < N * 1000000000 { m[0] = 1; }
    start copy(m, y[0:4], s);
    wait copy(m, y[0:4], s);
}

host {
    output y: i32[8];
    launch g(y);
}
"""
    assert error_line(source) == (
        f"prog.mk:5:12: error: the constant 8,000,000,000 does not fit in 32 bits {INT32} "
        "(in kernel 'g<8>' launched at prog.mk:12:5)")


# -- registers: the profile decides how many there are; the errors of running out say so


def small_profile(tmp_path: Path, **counts: int) -> str:
    """The test profile as a file 'small', with other register counts (`sregs=2`)."""
    text = TEST_PROFILE.read_text().replace('name = "test"', 'name = "small"')
    for key, value in counts.items():
        text, n = re.subn(rf"(?m)^{key} = \d+", f"{key} = {value}", text)
        assert n == 1, key
    path = tmp_path / "small.toml"
    path.write_text(text)
    return str(path)


def test_running_out_of_scalar_registers_names_the_profile_and_its_count(tmp_path, capsys):
    assert main(["run", str(VECTOR_ADD), "--hw", small_profile(tmp_path, sregs=2), "--mesh", "1"]) == 1
    assert ("error: out of scalar registers: simplify this statement or use fewer live variables (the profile "
            "'small' has 2 scalar registers, s0 being the constant 0)\n") in capsys.readouterr().err


MASKS = """\
kernel k(a: hbm f32[8, 128], out: hbm f32[8, 128]) {
    vmem x: f32[8, 128];
    sem s;
    start copy(a, x, s);
    wait copy(a, x, s);
    x = EXPR;
    start copy(x, out, s);
    wait copy(x, out, s);
}
"""


def test_running_out_of_vector_registers_names_the_profile_and_its_count(tmp_path):
    source = MASKS.replace("EXPR", "x * (x + (x * (x + (x * (x + 1.0)))))")
    compile_text(source, "prog.mk", small_profile(tmp_path, vregs=7))
    assert error_line(source, small_profile(tmp_path, vregs=3)).endswith(
        "error: this expression needs more than 3 vector registers; split it with `let` (the profile 'small' "
        "has 3 vector registers)")


@pytest.mark.parametrize("mregs, message", [
    (3, "needs more than 2 mask registers; split it with `let` (the profile 'small' has 3 mask registers, m0 "
        "being the all-true mask)"),
    (2, "needs more than 1 mask register; split it with `let` (the profile 'small' has 2 mask registers, m0 "
        "being the all-true mask)"),
])
def test_running_out_of_mask_registers_names_the_profile_and_its_count(tmp_path, mregs, message):
    source = MASKS.replace("EXPR", "where((x > 1.0) & ((x > 2.0) & (x > 3.0)), x, 0.0)")
    compile_text(source, "prog.mk", small_profile(tmp_path, mregs=4))
    assert error_line(source, small_profile(tmp_path, mregs=mregs)).endswith("error: this expression " + message)


def test_the_shipped_profiles_mask_error_keeps_its_documented_words():
    nested = "".join(f"(x > {i}.0) & (" for i in range(1, 8)) + "(x > 8.0)" + ")" * 7
    assert error_line(MASKS.replace("EXPR", f"where({nested}, x, 0.0)")).endswith(
        "error: this expression needs more than 7 mask registers; split it with `let` (the profile 'test' has "
        "8 mask registers, m0 being the all-true mask)")


# -- Control flow: "It runs its body for i = start, start + step, ... while i < stop, and
#    then ends, even when the next value would not fit in its int32 variable"


@pytest.mark.parametrize("spilled", [False, True], ids=["in_register", "spilled"])
@pytest.mark.parametrize("start, stop, step", [
    (2147483640, INT32_MAX, 4),             # 2,147,483,644 + 4 passes: was a compile error
    (2147483600, INT32_MAX, 2),
    (2147483600, 2147483645, 7),            # 2,147,483,642 + 7 passes
    (INT32_MAX - 1, INT32_MAX, INT32_MAX),  # one trip
    (INT32_MIN, INT32_MAX, INT32_MAX),      # -2**31, -1, 2,147,483,646
    (2147483601, INT32_MAX, 2),             # 2,147,483,645 + 2 is the stop (a guard)
    (INT32_MAX, INT32_MAX, 5),              # no trip (a guard)
])
def test_a_compile_time_loop_near_the_int32_limit_runs_as_with_a_run_time_start(start, stop, step, spilled):
    trips = run_loop(f"{start}..{stop} step {step}", 0, 0, spilled)
    assert trips == expected(start, stop, step) == run_loop(f"q[0]..{stop} step {step}", start, 0, spilled)


def test_a_compile_time_loop_whose_step_passes_the_limit_compiles():
    # (the example of the removed error: 2,147,483,646 + 2 passes 2,147,483,647)
    compile_text("kernel k() {\n    smem m: i32[8];\n    for i in 0..2147483647 step 2 {\n        m[0] = i;\n"
                 "    }\n}\n", "t.mk", "test")


def test_only_a_compile_time_loop_whose_last_step_passes_the_limit_changes_the_code():
    # Its exit test is against stop - step before stepping, as with a run-time start: the
    # same instructions per trip and one jmp at entry.
    def words(header):
        return len(mkemu.compile_source(loop_source(header), "t.mk", hw="test", mesh="1").program.kernels["k"].code)
    ordinary = words("1..1001 step 2")
    assert words("2147483601..2147483647 step 2") == ordinary       # 2,147,483,645 + 2 fits
    assert words("2147483600..2147483647 step 2") == ordinary + 1
