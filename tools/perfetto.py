"""A trace as a Perfetto trace (open it at https://ui.perfetto.dev): the protobuf
format, or Chrome trace-event JSON (also for chrome://tracing).

One pass over the trace decides what is drawn: which tracks, and on them which
slices, instants, counters and DMA flows (`to_perfetto`, `_Tracks` and the helpers
below it). An encoder turns those into bytes: `ProtobufEncoder` or `JsonEncoder`,
each given every track as it is first used and every event with the cycle and the
order at that cycle it sorts by.

Layout: one process per chip ("chip N"); under it, per selected core, in this
order: its source regions (nested slices: layers, operators), a stall row (waits on
semaphores, DMAs and barriers), one row per unit that did work, its DMA engine
(one row per DMA in flight at once) and the DMAs that landed in it; then the chip's
HBM and each used link's bandwidth as counters in GB/s. A unit's row shows busy
runs, not single instructions: back-to-back instructions (and runs at most one idle
cycle apart) merge into one slice named after the first one and how many followed
(this keeps the main job's trace small). Each DMA is a slice on its engine's row
joined by a flow arrow to its landing on the destination core.

Protobuf: written with a minimal wire encoder (varints, length-delimited fields,
fixed64) for the few messages it needs. Field numbers are those of Perfetto's
`protos/perfetto/trace/trace_packet.proto`, `track_event/track_event.proto`,
`track_event/track_descriptor.proto`, `track_event/counter_descriptor.proto`,
`track_event/process_descriptor.proto` and `track_event/debug_annotation.proto`.
Timestamps are whole nanoseconds of emulated time.

JSON: the trace-event format's object form (`{"traceEvents": [...]}`): `B`/`E`
slices, `i` instants, `C` counters, `s`/`f` flows, `M` metadata naming and ordering
the processes (chips) and threads (rows). Timestamps are microseconds with six
decimals (picoseconds), so a one-cycle slice keeps its length.
"""

from __future__ import annotations

import functools
import json
import struct
from array import array

import numpy as np

from mkemu.errors import TraceError
from mkemu.tools.intervals import step_rate
from mkemu.tools.trace_reader import Trace
from mkemu.tools.trace_summary import NO_ROWS, index_by, pieces, traffic_segments, wait_reasons
from mkemu.tools.view import View, core_unit_runs, view

# TrackEvent.type
SLICE_BEGIN, SLICE_END, INSTANT, COUNTER = 1, 2, 3, 4
SEQUENCE_ID = 1                 # every packet is on one writer sequence
EXPLICIT_ORDER = 3              # TrackDescriptor.ChildTracksOrdering.EXPLICIT

#: `--perfetto OUT`: the formats, chosen by OUT's name (`format_for`).
FORMATS = ("protobuf", "json")


def format_for(path) -> str:
    """The format a `--perfetto` file name asks for: JSON for a name ending in `.json`
    (any case), else protobuf."""
    return "json" if str(path).lower().endswith(".json") else "protobuf"


# -- protobuf wire format -------------------------------------------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Most varints (track ids, lengths, field tags) are small: looked up, not computed.
_SMALL = [_varint(n) for n in range(1 << 14)]


def varint(n: int) -> bytes:
    if n < 16384:
        return _SMALL[n]
    if n < 2097152:             # three bytes (most nanosecond timestamps): built at once
        return bytes((n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14))
    return _varint(n)


def tag(field: int, wire: int) -> bytes:
    return varint(field << 3 | wire)


def f_varint(field: int, n: int) -> bytes:
    return tag(field, 0) + varint(n)


def f_bytes(field: int, data: bytes) -> bytes:
    return tag(field, 2) + varint(len(data)) + data


def f_str(field: int, text: str) -> bytes:
    return f_bytes(field, text.encode())


def f_fixed64(field: int, n: int) -> bytes:
    return tag(field, 1) + struct.pack("<Q", n)


def f_double(field: int, x: float) -> bytes:
    return tag(field, 1) + struct.pack("<d", x)


