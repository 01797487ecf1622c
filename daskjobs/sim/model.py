"""What the simulator simulates: tasks, a cluster, attempts.

Ground truth is kept apart from what a scheduler may know: a :class:`Task`
carries its true ``duration`` (seen only by the simulator) and an
``estimate`` (seen by policies). Times are seconds everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from daskjobs.policies.base import renamed_attribute

__all__ = ["Attempt", "Cluster", "CycleError", "Task", "topological_order"]


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_time(tid: Hashable, what: str, value: float) -> None:
    if not (_is_number(value) and math.isfinite(value) and value >= 0):
        raise ValueError(
            f"task {tid!r}: {what} must be a finite number >= 0 seconds, got {value!r}"
        )


@dataclass(frozen=True, slots=True)
class Task:
    """One node of a task graph.

    ``duration`` is the true run time on a nominal core (hidden from
    policies); ``estimate`` what the scheduler believes (defaults to the
    duration); ``cores`` slots held while running, all on one node; ``deps``
    ids of tasks whose output it reads; ``submit`` when it is submitted.
    ``speculate=False`` forbids backup copies (a task with side effects);
    ``estimated=False`` says the estimate is only a configured default (the
    scheduler has nothing to judge lateness or speeds against: no copies, no
    speed learning, the policies' rules). ``stage`` and ``params`` say what the task
    computes (a sweep's stage and the parameters of its grid point): a duration model
    (:mod:`daskjobs.policies.durations`) learns from them where no estimate is given.
    ``teams``: every team whose graphs want the task, when several do (a stage two
    teams' sweeps share: one task); empty means ``team`` alone. Fair share splits its
    cores among them while it runs.
    """

    # Where the running simulation keeps this task (simulator-internal, checked on use).
    # The first slot, not the last: the simulator reads it at every start, right after
    # the policy's pop touched the object's header, and here it shares its cache line
    # (not in __init__, so its place changes no argument's position).
    _ti: int = field(default=-1, init=False, repr=False, compare=False)
    tid: Hashable
    duration: float
    estimate: float = None  # type: ignore[assignment]  # None -> duration
    cores: int = 1
    deps: tuple[Hashable, ...] = ()
    team: str = "default"
    submit: float = 0.0
    speculate: bool = True
    estimated: bool = True
    stage: str | None = None
    params: Mapping[str, Any] | None = field(default=None, compare=False)
    teams: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_time(self.tid, "duration", self.duration)
        if self.estimate is None:
            object.__setattr__(self, "estimate", self.duration)
        else:
            _check_time(self.tid, "estimate", self.estimate)
        _check_time(self.tid, "submit", self.submit)
        if not (_is_count(self.cores) and self.cores >= 1):
            raise ValueError(
                f"task {self.tid!r}: cores must be an integer >= 1, got {self.cores!r}"
            )
        if not isinstance(self.deps, tuple):
            object.__setattr__(self, "deps", tuple(self.deps))
        if self.tid in self.deps:
            raise ValueError(f"task {self.tid!r} depends on itself")
        if not isinstance(self.teams, tuple):
            object.__setattr__(self, "teams", tuple(self.teams))
        if self.teams and self.team not in self.teams:
            raise ValueError(
                f"task {self.tid!r}: teams {self.teams!r} (the teams that want it) must "
                f"include its own team {self.team!r}"
            )


@dataclass(frozen=True)
class Cluster:
    """``nodes`` nodes of ``cores_per_node`` cores.

    ``slow`` maps a node index to its slow-down factor (4.0: every attempt on
    it takes 4x its duration). ``failure_rate`` is the probability that an
    attempt fails; a failing attempt dies at a uniformly drawn point of its run
    and the task restarts from the beginning. ``overhead`` is what every attempt
    holds its slot for beyond its work, on any node (dask's per-task cost; a
    replay fits it from the trace): unlike the work it is not slowed down.
    ``dispatch_rate`` (0: unlimited) is how many attempts the scheduler can start
    a second over the whole cluster: every start queues for one dispatcher (first
    come, first served) and takes ``1 / dispatch_rate`` seconds of it, the slot
    held meanwhile. It models a scheduler that many short tasks on many slots
    keep busy (docs/benchmarks.md, the end of a longest-first run).
    ``stops_losers`` (True): the losing copy of a race is killed at once. False
    models dask, which cannot stop a thread: the loser holds its cores until it
    would have ended, or until the speculation policy takes its thread for returned
    (:meth:`Speculation.reclaim_at <daskjobs.policies.Speculation.reclaim_at>`).
    """

    nodes: int
    cores_per_node: int
    slow: Mapping[int, float] | None = None
    failure_rate: float = 0.0
    overhead: float = 0.0
    dispatch_rate: float = 0.0
    stops_losers: bool = True
    speeds: tuple[float, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not (_is_count(self.nodes) and self.nodes >= 1):
            raise ValueError(f"nodes must be an integer >= 1, got {self.nodes!r}")
        if not (_is_count(self.cores_per_node) and self.cores_per_node >= 1):
            raise ValueError(f"cores_per_node must be an integer >= 1, got {self.cores_per_node!r}")
        if not (_is_number(self.failure_rate) and 0.0 <= self.failure_rate < 1.0):
            raise ValueError(f"failure_rate must be in [0, 1), got {self.failure_rate!r}")
        if not (_is_number(self.overhead) and math.isfinite(self.overhead) and self.overhead >= 0):
            raise ValueError(f"overhead must be >= 0 seconds, got {self.overhead!r}")
        if not isinstance(self.stops_losers, bool):
            raise TypeError(f"stops_losers must be True or False, got {self.stops_losers!r}")
        rate = self.dispatch_rate
        if not (_is_number(rate) and math.isfinite(rate) and rate >= 0):
            raise ValueError(
                f"dispatch_rate must be >= 0 starts per second (0: unlimited), got {rate!r}"
            )
        speeds = [1.0] * self.nodes
        for node, factor in (self.slow or {}).items():
            if not (isinstance(node, int) and 0 <= node < self.nodes):
                raise ValueError(f"slow node {node!r} is not a node index in [0, {self.nodes})")
            if not (_is_number(factor) and math.isfinite(factor) and factor > 0):
                raise ValueError(f"slow-down factor of node {node} must be > 0, got {factor!r}")
            speeds[node] = float(factor)
        object.__setattr__(self, "speeds", tuple(speeds))

    @property
    def total_cores(self) -> int:
        return self.nodes * self.cores_per_node

    @property
    def effective_cores(self) -> float:
        """Core-equivalents delivered: a 4x slow node of 16 cores counts 4."""
        return sum(self.cores_per_node / s for s in self.speeds)

    def without_slow(self) -> Cluster:
        return Cluster(
            self.nodes,
            self.cores_per_node,
            None,
            self.failure_rate,
            self.overhead,
            self.dispatch_rate,
            self.stops_losers,
        )


_NAN = math.nan


class Attempt:
    """One execution of a task on one node (read-only once the run is over).

    ``outcome`` is ``"done"``, ``"failed"`` or ``"killed"`` (the losing copy
    of a speculated task), ``None`` while running. ``cores`` are global core
    ids (``node * cores_per_node + local``). ``policy_state`` is the policy's: what its
    ``started`` keeps for its ``ended`` (NodeAware's record for its horizon), on the attempt
    instead of in a dict keyed by attempts; unset until a policy sets it.
    """

    __slots__ = (
        "aid",
        "backup",
        "check_at",
        "cores",
        "end",
        "node",
        "outcome",
        "policy_state",
        "start",
        "task",
        "ti",
    )

    def __init__(
        self,
        aid: int,
        task: Task,
        node: int,
        cores: tuple[int, ...],
        start: float,
        backup: bool,
        ti: int = -1,
    ) -> None:
        self.aid = aid
        self.task = task
        self.node = node
        self.cores = cores
        self.start = start
        self.end = _NAN  # (a module constant: one lookup, not two, per attempt)
        self.outcome: str | None = None
        self.backup = backup
        self.check_at = _NAN
        self.ti = ti  # the task's position in the simulated list (simulator-internal)

    @property
    def core(self) -> int:
        return self.cores[0]

    books = renamed_attribute("attempt.books")

    def __repr__(self) -> str:
        return (
            f"Attempt({self.aid}, task={self.task.tid!r}, node={self.node}, start={self.start:g}, "
            f"end={self.end:g}, outcome={self.outcome!r}, backup={self.backup})"
        )


class CycleError(ValueError):
    """The task graph has a dependency cycle."""


def _find_cycle(tasks: Sequence[Task], left: set[Hashable]) -> list[Hashable]:
    by_id = {t.tid: t for t in tasks}
    start = next(t.tid for t in tasks if t.tid in left)  # input order, not set order
    path: list[Hashable] = []
    seen: dict[Hashable, int] = {}
    node = start
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = next(d for d in by_id[node].deps if d in left)
    return [*path[seen[node] :], node]


def topological_order(tasks: Sequence[Task]) -> list[Task]:
    """``tasks`` ordered so that each comes after its dependencies.

    Ties keep input order. Raises :class:`CycleError` naming a cycle, or
    ``ValueError`` naming an unknown dependency.
    """
    ids = {t.tid for t in tasks}
    indeg: dict[Hashable, int] = {}
    dependents: dict[Hashable, list[Task]] = {}
    for t in tasks:
        for d in t.deps:
            if d not in ids:
                raise ValueError(f"task {t.tid!r} depends on unknown task {d!r}")
            dependents.setdefault(d, []).append(t)
        indeg[t.tid] = len(set(t.deps))
    order = [t for t in tasks if not indeg[t.tid]]
    i = 0
    while i < len(order):
        for child in dependents.get(order[i].tid, ()):
            indeg[child.tid] -= 1
            if not indeg[child.tid]:
                order.append(child)
        i += 1
    if len(order) != len(tasks):
        done = {t.tid for t in order}
        cycle = _find_cycle(tasks, {t.tid for t in tasks if t.tid not in done})
        raise CycleError("dependency cycle: " + " -> ".join(map(repr, cycle)))
    return order
