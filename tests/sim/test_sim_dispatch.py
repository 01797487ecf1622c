"""The simulator's dispatch capacity: ``Cluster(dispatch_rate=...)``.

A live scheduler starts a bounded number of tasks a second; with many slots and short tasks
that bound, not the slots, sets the pace (docs/benchmarks.md, the end of a longest-first run).
Every attempt's start queues for one dispatcher and takes ``1 / dispatch_rate`` of it.
"""

from __future__ import annotations

import itertools
import math

import pytest

from daskjobs.policies import FIFO, LPT, NodeAware, Speculation
from daskjobs.sim import Cluster, Task, simulate, workloads


def test_starts_queue_for_the_dispatcher() -> None:
    tasks = [Task(f"t{i}", 1.0) for i in range(4)]
    s = simulate(tasks, Cluster(1, 4, dispatch_rate=10.0), FIFO())
    starts = sorted(s.record(t.tid).start for t in tasks)
    assert starts == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert [s.record(t.tid).end - s.record(t.tid).start for t in tasks] == pytest.approx([1.0] * 4)
    assert s.makespan == pytest.approx(1.3)  # first start 0.1, last end 1.4
    # a freed slot waits for the dispatcher too: 8 tasks on 4 slots
    tasks = [Task(f"u{i}", 1.0) for i in range(8)]
    s = simulate(tasks, Cluster(1, 4, dispatch_rate=10.0), FIFO())
    assert max(s.record(t.tid).end for t in tasks) == pytest.approx(2.5)  # 1.1+... +1.4 -> 2.5


def test_unlimited_dispatch_is_the_schedule_without_it() -> None:
    w = workloads.chapter(2, n=1500, n_long=4, nodes=6, cores_per_node=4)
    spec = Speculation()

    def trace(cluster: Cluster) -> list[tuple[object, ...]]:
        s = simulate(w.tasks, cluster, NodeAware(), spec=spec, seed=3)
        return [(a.task.tid, a.node, a.start, a.end, a.outcome) for a in s.attempts]

    assert trace(Cluster(6, 4, slow={0: 4.0}, dispatch_rate=0.0)) == trace(
        Cluster(6, 4, slow={0: 4.0})
    )


def test_every_attempt_copies_and_retries_included_waits_its_turn() -> None:
    w = workloads.chapter(5, n=600, n_long=4, nodes=4, cores_per_node=8)
    rate = 200.0
    cluster = Cluster(4, 8, slow={0: 4.0}, failure_rate=0.05, dispatch_rate=rate)
    s = simulate(w.tasks, cluster, NodeAware(), spec=Speculation(min_runtime=0.0), seed=1)
    assert s.backups_launched > 0 and len(s.attempts) > len(w.tasks)
    starts = sorted(a.start for a in s.attempts)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= 1 / rate - 1e-9
    assert s.makespan >= (len(s.attempts) - 1) / rate


def test_a_scarce_dispatcher_slows_many_short_tasks_on_many_slots() -> None:
    w = workloads.chapter(0, n=2000, n_long=4, median=0.1, sigma=0.76, nodes=8, cores_per_node=8)
    free = simulate(w.tasks, Cluster(8, 8), LPT()).makespan
    scarce = simulate(w.tasks, Cluster(8, 8, dispatch_rate=400.0), LPT()).makespan
    assert scarce > 1.05 * free
    assert scarce >= len(w.tasks) / 400.0 - 1.0 / 400.0


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "10"])
def test_a_bad_dispatch_rate_is_named(bad: object) -> None:
    with pytest.raises(ValueError, match="dispatch_rate must be >= 0"):
        Cluster(2, 2, dispatch_rate=bad)  # type: ignore[arg-type]
