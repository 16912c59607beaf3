"""Chrome trace-event JSON from a trace, for Perfetto UI and chrome://tracing.

Layout: one process per chip (pid = chip id); per core one thread per unit that
was used (instructions as complete "X" slices), one for its waits (semaphore,
DMA, barrier), one for its DMA engine (DMAs as async "b"/"e" slices, id = DMA
sequence number) and one for its source regions (nested "B"/"E" slices). Counter
("C") tracks per chip give HBM bandwidth and per link its bandwidth, in GB/s.
Timestamps are microseconds of emulated time (cycles / clock).
"""

from __future__ import annotations

import numpy as np

from mkemu.tools.trace_reader import Trace
from mkemu.tools.trace_summary import traffic_segments, wait_reasons

TID_WAITS, TID_DMA, TID_REGIONS = 90, 91, 92


def step_rate(starts, ends, rates) -> tuple[np.ndarray, np.ndarray]:
    """The sum of piecewise-constant rates as (change times, value from each time on)."""
    times = np.concatenate([starts, ends])
    deltas = np.concatenate([rates, -np.asarray(rates)])
    if not times.size:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(times, kind="stable")
    times, level = times[order], np.cumsum(deltas[order])
    last = np.ones(times.size, bool)
    last[:-1] = times[1:] != times[:-1]
    level = np.where(np.abs(level[last]) < 1e-9, 0.0, level[last])
    return times[last], level


def to_perfetto(trace: Trace) -> dict:
    us = 1e6 / trace.clock_hz
    events: list[tuple] = []   # (ts, order, event)
    pid_of = [c["chip"] for c in trace.cores]
    index_of = [c["core"] for c in trace.cores]

    def tid(gid: int, lane: int) -> int:
        return index_of[gid] * 100 + lane

    meta = []
    for chip in range(trace.num_chips):
        meta.append({"ph": "M", "name": "process_name", "pid": chip, "tid": 0, "ts": 0,
                     "args": {"name": f"chip {chip}"}})
    instr = trace.instr
    used = sorted(set(zip(instr["core"].tolist(), instr["unit"].tolist())))
    names = {}
    for gid, unit in used:
        names[(gid, unit)] = f"core {index_of[gid]} {trace.units[unit]}"
    for gid in range(len(trace.cores)):
        names[(gid, TID_WAITS)] = f"core {index_of[gid]} waits"
        names[(gid, TID_DMA)] = f"core {index_of[gid]} DMA engine"
        names[(gid, TID_REGIONS)] = f"core {index_of[gid]} regions"
    for (gid, lane), name in sorted(names.items()):
        meta.append({"ph": "M", "name": "thread_name", "pid": pid_of[gid], "tid": tid(gid, lane), "ts": 0,
                     "args": {"name": name}})
        meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid_of[gid], "tid": tid(gid, lane), "ts": 0,
                     "args": {"sort_index": tid(gid, lane) + 1000 * pid_of[gid]}})

    busy = instr["occupancy"] > 0
    for i in np.flatnonzero(busy):
        gid, launch, pc = int(instr["core"][i]), int(instr["launch"][i]), int(instr["pc"][i])
        start = int(instr["issue"][i])
        ev = {"ph": "X", "name": trace.text(launch, pc).split(" ")[0], "pid": pid_of[gid],
              "tid": tid(gid, int(instr["unit"][i])), "ts": start * us, "dur": int(instr["occupancy"][i]) * us,
              "args": {"pc": pc, "instruction": trace.text(launch, pc), "cycle": start}}
        src = trace.source(launch, pc)
        if src:
            ev["args"]["source"] = src
        if instr["stall_dep"][i] or instr["stall_unit"][i]:
            ev["args"]["stall_dependency"] = int(instr["stall_dep"][i])
            ev["args"]["stall_unit"] = int(instr["stall_unit"][i])
        events.append((start, 1, ev))

    wait = trace.wait
    reasons = wait_reasons(trace)
    for i in np.flatnonzero(wait["end"] > wait["start"]):
        gid, launch, pc = int(wait["core"][i]), int(wait["launch"][i]), int(wait["pc"][i])
        start = int(wait["start"][i])
        events.append((start, 1, {
            "ph": "X", "name": f"wait ({reasons[i]})", "pid": pid_of[gid], "tid": tid(gid, TID_WAITS),
            "ts": start * us, "dur": (int(wait["end"][i]) - start) * us,
            "args": {"pc": pc, "instruction": trace.text(launch, pc), "cycles": int(wait["end"][i]) - start}}))

    dma = trace.dma
    spaces = trace.meta["spaces"]
    for i in range(dma["seq"].size):
        if dma["begun"][i] < 0 or dma["done"][i] < 0:
            continue
        gid = int(dma["src_core"][i])
        launch, pc = int(dma["launch"][i]), int(dma["pc"][i])
        name = f"{spaces[dma['src_space'][i]]}->{spaces[dma['dst_space'][i]]}"
        common = {"cat": "dma", "id": int(dma["seq"][i]), "name": name, "pid": pid_of[gid], "tid": tid(gid, TID_DMA)}
        args = {"bytes": int(dma["size_bytes"][i]), "issued": int(dma["issued"][i]), "pc": pc,
                "instruction": trace.text(launch, pc),
                "from": trace.core_name(gid), "to": trace.core_name(int(dma["dst_core"][i]))}
        events.append((int(dma["begun"][i]), 2, dict(common, ph="b", ts=int(dma["begun"][i]) * us, args=args)))
        events.append((int(dma["done"][i]), 0, dict(common, ph="e", ts=int(dma["done"][i]) * us)))

    region = trace.region
    for i in range(region["core"].size):
        gid = int(region["core"][i])
        start, end, depth = int(region["start"][i]), int(region["end"][i]), int(region["depth"][i])
        name = f"{trace.region_names[region['name'][i]]}[{int(region['index'][i])}]"
        common = {"name": name, "pid": pid_of[gid], "tid": tid(gid, TID_REGIONS)}
        # At one timestamp: ends (innermost first) before begins (outermost first);
        # an empty region's end comes after its own begin.
        events.append((start, 3 + depth, dict(common, ph="B", ts=start * us)))
        events.append((end, -depth if end > start else 1000 - depth, dict(common, ph="E", ts=end * us)))

    segs = traffic_segments(trace)
    length = segs["end"] - segs["start"]
    rate = np.divide(segs["bytes"], length, out=np.zeros(length.size), where=length > 0)
    gb = trace.clock_hz / 1e9
    for res in trace.resources:
        if res["kind"] not in ("hbm", "link"):
            continue
        sel = segs["resource"] == res["id"]
        if res["kind"] == "link" and not sel.any():
            continue
        times, level = step_rate(segs["start"][sel], segs["end"][sel], rate[sel])
        name = "HBM GB/s" if res["kind"] == "hbm" else f"{res['name']} GB/s"
        for t, v in zip(times.tolist(), level.tolist()):
            events.append((t, 1, {"ph": "C", "name": name, "pid": res["chip"], "tid": 0, "ts": t * us,
                                  "args": {"GB/s": round(v * gb, 6)}}))

    events.sort(key=lambda e: (e[0], e[1]))
    return {"traceEvents": meta + [e for _, _, e in events], "displayTimeUnit": "ns",
            "otherData": {"profile": trace.meta.get("profile"), "clock_hz": trace.clock_hz,
                          "emulated_cycles": trace.end_cycle}}
