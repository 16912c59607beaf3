"""Memory layout rules of the back end: VMEM pitches and slots, HBM/SMEM strides, DMA shapes.

VMEM buffers are 2-D `[R, C]` per slot (1-D `[n]` is `[1, n]`). A row takes
`round_up(C, 128)` elements (so a 128-lane access never leaves its row); a slot takes
`R` rows, rounded up to a multiple of 8 when `R > 1` (so an 8-row access never leaves
its slot), its size rounded up to 512 bytes. HBM arrays are dense row-major; SMEM
buffers are dense int32. These rules are documented in docs/language.md ("Back end
rules"); everything that computes an address in the compiler goes through here.
"""

from __future__ import annotations

import math

from mkemu.dsl import ir

ALIGN_BYTES = 512
LANES = 128
SUBLANES = 8
ELEM_BYTES = {"bf16": 2, "f32": 4, "i32": 4}


def round_up(n: int, q: int) -> int:
    return -(-n // q) * q


def tile_dims(shape: tuple[int, ...]) -> tuple[int, int]:
    """A VMEM buffer's [R, C]."""
    if len(shape) == 1:
        return 1, shape[0]
    if len(shape) == 0:
        return 1, 1
    return shape[-2], shape[-1]


def pitch_bytes(dtype: str, cols: int) -> int:
    return round_up(cols, LANES) * ELEM_BYTES[dtype]


def slot_rows(rows: int) -> int:
    return rows if rows == 1 else round_up(rows, SUBLANES)


def vmem_slot_bytes(dtype: str, shape: tuple[int, ...]) -> int:
    rows, cols = tile_dims(shape)
    return round_up(slot_rows(rows) * pitch_bytes(dtype, cols), ALIGN_BYTES)


def dense_strides(shape: tuple[int, ...], elem: int) -> tuple[int, ...]:
    strides, step = [], elem
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def buffer_strides(buf: ir.Buffer) -> tuple[int, ...]:
    """Byte stride of each buffer dimension."""
    elem = ELEM_BYTES[buf.dtype]
    if buf.space in ("vmem", "var"):
        if len(buf.shape) == 1:
            return (elem,)
        return (pitch_bytes(buf.dtype, buf.shape[1]), elem)
    return dense_strides(buf.shape, elem)


def slot_stride(buf: ir.Buffer) -> int:
    if buf.space in ("vmem", "var"):
        return vmem_slot_bytes(buf.dtype, buf.shape)
    return math.prod(buf.shape) * ELEM_BYTES[buf.dtype]


class DmaShapeError(Exception):
    pass


def dma_descriptor(src: ir.Ref, dst: ir.Ref) -> tuple[int, int, int, int, int, int, int]:
    """The 7 descriptor words (inner_bytes, n1, src_stride1, dst_stride1, n2, src_stride2,
    dst_stride2) copying view `src` to view `dst` (same element count and order)."""
    elem = ELEM_BYTES[src.dtype]
    sdims = _dims(src)
    ddims = _dims(dst)
    if [n for n, _ in sdims] != [n for n, _ in ddims]:
        raise DmaShapeError(f"copy between views of shapes {list(src.shape)} and {list(dst.shape)}")
    # Innermost first: (count, src stride, dst stride).
    levels = [(n, ss, ds) for (n, ss), (_, ds) in zip(reversed(sdims), reversed(ddims))]
    inner = elem
    while levels and levels[0][1] == inner and levels[0][2] == inner:
        inner *= levels[0][0]
        levels.pop(0)
    merged: list[list[int]] = []
    for n, ss, ds in levels:
        if merged and ss == merged[-1][0] * merged[-1][1] and ds == merged[-1][0] * merged[-1][2]:
            merged[-1][0] *= n
        else:
            merged.append([n, ss, ds])
    if len(merged) > 2:
        raise DmaShapeError(f"copy of view {list(src.shape)} needs {len(merged)} strided levels "
                            "(a DMA descriptor has 2)")
    while len(merged) < 2:
        merged.append([1, 0, 0])
    (n1, ss1, ds1), (n2, ss2, ds2) = merged
    return (inner, n1, ss1, ds1, n2, ss2, ds2)


def _dims(ref: ir.Ref) -> list[tuple[int, int]]:
    strides = buffer_strides(ref.buffer)
    return [(n, st) for n, st in zip(ref.sizes, strides) if n is not None and n != 1]
