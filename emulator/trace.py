"""Trace recording: what every core, DMA engine and link did, cycle by cycle.

A `Recorder` handed to `Machine(..., trace=recorder)` collects, per launch:
every instruction issue (core, pc, issue cycle, cycles stalled on its unit and on
its operands), semaphore and barrier waits, semaphore signals, every DMA (issue,
begin, end, bytes, memories, chips and cores, the flow resources it crossed and
its rate over time), and source regions (`mark.push`/`mark.pop`). Events go into
flat arrays of ints (instructions: 4 int64 per issue, in numpy chunks of at least
half a core buffer), not objects per event. Unit, latency and occupancy are not
stored per event: they are per pc in the kernel table of the trace metadata.

Recording off costs one `is not None` test per machine event and one flag test per
instruction in the compiled issue loop. With a recorder the loop writes fixed-size
rows into each core's preallocated buffers (`Core.trace_rows`, `Core.trace_regions`).
Region rows are handed over whenever the loop returns to Python (`CoreSink.drain`),
so they reach the file in the order the run closed them; instruction rows (kept per
core and launch, so their order does not depend on when) once the buffer is half
full, at a fault and at the end of the launch.

`Recorder.to_bytes()` gives the trace file (format: docs/traces.md); its bytes
depend only on the run, so the same run gives the same file. It compresses the
payload a column piece at a time: the whole uncompressed payload (36 bytes per
instruction) is never held at once.
"""

from __future__ import annotations

import json
import struct
import zlib
from array import array

import numpy as np

