"""The child process that compiles the machine's smaller parts while the loop compiles."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mkemu.emulator import warm

# In a fresh process: the signatures `flows.warm_up` compiles the flow model's kernels
# for, then those after real runs (DMAs from HBM and between cores and chips, a
# collective): a run that needed a signature the warm-up did not compile would
# compile it again in a first run, after the child's work.
SIGNATURES = """
import json, mkemu
from mkemu.emulator import flows

def signatures():
    return {name: sorted(map(str, getattr(flows.fc, name).signatures))
            for name in ("k_start", "k_pop", "k_advance", "k_next", "completion_cycle")}

flows.warm_up()
warmed = signatures()
mkemu.compile("all_reduce", hw="test", mesh="2")()
mkemu.compile("matmul_double_buffered", hw="test", mesh="1")()
print(json.dumps({"warmed": warmed, "after": signatures()}))
"""


def test_the_warm_up_compiles_every_flow_kernel_the_machine_calls():
    done = subprocess.run([sys.executable, "-c", SIGNATURES], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert all(found["warmed"][name] for name in ("k_start", "k_pop", "k_advance", "k_next"))
    assert found["after"] == found["warmed"]


def test_without_a_child_the_body_still_runs(monkeypatch):
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    ran = []
    with warm.alongside():
        ran.append(1)
    assert ran == [1]


def test_an_interrupted_compile_stops_the_child(monkeypatch):
    started = []
    real = subprocess.Popen

    def popen(*args, **kwargs):
        started.append(real([sys.executable, "-c", "import time; time.sleep(60)"], **kwargs))
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(KeyboardInterrupt):
        with warm.alongside():
            raise KeyboardInterrupt
    assert started and started[0].poll() is not None
