"""Hardware profiles: every number of the machine model, read from a TOML file.

Owns the list of timing classes, the `HardwareProfile` value the emulator and the
compiler read, and the loader that turns a TOML file (a shipped profile in
`profiles/` or a user's own file) into one. The TOML carries the public figures in
their own units (bytes per second, seconds); the loader converts them once to the
emulator's units (bytes per cycle, whole cycles) and checks every value, so nothing
downstream has to.

A quantity may be given in either unit, the key naming which: `hop_latency_s` or
`hop_latency_cycles`, `hbm_bw_bytes_per_s` or `hbm_bw_bytes_per_cycle`. Times in
seconds round up to whole cycles.

A user file may start with `extends = "tpu-v7-like"` (a shipped name, or a path
relative to that file) and give only the values it changes; tables merge key by
key, including the inline tables of `[timing]`. The base may extend another in turn,
in a chain of any length (profiles that extend each other in a cycle are an error).
"""

from __future__ import annotations

import difflib
import importlib.resources
import math
import os
import re
import tomllib
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from mkemu.errors import ConfigError, read_user_file

TIMING_CLASSES = (
    "scalar",
    "scalar_mul",
    "scalar_div",
    "branch",
    "smem",
    "vextract",
    "vld",
    "vst",
    "valu",
    "vcvt",
    "xlu",
    "eup",
    "mxu_ldw",
    "mxu_push",
    "mxu_mac",
    "mxu_pop",
    "dma_issue",
    "sync",
    "misc",
)

DEFAULT_PROFILE = "tpu-v7-like"

# Register counts are bounded by the instruction encoding's register fields.
MAX_SREGS = 32
MAX_VREGS = 32
MAX_MREGS = 8
MAX_MXUS = 4            # the 2-bit MXU operand field (isa/encoding.py)
MAX_ACCUMULATORS = 16   # the 4-bit accumulator operand field
MAX_INT = 2**62         # cycles and byte counts are 64-bit integers in the emulator
# What the emulator holds per core, bounded so a mistyped profile is an error, not a
# machine that runs out of memory: every core's VMEM and SMEM are arrays of their own.
MAX_CORES_PER_CHIP = 16
# The most chips a mesh may have (8x the 128-chip SD200 size): every core of every chip
# is emulated with memories of its own, and a mistyped mesh should be an error, not a
# machine that runs out of memory.
MAX_CHIPS = 1024
# The most cores a machine may have, chips x cores per chip (each limit alone allows
# 16,384): an emulated core keeps about 3 MB of host memory resident once it has run a
# kernel (its VMEM's first pages, SMEM, registers, matrix units, race and trace rows;
# measured with the default profile), so 4,096 cores need about 12 GB.
MAX_CORES = 4096
HOST_BYTES_PER_CORE = 3 << 20
MAX_SEMAPHORES = 1 << 16
MAX_VMEM_BYTES = 1 << 30
MAX_SMEM_BYTES = 1 << 26
MAX_MXU_DIM = 1024      # each core holds its MXUs' mxu_dim x mxu_dim weights
# One (8, 128) tile of 32-bit words: VMEM is allocated in these.
VMEM_TILE_BYTES = 8 * 128 * 4
MXU_DIM_QUANTUM = 128


@attrs.frozen
class TimingClass:
    """When a result is ready (`latency_cycles`) and how long the unit stays busy."""

    latency_cycles: int
    occupancy_cycles: int


