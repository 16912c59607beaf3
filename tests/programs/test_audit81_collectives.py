"""docs/collectives.md from a kernel author's side (audit 81): what an all-to-all count
outside 0 .. cap does, checked (`all_to_all_checked`) and unchecked, as the doc now says;
buffers an all-to-all may not share; which names a program may not take as globals next
to the library; and collectives on chips of 3 and 4 cores, all-to-all on a single
participant and in a loop, under adversarial DMA schedules.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import mkemu
from tests.programs.test_collectives_cores_and_budgets import _semaphores, profile, run_ring

ROOT = Path(__file__).parents[2]
LIBRARY = ROOT / "programs" / "lib" / "collectives.mk"
EXAMPLES = ROOT / "programs" / "examples"
DOC = (ROOT / "docs" / "collectives.md").read_text()
CHECK_LINE = "wait(counts_ok, 1);     // stuck here? a count cnt[d] is outside 0 .. cap"
READY_LINE = "wait(ready, parts - 1);"

A2A = """
import "{library}";
param CORES = 2;
param MAXP = 4;
param CAP = 4;
param COLS = 128;
param CHECKED = 0;       // 1: all_to_all_checked
param ROUNDS = 1;        // the same exchange ROUNDS times, x + 1 each time

kernel a2a(x: hbm f32[CORES, MAXP * CAP, COLS], counts: hbm i32[CORES, MAXP],
           y: hbm f32[CORES, MAXP * CAP, COLS], rcounts: hbm i32[CORES, MAXP]) {{
    vmem xv: f32[MAXP * CAP, COLS];
    vmem yv: f32[MAXP * CAP, COLS];
    smem cnt: i32[MAXP];
    smem rcnt: i32[MAXP];
    sem s;
    start copy(x[core_id()], xv, s);
    start copy(counts[core_id()], cnt, s);
    wait copy(x[core_id()], xv, s);
    wait copy(counts[core_id()], cnt, s);
    for d in 0..MAXP {{
        rcnt[d] = -1;
    }}
    yv[:, :] = 0.0;
    for round in 0..ROUNDS {{
        if round > 0 {{
            xv[:, :] = xv[:, :] + 1.0;
        }}
        if CHECKED == 1 {{
            all_to_all_checked(xv, yv, cnt, rcnt, MAXP, CAP, COLS);
        }} else {{
            all_to_all(xv, yv, cnt, rcnt, MAXP, CAP, COLS);
        }}
    }}
    start copy(yv, y[core_id()], s);
    start copy(rcnt, rcounts[core_id()], s);
    wait copy(yv, y[core_id()], s);
    wait copy(rcnt, rcounts[core_id()], s);
}}

