"""Timing on the `test` profile (1 GHz; HBM 64 B/cycle, DMA engine 32 B/cycle, DMA
start latency 10 cycles, kernel launch 1000 cycles), worked out by hand.

Only core 0 runs (core 1 halts at once). `end` is the cycle core 0 halts.
"""

from __future__ import annotations

import time

import pytest

from mkemu.emulator.config import RunConfig

LAUNCH = 1000
DMA_LATENCY = 10
ENGINE_BW = 32          # bytes/cycle; below HBM's 64, so the engine limits one core
SLACK = 8               # cycles of issue overhead around a measured interval


def descriptors(*sizes: int) -> str:
    """One contiguous-copy descriptor per size, 32 bytes apart from SMEM 0."""
    return "\n".join(f"{32 * i} {size} 1 0 0 1 0 0" for i, size in enumerate(sizes))


def copies(sizes, wait_for=None):
    """Start one HBM->VMEM copy per size, back to back, each on its own semaphore; wait
    for `wait_for` (default: all) and halt. Returns (body, smem descriptors)."""
    wait_for = range(len(sizes)) if wait_for is None else wait_for
    body = ["li s1, @src"]
    for i, size in enumerate(sizes):
        body += [f"li s{2 + i}, {i * 65536}", f"li s{10 + i}, {32 * i}", f"li s{20 + i}, {i}"]
    body += [f"dma.start vmem[s{2 + i}], hbm[s1], s{10 + i}, s{20 + i}" for i in range(len(sizes))]
    for i in wait_for:
        body += [f"li s30, {sizes[i]}", f"sem.wait s{20 + i}, s30"]
    return body, descriptors(*sizes)


def first_issue(n: int) -> int:
    """The cycle (from kernel start) of the first dma.start in `copies` of n sizes:
    rdsr, bne, li and 3 li per copy issue one per cycle before it."""
    return 3 + 3 * n


def end_cycle(emu, body, smem="", order="round_robin", profile="test", checks=("races", "semaphores"),
              buffers=".buffer src f32 65536 input\n"):
    source = emu.kernel("\n".join(body) if isinstance(body, list) else body, buffers=buffers, smem=smem)
    ran = emu.run(source, profile=profile, config=RunConfig(dma_order=order, checks=frozenset(checks)))
    return ran.machine.cores[0].end_time - LAUNCH, ran


def landed(n: int, size: int, share: int) -> float:
    """When the first of n copies lands if `share` copies divide the engine from its start."""
    return first_issue(n) + DMA_LATENCY + share * size / ENGINE_BW


def assert_close(end, expected, early=0):
    """`end` (a halt cycle) is at most a few cycles after `expected`; copies started a
    cycle apart may let the first one land up to `early` cycles sooner."""
    assert expected - early <= end <= expected + SLACK, (end, expected)


@pytest.mark.parametrize("size", [512, 4096, 32768, 100000])
def test_single_dma_takes_start_latency_plus_bytes_over_bandwidth(emu, size):
    end, ran = end_cycle(emu, *copies([size]))
    assert_close(end, landed(1, size, 1))
    assert ran.result.hbm_bytes == size and ran.result.dma_count == 1


def test_hbm_limits_when_it_is_slower_than_the_engine(emu):
    slow = emu.profile("slow_hbm", "[chip]\nhbm_bw_bytes_per_s = 8e9\n")
    end, _ = end_cycle(emu, *copies([8192]), profile=slow)
    assert_close(end, first_issue(1) + DMA_LATENCY + 8192 / 8)


def test_two_concurrent_copies_share_the_engine(emu):
    size = 16384
    one, _ = end_cycle(emu, *copies([size]))
    first, _ = end_cycle(emu, *copies([size, size], wait_for=[0]), checks=("races",))
    both, _ = end_cycle(emu, *copies([size, size]))
    # Each copy gets half the engine: it lands at latency + 2 * size / bw, ~2x alone.
    assert_close(first, landed(2, size, 2), early=2)
    assert_close(both, landed(2, size, 2))
    transfer_alone = one - first_issue(1) - DMA_LATENCY
    transfer_shared = first - first_issue(2) - DMA_LATENCY
    assert transfer_shared / transfer_alone == pytest.approx(2.0, rel=0.02)


