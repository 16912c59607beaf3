"""A timeline picture of a trace: a self-contained HTML page (inline SVG), or a PNG
when matplotlib happens to be installed (it is not a dependency).

Rows, top to bottom, per chip: per core its source regions (labelled), each unit
that did work and its DMA engine, shaded by how busy they were in each time bin;
then the chip's HBM bandwidth and each used link's bandwidth as a fraction of
peak. White gaps in the HBM strip are the bubbles.
"""

from __future__ import annotations

import html

import numpy as np

from mkemu.tools.intervals import Spans
from mkemu.tools.perfetto import step_rate
from mkemu.tools.trace_reader import Trace
from mkemu.tools.trace_summary import traffic_segments

BINS = 1000
COLORS = {"scalar": "#7f7f7f", "vld": "#2ca02c", "vst": "#98df8a", "valu": "#1f77b4", "xlu": "#17becf",
          "eup": "#9467bd", "dma": "#8c564b", "sync": "#bcbd22", "engine": "#d62728", "hbm": "#ff7f0e",
          "link": "#e377c2", "region": "#c7c7ff"}


def timeline(trace: Trace, bins: int = BINS) -> dict:
    """The binned rows both renderers draw: {t0, t1, edges, rows: [{label, kind, values, regions}]}."""
    t0 = float(trace.start_cycle)
    t1 = float(max(trace.end_cycle, t0 + 1))
    edges = np.linspace(t0, t1, bins + 1)
    width = np.diff(edges)
    instr = trace.instr
    segs = traffic_segments(trace)
    length = segs["end"] - segs["start"]
    rate = np.divide(segs["bytes"], length, out=np.zeros(length.size), where=length > 0)
    rows = []
    for chip in range(trace.num_chips):
        for c in [c for c in trace.cores if c["chip"] == chip]:
            gid = c["gid"]
            r = trace.region
            sel = np.flatnonzero((r["core"] == gid) & (r["depth"] <= 1))
            if sel.size:
                rows.append({"label": f"chip {chip} core {c['core']} regions", "kind": "region", "values": None,
                             "regions": [(float(r["start"][i]), float(r["end"][i]), int(r["depth"][i]),
                                          f"{trace.region_names[r['name'][i]]}[{int(r['index'][i])}]")
                                         for i in sel]})
            mine = instr["core"] == gid
            for u, unit in enumerate(trace.units):
                s = mine & (instr["unit"] == u) & (instr["occupancy"] > 0)
                if not s.any():
                    continue
                spans = Spans.union(instr["issue"][s], instr["issue"][s] + instr["occupancy"][s])
                rows.append({"label": f"chip {chip} core {c['core']} {unit}", "kind": unit,
                             "values": np.diff(spans.cumulative(edges)) / width})
            for res in trace.resources:
                if res["kind"] == "engine" and res.get("core") == gid:
                    rows.append(_bw_row(f"chip {chip} core {c['core']} DMA engine", "engine", res, segs, rate, edges))
        for res in trace.resources:
            if res["chip"] == chip and (res["kind"] == "hbm" or (res["kind"] == "link"
                                                                  and (segs["resource"] == res["id"]).any())):
                rows.append(_bw_row(res["name"] + " bandwidth", res["kind"], res, segs, rate, edges))
    return {"t0": t0, "t1": t1, "edges": edges, "rows": rows, "clock_hz": trace.clock_hz}


def _bw_row(label, kind, res, segs, rate, edges) -> dict:
    sel = segs["resource"] == res["id"]
    times, level = step_rate(segs["start"][sel], segs["end"][sel], rate[sel])
    return {"label": label, "kind": kind,
            "values": np.clip(_binned_mean(times, level, edges) / res["bw_bytes_per_cycle"], 0, 1)}


def _binned_mean(times, level, edges) -> np.ndarray:
    """Mean of a step function (value `level[i]` from `times[i]` on) over each bin."""
    if not times.size:
        return np.zeros(edges.size - 1)
    integral = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(times))])

    def at(t):
        i = np.clip(np.searchsorted(times, t, side="right") - 1, 0, None)
        before = t < times[0]
        return np.where(before, 0.0, integral[i] + level[i] * (t - times[i]))
    return np.diff(at(edges)) / np.diff(edges)