host {{
    input x: f32[CORES, MAXP * CAP, COLS];
    input counts: i32[CORES, MAXP];
    output y: f32[CORES, MAXP * CAP, COLS];
    output rcounts: i32[CORES, MAXP];
    launch a2a(x, counts, y, rcounts);
}}
"""


def a2a_kernel(tmp_path, mesh="2", hw="test", **params):
    return mkemu.compile_source(A2A.format(library=LIBRARY), str(tmp_path / "a2a.mk"), hw=hw, mesh=mesh,
                                params={k: v for k, v in params.items() if k.isupper()},
                                **{k: v for k, v in params.items() if not k.isupper()})


def a2a_inputs(kernel, counts, cap=4, cols=128):
    """x: distinct values per chip; counts: {chip: [cores, maxp]}."""
    cores, maxp = np.asarray(counts[0]).shape
    inputs = {}
    for chip in range(kernel.chips):
        inputs[f"x@{chip}"] = (np.arange(cores * maxp * cap * cols, dtype=np.float32)
                               .reshape(cores, maxp * cap, cols) + 10000 * chip)
        inputs[f"counts@{chip}"] = np.asarray(counts[chip], np.int32)
    return inputs


def a2a_expected(inputs, chips, cores, cap, rounds=1):
    """y and rcounts per chip, as the doc says: p's rows [d*cap, +cnt) land at d's rows [p*cap, +cnt)."""
    maxp = inputs["counts@0"].shape[1]
    parts = chips * cores
    y = {c: np.zeros_like(inputs[f"x@{c}"]) for c in range(chips)}
    rc = {c: np.full((cores, maxp), -1, np.int32) for c in range(chips)}
    for p in range(parts):
        pc, pk = p % chips, p // chips
        x = inputs[f"x@{pc}"][pk]
        for _ in range(rounds - 1):
            x = x + np.float32(1)
        for d in range(parts):
            dc, dk = d % chips, d // chips
            n = int(inputs[f"counts@{pc}"][pk][d])
            y[dc][dk][p * cap:p * cap + n] = x[d * cap:d * cap + n]
            rc[dc][dk][p] = n
    return y, rc


def waiting_lines(fault) -> dict:
    """(chip, core) -> its line of a deadlock report."""
    return {(int(c), int(k)): line for c, k, line in
            re.findall(r"^  chip (\d+) core (\d+) pc (.*)$", fault.render(), re.M)}


BASE = {0: [[1, 2, 3, 4], [0, 1, 2, 3]], 1: [[4, 3, 2, 1], [2, 2, 0, 4]]}


def with_count(chip, core, d, value):
    counts = {c: [list(row) for row in rows] for c, rows in BASE.items()}
    counts[chip][core][d] = value
    return counts


# ---------------------------------------------------------------- all_to_all_checked


@pytest.mark.parametrize("bad", [5, 8, -1, -2 ** 31, 2 ** 24 + 1])
def test_a_count_out_of_range_stops_at_the_check(tmp_path, bad):
    # chip 0 core 1 (participant 2) sends `bad` rows to participant 0; CAP = 4
    kernel = a2a_kernel(tmp_path, CHECKED=1)
    with pytest.raises(mkemu.errors.EmulatorFault) as info:
        kernel(**a2a_inputs(kernel, with_count(0, 1, 0, bad)))
    assert info.value.kind == "deadlock"
    lines = waiting_lines(info.value)
    assert sorted(lines) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert CHECK_LINE in lines[(0, 1)]
    for where in [(0, 0), (1, 0), (1, 1)]:
        assert READY_LINE in lines[where], where
    # the doc quotes both lines
    assert f"`{CHECK_LINE}`" in DOC.replace("\n", " ")
    assert f"`{READY_LINE}`" in DOC


@pytest.mark.parametrize("schedule", [{}, {"schedule": "late"}, {"schedule": "shuffle", "schedule_seed": 2}])
def test_counts_in_range_pass_the_check_and_move_the_same_rows(tmp_path, schedule):
    counts = with_count(1, 1, 3, 0)
    counts[0][0] = [4, 4, 4, 4]                # full slots and empty ones
    kernel = a2a_kernel(tmp_path, CHECKED=1, **schedule)
    inputs = a2a_inputs(kernel, counts)
    run = kernel(**inputs)
    y, rc = a2a_expected(inputs, 2, 2, 4)
    for chip in range(2):
        assert np.array_equal(run.output("y", chip=chip), y[chip])
        assert np.array_equal(run.output("rcounts", chip=chip), rc[chip])


def test_the_checked_all_to_all_takes_one_more_semaphore(tmp_path):
    call = "all_to_all_checked(buf, yb, c, r, 8, 8, 128);"
    assert _semaphores(tmp_path, call, {}) == 7
    assert "6 for the all-to-all (7 checked)" in DOC


def test_checking_the_example_s_dispatch_costs_what_the_doc_says(tmp_path):
    cycles, us = re.search(r"checking the example's dispatch makes it ([\d,]+) cycles \(([\d.]+) µs\) slower on\s+"
                           r"2x2x2", DOC).groups()
    source = (EXAMPLES / "all_to_all.mk").read_text()
    checked = source.replace("all_to_all(xv, yv,", "all_to_all_checked(xv, yv,")
    assert checked.count("all_to_all_checked(") == 1
    plain = mkemu.compile_source(source, EXAMPLES / "all_to_all.mk", mesh="2x2x2")().report
    run = mkemu.compile_source(checked, EXAMPLES / "all_to_all.mk", mesh="2x2x2")()
    assert run.check() is None
    assert run.report.cycles - plain.cycles == int(cycles.replace(",", ""))
    assert f"{run.report.seconds * 1e6 - plain.seconds * 1e6:.2f}" == us


# ---------------------------------------------------------------- unchecked, as the doc says


def test_a_count_above_cap_into_a_slot_nobody_writes_completes_with_wrong_rows(tmp_path):
    # participant 2 sends 5 rows to participant 0: the fifth lands in the slot of
    # participant 3 (chip 1 core 1), which sends participant 0 nothing
    counts = with_count(0, 1, 0, 5)
    counts[1][1][0] = 0
    kernel = a2a_kernel(tmp_path)
    inputs = a2a_inputs(kernel, counts)
    run = kernel(**inputs)
    y0 = run.output("y", chip=0)[0]
    assert run.output("rcounts", chip=0)[0].tolist() == [1, 4, 5, 0]
    assert np.array_equal(y0[12], inputs["x@0"][1][4])          # row 4 of participant 2's x
    assert "spills rows into a slot of y that nobody else" in " ".join(DOC.split())


def test_a_negative_count_can_be_a_bad_operand_fault(tmp_path):
    # participant 0 announces -4 rows to participant 1, which then waits for a negative
    # number of bytes; other places of the same count end in a race or semaphore-nonzero
    kernel = a2a_kernel(tmp_path)
    with pytest.raises(mkemu.errors.EmulatorFault) as info:
        kernel(**a2a_inputs(kernel, with_count(0, 0, 1, -4)))
    assert info.value.kind == "bad-operand" and "wait of a negative amount" in info.value.message
    assert (info.value.chip, info.value.core) == (1, 0)
    assert "`bad-operand` for a negative count" in " ".join(DOC.split())


@pytest.mark.parametrize("bad,moved", [(-2 ** 31, 0), (2 ** 23, 0)])
def test_counts_whose_arithmetic_wraps_complete_without_a_fault(tmp_path, bad, moved):
    # participant 1 (chip 1 core 0) sends `bad` rows to participant 0, 128 columns
    kernel = a2a_kernel(tmp_path)
    inputs = a2a_inputs(kernel, with_count(1, 0, 0, bad))
    run = kernel(**inputs)
    assert run.output("rcounts", chip=0)[0][1] == bad
    y0 = run.output("y", chip=0)[0]
    assert np.array_equal(y0[4:4 + moved], inputs["x@1"][0][:moved])
    assert not y0[4 + moved:8].any()
    text = " ".join(DOC.split())
    assert "with 128 columns, -2^31 and 2^23 move no rows" in text


def test_a_count_whose_row_address_wraps_faults_out_of_bounds(tmp_path):
    # 2^24 + 1 rows of 512 bytes: the row offset passes 2^31 bytes and wrapped back into
    # the slot (one row moved, silently); the term's check now stops it at the copy
    kernel = a2a_kernel(tmp_path)
    with pytest.raises(mkemu.errors.EmulatorFault) as info:
        kernel(**a2a_inputs(kernel, with_count(1, 0, 0, 2 ** 24 + 1)))
    fault = info.value
    assert fault.kind == "out-of-bounds" and "the 32-bit address could wrap around" in fault.message
    assert "collectives.mk" in fault.source and "start copy(x[src + off +: piece, :]" in fault.source
    assert "would wrap faults `out-of-bounds` at the copy (2^24 + 1 rows" in " ".join(DOC.split())


# ---------------------------------------------------------------- buffers an all-to-all may not share

SHARED = """
import "{library}";
param MODE = 0;
kernel k(x: hbm f32[2, 32, 128], counts: hbm i32[2, 4], out: hbm f32[2, 32, 128]) {{
    vmem xb: f32[32, 128];
    vmem yb: f32[32, 128];
    smem c: i32[4];
    smem r: i32[4];
    sem s;
    start copy(x[core_id()], xb, s);
    start copy(counts[core_id()], c, s);
    wait copy(x[core_id()], xb, s);
    wait copy(counts[core_id()], c, s);
    if MODE == 0 {{
        all_to_all(xb, xb, c, r, 4, 8, 128);
    }} else {{
        all_to_all(xb, yb, c, c, 4, 8, 128);
    }}
    start copy(xb, out[core_id()], s);
    wait copy(xb, out[core_id()], s);
}}
host {{
    input x: f32[2, 32, 128];
    input counts: i32[2, 4];
    output out: f32[2, 32, 128];
    launch k(x, counts, out);
}}
"""


@pytest.mark.parametrize("mode,memory", [(0, "VMEM"), (1, "SMEM")])
def test_sharing_x_and_y_or_cnt_and_rcnt_is_a_race(tmp_path, mode, memory):
    kernel = mkemu.compile_source(SHARED.format(library=LIBRARY), str(tmp_path / "shared.mk"), hw="test",
                                  mesh="2", params={"MODE": mode})
    with pytest.raises(mkemu.errors.EmulatorFault) as info:
        kernel(counts=np.full((2, 4), 3, np.int32))
    assert info.value.kind == "race" and f"share bytes of {memory}" in info.value.message
    assert "x and y must be different buffers, and so must cnt and rcnt" in " ".join(DOC.split())


# ---------------------------------------------------------------- names next to the library

NAMED = """
import "{library}";
const {name} = 3;
kernel k() {{
    vmem buf: f32[64, 128];
    vmem yb: f32[64, 128];
    smem c: i32[8];
    smem r: i32[8];
    {call}
}}
host {{ launch k(); }}
"""


def _clash(tmp_path, name: str, call: str = "") -> str | None:
    try:
        mkemu.compile_source(NAMED.format(library=LIBRARY, name=name, call=call), str(tmp_path / "named.mk"),
                             hw="test", mesh="2")
    except mkemu.errors.SourceError as error:
        return str(error)
    return None


def _doc_names(before: str, after: str) -> list[str]:
    limits = " ".join(DOC[DOC.index("## Limits"):].split())
    return re.findall(r"`([a-z_]+)`", limits[limits.index(before):limits.index(after)])


def test_parameter_names_clash_as_soon_as_the_library_is_imported(tmp_path):
    names = _doc_names("For the parameter names of every library fn", "that is so as soon as")
    assert {"rows", "size", "x", "out", "parts", "chunk"} <= set(names)
    for name in names:
        error = _clash(tmp_path, name)
        assert error and f"redefinition of '{name}'" in error and "collectives.mk:" in error, name


def test_other_locals_clash_only_where_a_call_inlines_them(tmp_path):
    names = _doc_names("for the other locals", "only where a call inlines them")
    assert {"rank", "peer_no", "counts_ok"} <= set(names)
    for name in names:
        assert _clash(tmp_path, name) is None, name
    assert "redefinition of 'peer_no'" in _clash(tmp_path, "peer_no", "all_to_all(buf, yb, c, r, 8, 8, 128);")
    assert "redefinition of 'counts_ok'" in _clash(tmp_path, "counts_ok",
                                                   "all_to_all_checked(buf, yb, c, r, 8, 8, 128);")
    assert "redefinition of 'rank'" in _clash(tmp_path, "rank", "all_reduce(buf, 64, 128, 8, 1, 8);")


# ---------------------------------------------------------------- more cores per chip, loops


@pytest.mark.parametrize("cores,mesh,schedule", [
    (4, "2", {"schedule": "late"}),
    (3, "3x1x1", {"schedule": "shuffle", "schedule_seed": 3}),
])
def test_ring_collectives_on_chips_of_three_and_four_cores(tmp_path, cores, mesh, schedule):
    # level 0 is a ring of 3 or 4 cores; 11 blocks: uneven chunks, some halves empty
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        for dirs in (1, 2):
            assert run_ring(tmp_path, op, mesh, cores, dirs=dirs, rows=88, cols=72, nblocks=11, **schedule) == [], \
                (op, dirs)


@pytest.mark.parametrize("cores,mesh,cap,checked,schedule", [
    (1, "1", 3, 0, {}),                                       # one participant: only the local copy
    (4, "2", 5, 1, {"schedule": "late"}),
    (3, "3", 2, 0, {"schedule": "shuffle", "schedule_seed": 1}),
])
def test_all_to_all_in_a_loop_on_other_core_counts(tmp_path, cores, mesh, cap, checked, schedule):
    chips = int(mesh)
    parts = chips * cores
    kernel = mkemu.compile_source(A2A.format(library=LIBRARY), str(tmp_path / "a2a.mk"),
                                  hw=profile(tmp_path, cores, base="test"), mesh=mesh,
                                  params={"CORES": cores, "MAXP": parts, "CAP": cap, "COLS": 16,
                                          "CHECKED": checked, "ROUNDS": 3}, **schedule)
    rng = np.random.default_rng(cores)
    counts = {c: rng.integers(0, cap + 1, (cores, parts)) for c in range(chips)}
    counts[0][0, :] = cap
    inputs = a2a_inputs(kernel, counts, cap=cap, cols=16)
    run = kernel(**inputs)
    y, rc = a2a_expected(inputs, chips, cores, cap, rounds=3)
    for chip in range(chips):
        assert np.array_equal(run.output("y", chip=chip), y[chip]), chip
        assert np.array_equal(run.output("rcounts", chip=chip), rc[chip]), chip
