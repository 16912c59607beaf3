"""The instruction table: every instruction of the ISA declared once.

A row gives the mnemonic, the operands (name, kind, read or written), the assembly
syntax template, the functional unit, the timing class and the semantics. The
assembler, disassembler, compiler back end and the emulator's decoder are all
derived from this table; `build_table` rejects duplicate mnemonics or opcodes,
fields that do not fit in the word, and syntax templates that do not name every
operand exactly once.

Semantics come in two forms. Pure computations carry a function: scalar ALU rows
take and return Python ints (the emulator wraps results to int32), vector rows
take and return numpy arrays of the declared element types. Rows that touch
memory, control flow or other cores name an `effect` that the emulator
implements once for the whole family (e.g. every `vld.*` is the effect "vld"
with its element type as a parameter).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable

import attrs
import numpy as np

from mkemu.isa import numerics as nx
from mkemu.isa.encoding import (
    ACC, F32, FLAG, IMM32, MXU, OFF27, OPCODE_BITS, OPERAND_BITS, REG_M, REG_S,
    REG_V, SCOPE, SPACE, SPECIAL, TARGET, UIMM8, UIMM24, OperandKind,
)
from mkemu.isa.hardware import TIMING_CLASSES

UNITS = ("scalar", "vld", "vst", "valu", "xlu", "eup", "mxu", "dma", "sync", "meta")


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
    effect: str            # how the emulator executes it: "salu", "valu", "vld", ...
    fn: Callable | None = None
    types: tuple[str, ...] = ()   # element types of a vector op's inputs and output
    param: object = None          # effect parameter (element type, reduce kind, ...)
    doc: str = ""
    fields: tuple[Field, ...] = ()

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


# --- scalar semantics (Python ints in, Python int out; wrapped by the emulator) --

def _shl(a, b):
    return a << (b & 31)


def _shr(a, b):
    return (a & 0xFFFFFFFF) >> (b & 31)


def _sra(a, b):
    return a >> (b & 31)


SCALAR_BINARY = {
    "add": operator.add, "sub": operator.sub, "and": operator.and_,
    "or": operator.or_, "xor": operator.xor, "shl": _shl, "shr": _shr, "sra": _sra,
    "slt": lambda a, b: int(a < b), "sle": lambda a, b: int(a <= b),
    "seq": lambda a, b: int(a == b), "sne": lambda a, b: int(a != b),
    "min": min, "max": max,
}
def _div(a, b):
    """Truncating division (C semantics); the emulator faults on b == 0 first."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _rem(a, b):
    return a - b * _div(a, b)


SCALAR_MUL = {"mul": operator.mul}
SCALAR_DIV = {"div": _div, "rem": _rem}

BRANCHES = {
    "beq": operator.eq, "bne": operator.ne, "blt": operator.lt, "bge": operator.ge,
}

# --- vector semantics ---------------------------------------------------------

def _v_shl(a, b):
    return np.left_shift(a, b & 31)


def _v_shr(a, b):
    return np.right_shift(a.view(np.uint32), (b & 31).view(np.uint32)).view(np.int32)


def _v_sra(a, b):
    return np.right_shift(a, b & 31)


def _tree_i32(combine):
    """An int32 reduction along `axis` (axis removed, like `numerics.tree_sum_f32`)."""
    def reduce(x, axis):
        while x.shape[axis] > 1:
            half = x.shape[axis] // 2
            lo, hi = np.split(x, [half], axis=axis)
            x = combine(lo, hi)
        return np.squeeze(x, axis)
    return reduce


def _pack_bf16(a):
    return nx.f32_to_bf16_bits(a).astype(np.uint32)


def _unpack_bf16(a):
    return nx.bf16_bits_to_f32((a & 0xFFFF).astype(np.uint16))


