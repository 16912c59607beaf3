"""Numpy reference for all_to_all.mk: MoE-style dispatch and combine with run-time
row counts. Participant p = core * chips + chip sends rows [d*CAP, d*CAP + cnt_p[d])
of its x to participant d, landing at rows [p*CAP, ...) of d's y; rcounts[s] is what
s sent; d returns its rows times (d + 1). Only copies and one exact-order multiply,
so the result does not depend on the mesh shape."""

import numpy as np


def counts_of(raw: np.ndarray, cap: int) -> np.ndarray:
    """The program's count table: raw mod (cap + 1), rounded toward minus infinity."""
    return np.mod(raw.astype(np.int64), cap + 1).astype(np.int32)


def reference(inputs, *, chips, cores_per_chip, mesh=None):
    x = [np.asarray(inputs[f"x@{c}"], np.float32) for c in range(chips)]
    raw = [np.asarray(inputs[f"counts@{c}"], np.int32) for c in range(chips)]
    cores, max_parts = raw[0].shape
    cap = x[0].shape[1] // max_parts
    parts = chips * cores

    def where(p):
        return p % chips, p // chips

    cnt = {}
    for p in range(parts):
        chip, core = where(p)
        cnt[p] = np.zeros(max_parts, np.int32)
        cnt[p][:parts] = counts_of(raw[chip][core][:parts], cap)
    y = {c: np.zeros_like(x[c]) for c in range(chips)}
    rcounts = {c: np.zeros_like(raw[c]) for c in range(chips)}
    back = {c: np.zeros_like(x[c]) for c in range(chips)}
    for p in range(parts):
        pc, pk = where(p)
        for d in range(parts):
            dc, dk = where(d)
            n = int(cnt[p][d])
            rows = x[pc][pk][d * cap:d * cap + n]
            y[dc][dk][p * cap:p * cap + n] = rows
            rcounts[dc][dk][p] = n
            back[pc][pk][d * cap:d * cap + n] = rows * np.float32(d + 1)
    out = {}
    for c in range(chips):
        out[f"y@{c}"] = y[c]
        out[f"rcounts@{c}"] = rcounts[c]
        out[f"back@{c}"] = back[c]
    return out
