"""The engine's fast path against its slow reference path, event for event.

The engine's kernel inlines the end of an attempt (it asks the policy's own
``Speculation.deadline`` when a primary starts), and skips the hooks a policy leaves
as the base class has them (``speed``, ``urgent``, ``started``, ``ended``);
``simulate(..., reference=True)`` calls the
policy's methods and the engine's helper instead. Both must give the same schedule:
every attempt (task, node, cores, start, end, outcome, backup flag) in start order,
the same event count and copies, and, through a policy that logs its hooks, the same
calls in the same order at the same times.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from typing import Any

import pytest

from daskjobs.policies import FairShare, Policy, Speculation, make_policy
from daskjobs.policies.base import AttemptView, NodeView, TaskView
from daskjobs.sim import Cluster, Task, simulate
from daskjobs.sim.workloads import chapter


class _Logged(Policy):
    """``inner``, with every hook call that moves the run logged as (hook, task, time)."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.log: list[tuple[Any, ...]] = []

    def add_node(self, index: int, cores: int) -> None:
        self.inner.add_node(index, cores)

    def add_graph(self, tasks: Sequence[TaskView]) -> None:
        self.inner.add_graph(tasks)

    def push(self, task: TaskView) -> None:
        self.log.append(("push", task.tid))
        self.inner.push(task)

    def push_many(self, tasks: Sequence[TaskView]) -> None:
        self.log.append(("push_many", tuple(t.tid for t in tasks)))
        self.inner.push_many(tasks)

    def pop(self, node: NodeView, now: float) -> TaskView | None:
        t = self.inner.pop(node, now)
        self.log.append(("pop", node.index, now, None if t is None else t.tid))
        return t

    def started(self, attempt: AttemptView, now: float) -> None:
        self.log.append(("started", attempt.task.tid, attempt.node, now, attempt.backup))
        self.inner.started(attempt, now)

    def ended(self, attempt: AttemptView, now: float) -> bool:
        got = self.inner.ended(attempt, now)
        self.log.append(("ended", attempt.task.tid, now, attempt.outcome, got))
        return got

    def forget(self, tid: Hashable) -> None:
        self.inner.forget(tid)

    def speed(self, node: int) -> float:
        return self.inner.speed(node)

    def urgent(self, attempt: AttemptView, now: float) -> bool:
        return self.inner.urgent(attempt, now)

    def horizon(self, now: float) -> float:
        return self.inner.horizon(now)

    def __len__(self) -> int:
        return len(self.inner)


class _LateAtHalf(Speculation):
    """A subclass with its own deadline: the engine may not inline it."""

    def deadline(self, start: float, estimate: float, speed: float = 1.0) -> float:
        return start + max(self.min_runtime, 0.5 * self.late_factor * estimate * speed)


def _golden_tasks() -> list[Task]:
    # the golden test's sweep, smaller: two core sizes, two teams, some not copyable
    out = []
    for i in range(400):
        d = 60.0 * (1 + (i * 7919) % 97)
        if i >= 392:
            d *= 30.0
        e = d * (1 + ((i * 31) % 11 - 5) / 20)
        out.append(
            Task(f"t{i}", d, e, cores=1 + (i % 13 == 0), team="ab"[i % 2], speculate=i % 17 != 0)
        )
    return out


def _policy(name: str) -> Policy:
    return FairShare({"a": 1.0, "b": 2.0}) if name == "fair-share" else make_policy(name)


def _record(s: Any) -> tuple[Any, ...]:
    rows = [(a.task.tid, a.node, a.cores, a.start, a.end, a.outcome, a.backup) for a in s.attempts]
    return (rows, s.events, s.backups_launched, s.backups_won, s.makespan)


