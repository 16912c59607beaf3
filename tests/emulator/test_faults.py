"""Every fault kind: an `EmulatorFault` naming chip, core, cycle, pc, the instruction
and its source line; through the CLI, a message and a non-zero exit, no traceback."""

from __future__ import annotations

import re

import numpy as np
import pytest

from mkemu.cli import main
from mkemu.emulator.config import GLOBAL_SHARE, RunConfig, global_budget
from mkemu.errors import EmulatorFault
from mkemu.isa.encoding import OPCODE_SHIFT

DESC = "0 4096 1 0 0 1 0 0"
BUFS = ".buffer src f32 8x128 input\n"


def fault_of(emu, body, *, smem=DESC, solo=True, config=None, patch=None) -> EmulatorFault:
    source = emu.kernel(body, buffers=BUFS, smem=smem, solo=solo)
    machine = emu.machine(source, config=config)
    if patch:
        patch(machine.program)
        machine.load(machine.program)
    with pytest.raises(EmulatorFault) as info:
        machine.run()
    return info.value


def assert_names_everything(fault: EmulatorFault, kind: str, instruction: str, core: int = 0):
    text = fault.render()
    assert fault.kind == kind
    assert f"fault [{kind}] at chip 0, core {core}, cycle " in text
    assert re.search(r"cycle \d+, pc 0x[0-9a-f]{4}", text)
    assert f"instruction: {instruction}" in text
    assert re.search(r"source: test\.s:\d+:\d+: ", text)
    assert fault.cycle >= 1000            # after the kernel launch
    return text


@pytest.mark.parametrize("body, instruction, message", [
    ("li s1, 4194300\nli s2, 512\nvld.w v1, 0(s1), s2, m0", "vld.w v1, 0(s1), s2, m0",
     "outside VMEM of 4194304 bytes"),
    ("li s1, -512\nli s2, 512\nvst.w v1, 0(s1), s2, m0", "vst.w v1, 0(s1), s2, m0", "outside VMEM"),
    ("li s2, 4194304\nli s3, 256\nli s4, 8388736\nmxu.ldw x0, -256(s2), s3, s4",
     "mxu.ldw x0, -256(s2), s3, s4", "outside VMEM"),
    ("lds s1, 65536(s0)", "lds s1, 65536(s0)", "outside SMEM of 65536 bytes"),
    ("li s1, -4\nsts s1, 0(s1)", "sts s1, 0(s1)", "outside SMEM"),
    ("li s1, @src\naddi s1, s1, 64\nli s2, 0\ndma.start vmem[s2], hbm[s1], s0, s0",
     "dma.start vmem[s2], hbm[s1], s0, s0", "HBM (DMA source) access [64, 4160) is outside HBM"),
    ("li s1, @src\nli s2, 4194000\ndma.start vmem[s2], hbm[s1], s0, s0",
     "dma.start vmem[s2], hbm[s1], s0, s0", "DMA destination VMEM [4194000, 4198096) is outside VMEM"),
    ("li s1, @src\nli s2, 65532\ndma.start vmem[s0], hbm[s1], s2, s0",
     "dma.start vmem[s0], hbm[s1], s2, s0", "descriptor at SMEM 65532 is outside SMEM"),
])
def test_out_of_bounds(emu, body, instruction, message):
    fault = fault_of(emu, body)
    assert message in assert_names_everything(fault, "out-of-bounds", instruction)


@pytest.mark.parametrize("high, shown", [("0x7fffffff", "[2^62, 2^62)"), ("0x80000000", "[-2^62, -2^62)"),
                                         ("0x3fffffff", "[4611686014132420608, 4611686014132424704)")])
def test_a_span_past_2_62_is_shown_cut_there_and_says_so(emu, high, shown):
    """(a far 64-bit address read [4611686018427387904, 4611686018427387904): the cut
    ends, as if they were the access's)"""
    fault = fault_of(emu, f"lui.d s1, {high}\nli s2, 512\nvld.w v1, 0(s1), s2, m0")
    text = assert_names_everything(fault, "out-of-bounds", "vld.w v1, 0(s1), s2, m0")
    assert f"VMEM access {shown} is outside VMEM of 4194304 bytes" in text
    assert ("its ends are shown cut there" in text) == ("2^62" in shown)


@pytest.mark.parametrize("remote", [False, True])
def test_a_semaphore_count_past_2_63_is_a_fault_not_a_wrap(emu, remote):
    """Two signals of 2^63 - 2^32 made the count negative: the run then deadlocked on a
    count nothing had lowered."""
    signal = "sem.signal.r s0, s1, s0" if remote else "sem.signal s0, s1"
    fault = fault_of(emu, f"lui.d s1, 0x7fffffff\nli s2, 1\n{signal}\n{signal}\nsem.wait s0, s2")
    text = assert_names_everything(fault, "bad-operand", signal)
    assert ("this signal adds 9,223,372,032,559,808,512 to semaphore 0, which holds 9,223,372,032,559,808,512: "
            "the sum passes the largest count, 2^63 - 1") in text
    assert "pc 0x0005" in text       # (the second signal, after SOLO's two lines)


