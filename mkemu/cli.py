"""The `mkemu` command line: the only place that wires the compiler to the emulator.

Every `MkemuError` is printed as the user's error and exits 1; a usage error
exits 2. Anything else escaping is a bug in mkemu and shows as such.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import re
import signal
import sys
import time
from pathlib import Path

import attrs

from mkemu.command import Terminated, terminate
from mkemu.errors import ConfigError, MkemuError
from mkemu.isa.hardware import DEFAULT_PROFILE


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(_negative_values_joined(parser, sys.argv[1:] if argv is None else argv))
    _more_positionals(parser, args, extra)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)     # (a usage error: stdout stays empty, as for every other)
        return 2
    try:
        try:
            code = args.func(args)
            sys.stdout.flush()      # (so a failed write of the output, e.g. to a full disk, is reported here)
            return code
        finally:
            _loop_loaded()
    except MkemuError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    except MemoryError as exc:
        # (inputs or memories larger than the host has: numpy's or `anonymous`'s refusal)
        print(f"error: the host ran out of memory: {exc or 'an allocation failed'} (smaller buffers, or a smaller "
              "model, batch or mesh, need less; a --timing-only run keeps data in i32 buffers only)", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        print("terminated" if terminated else "interrupted", file=sys.stderr)
        return 143 if terminated else 130
    except BrokenPipeError:
        return 0
    except OSError as exc:
        return _write_failed(exc)
    except Exception as exc:
        from mkemu.cache import cache_dir, damaged_compiled_code

        if not damaged_compiled_code(exc):
            raise
        print(f"{cache_dir()}: error: a file of the compiled code kept there was damaged ({type(exc).__name__}: "
              f"{exc}); it is cleared: run the command again, which compiles it afresh", file=sys.stderr)
        return 1


def _more_positionals(parser: argparse.ArgumentParser, args, extra: list[str]) -> None:
    """Files after an option (`mkemu trace diff --json A B`, `mkemu sweep P1 --mesh 1 P2`)
    join the command's list of them: argparse ends a list at the first option and takes
    nothing after it (`parse_intermixed_args` is not offered with subcommands). Any
    other leftover is argparse's usage error, exit status 2."""
    listed = next((name for name in ("others", "files") if isinstance(getattr(args, name, None), list)), None)
    if extra and listed is not None and not any(token.startswith("-") for token in extra):
        getattr(args, listed).extend(extra)
    elif extra:
        getattr(args, "command_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")


def _write_failed(exc: OSError) -> int:
    """An error the commands do not turn into a message of their own: writing the
    standard output (a full disk: `> /dev/full`), or a file read or written under them.
    One line; the standard output's unwritten bytes go nowhere, so the exit does not
    fail on them again."""
    if exc.filename is None:
        print(f"error: cannot write the standard output: {exc.strerror or exc}", file=sys.stderr)
    else:
        print(f"{exc.filename}: error: {exc.strerror or exc}", file=sys.stderr)
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 1


