"""docs/safety.md audited against the emulator (what test_safety_doc.py,
test_safety.py and test_safety_user_programs.py do not already hold): each row of the
race table and of "Other run-time checks" with a small program, the exact fault kind
and what its report names, what is not caught, and `mkemu run --schedules N`."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import mkemu
from mkemu.cli import main
from mkemu.errors import EmulatorFault, SourceError


def build(src: str, filename: str = "/tmp/safety_audit.mk", **options):
    options.setdefault("hw", "test")
    options.setdefault("mesh", "1")
    return mkemu.compile_source(src, filename=filename, **options)


def fault_of(src: str, filename: str = "/tmp/safety_audit.mk", **options) -> EmulatorFault:
    kernel = build(src, filename, **options)
    with pytest.raises(EmulatorFault) as info:
        kernel()
    return info.value


# ------------------------------------------------------------------------- races


@pytest.mark.parametrize("body, instruction, what", [
    # a weight-tile load (mxu.ldw) of bytes a DMA in flight writes
    ("start copy(w, wv, s);\n o = matmul(a, wv);\n wait copy(w, wv, s);", "mxu.ldw",
     "this access to VMEM [0, 32768) of buffer 'wv' reads the destination of a DMA that has not been waited for"),
    # a vector store into bytes a DMA in flight writes
    ("start copy(w, wv, s);\n wv[0 +: 8, :] = a;\n wait copy(w, wv, s);", "vst",
     "this access to VMEM [0, 2048) of buffer 'wv' writes the destination of a DMA that has not been waited for"),
    # an SMEM store over the source of a copy still going out
    ("start copy(m, i, s);\n m[3] = 7;\n wait copy(m, i, s);", "sts", "overwrites the source of a DMA still in flight"),
    # two copies into one SMEM buffer
    ("start copy(i, m, s);\n start copy(j, m, s);\n wait copy(i, m, s);\n wait copy(j, m, s);", "dma.start",
     "share bytes of SMEM of chip 0 core 0 and both write"),
])
def test_race_rows_for_weight_loads_and_smem(body, instruction, what):
    src = f"""
kernel k(w: hbm bf16[128, 128], i: hbm i32[16], j: hbm i32[16]) {{
    vmem wv: bf16[128, 128];
    vmem a: bf16[8, 128];
    vmem o: f32[8, 128];
    smem m: i32[16];
    sem s;
    if core_id() == 0 {{
        {body}
    }}
}}
"""
    fault = fault_of(src)
    assert fault.kind == "race" and fault.instruction.startswith(instruction), fault.render()
    assert what in fault.message
    # both sides: the access's place, and the DMA's instruction, core, pc, source line, issue cycle
    assert (fault.chip, fault.core) == (0, 0) and fault.cycle is not None and fault.pc is not None
    assert "safety_audit.mk:" in fault.source
    assert "of chip 0 core 0 (pc 0x" in fault.message and "issued at cycle" in fault.message
    assert "[/tmp/safety_audit.mk:" in fault.message


HBM_READ_THEN_WRITE = """
param LOOP = 2000;
kernel k(y: hbm f32[8, 256], z: hbm f32[8, 256]) {
    vmem v: f32[8, 256];
    vmem u: f32[8, 256];
    sem s;
    if core_id() == 0 {
        start copy(y, v, s);
        wait copy(y, v, s);
        start copy(v, z, s);
        wait copy(v, z, s);
    }
    if core_id() == 1 {
        for i in 0..LOOP { u = u + 1.0; }
        start copy(u, y, s);
        wait copy(u, y, s);
    }
}
"""


@pytest.mark.parametrize("schedule", [("normal", 0), ("late", 0), ("shuffle", 1)])
def test_an_hbm_read_is_in_flight_until_its_own_issuer_knows_it_landed(schedule):
    """A later write by another core that was not told is not reported once the reader
    has waited; issued while the read is in flight, it is a race."""
    build(HBM_READ_THEN_WRITE, schedule=schedule[0], schedule_seed=schedule[1])()
    fault = fault_of(HBM_READ_THEN_WRITE, params={"LOOP": 0}, schedule=schedule[0], schedule_seed=schedule[1])
    assert fault.kind == "race" and fault.core == 1 and "start copy(u, y, s);" in fault.source
    assert "share bytes of HBM of chip 0 and it writes what the earlier one still reads" in fault.message
    assert "start copy(y, v, s);" in fault.message


BARRIER_HANDOFF = """
param BARRIER = 1;
kernel k(x: hbm f32[8, 256], y: hbm f32[8, 256], z: hbm f32[8, 256]) {
    vmem v: f32[8, 256];
    sem s;
    if core_id() == 0 {
        start copy(x, v, s);
        wait copy(x, v, s);
        start copy(v, y, s);
        wait copy(v, y, s);
    }
    if BARRIER == 1 { barrier(); }
    if core_id() == 1 {
        start copy(y, v, s);
        wait copy(y, v, s);
        start copy(v, z, s);
        wait copy(v, z, s);
    }
}
"""


@pytest.mark.parametrize("schedule", [("normal", 0), ("late", 0), ("shuffle", 1)])
def test_a_barrier_shares_what_its_members_knew(schedule):
    """Core 1 reads what core 0 wrote to HBM after a barrier core 0 reached once it knew
    its write landed; without the barrier the read and the write race in every schedule."""
    x = np.arange(8 * 256, dtype=np.float32).reshape(8, 256)
    run = build(BARRIER_HANDOFF, schedule=schedule[0], schedule_seed=schedule[1])(x=x)
    assert np.array_equal(run.output("z"), x)
    fault = fault_of(BARRIER_HANDOFF, params={"BARRIER": 0}, schedule=schedule[0], schedule_seed=schedule[1])
    assert fault.kind == "race" and "share bytes of HBM of chip 0" in fault.message
    assert fault.source.endswith(("start copy(y, v, s);", "start copy(v, y, s);"))     # whichever came second


def test_two_dmas_writing_the_same_hbm_bytes_are_not_reported():
    src = """
