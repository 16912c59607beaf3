"""Outputs and worker processes around signals: several files replaced as one
(`mkemu.runner.atomic_write_all`), workers started with Ctrl-C held back
(`mkemu.runner.signals_held`, as `mkemu.trials.run_trials` starts them)."""

from __future__ import annotations

import signal
import sys
from multiprocessing import get_context

import pytest

from mkemu import runner
from mkemu.runner import signals_held

pytestmark = pytest.mark.skipif(not hasattr(signal, "pthread_sigmask") or sys.platform == "win32",
                                reason="POSIX signal masks")


def _blocked_signals(queue) -> None:
    queue.put(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))


def test_workers_started_while_trials_are_submitted_never_see_a_ctrl_c():
    # A Ctrl-C reaches the whole process group: a worker still importing when it came
    # printed its own traceback. Started while SIGINT is held (as `run_trials` submits),
    # a worker holds it from its first instruction; this process gets it as the block ends.
    context = get_context("spawn")
    queue = context.Queue()
    with signals_held((signal.SIGINT,)):
        assert signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        worker = context.Process(target=_blocked_signals, args=(queue,))
        worker.start()
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert signal.SIGINT in queue.get(timeout=120)
    worker.join(timeout=120)


def test_an_interrupted_dump_leaves_the_folder_s_earlier_set_whole(tmp_path, monkeypatch):
    # The four files of a dump are replaced together: a SIGTERM as the new set is written
    # (here: as its second file is) leaves the earlier dump's four files as they were.
    dump = tmp_path / "dump"
    dump.mkdir()
    old = {name: f"earlier {name}".encode() for name in ("weights.npz", "inputs.npz", "reference.npz",
                                                           "emulator.npz")}
    for name, data in old.items():
        (dump / name).write_bytes(data)
    real_open, opened = open, []

    def open_then_interrupt(path, *args, **kwargs):
        opened.append(path)
        if len(opened) == 2:
            raise KeyboardInterrupt
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", open_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        runner.atomic_write_all({str(dump / name): b"new" for name in old})
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in dump.iterdir()} == old      # (no temporary file left either)
    runner.atomic_write_all({str(dump / name): b"new " + name.encode() for name in old})
    assert {p.name: p.read_bytes() for p in dump.iterdir()} == {name: b"new " + name.encode() for name in old}
