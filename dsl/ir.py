"""The checked program: what the front end hands to the back end.

Everything here is resolved: names point at entity objects (`Buffer`, `Semaphore`,
`ScalarVar`, `TileValue`), params and consts are folded to ints, fn calls are inlined
(their locals renamed `fn#N.name`), statically-decided `if`s are reduced to the taken
branch, every slice is a `Ref` with one offset expression and one static size per
dimension of its buffer, and every tile expression carries its dtype and 2-D shape.

Entities compare by identity (two buffers with the same name in different inlined
calls are different buffers). Every node carries the `SourceSpan` of the source text
it came from (inside an fn body for inlined code), for the back end's source map.

Scalars are int32; a scalar that the language types as a bool (a comparison, `&&`,
`||`, `!`, `true`, a `bool` variable or parameter) holds 0 or 1 and says so in its
`dtype` (`scalar_dtype(e)`); the back end treats both alike. Tile dtypes are `bf16`, `f32`, `i32` and `bool` (masks); a `bf16`
tile holds bf16-exact values (the registers hold f32). Tiles are always 2-D.

Buffers may also hold `mxfp4` (4-bit weights with a scale per 32 rows, HBM and VMEM
only): such a view is only ever copied (a `Dma` of both its parts) or the right
operand of a `Matmul` (a `Load` of dtype mxfp4 that no other node reads).
"""

from __future__ import annotations

import math

import attrs

from mkemu.errors import SourceSpan
from mkemu.isa.program import ParamInfo, storage_bytes

DTYPE_BYTES = {"bf16": 2, "f32": 4, "i32": 4}

# ------------------------------------------------------------------- entities


@attrs.frozen(eq=False)
class Buffer:
    """A memory region. space: hbm | vmem | smem | var (a compiler-placed tile).

    `slots` is None for a single buffer, N for an array of N equal buffers (`w[2]`).
    role: "param" (kernel HBM parameter), "local" (kernel/fn local),
    "input" / "output" / "scratch" (host-level HBM arrays).
    `context`: what made a local one whose `span` alone does not say, as the front end's
    errors put it (" (in fn 'f' inlined at t.mk:9:5)", a pipeline's slots, a struct
    instance's member), for the back end's errors at its declaration.
    """

    name: str
    space: str
    dtype: str
    shape: tuple[int, ...]
    slots: int | None
    span: SourceSpan
    role: str = "local"
    context: str = ""

    @property
    def slot_bytes(self) -> int:
        return data_bytes(self.dtype, self.shape)

    @property
    def size_bytes(self) -> int:
        return self.slot_bytes * (self.slots or 1)


@attrs.frozen(eq=False)
class Semaphore:
    """A semaphore, or an array of `count` semaphores (count None: a single one).
    `context`: as for a `Buffer`."""

    name: str
    count: int | None
    span: SourceSpan
    context: str = ""


@attrs.frozen(eq=False)
class ScalarVar:
    """An int32 scalar variable. kind: param | let | var (mutable) | loop.
    dtype: i32, or bool for a variable that holds 0/1 as a truth value."""

    name: str
    kind: str
    span: SourceSpan
    dtype: str = "i32"


@attrs.frozen(eq=False)
class TileValue:
    """An immutable tile bound by `let`; the back end decides where it lives."""

    name: str
    dtype: str
    shape: tuple[int, int]
    span: SourceSpan


# --------------------------------------------------------- scalar expressions


@attrs.frozen
class Const:
    """A compile-time integer; dtype bool for a folded truth value (0 or 1)."""

    value: int
    span: SourceSpan
    dtype: str = "i32"


@attrs.frozen
class FloatConst:
    """A float literal not yet given a tile (only inside the front end and Literal)."""

    value: float
    span: SourceSpan


@attrs.frozen
class ScalarRead:
    var: ScalarVar
    span: SourceSpan


@attrs.frozen
class ScalarOp:
    """op: + - * / % << >> & | ^ == != < <= > >= && || (binary), neg ! (unary),
    min max (binary), select (cond, a, b: a where cond is non-zero, else b; each
    argument evaluated once). Division and remainder truncate toward zero (C semantics).
    `dtype` overrides the type the op implies (`i32(flag)` keeps the comparison)."""

    op: str
    args: tuple["ScalarExpr", ...]
    span: SourceSpan
    dtype: str | None = None


