"""The numpy reference decoder of the K3 model: the bits every K3 program must produce.

Written from the model math and the numeric contract (docs/k3.md, docs/numerics.md)
and nothing else: it imports only numpy and `mkemu.isa.numerics`. Every rounding
point of docs/k3.md is one numpy float32 operation here, in the order written;
matrix products are `numerics.mxu_matmul` (bf16 operands, float32 accumulation in
increasing k), reductions are the padded pairwise trees `reduce_sum` / `reduce_max`,
transcendentals are the `numerics` ones.

API: `init_state(cfg, batch)`, `decode_step(cfg, weights, state, tokens, trace=None)
-> (logits, state)` (the input state is not modified), `verify_step(cfg, weights,
state, tokens)` (speculative decoding's verify step: R consecutive positions of one
sequence), `generate(cfg, weights, prompt, steps)`. `trace` is a dict or a callable `(name, array)`; it receives the
input of every layer, every operator's output and the hidden state after each layer,
in execution order, under the names listed in docs/k3.md ("layer3.attn", "layer3.h",
"final.logits", ...). Bad arguments raise ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from mkemu.isa import numerics

__all__ = [
    "DecodeState",
    "GenerateResult",
    "decode_step",
    "generate",
    "init_state",
    "mm",
    "psum",
    "reduce_max",
    "reduce_sum",
    "rmsnorm",
    "verify_step",
]

F32 = np.float32
MAX_BATCH = 8
# L2 normalisation epsilon of KDA's q and k (added to the sum of squares).
L2_EPS = F32(1e-6)
# KDA decay logits live in (-5, 0): g = -5 * sigmoid(...).
DECAY_SCALE = F32(-5.0)

Trace = Callable[[str, np.ndarray], None]


# ------------------------------------------------------------------ primitives


def mm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """bf16(x) @ bf16(w), float32 accumulation over the whole K in increasing k."""
    return numerics.mxu_matmul(np.zeros((x.shape[0], w.shape[1]), F32), x, w)


def _padded(u: np.ndarray, fill: float) -> np.ndarray:
    n = u.shape[-1]
    width = max(128, 1 << (n - 1).bit_length())
    if width == n:
        return u
    pad = np.full(u.shape[:-1] + (width - n,), fill, dtype=F32)
    return np.concatenate([u, pad], axis=-1)


def reduce_sum(u: np.ndarray) -> np.ndarray:
    """Pairwise-tree float32 sum over the last axis, padded with +0.0 to a power of two >= 128."""
    return numerics.tree_sum_f32(_padded(u, 0.0), axis=-1)


def reduce_max(u: np.ndarray) -> np.ndarray:
    """Pairwise-tree max over the last axis, padded with -inf to a power of two >= 128."""
    return numerics.tree_max_f32(_padded(u, -np.inf), axis=-1)


def psum(parts) -> np.ndarray:
    """Sum of P equal-shaped partial results by the pairwise halving tree, the parts
    padded with +0.0 to the next power of two (P = 1: the part itself).

    This is the order of the programs' all-reduces (docs/k3.md, "Partial sums"):
    each part is produced on one core and the tree is fixed by the part numbers, so
    the bits do not depend on which core made which part, nor on the mesh.
    """
    parts = [np.asarray(p, F32) for p in parts]
    padded = 1 << (len(parts) - 1).bit_length()
    parts += [np.zeros_like(parts[0])] * (padded - len(parts))
    return numerics.tree_sum_f32(np.stack(parts), axis=0)


def head_partial_mm(o: np.ndarray, wo: np.ndarray, head_dim: int) -> np.ndarray:
    """The attention output projection as per-head partials: psum over heads h of
    mm(o[:, head h], wo[rows of head h]); each part is the K = head_dim product."""
    heads = o.shape[1] // head_dim
    return psum([mm(o[:, h * head_dim:(h + 1) * head_dim], wo[h * head_dim:(h + 1) * head_dim])
                 for h in range(heads)])


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """(x * rsqrt(tsum(x*x) / n + eps)) * w over the last axis, each op one float32 rounding."""
    ss = reduce_sum(x * x)
    ms = ss / F32(x.shape[-1])
    r = numerics.rsqrt(ms + F32(eps))
    return (x * r[..., None]) * w


def l2norm(u: np.ndarray) -> np.ndarray:
    """u * rsqrt(tsum(u*u) + 1e-6) over the last axis."""
    return u * numerics.rsqrt(reduce_sum(u * u) + L2_EPS)[..., None]


def causal_conv(u: np.ndarray, history: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Short causal conv per channel: ((w0*s0 + w1*s1) + w2*s2) + w3*u for kernel 4.

    history [B, K-1, C] holds the last K-1 inputs, oldest first; returns (y, new history).
    """
    taps = [history[:, j] for j in range(history.shape[1])] + [u]
    y = w[0] * taps[0]
    for j in range(1, len(taps)):
        y = y + w[j] * taps[j]
    return y, np.concatenate([history[:, 1:], u[:, None]], axis=1)


