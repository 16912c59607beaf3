"""The `mkemu` command's entry point: its signal handling is in place before anything
heavy is imported.

Loading the command line's modules (numpy, attrs, the argument parser) takes a few
tenths of a second; Ctrl-C or SIGTERM meanwhile ends the command as it does during a
run (`mkemu.cli.entry`): one line, exit status 130 or 143, no traceback.
"""

from __future__ import annotations

import os
import signal
import sys


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, as Ctrl-C's KeyboardInterrupt is."""


def terminate(signum, frame) -> None:
    raise Terminated()


def entry() -> int:
    signal.signal(signal.SIGTERM, terminate)
    try:
        from mkemu.cli import entry as command

        return command()
    except KeyboardInterrupt as exc:    # (outside the command's own handling: loading, parsing)
        terminated = isinstance(exc, Terminated)
        print("terminated" if terminated else "interrupted", file=sys.stderr, flush=True)
        os._exit(143 if terminated else 130)
