"""Gaps found by checking docs/api.md, docs/tuning.md, docs/traces.md and the README
against behaviour (helper audit, second round): each test failed before its fix."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import mkemu
from mkemu.cli import main

from tune_scale import scale_copy

TEST_HW = ("--hw", "test", "--mesh", "1")
K3_TINY = ("k3_megakernel", "--model", "k3-tiny", "--prompt-len", "1", "--steps", "1")


def cli(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([*map(str, argv)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


# -- README: an output "may not be one ... another of its outputs writes: that is an error
#    before anything runs" (--trace DIR/weights.npz was replaced by the dumped weights)

@pytest.mark.parametrize("inside", ["weights.npz", ".", "sub/t.mkt"])
def test_an_output_in_the_dump_folder_is_an_error_before_the_run(capsys, tmp_path, inside):
    dump = tmp_path / "dump"
    code, _, err = cli(capsys, "run", *K3_TINY, "--dump", dump, "--trace", dump / inside)
    assert code == 1 and "is in the --dump folder" in err and "--trace" in err
    assert not dump.exists()


# -- tuning.md: an error whatever the params "stops the tune before any trial"; k3.md:
#    the driver's params "cannot be changed with --set" (a --set of one compiled first, so
#    a shape the model's asserts refuse was reported as the program's error)

@pytest.mark.parametrize("options, key, message", [
    ({"batch": 9}, "batch", "batch must be 1..8, got 9"),
    ({"spec_rows": 9}, "spec_rows", "spec_rows must be 1..8"),
    ({"accept": 2}, "accept", "accept is the acceptance length"),
    ({"steps": 0}, "steps", "steps must be at least 1, got 0"),
    ({"prompt_len": 100}, "steps", "need 103 positions; k3-tiny has max_seq 16"),
    ({"params": {"DIM": 128}}, "params", "DIM is set by the K3 driver"),
    ({"routing_skew": 0.5}, "routing_skew", "routing_skew applies to --timing-only runs"),
    ({"model": "k3-tinyy"}, "model", "did you mean 'k3-tiny'?"),
])
def test_the_k3_drivers_errors_name_the_api_option(options, key, message):
    # From the API an option is named by its field, as the API's own errors name theirs;
    # `mkemu run` names the same errors by their flags (`--batch`, `--set`, ...).
    with pytest.raises(mkemu.ConfigError) as info:
        mkemu.compile("k3_megakernel", **{"model": "k3-tiny", **options})()
    assert info.value.key == key and message in info.value.message
    assert info.value.render().startswith(f"{key}: error: ")


@pytest.mark.parametrize("setting", ["BATCH=2", "DIM=4", "NLAYERS=2"])
def test_a_set_of_a_driver_param_is_the_drivers_error_before_compiling(capsys, setting):
    code, _, err = cli(capsys, "run", *K3_TINY, "--set", setting)
    name = setting.split("=")[0]
    assert code == 1 and err.startswith(f"--set: error: {name} is set by the K3 driver")


def test_tune_stops_up_front_on_a_set_of_a_driver_param(capsys, tmp_path):
    out = tmp_path / "t.json"
    code, _, err = cli(capsys, "tune", *K3_TINY, "--set", "BATCH=2", "--param", "WR_MAX=4,6", "--out", out)
    assert code == 1 and "BATCH is set by the K3 driver" in err and "[0]" not in err and not out.exists()


# -- api.md: "Every error a bad program ... can cause is an mkemu.MkemuError" (a driver
#    that raised, or returned no dict, escaped as ValueError / AttributeError)

DRIVERS = textwrap.dedent('''
    def raises(session, options):
        raise ValueError("driver boom")
    raises.mkemu_driver = True

    def returns_none(session, options):
        session.run()
    returns_none.mkemu_driver = True

    def own_figures(session, options):
        return {"cycles": session.run()["cycles"], "bit_exact": True}
    own_figures.mkemu_driver = True
''')
COPY = textwrap.dedent('''
    reference "drivers.py:{fn}";
    kernel k(a: hbm f32[8, 128], y: hbm f32[8, 128]) {{
        vmem v: f32[8, 128];
        sem s;
        start copy(a, v, s);
        wait copy(a, v, s);
        start copy(v, y, s);
        wait copy(v, y, s);
    }}
''')


def driven(tmp_path, fn: str) -> Path:
    (tmp_path / "drivers.py").write_text(DRIVERS)
    (tmp_path / f"{fn}.mk").write_text(COPY.format(fn=fn))
    return tmp_path / f"{fn}.mk"


@pytest.mark.parametrize("fn, message", [
    ("raises", "the program's driver raises raised ValueError: driver boom (at {drivers}:3)"),
    ("returns_none", "the program's driver returns_none returned NoneType, not a dict of figures (defined at "
                     "{drivers}:6)"),
])
def test_a_driver_that_fails_is_a_config_error_at_its_line(tmp_path, capsys, fn, message):
    program = driven(tmp_path, fn)
    with pytest.raises(mkemu.ConfigError) as info:
        mkemu.compile(program, hw="test")()
    assert info.value.message == message.format(drivers=tmp_path / "drivers.py")
    code, _, err = cli(capsys, "run", program, "--hw", "test")
    assert code == 1 and message.format(drivers=tmp_path / "drivers.py") in err


def test_a_driver_returning_figures_of_its_own_runs_and_prints_them(tmp_path, capsys):
    program = driven(tmp_path, "own_figures")
    assert mkemu.compile(program, hw="test")().report.bit_exact is True
    code, out, _ = cli(capsys, "run", program, "--hw", "test")
    assert code == 0 and out.startswith("PASS (the driver's check)\ncycles: ")


# -- tuning.md: --resume "runs the same search" (another --param space or --budget was
#    taken silently, and writing the record back dropped its trials)



@pytest.mark.parametrize("change, key", [(("--param", "TN=256"), "space"), (("--budget", "5"), "budget")])
def test_resuming_with_another_search_is_refused_and_the_record_kept(capsys, tmp_path, change, key):
    program, out = scale_copy(tmp_path), tmp_path / "t.json"
    first = ("tune", program, *TEST_HW, "--param", "SYNC=0")
    assert cli(capsys, *first, "--param", "TN=256,512", "--budget", "4", "--out", out)[0] == 0
    before = out.read_bytes()
    again = {"space": (*first, *change, "--budget", "4"), "budget": (*first, "--param", "TN=256,512", *change)}[key]
    code, _, err = cli(capsys, *again, "--resume", out)
    assert code == 1 and f"{key}: error: the record is of another search" in err
    assert out.read_bytes() == before


def test_resuming_with_the_params_in_another_order_is_refused(capsys, tmp_path):
    # The order names the trials and orders the search: the record's trials were not
    # found under the other order's names, so every one ran again.
    program, out = scale_copy(tmp_path), tmp_path / "t.json"
    assert cli(capsys, "tune", program, *TEST_HW, "--param", "SYNC=0", "--param", "TN=256,512", "--out", out)[0] == 0
    before = out.read_bytes()
    code, _, err = cli(capsys, "tune", program, *TEST_HW, "--param", "TN=256,512", "--param", "SYNC=0",
                       "--resume", out)
    assert code == 1 and "space: error: the record is of another search" in err and "in its order" in err
    assert out.read_bytes() == before


# -- tuning.md: only the default build writes --record-routing (a resumed tune took the
#    default from its record, ran nothing and wrote no routing record)

def test_a_resumed_tune_runs_the_default_again_to_write_the_routing_record(capsys, tmp_path):
    out, routing = tmp_path / "t.json", tmp_path / "r.json"
    argv = ("tune", *K3_TINY, "--param", "WR_MAX=12", "--out", out)
    assert cli(capsys, *argv)[0] == 0
    code, _, err = cli(capsys, *argv, "--resume", out, "--record-routing", routing)
    assert code == 0 and routing.is_file() and "(from the record)" not in err
    assert json.loads(out.read_text())["trials"][0]["status"] == "ok"


# -- traces.md: a bubble's site is "the instruction of the DMA that ended the bubble"
#    (one cut at a launch's end named the next launch's first DMA, issued after the
#    launch overhead); next_dma's core was a display string, not a number

TWO_LAUNCHES = """
.buffer a f32 8x128 input
.kernel main
    .smem 0 4096 1 0 0 1 0 0
    li s1, @a
    li s4, 4096
    dma.start vmem[s0], hbm[s1], s0, s0
    sem.wait s0, s4
    li s5, 300
