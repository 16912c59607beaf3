"""The machine's smaller compiled parts, compiled in a child process while the issue
loop compiles.

A first run on a machine compiles the issue loop (most of a minute), the functions
the machine calls outside it (`loop.compiled_machine`) and the flow model's kernels
(`flows.warm_up`). numba compiles one function at a time in a process, so one after
the other they take their sum; `alongside()` starts a child that compiles the smaller
parts into the cache while this process compiles the loop, and waits for it after,
so their code is then loaded from the cache. If the child cannot start or fails,
this process compiles them itself when it needs them, as it would without it.

    python -m mkemu.emulator.warm       # what the child runs
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

import numba

#: How long to wait for the child once the loop is compiled (it usually finished long
#: before): past this it is stopped, and this process compiles what it needs itself.
WAIT_SECONDS = 600


@contextlib.contextmanager
def alongside():
    """Compile the smaller parts in a child process while the body runs."""
    child = None
    if sys.executable and not numba.config.DISABLE_JIT:
        try:
            child = subprocess.Popen([sys.executable, "-m", "mkemu.emulator.warm"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:
            child = None
    try:
        yield
    except BaseException:       # (an interrupted compile: the child's work is not waited for)
        _stop(child)
        raise
    if child is not None:
        try:
            child.wait(timeout=WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            _stop(child)


def _stop(child: subprocess.Popen | None) -> None:
    if child is not None:
        child.kill()
        child.wait()


def main() -> None:
    from mkemu.emulator import flows, loop

    loop.compiled_machine()
    flows.warm_up()


if __name__ == "__main__":
    main()
