"""Type rules of the builtin functions (everything but copy, signal and barrier).

`Builtins(checker, call, scope).run()` checks one call of a builtin and returns its
`ir` expression (or `POISON`): elementwise maths, reductions, conversions, `where`,
`iota`, `matmul`, `transpose`, `scalar`, and the SPMD queries (`chip_id()` ...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from mkemu.dsl import ast, ir, layout
from mkemu.dsl.folding import broadcast, f32_extreme
from mkemu.dsl.values import POISON, DmaChoice, DmaHandle, Scope, ViewChoice, bf16_hint, describe, tile_desc

if TYPE_CHECKING:  # the checker imports this module
    from mkemu.dsl.expressions import Expressions

FLOAT_UNARY = ("exp", "log", "exp2", "log2", "sqrt", "rsqrt", "recip", "sigmoid", "tanh", "silu")
SPMD_ARITY = {
    "chip_id": 0, "core_id": 0, "num_chips": 0, "num_cores": 0,
    "mesh_dim": 1, "chip_coord": 1, "peer": 2, "global_core": 2,
}
BUILTINS = frozenset(
    FLOAT_UNARY
    + ("abs", "max", "min", "sum", "argmax", "where", "f32", "bf16", "i32", "iota",
       "matmul", "transpose", "scalar", "select", "bytes", "vmem_bytes", "copy", "signal", "barrier")
    + tuple(SPMD_ARITY)
)
# The parts a pipeline can run (`part prefetch`): builtin compile-time integers 0, 1, 2.
PIPELINE_PARTS = ("whole", "prefetch", "primed")


class Builtins:
    """Type rules of the builtin functions (everything but copy, signal, barrier)."""

    def __init__(self, checker: Expressions, node: ast.Call, scope: Scope):
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
        names = [k.name for k in node.keywords]
        twice = [k for i, k in enumerate(node.keywords) if k.name in names[:i]]
        if twice:
            self.c.error(twice[0].span, f"{node.func}() is given keyword argument '{twice[0].name}' twice")
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
            x = self.c.f32_value(v, self.node.args[0].span)
            if x is None:
                return POISON
            v = ir.FloatConst(x, v.span)
        t = self.tile(v, self.node.args[0])
        if t is POISON:
            return POISON
        if t.dtype != "f32":
            return self.c.error(self.node.span, f"{self.node.func}() needs an f32 tile, got {t.dtype}{bf16_hint(t.dtype)}")
        return ir.Elementwise(self.node.func, (t,), "f32", t.shape, self.node.span)

    def one_tile(self):
        """The single argument as a tile (a scalar constant becomes one), or POISON."""
        vals = self.args(1)
        return POISON if vals is None else self.tile(vals[0], self.node.args[0])

    def b_abs(self):
        t = self.one_tile()
        if t is POISON:
            return POISON
        if t.dtype not in ("f32", "i32"):
            return self.c.error(self.node.span, f"abs() needs an f32 or i32 tile, got {t.dtype}{bf16_hint(t.dtype)}")
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
        r = self.c.binary("-", a, b, self.node.span, call=self.node.func)
        if r is POISON:
            return POISON
        if isinstance(r, ir.FloatConst):   # (both operands are numbers: f32_value cannot fail)
            x, y = self.c.f32_value(a, a.span), self.c.f32_value(b, b.span)
            return ir.FloatConst(f32_extreme(self.node.func, x, y), self.node.span)
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
            return self.c.error(self.node.span, f"{name}() needs an f32 or i32 tile, got {t.dtype}{bf16_hint(t.dtype)}")
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
        full = broadcast(shape, cond.shape)
        if full is None:
            return self.c.error(
                self.node.span,
                f"shape mismatch: where() condition {describe(cond.shape)} and values {describe(shape)}",
            )
        return ir.Elementwise("where", (cond, a, b), a.dtype, full, self.node.span)

    def convert(self, dtype: str):
        vals = self.args(1)
        if vals is None:
            return POISON
        v = vals[0]
        if isinstance(v, ir.Const):
            if dtype == "i32":
                return ir.Const(v.value, v.span)
            if v.dtype == "bool":
                return self.c.error(self.node.span, f"{dtype}() of a bool: convert it with i32(...) first")
            x = self.c.f32_value(v, self.node.args[0].span)   # i32 -> f32 rounds to nearest even
            if x is None:
                return POISON
            return ir.FloatConst(x, v.span) if dtype == "f32" else ir.Convert(
                ir.Literal(x, "f32", (1, 1), v.span), "bf16", (1, 1), self.node.span)
        if isinstance(v, ir.FloatConst):
            if dtype == "f32":
                return v
            lit = ir.Literal(v.value, "f32", (1, 1), v.span)
            return ir.Convert(lit, dtype, (1, 1), self.node.span)
        s = self.c.scalarish(v)
        if s is not None and dtype == "i32":
            return self.bool_to_int(s) if ir.scalar_dtype(s) == "bool" else s
        t = self.tile(v, self.node.args[0])
        if t is POISON:
            return POISON
        return ir.Convert(t, dtype, t.shape, self.node.span)

    def bool_to_int(self, s):
        """`i32(flag)`: the same 0/1, typed as an integer (no instruction when it can be avoided)."""
        span = self.node.span
        if isinstance(s, ir.Const):
            return ir.Const(s.value, span)
        if isinstance(s, ir.ScalarOp):
            return attrs.evolve(s, dtype="i32", span=span)
        return ir.ScalarOp("!=", (s, ir.Const(0, span)), span, "i32")

    def b_select(self):
        """`select(cond, a, b)`: a when cond holds, else b. A compile-time cond picks one
        of the two expressions (the other is not checked, as with `if`) and they may be
        anything; a runtime cond picks between two scalars of one type."""
        node, c = self.node, self.c
        if node.keywords or len(node.args) != 3:
            for a in node.args:
                c.expr(a, self.scope)
            return c.error(node.span, f"select() takes 3 arguments (select(cond, a, b)), got {len(node.args)}")
        cond = c.as_bool(c.expr(node.args[0], self.scope), node.args[0].span, "the condition of select()")
        if cond is POISON:
            return POISON
        if isinstance(cond, ir.Const):
            return c.expr(node.args[1 if cond.value else 2], self.scope)
        n_errors = len(c.errors)
        v = self.run_time_select(cond)
        if len(c.errors) > n_errors:
            # In an fn checked on its own, a condition read from a scalar parameter is a
            # constant at a call that passes one, where select() picks one expression
            # (anything) and leaves the other unchecked: the fn is checked there.
            c.call_dependent(cond)
        return v

    def run_time_select(self, cond):
        node, c = self.node, self.c
        # Each side is checked with the loop ranges the condition (or its negation) allows,
        # so `select(j < 2, w1[:, j * 128 +: 128], w2[:, (j - 2) * 128 +: 128])` is in range.
        saved = dict(c.ctx.ranges) if c.ctx is not None else None
        a = self.branch(cond, node.args[1])
        b = self.branch(_negated(cond), node.args[2])
        if saved is not None:
            c.ctx.ranges = saved
        if POISON in (a, b):
            return POISON
        sa, sb = c.scalarish(a), c.scalarish(b)
        # Two SMEM elements (`idx[i]`, `idx[j]`) are scalars: pick the value, not a view.
        if isinstance(a, (ir.Ref, ViewChoice)) and isinstance(b, (ir.Ref, ViewChoice)) and (sa is None or sb is None):
            return self.view_choice(cond, a, b)
        if sa is None or sb is None:
            views = (ir.Ref, ViewChoice)
            other = b if isinstance(a, views) or (sa is not None and not isinstance(b, views)) else a
            return c.error(node.span, f"with a run-time condition, select() picks between two scalars or two "
                                      f"views (for a copy), got {c.kind_name(other)} (for tiles use where(mask, a, b))")
        if ir.scalar_dtype(sa) != ir.scalar_dtype(sb):
            return c.error(node.span, "select() needs two values of one type, got a bool and an integer")
        return ir.ScalarOp("select", (cond, self.guarded(sa), self.guarded(sb)), node.span)

    def guarded(self, e):
        """Side `e` of a run-time select with its SMEM reads whose indices were checked at
        compile time (under the side's condition) marked `guarded`: both sides are read
        whichever is picked, so `select(j + 1 < N, m[i, j + 1], 0)` reads m[i, N] at
        j = N - 1 and drops it, which must not fault."""
        if isinstance(e, ir.SmemLoad):
            ref = e.ref
            if all(self.c.interval(x) is not None for x in (ref.slot, *ref.offsets) if x is not None):
                return attrs.evolve(e, guarded=True)
            return e
        if isinstance(e, ir.ScalarOp):
            args = tuple(self.guarded(a) for a in e.args)
            return e if all(a is b for a, b in zip(args, e.args)) else attrs.evolve(e, args=args)
        return e

    def b_bytes(self):
        """`bytes(view)` / `bytes(copy(...))`: the compile-time byte count a DMA of it moves
        (what a semaphore counts), for waits on copies made elsewhere."""
        vals = self.args(1)
        if vals is None:
            return POISON
        v, span = vals[0], self.node.span
        if isinstance(v, DmaHandle):
            v.measured = True
            v = v.dma
        if isinstance(v, (ir.Dma, DmaChoice)):
            return ir.Const(v.size_bytes, span)
        if isinstance(v, ir.Ref) and (v.buffer.slots is None or v.slot is not None):
            if not self.c.mx_view(v, self.node.args[0].span):
                return POISON
            return ir.Const(v.size_bytes, span)
        if isinstance(v, ir.Ref):
            return self.c.error(self.node.args[0].span, f"buffer array '{v.buffer.name}' needs a slot index: "
                                                        f"{v.buffer.name}[slot]")
        return self.c.error(self.node.args[0].span, f"bytes() takes a view or a copy, got {self.c.kind_name(v)}")

    def branch(self, cond, arg):
        c = self.c
        if c.ctx is None or cond is None:
            return c.expr(arg, self.scope)
        saved = dict(c.ctx.ranges)
        c.narrow(cond)
        try:
            return c.expr(arg, self.scope)
        finally:
            c.ctx.ranges = saved

    def view_choice(self, cond, a, b):
        """A run-time pick between two views, for a copy (e.g. a tile from one of two arrays)."""
        c, node = self.c, self.node
        for v, arg in ((a, node.args[1]), (b, node.args[2])):
            if isinstance(v, ir.Ref) and v.buffer.slots is not None and v.slot is None:
                return c.error(arg.span, f"buffer array '{v.buffer.name}' needs a slot index: {v.buffer.name}[slot]")
        if a.dtype != b.dtype or a.shape != b.shape:
            return c.error(node.span, f"select() between views needs one dtype and shape, got "
                                      f"{a.dtype}{describe(a.shape)} and {b.dtype}{describe(b.shape)}")
        spaces = {(v.first if isinstance(v, ViewChoice) else v).buffer.space for v in (a, b)}
        if len(spaces) != 1:
            return c.error(node.span, f"select() between views needs one memory space, got {' and '.join(sorted(spaces))}")
        return ViewChoice(cond, a, b)

    def b_vmem_bytes(self):
        """`vmem_bytes(S)`: the VMEM an instance of struct S takes, laid out as the back end
        lays it out (docs/language.md, "Back end rules"): a compile-time integer, for
        VMEM maps computed in the program (`const RING = BUDGET - vmem_bytes(Bufs);`)."""
        node, c = self.node, self.c
        arg = node.args[0] if len(node.args) == 1 and not node.keywords else None
        if not isinstance(arg, ast.Name):
            return c.error(node.span, "vmem_bytes() takes the name of a struct: vmem_bytes(S)")
        decl = c.struct_named(arg.name)
        if decl is None:
            return c.error(arg.span, f"vmem_bytes(): '{arg.name}' is not a struct")
        # A member sized by vmem_bytes of its own struct (directly or through consts) is a
        # cycle like a self-referential const: tracked on the same chain, or it recurses forever.
        if decl.name in c.evaluating:
            chain = " -> ".join(c.evaluating[c.evaluating.index(decl.name):] + [decl.name])
            return c.error(decl.name_span, f"'{decl.name}' is defined in terms of itself: {chain}")
        c.evaluating.append(decl.name)
        try:
            inst = c.instantiate(decl, lambda m: m, "local", ("hbm", "vmem", "smem", "sem"), node.span, "")
        finally:
            c.evaluating.pop()
        if inst is POISON:
            return POISON
        total = sum(layout.vmem_slot_bytes(b.dtype, b.shape) * (b.slots or 1)
                    for b in inst.members.values() if isinstance(b, ir.Buffer) and b.space == "vmem")
        return ir.Const(total, node.span)

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
        if isinstance(vals[1], ir.Ref) and vals[1].dtype == "mxfp4":
            return self.mx_matmul(*vals)
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
                self.node.span, f"shape mismatch: matmul {describe(a.shape)} x {describe(b.shape)} (inner dimensions differ)"
            )
        return ir.Matmul(a, b, "f32", (a.shape[0], b.shape[1]), self.node.span)

    def mx_matmul(self, x, w: ir.Ref):
        """matmul(x, w) with w a VMEM view of MXFP4 weights: the matrix unit decodes them
        exactly (docs/numerics.md), x is bf16 as for bf16 weights."""
        c, node = self.c, self.node
        span = node.args[1].span
        if w.buffer.space != "vmem":
            return c.error(span, f"matmul reads mxfp4 weights from VMEM: copy the tile of '{w.buffer.name}' into a "
                                 "vmem mxfp4 buffer first")
        if w.buffer.slots is not None and w.slot is None:
            return c.error(span, f"buffer array '{w.buffer.name}' needs a slot index: {w.buffer.name}[slot]")
        if not c.mx_view(w, span):
            return POISON
        a = self.tile(x, node.args[0])
        if a is POISON:
            return POISON
        if a.dtype != "bf16":
            hint = "; round it with bf16(...)" if a.dtype == "f32" else ""
            return c.error(node.span, f"dtype mismatch: matmul with mxfp4 weights takes a bf16 left operand, got "
                                      f"{a.dtype}{hint}")
        b = ir.Load(w, "mxfp4", w.tile_shape, w.span)
        if a.shape[1] != b.shape[0]:
            return c.error(node.span, f"shape mismatch: matmul {describe(a.shape)} x {describe(b.shape)} (inner "
                                      "dimensions differ)")
        return ir.Matmul(a, b, "f32", (a.shape[0], b.shape[1]), node.span)

    def b_transpose(self):
        t = self.one_tile()
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
            return self.c.error(self.node.span, f"scalar() needs an i32 [1, 1] tile (one element), got {tile_desc(t)}")
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
                    if self.c.call_dependent(v):   # (an fn checked on its own: checked at each call)
                        return POISON
                    return self.c.error(a.span, f"the axis of {name}() must be a compile-time integer")
                if v.value not in (0, 1, 2):
                    return self.c.error(a.span, f"mesh axis must be 0, 1 or 2, got {v.value}")
            s = self.c.as_scalar(v, a.span)
            if s is POISON:
                return POISON
            out.append(s)
        return ir.Spmd(name, tuple(out), self.node.span)


NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


def _negated(cond):
    """not cond, for narrowing: a comparison flipped, `!c` as c, `a || b` as `!a && !b`
    (None when there is nothing to narrow by; `!(a && b)` narrows nothing)."""
    if not isinstance(cond, ir.ScalarOp):
        return None
    if cond.op in NEGATED:
        return ir.ScalarOp(NEGATED[cond.op], cond.args, cond.span)
    if cond.op == "!":
        return cond.args[0]
    if cond.op == "||":
        a, b = (_negated(x) for x in cond.args)
        return b if a is None else a if b is None else ir.ScalarOp("&&", (a, b), cond.span)
    return None
