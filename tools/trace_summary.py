"""`mkemu trace PATH`: where did the cycles go.

`summarize(trace, ...)` computes, over a window (the launches' cycles, narrowed by
--from/--to and by --region to the cycles the selected cores spent in that
region) and over the selected chips and cores: per-unit busy fraction per core;
HBM, link and DMA-engine bandwidth utilisation; stall cycles by reason; a
per-region table (time, share, DMA bytes issued and their rate); the longest
HBM bubbles with the instruction that was waited on; DMA/compute overlap.
`render_text` prints it; `--json` prints the same dict.

Bandwidth comes from each DMA's recorded rate segments (rates are piecewise
constant), scaled so each DMA's segments add up to exactly its bytes.
"""

from __future__ import annotations

import re

import numpy as np

from mkemu.errors import ConfigError, EmulatorFault
from mkemu.tools.intervals import Spans
from mkemu.tools.trace_reader import Trace

COMPUTE_UNITS = ("valu", "xlu", "eup")   # plus every mxu<i>
STALL_REASONS = ("unit", "dependency", "dma", "semaphore", "barrier")


def selected_cores(trace: Trace, chips=None, cores=None) -> list[int]:
    """The global ids of the cores of `chips` (None: every chip) whose index on their
    chip is in `cores` (None: every core). Each value must select something: a
    `--chip 9` beside a `--chip 1` is as much an error as on its own."""
    out = [c["gid"] for c in trace.cores
           if (chips is None or c["chip"] in chips) and (cores is None or c["core"] in cores)]
    # (cores per chip from the cores themselves: the metadata's `cores_per_chip` is not required of a trace)
    per_chip = max((c["core"] for c in trace.cores), default=-1) + 1
    has = f"the trace has {trace.num_chips} chip(s), 0..{trace.num_chips - 1}, of {per_chip} cores each"
    no_chip = [c for c in chips or () if not any(k["chip"] == c for k in trace.cores)]
    if not out:
        asked = " ".join([*(f"--chip {c}" for c in chips or ()), *(f"--core {c}" for c in cores or ())])
        raise ConfigError(f"no core matches {asked} ({has})", key="--chip" if no_chip or not cores else "--core")
    if no_chip:
        raise ConfigError(f"--chip {no_chip[0]} matches no core ({has})", key="--chip")
    no_core = [c for c in cores or () if not any(k["core"] == c for k in trace.cores)]
    if no_core:
        raise ConfigError(f"--core {no_core[0]} matches no core ({has})", key="--core")
    return out


def region_label(trace: Trace, name_id: int, index: int) -> str:
    return f"{trace.region_names[name_id]}[{index}]"


def window(trace: Trace, gids: list[int], region: str | None = None, start=None, end=None) -> Spans:
    launches = Spans.union([l["start"] for l in trace.launches], [l["end"] for l in trace.launches])
    # An open end is the launches' own (a bound at infinity has no finite length to cut).
    lo = (launches.starts[0] if len(launches) else 0) if start is None else start
    hi = (launches.ends[-1] if len(launches) else 0) if end is None else end
    cut = start is not None or end is not None
    spans = launches.intersect(Spans.of(lo, hi)) if cut else launches
    if cut and not spans.total:
        where = (f"the launches run cycles {launches.starts[0]:,.0f} to {launches.ends[-1]:,.0f}"
                 + (" (the kernel-launch overhead between launches is not kernel time)" if len(launches) > 1 else "")
                 if len(launches) else "the trace has none (" + ("its launches take no cycles)" if trace.launches
                                                                 else no_launches(trace) + ")"))
        raise ConfigError(f"--from/--to select no kernel time: {where}", key="--from" if start is not None else "--to")
    if region is not None:
        s, e = region_intervals(trace, gids, region)
        if not s.size:
            names = sorted(set(trace.region_names) | {f"kernel:{l['kernel']}" for l in trace.launches})
            anywhere = region_intervals(trace, [c["gid"] for c in trace.cores], region)[0].size > 0
            indices = _indices_named(trace, region)
            raise ConfigError(f"no region {region!r} " + ("on the selected cores (--chip/--core)" if anywhere else
                              f"in this trace ({indices})" if indices else
                              f"in this trace (regions: {', '.join(names) or 'none'})"), key="--region")
        spans = spans.intersect(Spans.union(s, e))
        if not spans.total:
            raise ConfigError(f"region {region!r} takes no cycles "
                              + ("in the window [from, to)" if cut else "on the selected cores"), key="--region")
    return spans


