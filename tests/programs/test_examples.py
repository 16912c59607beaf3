"""The example programs run bit-exactly through `mkemu run`, and double buffering pays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mkemu.cli import main

EXAMPLES = Path(__file__).parents[2] / "programs" / "examples"
# The single-chip examples of the language tutorial (the collectives have their own tests).
MK_EXAMPLES = ["vector_add.mk", "rmsnorm.mk", "softmax.mk", "matmul_single_buffered.mk",
               "matmul_double_buffered.mk"]


@pytest.fixture
def compiler():
    """The back end must import (a broken one fails here, not in every test)."""
    import mkemu.dsl.compiler  # noqa: F401


def run_json(capsys, *argv: str) -> dict:
    code = main(["run", *argv, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_the_examples_are_all_there():
    for name in MK_EXAMPLES + ["vector_add.s"]:
        assert (EXAMPLES / name).is_file(), name


@pytest.mark.parametrize("name", MK_EXAMPLES + ["vector_add.s"])
def test_example_is_bit_exact(capsys, request, name):
    if name.endswith(".mk"):
        request.getfixturevalue("compiler")
    report = run_json(capsys, str(EXAMPLES / name), "--hw", "test", "--mesh", "1")
    assert report["bit_exact"] is True


@pytest.mark.parametrize("name", ["vector_add.mk", "rmsnorm.mk", "softmax.mk"])
def test_example_is_bit_exact_on_the_default_machine(capsys, compiler, name):
    # tpu-v7-like on its default 2x2x2 mesh: 16 cores, each chip with its own inputs.
    report = run_json(capsys, str(EXAMPLES / name))
    assert report["bit_exact"] is True and report["cores"] == 16


def test_double_buffering_is_at_least_1_6x_faster_on_tpu_v7_like(capsys, compiler):
    single = run_json(capsys, str(EXAMPLES / "matmul_single_buffered.mk"), "--mesh", "1")
    double = run_json(capsys, str(EXAMPLES / "matmul_double_buffered.mk"), "--mesh", "1")
    assert single["bit_exact"] is True and double["bit_exact"] is True
    ratio = single["cycles"] / double["cycles"]
    assert ratio >= 1.6, f"single {single['cycles']:,} cycles, double {double['cycles']:,}: only {ratio:.2f}x"
