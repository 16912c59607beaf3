"""Malformed `.s` input is a SourceError at its file:line:col, never a Python exception
from inside the assembler or the emulator, and nothing is silently truncated or guessed:
numbers, `.smem` words and launch arguments, buffer declarations, float32 immediates."""

from __future__ import annotations

import numpy as np
import pytest

import mkemu
from mkemu.errors import SourceError
from mkemu.isa.asm import assemble, decode
from mkemu.isa.doc import render
from mkemu.isa.listing import listing


def error_of(source: str, **kwargs) -> str:
    with pytest.raises(SourceError) as info:
        assemble(source, "prog.s", **kwargs)
    return info.value.render()


@pytest.mark.parametrize("source, where, message", [
    # was an UnboundLocalError from inside the assembler
    (".kernel k\n  .smem zz 1\n  halt\n", "prog.s:2:3", ".smem takes a byte offset and 32-bit integer words: "
                                                       "bad number 'zz'"),
    # a negative offset was taken as a slice from the end of the image
    (".kernel k\n  .smem -4 1\n  halt\n", "prog.s:2:3", ".smem offset -4 is not a 4-byte aligned SMEM address"),
    (".kernel k\n  .smem 2 1\n  halt\n", "prog.s:2:3", ".smem offset 2 is not a 4-byte aligned SMEM address"),
    # words and launch arguments that do not fit in 32 bits were masked silently
    (".kernel k\n  .smem 0 0x1ffffffff\n  halt\n", "prog.s:2:3", ".smem word 0x1ffffffff does not fit in 32 bits"),
    (".kernel k\n  halt\n.launch k 1 -2147483649\n", "prog.s:3:1",
     "launch argument -2147483649 does not fit in a 32-bit SMEM word"),
    (".smem 0 1\n.kernel k\n  halt\n", "prog.s:1:1", ".smem outside a kernel"),
    # a leading zero raised ValueError from int(..., 0)
    (".kernel k\n  li s1, 010\n  halt\n", "prog.s:2:3", "bad number '010': a decimal number does not start with 0"),
    (".kernel k\n  lds s1, 08(s0)\n  halt\n", "prog.s:2:3", "bad number '08'"),
    # a register where an immediate goes was "unknown symbol 's3'"
    (".kernel k\n  addi s1, s2, s3\n  halt\n", "prog.s:2:3",
     "operand imm takes a number or a symbol, not the register s3"),
    (".kernel k\n  halt\n.launch k 07\n", "prog.s:3:1", "bad number '07'"),
    # a second buffer of one name shadowed the first's @symbol; an empty one was accepted
    (".buffer a f32 8x128 input\n.buffer a i32 4 output\n.kernel k\n  halt\n", "prog.s:2:1",
     "buffer 'a' declared twice (first at line 1)"),
    (".buffer a f32 0x128 input\n.kernel k\n  halt\n", "prog.s:1:1", "buffer 'a' has an empty dimension"),
    # a buffer no operand could name (`@o@0` is not a symbol) was accepted, and a
    # reference's 'o@0' was then refused as a key for it
    *[(f".buffer {name} f32 8x128 output\n.kernel k\n  halt\n", "prog.s:1:1",
       f"bad buffer name '{name}': a letter or _, then letters, digits, _ or . (operands name it as @NAME)")
      for name in ("o@0", "1x", "a-b", "@@")],
    # a second reference silently replaced the first
    (".reference a.py:ref\n.kernel k\n  halt\n.reference b.py:ref\n", "prog.s:4:1",
     ".reference given twice (first at line 1)"),
    # 1e40 became inf with a numpy RuntimeWarning
    (".kernel k\n  vli.f32 v1, 1e40\n  halt\n", "prog.s:2:3", "float32 immediate 1e40 is beyond the largest float32"),
    (".kernel k\n  vli.f32 v1, -3.4028236e38\n  halt\n", "prog.s:2:3", "is beyond the largest float32"),
])
def test_bad_input_is_an_error_at_its_line(source, where, message):
    text = error_of(source)
    assert text.startswith(f"{where}: error: "), text
    assert message in text


