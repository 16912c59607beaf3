"""A numpy interpreter of the checked IR (`mkemu.dsl.ir`): the tests' second opinion.

It runs a program's host launch sequence on one core, statement by statement, with
the back-end contract written out directly in numpy and `mkemu.isa.numerics`:

- elementwise f32 operations are IEEE float32 numpy operations in the order written;
  transcendentals, f32 max/min and conversions are the `numerics` functions;
- `sum`/`max`/`min` along axis 1 are the numerics halving tree over the columns padded
  with the identity (+0.0, -inf, +inf; i32: 0, INT_MIN, INT_MAX) to the next power of
  two >= 128, along axis 0 over the rows padded to the next power of two >= 8;
- `argmax` is the lowest index whose value equals that tree maximum (the lowest NaN if
  the maximum is NaN);
- `matmul(lhs, rhs)` is `numerics.mxu_matmul(0, lhs, rhs)`, wherever it appears:
  `acc += matmul(a, b)` is `acc + mxu_matmul(0, a, b)`, one more float32 addition
  (so a matmul split along K is not bit-identical to one over the whole K);
- integer arithmetic wraps to int32, division truncates, shifts use the count's low
  five bits and `>>` is arithmetic (the ISA's `shl`/`sra`);
- a store into a bf16 buffer rounds to nearest even.

DMAs copy when they start and waits do nothing; semaphores, signals and barriers are
no-ops (one core, nothing runs concurrently). bf16 data is held as float32 arrays of
bf16 values, i32 as int32 and masks as bool, as the runner gives inputs to references.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from mkemu.dsl import ir
from mkemu.isa import numerics as nx

NP_DTYPES = {"f32": np.float32, "bf16": np.float32, "i32": np.int32, "bool": np.bool_}
I32_MIN, I32_MAX = -(2**31), 2**31 - 1


class InterpError(Exception):
    """The program did something the contract leaves undefined (or this interpreter
    does not model): an out-of-range view, an integer division by zero, a remote copy."""


# ------------------------------------------------------------------ numerics


def _wrap(x) -> np.ndarray:
    return nx.i32_wrap(np.asarray(x, dtype=np.int64))


def _padded(x: np.ndarray, axis: int, identity) -> np.ndarray:
    n = x.shape[axis]
    full = max(128 if axis == 1 else 8, 1 << (n - 1).bit_length())
    pad = [(0, 0), (0, 0)]
    pad[axis] = (0, full - n)
    return np.pad(x, pad, constant_values=identity)


def _i32_tree(x: np.ndarray, axis: int, combine) -> np.ndarray:
    while x.shape[axis] > 1:
        lo, hi = np.split(x, 2, axis=axis)
        x = combine(lo, hi)
    return x


def reduce(op: str, x: np.ndarray, axis: int) -> np.ndarray:
    """A tile reduction along `axis` keeping the axis, as the contract defines it."""
    if x.dtype == np.int32:
        identity = {"sum": 0, "max": I32_MIN, "min": I32_MAX, "argmax": I32_MIN}[op]
        p = _padded(x, axis, np.int32(identity))
        if op == "sum":
            return _i32_tree(p.astype(np.int64), axis, lambda a, b: _wrap(a + b).astype(np.int64)).astype(np.int32)
        top = _i32_tree(p, axis, np.maximum if op in ("max", "argmax") else np.minimum)
        if op != "argmax":
            return top
        return _first_index(x == top, axis)
    identity = {"sum": 0.0, "max": -np.inf, "min": np.inf, "argmax": -np.inf}[op]
    p = _padded(x, axis, np.float32(identity))
    if op == "sum":
        return nx.tree_sum_f32(p, axis=axis, keepdims=True)
    if op == "min":
        return nx.tree_min_f32(p, axis=axis, keepdims=True)
    top = nx.tree_max_f32(p, axis=axis, keepdims=True)
    if op == "max":
        return top
    hit = np.where(np.isnan(top), np.isnan(x), x == top)
    return _first_index(hit, axis)


def _first_index(hit: np.ndarray, axis: int) -> np.ndarray:
    return np.argmax(hit, axis=axis).astype(np.int32).reshape((1, -1) if axis == 0 else (-1, 1))


def convert(x: np.ndarray, src: str, dst: str) -> np.ndarray:
    if src == "bool":
        x = x.astype(np.int32)
        src = "i32"
    if dst == "i32":
        return x if src == "i32" else nx.f32_to_i32(x)
    f = nx.i32_to_f32(x) if src == "i32" else x.astype(np.float32)
    return nx.bf16_round(f) if dst == "bf16" else f


def binary(op: str, a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    """`a op b` on tiles of `dtype` (the operands' dtype)."""
    if op in ("==", "!=", "<", "<=", ">", ">="):
        fn = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal,
              ">": np.greater, ">=": np.greater_equal}[op]
        return fn(a, b)
    if dtype == "bool":
        return {"&": np.logical_and, "|": np.logical_or, "^": np.logical_xor}[op](a, b)
    if dtype == "f32":
        if op == "max":
            return nx.f32_max(a, b)
        if op == "min":
            return nx.f32_min(a, b)
        fn = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}[op]
        return fn(a.astype(np.float32), b.astype(np.float32)).astype(np.float32)
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    if op == "<<":
        return _wrap(a64 << (b64 & 31))
    if op == ">>":
        return (a.astype(np.int32) >> (b.astype(np.int32) & 31)).astype(np.int32)
    fn = {"+": np.add, "-": np.subtract, "*": np.multiply, "&": np.bitwise_and, "|": np.bitwise_or,
          "^": np.bitwise_xor, "max": np.maximum, "min": np.minimum}[op]
    return _wrap(fn(a64, b64))


