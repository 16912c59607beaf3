"""The back end: lowers the checked IR (`mkemu.dsl.ir`) to a `mkemu.isa.program.Program`.

`compile_file(path, profile=..., params=...)` runs the front end and this back end.
One `KernelCompiler` per kernel walks the statements once, emitting instructions
(built with `isa.asm.encode` from the instruction table) tagged with the source span
they came from. This module owns the program level (HBM buffers, launches), scalar
code (registers, SMEM spills, control flow), DMAs, semaphores and static memory
allocation; tile expressions are lowered by `lower_tile.TileLowering`. The rules
other code may rely on are in docs/language.md, "Back end rules".
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import numpy as np

from mkemu.dsl import ir, layout
from mkemu.dsl.frontend import load_program
from mkemu.dsl.lower_tile import TileLowering
from mkemu.dsl.values import count_of
from mkemu.errors import Diagnostic, SourceError, SourceSpan, source_lines
from mkemu.isa.asm import encode
from mkemu.isa.encoding import BARRIER_SCOPES, SPACES, SPECIAL_REGS
from mkemu.isa.hardware import DEFAULT_PROFILE, HardwareProfile, load_profile
from mkemu.isa.program import Extent, Kernel, Launch, Program, RangeCheck, layout_buffers
from mkemu.isa.table import TABLE

# Scalar registers kept free for temporaries: a variable defined while fewer than
# this many registers are free lives in SMEM instead (loaded at each use).
RESERVED_TEMPS = 14

SCALAR_RR = {
    "+": "add", "-": "sub", "*": "mul", "/": "div", "%": "rem", "<<": "shl", ">>": "sra",
    "&": "and", "|": "or", "^": "xor", "==": "seq", "!=": "sne", "<": "slt", "<=": "sle",
    "min": "min", "max": "max",
}
COMMUTATIVE = {"+", "*", "&", "|", "^", "==", "!=", "min", "max"}
# Branch taken when the condition is FALSE: (mnemonic, swap operands).
BRANCH_IF_FALSE = {"<": ("bge", False), ">=": ("blt", False), ">": ("bge", True),
                   "<=": ("blt", True), "==": ("bne", False), "!=": ("beq", False)}
SPMD_SPECIAL = {"chip_id": "chip", "core_id": "core", "num_chips": "chips", "num_cores": "cores"}


class CompileError(Exception):
    def __init__(self, span: SourceSpan, message: str):
        super().__init__(message)
        self.span = span
        self.message = message


# ------------------------------------------------------------------- entry points


def compile_file(path: str | os.PathLike, profile: HardwareProfile | str = DEFAULT_PROFILE,
                 params: dict[str, int] | None = None) -> Program:
    program = load_program(path, params)
    return compile_program(program, profile)


def compile_text(text: str, filename: str = "<text>.mk", profile: HardwareProfile | str = DEFAULT_PROFILE,
                 params: dict[str, int] | None = None) -> Program:
    program = load_program(filename, params, text=text)
    return compile_program(program, profile)


def compile_program(program: ir.Program, profile: HardwareProfile | str) -> Program:
    if isinstance(profile, str):
        profile = load_profile(profile)
    # Every kernel's listing shows lines of the same sources: split them once and share the
    # lists (per kernel, a program of many kernels took time and memory quadratic in its size).
    source_text = {f: source_lines(t) for f, t in program.sources.items()}
    try:
        kernels = {name: KernelCompiler(program, k, profile, source_text).compile()
                   for name, k in program.kernels.items()}
        buffers, launches = _host(program)
    except CompileError as exc:
        raise SourceError([_diagnostic(exc.span, exc.message, program.sources)]) from None
    reference = None
    if program.reference is not None and program.reference.module:
        reference = f"{program.reference.module}:{program.reference.function}"
    elif program.reference is not None:
        ref_path = program.reference.path
        try:
            ref_path = os.path.relpath(ref_path, Path(program.main_file).resolve().parent)
        except ValueError:
            pass
        reference = f"{ref_path}:{program.reference.function}"
    return Program(kernels=kernels, launches=launches, buffers=buffers, reference=reference,
                   path=str(program.main_file), params=program.param_info)


def _diagnostic(span: SourceSpan, message: str, sources: dict[str, str]) -> Diagnostic:
    lines = source_lines(sources.get(span.file, ""))
    line = lines[span.line - 1] if 1 <= span.line <= len(lines) else None
    return Diagnostic(span, message, line)


KIND_OF_ROLE = {"input": "input", "output": "output", "scratch": "scratch"}


def _place(span: SourceSpan) -> str:
    return f"{span.file}:{span.line}"


def _host(program: ir.Program):
    if program.host is None:
        generic = next(iter(program.generic_kernels.items()), None)
        if len(program.kernels) != 1:
            k = next(iter(program.kernels.values()), None)
            span = k.span if k else generic[1] if generic else SourceSpan(program.main_file, 1, 1)
            note = "; a generic kernel is made only by launches" if not program.kernels else ""
            raise CompileError(span, f"a program without a host block must have exactly one kernel "
                                     f"(it has {len(program.kernels)}{note}); add `host {{ ... launch ...; }}`")
        if generic is not None:   # (else it would be silently left out, its body never checked)
            name, span = generic
            raise CompileError(span, f"generic kernel '{name}' is made only by launches, so a program with one "
                                     f"needs a host block that launches its kernels; add `host {{ ... launch ...; }}` "
                                     f"or remove '{name}'")
        kernel = next(iter(program.kernels.values()))
        for p in kernel.params:
            if not isinstance(p, ir.Buffer):
                raise CompileError(p.span, f"kernel '{kernel.name}' has a scalar parameter '{p.name}': "
                                           "a program without a host block passes only HBM arrays; add `host { ... launch ...; }` "
                                           "to pass it")
        reads, writes = _param_usage(kernel.body)
        specs = []
        for p in kernel.params:
            r, w = p in reads, p in writes
            kind = "inout" if r and w else "output" if w else "input"
            specs.append((p.name, p.dtype, tuple(p.shape), kind))
        buffers = layout_buffers(specs, [_place(p.span) for p in kernel.params])
        return buffers, (Launch(kernel.name, tuple(w for b in buffers for w in _address_words(b.offset_bytes))),)
    host = program.host
    buffers = layout_buffers([(b.name, b.dtype, tuple(b.shape), KIND_OF_ROLE[b.role]) for b in host.arrays],
                             [_place(b.span) for b in host.arrays])
    where = {b.name: pb for b, pb in zip(host.arrays, buffers)}
    launches = []
    for launch in host.launches:
        args = []
        for arg in launch.args:
            if isinstance(arg, ir.Ref):
                addr = where[arg.buffer.name].offset_bytes
                if arg.dtype == "mxfp4":     # a whole array (checked by the front end)
                    args += _address_words(addr)
                    continue
                for off, stride in zip(arg.offsets, layout.buffer_strides(arg.buffer)):
                    if not isinstance(off, ir.Const):
                        raise CompileError(arg.span, "a launch argument needs static offsets")
                    addr += off.value * stride
                args += _address_words(addr)
            else:
                args.append(int(arg))
        launches.append(Launch(launch.kernel.name, tuple(args), launch.span))
    return buffers, tuple(launches)


def _param_usage(body) -> tuple[set, set]:
    reads, writes = set(), set()
    for stmt, _ in walk_stmts(body):
        if isinstance(stmt, ir.DmaStart):
            reads.add(stmt.dma.src.buffer)
            writes.add(stmt.dma.dst.buffer)
    return reads, writes


def walk_stmts(body, outer: str = ""):
    """Every statement, nested ones too, with its context (its own, else its parent's, as
    `KernelCompiler.stmt` takes it)."""
    for s in body:
        context = s.context or outer
        yield s, context
        if isinstance(s, ir.For):
            yield from walk_stmts(s.body, context)
        elif isinstance(s, ir.If):
            yield from walk_stmts(s.then, context)
            yield from walk_stmts(s.orelse, context)
        elif isinstance(s, ir.Region):
            yield from walk_stmts(s.body, context)


# ------------------------------------------------------------------- the kernel


class Label:
    __slots__ = ("name", "pc")

    def __init__(self, name: str):
        self.name = name
        self.pc: int | None = None


@attrs.define
class Arena:
    """The temporaries of one statement: scalar registers and cached constants."""

    temps: set = attrs.Factory(set)
    consts: dict = attrs.Factory(dict)     # value -> register
    masks: dict = attrs.Factory(dict)      # (rows, cols) key -> mask register (insertion = age)


@attrs.frozen
class Crossing:
    """The first declaration (or statement, for temporaries and spills) that takes a
    kernel past a capacity of its profile, for the error at it: `what` it is ("this sem
    array of 8"), the kernel's `total` with it, and its `context` (an inlined fn's call)."""

    span: SourceSpan
    what: str
    total: int
    context: str = ""

    def describe(self, unit: str, cap: int, profile: HardwareProfile) -> str:
        return f"{self.what} brings the kernel to {self.total:,} {unit}; the profile '{profile.name}' has {cap:,}" \
               f"{self.context}"


class KernelCompiler(TileLowering):
    def __init__(self, program: ir.Program, kernel: ir.Kernel, profile: HardwareProfile,
                 source_text: dict[str, list[str]]):
        self.program = program
        self.source_text = source_text
        self.kernel = kernel
        self.profile = profile
        # (mnemonic, operand values, span, extents, range check, the statement's calls)
        self.code: list[tuple[str, dict, SourceSpan, tuple | None, object, str]] = []
        self.labels: list[Label] = []
        self.span = kernel.span
        self.context = ""                # the statement's (ir.Statement.context), for its errors
        self.calls = ""                  # ... and its whole chain of calls (ir.Statement.calls), for faults
        self.free_sregs = list(range(profile.sregs - 1, 0, -1))    # pop() gives s1 first
        self.free_vregs = list(range(profile.vregs - 1, -1, -1))
        self.free_mregs = list(range(profile.mregs - 1, 0, -1))
        self.arenas: list[Arena] = []
        self.homes: dict = {}            # ScalarVar -> ("r", reg) | ("m", smem byte address)
        self.scopes: list[list] = []     # per block: vars to release at its end
        self.values: dict = {}           # TileValue -> View
        self.regions: list[str] = []
        self.n_labels = 0
        self.in_select = 0               # > 0 while compiling the sides of a run-time select
        self._layout()

    # -- allocation ----------------------------------------------------------

    def _layout(self) -> None:
        k, p = self.kernel, self.profile
        # The argument block: an i32 scalar takes one word, an HBM array's address two
        # (low, high: a chip's HBM is larger than 32 bits reach).
        self.param_word = {}
        words = 0
        for param in k.params:
            self.param_word[param] = words
            words += 2 if isinstance(param, ir.Buffer) else 1
        self.arg_words = words
        # VMEM: every vmem buffer and var tile, statically; then a stack of temporaries.
        self.vmem_addr: dict = {}
        self.alloc_lines: list[tuple[int, str, int]] = []
        # (the first buffer, temporary or spill past the profile's VMEM / SMEM, for the
        # capacity error: a kernel author fixes that declaration, not the kernel)
        self.vmem_crossing: Crossing | None = None
        self.smem_crossing: Crossing | None = None
        top = 0
        for buf in k.buffers:
            if buf.space in ("vmem", "var"):
                size = layout.slot_stride(buf) * (buf.slots or 1)
                self.vmem_addr[buf] = top
                rows, cols = layout.tile_dims(buf.shape)
                self.alloc_lines.append((size, f"VMEM {top:#08x} {buf.name} {buf.dtype}[{rows},{cols}] "
                                               f"x {buf.slots or 1} ({size:,} bytes)", top))
                top += layout.round_up(size, layout.ALIGN_BYTES)
                if top > p.vmem_bytes and self.vmem_crossing is None:
                    self.vmem_crossing = Crossing(buf.span, _declared(buf), top, buf.context)
        self.vmem_static = top
        self.vmem_top = top
        self.vmem_peak = top
        # SMEM: argument block, DMA descriptors, smem buffers, then spill slots.
        smem = 4 * self.arg_words
        self.desc_addr: dict = {}
        # The first DMA that cannot be lowered, raised by compile() after the capacity
        # check: a buffer too big for VMEM also makes descriptors too big, and its
        # declaration is what to fix.
        self.dma_error: CompileError | None = None
        descs = []
        for stmt, context in walk_stmts(k.body):
            if isinstance(stmt, ir.DmaStart):
                for src, dst, part in dma_parts(stmt.dma):
                    try:
                        d = layout.dma_descriptor(src, dst, part)
                    except layout.DmaShapeError as exc:
                        self.dma_error = self.dma_error or CompileError(stmt.dma.span,
                                                                        f"cannot lower this DMA: {exc}{context}")
                        continue
                    bad = [w for w in d if not INT32_MIN <= w <= INT32_MAX]   # (descriptor words are int32)
                    if bad:
                        self.dma_error = self.dma_error or CompileError(
                            stmt.dma.span, f"cannot lower this DMA: its descriptor needs {bad[0]:,} "
                                           f"(a byte count or stride), which does not fit in 32 bits{context}")
                        continue
                    if d not in self.desc_addr:
                        self.desc_addr[d] = smem + 28 * len(descs)
                        descs.append(d)
        smem += 28 * len(descs)
        self.descs = descs
        self.desc_base = 4 * self.arg_words
        self.smem_addr: dict = {}
        over_before = smem > p.smem_bytes         # (the argument block and descriptors: no declaration)
        for buf in k.buffers:
            if buf.space == "smem":
                self.smem_addr[buf] = smem
                size = layout.slot_stride(buf) * (buf.slots or 1)
                self.alloc_lines.append((size, f"SMEM {smem:#08x} {buf.name} i32{list(buf.shape)} "
                                               f"x {buf.slots or 1} ({size:,} bytes)", 1 << 40))
                smem += size
                if smem > p.smem_bytes and not over_before and self.smem_crossing is None:
                    self.smem_crossing = Crossing(buf.span, _declared(buf), smem, buf.context)
        self.smem_top = smem
        self.free_spills: list[int] = []
        # Semaphores: static ids, arrays contiguous.
        self.sem_base: dict = {}
        self.sem_names: list[str] = []     # id -> its source name, for the emulator's messages
        n = 0
        crossing = None
        for sem in k.sems:
            self.sem_base[sem] = n
            n += sem.count or 1
            if n > p.semaphores and crossing is None:
                crossing = Crossing(sem.span, _declared(sem), n, sem.context)
        if crossing is not None:
            # At the declaration that crosses the limit; the first line is the kernel's total.
            raise CompileError(crossing.span, f"kernel '{k.name}' uses {n} semaphores; the profile has "
                                              f"{p.semaphores}\n" + crossing.describe("semaphores", p.semaphores, p))
        for sem in k.sems:
            # (a semaphore of an inlined fn is named `fn#call.name` inside the compiler)
            fn, dot, local = sem.name.partition(".")
            name, where = (local, f" of fn {fn.partition('#')[0]}") if dot and "#" in fn else (sem.name, "")
            self.sem_names += ([f"'{name}'{where}"] if sem.count is None
                               else [f"'{name}[{i}]'{where}" for i in range(sem.count or 1)])

    def vmem_push(self, size: int) -> int:
        addr = self.vmem_top
        self.vmem_top += layout.round_up(size, layout.ALIGN_BYTES)
        self.vmem_peak = max(self.vmem_peak, self.vmem_top)
        if self.vmem_top > self.profile.vmem_bytes and self.vmem_crossing is None:
            self.vmem_crossing = Crossing(self.span, "a temporary computed here", self.vmem_top, self.context)
        return addr

    def spill_slot(self) -> int:
        if self.free_spills:
            return self.free_spills.pop()
        addr = self.smem_top
        self.smem_top += 4
        if self.smem_top > self.profile.smem_bytes and self.smem_crossing is None:
            self.smem_crossing = Crossing(self.span, "a scalar spilled here", self.smem_top, self.context)
        return addr

    # -- emission ------------------------------------------------------------

    def emit(self, mnemonic: str, extents: tuple | None = None, check=None, **values) -> None:
        """Append one instruction. `extents`: the buffers its memory operands go through
        (in the row's footprint order), for run-time bounds checks; `check`: a
        `RangeCheck` of a register it takes."""
        self.code.append((mnemonic, values, self.span, extents, check, self.calls))

    def label(self, hint: str) -> Label:
        self.n_labels += 1
        lab = Label(f".L{self.n_labels}_{hint}")
        self.labels.append(lab)
        return lab

    def place(self, lab: Label) -> None:
        lab.pc = len(self.code)

    def error(self, message: str, span: SourceSpan | None = None):
        """Stop at `span` (default: what is being compiled), naming the fn call or generic
        instance the statement comes from, as the front end's errors do."""
        raise CompileError(span or self.span, message + self.context)

    def register_note(self, count: int, kind: str, reserved: str = "") -> str:
        """How many registers of `kind` the profile has (`reserved`: a note on the one that is
        not the compiler's to use), for an error of running out of them: a profile with few
        may be what to change, not the program."""
        return f"(the profile '{self.profile.name}' has {count_of(count, kind + ' register')}{reserved})"

    def int32(self, value: int) -> int:
        """A constant of the program used as a runtime int32: it must fit."""
        if not INT32_MIN <= value <= INT32_MAX:
            self.error(f"the constant {value:,} does not fit in 32 bits (int32 is "
                       f"{INT32_MIN:,}..{INT32_MAX:,})")
        return value

    # -- scalar registers ----------------------------------------------------

    def tmp(self) -> int:
        if not self.free_sregs:
            self.error("out of scalar registers: simplify this statement or use fewer live variables "
                       f"{self.register_note(self.profile.sregs, 'scalar', ', s0 being the constant 0')}")
        r = self.free_sregs.pop()
        self.arenas[-1].temps.add(r)
        return r

    def release(self, r: int | None) -> None:
        if r is None or r == 0:
            return
        arena = self.arenas[-1]
        if r in arena.temps and r not in arena.consts.values():
            arena.temps.discard(r)
            self.free_sregs.append(r)

    def is_temp(self, r: int) -> bool:
        return r in self.arenas[-1].temps and r not in self.arenas[-1].consts.values()

    def const_reg(self, value: int) -> int:
        """A register holding `value`, cached for the rest of the statement."""
        value = _wrap32(value)
        if value == 0:
            return 0
        arena = self.arenas[-1]
        r = arena.consts.get(value)
        if r is None:
            r = self.tmp()
            self.emit("li", sd=r, imm=value)
            arena.consts[value] = r
        return r

    def flush_caches(self) -> None:
        """Forget cached constants and masks (at loop heads: their values differ on the back edge)."""
        if not self.arenas:
            return
        arena = self.arenas[-1]
        for r in arena.consts.values():
            arena.temps.discard(r)
            self.free_sregs.append(r)
        arena.consts.clear()
        for m in arena.masks.values():
            self.free_mregs.append(m)
        arena.masks.clear()

    def push_arena(self) -> None:
        if self.arenas:
            self.flush_caches()
        self.arenas.append(Arena())

    def pop_arena(self) -> None:
        self.flush_caches()
        arena = self.arenas.pop()
        self.free_sregs.extend(arena.temps)

    # -- variables -----------------------------------------------------------

    def home(self, var: ir.ScalarVar):
        h = self.homes.get(var)
        if h is None:
            if var in self.param_word:
                return ("m", 4 * self.param_word[var])
            if len(self.free_sregs) > RESERVED_TEMPS:
                h = ("r", self.free_sregs.pop())
            else:
                h = ("m", self.spill_slot())
            self.homes[var] = h
            self.scopes[-1].append(var)
        return h

    def block(self, body) -> None:
        self.scopes.append([])
        saved_top = self.vmem_top
        for stmt in body:
            self.stmt(stmt)
        for var in self.scopes.pop():
            kind, where = self.homes.pop(var)
            (self.free_sregs if kind == "r" else self.free_spills).append(where)
        self.vmem_top = saved_top

    # -- scalar expressions ---------------------------------------------------

    def sval(self, e, want: int | None = None) -> int:
        """Evaluate scalar `e`; return its register (`want` if given). A returned
        temporary belongs to the caller (release it when done)."""
        prev, self.span = self.span, getattr(e, "span", self.span)
        try:
            r = self._sval(e, want)
        finally:
            self.span = prev
        if want is not None and r != want:
            self.emit("add", sd=want, sa=r, sb=0)
            self.release(r)
            return want
        return r

    def _dest(self, want, *inputs) -> int:
        if want is not None:
            return want
        for r in inputs:
            if self.is_temp(r):
                return r
        return self.tmp()

    def _sval(self, e, want):
        if isinstance(e, ir.Const):
            v = self.int32(e.value)
            if want is None and v == 0:
                return 0
            r = want if want is not None else self.tmp()
            self.emit("li", sd=r, imm=v)
            return r
        if isinstance(e, ir.ScalarRead):
            kind, where = self.home(e.var)
            if kind == "r":
                return where
            r = want if want is not None else self.tmp()
            self.emit("lds", sd=r, off=where, sa=0)
            return r
        if isinstance(e, ir.SmemLoad):
            reg, off = self.ref_address(e.ref)
            r = self._dest(want, reg) if reg is not None else (want if want is not None else self.tmp())
            self.emit("lds", sd=r, off=off, sa=reg or 0,
                      extents=None if e.guarded else (self.extent(e.ref.buffer),))
            if reg is not None and r != reg:
                self.release(reg)
            return r
        if isinstance(e, ir.Spmd):
            return self.spmd(e, want)
        if isinstance(e, ir.TileToScalar):
            r = want if want is not None else self.tmp()
            self.tile_to_scalar(e.tile, r)
            return r
        if isinstance(e, ir.ScalarOp):
            return self.scalar_op(e, want)
        self.error(f"internal: unknown scalar expression {type(e).__name__}")

    def scalar_op(self, e: ir.ScalarOp, want):
        op, args = e.op, e.args
        if op in ("neg", "!"):
            ra = self.sval(args[0])
            rd = self._dest(want, ra)
            if op == "neg":
                self.emit("sub", sd=rd, sa=0, sb=ra)
            else:
                self.emit("seqi", sd=rd, sa=ra, imm=0)
            if rd != ra:
                self.release(ra)
            return rd
        if op == "select":
            return self.select(args, want)
        a, b = args
        if op in ("&&", "||"):
            ra = self.sval(a)
            ta = self._dest(None, ra)
            self.emit("sne", sd=ta, sa=ra, sb=0)
            rb = self.sval(b)
            tb = self._dest(None, rb)
            self.emit("sne", sd=tb, sa=rb, sb=0)
            rd = self._dest(want, ta, tb)
            self.emit("and" if op == "&&" else "or", sd=rd, sa=ta, sb=tb)
            for r in (ta, tb):
                if r != rd:
                    self.release(r)
            return rd
        if isinstance(a, ir.Const) and not isinstance(b, ir.Const) and op in COMMUTATIVE:
            a, b = b, a
        if op in (">", ">=") and not isinstance(b, ir.Const):
            a, b, op = b, a, "<" if op == ">" else "<="
        if isinstance(b, ir.Const):
            imm = self.int32(b.value)
            ra = self.sval(a)
            rd = self._dest(want, ra)
            if op in (">", ">="):
                # a > c  <=>  !(a <= c);  a >= c  <=>  !(a < c)
                self.emit("slei" if op == ">" else "slti", sd=rd, sa=ra, imm=imm)
                self.emit("xori", sd=rd, sa=rd, imm=1)
            else:
                self.emit(SCALAR_RR[op] + "i", sd=rd, sa=ra, imm=imm)
            if rd != ra:
                self.release(ra)
            return rd
        ra = self.sval(a)
        rb = self.sval(b)
        rd = self._dest(want, ra, rb)
        self.emit(SCALAR_RR[op], sd=rd, sa=ra, sb=rb)
        for r in (ra, rb):
            if r != rd:
                self.release(r)
        return rd

    def select(self, args, want) -> int:
        """cond ? a : b without a branch: b ^ ((a ^ b) & -cond), cond being 0 or 1."""
        rc = self.sval(args[0])
        mask = self._dest(None, rc)
        self.emit("sub", sd=mask, sa=0, sb=rc)
        # Both sides run whichever is picked, though each was bounds-checked only under
        # its side of the condition (select(j + 1 < N, m[0, j + 1], 0)): the views they
        # read get no per-dimension checks, only their buffers' own.
        self.in_select += 1
        try:
            ra = self.sval(args[1])
            rb = self.sval(args[2])
        finally:
            self.in_select -= 1
        diff = self._dest(None, ra)
        self.emit("xor", sd=diff, sa=ra, sb=rb)
        self.emit("and", sd=diff, sa=diff, sb=mask)
        rd = self._dest(want, diff, rb)
        self.emit("xor", sd=rd, sa=diff, sb=rb)
        for r in (mask, ra, rb, diff):
            if r != rd:
                self.release(r)
        return rd

    def spmd(self, e: ir.Spmd, want):
        name = e.name
        rd = want if want is not None else self.tmp()
        if name in SPMD_SPECIAL:
            self.emit("rdsr", sd=rd, which=SPECIAL_REGS.index(SPMD_SPECIAL[name]))
            return rd
        if name in ("mesh_dim", "chip_coord"):
            axis = self.static_axis(e.args[0])
            which = ("mesh_" if name == "mesh_dim" else "chip_") + "xyz"[axis]
            self.emit("rdsr", sd=rd, which=SPECIAL_REGS.index(which))
            return rd
        if name == "global_core":
            # A core index past this machine's cores would name a core of the next chip.
            if isinstance(e.args[1], ir.Const) and not 0 <= e.args[1].value < self.profile.cores_per_chip:
                self.error(f"global_core: core {e.args[1].value} does not exist (profile "
                           f"'{self.profile.name}' has {self.profile.cores_per_chip} cores per chip)",
                           e.args[1].span)
            chip = self.sval(e.args[0])
            core = self.sval(e.args[1])
            cores = self.tmp()
            self.emit("rdsr", sd=cores, which=SPECIAL_REGS.index("cores"))
            # rd may be the home of the variable the core is read from (q = global_core(c, q)):
            # then the product goes elsewhere, so that the core is still there to add.
            prod = cores if rd == core else rd
            self.emit("mul", sd=prod, sa=chip, sb=cores)
            n = self.profile.cores_per_chip
            self.emit("add", sd=rd, sa=prod, sb=core,
                      check=None if isinstance(e.args[1], ir.Const) else RangeCheck(
                          core, 0, n, f"global_core: core {{value}} does not exist (the chip has {n} "
                                      f"cores, 0..{n - 1})"))
            for r in (chip, core, cores):
                if r != rd:
                    self.release(r)
            return rd
        if name == "peer":
            axis = self.static_axis(e.args[0])
            off = self.sval(e.args[1])
            c, n, t = self.tmp(), self.tmp(), self.tmp()
            self.emit("rdsr", sd=c, which=SPECIAL_REGS.index("chip_" + "xyz"[axis]))
            self.emit("rdsr", sd=n, which=SPECIAL_REGS.index("mesh_" + "xyz"[axis]))
            # c2 = (off rem n + c + n) mod n; delta = c2 - c. The offset is reduced first:
            # c + off itself would wrap in 32 bits for an offset near the int32 limits.
            self.emit("rem", sd=t, sa=off, sb=n)
            self.emit("add", sd=t, sa=t, sb=c)
            self.emit("add", sd=t, sa=t, sb=n)
            self.emit("rem", sd=t, sa=t, sb=n)
            self.emit("sub", sd=t, sa=t, sb=c)
            # chip stride along the axis: 1, X, X*Y
            if axis >= 1:
                self.emit("rdsr", sd=c, which=SPECIAL_REGS.index("mesh_x"))
                self.emit("mul", sd=t, sa=t, sb=c)
            if axis == 2:
                self.emit("rdsr", sd=c, which=SPECIAL_REGS.index("mesh_y"))
                self.emit("mul", sd=t, sa=t, sb=c)
            self.emit("rdsr", sd=c, which=SPECIAL_REGS.index("chip"))
            self.emit("add", sd=t, sa=t, sb=c)
            self.emit("rdsr", sd=c, which=SPECIAL_REGS.index("cores"))
            self.emit("mul", sd=t, sa=t, sb=c)
            self.emit("rdsr", sd=c, which=SPECIAL_REGS.index("core"))
            self.emit("add", sd=rd, sa=t, sb=c)
            for r in (off, c, n, t):
                if r != rd:
                    self.release(r)
            return rd
        self.error(f"internal: unknown builtin {name}")

    def static_axis(self, e) -> int:
        if not isinstance(e, ir.Const) or e.value not in (0, 1, 2):
            self.error("a mesh axis must be a compile-time 0, 1 or 2")
        return e.value

    # -- addresses -----------------------------------------------------------

    def ref_address(self, ref: ir.Ref, part: str | None = None) -> tuple[int | None, int]:
        """The byte address of a view's first element: (register or None, constant). An
        HBM address is 64 bits (a parameter's address plus offsets, in `.d` arithmetic).
        For an MXFP4 view, of the first byte of `part` (values or scales) of it."""
        buf = ref.buffer
        strides = layout.buffer_strides(buf) if part is None else layout.part_strides(buf, part)
        reg, const = None, 0
        wide = buf.space == "hbm"
        if wide:
            if buf not in self.param_word:
                self.error(f"'{buf.name}' is not a parameter of this kernel")
            reg = self.tmp()
            self.emit("lds.d", sd=reg, off=4 * self.param_word[buf], sa=0)
        elif buf.space == "smem":
            const = self.smem_addr[buf]
        else:
            const = self.vmem_addr[buf]
        if part is not None:
            const += layout.part_base(buf, part)
            ref = layout.part_ref(ref, part)
        # Each index (the slot, then every dimension) as a constant plus (expression,
        # coefficient) terms, in elements; a term is scaled to bytes by one instruction,
        # which checks the index's own range when it is the index's only run-time term.
        shape = layout.part_shape(buf.shape, part) if part is not None else tuple(buf.shape)
        indices = [(ref.slot, layout.slot_stride(buf), buf.slots, 1, None)] if ref.slot is not None else []
        indices += [(expr, stride, n, size or 1, dim)
                    for dim, (expr, stride, n, size) in enumerate(zip(ref.offsets, strides, shape, ref.sizes))]
        terms: list = []
        several: list = []    # (term, dimension) of the VMEM and SMEM starts of several run-time terms
        for expr, stride, n, length, dim in indices:
            index_terms: list = []
            k = _affine(expr, 1, index_terms)
            const += k * stride
            live = [(e, c) for e, c in index_terms if c * stride != 0]
            if live and dim is not None and length > n:
                self.error(f"a window of {length} is longer than dimension {dim} of '{buf.name}' (size {n}): "
                           "no start fits", ref.span)
            if len(live) == 1 and not self.in_select:
                terms.append((live[0][0], live[0][1] * stride, self.index_check(buf, part, dim, live[0][1], k,
                                                                                length, n)))
            else:
                if not wide and not self.in_select:
                    several += [(len(terms) + i, dim) for i in range(len(live))]
                terms += [(e, c * stride, None) for e, c in live]
        for i, dim in several:
            e, scale, _ = terms[i]
            terms[i] = (e, scale, self.term_check(buf, dim, scale, len(several)))
        d = ".d" if wide else ""
        for expr, stride, check in terms:
            r = self.sval(expr)
            t = self._dest(None, r)
            check = None if check is None else attrs.evolve(check, reg=r)
            if stride == 1:
                if t != r:
                    self.emit("add" + d, sd=t, sa=r, sb=0, check=check)
                # (else no instruction, so no check of this index: the whole-buffer one)
            elif stride & (stride - 1) == 0 and stride > 0:
                self.emit("shli" + d, sd=t, sa=r, imm=stride.bit_length() - 1, check=check)
            else:
                self.emit("muli" + d, sd=t, sa=r, imm=self.stride_imm(stride, buf), check=check)
            if reg is None:
                reg = t
            else:
                self.emit("add" + d, sd=reg, sa=reg, sb=t)
                self.release(t)
        if wide and not INT32_MIN <= const <= INT32_MAX:
            # A constant offset past 2 GiB: add its high half separately.
            lo = _wrap32(const)
            if not INT32_MIN <= (const - lo) >> 32 <= INT32_MAX:   # (lui.d's immediate is 32 bits)
                self.error(f"'{buf.name}': a constant offset of {const:,} bytes is past the 64-bit address space")
            high = self.tmp()
            self.emit("lui.d", sd=high, imm=(const - lo) >> 32)
            self.emit("add.d", sd=reg, sa=reg, sb=high)
            self.release(high)
            const = lo
        return reg, const

    def index_check(self, buf: ir.Buffer, part: str | None, dim: int | None, coeff: int, k: int,
                    length: int, n: int) -> RangeCheck | None:
        """The run-time check of one index of a view whose start is coeff * v + k for the
        value v of its only run-time term: the window [start, start + length) must lie
        in [0, n) (for the slot, `dim` None: the slot in [0, slots)). As a range of v
        (the register is filled in by the caller); None if every int32 v is in range."""
        lo_start, hi_start = -k, n - length - k          # coeff * v must lie in [lo_start, hi_start]
        if coeff > 0:
            lo, hi = -(-lo_start // coeff), hi_start // coeff + 1
        else:
            lo, hi = -(-hi_start // coeff), lo_start // coeff + 1
        if lo >= hi:
            lo = hi = 0                                  # no start fits: every value faults
        lo, hi = max(lo, INT32_MIN), min(hi, INT32_MAX + 1)
        if lo == INT32_MIN and hi == INT32_MAX + 1:
            return None
        name = f"'{buf.name}' ({_declared_type(buf)})"
        if part is not None:
            bytes_shape = ", ".join(map(str, layout.part_shape(buf.shape, part)))
            name = f"the {part} of '{buf.name}' ({_declared_type(buf)}, {part} as bytes [{bytes_shape}])"
        if coeff == 1 and k == 0:
            value = "{value}"
        else:
            term = "v" if coeff == 1 else "-v" if coeff == -1 else f"{coeff}*v"
            value = f"{term} {'+' if k >= 0 else '-'} {abs(k)} = {{start}} (v = {{value}})" if k else \
                f"{term} = {{start}} (v = {{value}})"
        if dim is None:
            what = f"slot {value} of {name} is outside 0..{n - 1}"
        else:
            what = f"index {value} of dimension {dim} of {name} is outside 0..{n - length}"
            if length > 1:
                what += f": a window of {length} from it would leave the dimension"
        return RangeCheck(0, lo, hi, what, kind="out-of-bounds", scale=coeff, offset=k)

    def term_check(self, buf: ir.Buffer, dim: int | None, scale: int, count: int) -> RangeCheck | None:
        """The check of one of the `count` terms of a VMEM or SMEM view's starts of several
        run-time terms (`x[i + j, :]`), which are checked against the whole buffer only:
        the address is summed in 32 bits, and a sum that wraps around may land back inside
        the buffer. So each such term, in bytes, stays within an equal share of what the
        address may add to a memory's bytes without wrapping (HBM addresses are 64-bit;
        the other terms are in their dimensions). As a range of the term's value; None
        where no int32 value can go past it."""
        memory = self.profile.vmem_bytes if _space(buf) == "vmem" else self.profile.smem_bytes
        share = (INT32_MAX - 2 * memory) // count           # bytes, each way
        a = abs(scale)
        lo, hi = -(share // a), share // a + 1
        if lo <= INT32_MIN and hi > INT32_MAX:
            return None
        where = "the slot" if dim is None else f"dimension {dim}"
        name = f"'{buf.name}' ({_declared_type(buf)})"
        return RangeCheck(0, lo, hi, f"the start in {where} of {name} has a run-time term {{value:,}} that, "
                                     f"times its step of {scale:,} bytes, is past the {share:,} bytes each of the "
                                     f"view's {count} run-time terms may add: the 32-bit address could wrap "
                                     "around (a start of several run-time terms is checked against the whole "
                                     "buffer, and a wrapped address may land inside it); such a term must lie "
                                     f"in {lo:,}..{hi - 1:,}", kind="out-of-bounds")

    def stride_imm(self, stride: int, buf: ir.Buffer) -> int:
        if not INT32_MIN <= stride <= INT32_MAX:
            self.error(f"'{buf.name}': an index step of {stride:,} bytes does not fit a 32-bit "
                       "immediate; index a smaller view")
        return stride

    def addr_reg(self, ref: ir.Ref, part: str | None = None) -> int:
        reg, const = self.ref_address(ref, part)
        if reg is None:
            return self.imm_reg(const)
        if const:
            self.emit("addi.d" if ref.buffer.space == "hbm" else "addi", sd=reg, sa=reg, imm=const)
        return reg

    def extent(self, buf: ir.Buffer, part: str | None = None) -> Extent:
        """The bytes a named buffer owns, for run-time bounds checks: VMEM up to the end
        of its last row (rows are padded to 128 lanes, slots to whole tiles), SMEM and
        HBM exactly. An MXFP4 buffer's `part`: in HBM just that part (so an index past
        the values faults rather than reading scales), in VMEM the whole buffer (each slot
        holds both parts)."""
        if part is not None:
            shape, strides = layout.part_shape(buf.shape, part), layout.part_strides(buf, part)
            dtype = f"mxfp4 {part}"
            if buf.space == "hbm":
                return Extent(buf.name, "hbm", layout.part_base(buf, part), layout.part_size(buf, part), shape,
                              strides, dtype, self.param_word.get(buf))
            size = layout.slot_stride(buf) * ((buf.slots or 1) - 1) + layout.part_base(buf, "scales") \
                + layout.part_size(buf, "scales")
            if buf.slots:
                shape, strides = (buf.slots,) + shape, (layout.slot_stride(buf),) + strides
            return Extent(buf.name, "vmem", self.vmem_addr[buf], size, shape, strides, dtype)
        shape, strides = tuple(buf.shape), layout.buffer_strides(buf)
        space, param = _space(buf), None
        if space == "hbm":
            lo, size, param = 0, layout.slot_stride(buf), self.param_word.get(buf)
        else:
            lo = self.smem_addr[buf] if space == "smem" else self.vmem_addr[buf]
            last = strides[0] * shape[0] if len(shape) == 2 else layout.slot_stride(buf)
            if space == "smem":
                last = layout.slot_stride(buf)
            size = layout.slot_stride(buf) * ((buf.slots or 1) - 1) + last
        if buf.slots:
            shape, strides = (buf.slots,) + shape, (layout.slot_stride(buf),) + strides
        return Extent(buf.name, space, lo, size, shape, strides, buf.dtype, param)

    def sem_reg(self, sref: ir.SemRef) -> int:
        base = self.sem_base[sref.sem]
        if sref.index is None or isinstance(sref.index, ir.Const):
            return self.imm_reg(base + (sref.index.value if sref.index is not None else 0))
        # An index known only at run time: the `addi` that adds the array's first semaphore
        # checks it (free of cycles) before it runs, or it would name another semaphore.
        r = self.sval(sref.index)
        t = self._dest(None, r)
        n = sref.sem.count
        self.emit("addi", sd=t, sa=r, imm=base, check=RangeCheck(
            r, 0, n, f"index {{value}} of semaphore array '{sref.sem.name}' (sem[{n}]) is outside 0..{n - 1}"))
        return t

    def imm_reg(self, value: int) -> int:
        if value == 0:
            return 0
        r = self.tmp()
        self.emit("li", sd=r, imm=_wrap32(value))
        return r

    # -- statements ----------------------------------------------------------

    def stmt(self, s) -> None:
        self.span = s.span
        # (a statement with no context of its own, one a pipeline made in its loop, is in its parent's)
        outer, self.context = self.context, s.context or self.context
        outer_calls, self.calls = self.calls, s.calls or self.calls
        self.pre = {}
        self.block_cache = {}
        self.push_arena()
        try:
            getattr(self, "stmt_" + type(s).__name__)(s)
        finally:
            self.pop_arena()
            self.context, self.calls = outer, outer_calls

    def stmt_LetScalar(self, s: ir.LetScalar) -> None:
        self.assign(s.var, s.value)

    def stmt_SetScalar(self, s: ir.SetScalar) -> None:
        self.assign(s.var, s.value)

    def assign(self, var, value) -> None:
        kind, where = self.home(var)
        if kind == "r":
            self.sval(value, want=where)
        else:
            r = self.sval(value)
            self.emit("sts", sb=r, off=where, sa=0)

    def stmt_StoreSmem(self, s: ir.StoreSmem) -> None:
        val = self.sval(s.value)
        reg, off = self.ref_address(s.ref)
        self.emit("sts", sb=val, off=off, sa=reg or 0, extents=(self.extent(s.ref.buffer),))

    def stmt_LetTile(self, s: ir.LetTile) -> None:
        self.let_tile(s.value, s.expr)

    def stmt_StoreTile(self, s: ir.StoreTile) -> None:
        self.store_tile(s.ref, s.value, s.op)

    def stmt_DmaStart(self, s: ir.DmaStart) -> None:
        for src, dst, part in dma_parts(s.dma):
            self.dma_start(s.dma, src, dst, part)

    def dma_start(self, dma: ir.Dma, src_ref: ir.Ref, dst_ref: ir.Ref, part: str | None) -> None:
        """One dma.start: of the whole copy, or of one part of an MXFP4 copy (both on the
        copy's semaphore, which so counts the bytes of both)."""
        desc = self.desc_addr[layout.dma_descriptor(src_ref, dst_ref, part)]
        src = self.addr_reg(src_ref, part)
        dst = self.addr_reg(dst_ref, part)
        d = self.imm_reg(desc)
        sem = self.sem_reg(dma.sem)
        dsp = SPACES.index(_space(dma.dst.buffer))
        ssp = SPACES.index(_space(dma.src.buffer))
        extents = (self.extent(dma.src.buffer, part), self.extent(dma.dst.buffer, part))
        if dma.target is None:
            self.emit("dma.start", dsp=dsp, dst=dst, ssp=ssp, src=src, desc=d, sem=sem, extents=extents)
        else:
            tgt = self.sval(dma.target)
            rsem = self.sem_reg(dma.recv_sem if dma.recv_sem is not None else dma.sem)
            self.emit("dma.start.r", dsp=dsp, dst=dst, tgt=tgt, ssp=ssp, src=src, desc=d, sem=sem, rsem=rsem,
                      extents=extents)

    def stmt_DmaWait(self, s: ir.DmaWait) -> None:
        sref = s.dma.recv_sem if s.side == "recv" else s.dma.sem
        if sref is None:
            self.error("wait recv on a copy without a receive semaphore")
        sem = self.sem_reg(sref)
        val = self.imm_reg(s.dma.size_bytes)
        self.emit("sem.wait", sem=sem, val=val)

    def stmt_Signal(self, s: ir.Signal) -> None:
        sem = self.sem_reg(s.sem)
        val = self.sval(s.amount)
        if s.target is None:
            self.emit("sem.signal", sem=sem, val=val)
        else:
            tgt = self.sval(s.target)
            self.emit("sem.signal.r", sem=sem, val=val, tgt=tgt)

    def stmt_SemWait(self, s: ir.SemWait) -> None:
        sem = self.sem_reg(s.sem)
        val = self.sval(s.amount)
        self.emit("sem.wait", sem=sem, val=val)

    def stmt_Barrier(self, s: ir.Barrier) -> None:
        scope = "all" if s.axis is None else "xyz"[s.axis]
        self.emit("barrier", scope=BARRIER_SCOPES.index(scope))

    def stmt_Region(self, s: ir.Region) -> None:
        if s.name not in self.regions:
            self.regions.append(s.name)
        idx = self.sval(s.index) if s.index is not None else 0
        self.emit("mark.push", region=self.regions.index(s.name), sa=idx)
        self.release(idx)
        self.block(s.body)
        self.span = s.span
        self.emit("mark.pop")

    def stmt_If(self, s: ir.If) -> None:
        else_l = self.label("else")
        self.branch_if_false(s.cond, else_l)
        self.block(s.then)
        if s.orelse:
            end_l = self.label("endif")
            self.span = s.span
            self.emit("jmp", target=end_l)
            self.place(else_l)
            self.block(s.orelse)
            self.place(end_l)
        else:
            self.place(else_l)

    def branch_if_false(self, cond, target: Label) -> None:
        if isinstance(cond, ir.ScalarOp) and cond.op in BRANCH_IF_FALSE:
            mnem, swap = BRANCH_IF_FALSE[cond.op]
            ra = self.sval(cond.args[0])
            rb = self.sval(cond.args[1])
            if swap:
                ra, rb = rb, ra
            self.emit(mnem, sa=ra, sb=rb, target=target)
            self.release(ra)
            self.release(rb)
            return
        r = self.sval(cond)
        self.emit("beq", sa=r, sb=0, target=target)
        self.release(r)

    def stmt_For(self, s: ir.For) -> None:
        var = s.var
        self.check_loop_bounds(s)
        # Stepping past the last value must not wrap around: the exit test `var + step <
        # stop` is done as `var < stop` after the step, which a step of 1 cannot carry
        # past int32 (var < stop), and neither can a larger one that stops well below it.
        # A compile-time stop that the step from the last value could pass is tested
        # against stop - step before stepping instead (`guarded`); a run-time stop keeps
        # the cheap test and the step checks, free of cycles, that it does not wrap
        # (docs/language.md).
        const_stop = isinstance(s.stop, ir.Const)
        guarded = const_stop and _last_step_passes_int32(s)
        checked = not const_stop and s.step > 1
        self.scopes.append([])
        kind, where = self.home(var)
        stop_home = None
        if not const_stop:
            # The bound is evaluated once, at loop entry.
            if len(self.free_sregs) > RESERVED_TEMPS:
                stop_home = ("r", self.free_sregs.pop())
            else:
                stop_home = ("m", self.spill_slot())
            if stop_home[0] == "r":
                self.sval(s.stop, want=stop_home[1])
            else:
                r = self.sval(s.stop)
                self.emit("sts", sb=r, off=stop_home[1], sa=0)
                self.release(r)
        self.assign(var, s.start)
        body_l, end_l = self.label("for_" + var.name), self.label("endfor_" + var.name)
        self.loop_test(var, s.stop, stop_home, "bge", end_l)
        if guarded:
            step_l = self.label("step_" + var.name)
            self.emit("jmp", target=body_l)
            self.place(step_l)
            self.push_arena()
            try:
                self.loop_step(s, kind, where, None)
            finally:
                self.pop_arena()
        self.place(body_l)
        self.block(s.body)
        self.span = s.span
        if guarded:
            limit = ir.Const(s.stop.value - s.step, s.stop.span)
            self.loop_test(var, limit, None, "blt", step_l)
        else:
            self.push_arena()
            try:
                self.loop_step(s, kind, where, self.wrap_check(s) if checked else None)
                self.loop_test(var, s.stop, stop_home, "blt", body_l)
            finally:
                self.pop_arena()
        self.place(end_l)
        for v in self.scopes.pop():
            k, w = self.homes.pop(v)
            (self.free_sregs if k == "r" else self.free_spills).append(w)
        if stop_home is not None:
            (self.free_sregs if stop_home[0] == "r" else self.free_spills).append(stop_home[1])

    def check_loop_bounds(self, s: ir.For) -> None:
        """The loop variable is an int32: a compile-time bound must fit."""
        for bound in (s.start, s.stop):
            if isinstance(bound, ir.Const) and not INT32_MIN <= bound.value <= INT32_MAX:
                self.error(f"the loop bound {bound.value:,} does not fit in 32 bits (a loop variable is an "
                           f"int32, {INT32_MIN:,}..{INT32_MAX:,})", bound.span)

    def loop_step(self, s: ir.For, kind: str, where: int, check: RangeCheck | None) -> None:
        """var += step, in the caller's arena (`check`: a RangeCheck of the value stepped
        from; its register is filled in here)."""
        if kind == "r":
            self.emit("addi", sd=where, sa=where, imm=self.int32(s.step),
                      check=None if check is None else attrs.evolve(check, reg=where))
        else:
            t = self.tmp()
            self.emit("lds", sd=t, off=where, sa=0)
            self.emit("addi", sd=t, sa=t, imm=self.int32(s.step),
                      check=None if check is None else attrs.evolve(check, reg=t))
            self.emit("sts", sb=t, off=where, sa=0)

    def wrap_check(self, s: ir.For) -> RangeCheck:
        """The step of a loop with a run-time stop must not carry the variable past int32:
        it would wrap around below the stop and the loop would run on. A value the step
        cannot pass without wrapping is one the loop ends at, so it faults there."""
        name = s.var.name.rsplit(".", 1)[-1]
        top = INT32_MAX - s.step + 1                      # the values that step without wrapping: < top
        return RangeCheck(0, INT32_MIN, top,
                          f"the loop variable '{name}' = {{value:,}} plus its step {s.step:,} passes "
                          f"{INT32_MAX:,}, the largest int32, so the loop's exit test would see it wrap around "
                          f"instead of reaching its run-time stop (with step {s.step:,}, keep the stop at most "
                          f"{top:,})")

    def check_capacity(self, lines: list) -> None:
        """One error for VMEM and SMEM past the profile: at the first declaration (or
        statement) that crosses, the kernel's totals first (both memories named when both
        are over), then what crossed."""
        k, p = self.kernel, self.profile
        over, crossed = [], []
        for space, used, cap, crossing in (("VMEM", self.vmem_peak, p.vmem_bytes, self.vmem_crossing),
                                           ("SMEM", self.smem_top, p.smem_bytes, self.smem_crossing)):
            if used > cap:
                biggest = sorted(lines, key=lambda x: -x[0])
                biggest = [l for _, l, _ in biggest if l.startswith(space)][:5]
                over.append(f"{used:,} bytes of {space}, {used - cap:,} bytes more than the {cap:,} of profile "
                            f"'{p.name}'; largest buffers: " + "; ".join(biggest))
                if crossing is not None:
                    crossed.append((crossing, crossing.describe(f"bytes of {space}", cap, p)))
        if not over:
            return
        message = f"kernel '{k.name}' needs " + ", and ".join(over)
        if not crossed:
            raise CompileError(k.span, message)
        (first, text), *rest = crossed
        message += "\n" + text + "".join(f"\nand at {c.span}: {t}" for c, t in rest)
        raise CompileError(first.span, message)

    def loop_test(self, var, stop, stop_home, mnem: str, target: Label) -> None:
        self.push_arena()
        try:
            kind, where = self.home(var)
            rv = where if kind == "r" else self.sval(ir.ScalarRead(var, self.span))
            if stop_home is None:
                rs = self.imm_reg(stop.value)
            elif stop_home[0] == "r":
                rs = stop_home[1]
            else:
                rs = self.tmp()
                self.emit("lds", sd=rs, off=stop_home[1], sa=0)
            self.emit(mnem, sa=rv, sb=rs, target=target)
        finally:
            self.pop_arena()

    # -- the kernel ------------------------------------------------------------

    def compile(self) -> Kernel:
        k = self.kernel
        # Buffers too big to hold, first: lowering tiles of them could take forever.
        self.check_capacity(sorted(self.alloc_lines, key=lambda x: (x[2], x[1])))
        if self.dma_error is not None:
            raise self.dma_error
        self.push_arena()
        self.block(k.body)
        self.span = k.span
        self.emit("halt")
        self.pop_arena()
        vmem = self.vmem_peak
        smem = self.smem_top
        lines = sorted(self.alloc_lines, key=lambda x: (x[2], x[1]))
        if self.vmem_peak > self.vmem_static:
            lines.append((self.vmem_peak - self.vmem_static,
                          f"VMEM {self.vmem_static:#08x} (temporaries) ({self.vmem_peak - self.vmem_static:,} bytes)",
                          self.vmem_static))
        self.check_capacity(lines)
        for lab in self.labels:
            if lab.pc is None:
                raise AssertionError(f"label {lab.name} never placed")
        words = np.empty(len(self.code), dtype=np.uint64)
        spans = []
        extents, ranges, chains = {}, {}, {}
        for i, (mnem, values, span, ext, check, calls) in enumerate(self.code):
            vals = {key: (v.pc if isinstance(v, Label) else v) for key, v in values.items()}
            words[i] = encode(TABLE[mnem], vals)
            spans.append(span)
            if ext is not None and any(e is not None for e in ext):
                extents[i] = ext
            if check is not None:
                ranges[i] = check
            if calls:
                chains[i] = calls
        smem_init = bytearray(self.desc_base + 28 * len(self.descs))
        for d, addr in self.desc_addr.items():
            smem_init[addr:addr + 28] = np.array(d, dtype=np.int32).tobytes()
        desc_line = []
        if self.descs:
            desc_line = [f"SMEM {self.desc_base:#08x} DMA descriptors x {len(self.descs)} "
                         f"({28 * len(self.descs)} bytes)"]
        alloc = ([f"SMEM {0:#08x} arguments x {len(k.params)} ({4 * self.arg_words} bytes)"]
                 + desc_line + [l for _, l, _ in lines])
        if self.smem_top > self.smem_alloc_end():
            alloc.append(f"SMEM {self.smem_alloc_end():#08x} spilled scalars "
                         f"({self.smem_top - self.smem_alloc_end()} bytes)")
        return Kernel(
            name=k.name, code=words, smem_init=bytes(smem_init), source_map=tuple(spans),
            source_text=self.source_text,
            labels={lab.name: lab.pc for lab in self.labels}, regions=tuple(self.regions),
            vmem_bytes=vmem, smem_bytes=smem, allocation=tuple(alloc), extents=extents, ranges=ranges,
            calls=chains,
            semaphores=tuple(self.sem_names))

    def smem_alloc_end(self) -> int:
        end = self.desc_base + 28 * len(self.descs)
        for buf, addr in self.smem_addr.items():
            end = max(end, addr + layout.slot_stride(buf) * (buf.slots or 1))
        return end


def _declared_type(buf: ir.Buffer) -> str:
    """A buffer's type as declared, for messages: `f32[2][8, 128]` (slots first)."""
    slots = f"[{buf.slots}]" if buf.slots else ""
    return f"{buf.dtype}{slots}[{', '.join(map(str, buf.shape))}]"


def _declared(entity: ir.Buffer | ir.Semaphore) -> str:
    """A buffer or semaphore as its declaration makes it, for an error at that declaration."""
    if isinstance(entity, ir.Semaphore):
        return "this sem" if entity.count is None else f"this sem array of {entity.count:,}"
    if entity.space == "var":
        return "this var"
    kind = f"{entity.space} buffer"
    return f"this {kind}" if entity.slots is None else f"this {kind} array of {entity.slots:,}"


def _last_step_passes_int32(s: ir.For) -> bool:
    """Whether the step from the last value of a loop with a compile-time stop could carry
    its variable past 2,147,483,647: with a compile-time start the last value is known (a
    loop that stops short of the limit keeps the cheap exit test), else it may be any value
    below the stop."""
    stop = s.stop.value
    if not isinstance(s.start, ir.Const):
        return stop - 1 + s.step > INT32_MAX
    start = s.start.value
    last = stop - 1 - (stop - 1 - start) % s.step
    return start < stop and last + s.step > INT32_MAX


def dma_parts(dma: ir.Dma) -> tuple[tuple[ir.Ref, ir.Ref, str | None], ...]:
    """The DMAs one copy is: itself, or for MXFP4 its values and then its scales."""
    if dma.src.dtype != "mxfp4":
        return ((dma.src, dma.dst, None),)
    return tuple((dma.src, dma.dst, part) for part in layout.MX_PARTS)


def _affine(expr, scale: int, terms: list) -> int:
    """Split `expr * scale` into a constant (returned) and (expression, factor) terms."""
    if isinstance(expr, ir.Const):
        return expr.value * scale
    if isinstance(expr, ir.ScalarOp) and len(expr.args) == 2:
        a, b = expr.args
        if expr.op == "+":
            return _affine(a, scale, terms) + _affine(b, scale, terms)
        if expr.op == "-" and isinstance(b, ir.Const):
            return _affine(a, scale, terms) - b.value * scale
        if expr.op == "*" and isinstance(b, ir.Const):
            return _affine(a, scale * b.value, terms)
        if expr.op == "*" and isinstance(a, ir.Const):
            return _affine(b, scale * a.value, terms)
    terms.append((expr, scale))
    return 0


def _address_words(addr: int) -> tuple[int, int]:
    """An HBM address as the two argument words (low, high) a kernel loads with lds.d."""
    return addr & 0xFFFFFFFF, addr >> 32


def _space(buf: ir.Buffer) -> str:
    return {"hbm": "hbm", "vmem": "vmem", "var": "vmem", "smem": "smem"}[buf.space]


INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def _wrap32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >> 31 else v
