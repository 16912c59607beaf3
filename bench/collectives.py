"""The collectives library's timings (docs/collectives.md "Timings"), re-measured.

    python bench/collectives.py [--json OUT] [--quick]

Emulated time of whole kernels (launch, the copies from and to HBM and the
collective), on tpu-v7-like, every output checked bit for bit against its reference:

- the three shipped examples (`programs/examples/all_*.mk`) on 1 chip and meshes
  4x1x1, 2x2x1, 2x2x2, 4x2x2;
- an all-reduce of 1 MiB per core on 2x2x2 by block size and receive slots
  (`CL_SLOTS`);
- one X ring of 4 chips (`all_reduce_level`, 1 MiB per core, 64 KiB blocks), one or
  both directions, on a line and on a torus (a profile copy whose X axis wraps);
- the all-gather's semaphore turns (`CL_AG_SEMS`) on a line of 8 chips, where the
  ring's wrap-around crosses every link.

Prints markdown tables and writes JSON (default bench/out/collectives.json).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import mkemu
from benchlib import OUT_DIR, finish, table

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "programs" / "examples"
MESHES = ("1", "4x1x1", "2x2x1", "2x2x2", "4x2x2")

# An all-reduce over every level, or over one level only, with every size a param.
ALL_REDUCE = """
import "{library}";
param CORES = 2;
param ROWS = 128;
param COLS = 256;
param BLOCK = 8;
param DIRS = 2;
param LEVEL = -1;        // -1: all_reduce over every level; else all_reduce_level
kernel ar(x: hbm f32[CORES, ROWS, COLS], out: hbm f32[CORES, ROWS, COLS]) {{
    vmem buf: f32[ROWS, COLS];
    sem s;
    start copy(x[core_id()], buf, s);
    wait copy(x[core_id()], buf, s);
    if LEVEL < 0 {{
        all_reduce(buf, ROWS, COLS, BLOCK, DIRS, ROWS / BLOCK);
    }} else {{
        all_reduce_level(buf, ROWS, COLS, BLOCK, DIRS, max(LEVEL, 0), ROWS / BLOCK);
    }}
    start copy(buf, out[core_id()], s);
    wait copy(buf, out[core_id()], s);
}}
host {{
    input x: f32[CORES, ROWS, COLS];
    output out: f32[CORES, ROWS, COLS];
    launch ar(x, out);
}}
"""

TORUS_X = 'extends = "tpu-v7-like"\nname = "tpu-v7-like-torus-x"\n[mesh]\nwrap = [true, false, false]\n'


def us(kernel) -> float:
    """Emulated microseconds of one run, after checking its outputs."""
    run = kernel()
    if run.check() is not None:
        raise SystemExit(f"{kernel.program}: outputs differ from the reference")
    return run.report.seconds * 1e6


def reduce_us(kernel, rows: int, chips: int, cores: int, over_cores: bool) -> float:
    """Run the generated all-reduce and check that every core holds numpy's sum to f32
    rounding (the rings add in another order): over every core of every chip, or, for an
    X ring alone on an Xx1x1 mesh, over the chips for each core."""
    rng = np.random.default_rng(0)
    inputs = {f"x@{c}": rng.standard_normal((cores, rows, 256)).astype(np.float32) for c in range(chips)}
    run = kernel(inputs)
    per_core = sum(a.astype(np.float64) for a in inputs.values())
    for chip in range(chips):
        out = run.output("out", chip)
        for core in range(cores):
            expected = per_core.sum(axis=0) if over_cores else per_core[core]
            np.testing.assert_allclose(out[core], expected, rtol=1e-4, atol=1e-3)
    return run.report.seconds * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=str(OUT_DIR / "collectives.json"))
    parser.add_argument("--quick", action="store_true", help="the examples' table only")
    args = parser.parse_args(argv)
    wall0 = time.perf_counter()
    out: dict = {}

    rows = []
    for name in ("all_reduce", "all_gather", "all_to_all"):
        row = [f"{name}.mk"]
        for mesh in MESHES:
            row.append(us(mkemu.compile(str(EXAMPLES / f"{name}.mk"), mesh=mesh)))
        rows.append(row)
    out["examples"] = {"meshes": list(MESHES), "us": {r[0]: r[1:] for r in rows}}
    print(table("Examples: whole kernel, µs", ["example", *MESHES], rows))
    if args.quick:
        finish(out, args.json, time.perf_counter() - wall0)
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        src = ALL_REDUCE.format(library=ROOT / "programs" / "lib" / "collectives.mk")
        path = str(Path(tmp) / "all_reduce_sizes.mk")
        torus = Path(tmp) / "torus_x.toml"
        torus.write_text(TORUS_X)

        def kernel(mesh, hw="tpu-v7-like", **params):
            return mkemu.compile_source(src, path, hw=hw, mesh=mesh, params=params)

        rows = []
        for block in (8, 64, 256):
            rows.append([f"{block * 256 * 4 // 1024} KiB"] +
                        [reduce_us(kernel("2x2x2", ROWS=1024, BLOCK=block, CL_SLOTS=slots), 1024, 8, 2, True)
                         for slots in (2, 4)])
        out["block_sizes"] = {r[0]: r[1:] for r in rows}
        print(table("All-reduce of 1 MiB per core, 2x2x2, both directions, µs", ["block", "CL_SLOTS = 2", "CL_SLOTS = 4"], rows))

        rows = []
        for hw, name in (("tpu-v7-like", "line 4x1x1"), (str(torus), "torus 4x1x1")):
            rows.append([name] + [reduce_us(kernel("4x1x1", hw=hw, ROWS=1024, BLOCK=64, DIRS=dirs, LEVEL=1), 1024, 4, 2, False)
                                  for dirs in (1, 2)])
        out["x_ring"] = {r[0]: r[1:] for r in rows}
        print(table("One X ring of 4 chips, 1 MiB per core, 64 KiB blocks, µs", ["", "one direction", "both directions"], rows))

        rows = []
        for name in ("all_reduce", "all_gather"):
            rows.append([f"{name}.mk"] + [us(mkemu.compile(str(EXAMPLES / f"{name}.mk"), mesh="8x1x1",
                                                             params={"CL_AG_SEMS": turns}))
                                          for turns in (2, 4)])
        out["ag_turns_line8"] = {r[0]: r[1:] for r in rows}
        print(table("Line of 8 chips (8x1x1), all-gather semaphore turns, µs", ["example", "CL_AG_SEMS = 2", "CL_AG_SEMS = 4"], rows))
    finish(out, args.json, time.perf_counter() - wall0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
