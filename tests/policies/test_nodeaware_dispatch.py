"""NodeAware's ``dispatch_rate``: the tasks a scheduler cannot start fast enough, spread.

Longest-first leaves the shortest tasks for the end of a run. A task is *dispatch-bound* when
every core running tasks that short would ask the scheduler for more than ``dispatch_rate``
starts a second; at the end of a longest-first run those are all that is left, and cores idle
while the scheduler starts them (docs/benchmarks.md, "the end of a longest-first run"). With
``dispatch_rate=r`` a nominal node takes the shortest queued task while it is dispatch-bound
and the dispatch-bound attempts running ask for fewer starts a second than the queued ones
need to start by the projected end of the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from policyattempt import Attempt as _Attempt

from daskjobs.config import policy_settings, settings
from daskjobs.policies import NodeAware, Speculation, registry
from daskjobs.sim import Cluster, Task, simulate, workloads


def _measured(policy: NodeAware, cores: int = 4) -> SimpleNamespace:
    """Node 0 with ``cores`` cores, measured nominal (attempts that ran as estimated)."""
    policy.add_node(0, cores)
    for j in range(policy.min_samples):
        a = _Attempt(Task(f"m{j}", 1.0), 0, 0.0, 1.0, "done")
        policy.started(a, 0.0)
        policy.ended(a, 1.0)
    assert policy.measured(0) and policy.speed(0) < policy.slow_threshold
    return SimpleNamespace(index=0, cores=cores, free=cores)


def test_dispatch_bound_tasks_are_taken_while_they_fall_behind_and_not_after() -> None:
    # 4 cores at 1 start a second: a task shorter than 4 s is dispatch-bound (1, 2, 3 s)
    policy = NodeAware(dispatch_rate=1)
    node = _measured(policy)
    policy.push_many([Task(i, float(i + 1)) for i in range(100)])
    # nothing dispatch-bound runs and three are queued: the shortest goes now
    first = policy.pop(node, 1.0)
    assert first is not None and first.estimate == 1.0
    policy.started(_Attempt(first, 0, 1.0), 1.0)  # type: ignore[arg-type]
    # it asks for 1 start a second; the two queued need 2 over the ~1,260 s left: longest
    assert [policy.pop(node, 1.0).estimate for _ in range(3)] == [100, 99, 98]  # type: ignore[union-attr]


def test_a_shortest_task_that_is_not_dispatch_bound_waits_for_the_end() -> None:
    # 4 cores at 4 starts a second: only tasks under 1 s are dispatch-bound, and none is
    policy = NodeAware(dispatch_rate=4)
    node = _measured(policy)
    policy.push_many([Task(i, float(i + 1)) for i in range(10)])
    assert [policy.pop(node, 1.0).estimate for _ in range(4)] == [10, 9, 8, 7]  # type: ignore[union-attr]


def test_unmeasured_and_slow_nodes_keep_their_rules() -> None:
    # an unmeasured node measures itself with a short task either way
    a, b = NodeAware(), NodeAware(dispatch_rate=1)
    for p in (a, b):
        p.add_node(0, 4)
        p.push_many([Task(i, float(i + 1)) for i in range(100)])
    node = SimpleNamespace(index=0, cores=4, free=4)
    assert [a.pop(node, 0.0).tid for _ in range(5)] == [b.pop(node, 0.0).tid for _ in range(5)]  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "600", True, None])
def test_a_bad_dispatch_rate_is_named(bad: object) -> None:
    with pytest.raises(ValueError, match="dispatch_rate must be a finite number"):
        NodeAware(dispatch_rate=bad)  # type: ignore[arg-type]


def test_the_setting_reaches_the_policy_from_dask_config_and_is_described() -> None:
    s = settings(policy="node-aware", policy_options={"dispatch-rate": 600})
    made = registry.make(s.policy, **policy_settings(s))
    assert isinstance(made, NodeAware) and made.dispatch_rate == 600.0
    assert made.describe()["dispatch_rate"] == 600.0
    assert NodeAware().describe()["dispatch_rate"] == 0.0


def _grid_like(seed: int) -> workloads.Workload:
    """A sweep of the bench's shape: 1,600 tasks, median 0.1 s, the longest 30x."""
    return workloads.chapter(seed, n=1600, n_long=4, median=0.1, sigma=0.76, estimate_noise=0.3)


def test_zero_is_the_default_schedule() -> None:
    w = workloads.chapter(3, n=2000, n_long=4, nodes=8, cores_per_node=4)
    cluster = Cluster(8, 4, slow={0: 4.0})

    def trace(policy: NodeAware) -> list[tuple[object, ...]]:
        s = simulate(w.tasks, cluster, policy, spec=Speculation(), seed=1)
        return [(a.task.tid, a.node, a.start, a.end, a.outcome) for a in s.attempts]

    assert trace(NodeAware(dispatch_rate=0)) == trace(NodeAware())


@pytest.mark.parametrize("seed", [21, 24])
def test_a_scheduler_that_starts_500_tasks_a_second_ends_sooner(seed: int) -> None:
    # 8 nodes x 8 cores, one 4x slow; the scheduler starts at most 500 tasks a second
    w = _grid_like(seed)
    cluster = Cluster(8, 8, {0: 4.0}, dispatch_rate=500)
    spec = Speculation(late_factor=2.5, min_runtime=0.1, interval=0.05)
    lpt = simulate(w.tasks, cluster, NodeAware(), spec)
    spread = simulate(w.tasks, cluster, NodeAware(dispatch_rate=500), spec)
    assert {a.task.tid for a in spread.attempts if a.outcome == "done"} == {t.tid for t in w.tasks}
    assert spread.makespan < 0.97 * lpt.makespan
    # the dispatch-bound tasks (under 64 / 500 s) started earlier on average
    bound = [t.tid for t in w.tasks if t.estimate < 64 / 500]
    assert len(bound) > len(w.tasks) // 4

    def mean_start(s: object) -> float:
        return sum(s.record(t).start for t in bound) / len(bound)  # type: ignore[attr-defined]

    assert mean_start(spread) < 0.8 * mean_start(lpt)


