"""docs/safety.md and issue 12 from a kernel author's side (helper-78): small .mk programs
on one to four chips covering what test_safety*.py and tests/dsl/test_runtime_checks.py
do not: write-backs of sub-128-lane and bf16 column blocks next to compute on the
neighbouring block (clean) and a one-column overlap (race), two chips pushing into one
inbox, a push into a buffer whose own push still reads it, a remote push into SMEM,
run-time indices that leave their buffer through a weight load, a slot array, a remote
push into the sibling's VMEM or the next chip's HBM, global_core's core below 0 in a
remote copy, the CLI's one-line reports, and the limit of `--schedules`."""

from __future__ import annotations

import numpy as np
import pytest

import mkemu
from mkemu.cli import main
from mkemu.errors import EmulatorFault

SCHEDULES = [("normal", 0), ("late", 0), ("shuffle", 1), ("shuffle", 2)]
FILE = "/tmp/audit78.mk"


def run(src: str, mesh: str = "1", schedule=("normal", 0), inputs=None, **params):
    kernel = mkemu.compile_source(src, FILE, hw="test", mesh=mesh, params=params,
                                  schedule=schedule[0], schedule_seed=schedule[1])
    return kernel(**(inputs or {}))


def fault_of(src: str, **kwargs) -> EmulatorFault:
    with pytest.raises(EmulatorFault) as info:
        run(src, **kwargs)
    return info.value


def assert_both_sides(fault: EmulatorFault, access_line: str, dma_line: str) -> None:
    """A race names the access (chip, core, cycle, pc, instruction, source line) and the
    DMA it races with (instruction, chip/core, pc, issue cycle, source line)."""
    assert fault.kind == "race", fault.render()
    assert None not in (fault.chip, fault.core, fault.cycle, fault.pc) and fault.instruction
    assert access_line in fault.source and fault.source.startswith(FILE + ":"), fault.render()
    assert "pc 0x" in fault.message and "issued at cycle" in fault.message
    assert f"[{FILE}:" in fault.message and dma_line in fault.message, fault.render()


# ----------------------------------------------------- write-back beside compute

# Every column block of W lanes is computed, then written back while the next block is
# computed. OFF shifts the computed window OFF columns back into the block in flight.
WRITE_BACK = """
param W = 16;
param OFF = 0;
const C = 256;
const T = C / W;
kernel k(x: hbm DT[R, C], y: hbm DT[R, C]) {
    vmem b: DT[R, C];
    sem s;
    sem out;
    start copy(x, b, s);
    wait copy(x, b, s);
    for t in 0..T - 1 {
        start copy(b[:, t * W +: W], y[:, t * W +: W], out);
        b[:, t * W + W - OFF +: W] = SCALE(b[:, t * W + W - OFF +: W]);
    }
    start copy(b[:, (T - 1) * W +: W], y[:, (T - 1) * W +: W], out);
    for t in 0..T {
        wait copy(b[:, t * W +: W], y[:, t * W +: W], out);
    }
}
host { input x: DT[R, C]; output y: DT[R, C]; launch k(x, y); }
"""


def write_back(dtype: str, rows: int) -> str:
    scale = "bf16(f32(@) * 2.0)" if dtype == "bf16" else "@ * 2.0"
    src = WRITE_BACK.replace("DT", dtype).replace("R,", f"{rows},")
    return src.replace("SCALE(b[:, t * W + W - OFF +: W])", scale.replace("@", "b[:, t * W + W - OFF +: W]"))


@pytest.mark.parametrize("dtype, rows, w", [("bf16", 8, 16), ("bf16", 3, 64), ("f32", 3, 32), ("f32", 16, 128)])
def test_a_write_back_beside_compute_on_the_next_column_block_is_clean_in_every_schedule(dtype, rows, w):
    src = write_back(dtype, rows)
    x = (np.arange(rows * 256) % 251).reshape(rows, 256).astype(np.float32)
    expected = x.copy()
    expected[:, w:] *= 2                          # every block but the first is doubled once
    for schedule in SCHEDULES:
        y = run(src, schedule=schedule, inputs={"x": x}, W=w).output("y")    # (bf16 in and out as f32)
        assert np.array_equal(y, expected), schedule


@pytest.mark.parametrize("dtype, w", [("bf16", 16), ("f32", 32)])
def test_computing_one_column_into_the_block_in_flight_races(dtype, w):
    fault = fault_of(write_back(dtype, 8), W=w, OFF=1)
    assert_both_sides(fault, "b[:, t * W + W - OFF +: W] =", "start copy(b[:, t * W +: W], y[:, t * W +: W], out);")
    assert "overwrites the source of a DMA still in flight" in fault.message


