"""Shared pytest setup: hypothesis profiles ("ci" is derandomized; chosen when CI is set)."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=50)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", dest="update_golden",
                     help="rewrite the golden files (e.g. tests/dsl/golden/*.lst) from the current output")
