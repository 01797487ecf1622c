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
  only until the first nodes are measured. It measures with tasks near the
  ``measure_quantile`` (5th percentile) of the queued estimates, not the very
  shortest: those are kept to fill the end of the run.

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

Spreading short tasks (``interleave``, default 0: off). Longest-first leaves the
shortest tasks for the end of the run, when the scheduler must start tasks fastest;
a scheduler that starts a bounded number a second (``Cluster.dispatch_rate`` in the
simulator; dask's own cost per task live) leaves threads idle there. With
``interleave=f``, every ``round(1 / f)``-th task a node measured nominal takes is the
shortest queued one, so the shortest tasks run alongside the long ones. It costs a
little where starting tasks is free (the run ends on tasks near the ``f`` quantile,
not the shortest) and gains where it is not (docs/benchmarks.md, the end of a
longest-first run).

Pacing the tasks the scheduler cannot start fast enough (``dispatch_rate``, default 0:
off). Given the rate ``r`` at which the scheduler can start tasks, a task is
*dispatch-bound* if every core running tasks that short would ask for more than ``r``
starts a second (estimate below ``cores / r``). A node measured nominal takes the shortest
queued task while it is dispatch-bound and the dispatch-bound attempts running ask for fewer
starts a second (their cores over their expected run time) than the queued dispatch-bound
tasks need to start by the projected end (their count over ``horizon - now``); otherwise the
longest. So they run at the pace the run's length allows, spread over it, and the end is
left to tasks the scheduler can keep up with; tasks that are not dispatch-bound keep the
longest-first order. Unlike ``interleave`` it needs no fraction chosen by hand, and leaves
clusters whose scheduler keeps up (few cores, long tasks) as they were.

Cost per decision: O(b log n) for b distinct core requests (a batch is a sorted run
served from both ends, single pushes a sorted list; see ``_Ladder``), O(1) on a measured
nominal node with one core size (with ``dispatch_rate``: O(b log n), a bisection of each
core size's queue); O(1) to read
speeds and the horizon; O(nodes) only when the fastest node's belief moves
up by more than 20%. Ties: push order.
"""

from __future__ import annotations

import bisect
import itertools
import math
from array import array
from collections.abc import Iterable, Sequence
from functools import reduce
from itertools import repeat
from operator import add, attrgetter, itemgetter, mul
from operator import neg as neg_
from typing import Any

import numpy as np
from sortedcontainers import SortedList

from daskjobs.policies.base import AttemptView, Capabilities, NodeView, Policy, TaskView
from daskjobs.policies.speculation import expected_left, projected_end

__all__ = ["NodeAware"]


_Entry = tuple[float, int, TaskView]  # (-estimate, push counter, task)
_RATIO = math.log(1.2)
_NEG_RATIO = -_RATIO
_log, _exp, _INF = math.log, math.exp, math.inf  # hot in `ended`
_MAX_LOG = math.log(1000.0)
_MIN_LOG = -_MAX_LOG


_cores_of = attrgetter("cores")
_estimate_of = attrgetter("estimate")
_speed_of = attrgetter("speed")


class _Ladder:
    """Queued tasks of one core size, by estimate: the longest, the shortest,
    and the longest of at most a limit, each exactly.

    Two stores. A batch pushed at once (a sweep submitted together) is sorted
    once into the *run*, shortest first: the longest is taken from its live end
    ``hi`` and the shortest from its live start ``lo``, both O(1); the longest of
    at most X is a bisection. An entry taken from the middle leaves a pointer to
    its left neighbour in ``skip`` (a union-find over run positions with path
    compression, so stretches of taken entries are crossed in near O(1)).

    The run is kept as two flat arrays and a list, not as a list of entries:
    ``est`` (the estimates, ascending), ``seq`` (the push counters) and ``tasks``,
    in the same order. A million-task sweep then costs two array copies from
    numpy and one tuple, instead of a million tuples and their floats and ints; the
    tasks are put in run order once, at the push (taken from the batch in push
    order instead, each take would miss the cache on its scattered slot). An entry
    ``(-estimate, push counter, task)`` is made only when a query answers one
    (:meth:`entry`); NodeAware's pop reads the run itself.

    Tasks pushed one at a time (retries, tasks whose inputs just finished) go
    to ``single``, a sorted list (``sortedcontainers.SortedList``, already a
    dependency of distributed) of entries: every query and removal there is
    O(log n). The counter is unique, so tasks themselves are never compared.
    """

    __slots__ = ("est", "hi", "lo", "seq", "single", "skip", "tasks", "top")

    def __init__(self) -> None:
        self.est = array("d")  # the run's estimates, shortest first; live in [lo, hi)
        self.seq = array("q")  # ... their push counters
        self.tasks: Sequence[TaskView] = ()  # ... their tasks
        self.lo = 0
        self.hi = 0
        self.skip: dict[int, int] = {}  # taken run position -> a position to its left
        self.single: SortedList = SortedList()
        self.top: _Entry | None = None  # single[0], cached: indexing a SortedList is slow

    @property
    def n(self) -> int:
        """Queued entries: the run's live ones (a taken position in the run's live span
        is a key of ``skip``) and the single pushes. Counted when asked, not per pop."""
        return self.hi - self.lo - len(self.skip) + len(self.single)

    def entry(self, j: int) -> _Entry:
        """The run's entry at position ``j``: ``(-estimate, push counter, task)``."""
        return (-self.est[j], self.seq[j], self.tasks[j])

    # -- pushing ------------------------------------------------------------------
    def push(self, est: float, seq: int, task: TaskView) -> None:
        entry = (-est, seq, task)
        self.single.add(entry)
        if self.top is None or entry[:2] < self.top[:2]:
            self.top = entry

    def push_many(self, entries: list[_Entry]) -> None:
        """Entries ``(-estimate, seq, task)`` in push order (seq increasing)."""
        ordered = sorted(entries)  # longest first, then push order (seq is unique)
        ordered.reverse()
        # -(-x) is x, bit for bit: entry(j) gives each entry back as it came
        self._set_run(
            array("d", [-e[0] for e in ordered]),
            array("q", [e[1] for e in ordered]),
            [e[2] for e in ordered],
        )

    def push_batch(self, tasks: Sequence[TaskView], estimates: list[float], first: int) -> None:
        """``push_many`` of ``tasks`` numbered ``first``, ``first + 1``, ...: the same
        run, sorted by numpy when the estimates are plain floats (never compared as
        tuples: a million tuple comparisons cost more than the rest of the push)."""
        est = np.asarray(estimates, dtype=float) if set(map(type, estimates)) == {float} else None
        if est is None or np.isnan(est).any():  # tuples sort NaN their own way: keep theirs
            entries = zip(map(neg_, estimates), itertools.count(first), tasks, strict=False)
            self.push_many(list(entries))
            return
        # The run is ascending (-estimate, seq) reversed: shortest first, equal estimates
        # the later pushed first. With no two estimates equal that is the one ascending
        # order of the estimates, which numpy's default sort finds in a quarter of the
        # time of a stable sort; equal ones (checked on the sorted values) take the
        # stable sort, which orders them by push.
        desc = np.argsort(est)
        ranked = est[desc]
        if len(ranked) > 1 and (ranked[1:] == ranked[:-1]).any():
            desc = np.argsort(-est, kind="stable")[::-1]
            ranked = est[desc]
        order = desc.tolist()
        # the tasks in run order: one C call looks them all up (itemgetter of one
        # position answers the task itself, not a tuple), kept as the tuple it answers
        # (a list copy would touch every task, in scattered order, twice more: on the
        # copy and when the tuple is freed)
        ordered = itemgetter(*order)(tasks) if len(order) > 1 else (tasks[order[0]],)
        self._set_run(
            array("d", ranked.tobytes()),
            array("q", (desc + first).astype(np.int64).tobytes()),
            ordered,
        )

    def _set_run(self, est: array[float], seq: array[int], tasks: Sequence[TaskView]) -> None:
        if self.lo < self.hi:  # an older run still pending: move it to `single`
            skip, entry = self.skip, self.entry
            self.single.update(entry(j) for j in range(self.lo, self.hi) if j not in skip)
            self.top = self.single[0] if self.single else None
        self.est, self.seq, self.tasks = est, seq, tasks
        self.lo = 0
        self.hi = len(est)
        self.skip = {}

    # -- the run's live ends ------------------------------------------------------
    def _run_top(self) -> int:
        """The run's longest live position (below ``lo``: none)."""
        hi = self.hi
        skip = self.skip
        if skip:
            lo = self.lo
            while hi > lo and hi - 1 in skip:
                hi -= 1
                del skip[hi]
            self.hi = hi
        return hi - 1

    def _run_bottom(self) -> int:
        """The run's shortest live position (``hi`` or beyond: none)."""
        skip = self.skip
        lo = self.lo
        if skip:
            hi = self.hi
            while lo < hi and lo in skip:
                del skip[lo]
                lo += 1
            self.lo = lo
        return lo

    def _live_left(self, j: int) -> int:
        """The largest live run position <= ``j`` (below ``lo``: none)."""
        skip = self.skip
        path = []
        while j in skip:
            path.append(j)
            j = skip[j]
        for p in path:
            skip[p] = j
        return j

    # -- queries: (where, entry); `where` is what `take` needs --------------------
    def head(self) -> tuple[object, _Entry] | None:
        """The longest (ties: pushed first)."""
        j = self._run_top()
        first = self.top
        if j >= self.lo:
            top = self.entry(j)
            if first is not None and first[:2] < top[:2]:
                return self.single, first
            return _TOP, top
        return (self.single, first) if first is not None else None

    def low(self) -> tuple[object, _Entry] | None:
        """The shortest (ties: either store's)."""
        j = self._run_bottom()
        single = self.single
        if j < self.hi:
            bottom = self.entry(j)
            if single and single[-1][0] > bottom[0]:
                return single, single[-1]
            return _BOTTOM, bottom
        return (single, single[-1]) if single else None

    def fit(self, limit: float) -> tuple[object, _Entry] | None:
        """The longest task of at most ``limit`` (ties: pushed first)."""
        if limit <= 0:
            return None
        best: tuple[object, _Entry] | None = None
        j = self._live_left(bisect.bisect_right(self.est, limit, self.lo, self.hi) - 1)
        if j >= self.lo:
            best = (j, self.entry(j))
        single = self.single
        k = single.bisect_left((-limit, -1))  # the first entry with estimate <= limit
        if k < len(single):
            e = single[k]
            if best is None or e[:2] < best[1][:2]:
                best = (single, e)
        return best

    def quantile(self, q: float) -> tuple[object, _Entry] | None:
        """A live run entry near quantile ``q`` of the run's estimates (0: shortest)."""
        lo, hi = self.lo, self.hi
        if hi <= lo:
            return None
        j = self._live_left(lo + int(q * (hi - lo)))
        if j < self.lo:
            return None
        return j, self.entry(j)

    def count_below(self, limit: float) -> int:
        """About how many queued tasks have an estimate below ``limit``: exact for single
        pushes; in the run, entries taken from its middle (slow nodes' picks) still count."""
        single = self.single
        n = len(single) - single.bisect_right((-limit, math.inf)) if single else 0
        return n + max(bisect.bisect_left(self.est, limit, self.lo, self.hi) - self.lo, 0)

    def find(self, task: TaskView) -> tuple[object, _Entry] | None:
        """Where ``task`` is queued (what :meth:`take` needs), or None: a bisection on
        its estimate, then a scan of the entries of that same estimate (ties)."""
        e = task.estimate
        if e != e:  # NaN: never found (nor bisected)
            return None
        est, skip, tasks = self.est, self.skip, self.tasks
        j = bisect.bisect_left(est, e, self.lo, self.hi)
        while j < self.hi and est[j] == e:
            if tasks[j] is task and j not in skip:
                return j, self.entry(j)
            j += 1
        single = self.single
        k = single.bisect_left((-e, -1))  # push counters are >= 0
        while k < len(single) and single[k][0] == -e:
            if single[k][2] is task:
                return single, single[k]
            k += 1
        return None

    def take(self, where: object, entry: _Entry) -> TaskView:
        if where is _TOP:
            self.hi -= 1
        elif where is _BOTTOM:
            self.lo += 1
        elif isinstance(where, int):  # the middle of the run
            self.skip[where] = where - 1
        else:
            single = self.single
            single.remove(entry)
            if entry is self.top:
                self.top = single[0] if single else None
        return entry[2]


_TOP = object()  # `take` from the run's long end
_BOTTOM = object()  # from its short end


class _NodeState:
    """What the policy believes about one node."""

    __slots__ = ("announced", "cores", "count", "heads", "logsum", "lows", "speed")

    def __init__(self, cores: int) -> None:
        self.cores = cores
        self.logsum = 0.0  # sum of clamped log(actual / estimate)
        self.count = 0  # finished attempts seen
        self.speed = 1.0  # believed slow-down
        self.announced = 0.0  # log of the belief last announced (see `ended`)
        self.heads = 0  # tasks taken from the long end while unmeasured
        self.lows = 0  # ... and from the short end


class NodeAware(Policy):
    """LPT that learns node speeds online, keeps long tasks off slow nodes and
    judges lateness against the speed of the node an attempt runs on."""

    name = "node-aware"
    capabilities = Capabilities(
        pops=True,
        learns_speeds=True,
        speculates=True,
        reads=frozenset({"task.estimated", "node.waiting", "attempt.policy_state"}),
        started_speed=True,
    )

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
        measure_quantile: float = 0.05,
        interleave: float = 0.0,
        dispatch_rate: float = 0.0,
    ) -> None:
        if not slow_threshold > 1:
            raise ValueError(f"slow_threshold must be > 1, got {slow_threshold!r}")
        if min_samples < 1 or probe < 0 or prior < 0 or margin < 1:
            raise ValueError("need min_samples >= 1, probe >= 0, prior >= 0, margin >= 1")
        if not 0 <= measure_quantile < 1:
            raise ValueError(f"measure_quantile must be in [0, 1), got {measure_quantile!r}")
        self.slow_threshold = slow_threshold
        self.min_samples = min_samples
        self.probe = probe
        self.prior = prior
        self.margin = margin
        self.fill = fill
        self.unmeasured_slowdown = unmeasured_slowdown
        self.measure_quantile = measure_quantile
        if isinstance(interleave, bool) or not (
            isinstance(interleave, int | float) and 0 <= interleave <= 0.5
        ):
            raise ValueError(f"interleave must be in [0, 0.5], got {interleave!r}")
        self.interleave = interleave
        if isinstance(dispatch_rate, bool) or not (
            isinstance(dispatch_rate, int | float) and 0 <= dispatch_rate < math.inf
        ):
            raise ValueError(
                "dispatch_rate must be a finite number of task starts a second >= 0 "
                f"(0: no limit), got {dispatch_rate!r}"
            )
        self.dispatch_rate = float(dispatch_rate)
        self._demand = 0.0  # starts a second the running attempts will ask for (see `pop`)
        self._cores = 0  # cores of the known nodes
        # every `_every`-th task a nominal node takes is the shortest queued one
        self._every = round(1 / interleave) if interleave else 0
        self._nominal_pops = 0
        self._queues: dict[int, _Ladder] = {}
        self._sizes: list[int] = []
        self._one: _Ladder | None = None  # the only queue, while all tasks ask for 1 core
        self._counter = itertools.count()
        self._n = 0
        self._nodes: dict[int, _NodeState] = {}
        self._capacity = 0.0  # sum of cores / believed slow-down
        self._best = 1.0  # smallest believed slow-down, refreshed when a belief moves
        self._best_node: _NodeState | None = None  # whose it is (None: the prior's 1.0)
        # horizon sums
        self._queued_work = 0.0
        self._run_cores = 0
        self._run_end_sum = 0.0  # sum of cores * expected end
        # attempt -> its record (see `started`), for an attempt view without a
        # ``policy_state`` field; attempt views hash by identity (as in Horizon)
        self._run: dict[AttemptView, tuple[int, float, float, float]] = {}
        # the task the inlined path of `pop` returned last, and its estimate
        self._popped: object = None
        self._popped_est = 0.0

    # -- nodes and speeds -------------------------------------------------------
    def add_node(self, index: int, cores: int) -> None:
        old = self._nodes.get(index)
        if old is not None:
            self._capacity -= old.cores / old.speed
            self._cores -= old.cores
        self._nodes[index] = _NodeState(cores)
        self._capacity += cores
        self._cores += cores

    def remove_node(self, index: int) -> None:
        st = self._nodes.pop(index, None)
        if st is not None:
            self._capacity -= st.cores / st.speed
            self._cores -= st.cores
            if st is self._best_node:
                self._rescan_best()

    def speed(self, node: int) -> float:
        try:
            return self._nodes[node].speed
        except KeyError:  # a node not known: nominal
            return 1.0

    def samples(self, node: int) -> int:
        """Finished attempts the speed belief of ``node`` rests on."""
        st = self._nodes.get(node)
        return st.count if st is not None else 0

    def learned(self, node: int) -> tuple[float, int] | None:
        """What ``node``'s belief rests on: (sum of its clamped log ratios, their count);
        None for a node not known. :meth:`relearn` puts it back (a worker that left and
        returns is the same machine: what was measured of it still holds)."""
        st = self._nodes.get(node)
        return (st.logsum, st.count) if st is not None else None

    def relearn(self, node: int, learned: tuple[float, int]) -> None:
        """Restore what :meth:`learned` returned onto ``node`` (added already)."""
        st = self._nodes.get(node)
        if st is None:
            return
        st.logsum, st.count = float(learned[0]), int(learned[1])
        log_new = st.logsum / (st.count + self.prior)
        new = _exp(log_new)
        self._capacity += st.cores * (1.0 / new - 1.0 / st.speed)
        st.speed = new
        st.announced = log_new
        self._rescan_best()

    def measured(self, node: int) -> bool:
        st = self._nodes.get(node)
        return st is not None and st.count >= self.min_samples

    def _rescan_best(self) -> None:
        # the first node of the lowest belief (min keeps the first of equals), its key
        # read in C: this scans every node, each time the fastest node looks slower
        best = min(self._nodes.values(), key=_speed_of, default=None)
        self._best, self._best_node = (best.speed, best) if best is not None else (1.0, None)

    def capacity(self) -> float:
        """Effective cores: ``sum(cores / believed slow-down)`` of the known nodes."""
        return self._capacity

    def horizon(self, now: float) -> float:
        """Projected end of the run from what the policy knows now."""
        remaining = self._run_end_sum - now * self._run_cores
        work = self._queued_work + (remaining if remaining > 0 else 0.0)
        return projected_end(now, work, self._capacity)

    # -- the queue --------------------------------------------------------------
    def _queue(self, cores: int) -> _Ladder:
        q = self._queues.get(cores)
        if q is None:
            q = self._queues[cores] = _Ladder()
            self._sizes.append(cores)
            self._sizes.sort()
            self._one = q if self._sizes == [1] else None
        return q

    def push(self, task: TaskView) -> None:
        c = task.cores
        self._queue(c).push(task.estimate, next(self._counter), task)
        self._queued_work += task.estimate * c
        self._n += 1

    def push_many(self, tasks: Sequence[TaskView]) -> None:
        if len(tasks) >= 256 and len(set(map(_cores_of, tasks))) == 1:
            # one core size (a sweep): one run, sorted in numpy; the same counters,
            # and the same sum of work, added in the same order, as the loop below
            cores = tasks[0].cores
            estimates = list(map(_estimate_of, tasks))
            first = next(self._counter)
            self._counter = itertools.count(first + len(tasks))
            self._queue(cores).push_batch(tasks, estimates, first)
            # (x * 1 is x: one core, the estimates themselves)
            terms: Iterable[float] = estimates if cores == 1 else map(mul, estimates, repeat(cores))
            self._queued_work += reduce(add, terms, 0.0)
            self._n += len(tasks)
            return
        by_cores: dict[int, list[_Entry]] = {}
        counter = self._counter
        work = 0.0
        for t in tasks:
            by_cores.setdefault(t.cores, []).append((-t.estimate, next(counter), t))
            work += t.estimate * t.cores
        for c, entries in by_cores.items():
            self._queue(c).push_many(entries)
        self._queued_work += work
        self._n += len(tasks)

    def _pick(
        self, free: int, how: str, limit: float = 0.0
    ) -> tuple[_Ladder, object, _Entry] | None:
        """Across core-size queues that fit ``free``: the longest (``head``),
        a shortest (``low``) or the longest of at most ``limit`` (``fit``)."""
        best: tuple[_Ladder, object, _Entry] | None = None
        for c in self._sizes:
            if c > free:
                break
            q = self._queues[c]
            got = q.head() if how == "head" else q.low() if how == "low" else q.fit(limit)
            if got is None:
                continue
            e = got[1]
            if best is None:
                best = (q, *got)
            elif how == "low":
                if (-e[0], e[1]) < (-best[2][0], best[2][1]):
                    best = (q, *got)
            elif e[:2] < best[2][:2]:
                best = (q, *got)
        return best

    def _measure_pick(self, free: int) -> tuple[_Ladder, object, _Entry] | None:
        """A task to measure an unmeasured node with: short, but not the shortest.

        The very shortest tasks are what fills the end of the run evenly; spent
        on measuring 24 nodes at time zero they leave the end to longer ones
        (with exact estimates and no failures, the end costs 0.36% of the
        speed bound taking the shortest, 0.28% taking the 5th percentile).
        From the batch run: the task at ``measure_quantile`` of the queued
        estimates; otherwise (several core sizes, or only single pushes) a
        shortest one."""
        q = self._one
        if q is None or not self.measure_quantile:
            return self._pick(free, "low")
        got = q.quantile(self.measure_quantile)
        return (q, *got) if got is not None else self._pick(free, "low")

    def pop(self, node: NodeView, now: float) -> TaskView | None:
        if not self._n:
            return None
        try:
            st = self._nodes[node.index]
        except KeyError:  # a node nobody announced: take it in as nominal, unmeasured
            self.add_node(node.index, node.cores)
            st = self._nodes[node.index]
        s = st.speed
        measured = st.count >= self.min_samples
        if measured and s < self.slow_threshold:
            if self.dispatch_rate:
                found = self._pick(node.free, "low")
                if found is not None and self._dispatch_behind(found[2][2], now):
                    return self._take(*found)
            if self._every:
                self._nominal_pops += 1
                if self._nominal_pops % self._every == 0:
                    found = self._pick(node.free, "low")
                    if found is not None:
                        return self._take(*found)
            one = self._one
            if one is not None:  # the common case, inlined: longest first, one queue
                j = one.hi - 1
                if j >= one.lo and (not one.skip or j not in one.skip):
                    first = one.top
                    est = one.est[j]
                    # the entry (-est, seq) against the longest single push's, as tuples
                    # compare (push counters are unique: never on the task)
                    if first is None or (
                        -est < first[0] or (-est == first[0] and one.seq[j] < first[1])
                    ):
                        # the run's longest is live and longer than any single push
                        one.hi = j
                        # the estimate from the run, not from the task in scattered
                        # memory (x - est is x + -est, bit for bit)
                        self._queued_work -= est
                        self._n -= 1
                        task = one.tasks[j]
                        self._popped = task
                        self._popped_est = est
                        return task
                got = one.head()
                if got is None:
                    return None
                task = one.take(*got)
                self._queued_work -= task.estimate
                self._n -= 1
                return task
            found = self._pick(node.free, "head")
        elif not measured:
            if st.heads < self.probe:
                found = self._pick(node.free, "head")
            elif st.lows < self.min_samples:
                found = self._measure_pick(node.free)  # short tasks measure it soon
            else:  # what would end in time even if the node were `unmeasured_slowdown`x slow
                horizon = self.horizon(now)
                limit = (horizon - now) * self.fill / self.unmeasured_slowdown
                found = self._pick(node.free, "fit", limit) or self._pick(node.free, "low")
        else:
            # A measured slow node: the longest task that ends well before the
            # projected end of the run (leaving the short ones to fill the end
            # on nominal nodes), else a short one if even that ends in time.
            # Work already waiting on the node for its cores starts first (live: dask's
            # worker-saturation hands a worker more tasks than it has threads).
            horizon = self.horizon(now)
            start = now + getattr(node, "waiting", 0.0) * s / st.cores
            found = self._pick(node.free, "fit", self._slow_limit(s, start, horizon))
            if found is None:
                found = self._pick(node.free, "low")
                if found and self._run_cores and start - found[2][0] * s > horizon:
                    return None
        if found is None:
            return None
        q, where, entry = found
        if not measured:  # count what measured it: the long end, or the short one
            if where is _TOP or entry is q.top:  # q.top: the longest singly pushed
                st.heads += 1
            else:
                st.lows += 1
        return self._take(q, where, entry)

    def _slow_limit(self, s: float, start: float, horizon: float) -> float:
        """The longest estimate a node believed ``s`` times slow takes from the long end
        when its slot starts at ``start``: what ends there well before the projected end
        of the run (``fill`` of the time left). The rule of :meth:`pop` for a measured slow
        node, and of :meth:`why_waiting` saying it."""
        return (horizon - start) * self.fill / s

    def why_waiting(self, task: TaskView, now: float) -> str | None:
        """Why queued ``task`` is not started yet, by the rules :meth:`pop` applies to each
        kind of node: a node measured nominal takes the longest first (how many queued
        tasks are longer), a node not measured yet takes short tasks to measure it, a node
        measured slow takes only what ends there well before the projected end of the run
        (:meth:`_slow_limit`) and leaves its slot idle for a task that would end after it.
        O(nodes + b log n) for b core sizes; asked, never on a decision's path."""
        est = task.estimate
        states = list(self._nodes.values())
        if not states:
            return "node-aware knows no worker yet"
        measured = [st for st in states if st.count >= self.min_samples]
        slow = [st.speed for st in measured if st.speed >= self.slow_threshold]
        nominal = len(measured) - len(slow)
        fresh = len(states) - len(measured)
        # queued tasks longer than this one (about: see _Ladder.count_below)
        above = math.nextafter(est, _INF)
        longer = sum(q.n - q.count_below(above) for q in self._queues.values())
        said = [f"node-aware: this task's estimate is {est:.3g} s"]
        if nominal:
            lead = f"{nominal} worker(s) measured nominal take the longest queued task first"
            said.append(
                f"{lead}, and about {longer} queued task(s) are longer"
                if longer
                else f"{lead}, and none queued is longer: it goes to the next of them freed"
            )
        if fresh:
            said.append(f"{fresh} worker(s) not measured yet take short tasks, to measure them")
        if slow:
            s = min(slow)  # the least slow of them: where it would end soonest
            horizon = self.horizon(now)
            kind = f"{len(slow)} worker(s) measured slow (from {s:.3g}x)"
            if est <= self._slow_limit(s, now, horizon):
                said.append(f"{kind} may take it: it would end there well before the projected end")
            elif self._run_cores and now + est * s > horizon:  # pop's test, on its shortest
                said.append(
                    f"{kind} leave it: it would take {est * s:.3g} s there and end after the "
                    f"projected end of the run, in {horizon - now:.3g} s"
                )
            else:
                said.append(
                    f"{kind} take it only when no queued task ends there well before the "
                    f"projected end of the run (in {horizon - now:.3g} s), the shortest first"
                )
        return "; ".join(said)

    def _take(self, q: _Ladder, where: object, entry: _Entry) -> TaskView:
        """Take ``entry`` from ``q`` (as ``_pick`` found it); update the queue's totals."""
        task = q.take(where, entry)
        self._queued_work -= task.estimate * task.cores
        self._n -= 1
        return task

    def _dispatch_behind(self, task: TaskView, now: float) -> bool:
        """Should a nominal node take ``task``, the shortest queued, now (``dispatch_rate``)?

        A task is *dispatch-bound* if every core running tasks that short would ask the
        scheduler for more than ``dispatch_rate`` starts a second (estimate below
        ``cores / dispatch_rate``). Longest-first leaves them all for the end, where the
        scheduler cannot start them fast enough and cores idle. So they are spread over
        the run: a nominal node takes the shortest queued task while it is dispatch-bound
        and the dispatch-bound attempts running ask for fewer starts a second than the
        queued dispatch-bound tasks need to start by the projected end (their count over
        ``horizon - now``); otherwise the longest, as before."""
        est = task.estimate
        limit = self._cores / self.dispatch_rate
        if not 0 < est < limit:
            return False
        left = self.horizon(now) - now
        if left <= 0:
            return False
        bound = sum(q.count_below(limit) for q in self._queues.values())
        return self._demand * left < bound

    def discard(self, task: TaskView) -> None:
        """``task`` left the queue without being popped (a driver ran it where a record
        says it ran: replay's recorded placement): its entry and its queued work go, so
        that the horizon counts only what still waits. O(log n + tasks of equal
        estimate); a task not queued is ignored."""
        q = self._queues.get(task.cores)
        if q is None:
            return
        found = q.find(task)
        if found is not None:
            self._take(q, *found)

    def __len__(self) -> int:
        return self._n

    def hold_key(self, task: TaskView) -> float:
        """Shortest first: what an unmeasured or slow worker should take, when dask fills
        a slot the plugin did not see free."""
        return float(task.estimate)

    # -- attempts ---------------------------------------------------------------
    def started(self, attempt: AttemptView, now: float) -> float:
        """Start the record of ``attempt``: what ``ended`` needs of it, read now that the
        task and the node's belief are at hand (a task view is frozen): ``(cores, cores x
        expected end, estimate, starts a second it asks for)``, the estimate 0.0 when it
        is only a configured default (``estimated`` False: it teaches no speed). On the
        view's own ``policy_state`` field (AttemptView; the simulator's and the plugin's attempts),
        else in a dict entry. Returns the node's believed slow-down (``started_speed``)."""
        t = attempt.task
        # the task just popped (the usual case): its estimate from the queue's run, not
        # from the task's float elsewhere in memory
        est = self._popped_est if self._popped is t else t.estimate
        start = attempt.start
        try:
            speed = self._nodes[attempt.node].speed
        except KeyError:  # a node not known: nominal
            speed = 1.0
        end = start + est * speed
        c = t.cores
        # the starts a second this attempt asks for (cores freed / expected run time)
        ask = (
            c / (end - start)
            if self.dispatch_rate and end > start and est * self.dispatch_rate < self._cores
            else 0.0
        )
        try:
            estimated = t.estimated  # type: ignore[attr-defined]
        except AttributeError:  # the optional field's default
            estimated = True
        ce = c * end
        record = (c, ce, est if estimated else 0.0, ask)
        try:  # the view's own field (AttemptView.policy_state): no dict entry each
            attempt.policy_state = record  # type: ignore[attr-defined]
        except AttributeError:  # a view without it keeps a dict entry
            self._run[attempt] = record
        self._run_cores += c
        self._run_end_sum += ce
        if ask:
            self._demand += ask
        return speed

    def ended(self, attempt: AttemptView, now: float) -> bool:
        """Close the record of ``attempt`` and learn its node's speed from it.

        The one rule for what teaches a speed (the simulator, the plugin and replay all
        call this): a finished attempt of a task with a real estimate (``estimated``,
        True unless the estimate was only a configured default) gives the ratio
        ``run time / estimate``; a primary beaten by its copy (``killed``, not itself a
        copy) that had already run past its estimate gives that ratio as a lower
        bound, or a node whose every task is rescued would never be measured.
        """
        try:
            got = attempt.policy_state  # type: ignore[attr-defined]
        except AttributeError:  # no field (or never set): a dict entry, if it started here
            got = self._run.pop(attempt, None)
        else:
            if got is not None:
                attempt.policy_state = None  # type: ignore[attr-defined]  # closed once
        if got is not None:
            c, ce, est, ask = got  # as `started` read them (est 0.0: not estimated)
            self._run_cores -= c
            self._run_end_sum -= ce
            if ask:
                # nothing running: exactly 0 (float sums of adds and removals drift)
                self._demand = self._demand - ask if self._run_cores else 0.0
        else:
            task = attempt.task
            est = task.estimate if getattr(task, "estimated", True) else 0.0
        # (an estimate that is only a default, 0.0 here, teaches nothing)
        if attempt.outcome == "done":
            if not est > 0:
                return False
            elapsed = now - attempt.start
        else:  # a primary its copy beat after it ran past its estimate: a lower bound
            if attempt.outcome != "killed" or attempt.backup or not est > 0:
                return False
            elapsed = now - attempt.start
            if elapsed <= est:
                return False
        try:
            st = self._nodes[attempt.node]
        except KeyError:  # a node not known (any more)
            return False
        # Learn from the ratio: its log, clamped so that one sample moves the belief by
        # at most 1000x either way (a near-zero estimate must not make a node look
        # infinitely slow), joins the node's sum; the belief is the sum's mean with
        # `prior` samples of 0 (nominal) beside it.
        ratio = elapsed / est
        if not 0.0 < ratio < _INF:  # (NaN fails both)
            return False
        x = _log(ratio)
        logsum = st.logsum + (_MAX_LOG if x > _MAX_LOG else _MIN_LOG if x < _MIN_LOG else x)
        st.logsum = logsum
        count = st.count + 1
        st.count = count
        log_new = logsum / (count + self.prior)
        new = _exp(log_new)
        self._capacity += st.cores * (1.0 / new - 1.0 / st.speed)
        st.speed = new
        # moved by more than 20% either way (abs() without its call): announce it
        moved = log_new - st.announced
        if moved > _RATIO or moved < _NEG_RATIO:
            st.announced = log_new
            if new < self._best:
                self._best, self._best_node = new, st
            elif st is self._best_node:  # the fastest node looks slower now: rescan
                self._rescan_best()
            return True
        return False

    def urgent(self, attempt: AttemptView, now: float) -> bool:
        try:
            st = self._nodes[attempt.node]
        except KeyError:
            return False
        if st.speed < self.slow_threshold:
            return False
        est = attempt.task.estimate
        expected_end = now + expected_left(attempt.start, est, st.speed, now)
        fresh_end = now + est * min(self._best, 1.0) * self.margin
        return expected_end > fresh_end and expected_end > self.horizon(now)

    def calm_below(self) -> float:
        """``urgent`` answers False on a node believed faster than ``slow_threshold``
        (its first test); a subclass with an ``urgent`` of its own gets the base's -inf."""
        return self.slow_threshold if type(self).urgent is NodeAware.urgent else -math.inf

    def describe(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "slow_threshold": self.slow_threshold,
            "min_samples": self.min_samples,
            "probe": self.probe,
            "interleave": self.interleave,
            "dispatch_rate": self.dispatch_rate,
            "speeds": {
                k: round(v.speed, 3) for k, v in self._nodes.items() if abs(v.speed - 1) > 0.05
            },
        }
