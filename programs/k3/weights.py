"""Deterministic K3 weights: every tensor of `config.tensor_specs`, drawn from a seed.

Tensor i of the spec table is drawn from its own generator,
`np.random.default_rng([seed, i])`, so one tensor can be regenerated alone and the
same seed gives the same bits on every machine (numpy's PCG64 and its float32
normal sampler are platform-independent). Every value is rounded to bf16 and held
as float32, so any tensor may be stored as bf16 without loss. With MXFP4 experts
(`expert_dtype = "mxfp4"`) the routed experts are then quantised to MXFP4 and decoded
back (`mxfp4_exact`: blocks of 32 along K, the second-to-last axis), so they hold
exactly what the matrix unit decodes from their MXFP4 storage, still bf16 values, and
the reference computes with those. The scales keep
activations and logits in a sensible range over many decode steps (tested in
tests/programs/test_k3_reference.py); the rules are in docs/k3.md.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from mkemu.cache import cached_arrays
from mkemu.errors import ConfigError
from mkemu.isa import numerics

from .config import ModelConfig, TensorSpec, param_counts, tensor_specs

__all__ = ["MAX_GENERATED_PARAMS", "Bf16Tensor", "check_weights", "generate_weight_bits", "generate_weights",
           "mxfp4_exact"]

@functools.cache
def _sources() -> tuple[bytes, ...]:
    """What generated weights depend on besides the config and seed: this file's rules
    and the rounding and MXFP4 code they call."""
    return tuple(Path(m).read_bytes() for m in (__file__, numerics.__file__))

# Above this many elements (4 GiB of float32) weights are not generated: such a
# config (k3-full) is for timing-only runs.
MAX_GENERATED_PARAMS = 1 << 30


def mxfp4_exact(x: np.ndarray) -> np.ndarray:
    """The MXFP4 values nearest `x` [..., K, N] (numerics.mxfp4_encode, blocks of 32 along
    K), decoded: storing them as MXFP4 is lossless, and each is a bf16 value."""
    mats = np.asarray(x, np.float32).reshape(-1, *x.shape[-2:])
    out = np.stack([numerics.mxfp4_decode(*numerics.mxfp4_encode(m)) for m in mats])
    return out.reshape(x.shape)


def _draw(spec: TensorSpec, cfg: ModelConfig, rng: np.random.Generator, expert_dtype: str) -> np.ndarray:
    x = _draw_bf16(spec, cfg, rng)
    return mxfp4_exact(x) if spec.routed and expert_dtype == "mxfp4" else x


def _draw_bf16(spec: TensorSpec, cfg: ModelConfig, rng: np.random.Generator) -> np.ndarray:
    normal = lambda: rng.standard_normal(spec.shape, dtype=np.float32)  # noqa: E731
    if spec.init == "embed":
        x = normal()
    elif spec.init == "norm":
        x = 1.0 + 0.05 * normal()
    elif spec.init == "proj":
        x = normal() / np.float32(math.sqrt(spec.fan_in))
    elif spec.init == "out":
        # Residual-branch outputs shrink with depth so |h| grows slowly over layers.
        x = normal() / np.float32(math.sqrt(spec.fan_in * 2 * cfg.n_layers))
    elif spec.init == "conv":
        x = normal() / np.float32(math.sqrt(cfg.conv_kernel))
    elif spec.init == "a_log":
        # A_log = log(U(1, 16)) / 4, so exp(A_log) is in [1, 2]. numerics.log, not
        # np.log: libm builds differ in the last bit.
        x = numerics.log(rng.uniform(1.0, 16.0, spec.shape).astype(np.float32)) / np.float32(4.0)
    elif spec.init == "dt_bias":
        # With exp(A_log) ~ 1.5 the decay logit sits near -4.5: g ~ -0.05 .. -0.5, so
        # KDA keeps a memory of a few to a few tens of tokens.
        x = -3.0 + 0.5 * normal()
    elif spec.init == "bias":
        x = 0.01 * normal()
    else:
        raise AssertionError(f"unknown init rule {spec.init!r} for {spec.name}")
    return numerics.bf16_round(np.asarray(x, dtype=np.float32))


def generate_weights(cfg: ModelConfig, seed: int = 0, expert_dtype: str | None = None) -> dict[str, np.ndarray]:
    """All weights of `cfg` as {name: float32 array of bf16 values}, in spec order; the
    routed experts MXFP4 values when `expert_dtype` (default: the config's) is "mxfp4"."""
    _check_request(cfg, seed)
    expert_dtype = expert_dtype or cfg.expert_dtype
    return {
        spec.name: _draw(spec, cfg, np.random.default_rng([seed, i]), expert_dtype)
        for i, spec in enumerate(tensor_specs(cfg))
    }


def _check_request(cfg: ModelConfig, seed: int) -> None:
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}", key="seed")
    total = param_counts(cfg).total
    if total > MAX_GENERATED_PARAMS:
        raise ConfigError(
            f"model '{cfg.name}' has {total:,} parameters, more than the {MAX_GENERATED_PARAMS:,} "
            "weights are generated for; it is for timing-only runs", key="model")


