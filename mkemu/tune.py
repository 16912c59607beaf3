"""`mkemu tune`: search a program's params for the fastest bit-exact build.

The space is the params given with `--param NAME[=v1,v2,...]`, or else every param
that declares its values (`param ES = 2 in {1, 2, 4} "...";`), less those fixed
with `--set` or by the program's driver. Trial 0 is always the default build (the
declared defaults with the run's `--set`s): the speedups are over it. A space no
bigger than the budget is enumerated; a bigger one is searched by optuna's TPE
sampler, seeded with `--seed`, asking for a fixed number of variants at a time
(`BATCH`) so the same seed gives the same trials whatever `--jobs` or the cluster.

Each variant is compiled first, in this process: one whose compiled program is the
same as an earlier trial's (`build_of`) is not run but takes that trial's result,
marked `same_as` it, and does not count toward the budget (which is of runs). The
others are run (`mkemu.trials`); one that fails to compile,
faults, deadlocks, races, changes an output bit or has no reference check is
rejected with its reason and can never win.

A race may show only when DMAs land in another order than the normal schedule's, so
a variant is also run under adversarial DMA schedules (`mkemu run --schedules`'s) before
it can win: by default only the best, under the late schedule, after the search
(`Tune.check_best`: one that fails is rejected and the next best checked, until one
passes); with `--schedules N` every bit-exact trial, under N schedules, as it runs
(`Trial.schedules`); with `--schedules 0` none (`Tune.plan_schedules`).

The record (`--out`, JSON) holds every
trial and is rewritten atomically after each one; `--resume` reads such a record
and reuses its finished trials instead of running them again, so an interrupted
tune continues where it stopped and ends as an uninterrupted one would have.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import random
import stat
import time
from collections.abc import Callable

import attrs

from mkemu.errors import ConfigError, SourceError, not_text
from mkemu.isa.program import ParamInfo
from mkemu.options import Options
from mkemu.runner import atomic_write, finite
from mkemu.trials import SCHEDULE_OUTCOMES, Trial, breakdown, objective_of, run_schedules, run_trials, schedule_failure

FORMAT = "mkemu-tune/1"
# Variants asked from the sampler at a time: fixed, so that the sampler sees the same
# results in the same order whatever runs the trials.
BATCH = 8
# The sampler may propose variants already run; it gets their known result back. It
# is stopped after this many proposals per budgeted run, so a search of a space that
# it keeps circling ends.
MAX_ASKS_PER_RUN = 20
# Adversarial DMA schedules the best bit-exact variant is checked under when the tune
# is not given --schedules: the first of `mkemu run --schedules`, the late one.
BEST_SCHEDULES = 1
# The schedules a tune without --schedules runs (`Tune.plan_schedules`); also what a
# record written before tunes ran any is taken for (its trials ran none, and resuming
# it checks the best after the search).
DEFAULT_PLAN = {"trials": 0, "best": BEST_SCHEDULES}


@attrs.frozen
class Space:
    names: tuple[str, ...]
    values: dict[str, tuple[int, ...]]
    default: dict[str, int]               # the tuned params' values in the default build

    @property
    def size(self) -> int:
        size = 1
        for name in self.names:
            size *= len(self.values[name])
        return size

    @property
    def holds_default(self) -> bool:
        """Is the default build one of the space's variants?"""
        return all(self.default[n] in self.values[n] for n in self.names)

    def variants(self):
        """Every variant, in the order of the values (the first name's vary slowest)."""
        return (dict(zip(self.names, vs)) for vs in itertools.product(*(self.values[n] for n in self.names)))

    def variant_at(self, index: int) -> dict[str, int]:
        """Variant `index` of `variants()` (0 <= index < size)."""
        picked = []
        for name in reversed(self.names):       # (the last name varies fastest)
            index, at = divmod(index, len(self.values[name]))
            picked.append(self.values[name][at])
        return dict(zip(self.names, reversed(picked)))

    def enumerated(self, budget: int) -> bool:
        """Does a tune of this budget run every variant (an exhaustive search)? The
        default build runs too, one more when the space leaves it out."""
        return self.size + (not self.holds_default) <= budget


@attrs.frozen
class DefaultBuild:
    """What the front end says of the default build (as `mkemu run` would set it)."""
    params: tuple[ParamInfo, ...]    # every param, as `mkemu asm --params` lists them
    driver_set: frozenset[str]       # the names the program's driver sets
    values: dict[str, int]           # the values it sets: the driver's and the --set ones
    error: SourceError | None        # its front-end error, if it has one