def test_a_dma_landing_past_2_63_is_named_by_the_dma(emu):
    body = ("lui.d s1, 0x7fffffff\naddi.d s1, s1, 0x7fffffff\naddi.d s1, s1, 0x7fffffff\nsem.signal s0, s1\n"
            "li s5, @src\ndma.start vmem[s0], hbm[s5], s0, s0")
    text = assert_names_everything(fault_of(emu, body), "bad-operand", "dma.start vmem[s0], hbm[s5], s0, s0")
    assert "this DMA adds 4,096 to semaphore 0, which holds 9,223,372,036,854,775,806" in text


@pytest.mark.parametrize("body, instruction", [
    ("li s1, 2\nli s2, 512\nvld.w v1, 0(s1), s2, m0", "vld.w v1, 0(s1), s2, m0"),
    ("li s1, 512\nli s2, 6\nvst.w v1, 0(s1), s2, m0", "vst.w v1, 0(s1), s2, m0"),
    ("li s2, 256\nvld.bf16 v1, 1(s0), s2, m0", "vld.bf16 v1, 1(s0), s2, m0"),
    ("lds s1, 6(s0)", "lds s1, 6(s0)"),
])
def test_misaligned_access(emu, body, instruction):
    assert "not" in assert_names_everything(fault_of(emu, body), "misaligned", instruction)


def test_illegal_instruction_word_faults_when_reached(emu):
    def patch(program):
        program.kernels["main"].code[3] = 0x1FF << OPCODE_SHIFT | 5
    fault = fault_of(emu, "nop\nnop\n", patch=patch)
    text = assert_names_everything(fault, "illegal-instruction", f".word {0x1FF << OPCODE_SHIFT | 5:#018x}")
    assert "pc 0x0003" in text and "opcode 0x1ff" in text


def test_illegal_word_never_reached_is_harmless(emu):
    source = emu.kernel("jmp skip\nnop\nskip:\n")
    machine = emu.machine(source)
    machine.program.kernels["main"].code[3] = 0x1FF << OPCODE_SHIFT
    machine.load(machine.program)
    machine.run()


def test_operand_beyond_this_machine_is_illegal(emu):
    # x2 fits the 2-bit field but the test profile has two matrix units.
    fault = fault_of(emu, "mxu.push x2, v0, 0")
    assert "this machine has 2" in assert_names_everything(fault, "illegal-instruction", "mxu.push x2, v0, 0")


def test_semaphore_left_nonzero_at_halt(emu):
    fault = fault_of(emu, "li s1, 3\nli s2, 5\nsem.signal s1, s2")
    text = fault.render()
    assert fault.kind == "semaphore-nonzero"
    assert "chip 0, core 0, cycle" in text and "semaphore 3 = 5" in text


def test_semaphores_left_nonzero_on_several_cores_name_every_core(emu):
    # Every core of the test profile's chip signals itself and never waits: the fault is
    # the first core's, and its message names the others (it named only the first).
    fault = fault_of(emu, "rdsr s1, core\naddi s1, s1, 2\nli s2, 5\nsem.signal s1, s2", solo=False)
    assert fault.kind == "semaphore-nonzero" and (fault.chip, fault.core) == (0, 0)
    text = fault.render()
    assert "semaphore 2 = 5 (last raised" in text
    assert "other cores ended with semaphores raised too: chip 0 core 1 (semaphore 3 = 5)" in text


def test_dma_never_waited_for_leaves_its_semaphore_nonzero(emu):
    fault = fault_of(emu, "li s1, @src\nli s2, 2\ndma.start vmem[s0], hbm[s1], s0, s2")
    text = fault.render()
    assert fault.kind == "semaphore-nonzero" and "semaphore 2 = 4096" in text
    # ... naming the instruction that raised it, with its pc and source line.
    assert "last raised at cycle" in text and "by `dma.start vmem[s0], hbm[s1], s0, s2`" in text
    assert "pc 0x0004" in text and re.search(r"source: test\.s:\d+:\d+: dma.start", text)
    # The kernel ends when that DMA lands, after the core halted: the fault is at that
    # cycle, not before the raise it reports (it was at the halt).
    raised = int(re.search(r"last raised at cycle (\d+)", text).group(1))
    assert fault.cycle == raised


