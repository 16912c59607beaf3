"""Speculative decoding's verify step (`--spec-rows R`) on the K3 programs.

A verify step runs R consecutive positions of one sequence; accepting a prefix of them is
exact, so a speculative run must generate the very tokens plain greedy decoding does,
with every row's logits bit-exact against `reference.verify_step` (R decode steps in
order). R = 1 is the plain program: same bits and same cycles.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mkemu.cli import main

PROGRAMS = ["programs/k3_megakernel.mk", "programs/k3_per_op.mk", "programs/k3_superop.mk"]
TINY = ("--model", "k3-tiny", "--prompt-len", "2", "--steps", "6")


def run_json(capsys, *args) -> tuple[int, dict]:
    code = main(["run", *args, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


@pytest.fixture(scope="module")
def greedy_tokens():
    """Plain greedy decoding of the same prompt, by the reference alone."""
    from mkemu.programs.k3 import reference as ref
    from mkemu.programs.k3.config import load_config
    from mkemu.programs.k3.weights import generate_weight_bits

    cfg = load_config("k3-tiny")
    weights = generate_weight_bits(cfg, 0)
    prompt = np.random.default_rng([0, 1]).integers(0, cfg.vocab, size=(1, 2))
    return ref.generate(cfg, weights, prompt, 14).tokens[0].tolist()


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("scheme", [0, 1])
@pytest.mark.parametrize("mesh", ["1", "2x2x2"])
def test_verify_rows_bit_exact_at_k3_tiny(capsys, greedy_tokens, program, scheme, mesh):
    code, report = run_json(capsys, program, *TINY, "--mesh", mesh, "--spec-rows", "4", "--accept", "3",
                            "--set", f"SCHEME={scheme}")
    assert code == 0, report["mismatch"]
    assert report["bit_exact"] is True and report["spec_rows"] == 4
    # The prompt's 2 tokens and 2 drafts, then the anchor and 3 drafts: 3 accepted each step.
    assert report["accepted_per_step"] == [3, 3]
    assert report["accepted_tokens_per_step"] == 3.0
    tokens = report["tokens"][0]
    assert len(tokens) == 6 and tokens == greedy_tokens[:6]
    assert report["accepted_tokens_per_s"] == pytest.approx(3 * 1e6 / report["us_per_step"])


@pytest.mark.parametrize("program", PROGRAMS[:2])
def test_eight_rows_seeded_acceptance(capsys, greedy_tokens, program):
    """R = 8 (1 anchor + 7 drafts), the acceptance length drawn per step from the seed."""
    code, report = run_json(capsys, program, "--model", "k3-tiny", "--mesh", "2x2x2", "--prompt-len", "2",
                            "--steps", "8", "--spec-rows", "8")
    assert code == 0, report["mismatch"]
    accepted = report["accepted_per_step"]
    assert all(1 <= n <= 8 for n in accepted) and len(set(accepted)) > 1
    assert report["tokens"][0] == greedy_tokens[:len(report["tokens"][0])] and len(report["tokens"][0]) <= 14
    assert len(report["tokens"][0]) == sum(accepted) >= 8


@pytest.mark.parametrize("program", PROGRAMS[:2])
def test_verify_rows_bit_exact_at_k3_mini(capsys, program):
    code, report = run_json(capsys, program, "--mesh", "2x2x2", "--prompt-len", "1", "--steps", "4",
                            "--spec-rows", "4", "--accept", "2")
    assert code == 0, report["mismatch"]
    assert report["bit_exact"] is True and report["model"] == "k3-mini"
    assert report["accepted_per_step"] == [2, 2]


@pytest.mark.parametrize("program", PROGRAMS[:2])
def test_one_row_is_the_plain_program(capsys, program):
    """--spec-rows 1: every step is an ordinary decode step, same bits and cycles."""
    args = (program, *TINY, "--mesh", "2x2x2")
    _, plain = run_json(capsys, *args)
    _, spec = run_json(capsys, *args, "--spec-rows", "1")
    assert spec["accepted_per_step"] == [0] + [1] * 6     # the first prompt token's step generates nothing
    assert spec["cycles_per_step"] == plain["cycles_per_step"]
    assert spec["tokens"] == plain["tokens"] and spec["bit_exact"] is True
    assert spec["hbm_bytes_per_step"] == plain["hbm_bytes_per_step"]


def test_check_layers_with_verify_rows(capsys):
    code, report = run_json(capsys, PROGRAMS[0], *TINY, "--mesh", "1", "--spec-rows", "3", "--accept", "1",
                            "--check-layers")
    assert code == 0 and report["bit_exact"] is True
    assert report["accepted_per_step"] == [1] * 6     # the first draft always wrong: one token a step


def test_timing_only_takes_the_acceptance_from_accept(capsys):
    code, report = run_json(capsys, PROGRAMS[0], "--model", "k3-tiny", "--mesh", "2x2x2", "--prompt-len", "1",
                            "--steps", "7", "--spec-rows", "8", "--accept", "6", "--timing-only")
    assert code == 0 and report["timing_only"] is True and report["bit_exact"] is None
    assert report["accepted_per_step"] == [6, 6]
    assert report["accepted_tokens_per_s"] == pytest.approx(6 * 1e6 / report["us_per_step"])


@pytest.mark.parametrize("args,message", [
    (("--spec-rows", "4", "--batch", "2"), "needs --batch 1"),
    (("--accept", "2"), "needs --spec-rows"),
    (("--spec-rows", "9"), "--spec-rows must be 1..8"),
    (("--spec-rows", "4", "--accept", "5"), "--accept must be 1..4"),
    (("--spec-rows", "8", "--steps", "12"), "max_seq 16"),
    (("--spec-rows", "4", "--record-routing", "x.json"), "does not record or replay"),
])
def test_wrong_combinations_are_one_line_errors(capsys, args, message):
    code = main(["run", PROGRAMS[0], "--model", "k3-tiny", "--mesh", "1", *args])
    err = capsys.readouterr().err
    assert code != 0 and message in err and "Traceback" not in err


def test_reference_verify_step_is_decode_steps_in_order():
    """The contract: row r of a verify step is the decode step of position pos + r, and the
    state after row r is the one R sequential steps leave."""
    from mkemu.programs.k3 import reference as ref
    from mkemu.programs.k3.config import load_config
    from mkemu.programs.k3.weights import generate_weights

    cfg = load_config("k3-tiny")
    w = generate_weights(cfg, 3)
    state = ref.init_state(cfg, 1)
    _, state = ref.decode_step(cfg, w, state, np.array([5]))
    tokens = np.array([7, 11, 13])
    logits, states, fed = ref.verify_step(cfg, w, state, tokens)
    assert fed.tolist() == tokens.tolist() and len(states) == 3
    s = state
    for r, t in enumerate(tokens):
        expect, s = ref.decode_step(cfg, w, s, np.array([t]))
        assert np.array_equal(expect[0].view(np.uint32), logits[r].view(np.uint32))
        assert states[r].pos == s.pos == state.pos + r + 1
        assert np.array_equal(states[r].kda_s, s.kda_s) and np.array_equal(states[r].mla_cache, s.mla_cache)
    # A drafter that is wrong from its first draft on: row 1 gets another token than row 0's argmax.
    _, _, fed = ref.verify_step(cfg, w, state, tokens[:1], rows=3,
                                draft=lambda r, greedy: (greedy + 1) % cfg.vocab)
    assert fed[0] == 7 and fed[1] == (int(np.argmax(logits[0])) + 1) % cfg.vocab
    with pytest.raises(ValueError, match="batch 1"):
        ref.verify_step(cfg, w, ref.init_state(cfg, 2), tokens)
