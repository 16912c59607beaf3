"""The collectives of programs/lib/collectives.mk and their examples.

Every collective bit-exact against the numpy model of its reduction order on 1D, 2D
and 3D meshes (2x2x2 and 4x2x2 included) and on a torus; all-to-all with uneven run-
time counts; determinism; a 64-chip all-reduce in seconds; the link timing model
(one transfer, two flows sharing a link) on `.s` programs; and the faults of a
collective gone wrong, each naming chips and cores.

Programs run through `mkemu run ... --json` where the runner's reference call has
all it needs; where the reference needs the mesh shape (all-reduce on a mesh the
runner's chip count does not pin down) they run on a `Machine` directly.
"""

from __future__ import annotations

import importlib.util
import json
import re
import time
from pathlib import Path

import attrs
import numpy as np
import pytest

from mkemu.cli import main
from mkemu.emulator.config import RunConfig
from mkemu.emulator.machine import Machine
from mkemu.emulator.topology import Mesh
from mkemu.errors import EmulatorFault
from mkemu.isa.asm import assemble
from mkemu.isa.hardware import load_profile
from mkemu.runner import from_storage, generate_inputs, to_storage

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "programs" / "examples"
LIBRARY = ROOT / "programs" / "lib" / "collectives.mk"
CORES = 2                    # cores per chip of every shipped profile

MESHES = {"1d": (4, 1, 1), "2d": (2, 2, 1), "3d": (2, 2, 2), "3d-16": (4, 2, 2)}


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"collectives_test_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


AR = _module("all_reduce_ref")
A2A = _module("all_to_all_ref")


@pytest.fixture(scope="module")
def compile_text():
    """The back end's compile_text."""
    from mkemu.dsl.compiler import compile_text

    return compile_text


