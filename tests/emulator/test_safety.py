"""Schedule safety: every class of race is reported, naming both sides, and each
correctly synchronised counterpart runs clean, in every DMA schedule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mkemu
from mkemu.errors import EmulatorFault

X = (np.arange(8 * 256, dtype=np.float32).reshape(8, 256) % 97) / 8

# One core pushes `src` into another core's `inbox` while that core reads `inbox`.
# With CREDIT = 1 the reader first says "inbox free" (a signal) and the sender waits
# for it: the race is gone.
PUSH = """
param CREDIT = 0 in {{0, 1}};
kernel k(x: hbm f32[8, 256], y: hbm f32[8, 256]) {{
    vmem src: f32[8, 256];
    vmem inbox: f32[8, 256];
    vmem acc: f32[8, 256];
    sem s;
    sem send;
    sem recv;
    sem credit;
    start copy(x, src, s);
    wait copy(x, src, s);
    start copy(x, inbox, s);
    wait copy(x, inbox, s);
    let h = copy(src, inbox @ {to_reader}, send, recv);
    if {is_sender} {{
        if CREDIT == 1 {{
            wait(credit, 1);
        }}
        start h;
        wait h;
    }}
    if {is_reader} {{
        acc = inbox * inbox;
        for i in 0..8 {{
            acc = acc + inbox;
        }}
        if CREDIT == 1 {{
            signal(credit @ {to_sender}, 1);
        }}
        wait recv h;
        acc = acc + inbox;
        start copy(acc, y, s);
        wait copy(acc, y, s);
    }}
}}
host {{
    input x: f32[8, 256];
    output y: f32[8, 256];
    launch k(x, y);
}}
"""
SIBLING = dict(to_reader="global_core(chip_id(), 1)", to_sender="global_core(chip_id(), 0)",
               is_sender="core_id() == 0", is_reader="core_id() == 1", mesh="1")
NEIGHBOUR = dict(to_reader="peer(0, 1)", to_sender="peer(0, -1)", is_sender="chip_id() == 0 && core_id() == 0",
                 is_reader="chip_id() == 1 && core_id() == 0", mesh="2x1x1")


def run(text: str, mesh: str = "1", schedule: str = "normal", **params):
    kernel = mkemu.compile_source(text, "safety.mk", hw="tpu-v7-like", mesh=mesh, params=params,
                                  schedule=schedule)
    return kernel(x=X)


def race_of(text: str, **kwargs) -> str:
    with pytest.raises(EmulatorFault) as info:
        run(text, **kwargs)
    assert info.value.kind == "race", info.value.render()
    return info.value.render()


@pytest.mark.parametrize("where", [SIBLING, NEIGHBOUR], ids=["sibling core", "next chip"])
def test_a_push_into_a_buffer_the_target_still_reads_is_a_race(where):
    text = PUSH.format(**where)
    report = race_of(text, mesh=where["mesh"])
    # Both sides: the access (this core, cycle, pc, source line) and the DMA's start.
    assert "safety.mk:" in report and "instruction:" in report
    assert "dma.start.r" in report and "issued at cycle" in report


@pytest.mark.parametrize("where", [SIBLING, NEIGHBOUR], ids=["sibling core", "next chip"])
@pytest.mark.parametrize("schedule", ["normal", "late", "shuffle"])
def test_the_same_push_after_a_credit_signal_is_clean(where, schedule):
    ran = run(PUSH.format(**where), mesh=where["mesh"], schedule=schedule, CREDIT=1)
    reader_chip = 1 if where is NEIGHBOUR else 0
    expected = X * X
    for _ in range(9):
        expected = expected + X
    assert np.array_equal(ran.output("y", reader_chip), expected)


# A DMA writes column block J of a buffer back to HBM while the vector unit works on
# column block K of the same buffer.
COLUMNS = """
param K = 1 in {0, 1};
kernel k(x: hbm f32[8, 256], y: hbm f32[8, 256]) {
    vmem b: f32[8, 256];
    sem s;
    sem out;
    start copy(x, b, s);
    wait copy(x, b, s);
    start copy(b[:, 0:128], y[:, 0:128], out);
    b[:, K * 128 +: 128] = b[:, K * 128 +: 128] * 2.0;
    wait copy(b[:, 0:128], y[:, 0:128], out);
    start copy(b[:, 128:256], y[:, 128:256], out);
    wait copy(b[:, 128:256], y[:, 128:256], out);
}
host {
    input x: f32[8, 256];
    output y: f32[8, 256];
    launch k(x, y);
}
"""


def test_disjoint_column_blocks_of_one_buffer_do_not_race():
    ran = run(COLUMNS, K=1)
    assert np.array_equal(ran.output("y"), np.concatenate([X[:, :128], X[:, 128:] * 2], axis=1))


def test_the_column_block_the_dma_reads_does_race():
    assert "overwrites the source of a DMA still in flight" in race_of(COLUMNS, K=0)


# Two DMAs into one VMEM buffer, or a copy out of a buffer another copy still fills.
TWO_DMAS = """
param WAIT = 0 in {0, 1};
param READ = 0 in {0, 1};
kernel k(x: hbm f32[8, 256], y: hbm f32[8, 256]) {
    vmem b: f32[8, 256];
    sem s;
    sem t;
    start copy(x, b, s);
    if WAIT == 1 {
        wait copy(x, b, s);
    }
    if READ == 1 {
        start copy(b, y, t);
        wait copy(b, y, t);
    } else {
        start copy(x, b, t);
        wait copy(x, b, t);
        start copy(b, y, t);
        wait copy(b, y, t);
    }
    if WAIT == 0 {
        wait copy(x, b, s);
    }
}
host {
    input x: f32[8, 256];
    output y: f32[8, 256];
    launch k(x, y);
}
"""


@pytest.mark.parametrize("read", [0, 1], ids=["two writes", "a read of what is being written"])
def test_two_dmas_on_one_buffer_race_unless_the_first_is_waited_for(read):
    report = race_of(TWO_DMAS, READ=read)
    assert "this DMA and an earlier one in flight share bytes of VMEM" in report
    # (the bytes the later DMA touches there, and the buffer they are in)
    assert "(this DMA's are VMEM [0, 8192) of buffer 'b'): `dma.start" in report
    assert np.array_equal(run(TWO_DMAS, READ=read, WAIT=1).output("y"), X)


# A copy into HBM while another copy still reads those HBM bytes.
HBM_WAR = """
param WAIT = 0 in {0, 1};
kernel k(x: hbm f32[8, 256], y: hbm f32[8, 256]) {
    vmem a: f32[8, 256];
    vmem b: f32[8, 256];
    sem s;
    sem t;
    start copy(x, a, s);
    wait copy(x, a, s);
    a = a + 1.0;
    start copy(x, b, s);
    if WAIT == 1 {
        wait copy(x, b, s);
    }
    start copy(a, x, t);
    wait copy(a, x, t);
    if WAIT == 0 {
        wait copy(x, b, s);
    }
    start copy(b, y, t);
    wait copy(b, y, t);
}
host {
    input x: f32[8, 256];
    output y: f32[8, 256];
    launch k(x, y);
}
"""


def test_a_copy_into_hbm_another_copy_still_reads_is_a_race():
    report = race_of(HBM_WAR)
    assert "share bytes of HBM of chip 0 and it writes what the earlier one still reads (this DMA's are HBM " \
           "[0, 8192) of buffer 'x'): `dma.start" in report
    assert np.array_equal(run(HBM_WAR, WAIT=1).output("y"), X)


@pytest.mark.parametrize("schedule", ["late", "shuffle"])
def test_a_missing_wait_is_a_race_in_every_schedule(schedule):
    race_of(TWO_DMAS, READ=1, schedule=schedule)


# Random DMA/compute schedules: per buffer, load it, wait, compute on it, store it,
# wait; the buffers' steps interleaved at random.
STEPS = ("start load", "wait load", "compute", "start store", "wait store")


def random_program(n: int, order: list[int], late_wait: int | None) -> str:
    """`order` interleaves the buffers' steps (a buffer's index each time it takes its
    next step). With `late_wait` = i, buffer i's load wait moves to the very end."""
    body, done = [], [0] * n
    for i in order:
        step = STEPS[done[i]]
        done[i] += 1
        if step == "start load":
            body.append(f"start copy(x[{i}], b{i}, ls[{i}]);")
        elif step == "wait load" and late_wait != i:
            body.append(f"wait copy(x[{i}], b{i}, ls[{i}]);")
        elif step == "compute":
            body.append(f"b{i} = b{i} * 2.0 + 1.0;")
        elif step == "start store":
            body.append(f"start copy(b{i}, y[{i}], ss[{i}]);")
        elif step == "wait store":
            body.append(f"wait copy(b{i}, y[{i}], ss[{i}]);")
    if late_wait is not None:
        body.append(f"wait copy(x[{late_wait}], b{late_wait}, ls[{late_wait}]);")
    bufs = "".join(f"    vmem b{i}: f32[8, 128];\n" for i in range(n))
    return (f"kernel k(x: hbm f32[{n}, 8, 128], y: hbm f32[{n}, 8, 128]) {{\n{bufs}"
            f"    sem ls[{n}];\n    sem ss[{n}];\n" + "".join(f"    {line}\n" for line in body) +
            f"}}\nhost {{\n    input x: f32[{n}, 8, 128];\n    output y: f32[{n}, 8, 128];\n"
            f"    launch k(x, y);\n}}\n")