@attrs.frozen
class SmemLoad:
    """Read one int32 from SMEM; `ref` has every dimension indexed. `guarded`: a side of
    a run-time `select` whose indices the front end proved in range under that side's
    condition (it is read whichever side is picked, so it has no run-time bounds check)."""

    ref: "Ref"
    span: SourceSpan
    guarded: bool = False


@attrs.frozen
class TileToScalar:
    """`scalar(t)`: move the single element of an i32 [1, 1] tile into a scalar."""

    tile: "TileExpr"
    span: SourceSpan


@attrs.frozen
class Spmd:
    """chip_id() core_id() num_chips() num_cores() mesh_dim(axis) chip_coord(axis)
    peer(axis, offset) global_core(chip, core). `peer` and `global_core` give a global
    core id (chip * cores + core); axis arguments are compile-time ints 0..2."""

    name: str
    args: tuple["ScalarExpr", ...]
    span: SourceSpan


ScalarExpr = Const | ScalarRead | ScalarOp | SmemLoad | TileToScalar | Spmd
SCALAR_NODES = (Const, ScalarRead, ScalarOp, SmemLoad, TileToScalar, Spmd)
BOOL_OPS = ("==", "!=", "<", "<=", ">", ">=", "&&", "||", "!")


def scalar_dtype(e: ScalarExpr) -> str:
    """`bool` for a truth value, else `i32` (both are int32 at run time)."""
    match e:
        case Const():
            return e.dtype
        case ScalarRead():
            return e.var.dtype
        case ScalarOp():
            if e.dtype is not None:
                return e.dtype
            if e.op == "select":
                return scalar_dtype(e.args[1])
            return "bool" if e.op in BOOL_OPS else "i32"
        case TileToScalar():
            return "bool" if e.tile.dtype == "bool" else "i32"
    return "i32"

# ----------------------------------------------------------------- references


@attrs.frozen
class Ref:
    """A view of a buffer: `offsets[d]` and `sizes[d]` for every buffer dimension d.

    sizes[d] None means the dimension is indexed by a point (dropped from the view's
    shape); otherwise it is a static length. `slot` selects the buffer of an array.
    Offsets are scalar expressions (Const when static); the front end has checked
    every static or loop-affine offset against the bounds.
    """

    buffer: Buffer
    slot: ScalarExpr | None
    offsets: tuple[ScalarExpr, ...]
    sizes: tuple[int | None, ...]
    span: SourceSpan

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s for s in self.sizes if s is not None)

    @property
    def dtype(self) -> str:
        return self.buffer.dtype

    @property
    def size_bytes(self) -> int:
        """The bytes a copy of the view moves (MXFP4: its values and its scales)."""
        return data_bytes(self.dtype, self.shape)

    @property
    def tile_shape(self) -> tuple[int, int]:
        return tile_shape(self.shape)


def data_bytes(dtype: str, shape: tuple[int, ...]) -> int:
    """The bytes of an array of `dtype` and `shape`, dense (MXFP4: values and scales)."""
    if dtype == "mxfp4":
        return storage_bytes(dtype, (1, 1, *shape)[-max(2, len(shape)):])
    return math.prod(shape) * DTYPE_BYTES[dtype]


def tile_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """The 2-D shape a view has in a tile expression: [] -> [1,1], [n] -> [1,n]."""
    if len(shape) == 0:
        return (1, 1)
    if len(shape) == 1:
        return (1, shape[0])
    return (shape[-2], shape[-1])


@attrs.frozen
class SemRef:
    """One semaphore: `sem`, or element `index` of a semaphore array."""

    sem: Semaphore
    index: ScalarExpr | None
    span: SourceSpan


# ----------------------------------------------------------- tile expressions
# Every tile node has `dtype` and `shape` (rows, cols).


@attrs.frozen
class Load:
    ref: Ref
    dtype: str
    shape: tuple[int, int]
    span: SourceSpan


@attrs.frozen
class ValueRead:
    value: TileValue
    dtype: str
    shape: tuple[int, int]
    span: SourceSpan


@attrs.frozen
class Literal:
    """A constant broadcast to any shape (shape [1, 1] until broadcast)."""

    value: float | int
    dtype: str
    shape: tuple[int, int]
    span: SourceSpan


