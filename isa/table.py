"""The instruction table: every instruction of the ISA declared once.

A row gives everything about one instruction: the mnemonic, the operands (name,
kind, read or written), the assembly syntax template, the functional unit, the
timing class, what else it reads and writes (matrix-unit state, memories: its
access sets), whether it is global (it talks to other cores, DMA engines or the
event loop) and, for every other row, its semantics as an `exec` clause that the
emulator's compiled issue loop runs. The assembler, disassembler, compiler back end,
the emulator's decoder, scoreboard, race footprints and executor are all derived
from this table; `build_table` rejects duplicate mnemonics or opcodes, fields that
do not fit in the word, syntax templates that do not name every operand exactly
once, and a row that is neither global nor has an `exec` clause.

An `exec` clause is a few Python statements in the subset numba compiles. It sees
its operands by name (register numbers and immediates as ints), the core's state
(`S` scalar registers, `V`/`VF`/`VI` vector registers as raw bits/f32/i32 with one
row of 1024 elements per register, `M` masks and `MR` their known rectangles, `VMEM`,
`SMEM` (and `VMEM16`, `VMEM32`, `SMEM32`: the same bytes as 16- and 32-bit words), the matrix units' `MXWU` weights (bf16 bits), `MXL`/`MXLU` staged LHS, `MXA`/`MXAU`
accumulators, `MXR` loaded weight rows (per unit, then its loaded columns), `SPEC` special registers, `MXD` the array
size, `n_ops` the kernel length), the helpers of `semantics.py`, and sets `nxt` to
jump or `err` (via `fault`) to stop with a fault. `{check}` marks where the race
check of its memory footprint goes when it is not simply first. In a timing-only run
(nothing computed) vector-side rows only take their cycles, and a row that reads data
back into a scalar takes the value its `readback` expression would give from a queue
the driver fills (the router's choices, recorded or synthetic).
"""

from __future__ import annotations

import re

import attrs

from mkemu.isa.encoding import (
    ACC, F32, FLAG, IMM32, MXU, OFF27, OPCODE_BITS, OPERAND_BITS, REG_M, REG_S,
    REG_V, SCOPE, SPACE, SPECIAL, TARGET, UIMM8, UIMM24, OperandKind,
)
from mkemu.isa.hardware import TIMING_CLASSES

UNITS = ("scalar", "vld", "vst", "valu", "xlu", "eup", "mxu", "mxu.w", "mxu.lhs", "dma", "sync", "meta")
# The operations global rows ask the machine for (it implements each once).
GLOBAL_KINDS = ("dma", "dma_remote", "signal", "signal_remote", "wait", "barrier", "halt")
# Matrix-unit state an instruction may read or write besides registers: per unit its
# weight tile, its staged LHS and each accumulator (scoreboard slots, see the emulator).
MXU_STATE = ("mxu.w", "mxu.lhs", "mxu.acc")
# Memory footprints: (space, "r" or "w", shape). "tile": 8 rows x 128 elements at
# S[sa] + off, S[stride] apart ("w" words or "bf16" halves); "span": the rows x cols
# bf16 weight tile of mxu.ldw; "mxspan" and "mxscale": the MXFP4 values (rows x cols/2
# bytes) and scales (one row of cols bytes per 32 rows, 2*stride apart) of mxu.ldw.mx;
# "word" / "dword": one or two SMEM words; "block": a DMA's strided block.
FOOTPRINTS = ("tile", "span", "mxspan", "mxscale", "word", "dword", "block")


@attrs.frozen
class Operand:
    name: str
    kind: OperandKind
    access: str  # "r" read, "w" written, "i" immediate / static field


@attrs.frozen
class Field:
    """Where an operand lives in the word: bits [shift, shift + kind.bits)."""

    operand: Operand
    shift: int

    @property
    def mask(self) -> int:
        return ((1 << self.operand.kind.bits) - 1) << self.shift


@attrs.frozen
class Instr:
    mnemonic: str
    opcode: int
    operands: tuple[Operand, ...]
    syntax: str            # e.g. "{vd}, {off}({sa}), {stride}, {mask}"
    unit: str
    timing: str | None     # None: costs no time (region markers)
    family: str            # what kind of operation, for docs and tests: "elementwise", ...
    types: tuple[str, ...] = ()    # element types of a vector op's inputs and output
    exec: str | None = None        # semantics for the compiled loop; None for global rows
    global_kind: str | None = None  # the machine operation of a global row
    reads: tuple[str, ...] = ()    # matrix-unit state read (MXU_STATE), "vd": its destination too
    writes: tuple[str, ...] = ()   # matrix-unit state written
    accumulates: bool = False      # writes its accumulator in issue order, without waiting for it
    memory: tuple[tuple[str, str, str], ...] = ()   # footprints: (space, "r"/"w", FOOTPRINTS)
    readback: str | None = None    # the value a `reads_back` row moves from data into a scalar
    elem_bytes: int = 4            # bytes per element of a "tile" footprint
    doc: str = ""
    fields: tuple[Field, ...] = ()

    @property
    def is_global(self) -> bool:
        return self.global_kind is not None

    @property
    def vector_side(self) -> bool:
        """Runs on the vector, cross-lane, transcendental or matrix units (or moves their
        tiles to and from VMEM): it computes data, not control."""
        return self.unit in ("vld", "vst", "valu", "xlu", "eup", "mxu", "mxu.w", "mxu.lhs")

    @property
    def reads_back(self) -> bool:
        """A vector-side row that writes a scalar register: data becomes control here."""
        return self.vector_side and any(op.kind is REG_S and op.access == "w" for op in self.operands)

    def operand(self, name: str) -> Operand:
        for op in self.operands:
            if op.name == name:
                return op
        raise KeyError(name)