@st.composite
def schedules(draw):
    n = draw(st.integers(1, 4))
    pending = [list(range(len(STEPS))) for _ in range(n)]
    order = []
    while any(pending):
        i = draw(st.sampled_from([b for b in range(n) if pending[b]]))
        pending[i].pop(0)
        order.append(i)
    return n, order, draw(st.integers(0, n - 1))


@settings(max_examples=25, deadline=None)
@given(schedules())
def test_random_correct_schedules_run_clean_and_a_missing_wait_is_caught(case):
    n, order, victim = case
    x = np.arange(n * 8 * 128, dtype=np.float32).reshape(n, 8, 128) % 13
    for schedule in ("normal", "late", "shuffle"):
        ran = mkemu.compile_source(random_program(n, order, None), "random.mk", hw="test", mesh="1",
                                   schedule=schedule)(x=x)
        assert np.array_equal(ran.output("y"), x * 2 + 1), schedule
    caught = []
    for schedule in ("normal", "late", "shuffle"):
        bad = mkemu.compile_source(random_program(n, order, victim), "random.mk", hw="test", mesh="1",
                                   schedule=schedule)
        try:
            bad(x=x)
        except EmulatorFault as fault:
            caught.append(fault.kind)
    assert "race" in caught


# Knowledge travels along a chain of pushes: A pushes its `buf` to B, B (after waiting
# for it) pushes on to C, C (after waiting for that) pushes into A's `buf`. C never
# heard from A directly, but B's push carries B's knowledge that A's push had landed,
# so C's write cannot meet A's read. With CHAIN = 0, C pushes without waiting: a race.
CHAIN = """
param CHAIN = 1 in {0, 1};
kernel k(x: hbm f32[8, 256], y: hbm f32[8, 256]) {
    vmem buf: f32[8, 256];
    vmem inbox: f32[8, 256];
    sem s;
    sem send;
    sem recv;
    let me = global_core(chip_id(), core_id());
    let a = global_core(0, 0);
    let b = global_core(0, 1);
    let c = global_core(1, 0);
    start copy(x, buf, s);
    wait copy(x, buf, s);
    let ab = copy(buf, inbox @ b, send, recv);
    let bc = copy(inbox, inbox @ c, send, recv);
    let ca = copy(inbox, buf @ a, send, recv);
    if me == a {
        start ab;
        wait recv ca;
        wait ab;
        start copy(buf, y, s);
        wait copy(buf, y, s);
    }
    if me == b {
        wait recv ab;
        start bc;
        wait bc;
    }
    if me == c {
        if CHAIN == 1 {
            wait recv bc;
        }
        start ca;
        wait ca;
        if CHAIN == 0 {
            wait recv bc;
        }
    }
}
host {
    input x: f32[8, 256];
    output y: f32[8, 256];
    launch k(x, y);
}
"""


