"""One run of a program: compile, load, feed inputs, run, check against the reference.

Two kinds of reference: a plain function (outputs from inputs, checked once after
the launch sequence ran) or a driver (`fn.mkemu_driver = True`, e.g. the K3 decode
driver), which takes over the run through a `Session` and returns its own report.
A driver may also say which compile-time parameters the program needs
(`fn.params(options, machine_info)`), so the program is compiled after the driver
is found. Used by `mkemu run` and `mkemu compare`.
"""

from __future__ import annotations

import inspect
import re
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from mkemu import runner
from mkemu.errors import ConfigError


@attrs.frozen
class RunOptions:
    file: str
    hw: str = "tpu-v7-like"
    mesh: str | None = None
    seed: int = 0
    max_cycles: int = 10**12
    dma_order: str = "round_robin"
    no_check: tuple[str, ...] = ()
    inputs: str | None = None
    params: dict = attrs.Factory(dict)
    trace: str | None = None
    driver: dict = attrs.Factory(dict)   # options for a driver: model, batch, steps, ...


def load_program(path: str, profile, params: dict[str, int]):
    """Assemble a `.s` file or compile a `.mk` file into a Program."""
    from mkemu.isa.asm import assemble

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read program: {exc.strerror}", file=path) from None
    if path.endswith(".mk"):
        from mkemu.dsl.compiler import compile_file

        return compile_file(path, profile=profile, params=params)
    if params:
        raise ConfigError("--set applies to .mk programs only", file=path)
    return assemble(text, path)


_REFERENCE = re.compile(r'^\s*reference\s+"([^"]+)"\s*;', re.M)
_ASM_REFERENCE = re.compile(r"^\s*\.reference\s+(\S+)", re.M)


