"""docs/architecture.md's timing rules, each isolated by a small assembly program on
the `test` profile (1 GHz: DMA start latency 10, engine 32 B/cycle, core-to-core path
16 B/cycle after `sibling_latency` 100, links 8 B/cycle after `hop_latency` 50 a hop,
kernel launch 1000) or a profile extending it, with every expected cycle worked out by
hand from the doc. Also: the cycles do not depend on which core plays which role (the
machine's order of processing cores), checked by running one scenario under every
symmetry of a 2x2 mesh of 2-core chips.
"""

from __future__ import annotations

import textwrap

import pytest

import mkemu

LAUNCH = 1000


def _profile(tmp_path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text('extends = "test"\n' + textwrap.dedent(body))
    return str(path)


def _run(source: str, hw: str = "test", mesh: str = "1", **options):
    kernel = mkemu.compile_source(textwrap.dedent(source), "rules.s", hw=hw, mesh=mesh, trace=True, **options)
    return kernel()


def _dmas(run) -> list[dict]:
    d = run.report.trace.dma
    return [{k: d[k][i].item() for k in d} for i in range(len(d["seq"]))]


def test_a_flow_ending_speeds_up_the_others_at_its_exact_time():
    # 1024 and 4096 bytes on one engine, issued a cycle apart (1005, 1006): the first
    # moves 32 bytes alone, then both 16 B/cycle until the first lands at 1015 + 1 +
    # 992/16 = 1078; the second has moved 62 x 16 = 992 and moves its last 3104 at 32.
    run = _run("""
    .buffer src f32 65536 input
    .kernel main
      .smem 0 1024 1 0 0 1 0 0
      .smem 32 4096 1 0 0 1 0 0
      rdsr s9, gcore
      bne s9, s0, done
      li s1, @src
      li s2, 65536
      li s3, 32
      dma.start vmem[s0], hbm[s1], s0, s0
      dma.start vmem[s2], hbm[s1], s3, s0
      li s6, 5120
      sem.wait s0, s6
    done:
      halt
    """)
    d = _dmas(run)
    assert [(x["issued"], x["begun"], x["done"]) for x in d] == [(1005, 1015, 1078), (1006, 1016, 1078 + 97)]
    assert run.report.cycles == 1175


@pytest.mark.parametrize("size", [1, 31, 32, 33, 64, 65, 4095, 4097])
def test_a_dma_lands_at_the_first_whole_cycle_after_its_last_byte(size):
    run = _run(f"""
    .buffer src f32 65536 input
    .kernel main
      .smem 0 {size} 1 0 0 1 0 0
      rdsr s31, gcore
      bne s31, s0, done
      li s1, @src
      li s6, {size}
      dma.start vmem[s0], hbm[s1], s0, s0
      sem.wait s0, s6
    done:
      halt
    """)
    (d,) = _dmas(run)
    assert d["begun"] == d["issued"] + 10
    assert d["done"] - d["begun"] == -(-size // 32)


def test_the_core_to_core_path_is_one_resource_for_both_directions():
    # Cores 0 and 1 each push 4096 bytes into the other at once: they share the
    # chip's 16 B/cycle path (8 each: 512 cycles), not 16 each in their own direction.
    run = _run("""
    .kernel main
      .smem 0 4096 1 0 0 1 0 0
      rdsr s9, core
      li s1, 1
      li s2, 2
      li s6, 4096
      li s8, 8192
      xori s7, s9, 1
      dma.start.r vmem[s8]@s7, vmem[s0], s0, s1, s2
      sem.wait s1, s6
      sem.wait s2, s6
      halt
    """)
    d = _dmas(run)
    assert [(x["src_core"], x["dst_core"]) for x in d] == [(0, 1), (1, 0)]
    assert all(x["begun"] - x["issued"] == 10 + 100 and x["done"] - x["begun"] == 4096 // 8 for x in d)


def test_the_core_to_core_path_is_shared_by_every_pair_of_a_chips_cores(tmp_path):
    # Four cores a chip: 0 -> 3 and 1 -> 2 share the one path of the chip.
    hw = _profile(tmp_path, "four", "[chip]\ncores_per_chip = 4\n")
    run = _run("""
    .kernel main
      .smem 0 4096 1 0 0 1 0 0
      rdsr s9, core
      li s1, 1
      li s6, 4096
      li s2, 2
      bge s9, s2, recv
      xori s7, s9, 3
      dma.start.r vmem[s0]@s7, vmem[s0], s0, s1, s1
    recv:
      sem.wait s1, s6
      halt
    """, hw=hw)
    d = _dmas(run)
    assert sorted((x["src_core"], x["dst_core"]) for x in d) == [(0, 3), (1, 2)]
    assert all(x["begun"] - x["issued"] == 110 and x["done"] - x["begun"] == 4096 // 8 for x in d)


def test_a_push_to_the_issuing_core_itself_has_no_path_latency():
    run = _run("""
    .kernel main
      .smem 0 4096 1 0 0 1 0 0
      rdsr s9, gcore
      bne s9, s0, done
      li s1, 1
      li s6, 8192
      li s8, 8192
      dma.start.r vmem[s8]@s0, vmem[s0], s0, s1, s1
      sem.wait s1, s6
    done:
      halt
    """)
    (d,) = _dmas(run)
    assert d["begun"] - d["issued"] == 10 and d["done"] - d["begun"] == 4096 // 32


@pytest.mark.parametrize("mesh", ["4x1x1", "1x4x1", "1x1x4"])
def test_three_hops_along_each_axis(mesh):
    # Core 0 pushes to core 0 of the far chip (global core 6): 3 hops of 50 after the
    # start, then the 8 B/cycle links; the receiver's wait ends when it lands.
    run = _run("""
    .kernel main
      .smem 0 4096 1 0 0 1 0 0
      rdsr s9, gcore
      li s1, 1
      li s6, 4096
      li s7, 6
      bne s9, s0, other
      dma.start.r vmem[s0]@s7, vmem[s0], s0, s1, s1
      sem.wait s1, s6
      halt
    other:
      bne s9, s7, done
      sem.wait s1, s6
    done:
      halt
    """, mesh=mesh)
    (d,) = _dmas(run)
    assert (d["issued"], d["begun"], d["done"]) == (1005, 1005 + 10 + 150, 1165 + 512)
    assert run.report.cycles == 1677


def test_a_ring_route_goes_the_plus_way_on_a_tie(tmp_path):
    # A ring of 4: chip 0 -> chip 2 is 2 hops either way; taking + (0 -> 1 -> 2) it
    # shares link 1 -> 2 with chip 1's push to chip 2 (4 B/cycle each: 1024 cycles),
    # and shares nothing with chip 3's (3 -> 2): 8 each, 512 cycles.
    hw = _profile(tmp_path, "ring", "[mesh]\ndims = [4, 1, 1]\nwrap = [true, false, false]\n")

    def pushes(other: int) -> list[tuple[int, int, int]]:
        run = _run(f"""
        .kernel main
          .smem 0 4096 1 0 0 1 0 0
          rdsr s9, gcore
          li s1, 1
          li s6, 4096
          li s7, 4
          li s2, {other}
          beq s9, s0, send
          beq s9, s2, send
          bne s9, s7, done
          li s6, 8192
          sem.wait s1, s6
          halt
        send:
          muli s8, s9, 4096
          dma.start.r vmem[s8]@s7, vmem[s0], s0, s1, s1
          sem.wait s1, s6
        done:
          halt
        """, hw=hw, mesh="4x1x1")
        return sorted((x["src_chip"], x["begun"] - x["issued"], x["done"] - x["begun"]) for x in _dmas(run))

    # Chip 1's push (issued a cycle after chip 0's, 1 hop) moves 49 cycles alone at 8
    # (392 bytes), then 3704 at 4 (926 cycles) while chip 0's (2 hops) moves as much,
    # which then moves its last 392 alone at 8: 975 cycles each.
    assert pushes(2) == [(0, 110, 975), (1, 60, 975)]
    assert pushes(6) == [(0, 110, 512), (3, 60, 512)]


@pytest.mark.parametrize("order", ["fifo", "round_robin"])
def test_a_queued_dma_begins_at_a_free_slot_or_its_own_latency_if_later(order):
    # fifo: a 64-byte local copy (2 cycles), then a push to chip 1 issued while it is
    # in flight: it begins at its own issue + 10 + 50 (the slot is free by then); a
    # third copy waits for the push to land. round_robin: nothing waits.
    run = _run("""
    .kernel main
      .smem 0 4096 1 0 0 1 0 0
      .smem 32 64 1 0 0 1 0 0
      rdsr s9, gcore
      li s1, 1
      li s3, 32
      li s7, 2
      li s8, 8192
      bne s9, s0, other
      dma.start vmem[s8], vmem[s0], s3, s1
      dma.start.r vmem[s0]@s7, vmem[s0], s0, s1, s1
      li s8, 16384
      dma.start vmem[s8], vmem[s0], s3, s1
      li s6, 4224
      sem.wait s1, s6
      halt
    other:
      bne s9, s7, done
      li s6, 4096
      sem.wait s1, s6
    done:
      halt
    """, mesh="2x1x1", dma_order=order)
    got = [(x["issued"], x["begun"], x["done"]) for x in _dmas(run)]
    if order == "fifo":
        assert got == [(1006, 1016, 1018), (1007, 1067, 1579), (1009, 1579, 1581)]
    else:
        assert got == [(1006, 1016, 1018), (1007, 1067, 1579), (1009, 1019, 1021)]


def test_each_launch_starts_kernel_launch_cycles_after_the_previous_ended():
    # a: li, div (occupancy 4 on the scalar unit), halt (the sync unit: no wait) ->
    # ends 2 cycles after its start; b: nop, halt -> 1 cycle.
    run = _run("""
    .kernel a
      li s1, 3
      div s2, s1, s1
      halt
    .kernel b
      nop
      halt
    .launch a
    .launch b
    .launch a
    """)
    instr = run.report.trace.instr
    starts = [int(instr["issue"][instr["launch"] == n].min()) for n in range(3)]
    assert starts == [LAUNCH, LAUNCH + 2 + LAUNCH, LAUNCH + 2 + LAUNCH + 1 + LAUNCH]
    assert run.report.cycles == starts[2] + 2


# --- the roles of the cores do not matter -----------------------------------------

ROLES = 8       # 2x2x1 chips of 2 cores; role = global core id xor `swap`


def _roles_program(params, swap: int) -> str:
    """Every core runs the same instructions; what it does (a delay, then two pushes of
    its own sizes to other roles) is read from SMEM at its role, so the program is one
    scenario whichever core plays which role. XOR by 1 swaps the cores of each chip, by
    2 and 4 mirror the mesh's X and Y: symmetries of routes, links and ports."""
    smem, incoming = [], [0] * ROLES
    for role, (delay, pushes) in enumerate(params):
        words = [delay]
        for k, (target, size) in enumerate(pushes):
            words += [target, (2 * role + k + 1) * 65536]
            incoming[target] += size
        words.append(sum(size for _, size in pushes))
        smem.append(f".smem {128 * role} " + " ".join(map(str, words)))
        smem += [f".smem {128 * role + 32 * (k + 1)} {size} 1 0 0 1 0 0" for k, (_, size) in enumerate(pushes)]
    smem += [f".smem {4096 + 4 * role} {n}" for role, n in enumerate(incoming)]
    push = """
      lds s12, {t}(s10)
      xori s12, s12, {swap}
      lds s13, {d}(s10)
      addi s14, s10, {desc}
      dma.start.r vmem[s13]@s12, vmem[s0], s14, s1, s2"""
    return "\n".join([".kernel main", *smem, f"""
      rdsr s9, gcore
      xori s9, s9, {swap}
      muli s10, s9, 128
      muli s20, s9, 4
      lds s11, 0(s10)
      li s1, 1
      li s2, 2
    loop:
      beq s11, s0, go
      subi s11, s11, 1
      jmp loop
    go:""", push.format(t=4, d=8, desc=32, swap=swap), push.format(t=12, d=16, desc=64, swap=swap), """
      lds s15, 20(s10)
      sem.wait s1, s15
      lds s16, 4096(s20)
      sem.wait s2, s16
      halt
    """])


SCENARIOS = [
    # (delay, [(target role, bytes), (target role, bytes)]) per role
    [(27, [(6, 4096), (0, 1000)]), (16, [(7, 4096), (4, 4096)]), (11, [(3, 5000), (2, 1000)]),
     (4, [(1, 5000), (4, 5000)]), (22, [(2, 1000), (1, 12345)]), (2, [(5, 4096), (1, 1000)]),
     (13, [(5, 5000), (3, 5000)]), (15, [(7, 5000), (4, 1)])],
    [(0, [(1, 4096), (6, 4096)]), (0, [(0, 4096), (7, 4096)]), (0, [(3, 4096), (4, 33)]),
     (0, [(2, 4096), (5, 33)]), (3, [(7, 12345), (0, 1000)]), (3, [(6, 12345), (1, 1000)]),
     (1, [(6, 1), (2, 5000)]), (1, [(7, 1), (3, 5000)])],
]


@pytest.mark.parametrize("profile", ["test", "ports", "capped"])
@pytest.mark.parametrize("order", ["round_robin", "fifo"])
def test_cycles_do_not_depend_on_which_core_plays_which_role(tmp_path, profile, order):
    hw = {"test": "test",
          "ports": _profile(tmp_path, "ports", "[ici]\nlinks_per_neighbor = 2\nper_core_links = true\n"),
          "capped": _profile(tmp_path, "capped", "[core]\nvmem_bw_bytes_per_cycle = 20\n"
                                                  "[ici]\nlinks_per_neighbor = 3\n")}[profile]
    for params in SCENARIOS:
        seen = None
        for swap in range(ROLES):
            run = _run(_roles_program(params, swap), hw=hw, mesh="2x2x1", dma_order=order)
            instr = run.report.trace.instr
            halts = {int(c) ^ swap: int(instr["issue"][instr["core"] == c].max()) for c in range(ROLES)}
            timeline = sorted((x["src_core"] ^ swap, x["dst_core"] ^ swap, x["issued"], x["begun"], x["done"])
                              for x in _dmas(run))
            got = (run.report.cycles, halts, timeline)
            assert seen is None or got == seen, swap
            seen = got
