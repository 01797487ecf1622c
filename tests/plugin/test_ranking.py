"""Ranking a graph (daskjobs/plugin/ranking.py) on stand-in task states: what a big graph's
ranking keeps per task, and that its fast paths give what the plain ones give (counts and
values, never times: speed is measured in benchmarks/bench_million.py)."""

from __future__ import annotations

import gc
from types import SimpleNamespace
from typing import Any

from dask._task_spec import Task, TaskRef

from daskjobs.config import settings
from daskjobs.plugin.audit import Audit
from daskjobs.plugin.estimates import predict_stage, predict_stage_seconds
from daskjobs.plugin.ranking import PAUSE_GC_FROM, Ranker


def work(x: int, g: int = 0) -> int:
    return x


def stand_ins(n: int) -> list[Any]:
    """A gate and ``n`` tasks ``work(x, g=gate)``, as dask holds them before ranking."""
    gate = SimpleNamespace(
        key="gate",
        priority=(0, 1, 0),
        annotations={},
        dependencies=set(),
        run_spec=Task("gate", work, 0),
        prefix=SimpleNamespace(name="gate"),
        resource_restrictions=None,
    )
    tasks = [gate]
    for i in range(n):
        tasks.append(
            SimpleNamespace(
                key=f"work-{i}",
                priority=(0, 1, i + 1),
                annotations={},
                dependencies=(gate,),
                run_spec=Task(f"work-{i}", work, i, g=TaskRef("gate")),
                prefix=SimpleNamespace(name="work"),
                resource_restrictions=None,
            )
        )
    return tasks


def test_views_of_tasks_reading_one_input_share_their_dependencies() -> None:
    ranker = Ranker(settings(), Audit(100))
    ranker.rank(stand_ins(500))
    deps = {id(v.deps) for k, v in ranker.tasks.items() if k != "gate"}
    assert len(ranker.tasks) == 501
    assert len(deps) == 1  # one tuple for 500 views
    assert ranker.tasks["work-7"].deps == ("gate",)
    assert ranker._deps is None  # the graph's table of tuples is dropped once it is ranked


def test_the_collector_is_back_on_after_a_big_graph_and_left_off_if_it_was() -> None:
    ranker = Ranker(settings(), Audit(100))
    ranker.rank(stand_ins(PAUSE_GC_FROM))
    assert gc.isenabled()
    assert ranker.ranked_tasks == PAUSE_GC_FROM + 1
    gc.disable()
    try:
        Ranker(settings(), Audit(100)).rank(stand_ins(PAUSE_GC_FROM))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_priors_seconds_are_the_estimates_seconds() -> None:
    ranker = Ranker(settings(), Audit(100))
    est = ranker.estimator
    params: list[Any] = [{"n": n} for n in (1, 2, 10, 1000, 10**7)] + [None, {"m": 3}]
    est.expect("s", frozenset({"n"}), params)
    fast = predict_stage_seconds(est, "s", params)
    slow = predict_stage(est, "s", params)
    assert all(type(s) is float for s in fast)
    assert fast == [e.seconds for e in slow]
    assert {e.source for e in slow} == {"prior"}
    assert predict_stage_seconds(est, "unknown", [None]) == predict_stage(est, "unknown", [None])
