"""The reference's side of a decode run: each step's logits, in order, computed ahead.

The reference alone decides what every step is fed (the prompt's tokens, then its own
greedy choice), so it never waits for the emulator. Where the operating system can
fork and a core is idle, a child process computes all the steps on that core while
the emulator runs the same steps here, and hands each step's logits over a pipe; the
driver only compares. Otherwise, and when every step's per-layer trace is wanted, the
steps run here, one as each is asked for. Either way the logits are the same bits: the
child runs the same code on the same weights.

(Without an idle core the child only competes with the run, and forking a large
process costs CPU of its own: the pages both then share are copied as the run writes
them. A suite of small K3 runs on every core took 15-20% longer with the child.)
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import warnings

import numpy as np
from numba.core.compiler_lock import global_compiler_lock

from . import reference as ref


def next_input(prompt: np.ndarray, step: int, logits: np.ndarray) -> np.ndarray:
    """The tokens of step `step + 1`: the prompt's while it lasts, then the greedy choice
    from step `step`'s logits."""
    return prompt[:, step + 1] if step + 1 < prompt.shape[1] else ref.next_tokens(logits)


def reference_logits(cfg, weights, prompt: np.ndarray, steps: int, traced_from: int | None = None):
    """Yield (logits, per-layer trace or None) of each of `steps` steps; the steps from
    `traced_from` on (None: none) are traced."""
    state = ref.init_state(cfg, prompt.shape[0])
    tokens = prompt[:, 0]
    for step in range(steps):
        trace = {} if traced_from is not None and step >= traced_from else None
        logits, state = ref.decode_step(cfg, weights, state, tokens, trace=trace)
        yield logits, trace
        tokens = next_input(prompt, step, logits)


def reference_state(cfg, weights, prompt: np.ndarray, steps: int) -> ref.DecodeState:
    """The reference's decode state after `steps` steps (for --dump: the steps may have
    been computed in a child, which keeps its state)."""
    state = ref.init_state(cfg, prompt.shape[0])
    tokens = prompt[:, 0]
    for step in range(steps):
        logits, state = ref.decode_step(cfg, weights, state, tokens)
        tokens = next_input(prompt, step, logits)
    return state


def replay_reference(cfg, weights, prompt: np.ndarray, step: int, trace: dict) -> np.ndarray:
    """Step `step`'s logits again, from the start, filling `trace` with its layers (to
    name the first layer that differs after a mismatch)."""
    *_, (logits, layers) = reference_logits(cfg, weights, prompt, step + 1, traced_from=step)
    trace.update(layers)
    return logits


def _child(conn, cfg, weights, prompt, steps) -> None:
    # (the parent's SIGTERM handler, which makes it an interrupt, is not this child's:
    # terminated, it just ends, and the parent computes the steps itself)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        for logits, _ in reference_logits(cfg, weights, prompt, steps):
            conn.send(("logits", logits))
    except BaseException as exc:      # (handed to the parent, which raises it)
        conn.send(("error", exc))
    finally:
        conn.close()


def idle_core() -> bool:
    """Is a core this process may use idle now? (Linux: fewer processes running than
    usable cores, this one included; elsewhere: the last minute's load.)"""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    try:
        with open("/proc/loadavg") as fh:
            running = int(fh.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        try:
            running = os.getloadavg()[0] + 1
        except OSError:
            return False
    return running < cores


class ReferenceSteps:
    """`next()` gives (logits, trace or None) of the next step; use it as a context
    manager so a forked child never outlives the run. `ahead`: compute the steps in a
    child (where the OS can fork), or here; by default, in a child if a core is idle."""

    def __init__(self, cfg, weights, prompt: np.ndarray, steps: int, traced: bool = False,
                 ahead: bool | None = None):
        self._args = (cfg, weights, prompt, steps)
        self._done = 0
        self._conn = self._proc = None
        self._local = None
        if ahead is None:
            ahead = not traced and idle_core()
        if (traced or not ahead or "fork" not in multiprocessing.get_all_start_methods()
                or multiprocessing.current_process().daemon):   # (a daemon, e.g. a Dask worker, may not have children)
            self._local = reference_logits(cfg, weights, prompt, steps, 0 if traced else None)
            return
        context = multiprocessing.get_context("fork")
        self._conn, child = context.Pipe(duplex=False)
        self._proc = context.Process(target=_child, args=(child, *self._args), daemon=True,
                                     name="mkemu-k3-reference")
        # A fork copies only this thread: a lock another thread holds stays held in the
        # child. The child computes with numpy and numba and sends on its own pipe; the
        # one lock it needs is numba's compiler lock (to load its kernels), so the fork
        # happens holding it, and the child, this thread's copy, holds it too.
        try:
            with global_compiler_lock, warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)   # (3.12+: forking with threads)
                self._proc.start()
        except OSError:       # (no process to be had: the steps are computed here)
            self._conn.close()
            self._conn = self._proc = None
            self._local = reference_logits(*self._args)
        child.close()

    def next(self) -> tuple[np.ndarray, dict | None]:
        if self._conn is not None:
            try:
                kind, value = self._conn.recv()
            except (EOFError, OSError):
                self._fall_back()
            else:
                if kind == "error":
                    self.close()
                    raise value
                self._done += 1
                return value, None
        logits, trace = next(self._local)
        self._done += 1
        return logits, trace

    def _fall_back(self) -> None:
        """The child is gone: compute the rest here (the steps it gave are recomputed
        to reach the state, and not handed out again)."""
        self.close()
        self._local = reference_logits(*self._args)
        for _ in range(self._done):
            next(self._local)

    def close(self) -> None:
        if self._proc is not None:
            self._conn.close()
            self._proc.kill()
            self._proc.join()
            self._proc.close()
            self._conn = self._proc = None

    def __enter__(self) -> ReferenceSteps:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
