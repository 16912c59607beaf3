"""What docs/k3.md, docs/k3_programs.md and docs/collectives.md promise about the K3
driver's options, its report and dump, the model configs and the collectives examples,
held through the public interfaces (`mkemu.cli.main`).

Bad input is one line on stderr that names the option, exit status 1, no traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mkemu.cli import main

ROOT = Path(__file__).parents[2]
MEGA = str(ROOT / "programs" / "k3_megakernel.mk")
SUPER = str(ROOT / "programs" / "k3_superop.mk")
PER_OP = str(ROOT / "programs" / "k3_per_op.mk")
TINY = ("--model", "k3-tiny")


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *args) -> dict:
    code, out, err = run(capsys, "run", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def one_line_error(code: int, err: str) -> str:
    assert code == 1, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------------ model configs


def test_unknown_model_is_one_sentence_then_the_known_models(capsys):
    code, _, err = run(capsys, "model", "show", "nope")
    line = one_line_error(code, err)
    assert "unknown model 'nope'. Known models: k3-full, k3-mini, k3-tiny; or give a path to a .toml file" in line


def test_unknown_model_close_to_a_known_one_gets_a_did_you_mean(capsys):
    code, _, err = run(capsys, "run", MEGA, "--model", "k3-tinyy")
    line = one_line_error(code, err)
    assert "unknown model 'k3-tinyy'; did you mean 'k3-tiny'? Known models: k3-full, k3-mini, k3-tiny" in line


@pytest.mark.parametrize("name, total, active, per_token, mxfp4, state", [
    ("k3-tiny", "3,919,256", "3,034,520", "(5.81 MB)", "4.94 MB", "424.96 KB"),
    ("k3-mini", "66,752,992", "28,217,824", "(52.24 MB)", "40.11 MB", "1.72 MB"),
    ("k3-full", "2,779,088,795,776", "104,968,337,536", "(207.59 GB)", "127.25 GB", "565.30 MB"),
])
def test_model_show_prints_the_documented_figures(capsys, name, total, active, per_token, mxfp4, state):
    code, out, _ = run(capsys, "model", "show", name)
    assert code == 0
    assert f"total {total}" in out and f"active per token {active}" in out
    assert per_token in out and f"with MXFP4 experts as in the original: {mxfp4}" in out
    assert out.rstrip().endswith(state)


def test_model_list_names_the_shipped_configs(capsys):
    code, out, _ = run(capsys, "model", "list")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == ["k3-full", "k3-mini", "k3-tiny"]


@pytest.mark.parametrize("change, message", [
    (("dim = 256", "dim = 200"), "dim: error: must be a multiple of 128 (whole MXU tiles), got 200"),
    (("top_k = 2", "topk = 2"), "topk: error: unknown key 'topk'; did you mean 'top_k'?"),
    (("head_dim = 128", "head_dim = 64"), "head_dim: error: must be 128"),
])
def test_a_bad_model_file_names_the_file_and_the_key(capsys, tmp_path, change, message):
    text = (ROOT / "programs" / "k3" / "configs" / "k3-tiny.toml").read_text()
    assert change[0] in text
    path = tmp_path / "mine.toml"
    path.write_text(text.replace(change[0], change[1]))
    code, _, err = run(capsys, "model", "show", str(path))
    line = one_line_error(code, err)
    assert line.startswith(f"{path}: ") and message in line


# ------------------------------------------------------------ driver option errors


@pytest.mark.parametrize("args, flag, message", [
    (("--prompt-len", "0"), "--prompt-len", "--prompt-len must be at least 1, got 0"),
    (("--prompt-len", "-3"), "--prompt-len", "--prompt-len must be at least 1, got -3"),
    (("--steps", "0"), "--steps", "--steps must be at least 1, got 0"),
    (("--prompt-len", "0", "--spec-rows", "2"), "--prompt-len", "--prompt-len must be at least 1"),
    (("--steps", "0", "--spec-rows", "2"), "--steps", "--steps must be at least 1"),
    (("--prompt-len", "-2", "--steps", "3", "--spec-rows", "2"), "--prompt-len", "--prompt-len must be at least 1"),
    (("--steps", "-1", "--spec-rows", "2", "--timing-only"), "--steps", "--steps must be at least 1"),
    (("--prompt-len", "0", "--timing-only"), "--prompt-len", "--prompt-len must be at least 1"),
    (("--prompt-len", "10", "--steps", "8"), "--steps", "need 17 positions; k3-tiny has max_seq 16"),
    (("--spec-rows", "4", "--prompt-len", "8", "--steps", "8"), "--steps", "need up to 18 positions"),
    (("--batch", "0"), "--batch", "batch must be 1..8, got 0"),
    (("--batch", "9"), "--batch", "batch must be 1..8, got 9"),
    (("--spec-rows", "0"), "--spec-rows", "--spec-rows must be 1..8"),
    (("--spec-rows", "9"), "--spec-rows", "--spec-rows must be 1..8"),
    (("--spec-rows", "2", "--batch", "2"), "--batch", "it needs --batch 1"),
    (("--accept", "2"), "--accept", "it needs --spec-rows"),
    (("--spec-rows", "2", "--accept", "3"), "--accept", "--accept must be 1..2"),
    (("--spec-rows", "2", "--accept", "0"), "--accept", "--accept must be 1..2"),
    (("--spec-rows", "2", "--record-routing", "r.json"), "--record-routing", "does not record or replay"),
    (("--spec-rows", "2", "--timing-only", "--routing", "r.json"), "--routing", "does not record or replay"),
    (("--routing", "r.json"), "--routing", "applies to --timing-only runs"),
    (("--routing-skew", "1"), "--routing-skew", "applies to --timing-only runs"),
    (("--timing-only", "--dump", "d"), "--dump", "a timing-only run has none"),
    (("--timing-only", "--check-layers"), "--check-layers", "a timing-only run has none"),
    (("--timing-only", "--record-routing", "r.json"), "--record-routing", "a timing-only run has none"),
    (("--timing-only", "--routing", "r.json", "--routing-skew", "1"), "--routing-skew", "give one of them"),
    (("--set", "BATCH=2"), "--set", "BATCH is set by the K3 driver"),
    (("--set", "DIM=512"), "--set", "DIM is set by the K3 driver"),
    (("--set", "SPEC=1"), "--set", "SPEC is set by the K3 driver"),
    (("--set", "SCHEME=2"), None, "SCHEME = 2 (set from outside) is not one of its declared values: 0, 1"),
])
def test_bad_driver_options_are_one_line_errors_naming_the_option(capsys, tmp_path, monkeypatch, args, flag,
                                                                  message):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "run", MEGA, *TINY, "--mesh", "1", *args)
    assert code == 1 and "Traceback" not in err, err
    first = err.strip().splitlines()[0]
    if flag is not None:
        assert first.startswith(f"{flag}: error: "), err
    assert message in err


@pytest.mark.parametrize("program, kernel, sems", [("k3_megakernel", "k3_step", 52),
                                                   ("k3_superop", "attn_block", 32), ("k3_per_op", "expert", 20)])
def test_the_test_profile_is_too_small_and_says_so_at_compile_time(capsys, program, kernel, sems):
    # docs/k3_programs.md, Limits: --hw test has 16 semaphores a core.
    code, out, err = run(capsys, "run", str(ROOT / "programs" / f"{program}.mk"), *TINY, "--hw", "test",
                         "--mesh", "1", "--prompt-len", "1", "--steps", "1")
    assert code == 1 and "Traceback" not in err and not out, err
    assert f"error: kernel '{kernel}' uses {sems} semaphores; the profile has 16" in err.splitlines()[0], err


def test_a_data_run_of_k3_full_is_refused_with_the_way_out(capsys):
    code, _, err = run(capsys, "run", MEGA, "--model", "k3-full", "--mesh", "1")
    line = one_line_error(code, err)
    assert line.startswith("--model: error: ") and "run it with --timing-only" in line


def test_routing_record_of_another_run_is_refused(capsys, tmp_path):
    record = tmp_path / "r.json"
    report = run_json(capsys, MEGA, *TINY, "--mesh", "1", "--prompt-len", "1", "--steps", "2",
                      "--record-routing", str(record))
    assert report["routing_record"] == str(record)
    for args, message in ((("--batch", "2"), "the routing record is for batch 1; this run has 2"),
                          (("--steps", "5"), "the routing record has 2 steps; this run needs 5"),
                          (("--mesh", "2"), "the routing record is for cores 2; this run has 4")):
        argv = ["run", MEGA, *TINY, "--mesh", "1", "--prompt-len", "1", "--steps", "2", "--timing-only",
                "--routing", str(record), *args]
        code, _, err = run(capsys, *argv)
        line = one_line_error(code, err)
        assert line.startswith(str(record)) and message in line


# ------------------------------------------------------------------ report and dump

DOCUMENTED_KEYS = (
    "bit_exact", "mismatch", "model", "tokens", "chips", "cores", "mesh", "hw", "batch", "prompt_len",
    "steps_run", "us_per_step", "cycles_per_step", "tokens_per_s", "tokens_per_s_aggregate",
    "hbm_bytes_per_step", "hbm_bw_fraction", "floor_us_per_step", "fraction_of_floor",
    "mesh_floor_us_per_step", "fraction_of_mesh_floor", "floor_breakdown_us", "phase_floor_us",
    "collective_phases_per_step", "kernels_per_step", "breakdown_us", "region_us_per_core",
    "instructions_per_step", "compile_s", "wall_s", "timing_only", "budget",
)


def test_report_has_every_documented_key(capsys):
    report = run_json(capsys, MEGA, *TINY, "--prompt-len", "2", "--steps", "3", "--batch", "2")
    missing = [k for k in DOCUMENTED_KEYS if k not in report]
    assert not missing
    assert report["bit_exact"] is True and report["mismatch"] is None and report["timing_only"] is False
    assert report["mesh"] == "2x2x2" and report["chips"] == 8 and report["cores"] == 16
    assert report["steps_run"] == 2 + 3 - 1 == len(report["cycles_per_step"])
    assert np.array(report["tokens"]).shape == (2, 3)          # [batch][steps]
    assert report["tokens_per_s_aggregate"] == pytest.approx(2 * report["tokens_per_s"])
    assert set(report["breakdown_us"]) == {"launch_overhead", "collectives", "weight_streaming", "idle",
                                           "compute"}
    assert set(report["floor_breakdown_us"]) == {"hbm", "collectives", "collectives_across_mesh"}
    assert set(report["phase_floor_us"]) == {"one_hop", "across_mesh"}
    assert report["floor_us_per_step"] == pytest.approx(report["floor_breakdown_us"]["hbm"]
                                                        + report["floor_breakdown_us"]["collectives"])
    assert report["kernels_per_step"] == 1


def test_timing_only_report_says_what_it_is(capsys):
    report = run_json(capsys, MEGA, *TINY, "--prompt-len", "1", "--steps", "2", "--timing-only",
                      "--routing-skew", "0.5")
    assert report["timing_only"] is True and report["bit_exact"] is None and report["tokens"] is None
    assert report["routing"] == "synthetic, skew 0.5" and "per_layer_us" in report["budget"]


def test_dump_writes_the_documented_files(capsys, tmp_path):
    from mkemu.programs.k3.config import load_config, tensor_specs

    out = tmp_path / "dump"
    report = run_json(capsys, MEGA, *TINY, "--mesh", "1", "--prompt-len", "3", "--steps", "2", "--batch", "2",
                      "--dump", str(out))
    assert report["dump"] == str(out)
    weights = np.load(out / "weights.npz")
    specs = tensor_specs(load_config("k3-tiny"))
    assert list(weights.keys()) == [s.name for s in specs]
    assert all(weights[s.name].shape == s.shape and weights[s.name].dtype == np.float32 for s in specs)
    assert np.load(out / "inputs.npz")["prompt"].shape == (2, 3)
    ref = np.load(out / "reference.npz")["logits"]
    emu = np.load(out / "emulator.npz")["logits"]
    assert ref.shape == emu.shape == (4, 2, 512) and ref.dtype == np.float32
    assert np.array_equal(ref.view(np.uint32), emu.view(np.uint32))


# ------------------------------------------------------------ speculative decoding


def test_verify_rows_with_expert_homes_and_head_shards_bit_exact(capsys):
    """--spec-rows writes each chip its share where the program declares one, as a plain run does."""
    report = run_json(capsys, MEGA, *TINY, "--prompt-len", "2", "--steps", "3", "--spec-rows", "2",
                      "--set", "HOME_BYTES=0", "--set", "KDA_SHARD_BYTES=0")
    assert report["bit_exact"] is True and report["spec_rows"] == 2


def test_verify_rows_with_mxfp4_experts_bit_exact(capsys):
    """--set EXPERT_MX=1 selects MXFP4 experts for any model, verify steps included."""
    report = run_json(capsys, SUPER, *TINY, "--prompt-len", "1", "--steps", "3", "--spec-rows", "2",
                      "--set", "EXPERT_MX=1")
    assert report["bit_exact"] is True and report["spec_rows"] == 2


def test_verify_rows_dump_holds_every_rows_logits(capsys, tmp_path):
    report = run_json(capsys, MEGA, *TINY, "--mesh", "1", "--prompt-len", "3", "--steps", "3",
                      "--spec-rows", "3", "--accept", "2", "--dump", str(tmp_path))
    assert report["accepted_per_step"] == [1, 2] and report["tokens"] == [report["tokens"][0]]
    assert len(report["tokens"][0]) == 3
    assert np.load(tmp_path / "emulator.npz")["logits"].shape == (2, 3, 512)   # [steps, R, vocab]


# ------------------------------------------------------------------- collectives


def test_all_reduce_example_is_bit_exact_on_a_2x2_mesh(capsys):
    """mkemu run hands the reference the mesh, so the ring order of 2x2x1 is modelled."""
    code, out, err = run(capsys, "run", str(ROOT / "programs" / "examples" / "all_reduce.mk"), "--mesh", "2x2")
    assert code == 0, err
    assert out.startswith("PASS")


def _model_file(tmp_path, old: str, new: str) -> str:
    text = (ROOT / "programs" / "k3" / "configs" / "k3-tiny.toml").read_text()
    assert old in text
    path = tmp_path / "layout.toml"
    path.write_text(text.replace(old, new))
    return str(path)


@pytest.mark.parametrize("layers", ["[0, 1]", "[]"])
def test_a_model_without_the_dense_layer_0_layout_is_refused(capsys, tmp_path, layers):
    model = _model_file(tmp_path, "dense_layers = [0]", f"dense_layers = {layers}")
    code, _, err = run(capsys, "run", MEGA, "--model", model, "--mesh", "1", "--prompt-len", "1", "--steps", "1")
    line = one_line_error(code, err)
    assert line.startswith("--model: error: the K3 programs have the dense FFN at layer 0 only")


def test_megakernel_and_superop_run_mla_anywhere(capsys, tmp_path):
    model = _model_file(tmp_path, "mla_layers = [3]", "mla_layers = [1, 3]")
    for program in (MEGA, SUPER):
        report = run_json(capsys, program, "--model", model, "--mesh", "1", "--prompt-len", "1", "--steps", "2")
        assert report["bit_exact"] is True


def test_a_per_op_run_that_stops_in_its_prompt_reports_no_tokens_per_sequence(capsys, tmp_path):
    # The per-op host unrolls MLA at l % 4 == 3 (docs/k3_programs.md): MLA at layer 1
    # fails the bit check at step 0, in the prompt, before any token is generated.
    model = _model_file(tmp_path, "mla_layers = [3]", "mla_layers = [1]")
    code, out, _ = run(capsys, "run", PER_OP, "--model", model, "--mesh", "1", "--prompt-len", "2", "--steps", "3",
                       "--batch", "2", "--json")
    report = json.loads(out)
    assert code == 1 and report["bit_exact"] is False and report["steps_run"] == 1
    assert report["tokens"] == [[], []]       # [batch][steps], as in every other run


def test_a_dump_folder_that_cannot_be_made_is_said_before_the_run(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, out, err = run(capsys, "run", MEGA, *TINY, "--mesh", "1", "--prompt-len", "1", "--steps", "1",
                         "--dump", str(blocker / "sub"))
    line = one_line_error(code, err)
    assert line.startswith(f"{blocker / 'sub'}: error: cannot create dump directory") and out == ""