UNARY_F32 = {
    "exp": nx.exp, "log": nx.log, "exp2": nx.exp2, "log2": nx.log2, "sqrt": nx.sqrt,
    "rsqrt": nx.rsqrt, "recip": nx.reciprocal, "sigmoid": nx.sigmoid, "tanh": nx.tanh,
    "silu": nx.silu,
}


def unary(op: str, x: np.ndarray, dtype: str) -> np.ndarray:
    if op == "!":
        return np.logical_not(x)
    if dtype == "i32":
        if op == "neg":
            return _wrap(-x.astype(np.int64))
        if op == "abs":
            return _wrap(np.abs(x.astype(np.int64)))
        raise InterpError(f"{op} on an i32 tile")
    if op == "neg":
        return np.negative(x)
    if op == "abs":
        return np.abs(x)
    return UNARY_F32[op](x)


def _int32(v: int) -> int:
    return (v + 2**31) % 2**32 - 2**31


def scalar_op(op: str, args: list[int]) -> int:
    if op == "neg":
        return _int32(-args[0])
    if op == "!":
        return int(not args[0])
    if op == "select":
        return args[1] if args[0] else args[2]
    a, b = args
    if op in ("/", "%"):
        if b == 0:
            raise InterpError(f"scalar {'division' if op == '/' else 'remainder'} by zero")
        q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
        return _int32(q if op == "/" else a - b * q)
    table = {
        "+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b,
        "<<": lambda: a << (b & 31), ">>": lambda: a >> (b & 31),
        "&": lambda: a & b, "|": lambda: a | b, "^": lambda: a ^ b,
        "==": lambda: int(a == b), "!=": lambda: int(a != b), "<": lambda: int(a < b),
        "<=": lambda: int(a <= b), ">": lambda: int(a > b), ">=": lambda: int(a >= b),
        "&&": lambda: int(bool(a) and bool(b)), "||": lambda: int(bool(a) or bool(b)),
        "min": lambda: min(a, b), "max": lambda: max(a, b),
    }
    return _int32(table[op]())


# --------------------------------------------------------------- interpreter


