"""Generic fns and kernels: names in `<...>` inferred from the arguments.

`fn cp<T, R, C>(src: hbm T[R, C], dst: vmem T[R, C], s: sem)` says that R, C and T
are whatever the arguments make them: at each call a generic written as a whole
dimension (`[R, C]`), slot count (`[S][..]`), semaphore count (`sem[S]`) or dtype
(`T[...]`) of a parameter takes the argument's value there, in parameter order; every
other use must then agree (checked as for any fn). Inside the body a generic is a
compile-time integer (or a dtype, for local buffers). A kernel is instantiated once
per distinct set of values its launches infer, named `kernel<v1,v2,...>`.
"""

from __future__ import annotations

from mkemu.dsl import ast, ir
from mkemu.dsl.structs import Structs
from mkemu.dsl.values import ConstVal, DtypeVal, Scope


class Generics(Structs):
    """Inference of generic names from arguments."""

    def fixable_generics(self, decl) -> set[str]:
        """The generics of `decl` that some parameter type can fix: written as a whole
        dimension, slot count, semaphore count or dtype."""
        return {name for p in decl.params for name in self.param_generics(decl, p)}

    @staticmethod
    def param_generics(decl, p: ast.Param) -> set[str]:
        """The generics of `decl` that parameter `p`'s type can fix."""
        names = {g.name for g in decl.generics}
        t = p.type
        exprs = []
        if isinstance(t, ast.SemType):
            exprs = list(t.count or ())[:1]
        elif isinstance(t, ast.MemType):
            exprs = [ast.Name(t.dtype, t.span), *t.dims, *(t.slots or ())[:1]]
        return {e.name for e in exprs if isinstance(e, ast.Name) and e.name in names}

    def check_generics_decl(self, decl, what: str) -> None:
        """A generic fn's or kernel's generics, checked at the declaration (called or not):
        each name once, not a global's, fixed by some parameter type."""
        scope = Scope(self.globals)
        for g in decl.generics:
            self.define(scope, g.name, None, g.span, "generic")
        fixable = self.fixable_generics(decl)
        for g in decl.generics:
            if g.name not in fixable:
                self.error(g.span, self.unfixed_message(g.name, what))

    @staticmethod
    def unfixed_message(name: str, what: str) -> str:
        return (f"generic '{name}' of {what} cannot be inferred from the arguments (use it as a whole "
                "dimension, count or dtype of a buffer or semaphore parameter)")

    def infer_generics(self, decl, pairs, scope: Scope, what: str, complete: bool = True) -> bool:
        """Bind `decl`'s generics in `scope` from (param, value, argument span) triples;
        False on error (a conflict is reported at the argument). `complete` is False when
        some argument was in error (already reported): a generic it would have fixed is
        then not reported again."""
        names = {g.name: g for g in decl.generics}
        found: dict[str, tuple[object, str]] = {}   # name -> (value, the parameter it came from)
        ok = True

        def bind(expr, value, p: ast.Param, site) -> None:
            nonlocal ok
            if not (isinstance(expr, ast.Name) and expr.name in names):
                return
            prev = found.get(expr.name)
            if prev is None:
                found[expr.name] = (value, p.name)
            elif prev[0] != value:
                self.error(site, f"generic '{expr.name}' of {what} is {prev[0]} from parameter '{prev[1]}' "
                                 f"but {value} here (parameter '{p.name}')")
                ok = False

        for p, v, site in pairs:
            t = p.type
            if isinstance(t, ast.SemType) and isinstance(v, ir.SemRef) and t.count:
                if v.sem.count is not None and v.index is None:
                    bind(t.count[0], v.sem.count, p, site)
            elif isinstance(t, ast.MemType) and isinstance(v, ir.Ref):
                bind(ast.Name(t.dtype, t.span), v.dtype, p, site)
                whole = v.buffer.slots is not None and v.slot is None
                if t.slots and whole:
                    bind(t.slots[0], v.buffer.slots, p, site)
                if len(t.dims) == len(v.shape):
                    for expr, size in zip(t.dims, v.shape):
                        bind(expr, size, p, site)
        for g in decl.generics:
            if g.name not in found:
                # A generic no parameter type fixes is reported at the declaration; one whose
                # parameters got arguments of another form, at the first of those.
                site = next(((p, v, site) for p, v, site in pairs if g.name in self.param_generics(decl, p)), None)
                if ok and complete and site is not None:
                    p, v, site = site
                    self.error(site, f"generic '{g.name}' of {what} cannot be inferred from argument '{p.name}': "
                                     f"{self.kind_name(v)} does not have the form of the parameter's type")
                ok = False
                continue
            value = found[g.name][0]
            entity = DtypeVal(value) if isinstance(value, str) else ConstVal(value)
            self.define(scope, g.name, entity, g.span, "generic")
            if scope.local(g.name) is None:   # it shadows a global (reported at the declaration)
                ok = False
        return ok

    def generic_key(self, decl, scope: Scope) -> str:
        """The instance name of a generic kernel: `name<v1,v2,...>`."""
        values = []
        for g in decl.generics:
            e = scope.local(g.name).entity
            values.append(e.dtype if isinstance(e, DtypeVal) else str(e.value))
        return f"{decl.name}<{','.join(values)}>"
