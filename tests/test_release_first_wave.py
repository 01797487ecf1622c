"""A graph that arrives while slots are free: the first wave is ``pop``'s choice.

dask sends the first root tasks of a new graph, by priority, straight to free slots
without queuing them. The release gate pushes the graph's root tasks to the policy when
the graph arrives (one batch), asks ``pop`` once per free slot and puts the chosen tasks
ahead of every held rank; the others are held when dask queues them (not pushed twice),
and one that dask sends on without queuing leaves the policy's queue. A scheduler
stand-in drives it (order and causality only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from daskjobs.plugin.audit import Audit
from daskjobs.plugin.release import ReleaseGate
from daskjobs.plugin.speeds import WorkerSpeeds
from daskjobs.plugin.views import LiveTask
from daskjobs.policies import NodeView, Policy, TaskView


@dataclass(eq=False)
class WS:
    address: str
    nthreads: int = 1
    processing: set[Any] = field(default_factory=set)


@dataclass(eq=False)
class TS:
    key: str
    priority: tuple[Any, ...]
    state: str = "released"
    dependencies: set[Any] = field(default_factory=set)
    resource_restrictions: dict[str, float] | None = None
    processing_on: WS | None = None


class Scheduler:
    def __init__(self, workers: list[WS]) -> None:
        self.workers = {ws.address: ws for ws in workers}
        self.tasks: dict[str, TS] = {}
        self.idle_task_count: set[WS] = {ws for ws in workers if not ws.processing}
        self.queued: set[TS] = set()


class Shortest(Policy):
    """Shortest estimate first; counts what it is given."""

    def __init__(self) -> None:
        self.queue: list[TaskView] = []
        self.pushed: list[list[str]] = []
        self.discarded: list[str] = []
        self.ended_: list[str] = []

    def push_many(self, tasks: Any) -> None:
        self.pushed.append([str(t.tid) for t in tasks])
        self.queue.extend(tasks)

    def push(self, task: TaskView) -> None:
        self.push_many([task])

    def ended(self, attempt: Any, now: float) -> bool:
        self.ended_.append(str(attempt.task.tid))
        return False

    def discard(self, task: TaskView) -> None:
        self.discarded.append(str(task.tid))
        self.queue = [t for t in self.queue if t.tid != task.tid]

    def pop(self, node: NodeView, now: float) -> TaskView | None:
        if not self.queue:
            return None
        best = min(self.queue, key=lambda t: t.estimate)
        self.queue.remove(best)
        return best

    def __len__(self) -> int:
        return len(self.queue)


ESTIMATES = {"a": 3.0, "b": 1.0, "c": 2.0, "d": 4.0}


def make(free_workers: int) -> tuple[ReleaseGate, Shortest, Scheduler, list[TS]]:
    policy = Shortest()
    audit = Audit(10)
    workers = [WS(f"tcp://w{i}") for i in range(2)]
    sched = Scheduler(workers)
    for ws in workers[free_workers:]:  # busy: one task running, no free slot
        ws.processing.add(object())
        sched.idle_task_count.discard(ws)
    speeds = WorkerSpeeds(audit)
    speeds.scheduler = sched  # type: ignore[assignment]
    tasks = {k: LiveTask(k, e, 1, "t", 0.0, (), "annotation", "s") for k, e in ESTIMATES.items()}
    gate = ReleaseGate(policy, tasks, speeds, audit)
    gate.scheduler = sched  # type: ignore[assignment]
    new = []
    for i, k in enumerate(ESTIMATES):  # ranked by hold order: a, b, c, d
        sched.tasks[k] = ts = TS(k, (0, float(i), 0, i))
        new.append(ts)
    return gate, policy, sched, new


def move(gate: ReleaseGate, sched: Scheduler, key: str, finish: str) -> None:
    """One transition as dask makes it: a task sent to processing takes a thread (of the
    least busy worker), and a full worker leaves ``idle_task_count``, before the hook."""
    ts = sched.tasks[key]
    start, ts.state = ts.state, finish
    if finish == "queued":
        sched.queued.add(ts)
    elif finish == "processing":
        ws = min(sched.workers.values(), key=lambda w: len(w.processing))
        ws.processing.add(ts)
        ts.processing_on = ws
        if len(ws.processing) >= ws.nthreads:
            sched.idle_task_count.discard(ws)
    gate.transition(key, start, finish)


def test_pop_chooses_the_tasks_dask_sends_to_free_slots() -> None:
    gate, policy, sched, new = make(free_workers=1)
    gate.first_wave(new)
    assert policy.pushed == [["a", "b", "c", "d"]]  # the graph's roots, as one batch
    b = sched.tasks["b"]
    assert b.priority[1] < min(sched.tasks[k].priority[1] for k in "acd")  # first
    assert gate.chosen == {"b"} and gate.early == {"a", "c", "d"}
    # dask sends b to the free slot, queues a and d, and sends c on without queuing
    move(gate, sched, "b", "waiting")
    move(gate, sched, "b", "processing")
    for k in "ad":
        move(gate, sched, k, "waiting")
        move(gate, sched, k, "queued")
    move(gate, sched, "c", "waiting")
    move(gate, sched, "c", "processing")
    assert policy.pushed == [["a", "b", "c", "d"]]  # queued ones are not pushed again
    assert gate.pending == [] and gate.held == {"a", "d"}
    assert policy.discarded == ["c"]  # it left the queue without a pop
    assert [t.tid for t in policy.queue] == ["a", "d"]
    assert not gate.early and not gate.chosen
    assert set(gate.attempts) == {"b", "c"}
    assert gate.attempts["b"].start <= gate.attempts["c"].start  # b's began at its pop


def test_a_chosen_task_that_dask_queues_after_all_is_first_in_line() -> None:
    gate, policy, sched, new = make(free_workers=1)
    gate.first_wave(new)
    assert set(gate.attempts) == {"b"}  # started at its pop, as the simulator's
    move(gate, sched, "b", "waiting")
    move(gate, sched, "b", "queued")
    assert gate.released == "b" and "b" not in gate.held
    assert policy.pushed == [["a", "b", "c", "d"]]
    assert policy.ended_ == ["b"] and not gate.attempts  # no slot after all: it ended


def test_two_free_slots_two_choices_and_none_without_free_slots() -> None:
    gate, policy, sched, new = make(free_workers=2)
    gate.first_wave(new)
    assert gate.chosen == {"b", "c"}
    gate, policy, sched, new = make(free_workers=0)
    gate.first_wave(new)
    assert policy.pushed == [] and not gate.early and not gate.chosen
    move(gate, sched, "a", "waiting")
    move(gate, sched, "a", "queued")
    assert gate.pending and gate.held == {"a"}  # the usual path: pushed with its burst


def test_tasks_with_inputs_or_resources_are_not_in_a_first_wave() -> None:
    gate, policy, sched, new = make(free_workers=1)
    sched.tasks["b"].dependencies.add(sched.tasks["a"])
    sched.tasks["c"].resource_restrictions = {"GPU": 1}
    gate.first_wave(new)
    assert policy.pushed == [["a", "d"]] and gate.chosen == {"a"}
