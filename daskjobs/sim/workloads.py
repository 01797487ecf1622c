"""Reference workloads (docs/explanation/chapter.md), each generated from a seed.

* :func:`chapter` - the chapter sweep: 10,000 backtests on 24 nodes x 16
  cores, log-normal durations (median 15 min, sigma of log 0.76), the 40
  longest (30x the median, 7.5 h) submitted last, one node 4x slower, some
  attempts failing, estimates off by ``exp(0.3 z)``.
* :func:`fairshare` - the chapter sweep from team ``a`` plus 500 backtests of
  team ``b`` submitted an hour later.
* :func:`feature_graph` - 100 feature stages of 20 minutes, each read by 100
  backtests, in three forms: features recomputed inside every backtest, the
  graph, and the graph with the features cached.

Choices the workloads' descriptions leave open, fixed here and documented in
docs/explanation/simulator.md: every task is submitted at time zero in grid order (so FIFO runs the
long ones last); the slow node is the *last* node (first-fit dispatch fills low nodes
first, as the published runs evidently did; pass ``slow_node=0`` for the
adversarial case where the slow node is offered work first); an attempt fails
with probability 1% at a uniform point of its run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from daskjobs.policies.speculation import Speculation
from daskjobs.sim.model import Cluster, Task

__all__ = [
    "Workload",
    "chapter",
    "chapter_params",
    "fairshare",
    "feature_graph",
    "lookback_grid",
    "two_stage",
    "without_estimates",
]

MEDIAN = 15 * 60.0
SIGMA = 0.76


@dataclass(frozen=True)
class Workload:
    """Tasks, the cluster they run on, and the speculation spec to use."""

    name: str
    tasks: list[Task]
    cluster: Cluster
    spec: Speculation = field(default_factory=Speculation)
    cache: frozenset[Hashable] = frozenset()
    seed: int = 0

    @property
    def work(self) -> float:
        """Total work in core-seconds (duration x cores, true durations)."""
        return sum(t.duration * t.cores for t in self.tasks)


def _durations(
    rng: np.random.Generator, n: int, n_long: int, median: float, sigma: float, long_factor: float
) -> np.ndarray:
    short = median * np.exp(sigma * rng.standard_normal(n - n_long))
    return np.concatenate([short, np.full(n_long, long_factor * median)])


def _estimates(rng: np.random.Generator, durations: np.ndarray, noise: float) -> np.ndarray:
    return durations * np.exp(noise * rng.standard_normal(len(durations)))


def _cluster(
    nodes: int, cores_per_node: int, slow_node: int | None, slow_factor: float, failure_rate: float
) -> Cluster:
    slow = None
    if slow_factor != 1.0:
        slow = {nodes - 1 if slow_node is None else slow_node: slow_factor}
    return Cluster(nodes, cores_per_node, slow=slow, failure_rate=failure_rate)


def chapter(
    seed: int = 0,
    *,
    n: int = 10_000,
    n_long: int = 40,
    long_factor: float = 30.0,
    median: float = MEDIAN,
    sigma: float = SIGMA,
    estimate_noise: float = 0.3,
    nodes: int = 24,
    cores_per_node: int = 16,
    slow_node: int | None = None,
    slow_factor: float = 4.0,
    failure_rate: float = 0.01,
    late_factor: float = 2.5,
    team: str = "default",
    prefix: str = "bt",
    endgame: bool = False,
) -> Workload:
    """The chapter sweep, the reference workload of docs/explanation/chapter.md (all sizes
    adjustable, e.g. for a million tasks).
    ``endgame``: its backups run with the end game (``Speculation(endgame=True)``)."""
    if not 0 <= n_long <= n:
        raise ValueError(f"n_long must be in [0, n], got {n_long}")
    rng = np.random.default_rng(seed)
    dur = _durations(rng, n, n_long, median, sigma, long_factor)
    est = _estimates(rng, dur, estimate_noise)
    tasks = [
        Task(f"{prefix}-{i}", float(d), float(e), team=team)
        for i, (d, e) in enumerate(zip(dur.tolist(), est.tolist(), strict=True))
    ]
    cluster = _cluster(nodes, cores_per_node, slow_node, slow_factor, failure_rate)
    # the published model starts a backup as soon as an attempt is late, ahead of queued
    # work, and kills the loser at once (the simulator can; dask cannot stop a thread)
    spec = Speculation(late_factor=late_factor, ahead="always", endgame=endgame)
    return Workload("chapter", tasks, cluster, spec, seed=seed)


def fairshare(
    seed: int = 0,
    *,
    n_b: int = 500,
    b_submit: float = 3600.0,
    **chapter_kwargs: object,
) -> Workload:
    """Team ``a`` runs the chapter sweep; team ``b`` submits ``n_b`` backtests an hour later."""
    base = chapter(seed, team="a", prefix="a", **chapter_kwargs)  # type: ignore[arg-type]
    rng = np.random.default_rng([seed, 1])
    dur = MEDIAN * np.exp(SIGMA * rng.standard_normal(n_b))
    est = _estimates(rng, dur, 0.3)
    b = [
        Task(f"b-{i}", float(d), float(e), team="b", submit=b_submit)
        for i, (d, e) in enumerate(zip(dur.tolist(), est.tolist(), strict=True))
    ]
    return Workload("fairshare", base.tasks + b, base.cluster, base.spec, seed=seed)


def feature_graph(
    seed: int = 0,
    *,
    mode: str = "graph",
    n_features: int = 100,
    readers: int = 100,
    feature_duration: float = 20 * 60.0,
    **chapter_kwargs: object,
) -> Workload:
    """Features shared by backtests, as ``mode`` = ``recompute``, ``graph`` or ``cached``.

    The backtests are the chapter sweep's (``n_features x readers`` of them,
    the long ones last); backtest ``i`` reads feature ``i % n_features``.
    """
    if mode not in ("recompute", "graph", "cached"):
        raise ValueError(f"mode must be 'recompute', 'graph' or 'cached', got {mode!r}")
    base = chapter(seed, n=n_features * readers, **chapter_kwargs)  # type: ignore[arg-type]
    rng = np.random.default_rng([seed, 2])
    f_est = _estimates(rng, np.full(n_features, feature_duration), 0.3)
    features = [Task(f"feat-{k}", feature_duration, float(f_est[k])) for k in range(n_features)]
    if mode == "recompute":
        tasks = [
            Task(t.tid, t.duration + feature_duration, t.estimate + feature_duration, team=t.team)
            for t in base.tasks
        ]
        return Workload("recompute", tasks, base.cluster, base.spec, seed=seed)
    tasks = features + [
        Task(t.tid, t.duration, t.estimate, deps=(f"feat-{i % n_features}",), team=t.team)
        for i, t in enumerate(base.tasks)
    ]
    cache = frozenset(f.tid for f in features) if mode == "cached" else frozenset()
    return Workload(mode, tasks, base.cluster, base.spec, cache=cache, seed=seed)


# -- sweeps whose durations follow their parameters (docs/how-to/estimates.md) ---------------------


def _task(
    tid: str, stage: str, params: Mapping[str, Any], duration: float, deps: tuple[str, ...] = ()
) -> Task:
    return Task(tid, duration, deps=deps, stage=stage, params=params)


def lookback_grid(
    seed: int = 0,
    *,
    lookbacks: tuple[int, ...] = (5, 10, 20, 40, 80, 160, 320, 640),
    universes: tuple[str, ...] = ("sp500", "russell1000", "russell3000"),
    repeats: int = 8,
    median: float = MEDIAN,
    noise: float = 0.3,
    nodes: int = 4,
    cores_per_node: int = 16,
    slow_factor: float = 1.0,
) -> Workload:
    """A backtest grid whose duration is proportional to its lookback and grows with
    its universe (1x, 2x, 6x), times ``exp(noise z)``; the largest lookbacks are
    submitted last, as a grid lists them. ``median`` is the duration of the middle
    lookback on the smallest universe. A heavy tail: the longest tasks are ~250x the
    shortest."""
    rng = np.random.default_rng([seed, 34, 1])
    weight = {u: w for u, w in zip(universes, (1.0, 2.0, 6.0, 12.0), strict=False)}
    ref = float(np.median(lookbacks))
    tasks = []
    for lb in lookbacks:
        for u in universes:
            for r in range(repeats):
                d = (
                    median
                    * (lb / ref)
                    * weight.get(u, 1.0)
                    * math.exp(noise * rng.standard_normal())
                )
                params = {"lookback": lb, "universe": u, "seed": r}
                tasks.append(_task(f"bt-{lb}-{u}-{r}", "backtest", params, d))
    cluster = _cluster(nodes, cores_per_node, None, slow_factor, 0.0)
    return Workload("lookback-grid", tasks, cluster, seed=seed)


def chapter_params(
    seed: int = 0,
    *,
    n: int = 2_000,
    n_long: int = 8,
    long_factor: float = 30.0,
    median: float = MEDIAN,
    sigma: float = SIGMA,
    noise: float = 0.3,
    nodes: int = 5,
    cores_per_node: int = 16,
    slow_factor: float = 1.0,
) -> Workload:
    """The chapter sweep's shape, its durations explained by a parameter: each task's
    ``size`` is its duration over the median times ``exp(noise z)`` (what the model can
    learn), its ``window`` one of four values with no effect; the ``n_long`` tasks 30x
    the median have the largest sizes and are submitted last."""
    rng = np.random.default_rng([seed, 34, 2])
    dur = _durations(rng, n, n_long, median, sigma, long_factor)
    size = dur / median * np.exp(noise * rng.standard_normal(n))
    windows = (20, 60, 120, 250)
    tasks = [
        _task(
            f"bt-{i}",
            "backtest",
            {"size": round(float(size[i]), 4), "window": windows[i % len(windows)]},
            float(dur[i]),
        )
        for i in range(n)
    ]
    cluster = _cluster(nodes, cores_per_node, None, slow_factor, 0.0)
    return Workload("chapter-params", tasks, cluster, seed=seed)


def two_stage(
    seed: int = 0,
    *,
    slices: int = 16,
    bars: tuple[int, ...] = (10_000, 40_000),
    lookbacks: tuple[int, ...] = (10, 20, 40, 80, 160, 320),
    repeats: int = 6,
    median: float = MEDIAN,
    noise: float = 0.3,
    nodes: int = 4,
    cores_per_node: int = 16,
) -> Workload:
    """Feature stages (one per data slice, duration proportional to its ``bars``) read by
    backtests (duration proportional to the lookback, and to the slice's bars)."""
    rng = np.random.default_rng([seed, 34, 3])
    tasks = []
    ref_bars = float(min(bars))
    ref_lb = float(np.median(lookbacks))
    for k in range(slices):
        b = bars[k % len(bars)]
        d = 0.5 * median * (b / ref_bars) * math.exp(noise * rng.standard_normal())
        tasks.append(_task(f"feat-{k}", "features", {"slice": k, "bars": b}, d))
    for lb in lookbacks:
        for k in range(slices):
            b = bars[k % len(bars)]
            for r in range(repeats):
                d = (
                    median
                    * (lb / ref_lb)
                    * (b / ref_bars)
                    * math.exp(noise * rng.standard_normal())
                )
                params = {"slice": k, "bars": b, "lookback": lb, "seed": r}
                tasks.append(_task(f"bt-{lb}-{k}-{r}", "backtest", params, d, (f"feat-{k}",)))
    cluster = _cluster(nodes, cores_per_node, None, 1.0, 0.0)
    return Workload("two-stage", tasks, cluster, seed=seed)


def without_estimates(workload: Workload, default: float = 1.0) -> Workload:
    """``workload`` as a user who annotates nothing submits it: every estimate is the
    configured ``default`` and marked as such (``estimated=False``)."""
    tasks = [dataclasses.replace(t, estimate=default, estimated=False) for t in workload.tasks]
    return dataclasses.replace(workload, tasks=tasks)
