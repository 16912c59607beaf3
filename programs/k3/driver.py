"""The K3 decode driver: runs a K3 program step by step and checks every step's bits.

`mkemu run programs/k3_megakernel.mk` hands the run to `drive`: it generates the
model's weights from the seed, writes them (and the layer plan) into every chip's
HBM (or, where the program declares one chip's share, each chip its own: homes.py), feeds a prompt token by token and then generates greedily, running the
program's launch sequence once per decode step. After each step the program's
logits must equal the numpy reference's bit for bit; on a mismatch, the per-layer
debug outputs (`dbg_attn`, `dbg_ffn`) name the first layer and operator that differ.

The driver sees the emulator only through the public API (`mkemu.Session`, handed
to it by `mkemu run` or by `mkemu.compile("k3_megakernel")(...)`); the reference is
`programs/k3/reference.py`, written from the model math alone.
"""

from __future__ import annotations

import contextlib
import io
import os
import zipfile
from pathlib import Path

import numpy as np

from mkemu import ConfigError
from mkemu.errors import EmulatorFault
from mkemu.runner import atomic_write_all

from . import reference as ref
from .config import load_config
from .reference_steps import ReferenceSteps, next_input, reference_state, replay_reference
from . import homes
from . import timing
from .config import param_counts, tensor_specs
from mkemu.isa.program import storage_bytes
from .weights import MAX_GENERATED_PARAMS, generate_weight_bits

COLLECTIVE_REGIONS = ("allgather", "allreduce", "alltoall", "collective", "reduce_scatter")
STEP_INPUTS = ("layer_plan", "tokens", "pos", "spec_base")
DEFAULTS = {"model": "k3-mini", "batch": 1, "prompt_len": 4, "steps": 4}
# The programs' short conv: three history rows and the input (programs/k3/model.mk, conv4).
CONV_TAPS = 4
RMS_EPS = 1e-5   # the `1e-5` of model.mk's rmsnorm_rows


def _options(options: dict) -> dict:
    out = dict(DEFAULTS)
    out.update({k: v for k, v in options.items() if v is not None})
    return out


def params(options: dict, info) -> dict[str, int]:
    """Compile-time parameters of a K3 program for this model and machine."""
    opts = _options(options)
    cfg = load_config(opts["model"])
    given = os.fspath(opts["model"])
    # (a model file's own name may be a shipped model's: the file is named too)
    of = "" if given == cfg.name else f" (the file {given})"
    if tuple(cfg.dense_layers) != (0,):
        raise ConfigError(f"the K3 programs have the dense FFN at layer 0 only (dense_layers = [0]); model "
                          f"'{cfg.name}' has dense_layers {list(cfg.dense_layers)}{of}", key="model")
    if not cfg.kda_layers or not cfg.mla_layers:
        # (their state arrays are stacked over the layers of each kind: none is no array)
        raise ConfigError(f"the K3 programs need at least one KDA and one MLA layer; model '{cfg.name}' has "
                          f"{len(cfg.kda_layers)} KDA and {len(cfg.mla_layers)} MLA layers "
                          f"(mla_layers {list(cfg.mla_layers)} of {cfg.n_layers}){of}", key="model")
    if cfg.conv_kernel != CONV_TAPS:
        raise ConfigError(f"the K3 programs' short conv has {CONV_TAPS} taps (conv_kernel = {CONV_TAPS}); model "
                          f"'{cfg.name}' has conv_kernel {cfg.conv_kernel}{of}", key="model")
    if cfg.eps != RMS_EPS:
        # (the reference would take the model's and fail the bits, blaming the first layer)
        raise ConfigError(f"the K3 programs' RMSNorm adds eps = {RMS_EPS:g} (a constant of programs/k3/model.mk); "
                          f"model '{cfg.name}' has eps {cfg.eps:g}{of}", key="model")
    if not 1 <= opts["batch"] <= ref.MAX_BATCH:
        raise ConfigError(f"batch must be 1..{ref.MAX_BATCH}, got {opts['batch']}", key="batch")
    _check_mode(opts, cfg)
    _check_lengths(opts)
    rows = _spec_rows(opts, cfg)
    if rows is None:
        _steps(opts, cfg)
    # Verify rows are the program's BATCH rows of one sequence (SPEC = 1); one row is an
    # ordinary decode step, the very same program. SPEC is the driver's either way (a tune
    # refuses to search it, as a --set of it is refused).
    spec = {"SPEC": 0 if rows is None or rows == 1 else 1}
    return {
        "DIM": cfg.dim, "NLAYERS": cfg.n_layers, "NKDA": len(cfg.kda_layers),
        "NMLA": len(cfg.mla_layers), "HEADS": cfg.n_heads, "QRANK": cfg.q_rank,
        "KVRANK": cfg.kv_rank, "DENSE_INTER": cfg.dense_inter, "NEXP": cfg.n_experts,
        "TOPK": cfg.top_k, "NSHARED": cfg.n_shared, "LATENT": cfg.latent_dim,
        "EINTER": cfg.expert_inter, "VOCAB": cfg.vocab, "MAXSEQ": cfg.max_seq,
        "BATCH": opts["batch"] if rows is None else rows, "NCORES": info.cores,
        "CORES_PER_CHIP": info.cores_per_chip, "EXPERT_MX": int(cfg.expert_dtype == "mxfp4"), **spec,
    }


