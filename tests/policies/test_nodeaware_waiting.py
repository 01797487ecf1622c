"""Work waiting on a worker ahead of a slot (dask's worker-saturation): the plugin's slot
says how much (``Slot.waiting``), and ``NodeAware`` counts it before giving a slot on a
node measured slow a task, so that a slow worker does not take, behind its own queue, a
task that would end after the projected end of the run (docs/how-to/write-a-policy.md)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from policyattempt import Attempt as _Attempt

from daskjobs.plugin.views import Slot
from daskjobs.policies import NodeAware
from daskjobs.sim import Task


def _policy() -> NodeAware:
    """Node 0 nominal, node 1 measured 4x slow, both with 4 cores; one task running on
    node 0 and estimates 1 .. 40 s queued."""
    policy = NodeAware()
    for node, speed in ((0, 1.0), (1, 4.0)):
        policy.add_node(node, 4)
        for j in range(policy.min_samples):
            a = _Attempt(Task(f"m{node}-{j}", 1.0), node, 0.0)
            policy.started(a, 0.0)  # type: ignore[arg-type]
            a.end, a.outcome = speed, "done"
            policy.ended(a, speed)  # type: ignore[arg-type]
    assert policy.speed(1) >= policy.slow_threshold > policy.speed(0)
    policy.push_many([Task(i, float(i + 1)) for i in range(40)])
    running = policy.pop(SimpleNamespace(index=0, cores=4, free=4), 5.0)
    assert running is not None
    policy.started(_Attempt(running, 0, 5.0), 5.0)  # type: ignore[arg-type]
    return policy


def _slow(waiting: float | None) -> SimpleNamespace:
    node = SimpleNamespace(index=1, cores=4, free=1)
    if waiting is not None:
        node.waiting = waiting
    return node


def test_a_slow_node_takes_a_shorter_task_behind_work_waiting_on_it() -> None:
    plain = _policy().pop(_slow(None), 5.0)
    assert plain is not None and _policy().pop(_slow(0.0), 5.0) == plain  # 0: as without
    behind = _policy().pop(_slow(40.0), 5.0)
    assert behind is not None and behind.estimate < plain.estimate


def test_a_slow_node_takes_nothing_that_would_end_past_the_run_behind_its_queue() -> None:
    policy = _policy()
    far = policy.horizon(5.0) * 4  # the queue ahead alone outlasts the run on 4 cores
    assert policy.pop(_slow(far), 5.0) is None
    assert len(policy) == 39  # nothing was taken from the queue
    assert policy.pop(_slow(0.0), 5.0) is not None


def test_a_nominal_node_ignores_waiting_work() -> None:
    behind = SimpleNamespace(index=0, cores=4, free=1, waiting=1e6)
    free = SimpleNamespace(index=0, cores=4, free=1)
    assert _policy().pop(behind, 5.0) == _policy().pop(free, 5.0) is not None


def _worker(keys: list[str], nthreads: int) -> SimpleNamespace:
    return SimpleNamespace(processing=[SimpleNamespace(key=k) for k in keys], nthreads=nthreads)


@pytest.mark.parametrize(
    ("keys", "nthreads", "taken", "expected"),
    [
        (["a", "b"], 2, 0, 0.0),  # every task has a thread: nothing waits
        (["a", "b", "c"], 2, 0, 1 * (1 + 2 + 6) / 3),  # one beyond, at the mean estimate
        (["a", "b"], 2, 1, 1 * (1 + 2) / 2),  # a task chosen in this walk counts too
        (["a", "b", "x"], 2, 0, 1 * (1 + 2) / 2),  # a task the plugin does not rank: no mean
        (["x", "y", "z"], 2, 0, 0.0),  # none ranked: nothing known
    ],
)
def test_a_slot_counts_the_work_beyond_its_workers_threads(
    keys: list[str], nthreads: int, taken: int, expected: float
) -> None:
    tasks = {k: SimpleNamespace(estimate=e, cores=1) for k, e in {"a": 1, "b": 2, "c": 6}.items()}
    slot = Slot(3, _worker(keys, nthreads), tasks, taken)  # type: ignore[arg-type]
    assert slot.index == 3 and slot.free == 1
    assert slot.waiting == pytest.approx(expected)


def test_a_slot_without_its_worker_has_nothing_waiting() -> None:
    assert Slot(0).waiting == 0.0
