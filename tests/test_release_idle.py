"""A slot the policy leaves idle stays idle: the release gate takes the worker out of
dask's set of workers with free slots (``idle_task_count``) until one of its tasks ends.

A scheduler stand-in drives the gate's transitions (order and causality only): a
refusal after a task ended takes the worker out; a worker with nothing running, or a
refusal while dask is filling slots, does not; a choice does not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from daskjobs.plugin.audit import Audit
from daskjobs.plugin.release import ReleaseGate
from daskjobs.plugin.speeds import WorkerSpeeds
from daskjobs.plugin.views import LiveTask
from daskjobs.policies import NodeAware


@dataclass(eq=False)
class WS:
    address: str
    nthreads: int = 2
    processing: set[Any] = field(default_factory=set)


@dataclass(eq=False)
class TS:
    key: str
    state: str = "queued"
    priority: tuple[Any, ...] = (0, 0.0, 0, 0)
    processing_on: WS | None = None


class Scheduler:
    def __init__(self, workers: list[WS]) -> None:
        self.workers = {ws.address: ws for ws in workers}
        self.tasks: dict[str, TS] = {}
        self.idle_task_count: set[WS] = set()
        self.queued: set[TS] = set()


class Refusing(NodeAware):
    """Node-aware that refuses the nodes in ``refuse`` (as it refuses a slow worker
    when nothing would end in time)."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse: set[int] = set()
        self.asked: list[int] = []

    def pop(self, node: Any, now: float) -> Any:
        self.asked.append(getattr(node, "index", -1))
        if getattr(node, "index", -1) in self.refuse:
            return None
        return super().pop(node, now)


def make() -> tuple[ReleaseGate, Refusing, Scheduler, WS, WS]:
    policy = Refusing()
    audit = Audit(100)
    speeds = WorkerSpeeds(audit, policy)
    fast, slow = WS("tcp://fast"), WS("tcp://slow")
    sched = Scheduler([fast, slow])
    speeds.scheduler = sched  # type: ignore[assignment]
    tasks: dict[str, LiveTask] = {}
    gate = ReleaseGate(policy, tasks, speeds, audit)
    gate.scheduler = sched  # type: ignore[assignment]
    for address in (fast.address, slow.address):
        speeds.node(address)
    for i in range(6):
        key = f"t-{i}"
        tasks[key] = LiveTask(key, 1.0 + i, 1, "default", 0.0, (), "annotation", "t")
        sched.tasks[key] = ts = TS(key)
        sched.queued.add(ts)
    return gate, policy, sched, fast, slow


def start(gate: ReleaseGate, sched: Scheduler, key: str, ws: WS) -> None:
    ts = sched.tasks[key]
    ts.state, ts.processing_on = "processing", ws
    sched.queued.discard(ts)
    ws.processing.add(ts)
    gate.transition(key, "queued", "processing")


def end(gate: ReleaseGate, sched: Scheduler, key: str) -> None:
    """The task ends; dask counts its worker as having a free slot (check_idle_saturated)
    before the plugin's hook runs."""
    ts = sched.tasks[key]
    ws = ts.processing_on
    assert ws is not None
    ws.processing.discard(ts)
    ts.state, ts.processing_on = "memory", None
    sched.idle_task_count.add(ws)
    gate.transition(key, "processing", "memory")


def queue_all(gate: ReleaseGate, sched: Scheduler, keys: list[str]) -> None:
    for key in keys:
        gate.transition(key, "waiting", "queued")


def test_a_refused_slot_takes_its_worker_out_of_the_free_slots() -> None:
    gate, policy, sched, _, slow = make()
    for key, ws in (("t-0", slow), ("t-1", slow)):
        start(gate, sched, key, ws)
    queue_all(gate, sched, ["t-2", "t-3", "t-4", "t-5"])
    policy.refuse.add(gate.speeds.nodes[slow.address])
    end(gate, sched, "t-0")  # t-1 still runs on the slow worker
    assert policy.asked[-1] == gate.speeds.nodes[slow.address]
    assert gate.released is None
    assert slow not in sched.idle_task_count  # dask will not fill it
    assert gate.kept_idle == 1
    # its next task end puts it back (dask does), and the policy is asked again
    policy.refuse.clear()
    end(gate, sched, "t-1")
    assert slow in sched.idle_task_count
    assert gate.released is not None  # the policy chose a task for the freed slot
    assert gate.kept_idle == 1


def test_a_worker_with_nothing_running_is_left_to_dask() -> None:
    gate, policy, sched, _, slow = make()
    start(gate, sched, "t-0", slow)
    queue_all(gate, sched, ["t-2", "t-3"])
    policy.refuse.add(gate.speeds.nodes[slow.address])
    end(gate, sched, "t-0")  # nothing else runs there: nothing would bring it back
    assert slow in sched.idle_task_count
    assert gate.kept_idle == 0


def test_no_worker_is_taken_out_while_dask_fills_slots() -> None:
    """A refusal asked from inside dask's filling of free slots (a queued task just
    went to a worker) leaves the set alone: dask has counted the slots already."""
    gate, policy, sched, fast, slow = make()
    start(gate, sched, "t-0", slow)
    start(gate, sched, "t-1", slow)
    queue_all(gate, sched, ["t-3", "t-4", "t-5"])
    sched.idle_task_count.add(slow)
    policy.refuse.add(gate.speeds.nodes[slow.address])
    start(gate, sched, "t-2", fast)  # from dask's queue, no slot opened by an end
    assert slow in sched.idle_task_count
    assert gate.kept_idle == 0