def default_build(base: Trial) -> DefaultBuild:
    """The default build's params, from the front end only. A default build that does
    not compile (a failed assert, too big for the machine's VMEM) is trial 0, rejected
    with its error like any variant, not the end of the tune (`check_default_error`).
    An error of the params themselves, a syntax error or a missing import is reported
    here, before any trial."""
    from mkemu.api import is_driver, read_program, setup
    from mkemu.dsl.frontend import declared_params, load_program

    if not base.file.endswith(".mk"):
        raise ConfigError("mkemu tune searches a .mk program's params; this is not a .mk file", file=base.file)
    s = setup(base.file, read_program(base.file), base.options)
    if is_driver(s.reference) and base.inputs:   # (one error up front, not one rejected variant each)
        raise ConfigError("--inputs applies to plain programs; this program's driver writes its own inputs",
                          file=base.inputs, key="--inputs")
    values = {**s.driver_params, **base.options.params}
    try:
        params, error = load_program(base.file, values).param_info, None
    except SourceError as failed:
        params, error = declared_params(base.file, values), failed
    return DefaultBuild(params, frozenset(s.driver_params), values, error)


#: How many variants of a searched space a failing default build is checked against.
CHECKED_VARIANTS = 32


def check_default_error(base: Trial, default: DefaultBuild, space: Space, budget: int, seed: int) -> None:
    """The default build's front end failed: that is trial 0, rejected, if a variant the
    tune may run gets past the front end; an error every one of them has (an unknown
    name, a type error) is the program's, reported before any trial. An exhaustive
    search runs every variant: each is checked until one passes. What a search will run
    is not known before it runs, so a seeded sample of the space's variants, spread over
    it, stands for them (the first ones in order may share a value that fails)."""
    from mkemu.dsl.frontend import load_program

    if default.error is None:
        return
    if space.enumerated(budget):
        variants = (v for v in space.variants() if v != space.default)
    else:
        picks = random.Random(seed).sample(range(space.size), min(space.size, CHECKED_VARIANTS))
        variants = (v for v in map(space.variant_at, picks) if v != space.default)
    first = None
    for variant in variants:
        try:
            load_program(base.file, {**default.values, **variant})
            return
        except SourceError as error:
            first = first or error
    raise first or default.error


def identity(base: Trial) -> dict[str, str | None]:
    """Hashes of what the builds and runs of a tune read besides its settings: the
    program's text with every file it imports and its reference file (`program`), the
    hardware profile as loaded (`hw`: a profile file and the files it extends), and the
    --inputs file (`inputs`, None without one). A resumed record must have the same."""
    from mkemu.api import hw_profile
    from mkemu.runner import files_read_by

    def digest(*items) -> str:
        h = hashlib.sha256()
        for item in items:
            data = item if isinstance(item, bytes) else repr(item).encode()
            h.update(len(data).to_bytes(8, "little") + data)
        return h.hexdigest()

    def contents(path: str) -> bytes | None:
        try:
            with open(path, "rb") as fh:
                return fh.read()
        except OSError:     # (a file the build cannot read either: it reports that)
            return None

    program = digest(*(contents(path) for path in (base.file, *files_read_by(base.file))))
    inputs = digest(contents(base.inputs)) if base.inputs else None
    return {"program": program, "hw": digest(hw_profile(base.options.hw)), "inputs": inputs}


def make_space(params: tuple[ParamInfo, ...], driver_set: frozenset[str], fixed: dict[str, int],
               requested: dict[str, tuple[int, ...] | None], file: str) -> Space:
    """The space to search: `requested` (None: the declared values) or every declared one."""
    info = {p.name: p for p in params}
    if requested:
        for name, values in requested.items():
            p = info.get(name)
            if p is None:
                raise ConfigError(f"the program has no param '{name}' (its params: {', '.join(info) or 'none'})",
                                  file=file, key=f"--param {name}")
            if name in driver_set:
                raise ConfigError(f"'{name}' is set by the program's driver (from the model, batch, mesh and "
                                  "--spec-rows); it cannot be tuned", file=file, key=f"--param {name}")
            if name in fixed:
                raise ConfigError(f"'{name}' is both fixed with --set and tuned with --param", file=file,
                                  key=f"--param {name}")
            if values is None and p.values is None:
                raise ConfigError(f"param '{name}' declares no values; give them: --param {name}=V1,V2,...",
                                  file=file, key=f"--param {name}")
            bad = [v for v in values or () if p.values is not None and v not in p.values]
            if bad:
                raise ConfigError(f"{', '.join(map(str, bad))} not among the values param '{name}' declares "
                                  f"({', '.join(map(str, p.values))}, at {p.span.file}:{p.span.line})",
                                  file=file, key=f"--param {name}")
        names = tuple(requested)
        values = {n: tuple(dict.fromkeys(requested[n] or info[n].values)) for n in names}
    else:
        names = tuple(p.name for p in params
                      if p.values is not None and p.name not in fixed and p.name not in driver_set)
        if not names:
            raise ConfigError("the program declares no tunable param (`param NAME = D in {...};`) that is not "
                              "fixed; name some with --param NAME=V1,V2,...", file=file, key="--param")
        values = {n: info[n].values for n in names}
    return Space(names, values, {n: info[n].value for n in names})


