"""Running many independent runs ("trials") for `mkemu tune` and `mkemu sweep`.

A trial is one `mkemu.run.execute` of a program with given `Options`; `run_trial` is
the function a worker runs: it takes a `Trial` (the program's path, the options, an
inputs file, and the text of a hardware profile when the trial's profile is a variant
made up by a sweep) and returns a JSON-ready dict: `status` ("ok" or "rejected"), `reason` (why rejected),
the run's `report` and `wall_s`. A run that faults, deadlocks, races, fails to
compile or has no bit-exact reference check is rejected with its reason, never
raised: one bad variant must not stop a search. A trial may also ask for adversarial
DMA schedules (`Trial.schedules`, `mkemu run --schedules`'s runs: `run_schedules`):
a bit-exact run is then run again under each, and rejected if one of them faults,
deadlocks or changes a bit (`schedule_failure`); the outcomes are its report's
`schedules`, as in `mkemu run --json`.

`run_trials` runs a list of trials in this process (one job), in local processes
(`jobs` > 1, a `ProcessPoolExecutor`), or on a Dask distributed cluster (a
`scheduler` address; dask.distributed's `Client.submit`). Workers get the options
with absolute paths (the program, its imports and reference must be readable at the
same path on every worker, e.g. a shared file system or the same install) and send
back the dict. Results reach the caller as each trial finishes, in any order, with
the trial's index.

`objective_of` and `breakdown` read a trial's report: the figure a tune minimises,
and where the time went (what the design is bound by), for K3-style driver reports
(`us_per_step`, `breakdown_us`) and plain runs (`cycles`, unit busy and stall cycles)
alike.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

import attrs

from mkemu.errors import ConfigError, EmulatorFault, MkemuError, SourceError
from mkemu.options import Options
from mkemu.runner import json_default, signals_held

CONNECT_TIMEOUT_S = 30
# Report entries left out of a trial's record: per-core copies of the totals, and
# host-side fields that say nothing about the variant.
_DROPPED = ("per_core", "trace", "program", "dump", "routing_record")


@attrs.frozen
class Trial:
    """One run: the program (an absolute path), its options (no trace), a `.npz` of
    inputs for a plain program, the TOML text of the hardware profile when it is
    not a shipped name or file (then `options.hw` is ignored), and how many adversarial
    DMA schedules a bit-exact run is checked under as well (`run_schedules`)."""

    file: str
    options: Options
    inputs: str | None = None
    hw_toml: str | None = None
    schedules: int = 0


def trial(file: str, options: Options, inputs: str | None = None) -> Trial:
    """A trial with every file named by an absolute path, as a worker elsewhere needs."""
    def fix(path: str | None) -> str | None:
        return None if path is None else str(Path(path).resolve())

    hw = fix(options.hw) if _is_path(options.hw) else options.hw
    return Trial(fix(file), Options.of(options, hw=hw, trace=None, dump=fix(options.dump),
                                       routing=fix(options.routing), record_routing=fix(options.record_routing)),
                 fix(inputs))


def _is_path(hw: str) -> bool:
    return hw.endswith(".toml") or os.sep in hw or "/" in hw


def run_trial(trial: Trial) -> dict:
    """Run one trial; never raises a user's error (see the module docstring)."""
    from mkemu.run import execute

    t0 = time.perf_counter()
    schedules = None
    try:
        with _options_of(trial) as options:
            report, _ = execute(trial.file, options, inputs=trial.inputs)
            if trial.schedules and report.get("bit_exact") is True:
                schedules = _check_schedules(trial.file, options, trial.schedules, report, trial.inputs)
    except MkemuError as exc:
        return {"status": "rejected", "reason": rejection(exc), "report": None,
                "wall_s": round(time.perf_counter() - t0, 3)}
    report = {k: v for k, v in json.loads(json.dumps(report, default=json_default)).items()
              if k not in _DROPPED}
    status, reason = "ok", None
    if report.get("bit_exact") is False:
        status, reason = "rejected", f"wrong bits: {str(report.get('mismatch')).removeprefix('FAIL: ')}"
    elif report.get("bit_exact") is None and not trial.options.timing_only:
        # (a timing-only run computes nothing: its time is all it has, and a sweep takes it;
        # `mkemu tune` refuses --timing-only before any run)
        status, reason = "rejected", "no reference check: the program names no reference"
    elif schedules is not None:
        report["schedules"] = schedules
        failed = schedule_failure(schedules)
        if failed is not None:
            status, reason = "rejected", failed
    return {"status": status, "reason": reason, "report": report,
            "wall_s": round(time.perf_counter() - t0, 3)}


@contextlib.contextmanager
def _options_of(trial: Trial) -> Iterator[Options]:
    """The trial's options; for a profile given as TOML text, naming a file of it that
    lasts as long as the block."""
    if trial.hw_toml is None:
        yield trial.options
        return
    with tempfile.TemporaryDirectory(prefix="mkemu-hw-") as tmp:
        hw = Path(tmp) / "variant.toml"
        hw.write_text(trial.hw_toml)
        yield Options.of(trial.options, hw=str(hw))