# ------------------------------------------------------ pushes from other chips

# Every chip pushes half of src to each neighbour along axis 0. BUG = 1 lands the
# left-going half on the same columns as the right-going one: two chips write one inbox.
TWO_PUSHES = """
param BUG = 0;
kernel k(x: hbm f32[8, 256], y: hbm f32[8, 256]) {
    vmem src: f32[8, 256];
    vmem inbox: f32[8, 256];
    sem s;
    sem send;
    sem recv;
    start copy(x, src, s);
    wait copy(x, src, s);
    src = src + f32(chip_id());
    let hr = copy(src[:, 0:128], inbox[:, 0:128] @ peer(0, 1), send, recv);
    let hl = copy(src[:, 128:256], inbox[:, 128 - 128 * BUG +: 128] @ peer(0, -1), send, recv);
    if core_id() == 0 {
        start hr;
        start hl;
        wait hr;
        wait hl;
        wait recv hr;
        wait recv hl;
        src = inbox * 2.0;
        start copy(src, y, s);
        wait copy(src, y, s);
    }
}
host { input x: f32[8, 256]; output y: f32[8, 256]; launch k(x, y); }
"""


@pytest.mark.parametrize("mesh", ["4x1x1", "2x2x1"])
def test_two_chips_pushing_into_one_inbox_race_and_disjoint_halves_do_not(mesh):
    x = np.ones((8, 256), np.float32)
    chips = int(mesh[0])
    for schedule in SCHEDULES:
        ran = run(TWO_PUSHES, mesh=mesh, schedule=schedule, inputs={"x": x})
        for chip in range(chips):
            left, right = (chip - 1) % chips, (chip + 1) % chips
            y = ran.output("y", chip)
            assert np.all(y[:, :128] == 2 * (1 + left)) and np.all(y[:, 128:] == 2 * (1 + right)), (chip, schedule)
    for schedule in SCHEDULES:
        fault = fault_of(TWO_PUSHES, mesh=mesh, schedule=schedule, inputs={"x": x}, BUG=1)
        assert_both_sides(fault, "start h", "start h")
        assert "share bytes of VMEM of chip" in fault.message and "both write" in fault.message


# Chip 0 pushes src to chip 1; chip 1 pushes into chip 0's src (BUG = 1) or spare.
PUSH_INTO_SOURCE = """
param BUG = 0;
kernel k(x: hbm f32[64, 256], y: hbm f32[64, 256]) {
    vmem src: f32[64, 256];
    vmem other: f32[64, 256];
    vmem inbox: f32[64, 256];
    vmem spare: f32[64, 256];
    sem s;
    sem send;
    sem recv;
    sem send2;
    sem recv2;
    start copy(x, src, s);
    wait copy(x, src, s);
    start copy(x, other, s);
    wait copy(x, other, s);
    barrier();
    let h = copy(src, inbox @ peer(0, 1), send, recv);
    if core_id() == 0 {
        if chip_id() == 0 {
            start h;
            wait h;
            if BUG == 1 { wait recv copy(other, src @ peer(0, 1), send2, recv2); }
            else { wait recv copy(other, spare @ peer(0, 1), send2, recv2); }
        }
        if chip_id() == 1 {
            if BUG == 1 { let g = copy(other, src @ peer(0, 1), send2, recv2); start g; wait g; }
            else { let g = copy(other, spare @ peer(0, 1), send2, recv2); start g; wait g; }
            wait recv h;
        }
    }
}
host { input x: f32[64, 256]; output y: f32[64, 256]; launch k(x, y); }
"""


def test_a_push_into_a_buffer_whose_own_push_still_reads_it_races():
    for schedule in SCHEDULES:
        run(PUSH_INTO_SOURCE, mesh="2x1x1", schedule=schedule)
    fault = fault_of(PUSH_INTO_SOURCE, mesh="2x1x1", BUG=1)
    assert_both_sides(fault, "start g; wait g;", "start h;")
    assert (fault.chip, fault.core) == (1, 0)
    assert "share bytes of VMEM of chip 0 core 0 and it writes what the earlier one still reads" in fault.message