def generate_weight_bits(cfg: ModelConfig, seed: int = 0, expert_dtype: str | None = None) -> dict[str, "Bf16Tensor"]:
    """The same weights as `generate_weights`, held as bf16 bits: half the memory.

    Each tensor is drawn, rounded and converted on its own, so the float32 copies of
    all of them never exist at once; `w[name][i]` and `np.asarray(w[name])` give float32
    arrays of exactly the values `generate_weights` gives."""
    _check_request(cfg, seed)
    specs = tensor_specs(cfg)
    expert_dtype = expert_dtype or cfg.expert_dtype

    def bits(i: int) -> np.ndarray:
        return numerics.f32_to_bf16_bits(_draw(specs[i], cfg, np.random.default_rng([seed, i]), expert_dtype))

    def draw_all() -> list[np.ndarray]:
        # Every tensor has its own generator, so drawing them on threads (numpy's
        # samplers release the GIL) gives the same bits in any order.
        with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
            return list(pool.map(bits, range(len(specs))))

    # Kept in the user cache under a key of everything the bits depend on.
    key = hashlib.sha256(repr((cfg, specs, seed, expert_dtype, np.__version__, _sources())).encode()).hexdigest()
    tensors = cached_arrays(f"k3-weights-{key}", np.uint16, [spec.shape for spec in specs], draw_all)
    return {spec.name: Bf16Tensor(t) for spec, t in zip(specs, tensors)}


class Bf16Tensor:
    """A weight tensor stored as bf16 bits whose slices come out as float32 arrays."""

    def __init__(self, bits: np.ndarray):
        self.bf16_bits = bits    # the bit patterns (`Session.write` stores them as they are)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.bf16_bits.shape

    @property
    def ndim(self) -> int:
        return self.bf16_bits.ndim

    dtype = np.dtype(np.float32)

    def __len__(self) -> int:
        return len(self.bf16_bits)

    def __getitem__(self, index) -> np.ndarray:
        return numerics.bf16_bits_to_f32(np.asarray(self.bf16_bits[index]))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        values = numerics.bf16_bits_to_f32(self.bf16_bits)
        return values if dtype is None else values.astype(dtype)


def check_weights(cfg: ModelConfig, weights: dict[str, np.ndarray]) -> None:
    """Every tensor present with its shape (e.g. weights loaded from a user's .npz)."""
    for spec in tensor_specs(cfg):
        array = weights.get(spec.name)
        if array is None:
            raise ConfigError(f"weight tensor missing for model '{cfg.name}'", key=spec.name)
        if tuple(array.shape) != spec.shape:
            raise ConfigError(f"shape {tuple(array.shape)} where {spec.shape} was expected",
                              key=spec.name)
