"""A first wave's cost is flat in the number of free workers, and its choices unchanged.

When a graph arrives while slots are free, the release gate asks ``pop`` for each free
slot in dask's order: the least busy worker, (processing + taken) / threads, the first
in ``idle_task_count``'s order on ties (:meth:`ReleaseGate.first_wave`). That walk took
a ``min`` over the free workers for every slot (O(k^2) in k free workers) and asked
every free worker once more after the policy's queue was empty: a one-task graph on 128
idle workers cost ~8,400 key calls and 128 pops. Here: the same pops answered, in the
same order, against a copy of the old walk, over random loads, threads and refusals;
and the counts (pops, reads of a worker's load) of a wave at 128 workers.
"""

from __future__ import annotations

import random
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import pytest

from daskjobs.plugin import _internals as dask_internals
from daskjobs.plugin.audit import Audit
from daskjobs.plugin.release import _RELEASED, ReleaseGate
from daskjobs.plugin.speeds import WorkerSpeeds
from daskjobs.plugin.views import ANY_NODE, LiveAttempt, LiveTask, Slot
from daskjobs.policies import NodeView, Policy, TaskView


class Processing(set[Any]):
    """A worker's processing set that counts how often its size is read."""

    reads = 0

    def __len__(self) -> int:
        Processing.reads += 1
        return super().__len__()


@dataclass(eq=False)
class WS:
    address: str
    nthreads: int = 1
    processing: Processing = field(default_factory=Processing)
    long_running: set[Any] = field(default_factory=set)

    def __hash__(self) -> int:  # the same set order in both scenes of a seed
        return zlib.crc32(self.address.encode())


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
        self.idle_task_count: set[WS] = set()
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
) -> tuple[ReleaseGate, Picky, Scheduler, list[TS]]:
    rng = random.Random(seed)
    workers = []
    for i in range(n_workers):
        ws = WS(f"tcp://w{i}", nthreads=rng.choice((1, 1, 2, 4)))
        for _ in range(rng.randint(0, ws.nthreads + 1)):  # some full, some beyond
            ws.processing.add(object())
        workers.append(ws)
    sched = Scheduler(workers)
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


def outcome(gate: ReleaseGate, policy: Picky, sched: Scheduler) -> dict[str, Any]:
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
    workers = [WS(f"tcp://w{i}") for i in range(n_workers)]
    sched = Scheduler(workers)
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
