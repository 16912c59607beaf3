"""What synchronisation costs over the mesh, and what two cores get over one link, on
the `test` profile: a hop takes 50 cycles, a signal to the sibling core 40
(`sibling_signal_latency_cycles`), a DMA's bytes reach the sibling core 100 cycles
after its start (`sibling_latency_cycles`), a link moves 8 bytes a cycle.

Every core runs the same kernel from the same launch cycle, so differences of halt
cycles are the latencies, worked out by hand.
"""

from __future__ import annotations

import pytest

from mkemu.emulator.config import RunConfig
from mkemu.emulator.machine import Machine
from mkemu.emulator.topology import Mesh
from mkemu.isa.asm import assemble
from mkemu.isa.hardware import load_profile

HOP, SIGNAL, SIBLING_DMA = 50, 40, 100
LAUNCH = 1000          # the kernel starts at cycle 1000 (kernel_launch_cycles)


def halts(body: str, dims=(1, 1, 1), wrap=(False, False, False)) -> list[int]:
    """Each core's halt cycle (gid order) after running `body` then `halt`."""
    machine = Machine(load_profile("test"), Mesh(dims, wrap), RunConfig())
    machine.load(assemble(f".kernel main\n{body}\n    halt\n", "sync.s"))
    machine.run()
    return [core.end_time for core in machine.cores]


def test_profile_has_its_own_sibling_signal_latency():
    p = load_profile("test")
    assert (p.hop_latency_cycles, p.sibling_signal_latency_cycles, p.sibling_latency_cycles) == (
        HOP, SIGNAL, SIBLING_DMA)


@pytest.mark.parametrize(("dims", "target", "latency"), [
    ((1, 1, 1), 1, SIGNAL),            # the sibling core: the on-chip signal latency
    ((3, 1, 1), 4, 2 * HOP),           # chip 2, two hops along x
    ((2, 2, 1), 6, 2 * HOP),           # chip 3 = (1, 1): one hop in x, one in y
])
def test_signal_arrives_after_its_path_latency(dims, target, latency):
    # Core 0 signals semaphore 1 of `target` at cycle 5 of the kernel (after rdsr, li,
    # li, beq, bne); the target waits for it and halts the cycle it arrives.
    body = f"""    rdsr s1, gcore
    li s2, 1
    li s3, {target}
    beq s1, s3, wait
    bne s1, s0, done
    sem.signal.r s2, s2, s3
    jmp done
wait:
    sem.wait s2, s2
done:"""
    assert halts(body, dims)[target] == LAUNCH + 5 + latency


def test_chip_barrier_gathers_at_core_0_and_releases_both():
    # Both arrive at cycle 0; core 1's arrival reaches core 0 after one on-chip signal,
    # and the release reaches core 1 after another.
    assert halts("    barrier chip") == [LAUNCH + SIGNAL, LAUNCH + 2 * SIGNAL]


def test_all_barrier_root_is_the_central_chip():
    # A line of 3 chips: the root is chip 1 core 0 (gid 2), the member whose farthest
    # member is nearest (one hop, or the on-chip signal to its sibling).
    end = halts("    barrier all", (3, 1, 1))
    assert [e - LAUNCH for e in end] == [2 * HOP, 2 * HOP, HOP, HOP + SIGNAL, 2 * HOP, 2 * HOP]


def test_barrier_waits_for_the_last_arrival_plus_its_messages():
    # On a line of 4 chips the root is chip 1 core 0 (the lowest id of the tied
    # centres). Chip 3's cores arrive at cycle 303 (rdsr, li, bne, 300 nops), the
    # others at 3: the last arrival takes 2 hops to the root, the release up to 2
    # hops back out.
    late = """    rdsr s1, chip
    li s2, 3
    bne s1, s2, go
""" + "    nop\n" * 300 + "go:\n    barrier all"
    all_in = 303 + 2 * HOP
    back = [HOP, HOP, 0, SIGNAL, HOP, HOP, 2 * HOP, 2 * HOP]
    assert [e - LAUNCH for e in halts(late, (4, 1, 1))] == [all_in + b for b in back]


def test_line_barrier_uses_only_its_line():
    # 3x2 mesh: an x barrier joins the 3 chips of one y row with the same core index;
    # its root is the row's centre chip, one hop from each end.
    end = halts("    barrier x", (3, 2, 1))
    assert [e - LAUNCH for e in end] == [2 * HOP, 2 * HOP, HOP, HOP, 2 * HOP, 2 * HOP] * 2


def test_barrier_on_a_ring_has_no_far_end():
    # A ring of 4 chips: every chip is at most 2 hops from any other, and the root
    # (chip 0 core 0, the lowest id: all are centres) is 1 hop from chips 1 and 3.
    end = halts("    barrier all", (4, 1, 1), (True, False, False))
    back = [0, SIGNAL, HOP, HOP, 2 * HOP, 2 * HOP, HOP, HOP]
    assert [e - LAUNCH for e in end] == [2 * HOP + b for b in back]


@pytest.mark.parametrize(("ici", "cycles_per_byte"), [
    ("per_core_links = false\nlinks_per_neighbor = 1", 2 / 8),   # both share one 8 B/cycle link
    ("per_core_links = true\nlinks_per_neighbor = 2", 1 / 8),    # each core its own 8 B/cycle
])
@pytest.mark.parametrize("links_given", [True, False])
def test_both_cores_pushing_to_a_neighbour(tmp_path, ici, cycles_per_byte, links_given):
    # Both cores of chip 0 push 8000 bytes into the same core of chip 1 and wait until
    # they are sent; the DMA engine (32 B/cycle) is faster than a link (8 B/cycle).
    path = tmp_path / "links.toml"
    path.write_text(f'extends = "test"\n[ici]\n{ici}\n')
    profile = load_profile(str(path))
    # A mesh that names no link count takes the profile's (it used to take 1 link, so
    # two cores pooled on a 2-link profile got half the bandwidth the profile says).
    mesh = Mesh((2, 1, 1), links_per_neighbor=profile.links_per_neighbor) if links_given else Mesh((2, 1, 1))
    machine = Machine(profile, mesh, RunConfig())
    assert machine.mesh.links_per_neighbor == profile.links_per_neighbor
    machine.load(assemble(""".kernel main
    .smem 0 8000 1 0 0 1 0 0
    rdsr s1, chip
    rdsr s2, core
    li s4, 1
    li s5, 8000
    bne s1, s0, receive
    muli s6, s2, 8192
    addi s3, s2, 2          ; the same core of chip 1
    dma.start.r vmem[s6]@s3, vmem[s6], s0, s4, s4
    sem.wait s4, s5
    jmp done
receive:
    sem.wait s4, s5
done:
    halt
""", "links.s"))
    machine.run()
    # Issued at cycle 7 (muli's result is ready then); start latency 10 and one hop
    # before the bytes move; the receivers halt when their bytes have landed.
    landed = LAUNCH + 7 + 10 + HOP + 8000 * cycles_per_byte
    assert [c.end_time for c in machine.cores[2:]] == [landed, landed]