def declared_reference(path: str) -> str | None:
    """The reference a program's main file names, read before compiling it."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    m = (_REFERENCE if path.endswith(".mk") else _ASM_REFERENCE).search(text)
    return m.group(1) if m else None


def execute(opts: RunOptions, progress=None) -> tuple[dict, Callable[[dict], str]]:
    """Run one program; returns the report (a JSON-ready dict with `bit_exact`) and the
    function that renders it as text."""
    from mkemu.emulator.config import RunConfig
    from mkemu.emulator.machine import Machine
    from mkemu.emulator.topology import Mesh, parse_mesh
    from mkemu.isa.hardware import load_profile
    from mkemu.session import Session

    wall0 = time.perf_counter()
    profile = load_profile(opts.hw)
    mesh = Mesh(parse_mesh(opts.mesh) if opts.mesh else profile.mesh_dims, profile.mesh_wrap,
                profile.links_per_neighbor)
    config = RunConfig(seed=opts.seed, max_cycles=opts.max_cycles, dma_order=opts.dma_order,
                       checks=frozenset({"races", "semaphores"}) - set(opts.no_check))
    reference = None
    name = declared_reference(opts.file)
    if name:
        reference = runner.load_reference_named(name, opts.file)
    driver = reference if getattr(reference, "mkemu_driver", False) else None
    params = dict(opts.params)
    if driver is not None and hasattr(driver, "params"):
        from mkemu.session import machine_info

        params = {**driver.params(_driver_options(opts), machine_info(profile, mesh)), **opts.params}
    t0 = time.perf_counter()
    program = load_program(opts.file, profile, params)
    compile_s = time.perf_counter() - t0
    recorder = None
    if opts.trace:
        from mkemu.emulator.trace import Recorder

        recorder = Recorder()
    machine = Machine(profile, mesh, config, trace=recorder)
    machine.load(program)
    if driver is not None:
        session = Session(machine, program, profile)
        report = driver(session, {**_driver_options(opts), "progress": progress})
        render = getattr(driver, "render", render_plain)
    else:
        report = _run_plain(opts, program, machine, reference)
        render = render_plain
    if recorder is not None:
        runner.atomic_write(opts.trace, recorder.to_bytes())
        report["trace"] = opts.trace
    report["program"] = opts.file
    report["compile_s"] = round(compile_s, 3)
    report["wall_s"] = round(time.perf_counter() - wall0, 3)
    return report, render


def render_plain(report: dict) -> str:
    if report["bit_exact"] is True:
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
        f"unit busy cycles (all cores): {busy}",
        f"stall cycles (all cores): {stalls or 'none'}",
        f"wall {report['wall_s']:.2f} s",
    ]
    return "\n".join(lines)


def _driver_options(opts: RunOptions) -> dict:
    return {"seed": opts.seed, **opts.driver}


def _run_plain(opts: RunOptions, program, machine, reference) -> dict:
    chips = machine.mesh.num_chips
    if opts.inputs:
        given = runner.load_inputs(opts.inputs, program)
    else:
        given = {}
        for chip in range(chips):
            for name, array in runner.generate_inputs(program, opts.seed + 7919 * chip).items():
                given[f"{name}@{chip}"] = array
    inputs = {}
    for buf in program.buffers:
        for chip in range(chips):
            array = given.get(f"{buf.name}@{chip}", given.get(buf.name))
            if array is None:
                continue
            inputs[f"{buf.name}@{chip}"] = array
            try:
                machine.write_buffer(chip, buf.name, runner.to_storage(array, buf.dtype))
            except ValueError as exc:
                raise ConfigError(str(exc), file=opts.inputs, key=buf.name) from None
    report = machine.run().to_json()
    report["chips"] = chips
    report["cores"] = len(machine.cores)
    report["hw"] = machine.profile.name
    report["bit_exact"] = None
    report["mismatch"] = None
    if reference is not None:
        kwargs = {"chips": chips, "cores_per_chip": machine.profile.cores_per_chip}
        if "mesh" in inspect.signature(reference).parameters:
            kwargs["mesh"] = tuple(machine.mesh.dims)   # reduction orders may follow the mesh
        expected = reference(inputs, **kwargs)
        mismatch = _check(program, machine, expected, chips)
        report["bit_exact"] = mismatch is None
        report["mismatch"] = mismatch.render() if mismatch else None
        report["reference"] = program.reference
    return report


def _check(program, machine, expected: dict, chips: int):
    for key, value in expected.items():
        name, _, chip_text = key.partition("@")
        try:
            buf = program.buffer(name)
        except KeyError:
            raise ConfigError(f"the reference returned {name!r}, which is not a buffer of the program",
                              file=program.reference) from None
        for chip in ([int(chip_text)] if chip_text else range(chips)):
            actual = runner.from_storage(machine.read_buffer(chip, name), buf.dtype)
            mismatch = runner.compare(value, actual, name, chip)
            if mismatch:
                return mismatch
    return None


def compare_text(a: dict, b: dict) -> str:
    """Two reports side by side (driver reports per step, or plain runs)."""
    def row(label, key, fmt="{:.2f}", sub=None, scale=1.0):
        values = []
        for r in (a, b):
            v = r.get(key) if sub is None else r.get(key, {}).get(sub)
            numeric = isinstance(v, float | int) and not isinstance(v, bool)
            values.append("-" if v is None else fmt.format(v * scale if numeric and scale != 1.0 else v))
        return f"{label:32s} {values[0]:>18s} {values[1]:>18s}"

    names = [Path(r["program"]).name for r in (a, b)]
    lines = [f"{'':32s} {names[0]:>18s} {names[1]:>18s}", row("bit-exact", "bit_exact", "{}")]
    if "us_per_step" in a and "us_per_step" in b:
        lines += [row("us per step", "us_per_step"),
                  row("tokens/s per sequence", "tokens_per_s", "{:.0f}"),
                  row("kernels launched per step", "kernels_per_step", "{}"),
                  row("HBM MB per step", "hbm_bytes_per_step", "{:.2f}", scale=1e-6),
                  row("HBM bandwidth, % of peak", "hbm_bw_fraction", "{:.1f}", scale=100),
                  row("% of the floor reached", "fraction_of_floor", "{:.1f}", scale=100),
                  row("% of the mesh floor reached", "fraction_of_mesh_floor", "{:.1f}", scale=100)]
        lines += [row(f"  {part.replace('_', ' ')} (us)", "breakdown_us", sub=part)
                  for part in a.get("breakdown_us", {})]
        if b["us_per_step"]:
            lines.append(f"{'speedup (' + names[1] + ')':32s} {a['us_per_step'] / b['us_per_step']:>37.2f}x")
    else:
        lines += [row("cycles", "cycles", "{:,}"), row("HBM bytes", "hbm_bytes", "{:,}")]
    return "\n".join(lines)
