"""A loaded program on a machine: what `mkemu run` and program drivers work with.

A driver (a reference function marked `mkemu_driver = True`, e.g. the K3 decode
driver) takes over a run: it writes inputs, runs the launch sequence as often as it
likes (HBM persists between runs, so model state carries over), reads outputs and
checks them. It sees only this interface, never the emulator's internals, so the
numpy side stays independent of the emulator.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from mkemu.errors import ConfigError, shown
from mkemu.runner import as_array, check_values, from_storage, is_chip, to_storage, widened


@attrs.frozen
class MachineInfo:
    """What a driver may know about the machine it runs on."""

    hw: str
    chips: int
    cores_per_chip: int
    mesh: tuple[int, int, int]
    clock_hz: float
    hbm_bw_bytes_per_s: float          # per chip
    dma_engine_bw_bytes_per_s: float   # per core
    hop_latency_s: float
    kernel_launch_s: float
    dma_start_latency_s: float
    far_path_s: float                  # the longest core-to-core path latency of the machine

    @property
    def cores(self) -> int:
        return self.chips * self.cores_per_chip


def machine_info(profile, mesh) -> MachineInfo:
    p = profile
    far_cycles = mesh.longest_path_cycles(p)
    return MachineInfo(
        hw=p.name, chips=mesh.num_chips, cores_per_chip=p.cores_per_chip,
        mesh=tuple(mesh.dims), clock_hz=p.clock_hz,
        hbm_bw_bytes_per_s=p.hbm_bw_bytes_per_cycle * p.clock_hz,
        dma_engine_bw_bytes_per_s=p.dma_engine_bw_bytes_per_cycle * p.clock_hz,
        hop_latency_s=p.cycles_to_seconds(p.hop_latency_cycles),
        kernel_launch_s=p.cycles_to_seconds(p.kernel_launch_cycles),
        dma_start_latency_s=p.cycles_to_seconds(p.dma_start_latency_cycles),
        far_path_s=p.cycles_to_seconds(far_cycles))


class Session:
    def __init__(self, machine, program, profile, recorder=None):
        self._machine = machine
        self.recorder = recorder           # the trace recorder, if the run records one
        self.program = program
        self.info = machine_info(profile, machine.mesh)
        self.launches_per_run = len(program.launches)
        self._last = None

    def buffers(self) -> dict[str, tuple[str, tuple[int, ...], str]]:
        """name -> (dtype, shape, kind) of every HBM buffer."""
        return {b.name: (b.dtype, b.shape, b.kind) for b in self.program.buffers}

    def write(self, name: str, array, chip: int | None = None) -> None:
        """Write an HBM buffer (bf16 buffers take float arrays of bf16 values, or an object
        whose `bf16_bits` holds the bit patterns (uint16) as they are; MXFP4 ones float
        arrays that are quantised) on one or every chip."""
        buf = self._buffer(name)
        bits = getattr(array, "bf16_bits", None) if buf.dtype == "bf16" else None
        if bits is not None:
            # Bit patterns go in as they are: no widening to float32 and rounding back.
            array = as_array(bits, f"buffer {name}: bf16_bits", key=name)
            if array.dtype != np.uint16:
                raise ConfigError(f"buffer {name}: bf16_bits must be uint16, got {array.dtype}", key=name)
        given = as_array(array, f"buffer {name}", key=name)
        values = widened(given)
        if values.shape != buf.shape and values.size == int(np.prod(buf.shape)):
            # Stacked tensors may be declared with leading dimensions merged (e.g.
            # [layers, heads, a, b] as [layers*heads, a, b]): same bytes, row-major.
            values = values.reshape(buf.shape)
        if values.shape != buf.shape:
            raise ConfigError(f"buffer {name}: got shape {values.shape}, the program declares {buf.shape}",
                              key=name)
        if bits is None:
            check_values(name, buf.dtype, values, given=given.dtype)
        # (MXFP4: its bytes, values then scales)
        data = values if bits is not None else to_storage(values, buf.dtype)
        if chip is not None:
            self._check_chip(chip, name)
        if chip is None:
            self._machine.write_buffer_all(name, data)
        else:
            self._machine.write_buffer(chip, name, data)

    def read(self, name: str, chip: int = 0) -> np.ndarray:
        buf = self._buffer(name)
        self._check_chip(chip, name)
        try:
            return from_storage(self._machine.read_buffer(chip, name), buf.dtype, buf.shape)
        except ValueError as exc:   # a timing-only run holds no data in it
            raise ConfigError(str(exc), key=name) from None

    def holds_data(self, name: str) -> bool:
        """Does buffer `name` keep its bytes (every one does, except in a timing-only run,
        where only the i32 ones do)?"""
        return self._machine.holds_data(name)

    def _check_chip(self, chip, name: str) -> None:
        if not is_chip(chip, self.info.chips):
            raise ConfigError(f"buffer {name}: chip must be 0..{self.info.chips - 1}, not {shown(chip)}", key=name)

    @property
    def timing_only(self) -> bool:
        """True when nothing is computed (only SMEM and i32 buffers hold data)."""
        return self._machine.config.timing_only

    def feed_readbacks(self, values, core: int | None = None) -> None:
        """For the next run of a timing-only session: the values the reads of data into
        scalars take, in order, on core `core` (a global core id), or on every core."""
        if core is not None and not is_chip(core, len(self._machine.cores)):
            raise ConfigError(f"core must be a global core id 0..{len(self._machine.cores) - 1}, not {shown(core)}",
                              key="core")
        cores = self._machine.cores if core is None else [self._machine.cores[core]]
        values = _readback_values(values)
        self._check_timing_only("feed_readbacks", "values its reads of data into scalars take")
        for c in cores:
            c.feed_readbacks(values)

    def _check_timing_only(self, method: str, what: str) -> None:
        """Feeding is for a timing-only session; a data session computes what it would feed
        (and would silently ignore it)."""
        if not self.timing_only:
            raise ConfigError(f"{method} is for a timing-only session: this one computes the {what} "
                              "(build the kernel with timing_only=True to replay them)", key="timing_only")

    def take_readbacks(self) -> list[list[int]]:
        """Per core, the values it read back into scalars since the last call (a run
        whose options record them)."""
        return [core.take_readbacks().tolist() for core in self._machine.cores]

    def take_payloads(self) -> list[list[bytes]]:
        """Per core, the computed bytes its DMAs moved into SMEM or i32 buffers since
        the last call (a run whose options record them)."""
        out = self._machine.payloads_out
        self._machine.payloads_out = [[] for _ in out]
        return out

    def feed_payloads(self, payloads: list[list[bytes]]) -> None:
        """For the next run of a timing-only session: per core, the bytes its DMAs of
        computed data into SMEM or i32 buffers move, in order."""
        cores = len(self._machine.cores)
        if isinstance(payloads, (str, bytes)) or not isinstance(payloads, Sequence) or len(payloads) != cores or any(
                isinstance(p, (str, bytes)) or not isinstance(p, Sequence)
                or not all(isinstance(b, (bytes, bytearray, memoryview)) for b in p) for p in payloads):
            raise ConfigError(f"payloads must be a list of {cores} lists (one per core, by global core id) of "
                              "bytes", key="payloads")
        self._check_timing_only("feed_payloads", "bytes its DMAs of data into SMEM or i32 buffers move")
        self._machine.payloads_in = [[bytes(b) for b in p] for p in payloads]
        self._machine.payloads_fed = True

    def run(self) -> dict:
        """Run the launch sequence once; figures of this run alone (not cumulative)."""
        result = self._machine.run().to_json()
        last, self._last = self._last, result
        if last is None:
            return result
        delta = _delta(result, last)
        delta["launch_cycles"] = result["launch_cycles"][len(last["launch_cycles"]):]
        delta["per_core"] = [_delta(now, then, keep=("chip", "core"))
                             for now, then in zip(result["per_core"], last["per_core"])]
        return delta

    def _buffer(self, name: str):
        try:
            return self.program.buffer(name)
        except KeyError:
            known = ", ".join(sorted(b.name for b in self.program.buffers))
            raise ConfigError(f"the program has no HBM buffer {name!r} (it has: {known})", key=name) from None


def _delta(now: dict, then: dict, keep: tuple[str, ...] = ()) -> dict:
    """Counters of `now` minus those of `then` (numbers and dicts of numbers; the rest,
    and the keys in `keep`, as in `now`)."""
    out = {}
    for key, value in now.items():
        before = then.get(key)
        if key in keep:
            out[key] = value
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value - before
        elif isinstance(value, dict) and all(isinstance(v, (int, float)) for v in value.values()):
            out[key] = {k: v - before.get(k, 0) for k, v in value.items()}
        else:
            out[key] = value
    return out


def _readback_values(values) -> np.ndarray:
    """The values reads back into scalars take: a list of integers (64-bit registers)."""
    problem = "a list of integers"
    try:
        array = np.asarray(values)
        if array.ndim == 1 and (array.dtype.kind in "iu" or array.size == 0 and array.dtype.kind == "f"):
            if array.dtype.kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:
                problem = "integers of at most 64 bits"
            else:
                return array.astype(np.int64)
    except (TypeError, ValueError, OverflowError):
        pass
    raise ConfigError(f"readback values must be {problem} (each read back into a 64-bit register), not "
                      f"{shown(values, 80)}", key="values")
