"""Balancing the estimated work waiting on workers (daskjobs.policies.balance): exact
moves on hand-drawn backlogs."""

from __future__ import annotations

from daskjobs.policies.balance import Backlog, Move, rebalance


def backlog(worker, threads, *estimates, fixed=()):
    return Backlog(
        worker, threads, [(f"{worker}{i}", e, i not in fixed) for i, e in enumerate(estimates)]
    )


def test_the_long_waiting_tasks_of_the_loaded_worker_move_to_the_idle_one():
    # a: two running (1 s each), then 8, 8, 1, 1 waiting; b: two running (1 s), nothing waiting
    a = backlog("a", 2, 1, 1, 8, 8, 1, 1)
    b = backlog("b", 2, 1, 1)
    moves = rebalance([a, b])
    # loads 10 / 1: the first 8 moves (a 6, b 5), then a 1 (5.5 each); the other 8 stays
    assert moves == [Move("a2", "a", "b", 8), Move("a4", "a", "b", 1)]


def test_no_move_inverts_the_loads_and_none_is_made_when_balanced():
    assert rebalance([backlog("a", 1, 1, 3), backlog("b", 1, 1, 2)]) == []  # 3 would invert
    assert rebalance([backlog("a", 2, 2, 2, 2), backlog("b", 2, 3, 3)]) == []  # 3 and 3


def test_running_tasks_and_restricted_ones_stay():
    # a's first task runs (one thread); its second cannot move: only the third moves
    a = backlog("a", 1, 5, 6, 4, fixed=(1,))
    b = backlog("b", 1)
    assert rebalance([a, b]) == [Move("a2", "a", "b", 4)]


def test_several_workers_and_the_limit():
    a = backlog("a", 1, 1, *[2] * 9)
    others = [backlog(w, 1) for w in "bcd"]
    moves = rebalance([a, *others])
    assert [m.target for m in moves] == ["b", "c", "d", "b", "c", "d"]
    assert all(m.source == "a" for m in moves)
    assert len(rebalance([a, *others], limit=2)) == 2


def test_one_worker_or_none_moves_nothing():
    assert rebalance([]) == []
    assert rebalance([backlog("a", 2, 5, 5, 5)]) == []


def test_only_a_task_its_parameter_model_ranked_and_unrestricted_moves():
    from daskjobs.policies.balance import movable

    assert movable("model", False)
    assert not movable("model", True)  # restrictions: dask's placement is the user's
    for source in ("history", "default", "annotation", None):  # a median, or not ranked
        assert not movable(source, False), source