# --- operand shorthands -------------------------------------------------------

def _s(name, access="r"):
    return Operand(name, REG_S, access)


def _v(name, access="r"):
    return Operand(name, REG_V, access)


def _m(name, access="r"):
    return Operand(name, REG_M, access)


def _i(name, kind):
    return Operand(name, kind, "i")


# --- exec clause builders -----------------------------------------------------

# An element of a register file: vector registers as raw bits, f32 or i32 (three views
# of the same bytes), or masks.
_ELEMENT = re.compile(r"\b(V|VF|VI|M)\[(\w+), i\]")
_FILE = {"V": "V", "VF": "V", "VI": "V", "M": "M"}
_DTYPE = {"V": "uint32", "VF": "float32", "VI": "int32", "M": "uint8"}


def _each(statement: str, commutes: bool = False) -> str:
    """`statement` (one line, or lines whose last stores the result) for every element i
    of a register: `X[vd, i] = f(Y[va, i], ...)`.

    LLVM vectorises such a loop only after a runtime check that the destination row
    does not overlap the source rows, which fails when the destination is also a
    source: the loop then runs one element at a time (5-7x slower). So where the first
    source may be the destination (`vadd.f32 v1, v1, v0`: how compiled kernels update
    a register in place) the loop has a second version for that case, spelled with the
    destination in its place: the same index loaded and stored, a same-iteration
    dependence only, which LLVM vectorises. Where the two sources may trade places
    (`commutes`: an integer or mask operation of two sources that gives the same bits
    either way) that version also serves `vd == vb`. The other coincidences (`vd == vb`
    of the rest, `vd == va == vb`) run the general loop: as correct and as slow as
    before. (Each version costs the issue loop's first compile about 0.2 s: with one
    for `vd == vb` too it took 4 s longer again.)"""
    lines = statement.splitlines()
    store = _ELEMENT.match(lines[-1])
    if store is None or not lines[-1][store.end():].lstrip().startswith("="):
        return _loop(lines)
    dview, dest = store.groups()
    file = _FILE[dview]
    loads = lines[:-1] + [lines[-1][store.end():]]
    sources = list(dict.fromkeys(reg for line in loads for view, reg in _ELEMENT.findall(line)
                                 if _FILE[view] == file))
    first = sources[0] if sources else dest
    if first == dest:
        return _loop(lines)
    if loads == [f" = {dview}[{first}, i]"]:       # a copy: nothing to do in place
        return f"if {dest} != {first}:\n" + _indent(_loop(lines))
    swap = commutes and len(sources) == 2
    other = f"{sources[1]}_other" if swap else None

    def spell(m):
        view, reg = m.groups()
        if _FILE[view] == file and reg == first:
            if view == dview:
                return f"{view}[{dest}, i]"
            # Through the destination's view: to LLVM two views are two arrays.
            return f"np.{_DTYPE[dview]}({dview}[{dest}, i]).view(np.{_DTYPE[view]})"
        if _FILE[view] == file and swap and reg == sources[1]:
            return f"{view}[{other}, i]"
        return m.group(0)
    inplace = [_ELEMENT.sub(spell, line) for line in loads]
    inplace[-1] = lines[-1][:store.end()] + inplace[-1]
    if swap:
        second = sources[1]
        head = [f"if {dest} == {first} or {dest} == {second}:",
                f"    {other} = {second} if {dest} == {first} else {first}"]
    else:
        head = [f"if {dest} == {first}:"]
    return "\n".join(head + [_indent(_loop(inplace)), "else:", _indent(_loop(lines))])


def _loop(lines: list[str]) -> str:
    return "for i in range(TILE):\n" + _indent("\n".join(lines))


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def _set_s(expr: str) -> str:
    """sd = expr, wrapped to int32; writes to s0 are dropped."""
    return f"if sd:\n    S[sd] = w32({expr})"


def _set_d(expr: str) -> str:
    """sd = expr on all 64 bits; writes to s0 are dropped."""
    return f"if sd:\n    S[sd] = {expr}"


def _set_mask(expr: str, commutes: bool = False) -> str:
    """md = expr per element (m0 is read-only); its rectangle becomes unknown."""
    each = _indent(_each(f"M[md, i] = {expr}", commutes))
    return f"if md:\n{each}\n    MR[md, 0] = -1\n    MR[md, 1] = -1"


def _jump(cond: str | None) -> str:
    body = ("if target >= n_ops:\n    err = fault(E, E_BRANCH, target, n_ops, 0, 0)\n"
            "else:\n    nxt = target")
    if cond is None:
        return body
    return f"if {cond}:\n" + "\n".join("    " + line for line in body.splitlines())