def build_of(base: Trial, params: dict[str, int]) -> str | None:
    """What a variant compiles to, as a hash: two variants with the same hash run the
    same program on the same machine with the same options, so they give the same
    report; None when it does not compile (its trial runs and is rejected with the error)."""
    from mkemu.api import compile as compile_program
    from mkemu.errors import MkemuError

    try:
        kernel = compile_program(base.file, Options.of(base.options, params={**base.options.params, **params},
                                                       record_routing=None))
    except MkemuError:
        return None
    return program_hash(kernel.program)


def program_hash(program) -> str:
    """A hash of everything of a compiled Program that a run reads: each kernel's code,
    SMEM image, sizes, region names, labels, memory extents, range checks, and what
    faults name (the source map, the semaphores' names, the fn calls code was inlined
    at), the launches, the buffers and the reference. Not the params'
    values (what differs between variants by construction), the source files' text
    (the same files) nor the human-readable allocation map."""
    h = hashlib.sha256()

    def put(*items) -> None:
        for item in items:
            data = item if isinstance(item, bytes) else repr(item).encode()
            h.update(len(data).to_bytes(8, "little") + data)

    for name, k in program.kernels.items():
        put(name, str(k.code.dtype), k.code.tobytes(), bytes(k.smem_init), k.vmem_bytes, k.smem_bytes,
            tuple(k.regions), sorted(k.labels.items()), sorted(k.extents.items()), sorted(k.ranges.items()),
            tuple(k.source_map), tuple(k.semaphores), sorted(k.calls.items()))
    put(tuple(program.launches), tuple(program.buffers), program.reference)
    return h.hexdigest()