def test_smem_image_and_launch_arguments_must_fit_the_profile_smem():
    text = error_of(".kernel k\n  .smem 60 1 2\n  halt\n", smem_bytes=64)
    assert text.startswith("prog.s:2:3: error: .smem words [60, 68) reach past SMEM of 64 bytes")
    text = error_of(".kernel k\n  halt\n.launch k " + " ".join(["1"] * 17) + "\n", smem_bytes=64)
    assert text.startswith("prog.s:3:1: error: 17 launch arguments take 68 bytes; SMEM has 64")
    assemble(".kernel k\n  .smem 56 1 2\n  halt\n.launch k " + " ".join(["1"] * 16) + "\n", "ok.s", smem_bytes=64)


def test_smem_image_past_the_profile_is_a_source_error_when_compiled():
    # was a numpy broadcast ValueError from the emulator when the kernel started
    with pytest.raises(SourceError, match=r"p\.s:2:3: error: \.smem words \[100000000, 100000004\) reach past "
                                          r"SMEM of 65536 bytes"):
        mkemu.compile_source(".kernel k\n  .smem 100000000 1\n  halt\n", filename="p.s", hw="test", mesh="1")


def test_words_and_floats_at_the_edges_are_accepted():
    program = assemble(".kernel k\n  .smem 0 -2147483648 0xffffffff 0b11\n  vli.f32 v1, 3.4028235e38\n"
                       "  vli.f32 v2, -inf\n  li s1, 0\n  halt\n.launch k 4294967295 -1\n", "ok.s")
    kernel = program.kernels["k"]
    assert np.frombuffer(kernel.smem_init, np.uint32).tolist() == [0x80000000, 0xFFFFFFFF, 3]
    assert decode(int(kernel.code[0]))[1]["imm"] == 0x7F7FFFFF
    assert decode(int(kernel.code[1]))[1]["imm"] == 0xFF800000
    assert decode(int(kernel.code[2]))[1]["imm"] == 0
    assert program.launches[0].args == (4294967295, -1)


def test_listing_shows_every_label_of_an_instruction():
    program = assemble(".kernel k\ntop: again: li s1, 1\n  jmp again\n  halt\n", "ok.s")
    assert program.kernels["k"].labels == {"top": 0, "again": 0}
    text = listing(program)
    assert "top:\nagain:\n  000000:" in text


def test_isa_doc_keeps_a_bar_in_a_meaning():
    # vabs.f32's "vd = |va|." was printed as "vd = /va/."
    assert "| vd = \\|va\\|. |" in render()


def _f32_imm(text: str) -> int:
    program = assemble(f".kernel k\n  vli.f32 v1, {text}\n  halt\n", "ok.s")
    return decode(int(program.kernels["k"].code[0]))[1]["imm"]


@pytest.mark.parametrize("text, bits", [
    # just above the midpoint between 1 and 1 + 2^-23: through float64 it became the
    # midpoint itself and rounded (ties to even) down to 1.0
    ("1.00000005960464477539062500001", 0x3F800001),
    ("1.0000000596046447753906249999", 0x3F800000),
    ("1.000000059604644775390625", 0x3F800000),            # the midpoint: ties to even
    ("1.000000178813934326171875", 0x3F800002),            # 1 + 3*2^-24: ties to even, up
    # just above half the smallest subnormal: was 0
    ("7.00649232162408536e-46", 0x00000001),
    ("7.0064923216240853546e-46", 0x00000000),
    # below the midpoint between float32 max and 2^128: was refused as beyond float32
    ("3.4028235677973366e38", 0x7F7FFFFF),
    ("-0.0", 0x80000000),
    ("1e-60", 0x00000000),
    ("16777217", 0x4B800000),
])
def test_decimal_float32_immediates_are_rounded_once_from_their_exact_value(text, bits):
    assert _f32_imm(text) == bits


def test_shortest_float32_texts_read_back_as_themselves():
    rng = np.random.default_rng(0)
    values = rng.integers(0, 1 << 32, 2000, dtype=np.uint64).astype(np.uint32)
    values = np.concatenate([values, np.arange(1, 40, dtype=np.uint32), [0x7F7FFFFF, 0x00800000, 0x007FFFFF]])
    for bits in values.tolist():
        value = np.array([bits], np.uint32).view(np.float32)[0]
        if np.isfinite(value):
            assert _f32_imm(np.format_float_scientific(value, unique=True)) == bits


