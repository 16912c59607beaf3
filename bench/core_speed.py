"""The emulator's own speed, side by side with an earlier commit (the interpreter core).

    python bench/core_speed.py [--baseline COMMIT] [--reps N] [--quick] [--suite] [--json OUT]

Both trees run the same workloads in separate processes, interleaved (baseline,
current, baseline, current, ...) so machine load hits both alike; each figure is
the median over the repetitions. The baseline is extracted with `git archive` into
a temporary directory and imported from there (PYTHONPATH); the current tree is
this checkout. Workloads:

- local: a loop of local instructions only (scalar, vector loads/stores, vector
  ALU, a transcendental, a cross-lane reduction), one core, 1x / 2x / 4x long
  (instructions per wall second of `Machine.run`, and how cost grows with length);
- mixed: microbench section (e)'s loop, which also starts and waits for one DMA
  every 13 instructions (both cores);
- matmul: the Pallas interpret-mode comparison kernel: double-buffered y = x @ W,
  x 8x2048, W 2048x2048 bf16, 512x256 weight tiles, one core; the median of 9 runs
  after the first in the process (steady state: imports, caches and compiled code
  warm; each run on a fresh machine, its `Machine.run` timed);
- main job: `mkemu run programs/k3_megakernel.mk` in a fresh process: total wall,
  wall inside `Machine.run`, simulated instructions per wall second, peak RSS (after
  one unmeasured run per tree, which writes its byte code; the workloads run with byte
  code cached even where PYTHONDONTWRITEBYTECODE is set, as on an installed package).
- with --suite: `python -m pytest -q` of both trees, once each.

It also reports the current tree's first-run compile time of the machine's compiled
code (an empty cache directory: the issue loop, with the functions the machine calls
outside it and the flow model's kernels compiled alongside) and the time to load it
from the cache. Prints a markdown table and writes JSON (default
bench/out/core_speed.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from benchlib import OUT_DIR, finish, table

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASELINE = "5188962"   # the golden-run commit: the interpreter core, before core v2
SUBPACKAGES = ("isa", "emulator", "dsl", "tools", "programs")

LOCAL_LOOP = """
.kernel main
    rdsr s31, core
    bne s31, s0, done
    li s6, 512
    li s10, {iters}
loop:
    vld.w v1, 0(s0), s6, m0
    vld.w v2, 4096(s0), s6, m0
    vadd.f32 v3, v1, v2
    vmul.f32 v4, v3, v2
    vexp.f32 v5, v4
    vredsum.lane.f32 v6, v5
    vst.w v6, 8192(s0), s6, m0
    addi s7, s7, 3
    muli s8, s7, 5
    xor s9, s8, s7
    addi s10, s10, -1
    bne s10, s0, loop
done:
    halt
"""

MATMUL_MK = """
const M = 8;
const K = 2048;
const N = 2048;
const TK = 512;
const TN = 256;
const KT = K / TK;
const NJ = N / TN;

kernel matmul_db(x: hbm bf16[M, K], w: hbm bf16[K, N], y: hbm f32[M, N]) {
    vmem xv: bf16[M, K];
    vmem wbuf: bf16[2][TK, TN];
    vmem yv: f32[M, N];
    var acc: f32[M, TN];
    var slot: i32 = 0;
    sem xs;
    sem ws[2];
    start copy(x, xv, xs);
    start copy(w[0 +: TK, 0 +: TN], wbuf[0], ws[0]);
    wait copy(x, xv, xs);
    for j in 0..NJ {
        acc = 0.0;
        for k in 0..KT {
            if k + 1 < KT {
                start copy(w[(k + 1) * TK +: TK, j * TN +: TN], wbuf[1 - slot], ws[1 - slot]);
            } else if j + 1 < NJ {
                start copy(w[0 +: TK, (j + 1) * TN +: TN], wbuf[1 - slot], ws[1 - slot]);
            }
            wait copy(w[k * TK +: TK, j * TN +: TN], wbuf[slot], ws[slot]);
            acc += matmul(xv[:, k * TK +: TK], wbuf[slot]);
            slot = 1 - slot;
        }
        yv[:, j * TN +: TN] = acc;
    }
    start copy(yv, y, xs);
    wait copy(yv, y, xs);
}

