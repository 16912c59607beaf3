"""Audit err2: a DMA too slow to finish before the max-cycle guard is a `max-cycles`
fault at the first cycle past the guard, saying how late the DMA would be; it used to
name cycle 2^62 + 1, the flow model's stand-in for "never", a cycle no run reaches."""

from __future__ import annotations

import pytest

import mkemu
from mkemu.cli import main
from mkemu.errors import EmulatorFault
from mkemu.isa.hardware import load_profile

FAR = str(2**62 + 1)
COPY = "dma.start vmem[s0], hbm[s1], s0, s0"
# One 4096-byte copy from HBM (descriptor: 4096 bytes, one row), waited for.
SOURCE = (".buffer src f32 8x128 input\n.kernel main\n.smem 0 4096 1 0 0 1 0 0\n"
          f"li s1, @src\n{COPY}\nli s2, 4096\nsem.wait s0, s2\nhalt\n")


def slow_profile(tmp_path, engine_bw: str) -> str:
    path = tmp_path / f"engine_{engine_bw}.toml"
    path.write_text(f'extends = "test"\n[dma]\nengine_bw_bytes_per_s = {engine_bw}\n')
    return str(path)


def fault_of(tmp_path, engine_bw: str, max_cycles: int) -> EmulatorFault:
    kernel = mkemu.compile_source(SOURCE, "slow.s", hw=slow_profile(tmp_path, engine_bw), mesh="1",
                                  max_cycles=max_cycles)
    with pytest.raises(EmulatorFault) as info:
        kernel()
    return info.value


@pytest.mark.parametrize("engine_bw", ["1e-30", "1e-300"])
@pytest.mark.parametrize("max_cycles", [20_000, 10**12, 2**62])
def test_a_dma_that_never_lands_faults_at_the_first_cycle_past_the_guard(tmp_path, engine_bw, max_cycles):
    fault = fault_of(tmp_path, engine_bw, max_cycles)
    assert fault.kind == "max-cycles" and fault.cycle == max_cycles + 1
    assert (fault.chip, fault.core, fault.instruction) == (0, 0, COPY) and fault.source.startswith("slow.s:5:1: ")
    assert fault.message == (f"kernel main: the run passed the max-cycle guard of {max_cycles} cycles, with this "
                             "DMA still in flight: at the profile's bandwidths it would not finish within 2^62 cycles")


def test_a_dma_that_lands_past_the_guard_says_when(tmp_path):
    # 4096 bytes at 1e-3 bytes/cycle: 4,096,000 cycles, past a guard of 100,000.
    fault = fault_of(tmp_path, "1e6", 100_000)
    assert fault.kind == "max-cycles" and fault.cycle == 100_001 and fault.instruction == COPY
    finish = int(fault.message.rpartition("before cycle ")[2])
    assert 4_096_000 < finish < 4_200_000
    assert "with this DMA still in flight: at the profile's bandwidths it would not finish before cycle" \
        in fault.message


def test_the_cli_names_a_cycle_the_run_reached(tmp_path, capsys):
    hw = slow_profile(tmp_path, "1e-30")
    assert load_profile(hw).dma_engine_bw_bytes_per_cycle > 0     # (accepted: the run's guard stops it)
    assert main(["run", "vector_add", "--hw", hw, "--mesh", "1"]) == 1
    out, err = capsys.readouterr()
    assert err.startswith("fault [max-cycles] at chip 0, core 0, cycle 1000000000001, pc ")
    assert "would not finish within 2^62 cycles" in err and "instruction: dma.start" in err
    assert FAR not in err and "Traceback" not in out + err
