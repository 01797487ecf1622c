"""What one finished attempt may teach NodeAware about its node's speed: nothing from a
ratio of run time to estimate that is zero, infinite or NaN, and at most a 1000x move
of the log-mean (with the default prior of two nominal samples: 10x) from one sample."""

from __future__ import annotations

import math

import pytest

from daskjobs.policies import NodeAware
from daskjobs.sim.model import Attempt, Task


def _end(p: NodeAware, estimate: float, elapsed: float) -> bool:
    t = Task("t", 1.0, estimate)
    p.push(t)
    assert p.pop(_Node(), 0.0) is t
    a = Attempt(0, t, 0, (0,), 0.0, False)
    p.started(a, 0.0)
    a.end, a.outcome = elapsed, "done"
    return p.ended(a, elapsed)


class _Node:
    index, cores, free, core = 0, 4, 4, 0


@pytest.mark.parametrize("elapsed", [0.0, math.inf, math.nan])
def test_a_ratio_of_zero_infinity_or_nan_teaches_nothing(elapsed: float) -> None:
    p = NodeAware()
    p.add_node(0, 4)
    assert _end(p, 1.0, elapsed) is False
    assert p.samples(0) == 0
    assert p.speed(0) == 1.0
    assert p.capacity() == 4.0
    assert p.horizon(0.0) == 0.0  # the attempt's books closed all the same


def test_one_sample_moves_the_belief_by_at_most_the_clamp() -> None:
    p = NodeAware()
    p.add_node(0, 4)
    assert _end(p, 1e-9, 1.0) is True  # a ratio of 1e9, clamped to 1000: announced
    assert p.samples(0) == 1
    assert p.speed(0) == pytest.approx(1000.0 ** (1 / 3))  # log 1000 over 1 + prior 2
    assert p.capacity() == pytest.approx(4 / 10.0)
