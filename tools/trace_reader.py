"""Reading and validating trace files (`.mkt`, format in docs/traces.md).

`read_trace(path)` returns a `Trace`: the metadata (profile, mesh, cores, units,
flow resources, kernels with per-pc text, unit, latency, occupancy and source
line, launches, region names) and each table as numpy columns. Anything wrong
with the file (not a trace, a newer format version, truncated, corrupted,
inconsistent tables) raises `TraceError` naming the file and what is wrong; no
Python traceback reaches a user. This module reads the file only: it knows
nothing of the emulator.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
import zlib

import numpy as np

from mkemu.errors import TraceError

MAGIC = b"MKTRACE\x00"
FORMAT = "mkemu-trace"
SUPPORTED_VERSIONS = (1,)
HEADER = struct.Struct("<8sIIQQI")
# The columns the tools read (the writer is emulator/trace.py); all integers but one.
COLUMNS = {
    "instr": ("core", "launch", "pc", "issue", "stall_unit", "stall_dep"),
    "dma": ("seq", "launch", "src_core", "dst_core", "src_space", "dst_space", "size_bytes", "issued", "begun",
            "done", "pc", "sem", "rsem", "res_start", "res_count"),
    "dma_res": ("resource",),
    "rate": ("dma", "cycle", "bytes_per_cycle"),
    "wait": ("core", "launch", "kind", "sem", "value", "start", "end", "pc"),
    "signal": ("src_core", "dst_core", "launch", "sem", "value", "issued", "arrival", "pc"),
    "region": ("core", "launch", "name", "index", "depth", "start", "end", "pc"),
}
FLOAT_COLUMNS = ("bytes_per_cycle",)
FAULT_KEYS = {"kind", "message", "chip", "core", "cycle", "pc", "instruction", "source"}
REQUIRED_META = ("clock_hz", "cores", "units", "resources", "kernels", "launches", "tables", "end_cycle",
                 "region_names", "spaces")


class Trace:
    """A trace read back: `meta` plus tables `instr`, `dma`, `dma_res`, `rate`,
    `wait`, `signal`, `region` (each a dict of equal-length numpy columns).

    `instr` gains the per-pc columns `unit`, `occupancy` and `latency` and the
    `chip` of each core; `dma` gains `src_chip` and `dst_chip`.
    """

    def __init__(self, meta: dict, tables: dict[str, dict[str, np.ndarray]], path: str = "<trace>"):
        self.meta = meta
        self.tables = tables
        self.path = path
        self.clock_hz = float(meta["clock_hz"])
        self.units: list[str] = list(meta["units"])
        self.cores: list[dict] = list(meta["cores"])
        self.resources: list[dict] = list(meta["resources"])
        self.launches: list[dict] = list(meta["launches"])
        self.region_names: list[str] = list(meta["region_names"])
        self.end_cycle = int(meta["end_cycle"])
        self.start_cycle = min((int(l["start"]) for l in self.launches), default=self.end_cycle)
        chip_of = np.array([c["chip"] for c in self.cores] or [0], np.int64)
        instr = tables["instr"]
        unit, occ, lat = self._per_pc(instr["launch"], instr["pc"])
        instr.update(unit=unit, occupancy=occ, latency=lat, chip=_gather(chip_of, instr["core"]))
        dma = tables["dma"]
        dma.update(src_chip=chip_of[dma["src_core"]], dst_chip=chip_of[dma["dst_core"]])
        wait = tables["wait"]
        wait["chip"] = chip_of[wait["core"]]
        region = tables["region"]
        region["chip"] = chip_of[region["core"]]

    def __getattr__(self, name: str):
        tables = self.__dict__.get("tables", {})
        if name in tables:
            return tables[name]
        raise AttributeError(name)

    def _per_pc(self, launch: np.ndarray, pc: np.ndarray):
        """Gather unit/occupancy/latency per event from the per-kernel tables, in one
        pass: the launched kernels' tables end to end, each launch's pcs offset by
        where its kernel's table starts."""
        kernels = self.meta["kernels"]
        names = list(dict.fromkeys(info["kernel"] for info in self.launches))
        first, at = {}, 0
        for name in names:
            first[name] = at
            at += len(kernels[name]["text"])
        offsets = np.array([first[info["kernel"]] for info in self.launches] or [0], np.int64)
        # A type with room for every row's place in the joined table (offset + pc < at;
        # the pcs were checked against their kernels), so the sum cannot wrap.
        index = _gather(np.append(offsets, at), launch)
        index += pc
        out = []
        for key in ("unit", "occupancy", "latency"):
            table = np.array([v for name in names for v in kernels[name][key]] or [0], np.int64)
            out.append(_gather(table, index))
        return out

    # -- lookups -------------------------------------------------------------

    def kernel_of(self, launch: int) -> dict:
        return self.meta["kernels"][self.launches[launch]["kernel"]]

    def text(self, launch: int, pc: int) -> str:
        return self.kernel_of(launch)["text"][pc]

    def source(self, launch: int, pc: int) -> str | None:
        return self.kernel_of(launch)["source"][pc]

    def core_name(self, gid: int) -> str:
        c = self.cores[gid]
        return f"chip {c['chip']} core {c['core']}"

    def seconds(self, cycles: float) -> float:
        return cycles / self.clock_hz

    @property
    def num_chips(self) -> int:
        return max((c["chip"] for c in self.cores), default=-1) + 1