spin:
    addi s5, s5, -1
    bne s5, s0, spin
    halt
.launch main
.launch main
"""


def test_a_bubble_cut_by_a_launchs_end_names_no_dma_and_next_dma_names_chip_and_core(tmp_path, capsys):
    from mkemu.tools.trace_reader import read_trace
    from mkemu.tools.trace_summary import summarize

    (tmp_path / "two.s").write_text(TWO_LAUNCHES)
    trace = tmp_path / "two.mkt"
    assert cli(capsys, "run", tmp_path / "two.s", *TEST_HW, "--trace", trace)[0] == 0
    s = summarize(read_trace(str(trace)))
    ended = [b for b in s["bubbles"] if "next_dma" in b]
    cut = [b for b in s["bubbles"] if "next_dma" not in b]
    assert cut and cut[0]["count"] >= 2          # (each launch's spin after its copy, up to its end)
    assert ended and all(b["next_dma"]["chip"] == 0 and b["next_dma"]["core"] == 0 for b in ended)
    assert all(b["next_dma"]["issued"] <= b["end"] for b in ended)
    code, out, _ = cli(capsys, "trace", trace)
    assert code == 0 and "ended by no DMA: cut at the end of a launch or of the window" in out
    assert "ended by DMA from chip 0 core 0 issued at" in out


# -- A worker that dies is one error line, not a BrokenProcessPool traceback (tuning.md:
#    --jobs runs trials in local processes)

def test_a_tune_whose_worker_dies_ends_with_one_line_and_keeps_its_record(capsys, tmp_path):
    program, out = scale_copy(tmp_path), tmp_path / "t.json"
    # The reference runs in the worker: ending that process there is a worker killed mid-trial.
    (tmp_path / "tune_scale_ref.py").write_text("import os\ndef reference(inputs, **kw):\n    os._exit(3)\n")
    code, _, err = cli(capsys, "tune", program, *TEST_HW, "--param", "TN=256,512", "--param", "SYNC=0",
                       "--jobs", "2", "--out", out)
    assert code == 1 and err.splitlines()[-1] == (
        "error: a worker process ended before its trial did (BrokenProcessPool: killed, or out of memory?); the "
        "runs that finished are in the record")
    assert not out.exists() or json.loads(out.read_text())["finished"] is False   # (saved as trials finish)