@attrs.frozen
class Splat:
    """A runtime int32 scalar as an i32 [1, 1] tile."""

    scalar: ScalarExpr
    dtype: str
    shape: tuple[int, int]
    span: SourceSpan


@attrs.frozen
class Elementwise:
    """op with broadcasting over args (each of shape equal to `shape` or 1 per dim).

    Binary: + - * / % << >> & | ^ (arithmetic/bitwise), == != < <= > >= (-> bool).
    Unary: neg ! exp log exp2 log2 sqrt rsqrt recip sigmoid tanh silu abs.
    Other: max min (2 args), where (cond, a, b).
    """

    op: str
    args: tuple["TileExpr", ...]
    dtype: str
    shape: tuple[int, int]
    span: SourceSpan


@attrs.frozen
class Convert:
    """Conversion to `dtype`: to bf16 rounds to nearest even; to i32 truncates."""

    arg: "TileExpr"
    dtype: str
    shape: tuple[int, int]
    span: SourceSpan


@attrs.frozen
class Reduce:
    """op: sum max min argmax along `axis`, keeping the dimension (size 1)."""

    op: str
    arg: "TileExpr"
    axis: int
    dtype: str
    shape: tuple[int, int]
    span: SourceSpan


@attrs.frozen
class Matmul:
    """lhs [M, K] x rhs [K, N] -> f32 [M, N]; operands both bf16 or both f32, or a bf16
    lhs and an mxfp4 rhs (a `Load` of a VMEM view)."""

    lhs: "TileExpr"
    rhs: "TileExpr"
    dtype: str
    shape: tuple[int, int]
    span: SourceSpan


@attrs.frozen
class Transpose:
    arg: "TileExpr"
    dtype: str
    shape: tuple[int, int]
    span: SourceSpan


@attrs.frozen
class Iota:
    """i32 indices along `axis`: shape [n, 1] (axis 0) or [1, n] (axis 1)."""

    axis: int
    dtype: str
    shape: tuple[int, int]
    span: SourceSpan


@attrs.frozen
class TileSlice:
    """A static window of a tile value: rows starts[0].., cols starts[1].."""

    arg: "TileExpr"
    starts: tuple[int, int]
    dtype: str
    shape: tuple[int, int]
    span: SourceSpan


TileExpr = (
    Load | ValueRead | Literal | Splat | Elementwise | Convert | Reduce | Matmul
    | Transpose | Iota | TileSlice
)
TILE_NODES = (
    Load, ValueRead, Literal, Splat, Elementwise, Convert, Reduce, Matmul, Transpose,
    Iota, TileSlice,
)

# ------------------------------------------------------------------ statements


@attrs.frozen
class Dma:
    """A copy description. Local: `sem` counts the bytes landing in dst.

    Remote (`target` set: a global core id): dst is the buffer of the same name on
    core `target`; `sem` is the local send semaphore, `recv_sem` the receiving
    core's semaphore (the same semaphore entity, on the other core).
    """

    src: Ref
    dst: Ref
    sem: SemRef
    target: ScalarExpr | None
    recv_sem: SemRef | None
    size_bytes: int
    span: SourceSpan


@attrs.frozen
class Statement:
    """What every statement has besides its own fields: its `context`, for the back end's
    errors in it, as the front end's put it: the fn call an inlined statement comes from,
    or the launch of a generic kernel's instance (" (in fn 'f' inlined at t.mk:9:5)").
    Empty in code written in the kernel itself, and in the statements a pipeline makes
    inside its own loops and ifs, which are in the context of the statement around them.
    `calls` is the whole chain, innermost call first, for run-time faults ("in fn 'g'
    inlined at t.mk:4:5, in fn 'f' inlined at t.mk:9:5"; "" where `context` is "")."""

    context: str = attrs.field(default="", kw_only=True)
    calls: str = attrs.field(default="", kw_only=True)


@attrs.frozen
class LetScalar(Statement):
    var: ScalarVar
    value: ScalarExpr
    span: SourceSpan


@attrs.frozen
class SetScalar(Statement):
    """Assignment to a `var` scalar (also its initialiser)."""

    var: ScalarVar
    value: ScalarExpr
    span: SourceSpan