def gated_ffn(x: np.ndarray, w1: np.ndarray, w3: np.ndarray, w2: np.ndarray) -> np.ndarray:
    """mm(silu(mm(x, w1)) * mm(x, w3), w2): the dense FFN and every expert."""
    return mm(numerics.silu(mm(x, w1)) * mm(x, w3), w2)


# ------------------------------------------------------------------------ state


@dataclass(frozen=True, eq=False)
class DecodeState:
    """Everything a decode step carries to the next, per batch row.

    pos: position of the next token (same for every row). conv_q/k/v [n_kda, B, K-1,
    H*128]: last K-1 pre-conv projections, oldest first. kda_s [n_kda, B, H, 128, 128]
    float32 recurrent state (K rows, V columns). mla_cache [n_mla, B, max_seq,
    kv_rank]: normalised latents, bf16 values.
    """

    pos: int
    conv_q: np.ndarray
    conv_k: np.ndarray
    conv_v: np.ndarray
    kda_s: np.ndarray
    mla_cache: np.ndarray

    @property
    def batch(self) -> int:
        return self.kda_s.shape[1] if self.kda_s.size else self.mla_cache.shape[1]

    def arrays(self) -> dict[str, np.ndarray]:
        """The state as named arrays (the `state_*` keys of docs/k3.md)."""
        return {
            "state_pos": np.array(self.pos, dtype=np.int32),
            "state_conv_q": self.conv_q,
            "state_conv_k": self.conv_k,
            "state_conv_v": self.conv_v,
            "state_kda_s": self.kda_s,
            "state_mla_cache": self.mla_cache,
        }


def init_state(cfg: Any, batch: int) -> DecodeState:
    """The state before the first token: everything zero, position 0."""
    if not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"batch must be an integer from 1 to {MAX_BATCH}, got {batch!r}")
    nk, nm = len(cfg.kda_layers), len(cfg.mla_layers)
    conv = (nk, batch, cfg.conv_kernel - 1, cfg.attn_width)
    return DecodeState(
        pos=0,
        conv_q=np.zeros(conv, F32),
        conv_k=np.zeros(conv, F32),
        conv_v=np.zeros(conv, F32),
        kda_s=np.zeros((nk, batch, cfg.n_heads, cfg.head_dim, cfg.head_dim), F32),
        mla_cache=np.zeros((nm, batch, cfg.max_seq, cfg.kv_rank), F32),
    )


# -------------------------------------------------------------------- operators


def kda(cfg, w, i: int, x: np.ndarray, st: dict[str, np.ndarray], emit: Trace, at: str) -> np.ndarray:
    """Kimi Delta Attention for KDA layer `i` (one token); updates st's arrays in place."""
    B, H, D = x.shape[0], cfg.n_heads, cfg.head_dim
    qkv = {}
    for n in ("q", "k", "v"):
        u = mm(x, w[f"kda_w{n}"][i])
        y, st[f"conv_{n}"][i] = causal_conv(u, st[f"conv_{n}"][i], w[f"kda_conv_{n}"][i])
        qkv[n] = numerics.silu(y).reshape(B, H, D)
    q = l2norm(qkv["q"]) * F32(D ** -0.5)
    k = l2norm(qkv["k"])
    v = qkv["v"]
    t = mm(x, w["kda_wg"][i]) + w["kda_dt_bias"][i]
    t = numerics.exp(w["kda_a_log"][i]) * t
    g = DECAY_SCALE * numerics.sigmoid(t)
    beta = numerics.sigmoid(mm(x, w["kda_wb"][i]))[:, :H]
    for name, value in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        emit(f"{at}.kda.{name}", value)

    S = st["kda_s"][i] * numerics.exp(g).reshape(B, H, D)[..., None]
    kS = numerics.tree_sum_f32(k[..., None] * S, axis=2)
    d = beta[..., None] * (v - kS)
    S = S + k[..., None] * d[:, :, None, :]
    st["kda_s"][i] = S
    o = numerics.tree_sum_f32(q[..., None] * S, axis=2)
    emit(f"{at}.kda.core", o)
    gate = numerics.sigmoid(mm(x, w["kda_wog"][i])).reshape(B, H, D)
    o = (rmsnorm(o, w["kda_onorm"][i], cfg.eps) * gate).reshape(B, H * D)
    emit(f"{at}.kda.o", o)
    return head_partial_mm(o, w["kda_wo"][i], D)