def label(params: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


@attrs.define
class Tune:
    """One tune: its settings, its record, and the trials run so far."""

    base: Trial                                           # the default build's run
    space: Space
    objective: str
    budget: int
    seed: int
    out: str
    jobs: int = 1
    scheduler: str | None = None
    cache: dict[str, dict] = attrs.Factory(dict)          # label -> a resumed trial record
    trials: list[dict] = attrs.Factory(list)
    hashes: dict[str, str | None] = attrs.Factory(dict)   # label -> the variant's build (build_of)
    builds: dict[str, int] = attrs.Factory(dict)          # build -> the index of the first trial of it
    waiting: list[dict] = attrs.Factory(list)             # trials of a build tried by one not finished yet
    search: str = ""
    progress: Callable[[dict], None] | None = None
    started: float = attrs.Factory(time.perf_counter)
    inputs_identity: dict | None = None                   # `identity(base)`, read once
    schedules: int | None = None                          # --schedules N (None: not given)
    # In `check_best` (for `progress`): "run" when the best was just run under the
    # schedules, "record" when their outcomes came from the resumed record; else None.
    checking: str | None = None

    def plan_schedules(self) -> dict[str, int]:
        """The adversarial DMA schedules the tune runs (the record's `schedules`):
        `trials`, how many every bit-exact trial runs as it runs (--schedules N), and
        `best`, how many the best bit-exact variant runs after the search
        (`check_best`): 1, the late schedule, when --schedules is not given."""
        if self.schedules is None:
            return dict(DEFAULT_PLAN)
        return {"trials": self.schedules, "best": 0}

    def searched(self) -> dict:
        """What a resumed record's search must be too (`load_resume`): its budget, space
        and adversarial schedules."""
        return {"budget": self.budget, "space": {n: list(self.space.values[n]) for n in self.space.names},
                "schedules": self.plan_schedules()}

    def settings(self) -> dict:
        """What makes two tunes' trials interchangeable (checked on --resume)."""
        if self.inputs_identity is None:
            self.inputs_identity = identity(self.base)
        o = self.base.options
        driver = {k: v for k, v in o.driver_options().items() if k != "seed"}
        return {"program": self.base.file, "hw": o.hw, "mesh": "x".join(map(str, o.mesh)) if o.mesh else None,
                "seed": o.seed, "max_cycles": o.max_cycles, "max_instructions": o.max_instructions,
                "dma_order": o.dma_order, "checks": sorted(o.checks),
                "inputs": self.base.inputs, "set": dict(sorted(o.params.items())), "driver": dict(sorted(driver.items())),
                "objective": self.objective, "identity": self.inputs_identity}

    # ------------------------------------------------------------------ running
    def plan(self) -> str:
        """The search this tune makes, `exhaustive` or `optuna-tpe`; an error, before any
        trial runs or anything is printed, when the space needs optuna and it is missing."""
        space = self.space
        if space.enumerated(self.budget):
            return "exhaustive"
        _require_optuna(space.size, self.budget, outside=not space.holds_default)
        return "optuna-tpe"

    def run(self) -> None:
        space = self.space
        in_space = space.holds_default
        self.search = self.plan()
        if self.search == "exhaustive":
            self.evaluate([space.default] + [v for v in space.variants() if v != space.default])
        else:
            if not in_space:
                self.evaluate([space.default])   # the baseline, outside what the sampler picks from
            self.optuna_search(self.budget - len(self.trials), in_space)
        self.check_best()
        self.save(finished=True)

    def build(self, params: dict[str, int]) -> str | None:
        """The hash of what the variant `params` compiles to (`build_of`), compiled once."""
        key = label(params)
        if key not in self.hashes:
            self.hashes[key] = build_of(self.base, params)
        return self.hashes[key]

    def evaluate(self, configs: list[dict[str, int]]) -> list[dict]:
        """Records for `configs` (new trials, in order): the same build as an earlier
        trial (not run: its result), from the resumed record, or run."""
        records = []
        for params in configs:
            record = {"index": len(self.trials), "params": params, "default": params == self.space.default}
            self.trials.append(record)
            records.append(record)
        todo, same = [], []
        for record in records:
            build = self.build(record["params"])
            if build is not None and build in self.builds:
                record["same_as"] = self.builds[build]
                same.append(record)
                continue
            if build is not None:
                self.builds[build] = record["index"]
            cached = self.cache.get(label(record["params"]))
            if record["default"] and self.base.options.record_routing is not None:
                cached = None     # (its run writes --record-routing: taken from the record, it would not)
            if cached is not None and self.plan_schedules()["best"] and _failed_schedules(cached):
                # A variant `check_best` rejected after the search was bit-exact in it (and
                # the sampler was told so): it is again, until `check_best` rejects it again.
                cached = {**cached, "status": "ok", "reason": None}
            if cached is not None:
                self.finish(record, cached, resumed=True)
            else:
                todo.append(record)
        # A trial of a build already tried takes that trial's result when it has one
        # (now, or as soon as the trial it is the same build as finishes).
        self.waiting += same
        self.settle()
        trials = [self.trial_of(r, schedules=self.plan_schedules()["trials"]) for r in todo]
        run_trials(trials, lambda i, result: self.finish(todo[i], result), jobs=self.jobs,
                   scheduler=self.scheduler)
        return records

    def trial_of(self, record: dict, schedules: int = 0) -> Trial:
        """The run of the trial `record`: the base run with its params."""
        base = self.base
        # Only the default build writes --record-routing: variants may route on other
        # cores (SCHEME) or get other bits, and with --jobs the last to finish would win.
        return attrs.evolve(base, options=Options.of(
            base.options, params={**base.options.params, **record["params"]},
            record_routing=base.options.record_routing if record["default"] else None), schedules=schedules)

    def check_best(self) -> None:
        """Run the best bit-exact variant under `plan_schedules()["best"]` adversarial DMA
        schedules (in this process, after the search); one that faults, deadlocks or
        changes a bit is rejected with the schedule's reason, with every trial of its
        build, and the next best is checked, until one passes or none is left. A variant
        whose report already holds its schedules' outcomes (a resumed record's) is not
        run again."""
        count = self.plan_schedules()["best"]
        if not count:
            return
        try:
            while ranked := self.ranking():
                best = ranked[0]        # (never a trial of a build tried before: `ranking`)
                entries = best["report"].get("schedules")
                self.checking = "record" if entries is not None else "run"
                if entries is None:
                    entries = run_schedules(self.trial_of(best), count, best["report"])
                    best["report"] = {**best["report"], "schedules": entries}
                failed = schedule_failure(entries)
                same = [t for t in self.trials if t.get("same_as") == best["index"]]
                for t in (best, *same):
                    t["report"] = best["report"]
                    if failed is not None:
                        t.update(status="rejected", reason=failed, objective=None)
                self.save(finished=False)
                if failed is None:
                    return
                for t in (best, *same) if self.progress else ():
                    self.progress(t)
        finally:
            self.checking = None

    def finish(self, record: dict, result: dict, resumed: bool = False) -> None:
        record.update(status=result["status"], reason=result["reason"],
                      objective=objective_of(result["report"], self.objective) if result["status"] == "ok" else None,
                      breakdown=breakdown(result["report"]) if result["report"] else None,
                      wall_s=result["wall_s"], report=result["report"])
        if resumed:
            record["resumed"] = True
        self.save(finished=False)
        if self.progress:
            self.progress(record)
        self.settle()

    def settle(self) -> None:
        """Give each waiting trial the result of the trial whose build it is, once finished."""
        ready = [r for r in self.waiting if "status" in self.trials[r["same_as"]]]
        self.waiting = [r for r in self.waiting if "status" not in self.trials[r["same_as"]]]
        for record in ready:
            original = self.trials[record["same_as"]]
            record.update({k: original[k] for k in ("status", "reason", "objective", "breakdown", "report")},
                          wall_s=0.0)
        if ready:
            self.save(finished=False)   # (once for all of them: the record is rewritten whole)
        for record in ready if self.progress else ():
            self.progress(record)

    def optuna_search(self, budget: int, default_in_space: bool) -> None:
        import optuna
        from optuna.distributions import CategoricalDistribution
        from optuna.trial import TrialState

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        # constant_liar: variants asked together (one batch) are spread out, not all the same.
        sampler = optuna.samplers.TPESampler(seed=self.seed, constant_liar=True)
        study = optuna.create_study(direction="minimize", sampler=sampler)
        if default_in_space:
            study.enqueue_trial(dict(self.space.default))
        distributions = {n: CategoricalDistribution(list(self.space.values[n])) for n in self.space.names}
        known: dict[str, dict] = {}
        asks = runs = 0
        # A variant of a build already tried is not run and not counted: the budget is
        # of builds run. (Its build is known before it runs, so this stays deterministic.)
        while runs < budget and asks < MAX_ASKS_PER_RUN * budget and len(known) < self.space.size:
            batch, new, builds = [], [], set()
            while len(batch) < BATCH and runs + len(builds) < budget:
                asked = study.ask(distributions)
                asks += 1
                params = {n: asked.params[n] for n in self.space.names}
                batch.append((asked, params))
                if label(params) not in known and all(label(params) != label(p) for p in new):
                    new.append(params)
                    build = self.build(params)
                    if build is None or build not in self.builds:
                        builds.add(build if build is not None else f"none:{label(params)}")
            for record in self.evaluate(new):
                known[label(record["params"])] = record
                runs += "same_as" not in record
            for asked, params in batch:
                record = known[label(params)]
                if record["status"] == "ok":
                    study.tell(asked, record["objective"])
                else:
                    study.tell(asked, state=TrialState.FAIL)

    # ------------------------------------------------------------------- record
    def document(self, finished: bool) -> dict:
        ranked = self.ranking()
        return {
            "format": FORMAT, "settings": self.settings(), "search": self.search, **self.searched(),
            "default": self.space.default, "finished": finished,
            "best": ranked[0]["index"] if ranked else None,
            "wall_s": round(time.perf_counter() - self.started, 3),
            "trials": sorted((t for t in self.trials if "status" in t), key=lambda t: t["index"]),
        }

    def save(self, finished: bool) -> None:
        atomic_write(self.out, (json.dumps(finite(self.document(finished)), indent=1) + "\n").encode())

    def ranking(self) -> list[dict]:
        """The bit-exact trials, fastest first; a trial of a build already tried right
        after that trial (the same objective), so the best is never such a trial."""
        ok = [t for t in self.trials if t.get("status") == "ok"]
        return sorted(ok, key=lambda t: (t["objective"], _first(t), t["index"]))

    def default_record(self) -> dict | None:
        return next((t for t in self.trials if t["default"]), None)


def _first(trial: dict) -> int:
    """The index of the first trial of `trial`'s build."""
    return trial["same_as"] if trial.get("same_as") is not None else trial["index"]


def _require_optuna(size: int, budget: int, outside: bool = False) -> None:
    try:
        import optuna  # noqa: F401
    except ImportError:
        variants = f"{size} variant{'s' if size != 1 else ''}"
        what = (f"the space has {variants} and leaves the default build out: {size + 1} trials"
                if outside else f"the space has {variants}")
        raise ConfigError(f"{what}, more than the budget of {budget}: searching it "
                          "needs optuna, which is not installed (pip install 'mkemu[tune]'); or raise "
                          "--budget to enumerate it", key="--budget") from None


_SETTING_DEFAULTS = {"max_instructions": attrs.fields(Options).max_instructions.default}
# Driver options that name files a run writes: recorded, but where its outputs go does
# not change a trial's result, so a tune may be resumed with another --record-routing, or none.
_OUTPUT_OPTIONS = ("record_routing", "dump")


def _without_outputs(setting):
    return {k: v for k, v in setting.items() if k not in _OUTPUT_OPTIONS} if isinstance(setting, dict) else setting


def _failed_schedules(trial: dict) -> bool:
    """Was `trial` rejected for an adversarial schedule (its normal run bit-exact)?"""
    report = trial.get("report")
    return (trial.get("status") == "rejected" and isinstance(report, dict)
            and isinstance(report.get("schedules"), list) and schedule_failure(report["schedules"]) is not None)


def schedules_text(plan) -> str:
    """What a tune's `schedules` (`Tune.plan_schedules`) checks, in words."""
    if plan == DEFAULT_PLAN:
        return "the best variant under the late schedule (no --schedules)"
    if isinstance(plan, dict) and plan.get("best") == 0 and isinstance(plan.get("trials"), int):
        n = plan["trials"]
        if n == 0:
            return "no adversarial schedule (--schedules 0)"
        return f"every bit-exact trial under {n} adversarial schedule{'s' if n != 1 else ''} (--schedules {n})"
    return repr(plan)



def load_resume(path: str, settings: dict, search: dict | None = None) -> dict[str, dict]:
    """The finished trials of a tune record, by label, after checking it is the same tune:
    the same `settings`, and the same `search` (its `budget`, `space` and `schedules`:
    another would run other variants or check them otherwise, and writing the record
    back would drop trials it holds)."""
    try:
        doc = json.loads(_read_record(path).decode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the tune record: {exc.strerror}", file=path) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not a tune record ({not_text(exc)})", file=path) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not a tune record (invalid JSON: {exc.msg} at line {exc.lineno})", file=path) from None
    except RecursionError:   # (arrays or objects nested thousands deep: no tune writes them)
        raise ConfigError("not a tune record (invalid JSON: nested too deeply to read)", file=path) from None
    except ValueError:   # (an integer of more digits than Python converts: no tune writes one)
        raise ConfigError("not a tune record (a number of thousands of digits)", file=path) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"not a tune record (no \"format\": \"{FORMAT}\")", file=path)
    theirs = doc.get("settings", {})
    if not isinstance(theirs, dict):
        raise ConfigError("bad tune record: \"settings\" is not an object", file=path, key="settings")
    for key, mine in settings.items():
        if key == "identity":
            _check_identity(theirs.get(key), mine, settings, path)
            continue
        # (records written before max_instructions was a setting ran with its default)
        recorded = theirs.get(key, _SETTING_DEFAULTS.get(key))
        if key == "driver":
            recorded, mine = _without_outputs(recorded), _without_outputs(mine)
        if recorded != mine:
            raise ConfigError(f"the record is of another tune: its {key} is {recorded!r}, this tune's is "
                              f"{mine!r}", file=path, key=key)
    for key, mine in (search or {}).items():
        if key == "schedules":
            recorded = doc.get(key, DEFAULT_PLAN)
            if recorded != mine:
                raise ConfigError(f"the record is of another search: it checked {schedules_text(recorded)}, this "
                                  f"tune checks {schedules_text(mine)}: resume with the record's --schedules, or "
                                  "start a new tune", file=path, key=key)
            continue
        # (the params' order too: it orders the enumeration, steers the search and
        # names the trials)
        if key in doc and (doc[key] != mine or key == "space" and isinstance(doc[key], dict)
                           and list(doc[key]) != list(mine)):
            flag = "--param" if key == "space" else f"--{key}"
            order = ", in its order" if doc[key] == mine else ""
            raise ConfigError(f"the record is of another search: its {key} is {doc[key]!r}, this tune's is "
                              f"{mine!r} ({flag}: resume with the record's{order}, or start a new tune)",
                              file=path, key=key)
    trials = doc.get("trials", [])
    if not isinstance(trials, list):
        raise ConfigError("bad tune record: \"trials\" is not a list", file=path, key="trials")
    finished, where = {}, {}
    for index, t in enumerate(trials):
        if isinstance(t, dict) and "status" not in t:
            continue   # a trial that was running when the record was saved: run it again
        _check_resumed(t, settings.get("objective", "us_per_step"), path, f"trials[{index}]")
        if t.get("same_as") is None:   # (a trial not run, of a build tried earlier: not a result of its own)
            name = label(t["params"])
            if name in finished:      # (a tune runs each variant once: which result would be its?)
                raise ConfigError(f"bad tune record: trials[{where[name]}] and trials[{index}] both hold a result "
                                  f"of {name or 'the default'}", file=path, key=f"trials[{index}]")
            finished[name], where[name] = t, index
    return finished


