"""Syntax tree of a .mk file, exactly as written: no name resolution, no folding.

Every node is a small frozen attrs class carrying the `SourceSpan` it came from.
Declarations also keep `name_span` so an error about a name can point at the name.
The checked, resolved form that the back end consumes lives in `mkemu.dsl.ir`.
"""

from __future__ import annotations

import attrs

from mkemu.errors import SourceSpan

# ----------------------------------------------------------------- expressions


@attrs.frozen
class Name:
    name: str
    span: SourceSpan


@attrs.frozen
class IntLit:
    value: int
    span: SourceSpan


@attrs.frozen
class FloatLit:
    """A float literal: `text` as written, `value` its float64 reading (the checker rounds
    `text` to float32 itself, once)."""

    value: float
    span: SourceSpan
    text: str


@attrs.frozen
class Binary:
    """`left op right`; op is the source text (`+`, `<=`, `&&`, `<<`, ...)."""

    op: str
    left: "Expr"
    right: "Expr"
    span: SourceSpan


@attrs.frozen
class Unary:
    op: str  # "-" or "!"
    operand: "Expr"
    span: SourceSpan


@attrs.frozen
class Keyword:
    """A keyword argument `name=value` (only `axis=` is used by builtins)."""

    name: str
    value: "Expr"
    span: SourceSpan


@attrs.frozen
class Remote:
    """`value @ target` in a call argument: the thing named lives on core `target`."""

    value: "Expr"
    target: "Expr"
    span: SourceSpan


@attrs.frozen
class Call:
    func: str
    args: tuple["Expr | Remote", ...]
    keywords: tuple[Keyword, ...]
    span: SourceSpan
    func_span: SourceSpan


@attrs.frozen
class Slice:
    """`start:stop` with either end optional (None means 0 / the dimension size)."""

    start: "Expr | None"
    stop: "Expr | None"
    span: SourceSpan


@attrs.frozen
class SizedSlice:
    """`start +: length`: any start, a compile-time length."""

    start: "Expr"
    length: "Expr"
    span: SourceSpan


@attrs.frozen
class Index:
    """`base[i0, i1, ...]`; each item is an expression (a point) or a slice."""

    base: "Expr"
    items: tuple["Expr | Slice | SizedSlice", ...]
    span: SourceSpan


@attrs.frozen
class Field:
    """`base.name`: a member of a struct instance."""

    base: "Expr"
    name: str
    span: SourceSpan
    name_span: SourceSpan


Expr = Name | IntLit | FloatLit | Binary | Unary | Call | Index | Field

# ------------------------------------------------------------------------ types


@attrs.frozen
class MemType:
    """`hbm f32[L, D, D]`, `vmem bf16[2][256, 1024]` (slots=(2,)), `smem i32[16]`.

    `slots` holds the first bracket of a buffer array as written; the checker
    insists on exactly one entry.
    """

    space: str
    dtype: str
    dims: tuple[Expr, ...]
    slots: tuple[Expr, ...] | None
    span: SourceSpan


@attrs.frozen
class SemType:
    """`sem` or `sem[N]` (an array of N semaphores; one entry, checked later)."""

    count: tuple[Expr, ...] | None
    span: SourceSpan


@attrs.frozen
class ScalarType:
    """A scalar parameter type; only `i32` is valid (checked, not parsed)."""

    name: str
    span: SourceSpan


Type = MemType | SemType | ScalarType


@attrs.frozen
class Param:
    name: str
    type: Type
    span: SourceSpan
    name_span: SourceSpan


# ------------------------------------------------------------------- statements


@attrs.frozen
class BufferDecl:
    """`vmem x: f32[8, 128];`, `vmem w: bf16[2][256, 256];`, `smem idx: i32[16];`;
    in the host `hbm st: State;` (no dims: `dtype` names a struct)."""

    space: str
    name: str
    dtype: str
    dims: tuple[Expr, ...]
    slots: tuple[Expr, ...] | None
    span: SourceSpan
    name_span: SourceSpan


@attrs.frozen
class SemDecl:
    name: str
    count: tuple[Expr, ...] | None
    span: SourceSpan
    name_span: SourceSpan


@attrs.frozen
class VarDecl:
    """`var k: i32 = 0;` (a mutable scalar) or `var acc: f32[8, 256];` (a tile)."""

    name: str
    dtype: str
    dims: tuple[Expr, ...] | None
    init: Expr | None
    span: SourceSpan
    name_span: SourceSpan


@attrs.frozen
class Let:
    name: str
    value: Expr
    span: SourceSpan
    name_span: SourceSpan


@attrs.frozen
class Assign:
    """`target op value;` with op one of `=`, `+=`, `-=`, `*=`, `/=`."""

    target: Expr
    op: str
    value: Expr
    span: SourceSpan


@attrs.frozen
class ExprStmt:
    expr: Expr
    span: SourceSpan


