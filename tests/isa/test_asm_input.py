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
    (".kernel k\n  halt\n.launch k 07\n", "prog.s:3:1", "bad number '07'"),
    # a second buffer of one name shadowed the first's @symbol; an empty one was accepted
    (".buffer a f32 8x128 input\n.buffer a i32 4 output\n.kernel k\n  halt\n", "prog.s:2:1",
     "buffer 'a' declared twice (first at line 1)"),
    (".buffer a f32 0x128 input\n.kernel k\n  halt\n", "prog.s:1:1", "buffer 'a' has an empty dimension"),
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
