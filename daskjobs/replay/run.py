"""Replay a loaded trace in the simulator, as recorded or under a what-if.

:func:`replay` runs one simulation: the policy that ran (from the trace's
header) or another, on the recorded cluster or a changed one, with or without
speculation. :func:`what_ifs` runs the grid policy x cluster that
``daskjobs replay`` prints. Every run is deterministic: same trace, same
arguments, same seed, same numbers.

The replayed makespan is measured like the recorded one: from the first graph
submission to the end of the last task (the simulator's own
:attr:`~daskjobs.sim.Schedule.makespan` starts at the first task's start).

This module does not import ``distributed``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from daskjobs.policies import NodeAware, Policy, Speculation, registry
from daskjobs.policies.base import AttemptView, NodeView, TaskView
from daskjobs.policies.durations import Estimator
from daskjobs.policies.speculation import Horizon
from daskjobs.replay.load import Loaded, load
from daskjobs.sim.engine import simulate
from daskjobs.sim.model import Cluster, Task
from daskjobs.sim.schedule import Schedule, speed_bound
from daskjobs.trace import Trace

__all__ = [
    "POLICIES",
    "RECORDED",
    "PluginSpeeds",
    "ReplayResult",
    "make_cluster",
    "make_replay_policy",
    "recorded_options",
    "replay",
    "what_ifs",
]

#: The policies ``daskjobs replay`` compares by default: daskjobs's own, from the
#: registry. A trace can be replayed under any registered name (docs/how-to/write-a-policy.md).
POLICIES = registry.names(builtin=True)

#: ``replay(..., speculation=RECORDED)``: backups as the recorded run had them.
RECORDED: Literal["recorded"] = "recorded"


@dataclass(frozen=True, slots=True)
class CopyRace:
    """A task with a backup copy in the recorded run, in the replay, or in both."""

    tid: Hashable
    #: how the recorded race ended: "won" (the copy won), "lost", "failed", "unsettled";
    #: None: no copy recorded
    recorded: str | None
    #: "won" or "lost" in the replay; None: the replay made no copy
    replayed: str | None
    #: replayed: by how many seconds the copy would end before its primary (negative:
    #: after it): how close the race was
    margin: float | None

    @property
    def same(self) -> bool:
        return self.recorded == self.replayed


@dataclass
class ReplayResult:
    """One replayed run and how it compares with the recorded one."""

    loaded: Loaded
    schedule: Schedule
    policy: str
    speculation: float | None  # late factor, None: off
    cluster: Cluster

    @property
    def makespan(self) -> float:
        """Seconds from the first submission to the last task's end."""
        return float(max((r.end for r in self.schedule.tasks), default=0.0))

    @property
    def node_hours(self) -> float:
        return self.cluster.nodes * self.makespan / 3600.0

    @property
    def error(self) -> float:
        """Relative error of the replayed makespan against the recorded one."""
        rec = self.loaded.recorded.makespan
        return (self.makespan - rec) / rec if rec > 0 else math.nan

    @property
    def lower_bound(self) -> float:
        return float(speed_bound(self.loaded.tasks, self.cluster))

    def teams(self) -> dict[str, dict[str, float]]:
        return {
            team: {"median_wait_s": s.median_wait, "last_end_s": s.last_end}
            for team, s in self.schedule.teams().items()
        }

    def copies(self) -> list[CopyRace]:
        """The backup copies of the recorded run beside the replay's, task by task (a
        replay with ``placement="recorded"`` makes them comparable race by race)."""
        speeds = self.cluster.speeds
        primary = {a.task.tid: a for a in self.schedule.attempts if not a.backup}
        replayed: dict[Hashable, tuple[str, float]] = {}
        for a in self.schedule.attempts:
            if a.backup and a.task.tid not in replayed:
                p, d = primary[a.task.tid], a.task.duration
                margin = (p.start + d * speeds[p.node]) - (a.start + d * speeds[a.node])
                replayed[a.task.tid] = ("won" if a.outcome == "done" else "lost", margin)
        recorded = self.loaded.copies
        rows = []
        for tid in sorted(set(recorded) | set(replayed), key=str):
            got = replayed.get(tid)
            rows.append(
                CopyRace(tid, recorded.get(tid), *(got if got is not None else (None, None)))
            )
        return rows

    def row(self) -> dict[str, Any]:
        """The what-if row as a JSON-able dict (seconds, hours for node-hours)."""
        return {
            "policy": self.policy,
            "speculation": self.speculation,
            "nodes": self.cluster.nodes,
            "cores_per_node": self.cluster.cores_per_node,
            "slow": {str(k): v for k, v in (self.cluster.slow or {}).items()},
            "makespan_s": self.makespan,
            "node_hours": self.node_hours,
            "lower_bound_s": self.lower_bound,
            "backups": self.schedule.backups_launched,
            "backups_won": self.schedule.backups_won,
            "waste_core_s": self.schedule.waste,
            "failures": self.schedule.failures,
            "teams": self.teams(),
        }


