"""The emulator's run options are one validated object: a bad value is a ConfigError
naming the option when the `RunConfig` is made, not a traceback from deep in a run."""

from __future__ import annotations

import numpy as np
import pytest

from mkemu.emulator.config import RunConfig
from mkemu.errors import ConfigError


@pytest.mark.parametrize("kwargs, key", [
    ({"seed": -1}, "seed"),                       # was accepted; the run then raised numpy's ValueError
    ({"seed": "7"}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"seed": True}, "seed"),
    ({"schedule_seed": -3}, "schedule_seed"),
    ({"schedule_seed": None}, "schedule_seed"),
    ({"max_cycles": 0}, "max_cycles"),
    ({"max_cycles": 2**63}, "max_cycles"),        # was accepted; the run raised OverflowError
    ({"max_instructions": 2**70}, "max_instructions"),
    ({"max_instructions": 2.0}, "max_instructions"),
    ({"dma_order": "lifo"}, "dma_order"),
    ({"schedule": "early"}, "schedule"),
    ({"checks": ["races", "bounds"]}, "checks"),
    ({"checks": "races"}, "checks"),              # a string is not a set of names (was: "a, c, e, r, s")
    ({"checks": None}, "checks"),                 # was a TypeError
    ({"checks": [1, None]}, "checks"),            # was a TypeError of str.join
    ({"timing_only": "yes"}, "timing_only"),
    ({"record_readbacks": 1}, "record_readbacks"),
])
def test_a_bad_option_is_a_config_error_naming_it(kwargs, key):
    with pytest.raises(ConfigError) as err:
        RunConfig(**kwargs)
    assert err.value.key == key
    assert key in str(err.value)


def test_good_options_are_kept_and_numpy_integers_become_ints():
    c = RunConfig(seed=np.int64(3), schedule_seed=np.uint32(4), max_cycles=np.int64(2**62),
                  max_instructions=10, checks=["races"], timing_only=True, dma_order="fifo")
    assert (c.seed, c.schedule_seed, c.max_cycles, c.max_instructions) == (3, 4, 2**62, 10)
    assert all(type(v) is int for v in (c.seed, c.schedule_seed, c.max_cycles))
    assert c.checks == frozenset({"races"}) and c.timing_only is True
    assert RunConfig(checks=()).checks == frozenset()


def test_checks_that_are_not_names_are_named_as_given():
    with pytest.raises(ConfigError, match=r"unknown check\(s\) 1, None; known: "):
        RunConfig(checks=[1, None])
