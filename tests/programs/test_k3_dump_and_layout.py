"""docs/k3.md's `--dump` keys (the reference's decode state under the `state_*` keys) and
docs/k3_programs.md's K3 layout (a model the programs cannot run is a one-line error
naming `--model`, before anything is compiled), through `mkemu.cli.main`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mkemu.cli import main
from mkemu.programs.k3 import reference as ref
from mkemu.programs.k3.config import load_config

ROOT = Path(__file__).parents[2]
PROGRAMS = [str(ROOT / "programs" / f"{p}.mk") for p in ("k3_megakernel", "k3_per_op", "k3_superop")]
STATE_KEYS = ["state_pos", "state_conv_q", "state_conv_k", "state_conv_v", "state_kda_s", "state_mla_cache"]


def run_json(capsys, *args) -> dict:
    code = main(["run", *args, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_dump_holds_the_reference_state_after_the_last_step(capsys, tmp_path):
    """k3.md: the State arrays are also keys of the dump; `ref.generate` on the dumped
    weights and prompt gives the same state."""
    report = run_json(capsys, PROGRAMS[0], "--model", "k3-tiny", "--mesh", "1", "--prompt-len", "2",
                      "--steps", "3", "--batch", "2", "--dump", str(tmp_path))
    assert report["bit_exact"] is True and report["steps_run"] == 4
    cfg = load_config("k3-tiny")
    weights = dict(np.load(tmp_path / "weights.npz"))
    prompt = np.load(tmp_path / "inputs.npz")["prompt"]
    with np.load(tmp_path / "reference.npz") as dumped:
        assert dumped.files == ["logits", *STATE_KEYS]
        expected = ref.generate(cfg, weights, prompt, 3).state.arrays()
        for key in STATE_KEYS:
            assert np.array_equal(np.asarray(expected[key]), dumped[key]), key
        assert int(dumped["state_pos"]) == 4 and dumped["state_kda_s"].shape == (3, 2, 2, 128, 128)


@pytest.mark.parametrize("max_cycles, steps_before", [(20_000, 0), (150_000, 1)])
def test_a_run_that_faults_still_dumps_the_steps_before_the_fault(capsys, tmp_path, max_cycles, steps_before):
    """"Nothing is lost on a fault": the dump folder was left empty (k3.md: the dump holds
    the steps run before the fault, and the fault names it). Each k3-tiny step on the
    default mesh takes 105,109 cycles, so the guard stops the first step or the second."""
    code = main(["run", PROGRAMS[0], "--model", "k3-tiny", "--prompt-len", "1", "--steps", "2",
                 "--max-cycles", str(max_cycles), "--dump", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and "fault [max-cycles]" in err and f"dump of the steps before the fault: {tmp_path}" in err
    cfg = load_config("k3-tiny")
    weights = dict(np.load(tmp_path / "weights.npz"))
    prompt = np.load(tmp_path / "inputs.npz")["prompt"]
    with np.load(tmp_path / "reference.npz") as dumped, np.load(tmp_path / "emulator.npz") as emulated:
        assert dumped["logits"].shape == emulated["logits"].shape == (steps_before, 1, cfg.vocab)
        assert np.array_equal(dumped["logits"], emulated["logits"])
        assert int(dumped["state_pos"]) == steps_before
        if steps_before:
            expected = ref.generate(cfg, weights, prompt, steps_before).state.arrays()
            for key in STATE_KEYS:
                assert np.array_equal(np.asarray(expected[key]), dumped[key]), key


def test_verify_rows_dump_holds_the_state_after_the_last_accepted_row(capsys, tmp_path):
    report = run_json(capsys, PROGRAMS[0], "--model", "k3-tiny", "--mesh", "1", "--prompt-len", "3",
                      "--steps", "3", "--spec-rows", "3", "--accept", "2", "--dump", str(tmp_path))
    assert report["accepted_per_step"] == [1, 2]
    cfg = load_config("k3-tiny")
    weights = dict(np.load(tmp_path / "weights.npz"))
    prompt = np.load(tmp_path / "inputs.npz")["prompt"]
    # Committed: the prompt and every accepted token but the last (the next step's anchor).
    state = ref.init_state(cfg, 1)
    for token in [*prompt[0], *report["tokens"][0][:-1]]:
        _, state = ref.decode_step(cfg, weights, state, np.array([token]))
    with np.load(tmp_path / "reference.npz") as dumped:
        assert int(dumped["state_pos"]) == 5
        for key, value in state.arrays().items():
            assert np.array_equal(np.asarray(value), dumped[key]), key


def _model_file(tmp_path, key: str, value: str) -> str:
    text = (ROOT / "programs" / "k3" / "configs" / "k3-tiny.toml").read_text()
    lines = [f"{key} = {value}" if line.startswith(f"{key} = ") else line for line in text.splitlines()]
    path = tmp_path / "layout.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("key, value, message", [
    ("mla_layers", "[]", "need at least one KDA and one MLA layer; model 'k3-tiny' has 4 KDA and 0 MLA layers"),
    ("mla_layers", "[0, 1, 2, 3]", "need at least one KDA and one MLA layer; model 'k3-tiny' has 0 KDA and 4 MLA"),
    ("conv_kernel", "3", "short conv has 4 taps (conv_kernel = 4); model 'k3-tiny' has conv_kernel 3"),
    # (the reference took it and the bits failed at layer 0's attention; a timing-only run ignored it)
    ("eps", "1e-6", "RMSNorm adds eps = 1e-05 (a constant of programs/k3/model.mk); model 'k3-tiny' has eps 1e-06"),
])
@pytest.mark.parametrize("mode", [(), ("--timing-only",)])
def test_a_model_the_programs_cannot_run_is_one_line_naming_model(capsys, tmp_path, program, key, value, message,
                                                                   mode):
    """Before, a compile error inside the library (tensors.mk: 'dimensions must be
    positive, got 0') or a shape mismatch naming kda_conv_q."""
    model = _model_file(tmp_path, key, value)
    load_config(model)            # (a valid model config: only the programs cannot run it)
    code = main(["run", program, "--model", model, "--mesh", "1", "--prompt-len", "1", "--steps", "1", *mode])
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("--model: error: the K3 programs") and message in lines[0], err
    assert lines[0].endswith(f" (the file {model})")     # (its name is a shipped model's)


@pytest.mark.parametrize("key, value", [("dim", "0x" + "f" * 4000), ("eps", "9" * 400), ("mla_layers", "[" + "9" * 400 + "]")])
def test_a_model_file_integer_of_thousands_of_digits_is_an_error_naming_its_key(capsys, tmp_path, key, value):
    # (a ValueError traceback printing it, an OverflowError using it as a float)
    model = _model_file(tmp_path, key, value)
    assert main(["model", "show", model]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{model}: {key}: error: an integer of ") and "no model config value is that large" in err


@pytest.mark.parametrize("argv", [["model", "show", "~no_such_user_here/m.toml"],
                                  ["run", "vector_add", "--hw", "~no_such_user_here/p.toml"]])
def test_a_path_of_a_user_who_is_not_there_is_an_error_naming_it(capsys, argv):
    # (RuntimeError: Could not determine home directory, a traceback)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("~no_such_user_here/") and "error: cannot expand the ~ of the path" in err