def test_more_descriptors_in_flight_each_land_later(emu):
    size = 8192
    firsts = []
    for n in (1, 2, 3, 4):
        firsts.append(end_cycle(emu, *copies([size] * n, wait_for=[0]), checks=("races",))[0])
        assert_close(firsts[-1], landed(n, size, n), early=n)
    assert firsts == sorted(firsts) and len(set(firsts)) == 4


def test_fifo_lands_the_first_copy_early_round_robin_shares(emu):
    size = 16384
    body, smem = copies([size, size], wait_for=[0])
    fifo_first, _ = end_cycle(emu, body, smem, order="fifo", checks=("races",))
    rr_first, _ = end_cycle(emu, body, smem, order="round_robin", checks=("races",))
    fifo_all, _ = end_cycle(emu, *copies([size, size]), order="fifo")
    rr_all, _ = end_cycle(emu, *copies([size, size]), order="round_robin")
    assert_close(fifo_first, landed(2, size, 1))
    assert_close(rr_first, landed(2, size, 2), early=2)
    # fifo: the second copy begins when the first lands (its start latency already
    # served while queued), so both orders move all bytes by the same cycle.
    assert_close(fifo_all, landed(2, size, 2))
    assert abs(fifo_all - rr_all) <= 2


def test_descriptors_beyond_max_in_flight_wait_for_a_slot(emu):
    size = 4096
    last, _ = end_cycle(emu, *copies([size] * 5, wait_for=[4]), checks=("races",))
    all_done, _ = end_cycle(emu, *copies([size] * 5))
    # 4 move at once; the 5th begins when the first of them lands and ends last.
    assert last == all_done
    assert_close(last, landed(5, size, 5))


def _tile_loop(overlap: bool, tiles: int = 6, work: int = 40) -> str:
    """Stream `tiles` 4 KiB tiles from HBM, each followed by `work` dependent vector ops.

    With overlap, tile i+1's DMA is started (into the other of two buffers) before
    tile i is computed on; without, each DMA is started and waited for in turn.
    """
    compute = "vld.w v1, 0(s7), s6, m0\n" + "vmul.f32 v1, v1, v1\n" * work + "vst.w v1, 0(s7), s6, m0\n"
    if overlap:
        return f"""
            li s6, 512
            li s8, 4096
            li s10, {tiles}
            li s1, @src
            li s2, 0
            dma.start vmem[s2], hbm[s1], s0, s0
            li s9, 0
        loop:
            addi s11, s9, 1
            bge s11, s10, last
            andi s2, s11, 1
            shli s2, s2, 12
            shli s12, s11, 12
            add s12, s1, s12
            dma.start vmem[s2], hbm[s12], s0, s0
        last:
            sem.wait s0, s8
            andi s7, s9, 1
            shli s7, s7, 12
            {compute}
            addi s9, s9, 1
            blt s9, s10, loop
        """
    return f"""
            li s6, 512
            li s8, 4096
            li s10, {tiles}
            li s1, @src
            li s9, 0
        loop:
            andi s7, s9, 1
            shli s7, s7, 12
            shli s12, s9, 12
            add s12, s1, s12
            dma.start vmem[s7], hbm[s12], s0, s0
            sem.wait s0, s8
            {compute}
            addi s9, s9, 1
            blt s9, s10, loop
        """


def test_double_buffering_hides_dma_time(emu):
    smem = "0 4096 1 0 0 1 0 0"
    serial, r1 = end_cycle(emu, _tile_loop(False), smem)
    overlapped, r2 = end_cycle(emu, _tile_loop(True), smem)
    dma = DMA_LATENCY + 4096 / ENGINE_BW       # 138 cycles per tile
    compute = 40 * 2                           # 40 dependent vmul, latency 2 each
    assert serial >= 6 * (dma + compute)
    assert overlapped <= dma + 6 * max(dma, compute) + 6 * 20
    assert serial - overlapped >= 5 * min(dma, compute) - 5 * 20
    # Same work, same bits: the two loops only differ in when the copies run.
    assert r1.machine.cores[0].vmem[:8192].tobytes() == r2.machine.cores[0].vmem[:8192].tobytes()


