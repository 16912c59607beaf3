"""The chip mesh: coordinates, neighbours, directed links and dimension-order routes.

Chips sit on an X×Y×Z grid; chip id = x + X*(y + Y*z). Each dimension is a line or,
if wrapped, a ring (torus). Wrapping a dimension of size 1 or 2 adds no link: on
size 1 a chip would be its own neighbour (there is none), and on size 2 the
wrap-around neighbour is the same chip as the direct one, so the ring uses the same
pair of links as the line.

Links are directed: between every pair of neighbouring chips there are
`links_per_neighbor` parallel links in each direction. For bandwidth sharing the
parallel links of one (from, to) pair form a single resource of
`links_per_neighbor × bw` bytes per cycle, shared by every transfer that crosses the
pair (forwarded ones included). With per-core links, each core of a chip also has a
port of its own into each direction, of one link's bandwidth: a transfer crosses its
issuing core's port at its first hop, so one core gets at most `bw` into a direction
while the cores of a chip together may use the whole pair.

Routing is dimension order: first along X, then Y, then Z. On a ring the route takes
the shorter way round; when both ways are equally long (distance exactly n/2) it
goes in the + direction. On a line it goes straight. Latency of an uncongested
transfer is `hops × hop_latency_cycles + size_bytes / bw`; the first term is
`transfer_latency_cycles`, the second the flow model's (`emulator/flows.py`).
"""

from __future__ import annotations

import numbers
import re
from typing import NamedTuple

import attrs

from mkemu.emulator.flows import FlowNetwork
from mkemu.errors import ConfigError, grouped, shown
from mkemu.isa.hardware import MAX_CHIPS

AXES = ("x", "y", "z")

_MESH_TEXT = re.compile(r"[1-9][0-9]*(x[1-9][0-9]*){0,2}")


def parse_mesh(text: str) -> tuple[int, int, int]:
    """Parse "8", "4x2" or "2x2x2" into (X, Y, Z), padding missing dims with 1."""
    cleaned = text.strip().lower().replace(" ", "") if isinstance(text, str) else ""
    if not _MESH_TEXT.fullmatch(cleaned):
        raise ConfigError(
            f"bad mesh {text!r}: expected 1 to 3 positive integers joined by 'x', like '8', '4x2' or '2x2x2'",
            key="mesh",
        )
    parts = cleaned.split("x")
    if any(len(part) > len(str(MAX_CHIPS)) for part in parts):
        # (a dimension of more digits is past the limit; and Python refuses to read one
        # of thousands of digits as an int)
        shown = cleaned if len(cleaned) <= 40 else cleaned[:40] + "..."
        raise ConfigError(f"mesh {shown} has more than {MAX_CHIPS:,} chips; the emulator takes at most "
                          f"{MAX_CHIPS:,}", key="mesh")
    dims = [int(part) for part in parts]
    dims += [1] * (3 - len(dims))
    return dims[0], dims[1], dims[2]


class Hop(NamedTuple):
    """One step of a route: from one chip to its neighbour along `axis` (0=X, 1=Y, 2=Z)."""

    from_chip: int
    to_chip: int
    axis: int
    direction: int  # +1 or -1


@attrs.frozen
class Link:
    """One directed physical link; `lane` numbers the parallel links of a chip pair."""

    link_id: int
    from_chip: int
    to_chip: int
    axis: int
    direction: int
    lane: int




def _int_tuple(value) -> tuple:
    """A sequence as a tuple, numpy integers as the ints they are (bools stay, to be refused)."""
    return tuple(int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v
                 for v in value)


def _check_dims(instance, attribute, value) -> None:
    if len(value) != 3 or any(type(d) is not int or d < 1 for d in value):
        raise ConfigError(f"mesh dims must be three integers >= 1, got {shown(value)}", key="mesh")
    if max(value).bit_length() > 64:     # (a dim too long to write out, too)
        raise ConfigError(f"mesh dim {shown(max(value), 40)} is more chips than the emulator takes ({MAX_CHIPS:,} "
                          "at most)", key="mesh")
    if value[0] * value[1] * value[2] > MAX_CHIPS:
        raise ConfigError(f"mesh {'x'.join(map(shown, value))} has {grouped(value[0] * value[1] * value[2])} "
                          f"chips; the emulator takes at most {MAX_CHIPS:,}", key="mesh")