# The next chip along axis 1 pushes a into this core's SMEM box while it sums box;
# CREDIT = 1 sums first and says so.
SMEM_PUSH = """
param CREDIT = 0;
kernel k(ix: hbm i32[16], y: hbm i32[16]) {
    smem a: i32[16];
    smem box: i32[16];
    sem s;
    sem send;
    sem recv;
    sem credit;
    start copy(ix, a, s);
    wait copy(ix, a, s);
    start copy(ix, box, s);
    wait copy(ix, box, s);
    let h = copy(a, box @ peer(1, 1), send, recv);
    var t: i32 = 0;
    if CREDIT == 1 {
        for i in 0..16 { t = t + box[i]; }
        signal(credit @ peer(1, -1), 1);
        wait(credit, 1);
        start h;
    } else {
        start h;
        for i in 0..16 { t = t + box[i]; }
    }
    wait h;
    wait recv h;
    box[0] = t;
    start copy(box, y, s);
    wait copy(box, y, s);
}
host { input ix: i32[16]; output y: i32[16]; launch k(ix, y); }
"""


def test_a_push_into_smem_the_target_still_reads_races_and_a_credit_fixes_it():
    ix = np.arange(16, dtype=np.int32)
    for schedule in SCHEDULES:
        y = run(SMEM_PUSH, mesh="1x2x1", schedule=schedule, inputs={"ix": ix}, CREDIT=1).output("y", 1)
        assert int(y[0]) == 120 and list(y[1:]) == list(range(1, 16)), schedule
    fault = fault_of(SMEM_PUSH, mesh="1x2x1", inputs={"ix": ix})
    assert_both_sides(fault, "t = t + box[i];", "start h;")
    assert fault.instruction.startswith("lds") and "a DMA into it from another core" in fault.message


# ------------------------------------------------- run-time indices out of a buffer

# i + j has two run-time terms: only the whole-buffer check applies.
INDICES = """
param CASE = 0;
kernel k(ix: hbm i32[4], w: hbm bf16[256, 128], z: hbm f32[16, 128], y: hbm f32[8, 128]) {
    vmem buf: f32[2][8, 128];
    vmem wv: bf16[256, 128];
    vmem after: bf16[256, 128];
    vmem xv: bf16[8, 128];
    vmem inbox: f32[16, 128];
    vmem acc: f32[8, 128];
    smem idx: i32[4];
    sem s;
    sem r;
    start copy(ix, idx, s);
    wait copy(ix, idx, s);
    let i = idx[0];
    let j = idx[1];
    start copy(w, wv, s);
    wait copy(w, wv, s);
    start copy(w, after, s);
    wait copy(w, after, s);
    xv = bf16(0.0);
    buf[0] = 1.0;
    buf[1] = 2.0;
    acc = 0.0;
    if CASE == 1 { acc = matmul(xv, wv[i + j +: 128, :]); }
    if CASE == 2 { acc = buf[i + j]; }
    if CASE == 3 {
        let h = copy(acc, inbox[i + j +: 8, :] @ global_core(chip_id(), 1 - core_id()), s, r);
        start h; wait h; wait recv h;
    }
    if CASE == 4 {
        let h = copy(acc, z[i + j +: 8, :] @ peer(0, 1), s, r);
        start h; wait h; wait recv h;
    }
    start copy(acc, y, s);
    wait copy(acc, y, s);
}
host {
    input ix: i32[4];
    input w: bf16[256, 128];
    input z: f32[16, 128];
    output y: f32[8, 128];
    launch k(ix, w, z, y);
}
"""


@pytest.mark.parametrize("case, ok, bad, message, line", [
    (1, (64, 64), (65, 64), "VMEM access [41216, 73984) is outside buffer 'wv' (bf16[256, 128], "
     "VMEM [8192, 73728)): it starts at index [129, 0]", "acc = matmul(xv, wv[i + j +: 128, :]);"),
    (2, (1, 0), (1, 1), "is outside buffer 'buf' (f32[2, 8, 128], VMEM [0, 8192)): it starts at index [2, 0, 0]",
     "acc = buf[i + j];"),
    (3, (4, 4), (5, 4), "is outside buffer 'inbox' (f32[16, 128], VMEM", "start h; wait h; wait recv h;"),
    (4, (4, 4), (5, 4), "HBM access", "start h; wait h; wait recv h;"),
])
def test_a_run_time_index_leaving_its_buffer_inside_the_memory_faults_naming_it(case, ok, bad, message, line):
    def inputs(ij):
        return {"ix": np.array([*ij, 0, 0], np.int32), "w": np.zeros((256, 128), np.float32),
                "z": np.zeros((16, 128), np.float32)}
    run(INDICES, mesh="2x1x1", inputs=inputs(ok), CASE=case)
    fault = fault_of(INDICES, mesh="2x1x1", inputs=inputs(bad), CASE=case)
    assert fault.kind == "out-of-bounds", fault.render()
    assert message in fault.message and line in fault.source, fault.render()
    if case == 4:
        assert "outside buffer 'z' (f32[16, 128], HBM" in fault.message and "index [9, 0]" in fault.message


