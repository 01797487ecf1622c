"""The result of a simulation, and what can be measured on it."""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from daskjobs.policies.durations import Estimator, within_factor
from daskjobs.sim.fates import check_seed, draw_fates
from daskjobs.sim.model import Attempt, Cluster, Task, topological_order

__all__ = ["Schedule", "TaskRecord", "TeamStats", "lower_bound", "speed_bound", "utilisation"]


class TaskRecord(NamedTuple):
    """How one task went: first start, end of its winning attempt, where."""

    tid: Hashable
    team: str
    submit: float
    start: float
    end: float
    node: int  # node of the winning attempt; -1 for a cache hit
    attempts: int
    cached: bool


@dataclass(frozen=True, slots=True)
class TeamStats:
    """Completion times of one team's tasks, measured from their submission."""

    team: str
    tasks: int
    median_wait: float  # median of (end - submit), seconds
    max_wait: float  # all done (end - submit) for the last one, seconds
    last_end: float  # time the team's last task ended


class Schedule:
    """A simulated run: makespan, per-task and per-attempt records, waste.

    Times are seconds; ``*_h`` properties give hours.
    """

    def __init__(
        self,
        *,
        tasks: Sequence[Task],
        cluster: Cluster,
        policy: str,
        attempts: list[Attempt],
        start: np.ndarray,
        end: np.ndarray,
        node: np.ndarray,
        n_attempts: np.ndarray,
        cached: np.ndarray,
        pruned: list[Hashable],
        backups_launched: int,
        backups_won: int,
        events: int,
        seed: int,
        estimator: Estimator | None = None,
        learned: np.ndarray | None = None,
    ) -> None:
        self.task_list = list(tasks)
        self.cluster = cluster
        self.policy = policy
        self.attempts = attempts
        self._start = start
        self._end = end
        self._node = node
        self._n_attempts = n_attempts
        self._cached = cached
        self.pruned = pruned
        self.backups_launched = backups_launched
        self.backups_won = backups_won
        self.events = events
        self.seed = seed
        #: the estimator the run learned into (``simulate(..., learn=...)``), else None
        self.estimator = estimator
        self._learned = learned

    # -- headline numbers --------------------------------------------------------
    @cached_property
    def makespan(self) -> float:
        """Seconds from the first task's start to the last task's end."""
        if not len(self._end):
            return 0.0
        return float(self._end.max() - self._start.min())

    @property
    def makespan_h(self) -> float:
        return self.makespan / 3600.0

    @property
    def node_hours(self) -> float:
        """Every node held for the whole makespan, in hours."""
        return self.cluster.nodes * self.makespan_h

    @cached_property
    def waste(self) -> float:
        """Core-seconds of attempts that produced nothing: failed and killed copies."""
        return float(
            sum(
                (a.end - a.start) * len(a.cores)
                for a in self.attempts
                if a.outcome == "failed" or a.outcome == "killed"
            )
        )

    @property
    def waste_core_h(self) -> float:
        return self.waste / 3600.0

    @cached_property
    def busy(self) -> float:
        """Core-seconds of all attempts (useful work plus waste)."""
        return float(sum((a.end - a.start) * len(a.cores) for a in self.attempts))

    @cached_property
    def retry_bound(self) -> float:
        """A bound this run's failures impose: a task whose attempt failed at
        time ``f`` cannot end before ``f + duration`` on the fastest node (it
        restarts from the beginning). 0.0 when nothing failed. Together with
        :func:`speed_bound` it shows how much of a makespan no policy could
        have avoided once the failures happened as they did. A failure while
        another copy of the task ran on (a backup) restarts nothing: skipped."""
        fastest = min(self.cluster.speeds)
        by_task: dict[Hashable, list[Attempt]] = {}
        for a in self.attempts:
            by_task.setdefault(a.task.tid, []).append(a)

        def restarted(a: Attempt) -> bool:
            return not any(b is not a and b.start < a.end <= b.end for b in by_task[a.task.tid])

        return max(
            (
                a.end + a.task.duration * fastest
                for a in self.attempts
                if a.outcome == "failed" and restarted(a)
            ),
            default=0.0,
        )

    @cached_property
    def failures(self) -> int:
        return sum(1 for a in self.attempts if a.outcome == "failed")

    # -- learned estimates ---------------------------------------------------------
    @property
    def learned(self) -> list[Task]:
        """The tasks the learner estimated (``simulate(..., learn=...)``), each with the
        estimate it last had: the one it started with. Empty without learning."""
        if self._learned is None:
            return []
        return [t for t, k in zip(self.task_list, self._learned.tolist(), strict=True) if k]

    def within(self, factor: float = 2.0) -> float:
        """Share of the learner's predictions within ``factor`` of the truth (3Sigma's
        measure): the estimates the learned tasks started with, those that started on
        their default (nothing measured of their stage yet) left out. NaN without any."""
        tasks = [t for t in self.learned if t.estimated]
        return within_factor([t.estimate for t in tasks], [t.duration for t in tasks], factor)

    # -- records -----------------------------------------------------------------
    @cached_property
    def tasks(self) -> list[TaskRecord]:
        """One record per simulated task (pruned tasks excluded), in input order."""
        return [
            TaskRecord(t.tid, t.team, t.submit, float(s), float(e), int(n), int(k), bool(c))
            for t, s, e, n, k, c in zip(
                self.task_list,
                self._start,
                self._end,
                self._node,
                self._n_attempts,
                self._cached,
                strict=True,
            )
        ]

    @property
    def ends(self) -> np.ndarray:
        """Each simulated task's end (seconds), in the order of ``task_list``: what
        :attr:`tasks` holds, without a record per task (a read-only view)."""
        out = self._end.view()
        out.flags.writeable = False
        return out

    @property
    def starts(self) -> np.ndarray:
        """Each simulated task's start (seconds: its first attempt's), in the order of
        ``task_list`` (a read-only view, as :attr:`ends`)."""
        out = self._start.view()
        out.flags.writeable = False
        return out

    def record(self, tid: Hashable) -> TaskRecord:
        for r in self.tasks:
            if r.tid == tid:
                return r
        raise KeyError(tid)

    @property
    def cache_hits(self) -> int:
        return int(self._cached.sum())

    def teams(self) -> dict[str, TeamStats]:
        """Per team: median and maximum time from submission to completion."""
        out: dict[str, TeamStats] = {}
        by_team: dict[str, list[int]] = {}
        for i, t in enumerate(self.task_list):
            by_team.setdefault(t.team, []).append(i)
        submit = np.array([t.submit for t in self.task_list], dtype=float)
        for team, idx in by_team.items():
            ix = np.asarray(idx)
            wait = self._end[ix] - submit[ix]
            out[team] = TeamStats(
                team=team,
                tasks=len(idx),
                median_wait=float(np.median(wait)),
                max_wait=float(wait.max()),
                last_end=float(self._end[ix].max()),
            )
        return out

    def summary(self) -> dict[str, Any]:
        """Headline numbers as a JSON-able dict (hours)."""
        return {
            "policy": self.policy,
            "makespan_h": self.makespan_h,
            "node_hours": self.node_hours,
            "backups_launched": self.backups_launched,
            "backups_won": self.backups_won,
            "waste_core_h": self.waste_core_h,
            "failures": self.failures,
            "attempts": len(self.attempts),
            "cache_hits": self.cache_hits,
            "pruned": len(self.pruned),
        }

    def __repr__(self) -> str:
        return (
            f"<Schedule policy={self.policy!r} tasks={len(self.task_list)} "
            f"makespan={self.makespan_h:.2f}h backups={self.backups_launched} "
            f"waste={self.waste_core_h:.1f} core-h>"
        )


