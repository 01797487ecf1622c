"""The forecast benchmark's three workloads, on 3 ``dask worker`` processes x 2 threads.

* ``slow-worker``: a grid sweep of :data:`GRID` tasks whose duration follows their
  parameter (0.05 s at the small end to 1.55 s at the large, quadratically, each jittered
  by up to 20%), listed small to large, each annotated with an estimate within
  ``exp(0.2 z)`` of its duration and ``sweep="grid"``; worker ``w0`` three times slower;
  the node-aware policy with backup copies (late factor 2, ``min-runtime`` 100 ms).
* ``learned``: ``client.map(work, sizes)`` with no annotation at all (a task's cost
  follows its size), under LPT: a first sweep of :data:`TEACH` sizes teaches the
  scheduler the stage's durations (kept in its memory: ``daskjobs.history.path: null``),
  then the measured sweep of :data:`LEARNED` other sizes is ranked, and forecast, by the
  learned estimates.
* ``two-teams``: team ``alice`` (many short tasks) and team ``bob`` (fewer long ones)
  under fair share with equal targets, each task annotated with its team and an estimate
  within ``exp(0.2 z)``; ``sweep`` annotations name each team's sweep.

``submit(client, seed, quick)`` returns the futures and each task's nominal seconds (the
work the benchmark knows and dask does not: the rate extrapolation weighted by work).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dask

from forecast.tasks import cost, nap, work

WORKERS, THREADS = 3, 2
SLOW = 3.0
GRID = 300
TEACH = 40
LEARNED = 200
TEAMS = {"alice": (200, 0.1, 0.6), "bob": (70, 0.5, 2.0)}  # tasks, shortest, longest
#: Share of the full sizes a --quick run takes.
QUICK = 0.3


@dataclass(frozen=True)
class Submitted:
    futures: list[Any]
    seconds: list[float]  # each task's nominal duration
    teams: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Workload:
    name: str
    config: dict[str, Any]  # the scheduler's ``daskjobs`` config
    slow: str  # DASKJOBS_BENCH_SLOW
    submit: Callable[[Any, int, bool], Submitted]
    teach: Callable[[Any, int, bool], None] | None = None


def _size(n: int, quick: bool) -> int:
    return max(12, round(n * QUICK)) if quick else n


def grid(client: Any, seed: int, quick: bool) -> Submitted:
    rng = random.Random(seed)
    n = _size(GRID, quick)
    seconds = [(0.05 + 1.5 * (i / (n - 1)) ** 2) * rng.uniform(0.8, 1.2) for i in range(n)]
    parts = []
    for i, d in enumerate(seconds):
        with dask.annotate(estimate=d * rng.lognormvariate(0.0, 0.2), sweep="grid"):
            parts.append(dask.delayed(nap)(i, d, dask_key_name=f"grid-{i:04d}"))
    return Submitted(client.compute(parts), seconds)


def _sizes(rng: random.Random, n: int, taken: set[int]) -> list[int]:
    """``n`` distinct sizes from 5 to 200 (0.05 to 2 s), none in ``taken``, small to large
    (``client.map`` gives equal arguments one key)."""
    pool = [s for s in range(5, 201) if s not in taken]
    return sorted(rng.sample(pool, min(n, len(pool))))


def teach(client: Any, seed: int, quick: bool) -> None:
    rng = random.Random(seed + 1000)
    sizes = _sizes(rng, _size(TEACH, quick), set())
    client.gather(client.map(work, sizes, pure=False))


def learned(client: Any, seed: int, quick: bool) -> Submitted:
    rng = random.Random(seed + 1000)
    taught = set(_sizes(rng, _size(TEACH, quick), set()))  # the same draw as teach()
    sizes = _sizes(random.Random(seed), _size(LEARNED, quick), taught)
    return Submitted(client.map(work, sizes, pure=False), [cost(s) for s in sizes])


def two_teams(client: Any, seed: int, quick: bool) -> Submitted:
    rng = random.Random(seed)
    parts, seconds, teams = [], [], []
    for team, (n, lo, hi) in TEAMS.items():
        for i in range(_size(n, quick)):
            d = rng.uniform(lo, hi)
            with dask.annotate(
                estimate=d * rng.lognormvariate(0.0, 0.2), team=team, sweep=f"{team}-sweep"
            ):
                parts.append(dask.delayed(nap)(i, d, dask_key_name=f"{team}-{i:04d}"))
            seconds.append(d)
            teams.append(team)
    return Submitted(client.compute(parts), seconds, teams)


SPECULATION = {"enabled": True, "late-factor": 2.0, "min-runtime": "100ms", "interval": "50ms"}

WORKLOADS: dict[str, Workload] = {
    "slow-worker": Workload(
        "slow-worker",
        {"policy": "node-aware", "speculation": SPECULATION},
        f"w0={SLOW:g}",
        grid,
    ),
    "learned": Workload("learned", {"policy": "lpt"}, "", learned, teach),
    "two-teams": Workload(
        "two-teams",
        {"policy": "fair-share", "teams": {"targets": {"alice": 1, "bob": 1}}},
        "",
        two_teams,
    ),
}
