"""docs/safety.md from a user's side: small programs written from the page, one correct
version (clean under every schedule, same bits) and one broken version per check
(faulting with the documented kind, naming the documented places), across the two
cores of a chip and across chips."""

from __future__ import annotations

import pytest

import mkemu
from mkemu.errors import EmulatorFault

SCHEDULES = [("normal", 0), ("late", 0), ("shuffle", 1), ("shuffle", 2)]

# A double-buffered stream, a push into the next chip's inbox after an "inbox free"
# credit, a barrier, a signal to the sibling core and a pipeline. BUG picks one mistake.
PROGRAM = """
param BUG = 0;
param N = 1024;
const TN = 256;
const T = N / TN;

kernel k(x: hbm f32[8, N], y: hbm f32[8, N], z: hbm f32[8, 256], ix: hbm i32[16]) {
    vmem buf: f32[2][8, TN];
    vmem acc: f32[8, TN];
    vmem src: f32[8, 256];
    vmem inbox: f32[8, 256];
    smem idx: i32[16];
    sem ws[2];
    sem os;
    sem send;
    sem recv;
    sem credit;
    sem flag;
    sem ss;
    start copy(ix, idx, ss);
    if BUG == 8 {
        let v = idx[3];
        acc = acc + f32(v);
    }
    wait copy(ix, idx, ss);
    start copy(x[:, 0 +: TN], buf[0], ws[0]);
    acc = 0.0;
    for t in 0..T {
        if t + 1 < T {
            if BUG == 2 {
                start copy(x[:, (t + 1) * TN +: TN], buf[t % 2], ws[(t + 1) % 2]);
            } else {
                start copy(x[:, (t + 1) * TN +: TN], buf[(t + 1) % 2], ws[(t + 1) % 2]);
            }
        }
        if BUG == 1 {
            acc = acc + buf[t % 2];
        }
        wait copy(x[:, t * TN +: TN], buf[t % 2], ws[t % 2]);
        acc = acc + buf[t % 2];
    }
    src = acc * 2.0;
    let h = copy(src, inbox @ peer(0, 1), send, recv);
    signal(credit @ peer(0, -1), 1);
    wait(credit, 1);
    start h;
    if BUG == 3 {
        src = acc;
    }
    wait h;
    wait recv h;
    acc = acc + inbox;
    barrier();
    if core_id() == 0 {
        signal(flag @ global_core(chip_id(), 1), 1);
        if BUG == 12 {
            signal(flag @ global_core(chip_id(), 1), 1);
        }
    }
    if core_id() == 1 {
        wait(flag, 1);
        if BUG == 10 {
            wait(flag, 1);
        }
    }
    if BUG == 5 {
        start copy(x[:, 0 +: TN], acc, os);
        start copy(y[:, 0 +: TN], acc, os);
        wait copy(x[:, 0 +: TN], acc, os);
        wait copy(x[:, 0 +: TN], acc, os);
    }
    if BUG == 6 {
        start copy(x[:, 0 +: TN], acc, os);
        start copy(acc, src, ws[0]);
        wait copy(x[:, 0 +: TN], acc, os);
        wait copy(acc, src, ws[0]);
    }
    if BUG == 7 {
        if chip_id() == 0 && core_id() == 0 {
            start copy(y[:, 0 +: TN], acc, os);
            start copy(src, y[:, 0 +: TN], ws[0]);
            wait copy(y[:, 0 +: TN], acc, os);
            wait copy(src, y[:, 0 +: TN], ws[0]);
        }
    }
    if chip_id() == 0 && core_id() == 0 {
        start copy(acc, z, os);
        wait copy(acc, z, os);
        pipeline j in 0..T depth 2 {
            input xt = x[:, j * TN +: TN];
            output yt = y[:, j * TN +: TN];
            yt = xt * 3.0;
        }
    }
}
host {
    input x: f32[8, N];
    input ix: i32[16];
    output y: f32[8, N];
    output z: f32[8, 256];
    launch k(x, y, z, ix);
}
"""


def run(text: str, mesh: str = "2x1x1", schedule=("normal", 0), **options):
    kernel = mkemu.compile_source(text, "/tmp/user.mk", hw="tpu-v7-like", mesh=mesh,
                                  schedule=schedule[0], schedule_seed=schedule[1], **options)
    return kernel()


def fault_of(text: str, **kwargs) -> EmulatorFault:
    with pytest.raises(EmulatorFault) as info:
        run(text, **kwargs)
    return info.value


def test_the_correct_program_runs_clean_with_the_same_bits_in_every_schedule():
    bits = set()
    for schedule in SCHEDULES:
        for order in ("round_robin", "fifo"):
            outputs = run(PROGRAM, schedule=schedule, dma_order=order).outputs
            bits.add(tuple(sorted((k, v.tobytes()) for k, v in outputs.items())))
    assert len(bits) == 1


