"""Valid pipeline, view and assignment programs, as docs/language.md describes them
("Pipelines", "Views: indexing and slicing", "Assignment" and tutorial section 6),
compiled and run through the public API and compared bit for bit with numpy results
computed here from the docs (docs/numerics.md for bf16 rounding and the matmul's
sequential-k accumulation). Pipelined programs also run `same` under the adversarial
schedules of docs/safety.md; every error the docs name is a `file:line:col` message."""

from __future__ import annotations

import itertools
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest

import mkemu
from mkemu.dsl import ir
from mkemu.dsl.frontend import load_program
from mkemu.errors import EmulatorFault, SourceError

RNG = np.random.default_rng(2024)
FILE = "/tmp/valid_pipeline.mk"
DOC = Path(__file__).parents[2] / "docs" / "language.md"
SCHEDULES = (dict(schedule="normal"), dict(schedule="late"), dict(schedule="shuffle", schedule_seed=1),
             dict(schedule="shuffle", schedule_seed=2))


# ------------------------------------------------------------------ helpers


def compile_(src: str, mesh: str = "1", **options):
    return mkemu.compile_source(src, FILE, hw="test", mesh=mesh, **options)


def run(src: str, options: dict | None = None, **inputs):
    return compile_(src, **(options or {}))(**inputs)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def bf16_round(x):
    """Round float32 to the nearest bf16, ties to even (docs/numerics.md), as float32."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32)


def bf16(*shape):
    return bf16_round(f32(*shape))


def matmul(a, w):
    """The matrix unit's contract: bf16 operands, one float32 addition per k, in order."""
    a, w = bf16_round(a), bf16_round(w)
    acc = np.zeros((a.shape[0], w.shape[1]), np.float32)
    for k in range(a.shape[1]):
        acc = acc + a[:, k:k + 1] * w[k:k + 1, :]
    return acc


def same(expected, got) -> None:
    expected, got = np.asarray(expected), np.asarray(got)
    assert expected.shape == got.shape
    if expected.dtype.kind == "f":
        np.testing.assert_array_equal(expected.astype(np.float32).view(np.uint32),
                                      got.astype(np.float32).view(np.uint32))
    else:
        np.testing.assert_array_equal(expected, got)


def check_all_schedules(src: str, expected: dict, inputs: dict, **options) -> list[int]:
    """Run under the normal, late and shuffled schedules: the same bits every time (and
    no race, deadlock or semaphore fault). Returns the cycles of each run."""
    cycles = []
    for schedule in SCHEDULES:
        r = run(src, dict(options, **schedule), **inputs)
        for name, value in expected.items():
            same(value, r.output(name))
        cycles.append(r.report.cycles)
    return cycles


def compile_error(src: str, **options) -> str:
    """The rendered compile error (a SourceError, never another exception)."""
    with pytest.raises(SourceError) as info:
        compile_(src, **options)
    text = info.value.render()
    assert "Traceback" not in text
    return text


def assert_error(text: str, line: int, message: str) -> None:
    """`text` reports `message` at FILE:line:col."""
    assert re.search(rf"^{re.escape(FILE)}:{line}:\d+: error: .*{re.escape(message)}", text, re.M), text


def fault(src: str, **inputs) -> str:
    with pytest.raises(EmulatorFault) as info:
        run(src, **inputs)
    return info.value.render()


def doc_block(marker: str) -> str:
    """The code block of docs/language.md that starts with `marker`."""
    return DOC.read_text().split(marker + "\n")[1].split("```")[0]


# ------------------------------------------------------------------ tutorial 6


TUTORIAL = doc_block("// file: matmul_pipelined.mk")


@pytest.mark.parametrize("m, k, n", [(8, 128, 256), (8, 256, 768), (16, 128, 1280), (4, 384, 512)])
def test_tutorial_pipelined_matmul_is_the_contract_matmul(m, k, n):
    # 1, 3, 5 and 2 tiles of 256 columns through three slots.
    x, w = bf16(m, k), bf16(k, n)
    check_all_schedules(TUTORIAL, {"y": matmul(x, w)}, {"x": x, "w": w}, params={"M": m, "K": k, "N": n})


def test_tutorial_streams_w_through_three_slots():
    k = ir_of(TUTORIAL, {"K": 256, "N": 1024}).kernels["matmul_pl"]
    slots = {b.name: (b.slots, b.dtype, b.shape) for b in k.buffers if b.slots}
    assert slots == {"wt": (3, "bf16", (256, 256)), "yt": (3, "f32", (8, 256))}


def test_tutorial_pipelined_matmul_rounds_f32_inputs_to_bf16():
    x, w = f32(8, 128), f32(128, 512)
    r = run(TUTORIAL, {"params": {"M": 8, "K": 128, "N": 512}}, x=x, w=w)
    same(matmul(bf16_round(x), bf16_round(w)), r.output("y"))


def test_tutorial_pipelined_matmul_overlaps_and_depth_one_does_not():
    # "each tile of y goes back to HBM while the next tiles are computed"; "With D = 1
    # nothing overlaps": the same bits, more cycles.
    x, w = bf16(8, 256), bf16(256, 1024)
    params = {"M": 8, "K": 256, "N": 1024}
    deep = run(TUTORIAL, {"params": params}, x=x, w=w)
    flat = run(TUTORIAL.replace("depth 3", "depth 1"), {"params": params}, x=x, w=w)
    same(deep.output("y"), flat.output("y"))
    same(matmul(x, w), flat.output("y"))
    assert flat.report.cycles > deep.report.cycles


# ------------------------------------------------------------------ pipelines: depths, counts, steps

ROWS = """
param R = 8;
param D = 2;
kernel kp(x: hbm f32[R * 8, 256], y: hbm f32[R * 8, 256]) {
    pipeline t in 0..R depth D {
        input xt = x[t * 8 +: 8, :];
        output yt = y[t * 8 +: 8, :];
        yt = xt * 2.0 + f32(t);
    }
}
"""


@pytest.mark.parametrize("tiles, depth", list(itertools.product([1, 2, 3, 7], [1, 2, 3, 5])))
def test_depth_and_tile_count_sweep(tiles, depth):
    # fewer tiles than slots, exactly as many, and more (not a multiple).
    x = f32(tiles * 8, 256)
    expected = x * np.float32(2.0) + np.repeat(np.arange(tiles, dtype=np.float32), 8)[:, None]
    check_all_schedules(ROWS, {"y": expected}, {"x": x}, params={"R": tiles, "D": depth})


def test_default_depth_is_two_slots_per_stream():
    p = ir_of(ROWS.replace(" depth D", ""))
    k = p.kernels["kp"]
    assert sorted((b.name, b.slots, b.shape) for b in k.buffers) == [("xt", 2, (8, 256)), ("yt", 2, (8, 256))]
    assert sorted((s.name, s.count) for s in k.sems) == [("xt.sem", 2), ("yt.sem", 2)]