_PACKET = tag(1, 2)                         # Trace.packet
_TS = tag(8, 0)                             # TracePacket.timestamp
_SEQ = f_varint(10, SEQUENCE_ID)            # TracePacket.trusted_packet_sequence_id
_EVENT = tag(11, 2)                         # TracePacket.track_event
_SEQ_EVENT = _SEQ + _EVENT
_TYPE = {t: f_varint(9, t) for t in (SLICE_BEGIN, SLICE_END, INSTANT, COUNTER)}
_TRACK = tag(11, 0)                         # TrackEvent.track_uuid


def packet(body: bytes) -> bytes:
    return _PACKET + varint(len(body)) + body


@functools.lru_cache(maxsize=1 << 16)
def _name(name: str) -> bytes:
    return f_str(23, name)                  # TrackEvent.name


def annotation(name: str, value) -> bytes:
    """TrackEvent.debug_annotations (4): name (10) and an int (4) or string (6) value."""
    body = f_str(10, name) + (f_varint(4, value) if isinstance(value, int) else f_str(6, str(value)))
    return f_bytes(4, body)


def track_packet(uuid: int, name: str, parent: int | None = None, rank: int | None = None,
                 pid: int | None = None, counter_unit: str | None = None, first: bool = False) -> bytes:
    desc = f_varint(1, uuid) + f_str(2, name)
    if parent is not None:
        desc += f_varint(5, parent)
    if pid is not None:                     # ProcessDescriptor: pid (1), process_name (6)
        desc += f_bytes(3, f_varint(1, pid) + f_str(6, name)) + f_varint(11, EXPLICIT_ORDER)
    if rank is not None:
        desc += f_varint(12, rank)          # sibling_order_rank
    if counter_unit is not None:
        desc += f_bytes(8, f_str(6, counter_unit))   # CounterDescriptor.unit_name
    body = f_bytes(60, desc) + _SEQ
    if first:
        body += f_varint(13, 1)             # sequence_flags: SEQ_INCREMENTAL_STATE_CLEARED
    return packet(body)


# -- the events, sorted ---------------------------------------------------------

class _Events:
    """Every event's (cycle, order at that cycle, encoded bytes), appended as a tuple
    and kept flat: times and orders in int64 arrays, the encodings end to end in one
    buffer (a tuple, two ints and a bytes object per event took ~170 bytes more each)."""

    def __init__(self):
        self.times = array("q")
        self.orders = array("q")
        self.ends = array("q")
        self.data = bytearray()

    def append(self, event: tuple[int, int, bytes]) -> None:
        t, order, packet = event
        self.times.append(t)
        self.orders.append(order)
        self.data += packet
        self.ends.append(len(self.data))

    def __len__(self) -> int:
        return len(self.times)

    def in_order(self, head: list[bytes] = (), tail: list[bytes] = ()) -> bytes:
        """`head`, then the events' bytes sorted by time, then order (ties: in the order
        they came), then `tail`. Uses up the events (their buffer is let go before the
        final join)."""
        # By cycle, not by the nanosecond the packet carries: at 2.2 GHz a one-cycle
        # slice starts and ends in one nanosecond, and sorted by that its end (order 0)
        # came before its begin (order 10), unpairing every later slice of its track.
        times, orders = np.frombuffer(self.times, np.int64), np.frombuffer(self.orders, np.int64)
        order = np.lexsort((orders, times))
        ends = np.frombuffer(self.ends, np.int64)
        starts = ends - np.diff(ends, prepend=0)
        data = np.frombuffer(self.data, np.uint8)
        out = list(head)
        for rows in pieces(order.size, 1 << 16):
            pick = order[rows]
            lengths = ends[pick] - starts[pick]
            at = np.repeat(starts[pick] - (np.cumsum(lengths) - lengths), lengths) + np.arange(lengths.sum())
            out.append(data[at].tobytes())
        del data, times, orders, ends
        self.__init__()
        out.extend(tail)
        return b"".join(out)


# -- encoders -------------------------------------------------------------------
#
# An encoder is told each track once, before its first event (`process`, `row`,
# `counter_track`), then the events: `slice` (a begin and its end), `instant`,
# `counter`. Every event comes with the cycle and the order at that cycle it sorts
# by; its time is one of the values `stamp` gave for cycles (the encoder's own unit).
# `result()` gives the file's bytes.