VALU_F32 = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "max": nx.f32_max, "min": nx.f32_min,
}
VALU_I32 = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
    "shl": _v_shl, "shr": _v_shr, "sra": _v_sra,
    "max": np.maximum, "min": np.minimum,
}
COMPARES = {
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
}
EUP = {
    "exp": nx.exp, "log": nx.log, "exp2": nx.exp2, "log2": nx.log2,
    "rcp": nx.reciprocal, "rsqrt": nx.rsqrt, "sqrt": nx.sqrt,
    "sigmoid": nx.sigmoid, "tanh": nx.tanh, "silu": nx.silu,
}
REDUCE_F32 = {"sum": nx.tree_sum_f32, "max": nx.tree_max_f32, "min": nx.tree_min_f32}
REDUCE_I32 = {"sum": _tree_i32(np.add), "max": _tree_i32(np.maximum),
              "min": _tree_i32(np.minimum)}


def _declare() -> list[dict]:
    """All rows, in opcode order within each group."""
    rows: list[dict] = []

    def add(group, mnemonic, operands, syntax, unit, timing, effect, **extra):
        rows.append(dict(group=group, mnemonic=mnemonic, operands=tuple(operands),
                         syntax=syntax, unit=unit, timing=timing, effect=effect, **extra))

    # -- scalar ------------------------------------------------------------------
    g = "scalar"
    add(g, "nop", [], "", "scalar", "scalar", "nop", doc="Do nothing for one issue slot.")
    add(g, "li", [_s("sd", "w"), _i("imm", IMM32)], "{sd}, {imm}", "scalar", "scalar",
        "li", doc="sd = imm (a 32-bit constant, or the address of a symbol).")
    for name, fn in SCALAR_BINARY.items():
        add(g, name, [_s("sd", "w"), _s("sa"), _s("sb")], "{sd}, {sa}, {sb}",
            "scalar", "scalar", "salu", fn=fn, doc=f"sd = sa {name} sb (int32).")
        add(g, name + "i", [_s("sd", "w"), _s("sa"), _i("imm", IMM32)],
            "{sd}, {sa}, {imm}", "scalar", "scalar", "salui", fn=fn,
            doc=f"sd = sa {name} imm (int32).")
    for table, timing in ((SCALAR_MUL, "scalar_mul"), (SCALAR_DIV, "scalar_div")):
        for name, fn in table.items():
            add(g, name, [_s("sd", "w"), _s("sa"), _s("sb")], "{sd}, {sa}, {sb}",
                "scalar", timing, "salu", fn=fn, param=name,
                doc=f"sd = sa {name} sb (int32; division truncates, by zero faults).")
            add(g, name + "i", [_s("sd", "w"), _s("sa"), _i("imm", IMM32)],
                "{sd}, {sa}, {imm}", "scalar", timing, "salui", fn=fn, param=name,
                doc=f"sd = sa {name} imm (int32).")
    for name, fn in BRANCHES.items():
        add(g, name, [_s("sa"), _s("sb"), _i("target", TARGET)], "{sa}, {sb}, {target}",
            "scalar", "branch", "branch", fn=fn,
            doc=f"if sa {name[1:]} sb: jump to target (an instruction index).")
    add(g, "jmp", [_i("target", TARGET)], "{target}", "scalar", "branch", "jump",
        doc="Jump to target.")
    add(g, "lds", [_s("sd", "w"), _i("off", OFF27), _s("sa")], "{sd}, {off}({sa})",
        "scalar", "smem", "lds", doc="sd = SMEM word at byte address sa + off (4-aligned).")
    add(g, "sts", [_s("sb"), _i("off", OFF27), _s("sa")], "{sb}, {off}({sa})",
        "scalar", "smem", "sts", doc="SMEM word at byte address sa + off = sb.")
    add(g, "rdsr", [_s("sd", "w"), _i("which", SPECIAL)], "{sd}, {which}", "scalar",
        "scalar", "rdsr", doc="sd = a special register: core, chip, chip_x.., mesh_x.., cores, chips, gcore.")

    # -- vector memory -----------------------------------------------------------
    g = "vmem"
    for ty, doc in (("w", "32-bit words"), ("bf16", "bf16 values widened exactly to f32")):
        add(g, f"vld.{ty}", [_v("vd", "w"), _i("off", OFF27), _s("sa"), _s("stride"), _m("mask")],
            "{vd}, {off}({sa}), {stride}, {mask}", "vld", "vld", "vld", param=ty,
            doc=f"Load 8 rows of 128 {doc}: row r from VMEM byte address sa + off + r*stride. "
                "Masked-off elements read nothing and load 0.")
        add(g, f"vst.{ty}", [_v("va"), _i("off", OFF27), _s("sa"), _s("stride"), _m("mask")],
            "{va}, {off}({sa}), {stride}, {mask}", "vst", "vst", "vst", param=ty,
            doc="Store 8 rows of 128 lanes (bf16: rounded to nearest even); masked-off elements are not written.")

    # -- vector ALU --------------------------------------------------------------
    g = "valu"
    for name, fn in VALU_F32.items():
        add(g, f"v{name}.f32", [_v("vd", "w"), _v("va"), _v("vb")], "{vd}, {va}, {vb}",
            "valu", "valu", "valu", fn=fn, types=("f32", "f32", "f32"),
            doc=f"vd = va {name} vb, IEEE binary32, round to nearest even.")
    for name, fn in VALU_I32.items():
        add(g, f"v{name}.i32", [_v("vd", "w"), _v("va"), _v("vb")], "{vd}, {va}, {vb}",
            "valu", "valu", "valu", fn=fn, types=("i32", "i32", "i32"),
            doc=f"vd = va {name} vb, int32 wrapping.")
    add(g, "vabs.f32", [_v("vd", "w"), _v("va")], "{vd}, {va}", "valu", "valu", "valu",
        fn=np.abs, types=("f32", "f32"), doc="vd = |va|.")
    add(g, "vmov", [_v("vd", "w"), _v("va")], "{vd}, {va}", "valu", "valu", "valu",
        fn=np.copy, types=("u32", "u32"), doc="vd = va (raw bits).")
    add(g, "vbcast", [_v("vd", "w"), _s("sa")], "{vd}, {sa}", "valu", "valu", "vbcast",
        doc="Every lane of vd = the 32 bits of sa.")
    add(g, "vli.f32", [_v("vd", "w"), _i("imm", F32)], "{vd}, {imm}", "valu", "valu", "vli",
        doc="Every lane of vd = a float32 constant.")
    add(g, "vli.i32", [_v("vd", "w"), _i("imm", IMM32)], "{vd}, {imm}", "valu", "valu", "vli",
        doc="Every lane of vd = an int32 constant.")
    for name, fn in COMPARES.items():
        for ty in ("f32", "i32"):
            add(g, f"vcmp{name}.{ty}", [_m("md", "w"), _v("va"), _v("vb")], "{md}, {va}, {vb}",
                "valu", "valu", "vcmp", fn=fn, types=(ty, ty, "mask"),
                doc=f"md = va {name} vb per element ({ty}); NaN compares unordered.")
    add(g, "vsel", [_v("vd", "w"), _m("mk"), _v("va"), _v("vb")], "{vd}, {mk}, {va}, {vb}",
        "valu", "valu", "vsel", doc="vd = mk ? va : vb per element (raw bits).")
    add(g, "mand", [_m("md", "w"), _m("ma"), _m("mb")], "{md}, {ma}, {mb}", "valu", "valu",
        "mlogic", fn=np.logical_and, doc="md = ma and mb.")
    add(g, "mor", [_m("md", "w"), _m("ma"), _m("mb")], "{md}, {ma}, {mb}", "valu", "valu",
        "mlogic", fn=np.logical_or, doc="md = ma or mb.")
    add(g, "mnot", [_m("md", "w"), _m("ma")], "{md}, {ma}", "valu", "valu", "mlogic",
        fn=np.logical_not, doc="md = not ma.")
    add(g, "mrows", [_m("md", "w"), _s("sa"), _s("sb")], "{md}, {sa}, {sb}", "valu", "valu",
        "mrows", doc="md = elements with sublane < sa and lane < sb (partial-tile masks).")
    conversions = (
        ("vcvt.f32.i32", nx.i32_to_f32, ("i32", "f32"), "int32 to nearest float32"),
        ("vcvt.i32.f32", nx.f32_to_i32, ("f32", "i32"), "float32 to int32, truncating, saturating, NaN to 0"),
        ("vround.bf16", nx.bf16_round, ("f32", "f32"), "round to the nearest bf16 value, kept as f32"),
        ("vpack.bf16", _pack_bf16, ("f32", "u32"), "f32 to bf16 bits in the low half (nearest even)"),
        ("vunpack.bf16", _unpack_bf16, ("u32", "f32"), "bf16 bits in the low half to f32 (exact)"),
    )
    for name, fn, types, doc in conversions:
        add(g, name, [_v("vd", "w"), _v("va")], "{vd}, {va}", "valu", "vcvt", "valu",
            fn=fn, types=types, doc=f"vd = {doc}.")
    add(g, "viota.lane", [_v("vd", "w")], "{vd}", "valu", "valu", "viota", param=1,
        doc="vd = the lane index (int32) of each element.")
    add(g, "viota.sub", [_v("vd", "w")], "{vd}", "valu", "valu", "viota", param=0,
        doc="vd = the sublane index (int32) of each element.")

    # -- cross-lane unit ---------------------------------------------------------
    g = "xlu"
    for ty, table in (("f32", REDUCE_F32), ("i32", REDUCE_I32)):
        for name, fn in table.items():
            for axis, axis_name in ((1, "lane"), (0, "sub")):
                add(g, f"vred{name}.{axis_name}.{ty}", [_v("vd", "w"), _v("va")], "{vd}, {va}",
                    "xlu", "xlu", "vreduce", fn=fn, types=(ty, ty), param=axis,
                    doc=f"Reduce va with {name} across {axis_name}s in the fixed tree order of "
                        "the numeric contract; the result is broadcast along that axis.")
    add(g, "vbcast.lane", [_v("vd", "w"), _v("va"), _i("idx", UIMM8)], "{vd}, {va}, {idx}",
        "xlu", "xlu", "vbcastidx", param=1, doc="vd[s, l] = va[s, idx].")
    add(g, "vbcast.sub", [_v("vd", "w"), _v("va"), _i("idx", UIMM8)], "{vd}, {va}, {idx}",
        "xlu", "xlu", "vbcastidx", param=0, doc="vd[s, l] = va[idx, l].")
    add(g, "vrot.lane", [_v("vd", "w"), _v("va"), _i("amount", UIMM8)], "{vd}, {va}, {amount}",
        "xlu", "xlu", "vrot", param=1, doc="vd[s, l] = va[s, (l - amount) mod 128].")
    add(g, "vrot.sub", [_v("vd", "w"), _v("va"), _i("amount", UIMM8)], "{vd}, {va}, {amount}",
        "xlu", "xlu", "vrot", param=0, doc="vd[s, l] = va[(s - amount) mod 8, l].")
    add(g, "vcol", [_v("vd", "w"), _v("va"), _i("block", UIMM8)], "{vd}, {va}, {block}",
        "xlu", "xlu", "vcol", doc="vd[s, l] = va[0, 8*block + s]: 8 lanes of sublane 0 become a "
                                  "column, broadcast across lanes (a row vector to column form).")
    add(g, "vextract", [_s("sd", "w"), _v("va"), _s("sb")], "{sd}, {va}, {sb}", "xlu",
        "vextract", "vextract", doc="sd = the 32 bits of element sb (= sublane*128 + lane) of va.")
    add(g, "vinsert", [_v("vd", "w"), _s("sa"), _s("sb")], "{vd}, {sa}, {sb}", "xlu",
        "vextract", "vinsert", doc="Element sb (= sublane*128 + lane) of vd = the 32 bits of sa.")

    # -- transcendentals ---------------------------------------------------------
    g = "eup"
    for name, fn in EUP.items():
        add(g, f"v{name}.f32", [_v("vd", "w"), _v("va")], "{vd}, {va}", "eup", "eup", "valu",
            fn=fn, types=("f32", "f32"), doc=f"vd = {name}(va), the contract's algorithm.")

    # -- matrix unit -------------------------------------------------------------
    g = "mxu"
    add(g, "mxu.ldw", [_i("x", MXU), _i("off", OFF27), _s("sa"), _s("stride"), _s("shape")],
        "{x}, {off}({sa}), {stride}, {shape}", "mxu", "mxu_ldw", "mxu_ldw",
        doc="Load the weight tile: rows k < shape>>16 of shape&0xffff bf16 values from VMEM "
            "byte address sa + off + k*stride; the rest of the D x D tile is zero.")
    add(g, "mxu.ldwt", [_i("x", MXU), _i("off", OFF27), _s("sa"), _s("stride"), _s("shape")],
        "{x}, {off}({sa}), {stride}, {shape}", "mxu", "mxu_ldw", "mxu_ldw", param="t",
        doc="Load the transposed weight tile: memory row j (of shape>>16 rows, shape&0xffff "
            "bf16 values each) becomes weight column j; loaded rows k < shape&0xffff.")
    add(g, "mxu.push", [_i("x", MXU), _v("va"), _i("chunk", UIMM8)], "{x}, {va}, {chunk}",
        "mxu", "mxu_push", "mxu_push",
        doc="Stage va (rounded to bf16) as LHS columns chunk*128 .. chunk*128+127.")
    add(g, "mxu.mac", [_i("x", MXU), _i("acc", ACC), _i("zero", FLAG)], "{x}, {acc}, {zero}",
        "mxu", "mxu_mac", "mxu_mac",
        doc="acc = (zero ? 0 : acc) + LHS @ W, products of bf16 accumulated in f32 in "
            "increasing k over the tile's loaded rows.")
    add(g, "mxu.pop", [_v("vd", "w"), _i("x", MXU), _i("acc", ACC), _i("chunk", UIMM8)],
        "{vd}, {x}, {acc}, {chunk}", "mxu", "mxu_pop", "mxu_pop",
        doc="vd = accumulator columns chunk*128 .. chunk*128+127 (f32).")

    # -- DMA and synchronisation -------------------------------------------------
    g = "dma"
    dma_ops = [_i("dsp", SPACE), _s("dst"), _i("ssp", SPACE), _s("src"), _s("desc"), _s("sem")]
    add(g, "dma.start", dma_ops, "{dsp}[{dst}], {ssp}[{src}], {desc}, {sem}", "dma",
        "dma_issue", "dma",
        doc="Start an async copy; the shape is the 7-word SMEM descriptor at desc "
            "(inner_bytes, n1, src_stride1, dst_stride1, n2, src_stride2, dst_stride2); "
            "semaphore sem gains the byte count on completion.")
    add(g, "dma.start.r", dma_ops[:2] + [_s("tgt")] + dma_ops[2:] + [_s("rsem")],
        "{dsp}[{dst}]@{tgt}, {ssp}[{src}], {desc}, {sem}, {rsem}", "dma", "dma_issue", "dma_remote",
        doc="Push to global core tgt: read local, write remote; local sem counts bytes sent, "
            "the target's rsem counts bytes received.")
    g = "sync"
    add(g, "sem.signal", [_s("sem"), _s("val")], "{sem}, {val}", "sync", "sync", "signal",
        doc="Semaphore sem += val.")
    add(g, "sem.signal.r", [_s("sem"), _s("val"), _s("tgt")], "{sem}, {val}, {tgt}", "sync",
        "sync", "signal_remote", doc="Semaphore sem of global core tgt += val.")
    add(g, "sem.wait", [_s("sem"), _s("val")], "{sem}, {val}", "sync", "sync", "wait",
        doc="Block until semaphore sem >= val, then sem -= val.")
    add(g, "barrier", [_i("scope", SCOPE)], "{scope}", "sync", "sync", "barrier",
        doc="Block until every core in scope (chip, all, or the x/y/z line) has arrived.")
    add(g, "halt", [], "", "sync", "sync", "halt", doc="Stop this core.")
    add(g, "mark.push", [_i("region", UIMM24), _s("sa")], "{region}, {sa}", "meta", None,
        "mark_push", doc="Enter source region `region` with dynamic index sa (free).")
    add(g, "mark.pop", [], "", "meta", None, "mark_pop", doc="Leave the innermost region (free).")
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