_CHANGED = {
    "program": "the record was made from a different version of {program} (its text, a file it imports "
               "or its reference file changed)",
    "hw": "the record was made with a different hardware profile {hw} (its file, or one it extends, changed)",
    "inputs": "the record was made from a different --inputs file {inputs} (its contents changed)",
}


def _check_identity(recorded, mine: dict, settings: dict, path: str) -> None:
    """The record's `identity` is this tune's: its trials ran what this tune would run.
    A record written before tunes recorded it (none) is resumed unchecked."""
    if recorded is None:
        return
    if not isinstance(recorded, dict):
        raise ConfigError("bad tune record: \"settings.identity\" is not an object", file=path, key="identity")
    for key, why in _CHANGED.items():
        if recorded.get(key) != mine.get(key):
            names = {k: os.path.basename(settings.get(k) or "") if k != "hw" else settings.get(k)
                     for k in ("program", "hw", "inputs")}
            raise ConfigError(f"{why.format(**names)}: start a new tune or restore it", file=path,
                              key=f"identity.{key}")


def _read_record(path: str) -> bytes:
    """The bytes of a record file; from a device or a pipe a piece at a time, stopping at
    the first NUL byte (no JSON text has one), so that a stream that never ends
    (/dev/zero, /dev/urandom) is refused instead of filling memory."""
    with open(path, "rb") as fh:
        if stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return fh.read()
        pieces = []
        while piece := fh.read(1 << 20):
            if b"\0" in piece:
                raise ConfigError("not a tune record (it holds NUL bytes: not JSON text)", file=path)
            pieces.append(piece)
        return b"".join(pieces)