class ProtobufEncoder:
    """Perfetto TracePackets: a TrackDescriptor per track, a TrackEvent per event
    (timestamps in whole nanoseconds)."""

    def __init__(self, trace: Trace, v: View):
        self.ns = 1e9 / trace.clock_hz
        self.path = trace.path
        self.head: list[bytes] = []
        self.events = _Events()
        ev = self.events
        self._times, self._orders, self._ends, self._data = ev.times.append, ev.orders.append, ev.ends.append, ev.data

    def stamp(self, cycles) -> list:
        """Nanoseconds, each as the encoded TracePacket.timestamp field."""
        ns = np.rint(np.asarray(cycles, np.float64) * self.ns)
        if ns.size and not (ns.min() >= 0 and ns.max() < 2.0**63):    # (a slow clock scales cycles past int64)
            raise TraceError(f"a time of {float(ns.max()):.3g} ns is past what a Perfetto timestamp holds "
                             "(2^63 ns)", file=self.path)
        return [_TS + varint(t) for t in ns.astype(np.int64).tolist()]

    def process(self, uuid: int, chip: int, name: str) -> None:
        self.head.append(track_packet(uuid, name, pid=chip + 1, first=not self.head))

    def row(self, uuid: int, chip: int, parent: int, name: str, rank: int) -> None:
        self.head.append(track_packet(uuid, name, parent=parent, rank=rank))

    def counter_track(self, uuid: int, chip: int, parent: int, name: str, rank: int, unit: str) -> None:
        self.head.append(track_packet(uuid, f"{name} {unit}", parent=parent, rank=rank, counter_unit=unit))

    def _add(self, cycle: int, order: int, pkt: bytes) -> None:
        self._times(cycle)
        self._orders(order)
        data = self._data
        data += pkt
        self._ends(len(data))

    def slice(self, c0: int, o0: int, c1: int, o1: int, t0: bytes, t1: bytes, track: int, name: str,
              args: tuple = (), flow: int = 0, flow_lands: bool = False) -> None:
        """A slice [c0, c1] on `track`: its begin sorted at (c0, o0), its end at (c1, o1).
        `flow`: the id of a flow that starts at it (0: none; `flow_lands`: whether its
        end is drawn too, which Perfetto does not need)."""
        tr = _TRACK + varint(track)
        ev = _TYPE[SLICE_BEGIN] + tr
        if flow:
            ev += f_fixed64(47, flow)       # TrackEvent.flow_ids
        for key, value in args:
            ev += annotation(key, value)
        ev += _name(name)
        body = t0 + _SEQ_EVENT + varint(len(ev)) + ev
        times, orders, ends, data = self._times, self._orders, self._ends, self._data
        times(c0)
        orders(o0)
        data += _PACKET + varint(len(body)) + body
        ends(len(data))
        ev = _TYPE[SLICE_END] + tr
        body = t1 + _SEQ_EVENT + varint(len(ev)) + ev
        times(c1)
        orders(o1)
        data += _PACKET + varint(len(body)) + body
        ends(len(data))

    def instant(self, cycle: int, order: int, t: bytes, track: int, name: str, flow_end: int = 0) -> None:
        """An instant; `flow_end`: the id of the flow that ends at it (0: none)."""
        extra = f_fixed64(48, flow_end) if flow_end else b""   # TrackEvent.terminating_flow_ids
        ev = _TYPE[INSTANT] + _TRACK + varint(track) + extra + _name(name)
        self._add(cycle, order, packet(t + _SEQ_EVENT + varint(len(ev)) + ev))

    def counter(self, cycle: int, order: int, t: bytes, track: int, value: float) -> None:
        ev = _TYPE[COUNTER] + _TRACK + varint(track) + f_double(44, value)   # TrackEvent.double_counter_value
        self._add(cycle, order, packet(t + _SEQ_EVENT + varint(len(ev)) + ev))

    def result(self) -> bytes:
        return self.events.in_order(self.head)


_jstr = functools.lru_cache(maxsize=1 << 16)(json.dumps)   # a JSON string literal