def to_html(trace: Trace, title: str | None = None) -> str:
    tl = timeline(trace)
    label_w, plot_w, row_h = 230, 1000, 18
    t0, t1 = tl["t0"], tl["t1"]
    scale = plot_w / (t1 - t0)
    height = row_h * len(tl["rows"]) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + plot_w + 10}" height="{height}" '
           'font-family="sans-serif" font-size="11">']
    for k, row in enumerate(tl["rows"]):
        y = 20 + k * row_h
        out.append(f'<text x="4" y="{y + 13}">{html.escape(row["label"])}</text>')
        out.append(f'<rect x="{label_w}" y="{y + 1}" width="{plot_w}" height="{row_h - 2}" fill="#f4f4f4"/>')
        if row["kind"] == "region":
            for start, end, depth, name in row["regions"]:
                x, w = label_w + (start - t0) * scale, max((end - start) * scale, 0.5)
                h = (row_h - 2) / (1 + depth)
                out.append(f'<rect x="{x:.2f}" y="{y + 1 + (row_h - 2) - h:.2f}" width="{w:.2f}" height="{h:.2f}" '
                           f'fill="{COLORS["region"]}" stroke="#6b6bd6" stroke-width="0.5">'
                           f'<title>{html.escape(name)} [{start:.0f}, {end:.0f})</title></rect>')
                if w > 7 * len(name) and depth == 0:
                    out.append(f'<text x="{x + 2:.2f}" y="{y + 13}" font-size="10">{html.escape(name)}</text>')
            continue
        color = COLORS.get(row["kind"], "#1f77b4" if not row["kind"].startswith("mxu") else "#e6550d")
        bin_w = plot_w / len(row["values"])
        # Runs of bins with the same (quantised) shade become one rectangle.
        shade = np.round(row["values"] * 50) / 50
        cuts = np.concatenate([[0], np.flatnonzero(np.diff(shade)) + 1, [shade.size]])
        for a, b in zip(cuts[:-1], cuts[1:]):
            if shade[a] > 0:
                out.append(f'<rect x="{label_w + a * bin_w:.2f}" y="{y + 1}" width="{(b - a) * bin_w + 0.05:.2f}" '
                           f'height="{row_h - 2}" fill="{color}" fill-opacity="{shade[a]:.2f}"/>')
    axis_y = 20 + len(tl["rows"]) * row_h + 12
    us = 1e6 / tl["clock_hz"]
    for tick in np.linspace(t0, t1, 6):
        x = label_w + (tick - t0) * scale
        out.append(f'<text x="{x:.1f}" y="{axis_y}" text-anchor="middle">{tick:,.0f} ({tick * us:.3g} us)</text>')
    out.append("</svg>")
    title = html.escape(title or f"mkemu trace {trace.path}")
    legend = " ".join(f'<span style="background:{c};opacity:.8;padding:0 6px;color:#fff">{html.escape(k)}</span>'
                      for k, c in COLORS.items())
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title></head>"
            f"<body style=\"font-family:sans-serif\"><h3>{title}</h3>"
            f"<p>{trace.end_cycle:,} cycles emulated ({trace.meta.get('profile')}). Shade = fraction of each "
            f"time bin a unit was busy, or of peak bandwidth moved. Hover a region for its span.</p>"
            f"<p>{legend}</p>{''.join(out)}</body></html>\n")


def to_png(trace: Trace) -> bytes:
    """The timeline as PNG bytes, drawn by matplotlib; ImportError if it is not installed."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = timeline(trace)
    rows = tl["rows"]
    fig, ax = plt.subplots(figsize=(14, 0.3 * len(rows) + 1.5))
    edges = tl["edges"]
    for k, row in enumerate(rows):
        y = len(rows) - 1 - k
        if row["kind"] == "region":
            for start, end, depth, name in row["regions"]:
                ax.broken_barh([(start, end - start)], (y + 0.1 + 0.3 * depth, 0.8 - 0.3 * depth),
                               facecolor=COLORS["region"], edgecolor="#6b6bd6", linewidth=0.5)
                if depth == 0:
                    ax.text(start, y + 0.5, name, fontsize=6, va="center", clip_on=True)
            continue
        color = COLORS.get(row["kind"], "#e6550d")
        ax.bar(edges[:-1], row["values"] * 0.8, width=np.diff(edges), bottom=y + 0.1, align="edge",
               color=color, linewidth=0)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r["label"] for r in reversed(rows)], fontsize=7)
    ax.set_xlim(tl["t0"], tl["t1"])
    ax.set_xlabel("cycle")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return buf.getvalue()
