"""How long the whole test suite takes: the README's `python -m pytest` (with CI set, as
.ci/run runs it: hypothesis's derandomized profile), in this tree.

    python bench/suite_time.py [--reps N] [--variants warm,programs-cold] [--json OUT] [-- pytest args]

Two variants, interleaved, medians over the repetitions:

- "warm": the user cache as it is (compiled programs, numba's compiled modules, the
  generated K3 weights), as on a machine that ran the suite before;
- "programs-cold": a fresh `XDG_CACHE_HOME` holding a copy of that cache without its
  compiled programs and parsed `.mk` files, so every `.mk` program is parsed and
  compiled again, as in a first run on a
  machine whose numba code is compiled already (numba's first compile of the issue loop,
  about a minute, would come on top: `bench/core_speed.py` times it).

Prints a markdown table (the wall time, pytest's own figure, and the CPU time of all
the suite's processes from `getrusage`) and writes JSON (default
bench/out/suite_time.json). Issue 11's target: 195 s on a 2-core machine, half of the
about 390 s the suite took when the issue was filed.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import OUT_DIR, cache_copy, table, write_json


ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("warm", "programs-cold")


def run_suite(extra: list[str], cache_home: str | None) -> dict:
    env = dict(os.environ, CI="true")
    if cache_home is not None:
        env["XDG_CACHE_HOME"] = cache_home
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", *extra], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode != 0:
        # (which tests: the short summary's lines, as `-ra` in pyproject.toml prints them)
        which = [line for line in done.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
        raise SystemExit(f"the suite failed ({done.returncode}): {last}\n" + "\n".join(which[:20])
                         + f"\n{done.stderr[-2000:]}")
    passed = re.search(r"(\d+) passed", last)
    reported = re.search(r" in ([\d.]+)s", last)
    return {"wall_s": wall, "pytest_s": float(reported.group(1)) if reported else None,
            "passed": int(passed.group(1)) if passed else None,
            "user_s": after.ru_utime - before.ru_utime, "sys_s": after.ru_stime - before.ru_stime}





def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--json", default=str(OUT_DIR / "suite_time.json"))
    ap.add_argument("extra", nargs="*", help="more pytest arguments for every run (after --)")
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variant(s) {', '.join(unknown)}: the variants are {', '.join(VARIANTS)}")

    samples: dict[str, list[dict]] = {name: [] for name in variants}
    for rep in range(args.reps):
        # Every other repetition runs the variants in reverse (the machine's load drifts).
        for name in variants if rep % 2 == 0 else list(reversed(variants)):
            with tempfile.TemporaryDirectory(prefix="mkemu-suite-") as tmp:
                home = str(cache_copy(Path(tmp), ("programs", "parsed"))) if name == "programs-cold" else None
                samples[name].append(run_suite(args.extra, home))
            print(f"repetition {rep + 1}/{args.reps}: {name} {samples[name][-1]['wall_s']:.1f} s", flush=True)

    rows, out = [], {"reps": args.reps, "extra": args.extra, "cpus": os.cpu_count(), "variants": {}}
    for name in variants:
        medians = {key: statistics.median(s[key] for s in samples[name])
                   for key in ("wall_s", "pytest_s", "user_s", "sys_s") if samples[name][0][key] is not None}
        rows.append([name, f"{medians['wall_s']:.1f}", f"{medians.get('pytest_s', float('nan')):.1f}",
                     f"{medians['user_s']:.0f}", f"{medians['sys_s']:.0f}", str(samples[name][0]["passed"])])
        out["variants"][name] = {**medians, "samples": samples[name]}
    print(table(f"The test suite, `python -m pytest` (median of {args.reps}, {os.cpu_count()} CPUs)",
                ["variant", "wall s", "pytest s", "user CPU s", "system CPU s", "passed"], rows))
    print(f"JSON -> {write_json(args.json, out)}")


if __name__ == "__main__":
    main()
