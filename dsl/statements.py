"""Statements of kernel and fn bodies: declarations, assignment, DMAs, control flow.

`Statements` elaborates a block statement by statement into `ir` statements, within
the current kernel's `KernelCtx` (its buffers and semaphores, the ranges of loop
variables, and the bookkeeping behind the semaphore checks: which semaphores are
posted and waited, which described DMAs are used). Host-only statements are in
`mkemu.dsl.elaborate`, fn calls in `mkemu.dsl.calls`.
"""

from __future__ import annotations

import attrs

from mkemu.dsl import ast, ir
from mkemu.dsl.builtins import _negated
from mkemu.dsl.expressions import Expressions
from mkemu.dsl.folding import broadcast, linear
from mkemu.dsl.values import POISON, ConstVal, DmaChoice, DmaCount, DmaHandle, FloatVal, Poison, Scope, describe, tile_desc

MAX_HOST_TRIPS = 1_000_000
MAX_HOST_LAUNCHES = 1_000_000   # in all, loops one after another included (about 20 s of unrolling)
MAX_STMT_DEPTH = 100
MAX_COPIED_STMTS = 100_000   # per program: 15 s of compiling at most (the shipped ones copy 2,000)


def _mutable(e) -> bool:
    """Whether a scalar expression reads state that can change: a `var`, SMEM, a tile."""
    if isinstance(e, ir.ScalarRead):
        return e.var.kind == "var"
    if isinstance(e, (ir.SmemLoad, ir.TileToScalar)):
        return True
    if isinstance(e, (ir.ScalarOp, ir.Spmd)):
        return any(_mutable(a) for a in e.args)
    return False


