"""docs/architecture.md's machine model and timing rules, measured through the public
API on the `test` profile (1 GHz, round numbers: see isa/profiles/test.toml).

Issue cycles come from the run's trace (`report.trace`, docs/traces.md)."""

from __future__ import annotations

import textwrap
from importlib import resources

import pytest

import mkemu
from mkemu.cli import main

LAUNCH = 1000          # kernel_launch_cycles of `test`


def _run(source: str, mesh: str = "1x1x1", **options):
    kernel = mkemu.compile_source(textwrap.dedent(source), "arch.s", hw="test", mesh=mesh, trace=True,
                                  **options)
    return kernel()


def _issues(run, core: int = 0) -> list[int]:
    """Issue cycles of a core's instructions, in order, relative to the launch start."""
    instr = run.report.trace.instr
    return [int(c) - LAUNCH for c in instr["issue"][instr["core"] == core].tolist()]


def test_matrix_unit_paths_and_accumulators():
    run = _run("""
    .kernel main
        li s1, 256
        li s2, 8388736
        mxu.ldw x0, 0(s0), s1, s2
        mxu.push x0, v1, 0
        mxu.mac x0, a0, 1
        mxu.push x0, v2, 0
        mxu.ldw x0, 0(s0), s1, s2
        mxu.mac x0, a0, 0
        mxu.mac x0, a0, 0
        mxu.pop v3, x0, a0, 0
        halt
    """)
    li1, li2, ldw, push, mac, push2, ldw2, mac2, mac3, pop, halt = _issues(run)
    assert (li1, li2, ldw, push) == (0, 1, 2, 3)
    assert mac == ldw + 16                 # a pass waits for its tile (mxu_ldw latency 16)
    assert push2 == mac + 1                # LHS staging does not wait for the streaming pass
    assert ldw2 == push2 + 1               # the next tile loads on the weight path during the pass
    assert mac2 == ldw2 + 16               # ... and the next pass waits for it
    assert mac3 == mac2 + 8                # same accumulator: only the unit's occupancy (8), not latency
    assert pop == mac3 + 16                # pop waits for the accumulator's last mac (latency 16)
    assert halt == pop + 1


def test_in_order_issue_dependencies_and_occupancy():
    run = _run("""
    .kernel main
        li s1, 7
        div s2, s1, s1
        div s3, s1, s1
        add s4, s2, s0
        vredsum.lane.f32 v1, v0
        vredsum.lane.f32 v2, v0
        vadd.f32 v3, v1, v1
        vadd.f32 v3, v0, v0
        add s0, s1, s1
        add s5, s0, s0
        mark.push 0, s0
        mark.pop
        halt
    """)
    li, div1, div2, add, red1, red2, vadd1, vadd2, adds0, adds5, push, pop, halt = _issues(run)
    assert div1 == li + 1                  # one instruction per cycle; s1 ready after latency 1
    assert div2 == div1 + 4                # scalar_div occupies the scalar unit 4 cycles
    assert add == div2 + 4                 # the unit again (s2 was ready at div1 + 4)
    assert red2 == red1 + 2                # xlu occupancy 2
    assert vadd1 == red1 + 4               # read after write: v1 ready after xlu latency 4
    assert vadd2 == vadd1 + 2              # write after write on v3: valu latency 2
    assert adds5 == adds0 + 1              # s0's write is ignored: no dependency on it
    assert push == pop == halt == adds5 + 1   # region marks are free: no slot, no cycle
    s = run.report.figures["stall_cycles"]
    assert s["unit"] > 0 and s["dependency"] > 0


def test_registers_memories_and_launches():
    run = _run("""
    .buffer out i32 8x128 output
    .kernel first
        li s1, 0x7fffffff
        addi s2, s1, 1
        vli.i32 v5, 3
        li s3, 77
        sts s3, 64(s0)
        li s20, 99
        li s5, 512
        vst.w v5, 0(s0), s5, m0
        halt
    .kernel second
        .smem 0 4096 1 0 0 1 0 0
        li s1, 0x7fffffff
        addi s2, s1, 1
        lui.d s3, 5
        addi.d s3, s3, 1
        sts.d s3, 128(s0)
        lds s4, 132(s0)
        vld.w v1, 0(s0), s7, m0
        lds s6, 64(s0)
        vinsert v1, s2, s0
        li s8, 1
        vinsert v1, s4, s8
        li s8, 2
        vinsert v1, s6, s8
        li s8, 3
        vinsert v1, s20, s8
        mnot m0, m0
        li s5, 512
        vst.w v1, 0(s0), s5, m0
        li s1, @out
        li s9, 4096
        dma.start hbm[s1], vmem[s0], s0, s0
        sem.wait s0, s9
        halt
    """)
    row = run.output("out")[0]
    assert row[0] == -2**31                # int32 operations wrap to 32 bits
    assert row[1] == 5                     # .d keeps all 64: the high word of 5 << 32 | 1
    # A launch starts from zeroed registers, SMEM and VMEM: the first kernel's 3s, 77
    # and s20 are gone; m0 stays all true (a write to it is ignored).
    assert row[2] == 0 and row[3] == 0 and (row[4:] == 0).all()
    assert (run.output("out") != 0).sum() == 2
    first, second = run.report.trace.launches
    assert first["start"] == LAUNCH and second["start"] == first["end"] + LAUNCH
    assert run.report.cycles == second["end"]


