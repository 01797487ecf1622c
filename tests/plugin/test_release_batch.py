"""The release gate hands a burst of queued tasks to the policy as one batch.

A graph's tasks enter dask's queue in one burst; the gate pushes them with one
``push_many`` (the simulator's call for a batch), before the policy is next asked
or once the scheduler is done with the stimulus. Order and counts only, no timing.
"""

from __future__ import annotations

from typing import Any

import dask
from conftest import plugin_cluster
from distributed import Client, Event
from waiting import until

from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.client import status


def hold(i: int, name: str) -> int:
    """Every task waits for the event: the first holds the only thread, the rest queue."""
    Event(name).wait(30)
    return i


def spy(dask_scheduler: Any) -> None:
    """Count the popper's pushes, single and batched."""
    popper = dask_scheduler.plugins["daskjobs"].ranker.popper
    calls: list[tuple[str, int]] = []
    push, push_many = popper.push, popper.push_many
    inside = []  # a default push_many pushes one by one: not the gate's calls

    def one(task: Any) -> None:
        if not inside:
            calls.append(("push", 1))
        push(task)

    def many(tasks: Any) -> None:
        calls.append(("push_many", len(tasks)))
        inside.append(True)
        try:
            push_many(tasks)
        finally:
            inside.pop()

    popper.push, popper.push_many = one, many
    dask_scheduler._test_push_calls = calls


def calls_of(dask_scheduler: Any) -> list[tuple[str, int]]:
    return list(dask_scheduler._test_push_calls)


def graph(n: int, event: str) -> list[Any]:
    parts = []
    for i in range(n):
        with dask.annotate(estimate=0.01 * (i + 1), team="a" if i % 2 else "b"):
            parts.append(dask.delayed(hold)(i, event, dask_key_name=f"h-{i}"))
    return parts


def run_burst(policy: str) -> tuple[list[tuple[str, int]], dict[str, Any], list[int]]:
    config = {"distributed.scheduler.worker-saturation": 1.0}
    with (
        dask.config.set(config),
        plugin_cluster(JobsPlugin(policy=policy)) as cl,
        Client(cl) as c,
    ):
        c.run_on_scheduler(spy)
        event = Event("release-batch-hold", client=c)
        futs = c.compute(graph(20, "release-batch-hold"))
        sched = cl.scheduler
        until(lambda: len(sched.queued) == 19, "the other 19 tasks never queued")
        # the burst is handed over once the scheduler is done with the graph
        until(lambda: calls_of(sched), "the queued tasks never reached the policy")
        before = calls_of(sched)
        st = status(c)
        event.set()
        results = c.gather(futs)
        return before, st, results


def test_a_graph_reaches_node_aware_as_one_batch() -> None:
    # the graph arrives with the thread free: its 20 root tasks reach the policy as one
    # batch at once (the first wave: pop chooses the one dask runs), the other 19 queue
    before, _, results = run_burst("node-aware")
    assert before == [("push_many", 20)]
    assert results == list(range(20))


def test_fair_share_counts_every_queued_task_before_any_release() -> None:
    before, st, results = run_burst("fair-share")
    assert before == [("push_many", 20)]
    queued = {row["team"]: row["queued"] for row in st["teams"]}
    assert sum(queued.values()) == 19
    assert results == list(range(20))


def test_off_an_event_loop_the_batch_waits_for_the_next_pop() -> None:
    """With no event loop to defer the flush to, the queued tasks reach the policy,
    as one batch, when it is next asked."""
    from daskjobs.plugin.audit import Audit
    from daskjobs.plugin.release import ReleaseGate

    pushed: list[list[str]] = []

    class Popper:
        def push_many(self, tasks: Any) -> None:
            pushed.append([t.tid for t in tasks])

        def pop(self, node: Any, now: float) -> None:
            return None

    class Task:
        def __init__(self, tid: str) -> None:
            self.tid = tid

    gate = ReleaseGate(Popper(), {}, None, Audit(10))  # type: ignore[arg-type]
    gate._schedule_flush()  # no running loop here: nothing deferred
    gate.pending = [Task("x"), Task("y")]  # type: ignore[list-item]
    gate.held = {"x", "y"}
    assert pushed == []
    gate._release()
    assert pushed == [["x", "y"]]
    assert gate.pending == []
