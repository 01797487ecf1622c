"""Balancing the estimated work waiting on workers.

Why
===

dask places a task with inputs on the worker that holds them, as soon as it is runnable,
and each worker then runs its own tasks best-ranked first. The placement was decided
before anything was known of the stage: on a sweep whose feature stage is read by
backtests (benchmarks/bench_estimates.py's ``two_stage``), the slices whose backtests are
long end up on one worker in dask's order. When the stage's model learns and the tasks
are re-ranked, each worker runs its long ones first, but one worker holds most of the
long work: the other runs its short tasks, goes idle, and dask's work stealing (which
sees a count of tasks, every task of a stage alike) moves a long task to it only then,
to end last. Longest-first over the cluster needs the long tasks spread while they wait.

What
====

:func:`rebalance` takes each worker's backlog (its threads and the estimates of the tasks
it holds, in the order it would start them; the first ``threads`` are taken as running)
and answers moves of waiting tasks, greedily: the most loaded worker (estimated seconds
per thread) gives its best-ranked waiting task that the least loaded one can take without
becoming the more loaded of the two, until no such task is left or ``limit`` moves are
made. Each move lowers the larger of the two loads and never raises the cluster's
largest, so the estimated end of the work waiting can only come closer.

What it does not know: the cost of moving a task's inputs (the views carry no sizes; dask's
own stealing weighs it), and what a worker runs that the driver did not rank. A driver
moves only tasks that can move (no restrictions, not started).

Cost: O(W) per move for W workers, plus the scan of the giver's backlog for a task that
fits, O(n) for its n tasks; at most ``limit`` moves.

Pure: nothing here imports ``distributed``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

__all__ = ["Backlog", "Move", "movable", "rebalance"]


@dataclass(frozen=True, slots=True)
class Backlog:
    """A worker's work: ``threads``, and ``(task, estimate seconds, movable)`` for each
    task it holds, in the order it would start them (the first ``threads`` run)."""

    worker: Hashable
    threads: int
    tasks: Sequence[tuple[Hashable, float, bool]]


@dataclass(frozen=True, slots=True)
class Move:
    """Move waiting ``task`` from ``source`` to ``target`` (with its estimate)."""

    task: Hashable
    source: Hashable
    target: Hashable
    estimate: float


def movable(source: str | None, restricted: bool) -> bool:
    """Whether a task may move: one its stage's parameter model ranked (``source ==
    "model"``: a sweep's, whose tasks carry ``params``) and that has no restrictions. A
    task that every other of its stage predicts alike (a stage median, the default), or
    that the driver did not rank (another user's graph), keeps the place dask gave it; a
    driver spreads a stage only after a re-rank that model made."""
    return source == "model" and not restricted


def rebalance(backlogs: Sequence[Backlog], limit: int = 64) -> list[Move]:
    """The moves that even out the estimated work waiting on the workers (module
    docstring). Deterministic: ties go to the earlier backlog."""
    ws = [b for b in backlogs if b.threads > 0]
    if len(ws) < 2:
        return []
    load = [sum(e for _, e, _ in b.tasks) / b.threads for b in ws]
    waiting = [[t for t in b.tasks[b.threads :] if t[2]] for b in ws]
    moves: list[Move] = []
    while len(moves) < limit:
        src = max(range(len(ws)), key=load.__getitem__)
        dst = min(range(len(ws)), key=load.__getitem__)
        if load[src] <= load[dst]:
            break
        ts_, td = ws[src].threads, ws[dst].threads
        pick = None
        for i, (_, e, _) in enumerate(waiting[src]):
            if e > 0 and load[dst] + e / td <= load[src] - e / ts_:
                pick = i
                break
        if pick is None:
            break
        task, e, _ = waiting[src].pop(pick)
        load[src] -= e / ts_
        load[dst] += e / td
        moves.append(Move(task, ws[src].worker, ws[dst].worker, e))
    return moves
