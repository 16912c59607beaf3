"""The Python API: compile a program once, call it on numpy arrays, get arrays and a report.

    import mkemu
    kernel = mkemu.compile("vector_add", hw="test", mesh="1x1x1")   # a file, or a shipped name
    run = kernel(a=a, b=b)                                           # replicated on every chip
    run.output("out"), run.report.cycles, run.check()                # arrays, figures, bit-exactness

`compile` / `compile_source` take the same `Options` as `mkemu run` (or its fields
as keyword arguments). A `Kernel` holds the compiled program and the machine it
runs on; each call runs it on a fresh machine. A program whose reference is a
driver (the K3 programs) is run by the driver instead: `kernel()` returns the
driver's report, and `kernel.session()` gives the `Session` drivers use.

This module, the CLI and `mkemu.run` are the only places that wire the compiler to
the emulator.
"""

from __future__ import annotations

import contextlib
import inspect
import numbers
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import numpy as np

from mkemu import runner
from mkemu.errors import (ConfigError, Diagnostic, EmulatorFault, MkemuError, SourceError, SourceSpan, not_text,
                          shown, source_lines)
from mkemu.isa.program import INPUT_KINDS
from mkemu.options import Options, check_path
from mkemu.session import Session


def _at_reference(path: str, declared: re.Match, message: str) -> MkemuError:
    """`message` about the reference a program names, at its `reference` line (shown,
    with a caret under the name): a ConfigError, as any failing reference is
    (docs/api.md), for a `.mk` program; a SourceError at the `.reference` line, which the
    assembler does not check, for a `.s`."""
    text = declared.string    # (as the front ends number its lines: `runner.declared_reference`)
    line = text.count("\n", 0, declared.start(1)) + 1
    start = text.rfind("\n", 0, declared.start(1)) + 1
    column = declared.start(1) - start + 1
    source_line = source_lines(text)[line - 1]
    if not path.endswith(".s"):
        return ConfigError(message, file=path, line=line, column=column, end_column=column + len(declared.group(1)),
                           source_line=source_line)
    span = SourceSpan(path, line, column, line, column + len(declared.group(1)))
    return SourceError([Diagnostic(span, message, source_line)])


def _missing_reference(error: SourceError) -> ConfigError | None:
    """The compile error of a `.mk` program that is only the front end's finding that its
    reference file is not there (or cannot be read): as the ConfigError any failing
    reference is (docs/api.md), at the same place; else None."""
    if len(error.diagnostics) != 1:
        return None
    d = error.diagnostics[0]
    # (the front end's own messages for that, `Elaborator.reference` in dsl/elaborate.py)
    if not d.message.startswith(("reference file '", "cannot read reference file")):
        return None
    span = d.span
    return ConfigError(d.message, file=span.file, line=span.line, column=span.column,
                       end_column=span.end_column if span.end_line in (None, span.line) else None,
                       source_line=d.source_line)


def compile(program: str, options: Options | None = None, **changes) -> Kernel:  # noqa: A001 (pl-style name)
    """Compile a `.mk` file, assemble a `.s` file, or find a shipped program by name
    (`mkemu programs` lists them); keyword arguments are `Options` fields."""
    from mkemu.shipped import resolve

    if not isinstance(program, (str, os.PathLike)):
        raise ConfigError(f"program must be a file path or a shipped program's name, not {program!r}",
                          key="program")
    check_path(os.fspath(program), "program")
    try:
        path = resolve(os.fspath(program))
    except ConfigError as exc:
        if exc.key != "PROGRAM":   # (the command line's name for it)
            raise
        raise ConfigError(exc.message, file=exc.file, key="program") from None
    return Kernel._build(path, read_program(path), Options.of(options, **changes))


def read_program(path: str) -> str:
    """A program file's text (an error naming it if it cannot be read as text)."""
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read program: {exc.strerror}", file=path) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read program: it is {not_text(exc)}", file=path) from None


@attrs.frozen
class Setup:
    """What a build of a program takes besides its text: the machine and the reference
    with the params its driver sets."""
    profile: object                  # an isa.hardware.HardwareProfile
    mesh: object                     # an emulator.topology.Mesh
    reference: Callable | None       # the reference function, or None
    driver_params: dict[str, int]    # the params its driver sets (none without a driver)