class JsonEncoder:
    """Chrome trace-event JSON (the object form). Chips are processes (pid chip + 1),
    rows threads (tid: the track's id plus the number of chips, so no tid is a pid),
    named and ordered by `M` events (`process_name`, `process_sort_index`,
    `thread_name`, `thread_sort_index`: the protobuf's sibling order rank). Counters
    are process counters named like the protobuf's counter tracks (`C` event "chip 0
    HBM" with the series "GB/s": Perfetto shows "chip 0 HBM GB/s"). A DMA's flow is an
    `s` right after its slice's `B` (binding to that slice, the enclosing one) and an
    `f` right before the `i` of its landing (binding to the next slice on that row: the
    landing), drawn only when both ends are. Every event is written as its own
    compact line."""

    def __init__(self, trace: Trace, v: View):
        self.ps = 1e12 / trace.clock_hz     # picoseconds per cycle
        self.tid_base = trace.num_chips
        other = {"format": "mkemu trace (Perfetto export)", "trace": str(trace.path),
                 "profile": trace.meta.get("profile"), "clock_hz": trace.clock_hz,
                 "from_cycle": v.t0, "to_cycle": v.t1, "time_unit": "us"}
        self.head: list[str] = ['{"displayTimeUnit":"ns","otherData":' + json.dumps(other, separators=(",", ":"))
                                + ',"traceEvents":[\n']
        self.first = True
        self.where: dict[int, str] = {}     # track -> ',"pid":P,"tid":T' (a row) or ',"pid":P' (a counter)
        self.counter_name: dict[int, str] = {}
        self.events = _Events()
        ev = self.events
        self._times, self._orders, self._ends, self._data = ev.times.append, ev.orders.append, ev.ends.append, ev.data

    def stamp(self, cycles) -> list:
        """Microseconds, rounded to whole picoseconds (Python floats, written in the
        shortest form that reads back the same: at most six decimals)."""
        return (np.rint(np.asarray(cycles, np.float64) * self.ps) / 1e6).tolist()

    def _meta(self, text: str) -> None:
        self.head.append(text if self.first else ",\n" + text)
        self.first = False

    def process(self, uuid: int, chip: int, name: str) -> None:
        pid = chip + 1
        self.where[uuid] = f',"pid":{pid}'
        self._meta(f'{{"ph":"M","name":"process_name","pid":{pid},"args":{{"name":{_jstr(name)}}}}}')
        self._meta(f'{{"ph":"M","name":"process_sort_index","pid":{pid},"args":{{"sort_index":{chip}}}}}')

    def row(self, uuid: int, chip: int, parent: int, name: str, rank: int) -> None:
        pid, tid = chip + 1, self.tid_base + uuid
        self.where[uuid] = f',"pid":{pid},"tid":{tid}'
        self._meta(f'{{"ph":"M","name":"thread_name","pid":{pid},"tid":{tid},"args":{{"name":{_jstr(name)}}}}}')
        self._meta(f'{{"ph":"M","name":"thread_sort_index","pid":{pid},"tid":{tid},'
                   f'"args":{{"sort_index":{rank}}}}}')

    def counter_track(self, uuid: int, chip: int, parent: int, name: str, rank: int, unit: str) -> None:
        self.where[uuid] = f',"pid":{chip + 1}'
        self.counter_name[uuid] = f'"name":{_jstr(name)},"args":{{{_jstr(unit)}:'

    def _add(self, cycle: int, order: int, text: str) -> None:
        self._times(cycle)
        self._orders(order)
        data = self._data
        data += text.encode()
        self._ends(len(data))

    def slice(self, c0: int, o0: int, c1: int, o1: int, t0: float, t1: float, track: int, name: str,
              args: tuple = (), flow: int = 0, flow_lands: bool = False) -> None:
        where = self.where[track]
        extra = ""
        if args:
            extra = ',"args":' + json.dumps(dict(args), separators=(",", ":"))
        times, orders, ends, data = self._times, self._orders, self._ends, self._data
        times(c0)
        orders(o0)
        data += f',\n{{"ph":"B","ts":{t0}{where},"name":{_jstr(name)}{extra}}}'.encode()
        ends(len(data))
        if flow and flow_lands:
            times(c0)
            orders(o0)
            data += f',\n{{"ph":"s","ts":{t0}{where},"name":"dma","cat":"dma","id":{flow}}}'.encode()
            ends(len(data))
        times(c1)
        orders(o1)
        data += f',\n{{"ph":"E","ts":{t1}{where}}}'.encode()
        ends(len(data))

    def instant(self, cycle: int, order: int, t: float, track: int, name: str, flow_end: int = 0) -> None:
        where = self.where[track]
        if flow_end:
            self._add(cycle, order, f',\n{{"ph":"f","ts":{t}{where},"name":"dma","cat":"dma","id":{flow_end}}}')
        self._add(cycle, order, f',\n{{"ph":"i","s":"t","ts":{t}{where},"name":{_jstr(name)}}}')

    def counter(self, cycle: int, order: int, t: float, track: int, value: float) -> None:
        self._add(cycle, order, f',\n{{"ph":"C","ts":{t}{self.where[track]},{self.counter_name[track]}{value!r}}}}}')

    def result(self) -> bytes:
        return self.events.in_order([text.encode() for text in self.head], [b"\n]}\n"])


