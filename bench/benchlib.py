"""Shared helpers of the benchmark scripts: assemble generated `.s` text, run it, time it.

The ISA has no cycle-counter register, so every figure is a difference of two runs:
the program with the measured work minus the same program without it (a
"baseline": kernel launch, setup and halt). Both runs are deterministic, so the
difference is exact in emulated cycles.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from mkemu.emulator.config import RunConfig
from mkemu.emulator.machine import Machine
from mkemu.emulator.topology import Mesh
from mkemu.isa.asm import assemble
from mkemu.isa.hardware import load_profile

PROFILE_NAME = "tpu-v7-like"
BENCH_DIR = Path(__file__).resolve().parent
OUT_DIR = BENCH_DIR / "out"

_PROFILES: dict = {}


def profile(name: str = PROFILE_NAME):
    if name not in _PROFILES:
        _PROFILES[name] = load_profile(name)
    return _PROFILES[name]


def run_asm(text: str, dims=(1, 1, 1), wrap=(False, False, False), inputs=None,
            prof=None, config: RunConfig | None = None):
    """Assemble and run `text`; return (RunResult, machine, wall seconds of run())."""
    prof = prof or profile()
    program = assemble(text, filename="<bench>")
    machine = Machine(prof, Mesh(tuple(dims), tuple(wrap), prof.links_per_neighbor), config or RunConfig())
    machine.load(program)
    for (chip, name), array in (inputs or {}).items():
        machine.write_buffer(chip, name, array)
    t0 = time.perf_counter()
    result = machine.run()
    wall = time.perf_counter() - t0
    return result, machine, wall


def ns(prof, cycles: float) -> float:
    return cycles / prof.clock_hz * 1e9


def gbps(prof, nbytes: float, cycles: float) -> float:
    """Decimal GB/s for `nbytes` moved in `cycles`."""
    return nbytes / (cycles / prof.clock_hz) / 1e9


def smem_table(offset: int, words) -> str:
    """`.smem` lines for a list of 32-bit words at byte `offset` (at most 16 words a line)."""
    words = list(words)
    lines = []
    for i in range(0, len(words), 16):
        chunk = " ".join(str(int(w)) for w in words[i:i + 16])
        lines.append(f"    .smem {offset + 4 * i} {chunk}")
    return "\n".join(lines)


def table(title: str, headers: list[str], rows: list[list]) -> str:
    """A GitHub-markdown table (also readable on a terminal)."""
    def fmt(v):
        if isinstance(v, float):
            if v == 0:
                return "0"
            if abs(v) >= 1000:
                return f"{v:,.0f}"
            if abs(v) >= 100:
                return f"{v:.1f}"
            if abs(v) >= 1:
                return f"{v:.2f}"
            return f"{v:.3g}"
        return str(v)
    cells = [[fmt(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    out = [f"### {title}", ""]
    out.append("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |")
    out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells:
        out.append("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
    return "\n".join(out) + "\n"


def ratio_verdict(value: float, target: float, tol: float) -> tuple[float, str]:
    r = value / target
    return r, ("ok" if abs(r - 1) <= tol else "MISS")


def write_json(path: str | os.PathLike, data: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=float) + "\n")
    return path


def finish(out: dict, json_path: str | os.PathLike, wall_s: float) -> None:
    """Drop the printed tables from the sections, add the wall time, write the JSON."""
    for section in out.values():
        if isinstance(section, dict):
            section.pop("text", None)
    out["wall_s"] = wall_s
    path = write_json(json_path, out)
    print(f"wrote {path} ({wall_s:.1f} s)")


def cache_copy(into: Path, leave_out: tuple[str, ...]) -> Path:
    """A copy of the user's mkemu cache at `into/mkemu` without its folders `leave_out`
    (e.g. "programs", "parsed"), for a workload's XDG_CACHE_HOME: `into`."""
    from mkemu.cache import cache_dir

    source = cache_dir()
    shutil.copytree(source, into / "mkemu",
                    ignore=lambda folder, names: list(leave_out) if Path(folder) == source else [])
    return into