def run_schedules(trial: Trial, count: int, normal: dict) -> list[dict]:
    """The outcomes of `count` adversarial DMA schedules of `trial` (those of `mkemu run
    --schedules count`: the late one, then shuffled with seeds 1, 2, ...), each compared
    with `normal`, the report of its normal run (as a trial's record holds it): JSON-ready
    entries `schedule`, `seed`, `outcome` (`same`, `changed bits`, `fault` or `deadlock`),
    `detail` and, for a run that finished, `cycles`."""
    with _options_of(trial) as options:
        return _check_schedules(trial.file, options, count, normal, trial.inputs)


def _check_schedules(file: str, options: Options, count: int, normal: dict, inputs: str | None) -> list[dict]:
    from mkemu.run import check_schedules

    return json.loads(json.dumps(check_schedules(file, options, count, normal, inputs=inputs), default=json_default))


SCHEDULE_OUTCOMES = ("same", "changed bits", "fault", "deadlock")


def schedule_failure(entries: list[dict]) -> str | None:
    """Why a run is rejected for its adversarial schedules (`run_schedules`), one line
    naming the first that failed: "under the late schedule: [race] at chip 0, ...
    (at FILE:LINE:COL: ...)"; None when every one gave the normal run's bits."""
    for entry in entries:
        if entry.get("outcome") == "same":
            continue
        name = ("the late schedule" if entry.get("schedule") == "late"
                else f"the {entry.get('schedule')} schedule, seed {entry.get('seed')}")
        lines = str(entry.get("detail") or entry.get("outcome")).splitlines() or [str(entry.get("outcome"))]
        if entry.get("outcome") in ("fault", "deadlock"):
            # (a fault's text, "fault [race] at ...: ..." then its instruction and source
            # lines, as `rejection` words a fault of the normal run)
            source = next((line.strip().removeprefix("source: ") for line in lines[1:]
                           if line.strip().startswith("source: ")), None)
            what = lines[0].removeprefix("fault ") + (f" (at {source})" if source else "")
        else:
            what = f"changed bits: {lines[0].removeprefix('FAIL: ')}"
        return f"under {name}: {what}"
    return None


def rejection(exc: MkemuError) -> str:
    """One line saying why a run was rejected: the fault kind or the first error."""
    if isinstance(exc, EmulatorFault):
        # "[race] at chip 0, core 0, cycle 1010, pc 0x0009: ..." and where in the source
        head = exc.render().splitlines()[0].removeprefix("fault ")
        return head + (f" (at {exc.source})" if exc.source else "")
    if isinstance(exc, SourceError):
        first = exc.diagnostics[0]
        more = len(exc.diagnostics) - 1
        # (a message may carry notes on lines of their own: joined, so the reason stays one line)
        message = "; ".join(line.strip() for line in first.message.splitlines() if line.strip())
        return f"compile error: {first.span}: {message}" + (f" (and {more} more)" if more else "")
    first = exc.render().splitlines()[0]   # "FILE: KEY: error: ..." or "error: ..."
    return first if "error:" in first else f"error: {first}"


def run_trials(trials: list[Trial], on_done: Callable[[int, dict], None], *, jobs: int = 1,
               scheduler: str | None = None) -> None:
    """Run every trial; call `on_done(index, result)` as each one finishes."""
    if not trials:
        return
    if scheduler is not None:
        _run_dask(trials, on_done, scheduler)
    elif jobs <= 1 or len(trials) == 1:
        for index, trial in enumerate(trials):
            on_done(index, run_trial(trial))
    else:
        # Spawned workers start clean (no state copied from this process); each is
        # reused for many trials, so the start-up cost is paid once per worker.
        pool = ProcessPoolExecutor(max_workers=min(jobs, len(trials)), mp_context=get_context("spawn"),
                                   initializer=_ignore_interrupts)
        try:
            # Ctrl-C held back while submitting starts the workers: each inherits the held
            # signal and never sees one until its start ignores it (a Ctrl-C to the process
            # group while a worker was still importing printed that worker's traceback).
            with signals_held((signal.SIGINT,)):
                futures = {pool.submit(run_trial, trial): index for index, trial in enumerate(trials)}
            _collect(as_completed(futures), futures, on_done, lambda exc: MkemuError(
                f"a worker process ended before its trial did ({type(exc).__name__}: killed, or out of memory?); "
                "the runs that finished are in the record"))
        except BaseException:
            # An interrupt (or an error in `on_done`): the trials running are dropped with
            # those not started, and the workers stopped now. Waiting for them to finish
            # their trials (a K3 run takes minutes) hung at exit at times: the interrupt
            # could land inside the graceful shutdown, which then never told the idle
            # workers to end, and the interpreter waited for them forever.
            _stop_workers(pool)
            raise
        pool.shutdown(wait=True)


