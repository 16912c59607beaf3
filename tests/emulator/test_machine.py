"""The machine as a whole: what it refuses to build, and the run's figures."""

from __future__ import annotations

import attrs
import pytest

from mkemu.emulator import machine as machine_module
from mkemu.emulator.machine import Machine
from mkemu.emulator.topology import Mesh
from mkemu.errors import ConfigError
from mkemu.isa.hardware import load_profile


def test_more_cores_than_the_emulator_takes_is_refused_before_any_core_is_built(monkeypatch):
    built = []
    monkeypatch.setattr(machine_module, "Core", lambda *args: built.append(args))
    profile = attrs.evolve(load_profile("tpu-v7-like"), cores_per_chip=16)
    with pytest.raises(ConfigError) as info:
        Machine(profile, Mesh((16, 16, 4)))
    assert info.value.key == "mesh" and built == []
    assert info.value.message == (
        "1,024 chips of 16 cores (profile 'tpu-v7-like') are 16,384 cores; the emulator takes at most 4,096 in one "
        "machine (each keeps about 3 MB of host memory: these would need about 52 GB)")


OPEN_AT_HALT = """\
.kernel main
    mark.push 1, s0
    li s1, 1
    mark.push 2, s0
    li s2, 2
    li s3, 3
    mark.push 4, s0
    mark.pop
    li s4, 4
    halt
"""


def test_regions_a_kernel_leaves_open_end_at_its_halt_in_the_run_s_figures_as_in_its_trace():
    # (regions 1 and 2 are open at the halt, 4 cycles after region 1 opened: they were
    # missing from the run's figures while its trace counted them)
    import mkemu

    run = mkemu.compile_source(OPEN_AT_HALT, "open.s", hw="test", mesh="1")()
    figures = {key: run.report.figures[key] for key in ("region_cycles", "region_own_cycles", "region_entries")}
    assert figures == {"region_cycles": {"region1": 8, "region2": 6, "region4": 0},       # (2 cores)
                       "region_own_cycles": {"region1": 2, "region2": 6, "region4": 0},
                       "region_entries": {"region1": 2, "region2": 2, "region4": 2}}