kernel k(y: hbm f32[8, 256]) {
    vmem v: f32[8, 256];
    vmem u: f32[8, 256];
    sem s;
    if core_id() == 0 {
        start copy(v, y, s);
        start copy(u, y, s);
        wait copy(v, y, s);
        wait copy(u, y, s);
    }
}
"""
    for schedule in ("normal", "late", "shuffle"):
        build(src, schedule=schedule, schedule_seed=1)()


RACY = """
kernel k(x: hbm f32[8, 256], z: hbm f32[8, 256]) {
    vmem b: f32[8, 256];
    sem s;
    if core_id() == 0 {
        start copy(x, b, s);
        b = b + 1.0;
        wait copy(x, b, s);
        start copy(b, z, s);
        wait copy(b, z, s);
    }
}
"""


def test_races_are_checked_in_data_runs_only_and_can_be_turned_off():
    assert fault_of(RACY).kind == "race"
    build(RACY, checks={"semaphores"})()
    build(RACY, timing_only=True)()


# ----------------------------------------------------------- other run-time checks

SEMAPHORES = """
kernel k(n: i32, x: hbm f32[8, 128]) {
    vmem v: f32[8, 128];
    sem q;
    sem r;
    if core_id() == 0 {
        signal(q, 3);
        signal(r, 2);
        start copy(x, v, q);
        wait(q, n);
        wait(r, n);
    }
}
host { input x: f32[8, 128]; launch k(1, x); }
"""


def test_semaphore_nonzero_names_each_semaphore_its_value_and_its_last_raiser():
    fault = fault_of(SEMAPHORES)
    assert fault.kind == "semaphore-nonzero"
    text = fault.message
    # q: 3 + 4096 (the copy, which raised it last, when it landed) - 1; r: 2 - 1
    assert "kernel k ended with semaphore 0 = 4098 (last raised at cycle" in text
    assert "by `dma.start" in text and "of chip 0 core 0, pc 0x" in text and "start copy(x, v, q);" in text
    assert "semaphore 1 = 1 (last raised at cycle" in text and "`sem.signal" in text and "signal(r, 2);" in text
    assert fault.instruction.startswith("dma.start") and "start copy(x, v, q);" in fault.source
    build(SEMAPHORES, checks={"races"})()                   # --no-check semaphores


def test_deadlock_lists_each_waiting_core_what_it_waits_for_and_since_when():
    src = """
