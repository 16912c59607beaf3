"""Max-min fair bandwidth sharing: hand-computed cases and random properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathlib import Path

from mkemu.cache import cache_dir
from mkemu.emulator import flows
from mkemu.emulator.flows import FlowNetwork, completion_cycle


def run_to_end(net: FlowNetwork) -> list[tuple[float, object]]:
    """Step completion by completion; return (time, key) in completion order."""
    done = []
    while (nxt := net.next_completion()) is not None:
        t, _ = nxt
        done.extend((t, key) for key in net.pop_completed(t))
    return done


def test_single_flow_time_is_size_over_capacity():
    net = FlowNetwork()
    hbm = net.add_resource("hbm", 4.0)
    net.start("a", 100, [hbm], now=0.0)
    assert net.rate("a") == 4.0
    assert net.next_completion() == (25.0, "a")
    assert net.pop_completed(24.0) == []
    assert net.remaining("a") == pytest.approx(4.0)
    assert net.pop_completed(25.0) == ["a"]
    assert net.active() == []
    assert net.bytes_through(hbm) == pytest.approx(100.0)
    assert net.busy_cycles(hbm) == 25.0


def test_two_flows_share_one_resource_equally():
    net = FlowNetwork()
    r = net.add_resource("r", 10.0)
    net.start("a", 100, [r], 0.0)
    net.start("b", 300, [r], 0.0)
    assert net.rate("a") == net.rate("b") == 5.0
    # a: 100 bytes at 5/cycle -> 20. b then has 300 - 100 = 200 left at 10/cycle -> 40.
    assert run_to_end(net) == [(20.0, "a"), (40.0, "b")]
    assert net.bytes_through(r) == pytest.approx(400.0)
    assert net.busy_cycles(r) == 40.0


def test_flow_held_by_its_own_cap_leaves_the_rest_to_others():
    net = FlowNetwork()
    r = net.add_resource("r", 10.0)
    net.start("slow", 10, [r], 0.0, cap_bytes_per_cycle=2.0)
    net.start("fast", 80, [r], 0.0)
    assert net.rate("slow") == 2.0
    assert net.rate("fast") == 8.0
    # fast has 80 - 5*8 = 40 left at 5, then runs at the full 10: ends at 9.
    assert run_to_end(net) == [(5.0, "slow"), (9.0, "fast")]


def test_cap_only_flow_needs_no_resource():
    net = FlowNetwork()
    net.start("wire", 30, [], 0.0, cap_bytes_per_cycle=3.0)
    assert run_to_end(net) == [(10.0, "wire")]


def test_classic_max_min_three_flows_one_narrow_resource():
    # A and B use the wide resource only; C crosses the wide one and a narrow one.
    # C is limited to 2 by the narrow resource; A and B split the 8 left: 4 each.
    net = FlowNetwork()
    wide = net.add_resource("wide", 10.0)
    narrow = net.add_resource("narrow", 2.0)
    net.start("A", 1000, [wide], 0.0)
    net.start("B", 1000, [wide], 0.0)
    net.start("C", 1000, [wide, narrow], 0.0)
    assert (net.rate("A"), net.rate("B"), net.rate("C")) == (4.0, 4.0, 2.0)
    assert net.load(wide) == 10.0
    assert net.load(narrow) == 2.0
    # A and B end at 250 (1000/4); C has 500 left and stays at 2 -> 250 + 250 = 500.
    assert run_to_end(net) == [(250.0, "A"), (250.0, "B"), (500.0, "C")]


def test_flow_starting_halfway_through_another():
    net = FlowNetwork()
    r = net.add_resource("r", 10.0)
    net.start("a", 100, [r], 0.0)
    net.start("b", 100, [r], 5.0)
    # At 5, a has 50 left; both at 5/cycle: a ends at 15. b has 50 left then at 10/cycle: 20.
    assert net.remaining("a") == 50.0
    assert net.rate("a") == net.rate("b") == 5.0
    assert run_to_end(net) == [(15.0, "a"), (20.0, "b")]


def test_advancing_past_a_completion_speeds_the_others_up_at_the_exact_time():
    net = FlowNetwork()
    r = net.add_resource("r", 3.0)
    net.start("a", 10, [r], 0.0)
    net.start("b", 20, [r], 0.0)
    # a ends at 10/1.5 = 6.67; b has 10 left there and runs at 3 -> ends at 10.
    t, key = net.next_completion()
    assert key == "a" and t == pytest.approx(20 / 3)
    assert completion_cycle(t) == 7
    assert net.pop_completed(7) == ["a"]
    assert net.rate("b") == 3.0
    assert net.next_completion()[0] == pytest.approx(10.0)
    assert net.pop_completed(10) == ["b"]


def test_ties_are_broken_by_start_order():
    net = FlowNetwork()
    r = net.add_resource("r", 4.0)
    for key in ("z", "y", "x"):
        net.start(key, 40, [r], 0.0)
    assert net.next_completion() == (30.0, "z")
    assert net.pop_completed(30.0) == ["z", "y", "x"]


def test_engine_round_robin_is_a_shared_resource():
    # A DMA engine of 8 B/cycle in front of a 100 B/cycle HBM: 4 descriptors get 2 each.
    net = FlowNetwork()
    hbm = net.add_resource("hbm", 100.0)
    engine = net.add_resource("dma0", 8.0)
    for i in range(4):
        net.start(i, 64, [hbm, engine], 0.0)
    assert [net.rate(i) for i in range(4)] == [2.0] * 4
    assert run_to_end(net) == [(32.0, i) for i in range(4)]


def test_zero_byte_flow_completes_at_once():
    net = FlowNetwork()
    r = net.add_resource("r", 1.0)
    net.start("empty", 0, [r], 3.0)
    assert net.next_completion() == (3.0, "empty")
    assert net.pop_completed(3.0) == ["empty"]
    assert net.busy_cycles(r) == 0.0


def test_completion_cycle_ignores_float_noise():
    assert completion_cycle(10.0) == 10
    assert completion_cycle(10.000000000001) == 10
    assert completion_cycle(10.3) == 11
    assert completion_cycle(0.0) == 0


def test_bad_requests_are_rejected():
    net = FlowNetwork()
    r = net.add_resource("r", 1.0)
    with pytest.raises(ValueError, match="no resource and has no cap"):
        net.start("a", 10, [], 0.0)
    with pytest.raises(ValueError, match="capacity"):
        net.add_resource("dead", 0.0)
    net.start("a", 10, [r], 0.0)
    with pytest.raises(ValueError, match="already"):
        net.start("a", 10, [r], 0.0)
    with pytest.raises(ValueError, match="no resource 7"):
        net.start("b", 10, [7], 0.0)
    with pytest.raises(ValueError, match="twice"):
        net.start("b", 10, [r, r], 0.0)
    net.advance(5.0)
    with pytest.raises(ValueError, match="backwards"):
        net.advance(4.0)


def scripted_run() -> list[tuple[float, object, float]]:
    net = FlowNetwork()
    rs = [net.add_resource(f"r{i}", c) for i, c in enumerate((7.0, 3.0, 11.0, 5.5))]
    log = []
    t = 0.0
    for i in range(60):
        t += (i * 7 % 5) * 0.37
        for key in net.pop_completed(t):
            log.append((t, key, 0.0))
        uses = [rs[j] for j in range(4) if (i >> j) & 1 or j == i % 4]
        cap = 1.3 if i % 3 == 0 else None
        net.start(i, 50 + (i * 37) % 200, uses, t, cap_bytes_per_cycle=cap)
        log.extend((t, key, net.rate(key)) for key in net.active())
    log.extend((t, key, 0.0) for t, key in run_to_end(net))
    log.extend((-1.0, r, net.bytes_through(r)) for r in rs)
    return log


def test_same_calls_give_identical_floats():
    assert scripted_run() == scripted_run()


# -- random properties --------------------------------------------------------------

TOL = 1e-9


def check_max_min(net: FlowNetwork, specs: dict) -> None:
    """Capacities hold, and every active flow is bottlenecked (cap or saturated resource)."""
    active = net.active()
    on: dict[int, list] = {}
    for key in active:
        for r in specs[key][1]:
            on.setdefault(r, []).append(key)
    for r, keys in on.items():
        total = sum(net.rate(k) for k in keys)
        assert total <= net.capacity(r) * (1 + TOL)
        assert net.load(r) == pytest.approx(total, rel=1e-9)
    for key in active:
        rate = net.rate(key)
        assert rate > 0
        cap, resources = specs[key][2], specs[key][1]
        if cap is not None:
            assert rate <= cap * (1 + TOL)
            if rate >= cap * (1 - TOL):
                continue
        bottlenecked = any(
            sum(net.rate(k) for k in on[r]) >= net.capacity(r) * (1 - TOL)
            and rate >= max(net.rate(k) for k in on[r]) * (1 - TOL)
            for r in resources
        )
        assert bottlenecked, f"flow {key} at {rate} is not bottlenecked anywhere"


flow_spec = st.tuples(
    st.integers(0, 40),  # start delay after the previous flow, in tenths of a cycle
    st.integers(1, 5000),  # size_bytes
    st.lists(st.integers(0, 5), max_size=4, unique=True),  # resource indices
    st.one_of(st.none(), st.floats(0.1, 20.0)),  # cap
)


def check_next_cycle(net: FlowNetwork) -> None:
    """The cycle the network keeps for its next completion is that completion's."""
    nxt = net.next_completion()
    assert net.next_completion_cycle() == (None if nxt is None else completion_cycle(nxt[0]))


