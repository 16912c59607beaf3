"""Timeline pictures of a trace: a self-contained HTML page, or a PNG (matplotlib,
the optional `[plot]` extra).

Both draw the same binned rows (`timeline`), never one shape per event, so the
main job's trace draws in seconds. Chips are drawn in groups small enough that a
group fits one screen. Per core, top to bottom: its layers (depth-0 regions) and
operators (depth-1 regions), labelled where the label fits; its stalls (the
fraction of each time bin spent waiting on a semaphore, a DMA or a barrier); each
unit that did work (all matrix units as one `mxu` row) and its DMA engine, shaded
by the fraction of the bin they were busy. Then per chip its HBM and each used
link, shaded by the fraction of peak bandwidth moved: white gaps in the HBM row
are the bubbles. The page has a time axis at the top of every group, a legend for
every row kind, and zooms (mouse wheel, drag to pan, double-click to reset); labels
appear once their region is wide enough to hold them.
"""

from __future__ import annotations

import html
import json

import numpy as np

from mkemu.tools.intervals import Spans, step_rate
from mkemu.tools.trace_reader import Trace
from mkemu.tools.trace_summary import NO_ROWS, index_by, traffic_segments
from mkemu.tools.view import View, core_unit_runs, view

BINS = 2000
ROW_PX = 9                    # one shaded row
REGION_PX = 13                # a labelled layer / operator row
SCREEN_PX = 860               # a chip group's rows fit this height
UNIT_ORDER = ("scalar", "vld", "vst", "valu", "xlu", "eup", "mxu", "dma", "sync")
COLORS = {"layer": "#9e9ac8", "op": "#c6dbef", "stall": "#d62728", "scalar": "#7f7f7f", "vld": "#2ca02c",
          "vst": "#98df8a", "valu": "#1f77b4", "xlu": "#17becf", "eup": "#9467bd", "mxu": "#e6550d",
          "dma": "#8c564b", "sync": "#bcbd22", "engine": "#bc80bd", "hbm": "#ff7f0e", "link": "#e377c2"}
LEGEND = {"layer": "layer (region)", "op": "operator (nested region)", "stall": "stalled: waiting on a "
          "semaphore, DMA or barrier", "scalar": "scalar unit", "vld": "vector load", "vst": "vector store",
          "valu": "vector ALU", "xlu": "cross-lane unit", "eup": "transcendental unit",
          "mxu": "matrix units (MXU)", "dma": "DMA issue", "sync": "semaphores / barriers",
          "engine": "DMA engine bandwidth", "hbm": "HBM bandwidth", "link": "link bandwidth"}