def mla(cfg, w, i: int, x: np.ndarray, st: dict[str, np.ndarray], pos: int, emit: Trace,
        at: str) -> np.ndarray:
    """Gated MLA, NoPE, absorbed weights, for MLA layer `i`; writes the cache at `pos`."""
    B, H, D = x.shape[0], cfg.n_heads, cfg.head_dim
    cq = rmsnorm(mm(x, w["mla_wdq"][i]), w["mla_qnorm"][i], cfg.eps)
    q = mm(cq, w["mla_wuq"][i])
    c_new = numerics.bf16_round(rmsnorm(mm(x, w["mla_wdkv"][i]), w["mla_kvnorm"][i], cfg.eps))
    cache = st["mla_cache"][i]
    cache[:, pos] = c_new
    emit(f"{at}.mla.q", q)
    emit(f"{at}.mla.c_new", c_new)

    wuk, wuv = w["mla_wuk"][i], w["mla_wuv"][i]
    qt = np.stack([mm(q[:, h * D:(h + 1) * D], wuk[h]) for h in range(H)], axis=1)  # [B, H, R]
    # Rows of a matmul are independent, so all heads of one sequence go in one mm.
    scores = np.stack([mm(qt[b], cache[b].T) for b in range(B)])  # [B, H, max_seq]
    scores = scores * F32(D ** -0.5)
    scores[..., pos + 1:] = -np.inf
    m = reduce_max(scores)
    e = numerics.exp(scores - m[..., None])
    p = e / reduce_sum(e)[..., None]
    emit(f"{at}.mla.p", p)
    ctx = np.stack([mm(p[b], cache[b]) for b in range(B)])  # [B, H, R]
    o = np.concatenate([mm(ctx[:, h], wuv[h]) for h in range(H)], axis=1)
    o = o * numerics.sigmoid(mm(x, w["mla_wgate"][i]))
    emit(f"{at}.mla.o", o)
    return head_partial_mm(o, w["mla_wo"][i], D)


