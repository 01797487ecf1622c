"""Static orders: first in first out, longest first, critical path first.

List scheduling
===============

All three are *list schedulers*: whenever a slot frees, the runnable task that
sorts first in a fixed order takes it. Graham (1966) showed that any list order
finishes within ``2 - 1/m`` of the optimal makespan on ``m`` identical cores,
even with precedence constraints; the order decides where in that band a
schedule lands.

* :class:`FIFO` runs tasks in submission order. A parameter grid submits its
  largest parameters last, so its longest tasks start last and the sweep's tail
  is one long task running alone on an otherwise idle cluster. This is what
  plain dask does for a flat sweep.
* :class:`LPT` (longest processing time first) runs the longest *estimated*
  task first. For independent tasks Graham (1969) bounds it by
  ``4/3 - 1/(3m)`` of optimal: the long tasks start at time zero and the many
  short ones fill in the gaps at the end. The classic tight case: tasks
  3, 3, 2, 2, 2 on two cores, where LPT gives 7 and the optimum is 6.
* :class:`CriticalPath` generalises LPT to graphs: a task's rank is its
  *b-level*, the longest estimated path from its start to the end of the graph
  (its own estimate plus the largest b-level among its dependents; HLFET / the
  upward rank of HEFT without communication costs). A 20-minute feature stage
  that feeds 7-hour backtests ranks above any independent 1-hour task, so it is
  not left for last. On a graph without edges it is exactly LPT. The tail a task's
  dependents give it is fixed when its batch is ranked; its own estimate is read from
  its view at each key, so a task estimated afresh (an estimate learned while the sweep
  runs: :mod:`daskjobs.policies.durations`) ranks by its new estimate plus that tail.

Costs: ``push`` and ``pop`` are O(log n). ``CriticalPath.add_graph`` is
O(V + E) per submitted batch.

Ties: equal keys run in push order (earlier first).

Interactive work first
======================

:func:`user_order` is the first element of a task's order everywhere a user priority
applies (lower first): ``-user_priority``, and, when the preemption policy puts
interactive work first (``te_first``), half a step less for a TE task, so within one
user priority every TE task sorts before every BE one and never passes a task of a
higher user priority (user priorities are whole numbers). The live plugin writes it
into dask's priorities; a simulator of job classes orders by the same function.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from daskjobs.policies.base import HeapPolicy, TaskView

__all__ = ["FIFO", "LPT", "TE_AHEAD", "CriticalPath", "user_order"]

#: How far ahead of best-effort work of its user priority interactive work sorts.
TE_AHEAD = 0.5


def user_order(user_key: float, job_class: str, te_first: bool) -> float:
    """The first element of a task's order (lower first): ``user_key`` (``-user
    priority``), less :data:`TE_AHEAD` for a TE task when ``te_first`` (module docs)."""
    return user_key - TE_AHEAD if te_first and job_class == "te" else user_key


class FIFO(HeapPolicy):
    """First in, first out: earliest submission first, then push order."""

    name = "fifo"

    def key(self, task: TaskView) -> Any:
        return task.submit

    def keys(self, tasks: Sequence[TaskView]) -> list[Any]:
        return [t.submit for t in tasks]


class LPT(HeapPolicy):
    """Longest estimated task first (Graham's LPT)."""

    name = "lpt"

    def key(self, task: TaskView) -> Any:
        return -task.estimate

    def keys(self, tasks: Sequence[TaskView]) -> list[Any]:
        return [-t.estimate for t in tasks]


class CriticalPath(HeapPolicy):
    """Longest estimated remaining path (b-level) first; LPT on flat graphs."""

    name = "critical-path"

    def __init__(self) -> None:
        super().__init__()
        self.blevel: dict[Hashable, float] = {}
        # the tail of each task with dependents in its batch: the largest b-level among
        # them when the batch was ranked (a task absent has none: its b-level is its own
        # estimate); the key adds it to the task's estimate as the view has it now, so a
        # task estimated afresh (a learned estimate) ranks by its new estimate plus its tail
        self._tail: dict[Hashable, float] = {}

    def add_graph(self, tasks: Sequence[TaskView]) -> None:
        """Rank a batch. ``tasks`` must be topologically ordered (deps first);
        dependencies outside the batch are already ranked and keep their rank."""
        blevel = self.blevel
        if not any(t.deps for t in tasks):  # a flat batch (a sweep): its own estimates
            rev = list(reversed(tasks))  # the loop's order below: a repeated id ends the same
            blevel.update(zip([t.tid for t in rev], [t.estimate + 0.0 for t in rev], strict=True))
            if self._tail:
                for t in tasks:
                    self._tail.pop(t.tid, None)
            return
        dependents: dict[Hashable, list[Hashable]] = {}
        for t in tasks:
            for d in t.deps:
                dependents.setdefault(d, []).append(t.tid)
        tails = self._tail
        for t in reversed(tasks):
            below = dependents.get(t.tid)
            if below:
                tail = tails[t.tid] = max(blevel[k] for k in below)
            else:
                tail = 0.0
                tails.pop(t.tid, None)
            blevel[t.tid] = t.estimate + tail

    def forget(self, tid: Hashable) -> None:
        self.blevel.pop(tid, None)
        self._tail.pop(tid, None)

    def reestimate(self, old: TaskView, new: TaskView) -> None:
        """The task's own part of its remaining path changes; the path below it is
        kept (its dependents' estimates did not change through it), and the tasks above
        it keep theirs until they are re-estimated in turn (O(1))."""
        b = self.blevel.get(new.tid)
        if b is not None:
            self.blevel[new.tid] = b - old.estimate + new.estimate

    def key(self, task: TaskView) -> Any:
        """Minus the b-level: the task's estimate (as its view has it now) plus the tail
        its dependents gave it when its batch was ranked (``blevel`` holds the b-level of
        that time); a task pushed without ``add_graph`` ranks by its own estimate."""
        return -(task.estimate + self._tail.get(task.tid, 0.0))

    def keys(self, tasks: Sequence[TaskView]) -> list[Any]:
        get = self._tail.get
        return [-(t.estimate + get(t.tid, 0.0)) for t in tasks]