# BUG -> (kind, instruction, source line text)
BROKEN = {
    1: ("race", "vld.w", "acc = acc + buf[t % 2];"),                          # read before the wait
    2: ("race", "dma.start", "buf[t % 2], ws[(t + 1) % 2]);"),                # prefetch into the slot in use
    3: ("race", "vst.w", "src = acc;"),                                       # overwrite a copy's source
    5: ("race", "dma.start", "start copy(y[:, 0 +: TN], acc, os);"),          # two copies into one buffer
    6: ("race", "dma.start", "start copy(acc, src, ws[0]);"),                 # copy out what a copy fills
    7: ("race", "dma.start", "start copy(src, y[:, 0 +: TN], ws[0]);"),       # write HBM a copy still reads
    8: ("race", "lds", "let v = idx[3];"),                                    # SMEM read before the wait
    10: ("deadlock", "sem.wait", "wait(flag, 1);"),
    12: ("semaphore-nonzero", "sem.signal.r", "signal(flag @ global_core(chip_id(), 1), 1);"),
}


@pytest.mark.parametrize("bug", sorted(BROKEN))
@pytest.mark.parametrize("schedule", SCHEDULES[:3], ids=lambda s: f"{s[0]}{s[1]}")
def test_each_broken_version_faults_with_its_kind_naming_the_place(bug, schedule):
    kind, instruction, line = BROKEN[bug]
    fault = fault_of(PROGRAM, schedule=schedule, params={"BUG": bug})
    assert fault.kind == kind, fault.render()
    assert fault.chip is not None and fault.core is not None and fault.cycle is not None and fault.pc is not None
    assert fault.instruction.startswith(instruction), fault.render()
    assert line in fault.source and fault.source.startswith("/tmp/user.mk:"), fault.render()
    if kind == "race":
        # ... and the other side: the DMA's instruction, core, pc, source line and issue cycle.
        assert "issued at cycle" in fault.message and "user.mk:" in fault.message and "pc 0x" in fault.message


def test_the_checks_can_be_turned_off():
    run(PROGRAM, params={"BUG": 1}, checks={"semaphores"})
    run(PROGRAM, params={"BUG": 12}, checks={"races"})
    with pytest.raises(EmulatorFault):
        run(PROGRAM, params={"BUG": 12}, checks={"semaphores"})


BARRIER = """
param SKIP_LAST = 0;
kernel k(x: hbm f32[8, 256], y: hbm f32[8, 256]) {
    vmem v: f32[8, 256];
    sem s;
    let skipper = chip_id() == 0 && core_id() == 1;
    if SKIP_LAST == 1 || !skipper {
        start copy(x, v, s);
        wait copy(x, v, s);
    }
    if !skipper {
        barrier();
    }
}
"""


def test_a_core_that_halts_while_others_wait_at_a_barrier():
    fault = fault_of(BARRIER, params={"SKIP_LAST": 1})
    assert fault.kind == "barrier-not-reached"
    assert fault.instruction == "barrier all" and "barrier();" in fault.source
    assert "chip 0 core 1 halted at cycle" in fault.message


def test_a_barrier_reached_after_a_member_halted_is_a_deadlock_naming_it():
    fault = fault_of(BARRIER, params={"SKIP_LAST": 0})
    assert fault.kind == "deadlock" and fault.instruction == "barrier all"
    assert len(fault.details) == 3
    assert all("waits at the all barrier" in d and "chip 0 core 1 halted at cycle" in d for d in fault.details)


# Core 0 writes y; core 1 reads it after a signal from core 0. WRONG = 1 signals before
# core 0 waited for its write: core 1 does not know the write landed.
HBM_HANDOFF = """
param WRONG = 0;
kernel k(x: hbm f32[8, 256], y: hbm f32[8, 256], z: hbm f32[8, 256]) {
    vmem v: f32[8, 256];
    vmem u: f32[8, 256];
    sem s;
    sem t;
    sem f;
    start copy(x, v, t);
    wait copy(x, v, t);
    v = v * 2.0;
    if core_id() == 0 {
        start copy(v, y, s);
        if WRONG == 1 { signal(f @ global_core(chip_id(), 1), 1); }
        wait copy(v, y, s);
        if WRONG == 0 { signal(f @ global_core(chip_id(), 1), 1); }
    }
    if core_id() == 1 {
        wait(f, 1);
        start copy(y, u, s);
        wait copy(y, u, s);
        start copy(u, z, s);
        wait copy(u, z, s);
    }
}
"""