def timeline(trace: Trace, v: View | None = None, bins: int = BINS) -> dict:
    """The rows both renderers draw: {t0, t1, clock_hz, groups: [{chips, rows}]};
    a row is {label, kind, values (per-bin fraction 0..1) or spans [(start, end, name)]}."""
    v = v or view(trace)
    edges = np.linspace(v.t0, v.t1, bins + 1)
    width = np.diff(edges)
    # Each core's unit runs, made as its rows are drawn (all cores' runs at once can take gigabytes).
    runs_of = core_unit_runs(trace, v, v.gids)
    segs = traffic_segments(trace)
    by_resource = index_by(segs["resource"])
    length = segs["end"] - segs["start"]
    rate = np.divide(segs["bytes"], length, out=np.zeros(length.size), where=length > 0)
    region, wait = trace.region, trace.wait
    rkeep, _, _ = v.clip(region["start"], region["end"])
    wkeep, _, _ = v.clip(wait["start"], wait["end"])

    def fraction(starts, ends) -> np.ndarray:
        spans = Spans.union(np.clip(starts, v.t0, v.t1), np.clip(ends, v.t0, v.t1))
        return np.diff(spans.cumulative(edges)) / width

    per_chip: dict[int, list[dict]] = {chip: [] for chip in v.chips}
    kinds = ["mxu" if u.startswith("mxu") else u for u in trace.units]
    kind_of_unit = np.array([UNIT_ORDER.index(k) if k in UNIT_ORDER else -1 for k in kinds], np.int64)
    for gid in v.gids:
        c = trace.cores[gid]
        name = f"chip {c['chip']} core {c['core']}"
        rows = per_chip[c["chip"]]
        for depth, kind, what in ((0, "layer", "layers"), (1, "op", "operators")):
            sel = np.flatnonzero(rkeep & (region["core"] == gid) & (region["depth"] == depth))
            if sel.size:
                rows.append({"label": f"{name} {what}", "kind": kind, "spans": [
                    (float(max(region["start"][i], v.t0)), float(min(region["end"][i], v.t1)),
                     f"{trace.region_names[region['name'][i]]}[{int(region['index'][i])}]") for i in sel]})
        sel = wkeep & (wait["core"] == gid)
        rows.append({"label": f"{name} stalls", "kind": "stall",
                     "values": fraction(wait["start"][sel], wait["end"][sel])})
        _, runs = next(runs_of)
        kind_of_run = kind_of_unit[runs["unit"]] if runs is not None else NO_ROWS
        for k, kind in enumerate(UNIT_ORDER):
            sel = np.flatnonzero(kind_of_run == k)
            if sel.size:
                rows.append({"label": f"{name} {kind}", "kind": kind,
                             "values": fraction(runs["start"][sel], runs["end"][sel])})
        for res in trace.resources:
            if res["kind"] == "engine" and res.get("core") == gid:
                rows.append(_bw_row(f"{name} DMA engine", "engine", res, by_resource, segs, rate, edges))
    for chip in v.chips:
        for res in trace.resources:
            if res["chip"] == chip and (res["kind"] == "hbm" or (res["kind"] == "link"
                                                                  and res["id"] in by_resource)):
                label = f"chip {chip} HBM" if res["kind"] == "hbm" else res["name"]
                per_chip[chip].append(_bw_row(label, res["kind"], res, by_resource, segs, rate, edges))
    groups, current, height = [], [], 0
    for chip in v.chips:
        h = _height(per_chip[chip])
        if current and height + h > SCREEN_PX:
            groups.append(current)
            current, height = [], 0
        current.append(chip)
        height += h
    if current:
        groups.append(current)
    return {"t0": float(v.t0), "t1": float(v.t1), "clock_hz": trace.clock_hz, "bins": bins,
            "groups": [{"chips": g, "rows": [r for chip in g for r in per_chip[chip]]} for g in groups]}


def _height(rows: list[dict]) -> int:
    return sum(REGION_PX if "spans" in r else ROW_PX for r in rows)


def _bw_row(label, kind, res, by_resource, segs, rate, edges) -> dict:
    sel = by_resource.get(res["id"], NO_ROWS)
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


# -- HTML ----------------------------------------------------------------------

LABEL_W, PLOT_W, AXIS_PX = 170, 1360, 22

