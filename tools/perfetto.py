"""A trace as a Perfetto protobuf trace (open it at https://ui.perfetto.dev).

Written with a minimal protobuf wire encoder (varints, length-delimited fields,
fixed64) for the few messages it needs. Field numbers are those of Perfetto's
`protos/perfetto/trace/trace_packet.proto`, `track_event/track_event.proto`,
`track_event/track_descriptor.proto`, `track_event/counter_descriptor.proto`,
`track_event/process_descriptor.proto` and `track_event/debug_annotation.proto`.

Layout: one process track per chip ("chip N"); under it, per selected core, in this
order: its source regions (nested slices: layers, operators), a stall row (waits on
semaphores, DMAs and barriers), one row per unit that did work, its DMA engine
(one row per DMA in flight at once) and the DMAs that landed in it; then the chip's
HBM and each used link's bandwidth as counters in GB/s. A unit's row shows busy
runs, not single instructions: back-to-back instructions (and runs at most one idle
cycle apart) merge into one slice named after the first one and how many followed
(this keeps the main job's trace small). Each DMA is a slice on its engine's row
joined by a flow arrow to its landing on the destination core. Timestamps are nanoseconds of emulated time.
"""

from __future__ import annotations

import functools
import struct
from array import array

import numpy as np

from mkemu.tools.intervals import step_rate
from mkemu.tools.trace_reader import Trace
from mkemu.tools.trace_summary import NO_ROWS, index_by, pieces, traffic_segments, wait_reasons
from mkemu.tools.view import View, core_unit_runs, view

# TrackEvent.type
SLICE_BEGIN, SLICE_END, INSTANT, COUNTER = 1, 2, 3, 4
SEQUENCE_ID = 1                 # every packet is on one writer sequence
EXPLICIT_ORDER = 3              # TrackDescriptor.ChildTracksOrdering.EXPLICIT


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
    return _SMALL[n] if n < 16384 else _varint(n)


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
_TYPE = {t: f_varint(9, t) for t in (SLICE_BEGIN, SLICE_END, INSTANT, COUNTER)}
_TRACK = tag(11, 0)                         # TrackEvent.track_uuid


def packet(body: bytes) -> bytes:
    return _PACKET + varint(len(body)) + body


@functools.lru_cache(maxsize=1 << 16)
def _name(name: str) -> bytes:
    return f_str(23, name)                  # TrackEvent.name


def event_packet(ts: int, kind: int, track: int, name: str | None = None, extra: bytes = b"") -> bytes:
    ev = _TYPE[kind] + _TRACK + varint(track) + extra
    if name is not None:
        ev += _name(name)
    return packet(_TS + varint(ts) + _SEQ + _EVENT + varint(len(ev)) + ev)


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


# -- the export -----------------------------------------------------------------

# Display order of a core's rows under its chip (sibling_order_rank = core * 100 + slot).
SLOT_REGIONS, SLOT_STALLS, SLOT_UNIT, SLOT_DMA, SLOT_LANDED = 0, 1, 10, 50, 90
RANK_COUNTERS = 100_000


