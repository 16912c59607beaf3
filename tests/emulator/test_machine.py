"""The machine as a whole: what it refuses to build."""

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

