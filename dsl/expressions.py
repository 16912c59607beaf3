"""Expressions: names, operators, views and slices, calls and copy().

`Expressions` turns an `ast` expression into an `ir` one: it resolves names, folds
compile-time arithmetic, types tile expressions (dtype and 2-D shape with
broadcasting), checks slices against their arrays (for every iteration of loops with
static bounds), and describes DMAs. Builtin calls go to `mkemu.dsl.builtins`.
"""

from __future__ import annotations

import math

import attrs

from mkemu.dsl import ast, ir
from mkemu.dsl.builtins import BUILTINS, PIPELINE_PARTS, Builtins
from mkemu.dsl.declarations import ALL_DTYPES, DTYPES, Declarations
from mkemu.dsl.folding import MAX_INT_BITS, broadcast, decimal_f32, f32_round, fold_f32, fold_int, linear
from mkemu.dsl.layout import MX_BLOCK, divisible
from mkemu.dsl.values import (
    POISON, ConstVal, DmaChoice, DmaCount, DmaHandle, DtypeVal, FloatVal, Poison, Scope, StructVal, ViewChoice,
    describe, tile_desc,
)
from mkemu.errors import SourceSpan

ARITH_OPS = ("+", "-", "*", "/")
DMA_VALUES = (DmaHandle, ir.Dma, DmaChoice)
CMP_OPS = ("==", "!=", "<", "<=", ">", ">=")
INT_OPS = ("%", "<<", ">>")
BIT_OPS = ("&", "|", "^")