def test_deadlock_names_the_waiting_core_and_semaphore(emu):
    fault = fault_of(emu, "li s1, 3\nli s2, 1\nsem.wait s1, s2")
    text = assert_names_everything(fault, "deadlock", "sem.wait s1, s2")
    assert "chip 0 core 0 pc 0x0004 `sem.wait s1, s2` waits for semaphore 3 to reach 1 (it is 0)" in text


def test_deadlock_between_two_cores_lists_both(emu):
    fault = fault_of(emu, "rdsr s1, core\nli s2, 1\nsem.wait s1, s2", solo=False)
    assert fault.kind == "deadlock"
    assert "2 core(s) wait forever" in fault.message
    assert "chip 0 core 0" in fault.details[0] and "semaphore 0" in fault.details[0]
    assert "chip 0 core 1" in fault.details[1] and "semaphore 1" in fault.details[1]


def test_max_cycle_guard_stops_an_infinite_loop(emu):
    fault = fault_of(emu, "spin:\naddi s1, s1, 1\njmp spin", config=RunConfig(max_cycles=20_000))
    text = fault.render()
    assert fault.kind == "max-cycles" and "20000" in text
    assert "chip 0, core 0, cycle" in text and "instruction: " in text


def test_instruction_budget_stops_a_runaway_loop_at_its_source_line(emu):
    fault = fault_of(emu, "spin:\naddi s1, s1, 1\njmp spin", config=RunConfig(max_instructions=5_000))
    text = assert_names_everything(fault, "max-instructions", "")
    assert "ran 5,000 instructions in one launch" in text and "--max-instructions" in text
    assert re.search(r"source: test\.s:\d+:\d+: (addi s1, s1, 1|jmp spin)", text)


def test_the_default_instruction_budget_is_finite():
    assert RunConfig().max_instructions <= 10**8


SIGNAL_WAIT_LOOP = "li s2, 1\nspin:\nsem.signal s1, s2\nsem.wait s1, s2\njmp spin"


def test_a_loop_of_global_instructions_stops_at_its_share_of_the_budget(emu):
    # Each global instruction returns to Python (about a thousand local ones of wall
    # time): a core may run one per GLOBAL_SHARE of max_instructions, here 1,000.
    fault = fault_of(emu, SIGNAL_WAIT_LOOP, config=RunConfig(max_instructions=100_000))
    text = assert_names_everything(fault, "max-instructions", "sem.signal s1, s2")
    assert re.search(r"source: test\.s:\d+:\d+: sem\.signal s1, s2", text)
    assert ("this core ran 1,000 global instructions (DMA starts, semaphore waits and signals, barriers) "
            "in one launch without reaching a halt") in text
    assert "one global instruction per 100 of --max-instructions (100,000 here)" in text
    assert "raise --max-instructions if the kernel really needs more" in text


def test_the_default_budget_stops_a_signal_wait_loop_within_a_million_instructions(emu):
    # Deterministic, not by wall clock: the 500,001st global instruction faults (with the
    # ~1,500 local ones between, at 5-17 us of wall per global one: a few seconds).
    assert global_budget(RunConfig().max_instructions) == 500_000 and GLOBAL_SHARE == 100
    machine = emu.machine(emu.kernel(SIGNAL_WAIT_LOOP))
    with pytest.raises(EmulatorFault) as info:
        machine.run()
    assert info.value.kind == "max-instructions" and info.value.instruction == "sem.signal s1, s2"
    assert machine.cores[0].instructions == 3 + 250_000 * 3 + 1   # (solo, li, loops; the faulting one)


def test_a_dma_loop_on_another_core_is_named_by_its_dma_start(emu):
    body = ("rdsr s5, core\nbeq s5, s0, __end\nli s1, @src\nli s2, 4096\n"
            "spin:\ndma.start vmem[s0], hbm[s1], s0, s0\nsem.wait s0, s2\njmp spin")
    fault = fault_of(emu, body, solo=False, config=RunConfig(max_instructions=20_000))
    text = assert_names_everything(fault, "max-instructions", "dma.start vmem[s0], hbm[s1], s0, s0", core=1)
    assert "this core ran 200 global instructions" in text
    assert fault.pc == 4, text    # (rdsr, beq, li, li, then the loop)


@pytest.mark.parametrize("loops, faults", [(5, False), (6, True)])
def test_a_kernel_just_inside_the_global_budget_runs(emu, loops, faults):
    # max_instructions 1,000: 10 global instructions (halt is not counted), 2 a loop.
    body = (f"li s2, 1\nli s3, {loops}\nspin:\nsem.signal s1, s2\nsem.wait s1, s2\n"
            "addi s3, s3, -1\nbne s3, s0, spin")
    machine = emu.machine(emu.kernel(body), config=RunConfig(max_instructions=1_000))
    if not faults:
        machine.run()
        return
    with pytest.raises(EmulatorFault) as info:
        machine.run()
    assert info.value.kind == "max-instructions" and "ran 10 global instructions" in info.value.message
    assert info.value.instruction == "sem.signal s1, s2"     # the 11th: loop 6's signal