# Chip 0 pushes into chip 1's HBM y; chip 1 reads y long after the bytes landed but
# (WRONG = 1) before its `wait recv`.
REMOTE_HBM = """
param WRONG = 0;
kernel k(x: hbm f32[8, 256], y: hbm f32[8, 256], z: hbm f32[8, 256]) {
    vmem v: f32[8, 256];
    vmem u: f32[8, 256];
    sem s;
    sem r;
    sem t;
    start copy(x, v, t);
    wait copy(x, v, t);
    let h = copy(v, y @ peer(0, 1), s, r);
    if chip_id() == 0 && core_id() == 0 {
        start h;
        wait h;
    }
    if chip_id() == 1 && core_id() == 0 {
        if WRONG == 0 { wait recv h; }
        for i in 0..2000 { u = u + 1.0; }
        start copy(y, u, t);
        wait copy(y, u, t);
        if WRONG == 1 { wait recv h; }
        start copy(u, z, t);
        wait copy(u, z, t);
    }
}
"""


@pytest.mark.parametrize("text", [HBM_HANDOFF, REMOTE_HBM], ids=["sibling signal", "remote push"])
@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: f"{s[0]}{s[1]}")
def test_reading_hbm_another_core_writes_needs_knowing_it_landed(text, schedule):
    run(text, schedule=schedule, params={"WRONG": 0})
    fault = fault_of(text, schedule=schedule, params={"WRONG": 1})
    assert fault.kind == "race", fault.render()
    assert "start copy(y, u," in fault.source
    assert "share bytes of HBM" in fault.message and "it reads what the earlier one still writes" in fault.message


def test_every_core_storing_then_reading_back_the_same_hbm_races_in_every_schedule():
    # Both cores of a chip store y and read it back: the sibling's store (or read) is in
    # flight for the reader (or writer); two stores alone are not reported. A race in
    # every schedule, not only in those where the sibling happens to lag.
    text = """
kernel k(x: hbm f32[8, 256], y: hbm f32[8, 256], z: hbm f32[8, 256]) {
    vmem v: f32[8, 256];
    sem s;
    start copy(x, v, s);
    wait copy(x, v, s);
    start copy(v, y, s);
    wait copy(v, y, s);
    start copy(y, v, s);
    wait copy(y, v, s);
    start copy(v, z, s);
    wait copy(v, z, s);
}
"""
    for schedule in SCHEDULES:
        fault = fault_of(text, mesh="1", schedule=schedule)
        assert fault.kind == "race" and "share bytes of HBM of chip 0" in fault.message
        assert fault.source.endswith(("start copy(y, v, s);", "start copy(v, y, s);"))


def test_an_access_racing_with_a_push_from_another_core_says_so():
    # The receiver overwrites its inbox while the sender's push (no credit) is in flight.
    text = PROGRAM.replace("    signal(credit @ peer(0, -1), 1);\n    wait(credit, 1);\n", "").replace(
        "    start h;\n", "    start h;\n    for i in 0..20 { inbox = acc; }\n")
    fault = fault_of(text)
    assert fault.kind == "race" and "inbox = acc;" in fault.source
    assert "from another core" in fault.message and "start h;" in fault.message


def test_the_late_schedule_lands_only_what_a_wait_needs():
    # Two copies on one semaphore; the wait for the big one comes first, and the small
    # one's buffer is read before its own wait. In the normal schedule the small copy
    # lands first and the big wait takes both (its buffer is known): no fault there; the
    # late schedule lands only the big one for that wait, so the read races.
    text = """
kernel k(x: hbm f32[64, 256], y: hbm f32[8, 256], z: hbm f32[8, 256]) {
    vmem a: f32[64, 256];
    vmem b: f32[8, 256];
    sem s;
    start copy(x, a, s);
    start copy(y, b, s);
    wait copy(x, a, s);
    b = b + 1.0;
    wait copy(y, b, s);
    start copy(b, z, s);
    wait copy(b, z, s);
}
"""
    run(text, mesh="1")
    fault = fault_of(text, mesh="1", schedule=("late", 0))
    assert fault.kind == "race" and "b = b + 1.0;" in fault.source
    # Waited in the right order, it is clean in every schedule.
    fixed = text.replace("    wait copy(x, a, s);\n    b = b + 1.0;\n    wait copy(y, b, s);\n",
                         "    wait copy(x, a, s);\n    wait copy(y, b, s);\n    b = b + 1.0;\n")
    assert fixed != text
    for schedule in SCHEDULES:
        run(fixed, mesh="1", schedule=schedule)


def test_a_race_quotes_the_dma_s_source_line_in_brackets():
    # A statement over several lines is quoted by its first line, which may end in a
    # comma: the line is bracketed, as a deadlock's lines are ("x,, issued at" before).
    src = """\
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem v: f32[8, 128];
    sem s;
    start copy(x,
               v, s);
    v = v + 1.0;
    wait copy(x, v, s);
    start copy(v, y, s);
    wait copy(v, y, s);
}
host { input x: f32[8, 128]; output y: f32[8, 128]; launch k(x, y); }
"""
    kernel = mkemu.compile_source(src, "user.mk", hw="test", mesh="1")
    with pytest.raises(EmulatorFault) as info:
        kernel()
    assert info.value.kind == "race"
    assert "issued at cycle" in info.value.message and ") [user.mk:4:5: start copy(x,]" in info.value.message
