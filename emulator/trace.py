"""Trace recording: what every core, DMA engine and link did, cycle by cycle.

A `Recorder` handed to `Machine(..., trace=recorder)` collects, per launch:
every instruction issue (core, pc, issue cycle, cycles stalled on its unit and on
its operands), semaphore and barrier waits, semaphore signals, every DMA (issue,
begin, end, bytes, memories, chips and cores, the flow resources it crossed and
its rate over time), and source regions (`mark.push`/`mark.pop`). Events go into
flat lists of ints (instructions: 4 per issue, moved into int64 numpy chunks
every million values), not objects per event, and become numpy columns when the
trace is serialised. Unit, latency and occupancy are not stored per event: they
are per pc in the kernel table of the trace metadata.

Recording off costs one `is not None` test per machine event and nothing in the
issue loop: with a recorder the machine binds `traced_run_local` in place of each
core's `run_local`.

`Recorder.to_bytes()` gives the trace file (format: docs/traces.md); its bytes
depend only on the run, so the same run gives the same file.
"""

from __future__ import annotations

import json
import struct
import zlib
from array import array

import numpy as np

from mkemu.emulator.memory import Trap

MAGIC = b"MKTRACE\x00"
FORMAT_VERSION = 1
HEADER = struct.Struct("<8sIIQQI")   # magic, version, flags, raw size, compressed size, crc32
SPACES = ("hbm", "vmem", "smem")
WAIT_SEMAPHORE, WAIT_BARRIER = 0, 1

# Each table: column name -> (dtype, delta-encoded). The order of columns in a
# buffer row is the order here; delta encoding makes slowly rising columns
# (issue cycles, pcs) compress to a few bits per event.
TABLES = {
    "instr": {"core": ("<i4", False), "launch": ("<i4", False), "pc": ("<i4", True),
              "issue": ("<i8", True), "stall_unit": ("<i8", False), "stall_dep": ("<i8", False)},
    "dma": {"seq": ("<i8", True), "launch": ("<i4", False), "src_core": ("<i4", False),
            "dst_core": ("<i4", False), "src_space": ("<i1", False), "dst_space": ("<i1", False),
            "size_bytes": ("<i8", False), "issued": ("<i8", False), "begun": ("<i8", False),
            "done": ("<i8", False), "pc": ("<i4", False), "sem": ("<i4", False),
            "rsem": ("<i4", False), "res_start": ("<i8", True), "res_count": ("<i4", False)},
    "dma_res": {"resource": ("<i4", False)},
    "rate": {"dma": ("<i8", False), "cycle": ("<i8", False), "bytes_per_cycle": ("<f8", False)},
    "wait": {"core": ("<i4", False), "launch": ("<i4", False), "kind": ("<i1", False),
             "sem": ("<i4", False), "value": ("<i8", False), "start": ("<i8", False),
             "end": ("<i8", False), "pc": ("<i4", False)},
    "signal": {"src_core": ("<i4", False), "dst_core": ("<i4", False), "launch": ("<i4", False),
               "sem": ("<i4", False), "value": ("<i8", False), "issued": ("<i8", False),
               "arrival": ("<i8", False), "pc": ("<i4", False)},
    "region": {"core": ("<i4", False), "launch": ("<i4", False), "name": ("<i4", False),
               "index": ("<i8", False), "depth": ("<i4", False), "start": ("<i8", False),
               "end": ("<i8", False), "pc": ("<i4", False)},
}


