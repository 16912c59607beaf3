"""User programs written from docs/collectives.md alone, checked bit for bit against a
numpy model written from the doc (not from programs/examples/all_reduce_ref.py).

Each program imports programs/lib/collectives.mk, lets every core of every chip take
part, and calls one collective as the doc's table gives it; the model follows the
doc's "Participants, blocks and levels" and "Reduction order" sections literally:
participant (chip, core), levels 0 (cores), 1/2/3 (X/Y/Z), the reduce-scatter over
0, 3, 2, 1, chunk c = [lo + len*c/n, lo + len*(c+1)/n), halves up and down the ring,
acc = v[c+s] + v[c+2s] + ... + v[c+ns] in float32. Meshes: lines and tori, 1 to 8
chips, rings of 3; sizes not multiples of 128 and blocks not multiples of 8 rows;
nblocks from 0 to many blocks and read at run time; adversarial DMA schedules.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import mkemu

ROOT = Path(__file__).parents[2]
LIBRARY = ROOT / "programs" / "lib" / "collectives.mk"
CORES = 2
RS_LEVELS = (0, 3, 2, 1)

# ---------------------------------------------------------------- the doc's model


def _coords(chip, mesh):
    x_dim, y_dim, _ = mesh
    return chip % x_dim, (chip // x_dim) % y_dim, chip // (x_dim * y_dim)


def _rank(p, level, mesh):
    chip, core = p
    return core if level == 0 else _coords(chip, mesh)[level - 1]


def _size(level, mesh):
    return CORES if level == 0 else mesh[level - 1]


def _ring(p, level, mesh):
    """p's ring at `level`, in rank order."""
    chip, core = p
    if level == 0:
        return [(chip, k) for k in range(CORES)]
    x_dim, y_dim, _ = mesh
    out = []
    for r in range(_size(level, mesh)):
        c = list(_coords(chip, mesh))
        c[level - 1] = r
        out.append((c[0] + x_dim * (c[1] + y_dim * c[2]), core))
    return out


def _chunk(lo, hi, n, c):
    return lo + (hi - lo) * c // n, lo + (hi - lo) * (c + 1) // n


def _half(a, b, d, dirs):
    if dirs == 1:
        return a, b
    mid = a + (b - a) // 2
    return (a, mid) if d == 0 else (mid, b)


def model_reduce_scatter(vals, mesh, nblocks, dirs, levels):
    """vals: participant -> [blocks, br, cols] float32, updated in place."""
    seg = {p: (0, nblocks) for p in vals}
    for level in levels:
        n = _size(level, mesh)
        if n == 1:
            continue
        new, seen = {}, set()
        for p in vals:
            ring = _ring(p, level, mesh)
            if tuple(ring) in seen:
                continue
            seen.add(tuple(ring))
            lo, hi = seg[p]
            for c in range(n):
                a, b = _chunk(lo, hi, n, c)
                for d in range(dirs):
                    pa, pb = _half(a, b, d, dirs)
                    s = 1 if d == 0 else -1
                    acc = vals[ring[(c + s) % n]][pa:pb].copy()
                    for i in range(2, n + 1):
                        acc = acc + vals[ring[(c + s * i) % n]][pa:pb]
                    new[(ring[c], pa, pb)] = acc
            for r, q in enumerate(ring):
                seg[q] = _chunk(lo, hi, n, r)
        for (q, pa, pb), acc in new.items():
            vals[q][pa:pb] = acc
    return seg


def owned(p, mesh, nblocks, levels):
    lo, hi = 0, nblocks
    for level in levels:
        n = _size(level, mesh)
        if n > 1:
            lo, hi = _chunk(lo, hi, n, _rank(p, level, mesh))
    return lo, hi


def _group(p, vals, mesh, levels):
    """The participants that share p's coordinates on every level not in `levels`."""
    others = [lv for lv in range(4) if lv not in levels]
    return [q for q in vals if all(_rank(q, lv, mesh) == _rank(p, lv, mesh) for lv in others)]


def model_all_gather(vals, mesh, nblocks, levels):
    out = {}
    for p in vals:
        result = vals[p].copy()
        for q in _group(p, vals, mesh, levels):
            lo, hi = owned(q, mesh, nblocks, levels)
            result[lo:hi] = vals[q][lo:hi]
        out[p] = result
    return out


def model_all_reduce(vals, mesh, nblocks, dirs, levels):
    vals = {p: v.copy() for p, v in vals.items()}
    model_reduce_scatter(vals, mesh, nblocks, dirs, levels)
    return model_all_gather(vals, mesh, nblocks, levels)


# ---------------------------------------------------------------- the programs