@attrs.frozen
class HardwareProfile:
    """One machine: chip, core, DMA, interconnect, default mesh and timing classes.

    Build it with `load_profile`; all values are checked there. Sizes are bytes,
    times whole cycles of `clock_hz`, bandwidths bytes per cycle.
    """

    name: str
    description: str
    source: str
    clock_hz: float
    # chip
    cores_per_chip: int
    hbm_bytes: int
    hbm_bw_bytes_per_cycle: float
    sibling_bw_bytes_per_cycle: float
    sibling_latency_cycles: int
    sibling_signal_latency_cycles: int
    # core
    vmem_bytes: int
    smem_bytes: int
    vmem_tile: tuple[int, int]
    sregs: int
    vregs: int
    mregs: int
    semaphores: int
    mxus_per_core: int
    mxu_dim: int
    mxu_accumulators: int
    vmem_bw_bytes_per_cycle: float
    # dma
    dma_engine_bw_bytes_per_cycle: float
    dma_max_in_flight: int
    dma_start_latency_cycles: int
    # ici
    link_bw_bytes_per_cycle: float
    links_per_neighbor: int
    per_core_links: bool
    hop_latency_cycles: int
    # mesh
    mesh_dims: tuple[int, int, int]
    mesh_wrap: tuple[bool, bool, bool]
    # launch
    kernel_launch_cycles: int
    timing: Mapping[str, TimingClass]

    def values_key(self) -> str:
        """The profile's values as text, without where it was read from (`source`, and
        the `description` naming that file): alike for copies of one profile file. What
        compiled programs and decoded words are kept under."""
        return repr(attrs.evolve(self, source="", description=""))

    def cycles_to_seconds(self, cycles: float) -> float:
        return cycles / self.clock_hz

    def seconds_to_cycles(self, seconds: float) -> int:
        """Whole cycles covering `seconds` (rounded up)."""
        return _ceil_cycles(seconds * self.clock_hz)

    @property
    def mxu_flops_per_cycle_per_chip(self) -> int:
        """Multiply-adds count two FLOPs; each MXU takes one mxu_dim-wide row per cycle."""
        return 2 * self.mxu_dim * self.mxu_dim * self.mxus_per_core * self.cores_per_chip

    @property
    def peak_flops_per_s(self) -> float:
        return self.mxu_flops_per_cycle_per_chip * self.clock_hz

    @property
    def hbm_bw_bytes_per_s(self) -> float:
        return self.hbm_bw_bytes_per_cycle * self.clock_hz


# --------------------------------------------------------------------------- schema


@attrs.frozen
class _Key:
    """One value of the TOML layout and the profile field it fills."""

    section: str  # "" for a top-level key
    name: str  # TOML key; for "bw" and "time" the stem before the unit suffix
    attr: str
    kind: str  # "int", "float", "bool", "ints", "bools", "bw", "time"
    check: Callable[[Any], str | None] | None = None
    length: int = 0  # for "ints" and "bools"

    @property
    def toml_keys(self) -> tuple[str, ...]:
        if self.kind == "bw":
            return (f"{self.name}_bytes_per_s", f"{self.name}_bytes_per_cycle")
        if self.kind == "time":
            return (f"{self.name}_s", f"{self.name}_cycles")
        return (self.name,)


def _at_least(low: int) -> Callable[[Any], str | None]:
    return lambda v: None if v >= low else f"must be at least {low}, got {v}"


def _between(low: int, high: int, why: str) -> Callable[[Any], str | None]:
    return lambda v: None if low <= v <= high else f"must be {low}..{high} ({why}), got {v}"


def _at_most(check: Callable[[Any], str | None], high: int, why: str) -> Callable[[Any], str | None]:
    """`check`, and at most `high`."""
    return lambda v: check(v) or (None if v <= high else f"must be at most {high:,} ({why}), got {v:,}")


def _positive_multiple(quantum: int, why: str) -> Callable[[Any], str | None]:
    def check(v: int) -> str | None:
        if v <= 0:
            return f"must be positive, got {v}"
        if v % quantum:
            return f"must be a multiple of {quantum} ({why}), got {v}"
        return None

    return check


def _positive(v: float) -> str | None:
    return None if v > 0 else f"must be positive, got {v}"


def _all_at_least_one(v: tuple[int, ...]) -> str | None:
    return None if all(x >= 1 for x in v) else f"every entry must be at least 1, got {list(v)}"


def _the_modelled_tile(v: tuple[int, ...]) -> str | None:
    """The vector registers, memory accesses and VMEM allocation are (8, 128) tiles of
    32-bit words throughout (the ISA's encoding and the compiler's layout): another
    tile would be shown, not emulated."""
    return None if tuple(v) == (8, 128) else f"must be [8, 128], the tile the emulator models; got {list(v)}"


def _mesh_dims(v: tuple[int, ...]) -> str | None:
    problem = _all_at_least_one(v)
    if problem is None and v[0] * v[1] * v[2] > MAX_CHIPS:
        problem = (f"{'x'.join(map(str, v))} is {v[0] * v[1] * v[2]:,} chips; the emulator takes at most "
                   f"{MAX_CHIPS:,} (emulator limit)")
    return problem


def too_many_cores(chips: int, cores_per_chip: int, of: str = "") -> str | None:
    """Why a machine of `chips` chips of `cores_per_chip` cores (`of`: whose, e.g. " (profile
    'x')") is too large to emulate, or None."""
    cores = chips * cores_per_chip
    if cores <= MAX_CORES:
        return None
    return (f"{chips:,} chips of {cores_per_chip} cores{of} are {cores:,} cores; the emulator takes at most "
            f"{MAX_CORES:,} in one machine (each keeps about {HOST_BYTES_PER_CORE >> 20} MB of host memory: "
            f"these would need about {cores * HOST_BYTES_PER_CORE / 1e9:.0f} GB)")