def _finite_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _check_resumed(t, objective: str, path: str, key: str) -> None:
    """A finished trial of a tune record has what `Tune.finish` reads from it, or the record is bad."""
    def bad(why: str):
        raise ConfigError(f"bad tune record: {why}", file=path, key=key)

    if not isinstance(t, dict):
        bad("a trial is not an object")
    params = t.get("params")
    if not isinstance(params, dict) or not all(isinstance(v, int) and not isinstance(v, bool)
                                               for v in params.values()):
        bad("\"params\" is not an object of integers")
    if t["status"] not in ("ok", "rejected"):
        bad(f"\"status\" is {t['status']!r}, not \"ok\" or \"rejected\"")
    for field in ("reason", "wall_s", "report"):
        if field not in t:
            bad(f"the trial lacks \"{field}\"")
    if t["report"] is not None and not isinstance(t["report"], dict):
        bad("\"report\" is not an object")
    if t["status"] == "ok" and t["report"] is None:
        bad("an \"ok\" trial has no report (\"report\" is null)")
    wall = t["wall_s"]
    if not (_finite_number(wall) and wall >= 0):
        bad(f"its \"wall_s\" is {str(wall)[:40]}, not a number of seconds")
    schedules = t["report"].get("schedules") if t["report"] else None
    if schedules is not None and not (isinstance(schedules, list) and all(
            isinstance(e, dict) and e.get("outcome") in SCHEDULE_OUTCOMES and isinstance(e.get("schedule"), str)
            for e in schedules)):
        bad("its report's \"schedules\" is not a list of schedule outcomes")
    # (a trial rejected for a schedule was bit-exact in its normal run: a resumed tune may
    # rank it again until it checks it, `Tune.evaluate`)
    ranked = t["status"] == "ok" or _failed_schedules(t)
    if ranked or t["report"]:
        try:
            figures = breakdown(t["report"])
            figures = [figures["total"], *figures["parts"].values()]
            if ranked:
                figures.append(objective_of(t["report"], objective))
        except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError, OverflowError) as exc:
            bad(f"its report cannot be read ({type(exc).__name__}: {exc})")
        if not all(_finite_number(v) for v in figures):
            bad("its report's times are not all finite numbers")
        if ranked and not figures[-1] > 0:   # (a run takes time; speedups divide by it)
            bad(f"its {objective} is {figures[-1]!r}, not more than 0")
    cycles = t["report"].get("cycles") if t["report"] else None
    if cycles is not None and not (isinstance(cycles, int) and not isinstance(cycles, bool) and cycles >= 0):
        bad(f"its report's \"cycles\" is {str(cycles)[:40]}, not a whole number of cycles")
    if t["status"] == "ok" and t["report"].get("bit_exact") is not True:
        bad("an \"ok\" trial's report is not bit-exact (a tune ranks only variants whose bits checked out)")