def setup(path: str, text: str, options: Options) -> Setup:
    """The machine of `options` and the program's reference, loaded (a driver's params
    are part of the build: a driver sets some, from the options and the machine)."""
    from mkemu.emulator.topology import Mesh
    from mkemu.session import machine_info

    profile = hw_profile(options.hw)
    mesh = Mesh(options.mesh or profile.mesh_dims, profile.mesh_wrap, profile.links_per_neighbor)
    declared = runner.declared_reference(path, text)
    try:
        reference = runner.load_reference_named(declared.group(1), path) if declared else None
    except ConfigError as exc:
        # A program in error is reported as such (with the line and caret of its
        # reference, if that is what is wrong), not by its reference alone.
        try:
            build_program(path, text, profile, dict(options.params))
        except SourceError as compile_error:
            raise _missing_reference(compile_error) or compile_error from None
        if exc.source_line is not None:   # (at the line of the reference file it failed at)
            raise exc from None
        # (the front end checks only that a reference file exists, and the assembler not
        # even that: what else is wrong with it, at its line here)
        raise _at_reference(path, declared, exc.message) from None
    driver_params: dict[str, int] = {}
    if is_driver(reference):
        if hasattr(reference, "params"):
            driver_params = _driver_params(runner.call_hook(reference.params, options.driver_options(),
                                                            machine_info(profile, mesh), program_path=path),
                                           reference.params, path)
        if hasattr(reference, "check_overrides"):   # (before the compile: see programs/k3/driver.py)
            runner.call_hook(reference.check_overrides, driver_params, dict(options.params), program_path=path)
    elif options.driver_options_set():
        names = options.driver_options_set()
        raise ConfigError(f"{', '.join(names)} appl{'ies' if len(names) == 1 else 'y'} only to programs run by a "
                          f"driver (e.g. the K3 programs), not to {Path(path).name}", key=names[0])
    return Setup(profile, mesh, reference, driver_params)


def _driver_params(values, hook, path: str) -> dict[str, int]:
    """What a driver's `params` hook returned, as the params it sets: a dict of names to
    integers (numpy integers too; a bool is left for the params' own check to refuse)."""
    where = runner.defined_at(hook)
    if not isinstance(values, dict):
        raise ConfigError(f"the program's driver hook {hook.__qualname__} returned {type(values).__name__}, not a "
                          f"dict of param names to integers{where}", file=path)
    for name, value in values.items():
        if not isinstance(name, str) or not isinstance(value, numbers.Integral):
            raise ConfigError(f"the program's driver hook {hook.__qualname__} returned {shown(name)}: "
                              f"{shown(value)}, not a param name and an integer{where}", file=path)
    return {name: value if isinstance(value, bool) else int(value) for name, value in values.items()}


def compile_source(text: str, filename: str = "<source>.mk", options: Options | None = None,
                   **changes) -> Kernel:
    """Compile `.mk` source text (or `.s` text if `filename` ends in `.s`). Imports and a
    reference file are looked up relative to `filename`'s folder (the current folder
    for a bare name); errors name `filename`."""
    if not isinstance(text, str):
        raise ConfigError(f"compile_source takes the program's text (a str), not {type(text).__name__}",
                          key="text")
    if not isinstance(filename, (str, os.PathLike)):
        raise ConfigError(f"filename must be a str or a path, not {filename!r}", key="filename")
    check_path(os.fspath(filename), "filename")
    return Kernel._build(os.fspath(filename), text, Options.of(options, **changes))


@attrs.frozen
class BufferInfo:
    name: str
    dtype: str                 # "f32", "bf16" (given and returned as float32 arrays of bf16 values) or "i32"
    shape: tuple[int, ...]
    kind: str                  # "input", "inout", "output", "weight", "scratch", ...