def test_chip_ids_and_global_core_ids():
    run = _run("""
    .buffer out i32 8x128 output
    .kernel main
        .smem 0 4096 1 0 0 1 0 0
        rdsr s1, chip
        rdsr s2, chip_x
        rdsr s3, chip_y
        rdsr s4, chip_z
        rdsr s5, gcore
        rdsr s6, core
        li s7, 1
        vinsert v1, s1, s0
        vinsert v1, s2, s7
        li s7, 2
        vinsert v1, s3, s7
        li s7, 3
        vinsert v1, s4, s7
        li s7, 4
        vinsert v1, s5, s7
        li s7, 512
        vst.w v1, 0(s0), s7, m0
        bne s6, s0, done
        li s1, @out
        li s9, 4096
        dma.start hbm[s1], vmem[s0], s0, s0
        sem.wait s0, s9
    done:
        halt
    """, mesh="3x2x2")
    for chip in range(12):
        c, x, y, z, gid = run.output("out", chip=chip)[0, :5].tolist()
        assert c == chip == x + 3 * (y + 2 * z)
        assert gid == chip * 2             # core 0 wrote it: chip * cores + core


DMA = """
.buffer a f32 128x128 input
.kernel main
    .smem 0 4096 1 0 0 1 0 0
    rdsr s9, gcore
    li s1, @a
    li s6, 4096
    li s11, 1
{body}
"""


def test_dma_start_latency_and_bandwidth_local_sibling_remote():
    # Local HBM -> VMEM: start latency 10, then the 32 B/cycle engine (HBM, 64 B/cycle,
    # is no flow resource: 2 engines x 32 cannot outrun it).
    run = _run(DMA.format(body="""
        bne s9, s0, done
        dma.start vmem[s0], hbm[s1], s0, s0
        sem.wait s0, s6
    done:
        halt
    """))
    dma = run.report.trace.dma
    assert dma["begun"][0] - dma["issued"][0] == 10
    assert dma["done"][0] - dma["begun"][0] == 4096 // 32
    assert [r["kind"] for r in (run.report.trace.resources[i] for i in run.report.trace.dma_res["resource"])] \
        == ["engine"]
    # To the sibling core: + sibling_latency 100, at the 16 B/cycle core-to-core path;
    # the issuer's sem counts bytes sent, the target's rsem bytes received, both at landing.
    run = _run(DMA.format(body="""
        bne s9, s0, c1
        dma.start.r vmem[s0]@s11, vmem[s0], s0, s0, s11
        sem.wait s0, s6
        halt
    c1:
        sem.wait s11, s6
        halt
    """))
    t = run.report.trace
    dma, wait = t.dma, t.wait
    assert dma["begun"][0] - dma["issued"][0] == 10 + 100
    assert dma["done"][0] - dma["begun"][0] == 4096 // 16
    assert sorted(zip(wait["core"].tolist(), wait["sem"].tolist(), wait["end"].tolist())) == [
        (0, 0, dma["done"][0]), (1, 1, dma["done"][0])]
    # To chip 1 (one hop): + hop_latency 50, at the 8 B/cycle link.
    run = _run(DMA.format(body="""
        li s7, 2
        bne s9, s0, other
        dma.start.r vmem[s0]@s7, vmem[s0], s0, s0, s11
        sem.wait s0, s6
        halt
    other:
        bne s9, s7, done
        sem.wait s11, s6
    done:
        halt
    """), mesh="2x1x1")
    dma = run.report.trace.dma
    assert dma["begun"][0] - dma["issued"][0] == 10 + 50
    assert dma["done"][0] - dma["begun"][0] == 4096 // 8


@pytest.mark.parametrize("order", ["round_robin", "fifo"])
def test_an_engine_moves_at_most_max_in_flight_dmas(order):
    run = _run(DMA.format(body="""
        bne s9, s0, done
        li s5, 5
        li s7, 0
    loop:
        dma.start vmem[s7], hbm[s1], s0, s0
        addi s7, s7, 4096
        addi s5, s5, -1
        bne s5, s0, loop
        li s6, 20480
        sem.wait s0, s6
    done:
        halt
    """), dma_order=order)
    dma = run.report.trace.dma
    issued, begun, done = dma["issued"].tolist(), dma["begun"].tolist(), dma["done"].tolist()
    if order == "fifo":                    # one at a time, each at the engine's full 32 B/cycle
        assert begun[0] == issued[0] + 10
        assert all(begun[i + 1] == done[i] and done[i] - begun[i] == 128 for i in range(4))
    else:                                  # max_in_flight = 4: the fifth waits for the first to land
        assert begun[:4] == [i + 10 for i in issued[:4]]
        assert begun[4] == min(done[:4]) == done[0]
        # Shared max-min fairly, the engine stays full: 5 x 4096 bytes at 32 B/cycle.
        assert max(done) - begun[0] == 5 * 4096 // 32


