"""Semantic checking and elaboration of a whole program: `ast` in, `ir` out.

One walk over each kernel does everything: resolves names, folds compile-time
expressions, inlines fn calls, types tile expressions, checks static bounds, and
emits the `ir` statements. Every fn is also checked once on its own with its
declared parameter types, so an fn that is never called is still checked. Errors
are collected, never raised one by one (see `mkemu.dsl.values.POISON`).

The checker is one class built up module by module: `declarations` (globals, params,
types) <- `expressions` (with `builtins`) <- `statements` <- `calls` (fn inlining)
<- `Elaborator` here (the program, kernels, stand-alone fn checks, the host block).
"""

from __future__ import annotations

from pathlib import Path

from mkemu.dsl import ast, ir
from mkemu.dsl.calls import Calls
from mkemu.dsl.imports import unusable_file_name
from mkemu.dsl.statements import MAX_HOST_LAUNCHES
from mkemu.dsl.structs import ANY_SPACE, HBM_ONLY
from mkemu.dsl.values import POISON, KernelCtx, Scope, StructVal, count_of, describe
from mkemu.isa.program import ParamInfo


class Elaborator(Calls):
    """The program level: kernels, stand-alone fn checks, the host block."""

    # -------------------------------------------------------------- program
    def values(self) -> tuple[dict[str, int], dict[str, int]]:
        """The globals collected; the params' and the consts' values (those that have one)."""
        self.collect_globals()
        params, consts = {}, {}
        for name, decl in self.global_decls.items():
            if isinstance(decl, (ast.ParamDecl, ast.ConstDecl)):
                v = self.const_value(name, decl)
                if v is not None:
                    (params if isinstance(decl, ast.ParamDecl) else consts)[name] = v
        return params, consts

    def program(self, main_file: str, main_dir: Path) -> ir.Program | None:
        params, consts = self.values()
        held = True
        for module in self.modules:
            for item in module.items:
                if isinstance(item, ast.Assert):
                    held = self.assertion(item, self.globals) and held
        if not held:
            # A failed top-level assert is a program's precondition (a config it does not
            # support): what checking the rest would report is only its consequences.
            return None
        for decl in self.global_decls.values():
            if isinstance(decl, ast.StructDecl):
                self.check_struct_alone(decl)
        for decl in self.global_decls.values():
            if isinstance(decl, (ast.FnDecl, ast.KernelDecl)):
                self.check_param_names(decl)
            if isinstance(decl, ast.FnDecl) and not decl.generics:   # generic fns: at each call
                self.check_fn_alone(decl)
            if isinstance(decl, (ast.FnDecl, ast.KernelDecl)) and decl.generics:
                kind = "fn" if isinstance(decl, ast.FnDecl) else "kernel"
                self.check_generics_decl(decl, f"{kind} '{decl.name}'")
        kernels = {}
        for name, decl in self.global_decls.items():
            if isinstance(decl, ast.KernelDecl) and not decl.generics:   # generic kernels: at each launch
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
        generic_kernels = {name: decl.span for name, decl in self.global_decls.items()
                           if isinstance(decl, ast.KernelDecl) and decl.generics}
        return ir.Program(main_file, params, consts, kernels, host, reference, self.sources,
                          self.param_info(params), generic_kernels)

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
        bad = unusable_file_name(path)
        if bad:
            self.error(item.span, f"reference file name {bad}")
            return None
        try:
            full = (main_dir / path).resolve()
            found = full.is_file()
        except (OSError, RuntimeError) as exc:   # (a symlink loop, a name too long for the file system)
            self.error(item.span, f"cannot read reference file '{path}': {getattr(exc, 'strerror', None) or exc}")
            return None
        if not found:
            self.error(item.span, f"reference file '{path}' not found (looked for {full})")
            return None
        return ir.ReferenceFn(str(full), fn, item.span)


    # ------------------------------------------------------------- kernels
    def kernel(self, decl: ast.KernelDecl, scope: Scope | None = None, name: str | None = None) -> ir.Kernel:
        """Elaborate a kernel; a generic one with its generics bound in `scope`, as `name`."""
        saved = self.ctx
        self.ctx = KernelCtx("kernel")
        scope = Scope(scope or self.globals)
        params = []
        for p in decl.params:
            struct = self.struct_named(p.type.name) if isinstance(p.type, ast.ScalarType) else None
            if struct is not None:
                inst = self.struct_param(p, struct, HBM_ONLY, "kernel parameters are HBM arrays (kernels see "
                                                              "nothing of each other's VMEM)")
                if inst is not POISON:
                    params.extend(inst.members.values())
                self.define(scope, p.name, inst, p.name_span, "parameter")
            elif isinstance(p.type, ast.ScalarType):
                if self.dtype(p.type.name, p.type.span, ("i32", "bool")):
                    var = ir.ScalarVar(p.name, "param", p.span, p.type.name)
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
                self.error(p.type.span, "kernel parameters are HBM arrays, i32 or bool scalars (kernels see nothing of each other's VMEM)")
                self.define(scope, p.name, POISON, p.name_span, "parameter")
        body = self.block(decl.body, scope)
        self.semaphore_checks()
        ctx, self.ctx = self.ctx, saved
        return ir.Kernel(name or decl.name, tuple(params), tuple(ctx.buffers), tuple(ctx.sems), tuple(body),
                         decl.span)

    def semaphore_checks(self, local_only: bool = False) -> None:
        """Waits nothing raises, raises nothing waits, DMAs described and never used: after
        the body, each error naming the fn call its statement was inlined at. `local_only`
        (an fn checked on its own): only the fn's own semaphores and DMAs, which no caller
        can start or wait."""
        ctx = self.ctx
        own = set(ctx.sems) if local_only else None
        for sem, span, context in ctx.waits:
            if sem not in ctx.signalled and not ctx.unknown_post and (own is None or sem in own):
                self.error(span, f"wait on semaphore '{sem.name}', but no started DMA or signal ever targets it",
                           context)
        for sem, span, what, context in ctx.posts:
            if sem not in ctx.waited and not ctx.unknown_wait and (own is None or sem in own):
                self.error(span, f"{what} on semaphore '{sem.name}' is never waited (every semaphore must be "
                                 "back to 0 when the kernel ends)", context)
        for h, context in ctx.handles:
            if not h.started and not h.waited:
                if not h.measured:   # (a handle only measured by bytes() describes a size)
                    self.error(h.span, f"DMA '{h.name}' is described but never started or waited", context)
            elif (not h.waited and h.dma.sem.sem not in ctx.waited and not ctx.unknown_wait
                  and (own is None or h.dma.sem.sem in own)):
                self.error(h.span, f"DMA '{h.name}' is never waited", context)

    def check_fn_alone(self, decl: ast.FnDecl) -> None:
        """Check an fn body once with its declared types (if they are all static)."""
        self.ctx = KernelCtx("fn")
        scope = Scope(self.globals)
        self.inline_stack = []
        for p in decl.params:
            if self.is_scalar_param(p):
                if not self.dtype(p.type.name, p.type.span, ("i32", "bool")):
                    self.define(scope, p.name, POISON, p.name_span, "parameter")
                    continue
                var = ir.ScalarVar(p.name, "param", p.span, p.type.name)
                self.define(scope, p.name, var, p.name_span, "parameter")
        for p in decl.params:
            if self.is_scalar_param(p):
                continue
            entity = self.fn_param_entity(p, scope)
            if entity is None:
                # A type that depends on scalar parameters: checked at each call only.
                self.ctx = None
                return
            self.define(scope, p.name, entity, p.name_span, "parameter")
        before = dict(self.errors)
        cycles_before = set(self.cycles_reported)
        self.block(decl.body, scope)
        self.semaphore_checks(local_only=True)
        if self.ctx.call_dependent:
            # Sizes, counts or parts that come from scalar parameters: what follows from them
            # is only known at a call, where the body is checked with the arguments. A
            # recursion found here and dropped must be reported there (not taken as reported,
            # which would leave the recursive call out of the program without a word).
            self.errors = before
            self.cycles_reported = cycles_before
        else:
            self.fn_error_places.update(key[:5] for key in self.errors if key not in before)
        self.ctx = None

    def fn_param_entity(self, p: ast.Param, scope: Scope):
        n_before = len(self.errors)
        if isinstance(p.type, ast.ScalarType):
            return self.struct_param(p, self.struct_named(p.type.name), ANY_SPACE, "")
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


    def s_Launch(self, s: ast.Launch, scope, out) -> None:
        self.host_launches += 1
        if self.host_launches > MAX_HOST_LAUNCHES:
            # (the host loops are unrolled: many loops, each within its own limit, could
            # otherwise unroll without end; the loops around this one stop, `s_For`)
            if self.host_launches == MAX_HOST_LAUNCHES + 1:
                self.error(s.span, f"the host block launches more than {MAX_HOST_LAUNCHES:,} kernels, its loops "
                                   "unrolled (loops one after another counted together): launch fewer")
            return
        kernels = self.ctx.kernels
        b = self.globals.local(s.kernel)
        if b is None or not isinstance(b.entity, ast.KernelDecl):
            if b is None and s.kernel in self.refused_names:
                return    # (a kernel declared with a reserved name: the error is at its declaration)
            what = f"'{s.kernel}' is a {b.what}, not a kernel" if b else f"unknown kernel '{s.kernel}'"
            self.error(s.kernel_span, what)
            return
        decl = b.entity
        kernel = kernels.get(s.kernel)
        if len(s.args) != len(decl.params):
            self.error(s.span, f"kernel '{s.kernel}' takes {count_of(len(decl.params), 'argument')}, got {len(s.args)}")
            return
        values = []
        for a in s.args:
            if isinstance(a, (ast.Keyword, ast.Remote)):
                self.error(a.span, "launch arguments are host arrays or compile-time integers")
                values.append(POISON)
            else:
                values.append(self.expr(a, scope))
        if decl.generics:
            kernel = self.generic_kernel(decl, values, s, kernels)
        args = []
        ok = True
        # (by name, once per launch: a search of the list for each argument was quadratic
        # in the parameters, at every trip of a host loop)
        kernel_params = {q.name: q for q in reversed(kernel.params)} if kernel else {}
        for p, a, v in zip(decl.params, s.args, values):
            if v is POISON:
                ok = False
                continue
            struct = self.struct_named(p.type.name) if isinstance(p.type, ast.ScalarType) else None
            if struct is not None:
                if not isinstance(v, StructVal) or v.decl is not struct:
                    self.error(a.span, f"argument '{p.name}' must be a host instance of struct '{struct.name}', got "
                                       f"{self.kind_name(v)}")
                    ok = False
                    continue
                args.extend(self.whole(buf, a.span) for buf in v.members.values())
                continue
            param = kernel_params.get(p.name)
            if isinstance(p.type, ast.ScalarType):
                want = "bool" if p.type.name == "bool" else "integer"
                if not isinstance(v, ir.Const) or v.dtype != ("bool" if want == "bool" else "i32"):
                    got = f"a compile-time {'integer' if want == 'bool' else 'bool'}" if isinstance(v, ir.Const) \
                        else self.kind_name(v)
                    self.error(a.span, f"argument '{p.name}' must be a compile-time {want}, got {got}")
                    ok = False
                    continue
                if not -(1 << 31) <= v.value < (1 << 31):   # an i32 argument, one word of SMEM
                    self.error(a.span, f"argument '{p.name}' is {v.value:,}, which does not fit in 32 bits (int32 "
                                       f"is {-(1 << 31):,}..{(1 << 31) - 1:,})")
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
            if v.dtype == "mxfp4" and v.shape != v.buffer.shape:
                self.error(a.span, f"an mxfp4 launch argument is a whole host array ('{v.buffer.name}' stores "
                                   "every matrix's values before all the scales, so a part of it is no array); "
                                   "pass it whole and index it in the kernel")
                ok = False
                continue
            if v.dtype != param.dtype or v.shape != param.shape:
                self.error(
                    a.span,
                    f"argument '{p.name}' is {v.dtype}{describe(v.shape)}, kernel '{s.kernel}' expects {param.dtype}{describe(param.shape)}",
                )
                ok = False
                continue
            problem = non_contiguous(v)
            if problem is not None:
                # (once per argument: a host loop would repeat it for every trip's indices)
                if a.span not in self.launch_views_reported:
                    self.launch_views_reported.add(a.span)
                    self.error(a.span, f"argument '{p.name}' is not a contiguous part of '{v.buffer.name}': {problem}")
                ok = False
                continue
            args.append(v)
        if ok and kernel is not None:
            self.ctx.launches.append(ir.Launch(kernel, tuple(args), s.span))

    def generic_kernel(self, decl: ast.KernelDecl, values, s: ast.Launch, kernels: dict) -> ir.Kernel | None:
        """The instance of a generic kernel these launch arguments infer (made once)."""
        pairs = [(p, v, a.span) for p, v, a in zip(decl.params, values, s.args) if v is not POISON]
        bound = Scope(self.globals)
        if not self.infer_generics(decl, pairs, bound, f"kernel '{decl.name}'",
                                   complete=len(pairs) == len(decl.params)):
            return None
        name = self.generic_key(decl, bound)
        if name not in kernels:
            saved, self.instance_site = self.instance_site, (name, s.span)
            try:
                kernels[name] = self.kernel(decl, bound, name)
            finally:
                self.instance_site = saved
        return kernels[name]

    def s_IoDecl(self, s: ast.IoDecl, scope, out) -> None:
        if s.dims is None:
            self.host_instance(s.name, s.dtype, s.kind, s.span, s.name_span, scope)
            return
        self.claim_host_name(s.name, s.span, scope)
        t = ast.MemType("hbm", s.dtype, s.dims, None, s.span)
        buf = self.mem_type(t, scope, s.name, s.kind)
        self.define(scope, s.name, buf if buf is not None else POISON, s.name_span, s.kind)
        if buf is not None:
            self.ctx.host_arrays.append(buf)

    def host(self, decl: ast.HostDecl, kernels: dict) -> ir.Host:
        self.ctx = KernelCtx("host", kernels=kernels)
        self.block(decl.body, Scope(self.globals))
        ctx, self.ctx = self.ctx, None
        return ir.Host(tuple(ctx.host_arrays), tuple(ctx.launches), decl.span)


