"""What the run-time checks cost: the main job with every check on (the default), side by
side with `--no-check races` and with `--no-check races --no-check semaphores`.

    python bench/check_overhead.py [--reps N] [--json OUT] [-- extra run options]

Each variant runs `mkemu run k3_megakernel --json` in a fresh process, the variants
interleaved (on, races off, both off, then the reverse, ...) so machine load hits them
alike; the
figure is the median over the repetitions of the report's `wall_s` (the emulation, not
the interpreter start-up) and of the process's whole wall time. Emulated cycles must be
identical in every variant: a check never charges a cycle. Prints a markdown table and
writes JSON (default bench/out/check_overhead.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from benchlib import OUT_DIR, table, write_json

VARIANTS = {
    "all checks (default)": [],
    "--no-check races": ["--no-check", "races"],
    "--no-check races, semaphores": ["--no-check", "races", "--no-check", "semaphores"],
}


def run_once(extra: list[str]) -> tuple[dict, float]:
    cmd = [sys.executable, "-m", "mkemu.cli", "run", "k3_megakernel", "--json", *extra]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=str(OUT_DIR / "check_overhead.json"))
    ap.add_argument("extra", nargs="*", help="more `mkemu run` options for every variant (after --)")
    args = ap.parse_args()

    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
    cycles: dict[str, set] = {name: set() for name in VARIANTS}
    for rep in range(args.reps):
        # Every other repetition runs the variants in reverse, so a drift in the machine's
        # load over the run does not favour the ones that happen to run later.
        order = list(VARIANTS) if rep % 2 == 0 else list(reversed(VARIANTS))
        for name in order:
            report, wall = run_once([*VARIANTS[name], *args.extra])
            samples[name].append((report["wall_s"], wall))
            cycles[name].add(tuple(report["cycles_per_step"]))
    if len({c for s in cycles.values() for c in s}) != 1:
        raise SystemExit(f"emulated cycles differ between variants: {cycles}")

    base = statistics.median(s[0] for s in samples["--no-check races, semaphores"])
    rows, out = [], {"reps": args.reps, "extra": args.extra, "variants": {}}
    for name in VARIANTS:
        emu = statistics.median(s[0] for s in samples[name])
        whole = statistics.median(s[1] for s in samples[name])
        rows.append([name, f"{emu:.2f}", f"{whole:.2f}", f"{emu / base:.3f}x"])
        out["variants"][name] = {"emulation_s": emu, "process_s": whole, "vs_no_checks": emu / base,
                                 "samples": samples[name]}
    on = out["variants"]["all checks (default)"]["emulation_s"]
    off = out["variants"]["--no-check races"]["emulation_s"]
    out["race_check_overhead"] = on / off - 1
    print(table(f"Run-time checks on the main job (median of {args.reps}, interleaved)",
                ["variant", "emulation s (report wall_s)", "process s", "vs no checks"], rows))
    print(f"\nrace checking costs {100 * out['race_check_overhead']:+.1f}% of the emulation wall time")
    print(f"JSON -> {write_json(args.json, out)}")


if __name__ == "__main__":
    main()
