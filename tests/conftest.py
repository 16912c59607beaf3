"""Shared pytest setup: hypothesis profiles ("ci" is derandomized; chosen when CI is set),
and on a machine with nothing compiled yet the emulator's numba code compiled in the background."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=50)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", dest="update_golden",
                     help="rewrite the golden files (e.g. tests/dsl/golden/*.lst) from the current output")


def pytest_configure(config):
    """On a machine with nothing compiled yet, the issue loop and the flow model's kernels
    compile in background processes from the start of the session, while the workers
    collect and run the tests that need neither; those that do wait for them."""
    if not hasattr(config, "workerinput"):     # (xdist's controller, or a run without workers)
        from mkemu.cache import in_background
        from mkemu.emulator.loop import compile_in_background

        if compile_in_background() is not None:
            in_background("from mkemu.emulator import flows; flows.warm()")
