"""Every shipped program keeps its bits, cycles and trace: golden runs.

Each case runs `mkemu run --json --trace` and compares the report (every emulated
figure: cycles, per-step cycles, instructions, unit busy cycles, HBM bytes,
breakdowns, tokens, bit-exactness) and the SHA-256 of the trace file with the
values recorded in `golden/runs.json`. The first recording was made on the
interpreter core (commit 28e0cd5) before the emulator core was rebuilt, so these
tests hold the rebuilt core to the old one's behaviour exactly.

A change that is meant to move cycles re-records deliberately:
`python -m pytest tests/programs/test_golden_runs.py -n0 --update-golden`, and says
which programs moved and why in its commit message.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from mkemu.cli import main

ROOT = Path(__file__).parents[2]
GOLDEN = Path(__file__).parent / "golden" / "runs.json"
HOST_KEYS = ("wall_s", "compile_s", "trace", "program")

EXAMPLES = ["vector_add.mk", "vector_add.s", "rmsnorm.mk", "softmax.mk",
            "matmul_single_buffered.mk", "matmul_double_buffered.mk",
            "all_reduce.mk", "all_gather.mk", "all_to_all.mk"]


def _cases() -> list[tuple[str, tuple[str, ...]]]:
    cases = []
    for name in EXAMPLES:
        path = f"programs/examples/{name}"
        cases.append((f"{name}-test-1", (path, "--hw", "test", "--mesh", "1")))
        cases.append((f"{name}-v7-2x2x2", (path,)))
    for program in ("k3_megakernel", "k3_per_op", "k3_superop"):
        path = f"programs/{program}.mk"
        for model, steps in (("k3-tiny", ("--prompt-len", "2", "--steps", "3")),
                             ("k3-mini", ("--prompt-len", "1", "--steps", "2"))):
            for batch in (1, 8):
                for scheme in (0, 1):
                    cases.append((f"{program}-{model}-b{batch}-s{scheme}",
                                  (path, "--model", model, "--batch", str(batch), *steps,
                                   "--set", f"SCHEME={scheme}")))
    cases.append(("main-job", ("programs/k3_megakernel.mk",)))
    return cases


CASES = _cases()


def run_case(argv: tuple[str, ...], trace: Path, capsys) -> dict:
    code = main(["run", *argv, "--json", "--trace", str(trace)])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    for key in HOST_KEYS:
        report.pop(key, None)
    report["trace_sha256"] = hashlib.sha256(trace.read_bytes()).hexdigest()
    return report


@pytest.fixture(scope="module")
def golden(request):
    updating = request.config.getoption("update_golden")
    if updating and os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.exit("--update-golden rewrites one file: run it in one process (add -n0)", returncode=2)
    recorded = {} if updating and not GOLDEN.is_file() else json.loads(GOLDEN.read_text())
    yield recorded
    if updating:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize("case,argv", CASES, ids=[c[0] for c in CASES])
def test_run_matches_golden(case, argv, golden, request, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)   # the trace records the program path as given
    report = run_case(argv, tmp_path / "run.mkt", capsys)
    if request.config.getoption("update_golden"):
        golden[case] = report
        return
    expected = golden[case]
    # Every recorded figure must be unchanged (figures added to reports since are not compared).
    changed = sorted(k for k in expected if expected[k] != report.get(k))
    assert not changed, f"{case}: {', '.join(changed)} differ from the golden run"