def read_trace(path: str) -> Trace:
    try:
        with open(path, "rb") as fh:
            if stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                data = fh.read()
            else:
                data = _read_stream(fh)
    except OSError as exc:
        raise TraceError(f"cannot read trace: {exc.strerror}", file=str(path)) from None
    return parse_trace(data, str(path))


def _read_stream(fh) -> bytes:
    """A trace from a device or a pipe: the header, then no more than the bytes it
    promises and one (a stray byte is an error), so that a stream that never ends
    (/dev/zero, /dev/urandom) is refused by its header instead of filling memory."""
    data = fh.read(HEADER.size)
    if len(data) < HEADER.size or data[:len(MAGIC)] != MAGIC:
        return data
    want = HEADER.unpack_from(data)[4] + 1
    pieces = [data]
    while want > 0:
        piece = fh.read(min(want, 1 << 24))
        if not piece:
            break
        pieces.append(piece)
        want -= len(piece)
    return b"".join(pieces)


def parse_trace(data: bytes, path: str = "<trace>") -> Trace:
    def fail(message: str):
        raise TraceError(message, file=path)

    if len(data) < HEADER.size:
        fail(f"not an mkemu trace: the file has {len(data)} bytes, shorter than the {HEADER.size}-byte header")
    magic, version, flags, raw_size, packed_size, crc = HEADER.unpack_from(data)
    if magic != MAGIC:
        fail("not an mkemu trace (bad magic bytes; write one with `mkemu run FILE --trace PATH`)")
    if version not in SUPPORTED_VERSIONS:
        fail(f"trace format version {version} is not supported by this mkemu "
             f"(it reads version{'s' if len(SUPPORTED_VERSIONS) > 1 else ''} "
             f"{', '.join(map(str, SUPPORTED_VERSIONS))})")
    if flags != 0:
        fail(f"trace header flags {flags:#x} are not understood by this mkemu (version {version} traces have flags 0)")
    body = memoryview(data)[HEADER.size:]
    if len(body) < packed_size:
        fail(f"truncated trace: the header promises {packed_size} compressed bytes, the file has {len(body)}")
    if len(body) > packed_size:
        fail(f"corrupted trace: {len(body) - packed_size} stray bytes after the compressed data")
    if zlib.crc32(body) != crc:
        fail("corrupted trace: checksum mismatch (the file was damaged after it was written)")
    # A well-formed trace is decompressed a piece at a time, each column straight into
    # its array, so the whole payload (36 bytes per instruction) is never held at
    # once. Anything unusual about the file (a decompression error, columns not laid
    # out one after another, any check failing) is read again the simple way, which
    # gives the same error it always did.
    streamed = _streamed(body, raw_size, path, version)
    if streamed is not None:
        return streamed
    try:
        raw = zlib.decompress(body)
    except zlib.error as exc:
        fail(f"corrupted trace: cannot decompress ({exc})")
    if len(raw) != raw_size:
        fail(f"corrupted trace: decompressed to {len(raw)} bytes, the header says {raw_size}")
    return _parse_payload(_Whole(raw), path, fail, version)