ENCODERS = {"protobuf": ProtobufEncoder, "json": JsonEncoder}


# -- the export -----------------------------------------------------------------

# Display order of a core's rows under its chip (sibling_order_rank = core * 100 + slot).
SLOT_REGIONS, SLOT_STALLS, SLOT_UNIT, SLOT_DMA, SLOT_LANDED = 0, 1, 10, 50, 90
RANK_COUNTERS = 100_000


class _Tracks:
    """Track ids: a process track per chip, and child tracks under it in an explicit
    order (per core: regions, stalls, units, DMA engine; then counters), each told to
    the encoder when first used."""

    def __init__(self, trace: Trace, enc):
        self.trace = trace
        self.enc = enc
        self.uuid: dict[tuple, int] = {}

    def chip(self, chip: int) -> int:
        key = ("chip", chip)
        if key not in self.uuid:
            self.uuid[key] = len(self.uuid) + 1
            self.enc.process(self.uuid[key], chip, f"chip {chip}")
        return self.uuid[key]

    def core(self, gid: int, slot: int, key: tuple, label: str) -> int:
        """The row `label` of core `gid` (named "core N label")."""
        c = self.trace.cores[gid]
        return self.child(c["chip"], key, f"core {c['core']} {label}", c["core"] * 100 + slot)

    def child(self, chip: int, key: tuple, name: str, rank: int) -> int:
        if key not in self.uuid:
            parent = self.chip(chip)
            self.uuid[key] = len(self.uuid) + 1
            self.enc.row(self.uuid[key], chip, parent, name, rank)
        return self.uuid[key]

    def counter(self, chip: int, key: tuple, name: str, rank: int, unit: str) -> int:
        if key not in self.uuid:
            parent = self.chip(chip)
            self.uuid[key] = len(self.uuid) + 1
            self.enc.counter_track(self.uuid[key], chip, parent, name, rank, unit)
        return self.uuid[key]