def ir_of(src: str, params=None):
    """The front end's checked program (docs/language.md "For the back end")."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "prog.mk"
        path.write_text(src)
        return load_program(str(path), params or {})


def _walk(stmts):
    for s in stmts:
        yield s
        for field in ("body", "then", "orelse"):
            yield from _walk(getattr(s, field, ()) or ())


@pytest.mark.parametrize("tiles, depth", [(1, 3), (2, 2), (5, 3), (6, 4), (4, 1)])
def test_generated_prologue_loop_and_drain(tiles, depth):
    # "the prologue: the input copies of tiles 0 .. D-2"; "after the loop, waits for the
    # last min(n, D) write-backs"; a slot array T[D][shape] and sem[D] per stream.
    p = ir_of(ROWS, {"R": tiles, "D": depth})
    k = p.kernels["kp"]
    assert {(b.name, b.slots) for b in k.buffers} == {("xt", depth), ("yt", depth)}
    assert {(s.name, s.count) for s in k.sems} == {("xt.sem", depth), ("yt.sem", depth)}
    body = list(k.body)
    loops = [i for i, s in enumerate(body) if isinstance(s, ir.For)]
    main, drain = body[loops[0]], body[loops[1]]
    prologue = [s for s in body[:loops[0]] if isinstance(s, ir.DmaStart)]
    assert len(prologue) == min(depth - 1, tiles)
    assert [s.dma.src.offsets[0].value for s in prologue] == [8 * j for j in range(len(prologue))]
    assert (main.start.value, main.stop.value) == (0, tiles)
    assert (drain.start.value, drain.stop.value) == (max(0, tiles - depth), tiles)
    waits = [s for s in _walk(main.body) if isinstance(s, ir.SemWait)]
    # one wait for tile k's input, one (from k >= D) for the write-back of tile k - D
    assert len(waits) == 2 and all(w.amount.value == 8 * 256 * 4 for w in waits)


STEPPED = """
param A = 0;
param B = 4;
param S = 1;
param D = 2;
kernel kp(x: hbm f32[64, 128], y: hbm f32[64, 128], a: i32, b: i32) {
    pipeline t in a..b step S depth D {
        input xt = x[t * 8 +: 8, :];
        output yt = y[t * 8 +: 8, :];
        yt = xt - f32(t);
    }
}
host {
    input x: f32[64, 128];
    output y: f32[64, 128];
    launch kp(x, y, A, B);
}
"""


@pytest.mark.parametrize("a, b, s, d", [(0, 4, 1, 2), (2, 8, 3, 3), (3, 3, 1, 2), (5, 2, 1, 3), (7, 8, 1, 4),
                                        (1, 8, 2, 4), (0, 8, 5, 1), (6, 8, 1, 4), (0, 8, 8, 2)])
def test_run_time_bounds_with_a_step(a, b, s, d):
    # t = A, A+S, ... below B, A and B run-time scalars; none when B <= A.
    x = f32(64, 128)
    expected = np.zeros_like(x)
    for t in range(a, b, s):
        expected[t * 8:t * 8 + 8] = x[t * 8:t * 8 + 8] - np.float32(t)
    check_all_schedules(STEPPED, {"y": expected}, {"x": x}, params={"A": a, "B": b, "S": s, "D": d})


def test_static_step_that_does_not_divide_the_range_and_a_negative_start():
    src = """
kernel kp(x: hbm f32[80, 128], y: hbm f32[80, 128], z: hbm f32[40, 128]) {
    pipeline t in 1..10 step 3 depth 2 {
        input xt = x[t * 8 +: 8, :];
        output yt = y[t * 8 +: 8, :];
        yt = xt + 1.0;
    }
    pipeline t in -2..3 depth 3 {
        input xt = x[(t + 2) * 8 +: 8, :];
        output zt = z[(t + 2) * 8 +: 8, :];
        zt = xt * f32(t);
    }
}
"""
    x = f32(80, 128)
    y = np.zeros_like(x)
    for t in (1, 4, 7):
        y[t * 8:t * 8 + 8] = x[t * 8:t * 8 + 8] + np.float32(1)
    z = x[:40] * np.repeat(np.arange(-2, 3, dtype=np.float32), 8)[:, None]
    check_all_schedules(src, {"y": y, "z": z}, {"x": x})


def test_run_time_start_from_the_core_id():
    src = """
kernel kp(x: hbm f32[64, 128], y: hbm f32[64, 128]) {
    let me = core_id();
    pipeline t in me * 4..me * 4 + 4 depth 3 {
        input xt = x[t * 8 +: 8, :];
        output yt = y[t * 8 +: 8, :];
        yt = xt + f32(me);
    }
}
"""
    x = f32(64, 128)
    check_all_schedules(src, {"y": x + np.repeat(np.array([0, 1], np.float32), 32)[:, None]}, {"x": x})


# ------------------------------------------------------------------ pipelines: streams


def test_two_inputs_two_outputs_point_index_and_missing_trailing_index():
    src = """
kernel kp(a: hbm f32[4, 8, 256], b: hbm f32[32, 256], s: hbm f32[4, 8, 256], d: hbm f32[32, 256]) {
    pipeline t in 0..4 depth 3 {
        input at = a[t];
        input bt = b[t * 8 +: 8];
        output st = s[t];
        output dt = d[t * 8 +: 8, :];
        st = at + bt;
        dt = at - bt;
    }
}
"""
    a, b = f32(4, 8, 256), f32(32, 256)
    b3 = b.reshape(4, 8, 256)
    check_all_schedules(src, {"s": a + b3, "d": (a - b3).reshape(32, 256)}, {"a": a, "b": b})


def test_input_only_pipeline_accumulates():
    src = """
kernel kp(x: hbm f32[6, 8, 128], y: hbm f32[8, 128]) {
    vmem acc: f32[8, 128];
    sem s;
    acc = 0.0;
    pipeline t in 0..6 depth 4 {
        input xt = x[t];
        acc += xt;
    }
    start copy(acc, y, s);
    wait copy(acc, y, s);
}
"""
    x = f32(6, 8, 128)
    acc = np.zeros((8, 128), np.float32)
    for t in range(6):
        acc = acc + x[t]
    check_all_schedules(src, {"y": acc}, {"x": x})


def test_output_only_pipeline_of_i32_tiles():
    src = """
kernel kp(y: hbm i32[5, 8, 128]) {
    pipeline t in 0..5 {
        output yt = y[t];
        yt = iota(1, 128) * t + iota(0, 8);
    }
}
"""
    t = np.arange(5)[:, None, None]
    expected = (np.arange(128)[None, None, :] * t + np.arange(8)[None, :, None]).astype(np.int32)
    check_all_schedules(src, {"y": expected}, {})


def test_one_dimensional_and_bf16_tiles():
    src = """
kernel kp(x: hbm f32[6, 128], y: hbm bf16[6, 128], u: hbm bf16[16, 256], v: hbm bf16[16, 256]) {
    pipeline t in 0..6 depth 3 {
        input xt = x[t];
        output yt = y[t];
        yt = bf16(xt * 1.5);
    }
    pipeline c in 0..4 {
        input ut = u[:, c * 64 +: 64];
        output vt = v[:, c * 64 +: 64];
        vt = ut;
    }
}
"""
    x, u = f32(6, 128), bf16(16, 256)
    check_all_schedules(src, {"y": bf16_round(x * np.float32(1.5)), "v": u}, {"x": x, "u": u})


def test_streams_of_vmem_and_smem_views():
    # a stream is any view: VMEM tiles go through VMEM slots, SMEM rows through SMEM slots.
    src = """
kernel kp(x: hbm f32[32, 128], y: hbm f32[32, 128], i: hbm i32[4, 16], j: hbm i32[4, 16]) {
    vmem xv: f32[32, 128];
    vmem yv: f32[32, 128];
    smem is: i32[4, 16];
    smem js: i32[4, 16];
    sem s;
    start copy(x, xv, s);
    start copy(i, is, s);
    wait copy(x, xv, s);
    wait copy(i, is, s);
    pipeline t in 0..4 depth 2 {
        input xt = xv[t * 8 +: 8, :];
        output yt = yv[t * 8 +: 8, :];
        yt = xt * xt;
    }
    pipeline t in 0..4 depth 3 {
        input it = is[t];
        output jt = js[t];
        for e in 0..16 { jt[e] = it[e] * 2 + t; }
    }
    start copy(yv, y, s);
    start copy(js, j, s);
    wait copy(yv, y, s);
    wait copy(js, j, s);
}
"""
    x, i = f32(32, 128), RNG.integers(-1000, 1000, (4, 16)).astype(np.int32)
    check_all_schedules(src, {"y": x * x, "j": i * 2 + np.arange(4, dtype=np.int32)[:, None]}, {"x": x, "i": i})


def test_a_stream_whose_view_does_not_move_and_a_run_time_column_start():
    src = """
kernel kp(x: hbm f32[8, 128], z: hbm f32[32, 512], ix: hbm i32[4], y: hbm f32[32, 128],
          w: hbm f32[32, 128]) {
    smem idx: i32[4];
    sem s;
    start copy(ix, idx, s);
    wait copy(ix, idx, s);
    let off = idx[1];
    pipeline t in 0..4 depth 2 {
        input xt = x;
        output yt = y[t * 8 +: 8, :];
        yt = xt * f32(t);
    }
    pipeline t in 0..4 depth 3 {
        input zt = z[t * 8 +: 8, off +: 128];
        output wt = w[t * 8 +: 8, :];
        wt = zt;
    }
}
"""
    x, z = f32(8, 128), f32(32, 512)
    y = np.concatenate([x * np.float32(t) for t in range(4)])
    check_all_schedules(src, {"y": y, "w": z[:, 300:428]}, {"x": x, "z": z, "ix": np.array([0, 300, 0, 0], np.int32)})


def test_body_uses_the_pipeline_variable_and_is_narrowed_by_its_if():
    src = """
