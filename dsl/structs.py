"""Structs: named groups of buffers and semaphores, declared once and shared.

`struct S { name: type; ... }` declares members typed like parameters (`hbm`, `vmem`,
`smem` arrays, `sem`, `sem[N]`), sized by globals. An instance (`StructVal`) holds one
entity per member:

- in the host, `input w: S;` / `output w: S;` / `hbm w: S;` make one host array per
  member, named like the member (so a program's inputs keep the names a driver
  writes), all HBM;
- a kernel parameter `w: S` is one HBM parameter per member, in member order, and a
  launch passes a host instance;
- an fn parameter `w: S` takes any instance of S;
- `let b = S();` in a kernel or fn body makes fresh VMEM/SMEM buffers and semaphores.

`w.name` is the member, used like the buffer or semaphore it is.
"""

from __future__ import annotations

from mkemu.dsl import ast, ir
from mkemu.dsl.statements import Statements
from mkemu.dsl.values import POISON, KernelCtx, StructVal

SCALAR_TYPES = ("i32", "bool")
# Where instances are made, the spaces their members may have.
KERNEL_SPACES = ("vmem", "smem", "sem")
HBM_ONLY = ("hbm",)
ANY_SPACE = ("hbm", "vmem", "smem", "sem")


class Structs(Statements):
    """Struct instances and their members."""

    def is_scalar_param(self, p: ast.Param) -> bool:
        """`n: i32` / `f: bool` (a `NAME` type that is not a struct's name)."""
        return isinstance(p.type, ast.ScalarType) and self.struct_named(p.type.name) is None

    def struct_named(self, name: str) -> ast.StructDecl | None:
        b = self.globals.local(name)
        return b.entity if b is not None and isinstance(b.entity, ast.StructDecl) else None

    def instantiate(self, decl: ast.StructDecl, naming, role: str, spaces: tuple[str, ...], site,
                    where: str, made=lambda member: ""):
        """A StructVal with a fresh entity per member (`naming(member)` names them, and
        `made(member)` is its `context`), or POISON; a member whose space is not in `spaces`
        is an error at `site`."""
        members: dict[str, object] = {}
        ok = True
        for m in decl.members:
            space = "sem" if isinstance(m.type, ast.SemType) else getattr(m.type, "space", None)
            if space is None:
                what = (f"an instance of struct '{m.type.name}' (structs do not nest)"
                        if self.struct_named(m.type.name) is not None
                        else "a scalar type (pass scalars as parameters)")
                self.error(m.type.span, f"struct members are buffers or semaphores; '{m.name}' is {what}")
                ok = False
                continue
            if m.name in members:
                self.error(m.name_span, f"struct '{decl.name}' has two members named '{m.name}'")
                ok = False
                continue
            if space not in spaces:   # one error per instance, at its first misplaced member
                what = "a semaphore" if space == "sem" else f"in {space}"
                return self.error(site, f"member '{m.name}' of struct '{decl.name}' is {what}: {where}")
            if self.absent_member(m.type, space):
                continue
            if space == "sem":
                count = None
                if m.type.count is not None:
                    count = self.slot_count(m.type.count, self.globals, m.type.span, "a semaphore array")
                    if count is None:
                        ok = False
                        continue
                members[m.name] = ir.Semaphore(naming(m.name), count, m.span, made(m.name))
            else:
                buf = self.mem_type(m.type, self.globals, naming(m.name), role, made(m.name))
                if buf is None:
                    ok = False
                    continue
                members[m.name] = buf
        return StructVal(decl, members) if ok else POISON

    def check_struct_alone(self, decl: ast.StructDecl) -> None:
        """A struct's members checked at its declaration, used or not (as an instance that
        may hold any space; where an instance is made checks the spaces). A member's name
        is one a declaration may take: in the host, `input w: S;` declares a host array of
        that name."""
        for m in decl.members:
            self.reserved(m.name, m.name_span, integer=False)
        saved, self.ctx = self.ctx, KernelCtx("fn")
        self.instantiate(decl, lambda m: f"{decl.name}.{m}", "param", ANY_SPACE, decl.span, "")
        self.ctx = saved

    def absent_member(self, t, space: str) -> bool:
        """A member whose slot or semaphore count is 0 (`x: vmem T[N][..]` with N = 0) is
        absent: the instance has no buffer and no semaphores for it, so a struct can hold
        buffers that a compile-time choice needs or not (e.g. a ring for MXFP4 experts)
        without moving anything else."""
        counts = t.count if space == "sem" else (t.slots if space in ("vmem", "smem") else None)
        if not counts or len(counts) != 1:
            return False
        return self.const_int(counts[0], self.globals, "a count") == 0

    def local_instance(self, s: ast.Let, decl: ast.StructDecl, scope) -> None:
        """`let b = S();` in a kernel or fn body: fresh buffers and semaphores."""
        call = s.value
        if call.args or call.keywords:
            self.error(call.span, f"'{decl.name}()' takes no arguments (it makes a fresh instance of the struct)")
        if self.ctx.mode == "host":
            self.error(s.span, "host struct instances are declared with input, output or hbm: "
                               f"`hbm {s.name}: {decl.name};`")
            self.define(scope, s.name, POISON, s.name_span, "let binding")
            return
        # (a member's span is in the struct: its context names the instance)
        inst = self.instantiate(decl, lambda m: self.unique(f"{s.name}.{m}"), "local", KERNEL_SPACES, call.span,
                                "kernels cannot allocate HBM; make the instance in the host and pass it",
                                lambda m: self.error_context(f"member '{m}' of '{s.name}', the instance of struct "
                                                             f"'{decl.name}' made at {call.span}"))
        if inst is not POISON:
            for entity in inst.members.values():
                (self.ctx.sems if isinstance(entity, ir.Semaphore) else self.ctx.buffers).append(entity)
        self.define(scope, s.name, inst, s.name_span, "let binding")

    def host_instance(self, name: str, type_name: str, role: str, span, name_span, scope) -> None:
        """`input w: S;`, `output w: S;`, `hbm w: S;` in the host: one host array per member."""
        decl = self.struct_named(type_name)
        if decl is None:
            self.error(span, f"'{type_name}' is not a struct; a host array needs dimensions: {name}: dtype[...]")
            self.define(scope, name, POISON, name_span, role)
            return
        inst = self.instantiate(decl, lambda m: m, role, HBM_ONLY, span, "host arrays are HBM")
        if inst is not POISON:
            sites = self.ctx.host_sites
            for buf in inst.members.values():
                site = sites.get(buf.name, next((b.span for b in self.ctx.host_arrays if b.name == buf.name), None))
                if site is not None:
                    self.error(span, f"host array '{buf.name}' (a member of struct '{decl.name}') is already "
                                     f"declared at {site}")
                    inst = POISON
                    break
            else:
                self.ctx.host_arrays.extend(inst.members.values())
                sites.update((buf.name, span) for buf in inst.members.values())
                self.ctx.host_members.update(buf.name for buf in inst.members.values())
        self.define(scope, name, inst, name_span, role)

    def struct_param(self, p: ast.Param, decl: ast.StructDecl, spaces: tuple[str, ...], where: str):
        """A parameter `w: S` checked on its own (kernel parameters, stand-alone fns)."""
        return self.instantiate(decl, lambda m: f"{p.name}.{m}", "param", spaces, p.type.span, where)

    # -- statements that may make instances
    def s_Let(self, s: ast.Let, scope, out) -> None:
        decl = self.struct_named(s.value.func) if isinstance(s.value, ast.Call) else None
        if decl is None:
            super().s_Let(s, scope, out)
        else:
            self.local_instance(s, decl, scope)

    def claim_host_name(self, name: str, span, scope) -> None:
        """A plain host array may not take a name a struct instance's member already took
        (one a plain array took is a redefinition, reported as such)."""
        site = self.ctx.host_sites.get(name)
        if site is not None and scope.lookup(name) is None:
            if site == span:   # the same declaration again: a host loop unrolled
                self.error(span, f"host array '{name}' would be declared once per iteration of a host loop; "
                                 "declare it before the loop")
            else:
                member = " (a struct member)" if name in self.ctx.host_members else ""
                self.error(span, f"host array '{name}' is already declared{member} at {site}")
        self.ctx.host_sites.setdefault(name, span)

    def s_BufferDecl(self, s: ast.BufferDecl, scope, out) -> None:
        if s.dims is not None:
            if self.ctx.mode == "host":
                self.claim_host_name(s.name, s.span, scope)
            super().s_BufferDecl(s, scope, out)
        elif self.ctx.mode == "host" and s.space == "hbm":
            self.host_instance(s.name, s.dtype, "scratch", s.span, s.name_span, scope)
        else:
            self.error(s.span, f"a buffer needs dimensions ({s.space} {s.name}: dtype[...]); a struct instance in a "
                               f"kernel is `let {s.name} = {s.dtype}();`")
            self.define(scope, s.name, POISON, s.name_span, "buffer")
