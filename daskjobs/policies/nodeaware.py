"""Longest first, aware of slow nodes: learn node speed online and plan around it.

Longest-first (LPT) is near optimal on identical cores, but one slow node
breaks it twice over: LPT hands the slow node some of the longest tasks at time
zero, and a lateness rule that compares run time with the *estimate* cannot tell
a slow node from a long task (a 7.5 h task with a 12 h estimate on a 4x node
runs 30 h and never passes 2.5 x 12 h in time). This policy fixes both with
what it can observe, never with an oracle.

Learning speed. Every finished attempt gives a ratio ``actual / estimate``;
its log is the node's log slow-down plus estimate noise. A node's believed
slow-down is ``exp(sum of log ratios / (count + prior))``: the prior pulls it
to 1 (nominal) until a few attempts have finished there. A node has *been
measured* once ``min_samples`` attempts finished on it.

Placement.

* A measured nominal node takes the longest queued task (LPT).
* A measured slow node (believed slow-down >= ``slow_threshold``) takes the
  *shortest* queued task, and only if it would finish there before the
  projected end of the whole run (the *horizon*, below); otherwise it idles.
  Long tasks stay on nodes that are not measured slow.
* An unmeasured node takes tasks from the short end (at most ``probe``, by
  default none, from the long end): short tasks measure it within minutes, and
  no long task is gambled on a node nobody has seen run. The longest tasks wait
  only until the first nodes are measured.

The horizon is ``now + (queued work + expected remaining work of running
attempts) / effective cores``, with effective cores ``sum(cores / slow-down)``:
the earliest the run could end given what the policy believes. It is kept
incrementally (sums updated on push, pop, start and end) and costs O(1) to
read.

Lateness and backups (with a :class:`~daskjobs.policies.speculation.Speculation`
spec). Deadlines scale with the believed slow-down of the attempt's node
(:meth:`speed`), so a task on a 4x node is late at ``2.5 x 4 x estimate``, not
at ``2.5 x estimate``. And :meth:`urgent` asks for a backup at once when an
attempt's expected end on its slow node is past the horizon and a fresh copy
on a nominal node would finish well before it: the long task that landed on
the slow node at time zero is copied as soon as that node is measured slow, not
30 hours later.

Cost per decision: O(b log n) for b distinct core requests (double-ended
priority queue with lazy deletion); O(1) to read speeds and the horizon;
O(nodes) only when a node's believed speed moves by more than 20%.
Ties: push order.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Sequence
from typing import Any

from daskjobs.policies.base import AttemptView, NodeView, Policy, TaskView

__all__ = ["NodeAware"]


_Entry = tuple[float, int, TaskView]  # (-estimate, push counter, task)
_RATIO = math.log(1.2)


def _first(entry: _Entry) -> float:
    return entry[0]


_MAX_LOG = math.log(1000.0)


class _Ladder:
    """Tasks by estimate: the longest exactly, the rest by rungs of 1.2x.

    ``hi`` is a max-heap over all tasks (the longest, for nominal nodes).
    ``rungs`` buckets the same entries by ``floor(log1.2(estimate))``, each
    rung a max-heap, so "a short task" (the lowest rung) and "the longest task
    of at most X" (walk down from X's rung) cost O(log n) plus the rungs
    walked; there are about 13 rungs per decade of estimates. Entries taken
    through one view are dropped lazily from the other (``taken``). A batch
    pushed at once is sorted once into ``run`` (longest at the end), which
    serves the long end in O(1) beside the heap.
    """

    __slots__ = ("hi", "n", "nonempty", "run", "rungs", "taken")

    def __init__(self) -> None:
        self.hi: list[_Entry] = []
        self.run: list[_Entry] = []  # sorted, the longest (smallest entry) last
        self.rungs: dict[int, list[_Entry]] = {}
        self.nonempty: list[int] = []  # sorted rung indices that may hold entries
        self.taken: set[int] = set()
        self.n = 0

    @staticmethod
    def rung(est: float) -> int:
        if not est > 1e-3:
            return -38  # everything under a millisecond shares the lowest rung
        if est > 1e300:
            return 3800  # and everything astronomically long the highest
        return math.floor(math.log(est) / _RATIO)

    def _rung_heap(self, r: int) -> list[_Entry]:
        """The heap of rung ``r``, listed among the non-empty rungs (it is about to be)."""
        heap = self.rungs.get(r)
        if heap is None:
            heap = self.rungs[r] = []
        if not heap:
            i = bisect.bisect_left(self.nonempty, r)
            if i == len(self.nonempty) or self.nonempty[i] != r:
                self.nonempty.insert(i, r)
        return heap

    def push(self, est: float, seq: int, task: TaskView) -> None:
        entry = (-est, seq, task)
        heapq.heappush(self.hi, entry)
        heapq.heappush(self._rung_heap(self.rung(est)), entry)
        self.n += 1

    def push_many(self, entries: list[_Entry]) -> None:
        """Entries ``(-estimate, seq, task)`` in push order (seq increasing)."""
        if self.run:  # an older run still pending: fold it into the heap
            self.hi.extend(self.run)
            heapq.heapify(self.hi)
            self.run.clear()
        by_rung: dict[int, list[_Entry]] = {}
        rung = self.rung
        for e in entries:
            by_rung.setdefault(rung(-e[0]), []).append(e)
        for r, group in by_rung.items():
            heap = self._rung_heap(r)
            heap.extend(group)
            heapq.heapify(heap)
        ordered = sorted(entries, key=_first)  # stable: push order among equal estimates
        ordered.reverse()
        self.run.extend(ordered)
        self.n += len(entries)

    def _clean(self, heap: list[_Entry]) -> None:
        taken = self.taken
        while heap and heap[0][1] in taken:
            taken.discard(heapq.heappop(heap)[1])

    def head(self) -> tuple[list[_Entry], _Entry] | None:
        self._clean(self.hi)
        run = self.run
        taken = self.taken
        while run and run[-1][1] in taken:
            taken.discard(run.pop()[1])
        if run and not (self.hi and self.hi[0][:2] < run[-1][:2]):
            return run, run[-1]
        return (self.hi, self.hi[0]) if self.hi else None

    def _walk(self, i: int, limit: float) -> tuple[list[_Entry], _Entry] | None:
        """From rung position ``i`` downwards: the first head of at most ``limit``."""
        nonempty = self.nonempty
        while i >= 0:
            heap = self.rungs[nonempty[i]]
            self._clean(heap)
            if not heap:
                del nonempty[i]
            elif -heap[0][0] <= limit:
                return heap, heap[0]
            i -= 1
        return None

    def low(self) -> tuple[list[_Entry], _Entry] | None:
        """A task from the lowest rung (within 1.2x of the shortest)."""
        nonempty = self.nonempty
        while nonempty:
            heap = self.rungs[nonempty[0]]
            self._clean(heap)
            if heap:
                return heap, heap[0]
            del nonempty[0]
        return None

    def fit(self, limit: float) -> tuple[list[_Entry], _Entry] | None:
        """The longest task of at most ``limit`` (to within a rung), if any."""
        if limit <= 0:
            return None
        i = bisect.bisect_right(self.nonempty, self.rung(limit)) - 1
        return self._walk(i, limit)

    def take(self, heap: list[_Entry]) -> TaskView:
        _, seq, task = heap.pop() if heap is self.run else heapq.heappop(heap)
        self.taken.add(seq)
        self.n -= 1
        return task


class NodeAware(Policy):
    """LPT that learns node speeds online, keeps long tasks off slow nodes and
    judges lateness against the speed of the node an attempt runs on."""

    name = "node-aware"

    def __init__(
        self,
        *,
        slow_threshold: float = 1.5,
        min_samples: int = 3,
        probe: int = 0,
        prior: float = 2.0,
        margin: float = 1.25,
        fill: float = 0.3,
        unmeasured_slowdown: float = 4.0,
    ) -> None:
        if not slow_threshold > 1:
            raise ValueError(f"slow_threshold must be > 1, got {slow_threshold!r}")
        if min_samples < 1 or probe < 0 or prior < 0 or margin < 1:
            raise ValueError("need min_samples >= 1, probe >= 0, prior >= 0, margin >= 1")
        self.slow_threshold = slow_threshold
        self.min_samples = min_samples
        self.probe = probe
        self.prior = prior
        self.margin = margin
        self.fill = fill
        self.unmeasured_slowdown = unmeasured_slowdown
        self._queues: dict[int, _Ladder] = {}
        self._sizes: list[int] = []
        self._counter = itertools.count()
        self._n = 0
        # node state
        self._cores: dict[int, int] = {}
        self._logsum: dict[int, float] = {}
        self._count: dict[int, int] = {}
        self._speed: dict[int, float] = {}
        self._announced: dict[int, float] = {}
        self._heads: dict[int, int] = {}
        self._lows: dict[int, int] = {}
        self._capacity = 0.0  # sum of cores / believed slow-down
        self._best = 1.0  # smallest believed slow-down, refreshed when a belief moves
        # horizon sums
        self._queued_work = 0.0
        self._run_cores = 0
        self._run_end_sum = 0.0  # sum of cores * expected end
        self._run: dict[int, tuple[int, float]] = {}  # id(attempt) -> (cores, end)

    # -- nodes and speeds -------------------------------------------------------
    def add_node(self, index: int, cores: int) -> None:
        self._cores[index] = cores
        self._logsum[index] = 0.0
        self._count[index] = 0
        self._speed[index] = 1.0
        self._announced[index] = 1.0
        self._heads[index] = 0
        self._lows[index] = 0
        self._capacity += cores

    def remove_node(self, index: int) -> None:
        cores = self._cores.pop(index, 0)
        self._capacity -= cores / self._speed.pop(index, 1.0)

    def speed(self, node: int) -> float:
        return self._speed.get(node, 1.0)

    def samples(self, node: int) -> int:
        """Finished attempts the speed belief of ``node`` rests on."""
        return self._count.get(node, 0)

    def measured(self, node: int) -> bool:
        return self._count.get(node, 0) >= self.min_samples

    def _learn(self, node: int, ratio: float) -> bool:
        if node not in self._cores or not (ratio > 0 and math.isfinite(ratio)):
            return False
        # one sample moves the belief by at most 1000x either way: a near-zero
        # estimate must not make a node look infinitely slow
        self._logsum[node] += min(max(math.log(ratio), -_MAX_LOG), _MAX_LOG)
        self._count[node] += 1
        old = self._speed[node]
        new = math.exp(self._logsum[node] / (self._count[node] + self.prior))
        self._speed[node] = new
        self._capacity += self._cores[node] * (1.0 / new - 1.0 / old)
        if abs(math.log(new / self._announced[node])) > math.log(1.2):
            self._announced[node] = new
            self._best = min(self._speed.values())
            return True
        return False

    def horizon(self, now: float) -> float:
        """Projected end of the run from what the policy knows now."""
        remaining = self._run_end_sum - now * self._run_cores
        work = self._queued_work + (remaining if remaining > 0 else 0.0)
        return now + work / self._capacity if self._capacity > 0 else math.inf

    # -- the queue --------------------------------------------------------------
    def push(self, task: TaskView) -> None:
        c = task.cores
        q = self._queues.get(c)
        if q is None:
            q = self._queues[c] = _Ladder()
            self._sizes.append(c)
            self._sizes.sort()
        q.push(task.estimate, next(self._counter), task)
        self._queued_work += task.estimate * c
        self._n += 1

    def push_many(self, tasks: Sequence[TaskView]) -> None:
        by_cores: dict[int, list[_Entry]] = {}
        counter = self._counter
        work = 0.0
        for t in tasks:
            by_cores.setdefault(t.cores, []).append((-t.estimate, next(counter), t))
            work += t.estimate * t.cores
        for c, entries in by_cores.items():
            q = self._queues.get(c)
            if q is None:
                q = self._queues[c] = _Ladder()
                self._sizes.append(c)
                self._sizes.sort()
            q.push_many(entries)
        self._queued_work += work
        self._n += len(tasks)

    def _pick(self, free: int, how: str, limit: float = 0.0) -> tuple[list[_Entry], _Entry] | None:
        """Across core-size queues that fit ``free``: the longest (``head``),
        a shortest (``low``) or the longest of at most ``limit`` (``fit``)."""
        best: tuple[list[_Entry], _Entry] | None = None
        for c in self._sizes:
            if c > free:
                break
            q = self._queues[c]
            got = q.head() if how == "head" else q.low() if how == "low" else q.fit(limit)
            if got is None:
                continue
            if best is None:
                best = got
            elif how == "low":
                if (-got[1][0], got[1][1]) < (-best[1][0], best[1][1]):
                    best = got
            elif got[1][:2] < best[1][:2]:
                best = got
        return best

    def pop(self, node: NodeView, now: float) -> TaskView | None:
        if not self._n:
            return None
        k = node.index
        s = self._speed.get(k, 1.0)
        if not self.measured(k):
            if self._heads[k] < self.probe:
                found = self._pick(node.free, "head")
            elif self._lows[k] < self.min_samples:
                found = self._pick(node.free, "low")  # short tasks measure it soon
            else:  # what would end in time even if the node were `unmeasured_slowdown`x slow
                horizon = self.horizon(now)
                limit = (horizon - now) * self.fill / self.unmeasured_slowdown
                found = self._pick(node.free, "fit", limit) or self._pick(node.free, "low")
        elif s < self.slow_threshold:
            found = self._pick(node.free, "head")
        else:
            # A measured slow node: the longest task that ends well before the
            # projected end of the run (leaving the short ones to fill the end
            # on nominal nodes), else a short one if even that ends in time.
            horizon = self.horizon(now)
            found = self._pick(node.free, "fit", (horizon - now) * self.fill / s)
            if found is None:
                found = self._pick(node.free, "low")
                if found and self._run_cores and now - found[1][0] * s > horizon:
                    return None
        if found is None:
            return None
        heap, entry = found
        task = self._queues[entry[2].cores].take(heap)
        if not self.measured(k):
            q = self._queues[task.cores]
            if heap is q.hi or heap is q.run:
                self._heads[k] += 1
            else:
                self._lows[k] += 1
        self._queued_work -= task.estimate * task.cores
        self._n -= 1
        return task

    def __len__(self) -> int:
        return self._n

    # -- attempts ---------------------------------------------------------------
    def started(self, attempt: AttemptView, now: float) -> None:
        t = attempt.task
        end = attempt.start + t.estimate * self.speed(attempt.node)
        self._run[id(attempt)] = (t.cores, end)
        self._run_cores += t.cores
        self._run_end_sum += t.cores * end

    def ended(self, attempt: AttemptView, now: float) -> bool:
        got = self._run.pop(id(attempt), None)
        if got is not None:
            self._run_cores -= got[0]
            self._run_end_sum -= got[0] * got[1]
        if attempt.outcome == "done" and attempt.task.estimate > 0:
            return self._learn(attempt.node, (now - attempt.start) / attempt.task.estimate)
        return False

    def urgent(self, attempt: AttemptView, now: float) -> bool:
        s = self.speed(attempt.node)
        if s < self.slow_threshold:
            return False
        est = attempt.task.estimate
        # What is left: the estimate scaled to the node, less what has run, but
        # never below half of it: an attempt past its expected end is not
        # about to finish, it is evidence the node (or estimate) is worse.
        left = max(attempt.start + est * s - now, 0.5 * est * s)
        expected_end = now + left
        fresh_end = now + est * min(self._best, 1.0) * self.margin
        return expected_end > fresh_end and expected_end > self.horizon(now)

    def describe(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "slow_threshold": self.slow_threshold,
            "min_samples": self.min_samples,
            "probe": self.probe,
            "speeds": {k: round(v, 3) for k, v in self._speed.items() if abs(v - 1) > 0.05},
        }