@dataclass
class _Seen:
    """A replayed attempt with its start moved past the fitted per-task overhead: the
    live learner sees compute time, the replayed durations include the overhead."""

    task: TaskView
    node: int
    start: float
    end: float
    outcome: str | None = "done"
    backup: bool = False


class PluginSpeeds(Policy):
    """A policy's order with the speed learner the live plugin runs beside it.

    The plugin keeps a :class:`NodeAware` object that only learns (it is told of
    finished attempts, never of starts or queued work) and judges lateness and
    urgency with it, whatever policy orders the tasks. This composes the same two
    objects for a replay of a run with speculation: order from ``inner``, beliefs
    from the learner. Which attempts teach a speed is the learner's own rule
    (:meth:`NodeAware.ended`); every copy decision is :meth:`Speculation.decide`;
    the horizon is kept from the same sums as live (:class:`Horizon`: a task counts
    as queued work until it starts, as running until it ends), over the learner's
    capacity. The engine judges attempts on the recorded ``interval`` (as live).
    """

    def __init__(self, inner: Policy, overhead: float = 0.0) -> None:
        self.inner = inner
        self.learner = NodeAware()
        self.name = inner.name
        self.overhead = overhead  # replayed per task; the live learner sees compute time
        self.sums = Horizon()  # the horizon's sums, fed as the live plugin feeds its own

    def add_node(self, index: int, cores: int) -> None:
        self.inner.add_node(index, cores)
        self.learner.add_node(index, cores)  # live: the worker's threads (its capacity)

    def remove_node(self, index: int) -> None:
        self.inner.remove_node(index)
        self.learner.remove_node(index)

    def add_graph(self, tasks: Sequence[TaskView]) -> None:
        self.inner.add_graph(tasks)

    def push(self, task: TaskView) -> None:
        self.inner.push(task)
        self.sums.push(task.estimate, task.cores)

    def push_many(self, tasks: Sequence[TaskView]) -> None:
        self.inner.push_many(tasks)
        for t in tasks:
            self.sums.push(t.estimate, t.cores)

    def pop(self, node: NodeView, now: float) -> TaskView | None:
        task = self.inner.pop(node, now)
        if task is not None:
            self.sums.pop(task.estimate, task.cores)
        return task

    def started(self, attempt: AttemptView, now: float) -> None:
        self.inner.started(attempt, now)
        t = attempt.task
        if not attempt.backup:  # live, a copy is a task of its own that was never queued
            self.sums.started(id(attempt), t.cores, now + t.estimate * self.speed(attempt.node))

    def ended(self, attempt: AttemptView, now: float) -> bool:
        self.inner.ended(attempt, now)
        self.sums.ended(id(attempt))
        start = attempt.start
        if attempt.outcome == "done":
            start = min(start + self.overhead, now)
        seen = _Seen(attempt.task, attempt.node, start, now, attempt.outcome, attempt.backup)
        return self.learner.ended(seen, now)

    def forget(self, tid: Hashable) -> None:
        self.inner.forget(tid)

    def speed(self, node: int) -> float:
        return self.learner.speed(node)

    def urgent(self, attempt: AttemptView, now: float) -> bool:
        return self.learner.urgent(attempt, now)

    def horizon(self, now: float) -> float:
        return self.sums.value(now, self.learner.capacity())

    def __len__(self) -> int:
        return len(self.inner)

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "speeds": self.learner.describe()["speeds"]}