def test_real_processes_pacing_with_a_worker_killed_keep_every_result(
    real_cluster: Callable[..., Any],
) -> None:
    """``dask scheduler`` with the plugin preloaded, node-aware pacing set from dask's config,
    speculation on, dask's validation on; a fast worker is SIGKILLed mid-sweep: every task's
    result arrives, the plugin logs no error, and no process log shows a problem."""
    import time

    import realtasks
    from realcluster import SPECULATION_CONFIG

    from daskjobs.plugin.client import status

    config = {
        "daskjobs": {
            **SPECULATION_CONFIG["daskjobs"],
            "policy-options": {"dispatch-rate": 40},  # 6 threads: under 0.15 s is paced
        }
    }
    rc = real_cluster(n_workers=3, nthreads=2, config=config, env={"DASKJOBS_TEST_SLOW": "w0=4"})
    graph = realtasks.nap_graph(240, seed=5, mu=-3.0, sigma=0.7, cap=0.4, prefix="paced")
    with rc.client() as c:
        c.wait_for_workers(3)
        assert c.run_on_scheduler(_policy_settings) == ("node-aware", 40.0)
        futures = c.compute(graph)
        deadline = time.time() + 60
        while time.time() < deadline and sum(f.done() for f in futures) < 60:
            time.sleep(0.02)
        assert sum(f.done() for f in futures) < 240  # killed mid-sweep
        rc.kill_worker("w2")
        assert c.gather(futures) == list(range(240))
        st = status(c)
        assert st["errors"] == {}, st["errors"]
    assert rc.problems() == []


def _policy_settings(dask_scheduler: object) -> tuple[str, float]:
    policy = dask_scheduler.plugins["daskjobs"].ranker.popper  # type: ignore[attr-defined]
    return policy.name, policy.dispatch_rate


def test_start_rate_is_tasks_over_first_start_to_last_end() -> None:
    from daskjobs.plugin.client import _rate

    assert _rate([(10.0, 10.5), (10.2, 11.0), (10.9, 12.0)]) == 3 / 2.0
    with pytest.raises(ValueError, match="too few tasks to time"):
        _rate([(5.0, 5.0), (5.0, 5.0)])
    with pytest.raises(ValueError, match="at least 2 tasks"):
        _rate([(1.0, 2.0)])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tasks": 1}, "tasks must be an integer >= 2"),
        ({"tasks": 10.0}, "tasks must be an integer >= 2"),
        ({"tasks": True}, "tasks must be an integer >= 2"),
        ({"seconds": -1}, "seconds must be a finite number >= 0"),
        ({"seconds": float("nan")}, "seconds must be a finite number >= 0"),
    ],
)
def test_start_rate_names_a_bad_argument(kwargs: dict[str, Any], match: str) -> None:
    import daskjobs

    with pytest.raises(ValueError, match=match):
        daskjobs.start_rate(object(), **kwargs)


@pytest.mark.slow
def test_start_rate_runs_its_tasks_on_a_cluster_with_the_plugin() -> None:
    from distributed import Client

    import daskjobs
    from daskjobs.plugin.client import status

    with (
        daskjobs.local_cluster(
            n_workers=2, threads_per_worker=2, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        rate = daskjobs.start_rate(client, tasks=200, seconds=0.001)
        assert math.isfinite(rate) and rate > 0
        # 200 tasks of at least 1 ms on 4 threads take at least 50 ms: at most 4,000 a second
        assert rate <= 4000
        assert status(client)["errors"] == {}


def test_the_start_rate_command_prints_the_rate_and_the_setting() -> None:
    from click.testing import CliRunner
    from distributed import LocalCluster

    from daskjobs.cli import main

    with LocalCluster(
        n_workers=2, threads_per_worker=2, processes=False, dashboard_address=":0"
    ) as cluster:
        args = ["start-rate", cluster.scheduler_address, "--tasks", "200", "--seconds", "0.001"]
        result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    first, second = result.output.splitlines()
    head, sep, _ = first.partition(" tasks started a second on 4 threads (200 tasks of 0.001 s")
    assert sep, first
    rate = float(head.replace(",", ""))
    assert 0 < rate <= 4000  # 4 threads, tasks of at least 1 ms
    assert second.startswith("node-aware: policy-options: {dispatch-rate: "), second
    setting = int(second.rsplit(" ", 1)[1].rstrip("}"))
    assert setting == math.floor(0.8 * rate)  # 0.8 of the rate as printed, rounded down


def test_the_start_rate_command_names_what_is_wrong() -> None:
    from click.testing import CliRunner
    from distributed import LocalCluster

    from daskjobs.cli import main

    bad = CliRunner().invoke(main, ["start-rate", "tcp://127.0.0.1:1", "--seconds", "nan"])
    assert bad.exit_code == 2 and "'--seconds'" in bad.stderr and "not a finite" in bad.stderr
    bad = CliRunner().invoke(main, ["start-rate", "tcp://127.0.0.1:1", "--tasks", "1"])
    assert bad.exit_code == 2 and "'--tasks'" in bad.stderr
    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster:
        empty = CliRunner().invoke(main, ["start-rate", cluster.scheduler_address])
    assert empty.exit_code == 1, empty.output
    assert "has no workers to run the tasks on" in empty.stderr
