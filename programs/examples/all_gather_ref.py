"""Numpy reference for all_gather.mk: every core ends with the arrays of all
participants, participant p = core * chips + chip at rows [p*ROWS, (p+1)*ROWS), in an
output with room for MAX_PARTS participants (zero beyond). An all-gather only copies,
so the result does not depend on the mesh shape or the ring directions."""

import numpy as np

MAX_PARTS = 32


def reference(inputs, *, chips, cores_per_chip, mesh=None):
    x = [np.asarray(inputs[f"x@{c}"], np.float32) for c in range(chips)]
    cores, rows, cols = x[0].shape
    gathered = np.zeros((MAX_PARTS * rows, cols), np.float32)
    for p in range(chips * cores):
        gathered[p * rows:(p + 1) * rows] = x[p % chips][p // chips]
    return {f"out@{c}": np.stack([gathered] * cores) for c in range(chips)}