def test_a_tiny_instruction_budget_still_allows_one_global_instruction(emu):
    assert global_budget(1) == 1 and global_budget(199) == 1 and global_budget(200) == 2
    machine = emu.machine(emu.kernel("li s2, 1\nsem.signal s1, s2\nsem.wait s1, s2"),
                          config=RunConfig(max_instructions=150))
    with pytest.raises(EmulatorFault) as info:
        machine.run()
    assert info.value.instruction == "sem.wait s1, s2" and "ran 1 global instructions" in info.value.message


def test_max_cycle_guard_while_waiting_for_a_slow_dma(emu):
    fault = fault_of(emu, "li s1, @src\ndma.start vmem[s0], hbm[s1], s0, s0\nli s2, 4096\nsem.wait s0, s2",
                     config=RunConfig(max_cycles=1050))
    assert fault.kind == "max-cycles"


@pytest.mark.parametrize("engine_bw", ["1e-9", "1e-300"])
def test_a_dma_too_slow_to_land_in_64_bit_cycles_trips_the_guard_not_a_deadlock(emu, engine_bw):
    # 4096 bytes at 1e-18 bytes/cycle land after ~4e21 cycles, past int64 (at 1e-300 the
    # time is infinite): the run used to lose the flow and call it a deadlock with
    # "nothing in flight"; it stops at the max-cycle guard, naming the DMA.
    profile = emu.profile(f"slow_engine_{engine_bw}", f"[dma]\nengine_bw_bytes_per_s = {engine_bw}\n")
    source = emu.kernel("li s1, @src\ndma.start vmem[s0], hbm[s1], s0, s0\nli s2, 4096\nsem.wait s0, s2",
                        buffers=BUFS, smem=DESC)
    for max_cycles in (10**12, 2**62):
        with pytest.raises(EmulatorFault) as info:
            emu.machine(source, profile=profile, config=RunConfig(max_cycles=max_cycles)).run()
        text = assert_names_everything(info.value, "max-cycles", "dma.start vmem[s0], hbm[s1], s0, s0")
        assert f"max-cycle guard of {max_cycles} cycles, with this DMA still in flight" in text
        assert info.value.cycle > max_cycles


@pytest.mark.parametrize("body, instruction", [
    ("li s1, 7\ndiv s2, s1, s0", "div s2, s1, s0"),
    ("li s1, 7\nremi s2, s1, 0", "remi s2, s1, 0"),
])
def test_divide_by_zero(emu, body, instruction):
    assert "by zero" in assert_names_everything(fault_of(emu, body), "divide-by-zero", instruction)


def test_race_load_of_a_dma_destination_before_the_wait(emu):
    body = ("li s1, @src\nli s2, 8192\ndma.start vmem[s2], hbm[s1], s0, s0\nli s3, 512\n"
            "vld.w v1, 1024(s2), s3, m0\nli s4, 4096\nsem.wait s0, s4")
    text = assert_names_everything(fault_of(emu, body), "race", "vld.w v1, 1024(s2), s3, m0")
    assert "destination of a DMA that has not been waited for" in text
    assert "dma.start vmem[s2], hbm[s1], s0, s0" in text
    # Without the check the same program runs (and reads whatever is there).
    ran = emu.run(emu.kernel(body, buffers=BUFS, smem=DESC),
                  config=RunConfig(checks=frozenset({"semaphores"})))
    assert ran.result.dma_count == 1


def test_race_store_over_the_source_of_a_dma_in_flight(emu):
    body = ("li s2, 8192\nli s1, @src\ndma.start hbm[s1], vmem[s2], s0, s0\nli s3, 512\n"
            "vst.w v1, 0(s2), s3, m0\nli s4, 4096\nsem.wait s0, s4")
    assert "overwrites the source" in assert_names_everything(fault_of(emu, body), "race",
                                                              "vst.w v1, 0(s2), s3, m0")


def test_barrier_a_core_never_reaches(emu):
    body = "rdsr s1, core\nbne s1, s0, early\nbarrier chip\nearly:\nnop\nnop\nnop\nnop\n"
    fault = fault_of(emu, body, solo=False)
    text = fault.render()
    assert fault.kind == "barrier-not-reached"
    # The fault points at the barrier the others wait at, and names the core that skipped it.
    assert "at chip 0, core 0, cycle" in text and "instruction: barrier chip" in text
    assert "source: test.s:6:5: barrier chip" in text
    assert "chip 0 core 1 halted at cycle" in text and "without reaching this chip barrier" in text
    assert "which chip 0 core 0 waits at" in text


