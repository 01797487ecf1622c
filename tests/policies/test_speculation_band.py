"""Speculation judges lateness against a task's own predicted band (the optional view field
``band``): a task predicted long, or predicted by an unsure model, is not late for it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from daskjobs.plugin.views import LiveAttempt, LiveTask
from daskjobs.policies import Speculation
from daskjobs.policies.base import OPTIONAL_FIELDS, field
from daskjobs.policies.speculation import BAND_TOP


class Nominal:
    def speed(self, node: int) -> float:
        return 1.0

    def urgent(self, attempt: object, now: float) -> bool:
        return False

    def horizon(self, now: float) -> float:
        return math.inf


@dataclass(frozen=True)
class Node:
    index: int
    free: int = 1
    cores: int = 1
    copies: int = 0
    same_host: bool = False
    name: str = "n"


def task(estimate: float, band: tuple[float, float] | None) -> LiveTask:
    return LiveTask("t", estimate, 1, "a", 0.0, (), "model", "s", band=band)


def late(spec: Speculation, t: LiveTask, ran: float) -> bool:
    a = LiveAttempt(t, 0, 0.0)
    d = spec.decide(ran, Nominal(), judge=[a], candidates=[Node(1)], slots=10)
    return bool(d.late)


def test_band_is_an_optional_task_field_defaulting_to_none() -> None:
    assert OPTIONAL_FIELDS["task.band"] is None
    assert field(object(), "task.band") is None


def test_a_narrow_band_changes_nothing() -> None:
    spec = Speculation(late_factor=2.5)
    narrow = task(10.0, (7.0, 10.0 * BAND_TOP))
    assert spec.deadline(0.0, 10.0, 1.0, 10.0 * BAND_TOP) == pytest.approx(25.0)
    assert not late(spec, narrow, 24.9)
    assert late(spec, narrow, 25.0)


def test_a_wide_band_moves_the_deadline_out_in_proportion() -> None:
    spec = Speculation(late_factor=2.5)
    wide = task(10.0, (3.0, 40.0))  # an unsure model: its top is 4x the estimate
    deadline = 2.5 * 40.0 / BAND_TOP  # 68.1 s instead of 25 s
    assert spec.deadline(0.0, 10.0, 1.0, 40.0) == pytest.approx(deadline)
    assert not late(spec, wide, 25.0)  # would be late against the point estimate alone
    assert not late(spec, wide, deadline - 0.1)
    assert late(spec, wide, deadline)
    # the same task without a band (an annotation, the simulator) keeps the plain rule
    assert late(spec, task(10.0, None), 25.0)


def test_a_task_predicted_long_is_not_late_where_a_stage_median_would_say_so() -> None:
    spec = Speculation(late_factor=2.5)
    median = task(10.0, None)  # every task of the stage alike: the stage's median
    long = task(60.0, (45.0, 80.0))  # the model over its parameters: a long one
    assert late(spec, median, 59.0)  # judged late for being long
    assert not late(spec, long, 59.0)  # judged against its own prediction
    assert late(spec, long, 150.0)


def test_the_plugin_gives_its_views_the_band_the_estimator_predicted() -> None:
    from daskjobs.plugin import JobsPlugin

    p = JobsPlugin(policy="lpt", speculation={"enabled": True})
    for n in (1, 2, 4, 8, 1, 2, 4, 8):
        p.ranker.estimator.observe("job", {"n": n}, 0.5 * n)

    from types import SimpleNamespace

    ts = SimpleNamespace(
        key="job-1",
        annotations={"params": {"n": 8}},
        dependencies=(),
        resource_restrictions=None,
        priority=(0, 0, 0),
        prefix=SimpleNamespace(name="job"),
    )
    v = p.ranker.view(ts, 0.0)
    assert v.source == "model" and v.band is not None
    low, high = v.band
    assert low <= v.estimate <= high and v.estimate > 2.0
    assert v.samples == 8
