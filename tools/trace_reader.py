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
import struct
import zlib

import numpy as np

from mkemu.errors import TraceError

MAGIC = b"MKTRACE\x00"
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
        self.start_cycle = min((int(l["start"]) for l in self.launches), default=0)
        chip_of = np.array([c["chip"] for c in self.cores] or [0], np.int64)
        instr = tables["instr"]
        unit, occ, lat = self._per_pc(instr["launch"], instr["pc"])
        instr.update(unit=unit, occupancy=occ, latency=lat, chip=chip_of[instr["core"]])
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
        """Gather unit/occupancy/latency per event from the per-kernel tables."""
        out = [np.zeros(len(pc), np.int64) for _ in range(3)]
        for index, info in enumerate(self.launches):
            kernel = self.meta["kernels"][info["kernel"]]
            sel = launch == index
            if not sel.any():
                continue
            pcs = pc[sel]
            for col, key in zip(out, ("unit", "occupancy", "latency")):
                col[sel] = np.asarray(kernel[key], np.int64)[pcs]
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
            data = fh.read()
    except OSError as exc:
        raise TraceError(f"cannot read trace: {exc.strerror}", file=str(path)) from None
    return parse_trace(data, str(path))


def parse_trace(data: bytes, path: str = "<trace>") -> Trace:
    def fail(message: str):
        raise TraceError(message, file=path)

    if len(data) < HEADER.size:
        fail(f"not an mkemu trace: the file has {len(data)} bytes, shorter than the {HEADER.size}-byte header")
    magic, version, _flags, raw_size, packed_size, crc = HEADER.unpack_from(data)
    if magic != MAGIC:
        fail("not an mkemu trace (bad magic bytes; write one with `mkemu run FILE --trace PATH`)")
    if version not in SUPPORTED_VERSIONS:
        fail(f"trace format version {version} is not supported by this mkemu "
             f"(it reads version{'s' if len(SUPPORTED_VERSIONS) > 1 else ''} "
             f"{', '.join(map(str, SUPPORTED_VERSIONS))})")
    body = data[HEADER.size:]
    if len(body) < packed_size:
        fail(f"truncated trace: the header promises {packed_size} compressed bytes, the file has {len(body)}")
    if len(body) > packed_size:
        fail(f"corrupted trace: {len(body) - packed_size} stray bytes after the compressed data")
    if zlib.crc32(body) != crc:
        fail("corrupted trace: checksum mismatch (the file was damaged after it was written)")
    try:
        raw = zlib.decompress(body)
    except zlib.error as exc:
        fail(f"corrupted trace: cannot decompress ({exc})")
    if len(raw) != raw_size:
        fail(f"corrupted trace: decompressed to {len(raw)} bytes, the header says {raw_size}")
    if len(raw) < 8:
        fail("corrupted trace: no metadata")
    (meta_size,) = struct.unpack_from("<Q", raw)
    try:
        meta = json.loads(raw[8:8 + meta_size].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        fail(f"corrupted trace: bad metadata ({exc})")
    if not isinstance(meta, dict):
        fail("corrupted trace: metadata is not an object")
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        fail(f"corrupted trace: metadata lacks {', '.join(missing)}")
    _check_meta(meta, fail)
    tables: dict[str, dict[str, np.ndarray]] = {}
    base = 8 + meta_size
    described = 0
    try:
        for table, spec in meta["tables"].items():
            cols = {}
            lengths = set()
            for name, col in spec.items():
                dtype = np.dtype(col["dtype"])
                length, offset = int(col["length"]), int(col["offset"])
                size = dtype.itemsize * length
                if offset < 0 or base + offset + size > len(raw):
                    fail(f"corrupted trace: column {table}.{name} runs past the end of the data")
                values = np.frombuffer(raw, dtype, length, base + offset)
                values = values.astype(np.float64 if dtype.kind == "f" else np.int64)
                if col.get("delta"):
                    values = np.cumsum(values)
                cols[name] = values
                lengths.add(length)
                described += size
            if len(lengths) > 1:
                fail(f"corrupted trace: columns of table {table} have different lengths {sorted(lengths)}")
            tables[table] = cols
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        fail(f"corrupted trace: bad table description ({exc})")
    if base + described != len(raw):
        fail(f"corrupted trace: {len(raw) - base - described} bytes of data not described by the metadata")
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


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_meta(meta: dict, fail) -> None:
    """The metadata the tools read has the types they expect: refuse anything else now."""
    def need(ok: bool, what: str) -> None:
        if not ok:
            fail(f"corrupted trace: bad metadata: {what}")

    def list_of(key: str, check) -> list:
        value = meta[key]
        need(isinstance(value, list) and all(check(v) for v in value), f"{key} is not a list of the right items")
        return value

    clock = meta["clock_hz"]
    need(isinstance(clock, (int, float)) and not isinstance(clock, bool) and 0 < clock < float("inf"),
         "clock_hz is not a positive number")
    need(_is_int(meta["end_cycle"]), "end_cycle is not an integer")
    need(len(list_of("units", lambda u: isinstance(u, str))) > 0, "units is empty")
    need("hbm" in list_of("spaces", lambda v: isinstance(v, str)), "spaces lacks hbm")
    list_of("region_names", lambda v: isinstance(v, str))
    cores = list_of("cores", lambda c: isinstance(c, dict) and all(_is_int(c.get(k)) and c[k] >= 0
                                                                   for k in ("gid", "chip", "core")))
    need(all(c["gid"] == i for i, c in enumerate(cores)), "cores are not numbered 0, 1, ... in order")
    resources = list_of("resources", lambda r: isinstance(r, dict) and _is_int(r.get("id"))
                        and _is_int(r.get("chip")) and r["chip"] >= -1
                        and isinstance(r.get("name"), str) and isinstance(r.get("kind"), str)
                        and isinstance(r.get("bw_bytes_per_cycle"), (int, float))
                        and not isinstance(r.get("bw_bytes_per_cycle"), bool) and r["bw_bytes_per_cycle"] > 0)
    need(all(r["id"] == i for i, r in enumerate(resources)), "resources are not numbered 0, 1, ... in order")
    need({c["chip"] for c in cores} <= {r["chip"] for r in resources if r["kind"] == "hbm"},
         "a chip has no hbm resource")
    list_of("launches", lambda l: isinstance(l, dict) and isinstance(l.get("kernel"), str)
            and _is_int(l.get("start")) and _is_int(l.get("end")) and l["start"] <= l["end"])
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
            fail(f"corrupted trace: {table}.{col} has a value outside 0..{limit - 1}")
    for index, launch in enumerate(meta["launches"]):
        if launch["kernel"] not in meta["kernels"]:
            fail(f"corrupted trace: launch {index} names unknown kernel {launch['kernel']!r}")
    # Each launch's kernel length, so every table's pcs are checked in one pass.
    lengths = np.array([len(meta["kernels"][launch["kernel"]]["text"]) for launch in meta["launches"]], np.int64)
    for table in ("instr", "dma", "wait", "signal", "region"):
        pc, launch_of = tables[table]["pc"], tables[table]["launch"]
        outside = np.flatnonzero((pc < 0) | (pc >= lengths[launch_of])) if pc.size else ()
        if len(outside):
            index = int(launch_of[outside[0]])
            fail(f"corrupted trace: a {table} pc of launch {index} is outside kernel "
                 f"{meta['launches'][index]['kernel']}")
    for table, col in (("dma", "res_start"), ("dma", "res_count")):
        if tables[table][col].size and tables[table][col].min() < 0:
            fail(f"corrupted trace: {table}.{col} has a negative value")
    dma = tables["dma"]
    if not np.isin(tables["rate"]["dma"], dma["seq"]).all():
        fail("corrupted trace: rate.dma names a DMA that is not in the dma table")
    if dma["res_start"].size and (dma["res_start"] + dma["res_count"]).max() > tables["dma_res"]["resource"].size:
        fail("corrupted trace: a DMA's resource list runs past the resource table")