# Scalar ALU: name -> expression over a = S[sa] and b = S[sb] (or the immediate).
SCALAR_BINARY = {
    "add": "{a} + {b}", "sub": "{a} - {b}", "and": "{a} & {b}", "or": "{a} | {b}",
    "xor": "{a} ^ {b}", "shl": "{a} << ({b} & 31)", "shr": "({a} & 0xFFFFFFFF) >> ({b} & 31)",
    "sra": "{a} >> ({b} & 31)", "slt": "1 if {a} < {b} else 0", "sle": "1 if {a} <= {b} else 0",
    "seq": "1 if {a} == {b} else 0", "sne": "1 if {a} != {b} else 0",
    "min": "min({a}, {b})", "max": "max({a}, {b})",
}
SCALAR_MUL = {"mul": "{a} * {b}"}
SCALAR_DIV = {"div": "idiv({a}, {b})", "rem": "irem({a}, {b})"}
DIV_NOTE = "; the quotient truncates toward zero, the remainder takes the sign of sa; by zero faults"
BRANCHES = {"beq": "==", "bne": "!=", "blt": "<", "bge": ">="}

# Vector ALU: name -> per-element expression over a and b (in the view of the type).
VALU_F32 = {
    "add": "{a} + {b}", "sub": "{a} - {b}", "mul": "{a} * {b}", "div": "{a} / {b}",
    "max": "f32_max({a}, {b})", "min": "f32_min({a}, {b})",
}
VALU_I32 = {
    "add": "{a} + {b}", "sub": "{a} - {b}", "mul": "{a} * {b}",
    "and": "{a} & {b}", "or": "{a} | {b}", "xor": "{a} ^ {b}",
    "shl": "{a} << ({b} & 31)", "sra": "{a} >> ({b} & 31)",
    "max": "max({a}, {b})", "min": "min({a}, {b})",
}
I32_NOTES = {"and": "bitwise", "or": "bitwise", "xor": "bitwise", "max": "signed", "min": "signed",
             "shl": "shifted by vb & 31, int32 wrapping", "sra": "shifted right by vb & 31 keeping the sign"}
COMPARES = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
EUP = ("exp", "log", "exp2", "log2", "rcp", "rsqrt", "sqrt", "sigmoid", "tanh", "silu")
REDUCE_KINDS = ("sum", "max", "min")
VIEWS = {"f32": "VF", "i32": "VI", "u32": "V"}


# Integer operations whose operands may trade places (the same bits either way); not
# the float32 ones, whose result of two NaN operands is the first one's NaN.
COMMUTES = {"add", "mul", "and", "or", "xor", "max", "min"}


def _binary(ty: str, template: str, commutes: bool = False) -> str:
    view = VIEWS[ty]
    return _each(f"{view}[vd, i] = " + template.format(a=f"{view}[va, i]", b=f"{view}[vb, i]"), commutes)


