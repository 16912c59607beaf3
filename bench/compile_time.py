"""How long a `.mk` program takes to compile in a new process, by what the user cache holds:

- "nothing kept": an empty cache, as at a first run: every file parsed, the program compiled;
- "trees kept": the files' syntax trees kept but not the program, as at a run with new
  parameters or another model, another process of a sweep, or a test compiling another
  program of the same library;
- "program kept": the compiled program kept, as at a repeat run.

    python bench/compile_time.py [--reps N] [--json OUT]

Each figure is one fresh process timing `api.build_program` (its imports done before the
clock starts), the variants interleaved in each repetition; medians over the
repetitions. Each "empty" cache is a copy of the user's cache without its programs,
parsed files and arrays: what a compile needs besides them (the parser's LALR tables, the
numerics compiled by numba) any first run keeps. Prints a markdown table and writes JSON (default
bench/out/compile_time.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import OUT_DIR, cache_copy, finish, table

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ("programs/k3_megakernel.mk", "programs/k3_per_op.mk", "programs/k3_superop.mk",
            "programs/examples/all_reduce.mk", "programs/examples/matmul_double_buffered.mk")
VARIANTS = ("nothing kept", "trees kept", "program kept")

CHILD = """
import json, sys, time
from pathlib import Path
from mkemu.api import build_program
from mkemu.dsl import compiler, frontend   # (imported before the clock starts)
from mkemu.isa.hardware import load_profile
path = sys.argv[1]
text, profile = Path(path).read_text(), load_profile()
t0 = time.perf_counter()
build_program(path, text, profile, {})
print(json.dumps({"compile_s": time.perf_counter() - t0}))
"""


def compile_once(program: str, cache_home: Path) -> float:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    done = subprocess.run([sys.executable, "-c", CHILD, program], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"compiling {program} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["compile_s"]


def one_repetition(program: str, tmp: Path) -> dict[str, float]:
    # (what a compile needs besides them, the parser's tables and numba's numerics, kept)
    home = cache_copy(tmp, ("programs", "parsed", "arrays"))
    first = compile_once(program, home)                     # parses and compiles; keeps both
    shutil.rmtree(home / "mkemu" / "programs")
    parsed = compile_once(program, home)                    # parses nothing; compiles
    kept = compile_once(program, home)                      # loads the program
    shutil.rmtree(home)
    return dict(zip(VARIANTS, (first, parsed, kept)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=str(OUT_DIR / "compile_time.json"))
    args = ap.parse_args()
    wall0 = time.perf_counter()
    samples = {p: {v: [] for v in VARIANTS} for p in PROGRAMS}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for k, program in enumerate(PROGRAMS):
                for variant, seconds in one_repetition(program, Path(tmp) / f"{rep}-{k}").items():
                    samples[program][variant].append(seconds)
    rows, records = [], {}
    for program in PROGRAMS:
        med = {v: statistics.median(samples[program][v]) for v in VARIANTS}
        records[program] = {"median_s": med, "samples_s": samples[program]}
        rows.append([program, *(f"{med[v]:.3f}" for v in VARIANTS),
                     f"{med['nothing kept'] / med['trees kept']:.1f}x"])
    text = table(f"compile time in a new process, s (medians of {args.reps})",
                 ["program", *VARIANTS, "nothing / trees kept"], rows)
    print(text)
    finish({"compile_time": records}, args.json, time.perf_counter() - wall0)


if __name__ == "__main__":
    main()