def test_barrier_reached_after_the_other_core_halted_is_a_deadlock(emu):
    body = "rdsr s1, core\nbeq s1, s0, late\njmp __end\nlate:\n" + "nop\n" * 8 + "barrier chip\n"
    fault = fault_of(emu, body, solo=False)
    assert fault.kind == "deadlock"
    assert "chip 0 core 0" in fault.details[0] and "waits at the chip barrier" in fault.details[0]


@pytest.mark.parametrize("body, kind", [
    ("li s1, 7\ndiv s2, s1, s0", "divide-by-zero"),
    ("li s1, 3\nli s2, 1\nsem.wait s1, s2", "deadlock"),
    ("lds s1, 65536(s0)", "out-of-bounds"),
    ("li s1, 3\nli s2, 5\nsem.signal s1, s2", "semaphore-nonzero"),
])
def test_cli_prints_the_fault_and_exits_non_zero(emu, tmp_path, capsys, body, kind):
    path = tmp_path / "bad.s"
    path.write_text(emu.kernel(body, buffers=BUFS, smem=DESC))
    assert main(["run", str(path), "--hw", "test", "--mesh", "1"]) == 1
    out, err = capsys.readouterr()
    assert f"fault [{kind}]" in err
    assert "Traceback" not in out + err


@pytest.mark.parametrize("body, instruction", [
    (SIGNAL_WAIT_LOOP, "sem.signal s1, s2"),        # the reproducer, on both cores
    ("spin:\nbarrier chip\njmp spin", "barrier chip"),
])
def test_cli_stops_a_loop_of_global_instructions_on_every_core(emu, tmp_path, capsys, body, instruction):
    path = tmp_path / "spin.s"
    path.write_text(emu.kernel(body, solo=False))
    assert main(["run", str(path), "--hw", "test", "--mesh", "1", "--max-instructions", "20000"]) == 1
    out, err = capsys.readouterr()
    assert "fault [max-instructions] at chip 0, core " in err and "ran 200 global instructions" in err
    assert f"instruction: {instruction}" in err and "spin.s:" in err and "Traceback" not in out + err


def test_cli_max_cycles_option(emu, tmp_path, capsys):
    path = tmp_path / "spin.s"
    path.write_text(emu.kernel("spin:\njmp spin"))
    assert main(["run", str(path), "--hw", "test", "--mesh", "1", "--max-cycles", "5000"]) == 1
    out, err = capsys.readouterr()
    assert "fault [max-cycles]" in err and "Traceback" not in out + err


def test_hbm_too_small_for_the_program_names_its_largest_buffers(tmp_path, capsys):
    src = tmp_path / "big.mk"
    src.write_text("kernel k(x: hbm f32[8, 128]) {\n    vmem a: f32[8, 128];\n    sem s;\n"
                   "    start copy(x, a, s);\n    wait copy(x, a, s);\n}\n"
                   "host {\n    input x: f32[8, 128];\n    input big: f32[1048576, 128];\n    launch k(x);\n}\n")
    assert main(["run", str(src), "--hw", "test", "--mesh", "1"]) == 1
    err = capsys.readouterr().err
    assert "fault [out-of-memory]" in err and "Traceback" not in err
    assert "'big' f32[1048576, 128] 536,870,912 bytes (declared at " in err and "profile 'test'" in err
    assert f"(declared at {src}:9)" in err     # (its `input` line)
    asm = tmp_path / "big.s"
    asm.write_text(".buffer x f32 8x128 input\n.buffer big f32 1048576x128 scratch\n.kernel main\n    halt\n")
    assert main(["run", str(asm), "--hw", "test", "--mesh", "1"]) == 1
    err = capsys.readouterr().err
    assert f"'big' f32[1048576, 128] 536,870,912 bytes (declared at {asm}:2)" in err and "Traceback" not in err
    # Found at load, before anything runs (docs/safety.md): no trace is written.
    trace = tmp_path / "big.mkt"
    assert main(["run", str(asm), "--hw", "test", "--mesh", "1", "--trace", str(trace)]) == 1
    assert "fault [out-of-memory]" in capsys.readouterr().err and not trace.exists()


def test_max_cycle_guard_below_the_launch_cost_says_so(emu):
    fault = fault_of(emu, "halt", config=RunConfig(max_cycles=10))
    assert fault.kind == "max-cycles"
    assert "max-cycle guard of 10 cycles (it counts from the start of the run, and a kernel launch alone takes" \
        in fault.render()