def _spec_rows(opts: dict, cfg) -> int | None:
    """--spec-rows R (None without it), checked with the options it combines with."""
    rows, accept = opts.get("spec_rows"), opts.get("accept")
    if rows is None:
        if accept is not None:
            raise ConfigError("accept is the acceptance length of speculative decoding: it needs --spec-rows",
                              key="accept")
        return None
    if not 1 <= rows <= ref.MAX_BATCH:
        raise ConfigError(f"spec_rows must be 1..{ref.MAX_BATCH} (one anchor row + up to "
                          f"{ref.MAX_BATCH - 1} drafts), got {rows}", key="spec_rows")
    if opts["batch"] != 1:
        raise ConfigError(f"--spec-rows verifies {rows} rows of ONE sequence per step (they take the program's "
                          f"batch rows): it needs --batch 1, got --batch {opts['batch']}", key="batch")
    if accept is not None and not 1 <= accept <= rows:
        raise ConfigError(f"accept must be 1..{rows} (tokens accepted per verify step of {rows} rows), "
                          f"got {accept}", key="accept")
    for key in ("routing", "record_routing"):
        if opts.get(key):
            raise ConfigError(f"{key} does not record or replay verify steps (their committed "
                              "rows); run --spec-rows without it", key=key)
    need = opts["prompt_len"] + opts["steps"] + rows - 2
    if need > cfg.max_seq:
        raise ConfigError(f"{opts['prompt_len']} prompt + {opts['steps']} generated tokens with {rows} verify rows "
                          f"need up to {need} positions (a step's rows past the accepted ones still take "
                          f"positions); {cfg.name} has max_seq {cfg.max_seq}", key="steps")
    return rows


# Driver-set params a user may still choose with --set (docs/k3_programs.md, EXPERT_MX).
USER_SETTABLE = ("EXPERT_MX",)


def check_overrides(driver_params: dict[str, int], given: dict[str, int]) -> None:
    """The params the driver sets (`params`: the model's shape, BATCH, SPEC, the machine)
    must be the driver's: a `--set` that overrides one would compile a program the
    driver's weights, tokens and state do not fit. Called before the program compiles
    (a shape the model's asserts refuse would otherwise be reported as the program's
    error), and again by the driver on what was compiled."""
    for name, value in given.items():
        want = driver_params.get(name)
        if want is not None and name not in USER_SETTABLE and value != want:
            raise ConfigError(f"{name} is set by the K3 driver (here {want}, from --model, --batch, "
                              f"--spec-rows and the machine), not by --set {name}={value}", key="params")


def _check_overrides(session, opts: dict) -> None:
    check_overrides(params(opts, session.info), {p.name: p.value for p in getattr(session.program, "params", ())})


def _check_mode(opts: dict, cfg) -> None:
    """What a timing-only or a data run cannot do, said before anything runs."""
    if opts.get("timing_only"):
        for key in ("dump", "check_layers", "record_routing"):
            if opts.get(key):
                raise ConfigError(f"{key} needs computed numbers; a timing-only run has none", key=key)
        return
    for key in ("routing", "routing_skew"):
        if opts.get(key) is not None:
            raise ConfigError(f"{key} applies to --timing-only runs", key=key)
    total = param_counts(cfg).total
    if total > MAX_GENERATED_PARAMS:
        # (as stored: bf16, the routed experts in their own dtype, MXFP4 or bf16)
        stored = sum(storage_bytes(cfg.expert_dtype if spec.routed else "bf16", spec.shape)
                     for spec in tensor_specs(cfg))
        raise ConfigError(
            f"model '{cfg.name}' has {total:,} parameters: a data run would generate about {stored:,} bytes "
            f"of weights ({_gib(stored)} as stored, the routed experts {cfg.expert_dtype}) and {4 * total:,} "
            f"more for the numpy reference ({_gib(4 * total)} of float32); run it with --timing-only",
            key="model")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):,.0f} GiB"


