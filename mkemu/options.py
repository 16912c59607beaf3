"""`Options`: the one validated set of options of a run, shared by the CLI and the API.

`mkemu run` builds it from its flags, `mkemu.compile(...)` from its keyword
arguments; both get the same defaults and the same one-line errors. It holds the
machine (profile, mesh), the emulator's run settings (seed, cycle guard, DMA order,
runtime checks: `run_config()` derives the emulator's own `RunConfig`), the
program's compile-time parameters, where to write a trace, and the options of a
program driver (the K3 programs: model, batch, prompt length, steps, ...).
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
from collections.abc import Mapping
from collections.abc import Set as AbstractSet

import attrs

from mkemu.emulator.config import (CHECKS, DMA_ORDERS, SCHEDULES, RunConfig, check_names, integer,
                                   known_checks)
from mkemu.emulator.topology import parse_mesh
from mkemu.errors import ConfigError, grouped, shown
from mkemu.isa.hardware import DEFAULT_PROFILE

# The options a driver takes (named by field; `mkemu run` names their flags).
DRIVER_FIELDS = ("model", "batch", "prompt_len", "steps", "check_layers", "dump", "timing_only", "routing",
                 "routing_skew", "record_routing", "spec_rows", "accept")

# Driver options a plain program takes too (a plain timing-only run reads no data back).
PLAIN_TOO = ("timing_only",)


def _mesh(value):
    if value is None:
        return None
    if isinstance(value, str):
        return parse_mesh(value)
    # (bytes would be taken as the tuple of their byte values, a dict as its keys, a set in no order)
    if isinstance(value, (bytes, bytearray, memoryview, Mapping, AbstractSet)):
        raise ConfigError(f"bad mesh {shown(value)}: give 'XxYxZ' or a tuple of 1 to 3 positive integers",
                          key="mesh")
    try:
        dims = tuple(integer(d) for d in value)
    except TypeError:
        raise ConfigError(f"bad mesh {shown(value)}: give 'XxYxZ' or a tuple of 1 to 3 positive integers",
                          key="mesh") from None
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1
                                          for d in dims):
        raise ConfigError(f"bad mesh {shown(value)}: give 'XxYxZ' or a tuple of 1 to 3 positive integers",
                          key="mesh")
    return dims + (1,) * (3 - len(dims))


def _path(value):
    """A `pathlib.Path` (any os.PathLike) as the str path it is; anything else as it is."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def check_path(value, key: str) -> None:
    """A path no file can have is refused up front: the OS functions would raise
    ValueError ("embedded null byte"), not say which option held it."""
    if isinstance(value, str) and "\0" in value:
        raise ConfigError(f"{key} must be a path or a name, and no path holds a NUL character: {shown(value)}", key=key)


def _int(low: int | None = None, optional: bool = False, high: int | None = None):
    def check(instance, attribute, value):
        if optional and value is None:
            return
        if not isinstance(value, int) or isinstance(value, bool) or (low is not None and value < low):
            bound = "an integer" if low is None else f"an integer >= {low}"
            raise ConfigError(f"{attribute.name} must be {bound}, not {shown(value)}", key=attribute.name)
        if high is not None and value > high:
            raise ConfigError(f"{attribute.name} must be at most {high:,} (the emulator counts in 64-bit "
                              f"integers), not {grouped(value)}", key=attribute.name)
    return check


# Cycle and instruction guards are 64-bit integers in the emulator (with room to add to them).
MAX_GUARD = 2**62


def _one_of(choices):
    def check(instance, attribute, value):
        if not isinstance(value, str) or value not in choices:
            raise ConfigError(f"{attribute.name} must be one of {', '.join(choices)}, not {shown(value)}",
                              key=attribute.name)
    return check


def _param_dict(value):
    if not isinstance(value, Mapping):
        raise ConfigError(f"params must be a dict NAME -> integer, not {shown(value)}", key="params")
    return {name: integer(v) for name, v in value.items()}