kernel kp(x: hbm f32[40, 128], y: hbm f32[32, 128]) {
    vmem nxt: f32[8, 128];
    sem s;
    pipeline t in 0..4 {
        input xt = x[t * 8 +: 8, :];
        output yt = y[t * 8 +: 8, :];
        if t + 1 < 4 {
            start copy(x[(t + 1) * 8 +: 8, :], nxt, s);
            wait copy(x[(t + 1) * 8 +: 8, :], nxt, s);
        } else {
            nxt = 0.0;
        }
        yt = xt + nxt;
    }
}
"""
    x = f32(40, 128)
    y = x[:32].copy()
    y[:24] += x[8:32]
    check_all_schedules(src, {"y": y}, {"x": x})
    text = compile_error(src.replace("if t + 1 < 4", "if t + 1 < 5").replace("40, 128", "32, 128"))
    assert_error(text, 9, "slice reaching 8..40 is out of range for dimension 0 of 'x' (size 32)")


# ------------------------------------------------------------------ pipelines: nesting


def test_pipeline_nested_in_a_pipeline():
    src = """
kernel kp(x: hbm f32[32, 512], y: hbm f32[32, 512]) {
    pipeline i in 0..4 depth 2 {
        input first = x[i * 8 +: 8, 0:128];
        output yf = y[i * 8 +: 8, 0:128];
        yf = first;
        pipeline j in 1..4 depth 3 {
            input xt = x[i * 8 +: 8, j * 128 +: 128];
            output yt = y[i * 8 +: 8, j * 128 +: 128];
            yt = xt * first + f32(i * 10 + j);
        }
    }
}
"""
    x = f32(32, 512)
    y = x.copy()
    for i in range(4):
        for j in range(1, 4):
            rows, cols = slice(i * 8, i * 8 + 8), slice(j * 128, j * 128 + 128)
            y[rows, cols] = x[rows, cols] * x[rows, 0:128] + np.float32(i * 10 + j)
    check_all_schedules(src, {"y": y}, {"x": x})


def test_loop_around_a_pipeline_whose_range_follows_the_loop():
    src = """
kernel kp(x: hbm f32[3, 40, 128], y: hbm f32[3, 40, 128]) {
    for l in 0..3 {
        pipeline t in l..5 step 2 depth 3 {
            input xt = x[l, t * 8 +: 8, :];
            output yt = y[l, t * 8 +: 8, :];
            yt = xt * f32(l + 1);
        }
    }
}
"""
    x = f32(3, 40, 128)
    y = np.zeros_like(x)
    for l in range(3):
        for t in range(l, 5, 2):
            y[l, t * 8:t * 8 + 8] = x[l, t * 8:t * 8 + 8] * np.float32(l + 1)
    check_all_schedules(src, {"y": y}, {"x": x})


def test_a_pipeline_in_an_fn_called_twice_gets_fresh_slots():
    src = """
fn scale(x: hbm f32[32, 128], y: hbm f32[32, 128], c: i32) {
    pipeline t in 0..4 depth 3 {
        input xt = x[t * 8 +: 8, :];
        output yt = y[t * 8 +: 8, :];
        yt = xt * f32(c);
    }
}
kernel kp(x: hbm f32[32, 128], y: hbm f32[32, 128], z: hbm f32[32, 128]) {
    if core_id() == 0 {
        scale(x, y, 2);
        scale(y, z, 3);
    }
}
"""
    x = f32(32, 128)
    check_all_schedules(src, {"y": x * np.float32(2), "z": x * np.float32(2) * np.float32(3)}, {"x": x})
    assert sum(b.slots == 3 for b in ir_of(src).kernels["kp"].buffers) == 4


# ------------------------------------------------------------------ pipelines: shared slots, parts


def test_two_pipelines_share_a_ring_bigger_than_their_tiles():
    # `via` ring of 3 slots: the fresh output slots take its depth; an 8x128 tile uses the
    # leading rows and columns of a 16x256 slot.
    src = """
kernel kp(x: hbm f32[48, 128], z: hbm f32[48, 256], y: hbm f32[48, 128], y2: hbm f32[48, 256]) {
    vmem ring: f32[3][16, 256];
    sem rs[3];
    pipeline t in 0..6 {
        input xt = x[t * 8 +: 8, :] via ring, rs;
        output yt = y[t * 8 +: 8, :];
        yt = xt * 3.0;
    }
    pipeline t in 0..3 depth 3 {
        input zt = z[t * 16 +: 16, :] via ring, rs;
        output yt = y2[t * 16 +: 16, :];
        yt = zt - 1.0;
    }
}
"""
    x, z = f32(48, 128), f32(48, 256)
    check_all_schedules(src, {"y": x * np.float32(3), "y2": z - np.float32(1)}, {"x": x, "z": z})
    k = ir_of(src).kernels["kp"]
    assert sorted(b.slots for b in k.buffers) == [3, 3, 3]


def test_an_output_stream_through_existing_slots():
    src = """
kernel kp(x: hbm f32[32, 256], y: hbm f32[32, 256]) {
    vmem ring: f32[2][16, 128];
    sem rs[2];
    vmem oring: f32[2][8, 256];
    sem os[2];
    pipeline t in 0..4 {
        input xt = x[t * 8 +: 8, 128:256] via ring, rs;
        output yt = y[t * 8 +: 8, 0:128] via oring, os;
        yt = xt + 1.0;
    }
}
"""
    x = f32(32, 256)
    y = np.zeros_like(x)
    y[:, :128] = x[:, 128:] + np.float32(1)
    check_all_schedules(src, {"y": y}, {"x": x})


def test_an_output_chosen_at_run_time_and_a_one_slot_ring():
    # a one-slot ring gives the pipeline depth 1, its fresh output slots too
    src = """
kernel kp(x: hbm f32[32, 128], y: hbm f32[64, 128], z: hbm f32[32, 128]) {
    vmem ring1: f32[1][8, 128];
    sem r1[1];
    pipeline t in 0..4 {
        input xt = x[t * 8 +: 8, :];
        output yt = select(t < 2, y[t * 8 +: 8, :], y[(t + 4) * 8 +: 8, :]);
        yt = xt + 1.0;
    }
    pipeline t in 0..4 {
        input xt = x[t * 8 +: 8, :] via ring1, r1;
        output zt = z[t * 8 +: 8, :];
        zt = xt * 2.0;
    }
}
"""
    x = f32(32, 128)
    y = np.zeros((64, 128), np.float32)
    y[0:16] = x[0:16] + np.float32(1)
    y[48:64] = x[16:32] + np.float32(1)
    check_all_schedules(src, {"y": y, "z": x * np.float32(2)}, {"x": x})
    slots = {b.name: b.slots for b in ir_of(src).kernels["kp"].buffers}
    assert slots["zt"] == 1 and slots["yt"] == 2


PARTS = """
param N = 5;
fn scaled(part: i32, x: hbm f32[64, 128], y: hbm f32[64, 128], ring: vmem f32[3][8, 128], rs: sem[3], c: i32) {
    pipeline t in 1..N + 1 part part {
        input xt = x[t * 8 +: 8, :] via ring, rs;
        output yt = y[t * 8 +: 8, :];
        yt = xt * f32(c);
    }
}
kernel kp(x: hbm f32[64, 128], y: hbm f32[64, 128], a: hbm f32[8, 128], b: hbm f32[8, 128]) {
    vmem ring: f32[3][8, 128];
    vmem av: f32[8, 128];
    sem rs[3];
    sem s;
    scaled(FIRST, x, y, ring, rs, 7);
    start copy(a, av, s);
    wait copy(a, av, s);
    av = av + 1.0;
    start copy(av, b, s);
    wait copy(av, b, s);
    scaled(SECOND, x, y, ring, rs, 7);
}
"""


@pytest.mark.parametrize("tiles", [1, 2, 3, 6])
@pytest.mark.parametrize("first, second", [("prefetch", "primed"), ("1", "2")])
def test_prefetch_then_primed_over_a_three_slot_ring(tiles, first, second):
    # one and two tiles: fewer than the D - 1 = 2 a prefetch may start.
    src = PARTS.replace("FIRST", first).replace("SECOND", second)
    x, a = f32(64, 128), f32(8, 128)
    y = np.zeros_like(x)
    y[8:8 + tiles * 8] = x[8:8 + tiles * 8] * np.float32(7)
    check_all_schedules(src, {"y": y, "b": a + np.float32(1)}, {"x": x, "a": a}, params={"N": tiles})


def test_part_whole_is_the_default():
    src = ROWS.replace("depth D", "depth D part whole")
    x = f32(24, 256)
    expected = x * np.float32(2.0) + np.repeat(np.arange(3, dtype=np.float32), 8)[:, None]
    check_all_schedules(src, {"y": expected}, {"x": x}, params={"R": 3, "D": 3})
    same(expected, run(ROWS.replace("depth D", "depth D part 0"), {"params": {"R": 3, "D": 3}}, x=x).output("y"))


@pytest.mark.parametrize("n", [0, 1, 3, 4])
def test_layer_loop_prefetches_the_next_layer_with_a_run_time_count(n):
    src = """
