"""The reference's steps computed ahead (a forked child) against the same steps computed
in this process: same bits, errors raised here, a lost child made up for. (The tests
ask for the child: by default one is forked only when a core is idle.)"""

from __future__ import annotations

import os

import numpy as np
import pytest

from mkemu.programs.k3 import reference as R
from mkemu.programs.k3 import reference_steps as RS
from mkemu.programs.k3.config import load_config
from mkemu.programs.k3.weights import generate_weight_bits

STEPS = 4


@pytest.fixture(scope="module")
def model():
    cfg = load_config("k3-tiny")
    weights = generate_weight_bits(cfg, 0, "bf16")
    prompt = np.random.default_rng(3).integers(0, cfg.vocab, size=(2, 2))   # shorter than the run
    return cfg, weights, prompt


def _bits(logits) -> list[bytes]:
    return [np.asarray(x, np.float32).tobytes() for x in logits]


def _local(model) -> list[np.ndarray]:
    cfg, weights, prompt = model
    return [logits for logits, _ in RS.reference_logits(cfg, weights, prompt, STEPS)]


def test_steps_computed_ahead_are_the_steps_computed_here(model):
    cfg, weights, prompt = model
    with RS.ReferenceSteps(cfg, weights, prompt, STEPS, ahead=True) as ahead:
        got = [ahead.next() for _ in range(STEPS)]
    assert all(trace is None for _, trace in got)
    assert _bits(logits for logits, _ in got) == _bits(_local(model))
    # The tokens after the prompt are the reference's own greedy choices.
    tokens = RS.next_input(prompt, 1, got[1][0])
    assert np.array_equal(tokens, np.argmax(got[1][0], axis=-1))


def test_traced_steps_run_here_with_every_layer(model):
    cfg, weights, prompt = model
    with RS.ReferenceSteps(cfg, weights, prompt, 2, traced=True) as here:
        logits, trace = here.next()
    assert f"layer{cfg.n_layers - 1}.ffn" in trace
    assert _bits([logits]) == _bits(_local(model)[:1])


def test_replaying_a_step_gives_its_logits_and_trace(model):
    cfg, weights, prompt = model
    trace = {}
    logits = RS.replay_reference(cfg, weights, prompt, 2, trace)
    assert _bits([logits]) == _bits(_local(model)[2:3])
    assert "layer0.attn" in trace


def test_an_error_in_the_reference_is_raised_here(model, monkeypatch):
    cfg, weights, prompt = model
    real = R.decode_step
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("the second step fails")
        return real(*args, **kwargs)

    monkeypatch.setattr(R, "decode_step", failing)   # (the child is forked with it)
    with RS.ReferenceSteps(cfg, weights, prompt, STEPS, ahead=True) as ahead:
        ahead.next()
        with pytest.raises(ValueError, match="the second step fails"):
            ahead.next()


def test_a_child_that_dies_is_made_up_for_here(model, monkeypatch):
    cfg, weights, prompt = model
    real_child = RS._child

    def dies_after_one(conn, *args):
        real_child(_OneStep(conn), *args)

    monkeypatch.setattr(RS, "_child", dies_after_one)
    with RS.ReferenceSteps(cfg, weights, prompt, STEPS, ahead=True) as ahead:
        got = [ahead.next()[0] for _ in range(STEPS)]
    assert _bits(got) == _bits(_local(model))


class _OneStep:
    """A pipe end that passes on the first message, then the child process ends."""

    def __init__(self, conn):
        self.conn = conn

    def send(self, message):
        self.conn.send(message)
        os._exit(0)


def test_without_a_process_to_fork_the_steps_run_here(model, monkeypatch):
    cfg, weights, prompt = model

    def no_fork(self):
        raise OSError("Resource temporarily unavailable")

    monkeypatch.setattr(RS.multiprocessing.get_context("fork").Process, "start", no_fork)
    with RS.ReferenceSteps(cfg, weights, prompt, STEPS, ahead=True) as here:
        got = [here.next()[0] for _ in range(STEPS)]
    assert _bits(got) == _bits(_local(model))


def test_by_default_the_child_is_forked_only_when_a_core_is_idle(model, monkeypatch):
    cfg, weights, prompt = model
    forks = []
    real_start = RS.multiprocessing.get_context("fork").Process.start

    def counted(self):
        forks.append(1)
        real_start(self)

    monkeypatch.setattr(RS.multiprocessing.get_context("fork").Process, "start", counted)
    for idle in (False, True):
        monkeypatch.setattr(RS, "idle_core", lambda idle=idle: idle)
        with RS.ReferenceSteps(cfg, weights, prompt, STEPS) as steps:
            got = [steps.next()[0] for _ in range(STEPS)]
        assert _bits(got) == _bits(_local(model))
        assert len(forks) == int(idle)


def test_a_daemon_process_computes_the_steps_itself(model, monkeypatch):
    cfg, weights, prompt = model
    monkeypatch.setattr(RS.multiprocessing.current_process(), "daemon", True, raising=False)
    with RS.ReferenceSteps(cfg, weights, prompt, STEPS, ahead=True) as here:
        got = [here.next()[0] for _ in range(STEPS)]
    assert _bits(got) == _bits(_local(model))