class Placed(Policy):
    """Replay dask's placement as recorded: each task's first attempt runs on the node
    (worker) it ran on, in the order it started there; the policy ``inner`` decides the
    rest (retries, tasks the trace does not place, and everything but placement:
    speeds, lateness, the horizon, its accounts). :func:`replay` also starts each such
    attempt no sooner than it started (``simulate(not_before=...)``): the run's own
    timeline, which a copy taking a node's slot can only delay.

    Which task goes to which worker is dask's decision, not a daskjobs policy's (the
    first free thread takes the next task); a simulated replay makes that decision
    itself, and a few milliseconds of difference send other tasks to a slow worker.
    Following the record makes a replay of the run that was recorded comparable race by
    race (the same tasks on the slow worker get copies); what-ifs under other policies
    keep the simulated placement. O(1) per push and pop (per-node queues in recorded
    order).

    A policy that keeps accounts of its own queue (it overrides ``Policy.discard``:
    ``node-aware``, whose horizon and urgency read the work it holds queued) is pushed
    every task as live, and told when a placed task leaves its queue here
    (``discard``): live it held all of them until they started, and a queue left empty
    put its horizon at ``now`` (every attempt on a slow node urgent, 10 to 14 copies
    replayed against 0 or 1 recorded).
    """

    def __init__(self, inner: Policy, placement: Mapping[Hashable, tuple[int, float]]) -> None:
        self.inner = inner
        self.name = inner.name
        # the inner policy holds the placed tasks too, as live (see above)
        self.inner_holds_all = type(inner).discard is not Policy.discard
        self.others = 0  # tasks in the inner's queue that the record does not place
        order: dict[int, list[tuple[float, Hashable]]] = {}
        for tid, (node, when) in placement.items():
            order.setdefault(node, []).append((when, tid))
        self.queues = {n: deque(t for _, t in sorted(ts, key=_first)) for n, ts in order.items()}
        self.placed = set(placement)
        self.ready: dict[Hashable, TaskView] = {}  # placed, runnable, not yet started
        self.taken: set[Hashable] = set()  # placed tasks already popped once

    def add_node(self, index: int, cores: int) -> None:
        self.inner.add_node(index, cores)

    def remove_node(self, index: int) -> None:
        self.inner.remove_node(index)

    def add_graph(self, tasks: Sequence[TaskView]) -> None:
        self.inner.add_graph(tasks)

    def push(self, task: TaskView) -> None:
        if task.tid in self.placed and task.tid not in self.taken:
            self.ready[task.tid] = task
            if self.inner_holds_all:
                self.inner.push(task)
        else:  # a retry, or a task the trace does not place: the policy's to place
            self.others += 1
            self.inner.push(task)

    def pop(self, node: NodeView, now: float) -> TaskView | None:
        q = self.queues.get(node.index)
        while q and q[0] in self.taken:  # taken by the policy (below): not here
            q.popleft()
        if q:
            head = q[0]
            task = self.ready.get(head)
            if task is not None and task.cores <= node.free:
                q.popleft()
                del self.ready[head]
                self.taken.add(head)
                if self.inner_holds_all:
                    self.inner.discard(task)
                return task
        if not self.others:
            return None
        got = self.inner.pop(node, now)
        if got is not None:
            if self.ready.pop(got.tid, None) is not None:  # placed, popped by the policy
                self.taken.add(got.tid)  # (only while it also holds others: a retry)
            else:
                self.others -= 1
        return got

    def started(self, attempt: AttemptView, now: float) -> None:
        self.inner.started(attempt, now)

    def ended(self, attempt: AttemptView, now: float) -> bool:
        return self.inner.ended(attempt, now)

    def forget(self, tid: Hashable) -> None:
        self.inner.forget(tid)

    def speed(self, node: int) -> float:
        return self.inner.speed(node)

    def urgent(self, attempt: AttemptView, now: float) -> bool:
        return self.inner.urgent(attempt, now)

    def horizon(self, now: float) -> float:
        return self.inner.horizon(now)

    def __len__(self) -> int:
        return (
            len(self.ready) + self.others
            if self.inner_holds_all
            else len(self.ready) + len(self.inner)
        )

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "placement": "recorded"}


def _first(pair: tuple[float, Any]) -> float:
    return pair[0]


def make_replay_policy(
    name: str, loaded: Loaded, options: Mapping[str, Any] | None = None
) -> Policy:
    """A fresh policy by its registered name, made as the plugin makes it.

    ``options`` are the policy's own settings (keywords of its factory); by default the
    recorded run's ``policy-options`` when ``name`` is the policy that ran, else none.
    ``fair-share`` takes its teams from the trace's settings (every team present weighing
    1 if none were set).
    """
    if options is None:
        options = recorded_options(loaded) if name == loaded.policy else {}
    settings = dict(options)
    if name == "fair-share":
        teams = loaded.settings.get("teams") or {}
        targets = dict(teams.get("targets") or {})
        present = sorted({t.team for t in loaded.tasks})
        if not targets:
            targets = dict.fromkeys(present, 1.0)
        half_life = teams.get("half_life")
        quotas = {k: int(v) for k, v in (teams.get("quotas") or {}).items() if k in targets}
        within = teams.get("within")
        settings = {
            "targets": targets,
            "within": within if within in ("fifo", "lpt") else "fifo",
            "half_life": float(half_life) if half_life else None,
            "quotas": quotas or None,
            "strict": False,
            **settings,
        }
    return registry.make(name, **settings)