@attrs.frozen
class LetTile(Statement):
    value: TileValue
    expr: TileExpr
    span: SourceSpan


@attrs.frozen
class StoreTile(Statement):
    """ref = value (op None) or ref = ref op value (op + - * /); value broadcasts to
    `ref.tile_shape` and has the buffer's dtype."""

    ref: Ref
    value: TileExpr
    op: str | None
    span: SourceSpan


@attrs.frozen
class StoreSmem(Statement):
    ref: Ref
    value: ScalarExpr
    span: SourceSpan


@attrs.frozen
class DmaStart(Statement):
    dma: Dma
    span: SourceSpan


@attrs.frozen
class DmaWait(Statement):
    """side: "local" (a local copy landed), "send" (a remote copy left this core),
    "recv" (the bytes of the matching remote copy arrived here, on dma.recv_sem)."""

    dma: Dma
    side: str
    span: SourceSpan


@attrs.frozen
class Signal(Statement):
    """Add `amount` to a semaphore, on core `target` if set (else locally)."""

    sem: SemRef
    amount: ScalarExpr
    target: ScalarExpr | None
    span: SourceSpan


@attrs.frozen
class SemWait(Statement):
    """Block until the semaphore holds at least `amount`, then subtract it."""

    sem: SemRef
    amount: ScalarExpr
    span: SourceSpan


@attrs.frozen
class Barrier(Statement):
    """All cores of all chips (axis None) or of the chips along one mesh axis."""

    axis: int | None
    span: SourceSpan


@attrs.frozen
class For(Statement):
    """for var in start..stop step step (step a positive compile-time int)."""

    var: ScalarVar
    start: ScalarExpr
    stop: ScalarExpr
    step: int
    body: tuple["Stmt", ...]
    span: SourceSpan


@attrs.frozen
class If(Statement):
    cond: ScalarExpr
    then: tuple["Stmt", ...]
    orelse: tuple["Stmt", ...]
    span: SourceSpan


@attrs.frozen
class Region(Statement):
    name: str
    index: ScalarExpr | None
    body: tuple["Stmt", ...]
    span: SourceSpan


Stmt = (
    LetScalar | SetScalar | LetTile | StoreTile | StoreSmem | DmaStart | DmaWait
    | Signal | SemWait | Barrier | For | If | Region
)

# --------------------------------------------------------------------- program


@attrs.frozen(eq=False)
class Kernel:
    """One kernel with fn calls inlined. `buffers` lists every local buffer (vmem,
    smem, var), including those of inlined fns; `sems` every semaphore."""

    name: str
    params: tuple[Buffer | ScalarVar, ...]
    buffers: tuple[Buffer, ...]
    sems: tuple[Semaphore, ...]
    body: tuple[Stmt, ...]
    span: SourceSpan


@attrs.frozen
class Launch:
    """Run `kernel` on every core; args follow kernel.params: a `Ref` with static
    offsets into a host array for an HBM parameter, an int for a scalar."""

    kernel: Kernel
    args: tuple[Ref | int, ...]
    span: SourceSpan


@attrs.frozen
class Host:
    """The launch sequence, host loops unrolled. arrays: role input/output/scratch."""

    arrays: tuple[Buffer, ...]
    launches: tuple[Launch, ...]
    span: SourceSpan

    @property
    def inputs(self) -> tuple[Buffer, ...]:
        return tuple(b for b in self.arrays if b.role == "input")

    @property
    def outputs(self) -> tuple[Buffer, ...]:
        return tuple(b for b in self.arrays if b.role == "output")


@attrs.frozen
class ReferenceFn:
    """The numpy reference: `function` in the Python file `path`, or in the importable
    module `module` (then `path` is None)."""

    path: str | None
    function: str
    span: SourceSpan
    module: str | None = None


@attrs.frozen(eq=False)
class Program:
    main_file: str
    params: dict[str, int]
    consts: dict[str, int]
    kernels: dict[str, Kernel]
    host: Host | None
    reference: ReferenceFn | None
    sources: dict[str, str]
    param_info: tuple[ParamInfo, ...] = ()   # every param: value, default, declared values
    # name -> span of each generic kernel's declaration: it is made only by launches, so a
    # program without a host block may not declare one (checked with the host).
    generic_kernels: dict[str, SourceSpan] = attrs.field(factory=dict)