# ----------------------------------------------------------------------- text


def render(tune: Tune) -> str:
    space = tune.space
    default = tune.default_record()
    base = default["objective"] if default and default["status"] == "ok" else None
    widths = [max(len(n), *(len(str(v)) for v in space.values[n])) for n in space.names]
    head = "  ".join(f"{n:>{w}}" for n, w in zip(space.names, widths))
    lines = [f"{'rank':>4}  {head}  {tune.objective:>12}  {'speedup':>7}  bound by (share of the step)"]
    ranks: dict[int, int] = {}
    for t in tune.ranking():
        # (a trial of a build already tried shares that trial's rank, on a row after it)
        same_as = t.get("same_as")
        rank = ranks[same_as] if same_as in ranks else len(set(ranks.values())) + 1
        ranks[t["index"]] = rank
        cells = "  ".join(f"{t['params'][n]:>{w}}" for n, w in zip(space.names, widths))
        speedup = f"{base / t['objective']:.3f}x" if base else "-"
        mark = _marks(tune, t)
        value = format_objective(t["objective"], tune.objective)
        lines.append(f"{rank:>4}  {cells}  {value:>12}  {speedup:>7}  {_breakdown_text(t['breakdown'])}{mark}")
    rejected = [t for t in tune.trials if t.get("status") == "rejected"]
    if rejected:
        lines.append(f"rejected ({len(rejected)}):")
        lines += [f"  {label(t['params'])}{_marks(tune, t, ' ')}: {t['reason']}" for t in rejected]
    ranked = tune.ranking()
    if ranked:
        best = ranked[0]
        checked = _checked_text(tune.plan_schedules())
        if best["default"]:
            lines.append(f"best: the default ({label(best['params'])}); no variant was faster; {checked}")
        elif base:
            lines.append(f"best: {label(best['params'])}, {base / best['objective']:.3f}x the default "
                         f"({label(space.default)}); {checked}")
        else:
            lines.append(f"best: {label(best['params'])} (the default was rejected); {checked}")
    else:
        lines.append("no variant was bit-exact: nothing to recommend")
    return "\n".join(lines)