def _streamed(body: memoryview, raw_size: int, path: str, version: int) -> Trace | None:
    """The trace read by streaming, or None if the file is anything but well-formed
    and laid out as the writer lays it out (the whole-payload reading then decides)."""
    try:
        return _parse_payload(_Stream(body, raw_size), path, _refuse, version)
    except Exception:  # noqa: BLE001 - any surprise: the whole-payload reading gives the error
        return None


class _Refused(Exception):
    """The streamed reading met something it leaves to the whole-payload reading."""


def _refuse(message: str):
    raise _Refused(message)


#: Elements converted at a time (a column is read in pieces of this many values).
CHUNK = 1 << 20


class _Whole:
    """The decompressed payload, all of it in memory: columns in any order."""

    def __init__(self, raw: bytes):
        self.raw = raw
        self.size = len(raw)

    def head(self, n: int) -> bytes:
        return self.raw[:n]

    def column(self, offset: int, dtype: np.dtype, length: int):
        for lo in range(0, length, CHUNK):
            yield np.frombuffer(self.raw, dtype, min(CHUNK, length - lo), offset + lo * dtype.itemsize)

    def done(self) -> None:
        pass


class _Stream:
    """The payload decompressed front to back, a piece at a time: columns must follow
    one another in the order of their offsets (as the writer lays them out)."""

    INPUT = 1 << 20

    def __init__(self, body: memoryview, raw_size: int):
        self.body = body
        self.size = raw_size
        self.fed = 0
        self.pos = 0                     # bytes of the payload handed out so far
        self.inflate = zlib.decompressobj()
        self.pending = b""

    def read(self, n: int) -> bytes:
        parts, got = [], 0
        if self.pending:
            part, self.pending = self.pending[:n], self.pending[n:]
            parts.append(part)
            got = len(part)
        while got < n:
            if self.inflate.unconsumed_tail:
                src = self.inflate.unconsumed_tail
            elif self.fed < len(self.body) and not self.inflate.eof:
                src = self.body[self.fed:self.fed + self.INPUT]
                self.fed += len(src)
            else:
                raise _Refused("the payload ends early")
            part = self.inflate.decompress(src, n - got)
            parts.append(part)
            got += len(part)
        self.pos += n
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def head(self, n: int) -> bytes:
        """The first n bytes (again: they stay pending until the columns start)."""
        if n > self.size:
            raise _Refused("the metadata runs past the payload")
        data = self.read(n)
        self.pending, self.pos = data, 0
        return data

    def start_columns(self, base: int) -> None:
        """The metadata (the first `base` bytes, pending) is read: the columns follow."""
        if len(self.pending) != base:
            raise _Refused("the columns do not follow the metadata")
        self.pending, self.pos = b"", base

    def column(self, offset: int, dtype: np.dtype, length: int):
        if length and offset != self.pos:
            raise _Refused("columns out of order")
        for lo in range(0, length, CHUNK):
            count = min(CHUNK, length - lo)
            yield np.frombuffer(self.read(count * dtype.itemsize), dtype)

    def done(self) -> None:
        """The payload ended exactly where the columns did, as the header said."""
        rest = self.inflate.decompress(self.inflate.unconsumed_tail + bytes(self.body[self.fed:]), 1)
        if self.pending or rest or not self.inflate.eof or self.inflate.unused_data or self.pos != self.size:
            raise _Refused("the payload does not end where it should")