def non_contiguous(v: ir.Ref) -> str | None:
    """Why a launch argument's view is not one dense run of its host array (None if it
    is). A launch passes only the view's address and the kernel reads its parameter as
    dense rows from there, so the view must be: dimensions of extent 1 (point indices),
    then at most one partial dimension, then whole dimensions."""
    dims = [(off, size, n) for off, size, n in zip(v.offsets, v.sizes, v.buffer.shape)]
    inner = len(dims)                     # dims[inner:] are whole
    while inner > 0 and (dims[inner - 1][1] or 1) == dims[inner - 1][2]:
        inner -= 1
    outer = next((d for d in range(inner - 1) if (dims[d][1] or 1) != 1), None)
    if outer is None:
        return None
    partial = inner - 1
    shape = describe(tuple(v.buffer.shape))
    parts = []
    for off, size, _ in dims:
        if not isinstance(off, ir.Const):
            return None                   # (a run-time offset is an error of its own)
        parts.append(str(off.value) if size is None else f"{off.value}:{off.value + size}")
    view = f"{v.buffer.name}[{', '.join(parts)}]"
    return (f"{view} (of {v.buffer.dtype}{shape}) takes {dims[partial][1] or 1} of the {dims[partial][2]} "
            f"elements of dimension {partial} at each of {dims[outer][1]} indices of dimension {outer}, so its "
            f"elements are not adjacent. A launch passes only a view's address (the kernel would read dense "
            f"{v.buffer.dtype}{describe(v.shape)} from its first element), so a launch view is point indices, "
            f"then at most one slice, then whole dimensions (`w[l]`, `w[l, 0:4, :]`, `y[4:8, :]`): pass the "
            f"whole array and index it in the kernel")
