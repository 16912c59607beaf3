"""Programs a fuzzing campaign of random assembly found mishandled, minimised: each must
end in a clear `EmulatorFault` naming chip, core, cycle, pc, instruction and source
(or run), never a crash, a Python exception, a hang or a huge allocation."""

from __future__ import annotations

import re
import time

import pytest

import mkemu
from mkemu.errors import EmulatorFault


def run(text: str, **options):
    kernel = mkemu.compile_source(text, "fuzz.s", hw="test", mesh="1", **options)
    return kernel()


def fault_of(text: str, **options) -> EmulatorFault:
    with pytest.raises(EmulatorFault) as info:
        run(text, **options)
    return info.value


def names_everything(fault: EmulatorFault, kind: str, instruction: str) -> str:
    text = fault.render()
    assert fault.kind == kind, text
    assert None not in (fault.chip, fault.core, fault.cycle, fault.pc), text
    assert f"instruction: {instruction}" in text, text
    assert re.search(r"source: fuzz\.s:\d+:\d+: ", text), text
    return text


def load64(reg: str, value: int) -> str:
    """Assembly putting the 64-bit `value` into `reg` (s28, s29 are scratch)."""
    value &= (1 << 64) - 1
    high, low = value >> 32, value & 0xFFFFFFFF
    return "\n".join([
        f"lui.d {reg}, {high}",
        f"li s28, {low >> 16}", "shli.d s28, s28, 16", f"add.d {reg}, {reg}, s28",
        f"li s29, {low & 0xFFFF}", f"add.d {reg}, {reg}, s29",
    ])


# A stride whose 7 rows wrap int64 back to 12 bytes: (7 * s) mod 2^64 == 12, s % 4 == 0.
WRAPPING_STRIDE = (2**64 + 12) // 7


@pytest.mark.parametrize("access", ["vld.w v1, 0(s0), s1, m0", "vst.w v1, 0(s0), s1, m0",
                                    "vld.bf16 v1, 0(s0), s1, m0", "vst.bf16 v1, 0(s0), s1, m0"])
def test_a_vector_stride_that_wraps_int64_is_out_of_bounds(access):
    # The bounds check saw the span [0, 524) and rows 1..7 read or wrote far outside VMEM.
    fault = fault_of(f".kernel main\n{load64('s1', WRAPPING_STRIDE)}\n{access}\nhalt\n")
    assert "outside VMEM" in names_everything(fault, "out-of-bounds", access)


@pytest.mark.parametrize("access", ["vld.w v1, 0(s1), s0, m0", "vld.w v1, 0(s1), s0, m1",
                                    "vst.w v1, 0(s1), s0, m1"])
def test_a_vector_address_at_the_top_of_int64_is_out_of_bounds(access):
    # addr + 4 wrapped negative: the span looked empty (or inside) and went unchecked.
    text = (f".kernel main\n{load64('s1', 2**63 - 4)}\nviota.lane v2\nvli.i32 v3, 0\n"
            f"vcmpeq.i32 m1, v2, v3\n{access}\nhalt\n")
    assert "outside VMEM" in names_everything(fault_of(text), "out-of-bounds", access)


def test_a_weight_tile_at_the_top_of_int64_is_out_of_bounds():
    access = "mxu.ldw x0, 0(s1), s2, s3"
    text = (f".kernel main\n{load64('s1', 2**63 - 256)}\nli s2, 256\nli s3, {(1 << 16) | 128}\n"
            f"{access}\nhalt\n")
    assert "outside VMEM" in names_everything(fault_of(text), "out-of-bounds", access)


def test_vector_accesses_inside_memory_are_unchanged():
    text = (".kernel main\nli s1, 4096\nli s2, 512\nvli.i32 v1, 7\nvst.w v1, 0(s1), s2, m0\n"
            "viota.lane v2\nvli.i32 v3, 5\nvcmplt.i32 m1, v2, v3\nvld.w v4, 0(s1), s2, m1\n"
            "vextract s5, v4, s3\nli s3, 4\nvextract s6, v4, s3\nhalt\n")
    assert run(text).report.cycles > 1000


@pytest.mark.parametrize("smem", ["4 2147483647 0 0 1 0 0", "4 100000000 0 0 1 0 0",
                                  "65536 2147483647 0 0 2147483647 0 0"])