def _negative_values_joined(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`--mesh -2x1x1` as `--mesh=-2x1x1` (and `-o -x.txt` as `-o-x.txt`): argparse takes
    a value that starts with a dash for an option of its own, and fails with its usage
    text; joined, the option's own check reports it in one line. A following token that
    is an option of the command is left alone."""
    takes_value: set[str] = set()
    options: set[str] = {"--"}
    parsers = [parser]
    while parsers:
        for action in parsers.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers += action.choices.values()
                continue
            options.update(action.option_strings)
            if action.option_strings and action.nargs != 0:
                takes_value.update(action.option_strings)
    out, i = [], 0
    while i < len(argv):
        token = argv[i]
        value = argv[i + 1] if i + 1 < len(argv) else None
        if token in takes_value and value is not None and value.startswith("-") and value != "-" \
                and value.partition("=")[0] not in options:
            out.append(f"{token}={value}" if token.startswith("--") else f"{token}{value}")
            i += 2
        else:
            out.append(token)
            i += 1
    return out


def _release_pool_semaphores() -> None:
    """Before an interrupted command ends with `os._exit`: give back the named
    semaphores a stopped worker pool's queues hold, so multiprocessing's resource
    tracker does not warn of leaked ones after the `interrupted` line. Only the
    finalizers of priority 0 and up run (the semaphores' release, the queues' close);
    the one that joins a queue's feeder thread (priority -5), which could hang on a
    worker stopped mid-write, does not. (`multiprocessing.util._run_finalizers` is
    what the interpreter's exit would run, with no priority bound.)"""
    util = sys.modules.get("multiprocessing.util")
    if util is None:
        return
    with contextlib.suppress(Exception):
        util._run_finalizers(0)


def _loop_loaded() -> None:
    """Wait for a thread still loading the compiled loop (`emulator.loop.load_ahead`): an
    error found early must not end the process under it (an interrupt while waiting is
    an interrupt of the command)."""
    loop = sys.modules.get("mkemu.emulator.loop")
    if loop is not None:
        loop.loaded()


def entry() -> int:
    """The `mkemu` command: `main`, then the process ends without collecting its heap.

    The interpreter's shutdown runs full garbage collections over every object still
    alive (numba's alone are some 100 k); frozen, they are skipped. After the main
    job, shutdown took 0.26-0.39 s, and takes 0.07-0.08 s frozen. Outputs are closed
    (written atomically) before `main` returns, and the standard streams are flushed
    at shutdown as always.

    An interrupted command (exit status 130) ends at once, without joining the threads
    a worker pool may leave behind (its workers are stopped; a pool's manager thread
    caught mid-operation by the interrupt could otherwise hold the exit forever). A
    terminated one (SIGTERM, exit status 143) ends the same way: the signal is raised as
    an interrupt, so an output being written is removed, not left half-written."""
    signal.signal(signal.SIGTERM, terminate)
    code = main()
    if code in (130, 143):
        _release_pool_semaphores()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    gc.freeze()
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mkemu", description="Cycle-approximate TPU-like emulator "
                                     "and the .mk kernel language.")
    sub = parser.add_subparsers(metavar="COMMAND")

    run = sub.add_parser("run", help="compile (if .mk), run and check a program")
    run.add_argument("file", metavar="PROGRAM", help="a .mk or .s file, or a shipped program's name "
                     "(`mkemu programs`)")
    _machine_options(run)
    run.add_argument("--inputs", metavar="NPZ", help="input arrays (default: generated from --seed)")
    run.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    run.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                     help="set a .mk program's parameter (repeatable)")
    run.add_argument("--trace", metavar="PATH", help="record a trace to PATH (read it with `mkemu trace`)")
    run.add_argument("--schedules", type=integer, default=0, metavar="N",
                     help="also run N adversarial DMA schedules (the first lands every DMA as late as "
                          "synchronisation allows, the others land them in seeded random orders) and "
                          "report any that change bits, fault or deadlock (at most 1000)")
    _driver_options(run)
    run.add_argument("--dump", metavar="DIR", help="K3: write weights, inputs, reference and emulator "
                     "outputs as .npz files into DIR")
    run.set_defaults(func=cmd_run)

    compare = sub.add_parser("compare", help="run two or more programs with the same options, side by side")
    compare.add_argument("first", metavar="PROGRAM", help="the first program (a .mk or .s file, or a "
                         "shipped program's name): the speedups are over it")
    compare.add_argument("others", metavar="PROGRAM", nargs="+", help="the programs compared with it")
    _machine_options(compare)
    _driver_options(compare)
    compare.add_argument("--inputs", metavar="NPZ", help="input arrays for every (plain) program "
                         "(default: generated from --seed)")
    compare.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    compare.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                         help="set a parameter of every .mk program (repeatable)")
    compare.set_defaults(func=cmd_compare)

    programs = sub.add_parser("programs", help="list the shipped programs (run one by name)")
    programs.set_defaults(func=cmd_programs)

    asm = sub.add_parser("asm", help="print the assembler listing of a program")
    asm.add_argument("file", metavar="PROGRAM", help="a .mk or .s file, or a shipped program's name")
    asm.add_argument("--hw", default=DEFAULT_PROFILE, metavar="NAME|PATH",
                     help="the hardware profile it compiles for (its limits: VMEM, SMEM, semaphores, "
                          f"registers; default {DEFAULT_PROFILE})")
    asm.add_argument("--stats", action="store_true", help="add allocation map, counts and compile time")
    asm.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                     help="set a .mk program's parameter (repeatable)")
    asm.add_argument("-o", "--output", metavar="FILE", help="write the listing to FILE")
    asm.add_argument("--params", action="store_true",
                     help="list a .mk program's params (value, default, values, description, file:line) instead")
    asm.set_defaults(func=cmd_asm)

    tune = sub.add_parser("tune", help="search a program's params for the fastest bit-exact build",
                          description="Compile and run variants of a .mk program's params; keep only "
                          "bit-exact ones; rank them against the default build (docs/tuning.md).")
    tune.add_argument("file", metavar="PROGRAM", help="the program tuned (a .mk file, or a shipped program's name)")
    _machine_options(tune)
    _driver_options(tune)
    tune.add_argument("--inputs", metavar="NPZ", help="input arrays (default: generated from --seed)")
    tune.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                      help="fix a program parameter in every variant (repeatable)")
    tune.add_argument("--param", action="append", default=[], metavar="NAME[=V1,V2,...]",
                      help="tune NAME over these values (default: its declared values); repeatable. "
                      "Without --param: every param that declares its values")
    tune.add_argument("--budget", type=integer, default=32, metavar="N",
                      help="at most N variants (default 32); a bigger space is searched with optuna")
    tune.add_argument("--objective", choices=("us_per_step", "cycles"), default="us_per_step",
                      help="what to minimise (default us_per_step; a plain program's run is one step)")
    tune.add_argument("--schedules", type=integer, default=None, metavar="N",
                      help="also run every bit-exact variant under N adversarial DMA schedules (as mkemu run "
                           "--schedules N: the first lands every DMA as late as synchronisation allows, the "
                           "others in seeded random orders) and reject any that changes bits, faults or "
                           "deadlocks (at most 1000). Default: only the best is run again, under the late "
                           "schedule, and if it fails the next best; 0: no variant runs under another schedule")
    _scale_out_options(tune)
    tune.add_argument("--out", metavar="JSON", help="the record of every trial (default: PROGRAM's name "
                      "+ .tune.json in this folder; --resume's file when resuming)")
    tune.add_argument("--resume", metavar="JSON", help="continue a tune from its record: finished trials are "
                      "not run again")
    tune.set_defaults(func=cmd_tune)

    sweep = sub.add_parser("sweep", help="run programs over hardware-profile values and mesh shapes",
                           description="Run every program at every combination of the --hw-set and "
                           "--mesh values; say per point what each is bound by (docs/tuning.md).")
    sweep.add_argument("files", nargs="+", metavar="PROGRAM", help="the programs run at every point (.mk or .s "
                       "files, or shipped programs' names), side by side")
    _machine_options(sweep, mesh=False)
    sweep.add_argument("--hw-set", action="append", default=[], metavar="KEY=V1,V2,...",
                       help="vary a profile value (a key of a profile TOML, e.g. hbm_bw_bytes_per_s, "
                       "ici.hop_latency_s, vmem_bytes, mxus_per_core, clock_hz, "
                       "timing.valu.latency_cycles); repeatable")
    sweep.add_argument("--mesh", metavar="M1,M2,...", help="vary the chip mesh, e.g. 1x1x1,2x1x1,2x2x2")
    _driver_options(sweep)
    sweep.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                       help="set a program parameter (every program; repeatable)")
    _scale_out_options(sweep)
    sweep.add_argument("--out", metavar="JSON", help="write every point's figures and reports to JSON")
    sweep.add_argument("--plot", metavar="PNG", help="plot us per step against the first varied value "
                       "(needs matplotlib)")
    sweep.set_defaults(func=cmd_sweep)

    trace = sub.add_parser("trace", help="summarise a trace; `trace diff A B` compares two",
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           description="mkemu trace PATH [options] | mkemu trace diff A B [options]\n\n"
                                       "diff compares two traces' figures (B against A) over the same\n"
                                       "filters (--chip, --core, --region, --from, --to) and takes --json;\n"
                                       "the exports and --top apply to one trace.")
    trace.add_argument("path", metavar="PATH", help="a trace written by `mkemu run --trace` (or `diff`)")
    # (a default: argparse counts a "*" positional without one among the required arguments)
    trace.add_argument("others", nargs="*", default=[], metavar="B", help=argparse.SUPPRESS)
    trace.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    trace.add_argument("--chip", type=integer, action="append", metavar="N", help="only chip N (repeatable)")
    trace.add_argument("--core", type=integer, action="append", metavar="N", help="only core N of each chip (repeatable)")
    trace.add_argument("--region", metavar="NAME", help="only cycles inside region NAME, NAME[INDEX] or kernel:NAME")
    trace.add_argument("--from", dest="start", type=integer, metavar="CYCLE", help="window start cycle")
    trace.add_argument("--to", dest="end", type=integer, metavar="CYCLE", help="window end cycle (exclusive)")
    trace.add_argument("--top", type=integer, metavar="N", help="how many HBM bubble sites to list (default 5)")
    trace.add_argument("--perfetto", metavar="OUT",
                       help="write a Perfetto trace (open at ui.perfetto.dev) to OUT.pftrace or OUT.json: a name "
                            "ending in .json gets Chrome trace-event JSON (also chrome://tracing), any other a "
                            "protobuf trace; honours --chip/--core/--from/--to")
    trace.add_argument("--html", metavar="OUT.html", help="write a timeline page (self-contained HTML/SVG); "
                       "honours --chip/--core/--from/--to")
    trace.add_argument("--plot", metavar="OUT.png", help="write a timeline PNG (needs the [plot] extra: "
                       "matplotlib); honours --chip/--core/--from/--to")
    trace.set_defaults(func=cmd_trace)

    hw = sub.add_parser("hw", help="hardware profiles")
    hw.set_defaults(func=lambda args: _usage(hw))
    hw_sub = hw.add_subparsers(metavar="ACTION")
    hw_list = hw_sub.add_parser("list", help="list the shipped profiles")
    hw_list.set_defaults(func=cmd_hw_list)
    hw_show = hw_sub.add_parser("show", help="show one profile")
    hw_show.add_argument("name", metavar="NAME|PATH")
    hw_show.set_defaults(func=cmd_hw_show)

    model = sub.add_parser("model", help="model configs (Kimi K3 shapes)")
    model.set_defaults(func=lambda args: _usage(model))
    model_sub = model.add_subparsers(metavar="ACTION")
    model_list = model_sub.add_parser("list", help="list the shipped model configs")
    model_list.set_defaults(func=cmd_model_list)
    model_show = model_sub.add_parser("show", help="config, parameter counts and bytes per token")
    model_show.add_argument("name", metavar="NAME|PATH")
    model_show.set_defaults(func=cmd_model_show)
    _each_knows_its_parser(parser)
    return parser