class Kernel:
    """A compiled program on a machine (profile and mesh from the options)."""

    def __init__(self, path: str, program, profile, mesh, options: Options, reference, compile_s: float):
        self.path = path
        self.program = program
        self.profile = profile
        self.mesh = mesh
        self.options = options
        self.reference = reference           # the reference function, or None
        self.compile_s = compile_s

    @classmethod
    def _build(cls, path: str, text: str, options: Options) -> Kernel:
        s = setup(path, text, options)
        t0 = time.perf_counter()
        program = build_program(path, text, s.profile, {**s.driver_params, **options.params})
        reference = s.reference
        if reference is None and program.reference:
            # Named where the line scan of `setup` does not look (after another statement
            # on its line): taken from the program, never left unchecked.
            reference = runner.load_reference_named(program.reference, path)
        return cls(path, program, s.profile, s.mesh, options, reference, time.perf_counter() - t0)

    # -- what the program is ---------------------------------------------------

    @property
    def chips(self) -> int:
        return self.mesh.num_chips

    @property
    def cores_per_chip(self) -> int:
        return self.profile.cores_per_chip

    @property
    def buffers(self) -> dict[str, BufferInfo]:
        return {b.name: BufferInfo(b.name, b.dtype, tuple(b.shape), b.kind) for b in self.program.buffers}

    @property
    def is_driven(self) -> bool:
        """True if the program's reference is a driver that runs it (call it with no inputs)."""
        return is_driver(self.reference)

    # -- running ---------------------------------------------------------------

    def session(self) -> Session:
        """A fresh machine with the program loaded, as a driver sees it."""
        machine, recorder = self._machine()
        return Session(machine, self.program, self.profile, recorder=recorder)

    def generate_inputs(self, seed: int | None = None) -> dict[str, np.ndarray]:
        """Deterministic inputs for every input/inout/weight buffer on every chip, as
        `name@chip` (what `mkemu run` uses when no --inputs is given)."""
        # (validated as the seed option is: a bad one is a ConfigError, not numpy's TypeError)
        seed = self.options.seed if seed is None else Options.of(seed=seed).seed
        out = {}
        for chip in range(self.chips):
            for name, array in runner.generate_inputs(self.program, seed + 7919 * chip).items():
                out[f"{name}@{chip}"] = array
        return out

    def __call__(self, inputs: Mapping[str, np.ndarray] | str | None = None, /, progress=None,
                 **arrays) -> Run:
        """Run once. Inputs by buffer name: `name` (the same array on every chip) or
        `name@chip` (one chip), from a mapping, a `.npz` file and/or keyword arguments;
        buffers not given start as zeros. With no inputs at all, inputs are generated
        from the seed. A driven program takes no inputs: its driver writes them."""
        if progress is not None and not callable(progress):
            raise ConfigError(f"progress takes a callable (a driver's per-step report), not "
                              f"{type(progress).__name__}; give a buffer named 'progress' in the inputs "
                              "dict: kernel({'progress': array})", key="progress")
        source = None
        if isinstance(inputs, (str, os.PathLike)):
            source = os.fspath(inputs)
            check_path(source, "inputs")
            if self.is_driven:     # (said before the file is read, whatever its buffers)
                raise _writes_own_inputs(self.path)
            inputs = runner.load_inputs(source, self.program)
        elif inputs is not None and not isinstance(inputs, Mapping):
            raise ConfigError(f"inputs are a dict of arrays by buffer ('name' or 'name@chip') or the path of a "
                              f".npz file, not {type(inputs).__name__}", key="inputs")
        given = {**(inputs or {}), **arrays}
        # Files written after the run: checked before it, not after it.
        if isinstance(self.options.trace, str):
            runner.check_writable(self.options.trace, "trace")
        if self.options.record_routing is not None and self.is_driven:
            runner.check_writable(self.options.record_routing, "record_routing")
        if self.options.dump is not None and self.is_driven:
            runner.check_dump_folder(self.options.dump, "dump")
        wall0 = time.perf_counter()
        if self.is_driven:
            if given:
                raise _writes_own_inputs(self.path)
            session = self.session()
            with self._trace_on_fault(session.recorder):
                figures = runner.call_driver(self.reference, session,
                                             {**self.options.driver_options(), "progress": progress}, self.path)
            self._save_trace(figures, session.recorder)
            # (the buffers as the driver's last run left them)
            def read_driven(chip: int, name: str) -> np.ndarray:
                return session.read(name, chip)

            return Run(self, {}, self._outputs(read_driven, session.holds_data), figures, session.recorder,
                       time.perf_counter() - wall0, read=read_driven)
        machine, recorder = self._machine()
        written = self._write_inputs(machine, given if given else self.generate_inputs(), source)
        with self._trace_on_fault(recorder):
            figures = machine.run().to_json()
        figures.update(chips=self.chips, cores=len(machine.cores), hw=self.profile.name)
        self._save_trace(figures, recorder)

        def read(chip: int, name: str) -> np.ndarray:
            buf = self.program.buffer(name)
            try:
                return runner.from_storage(machine.read_buffer(chip, name), buf.dtype, buf.shape)
            except ValueError as exc:   # a timing-only run holds no data in it
                raise ConfigError(str(exc), key=name) from None

        return Run(self, written, self._outputs(read, machine.holds_data), figures, recorder,
                   time.perf_counter() - wall0, read=read)

    def _outputs(self, read, holds_data) -> dict[str, np.ndarray]:
        """Every output and inout buffer of every chip after a run, `name@chip` ->
        `read(chip, name)` (a timing-only run's hold no data, but the i32 ones)."""
        return {f"{b.name}@{chip}": read(chip, b.name) for b in self.program.buffers
                if b.kind in ("output", "inout") and holds_data(b.name) for chip in range(self.chips)}

    @contextlib.contextmanager
    def _trace_on_fault(self, recorder):
        """A run that faults still writes its trace (given as a path), ending at the fault:
        where the time went before it is what a kernel author looks at next. The fault
        names the file."""
        try:
            yield
        except EmulatorFault as fault:
            if recorder is not None:
                recorder.on_fault(fault)
            if self._save_trace({}, recorder):
                fault.details = (*fault.details, f"trace up to the fault: {self.options.trace}")
                fault.args = (fault.render(),)     # (str(fault) says it too)
            raise
        finally:
            if recorder is not None:
                recorder.detach()

    def _save_trace(self, figures: dict, recorder) -> bool:
        """`trace` given as a path: the trace is written there (atomically) after the run,
        and `figures` name it. Was it written?"""
        if not (isinstance(self.options.trace, str) and recorder is not None):
            return False
        runner.atomic_write(self.options.trace, recorder.to_bytes())
        figures["trace"] = self.options.trace
        return True

    def expected(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The program's reference applied to `inputs` (`name@chip` keys, or `name` for
        every chip, as a run takes them), by the reference contract: `chips`,
        `cores_per_chip` and, if it asks, `mesh`."""
        if self.is_driven:
            raise ConfigError("this program is run by its driver, which checks the outputs itself "
                              "(report.bit_exact, report.mismatch)", file=self.path)
        if self.reference is None:
            raise ConfigError("the program names no reference function to compute expected outputs",
                              file=self.path)
        if not isinstance(inputs, Mapping):
            raise ConfigError(f"expected() takes the inputs as a dict name@chip -> array (e.g. run.inputs), not "
                              f"{type(inputs).__name__}", key="inputs")
        # As a run takes them: checked, each chip's values as its buffer holds them (a
        # plain `name` the same on every chip; bf16 rounded, ...), and a buffer not given
        # zeros.
        given = {key: values for key, (_, _, _, values) in self._stored(inputs).items()}
        for b in self.program.buffers:
            for key in (f"{b.name}@{chip}" for chip in range(self.chips)):
                if b.kind in INPUT_KINDS and key not in given:
                    given[key] = np.zeros(b.shape, np.int32 if b.dtype == "i32" else np.float32)
        kwargs = {"chips": self.chips, "cores_per_chip": self.cores_per_chip}
        if "mesh" in inspect.signature(self.reference).parameters:
            kwargs["mesh"] = tuple(self.mesh.dims)   # reduction orders may follow the mesh
        expected = runner.call_reference(self.reference, given, kwargs, self.path)
        if not isinstance(expected, Mapping):
            raise ConfigError(f"reference function {self.reference.__qualname__} returned "
                              f"{type(expected).__name__}, not a dict of expected outputs (name or name@chip "
                              "-> array)", file=self.path)
        return expected

    def _machine(self):
        from mkemu.emulator.machine import Machine

        recorder = None
        if self.options.trace is not None:
            from mkemu.emulator.trace import Recorder

            recorder = Recorder()
        machine = Machine(self.profile, self.mesh, self.options.run_config(), trace=recorder)
        machine.load(self.program)
        return machine, recorder

    def _write_inputs(self, machine, given: Mapping[str, np.ndarray], source: str | None = None) -> dict:
        """Write `given` into the machine's buffers; what was written (`_stored`)."""
        written = {}
        for key, (buf, chip, stored, values) in self._stored(given, source).items():
            try:
                machine.write_buffer(chip, buf.name, stored)
            except ValueError as exc:
                raise ConfigError(str(exc), file=source, key=key) from None
            written[key] = values
        return written

    def _stored(self, given: Mapping[str, np.ndarray], source: str | None = None) -> dict:
        """`given` (`name` or `name@chip` keys) checked and put in each buffer's storage
        form, per `name@chip`: (buffer, chip, the bytes as HBM holds them, and the values
        the buffer then holds: bf16-rounded float32, float32, int32, quantised MXFP4, as
        the reference contract hands them on, not the array as given)."""
        names = {b.name for b in self.program.buffers}
        arrays = {}
        for key in given:
            if not isinstance(key, str):
                raise ConfigError(f"inputs are named by buffer ('name' or 'name@chip'), not {key!r}",
                                  file=source, key=str(key))
            name, at, chip = key.partition("@")
            if name not in names:
                raise ConfigError(f"no buffer named {name!r} in the program (buffers: {', '.join(sorted(names))})",
                                  file=source, key=key)
            if at and not runner.is_chip_text(chip, self.chips):
                raise runner.bad_chip_key(key, self.chips, source)
            array = runner.as_array(given[key], f"buffer {name}", file=source, key=key)
            arrays[key] = runner.widened(array)
            runner.check_values(name, self.program.buffer(name).dtype, arrays[key], file=source, key=key,
                                given=array.dtype)
        stored = {}
        for buf in self.program.buffers:
            for chip in range(self.chips):
                key = f"{buf.name}@{chip}" if f"{buf.name}@{chip}" in arrays else buf.name
                array = arrays.get(key)
                if array is None:
                    continue
                try:
                    bits = runner.to_storage(array, buf.dtype)
                    buf.check_storage_shape(np.shape(bits))
                    values = runner.from_storage(bits, buf.dtype, buf.shape)
                except ValueError as exc:
                    raise ConfigError(str(exc), file=source, key=key) from None
                # (A copy: an f32 array may pass through as itself, and a caller that
                # refills it for the next run must not change what this run's check()
                # compares against.)
                stored[f"{buf.name}@{chip}"] = (buf, chip, bits, np.array(values).reshape(buf.shape))
        return stored