def _bool(instance, attribute, value):
    if not isinstance(value, bool):
        raise ConfigError(f"{attribute.name} must be True or False, not {shown(value)}", key=attribute.name)


def _params(instance, attribute, value):
    for name, v in value.items():
        if not isinstance(name, str) or not isinstance(v, int) or isinstance(v, bool):
            raise ConfigError(f"params want NAME -> integer, got {shown(name)} -> {shown(v)}", key="params")


def _optional_str(instance, attribute, value):
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{attribute.name} must be a non-empty string, not {shown(value)}", key=attribute.name)
    check_path(value, attribute.name)


def _real(value):
    """A real number as a Python float (numpy's too, as the integer fields take numpy
    integers); anything else as given, for the validator to name."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool | int):
        try:
            return float(value)
        except OverflowError:    # (a Fraction past float's range: the validator names it)
            return value
    return value


def _optional_number(instance, attribute, value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
        raise ConfigError(f"{attribute.name} must be a number >= 0, not {shown(value)}", key=attribute.name)
    if value is not None and (value > 1e308 if isinstance(value, int) else not math.isfinite(value)):
        # (an int past float's range: math.isfinite would raise OverflowError)
        text = repr(value) if isinstance(value, float) or value.bit_length() <= 14_000 else None   # (4,300 digits)
        what = text if text is not None and len(text) <= 40 else (
            f"an integer of {len(text)} digits" if text is not None else shown(value))
        raise ConfigError(f"{attribute.name} must be a finite number, not {what}", key=attribute.name)


def _trace(instance, attribute, value):
    if value is not None and value is not True and not isinstance(value, str):
        raise ConfigError(f"trace must be a path, True (keep it in memory) or None, not {shown(value)}", key="trace")
    check_path(value, "trace")


def _known_names(cls, names) -> None:
    """Every name a field of `cls`: an unknown one is a ConfigError naming it, not
    Python's TypeError of an unexpected keyword argument."""
    known = sorted(a.name for a in attrs.fields(cls))
    unknown = sorted(set(names) - set(known))
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1) if len(unknown) == 1 else []
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown option(s) {', '.join(unknown)}{hint}; known: {', '.join(known)}",
                          key=unknown[0])