def test_a_consumer_issues_when_its_operand_is_ready(emu):
    # eup: latency 4, occupancy 1. A chain of N dependent ops takes 4N, independent ones N.
    n = 50
    chain, _ = end_cycle(emu, "vexp.f32 v1, v1\n" * n)
    independent, _ = end_cycle(emu, "".join(f"vexp.f32 v{1 + i % 8}, v20\n" for i in range(n)))
    empty, _ = end_cycle(emu, "")
    assert chain - empty == pytest.approx(4 * (n - 1) + 1, abs=2)
    assert independent - empty == pytest.approx(n, abs=2)


def test_scalar_multiply_and_divide_latency_stall_their_users(emu):
    mul, _ = end_cycle(emu, "li s1, 3\n" + "mul s1, s1, s1\n" * 20)      # latency 2
    div, _ = end_cycle(emu, "li s1, 3\n" + "divi s1, s1, 1\n" * 20)      # latency 4
    add, _ = end_cycle(emu, "li s1, 3\n" + "add s1, s1, s1\n" * 20)      # latency 1
    # Each op waits for the previous result; the last one's latency is not waited for.
    assert mul - add == 19 * (2 - 1)
    assert div - add == 19 * (4 - 1)


def test_vinsert_waits_for_the_vector_it_updates(emu):
    # vinsert keeps the other 1023 elements of vd, so it depends on vd's producer.
    after_exp, _ = end_cycle(emu, "vexp.f32 v1, v2\nvinsert v1, s0, s0\nvextract s5, v1, s0")
    unrelated, _ = end_cycle(emu, "vexp.f32 v3, v2\nvinsert v1, s0, s0\nvextract s5, v1, s0")
    assert after_exp - unrelated == 4 - 1


def test_unit_occupancy_serialises_one_unit_not_two(emu):
    # mxu_ldw occupies its matrix unit's weight path 16 cycles; two units work side by side.
    setup = "li s2, 0\nli s3, 256\nli s4, 8388736\n"     # 128 x 128 tile
    same = setup + "mxu.ldw x0, 0(s2), s3, s4\n" * 8
    alternating = setup + "mxu.ldw x0, 0(s2), s3, s4\nmxu.ldw x1, 0(s2), s3, s4\n" * 4
    one_unit, r1 = end_cycle(emu, same)
    two_units, _ = end_cycle(emu, alternating)
    assert one_unit - two_units == pytest.approx(4 * 16, abs=4)
    assert r1.result.unit_busy_cycles["mxu0.w"] == 8 * 16
    assert r1.result.unit_busy_cycles["mxu0"] == 0
    # xlu occupancy 2 vs valu occupancy 1 for independent ops (distinct destinations,
    # so no write-after-write waits).
    xlu, _ = end_cycle(emu, "".join(f"vrot.lane v{1 + i % 29}, v31, 1\n" for i in range(30)))
    valu, r2 = end_cycle(emu, "".join(f"vadd.f32 v{1 + i % 29}, v31, v31\n" for i in range(30)))
    assert xlu - valu == pytest.approx(30, abs=3)
    assert r2.result.unit_busy_cycles["valu"] == 30


def test_weight_loads_and_lhs_staging_overlap_the_array(emu):
    # A matrix unit has three in-order paths: weight loads (mxu_ldw: 16 cycles), LHS
    # staging (mxu_push: 1) and the array (mxu_mac: occupancy 8, latency 16). It holds
    # two weight tiles, so the next load runs while the array still works on a pass.
    setup = "li s2, 0\nli s3, 256\nli s4, 8388736\nmxu.ldw x0, 0(s2), s3, s4\n"
    tile = "mxu.mac x0, a0, 1\nmxu.ldw x0, 0(s2), s3, s4\n"
    one, _ = end_cycle(emu, setup + tile)
    three, ran = end_cycle(emu, setup + tile * 3)
    # Each pass waits for its tile (16 cycles after that load issued); the next load
    # issues the cycle after the pass, while the array is busy: 17 cycles per tile.
    assert three - one == 2 * 17
    assert ran.result.unit_busy_cycles["mxu0"] == 3 * 8
    assert ran.result.unit_busy_cycles["mxu0.w"] == 4 * 16
    # Staging the next LHS rows does not wait for the pass that is streaming.
    after_pass = setup + "mxu.mac x0, a0, 1\n"
    plain, _ = end_cycle(emu, after_pass + "li s5, 1\n")
    staged, ran = end_cycle(emu, after_pass + "mxu.push x0, v1, 0\n")
    assert staged == plain
    assert ran.result.unit_busy_cycles["mxu0.lhs"] == 1