_SCHEMA = (
    _Key("chip", "clock_hz", "clock_hz", "float", _positive),
    _Key("chip", "cores_per_chip", "cores_per_chip", "int", _between(1, MAX_CORES_PER_CHIP, "emulator limit")),
    _Key("chip", "hbm_bytes", "hbm_bytes", "int", _positive_multiple(4096, "whole 4 KiB pages")),
    _Key("chip", "hbm_bw", "hbm_bw_bytes_per_cycle", "bw"),
    _Key("chip", "sibling_bw", "sibling_bw_bytes_per_cycle", "bw"),
    _Key("chip", "sibling_latency", "sibling_latency_cycles", "time"),
    _Key("chip", "sibling_signal_latency", "sibling_signal_latency_cycles", "time"),
    _Key(
        "core",
        "vmem_bytes",
        "vmem_bytes",
        "int",
        _at_most(_positive_multiple(VMEM_TILE_BYTES, "whole (8,128) tiles of 32-bit words"), MAX_VMEM_BYTES,
                 "emulator limit: each core holds its VMEM"),
    ),
    _Key("core", "smem_bytes", "smem_bytes", "int",
         _at_most(_positive_multiple(4, "whole 32-bit words"), MAX_SMEM_BYTES, "emulator limit")),
    _Key("core", "vmem_tile", "vmem_tile", "ints", _the_modelled_tile, length=2),
    _Key("core", "sregs", "sregs", "int", _between(2, MAX_SREGS, "s0 reads as zero; encoding limit")),
    _Key("core", "vregs", "vregs", "int", _between(1, MAX_VREGS, "encoding limit")),
    _Key("core", "mregs", "mregs", "int", _between(2, MAX_MREGS, "m0 is all true; encoding limit")),
    _Key("core", "semaphores", "semaphores", "int", _between(1, MAX_SEMAPHORES, "emulator limit")),
    _Key("core", "mxus_per_core", "mxus_per_core", "int", _between(1, MAX_MXUS, "encoding limit")),
    _Key(
        "core",
        "mxu_dim",
        "mxu_dim",
        "int",
        _at_most(_positive_multiple(MXU_DIM_QUANTUM, "the MXU works on whole 128-lane vregs"), MAX_MXU_DIM,
                 "emulator limit: each core holds its MXUs' weights"),
    ),
    _Key("core", "mxu_accumulators", "mxu_accumulators", "int", _between(1, MAX_ACCUMULATORS, "encoding limit")),
    _Key("core", "vmem_bw", "vmem_bw_bytes_per_cycle", "bw"),
    _Key("dma", "engine_bw", "dma_engine_bw_bytes_per_cycle", "bw"),
    _Key("dma", "max_in_flight", "dma_max_in_flight", "int", _at_least(1)),
    _Key("dma", "start_latency", "dma_start_latency_cycles", "time"),
    _Key("ici", "link_bw", "link_bw_bytes_per_cycle", "bw"),
    _Key("ici", "links_per_neighbor", "links_per_neighbor", "int", _at_least(1)),
    _Key("ici", "per_core_links", "per_core_links", "bool"),
    _Key("ici", "hop_latency", "hop_latency_cycles", "time"),
    _Key("mesh", "dims", "mesh_dims", "ints", _mesh_dims, length=3),
    _Key("mesh", "wrap", "mesh_wrap", "bools", length=3),
    _Key("launch", "kernel_launch", "kernel_launch_cycles", "time"),
)

_TOP_KEYS = ("name", "description", "extends")
_TIMING_FIELDS = ("latency_cycles", "occupancy_cycles")
_SECTIONS = tuple(dict.fromkeys(k.section for k in _SCHEMA)) + ("timing",)
_KNOWN_KEYS: dict[str, tuple[str, ...]] = {
    s: tuple(t for k in _SCHEMA if k.section == s for t in k.toml_keys) for s in _SECTIONS
}
_KNOWN_KEYS["timing"] = TIMING_CLASSES
_SPEC_OF = {(k.section, t): k for k in _SCHEMA for t in k.toml_keys}   # (section, TOML key) -> its entry
# key -> the keys that give the same quantity in another unit
_ALTERNATIVES: dict[tuple[str, str], tuple[str, ...]] = {
    (k.section, t): tuple(o for o in k.toml_keys if o != t) for k in _SCHEMA for t in k.toml_keys
}