def _indices_named(trace: Trace, label: str) -> str:
    """For `NAME[INDEX]` of a region NAME the trace has: the indices it has, as text;
    else ''."""
    _, name, index = _region_label(label)
    if index is None or name not in trace.region_names:
        return ""
    r = trace.region
    found = np.unique(r["index"][r["name"] == trace.region_names.index(name)]).tolist()
    if not found:
        return ""
    listed = (f"{found[0]}..{found[-1]}" if found == list(range(found[0], found[-1] + 1)) and len(found) > 2
              else ", ".join(map(str, found[:12])) + (", ..." if len(found) > 12 else ""))
    return f"{name}'s indices: {listed}"


def _region_label(label: str) -> tuple[str | None, str | None, int | None]:
    """(kernel, name, index) of a region label `kernel:NAME`, `NAME` or `NAME[INDEX]`."""
    # (an index with a leading zero or a -0 is refused, as a number is everywhere else:
    # `layer[01]` selected layer[1] and headed the summary `layer[01]`)
    m = re.fullmatch(r"kernel:(.+)|(?!kernel:)([^\[\]]+)(?:\[(0|-?[1-9][0-9]*)\])?", label)
    if m is None:
        raise ConfigError(f"bad region {label!r}: write NAME, NAME[INDEX] (INDEX a number) "
                          "or kernel:NAME", key="--region")
    return m.group(1), m.group(2), None if m.group(3) is None else int(m.group(3))


def region_intervals(trace: Trace, gids: list[int], label: str) -> tuple[np.ndarray, np.ndarray]:
    """Intervals of the region `NAME`, `NAME[INDEX]` or `kernel:NAME` on the given cores."""
    kernel, name, index = _region_label(label)
    if kernel is not None:
        ls = [l for l in trace.launches if l["kernel"] == kernel]
        return np.array([l["start"] for l in ls], float), np.array([l["end"] for l in ls], float)
    r = trace.region
    if name not in trace.region_names:
        return np.zeros(0), np.zeros(0)
    sel = (r["name"] == trace.region_names.index(name)) & np.isin(r["core"], gids)
    if index is not None:
        sel &= r["index"] == index
    return r["start"][sel].astype(float), r["end"][sel].astype(float)


def no_launches(trace: Trace) -> str:
    """Why a trace has no launch: the program has none, or a fault came first."""
    if trace.meta.get("fault") is None:
        return "the program launches no kernel"
    return f"the run stopped at cycle {trace.end_cycle:,}, before its first launch began"


def dma_segments(trace: Trace) -> dict[str, np.ndarray]:
    """One row per (DMA, constant-rate segment): dma row, start, end, bytes."""
    dma, rate = trace.dma, trace.rate
    if not rate["dma"].size:
        return {"row": np.zeros(0, np.int64), "start": np.zeros(0), "end": np.zeros(0), "bytes": np.zeros(0)}
    seq = dma["seq"]
    if seq.size and (seq[1:] > seq[:-1]).all():
        # Sequence numbers in rising order (as written): each rate row's DMA by bisection.
        rows = np.searchsorted(seq, rate["dma"]).astype(np.int64)
    else:
        row_of = {int(s): i for i, s in enumerate(seq)}
        rows = np.array([row_of[int(s)] for s in rate["dma"]], np.int64)
    order = np.lexsort((np.arange(rows.size), rows))
    rows, start, r = rows[order], rate["cycle"][order].astype(float), rate["bytes_per_cycle"][order]
    end = np.empty_like(start)
    end[:-1] = start[1:]
    last = np.ones(rows.size, bool)
    last[:-1] = rows[1:] != rows[:-1]
    done = dma["done"][rows[last]]
    # (A DMA still moving when a fault ended the run: its last rate holds to the trace's
    # end, and it moved what its rates say, not its size.)
    end[last] = np.where(done >= 0, done, trace.end_cycle)
    end = np.maximum(end, start)
    raw = r * (end - start)
    per_dma = np.bincount(rows, raw, minlength=dma["seq"].size)
    scale = np.divide(dma["size_bytes"], per_dma, out=np.zeros(per_dma.size), where=per_dma > 0)
    scale[dma["done"] < 0] = 1.0
    nbytes = raw * scale[rows]
    # A DMA that landed with no cycle of its segments (all its bytes in one instant, at an
    # absurd profile's bandwidth): its size shared out over its segments, not lost.
    count = np.bincount(rows, minlength=dma["seq"].size)
    instant = ((per_dma == 0) & (dma["done"] >= 0))[rows]
    nbytes[instant] = dma["size_bytes"][rows[instant]] / count[rows[instant]]
    return {"row": rows, "start": start, "end": end, "bytes": nbytes}


def resource_segments(trace: Trace, segments: dict) -> dict[str, np.ndarray]:
    """Segments expanded to one row per resource each DMA crossed."""
    seg, res = _crossings(trace, segments)
    return {"resource": res, "start": segments["start"][seg], "end": segments["end"][seg],
            "bytes": segments["bytes"][seg], "row": segments["row"][seg]}