def _declare() -> list[dict]:
    """All rows, in opcode order within each group."""
    rows: list[dict] = []

    def add(group, mnemonic, operands, syntax, unit, timing, family, **extra):
        rows.append(dict(group=group, mnemonic=mnemonic, operands=tuple(operands),
                         syntax=syntax, unit=unit, timing=timing, family=family, **extra))

    # -- scalar ------------------------------------------------------------------
    g = "scalar"
    add(g, "nop", [], "", "scalar", "scalar", "scalar", exec="pass",
        doc="Do nothing for one issue slot.")
    add(g, "li", [_s("sd", "w"), _i("imm", IMM32)], "{sd}, {imm}", "scalar", "scalar", "scalar",
        exec=_set_s("imm"), doc="sd = imm (a 32-bit constant, or the address of a symbol).")
    for name, expr in SCALAR_BINARY.items():
        add(g, name, [_s("sd", "w"), _s("sa"), _s("sb")], "{sd}, {sa}, {sb}", "scalar", "scalar",
            "scalar", exec=_set_s(expr.format(a="S[sa]", b="S[sb]")), doc=f"sd = sa {name} sb (int32).")
        add(g, name + "i", [_s("sd", "w"), _s("sa"), _i("imm", IMM32)], "{sd}, {sa}, {imm}",
            "scalar", "scalar", "scalar", exec=_set_s(expr.format(a="S[sa]", b="imm")),
            doc=f"sd = sa {name} imm (int32).")
    for table, timing in ((SCALAR_MUL, "scalar_mul"), (SCALAR_DIV, "scalar_div")):
        for name, expr in table.items():
            reg, imm = _set_s(expr.format(a="S[sa]", b="S[sb]")), _set_s(expr.format(a="S[sa]", b="imm"))
            if table is SCALAR_DIV:
                reg = "if S[sb] == 0:\n    err = fault(E, E_DIV_REG, sb, 0, 0, 0)\nelse:\n" + \
                    "\n".join("    " + line for line in reg.splitlines())
                imm = "if imm == 0:\n    err = fault(E, E_DIV_IMM, 0, 0, 0, 0)\nelse:\n" + \
                    "\n".join("    " + line for line in imm.splitlines())
            add(g, name, [_s("sd", "w"), _s("sa"), _s("sb")], "{sd}, {sa}, {sb}", "scalar", timing,
                "scalar", exec=reg, doc=f"sd = sa {name} sb (int32{DIV_NOTE if table is SCALAR_DIV else ' wrapping'}).")
            add(g, name + "i", [_s("sd", "w"), _s("sa"), _i("imm", IMM32)], "{sd}, {sa}, {imm}",
                "scalar", timing, "scalar", exec=imm,
                doc=f"sd = sa {name} imm (int32{DIV_NOTE if table is SCALAR_DIV else ' wrapping'}).")
    for name, op in BRANCHES.items():
        add(g, name, [_s("sa"), _s("sb"), _i("target", TARGET)], "{sa}, {sb}, {target}",
            "scalar", "branch", "branch", exec=_jump(f"S[sa] {op} S[sb]"),
            doc=f"if sa {name[1:]} sb: jump to target (an instruction index).")
    add(g, "jmp", [_i("target", TARGET)], "{target}", "scalar", "branch", "branch",
        exec=_jump(None), doc="Jump to target.")
    add(g, "lds", [_s("sd", "w"), _i("off", OFF27), _s("sa")], "{sd}, {off}({sa})",
        "scalar", "smem", "smem", memory=(("smem", "r", "word"),),
        exec="err = smem_addr_ok(SMEM, S[sa] + off, E)\nif err == 0 and sd:\n"
             "    S[sd] = smem_load(SMEM32, S[sa] + off)",
        doc="sd = SMEM word at byte address sa + off (4-aligned).")
    add(g, "sts", [_s("sb"), _i("off", OFF27), _s("sa")], "{sb}, {off}({sa})",
        "scalar", "smem", "smem", memory=(("smem", "w", "word"),),
        exec="err = smem_addr_ok(SMEM, S[sa] + off, E)\nif err == 0:\n"
             "    smem_store(SMEM32, S[sa] + off, S[sb])",
        doc="SMEM word at byte address sa + off = sb.")
    add(g, "rdsr", [_s("sd", "w"), _i("which", SPECIAL)], "{sd}, {which}", "scalar",
        "scalar", "scalar", exec=_set_s("SPEC[which]"),
        doc="sd = a special register: core (on its chip), chip, chip_x.., mesh_x.., cores (per chip), "
            "chips, gcore (chip * cores + core).")
    # 64-bit address arithmetic: a chip's HBM is larger than an int32 reaches.
    for name, expr in (("add", "{a} + {b}"), ("mul", "{a} * {b}"), ("shl", "{a} << ({b} & 63)")):
        timing = "scalar_mul" if name == "mul" else "scalar"
        if name == "add":
            add(g, "add.d", [_s("sd", "w"), _s("sa"), _s("sb")], "{sd}, {sa}, {sb}", "scalar", timing,
                "scalar", exec=_set_d(expr.format(a="S[sa]", b="S[sb]")),
                doc="sd = sa + sb on all 64 bits (addresses).")
        add(g, name + "i.d", [_s("sd", "w"), _s("sa"), _i("imm", IMM32)], "{sd}, {sa}, {imm}",
            "scalar", timing, "scalar", exec=_set_d(expr.format(a="S[sa]", b="imm")),
            doc=f"sd = sa {name} imm on all 64 bits (addresses).")
    add(g, "lui.d", [_s("sd", "w"), _i("imm", IMM32)], "{sd}, {imm}", "scalar", "scalar", "scalar",
        exec=_set_d("imm << 32"), doc="sd = imm << 32 (the high half of a 64-bit constant).")
    add(g, "lds.d", [_s("sd", "w"), _i("off", OFF27), _s("sa")], "{sd}, {off}({sa})",
        "scalar", "smem", "smem", memory=(("smem", "r", "dword"),),
        exec="err = smem_pair_ok(SMEM, S[sa] + off, E)\nif err == 0 and sd:\n"
             "    S[sd] = smem_load_d(SMEM32, S[sa] + off)",
        doc="sd = the 64-bit SMEM value at byte address sa + off (two words, low first; 4-aligned).")
    add(g, "sts.d", [_s("sb"), _i("off", OFF27), _s("sa")], "{sb}, {off}({sa})",
        "scalar", "smem", "smem", memory=(("smem", "w", "dword"),),
        exec="err = smem_pair_ok(SMEM, S[sa] + off, E)\nif err == 0:\n"
             "    smem_store_d(SMEM32, S[sa] + off, S[sb])",
        doc="The 64-bit SMEM value at byte address sa + off = sb (two words, low first).")

    # -- vector memory -----------------------------------------------------------
    g = "vmem"
    for ty, size, doc in (("w", 4, "32-bit words"), ("bf16", 2, "bf16 values widened exactly to f32")):
        add(g, f"vld.{ty}", [_v("vd", "w"), _i("off", OFF27), _s("sa"), _s("stride"), _m("mask")],
            "{vd}, {off}({sa}), {stride}, {mask}", "vld", "vld", "vmem",
            memory=(("vmem", "r", "tile"),), elem_bytes=size,
            exec=f"err = vload(VMEM, VMEM16, VMEM32, V, M, MR, vd, S[sa] + off, S[stride], mask, {size}, E)",
            doc=f"Load 8 rows of 128 {doc}: row r from VMEM byte address sa + off + r*stride. "
                "Masked-off elements read nothing and load 0.")
        add(g, f"vst.{ty}", [_v("va"), _i("off", OFF27), _s("sa"), _s("stride"), _m("mask")],
            "{va}, {off}({sa}), {stride}, {mask}", "vst", "vst", "vmem",
            memory=(("vmem", "w", "tile"),), elem_bytes=size,
            exec=f"err = vstore(VMEM, VMEM16, VMEM32, V, M, MR, va, S[sa] + off, S[stride], mask, {size}, E)",
            doc="Store 8 rows of 128 lanes" + (" as bf16, each f32 rounded to nearest even" if ty == "bf16" else
                                                " of 32-bit words") + " to VMEM byte address sa + off + r*stride; "
                "masked-off elements are not written.")

    # -- vector ALU --------------------------------------------------------------
    g = "valu"
    for name, template in VALU_F32.items():
        add(g, f"v{name}.f32", [_v("vd", "w"), _v("va"), _v("vb")], "{vd}, {va}, {vb}",
            "valu", "valu", "elementwise", exec=_binary("f32", template), types=("f32",) * 3,
            doc=f"vd = va {name} vb, IEEE binary32, round to nearest even." if name not in ("max", "min") else
                f"vd = {name}(va, vb) per element, exact (f32_{name}): {name}(+0, -0) = "
                f"{'+0' if name == 'max' else '-0'} in either order; NaN if either operand is NaN.")
    for name, template in VALU_I32.items():
        add(g, f"v{name}.i32", [_v("vd", "w"), _v("va"), _v("vb")], "{vd}, {va}, {vb}",
            "valu", "valu", "elementwise", exec=_binary("i32", template, name in COMMUTES), types=("i32",) * 3,
            doc=f"vd = va {name} vb per element, {I32_NOTES.get(name, 'int32 wrapping')}.")
        if name == "shl":
            # Logical right shift works on the raw bits.
            add(g, "vshr.i32", [_v("vd", "w"), _v("va"), _v("vb")], "{vd}, {va}, {vb}",
                "valu", "valu", "elementwise", exec=_each("V[vd, i] = V[va, i] >> (V[vb, i] & 31)"),
                types=("i32",) * 3,
                doc="vd = va shifted right by vb & 31, filling with zeros (logical).")
    add(g, "vabs.f32", [_v("vd", "w"), _v("va")], "{vd}, {va}", "valu", "valu", "elementwise",
        exec=_each("V[vd, i] = V[va, i] & 0x7FFFFFFF"), types=("f32", "f32"), doc="vd = |va|.")
    add(g, "vmov", [_v("vd", "w"), _v("va")], "{vd}, {va}", "valu", "valu", "elementwise",
        exec=_each("V[vd, i] = V[va, i]"), types=("u32", "u32"), doc="vd = va (raw bits).")
    add(g, "vbcast", [_v("vd", "w"), _s("sa")], "{vd}, {sa}", "valu", "valu", "broadcast",
        # (w32: a register may hold 64 bits; numba truncates on the store, plain Python raises)
        exec="low = w32(S[sa])\n" + _each("VI[vd, i] = low"), doc="Every lane of vd = the 32 bits of sa.")
    add(g, "vli.f32", [_v("vd", "w"), _i("imm", F32)], "{vd}, {imm}", "valu", "valu", "broadcast",
        exec=_each("V[vd, i] = imm & 0xFFFFFFFF"), doc="Every lane of vd = a float32 constant.")
    add(g, "vli.i32", [_v("vd", "w"), _i("imm", IMM32)], "{vd}, {imm}", "valu", "valu", "broadcast",
        exec=_each("V[vd, i] = imm & 0xFFFFFFFF"), doc="Every lane of vd = an int32 constant.")
    for name, op in COMPARES.items():
        for ty in ("f32", "i32"):
            view = VIEWS[ty]
            add(g, f"vcmp{name}.{ty}", [_m("md", "w"), _v("va"), _v("vb")], "{md}, {va}, {vb}",
                "valu", "valu", "compare", exec=_set_mask(f"{view}[va, i] {op} {view}[vb, i]"),
                types=(ty, ty, "mask"),
                doc=f"md = va {name} vb per element ({ty})" + ("; NaN compares unordered (only ne is true)."
                                                               if ty == "f32" else ", signed."))
    add(g, "vsel", [_v("vd", "w"), _m("mk"), _v("va"), _v("vb")], "{vd}, {mk}, {va}, {vb}",
        "valu", "valu", "select",
        # (both sources loaded, then one picked: a loop loading only one does not vectorise)
        exec=_each("sel_a = V[va, i]\nsel_b = V[vb, i]\nV[vd, i] = sel_a if M[mk, i] else sel_b"),
        doc="vd = mk ? va : vb per element (raw bits).")
    add(g, "mand", [_m("md", "w"), _m("ma"), _m("mb")], "{md}, {ma}, {mb}", "valu", "valu",
        "mask", exec=_set_mask("M[ma, i] & M[mb, i]", True), doc="md = ma and mb.")
    add(g, "mor", [_m("md", "w"), _m("ma"), _m("mb")], "{md}, {ma}, {mb}", "valu", "valu",
        "mask", exec=_set_mask("M[ma, i] | M[mb, i]", True), doc="md = ma or mb.")
    add(g, "mnot", [_m("md", "w"), _m("ma")], "{md}, {ma}", "valu", "valu", "mask",
        exec=_set_mask("1 - M[ma, i]"), doc="md = not ma.")
    add(g, "mrows", [_m("md", "w"), _s("sa"), _s("sb")], "{md}, {sa}, {sb}", "valu", "valu",
        "mask", exec="mask_rect(M, MR, md, S[sa], S[sb])",
        doc="md = elements with sublane < sa and lane < sb, the registers compared as signed 64-bit values (partial-tile masks; sa <= 0 or sb <= 0: none).")
    conversions = (
        ("vcvt.f32.i32", "VF[vd, i] = i32_to_f32(VI[va, i])", ("i32", "f32"), "int32 to nearest float32"),
        ("vcvt.i32.f32", "VI[vd, i] = f32_to_i32(VF[va, i])", ("f32", "i32"),
         "float32 to int32, truncating, saturating, NaN to 0"),
        ("vround.bf16", "V[vd, i] = bf16_round_bits(V[va, i])", ("f32", "f32"),
         "round to the nearest bf16 value, kept as f32"),
        ("vpack.bf16", "V[vd, i] = bf16_round_bits(V[va, i]) >> 16", ("f32", "u32"),
         "f32 to bf16 bits in the low half (nearest even)"),
        ("vunpack.bf16", "V[vd, i] = (V[va, i] & 0xFFFF) << 16", ("u32", "f32"),
         "bf16 bits in the low half to f32 (exact)"),
    )
    for name, statement, types, doc in conversions:
        add(g, name, [_v("vd", "w"), _v("va")], "{vd}, {va}", "valu", "vcvt", "elementwise",
            exec=_each(statement), types=types, doc=f"vd = {doc}.")
    add(g, "viota.lane", [_v("vd", "w")], "{vd}", "valu", "valu", "broadcast",
        exec=_each("VI[vd, i] = i % 128"), doc="vd = the lane index (int32) of each element.")
    add(g, "viota.sub", [_v("vd", "w")], "{vd}", "valu", "valu", "broadcast",
        exec=_each("VI[vd, i] = i // 128"), doc="vd = the sublane index (int32) of each element.")

    # -- cross-lane unit ---------------------------------------------------------
    g = "xlu"
    for ty in ("f32", "i32"):
        for kind, name in enumerate(REDUCE_KINDS):
            for axis, axis_name in ((1, "lane"), (0, "sub")):
                add(g, f"vred{name}.{axis_name}.{ty}", [_v("vd", "w"), _v("va")], "{vd}, {va}",
                    "xlu", "xlu", "reduce", exec=f"reduce_{ty}({VIEWS[ty]}, vd, va, {axis}, {kind})",
                    types=(ty, ty),
                    doc=f"Reduce va with {name} across {axis_name}s in the fixed tree order of "
                        "the numeric contract; the result is broadcast along that axis.")
    add(g, "vbcast.lane", [_v("vd", "w"), _v("va"), _i("idx", UIMM8)], "{vd}, {va}, {idx}",
        "xlu", "xlu", "permute", exec="err = bcast_index(V, vd, va, idx, 1, E)",
        doc="vd[s, l] = va[s, idx].")
    add(g, "vbcast.sub", [_v("vd", "w"), _v("va"), _i("idx", UIMM8)], "{vd}, {va}, {idx}",
        "xlu", "xlu", "permute", exec="err = bcast_index(V, vd, va, idx, 0, E)",
        doc="vd[s, l] = va[idx, l].")
    add(g, "vrot.lane", [_v("vd", "w"), _v("va"), _i("amount", UIMM8)], "{vd}, {va}, {amount}",
        "xlu", "xlu", "permute", exec="rotate(V, vd, va, amount, 1)",
        doc="vd[s, l] = va[s, (l - amount) mod 128].")
    add(g, "vrot.sub", [_v("vd", "w"), _v("va"), _i("amount", UIMM8)], "{vd}, {va}, {amount}",
        "xlu", "xlu", "permute", exec="rotate(V, vd, va, amount, 0)",
        doc="vd[s, l] = va[(s - amount) mod 8, l].")
    add(g, "vcol", [_v("vd", "w"), _v("va"), _i("block", UIMM8)], "{vd}, {va}, {block}",
        "xlu", "xlu", "permute", exec="err = column(V, vd, va, block, E)",
        doc="vd[s, l] = va[0, 8*block + s]: 8 lanes of sublane 0 become a "
            "column, broadcast across lanes (a row vector to column form).")
    add(g, "vextract", [_s("sd", "w"), _v("va"), _s("sb")], "{sd}, {va}, {sb}", "xlu",
        "vextract", "element", exec="err = element_ok(S[sb], E)\nif err == 0 and sd:\n"
                                    "    S[sd] = VI[va, S[sb]]", readback="VI[va, S[sb]]",
        doc="sd = the 32 bits of element sb (= sublane*128 + lane) of va.")
    add(g, "vinsert", [_v("vd", "w"), _s("sa"), _s("sb")], "{vd}, {sa}, {sb}", "xlu",
        "vextract", "element", reads=("vd",),
        exec="err = element_ok(S[sb], E)\nif err == 0:\n    VI[vd, S[sb]] = w32(S[sa])",
        doc="Element sb (= sublane*128 + lane) of vd = the 32 bits of sa.")

    # -- transcendentals ---------------------------------------------------------
    g = "eup"
    for name in EUP:
        add(g, f"v{name}.f32", [_v("vd", "w"), _v("va")], "{vd}, {va}", "eup", "eup", "elementwise",
            exec=f"{name}_row(VF, vd, va)", types=("f32", "f32"),
            doc=f"vd = {name}(va), the contract's algorithm.")

    # -- matrix unit -------------------------------------------------------------
    g = "mxu"
    ldw = ("rows, cols = wtile_shape(S[shape], MXD, E)\nif rows == 0:\n    err = E[0]\nelse:\n"
           "    {{check}}\n    if err == 0:\n"
           "        err = load_weights(VMEM, VMEM16, MXWU, MXR, x, S[sa] + off, S[stride], rows, cols, {t}, E)")
    add(g, "mxu.ldw", [_i("x", MXU), _i("off", OFF27), _s("sa"), _s("stride"), _s("shape")],
        "{x}, {off}({sa}), {stride}, {shape}", "mxu.w", "mxu_ldw", "matrix", writes=("mxu.w",),
        memory=(("vmem", "r", "span"),), exec=ldw.format(t=0),
        doc="Load the weight tile: rows k < shape>>16 of shape&0xffff bf16 values from VMEM "
            "byte address sa + off + k*stride; the rest of the D x D tile is zero.")
    add(g, "mxu.ldwt", [_i("x", MXU), _i("off", OFF27), _s("sa"), _s("stride"), _s("shape")],
        "{x}, {off}({sa}), {stride}, {shape}", "mxu.w", "mxu_ldw", "matrix", writes=("mxu.w",),
        memory=(("vmem", "r", "span"),), exec=ldw.format(t=1),
        doc="Load the transposed weight tile: memory row j (of shape>>16 rows, shape&0xffff "
            "bf16 values each) becomes weight column j; loaded rows k < shape&0xffff.")
    add(g, "mxu.push", [_i("x", MXU), _v("va"), _i("chunk", UIMM8)], "{x}, {va}, {chunk}",
        "mxu.lhs", "mxu_push", "matrix", writes=("mxu.lhs",), exec="push_lhs(V, MXLU, x, va, chunk)",
        doc="Stage va (rounded to bf16) as LHS columns chunk*128 .. chunk*128+127.")
    add(g, "mxu.mac", [_i("x", MXU), _i("acc", ACC), _i("zero", FLAG)], "{x}, {acc}, {zero}",
        "mxu", "mxu_mac", "matrix", reads=("mxu.w", "mxu.lhs"), writes=("mxu.acc",), accumulates=True,
        exec="err = mac(MXWU, MXL, MXA, MXR, x, acc, zero, E)",
        doc="acc = (zero ? 0 : acc) + LHS @ W, products of bf16 accumulated in f32 in "
            "increasing k over the tile's loaded rows.")
    add(g, "mxu.pop", [_v("vd", "w"), _i("x", MXU), _i("acc", ACC), _i("chunk", UIMM8)],
        "{vd}, {x}, {acc}, {chunk}", "mxu", "mxu_pop", "matrix", reads=("mxu.acc",),
        exec="pop_acc(V, MXAU, vd, x, acc, chunk)",
        doc="vd = accumulator columns chunk*128 .. chunk*128+127 (f32).")
    add(g, "mxu.ldw.mx", [_i("x", MXU), _i("off", OFF27), _s("sa"), _s("stride"), _s("shape"), _s("sc")],
        "{x}, {off}({sa}), {stride}, {shape}, {sc}", "mxu.w", "mxu_ldw", "matrix", writes=("mxu.w",),
        memory=(("vmem", "r", "mxspan"), ("vmem", "r", "mxscale")),
        exec="rows, cols = wtile_shape(S[shape], MXD, E)\nif rows == 0:\n    err = E[0]\nelse:\n"
             "    {check}\n    if err == 0:\n"
             "        err = load_weights_mx(VMEM, MXWU, MXR, x, S[sa] + off, S[stride], S[sc], rows, cols, E)",
        doc="Load the weight tile from MXFP4: row k < shape>>16 holds shape&0xffff 4-bit e2m1 "
            "values, two per byte (even column in the low half), at VMEM byte address sa + off + "
            "k*stride; the e8m0 scale of (k, n) is the byte at sc + (k>>5)*2*stride + n. Weight "
            "(k, n) = e2m1 * 2^(scale-127), exact in bf16; the rest of the tile is zero.")

    # -- DMA and synchronisation -------------------------------------------------
    g = "dma"
    dma_ops = [_i("dsp", SPACE), _s("dst"), _i("ssp", SPACE), _s("src"), _s("desc"), _s("sem")]
    add(g, "dma.start", dma_ops, "{dsp}[{dst}], {ssp}[{src}], {desc}, {sem}", "dma",
        "dma_issue", "dma", global_kind="dma", memory=(("any", "r", "block"), ("any", "w", "block")),
        doc="Start an async copy; the shape is the 7-word SMEM descriptor at desc "
            "(inner_bytes, n1, src_stride1, dst_stride1, n2, src_stride2, dst_stride2); "
            "semaphore sem gains the byte count on completion.")
    add(g, "dma.start.r", dma_ops[:2] + [_s("tgt")] + dma_ops[2:] + [_s("rsem")],
        "{dsp}[{dst}]@{tgt}, {ssp}[{src}], {desc}, {sem}, {rsem}", "dma", "dma_issue", "dma",
        global_kind="dma_remote", memory=(("any", "r", "block"), ("any", "w", "block")),
        doc="Push to global core tgt: read local, write remote; local sem counts bytes sent, "
            "the target's rsem counts bytes received.")
    g = "sync"
    add(g, "sem.signal", [_s("sem"), _s("val")], "{sem}, {val}", "sync", "sync", "sync",
        global_kind="signal", doc="Semaphore sem += val (val < 0 faults: bad-operand); so does a count past 2^63 - 1.")
    add(g, "sem.signal.r", [_s("sem"), _s("val"), _s("tgt")], "{sem}, {val}, {tgt}", "sync",
        "sync", "sync", global_kind="signal_remote", doc="Semaphore sem of global core tgt += val (val < 0 faults: bad-operand); so does a count past 2^63 - 1, on arrival.")
    add(g, "sem.wait", [_s("sem"), _s("val")], "{sem}, {val}", "sync", "sync", "sync",
        global_kind="wait", doc="Block until semaphore sem >= val, then sem -= val (val < 0 faults: bad-operand).")
    add(g, "barrier", [_i("scope", SCOPE)], "{scope}", "sync", "sync", "sync", global_kind="barrier",
        doc="Block until every core in scope (chip, all, or the x/y/z line) has arrived.")
    add(g, "halt", [], "", "sync", "sync", "sync", global_kind="halt", doc="Stop this core.")
    add(g, "mark.push", [_i("region", UIMM24), _s("sa")], "{region}, {sa}", "meta", None, "region",
        exec="err = region_enter(RSTACK, I, region, S[sa], issue, pc, E)",
        doc="Enter source region `region` with dynamic index sa (free).")
    add(g, "mark.pop", [], "", "meta", None, "region",
        exec="err = region_leave(RSTACK, RSTAT, TRR, I, issue, E)",
        doc="Leave the innermost region (free).")
    return rows


