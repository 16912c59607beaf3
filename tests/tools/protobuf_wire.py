"""A small protobuf wire-format reader for the tests, written from the encoding rules
(https://protobuf.dev/programming-guides/encoding/), independent of the writer in
mkemu/tools/perfetto.py; and the Perfetto messages the export uses, read into dicts
by field number."""

from __future__ import annotations

import struct


def fields(data: bytes) -> list[tuple[int, int, object]]:
    """(field number, wire type, value) of every field of one message, in order:
    varints as int, fixed64 as bytes (8), length-delimited as bytes."""
    out, i = [], 0
    while i < len(data):
        key, i = _varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        elif wire == 2:
            length, i = _varint(data, i)
            value, i = data[i:i + length], i + length
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire} at byte {i}")
        if i > len(data):
            raise ValueError("message runs past its end")
        out.append((field, wire, value))
    return out


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(data):
            raise ValueError("truncated varint")
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def one(msg: list, field: int, default=None):
    values = [v for f, _, v in msg if f == field]
    assert len(values) <= 1, f"field {field} repeated"
    return values[0] if values else default


def every(msg: list, field: int) -> list:
    return [v for f, _, v in msg if f == field]


def read_perfetto(data: bytes) -> tuple[dict, list[dict]]:
    """Track descriptors by uuid, and the track events in file order, as dicts."""
    tracks, events = {}, []
    for field, wire, body in fields(data):
        assert (field, wire) == (1, 2), "a Trace holds only packets"
        packet = fields(body)
        assert one(packet, 10) == 1, "every packet is on trusted sequence 1"
        desc, event = one(packet, 60), one(packet, 11)
        assert (desc is None) != (event is None)
        if desc is not None:
            d = fields(desc)
            process = one(d, 3)
            counter = one(d, 8)
            tracks[one(d, 1)] = {"name": one(d, 2).decode(), "parent": one(d, 5), "rank": one(d, 12),
                                 "pid": one(fields(process), 1) if process else None,
                                 "unit": one(fields(counter), 6, b"").decode() if counter else None}
            continue
        e = fields(event)
        name = one(e, 23)
        value = one(e, 44)
        annotations = {}
        for a in every(e, 4):
            a = fields(a)
            annotations[one(a, 10).decode()] = one(a, 4) if one(a, 4) is not None else one(a, 6).decode()
        events.append({"ts": one(packet, 8), "type": one(e, 9), "track": one(e, 11),
                       "name": name.decode() if name is not None else None,
                       "value": struct.unpack("<d", value)[0] if value is not None else None,
                       "flows": [struct.unpack("<Q", f)[0] for f in every(e, 47)],
                       "ends": [struct.unpack("<Q", f)[0] for f in every(e, 48)],
                       "args": annotations})
    return tracks, events
