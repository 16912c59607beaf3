"""Timing-only K3 runs: given the routing a data run recorded, exactly the data run's
cycles, breakdown and trace timing; with synthetic routing, a run that says clearly
that nothing was computed; and the combinations that cannot work are errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mkemu.cli import main
from mkemu.tools.trace_reader import read_trace

PROGRAMS = ["programs/k3_megakernel.mk", "programs/k3_per_op.mk", "programs/k3_superop.mk"]
TIMING_TABLES = ("instr", "dma", "wait", "signal", "region")


def run_json(capsys, *args) -> dict:
    code = main(["run", *args, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def assert_same_timing(data: dict, timing: dict, data_trace, timing_trace) -> None:
    assert timing["timing_only"] is True and timing["bit_exact"] is None
    for key in ("cycles_per_step", "breakdown_us", "region_us_per_core", "hbm_bytes_per_step",
                "instructions_per_step", "kernels_per_step"):
        assert timing[key] == data[key], key
    a, b = read_trace(data_trace), read_trace(timing_trace)
    for table in TIMING_TABLES:
        for column, values in a.tables[table].items():
            assert np.array_equal(values, b.tables[table][column]), (table, column)


TINY, MINI = ("k3-tiny", ("--prompt-len", "2", "--steps", "2")), ("k3-mini", ("--prompt-len", "1", "--steps", "2"))
# Every program and scheme at k3-tiny; at k3-mini four of the six (the suite stays short).
CASES = [(p, s, *TINY) for p in PROGRAMS for s in (0, 1)] + [
    (PROGRAMS[0], 0, *MINI), (PROGRAMS[0], 1, *MINI), (PROGRAMS[1], 1, *MINI), (PROGRAMS[2], 0, *MINI)]


@pytest.mark.parametrize("program, scheme, model, steps", CASES)
def test_recorded_routing_gives_the_data_runs_cycles_and_trace(capsys, tmp_path, program, scheme, model, steps):
    common = (program, "--model", model, *steps, "--set", f"SCHEME={scheme}", "--batch", "2")
    record = tmp_path / "routing.json"
    data = run_json(capsys, *common, "--record-routing", str(record), "--trace", str(tmp_path / "d.mkt"))
    assert data["bit_exact"] is True and data["timing_only"] is False
    timing = run_json(capsys, *common, "--timing-only", "--routing", str(record),
                      "--trace", str(tmp_path / "t.mkt"))
    assert_same_timing(data, timing, tmp_path / "d.mkt", tmp_path / "t.mkt")


@pytest.mark.parametrize("program", PROGRAMS)
def test_synthetic_routing_runs_and_says_nothing_was_computed(capsys, program):
    args = (program, "--model", "k3-tiny", "--prompt-len", "1", "--steps", "2",
            "--timing-only", "--routing-skew", "1.5")
    report = run_json(capsys, *args)
    assert report["timing_only"] is True and report["bit_exact"] is None and report["tokens"] is None
    assert report["routing"] == "synthetic, skew 1.5"
    assert report["us_per_step"] > 0 and set(report["budget"]["per_layer_us"]) >= {
        "weight_streaming", "collectives", "experts", "attention", "routing"}
    assert main(["run", *args]) == 0
    out = capsys.readouterr().out
    assert out.startswith("TIMING ONLY: nothing was computed (no PASS/FAIL)")
    assert "per layer (us, this run vs published" in out and "bit-exact" not in out


@pytest.mark.parametrize("argv, message", [
    (["--timing-only", "--dump", "out"], "--dump needs computed numbers; a timing-only run has none"),
    (["--timing-only", "--check-layers"], "--check-layers needs computed numbers"),
    (["--routing-skew", "1"], "--routing-skew applies to --timing-only runs"),
    (["--model", "k3-full", "--mesh", "4x2x2"], "run it with --timing-only"),
    # the bytes as stored: bf16, the routed experts MXFP4 (not every parameter as bf16)
    (["--model", "k3-full", "--mesh", "4x2x2"], "generate about 1,559,151,997,184 bytes of weights (1,452 GiB"),
])
def test_combinations_that_cannot_work_are_errors_before_anything_runs(capsys, argv, message):
    assert main(["run", "programs/k3_megakernel.mk", "--model", "k3-tiny", *argv]) == 1
    out, err = capsys.readouterr()
    assert message in err and "Traceback" not in out + err


def test_a_routing_record_of_another_run_is_refused(capsys, tmp_path):
    record = tmp_path / "routing.json"
    run_json(capsys, "programs/k3_megakernel.mk", "--model", "k3-tiny", "--prompt-len", "1", "--steps", "1",
             "--record-routing", str(record))
    assert main(["run", "programs/k3_megakernel.mk", "--model", "k3-tiny", "--batch", "2", "--prompt-len", "1",
                 "--steps", "1", "--timing-only", "--routing", str(record)]) == 1
    assert "the routing record is for batch 1; this run has 2" in capsys.readouterr().err
    # The routing depends on the seed and the prompt too (docs/k3.md): a record of another
    # --seed or --prompt-len is refused (it replayed as if it were this run's).
    common = ["run", "programs/k3_megakernel.mk", "--model", "k3-tiny", "--timing-only", "--routing", str(record)]
    assert main(common + ["--prompt-len", "1", "--steps", "1", "--seed", "5"]) == 1
    assert (f"{record}: seed: error: the routing record is of a run with --seed 0; this run has 5"
            in capsys.readouterr().err)
    assert main(common + ["--prompt-len", "2", "--steps", "1"]) == 1
    assert "prompt_len: error: the routing record is of a run with --prompt-len 1; this run has 2" in \
        capsys.readouterr().err
    doc = json.loads(record.read_text())
    assert (doc["seed"], doc["prompt_len"]) == (0, 1)
    for key in ("seed", "prompt_len"):     # (a record written before it kept them: not checked)
        del doc[key]
    record.write_text(json.dumps(doc))
    assert main(common + ["--prompt-len", "1", "--steps", "1", "--seed", "5"]) == 0


DAMAGE = [
    (lambda doc: doc.__setitem__("steps", {"0": {}}), "steps: error: expected a list of steps"),
    (lambda doc: doc["steps"].__setitem__(0, 7), "steps[0]: error: expected an object"),
    (lambda doc: doc["steps"][0].__setitem__("tokens", "abc"), "steps[0].tokens: error: expected a list of 1 token"),
    (lambda doc: doc["steps"][0].__setitem__("tokens", [-1]), "steps[0].tokens: error"),
    (lambda doc: doc["steps"][0].__setitem__("pos", "0"), "steps[0].pos: error: expected a position"),
    (lambda doc: doc["steps"][0].__setitem__("readbacks", 3), "steps[0].readbacks: error"),
    (lambda doc: doc["steps"][0]["readbacks"][0].append(2**40), "steps[0].readbacks: error"),
    # Readbacks the programs index with (an expert id, docs/k3_programs.md): out of range,
    # repeated within a row or too few / many used to fault inside a kernel, naming no record.
    (lambda doc: doc["steps"][0]["readbacks"][1].__setitem__(slice(None), [100000] * 6),
     "steps[0].readbacks[1][0]: error: expected an expert id in 0..7 (the router's choice), not 100000"),
    (lambda doc: doc["steps"][0]["readbacks"][0].__setitem__(3, -1),
     "steps[0].readbacks[0][3]: error: expected an expert id in 0..7"),
    (lambda doc: doc["steps"][0]["readbacks"][0].__setitem__(slice(2, 4), [5, 5]),
     "steps[0].readbacks[0][2:4]: error: expected 2 distinct expert ids (one row's top-2), not [5, 5]"),
    (lambda doc: doc["steps"][0]["readbacks"][0].pop(),
     ("steps[0].readbacks[0]: error: expected no readbacks (a core that does not route) or 6 (3 MoE layers x 1 "
      "rows x top-2 expert ids), not 5")),
    (lambda doc: doc["steps"][0]["readbacks"][0].append(1), "steps[0].readbacks[0]: error: expected no readbacks"),
    (lambda doc: doc["steps"][0]["readbacks"][2].reverse(),
     "steps[0].readbacks[2]: error: expected the ids of readbacks[0] (every core that routes makes the same"),
    (lambda doc: doc["steps"][0]["payloads"][0].append("!!"), "steps[0].payloads: error: expected base64"),
    (lambda doc: doc["steps"][0].pop("payloads"), "steps[0].payloads: error"),
    # (a record no core routed in replayed until the first readback: "only 0 were supplied")
    (lambda doc: [r.clear() for r in doc["steps"][0]["readbacks"]],
     "steps[0].readbacks: error: expected the router's choices of at least one core: the model has MoE layers"),
    (lambda doc: doc.__setitem__("version", 2),
     "version: error: the routing record is version 2; this mkemu reads version 1"),
    # (equal in Python, but not what --record-routing writes)
    (lambda doc: doc.__setitem__("version", 1.0),
     "version: error: the routing record is version 1.0; this mkemu reads version 1"),
    (lambda doc: doc.__setitem__("batch", True), "batch: error: the routing record is for batch True; this run has 1"),
]


def test_a_damaged_routing_record_is_an_error_naming_the_field(capsys, tmp_path):
    record = tmp_path / "routing.json"
    run_json(capsys, "programs/k3_megakernel.mk", "--model", "k3-tiny", "--prompt-len", "1", "--steps", "1",
             "--record-routing", str(record))
    good = json.loads(record.read_text())
    for damage, message in DAMAGE:
        doc = json.loads(json.dumps(good))
        damage(doc)
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(doc))
        assert main(["run", "programs/k3_megakernel.mk", "--model", "k3-tiny", "--prompt-len", "1", "--steps", "1",
                     "--timing-only", "--routing", str(bad)]) == 1
        out, err = capsys.readouterr()
        assert f"{bad}: {message}" in err and len(err.strip().splitlines()) == 1, (message, err)
    # A key given twice (JSON keeps the last) is refused, not run with one of its values.
    text = record.read_text()
    assert text.startswith('{"format":')
    bad.write_text('{"batch":2,' + text[1:])
    assert main(["run", "programs/k3_megakernel.mk", "--model", "k3-tiny", "--prompt-len", "1", "--steps", "1",
                 "--timing-only", "--routing", str(bad)]) == 1
    assert capsys.readouterr().err.strip() == (f"{bad}: batch: error: the routing record has key 'batch' twice in one "
                                               "object (a record --record-routing writes has each once)")


def test_a_huge_routing_skew_still_draws_top_k_experts(capsys):
    report = run_json(capsys, "programs/k3_megakernel.mk", "--model", "k3-tiny", "--prompt-len", "1", "--steps",
                      "1", "--timing-only", "--routing-skew", "1e300")
    assert report["timing_only"] is True


def test_a_routing_record_replays_on_another_program_and_scheme(capsys, tmp_path):
    # The per-op program routes on core 0 of every chip, the megakernel with SCHEME=0 on
    # every core: the record's choices go to every core, so the megakernel takes its own
    # data run's cycles from the per-op's record (it used to fault: "only 0 were supplied").
    common = ("--model", "k3-tiny", "--mesh", "2x1x1", "--batch", "3", "--prompt-len", "1", "--steps", "2")
    record = tmp_path / "routing.json"
    run_json(capsys, "programs/k3_per_op.mk", *common, "--set", "SCHEME=1", "--record-routing", str(record))
    assert [] in json.loads(record.read_text())["steps"][0]["readbacks"]
    data = run_json(capsys, "programs/k3_megakernel.mk", *common, "--trace", str(tmp_path / "d.mkt"))
    timing = run_json(capsys, "programs/k3_megakernel.mk", *common, "--timing-only", "--routing", str(record),
                      "--trace", str(tmp_path / "t.mkt"))
    assert_same_timing(data, timing, tmp_path / "d.mkt", tmp_path / "t.mkt")


def test_a_routing_record_decodes_each_payload_once(tmp_path, monkeypatch):
    from mkemu.programs.k3 import timing
    from mkemu.programs.k3.config import load_config

    cfg = load_config("k3-tiny")
    record = timing.RoutingRecord(cfg.name, 1, 2, shape=timing.model_shape(cfg))
    ids = [0, 1] * 3
    for step in range(2):
        record.add([7], step, [ids, ids], [[bytes([step, 1, 2])], [b"", b"\xff" * 5]])
    path = tmp_path / "routing.json"
    record.save(str(path))
    calls = []
    real = timing.base64.b64decode
    monkeypatch.setattr(timing.base64, "b64decode", lambda *a, **k: calls.append(a) or real(*a, **k))
    loaded = timing.RoutingRecord.load(str(path), cfg, 1, 2, 2)
    assert [loaded.payloads(step) for step in range(2)] == [[[bytes([s, 1, 2])], [b"", b"\xff" * 5]]
                                                            for s in range(2)]
    assert [loaded.payloads(step) for step in range(2)] == [record.payloads(step) for step in range(2)]
    assert len(calls) == 6      # three payloads a step, each decoded once (it was twice: checked, then used)
