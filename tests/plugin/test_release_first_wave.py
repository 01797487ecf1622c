"""A graph that arrives while slots are free: the first wave is ``pop``'s choice.

dask sends the first root tasks of a new graph, by priority, straight to free slots
without queuing them. The release gate pushes the graph's root tasks to the policy when
the graph arrives (one batch), asks ``pop`` once per free slot and puts the chosen tasks
ahead of every held rank; the others are held when dask queues them (not pushed twice),
and one that dask sends on without queuing leaves the policy's queue. A scheduler
stand-in drives it (order and causality only).

The wave's cost is flat in the number of free workers: it answers the same pops, in the
same order, as a reference walk (a ``min`` over the free workers for each slot, then a pop
for each free worker until each answers None), over random loads, threads and refusals;
and a wave at 128 idle workers asks ``pop`` and reads each worker's load a bounded number
of times.
"""

from __future__ import annotations

import random
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import pytest

from daskjobs.plugin.audit import Audit
from daskjobs.plugin.release import _RELEASED, ReleaseGate
from daskjobs.plugin.speeds import WorkerSpeeds
from daskjobs.plugin.surgery import _internals as dask_internals
from daskjobs.plugin.views import ANY_NODE, LiveAttempt, LiveTask, Slot
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


# -- the wave's cost -------------------------------------------------------------------------------


class Processing(set[Any]):
    """A worker's processing set that counts how often its size is read."""

    reads = 0

    def __len__(self) -> int:
        Processing.reads += 1
        return super().__len__()


@dataclass(eq=False)
class CountingWS:
    address: str
    nthreads: int = 1
    processing: Processing = field(default_factory=Processing)
    long_running: set[Any] = field(default_factory=set)

    def __hash__(self) -> int:  # the same set order in both scenes of a seed
        return zlib.crc32(self.address.encode())


class BareScheduler:
    def __init__(self, workers: list[CountingWS]) -> None:
        self.workers = {ws.address: ws for ws in workers}
        self.tasks: dict[str, TS] = {}
        self.idle_task_count: set[CountingWS] = set()
        self.queued: set[TS] = set()


class Picky(Policy):
    """Shortest estimate first, refusing the nodes in ``refuse``; logs every answer."""

    def __init__(self, refuse: set[int] | None = None) -> None:
        self.queue: list[TaskView] = []
        self.refuse = refuse or set()
        self.asked: list[tuple[int, int, str | None]] = []  # (node, taken, answer)
        self.started_: list[str] = []

    def push_many(self, tasks: Any) -> None:
        self.queue.extend(tasks)

    def push(self, task: TaskView) -> None:
        self.push_many([task])

    def discard(self, task: TaskView) -> None:
        self.queue = [t for t in self.queue if t.tid != task.tid]

    def started(self, attempt: Any, now: float) -> None:
        self.started_.append(str(attempt.task.tid))

    def ended(self, attempt: Any, now: float) -> bool:
        return False

    def pop(self, node: NodeView, now: float) -> TaskView | None:
        index = getattr(node, "index", -1)
        taken = getattr(node, "_taken", 0)
        got = None
        if self.queue and index not in self.refuse:
            got = min(self.queue, key=lambda t: (t.estimate, str(t.tid)))
            self.queue.remove(got)
        self.asked.append((index, taken, None if got is None else str(got.tid)))
        return got

    def __len__(self) -> int:
        return len(self.queue)


class OldGate(ReleaseGate):
    """The walk before this change (a ``min`` over the free workers for each slot, and a
    pop for each free worker until each answers None), as the reference."""

    def first_wave(self, new: list[Any]) -> None:
        sched = self.scheduler
        idle = dask_internals.idle_workers(sched)
        if not idle:
            return
        free = {ws: n for ws in idle if (n := dask_internals.free_slots(sched, ws)) > 0}
        tasks = self.tasks
        roots = [
            tasks[ts.key]
            for ts in new
            if not ts.dependencies and not ts.resource_restrictions and ts.key in tasks
        ]
        if not (free and roots):
            return
        if self.pending:
            self._flush()
        popper = self.popper
        popper.push_many(roots)
        early = self.early
        early.update(v.tid for v in roots)
        taken: dict[Any, int] = {}
        now = time.time()
        while free:
            ws = min(free, key=lambda w: (len(w.processing) + taken.get(w, 0)) / w.nthreads)
            slot = (
                Slot(self.speeds.node(ws.address), ws, tasks, taken.get(ws, 0))
                if self.by_worker
                else ANY_NODE
            )
            v = popper.pop(slot, now)
            if v is None:
                del free[ws]
                continue
            if v.tid in early:
                early.discard(v.tid)
                ts = sched.tasks.get(v.tid)
                if ts is None or ts.priority is None:
                    continue
                self._seq += 1
                p = ts.priority
                dask_internals.set_priority(ts, (p[0], _RELEASED + self._seq, *p[2:]))
                self.chosen.add(v.tid)
                att = LiveAttempt(tasks[v.tid], self.speeds.node(ws.address), now)
                popper.started(att, now)
                self.attempts[v.tid] = att
            elif not self._promote(v):
                continue
            taken[ws] = taken.get(ws, 0) + 1
            free[ws] -= 1
            if free[ws] <= 0:
                del free[ws]


