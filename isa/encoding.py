"""Operand kinds and the fixed-width binary encoding.

Every instruction is one 64-bit word: a 9-bit opcode in bits 63..55, then the
operand fields packed downwards from bit 54 in declaration order. The field
layouts are computed from the instruction table (`table.py`), which checks that
nothing overlaps and every field fits.
"""

from __future__ import annotations

import re

import attrs
import numpy as np

WORD_BITS = 64
OPCODE_BITS = 9
OPCODE_SHIFT = WORD_BITS - OPCODE_BITS
OPERAND_BITS = OPCODE_SHIFT  # bits 54..0 hold the operand fields

SPACES = ("hbm", "vmem", "smem")

# Special registers readable with `rdsr`: who am I and how big is the machine.
SPECIAL_REGS = (
    "core", "chip", "chip_x", "chip_y", "chip_z",
    "mesh_x", "mesh_y", "mesh_z", "cores", "chips", "gcore",
)

# Barrier scopes: the chip's cores, every core of the mesh, or the cores on one
# mesh axis line through this chip (same coordinates in the other two dims).
BARRIER_SCOPES = ("chip", "all", "x", "y", "z")


@attrs.frozen
class OperandKind:
    """How one kind of operand is stored (bits, signedness) and written as text."""

    name: str
    bits: int
    signed: bool = False
    prefix: str = ""            # register kinds: "s", "v", "m", "x", "a"
    choices: tuple[str, ...] = ()  # enum kinds: the names, index = encoded value

    def check_value(self, value: int) -> str | None:
        """None if `value` fits this kind, else a message quoting the numbers."""
        lo, hi = self.value_range()
        if not lo <= value <= hi:
            return f"{self.name} value {value} does not fit in {self.bits} bits ({lo}..{hi})"
        return None

    def value_range(self) -> tuple[int, int]:
        if self.choices:
            return 0, len(self.choices) - 1
        if self.signed:
            return -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1
        return 0, (1 << self.bits) - 1

    def encode(self, value: int) -> int:
        return value & ((1 << self.bits) - 1)

    def decode(self, raw: int) -> int:
        if self.signed and raw >> (self.bits - 1):
            return raw - (1 << self.bits)
        return raw

    def format(self, value: int) -> str:
        if self.prefix:
            return f"{self.prefix}{value}"
        if self.choices:
            return self.choices[value]
        if self.name == "f32":
            return format_f32_bits(value)
        return str(value)


def format_f32_bits(bits: int) -> str:
    """Shortest text that reads back as the same float32; NaN and inf as raw bits."""
    value = np.array([bits & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)[0]
    if not np.isfinite(value):
        return f"f32:{bits & 0xFFFFFFFF:#010x}"
    return str(value)


def parse_f32_bits(text: str) -> int | None:
    """Parse a float32 immediate (`1.5`, `-2e-3`, `f32:0x7fc00000`) into raw bits."""
    text = text.strip()
    if text.startswith("f32:"):
        try:
            return int(text[4:], 0) & 0xFFFFFFFF
        except ValueError:
            return None
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?inf|nan", text):
        return None
    return int(np.array([text], dtype=np.float32).view(np.uint32)[0])


REG_S = OperandKind("sreg", 5, prefix="s")
REG_V = OperandKind("vreg", 5, prefix="v")
REG_M = OperandKind("mreg", 3, prefix="m")
MXU = OperandKind("mxu", 2, prefix="x")
ACC = OperandKind("acc", 4, prefix="a")
IMM32 = OperandKind("imm32", 32, signed=True)
OFF27 = OperandKind("offset", 27, signed=True)
UIMM8 = OperandKind("uimm8", 8)
UIMM24 = OperandKind("uimm24", 24)
TARGET = OperandKind("target", 24)
F32 = OperandKind("f32", 32)
SPACE = OperandKind("space", 2, choices=SPACES)
SPECIAL = OperandKind("special", 4, choices=SPECIAL_REGS)
SCOPE = OperandKind("scope", 3, choices=BARRIER_SCOPES)
FLAG = OperandKind("flag", 1)

KINDS = {k.name: k for k in (REG_S, REG_V, REG_M, MXU, ACC, IMM32, OFF27, UIMM8,
                             UIMM24, TARGET, F32, SPACE, SPECIAL, SCOPE, FLAG)}