class Interpreter:
    """Runs kernels of one program on one core of one chip.

    `memory` maps each entity (Buffer, ScalarVar, TileValue) to its current value;
    HBM parameters are numpy views into the host arrays they were launched with.
    """

    def __init__(self, program: ir.Program, *, chip: int = 0, core: int = 0,
                 mesh_dims: tuple[int, int, int] = (1, 1, 1), cores_per_chip: int = 1):
        self.program = program
        self.chip, self.core = chip, core
        self.mesh_dims = mesh_dims
        self.cores_per_chip = cores_per_chip
        self.env: dict = {}

    # -- program level
    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the host launch sequence; returns every host array by name afterwards."""
        host = self.program.host
        if host is None:
            raise InterpError("the program has no host block")
        arrays = {}
        for buf in host.arrays:
            if buf.role == "input":
                if buf.name not in inputs:
                    raise InterpError(f"no input given for '{buf.name}'")
                value = np.array(inputs[buf.name], dtype=NP_DTYPES[buf.dtype])
                if value.shape != buf.shape:
                    raise InterpError(f"input '{buf.name}' has shape {value.shape}, the program wants {buf.shape}")
                if buf.dtype == "bf16":
                    value = nx.bf16_round(value)
                arrays[buf] = value
            else:
                arrays[buf] = np.zeros(buf.shape, NP_DTYPES[buf.dtype])
        for launch in host.launches:
            self.launch(launch, arrays)
        return {buf.name: value for buf, value in arrays.items()}

    def launch(self, launch: ir.Launch, arrays: dict) -> None:
        kernel = launch.kernel
        self.env = {}
        for param, arg in zip(kernel.params, launch.args):
            if isinstance(param, ir.ScalarVar):
                self.env[param] = int(arg)
            else:
                host_ref = arg
                self.env[param] = arrays[host_ref.buffer][self.index(host_ref)]
        for buf in kernel.buffers:
            shape = buf.shape if buf.slots is None else (buf.slots, *buf.shape)
            self.env[buf] = np.zeros(shape, NP_DTYPES[buf.dtype])
        self.block(kernel.body)

    # -- statements
    def block(self, stmts) -> None:
        for s in stmts:
            getattr(self, "s_" + type(s).__name__)(s)

    def s_LetScalar(self, s: ir.LetScalar) -> None:
        self.env[s.var] = self.scalar(s.value)

    s_SetScalar = s_LetScalar

    def s_LetTile(self, s: ir.LetTile) -> None:
        self.env[s.value] = self.tile(s.expr)

    def s_StoreTile(self, s: ir.StoreTile) -> None:
        ref = s.ref
        shape = ref.tile_shape
        value = self.tile(s.value)
        if s.op is not None:
            value = binary(s.op, self.view(ref).reshape(shape), value, ref.dtype)
        value = np.broadcast_to(value, shape)
        if ref.dtype == "bf16":
            value = nx.bf16_round(value)
        self.write(ref, value)

    def s_StoreSmem(self, s: ir.StoreSmem) -> None:
        self.write(s.ref, np.int32(self.scalar(s.value)))

    def s_DmaStart(self, s: ir.DmaStart) -> None:
        dma = s.dma
        if dma.target is not None and self.scalar(dma.target) != self.global_core():
            raise InterpError("a copy to another core is outside this one-core interpreter")
        src = self.view(dma.src)
        if src.size != math.prod(dma.dst.shape):
            raise InterpError(f"copy of {src.shape} into {dma.dst.shape}")
        self.write(dma.dst, src)

    def s_DmaWait(self, s) -> None:
        pass

    s_Signal = s_SemWait = s_Barrier = s_DmaWait

    def s_For(self, s: ir.For) -> None:
        for i in range(self.scalar(s.start), self.scalar(s.stop), s.step):
            self.env[s.var] = i
            self.block(s.body)

    def s_If(self, s: ir.If) -> None:
        self.block(s.then if self.scalar(s.cond) else s.orelse)

    def s_Region(self, s: ir.Region) -> None:
        if s.index is not None:
            self.scalar(s.index)
        self.block(s.body)

    # -- views
    def index(self, ref: ir.Ref) -> tuple:
        buf = ref.buffer
        idx: list = []
        if buf.slots is not None:
            slot = self.scalar(ref.slot)
            if not 0 <= slot < buf.slots:
                raise InterpError(f"slot {slot} of '{buf.name}' is out of range 0..{buf.slots}")
            idx.append(slot)
        for dim, (offset, size) in enumerate(zip(ref.offsets, ref.sizes)):
            start = self.scalar(offset)
            extent = buf.shape[dim]
            length = 1 if size is None else size
            if start < 0 or start + length > extent:
                raise InterpError(f"view of '{buf.name}' reaches {start}..{start + length} "
                                  f"in dimension {dim} of size {extent}")
            idx.append(start if size is None else slice(start, start + size))
        return tuple(idx)

    def view(self, ref: ir.Ref) -> np.ndarray:
        """The referenced window as an array of the view's shape (a copy)."""
        return np.array(self.env[ref.buffer][self.index(ref)])

    def write(self, ref: ir.Ref, value: np.ndarray) -> None:
        """Store `value` (any shape with the window's element count) into the window."""
        self.env[ref.buffer][self.index(ref)] = np.reshape(value, ref.shape)

    # -- expressions
    def scalar(self, e) -> int:
        match e:
            case ir.Const():
                return _int32(e.value)
            case ir.ScalarRead():
                return self.env[e.var]
            case ir.ScalarOp():
                return scalar_op(e.op, [self.scalar(a) for a in e.args])
            case ir.SmemLoad():
                return int(self.view(e.ref))
            case ir.TileToScalar():
                return int(self.tile(e.tile).reshape(-1)[0])
            case ir.Spmd():
                return self.spmd(e.name, [self.scalar(a) for a in e.args])
        raise InterpError(f"not a scalar expression: {type(e).__name__}")

    def global_core(self) -> int:
        return self.chip * self.cores_per_chip + self.core

    def spmd(self, name: str, args: list[int]) -> int:
        dims = self.mesh_dims
        x = self.chip % dims[0]
        y = self.chip // dims[0] % dims[1]
        z = self.chip // (dims[0] * dims[1])
        coords = (x, y, z)
        if name == "chip_id":
            return self.chip
        if name == "core_id":
            return self.core
        if name == "num_chips":
            return dims[0] * dims[1] * dims[2]
        if name == "num_cores":
            return self.cores_per_chip
        if name == "mesh_dim":
            return dims[args[0]]
        if name == "chip_coord":
            return coords[args[0]]
        if name == "global_core":
            return args[0] * self.cores_per_chip + args[1]
        if name == "peer":
            axis, offset = args
            moved = list(coords)
            moved[axis] = (moved[axis] + offset) % dims[axis]
            chip = moved[0] + dims[0] * (moved[1] + dims[1] * moved[2])
            return chip * self.cores_per_chip + self.core
        raise InterpError(f"unknown SPMD builtin {name}")

    def tile(self, e) -> np.ndarray:
        """The value of a tile expression: a 2-D array of e.shape and e.dtype's storage type."""
        out = self._tile(e)
        if out.shape != e.shape:
            out = np.broadcast_to(out, e.shape)
        return out

    def _tile(self, e) -> np.ndarray:
        match e:
            case ir.Load():
                return self.view(e.ref).reshape(e.shape)
            case ir.ValueRead():
                return self.env[e.value]
            case ir.Literal():
                return np.full((1, 1), e.value, NP_DTYPES[e.dtype])
            case ir.Splat():
                return np.full((1, 1), self.scalar(e.scalar), np.int32)
            case ir.Elementwise():
                args = [self.tile(a) for a in e.args]
                if e.op == "where":
                    return np.where(args[0], args[1], args[2])
                if len(args) == 1:
                    return unary(e.op, args[0], e.dtype)
                return binary(e.op, args[0], args[1], e.args[0].dtype)
            case ir.Convert():
                return convert(self.tile(e.arg), e.arg.dtype, e.dtype)
            case ir.Reduce():
                return reduce(e.op, self.tile(e.arg), e.axis)
            case ir.Matmul():
                return nx.mxu_matmul(np.zeros(e.shape, np.float32), self.tile(e.lhs), self.tile(e.rhs))
            case ir.Transpose():
                return np.ascontiguousarray(self.tile(e.arg).T)
            case ir.Iota():
                return np.arange(max(e.shape), dtype=np.int32).reshape(e.shape)
            case ir.TileSlice():
                (r, c), (h, w) = e.starts, e.shape
                return self.tile(e.arg)[r:r + h, c:c + w]
        raise InterpError(f"not a tile expression: {type(e).__name__}")


def run_program(program: ir.Program, inputs: Mapping[str, np.ndarray], **where) -> dict[str, np.ndarray]:
    """Run `program` on `inputs` (host input name -> array); every host array after."""
    with np.errstate(all="ignore"):
        return Interpreter(program, **where).run(inputs)
