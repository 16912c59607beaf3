"""Two back-end defects (audit 79), docs/language.md "Back end rules":

- a `for` with a run-time bound whose next value would pass 2,147,483,647 wrapped its int32
  variable around below the stop and ran until the instruction guard stopped it. With a
  compile-time stop it now ends after its last value (the exit test compares with stop -
  step before stepping); with a run-time stop the step faults, free of cycles, naming the
  loop. Ordinary loops keep their code (the golden listings and runs pin that).
- semaphore, VMEM and SMEM over-capacity were reported at the kernel; they are reported
  once, at the first declaration (or temporary) that goes over, with the totals.
"""

from __future__ import annotations

import numpy as np
import pytest

import mkemu
from mkemu.dsl.compiler import compile_text
from mkemu.errors import EmulatorFault, SourceError

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1

# q[0] and q[1] come from the input at run time; the loop counts its trips into q[2] and
# leaves its last value in q[3]. LETS / USE hold scalars live across the loop, so that
# its variable and stop can be pushed out of registers into SMEM.
LOOP = """
kernel k(x: hbm i32[8], y: hbm i32[8]) {
    smem q: i32[8];
    sem s;
    start copy(x, q, s);
    wait copy(x, q, s);
LETS
    q[2] = 0;
    q[3] = 0;
    for i in HEADER {
        q[2] = q[2] + 1;
        q[3] = i;
    }
USE
    start copy(q, y, s);
    wait copy(q, y, s);
}
"""
LIVE = 20   # lets live across the loop: more than the registers left for variables (the
            # loop's variable and stop then live in SMEM)


def loop_source(header: str, spilled: bool = False) -> str:
    lets = "".join(f"    let v{n} = q[0] + {n};\n" for n in range(LIVE)) if spilled else ""
    use = "    q[4] = " + " + ".join(f"v{n}" for n in range(LIVE)) + ";" if spilled else ""
    return LOOP.replace("HEADER", header).replace("LETS\n", lets).replace("USE", use)


def for_line(source: str) -> int:
    return next(n for n, line in enumerate(source.splitlines(), 1) if line.startswith("    for i in "))


def run_loop(header: str, start: int, stop: int, spilled: bool = False) -> tuple[int, int]:
    """(trips, last value) of the loop, on a guard that stops a runaway loop quickly."""
    kernel = mkemu.compile_source(loop_source(header, spilled), "t.mk", hw="test", mesh="1",
                                  max_instructions=200_000)
    x = np.array([start, stop, 0, 0, 0, 0, 0, 0], np.int32)
    y = kernel(x=x).output("y")
    return int(y[2]), int(y[3])


def expected(start: int, stop: int, step: int) -> tuple[int, int]:
    values = range(start, stop, step)
    return len(values), (values[-1] if values else 0)


# ---------------------------------------------------------------- a compile-time stop


@pytest.mark.parametrize("spilled", [False, True], ids=["in_register", "spilled"])
@pytest.mark.parametrize("start, stop, step", [
    (2147483600, INT32_MAX, 2),             # 2,147,483,646 + 2 wrapped to -2**31 < stop: ran on
    (2147483600, 2147483645, 7),            # 2,147,483,642 + 7 wrapped
    (-5, INT32_MAX, INT32_MAX),
    (INT32_MIN, INT32_MAX, INT32_MAX),      # -2**31, -1, 2,147,483,646
    # (these never wrapped, and still end where they did)
    (2147483601, INT32_MAX, 2),             # 2,147,483,645 + 2 is the stop
    (2147483600, 2147483640, 7),            # 2,147,483,635 + 7 fits
    (INT32_MAX, INT32_MAX, 5),              # no trip
    (INT32_MIN, INT32_MIN + 1, 5),          # one trip at the other end
])
def test_a_loop_with_a_run_time_start_ends_at_a_stop_near_the_int32_limit(start, stop, step, spilled):
    header = f"q[0]..{stop} step {step}"
    assert run_loop(header, start, 0, spilled) == expected(start, stop, step)