def _each_knows_its_parser(parser: argparse.ArgumentParser) -> None:
    """Every command's parser sets itself as `command_parser` (the innermost one wins:
    `trace diff`), so a usage error found after parsing shows that command's usage."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                command.set_defaults(command_parser=command)
                _each_knows_its_parser(command)


def _usage(p: argparse.ArgumentParser) -> int:
    """A command given without its action (`mkemu hw`): its usage on stderr, exit 2."""
    p.print_help(sys.stderr)
    return 2


def _machine_options(p: argparse.ArgumentParser, mesh: bool = True) -> None:
    p.add_argument("--hw", default=DEFAULT_PROFILE, metavar="NAME|PATH",
                   help=f"hardware profile: a shipped name or a TOML file (default {DEFAULT_PROFILE})")
    if mesh:
        p.add_argument("--mesh", metavar="XxYxZ", help="chip mesh (default: the profile's)")
    p.add_argument("--seed", type=integer, default=0, help="seed of generated inputs and weights (default 0)")
    p.add_argument("--max-cycles", type=integer, default=10**12, help="stop a run that passes this cycle")
    p.add_argument("--max-instructions", type=integer, default=50_000_000, metavar="N",
                   help="fault when a core runs more than N instructions in one launch, or more than N/100 "
                        "global ones (DMA starts, semaphore waits and signals, barriers): a runaway loop; "
                        "default 50,000,000")
    p.add_argument("--dma-order", default="round_robin", choices=("round_robin", "fifo"),
                   help="DMA engine order: round_robin (descriptors share the engine) or fifo")
    p.add_argument("--no-check", action="append", default=[], choices=("races", "semaphores"),
                   help="turn off a runtime check (repeatable): DMA races, or non-zero semaphores at "
                        "kernel end")


def _scale_out_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", type=integer, default=None, metavar="N",
                   help="run N trials at a time in local processes (default 1: in this process)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="run the trials on a Dask distributed cluster (e.g. tcp://host:8786)")


def _driver_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model runs (programs with a driver, e.g. the K3 programs)")
    g.add_argument("--model", help="model config: a shipped name (mkemu model list) or a TOML file")
    g.add_argument("--batch", type=integer, help="independent sequences, 1..8 (default 1)")
    g.add_argument("--prompt-len", type=integer, help="prompt tokens fed one by one (default 4)")
    g.add_argument("--steps", type=integer, help="tokens to generate (default 4)")
    g.add_argument("--check-layers", action="store_true",
                   help="compare every layer's attention and FFN outputs, naming the first that differs")
    g.add_argument("--timing-only", action="store_true",
                   help="compute nothing, charge every cycle (full-size runs; no PASS/FAIL): the router's "
                        "choices come from --routing or a seeded synthetic distribution")
    g.add_argument("--routing", metavar="FILE", help="timing-only: replay the router's choices recorded "
                   "from a data run with --record-routing")
    g.add_argument("--routing-skew", type=real, metavar="S",
                   help="timing-only, synthetic routing: expert popularity falls as 1/rank^S "
                        "(default 0: uniform)")
    g.add_argument("--record-routing", metavar="FILE", help="data run: write the router's choices (and "
                   "the tokens) of every step to FILE, for --timing-only --routing FILE")
    g.add_argument("--spec-rows", type=integer, metavar="R",
                   help="speculative decoding: every step verifies R = 1 + drafts consecutive positions of one "
                        "sequence (1..8, needs --batch 1) and accepts the longest right prefix of drafts plus one")
    g.add_argument("--accept", type=integer, metavar="L",
                   help="with --spec-rows: tokens accepted per verify step, 1..R (the drafter is right for L - 1 "
                        "drafts; default: a seeded draw, uniform in 1..R, per step)")


def _in_ascii(parse):
    """`parse` (int, float) of an option's text written in ASCII only: they also read other
    scripts' digits (`--seed １` was seed 1 where `--mesh １` is an error). It keeps the
    name argparse says in its message (`invalid int value: 'x'`)."""
    def read(text: str, *base: int):
        if not text.isascii():
            raise ValueError(f"{text!r} is not written in ASCII digits")
        return parse(text, *base)

    read.__name__ = parse.__name__
    return read


integer, real = _in_ascii(int), _in_ascii(float)


def _params(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            if not sep or not name.strip().isidentifier():
                raise ValueError
            number = integer(value, 0)
        except ValueError:
            raise ConfigError(f"--set wants NAME=INTEGER, got {item!r}", key="--set") from None
        name = name.strip()
        if name in out and out[name] != number:
            # (as two --param or two --hw-set of one key: the last silently winning hides a typo)
            raise ConfigError(f"{name} is set twice, to {out[name]} and to {number}: give one value", key="--set")
        out[name] = number
    return out


def _options(args):
    """The flags as the one `Options` object the API takes too."""
    from mkemu.emulator.config import CHECKS
    from mkemu.options import Options

    with _as_flags(args):
        return Options(hw=args.hw, mesh=args.mesh, seed=args.seed, max_cycles=args.max_cycles,
                       max_instructions=args.max_instructions,
                       dma_order=args.dma_order, checks=set(CHECKS) - set(args.no_check),
                       params=_params(args.set), trace=getattr(args, "trace", None), model=args.model,
                       batch=args.batch, prompt_len=args.prompt_len, steps=args.steps,
                       check_layers=args.check_layers, dump=getattr(args, "dump", None),
                       timing_only=args.timing_only, routing=args.routing, routing_skew=args.routing_skew,
                       record_routing=args.record_routing, spec_rows=args.spec_rows, accept=args.accept)


class _Progress:
    """Per-step progress of a driver run on stderr: a line rewritten in place on a
    terminal; otherwise (a pipe, a log) one line per step once the run has taken more
    than a few seconds, so short runs stay quiet."""

    QUIET_S = 3.0

    def __init__(self, options):
        self.start = time.perf_counter()
        # (A verify-step run counts the tokens it has generated: how many steps it takes
        # depends on how many each accepts.)
        self.unit = "tokens" if options.spec_rows else "step"

    def __call__(self, done: int, total: int, figures: dict) -> None:
        wall = time.perf_counter() - self.start
        # (a verify step's tokens may pass those asked: "tokens 3 (2 asked)", not "3/2")
        count = f"{done}/{total}" if done <= total else f"{done} ({total} asked)"
        seconds = figures.get("seconds") if isinstance(figures, dict) else None    # (a driver's own figures)
        emulated = f"{seconds * 1e6:.2f} us emulated, " if isinstance(seconds, int | float) else ""
        text = f"{self.unit} {count}: {emulated}{wall:.1f} s wall"
        if sys.stderr.isatty():
            print(f"\r{text}", end="" if done < total else "\n", file=sys.stderr, flush=True)
        elif wall > self.QUIET_S:
            print(text, file=sys.stderr, flush=True)


def _check_png(path: str, others: str = "") -> None:
    """--plot writes PNG bytes: a file named for another format would hold them anyway.
    `others`: the command's other exports, for the message."""
    if not path.lower().endswith(".png"):
        raise ConfigError(f"--plot writes a PNG image; name the file OUT.png, not {path}{others}", key="--plot")


