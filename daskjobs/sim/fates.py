"""Failure fates: which attempts fail, and where, drawn from the run's seed.

Shared by the engine (which meets the failures) and by
:func:`~daskjobs.sim.schedule.failure_bound` (which asks what they cost any
schedule), so the two can never disagree about a draw.
"""

from __future__ import annotations

import numpy as np

#: Attempts per task whose fate is drawn up front (the rest draw in start order).
FATES = 3


def check_seed(seed: object) -> int:
    """``seed`` as an int, or a ValueError that names it (numpy's says only
    "expected non-negative integer")."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    return int(seed)


def draw_fates(rng: np.random.Generator, n: int, rate: float) -> list[dict[int, float]]:
    """For attempt ``k < FATES`` of task ``i``: ``fates[k][i]`` is the fraction
    of its run at which it fails; tasks absent from ``fates[k]`` do not fail on
    attempt ``k``.

    Indexed by (task, attempt), not by the order attempts start, so every
    policy faces the same failures (common random numbers). Only the failing
    pairs are kept: a small dict per attempt number is cheaper to probe than a
    million-entry array read in random order. Consumes ``2 * n * FATES``
    draws of ``rng``.
    """
    fate_u = rng.random((n, FATES))
    fate_f = rng.random((n, FATES))
    fates = []
    for k in range(FATES):
        hit = np.flatnonzero(fate_u[:, k] < rate)
        fates.append(dict(zip(hit.tolist(), fate_f[hit, k].tolist(), strict=True)))
    return fates
