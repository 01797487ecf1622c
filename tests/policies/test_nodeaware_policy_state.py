"""NodeAware keeps what ``started`` read of an attempt for ``ended``: on an attempt view
that has the optional ``policy_state`` field (AttemptView; the simulator's and the plugin's
attempts, any plain object) on the view, on a view without room for it in a dict. Both give the
same horizon, capacity and speed beliefs, bit for bit, and an attempt's record closes
once."""

from __future__ import annotations

import math

import pytest

from daskjobs.policies import NodeAware
from daskjobs.sim.model import Attempt, Task


class _View:
    """An attempt view with no room for new attributes (as a driver's own may be); it
    hashes by identity, as attempt views do."""

    __slots__ = ("backup", "end", "node", "outcome", "start", "task")

    def __init__(self, task: Task, node: int, start: float) -> None:
        self.task, self.node, self.start = task, node, start
        self.end, self.outcome, self.backup = math.nan, None, False


def _policy() -> NodeAware:
    p = NodeAware()
    for k in range(3):
        p.add_node(k, 4)
    return p


def _runs() -> list[tuple[Task, int, float, float]]:
    """(task, node, start, end): node 2 runs everything 3x slower than estimated."""
    out = []
    for i in range(24):
        est = 0.5 + (i % 5) * 0.25
        node = i % 3
        start = i * 0.1
        out.append(
            (Task(f"t{i}", est, est), node, start, start + est * (3.0 if node == 2 else 1.0))
        )
    return out


def _state(p: NodeAware, now: float) -> tuple[float, float, list[float]]:
    return p.horizon(now), p.capacity(), [p.speed(k) for k in range(3)]


def _drive(p: NodeAware, make: object) -> tuple[float, float, list[float]]:
    runs = _runs()
    for t, _, _, _ in runs:
        p.push(t)
    attempts = []
    for aid, (t, node, start, end) in enumerate(runs):
        a = make(aid, t, node, start)  # type: ignore[operator]
        p.started(a, start)
        attempts.append((a, end))
    for a, end in sorted(attempts, key=lambda x: x[1]):
        a.end, a.outcome = end, "done"
        p.ended(a, end)
    return _state(p, 1.0)


def test_state_on_the_attempt_and_in_the_dict_give_the_same_beliefs_bit_for_bit() -> None:
    sim = _policy()
    got_sim = _drive(
        sim, lambda aid, t, node, start: Attempt(aid, t, node, (node * 4,), start, False)
    )
    view = _policy()
    got_view = _drive(view, lambda aid, t, node, start: _View(t, node, start))
    assert got_sim == got_view
    assert got_sim[2][2] > 1.5 > got_sim[2][0]  # node 2 learned slow, node 0 not
    assert not sim._run  # the simulator's attempts kept their records themselves
    assert not view._run  # every view's entry closed


@pytest.mark.parametrize("kind", ["sim", "view"])
def test_an_attempt_ended_twice_closes_its_record_once(kind: str) -> None:
    p = _policy()
    t = Task("long", 10.0, 10.0)
    u = Task("other", 4.0, 4.0)
    p.push(t)
    p.push(u)
    if kind == "sim":
        a: object = Attempt(0, t, 0, (0,), 0.0, False)
        b: object = Attempt(1, u, 1, (4,), 0.0, False)
    else:
        a, b = _View(t, 0, 0.0), _View(u, 1, 0.0)
    p.started(a, 0.0)  # type: ignore[arg-type]
    p.started(b, 0.0)  # type: ignore[arg-type]
    # the simulator's attempts carry their records; a view without room for them goes in the dict
    assert set(p._run) == ({a, b} if kind == "view" else set())
    before = p.horizon(1.0)
    p.ended(a, 1.0)  # type: ignore[arg-type]  # killed early: no learning, record closed
    once = p.horizon(1.0)
    p.ended(a, 1.0)  # type: ignore[arg-type]
    assert p.horizon(1.0) == once
    assert once < before  # the long attempt's expected end left the sums


class _OpenView:
    """A plain class: takes any attribute, so it takes the optional ``policy_state`` field
    (AttemptView.policy_state) when the policy sets it."""

    def __init__(self, task: Task, node: int, start: float) -> None:
        self.task, self.node, self.start = task, node, start
        self.end, self.outcome, self.backup = math.nan, None, False


def test_a_view_that_takes_the_policy_state_field_carries_it_and_no_dict_entry() -> None:
    p = _policy()
    t = Task("t", 2.0, 2.0)
    p.push(t)
    a = _OpenView(t, 0, 0.0)
    p.started(a, 0.0)  # type: ignore[arg-type]
    assert a.policy_state is not None  # type: ignore[attr-defined]
    assert not p._run
    a.end, a.outcome = 2.0, "done"
    p.ended(a, 2.0)  # type: ignore[arg-type]
    assert a.policy_state is None  # type: ignore[attr-defined]  # closed once
    assert not p._run
    assert p.samples(0) == 1