def _check_wrap(instance, attribute, value) -> None:
    if len(value) != 3 or any(type(w) is not bool for w in value):
        raise ConfigError(f"mesh wrap must be three booleans, got {value!r}", key="wrap")


def _check_links(instance, attribute, value) -> None:
    if value is None:
        return
    if type(value) is not int or value < 1:
        raise ConfigError(f"links_per_neighbor must be an integer >= 1, got {value!r}", key="links_per_neighbor")


@attrs.frozen
class Mesh:
    """An X×Y×Z mesh of chips, each dimension a line or (if wrapped) a ring.

    `links_per_neighbor` None (the default) means the hardware profile's: a `Machine`
    given such a mesh uses its profile's count (`with_links`); on its own the mesh
    counts one link per direction."""

    dims: tuple[int, int, int] = attrs.field(converter=_int_tuple, validator=_check_dims)
    wrap: tuple[bool, bool, bool] = attrs.field(default=(False, False, False), converter=tuple, validator=_check_wrap)
    links_per_neighbor: int | None = attrs.field(default=None, validator=_check_links)

    @classmethod
    def from_text(cls, text: str, wrap: tuple[bool, bool, bool] = (False, False, False),
                  links_per_neighbor: int | None = None) -> Mesh:
        return cls(parse_mesh(text), wrap, links_per_neighbor)

    def with_links(self, links_per_neighbor: int) -> Mesh:
        """This mesh, its link count the given one (a profile's) unless it names its own."""
        if self.links_per_neighbor is not None:
            return self
        return attrs.evolve(self, links_per_neighbor=links_per_neighbor)

    @property
    def link_count(self) -> int:
        """Parallel links per direction of a neighbour pair (1 if left to a profile)."""
        return 1 if self.links_per_neighbor is None else self.links_per_neighbor

    @property
    def num_chips(self) -> int:
        x, y, z = self.dims
        return x * y * z

    def chip_id(self, x: int, y: int, z: int) -> int:
        X, Y, Z = self.dims
        if not (0 <= x < X and 0 <= y < Y and 0 <= z < Z):
            raise ValueError(f"coordinates ({x}, {y}, {z}) outside mesh {X}x{Y}x{Z}")
        return x + X * (y + Y * z)

    def coords(self, chip: int) -> tuple[int, int, int]:
        self._check_chip(chip)
        X, Y, _ = self.dims
        return chip % X, (chip // X) % Y, chip // (X * Y)

    def neighbor(self, chip: int, axis: int, offset: int) -> int | None:
        """The chip `offset` steps along `axis` (wrapping on a ring); None if off the edge.

        A chip is never its own neighbour: an offset that lands back on `chip`
        (size-1 dimension, or a full turn of a ring) gives None.
        """
        c = list(self.coords(chip))
        n = self.dims[axis]
        pos = c[axis] + offset
        if self.wrap[axis]:
            pos %= n
        elif not 0 <= pos < n:
            return None
        if pos == c[axis]:
            return None
        c[axis] = pos
        return self.chip_id(*c)

    def _axis_steps(self, axis: int, src: int, dst: int) -> tuple[int, int]:
        """(direction, steps) from coordinate src to dst along one axis."""
        n = self.dims[axis]
        if src == dst:
            return 1, 0
        if self.wrap[axis]:
            forward = (dst - src) % n
            if forward <= n - forward:
                return 1, forward
            return -1, n - forward
        return (1, dst - src) if dst > src else (-1, src - dst)

    def route(self, src_chip: int, dst_chip: int) -> list[Hop]:
        """Dimension-order route (X, then Y, then Z); empty if src == dst."""
        here = list(self.coords(src_chip))
        target = self.coords(dst_chip)
        hops: list[Hop] = []
        chip = src_chip
        for axis in range(3):
            direction, steps = self._axis_steps(axis, here[axis], target[axis])
            n = self.dims[axis]
            for _ in range(steps):
                here[axis] = (here[axis] + direction) % n
                nxt = self.chip_id(*here)
                hops.append(Hop(chip, nxt, axis, direction))
                chip = nxt
        return hops

    def hops(self, src_chip: int, dst_chip: int) -> int:
        a, b = self.coords(src_chip), self.coords(dst_chip)
        return sum(self._axis_steps(axis, a[axis], b[axis])[1] for axis in range(3))

    def diameter(self) -> int:
        """The most hops between two chips (chip 0 is a corner: the farthest from it)."""
        return max(self.hops(0, chip) for chip in range(self.num_chips))

    def longest_path_cycles(self, profile) -> int:
        """The longest core-to-core path latency of this mesh of `profile`'s chips: the
        diameter times the hop latency, or on one chip of several cores the on-chip path."""
        return max(self.diameter() * profile.hop_latency_cycles,
                   profile.sibling_latency_cycles if profile.cores_per_chip > 1 else 0)

    def transfer_latency_cycles(self, src_chip: int, dst_chip: int, hop_latency_cycles: float) -> float:
        """The fixed part of a transfer's time: hops × per-hop latency (bandwidth is the flows')."""
        return self.hops(src_chip, dst_chip) * hop_latency_cycles

    def neighbor_pairs(self) -> list[tuple[int, int, int, int]]:
        """Every directed neighbour pair once, as (from_chip, to_chip, axis, direction).

        Order: by from_chip, then axis, then + before -. On a size-2 ring the wrap
        neighbour repeats the direct one and is not listed again.
        """
        pairs = []
        seen: dict[tuple[int, int], None] = {}
        for chip in range(self.num_chips):
            for axis in range(3):
                for direction in (1, -1):
                    nb = self.neighbor(chip, axis, direction)
                    if nb is None or (chip, nb) in seen:
                        continue
                    seen[(chip, nb)] = None
                    # Label by the way the link points, so a size-2 ring's wrap link
                    # reads like the line's: only a step of more than one wraps.
                    step = self.coords(nb)[axis] - self.coords(chip)[axis]
                    label = (1 if step > 0 else -1) * (1 if abs(step) == 1 else -1)
                    pairs.append((chip, nb, axis, label))
        return pairs

    def links(self) -> list[Link]:
        """All physical directed links, ids 0.. in `neighbor_pairs` order, lanes innermost."""
        out = []
        for chip, nb, axis, direction in self.neighbor_pairs():
            for lane in range(self.link_count):
                out.append(Link(len(out), chip, nb, axis, direction, lane))
        return out

    def link_resources(self, net: FlowNetwork, bw_bytes_per_cycle: float, cores_per_chip: int = 1,
                       per_core: bool = False) -> MeshLinks:
        """Register one flow resource per directed neighbour pair, and with `per_core`
        one per core and direction out of its chip (its port).

        A pair's capacity is `links_per_neighbor × bw_bytes_per_cycle` (the parallel
        links of a pair are pooled); a port's is `bw_bytes_per_cycle`. Returns the map
        used to turn routes into resource lists.
        """
        ids, ports = {}, {}
        for chip, nb, axis, direction in self.neighbor_pairs():
            sign = "+" if direction > 0 else "-"
            name = f"link {chip}->{nb} ({AXES[axis]}{sign})"
            ids[(chip, nb)] = net.add_resource(name, self.link_count * bw_bytes_per_cycle)
            for core in range(cores_per_chip if per_core else 0):
                ports[(chip, nb, core)] = net.add_resource(f"core {core} port {name}", bw_bytes_per_cycle)
        return MeshLinks(self, ids, ports)

    def _check_chip(self, chip: int) -> None:
        if not 0 <= chip < self.num_chips:
            raise ValueError(f"chip {chip} outside mesh {'x'.join(map(str, self.dims))} ({self.num_chips} chips)")


@attrs.frozen
class MeshLinks:
    """The flow resources of a mesh's links, keyed by directed chip pair, and of the
    cores' ports into them (empty without per-core links), keyed by (chip, next chip,
    core index)."""

    mesh: Mesh
    resource_ids: dict[tuple[int, int], int]
    port_ids: dict[tuple[int, int, int], int] = attrs.field(factory=dict)

    def resource(self, from_chip: int, to_chip: int) -> int:
        try:
            return self.resource_ids[(from_chip, to_chip)]
        except KeyError:
            raise ValueError(f"chips {from_chip} and {to_chip} are not neighbours") from None

    def path_resources(self, src_chip: int, dst_chip: int, core: int = 0) -> list[int]:
        """Resource ids of the links on the dimension-order route, in path order; with
        per-core links the issuing core's (index `core`) port into the first hop first."""
        route = self.mesh.route(src_chip, dst_chip)
        path = [self.resource_ids[(h.from_chip, h.to_chip)] for h in route]
        if self.port_ids and route:
            path.insert(0, self.port_ids[(src_chip, route[0].to_chip, core)])
        return path
