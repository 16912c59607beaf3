"""docs/collectives.md, checked from a kernel author's side where the other collective
tests do not go: machines with one core per chip (level 0 is a ring of 1 and skipped),
2-D meshes such as 2x3 with some axes wrapped and others not, the semaphore budget of
every call at other CL_SLOTS / CL_AG_SEMS, the compile-time checks of every function,
the run-time range check on a machine of one core, and several collectives in a loop
under adversarial DMA schedules.

The bit-exact model is the doc's (tests/programs/test_collectives_user_programs.py),
here with the number of cores per chip as a parameter.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import mkemu
from tests.programs.test_collectives_user_programs import (LIBRARY, OPS, RING, RS_LEVELS, _bits, _chunk,
                                                          _dims)

# ---------------------------------------------------------------- the doc's model, any cores per chip


def _coords(chip, mesh):
    x_dim, y_dim, _ = mesh
    return chip % x_dim, (chip // x_dim) % y_dim, chip // (x_dim * y_dim)


def _rank(p, level, mesh):
    chip, core = p
    return core if level == 0 else _coords(chip, mesh)[level - 1]


def _size(level, mesh, cores):
    return cores if level == 0 else mesh[level - 1]


def _ring(p, level, mesh, cores):
    """The participants of p's ring at `level`, in rank order."""
    chip, core = p
    if level == 0:
        return [(chip, k) for k in range(cores)]
    x_dim, y_dim, _ = mesh
    ring = []
    for r in range(_size(level, mesh, cores)):
        c = list(_coords(chip, mesh))
        c[level - 1] = r
        ring.append((c[0] + x_dim * (c[1] + y_dim * c[2]), core))
    return ring


def _owned(p, mesh, cores, nblocks, levels):
    lo, hi = 0, nblocks
    for level in levels:
        n = _size(level, mesh, cores)
        if n > 1:
            lo, hi = _chunk(lo, hi, n, _rank(p, level, mesh))
    return lo, hi