def route(cfg, logits: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sigmoid router: top-k of sigmoid + bias (repeated argmax, lowest index on ties),
    weights = the chosen sigmoids over their sequential float32 sum. -> (idx, weights) [B, k]."""
    s = numerics.sigmoid(logits)
    sel = s + bias
    rows = np.arange(s.shape[0])
    idx = np.empty((s.shape[0], cfg.top_k), dtype=np.int64)
    for j in range(cfg.top_k):
        idx[:, j] = np.argmax(sel, axis=1)
        sel[rows, idx[:, j]] = -np.inf
    chosen = s[rows[:, None], idx]
    denom = chosen[:, 0]
    for j in range(1, cfg.top_k):
        denom = denom + chosen[:, j]
    return idx, chosen / denom[:, None]


def moe(cfg, w, i: int, x: np.ndarray, emit: Trace, at: str) -> np.ndarray:
    """Latent MoE for MoE layer `i`: router, top-k, routed + shared experts at latent width.

    The parts w_j * expert_j (selection order) then shared_s (in order) are summed by
    `psum`, the order of the programs' MoE all-reduce, before the up-projection."""
    logits = mm(x, w["moe_router"][i])
    idx, weight = route(cfg, logits, w["moe_bias"][i])
    emit(f"{at}.moe.logits", logits)
    emit(f"{at}.moe.idx", idx)
    emit(f"{at}.moe.weights", weight)
    xl = mm(x, w["moe_down"][i])
    emit(f"{at}.moe.xl", xl)
    # (Each expert's matrices are taken on their own: bf16-held weights are widened
    # to float32 only for the experts used.)
    w1, w3, w2 = w["moe_w1"], w["moe_w3"], w["moe_w2"]
    parts = []
    for j in range(cfg.top_k):
        out = np.empty_like(xl)
        # Rows that chose the same expert in slot j share one matmul (rows are independent).
        for e in np.unique(idx[:, j]):
            rows = np.nonzero(idx[:, j] == e)[0]
            out[rows] = gated_ffn(xl[rows], w1[i, e], w3[i, e], w2[i, e])
        parts.append(weight[:, j, None] * out)
    for j in range(cfg.n_shared):
        parts.append(gated_ffn(xl, w["moe_shared_w1"][i, j], w["moe_shared_w3"][i, j], w["moe_shared_w2"][i, j]))
    emit(f"{at}.moe.parts", np.stack(parts))
    z = psum(parts)
    emit(f"{at}.moe.z", z)
    return mm(z, w["moe_up"][i])


# ------------------------------------------------------------------ decode step


def _emitter(trace) -> Trace:
    if trace is None:
        return lambda name, value: None
    if isinstance(trace, dict):
        return lambda name, value: trace.__setitem__(name, np.array(value))
    return trace


def decode_step(cfg, weights: dict[str, np.ndarray], state: DecodeState, tokens,
                trace: dict | Trace | None = None) -> tuple[np.ndarray, DecodeState]:
    """One token per sequence through the whole model -> (logits [B, vocab] f32, next state)."""
    tokens = np.asarray(tokens)
    B = state.batch
    if tokens.shape != (B,) or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"tokens must be {B} integers (one per sequence), got {tokens!r}")
    if tokens.min() < 0 or tokens.max() >= cfg.vocab:
        raise ValueError(f"tokens must be in 0..{cfg.vocab - 1}, got {tokens.tolist()}")
    pos = state.pos
    if pos >= cfg.max_seq:
        raise ValueError(f"position {pos} is past max_seq {cfg.max_seq} of model '{cfg.name}'")
    emit = _emitter(trace)
    w = weights
    st = {k: v.copy() for k, v in state.arrays().items() if k != "state_pos"}
    st = {k.removeprefix("state_"): v for k, v in st.items()}

    h = w["embed"][tokens]  # the residual stream stays float32, never rounded to bf16
    emit("embed", h)
    for plan in cfg.layer_plan():
        at = f"layer{plan.layer}"
        x = rmsnorm(h, w["attn_norm"][plan.layer], cfg.eps)
        emit(f"{at}.attn_norm", x)
        if plan.attn == "kda":
            a = kda(cfg, w, plan.attn_index, x, st, emit, at)
        else:
            a = mla(cfg, w, plan.attn_index, x, st, pos, emit, at)
        emit(f"{at}.attn", a)
        h = h + a
        emit(f"{at}.h_attn", h)
        x = rmsnorm(h, w["ffn_norm"][plan.layer], cfg.eps)
        emit(f"{at}.ffn_norm", x)
        if plan.ffn == "dense":
            i = plan.ffn_index
            f = gated_ffn(x, w["dense_w1"][i], w["dense_w3"][i], w["dense_w2"][i])
        else:
            f = moe(cfg, w, plan.ffn_index, x, emit, at)
        emit(f"{at}.ffn", f)
        h = h + f
        emit(f"{at}.h", h)
    y = rmsnorm(h, w["final_norm"], cfg.eps)
    emit("final.norm", y)
    logits = mm(y, w["lm_head"])
    emit("final.logits", logits)
    return logits, replace(state, pos=pos + 1, **st)


# ------------------------------------------------------------------ verify step


