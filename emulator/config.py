"""The one validated set of run options (seed, cycle guard, DMA ordering, checks)."""

from __future__ import annotations

import numbers

import attrs

from mkemu.errors import ConfigError, shown
from mkemu.isa.hardware import MAX_INT

DMA_ORDERS = ("round_robin", "fifo")
SCHEDULES = ("normal", "shuffle", "late")
CHECKS = ("races", "semaphores")

# A core may run at most one global instruction (DMA start, semaphore wait or signal,
# barrier; halt is free) per GLOBAL_SHARE of its `max_instructions` in one launch:
# 500,000 with the default 50,000,000. A local instruction runs in the compiled loop
# in about 8 ns of wall time (50 M of them in 0.4 s), but every global one returns to
# Python and the machine's event loop: 5-12 us for a semaphore signal or wait,
# 15-18 us for a DMA start with its flow update, i.e. 1,000-2,000 local ones. Counted
# like local ones, a loop of global instructions ran for minutes per core before the
# guard tripped; under this share it stops after 3-9 s of wall per spinning core, at
# the same instruction on every machine (it counts instructions, never wall time).
# The heaviest shipped run, the k3-full megakernel on 4x2x2 (timing-only) with
# --batch 8, issues at most 159,230 global instructions per core per launch among
# 14.1 M instructions: a margin of 3.1x here, as against 3.5x under max_instructions
# (K3 kernels issue about 1.1% of their instructions as global ones); without --batch
# 62,052 among 6.9 M, the main job (k3-mini) 865 among 45,477 (docs/safety.md).
GLOBAL_SHARE = 100


def global_budget(max_instructions: int) -> int:
    """The global instructions a core may run per launch under `max_instructions`."""
    return max(1, max_instructions // GLOBAL_SHARE)


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


def known_checks(instance, attribute, value):
    """attrs validator: every name a known check (`Options` validates its field with it too)."""
    # (as text: a check named by a number or None is named too, not a TypeError of join)
    unknown = sorted(name if isinstance(name, str) else shown(name) for name in set(value) - set(CHECKS))
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
    loop stops within seconds of wall time, naming the loop), and so does one that
    runs more than max_instructions // GLOBAL_SHARE global instructions (each costs
    the wall time of about a thousand local ones).
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
                                         validator=known_checks)
    max_instructions: int = attrs.field(default=50_000_000, converter=integer, validator=_positive)
    schedule: str = attrs.field(default="normal", validator=_one_of(SCHEDULES))
    schedule_seed: int = attrs.field(default=0, converter=integer, validator=_seed)
    timing_only: bool = attrs.field(default=False, validator=_flag)
    record_readbacks: bool = attrs.field(default=False, validator=_flag)
