"""The instruction table, its encoding and its assembly text, checked row by row.

Round trips (encode->decode, text->binary->text) run for every row of TABLE with
hypothesis choosing operand values over each kind's whole range; `build_table`,
`decode` and the assembler must reject what is malformed, with readable errors.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mkemu.errors import SourceError
from mkemu.isa.asm import (EncodingError, assemble, decode, disassemble, encode, format_instr,
                           parse_instr)
from mkemu.isa.encoding import (F32, IMM32, OPCODE_SHIFT, REG_S, REG_V, SPACE, UIMM8,
                                format_f32_bits, parse_f32_bits)
from mkemu.isa.table import BY_OPCODE, TABLE, Operand, build_table

MNEMONICS = sorted(TABLE)


def finite_f32_bits():
    return st.floats(width=32, allow_nan=False, allow_infinity=False).map(
        lambda x: int(np.array([x], np.float32).view(np.uint32)[0]))


def operand_values(instr):
    fields = {}
    for op in instr.operands:
        if op.kind is F32:
            fields[op.name] = finite_f32_bits()
        else:
            lo, hi = op.kind.value_range()
            fields[op.name] = st.integers(lo, hi)
    return st.fixed_dictionaries(fields)


@pytest.mark.parametrize("mnemonic", MNEMONICS)
def test_round_trips_for_every_instruction(mnemonic):
    instr = TABLE[mnemonic]

    @settings(max_examples=15, deadline=None)
    @given(operand_values(instr))
    def check(values):
        word = encode(instr, values)
        assert 0 <= word < 1 << 64
        assert word >> OPCODE_SHIFT == instr.opcode
        assert decode(word) == (instr, values)
        text = disassemble(word)
        assert text == format_instr(instr, values)
        parsed_instr, parsed = parse_instr(text)
        assert parsed_instr is instr and parsed == values
        assert encode(parsed_instr, parsed) == word
        # Assembly is free about spaces around punctuation and after the mnemonic.
        spaced = re.sub(r"\s*([,()\[\]@])\s*", r" \1  ", text).replace(" ", "\t", 1)
        assert parse_instr(spaced)[1] == values

    check()


def test_table_is_consistent():
    assert len(BY_OPCODE) == len(TABLE)
    for mnemonic, instr in TABLE.items():
        assert instr.mnemonic == mnemonic
        assert BY_OPCODE[instr.opcode] is instr
        used = 0
        for field in instr.fields:
            assert not used & field.mask
            used |= field.mask
        assert used < 1 << OPCODE_SHIFT
        # Every instruction is implemented: the compiled loop runs its exec clause, or
        # the machine its global kind (tests/emulator/test_loop.py checks both ends).
        assert (instr.exec is None) != (instr.global_kind is None), mnemonic


@pytest.mark.parametrize("bits", [0x7FC00000, 0xFFC00001, 0x7F800000, 0xFF800000, 0x7F800001])
def test_non_finite_f32_immediates_round_trip_as_raw_bits(bits):
    instr = TABLE["vli.f32"]
    text = format_instr(instr, {"vd": 3, "imm": bits})
    assert "f32:" in text
    assert parse_instr(text)[1] == {"vd": 3, "imm": bits}


@given(finite_f32_bits())
def test_f32_text_is_shortest_round_trip(bits):
    assert parse_f32_bits(format_f32_bits(bits)) == bits


# --- build_table rejects malformed rows --------------------------------------------

def row(mnemonic="op", operands=(), syntax="", group="scalar", unit="scalar", timing="scalar", **extra):
    semantics = extra or {"exec": "pass"}
    return dict(group=group, mnemonic=mnemonic, operands=tuple(operands), syntax=syntax,
                unit=unit, timing=timing, family="scalar", **semantics)


def test_build_table_accepts_a_small_table():
    table = build_table([row("a", [Operand("sd", REG_S, "w"), Operand("imm", IMM32, "i")], "{sd}, {imm}"),
                         row("b", group="valu")])
    assert table["a"].fields[0].shift == OPCODE_SHIFT - 5
    assert table["b"].opcode != table["a"].opcode


@pytest.mark.parametrize("rows, message", [
    ([row("a"), row("a")], "declared twice"),
    ([row("a", [Operand("x", IMM32, "i"), Operand("y", IMM32, "i")], "{x}, {y}")], "more than 55 bits"),
    ([row("a", [Operand("x", REG_S, "r"), Operand("y", REG_S, "r")], "{x}")], "must name operands"),
    ([row("a", [Operand("x", REG_S, "r")], "{x}, {x}")], "must name operands"),
    ([row("a", [Operand("x", REG_S, "r")], "{x}, {y}")], "must name operands"),
    ([row("a", [Operand("x", REG_S, "r"), Operand("x", REG_V, "r")], "{x}, {x}")], "must name operands"),
    ([row("a", unit="gpu")], "unknown unit"),
    ([row("a", timing="warp")], "unknown timing class"),
    ([row(f"d{i}", group="dma") for i in range(9)], "overflows"),
    ([row("a", exec=None)], "exactly one of an exec clause and a global kind"),
    ([row("a", exec="pass", global_kind="halt")], "exactly one of an exec clause and a global kind"),
    ([row("a", global_kind="teleport")], "unknown global kind"),
    ([row("a", exec="pass", reads=("mxu.gpu",))], "unknown state"),
    ([row("a", exec="pass", memory=(("vmem", "x", "tile"),))], "bad memory footprint"),
    ([row("a", exec="pass", memory=(("hbm", "r", "tile"),))], r"bad memory footprint .* spaces: vmem, smem"),
    ([row("a", exec="pass", memory=(("gpu", "r", "tile"),))], "bad memory footprint"),   # (were accepted, unchecked)
])
def test_build_table_rejects(rows, message):
    with pytest.raises(ValueError, match=message):
        build_table(rows)


# --- decode rejects words that are not instructions ----------------------------------

def test_decode_rejects_unassigned_opcodes():
    free = [op for op in range(1 << 9) if op not in BY_OPCODE]
    assert free
    for opcode in free[:: max(1, len(free) // 20)]:
        with pytest.raises(EncodingError, match="illegal instruction word"):
            decode(opcode << OPCODE_SHIFT)


@pytest.mark.parametrize("mnemonic", ["nop", "halt", "add", "vadd.f32", "vbcast.lane", "dma.start"])
def test_decode_rejects_stray_bits(mnemonic):
    instr = TABLE[mnemonic]
    used = sum(f.mask for f in instr.fields)
    free_bits = [b for b in range(OPCODE_SHIFT) if not used >> b & 1]
    word = encode(instr, {op.name: 0 for op in instr.operands})
    for bit in (free_bits[0], free_bits[-1]):
        with pytest.raises(EncodingError, match="outside"):
            decode(word | 1 << bit)


def test_decode_rejects_bad_enum_values():
    instr = TABLE["dma.start"]
    values = {op.name: 0 for op in instr.operands}
    values["dsp"] = len(SPACE.choices)          # fits 2 bits, names no memory
    word = instr.opcode << OPCODE_SHIFT
    for field in instr.fields:
        word |= values[field.operand.name] << field.shift
    with pytest.raises(EncodingError, match="bad enum"):
        decode(word)


def test_encode_rejects_values_that_do_not_fit():
    with pytest.raises(EncodingError, match=r"does not fit in 8 bits \(0\.\.255\)"):
        encode(TABLE["vrot.lane"], {"vd": 0, "va": 0, "amount": 256})
    assert UIMM8.check_value(255) is None


# --- assembler errors point at file:line:col ----------------------------------------

def assemble_error(body: str) -> SourceError:
    source = ".kernel main\n" + body + "    halt\n"
    with pytest.raises(SourceError) as info:
        assemble(source, "prog.s")
    return info.value


@pytest.mark.parametrize("line, where, message", [
    ("    vad.f32 v1, v2, v3", "prog.s:2:5", "unknown instruction 'vad.f32' (did you mean 'vadd.f32'?)"),
    ("  add s1, s2", "prog.s:2:3", "bad operands for add: expected `add {sd}, {sa}, {sb}`"),
    ("    add s1, v2, s3", "prog.s:2:5", "bad operands for add"),
    ("    vrot.lane v1, v2, 300", "prog.s:2:5", "operand amount: uimm8 value 300 does not fit"),
    ("    li s1, 4294967296", "prog.s:2:5", "operand imm: imm32 value 4294967296 does not fit"),
    ("    add s32, s1, s2", "prog.s:2:5", "operand sd: sreg value 32 does not fit"),
    ("    li s1, @nosuch", "prog.s:2:5", "unknown symbol '@nosuch'"),
    ("    jmp nowhere", "prog.s:2:5", "unknown symbol 'nowhere'"),
    ("    vli.f32 v1, 1.2.3", "prog.s:2:5", "bad operands for vli.f32"),
    ("    .frobnicate 3", "prog.s:2:5", "bad directive"),
])
def test_assembler_errors_name_file_line_and_column(line, where, message):
    error = assemble_error(line + "\n")
    text = error.render()
    assert text.startswith(f"{where}: error: ")
    assert message in text
    assert line.strip() in text and "^" in text


def test_assembler_reports_every_error_sorted():
    error = assemble_error("    jmp nowhere\n    nop\n    bogus s1\nx:\nx:\n")
    lines = [d.span.line for d in error.diagnostics]
    assert lines == sorted(lines) == [2, 4, 6]
    assert "defined twice" in error.diagnostics[-1].message


@pytest.mark.parametrize("label", ["s3", "v0", "m1", "x0", "a2", "s31"])
def test_a_label_spelled_like_a_register_is_a_branch_target_only(label):
    # `addi s1, s2, s3` (add meant) took a label s3's index as its immediate: there the
    # register spelling is an error, with or without such a label.
    error = assemble_error(f"    li s3, 40\n{label}:\n    addi s1, s2, {label}\n")
    assert [d.span.line for d in error.diagnostics] == [4]
    assert f"not the register {label} (a label of that name is taken only as a branch target)" in str(error)
    # As a branch target it is the label.
    program = assemble(f".kernel k\n    jmp {label}\n    nop\n{label}: halt\n", "ok.s")
    assert decode(int(program.kernels["k"].code[0]))[1]["target"] == 2


def test_assembler_resolves_labels_and_buffers():
    program = assemble(".buffer a f32 8x128 input\n.buffer b i32 4 output\n.kernel k\n"
                       "top: li s1, @b\n    jmp top\n    halt\n", "ok.s")
    code = program.kernels["k"].code
    assert decode(int(code[0]))[1] == {"sd": 1, "imm": program.buffer("b").offset_bytes}
    assert decode(int(code[1]))[1] == {"target": 0}
    assert program.buffer("b").offset_bytes == 4096


def test_launch_of_unknown_kernel_and_empty_file():
    with pytest.raises(SourceError, match=r"p\.s:3:1: error: launch of unknown kernel 'other'"):
        assemble(".kernel k\n    halt\n.launch other\n", "p.s")
    with pytest.raises(SourceError, match="no kernel"):
        assemble("; nothing\n", "p.s")