def _reduce_scatter(vals, mesh, cores, nblocks, dirs, levels):
    """In place: the doc's nested ring sums, acc = v[c+s] + v[c+2s] + ... + v[c+ns]."""
    seg = {p: (0, nblocks) for p in vals}
    for level in levels:
        n = _size(level, mesh, cores)
        if n == 1:
            continue
        new = {p: v.copy() for p, v in vals.items()}
        for p in vals:
            ring = _ring(p, level, mesh, cores)
            c = _rank(p, level, mesh)
            lo, hi = seg[p]
            a, b = _chunk(lo, hi, n, c)
            halves = [(a, b, 1)] if dirs == 1 else [(a, a + (b - a) // 2, 1), (a + (b - a) // 2, b, -1)]
            for pa, pb, s in halves:
                acc = vals[ring[(c + s) % n]][pa:pb].copy()
                for i in range(2, n + 1):
                    acc = acc + vals[ring[(c + s * i) % n]][pa:pb]
                new[p][pa:pb] = acc
            seg[p] = (a, b)
        vals.update(new)


def _all_gather(vals, mesh, cores, nblocks, levels):
    out = {}
    others = [lv for lv in range(4) if lv not in levels]
    for p, v in vals.items():
        result = v.copy()
        for q in vals:
            if all(_rank(q, lv, mesh) == _rank(p, lv, mesh) for lv in others):
                lo, hi = _owned(q, mesh, cores, nblocks, levels)
                result[lo:hi] = vals[q][lo:hi]
        out[p] = result
    return out


# ---------------------------------------------------------------- the program, any cores per chip

CORES_RING = (RING.replace("param OP = 0;", "param OP = 0;\nparam CORES = 2;")
              .replace("hbm f32[2, ROWS", "hbm f32[CORES, ROWS")
              .replace("input x: f32[2,", "input x: f32[CORES,")
              .replace("output out: f32[2,", "output out: f32[CORES,"))


def profile(tmp_path: Path, cores: int, wrap=(False, False, False), base="tpu-v7-like") -> str:
    flags = ", ".join("true" if w else "false" for w in wrap)
    path = tmp_path / f"{base}-{cores}-{''.join(str(int(w)) for w in wrap)}.toml"
    path.write_text(f'name = "{base}-{cores}c"\ndescription = "{base}, {cores} core(s) per chip"\n'
                    f'extends = "{base}"\n[chip]\ncores_per_chip = {cores}\n[mesh]\nwrap = [{flags}]\n')
    return str(path)


def run_ring(tmp_path, op, mesh, cores, *, wrap=(False, False, False), rows=56, cols=136, br=8, dirs=2,
             nblocks=7, level=1, params=None, **options):
    """Run one collective; return the participants whose blocks differ from the doc's model."""
    dims = _dims(mesh)
    chips = dims[0] * dims[1] * dims[2]
    all_params = {"OP": OPS[op], "CORES": cores, "LEVEL": level, "DIRS": dirs, "ROWS": rows, "COLS": cols,
                  "BR": br, **(params or {})}
    # (one name for every run: the compile cache then keeps one program per ring, op and
    # profile for all the meshes that run it)
    kernel = mkemu.compile_source(CORES_RING.format(library=LIBRARY), "ring.mk",
                                  hw=profile(tmp_path, cores, wrap), mesh=mesh, params=all_params, **options)
    rng = np.random.default_rng(7)
    xs = {c: (rng.standard_normal((cores, rows, cols)) * (1 + c)).astype(np.float32) for c in range(chips)}
    inputs = {f"x@{c}": xs[c] for c in range(chips)}
    inputs["nbv"] = np.full((1, 8), nblocks, np.int32)
    run = kernel(**inputs)

    nblk = rows // br
    vals = {(c, k): xs[c][k].reshape(nblk, br, cols).copy() for c in range(chips) for k in range(cores)}
    levels = RS_LEVELS if op in ("all_reduce", "reduce_scatter", "all_gather", "rs_then_ag") else (level,)
    window = None
    if op in ("all_reduce", "all_reduce_level", "rs_then_ag"):
        expected = {p: v.copy() for p, v in vals.items()}
        _reduce_scatter(expected, dims, cores, nblocks, dirs, levels)
        expected = _all_gather(expected, dims, cores, nblocks, levels)
    elif op in ("reduce_scatter", "reduce_scatter_level"):
        expected = {p: v.copy() for p, v in vals.items()}
        _reduce_scatter(expected, dims, cores, nblocks, dirs, levels)
        window = {p: _owned(p, dims, cores, nblocks, levels) for p in vals}
    else:
        expected = _all_gather(vals, dims, cores, nblocks, levels)
    wrong = []
    for (c, k), value in expected.items():
        got = run.output("out", chip=c)[k].reshape(nblk, br, cols)
        if window is not None:
            lo, hi = window[(c, k)]
            value, got = value[lo:hi], got[lo:hi]
        if not np.array_equal(_bits(value), _bits(got)):
            wrong.append((c, k))
    return wrong


# ---------------------------------------------------------------- one core per chip, 2-D meshes, wraps

MESHES = [("1", (False, False, False)), ("3x1x1", (False, False, False)), ("3x1x1", (True, False, False)),
          ("2x3", (False, False, False)), ("2x3", (False, True, False)), ("2x3", (True, True, False)),
          ("1x1x3", (False, False, True))]


@pytest.mark.parametrize("mesh,wrap", MESHES)
@pytest.mark.parametrize("cores", [1, 2])
def test_composed_collectives_on_one_or_two_cores_per_chip(tmp_path, mesh, wrap, cores):
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        for dirs in (1, 2):
            assert run_ring(tmp_path, op, mesh, cores, wrap=wrap, dirs=dirs) == [], (op, dirs)


@pytest.mark.parametrize("op", ["all_reduce_level", "reduce_scatter_level", "all_gather_level"])
def test_level_collectives_with_one_core_per_chip(tmp_path, op):
    # level 0 is a ring of one core: nothing moves, every block keeps its bits
    for level in (0, 1, 2):
        assert run_ring(tmp_path, op, "3x2", 1, wrap=(True, False, False), level=level) == [], level


@pytest.mark.parametrize("schedule", [{"schedule": "late"}, {"schedule": "shuffle", "schedule_seed": 3}])
def test_one_core_per_chip_under_adversarial_schedules(tmp_path, schedule):
    for op, slots, turns in (("all_reduce", 1, 3), ("all_gather", 2, 6), ("reduce_scatter", 3, 2)):
        assert run_ring(tmp_path, op, "2x3x2", 1, wrap=(False, True, True), rows=72, cols=64, nblocks=9,
                        params={"CL_SLOTS": slots, "CL_AG_SEMS": turns}, **schedule) == [], op


def test_nblocks_out_of_range_on_one_core_stops_at_the_check(tmp_path):
    for nblocks in (-1, 9):
        with pytest.raises(mkemu.errors.EmulatorFault) as info:
            run_ring(tmp_path, "all_gather", "1", 1, rows=64, nblocks=nblocks)
        waits = [line for line in str(info.value).splitlines() if line.strip().startswith("chip ")]
        assert waits and all("stuck here? nblocks is outside 0 .. rows / br" in line for line in waits)


# ---------------------------------------------------------------- several collectives in a loop

LOOP = """
import "{library}";
param CORES = 2;
param DIRS = 2;
kernel k(x: hbm f32[CORES, 48, 128], out: hbm f32[CORES, 48, 128], out2: hbm f32[CORES, 48, 128]) {{
    vmem buf: f32[48, 128];
    vmem b2: f32[48, 128];
    vmem b3: f32[48, 128];
    sem s;
    start copy(x[core_id()], buf, s);
    wait copy(x[core_id()], buf, s);
    start copy(x[core_id()], b3, s);
    wait copy(x[core_id()], b3, s);
    for it in 0..3 {{
        b2[:, :] = buf[:, :];
        reduce_scatter(buf, 48, 128, 8, DIRS, 6);
        all_gather(buf, 48, 128, 8, DIRS, 6);
        all_reduce(b2, 48, 128, 8, DIRS, 6);
        all_reduce_level(b3, 48, 128, 8, DIRS, 0, 6);
    }}
    start copy(buf, out[core_id()], s);
    wait copy(buf, out[core_id()], s);
    start copy(b2, out2[core_id()], s);
    wait copy(b2, out2[core_id()], s);
}}
host {{
    input x: f32[CORES, 48, 128];
    output out: f32[CORES, 48, 128];
    output out2: f32[CORES, 48, 128];
    launch k(x, out, out2);
}}
"""


@pytest.mark.parametrize("cores,mesh,wrap", [(1, "3x1x1", (True, False, False)), (2, "2x3", (False, False, False))])
@pytest.mark.parametrize("schedule", [{}, {"schedule": "late"}, {"schedule": "shuffle", "schedule_seed": 3}])
def test_collectives_in_a_loop_do_not_interfere(tmp_path, cores, mesh, wrap, schedule):
    # "Each call declares its own receive slots, semaphores and SMEM state, so calls do
    # not interfere and a collective may run in a loop": reduce_scatter + all_gather is
    # the all_reduce, iteration after iteration (small integers: every order is exact)
    dims = _dims(mesh)
    chips = dims[0] * dims[1] * dims[2]
    for dirs in (1, 2):
        kernel = mkemu.compile_source(LOOP.format(library=LIBRARY), str(tmp_path / "loop.mk"),
                                      hw=profile(tmp_path, cores, wrap), mesh=mesh,
                                      params={"CORES": cores, "DIRS": dirs}, **schedule)
        rng = np.random.default_rng(1)
        xs = {c: rng.integers(-8, 8, (cores, 48, 128)).astype(np.float32) for c in range(chips)}
        run = kernel(**{f"x@{c}": xs[c] for c in range(chips)})
        total = sum(xs.values()).sum(axis=0)
        for _ in range(2):
            total = total * (chips * cores)
        for c in range(chips):
            for out in ("out", "out2"):
                assert np.array_equal(run.output(out, chip=c), np.broadcast_to(total, (cores, 48, 128)))


# ---------------------------------------------------------------- semaphore budgets and compile-time checks

ONE_CALL = """
import "{library}";
kernel k() {{
    vmem buf: f32[64, 128];
    vmem yb: f32[64, 128];
    smem c: i32[8];
    smem r: i32[8];
    {call}
}}
host {{ launch k(); }}
"""

CALLS = {
    "reduce_scatter": "reduce_scatter(buf, 64, 128, 8, {d}, 8);",
    "reduce_scatter_level": "reduce_scatter_level(buf, 64, 128, 8, {d}, 1, 8);",
    "all_reduce": "all_reduce(buf, 64, 128, 8, {d}, 8);",
    "all_reduce_level": "all_reduce_level(buf, 64, 128, 8, {d}, 1, 8);",
    "all_gather": "all_gather(buf, 64, 128, 8, {d}, 8);",
    "all_gather_level": "all_gather_level(buf, 64, 128, 8, {d}, 1, 8);",
    "all_to_all": "all_to_all(buf, yb, c, r, 8, 8, 128);",
}


def _semaphores(tmp_path, call, params) -> int:
    """The semaphores one call takes: the count the compiler names on a 1-semaphore profile."""
    hw = tmp_path / "one_sem.toml"
    hw.write_text('name = "one-sem"\ndescription = "test, one semaphore"\nextends = "test"\n[core]\nsemaphores = 1\n')
    with pytest.raises(mkemu.errors.SourceError) as info:
        mkemu.compile_source(ONE_CALL.format(library=LIBRARY, call=call), str(tmp_path / "one.mk"), hw=str(hw),
                             mesh="1", params=params)
    found = re.search(r"kernel 'k' uses (\d+) semaphores; the profile has 1", str(info.value))
    assert found, str(info.value)
    return int(found.group(1))


@pytest.mark.parametrize("slots,turns", [(2, 2), (1, 2), (4, 2), (2, 4), (3, 6)])
def test_semaphores_per_call_are_the_doc_s_formulas(tmp_path, slots, turns):
    for name, call in CALLS.items():
        for dirs in ((1,) if name == "all_to_all" else (1, 2)):
            if name.startswith("reduce_scatter"):
                want = slots * dirs + 1 + 4 * dirs
            elif name.startswith("all_reduce"):
                want = max(slots, turns) * dirs + turns + 4 * dirs
            elif name.startswith("all_gather"):
                want = turns * (dirs + 1) + 4 * dirs
            else:
                want = 6
            got = _semaphores(tmp_path, call.format(d=dirs), {"CL_SLOTS": slots, "CL_AG_SEMS": turns})
            assert got == want, (name, dirs)


@pytest.mark.parametrize("call,message", [
    ("reduce_scatter(buf, 64, 128, 6, 1, 8);", "reduce_scatter: rows must be a multiple of the block rows br"),
    ("all_gather(buf, 64, 128, 8, 3, 8);", "all_gather: dirs is 1 (rings) or 2 (bidirectional rings)"),
    ("all_reduce_level(buf, 64, 128, 8, 1, 4, 8);", "all_reduce_level: level is 0 (cores) or 1, 2, 3"),
    ("reduce_scatter_level(buf, 64, 128, 8, 1, -1, 8);", "reduce_scatter_level: level is 0 (cores) or 1, 2, 3"),
    ("all_gather_level(buf, 64, 128, 8, 0, 1, 8);", "all_gather_level: dirs is 1 (ring) or 2"),
    ("all_gather_level(buf, 64, 128, 24, 1, 1, 2);", "all_gather_level: rows must be a multiple of the block rows br"),
])
def test_every_function_checks_its_compile_time_arguments(tmp_path, call, message):
    with pytest.raises(mkemu.errors.SourceError) as info:
        mkemu.compile_source(ONE_CALL.format(library=LIBRARY, call=call), str(tmp_path / "bad.mk"), hw="test",
                             mesh="2")
    assert "assertion failed: " + message in str(info.value)


def test_all_to_all_refuses_a_capacity_of_8192_rows(tmp_path):
    source = ONE_CALL.replace("f32[64, 128]", "f32[8192, 8]").replace("i32[8]", "i32[1]")
    with pytest.raises(mkemu.errors.SourceError) as info:
        mkemu.compile_source(source.format(library=LIBRARY, call="all_to_all(buf, yb, c, r, 1, 8192, 8);"),
                             str(tmp_path / "cap.mk"), hw="test", mesh="1")
    assert "assertion failed: all_to_all: cap must be below 8192 rows" in str(info.value)


@pytest.mark.parametrize("call,message", [
    # br = 0 was four to six errors: division by zero in the rows % br assert and in
    # rows / br, a slot of 0 rows, empty slices in the all-gather's copies.
    ("reduce_scatter(buf, 64, 128, 0, 1, 8);", "assertion failed: reduce_scatter: the block rows br must be positive"),
    ("reduce_scatter_level(buf, 64, 128, 0, 1, 1, 8);",
     "assertion failed: reduce_scatter_level: the block rows br must be positive"),
    ("all_reduce(buf, 64, 128, 0, 1, 8);", "assertion failed: all_reduce: the block rows br must be positive"),
    ("all_reduce(buf, 64, 128, -8, 2, 8);", "assertion failed: all_reduce: the block rows br must be positive"),
    ("all_reduce_level(buf, 64, 128, 0, 1, 1, 8);",
     "assertion failed: all_reduce_level: the block rows br must be positive"),
    ("all_gather(buf, 64, 128, 0, 1, 8);", "assertion failed: all_gather: the block rows br must be positive"),
    ("all_gather_level(buf, 64, 128, -8, 1, 1, 8);",
     "assertion failed: all_gather_level: the block rows br must be positive"),
    # A capacity or room of 0 (or below) sizes the parameters' own types: once, not per parameter.
    ("all_to_all(buf, yb, c, r, 8, 0, 128);", "dimensions must be positive, got 0; the call passes maxp = 8, cap = 0"),
    ("all_to_all(buf, yb, c, r, 0, 8, 128);", "dimensions must be positive, got 0; the call passes maxp = 0, cap = 8"),
    ("all_to_all(buf, yb, c, r, -8, -8, 128);", "dimensions must be positive, got -8; the call passes maxp = -8"),
    ("all_to_all_checked(buf, yb, c, r, 8, 0, 128);",
     "dimensions must be positive, got 0; the call passes maxp = 8, cap = 0"),
])
def test_a_bad_block_or_row_count_is_one_error_naming_it_and_the_call(tmp_path, call, message):
    with pytest.raises(mkemu.errors.SourceError) as info:
        mkemu.compile_source(ONE_CALL.format(library=LIBRARY, call=call), str(tmp_path / "bad.mk"), hw="test",
                             mesh="2")
    (only,) = info.value.diagnostics
    assert message in only.message
    fn = call.partition("(")[0]
    assert only.message.endswith(f"(in fn '{fn}' inlined at {tmp_path / 'bad.mk'}:8:5)")


def test_a_bad_block_count_at_the_command_line_is_one_error(tmp_path, capsys):
    from mkemu.cli import main

    source = tmp_path / "ring.mk"
    source.write_text(ONE_CALL.format(library=LIBRARY, call="all_gather(buf, 64, 128, 0, 1, 8);"))
    code = main(["run", str(source), "--hw", "test", "--mesh", "2"])
    err = capsys.readouterr().err
    assert code == 1 and err.count(": error:") == 1 and err.startswith(f"{LIBRARY}:")
    assert "all_gather: the block rows br must be positive" in err and f"inlined at {source}:8:5" in err
    assert 'assert br > 0, "all_gather: the block rows br must be positive";' in err   # the line, with its caret