def _work(tasks: Iterable[Task]) -> tuple[float, float, int]:
    """Total work (core-seconds), longest task, and the cores all tasks ask for."""
    work = 0.0
    longest = 0.0
    n = 0
    for t in tasks:
        work += t.duration * t.cores
        if t.duration > longest:
            longest = t.duration
        n += t.cores
    return work, longest, n


def _longest_chain(tasks: Sequence[Task]) -> float:
    """Longest path of true durations through the dependency graph."""
    if not any(t.deps for t in tasks):
        return max((t.duration for t in tasks), default=0.0)
    finish: dict[Hashable, float] = {}
    by_id = {t.tid: t for t in tasks}
    # iterative DFS-free pass: repeat in topological order

    for t in topological_order(tasks):
        finish[t.tid] = t.duration + max((finish[d] for d in t.deps if d in by_id), default=0.0)
    return max(finish.values(), default=0.0)


def lower_bound(tasks: Sequence[Task], total_cores: int | float | Cluster) -> float:
    """No schedule finishes before this many seconds.

    ``max(total work / total cores, longest task, longest dependency chain)``
    with work counted as duration x cores. Pass a :class:`Cluster` instead of
    a core count to get the *speed-weighted* bound, where a node ``s`` times
    slower delivers ``cores / s`` core-equivalents (see :func:`speed_bound`).
    """
    if isinstance(total_cores, Cluster):
        return speed_bound(tasks, total_cores)
    if not total_cores or total_cores <= 0:
        raise ValueError(f"total_cores must be positive, got {total_cores!r}")
    work, longest, _ = _work(tasks)
    return max(work / total_cores, longest, _longest_chain(tasks))


