"""fn calls: arguments bound to parameters, and the body inlined at the call.

A scalar argument that is a compile-time constant is a constant inside the body (so
it can size the other parameters); other scalars are evaluated once into a fresh
variable. Buffer and semaphore arguments are checked against the parameter types.
Inlined locals are renamed `fn#N.name`; errors inside name the call site.
"""

from __future__ import annotations

from mkemu.dsl import ast, ir
from mkemu.dsl.pipeline import Pipelines
from mkemu.dsl.values import POISON, Binding, ConstVal, Scope, StructVal, count_of, describe

MAX_INLINE_DEPTH = 64
MAX_INLINED_CALLS = 50_000   # per program: a call tree that doubles at each level grows past any budget


class Calls(Pipelines):
    """fn inlining."""

    def inline(self, decl: ast.FnDecl, call: ast.Call, scope: Scope, out: list) -> None:
        names = [name for name, _ in self.inline_stack]
        if decl.name in names:
            first = names.index(decl.name)
            cycle = names[first:]
            # (Each fn of a cycle is checked on its own too: one report per cycle.) It names
            # the calls the code here is inlined at, as any error does, but where the cycle
            # came back to the very call that entered it (an fn's own check, `f` calling
            # `f`), the calls of the cycle only repeat the place: those are left out.
            entered_here = self.inline_stack[first][1] == call.span
            if frozenset(cycle) not in self.cycles_reported:
                self.cycles_reported.add(frozenset(cycle))
                self.error(call.span, f"recursive fn call: {' -> '.join(cycle + [decl.name])} (fns are inlined)",
                           self.error_context(outer=first if entered_here else None))
            return
        if len(self.inline_stack) >= MAX_INLINE_DEPTH:   # (inlined recursively: Python's stack would overflow)
            self.limit_error("inline depth", call.span,
                             f"fn calls nested more than {MAX_INLINE_DEPTH} deep (fns are inlined): "
                             f"{' -> '.join(names[:3] + ['...'] + [decl.name])}")
            self.skipped()
            return
        if self.inlined_calls >= MAX_INLINED_CALLS:
            self.limit_error("inline count", call.span,
                             f"more than {MAX_INLINED_CALLS:,} fn calls to inline in this program (a fn "
                             "is inlined at every call, so calls nested in calls multiply)",
                             earliest=False)   # (past the budget every call breaches it: keep where it ran out)
            self.skipped()
            return
        self.inlined_calls += 1
        if call.keywords:
            self.error(call.keywords[0].span, f"fn '{decl.name}' takes no keyword arguments")
            return
        if len(call.args) != len(decl.params):
            self.error(call.span, f"fn '{decl.name}' takes {count_of(len(decl.params), 'argument')}, got {len(call.args)}")
            for a in call.args:
                self.expr(a.value if isinstance(a, ast.Remote) else a, scope)
            return
        callee = Scope(self.globals)
        inline_id = next(self.inline_counter)
        ok = True
        pre: list = []
        # Scalars first: a scalar bound to a constant may size the other parameters.
        for p, a in zip(decl.params, call.args):
            if not self.is_scalar_param(p):
                continue
            v = self.expr(a, scope)
            if p.type.name == "bool":
                s = self.as_bool(v, a.span, f"a bool for parameter '{p.name}'")
            else:
                s = self.as_scalar(v, a.span, f"an integer for parameter '{p.name}'")
            if s is POISON:
                ok = False
                callee.names[p.name] = Binding(POISON, p.name_span, "parameter")
            elif isinstance(s, ir.Const):
                callee.names[p.name] = Binding(ConstVal(s.value, s.dtype), p.name_span, "parameter")
            else:
                var = ir.ScalarVar(f"{decl.name}#{inline_id}.{p.name}", "let", p.span, p.type.name)
                self.let_range(var, s)
                pre.append(ir.LetScalar(var, s, call.span))
                callee.names[p.name] = Binding(var, p.name_span, "parameter")
        values = []
        for p, a in zip(decl.params, call.args):
            if self.is_scalar_param(p):
                continue
            if isinstance(a, ast.Remote):
                self.error(a.span, "'@' (a remote location) is only allowed in copy() and signal()")
                ok = False
                continue
            v = self.expr(a, scope)
            if v is POISON:
                ok = False
                continue
            values.append((p, v, a))
        if decl.generics and not self.infer_generics(decl, [(p, v, a.span) for p, v, a in values], callee,
                                                     f"fn '{decl.name}'", complete=ok):
            return
        for p, v, a in values:
            entity = self.bind_param(decl, p, v, a, callee, call.span)
            if entity is None:
                # The parameter's own type is in error at this call: the arguments that size
                # it are (reported once, naming them), and the types after it read the same.
                return
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

    def in_fn_type(self, decl: ast.FnDecl, site, check):
        """check() of a parameter type at a call: its errors, in the fn's text, name the call."""
        self.inline_stack.append((decl.name, site))
        try:
            return check()
        finally:
            self.inline_stack.pop()

    def bind_param(self, decl: ast.FnDecl, p: ast.Param, v, a, callee: Scope, site):
        """The entity `p` stands for at this call: `v`, POISON if the argument does not
        fit the parameter (reported at the argument), None if the parameter's type is in
        error at this call (reported in the fn's text, naming the call)."""
        t = p.type
        if isinstance(t, ast.ScalarType):   # a struct: any instance of it
            if not isinstance(v, StructVal) or v.decl.name != t.name:
                return self.error(a.span, f"parameter '{p.name}' of fn '{decl.name}' is an instance of struct "
                                          f"'{t.name}', got {self.kind_name(v)}")
            return v
        if isinstance(t, ast.SemType):
            if not isinstance(v, ir.SemRef):
                return self.error(a.span, f"parameter '{p.name}' of fn '{decl.name}' is a semaphore, got {self.kind_name(v)}")
            whole_array = v.sem.count is not None and v.index is None
            got = f"the array '{v.sem.name}' of {v.sem.count}" if whole_array else "one semaphore"
            if t.count is None:
                if whole_array:
                    return self.error(a.span, f"parameter '{p.name}' of fn '{decl.name}' takes one semaphore, "
                                              f"got {got}: index the array")
                return v
            count = self.in_fn_type(decl, site, lambda: self.slot_count(t.count, callee, t.span, "a semaphore array"))
            if count is None:
                return None
            if not whole_array or v.sem.count != count:
                return self.error(a.span, f"parameter '{p.name}' of fn '{decl.name}' takes an array of {count} "
                                          f"semaphores, got {got}")
            return v
        # memory parameter
        if not isinstance(v, ir.Ref):
            return self.error(a.span, f"parameter '{p.name}' of fn '{decl.name}' is a {t.space} buffer, got {self.kind_name(v)}")
        buf = v.buffer
        space_ok = buf.space == t.space or (t.space == "vmem" and buf.space == "var")
        if not space_ok:
            return self.error(a.span, f"parameter '{p.name}' of fn '{decl.name}' is in {t.space}, got a {buf.space} buffer '{buf.name}'")
        want = self.in_fn_type(decl, site, lambda: self.mem_type(t, callee, p.name, "param"))
        if want is None:
            return None
        if buf.dtype != want.dtype:
            return self.error(a.span, f"dtype mismatch: parameter '{p.name}' of fn '{decl.name}' is {want.dtype}, got {buf.dtype}")
        whole = buf.slots is not None and v.slot is None
        if want.slots is not None:
            if not whole or buf.slots != want.slots or v.shape != want.shape:
                return self.error(
                    a.span, f"parameter '{p.name}' of fn '{decl.name}' is an array of {want.slots} buffers {describe(want.shape)}"
                )
            return v
        if whole:
            return self.error(a.span, f"buffer array '{buf.name}' needs a slot index: {buf.name}[slot]")
        if v.shape != want.shape:
            return self.error(
                a.span,
                f"shape mismatch: parameter '{p.name}' of fn '{decl.name}' is {describe(want.shape)}, got {describe(v.shape)}",
            )
        return v
