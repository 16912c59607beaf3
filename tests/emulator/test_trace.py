"""The trace recorder: what it records, that reading back gives the same events,
that recording changes nothing about the run, and that the file is deterministic."""

from __future__ import annotations

import textwrap

import attrs
import numpy as np
import pytest

from mkemu.emulator.config import RunConfig
from mkemu.emulator.machine import Machine
from mkemu.emulator.topology import Mesh
from mkemu.emulator.trace import Recorder
from mkemu.errors import EmulatorFault
from mkemu.isa.asm import assemble
from mkemu.isa.hardware import load_profile
from mkemu.tools.trace_reader import parse_trace

# Two chips: each core copies a tile to the same core of the other chip, then
# signals it and waits for the other's signal; then a chip barrier; regions around it.
EXCHANGE = """
.buffer a f32 8x128 input
.kernel main
    .smem 0 4096 1 0 0 1 0 0
    rdsr s10, gcore
    rdsr s11, cores
    rdsr s12, chip
    li s13, 1
    sub s14, s13, s12
    mul s15, s14, s11
    rdsr s16, core
    add s15, s15, s16          ; the same core on the other chip
    li s1, @a
    li s3, 0
    li s4, 0
    li s5, 1
    mark.push 0, s12
    vli.f32 v1, 1.0
    vadd.f32 v2, v1, v1
    vmul.f32 v3, v2, v2
    dma.start.r vmem[s0]@s15, hbm[s1], s3, s4, s5
    li s6, 4096
    sem.wait s4, s6
    sem.wait s5, s6
    mark.pop
    li s7, 2
    li s8, 1
    sem.signal.r s7, s8, s15
    sem.wait s7, s8
    barrier chip
    halt
"""


def _run(source: str, trace: Recorder | None, mesh=(2, 1, 1), regions=("exchange",)):
    program = assemble(textwrap.dedent(source), "x.s")
    program = attrs.evolve(program, kernels={n: attrs.evolve(k, regions=regions)
                                             for n, k in program.kernels.items()})
    machine = Machine(load_profile("test"), Mesh(mesh), trace=trace)
    machine.load(program)
    return machine, machine.run()


def test_tracing_changes_nothing_about_the_run():
    _, plain = _run(EXCHANGE, None)
    _, traced = _run(EXCHANGE, Recorder())
    assert traced == plain


def test_round_trip_same_events():
    recorder = Recorder()
    machine, result = _run(EXCHANGE, recorder)
    written = recorder.columns()
    trace = parse_trace(recorder.to_bytes())
    for table, cols in written.items():
        for name, values in cols.items():
            np.testing.assert_array_equal(trace.tables[table][name], values, err_msg=f"{table}.{name}")
    assert trace.end_cycle == result.cycles
    assert trace.instr["core"].size == result.instructions
    # Per-pc unit, occupancy and latency come back through the kernel table.
    busy = {u: int(trace.instr["occupancy"][trace.instr["unit"] == i].sum()) for i, u in enumerate(trace.units)}
    for unit, cycles in result.unit_busy_cycles.items():
        assert busy[unit] == cycles
    stalls = {"unit": int(trace.instr["stall_unit"].sum()), "dependency": int(trace.instr["stall_dep"].sum())}
    assert stalls["unit"] == result.stall_cycles["unit"]
    assert stalls["dependency"] == result.stall_cycles["dependency"]
    w = trace.wait
    sem_wait = int((w["end"] - w["start"])[w["kind"] == 0].sum())
    barrier_wait = int((w["end"] - w["start"])[w["kind"] == 1].sum())
    assert sem_wait == result.stall_cycles["semaphore"]
    assert barrier_wait == result.stall_cycles["barrier"]


def test_dmas_links_signals_and_regions_are_recorded():
    recorder = Recorder()
    machine, result = _run(EXCHANGE, recorder)
    trace = parse_trace(recorder.to_bytes())
    d = trace.dma
    assert d["seq"].size == result.dma_count == 4
    assert (d["src_chip"] != d["dst_chip"]).all()
    assert (d["size_bytes"] == 4096).all()
    assert ((d["issued"] < d["begun"]) & (d["begun"] < d["done"])).all()
    # Each DMA crossed its engine and one link (HBM is a flow resource only where
    # the engines can outrun it, which the test profile's cannot).
    kinds = [[trace.resources[r]["kind"] for r in trace.dma_res["resource"][s:s + n]]
             for s, n in zip(d["res_start"], d["res_count"])]
    assert all({"engine", "link"} <= set(k) for k in kinds)
    link_bytes = sum(int(d["size_bytes"][i]) for i, k in enumerate(kinds) if "link" in k)
    assert link_bytes == result.link_bytes
    # Rate segments add up to each DMA's bytes.
    for i, seq in enumerate(d["seq"]):
        sel = np.flatnonzero(trace.rate["dma"] == seq)
        ends = np.append(trace.rate["cycle"][sel][1:], d["done"][i])
        moved = (trace.rate["bytes_per_cycle"][sel] * (ends - trace.rate["cycle"][sel])).sum()
        assert moved == pytest.approx(d["size_bytes"][i], rel=0.01)
    s = trace.signal
    assert s["src_core"].size == 4 and (s["arrival"] - s["issued"] == 50).all()   # one hop
    r = trace.region
    assert [trace.region_names[i] for i in r["name"]] == ["exchange"] * 4
    assert sorted(r["index"].tolist()) == [0, 0, 1, 1]
    assert len(trace.launches) == 1 and trace.launches[0]["end"] == result.cycles
    assert trace.kernel_of(0)["source"][0].startswith("x.s:")