def _checked_text(plan: dict) -> str:
    """What the best was checked under besides the normal DMA schedule, for its line."""
    if plan["best"]:
        return "the same bits under the late DMA schedule"
    n = plan["trials"]
    if n:
        return f"the same bits under {n} adversarial DMA schedule{'s' if n != 1 else ''}"
    return "not run under other DMA schedules (--schedules 0)"


def same_build_text(tune: Tune, trial: dict) -> str:
    """"same build as trial N" (N the record's index; "the default" for the default's)."""
    original = tune.trials[trial["same_as"]]
    return "same build as " + ("the default" if original["default"] else f"trial {original['index']}")


def _marks(tune: Tune, trial: dict, sep: str = "  ") -> str:
    marks = (["default"] if trial["default"] else []) + (
        [same_build_text(tune, trial)] if trial.get("same_as") is not None else [])
    return "".join(f"{sep}({m})" for m in marks)


def summary(tune: Tune) -> str:
    """"exhaustive search, 12 trials (3 the same build as an earlier one: not run)"."""
    same = sum(1 for t in tune.trials if t.get("same_as") is not None)
    count = f"{len(tune.trials)} trial{'s' if len(tune.trials) != 1 else ''}"
    return f"{tune.search} search, {count}" + (
        f" ({same} the same build as an earlier one: not run)" if same else "")


def format_objective(value: float, objective: str) -> str:
    """A trial's objective as the table and the progress lines show it: microseconds
    to three decimals, cycles as a whole number."""
    return f"{value:.3f}" if objective == "us_per_step" else f"{value:,.0f}"


def _breakdown_text(parts: dict | None) -> str:
    if not parts:
        return ""
    total = parts["total"]
    shares = sorted(((k, v) for k, v in parts["parts"].items() if v > 0), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in shares) if total else ""
