"""The main job's trace exports, timed, and the timeline page checked in a real browser.

    python bench/trace_exports.py [--trace main.mkt] [--out bench/out/exports]

Records the main job's trace (`mkemu run programs/k3_megakernel.mk --trace`) unless
`--trace` names one, then runs `mkemu trace` with `--perfetto`, `--plot` and
`--html` as subprocesses and prints each one's wall time and output size (the
figures of docs/benchmarks.md). Then it opens the page in headless Chromium
(Debian's `chromium` package: `apt-get install -y chromium`) at 1600x1000 and
saves three screenshots: the whole run, one step zoomed in (the page's `#t=A-B`
address), and a page of the last chip alone over one step (`--chip`, `--from`,
`--to`); look at them: each chip group fits the screen,
the time axis is at the top, every core has a stall row, layer and operator labels
show once zoomed, and the legend names every unit. Without chromium it says so and
skips the screenshots.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{' '.join(argv)} failed:\n{done.stderr}")
    return time.perf_counter() - t0


def screenshot(browser: str, page: Path, png: Path, fragment: str = "") -> None:
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={png}",
                    "--window-size=1600,1000", page.resolve().as_uri() + fragment],
                   capture_output=True, check=True, timeout=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", help="an existing trace of the main job (default: record one)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "exports"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    mkemu = [sys.executable, "-m", "mkemu.cli"]
    trace = Path(args.trace) if args.trace else out / "main.mkt"
    if not args.trace:
        wall = timed([*mkemu, "run", str(ROOT / "programs" / "k3_megakernel.mk"), "--trace", str(trace)])
        print(f"record: mkemu run programs/k3_megakernel.mk --trace: {wall:.1f} s wall, "
              f"{trace.stat().st_size / 1e6:.2f} MB")
    print("| export | wall s | size MB |\n|---|---|---|")
    for flag, name in (("--perfetto", "main.pftrace"), ("--plot", "main.png"), ("--html", "main.html")):
        wall = timed([*mkemu, "trace", str(trace), flag, str(out / name)])
        print(f"| `mkemu trace main.mkt {flag} {name}` | {wall:.1f} | {(out / name).stat().st_size / 1e6:.1f} |")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("no chromium: apt-get install -y chromium, then run again for the screenshots")
        return
    from mkemu.tools.trace_reader import read_trace

    t = read_trace(str(trace))
    step = t.launches[1] if len(t.launches) > 1 else t.launches[0]
    last = out / "last_chip_one_step.html"
    timed([*mkemu, "trace", str(trace), "--html", str(last), "--chip", str(t.num_chips - 1),
           "--from", str(step["start"]), "--to", str(step["end"])])
    shots = [("whole.png", out / "main.html", ""),
             ("one_step.png", out / "main.html", f"#t={step['start']}-{step['end']}"),
             ("last_chip_one_step.png", last, "")]
    for png, page, fragment in shots:
        screenshot(browser, page, out / png, fragment)
        print(f"screenshot {out / png}")


if __name__ == "__main__":
    main()