def test_only_a_stop_within_a_step_of_the_limit_changes_the_code():
    # Its exit test is against stop - step before stepping: the same instructions per trip
    # (li, blt, addi for li, addi, blt) and one jmp at entry, past the first test.
    def words(header):
        return len(mkemu.compile_source(loop_source(header), "t.mk", hw="test", mesh="1").program.kernels["k"].code)
    ordinary = words("q[0]..2147483000 step 2")
    assert words("q[0]..2147483646 step 2") == ordinary       # 2,147,483,645 + 2 fits
    assert words("q[0]..2147483647 step 2") == ordinary + 1


# ---------------------------------------------------------------- a run-time stop


@pytest.mark.parametrize("spilled", [False, True], ids=["in_register", "spilled"])
def test_a_loop_whose_run_time_stop_it_would_step_past_int32_faults_at_the_loop(spilled):
    with pytest.raises(EmulatorFault) as info:
        run_loop("q[0]..q[1] step 4", 2147483600, INT32_MAX, spilled)
    fault = info.value
    assert fault.kind == "out-of-range", fault.render()
    assert ("the loop variable 'i' = 2,147,483,644 plus its step 4 passes 2,147,483,647, the largest int32" in
            fault.message), fault.render()
    assert "keep the stop at most 2,147,483,644" in fault.message
    source = loop_source("q[0]..q[1] step 4", spilled)
    assert f"source: t.mk:{for_line(source)}:5: for i in q[0]..q[1] step 4 {{" in fault.render(), fault.render()


def test_a_compile_time_start_with_a_run_time_stop_is_checked_too():
    with pytest.raises(EmulatorFault) as info:
        run_loop("2147483000..q[1] step 1000", 0, INT32_MAX)
    assert info.value.kind == "out-of-range"
    assert "'i' = 2,147,483,000 plus its step 1,000 passes 2,147,483,647" in info.value.message


@pytest.mark.parametrize("start, stop", [(2147483600, 2147483644), (2147483601, INT32_MAX - 4),
                                         (INT32_MIN, INT32_MIN + 9), (5, 3)])
def test_a_run_time_stop_the_step_does_not_pass_runs_as_before(start, stop):
    assert run_loop("q[0]..q[1] step 4", start, stop) == expected(start, stop, 4)


def test_the_run_time_check_costs_no_instruction():
    def kernel(header):
        return mkemu.compile_source(loop_source(header), "t.mk", hw="test", mesh="1").program.kernels["k"]
    plain, stepped = kernel("q[0]..q[1]"), kernel("q[0]..q[1] step 4")
    assert len(stepped.code) == len(plain.code)
    assert not plain.ranges and len(stepped.ranges) == 1      # a step of 1 cannot pass the stop


# ---------------------------------------------------------------- over capacity, at the declaration


def compile_error(text: str, profile: str = "test") -> str:
    with pytest.raises(SourceError) as info:
        compile_text(text, "t.mk", profile, None)
    rendered = info.value.render()
    assert rendered.count("error:") == 1, rendered           # one error per problem
    assert "Traceback" not in rendered
    return rendered


def test_too_many_semaphores_is_an_error_at_the_sem_array_that_goes_over():
    text = compile_error("""
kernel k(x: hbm f32[8, 128]) {
    sem a[60];
    sem b[10];
    sem c;
}
""", "tpu-v7-like")
    assert text == ("t.mk:4:5: error: kernel 'k' uses 71 semaphores; the profile has 64\n"
                    "this sem array of 10 brings the kernel to 70 semaphores; the profile 'tpu-v7-like' has 64\n"
                    "      sem b[10];\n"
                    "      ^^^^^^^^^^")


