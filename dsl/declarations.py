"""Top-level declarations: the global namespace, params and consts, and buffer types.

`Declarations` is the base of the checker: it owns the collected errors, the global
scope (params, consts, fns, kernels of every loaded file), the folding of params and
consts (with `--set` overrides and tunable-param domains), local definitions, and
the rules that turn a written type (`vmem bf16[2][256, 128]`) into an `ir.Buffer`.
"""

from __future__ import annotations

import itertools
import re

import attrs

from mkemu.dsl import ast, ir
from mkemu.dsl.builtins import BUILTINS, PIPELINE_PARTS
from mkemu.dsl.layout import MX_BLOCK
from mkemu.dsl.values import POISON, Binding, ConstVal, DtypeVal, KernelCtx, Poison, Scope
from mkemu.errors import SourceSpan
from mkemu.isa.program import values_text

# The prefix `fn#N.` of a name an inlined fn's local takes, after its opening quote.
_INLINED_NAME = re.compile(r"'(?:[A-Za-z_][A-Za-z0-9_]*#[0-9]+\.)+")

DTYPES = ("bf16", "f32", "i32")
# Every dtype name, as a const may name one (`const ET = select(MX == 1, mxfp4, bf16);`).
ALL_DTYPES = DTYPES + ("mxfp4",)
LITERAL_NAMES = ("true", "false", "inf")   # literals the grammar reads as names
# MXFP4 is a storage dtype: HBM arrays and VMEM buffers of matrix-unit weights.
MX_SPACES = ("hbm", "vmem")
# A param range is listed value by value (for `--params` and tuners): keep it small.
MAX_PARAM_VALUES = 4096
MAX_CONST_CHAIN = 100      # consts defined in terms of consts ..., evaluated recursively
CONTEXT_CALLS = 4          # fn calls an error names in full; a longer chain: the innermost two, the outermost


