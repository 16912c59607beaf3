"""The main job's figures against each other and against its trace (helper-74's audit):
the breakdown and the budget add up to the step, the derived rates follow from the
profile's numbers as docs/k3.md defines them, the trace summary has the run's cycles
and HBM bytes, and the docs' statements about what "compute", the budget's weight
streaming and a `--region` window hold are the measured ones."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from mkemu.cli import main

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"


def _json(*argv) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(list(argv)) == 0
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
    """`mkemu run programs/k3_megakernel.mk` (k3-mini, 2x2x2, 4 + 4 tokens) with a trace."""
    trace = str(tmp_path_factory.mktemp("a74") / "main.mkt")
    report = _json("run", str(ROOT / "programs" / "k3_megakernel.mk"), "--json", "--trace", trace)
    assert report["bit_exact"] is True
    return report, trace


def _per_core_step_us(report: dict, cycles: float, clock_hz: float) -> float:
    return cycles / report["cores"] / report["steps_run"] / clock_hz * 1e6


def test_breakdown_budget_and_rates_follow_from_the_run(main_job):
    r, trace = main_job
    whole = _json("trace", trace, "--json")
    us = r["us_per_step"]
    assert sum(r["breakdown_us"].values()) == pytest.approx(us)
    assert r["tokens_per_s"] == pytest.approx(1e6 / us)
    assert r["tokens_per_s_aggregate"] == pytest.approx(r["batch"] * 1e6 / us)
    # The peaks as the trace states them (bytes per second).
    peak = {b["kind"]: b["peak_gb_per_s"] * 1e9 for b in whole["bandwidth"]}
    cores_per_chip = r["cores"] // r["chips"]
    assert r["hbm_bw_fraction"] == pytest.approx(r["hbm_bytes_per_step"] / (us * 1e-6) / (r["chips"] * peak["hbm"]))
    hbm_floor = r["hbm_bytes_per_step"] / (r["chips"] * min(peak["hbm"], cores_per_chip * peak["engine"])) * 1e6
    floor = hbm_floor + r["collective_phases_per_step"] * r["phase_floor_us"]["one_hop"]
    assert r["floor_us_per_step"] == pytest.approx(floor)
    assert r["fraction_of_floor"] == pytest.approx(floor / us)
    mesh_floor = hbm_floor + r["collective_phases_per_step"] * r["phase_floor_us"]["across_mesh"]
    assert r["fraction_of_mesh_floor"] == pytest.approx(mesh_floor / us)
    b = r["budget"]
    assert sum(b["per_layer_us"].values()) == pytest.approx(b["layer_us"])
    assert 8 * b["layer_us"] + b["fixed_us_per_step"] == pytest.approx(us)     # k3-mini: 8 layers
    # The trace has the run's cycles (launch overhead between the launches is not kernel
    # time) and its HBM bytes.
    clock = whole["clock_hz"]
    assert whole["emulated_cycles"] == sum(r["cycles_per_step"])
    launch_cycles = r["breakdown_us"]["launch_overhead"] * 1e-6 * clock
    assert whole["window_cycles"] == pytest.approx(whole["emulated_cycles"] - r["steps_run"] * launch_cycles)
    hbm = sum(x["bytes"] for x in whole["bandwidth"] if x["kind"] == "hbm")
    assert hbm == pytest.approx(r["hbm_bytes_per_step"] * r["steps_run"])


def test_what_compute_and_the_budgets_weight_streaming_hold_as_the_docs_say(main_job):
    r, trace = main_job
    whole = _json("trace", trace, "--json")
    clock = whole["clock_hz"]
    barrier = _per_core_step_us(r, whole["stalls"]["cycles"]["barrier"], clock)
    # No barrier lies in a collective region (core 0 in its own all-reduces never waits
    # at one), so the breakdown counts them in "compute".
    own = _json("trace", trace, "--json", "--region", "allreduce", "--chip", "0", "--core", "0")
    assert own["stalls"]["cycles"]["barrier"] == 0
    assert 0 < barrier < r["breakdown_us"]["compute"]
    k3 = " ".join((DOCS / "k3.md").read_text().split())
    programs = " ".join((DOCS / "k3_programs.md").read_text().split())
    assert f"barriers: {barrier:.1f} of the main job's {r['breakdown_us']['compute']:.1f} µs" in k3
    assert re.search(rf"{barrier:.1f} µs of it are the cores waiting at the barrier", programs)
    # DMA waits outside the layers (the ring's first fill, the LM head): in the step's
    # weight streaming, which the budget spreads over the layers.
    layers = _json("trace", trace, "--json", "--region", "layer")
    outside = _per_core_step_us(r, whole["stalls"]["cycles"]["dma"] - layers["stalls"]["cycles"]["dma"], clock)
    streaming = r["breakdown_us"]["weight_streaming"]
    assert 0 < outside < streaming
    assert r["budget"]["per_layer_us"]["weight_streaming"] == pytest.approx(streaming / 8)
    assert f"{outside:.2f} of the main job's {streaming:.2f} µs of weight streaming" in k3
    # A --region window is the union over the selected cores: every core's figures count
    # it whole, so other cores' barrier waits show up "inside" the all-reduces.
    union = _json("trace", trace, "--json", "--region", "allreduce")
    counted = _per_core_step_us(r, union["stalls"]["cycles"]["barrier"], clock)
    traces = " ".join((DOCS / "traces.md").read_text().split())
    assert f"`--region allreduce` counts {counted:.1f} µs of barrier stalls per core and step" in traces