def test_signal_and_barrier_latencies():
    run = _run("""
    .kernel main
        rdsr s9, gcore
        li s1, 1
        li s4, 4
        bne s9, s0, other
        sem.signal.r s0, s1, s1
        sem.signal.r s0, s1, s4
        halt
    other:
        beq s9, s1, wait
        bne s9, s4, done
    wait:
        sem.wait s0, s1
    done:
        halt
    """, mesh="3x1x1")
    sig = run.report.trace.signal
    lat = dict(zip(sig["dst_core"].tolist(), (sig["arrival"] - sig["issued"]).tolist()))
    assert lat == {1: 40, 4: 2 * 50}       # sibling_signal_latency; 2 hops x hop_latency
    # Core g arrives after g divides (4 cycles each): barrier all on 3 chips in a line.
    run = _run("""
    .kernel main
        rdsr s9, gcore
        li s1, 1
    loop:
        beq s9, s0, go
        div s2, s1, s1
        subi s9, s9, 1
        jmp loop
    go:
        barrier all
        barrier chip
        barrier x
        halt
    """, mesh="3x1x1")
    wait = run.report.trace.wait

    def latency(a, b):
        if a // 2 != b // 2:
            return abs(a // 2 - b // 2) * 50
        return 40 if a != b else 0

    def expect(members, arrivals):
        # Root: the member whose farthest member is nearest (lowest id on a tie).
        root = min(members, key=lambda c: (max(latency(m, c) for m in members), c))
        all_in = max(arrivals[m] + latency(m, root) for m in members)
        return {m: all_in + latency(root, m) for m in members}

    for scope, groups in ((1, [range(6)]), (0, [(0, 1), (2, 3), (4, 5)]), (2, [(0, 2, 4), (1, 3, 5)])):
        sel = wait["sem"] == scope
        start = dict(zip(wait["core"][sel].tolist(), wait["start"][sel].tolist()))
        end = dict(zip(wait["core"][sel].tolist(), wait["end"][sel].tolist()))
        for members in groups:
            assert {m: end[m] for m in members} == expect(list(members), start)
    # The root of the whole line is chip 1's core 0: its own release needs no message.
    sel = wait["sem"] == 1
    assert wait["end"][sel].tolist().count(int(wait["end"][sel].min())) == 1


def test_source_bytes_are_those_at_issue():
    run = _run("""
    .buffer out f32 8x128 output
    .kernel main
        .smem 0 4096 1 0 0 1 0 0
        rdsr s9, gcore
        bne s9, s0, done
        li s1, @out
        vli.f32 v1, 1.0
        li s5, 512
        vst.w v1, 0(s0), s5, m0
        dma.start hbm[s1], vmem[s0], s0, s0
        vli.f32 v2, 2.0
        vst.w v2, 0(s0), s5, m0
        li s6, 4096
        sem.wait s0, s6
    done:
        halt
    """, checks=set())
    assert (run.output("out") == 1.0).all()


@pytest.mark.parametrize("line, ok, bad", [
    ("cores_per_chip = 2", "cores_per_chip = 16", "cores_per_chip = 17"),
    ("semaphores = 16", "semaphores = 65536", "semaphores = 65537"),
    ("vmem_bytes = 4_194_304", "vmem_bytes = 1073741824", "vmem_bytes = 1073745920"),
    ("smem_bytes = 65_536", "smem_bytes = 67108864", "smem_bytes = 67108868"),
    ("mxus_per_core = 2", "mxus_per_core = 4", "mxus_per_core = 5"),
    ("mxu_accumulators = 4", "mxu_accumulators = 16", "mxu_accumulators = 17"),
    ("hbm_bytes = 67_108_864", "hbm_bytes = 4611686018427387904", "hbm_bytes = 4611686018427387905"),
])
def test_profile_limits(tmp_path, capsys, line, ok, bad):
    text = (resources.files("mkemu.isa") / "profiles" / "test.toml").read_text()
    assert line in text
    key = line.split(" =")[0]
    for value, status in ((ok, 0), (bad, 1)):
        path = tmp_path / "p.toml"
        path.write_text(text.replace(line, value))
        capsys.readouterr()
        assert main(["hw", "show", str(path)]) == status
        if status:
            assert key in capsys.readouterr().err


def test_mesh_limit(capsys):
    assert main(["run", "vector_add", "--hw", "test", "--mesh", "1025x1x1"]) == 1
    assert "at most 1,024" in capsys.readouterr().err