kernel k(n: i32, x: hbm f32[8, 128]) {
    sem q;
    signal(q, 1);
    wait(q, n);
}
host { input x: f32[8, 128]; launch k(3, x); }
"""
    fault = fault_of(src)
    assert fault.kind == "deadlock" and "no core can make progress and nothing is in flight" in fault.message
    assert len(fault.details) == 2
    for core, line in enumerate(fault.details):
        assert line.startswith(f"chip 0 core {core} pc 0x")
        assert "`sem.wait" in line and "waits for semaphore 0 to reach 3 (it is 1) since cycle" in line
        assert line.endswith("wait(q, n);]")


def test_global_core_with_a_run_time_core_outside_the_chip_is_out_of_range():
    src = """
kernel k(n: i32, x: hbm f32[8, 128]) {
    sem s;
    if core_id() == 0 { signal(s @ global_core(0, n), 1); wait(s, 1); }
}
host { input x: f32[8, 128]; launch k(CORE, x); }
"""
    fault = fault_of(src.replace("CORE", "2"))
    assert fault.kind == "out-of-range" and "core 2 does not exist (the chip has 2 cores, 0..1)" in fault.message
    with pytest.raises(SourceError):
        build(src.replace("global_core(0, n)", "global_core(0, 2)").replace("CORE", "0"))



def test_faults_name_semaphores_as_the_source_declares_them():
    """A single semaphore, an element of an array, and one of an inlined fn's (ids count
    in declaration order, arrays contiguous, the fn's after the kernel's own)."""
    src = """
fn handshake(n: i32) {
    sem credit[2];
    signal(credit[1], 1);
    wait(credit[1], n);
}
kernel k(n: i32, x: hbm f32[8, 128]) {
    sem q;
    sem ws[3];
    if core_id() == 0 { handshake(n); } else { signal(q, 1); wait(q, n); }
    signal(ws[2], n + 1);
    wait(ws[2], n);
}
host { input x: f32[8, 128]; launch k(2, x); }
"""
    fault = fault_of(src)
    assert fault.kind == "deadlock"
    assert "waits for semaphore 5 to reach 2 (it is 1) since cycle" in fault.details[0]
    assert "waits for semaphore 0 to reach 2 (it is 1) since cycle" in fault.details[1]
    assert fault.message.endswith("wait forever (semaphore 0 is 'q'; semaphore 5 is 'credit[1]' of fn handshake)")
    fault = fault_of(src.replace("launch k(2, x)", "launch k(1, x)"))
    assert fault.kind == "semaphore-nonzero" and "semaphore 3 = 1 (last raised" in fault.message
    assert "), which is 'ws[2]'" in fault.message


def test_an_assembled_program_s_semaphores_are_named_by_number():
    kernel = mkemu.compile_source(".kernel k\n    li s1, 1\n    sem.signal s1, s1\n    halt\n"
                                  ".launch k\n", filename="/tmp/sems.s", hw="test", mesh="1")
    with pytest.raises(EmulatorFault) as info:
        kernel()
    assert "ended with semaphore 1 = 1 (last raised" in info.value.message and "which is" not in info.value.message

@pytest.mark.parametrize("stmt, what", [
    ("signal(s, n); wait(s, n);", "signal of a negative amount (-1) on semaphore 0"),
    ("signal(s, num_chips() - 2); wait(s, num_chips() - 2);", "signal of a negative amount (-1) on semaphore 0"),
    ("start copy(x, v, s); wait (num_chips() - 2) * copy(x, v, s);", "wait of a negative amount (-4096) on semaphore 0"),
])
def test_a_negative_amount_at_run_time_is_a_bad_operand(stmt, what):
    src = f"""
kernel k(n: i32, x: hbm f32[8, 128]) {{
    vmem v: f32[8, 128];
    sem s;
    if core_id() == 0 {{ {stmt} }}
}}
host {{ input x: f32[8, 128]; launch k(-1, x); }}
"""
    fault = fault_of(src)
    assert fault.kind == "bad-operand" and what in fault.message and stmt in fault.source


def test_a_negative_constant_amount_and_an_int32_overflowing_constant_are_compile_errors():
    for stmt in ("signal(s, -1); wait(s, 1);", "m[0] = 2147483647 + 1;", "m[0] = m[1] + 3000000000;"):
        src = f"kernel k(x: hbm f32[8, 128]) {{\n    smem m: i32[4];\n    sem s;\n    {stmt}\n}}\n"
        with pytest.raises(SourceError) as info:
            build(src)
        assert "safety_audit.mk:4:" in info.value.render()
    with pytest.raises(SourceError, match="does not fit in 32 bits"):
        build("kernel k(x: hbm f32[8, 128]) {\n    smem m: i32[4];\n    m[0] = 4294967296;\n}\n")


def test_a_dma_whose_destination_rows_overlap_is_refused():
    src = """.buffer a f32 8x128 input
