"""K3 timing-only runs: where the router's choices come from, and the budget table.

In a timing-only run nothing is computed (docs/architecture.md, "Timing-only runs"),
so the one data-dependent thing the K3 programs read back into scalars, the router's
top-k expert ids, is supplied by the driver: per decode step, the same sequence for
every core that routes (docs/k3_programs.md: for each MoE layer in order, for each
row b, for each slot j, expert topi[b, j]). It comes either from a record a data run
wrote (`--record-routing FILE`, replayed with `--routing FILE`: the timing-only run
then takes exactly the data run's cycles), or from a seeded synthetic draw: each row
picks TOPK distinct experts, an expert's popularity falling as 1/rank^skew over a
seeded ranking of the experts (skew 0: uniform).

The budget table puts a step's time, per layer and category, next to the published
figures of the Kimi K3 megakernel on 16 TPU v7 chips at batch 1 (MISSION.md): about
55 us per layer (weight streaming 25, collectives 14, experts 9, attention 1.5,
routing 0.7) and about 195 us of fixed cost per step.
"""

from __future__ import annotations

import base64
import json

import attrs
import numpy as np

from mkemu.errors import ConfigError, read_user_file
from mkemu.runner import atomic_write

FORMAT = "mkemu-k3-routing"
VERSION = 1
# The published per-layer budget at batch 1 (us) and the fixed cost per step (us).
PUBLISHED_LAYER_US = {"weight_streaming": 25.0, "collectives": 14.0, "experts": 9.0, "attention": 1.5,
                      "routing": 0.7}
PUBLISHED_LAYER_TOTAL_US = 55.0
PUBLISHED_FIXED_US = 195.0
ATTENTION_REGIONS = ("kda", "mla")


def synthetic_routing(cfg, batch: int, seed: int, skew: float, step: int) -> np.ndarray:
    """One step's expert ids in readback order, drawn from the seeded distribution."""
    ranking = np.random.default_rng([seed, 2]).permutation(cfg.n_experts)
    weight = np.empty(cfg.n_experts)
    with np.errstate(over="ignore"):
        # (floored: a huge skew leaves every expert a chance, however small, so top-k can draw)
        weight[ranking] = np.maximum(1.0 / np.arange(1, cfg.n_experts + 1) ** skew, np.finfo(float).tiny)
    p = weight / weight.sum()
    out = []
    moe = [plan for plan in cfg.layer_plan() if plan.ffn == "moe"]
    for layer, _ in enumerate(moe):
        for b in range(batch):
            rng = np.random.default_rng([seed, 3, step, layer, b])
            out.extend(rng.choice(cfg.n_experts, size=cfg.top_k, replace=False, p=p).tolist())
    return np.array(out, np.int64)


def model_shape(cfg) -> dict:
    """Every key of the model config but its description, as a record keeps it: a model
    file may reuse a shipped model's name with another shape, whose routing differs."""
    return {k: list(v) if isinstance(v, tuple) else v      # (lists, as JSON has them)
            for k, v in attrs.asdict(cfg).items() if k != "description"}