def _same(tasks: list[Task], cluster: Cluster, policy: str, spec: Any, seed: int = 0) -> int:
    """Both paths, bare and logged; the number of attempts (so a case is not empty)."""
    fast = simulate(tasks, cluster, _policy(policy), spec=spec, seed=seed)
    slow = simulate(tasks, cluster, _policy(policy), spec=spec, seed=seed, reference=True)
    assert _record(fast) == _record(slow)
    lf, ls = _Logged(_policy(policy)), _Logged(_policy(policy))
    fast_l = simulate(tasks, cluster, lf, spec=spec, seed=seed)
    slow_l = simulate(tasks, cluster, ls, spec=spec, seed=seed, reference=True)
    assert _record(fast_l) == _record(slow_l) == _record(fast)
    assert lf.log == ls.log and lf.log
    return len(fast.attempts)


POLICIES = ("fifo", "lpt", "critical-path", "work-stealing", "fair-share", "node-aware")
SPECS = {
    "none": None,
    "always": Speculation(ahead="always"),
    "horizon": Speculation(ahead="past-horizon"),
    "periodic": Speculation(late_factor=2.0, interval=300.0),
    "subclass": _LateAtHalf(late_factor=3.0, min_runtime=120.0),
    "endgame": Speculation(endgame=True),
    "endgame-periodic": Speculation(late_factor=2.0, interval=300.0, endgame=True),
}


@pytest.mark.parametrize("spec", list(SPECS))
@pytest.mark.parametrize("policy", POLICIES)
def test_the_golden_sweep_is_the_same_on_both_paths(policy: str, spec: str) -> None:
    cluster = Cluster(4, 8, slow={0: 4.0}, failure_rate=0.02)
    assert _same(_golden_tasks(), cluster, policy, SPECS[spec], seed=5) >= 400


@pytest.mark.parametrize("endgame", [False, True])
@pytest.mark.parametrize("stops_losers", [True, False])
@pytest.mark.parametrize("policy", ["lpt", "node-aware", "work-stealing"])
def test_a_small_chapter_sweep_with_copies_is_the_same_on_both_paths(
    policy: str, stops_losers: bool, endgame: bool
) -> None:
    wl = chapter(3, n=1500, n_long=8, nodes=6, cores_per_node=8, slow_node=0)
    cluster = dataclasses.replace(wl.cluster, stops_losers=stops_losers)
    spec = dataclasses.replace(wl.spec, reclaim_after=600.0, reclaim_factor=1.0, endgame=endgame)
    n = _same(wl.tasks, cluster, policy, spec, seed=wl.seed)
    assert n > 1500  # copies and retries ran


def test_urgent_copies_and_a_slow_node_learned_are_the_same_on_both_paths() -> None:
    # node-aware learns node 2 slow, re-judges its attempts and asks for urgent copies
    tasks = [Task(f"x{i}", 100.0 + 7 * (i % 5), 100.0) for i in range(120)]
    cluster = Cluster(3, 4, slow={2: 6.0})
    for spec in (Speculation(), Speculation(min_runtime=0.0, interval=40.0)):
        fast = simulate(tasks, cluster, make_policy("node-aware"), spec=spec)
        assert fast.backups_launched >= 1
        assert _same(tasks, cluster, "node-aware", spec) > 120


@pytest.mark.parametrize("spec", ["none", "always", "periodic"])
@pytest.mark.parametrize("policy", ["lpt", "work-stealing", "node-aware"])
def test_a_paced_dispatcher_and_many_failures_are_the_same_on_both_paths(
    policy: str, spec: str
) -> None:
    # the start of an attempt waits for the dispatcher (its start time is not the
    # event's), and half the attempts fail: tasks run past the fates drawn up front
    wl = chapter(1, n=600, n_long=4, nodes=4, cores_per_node=8, slow_node=3)
    cluster = dataclasses.replace(wl.cluster, failure_rate=0.5, dispatch_rate=2.0)
    n = _same(wl.tasks, cluster, policy, SPECS[spec], seed=wl.seed)
    assert n > 600 * 1.5  # retries ran, many past the first three attempts