GROUP_BASE = {"scalar": 0x000, "vmem": 0x060, "valu": 0x070, "xlu": 0x0D0, "eup": 0x0F0,
              "mxu": 0x100, "dma": 0x110, "sync": 0x118}
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def build_table(rows: list[dict]) -> dict[str, Instr]:
    """Assign opcodes and field positions; reject anything ambiguous or too big."""
    table: dict[str, Instr] = {}
    by_opcode: dict[int, str] = {}
    groups = list(GROUP_BASE)
    next_opcode = dict(GROUP_BASE)
    for row in rows:
        group = row.pop("group")
        mnemonic = row["mnemonic"]
        if mnemonic in table:
            raise ValueError(f"instruction {mnemonic!r} declared twice")
        opcode = next_opcode[group]
        next_opcode[group] += 1
        later = [GROUP_BASE[g] for g in groups[groups.index(group) + 1:]]
        if later and opcode >= min(later):
            raise ValueError(f"group {group!r} overflows into the next at {mnemonic!r}")
        if opcode >= 1 << OPCODE_BITS:
            raise ValueError(f"opcode {opcode} of {mnemonic!r} does not fit {OPCODE_BITS} bits")
        if opcode in by_opcode:
            raise ValueError(f"{mnemonic!r} and {by_opcode[opcode]!r} share opcode {opcode}")
        by_opcode[opcode] = mnemonic
        if row["unit"] not in UNITS:
            raise ValueError(f"{mnemonic!r}: unknown unit {row['unit']!r}")
        if row["timing"] is not None and row["timing"] not in TIMING_CLASSES:
            raise ValueError(f"{mnemonic!r}: unknown timing class {row['timing']!r}")
        if (row.get("exec") is None) == (row.get("global_kind") is None):
            raise ValueError(f"{mnemonic!r} must have exactly one of an exec clause and a global kind")
        if row.get("global_kind") not in (None, *GLOBAL_KINDS):
            raise ValueError(f"{mnemonic!r}: unknown global kind {row['global_kind']!r}")
        for state in row.get("reads", ()) + row.get("writes", ()):
            if state not in (*MXU_STATE, "vd"):
                raise ValueError(f"{mnemonic!r}: unknown state {state!r} in its access sets")
        for space, access, shape in row.get("memory", ()):
            # (a local row touches its core's own memories; a DMA's ends are any space)
            spaces = ("any",) if row.get("global_kind") else ("vmem", "smem")
            if access not in ("r", "w") or shape not in FOOTPRINTS or space not in spaces:
                raise ValueError(f"{mnemonic!r}: bad memory footprint {(space, access, shape)} (a "
                                 f"{'global' if row.get('global_kind') else 'local'} row's spaces: "
                                 f"{', '.join(spaces)})")
        names = _PLACEHOLDER.findall(row["syntax"])
        declared = [op.name for op in row["operands"]]
        if sorted(names) != sorted(declared) or len(set(declared)) != len(declared):
            raise ValueError(f"{mnemonic!r}: syntax {row['syntax']!r} must name operands {declared} once each")
        fields, shift, used = [], OPERAND_BITS, 0
        for op in row["operands"]:
            shift -= op.kind.bits
            if shift < 0:
                raise ValueError(f"{mnemonic!r}: operands need more than {OPERAND_BITS} bits")
            field = Field(op, shift)
            if used & field.mask:
                raise ValueError(f"{mnemonic!r}: field {op.name} overlaps another")
            used |= field.mask
            fields.append(field)
        table[mnemonic] = Instr(opcode=opcode, fields=tuple(fields), **row)
    return table


TABLE: dict[str, Instr] = build_table(_declare())
BY_OPCODE: dict[int, Instr] = {ins.opcode: ins for ins in TABLE.values()}
