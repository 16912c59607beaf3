"""Operand kinds and the fixed-width binary encoding.

Every instruction is one 64-bit word: a 9-bit opcode in bits 63..55, then the
operand fields packed downwards from bit 54 in declaration order. The field
layouts are computed from the instruction table (`table.py`), which checks that
nothing overlaps and every field fits.
"""

from __future__ import annotations

import re
from fractions import Fraction

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


# ASCII digits only: \d would also take other scripts' digits (which int() reads).
F32_DECIMAL = r"([-+]?)([0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE]([-+]?[0-9]+))?"


def parse_f32_bits(text: str) -> int | None:
    """Parse a float32 immediate (`1.5`, `-2e-3`, `inf`, `nan`, `f32:0x7fc00000`) into raw
    bits; None if it is none of those (or raw bits wider than 32). A decimal is rounded
    once, to nearest (ties to even), from its exact value: not through float64, whose
    own rounding can land on a float32 midpoint and round the wrong way. A decimal beyond
    the largest float32 gives the bits of infinity (the assembler refuses it)."""
    text = text.strip()
    if text.startswith("f32:"):
        if not re.fullmatch(r"0[xX][0-9a-fA-F]+", text[4:]):
            return None
        bits = int(text[4:], 16)
        return bits if bits <= 0xFFFFFFFF else None
    if re.fullmatch(r"[-+]?inf|nan", text):
        return int(np.array([text], dtype=np.float32).view(np.uint32)[0])
    m = re.fullmatch(F32_DECIMAL, text)
    if not m:
        return None
    sign = 0x80000000 if m.group(1) == "-" else 0
    return sign | _decimal_magnitude_bits(m.group(2), m.group(3) or "0")


def _decimal_magnitude_bits(mantissa: str, exponent: str) -> int:
    """float32 bits of the decimal `mantissa` x 10^`exponent` (>= 0), correctly rounded,
    however many digits either has."""
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    if not digits:
        return 0
    # An exponent of more than 12 digits puts any decimal a file can hold far outside
    # float32 (and int() refuses strings of thousands of digits).
    exp_digits = exponent.lstrip("+-").lstrip("0") or "0"
    exp10 = 10 ** 12 if len(exp_digits) > 12 else int(exp_digits)
    exp10 = (-exp10 if exponent.startswith("-") else exp10) - len(frac)
    # Significant digits past the 200th only tell whether something nonzero follows: a
    # float32 midpoint, where rounding turns, has fewer than 120, so one sticky digit
    # stands for them and the rounding is the same.
    if len(digits) > 200:
        sticky = "1" if digits[200:].strip("0") else ""
        exp10 += len(digits) - 200 - len(sticky)
        digits = digits[:200] + sticky
    # The value lies in [10^(top - 1), 10^top): far outside float32's range it is
    # settled without building huge integers.
    top = len(digits) + exp10
    if top > 40:
        return 0x7F800000               # 10^40 or more: infinity
    if top < -46:
        return 0                        # below 10^-47: under half the smallest subnormal
    value = Fraction(int(digits)) * Fraction(10) ** exp10
    e = value.numerator.bit_length() - value.denominator.bit_length()
    if value < Fraction(2) ** e:
        e -= 1                          # now 2^e <= value < 2^(e + 1)
    e = max(e, -126)                    # below the normal range the step stays 2^-149
    q = value / Fraction(2) ** (e - 23)
    n, rest = divmod(q.numerator, q.denominator)
    if 2 * rest > q.denominator or (2 * rest == q.denominator and n & 1):
        n += 1
    # n in [2^23, 2^24] (normal; 2^24 carries into the exponent) or below 2^23 at e = -126
    # (a subnormal): one formula covers both.
    return min(((e + 127) << 23) + n - (1 << 23), 0x7F800000)


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
