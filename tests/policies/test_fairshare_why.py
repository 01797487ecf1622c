"""Fair share says why a task waits by the rule it decides with (``FairShare.why_waiting``
beside ``pop``): the team it calls next is the team ``pop`` serves next, and the task it
says starts at the next free slot is the task ``pop`` returns, on random states; a quota
(on the next task of the team, whatever its cores), a team further below its share and a
lent slot are each named."""

from __future__ import annotations

import random

import pytest

from daskjobs.policies import FairShare
from daskjobs.sim.model import Attempt, Task


class _Node:
    index = 0
    cores = 1 << 30

    def __init__(self, free: int) -> None:
        self.free = free


def _start(fs: FairShare, task: Task, now: float) -> None:
    fs.started(Attempt(0, task, 0, (0,), now, False), now)


@pytest.mark.parametrize("seed", range(40))
def test_the_team_called_next_is_the_team_pop_serves(seed: int) -> None:
    rng = random.Random(seed)
    teams = ["a", "b", "c"][: rng.randint(2, 3)]
    quotas = {t: rng.randint(1, 3) for t in teams if rng.random() < 0.5}
    fs = FairShare({t: rng.choice([1.0, 2.0, 3.0]) for t in teams}, quotas=quotas)
    n = 0
    for t in teams:  # what each team holds now
        for _ in range(rng.randint(0, 3)):
            _start(fs, Task(f"run-{n}", 1.0, team=t, cores=rng.randint(1, 2)), 0.0)
            n += 1
    waiting = [Task(f"w-{i}", 1.0, team=rng.choice(teams)) for i in range(rng.randint(1, 8))]
    fs.push_many(waiting)
    now = 1.0
    heads = {}  # each team's first waiting task (FIFO within a team): the one pop weighs
    for w in waiting:
        heads.setdefault(w.team, w)
    reasons = {t: fs.why_waiting(w, now) for t, w in heads.items()}
    served = fs.pop(_Node(1 << 30), now)
    assert served is not None
    called = [t for t, why in reasons.items() if "is next by fair share" in why]
    assert called == [served.team], (reasons, served.team, quotas)
    for t, why in reasons.items():
        if t == served.team:
            continue
        if t in quotas and fs.running(t) + 1 > quotas[t]:
            assert f"its quota is {quotas[t]}" in why, why
            assert repr(served.team) in why, why
        else:
            assert why.startswith("waiting for fair share"), why
            assert f"team {served.team!r} is further below its share" in why, why


def test_a_team_at_its_quota_is_told_so_and_lent_the_slot_when_nobody_else_waits() -> None:
    fs = FairShare({"a": 1.0, "b": 1.0}, quotas={"a": 1})
    _start(fs, Task("a-run", 1.0, team="a"), 0.0)
    fs.push_many([Task("a-1", 1.0, team="a"), Task("b-1", 1.0, team="b")])
    a1 = Task("a-1", 1.0, team="a")
    why = fs.why_waiting(a1, 1.0)
    assert why is not None and why.startswith("team 'a' holds 1 core(s) and its quota is 1")
    assert "(now 'b')" in why
    assert fs.pop(_Node(4), 1.0).team == "b"  # type: ignore[union-attr]
    # b's queue is empty: a is lent the idle slot, and is told it is next
    why = fs.why_waiting(a1, 1.0)
    assert why is not None and why.startswith("team 'a' is next by fair share (lent an idle slot")
    assert fs.pop(_Node(4), 1.0).team == "a"  # type: ignore[union-attr]


def test_a_task_wider_than_its_teams_quota_left_is_held_by_the_quota() -> None:
    """Two cores asked with one of a quota of 2 held: the quota holds it, though fewer
    tasks than the quota are assigned (what explain derived before said fair share)."""
    fs = FairShare({"a": 1.0, "b": 1.0}, quotas={"a": 2})
    _start(fs, Task("a-run", 1.0, team="a"), 0.0)
    wide = Task("a-wide", 1.0, team="a", cores=2)
    fs.push_many([wide, Task("b-1", 1.0, team="b")])
    why = fs.why_waiting(wide, 1.0)
    assert why is not None and "its quota is 2" in why, why


def test_an_unknown_team_is_named() -> None:
    fs = FairShare({"a": 1.0})
    assert "not been seen" in (fs.why_waiting(Task("z", 1.0, team="zz"), 0.0) or "")


@pytest.mark.parametrize("seed", range(40))
def test_the_task_said_to_start_next_is_the_task_pop_returns(seed: int) -> None:
    """Tasks of one and two cores: every waiting task is asked, and exactly the one ``pop``
    returns is told it starts at the next free slot; a team whose next task would take it
    past its quota is told so by every task of it, whatever that task's own cores."""
    rng = random.Random(seed)
    teams = ["a", "b", "c"][: rng.randint(2, 3)]
    quotas = {t: rng.randint(1, 3) for t in teams if rng.random() < 0.6}
    fs = FairShare({t: rng.choice([1.0, 2.0, 3.0]) for t in teams}, quotas=quotas)
    n = 0
    for t in teams:
        for _ in range(rng.randint(0, 3)):
            _start(fs, Task(f"run-{n}", 1.0, team=t, cores=rng.randint(1, 2)), 0.0)
            n += 1
    waiting = [
        Task(f"w-{i}", 1.0, team=rng.choice(teams), cores=rng.randint(1, 2))
        for i in range(rng.randint(1, 8))
    ]
    fs.push_many(waiting)
    heads: dict[str, Task] = {}
    for w in waiting:
        heads.setdefault(w.team, w)
    reasons = {w.tid: fs.why_waiting(w, 1.0) for w in waiting}
    held = {t for t, h in heads.items() if t in quotas and fs.running(t) + h.cores > quotas[t]}
    served = fs.pop(_Node(1 << 30), 1.0)
    assert served is not None
    told = [tid for tid, why in reasons.items() if why and "next free slot" in why]
    assert told == [served.tid], (reasons, served.tid)
    for w in waiting:
        why = reasons[w.tid]
        assert why is not None
        if w.team == served.team:
            assert f"team {served.team!r} is next by fair share" in why, why
        elif w.team in held:
            assert f"its quota is {quotas[w.team]}" in why, why
        else:
            assert f"team {served.team!r} is further below its share" in why, why