def test_a_launch_starting_past_the_guard_is_a_fault_even_past_64_bit_cycles(emu):
    # Two launches of 2^62 cycles each: the second would start past 2^63, which used to
    # overflow the core's int64 clock (OverflowError) instead of tripping the guard.
    profile = emu.profile("launch_2_62", "[launch]\nkernel_launch_cycles = 4611686018427387904\n")
    source = ".kernel main\n    halt\n.launch main\n.launch main\n"   # (the first halts at 2^62)
    with pytest.raises(EmulatorFault) as info:
        emu.machine(source, profile=profile, config=RunConfig(max_cycles=2**62)).run()
    text = assert_names_everything(info.value, "max-cycles", "halt")
    assert "pc 0x0000" in text and "max-cycle guard of 4611686018427387904 cycles" in text
    assert info.value.cycle == 2**63     # (one past the largest int64)


@pytest.mark.parametrize("shape", [
    "lui.d s3, 1\nli s4, 524416\nadd.d s3, s3, s4",     # (1 << 32) | 8 << 16 | 128: was read as 8x128
    "li s3, -1",
    "li s3, 128",                                        # no rows
])
def test_weight_tile_shape_counts_the_whole_register(emu, shape):
    for op in ("mxu.ldw", "mxu.ldwt"):
        fault = fault_of(emu, f"{shape}\nli s2, 256\n{op} x0, 0(s0), s2, s3")
        assert "weight tile shape" in assert_names_everything(fault, "bad-operand", f"{op} x0, 0(s0), s2, s3")
    fault = fault_of(emu, f"{shape}\nli s2, 64\nmxu.ldw.mx x0, 0(s0), s2, s3, s0")
    assert "weight tile shape" in assert_names_everything(fault, "bad-operand", "mxu.ldw.mx x0, 0(s0), s2, s3, s0")


def test_a_weight_tile_with_too_many_rows_is_told_the_rows_limit_too(emu):
    fault = fault_of(emu, "li s3, 8454272\nli s2, 256\nmxu.ldw x0, 0(s0), s2, s3")    # 129 << 16 | 128
    assert ("weight tile shape 129x128 does not fit the 128x128 matrix unit (rows must be 1 to 128, "
            "columns a multiple of 128 from 128 to 128)") in fault.message


def test_initial_smem_past_the_profile_is_an_error_at_load_not_a_traceback(emu):
    # assembled without the profile's SMEM size (the Python API): was a numpy broadcast
    # ValueError when the launch started
    with pytest.raises(EmulatorFault) as info:
        emu.machine(".kernel k\n  .smem 65532 1 2\n  halt\n")
    assert info.value.kind == "out-of-bounds"
    assert "kernel k: its initial SMEM words reach byte 65,540, past SMEM of 65,536 bytes" in info.value.render()
    with pytest.raises(EmulatorFault) as info:
        emu.machine(".kernel k\n  halt\n.launch k " + " ".join(["1"] * 16385) + "\n")
    assert "a launch of kernel k has 16385 arguments (65,540 bytes), past SMEM of 65,536 bytes" in info.value.render()
    emu.machine(".kernel k\n  .smem 65528 1 2\n  halt\n.launch k " + " ".join(["1"] * 16384) + "\n").run()


@pytest.mark.parametrize("body, pc, cycle", [
    ("div s1, s2, s0", 2, 1002),                         # (after the two-instruction solo prefix)
    ("li s2, 3\ndiv s3, s2, s2\ndiv s4, s2, s0", 4, 1007),   # waits for the divider (occupancy 4)
    ("li s1, 2\nli s2, 512\nvld.w v1, 0(s1), s2, m0", 4, 1004),
    ("vcol v1, v2, 16", 2, 1002),
    ("mark.pop", 2, 1002),
])
def test_a_fault_names_the_cycle_its_instruction_issued(emu, body, pc, cycle):
    # was one cycle later for every fault the issue loop found (a global instruction's
    # fault already named its issue cycle)
    fault = fault_of(emu, body)
    assert (fault.pc, fault.cycle) == (pc, cycle)
    assert f"cycle {cycle}, pc {pc:#06x}" in fault.render()


def test_the_first_fault_in_simulated_time_is_reported(emu):
    # Core 0 runs first (in the emulator's order) and, running ahead of the machine's clock,
    # finds its fault at a late cycle; core 1's fault comes earlier in simulated time and is
    # the one reported, whatever order the emulator ran the cores in.
    body = ("rdsr s1, core\nbne s1, s0, early\nli s4, 200\nspin:\naddi s4, s4, -1\nbne s4, s0, spin\n"
            "div s2, s1, s0\njmp __end\nearly:\nli s3, 7\ndiv s2, s3, s0\n")
    fault = fault_of(emu, body, solo=False)
    assert (fault.kind, fault.core) == ("divide-by-zero", 1), fault.render()
    assert fault.instruction == "div s2, s3, s0" and fault.cycle < 1100   # (the launch takes 1000)


