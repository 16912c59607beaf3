"""docs/architecture.md's timing rules and docs/safety.md's race rules that the other
emulator tests leave out, each checked on the `test` profile (1 GHz: DMA start latency
10, engine 32 B/cycle, core-to-core path 16 B/cycle after `sibling_latency` 100, an
on-chip signal 40, links 8 B/cycle after `hop_latency` 50 a hop, launch 1000) against
cycles worked out by hand, or against the doc's formula re-implemented here on random
meshes (lines and rings of every size the emulator takes in a few milliseconds).
"""

from __future__ import annotations

import random
import textwrap

import numpy as np
import pytest

import mkemu
from mkemu.emulator.config import RunConfig
from mkemu.emulator.machine import Machine
from mkemu.emulator.topology import Mesh
from mkemu.errors import EmulatorFault
from mkemu.isa.asm import assemble
from mkemu.isa.hardware import load_profile

LAUNCH, START, HOP, SIGNAL, SIBLING_DMA = 1000, 10, 50, 40, 100


def _machine(source: str, dims=(1, 1, 1), wrap=(False, False, False), **config) -> Machine:
    machine = Machine(load_profile("test"), Mesh(dims, wrap), RunConfig(**config))
    machine.load(assemble(textwrap.dedent(source), "audit73.s"))
    machine.run()
    return machine


def _run(source: str, mesh: str = "1", **options):
    kernel = mkemu.compile_source(textwrap.dedent(source), "audit73.s", hw="test", mesh=mesh, trace=True,
                                  **options)
    return kernel


def _dmas(run) -> list[tuple[int, int, int]]:
    d = run.report.trace.dma
    return [(d["issued"][i].item(), d["begun"][i].item(), d["done"][i].item()) for i in range(len(d["seq"]))]


def _random_meshes(seed: int, count: int):
    rng = random.Random(seed)
    for _ in range(count):
        while True:
            dims = tuple(rng.choice((1, 2, 3, 4)) for _ in range(3))
            if dims[0] * dims[1] * dims[2] <= 8:
                break
        yield rng, dims, tuple(rng.random() < 0.5 for _ in range(3))


def _latency(mesh: Mesh, a, b, on_chip: int) -> int:
    """The doc's path latency: hops of the shortest way (round a ring) x hop_latency,
    `on_chip` to the other core of the chip, nothing to the core itself."""
    if a.chip != b.chip:
        ca, cb = mesh.coords(a.chip), mesh.coords(b.chip)
        hops = 0
        for n, ring, p, q in zip(mesh.dims, mesh.wrap, ca, cb):
            hops += min(abs(p - q), n - abs(p - q)) if ring else abs(p - q)
        return hops * HOP
    return 0 if a.index == b.index else on_chip


# ---------------------------------------------------------------- barriers


def _barrier_program(last: str, k: int) -> str:
    # Every core counts down a loop of its own length, then issues `last` and halts.
    return f"""
    .kernel main
      rdsr s1, gcore
      muli s2, s1, {k}
      remi s2, s2, 13
      addi s2, s2, 1
    loop:
      addi s2, s2, -1
      bne s2, s0, loop
      {last}
      halt
    """


def test_every_member_leaves_a_barrier_when_the_doc_formula_says_on_random_meshes():
    # A member leaves at max_i(arrival_i + latency(i, root)) + latency(root, member), the
    # root the member whose farthest member is nearest (lowest id on a tie); its next
    # instruction issues then, or the cycle after its own barrier when that is later (a
    # root arriving last cannot issue twice in one cycle).
    scopes = ("chip", "all", "x", "y", "z")
    for rng, dims, wrap in _random_meshes(73, 40):
        scope, k = rng.choice(scopes), rng.randrange(1, 50)
        # The same kernel with a nop for the barrier: each core's arrival cycle.
        arrival = [c.end_time - 1 for c in _machine(_barrier_program("nop", k), dims, wrap).cores]
        machine = _machine(_barrier_program(f"barrier {scope}", k), dims, wrap)
        mesh, cores = machine.mesh, machine.cores
        for core in cores:
            here = mesh.coords(core.chip)
            if scope == "chip":
                members = [c for c in cores if c.chip == core.chip]
            elif scope == "all":
                members = cores
            else:
                axis = "xyz".index(scope)
                members = [c for c in cores if c.index == core.index and all(
                    a == axis or mesh.coords(c.chip)[a] == here[a] for a in range(3))]
            root = min(members, key=lambda r: (max(_latency(mesh, m, r, SIGNAL) for m in members), r.gid))
            all_in = max(arrival[m.gid] + _latency(mesh, m, root, SIGNAL) for m in members)
            expected = max(all_in + _latency(mesh, root, core, SIGNAL), arrival[core.gid] + 1)
            assert core.end_time == expected, (dims, wrap, scope, core.gid)