def _no_empty_paths(args, *flags: str) -> None:
    """An empty path given to a flag that reads a file: named by the flag (the OS's
    'No such file' would name nothing)."""
    for flag in flags:
        if getattr(args, flag.lstrip("-").replace("-", "_"), None) == "":
            raise ConfigError("wants the path of a file to read, got an empty one", key=flag)


def cmd_run(args) -> int:
    from mkemu.run import check_schedules, execute, render_schedules
    from mkemu.shipped import resolve

    _no_empty_paths(args, "--inputs", "--routing")

    _check_schedules(args.schedules)
    outputs = [("--trace", args.trace), ("--record-routing", args.record_routing)]
    _check_outputs(outputs, _inputs_read(args, [resolve(args.file)]))
    _check_outside_dump(args.dump, outputs)
    if args.schedules and args.timing_only:
        raise ConfigError("--schedules compares each schedule's computed bits, and a timing-only run computes "
                          "none (nor checks races): run the schedules without --timing-only", key="--schedules")
    options = _options(args)
    with _json_only_on_stdout(args):
        with _as_flags(args):
            report, render = execute(args.file, options, progress=_Progress(options), inputs=args.inputs)
        if args.schedules:
            report["schedules"] = check_schedules(args.file, options, args.schedules, report, inputs=args.inputs)
    ok = report["bit_exact"] in (True, None)
    if args.schedules:
        ok = ok and all(s["outcome"] == "same" for s in report["schedules"])
    if args.json:
        print(_json(report))
    else:
        print(render(report))
        if args.schedules:
            print(render_schedules(report["schedules"]))
    return 0 if ok else 1


