"""Running small assembly kernels on the emulator and reading back its state.

`emu.run(source)` assembles a `.s` text, loads it on a 1x1x1 mesh of the `test`
profile (or another profile), writes the given input buffers and runs it; the
returned `Ran` gives the machine, the result and core 0's registers and memories.
`emu.run_vec(body, vregs=[...])` first puts the given (8, 128) arrays into v0, v1,
... (through HBM, a DMA into VMEM and `vld.w`), so a test can exercise one
instruction on known data with a few lines of assembly.
"""

from __future__ import annotations

import textwrap

import attrs
import numpy as np
import pytest

from mkemu.emulator.config import RunConfig
from mkemu.emulator.core import Core
from mkemu.emulator.machine import Machine, RunResult
from mkemu.emulator.topology import Mesh
from mkemu.isa.asm import assemble
from mkemu.isa.hardware import HardwareProfile, load_profile
from mkemu.runner import to_storage

# Where run_vec stages its inputs in VMEM: far from the low addresses tests use.
STAGE_VMEM = 0x200000
TILE_BYTES = 8 * 128 * 4
# Core 1 of the test profile halts at once unless a test wants both cores.
SOLO = "    rdsr s31, core\n    bne s31, s0, __end\n"


@attrs.frozen
class Ran:
    machine: Machine
    result: RunResult

    @property
    def core(self) -> Core:
        return self.machine.cores[0]

    def buffer(self, name: str, chip: int = 0) -> np.ndarray:
        return self.machine.read_buffer(chip, name)

    def vmem(self, addr: int, count: int, dtype=np.float32) -> np.ndarray:
        size = np.dtype(dtype).itemsize
        return self.core.vmem[addr:addr + count * size].view(dtype).copy()


class Emu:
    STAGE_VMEM = STAGE_VMEM
    TILE_BYTES = TILE_BYTES

    def __init__(self, tmp_dir):
        self.tmp_dir = tmp_dir
        self.profiles: dict[str, HardwareProfile] = {"test": load_profile("test")}

    def profile(self, name: str = "test", toml: str | None = None) -> HardwareProfile:
        """A shipped profile, or (with `toml`) a user file extending `test` saved as `name`."""
        if name not in self.profiles:
            path = self.tmp_dir / f"{name}.toml"
            path.write_text('extends = "test"\n' + textwrap.dedent(toml or ""))
            self.profiles[name] = load_profile(str(path))
        return self.profiles[name]

    def machine(self, source: str, *, profile: HardwareProfile | str = "test",
                config: RunConfig | None = None, inputs: dict | None = None,
                filename: str = "test.s") -> Machine:
        if isinstance(profile, str):
            profile = self.profile(profile)
        program = assemble(source, filename)
        machine = Machine(profile, Mesh((1, 1, 1)), config or RunConfig())
        machine.load(program)
        for name, array in (inputs or {}).items():
            machine.write_buffer(0, name, to_storage(array, program.buffer(name).dtype))
        return machine

    def run(self, source: str, **kwargs) -> Ran:
        machine = self.machine(source, **kwargs)
        return Ran(machine, machine.run())

    def kernel(self, body: str, *, buffers: str = "", smem: str = "", solo: bool = True) -> str:
        """A one-kernel program: `body` (indented as you like) then halt at `__end`."""
        head = ".kernel main\n" + "".join(f"    .smem {line}\n" for line in smem.splitlines() if line.strip())
        return (textwrap.dedent(buffers) + head + (SOLO if solo else "")
                + textwrap.indent(textwrap.dedent(body), "    ") + "\n__end:\n    halt\n")

    def run_vec(self, body: str, vregs=(), smem: str = "", **kwargs) -> Ran:
        """Load `vregs` (raw 32-bit contents, (8, 128) each) into v0.., clear s1..s3, run body."""
        n = len(vregs)
        stage = ""
        inputs = {}
        buffers = ""
        if n:
            bits = np.stack([np.asarray(v).view(np.int32).reshape(8, 128) for v in vregs])
            inputs = {"inp": bits}
            buffers = f".buffer inp i32 {n}x8x128 input\n"
            smem = f"0 {n * TILE_BYTES} 1 0 0 1 0 0\n" + smem
            stage = (f"li s1, @inp\nli s2, {STAGE_VMEM}\ndma.start vmem[s2], hbm[s1], s0, s0\n"
                     f"li s3, {n * TILE_BYTES}\nsem.wait s0, s3\nli s3, 512\n"
                     + "".join(f"vld.w v{i}, {i * TILE_BYTES}(s2), s3, m0\n" for i in range(n))
                     + "li s1, 0\nli s2, 0\nli s3, 0\n")
        source = self.kernel(stage + textwrap.dedent(body), buffers=buffers, smem=smem)
        return self.run(source, inputs=inputs, **kwargs)


@pytest.fixture(scope="session")
def emu(tmp_path_factory) -> Emu:
    return Emu(tmp_path_factory.mktemp("profiles"))

