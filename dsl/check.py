"""Semantic checking and elaboration: `ast` in, `ir` out.

One walk over each kernel does everything: resolves names, folds compile-time
expressions, inlines fn calls, types tile expressions (dtype and 2-D shape with
broadcasting), checks static bounds, and emits the `ir` statements. Every fn is also
checked once on its own with its declared parameter types, so an fn that is never
called is still checked. Errors are collected, never raised one by one; an erroneous
sub-expression becomes `POISON`, which silences the errors that would follow from it.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import attrs

from mkemu.dsl import ast, ir
from mkemu.errors import SourceSpan
from mkemu.isa.program import ParamInfo, values_text

DTYPES = ("bf16", "f32", "i32")
FLOAT_UNARY = ("exp", "log", "exp2", "log2", "sqrt", "rsqrt", "recip", "sigmoid", "tanh", "silu")
SPMD_ARITY = {
    "chip_id": 0, "core_id": 0, "num_chips": 0, "num_cores": 0,
    "mesh_dim": 1, "chip_coord": 1, "peer": 2, "global_core": 2,
}
BUILTINS = frozenset(
    FLOAT_UNARY
    + ("abs", "max", "min", "sum", "argmax", "where", "f32", "bf16", "i32", "iota",
       "matmul", "transpose", "scalar", "copy", "signal", "barrier")
    + tuple(SPMD_ARITY)
)
ARITH_OPS = ("+", "-", "*", "/")
CMP_OPS = ("==", "!=", "<", "<=", ">", ">=")
INT_OPS = ("%", "<<", ">>")
BIT_OPS = ("&", "|", "^")
# A param range is listed value by value (for `--params` and tuners): keep it small.
MAX_PARAM_VALUES = 4096


class _Poison:
    """The value of an expression that already produced an error."""

    def __repr__(self) -> str:
        return "POISON"


POISON = _Poison()


@attrs.frozen
class ConstVal:
    value: int


@attrs.frozen
class FloatVal:
    value: float


@attrs.define(eq=False)
class DmaHandle:
    name: str
    dma: ir.Dma
    span: SourceSpan
    started: bool = False
    waited: bool = False


@attrs.frozen
class Binding:
    entity: object
    span: SourceSpan | None
    what: str  # for messages: "const", "buffer", "loop variable", ...


class Scope:
    def __init__(self, parent: "Scope | None"):
        self.parent = parent
        self.names: dict[str, Binding] = {}

    def lookup(self, name: str) -> Binding | None:
        scope = self
        while scope is not None:
            found = scope.local(name)
            if found is not None:
                return found
            scope = scope.parent
        return None

    def local(self, name: str) -> Binding | None:
        return self.names.get(name)


def _describe(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _tile_desc(t) -> str:
    return f"{t.dtype}{_describe(t.shape)}"


def _int_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _int_rem(a: int, b: int) -> int:
    return a - b * _int_div(a, b)


def _fold_int(op: str, a: int, b: int) -> int:
    match op:
        case "+": return a + b
        case "-": return a - b
        case "*": return a * b
        case "/": return _int_div(a, b)
        case "%": return _int_rem(a, b)
        case "<<": return a << b
        case ">>": return a >> b
        case "&": return a & b
        case "|": return a | b
        case "^": return a ^ b
        case "==": return int(a == b)
        case "!=": return int(a != b)
        case "<": return int(a < b)
        case "<=": return int(a <= b)
        case ">": return int(a > b)
        case ">=": return int(a >= b)
        case "&&": return int(bool(a) and bool(b))
        case "||": return int(bool(a) or bool(b))
        case "min": return min(a, b)
        case "max": return max(a, b)
    raise AssertionError(op)


def _broadcast(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int] | None:
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return (out[0], out[1])


# ----------------------------------------------------------- scalar analyses


def _skey(e) -> tuple:
    """A structural key of a scalar expression (for comparing slice bounds)."""
    match e:
        case ir.Const():
            return ("c", e.value)
        case ir.ScalarRead():
            return ("v", id(e.var))
        case ir.ScalarOp():
            return (e.op,) + tuple(_skey(a) for a in e.args)
        case ir.SmemLoad():
            return ("m", id(e.ref.buffer), _skey(e.ref.slot) if e.ref.slot else None) + tuple(
                _skey(o) for o in e.ref.offsets
            )
        case ir.Spmd():
            return ("s", e.name) + tuple(_skey(a) for a in e.args)
    return ("?", id(e))


def _linear(e) -> dict:
    """e as {atom key: coefficient} (key 1 for the constant term)."""
    if isinstance(e, ir.Const):
        return {1: e.value}
    if isinstance(e, ir.ScalarOp):
        if e.op in ("+", "-"):
            a, b = _linear(e.args[0]), _linear(e.args[1])
            sign = 1 if e.op == "+" else -1
            for k, v in b.items():
                a[k] = a.get(k, 0) + sign * v
            return {k: v for k, v in a.items() if v}
        if e.op == "neg":
            return {k: -v for k, v in _linear(e.args[0]).items()}
        if e.op == "*":
            for c, other in ((e.args[0], e.args[1]), (e.args[1], e.args[0])):
                if isinstance(c, ir.Const):
                    return {k: v * c.value for k, v in _linear(other).items() if v * c.value}
    return {_skey(e): 1}


class Checker:
    """Checks a whole program (all loaded modules) and builds `ir.Program`."""

    def __init__(self, modules: list[ast.Module], sources: dict[str, str], overrides: dict[str, int]):
        self.modules = modules
        self.sources = sources
        self.overrides = overrides
        self.errors: dict[tuple, tuple[SourceSpan, str, str]] = {}
        self.globals = Scope(None)
        self.global_decls: dict[str, object] = {}
        self.const_values: dict[str, int | None] = {}
        self.param_defaults: dict[str, int | None] = {}
        self.param_domains: dict[str, tuple[int, ...] | None] = {}
        self.evaluating: list[str] = []
        self.ctx: _KernelCtx | None = None
        self.inline_stack: list[tuple[str, SourceSpan]] = []
        self.inline_counter = itertools.count(1)

    # ------------------------------------------------------------ diagnostics
    def error(self, span: SourceSpan, message: str) -> _Poison:
        key = (span.file, span.line, span.column, span.end_line, span.end_column, message)
        if key not in self.errors:
            context = ""
            if self.inline_stack:
                fn, site = self.inline_stack[-1]
                context = f" (in fn '{fn}' inlined at {site})"
            self.errors[key] = (span, message, context)
        return POISON

    def diagnostics(self) -> list[tuple[SourceSpan, str]]:
        return [(span, msg + ctx) for span, msg, ctx in self.errors.values()]

    # ---------------------------------------------------------------- globals
    def collect_globals(self) -> None:
        for module in self.modules:
            for item in module.items:
                name = getattr(item, "name", None)
                if name is None or isinstance(item, ast.Import):
                    continue
                span = item.name_span
                if isinstance(item, ast.FnDecl) and name in BUILTINS:
                    self.error(span, f"'{name}' is a builtin function and cannot be redefined")
                    continue
                prev = self.globals.local(name)
                if prev is not None:
                    self.error(span, f"redefinition of '{name}' (first defined at {prev.span})")
                    continue
                what = {ast.ParamDecl: "param", ast.ConstDecl: "const", ast.FnDecl: "fn",
                        ast.KernelDecl: "kernel"}[type(item)]
                self.globals.names[name] = Binding(item, span, what)
                self.global_decls[name] = item

    def const_value(self, name: str, decl) -> int | None:
        if name in self.const_values:
            return self.const_values[name]
        if name in self.evaluating:
            chain = " -> ".join(self.evaluating[self.evaluating.index(name):] + [name])
            self.error(decl.name_span, f"'{name}' is defined in terms of itself: {chain}")
            return None
        self.evaluating.append(name)
        saved_ctx, saved_stack = self.ctx, self.inline_stack
        self.ctx, self.inline_stack = None, []
        # A param's default is checked even when it is set from outside: it is what
        # `--params` lists and what a tuner compares against.
        v = self.expr(decl.value, self.globals)
        if isinstance(v, ir.Const):
            value = v.value
        else:
            if v is not POISON:
                what = "param" if isinstance(decl, ast.ParamDecl) else "const"
                self.error(decl.value.span, f"the value of {what} '{name}' must be a compile-time integer")
            value = None
        if isinstance(decl, ast.ParamDecl):
            self.param_defaults[name] = value
            if name in self.overrides:
                value = self.overrides[name]
            if decl.domain is not None:
                value = self.param_in_domain(name, decl, value)
        self.ctx, self.inline_stack = saved_ctx, saved_stack
        self.evaluating.pop()
        self.const_values[name] = value
        return value

    def param_in_domain(self, name: str, decl: ast.ParamDecl, value: int | None) -> int | None:
        """`value` if it is one of the param's declared values (reporting it otherwise);
        the values are kept in `param_domains`."""
        values = self.param_values(decl.domain)
        self.param_domains[name] = values
        if values is None or value is None or value in values:
            return value
        if name in self.overrides:
            self.error(decl.domain.span, f"{name} = {value} (set from outside) is not one of its "
                                         f"declared values: {values_text(values)}")
        else:
            self.error(decl.value.span, f"the default {value} of param '{name}' is not one of its "
                                        f"declared values: {values_text(values)}")
        return None

    def param_values(self, domain: ast.ParamSet | ast.ParamRange) -> tuple[int, ...] | None:
        if isinstance(domain, ast.ParamSet):
            values = [self.const_int(e, self.globals, "a param value") for e in domain.values]
            if None in values:
                return None
            for i, (v, e) in enumerate(zip(values, domain.values)):
                if v in values[:i]:
                    self.error(e.span, f"the value {v} is listed twice")
                    return None
            return tuple(values)
        start = self.const_int(domain.start, self.globals, "the start of a param range")
        stop = self.const_int(domain.stop, self.globals, "the end of a param range")
        step = 1 if domain.step is None else self.const_int(domain.step, self.globals, "the step of a param range")
        if None in (start, stop, step):
            return None
        if step <= 0:
            self.error(domain.step.span, f"the step of a param range must be positive, got {step}")
            return None
        values = range(start, stop, step)
        if not values:
            self.error(domain.span, f"the range {start}..{stop} holds no value (its end is excluded, as in `for`)")
            return None
        if len(values) > MAX_PARAM_VALUES:
            self.error(domain.span, f"a param takes at most {MAX_PARAM_VALUES} values; this range holds {len(values)}")
            return None
        return tuple(values)

    # ------------------------------------------------------------ definitions
    def define(self, scope: Scope, name: str, entity, span: SourceSpan, what: str) -> None:
        prev = scope.lookup(name)
        if prev is not None:
            where = f" (first defined at {prev.span})" if prev.span else ""
            self.error(span, f"redefinition of '{name}'{where}")
            return
        scope.names[name] = Binding(entity, span, what)

    def unique(self, name: str) -> str:
        if self.inline_stack:
            return f"{self.inline_stack[-1][0]}#{self.ctx.inline_id}.{name}" if self.ctx else name
        return name

    # ------------------------------------------------------------ expressions
    def const_int(self, node, scope, what: str) -> int | None:
        v = self.expr(node, scope)
        if isinstance(v, ir.Const):
            return v.value
        if v is not POISON:
            self.error(node.span, f"{what} must be a compile-time integer")
        return None

    def expr(self, node, scope: Scope):
        match node:
            case ast.IntLit():
                return ir.Const(node.value, node.span)
            case ast.FloatLit():
                return ir.FloatConst(node.value, node.span)
            case ast.Name():
                return self.name(node, scope)
            case ast.Binary():
                a = self.expr(node.left, scope)
                b = self.expr(node.right, scope)
                return self.binary(node.op, a, b, node.span)
            case ast.Unary():
                return self.unary(node.op, self.expr(node.operand, scope), node.span)
            case ast.Index():
                return self.index(node, scope)
            case ast.Call():
                return self.call(node, scope)
        return self.error(node.span, "unexpected expression")

    def name(self, node: ast.Name, scope: Scope):
        b = scope.lookup(node.name)
        if b is None:
            if node.name == "inf":
                return ir.FloatConst(math.inf, node.span)
            if node.name in BUILTINS:
                return self.error(node.span, f"'{node.name}' is a builtin function; call it with (...)")
            return self.error(node.span, f"unknown name '{node.name}'")
        e = b.entity
        match e:
            case ast.ParamDecl() | ast.ConstDecl():
                v = self.const_value(node.name, e)
                return POISON if v is None else ir.Const(v, node.span)
            case ConstVal():
                return ir.Const(e.value, node.span)
            case FloatVal():
                return ir.FloatConst(e.value, node.span)
            case ir.ScalarVar():
                return ir.ScalarRead(e, node.span)
            case ir.Buffer():
                return ir.Ref(e, None, tuple(ir.Const(0, node.span) for _ in e.shape), e.shape, node.span)
            case ir.Ref():
                return attrs.evolve(e, span=node.span)
            case ir.Semaphore():
                return ir.SemRef(e, None, node.span)
            case ir.SemRef():
                return attrs.evolve(e, span=node.span)
            case ir.TileValue():
                return ir.ValueRead(e, e.dtype, e.shape, node.span)
            case DmaHandle():
                return e
            case ast.FnDecl() | ast.KernelDecl():
                return self.error(node.span, f"'{node.name}' is a {b.what}, not a value")
            case _Poison():
                return POISON
        return self.error(node.span, f"'{node.name}' cannot be used here")

    # -- value conversions
    def as_scalar(self, v, span: SourceSpan, what: str = "a scalar"):
        if v is POISON or isinstance(v, ir.SCALAR_NODES):
            return v
        if isinstance(v, ir.Ref) and v.buffer.space == "smem" and not v.shape and self.full_ref(v):
            return ir.SmemLoad(v, v.span)
        if isinstance(v, ir.Ref) and not v.shape and v.buffer.space in ("vmem", "var") and self.full_ref(v):
            return self.error(span, f"expected {what}; read a VMEM element into a scalar with scalar(...)")
        return self.error(span, f"expected {what}, got {self.kind_name(v)}")

    def full_ref(self, r: ir.Ref) -> bool:
        return r.buffer.slots is None or r.slot is not None

    def kind_name(self, v) -> str:
        match v:
            case ir.FloatConst():
                return "a float constant"
            case ir.Ref():
                if v.buffer.slots is not None and v.slot is None:
                    return f"the buffer array '{v.buffer.name}'"
                return f"{v.buffer.space} view {v.dtype}{_describe(v.shape)} of '{v.buffer.name}'"
            case ir.SemRef():
                return "a semaphore array" if v.sem.count is not None and v.index is None else "a semaphore"
            case DmaHandle() | ir.Dma():
                return "a DMA"
        if isinstance(v, ir.TILE_NODES):
            return f"a tile {_tile_desc(v)}"
        return "a value"

    def as_tile(self, v, span: SourceSpan):
        """A strongly typed tile, or a weak constant (Const / FloatConst) left as is."""
        if v is POISON or isinstance(v, ir.TILE_NODES) or isinstance(v, (ir.Const, ir.FloatConst)):
            return v
        if isinstance(v, ir.SCALAR_NODES):
            return ir.Splat(v, "i32", (1, 1), v.span)
        if isinstance(v, ir.Ref):
            buf = v.buffer
            if buf.slots is not None and v.slot is None:
                return self.error(span, f"buffer array '{buf.name}' needs a slot index: {buf.name}[slot]")
            if buf.space == "hbm":
                return self.error(span, f"HBM array '{buf.name}' cannot be used in a tile expression; copy it into VMEM first")
            if buf.space == "smem":
                if not v.shape:
                    return ir.Splat(ir.SmemLoad(v, v.span), "i32", (1, 1), v.span)
                return self.error(span, f"SMEM buffer '{buf.name}' holds scalars; index one element")
            if len(v.shape) > 2:
                return self.error(span, f"a tile expression needs at most 2 dimensions, got {_describe(v.shape)}")
            shape = v.tile_shape
            return ir.Load(v, v.dtype, shape, v.span)
        return self.error(span, f"expected a tile, got {self.kind_name(v)}")

    def weak_to_tile(self, v, dtype: str, span: SourceSpan):
        if isinstance(v, ir.Const):
            if dtype == "bool":
                return self.error(span, "an integer constant cannot be used as a mask")
            return ir.Literal(float(v.value) if dtype in ("f32", "bf16") else v.value, dtype, (1, 1), v.span)
        if isinstance(v, ir.FloatConst):
            if dtype != "f32":
                return self.error(span, f"a float constant cannot be used with a {dtype} tile")
            return ir.Literal(v.value, "f32", (1, 1), v.span)
        return v

    # -- operators
    def binary(self, op: str, a, b, span: SourceSpan):
        if a is POISON or b is POISON:
            return POISON
        for v, side in ((a, "left"), (b, "right")):
            if isinstance(v, (ir.SemRef, DmaHandle, ir.Dma)) or (
                isinstance(v, ir.Ref) and v.buffer.slots is not None and v.slot is None
            ):
                return self.error(span, f"operator '{op}' cannot take {self.kind_name(v)}")
        a_sc = self.scalarish(a)
        b_sc = self.scalarish(b)
        if a_sc is not None and b_sc is not None:
            return self.scalar_binary(op, a_sc, b_sc, span)
        if isinstance(a, ir.FloatConst) and isinstance(b, (ir.Const, ir.FloatConst)) or (
            isinstance(b, ir.FloatConst) and isinstance(a, ir.Const)
        ):
            return self.float_binary(op, a, b, span)
        if op in ("&&", "||"):
            return self.error(span, f"'{op}' works on scalars; combine masks with '{op[0]}'")
        ta, tb = self.as_tile(a, span), self.as_tile(b, span)
        if ta is POISON or tb is POISON:
            return POISON
        weak = (ir.Const, ir.FloatConst)
        if isinstance(ta, weak) and isinstance(tb, weak):  # e.g. a float constant with a scalar
            return self.error(span, f"operator '{op}' cannot combine {self.kind_name(a)} and {self.kind_name(b)}")
        strong = ta if not isinstance(ta, weak) else tb
        dtype = strong.dtype
        if not isinstance(ta, weak) and not isinstance(tb, weak) and ta.dtype != tb.dtype:
            return self.error(
                span,
                f"dtype mismatch: {_tile_desc(ta)} {op} {_tile_desc(tb)}; convert one side with f32(), i32() or bf16()",
            )
        if dtype == "bf16":
            return self.error(span, f"'{op}' is not defined on bf16 tiles; convert with f32() first")
        if op in ARITH_OPS or op in CMP_OPS:
            if dtype not in ("f32", "i32"):
                return self.error(span, f"'{op}' needs f32 or i32 tiles, got {dtype}")
        elif op in INT_OPS:
            if dtype != "i32":
                return self.error(span, f"'{op}' needs i32 tiles, got {dtype}")
        elif op in BIT_OPS:
            if dtype not in ("i32", "bool"):
                return self.error(span, f"'{op}' needs i32 tiles or masks, got {dtype}")
        ta = self.weak_to_tile(ta, dtype, span)
        tb = self.weak_to_tile(tb, dtype, span)
        if ta is POISON or tb is POISON:
            return POISON
        shape = _broadcast(ta.shape, tb.shape)
        if shape is None:
            return self.error(
                span, f"shape mismatch: {_tile_desc(ta)} {op} {_tile_desc(tb)} cannot be broadcast together"
            )
        out = "bool" if op in CMP_OPS else dtype
        return ir.Elementwise(op, (ta, tb), out, shape, span)

    def unify(self, a, b, span: SourceSpan, what: str):
        """Two values as tiles of one dtype and their broadcast shape (None on error)."""
        weak = (ir.Const, ir.FloatConst)
        if self.scalarish(a) is not None and self.scalarish(b) is not None and not (
            isinstance(a, ir.Const) and isinstance(b, ir.Const)
        ):
            a, b = self.as_tile(a, span), self.as_tile(b, span)
        if isinstance(a, weak) and isinstance(b, weak):
            dtype = "f32" if ir.FloatConst in (type(a), type(b)) else "i32"
            ta, tb = self.weak_to_tile(a, dtype, span), self.weak_to_tile(b, dtype, span)
            return None if POISON in (ta, tb) else (ta, tb, (1, 1))
        r = self.binary("-", a, b, span)
        if r is POISON:
            return None
        if not isinstance(r, ir.Elementwise):
            return self.error(span, f"{what}() needs tile values") and None
        return r.args[0], r.args[1], r.shape

    def scalarish(self, v):
        """v as a scalar expression if it is one (no error otherwise)."""
        if isinstance(v, ir.SCALAR_NODES):
            return v
        if isinstance(v, ir.Ref) and v.buffer.space == "smem" and not v.shape and self.full_ref(v):
            return ir.SmemLoad(v, v.span)
        return None

    def scalar_binary(self, op: str, a, b, span: SourceSpan):
        if isinstance(a, ir.Const) and isinstance(b, ir.Const):
            if op in ("/", "%") and b.value == 0:
                return self.error(span, "division by zero in a compile-time expression")
            if op in ("<<", ">>") and b.value < 0:
                return self.error(span, "negative shift count in a compile-time expression")
            return ir.Const(_fold_int(op, a.value, b.value), span)
        return ir.ScalarOp(op, (a, b), span)

    def float_binary(self, op: str, a, b, span: SourceSpan):
        x, y = float(a.value), float(b.value)
        if op in CMP_OPS:
            return ir.Const(_fold_int(op, x, y), span)  # type: ignore[arg-type]
        if op not in ARITH_OPS:
            return self.error(span, f"'{op}' is not defined on float constants")
        if op == "/" and y == 0:
            return self.error(span, "division by zero in a compile-time expression")
        value = {"+": x + y, "-": x - y, "*": x * y, "/": x / y if y else 0.0}[op]
        return ir.FloatConst(value, span)

    def unary(self, op: str, v, span: SourceSpan):
        if v is POISON:
            return POISON
        if isinstance(v, ir.Const):
            return ir.Const(-v.value if op == "-" else int(not v.value), span)
        if isinstance(v, ir.FloatConst):
            if op == "-":
                return ir.FloatConst(-v.value, span)
            return self.error(span, "'!' is not defined on float constants")
        s = self.scalarish(v)
        if s is not None:
            return ir.ScalarOp("neg" if op == "-" else "!", (s,), span)
        t = self.as_tile(v, span)
        if t is POISON:
            return POISON
        if op == "-" and t.dtype not in ("f32", "i32"):
            return self.error(span, f"'-' needs an f32 or i32 tile, got {t.dtype}")
        if op == "!" and t.dtype != "bool":
            return self.error(span, f"'!' needs a mask (a comparison result), got {t.dtype}")
        return ir.Elementwise("neg" if op == "-" else "!", (t,), t.dtype, t.shape, span)

    # -- indexing
    def index(self, node: ast.Index, scope: Scope):
        base = self.expr(node.base, scope)
        if base is POISON:
            for item in node.items:  # still report unknown names inside the brackets
                for part in (item,) if not isinstance(item, (ast.Slice, ast.SizedSlice)) else (
                    getattr(item, "start", None), getattr(item, "stop", None), getattr(item, "length", None)
                ):
                    if part is not None:
                        self.expr(part, scope)
            return POISON
        if isinstance(base, ir.SemRef):
            if base.sem.count is None or base.index is not None:
                return self.error(node.span, f"semaphore '{base.sem.name}' is not an array")
            if len(node.items) != 1 or isinstance(node.items[0], (ast.Slice, ast.SizedSlice)):
                return self.error(node.span, f"semaphore array '{base.sem.name}' takes one index")
            i = self.point(node.items[0], scope, base.sem.count, f"semaphore array '{base.sem.name}'")
            return POISON if i is POISON else ir.SemRef(base.sem, i, node.span)
        if isinstance(base, ir.Ref):
            buf = base.buffer
            if buf.slots is not None and base.slot is None:
                if len(node.items) != 1 or isinstance(node.items[0], (ast.Slice, ast.SizedSlice)):
                    return self.error(node.span, f"buffer array '{buf.name}' needs a slot index first: {buf.name}[slot][...]")
                slot = self.point(node.items[0], scope, buf.slots, f"buffer array '{buf.name}'")
                return POISON if slot is POISON else attrs.evolve(base, slot=slot, span=node.span)
            return self.index_ref(base, node, scope)
        if isinstance(base, ir.TILE_NODES):
            return self.index_tile(base, node, scope)
        return self.error(node.span, f"cannot index {self.kind_name(base)}")

    def point(self, item, scope, size: int, what: str):
        v = self.as_scalar(self.expr(item, scope), item.span, "an integer index")
        if v is POISON:
            return POISON
        self.check_range(v, 1, size, item.span, what)
        return v

    def check_range(self, start, length: int, size: int, span: SourceSpan, what: str) -> bool:
        lo_hi = self.interval(start)
        if lo_hi is None:
            return True
        lo, hi = lo_hi
        if lo < 0 or hi + length > size:
            if isinstance(start, ir.Const):
                shown = f"index {lo}" if length == 1 else f"slice {lo}:{lo + length}"
            else:
                shown = (f"index ranging over {lo}..{hi}" if length == 1
                         else f"slice reaching {lo}..{hi + length}")
            self.error(span, f"{shown} is out of range for {what} (size {size})")
            return False
        return True

    def interval(self, e):
        """(lo, hi) of an exactly analysable scalar expression, else None."""
        r = self._interval(e)
        return None if r is None else (r[0], r[1])

    def _interval(self, e):
        if isinstance(e, ir.Const):
            return (e.value, e.value, frozenset())
        if isinstance(e, ir.ScalarRead) and self.ctx is not None:
            return self.ctx.ranges.get(e.var)
        if isinstance(e, ir.ScalarOp) and e.op in ("+", "-", "*"):
            a, b = self._interval(e.args[0]), self._interval(e.args[1])
            if a is None or b is None or (a[2] & b[2]):
                return None
            if e.op == "+":
                return (a[0] + b[0], a[1] + b[1], a[2] | b[2])
            if e.op == "-":
                return (a[0] - b[1], a[1] - b[0], a[2] | b[2])
            if a[2] and b[2]:
                return None
            prods = [x * y for x in a[:2] for y in b[:2]]
            return (min(prods), max(prods), a[2] | b[2])
        return None

    def index_ref(self, base: ir.Ref, node: ast.Index, scope: Scope):
        view_dims = [d for d, s in enumerate(base.sizes) if s is not None]
        if len(node.items) > len(view_dims):
            return self.error(
                node.span,
                f"too many indices: '{base.buffer.name}' view has {len(view_dims)} dimension(s), got {len(node.items)}",
            )
        offsets, sizes = list(base.offsets), list(base.sizes)
        ok = True
        for k, item in enumerate(node.items):
            d = view_dims[k]
            size = base.sizes[d]
            what = f"dimension {k} of '{base.buffer.name}'"
            if isinstance(item, (ast.Slice, ast.SizedSlice)):
                r = self.slice_bounds(item, scope, size, what)
                if r is None:
                    ok = False
                    continue
                start, length = r
                sizes[d] = length
            else:
                start = self.point(item, scope, size, what)
                if start is POISON:
                    ok = False
                    continue
                sizes[d] = None
            offsets[d] = self.add_offsets(offsets[d], start, node.span)
        if not ok:
            return POISON
        return ir.Ref(base.buffer, base.slot, tuple(offsets), tuple(sizes), node.span)

    def add_offsets(self, a, b, span):
        if isinstance(a, ir.Const) and a.value == 0:
            return b
        if isinstance(b, ir.Const) and b.value == 0:
            return a
        return self.scalar_binary("+", a, b, span)

    def slice_bounds(self, item, scope, size: int, what: str):
        """(start expr, static length) of a slice item, bounds-checked; None on error."""
        if isinstance(item, ast.SizedSlice):
            start = self.as_scalar(self.expr(item.start, scope), item.start.span, "an integer slice start")
            length = self.const_int(item.length, scope, "the length after '+:'")
            if start is POISON or length is None:
                return None
        else:
            start = (self.as_scalar(self.expr(item.start, scope), item.start.span, "an integer slice start")
                     if item.start is not None else ir.Const(0, item.span))
            stop = (self.as_scalar(self.expr(item.stop, scope), item.stop.span, "an integer slice end")
                    if item.stop is not None else ir.Const(size, item.span))
            if start is POISON or stop is POISON:
                return None
            diff = _linear(ir.ScalarOp("-", (stop, start), item.span))
            if set(diff) - {1}:
                self.error(item.span, "slice length must be known at compile time; write start +: LENGTH")
                return None
            length = diff.get(1, 0)
        if length <= 0:
            self.error(item.span, f"empty slice (length {length})")
            return None
        if not self.check_range(start, length, size, item.span, what):
            return None
        return start, length

    def index_tile(self, base, node: ast.Index, scope: Scope):
        if len(node.items) > 2:
            return self.error(node.span, f"too many indices for a tile {_tile_desc(base)}")
        starts, shape = [0, 0], list(base.shape)
        for k, item in enumerate(node.items):
            what = f"dimension {k} of the tile"
            if isinstance(item, (ast.Slice, ast.SizedSlice)):
                r = self.slice_bounds(item, scope, base.shape[k], what)
                if r is None:
                    return POISON
                start, length = r
            else:
                start = self.point(item, scope, base.shape[k], what)
                length = 1
                if start is POISON:
                    return POISON
            if not isinstance(start, ir.Const):
                return self.error(item.span, "a let-bound tile can only be indexed statically; store it in a vmem buffer or var first")
            starts[k], shape[k] = start.value, length
        return ir.TileSlice(base, (starts[0], starts[1]), base.dtype, (shape[0], shape[1]), node.span)

    # -- calls
    def call(self, node: ast.Call, scope: Scope):
        b = self.globals.local(node.func)
        if b is not None and isinstance(b.entity, (ast.FnDecl, ast.KernelDecl)):
            if isinstance(b.entity, ast.KernelDecl):
                return self.error(node.func_span, f"kernel '{node.func}' can only be launched from the host block")
            return self.error(node.span, f"fn '{node.func}' has no value; call it as a statement")
        if node.func not in BUILTINS:
            for a in node.args:
                self.expr(a.value if isinstance(a, ast.Remote) else a, scope)
            return self.error(node.func_span, f"unknown function '{node.func}'")
        if node.func in ("signal", "barrier"):
            return self.error(node.span, f"{node.func}() is a statement, not a value")
        if node.func == "copy":
            return self.copy(node, scope)
        remote = [a for a in node.args if isinstance(a, ast.Remote)]
        if remote:
            return self.error(remote[0].span, "'@' (a remote location) is only allowed in copy() and signal()")
        return Builtins(self, node, scope).run()

    def copy(self, node: ast.Call, scope: Scope):
        n = len(node.args)
        is_remote = n >= 2 and isinstance(node.args[1], ast.Remote)
        want = 4 if is_remote else 3
        if node.keywords:
            return self.error(node.keywords[0].span, "copy() takes no keyword arguments")
        if n != want:
            form = ("copy(src, dst @ core, send_sem, recv_sem)" if is_remote else "copy(src, dst, sem)")
            return self.error(node.span, f"copy() takes {want} arguments ({form}), got {n}")
        for a in node.args[:1] + node.args[2:]:
            if isinstance(a, ast.Remote):
                return self.error(a.span, "only the destination of copy() can be remote (DMAs push)")
        src = self.expr(node.args[0], scope)
        dst_node = node.args[1].value if is_remote else node.args[1]
        dst = self.expr(dst_node, scope)
        target = None
        if is_remote:
            target = self.as_scalar(self.expr(node.args[1].target, scope), node.args[1].target.span, "a core id")
        sem = self.sem_arg(node.args[2], scope)
        recv = self.sem_arg(node.args[3], scope) if is_remote else None
        ok = True
        for v, a, what in ((src, node.args[0], "source"), (dst, dst_node, "destination")):
            if v is POISON:
                ok = False
            elif not isinstance(v, ir.Ref):
                self.error(a.span, f"copy {what} must be a buffer, got {self.kind_name(v)}")
                ok = False
            elif v.buffer.space == "var":
                self.error(a.span, f"'{v.buffer.name}' is a var (placed by the compiler); DMAs need a vmem, smem or hbm buffer")
                ok = False
            elif v.buffer.slots is not None and v.slot is None:
                self.error(a.span, f"buffer array '{v.buffer.name}' needs a slot index: {v.buffer.name}[slot]")
                ok = False
        if not ok or POISON in (sem, recv, target):
            return POISON
        if src.dtype != dst.dtype:
            return self.error(node.span, f"dtype mismatch: copy from {src.dtype} to {dst.dtype} (DMAs do not convert)")

        def squeeze(shape):
            shape = list(shape)
            while shape and shape[0] == 1:
                shape.pop(0)
            return tuple(shape)

        if squeeze(src.shape) != squeeze(dst.shape):
            return self.error(
                node.span, f"shape mismatch: copy from {_describe(src.shape)} to {_describe(dst.shape)}"
            )
        return ir.Dma(src, dst, sem, target, recv, src.size_bytes, node.span)

    def sem_arg(self, a, scope):
        v = self.expr(a, scope)
        if v is POISON:
            return POISON
        if not isinstance(v, ir.SemRef):
            return self.error(a.span, f"expected a semaphore, got {self.kind_name(v)}")
        if v.sem.count is not None and v.index is None:
            return self.error(a.span, f"semaphore array '{v.sem.name}' needs an index: {v.sem.name}[i]")
        return v


class Builtins:
    """Type rules of the builtin functions (everything but copy, signal, barrier)."""

    def __init__(self, checker: Checker, node: ast.Call, scope: Scope):
        self.c = checker
        self.node = node
        self.scope = scope

    def run(self):
        node = self.node
        name = node.func
        if name in SPMD_ARITY:
            return self.spmd()
        if name in ("max", "min") and (node.keywords or len(node.args) == 1):
            return self.reduce(name)
        if name in ("sum", "argmax"):
            return self.reduce(name)
        handler = getattr(self, "b_" + name, None)
        if handler is None:
            handler = self.float_unary if name in FLOAT_UNARY else None
        return handler()

    def args(self, n: int, keywords: tuple[str, ...] = ()):
        node = self.node
        bad = [k for k in node.keywords if k.name not in keywords]
        if bad:
            self.c.error(bad[0].span, f"{node.func}() has no keyword argument '{bad[0].name}'")
            return None
        if len(node.args) != n:
            s = "" if n == 1 else "s"
            self.c.error(node.span, f"{node.func}() takes {n} argument{s}, got {len(node.args)}")
            for a in node.args:
                self.c.expr(a, self.scope)
            return None
        vals = [self.c.expr(a, self.scope) for a in node.args]
        if POISON in vals:
            return None
        return vals

    def tile(self, v, a):
        t = self.c.as_tile(v, a.span)
        if isinstance(t, (ir.Const, ir.FloatConst)):
            t = self.c.weak_to_tile(t, "f32" if isinstance(t, ir.FloatConst) else "i32", a.span)
        return t

    def float_unary(self):
        vals = self.args(1)
        if vals is None:
            return POISON
        v = vals[0]
        if isinstance(v, (ir.Const, ir.FloatConst)):
            v = ir.FloatConst(float(v.value), v.span)
        t = self.tile(v, self.node.args[0])
        if t is POISON:
            return POISON
        if t.dtype != "f32":
            return self.c.error(self.node.span, f"{self.node.func}() needs an f32 tile, got {t.dtype}{_hint(t.dtype)}")
        return ir.Elementwise(self.node.func, (t,), "f32", t.shape, self.node.span)

    def b_abs(self):
        vals = self.args(1)
        if vals is None:
            return POISON
        t = self.tile(vals[0], self.node.args[0])
        if t is POISON:
            return POISON
        if t.dtype not in ("f32", "i32"):
            return self.c.error(self.node.span, f"abs() needs an f32 or i32 tile, got {t.dtype}{_hint(t.dtype)}")
        return ir.Elementwise("abs", (t,), t.dtype, t.shape, self.node.span)

    def b_max(self):
        vals = self.args(2)
        if vals is None:
            return POISON
        a, b = vals
        sa, sb = self.c.scalarish(a), self.c.scalarish(b)
        if sa is not None and sb is not None:
            return self.c.scalar_binary(self.node.func, sa, sb, self.node.span)
        # Elementwise: the same typing as an arithmetic operator, then rename.
        r = self.c.binary("-", a, b, self.node.span)
        if r is POISON:
            return POISON
        if isinstance(r, ir.FloatConst):
            return ir.FloatConst((max if self.node.func == "max" else min)(a.value, b.value), self.node.span)
        return ir.Elementwise(self.node.func, r.args, r.dtype, r.shape, self.node.span)

    b_min = b_max

    def reduce(self, name: str):
        vals = self.args(1, ("axis",))
        if vals is None:
            return POISON
        kw = {k.name: k for k in self.node.keywords}
        if "axis" not in kw:
            return self.c.error(self.node.span, f"{name}() needs axis=0 or axis=1")
        axis = self.c.const_int(kw["axis"].value, self.scope, "axis")
        if axis is None:
            return POISON
        if axis not in (0, 1):
            return self.c.error(kw["axis"].value.span, f"axis must be 0 or 1, got {axis}")
        t = self.tile(vals[0], self.node.args[0])
        if t is POISON:
            return POISON
        if t.dtype not in ("f32", "i32"):
            return self.c.error(self.node.span, f"{name}() needs an f32 or i32 tile, got {t.dtype}{_hint(t.dtype)}")
        shape = (1, t.shape[1]) if axis == 0 else (t.shape[0], 1)
        dtype = "i32" if name == "argmax" else t.dtype
        return ir.Reduce(name, t, axis, dtype, shape, self.node.span)

    def b_where(self):
        vals = self.args(3)
        if vals is None:
            return POISON
        cond = self.c.as_tile(vals[0], self.node.args[0].span)
        if cond is POISON:
            return POISON
        if isinstance(cond, (ir.Const, ir.FloatConst)) or cond.dtype != "bool":
            shown = "a constant" if isinstance(cond, (ir.Const, ir.FloatConst)) else cond.dtype
            return self.c.error(
                self.node.args[0].span,
                f"where() needs a mask (a comparison) as condition, got {shown}; use if for scalars",
            )
        pair = self.c.unify(vals[1], vals[2], self.node.span, "where")
        if pair is None:
            return POISON
        a, b, shape = pair
        full = _broadcast(shape, cond.shape)
        if full is None:
            return self.c.error(
                self.node.span,
                f"shape mismatch: where() condition {_describe(cond.shape)} and values {_describe(shape)}",
            )
        return ir.Elementwise("where", (cond, a, b), a.dtype, full, self.node.span)

    def convert(self, dtype: str):
        vals = self.args(1)
        if vals is None:
            return POISON
        v = vals[0]
        if isinstance(v, ir.Const):
            if dtype == "i32":
                return v
            return ir.FloatConst(float(v.value), v.span) if dtype == "f32" else ir.Convert(
                ir.Literal(float(v.value), "f32", (1, 1), v.span), "bf16", (1, 1), self.node.span)
        if isinstance(v, ir.FloatConst):
            if dtype == "f32":
                return v
            lit = ir.Literal(v.value, "f32", (1, 1), v.span)
            return ir.Convert(lit, dtype, (1, 1), self.node.span)
        s = self.c.scalarish(v)
        if s is not None and dtype == "i32":
            return s
        t = self.tile(v, self.node.args[0])
        if t is POISON:
            return POISON
        return ir.Convert(t, dtype, t.shape, self.node.span)

    def b_f32(self):
        return self.convert("f32")

    def b_bf16(self):
        return self.convert("bf16")

    def b_i32(self):
        return self.convert("i32")

    def b_iota(self):
        if self.args(2) is None:
            return POISON
        axis = self.c.const_int(self.node.args[0], self.scope, "iota() axis")
        n = self.c.const_int(self.node.args[1], self.scope, "iota() length")
        if axis is None or n is None:
            return POISON
        if axis not in (0, 1):
            return self.c.error(self.node.args[0].span, f"axis must be 0 or 1, got {axis}")
        if n <= 0:
            return self.c.error(self.node.args[1].span, f"iota() length must be positive, got {n}")
        return ir.Iota(axis, "i32", (n, 1) if axis == 0 else (1, n), self.node.span)

    def b_matmul(self):
        vals = self.args(2)
        if vals is None:
            return POISON
        a = self.tile(vals[0], self.node.args[0])
        b = self.tile(vals[1], self.node.args[1])
        if a is POISON or b is POISON:
            return POISON
        if not (a.dtype == b.dtype and a.dtype in ("bf16", "f32")):
            return self.c.error(
                self.node.span,
                f"dtype mismatch: matmul operands must both be bf16 or both f32, got {a.dtype} and {b.dtype}",
            )
        if a.shape[1] != b.shape[0]:
            return self.c.error(
                self.node.span, f"shape mismatch: matmul {_describe(a.shape)} x {_describe(b.shape)} (inner dimensions differ)"
            )
        return ir.Matmul(a, b, "f32", (a.shape[0], b.shape[1]), self.node.span)

    def b_transpose(self):
        vals = self.args(1)
        if vals is None:
            return POISON
        t = self.tile(vals[0], self.node.args[0])
        if t is POISON:
            return POISON
        return ir.Transpose(t, t.dtype, (t.shape[1], t.shape[0]), self.node.span)

    def b_scalar(self):
        vals = self.args(1)
        if vals is None:
            return POISON
        v = vals[0]
        if isinstance(v, ir.Const):
            return v
        t = self.tile(v, self.node.args[0])
        if t is POISON:
            return POISON
        if t.shape != (1, 1) or t.dtype not in ("i32", "bool"):
            return self.c.error(self.node.span, f"scalar() needs an i32 [1, 1] tile (one element), got {_tile_desc(t)}")
        return ir.TileToScalar(t, self.node.span)

    def spmd(self):
        name = self.node.func
        vals = self.args(SPMD_ARITY[name])
        if vals is None:
            return POISON
        out = []
        for k, (v, a) in enumerate(zip(vals, self.node.args)):
            axis_arg = name in ("mesh_dim", "chip_coord") or (name == "peer" and k == 0)
            if axis_arg:
                if not isinstance(v, ir.Const):
                    return self.c.error(a.span, f"the axis of {name}() must be a compile-time integer")
                if v.value not in (0, 1, 2):
                    return self.c.error(a.span, f"mesh axis must be 0, 1 or 2, got {v.value}")
            s = self.c.as_scalar(v, a.span)
            if s is POISON:
                return POISON
            out.append(s)
        return ir.Spmd(name, tuple(out), self.node.span)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _hint(dtype: str) -> str:
    return "; convert with f32() first" if dtype == "bf16" else ""


# ---------------------------------------------------------------- statements


@attrs.define(eq=False)
class _KernelCtx:
    """Per-kernel state: emitted entities, loop ranges, semaphore bookkeeping."""

    mode: str  # "kernel", "fn" (stand-alone fn check) or "host"
    buffers: list = attrs.Factory(list)
    sems: list = attrs.Factory(list)
    ranges: dict = attrs.Factory(dict)
    signalled: set = attrs.Factory(set)
    waited: set = attrs.Factory(set)
    waits: list = attrs.Factory(list)  # (Semaphore, span)
    posts: list = attrs.Factory(list)  # (Semaphore, span, what)
    handles: list = attrs.Factory(list)
    inline_id: int = 0
    host_arrays: list = attrs.Factory(list)
    launches: list = attrs.Factory(list)
    kernels: dict = attrs.Factory(dict)


class Elaborator(Checker):
    """Statement-level elaboration of kernels, fns and the host block."""

    # -------------------------------------------------------------- program
    def program(self, main_file: str, main_dir: Path) -> ir.Program | None:
        self.collect_globals()
        params, consts = {}, {}
        for name, decl in self.global_decls.items():
            if isinstance(decl, (ast.ParamDecl, ast.ConstDecl)):
                v = self.const_value(name, decl)
                if v is not None:
                    (params if isinstance(decl, ast.ParamDecl) else consts)[name] = v
        for module in self.modules:
            for item in module.items:
                if isinstance(item, ast.Assert):
                    self.assertion(item, self.globals)
        for decl in self.global_decls.values():
            if isinstance(decl, ast.FnDecl):
                self.check_fn_alone(decl)
        kernels = {}
        for name, decl in self.global_decls.items():
            if isinstance(decl, ast.KernelDecl):
                kernels[name] = self.kernel(decl)
        main = next((m for m in self.modules if m.file == main_file), None)
        host, reference = None, None
        if main is not None:
            hosts = [i for i in main.items if isinstance(i, ast.HostDecl)]
            for extra in hosts[1:]:
                self.error(extra.span, f"a program has one host block (the first is at {hosts[0].span})")
            if hosts:
                host = self.host(hosts[0], kernels)
            refs = [i for i in main.items if isinstance(i, ast.Reference)]
            for extra in refs[1:]:
                self.error(extra.span, f"a program names one reference (the first is at {refs[0].span})")
            if refs:
                reference = self.reference(refs[0], main_dir)
        return ir.Program(main_file, params, consts, kernels, host, reference, self.sources,
                          self.param_info(params))

    def param_info(self, params: dict[str, int]) -> tuple[ParamInfo, ...]:
        """Every param that has a value, as declared (imported files' first)."""
        return tuple(
            ParamInfo(name, params[name], self.param_defaults[name], self.param_domains.get(name),
                      decl.description or "", decl.span)
            for name, decl in self.global_decls.items()
            if isinstance(decl, ast.ParamDecl) and name in params and self.param_defaults.get(name) is not None
        )

    def reference(self, item: ast.Reference, main_dir: Path) -> ir.ReferenceFn | None:
        path, sep, fn = item.target.rpartition(":")
        is_module = bool(path) and not path.endswith(".py") and all(p.isidentifier() for p in path.split("."))
        if not sep or not path or not fn.isidentifier() or not (is_module or path.endswith(".py")):
            self.error(item.span, f"reference must be \"FILE.py:FUNCTION\" or \"package.module:FUNCTION\", "
                                  f"got \"{item.target}\"")
            return None
        if is_module:
            # Imported when the program runs (the front end imports no Python code).
            return ir.ReferenceFn(None, fn, item.span, module=path)
        full = (main_dir / path).resolve()
        if not full.is_file():
            self.error(item.span, f"reference file '{path}' not found (looked for {full})")
            return None
        return ir.ReferenceFn(str(full), fn, item.span)

    def assertion(self, item: ast.Assert, scope: Scope) -> None:
        v = self.const_int(item.cond, scope, "an assert condition")
        if v is not None and not v:
            self.error(item.span, "assertion failed" + (f": {item.message}" if item.message else ""))

    # --------------------------------------------------------------- types
    def dims(self, exprs, scope, what: str, max_rank: int, span: SourceSpan) -> tuple[int, ...] | None:
        if len(exprs) > max_rank:
            self.error(span, f"{what} can have at most {max_rank} dimension(s), got {len(exprs)}")
            return None
        out = []
        for e in exprs:
            v = self.const_int(e, scope, "a dimension")
            if v is None:
                return None
            if v <= 0:
                self.error(e.span, f"dimensions must be positive, got {v}")
                return None
            out.append(v)
        return tuple(out)

    def dtype(self, name: str, span: SourceSpan, allowed=DTYPES) -> bool:
        if name not in allowed:
            self.error(span, f"unknown dtype '{name}' (expected {', '.join(allowed)})")
            return False
        return True

    def slot_count(self, exprs, scope, span, what: str) -> int | None:
        if len(exprs) != 1:
            self.error(span, f"{what} takes one count in its first brackets, got {len(exprs)}")
            return None
        n = self.const_int(exprs[0], scope, "a count")
        if n is not None and n <= 0:
            self.error(exprs[0].span, f"count must be positive, got {n}")
            return None
        return n

    def mem_type(self, t: ast.MemType, scope, name: str, role: str) -> ir.Buffer | None:
        if not self.dtype(t.dtype, t.span, ("i32",) if t.space == "smem" else DTYPES):
            return None
        max_rank = 3 if t.space == "hbm" else 2
        shape = self.dims(t.dims, scope, f"{t.space} arrays", max_rank, t.span)
        slots = None
        if t.slots is not None:
            if t.space == "hbm":
                self.error(t.span, "HBM arrays have no slots; add a leading dimension instead")
                return None
            slots = self.slot_count(t.slots, scope, t.span, "a buffer array")
            if slots is None:
                return None
        if shape is None:
            return None
        return ir.Buffer(name, t.space, t.dtype, shape, slots, t.span, role)

    # ------------------------------------------------------------- kernels
    def kernel(self, decl: ast.KernelDecl) -> ir.Kernel:
        self.ctx = _KernelCtx("kernel")
        scope = Scope(self.globals)
        params = []
        for p in decl.params:
            if isinstance(p.type, ast.ScalarType):
                if self.dtype(p.type.name, p.type.span, ("i32",)):
                    var = ir.ScalarVar(p.name, "param", p.span)
                    params.append(var)
                    self.define(scope, p.name, var, p.name_span, "parameter")
            elif isinstance(p.type, ast.MemType) and p.type.space == "hbm":
                buf = self.mem_type(p.type, scope, p.name, "param")
                if buf is not None:
                    params.append(buf)
                    self.define(scope, p.name, buf, p.name_span, "parameter")
                else:
                    self.define(scope, p.name, POISON, p.name_span, "parameter")
            else:
                self.error(p.type.span, "kernel parameters are HBM arrays or i32 scalars (kernels see nothing of each other's VMEM)")
                self.define(scope, p.name, POISON, p.name_span, "parameter")
        body = self.block(decl.body, scope)
        self.semaphore_checks()
        ctx, self.ctx = self.ctx, None
        return ir.Kernel(decl.name, tuple(params), tuple(ctx.buffers), tuple(ctx.sems), tuple(body), decl.span)

    def semaphore_checks(self) -> None:
        ctx = self.ctx
        for sem, span in ctx.waits:
            if sem not in ctx.signalled:
                self.error(span, f"wait on semaphore '{sem.name}', but no started DMA or signal ever targets it")
        for sem, span, what in ctx.posts:
            if sem not in ctx.waited:
                self.error(span, f"{what} on semaphore '{sem.name}' is never waited (every semaphore must be back to 0 when the kernel ends)")
        for h in ctx.handles:
            if not h.started and not h.waited:
                self.error(h.span, f"DMA '{h.name}' is described but never started or waited")
            elif not h.waited and h.dma.sem.sem not in ctx.waited:
                self.error(h.span, f"DMA '{h.name}' is never waited")

    def check_fn_alone(self, decl: ast.FnDecl) -> None:
        """Check an fn body once with its declared types (if they are all static)."""
        self.ctx = _KernelCtx("fn")
        scope = Scope(self.globals)
        self.inline_stack = []
        for p in decl.params:
            if isinstance(p.type, ast.ScalarType):
                if not self.dtype(p.type.name, p.type.span, ("i32",)):
                    self.define(scope, p.name, POISON, p.name_span, "parameter")
                    continue
                self.define(scope, p.name, ir.ScalarVar(p.name, "param", p.span), p.name_span, "parameter")
        for p in decl.params:
            if isinstance(p.type, ast.ScalarType):
                continue
            entity = self.fn_param_entity(p, scope)
            if entity is None:
                # A type that depends on scalar parameters: checked at each call only.
                self.ctx = None
                return
            self.define(scope, p.name, entity, p.name_span, "parameter")
        self.block(decl.body, scope)
        self.ctx = None

    def fn_param_entity(self, p: ast.Param, scope: Scope):
        n_before = len(self.errors)
        if isinstance(p.type, ast.SemType):
            count = None
            if p.type.count is not None:
                count = self.slot_count(p.type.count, scope, p.type.span, "a semaphore array")
                if count is None:
                    return POISON
            return ir.Semaphore(p.name, count, p.span)
        if not self.static_type(p.type, scope):
            return None
        buf = self.mem_type(p.type, scope, p.name, "param")
        if buf is None:
            return POISON if len(self.errors) > n_before else None
        return buf

    def static_type(self, t: ast.MemType, scope: Scope) -> bool:
        """Whether every dim of t folds to a constant (without reporting errors)."""
        saved = dict(self.errors)
        ok = True
        for e in t.dims + (t.slots or ()):
            if not isinstance(self.expr(e, scope), ir.Const):
                ok = False
        if not ok:
            self.errors = saved
        return ok

    # ---------------------------------------------------------------- blocks
    def block(self, block: ast.Block, parent: Scope) -> list:
        scope = Scope(parent)
        out: list = []
        for stmt in block.stmts:
            self.stmt(stmt, scope, out)
        return out

    def stmt(self, s, scope: Scope, out: list) -> None:
        host = self.ctx.mode == "host"
        if host and not isinstance(s, (ast.Launch, ast.IoDecl, ast.For, ast.If, ast.Assert, ast.Let, ast.BufferDecl)):
            self.error(s.span, "only input/output/hbm declarations, launch, for, if, let and assert are allowed in the host block")
            return
        if not host and isinstance(s, (ast.Launch, ast.IoDecl)):
            self.error(s.span, f"'{'launch' if isinstance(s, ast.Launch) else s.kind}' is only allowed in the host block")
            return
        method = getattr(self, "s_" + type(s).__name__)
        method(s, scope, out)

    def s_Assert(self, s: ast.Assert, scope, out) -> None:
        self.assertion(s, scope)

    def s_BufferDecl(self, s: ast.BufferDecl, scope, out) -> None:
        host = self.ctx.mode == "host"
        if host and s.space != "hbm":
            self.error(s.span, "the host block declares HBM arrays only (input, output, hbm)")
            return
        if not host and s.space == "hbm":
            self.error(s.span, "kernels cannot allocate HBM; pass an HBM array as a parameter")
            return
        t = ast.MemType(s.space, s.dtype, s.dims, s.slots, s.span)
        buf = self.mem_type(t, scope, self.unique(s.name), "scratch" if host else "local")
        self.define(scope, s.name, buf if buf is not None else POISON, s.name_span, "buffer")
        if buf is not None:
            (self.ctx.host_arrays if host else self.ctx.buffers).append(buf)

    def s_SemDecl(self, s: ast.SemDecl, scope, out) -> None:
        count = None
        if s.count is not None:
            count = self.slot_count(s.count, scope, s.span, "a semaphore array")
            if count is None:
                self.define(scope, s.name, POISON, s.name_span, "semaphore")
                return
        sem = ir.Semaphore(self.unique(s.name), count, s.span)
        self.ctx.sems.append(sem)
        self.define(scope, s.name, sem, s.name_span, "semaphore")

    def s_VarDecl(self, s: ast.VarDecl, scope, out) -> None:
        if s.dims is None:
            if not self.dtype(s.dtype, s.span, ("i32",)):
                self.define(scope, s.name, POISON, s.name_span, "variable")
                return
            var = ir.ScalarVar(self.unique(s.name), "var", s.span)
            init = ir.Const(0, s.span)
            if s.init is not None:
                init = self.as_scalar(self.expr(s.init, scope), s.init.span, "an integer initial value")
            self.define(scope, s.name, var, s.name_span, "variable")
            if init is not POISON:
                out.append(ir.SetScalar(var, init, s.span))
            return
        t = ast.MemType("var", s.dtype, s.dims, None, s.span)
        if not self.dtype(s.dtype, s.span):
            self.define(scope, s.name, POISON, s.name_span, "variable")
            return
        shape = self.dims(s.dims, scope, "a tile var", 2, s.span)
        if shape is None:
            self.define(scope, s.name, POISON, s.name_span, "variable")
            return
        buf = ir.Buffer(self.unique(s.name), "var", s.dtype, shape, None, t.span, "local")
        self.ctx.buffers.append(buf)
        self.define(scope, s.name, buf, s.name_span, "variable")
        if s.init is not None:
            ref = ir.Ref(buf, None, tuple(ir.Const(0, s.span) for _ in shape), shape, s.name_span)
            self.store(ref, "=", self.expr(s.init, scope), s.init.span, s.span, out)

    def s_Let(self, s: ast.Let, scope, out) -> None:
        v = self.expr(s.value, scope)
        entity = self.bind_value(v, s.name, s.value.span, s.span, out)
        self.define(scope, s.name, entity, s.name_span, "let binding")

    def bind_value(self, v, name: str, value_span, span, out):
        match v:
            case _Poison():
                return POISON
            case ir.Const():
                return ConstVal(v.value)
            case ir.FloatConst():
                return FloatVal(v.value)
            case ir.SemRef():
                return v
            case ir.Dma():
                h = DmaHandle(name, v, span)
                self.ctx.handles.append(h)
                return h
            case DmaHandle():
                return v
        s = self.scalarish(v)
        if s is not None:
            if self.ctx.mode == "host":
                return self.error(value_span, "host lets must be compile-time integers")
            var = ir.ScalarVar(self.unique(name), "let", span)
            r = self._interval(s)
            if r is not None:
                self.ctx.ranges[var] = r
            out.append(ir.LetScalar(var, s, span))
            return var
        if isinstance(v, ir.Ref):
            return v
        if isinstance(v, ir.TILE_NODES):
            if self.ctx.mode == "host":
                return self.error(value_span, "host lets must be compile-time integers")
            tv = ir.TileValue(self.unique(name), v.dtype, v.shape, span)
            out.append(ir.LetTile(tv, v, span))
            return tv
        return self.error(value_span, f"cannot bind {self.kind_name(v)} with let")

    # -- assignment
    def s_Assign(self, s: ast.Assign, scope, out) -> None:
        target = self.expr(s.target, scope)
        value = self.expr(s.value, scope)
        if target is POISON:
            return
        op = None if s.op == "=" else s.op[0]
        if isinstance(target, ir.ScalarRead):
            var = target.var
            if var.kind != "var":
                kinds = {"param": "a parameter", "let": "a let binding", "loop": "a loop variable"}
                self.error(s.target.span, f"cannot assign to '{var.name}': it is {kinds[var.kind]} (declare it with var)")
                return
            if value is POISON:
                return
            v = self.as_scalar(value, s.value.span, "an integer value")
            if v is POISON:
                return
            if op is not None:
                v = self.scalar_binary(op, target, v, s.span)
                if v is POISON:
                    return
            out.append(ir.SetScalar(var, v, s.span))
            return
        if isinstance(target, ir.Ref):
            self.store(target, s.op, value, s.value.span, s.span, out, s.target.span)
            return
        what = self.kind_name(target)
        if isinstance(target, ir.Const):
            what = "a constant"
        elif isinstance(target, ir.ValueRead):
            what = f"the let-bound tile '{target.value.name}' (declare it with var to update it)"
        self.error(s.target.span, f"cannot assign to {what}")

    def store(self, ref: ir.Ref, op_text: str, value, value_span, span, out, target_span=None) -> None:
        target_span = target_span or ref.span
        buf = ref.buffer
        if buf.slots is not None and ref.slot is None:
            self.error(target_span, f"buffer array '{buf.name}' needs a slot index: {buf.name}[slot]")
            return
        if buf.space == "hbm":
            self.error(target_span, f"HBM array '{buf.name}' can only be written by a DMA (copy)")
            return
        op = None if op_text == "=" else op_text[0]
        if buf.space == "smem":
            if ref.shape:
                self.error(target_span, f"SMEM buffer '{buf.name}' holds scalars; index one element to store")
                return
            if value is POISON:
                return
            v = self.as_scalar(value, value_span, "an integer value for SMEM")
            if v is POISON:
                return
            if op is not None:
                v = self.scalar_binary(op, ir.SmemLoad(ref, ref.span), v, span)
            out.append(ir.StoreSmem(ref, v, span))
            return
        if value is POISON:
            return
        if len(ref.shape) > 2:
            self.error(target_span, "a tile store needs at most 2 dimensions")
            return
        cur = ir.Load(ref, ref.dtype, ref.tile_shape, ref.span)
        if op is not None:
            if buf.dtype == "bf16":
                self.error(span, f"'{op_text}' is not defined on bf16 buffers; compute in f32 and store bf16(...)")
                return
            check = self.binary(op, cur, value, span)
            if check is POISON:
                return
        t = self.as_tile(value, value_span)
        if t is POISON:
            return
        if isinstance(t, (ir.Const, ir.FloatConst)):
            if buf.dtype == "bf16" and isinstance(t, ir.FloatConst):
                t = ir.Convert(ir.Literal(t.value, "f32", (1, 1), t.span), "bf16", (1, 1), t.span)
            else:
                t = self.weak_to_tile(t, buf.dtype, value_span)
                if t is POISON:
                    return
        if t.dtype != buf.dtype:
            hint = {"bf16": "round explicitly with bf16(...)", "i32": "convert explicitly with i32(...)",
                    "f32": "convert explicitly with f32(...)"}[buf.dtype]
            what = "a mask" if t.dtype == "bool" else t.dtype
            self.error(span, f"dtype mismatch: storing {what} into {buf.dtype} buffer '{buf.name}'; {hint}")
            return
        full = _broadcast(ref.tile_shape, t.shape)
        if full != ref.tile_shape:
            self.error(span, f"shape mismatch: storing {_tile_desc(t)} into {_describe(ref.tile_shape)} view of '{buf.name}'")
            return
        out.append(ir.StoreTile(ref, t, op, span))

    # -- expression statements: fn calls, signal, barrier
    def s_ExprStmt(self, s: ast.ExprStmt, scope, out) -> None:
        e = s.expr
        if not isinstance(e, ast.Call):
            v = self.expr(e, scope)
            if v is not POISON:
                self.error(s.span, "this expression does nothing; assign it or call a function")
            return
        b = self.globals.local(e.func)
        if b is not None and isinstance(b.entity, ast.FnDecl):
            self.inline(b.entity, e, scope, out)
        elif e.func == "signal":
            self.signal(e, scope, out)
        elif e.func == "barrier":
            self.barrier(e, scope, out)
        elif e.func == "copy":
            v = self.expr(e, scope)
            if v is not POISON:
                self.error(s.span, "copy() only describes a DMA: write `start copy(...)`")
        else:
            v = self.expr(e, scope)
            if v is not POISON:
                self.error(s.span, f"the result of {e.func}() is unused")

    def signal(self, e: ast.Call, scope, out) -> None:
        if e.keywords or len(e.args) != 2:
            self.error(e.span, f"signal() takes 2 arguments (signal(sem, amount) or signal(sem @ core, amount)), got {len(e.args)}")
            return
        first = e.args[0]
        target = None
        if isinstance(first, ast.Remote):
            target = self.as_scalar(self.expr(first.target, scope), first.target.span, "a core id")
            first = first.value
        sem = self.sem_arg(first, scope)
        amount = self.as_scalar(self.expr(e.args[1], scope), e.args[1].span, "an integer amount")
        if POISON in (sem, amount, target):
            return
        self.post(sem.sem, e.span, "signal")
        out.append(ir.Signal(sem, amount, target, e.span))

    def barrier(self, e: ast.Call, scope, out) -> None:
        if e.keywords or len(e.args) > 1:
            self.error(e.span, f"barrier() takes 0 or 1 argument (a mesh axis), got {len(e.args)}")
            return
        axis = None
        if e.args:
            axis = self.const_int(e.args[0], scope, "the barrier axis")
            if axis is None:
                return
            if axis not in (0, 1, 2):
                self.error(e.args[0].span, f"mesh axis must be 0, 1 or 2, got {axis}")
                return
        out.append(ir.Barrier(axis, e.span))

    def post(self, sem: ir.Semaphore, span, what: str) -> None:
        self.ctx.signalled.add(sem)
        self.ctx.posts.append((sem, span, what))

    # -- DMA
    def dma_of(self, node, scope):
        v = self.expr(node, scope)
        if v is POISON:
            return None, None
        if isinstance(v, DmaHandle):
            return v.dma, v
        if isinstance(v, ir.Dma):
            return v, None
        self.error(node.span, f"expected a DMA (a copy(...) or a name bound to one), got {self.kind_name(v)}")
        return None, None

    def s_Start(self, s: ast.Start, scope, out) -> None:
        dma, handle = self.dma_of(s.dma, scope)
        if dma is None:
            return
        if handle is not None:
            handle.started = True
        self.post(dma.sem.sem, s.span, "DMA started")
        if dma.recv_sem is not None:
            self.post(dma.recv_sem.sem, s.span, "remote DMA started (receive side)")
        out.append(ir.DmaStart(dma, s.span))

    def s_Wait(self, s: ast.Wait, scope, out) -> None:
        dma, handle = self.dma_of(s.dma, scope)
        if dma is None:
            return
        if s.recv and dma.target is None:
            self.error(s.span, "'wait recv' is for remote copies (copy(src, dst @ core, send, recv))")
            return
        if handle is not None:
            handle.waited = True
        side = "recv" if s.recv else ("send" if dma.target is not None else "local")
        sem = dma.recv_sem if s.recv else dma.sem
        self.ctx.waited.add(sem.sem)
        self.ctx.waits.append((sem.sem, s.span))
        out.append(ir.DmaWait(dma, side, s.span))

    def s_WaitSem(self, s: ast.WaitSem, scope, out) -> None:
        sem = self.sem_arg(s.sem, scope)
        amount = self.as_scalar(self.expr(s.amount, scope), s.amount.span, "an integer amount")
        if sem is POISON or amount is POISON:
            return
        self.ctx.waited.add(sem.sem)
        self.ctx.waits.append((sem.sem, s.span))
        out.append(ir.SemWait(sem, amount, s.span))

    # -- control flow
    def s_For(self, s: ast.For, scope, out) -> None:
        start = self.as_scalar(self.expr(s.start, scope), s.start.span, "an integer loop bound")
        stop = self.as_scalar(self.expr(s.stop, scope), s.stop.span, "an integer loop bound")
        step = 1
        if s.step is not None:
            step = self.const_int(s.step, scope, "the loop step")
            if step is not None and step <= 0:
                self.error(s.step.span, f"the loop step must be positive, got {step}")
                step = None
        if self.ctx.mode == "host":
            if POISON in (start, stop) or step is None:
                return
            if not isinstance(start, ir.Const) or not isinstance(stop, ir.Const):
                self.error(s.span, "host loops need compile-time bounds")
                return
            for i in range(start.value, stop.value, step):
                inner = Scope(scope)
                self.define(inner, s.var, ConstVal(i), s.var_span, "loop variable")
                for st in s.body.stmts:
                    self.stmt(st, inner, out)
            return
        var = ir.ScalarVar(self.unique(s.var), "loop", s.var_span)
        inner = Scope(scope)
        self.define(inner, s.var, var, s.var_span, "loop variable")
        if isinstance(start, ir.Const) and isinstance(stop, ir.Const) and step:
            if stop.value > start.value:
                last = start.value + (stop.value - 1 - start.value) // step * step
                self.ctx.ranges[var] = (start.value, last, frozenset([var]))
        body = []
        for st in s.body.stmts:
            self.stmt(st, inner, body)
        if POISON not in (start, stop) and step is not None:
            out.append(ir.For(var, start, stop, step, tuple(body), s.span))

    def s_If(self, s: ast.If, scope, out) -> None:
        cond = self.as_scalar(self.expr(s.cond, scope), s.cond.span, "a scalar condition (use where() for tiles)")
        branches = [s.then, s.orelse]

        def run(branch):
            body: list = []
            if isinstance(branch, ast.Block):
                body = self.block(branch, scope)
            elif isinstance(branch, ast.If):
                self.s_If(branch, scope, body)
            return body

        if isinstance(cond, ir.Const):
            out.extend(run(branches[0] if cond.value else branches[1]))
            return
        if self.ctx.mode == "host":
            if cond is not POISON:
                self.error(s.cond.span, "host if needs a compile-time condition")
            return
        saved = dict(self.ctx.ranges)
        if cond is not POISON:
            self.narrow(cond)
        then = run(branches[0])
        self.ctx.ranges = saved
        orelse = run(branches[1])
        if cond is not POISON:
            out.append(ir.If(cond, tuple(then), tuple(orelse), s.span))

    def narrow(self, cond) -> None:
        """Narrow loop-variable ranges inside `if` by `v + c < N`-style conditions."""
        if isinstance(cond, ir.ScalarOp) and cond.op == "&&":
            self.narrow(cond.args[0])
            self.narrow(cond.args[1])
            return
        if not (isinstance(cond, ir.ScalarOp) and cond.op in ("<", "<=", ">", ">=", "!=")):
            return
        diff = _linear(ir.ScalarOp("-", cond.args, cond.span))  # lhs - rhs
        terms = {k: v for k, v in diff.items() if k != 1}
        if len(terms) != 1:
            return
        (key, coef), = terms.items()
        var = next((v for v in self.ctx.ranges if key == ("v", id(v))), None)
        if var is None or coef not in (1, -1):
            return
        lo, hi, deps = self.ctx.ranges[var]
        c = diff.get(1, 0)
        op = cond.op
        if coef == -1:  # -v + c op 0  <=>  v - c flipped-op 0
            op = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "!=": "!="}[op]
            c = -c
        bound = -c  # v op bound
        if op == "<":
            hi = min(hi, bound - 1)
        elif op == "<=":
            hi = min(hi, bound)
        elif op == ">":
            lo = max(lo, bound + 1)
        elif op == ">=":
            lo = max(lo, bound)
        elif bound == hi:
            hi -= 1
        elif bound == lo:
            lo += 1
        if lo <= hi:
            self.ctx.ranges[var] = (lo, hi, deps)
        else:  # the branch never runs: nothing to check against
            self.ctx.ranges.pop(var)

    def s_Region(self, s: ast.Region, scope, out) -> None:
        index = None
        if s.index is not None:
            index = self.as_scalar(self.expr(s.index, scope), s.index.span, "an integer region index")
        body = self.block(s.body, scope)
        if index is not POISON:
            out.append(ir.Region(s.name, index, tuple(body), s.span))

    def s_Launch(self, s: ast.Launch, scope, out) -> None:
        kernels = self.ctx.kernels
        b = self.globals.local(s.kernel)
        if b is None or not isinstance(b.entity, ast.KernelDecl):
            what = f"'{s.kernel}' is a {b.what}, not a kernel" if b else f"unknown kernel '{s.kernel}'"
            self.error(s.kernel_span, what)
            return
        decl = b.entity
        kernel = kernels.get(s.kernel)
        if len(s.args) != len(decl.params):
            self.error(s.span, f"kernel '{s.kernel}' takes {_count(len(decl.params), 'argument')}, got {len(s.args)}")
            return
        args = []
        ok = True
        for p, a in zip(decl.params, s.args):
            if isinstance(a, (ast.Keyword, ast.Remote)):
                self.error(a.span, "launch arguments are host arrays or compile-time integers")
                ok = False
                continue
            v = self.expr(a, scope)
            if v is POISON:
                ok = False
                continue
            param = next((q for q in kernel.params if q.name == p.name), None) if kernel else None
            if isinstance(p.type, ast.ScalarType):
                if not isinstance(v, ir.Const):
                    self.error(a.span, f"argument '{p.name}' must be a compile-time integer, got {self.kind_name(v)}")
                    ok = False
                    continue
                args.append(v.value)
                continue
            if not isinstance(v, ir.Ref) or v.buffer.space != "hbm":
                self.error(a.span, f"argument '{p.name}' must be a host array, got {self.kind_name(v)}")
                ok = False
                continue
            if param is None or not isinstance(param, ir.Buffer):
                ok = False
                continue
            if v.dtype != param.dtype or v.shape != param.shape:
                self.error(
                    a.span,
                    f"argument '{p.name}' is {v.dtype}{_describe(v.shape)}, kernel '{s.kernel}' expects {param.dtype}{_describe(param.shape)}",
                )
                ok = False
                continue
            args.append(v)
        if ok and kernel is not None:
            self.ctx.launches.append(ir.Launch(kernel, tuple(args), s.span))

    def s_IoDecl(self, s: ast.IoDecl, scope, out) -> None:
        t = ast.MemType("hbm", s.dtype, s.dims, None, s.span)
        buf = self.mem_type(t, scope, s.name, s.kind)
        self.define(scope, s.name, buf if buf is not None else POISON, s.name_span, s.kind)
        if buf is not None:
            self.ctx.host_arrays.append(buf)

    def host(self, decl: ast.HostDecl, kernels: dict) -> ir.Host:
        self.ctx = _KernelCtx("host", kernels=kernels)
        self.block(decl.body, Scope(self.globals))
        ctx, self.ctx = self.ctx, None
        return ir.Host(tuple(ctx.host_arrays), tuple(ctx.launches), decl.span)

    # -- fn inlining
    def inline(self, decl: ast.FnDecl, call: ast.Call, scope: Scope, out: list) -> None:
        names = [name for name, _ in self.inline_stack]
        if decl.name in names:
            chain = " -> ".join(names[names.index(decl.name):] + [decl.name])
            self.error(call.span, f"recursive fn call: {chain} (fns are inlined)")
            return
        if call.keywords:
            self.error(call.keywords[0].span, f"fn '{decl.name}' takes no keyword arguments")
            return
        if len(call.args) != len(decl.params):
            self.error(call.span, f"fn '{decl.name}' takes {_count(len(decl.params), 'argument')}, got {len(call.args)}")
            for a in call.args:
                self.expr(a.value if isinstance(a, ast.Remote) else a, scope)
            return
        callee = Scope(self.globals)
        inline_id = next(self.inline_counter)
        ok = True
        pre: list = []
        # Scalars first: a scalar bound to a constant may size the other parameters.
        for p, a in zip(decl.params, call.args):
            if not isinstance(p.type, ast.ScalarType):
                continue
            v = self.expr(a, scope)
            s = self.as_scalar(v, a.span, f"an integer for parameter '{p.name}'")
            if s is POISON:
                ok = False
                callee.names[p.name] = Binding(POISON, p.name_span, "parameter")
            elif isinstance(s, ir.Const):
                callee.names[p.name] = Binding(ConstVal(s.value), p.name_span, "parameter")
            else:
                var = ir.ScalarVar(f"{decl.name}#{inline_id}.{p.name}", "let", p.span)
                r = self._interval(s)
                if r is not None:
                    self.ctx.ranges[var] = r
                pre.append(ir.LetScalar(var, s, call.span))
                callee.names[p.name] = Binding(var, p.name_span, "parameter")
        for p, a in zip(decl.params, call.args):
            if isinstance(p.type, ast.ScalarType):
                continue
            if isinstance(a, ast.Remote):
                self.error(a.span, "'@' (a remote location) is only allowed in copy() and signal()")
                ok = False
                continue
            v = self.expr(a, scope)
            if v is POISON:
                ok = False
                continue
            entity = self.bind_param(decl, p, v, a, callee)
            if entity is POISON:
                ok = False
            callee.names[p.name] = Binding(entity, p.name_span, "parameter")
        if not ok:
            return
        out.extend(pre)
        saved_id = self.ctx.inline_id
        self.ctx.inline_id = inline_id
        self.inline_stack.append((decl.name, call.span))
        try:
            out.extend(self.block(decl.body, callee))
        finally:
            self.inline_stack.pop()
            self.ctx.inline_id = saved_id

    def bind_param(self, decl: ast.FnDecl, p: ast.Param, v, a, callee: Scope):
        t = p.type
        if isinstance(t, ast.SemType):
            if not isinstance(v, ir.SemRef):
                return self.error(a.span, f"parameter '{p.name}' of fn '{decl.name}' is a semaphore, got {self.kind_name(v)}")
            whole_array = v.sem.count is not None and v.index is None
            if t.count is None:
                if whole_array:
                    return self.error(a.span, f"parameter '{p.name}' takes one semaphore; index the array")
                return v
            count = self.slot_count(t.count, callee, t.span, "a semaphore array")
            if count is None:
                return POISON
            if not whole_array or v.sem.count != count:
                return self.error(a.span, f"parameter '{p.name}' takes an array of {count} semaphores")
            return v
        # memory parameter
        if not isinstance(v, ir.Ref):
            return self.error(a.span, f"parameter '{p.name}' of fn '{decl.name}' is a {t.space} buffer, got {self.kind_name(v)}")
        buf = v.buffer
        space_ok = buf.space == t.space or (t.space == "vmem" and buf.space == "var")
        if not space_ok:
            return self.error(a.span, f"parameter '{p.name}' of fn '{decl.name}' is in {t.space}, got a {buf.space} buffer '{buf.name}'")
        want = self.mem_type(t, callee, p.name, "param")
        if want is None:
            return POISON
        if buf.dtype != want.dtype:
            return self.error(a.span, f"dtype mismatch: parameter '{p.name}' of fn '{decl.name}' is {want.dtype}, got {buf.dtype}")
        whole = buf.slots is not None and v.slot is None
        if want.slots is not None:
            if not whole or buf.slots != want.slots or v.shape != want.shape:
                return self.error(
                    a.span, f"parameter '{p.name}' of fn '{decl.name}' is an array of {want.slots} buffers {_describe(want.shape)}"
                )
            return v
        if whole:
            return self.error(a.span, f"buffer array '{buf.name}' needs a slot index: {buf.name}[slot]")
        if v.shape != want.shape:
            return self.error(
                a.span,
                f"shape mismatch: parameter '{p.name}' of fn '{decl.name}' is {_describe(want.shape)}, got {_describe(v.shape)}",
            )
        return v
