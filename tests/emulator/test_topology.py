"""The chip mesh: ids, neighbours, links, dimension-order routes, mesh text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mkemu.emulator.flows import FlowNetwork
from mkemu.emulator.topology import Mesh, parse_mesh
from mkemu.errors import ConfigError


@pytest.mark.parametrize(
    "text, dims",
    [("8", (8, 1, 1)), ("4x2", (4, 2, 1)), ("2x2x2", (2, 2, 2)), (" 4X4x4 ", (4, 4, 4)), ("16x1", (16, 1, 1))],
)
def test_parse_mesh_accepts(text, dims):
    assert parse_mesh(text) == dims


@pytest.mark.parametrize("text", ["", "x", "0", "2x0", "2x", "x2", "2x2x2x2", "a", "-1", "2.5", "2*2", "02", "2 x"])
def test_parse_mesh_rejects_with_config_error(text):
    with pytest.raises(ConfigError, match="bad mesh"):
        parse_mesh(text)


def test_mesh_validates_its_fields():
    with pytest.raises(ConfigError):
        Mesh((0, 1, 1))
    with pytest.raises(ConfigError):
        Mesh((2, 2))
    with pytest.raises(ConfigError):
        Mesh((2, 2, 2), wrap=(True, False))
    with pytest.raises(ConfigError):
        Mesh((2, 2, 2), links_per_neighbor=0)
    for dims in [(True, 1, 1), (2.0, 1, 1)]:
        with pytest.raises(ConfigError):
            Mesh(dims)


def test_mesh_dims_may_be_numpy_integers():
    import numpy as np

    # (a shape read from an array: was refused as "must be three integers")
    mesh = Mesh((np.int64(2), np.int32(2), 1))
    assert mesh.dims == (2, 2, 1) and all(type(d) is int for d in mesh.dims)
    assert Mesh(np.array([4, 1, 1])).num_chips == 4


def test_chip_ids_and_coords_round_trip():
    mesh = Mesh((4, 3, 2))
    assert mesh.num_chips == 24
    assert mesh.chip_id(1, 2, 1) == 1 + 4 * (2 + 3 * 1)
    assert [mesh.chip_id(*mesh.coords(c)) for c in range(24)] == list(range(24))
    with pytest.raises(ValueError):
        mesh.coords(24)


def test_neighbors_at_edges_of_a_line_and_a_ring():
    line = Mesh((4, 1, 1))
    assert line.neighbor(0, 0, -1) is None
    assert line.neighbor(3, 0, +1) is None
    assert line.neighbor(1, 0, +1) == 2
    assert line.neighbor(0, 1, +1) is None  # size-1 dimension
    ring = Mesh((4, 1, 1), wrap=(True, True, True))
    assert ring.neighbor(0, 0, -1) == 3
    assert ring.neighbor(3, 0, +1) == 0
    assert ring.neighbor(0, 1, +1) is None  # a wrapped size-1 dim has no neighbour


def test_link_counts_and_small_rings_add_nothing():
    assert len(Mesh((2, 2, 2)).neighbor_pairs()) == 3 * 4 * 2
    assert len(Mesh((2, 2, 2), links_per_neighbor=3).links()) == 72
    # A ring of 2 has the same links as a line of 2.
    assert Mesh((2, 2, 2), wrap=(True,) * 3).neighbor_pairs() == Mesh((2, 2, 2)).neighbor_pairs()
    assert len(Mesh((4, 4, 4), wrap=(True,) * 3).neighbor_pairs()) == 64 * 6
    assert len(Mesh((4, 4, 4)).neighbor_pairs()) == 3 * 16 * 3 * 2
    links = Mesh((3, 1, 1), links_per_neighbor=2).links()
    assert [(l.link_id, l.from_chip, l.to_chip, l.direction, l.lane) for l in links] == [
        (0, 0, 1, 1, 0), (1, 0, 1, 1, 1),
        (2, 1, 2, 1, 0), (3, 1, 2, 1, 1),
        (4, 1, 0, -1, 0), (5, 1, 0, -1, 1),
        (6, 2, 1, -1, 0), (7, 2, 1, -1, 1),
    ]  # fmt: skip


def test_a_machine_takes_the_profiles_link_count_unless_the_mesh_names_one():
    from mkemu.emulator.machine import Machine
    from mkemu.isa.hardware import load_profile

    v7 = load_profile("tpu-v7-like")
    assert v7.links_per_neighbor == 2
    assert Mesh((2, 1, 1)).links_per_neighbor is None and len(Mesh((2, 1, 1)).links()) == 2
    assert Mesh.from_text("4").links_per_neighbor is None
    assert Machine(v7, Mesh((2, 1, 1))).mesh.links_per_neighbor == 2      # (was 1)
    assert Machine(v7).mesh.links_per_neighbor == 2
    assert Machine(v7, Mesh((2, 1, 1), links_per_neighbor=3)).mesh.links_per_neighbor == 3
    machine = Machine(v7, Mesh((2, 1, 1)))
    pair = machine.links.resource(0, 1)
    assert machine.net.capacity(pair) == 2 * v7.link_bw_bytes_per_cycle


def test_buffers_are_read_and_written_only_on_chips_of_the_mesh():
    import numpy as np

    from mkemu.emulator.machine import Machine
    from mkemu.isa.asm import assemble
    from mkemu.isa.hardware import load_profile

    machine = Machine(load_profile("test"), Mesh((2, 1, 1)))
    machine.load(assemble(".buffer a i32 8x128 input\n.kernel main\n    halt\n", "a.s"))
    machine.write_buffer(1, "a", np.full((8, 128), 7, np.int32))
    assert machine.read_buffer(np.int64(1), "a")[0, 0] == 7 and machine.read_buffer(0, "a")[0, 0] == 0
    # chip -1 used to read the last chip (a Python index), chip 2 an IndexError
    for chip in (-1, 2, 1.0, True):
        with pytest.raises(ValueError, match="not a chip of this mesh"):
            machine.read_buffer(chip, "a")
        with pytest.raises(ValueError, match="not a chip of this mesh"):
            machine.write_buffer(chip, "a", np.zeros((8, 128), np.int32))


def test_routes_by_hand():
    mesh = Mesh((4, 4, 1))
    # X first then Y.
    assert mesh.route(0, mesh.chip_id(2, 1, 0)) == [(0, 1, 0, 1), (1, 2, 0, 1), (2, 6, 1, 1)]
    ring = Mesh((4, 1, 1), wrap=(True, False, False))
    assert ring.route(0, 3) == [(0, 3, 0, -1)]  # shorter way back round
    assert ring.route(0, 2) == [(0, 1, 0, 1), (1, 2, 0, 1)]  # tie goes +
    assert ring.route(2, 0) == [(2, 3, 0, 1), (3, 0, 0, 1)]
    assert ring.route(1, 1) == []
    assert ring.hops(3, 1) == 2


dims_st = st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4))
wrap_st = st.tuples(st.booleans(), st.booleans(), st.booleans())


@settings(max_examples=300, deadline=None)
@given(dims=dims_st, wrap=wrap_st, data=st.data())
def test_dimension_order_routes_are_shortest_and_contiguous(dims, wrap, data):
    mesh = Mesh(dims, wrap)
    src = data.draw(st.integers(0, mesh.num_chips - 1))
    dst = data.draw(st.integers(0, mesh.num_chips - 1))
    path = mesh.route(src, dst)
    chip = src
    axes = []
    for from_chip, to_chip, axis, direction in path:
        assert from_chip == chip
        assert mesh.neighbor(from_chip, axis, direction) == to_chip
        axes.append(axis)
        chip = to_chip
    assert chip == dst
    assert axes == sorted(axes)
    a, b = mesh.coords(src), mesh.coords(dst)
    expected = 0
    for axis in range(3):
        d = abs(a[axis] - b[axis])
        expected += min(d, dims[axis] - d) if wrap[axis] else d
    assert len(path) == expected == mesh.hops(src, dst)
    assert mesh.transfer_latency_cycles(src, dst, 7) == 7 * expected
    assert len({(h.from_chip, h.to_chip) for h in path}) == len(path)


def test_link_resources_pool_parallel_links_and_follow_routes():
    mesh = Mesh((4, 2, 1), wrap=(True, False, False), links_per_neighbor=3)
    net = FlowNetwork()
    hbm = net.add_resource("hbm", 1000.0)
    links = mesh.link_resources(net, bw_bytes_per_cycle=2.0)
    assert net.num_resources == 1 + len(mesh.neighbor_pairs())
    dst = mesh.chip_id(3, 1, 0)
    path = links.path_resources(0, dst)
    assert path == [links.resource(0, 3), links.resource(3, 7)]
    assert all(net.capacity(r) == 6.0 for r in path)
    assert net.resource_name(path[0]) == "link 0->3 (x-)"
    with pytest.raises(ValueError, match="not neighbours"):
        links.resource(0, 2)
    # Uncongested: hops × latency + bytes / (pooled bandwidth).
    net.start("t", 600, [hbm, *path], 0.0)
    t_end, _ = net.next_completion()
    assert mesh.transfer_latency_cycles(0, dst, 10) + t_end == 2 * 10 + 600 / 6.0


def test_per_core_links_give_each_core_a_port_into_the_pooled_pair():
    mesh = Mesh((3, 1, 1), links_per_neighbor=2)
    net = FlowNetwork()
    links = mesh.link_resources(net, bw_bytes_per_cycle=2.0, cores_per_chip=2, per_core=True)
    assert net.num_resources == 3 * len(mesh.neighbor_pairs())
    # A core's transfer crosses its own port into the first hop, then the pooled pairs.
    path = links.path_resources(0, 2, core=1)
    assert path == [links.port_ids[(0, 1, 1)], links.resource(0, 1), links.resource(1, 2)]
    assert [net.capacity(r) for r in path] == [2.0, 4.0, 4.0]
    assert net.resource_name(path[0]) == "core 1 port link 0->1 (x+)"
    # Both cores of chip 0 to chip 1: one port each, 2 bytes/cycle each.
    net.start("core0", 100, links.path_resources(0, 1, core=0), 0.0)
    net.start("core1", 100, links.path_resources(0, 1, core=1), 0.0)
    assert net.next_completion()[0] == 100 / 2.0
    # A second transfer of core 0 shares its port: it gets half of it.
    net.start("core0 again", 100, links.path_resources(0, 1, core=0), 0.0)
    assert net.rate("core0") == net.rate("core0 again") == 1.0 and net.rate("core1") == 2.0
    # Without per-core links there are no ports, and a route is its pairs only.
    pooled = mesh.link_resources(FlowNetwork(), bw_bytes_per_cycle=2.0, cores_per_chip=2)
    assert pooled.port_ids == {}
    assert pooled.path_resources(0, 2, core=1) == [pooled.resource(0, 1), pooled.resource(1, 2)]


def test_a_mesh_larger_than_the_emulator_takes_is_a_config_error():
    from mkemu.emulator.topology import MAX_CHIPS

    assert Mesh((8, 8, MAX_CHIPS // 64)).num_chips == MAX_CHIPS
    with pytest.raises(ConfigError, match="99,980,001 chips; the emulator takes at most 1,024"):
        Mesh.from_text("9999x9999")


@pytest.mark.parametrize("text", ["1x" + "9" * 5000, "9" * 5000, "12345x1"])
def test_a_mesh_dimension_of_many_digits_is_a_config_error(text):
    # (5000 digits: more than Python reads as an int, which raised ValueError)
    with pytest.raises(ConfigError, match="has more than 1,024 chips; the emulator takes at most 1,024") as info:
        parse_mesh(text)
    assert len(str(info.value)) < 200