def recorded_options(loaded: Loaded) -> dict[str, Any]:
    """The recorded run's ``policy-options`` (settings of the policy that ran)."""
    options = loaded.settings.get("policy_options") or {}
    if not (isinstance(options, Mapping) and all(isinstance(k, str) for k in options)):
        raise ValueError(
            f"{loaded.path}: the recorded policy_options are not a mapping of setting names: "
            f"{options!r}"
        )
    return dict(options)


def make_cluster(
    loaded: Loaded,
    nodes: int | None = None,
    cores_per_node: int | None = None,
    no_slow: bool = False,
) -> Cluster:
    """The recorded cluster, changed: other node or core counts, or without its slow nodes.

    Slow nodes keep their index (the fastest nodes come first, so adding nodes adds
    nominal ones, and removing nodes removes the slowest first).
    """
    base = loaded.cluster
    n = base.nodes if nodes is None else nodes
    c = base.cores_per_node if cores_per_node is None else cores_per_node
    slow = None if no_slow else {i: f for i, f in (base.slow or {}).items() if i < n}
    need = max((t.cores for t in loaded.tasks), default=1)
    if c < need:
        raise ValueError(f"cores per node {c} is fewer than a recorded task needs ({need})")
    return Cluster(n, c, slow or None, base.failure_rate, base.overhead)


def replay(
    trace: Loaded | Trace | str | os.PathLike[str],
    policy: str | None = None,
    *,
    speculation: float | Literal["recorded"] | None = RECORDED,
    nodes: int | None = None,
    cores_per_node: int | None = None,
    no_slow: bool = False,
    seed: int = 0,
    options: Mapping[str, Any] | None = None,
    placement: Literal["simulated", "recorded"] = "simulated",
    learn: bool | Estimator = False,
) -> ReplayResult:
    """Replay ``trace`` under ``policy`` (default: the one recorded, else ``fifo``).

    ``placement="recorded"`` runs each task's first attempt on the worker, and in the
    order, the trace recorded (:class:`Placed`), and not before it started there, each
    attempt adding the fitted ``attempt_overhead`` to its compute (the capacity dask lost
    between attempts is in the recorded starts): a replay of the run that was recorded,
    comparable race by race; it needs the recorded cluster (no ``nodes``,
    ``cores_per_node`` or ``no_slow``). The default simulates dask's placement, each
    attempt adding the fitted ``overhead``.

    ``speculation`` is a late factor (e.g. 2.5), ``None`` for no backups, or
    :data:`RECORDED` (the default): the recorded run's settings (late factor,
    ``min_runtime``, ``max_fraction``; off if it ran without). With backups on, a
    policy that does not learn worker speeds itself judges lateness with the live
    plugin's learner (:class:`PluginSpeeds`). ``nodes``/``cores_per_node``/``no_slow``
    change the cluster; ``seed`` seeds the simulator's failure draws. ``policy`` is any
    registered name (:mod:`daskjobs.policies.registry`); ``options`` its own settings
    (default: the recorded ones when it is the policy that ran, see
    :func:`make_replay_policy`).

    ``learn=True`` replays with learned estimates: every task whose recorded estimate
    was not its ``estimate`` annotation starts from the recorded run's default estimate,
    and the simulator's learner (``simulate(..., learn=True)``, the duration models of
    :mod:`daskjobs.policies.durations`) estimates it from the durations the replay
    measures, by its recorded stage and ``params`` annotation, re-ranking as it learns;
    pass an :class:`~daskjobs.policies.durations.Estimator` to start from a history.
    ``result.schedule.estimator`` holds what it learned.
    """
    loaded = trace if isinstance(trace, Loaded) else load(trace)
    name = policy or _recorded_policy(loaded)
    pol = make_replay_policy(name, loaded, options)
    cluster = make_cluster(loaded, nodes, cores_per_node, no_slow)
    spec: Speculation | None
    if speculation == RECORDED:
        spec = loaded.speculation
    elif speculation is None:
        spec = None
    elif isinstance(speculation, int | float) and not isinstance(speculation, bool):
        spec = Speculation(late_factor=float(speculation))
    else:
        raise ValueError(f"speculation must be a late factor, None or {RECORDED!r}")
    learns = type(pol).speed is not Policy.speed
    not_before: dict[Hashable, float] | None = None
    if placement == "recorded":
        if nodes is not None or cores_per_node is not None or no_slow:
            raise ValueError(
                "placement='recorded' replays the recorded cluster: drop nodes, "
                "cores_per_node and no_slow, or use placement='simulated'"
            )
        pol = Placed(pol, loaded.placement)  # inside PluginSpeeds: its sums see every push
        # the recorded timeline: each placed task starts no sooner than it did, and the
        # capacity lost between attempts is in those starts, not spread over the attempts
        not_before = {tid: when for tid, (_node, when) in loaded.placement.items()}
        cluster = dataclasses.replace(cluster, overhead=loaded.fit.attempt_overhead)
    elif placement != "simulated":
        raise ValueError(f"placement must be 'simulated' or 'recorded', got {placement!r}")
    if spec is not None and not learns:
        pol = PluginSpeeds(pol, cluster.overhead)
    phase = loaded.check_phase if spec is not None and spec == loaded.speculation else 0.0
    tasks = loaded.tasks
    learner = None
    if learn is not False:
        if not (learn is True or isinstance(learn, Estimator)):
            raise TypeError(
                f"learn must be True, False or a daskjobs.policies.durations.Estimator, "
                f"got {type(learn).__name__} {learn!r}"
            )
        learner = learn if isinstance(learn, Estimator) else Estimator(default_estimate(loaded))
        tasks = unannotated(loaded)
    schedule = simulate(
        tasks,
        cluster,
        pol,
        spec=spec,
        seed=seed,
        check_phase=phase,
        learn=learner or False,
        not_before=not_before,
    )
    factor = spec.late_factor if spec is not None else None
    return ReplayResult(loaded, schedule, name, factor, cluster)