class Recorder:
    """Collects the events of one machine's run; serialise with `to_bytes()`."""

    def __init__(self) -> None:
        self.meta: dict = {}
        self.kernels: dict[str, dict] = {}
        self.launches: list[dict] = []
        self.region_names: list[str] = []
        self._region_ids: dict[str, int] = {}
        self.instr: list[tuple[int, int, _Rows]] = []   # (core, launch, [pc, issue, su, sd]*)
        self.rows = {name: array("q") for name in ("wait", "signal", "region")}
        self.dmas: dict[int, list] = {}                 # seq -> row (begun/done filled later)
        self.dma_res = array("q")
        self.rate = array("q")
        self.rate_values = array("d")
        self._last_rate: dict[int, float] = {}
        self.end_cycle = 0

    # -- hooks called by the machine -----------------------------------------

    def attach(self, machine) -> None:
        p, mesh = machine.profile, machine.mesh
        resources = [None] * machine.net.num_resources
        for chip, rid in enumerate(machine.hbm_res):
            resources[rid] = {"kind": "hbm", "chip": chip}
        for chip, rid in enumerate(machine.sibling_res):
            resources[rid] = {"kind": "sibling", "chip": chip}
        for gid, rid in enumerate(machine.engine_res):
            resources[rid] = {"kind": "engine", "chip": machine.cores[gid].chip, "core": gid}
        for (src, dst), rid in sorted(machine.links.resource_ids.items()):
            resources[rid] = {"kind": "link", "chip": src, "dst_chip": dst}
        for rid, res in enumerate(resources):
            res = res or {"kind": "other", "chip": -1}
            res.update(id=rid, name=machine.net.resource_name(rid),
                       bw_bytes_per_cycle=machine.net.capacity(rid))
            resources[rid] = res
        self.meta = {
            "profile": p.name, "clock_hz": p.clock_hz, "mesh": list(mesh.dims),
            "cores_per_chip": p.cores_per_chip, "units": list(_unit_names(machine)),
            "cores": [{"gid": c.gid, "chip": c.chip, "core": c.index} for c in machine.cores],
            "resources": resources, "spaces": list(SPACES),
            "program": machine.program.path if machine.program is not None else None,
        }

    def on_launch(self, machine, launch, start: int) -> None:
        kernel = machine.kernel
        ops = machine.decoded[launch.kernel]
        if kernel.name not in self.kernels:
            self.kernels[kernel.name] = {
                "text": [op.text for op in ops],
                "unit": [op.unit for op in ops],
                "latency": [op.latency for op in ops],
                "occupancy": [op.occupancy for op in ops],
                "source": [kernel.source_line(pc) for pc in range(len(ops))],
                "regions": list(kernel.regions),
            }
        index = len(self.launches)
        self.launches.append({"kernel": kernel.name, "args": list(launch.args), "start": start, "end": start})
        names = kernel.regions
        region_ids = [self._region_id(n) for n in names]
        meta_unit = len(self.meta["units"]) - 1
        for core in machine.cores:
            buf = _Rows()
            self.instr.append((core.gid, index, buf))
            stack: list = []
            core.run_local = _bind(core, buf, stack, self, index, meta_unit, region_ids)

    def on_launch_end(self, machine) -> None:
        index = len(self.launches) - 1
        for core in machine.cores:
            # A core that halts inside a region closes it at its halt cycle.
            while core.trace_stack:
                self.close_region(core, index, core.trace_stack, core.end_time)
        self.launches[-1]["end"] = machine.now
        self.end_cycle = machine.now

    def on_signal(self, src, dst, sem: int, value: int, t: int, arrival: int) -> None:
        self.rows["signal"].extend((src.gid, dst.gid, len(self.launches) - 1, sem, value, t, arrival, src.pc))

    def on_wait(self, core, kind: int, sem: int, value: int, start: int, end: int) -> None:
        self.rows["wait"].extend((core.gid, len(self.launches) - 1, kind, sem, value, start, end, core.pc))

    def on_dma_issue(self, dma) -> None:
        self.dmas[dma.seq] = [dma.seq, len(self.launches) - 1, dma.src_core.gid, dma.dst_core.gid,
                              SPACES.index(dma.src_space), SPACES.index(dma.dst_space), dma.size_bytes,
                              dma.issued_at, -1, -1, dma.pc, dma.sem,
                              -1 if dma.rsem is None else dma.rsem, len(self.dma_res), len(dma.resources)]
        self.dma_res.extend(dma.resources)

    def on_dma_begin(self, dma, t: int) -> None:
        self.dmas[dma.seq][8] = t

    def on_dma_done(self, dma, t: int) -> None:
        self.dmas[dma.seq][9] = t
        self._last_rate.pop(dma.seq, None)

    def on_rates(self, net, t: int) -> None:
        """Note every flow whose rate changed; rates only change when a flow starts or ends."""
        last = self._last_rate
        for key in net.active():
            rate = net.rate(key)
            if last.get(key) != rate:
                last[key] = rate
                self.rate.extend((key, t))
                self.rate_values.append(rate)

    # -- regions (called from the traced issue loop) -------------------------

    def open_region(self, core, stack: list, name_id: int, index: int, t: int) -> None:
        stack.append((name_id, index, t, core.pc))

    def close_region(self, core, launch: int, stack: list, t: int) -> None:
        name_id, index, start, pc = stack.pop()
        self.rows["region"].extend((core.gid, launch, name_id, index, len(stack), start, t, pc))

    def _region_id(self, name: str) -> int:
        if name not in self._region_ids:
            self._region_ids[name] = len(self.region_names)
            self.region_names.append(name)
        return self._region_ids[name]

    # -- serialisation -------------------------------------------------------

    def columns(self) -> dict[str, dict[str, np.ndarray]]:
        """Every table as numpy columns (the in-memory form of the file)."""
        parts = []
        for core, launch, buf in self.instr:
            rows = buf.array().reshape(-1, 4)
            parts.append((np.full(len(rows), core, np.int64), np.full(len(rows), launch, np.int64), rows))
        if parts:
            core = np.concatenate([p[0] for p in parts])
            launch = np.concatenate([p[1] for p in parts])
            rows = np.concatenate([p[2] for p in parts])
        else:
            core = launch = np.zeros(0, np.int64)
            rows = np.zeros((0, 4), np.int64)
        out = {"instr": {"core": core, "launch": launch, "pc": rows[:, 0], "issue": rows[:, 1],
                         "stall_unit": rows[:, 2], "stall_dep": rows[:, 3]}}
        dma = np.array([self.dmas[k] for k in sorted(self.dmas)], np.int64).reshape(-1, len(TABLES["dma"]))
        out["dma"] = dict(zip(TABLES["dma"], dma.T))
        out["dma_res"] = {"resource": np.frombuffer(self.dma_res, np.int64)}
        rate = np.frombuffer(self.rate, np.int64).reshape(-1, 2)
        out["rate"] = {"dma": rate[:, 0], "cycle": rate[:, 1],
                       "bytes_per_cycle": np.frombuffer(self.rate_values, np.float64)}
        for name in ("wait", "signal", "region"):
            cols = TABLES[name]
            table = np.frombuffer(self.rows[name], np.int64).reshape(-1, len(cols))
            out[name] = dict(zip(cols, table.T))
        return out

    def to_bytes(self) -> bytes:
        meta = dict(self.meta, format="mkemu-trace", version=FORMAT_VERSION, end_cycle=self.end_cycle,
                    kernels=self.kernels, launches=self.launches, region_names=self.region_names,
                    tables={})
        blobs, offset = [], 0
        for table, cols in self.columns().items():
            spec = {}
            for name, (dtype, delta) in TABLES[table].items():
                values = np.asarray(cols[name]).astype(dtype)
                if delta and values.size:
                    values = np.diff(values, prepend=values.dtype.type(0))
                spec[name] = {"dtype": dtype, "delta": delta, "length": int(values.size), "offset": offset}
                blobs.append(values.tobytes())
                offset += values.nbytes
            meta["tables"][table] = spec
        head = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
        raw = struct.pack("<Q", len(head)) + head + b"".join(blobs)
        packed = zlib.compress(raw, 6)
        return HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(raw), len(packed), zlib.crc32(packed)) + packed