@settings(max_examples=150, deadline=None)
@given(
    capacities=st.lists(st.floats(0.5, 50.0), min_size=6, max_size=6),
    flows=st.lists(flow_spec, min_size=1, max_size=30),
)
def test_random_flows_are_max_min_fair_and_deliver_every_byte(capacities, flows):
    net = FlowNetwork()
    rids = [net.add_resource(f"r{i}", c) for i, c in enumerate(capacities)]
    specs = {}
    finished: dict[int, float] = {}
    t = 0.0
    for i, (delay, size, idx, cap) in enumerate(flows):
        if not idx and cap is None:
            cap = 1.0
        t += delay / 10
        for key in net.pop_completed(t):
            finished[key] = t
        check_next_cycle(net)
        resources = [rids[j] for j in idx]
        specs[i] = (size, resources, cap, t)
        net.start(i, size, resources, t, cap_bytes_per_cycle=cap)
        check_max_min(net, specs)
        check_next_cycle(net)
    last = t
    while (nxt := net.next_completion()) is not None:
        assert nxt[0] >= last - 1e-9
        last = nxt[0]
        net.advance((last + net.now) / 2)
        check_next_cycle(net)
        for key in net.pop_completed(nxt[0]):
            finished[key] = nxt[0]
        check_max_min(net, specs)
        check_next_cycle(net)
    assert sorted(finished) == list(range(len(flows)))
    for r in rids:
        expected = sum(size for size, res, _, _ in specs.values() if r in res)
        assert net.bytes_through(r) == pytest.approx(expected, rel=1e-9, abs=1e-6)
        assert net.busy_cycles(r) <= net.now + 1e-9
    for key, (size, resources, cap, start) in specs.items():
        # No flow can beat its own uncongested time.
        fastest = min([net.capacity(r) for r in resources] + ([cap] if cap else []))
        assert finished[key] >= start + size / fastest * (1 - 1e-9)