param L = 3;
param NT = 4;
fn layer(part: i32, l: i32, w: hbm f32[L, 32, 128], y: hbm f32[L, 32, 128], ring: vmem f32[2][8, 128],
         rs: sem[2], n: i32) {
    pipeline t in 0..n part part {
        input wt = w[l, t * 8 +: 8, :] via ring, rs;
        output yt = y[l, t * 8 +: 8, :];
        yt = wt + f32(l * 100 + t);
    }
}
kernel kp(w: hbm f32[L, 32, 128], y: hbm f32[L, 32, 128], n: i32) {
    vmem ring: f32[2][8, 128];
    sem rs[2];
    layer(prefetch, 0, w, y, ring, rs, n);
    for l in 0..L {
        layer(primed, l, w, y, ring, rs, n);
        if l + 1 < L {
            layer(prefetch, l + 1, w, y, ring, rs, n);
        }
    }
}
host {
    input w: f32[L, 32, 128];
    output y: f32[L, 32, 128];
    launch kp(w, y, NT);
}
"""
    w = f32(3, 32, 128)
    y = np.zeros_like(w)
    for l in range(3):
        for t in range(n):
            y[l, t * 8:t * 8 + 8] = w[l, t * 8:t * 8 + 8] + np.float32(l * 100 + t)
    check_all_schedules(src, {"y": y}, {"w": w}, params={"NT": n})


PARTS_STEPPED = """
fn half(part: i32, a: i32, b: i32, x: hbm f32[64, 128], y: hbm f32[64, 128], ring: vmem f32[4][8, 128],
        rs: sem[4]) {
    pipeline t in a..b step 3 part part {
        input xt = x[t * 8 +: 8, :] via ring, rs;
        output yt = y[t * 8 +: 8, :];
        yt = xt * 0.5 + f32(t);
    }
}
kernel kp(x: hbm f32[64, 128], y: hbm f32[64, 128], a: i32, b: i32) {
    vmem ring: f32[4][8, 128];
    sem rs[4];
    half(prefetch, a, b, x, y, ring, rs);
    half(primed, a, b, x, y, ring, rs);
}
host {
    input x: f32[64, 128];
    output y: f32[64, 128];
    launch kp(x, y, BOUNDS);
}
"""


@pytest.mark.parametrize("a, b", [(0, 8), (1, 8), (2, 3), (5, 5), (7, 1)])
def test_parts_with_run_time_bounds_and_a_step(a, b):
    # a prefetch of up to 3 tiles of a run-time count (0, 1, 3 tiles here)
    x = f32(64, 128)
    y = np.zeros_like(x)
    for t in range(a, b, 3):
        y[t * 8:t * 8 + 8] = x[t * 8:t * 8 + 8] * np.float32(0.5) + np.float32(t)
    check_all_schedules(PARTS_STEPPED.replace("BOUNDS", f"{a}, {b}"), {"y": y}, {"x": x})


PART_IN_FN = """
fn f(part: i32, x: hbm f32[32, 128], y: hbm f32[32, 128], ring: vmem f32[2][8, 128], rs: sem[2]) {
    pipeline t in 0..4 part part {
        input xt = x[t * 8 +: 8, :] via ring, rs;
        output yt = y[t * 8 +: 8, :];
        yt = xt;
    }
}
kernel kp(x: hbm f32[32, 128], y: hbm f32[32, 128]) {
    vmem ring: f32[2][8, 128];
    sem rs[2];
    assert whole == 0 && prefetch == 1 && primed == 2, "the names of the parts";
    CALLS
}
"""


@pytest.mark.parametrize("calls", ["f(whole, x, y, ring, rs);", "f(0, x, y, ring, rs);",
                                   "f(prefetch, x, y, ring, rs); f(primed, x, y, ring, rs);",
                                   "f(1, x, y, ring, rs); f(2, x, y, ring, rs);"])
def test_the_part_is_a_compile_time_integer_given_to_the_fn(calls):
    x = f32(32, 128)
    check_all_schedules(PART_IN_FN.replace("CALLS", calls), {"y": x}, {"x": x})


@pytest.mark.parametrize("call, message", [
    ("f(3, x, y, ring, rs);", "the part of a pipeline is whole (0), prefetch (1) or primed (2), got 3"),
    ("f(core_id(), x, y, ring, rs);", "the part of a pipeline must be a compile-time integer")])
def test_a_bad_part_is_reported_at_the_pipeline_for_the_call(call, message):
    # "checked at each call rather than on its own": the error names the inlining call
    text = compile_error(PART_IN_FN.replace("CALLS", call))
    assert_error(text, 3, message + f" (in fn 'f' inlined at {FILE}:13:5)")


def test_the_docs_doubled_fn_in_two_parts():
    # The `doubled` fn of "Shared slots and prefetching", as written there.
    fn = "fn doubled" + DOC.read_text().split("fn doubled", 1)[1].split("doubled(prefetch", 1)[0]
    src = """
param M = 8;
param K = 256;
param N = 768;
const TN = 256;
""" + fn + """
kernel kp(x: hbm bf16[M, K], w: hbm bf16[K, N], y2: hbm f32[M, N]) {
    vmem xv: bf16[M, K];
    vmem ring: bf16[2][K, TN];
    sem rs[2];
    sem xs;
    doubled(prefetch, xv, w, y2, ring, rs);
    start copy(x, xv, xs);
    wait copy(x, xv, xs);
    doubled(primed, xv, w, y2, ring, rs);
}
"""
    x, w = bf16(8, 256), bf16(256, 768)
    check_all_schedules(src, {"y2": matmul(x, w) * np.float32(2.0)}, {"x": x, "w": w})


# ------------------------------------------------------------------ pipelines: bounds and errors


def test_tile_views_are_checked_over_the_range_of_t():
    src = """