def test_traces_of_the_same_run_are_byte_identical():
    a, b = Recorder(), Recorder()
    _run(EXCHANGE, a)
    _run(EXCHANGE, b)
    assert a.to_bytes() == b.to_bytes()


def test_unnamed_regions_and_regions_open_at_halt():
    src = """
    .kernel main
        li s1, 7
        mark.push 3, s1
        nop
        halt
    """
    recorder = Recorder()
    _run(src, recorder, mesh=(1, 1, 1), regions=())
    trace = parse_trace(recorder.to_bytes())
    assert trace.region_names == ["region3"]
    assert trace.region["index"].tolist() == [7, 7]
    assert (trace.region["end"] > trace.region["start"]).all()


# Many returns to Python (a signal to itself every 3 instructions) over more rows than
# half a core's trace buffer.
SIGNAL_LOOP = """
.kernel main
    li s1, 3
    li s2, {n}
    rdsr s5, gcore
loop:
    sem.signal.r s1, s0, s5
    addi s2, s2, -1
    bne s2, s0, loop
    halt
"""


def test_instruction_rows_are_kept_in_few_chunks_and_read_back_whole():
    from mkemu.emulator.core import TRACE_ROWS

    n = TRACE_ROWS // 3 * 2   # about 1.3 buffers of rows, each loop trip a return to Python
    recorder = Recorder()
    _, result = _run(SIGNAL_LOOP.format(n=n), recorder, mesh=(1, 1, 1), regions=())
    assert result.instructions > TRACE_ROWS
    for _, _, chunks in recorder.instr:
        rows = sum(len(c) for c in chunks)
        # at least half a buffer per chunk, but the last
        assert len(chunks) <= 1 + rows // (TRACE_ROWS // 2), [len(c) for c in chunks]
    trace = parse_trace(recorder.to_bytes())
    assert trace.instr["core"].size == result.instructions
    issue = trace.instr["issue"]
    for core in np.unique(trace.instr["core"]):
        assert (np.diff(issue[trace.instr["core"] == core]) >= 0).all()   # in issue order, none lost


@pytest.mark.parametrize("blocked, kind, what", [("sem.wait s1, s2", 0, 1), ("barrier chip", 1, 0)])
def test_a_wait_still_blocked_at_a_fault_is_a_row_closed_at_the_fault(blocked, kind, what):
    # Core 1 blocks (a semaphore nobody raises, or a barrier core 0 never reaches) while
    # core 0 faults later: its wait had no row, so its stall read 0.
    source = (".kernel main\n    rdsr s3, core\n    li s1, 1\n    li s2, 1\n    beq s3, s0, work\n"
              f"    {blocked}\n    halt\nwork:\n" + "    nop\n" * 20 + "    div s4, s2, s0\n    halt\n")
    trace = Recorder()
    machine = Machine(load_profile("test"), Mesh((1, 1, 1)), trace=trace)
    machine.load(assemble(source, "t.s"))
    with pytest.raises(Exception) as info:
        machine.run()
    trace.on_fault(info.value)
    waits = parse_trace(trace.to_bytes()).wait
    rows = list(zip(*(waits[field].tolist() for field in ("core", "kind", "sem", "start", "end"))))
    assert len(rows) == 1 and rows[0][:3] == (1, kind, what), rows
    assert rows[0][3] < rows[0][4] == info.value.cycle


def test_a_run_stopped_before_its_first_launch_began_has_a_trace_ending_at_the_fault():
    # The max-cycle guard passes during the launch's start-up (1,000 cycles on `test`).
    trace = Recorder()
    machine = Machine(load_profile("test"), Mesh((1, 1, 1)), RunConfig(max_cycles=100), trace=trace)
    machine.load(assemble(".kernel main\n    halt\n", "t.s"))
    with pytest.raises(EmulatorFault) as info:
        machine.run()
    trace.on_fault(info.value)
    read = parse_trace(trace.to_bytes())
    assert info.value.kind == "max-cycles" and info.value.cycle == 1000
    assert read.end_cycle == read.start_cycle == 1000 and read.meta["fault"]["cycle"] == 1000


@pytest.mark.parametrize("races", [True, False])
def test_a_fault_cuts_what_other_cores_ran_ahead_past_it(races):
    """Core 1 runs a long loop of regions without a global instruction while core 0
    faults early: core 1 had run ahead of the machine's clock (without race checks, to
    its end), and the trace kept those instructions and regions, past the fault."""
    source = (".kernel main\n    rdsr s3, core\n    li s1, 5000\n    beq s3, s0, work\nloop:\n"
              "    mark.push 1, s2\n    addi s2, s2, 1\n    mark.pop\n    blt s2, s1, loop\n    halt\nwork:\n"
              + "    nop\n" * 50 + "    mark.push 0, s0\n    div s4, s1, s0\n    halt\n")
    trace = Recorder()
    config = RunConfig(checks=frozenset() if not races else RunConfig().checks)
    machine = Machine(load_profile("test"), Mesh((1, 1, 1)), config, trace=trace)
    machine.load(attrs.evolve(assemble(source, "t.s"), kernels={"main": attrs.evolve(
        assemble(source, "t.s").kernels["main"], regions=("fault", "step"))}))
    with pytest.raises(EmulatorFault) as info:
        machine.run()
    trace.on_fault(info.value)
    read = parse_trace(trace.to_bytes())
    end = info.value.cycle
    assert read.end_cycle == end
    assert read.instr["issue"].max() <= end
    assert (read.instr["core"] == 1).sum() > 10       # (core 1 ran up to the fault)
    region = read.region
    assert region["start"].max() <= end and region["end"].max() == end      # (the open ones close at it)
    step = region["name"] == read.region_names.index("step")
    assert 0 < step.sum() < 100
