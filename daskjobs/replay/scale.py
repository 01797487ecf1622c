"""Size a cluster from a small real run: per-stage duration statistics and a synthetic sweep.

As the book chapter behind the reference workload did (docs/explanation/chapter.md: it
measured the spread of log durations, 0.76, from 24 small backtests on one worker, then
simulated a 10,000-task sweep with that spread):
:func:`stage_summary` reports, per stage of a recorded trace, the number of
tasks, the median duration and the spread (sample standard deviation) of the
log durations, on a nominal worker (each duration divided by its worker's
measured slow-down). :func:`synthetic_sweep` draws ``n`` independent tasks
with those distributions (log-normal around each stage's median, stages in the
recorded proportions), with the stage's median as every estimate (what the
plugin's history gives); the recorded cluster adds the fitted per-task
overhead to each attempt.

This module does not import ``distributed``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from daskjobs.replay.load import Loaded
from daskjobs.sim.model import Task

__all__ = ["StageStats", "stage_summary", "synthetic_sweep"]


@dataclass(frozen=True, slots=True)
class StageStats:
    """Measured durations of one stage (nominal worker, compute seconds)."""

    stage: str
    tasks: int
    median: float
    log_spread: float  # sample std of ln(duration); 0 with a single task
    total: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "tasks": self.tasks,
            "median_s": self.median,
            "log_spread": self.log_spread,
            "total_s": self.total,
        }


def stage_summary(loaded: Loaded) -> list[StageStats]:
    """Per stage (in order of first appearance): count, median, spread of log durations."""
    by: dict[str, list[float]] = {}
    for t in loaded.tasks:
        by.setdefault(loaded.stages.get(t.tid, "?"), []).append(loaded.compute.get(t.tid, 0.0))
    out = []
    for stage, ds in by.items():
        arr = np.asarray(ds, dtype=float)
        pos = arr[arr > 0]
        spread = float(np.std(np.log(pos), ddof=1)) if len(pos) > 1 else 0.0
        out.append(StageStats(stage, len(ds), float(np.median(arr)), spread, float(arr.sum())))
    return out


def synthetic_sweep(loaded: Loaded, n: int, seed: int = 0) -> list[Task]:
    """``n`` independent tasks drawn from the trace's per-stage distributions (see module)."""
    if n < 1:
        raise ValueError(f"--scale needs a number of tasks >= 1, got {n}")
    stats = [s for s in stage_summary(loaded) if s.median > 0]
    if not stats:
        raise ValueError(f"{loaded.path}: no stage with a positive measured duration to scale")
    rng = np.random.default_rng(seed)
    weights = np.array([s.tasks for s in stats], dtype=float)
    counts = np.floor(weights / weights.sum() * n).astype(int)
    counts[np.argmax(weights)] += n - int(counts.sum())  # the rounding goes to the largest
    tasks: list[Task] = []
    for s, k in zip(stats, counts, strict=True):
        draws = np.exp(math.log(s.median) + s.log_spread * rng.standard_normal(int(k)))
        tasks.extend(Task((s.stage, i), float(d), estimate=s.median) for i, d in enumerate(draws))
    return tasks