def test_a_dma_with_huge_counts_over_a_zero_stride_is_refused_at_once(smem):
    # It used to copy every byte first (gigabytes: a MemoryError, or the machine's memory).
    access = "dma.start vmem[s2], vmem[s1], s0, s0"
    t0 = time.perf_counter()
    fault = fault_of(f".kernel main\n.smem 0 {smem}\nli s1, 0\nli s2, 4096\n{access}\nhalt\n")
    assert time.perf_counter() - t0 < 20
    assert "writes some bytes more than once" in names_everything(fault, "bad-descriptor", access)


def test_a_dma_whose_huge_destination_leaves_memory_faults_before_copying():
    access = "dma.start vmem[s2], vmem[s1], s0, s0"
    text = f".kernel main\n.smem 0 4 100000000 0 4 1 0 0\nli s1, 0\nli s2, 0\n{access}\nhalt\n"
    fault = fault_of(text)
    assert "DMA destination VMEM" in names_everything(fault, "out-of-bounds", access)


def test_a_region_id_near_the_field_limit_costs_no_time():
    # Region statistics walked all 2^24 slots in Python (minutes), and every launch
    # cleared them on every core (400 MB each).
    text = ".kernel main\nmark.push 16777215, s0\nmark.pop\nhalt\n.launch main\n.launch main\n"
    t0 = time.perf_counter()
    kernel = mkemu.compile_source(text, "fuzz.s", hw="test", mesh="2x2x1")
    assert kernel().report.cycles >= 2000
    assert time.perf_counter() - t0 < 20


def test_running_off_the_end_names_the_last_instruction():
    fault = fault_of(".kernel main\nli s1, 3\naddi s1, s1, 1\n")
    text = names_everything(fault, "ran-off-end", "addi s1, s1, 1")
    assert fault.pc == 1 and "a kernel must end with halt" in text


def test_max_cycles_while_only_a_dma_is_in_flight_names_the_dma():
    # The guard passed at a flow's completion named no chip, core, pc or instruction.
    access = "dma.start vmem[s2], vmem[s1], s0, s0"
    text = (".kernel main\n.smem 0 4 1000000 0 4 1 0 0\nli s1, 0\nli s2, 0\n"
            f"{access}\nhalt\n")
    fault = fault_of(text, max_cycles=20_000, checks=set())
    assert "max-cycle guard of 20000" in names_everything(fault, "max-cycles", access)


def _w32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >> 31 else x


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


@pytest.mark.parametrize("a, b", [(-2**63, 3), (-2**63, 8434889330194202091), (-2**63, -840835831),
                                  (3, -2**63), (-373195796415751852, -2**63), (-2**63, -1),
                                  (-2**63, -2**63), (2**63 - 1, -2), (-7, 2)])
def test_div_and_rem_of_minus_2_pow_63_see_the_64_bit_value(emu, a, b):
    # div and rem see the registers' 64-bit values (docs/isa.md); abs(-2^63) stayed
    # negative in the compiled loop, so a quotient with -2^63 on either side was wrong
    # (3 / -2^63 gave 1, -2^63 rem -840835831 gave -460109290).
    body = f"{load64('s1', a)}\n{load64('s2', b)}\ndiv s3, s1, s2\nrem s4, s1, s2\n"
    if -2**31 <= b < 2**31:
        body += f"divi s5, s1, {b}\nremi s6, s1, {b}\n"
    s = emu.run(emu.kernel(body)).core.s
    q = _trunc_div(a, b)
    assert (s[3], s[4]) == (_w32(q), _w32(a - b * q))
    if -2**31 <= b < 2**31:
        assert (s[5], s[6]) == (_w32(q), _w32(a - b * q))


def test_a_semaphore_is_an_int64_counter(emu):
    # Signals add 64-bit register values into an int64 counter (docs/architecture.md): up
    # to 2^63 - 1 it holds them; a signal past it faults (it wrapped: 2^62 three times read
    # -2^62, and a wait then deadlocked on a count nothing had lowered).
    body = f"{load64('s1', 2**62)}\n{load64('s3', 2**62 - 1)}\nli s2, 3\nsem.signal s2, s1\nsem.signal s2, s3\n"
    with pytest.raises(EmulatorFault) as info:
        emu.run(emu.kernel(body))
    assert info.value.kind == "semaphore-nonzero"
    assert f"semaphore 3 = {2**63 - 1} " in info.value.message
    with pytest.raises(EmulatorFault) as info:
        emu.run(emu.kernel(body + "li s4, 1\nsem.signal s2, s4\n"))
    assert info.value.kind == "bad-operand" and info.value.instruction == "sem.signal s2, s4"
    assert f"which holds {2**63 - 1:,}: the sum passes the largest count, 2^63 - 1" in info.value.message
