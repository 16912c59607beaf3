"""`mkemu sweep`: run programs over variants of the hardware and the mesh.

Each `--hw-set KEY=V1,V2,...` is an axis over one profile value (any key of a profile
TOML: `chip.hbm_bw_bytes_per_s`, `ici.link_bw_bytes_per_s`, `ici.hop_latency_s`,
`core.vmem_bytes`, `core.mxus_per_core`, `chip.clock_hz`, ..., and a timing class's
`timing.valu.latency_cycles` or `timing.valu.occupancy_cycles`; the section may be
left out), `--mesh M1,M2,...` an axis over mesh shapes; the points are every
combination. A point's profile is a TOML that `extends` the base profile (`--hw`)
with the point's values, so it goes through the same loader and checks as any user
profile; every point's profile is checked before the first run. Every program runs at
every point (`mkemu.trials`); the record says per point and program the time per
step, what the design is bound by (`mkemu.trials.breakdown`), the fraction of the
floor for K3 programs, and the report; the plot (matplotlib) draws time per step
against the first axis, one line per program (and per value of the other axes).
"""

from __future__ import annotations

import itertools
import json
import math
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

import attrs

from mkemu.errors import ConfigError
from mkemu.options import Options
from mkemu.runner import atomic_write, finite
from mkemu.trials import Trial, breakdown, objective_of, run_trials

FORMAT = "mkemu-sweep/1"


@attrs.frozen
class Axis:
    key: str                      # `section.key`, or "mesh"
    values: tuple                 # TOML values, or mesh texts
    texts: tuple = ()             # the values as given (`64_000`, `1e9`, `2x1`), for messages; () for `_show`n values


def parse_axis(item: str) -> Axis:
    """`KEY=V1,V2,...` of `--hw-set`: values are TOML values (`7.38e12`, `64_000`, `[4, 2, 2]`)."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip() or not text.strip():
        raise ConfigError(f"--hw-set wants KEY=V1,V2,..., got {item!r}", key="--hw-set")
    from mkemu.isa.hardware import toml_key

    key = key.strip()
    try:
        key = toml_key(key)
    except ConfigError as exc:
        raise ConfigError(exc.message, key=f"--hw-set {key}") from None
    values, texts = [], []
    for part in _split_top(text):
        try:
            value = tomllib.loads(f"v = {part}")["v"]
            if not _plain(value):   # (a date or a table: no profile value is one, nor can a variant write it)
                raise tomllib.TOMLDecodeError
        except tomllib.TOMLDecodeError:
            raise ConfigError(f"{part!r} is not a value a profile takes (a number, true/false or [..])",
                              key=f"--hw-set {key}") from None
        if isinstance(value, float) and not math.isfinite(value):
            # (named as typed: 1e400 reads as inf, and "=inf" was what the error showed)
            raise ConfigError(f"{part} is not a finite number (every profile value must be one)",
                              key=f"--hw-set {key}")
        values.append(value)
        texts.append(part)
    return Axis(key, tuple(values), tuple(texts))


def _short(key: str) -> str:
    """A varied value's name for a reader: the key without its section (`clock_hz`,
    `scalar.latency_cycles`)."""
    return key.partition(".")[2]


def _plain(value) -> bool:
    """A number, a boolean, a string or an array of them: what `_toml_value` writes back."""
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return isinstance(value, int | float | str)


def _split_top(text: str) -> list[str]:
    """Split at the commas outside brackets: `[2, 2, 2],[4, 2, 2]` is two values."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def mesh_axis(text: str) -> Axis:
    from mkemu.emulator.topology import Mesh, parse_mesh

    meshes = tuple(m.strip() for m in text.split(","))
    for m in meshes:
        try:
            Mesh(parse_mesh(m))     # (the chip limit too: every point is checked before the first runs)
        except ConfigError as exc:
            raise ConfigError(exc.message, key="--mesh") from None
    return Axis("mesh", meshes, meshes)


def _normal(key: str, value):
    """What a point is given, whatever its spelling: a mesh as its (X, Y, Z) (`2x1` is
    `2x1x1`), a profile value as the number it is (`64_000` is `64000`, `1e9` is
    `1_000_000_000`), where `true` is not `1`."""
    if key == "mesh":
        from mkemu.emulator.topology import parse_mesh

        return parse_mesh(value)
    if isinstance(value, list):
        return tuple(_normal(key, v) for v in value)
    return (bool, value) if isinstance(value, bool) else value


