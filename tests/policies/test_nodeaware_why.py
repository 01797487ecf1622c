"""Node-aware says why a task waits by the rules its ``pop`` applies to each kind of worker
(``NodeAware.why_waiting``): the task a nominal worker's ``pop`` returns is told none queued
is longer, the one a slow worker's returns that a slow worker may take it, and a task a slow
worker leaves (its slot idle) that it would end there after the projected end of the run."""

from __future__ import annotations

import math

from daskjobs.policies import NodeAware
from daskjobs.sim.model import Attempt, Task


class _Node:
    cores = 1
    free = 1

    def __init__(self, index: int) -> None:
        self.index = index


def _policy(slow: float) -> NodeAware:
    """Node 0 measured nominal, node 1 measured ``slow`` times slow; a 10 s task runs on 0."""
    na = NodeAware()
    for node, speed in ((0, 1.0), (1, slow)):
        na.add_node(node, 1)
        na.relearn(node, (math.log(speed) * (3 + na.prior), 3))  # 3 samples: measured
    assert na.measured(0) and na.measured(1) and na.speed(1) == slow
    na.started(Attempt(0, Task("running", 10.0), 0, (0,), 0.0, False), 0.0)
    return na


def test_each_kind_of_worker_is_named_with_what_its_pop_does() -> None:
    na = _policy(4.0)
    long, middle, short = Task("long", 8.0), Task("middle", 2.0), Task("short", 0.5)
    na.push_many([long, middle, short])
    why = {t.tid: na.why_waiting(t, 0.0) or "" for t in (long, middle, short)}
    assert na.pop(_Node(1), 0.0) is short  # the slow worker: what ends there in time
    assert na.pop(_Node(0), 0.0) is long  # the nominal worker: the longest
    assert "none queued is longer" in why["long"], why
    assert "about 1 queued task(s) are longer" in why["middle"], why
    assert "may take it" in why["short"], why
    assert "leave it: it would take 32 s there" in why["long"], why
    assert "only when no queued task ends there well before" in why["middle"], why


def test_a_task_a_slow_worker_leaves_its_slot_idle_for_is_told_why() -> None:
    na = _policy(4.0)
    long = Task("long", 8.0)
    na.push(long)
    why = na.why_waiting(long, 0.0) or ""
    assert na.pop(_Node(1), 0.0) is None  # the slow worker's slot stays idle
    assert "1 worker(s) measured slow (from 4x) leave it" in why, why
    assert "end after the projected end of the run" in why, why
    assert na.pop(_Node(0), 0.0) is long


def test_workers_not_measured_yet_are_named() -> None:
    na = NodeAware()
    assert na.why_waiting(Task("t", 1.0), 0.0) == "node-aware knows no worker yet"
    na.add_node(0, 1)
    na.push(Task("t", 1.0))
    assert "1 worker(s) not measured yet take short tasks" in (
        na.why_waiting(Task("t", 1.0), 0.0) or ""
    )
