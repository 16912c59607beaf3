"""Per-chip shards of the K3 weights: which chip's HBM holds which experts and head columns.

The numpy side of programs/k3/shard.mk's "per-chip HBM homes": when the routed experts
(or the KDA head projections) are too big to replicate, a program declares those arrays
with only one chip's share, and the driver writes each chip its own. Both use the same
numbering: thing x (routed expert e, head h) lives on core x % n_cores, so on chip
(x % n_cores) // cores_per_chip, at local index x // n_cores * cores_per_chip +
x % cores_per_chip; local slots past the last thing are zero padding.

The program's declared shape says which form it wants: the tensor's own size is the
whole tensor on every chip, anything else must be exactly the share this module makes
(a program and this module that disagree are an error, never a silent reshuffle). The
reference never sees any of this: it computes from the whole tensors.
"""

from __future__ import annotations

import numpy as np

from mkemu.errors import ConfigError

from .weights import Bf16Tensor

__all__ = ["EXPERT_TENSORS", "HEAD_COLUMN_TENSORS", "HEAD_ROW_TENSORS", "chip_shards", "home_of", "local_slots"]

# Routed-expert tensors, [layers, n_experts, a, b]: sharded over axis 1.
EXPERT_TENSORS = ("moe_w1", "moe_w3", "moe_w2")
# KDA per-head projections, [layers, dim, heads * 128]: sharded by 128-column blocks.
HEAD_COLUMN_TENSORS = ("kda_wq", "kda_wk", "kda_wv", "kda_wg", "kda_wog")
# ... and the output projection, [layers, heads * 128, dim]: by 128-row blocks.
HEAD_ROW_TENSORS = ("kda_wo",)
HEAD_BLOCK = 128


def local_slots(count: int, n_cores: int, cores_per_chip: int) -> int:
    """Local slots every chip has for `count` things dealt over the cores (padded)."""
    return -(-count // n_cores) * cores_per_chip


def home_of(x: int, n_cores: int, cores_per_chip: int) -> tuple[int, int]:
    """(chip, local index) of thing x."""
    return (x % n_cores) // cores_per_chip, x // n_cores * cores_per_chip + x % cores_per_chip


def _things(chip: int, slots: int, count: int, n_cores: int, cores_per_chip: int) -> list[int | None]:
    """For each local slot of `chip`, the thing it holds (None: padding)."""
    out = []
    for slot in range(slots):
        x = slot // cores_per_chip * n_cores + chip * cores_per_chip + slot % cores_per_chip
        out.append(x if x < count else None)
    return out


def chip_shards(name: str, tensor, declared: tuple[int, ...], n_chips: int,
                cores_per_chip: int) -> list | None:
    """Each chip's array for weight `name`, or None when the program declares the whole
    tensor (the same array on every chip). A tensor of bf16 bit patterns (one with
    `bf16_bits`, as `weights.Bf16Tensor`) gives shards of the same kind, cut from its
    bits (bit pattern 0 is +0.0: the padding); any other gives float32 arrays."""
    bits = getattr(tensor, "bf16_bits", None)
    source = np.asarray(bits) if bits is not None else tensor
    full = tuple(tensor.shape)
    if int(np.prod(declared)) == int(np.prod(full)):
        return None
    n_cores = n_chips * cores_per_chip
    if name in EXPERT_TENSORS:
        axis, count, block = 1, full[1], 1
    elif name in HEAD_COLUMN_TENSORS:
        axis, count, block = 2, full[2] // HEAD_BLOCK, HEAD_BLOCK
    elif name in HEAD_ROW_TENSORS:
        axis, count, block = 1, full[1] // HEAD_BLOCK, HEAD_BLOCK
    else:
        raise ConfigError(f"the program declares {name} as {declared}, the model's tensor is {full}; "
                          "only the routed experts and the KDA head projections are sharded per chip", key=name)
    slots = local_slots(count, n_cores, cores_per_chip)
    shape = list(full)
    shape[axis] = slots * block
    if int(np.prod(declared)) != int(np.prod(shape)):
        raise ConfigError(f"the program declares {name} as {declared}: neither the whole tensor {full} "
                          f"nor one chip's share {tuple(shape)} ({slots} slots of {count} over "
                          f"{n_cores} cores)", key=name)
    shards = []
    for chip in range(n_chips):
        out = np.zeros(shape, np.uint16 if bits is not None else np.float32)
        for slot, x in enumerate(_things(chip, slots, count, n_cores, cores_per_chip)):
            if x is None:
                continue
            src = [slice(None)] * len(full)
            dst = [slice(None)] * len(full)
            src[axis] = slice(x * block, (x + 1) * block)
            dst[axis] = slice(slot * block, (slot + 1) * block)
            out[tuple(dst)] = source[tuple(src)]
        shards.append(Bf16Tensor(out) if bits is not None else out)
    return shards