from mkemu.emulator import loop as lp
from mkemu.emulator.core import TRACE_REGION_ROWS, TRACE_ROWS
from mkemu.isa.encoding import BARRIER_SCOPES

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
        self.instr: list[tuple[int, int, list]] = []    # (core, launch, chunks of (pc, issue, su, sd) rows)
        self.rows = {name: array("q") for name in ("wait", "signal", "region")}
        self.dmas: dict[int, list] = {}                 # seq -> row (begun/done filled later)
        self.dma_res = array("q")
        self.rate = array("q")
        self.rate_values = array("d")
        self._last_rate: dict[int, float] = {}
        self.end_cycle = 0
        self.machine = None     # the machine it records (`attach`)
        self.launch_open = False     # between on_launch and on_launch_end

    # -- hooks called by the machine -----------------------------------------

    def attach(self, machine) -> None:
        self.machine = machine
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
        for (src, dst, index), rid in sorted(machine.links.port_ids.items()):
            resources[rid] = {"kind": "port", "chip": src, "dst_chip": dst,
                              "core": src * machine.profile.cores_per_chip + index}
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

    def detach(self) -> None:
        """The run is over (any fault recorded): the recorder lets go of its machine, so
        that the machine, which refers to it, goes as soon as nothing else does, not at
        the next garbage collection (a loop of traced runs piled them up)."""
        self.machine = None

    def on_launch(self, machine, launch, start: int) -> None:
        kernel = machine.kernel
        ops = machine.decoded[launch.kernel].ops
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
        self.launch_open = True
        region_ids = [self._region_id(n) for n in kernel.regions]
        for core in machine.cores:
            chunks: list = []
            self.instr.append((core.gid, index, chunks))
            core.trace = CoreSink(self, chunks, index, region_ids)
            if core.trace_rows.shape[0] < TRACE_ROWS:
                core.trace_rows = np.zeros((TRACE_ROWS, 4), np.int64)
                core.trace_regions = np.zeros((TRACE_REGION_ROWS, 7), np.int64)

    def on_launch_end(self, machine) -> None:
        self._end_launch(machine, machine.now)

    def on_fault(self, fault) -> None:
        """The run stopped at `fault`: the trace ends there (a launch still open ends at the
        fault's cycle, as `_end_launch` says; DMAs in flight keep begun/done -1) and the
        metadata says what stopped it."""
        if self.launches and self.launch_open:     # (a fault at a launch's end comes after on_launch_end)
            end = max(self.machine.now, fault.cycle or 0)
            self._end_launch(self.machine, end)
            self._cut_run_ahead(end)
        else:       # (the max-cycle guard passed in a launch's start-up, before it began)
            self.end_cycle = max(self.end_cycle, fault.cycle or 0)
        self.meta["fault"] = {"kind": fault.kind, "message": fault.message, "chip": fault.chip,
                              "core": fault.core, "cycle": fault.cycle, "pc": fault.pc,
                              "instruction": fault.instruction, "source": fault.source}

    def _end_launch(self, machine, end: int) -> None:
        """The launch ends at cycle `end`: every core's rows so far are taken, and the
        regions a core is still inside close at its halt, innermost first (at `end` for a
        core stopped by a fault before it halted), as does a wait a core still blocks in
        (only a run stopped by a fault has one)."""
        index = len(self.launches) - 1
        for core in machine.cores:
            core.trace.drain(core, force=True)
            if core.waiting is not None:
                what, value, since, _ = core.waiting
                if what == "barrier":
                    kind, what, value = 1, BARRIER_SCOPES.index(value), 0
                else:
                    kind = 0
                self.on_wait(core, kind, what, value, since, max(since, end))
            opened = core.open_regions()
            close = core.end_time if core.end_time is not None else end
            for depth in range(len(opened) - 1, -1, -1):
                rid, region_index, start, pc = opened[depth]
                self.rows["region"].extend((core.gid, index, core.trace.name_id(rid), region_index, depth,
                                            start, max(start, close), pc))
        self.launches[-1]["end"] = end
        self.end_cycle = end
        self.launch_open = False

    def _cut_run_ahead(self, end: int) -> None:
        """The launch stopped at a fault at cycle `end`: what the other cores did past it,
        running ahead of the machine's clock, never happened. Their instructions issued
        after it go, as do regions that began after it; a region it cut closes at it."""
        index = len(self.launches) - 1
        for _, launch, chunks in self.instr:
            if launch == index:
                chunks[:] = [rows[rows[:, 1] <= end] for rows in chunks]
        cols = len(TABLES["region"])
        table = np.frombuffer(self.rows["region"], np.int64).reshape(-1, cols)
        mine = table[:, 1] == index
        if (mine & (table[:, 6] > end)).any():
            kept = table[~mine | (table[:, 5] <= end)].copy()
            late = (kept[:, 1] == index) & (kept[:, 6] > end)
            kept[late, 6] = end
            self.rows["region"] = array("q", kept.reshape(-1).tobytes())

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
        for key, rate in net.active_rates():
            if last.get(key) != rate:
                last[key] = rate
                self.rate.extend((key, t))
                self.rate_values.append(rate)

    # -- serialisation helpers ---------------------------------------------------

    def _region_id(self, name: str) -> int:
        if name not in self._region_ids:
            self._region_ids[name] = len(self.region_names)
            self.region_names.append(name)
        return self._region_ids[name]

    # -- serialisation -------------------------------------------------------

    def columns(self) -> dict[str, dict[str, np.ndarray]]:
        """Every table as numpy columns (the in-memory form of the file)."""
        out = {"instr": {name: np.concatenate([np.zeros(0, np.int64), *self._instr_pieces(name)])
                         for name in TABLES["instr"]}}
        out.update(self._small_tables())
        return out

    def _instr_pieces(self, name: str):
        """The instr table's column `name` (int64), one drained chunk at a time."""
        at = ("pc", "issue", "stall_unit", "stall_dep").index(name) if name not in ("core", "launch") else None
        for core, launch, chunks in self.instr:
            for rows in chunks:
                if at is not None:
                    yield rows[:, at]
                else:
                    yield np.full(len(rows), core if name == "core" else launch, np.int64)

    def _small_tables(self) -> dict[str, dict[str, np.ndarray]]:
        """Every table but instr as numpy columns."""
        out = {}
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
        # Each column as a length and its pieces (the instr table's: one chunk at a time).
        small = self._small_tables()
        n_instr = sum(len(rows) for _, _, chunks in self.instr for rows in chunks)
        columns, offset = [], 0
        for table in TABLES:
            spec = {}
            for name, (dtype, delta) in TABLES[table].items():
                if table == "instr":
                    length, pieces = n_instr, self._instr_pieces(name)
                else:
                    length, pieces = small[table][name].size, iter([small[table][name]])
                spec[name] = {"dtype": dtype, "delta": delta, "length": int(length), "offset": offset}
                columns.append((np.dtype(dtype), delta, pieces))
                offset += np.dtype(dtype).itemsize * length
            meta["tables"][table] = spec
        head = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
        raw_size = 8 + len(head) + offset
        # zlib's output does not depend on how its input is split (no flushes in between):
        # the bytes are those of compressing the whole payload at once.
        deflate = zlib.compressobj(6)
        packed = [deflate.compress(struct.pack("<Q", len(head)) + head)]
        for dtype, delta, pieces in columns:
            last = dtype.type(0)    # a delta column's running value, across pieces
            for piece in pieces:
                values = np.asarray(piece).astype(dtype)
                if delta and values.size:
                    values, last = np.diff(values, prepend=last), values[-1]
                packed.append(deflate.compress(values.tobytes()))
        packed.append(deflate.flush())
        body = b"".join(packed)
        return HEADER.pack(MAGIC, FORMAT_VERSION, 0, raw_size, len(body), zlib.crc32(body)) + body


class CoreSink:
    """Where one core's trace rows go during one launch."""

    def __init__(self, recorder: Recorder, chunks: list, launch: int, region_ids: list[int]):
        self.recorder = recorder
        self.chunks = chunks
        self.launch = launch
        self.region_ids = region_ids

    def name_id(self, rid: int) -> int:
        ids = self.region_ids
        return ids[rid] if rid < len(ids) else self.recorder._region_id(f"region{rid}")

    def drain(self, core, force: bool = False) -> None:
        """Take the region rows the loop wrote into the core's buffers since the last
        call, and its instruction rows once they fill half the buffer (or `force`)."""
        I = core.I
        n = int(I[lp.H_NTR])
        if n and (force or 2 * n >= len(core.trace_rows)):
            self.chunks.append(core.trace_rows[:n].copy())
            I[lp.H_NTR] = 0
        n = int(I[lp.H_NTRR])
        if n:
            out = self.recorder.rows["region"]
            for kind, rid, index, depth, start, end, pc in core.trace_regions[:n].tolist():
                name = self.name_id(rid)
                if kind == lp.REGION_CLOSE:
                    out.extend((core.gid, self.launch, name, index, depth, start, end, pc))
            I[lp.H_NTRR] = 0


def _unit_names(machine) -> tuple[str, ...]:
    from mkemu.emulator.decode import unit_names

    return unit_names(machine.profile)