STOP_WAIT_S = 10.0   # how long an interrupted run waits for the worker pool's manager thread


def _ignore_interrupts() -> None:
    """A worker's start: Ctrl-C reaches the whole process group, but only the parent
    acts on it (it stops the workers); a worker interrupted mid-trial would otherwise
    send its KeyboardInterrupt back as the trial's result."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Stop the pool's workers now, waiting a bounded time for its manager thread (which
    ends once it sees them gone): the interrupt may have landed anywhere in the pool's
    machinery, and `mkemu`'s entry ends an interrupted process without joining threads."""
    terminate = getattr(pool, "terminate_workers", None)   # (Python 3.14)
    if terminate is not None:
        terminate()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    manager = getattr(pool, "_executor_manager_thread", None)
    if manager is not None:
        manager.join(STOP_WAIT_S)


def _collect(done: Iterable, index_of: dict, on_done, lost: Callable[[Exception], MkemuError]) -> None:
    """on_done(index, result) of each future as it finishes. `run_trial` returns a
    trial's own errors as its result, so a future or an iterator that fails is the
    pool's or the cluster's failure: `lost(exc)` is raised for it, one line for the user
    (a worker killed, a scheduler gone), not a traceback from their machinery."""
    done = iter(done)
    while True:
        try:
            future = next(done, None)
            if future is None:
                return
            result = future.result()
        except Exception as exc:  # noqa: BLE001 - see above
            raise lost(exc) from None
        on_done(index_of[future], result)


def reach_scheduler(scheduler: str) -> None:
    """Connect to a Dask scheduler once, or raise a ConfigError saying why not. Checked
    before a `Client` is made: one whose start failed spends another minute failing to
    close when it is collected."""
    import asyncio

    try:
        from distributed.comm import connect
    except ImportError:
        raise ConfigError("--scheduler needs dask.distributed, which is not installed: "
                          "pip install 'mkemu[distributed]'", key="--scheduler") from None

    async def reach() -> None:
        comm = await connect(scheduler, timeout=CONNECT_TIMEOUT_S)
        await comm.close()

    try:
        asyncio.run(reach())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot reach the Dask scheduler at {scheduler}: {exc}", key="--scheduler") from None


def _run_dask(trials: list[Trial], on_done, scheduler: str) -> None:
    reach_scheduler(scheduler)
    from distributed import Client, as_completed as dask_completed

    client = Client(scheduler, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    # A scheduler lost mid-run is our one-line error (`_collect`): the client's own log of
    # it, a traceback from its reconnection attempts, is left out.
    log = logging.getLogger("distributed.client")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        with client, client.as_current():
            # pure=False: no caching of results by Dask; which trials to run is the caller's business.
            futures = {client.submit(run_trial, trial, pure=False): index for index, trial in enumerate(trials)}
            _collect(dask_completed(list(futures)), futures, on_done, lambda exc: MkemuError(
                f"lost the Dask scheduler {scheduler} before every run finished ({type(exc).__name__}); the runs "
                "that finished are in the record"))
    finally:
        log.setLevel(level)


# ----------------------------------------------------------------- reports


def objective_of(report: dict, objective: str) -> float:
    """`us_per_step` (a plain run is one step) or `cycles` (per step for a driver)."""
    if objective == "cycles":
        per_step = report.get("cycles_per_step")
        return sum(per_step) / len(per_step) if per_step else float(report["cycles"])
    return report["us_per_step"] if "us_per_step" in report else report["seconds"] * 1e6


def breakdown(report: dict) -> dict:
    """{"total": us per step, "parts": {what: us}, "bound_by": the largest part}.

    A driver's report already splits the step (`breakdown_us`: collectives, weight
    streaming, compute, launch overhead, idle). For a plain run the parts are per-core
    averages that may overlap: each unit's busy time (the busiest matrix unit for
    `mxu`) and the time cores stalled, by reason (`semaphore` is waiting for DMAs and
    signals)."""
    if "breakdown_us" in report:
        total, parts = report["us_per_step"], dict(report["breakdown_us"])
    else:
        total = report["seconds"] * 1e6
        per_core_us = total / report["cycles"] / report["cores"] if report["cycles"] else 0.0
        parts = {}
        for unit, busy in report["unit_busy_cycles"].items():
            name = "mxu" if unit.startswith("mxu") else unit
            parts[f"{name} busy"] = max(parts.get(f"{name} busy", 0.0), busy * per_core_us)
        for reason, cycles in report["stall_cycles"].items():
            parts[f"{reason} wait"] = cycles * per_core_us
    bound_by = max(parts, key=lambda k: parts[k]) if parts else None
    return {"total": total, "parts": parts, "bound_by": bound_by}