class Statements(Expressions):
    """Statement-level elaboration of kernel and fn bodies."""

    # ---------------------------------------------------------------- blocks
    def block(self, block: ast.Block, parent: Scope) -> list:
        scope = Scope(parent)
        out: list = []
        self.stmts(block.stmts, scope, out)
        return out

    def stmts(self, stmts, scope: Scope, out: list) -> None:
        """A body's statements in order. An assert states what the statements after it
        rely on: past a failed one they would only add errors its message explains."""
        for s in stmts:
            if isinstance(s, ast.Assert):
                if not self.assertion(s, scope):
                    return
                continue
            self.stmt(s, scope, out)

    def stmt(self, s, scope: Scope, out: list) -> None:
        # The checker and the back end recurse on nested statements (about 5 Python frames
        # a level), through inlined fns too: past this depth Python's stack would overflow.
        if self.stmt_depth >= MAX_STMT_DEPTH:
            self.limit_error("statement depth", s.span,
                             f"statements nested more than {MAX_STMT_DEPTH} deep (blocks of loops, ifs, "
                             f"pipelines and regions, and fn calls, which inline their bodies there)")
            self.skipped()
            return
        if self.inline_stack or self.instance_site is not None:
            # The count of calls alone does not bound the work: a few thousand calls of an fn
            # of a few hundred statements took minutes and gigabytes (and made a kernel of
            # millions of instructions).
            if self.copied_stmts >= MAX_COPIED_STMTS:
                self.limit_error("copied statements", s.span,
                                 f"more than {MAX_COPIED_STMTS:,} statements to copy in this program (every fn call "
                                 f"copies the fn's body, every generic kernel instance the kernel's)", earliest=False)
                self.skipped()
                return
            self.copied_stmts += 1
        made = len(out)
        self.stmt_depth += 1
        try:
            self.stmt_at_depth(s, scope, out)
        finally:
            self.stmt_depth -= 1
        self.mark_context(out, made)

    def mark_context(self, out: list, made: int) -> None:
        """Give the statements from out[made] on (what one statement made) the context of
        the fn call or generic instance they come from, for the back end's errors in them;
        those of an fn called here already carry their own call's."""
        context = self.error_context()
        if context:
            calls = self.call_chain()
            out[made:] = [st if st.context else attrs.evolve(st, context=context, calls=calls)
                          for st in out[made:]]

    def skipped(self) -> None:
        """Statements past a limit are left out: a DMA started (or waited) in them may be the
        one a wait (start) outside them pairs with, so the checks after the body do not
        report unpaired ones."""
        if self.ctx is not None:
            self.ctx.unknown_post = self.ctx.unknown_wait = True

    def stmt_at_depth(self, s, scope: Scope, out: list) -> None:
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
        buf = self.mem_type(t, scope, self.unique(s.name), "scratch" if host else "local",
                            "" if host else self.error_context())
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
        sem = ir.Semaphore(self.unique(s.name), count, s.span, self.error_context())
        self.ctx.sems.append(sem)
        self.define(scope, s.name, sem, s.name_span, "semaphore")

    def s_VarDecl(self, s: ast.VarDecl, scope, out) -> None:
        if s.dims is None:
            if not self.dtype(s.dtype, s.span, ("i32", "bool")):
                self.define(scope, s.name, POISON, s.name_span, "variable")
                return
            var = ir.ScalarVar(self.unique(s.name), "var", s.span, s.dtype)
            init = ir.Const(0, s.span, s.dtype)
            if s.init is not None:
                value = self.expr(s.init, scope)
                init = (self.as_bool(value, s.init.span, "a bool initial value") if s.dtype == "bool"
                        else self.as_scalar(value, s.init.span, "an integer initial value"))
            self.define(scope, s.name, var, s.name_span, "variable")
            if init is not POISON:
                out.append(ir.SetScalar(var, init, s.span))
            return
        dtype = self.resolve_dtype(s.dtype, scope)
        t = ast.MemType("var", dtype, s.dims, None, s.span)
        if dtype == "mxfp4":
            self.error(s.span, "mxfp4 holds matrix-unit weights in hbm arrays and vmem buffers, not in a var")
            self.define(scope, s.name, POISON, s.name_span, "variable")
            return
        if dtype is None or not self.dtype(dtype, s.span):   # (None: a dtype name in error, already reported)
            self.define(scope, s.name, POISON, s.name_span, "variable")
            return
        shape = self.dims(s.dims, scope, "a tile var", 2, s.span)
        if shape is None:
            self.define(scope, s.name, POISON, s.name_span, "variable")
            return
        buf = ir.Buffer(self.unique(s.name), "var", dtype, shape, None, t.span, "local", self.error_context())
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
            case Poison():
                return POISON
            case ir.Const():
                return ConstVal(v.value, v.dtype)
            case ir.FloatConst():
                return FloatVal(v.value)
            case ir.SemRef():
                return self.frozen(v, name, out)
            case ir.Dma() | DmaChoice():
                h = DmaHandle(name, self.frozen(v, name, out), span)
                self.ctx.handles.append((h, self.error_context()))
                return h
            case DmaHandle():
                return v
        s = self.scalarish(v)
        if s is not None:
            if self.ctx.mode == "host":
                return self.error(value_span, "host lets must be compile-time integers")
            return self.let_scalar(name, s, span, out)
        if isinstance(v, ir.Ref):
            return self.frozen(v, name, out)
        if isinstance(v, ir.TILE_NODES):
            if self.ctx.mode == "host":
                return self.error(value_span, "host lets must be compile-time integers")
            tv = ir.TileValue(self.unique(name), v.dtype, v.shape, span)
            out.append(ir.LetTile(tv, v, span))
            return tv
        return self.error(value_span, f"cannot bind {self.kind_name(v)} with let")

    def let_scalar(self, name: str, value, span, out) -> ir.ScalarVar:
        """A let scalar `name` holding `value`, computed here (its range recorded)."""
        var = ir.ScalarVar(self.unique(name), "let", span, ir.scalar_dtype(value))
        self.let_range(var, value)
        out.append(ir.LetScalar(var, value, span))
        return var

    def frozen(self, v, name: str, out):
        """A view, semaphore or copy bound by `let` with every index that reads mutable
        state (a `var`, SMEM, a tile) read once, at the `let`, as a let scalar is: a later
        assignment does not move the binding (`let h = copy(x[i], v, s); i = 1; start h;`
        copies x[i] as i was)."""
        def scalar(e):
            if e is None or not _mutable(e):
                return e
            if isinstance(e, (ir.ScalarOp, ir.Spmd)):   # keep the form (`32 * i` stays a multiple of 32)
                return attrs.evolve(e, args=tuple(scalar(a) for a in e.args))
            return ir.ScalarRead(self.let_scalar(f"{name}.index", e, e.span, out), e.span)
        match v:
            case ir.Ref():
                return attrs.evolve(v, slot=scalar(v.slot), offsets=tuple(scalar(o) for o in v.offsets))
            case ir.SemRef():
                return attrs.evolve(v, index=scalar(v.index))
            case ir.Dma():
                return attrs.evolve(v, src=self.frozen(v.src, name, out), dst=self.frozen(v.dst, name, out),
                                    sem=self.frozen(v.sem, name, out), target=scalar(v.target),
                                    recv_sem=None if v.recv_sem is None else self.frozen(v.recv_sem, name, out))
            case DmaChoice():
                return attrs.evolve(v, cond=scalar(v.cond), a=self.frozen(v.a, name, out),
                                    b=self.frozen(v.b, name, out))
        return v

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
                kinds = {"param": "parameter", "let": "let binding", "loop": "loop variable"}
                name, what = var.name, kinds[var.kind]
                bound = scope.lookup(s.target.name) if isinstance(s.target, ast.Name) else None
                if bound is not None:   # as the program names it (not an inlined or generated name)
                    name, what = s.target.name, bound.what
                self.error(s.target.span, f"cannot assign to '{name}': it is a {what} (declare it with var)")
                return
            if value is POISON:
                return
            if var.dtype == "bool":
                if op is not None:
                    self.error(s.span, f"'{s.op}' is not defined on bool variables; assign a bool with '='")
                    return
                v = self.as_bool(value, s.value.span, "a bool value")
            else:
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
            bound = scope.lookup(s.target.name) if isinstance(s.target, ast.Name) else None
            what = (f"'{s.target.name}': it is a compile-time constant ({bound.what}); declare a var to update it"
                    if bound is not None else "a constant")
            if self.inline_stack and self.assignment_reported(s.target.span):
                # Constant only through this call's arguments: the fn's own check already
                # reported this assignment (in other words), once, at the fn.
                return
        elif isinstance(target, ir.ValueRead):
            what = f"the let-bound tile '{target.value.name}' (declare it with var to update it)"
        self.error(s.target.span, f"cannot assign to {what}")

    def assignment_reported(self, span) -> bool:
        """Whether an assignment to the name at `span` is already an error (an fn's own check)."""
        return any(key[:5] == (span.file, span.line, span.column, span.end_line, span.end_column)
                   and key[5].startswith("cannot assign to") for key in self.errors)

    def store(self, ref: ir.Ref, op_text: str, value, value_span, span, out, target_span=None) -> None:
        target_span = target_span or ref.span
        buf = ref.buffer
        if buf.slots is not None and ref.slot is None:
            self.error(target_span, f"buffer array '{buf.name}' needs a slot index: {buf.name}[slot]")
            return
        if buf.space == "hbm":
            self.error(target_span, f"HBM array '{buf.name}' can only be written by a DMA (copy)")
            return
        if buf.dtype == "mxfp4":
            self.error(target_span, f"'{buf.name}' is mxfp4 (matrix-unit weights): only a DMA (copy) writes it")
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
        full = broadcast(ref.tile_shape, t.shape)
        if full != ref.tile_shape:
            self.error(span, f"shape mismatch: storing {tile_desc(t)} into {describe(ref.tile_shape)} view of '{buf.name}'")
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
        if POISON in (sem, amount, target) or not self.non_negative(amount, e.args[1].span, "signal"):
            self.failed_sem_statement(sem, "post")
            return
        self.post(sem.sem, e.span, "signal")
        out.append(ir.Signal(sem, amount, target, e.span))

    def non_negative(self, amount, span, what: str) -> bool:
        """A compile-time amount of a signal or semaphore wait is not negative (semaphores
        count up: a signal adds, a wait takes away)."""
        if isinstance(amount, ir.Const) and amount.value < 0:
            self.error(span, f"the amount of a {what} must not be negative, got {amount.value}")
            return False
        return True

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
        self.ctx.posts.append((sem, span, what, self.error_context()))

    # -- DMA
    def dma_of(self, node, scope):
        v = self.expr(node, scope)
        if v is POISON:
            return None, None
        if isinstance(v, DmaCount):
            self.error(node.span, "start issues one copy; a count of copies (n * copy(...)) is for wait")
            return None, None
        if isinstance(v, DmaHandle):
            return v.dma, v
        if isinstance(v, (ir.Dma, DmaChoice)):
            return v, None
        self.error(node.span, f"expected a DMA (a copy(...) or a name bound to one), got {self.kind_name(v)}")
        return None, None

    def failed_sem_statement(self, sem, side: str) -> None:
        """A signal, start or wait that failed to check (its error is reported) still
        raises (`side` "post") or waits ("wait") its semaphore for the checks after the
        body, so that they do not also report its correct partner statement (a wait that
        'no started DMA or signal targets', a start 'never waited'). `sem` is its SemRef,
        or None/POISON when it is unknown: then those checks are skipped for the kernel."""
        if isinstance(sem, ir.SemRef):
            (self.ctx.signalled if side == "post" else self.ctx.waited).add(sem.sem)
        elif side == "post":
            self.ctx.unknown_post = True
        else:
            self.ctx.unknown_wait = True

    def failed_dma_sems(self, node, scope, side: str, recv: bool = False) -> None:
        """`failed_sem_statement` for a start or wait of `node` (a copy(...), n * copy(...)
        or a name): its semaphore arguments evaluated quietly (their errors, if any, were
        reported by the statement)."""
        while isinstance(node, ast.Binary) and node.op == "*":
            node = node.right if isinstance(node.right, ast.Call) else node.left
        if not (isinstance(node, ast.Call) and node.func == "copy" and len(node.args) in (3, 4)):
            self.failed_sem_statement(None, side)
            return
        positions = (2, 3) if side == "post" and len(node.args) == 4 else ((3,) if recv else (2,))
        for i in positions:
            if i >= len(node.args) or isinstance(node.args[i], ast.Remote):
                self.failed_sem_statement(None, side)
                continue
            saved = dict(self.errors)
            try:
                sem = self.sem_arg(node.args[i], scope)
            finally:
                self.errors = saved
            self.failed_sem_statement(sem, side)

    def s_Start(self, s: ast.Start, scope, out) -> None:
        dma, handle = self.dma_of(s.dma, scope)
        if dma is None:
            self.failed_dma_sems(s.dma, scope, "post")
            return
        if handle is not None:
            handle.started = True
        self.post(dma.sem.sem, s.span, "DMA started")
        if dma.recv_sem is not None:
            self.post(dma.recv_sem.sem, s.span, "remote DMA started (receive side)")
        out.append(self.start_of(dma, s.span))

    def start_of(self, dma, span):
        """The statement that starts a copy: a branch for a choice of copies."""
        if isinstance(dma, DmaChoice):
            return ir.If(dma.cond, (self.start_of(dma.a, span),), (self.start_of(dma.b, span),), span)
        return ir.DmaStart(dma, span)

    def s_Wait(self, s: ast.Wait, scope, out) -> None:
        v = self.expr(s.dma, scope)
        count = None
        if isinstance(v, DmaCount):
            count, dma, handle = v.count, v.dma, v.handle
        elif isinstance(v, DmaHandle):
            dma, handle = v.dma, v
        elif isinstance(v, (ir.Dma, DmaChoice)):
            dma, handle = v, None
        else:
            if v is not POISON:
                self.error(s.dma.span, f"expected a DMA (a copy(...), a name bound to one, or n * copy(...)), "
                                       f"got {self.kind_name(v)}")
            self.failed_dma_sems(s.dma, scope, "wait", s.recv)
            return
        if s.recv and dma.target is None:
            self.error(s.span, "'wait recv' is for remote copies (copy(src, dst @ core, send, recv))")
            self.failed_sem_statement(dma.sem, "wait")
            return
        if handle is not None:
            handle.waited = True
        side = "recv" if s.recv else ("send" if dma.target is not None else "local")
        sem = dma.recv_sem if s.recv else dma.sem
        self.ctx.waited.add(sem.sem)
        self.ctx.waits.append((sem.sem, s.span, self.error_context()))
        if count is None:
            out.append(ir.DmaWait(dma.first if isinstance(dma, DmaChoice) else dma, side, s.span))
        else:
            amount = self.scalar_binary("*", count, ir.Const(dma.size_bytes, s.span), s.span)
            out.append(ir.SemWait(sem, amount, s.span))

    def s_WaitSem(self, s: ast.WaitSem, scope, out) -> None:
        sem = self.sem_arg(s.sem, scope)
        amount = self.as_scalar(self.expr(s.amount, scope), s.amount.span, "an integer amount")
        if sem is POISON or amount is POISON or not self.non_negative(amount, s.amount.span, "wait"):
            self.failed_sem_statement(sem, "wait")
            return
        self.ctx.waited.add(sem.sem)
        self.ctx.waits.append((sem.sem, s.span, self.error_context()))
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
            trips = max(0, -(-(stop.value - start.value) // step))
            total = trips * self.host_trips   # (nested loops multiply)
            if total > MAX_HOST_TRIPS:   # (unrolled here: a loop of 10**30 launches would never end)
                around = f", {total:,} with the loops around it" if total != trips else ""
                self.error(s.span, f"a host loop is unrolled at compile time; this one runs {trips:,} times{around} "
                                   f"(at most {MAX_HOST_TRIPS:,})")
                self.host_overflow = self.host_trips > 1   # (the loops around it stop too)
                return
            saved, self.host_trips = self.host_trips, total
            try:
                for i in range(start.value, stop.value, step):
                    inner = Scope(scope)
                    self.define(inner, s.var, ConstVal(i), s.var_span, "loop variable")
                    self.stmts(s.body.stmts, inner, out)
                    if self.host_overflow or self.host_launches > MAX_HOST_LAUNCHES:
                        break
            finally:
                self.host_trips = saved
                self.host_overflow = self.host_overflow and saved > 1
            return
        var = ir.ScalarVar(self.unique(s.var), "loop", s.var_span)
        inner = Scope(scope)
        self.define(inner, s.var, var, s.var_span, "loop variable")
        if isinstance(start, ir.Const) and isinstance(stop, ir.Const) and step:
            if stop.value > start.value:
                last = start.value + (stop.value - 1 - start.value) // step * step
                self.ctx.ranges[var] = (start.value, last, frozenset([var]))
        body = []
        self.stmts(s.body.stmts, inner, body)
        if POISON not in (start, stop) and step is not None:
            out.append(ir.For(var, start, stop, step, tuple(body), s.span))

    def s_If(self, s: ast.If, scope, out) -> None:
        cond = self.as_bool(self.expr(s.cond, scope), s.cond.span, "a scalar condition")
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
        n_errors = len(self.errors)
        if cond is not POISON:
            self.narrow(cond)
        then = self._branch(run, branches[0], cond is not POISON and provably(cond, False))
        self.ctx.ranges = dict(saved)
        if cond is not POISON and branches[1] is not None:
            self.narrow(_negated(cond))
        orelse = self._branch(run, branches[1], cond is not POISON and provably(cond, True))
        self.ctx.ranges = saved
        if cond is not POISON and len(self.errors) > n_errors:
            # In an fn checked on its own, a condition read from a scalar parameter is a
            # constant at a call that passes one, where only the taken branch is checked
            # (and a loop variable compared with it is narrowed): the fn is checked there.
            self.call_dependent(cond)
        if cond is not POISON:
            out.append(ir.If(cond, tuple(then), tuple(orelse), s.span))

    def _branch(self, run, branch, dead: bool) -> list:
        """`run(branch)`; a branch that never runs (its condition is false whatever the
        run-time operands, `V == 1 && core_id() == 0` with the param V = 0: both sides
        are evaluated, so it is no constant) is checked and compiled as any other, but its
        starts, signals and waits count for nothing in the semaphore checks after the
        body (`semaphore_checks`)."""
        if not dead:
            return run(branch)
        ctx = self.ctx
        kept = (len(ctx.posts), len(ctx.waits), len(ctx.handles), set(ctx.signalled), set(ctx.waited),
                ctx.unknown_post, ctx.unknown_wait, [(h, h.started, h.waited, h.measured) for h, _ in ctx.handles])
        try:
            return run(branch)
        finally:
            posts, waits, handles, ctx.signalled, ctx.waited, ctx.unknown_post, ctx.unknown_wait, flags = kept
            del ctx.posts[posts:], ctx.waits[waits:], ctx.handles[handles:]
            for h, started, waited, measured in flags:
                h.started, h.waited, h.measured = started, waited, measured

    def let_range(self, var: ir.ScalarVar, value) -> None:
        """Record a let-bound scalar's value (`expand_lets`: so that an `if` narrowing the
        loop variables it depends on narrows it too, and for the form of an offset) and
        its range, if known."""
        self.ctx.let_defs[var] = value
        r = self._interval(value)
        if r is not None:
            self.ctx.ranges[var] = r

    def narrow(self, cond) -> None:
        """Narrow loop-variable ranges inside `if` by `v + c < N`-style conditions (and
        the ranges of the lets computed from them)."""
        if cond is None:
            return
        if isinstance(cond, ir.ScalarOp) and cond.op == "&&":
            self.narrow(cond.args[0])
            self.narrow(cond.args[1])
            return
        if isinstance(cond, ir.ScalarOp) and cond.op == "!":
            self.narrow(_negated(cond.args[0]))
            return
        if not (isinstance(cond, ir.ScalarOp) and cond.op in ("<", "<=", ">", ">=", "!=", "==")):
            return
        self._narrow_compare(cond)
        # A let read in the condition (`let k = 2 * t + 1;` ... `if k < N`) also narrows
        # the loop variable it is computed from: the condition with the lets' values in.
        expanded = self.expand_lets(cond, bounded=True)
        if expanded is not cond:
            self._narrow_compare(expanded)

    def _narrow_compare(self, cond) -> None:
        """Narrow by one comparison in which one loop variable or let appears."""
        diff = linear(ir.ScalarOp("-", cond.args, cond.span))  # lhs - rhs
        terms = {k: v for k, v in diff.items() if k != 1}
        if len(terms) != 1:
            return
        (key, coef), = terms.items()
        var = next((v for v in self.ctx.ranges if key == ("v", id(v))), None)
        if var is None or not isinstance(coef, int) or coef == 0:
            return
        lo, hi, deps = self.ctx.ranges[var]
        c = diff.get(1, 0)
        if not isinstance(c, int):
            return
        # Each side must stay in int32 over v's range, or the run-time comparison (which
        # wraps) could hold where the mathematical one does not.
        for side in cond.args:
            form = linear(side)
            if set(form) - {1, key}:
                return
            ends = (form.get(key, 0) * x + form.get(1, 0) for x in (lo, hi))
            if any(not -(1 << 31) <= e < (1 << 31) for e in ends):
                return
        op = cond.op
        if coef < 0:  # -a*v + c op 0  <=>  a*v - c flipped-op 0
            op = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "!=": "!=", "==": "=="}[op]
            coef, c = -coef, -c
        # coef * v op -c, coef > 0: v's integer bounds (`2 * t < 6` is t <= 2)
        if op == "<":
            hi = min(hi, (-c - 1) // coef)
        elif op == "<=":
            hi = min(hi, -c // coef)
        elif op == ">":
            lo = max(lo, -((c - 1) // coef))
        elif op == ">=":
            lo = max(lo, -(c // coef))
        elif op == "==":
            if -c % coef:
                lo, hi = 1, 0  # never holds
            else:
                lo, hi = max(lo, -c // coef), min(hi, -c // coef)
        elif -c % coef == 0 and -c // coef == hi:
            hi -= 1
        elif -c % coef == 0 and -c // coef == lo:
            lo += 1
        if lo <= hi:
            self.ctx.ranges[var] = (lo, hi, deps)
        else:  # the branch never runs: nothing to check against
            self.ctx.ranges.pop(var)
        # Lets computed from var (`let nt = t + 1;` before `if t + 1 < T`) take the narrower range.
        for let, value in self.ctx.let_defs.items():
            old = self.ctx.ranges.get(let)
            if let is var or old is None or not (old[2] & (deps | {var})):
                continue
            new = self._interval(value)
            if new is None:
                self.ctx.ranges.pop(let)
                continue
            lo2, hi2 = max(old[0], new[0]), min(old[1], new[1])
            if lo2 <= hi2:
                self.ctx.ranges[let] = (lo2, hi2, old[2])
            else:
                self.ctx.ranges.pop(let)

    def s_Region(self, s: ast.Region, scope, out) -> None:
        index = None
        if s.index is not None:
            index = self.as_scalar(self.expr(s.index, scope), s.index.span, "an integer region index")
        body = self.block(s.body, scope)
        if index is not POISON:
            out.append(ir.Region(s.name, index, tuple(body), s.span))


def provably(cond, truth: bool) -> bool:
    """Whether scalar condition `cond` is `truth` whatever its run-time operands: a
    constant, or `!`, `&&`, `||` of such (`false && x` is false though x is evaluated)."""
    if isinstance(cond, ir.Const):
        return bool(cond.value) == truth
    if isinstance(cond, ir.ScalarOp):
        if cond.op == "!":
            return provably(cond.args[0], not truth)
        if cond.op in ("&&", "||"):
            decides = cond.op == "||"     # the value one operand alone decides
            if truth == decides:
                return any(provably(a, truth) for a in cond.args)
            return all(provably(a, truth) for a in cond.args)
    return False