def to_perfetto(trace: Trace, v: View | None = None, fmt: str | None = None, *, path=None) -> bytes:
    """The trace (the cores and window of `v`, default all) as a Perfetto trace's bytes:
    `fmt` "protobuf" (the default) or "json"; without `fmt`, the one `path`'s name asks
    for (`format_for`)."""
    fmt = fmt or (format_for(path) if path is not None else "protobuf")
    if fmt not in ENCODERS:
        raise ValueError(f"unknown Perfetto format {fmt!r} (one of {', '.join(FORMATS)})")
    v = v or view(trace)
    enc = ENCODERS[fmt](trace, v)
    stamp = enc.stamp
    tracks = _Tracks(trace, enc)
    for chip in v.chips:
        tracks.chip(chip)

    # Regions first in each core's group, then stalls, units, the DMA engine.
    region = trace.region
    keep, _, _ = v.clip(region["start"], region["end"])
    rows = np.flatnonzero(keep & v.has_core(region["core"]))
    rs, re_ = np.clip(region["start"][rows], v.t0, v.t1), np.clip(region["end"][rows], v.t0, v.t1)
    for gid in v.gids:
        tracks.core(gid, SLOT_REGIONS, ("regions", gid), "regions")
        tracks.core(gid, SLOT_STALLS, ("stalls", gid), "stalls")
    depth = region["depth"][rows]
    add = enc.slice
    for i, cs, ce, s, e, d in zip(rows.tolist(), rs.tolist(), re_.tolist(), stamp(rs), stamp(re_), depth.tolist()):
        gid = int(region["core"][i])
        track = tracks.uuid[("regions", gid)]
        name = f"{trace.region_names[region['name'][i]]}[{int(region['index'][i])}]"
        # At one cycle: ends (innermost first) before begins (outermost first); an
        # empty region's end comes right after its own begin.
        add(cs, 10 + d, ce, -d if ce > cs else 1000 - d, s, e, track, name)

    wait = trace.wait
    reasons = wait_reasons(trace)
    keep, _, _ = v.clip(wait["start"], wait["end"])
    rows = np.flatnonzero(keep & v.has_core(wait["core"]))
    wcs, wce = np.clip(wait["start"][rows], v.t0, v.t1), np.clip(wait["end"][rows], v.t0, v.t1)
    for i, cs, ce, s, e in zip(rows.tolist(), wcs.tolist(), wce.tolist(), stamp(wcs), stamp(wce)):
        if wait["end"][i] <= wait["start"][i]:
            continue
        add(cs, 10, ce, 0, s, e, tracks.uuid[("stalls", int(wait["core"][i]))], f"wait {reasons[i]}")

    mnemonic = {}
    instr = trace.instr
    # One core at a time (runs never merge across cores): its unit rows, then its runs.
    for _, core_runs in core_unit_runs(trace, v):
        if core_runs is None:
            continue
        runs = _merge_gaps(core_runs, MERGE_GAP_CYCLES)
        for gid, unit in sorted(set(zip(runs["core"].tolist(), runs["unit"].tolist()))):
            tracks.core(gid, SLOT_UNIT + unit, ("unit", gid, unit), trace.units[unit])
        launch, pc = instr["launch"], instr["pc"]
        for gid, unit, cs, ce, s, e, n, first in zip(runs["core"].tolist(), runs["unit"].tolist(),
                                                     runs["start"].tolist(), runs["end"].tolist(),
                                                     stamp(runs["start"]), stamp(runs["end"]),
                                                     runs["count"].tolist(), runs["first"].tolist()):
            key = (int(launch[first]), int(pc[first]))
            if key not in mnemonic:
                mnemonic[key] = trace.text(*key).split(" ")[0]
            add(cs, 10, ce, 0, s, e, tracks.uuid[("unit", gid, unit)],
                mnemonic[key] if n == 1 else f"{mnemonic[key]} +{n - 1}")

    _dmas(trace, v, tracks, enc)
    _counters(trace, v, tracks, enc)
    return enc.result()


#: A unit's busy runs separated by at most this many idle cycles are drawn as one slice:
#: a one-cycle gap (under half a nanosecond on tpu-v7-like) cannot be seen at any zoom
#: of nanosecond timestamps, and merging such gaps halves the main job's trace.
MERGE_GAP_CYCLES = 1


def _merge_gaps(runs: dict[str, np.ndarray], gap: int) -> dict[str, np.ndarray]:
    """Runs of one core's unit that follow each other within `gap` idle cycles, as one
    run (its count the sum of theirs, named after its first instruction)."""
    if runs["core"].size < 2:
        return runs
    core, unit, start, end = runs["core"], runs["unit"], runs["start"], runs["end"]
    joins = (core[1:] == core[:-1]) & (unit[1:] == unit[:-1]) & (start[1:] - end[:-1] <= gap)
    heads = np.flatnonzero(np.concatenate([[True], ~joins]))
    return {"core": core[heads], "unit": unit[heads], "start": start[heads],
            "end": np.maximum.reduceat(end, heads), "count": np.add.reduceat(runs["count"], heads),
            "first": runs["first"][heads]}


