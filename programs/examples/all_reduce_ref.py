"""Numpy reference for all_reduce.mk, and the model of the ring collectives of
programs/lib/collectives.mk that reproduces their float32 sums bit for bit.

The library's reduction order (docs/collectives.md): participants are (chip, core);
levels are 0 = the cores of a chip, 1/2/3 = the mesh axes X/Y/Z; the reduce-scatter
visits the levels 0, 3, 2, 1. At each level the segment of blocks every ring member
holds is cut into n chunks; chunk c = [lo + len*c//n, lo + len*(c+1)//n) ends at rank
c. With two directions the first half of each chunk ([a, a + (b-a)//2)) is summed
going up the ring, acc = v[c+1] + v[c+2] + ... + v[c+n] (left to right, ranks mod n),
and the second half going down, acc = v[c-1] + v[c-2] + ... + v[c-n]. The
all-gather then copies every owner's chunk to everyone, so its bits do not depend
on the order.
"""

from __future__ import annotations

import numpy as np

RS_LEVELS = (0, 3, 2, 1)        # reduce-scatter: cores, then Z, Y, X
BLOCK = 8                        # all_reduce.mk: rows per block
DIRS = 2                         # all_reduce.mk: bidirectional rings


def level_coord(mesh, participant: tuple[int, int], level: int) -> int:
    """The participant's rank in its ring of `level`: its core, or a chip coordinate."""
    chip, core = participant
    if level == 0:
        return core
    x_dim, y_dim, _ = mesh
    return (chip % x_dim, (chip // x_dim) % y_dim, chip // (x_dim * y_dim))[level - 1]


def level_size(mesh, cores: int, level: int) -> int:
    return cores if level == 0 else mesh[level - 1]


def rings(mesh, cores: int, level: int) -> list[list[tuple[int, int]]]:
    """The rings of one level: lists of participants in rank order."""
    chips = mesh[0] * mesh[1] * mesh[2]
    groups: dict = {}
    for chip in range(chips):
        for core in range(cores):
            p = (chip, core)
            key = tuple(level_coord(mesh, p, other) for other in range(4) if other != level)
            groups.setdefault(key, []).append(p)
    return [sorted(g, key=lambda p: level_coord(mesh, p, level)) for g in groups.values()]


def chunk(lo: int, hi: int, n: int, c: int) -> tuple[int, int]:
    return lo + (hi - lo) * c // n, lo + (hi - lo) * (c + 1) // n


def part(a: int, b: int, d: int, dirs: int) -> tuple[int, int]:
    if dirs == 1:
        return a, b
    mid = a + (b - a) // 2
    return (a, mid) if d == 0 else (mid, b)


def reduce_scatter(values: dict, mesh, cores: int, nblocks: int, dirs: int, levels=RS_LEVELS):
    """Run the library's reduce-scatter on `values` (participant -> float32 array of
    blocks, [blocks, ...], updated in place). Returns participant -> (lo, hi), the
    blocks it owns; those hold the sum over all participants of `levels`."""
    seg = {p: (0, nblocks) for p in values}
    for level in levels:
        n = level_size(mesh, cores, level)
        if n == 1:
            continue
        for ring in rings(mesh, cores, level):
            lo, hi = seg[ring[0]]
            for c in range(n):
                a, b = chunk(lo, hi, n, c)
                for d in range(dirs):
                    pa, pb = part(a, b, d, dirs)
                    step = 1 if d == 0 else -1
                    acc = values[ring[(c + step) % n]][pa:pb].copy()
                    for i in range(2, n + 1):
                        acc = acc + values[ring[(c + step * i) % n]][pa:pb]
                    values[ring[c]][pa:pb] = acc
            for rank, p in enumerate(ring):
                seg[p] = chunk(lo, hi, n, rank)
    return seg


def all_reduce(values: dict, mesh, cores: int, nblocks: int, dirs: int, levels=RS_LEVELS) -> dict:
    """participant -> its array after the library's all_reduce over `levels` (blocks
    from nblocks on keep their own values)."""
    values = {p: v.copy() for p, v in values.items()}
    seg = reduce_scatter(values, mesh, cores, nblocks, dirs, levels)
    out = {}
    for p, v in values.items():
        result = v.copy()
        same_group = [q for q in values if all(level_coord(mesh, q, other) == level_coord(mesh, p, other)
                                               for other in range(4) if other not in levels)]
        for q in same_group:
            lo, hi = seg[q]
            result[lo:hi] = values[q][lo:hi]
        out[p] = result
    return out


def reference(inputs, *, chips, cores_per_chip, mesh):
    """out@chip for all_reduce.mk: every core's copy of the sum of x over all cores.
    The reduction order follows the rings of the mesh, so the mesh is required."""
    mesh = tuple(mesh)
    x = {c: inputs[f"x@{c}"] for c in range(chips)}
    cores, rows, cols = x[0].shape
    blocks = rows // BLOCK
    values = {(chip, core): np.asarray(x[chip][core], np.float32).reshape(blocks, BLOCK, cols)
              for chip in range(chips) for core in range(cores)}
    summed = all_reduce(values, mesh, cores, blocks, DIRS)
    return {f"out@{chip}": np.stack([summed[(chip, core)].reshape(rows, cols) for core in range(cores)])
            for chip in range(chips)}
