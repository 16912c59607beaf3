"""One `mkemu run`: compile, run, check against the reference, and the report it prints.

Built on the API (`mkemu.api`): a plain program runs once on inputs from `--inputs`
or generated from the seed and is checked against its reference function; a
program whose reference is a driver (e.g. the K3 decode driver) is run by the
driver through a `Session`, which returns its own report and renderer. Used by
`mkemu run` and `mkemu compare`.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np

from mkemu.api import compile as compile_program
from mkemu.options import Options
from mkemu.runner import call_hook


def load_program(path: str, profile, params: dict[str, int], cache: bool = True):
    """Assemble a `.s` file or compile a `.mk` file (a path or a shipped name) into a
    Program (from the compile cache unless `cache` is False)."""
    from mkemu.api import build_program
    from mkemu.errors import ConfigError, not_text
    from mkemu.shipped import resolve

    path = resolve(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read program: {exc.strerror}", file=path) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read program: it is {not_text(exc)}", file=path) from None
    return build_program(path, text, profile, params, cache)


def prepare(file: str, options: Options, inputs: str | None = None) -> tuple:
    """The compiled program (`mkemu.Kernel`) `execute` runs, its options checked
    against it (what can be refused before anything runs), and the seconds that took."""
    from mkemu.errors import ConfigError

    t0 = time.perf_counter()
    kernel = compile_program(file, options)
    if kernel.is_driven and inputs:
        raise ConfigError("--inputs applies to plain programs; this program's driver writes its own inputs",
                          file=inputs)
    return kernel, time.perf_counter() - t0


def execute(file: str, options: Options, progress=None, inputs: str | None = None,
            prepared: tuple | None = None) -> tuple[dict, Callable[[dict], str]]:
    """Run one program (`prepared`: what `prepare` gave, else prepared now); returns the
    report (a JSON-ready dict with `bit_exact`) and the function that renders it as
    text, its wall time the preparing's and the run's. `inputs` is a `.npz` file for a
    plain program."""
    kernel, prepare_s = prepared or prepare(file, options, inputs)
    wall0 = time.perf_counter() - prepare_s
    run = kernel(inputs, progress=progress)
    report = run.report.figures
    if not kernel.is_driven:
        digest = hashlib.sha256()
        for key in sorted(run.outputs):
            digest.update(key.encode() + np.ascontiguousarray(run.outputs[key]).tobytes())
        # (a timing-only run keeps only its i32 outputs: with none, there is nothing to hash)
        report["outputs_sha256"] = digest.hexdigest() if run.outputs or not options.timing_only else None
    if not kernel.is_driven:
        report["timing_only"] = bool(options.timing_only)    # (a driver's report has its own)
        if not options.timing_only and kernel.reference is not None:
            run.check()
            report["reference"] = kernel.program.reference
    render = render_plain
    if kernel.is_driven:
        render = render_figures
        if hasattr(kernel.reference, "render"):     # (one that raises is the program's error)
            render = functools.partial(call_hook, kernel.reference.render, program_path=kernel.path)
    # (a trace given as a path was written by the run: report["trace"] names it)
    report["program"] = kernel.path
    report["compile_s"] = round(kernel.compile_s, 3)
    report["wall_s"] = round(time.perf_counter() - wall0, 3)
    return report, render


# `--schedules N`: each schedule is a whole run, so N is bounded (a typo's 10**9 would never end).
MAX_SCHEDULES = 1000


def check_schedules(file: str, options: Options, count: int, normal: dict, inputs: str | None = None) -> list[dict]:
    """Run `count` adversarial schedules (the late one, then shuffles with seeds 1, 2,
    ...) and say of each whether it gave the normal run's bits, faulted or deadlocked.
    They write no outputs (trace, dump, routing record): those are the normal run's."""
    from mkemu.errors import MkemuError

    out = []
    for k in range(count):
        schedule = "late" if k == 0 else "shuffle"
        variant = attrs.evolve(options, schedule=schedule, schedule_seed=k, trace=None, dump=None,
                               record_routing=None)
        entry = {"schedule": schedule, "seed": k}
        try:
            report, _ = execute(file, variant, inputs=inputs)
        except MkemuError as exc:
            kind = getattr(exc, "kind", "error")
            entry.update(outcome="deadlock" if kind == "deadlock" else "fault", detail=exc.render())
        else:
            differs = _outcome_differs(normal, report)
            entry.update(outcome="changed bits" if differs else "same", detail=differs,
                         cycles=report.get("cycles", sum(report.get("cycles_per_step", []))))
        out.append(entry)
    return out


def _outcome_differs(normal: dict, other: dict) -> str | None:
    """What of `other` differs from the normal run's outcome: the reference check, the
    generated tokens of a driven run, or the outputs' digest of a plain one."""
    if other.get("bit_exact") != normal.get("bit_exact"):
        return other.get("mismatch") or "the reference check's verdict changed"
    for key in ("tokens", "outputs_sha256"):
        if key in normal and normal[key] != other.get(key):
            return f"{key} differ from the normal schedule's"
    return None


