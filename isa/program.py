"""The `Program`: what the assembler and the compiler produce and the emulator runs.

A program is a set of kernels (machine code plus an initial SMEM image and a
source map), a launch sequence (which kernel runs, in order, with which scalar
arguments), the HBM buffers every chip has at the same addresses and, for a
compiled .mk program, its params as declared (what `--set` and tuners reach).
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from mkemu.errors import SourceSpan

# Bytes per element; MXFP4 (4-bit values plus a scale per 32 rows) is stored as its
# values then its scales (numerics.mxfp4_to_bytes), `storage_bytes` gives the size.
DTYPES = {"bf16": 2, "f32": 4, "i32": 4, "mxfp4": None}


def storage_bytes(dtype: str, shape: tuple[int, ...]) -> int:
    """Bytes an array of `dtype` and `shape` takes in HBM."""
    # (exact: a shape past int64, from a malformed program, is sized to fail the HBM check)
    count = math.prod(int(d) for d in shape)
    if dtype != "mxfp4":
        return count * DTYPES[dtype]
    from mkemu.isa.numerics import mxfp4_nbytes

    values, scales = mxfp4_nbytes(shape[-2], shape[-1])
    return math.prod(int(d) for d in shape[:-2]) * (values + scales)
BUFFER_KINDS = ("input", "output", "inout", "weight", "scratch")
INPUT_KINDS = ("input", "inout", "weight")   # written before a run (given, generated, or zeros)
HBM_ALIGN_BYTES = 512


@attrs.frozen
class Buffer:
    """An HBM array. Every chip has it at `offset_bytes` of its own HBM."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    kind: str
    offset_bytes: int
    declared: str | None = attrs.field(default=None, eq=False)   # where: "FILE:LINE", for messages

    @property
    def size_bytes(self) -> int:
        return storage_bytes(self.dtype, self.shape)

    @property
    def storage_shape(self) -> tuple[int, ...]:
        """The shape of the array `write_buffer` takes and `read_buffer` gives: the
        buffer's shape, or for MXFP4 its stored bytes."""
        return (self.size_bytes,) if self.dtype == "mxfp4" else self.shape

    def check_storage_shape(self, shape: tuple[int, ...]) -> None:
        """ValueError unless `shape` is `storage_shape` (the array a write gives)."""
        if tuple(shape) != self.storage_shape:
            raise ValueError(f"buffer {self.name}: shape {tuple(shape)} != declared {self.storage_shape}")


@attrs.frozen
class Extent:
    """The named buffer one memory operand of an instruction goes through: an access
    outside [lo, lo + size) faults naming it, even inside the memory. For an HBM
    kernel parameter `param` is the first of the two launch-argument words (low, high)
    holding its address, and lo counts from that address."""

    name: str
    space: str                   # vmem | smem | hbm
    lo: int
    size: int
    shape: tuple[int, ...]       # (slots first, for a buffer with slots)
    strides: tuple[int, ...]     # bytes per step of each index
    dtype: str
    param: int | None = None

    def describe(self, lo: int, hi: int, base: int = 0) -> str:
        """Why the bytes [lo, hi) are outside this buffer (based at `base` + self.lo)."""
        start = base + self.lo
        offset, index = lo - start, []
        for stride in self.strides:
            step, offset = divmod(offset, stride)
            index.append(step)
        shape = ", ".join(map(str, self.shape))
        return (f"{self.space.upper()} access [{lo}, {hi}) is outside buffer '{self.name}' "
                f"({self.dtype}[{shape}], {self.space.upper()} [{start}, {start + self.size})): it "
                f"starts at index [{', '.join(map(str, index))}]")


@attrs.frozen
class RangeCheck:
    """A run-time value an instruction takes that must lie in [lo, hi) (checked free
    of cycles before the instruction runs): register `reg`, described by `what` (a
    format string of `value`, `lo`, `hi` and `start` = scale * value + offset, the
    index a view's start is computed as). A value outside faults as `kind`:
    "out-of-range", or "out-of-bounds" for an index of a view that leaves its
    dimension."""

    reg: int
    lo: int
    hi: int
    what: str
    kind: str = "out-of-range"
    scale: int = 1
    offset: int = 0

    def message(self, value: int, lo: int, hi: int) -> str:
        return self.what.format(value=value, lo=lo, hi=hi, start=self.scale * value + self.offset)