kernel kp(x: hbm f32[64, 128], y: hbm f32[64, 128]) {
    pipeline t in 0..9 depth 3 {
        input xt = x[t * 8 +: 8, :];
        output yt = y[t * 8 +: 8, :];
        yt = xt;
    }
}
"""
    text = compile_error(src)
    assert_error(text, 4, "is out of range for dimension 0 of 'x' (size 64)")
    assert_error(text, 5, "slice reaching 0..72 is out of range for dimension 0 of 'y' (size 64)")
    # t = 1, 6, 11: rows 4.., 24.., 44..52
    text = compile_error(src.replace("0..9 depth 3", "1..12 step 5 depth 2").replace("t * 8 +: 8", "t * 4 +: 8")
                         .replace("64, 128", "48, 128"))
    assert_error(text, 5, "slice reaching 4..52 is out of range for dimension 0 of 'y' (size 48)")


RUNTIME_COUNT = """
kernel kp(x: hbm f32[24, 128], y: hbm f32[24, 128], n: i32) {
    pipeline t in 0..n depth 4 {
        input xt = x[t * 8 +: 8, :];
        output yt = y[t * 8 +: 8, :];
        yt = xt * 3.0;
    }
}
host {
    input x: f32[24, 128];
    output y: f32[24, 128];
    launch kp(x, y, COUNT);
}
"""


@pytest.mark.parametrize("count", [0, 1, 2, 3])
def test_prologue_tiles_past_a_run_time_count_are_never_issued(count):
    # with n < D - 1 the prologue tiles past n would lie past x's end (rows 24..): not issued.
    x = f32(24, 128)
    y = np.zeros_like(x)
    y[:count * 8] = x[:count * 8] * np.float32(3)
    check_all_schedules(RUNTIME_COUNT.replace("COUNT", str(count)), {"y": y}, {"x": x})


def test_a_run_time_count_past_the_array_faults_naming_the_buffer_and_line():
    # (the prologue's tile 3: its row start t * 8 = 24 leaves x's rows)
    text = fault(RUNTIME_COUNT.replace("COUNT", "4"), x=f32(24, 128))
    assert "[out-of-bounds]" in text and "index 8*v = 24 (v = 3) of dimension 0 of 'x' (f32[24, 128])" in text
    assert f"{FILE}:3:" in text


PIPE_ERRORS = """
kernel kp(x: hbm f32[64, 128], y: hbm f32[64, 128]) {
    vmem ring: f32[2][8, 128];
    vmem ring3: f32[3][8, 128];
    vmem small: f32[2][8, 64];
    vmem ibuf: i32[2][8, 128];
    sem rs[2];
    sem rs3[3];
    var v: f32[8, 128];
    BODY
}
"""
S_IN = "input xt = x[t * 8 +: 8, :]"
S_OUT = "output yt = y[t * 8 +: 8, :];"


@pytest.mark.parametrize("body, message", [
    (f"pipeline t in 0..2 {{ {S_OUT} yt = 0.0; {S_IN}; }}",
     "a pipeline's streams (input/output) come first, before its body"),
    ("pipeline t in 0..2 { v = 0.0; }", "a pipeline needs at least one stream"),
    ("input xt = x[0:8, :];", "'input xt = ...' declares a stream of a pipeline: it goes at the top of a pipeline's block"),
    ("output yt = y[0:8, :];", "'output yt = ...' declares a stream of a pipeline"),
    (f"pipeline t in 0..2 {{ {S_IN} via small, rs; {S_OUT} yt = xt; }}",
     "slots f32[8, 64] of 'small' cannot hold the tile f32[8, 128]"),
    (f"pipeline t in 0..2 {{ {S_IN} via ibuf, rs; {S_OUT} yt = xt; }}",
     "slots i32[8, 128] of 'ibuf' cannot hold the tile f32[8, 128]"),
    (f"pipeline t in 0..2 {{ {S_IN} via ring, rs3; {S_OUT} yt = xt; }}",
     "'ring' has 2 slots but 'rs3' 3 semaphores: one per slot"),
    (f"pipeline t in 0..2 depth 3 {{ {S_IN} via ring, rs; {S_OUT} yt = xt; }}",
     "depth 3, but the slots of 'ring' are 2"),
    (f"pipeline t in 0..2 part 3 {{ {S_IN} via ring, rs; {S_OUT} yt = xt; }}",
     "the part of a pipeline is whole (0), prefetch (1) or primed (2), got 3"),
    (f"pipeline t in 0..2 part -1 {{ {S_IN} via ring, rs; {S_OUT} yt = xt; }}",
     "the part of a pipeline is whole (0), prefetch (1) or primed (2), got -1"),
    (f"let p = core_id(); pipeline t in 0..2 part p {{ {S_IN} via ring, rs; {S_OUT} yt = xt; }}",
     "the part of a pipeline must be a compile-time integer"),
    (f"pipeline t in 0..2 part prefetch {{ {S_IN}; {S_OUT} yt = xt; }}",
     "the inputs of a pipeline run in parts (prefetch) give their slots with `via BUF, SEMS`"),
    (f"pipeline t in 0..2 part primed {{ {S_IN}; {S_OUT} yt = xt; }}",
     "the inputs of a pipeline run in parts (primed) give their slots with `via BUF, SEMS`"),
    (f"pipeline t in 0..2 part prefetch {{ {S_OUT} yt = 1.0; }}",
     "a pipeline run in parts (prefetch) streams inputs: the prefetch starts their first tiles"),
    (f"pipeline t in 0..2 depth 0 {{ {S_IN}; {S_OUT} yt = xt; }}", "the pipeline depth must be positive, got 0"),
    (f"pipeline t in 0..2 step 0 {{ {S_IN}; {S_OUT} yt = xt; }}", "the pipeline step must be positive, got 0"),
    (f"let s = core_id() + 1; pipeline t in 0..2 step s {{ {S_IN}; {S_OUT} yt = xt; }}",
     "the pipeline step must be a compile-time integer"),
    (f"pipeline t in 0..2 {{ {S_IN} via ring, rs; input x2 = x[t * 8 +: 8, :] via ring3, rs3; {S_OUT} yt = xt + x2; }}",
     "the streams of a pipeline share one depth; their slots have [2, 3]"),
    (f"pipeline t in 0..2 {{ input xt = v; {S_OUT} yt = xt; }}",
     "'v' is a var; a pipeline stream copies to or from a vmem, smem or hbm buffer"),
    (f"pipeline t in 0..2 {{ {S_IN} via ring[0], rs; {S_OUT} yt = xt; }}",
     "the slots of a stream are a whole buffer array"),
    (f"pipeline t in 0..2 {{ {S_IN} via ring, rs[0]; {S_OUT} yt = xt; }}",
     "the semaphores of a stream are a whole semaphore array"),
    (f"pipeline t in 0..2 {{ {S_IN}; {S_OUT} yt = xt; t = 1; }}",
     "cannot assign to 't': it is a pipeline variable"),
    (f"pipeline t in 0..2 {{ {S_IN}; output xt = y[t * 8 +: 8, :]; xt = xt; }}", "redefinition of 'xt'"),
    (f"pipeline t in 0..2 {{ input xt = x[t * 16 +: 16, :].; {S_OUT} yt = xt; }}", "unexpected"),
    ("pipeline t in 0..2 { input xt = ring; output yt = y[t * 8 +: 8, :]; yt = 0.0; }",
     "a pipeline stream is a view of a buffer"),
])
def test_pipeline_errors_name_the_line(body, message):
    text = compile_error(PIPE_ERRORS.replace("BODY", body))
    assert_error(text, 10, message)


def test_two_streams_of_one_pipeline_in_one_ring_is_an_error():
    # Two inputs via one ring would land in the same slot; an input and an output via one
    # ring would load tile k + D - 1 into the slot tile k - 1 is still being written back
    # from. Both used to compile and fault with a race at run time.
    text = compile_error(PIPE_ERRORS.replace("BODY", f"""pipeline t in 0..2 {{
        {S_IN} via ring, rs;
        input zt = x[t * 8 +: 8, :] via ring, rs;
        {S_OUT}
        yt = xt - zt;
    }}"""))
    assert_error(text, 12, "streams 'xt' and 'zt' of one pipeline both use the slots of 'ring'")
    text = compile_error(PIPE_ERRORS.replace("BODY", f"""pipeline t in 0..2 {{
        {S_IN} via ring, rs;
        output yt = y[t * 8 +: 8, :] via ring, rs;
        yt = xt;
    }}"""))
    assert_error(text, 12, "streams 'xt' and 'yt' of one pipeline both use the slots of 'ring'")


def test_two_streams_may_share_one_semaphore_array():
    # every wait of tile k happens before the body, so the bytes of both copies have landed
    src = """
kernel kp(x: hbm f32[32, 128], z: hbm f32[32, 256], y: hbm f32[32, 128]) {
    vmem ring: f32[2][8, 128];
    vmem ring2: f32[2][8, 256];
    sem rs[2];
    pipeline t in 0..4 {
        input xt = x[t * 8 +: 8, :] via ring, rs;
        input zt = z[t * 8 +: 8, :] via ring2, rs;
        output yt = y[t * 8 +: 8, :];
        yt = xt - zt[:, 128:256];
    }
}
"""
    x, z = f32(32, 128), f32(32, 256)
    check_all_schedules(src, {"y": x - z[:, 128:]}, {"x": x, "z": z})


def test_a_tile_of_three_dimensions_is_an_error():
    src = """
