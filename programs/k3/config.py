"""Kimi K3 model configs: the shape of the model as checked data, and its tensor layout.

Owns `ModelConfig` (one frozen, validated value per model; the shipped ones are TOML
files in `configs/`), the plan of which layer uses which attention and FFN kind, the
table of every weight tensor (name, shape, how it is initialised, whether it is a
routed-expert tensor), and the figures derived from that table: total and active
parameter counts and bytes streamed per token. `weights.py` generates tensors from
the same table and `mkemu model show` prints the figures, so the two cannot disagree.
See docs/k3.md for the math and the layout.
"""

from __future__ import annotations

import difflib
import importlib.resources
import math
import os
from typing import Any

import attrs

from mkemu.errors import ConfigError
from mkemu.isa.hardware import expanded_path, read_toml, reject_huge

__all__ = [
    "LayerPlan",
    "ModelConfig",
    "ParamCounts",
    "TensorSpec",
    "config_to_text",
    "list_configs",
    "load_config",
    "param_counts",
    "tensor_specs",
]

DEFAULT_MODEL = "k3-mini"
# Every matrix dimension is a whole number of 128-wide MXU tiles.
DIM_QUANTUM = 128
# Batch sizes a decode step supports (independent sequences).
MAX_BATCH = 8
# MXFP4 (4-bit e2m1 values, one 8-bit scale per 32) as the original stores experts.
MXFP4_BYTES_PER_PARAM = (4 * 32 + 8) / 32 / 8
BF16_BYTES = 2
# Storage dtypes of the routed experts, and MXFP4's scale block (rows of K sharing a scale).
EXPERT_DTYPES = ("bf16", "mxfp4")
MX_BLOCK = 32
F32_BYTES = 4

# Upper bounds: the kernels compute shapes and offsets in int32, and every layer is
# planned, weighed and run one by one (a file's 10^18 layers hung `model show`).
MAX_INT = 2**31 - 1
MAX_LAYERS = 65_536

_INT_FIELDS = (
    "dim", "n_layers", "n_heads", "head_dim", "conv_kernel", "q_rank", "kv_rank",
    "dense_inter", "n_experts", "top_k", "n_shared", "latent_dim", "expert_inter",
    "vocab", "max_seq",
)
_TILED_FIELDS = ("dim", "q_rank", "kv_rank", "dense_inter", "latent_dim", "expert_inter", "vocab")
_LAYER_LIST_FIELDS = ("dense_layers", "mla_layers")


def _as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, (list, tuple)) else value


@attrs.frozen
class ModelConfig:
    """One K3-style model shape. Constructing it checks every value (ConfigError)."""

    name: str
    dim: int
    n_layers: int
    dense_layers: tuple[int, ...] = attrs.field(converter=_as_tuple)
    mla_layers: tuple[int, ...] = attrs.field(converter=_as_tuple)
    n_heads: int
    head_dim: int
    conv_kernel: int
    q_rank: int
    kv_rank: int
    dense_inter: int
    n_experts: int
    top_k: int
    n_shared: int
    latent_dim: int
    expert_inter: int
    vocab: int
    eps: float
    max_seq: int
    # Storage of the routed experts (moe_w1, moe_w3, moe_w2): "bf16", or "mxfp4" (4.25 bits a
    # weight, the original's format; the weights are then MXFP4 values, weights.py).
    expert_dtype: str = "bf16"
    description: str = ""

    def __attrs_post_init__(self) -> None:
        _validate(self)

    # ---------------------------------------------------------------- derived shape

    @property
    def attn_width(self) -> int:
        """n_heads * head_dim: width of q, k, v, gates and the attention output."""
        return self.n_heads * self.head_dim

    @property
    def beta_cols(self) -> int:
        """Columns of the KDA beta projection: n_heads rounded up to a 128-wide tile."""
        return _round_up(self.n_heads, DIM_QUANTUM)

    @property
    def kda_layers(self) -> tuple[int, ...]:
        mla = set(self.mla_layers)
        return tuple(l for l in range(self.n_layers) if l not in mla)

    @property
    def moe_layers(self) -> tuple[int, ...]:
        dense = set(self.dense_layers)
        return tuple(l for l in range(self.n_layers) if l not in dense)

    def layer_plan(self) -> tuple[LayerPlan, ...]:
        """For each layer: attention kind and index into its stacked weights, same for the FFN."""
        # Each layer's index among the layers of its kind, in one pass (a model file may
        # have thousands of layers: a search per layer made this quadratic).
        attn = {l: ("mla", i) for i, l in enumerate(self.mla_layers)}
        attn.update({l: ("kda", i) for i, l in enumerate(self.kda_layers)})
        ffn = {l: ("dense", i) for i, l in enumerate(self.dense_layers)}
        ffn.update({l: ("moe", i) for i, l in enumerate(self.moe_layers)})
        return tuple(LayerPlan(l, *attn[l], *ffn[l]) for l in range(self.n_layers))


