"""A slot the policy leaves idle stays idle: the release gate takes the worker out of
dask's set of workers with free slots (``idle_task_count``) and offers it again at the
next task end.

A scheduler stand-in drives the gate's transitions (order and causality only): the
policy is asked about the worker dask would fill next (the least busy with a free
slot); a refusal after a task ended takes that worker out, with or without tasks
running on it, and the next least busy is asked; a refusal while dask is filling slots
does not take a worker out; refused workers come back when offered again and accepted,
when nothing is held, and when nothing runs anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

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

    def check_idle_saturated(self, ws: WS) -> None:
        """dask's rule for ``idle_task_count`` (worker saturation 1.0 here)."""
        if len(ws.processing) < ws.nthreads:
            self.idle_task_count.add(ws)
        else:
            self.idle_task_count.discard(ws)


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
    gate.reoffer_interval = 0.0  # offer refused workers again at every task end
    for address in (fast.address, slow.address):
        speeds.node(address)
    for i in range(10):
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
    sched.check_idle_saturated(ws)  # dask's _add_to_processing, before the hooks
    gate.transition(key, "queued", "processing")


def end(gate: ReleaseGate, sched: Scheduler, key: str) -> None:
    """The task ends; dask counts its worker as having a free slot (check_idle_saturated)
    before the plugin's hook runs."""
    ts = sched.tasks[key]
    ws = ts.processing_on
    assert ws is not None
    ws.processing.discard(ts)
    ts.state, ts.processing_on = "memory", None
    sched.check_idle_saturated(ws)
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


def full(gate: ReleaseGate, sched: Scheduler, fast: WS, slow: WS) -> None:
    """Both workers busy (t-0, t-1 on the slow one; t-2, t-3 on the fast one), t-4 ...
    t-9 queued: dask queues tasks only while no worker has a free slot."""
    for key, ws in (("t-0", slow), ("t-1", slow), ("t-2", fast), ("t-3", fast)):
        start(gate, sched, key, ws)
    assert not sched.idle_task_count
    queue_all(gate, sched, [f"t-{i}" for i in range(4, 10)])
    assert gate.released is None


def test_a_worker_with_nothing_running_is_taken_out_and_offered_again() -> None:
    gate, policy, sched, fast, slow = make()
    full(gate, sched, fast, slow)
    slow_node = gate.speeds.nodes[slow.address]
    fast_node = gate.speeds.nodes[fast.address]
    policy.refuse.add(slow_node)
    end(gate, sched, "t-0")
    end(gate, sched, "t-1")  # the slow worker is empty now, and the only one free
    assert policy.asked[-1] == slow_node
    assert slow not in sched.idle_task_count  # dask will not fill it from its queue
    assert gate.refused == {slow.address}
    assert gate.released is None
    # a task ends on the fast worker: the slow one is offered again (refused again: it
    # stays out), then the fast one, the least busy after it, gets the policy's task
    del policy.asked[:]
    end(gate, sched, "t-2")
    assert policy.asked == [slow_node, fast_node]  # the least busy first (0/2 < 1/2)
    assert slow not in sched.idle_task_count
    released = gate.released
    assert released is not None
    start(gate, sched, released, fast)  # dask gives the promoted task to the fast worker
    # accepted at the next offer: back among the free slots, asked first (the least busy)
    policy.refuse.clear()
    del policy.asked[:]
    end(gate, sched, "t-3")
    assert slow in sched.idle_task_count
    assert gate.refused == set()
    # every free slot is asked about, in dask's order: first the slow worker (0 of 2
    # busy), then both at 1 of 2 (a tie: dask's set order); a task promoted for each
    assert policy.asked[0] == slow_node
    assert sorted(policy.asked) == sorted([slow_node, slow_node, fast_node])
    assert len(gate.promoted) == 3


def test_the_policy_is_asked_about_the_worker_dask_fills_next() -> None:
    """Not the worker the task ended on: dask gives the head of its queue to the least
    busy worker with a free slot."""
    gate, policy, sched, fast, slow = make()
    full(gate, sched, fast, slow)
    slow_node = gate.speeds.nodes[slow.address]
    policy.refuse.add(slow_node)
    end(gate, sched, "t-0")
    end(gate, sched, "t-1")  # the slow worker is empty, and refused
    policy.refuse.clear()
    del policy.asked[:]
    end(gate, sched, "t-2")  # ends on the fast worker (1 of 2 busy); the slow one: 0 of 2
    assert policy.asked[0] == slow_node
    assert policy.asked.count(slow_node) == 2  # both its free slots, then the fast one's
    assert len(gate.promoted) == 3


def test_refused_workers_come_back_when_nothing_is_held() -> None:
    gate, policy, sched, fast, slow = make()
    full(gate, sched, fast, slow)
    policy.refuse.add(gate.speeds.nodes[slow.address])
    end(gate, sched, "t-0")
    assert slow not in sched.idle_task_count
    for i in range(4, 10):  # dask runs every held task elsewhere
        key = f"t-{i}"
        ts = sched.tasks[key]
        ts.state = "memory"
        gate.transition(key, "queued", "released")
    assert not gate.held
    assert slow in sched.idle_task_count and gate.refused == set()


def test_refusing_every_worker_with_nothing_running_gives_them_back() -> None:
    """Liveness: with nothing running anywhere, no task end would offer a refused
    worker again; dask gets them back (and fills them from its queue)."""
    gate, policy, sched, fast, slow = make()
    full(gate, sched, fast, slow)
    policy.refuse.update(gate.speeds.nodes.values())
    for key in ("t-0", "t-1", "t-2"):
        end(gate, sched, key)  # t-3 still runs: refused workers stay out
    assert not sched.idle_task_count and gate.refused == {slow.address, fast.address}
    end(gate, sched, "t-3")  # nothing runs now, and the policy refuses both
    assert slow in sched.idle_task_count and fast in sched.idle_task_count
    assert gate.refused == set()


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