kernel kp(x: hbm f32[4, 8, 128], y: hbm f32[4, 8, 128]) {
    pipeline t in 0..2 {
        input xt = x[t * 2 +: 2];
        output yt = y[t];
        yt = xt[0];
    }
}
"""
    assert_error(compile_error(src), 4, "a pipeline tile has at most 2 dimensions, got [2, 8, 128]")


def test_a_prefetch_never_primed_leaves_its_copies_unwaited():
    src = f"""
kernel kp(x: hbm f32[32, 128], y: hbm f32[32, 128]) {{
    vmem ring: f32[2][8, 128];
    sem rs[2];
    pipeline t in 0..4 part prefetch {{
        {S_IN} via ring, rs;
        {S_OUT}
        yt = xt;
    }}
}}
"""
    assert_error(compile_error(src), 5, "is never waited")


# ------------------------------------------------------------------ views


def test_every_view_form_of_the_docs():
    src = """
kernel kv(x: hbm f32[16, 512], w: hbm f32[3, 16, 256], y: hbm f32[16, 512], z: hbm f32[3, 16, 256],
          ix: hbm i32[8]) {
    vmem a: f32[8, 128];
    vmem b: f32[16, 512];
    vmem wbuf: f32[2][16, 256];
    smem idx: i32[8];
    sem s;
    start copy(ix, idx, s);
    wait copy(ix, idx, s);
    b = 0.0;
    start copy(x[0:8, 128:256], a, s);                  // a static window
    wait copy(x[0:8, 128:256], a, s);
    b[8:16, 0:128] = a;
    for k in 1..3 {
        let e = k * 128;
        start copy(x[8:16, k*128:(k+1)*128], a, s);     // length worked out: 128
        wait copy(x[8:16, e:e+128], a, s);              // same
        b[0:8, e +: 128] = a + f32(k);
    }
    let j = idx[3];                                     // one SMEM element: a scalar
    start copy(x[0:8, j +: 128], a, s);                 // any start, static length
    wait copy(x[0:8, j +: 128], a, s);
    b[8:16, 384:512] = a;
    start copy(b, y, s);
    wait copy(b, y, s);
    for l in 0..3 {
        start copy(w[l], wbuf[l % 2], s);               // a point index drops the dimension
        wait copy(w[l], wbuf[l % 2], s);
        wbuf[l % 2][0:8, :] = wbuf[l % 2][8:16, :] * 2.0;   // slot first, then its dimensions
        start copy(wbuf[l % 2], z[l], s);
        wait copy(wbuf[l % 2], z[l], s);
    }
    start copy(w[1, 0:8, :], wbuf[1][8:16, :], s);
    wait copy(w[1, 0:8, :], wbuf[1][8:16, :], s);
    start copy(wbuf[1][8:16, 0:128], z[2, 0:8, 128:256], s);
    wait copy(wbuf[1][8:16, 0:128], z[2, 0:8, 128:256], s);
}
"""
    x, w = f32(16, 512), f32(3, 16, 256)
    b = np.zeros((16, 512), np.float32)
    b[8:16, 0:128] = x[0:8, 128:256]
    for k in (1, 2):
        b[0:8, k * 128:k * 128 + 128] = x[8:16, k * 128:k * 128 + 128] + np.float32(k)
    b[8:16, 384:512] = x[0:8, 200:328]
    z = w.copy()
    for l in range(3):
        z[l, 0:8] = w[l, 8:16] * np.float32(2)
    z[2, 0:8, 128:256] = w[1, 0:8, 0:128]
    r = run(src, x=x, w=w, ix=np.array([0, 0, 0, 200, 0, 0, 0, 0], np.int32))
    same(b, r.output("y"))
    same(z, r.output("z"))


def test_let_views_point_indices_and_static_slices_of_a_let_tile():
    src = """
kernel kv(x: hbm f32[16, 256], y: hbm f32[16, 256], r: hbm f32[4, 256]) {
    vmem v: f32[16, 256];
    vmem u: f32[4, 256];
    sem s;
    start copy(x, v, s);
    wait copy(x, v, s);
    let m = v[2:10, :] * 2.0;
    let row = v[0:1, :];
    u = 0.0;
    u[0] = v[3];
    u[1, 0:128] = m[:, 0:128][1:2, :];
    u[1, 128:256] = m[7:8, 128:256];
    u[2, :] = m[0, 0];
    u[3] = row + v[15];
    v[0:4] = u;
    let q = v[8:9, 0:128];
    q = row[:, 128:256];
    start copy(v, y, s);
    wait copy(v, y, s);
    start copy(u, r, s);
    wait copy(u, r, s);
}
"""
    x = f32(16, 256)
    m = x[2:10] * np.float32(2)
    u = np.zeros((4, 256), np.float32)
    u[0] = x[3]
    u[1, :128], u[1, 128:] = m[1, :128], m[7, 128:]
    u[2] = m[0, 0]
    u[3] = x[0] + x[15]
    v = x.copy()
    v[0:4] = u
    v[8, :128] = u[0, 128:]     # `row` is a view: it reads v[0] as it is now (u[0] = x[3])
    r = run(src, x=x)
    same(v, r.output("y"))
    same(u, r.output("r"))


def test_one_dimensional_buffers_with_loop_starts():
    src = """
kernel kv(x: hbm f32[1024], y: hbm f32[1024]) {
    vmem v: f32[1024];
    vmem o: f32[1024];
    sem s;
    start copy(x, v, s);
    wait copy(x, v, s);
    for j in 0..8 {
        o[(7 - j) * 128 +: 128] = v[j * 128 +: 128] - v[0:128];
    }
    start copy(o, y, s);
    wait copy(o, y, s);
}
"""
    x = f32(1024)
    o = np.empty_like(x)
    for j in range(8):
        o[(7 - j) * 128:(8 - j) * 128] = x[j * 128:j * 128 + 128] - x[0:128]
    same(o, run(src, x=x).output("y"))


def test_run_time_slot_index():
    src = """
