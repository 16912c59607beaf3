"""The one validated set of run options (seed, cycle guard, DMA ordering, checks)."""

from __future__ import annotations

import numbers

import attrs

from mkemu.errors import ConfigError
from mkemu.isa.hardware import MAX_INT

DMA_ORDERS = ("round_robin", "fifo")
SCHEDULES = ("normal", "shuffle", "late")
CHECKS = ("races", "semaphores")


def _one_of(choices):
    def check(instance, attribute, value):
        if value not in choices:
            raise ConfigError(f"{attribute.name} must be one of {', '.join(choices)}, not {value!r}",
                              key=attribute.name)
    return check


def check_names(value):
    """A collection of check names as a frozenset; a string (an iterable of letters,
    not of names) or a non-iterable is an error naming the option."""
    try:
        if isinstance(value, str):
            raise TypeError
        return frozenset(value)
    except TypeError:
        raise ConfigError(f"checks must be a set of check names ({', '.join(CHECKS)}), not {value!r}",
                          key="checks") from None


def integer(value):
    """A numpy integer as the Python int it is; anything else as it is, to be judged."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
        return int(value)
    return value


def _checks(instance, attribute, value):
    unknown = sorted(set(value) - set(CHECKS))
    if unknown:
        raise ConfigError(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECKS)}",
                          key="checks")


def _positive(instance, attribute, value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{attribute.name} must be a positive integer, not {value!r}",
                          key=attribute.name)
    if value > MAX_INT:
        raise ConfigError(f"{attribute.name} must be at most {MAX_INT:,} (the emulator counts in 64-bit "
                          f"integers), not {value:,}", key=attribute.name)


def _seed(instance, attribute, value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{attribute.name} must be an integer >= 0, not {value!r}", key=attribute.name)


def _flag(instance, attribute, value):
    if not isinstance(value, bool):
        raise ConfigError(f"{attribute.name} must be True or False, not {value!r}", key=attribute.name)


@attrs.frozen
class RunConfig:
    """Options of one emulator run.

    dma_order: "round_robin" lets up to the profile's `dma_max_in_flight`
    descriptors per engine move at once, sharing the engine's bandwidth (more in
    flight means each lands later); "fifo" moves one descriptor at a time per
    engine, in issue order.
    checks: "races" faults on an access or a DMA that races with a DMA in flight, in
    simulated time, by the bytes touched (emulator/safety.py, docs/safety.md);
    "semaphores" faults if any semaphore is non-zero when a kernel ends.
    max_instructions: per core and launch; a core that runs more faults (a runaway
    loop stops within seconds of wall time, naming the loop).
    schedule: when DMAs land (emulator/dma.py): "normal"; "shuffle" (a seeded random
    delay per DMA, from `schedule_seed`); "late" (as late as synchronisation allows).
    timing_only: compute nothing, charge every cycle (docs/architecture.md): memories
    hold no data but SMEM and i32 HBM buffers; values read back into scalars come
    from each core's queue (`Core.feed_readbacks`); race checks are off.
    record_readbacks: keep the values a data run reads back (`Core.take_readbacks`).
    """

    seed: int = attrs.field(default=0, converter=integer, validator=_seed)
    max_cycles: int = attrs.field(default=10**12, converter=integer, validator=_positive)
    dma_order: str = attrs.field(default="round_robin", validator=_one_of(DMA_ORDERS))
    checks: frozenset[str] = attrs.field(default=frozenset(CHECKS), converter=check_names,
                                         validator=_checks)
    max_instructions: int = attrs.field(default=50_000_000, converter=integer, validator=_positive)
    schedule: str = attrs.field(default="normal", validator=_one_of(SCHEDULES))
    schedule_seed: int = attrs.field(default=0, converter=integer, validator=_seed)
    timing_only: bool = attrs.field(default=False, validator=_flag)
    record_readbacks: bool = attrs.field(default=False, validator=_flag)