host {
    input x: bf16[M, K];
    input w: bf16[K, N];
    output y: f32[M, N];
    launch matmul_db(x, w, y);
}
"""

ONE_CORE_PROFILE = 'extends = "tpu-v7-like"\nname = "tpu-v7-like-one-core"\n[chip]\ncores_per_chip = 1\n'

# Each workload is a script run as `python -c`; it prints one JSON object.
SCRIPT_COMMON = """
import json, os, sys, time
import mkemu
assert os.path.abspath(mkemu.__file__).startswith(os.path.abspath(sys.argv[1])), mkemu.__file__
from mkemu.emulator.machine import Machine
from mkemu.emulator.topology import Mesh
from mkemu.isa.hardware import load_profile
"""

SCRIPT_ASM = SCRIPT_COMMON + """
from mkemu.isa.asm import assemble
text, dims = sys.argv[2], tuple(int(d) for d in sys.argv[3].split("x"))
profile = load_profile("tpu-v7-like")
def once():
    machine = Machine(profile, Mesh(dims))
    machine.load(assemble(text, "bench.s"))
    t0 = time.perf_counter()
    result = machine.run()
    return result, time.perf_counter() - t0
once()                       # warm: imports, compiled code
result, wall = once()
print(json.dumps({"wall_s": wall, "instructions": result.instructions, "cycles": result.cycles}))
"""

# The matmul's x and w (float32; both scripts round them into bf16 buffers).
MATMUL_INPUTS = """
rng = np.random.default_rng(0)
x = rng.standard_normal((8, 2048)).astype(np.float32)
w = rng.standard_normal((2048, 2048)).astype(np.float32)
"""

SCRIPT_MATMUL = SCRIPT_COMMON + """
STEADY_RUNS = 9
import numpy as np
from mkemu.dsl.compiler import compile_text
from mkemu.runner import to_storage
src, profile_path = sys.argv[2], sys.argv[3]
profile = load_profile(profile_path)
program = compile_text(src, "matmul.mk", profile=profile)
""" + MATMUL_INPUTS + """
def once():
    machine = Machine(profile, Mesh((1, 1, 1)))
    machine.load(program)
    machine.write_buffer(0, "x", to_storage(x, "bf16"))
    machine.write_buffer(0, "w", to_storage(w, "bf16"))
    t0 = time.perf_counter()
    result = machine.run()
    return result, time.perf_counter() - t0, machine.read_buffer(0, "y")
_, first, y1 = once()
walls = []
for _ in range(STEADY_RUNS):
    result, wall, y2 = once()
    assert y1.tobytes() == y2.tobytes()
    walls.append(wall)