def test_a_wall_time_guard_stops_the_run_as_soon_as_it_trips(emu):
    # max-instructions guards wall time, so it is raised when found, not when simulated
    # time gets there: here core 1's runaway loop trips it although core 0's fault (found
    # first, queued for its cycle) comes earlier in simulated time. (Otherwise every core
    # of an SPMD program that never ends would run its whole budget out first.)
    body = "rdsr s1, core\nbne s1, s0, spin\nli s3, 7\ndiv s2, s3, s0\nspin:\naddi s4, s4, 1\njmp spin\n"
    fault = fault_of(emu, body, solo=False, config=RunConfig(max_instructions=1000))
    assert (fault.kind, fault.core) == ("max-instructions", 1), fault.render()


def test_a_barrier_skipped_by_several_cores_names_each_that_halted(emu):
    # Cores 1 and 2 halt before anyone reaches the chip barrier, core 0 waits there, then
    # core 3 halts: the fault names core 3 and the two that had halted before.
    profile = emu.profile("four", "[chip]\ncores_per_chip = 4\n")
    body = ("rdsr s1, core\nli s5, 1\nbeq s1, s5, __end\nli s5, 2\nbeq s1, s5, __end\nli s5, 3\nbeq s1, s5, late\n"
            + "nop\n" * 4 + "barrier chip\njmp __end\nlate:\n" + "nop\n" * 20)
    machine = emu.machine(emu.kernel(body, solo=False), profile=profile)
    with pytest.raises(EmulatorFault) as info:
        machine.run()
    fault = info.value
    assert fault.kind == "barrier-not-reached" and fault.instruction == "barrier chip"
    assert "chip 0 core 3 halted at cycle" in fault.message and "which chip 0 core 0 waits at" in fault.message
    for core in (1, 2):
        assert re.search(rf"chip 0 core {core} halted at cycle \d+ without reaching it too", fault.message)


def test_a_member_reaching_the_barrier_in_the_halts_cycle_is_named_among_the_waiters(emu):
    # Core 2 halts at cycle 1013 without the chip barrier; core 3 reaches it in that same
    # cycle, but runs after core 2 there. It was left out of the waiters.
    profile = emu.profile("four", "[chip]\ncores_per_chip = 4\n")
    body = ("rdsr s1, core\nli s5, 2\nbeq s1, s5, skip\nli s5, 3\nbeq s1, s5, late\nbarrier chip\njmp __end\n"
            "late:\n" + "nop\n" * 8 + "barrier chip\njmp __end\nskip:\n" + "nop\n" * 10)
    machine = emu.machine(emu.kernel(body, solo=False), profile=profile)
    with pytest.raises(EmulatorFault) as info:
        machine.run()
    fault = info.value
    assert fault.kind == "barrier-not-reached" and fault.cycle == 1013, fault.render()
    assert "chip 0 core 2 halted at cycle 1013" in fault.message
    assert "which chip 0 core 0, chip 0 core 1, chip 0 core 3 wait at" in fault.message, fault.message


@pytest.mark.parametrize("wait", [False, True], ids=["descriptor still being written", "waited for"])
def test_a_dma_descriptor_a_dma_in_flight_still_writes_is_a_race(emu, wait):
    # The descriptor at SMEM 32 is valid before the copy that overwrites it lands: issuing
    # a DMA with it then used the stale descriptor silently (the descriptor read was the
    # one SMEM read not checked against the DMAs in flight). Waiting first is clean.
    smem = "0 28 1 0 0 1 0 0\n32 4096 1 0 0 1 0 0"
    body = ("li s1, @src\nli s2, 32\ndma.start smem[s2], hbm[s1], s0, s0\nli s4, 28\n"
            + ("sem.wait s0, s4\n" if wait else "")
            + "li s5, 8192\nli s3, 1\ndma.start vmem[s5], hbm[s1], s2, s3\n"
            + ("" if wait else "sem.wait s0, s4\n") + "li s6, 4096\nsem.wait s3, s6")
    source = emu.kernel(body, buffers=".buffer src i32 8x128 input\n", smem=smem)
    src = np.zeros((8, 128), np.int32)
    src[0, :7] = (4096, 1, 0, 0, 1, 0, 0)
    machine = emu.machine(source, inputs={"src": src})
    if wait:
        machine.run()
        return
    with pytest.raises(EmulatorFault) as info:
        machine.run()
    text = assert_names_everything(info.value, "race", "dma.start vmem[s5], hbm[s1], s2, s3")
    assert "this DMA's descriptor at SMEM [32, 60) reads the destination of a DMA" in text
    assert "`dma.start smem[s2], hbm[s1], s0, s0`" in text