GLOBAL_CORE_PUSH = """
kernel k(n: i32, ch: i32, x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem v: f32[8, 128];
    vmem inbox: f32[8, 128];
    sem s;
    sem r;
    start copy(x, v, s);
    wait copy(x, v, s);
    let h = copy(v, inbox @ global_core(ch, n), s, r);
    if chip_id() == 0 && core_id() == 0 {
        start h;
        wait h;
    }
    if chip_id() == 1 && core_id() == 1 {
        wait recv h;
        v = inbox + 1.0;
        start copy(v, y, s);
        wait copy(v, y, s);
    }
}
host { input x: f32[8, 128]; output y: f32[8, 128]; launch k(CORE, CHIP, x, y); }
"""


@pytest.mark.parametrize("core, chip, kind, message", [
    (-1, 1, "out-of-range", "global_core: core -1 does not exist (the chip has 2 cores, 0..1)"),
    (2, 0, "out-of-range", "global_core: core 2 does not exist (the chip has 2 cores, 0..1)"),
    (1, 2, "bad-target", "target core 5 is outside the mesh (4 cores: 2 chips of 2 cores)"),
])
def test_global_core_out_of_range_in_a_remote_copy(core, chip, kind, message):
    good = GLOBAL_CORE_PUSH.replace("CORE, CHIP", "1, 1")
    for schedule in SCHEDULES:
        assert np.all(run(good, mesh="2x1x1", schedule=schedule,
                          inputs={"x": np.ones((8, 128), np.float32)}).output("y", 1) == 2)
    fault = fault_of(GLOBAL_CORE_PUSH.replace("CORE, CHIP", f"{core}, {chip}"), mesh="2x1x1")
    assert fault.kind == kind and message in fault.message, fault.render()
    assert "audit78.mk:" in fault.source


# --------------------------------------------------------------- the command line

RUNAWAY = """
kernel k(n: i32, x: hbm f32[8, 128]) {
    smem m: i32[4];
    for i in 0..n {
    }
    m[0] = 1;
}
host { input x: f32[8, 128]; launch k(2000000000, x); }
"""

READ_BEFORE_WAIT = """
kernel k(x: hbm f32[8, 256], y: hbm f32[8, 256]) {
    vmem v: f32[8, 256];
    vmem u: f32[8, 256];
    sem s;
    start copy(x, v, s);
    u = v * 2.0;
    wait copy(x, v, s);
    start copy(u, y, s);
    wait copy(u, y, s);
}
host { input x: f32[8, 256]; output y: f32[8, 256]; launch k(x, y); }
"""


@pytest.mark.parametrize("src, argv, head, line", [
    (READ_BEFORE_WAIT, ["--schedules", "2"], "fault [race] at chip 0, core 0, cycle", "u = v * 2.0;"),
    (INDICES.replace("param CASE = 0;", "param CASE = 2;"), ["--mesh", "2x1x1", "--inputs", "IX"],
     "fault [out-of-bounds] at chip 0, core 0, cycle", "acc = buf[i + j];"),
    (RUNAWAY, ["--max-instructions", "5000"], "fault [max-instructions] at chip 0, core 0, cycle",
     "for i in 0..n {"),
])
def test_the_cli_reports_a_fault_in_lines_without_a_traceback(tmp_path, capsys, src, argv, head, line):
    path = tmp_path / "user.mk"
    path.write_text(src)
    if "IX" in argv:
        np.savez(tmp_path / "ix.npz", ix=np.array([1, 1, 0, 0], np.int32), w=np.zeros((256, 128), np.uint16),
                 z=np.zeros((16, 128), np.float32))
        argv = [str(tmp_path / "ix.npz") if a == "IX" else a for a in argv]
    code = main(["run", str(path), "--hw", "test", "--mesh", "1", *argv])
    out, err = capsys.readouterr()
    assert code == 1
    assert "Traceback" not in out + err
    report = err.splitlines()
    assert report[0].startswith(head), err
    assert report[-1].startswith("  source: ") and line in report[-1] and "user.mk:" in report[-1], err
    assert "schedules:" not in out          # a normal run that faults runs no other schedule