def _narrowest(lo: int, hi: int) -> np.dtype:
    """The smallest signed integer type holding [lo, hi] with room to spare: the sum
    or difference of two such values fits it too."""
    for dtype in (np.int8, np.int16, np.int32):
        half = (np.iinfo(dtype).max + 1) // 2
        if -half <= lo and hi < half:
            return np.dtype(dtype)
    return np.dtype(np.int64)


def _convert(chunks, length: int, dtype: np.dtype, delta: bool, narrow: bool) -> np.ndarray:
    """A column from its stored pieces: as float64 or int64 values (the cumulative sum
    if delta-encoded); with `narrow`, integers in the smallest type that holds them."""
    wide = np.float64 if dtype.kind == "f" else np.int64
    if not narrow or wide is np.float64:
        out = np.empty(length, wide)
    else:
        out = np.empty(length, np.int8)
        lo = hi = 0
    at = 0
    carry = None
    for piece in chunks:
        values = piece.astype(wide)
        if delta and values.size:
            if carry is not None:
                values[0] += carry      # the running sum goes on exactly as in one pass
            np.cumsum(values, out=values)
            carry = values[-1]
        if narrow and wide is np.int64 and values.size:
            lo, hi = min(lo, int(values.min())), max(hi, int(values.max()))
            need = _narrowest(lo, hi)
            if need.itemsize > out.dtype.itemsize:
                out = out.astype(need)
        out[at:at + values.size] = values
        at += values.size
    return out


#: Tables kept in narrow integer types (the one with a row per instruction).
NARROW_TABLES = ("instr",)