RING = """
import "{library}";
param OP = 0;
param LEVEL = 1;
param DIRS = 2;
param ROWS = 64;
param COLS = 128;
param BR = 8;

kernel ring(x: hbm f32[2, ROWS, COLS], nbv: hbm i32[1, 8], out: hbm f32[2, ROWS, COLS]) {{
    vmem buf: f32[ROWS, COLS];
    smem nbs: i32[1, 8];
    sem s;
    start copy(nbv, nbs, s);
    wait copy(nbv, nbs, s);
    let nb = nbs[0, 0];                  // nblocks: a run-time value
    start copy(x[core_id()], buf, s);
    wait copy(x[core_id()], buf, s);
    if OP == 0 {{
        all_reduce(buf, ROWS, COLS, BR, DIRS, nb);
    }} else if OP == 1 {{
        reduce_scatter(buf, ROWS, COLS, BR, DIRS, nb);
    }} else if OP == 2 {{
        all_gather(buf, ROWS, COLS, BR, DIRS, nb);
    }} else if OP == 3 {{
        all_reduce_level(buf, ROWS, COLS, BR, DIRS, LEVEL, nb);
    }} else if OP == 4 {{
        reduce_scatter_level(buf, ROWS, COLS, BR, DIRS, LEVEL, nb);
    }} else if OP == 5 {{
        all_gather_level(buf, ROWS, COLS, BR, DIRS, LEVEL, nb);
    }} else {{
        reduce_scatter(buf, ROWS, COLS, BR, DIRS, nb);        // the two halves of an all-reduce
        all_gather(buf, ROWS, COLS, BR, DIRS, nb);
    }}
    start copy(buf, out[core_id()], s);
    wait copy(buf, out[core_id()], s);
}}

host {{
    input x: f32[2, ROWS, COLS];
    input nbv: i32[1, 8];
    output out: f32[2, ROWS, COLS];
    launch ring(x, nbv, out);
}}
"""

OPS = {"all_reduce": 0, "reduce_scatter": 1, "all_gather": 2, "all_reduce_level": 3,
       "reduce_scatter_level": 4, "all_gather_level": 5, "rs_then_ag": 6}


def _dims(mesh: str):
    dims = tuple(int(v) for v in mesh.split("x"))
    return dims + (1,) * (3 - len(dims))


def _bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def run_ring(tmp_path, op, mesh, *, rows=64, cols=128, br=8, dirs=2, nblocks=8, level=1, hw="tpu-v7-like",
             slots=None, seed=0, params_extra=None, **options):
    """Run one collective; return the participants whose blocks differ from the model's."""
    dims = _dims(mesh)
    chips = dims[0] * dims[1] * dims[2]
    params = {"OP": OPS[op], "LEVEL": level, "DIRS": dirs, "ROWS": rows, "COLS": cols, "BR": br}
    if slots is not None:
        params["CL_SLOTS"] = slots
    params.update(params_extra or {})
    # (one name for every run: the compile cache then keeps one program per ring, op and
    # profile for all the meshes that run it)
    kernel = mkemu.compile_source(RING.format(library=LIBRARY), "ring.mk",
                                  hw=hw, mesh=mesh, params=params, **options)
    rng = np.random.default_rng(seed)
    xs = {c: (rng.standard_normal((CORES, rows, cols)) * (1 + c)).astype(np.float32) for c in range(chips)}
    inputs = {f"x@{c}": xs[c] for c in range(chips)}
    inputs["nbv"] = np.full((1, 8), nblocks, np.int32)
    run = kernel(**inputs)

    nblk = rows // br
    vals = {(c, k): xs[c][k].reshape(nblk, br, cols).copy() for c in range(chips) for k in range(CORES)}
    levels = RS_LEVELS if op in ("all_reduce", "reduce_scatter", "all_gather", "rs_then_ag") else (level,)
    window = None
    if op in ("all_reduce", "all_reduce_level", "rs_then_ag"):
        expected = model_all_reduce(vals, dims, nblocks, dirs, levels)
    elif op in ("reduce_scatter", "reduce_scatter_level"):
        expected = {p: v.copy() for p, v in vals.items()}
        model_reduce_scatter(expected, dims, nblocks, dirs, levels)
        window = {p: owned(p, dims, nblocks, levels) for p in vals}     # other blocks: partial sums
    else:
        expected = model_all_gather(vals, dims, nblocks, levels)
    wrong = []
    for (c, k), value in expected.items():
        got = run.output("out", chip=c)[k].reshape(nblk, br, cols)
        if window is not None:
            lo, hi = window[(c, k)]
            if not np.array_equal(_bits(got[nblocks:]), _bits(vals[(c, k)][nblocks:])):
                wrong.append((c, k, "blocks past nblocks"))
            value, got = value[lo:hi], got[lo:hi]
        if not np.array_equal(_bits(value), _bits(got)):
            wrong.append((c, k))
    return wrong