def test_idle_waiting_costs_no_wall_time(emu):
    # 4 KiB through a 4-bytes-per-microsecond engine: about 10^9 cycles of waiting.
    slow = emu.profile("crawl", "[dma]\nengine_bw_bytes_per_s = 4000\n")
    t0 = time.perf_counter()
    end, ran = end_cycle(emu, *copies([4096]), profile=slow)
    assert time.perf_counter() - t0 < 2.0
    assert end == pytest.approx(DMA_LATENCY + 4096 / 4e-6, rel=1e-3)
    assert ran.result.cycles > 10**9
    assert ran.result.stall_cycles["semaphore"] > 10**9


def test_a_push_into_another_chips_hbm_shares_that_hbm_not_the_issuers(tmp_path):
    # HBM is a resource here (two engines of 32 B/cycle could outrun 48e9 B/s = 48 B/cycle
    # at the test profile's 1 GHz). Core 0 copies from chip 0's HBM while core 1 pushes
    # into chip 1's: they share no HBM and each moves at its engine's 32 B/cycle (4096
    # bytes in 128 cycles). The push used to count against chip 0's HBM, which it never
    # touches, and both took 4096 / 24 cycles.
    import mkemu

    profile = tmp_path / "hbm48.toml"
    profile.write_text('extends = "test"\n[chip]\nhbm_bw_bytes_per_s = 48e9\n[ici]\nlink_bw_bytes_per_s = 1000e9\n')
    source = """
    .buffer a f32 8x128 input
    .kernel main
        .smem 0 4096 1 0 0 1 0 0
        rdsr s9, gcore
        li s1, @a
        li s6, 4096
        li s7, 3
        li s8, 1
        beq s9, s0, local
        beq s9, s8, push
        beq s9, s7, recv
        halt
    local:
        dma.start vmem[s0], hbm[s1], s0, s0
        sem.wait s0, s6
        halt
    push:
        dma.start.r hbm[s1]@s7, vmem[s0], s0, s0, s8
        sem.wait s0, s6
        halt
    recv:
        sem.wait s8, s6
        halt
    """
    kernel = mkemu.compile_source(source, filename=str(tmp_path / "push.s"), hw=str(profile), mesh="2", trace=True)
    trace = kernel().report.trace
    assert (trace.dma["done"] - trace.dma["begun"]).tolist() == [128, 128]
    names = {trace.resources[i]["name"] for i in trace.dma_res["resource"]}
    assert {"chip0 HBM", "chip1 HBM"} <= names


@pytest.mark.parametrize("nops, waited", [(11, {"(outside regions)": 1}), (12, {}), (13, {})])
def test_dma_wait_cycles_counts_only_waits_a_landing_ended(emu, nops, waited):
    # A 100-byte copy issued at cycle 3 lands at 17 (start latency 10, 32 B/cycle): with
    # 11 nops the wait issues at 16 and waits a cycle; with 12 it issues at 17, as the
    # DMA lands, and waits none: that was an entry of 0 cycles.
    body = "li s2, 8192\ndma.start vmem[s2], vmem[s0], s0, s0\nli s5, 100\n" + "nop\n" * nops + "sem.wait s0, s5"
    result = emu.run(emu.kernel(body, smem="0 100 1 0 0 1 0 0")).result
    assert result.dma_wait_cycles == waited
    assert result.stall_cycles["semaphore"] == sum(waited.values())