print(json.dumps({"wall_s": sorted(walls)[len(walls) // 2], "best_s": min(walls), "first_s": first,
                  "instructions": result.instructions, "cycles": result.cycles,
                  "y_sha": __import__("hashlib").sha256(y2.tobytes()).hexdigest()}))
"""

# The matmul's floor in this tree: only the work no emulator of this contract can skip,
# timed alone. Its 32 weight tiles (and x, y) copied as its DMAs copy them (the same
# strides, into a fresh 64 MiB VMEM after the weights are written into a fresh HBM, as
# a run does), and its 64 weight loads and 64 contract-ordered `mxu.mac`s (256x256
# tiles, 8 rows) run as the compiled semantics the issue loop calls. No decode, no
# issue loop, no events, flows or race checks.
SCRIPT_MATMUL_FLOOR = SCRIPT_COMMON + """
RUNS = 9
import numpy as np
from mkemu.emulator.memory import block_view, write_block
from mkemu.isa import semantics as S
from mkemu.runner import to_storage
""" + MATMUL_INPUTS + """
x = to_storage(x, "bf16").view(np.uint8).reshape(-1)
w = to_storage(w, "bf16").view(np.uint8).reshape(-1)
def copies():
    hbm = np.zeros(x.size + w.size + 8 * 2048 * 4, np.uint8)
    hbm[:x.size] = x
    hbm[x.size:x.size + w.size] = w
    vmem = np.zeros(64 << 20, np.uint8)
    t0 = time.perf_counter()
    write_block(vmem, 0, x.size, 1, x.size, 1, x.size, block_view(hbm, 0, x.size, 1, x.size, 1, x.size))
    for j in range(8):
        for k in range(4):
            src = block_view(hbm, x.size + k * 512 * 4096 + j * 512, 512, 512, 4096, 1, 0)
            write_block(vmem, x.size + (k % 2) * 512 * 512, 512, 512, 512, 1, 0, src)
    write_block(hbm, x.size + w.size, 65536, 1, 65536, 1, 65536, block_view(vmem, 1 << 20, 65536, 1, 65536, 1, 65536))
    return time.perf_counter() - t0, vmem
def arithmetic(vmem):
    mxw = np.zeros((2, 256, 256), np.uint16)
    lhs = np.zeros((2, 8, 256), np.uint32)
    lhs[:] = (x[:8 * 256 * 2].view(np.uint16).astype(np.uint32) << 16).reshape(8, 256)
    acc = np.zeros((2, 2, 8, 256), np.uint32)
    mxr, err = np.zeros(4, np.int64), np.zeros(8, np.int64)
    vmem16 = vmem.view(np.uint16)
    t0 = time.perf_counter()
    for n in range(64):
        S.load_weights(vmem, vmem16, mxw, mxr, 0, x.size + (n % 4) * 256 * 512, 512, 256, 256, False, err)
        S.mac(mxw, lhs.view(np.float32), acc.view(np.float32), mxr, 0, 0, n % 4 == 0, err)
    return time.perf_counter() - t0
arithmetic(copies()[1])
samples = []
for _ in range(RUNS):
    copy_s, vmem = copies()
    samples.append((copy_s, arithmetic(vmem)))
copy_s = sorted(c for c, _ in samples)[RUNS // 2]
math_s = sorted(a for _, a in samples)[RUNS // 2]
print(json.dumps({"copies_s": copy_s, "arithmetic_s": math_s}))
"""

SCRIPT_MAIN = SCRIPT_COMMON + """
import resource
from mkemu.cli import main
emulator = [0.0]
run = Machine.run
def timed(self):
    t0 = time.perf_counter()
    try:
        return run(self)
    finally:
        emulator[0] += time.perf_counter() - t0
Machine.run = timed
out = sys.argv[2]
t0 = time.perf_counter()
code = main(["run", os.path.join(sys.argv[1], "programs", "k3_megakernel.mk"), "--json"])
wall = time.perf_counter() - t0
print(json.dumps({"code": code, "wall_s": wall, "emulator_s": emulator[0],
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), file=open(out, "w"))
"""


def extract(commit: str, into: Path) -> Path:
    """The tree of `commit` at `into/src`, importable as the `mkemu` package."""
    src = into / "src"
    src.mkdir(parents=True)
    archive = into / "tree.tar"
    with open(archive, "wb") as fh:
        subprocess.run(["git", "-C", str(ROOT), "archive", commit], stdout=fh, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(src, filter="data")
    for name in SUBPACKAGES:
        (src / "mkemu" / name).symlink_to(src / name, target_is_directory=True)
    return src


def current_tree(into: Path) -> Path:
    """This checkout (with uncommitted changes), importable the same way."""
    src = into / "cur"
    src.mkdir(parents=True)
    for entry in ROOT.iterdir():
        if entry.name not in (".git", "mkemu", "bench"):
            (src / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    (src / "mkemu").mkdir()
    for entry in (ROOT / "mkemu").iterdir():
        (src / "mkemu" / entry.name).symlink_to(entry)
    for name in SUBPACKAGES:
        (src / "mkemu" / name).symlink_to(ROOT / name, target_is_directory=True)
    return src


def environment(tree: Path, **extra: str) -> dict:
    """The environment of a workload importing `tree`. Byte code is cached as on any
    install (`pip install` compiles it; a checkout writes it at its first import): a
    PYTHONDONTWRITEBYTECODE set around the benchmark would have every fresh process
    compile each module's source again, about half a second of the main job's wall."""
    environ = dict(os.environ, PYTHONPATH=str(tree), **extra)
    environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return environ


def run_script(tree: Path, script: str, *args: str, env: dict | None = None) -> dict:
    environ = environment(tree, **(env or {}))
    proc = subprocess.run([sys.executable, "-c", script, str(tree), *args], capture_output=True,
                          text=True, env=environ, cwd=tree)
    if proc.returncode:
        raise RuntimeError(f"workload failed in {tree}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main_job(tree: Path) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as fh:
        environ = environment(tree)
        proc = subprocess.run([sys.executable, "-c", SCRIPT_MAIN, str(tree), fh.name],
                              capture_output=True, text=True, env=environ, cwd=tree)
        if proc.returncode:
            raise RuntimeError(f"main job failed in {tree}:\n{proc.stderr[-3000:]}")
        figures = json.loads(Path(fh.name).read_text())
        report = json.loads(proc.stdout)
    figures["instructions"] = report["instructions_per_step"] * report["steps_run"]
    figures["us_per_step"] = report["us_per_step"]
    return figures


def median(values):
    return statistics.median(values)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=DEFAULT_BASELINE)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="shorter loops, 1 repetition")
    parser.add_argument("--suite", action="store_true", help="also time both test suites")
    parser.add_argument("--json", default=str(OUT_DIR / "core_speed.json"))
    args = parser.parse_args(argv)
    wall0 = time.perf_counter()
    reps = 1 if args.quick else args.reps
    base_iters = 1000 if args.quick else 8000
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        trees = {"baseline": extract(args.baseline, tmp / "base"), "current": current_tree(tmp)}
        samples: dict = {name: {} for name in trees}

        def add(tree, key, value):
            samples[tree].setdefault(key, []).append(value)

        profile_path = tmp / "one-core.toml"
        profile_path.write_text(ONE_CORE_PROFILE)
        for tree in trees.values():
            main_job(tree)      # (unmeasured: writes each tree's byte code, as a first run does)
        for rep in range(reps):
            for name, tree in trees.items():
                for mult in (1, 2, 4):
                    text = LOCAL_LOOP.format(iters=base_iters * mult)
                    add(name, f"local{mult}", run_script(tree, SCRIPT_ASM, text, "1x1x1"))
                mixed = _mixed_program(base_iters)
                add(name, "mixed", run_script(tree, SCRIPT_ASM, mixed, "1x1x1"))
                add(name, "matmul", run_script(tree, SCRIPT_MATMUL, MATMUL_MK, str(profile_path)))
                if name == "current":
                    add(name, "matmul_floor", run_script(tree, SCRIPT_MATMUL_FLOOR))
                add(name, "main", main_job(tree))
                print(f"repetition {rep + 1}/{reps}: {name} done", file=sys.stderr, flush=True)
        compile_fig = _compile_times(trees["current"], tmp)
        suite = _suite_times(trees) if args.suite else None
    result = _summarise(samples, compile_fig, suite, args.baseline, reps)
    print(result["text"])
    finish({"core_speed": result}, args.json, time.perf_counter() - wall0)
    return 0


def _mixed_program(iters: int) -> str:
    sys.path.insert(0, str(Path(__file__).parent))
    from microbench import speed_program

    return speed_program(iters)


def _compile_times(tree: Path, tmp: Path) -> dict:
    """First use of the machine's compiled code from an empty cache (the issue loop, the
    functions the machine calls outside it and the flow model's kernels: a first run
    needs all three), then a load of it from that cache."""
    script = ("import json, time\nt0 = time.perf_counter()\nfrom mkemu.emulator import flows, loop\n"
              "loop.compiled_loop()\nt1 = time.perf_counter()\nloop.compiled_machine()\nflows.warm_up()\n"
              "t2 = time.perf_counter()\nprint(json.dumps({'loop': t1 - t0, 'rest': t2 - t1, 'total': t2 - t0}))")
    env = {"XDG_CACHE_HOME": str(tmp / "fresh-cache"), "NUMBA_CACHE_DIR": str(tmp / "fresh-numba")}
    first = run_script(tree, script, env=env)
    cached = run_script(tree, script, env=env)
    return {"first_total_s": first["total"], "first_loop_s": first["loop"], "first_rest_s": first["rest"],
            "cached_total_s": cached["total"]}


def _suite_times(trees: dict) -> dict:
    out = {}
    for name, tree in trees.items():
        environ = environment(tree, CI="true")
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                              capture_output=True, text=True, env=environ, cwd=tree)
        out[name] = {"wall_s": time.perf_counter() - t0, "exit": proc.returncode,
                     "summary": proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""}
    return out


def _summarise(samples: dict, compile_fig: dict, suite, baseline: str, reps: int) -> dict:
    def med(tree, key, field):
        return median([s[field] for s in samples[tree][key]])

    rows, records = [], {}
    for key, label in (("local1", "local loop 1x: instructions/s"), ("local2", "local loop 2x: instructions/s"),
                       ("local4", "local loop 4x: instructions/s"), ("mixed", "mixed loop (e): instructions/s")):
        b = med("baseline", key, "instructions") / med("baseline", key, "wall_s")
        c = med("current", key, "instructions") / med("current", key, "wall_s")
        rows.append([label, f"{b:,.0f}", f"{c:,.0f}", f"{c / b:.1f}x"])
        records[key] = {"baseline_instr_per_s": b, "current_instr_per_s": c, "speedup": c / b,
                        "baseline_wall_s": med("baseline", key, "wall_s"),
                        "current_wall_s": med("current", key, "wall_s")}
    for tree in ("baseline", "current"):
        walls = [med(tree, f"local{m}", "wall_s") for m in (1, 2, 4)]
        records[f"linearity_{tree}"] = [w / walls[0] for w in walls]
    rows.append(["local loop wall 1x:2x:4x", ":".join(f"{r:.2f}" for r in records["linearity_baseline"]),
                 ":".join(f"{r:.2f}" for r in records["linearity_current"]), ""])
    b, c = med("baseline", "matmul", "wall_s"), med("current", "matmul", "wall_s")
    rows.append(["matmul 8x2048x2048, 512x256 tiles, steady state: ms", f"{b * 1e3:.1f}", f"{c * 1e3:.1f}",
                 f"{b / c:.1f}x"])
    records["matmul"] = {"baseline_ms": b * 1e3, "current_ms": c * 1e3, "speedup": b / c,
                         "same_bits": samples["baseline"]["matmul"][0]["y_sha"] == samples["current"]["matmul"][0]["y_sha"]}
    copies = median([s["copies_s"] for s in samples["current"]["matmul_floor"]])
    arithmetic = median([s["arithmetic_s"] for s in samples["current"]["matmul_floor"]])
    floor = copies + arithmetic
    rows.append(["matmul floor: its copies + weight loads and macs alone, ms", "",
                 f"{floor * 1e3:.1f} ({copies * 1e3:.1f} + {arithmetic * 1e3:.1f})", f"{b / floor:.1f}x"])
    records["matmul"].update(floor_ms=floor * 1e3, floor_copies_ms=copies * 1e3,
                             floor_arithmetic_ms=arithmetic * 1e3, floor_speedup=b / floor)
    for field, label, fmt in (("wall_s", "main job: wall s", "{:.2f}"),
                              ("emulator_s", "main job: wall in Machine.run, s", "{:.2f}"),
                              ("rss_mb", "main job: peak RSS, MB", "{:.0f}")):
        b, c = med("baseline", "main", field), med("current", "main", field)
        rows.append([label, fmt.format(b), fmt.format(c), f"{b / c:.1f}x" if field != "rss_mb" else f"{c / b:.2f}"])
        records[f"main_{field}"] = {"baseline": b, "current": c}
    instr = med("current", "main", "instructions")
    for tree in ("baseline", "current"):
        records[f"main_instr_per_s_{tree}"] = instr / med(tree, "main", "wall_s")
        records[f"main_instr_per_emulator_s_{tree}"] = instr / med(tree, "main", "emulator_s")
    rows.append(["main job: instructions per wall s (total)", f"{records['main_instr_per_s_baseline']:,.0f}",
                 f"{records['main_instr_per_s_current']:,.0f}", ""])
    rows.append(["main job: instructions per wall s in Machine.run",
                 f"{records['main_instr_per_emulator_s_baseline']:,.0f}",
                 f"{records['main_instr_per_emulator_s_current']:,.0f}", ""])
    if suite:
        b, c = suite["baseline"]["wall_s"], suite["current"]["wall_s"]
        rows.append(["test suite (CI=true pytest -q): wall s", f"{b:.0f}", f"{c:.0f}", f"{b / c:.1f}x"])
        records["suite"] = suite
    records["compile"] = compile_fig
    records["baseline_commit"] = baseline
    records["repetitions"] = reps
    text = table(f"emulator speed: baseline {baseline} vs this tree (medians of {reps} interleaved runs)",
                 ["workload", "baseline", "current", "ratio"], rows)
    text += (f"\ncompiled code, first use from an empty cache: {compile_fig['first_total_s']:.1f} s "
             f"(the issue loop {compile_fig['first_loop_s']:.1f} s, the machine's other compiled code "
             f"compiled alongside it in a child process; then {compile_fig['first_rest_s']:.1f} s more), "
             f"load from cache {compile_fig['cached_total_s']:.2f} s\n")
    return {"text": text, "records": records}


if __name__ == "__main__":
    sys.exit(main())