class _Tracks:
    """Track uuids: a process track per chip, and child tracks under it in an
    explicit order (per core: regions, stalls, units, DMA engine; then counters)."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.packets: list[bytes] = []
        self.uuid: dict[tuple, int] = {}

    def chip(self, chip: int) -> int:
        key = ("chip", chip)
        if key not in self.uuid:
            self.uuid[key] = len(self.uuid) + 1
            self.packets.append(track_packet(self.uuid[key], f"chip {chip}", pid=chip + 1,
                                             first=not self.packets))
        return self.uuid[key]

    def core(self, gid: int, slot: int, key: tuple, label: str) -> int:
        """The row `label` of core `gid` (named "core N label")."""
        c = self.trace.cores[gid]
        return self.child(c["chip"], key, f"core {c['core']} {label}", c["core"] * 100 + slot)

    def child(self, chip: int, key: tuple, name: str, rank: int, counter_unit: str | None = None) -> int:
        if key not in self.uuid:
            parent = self.chip(chip)
            self.uuid[key] = len(self.uuid) + 1
            self.packets.append(track_packet(self.uuid[key], name, parent=parent, rank=rank,
                                             counter_unit=counter_unit))
        return self.uuid[key]


def to_perfetto(trace: Trace, v: View | None = None) -> bytes:
    """The trace (the cores and window of `v`, default all) as Perfetto protobuf bytes."""
    v = v or view(trace)
    ns = 1e9 / trace.clock_hz

    def stamp(cycles) -> np.ndarray:
        return np.rint(np.asarray(cycles, np.float64) * ns).astype(np.int64)

    tracks = _Tracks(trace)
    events = _Events()
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
    for i, cs, ce, s, e, d in zip(rows.tolist(), rs.tolist(), re_.tolist(), stamp(rs).tolist(),
                                  stamp(re_).tolist(), depth.tolist()):
        gid = int(region["core"][i])
        track = tracks.uuid[("regions", gid)]
        name = f"{trace.region_names[region['name'][i]]}[{int(region['index'][i])}]"
        # At one cycle: ends (innermost first) before begins (outermost first); an
        # empty region's end comes right after its own begin.
        events.append((cs, 10 + d, event_packet(s, SLICE_BEGIN, track, name)))
        events.append((ce, -d if ce > cs else 1000 - d, event_packet(e, SLICE_END, track)))

    wait = trace.wait
    reasons = wait_reasons(trace)
    keep, _, _ = v.clip(wait["start"], wait["end"])
    rows = np.flatnonzero(keep & v.has_core(wait["core"]))
    wcs, wce = np.clip(wait["start"][rows], v.t0, v.t1), np.clip(wait["end"][rows], v.t0, v.t1)
    for i, cs, ce, s, e in zip(rows.tolist(), wcs.tolist(), wce.tolist(), stamp(wcs).tolist(), stamp(wce).tolist()):
        if wait["end"][i] <= wait["start"][i]:
            continue
        track = tracks.uuid[("stalls", int(wait["core"][i]))]
        events.append((cs, 10, event_packet(s, SLICE_BEGIN, track, f"wait {reasons[i]}")))
        events.append((ce, 0, event_packet(e, SLICE_END, track)))

    mnemonic = {}
    instr = trace.instr
    # One core at a time (runs never merge across cores): its unit rows, then its runs.
    for _, core_runs in core_unit_runs(trace, v):
        if core_runs is None:
            continue
        runs = _merge_gaps(core_runs, MERGE_GAP_CYCLES)
        for gid, unit in sorted(set(zip(runs["core"].tolist(), runs["unit"].tolist()))):
            tracks.core(gid, SLOT_UNIT + unit, ("unit", gid, unit), trace.units[unit])
        for gid, unit, cs, ce, s, e, n, first in zip(runs["core"].tolist(), runs["unit"].tolist(),
                                                     runs["start"].tolist(), runs["end"].tolist(),
                                                     stamp(runs["start"]).tolist(), stamp(runs["end"]).tolist(),
                                                     runs["count"].tolist(), runs["first"].tolist()):
            key = (int(instr["launch"][first]), int(instr["pc"][first]))
            if key not in mnemonic:
                mnemonic[key] = trace.text(*key).split(" ")[0]
            name = mnemonic[key] if n == 1 else f"{mnemonic[key]} +{n - 1}"
            track = tracks.uuid[("unit", gid, unit)]
            events.append((cs, 10, event_packet(s, SLICE_BEGIN, track, name)))
            events.append((ce, 0, event_packet(e, SLICE_END, track)))

    _dmas(trace, v, tracks, events, stamp)
    _counters(trace, v, tracks, events, stamp)

    return events.in_order(tracks.packets)


class _Events:
    """Every event's (cycle, order at that cycle, packet), appended as a tuple and kept
    flat: times and orders in int64 arrays, the packets end to end in one buffer (a
    tuple, two ints and a bytes object per event took ~170 bytes more each)."""

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

    def in_order(self, head: list[bytes] = ()) -> bytes:
        """`head`, then the packets sorted by time, then order (ties: in the order they
        came). Uses up the events (their buffer is let go before the final join)."""
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
        return b"".join(out)


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


def _dmas(trace: Trace, v: View, tracks: _Tracks, events: _Events, stamp) -> None:
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
    lane_free: dict[int, list[int]] = {}
    for i in rows.tolist():
        src, dst = int(dma["src_core"][i]), int(dma["dst_core"][i])
        begun, finished, seq = int(dma["begun"][i]), int(until[i]), int(dma["seq"][i])
        flow = f_fixed64(47, seq + 1) if landed[i] else b""   # TrackEvent.flow_ids (0 is not a valid id)
        if src in v.gids:
            free = lane_free.setdefault(src, [])
            lane = next((k for k, t in enumerate(free) if t <= begun), len(free))
            if lane == len(free):
                free.append(0)
            free[lane] = finished
            track = tracks.core(src, SLOT_DMA + lane, ("dma", src, lane), f"DMA engine {lane}")
            cs, ce = max(begun, v.t0), min(finished, v.t1)
            s, e = (int(x) for x in stamp([cs, ce]))
            name = f"{spaces[dma['src_space'][i]]}->{spaces[dma['dst_space'][i]]}"
            extra = flow + annotation("bytes", int(dma["size_bytes"][i])) + annotation(
                "to", trace.core_name(dst)) + annotation("pc", int(dma["pc"][i]))
            events.append((cs, 10, event_packet(s, SLICE_BEGIN, track, name, extra)))
            events.append((ce, 0 if ce > cs else 10, event_packet(e, SLICE_END, track)))
        if landed[i] and dst in v.gids and v.t0 <= finished <= v.t1:
            track = tracks.core(dst, SLOT_LANDED, ("landed", dst), "DMAs landed")
            t = int(stamp([finished])[0])
            end_flow = f_fixed64(48, seq + 1) if src in v.gids else b""   # terminating_flow_ids
            events.append((finished, 5, event_packet(t, INSTANT, track, f"from {trace.core_name(src)}", end_flow)))


def _counters(trace: Trace, v: View, tracks: _Tracks, events: _Events, stamp) -> None:
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
        track = tracks.child(res["chip"], ("counter", res["id"]), f"{name} GB/s", RANK_COUNTERS + res["id"],
                             counter_unit="GB/s")
        for c, t, value in zip(np.rint(times).astype(np.int64).tolist(), stamp(times).tolist(), level.tolist()):
            events.append((c, 1, event_packet(t, COUNTER, track, extra=f_double(44, round(value * gb, 6)))))