class Expressions(Declarations):
    """Expression checking (the statement level is `mkemu.dsl.statements`)."""

    # ------------------------------------------------------------ expressions
    def const_int(self, node, scope, what: str) -> int | None:
        v = self.expr(node, scope)
        if isinstance(v, ir.Const) and v.dtype == "i32":
            return v.value
        if isinstance(v, ir.Const):
            self.error(node.span, f"{what} must be a compile-time integer, got a bool; convert it with i32(...)")
        elif v is not POISON and not self.call_dependent(v):
            self.error(node.span, f"{what} must be a compile-time integer")
        return None

    def const_bool(self, node, scope, what: str) -> bool | None:
        v = self.expr(node, scope)
        if isinstance(v, ir.Const) and v.dtype == "bool":
            return bool(v.value)
        if isinstance(v, ir.Const):
            self.error(node.span, f"{what} must be a bool, got an integer; compare it (e.g. x != 0)")
        elif v is not POISON and not self.call_dependent(v):
            self.error(node.span, f"{what} must be a compile-time bool")
        return None

    def call_dependent(self, v) -> bool:
        """In an fn checked on its own, a compile-time value that comes from a scalar
        parameter is known only at a call (a constant argument): the fn is checked there.
        So is one from a let computed from a parameter (`let m = n * 2;`), or from the
        parameter of an fn it calls (`inner(x, n)`), which is such a let."""
        if self.ctx is None or self.ctx.mode != "fn" or not _reads_param(v, self.ctx.let_defs):
            return False
        self.ctx.call_dependent = True
        return True

    def expr(self, node, scope: Scope):
        match node:
            case ast.IntLit():
                return ir.Const(node.value, node.span)
            case ast.FloatLit():
                return self.float_literal(node)
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
            case ast.Field():
                return self.field(node, scope)
        return self.error(node.span, "unexpected expression")

    def float_literal(self, node: ast.FloatLit):
        """A float literal is the float32 nearest its exact decimal value (ties to even, as
        the assembler rounds its immediates); one that rounds past the largest float32 is
        an error, not a silent inf."""
        value = decimal_f32(node.text)
        if math.isinf(value):
            shown = node.text if len(node.text) <= 80 else f"{node.text[:20]}...{node.text[-12:]}"
            return self.error(node.span, f"float literal {shown} is beyond the f32 range (the largest f32 is "
                                         "3.4028235e38); write inf for infinity")
        return ir.FloatConst(value, node.span)

    def f32_value(self, v, span: SourceSpan) -> float | None:
        """A compile-time number as the float32 it stands for in float arithmetic (an
        integer rounded to nearest even, as an integer literal in an f32 tile is); None
        after an error."""
        if isinstance(v, ir.FloatConst):
            return v.value
        if v.dtype == "bool":
            self.error(span, "expected a number, got a bool; convert it with i32(...)")
            return None
        x = f32_round(v.value)
        if math.isinf(x):
            self.error(span, f"the integer {v.value:,} is beyond the f32 range (the largest f32 is 3.4028235e38)")
            return None
        return x

    def name(self, node: ast.Name, scope: Scope):
        b = scope.lookup(node.name)
        if b is None:
            if node.name == "inf":
                return ir.FloatConst(math.inf, node.span)
            if node.name in ("true", "false"):
                return ir.Const(int(node.name == "true"), node.span, "bool")
            if node.name in PIPELINE_PARTS:
                return ir.Const(PIPELINE_PARTS.index(node.name), node.span)
            if node.name in ALL_DTYPES:   # (`let T = select(c, bf16, f32);`: a let cannot name a dtype)
                call = f"; to convert, call {node.name}(...)" if node.name in DTYPES else ""
                return self.error(node.span, f"'{node.name}' is a dtype, not a value: only a const can name one, "
                                             f"chosen on a compile-time condition "
                                             f"(`const T = select(P == 1, bf16, f32);`){call}")
            if node.name in BUILTINS:
                return self.error(node.span, f"'{node.name}' is a builtin function; call it with (...)")
            return self.error(node.span, f"unknown name '{node.name}'")
        e = b.entity
        match e:
            case ast.ParamDecl() | ast.ConstDecl():
                v = self.const_value(node.name, e)
                if node.name in self.dtype_consts:
                    return self.not_a_value(node, self.dtype_consts[node.name])
                return POISON if v is None else ir.Const(v, node.span, self.const_dtypes.get(node.name, "i32"))
            case DtypeVal():
                return self.not_a_value(node, e.dtype)
            case ConstVal():
                return ir.Const(e.value, node.span, e.dtype)
            case FloatVal():
                return ir.FloatConst(e.value, node.span)
            case ir.ScalarVar():
                return ir.ScalarRead(e, node.span)
            case ir.Buffer():
                if self.ctx is not None and self.ctx.mode == "host":   # (a Ref is immutable: share it)
                    view = self.ctx.whole_views.get((e, node.span))
                    if view is None:
                        view = self.ctx.whole_views[(e, node.span)] = self.whole(e, node.span)
                    return view
                return self.whole(e, node.span)
            case ir.Ref():
                return attrs.evolve(e, span=node.span)
            case ir.Semaphore():
                return ir.SemRef(e, None, node.span)
            case ir.SemRef():
                return attrs.evolve(e, span=node.span)
            case ir.TileValue():
                return ir.ValueRead(e, e.dtype, e.shape, node.span)
            case DmaHandle() | StructVal():
                return e
            case ast.FnDecl() | ast.KernelDecl():
                return self.error(node.span, f"'{node.name}' is a {b.what}, not a value")
            case ast.StructDecl():
                return self.error(node.span, f"'{node.name}' is a struct, not a value; make an instance with "
                                             f"let NAME = {node.name}();")
            case Poison():
                return POISON
        return self.error(node.span, f"'{node.name}' cannot be used here")

    def not_a_value(self, node: ast.Name, dtype: str | None):
        if dtype is None:   # (a dtype const in error, already reported)
            return POISON
        return self.error(node.span, f"'{node.name}' names a dtype ({dtype}), not a value: use it as the dtype "
                                     f"of a buffer ({node.name}[...])")

    @staticmethod
    def whole(buf: ir.Buffer, span: SourceSpan) -> ir.Ref:
        """A view of all of `buf` (every slot of an array: index one)."""
        return ir.Ref(buf, None, tuple(ir.Const(0, span) for _ in buf.shape), buf.shape, span)

    # -- value conversions
    def as_scalar(self, v, span: SourceSpan, what: str = "a scalar"):
        """v as an integer scalar (i32); a bool is an error."""
        s = self.as_any_scalar(v, span, what)
        if s is not POISON and ir.scalar_dtype(s) == "bool":
            return self.error(span, f"expected {what}, got a bool; convert it with i32(...) or choose with select(...)")
        return s

    def as_bool(self, v, span: SourceSpan, what: str = "a condition"):
        """v as a bool scalar; an integer is an error."""
        s = self.as_any_scalar(v, span, what)
        if s is not POISON and ir.scalar_dtype(s) != "bool":
            return self.error(span, f"expected {what} (a bool), got an integer; compare it (e.g. x != 0)")
        return s

    def as_any_scalar(self, v, span: SourceSpan, what: str = "a scalar"):
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
                return f"{v.buffer.space} view {v.dtype}{describe(v.shape)} of '{v.buffer.name}'"
            case ir.SemRef():
                return "a semaphore array" if v.sem.count is not None and v.index is None else "a semaphore"
            case DmaHandle() | ir.Dma() | DmaChoice():
                return "a DMA"
            case DmaCount():
                return "a count of DMAs"
            case StructVal():
                return f"an instance of struct '{v.decl.name}'"
            case ViewChoice():
                return f"a run-time choice of views {v.dtype}{describe(v.shape)}"
        if isinstance(v, ir.TILE_NODES):
            return f"a tile {tile_desc(v)}"
        return "a value"

    def as_tile(self, v, span: SourceSpan):
        """A strongly typed tile, or a weak constant (Const / FloatConst) left as is."""
        if v is POISON or isinstance(v, ir.TILE_NODES) or isinstance(v, (ir.Const, ir.FloatConst)):
            return v
        if isinstance(v, ir.SCALAR_NODES):
            if ir.scalar_dtype(v) == "bool":
                return self.error(span, "a bool scalar cannot be used in a tile expression; choose with select(...) or if")
            return ir.Splat(v, "i32", (1, 1), v.span)
        if isinstance(v, ir.Ref):
            buf = v.buffer
            if buf.slots is not None and v.slot is None:
                return self.error(span, f"buffer array '{buf.name}' needs a slot index: {buf.name}[slot]")
            if buf.dtype == "mxfp4":
                return self.error(span, mx_only(buf.name))
            if buf.space == "hbm":
                return self.error(span, f"HBM array '{buf.name}' cannot be used in a tile expression; copy it into VMEM first")
            if buf.space == "smem":
                if not v.shape:
                    return ir.Splat(ir.SmemLoad(v, v.span), "i32", (1, 1), v.span)
                return self.error(span, f"SMEM buffer '{buf.name}' holds scalars; index one element")
            if len(v.shape) > 2:
                return self.error(span, f"a tile expression needs at most 2 dimensions, got {describe(v.shape)}")
            shape = v.tile_shape
            return ir.Load(v, v.dtype, shape, v.span)
        return self.error(span, f"expected a tile, got {self.kind_name(v)}")

    def weak_to_tile(self, v, dtype: str, span: SourceSpan):
        if isinstance(v, ir.Const):
            if v.dtype == "bool":   # (as a run-time bool is told in as_tile)
                return self.error(span, "a bool scalar cannot be used in a tile expression; choose with select(...) or if")
            if dtype == "bool":
                return self.error(span, "a constant cannot be used as a mask; compare tiles to make one")
            if dtype in ("f32", "bf16"):
                x = self.f32_value(v, v.span)
                return POISON if x is None else ir.Literal(x, dtype, (1, 1), v.span)
            return ir.Literal(v.value, dtype, (1, 1), v.span)
        if isinstance(v, ir.FloatConst):
            if dtype != "f32":
                article = "an" if dtype == "i32" else "a"
                return self.error(span, f"a float constant cannot be used with {article} {dtype} tile")
            return ir.Literal(v.value, "f32", (1, 1), v.span)
        return v

    # -- operators
    def binary(self, op: str, a, b, span: SourceSpan, call: str | None = None):
        """a op b; `call` names the builtin that combines a and b this way (where), for messages."""
        if a is POISON or b is POISON:
            return POISON
        if op == "*" and (isinstance(a, DMA_VALUES) or isinstance(b, DMA_VALUES)):
            return self.dma_count(a, b, span)
        for v, side in ((a, "left"), (b, "right")):
            if isinstance(v, (ir.SemRef, ViewChoice) + DMA_VALUES) or (
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
        shown = f"{call}()" if call else f"'{op}'"

        def pair(ta, tb) -> str:
            return f"{call}() of {tile_desc(ta)} and {tile_desc(tb)}" if call else f"{tile_desc(ta)} {op} {tile_desc(tb)}"

        if not isinstance(ta, weak) and not isinstance(tb, weak) and ta.dtype != tb.dtype:
            return self.error(
                span,
                f"dtype mismatch: {pair(ta, tb)}; convert one side with f32(), i32() or bf16()",
            )
        if dtype == "bf16":
            return self.error(span, f"{shown} is not defined on bf16 tiles; convert with f32() first")
        if op == "%" or (op == "/" and dtype == "i32"):
            # (the vector unit has no integer division: a front-end error, reported with the others)
            what = "an i32 tile" if dtype == "i32" else f"{dtype} tiles" if dtype == "f32" else "masks"
            return self.error(span, f"'{op}' is not defined on {what}: integer tile division and remainder "
                                    "are not supported (tile '/' is f32 only; use shifts or '&' for powers of two)")
        if op in ARITH_OPS or op in CMP_OPS:
            if dtype not in ("f32", "i32"):
                return self.error(span, f"{shown} needs f32 or i32 tiles, got {dtype}")
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
        shape = broadcast(ta.shape, tb.shape)
        if shape is None:
            return self.error(span, f"shape mismatch: {pair(ta, tb)} cannot be broadcast together")
        out = "bool" if op in CMP_OPS else dtype
        return ir.Elementwise(op, (ta, tb), out, shape, span)

    def dma_count(self, a, b, span: SourceSpan):
        """`n * copy(...)` (or `copy(...) * n`, `n * h`): n copies like this one, waited at once."""
        dma, n = (a, b) if isinstance(a, DMA_VALUES) else (b, a)
        if isinstance(n, DMA_VALUES):
            return self.error(span, "'*' of two DMAs: a count times one copy is what a wait takes")
        n = self.as_scalar(n, span, "a count of copies")
        if n is POISON:
            return POISON
        if isinstance(n, ir.Const) and n.value < 0:   # (reported; the wait still counts as one)
            self.error(span, f"the count of copies to wait for must not be negative, got {n.value}")
        if isinstance(dma, DmaHandle):
            return DmaCount(dma.dma, dma, n, span)
        return DmaCount(dma, None, n, span)

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
        r = self.binary("-", a, b, span, call=what)
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
        da, db = ir.scalar_dtype(a), ir.scalar_dtype(b)
        if op in ("&&", "||"):
            if "i32" in (da, db):
                return self.error(span, f"'{op}' needs bools, got an integer; compare it (e.g. x != 0)")
        elif op in ("==", "!="):
            if da != db:
                return self.error(span, f"'{op}' compares a bool with an integer; convert the bool with i32(...)")
        elif "bool" in (da, db):
            return self.error(span, f"'{op}' needs integers, got a bool; convert it with i32(...) or choose "
                                    "with select(...)")
        dtype = "bool" if op in ir.BOOL_OPS else "i32"
        if isinstance(a, ir.Const) and isinstance(b, ir.Const):
            if op in ("/", "%") and b.value == 0:
                return self.error(span, "division by zero in a compile-time expression")
            if op in ("<<", ">>") and b.value < 0:
                return self.error(span, "negative shift count in a compile-time expression")
            # (Python's ints are unbounded: 1 << 10**30 would exhaust memory)
            value = None if op == "<<" and a.value and b.value > MAX_INT_BITS else fold_int(op, a.value, b.value)
            if value is None or value.bit_length() > MAX_INT_BITS:
                return self.error(span, f"the result of '{op}' is too large for a compile-time integer "
                                        f"(at most {MAX_INT_BITS} bits)")
            return ir.Const(value, span, dtype)
        if op in ("/", "%") and isinstance(b, ir.Const) and b.value == 0:
            return self.error(span, f"division by zero: the divisor of '{op}' is the constant 0")
        return ir.ScalarOp(op, (a, b), span)

    def float_binary(self, op: str, a, b, span: SourceSpan):
        """a op b folded with the vector unit's f32 arithmetic (docs/numerics.md): the same
        bits as at run time, so `1.0 / 0.0` is inf and `16777216.0 + 1.0` is 16777216.0."""
        if op not in ARITH_OPS and op not in CMP_OPS:
            return self.error(span, f"'{op}' is not defined on float constants")
        x, y = self.f32_value(a, a.span), self.f32_value(b, b.span)
        if x is None or y is None:
            return POISON
        if op in CMP_OPS:
            return ir.Const(fold_int(op, x, y), span, "bool")  # type: ignore[arg-type]
        return ir.FloatConst(fold_f32(op, x, y), span)

    def unary(self, op: str, v, span: SourceSpan):
        if v is POISON:
            return POISON
        if isinstance(v, ir.FloatConst):
            if op == "-":
                return ir.FloatConst(-v.value, span)
            return self.error(span, "'!' is not defined on float constants")
        s = self.scalarish(v)
        if s is not None:
            is_bool = ir.scalar_dtype(s) == "bool"
            if op == "-" and is_bool:
                return self.error(span, "'-' needs an integer, got a bool; convert it with i32(...)")
            if op == "!" and not is_bool:
                return self.error(span, "'!' needs a bool, got an integer; compare it (e.g. x == 0)")
            if isinstance(s, ir.Const):
                return ir.Const(-s.value if op == "-" else int(not s.value), span, s.dtype)
            return ir.ScalarOp("neg" if op == "-" else "!", (s,), span)
        t = self.as_tile(v, span)
        if t is POISON:
            return POISON
        if op == "-" and t.dtype not in ("f32", "i32"):
            return self.error(span, f"'-' needs an f32 or i32 tile, got {t.dtype}")
        if op == "!" and t.dtype != "bool":
            return self.error(span, f"'!' needs a mask (a comparison result), got {t.dtype}")
        return ir.Elementwise("neg" if op == "-" else "!", (t,), t.dtype, t.shape, span)

    def field(self, node: ast.Field, scope: Scope):
        """`w.name`: the member as a value (a whole-buffer view or a semaphore)."""
        base = self.expr(node.base, scope)
        if base is POISON:
            return POISON
        if not isinstance(base, StructVal):
            return self.error(node.span, f"'.{node.name}': only a struct instance has members, got "
                                         f"{self.kind_name(base)}")
        entity = base.members.get(node.name)
        if entity is None and any(m.name == node.name for m in base.decl.members):
            return self.error(node.name_span, f"member '{node.name}' of struct '{base.decl.name}' has a count of 0 "
                                              f"here: it is absent (only code that a compile-time condition "
                                              f"leaves out may name it)")
        if entity is None:
            known = ", ".join(base.members)
            return self.error(node.name_span, f"struct '{base.decl.name}' has no member '{node.name}' "
                                              f"(its members: {known})")
        if isinstance(entity, ir.Semaphore):
            return ir.SemRef(entity, None, node.span)
        return self.whole(entity, node.span)

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
            if size == base.buffer.shape[d] and isinstance(base.offsets[d], ir.Const) and base.offsets[d].value == 0:
                what = f"dimension {d} of '{base.buffer.name}'"   # (a whole dimension: the buffer's own)
            else:   # (a window of it: `let t = x[0:4, :]; t[2:6, :]` is not about x's 8 rows)
                what = f"dimension {k} of a view of '{base.buffer.name}'"
            if isinstance(item, (ast.Slice, ast.SizedSlice)):
                r = self.slice_bounds(item, scope, size, what)
                if r is None:
                    ok = False
                    continue
                start, length = r
                n = base.buffer.shape[d]
                if length > n and self.interval(start) is None:
                    # A run-time start is checked against the buffer's dimension (even in a
                    # view of a view): a longer window fits at no start, whether the view is
                    # used as it is or sliced again (`let u = x[0:1, i +: 600]; u[0:1, 0:128]`).
                    self.error(item.span, f"a window of {length} is longer than dimension {d} of "
                                          f"'{base.buffer.name}' (size {n}): no start fits")
                    ok = False
                    continue
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
            diff = linear(ir.ScalarOp("-", (stop, start), item.span))
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
            return self.error(node.span, f"too many indices for a tile {tile_desc(base)}")
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
                if self.call_dependent(start):   # (an fn checked on its own: checked at each call)
                    return POISON
                return self.error(item.span, "a let-bound tile can only be indexed statically; store it in a vmem buffer or var first")
            starts[k], shape[k] = start.value, length
        return ir.TileSlice(base, (starts[0], starts[1]), base.dtype, (shape[0], shape[1]), node.span)

    # -- calls
    def call(self, node: ast.Call, scope: Scope):
        b = self.globals.local(node.func)
        if b is not None and isinstance(b.entity, ast.StructDecl):
            return self.error(node.span, f"a struct instance is made with let: `let NAME = {node.func}();`")
        if b is not None and isinstance(b.entity, (ast.FnDecl, ast.KernelDecl)):
            if isinstance(b.entity, ast.KernelDecl):
                return self.error(node.func_span, f"kernel '{node.func}' can only be launched from the host block")
            return self.error(node.span, f"fn '{node.func}' has no value; call it as a statement")
        named = scope.lookup(node.func) if node.func not in BUILTINS else None
        dtype = self.named_dtype(named, node.func, scope)
        if node.func not in BUILTINS and dtype is None:
            for a in node.args:
                self.expr(a.value if isinstance(a, ast.Remote) else a, scope)
            if named is not None and named.entity is POISON:   # (a binding in error, already reported)
                return POISON
            if named is not None:
                return self.error(node.func_span, f"'{node.func}' is a {named.what}, not a function")
            return self.error(node.func_span, f"unknown function '{node.func}'")
        if node.func in ("signal", "barrier"):
            return self.error(node.span, f"{node.func}() is a statement, not a value")
        if node.func == "copy":
            return self.copy(node, scope)
        remote = [a for a in node.args if isinstance(a, ast.Remote)]
        if remote:
            return self.error(remote[0].span, "'@' (a remote location) is only allowed in copy() and signal()")
        if dtype is not None:
            return self.conversion(node, dtype, scope)
        return Builtins(self, node, scope).run()

    def named_dtype(self, binding, name: str, scope: Scope):
        """The dtype a generic or a dtype const stands for, when `name` is bound to one (None
        otherwise; POISON for a dtype const in error, already reported)."""
        if binding is None:
            return None
        if isinstance(binding.entity, DtypeVal):
            return binding.entity.dtype
        if isinstance(binding.entity, ast.ConstDecl) and self.is_dtype_form(binding.entity.value):
            return self.resolve_dtype(name, scope) or POISON
        return None

    def conversion(self, node: ast.Call, dtype, scope: Scope):
        """`T(x)` with T a dtype generic or a dtype const: the conversion its dtype names,
        exactly as `f32(x)`, `bf16(x)` or `i32(x)` would be written in its place."""
        if dtype is POISON or dtype == "mxfp4":
            for a in node.args:
                self.expr(a, scope)
            if dtype is POISON:
                return POISON
            return self.error(node.func_span, f"'{node.func}' is mxfp4 here, which has no conversion: mxfp4 holds "
                                              "matrix-unit weights (only copied, or the right operand of matmul)")
        return Builtins(self, node, scope).convert(dtype)

    def copy(self, node: ast.Call, scope: Scope):
        n = len(node.args)
        is_remote = n >= 2 and isinstance(node.args[1], ast.Remote)
        want = 4 if is_remote else 3
        if node.keywords:
            return self.error(node.keywords[0].span, "copy() takes no keyword arguments")
        for a in node.args[:1] + node.args[2:]:   # before the count: `copy(v @ c, w, s, r)` is this
            if isinstance(a, ast.Remote):
                return self.error(a.span, "only the destination of copy() can be remote (DMAs push)")
        if n != want:
            form = ("copy(src, dst @ core, send_sem, recv_sem)" if is_remote else "copy(src, dst, sem)")
            return self.error(node.span, f"copy() takes {want} arguments ({form}), got {n}")
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
            if isinstance(v, ViewChoice):
                v = v.first   # the alternatives share dtype, shape and space (checked by select)
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
        for v, a in ((src, node.args[0]), (dst, dst_node)):
            if not all(self.mx_view(leaf, a.span) for leaf in view_leaves(v)):
                return POISON
        if src.dtype == "mxfp4" and target is not None:
            return self.error(node.span, "a remote copy of mxfp4 is not supported (copy its tile to a core that "
                                         "holds it in HBM instead)")
        if isinstance(src, ViewChoice) or isinstance(dst, ViewChoice):
            return self.copy_choice(src, dst, sem, target, recv, node.span)
        if src.dtype != dst.dtype:
            return self.error(node.span, f"dtype mismatch: copy from {src.dtype} to {dst.dtype} (DMAs do not convert)")

        if _squeeze(src.shape) != _squeeze(dst.shape):
            return self.error(
                node.span, f"shape mismatch: copy from {describe(src.shape)} to {describe(dst.shape)}"
            )
        return ir.Dma(src, dst, sem, target, recv, src.size_bytes, node.span)

    def copy_choice(self, src, dst, sem, target, recv, span):
        """A copy from or to a run-time choice of views: a choice of copies."""
        for side, v in (("src", src), ("dst", dst)):
            if isinstance(v, ViewChoice):
                pick = {"src": lambda x: (x, dst), "dst": lambda x: (src, x)}[side]
                a = self.copy_choice(*pick(v.a), sem, target, recv, span)
                b = self.copy_choice(*pick(v.b), sem, target, recv, span)
                return POISON if POISON in (a, b) else DmaChoice(v.cond, a, b)
        if src.dtype != dst.dtype:
            return self.error(span, f"dtype mismatch: copy from {src.dtype} to {dst.dtype} (DMAs do not convert)")
        if _squeeze(src.shape) != _squeeze(dst.shape):
            return self.error(span, f"shape mismatch: copy from {describe(src.shape)} to {describe(dst.shape)}")
        return ir.Dma(src, dst, sem, target, recv, src.size_bytes, span)

    def mx_view(self, v, span: SourceSpan) -> bool:
        """Whether a view is one the DMAs and the matrix unit take (anything not MXFP4 is):
        an MXFP4 view keeps its last two dimensions, its rows `k0 +: K` whole scale
        blocks (k0 and K multiples of 32) and its columns `n0 +: N` whole bytes (n0 and N
        even). An offset that is not a compile-time constant must be a multiple by its
        form (`32 * i`, `K * t` with K a multiple of 32, sums of such): nothing is checked
        at run time, so nothing can be misaligned then."""
        if not isinstance(v, ir.Ref) or v.dtype != "mxfp4":
            return True
        name = v.buffer.name
        (k0, n0), (rows, cols) = v.offsets[-2:], v.sizes[-2:]
        if rows is None or cols is None:
            self.error(span, f"a view of mxfp4 '{name}' keeps its last two dimensions (rows k0 +: K, "
                             "columns n0 +: N): index only the leading ones")
            return False
        for off, length, q, what, why in ((k0, rows, MX_BLOCK, "rows", "the rows sharing one scale"),
                                          (n0, cols, 2, "columns", "two 4-bit values a byte")):
            if length % q:
                self.error(span, f"a view of mxfp4 '{name}' takes its {what} in blocks of {q} ({why}), "
                                 f"got {length}")
                return False
            if not divisible(self.expand_lets(off), q):
                shown = (f"starts at {off.value}" if isinstance(off, ir.Const)
                         else f"starts at an offset not known to be a multiple of {q}; write it as "
                              f"{q} * i (or a multiple of {q} times a variable)")
                self.error(span, f"a view of mxfp4 '{name}' must start its {what} at a multiple of {q} "
                                 f"({why}); it {shown}")
                return False
        return True

    def expand_lets(self, e, bounded: bool = False):
        """Scalar expression e with every read of a let replaced by the let's value,
        recursively (a let is immutable: `let k0 = 32 * i;` is a multiple of 32 whatever
        i becomes later); with `bounded`, only lets whose range is known to stay in int32
        (where narrowing by the value is sound). e itself if nothing is replaced."""
        if isinstance(e, ir.ScalarRead):
            value = self.ctx.let_defs.get(e.var) if self.ctx is not None else None
            if value is None:
                return e
            if bounded:
                r = self.ctx.ranges.get(e.var)
                if r is None or not (-(1 << 31) <= r[0] and r[1] < (1 << 31)):
                    return e
            return self.expand_lets(value, bounded)
        if isinstance(e, ir.ScalarOp) and e.op in ("+", "-", "*", "neg", "<", "<=", ">", ">=", "!=", "=="):
            args = tuple(self.expand_lets(a, bounded) for a in e.args)
            return e if all(a is b for a, b in zip(args, e.args)) else attrs.evolve(e, args=args)
        return e

    def sem_arg(self, a, scope):
        v = self.expr(a, scope)
        if v is POISON:
            return POISON
        if not isinstance(v, ir.SemRef):
            return self.error(a.span, f"expected a semaphore, got {self.kind_name(v)}")
        if v.sem.count is not None and v.index is None:
            return self.error(a.span, f"semaphore array '{v.sem.name}' needs an index: {v.sem.name}[i]")
        return v


def mx_only(name: str) -> str:
    return (f"'{name}' is mxfp4 (matrix-unit weights): it can only be copied or be the right operand "
            f"of matmul(x, {name}); it is not a tile")


def view_leaves(v):
    """The views of a run-time choice of views (or the view itself)."""
    if isinstance(v, ViewChoice):
        return view_leaves(v.a) + view_leaves(v.b)
    return (v,)


def _squeeze(shape) -> tuple[int, ...]:
    """A shape without its leading 1s (a copy may drop or add them)."""
    shape = list(shape)
    while shape and shape[0] == 1:
        shape.pop(0)
    return tuple(shape)


def _reads_param(e, let_defs: dict) -> bool:
    """Whether a scalar expression reads a parameter of the fn being checked, directly or
    through the lets it reads (`let_defs`: let ScalarVar -> its value)."""
    if isinstance(e, ir.ScalarRead):
        if e.var.kind == "param":
            return True
        value = let_defs.get(e.var)
        return value is not None and _reads_param(value, let_defs)
    if isinstance(e, ir.ScalarOp):
        return any(_reads_param(a, let_defs) for a in e.args)
    return False