def _json_only_on_stdout(args):
    """With --json, stdout holds the one JSON object: what a program's driver prints
    while it runs goes to stderr."""
    return contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()


# The options whose flag is not the field's name with dashes (`_options`).
_FLAG_OF = {"params": "--set", "checks": "--no-check"}


@contextlib.contextmanager
def _as_flags(args):
    """An error the API raises naming an option by its field (`max_cycles`, `trace`,
    `hw`, ...) came here from a flag: it is named by the flag."""
    try:
        yield
    except ConfigError as exc:
        if exc.file is not None or not exc.key or not exc.key.isidentifier():
            raise
        flag = _flag_of(exc.key, args)
        if not flag:
            raise
        # (the options a message starts with, `model, batch apply only ...`, by their flags too)
        listed = re.match(r"\w+(, \w+)*", exc.message)
        names = listed.group(0).split(", ") if listed else []
        if names and all(_flag_of(name, args) for name in names):
            message = ", ".join(_flag_of(name, args) for name in names) + exc.message[listed.end():]
        else:
            message = exc.message
        raise ConfigError(message, key=flag) from None


def _flag_of(name: str, args) -> str | None:
    """The flag of option field `name` (`prompt_len` -> `--prompt-len`), if the command has one."""
    return _FLAG_OF.get(name) or (f"--{name.replace('_', '-')}" if hasattr(args, name) else None)


def cmd_compare(args) -> int:
    from mkemu.run import compare_text, execute, prepare

    from mkemu.shipped import resolve

    # Every program must be there before the first one's run, which may take a while.
    files = [resolve(file) for file in (args.first, *args.others)]
    _check_outputs([("--record-routing", args.record_routing)], _inputs_read(args, files))
    options = _options(args)
    # (--record-routing: the first program's run writes it, not each in turn, the last winning)
    runs = [options] + [attrs.evolve(options, record_routing=None)] * (len(files) - 1)
    with _as_flags(args), _json_only_on_stdout(args):
        # Every program compiled and its options checked before the first runs: a later
        # one in error would otherwise fail after the earlier ones' runs (and outputs).
        prepared = [prepare(file, run, args.inputs) for file, run in zip(files, runs)]
        reports = [execute(file, run, progress=_Progress(run), inputs=args.inputs, prepared=ready)[0]
                   for file, run, ready in zip(files, runs, prepared)]
    if args.json:
        print(_json({"reports": reports}))
    else:
        print(compare_text(*reports))
    return 0 if all(r["bit_exact"] in (True, None) for r in reports) else 1


def _json(value) -> str:
    """One JSON object, valid JSON: a figure that is not a finite number (an absurd
    profile's, a bandwidth of 1e308 bytes a cycle times the clock) is null, where json
    would write `Infinity` or `NaN`."""
    from mkemu.runner import finite, json_default

    return json.dumps(finite(value), default=json_default)


def cmd_trace(args) -> int:
    from mkemu.runner import atomic_write
    from mkemu.tools import trace_diff, trace_summary
    from mkemu.tools.trace_reader import read_trace

    if "" in (args.path, *args.others):
        raise ConfigError("wants the path of a trace to read, got an empty one", key="PATH")

    for flag, value in (("--from", args.start), ("--to", args.end), ("--top", args.top)):
        if value is not None and value < 0:
            raise ConfigError(f"{flag} must be 0 or more, not {value}", key=flag)
    if args.start is not None and args.end is not None and args.end <= args.start:
        raise ConfigError(f"--to {args.end} is not after --from {args.start}: the window [from, to) is empty",
                          key="--to")
    filters = dict(chips=args.chip, cores=args.core, region=args.region, start=args.start, end=args.end)
    exports = [(flag, out) for flag, out in (("--perfetto", args.perfetto), ("--html", args.html),
                                             ("--plot", args.plot)) if out is not None]
    if args.path == "diff":
        if len(args.others) != 2:
            raise ConfigError("trace diff wants two traces: mkemu trace diff A B", key="diff")
        for flag, used in (*exports, ("--top", args.top)):
            if used is not None:
                raise ConfigError(f"{flag} applies to one trace (mkemu trace PATH {flag} ...), not to diff",
                                  key=flag)
        a, b = read_trace(args.others[0]), read_trace(args.others[1])
        d = trace_diff.diff(a, b, **filters)
        if args.json:
            print(_json(d))
        else:
            sys.stdout.write(trace_diff.render_text(d, (a.meta.get("fault"), b.meta.get("fault"))))
        return 0
    if args.others:
        raise ConfigError(f"unexpected argument(s) {' '.join(args.others)} (did you mean `mkemu trace diff A B`?)")
    from mkemu.runner import check_writable

    for flag, out in exports:   # every output checked before the first is written
        check_writable(out, flag)
        if flag == "--plot":
            _check_png(out, " (--html writes a timeline page, --perfetto a trace for ui.perfetto.dev)")
        if _same_file(out, args.path):
            raise ConfigError(f"{out} is the trace being read; write the export to another file", key=flag)
        for other_flag, other in exports[:exports.index((flag, out))]:
            if _same_file(out, other):
                raise ConfigError(f"{other_flag} and {flag} both write {out}; give each export its own file",
                                  key=flag)
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401 - checked before any export is written
        except ImportError:
            raise ConfigError("--plot needs matplotlib, which is not installed: pip install 'mkemu[plot]' "
                              "(or use --html OUT.html, a self-contained timeline page)", key="--plot") from None
    trace = read_trace(args.path)
    top = 5 if args.top is None else args.top
    if exports:
        from mkemu.tools.view import view

        if args.region is not None:     # (an empty --region too: it is no cut of an export)
            raise ConfigError(f"--region narrows the summary and diff, not {exports[0][0]}; "
                              "use --from/--to (and --chip/--core) to cut an export", key="--region")
        v = view(trace, args.chip, args.core, args.start, args.end)
    if args.perfetto:
        from mkemu.tools.perfetto import to_perfetto

        atomic_write(args.perfetto, to_perfetto(trace, v, path=args.perfetto))
    if args.html:
        from mkemu.tools.plot import to_html

        atomic_write(args.html, to_html(trace, v).encode())
    if args.plot:
        from mkemu.tools.plot import to_png

        try:
            atomic_write(args.plot, to_png(trace, v))
        except ImportError:
            raise ConfigError("--plot needs matplotlib, which is not installed: pip install 'mkemu[plot]' "
                              "(or use --html OUT.html, a self-contained timeline page)", key="--plot") from None
    if args.json:
        print(_json(trace_summary.summarize(trace, top=top, **filters)))
    elif not (args.perfetto or args.html or args.plot):
        sys.stdout.write(trace_summary.render_text(trace_summary.summarize(trace, top=top, **filters), top=top))
    return 0