_SCRIPT = r"""
const T0 = %(t0)s, T1 = %(t1)s, NS = %(ns)s;
document.querySelectorAll('.group').forEach(group => {
  const plot = group.querySelector('svg.plot'), axis = group.querySelector('g.axis');
  const labels = Array.from(group.querySelectorAll('text.lbl'));
  // The page opens zoomed to cycles [A, B) if its address ends in #t=A-B.
  const m = /#t=(\d+)-(\d+)/.exec(location.hash);
  let a = m ? Math.max(T0, +m[1]) : T0, b = m ? Math.min(T1, +m[2]) : T1, drag = null;
  if (b <= a) { a = T0; b = T1; }
  function ticks() {
    const span = b - a, raw = span / 8, p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(m => m * p).find(s => s >= raw);
    let out = '';
    for (let t = Math.ceil(a / step) * step; t <= b; t += step) {
      const x = (t - a) / span * %(w)s;
      const us = t * NS / 1000;
      out += `<line x1="${x}" x2="${x}" y1="14" y2="%(axis)s" stroke="#444"/>` +
             `<text x="${x + 2}" y="11">${t.toLocaleString()} cyc (${us.toPrecision(4)} us)</text>`;
    }
    axis.innerHTML = out;
  }
  function draw() {
    plot.setAttribute('viewBox', `${a} 0 ${b - a} ${plot.viewBox.baseVal.height}`);
    const scale = %(w)s / (b - a);
    for (const t of labels) {
      const s = +t.dataset.s, e = +t.dataset.e, x = (Math.max(s, a) - a) * scale;
      const fits = (Math.min(e, b) - Math.max(s, a)) * scale > 6.5 * t.textContent.length + 4;
      t.setAttribute('x', x + 2);
      t.style.display = fits ? '' : 'none';
    }
    ticks();
  }
  plot.addEventListener('wheel', ev => {
    ev.preventDefault();
    const r = plot.getBoundingClientRect(), at = a + (ev.clientX - r.left) / r.width * (b - a);
    const f = ev.deltaY > 0 ? 1.25 : 0.8, na = at - (at - a) * f, nb = at + (b - at) * f;
    a = Math.max(T0, na); b = Math.min(T1, nb); if (b - a < 10) { b = a + 10; }
    draw();
  }, {passive: false});
  plot.addEventListener('mousedown', ev => { drag = {x: ev.clientX, a, b}; });
  window.addEventListener('mouseup', () => { drag = null; });
  window.addEventListener('mousemove', ev => {
    if (!drag) return;
    const d = (ev.clientX - drag.x) / plot.getBoundingClientRect().width * (drag.b - drag.a);
    const w = drag.b - drag.a;
    a = Math.min(Math.max(T0, drag.a - d), T1 - w); b = a + w; draw();
  });
  plot.addEventListener('dblclick', () => { a = T0; b = T1; draw(); });
  draw();
});
"""


def to_html(trace: Trace, v: View | None = None, title: str | None = None) -> str:
    tl = timeline(trace, v)
    t0, t1 = tl["t0"], tl["t1"]
    span = t1 - t0
    bin_cycles = span / tl["bins"]
    title = html.escape(title or f"mkemu trace {trace.path}")
    sections, nav = [], []
    for n, group in enumerate(tl["groups"]):
        rows = group["rows"]
        height = _height(rows)
        names, shapes, labels = [], [], []
        y = 0
        for row in rows:
            h = REGION_PX if "spans" in row else ROW_PX
            names.append(f'<text x="{LABEL_W - 4}" y="{y + h - 2}" text-anchor="end">{html.escape(row["label"])}</text>')
            if "spans" in row:
                for k, (s, e, name) in enumerate(row["spans"]):
                    shade = "#b9b6dd" if row["kind"] == "layer" and k % 2 else COLORS[row["kind"]]
                    shapes.append(f'<rect x="{s:.0f}" y="{y + 1}" width="{max(e - s, 0.5):.1f}" height="{h - 2}" '
                                  f'fill="{shade}"><title>{html.escape(name)} [{s:,.0f}, {e:,.0f})</title></rect>')
                    labels.append(f'<text class="lbl" data-s="{s:.0f}" data-e="{e:.0f}" y="{y + h - 3}">'
                                  f'{html.escape(name)}</text>')
            else:
                shade = np.round(row["values"] * 20) / 20
                cuts = np.concatenate([[0], np.flatnonzero(np.diff(shade)) + 1, [shade.size]])
                for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
                    if shade[a] > 0:
                        shapes.append(f'<rect x="{t0 + a * bin_cycles:.0f}" y="{y + 1}" '
                                      f'width="{(b - a) * bin_cycles:.1f}" height="{h - 2}" '
                                      f'fill="{COLORS[row["kind"]]}" fill-opacity="{shade[a]:.2f}"/>')
            y += h
        chips = group["chips"]
        name = f"chip{'s' if len(chips) > 1 else ''} {chips[0]}" + (f"-{chips[-1]}" if len(chips) > 1 else "")
        nav.append(f'<a href="#g{n}">{name}</a>')
        sections.append(
            f'<div class="group" id="g{n}"><h4>{name}</h4>'
            f'<svg width="{LABEL_W + PLOT_W}" height="{AXIS_PX}" font-size="10">'
            f'<g class="axis" transform="translate({LABEL_W},0)"></g></svg>'
            f'<div class="row"><svg width="{LABEL_W}" height="{height}" font-size="8">{"".join(names)}</svg>'
            f'<div class="wrap" style="width:{PLOT_W}px;height:{height}px">'
            f'<svg class="plot" width="{PLOT_W}" height="{height}" viewBox="{t0:.0f} 0 {span:.0f} {height}" '
            f'preserveAspectRatio="none"><rect x="{t0:.0f}" y="0" width="{span:.0f}" height="{height}" '
            f'fill="#f7f7f7"/>{"".join(shapes)}</svg>'
            f'<svg class="labels" width="{PLOT_W}" height="{height}" font-size="10">{"".join(labels)}</svg>'
            f'</div></div></div>')
    legend = "".join(f'<span class="key"><i style="background:{COLORS[k]}"></i>{html.escape(text)}</span>'
                     for k, text in LEGEND.items())
    script = _SCRIPT % {"t0": json.dumps(t0), "t1": json.dumps(t1), "ns": json.dumps(1e9 / tl["clock_hz"]),
                        "w": PLOT_W, "axis": AXIS_PX}
    return (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + title + "</title><style>"
        "body{font-family:sans-serif;font-size:12px;margin:8px}h3,h4{margin:4px 0}"
        ".group{margin-bottom:10px}.row{display:flex;flex-wrap:nowrap}"
        ".wrap{position:relative;flex:none;cursor:grab}"
        ".wrap svg{position:absolute;left:0;top:0}.labels{pointer-events:none}"
        ".key{margin-right:10px;white-space:nowrap}.key i{display:inline-block;width:10px;height:10px;"
        "margin-right:3px;vertical-align:middle}</style></head><body>"
        f"<h3>{title}</h3><div>{trace.end_cycle:,} cycles emulated ({html.escape(str(trace.meta.get('profile')))}"
        f"); window {t0:,.0f} to {t1:,.0f}. Shade: fraction of each time bin busy, stalled, or of peak "
        f"bandwidth. Wheel zooms, drag pans, double-click resets. Groups: {' '.join(nav)}</div>"
        f"<div>{legend}</div>{''.join(sections)}<script>{script}</script></body></html>\n")