@pytest.mark.parametrize("latency", ["addi s2, s2, 1", "vexp.f32 v1, v1"])
def test_the_max_cycle_guard_passed_by_local_instructions_names_the_cycle_past_it(emu, latency):
    # (It named the core's clock before the instruction, which could lie below the guard.)
    body = f"li s1, 100000\nloop:\n{latency}\naddi s1, s1, -1\nbne s1, s0, loop\nhalt"
    fault = fault_of(emu, body, config=RunConfig(max_cycles=1500))
    assert fault.kind == "max-cycles" and fault.cycle > 1500, fault.render()


def test_a_fault_in_a_kernel_launched_twice_says_which_launch(tmp_path, capsys):
    program = tmp_path / "two.mk"
    program.write_text("""\
kernel k(x: hbm i32[8, 128], n: i32) {
    var q: i32 = 5 / n;
}
kernel once(x: hbm i32[8, 128]) {
    var q: i32 = 1;
}
host {
    input x: i32[8, 128];
    launch k(x, 1);
    launch once(x);
    launch k(x, 0);
}
""")
    assert main(["run", str(program), "--hw", "test", "--mesh", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fault [divide-by-zero]")
    assert err.rstrip().endswith(f"in kernel k's launch 2 of 2 (the host block's launch 3 of 3), "
                                 f"launched at {program}:11:5")


def test_a_fault_in_a_generic_instance_launched_twice_names_the_faulting_launch(tmp_path, capsys):
    # The instance's context names the launch that made it; the fault names its own.
    program = tmp_path / "gen.mk"
    program.write_text("""\
kernel k<C>(x: hbm i32[8, C], n: i32) {
    var q: i32 = 5 / n;
}
host {
    input x: i32[8, 128];
    launch k(x, 1);
    launch k(x, 0);
}
""")
    assert main(["run", str(program), "--hw", "test", "--mesh", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fault [divide-by-zero]") and "Traceback" not in err
    assert f"launched at {program}:6:5" in err      # (the instance's)
    assert err.rstrip().endswith(f"in kernel k<128>'s launch 2 of 2 (the host block's launch 2 of 2), "
                                 f"launched at {program}:7:5")


def test_a_fault_in_an_assembler_kernel_launched_twice_names_its_launch_line(tmp_path, capsys):
    program = tmp_path / "two.s"
    program.write_text(".kernel k\n    li s1, 5\n    lds s2, 0(s0)\n    div s3, s1, s2\n    halt\n"
                       ".launch k 1\n.launch k 0\n")
    assert main(["run", str(program), "--hw", "test", "--mesh", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fault [divide-by-zero]") and "Traceback" not in err
    assert err.rstrip().endswith(f"(the host block's launch 2 of 2), launched at {program}:7:1")


def test_a_signal_in_flight_past_the_guard_is_a_max_cycles_fault_naming_it(emu):
    # (it was an AttributeError: the signal's sender was read as a core, not its place)
    profile = emu.profile("slow_signal", "[chip]\nsibling_signal_latency_cycles = 10_000\n")
    source = emu.kernel("li s1, 1\nli s2, 1\nsem.signal.r s0, s2, s1\nsem.wait s0, s2", solo=False)
    machine = emu.machine(source, profile=profile, config=RunConfig(max_cycles=5000))
    with pytest.raises(EmulatorFault) as info:
        machine.run()
    text = assert_names_everything(info.value, "max-cycles", "sem.signal.r s0, s2, s1")
    assert "the run passed the max-cycle guard of 5000 cycles, with this signal still in flight" in text


def test_a_runaway_fault_names_the_loop_it_is_in(emu, tmp_path, capsys):
    # issue 12: "a fault naming the loop's source line": the loop header, beside the
    # line of the instruction where the budget ran out (inside the loop's body).
    path = tmp_path / "runaway.mk"
    path.write_text("kernel k(a: hbm f32[8, 128]) {\n    var c: i32 = 0;\n    for i in 0..4 {\n"
                    "        for j in 0..2147483647 {\n            c = c + 1;\n        }\n    }\n}\n")
    assert main(["run", str(path), "--hw", "test", "--mesh", "1", "--max-instructions", "5000"]) == 1
    out, err = capsys.readouterr()
    assert "fault [max-instructions]" in err and "source: " in err and "Traceback" not in out + err
    assert "; the loop it is in: " in err and "runaway.mk:4:9: for j in 0..2147483647 {" in err
    # A .s loop: the line of its backward branch; a loop of global instructions too.
    fault = fault_of(emu, "spin:\naddi s1, s1, 1\njmp spin", config=RunConfig(max_instructions=5_000))
    assert re.search(r"; the loop it is in: test\.s:\d+:\d+: jmp spin$", fault.message)
    fault = fault_of(emu, SIGNAL_WAIT_LOOP, config=RunConfig(max_instructions=100_000))
    assert re.search(r"; the loop it is in: test\.s:\d+:\d+: jmp spin$", fault.message)
