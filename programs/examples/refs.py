"""Numpy references of the .mk examples, written from the numeric contract
(docs/numerics.md) alone: plain float32 numpy for + - * /, `mkemu.isa.numerics`
for everything the contract names (transcendentals, reductions, the matrix unit).

Each function takes the inputs as `name@chip` arrays (bf16 inputs as float32 arrays
of bf16 values) and returns the expected outputs as `name@chip`.
"""

import numpy as np

from mkemu.isa import numerics as nx


def _padded(x: np.ndarray, axis: int, identity: float) -> np.ndarray:
    """x padded along `axis` with `identity` to the length a tile reduction covers:
    the next power of two, at least 128 lanes (axis 1) or 8 sublanes (axis 0)."""
    n = x.shape[axis]
    full = max(128 if axis == 1 else 8, 1 << (n - 1).bit_length())
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, full - n)
    return np.pad(x, pad, constant_values=np.float32(identity))


def row_sum(x: np.ndarray) -> np.ndarray:
    """sum(x, axis=1) of a tile: [R, C] -> [R, 1]."""
    return nx.tree_sum_f32(_padded(x, 1, 0.0), axis=1, keepdims=True)


def row_max(x: np.ndarray) -> np.ndarray:
    """max(x, axis=1) of a tile: [R, C] -> [R, 1]."""
    return nx.tree_max_f32(_padded(x, 1, -np.inf), axis=1, keepdims=True)


def _per_chip(chips: int, fn) -> dict:
    out = {}
    for chip in range(chips):
        for name, value in fn(chip).items():
            out[f"{name}@{chip}"] = value
    return out


def rmsnorm(inputs, *, chips, cores_per_chip):
    """y = x * rsqrt(sum(x*x) / D + 1e-5) * w, evaluated left to right in float32."""
    def one(chip):
        x = inputs[f"x@{chip}"].astype(np.float32)
        w = inputs[f"w@{chip}"].astype(np.float32)
        d = np.float32(x.shape[1])
        r = nx.rsqrt(row_sum(x * x) / d + np.float32(1e-5))
        return {"y": (x * r) * w}
    return _per_chip(chips, one)


def softmax(inputs, *, chips, cores_per_chip):
    """y = e / sum(e) with e = exp(x - max(x)), along each row."""
    def one(chip):
        x = inputs[f"x@{chip}"].astype(np.float32)
        e = nx.exp(x - row_max(x))
        return {"y": e / row_sum(e)}
    return _per_chip(chips, one)


# The K tile of matmul_single_buffered.mk and matmul_double_buffered.mk.
MATMUL_TK = 256


def matmul_k256(inputs, *, chips, cores_per_chip):
    """y = x @ W accumulated over K tiles of 256: acc = 0, then for each K tile in
    increasing order acc = acc + mxu(x_tile, W_tile), where each tile product is one
    matrix-unit pass (bf16 operands, f32 accumulation in increasing k, from zero) and
    `+` is one float32 addition. Columns are independent, so the N tiling is invisible."""
    def one(chip):
        x = inputs[f"x@{chip}"]
        w = inputs[f"w@{chip}"]
        zero = np.zeros((x.shape[0], w.shape[1]), np.float32)
        acc = zero
        for k0 in range(0, x.shape[1], MATMUL_TK):
            tile = slice(k0, k0 + MATMUL_TK)
            acc = acc + nx.mxu_matmul(zero, x[:, tile], w[tile, :])
        return {"y": acc}
    return _per_chip(chips, one)