.kernel main
    .smem 0 256 2 256 0 1 0 0
    rdsr s31, core
    bne s31, s0, done
    li s1, @a
    dma.start vmem[s0], hbm[s1], s0, s0
    li s5, 512
    sem.wait s0, s5
done:
    halt
"""
    fault = fault_of(src, "/tmp/overlap_audit.s")
    assert fault.kind == "bad-descriptor" and "its rows overlap (dst_stride1 0, dst_stride2 0)" in fault.message
    assert "moves 512 bytes" in fault.message and "destination block of 256 bytes" in fault.message


# ----------------------------------------------------------------------- bounds

BOUNDS = """
kernel k(i: i32, j: i32, x: hbm f32[16, 512]) {{
    vmem v: f32[16, 512];
    vmem b: f32[3][5, 128];
    vmem w: f32[8, 128];
    vmem r1: f32[1, 128];
    smem m: i32[8];
    sem s;
    if core_id() == 0 {{
        {body}
    }}
}}
host {{ input x: f32[16, 512]; launch k({i}, {j}, x); }}
"""


@pytest.mark.parametrize("body, j, timing_too, message", [
    ("v[i + j +: 8, 0:128] = 1.0;", 6, False,
     "VMEM access [24576, 39424) is outside buffer 'v' (f32[16, 512], VMEM [0, 32768)): it starts at index [12, 0]"),
    ("m[i + j] = 1;", 6, True,
     "SMEM access [64, 68) is outside buffer 'm' (i32[8], SMEM [16, 48)): it starts at index [12]"),
    ("let t = m[i + j]; m[0] = t;", 6, True, "is outside buffer 'm' (i32[8], SMEM [16, 48)): it starts at index [12]"),
    ("start copy(x[i + j +: 8, 0:128], w, s); wait copy(x[i + j +: 8, 0:128], w, s);", 6, True,
     "is outside buffer 'x' (f32[16, 512], HBM [0, 32768)): it starts at index [12, 0]"),
    # the last slot owns its rows up to its last row (5), not its padding
    ("r1 = b[2][i + j +: 1, :];", 0, False,
     "VMEM access [44032, 44544) is outside buffer 'b' (f32[3, 5, 128], VMEM [32768, 43520)): it starts at index [2, 6, 0]"),
])
def test_buffer_bounds_name_the_buffer_its_range_and_the_first_index(body, j, timing_too, message):
    text = BOUNDS.format(body=body, i=6, j=j)
    fault = fault_of(text)
    assert fault.kind == "out-of-bounds" and message in fault.message, fault.render()
    assert body.split(";")[0] in fault.source
    if timing_too:       # scalar SMEM accesses and DMAs are checked in a timing-only run too
        assert fault_of(text, timing_only=True).message == fault.message
    else:                # vector-side rows are not
        build(text, timing_only=True)()


def test_a_vmem_buffer_owns_the_padding_of_its_earlier_slots():
    build(BOUNDS.format(body="r1 = b[0][i + j +: 1, :];", i=6, j=0))()


@pytest.mark.parametrize("body, i, message", [
    ("w = v[0:8, i +: 128];", 400,
     "index 400 of dimension 1 of 'v' (f32[16, 512]) is outside 0..384: a window of 128 from it would leave the dimension"),
    ("w = v[0:8, 128 * i + 64 +: 128];", 3,
     "index 128*v + 64 = 448 (v = 3) of dimension 1 of 'v' (f32[16, 512]) is outside 0..384"),
    ("w = v[2 * i + 1 +: 8, 0:128];", 4, "index 2*v + 1 = 9 (v = 4) of dimension 0 of 'v' (f32[16, 512]) is outside 0..8"),
    ("m[i] = 1;", 8, "index 8 of dimension 0 of 'm' (i32[8]) is outside 0..7"),
    ("m[i] = 1;", -1, "index -1 of dimension 0 of 'm' (i32[8]) is outside 0..7"),
    ("r1 = b[i][0:1, :];", 3, "slot 3 of 'b' (f32[3][5, 128]) is outside 0..2"),
    ("start copy(x[i +: 8, 0:128], w, s); wait copy(x[i +: 8, 0:128], w, s);", 9,
     "index 9 of dimension 0 of 'x' (f32[16, 512]) is outside 0..8: a window of 8 from it would leave the dimension"),
    ("let u = v[4:12, :]; w = u[i +: 8, 0:128];", 5, "index v + 4 = 9 (v = 5) of dimension 0 of 'v' (f32[16, 512])"),
])
def test_dimension_bounds_in_data_and_timing_only_runs(body, i, message):
    text = BOUNDS.format(body=body, i=i, j=0)
    for timing_only in (False, True):
        fault = fault_of(text, timing_only=timing_only)
        assert fault.kind == "out-of-bounds" and message in fault.message, fault.render()
        assert fault.instruction.split()[0] in ("shli", "shli.d", "muli", "add") and "safety_audit.mk:10:" in fault.source


def test_what_the_dimension_check_leaves_to_the_buffer_check():
    # a window inside an outer view is checked against the buffer's rows, not the view's
    build(BOUNDS.format(body="let u = v[4:12, :]; w = u[i +: 8, 0:128];", i=4, j=0))()
    # the unpicked side of a run-time select may read past the buffer's end
    src = """
