"""`mkemu trace diff A B`: two traces side by side, region by region.

Both traces are summarised with the same filters; regions are matched by label
(`kernel:NAME`, `NAME`, `NAME[INDEX]`). Each row gives the cycles in A and B, the
change (B - A; negative means B saved time) and the DMA bytes; totals, stalls by
reason and HBM utilisation come first.
"""

from __future__ import annotations

from mkemu.errors import ConfigError
from mkemu.tools.trace_reader import Trace
from mkemu.tools.trace_summary import STALL_REASONS, fault_line, summarize


def diff(a: Trace, b: Trace, **filters) -> dict:
    sa, sb = _summary(a, filters), _summary(b, filters)
    ra = {r["region"]: r for r in sa["regions"]}
    rb = {r["region"]: r for r in sb["regions"]}
    rows = []
    for label in list(ra) + [k for k in rb if k not in ra]:
        x, y = ra.get(label), rb.get(label)
        ca = x["cycles"] if x else None
        cb = y["cycles"] if y else None
        rows.append({"region": label, "a_cycles": ca, "b_cycles": cb,
                     "delta_cycles": (cb - ca) if x and y else None,
                     "ratio": (cb / ca) if x and y and ca else None,
                     "a_dma_bytes": x["dma_bytes"] if x else None, "b_dma_bytes": y["dma_bytes"] if y else None})
    rows.sort(key=lambda r: (not r["region"].startswith("kernel:"),
                             -abs(r["delta_cycles"] or 0), r["region"]))

    def hbm(s):
        return {b["resource"]: b["utilisation"] for b in s["bandwidth"] if b["kind"] == "hbm"}
    return {
        "a": a.path, "b": b.path,
        "emulated_cycles": {"a": sa["emulated_cycles"], "b": sb["emulated_cycles"],
                            "delta": sb["emulated_cycles"] - sa["emulated_cycles"]},
        "window_cycles": {"a": sa["window_cycles"], "b": sb["window_cycles"]},
        "stalls": {r: {"a": sa["stalls"]["cycles"][r], "b": sb["stalls"]["cycles"][r]} for r in STALL_REASONS},
        "hbm_utilisation": {"a": hbm(sa), "b": hbm(sb)},
        "regions": rows,
    }


def _summary(trace: Trace, filters: dict) -> dict:
    """One side's summary; a filter that selects nothing in it names its file."""
    try:
        return summarize(trace, **filters)
    except ConfigError as exc:
        raise ConfigError(exc.message, file=trace.path, key=exc.key) from None


def render_text(d: dict, faults: tuple[dict | None, dict | None] = (None, None)) -> str:
    """`diff`'s figures as text; `faults`: A's and B's (`Trace.meta["fault"]`), said under
    the cycles (a run that ended in a fault stopped early: its fewer cycles are no speed-up)."""
    e = d["emulated_cycles"]
    pct = f" ({100 * e['delta'] / e['a']:+.1f}%)" if e["a"] else ""
    lines = [f"A: {d['a']}", f"B: {d['b']}",
             f"emulated cycles: A {e['a']:,}  B {e['b']:,}  B-A {e['delta']:+,}{pct}"]
    for side, fault in zip("AB", faults):
        if fault is not None:
            lines.append(f"{side} ended in a fault, so its figures stop there: {fault_line(fault)}")
    lines.append("")
    lines.append("stalls (cycles, all selected cores)")
    for r, v in d["stalls"].items():
        lines.append(f"  {r:12s}{v['a']:14,.0f}{v['b']:14,.0f}{v['b'] - v['a']:+14,.0f}")
    lines.append("HBM utilisation")
    for name in sorted(set(d["hbm_utilisation"]["a"]) | set(d["hbm_utilisation"]["b"])):
        ua, ub = d["hbm_utilisation"]["a"].get(name), d["hbm_utilisation"]["b"].get(name)
        lines.append(f"  {name:12s}{_pct(ua):>14s}{_pct(ub):>14s}")
    lines.append("")
    lines.append(f"  {'region':32s}{'A cycles':>14s}{'B cycles':>14s}{'B-A':>14s}{'B/A':>8s}")
    for r in d["regions"]:
        lines.append(f"  {r['region'][:32]:32s}{_num(r['a_cycles']):>14s}{_num(r['b_cycles']):>14s}"
                     f"{_num(r['delta_cycles'], sign=True):>14s}"
                     f"{_ratio(r['ratio']):>8s}")
    return "\n".join(lines) + "\n"


def _num(v, sign: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:+,.0f}" if sign else f"{v:,.0f}"


def _ratio(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"
