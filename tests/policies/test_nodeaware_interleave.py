"""NodeAware's ``interleave``: short tasks spread through the longest-first order.

Longest-first leaves the shortest tasks for the end of a run, when the scheduler must start
tasks fastest; a scheduler that starts a bounded number of tasks a second then leaves threads
idle there (docs/benchmarks.md, "the end of a longest-first run"). With ``interleave=f`` every
``1/f``-th task a node measured nominal takes is the shortest queued one, so the shortest
``f`` of the tasks run alongside the long ones instead of after them.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from policyattempt import Attempt as _Attempt

from daskjobs.policies import NodeAware, Speculation
from daskjobs.sim import Cluster, Task, simulate, workloads


def _measured_pops(policy: NodeAware, k: int) -> list[float]:
    """The estimates of the first ``k`` tasks ``policy`` gives a node measured nominal, out
    of 100 queued tasks of 1, 2, ..., 100 s."""
    node = SimpleNamespace(index=0, cores=4, free=4)
    policy.add_node(0, 4)
    for j in range(policy.min_samples):  # attempts that ran as estimated: measured, nominal
        a = _Attempt(Task(f"m{j}", 1.0), 0, 0.0, 1.0, "done")
        policy.started(a, 0.0)  # type: ignore[arg-type]
        policy.ended(a, 1.0)  # type: ignore[arg-type]
    assert policy.measured(0) and policy.speed(0) < policy.slow_threshold
    policy.push_many([Task(i, float(i + 1)) for i in range(100)])
    return [policy.pop(node, 1.0).estimate for _ in range(k)]  # type: ignore[arg-type,union-attr]


def test_interleave_takes_every_nth_task_from_the_short_end() -> None:
    assert _measured_pops(NodeAware(), 8) == [100, 99, 98, 97, 96, 95, 94, 93]
    assert _measured_pops(NodeAware(interleave=0.25), 8) == [100, 99, 98, 1, 97, 96, 95, 2]
    assert _measured_pops(NodeAware(interleave=0.5), 6) == [100, 1, 99, 2, 98, 3]


@pytest.mark.parametrize("bad", [-0.1, 0.6, 1.0, float("nan"), "0.25", True])
def test_an_interleave_out_of_range_is_named(bad: object) -> None:
    with pytest.raises(ValueError, match="interleave must be in"):
        NodeAware(interleave=bad)  # type: ignore[arg-type]


def test_interleave_zero_is_the_default_schedule_and_any_setting_runs_everything() -> None:
    w = workloads.chapter(3, n=2000, n_long=4, nodes=8, cores_per_node=4)
    cluster = Cluster(8, 4, slow={0: 4.0})
    spec = Speculation()

    def trace(policy: NodeAware) -> list[tuple[object, ...]]:
        s = simulate(w.tasks, cluster, policy, spec=spec, seed=1)
        assert {a.task.tid for a in s.attempts if a.outcome == "done"} == {
            t.tid for t in w.tasks
        }  # every task ran
        return [(a.task.tid, a.node, a.start, a.end, a.outcome) for a in s.attempts]

    assert trace(NodeAware(interleave=0.0)) == trace(NodeAware())
    # the shortest quarter starts alongside the long tasks, not after them
    s = simulate(w.tasks, cluster, NodeAware(interleave=0.25), spec=spec, seed=1)
    lpt = simulate(w.tasks, cluster, NodeAware(), spec=spec, seed=1)
    shortest = sorted(w.tasks, key=lambda t: t.estimate)[: len(w.tasks) // 10]
    mean_start = sum(s.record(t.tid).start for t in shortest) / len(shortest)
    mean_start_lpt = sum(lpt.record(t.tid).start for t in shortest) / len(shortest)
    assert mean_start < 0.5 * mean_start_lpt
