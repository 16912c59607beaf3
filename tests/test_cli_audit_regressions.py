"""Regressions from an adversarial audit of the command line and the API: bad input is
one line naming the place and a non-zero exit, never a traceback, an exit 0 or a
machine's memory filled; an interrupt stops a tune's workers at once."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

import mkemu
from tests.test_cli_fuzz_regressions import cli, failed

EXAMPLE = str(Path(__file__).parent.parent / "programs" / "examples" / "vector_add.s")
RUN = ["run", EXAMPLE, "--hw", "test", "--mesh", "1"]
PROFILE = Path(__file__).parent.parent / "isa" / "profiles" / "test.toml"

# A kernel that spins N * N times: N = 2^30 runs for years, as a trial that does not end.
SPIN = """
param N = 1;
kernel spin(x: hbm f32[8, 128]) {
    for i in 0..N {
        for j in 0..N {
        }
    }
}
host {
    input x: f32[8, 128];
    launch spin(x);
}
"""

COPY_I32 = """
kernel copy32(x: hbm i32[8, 128], y: hbm i32[8, 128]) {
    vmem v: i32[8, 128];
    sem s;
    start copy(x, v, s);
    wait copy(x, v, s);
    start copy(v, y, s);
    wait copy(v, y, s);
}
host {
    input x: i32[8, 128];
    output y: i32[8, 128];
    launch copy32(x, y);
}
"""


def limited(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`mkemu ARGV` in a process whose memory is capped at 4 GB (a reader that never
    stops fails there with MemoryError instead of filling the machine)."""
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)); "
            "from mkemu.cli import main; sys.exit(main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


# ------------------------------------------------------------------ asm


def test_asm_params_refuses_a_bad_hw_instead_of_ignoring_it(capsys):
    failed(capsys, "asm", "vector_add", "--params", "--hw", "no-such-profile", naming="--hw: error: unknown")


def test_asm_params_with_stats_is_an_error_not_a_silently_dropped_flag(capsys):
    failed(capsys, "asm", "vector_add", "--params", "--stats", naming="--stats: error:")


# ------------------------------------------------------------------ options


def test_a_set_without_a_name_is_an_error_naming_set(capsys):
    failed(capsys, *RUN[:2], "--hw", "test", "--set", "=5", naming="--set: error: --set wants NAME=INTEGER")


def test_an_empty_scheduler_is_an_error_before_anything_runs(capsys, tmp_path):
    for argv in (["tune", "vector_add", "--hw", "test", "--param", "N=512", "--out", str(tmp_path / "t.json")],
                 ["sweep", "vector_add", "--hw", "test", "--hw-set", "clock_hz=1e9"]):
        err = failed(capsys, *argv, "--scheduler", "", naming="--scheduler: error: --scheduler wants")
        assert "variant" not in err
    assert not (tmp_path / "t.json").exists()


def test_a_sweep_of_one_point_says_one_point(capsys):
    code, out, _ = cli(capsys, "sweep", "vector_add", "--hw", "test", "--mesh", "1", "--hw-set", "clock_hz=1e9")
    assert code == 0
    assert out.splitlines()[-1].startswith("1 point, wall")


# ------------------------------------------------------------------ files that are not files


def test_a_program_that_is_a_device_is_an_error_not_no_such_file(capsys):
    failed(capsys, "run", os.devnull, naming="not a regular file")


def test_a_trace_with_metadata_nested_too_deep_is_corrupted(capsys, tmp_path):
    path = tmp_path / "t.mkt"
    assert cli(capsys, *RUN, "--trace", str(path))[0] == 0
    raw = zlib.decompress(path.read_bytes()[36:])
    (size,) = struct.unpack_from("<Q", raw)
    meta = raw[8:8 + size].decode()
    deep = (meta[:-1] + ', "zz": ' + "[" * 100_000 + "]" * 100_000 + "}").encode()
    payload = struct.pack("<Q", len(deep)) + deep + raw[8 + size:]
    body = zlib.compress(payload)
    path.write_bytes(struct.pack("<8sIIQQI", b"MKTRACE\x00", 1, 0, len(payload), len(body), zlib.crc32(body)) + body)
    failed(capsys, "trace", str(path), naming="corrupted trace: bad metadata (nested too deeply")
    failed(capsys, "trace", "diff", str(path), str(path), naming="nested too deeply")


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_trace_read_from_an_endless_device_is_refused_by_its_header(tmp_path):
    done = limited(["trace", "/dev/zero"], tmp_path)
    assert done.returncode == 1, done.stderr
    assert "/dev/zero: error: not an mkemu trace (bad magic bytes" in done.stderr


