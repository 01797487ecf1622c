"""Who pays for a shared stage: a task two teams' graphs want is split equally among them
while it runs (docs/how-to/load-the-plugin.md, "Fair share and quotas"), in the simulator and
live."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from daskjobs.policies import FairShare
from daskjobs.sim import Cluster, Task, simulate


def test_a_shared_task_is_booked_half_to_each_team_in_the_simulator():
    # one node of 2 cores: the shared feature stage (10 s) and a's own task (10 s) run
    # first, then b's own task (10 s): a pays 10 + 5, b 5 + 10
    tasks = [
        Task("feature", 10.0, team="a", teams=("a", "b")),
        Task("train-a", 10.0, team="a", deps=("feature",)),
        Task("train-b", 10.0, team="b", deps=("feature",)),
        Task("solo-a", 10.0, team="a"),
    ]
    policy = FairShare({"a": 1, "b": 1})
    simulate(tasks, Cluster(1, 2), policy)
    assert policy.booked("a") == pytest.approx(25.0)  # solo 10 + feature 5 + train 10
    assert policy.booked("b") == pytest.approx(15.0)  # feature 5 + train 10
    assert policy.booked("a") + policy.booked("b") == pytest.approx(40.0)  # every core-second


def test_the_split_counts_in_usage_while_the_shared_task_runs():
    @dataclass
    class T:
        tid: str
        team: str
        teams: tuple[str, ...] = ()
        estimate: float = 1.0
        cores: int = 2
        submit: float = 0.0
        deps: tuple[str, ...] = field(default_factory=tuple)

    @dataclass(eq=False)
    class A:
        task: T
        node: int = 0
        start: float = 0.0
        end: float = float("nan")
        outcome: str | None = None
        backup: bool = False

    policy = FairShare({"a": 1, "b": 1, "c": 1})
    shared = A(T("feature", "a", ("a", "b")))
    policy.started(shared, 0.0)
    assert (policy.running("a"), policy.running("b"), policy.running("c")) == (1.0, 1.0, 0.0)
    # c's graph comes to want it at t=4: from then on each of the three pays a third
    policy.reshare(shared, ("a", "b", "c"), 4.0)
    assert policy.running("c") == pytest.approx(2 / 3)
    policy.ended(shared, 10.0)
    assert [policy.running(t) for t in "abc"] == [0.0, 0.0, 0.0]
    assert policy.booked("a") == pytest.approx(4.0 + 4.0)  # 2 cores / 2 for 4 s, / 3 for 6 s
    assert policy.booked("b") == pytest.approx(8.0)
    assert policy.booked("c") == pytest.approx(4.0)
    # a task wanted by one team alone is its own team's, as before
    own = A(T("own", "b"))
    policy.started(own, 10.0)
    policy.ended(own, 11.0)
    assert policy.booked("b") == pytest.approx(10.0)


def test_a_shared_task_must_name_its_own_team_among_its_teams():
    with pytest.raises(ValueError, match=r"must include its own team 'a'"):
        Task("x", 1.0, team="a", teams=("b", "c"))


# -- live: two teams' graphs share one dask task ------------------------------------------


def _sleep(seconds, *inputs):
    import time

    time.sleep(seconds)
    return seconds


def _graphs(feature_seconds):
    import dask

    feature = dask.delayed(_sleep, pure=True)(feature_seconds, dask_key_name="feature")
    with dask.annotate(team="a"):
        a = dask.delayed(_sleep)(0.0, feature, dask_key_name="train-a")
    with dask.annotate(team="b"):
        b = dask.delayed(_sleep)(0.0, feature, dask_key_name="train-b")
    return feature, a, b


def _arrived(explain, c, key):
    """Wait until the scheduler knows ``key`` (a graph is sent asynchronously)."""
    import time

    deadline = time.time() + 10
    while explain(c, key)["state"] == "unknown" and time.time() < deadline:
        time.sleep(0.005)


def _booked(st):
    return {row["team"]: row["booked"] for row in st["teams"]}


def _plugin():
    from daskjobs.plugin import JobsPlugin

    return JobsPlugin(
        policy="fair-share", teams={"targets": {"a": 1, "b": 1, "c": 1}, "half-life": None}
    )


def test_live_a_shared_stage_wanted_before_it_starts_is_split_in_half():
    import time

    import dask
    from conftest import plugin_cluster
    from distributed import Client

    from daskjobs.plugin.client import explain, status

    # saturation 1.0: the one thread's worker holds one task, the others wait in dask's queue
    config = {"distributed.scheduler.worker-saturation": 1.0}
    with dask.config.set(config), plugin_cluster(_plugin()) as cl, Client(cl) as c:
        with dask.annotate(team="c"):  # holds the one thread: both graphs arrive first
            blocker = c.submit(_sleep, 0.5, key="blocker")
        deadline = time.time() + 10
        while explain(c, "blocker")["state"] != "processing" and time.time() < deadline:
            time.sleep(0.01)
        _, a, b = _graphs(0.8)
        with dask.annotate(team="a"):
            fa = c.compute(a, optimize_graph=False)
        fb = c.compute(b, optimize_graph=False)
        _arrived(explain, c, "train-b")
        assert explain(c, "blocker")["state"] == "processing"  # feature has not started
        assert explain(c, "feature")["paid_by"] == {"a": 0.5, "b": 0.5}
        c.gather([fa, fb, blocker])
        booked = _booked(status(c))
    # the rule: the feature stage's 0.8 s split equally; the trains take next to nothing
    assert booked["a"] == pytest.approx(booked["b"], abs=0.15), booked
    assert 0.35 < booked["a"] < 0.8, booked
    assert booked["c"] >= 0.5, booked


def test_live_a_team_that_joins_a_running_shared_stage_pays_from_then_on():
    import time

    from conftest import plugin_cluster
    from distributed import Client

    from daskjobs.plugin.client import explain, status

    with plugin_cluster(_plugin()) as cl, Client(cl) as c:
        _, a, b = _graphs(1.0)
        import dask

        with dask.annotate(team="a"):
            fa = c.compute(a, optimize_graph=False)
        _arrived(explain, c, "feature")
        deadline = time.time() + 10
        while explain(c, "feature")["state"] != "processing" and time.time() < deadline:
            time.sleep(0.01)
        assert explain(c, "feature")["paid_by"] == {"a": 1.0}
        time.sleep(0.2)  # a alone pays for the first part of the run
        fb = c.compute(b, optimize_graph=False)
        _arrived(explain, c, "train-b")
        assert explain(c, "feature")["paid_by"] == {"a": 0.5, "b": 0.5}
        running = {row["team"]: row["running"] for row in status(c)["teams"]}
        if explain(c, "feature")["state"] == "processing":
            assert running["a"] == running["b"] == 0.5  # one slot, split: never more than 1
        c.gather([fa, fb])
        booked = _booked(status(c))
    # b pays half of the part of the run after it joined; a the rest
    assert booked["b"] > 0.1, booked
    assert booked["a"] > booked["b"] + 0.15, booked
    assert booked["a"] + booked["b"] == pytest.approx(1.0, abs=0.3), booked