class Declarations:
    """Checks a whole program (all loaded modules) and builds `ir.Program`."""

    def __init__(self, modules: list[ast.Module], sources: dict[str, str], overrides: dict[str, int]):
        self.modules = modules
        self.sources = sources
        self.overrides = overrides
        self.errors: dict[tuple, tuple[SourceSpan, str, str]] = {}
        self.globals = Scope(None)
        self.global_decls: dict[str, object] = {}
        self.const_values: dict[str, int | None] = {}
        self.const_dtypes: dict[str, str] = {}   # "bool" for a const that is a truth value
        self.dtype_consts: dict[str, str | None] = {}   # consts that name a dtype (None: in error)
        self.param_defaults: dict[str, int | None] = {}
        self.param_domains: dict[str, tuple[int, ...] | None] = {}
        self.evaluating: list[str] = []
        self.refused_names: set[str] = set()     # globals declared with a reserved name (reported there)
        self.chain_depth: dict[str, int] = {}   # const or param -> the others it is defined through, at most
        self.chain_below: list[int] = []        # ... so far, of each on `evaluating` that is one
        self.dtype_forms: dict[str, bool] = {}  # const -> is its value a dtype form (`is_dtype_form`)
        self.ctx: KernelCtx | None = None
        self.inline_stack: list[tuple[str, SourceSpan]] = []
        self.instance_site: tuple[str, SourceSpan] | None = None   # a generic kernel's instance and its launch
        self.inline_counter = itertools.count(1)
        self.inlined_calls = 0
        self.copied_stmts = 0   # statements of inlined fn bodies and generic kernel instances
        self.stmt_depth = 0   # statements nested around the one being checked, inlined fns' included
        # Per compile-time limit (see limit_error), the error item of its first breach.
        self.limits_hit: dict[str, tuple] = {}
        self.host_trips = 1   # iterations of the host loops being unrolled, multiplied
        self.host_overflow = False   # one of them runs too often: stop unrolling them
        self.host_launches = 0   # launches of the host block, its loops unrolled
        self.cycles_reported: set[frozenset[str]] = set()   # fn recursions already reported
        self.launch_views_reported: set[SourceSpan] = set()   # non-contiguous launch arguments
        self.fn_error_places: set[tuple] = set()   # where fns' own checks found errors (`check_fn_alone`)

    # ------------------------------------------------------------ diagnostics
    def error(self, span: SourceSpan, message: str, context: str | None = None) -> Poison:
        """Report `message` at `span`; `context` (default: where the checking is now) is the
        fn call or generic instance it comes from, for a check made after the body."""
        # An fn's locals are renamed at each call (`f#2.t`); a message names them as written,
        # so an error the fn's own check found is the same error at every call (reported once).
        message = _INLINED_NAME.sub("'", message)
        key = (span.file, span.line, span.column, span.end_line, span.end_column, message)
        if self.inline_stack and context is None and key[:5] in self.fn_error_places:
            # The fn's own check reported this place, once, at the fn; a call finds it again
            # in other words (naming the argument where the check named the parameter).
            return POISON
        if key not in self.errors:
            self.errors[key] = (span, message, self.error_context() if context is None else context)
        return POISON

    def limit_error(self, limit: str, span: SourceSpan, message: str, earliest: bool = True) -> None:
        """Report one breach of a compile-time limit (named `limit`): the first in the
        text (`earliest`) or the first found. Every fn is also checked on its own, so a
        chain of fns too deep breaches a depth limit again in each fn's check, each time at
        another place: hundreds of errors saying one thing. The one kept stays even if an
        fn's own check drops its errors."""
        key = (span.file, span.line, span.column, span.end_line, span.end_column, _INLINED_NAME.sub("'", message))
        if self.inline_stack and key[:5] in self.fn_error_places:
            return    # (reported by the fn's own check: `error`)
        first = self.limits_hit.get(limit)
        if first is not None:
            if not earliest or key[:3] >= first[0][:3]:
                return
            self.errors.pop(first[0], None)
        self.error(span, message)
        self.limits_hit[limit] = (key, self.errors[key])

    def error_context(self, *notes: str, outer: int | None = None) -> str:
        """Where an error in inlined code comes from: every fn call it is inlined at,
        innermost first (a library fn's error is told apart by the caller's call that
        reached it, which may hold the bad argument), and the launch of a generic
        kernel's instance, whose values (the generics) the error may depend on; after
        `notes` (what made the thing, for the `context` of a buffer or semaphore).
        `outer`: only the outermost `outer` calls (those that led to a recursion)."""
        stack = self.inline_stack if outer is None else self.inline_stack[:outer]
        frames = self._frames(reversed(stack))
        calls = len(stack)
        if calls > CONTEXT_CALLS:   # (a chain of dozens: the innermost two and the outermost)
            frames = [*frames[:2], f"{calls - 3} calls more", *frames[calls - 1:]]
        frames = [*notes, *frames]
        return f" ({', '.join(frames)})" if frames else ""

    def call_chain(self) -> str:
        """Every fn call the code being elaborated is inlined at, innermost first, then
        the launch of a generic kernel's instance: "in fn 'g' inlined at t.mk:4:5, in fn
        'f' inlined at t.mk:9:5" ("" in a kernel's own code)."""
        return ", ".join(self._frames(reversed(self.inline_stack)))

    def _frames(self, calls) -> list[str]:
        """The fn calls `calls` ((fn, site) pairs), then a generic kernel's instance's launch."""
        frames = [f"in fn '{fn}' inlined at {site}" for fn, site in calls]
        if self.instance_site is not None:
            name, site = self.instance_site
            frames.append(f"in kernel '{name}' launched at {site}")
        return frames

    def diagnostics(self) -> list[tuple[SourceSpan, str]]:
        errors = dict(self.errors)
        for item in self.limits_hit.values():
            errors.setdefault(*item)
        return [(span, msg + ctx) for span, msg, ctx in errors.values()]

    # ---------------------------------------------------------------- globals
    def collect_globals(self) -> None:
        for module in self.modules:
            for item in module.items:
                name = getattr(item, "name", None)
                if name is None or isinstance(item, ast.Import):
                    continue
                span = item.name_span
                if self.reserved(name, span, integer=isinstance(item, ast.ParamDecl)):
                    self.refused_names.add(name)
                    continue
                prev = self.globals.local(name)
                if prev is not None:
                    self.redefinition(span, name, prev)
                    continue
                what = {ast.ParamDecl: "param", ast.ConstDecl: "const", ast.FnDecl: "fn",
                        ast.KernelDecl: "kernel", ast.StructDecl: "struct"}[type(item)]
                self.globals.names[name] = Binding(item, span, what)
                self.global_decls[name] = item

    def const_value(self, name: str, decl) -> int | None:
        if name in self.const_values:
            self.chain_used(name)
            return self.const_values[name]
        if name in self.evaluating:
            chain = " -> ".join(self.evaluating[self.evaluating.index(name):] + [name])
            self.error(decl.name_span, f"'{name}' is defined in terms of itself: {chain}")
            return None
        if len(self.evaluating) > MAX_CONST_CHAIN:   # (evaluated recursively: Python's stack would overflow)
            self.limit_error("const chain", decl.name_span,
                             f"'{name}' is defined through a chain of more than {MAX_CONST_CHAIN} "
                             f"consts and params (from '{self.evaluating[0]}')")
            return None
        value = self.const_evaluated(name, decl)
        # How many consts and params it is defined through, the longest chain: the same
        # whichever order the text defines them in (one defined before its uses is
        # evaluated at once, not on the chain above).
        depth = self.chain_below.pop()
        self.chain_depth[name] = depth
        self.chain_used(name)
        if depth > MAX_CONST_CHAIN:
            self.limit_error("const chain", decl.name_span,
                             f"'{name}' is defined through a chain of more than {MAX_CONST_CHAIN} "
                             "consts and params")
            self.const_values[name] = value = None
            self.dtype_consts.pop(name, None)    # (the consts defined through it report nothing more)
        return value

    def chain_used(self, name: str) -> None:
        """The const or param being evaluated uses `name`, evaluated."""
        if self.chain_below:
            self.chain_below[-1] = max(self.chain_below[-1], self.chain_depth.get(name, 0) + 1)

    def const_evaluated(self, name: str, decl) -> int | None:
        self.chain_below.append(0)
        self.evaluating.append(name)
        saved_ctx, saved_stack, saved_site = self.ctx, self.inline_stack, self.instance_site
        self.ctx, self.inline_stack, self.instance_site = None, [], None
        if self.is_dtype_form(decl.value):
            if isinstance(decl, ast.ParamDecl):
                self.error(decl.value.span, f"param '{name}' must be an integer (params are set from outside as "
                                            f"integers); name a dtype with a const chosen by a param: "
                                            f"const T = select(P == 1, mxfp4, bf16);")
            else:
                self.dtype_consts[name] = self.dtype_value(decl.value, self.globals)
            self.ctx, self.inline_stack, self.instance_site = saved_ctx, saved_stack, saved_site
            self.evaluating.pop()
            self.const_values[name] = None
            return None
        # A param's default is checked even when it is set from outside: it is what
        # `--params` lists and what a tuner compares against.
        v = self.expr(decl.value, self.globals)
        is_param = isinstance(decl, ast.ParamDecl)
        if isinstance(v, ir.Const) and (v.dtype == "i32" or not is_param):
            value = v.value
            self.const_dtypes[name] = v.dtype
            if v.dtype == "i32":   # (a param named so is reported with the globals)
                self.reserved(name, decl.name_span, integer=True)
        else:
            if isinstance(v, ir.Const):
                self.error(decl.value.span, f"the value of param '{name}' must be an integer (params are set "
                                            "from outside as integers), got a bool")
            elif v is not POISON:
                kinds = "integer (params are set from outside as integers)" if is_param else "integer or bool"
                what = "param" if is_param else "const"
                self.error(decl.value.span, f"the value of {what} '{name}' must be a compile-time {kinds}")
            value = None
        if isinstance(decl, ast.ParamDecl):
            self.param_defaults[name] = value
            if name in self.overrides:
                value = self.overrides[name]
            if decl.domain is not None:
                value = self.param_in_domain(name, decl, value)
        self.ctx, self.inline_stack, self.instance_site = saved_ctx, saved_stack, saved_site
        self.evaluating.pop()
        self.const_values[name] = value
        return value

    def param_in_domain(self, name: str, decl: ast.ParamDecl, value: int | None) -> int | None:
        """`value` if it is one of the param's declared values (reporting it otherwise);
        the values are kept in `param_domains`."""
        values = self.param_values(decl.domain)
        self.param_domains[name] = values
        default = self.param_defaults.get(name)
        if values is not None and name in self.overrides and default is not None and default not in values:
            # The default must be a declared value whatever is set from outside.
            self.error(decl.value.span, f"the default {default} of param '{name}' is not one of its "
                                        f"declared values: {values_text(values)}")
        if values is None or value is None or value in values:
            return value
        if name in self.overrides:
            self.error(decl.domain.span, f"{name} = {value} (set from outside) is not one of its "
                                         f"declared values: {values_text(values)}")
            # The rest of the program is checked with the default (if it is valid), so
            # this error is not followed by others that only the bad value caused.
            default = self.param_defaults.get(name)
            return default if default in values else None
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
        count = max(0, -(-(stop - start) // step))   # (len() of a range past 2**63 raises OverflowError)
        if not count:
            self.error(domain.span, f"the range {start}..{stop} holds no value (its end is excluded, as in `for`)")
            return None
        if count > MAX_PARAM_VALUES:
            self.error(domain.span, f"a param takes at most {MAX_PARAM_VALUES} values; this range holds {count}")
            return None
        return tuple(values)

    # ------------------------------------------------------------ definitions
    def reserved(self, name: str, span: SourceSpan, integer: bool) -> bool:
        """Whether `name` is one the language defines, which a declaration cannot take
        (reported): the literals `true`, `false`, `inf`, the dtypes and the builtin
        functions, found by name wherever they are written (a binding would leave `f32(x)`
        the conversion but make `f32` something else); and for an integer, a pipeline
        part's name (`let prefetch = 2;` would silently turn `part prefetch` and
        `f(prefetch, ...)` into part 2). Other things may take a part's name."""
        if name in LITERAL_NAMES:
            message = f"'{name}' is a literal; it cannot be declared as a name"
        elif name in ALL_DTYPES:
            message = f"'{name}' is a dtype; it cannot be declared as a name"
        elif name == "bool":   # (a struct named bool would take over every `x: bool` parameter)
            message = "'bool' is a type; it cannot be declared as a name"
        elif name in BUILTINS:
            message = f"'{name}' is a builtin function; it cannot be declared as a name"
        elif integer and name in PIPELINE_PARTS:
            message = (f"'{name}' is the pipeline part {PIPELINE_PARTS.index(name)}; an integer may not take its "
                       f"name (`part {name}` or `f({name}, ...)` would silently mean the integer)")
        else:
            return False
        self.error(span, message)
        return True

    def check_param_names(self, decl) -> None:
        """The generics and parameters of an fn or kernel, at the declaration (those of a
        generic fn, or of an fn checked only at its calls, are bound there without a check
        of their own): not reserved, and not shadowing a global."""
        names = [(g.name, g.span, True) for g in decl.generics]
        names += [(p.name, p.name_span, isinstance(p.type, ast.ScalarType) and p.type.name == "i32")
                  for p in decl.params]
        for name, span, integer in names:
            if self.reserved(name, span, integer):
                continue
            prev = self.globals.lookup(name)
            if prev is not None:
                self.redefinition(span, name, prev)

    def define(self, scope: Scope, name: str, entity, span: SourceSpan, what: str) -> None:
        integer = what == "generic" or (isinstance(entity, (ConstVal, ir.ScalarVar)) and entity.dtype == "i32")
        if self.reserved(name, span, integer):
            return
        prev = scope.lookup(name)
        if prev is not None:
            self.redefinition(span, name, prev)
            return
        scope.names[name] = Binding(entity, span, what)

    def redefinition(self, span: SourceSpan, name: str, prev: Binding) -> None:
        where = f" (first defined at {prev.span})" if prev.span else ""
        self.error(span, f"redefinition of '{name}'{where}")

    def unique(self, name: str) -> str:
        if self.inline_stack:
            return f"{self.inline_stack[-1][0]}#{self.ctx.inline_id}.{name}" if self.ctx else name
        return name


    def assertion(self, item: ast.Assert, scope: Scope) -> bool:
        """Check a compile-time assert; False if it failed (reported here)."""
        v = self.const_bool(item.cond, scope, "an assert condition")
        if v is not None and not v:
            self.error(item.span, "assertion failed" + (f": {item.message}" if item.message else ""))
            return False
        return True

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
                self.error(e.span, f"dimensions must be positive, got {v}{self.passed(e, scope)}")
                return None
            out.append(v)
        return tuple(out)

    def passed(self, e, scope) -> str:
        """What the call of the fn being inlined passed to the parameters `e` reads
        (`; the call passes maxp = 8, cap = 0`): a dimension or count an fn computes from
        its arguments is wrong because of one of them. "" if `e` reads none."""
        found: dict[str, int] = {}
        stack = [e]
        while stack:       # (a stack of its own: an expression may nest deeper than Python's)
            node = stack.pop()
            if isinstance(node, ast.Name):
                b = scope.lookup(node.name)
                if b is not None and b.what == "parameter" and isinstance(b.entity, ConstVal):
                    found[node.name] = b.entity.value
            elif isinstance(node, (list, tuple)):
                stack.extend(reversed(node))
            elif attrs.has(type(node)) and not isinstance(node, SourceSpan):
                stack.extend(getattr(node, f.name) for f in reversed(attrs.fields(type(node))))
        if not found:
            return ""
        return "; the call passes " + ", ".join(f"{name} = {value}" for name, value in found.items())

    def dtype(self, name: str, span: SourceSpan, allowed=DTYPES) -> bool:
        if name not in allowed:
            known = name in ALL_DTYPES or name == "bool"
            self.error(span, f"{'dtype' if known else 'unknown dtype'} '{name}' "
                             f"{'is not allowed here ' if known else ''}(expected {', '.join(allowed)})")
            return False
        return True

    def mx_shape(self, shape: tuple[int, ...], t: ast.MemType) -> bool:
        """An MXFP4 array is [..., K, N]: N even (two values a byte), K a multiple of 32
        (the rows sharing one scale)."""
        if len(shape) < 2:
            self.error(t.span, f"an mxfp4 array has at least 2 dimensions [K, N] (weights, blocked along K), "
                               f"got {len(shape)}")
            return False
        if shape[-1] % 2:
            self.error(t.dims[-1].span, f"the last dimension of an mxfp4 array must be even (two 4-bit values a "
                                        f"byte), got {shape[-1]}")
            return False
        if shape[-2] % MX_BLOCK:
            self.error(t.dims[-2].span, f"the second-to-last dimension of an mxfp4 array must be a multiple of "
                                        f"{MX_BLOCK} (the rows sharing one scale), got {shape[-2]}")
            return False
        return True

    def slot_count(self, exprs, scope, span, what: str) -> int | None:
        if len(exprs) != 1:
            self.error(span, f"{what} takes one count in its first brackets, got {len(exprs)}")
            return None
        n = self.const_int(exprs[0], scope, "a count")
        if n is not None and n <= 0:
            self.error(exprs[0].span, f"count must be positive, got {n}{self.passed(exprs[0], scope)}")
            return None
        return n

    def resolve_dtype(self, name: str, scope) -> str | None:
        """A dtype name, the dtype a generic stands for, or the dtype a const names (None
        when that const is in error, already reported)."""
        b = scope.lookup(name) if scope is not None else None
        if b is not None and b.entity is POISON:   # (a name in error: `let T = bf16;`, already reported)
            return None
        if b is not None and isinstance(b.entity, DtypeVal):
            return b.entity.dtype
        if b is not None and isinstance(b.entity, ast.ConstDecl) and self.is_dtype_form(b.entity.value):
            self.const_value(name, b.entity)
            return self.dtype_consts.get(name)
        return name

    # -- dtype consts: `const ET = select(EXPERT_MX == 1, mxfp4, bf16);` names a dtype, used
    # in type positions (`moe_w1: hbm ET[L, K, N];`) so that a param can choose a buffer's
    # dtype (a struct member's included), which generics cannot: they are inferred from
    # arguments.
    def is_dtype_form(self, root) -> bool:
        """Whether a const's value is written as a dtype: a dtype name, a const that names
        one, or select(cond, a, b) whose a or b is one (checked by `dtype_value`). Walked
        with a stack of its own and known per const once found (`dtype_forms`): consts may
        name consts, or select between two, thousands deep (their evaluation reports the
        chain). A const reached again through itself is no dtype form there."""
        known = self.dtype_forms
        selects: dict[int, bool] = {}      # id(select(...)) -> its answer, in this walk
        open_consts: set[str] = set()      # the consts on the path being walked

        def answer(node) -> bool | None:   # (None: not known until its parts are)
            if isinstance(node, ast.Name):
                if node.name in known or node.name in open_consts:
                    return known.get(node.name, False)
                b = self.globals.local(node.name)
                if b is None or not isinstance(b.entity, ast.ConstDecl):
                    return b is None and node.name in ALL_DTYPES
                return None
            if isinstance(node, ast.Call) and node.func == "select" and len(node.args) == 3 and not node.keywords:
                return selects.get(id(node))
            return False

        def parts(node) -> list:
            return [self.globals.local(node.name).entity.value] if isinstance(node, ast.Name) else node.args[1:]

        stack = [(root, False)]
        while stack:
            node, walked = stack.pop()
            if not walked:
                if answer(node) is None:
                    if isinstance(node, ast.Name):
                        open_consts.add(node.name)
                    stack.append((node, True))
                    stack.extend((part, False) for part in parts(node))
                continue
            found = any(answer(part) for part in parts(node))
            if isinstance(node, ast.Name):
                open_consts.discard(node.name)
                known[node.name] = found
            else:
                selects[id(node)] = found
        return bool(answer(root))

    def dtype_value(self, node, scope) -> str | None:
        """The dtype a dtype form names (None after an error at its span)."""
        if isinstance(node, ast.Call):
            cond = self.expr(node.args[0], scope)
            for choice in node.args[1:]:
                if not self.is_dtype_form(choice):
                    self.error(choice.span, f"both choices of a dtype select(...) must be dtypes "
                                            f"({', '.join(ALL_DTYPES)}) or consts that name one")
                    return None
            if cond is POISON:
                return None
            if not isinstance(cond, ir.Const) or cond.dtype != "bool":
                self.error(node.args[0].span, "a dtype select(...) needs a compile-time bool condition "
                                              "(e.g. P == 1)")
                return None
            return self.dtype_value(node.args[1] if cond.value else node.args[2], scope)
        b = self.globals.local(node.name)
        if b is None:
            return node.name
        self.const_value(node.name, b.entity)
        return self.dtype_consts.get(node.name)

    def mem_type(self, t: ast.MemType, scope, name: str, role: str, context: str = "") -> ir.Buffer | None:
        dtype = self.resolve_dtype(t.dtype, scope)
        if dtype is None:
            return None
        if dtype == "mxfp4" and t.space not in MX_SPACES:
            self.error(t.span, f"mxfp4 holds matrix-unit weights in hbm arrays and vmem buffers, not in "
                               f"{'a var' if t.space == 'var' else t.space}")
            return None
        if t.space == "smem" and dtype in DTYPES and dtype != "i32":
            self.error(t.span, f"an smem buffer's dtype is i32 (SMEM holds i32 only), not {dtype}")
            return None
        allowed = ("i32",) if t.space == "smem" else ALL_DTYPES if t.space in MX_SPACES else DTYPES
        if dtype != "mxfp4" and not self.dtype(dtype, t.span, allowed):
            return None
        max_rank = 3 if t.space == "hbm" else 2
        shape = self.dims(t.dims, scope, f"{t.space} arrays", max_rank, t.span)
        if shape is not None and dtype == "mxfp4" and not self.mx_shape(shape, t):
            return None
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
        return ir.Buffer(name, t.space, dtype, shape, slots, t.span, role, context)