@attrs.frozen
class LayerPlan:
    """Layer `layer` uses attention `attn` ("kda"/"mla") with weights `[attn_index]` of the
    stacked tensors of that kind, and FFN `ffn` ("dense"/"moe") with `[ffn_index]`."""

    layer: int
    attn: str
    attn_index: int
    ffn: str
    ffn_index: int


def _round_up(n: int, quantum: int) -> int:
    return -(-n // quantum) * quantum


def _fail(message: str, key: str) -> None:
    raise ConfigError(message, key=key)


def _validate(cfg: ModelConfig) -> None:
    if not isinstance(cfg.name, str) or not cfg.name:
        _fail("expected a non-empty string", "name")
    if not isinstance(cfg.description, str):
        _fail("expected a string", "description")
    for key in _INT_FIELDS:
        value = getattr(cfg, key)
        if not isinstance(value, int) or isinstance(value, bool):
            _fail(f"expected an integer, got {value!r}", key)
        if value < 1:
            _fail(f"must be at least 1, got {value}", key)
        top = MAX_LAYERS if key == "n_layers" else MAX_INT
        if value > top:
            _fail(f"must be at most {top:,}{' (each layer is planned, weighed and run)' if top == MAX_LAYERS else ''}"
                  f", got {value:,}", key)
    for key in _TILED_FIELDS:
        value = getattr(cfg, key)
        if value % DIM_QUANTUM:
            _fail(f"must be a multiple of {DIM_QUANTUM} (whole MXU tiles), got {value}", key)
    if cfg.head_dim != 128:
        _fail(f"must be 128 (one KDA state tile is 128 x 128), got {cfg.head_dim}", "head_dim")
    if cfg.top_k > cfg.n_experts:
        _fail(f"top_k {cfg.top_k} is more than n_experts {cfg.n_experts}", "top_k")
    if cfg.expert_dtype not in EXPERT_DTYPES:
        _fail(f"expected one of {', '.join(repr(d) for d in EXPERT_DTYPES)}, got {cfg.expert_dtype!r}", "expert_dtype")
    if cfg.expert_dtype == "mxfp4":
        for key in ("latent_dim", "expert_inter"):   # each is the K of a routed-expert matmul
            if getattr(cfg, key) % MX_BLOCK:
                _fail(f"MXFP4 experts need a multiple of {MX_BLOCK} (a scale block runs along K), "
                      f"got {getattr(cfg, key)}", key)
    eps = cfg.eps
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not math.isfinite(eps) or eps <= 0:
        _fail(f"expected a positive finite number, got {eps!r}", "eps")
    for key in _LAYER_LIST_FIELDS:
        layers = getattr(cfg, key)
        if not isinstance(layers, tuple) or not all(
            isinstance(l, int) and not isinstance(l, bool) for l in layers
        ):
            _fail(f"expected a list of layer indices, got {layers!r}", key)
        if list(layers) != sorted(set(layers)):
            _fail(f"layer indices must be increasing and distinct, got {list(layers)}", key)
        bad = [l for l in layers if not 0 <= l < cfg.n_layers]
        if bad:
            _fail(f"layer {bad[0]} is outside 0..{cfg.n_layers - 1}", key)


# ------------------------------------------------------------------- loading


def _configs_dir():
    return importlib.resources.files(__package__).joinpath("configs")


def list_configs() -> list[str]:
    """Names of the shipped model configs, sorted."""
    return sorted(
        e.name.removesuffix(".toml") for e in _configs_dir().iterdir() if e.name.endswith(".toml")
    )


def load_config(name_or_path: str | os.PathLike[str] = DEFAULT_MODEL) -> ModelConfig:
    """A shipped config by name (see `list_configs`) or a TOML file by path."""
    text = os.fspath(name_or_path)
    if isinstance(name_or_path, os.PathLike) or text.endswith(".toml") or os.sep in text:
        resource, file = expanded_path(text), text
    else:
        known = list_configs()
        if text not in known:
            close = difflib.get_close_matches(text, known, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else "."
            raise ConfigError(f"unknown model '{text}'{hint} Known models: {', '.join(known)};"
                              " or give a path to a .toml file", key="model")
        resource = _configs_dir().joinpath(f"{text}.toml")
        file = str(resource)
    raw = read_toml(resource, file, "model config")
    reject_huge(raw, file, "", "model config")
    return config_from_dict(raw, file=file)


def config_from_dict(raw: dict[str, Any], file: str | None = None) -> ModelConfig:
    """Build a config from TOML-style tables; unknown or missing keys are errors."""
    known = tuple(a.name for a in attrs.fields(ModelConfig))
    for key in raw:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"unknown key '{key}'{hint}", file=file, key=key)
    for a in attrs.fields(ModelConfig):
        if a.default is attrs.NOTHING and a.name not in raw:
            raise ConfigError("missing key", file=file, key=a.name)
    try:
        return ModelConfig(**raw)
    except ConfigError as err:
        raise ConfigError(err.message, file=file, key=err.key) from None


# ------------------------------------------------------------ tensor layout


@attrs.frozen
class TensorSpec:
    """One named weight tensor. Per-layer tensors carry a leading layer axis over the
    layers of their kind; routed-expert tensors then an expert axis. `init` names the
    rule `weights.py` draws it with; `fan_in` scales projections."""

    name: str
    shape: tuple[int, ...]
    init: str
    fan_in: int = 1
    routed: bool = False  # [layers, n_experts, ...]: only top_k of n_experts active per token
    embedding: bool = False  # one row read per token

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def tensor_specs(cfg: ModelConfig) -> tuple[TensorSpec, ...]:
    """Every weight tensor in the fixed order weights are generated in (docs/k3.md)."""
    d, H, W, L = cfg.dim, cfg.n_heads, cfg.attn_width, cfg.n_layers
    nk, nm = len(cfg.kda_layers), len(cfg.mla_layers)
    nd, ne = len(cfg.dense_layers), len(cfg.moe_layers)
    E, S, lat, inter = cfg.n_experts, cfg.n_shared, cfg.latent_dim, cfg.expert_inter
    # Output projections feed the residual stream; `out` scales them down with depth.
    T = TensorSpec
    specs = [
        T("embed", (cfg.vocab, d), "embed", embedding=True),
        T("attn_norm", (L, d), "norm"),
        T("ffn_norm", (L, d), "norm"),
    ]
    if nk:
        specs += [
            T("kda_wq", (nk, d, W), "proj", d),
            T("kda_wk", (nk, d, W), "proj", d),
            T("kda_wv", (nk, d, W), "proj", d),
            T("kda_conv_q", (nk, cfg.conv_kernel, W), "conv"),
            T("kda_conv_k", (nk, cfg.conv_kernel, W), "conv"),
            T("kda_conv_v", (nk, cfg.conv_kernel, W), "conv"),
            T("kda_wg", (nk, d, W), "proj", d),
            T("kda_a_log", (nk, W), "a_log"),
            T("kda_dt_bias", (nk, W), "dt_bias"),
            T("kda_wb", (nk, d, cfg.beta_cols), "proj", d),
            T("kda_onorm", (nk, cfg.head_dim), "norm"),
            T("kda_wog", (nk, d, W), "proj", d),
            T("kda_wo", (nk, W, d), "out", W),
        ]
    if nm:
        specs += [
            T("mla_wdq", (nm, d, cfg.q_rank), "proj", d),
            T("mla_qnorm", (nm, cfg.q_rank), "norm"),
            T("mla_wuq", (nm, cfg.q_rank, W), "proj", cfg.q_rank),
            T("mla_wdkv", (nm, d, cfg.kv_rank), "proj", d),
            T("mla_kvnorm", (nm, cfg.kv_rank), "norm"),
            T("mla_wuk", (nm, H, cfg.head_dim, cfg.kv_rank), "proj", cfg.head_dim),
            T("mla_wuv", (nm, H, cfg.kv_rank, cfg.head_dim), "proj", cfg.kv_rank),
            T("mla_wgate", (nm, d, W), "proj", d),
            T("mla_wo", (nm, W, d), "out", W),
        ]
    if nd:
        specs += [
            T("dense_w1", (nd, d, cfg.dense_inter), "proj", d),
            T("dense_w3", (nd, d, cfg.dense_inter), "proj", d),
            T("dense_w2", (nd, cfg.dense_inter, d), "out", cfg.dense_inter),
        ]
    if ne:
        specs += [
            T("moe_router", (ne, d, E), "proj", d),
            T("moe_bias", (ne, E), "bias"),
            T("moe_down", (ne, d, lat), "proj", d),
            T("moe_w1", (ne, E, lat, inter), "proj", lat, routed=True),
            T("moe_w3", (ne, E, lat, inter), "proj", lat, routed=True),
            T("moe_w2", (ne, E, inter, lat), "proj", inter, routed=True),
        ]
        if S:
            specs += [
                T("moe_shared_w1", (ne, S, lat, inter), "proj", lat),
                T("moe_shared_w3", (ne, S, lat, inter), "proj", lat),
                T("moe_shared_w2", (ne, S, inter, lat), "proj", inter),
            ]
        specs.append(T("moe_up", (ne, lat, d), "out", lat))
    specs += [
        T("final_norm", (d,), "norm"),
        T("lm_head", (d, cfg.vocab), "proj", d),
    ]
    return tuple(specs)


@attrs.frozen
class ParamCounts:
    """Parameter and byte figures of a config (batch 1; see docs/k3.md for the rules)."""

    total: int  # every stored weight element
    active: int  # per token: routed experts count top_k / n_experts, embedding table in full
    expert_total: int  # routed + shared expert elements (what MXFP4 would shrink)
    expert_active: int
    streamed: int  # weight elements read per token at batch 1: active, one embedding row
    bytes_per_token_bf16: int  # streamed * 2
    bytes_per_token_mxfp4_experts: int  # experts at 4.25 bits, everything else bf16
    state_bytes: int  # KDA conv + recurrent state and MLA cache at max_seq, batch 1


def param_counts(cfg: ModelConfig) -> ParamCounts:
    total = active = expert_total = expert_active = streamed = 0
    for spec in tensor_specs(cfg):
        n = spec.size
        act = n * cfg.top_k // cfg.n_experts if spec.routed else n
        total += n
        active += act
        if spec.routed or spec.name.startswith("moe_shared_"):
            expert_total += n
            expert_active += act
        streamed += cfg.dim if spec.embedding else act
    other = streamed - expert_active
    nk, nm = len(cfg.kda_layers), len(cfg.mla_layers)
    state = (nk * (3 * (cfg.conv_kernel - 1) * cfg.attn_width + cfg.n_heads * cfg.head_dim**2) * F32_BYTES
             + nm * cfg.max_seq * cfg.kv_rank * BF16_BYTES)
    return ParamCounts(
        total=total,
        active=active,
        expert_total=expert_total,
        expert_active=expert_active,
        streamed=streamed,
        bytes_per_token_bf16=streamed * BF16_BYTES,
        bytes_per_token_mxfp4_experts=round(other * BF16_BYTES + expert_active * MXFP4_BYTES_PER_PARAM),
        state_bytes=state,
    )


def _count_text(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3f}{unit}"
    return str(n)


def _bytes_text(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def config_to_text(cfg: ModelConfig) -> str:
    """The config, its layer layout and its parameter / byte figures, for `mkemu model show`."""
    lines = [f"{cfg.name}: {cfg.description}" if cfg.description else cfg.name, ""]
    for a in attrs.fields(ModelConfig):
        if a.name in ("name", "description"):
            continue
        value = getattr(cfg, a.name)
        lines.append(f"  {a.name:13s} {list(value) if isinstance(value, tuple) else value}")
    nk, nm = len(cfg.kda_layers), len(cfg.mla_layers)
    lines += [
        "",
        f"layers: {cfg.n_layers} = {nk} KDA + {nm} gated MLA (NoPE, absorbed); "
        f"{len(cfg.dense_layers)} dense FFN + {len(cfg.moe_layers)} MoE",
        f"attention width {cfg.n_heads} heads x {cfg.head_dim} = {cfg.attn_width}",
    ]
    c = param_counts(cfg)
    lines += [
        "",
        f"parameters: total {c.total:,} ({_count_text(c.total)}), "
        f"active per token {c.active:,} ({_count_text(c.active)})",
        f"  experts (routed + shared): total {_count_text(c.expert_total)}, "
        f"active {_count_text(c.expert_active)}",
        f"weight bytes per token (batch 1, bf16 weights): {c.bytes_per_token_bf16:,} "
        f"({_bytes_text(c.bytes_per_token_bf16)})",
        f"  with MXFP4 experts as in the original: {_bytes_text(c.bytes_per_token_mxfp4_experts)}",
        f"decode state per sequence (KDA f32 state + conv, MLA bf16 cache at max_seq "
        f"{cfg.max_seq}): {_bytes_text(c.state_bytes)}",
    ]
    return "\n".join(lines)
