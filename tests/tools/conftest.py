"""Session fixtures: the DMA-bound and MXU-bound programs, recorded once."""

from __future__ import annotations

import pytest
from trace_programs import MXU_BOUND, DMA_BOUND, Recorded, record


@pytest.fixture(scope="session")
def dma_bound() -> Recorded:
    return record(DMA_BOUND, regions=("copy",))


@pytest.fixture(scope="session")
def mxu_bound() -> Recorded:
    return record(MXU_BOUND)