@pytest.fixture(scope="module")
def torus(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("hw") / "torus.toml"
    path.write_text('name = "torus"\ndescription = "tpu-v7-like, every axis wrapped"\n'
                    'extends = "tpu-v7-like"\n[mesh]\nwrap = [true, true, true]\n')
    return str(path)


# ---------------------------------------------------------------- every collective, every mesh

MESHES = ["1", "2x1x1", "4x1x1", "2x2x1", "2x2x2", "8x1x1", "3x1x1", "1x3x1", "1x1x4"]


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
@pytest.mark.parametrize("dirs", [1, 2])
def test_composed_collectives_match_the_doc(tmp_path, mesh, op, dirs):
    # 40 rows of 200 columns in blocks of 8: 5 blocks, fewer than most meshes' participants
    assert run_ring(tmp_path, op, mesh, rows=40, cols=200, nblocks=5, dirs=dirs) == []


@pytest.mark.parametrize("mesh", ["2x2x1", "4x1x1", "2x2x2"])
def test_many_blocks_and_nblocks_below_rows(tmp_path, mesh):
    assert run_ring(tmp_path, "all_reduce", mesh, rows=256, cols=96, nblocks=29) == []
    assert run_ring(tmp_path, "reduce_scatter", mesh, rows=256, cols=96, nblocks=32, dirs=1) == []


@pytest.mark.parametrize("rows,cols,br,nblocks", [(48, 72, 4, 11), (36, 130, 12, 3), (16, 128, 1, 16),
                                                  (64, 128, 8, 0), (96, 384, 16, 6)])
def test_block_shapes_and_sizes(tmp_path, rows, cols, br, nblocks):
    for op in ("all_reduce", "all_gather"):
        assert run_ring(tmp_path, op, "2x2x1", rows=rows, cols=cols, br=br, nblocks=nblocks) == []


@pytest.mark.parametrize("op", ["all_reduce_level", "reduce_scatter_level", "all_gather_level"])
@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_one_level(tmp_path, op, level):
    assert run_ring(tmp_path, op, "3x2x2", rows=64, cols=128, nblocks=7, level=level) == []


def test_reduce_scatter_then_all_gather_is_the_all_reduce(tmp_path):
    assert run_ring(tmp_path, "rs_then_ag", "2x2x2", rows=48, cols=72, nblocks=6, dirs=2) == []
    assert run_ring(tmp_path, "rs_then_ag", "3x1x1", rows=48, cols=72, nblocks=6, dirs=1) == []


@pytest.mark.parametrize("mesh", ["2x1x1", "4x1x1", "2x2x2", "3x1x1"])
@pytest.mark.parametrize("dirs", [1, 2])
def test_on_a_torus(tmp_path, torus, mesh, dirs):
    for op in ("all_reduce", "all_gather"):
        assert run_ring(tmp_path, op, mesh, rows=64, cols=128, nblocks=7, dirs=dirs, hw=torus) == []


@pytest.mark.parametrize("slots", [1, 3, 4])
def test_other_slot_counts(tmp_path, slots):
    assert run_ring(tmp_path, "all_reduce", "4x1x1", rows=64, cols=128, nblocks=8, slots=slots) == []


def test_test_profile_and_fifo_dma_order(tmp_path):
    assert run_ring(tmp_path, "all_reduce", "2x2x1", hw="test", nblocks=7) == []
    assert run_ring(tmp_path, "all_reduce", "4x1x1", dma_order="fifo", nblocks=7) == []


# ---------------------------------------------------------------- adversarial schedules


@pytest.mark.parametrize("schedule", [{"schedule": "late"}, {"schedule": "shuffle", "schedule_seed": 1},
                                      {"schedule": "shuffle", "schedule_seed": 2}])
def test_rings_of_two_under_adversarial_schedules(tmp_path, schedule):
    for op in ("all_reduce", "all_gather"):
        assert run_ring(tmp_path, op, "2x2x2", rows=64, cols=128, nblocks=8, dirs=1, **schedule) == []


# All-gather steps on rings of 3 or more once shared one receive semaphore, so a block
# of step i+1 landing before a late one of step i let the receiver pass on bytes still
# in flight: a race fault under shuffled schedules (all_reduce.mk --mesh 8). The steps
# now take CL_AG_SEMS semaphores in turn and a sender reuses them only after the
# blocks they last counted landed.
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "all_reduce_level", "all_gather_level"])
def test_all_gather_steps_on_rings_of_four_under_shuffled_schedules(tmp_path, op, seed):
    assert run_ring(tmp_path, op, "4x1x1", rows=64, cols=128, nblocks=8, dirs=1,
                    schedule="shuffle", schedule_seed=seed) == []


