"""Reference workloads (docs/chapter.md), each generated from a seed.

* :func:`chapter` - the chapter sweep: 10,000 backtests on 24 nodes x 16
  cores, log-normal durations (median 15 min, sigma of log 0.76), the 40
  longest (30x the median, 7.5 h) submitted last, one node 4x slower, some
  attempts failing, estimates off by ``exp(0.3 z)``.
* :func:`fairshare` - the chapter sweep from team ``a`` plus 500 backtests of
  team ``b`` submitted an hour later.
* :func:`feature_graph` - 100 feature stages of 20 minutes, each read by 100
  backtests, in three forms: features recomputed inside every backtest, the
  graph, and the graph with the features cached.

Choices the workloads' descriptions leave open, fixed here and documented in docs/simulator.md:
every task is submitted at time zero in grid order (so FIFO runs the long ones
last); the slow node is the *last* node (first-fit dispatch fills low nodes
first, as the published runs evidently did; pass ``slow_node=0`` for the
adversarial case where the slow node is offered work first); an attempt fails
with probability 1% at a uniform point of its run.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from daskjobs.policies.speculation import Speculation
from daskjobs.sim.model import Cluster, Task

__all__ = ["Workload", "chapter", "fairshare", "feature_graph"]

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
) -> Workload:
    """The book chapter's sweep (all sizes adjustable, e.g. for a million tasks)."""
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
    spec = Speculation(late_factor=late_factor, ahead="always")
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