def test_a_root_arriving_last_issues_its_next_instruction_the_cycle_after_its_barrier():
    # Core 0 (the root of `barrier chip`) arrives at 102, core 1 at 2: its arrival
    # reaches the root at 42. The root leaves at 102, issuing its halt at 103; core 1
    # leaves at 102 + 40.
    machine = _machine("""
    .kernel main
      rdsr s1, core
      bne s1, s0, go
    """ + "  nop\n" * 100 + """
    go:
      barrier chip
      halt
    """)
    assert [c.end_time - LAUNCH for c in machine.cores] == [103, 142]


# ---------------------------------------------------------------- path latencies


def test_a_dma_begins_start_latency_plus_its_path_latency_after_its_issue_on_random_meshes():
    # One 8-byte push from a random core to a random core: it begins after the start
    # latency plus hops x hop_latency (another chip), sibling_latency (the other core of
    # the chip) or nothing (itself), moves in one cycle and raises the target's rsem.
    for rng, dims, wrap in _random_meshes(7, 30):
        n = dims[0] * dims[1] * dims[2] * 2
        src, dst = rng.randrange(n), rng.randrange(n)
        machine = _machine(f"""
        .buffer b f32 64 input
        .kernel main
          .smem 0 8 1 0 0 1 0 0
          rdsr s1, gcore
          li s2, {src}
          li s3, {dst}
          li s4, 8
          li s5, 1
          bne s1, s2, recv
          li s6, @b
          dma.start.r vmem[s0]@s3, hbm[s6], s0, s0, s5
          sem.wait s0, s4
        recv:
          bne s1, s3, done
          sem.wait s5, s4
        done:
          halt
        """, dims, wrap)
        cores = machine.cores
        # rdsr, four li, bne, li: the dma.start issues at cycle 7; 8 bytes move in one
        # cycle on every path (link 8, core-to-core 16, engine 32 B/cycle).
        landed = LAUNCH + 7 + START + _latency(machine.mesh, cores[src], cores[dst], SIBLING_DMA) + 1
        if src != dst:
            # the receiver's wait lets its halt issue at the landing; the sender's
            # wait the `bne` to its halt
            assert (cores[dst].end_time, cores[src].end_time) == (landed, landed + 1), (dims, wrap, src, dst)
        else:
            assert cores[src].end_time == landed + 2, (dims, wrap, src)


def test_a_signal_to_the_issuing_core_by_its_global_id_counts_at_its_issue():
    # sem.signal.r to its own global id has no path: the wait the next cycle finds it.
    machine = _machine("""
    .kernel main
      rdsr s1, gcore
      li s2, 1
      sem.signal.r s2, s2, s1
      sem.wait s2, s2
      halt
    """)
    assert [c.end_time - LAUNCH for c in machine.cores] == [4, 4]


# ---------------------------------------------------------------- bandwidth sharing

PUSH_AND_COPY = """
.buffer src f32 65536 input
.kernel main
  .smem 0 800 1 0 0 1 0 0
  .smem 32 2400 1 0 0 1 0 0
  rdsr s9, gcore
  li s5, 1
  li s4, 2
  beq s9, s4, recv
  bne s9, s0, done
  li s1, @src
  li s3, 32
  dma.start.r vmem[s0]@s4, hbm[s1], s0, s0, s5
  dma.start vmem[s0], hbm[s1], s3, s5
  li s6, 800
  sem.wait s0, s6
  li s6, 2400
  sem.wait s5, s6
  halt
recv:
  li s6, 800
  sem.wait s5, s6
done:
  halt
"""


def test_a_link_bound_push_leaves_the_rest_of_its_engine_to_a_local_copy():
    # Max-min fair: the push to chip 1 (issued 1007, begins 1007 + 10 + 50) is held to
    # the link's 8 B/cycle, so the local copy keeps 32 - 8 = 24 of the engine: alone
    # from 1018 to 1067 (49 x 32 = 1568 bytes), then 832 / 24 = 34.67 cycles -> lands
    # 1102; the push moves 800 / 8 = 100 cycles -> 1167.
    run = _run(PUSH_AND_COPY, mesh="2x1x1")()
    assert _dmas(run) == [(1007, 1067, 1167), (1008, 1018, 1102)]