def _same_file(a: str, b: str) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve() or Path(a).samefile(b)
    except OSError:   # (either does not exist)
        return False


def _check_outputs(outputs: list[tuple[str, str | None]], inputs: list[tuple[str, str | None]]) -> None:
    """No file a command writes (flag, path) is one it reads (what, path), which it would
    replace (a program by its listing or its trace), nor one another output writes."""
    outputs = [(flag, out) for flag, out in outputs if out]
    for i, (flag, out) in enumerate(outputs):
        for what, path in inputs:
            if path and _same_file(out, path):
                raise ConfigError(f"{out} is {what}; write {flag} to another file", key=flag)
        for other_flag, other in outputs[:i]:
            if _same_file(out, other):
                raise ConfigError(f"{other_flag} and {flag} both write {out}; give each its own file", key=flag)


def _check_schedules(count: int) -> None:
    """--schedules N, of `mkemu run` and `mkemu tune`."""
    from mkemu.run import MAX_SCHEDULES

    if not 0 <= count <= MAX_SCHEDULES:
        raise ConfigError(f"--schedules must be 0..{MAX_SCHEDULES} (each is a whole run), not {count}",
                          key="--schedules")


def _check_outside_dump(dump: str | None, outputs: list[tuple[str, str | None]]) -> None:
    """No other output is the --dump folder or lies in it: the dump writes its files
    there (`--trace DIR/weights.npz` was replaced by the dumped weights, silently)."""
    if not dump:
        return
    folder = Path(dump).resolve()
    for flag, out in outputs:
        if out and (Path(out).resolve() == folder or folder in Path(out).resolve().parents):
            raise ConfigError(f"{out} is in the --dump folder {dump}, whose files the dump writes; write {flag} "
                              "outside it", key=flag)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _check_readable(args) -> None:
    """The files every run of a tune or sweep reads, looked at once before the first run:
    a missing one is one error up front, not one rejected run per point."""
    from mkemu.errors import check_regular_file

    for path, what in ((getattr(args, "inputs", None), "inputs"),
                       (getattr(args, "routing", None), "the routing record")):
        if path:
            try:
                check_regular_file(path, what)
                with open(path, "rb"):
                    pass
            except OSError as exc:
                raise ConfigError(f"cannot read {what}: {exc.strerror or exc}", file=path) from None


def _inputs_read(args, files: list[str]) -> list[tuple[str, str | None]]:
    """The files a command reads, as (what, path): its programs, the files they import
    and their reference files, and the files its flags name."""
    from mkemu.runner import files_read_by

    def file_or_name(value: str | None) -> str | None:   # (a shipped name is no file of the user's)
        return value if value and (value.endswith(".toml") or "/" in value) else None

    return [*(("the program", path) for path in files),
            *((f"read by {Path(path).name}", used) for path in files for used in files_read_by(path)),
            ("the --hw profile", file_or_name(args.hw)),
            *(("a profile the --hw profile extends", path) for path in _profile_bases(file_or_name(args.hw))),
            ("the --model config", file_or_name(getattr(args, "model", None))),
            ("the --inputs file", getattr(args, "inputs", None)),
            ("the --routing record", getattr(args, "routing", None))]


def _profile_bases(hw: str | None) -> list[str]:
    """The files a --hw profile file extends (a bad profile: none here; loading it says
    what is wrong)."""
    if hw is None:
        return []
    from mkemu.isa.hardware import profile_files

    try:
        return profile_files(hw)[1:]
    except (ConfigError, OSError):
        return []


def cmd_asm(args) -> int:
    from mkemu.isa.listing import listing

    if args.output is not None:
        from mkemu.runner import check_writable
        from mkemu.shipped import resolve

        check_writable(args.output, "-o")   # before compiling, not after it
        _check_outputs([("-o", args.output)], _inputs_read(args, [resolve(args.file)]))
    from mkemu.api import hw_profile

    with _as_flags(args):
        profile = hw_profile(args.hw)   # (a bad --hw is an error with --params too, not ignored)
    if args.params:
        if args.stats:
            raise ConfigError("--stats adds to the listing; --params lists the params instead of it: "
                              "give one of them", key="--stats")
        return _print_params(args)
    t0 = time.perf_counter()
    from mkemu.run import load_program

    # (--stats reports the compile time: compiled afresh, not read from the compile cache)
    program = load_program(args.file, profile, _params(args.set), cache=not args.stats)
    compile_s = time.perf_counter() - t0
    text = listing(program, stats=args.stats, compile_s=compile_s)
    if args.output is not None:
        from mkemu.runner import atomic_write

        atomic_write(args.output, text.encode())
    else:
        sys.stdout.write(text)
    return 0