def default_estimate(loaded: Loaded) -> float:
    """The recorded run's default estimate (seconds): what a task without one had."""
    return float(loaded.settings.get("default_estimate") or 1.0)


def unannotated(loaded: Loaded) -> list[Task]:
    """The replayed tasks as a learner starts from them: a task whose recorded estimate
    was not its annotation has the default estimate, marked as such (``estimated``
    false), as :func:`daskjobs.sim.workloads.without_estimates` makes them."""
    d = default_estimate(loaded)
    keep = loaded.annotated
    return [
        t if t.tid in keep else dataclasses.replace(t, estimate=d, estimated=False)
        for t in loaded.tasks
    ]


def _recorded_policy(loaded: Loaded) -> str:
    p = loaded.policy
    if p is None:
        return "fifo"
    if p not in registry.names():
        raise ValueError(
            f"the trace was recorded under policy {p!r}, which is not registered here: "
            "register it (daskjobs.policies.register, or its package's entry point; "
            "docs/how-to/write-a-policy.md) to replay it as recorded"
        )
    return p


def what_ifs(
    loaded: Loaded,
    policies: Sequence[str],
    clusters: Sequence[tuple[int | None, int | None, bool]],
    speculation: float | None = None,
    seed: int = 0,
) -> list[ReplayResult]:
    """Replay every policy on every cluster ``(nodes, cores_per_node, no_slow)``."""
    return [
        replay(
            loaded,
            p,
            speculation=speculation,
            nodes=n,
            cores_per_node=c,
            no_slow=ns,
            seed=seed,
        )
        for n, c, ns in clusters
        for p in policies
    ]


def busy_over_time(
    intervals: Sequence[tuple[float, float]], step: float
) -> tuple[np.ndarray, np.ndarray]:
    """Slots busy at each multiple of ``step`` seconds, from 0 to the last end."""
    if not intervals:
        return np.zeros(1), np.zeros(1)
    starts = np.sort(np.array([s for s, _ in intervals], dtype=float))
    ends = np.sort(np.array([e for _, e in intervals], dtype=float))
    times = np.arange(0.0, float(ends.max()) + step, step)
    busy = np.searchsorted(starts, times, side="right") - np.searchsorted(ends, times, side="right")
    return times, busy.astype(float)


def replayed_intervals(result: ReplayResult) -> list[tuple[float, float]]:
    """(start, end) of every simulated attempt, slot by slot (a k-core attempt counts k)."""
    out: list[tuple[float, float]] = []
    for a in result.schedule.attempts:
        out.extend([(a.start, a.end)] * len(a.cores))
    return out


def stage_of(loaded: Loaded, tid: Hashable) -> str:
    return loaded.stages.get(tid, "")