def toml_key(name: str) -> str:
    """The dotted TOML key (`section.key`) of a profile value named with or without its
    section (`hbm_bw_bytes_per_s` or `chip.hbm_bw_bytes_per_s`), or of one number of a
    timing class (`timing.valu.latency_cycles` or `valu.latency_cycles`: a profile that
    sets it as `valu.latency_cycles = V` under `[timing]` keeps the class's other number)."""
    timing = _timing_key(name)
    if timing is not None:
        return timing
    section, _, key = name.rpartition(".")
    sections = [section] if section else [s for s in _SECTIONS if s != "timing"]
    for s in sections:
        if key in _KNOWN_KEYS.get(s, ()) and s != "timing":
            return f"{s}.{key}"
    known = [f"{s}.{k}" for s in _SECTIONS if s != "timing" for k in _KNOWN_KEYS[s]]
    close = [k for k in known if k.endswith(f".{key}")] or difflib.get_close_matches(
        name, known + [k.split(".")[1] for k in known], n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise ConfigError(f"no profile value '{name}'{hint}; the values: {', '.join(known)}; and the timing "
                      "classes' timing.CLASS.latency_cycles and timing.CLASS.occupancy_cycles", key=name)


def _timing_key(name: str) -> str | None:
    """`toml_key` of one number of a timing class; None for a name of another section."""
    parts = name.split(".")
    if parts[0] == "timing":
        parts = parts[1:]
    elif len(parts) != 2 or parts[0] not in TIMING_CLASSES:
        return None
    if len(parts) == 2 and parts[0] in TIMING_CLASSES and parts[1] in _TIMING_FIELDS:
        return "timing." + ".".join(parts)
    if parts and parts[0] in TIMING_CLASSES:   # (a class without its number, or with a wrong one)
        close = [f"timing.{parts[0]}.{f}" for f in _TIMING_FIELDS]
    else:
        known = [f"timing.{c}.{f}" for c in TIMING_CLASSES for f in _TIMING_FIELDS]
        close = difflib.get_close_matches("timing." + ".".join(parts), known, n=1)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    raise ConfigError(f"no timing value '{name}'{hint}; a timing class is varied by one of its two numbers, "
                      f"timing.CLASS.latency_cycles or timing.CLASS.occupancy_cycles, CLASS one of "
                      f"{', '.join(TIMING_CLASSES)}", key=name)


# --------------------------------------------------------------------------- loading


def _profiles_dir():
    return importlib.resources.files(__package__).joinpath("profiles")


def list_profiles() -> list[str]:
    """Names of the shipped profiles, sorted."""
    return sorted(
        entry.name.removesuffix(".toml")
        for entry in _profiles_dir().iterdir()
        if entry.name.endswith(".toml")
    )


def load_profile(name_or_path: str | os.PathLike[str] = DEFAULT_PROFILE) -> HardwareProfile:
    """A shipped profile by name (see `list_profiles`) or a user's TOML file by path."""
    raw, file, source = _load_raw(name_or_path, base_dir=Path.cwd())
    return _build(raw, file, source)


def profile_files(name_or_path: str | os.PathLike[str]) -> list[str]:
    """The user's files a profile is read from: its own (for a path) and every file in
    its `extends` chain (shipped profiles are no user file). A command must not write
    over any of them."""
    return [file for _, file, source in _read_chain(name_or_path, Path.cwd()) if not source.startswith("builtin:")]


def _is_path_like(text: str) -> bool:
    return text.endswith(".toml") or "/" in text or os.sep in text


def _locate(name_or_path: str | os.PathLike[str], base_dir: Path) -> tuple[Any, str, str]:
    """(readable resource, file name for errors, source) for a name or a path."""
    text = os.fspath(name_or_path)
    if not isinstance(name_or_path, os.PathLike) and not _is_path_like(text):
        known = list_profiles()
        if text in known:
            resource = _profiles_dir().joinpath(f"{text}.toml")
            return resource, str(resource), f"builtin:{text}"
        close = difflib.get_close_matches(text, known, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(
            f"unknown hardware profile '{text}'{hint}. Known profiles: {', '.join(known)};"
            " or give a path to a .toml file"
        )
    path = expanded_path(text)
    if not path.is_absolute():
        path = base_dir / path
    return path, str(path), str(path)


def _read_toml(resource: Any, file: str) -> dict[str, Any]:
    raw = read_toml(resource, file, "profile")
    reject_huge(raw, file, "")
    return raw


def expanded_path(text: str) -> Path:
    """A path of a file to read, `~` and `~user` expanded (a user who is not there, or
    no home, is a ConfigError naming the path, not RuntimeError)."""
    try:
        return Path(text).expanduser()
    except RuntimeError as exc:
        raise ConfigError(f"cannot expand the ~ of the path ({exc})", file=text) from None


def read_toml(resource: Any, file: str, what: str) -> dict[str, Any]:
    """The tables of a TOML file: a user's (a Path: a regular file only) or a shipped
    package resource. Any problem is a ConfigError naming `file` (at line:column for a
    syntax error) and saying what it should have been (`what`: "profile", "model config")."""
    if isinstance(resource, Path):
        data = read_user_file(resource, what)
    else:
        try:
            data = resource.read_bytes()
        except OSError as err:
            raise ConfigError(f"cannot read {what}: {err.strerror or err}", file=file) from None
    try:
        return tomllib.loads(data.decode("utf-8-sig"))   # (a byte-order mark, as some editors write, is not TOML)
    except UnicodeDecodeError as err:
        raise ConfigError(f"{what} is not UTF-8 text: {err}", file=file) from None
    except tomllib.TOMLDecodeError as err:
        message, line, column = str(err), None, None
        where = re.search(r"\(at line (\d+), column (\d+)\)", message)
        if where:
            message = message[: where.start()].strip()
            line, column = int(where.group(1)), int(where.group(2))
        raise ConfigError(f"invalid TOML: {message}", file=file, line=line, column=column) from None
    except ValueError:
        # (tomllib's int() refuses a decimal integer of thousands of digits; not a TOMLDecodeError)
        raise ConfigError("invalid TOML: an integer of thousands of digits", file=file) from None
    except RecursionError:   # (arrays or tables nested thousands deep)
        raise ConfigError("invalid TOML: nested too deeply to read", file=file) from None


# Integers wider than this are no profile value (every one is at most MAX_INT) and are
# refused as they are read: the checks' messages print the value, which str() refuses
# for thousands of digits (a hex integer has no such limit in TOML), and a number field
# converts it to float, which overflows past 2^1024.
_MAX_TOML_INT_BITS = 1000


def reject_huge(value: Any, file: str, key: str, what: str = "profile") -> None:
    """A TOML file's integers of more than 1,000 bits are refused (naming the key): no
    `what` value is that large, and printing one past 4,300 digits, or using one as a
    float, would raise."""
    if isinstance(value, dict):
        for sub, sub_value in value.items():
            reject_huge(sub_value, file, f"{key}.{sub}" if key else sub, what)
    elif isinstance(value, list):
        for item in value:
            reject_huge(item, file, key, what)
    elif isinstance(value, int) and abs(value).bit_length() > _MAX_TOML_INT_BITS:
        raise ConfigError(f"an integer of {abs(value).bit_length()} bits: no {what} value is that large",
                          file=file, key=key)


def _load_raw(name_or_path: str | os.PathLike[str], base_dir: Path) -> tuple[dict[str, Any], str, str]:
    """The merged TOML tables of a profile (its `extends` chain applied), checked for shape.

    The chain is walked in a loop, not by recursion: it may be as long as the user
    makes it (a chain of a thousand files overflowed Python's stack)."""
    chain = _read_chain(name_or_path, base_dir)
    merged, merged_file, merged_source = chain[-1]    # (the profile that extends nothing)
    for raw, file, source in reversed(chain[:-1]):
        # The base is complete on its own: check all of it so its errors name its file.
        _build(merged, merged_file, merged_source)
        base_raw = {k: v for k, v in merged.items() if k not in _TOP_KEYS}
        merged = _merge(base_raw, {k: v for k, v in raw.items() if k != "extends"})
        merged.setdefault("description", f"{merged_source} with overrides from {file}")
        merged_file, merged_source = file, source
    return merged, merged_file, merged_source


def _read_chain(name_or_path: str | os.PathLike[str], base_dir: Path) -> list[tuple[dict[str, Any], str, str]]:
    """(tables, file, source) of the profile and of each profile it extends in turn, each
    read and checked for shape: the profile first, the one that extends nothing last."""
    chain: list[tuple[dict[str, Any], str, str]] = []
    seen: set[str] = set()
    resource, file, source = _locate(name_or_path, base_dir)
    while True:
        if source in seen:
            cycle = " -> ".join([s for _, _, s in chain] + [source])
            raise ConfigError(f"profiles extend each other in a cycle: {cycle}", file=file, key="extends")
        seen.add(source)
        raw = _read_toml(resource, file)
        _check_shape(raw, file)
        chain.append((raw, file, source))
        if "extends" not in raw:
            return chain
        resource, file, source = _locate_base(raw["extends"], file)


def _locate_base(base_name: str, file: str) -> tuple[Any, str, str]:
    """`_locate` of the profile `file` extends: a base that is no shipped profile and no
    file is this file's error, at its key."""
    try:
        resource, base_file, source = _locate(base_name, Path(file).parent)
    except ConfigError as err:
        raise ConfigError(err.message, file=file, key="extends") from None
    if isinstance(resource, Path) and not resource.exists():
        raise ConfigError(f"cannot read the profile it extends, {base_file}: no such file",
                          file=file, key="extends")
    return resource, base_file, source


def _merge(base: dict[str, Any], override: dict[str, Any], section: str = "") -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        for other in _ALTERNATIVES.get((section, key), ()):
            out.pop(other, None)
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value, key if not section else f"{section}.{key}")
        else:
            out[key] = value
    return out


def _suggest(key: str, known: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def _check_shape(raw: dict[str, Any], file: str) -> None:
    """Unknown sections and keys, and sections that are not tables."""
    for key, value in raw.items():
        if key in _TOP_KEYS:
            if not isinstance(value, str):
                raise ConfigError(f"expected a string, got {_describe(value)}", file=file, key=key)
            continue
        if key not in _SECTIONS:
            close = difflib.get_close_matches(key, _SECTIONS + _TOP_KEYS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(
                f"unknown key '{key}'{hint}; known sections: {', '.join(_SECTIONS)}",
                file=file,
                key=key,
            )
        if not isinstance(value, dict):
            raise ConfigError(f"expected a table [{key}], got {_describe(value)}", file=file, key=key)
        known = _KNOWN_KEYS[key]
        for sub, sub_value in value.items():
            dotted = f"{key}.{sub}"
            if sub not in known:
                elsewhere = [s for s in _SECTIONS if sub in _KNOWN_KEYS[s]]
                hint = (
                    f"; it belongs in [{elsewhere[0]}]"
                    if elsewhere
                    else _suggest(sub, known)
                )
                raise ConfigError(f"unknown key '{sub}'{hint}", file=file, key=dotted)
            if key == "timing":
                _check_timing_shape(sub_value, file, dotted)
            # One value in two units, checked in each file as read (`extends` merges a
            # file's keys one by one, where the last unit would silently win).
            spec = _SPEC_OF.get((key, sub))
            given = [t for t in spec.toml_keys if t in value] if spec is not None else []
            if len(given) > 1:
                raise ConfigError(f"give either {' or '.join(given)}, not both", file=file,
                                  key=f"{key}.{given[0]}")


def _check_timing_shape(value: Any, file: str, dotted: str) -> None:
    if not isinstance(value, dict):
        raise ConfigError(
            "expected an inline table { latency_cycles = N, occupancy_cycles = N },"
            f" got {_describe(value)}",
            file=file,
            key=dotted,
        )
    for field in value:
        if field not in _TIMING_FIELDS:
            raise ConfigError(
                f"unknown key '{field}'{_suggest(field, _TIMING_FIELDS)}",
                file=file,
                key=f"{dotted}.{field}",
            )


# --------------------------------------------------------------------------- values


def _describe(value: Any) -> str:
    kind = {
        bool: "a boolean",
        int: "an integer",
        float: "a float",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)
    return f"{kind} ({value!r})" if not isinstance(value, (dict, list)) else kind


def _ceil_cycles(cycles: float) -> int:
    # Rounded first so that 0.69e-6 s * 2.2e9 Hz = 1518.0000000000002 stays 1518.
    return math.ceil(round(cycles, 6))


def _as_int(value: Any, file: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"expected an integer, got {_describe(value)}", file=file, key=key)
    return value


def _bounded(value: int, file: str, key: str) -> int:
    """`value`, unless it is beyond what the emulator's 64-bit counters hold."""
    if value > MAX_INT:
        raise ConfigError(f"must be at most {MAX_INT:,} (the emulator counts in 64-bit integers), got {value}",
                          file=file, key=key)
    return value


def _as_number(value: Any, file: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"expected a number, got {_describe(value)}", file=file, key=key)
    if not math.isfinite(value):
        raise ConfigError(f"must be a finite number, got {value}", file=file, key=key)
    return float(value)


def _as_list(value: Any, length: int, item: Callable, file: str, key: str) -> tuple:
    if not isinstance(value, list):
        raise ConfigError(f"expected an array of {length}, got {_describe(value)}", file=file, key=key)
    if len(value) != length:
        raise ConfigError(f"expected {length} entries, got {len(value)}", file=file, key=key)
    return tuple(item(v, file, f"{key}[{i}]") for i, v in enumerate(value))


def _as_bool(value: Any, file: str, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"expected true or false, got {_describe(value)}", file=file, key=key)
    return value


def _missing(dotted: str, file: str) -> ConfigError:
    return ConfigError("missing value", file=file, key=dotted)


def _read_key(spec: _Key, table: dict[str, Any], clock_hz: float, file: str) -> Any:
    """The converted, checked value of one schema entry."""
    given = [t for t in spec.toml_keys if t in table]
    prefix = f"{spec.section}." if spec.section else ""
    if not given:
        names = " or ".join(f"{prefix}{t}" for t in spec.toml_keys)
        raise ConfigError(f"missing value: give {names}", file=file, key=f"{prefix}{spec.toml_keys[0]}")
    toml_key = given[0]     # (one: `_check_shape` refused both units in every file read)
    dotted = f"{prefix}{toml_key}"
    value = table[toml_key]
    if spec.kind == "int":
        result: Any = _as_int(value, file, dotted)
    elif spec.kind == "float":
        result = _as_number(value, file, dotted)
    elif spec.kind == "bool":
        result = _as_bool(value, file, dotted)
    elif spec.kind == "ints":
        result = _as_list(value, spec.length, _as_int, file, dotted)
    elif spec.kind == "bools":
        result = _as_list(value, spec.length, _as_bool, file, dotted)
    elif spec.kind == "bw":
        amount = _as_number(value, file, dotted)
        problem = _positive(amount)
        if problem:
            raise ConfigError(problem, file=file, key=dotted)
        result = amount / clock_hz if toml_key.endswith("_per_s") else amount
        if not 0 < result < math.inf:
            raise ConfigError(f"{value} is {result} bytes per cycle at clock_hz {clock_hz:g}: not a positive "
                              "finite number", file=file, key=dotted)
    elif spec.kind == "time":
        if toml_key.endswith("_cycles"):
            result = _as_int(value, file, dotted)
        else:
            seconds = _as_number(value, file, dotted)
            if seconds < 0:     # (before rounding up: -1e-10 s would be 0 cycles)
                raise ConfigError(f"must not be negative, got {value}", file=file, key=dotted)
            cycles = seconds * clock_hz
            if not math.isfinite(cycles):
                raise ConfigError(f"{value} s is {cycles} cycles at clock_hz {clock_hz:g}: must be at most "
                                  f"{MAX_INT:,} (the emulator counts in 64-bit integers)", file=file, key=dotted)
            result = _ceil_cycles(cycles)
        if result < 0:
            raise ConfigError(f"must not be negative, got {value}", file=file, key=dotted)
    else:  # pragma: no cover - the schema above names only the kinds handled here
        raise AssertionError(spec.kind)
    if spec.kind in ("int", "ints", "time"):
        for v in result if spec.kind == "ints" else (result,):
            _bounded(v, file, dotted)
    if spec.check is not None:
        problem = spec.check(result)
        if problem:
            raise ConfigError(problem, file=file, key=dotted)
    return result


def _read_timing(table: dict[str, Any], file: str) -> dict[str, TimingClass]:
    timing = {}
    for name in TIMING_CLASSES:
        entry = table.get(name)
        if entry is None:
            raise _missing(f"timing.{name}", file)
        values = {}
        for field in _TIMING_FIELDS:
            dotted = f"timing.{name}.{field}"
            if field not in entry:
                raise _missing(dotted, file)
            values[field] = _bounded(_as_int(entry[field], file, dotted), file, dotted)
            if values[field] < 1:
                raise ConfigError(f"must be at least 1, got {values[field]}", file=file, key=dotted)
        timing[name] = TimingClass(**values)
    return timing


def _build(raw: dict[str, Any], file: str, source: str) -> HardwareProfile:
    for section in _SECTIONS:
        if section not in raw:
            raise ConfigError(f"missing table [{section}]", file=file, key=section)
    clock_spec = _SCHEMA[0]
    clock_hz = _read_key(clock_spec, raw[clock_spec.section], 1.0, file)
    fields: dict[str, Any] = {}
    for spec in _SCHEMA:
        fields[spec.attr] = _read_key(spec, raw[spec.section], clock_hz, file)
    problem = too_many_cores(math.prod(fields["mesh_dims"]), fields["cores_per_chip"])
    if problem:
        raise ConfigError(problem, file=file, key="mesh.dims")
    if clock_hz < 1:
        # (checked after the keys it converts to bytes or cycles, whose own errors say more):
        # a run's emulated seconds and microseconds stay finite (5e-324 Hz made them inf)
        raise ConfigError(f"must be at least 1 (Hz), got {clock_hz}", file=file, key="chip.clock_hz")
    default_name = source.removeprefix("builtin:") if source.startswith("builtin:") else Path(file).stem
    return HardwareProfile(
        name=raw.get("name", default_name),
        description=raw.get("description", ""),
        source=source,
        timing=types.MappingProxyType(_read_timing(raw["timing"], file)),
        **fields,
    )


# --------------------------------------------------------------------------- listing


def _size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"


def _rate_text(bytes_per_s: float) -> str:
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.4g} {unit}"
    return f"{bytes_per_s:.4g} B/s"


def _time_text(seconds: float) -> str:
    for unit, scale in (("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9), ("ps", 1e-12)):
        if seconds >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds:.4g} s"


def profile_to_text(p: HardwareProfile) -> str:
    """A readable listing of a profile with units, for `mkemu hw show`."""

    def bw(bytes_per_cycle: float) -> str:
        return f"{_rate_text(bytes_per_cycle * p.clock_hz)} = {bytes_per_cycle:.6g} bytes/cycle"

    def cycles(n: int) -> str:
        return f"{n} cycles ({_time_text(p.cycles_to_seconds(n))})"

    wrap = [axis for axis, w in zip("xyz", p.mesh_wrap) if w]
    rows: list[tuple[str, str] | str] = [
        "chip",
        ("clock", f"{p.clock_hz / 1e9:.4g} GHz (1 cycle = {_time_text(1 / p.clock_hz)})"),
        ("TensorCores", str(p.cores_per_chip)),
        ("HBM", _size_text(p.hbm_bytes)),
        ("HBM bandwidth", bw(p.hbm_bw_bytes_per_cycle)),
        ("sibling-core path", f"{bw(p.sibling_bw_bytes_per_cycle)}"),
        ("sibling-core latency", f"{cycles(p.sibling_latency_cycles)} (a DMA, after its start)"),
        ("sibling signal latency", cycles(p.sibling_signal_latency_cycles)),
        (
            "peak bf16 (MXU)",
            f"{p.peak_flops_per_s / 1e12:.4g} TFLOP/s = {p.mxu_flops_per_cycle_per_chip} FLOP/cycle",
        ),
        "core",
        ("VMEM", f"{_size_text(p.vmem_bytes)}, tiles of {p.vmem_tile[0]}x{p.vmem_tile[1]}"),
        ("VMEM copy bandwidth", bw(p.vmem_bw_bytes_per_cycle)),
        ("SMEM", _size_text(p.smem_bytes)),
        ("registers", f"{p.sregs} scalar, {p.vregs} vector, {p.mregs} mask"),
        ("semaphores", str(p.semaphores)),
        (
            "MXUs",
            f"{p.mxus_per_core} x {p.mxu_dim}x{p.mxu_dim}, {p.mxu_accumulators} accumulators each",
        ),
        "dma",
        ("engine bandwidth", f"{bw(p.dma_engine_bw_bytes_per_cycle)} per core"),
        ("descriptors in flight", f"{p.dma_max_in_flight} per engine (more wait in a queue)"),
        ("start latency", cycles(p.dma_start_latency_cycles)),
        "ici",
        ("link bandwidth", f"{bw(p.link_bw_bytes_per_cycle)} per link per direction"),
        ("links per neighbour", f"{p.links_per_neighbor} per direction, pooled"),
        ("per-core links", "yes: each core's traffic into a direction at most one link's bandwidth"
         if p.per_core_links else "no: the cores of a chip share the pooled links"),
        ("hop latency", cycles(p.hop_latency_cycles)),
        "mesh",
        ("default shape", "x".join(map(str, p.mesh_dims))),
        ("wraps", ", ".join(wrap) if wrap else "none"),
        "launch",
        ("kernel launch", cycles(p.kernel_launch_cycles)),
    ]
    lines = [f"profile {p.name}  ({p.source})"]
    if p.description:
        lines.append(f"  {p.description}")
    for row in rows:
        if isinstance(row, str):
            lines.append(row)
        else:
            lines.append(f"  {row[0]:<24}{row[1]}")
    lines.append(f"timing {'':<18}{'latency':>9}{'occupancy':>11}  (cycles)")
    for name, t in p.timing.items():
        lines.append(f"  {name:<24}{t.latency_cycles:>9}{t.occupancy_cycles:>11}")
    return "\n".join(lines)