def verify_step(cfg, weights: dict[str, np.ndarray], state: DecodeState, tokens, trace: dict | None = None,
                rows: int | None = None, draft: Callable[[int, int], int] | None = None
                ) -> tuple[np.ndarray, tuple[DecodeState, ...], np.ndarray]:
    """Speculative decoding's verify step: R tokens at consecutive positions pos .. pos+R-1
    of ONE sequence (batch 1), causal among themselves -> (logits [R, vocab], the state
    after each row, the R tokens).

    With `rows` and `draft`, `tokens` are the first rows' tokens and row r >= len(tokens)
    (up to `rows`) gets `draft(r, greedy)`, `greedy` the argmax of row r - 1's logits (a
    drafter that sees the verified prefix, e.g. one that is right for a set number of rows).

    Row r is the decode step of tokens[r] at position pos + r after rows 0..r-1: KDA's
    conv history and state advance row by row, MLA's row r attends positions <= pos + r
    (rows pos .. pos + r of the cache are this step's), and every other operator is
    row-wise, so the contract of a verify step is that of R decode steps in order (which
    is why accepting a prefix of the rows is exact). The caller keeps `states[a - 1]`
    when it accepts the first a rows; a state never holds a rejected row. `trace` (a
    dict) receives each name once with the rows stacked on axis 0, as a batch's would.
    """
    given = np.asarray(tokens).reshape(-1)
    if given.size and not np.issubdtype(given.dtype, np.integer):
        # (int() would truncate 3.7 to 3; decode_step refuses such tokens too)
        raise ValueError(f"tokens must be integers, got {given.tolist()}")
    tokens = [int(t) for t in given]
    n = len(tokens) if rows is None else rows
    if state.batch != 1:
        raise ValueError(f"a verify step is one sequence: the state must have batch 1, not {state.batch}")
    if not 1 <= len(tokens) <= n <= MAX_BATCH or (n > len(tokens) and draft is None):
        raise ValueError(f"a verify step has 1 to {MAX_BATCH} rows, each with a token or a draft; "
                         f"got {len(tokens)} tokens for {n} rows")
    if state.pos + n > cfg.max_seq:
        raise ValueError(f"positions {state.pos}..{state.pos + n - 1} pass max_seq {cfg.max_seq} "
                         f"of model '{cfg.name}'")
    logits, states, traces = [], [], []
    for r in range(n):
        if r >= len(tokens):
            tokens.append(int(draft(r, int(next_tokens(logits[-1])))))
        row_trace = {} if trace is not None else None
        row_logits, state = decode_step(cfg, weights, state, np.array([tokens[r]]), trace=row_trace)
        logits.append(row_logits[0])
        states.append(state)
        traces.append(row_trace)
    if trace is not None:
        for name in traces[0]:
            trace[name] = np.concatenate([row[name] for row in traces], axis=0)
    return np.stack(logits), tuple(states), np.array(tokens, np.int64)


# ------------------------------------------------------------------- generation


@dataclass(frozen=True, eq=False)
class GenerateResult:
    """inputs [S, B]: the token fed at step s (prompt, then generated); logits [S, B,
    vocab] of every step; tokens [B, N] greedily generated; S = P + N - 1 steps."""

    inputs: np.ndarray
    logits: np.ndarray
    tokens: np.ndarray
    state: DecodeState


def next_tokens(logits: np.ndarray) -> np.ndarray:
    """Greedy choice per row: argmax, the lowest index on ties."""
    return np.argmax(logits, axis=-1)


def generate(cfg, weights: dict[str, np.ndarray], prompt, steps: int) -> GenerateResult:
    """Feed prompt [B, P] token by token, then generate `steps` tokens greedily.

    The logits after the last prompt token give the first generated token; each
    generated token but the last is fed back, so there are P + steps - 1 decode steps.
    """
    prompt = np.asarray(prompt)
    if prompt.ndim != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must be [batch, length >= 1] token ids, got shape {prompt.shape}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    B, P = prompt.shape
    n_steps = P + steps - 1
    if n_steps > cfg.max_seq:
        raise ValueError(f"prompt {P} + {steps} generated tokens need {n_steps} positions; "
                         f"model '{cfg.name}' has max_seq {cfg.max_seq}")
    state = init_state(cfg, B)
    inputs = np.empty((n_steps, B), dtype=np.int64)
    logits = np.empty((n_steps, B, cfg.vocab), dtype=F32)
    generated = np.empty((B, steps), dtype=np.int64)
    for s in range(n_steps):
        inputs[s] = prompt[:, s] if s < P else generated[:, s - P]
        logits[s], state = decode_step(cfg, weights, state, inputs[s])
        if s >= P - 1:
            generated[:, s - P + 1] = next_tokens(logits[s])
    return GenerateResult(inputs=inputs, logits=logits, tokens=generated, state=state)