class RoutingRecord:
    """The router's choices and the tokens of every step of a data run, per core."""

    def __init__(self, model: str, batch: int, cores: int, steps: list[dict] | None = None,
                 payloads: list[list[list[bytes]]] | None = None, shape: dict | None = None,
                 seed: int | None = None, prompt_len: int | None = None):
        self.model, self.batch, self.cores = model, batch, cores
        self.shape = shape              # model_shape of the model, when known
        # The run's seed and prompt length, when known: the routing depends on them too.
        self.seed, self.prompt_len = seed, prompt_len
        self.steps = steps or []        # per step: tokens, pos, readbacks
        # ... and the payloads' bytes, per step and core (base64 only in the file).
        self._payloads = payloads or []

    def add(self, tokens, pos: int, readbacks: list[list[int]], payloads: list[list[bytes]]) -> None:
        self.steps.append({"tokens": np.asarray(tokens).tolist(), "pos": int(pos), "readbacks": readbacks})
        self._payloads.append([list(core) for core in payloads])

    def payloads(self, step: int) -> list[list[bytes]]:
        return [list(core) for core in self._payloads[step]]

    def routing(self, step: int) -> list[int]:
        """The router's choices of a step, the sequence every core that routes read (the
        same on every such core, checked when loaded; empty without MoE layers). The
        driver feeds it to every core, as it does synthetic routing: a core that does not
        route reads none of it, so a record replays on any program and scheme (which
        cores route differs: docs/k3_programs.md), not only on the one that wrote it."""
        return next((values for values in self.steps[step]["readbacks"] if values), [])

    def save(self, path: str) -> None:
        steps = [{**step, "payloads": [[base64.b64encode(p).decode() for p in core] for core in payloads]}
                 for step, payloads in zip(self.steps, self._payloads)]
        doc = {"format": FORMAT, "version": VERSION, "model": self.model, "batch": self.batch,
               "cores": self.cores, "steps": steps}
        if self.shape is not None:
            doc["model_config"] = self.shape
        for key in ("seed", "prompt_len"):
            if getattr(self, key) is not None:
                doc[key] = getattr(self, key)
        atomic_write(path, json.dumps(doc, separators=(",", ":")).encode())

    @classmethod
    def load(cls, path: str, cfg, batch: int, cores: int, steps: int, seed: int | None = None,
             prompt_len: int | None = None) -> RoutingRecord:
        """The record at `path`, checked against this run (model `cfg`, batch, cores, the
        steps it needs, and the seed and prompt length where both the record and the run
        name them): a bad file is a ConfigError naming the file and the field."""
        model = cfg.name
        try:
            doc = json.loads(read_user_file(path, "the routing record").decode("utf-8"),
                             object_pairs_hook=_no_key_twice)
        except _KeyTwice as exc:
            raise ConfigError(f"the routing record has key {exc.args[0]!r} twice in one object (a record "
                              "--record-routing writes has each once)", file=path, key=exc.args[0]) from None
        except ValueError as exc:    # (not UTF-8, not JSON)
            raise ConfigError(f"cannot read the routing record: {exc}", file=path) from None
        except RecursionError:       # (arrays or objects nested thousands deep)
            raise ConfigError("cannot read the routing record: nested too deeply to read", file=path) from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ConfigError("not a routing record written by --record-routing", file=path)
        if not _same(doc.get("version"), VERSION):
            raise ConfigError(f"the routing record is version {doc.get('version')!r}; this mkemu reads version "
                              f"{VERSION} (record it again with --record-routing)", file=path, key="version")
        for key, want in (("model", model), ("batch", batch), ("cores", cores)):
            if not _same(doc.get(key), want):
                raise ConfigError(f"the routing record is for {key} {doc.get(key)!r}; this run has {want!r}",
                                  file=path, key=key)
        # (A record written before it kept them has neither: it cannot be checked for them.)
        for key, want, flag in (("seed", seed, "--seed"), ("prompt_len", prompt_len, "--prompt-len")):
            if key in doc and want is not None and not _same(doc[key], want):
                raise ConfigError(f"the routing record is of a run with {flag} {doc[key]!r}; this run has {want!r} "
                                  "(the router's choices depend on it: record them with this run's "
                                  f"{flag})", file=path, key=key)
        _check_shape(doc, cfg, path)
        if not isinstance(doc.get("steps"), list):
            raise ConfigError("expected a list of steps", file=path, key="steps")
        if len(doc["steps"]) < steps:
            raise ConfigError(f"the routing record has {len(doc['steps'])} steps; this run needs "
                              f"{steps}", file=path, key="steps")
        used = doc["steps"][:steps]
        payloads = [_check_step(step, f"steps[{i}]", cfg, batch, cores, path) for i, step in enumerate(used)]
        return cls(model, batch, cores, [{k: v for k, v in step.items() if k != "payloads"} for step in used],
                   payloads)


class _KeyTwice(Exception):
    pass