kernel k(x: hbm i32[8], y: hbm i32[16]) {
    smem m: i32[8];
    smem o: i32[16];
    sem s;
    if core_id() == 0 {
        start copy(x, m, s); wait copy(x, m, s);
        for q in 0..16 {
            let t = select(q < 8, m[q], 5);
            o[q] = t;
        }
        start copy(o, y, s); wait copy(o, y, s);
    }
}
host { input x: i32[8]; output y: i32[16]; launch k(x, y); }
"""
    y = build(src)(x=np.arange(8, dtype=np.int32)).output("y")
    assert y.tolist() == list(range(8)) + [5] * 8


# Core 0 reads a computed value (an argmax) back into a scalar and stores it.
READS_BACK = """
kernel k(x: hbm f32[8, 128], y: hbm i32[8]) {
    vmem v: f32[8, 128];
    smem m: i32[8];
    sem s;
    if core_id() == 0 {
        start copy(x, v, s); wait copy(x, v, s);
        m[0] = scalar(argmax(v, axis=1)[0:1, 0:1]);
        start copy(m, y, s); wait copy(m, y, s);
    }
}
host { input x: f32[8, 128]; output y: i32[8]; launch k(x, y); }
"""


def test_a_timing_only_run_without_the_values_control_reads_faults_readback():
    src = READS_BACK
    build(src)()
    fault = fault_of(src, timing_only=True)
    assert fault.kind == "readback"
    # A plain program: nothing supplies the value, so the fault says to run it as a data
    # run (not to replay a router's choices through options only drivers take).
    assert "nothing supplies it" in str(fault) and "run this program as a data run" in str(fault)
    assert "--routing" not in str(fault)
    # Under a driver (here the API's session) that supplied too few, the count is named.
    session = build(src, timing_only=True).session()
    session.feed_readbacks([])
    with pytest.raises(EmulatorFault, match="reads back value 1 into a scalar, but only 0 were supplied"):
        session.run()
    session = build(src, timing_only=True).session()
    session.feed_readbacks([3])
    session.run()
    assert session.read("y")[0] == 3


def test_a_timing_only_copy_of_computed_bytes_into_smem_in_a_plain_program_says_to_run_data():
    src = """