def scene(
    gate_type: type[ReleaseGate], seed: int, by_worker: bool, n_workers: int, n_roots: int
) -> tuple[ReleaseGate, Picky, BareScheduler, list[TS]]:
    rng = random.Random(seed)
    workers = []
    for i in range(n_workers):
        ws = CountingWS(f"tcp://w{i}", nthreads=rng.choice((1, 1, 2, 4)))
        for _ in range(rng.randint(0, ws.nthreads + 1)):  # some full, some beyond
            ws.processing.add(object())
        workers.append(ws)
    sched = BareScheduler(workers)
    order = workers[:]
    rng.shuffle(order)  # the set's order is not the workers' order
    for ws in order:
        if rng.random() < 0.9:  # a few with free threads are out of the set
            sched.idle_task_count.add(ws)
    refuse = {i for i in range(n_workers) if rng.random() < 0.2}
    policy = Picky(refuse)
    audit = Audit(10)
    speeds = WorkerSpeeds(audit)
    speeds.scheduler = sched  # type: ignore[assignment]
    # estimates with ties, some keys ranked but already gone from the scheduler
    keys = [f"k{i}" for i in range(n_roots)]
    tasks = {
        k: LiveTask(k, float(rng.randint(1, 5)), 1, "t", 0.0, (), "annotation", "s") for k in keys
    }
    gate = gate_type(policy, tasks, speeds, audit)
    gate.scheduler = sched  # type: ignore[assignment]
    gate.by_worker = by_worker
    new = []
    for i, k in enumerate(keys):
        ts = TS(k, (0, float(i), 0, i))
        if rng.random() < 0.95:
            sched.tasks[k] = ts
        new.append(ts)
    return gate, policy, sched, new


def outcome(gate: ReleaseGate, policy: Picky, sched: BareScheduler) -> dict[str, Any]:
    return {
        "answered": [a for a in policy.asked if a[2] is not None],
        "started": policy.started_,
        "queue": sorted(str(t.tid) for t in policy.queue),
        "chosen": sorted(map(str, gate.chosen)),
        "early": sorted(map(str, gate.early)),
        "attempts": {str(k): a.node for k, a in gate.attempts.items()},
        "priorities": {k: ts.priority for k, ts in sched.tasks.items()},
        "nodes": dict(gate.speeds.nodes),  # which workers the speed learner knows, in order
        "seq": gate._seq,
    }


@pytest.mark.parametrize("by_worker", [False, True])
@pytest.mark.parametrize(("n_workers", "n_roots"), [(1, 3), (6, 2), (12, 12), (40, 25), (9, 60)])
def test_the_wave_chooses_what_the_old_walk_chose(
    by_worker: bool, n_workers: int, n_roots: int
) -> None:
    for seed in range(25):
        old = scene(OldGate, seed, by_worker, n_workers, n_roots)
        new = scene(ReleaseGate, seed, by_worker, n_workers, n_roots)
        old[0].first_wave(old[3])
        new[0].first_wave(new[3])
        assert outcome(*new[:3]) == outcome(*old[:3]), seed


def idle_cluster(n_workers: int, n_roots: int, by_worker: bool) -> tuple[ReleaseGate, Picky, list]:
    workers = [CountingWS(f"tcp://w{i}") for i in range(n_workers)]
    sched = BareScheduler(workers)
    sched.idle_task_count.update(workers)
    policy = Picky()
    audit = Audit(10)
    speeds = WorkerSpeeds(audit)
    speeds.scheduler = sched  # type: ignore[assignment]
    keys = [f"k{i}" for i in range(n_roots)]
    tasks = {k: LiveTask(k, 1.0, 1, "t", 0.0, (), "annotation", "s") for k in keys}
    gate = ReleaseGate(policy, tasks, speeds, audit)
    gate.scheduler = sched  # type: ignore[assignment]
    gate.by_worker = by_worker
    new = []
    for i, k in enumerate(keys):
        sched.tasks[k] = ts = TS(k, (0, float(i), 0, i))
        new.append(ts)
    for ws in workers:  # seen before (a later graph): a lookup each
        speeds.node(ws.address)
    return gate, policy, new


@pytest.mark.parametrize("by_worker", [False, True])
def test_a_one_task_graph_on_128_idle_workers_asks_once(by_worker: bool) -> None:
    gate, policy, new = idle_cluster(128, 1, by_worker)
    Processing.reads = 0
    gate.first_wave(new)
    assert [a[2] for a in policy.asked] == ["k0"]  # the old walk asked 128 times
    assert Processing.reads <= 2 * 128  # the old walk read loads ~8,400 times


def test_a_wave_over_128_free_slots_reads_each_load_a_few_times() -> None:
    gate, policy, new = idle_cluster(128, 1000, True)
    Processing.reads = 0
    gate.first_wave(new)
    assert len(policy.started_) == 128  # one task per free slot
    assert len(policy.asked) == 128
    assert Processing.reads <= 3 * 128  # the old walk: 128 x 129 / 2 = 8,256


def test_free_slot_counts_are_read_only_for_workers_reached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate, _, new = idle_cluster(128, 1, False)
    calls = 0
    real = dask_internals.free_slots

    def counting(sched: Any, ws: Any) -> int:
        nonlocal calls
        calls += 1
        return real(sched, ws)

    monkeypatch.setattr(dask_internals, "free_slots", counting)
    gate.first_wave(new)
    assert calls <= 2  # the old walk counted the free slots of all 128