def _no_key_twice(pairs: list) -> dict:
    """A JSON object's keys and values, refused if it names a key twice (json keeps the
    last: a hand-edited record would silently run with one of its two values)."""
    doc = dict(pairs)
    if len(doc) < len(pairs):
        seen = set()
        raise _KeyTwice(next(key for key, _ in pairs if key in seen or seen.add(key)))
    return doc


def _same(value, want) -> bool:
    """`value` is `want`, of its type too (JSON's 1.0 and true equal 1 in Python)."""
    return type(value) is type(want) and value == want


def _check_shape(doc: dict, cfg, path: str) -> None:
    """The record keeps its model's config (every one --record-routing writes does): it
    must be this run's model key for key, not only by name (its `description` aside)."""
    if "model_config" not in doc:
        raise ConfigError("the routing record keeps no model config (every record --record-routing writes has "
                          "one): it cannot be checked against this run's model", file=path, key="model_config")
    theirs, ours = doc["model_config"], model_shape(cfg)
    if not isinstance(theirs, dict):
        raise ConfigError("expected the recorded model's config keys", file=path, key="model_config")
    theirs = {key: value for key, value in theirs.items() if key != "description"}
    for key in sorted(set(ours) | set(theirs)):
        if not _same(theirs.get(key), ours.get(key)):
            raise ConfigError(f"the routing record is for another model named {cfg.name!r}: its {key} is "
                              f"{theirs.get(key)!r}, this run's {ours.get(key)!r}", file=path,
                              key=f"model_config.{key}")


def _ints(value, lo: int, hi: int) -> bool:
    """A list of integers in [lo, hi)?"""
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and lo <= v < hi
                                           for v in value)


def _check_step(step, where: str, cfg, batch: int, cores: int, path: str) -> list[list[bytes]]:
    """One recorded step as `add` writes it (a hand-edited or damaged file fails here);
    returns its payloads, decoded."""
    def bad(field: str, what: str):
        raise ConfigError(f"expected {what}", file=path, key=f"{where}.{field}" if field else where)

    if not isinstance(step, dict):
        bad("", "an object with tokens, pos, readbacks and payloads")
    if not _ints(step.get("tokens"), 0, cfg.vocab) or len(step["tokens"]) != batch:
        bad("tokens", f"a list of {batch} token ids in 0..{cfg.vocab - 1}")
    pos = step.get("pos")
    if not isinstance(pos, int) or isinstance(pos, bool) or not 0 <= pos < cfg.max_seq:
        bad("pos", f"a position in 0..{cfg.max_seq - 1}")
    readbacks = step.get("readbacks")
    if not isinstance(readbacks, list) or len(readbacks) > cores \
            or not all(_ints(r, -2**31, 2**31) for r in readbacks):
        bad("readbacks", f"a list of at most {cores} lists (one per core) of 32-bit integers")
    for core, values in enumerate(readbacks):
        _check_readbacks(values, f"readbacks[{core}]", cfg, batch, bad)
    routing = [core for core, values in enumerate(readbacks) if values]
    if not routing and any(plan.ffn == "moe" for plan in cfg.layer_plan()):
        # (else the replay fails mid-run: "only 0 were supplied")
        bad("readbacks", "the router's choices of at least one core: the model has MoE layers")
    for core in routing[1:]:
        if readbacks[core] != readbacks[routing[0]]:
            bad(f"readbacks[{core}]", f"the ids of readbacks[{routing[0]}] (every core that routes makes the same "
                                      "choices)")
    payloads = step.get("payloads")
    if not isinstance(payloads, list) or len(payloads) != cores or not all(
            isinstance(core, list) and all(isinstance(p, str) for p in core) for core in payloads):
        bad("payloads", f"a list of {cores} lists (one per core) of base64 strings")
    decoded = []
    for core in payloads:
        decoded.append([])
        for p in core:
            try:
                decoded[-1].append(base64.b64decode(p, validate=True))
            except ValueError:
                bad("payloads", "base64 strings (one does not decode)")
    return decoded