@pytest.mark.parametrize("source, message", [
    # raw bits wider than 32 were masked to their low 32 silently
    (".kernel k\n  vli.f32 v1, f32:0x1ffffffff\n  halt\n",
     "raw float32 bits 0x1ffffffff do not fit in 32 bits (0x0..0xffffffff)"),
    (".kernel k\n  vli.f32 v1, 3.40282356779733661637539395458142568448e38\n  halt\n",
     "is beyond the largest float32"),
    # the range named was the signed one, though 0x80000000 .. 0xffffffff are accepted
    (".kernel k\n  li s1, 0x100000000\n  halt\n", "imm32 value 4294967296 does not fit in 32 bits "
                                                  "(-2147483648..4294967295)"),
    # a buffer address past 2^31 cannot be a (sign-extended) immediate: say so
    (".buffer big f32 536870912 scratch\n.buffer b f32 8 input\n.kernel k\n  li s1, @b\n  halt\n",
     "li: operand imm: @b is 2147483648, beyond a 32-bit immediate, which is sign-extended "
     "(-2147483648..2147483647)"),
])
def test_immediates_out_of_range_say_what_fits(source, message):
    assert message in error_of(source)


def test_smem_image_without_a_profile_is_bounded_by_the_largest_smem():
    # was a MemoryError (a bytearray of the offset's size) from assemble() without smem_bytes
    text = error_of(".kernel k\n  .smem 0x10000000000 1\n  halt\n")
    assert text.startswith("prog.s:2:3: error: .smem words [1099511627776, 1099511627780) reach past "
                           "the largest SMEM a profile may have (67108864 bytes)")


def test_an_f32_immediate_of_thousands_of_digits_rounds_exactly():
    # int() refuses strings of more than 4,300 digits: such an immediate (or exponent)
    # was a ValueError traceback out of the assembler's rounding.
    from mkemu.isa.encoding import parse_f32_bits

    one_up = 0x3F800001
    assert parse_f32_bits("1." + "0" * 5000 + "1") == 0x3F800000
    # Just past the midpoint between 1.0 and the next float32, 5,000 digits later: up.
    assert parse_f32_bits("1.00000005960464477539062500" + "0" * 5000 + "1") == one_up
    assert parse_f32_bits("1.00000005960464477539062500" + "0" * 5000) == 0x3F800000
    assert parse_f32_bits("1e-" + "9" * 5000) == 0 and parse_f32_bits("1e" + "9" * 5000) == 0x7F800000
    assert parse_f32_bits("-2.5e" + "0" * 5000 + "1") == 0xC1C80000


@pytest.mark.parametrize("source, where, message", [
    # int() and str() refuse integers of more than 4,300 digits: each was a ValueError
    # traceback out of the assembler
    (".kernel k\n  li s1, " + "9" * 5000 + "\n  halt\n", "prog.s:2:3",
     "number 99999999999999999999... has 5000 digits"),
    (".kernel k\n  li s1, 0x" + "f" * 5000 + "\n  halt\n", "prog.s:2:3", "number 0xffffffffffffffffff... has 5000 digits"),
    (".kernel k\n  li s1, 0" + "9" * 5000 + "\n  halt\n", "prog.s:2:3", "has 5000 digits"),
    (".kernel k\n  lds s1, " + "4" * 5000 + "(s0)\n  halt\n", "prog.s:2:3", "has 5000 digits"),
    (".kernel k\n  .smem 0 " + "9" * 5000 + "\n  halt\n", "prog.s:2:3",
     ".smem takes a byte offset and 32-bit integer words: number 99999999999999999999... has 5000 digits"),
    (".kernel k\n  halt\n.launch k " + "9" * 5000 + "\n", "prog.s:3:1", "has 5000 digits"),
    (".kernel k\n  add s" + "9" * 5000 + ", s1, s2\n  halt\n", "prog.s:2:3",
     "register s99999999999999999999... has 5000 digits: no such register"),
    (".buffer a f32 8x" + "9" * 5000 + " input\n.kernel k\n  halt\n", "prog.s:1:1",
     "buffer 'a': dimension 99999999999999999999... has 5000 digits"),
    # other scripts' digits (Python's \d) were read as numbers: `li s١, ١٢` was `li s1, 12`
    (".kernel k\n  li s\u0661, 1\n  halt\n", "prog.s:2:3", "bad operands for li"),
    (".kernel k\n  li s1, \u0661\u0662\n  halt\n", "prog.s:2:3", "bad operands for li"),
    (".kernel k\n  vli.f32 v1, \u0661.\u0665\n  halt\n", "prog.s:2:3", "bad operands for vli.f32"),
    (".kernel k\n  halt\n.launch k \u0667\n", "prog.s:3:1", "bad number '\u0667'"),
    (".buffer a f32 \uff18x128 input\n.kernel k\n  halt\n", "prog.s:1:1", "bad shape '\uff18x128'"),
    # a dimension with a leading zero was read as decimal, as a number's is not
    (".buffer a f32 010x128 input\n.kernel k\n  halt\n", "prog.s:1:1",
     "bad shape '010x128': a dimension does not start with 0"),
])
def test_numbers_are_ascii_and_of_bounded_length(source, where, message):
    text = error_of(source)
    assert text.startswith(f"{where}: error: "), text
    assert message in text


