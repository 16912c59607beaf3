"""docs/safety.md tested adversarially: race verdicts that must not depend on the order
the emulator runs cores in, on run-ahead, or on the schedule (regressions of bugs found)."""

from __future__ import annotations

import pytest

import mkemu
from mkemu.errors import EmulatorFault


def build(src: str, filename: str = "/tmp/safety_adversarial.mk", **options):
    options.setdefault("hw", "test")
    options.setdefault("mesh", "1")
    return mkemu.compile_source(src, filename=filename, **options)


def fault_of(src: str, **options) -> EmulatorFault:
    with pytest.raises(EmulatorFault) as info:
        build(src, **options)()
    return info.value


# Core 0 pushes into core 1's inbox, then reads a buffer of its own a copy still fills
# (a race at about cycle 1160). Core 1 ran ahead of both and read its inbox at a later
# cycle (a race with the push, found only when the push is issued). The run's first fault
# in simulated time is core 0's, whichever core the emulator ran first.
RUN_AHEAD_LATER_RACE = """
param LOOP = 20;
param CORE0_RACES = 1;
kernel k(x: hbm f32[8, 128]) {
    vmem xv: f32[8, 128];
    vmem inbox: f32[8, 128];
    vmem b: f32[8, 128];
    vmem o: f32[8, 128];
    sem send;
    sem recv;
    sem s;
    if core_id() == 0 {
        start copy(x, xv, s);
        wait copy(x, xv, s);
        start copy(xv, inbox @ global_core(chip_id(), 1), send, recv);
        start copy(x, b, s);
        if CORE0_RACES == 1 { o = b + 1.0; }
        wait copy(x, b, s);
        wait copy(xv, inbox @ global_core(chip_id(), 1), send, recv);
    }
    if core_id() == 1 {
        for i in 0..LOOP { o = o + 1.0; }
        o = inbox + 1.0;
        wait recv copy(xv, inbox @ global_core(chip_id(), 1), send, recv);
    }
}
"""


@pytest.mark.parametrize("schedule", [("normal", 0), ("late", 0), ("shuffle", 1)])
def test_a_race_found_after_the_fact_waits_for_its_cycle(schedule):
    """A race of a core's run-ahead found when another core issues its DMA is raised at
    the access's cycle: an earlier fault of another core (here core 0's own race, after
    the push's issue but before core 1's read) is the one reported."""
    options = dict(schedule=schedule[0], schedule_seed=schedule[1])
    later = fault_of(RUN_AHEAD_LATER_RACE, params={"CORE0_RACES": 0}, **options)
    assert later.kind == "race" and (later.chip, later.core) == (0, 1), later.render()
    assert "o = inbox + 1.0;" in later.source and "start copy(xv, inbox @" in later.message
    first = fault_of(RUN_AHEAD_LATER_RACE, **options)
    assert first.kind == "race" and (first.chip, first.core) == (0, 0), first.render()
    assert "o = b + 1.0;" in first.source and "start copy(x, b, s);" in first.message
    assert first.cycle < later.cycle


# The doc's `late` example (two copies on semaphore t, the big one started first and
# waited for first, the small one's buffer read before its own wait), after a wait on
# another semaphore s that a copy and a signal from core 1 satisfy together.
LATE_AFTER_A_SIGNAL = """
param LOOP = 200;
kernel k(x: hbm f32[64, 128], y: hbm f32[8, 128], w: hbm f32[8, 128], z: hbm f32[8, 128]) {
    vmem big: f32[64, 128];
    vmem small: f32[8, 128];
    vmem v: f32[8, 128];
    vmem o: f32[8, 128];
    sem s;
    sem t;
    if core_id() == 0 {
        start copy(x, big, t);
        start copy(y, small, t);
        start copy(w, v, s);
        wait(s, bytes(v) + 1);
        wait copy(x, big, t);
        o = small + 1.0;
        wait copy(y, small, t);
        start copy(o, z, s);
        wait copy(o, z, s);
    }
    if core_id() == 1 {
        for i in 0..LOOP { o = o + 1.0; }
        signal(s @ global_core(chip_id(), 0), 1);
    }
}
"""


def test_late_lands_only_what_a_wait_needs_once_a_signal_arrives():
    """The signal arrives while core 0 blocks on s: the held copy on s can now satisfy
    the wait, and `late` lands just that one (not every held DMA, which would land the
    small copy on t too and let the wait for the big one cover it)."""
    build(LATE_AFTER_A_SIGNAL)()
    build(LATE_AFTER_A_SIGNAL, schedule="shuffle", schedule_seed=1)()
    fault = fault_of(LATE_AFTER_A_SIGNAL, schedule="late")
    assert fault.kind == "race" and (fault.chip, fault.core) == (0, 0), fault.render()
    assert "o = small + 1.0;" in fault.source and "start copy(y, small, t);" in fault.message