def run_json(capsys, *argv: str) -> dict:
    code = main(["run", *argv, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def run_fault(capsys, *argv: str) -> str:
    assert main(["run", *argv]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return err


# ---------------------------------------------------------------- running programs


@attrs.frozen
class Ran:
    """A finished run: its result, inputs (`name@chip`) and outputs (`name` -> one per chip)."""

    result: object
    inputs: dict
    outputs: dict
    machine: Machine


def run_program(program, dims, *, hw="test", wrap=(False, False, False), seed=0) -> Ran:
    """Run on a `Machine` with the inputs `mkemu run` would generate for `seed`."""
    profile = load_profile(hw)
    mesh = Mesh(dims, wrap, profile.links_per_neighbor)
    machine = Machine(profile, mesh, RunConfig())
    machine.load(program)
    inputs = {}
    for chip in range(mesh.num_chips):
        for name, array in generate_inputs(program, seed + 7919 * chip).items():
            inputs[f"{name}@{chip}"] = array
            machine.write_buffer(chip, name, to_storage(array, program.buffer(name).dtype))
    result = machine.run()
    outputs = {b.name: [from_storage(machine.read_buffer(c, b.name), b.dtype) for c in range(mesh.num_chips)]
               for b in program.buffers if b.kind == "output"}
    return Ran(result, inputs, outputs, machine)


def same_bits(expected, actual) -> bool:
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.dtype.kind == "f":
        return expected.shape == actual.shape and np.array_equal(
            expected.astype(np.float32).view(np.uint32), actual.astype(np.float32).view(np.uint32))
    return np.array_equal(expected, actual)


RING_PROGRAM = """
import "{library}";
param OP = 0;          // 0 all_reduce, 1 all_reduce_level, 2 reduce_scatter, 3 all_reduce twice,
                       // 4 reduce_scatter_level, 5 all_gather_level
param LEVEL = 1;
param DIRS = 2;
param ROWS = 64;
param COLS = 128;
param NBLOCKS = 8;
const BLOCK = 8;

kernel ring(x: hbm f32[2, ROWS, COLS], out: hbm f32[2, ROWS, COLS]) {{
    vmem buf: f32[ROWS, COLS];
    sem s;
    start copy(x[core_id()], buf, s);
    wait copy(x[core_id()], buf, s);
    if OP == 0 {{
        all_reduce(buf, ROWS, COLS, BLOCK, DIRS, NBLOCKS);
    }} else if OP == 1 {{
        all_reduce_level(buf, ROWS, COLS, BLOCK, DIRS, LEVEL, NBLOCKS);
    }} else if OP == 2 {{
        reduce_scatter(buf, ROWS, COLS, BLOCK, DIRS, NBLOCKS);
    }} else if OP == 4 {{
        reduce_scatter_level(buf, ROWS, COLS, BLOCK, DIRS, LEVEL, NBLOCKS);
    }} else if OP == 5 {{
        all_gather_level(buf, ROWS, COLS, BLOCK, DIRS, LEVEL, NBLOCKS);
    }} else {{
        for round in 0..2 {{
            all_reduce(buf, ROWS, COLS, BLOCK, DIRS, NBLOCKS);
        }}
    }}
    start copy(buf, out[core_id()], s);
    wait copy(buf, out[core_id()], s);
}}

host {{
    input x: f32[2, ROWS, COLS];
    output out: f32[2, ROWS, COLS];
    launch ring(x, out);
}}
"""


def ring_program(compile_text, tmp_path, hw="test", **params):
    text = RING_PROGRAM.format(library=LIBRARY)
    return compile_text(text, str(tmp_path / "ring.mk"), load_profile(hw), params)


def participants_values(ran: Ran, chips: int, rows: int, cols: int) -> dict:
    return {(chip, core): np.asarray(ran.inputs[f"x@{chip}"][core], np.float32).reshape(rows // 8, 8, cols)
            for chip in range(chips) for core in range(CORES)}


def check_against(ran: Ran, expected: dict, chips: int, rows: int, cols: int, blocks=None) -> None:
    """`expected`: participant -> [blocks, 8, cols]; compare all of out, or only `blocks`
    (participant -> (lo, hi))."""
    for (chip, core), value in expected.items():
        actual = ran.outputs["out"][chip][core].reshape(rows // 8, 8, cols)
        lo, hi = blocks[(chip, core)] if blocks else (0, rows // 8)
        assert same_bits(value[lo:hi], actual[lo:hi]), f"chip {chip} core {core} blocks {lo}..{hi}"


# ---------------------------------------------------------------- examples through the CLI


@pytest.mark.parametrize("name", ["all_reduce", "all_gather", "all_to_all"])
def test_example_is_bit_exact_on_2x2x2_tpu_v7_like(capsys, compile_text, name):
    report = run_json(capsys, str(EXAMPLES / f"{name}.mk"), "--mesh", "2x2x2")
    assert report["bit_exact"] is True and report["chips"] == 8 and report["cores"] == 16


@pytest.mark.parametrize("mesh", ["1", "4", "2x2", "4x2x2"])
@pytest.mark.parametrize("name", ["all_gather", "all_to_all"])
def test_example_is_bit_exact_on_other_meshes(capsys, compile_text, name, mesh):
    report = run_json(capsys, str(EXAMPLES / f"{name}.mk"), "--mesh", mesh, "--hw", "test")
    assert report["bit_exact"] is True


@pytest.mark.parametrize("mesh", ["1", "4", "4x2x2"])
def test_all_reduce_example_on_meshes_its_reference_can_tell(capsys, compile_text, mesh):
    # `mkemu run` passes the reference the mesh shape (docs/api.md); the other meshes
    # are also checked on a Machine below.
    report = run_json(capsys, str(EXAMPLES / "all_reduce.mk"), "--mesh", mesh, "--hw", "test")
    assert report["bit_exact"] is True


def test_all_reduce_example_on_2x2_given_the_mesh(compile_text, tmp_path):
    program = compile_text((EXAMPLES / "all_reduce.mk").read_text(), str(EXAMPLES / "all_reduce.mk"),
                           load_profile("test"))
    ran = run_program(program, (2, 2, 1))
    expected = AR.reference(ran.inputs, chips=4, cores_per_chip=CORES, mesh=(2, 2, 1))
    for chip in range(4):
        assert same_bits(expected[f"out@{chip}"], ran.outputs["out"][chip]), chip


@pytest.mark.parametrize("argv", [["--set", "DIRS=1"], ["--set", "BLOCK=16", "--set", "ROWS=32"],
                                  ["--set", "CL_SLOTS=1"]])
def test_all_gather_example_options(capsys, compile_text, argv):
    report = run_json(capsys, str(EXAMPLES / "all_gather.mk"), "--mesh", "2x2x2", "--hw", "test", *argv)
    assert report["bit_exact"] is True


def test_the_examples_take_sizes_from_params(capsys, compile_text):
    for name, argv in [("all_reduce", ["--set", "ROWS=32", "--set", "COLS=384"]),
                       ("all_to_all", ["--set", "CAP=5", "--set", "COLS=256"])]:
        report = run_json(capsys, str(EXAMPLES / f"{name}.mk"), "--mesh", "2x2x2", "--hw", "test", *argv)
        assert report["bit_exact"] is True, name


# ---------------------------------------------------------------- ring collectives, every mesh


@pytest.mark.parametrize("dirs", [1, 2])
@pytest.mark.parametrize("mesh", list(MESHES))
def test_all_reduce_composed_is_bit_exact(compile_text, tmp_path, mesh, dirs):
    dims = MESHES[mesh]
    chips = dims[0] * dims[1] * dims[2]
    ran = run_program(ring_program(compile_text, tmp_path, DIRS=dirs), dims)
    expected = AR.all_reduce(participants_values(ran, chips, 64, 128), dims, CORES, 8, dirs)
    check_against(ran, expected, chips, 64, 128)


@pytest.mark.parametrize("slots", [1, 3, 4])
def test_all_reduce_with_other_slot_counts(compile_text, tmp_path, slots):
    # (3 and 4 slots in both directions need more than the test profile's 16 semaphores.)
    dims, hw = (4, 2, 1), "tpu-v7-like"
    ran = run_program(ring_program(compile_text, tmp_path, hw, CL_SLOTS=slots, ROWS=128, NBLOCKS=16), dims, hw=hw)
    expected = AR.all_reduce(participants_values(ran, 8, 128, 128), dims, CORES, 16, 2)
    check_against(ran, expected, 8, 128, 128)


def test_all_reduce_on_odd_ring_sizes_with_uneven_chunks(compile_text, tmp_path):
    # 3x2x1 chips, 12 participants, 7 blocks: chunks of 2 and 3 blocks, some halves empty.
    dims = (3, 2, 1)
    ran = run_program(ring_program(compile_text, tmp_path, NBLOCKS=7), dims)
    expected = AR.all_reduce(participants_values(ran, 6, 64, 128), dims, CORES, 7, 2)
    check_against(ran, expected, 6, 64, 128)
    # blocks from NBLOCKS on are left as they were
    assert same_bits(ran.inputs["x@4"][1][56:], ran.outputs["out"][4][1][56:])


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_all_reduce_over_one_level(compile_text, tmp_path, level):
    dims = (4, 2, 2)
    ran = run_program(ring_program(compile_text, tmp_path, OP=1, LEVEL=level), dims)
    expected = AR.all_reduce(participants_values(ran, 16, 64, 128), dims, CORES, 8, 2, levels=(level,))
    check_against(ran, expected, 16, 64, 128)


@pytest.mark.parametrize("dirs", [1, 2])
def test_all_reduce_on_a_torus(compile_text, tmp_path, dirs):
    dims = (4, 4, 1)
    ran = run_program(ring_program(compile_text, tmp_path, DIRS=dirs), dims, wrap=(True, True, False))
    expected = AR.all_reduce(participants_values(ran, 16, 64, 128), dims, CORES, 8, dirs)
    check_against(ran, expected, 16, 64, 128)


@pytest.mark.parametrize("mesh", list(MESHES))
@pytest.mark.parametrize("dirs", [1, 2])
def test_reduce_scatter_leaves_each_participant_its_sum(compile_text, tmp_path, mesh, dirs):
    dims = MESHES[mesh]
    chips = dims[0] * dims[1] * dims[2]
    nblocks = 2 * chips * CORES               # two blocks each (one per direction)
    rows = 8 * nblocks
    ran = run_program(ring_program(compile_text, tmp_path, OP=2, DIRS=dirs, ROWS=rows, NBLOCKS=nblocks), dims)
    values = participants_values(ran, chips, rows, 128)
    owned = AR.reduce_scatter(values, dims, CORES, nblocks, dirs)
    # participant p = core * chips + chip owns the p-th equal part
    for (chip, core), (lo, hi) in owned.items():
        p = core * chips + chip
        assert (lo, hi) == (p * nblocks // (chips * CORES), (p + 1) * nblocks // (chips * CORES))
    check_against(ran, values, chips, rows, 128, blocks=owned)


@pytest.mark.parametrize("level", [0, 1, 3])
def test_reduce_scatter_over_one_level(compile_text, tmp_path, level):
    dims = (4, 1, 2)
    ran = run_program(ring_program(compile_text, tmp_path, OP=4, LEVEL=level, NBLOCKS=7), dims)
    values = participants_values(ran, 8, 64, 128)
    owned = AR.reduce_scatter(values, dims, CORES, 7, 2, levels=(level,))
    check_against(ran, values, 8, 64, 128, blocks=owned)


@pytest.mark.parametrize("dirs", [1, 2])
@pytest.mark.parametrize("level", [0, 1, 3])
def test_all_gather_over_one_level(compile_text, tmp_path, level, dirs):
    dims = (4, 1, 2)
    ran = run_program(ring_program(compile_text, tmp_path, OP=5, LEVEL=level, DIRS=dirs, NBLOCKS=7), dims)
    values = participants_values(ran, 8, 64, 128)
    expected = {}
    for ring in AR.rings(dims, CORES, level):
        for p in ring:
            out = values[p].copy()
            for rank, owner in enumerate(ring):
                lo, hi = AR.chunk(0, 7, len(ring), rank)
                out[lo:hi] = values[owner][lo:hi]
            expected[p] = out
    check_against(ran, expected, 8, 64, 128)


def test_all_reduce_twice_in_a_loop(compile_text, tmp_path):
    dims = (2, 2, 2)
    ran = run_program(ring_program(compile_text, tmp_path, OP=3), dims)
    once = AR.all_reduce(participants_values(ran, 8, 64, 128), dims, CORES, 8, 2)
    twice = AR.all_reduce(once, dims, CORES, 8, 2)
    check_against(ran, twice, 8, 64, 128)


@pytest.mark.parametrize("mesh", list(MESHES))
@pytest.mark.parametrize("dirs", [1, 2])
def test_all_gather_is_bit_exact(capsys, compile_text, mesh, dirs):
    text = "x".join(map(str, MESHES[mesh]))
    report = run_json(capsys, str(EXAMPLES / "all_gather.mk"), "--mesh", text, "--hw", "test",
                      "--set", f"DIRS={dirs}")
    assert report["bit_exact"] is True


def test_the_reference_needs_the_mesh_shape():
    # The same 8 inputs summed on 2x2x2 and on 8x1x1 differ in the last bits: the
    # reduction order follows the mesh, so a reference must know it.
    rng = np.random.default_rng(1)
    values = {(chip, core): rng.standard_normal((8, 8, 128)).astype(np.float32)
              for chip in range(8) for core in range(CORES)}
    cube = AR.all_reduce(values, (2, 2, 2), CORES, 8, 2)[(0, 0)]
    line = AR.all_reduce(values, (8, 1, 1), CORES, 8, 2)[(0, 0)]
    assert not same_bits(cube, line)
    assert np.allclose(cube, line, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- all-to-all


def test_all_to_all_with_uneven_counts(capsys, compile_text, tmp_path):
    # 2x2x2: 16 participants; counts 0, CAP and everything between, different per pair.
    chips, cap, cols, max_parts = 8, 8, 128, 32
    rng = np.random.default_rng(7)
    arrays = {}
    for chip in range(chips):
        arrays[f"x@{chip}"] = rng.standard_normal((CORES, max_parts * cap, cols)).astype(np.float32)
        counts = rng.integers(0, cap + 1, size=(CORES, max_parts), dtype=np.int32)
        counts[0, :4] = [0, cap, 1, cap - 1]
        counts[1, 5] = -3                          # the program takes it mod CAP + 1: 6
        arrays[f"counts@{chip}"] = counts
    np.savez(tmp_path / "in.npz", **arrays)
    report = run_json(capsys, str(EXAMPLES / "all_to_all.mk"), "--mesh", "2x2x2", "--hw", "test",
                      "--inputs", str(tmp_path / "in.npz"))
    assert report["bit_exact"] is True
    sent = A2A.reference(arrays, chips=chips, cores_per_chip=CORES)
    per_pair = np.concatenate([sent[f"rcounts@{c}"][:, :16].ravel() for c in range(chips)])
    assert {0, cap}.issubset(set(per_pair.tolist())) and len(set(per_pair.tolist())) > 4


def test_all_to_all_counts_of_zero_everywhere(capsys, compile_text, tmp_path):
    x = np.random.default_rng(3).standard_normal((CORES, 32 * 8, 128)).astype(np.float32)
    arrays = {"x": x, "counts": np.zeros((CORES, 32), np.int32)}
    np.savez(tmp_path / "zero.npz", **arrays)
    report = run_json(capsys, str(EXAMPLES / "all_to_all.mk"), "--mesh", "2x2", "--hw", "test",
                      "--inputs", str(tmp_path / "zero.npz"))
    assert report["bit_exact"] is True


# ---------------------------------------------------------------- determinism and scale


def test_runs_are_deterministic(capsys, compile_text):
    reports = [run_json(capsys, str(EXAMPLES / name), "--mesh", "2x2x2", "--hw", "test")
               for name in ("all_to_all.mk", "all_to_all.mk", "all_reduce.mk", "all_reduce.mk")]
    for a, b in (reports[:2], reports[2:]):
        for key in ("cycles", "instructions", "dma_count", "link_bytes", "per_core", "stall_cycles"):
            assert a[key] == b[key], key


def test_a_64_chip_all_reduce_completes_in_seconds(capsys, compile_text):
    t0 = time.perf_counter()
    report = run_json(capsys, str(EXAMPLES / "all_reduce.mk"), "--mesh", "4x4x4", "--hw", "test",
                      "--set", "ROWS=32", "--set", "COLS=128")
    wall = time.perf_counter() - t0
    assert report["bit_exact"] is True and report["chips"] == 64 and report["cores"] == 128
    assert wall < 30, f"64-chip all-reduce took {wall:.1f} s"


def test_a_torus_ring_beats_a_line(compile_text, tmp_path):
    # One X ring of 4 chips: on a line the wrap-around edge crosses every link back.
    program = ring_program(compile_text, tmp_path, OP=1, LEVEL=1, DIRS=1, ROWS=256, NBLOCKS=32)
    line = run_program(program, (4, 1, 1)).result.cycles
    ring = run_program(program, (4, 1, 1), wrap=(True, False, False)).result.cycles
    assert ring < line


# ---------------------------------------------------------------- link timing (.s programs)

# The `test` profile: DMA start 10 cycles, 50 cycles per hop, links 8 bytes/cycle per
# direction, DMA engines 32 bytes/cycle, kernels start at cycle 1000.
LAUNCH, START, HOP, LINK_BW = 1000, 10, 50, 8

PUSH = """
.kernel main
    .smem 0 {size} 1 0 0 1 0 0
    rdsr s1, gcore
{senders}
    jmp wait_recv
send:
    li s4, 0
    li s9, 65536
    li s5, 0
    li s6, 0
    li s7, 1
    dma.start.r vmem[s9]@s3, vmem[s4], s5, s6, s7
    li s8, {size}
    sem.wait s6, s8
wait_recv:
{receivers}
    halt
recv:
    li s7, 1
    li s8, {size}
    sem.wait s7, s8
    halt
"""


def push_program(flows: list[tuple[int, int]], size: int):
    """Each (source, target) global core pushes `size` bytes of VMEM to the target."""
    senders = "".join(f"    li s2, {src}\n    li s3, {dst}\n    beq s1, s2, send\n" for src, dst in flows)
    receivers = "".join(f"    li s2, {dst}\n    beq s1, s2, recv\n" for _, dst in flows)
    return assemble(PUSH.format(size=size, senders=senders, receivers=receivers), "push.s")


def sender_done(flows, size, dims) -> list[int]:
    ran = run_program(push_program(flows, size), dims)
    return [ran.machine.cores[src].end_time - LAUNCH for src, _ in flows]


def issue_cycle(i: int) -> int:
    """The kernel cycle at which flow i's DMA issues: rdsr, three compare instructions
    per flow up to i, five li, one instruction a cycle."""
    return 10 + 3 * i


# A sender halts the cycle after its wait returns: done = issue + time + 1.
def transfer_cycles(done: int, i: int = 0) -> int:
    return done - issue_cycle(i) - 1


@pytest.mark.parametrize("hops", [1, 2, 3])
@pytest.mark.parametrize("size", [4096, 65536])
def test_a_transfer_takes_hops_times_latency_plus_bytes_over_bandwidth(hops, size):
    done = sender_done([(0, 2 * hops)], size, (4, 1, 1))[0]
    assert transfer_cycles(done) == START + hops * HOP + size / LINK_BW


def test_a_transfer_over_the_y_and_z_axes_counts_every_hop():
    # chip 0 -> chip 7 on 2x2x2 goes X, then Y, then Z: three hops
    done = sender_done([(0, 14)], 8192, (2, 2, 2))[0]
    assert transfer_cycles(done) == START + 3 * HOP + 8192 / LINK_BW


def test_two_flows_on_one_link_each_get_half_the_bandwidth():
    # Both cores of chip 0 push to chip 1 over the one link 0 -> 1; the second flow
    # starts 3 cycles after the first, then both move at LINK_BW / 2.
    size = 32768
    both = sender_done([(0, 2), (1, 3)], size, (2, 1, 1))
    for i, done in enumerate(both):
        assert transfer_cycles(done, i) == pytest.approx(START + HOP + 2 * size / LINK_BW, abs=3), i


def test_flows_in_opposite_directions_do_not_share():
    # Chip 0 core 0 and chip 1 core 0 push to each other at full speed; each then waits
    # for the other's bytes too, so both end soon after the later flow (issued 3
    # cycles after the first) lands.
    size = 32768
    both = sender_done([(0, 2), (2, 0)], size, (2, 1, 1))
    landed = issue_cycle(1) + START + HOP + size / LINK_BW
    for done in both:
        assert landed < done <= landed + 5, (done, landed)


# ---------------------------------------------------------------- faults


FAULT_PROGRAM = """
import "{library}";

kernel bad(x: hbm f32[8, 128], out: hbm f32[8, 128]) {{
    vmem buf: f32[8, 128];
    vmem inbox: f32[8, 128];
    sem s;
    sem sent;
    sem arrived;
    sem token;
    start copy(x, buf, s);
    wait copy(x, buf, s);
{body}
    start copy(buf, out, s);
    wait copy(buf, out, s);
}}

host {{
    input x: f32[8, 128];
    output out: f32[8, 128];
    launch bad(x, out);
}}
"""


def fault_file(tmp_path, body: str) -> str:
    path = tmp_path / "bad.mk"
    path.write_text(FAULT_PROGRAM.format(library=LIBRARY, body=body))
    return str(path)


# Every chip pushes to chip + 1, forgetting that the last chip has no successor.
BAD_TARGET = """
    let h = copy(buf, inbox @ global_core(chip_id() + 1, core_id()), sent, arrived);
    start h;
    wait h;
    if chip_id() > 0 {
        wait recv h;
    }"""


def test_remote_dma_to_a_chip_outside_the_mesh(capsys, compile_text, tmp_path):
    err = run_fault(capsys, fault_file(tmp_path, BAD_TARGET), "--mesh", "2x2x2", "--hw", "test")
    assert "fault [bad-target] at chip 7, core 0" in err
    assert "target core 16 is outside the mesh (16 cores: 8 chips of 2 cores)" in err
    assert "instruction: dma.start.r" in err and "bad.mk:" in err


def test_a_barrier_one_chip_never_reaches(capsys, compile_text, tmp_path):
    body = """
    if chip_id() != 3 {
        barrier();
    }"""
    err = run_fault(capsys, fault_file(tmp_path, body), "--mesh", "2x2x2", "--hw", "test")
    # The fault points at the barrier (where chip 0 waits) and names the chip that skipped it.
    assert "fault [barrier-not-reached] at chip 0, core 0" in err and "instruction: barrier all" in err
    assert "chip 3 core 0 halted at cycle" in err and "without reaching this all barrier" in err
    for chip in (0, 1, 2, 4, 5, 6, 7):
        assert f"chip {chip} core 0" in err and f"chip {chip} core 1" in err


def test_a_cross_chip_deadlock_lists_every_waiter(capsys, compile_text, tmp_path):
    # Each core waits for its left neighbour's token before passing one right: nobody starts.
    body = """
    wait(token, 1);
    signal(token @ peer(0, 1), 1);"""
    err = run_fault(capsys, fault_file(tmp_path, body), "--mesh", "4x2x1", "--hw", "test")
    assert "fault [deadlock]" in err and "16 core(s) wait forever" in err
    for chip in range(8):
        for core in range(CORES):
            assert re.search(rf"chip {chip} core {core} pc 0x[0-9a-f]+ `sem.wait[^`]*` waits for semaphore "
                             rf"\d+ to reach 1 \(it is 0\)", err), (chip, core)
    assert "wait(token, 1);" in err


MISMATCH_PROGRAM = """
import "{library}";

kernel mismatched(x: hbm f32[2, 64, 128], n: hbm i32[1], out: hbm f32[2, 64, 128]) {{
    vmem buf: f32[64, 128];
    smem blocks: i32[1];
    sem s;
    start copy(x[core_id()], buf, s);
    start copy(n, blocks, s);
    wait copy(x[core_id()], buf, s);
    wait copy(n, blocks, s);
    all_reduce(buf, 64, 128, 8, 2, blocks[0]);      // blocks[0] comes from each chip's input
    start copy(buf, out[core_id()], s);
    wait copy(buf, out[core_id()], s);
}}

host {{
    input x: f32[2, 64, 128];
    input n: i32[1];
    output out: f32[2, 64, 128];
    launch mismatched(x, n, out);
}}
"""


@pytest.mark.parametrize("odd_chip, odd_size", [(3, 6), (5, 8), (0, 2)])
def test_a_mismatched_collective_names_chips_and_cores(capsys, compile_text, tmp_path, odd_chip, odd_size):
    path = tmp_path / "mismatched.mk"
    path.write_text(MISMATCH_PROGRAM.format(library=LIBRARY))
    sizes = {f"n@{chip}": np.array([odd_size if chip == odd_chip else 4], np.int32) for chip in range(8)}
    np.savez(tmp_path / "n.npz", **sizes)
    err = run_fault(capsys, str(path), "--mesh", "2x2x2", "--hw", "test", "--inputs", str(tmp_path / "n.npz"))
    assert "fault [deadlock]" in err or "fault [semaphore-nonzero]" in err
    named = set(re.findall(r"chip (\d+),? core (\d+)", err))
    assert named, err
    if "deadlock" in err:
        assert len(re.findall(r"^  chip \d+ core \d+ pc ", err, re.M)) >= 2
        assert "collectives.mk:" in err


def test_a_block_count_out_of_range_stops_at_the_librarys_check(capsys, compile_text, tmp_path):
    path = tmp_path / "mismatched.mk"
    path.write_text(MISMATCH_PROGRAM.format(library=LIBRARY))
    sizes = {f"n@{chip}": np.array([16 if chip == 2 else 4], np.int32) for chip in range(8)}
    np.savez(tmp_path / "n.npz", **sizes)
    err = run_fault(capsys, str(path), "--mesh", "2x2x2", "--hw", "test", "--inputs", str(tmp_path / "n.npz"))
    assert "fault [deadlock]" in err
    for core in range(CORES):
        assert re.search(rf"chip 2 core {core} pc .*stuck here\? nblocks is outside 0 \.\. rows / br", err), core


def test_a_mesh_too_big_for_the_program_stops_at_its_check(capsys, compile_text):
    # all_gather.mk has room for 32 participants; 4x4x2 has 64.
    err = run_fault(capsys, str(EXAMPLES / "all_gather.mk"), "--mesh", "4x4x2", "--hw", "test")
    assert "fault [deadlock]" in err and "64 core(s) wait forever" in err
    assert "stuck here? this machine's cores per chip or participants do not fit the program" in err


def test_the_library_checks_its_arguments_at_compile_time(compile_text, tmp_path):
    from mkemu.errors import SourceError

    text = RING_PROGRAM.format(library=LIBRARY)
    with pytest.raises(SourceError) as info:
        compile_text(text, str(tmp_path / "ring.mk"), load_profile("test"), {"DIRS": 3})
    assert "dirs is 1 (rings) or 2 (bidirectional rings)" in str(info.value)


def test_emulator_fault_type_is_what_the_cli_prints(compile_text, tmp_path):
    text = FAULT_PROGRAM.format(library=LIBRARY, body="    wait(token, 1);\n    signal(token @ peer(0, 1), 1);")
    program = compile_text(text, str(tmp_path / "bad.mk"), load_profile("test"))
    with pytest.raises(EmulatorFault) as info:
        run_program(program, (2, 1, 1))
    assert info.value.kind == "deadlock" and len(info.value.details) == 4