def cmd_programs(args) -> int:
    from mkemu.shipped import list_programs

    shipped = list_programs()
    width = max(len(p.name) for p in shipped)
    for p in shipped:
        print(f"{p.name:{width}s}  {p.description}")
    return 0


def _print_params(args) -> int:
    from mkemu.dsl.frontend import load_program
    from mkemu.isa.program import values_text
    from mkemu.shipped import resolve

    path = resolve(args.file)
    if not path.endswith(".mk"):
        raise ConfigError("--params lists a .mk program's params; this is not a .mk file", file=args.file)
    params = load_program(path, _params(args.set)).param_info
    rows = [("NAME", "VALUE", "DEFAULT", "VALUES", "DESCRIPTION", "WHERE")]
    for p in params:
        values = "any" if p.values is None else values_text(p.values)
        rows.append((p.name, str(p.value), str(p.default), values, p.description, f"{p.span.file}:{p.span.line}"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    text = "".join("  ".join(f"{c:<{w}}" for c, w in zip(r, widths)) + f"  {r[5]}\n" for r in rows)
    if args.output is not None:
        from mkemu.runner import atomic_write

        atomic_write(args.output, text.encode())
    else:
        sys.stdout.write(text)
    return 0


def cmd_tune(args) -> int:
    from mkemu.runner import check_writable
    from mkemu.shipped import resolve
    from mkemu.trials import trial
    from mkemu.tune import (Tune, check_default_error, default_build, format_objective, load_resume, make_space,
                            render, same_build_text, summary)

    _no_empty_paths(args, "--inputs", "--routing")
    _check_scale_out(args)
    if args.budget < 1:
        raise ConfigError(f"--budget must be at least 1, got {args.budget}", key="--budget")
    if args.seed >= 2**32:   # (optuna's sampler takes a 32-bit seed)
        raise ConfigError(f"--seed of a tune must be 0..{2**32 - 1}, got {args.seed}", key="--seed")
    if args.resume == "":
        raise ConfigError("--resume wants the path of a tune record, got an empty one", key="--resume")
    if args.timing_only:
        raise ConfigError("a --timing-only run computes nothing, so no variant could be bit-exact: "
                          "tune with data runs (a smaller --model)", key="--timing-only")
    if args.schedules is not None:
        _check_schedules(args.schedules)
    out = args.out if args.out is not None else args.resume or f"{Path(args.file).stem}.tune.json"
    out_flag = "--resume" if args.out is None and args.resume else "--out"   # (the flag that named it)
    check_writable(out, out_flag)
    _check_outputs([(out_flag, out), ("--record-routing", args.record_routing)],
                   _inputs_read(args, [resolve(args.file)]))
    _check_readable(args)
    base = trial(resolve(args.file), _options(args), args.inputs)
    with _as_flags(args):
        default = default_build(base)
    space = make_space(default.params, default.driver_set, base.options.params, _tune_params(args.param), args.file)
    check_default_error(base, default, space, args.budget, args.seed)
    tune = Tune(base, space, args.objective, args.budget, args.seed, out, jobs=args.jobs,
                scheduler=args.scheduler, schedules=args.schedules)
    tune.plan()   # (without optuna for a space it needs: one error line, before the header)
    if args.resume:
        tune.cache = load_resume(args.resume, tune.settings(), tune.searched())
    where = f"Dask scheduler {args.scheduler}" if args.scheduler else (
        f"{args.jobs} local processes" if args.jobs > 1 else "this process")
    # (without --schedules the best is run again under the late schedule: the last line says so)
    schedules = ("" if args.schedules is None else ", no adversarial DMA schedules" if args.schedules == 0
                 else f", every bit-exact variant also under {plural(args.schedules, 'adversarial DMA schedule')}")
    print(f"tune {args.file}: {plural(space.size, 'variant')} of {', '.join(space.names)}, budget {args.budget}, "
          f"objective {args.objective}, seed {args.seed}, on {where}{schedules}", file=sys.stderr)

    def progress(record):
        # ([N] is the trial's index in the record, as "same build as trial N" and the
        # record's `same_as` are: a count of finished trials would skip and repeat
        # numbers when one run settles several trials of its build at once)
        what = (format_objective(record["objective"], tune.objective) if record["status"] == "ok"
                else f"rejected: {record['reason']}")
        again = (f" ({same_build_text(tune, record)}: not run)" if record.get("same_as") is not None
                 else " (the best so far, run again under the late DMA schedule)" if tune.checking == "run"
                 else " (the best so far; its late DMA schedule from the record)" if tune.checking
                 else " (from the record)" if record.get("resumed") else f" ({record['wall_s']:.1f} s)")
        print(f"[{record['index']}] {' '.join(f'{k}={v}' for k, v in record['params'].items())}: {what}{again}",
              file=sys.stderr, flush=True)

    tune.progress = progress
    tune.run()
    print(render(tune))
    print(f"{summary(tune)}, wall {time.perf_counter() - tune.started:.1f} s; "
          f"record: {out}")
    return 0 if tune.ranking() else 1


def _tune_params(items: list[str]) -> dict[str, tuple[int, ...] | None]:
    out: dict[str, tuple[int, ...] | None] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip()
        try:
            if not name.isidentifier():
                raise ValueError
            values = tuple(integer(v, 0) for v in raw.split(",")) if sep else None
        except ValueError:
            raise ConfigError(f"--param wants NAME or NAME=V1,V2,... with integer values, got {item!r}",
                              key="--param") from None
        if name in out:
            raise ConfigError(f"--param {name} is given twice; give its values once: --param {name}=V1,V2,...",
                              key=f"--param {name}")
        texts = [v.strip() for v in raw.split(",")]
        for i, v in enumerate(values or ()):
            if v in values[:i]:   # (as a sweep's axis and a param's declaration refuse it)
                first = texts[values.index(v)]
                said = f"{first} and {texts[i]} are one value" if first != texts[i] else f"{v} is"
                raise ConfigError(f"{said} given twice: each value is one point of the search",
                                  key=f"--param {name}")
        out[name] = values
    return out


def _check_scale_out(args) -> None:
    """--jobs or --scheduler, checked (the scheduler reached); --jobs then 1 if not given."""
    if args.jobs is not None and args.jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {args.jobs}", key="--jobs")
    if args.scheduler is not None and not args.scheduler.strip():
        raise ConfigError("--scheduler wants a Dask scheduler's address (e.g. tcp://host:8786), got an empty one",
                          key="--scheduler")
    if args.scheduler and args.jobs is not None:   # (even --jobs 1: the two are alternatives)
        raise ConfigError("--jobs and --scheduler do not go together: the cluster's workers run the trials",
                          key="--jobs")
    if args.jobs is None:
        args.jobs = 1
    if args.scheduler:
        from mkemu.trials import reach_scheduler

        reach_scheduler(args.scheduler)


def cmd_sweep(args) -> int:
    from mkemu.runner import check_writable
    from mkemu.shipped import resolve
    from mkemu.sweep import Sweep, check_axes, mesh_axis, parse_axis, plot, point_label, program_names, render
    from mkemu.trials import trial

    from mkemu.api import hw_profile

    _no_empty_paths(args, "--inputs", "--routing")
    _check_scale_out(args)
    with _as_flags(args):
        hw_profile(args.hw)   # the base profile, before any point is made of it
    axes = [parse_axis(item) for item in args.hw_set]
    if args.mesh is not None:
        if any(axis.key == "mesh.dims" for axis in axes):
            # (the run's mesh is --mesh's: the profile's dims would be varied to no effect)
            raise ConfigError("--mesh and --hw-set mesh.dims both vary the mesh; give one of them",
                              key="--hw-set mesh.dims")
        axes.append(mesh_axis(args.mesh))
    check_axes(axes)
    if not axes:
        raise ConfigError("nothing to sweep: give --hw-set KEY=V1,V2,... and/or --mesh M1,M2,...", key="--hw-set")
    files = [resolve(file) for file in args.files]
    runs = len(files) * math.prod(len(axis.values) for axis in axes)
    if args.record_routing is not None and runs > 1:
        # (every run would rewrite it, each with its own mesh's cores: the last to finish would win)
        raise ConfigError(f"--record-routing writes the router's choices of one run; this sweep has {runs} runs: "
                          "record them with `mkemu run` at the point you want", key="--record-routing")
    if args.plot:
        try:
            import matplotlib  # noqa: F401 - checked before the runs, not after them
        except ImportError:
            raise ConfigError("--plot needs matplotlib, which is not installed: pip install 'mkemu[plot]' "
                              "(the JSON record has every figure)", key="--plot") from None
    for path, key in ((args.out, "--out"), (args.plot, "--plot")):
        if path is not None:
            check_writable(path, key)
    _check_outputs([("--out", args.out), ("--plot", args.plot), ("--record-routing", args.record_routing)],
                   _inputs_read(args, files))
    if args.plot is not None:
        _check_png(args.plot, " (--out writes the sweep's figures as JSON)")
    _check_readable(args)
    args.mesh = None   # per point
    programs = [trial(file, _options(args), getattr(args, "inputs", None)) for file in files]
    sweep = Sweep(programs, axes, out=args.out, jobs=args.jobs, scheduler=args.scheduler)

    name_of = dict(zip((p.file for p in programs), program_names(p.file for p in programs)))

    def progress(point, entry):
        what = f"{entry['us_per_step']:.3f} us, {entry['bound_by']}" if entry["status"] == "ok" else (
            f"rejected: {entry['reason']}")
        print(f"{point_label(point)} {name_of.get(entry['program'], entry['program'])}: {what} "
              f"({entry['wall_s']:.1f} s)", file=sys.stderr, flush=True)

    sweep.progress = progress
    sweep.run()
    print(render(sweep))
    if args.plot:
        plot(sweep, args.plot)
    saved = [f"record: {args.out}"] if args.out else []
    saved += [f"plot: {args.plot}"] if args.plot else []
    print("; ".join([f"{plural(len(sweep.points), 'point')}, wall {time.perf_counter() - sweep.started:.1f} s", *saved]))
    return 0 if all(r.get("status") == "ok" for p in sweep.points for r in p["results"]) else 1


def cmd_hw_list(args) -> int:
    from mkemu.isa.hardware import list_profiles, load_profile

    for name in list_profiles():
        print(f"{name:16s} {load_profile(name).description}")
    return 0


def cmd_hw_show(args) -> int:
    from mkemu.isa.hardware import load_profile, profile_to_text

    with _shown("hw show"):
        profile = load_profile(args.name)
    print(profile_to_text(profile))
    return 0


def cmd_model_list(args) -> int:
    from mkemu.programs.k3.config import list_configs, load_config

    for name in list_configs():
        print(f"{name:10s} {load_config(name).description}")
    return 0


def cmd_model_show(args) -> int:
    from mkemu.programs.k3.config import config_to_text, load_config

    with _shown("model show"):
        config = load_config(args.name)
    print(config_to_text(config))
    return 0


@contextlib.contextmanager
def _shown(command: str):
    """`hw show NAME` / `model show NAME`: the loader says a name is not a shipped one
    naming the flag of `run` (`--model`) or nothing; here it names the command."""
    try:
        yield
    except ConfigError as exc:
        if exc.file is not None:   # (a file's error: its place is the file)
            raise
        raise ConfigError(exc.message, key=command) from None


if __name__ == "__main__":
    sys.exit(entry())