def test_a_trace_read_from_a_pipe_still_works(capsys, tmp_path):
    path = tmp_path / "t.mkt"
    assert cli(capsys, *RUN, "--trace", str(path))[0] == 0
    read, write = os.pipe()
    data = path.read_bytes()
    os.write(write, data)   # (fits in the pipe's buffer)
    os.close(write)
    try:
        code, out, _ = cli(capsys, "trace", f"/dev/fd/{read}")
    finally:
        os.close(read)
    assert code == 0 and "emulated time: " in out


def test_a_tune_record_nested_too_deep_is_not_a_record(capsys, tmp_path):
    record = tmp_path / "deep.json"
    record.write_text("[" * 100_000 + "]" * 100_000)
    failed(capsys, "tune", "vector_add", "--hw", "test", "--mesh", "1", "--param", "N=512", "--resume", str(record),
           "--out", str(tmp_path / "out.json"), naming="deep.json: error: not a tune record (invalid JSON: nested")


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_tune_record_read_from_an_endless_device_is_refused(tmp_path):
    done = limited(["tune", "vector_add", "--hw", "test", "--mesh", "1", "--param", "N=512", "--resume", "/dev/zero",
                    "--out", str(tmp_path / "out.json")], tmp_path)
    assert done.returncode == 1, done.stderr
    assert "/dev/zero: error: not a tune record (it holds NUL bytes" in done.stderr


# ------------------------------------------------------------------ the API


@pytest.mark.parametrize("seed", [-1, "x", 1.5, True])
def test_generate_inputs_with_a_bad_seed_is_a_config_error(seed):
    kernel = mkemu.compile("vector_add", hw="test", mesh="1")
    with pytest.raises(mkemu.ConfigError, match="seed must be an integer >= 0"):
        kernel.generate_inputs(seed)
    assert kernel.generate_inputs(np.int64(3)).keys() == kernel.generate_inputs(3).keys()


def test_path_options_take_a_pathlib_path(tmp_path):
    kernel = mkemu.compile("vector_add", hw=PROFILE, mesh="1", trace=tmp_path / "t.mkt")
    assert kernel.options.hw == str(PROFILE) and kernel.options.trace == str(tmp_path / "t.mkt")
    run = kernel()
    assert (tmp_path / "t.mkt").is_file() and run.report.trace.end_cycle == run.report.cycles
    assert mkemu.Options(model=pathlib.Path("m.toml"), routing=pathlib.Path("r.json")).model == "m.toml"


def test_an_i32_output_is_checked_exactly_against_a_float_expectation():
    kernel = mkemu.compile_source(COPY_I32, hw="test", mesh="1")
    run = kernel(x=np.full((8, 128), 2**24 + 1, np.int32))
    assert run.output("y")[0, 0] == 2**24 + 1
    for expected in (np.full((8, 128), 2.0**24), np.full((8, 128), 2.0**24, np.float32)):
        mismatch = run.check({"y": expected})   # (float32 holds no 2^24 + 1: it compared equal)
        assert mismatch is not None and mismatch.count == 8 * 128 and run.report.bit_exact is False
    assert run.check({"y": np.full((8, 128), 2.0**24 + 1)}) is None
    assert run.check({"y": np.full((8, 128), 2**24 + 1, np.int64)}) is None


# ------------------------------------------------------------------ interrupts