def test_a_long_number_still_reports_its_range():
    # 100 significant digits still parse, and are refused by their operand's range
    assert "does not fit in 32 bits" in error_of(".kernel k\n  li s1, " + "9" * 100 + "\n  halt\n")
    assert "does not fit in 5 bits" in error_of(".kernel k\n  add s" + "9" * 30 + ", s1, s2\n  halt\n")
    # (a register's number, like a decimal, has no leading zero)
    assert "no leading zero (write s99)" in error_of(".kernel k\n  add s" + "0" * 200 + "99, s1, s2\n  halt\n")
    program = assemble(".kernel k\n  li s1, 0x" + "0" * 300 + "7\n  halt\n", "ok.s")
    assert decode(int(program.kernels["k"].code[0]))[1]["imm"] == 7


def test_a_byte_order_mark_starting_the_text_is_not_part_of_the_program():
    # (some editors save UTF-8 with a BOM first)
    text = ".kernel main\n    li s1, 7\n    halt\n"
    assert np.array_equal(assemble("\ufeff" + text).kernels["main"].code, assemble(text).kernels["main"].code)


def test_two_smem_lines_may_not_set_one_word():
    # (the later line silently won)
    with pytest.raises(SourceError, match=r"t.s:3:\d+: error: .smem word at byte 4 is already set by the .smem at line 2"):
        assemble(".kernel main\n    .smem 0 1 2\n    .smem 4 9\n    halt\n", "t.s")
    assemble(".kernel main\n    .smem 0 1 2\n    .smem 8 9\n    halt\n", "t.s")


@pytest.mark.parametrize("reference, message", [
    ("nofile.py:f", "reference file 'nofile.py' not found next to the program"),
    ("no_such_module_here:f", "no_such_module_here"),
])
def test_a_reference_a_s_program_cannot_load_is_an_error_at_its_line(tmp_path, reference, message):
    path = tmp_path / "prog.s"
    path.write_text(f".kernel main\n    halt\n.reference {reference}   # the check\n")
    with pytest.raises(SourceError) as info:
        mkemu.compile(str(path), hw="test", mesh="1")
    text = info.value.render()
    assert text.startswith(f"{path}:3:12: error: ") and message in text
    assert text.splitlines()[-1] == "             " + "^" * len(reference)


@pytest.mark.parametrize("operand, message", [
    ("vli.f32 v1, 010", "float32 immediate 010: a decimal with a leading zero is an error"),
    ("vli.f32 v1, -010.5", "float32 immediate -010.5: a decimal with a leading zero is an error"),
    ("li s01, 5", "register s01: a register number has no leading zero (write s1)"),
    ("vadd.f32 v02, v1, v1", "register v02: a register number has no leading zero (write v2)"),
])
def test_a_leading_zero_is_an_error_in_float_immediates_and_register_numbers_too(operand, message):
    text = error_of(f".kernel k\n  {operand}\n  halt\n")
    assert text.startswith("prog.s:2:3: error: ") and message in text, text