kernel kv(ix: hbm i32[4], x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    smem idx: i32[4];
    vmem b: f32[3][8, 128];
    sem s;
    start copy(ix, idx, s);
    wait copy(ix, idx, s);
    start copy(x, b[idx[0]], s);
    wait copy(x, b[idx[0]], s);
    b[2] = b[idx[0]] + 1.0;
    start copy(b[2], y, s);
    wait copy(b[2], y, s);
}
"""
    x = f32(8, 128)
    same(x + np.float32(1), run(src, ix=np.array([1, 0, 0, 0], np.int32), x=x).output("y"))
    text = fault(src, ix=np.array([3, 0, 0, 0], np.int32), x=x)
    assert "[out-of-bounds]" in text and "slot 3 of 'b' (f32[3][8, 128]) is outside 0..2" in text
    assert f"{FILE}:8:" in text


VLOAD = """
kernel kv(x: hbm f32[8, 512], ix: hbm i32[4], y: hbm f32[8, 128]) {
    vmem v: f32[8, 512];
    vmem after: f32[8, 512];
    vmem o: f32[8, 128];
    smem idx: i32[4];
    sem s;
    start copy(ix, idx, s);
    wait copy(ix, idx, s);
    start copy(x, v, s);
    wait copy(x, v, s);
    after = 0.0;
    let j = idx[1];
    o = v[:, j +: 128];
    start copy(o, y, s);
    wait copy(o, y, s);
}
"""

DMA = """
kernel kv(x: hbm f32[8, 512], ix: hbm i32[4], y: hbm f32[8, 128]) {
    vmem o: f32[8, 128];
    smem idx: i32[4];
    sem s;
    start copy(ix, idx, s);
    wait copy(ix, idx, s);
    start copy(x[:, idx[1] +: 128], o, s);
    wait copy(x[:, idx[1] +: 128], o, s);
    start copy(o, y, s);
    wait copy(o, y, s);
}
"""

SMEM = """
kernel kv(ix: hbm i32[4], y: hbm i32[4]) {
    smem idx: i32[4];
    smem o: i32[4];
    sem s;
    start copy(ix, idx, s);
    wait copy(ix, idx, s);
    o[0] = idx[idx[1]];
    o[1] = 0;
    o[2] = 0;
    o[3] = 0;
    start copy(o, y, s);
    wait copy(o, y, s);
}
"""


@pytest.mark.parametrize("src, start, dim, line", [
    (VLOAD, 400, 1, 14), (VLOAD, 500, 1, 14), (DMA, 385, 1, 8), (SMEM, 4, 0, 8), (SMEM, -1, 0, 8)])
def test_a_run_time_start_that_leaves_its_buffer_faults(src, start, dim, line):
    # "even when it stays inside the memory": `after` follows v; idx is followed by o.
    # (A start that leaves its dimension is caught there, naming the dimension.)
    buffer, last = {VLOAD: ("'v' (f32[8, 512])", 384), DMA: ("'x' (f32[8, 512])", 384),
                    SMEM: ("'idx' (i32[4])", 3)}[src]
    text = fault(src, x=f32(8, 512), ix=np.array([0, start, 0, 0], np.int32)) if src is not SMEM else \
        fault(src, ix=np.array([0, start, 0, 0], np.int32))
    assert "[out-of-bounds]" in text and f"index {start} of dimension {dim} of {buffer} is outside 0..{last}" in text
    assert f"{FILE}:{line}:" in text


@pytest.mark.parametrize("src", [VLOAD, DMA])
def test_a_run_time_start_at_the_last_column_block_is_fine(src):
    x = f32(8, 512)
    same(x[:, 384:], run(src, x=x, ix=np.array([0, 384, 0, 0], np.int32)).output("y"))


def test_smem_element_with_a_run_time_index():
    r = run(SMEM, ix=np.array([7, 3, 0, 9], np.int32))
    same(np.array([9, 0, 0, 0], np.int32), r.output("y"))


VIEW_ERRORS = """
kernel kv(x: hbm f32[16, 512], w: hbm f32[3, 16, 256], ix: hbm i32[4], n: i32) {
    vmem v: f32[16, 512];
    vmem a: f32[8, 128];
    vmem wb: f32[2][16, 256];
    smem idx: i32[4];
    sem s;
    BODY
}
host {
    input x: f32[16, 512];
    input w: f32[3, 16, 256];
    input ix: i32[4];
    launch kv(x, w, ix, 3);
}
"""


@pytest.mark.parametrize("body, message", [
    ("a = v[8:16, 400:528];", "slice 400:528 is out of range for dimension 1 of 'v' (size 512)"),
    ("a = v[12:20, 0:128];", "slice 12:20 is out of range for dimension 0 of 'v' (size 16)"),
    ("a = v[0:8, -1 +: 128];", "slice -1:127 is out of range for dimension 1 of 'v' (size 512)"),
    ("a = v[-8:0, 0:128];", "slice -8:0 is out of range for dimension 0 of 'v' (size 16)"),
    ("for k in 0..5 { a = v[0:8, k * 128 +: 128]; }",
     "slice reaching 0..640 is out of range for dimension 1 of 'v' (size 512)"),
    ("a = v[0:8, 0:n];", "slice length must be known at compile time; write start +: LENGTH"),
    ("for k in 0..n { a = v[0:8, k:2*k]; }", "slice length must be known at compile time"),
    ("start copy(w[3], wb[0], s); wait copy(w[3], wb[0], s);",
     "index 3 is out of range for dimension 0 of 'w' (size 3)"),
    ("wb[2] = 0.0;", "index 2 is out of range for buffer array 'wb' (size 2)"),
    ("for l in 0..3 { wb[l] = 0.0; }", "index ranging over 0..2 is out of range for buffer array 'wb' (size 2)"),
    ("idx[4] = 1;", "index 4 is out of range for dimension 0 of 'idx' (size 4)"),
    ("a = v[0:8, 0:128, 0];", "too many indices"),
    ("a = v[0:0, 0:128];", "empty slice (length 0)"),
    ("a = v[8:0, 0:128];", "empty slice"),
    ("let m = v[0:8, 0:128] * 2.0; a = m[0:8, n +: 128];", "a let-bound tile can only be indexed statically"),
    ("wb = 0.0;", "buffer array 'wb' needs a slot index"),
])
def test_view_errors_name_the_line(body, message):
    assert_error(compile_error(VIEW_ERRORS.replace("BODY", body)), 8, message)


@pytest.mark.parametrize("body", ["for k in 0..5 { if k + 1 < 5 { a = v[0:8, k * 128 +: 128]; } }",
                                  "for k in 0..5 { if k < 4 { a = v[0:8, (k + 1) * 128 - 128 +: 128]; } }"])
def test_an_enclosing_if_narrows_the_loop_range(body):
    compile_(VIEW_ERRORS.replace("BODY", body))


# ------------------------------------------------------------------ assignment


def test_tile_assignment_forms():
    src = """
kernel ka(a: hbm bf16[8, 128], b: hbm bf16[128, 256], x: hbm f32[8, 256], r: hbm f32[6, 8, 256],
          q: hbm bf16[8, 256]) {
    vmem av: bf16[8, 128];
    vmem bv: bf16[128, 256];
    vmem xv: f32[8, 256];
    vmem o: f32[6][8, 256];
    vmem qb: bf16[8, 256];
    var acc: f32[8, 256];
    var acc2: f32[8, 256] = 0.0;
    sem s;
    start copy(a, av, s);
    start copy(b, bv, s);
    start copy(x, xv, s);
    wait copy(a, av, s);
    wait copy(b, bv, s);
    wait copy(x, xv, s);
    acc = xv;
    acc += matmul(av, bv);
    o[0] = acc;
    acc -= matmul(av, bv);
    o[1] = acc;
    acc = xv;
    acc *= matmul(av, bv);
    o[2] = acc;
    acc /= matmul(av, bv);
    o[3] = acc;
    o[4] = xv;
    o[4][:, 128:256] += xv[:, 0:128];
    o[4][0:4, :] *= 2.0;
    o[4][4:8, 0:128] /= xv[0:1, 0:128];
    o[4][0:8, 0:64] -= xv[:, 255:256];
    o[5] = acc2;
    o[5][2:5, 100:200] = -1.5;
    o[5][7:8, :] = inf;
    o[5][6, :] = -inf;
    qb = 0.25;
    qb[:, 0:128] = bf16(xv[:, 0:128]);
    for i in 0..6 {
        start copy(o[i], r[i], s);
        wait copy(o[i], r[i], s);
    }
    start copy(qb, q, s);
    wait copy(qb, q, s);
}
"""
    a, b, x = bf16(8, 128), bf16(128, 256), f32(8, 256)
    m = matmul(a, b)
    r = np.zeros((6, 8, 256), np.float32)
    r[0] = x + m
    r[1] = r[0] - m
    r[2] = x * m
    r[3] = r[2] / m
    o = x.copy()
    o[:, 128:] = o[:, 128:] + x[:, :128]
    o[0:4] = o[0:4] * np.float32(2)
    o[4:8, :128] = o[4:8, :128] / x[0:1, :128]
    o[:, :64] = o[:, :64] - x[:, 255:256]
    r[4] = o
    r[5, 2:5, 100:200] = -1.5
    r[5, 7] = np.inf
    r[5, 6] = -np.inf
    qb = np.full((8, 256), 0.25, np.float32)
    qb[:, :128] = bf16_round(x[:, :128])
    got = run(src, a=a, b=b, x=x)
    same(r, got.output("r"))
    same(qb, got.output("q"))


def test_literal_fills_round_once():
    # float literals are float32; a bf16 store rounds them to nearest even
    src = """