def _crossings(trace: Trace, segments: dict) -> tuple[np.ndarray, np.ndarray]:
    """For each (segment, resource its DMA crossed): the segment and the resource."""
    dma = trace.dma
    counts = dma["res_count"][segments["row"]]
    seg = np.repeat(np.arange(segments["row"].size), counts)
    if not seg.size:
        return seg, np.zeros(0, np.int64)
    # dma_res row: the DMA's first resource + the position within its list.
    at = np.repeat(dma["res_start"][segments["row"]] - (np.cumsum(counts) - counts), counts)
    at += np.arange(seg.size)
    return seg, trace.dma_res["resource"][at]


def traffic_segments(trace: Trace) -> dict[str, np.ndarray]:
    """Bytes per (resource, constant-rate segment) of every DMA.

    Links, DMA engines and the core-to-core path come from the flow resources each
    DMA crossed. HBM comes from the DMA's memories instead, because the emulator
    leaves HBM out of a flow where the chip's engines together cannot outrun it: a
    DMA moves its bytes through its source chip's HBM if it reads HBM and through
    its destination chip's HBM if it writes HBM. A copy within one HBM does both
    (it reads and writes that HBM), as the run's `hbm_bytes` counts it.

    Rows: the flow resources' (segment, resource) pairs in order, then the HBM reads,
    then the HBM writes; each column is filled in place (no concatenated copies).
    """
    segs = dma_segments(trace)
    seg, res = _crossings(trace, segs)
    hbm_of = {r["chip"]: r["id"] for r in trace.resources if r["kind"] == "hbm"}
    is_hbm = np.zeros(len(trace.resources), bool)
    is_hbm[list(hbm_of.values())] = True
    keep = ~is_hbm[res]
    seg, res = seg[keep], res[keep]
    dma, rows = trace.dma, segs["row"]
    hbm = trace.meta["spaces"].index("hbm")
    reads = dma["src_space"][rows] == hbm
    writes = dma["dst_space"][rows] == hbm
    lookup = np.full(max(hbm_of, default=-1) + 2, -1, np.int64)
    for chip, rid in hbm_of.items():
        lookup[chip] = rid
    picks = [seg, np.flatnonzero(reads), np.flatnonzero(writes)]
    out = {"resource": np.concatenate([res, lookup[dma["src_chip"][rows][reads]],
                                       lookup[dma["dst_chip"][rows][writes]]])}
    for key in ("start", "end", "bytes", "row"):
        column = np.empty(sum(p.size for p in picks), segs[key].dtype)
        at = 0
        for p in picks:
            np.take(segs[key], p, out=column[at:at + p.size])
            at += p.size
        out[key] = column
    return out


def _bytes_in(spans: Spans, start, end, nbytes) -> np.ndarray:
    """Each segment's bytes times the fraction of it inside the spans (a piece at a time)."""
    out = np.empty(len(nbytes))
    for rows in pieces(out.size):
        length = end[rows] - start[rows]
        frac = np.divide(spans.overlap(start[rows], end[rows]), length, out=np.zeros(length.size), where=length > 0)
        np.multiply(nbytes[rows], frac, out=out[rows])
    return out