def hw_profile(hw: str):
    """The hardware profile the `hw` option names; an unknown name is that option's error
    (a profile file's own errors name the file and the key)."""
    from mkemu.isa.hardware import load_profile

    try:
        return load_profile(hw)
    except ConfigError as exc:
        if exc.file is not None or exc.key is not None:
            raise
        raise ConfigError(exc.message, key="hw") from None


def is_driver(reference) -> bool:
    return bool(getattr(reference, "mkemu_driver", False))


def build_program(path: str, text: str, profile, params: dict[str, int], cache: bool = True):
    """The Program of a `.s` or `.mk` text; a `.mk` one from the compile cache unless
    `cache` is False (then compiled afresh, and not stored)."""
    from mkemu.isa.asm import assemble

    if path.endswith(".s"):
        if params:
            raise ConfigError("params (--set) apply to .mk programs only", file=path, key="params")
        return assemble(text, path, smem_bytes=profile.smem_bytes)
    from mkemu.cache import cached_program

    def build():
        from mkemu.dsl.compiler import compile_program
        from mkemu.dsl.frontend import load_program

        loaded = load_program(path, params, text=text)
        return compile_program(loaded, profile), loaded.sources

    return cached_program(path, text, profile, params, build)[0] if cache else build()[0]


class Report:
    """The figures of one run. `cycles` and `seconds` are emulated (at the profile's
    clock; for a driven program, all steps together); `breakdown` says where the time
    went (plain runs: stall cycles by reason and the cycles halted cores idled, summed
    over cores; driven runs: the driver's breakdown, e.g. K3's microseconds per step);
    `figures` is everything `mkemu run --json` prints; `trace` is the recorded trace
    (a `mkemu.tools.trace_reader.Trace`) if the options asked for one, else None."""

    def __init__(self, figures: dict, clock_hz: float, recorder):
        self.figures = figures
        self.cycles = int(figures["cycles"] if "cycles" in figures else sum(figures.get("cycles_per_step", [])))
        if "breakdown_us" in figures:       # a driver's (K3's)
            self.breakdown = dict(figures["breakdown_us"])
        else:
            # (a driver's own figures may have cycles without the stall and idle counts of a run's)
            self.breakdown = {**figures.get("stall_cycles", {}), "idle": figures.get("idle_cycles", 0)}
        self.seconds = self.cycles / clock_hz
        self.bit_exact = figures.get("bit_exact")
        self.mismatch = figures.get("mismatch")
        self._recorder = recorder
        self._trace = None

    @property
    def trace_bytes(self) -> bytes | None:
        return self._recorder.to_bytes() if self._recorder is not None else None

    @property
    def trace(self):
        if self._trace is None and self._recorder is not None:
            from mkemu.tools.trace_reader import parse_trace

            self._trace = parse_trace(self.trace_bytes, str(self.figures.get("trace", "<trace>")))
        return self._trace

    def __repr__(self) -> str:
        return f"Report(cycles={self.cycles}, seconds={self.seconds:.3e}, bit_exact={self.bit_exact})"