# init=False: attrs writes `__attrs_init__`, which `__init__` calls after checking the names.
@attrs.frozen(kw_only=True, init=False)
class Options:
    """Options of one run. `hw` is a shipped profile name or a TOML path; `mesh` is
    "XxYxZ" or a tuple (None: the profile's); `checks` are the runtime checks left on
    ("races", "semaphores"; `mkemu run --no-check NAME` removes one); `max_instructions`
    bounds each core's instructions per launch (a runaway loop faults); `schedule`
    ("normal", "shuffle" with `schedule_seed`, "late") is when DMAs land; `params`
    override the program's `param`s; `trace` is a path to write the trace to, True to
    keep it in memory (API), or None. The driver options (None: the driver's default)
    apply to programs whose reference is a driver, e.g. the K3 programs; `timing_only`
    computes nothing and charges every cycle (the driver supplies the router's choices:
    `routing` replays a file `record_routing` wrote in a data run, else a seeded
    synthetic draw with popularity skew `routing_skew`); `spec_rows` R makes every step a
    speculative-decoding verify step of R rows of one sequence, `accept` fixes how many
    tokens each step accepts (else a seeded draw)."""

    hw: str = attrs.field(default=DEFAULT_PROFILE, converter=_path)
    mesh: tuple[int, int, int] | None = attrs.field(default=None, converter=_mesh)
    seed: int = attrs.field(default=0, converter=integer, validator=_int(0))
    max_cycles: int = attrs.field(default=10**12, converter=integer, validator=_int(1, high=MAX_GUARD))
    dma_order: str = attrs.field(default="round_robin", validator=_one_of(DMA_ORDERS))
    checks: frozenset[str] = attrs.field(default=frozenset(CHECKS), converter=check_names, validator=known_checks)
    max_instructions: int = attrs.field(default=50_000_000, converter=integer, validator=_int(1, high=MAX_GUARD))
    schedule: str = attrs.field(default="normal", validator=_one_of(SCHEDULES))
    schedule_seed: int = attrs.field(default=0, converter=integer, validator=_int(0))
    params: dict[str, int] = attrs.field(factory=dict, converter=_param_dict, validator=_params)
    trace: str | bool | None = attrs.field(default=None, converter=_path, validator=_trace)
    model: str | None = attrs.field(default=None, converter=_path, validator=_optional_str)
    batch: int | None = attrs.field(default=None, converter=integer, validator=_int(optional=True))
    prompt_len: int | None = attrs.field(default=None, converter=integer, validator=_int(optional=True))
    steps: int | None = attrs.field(default=None, converter=integer, validator=_int(optional=True))
    check_layers: bool = attrs.field(default=False, validator=_bool)
    dump: str | None = attrs.field(default=None, converter=_path, validator=_optional_str)
    timing_only: bool = attrs.field(default=False, validator=_bool)
    routing: str | None = attrs.field(default=None, converter=_path, validator=_optional_str)
    routing_skew: float | None = attrs.field(default=None, converter=_real, validator=_optional_number)
    record_routing: str | None = attrs.field(default=None, converter=_path, validator=_optional_str)
    spec_rows: int | None = attrs.field(default=None, converter=integer, validator=_int(optional=True))
    accept: int | None = attrs.field(default=None, converter=integer, validator=_int(optional=True))

    def __init__(self, /, *args, **fields):     # (self positional-only: Options(self=1) is an unknown option)
        if args:
            raise ConfigError(f"Options takes its fields by name (e.g. Options(hw='test', mesh='2x2')), "
                              f"not by position: got {args[0]!r}", key="options")
        _known_names(type(self), fields)
        self.__attrs_init__(**fields)

    @hw.validator
    def _hw(self, attribute, value):
        if not isinstance(value, str) or not value:
            raise ConfigError(f"hw must be a profile name or a TOML path, not {shown(value)}", key="hw")
        check_path(value, "hw")

    def __attrs_post_init__(self):
        if self.routing is not None and self.routing_skew is not None:
            raise ConfigError("routing_skew, routing: give one of them (the first draws synthetic router choices, "
                              "the second replays recorded ones)", key="routing_skew")

    def run_config(self) -> RunConfig:
        """The emulator's view of these options."""
        return RunConfig(seed=self.seed, max_cycles=self.max_cycles, dma_order=self.dma_order,
                         checks=self.checks, max_instructions=self.max_instructions,
                         schedule=self.schedule, schedule_seed=self.schedule_seed,
                         timing_only=self.timing_only, record_readbacks=self.record_routing is not None)

    def driver_options(self) -> dict:
        """What a driver sees: the seed and the driver options that were set."""
        out = {"seed": self.seed}
        for name in DRIVER_FIELDS:
            value = getattr(self, name)
            if value is not None and value is not False:   # 0 is a value (an error the driver names)
                out[name] = value
        return out

    def driver_options_set(self) -> list[str]:
        """The driver options that were set (an error for a plain program)."""
        return [name for name in DRIVER_FIELDS
                if name not in PLAIN_TOO and getattr(self, name) is not None and getattr(self, name) is not False]

    @classmethod
    def of(cls, options: Options | None = None, **changes) -> Options:
        """`options` (or the defaults) with `changes`, validated; unknown names are an error."""
        if options is not None and not isinstance(options, cls):
            raise ConfigError(f"options must be an mkemu.Options (or give its fields as keyword arguments), "
                              f"not {type(options).__name__}", key="options")
        # (an unknown name is refused by __init__, which evolve calls too)
        return attrs.evolve(options, **changes) if options is not None else cls(**changes)
