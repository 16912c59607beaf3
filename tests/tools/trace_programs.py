"""Small `.s` programs run with a trace recorder, for the trace tool tests.

`record(source)` assembles the text, runs it on the `test` profile (1 GHz, 64
bytes/cycle of HBM, 32 per DMA engine) on a 1x1x1 mesh with a `Recorder`, and
returns the run result, the trace bytes and the trace read back.
"""

from __future__ import annotations

import textwrap

import attrs

from mkemu.emulator.machine import Machine, RunResult
from mkemu.emulator.topology import Mesh
from mkemu.emulator.trace import Recorder
from mkemu.isa.asm import assemble
from mkemu.isa.hardware import load_profile
from mkemu.tools.trace_reader import Trace, parse_trace

# Both cores copy the same 64 KiB HBM buffer into VMEM 8 times, issuing every DMA
# before waiting: the two 32 B/cycle engines keep the 64 B/cycle HBM full.
DMA_BOUND = """
.buffer a f32 128x128 input
.kernel main
    .smem 0 65536 1 0 0 1 0 0
    li s1, @a
    li s2, 0
    li s3, 0
    li s4, 0
    li s5, 8
    li s7, 65536
    mark.push 0, s0
loop:
    dma.start vmem[s2], hbm[s1], s3, s4
    add s2, s2, s7
    addi s5, s5, -1
    bne s5, s0, loop
    mark.pop
    li s6, 524288
    sem.wait s4, s6
    halt
"""
DMA_BOUND_BYTES_PER_CORE = 8 * 65536

# One weight tile, then N rounds of 4 MACs on 4 accumulators: each MAC occupies
# mxu0 8 cycles and waits only for the unit (its accumulator was last written 32
# cycles before, latency 16), so mxu0 is busy back to back.
MXU_ROUNDS = 50
MXU_BOUND = f"""
.kernel main
    li s1, 256
    li s2, 8388736
    mxu.ldw x0, 0(s0), s1, s2
    li s5, {MXU_ROUNDS}
    li s3, 3
    mark.push 1, s3
loop:
    mxu.mac x0, a0, 0
    mxu.mac x0, a1, 0
    mxu.mac x0, a2, 0
    mxu.mac x0, a3, 0
    addi s5, s5, -1
    bne s5, s0, loop
    mark.pop
    halt
"""


@attrs.frozen
class Recorded:
    machine: Machine
    result: RunResult
    data: bytes
    trace: Trace


def record(source: str, regions: tuple[str, ...] = (), mesh=(1, 1, 1)) -> Recorded:
    program = assemble(textwrap.dedent(source), "test.s")
    if regions:
        kernels = {n: attrs.evolve(k, regions=regions) for n, k in program.kernels.items()}
        program = attrs.evolve(program, kernels=kernels)
    recorder = Recorder()
    machine = Machine(load_profile("test"), Mesh(mesh), trace=recorder)
    machine.load(program)
    result = machine.run()
    data = recorder.to_bytes()
    return Recorded(machine, result, data, parse_trace(data, "test.mkt"))