def test_zero_itself_still_starts_float_immediates_and_registers():
    program = assemble(".kernel k\n  vli.f32 v0, 0.5\n  vli.f32 v1, -0.0\n  vli.f32 v2, 0e5\n"
                       "  vli.f32 v3, 0\n  li s0, 0\n  halt\n", "ok.s")
    assert [decode(int(w))[1].get("imm") for w in program.kernels["k"].code[:4]] == \
        [0x3F000000, 0x80000000, 0, 0]


@pytest.mark.parametrize("source, where, message", [
    # a label after a kernel's last instruction resolved to the kernel's length: a branch
    # to it faulted at run time, naming no line
    (".kernel k\n  halt\nend:\n", "prog.s:3:1", "label 'end' labels no instruction (it is after the last of "
                                               "kernel 'k')"),
    (".kernel k\n  jmp out\nout:\n.kernel j\n  halt\n", "prog.s:3:1", "label 'out' labels no instruction"),
    # `.reference FILE.py` took a function named `reference` silently
    (".reference r.py\n.kernel k\n  halt\n", "prog.s:1:1", ".reference takes FILE.py:FUNCTION (or "
                                                        "module:function), got 'r.py'"),
    (".reference r.py:\n.kernel k\n  halt\n", "prog.s:1:1", ".reference takes FILE.py:FUNCTION"),
])
def test_labels_name_an_instruction_and_a_reference_names_its_function(source, where, message):
    text = error_of(source)
    assert text.startswith(f"{where}: error: ") and message in text, text


@pytest.mark.parametrize("brk", ["\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\x1c"])
def test_a_comment_runs_to_the_newline_whatever_other_line_breaks_it_holds(brk):
    # (str.splitlines ended the comment there: `li s2, 7` ran as code, and every line
    # after it was numbered one too far)
    program = assemble(f".kernel k\n    li s1, 5 ; note{brk} li s2, 7\n    halt\n", "b.s")
    assert program.kernels["k"].code.size == 2
    message = error_of(f".kernel k\n    nop ; old{brk}nop\n    nop\n    bogus\n    halt\n")
    assert message.startswith("prog.s:4:5: error: unknown instruction 'bogus'"), message


def test_spaces_around_every_separator_parse_as_written_and_a_stray_word_is_refused_at_once():
    # (adjacent optional-space runs backtracked multiplicatively on a failing line: with
    # 15 spaces per gap a stray word took 20 s to refuse, with 40 it would take years)
    gap = " " * 40
    spaced = gap.join(["dma.start.r vmem", "[", "s1", "]", "@", "s2", ",", "hbm", "[", "s3", "]", ",", "s4", ",",
                       "s5", ",", "s6"])
    compact = "dma.start.r vmem[s1]@s2, hbm[s3], s4, s5, s6"
    words = [assemble(f".kernel k\n    {text}\n    halt\n", "b.s").kernels["k"].code[0] for text in (spaced, compact)]
    assert words[0] == words[1]
    assert "bad operands for dma.start.r" in error_of(f".kernel k\n    {spaced}{gap}x\n    halt\n")


@pytest.mark.parametrize("line, message", [
    ("x" * 100_000 + " s1", "unknown instruction 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... (100,000 characters)"),
    ("li s1, " + "y" * 5000, "unknown symbol 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy'... (5,000 characters) in operand"),
    (".launch k " + "9z" * 5000, "bad number '9z9z9z9z9z9z9z9z9z9z9z9z9z9z9z9z9z9z9z9z'... (10,000 characters)"),
    ("." + "d" * 5000, "bad directive `." + "d" * 79 + "...`"),
    ("w" * 5000 + ":\n    nop\n" + "w" * 5000 + ":", "label '" + "w" * 40 + "'... (5,000 characters) defined twice"),
])
def test_a_huge_unknown_name_is_quoted_in_part(line, message):
    # (the whole name was echoed back: a megabyte of mnemonic gave a megabyte of error)
    text = error_of(f".kernel k\n    {line}\n    halt\n")
    assert message in text and len(text.splitlines()[0]) < 300