def test_a_fifo_engine_holds_a_ready_copy_behind_a_push_still_in_its_start_latency():
    # One descriptor at a time, counting its start latency: the local copy (ready at
    # 1018) begins only when the push ends at 1167, then moves 2400 / 32 = 75 cycles.
    run = _run(PUSH_AND_COPY, mesh="2x1x1", dma_order="fifo")()
    assert _dmas(run) == [(1007, 1067, 1167), (1008, 1167, 1242)]


def test_forwarded_traffic_shares_every_link_it_crosses():
    # A line of 3 chips: chip 0 and chip 1 push 800 bytes each into chip 2 at 1009. Chip
    # 1's (one hop) begins at 1069 and has link 1->2 alone for 50 cycles (400 bytes);
    # chip 0's (two hops) begins at 1119 and crosses 1->2 too: 4 B/cycle each, so chip
    # 1's last 400 take 100 cycles (1219), then chip 0's last 400 move at 8 (1269).
    run = _run("""
    .buffer src f32 65536 input
    .kernel main
      .smem 0 800 1 0 0 1 0 0
      rdsr s9, core
      bne s9, s0, done
      rdsr s8, chip
      li s7, 2
      beq s8, s7, recv
      li s1, @src
      li s4, 4
      li s5, 1
      shli s3, s8, 10
      dma.start.r vmem[s3]@s4, hbm[s1], s0, s0, s5
      li s6, 800
      sem.wait s0, s6
      halt
    recv:
      li s6, 1600
      li s5, 1
      sem.wait s5, s6
    done:
      halt
    """, mesh="3x1x1")()
    assert _dmas(run) == [(1009, 1119, 1269), (1009, 1069, 1219)]


def test_the_two_directions_of_a_link_are_separate_resources():
    # Chips 0 and 1 push 800 bytes to each other at once: each at the full 8 B/cycle.
    run = _run("""
    .buffer src f32 65536 input
    .kernel main
      .smem 0 800 1 0 0 1 0 0
      rdsr s9, core
      bne s9, s0, done
      rdsr s8, chip
      li s4, 2
      beq s8, s0, go
      li s4, 0
    go:
      li s1, @src
      li s5, 1
      dma.start.r vmem[s0]@s4, hbm[s1], s0, s0, s5
      li s6, 800
      sem.wait s0, s6
      sem.wait s5, s6
    done:
      halt
    """, mesh="2x1x1")()
    assert [done - begun for _, begun, done in _dmas(run)] == [100, 100]


# ---------------------------------------------------------------- schedules

ONE_COPY = """
.buffer src f32 65536 input
.kernel main
  .smem 0 320 1 0 0 1 0 0
  rdsr s9, gcore
  bne s9, s0, done
  li s1, @src
  dma.start vmem[s0], hbm[s1], s0, s0
  li s6, 320
  sem.wait s0, s6
done:
  halt
"""


def test_shuffle_delays_a_landing_by_0_to_twice_the_start_latency():
    def landing(**options) -> int:
        [(issued, begun, done)] = _dmas(_run(ONE_COPY, **options)())
        assert (issued, begun) == (1003, 1013)
        return done

    assert landing() == 1023                        # 320 bytes at 32 B/cycle
    shuffled = [landing(schedule="shuffle", schedule_seed=k) for k in range(1, 30)]
    assert {t - 1023 for t in shuffled} <= set(range(2 * START + 1)) and len(set(shuffled)) > 8
    # The run's seed takes part in the draw too.
    assert any(landing(schedule="shuffle", schedule_seed=1, seed=s) != shuffled[0] for s in range(1, 6))
    # late: the wait that needs it comes before anything else could happen.
    assert landing(schedule="late") == 1023


OVERWRITTEN_SOURCE = """
.buffer x f32 2048 input
.buffer y f32 2048 output
.kernel main
  .smem 0 8192 1 0 0 1 0 0
  .smem 32 64 1 0 0 1 0 0
  rdsr s9, gcore
  bne s9, s0, done
  li s1, @x
  li s2, @y
  li s3, 32
  li s4, 65536
  li s5, 1
  dma.start vmem[s0], hbm[s1], s0, s0
  dma.start hbm[s1], vmem[s4], s3, s5
  li s6, 64
  sem.wait s5, s6
  li s6, 8192
  sem.wait s0, s6
  dma.start hbm[s2], vmem[s0], s0, s0
  sem.wait s0, s6
done:
  halt
"""