def _parse_payload(payload, path: str, fail, version: int) -> Trace:
    if payload.size < 8:
        fail("corrupted trace: no metadata")
    (meta_size,) = struct.unpack_from("<Q", payload.head(8))
    if 8 + meta_size > payload.size:
        fail(f"corrupted trace: the metadata's length ({meta_size:,} bytes) runs past the data")
    try:
        meta = json.loads(payload.head(8 + meta_size)[8:].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        fail(f"corrupted trace: bad metadata ({exc})")
    except RecursionError:   # (arrays or objects nested thousands deep: no writer makes them)
        fail("corrupted trace: bad metadata (nested too deeply to read)")
    if not isinstance(meta, dict):
        fail("corrupted trace: metadata is not an object")
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        fail(f"corrupted trace: metadata lacks {', '.join(missing)}")
    if meta.get("format", FORMAT) != FORMAT or meta.get("version", version) != version:
        fail(f"corrupted trace: the metadata says format {meta.get('format')!r} version {meta.get('version')!r}, "
             f"the header {FORMAT!r} version {version}")
    _check_meta(meta, fail)
    tables: dict[str, dict[str, np.ndarray]] = {}
    base = 8 + meta_size
    described = 0
    try:
        specs = []
        for table, spec in meta["tables"].items():
            tables[table] = {}
            lengths = set()
            for name, col in spec.items():
                dtype = np.dtype(col["dtype"])
                length, offset = int(col["length"]), int(col["offset"])
                size = dtype.itemsize * length
                if offset < 0 or base + offset + size > payload.size:
                    fail(f"corrupted trace: column {table}.{name} runs past the end of the data")
                if isinstance(payload, _Stream):
                    specs.append((offset, table, name, dtype, length, bool(col.get("delta"))))
                else:
                    tables[table][name] = _convert(payload.column(base + offset, dtype, length), length, dtype,
                                                   bool(col.get("delta")), table in NARROW_TABLES)
                lengths.add(length)
                described += size
            if len(lengths) > 1:
                fail(f"corrupted trace: columns of table {table} have different lengths {sorted(lengths)}")
        if isinstance(payload, _Stream):
            # In the order they follow one another in the payload, then listed as in the metadata.
            payload.start_columns(base)
            for offset, table, name, dtype, length, delta in sorted(specs, key=lambda s: s[0]):
                tables[table][name] = _convert(payload.column(base + offset, dtype, length), length, dtype, delta,
                                               table in NARROW_TABLES)
            tables = {t: {n: tables[t][n] for n in spec} for t, spec in meta["tables"].items()}
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:   # (int(inf))
        fail(f"corrupted trace: bad table description ({exc})")
    if base + described != payload.size:
        fail(f"corrupted trace: {payload.size - base - described} bytes of data not described by the metadata")
    payload.done()
    for table, names in COLUMNS.items():
        if table not in tables:
            fail(f"corrupted trace: table {table} is missing")
        for name in names:
            if name not in tables[table]:
                fail(f"corrupted trace: table {table} lacks column {name}")
            if name not in FLOAT_COLUMNS and np.dtype(meta["tables"][table][name]["dtype"]).kind not in "iu":
                fail(f"corrupted trace: column {table}.{name} is not of an integer type")
    _check_ranges(tables, meta, fail)
    try:
        return Trace(meta, tables, path)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        fail(f"corrupted trace: inconsistent metadata ({type(exc).__name__}: {exc})")


def _gather(table: np.ndarray, index: np.ndarray) -> np.ndarray:
    """table[index] in the smallest integer type that holds the table's values, a
    piece at a time (indexing would convert the whole index to int64)."""
    table = table.astype(_narrowest(int(table.min()), int(table.max())))
    out = np.empty(index.size, table.dtype)
    for lo in range(0, index.size, CHUNK):
        np.take(table, index[lo:lo + CHUNK], out=out[lo:lo + CHUNK])
    return out


def _first_outside(pc: np.ndarray, launch_of: np.ndarray, lengths: np.ndarray) -> int:
    """The first row whose pc lies outside its launch's kernel, or -1."""
    for lo in range(0, pc.size, CHUNK):
        piece = pc[lo:lo + CHUNK]
        outside = np.flatnonzero((piece < 0) | (piece >= lengths[launch_of[lo:lo + CHUNK]]))
        if outside.size:
            return lo + int(outside[0])
    return -1


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive(v) -> bool:
    """A positive finite number, as a profile's clock and bandwidths are (JSON reads
    `Infinity` as a float, and an integer too large for a float would fail the tools)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return 0 < float(v) < math.inf
    except OverflowError:
        return False


def _check_meta(meta: dict, fail) -> None:
    """The metadata the tools read has the types they expect: refuse anything else now."""
    def need(ok: bool, what: str) -> None:
        if not ok:
            fail(f"corrupted trace: bad metadata: {what}")

    def list_of(key: str, check) -> list:
        value = meta[key]
        need(isinstance(value, list) and all(check(v) for v in value), f"{key} is not a list of the right items")
        return value

    need(_positive(meta["clock_hz"]), "clock_hz is not a positive number")
    need(_is_int(meta["end_cycle"]) and 0 <= meta["end_cycle"] <= MAX_CYCLE, "end_cycle is not a cycle count")
    fault = meta.get("fault")     # (only in the trace of a run that faulted)
    need(fault is None or (isinstance(fault, dict) and set(fault) == FAULT_KEYS
                           and all(isinstance(fault[k], str) for k in ("kind", "message"))
                           and all(fault[k] is None or (_is_int(fault[k]) and 0 <= fault[k] <= MAX_CYCLE)
                                   for k in ("chip", "core", "cycle", "pc"))
                           and all(fault[k] is None or isinstance(fault[k], str) for k in ("instruction", "source"))),
         "fault is not a fault's kind, message, chip, core, cycle, pc, instruction and source")
    need(len(list_of("units", lambda u: isinstance(u, str))) > 0, "units is empty")
    need("hbm" in list_of("spaces", lambda v: isinstance(v, str)), "spaces lacks hbm")
    list_of("region_names", lambda v: isinstance(v, str))
    cores = list_of("cores", lambda c: isinstance(c, dict) and all(_is_int(c.get(k)) and c[k] >= 0
                                                                   for k in ("gid", "chip", "core")))
    need(all(c["gid"] == i for i, c in enumerate(cores)), "cores are not numbered 0, 1, ... in order")
    resources = list_of("resources", lambda r: isinstance(r, dict) and _is_int(r.get("id"))
                        and _is_int(r.get("chip")) and r["chip"] >= -1
                        and isinstance(r.get("name"), str) and isinstance(r.get("kind"), str)
                        and _positive(r.get("bw_bytes_per_cycle")))
    need(all(r["id"] == i for i, r in enumerate(resources)), "resources are not numbered 0, 1, ... in order")
    need({c["chip"] for c in cores} <= {r["chip"] for r in resources if r["kind"] == "hbm"},
         "a chip has no hbm resource")
    launches = list_of("launches", lambda l: isinstance(l, dict) and isinstance(l.get("kernel"), str)
                       and _is_int(l.get("start")) and _is_int(l.get("end")) and 0 <= l["start"] <= l["end"] <= 2**62)
    # Launches run one after another, inside the run.
    need(all(a["end"] <= b["start"] for a, b in zip(launches, launches[1:])), "launches overlap or are out of order")
    need(all(launch["end"] <= meta["end_cycle"] for launch in launches), "a launch ends after end_cycle")
    kernels = meta["kernels"]
    need(isinstance(kernels, dict), "kernels is not an object")
    nunits = len(meta["units"])
    for name, k in kernels.items():
        need(isinstance(k, dict) and all(isinstance(k.get(f), list) for f in ("text", "source", "unit",
                                                                               "occupancy", "latency")),
             f"kernel {name} lacks its per-pc lists")
        n = len(k["text"])
        need(all(len(k[f]) == n for f in ("source", "unit", "occupancy", "latency")),
             f"kernel {name}'s per-pc lists have different lengths")
        need(all(isinstance(t, str) for t in k["text"]) and all(s is None or isinstance(s, str) for s in k["source"]),
             f"kernel {name}'s text or source is not text")
        need(all(_is_int(u) and 0 <= u < nunits for u in k["unit"]), f"kernel {name} names a unit outside 0..{nunits - 1}")
        need(all(_is_int(v) and 0 <= v <= 2**62 for f in ("occupancy", "latency") for v in k[f]),
             f"kernel {name}'s occupancy or latency is not a small integer")
    need(isinstance(meta["tables"], dict) and all(isinstance(t, dict) and all(isinstance(c, dict) for c in t.values())
                                                  for t in meta["tables"].values()),
         "tables is not an object of column descriptions")


MAX_CYCLE = 2**62
CYCLE_COLUMNS = (("instr", "issue"), ("wait", "start"), ("wait", "end"), ("region", "start"), ("region", "end"),
                 ("signal", "issued"), ("signal", "arrival"), ("dma", "issued"), ("dma", "begun"), ("dma", "done"),
                 ("rate", "cycle"))


def _check_times(tables: dict, fail) -> None:
    """Cycles and rates as a run writes them: nothing negative, nothing ends before it
    starts (a DMA still moving at a fault has begun and done -1), rates finite; the
    summaries would print negative stalls or drop regions, the exports write `nan`."""
    def ordered(table: str, first: str, then: str) -> None:
        a, b = tables[table][first], tables[table][then]
        if a.size and (a.min() < 0 or (b < a).any()):
            fail(f"corrupted trace: {table}.{first} is negative or after {table}.{then}")

    instr = tables["instr"]
    for col in ("issue", "stall_unit", "stall_dep"):
        if instr[col].size and instr[col].min() < 0:
            fail(f"corrupted trace: instr.{col} has a negative value")
    ordered("wait", "start", "end")
    ordered("region", "start", "end")
    ordered("signal", "issued", "arrival")
    dma = tables["dma"]
    begun, done = dma["begun"], dma["done"]
    if dma["issued"].size and (dma["issued"].min() < 0 or ((begun < dma["issued"]) & (begun != -1)).any()
                               or ((done != -1) & ((begun == -1) | (done < begun))).any()):
        fail("corrupted trace: a DMA begins before it is issued or lands before it begins")
    for table, col in CYCLE_COLUMNS:     # (end_cycle's own bound: the exports scale cycles into int64)
        if tables[table][col].size and tables[table][col].max() > MAX_CYCLE:
            fail(f"corrupted trace: {table}.{col} has a cycle past 2^62")
    rate = tables["rate"]
    if rate["cycle"].size and (rate["cycle"].min() < 0 or not np.isfinite(rate["bytes_per_cycle"]).all()
                               or rate["bytes_per_cycle"].min() < 0):
        fail("corrupted trace: rate has a negative cycle or a rate that is not a finite number of at least 0")


def _check_ranges(tables: dict, meta: dict, fail) -> None:
    """Indices that point outside their tables would crash the tools later: refuse them now."""
    ncores, nlaunch = len(meta["cores"]), len(meta["launches"])
    checks = [("instr", "core", ncores), ("instr", "launch", nlaunch), ("dma", "src_core", ncores),
              ("dma", "dst_core", ncores), ("wait", "core", ncores), ("region", "core", ncores),
              ("region", "name", len(meta["region_names"])), ("dma_res", "resource", len(meta["resources"])),
              ("signal", "src_core", ncores), ("signal", "dst_core", ncores),
              ("dma", "src_space", len(meta["spaces"])), ("dma", "dst_space", len(meta["spaces"]))]
    checks += [(table, "launch", nlaunch) for table in ("dma", "wait", "signal", "region")]
    for table, col, limit in checks:
        values = tables[table][col]
        if values.size and (values.min() < 0 or values.max() >= limit):
            fail(f"corrupted trace: {table}.{col} has a value outside 0..{limit - 1}" if limit else
                 f"corrupted trace: {table}.{col} has values, and the metadata lists nothing for them to name")
    for index, launch in enumerate(meta["launches"]):
        if launch["kernel"] not in meta["kernels"]:
            fail(f"corrupted trace: launch {index} names unknown kernel {launch['kernel']!r}")
    # Each launch's kernel length, so every table's pcs are checked in one pass.
    lengths = np.array([len(meta["kernels"][launch["kernel"]]["text"]) for launch in meta["launches"]], np.int64)
    for table in ("instr", "dma", "wait", "signal", "region"):
        pc, launch_of = tables[table]["pc"], tables[table]["launch"]
        row = _first_outside(pc, launch_of, lengths)
        if row >= 0:
            index = int(launch_of[row])
            fail(f"corrupted trace: a pc in table {table}, of launch {index}, is outside kernel "
                 f"{meta['launches'][index]['kernel']}")
    for table, col in (("dma", "res_start"), ("dma", "res_count"), ("dma", "size_bytes")):
        if tables[table][col].size and tables[table][col].min() < 0:
            fail(f"corrupted trace: {table}.{col} has a negative value")
    _check_times(tables, fail)
    dma = tables["dma"]
    if not np.isin(tables["rate"]["dma"], dma["seq"]).all():
        fail("corrupted trace: rate.dma names a DMA that is not in the dma table")
    if dma["res_start"].size and (dma["res_start"] + dma["res_count"]).max() > tables["dma_res"]["resource"].size:
        fail("corrupted trace: a DMA's resource list runs past the resource table")