# ------------------------------------------------------- what --schedules reaches

# Core 1 pushes c into core 0's inbox once its own copy landed; core 0 reads inbox once
# its own copy landed but before `wait recv` (BUG = 1). Nothing orders the two sides.
# With EXTRA = 0 core 0 reads long before core 1's push is issued (more than the
# shuffle's spread of twice the DMA start latency): it reads the old bytes in every
# schedule. Made to read later (EXTRA vector ops), shuffled schedules report it.
UNORDERED = """
param BUG = 1;
param EXTRA = 0;
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem a: f32[8, 128];
    vmem c: f32[8, 128];
    vmem inbox: f32[8, 128];
    vmem acc: f32[8, 128];
    sem s;
    sem send;
    sem recv;
    inbox = 0.0;
    barrier();
    let h = copy(c, inbox @ global_core(chip_id(), 0), send, recv);
    if core_id() == 0 {
        start copy(x, a, s);
        wait copy(x, a, s);
        for i in 0..EXTRA { a = a + 1.0; }
        if BUG == 0 { wait recv h; }
        acc = inbox + a;
        if BUG == 1 { wait recv h; }
        start copy(acc, y, s);
        wait copy(acc, y, s);
    }
    if core_id() == 1 {
        start copy(x, c, s);
        wait copy(x, c, s);
        start h;
        wait h;
    }
}
host { input x: f32[8, 128]; output y: f32[8, 128]; launch k(x, y); }
"""


def test_schedules_expose_an_unordered_read_only_within_the_shuffle_spread():
    schedules = [("late", 0)] + [("shuffle", seed) for seed in range(1, 8)]
    x = np.ones((8, 128), np.float32)
    # the fixed program: the same bits in every schedule
    for schedule in [("normal", 0)] + schedules:
        assert np.all(run(UNORDERED, schedule=schedule, inputs={"x": x}, BUG=0).output("y") == 2)
    # far apart: the old bytes (zeros) in every schedule, nothing reported (docs/safety.md)
    for schedule in [("normal", 0)] + schedules:
        assert np.all(run(UNORDERED, schedule=schedule, inputs={"x": x}).output("y") == 1)
    # close together: some shuffled schedule reports the race
    faults = []
    for schedule in schedules:
        try:
            run(UNORDERED, schedule=schedule, inputs={"x": x}, EXTRA=4)
        except EmulatorFault as fault:
            faults.append(fault)
    assert faults
    assert_both_sides(faults[0], "acc = inbox + a;", "start h;")


# Chip (0, 0) pushes into chip (0, 1)'s inbox along axis 1 and waits for its send; then
# a barrier along AXIS. Along axis 1 the pusher and the reader are members: the reader
# knows the push landed. Along axis 0 they are on different lines: nothing orders them.
BARRIER_LINE = """
param AXIS = 1;
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem v: f32[8, 128];
    vmem inbox: f32[8, 128];
    vmem acc: f32[8, 128];
    sem s;
    sem send;
    sem recv;
    start copy(x, v, s);
    wait copy(x, v, s);
    inbox = 0.0;
    barrier();
    let h = copy(v, inbox @ peer(1, 1), send, recv);
    if core_id() == 0 && chip_coord(1) == 0 {
        start h;
        wait h;
    }
    barrier(AXIS);
    if core_id() == 0 && chip_coord(1) == 1 {
        acc = inbox * 2.0;
        wait recv h;
        start copy(acc, y, s);
        wait copy(acc, y, s);
    }
}
host { input x: f32[8, 128]; output y: f32[8, 128]; launch k(x, y); }
"""


def test_a_barrier_along_one_axis_orders_only_its_line():
    x = np.full((8, 128), 3.0, np.float32)
    for schedule in SCHEDULES:
        ran = run(BARRIER_LINE, mesh="2x2x1", schedule=schedule, inputs={"x": x})
        assert np.all(ran.output("y", 2) == 6) and np.all(ran.output("y", 3) == 6), schedule
    for schedule in SCHEDULES:
        fault = fault_of(BARRIER_LINE, mesh="2x2x1", schedule=schedule, inputs={"x": x}, AXIS=0)
        assert_both_sides(fault, "acc = inbox * 2.0;", "start h;")
        assert fault.chip in (2, 3) and "a DMA into it from another core" in fault.message
        assert "of buffer 'inbox'" in fault.message       # (the access's buffer, not bytes alone)