def _check_lengths(opts: dict) -> None:
    """--prompt-len and --steps, each at least 1 (named by the option that is wrong)."""
    for key in ("prompt_len", "steps"):
        value = opts[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{key} must be at least 1, got {value!r}", key=key)


def _steps(opts: dict, cfg) -> int:
    """Decode steps of the run (its callers have checked the lengths: `_check_lengths`)."""
    prompt_len, gen = opts["prompt_len"], opts["steps"]
    n_steps = prompt_len + gen - 1
    if n_steps > cfg.max_seq:
        raise ConfigError(f"{prompt_len} prompt + {gen} generated tokens need {n_steps} positions; "
                          f"{cfg.name} has max_seq {cfg.max_seq}", key="steps")
    return n_steps


def _layer_plan(cfg) -> np.ndarray:
    return np.array([[int(p.attn == "mla"), p.attn_index, int(p.ffn == "moe"), p.ffn_index]
                     for p in cfg.layer_plan()], np.int32)


def drive(session, options: dict) -> dict:
    opts = _options(options)
    cfg = load_config(opts["model"])
    _check_mode(opts, cfg)
    _check_lengths(opts)
    rows = _spec_rows(opts, cfg)
    _check_overrides(session, opts)
    made = None       # the --dump folder, if this run created it
    if opts.get("dump") and not session.timing_only:
        made = None if Path(opts["dump"]).exists() else Path(opts["dump"])
        _dump_dir(opts["dump"])
    try:
        if rows is not None:
            return drive_spec(session, opts, cfg, rows)
        if session.timing_only:
            return drive_timing_only(session, opts, cfg)
        return _drive_data(session, opts, cfg)
    except BaseException:
        # A run that ends with nothing dumped (interrupted, or an error) leaves no empty
        # folder behind it; a fault's dump stays.
        if made is not None:
            with contextlib.suppress(OSError):
                made.rmdir()
        raise


def _drive_data(session, opts: dict, cfg) -> dict:
    """Decode steps with the reference beside them (`drive`'s data run)."""
    batch, prompt_len = opts["batch"], opts["prompt_len"]
    n_steps = _steps(opts, cfg)
    seed = opts.get("seed", 0)
    buffers = session.buffers()
    # The routed experts are MXFP4 values when the program stores them as MXFP4 (the
    # model's expert_dtype, or --set EXPERT_MX=1): the reference then computes with exactly
    # what the matrix unit decodes.
    weights = generate_weight_bits(cfg, seed, _expert_dtype(buffers))
    for name, (dtype, shape, kind) in buffers.items():
        if kind in ("input", "inout") and name not in weights and name not in STEP_INPUTS:
            raise ConfigError(f"the program wants an input {name!r} that the K3 driver does not provide "
                              f"(weights are named as in programs/k3/weights.py)", key=name)
    for name, array in weights.items():
        if name in buffers:
            _write_weight(session, name, array, buffers[name][1])
    session.write("layer_plan", _layer_plan(cfg))
    if "spec_base" in buffers:
        session.write("spec_base", np.zeros(1, np.int32))
    record = (timing.RoutingRecord(cfg.name, batch, session.info.cores, shape=timing.model_shape(cfg),
                                   seed=seed, prompt_len=prompt_len)
              if opts.get("record_routing") else None)

    rng = np.random.default_rng([seed, 1])
    prompt = rng.integers(0, cfg.vocab, size=(batch, prompt_len))
    check_layers = bool(opts.get("check_layers"))
    tokens = prompt[:, 0]
    generated, per_step, ref_logits_all, emu_logits_all = [], [], [], []
    mismatch = None
    progress = opts.get("progress")
    with _dump_at_fault(opts, cfg, weights, prompt, ref_logits_all, emu_logits_all,
                        lambda: reference_state(cfg, weights, prompt, len(ref_logits_all))), \
            ReferenceSteps(cfg, weights, prompt, n_steps, traced=check_layers) as reference:
        for step in range(n_steps):
            session.write("tokens", tokens.astype(np.int32))
            session.write("pos", np.array([step], np.int32))
            figures = session.run()
            per_step.append(figures)
            if record is not None:
                record.add(tokens, step, session.take_readbacks(), session.take_payloads())
            expected, trace = reference.next()
            got, bad = _compare_step(session, cfg, buffers, expected, trace,
                                     lambda t, step=step: replay_reference(cfg, weights, prompt, step, t))
            ref_logits_all.append(expected)
            emu_logits_all.append(got)
            if bad is not None:
                mismatch = f"step {step}: {bad}"
            tokens = next_input(prompt, step, expected)
            if step >= prompt_len - 1:
                generated.append(tokens)    # (past the prompt: the greedy choice)
            if progress:
                progress(step + 1, n_steps, figures)
            if mismatch:
                break
    report = _with_budget(_report(session, cfg, opts, per_step, generated, mismatch), cfg, per_step, session.info)
    if record is not None:
        record.save(opts["record_routing"])
        report["routing_record"] = opts["record_routing"]
    if opts.get("dump"):
        _dump(opts["dump"], weights, prompt, ref_logits_all, emu_logits_all,
              reference_state(cfg, weights, prompt, len(per_step)), batch, cfg.vocab)
        report["dump"] = str(opts["dump"])
    return report


def _expert_dtype(buffers: dict) -> str:
    """The routed experts' storage as the program declares it ("mxfp4" or "bf16")."""
    return "mxfp4" if buffers.get("moe_w1", ("bf16",))[0] == "mxfp4" else "bf16"


def _write_weight(session, name: str, array, declared: tuple[int, ...]) -> None:
    """The whole tensor into every chip's HBM, or each chip its share when the program
    declares one (expert homes, KDA head shards: programs/k3/homes.py)."""
    info = session.info
    shards = homes.chip_shards(name, array, declared, info.chips, info.cores_per_chip)
    if shards is None:
        session.write(name, array)
        return
    for chip, shard in enumerate(shards):
        session.write(name, shard, chip)


def drive_timing_only(session, opts: dict, cfg) -> dict:
    """Every step's cycles with nothing computed: the tokens and the router's choices
    come from a routing record, or are drawn from the seed."""
    batch = opts["batch"]
    n_steps = _steps(opts, cfg)
    seed = opts.get("seed", 0)
    session.write("layer_plan", _layer_plan(cfg))
    record = None
    if opts.get("routing"):
        record = timing.RoutingRecord.load(opts["routing"], cfg, batch, session.info.cores, n_steps, seed,
                                           opts["prompt_len"])
    skew = float(opts.get("routing_skew") or 0.0)
    tokens = np.random.default_rng([seed, 1]).integers(0, cfg.vocab, size=(n_steps, batch))
    per_step = []
    progress = opts.get("progress")
    for step in range(n_steps):
        if record is not None:
            entry = record.steps[step]
            session.write("tokens", np.array(entry["tokens"], np.int32))
            session.write("pos", np.array([entry["pos"]], np.int32))
            session.feed_readbacks(record.routing(step))
            session.feed_payloads(record.payloads(step))
        else:
            session.write("tokens", tokens[step].astype(np.int32))
            session.write("pos", np.array([step], np.int32))
            session.feed_readbacks(timing.synthetic_routing(cfg, batch, seed, skew, step))
        figures = session.run()
        per_step.append(figures)
        if progress:
            progress(step + 1, n_steps, figures)
    report = _with_budget(_report(session, cfg, opts, per_step, [], None), cfg, per_step, session.info)
    report.update(bit_exact=None, mismatch=None, timing_only=True, tokens=None,
                  routing=opts["routing"] if record is not None else f"synthetic, skew {skew:g}")
    return report


def drive_spec(session, opts: dict, cfg, rows: int) -> dict:
    """Speculative decoding: every step verifies `rows` consecutive positions of one
    sequence (docs/k3_programs.md, "Speculative decoding").

    A step's rows are the tokens still to be fed (the prompt's, in chunks of `rows`, then
    the last accepted token, the anchor), followed by drafts. The drafter is the
    reference's own greedy continuation with a seeded acceptance length L per step
    (`--accept L`, else uniform in 1..rows from the seed): the first L - 1 drafts are the
    greedy tokens, the ones after deliberately wrong (a seeded other token). The step
    accepts the longest prefix of drafts that match the verified greedy tokens plus one,
    and the next step starts from the state after the last accepted row (`spec_base`
    names its slot). Data runs check every row's logits bit for bit; timing-only runs take
    the acceptance from L alone (a right draft always matches, a wrong one never does)."""
    seed, prompt_len, gen = opts.get("seed", 0), opts["prompt_len"], opts["steps"]
    timing_only = session.timing_only
    weights = None
    buffers = session.buffers()
    if not timing_only:
        # As in `drive`: MXFP4-exact experts when the program stores them so, and each
        # chip its share where the program declares one (expert homes, KDA head shards).
        weights = generate_weight_bits(cfg, seed, _expert_dtype(buffers))
        for name, array in weights.items():
            if name in buffers:
                _write_weight(session, name, array, buffers[name][1])
    session.write("layer_plan", _layer_plan(cfg))
    prompt = np.random.default_rng([seed, 1]).integers(0, cfg.vocab, size=(1, prompt_len))
    accept_rng = np.random.default_rng([seed, 3])
    wrong_rng = np.random.default_rng([seed, 4])
    filler_rng = np.random.default_rng([seed, 5])
    fixed = opts.get("accept")
    state = None if timing_only else ref.init_state(cfg, 1)
    remaining = [int(t) for t in prompt[0]]      # tokens of the sequence not fed yet
    generated, accepted, per_step, ref_logits_all, emu_logits_all = [], [], [], [], []
    pos = base = 0
    mismatch = None
    check_layers = bool(opts.get("check_layers"))
    progress = opts.get("progress")
    with _dump_at_fault(opts, cfg, weights, prompt, ref_logits_all, emu_logits_all, lambda: state,
                        rows=rows):
        while len(generated) < gen:
            forced = min(rows, len(remaining))
            length = fixed if fixed is not None else int(accept_rng.integers(1, rows + 1))
            right = min(length - 1, rows - forced)  # drafts the drafter gets right this step

            def draft(r, greedy, forced=forced, right=right):
                if r - forced < right:
                    return greedy
                return (greedy + 1 + int(wrong_rng.integers(cfg.vocab - 1))) % cfg.vocab

            if timing_only:
                tokens = np.array(remaining[:forced] + filler_rng.integers(0, cfg.vocab, rows - forced).tolist())
            else:
                trace = {} if check_layers else None
                before = state
                expected, states, tokens = ref.verify_step(cfg, weights, state, remaining[:forced], trace=trace,
                                                           rows=rows, draft=draft)
            session.write("tokens", tokens.astype(np.int32))
            session.write("pos", np.array([pos], np.int32))
            session.write("spec_base", np.array([base], np.int32))
            if timing_only:
                session.feed_readbacks(timing.synthetic_routing(cfg, rows, seed, float(opts.get("routing_skew") or 0.0),
                                                                len(per_step)))
            figures = session.run()
            per_step.append(figures)
            if len(remaining) > rows:               # all prompt: nothing to accept but the rows
                kept, new = rows, []
            elif timing_only:
                kept = forced + right
                new = filler_rng.integers(0, cfg.vocab, right + 1).tolist()   # (nothing is computed)
            else:
                greedy = ref.next_tokens(expected)
                matched = 0
                while forced + matched < rows and tokens[forced + matched] == greedy[forced + matched - 1]:
                    matched += 1
                kept = forced + matched
                new = [int(t) for t in greedy[forced - 1:kept]]
            if not timing_only:
                got, bad = _compare_step(session, cfg, buffers, expected, trace,
                                         lambda t: ref.verify_step(cfg, weights, before, tokens, trace=t))
                ref_logits_all.append(expected)
                emu_logits_all.append(got)
                if bad is not None:
                    mismatch = f"step {len(per_step) - 1}: {bad}"
                state = states[kept - 1]
            accepted.append(len(new))
            generated += new
            remaining = remaining[rows:] if len(remaining) > rows else [new[-1]]
            pos, base = pos + kept, kept - 1
            if progress:
                progress(len(generated), gen, figures)    # (the last step may accept more than gen)
            if mismatch:
                break
    report = _with_budget(_report(session, cfg, opts, per_step, [], mismatch), cfg, per_step, session.info)
    gen_steps = [i for i, n in enumerate(accepted) if n]
    gen_us = sum(per_step[i]["cycles"] for i in gen_steps) / session.info.clock_hz * 1e6
    report.update(
        spec_rows=rows, batch=1,
        acceptance=(f"fixed, {fixed} per step" if fixed is not None else f"seeded, uniform 1..{rows} per step")
        + "; drafter: the reference's greedy continuation, deliberately wrong after the first L - 1 drafts",
        accepted_per_step=accepted,
        accepted_tokens_per_step=sum(accepted) / len(gen_steps) if gen_steps else 0.0,
        accepted_tokens_per_s=sum(accepted) / gen_us * 1e6 if gen_us else 0.0)
    if timing_only:
        report.update(bit_exact=None, mismatch=None, timing_only=True, tokens=None,
                      routing=f"synthetic, skew {float(opts.get('routing_skew') or 0.0):g}")
    else:
        report["tokens"] = [generated]
        if opts.get("dump"):
            _dump(opts["dump"], weights, prompt, ref_logits_all, emu_logits_all, state, rows, cfg.vocab)
            report["dump"] = str(opts["dump"])
    return report


drive.mkemu_driver = True
drive.params = params
drive.check_overrides = check_overrides


def _compare_step(session, cfg, buffers, expected, trace, rerun):
    """Chip 0's logits of the step just run and the first difference from the reference
    (None if bit-exact): each layer against `trace` when the layers are checked (a
    trace is given), else, on a mismatch, against the trace of the reference step run
    again by `rerun(trace)`, to name the first layer that differs."""
    got = session.read("logits", 0)
    bad = _first_difference(expected, got)
    if trace is None and bad is not None:
        trace = {}
        rerun(trace)
    if trace is not None:
        bad = _layer_difference(session, cfg, trace, buffers) or bad
    return got, bad


def _first_difference(expected: np.ndarray, got: np.ndarray) -> str | None:
    e = np.asarray(expected, np.float32)
    g = np.asarray(got, np.float32)
    same = (e.view(np.uint32) == g.view(np.uint32)) | (np.isnan(e) & np.isnan(g))
    if same.all():
        return None
    idx = tuple(int(i) for i in np.argwhere(~same)[0])
    return (f"logits differ at {list(idx)}: expected {float(e[idx])!r}, got {float(g[idx])!r} "
            f"({int((~same).sum())} of {same.size} elements differ)")


def _layer_difference(session, cfg, trace: dict, buffers: dict) -> str | None:
    """The first layer/operator whose debug output differs from the reference's."""
    if "dbg_attn" not in buffers or "dbg_ffn" not in buffers:
        return None
    attn, ffn = session.read("dbg_attn", 0), session.read("dbg_ffn", 0)
    for layer in range(cfg.n_layers):
        for op, got in (("attn", attn[layer]), ("ffn", ffn[layer])):
            expected = trace.get(f"layer{layer}.{op}")
            if expected is not None:
                bad = _first_difference(expected, got)
                if bad:
                    kind = [p for p in cfg.layer_plan() if p.layer == layer][0]
                    name = kind.attn if op == "attn" else kind.ffn
                    return f"first difference in layer {layer}, operator {op} ({name}): {bad.replace('logits ', '')}"
    return None


def _report(session, cfg, opts, per_step: list[dict], generated, mismatch) -> dict:
    info = session.info
    n = len(per_step)
    cycles = sum(f["cycles"] for f in per_step) / n
    us = cycles / info.clock_hz * 1e6
    hbm = sum(f["hbm_bytes"] for f in per_step) / n
    launches = session.launches_per_run
    cores = info.cores
    bw_all = info.chips * min(info.hbm_bw_bytes_per_s, info.cores_per_chip * info.dma_engine_bw_bytes_per_s)
    # Collective phases on the critical path: those of the core that goes through the most.
    per_core_entries = [_sum_dicts(f["per_core"][c]["region_entries"] for f in per_step) for c in range(cores)]
    phases = max(sum(v for k, v in e.items() if k in COLLECTIVE_REGIONS) for e in per_core_entries) / n
    # A phase needs at least one DMA start and one hop; one that reaches the farthest
    # core of the machine, as the programs' all-reduces and all-gathers do, needs the
    # longest path instead.
    hbm_floor_us = hbm / bw_all * 1e6
    collective_floor_us = phases * (info.dma_start_latency_s + info.hop_latency_s) * 1e6
    mesh_floor_us = phases * (info.dma_start_latency_s + info.far_path_s) * 1e6
    floor_us = hbm_floor_us + collective_floor_us

    def per_core_us(cyc):
        return cyc / cores / info.clock_hz * 1e6

    region = _sum_dicts(f["region_cycles"] for f in per_step)
    dma_wait = _sum_dicts(f["dma_wait_cycles"] for f in per_step)
    idle = sum(f["idle_cycles"] for f in per_step)
    collective = sum(v for k, v in region.items() if k in COLLECTIVE_REGIONS)
    streaming = sum(v for k, v in dma_wait.items() if k not in COLLECTIVE_REGIONS)
    launch_us = launches * info.kernel_launch_s * 1e6
    breakdown = {"launch_overhead": launch_us,
                 "collectives": per_core_us(collective / n),
                 "weight_streaming": per_core_us(streaming / n),
                 "idle": per_core_us(idle / n)}
    breakdown["compute"] = max(us - sum(breakdown.values()), 0.0)
    # [batch][steps]: a run stopped in its prompt generated none, one empty list per sequence
    tokens = np.stack(generated, axis=1).tolist() if generated else [[] for _ in range(opts["batch"])]
    return {
        "bit_exact": mismatch is None, "mismatch": mismatch, "model": cfg.name,
        "tokens": tokens, "chips": info.chips, "cores": cores, "mesh": "x".join(map(str, info.mesh)),
        "hw": info.hw, "batch": opts["batch"], "prompt_len": opts["prompt_len"], "steps_run": n,
        "us_per_step": us, "cycles_per_step": [f["cycles"] for f in per_step], "tokens_per_s": 1e6 / us if us else 0.0,
        "tokens_per_s_aggregate": opts["batch"] * 1e6 / us if us else 0.0,
        "hbm_bytes_per_step": hbm,
        "hbm_bw_fraction": hbm / (us * 1e-6) / (info.chips * info.hbm_bw_bytes_per_s) if us else 0.0,
        "floor_us_per_step": floor_us, "fraction_of_floor": floor_us / us if us else 0.0,
        "floor_breakdown_us": {"hbm": hbm_floor_us, "collectives": collective_floor_us,
                               "collectives_across_mesh": mesh_floor_us},
        "mesh_floor_us_per_step": hbm_floor_us + mesh_floor_us,
        "fraction_of_mesh_floor": (hbm_floor_us + mesh_floor_us) / us if us else 0.0,
        "collective_phases_per_step": phases,
        "phase_floor_us": {"one_hop": (info.dma_start_latency_s + info.hop_latency_s) * 1e6,
                           "across_mesh": (info.dma_start_latency_s + info.far_path_s) * 1e6},
        "kernels_per_step": launches,
        "breakdown_us": breakdown,
        "instructions_per_step": sum(f["instructions"] for f in per_step) / n,
        # The run's totals over its steps, under the keys a plain program's report has.
        "cycles": sum(f["cycles"] for f in per_step), "seconds": sum(f["seconds"] for f in per_step),
        "instructions": sum(f["instructions"] for f in per_step),
        "unit_busy_cycles": _sum_dicts(f["unit_busy_cycles"] for f in per_step),
        "hbm_bytes": sum(f["hbm_bytes"] for f in per_step),
        "region_us_per_core": {k: per_core_us(v / n) for k, v in sorted(region.items())},
        "timing_only": False,
    }


def _with_budget(report: dict, cfg, per_step: list[dict], info) -> dict:
    report["budget"] = timing.budget(report, cfg, per_step, info.cores, info.clock_hz)
    return report


def _sum_dicts(items) -> dict:
    out: dict = {}
    for d in items:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


@contextlib.contextmanager
def _dump_at_fault(opts: dict, cfg, weights, prompt, ref_logits: list, emu_logits: list, state,
                   rows: int | None = None):
    """A run that faults still writes its --dump, of the steps run before the fault (the
    weights and prompt, their logits, and `state()`, the reference's state after them),
    as a trace is written up to the fault: the fault names the folder."""
    try:
        yield
    except EmulatorFault as fault:
        if opts.get("dump") and weights is not None:
            _dump(opts["dump"], weights, prompt, ref_logits, emu_logits, state(),
                  rows if rows is not None else prompt.shape[0], cfg.vocab)
            fault.details = (*fault.details, f"dump of the steps before the fault: {opts['dump']}")
        raise


def _dump_dir(directory: str) -> Path:
    """The --dump folder, created (if needed) before the first step, so that a bad one
    is said before the run, not after it."""
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create dump directory: {exc.strerror}", file=directory) from None
    return path


def _dump(directory: str, weights, prompt, ref_logits, emu_logits, ref_state, rows: int, vocab: int) -> None:
    """weights, inputs, the reference's logits and its decode state after the last step
    run (the `state_*` keys of docs/k3.md), and the emulator's logits ([steps, rows,
    vocab]: none before a fault in the first step)."""
    def stacked(logits: list) -> np.ndarray:
        return np.stack(logits) if logits else np.zeros((0, rows, vocab), np.float32)

    path = _dump_dir(directory)
    # (written as one: an interrupted or failed dump leaves the folder's earlier set, not
    # some files of each)
    atomic_write_all({str(path / name): _npz(arrays) for name, arrays in (
        ("weights.npz", weights),
        ("inputs.npz", {"prompt": prompt}),
        ("reference.npz", {"logits": stacked(ref_logits), **ref_state.arrays()}),
        ("emulator.npz", {"logits": stacked(emu_logits)}))})


def _npz(arrays: dict) -> bytes:
    """What `np.savez_compressed` writes (`np.load` reads it), at zlib's fastest level: on
    float32 arrays of bf16 values, whose low halves are zeros, the default level took
    16x as long for 10% less (k3-mini's weights: 52.6 s against 3.3 s, 47% against 52%
    of their bytes)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for key, array in arrays.items():
            with zf.open(f"{key}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(array), allow_pickle=False)
    return buf.getvalue()


def render(report: dict) -> str:
    """The readable summary `mkemu run` prints for a K3 program."""
    if report.get("timing_only"):
        status = (f"TIMING ONLY: nothing was computed (no PASS/FAIL); the router's choices: "
                  f"{report['routing']}")
    elif report["bit_exact"]:
        status = "PASS (every step's logits bit-exact against the numpy reference)"
    else:
        status = f"FAIL: {report['mismatch']}"
    b = report["breakdown_us"]
    lines = [
        status,
        f"model {report['model']}, batch {report['batch']}, prompt {report['prompt_len']} tokens, "
        f"{report['steps_run']} {'verify' if 'spec_rows' in report else 'decode'} steps",
    ]
    if not report.get("timing_only"):
        lines.append(f"generated tokens: {report['tokens']}")
    lines += [
        f"machine: {report['chips']} chips ({report['mesh']}) x {report['cores'] // report['chips']} cores "
        f"= {report['cores']} cores of {report['hw']}",
        (f"time per verify step: {report['us_per_step']:.2f} us emulated -> {report['tokens_per_s']:.0f} verify "
         f"steps/s (accepted tokens: below)" if "spec_rows" in report else
         f"time per step: {report['us_per_step']:.2f} us emulated -> {report['tokens_per_s']:.0f} tok/s per "
         f"sequence, {report['tokens_per_s_aggregate']:.0f} tok/s aggregate"),
        f"HBM bytes per step: {report['hbm_bytes_per_step'] / 1e6:.2f} MB, achieved "
        f"{report['hbm_bw_fraction'] * 100:.1f}% of peak HBM bandwidth",
        f"floor (HBM bytes / bandwidth + {report['collective_phases_per_step']:.0f} collective phases x "
        f"(DMA start + hop)): {report['floor_us_per_step']:.2f} us "
        f"-> {report['fraction_of_floor'] * 100:.1f}% of the floor reached",
        f"  with every phase crossing the mesh ({report['phase_floor_us']['across_mesh']:.2f} us each): "
        f"{report['mesh_floor_us_per_step']:.2f} us -> {report['fraction_of_mesh_floor'] * 100:.1f}%",
        f"kernels launched per step: {report['kernels_per_step']}",
        "time per step, per core: " + ", ".join(f"{k.replace('_', ' ')} {v:.2f} us" for k, v in b.items()),
    ]
    if "spec_rows" in report:
        lines.append(
            f"speculative decoding: {report['spec_rows']} rows per verify step; acceptance "
            f"{report['acceptance']}")
        lines.append(
            f"accepted tokens per step: {report['accepted_tokens_per_step']:.2f} "
            f"(each step: {report['accepted_per_step']}) -> {report['accepted_tokens_per_s']:.0f} accepted tok/s")
    if report.get("timing_only") and "budget" in report:
        lines += timing.render_budget(report["budget"])
    lines.append(f"cycles: {report['cycles']:,} in all, {report['cycles'] / max(report['steps_run'], 1):,.0f} per "
                 f"step; {report['instructions']:,} instructions")
    if "wall_s" in report:
        lines.append(f"wall {report['wall_s']:.1f} s (compile {report.get('compile_s', 0):.2f} s)")
    return "\n".join(lines)


drive.render = render