def _interruptible() -> None:
    """In the child before it runs: SIGINT delivered, and at its default. A child
    inherits an ignored SIGINT and a blocked one (Python then never installs its
    handler, or never sees the signal); run among the whole suite, the tune ignored
    the interrupt in most fresh `.ci/run`s, so something earlier in the worker leaves
    SIGINT that way."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_an_interrupted_tune_stops_its_workers_at_once(tmp_path):
    """SIGINT to a tune running trials in local processes: it stops the trials still
    running (here one that would spin for hours) instead of waiting for them, and the
    record keeps the trial that finished."""
    program = tmp_path / "spin.mk"
    program.write_text(SPIN)
    out = tmp_path / "spin.tune.json"
    argv = [sys.executable, "-m", "mkemu.cli", "tune", str(program), "--hw", "test", "--mesh", "1",
            "--param", f"N=1,{2**30}", "--max-instructions", str(2**60), "--jobs", "2", "--out", str(out)]
    proc = subprocess.Popen(argv, cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            start_new_session=True, preexec_fn=_interruptible)
    rest: list[str] = []
    try:
        for line in proc.stderr:        # the default build (N=1) finishes; N=2^30 spins
            if line.startswith("[0] N=1: "):
                break
        # The rest of stderr is read on the side: a tune blocked writing into a full pipe
        # would look like one that does not stop (and is shown if it does not).
        drain = threading.Thread(target=lambda: rest.extend(proc.stderr), daemon=True)
        drain.start()
        started = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the interrupted tune did not stop within 60 s; its stderr after the first trial:\n"
                        + "".join(rest[-50:]))
        assert time.perf_counter() - started < 30
        drain.join(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            try:
                os.killpg(proc.pid, signal.SIGKILL)   # (workers left behind, if any)
            except ProcessLookupError:
                pass
        proc.stderr.close()
    assert code == 130
    # No warning after the `interrupted` line: the stopped pool's semaphores were given
    # back (multiprocessing's resource tracker warned of 5 leaked ones).
    assert "leaked semaphore" not in "".join(rest), "".join(rest[-5:])
    record = json.loads(out.read_text())
    assert record["finished"] is False
    # (rejected: the program names no reference; what matters is that it finished)
    assert [(t["params"], t["status"]) for t in record["trials"]] == [({"N": 1}, "rejected")]


@pytest.mark.parametrize("export", ["--perfetto", "--html"])
def test_exporting_a_trace_without_kernel_time_names_the_trace_not_an_absent_flag(capsys, tmp_path, export):
    program = tmp_path / "empty.mk"
    program.write_text("kernel k() { }\n")
    trace = tmp_path / "empty.mkt"
    assert cli(capsys, "run", str(program), "--hw", "test", "--trace", str(trace))[0] == 0
    assert cli(capsys, "trace", str(trace))[0] == 0             # the summary: a window of 0 cycles
    err = failed(capsys, "trace", str(trace), export, str(tmp_path / "out"), naming="nothing to draw")
    assert err.startswith(f"{trace}: error:") and "--from" not in err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ --record-routing of many runs

K3 = ("k3_megakernel", "--model", "k3-tiny", "--prompt-len", "1", "--steps", "1")


def test_a_tune_writes_the_default_builds_routing_record(capsys, tmp_path):
    """Every variant rewrote --record-routing, so the file held the last variant to
    finish (SCHEME=1 routes on other cores): which one depended on --jobs' timing."""
    assert cli(capsys, "run", *K3, "--record-routing", str(tmp_path / "default.json"))[0] == 0
    code, _, _ = cli(capsys, "tune", *K3, "--param", "SCHEME=0,1", "--record-routing", str(tmp_path / "tuned.json"),
                     "--out", str(tmp_path / "t.json"))
    assert code == 0
    assert (tmp_path / "tuned.json").read_bytes() == (tmp_path / "default.json").read_bytes()


def test_a_sweep_of_many_runs_refuses_one_routing_record(capsys, tmp_path):
    failed(capsys, "sweep", *K3, "--hw-set", "clock_hz=1e9,2e9", "--record-routing", str(tmp_path / "r.json"),
           naming="--record-routing: error: --record-routing writes the router's choices of one run; this sweep "
                  "has 2 runs")
    assert not (tmp_path / "r.json").exists()


def test_a_tune_of_a_driven_program_refuses_inputs_up_front(capsys, tmp_path):
    """It ran every variant and rejected each for the same --inputs."""
    inputs = tmp_path / "x.npz"
    np.savez(inputs, a=np.ones((8, 1024), np.float32))
    failed(capsys, "tune", *K3, "--param", "WR_MAX=4,8", "--inputs", str(inputs), "--out", str(tmp_path / "t.json"),
           naming="--inputs: error: --inputs applies to plain programs")
    assert not (tmp_path / "t.json").exists()