def render_schedules(entries: list[dict]) -> str:
    lines = [f"schedules: {len(entries)} adversarial (late, then shuffled with seeds 1..{len(entries) - 1})"
             if len(entries) > 1 else "schedules: 1 adversarial (late)"]
    for e in entries:
        name = e["schedule"] + (f" seed {e['seed']}" if e["schedule"] == "shuffle" else "")
        if e["outcome"] in ("fault", "deadlock") and e.get("detail"):
            lines.append(f"  {name}: {e['detail']}")     # (it starts "fault [kind]": no need to say fault twice)
        else:
            detail = f": {e['detail']}" if e.get("detail") else ""
            lines.append(f"  {name}: {e['outcome']}{detail}")
    return "\n".join(lines)


TIMING_ONLY = ("TIMING ONLY: nothing was computed (only the i32 buffers hold data); cycles are charged as in a "
               "data run")


def render_plain(report: dict) -> str:
    if report.get("timing_only"):
        lines = [TIMING_ONLY]
    elif report["bit_exact"] is True:
        lines = [f"PASS: outputs bit-exact against {report['reference']}"]
    elif report["mismatch"]:
        lines = [report["mismatch"]]
    else:
        lines = ["(no reference named: outputs not checked)"]
    busy = ", ".join(f"{k} {v:,}" for k, v in report["unit_busy_cycles"].items() if v)
    stalls = ", ".join(f"{k} {v:,}" for k, v in report["stall_cycles"].items() if v)
    lines += [
        f"chips {report['chips']}, cores {report['cores']} ({report['hw']})",
        f"cycles {report['cycles']:,}  ({report['seconds'] * 1e6:.3f} us emulated)",
        f"instructions {report['instructions']:,}, DMAs {report['dma_count']:,}, "
        f"HBM bytes {report['hbm_bytes']:,}",
        f"unit busy cycles (all cores): {busy or 'none'}",
        f"stall cycles (all cores): {stalls or 'none'}",
        f"wall {report['wall_s']:.2f} s",
    ]
    return "\n".join(lines)


def render_figures(report: dict) -> str:
    """A driven program's report, when its driver renders none of its own: whether it
    checked out, then each figure that is a number or a string."""
    bit_exact = report.get("bit_exact")
    lines = ["PASS (the driver's check)" if bit_exact is True else
             f"FAIL: {report.get('mismatch') or 'the driver says the bits differ'}" if bit_exact is False else
             "(the driver's figures say nothing of a check)"]
    lines += [f"{key}: {value}" for key, value in report.items()
              if key not in ("bit_exact", "mismatch") and isinstance(value, (int, float, str))]
    return "\n".join(lines)


def compare_text(*reports: dict) -> str:
    """Reports side by side, one column each (driver reports per step, or plain runs)."""
    from mkemu.sweep import program_names

    # (named by file, or by as many of their paths' last parts as tell two of one name apart)
    names = program_names(r["program"] for r in reports)

    def row(label, key, fmt="{:.2f}", sub=None, scale=1.0):
        values = []
        for r in reports:
            v = r.get(key) if sub is None else r.get(key, {}).get(sub)
            numeric = isinstance(v, float | int) and not isinstance(v, bool)
            values.append("-" if v is None else fmt.format(v * scale if numeric and scale != 1.0 else v))
        return label, values

    rows = [("", names), row("bit-exact", "bit_exact", "{}")]
    if all("us_per_step" in r for r in reports):
        # (a --spec-rows step verifies several rows of one sequence: `tokens_per_s` then
        # counts its steps, and the accepted tokens have rows of their own)
        spec = any("accepted_tokens_per_s" in r for r in reports)
        rows += [row("us per step" if not spec else "us per verify step", "us_per_step"),
                 row("tokens/s per sequence" if not spec else "verify steps/s", "tokens_per_s", "{:.0f}"),
                 *([row("accepted tokens per verify step", "accepted_tokens_per_step"),
                    row("accepted tokens/s", "accepted_tokens_per_s", "{:.0f}")] if spec else []),
                 row("kernels launched per step", "kernels_per_step", "{}"),
                 row("HBM MB per step", "hbm_bytes_per_step", "{:.2f}", scale=1e-6),
                 row("HBM bandwidth, % of peak", "hbm_bw_fraction", "{:.1f}", scale=100),
                 row("% of the floor reached", "fraction_of_floor", "{:.1f}", scale=100),
                 row("% of the mesh floor reached", "fraction_of_mesh_floor", "{:.1f}", scale=100)]
        rows += [row(f"  {part.replace('_', ' ')} (us)", "breakdown_us", sub=part)
                 for part in reports[0].get("breakdown_us", {})]
        first = reports[0]["us_per_step"]
        rows.append((f"speedup (vs {names[0]})",
                     [f"{first / r['us_per_step']:.2f}x" if r["us_per_step"] else "-" for r in reports]))
    else:
        rows += [row("cycles", "cycles", "{:,}"), row("HBM bytes", "hbm_bytes", "{:,}")]
        first = reports[0].get("cycles")
        rows.append((f"speedup (vs {names[0]})",
                     [f"{first / r['cycles']:.2f}x" if first and r.get("cycles") else "-" for r in reports]))
    # (the label column fits the longest label: the speedup row's label names the first program, of any length)
    label_width = max(32, *(len(label) for label, _ in rows))
    width = max(18, *(len(n) for n in names))
    lines = [f"{label:{label_width}s} " + " ".join(f"{v:>{width}s}" for v in values) for label, values in rows]
    if all(r.get("timing_only") for r in reports):
        lines.insert(0, TIMING_ONLY)
    return "\n".join(lines)