def _dmas(trace: Trace, v: View, tracks: _Tracks, enc) -> None:
    """DMA slices on their issuing core's engine rows (a DMA per row at a time: the
    engine moves several at once), each joined by a flow to where it landed."""
    dma = trace.dma
    spaces = trace.meta["spaces"]
    # A DMA still moving when a fault ended the run (done -1) moves to the trace's end
    # and never lands.
    landed = dma["done"] >= 0
    until = np.where(landed, dma["done"], trace.end_cycle)
    keep, _, _ = v.clip(dma["begun"], until)
    rows = np.flatnonzero((dma["begun"] >= 0) & keep & (v.has_core(dma["src_core"]) | v.has_core(dma["dst_core"])))
    rows = rows[np.lexsort((dma["seq"][rows], dma["begun"][rows]))]
    begun, finished = dma["begun"][rows], until[rows]
    cut0, cut1 = np.maximum(begun, v.t0), np.minimum(finished, v.t1)
    gids = set(v.gids)
    lane_free: dict[int, list[int]] = {}
    for i, b, f, cs, ce, s, e, t in zip(rows.tolist(), begun.tolist(), finished.tolist(), cut0.tolist(),
                                        cut1.tolist(), enc.stamp(cut0), enc.stamp(cut1), enc.stamp(finished)):
        src, dst = int(dma["src_core"][i]), int(dma["dst_core"][i])
        seq = int(dma["seq"][i])
        lands = bool(landed[i]) and dst in gids and v.t0 <= f <= v.t1
        if src in gids:
            free = lane_free.setdefault(src, [])
            lane = next((k for k, t_free in enumerate(free) if t_free <= b), len(free))
            if lane == len(free):
                free.append(0)
            free[lane] = f
            track = tracks.core(src, SLOT_DMA + lane, ("dma", src, lane), f"DMA engine {lane}")
            name = f"{spaces[dma['src_space'][i]]}->{spaces[dma['dst_space'][i]]}"
            args = (("bytes", int(dma["size_bytes"][i])), ("to", trace.core_name(dst)), ("pc", int(dma["pc"][i])))
            # (flow ids: the sequence number + 1, as 0 is not a valid id)
            enc.slice(cs, 10, ce, 0 if ce > cs else 10, s, e, track, name, args,
                      flow=seq + 1 if landed[i] else 0, flow_lands=lands)
        if lands:
            track = tracks.core(dst, SLOT_LANDED, ("landed", dst), "DMAs landed")
            enc.instant(f, 5, t, track, f"from {trace.core_name(src)}", flow_end=seq + 1 if src in gids else 0)


def _counters(trace: Trace, v: View, tracks: _Tracks, enc) -> None:
    """HBM and link bandwidth per chip in GB/s, from the DMAs' rate segments."""
    segs = traffic_segments(trace)
    length = segs["end"] - segs["start"]
    rate = np.divide(segs["bytes"], length, out=np.zeros(length.size), where=length > 0)
    gb = trace.clock_hz / 1e9
    by_resource = index_by(segs["resource"])
    for res in trace.resources:
        if res["kind"] not in ("hbm", "link") or res["chip"] not in v.chips:
            continue
        sel = by_resource.get(res["id"], NO_ROWS)
        if res["kind"] == "link" and not sel.size:
            continue
        times, level = step_rate(segs["start"][sel], segs["end"][sel], rate[sel])
        inside = (times >= v.t0) & (times < v.t1)
        # The level in force at the window's start, then every change inside it.
        before = np.flatnonzero(times < v.t0)
        times = np.concatenate([[v.t0], times[inside]])
        level = np.concatenate([[level[before[-1]] if before.size else 0.0], level[inside]])
        name = f"chip {res['chip']} HBM" if res["kind"] == "hbm" else res["name"]
        track = tracks.counter(res["chip"], ("counter", res["id"]), name, RANK_COUNTERS + res["id"], "GB/s")
        for c, t, value in zip(np.rint(times).astype(np.int64).tolist(), enc.stamp(times), level.tolist()):
            enc.counter(c, 1, t, track, round(value * gb, 6))