class Run:
    """One call of a kernel: the inputs written (`name@chip`), the outputs read back
    (`name@chip`, every output and inout buffer of every chip), and the report."""

    def __init__(self, kernel: Kernel, inputs: dict, outputs: dict, figures: dict, recorder, wall_s: float,
                 read: Callable | None = None):
        self.kernel = kernel
        self.inputs = inputs
        self.outputs = outputs
        figures.setdefault("bit_exact", None)
        figures.setdefault("mismatch", None)
        self.wall_s = wall_s
        self._read = read
        self.report = Report(figures, kernel.profile.clock_hz, recorder)

    def output(self, name: str, chip: int = 0) -> np.ndarray:
        """Buffer `name` of chip `chip` after the run (any buffer, not only outputs)."""
        if not runner.is_chip(chip, self.kernel.chips):
            raise ConfigError(f"chip must be 0..{self.kernel.chips - 1}, not {shown(chip)}", key=f"{name}@{shown(chip)}")
        key = f"{name}@{chip}"
        if key in self.outputs:
            return self.outputs[key]
        if self._read is None:
            raise ConfigError(f"no output {key!r} in this run", key=key)
        try:
            self.kernel.program.buffer(name)
        except KeyError:
            raise ConfigError(f"the program has no buffer {name!r}", key=name) from None
        return self._read(chip, name)

    def _check_covered(self, expected: Mapping, source) -> None:
        """A reference that leaves out an output would let `check()` pass without looking
        at it: every output buffer (else, if the program has none, every inout one) must
        have an expected value, for every chip (`name`) or some (`name@chip`)."""
        given = {str(key).partition("@")[0] for key in expected}
        kinds = [b for b in self.kernel.program.buffers if b.kind == "output"] or [
            b for b in self.kernel.program.buffers if b.kind == "inout"]
        missing = [b.name for b in kinds if b.name not in given]
        if missing:
            names = ", ".join(repr(n) for n in missing)
            returned = ", ".join(repr(str(key)) for key in list(expected)[:8]) + (", ..." if len(expected) > 8 else "")
            raise ConfigError(f"the reference gives no expected value for output {names}, so it would not be "
                              f"checked: return {missing[0]!r} (every chip) or '{missing[0]}@CHIP' (it returned "
                              f"{returned or 'nothing'})", file=source)

    def check(self, expected: Mapping[str, np.ndarray] | None = None) -> runner.Mismatch | None:
        """Compare bit for bit with `expected` (`name@chip`, or `name` for every chip
        without a `name@chip` of its own; default: the program's reference on this run's
        inputs). Returns the first
        difference, or None; also records the outcome in the report."""
        # A bad entry is named in the reference's file when the reference gave it,
        # and by its key alone when the caller did.
        source = self.kernel.program.reference or self.kernel.path if expected is None else None
        if expected is None:
            # (a buffer not given started as zeros: `expected` hands the reference zeros too)
            expected = self.kernel.expected(self.inputs)
            self._check_covered(expected, source)
        elif not isinstance(expected, Mapping):
            raise ConfigError(f"check() takes a dict of expected outputs (name or name@chip -> array), not "
                              f"{type(expected).__name__}", key="expected")
        elif not expected:
            raise ConfigError("check() was given no expected outputs: nothing would be compared, and the run "
                              "would be recorded bit-exact", key="expected")
        else:
            self._check_names_an_output(expected)
        mismatch = None
        # (a `name@chip` entry wins over `name` for its chip, as for inputs)
        own = {(name, int(chip)) for name, at, chip in (k.partition("@") for k in expected if isinstance(k, str))
               if at and runner.is_chip_text(chip, self.kernel.chips)}
        for key, value in expected.items():
            if not isinstance(key, str):
                raise ConfigError(f"expected outputs are named 'name' or 'name@chip', not {key!r}", file=source,
                                  key=str(key))
            name, at, chip_text = key.partition("@")
            if at and not runner.is_chip_text(chip_text, self.kernel.chips):
                raise runner.bad_chip_key(key, self.kernel.chips, source)
            try:
                buf = self.kernel.program.buffer(name)
            except KeyError:
                raise ConfigError(f"expected output {name!r} is not a buffer of the program", file=source,
                                  key=key) from None
            value = runner.as_array(value, f"expected output {key!r}", file=source, key=key)
            if value.dtype.kind not in "biuf" and runner.object_numbers(value) is None:
                # (a structured array cannot even be compared; numbers held as objects, e.g.
                # a list holding 2**70, are compared as the numbers they are)
                # bf16 outputs are compared as float32 arrays of bf16 values (as runs return them).
                hint = "; give bf16 values as float32 (.astype(np.float32))" if "bfloat16" in str(value.dtype) else ""
                raise ConfigError(f"expected output {key!r} is an array of {value.dtype}, not numbers{hint}",
                                  file=source, key=key)
            chips = [int(chip_text)] if at else [c for c in range(self.kernel.chips) if (name, c) not in own]
            for chip in chips:
                mismatch = runner.compare(value, self.output(buf.name, chip), name, chip, buf.dtype)
                if mismatch:
                    break
            if mismatch:
                break
        self.report.bit_exact = mismatch is None
        self.report.mismatch = mismatch.render() if mismatch else None
        self.report.figures.update(bit_exact=self.report.bit_exact, mismatch=self.report.mismatch)
        return mismatch

    def _check_names_an_output(self, expected: Mapping) -> None:
        """Expected values given only for buffers that are not outputs (inputs, weights,
        scratch) of a program that has outputs would compare none of them and still
        record the run bit-exact. (A program without outputs, whose kernels write into
        an input struct's members, is checked by what it has.)"""
        kinds = {b.name: b.kind for b in self.kernel.program.buffers}
        outputs = [n for n, k in kinds.items() if k in ("output", "inout")]
        names = [key.partition("@")[0] for key in expected if isinstance(key, str)]
        if outputs and len(names) == len(expected) and all(name in kinds for name in names) \
                and not any(kinds[name] in ("output", "inout") for name in names):
            given = ", ".join(f"{n} ({kinds[n]})" for n in sorted(set(names)))
            raise ConfigError(f"check() was given expected values only for {given}, none of them an output of the "
                              f"program (its outputs: {', '.join(outputs)}): no output would be compared, and the "
                              "run would be recorded bit-exact", key="expected")


def _writes_own_inputs(path: str) -> ConfigError:
    return ConfigError("this program's driver writes its own inputs; call it with none", file=path)