# -- PNG -----------------------------------------------------------------------

def literal(text: str) -> str:
    """`text` as matplotlib draws it literally: a `$` pair would start mathtext (a region
    named `a$b$c` drawn as a formula, one named `p$^$q` a parse error at savefig)."""
    return text.replace("$", r"\$")


def to_png(trace: Trace, v: View | None = None) -> bytes:
    """The timeline as PNG bytes, drawn by matplotlib; ImportError if it is not installed.
    Shaded rows are one image; regions are one bar collection per row."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb

    tl = timeline(trace, v, bins=1600)
    rows = [r for g in tl["groups"] for r in g["rows"]]
    t0, t1 = tl["t0"], tl["t1"]
    image = np.ones((len(rows), tl["bins"], 3))
    fig, ax = plt.subplots(figsize=(16, 0.16 * len(rows) + 1.6))
    for k, row in enumerate(rows):
        if "spans" in row:
            spans = np.array([(s, e - s) for s, e, _ in row["spans"]])
            ax.broken_barh(spans, (k - 0.45, 0.9), facecolors=COLORS[row["kind"]], edgecolor="#555",
                           linewidth=0.2)
            for s, e, name in row["spans"]:
                if (e - s) / (t1 - t0) * 16 * 72 > 4.2 * len(name):   # the label fits (6 pt text)
                    ax.text(s, k, literal(name), fontsize=5, va="center", clip_on=True)
        else:
            image[k] = 1 - row["values"][:, None] * (1 - np.array(to_rgb(COLORS[row["kind"]])))
    ax.imshow(image, aspect="auto", interpolation="nearest", extent=(t0, t1, len(rows) - 0.5, -0.5), zorder=0)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r["label"] for r in rows], fontsize=5)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(t0, t1)
    ax.xaxis.tick_top()
    ax.set_xlabel("cycle")
    handles = [matplotlib.patches.Patch(color=COLORS[k], label=text) for k, text in LEGEND.items()]
    ax.legend(handles=handles, fontsize=6, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.02 / max(1, len(rows) / 40)))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