# The same example after a push to this core itself whose two ends count on one
# semaphore s (it raises s twice: its bytes sent and its bytes received).
LATE_AFTER_A_SELF_PUSH = """
kernel k(x: hbm f32[64, 128], y: hbm f32[8, 128], z: hbm f32[8, 128]) {
    vmem big: f32[64, 128];
    vmem small: f32[8, 128];
    vmem v: f32[8, 128];
    vmem inbox: f32[8, 128];
    vmem o: f32[8, 128];
    sem s;
    sem t;
    if core_id() == 0 {
        start copy(x, big, t);
        start copy(y, small, t);
        start copy(v, inbox @ global_core(chip_id(), 0), s, s);
        wait(s, 2 * bytes(v));
        wait copy(x, big, t);
        o = small + 1.0;
        wait copy(y, small, t);
        start copy(o, z, s);
        wait copy(o, z, s);
    }
}
"""


def test_late_counts_a_self_push_on_one_semaphore_twice():
    """The held push alone satisfies the wait for both its ends: `late` lands it there,
    not every held DMA once nothing else can happen."""
    build(LATE_AFTER_A_SELF_PUSH)()
    fault = fault_of(LATE_AFTER_A_SELF_PUSH, schedule="late")
    assert fault.kind == "race" and "o = small + 1.0;" in fault.source, fault.render()


def test_a_dma_writing_vmem_a_copy_still_sends_out_races():
    """The race table's row "a DMA that writes bytes another DMA in flight still reads
    (any memory)", in VMEM: a copy into a buffer whose copy out was not waited for."""
    src = """
kernel k(x: hbm f32[8, 128], z: hbm f32[8, 128]) {
    vmem v: f32[8, 128];
    sem s;
    sem t;
    if core_id() == 0 {
        start copy(v, z, s);
        start copy(x, v, t);
        wait copy(v, z, s);
        wait copy(x, v, t);
    }
}
"""
    fault = fault_of(src)
    assert fault.kind == "race" and "start copy(x, v, t);" in fault.source, fault.render()
    assert "share bytes of VMEM of chip 0 core 0 and it writes what the earlier one still reads" in fault.message
    assert "start copy(v, z, s);" in fault.message


# Chip 0 waits for one of three pushes into its inbox and reads the one it assumes came
# first (chip 1's, the nearest). On a line the farther chips' pushes come a hop or two
# later, yet a shuffled schedule lands one of them first: the read races with chip 1's
# push, still in flight.
FIRST_PUSH_ASSUMED = """
kernel k(x: hbm f32[8, 128], out: hbm f32[8, 128]) {
    vmem a: f32[8, 128];
    vmem inbox: f32[4][8, 128];
    sem s;
    sem send;
    sem recv;
    start copy(x, a, s);
    wait copy(x, a, s);
    if chip_id() != 0 {
        start copy(a, inbox[chip_id()] @ global_core(0, core_id()), send, recv);
        wait copy(a, inbox[chip_id()] @ global_core(0, core_id()), send, recv);
    } else {
        wait recv copy(a, inbox[0] @ 0, send, recv);
        a = inbox[1] * 2.0;
        wait recv 2 * copy(a, inbox[0] @ 0, send, recv);
    }
    start copy(a, out, s);
    wait copy(a, out, s);
}
"""


def test_shuffle_lands_a_far_chip_s_push_before_a_near_one_s():
    outcomes = []
    for seed in range(1, 8):
        try:
            build(FIRST_PUSH_ASSUMED, mesh="4x1x1", schedule="shuffle", schedule_seed=seed)()
            outcomes.append("clean")
        except EmulatorFault as fault:
            assert fault.kind == "race" and "a = inbox[1] * 2.0;" in fault.source, fault.render()
            outcomes.append("race")
    assert "race" in outcomes
    build(FIRST_PUSH_ASSUMED, mesh="4x1x1")()       # the normal schedule: chip 1's lands first


@pytest.mark.parametrize("schedule", [("normal", 0), ("late", 0), ("shuffle", 1)])
def test_a_long_run_ahead_keeps_its_race_check(schedule):
    """Core 1 makes thousands of accesses before its racy read: its access log fills
    many times over, and the core pauses each time for the machine to catch up (so the
    log stays small); the read still races with the push, named at its own line."""
    options = dict(schedule=schedule[0], schedule_seed=schedule[1])
    fault = fault_of(RUN_AHEAD_LATER_RACE, params={"CORE0_RACES": 0, "LOOP": 5000}, **options)
    assert fault.kind == "race" and (fault.chip, fault.core) == (0, 1), fault.render()
    assert "o = inbox + 1.0;" in fault.source and "start copy(xv, inbox @" in fault.message


def test_a_long_run_ahead_s_access_log_stays_small():
    """A core that runs 100,000 vector loads without a global instruction: its log of
    accesses (for races found after the fact) is cut back each time it fills."""
    from mkemu.emulator.core import LOG_ROWS
    from mkemu.emulator.machine import Machine
    from mkemu.emulator.topology import Mesh
    from mkemu.isa.asm import assemble
    from mkemu.isa.hardware import load_profile

    machine = Machine(load_profile("test"), Mesh((1, 1, 1)))
    machine.load(assemble(".kernel main\n    li s6, 512\n    li s2, 100000\nloop:\n    vld.w v0, 0(s0), s6, m0\n"
                          "    addi s1, s1, 1\n    blt s1, s2, loop\n    halt\n", "spin.s"))
    result = machine.run()
    assert result.instructions >= 2 * 300_000
    assert max(core.access_log.shape[0] for core in machine.cores) <= 2 * LOG_ROWS