def _bytes_by_resource(trace: Trace, win: Spans, segs: dict) -> np.ndarray:
    """The bytes each resource moved inside the window. A DMA that landed wholly inside
    it adds exactly its bytes to each resource it crossed (whole numbers, summed exactly:
    over a whole run the HBM rows add up to the run's `hbm_bytes`); one the window cuts,
    or one still moving when the trace ends, adds the share of its segments inside."""
    nres, ndma = len(trace.resources), trace.dma["seq"].size
    rows, res = segs["row"], segs["resource"].astype(np.int64)
    lo, hi = np.full(ndma, np.inf), np.full(ndma, -np.inf)
    np.minimum.at(lo, rows, segs["start"])
    np.maximum.at(hi, rows, segs["end"])
    whole = (trace.dma["done"] >= 0) & (hi >= lo)
    moving = whole & (hi > lo)
    whole[moving] = win.overlap(lo[moving], hi[moving]) == hi[moving] - lo[moving]
    # (a DMA whose bytes moved within one cycle, at a bandwidth of 1e308 bytes a cycle:
    # whole if that instant is in the window, as it has no length to share out)
    instant = whole & (hi == lo)
    whole[instant] = win.holds(lo[instant])
    cut = ~whole[rows]
    out = np.zeros(nres)
    out += np.bincount(res[cut], _bytes_in(win, segs["start"][cut], segs["end"][cut], segs["bytes"][cut]),
                       minlength=nres)
    # A whole DMA moved a whole number of bytes through each resource (its size, twice
    # through an HBM it both reads and writes): its scaled segments' sum, rounded to it.
    pairs, pair = np.unique(res[~cut] * ndma + rows[~cut], return_inverse=True)
    moved = np.rint(np.bincount(pair.reshape(-1), segs["bytes"][~cut], minlength=pairs.size))
    out += np.bincount(pairs // ndma, moved, minlength=nres)
    return out


def _column(value: float, width: int, decimals: int) -> str:
    """`value` right-aligned in `width` characters with `decimals`, or in three
    significant digits where that would not leave a space before it (an absurd
    profile's peak of 2.5e+18 GB/s ran into the next column)."""
    text = f"{value:.{decimals}f}"
    return f"{text if len(text) < width else f'{value:.3g}':>{width}s}"


def summarize(trace: Trace, chips=None, cores=None, region: str | None = None,
              start=None, end=None, top: int = 5) -> dict:
    gids = selected_cores(trace, chips, cores)
    chip_set = sorted({trace.cores[g]["chip"] for g in gids})
    win = window(trace, gids, region, start, end)
    measure = win.total
    hz = trace.clock_hz
    instr, wait = trace.instr, trace.wait
    segs = traffic_segments(trace)
    out: dict = {
        "trace": trace.path, "profile": trace.meta.get("profile"), "clock_hz": hz,
        "emulated_cycles": trace.end_cycle, "emulated_seconds": trace.seconds(trace.end_cycle),
        "filters": {"chips": chip_set, "cores": sorted({trace.cores[g]["core"] for g in gids}),
                    "region": region, "from": start, "to": end},
        "window_cycles": measure,
        "fault": trace.meta.get("fault"),   # what ended the run, if a fault did
    }
    # Instructions issued inside the window (a one-cycle probe at the issue cycle), per
    # core and unit the cycles it was busy inside it, and stalls on units and operands:
    # a pass over the instructions a piece at a time. (The figures are sums of whole
    # cycles, exact in float64 in any order, so they equal those of one pass.)
    units = [u for u in trace.units if u != "meta"]
    nunits = len(trace.units)
    chosen = _core_mask(trace, gids)
    count = 0
    busy = np.zeros(len(trace.cores) * nunits)
    stalls = {r: 0.0 for r in STALL_REASONS}
    for rows in pieces(instr["core"].size):
        core = instr["core"][rows].astype(np.int64)
        issue = instr["issue"][rows].astype(np.int64)
        csel = chosen[core]
        # Spans.overlap(a, b) is cumulative(b) - cumulative(a): each time computed once.
        at_issue = win.cumulative(issue)
        count += int((csel & (win.cumulative(issue + 1) - at_issue > 0)).sum())
        busy += np.bincount(core * nunits + instr["unit"][rows],
                            win.cumulative(issue + instr["occupancy"][rows]) - at_issue, minlength=busy.size)
        dep_start = issue[csel] - instr["stall_dep"][rows][csel]
        at_dep = win.cumulative(dep_start)
        stalls["unit"] += float((at_dep - win.cumulative(dep_start - instr["stall_unit"][rows][csel])).sum())
        stalls["dependency"] += float((at_issue[csel] - at_dep).sum())
    out["instructions"] = count
    busy = busy.reshape(-1, nunits)
    per_core = []
    for g in gids:
        cycles = busy[g]
        per_core.append({"chip": trace.cores[g]["chip"], "core": trace.cores[g]["core"],
                         "busy": {u: _frac(cycles[i], measure) for i, u in enumerate(trace.units) if u in units},
                         "busy_cycles": {u: float(cycles[i]) for i, u in enumerate(trace.units) if u in units}})
    out["units"] = per_core

    # Bandwidth per resource.
    by_res = _bytes_by_resource(trace, win, segs)
    bandwidth = []
    by_resource = index_by(segs["resource"])
    for res in trace.resources:
        if res["chip"] not in chip_set or res["kind"] == "other":
            continue
        # A DMA engine, and a core's own port into a link, belong to one core.
        if res["kind"] in ("engine", "port") and res.get("core") not in gids:
            continue
        rsel = by_resource.get(res["id"], NO_ROWS)
        active = Spans.union(segs["start"][rsel], segs["end"][rsel]).intersect(win).total
        nbytes = float(by_res[res["id"]])
        if res["kind"] in ("link", "sibling", "port") and nbytes == 0:
            continue        # only the links, ports and core-to-core paths used in the window
        bandwidth.append({"resource": res["name"], "kind": res["kind"], "chip": res["chip"],
                          "bytes": nbytes, "utilisation": _frac(nbytes, res["bw_bytes_per_cycle"] * measure),
                          "active": _frac(active, measure),
                          "achieved_gb_per_s": _frac(nbytes, measure) * hz / 1e9,
                          "peak_gb_per_s": res["bw_bytes_per_cycle"] * hz / 1e9})
    out["bandwidth"] = bandwidth

    # Stalls by reason (unit and dependency stalls were summed above).
    reasons = wait_reasons(trace)
    wsel = np.isin(wait["core"], gids)
    wcycles = win.overlap(wait["start"], wait["end"])
    for r in ("dma", "semaphore", "barrier"):
        stalls[r] = float(wcycles[wsel & (reasons == r)].sum())
    out["stalls"] = {"cycles": stalls, "fraction": {r: _frac(v, measure * len(gids)) for r, v in stalls.items()}}

    out["regions"] = region_table(trace, gids, win)
    out["bubbles"] = hbm_bubbles(trace, gids, chip_set, win, segs, by_resource, reasons, top)
    out["overlap"] = dma_compute_overlap(trace, gids, win)
    return out


NO_ROWS = np.zeros(0, np.int64)

#: Rows of the instruction table handled at a time: full-length temporaries of a
#: 50-million-instruction trace would take gigabytes.
CHUNK = 1 << 18


def pieces(n: int, size: int | None = None):
    """Slices [0, size), [size, 2 size), ... covering n rows (size: default CHUNK)."""
    size = size or CHUNK
    for lo in range(0, n, size):
        yield slice(lo, min(lo + size, n))


def _core_mask(trace: Trace, gids) -> np.ndarray:
    """A lookup table: mask[gid] is True for the selected cores (`np.isin` without
    sorting the column)."""
    mask = np.zeros(len(trace.cores), bool)
    mask[list(gids)] = True
    return mask


def index_by(keys: np.ndarray, rows: np.ndarray | None = None) -> dict[int, np.ndarray]:
    """The positions (or `rows[position]`) of each key's elements, in their order: a
    mask `keys == k` for every k at the cost of one sort."""
    order = np.argsort(keys, kind="stable")
    values, first = np.unique(keys[order], return_index=True)
    picked = order if rows is None else rows[order]
    return {int(v): part for v, part in zip(values.tolist(), np.split(picked, first[1:]))}


def wait_reasons(trace: Trace) -> np.ndarray:
    """'dma' for a semaphore wait ended by a DMA landing, else 'semaphore' (ended by a
    signal, or cut by a fault) or 'barrier'."""
    wait, dma = trace.wait, trace.dma
    ended = set(zip(dma["src_core"].tolist(), dma["sem"].tolist(), dma["done"].tolist()))
    remote = dma["rsem"] >= 0
    ended |= set(zip(dma["dst_core"][remote].tolist(), dma["rsem"][remote].tolist(), dma["done"][remote].tolist()))
    out = np.empty(wait["core"].size, dtype=object)
    for i, (c, k, s, e) in enumerate(zip(wait["core"].tolist(), wait["kind"].tolist(),
                                         wait["sem"].tolist(), wait["end"].tolist())):
        out[i] = "barrier" if k == 1 else ("dma" if (c, s, e) in ended else "semaphore")
    return out.astype(str) if out.size else np.zeros(0, "<U9")


def region_table(trace: Trace, gids: list[int], win: Spans) -> list[dict]:
    """One row per kernel, region name, and region name[index] when indices differ."""
    r, dma = trace.region, trace.dma
    rsel = np.isin(r["core"], gids)
    dsel = np.isin(dma["src_core"], gids) & (win.overlap(dma["issued"], dma["issued"] + 1) > 0)
    groups: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for i, l in enumerate(trace.launches):
        key = f"kernel:{l['kernel']}"
        s, e, c = groups.get(key, (np.zeros(0), np.zeros(0), np.zeros(0, np.int64)))
        groups[key] = (np.concatenate([s, np.full(len(gids), l["start"], float)]),
                       np.concatenate([e, np.full(len(gids), l["end"], float)]),
                       np.concatenate([c, np.array(gids, np.int64)]))
    names = r["name"][rsel]
    for nid in np.unique(names):
        sel = np.flatnonzero(rsel)[names == nid]
        label = trace.region_names[nid]
        groups[label] = (r["start"][sel].astype(float), r["end"][sel].astype(float), r["core"][sel])
        idx = r["index"][sel]
        if np.unique(idx).size > 1:
            for value in np.unique(idx):
                sub = sel[idx == value]
                groups[f"{label}[{value}]"] = (r["start"][sub].astype(float), r["end"][sub].astype(float),
                                               r["core"][sub])
    rows = []
    measure = win.total
    issued_by = index_by(dma["src_core"][dsel], np.flatnonzero(dsel))
    for label, (s, e, c) in groups.items():
        spans = Spans.union(s, e).intersect(win)
        time = spans.total
        nbytes = 0
        for g in np.unique(c):
            per_core = Spans.union(s[c == g], e[c == g])
            mine = issued_by.get(int(g), NO_ROWS)
            inside = per_core.overlap(dma["issued"][mine], dma["issued"][mine] + 1) > 0
            nbytes += int(dma["size_bytes"][mine][inside].sum())
        if label.startswith("kernel:"):
            ls = [l for l in trace.launches if l["kernel"] == label[7:]]
            instances = int((_touched(win, [l["start"] for l in ls], [l["end"] for l in ls])).sum())
        else:
            instances = int(_touched(win, s, e).sum())
        if not instances:
            continue
        rows.append({"region": label, "instances": instances, "cycles": time,
                     "share": _frac(time, measure), "dma_bytes": nbytes,
                     "gb_per_s": _frac(nbytes, time) * trace.clock_hz / 1e9})
    return rows


def _touched(win: Spans, starts, ends) -> np.ndarray:
    """Which intervals lie at least partly inside the window; an empty interval counts
    where its start does."""
    starts = np.asarray(starts, float)
    return win.overlap(starts, np.maximum(np.asarray(ends, float), starts + 1)) > 0


def hbm_bubbles(trace: Trace, gids, chip_set, win: Spans, segs: dict, by_resource: dict, reasons,
                top: int) -> list[dict]:
    """The HBM bubbles inside the window (stretches where a chip's HBM moved no bytes),
    grouped by site: the instruction of the DMA that ended the bubble. A program that
    loops over steps or layers leaves the same bubble at the same site every time; it
    is listed once, with how often it happened, on which chips, the cycles of all
    occurrences and its longest occurrence. Sites are ordered by their total cycles."""
    dma = trace.dma
    sites: dict = {}
    for res in trace.resources:
        if res["kind"] != "hbm" or res["chip"] not in chip_set:
            continue
        sel = by_resource.get(res["id"], NO_ROWS)
        idle = Spans.union(segs["start"][sel], segs["end"][sel]).gaps(win)
        if not len(idle):
            continue
        rows = np.unique(segs["row"][sel])
        rows = rows[np.argsort(dma["begun"][rows], kind="stable")]
        nxt = np.searchsorted(dma["begun"][rows], idle.ends, side="left")
        for a, b, k in zip(idle.starts.tolist(), idle.ends.tolist(), nxt.tolist()):
            # The DMA whose bytes started at the bubble's end ended it; a bubble cut by the
            # window's edge (a launch's end: the next launch's first DMA comes after the
            # launch overhead) was ended by none.
            d = int(rows[k]) if k < rows.size and dma["begun"][rows[k]] <= b else -1
            key = (trace.launches[dma["launch"][d]]["kernel"], int(dma["pc"][d])) if d >= 0 else None
            site = sites.setdefault(key, {"count": 0, "total": 0.0, "chips": set(), "longest": None})
            site["count"] += 1
            site["total"] += b - a
            site["chips"].add(res["chip"])
            if site["longest"] is None or b - a > site["longest"][0]:
                site["longest"] = (b - a, res["chip"], a, b, d)
    ranked = sorted(sites.values(), key=lambda s: (-s["total"], -s["longest"][0], s["longest"][1], s["longest"][2]))
    out = []
    for site in ranked[:top]:
        length, chip, a, b, d = site["longest"]
        entry = {"count": site["count"], "total_cycles": float(site["total"]), "chips": sorted(site["chips"]),
                 "chip": int(chip), "start": float(a), "end": float(b), "cycles": float(length)}
        if d >= 0:
            launch, pc, core = int(dma["launch"][d]), int(dma["pc"][d]), int(dma["src_core"][d])
            entry["next_dma"] = {"chip": int(trace.cores[core]["chip"]), "core": int(trace.cores[core]["core"]),
                                 "issued": int(dma["issued"][d]),
                                 "pc": pc, "instruction": trace.text(launch, pc),
                                 "source": trace.source(launch, pc)}
            # What held up the issue of that DMA (the rest of the bubble is its start latency).
            entry["waited_on"] = _waited_on(trace, core, a, min(b, float(dma["issued"][d])), reasons)
        out.append(entry)
    return out


def _waited_on(trace: Trace, core: int, a: float, b: float, reasons) -> dict | None:
    """What the core that ended the bubble spent most of it waiting for: the instruction
    whose stalls (or semaphore and barrier waits) inside the bubble add up to the most
    cycles (a loop stalls at one pc many times)."""
    instr, wait = trace.instr, trace.wait
    gap = Spans.of(a, b)
    sel = np.flatnonzero(instr["core"] == core)
    end = instr["issue"][sel].astype(np.int64)
    dep, unit = instr["stall_dep"][sel], instr["stall_unit"][sel]
    stall = gap.overlap(end - dep - unit, end)
    wsel = np.flatnonzero(wait["core"] == core)
    waited = gap.overlap(wait["start"][wsel], wait["end"][wsel])
    s, w = stall > 0, waited > 0
    # Every stall and wait inside the bubble as (launch, pc, why, cycles), in trace order,
    # stalls first; summed per (launch, pc, why).
    launch = np.concatenate([instr["launch"][sel][s], wait["launch"][wsel][w]]).astype(np.int64)
    pc = np.concatenate([instr["pc"][sel][s], wait["pc"][wsel][w]]).astype(np.int64)
    why = np.concatenate([np.where(dep[s] >= unit[s], "dependency", "unit"),
                          np.asarray(reasons)[wsel][w].astype(str)])
    if not launch.size:
        return None
    keys = np.rec.fromarrays([launch, pc, why], names="launch,pc,why")
    groups, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    totals = np.bincount(inverse.reshape(-1), weights=np.concatenate([stall[s], waited[w]]))
    most = np.flatnonzero(totals == totals.max())
    g = int(most[np.argmin(first[most])])      # (ties: the one met first)
    launch_g, pc_g = int(groups[g]["launch"]), int(groups[g]["pc"])
    return {"reason": str(groups[g]["why"]), "cycles": float(totals[g]), "pc": pc_g,
            "instruction": trace.text(launch_g, pc_g), "source": trace.source(launch_g, pc_g)}


def dma_compute_overlap(trace: Trace, gids, win: Spans) -> list[dict]:
    instr, dma = trace.instr, trace.dma
    compute_unit = np.zeros(len(trace.units), bool)
    compute_unit[[i for i, u in enumerate(trace.units) if u in COMPUTE_UNITS or u.startswith("mxu")]] = True
    chosen = _core_mask(trace, gids)
    # Each selected core's compute busy time, as the union of the unions of each piece
    # of the instruction table (a union is the same set whichever way it is built).
    parts: dict[int, list[Spans]] = {g: [] for g in gids}
    for rows in pieces(instr["core"].size):
        busy = np.flatnonzero(compute_unit[instr["unit"][rows]] & (instr["occupancy"][rows] > 0)
                              & chosen[instr["core"][rows]])
        issue = instr["issue"][rows][busy].astype(np.int64)
        end = issue + instr["occupancy"][rows][busy]
        for g, sel in index_by(instr["core"][rows][busy]).items():
            parts[g].append(Spans.union(issue[sel], end[sel]))
    begun = np.flatnonzero(dma["begun"] >= 0)
    begun_by = index_by(dma["src_core"][begun], begun)
    rows = []
    for g in gids:
        mine = parts[g]
        compute = Spans.union(np.concatenate([p.starts for p in mine] or [NO_ROWS]),
                              np.concatenate([p.ends for p in mine] or [NO_ROWS])).intersect(win)
        dsel = begun_by.get(g, NO_ROWS)
        # (A DMA still moving when a fault ended the run, done -1, moves to the trace's end.)
        done = dma["done"][dsel]
        moving = Spans.union(dma["begun"][dsel], np.where(done >= 0, done, trace.end_cycle)).intersect(win)
        both = compute.intersect(moving).total
        rows.append({"chip": trace.cores[g]["chip"], "core": trace.cores[g]["core"],
                     "compute_cycles": compute.total, "dma_cycles": moving.total, "both_cycles": both,
                     "dma_hidden": _frac(both, moving.total), "compute_overlapped": _frac(both, compute.total)})
    return rows


def fault_line(fault: dict) -> str:
    """The fault that ended a run: the first line `mkemu run` printed, and its source."""
    head = EmulatorFault(**fault).render().splitlines()[0].removeprefix("fault ")
    return head + (f" [{fault['source']}]" if fault.get("source") else "")


def _frac(a: float, b: float) -> float:
    return float(a) / float(b) if b else 0.0


# --- text -------------------------------------------------------------------

def render_text(s: dict, max_regions: int = 40, top: int | None = None) -> str:
    """The summary as text; `top`, if given, is how many bubble sites were asked for
    (0: none listed, which is not "no bubbles")."""
    lines = []
    hz = s["clock_hz"]
    f = s["filters"]
    lines.append(f"trace {s['trace']} ({s['profile']}, {hz / 1e9:.4g} GHz)")
    lines.append(f"emulated time: {s['emulated_cycles']:,} cycles = {_time(s['emulated_seconds'])}")
    fault = s.get("fault")
    if fault:
        lines.append(f"the run ended in a fault: {fault_line(fault)}")
    what = [f"chips {','.join(map(str, f['chips']))}", f"cores {','.join(map(str, f['cores']))}"]
    if f["region"]:
        what.append(f"region {f['region']}")
    if f["from"] is not None or f["to"] is not None:
        # (an open bound is the run's: from its cycle 0, to its last cycle)
        lo = 0 if f["from"] is None else f["from"]
        hi = s["emulated_cycles"] if f["to"] is None else f["to"]
        what.append(f"cycles [{lo}, {hi})")
    lines.append(f"window: {s['window_cycles']:,.0f} cycles of kernel time ({'; '.join(what)}), "
                 f"{s['instructions']:,} instructions")
    lines.append("")
    units = [u for u in s["units"][0]["busy"]] if s["units"] else []
    lines.append("unit busy (% of window)")
    # Each column as wide as its name (and a percentage) plus a space, so that names
    # such as `mxu1.w` and `mxu0.lhs` never run together.
    widths = [2 + max(len(u), len("100.0")) for u in units]
    labels = [f"chip {row['chip']} core {row['core']}" for row in s["units"]]
    first = max([len("core"), *map(len, labels)])
    lines.append(f"  {'core':{first}s}" + "".join(f"{u:>{w}s}" for u, w in zip(units, widths)))
    for label, row in zip(labels, s["units"]):
        lines.append(f"  {label:{first}s}"
                     + "".join(f"{100 * row['busy'][u]:{w}.1f}" for u, w in zip(units, widths)))
    lines.append("")
    lines.append("bandwidth")
    lines.append(f"  {'resource':34s}{'bytes':>14s}{'GB/s':>10s}{'peak':>10s}{'util %':>8s}{'active %':>9s}")
    for b in s["bandwidth"]:
        lines.append(f"  {b['resource']:34s}{b['bytes']:14,.0f}{_column(b['achieved_gb_per_s'], 10, 2)}"
                     f"{_column(b['peak_gb_per_s'], 10, 1)}{100 * b['utilisation']:8.1f}{100 * b['active']:9.1f}")
    lines.append("")
    st = s["stalls"]
    lines.append("stalls (cycles summed over cores, % of core-cycles)")
    lines.append("  " + ", ".join(f"{r} {st['cycles'][r]:,.0f} ({100 * st['fraction'][r]:.1f}%)"
                                  for r in STALL_REASONS))
    lines.append("")
    lines.append("regions")
    lines.append(f"  {'region':30s}{'n':>6s}{'cycles':>14s}{'share %':>9s}{'DMA bytes':>14s}{'GB/s':>10s}")
    regions = sorted(s["regions"], key=lambda r: (not r["region"].startswith("kernel:"), -r["cycles"],
                                                  _natural(r["region"])))
    for r in regions[:max_regions]:
        lines.append(f"  {r['region'][:30]:30s}{r['instances']:6d}{r['cycles']:14,.0f}{100 * r['share']:9.1f}"
                     f"{r['dma_bytes']:14,d}{r['gb_per_s']:10.2f}")
    if len(regions) > max_regions:
        lines.append(f"  ... {len(regions) - max_regions} more (use --json or --region)")
    lines.append("")
    lines.append("top HBM bubbles (HBM idle), by the site that ended them")
    if not s["bubbles"]:
        lines.append("  not listed (--top 0)" if top == 0 else "  none")
    for b in s["bubbles"]:
        chips = ",".join(map(str, b["chips"]))
        lines.append(f"  {b['total_cycles']:,.0f} cycles in {b['count']} bubble(s) on chip(s) {chips}; longest "
                     f"{b['cycles']:,.0f} cycles on chip {b['chip']} [{b['start']:,.0f}, {b['end']:,.0f})")
        w = b.get("waited_on")
        if w:
            lines.append(f"    waited on ({w['reason']}, {w['cycles']:,.0f} of its {b['cycles']:,.0f} cycles): "
                         f"pc {w['pc']:#06x} "
                         f"`{w['instruction']}`" + (f"  [{w['source']}]" if w["source"] else ""))
        n = b.get("next_dma")
        if not n:
            lines.append("    ended by no DMA: cut at the end of a launch or of the window")
        if n:
            lines.append(f"    ended by DMA from chip {n['chip']} core {n['core']} issued at {n['issued']:,}: "
                         f"pc {n['pc']:#06x} "
                         f"`{n['instruction']}`" + (f"  [{n['source']}]" if n["source"] else ""))
    lines.append("")
    lines.append("DMA/compute overlap")
    for o in s["overlap"]:
        lines.append(f"  chip {o['chip']} core {o['core']}: DMA moving {o['dma_cycles']:,.0f} cycles, compute "
                     f"{o['compute_cycles']:,.0f}, both {o['both_cycles']:,.0f} "
                     f"({100 * o['dma_hidden']:.1f}% of DMA time hidden under compute)")
    return "\n".join(lines) + "\n"


def _natural(name: str) -> list:
    """A name's sort key with its numbers as numbers: `load[2]` before `load[10]`."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _time(seconds: float) -> str:
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3f} {unit}"
    return f"{seconds * 1e9:.1f} ns"