kernel k(x: hbm f32[8, 128], o: hbm i32[8, 1]) {
    vmem xv: f32[8, 128];
    vmem am: i32[8, 1];
    smem ix: i32[8, 1];
    sem s;
    start copy(x, xv, s); wait copy(x, xv, s);
    am = argmax(xv, axis=1);
    start copy(am, ix, s); wait copy(am, ix, s);
    start copy(ix, o, s); wait copy(ix, o, s);
}
host { input x: f32[8, 128]; output o: i32[8, 1]; launch k(x, o); }
"""
    fault = fault_of(src, timing_only=True)
    assert fault.kind == "readback" and fault.source.startswith("/tmp/safety_audit.mk:9:5: start copy(am, ix, s);")
    assert "nothing supplies them" in str(fault) and "run this program as a data run" in str(fault)
    # A driver that supplied payloads but too few: the record is named.
    session = build(src, timing_only=True).session()
    session.feed_payloads([[], []])
    with pytest.raises(EmulatorFault, match="no recorded payload is left for it") as info:
        session.run()
    # (a driver of its own is told how it supplies them, not only the K3 programs' flags)
    assert "a driver supplies them with Session.feed_payloads" in info.value.message


# ------------------------------------------------------------- --schedules N

LATE = """kernel k(x: hbm f32[64, 256], y: hbm f32[8, 256], z: hbm f32[8, 256]) {
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
FIXED = LATE.replace("    b = b + 1.0;\n    wait copy(y, b, s);\n", "    wait copy(y, b, s);\n    b = b + 1.0;\n")


def _run_cli(capsys, path, *argv) -> tuple[int, str, str]:
    code = main(["run", str(path), "--hw", "test", "--mesh", "1", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_schedules_report_every_run_that_faults_or_changes_bits(tmp_path, capsys):
    late, fixed, racy = tmp_path / "late.mk", tmp_path / "fixed.mk", tmp_path / "racy.mk"
    late.write_text(LATE)
    fixed.write_text(FIXED)
    racy.write_text(RACY)
    assert FIXED != LATE
    # the normal schedule is clean; `late` lands only the big copy for its wait: a race
    code, out, _ = _run_cli(capsys, late, "--schedules", "3")
    assert code == 1
    lines = out.splitlines()
    i = lines.index("schedules: 3 adversarial (late, then shuffled with seeds 1..2)")
    assert lines[i + 1].startswith("  late: fault [race] at chip 0")     # (not "fault: fault [race]")
    assert "  shuffle seed 1: same" in lines and "  shuffle seed 2: same" in lines
    assert "source: " in out and "b = b + 1.0;" in out
    code, out, _ = _run_cli(capsys, fixed, "--schedules", "3")
    assert code == 0 and "  late: same" in out.splitlines()
    # with the race check off, the late schedule computes other bits
    code, out, _ = _run_cli(capsys, late, "--schedules", "2", "--no-check", "races", "--json")
    assert code == 1
    schedules = json.loads(out)["schedules"]
    assert [(s["schedule"], s["seed"], s["outcome"]) for s in schedules] == [
        ("late", 0, "changed bits"), ("shuffle", 1, "same")]
    assert "outputs_sha256 differ" in schedules[0]["detail"]
    # a normal run that faults reports it and runs no other schedule
    code, out, err = _run_cli(capsys, racy, "--schedules", "2")
    assert code == 1 and "schedules:" not in out and "fault [race]" in err
    code, out, err = _run_cli(capsys, fixed, "--schedules", "1001")
    assert code == 1 and "--schedules must be 0..1000" in err


@pytest.mark.parametrize("feed, message", [
    (lambda s: s.feed_readbacks(None), "readback values must be a list of integers"),
    (lambda s: s.feed_readbacks(7), "readback values must be a list of integers"),
    (lambda s: s.feed_readbacks([1.5]), "readback values must be a list of integers"),
    (lambda s: s.feed_readbacks(["1"]), "readback values must be a list of integers"),
    (lambda s: s.feed_readbacks([[1, 2], [3, 4]]), "readback values must be a list of integers"),
    (lambda s: s.feed_readbacks([2**63]), "readback values must be integers of at most 64 bits"),
    (lambda s: s.feed_payloads(None), "payloads must be a list of 2 lists"),
    (lambda s: s.feed_payloads([[1]]), "payloads must be a list of 2 lists"),
    (lambda s: s.feed_payloads([[b"x"], [b"y"], [b"z"]]), "payloads must be a list of 2 lists"),
])
def test_what_a_timing_only_session_is_fed_is_checked(feed, message):
    # (each escaped as TypeError, ValueError, OverflowError, or an IndexError mid-run)
    session = build(READS_BACK, timing_only=True).session()
    with pytest.raises(mkemu.ConfigError, match=re.escape(message)):
        feed(session)


@pytest.mark.parametrize("feed", [lambda s: s.feed_readbacks([3]), lambda s: s.feed_payloads([[], []])])
def test_a_session_that_computes_its_data_refuses_what_only_timing_only_runs_take(feed):
    # (It was accepted and never used: a data run computes its reads and payloads.)
    session = build(READS_BACK).session()
    with pytest.raises(mkemu.ConfigError, match="is for a timing-only session: this one computes") as info:
        feed(session)
    assert info.value.key == "timing_only"
    session.run()          # (the session still runs, computing the value: x is zeros, argmax 0)
    assert session.read("y")[0] == 0