@pytest.mark.parametrize("schedule", ["normal", "late", "shuffle"])
def test_knowledge_travels_along_a_chain_of_pushes(schedule):
    ran = run(CHAIN, mesh="2x1x1", schedule=schedule, CHAIN=1)
    assert np.array_equal(ran.output("y", 0), X)


def test_the_chain_cut_short_is_a_race():
    race_of(CHAIN, mesh="2x1x1", CHAIN=0)


def test_renumbering_the_masks_after_every_dma_changes_no_verdict(monkeypatch, capsys):
    # The race check renumbers its bit masks every REBASE_SPAN DMAs of a launch (from
    # the oldest DMA still listed). With a span of 1 it does so every other DMA: every
    # clean program stays clean with the same output, every race is still caught.
    import json

    from mkemu.cli import main
    from mkemu.emulator import safety

    monkeypatch.setattr(safety, "REBASE_SPAN", 1)
    pushed = X * X
    for _ in range(9):
        pushed = pushed + X
    for schedule in ("normal", "late", "shuffle"):
        assert np.array_equal(run(CHAIN, mesh="2x1x1", schedule=schedule, CHAIN=1).output("y", 0), X)
        assert np.array_equal(run(PUSH.format(**SIBLING), schedule=schedule, CREDIT=1).output("y", 0), pushed)
    race_of(CHAIN, mesh="2x1x1", CHAIN=0)
    race_of(PUSH.format(**NEIGHBOUR), mesh="2x1x1", CREDIT=0)
    n, order = 3, [0, 1, 0, 2, 1, 0, 2, 1, 2, 0, 1, 2, 0, 1, 2]
    x = np.arange(n * 8 * 128, dtype=np.float32).reshape(n, 8, 128) % 13
    ran = mkemu.compile_source(random_program(n, order, None), "random.mk", hw="test", mesh="1")(x=x)
    assert np.array_equal(ran.output("y"), x * 2 + 1)
    code = main(["run", "programs/k3_megakernel.mk", "--model", "k3-tiny", "--prompt-len", "2", "--steps", "1",
                 "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["bit_exact"] is True


def many_in_flight(read: int) -> str:
    """40 copies in flight at once from one core; the first 30 waited for (their rows
    in the race table go dead: the first 20 are compacted away, the next 10 stay), the
    first 4 started again; then buffer `read` is read and everything waited for."""
    return f"""
kernel k(x: hbm f32[8, 256], y: hbm f32[8, 256]) {{
    vmem b: f32[40][8, 256];
    vmem acc: f32[8, 256];
    sem s[40];
    for i in 0..40 {{
        start copy(x, b[i], s[i]);
    }}
    for i in 0..30 {{
        wait copy(x, b[i], s[i]);
    }}
    for i in 0..4 {{
        start copy(x, b[i], s[i]);
    }}
    acc = b[{read}] * 2.0;
    for i in 30..40 {{
        wait copy(x, b[i], s[i]);
    }}
    for i in 0..4 {{
        wait copy(x, b[i], s[i]);
    }}
    start copy(acc, y, s[0]);
    wait copy(acc, y, s[0]);
}}
host {{
    input x: f32[8, 256];
    output y: f32[8, 256];
    launch k(x, y);
}}
"""


@pytest.mark.parametrize("schedule", ["normal", "late"])
def test_dropped_dmas_leave_the_race_check_right_for_those_still_in_flight(schedule):
    for waited in (10, 25):                            # compacted away; a dead row
        assert np.array_equal(run(many_in_flight(waited), schedule=schedule).output("y"), X * 2)
    race_of(many_in_flight(38), schedule=schedule)    # never waited for before the read
    race_of(many_in_flight(2), schedule=schedule)     # started again after the drops


# Chip 0 pushes into chip 1's inbox, waits for the bytes to leave and signals chip 1,
# which reads the inbox on the strength of that signal (its `wait recv` comes later).
# While the signal crosses the link, chip 0 waits for an older copy and starts another:
# the race check renumbers its masks then, and the signal's knowledge must arrive in
# the new numbering (it used to arrive shifted: chip 1 learnt of the wrong DMA).
SIGNAL_ACROSS_RENUMBERING = """
kernel k(x: hbm f32[8, 256], z: hbm f32[8, 256]) {
    vmem v: f32[8, 256];
    vmem a: f32[8, 128];
    vmem inbox: f32[8, 256];
    sem s;
    sem t;
    sem send;
    sem recv;
    sem f;
    let h = copy(v, inbox @ peer(0, 1), send, recv);
    if chip_id() == 0 && core_id() == 0 {
        start copy(x, v, t);
        wait copy(x, v, t);
        start copy(x[:, 0:128], a, s);
        start h;
        wait h;
        signal(f @ peer(0, 1), 1);
        wait copy(x[:, 0:128], a, s);
        start copy(x, v, t);
        wait copy(x, v, t);
    }
    if chip_id() == 1 && core_id() == 0 {
        wait(f, 1);
        v = inbox * 2.0;
        wait recv h;
        start copy(v, z, t);
        wait copy(v, z, t);
    }
}
"""


@pytest.mark.parametrize("span", [0, 1, 8192])
@pytest.mark.parametrize("schedule", ["normal", "late", "shuffle"])
def test_a_signal_in_flight_across_a_renumbering_carries_what_its_sender_knew(monkeypatch, span, schedule):
    from mkemu.emulator import safety

    monkeypatch.setattr(safety, "REBASE_SPAN", span)
    ran = run(SIGNAL_ACROSS_RENUMBERING, mesh="2x1x1", schedule=schedule)
    assert np.array_equal(ran.output("z", 1), X * 2)


# docs/safety.md: races are judged in simulated time. The receiver says "inbox free",
# then (BUG = 1) reads its inbox again before the `wait recv` of the next push, which
# the sender can only start once that signal arrived: nothing is in flight at the read,
# which sees the previous push's bytes, in every schedule, and nothing is reported.
READ_BEFORE_ISSUE = """
param BUG = 1;
kernel k(x: hbm f32[8, 256], y: hbm f32[8, 256]) {
    vmem src: f32[8, 256];
    vmem inbox: f32[8, 256];
    vmem acc: f32[8, 256];
    sem s;
    sem send;
    sem recv;
    sem credit;
    let h = copy(src, inbox @ peer(0, 1), send, recv);
    if chip_id() == 0 && core_id() == 0 {
        start copy(x, src, s);
        wait copy(x, src, s);
        start h;
        wait h;
        wait(credit, 1);
        src = src + 1.0;
        start h;
        wait h;
    }
    if chip_id() == 1 && core_id() == 0 {
        wait recv h;
        acc = inbox;
        signal(credit @ peer(0, -1), 1);
        if BUG == 0 { wait recv h; }
        acc = acc + inbox;
        if BUG == 1 { wait recv h; }
        start copy(acc, y, s);
        wait copy(acc, y, s);
    }
}
"""


@pytest.mark.parametrize("schedule", ["normal", "late", "shuffle"])
def test_a_read_before_the_next_push_is_issued_sees_the_old_bytes_in_every_schedule(schedule):
    assert np.array_equal(run(READ_BEFORE_ISSUE, mesh="2x1x1", schedule=schedule, BUG=1).output("y", 1), X * 2)
    assert np.array_equal(run(READ_BEFORE_ISSUE, mesh="2x1x1", schedule=schedule, BUG=0).output("y", 1),
                          X * 2 + 1)


# Two pushes into one inbox from cores that never hear of each other. With D = 0 the
# second is issued while the first is in flight for the receiver: a race. With D = 3000
# the receiver has waited for the first before the second is issued: it is no longer
# in flight for anyone, and the second push is not reported (docs/safety.md: "the
# second issued while the first is still in flight for that core").
TWO_PUSHES = """
param D = 3000;
kernel k(x: hbm f32[8, 256], y: hbm f32[8, 256]) {
    vmem src: f32[8, 256];
    vmem inbox: f32[8, 256];
    vmem acc: f32[8, 256];
    sem s;
    sem send;
    sem recv;
    let to = global_core(0, 1);
    let h = copy(src, inbox @ to, send, recv);
    let me = global_core(chip_id(), core_id());
    start copy(x, src, s);
    wait copy(x, src, s);
    if me == 2 { src = src + 1.0; }
    if me == 0 {
        start h;
        wait h;
    }
    if me == 2 {
        for i in 0..D { acc = acc + src; }
        start h;
        wait h;
    }
    if me == to {
        wait recv h;
        wait recv h;
        start copy(inbox, y, s);
        wait copy(inbox, y, s);
    }
}
"""


def test_a_second_push_races_only_while_the_first_is_in_flight_for_the_receiver():
    report = race_of(TWO_PUSHES, mesh="2x1x1", D=0)
    assert "share bytes of VMEM of chip 0 core 1 and both write" in report
    for schedule in ("normal", "late", "shuffle"):
        ran = run(TWO_PUSHES, mesh="2x1x1", schedule=schedule, D=3000)
        assert np.array_equal(ran.output("y", 0), X + 1)


@given(st.integers(0, 2**200), st.integers(0, 1000),
       st.lists(st.integers(0, 210), max_size=40, unique=True))
def test_listed_in_finds_the_listed_dmas_of_a_mask_either_way(mask, base, offsets):
    """The DMAs a core lists that a mask of landed ones names: the same set whether the
    mask's bits or the listed keys are the shorter to walk."""
    from mkemu.emulator.safety import listed_in

    listed = {base + o: None for o in offsets}
    expected = {seq for seq in listed if mask >> (seq - base) & 1}
    assert set(listed_in(mask, base, listed)) == expected
    assert len(listed_in(mask, base, listed)) == len(expected)


# docs/safety.md: a semaphore keeps what each arrival carried; a wait takes its amount
# from the oldest arrivals left and learns only what those carried. The writer signals
# the reader twice: before its copy into `tmp` lands (knowing nothing) and after. A
# reader that takes one signal learns nothing of the copy, however long it dawdles
# first (D: both signals have arrived by its wait), and reading `tmp` is a race; taking
# both orders it. A signal of 2, taken 1 and 1, orders both reads.
SIGNALS = """
param TAKE = 1;
param D = 0;
param SPLIT = 0;
kernel k(x: hbm f32[8, 256], tmp: hbm f32[8, 256], y: hbm f32[2, 8, 256]) {
    vmem a: f32[8, 256];
    sem s;
    sem f;
    var c: i32 = 0;
    if core_id() == 0 {
        if SPLIT == 0 { signal(f @ global_core(chip_id(), 1), 1); }
        start copy(x, tmp, s);
        wait copy(x, tmp, s);
        signal(f @ global_core(chip_id(), 1), 1 + SPLIT);
        a = 0.0;
    } else {
        for i in 0..D { c += 1; }
        wait(f, TAKE);
        start copy(tmp, a, s);
        wait copy(tmp, a, s);
        wait(f, 2 - TAKE);
        a = a + 1.0;
        start copy(tmp, a, s);
        wait copy(tmp, a, s);
    }
    start copy(a, y[core_id()], s);
    wait copy(a, y[core_id()], s);
}
host {
    input x: f32[8, 256];
    hbm tmp: f32[8, 256];
    output y: f32[2, 8, 256];
    launch k(x, tmp, y);
}
"""


@pytest.mark.parametrize("dawdle", [0, 3000])
def test_a_wait_learns_only_what_the_arrivals_it_takes_carried(dawdle):
    report = race_of(SIGNALS, TAKE=1, D=dawdle)
    assert "it reads what the earlier one still writes" in report and "start copy(x, tmp, s);" in report


@pytest.mark.parametrize("schedule", ["normal", "late", "shuffle"])
@pytest.mark.parametrize("dawdle", [0, 3000])
def test_taking_every_arrival_or_part_of_one_learns_what_it_carried(schedule, dawdle):
    for params in (dict(TAKE=2), dict(TAKE=1, SPLIT=1)):
        ran = run(SIGNALS, schedule=schedule, D=dawdle, **params)
        assert np.array_equal(ran.output("y", 0)[1], X), params


# A wait of 0 takes nothing and learns nothing: its own copy, landed long before,
# is still in flight for the core until a wait takes its bytes.
ZERO_WAIT = """
kernel k(x: hbm f32[8, 256], y: hbm f32[8, 256]) {
    vmem a: f32[8, 256];
    vmem b: f32[8, 256];
    sem s;
    var c: i32 = 0;
    start copy(x, a, s);
    for i in 0..3000 { c += 1; }
    wait(s, 0);
    b = a + 1.0;
    wait copy(x, a, s);
    start copy(b, y, s);
    wait copy(b, y, s);
}
host {
    input x: f32[8, 256];
    output y: f32[8, 256];
    launch k(x, y);
}
"""


def test_a_wait_of_zero_learns_nothing():
    report = race_of(ZERO_WAIT)
    assert "reads the destination of a DMA that has not been waited for" in report
    assert "b = a + 1.0;" in report