def test_a_semaphore_of_an_fn_names_the_call_that_goes_over():
    text = compile_error("""
fn f() {
    sem t[4];
    signal(t[0], 1);
    wait(t[0], 1);
}
kernel k(a: hbm f32[8, 128]) {
    sem s[10];
    f();
    f();
    sem u;
}
""")
    assert text.startswith("t.mk:3:5: error: kernel 'k' uses 19 semaphores; the profile has 16\n"
                           "this sem array of 4 brings the kernel to 18 semaphores; the profile 'test' has 16 "
                           "(in fn 'f' inlined at t.mk:10:5)\n"), text


def test_pipeline_and_struct_semaphores_are_reported_where_they_are_declared():
    text = compile_error("""
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    sem s;
    pipeline t in 0..8 depth 16 {
        input a = x[t:t+1, :];
        output b = y[t:t+1, :];
        b = a;
    }
}
""")
    assert text.startswith("t.mk:5:9: error: kernel 'k' uses 33 semaphores; the profile has 16\n"
                           "this sem array of 16 brings the kernel to 17 semaphores; the profile 'test' has 16 "
                           "(the semaphores of pipeline stream 'a')\n"), text
    text = compile_error("""
struct S { w: vmem f32[2][8, 128]; ss: sem[20]; }
kernel k(a: hbm f32[8, 128]) {
    let b = S();
}
""")
    assert text.startswith("t.mk:2:36: error: kernel 'k' uses 20 semaphores; the profile has 16\n"
                           "this sem array of 20 brings the kernel to 20 semaphores; the profile 'test' has 16 "
                           "(member 'ss' of 'b', the instance of struct 'S' made at t.mk:4:13)\n"), text


def test_vmem_over_capacity_is_an_error_at_the_buffer_that_goes_over():
    text = compile_error("""
kernel k(a: hbm f32[8, 128]) {
    vmem a1: f32[8, 128];
    vmem a2: f32[1024, 1024];
    vmem a3: f32[8, 128];
}
""")
    first, second, source, carets = text.splitlines()
    assert first.startswith("t.mk:4:5: error: kernel 'k' needs 4,202,496 bytes of VMEM, 8,192 bytes more than the "
                            "4,194,304 of profile 'test'; largest buffers: "), first
    assert second == "this vmem buffer brings the kernel to 4,198,400 bytes of VMEM; the profile 'test' has 4,194,304"
    assert source == "      vmem a2: f32[1024, 1024];" and carets == "      " + "^" * 25


def test_temporaries_over_vmem_are_an_error_at_the_statement_that_needs_them():
    text = compile_error("""
kernel k(a: hbm f32[8, 1024]) {
    vmem a1: f32[1016, 1024];
    vmem x: f32[8, 1024];
    sem s;
    start copy(a, x, s);
    wait copy(a, x, s);
    let y = x * 2.0;
    x = y + 1.0;
    start copy(x, a, s);
    wait copy(x, a, s);
}
""")
    assert text.startswith("t.mk:8:5: error: kernel 'k' needs 4,227,072 bytes of VMEM, "), text
    assert "\na temporary computed here brings the kernel to 4,227,072 bytes of VMEM; the profile 'test' has " \
           "4,194,304\n      let y = x * 2.0;\n" in text, text


def test_smem_and_vmem_both_over_are_one_error_naming_both_places():
    text = compile_error("""
kernel k(a: hbm f32[8, 128]) {
    vmem a1: f32[1024, 1024];
    smem q: i32[100000000];
    vmem a2: f32[8, 128];
}
""")
    lines = text.splitlines()
    assert lines[0].startswith("t.mk:5:5: error: kernel 'k' needs 4,198,400 bytes of VMEM, ") and \
        ", and 400,000,008 bytes of SMEM, " in lines[0], text
    assert lines[1:4] == [
        "this vmem buffer brings the kernel to 4,198,400 bytes of VMEM; the profile 'test' has 4,194,304",
        "and at t.mk:4:5: this smem buffer brings the kernel to 400,000,008 bytes of SMEM; the profile 'test' "
        "has 65,536",
        "      vmem a2: f32[8, 128];"]
