"""Audit of the K3 driver and reference against docs/k3.md and docs/k3_programs.md
(helper-68): the behaviours found wrong, held through the public interfaces."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from mkemu.cli import main

ROOT = Path(__file__).parents[2]
TINY_TOML = ROOT / "programs" / "k3" / "configs" / "k3-tiny.toml"
ONE_STEP = ("--model", "k3-tiny", "--mesh", "1", "--prompt-len", "1", "--steps", "1")


def _model_file(tmp_path: Path, **changes) -> str:
    """k3-tiny's own file (its name too) with some keys changed."""
    lines = []
    for line in TINY_TOML.read_text().splitlines():
        key = line.split("=")[0].strip()
        lines.append(f"{key} = {changes[key]}" if key in changes else line)
    path = tmp_path / "model.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_routing_record_of_another_model_with_the_same_name_is_refused(capsys, tmp_path):
    """docs/k3.md: a routing record of another model is a one-line error. A model file
    may keep a shipped model's name with another shape (here more experts and a wider
    dim, where the recorded expert ids are still in range); its routing is not the
    record's. Before: the record replayed silently."""
    record = str(tmp_path / "routing.json")
    assert main(["run", "k3_megakernel", *ONE_STEP, "--record-routing", record]) == 0
    capsys.readouterr()
    other = _model_file(tmp_path, dim=512, n_experts=16)
    code = main(["run", "k3_megakernel", *ONE_STEP, "--model", other, "--timing-only", "--routing", record])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"{record}: model_config.dim: error:") and "256" in err and "512" in err, err
    # The same model, shipped or as a file, still replays it.
    same = _model_file(tmp_path)
    for model in ("k3-tiny", same):
        assert main(["run", "k3_megakernel", *ONE_STEP, "--model", model, "--timing-only",
                     "--routing", record]) == 0, capsys.readouterr().err
        capsys.readouterr()


def test_layer_plan_of_a_model_with_thousands_of_layers_is_quick(tmp_path):
    """`ModelConfig.layer_plan()` (docs/k3.md) of a long model file: it searched the
    layers of a kind once per layer (10,000 layers: about 14 s); one pass now."""
    from mkemu.programs.k3.config import load_config

    cfg = load_config(_model_file(tmp_path, n_layers=10_000, mla_layers="[3, 9999]"))
    start = time.perf_counter()
    plan = cfg.layer_plan()
    assert time.perf_counter() - start < 2.0
    assert [(p.attn, p.attn_index, p.ffn, p.ffn_index) for p in (plan[0], plan[3], plan[4], plan[9999])] == [
        ("kda", 0, "dense", 0), ("mla", 0, "moe", 2), ("kda", 3, "moe", 3), ("mla", 1, "moe", 9998)]


@pytest.mark.parametrize("tokens", [[1.7], np.array([3.0, 4.0]), [True]])
def test_verify_step_refuses_tokens_that_are_not_integers(tokens):
    """A verify step's tokens are token ids, as a decode step's (which refuses others):
    it truncated 1.7 to token 1 and ran."""
    from mkemu.programs.k3 import reference as ref
    from mkemu.programs.k3.config import load_config
    from mkemu.programs.k3.weights import generate_weights

    cfg = load_config("k3-tiny")
    with pytest.raises(ValueError, match="integers"):
        ref.verify_step(cfg, generate_weights(cfg, 0), ref.init_state(cfg, 1), tokens)


# -- Second audit of the K3 docs (helper-100): each failed before its fix.

def _recorded(capsys, tmp_path: Path) -> tuple[str, dict]:
    import json

    record = tmp_path / "routing.json"
    assert main(["run", "k3_megakernel", *ONE_STEP, "--record-routing", str(record)]) == 0
    capsys.readouterr()
    return str(record), json.loads(record.read_text())


def _replay(capsys, record: str) -> tuple[int, str]:
    code = main(["run", "k3_megakernel", *ONE_STEP, "--timing-only", "--routing", record])
    return code, capsys.readouterr().err


def test_a_routing_record_with_a_description_replays(capsys, tmp_path):
    """k3.md: every key of the record's model config but `description` must match (a
    record holding one was refused, against None)."""
    import json

    record, doc = _recorded(capsys, tmp_path)
    for description in ("k3-tiny's own words", "other words"):
        doc["model_config"]["description"] = description
        Path(record).write_text(json.dumps(doc))
        code, err = _replay(capsys, record)
        assert code == 0 and "Traceback" not in err, err


def test_a_routing_record_without_the_models_config_is_refused(capsys, tmp_path):
    """A record without it skipped the model check and replayed on another model of the
    same name; every record --record-routing writes has it."""
    import json

    record, doc = _recorded(capsys, tmp_path)
    del doc["model_config"]
    Path(record).write_text(json.dumps(doc))
    code, err = _replay(capsys, record)
    assert code == 1 and err.startswith(f"{record}: model_config: error: the routing record keeps no model config")


def test_verify_step_progress_counts_every_token_generated():
    """api.md: progress gets the tokens generated so far (it was capped at --steps, though
    the last step may accept more)."""
    import mkemu

    calls = []
    kernel = mkemu.compile("k3_megakernel", model="k3-tiny", mesh="1", prompt_len=2, steps=5, spec_rows=3, accept=2)
    run = kernel(progress=lambda done, total, figures: calls.append((done, total)))
    tokens = len(run.report.figures["tokens"][0])
    assert tokens == 6 and calls[-1] == (6, 5) and [total for _, total in calls] == [5] * len(calls)