class _Rows:
    """An int64 column store fed from the issue loop: `list.extend` is several times
    cheaper per call than `array.extend`; `flush` bounds the list's memory."""

    CHUNK_VALUES = 1 << 20

    def __init__(self) -> None:
        self.flat: list[int] = []
        self.chunks: list[np.ndarray] = []

    def flush(self) -> None:
        if self.flat:
            self.chunks.append(np.array(self.flat, np.int64))
            self.flat.clear()

    def array(self) -> np.ndarray:
        self.flush()
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.int64)


def _unit_names(machine) -> tuple[str, ...]:
    from mkemu.emulator.decode import unit_names

    return unit_names(machine.profile)


def _bind(core, buf, stack, recorder, launch, meta_unit, region_ids):
    core.trace_stack = stack

    def run_local(limit: int):
        try:
            return traced_run_local(core, limit, buf.flat, stack, recorder, launch, meta_unit, region_ids)
        finally:
            if len(buf.flat) >= buf.CHUNK_VALUES:
                buf.flush()
    return run_local


def traced_run_local(core, limit, buf, stack, recorder, launch, meta_unit, region_ids):
    """`Core.run_local` that also records each issue (pc, cycle, unit and operand stalls)
    and each region push/pop. Keep in step with `Core.run_local`: a test checks that a
    traced run gives the same result as an untraced one."""
    ops, ready, unit_free, busy, stalls = core.ops, core.ready, core.unit_free, core.unit_busy, core.stalls
    pc, t = core.pc, core.t
    count = 0
    record = buf.extend
    try:
        while True:
            if pc >= len(ops):
                raise Trap("ran-off-end", f"pc {pc} is past the end of the kernel ({len(ops)} instructions); "
                                          "a kernel must end with halt")
            op = ops[pc]
            issue = t
            free = unit_free[op.unit]
            if free > issue:
                issue = free
            unit_ready = issue
            for r in op.srcs:
                if ready[r] > issue:
                    issue = ready[r]
            if issue > t:
                stalls["unit"] += unit_ready - t
                stalls["dependency"] += issue - unit_ready
                record((pc, issue, unit_ready - t, issue - unit_ready))
            else:
                record((pc, issue, 0, 0))
            if op.is_global:
                return op, issue
            if issue > limit:
                raise Trap("max-cycles", f"the run passed the max-cycle guard of {limit} cycles")
            unit_free[op.unit] = issue + op.occupancy
            busy[op.unit] += op.occupancy
            done = issue + op.latency
            for d in op.dsts:
                ready[d] = done
            t = issue + (1 if op.occupancy else 0)
            core.pc, core.t = pc, issue
            count += 1
            if op.unit == meta_unit:
                depth = len(core.regions)
                nxt = op.run(core, op)
                if len(core.regions) > depth:
                    region, index, _ = core.regions[-1]
                    name = region_ids[region] if region < len(region_ids) else recorder._region_id(f"region{region}")
                    recorder.open_region(core, stack, name, index, issue)
                elif stack:
                    recorder.close_region(core, launch, stack, issue)
            else:
                nxt = op.run(core, op)
            pc = pc + 1 if nxt is None else nxt
    finally:
        core.instructions += count
        core.t = t
        core.pc = pc