def check_axes(axes: list[Axis]) -> None:
    """Each point is given once: a value not twice in one axis, in any spellings (`2x1`
    and `2x1x1`, `1e9` and `1_000_000_000`); and each profile value is varied once: not
    twice under one key, nor under both of its units (`hbm_bw_bytes_per_s` and
    `hbm_bw_bytes_per_cycle` are one value)."""
    from mkemu.isa.hardware import _ALTERNATIVES

    seen: set[str] = set()
    for axis in axes:
        normal = [_normal(axis.key, value) for value in axis.values]
        for i, value in enumerate(normal):
            if value in normal[:i]:
                flag = "--mesh" if axis.key == "mesh" else f"--hw-set {axis.key}"
                first = normal.index(value)
                spelt = axis.texts
                if spelt and spelt[first] != spelt[i]:
                    what = "mesh" if axis.key == "mesh" else "value"
                    said = f"{spelt[first]} and {spelt[i]} are one {what}, given twice"
                else:
                    said = f"{spelt[i] if spelt else _show(axis.values[i])} is given twice"
                raise ConfigError(f"{said}: each value is one point of the sweep", key=flag)
        if axis.key in seen:
            raise ConfigError(f"{axis.key} is varied twice; give its values once: --hw-set {axis.key}=V1,V2,...",
                              key="--hw-set")
        section, _, name = axis.key.partition(".")
        for other in _ALTERNATIVES.get((section, name), ()):
            if f"{section}.{other}" in seen:
                raise ConfigError(f"{section}.{other} and {axis.key} are one profile value in two units; vary it "
                                  "once, in either unit", key="--hw-set")
        seen.add(axis.key)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, str):
        return _toml_string(value)
    return repr(value)


def _toml_string(text: str) -> str:
    """`text` as a TOML basic string. Not `json.dumps`: it writes a character beyond
    U+FFFF (an emoji in a folder's name) as a surrogate pair, which TOML refuses;
    here only the quote, the backslash and control characters are escaped."""
    def escape(ch: str) -> str:
        if ch in '"\\':
            return "\\" + ch
        return f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch
    return '"' + "".join(escape(ch) for ch in text) + '"'


def _show(value) -> str:
    """A value for a reader: floats in short form (`7.38e+12`, `5e-07`)."""
    return f"{value:g}" if isinstance(value, float) else _toml_value(value)


def variant_toml(base: str, values: dict[str, object]) -> str:
    """A profile that extends `base` (a shipped name or an absolute path) with `values`."""
    try:
        base.encode("utf-8")
    except UnicodeEncodeError:   # (a name of bytes that are not UTF-8: no TOML text can hold it)
        raise ConfigError("a sweep point's profile (TOML text) extends the base profile by its path, and this "
                          "path is not UTF-8 text; copy the profile to a file with a UTF-8 name", file=base,
                          key="--hw") from None
    name = " ".join(f"{_short(k)}={_show(v)}" for k, v in values.items())
    lines = [f"extends = {_toml_string(base)}", f"name = {_toml_string(f'{Path(base).stem} {name}')}"]
    sections: dict[str, list[str]] = {}
    for key, value in values.items():
        section, _, sub = key.partition(".")
        sections.setdefault(section, []).append(f"{sub} = {_toml_value(value)}")
    for section, entries in sections.items():
        lines += [f"[{section}]", *entries]
    return "\n".join(lines) + "\n"


def check_variant(text: str, where: str) -> None:
    """Load a variant profile once here, so a bad value stops the sweep before any run."""
    from mkemu.isa.hardware import load_profile

    with tempfile.TemporaryDirectory(prefix="mkemu-hw-") as tmp:
        path = Path(tmp) / "variant.toml"
        path.write_text(text)
        try:
            load_profile(path)
        except ConfigError as exc:
            # The key is in `where` already when it is one of the point's own values.
            named = exc.key and exc.key.split(".")[-1] not in where
            raise ConfigError(f"{exc.key + ': ' if named else ''}{exc.message}", key=where) from None


@attrs.define
class Sweep:
    programs: list[Trial]                  # one per program: its run with the base options
    axes: list[Axis]
    out: str | None = None
    jobs: int = 1
    scheduler: str | None = None
    points: list[dict] = attrs.Factory(list)
    progress: Callable[[dict, dict], None] | None = None
    started: float = attrs.Factory(time.perf_counter)

    def plan(self) -> list[tuple[dict, dict, Trial]]:
        """Every (point, program): the point's record, the program's entry in it, the run
        options and the profile text."""
        hw_axes = [a for a in self.axes if a.key != "mesh"]
        mesh_axes = [a for a in self.axes if a.key == "mesh"]
        base_hw = self.programs[0].options.hw
        runs = []
        for combo in itertools.product(*(a.values for a in self.axes)):
            chosen = dict(zip((a.key for a in self.axes), combo))
            hw_values = {a.key: chosen[a.key] for a in hw_axes}
            toml = variant_toml(base_hw, hw_values) if hw_values else None
            if toml is not None:
                check_variant(toml, "--hw-set " + " ".join(f"{k}={_show(v)}" for k, v in hw_values.items()))
            point = {"hw_set": hw_values, "mesh": chosen["mesh"] if mesh_axes else None, "results": []}
            self.points.append(point)
            for base in self.programs:
                options = Options.of(base.options, mesh=chosen["mesh"]) if mesh_axes else base.options
                point["results"].append({"program": base.file})
                runs.append((point, point["results"][-1], attrs.evolve(base, options=options, hw_toml=toml)))
        return runs

    def run(self) -> None:
        runs = self.plan()
        trials = [trial for _, _, trial in runs]

        def done(index: int, result: dict) -> None:
            point, entry = runs[index][:2]
            report = result["report"]
            entry.update(status=result["status"], reason=result["reason"], wall_s=result["wall_s"])
            if report is not None:
                parts = breakdown(report)
                entry.update(us_per_step=objective_of(report, "us_per_step"), bound_by=parts["bound_by"],
                             breakdown=parts, fraction_of_floor=report.get("fraction_of_floor"), report=report)
            self.save()
            if self.progress:
                self.progress(point, entry)

        run_trials(trials, done, jobs=self.jobs, scheduler=self.scheduler)
        self.save()

    def document(self) -> dict:
        return {"format": FORMAT, "programs": [p.file for p in self.programs], "hw": self.programs[0].options.hw,
                "axes": {a.key: list(a.values) for a in self.axes}, "points": self.points,
                "wall_s": round(time.perf_counter() - self.started, 3)}

    def save(self) -> None:
        if self.out:
            atomic_write(self.out, (json.dumps(finite(self.document()), indent=1) + "\n").encode())


