"""Memory layout rules of the back end: VMEM pitches and slots, HBM/SMEM strides, DMA shapes.

VMEM buffers are 2-D `[R, C]` per slot (1-D `[n]` is `[1, n]`). A row takes
`round_up(C, 128)` elements (so a 128-lane access never leaves its row); a slot takes
`R` rows, rounded up to a multiple of 8 when `R > 1` (so an 8-row access never leaves
its slot), its size rounded up to 512 bytes. HBM arrays are dense row-major; SMEM
buffers are dense int32. An MXFP4 array is two byte arrays, its parts: the values (two
per byte) and the scales (one per 32 rows of a column); `part_*` place them (in HBM
every matrix's values, then every matrix's scales, as isa/program.py stores them; in
VMEM a slot's value rows, then its scale rows at twice the value pitch, which is what
`mxu.ldw.mx` reads). These rules are documented in docs/language.md ("Back end
rules"); everything that computes an address in the compiler goes through here.
"""

from __future__ import annotations

import math

from mkemu.dsl import ir
from mkemu.dsl.folding import linear

ALIGN_BYTES = 512
LANES = 128
SUBLANES = 8
ELEM_BYTES = {"bf16": 2, "f32": 4, "i32": 4}
MX_BLOCK = 32                 # rows of a column sharing one MXFP4 scale
MX_PARTS = ("values", "scales")


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
    if dtype == "mxfp4":
        pitch = mx_pitch_bytes(cols)
        return round_up(rows * pitch + -(-rows // MX_BLOCK) * 2 * pitch, ALIGN_BYTES)
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
    return buf.slot_bytes


# ------------------------------------------------------------------ MXFP4 parts


def mx_pitch_bytes(cols: int) -> int:
    """A VMEM row of MXFP4 values: round_up(cols, 128) values, two per byte (a row of
    scales takes twice that)."""
    return round_up(cols, LANES) // 2


def part_shape(shape: tuple[int, ...], part: str) -> tuple[int, ...]:
    """The byte array one part of an MXFP4 array [..., K, N] is: values [..., K, N/2],
    scales [..., K/32, N]."""
    *lead, rows, cols = shape
    if part == "values":
        return (*lead, rows, cols // 2)
    return (*lead, -(-rows // MX_BLOCK), cols)


def part_strides(buf: ir.Buffer, part: str) -> tuple[int, ...]:
    """Byte stride of each dimension of a part of an MXFP4 buffer."""
    if buf.space == "vmem":
        pitch = mx_pitch_bytes(buf.shape[-1])
        return (pitch if part == "values" else 2 * pitch, 1)
    return dense_strides(part_shape(buf.shape, part), 1)


def part_base(buf: ir.Buffer, part: str) -> int:
    """Bytes from the start of an MXFP4 buffer (a slot of it) to one of its parts."""
    if part == "values":
        return 0
    rows, cols = buf.shape[-2:]
    if buf.space == "vmem":
        return rows * mx_pitch_bytes(cols)
    return math.prod(buf.shape[:-2]) * rows * cols // 2


def part_size(buf: ir.Buffer, part: str) -> int:
    """Bytes of one part of an MXFP4 buffer (of one slot, in VMEM: up to its last row)."""
    shape = part_shape(buf.shape, part)
    if buf.space == "vmem":
        return shape[0] * part_strides(buf, part)[0]
    return math.prod(shape)


def part_ref(ref: ir.Ref, part: str) -> ir.Ref:
    """The view of one part of an MXFP4 view `[..., k0 +: K, n0 +: N]` (k0 and K
    multiples of 32, n0 and N even, checked by the front end): the same buffer, with
    the part's offsets and sizes (values: rows k0.., bytes n0/2..; scales: rows
    k0/32.., bytes n0..). Only `part_strides` / `part_base` address it."""
    offsets, sizes = list(ref.offsets), list(ref.sizes)
    (k0, n0), (rows, cols) = offsets[-2:], sizes[-2:]
    if part == "values":
        offsets[-1], sizes[-1] = exact_div(n0, 2), cols // 2
    else:
        offsets[-2], sizes[-2] = exact_div(k0, MX_BLOCK), rows // MX_BLOCK
    return ir.Ref(ref.buffer, ref.slot, tuple(offsets), tuple(sizes), ref.span)


def exact_div(e, d: int):
    """e / d for a scalar expression the front end proved a multiple of d (a power of
    two): folded through sums and constant factors, else an arithmetic shift."""
    if isinstance(e, ir.Const) and e.value % d == 0:
        return ir.Const(e.value // d, e.span)
    if isinstance(e, ir.ScalarOp) and e.op == "*":
        for c, other in ((e.args[0], e.args[1]), (e.args[1], e.args[0])):
            if isinstance(c, ir.Const) and c.value % d == 0:
                q = c.value // d
                return other if q == 1 else ir.ScalarOp("*", (other, ir.Const(q, c.span)), e.span)
    if isinstance(e, ir.ScalarOp) and e.op in ("+", "-") and all(divisible(a, d) for a in e.args):
        return ir.ScalarOp(e.op, (exact_div(e.args[0], d), exact_div(e.args[1], d)), e.span)
    return ir.ScalarOp(">>", (e, ir.Const(d.bit_length() - 1, e.span)), e.span)


def divisible(e, d: int) -> bool:
    """Whether scalar expression `e` is a multiple of d for every value of its atoms."""
    return all(v % d == 0 for v in linear(e).values())


class DmaShapeError(Exception):
    pass


def dma_descriptor(src: ir.Ref, dst: ir.Ref, part: str | None = None) -> tuple[int, int, int, int, int, int, int]:
    """The 7 descriptor words (inner_bytes, n1, src_stride1, dst_stride1, n2, src_stride2,
    dst_stride2) copying view `src` to view `dst` (same element count and order); for
    MXFP4 views, `part` of them (`part_ref` views)."""
    elem = 1 if part else ELEM_BYTES[src.dtype]
    if part:
        src, dst = part_ref(src, part), part_ref(dst, part)
    sdims = _dims(src, part)
    ddims = _dims(dst, part)
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


def _dims(ref: ir.Ref, part: str | None = None) -> list[tuple[int, int]]:
    strides = part_strides(ref.buffer, part) if part else buffer_strides(ref.buffer)
    return [(n, st) for n, st in zip(ref.sizes, strides) if n is not None and n != 1]