def _check_readbacks(values: list[int], field: str, cfg, batch: int, bad) -> None:
    """One core's readbacks of one step. The K3 programs read back into scalars only the
    router's top-k expert ids (docs/k3_programs.md, the contract with the timing-only
    mode): a core that routes reads, per MoE layer, row and slot, an expert id, the TOPK
    ids of a row distinct (the router masks each choice before the next); a core that
    does not route reads none. The programs index their tables with these ids, so a
    value out of range would fault inside a kernel, far from the record."""
    n_moe = sum(plan.ffn == "moe" for plan in cfg.layer_plan())
    need, k = n_moe * batch * cfg.top_k, cfg.top_k
    if values and len(values) != need:
        bad(field, f"no readbacks (a core that does not route) or {need} ({n_moe} MoE layers x {batch} rows x "
                   f"top-{k} expert ids), not {len(values)}")
    for i, v in enumerate(values):
        if not 0 <= v < cfg.n_experts:
            bad(f"{field}[{i}]", f"an expert id in 0..{cfg.n_experts - 1} (the router's choice), not {v}")
    for r in range(0, len(values), k):
        row = values[r:r + k]
        if len(set(row)) != k:
            bad(f"{field}[{r}:{r + k}]", f"{k} distinct expert ids (one row's top-{k}), not {row}")


def budget(report: dict, cfg, per_step: list[dict], cores: int, clock_hz: float) -> dict:
    """A step's time split like the published budget: per layer (us, averaged over
    cores and steps) and the fixed rest of the step (outside the layers)."""
    n = len(per_step)

    def us(cycles: float) -> float:
        return cycles / n / cores / clock_hz * 1e6

    own = _sum(f.get("region_own_cycles", {}) for f in per_step)
    waits = _sum(f["dma_wait_cycles"] for f in per_step)
    collective = report["breakdown_us"]["collectives"]
    layer = {
        "weight_streaming": report["breakdown_us"]["weight_streaming"],
        "collectives": collective,
        "experts": us(own.get("experts", 0) - waits.get("experts", 0)),
        "attention": us(sum(own.get(r, 0) - waits.get(r, 0) for r in ATTENTION_REGIONS)),
        "routing": us(own.get("router", 0) - waits.get("router", 0)),
    }
    regions = report["region_us_per_core"]
    # The megakernel marks its layers; a program launched per operator or per block
    # (per-op, super-op) has no layer region: there a layer is the step but the LM
    # head, its launches and the waits between kernels included.
    in_layers = regions["layer"] if "layer" in regions else report["us_per_step"] - regions.get("lm_head", 0.0)
    layer["other"] = max(in_layers - sum(layer.values()), 0.0)
    per_layer = {k: v / cfg.n_layers for k, v in layer.items()}
    return {"per_layer_us": per_layer, "layer_us": in_layers / cfg.n_layers,
            "fixed_us_per_step": report["us_per_step"] - in_layers,
            "published": {"per_layer_us": PUBLISHED_LAYER_US, "layer_us": PUBLISHED_LAYER_TOTAL_US,
                          "fixed_us_per_step": PUBLISHED_FIXED_US}}


def render_budget(b: dict) -> list[str]:
    lines = ["per layer (us, this run vs published K3 megakernel on 16 TPU v7 at batch 1):"]
    for key, published in b["published"]["per_layer_us"].items():
        lines.append(f"  {key.replace('_', ' '):17s} {b['per_layer_us'][key]:8.2f}   published {published:6.1f}")
    lines.append(f"  {'other':17s} {b['per_layer_us']['other']:8.2f}")
    lines.append(f"  {'layer total':17s} {b['layer_us']:8.2f}   published {b['published']['layer_us']:6.1f}")
    lines.append(f"fixed per step (outside layers): {b['fixed_us_per_step']:.1f} us   published "
                 f"{b['published']['fixed_us_per_step']:.0f} us")
    return lines


def _sum(dicts) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out
