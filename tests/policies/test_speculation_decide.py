"""``Speculation.decide``: the one call the simulator, the plugin and replay enact."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from daskjobs.policies import Speculation
from daskjobs.policies.speculation import Copy, Move, SpeculationDecision
from daskjobs.sim import Task


class _Speeds:
    def __init__(self, speeds: dict[int, float] | None = None, urgent: set[str] = frozenset()):
        self.speeds = speeds or {}
        self.urgent_tids = urgent

    def speed(self, node: int) -> float:
        return self.speeds.get(node, 1.0)

    def urgent(self, attempt: Any, now: float) -> bool:
        return attempt.task.tid in self.urgent_tids

    def horizon(self, now: float) -> float:
        return 1e9


@dataclass
class _Attempt:
    task: Task
    node: int
    start: float = 0.0


@dataclass
class _Node:
    index: int
    free: int = 1
    cores: int = 1
    copies: int = 0
    same_host: bool = False

    @property
    def name(self) -> str:
        return f"w{self.index}"


@dataclass
class _Loser:
    node: int
    key: str
    released: float
    estimate: float


@dataclass
class _Held:
    index: int
    cores: int
    started: int
    waiting: list[Any] = field(default_factory=list)


def test_verdicts_carry_the_deadline_and_the_reason() -> None:
    spec = Speculation(late_factor=2.0)
    late = _Attempt(Task("late", 10.0, 1.0), 0)
    ok = _Attempt(Task("ok", 10.0, 8.0), 0)
    slow = _Attempt(Task("slow", 10.0, 1.0), 1)  # node 1 believed 3x slow: later deadline
    urgent = _Attempt(Task("urgent", 10.0, 8.0), 0)
    never = _Attempt(Task("never", 10.0, 1.0, speculate=False), 0)
    speeds = _Speeds({1: 3.0}, urgent={"urgent"})
    d = spec.decide(5.0, speeds, judge=[late, ok, slow, urgent, never])
    got = [(v.attempt.task.tid, v.deadline, v.why) for v in d.verdicts]
    assert got == [
        ("late", 2.0, "late"),
        ("ok", 16.0, None),
        ("slow", 6.0, None),
        ("urgent", 16.0, "urgent"),
        ("never", float("inf"), None),
    ]
    assert d.verdicts[0].reason == "late: ran 5 s, deadline 2 s"
    assert d.verdicts[1].reason == "on time until 16 s"
    assert d.verdicts[4].reason.startswith("never copied")
    assert [v.attempt.task.tid for v in d.late] == ["late", "urgent"]
    # the same verdicts as the single-question methods give
    for v in d.verdicts[:4]:
        assert spec.verdict(v.attempt, 5.0, speeds) == v.why


def test_copies_take_their_slot_within_one_decision_and_stop_at_the_cap() -> None:
    spec = Speculation(late_factor=2.0, max_fraction=0.5, ahead="always")
    a, b, c = (_Attempt(Task(t, 10.0, 1.0), 0) for t in "abc")
    nodes = [_Node(1, free=1), _Node(2, free=1)]
    d = spec.decide(5.0, _Speeds(), judge=[a, b, c], candidates=nodes, slots=6, running=1)
    # cap: 3 of 6 slots; one copy runs already, two more may start: one on each node
    assert [(x.attempt.task.tid, x.target and x.target.index) for x in d.copies] == [
        ("a", 1),
        ("b", 2),
        ("c", None),
    ]
    assert d.copies[0].reason == "late: copied to w1"
    assert d.copies[2].reason == "late, not copied: 3 copies run (the cap)"
    assert [x.attempt for x in d.placed] == [a, b]
    # without the cap, the third copy finds both nodes taken by this decision's copies
    d = spec.decide(5.0, _Speeds(), judge=[a, b, c], candidates=nodes)
    assert d.copies[2].target is None and "no faster busy node" in d.copies[2].reason


def test_a_copy_may_queue_on_a_busy_faster_node_only_past_the_horizon() -> None:
    a = _Attempt(Task("a", 10.0, 1.0), 0)
    busy = _Node(1, free=0)
    speeds = _Speeds({0: 4.0})
    before = Speculation(late_factor=2.0).decide(
        9.0, speeds, judge=[a], candidates=[busy], horizon=100.0
    )
    assert before.copies[0].target is None and not before.copies[0].ahead
    past = Speculation(late_factor=2.0).decide(
        9.0, speeds, judge=[a], candidates=[busy], horizon=lambda: 10.0
    )
    (c,) = past.copies
    assert c.ahead and c.target is busy
    assert c.reason == "late: copied to w1, ahead of its queued work"


def test_a_copy_asked_earlier_is_placed_on_a_free_slot_only() -> None:
    spec = Speculation()
    a = _Attempt(Task("a", 10.0, 1.0), 0)
    d = spec.decide(0.0, _Speeds(), asked=[a], candidates=[_Node(1, free=0), _Node(2)])
    assert d.verdicts == () and d.copies[0].why == "asked" and d.copies[0].target.index == 2


def test_candidates_may_depend_on_the_attempt() -> None:
    spec = Speculation(late_factor=2.0)
    a, b = _Attempt(Task("a", 10.0, 1.0), 0), _Attempt(Task("b", 10.0, 1.0), 0)
    only = {"a": [_Node(1)], "b": [_Node(2)]}
    d = spec.decide(5.0, _Speeds(), judge=[a, b], candidates=lambda x: only[x.task.tid])
    assert [c.target.index for c in d.copies] == [1, 2]


def test_losers_past_their_timeout_are_reclaimed() -> None:
    spec = Speculation(reclaim_after=60.0, reclaim_factor=3.0)
    fresh = _Loser(1, "f", released=100.0, estimate=10.0)  # until 190
    stale = _Loser(1, "s", released=0.0, estimate=10.0)  # until 90
    d = spec.decide(150.0, _Speeds(), losers=[fresh, stale])
    assert [r.loser for r in d.reclaimed] == [stale]
    assert "taken for returned" in d.reclaimed[0].reason and "90 s" in d.reclaimed[0].reason
    assert spec.reclaim_at(0.0, 10.0) == 90.0
    with pytest.raises(ValueError, match="reclaim_after"):
        Speculation(reclaim_after=-1.0)


def test_tasks_waiting_behind_losers_move_to_the_fastest_idle_node() -> None:
    spec = Speculation()
    loser = _Loser(0, "l", released=0.0, estimate=1.0)
    waiting = [Task(f"w{i}", 1.0, 1.0) for i in range(4)]
    # node 0: 2 threads, one held by the loser, one running: all four waiting tasks move
    held = _Held(0, cores=2, started=1, waiting=waiting)
    idle = [_Node(1, free=1), _Node(2, free=2, cores=2), _Node(3, free=1)]
    speeds = _Speeds({1: 2.0})  # node 1 believed slow: last choice
    d = spec.decide(1.0, speeds, losers=[loser], held=[held], idle=idle)
    assert [(m.task.tid, m.target.index) for m in d.moves] == [
        ("w0", 2),  # equally idle: the lower index
        ("w1", 3),  # the least loaded next
        ("w2", 2),
        ("w3", 1),  # the slow node last
    ]
    assert d.moves[0].reason == "waited on node 0 behind 1 loser thread(s) (0 free): moved to w2"
    # reclaimed: nothing holds node 0 any more, nothing moves
    assert spec.decide(1e6, speeds, losers=[loser], held=[held], idle=idle).moves == ()
    # a node held by a loser is no thief, and a copy counts the loser's thread as busy
    other = _Loser(2, "m", released=0.0, estimate=1.0)
    d = spec.decide(1.0, speeds, losers=[loser, other], held=[held], idle=idle)
    assert {m.target.index for m in d.moves} == {1, 3}
    a = _Attempt(Task("a", 10.0, 1.0), 0)
    d = spec.decide(
        50.0, speeds, judge=[a], candidates=[_Node(3)], losers=[_Loser(3, "x", 49.0, 1.0)]
    )
    assert d.copies[0].target is None


def test_a_decision_is_checked() -> None:
    a = _Attempt(Task("a", 10.0, 1.0), 0)
    with pytest.raises(ValueError, match="own node"):
        SpeculationDecision(copies=(Copy(a, "late", _Node(0), False, ""),))
    with pytest.raises(ValueError, match="two copies"):
        SpeculationDecision(copies=(Copy(a, "late", None, False, ""),) * 2)
    with pytest.raises(ValueError, match="to itself"):
        SpeculationDecision(moves=(Move(a.task, 1, _Node(1), 1, 0),))
    d = SpeculationDecision()
    with pytest.raises(AttributeError):
        d.copies = ()  # type: ignore[misc]
    assert d == SpeculationDecision((), (), (), ())


def test_the_end_game_copies_the_attempts_expected_to_end_last_onto_idle_nodes() -> None:
    spec = Speculation(late_factor=10.0, endgame=True)
    # expected ends at t=10: a on node 0 (believed 2x slow) 30 x 2 = 60; b 5 + 40 = 45;
    # c 10 + 6 = 16 (past half its estimate: half is left); d may never be copied
    a = _Attempt(Task("a", 30.0, 30.0), 0)
    b = _Attempt(Task("b", 40.0, 40.0), 1, start=5.0)
    c = _Attempt(Task("c", 12.0, 12.0), 2)
    d_ = _Attempt(Task("d", 99.0, 99.0, speculate=False), 2)
    speeds = _Speeds({0: 2.0})
    idle = [_Node(3), _Node(4)]
    d = spec.decide(10.0, speeds, judge=[c, b, a, d_], candidates=idle, waiting=0, slots=100)
    # no verdict changes: nobody is late, the copies are the end game's
    assert [v.why for v in d.verdicts] == [None, None, None, None]
    assert [(x.attempt.task.tid, x.why, x.target.index) for x in d.copies] == [
        ("a", "endgame", 3),
        ("b", "endgame", 4),
    ]
    assert d.copies[0].reason == "endgame: nothing waits; a spare copy on idle w3"
    assert d.placed == d.copies  # only copies placed on idle slots are in the answer


def test_the_end_game_waits_for_nothing_waiting_and_keeps_to_its_bounds() -> None:
    a = _Attempt(Task("a", 30.0, 30.0), 0)
    b = _Attempt(Task("b", 20.0, 20.0), 1)
    idle = [_Node(2)]
    on = Speculation(late_factor=10.0, endgame=True)
    # something waits, or nobody says: no end game
    for waiting in (1, None):
        d = on.decide(1.0, _Speeds(), judge=[a, b], candidates=idle, waiting=waiting)
        assert d.copies == ()
    # off by default
    off = Speculation(late_factor=10.0)
    assert off.decide(1.0, _Speeds(), judge=[a, b], candidates=idle, waiting=0).copies == ()
    # only idle slots: a busy node takes no end-game copy, not even one believed faster
    busy = [_Node(2, free=0)]
    assert on.decide(1.0, _Speeds({0: 4.0}), judge=[a], candidates=busy, waiting=0).copies == ()
    # an attempt that has not run min_runtime yet is not copied
    young = Speculation(late_factor=10.0, endgame=True, min_runtime=5.0)
    assert young.decide(1.0, _Speeds(), judge=[a], candidates=idle, waiting=0).copies == ()
    # never on a node believed slower than the primary's
    assert on.decide(1.0, _Speeds({2: 3.0}), judge=[a], candidates=idle, waiting=0).copies == ()
    # within the cap: one copy runs of the cap's one (10% of 10 slots)
    d = on.decide(1.0, _Speeds(), judge=[a, b], candidates=idle, waiting=0, slots=10, running=1)
    assert d.copies == ()
    # a late attempt keeps its own copy first; the end game takes what is left
    late = _Attempt(Task("late", 5.0, 1.0), 0)
    d = on.decide(20.0, _Speeds(), judge=[a, late], candidates=[_Node(2), _Node(3)], waiting=0)
    assert [(x.attempt.task.tid, x.why, x.target.index) for x in d.copies] == [
        ("late", "late", 2),
        ("a", "endgame", 3),
    ]
    with pytest.raises(TypeError, match="endgame"):
        Speculation(endgame=1)  # type: ignore[arg-type]


def test_the_end_game_fills_each_idle_slot_once_whatever_the_candidates_are() -> None:
    spec = Speculation(late_factor=10.0, endgame=True)
    running = [_Attempt(Task(f"t{i}", 10.0 + i, 10.0 + i), i % 2) for i in range(40)]
    shared = [_Node(5, free=2), _Node(6, free=0)]
    want = [("t39", 5), ("t38", 5)]  # node 5's two slots: the two latest expected ends
    # one list shared by tasks alike (as the plugin's check gives them), a fresh list per
    # attempt, and a plain sequence: the same answer
    for cands in (lambda a: shared, lambda a: list(shared), shared):
        d = spec.decide(1.0, _Speeds(), judge=running, candidates=cands, waiting=0)
        assert [(c.attempt.task.tid, c.target.index) for c in d.copies] == want