@attrs.frozen
class Start:
    dma: Expr
    span: SourceSpan


@attrs.frozen
class Wait:
    """`wait h;` (completion on the issuing side) or `wait recv h;` (arrival)."""

    dma: Expr
    recv: bool
    span: SourceSpan


@attrs.frozen
class WaitSem:
    """`wait(sem, amount);`"""

    sem: Expr
    amount: Expr
    span: SourceSpan


@attrs.frozen
class Block:
    stmts: tuple["Stmt", ...]
    span: SourceSpan


@attrs.frozen
class For:
    var: str
    start: Expr
    stop: Expr
    step: Expr | None
    body: Block
    span: SourceSpan
    var_span: SourceSpan


@attrs.frozen
class Pipeline:
    """`pipeline t in a..b [step s] [depth d] [part p] { streams; body }`."""

    var: str
    start: Expr
    stop: Expr
    step: Expr | None
    depth: Expr | None
    part: Expr | None   # whole (0, the default), prefetch (1: the first tiles only), primed (2: the rest)
    body: Block
    span: SourceSpan
    var_span: SourceSpan


@attrs.frozen
class PipeStream:
    """`input x = VIEW [via BUF, SEMS];` or `output y = VIEW ...;` at the top of a pipeline."""

    kind: str          # "input" or "output"
    name: str
    view: Expr
    via: tuple[Expr, Expr] | None
    span: SourceSpan
    name_span: SourceSpan


@attrs.frozen
class If:
    cond: Expr
    then: Block
    orelse: "Block | If | None"
    span: SourceSpan


@attrs.frozen
class Region:
    name: str
    index: Expr | None
    body: Block
    span: SourceSpan


@attrs.frozen
class Launch:
    """`launch k(args);` in the host block (keyword arguments are kept to be rejected)."""

    kernel: str
    args: tuple["Expr | Keyword | Remote", ...]
    span: SourceSpan
    kernel_span: SourceSpan


@attrs.frozen
class IoDecl:
    """Host only: `input a: f32[8, 128];` or `output y: f32[8, 128];`; `input w: S;`
    (dims None: `dtype` names a struct) declares one host array per member of S."""

    kind: str
    name: str
    dtype: str
    dims: tuple[Expr, ...] | None
    span: SourceSpan
    name_span: SourceSpan


@attrs.frozen
class Assert:
    """`assert cond, "message";` checked at compile time."""

    cond: Expr
    message: str | None
    span: SourceSpan


Stmt = (
    BufferDecl | SemDecl | VarDecl | Let | Assign | ExprStmt | Start | Wait | WaitSem
    | For | Pipeline | PipeStream | If | Region | Launch | IoDecl | Assert
)

# ------------------------------------------------------------------------ items


@attrs.frozen
class Import:
    path: str
    span: SourceSpan


@attrs.frozen
class ParamSet:
    """`in {v1, v2, ...}`: the values a param may take."""

    values: tuple[Expr, ...]
    span: SourceSpan


@attrs.frozen
class ParamRange:
    """`in start..stop [step s]`: the values a param may take, `stop` excluded."""

    start: Expr
    stop: Expr
    step: Expr | None
    span: SourceSpan


@attrs.frozen
class ParamDecl:
    """`param NAME = default [in values] ["description"];`"""

    name: str
    value: Expr
    span: SourceSpan
    name_span: SourceSpan
    domain: ParamSet | ParamRange | None = None
    description: str | None = None


@attrs.frozen
class ConstDecl:
    name: str
    value: Expr
    span: SourceSpan
    name_span: SourceSpan


@attrs.frozen
class Reference:
    """`reference "file.py:function";` (a file next to the program) or
    `reference "package.module:function";` (an importable module) names the numpy reference."""

    target: str
    span: SourceSpan


@attrs.frozen
class Generic:
    """A generic name of a fn or kernel (`<K, N, T>`): a dimension, count or dtype
    inferred from the arguments."""

    name: str
    span: SourceSpan


@attrs.frozen
class FnDecl:
    name: str
    params: tuple[Param, ...]
    body: Block
    span: SourceSpan
    name_span: SourceSpan
    generics: tuple[Generic, ...] = ()


@attrs.frozen
class KernelDecl:
    name: str
    params: tuple[Param, ...]
    body: Block
    span: SourceSpan
    name_span: SourceSpan
    generics: tuple[Generic, ...] = ()


@attrs.frozen
class HostDecl:
    body: Block
    span: SourceSpan


@attrs.frozen
class StructDecl:
    """`struct S { name: type; ... }`: members typed like parameters."""

    name: str
    members: tuple[Param, ...]
    span: SourceSpan
    name_span: SourceSpan


Item = Import | ParamDecl | ConstDecl | Reference | FnDecl | KernelDecl | HostDecl | StructDecl | Assert


@attrs.frozen
class Module:
    file: str
    items: tuple[Item, ...]
    span: SourceSpan