def point_label(point: dict) -> str:
    parts = [f"{_short(k)}={_show(v)}" for k, v in point["hw_set"].items()]
    if point["mesh"]:
        parts.append(f"mesh={point['mesh']}")
    return " ".join(parts)


def program_names(files) -> list[str]:
    """Each program's name for a reader: its file's name, or as many of the last parts of
    its path as tell it from the other programs of that name (`base/k.mk`, `tuned/k.mk`)."""
    parts = [Path(f).parts for f in files]
    names = []
    for mine in parts:
        n = 1
        while n < len(mine) and sum(other[-n:] == mine[-n:] for other in parts) > 1:
            n += 1
        names.append(str(Path(*mine[-n:])))
    return names


def render(sweep: Sweep) -> str:
    names = program_names(p.file for p in sweep.programs)
    labels = [point_label(p) for p in sweep.points]
    width = max(len(x) for x in labels + ["point"])
    cell = 34
    lines = [f"{'point':<{width}}  " + "  ".join(f"{n:<{cell}}" for n in names)]
    for point, text in zip(sweep.points, labels):
        cells = []
        for r in point["results"]:
            if r.get("status") == "ok":
                floor = f", {100 * r['fraction_of_floor']:.0f}% of floor" if r.get("fraction_of_floor") else ""
                share = 100 * r["breakdown"]["parts"][r["bound_by"]] / r["us_per_step"] if r["us_per_step"] else 0
                cells.append(f"{r['us_per_step']:9.3f} us  {r['bound_by']} {share:.0f}%{floor}")
            else:
                cells.append(f"rejected: {r.get('reason')}")
        lines.append(f"{text:<{width}}  " + "  ".join(f"{c:<{cell}}" for c in cells))
    return "\n".join(lines)


def plot(sweep: Sweep, path: str) -> None:
    """us per step against the first axis, one line per program and values of the other axes."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--plot needs matplotlib, which is not installed: pip install 'mkemu[plot]' "
                          "(the JSON record has every figure)", key="--plot") from None
    matplotlib.use("Agg")
    import io

    import matplotlib.pyplot as plt

    from mkemu.tools.plot import literal

    first, others = sweep.axes[0], sweep.axes[1:]
    numeric = first.key != "mesh" and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                          for v in first.values)

    def x_of(point):
        value = point["mesh"] if first.key == "mesh" else point["hw_set"][first.key]
        return value if numeric else first.values.index(value)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = program_names(p.file for p in sweep.programs)
    lines: dict[tuple, list] = {}
    for point in sweep.points:
        rest = tuple(point["mesh"] if a.key == "mesh" else _show(point["hw_set"][a.key]) for a in others)
        for name, r in zip(names, point["results"]):
            if r.get("status") == "ok":
                lines.setdefault((name, rest), []).append((x_of(point), r["us_per_step"], r["bound_by"]))
    for (name, rest), pts in lines.items():
        pts.sort()
        text = name + "".join(f", {_short(a.key) if a.key != 'mesh' else 'mesh'}={v}" for a, v in zip(others, rest))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=literal(text))   # (a file's name)
        for x, y, bound in pts:
            ax.annotate(bound, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if numeric and min(first.values) > 0 and max(first.values) / min(first.values) >= 10:
        ax.set_xscale("log")
    if not numeric:
        ax.set_xticks(range(len(first.values)), [_show(v) if first.key != "mesh" else v for v in first.values])
    ys = [p[1] for pts in lines.values() for p in pts]
    if ys and min(ys) > 0 and max(ys) / min(ys) >= 10:
        ax.set_yscale("log")
    ax.set_xlabel(first.key)
    ax.set_ylabel("us per step (emulated)")
    ax.set_title("time per step and what bounds it")
    ax.grid(True, which="both", alpha=0.3)
    if lines:
        ax.legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    atomic_write(path, buffer.getvalue())