@attrs.frozen(eq=False)
class Kernel:
    name: str
    code: np.ndarray                          # uint64 words
    smem_init: bytes = b""                    # initial SMEM image from address 0
    source_map: tuple[SourceSpan | None, ...] = ()   # per instruction, may be empty
    source_text: dict[str, list[str]] = attrs.Factory(dict)  # file -> lines, for listings
    labels: dict[str, int] = attrs.Factory(dict)
    regions: tuple[str, ...] = ()             # region id -> name
    vmem_bytes: int = 0                       # statically allocated
    smem_bytes: int = 0
    allocation: tuple[str, ...] = ()          # human-readable allocation map lines
    # pc -> the buffers its memory operands go through, in the order of the row's
    # footprints (a DMA: source, destination); None where an operand is not checked.
    extents: dict[int, tuple[Extent | None, ...]] = attrs.Factory(dict)
    ranges: dict[int, RangeCheck] = attrs.Factory(dict)   # pc -> a value it must check
    # semaphore id -> its name in the source: "'ws[1]'", "'credit[3]' of fn all_reduce"
    semaphores: tuple[str, ...] = ()
    # pc -> the fn calls an instruction of inlined code comes from, innermost first, as
    # the compiler's errors name them: "in fn 'g' inlined at t.mk:4:5, in fn 'f' inlined
    # at t.mk:9:5" (then a generic kernel's instance's launch); absent for code written
    # in the kernel itself
    calls: dict[int, str] = attrs.Factory(dict)

    def semaphore_named(self, sem: int, how: str = " (semaphore {sem} is {name})") -> str:
        """`how` filled in with semaphore `sem`'s source name when the compiler gave one
        (" (semaphore 2 is 'ws[1]')"), else nothing: what a message adds after naming it
        by number."""
        name = self.semaphores[sem] if 0 <= sem < len(self.semaphores) else None
        return how.format(sem=sem, name=name) if name else ""

    def calls_of(self, pc: int) -> str | None:
        """The calls instruction `pc` of inlined code comes from (`calls`), or None: what a
        run-time fault adds below its source line (`EmulatorFault.context`)."""
        return self.calls.get(pc)

    def source_of(self, pc: int) -> SourceSpan | None:
        return self.source_map[pc] if 0 <= pc < len(self.source_map) else None

    def source_line(self, pc: int) -> str | None:
        span = self.source_of(pc)
        if span is None:
            return None
        lines = self.source_text.get(span.file, [])
        text = lines[span.line - 1].strip() if 0 < span.line <= len(lines) else ""
        return f"{span}: {text}" if text else str(span)


@attrs.frozen
class Launch:
    kernel: str
    args: tuple[int, ...] = ()   # 32-bit words of the SMEM argument block (word i at byte 4*i)
    span: SourceSpan | None = None   # the launch statement (None: a program without one)


@attrs.frozen
class ParamInfo:
    """A compile-time `param` of a .mk program, as declared: what `--set NAME=` reaches."""

    name: str
    value: int                              # the value this build used
    default: int
    values: tuple[int, ...] | None          # the declared values (`in ...`); None: any integer
    description: str
    span: SourceSpan                        # the declaration


def values_text(values: tuple[int, ...]) -> str:
    """A param's declared values for a reader: all of them, or the ends of a long list."""
    if len(values) > 8:
        return f"{', '.join(map(str, values[:3]))}, ..., {values[-1]} ({len(values)} values)"
    return ", ".join(map(str, values))


@attrs.frozen(eq=False)
class Program:
    kernels: dict[str, Kernel]
    launches: tuple[Launch, ...]
    buffers: tuple[Buffer, ...] = ()
    reference: str | None = None      # "file.py:function" naming the numpy reference
    path: str | None = None
    params: tuple[ParamInfo, ...] = ()   # a compiled .mk program's params

    @property
    def hbm_bytes(self) -> int:
        return max((b.offset_bytes + b.size_bytes for b in self.buffers), default=0)

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)


def layout_buffers(specs: list[tuple[str, str, tuple[int, ...], str]],
                   declared: list[str] | None = None) -> tuple[Buffer, ...]:
    """Place (name, dtype, shape, kind) buffers one after another, aligned; `declared`:
    where the program declares each ("FILE:LINE")."""
    out, offset = [], 0
    for i, (name, dtype, shape, kind) in enumerate(specs):
        buf = Buffer(name, dtype, tuple(shape), kind, offset, declared[i] if declared else None)
        out.append(buf)
        offset += -(-buf.size_bytes // HBM_ALIGN_BYTES) * HBM_ALIGN_BYTES
    return tuple(out)