# -- live: a LocalCluster with dask's validation on ------------------------------------


class RefuseOne(NodeAware):
    """Node-aware that leaves one node idle while anything else runs (as it does a
    worker measured slow when nothing would end there in time)."""

    name = "refuse-one-test"
    refuse: int | None = None  # the node index, set by the test

    def pop(self, node: Any, now: float) -> Any:
        if node.index == type(self).refuse and self._run_cores:
            return None
        return super().pop(node, now)


def _nap(i: int) -> str:
    import time

    from distributed import get_worker

    time.sleep(0.02)
    return str(get_worker().name)


# the bound holds while "fast" always runs something: under -n, no other test beside it
@pytest.mark.alone
def test_live_a_refused_worker_gets_no_queued_task_while_others_run() -> None:
    """dask's validation on; 2 workers x 2 threads, 40 queued tasks. The policy refuses
    worker "slow" whenever a task runs elsewhere: it runs only what dask sent it
    straight from the graph (before anything was queued, ceil(1.1 x 2) = 3 at most),
    never a queued task. Before the gate offered dask's next worker, an emptied refused
    worker was filled from dask's queue (held order) every time it emptied."""
    import dask
    from conftest import plugin_cluster
    from distributed import Client

    from daskjobs.plugin import JobsPlugin
    from daskjobs.policies import register

    register("refuse-one-test", RefuseOne, replace=True)
    plugin = JobsPlugin(policy="refuse-one-test")
    with (
        dask.config.set({"distributed.scheduler.validate": True}),
        plugin_cluster(plugin, n_workers=0) as cluster,
    ):
        from distributed import Worker

        with Client(cluster) as client:
            for name in ("fast", "slow"):  # two named workers
                cluster.worker_spec[name] = {"cls": Worker, "options": {"nthreads": 2}}
            cluster.scale(2)
            client.wait_for_workers(2)
            slow = next(
                a for a, w in client.scheduler_info()["workers"].items() if w["name"] == "slow"
            )
            RefuseOne.refuse = plugin.speeds.node(slow)
            parts = []
            for i in range(40):
                with dask.annotate(estimate=0.02):
                    parts.append(dask.delayed(_nap)(i, dask_key_name=f"nap-{i:03d}"))
            names = client.compute(parts, sync=True)
    assert len(names) == 40
    assert names.count("slow") <= 3, names
    assert names.count("fast") >= 37
    assert plugin.gate is not None and plugin.gate.kept_idle >= 1


def test_refused_workers_are_offered_again_at_most_every_interval() -> None:
    """With many refused workers, asking each at every task end would cost O(refused)
    per task: the gate asks them again at most every ``reoffer_interval``."""
    gate, policy, sched, fast, slow = make()
    gate.reoffer_interval = 3600.0
    full(gate, sched, fast, slow)
    slow_node = gate.speeds.nodes[slow.address]
    policy.refuse.add(slow_node)
    end(gate, sched, "t-0")
    end(gate, sched, "t-1")  # refused (the first offer after the interval started)
    assert gate.refused == {slow.address}
    del policy.asked[:]
    end(gate, sched, "t-2")  # within the interval: not asked again, stays out
    assert slow_node not in policy.asked
    assert slow not in sched.idle_task_count
    gate._reoffered -= 3600.0  # the interval has passed
    start(gate, sched, gate.released, fast)
    del policy.asked[:]
    end(gate, sched, "t-3")
    assert policy.asked[0] == slow_node


def test_a_slot_freed_by_a_task_the_policy_does_not_rank_is_offered() -> None:
    """A speculative copy (or another client's task) ending frees a slot dask fills next
    from its queue: the policy is asked about it, and a refused worker leaves the set."""
    gate, policy, sched, fast, slow = make()
    full(gate, sched, fast, slow)
    slow.nthreads = 3  # its third thread runs the copy
    copy = TS("copy-of-t-9", state="processing", processing_on=slow)
    sched.tasks[copy.key] = copy
    slow.processing.add(copy)
    sched.check_idle_saturated(slow)
    policy.refuse.add(gate.speeds.nodes[slow.address])
    del policy.asked[:]
    slow.processing.discard(copy)
    copy.state, copy.processing_on = "released", None
    sched.check_idle_saturated(slow)
    gate.transition(copy.key, "processing", "released")  # not one of the policy's tasks
    assert policy.asked == [gate.speeds.nodes[slow.address]]
    assert slow not in sched.idle_task_count


def test_a_refused_worker_leaves_even_when_a_promoted_task_would_have_gone_there() -> None:
    """A task promoted for one slot is still waiting when another worker's task ends (a
    copy's win releases its primary on a slow worker in the same stimulus): that worker,
    refused, leaves dask's free slots; the promoted task goes to another free slot."""
    gate, policy, sched, fast, slow = make()
    full(gate, sched, fast, slow)
    end(gate, sched, "t-2")  # the fast worker: a task promoted for its slot, not taken yet
    assert len(gate.promoted) == 1
    policy.refuse.add(gate.speeds.nodes[slow.address])
    end(gate, sched, "t-0")  # the slow worker (1 of 2 busy), in the same stimulus
    assert slow not in sched.idle_task_count
    assert fast in sched.idle_task_count
    # the fast slot was asked again: its new choice waits behind the earlier one
    assert len(gate.promoted) == 2