def test_many_flows_on_long_paths_stay_max_min_fair():
    # More flows than the network's first allocation, more flows on one resource and
    # more resources per flow than its rows first hold, and enough rate changes to
    # fill and compact the heap of predicted completions.
    net = FlowNetwork()
    caps = [3.0 + (i * 7) % 11 for i in range(24)]
    rids = [net.add_resource(f"r{i}", c) for i, c in enumerate(caps)]
    specs = {}
    finished: dict[int, float] = {}
    t = 0.0
    for i in range(400):
        t += (i * 13 % 7) * 0.05
        for key in net.pop_completed(t):
            finished[key] = t
        n = 1 + (i * 5) % 17
        resources = [rids[(i * 3 + 5 * k) % len(rids)] for k in range(n)]
        resources = list(dict.fromkeys(resources))
        cap = 0.5 + i % 4 if i % 5 == 0 else None
        specs[i] = (64 + (i * 97) % 900, resources, cap, t)
        net.start(i, specs[i][0], resources, t, cap_bytes_per_cycle=cap)
        if i % 20 == 0:
            check_max_min(net, specs)
    assert len(net.active()) > 64
    while (nxt := net.next_completion()) is not None:
        for key in net.pop_completed(nxt[0]):
            finished[key] = nxt[0]
    assert sorted(finished) == list(range(400))
    for r in rids:
        expected = sum(size for size, res, _, _ in specs.values() if r in res)
        assert net.bytes_through(r) == pytest.approx(expected, rel=1e-9)


def test_the_flow_kernels_are_compiled_outside_the_source_tree():
    # The flow model's numba kernels run from a copy named by a hash of their source,
    # so a fresh install or a read-only checkout compiles them once per machine.
    assert Path(flows.fc.__file__).parent == cache_dir()
    assert Path(flows.fc.__file__).read_text() == Path(flows.__file__).with_name("flowcore.py").read_text()


def _completion_cycle_by_the_rule(t: float) -> int:
    # The rule as first written in Python: the ceiling, except within a few ulps
    # (at least 1e-9) of the nearest integer.
    import math

    nearest = round(t)
    if abs(t - nearest) <= max(64 * math.ulp(max(1.0, abs(t))), 1e-9):
        return int(nearest)
    return math.ceil(t)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.floats(0.0, 1e12, allow_nan=False, allow_infinity=False),
                 st.integers(0, 10**9).flatmap(lambda n: st.sampled_from(
                     [float(n), n + 1e-12, n - 1e-12, n + 0.5, n + 1e-9, n - 1e-9]))))
def test_compiled_completion_cycle_follows_the_rule(t):
    if t >= 0:
        assert completion_cycle(t) == _completion_cycle_by_the_rule(t)
