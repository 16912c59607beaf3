"""What a name can stand for while a program is checked, and how values are described.

`POISON` is the value of an expression that already produced an error (it silences
the errors that would follow from it); `ConstVal` / `FloatVal` are compile-time
values bound to names; `DmaHandle` a copy bound with `let`; `Scope` maps names to
`Binding`s, block by block. The `describe` helpers spell shapes and tiles the way
error messages show them.
"""

from __future__ import annotations

import attrs

from mkemu.dsl import ir
from mkemu.errors import SourceSpan


class Poison:
    """The value of an expression that already produced an error."""

    def __repr__(self) -> str:
        return "POISON"


POISON = Poison()


@attrs.frozen
class ConstVal:
    value: int
    dtype: str = "i32"  # or "bool"


@attrs.frozen
class FloatVal:
    value: float


@attrs.frozen
class DtypeVal:
    """A generic bound to a dtype (`T` in `fn f<T>(x: vmem T[8, 128])`)."""

    dtype: str


@attrs.define(eq=False)
class DmaHandle:
    name: str
    dma: ir.Dma
    span: SourceSpan
    started: bool = False
    waited: bool = False
    measured: bool = False     # its bytes() counted (a wait on its semaphore by bytes)


@attrs.frozen
class ViewChoice:
    """`select(cond, a, b)` of two views of one dtype and shape with a run-time cond:
    only a copy can use it (its start becomes a branch)."""

    cond: object             # a bool scalar expression
    a: "ir.Ref | ViewChoice"
    b: "ir.Ref | ViewChoice"

    @property
    def first(self) -> ir.Ref:
        return self.a.first if isinstance(self.a, ViewChoice) else self.a

    @property
    def dtype(self) -> str:
        return self.first.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.first.shape

    @property
    def size_bytes(self) -> int:
        return self.first.size_bytes


@attrs.frozen
class DmaChoice:
    """A copy whose source or destination is a ViewChoice: `start` issues one of two
    copies; both move the same bytes on the same semaphores, so a wait is one wait."""

    cond: object
    a: "ir.Dma | DmaChoice"
    b: "ir.Dma | DmaChoice"

    @property
    def first(self) -> ir.Dma:
        return self.a.first if isinstance(self.a, DmaChoice) else self.a

    @property
    def sem(self):
        return self.first.sem

    @property
    def recv_sem(self):
        return self.first.recv_sem

    @property
    def target(self):
        return self.first.target

    @property
    def size_bytes(self) -> int:
        return self.first.size_bytes


@attrs.frozen
class DmaCount:
    """`n * copy(...)`: n copies of one shape on one semaphore, for a single `wait`."""

    dma: ir.Dma
    handle: DmaHandle | None
    count: object   # an integer scalar expression
    span: SourceSpan


@attrs.frozen(eq=False)
class StructVal:
    """An instance of a struct: one entity (ir.Buffer or ir.Semaphore) per member, in
    member order. Instances compare by identity."""

    decl: object   # the ast.StructDecl
    members: dict


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


def describe(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def tile_desc(t) -> str:
    return f"{t.dtype}{describe(t.shape)}"


def count_of(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def bf16_hint(dtype: str) -> str:
    return "; convert with f32() first" if dtype == "bf16" else ""


@attrs.define(eq=False)
class KernelCtx:
    """Per-kernel state: emitted entities, loop ranges, semaphore bookkeeping."""

    mode: str  # "kernel", "fn" (stand-alone fn check) or "host"
    buffers: list = attrs.Factory(list)
    sems: list = attrs.Factory(list)
    ranges: dict = attrs.Factory(dict)
    let_defs: dict = attrs.Factory(dict)  # let ScalarVar -> its value (`expand_lets`)
    signalled: set = attrs.Factory(set)
    waited: set = attrs.Factory(set)
    # (the error context of each: the fn call it was inlined at, for messages after the body)
    waits: list = attrs.Factory(list)  # (Semaphore, span, context)
    posts: list = attrs.Factory(list)  # (Semaphore, span, what, context)
    handles: list = attrs.Factory(list)  # (DmaHandle, context)
    # A start or signal (wait) that failed to check and whose semaphore is unknown: the
    # checks after the body then do not report waits (raises) it might have matched.
    unknown_post: bool = False
    unknown_wait: bool = False
    inline_id: int = 0
    host_arrays: list = attrs.Factory(list)
    host_sites: dict = attrs.Factory(dict)       # host array name -> the declaration that made it
    host_members: set = attrs.Factory(set)      # host array names that are struct members
    call_dependent: bool = False   # an fn checked alone needed a parameter's value at compile time
    launches: list = attrs.Factory(list)
    kernels: dict = attrs.Factory(dict)
    # (buffer, span) -> the view of all of it there, made once: a host loop's launches at
    # every trip name the same arrays, and a million copies of the views took memory and time
    whole_views: dict = attrs.Factory(dict)