@pytest.mark.parametrize("turns", [3, 4])
def test_more_all_gather_turns_on_a_ring_of_five(tmp_path, turns):
    for schedule in ({}, {"schedule": "late"}, {"schedule": "shuffle", "schedule_seed": 2}):
        assert run_ring(tmp_path, "all_reduce", "5x1x1", rows=80, cols=128, nblocks=10, dirs=2,
                        params_extra={"CL_AG_SEMS": turns}, **schedule) == []


def test_the_all_reduce_example_on_a_line_of_eight_under_shuffled_schedules():
    kernel = mkemu.compile(str(ROOT / "programs" / "examples" / "all_reduce.mk"), mesh="8x1x1",
                           schedule="shuffle", schedule_seed=5)
    run = kernel()
    assert run.check() is None


# ---------------------------------------------------------------- all-to-all

ALL_TO_ALL = """
import "{library}";
param MAXP = 8;
param CAP = 5;
param COLS = 72;

kernel a2a(x: hbm f32[2, MAXP * CAP, COLS], y0: hbm f32[2, MAXP * CAP, COLS], counts: hbm i32[2, MAXP],
           y: hbm f32[2, MAXP * CAP, COLS], rcounts: hbm i32[2, MAXP]) {{
    vmem xv: f32[MAXP * CAP, COLS];
    vmem yv: f32[MAXP * CAP, COLS];
    smem cnt: i32[MAXP];
    smem rcnt: i32[MAXP];
    sem s;
    start copy(x[core_id()], xv, s);
    start copy(y0[core_id()], yv, s);
    start copy(counts[core_id()], cnt, s);
    wait copy(x[core_id()], xv, s);
    wait copy(y0[core_id()], yv, s);
    wait copy(counts[core_id()], cnt, s);
    for d in 0..MAXP {{
        rcnt[d] = -1;
    }}
    all_to_all(xv, yv, cnt, rcnt, MAXP, CAP, COLS);
    start copy(yv, y[core_id()], s);
    start copy(rcnt, rcounts[core_id()], s);
    wait copy(yv, y[core_id()], s);
    wait copy(rcnt, rcounts[core_id()], s);
}}

host {{
    input x: f32[2, MAXP * CAP, COLS];
    input y0: f32[2, MAXP * CAP, COLS];
    input counts: i32[2, MAXP];
    output y: f32[2, MAXP * CAP, COLS];
    output rcounts: i32[2, MAXP];
    launch a2a(x, y0, counts, y, rcounts);
}}
"""


@pytest.mark.parametrize("mesh,maxp,cap,cols,options", [
    ("1", 2, 5, 72, {}),
    ("2x1x1", 4, 100, 8, {}),
    ("4x1x1", 8, 3, 200, {"dma_order": "fifo"}),
    ("2x2x1", 12, 9, 72, {"schedule": "shuffle", "schedule_seed": 1}),
    ("2x2x2", 16, 5, 72, {"schedule": "late"}),
    ("3x1x1", 6, 17, 40, {"hw": "test"}),
])
def test_all_to_all_matches_the_doc(tmp_path, mesh, maxp, cap, cols, options):
    dims = _dims(mesh)
    chips = dims[0] * dims[1] * dims[2]
    parts = chips * CORES
    kernel = mkemu.compile_source(ALL_TO_ALL.format(library=LIBRARY), str(tmp_path / "a2a.mk"), mesh=mesh,
                                  params={"MAXP": maxp, "CAP": cap, "COLS": cols}, **options)
    rng = np.random.default_rng(3)
    x, y0, cnt, inputs = {}, {}, {}, {}
    for c in range(chips):
        x[c] = rng.standard_normal((CORES, maxp * cap, cols)).astype(np.float32)
        y0[c] = rng.standard_normal((CORES, maxp * cap, cols)).astype(np.float32)
        cnt[c] = rng.integers(0, cap + 1, (CORES, maxp)).astype(np.int32)
        cnt[c][:, parts:] = 0
        inputs.update({f"x@{c}": x[c], f"y0@{c}": y0[c], f"counts@{c}": cnt[c]})
    cnt[0][0, :parts] = cap                    # one participant sends full slots, one sends nothing
    cnt[chips - 1][1, :parts] = 0
    run = kernel(**inputs)

    def where(p):
        return p % chips, p // chips

    for d in range(parts):
        dc, dk = where(d)
        want_y = y0[dc][dk].copy()             # rows past the counts are not written
        want_r = np.full(maxp, -1, np.int32)   # nor entries of rcnt from P on
        for p in range(parts):
            pc, pk = where(p)
            n = cnt[pc][pk][d]
            want_y[p * cap:p * cap + n] = x[pc][pk][d * cap:d * cap + n]
            want_r[p] = n
        assert np.array_equal(_bits(want_y), _bits(run.output("y", chip=dc)[dk])), f"y of participant {d}"
        assert np.array_equal(want_r, run.output("rcounts", chip=dc)[dk]), f"rcounts of participant {d}"