kernel ka(q: hbm bf16[8, 256], y: hbm f32[8, 256], z: hbm i32[4, 128]) {
    vmem qb: bf16[8, 256];
    vmem yv: f32[8, 256];
    vmem zv: i32[4, 128];
    sem s;
    qb = 0.1;
    qb[1] = 1.0 / 3.0;
    qb[2, 0:128] = -0.0;
    qb[3, 5:6] = 1e-40;
    qb[4] = 3.4e38;
    yv = 0.1;
    yv[1] = 1.0 / 3.0;
    yv[2, 7] = -0.0;
    yv[3] = 1e-40;
    yv[4] = -inf;
    zv = -7;
    zv[1] = 2147483647;
    zv[2, 3:9] = 0x7f;
    start copy(qb, q, s);
    wait copy(qb, q, s);
    start copy(yv, y, s);
    wait copy(yv, y, s);
    start copy(zv, z, s);
    wait copy(zv, z, s);
}
"""
    r = run(src)
    q = np.full((8, 256), bf16_round(np.float32(0.1)), np.float32)
    q[1] = bf16_round(np.float32(1 / 3))
    q[2, :128] = -0.0
    q[3, 5] = bf16_round(np.float32(1e-40))
    q[4] = np.inf                               # 3.4e38 rounds past the largest bf16
    same(q, r.output("q"))
    y = np.full((8, 256), np.float32(0.1))
    y[1] = np.float32(1 / 3)
    y[2, 7] = -0.0
    y[3] = np.float32(1e-40)
    y[4] = -np.inf
    same(y, r.output("y"))
    z = np.full((4, 128), -7, np.int32)
    z[1] = 2147483647
    z[2, 3:9] = 127
    same(z, r.output("z"))
    text = compile_error(src.replace("zv[1] = 2147483647;", "zv[1] = 2147483648;"))
    assert_error(text, 18, "the constant 2,147,483,648 does not fit in 32 bits")


def test_a_store_that_reads_its_destination_through_another_view():
    src = """
kernel ka(x: hbm f32[16, 256], y: hbm f32[16, 256]) {
    vmem xv: f32[16, 256];
    sem s;
    start copy(x, xv, s);
    wait copy(x, xv, s);
    xv = xv - xv[0:1, :];
    xv[8:16, :] = xv[0:8, :] + xv[8:16, :];
    xv[:, 128:256] = xv[:, 0:128] * xv[:, 1:129];
    start copy(xv, y, s);
    wait copy(xv, y, s);
}
"""
    x = f32(16, 256)
    e = x - x[0:1]
    e[8:16] = e[0:8] + e[8:16]
    e[:, 128:256] = e[:, 0:128] * e[:, 1:129]
    same(e, run(src, x=x).output("y"))


def test_scalar_smem_and_i32_assignment_forms():
    src = """
kernel ka(x: hbm f32[8, 256], y: hbm f32[8, 256], ix: hbm i32[8], it: hbm i32[8, 128], tp: hbm i32[2]) {
    vmem xv: f32[8, 256];
    vmem iv: i32[8, 128];
    smem idx: i32[8];
    smem top: i32[2];
    var count: i32 = 0;
    var c2: i32 = 100;
    sem s;
    start copy(x, xv, s);
    wait copy(x, xv, s);
    for t in 0..5 { count += 1; c2 -= t; }
    c2 *= 3;
    c2 /= -7;
    let m = argmax(xv, axis=1);
    idx[0] = scalar(m[0, 0]);
    idx[1] = scalar(m[3, 0]);
    idx[2] = count;
    idx[3] = c2;
    idx[4] = 17;
    idx[4] += idx[2];
    idx[5] = -9;
    idx[5] /= 2;
    idx[6] = idx[4] * idx[5];
    idx[7] = 0;
    idx[7] -= 1;
    for t in 0..2 { top[t] = scalar(m[0, 0]) + t; }
    xv[:, 0:1] = f32(count);
    iv = 5;
    iv[0:4, :] = iota(1, 128);
    iv += iota(0, 8);
    iv *= -3;
    iv -= count;
    start copy(xv, y, s);
    wait copy(xv, y, s);
    start copy(idx, ix, s);
    wait copy(idx, ix, s);
    start copy(iv, it, s);
    wait copy(iv, it, s);
    start copy(top, tp, s);
    wait copy(top, tp, s);
}
"""
    x = f32(8, 256)
    am = np.argmax(x, axis=1)
    c2 = int((100 - 10) * 3 / -7)     # truncation toward zero: -38
    i4, i5 = 17 + 5, -4
    idx = np.array([am[0], am[3], 5, c2, i4, i5, i4 * i5, -1], np.int32)
    y = x.copy()
    y[:, 0] = 5
    iv = np.full((8, 128), 5, np.int64)
    iv[0:4] = np.arange(128)
    iv = (iv + np.arange(8)[:, None]) * -3 - 5
    r = run(src, x=x)
    same(idx, r.output("ix"))
    same(y, r.output("y"))
    same(iv.astype(np.int32), r.output("it"))
    same(np.array([am[0], am[0] + 1], np.int32), r.output("tp"))


def test_pipeline_output_slot_assigned_in_pieces():
    src = """
kernel ka(x: hbm f32[32, 256], y: hbm f32[32, 256]) {
    pipeline t in 0..4 depth 3 {
        input xt = x[t * 8 +: 8, :];
        output yt = y[t * 8 +: 8, :];
        yt = 0.0;
        yt[:, 0:128] = xt[:, 128:256];
        yt[0:1, :] += xt[7:8, :];
        yt *= 2.0;
    }
}
"""
    x = f32(32, 256)
    y = np.zeros_like(x)
    for t in range(4):
        b = np.zeros((8, 256), np.float32)
        xt = x[t * 8:t * 8 + 8]
        b[:, :128] = xt[:, 128:]
        b[0] = b[0] + xt[7]
        y[t * 8:t * 8 + 8] = b * np.float32(2)
    check_all_schedules(src, {"y": y}, {"x": x})


ASSIGN_ERRORS = """
const C = 3;
kernel ka(x: hbm f32[8, 128], n: i32) {
    vmem a: f32[8, 128];
    vmem bb: bf16[8, 128];
    vmem ii: i32[8, 128];
    smem sm: i32[4];
    var c: i32 = 0;
    var flag: bool = false;
    sem s;
    BODY
}
host {
    input x: f32[8, 128];
    launch ka(x, 3);
}
"""


@pytest.mark.parametrize("body, message", [
    ("x = 0.0;", "HBM array 'x' can only be written by a DMA (copy)"),
    ("x[0:8, 0:128] = a;", "HBM array 'x' can only be written by a DMA (copy)"),
    ("let q = 3; q = 4;", "cannot assign to 'q': it is a compile-time constant (let binding)"),
    ("let q = c + 1; q = 4;", "cannot assign to 'q': it is a let binding"),
    ("let m = a * 2.0; m = a;", "cannot assign to the let-bound tile 'm'"),
    ("n = 4;", "cannot assign to 'n': it is a parameter"),
    ("for i in 0..2 { i = 1; }", "cannot assign to 'i': it is a loop variable"),
    ("C = 4;", "cannot assign to 'C': it is a compile-time constant (const)"),
    ("bb = a;", "dtype mismatch: storing f32 into bf16 buffer 'bb'; round explicitly with bf16(...)"),
    ("ii = a;", "dtype mismatch: storing f32 into i32 buffer 'ii'; convert explicitly with i32(...)"),
    ("a = ii;", "dtype mismatch: storing i32 into f32 buffer 'a'; convert explicitly with f32(...)"),
    ("a = a[0:2, :];", "shape mismatch: storing f32[2, 128] into [8, 128] view of 'a'"),
    ("a[:, 0:64] = a;", "shape mismatch: storing f32[8, 128] into [8, 64] view of 'a'"),
    ("bb += bf16(a);", "'+=' is not defined on bf16 buffers"),
    ("sm[0] = 1.5;", "expected an integer value for SMEM"),
    ("c = 1.5;", "expected an integer value"),
    ("c += a;", "expected an integer value"),
    ("flag += true;", "'+=' is not defined on bool variables"),
    ("s = 3;", "cannot assign to a semaphore"),
    ("sm = 1;", "SMEM buffer 'sm' holds scalars; index one element to store"),
    ("ii = ii / ii;", "integer tile division and remainder are not supported"),
    ("ii /= ii;", "integer tile division and remainder are not supported"),
    ("ii /= 2;", "integer tile division and remainder are not supported"),
])
def test_assignment_errors_name_the_line(body, message):
    assert_error(compile_error(ASSIGN_ERRORS.replace("BODY", body)), 11, message)