@pytest.mark.parametrize("schedule", [("normal", 0), ("late", 0), ("shuffle", 1), ("shuffle", 2)])
def test_an_hbm_source_is_the_bytes_at_issue_even_when_a_later_dma_overwrites_them_first(schedule):
    # The 8192-byte read of x lands after a 64-byte copy of zeros into x[0:16] issued
    # after it: it still delivers x as it was at its issue (a race, so checked with races
    # off; with them on it is reported).
    x = np.arange(2048, dtype=np.float32) + 1
    kernel = _run(OVERWRITTEN_SOURCE, checks=("semaphores",), schedule=schedule[0], schedule_seed=schedule[1])
    assert np.array_equal(kernel(x=x).output("y"), x)
    with pytest.raises(EmulatorFault) as info:
        _run(OVERWRITTEN_SOURCE, schedule=schedule[0], schedule_seed=schedule[1])(x=x)
    assert info.value.kind == "race" and "it writes what the earlier one still reads" in info.value.message


# ---------------------------------------------------------------- races

ACCESS_DURING_WRITEBACK = """
.buffer y f32 4096 output
.kernel main
  .smem 0 4096 1 0 0 1 0 0
  .smem 32 4096 1 0 0 1 0 0
  rdsr s9, gcore
  bne s9, s0, done
  li s2, @y
  li s3, 512
  li s4, 128
  li s5, 0x800080
  li s8, 32
  li s7, 1
  dma.start hbm[s2], vmem[s0], s0, s0
  {access}
  li s6, 4096
  sem.wait s0, s6
done:
  halt
"""


@pytest.mark.parametrize(("access", "race"), [
    ("vld.w v1, 0(s0), s3, m0", False),              # reads what the DMA reads
    ("mxu.ldw x0, 0(s0), s4, s5", False),
    ("lds s7, 0(s0)", False),
    ("vst.w v1, 4096(s0), s3, m0", False),           # writes the bytes just past it
    ("vst.w v1, 4092(s0), s3, m0", True),            # its first row's first word is the DMA's last
    ("dma.start hbm[s2], vmem[s0], s8, s7\n  li s6, 4096\n  sem.wait s7, s6", False),   # two DMAs reading
    ("dma.start vmem[s4], vmem[s4], s8, s7\n  li s6, 4096\n  sem.wait s7, s6", True),   # writing what it reads
])
def test_only_a_write_or_a_read_of_written_bytes_races_with_a_dma_in_flight(access, race):
    kernel = _run(ACCESS_DURING_WRITEBACK.replace("{access}", access))
    if not race:
        kernel()
        return
    with pytest.raises(EmulatorFault) as info:
        kernel()
    assert info.value.kind == "race" and info.value.source.endswith(access.split("\n")[0])


def test_a_remote_signal_never_waited_for_is_named_at_its_arrival_which_ends_the_launch():
    # Chip 0 core 0 signals chip 1 core 0 at 1004 and halts; the signal arrives one hop
    # later, at 1054: the launch lasts until then, and the fault names that cycle and the
    # signal that raised the semaphore (its chip, core, pc and source line).
    program = assemble(textwrap.dedent("""
    .kernel main
      rdsr s1, gcore
      li s2, 1
      li s3, 2
      bne s1, s0, done
      sem.signal.r s2, s2, s3
    done:
      halt
    """), "audit73.s")
    machine = Machine(load_profile("test"), Mesh((2, 1, 1)), RunConfig())
    machine.load(program)
    with pytest.raises(EmulatorFault) as info:
        machine.run()
    fault = info.value
    assert (fault.kind, fault.chip, fault.core, fault.cycle, fault.pc) == ("semaphore-nonzero", 1, 0, 1054, 4)
    assert "semaphore 1 = 1 (last raised at cycle 1054 by `sem.signal.r s2, s2, s3` of chip 0 core 0, " \
           "pc 0x0004, audit73.s:7:" in fault.message
    # With the check off the run ends at the arrival, not at the halts (1005).
    machine = Machine(load_profile("test"), Mesh((2, 1, 1)), RunConfig(checks=("races",)))
    machine.load(program)
    assert machine.run().cycles == 1054