def speed_bound(tasks: Sequence[Task], cluster: Cluster) -> float:
    """The lower bound on a cluster with slow nodes.

    A node ``s`` times slower delivers ``cores / s`` core-equivalents, so no
    schedule beats ``work / effective_cores``; the longest task and chain can
    still run on nominal nodes (unless every node is slow). The cluster's
    per-attempt ``overhead`` (not slowed down) adds to each task: to the work as
    if every task ran on the slowest node (where it costs the fewest
    core-equivalents), once to the longest task and chain.
    """
    work, longest, cores = _work(tasks)
    fastest = min(cluster.speeds)
    o = cluster.overhead
    work += o * cores / max(cluster.speeds)
    chain = fastest * _longest_chain(tasks)
    return max(work / cluster.effective_cores, chain + o, fastest * longest + o) if tasks else 0.0


def failure_bound(tasks: Sequence[Task], cluster: Cluster, seed: int = 0) -> float:
    """The speed bound raised by the failures ``simulate(tasks, cluster, ...,
    seed=seed)`` will meet: no schedule that restarts a failed task from its
    beginning finishes earlier.

    Failures are drawn per (task, attempt number) from the seed, the same for
    every policy (:mod:`daskjobs.sim.fates`), so what they cost is known before
    any policy runs. A task whose attempts ``0..K-1`` fail at fractions
    ``f_k`` of their run has to run ``(f_0 + ... + f_{K-1} + 1) x duration``
    in sequence, which bounds the makespan from below; and the failed runs add
    ``sum f_k x duration`` to the work every schedule has to fit into the
    cluster's core-equivalents. The bound is the largest of those and
    :func:`speed_bound`.

    Two caveats, both documented in docs/explanation/simulator.md: a backup copy that is
    running when its primary fails saves the restart, so with backups this is
    a yardstick rather than a strict bound; and attempts beyond the first
    :data:`~daskjobs.sim.fates.FATES` draw their fate in start order, so a
    task failing that often (probability ``rate ** 3``) counts only those.
    For tasks without a cache (a cache prunes tasks and changes the draw).
    """
    seed = check_seed(seed)
    tasks = list(tasks)
    base = speed_bound(tasks, cluster)
    rate = cluster.failure_rate
    if not rate or not tasks:
        return base
    fates = draw_fates(np.random.default_rng(seed), len(tasks), rate)
    lost = np.zeros(len(tasks))  # sum of f_k over the failing attempts before the first success
    alive = np.ones(len(tasks), dtype=bool)  # every attempt so far has failed
    for fate in fates:
        hit = np.zeros(len(tasks), dtype=bool)
        frac = np.zeros(len(tasks))
        if fate:
            idx = np.fromiter(fate.keys(), dtype=np.int64, count=len(fate))
            hit[idx] = True
            frac[idx] = np.fromiter(fate.values(), dtype=float, count=len(fate))
        fails = alive & hit
        lost[fails] += frac[fails]
        alive = fails
    dur = np.fromiter((t.duration for t in tasks), dtype=float, count=len(tasks))
    cores = np.fromiter((t.cores for t in tasks), dtype=float, count=len(tasks))
    work, _, _ = _work(tasks)
    wasted = float(np.dot(lost * dur, cores))
    chain = float(np.max((1.0 + lost) * dur)) * min(cluster.speeds)
    return max(base, (work + wasted) / cluster.effective_cores, chain)


def utilisation(schedule: Schedule, step: float = 600.0) -> tuple[np.ndarray, np.ndarray]:
    """Busy cores over time, sampled every ``step`` seconds.

    Returns ``(times, busy)``: ``busy[i]`` is the number of cores running an
    attempt (useful or not) at ``times[i]``, from the first start to the end.
    """
    if not (step > 0 and math.isfinite(step)):
        raise ValueError(f"step must be a positive number of seconds, got {step!r}")
    atts = schedule.attempts
    if not atts:
        return np.zeros(1), np.zeros(1)
    starts = np.array([a.start for a in atts])
    ends = np.array([a.end for a in atts])
    ncores = np.array([len(a.cores) for a in atts])
    t0 = float(starts.min())
    t1 = float(ends.max())
    times = np.arange(t0, t1 + step, step)
    order_s = np.argsort(starts, kind="stable")
    order_e = np.argsort(ends, kind="stable")
    cum_s = np.concatenate([[0], np.cumsum(ncores[order_s])])
    cum_e = np.concatenate([[0], np.cumsum(ncores[order_e])])
    started = cum_s[np.searchsorted(starts[order_s], times, side="right")]
    ended = cum_e[np.searchsorted(ends[order_e], times, side="right")]
    return times, (started - ended).astype(float)