@pytest.mark.parametrize("newline", ["\r", "\r\n"])
def test_a_text_with_cr_or_crlf_line_ends_assembles_as_the_file_would(newline):
    # (a text given as it is, as mkemu.compile_source passes it: CR-only lines were one line)
    text = ".kernel k\n    li s1, 5\n    nop\n    halt\n"
    program = assemble(text.replace("\n", newline), "b.s")
    assert program.kernels["k"].code.tolist() == assemble(text, "b.s").kernels["k"].code.tolist()
    message = error_of(".kernel k\n    nop\n    bogus\n    halt\n".replace("\n", newline))
    assert message.startswith("prog.s:3:5: error: unknown instruction 'bogus'"), message


def test_an_assembly_error_whose_width_is_unknown_has_no_end():
    """docs/api.md: a span's end is None where it is not known, e.g. most assembly
    errors; its line was given with no column."""
    with pytest.raises(SourceError) as info:
        mkemu.compile_source("bogus r1, r2\n", filename="b.s", hw="test")
    span = info.value.diagnostics[0].span
    assert (span.line, span.column, span.end_line, span.end_column) == (1, 1, None, None)


@pytest.mark.parametrize("line", ["  li s1, {n}", "  li s{n}, 1", "  .smem 0 {n}"])
def test_a_number_of_leading_zeros_past_pythons_digit_limit_is_an_error_not_a_traceback(line):
    # int() of the whole text (4,301 characters, one significant digit) in the message
    # itself raised ValueError: Python converts at most 4,300 digits.
    n = "0" * 4300 + "1"
    out = error_of(".kernel main\n" + line.format(n=n) + "\n  halt\n")
    assert out.startswith("prog.s:2:") and "Traceback" not in out, out[:300]
    assert "does not start with 0 (write 1 for decimal" in out or "has no leading zero (write s1)" in out, out[:300]


def test_a_long_failing_float_immediate_is_refused_at_once():
    # `[0-9]+\.?[0-9]*` split a run of n digits n ways: a 16 KB line took 12 s to refuse.
    out = error_of(".kernel main\n  vli.f32 v0, " + "1" * 20_000 + "x\n  halt\n")
    assert out.startswith("prog.s:2:3: error: bad operands for vli.f32")


@pytest.mark.parametrize("text", [
    "\ufeff.reference ref.py:reference\n.kernel main\n  halt\n",          # a byte-order mark before it
    ".kernel main\nstart: .reference ref.py:reference\n  halt\n",        # a label before it
    ".kernel main\r.reference ref.py:reference\r  halt\r",               # CR line ends
])
def test_a_reference_the_assembler_takes_is_the_one_the_run_checks_with(tmp_path, text):
    """The reference was found by a scan of the text that missed these forms, which the
    assembler takes: the run said 'no reference named' and checked nothing."""
    (tmp_path / "ref.py").write_text("def reference(inputs, *, chips, cores_per_chip):\n    return {'y': 1}\n")
    with pytest.raises(mkemu.ConfigError, match="expected output 'y' is not a buffer of the program"):
        mkemu.compile_source(text, filename=str(tmp_path / "p.s"), hw="test", mesh="1")().check()
    (tmp_path / "ref.py").unlink()
    with pytest.raises(SourceError) as info:
        mkemu.compile_source(text, filename=str(tmp_path / "p.s"), hw="test", mesh="1")
    line = 1 if text.startswith("\ufeff") else 2
    assert info.value.render().startswith(f"{tmp_path / 'p.s'}:{line}:"), info.value.render()


@pytest.mark.parametrize("line", [
    "  vli.f32 v0, f32:0x" + "f" * 5000,
    "  vli.f32 v0, 0" + "1" * 5000 + ".5",
    "  vli.f32 v0, " + "9" * 5000 + ".0",
    "  jmp " + "a" * 5000,
    ".reference " + "x" * 5000,
])
def test_an_assembler_message_quotes_at_most_a_little_of_a_long_operand(line):
    # (a label, a float immediate or a reference of 100 KB was echoed back whole)
    message = error_of(".kernel main\n" + line + "\n  halt\n").splitlines()[0]
    assert len(message) < 300, message[:300]
