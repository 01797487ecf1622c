"""The discrete-event core of the cluster simulator.

Model
=====

A cluster of ``nodes x cores_per_node`` cores runs tasks. A task becomes
*runnable* once it is submitted and every task it depends on has finished; it
is then pushed to the policy. Whenever cores are free the driver offers them to
the policy node by node, lowest node index first (first fit, the classic list
scheduling convention), and the policy picks a task that fits (or none). The
attempt then runs for ``duration x slow-down of its node`` seconds, where the
duration is the task's true duration, which the policy never sees.

With ``failure_rate = p`` each attempt fails with probability ``p`` at a
uniformly drawn point of its run; the task is pushed again and restarts from
the beginning (the lost core-time is *waste*). The fates of the first attempts
of every task are drawn up front, so two policies run on the same seed face the
same failures (common random numbers): a comparison measures the policies, not
the luck of the draw.

With a :class:`~daskjobs.policies.speculation.Speculation` spec, a primary
attempt that is still running at its deadline (``late_factor x estimate x
believed slow-down of its node``), or that the policy calls urgent, gets one
backup copy. Backups are served before queued tasks, on a node other than the
primary's that the policy does not believe slower, within a cap on concurrent
backups. The first copy to finish wins; the other is killed and its core-time
counted as waste (with ``Cluster(stops_losers=False)``, as dask, it holds its cores
until it would have ended or the policy reclaims its thread). If one copy fails
while the other runs, the other carries on. With ``Speculation(endgame=True)``, once
every task is submitted and has started and the policy's queue is empty, the idle
nodes are offered for copies of the running primaries after an event, again once
``1 + running / 64`` events have passed (an ask judges every running primary; at each
periodic check with ``interval``), and the copies placed start at once. Every one
of these answers is the policy's one call, ``Speculation.decide``: the loop only
notices when to ask it and enacts the answer.

Tasks in ``cache`` are hits: they finish at their submission, take no time and
no core, and do not wait for their inputs. A task that is not cached and that
only cached tasks (transitively) read is *pruned*: nobody needs its output.

Learning estimates
==================

With ``learn`` (``True``, or a :class:`~daskjobs.policies.durations.Estimator` to
learn into), a task without an estimate of its own (``estimated=False``: the
configured default) gets one from the duration models, as the live plugin gives
it: at its submission, the prediction of its stage's model over its ``params``
(``source`` model), else the stage's median (history), else it keeps its default.
Every finished task with a ``stage`` teaches its stage its *true* duration (the
nominal one: what a worker's speed-normalised measurement gives live); policies
still only see estimates. When the estimator says a stage is
:meth:`~daskjobs.policies.durations.Estimator.due` (after its 1st, 2nd, 4th, ...
512th completion, then every 512th), the stage's learned tasks that have not started
yet are estimated afresh and the runnable ones pushed to the policy again with
their new estimate (``push_many``): the policy ranks them, as live it re-ranks
them. The entry a task had before is left where it is, and the driver skips it
when the policy pops it (the rule of :meth:`Policy.discard
<daskjobs.policies.Policy.discard>`: a driver skips a popped task it no longer
holds), so a policy needs nothing new to be re-ranked (critical path adds the
tail a task's dependents gave it at ``add_graph`` to its new estimate). A
task without a ``stage`` neither learns nor is learned. Learning off (the
default) runs exactly the same loop without it.

Everything random (failures) comes from ``numpy.random.default_rng(seed)``;
the event order is total (time, kind,
sequence number), so a run is reproducible bit for bit.

The engine
==========

One run is one ``_Engine``: its state is attributes (per-task flat arrays, the
event calendar, the bookkeeping of copies), and its parts are methods named for what
they do, each calling the policy's own methods:

* ``submit``: the tasks submitted at a time join the policy's graph
  (``add_graph``); ``ready`` pushes each whose inputs are done (``push``).
* ``start``: an attempt takes a node's free cores, its fate (done or failed, and
  when) is queued as its end event, and the policy is told (``started``);
  ``judge_lateness`` gives a primary its deadline by the policy's rule
  (``Speculation.deadline``), queues its check and asks ``urgent``.
* ``finish``: an attempt ends (done, failed or killed): its cores return and the
  policy is told (``ended``); once a task is done its other copies are killed
  through it, ``fail`` retries a task, and ``rejudge`` re-judges a node's attempts
  when the policy's belief of its speed moves.
* ``release``: a held loser's thread returns, or the policy reclaims it.
* ``tick``: the periodic check; ``check``, ``judge``, ``ask``, ``rescue``,
  ``take_backup`` and ``spare``: the copies. Every copy decision is the policy's
  one call, ``Speculation.decide``; the engine only notices when to ask it and
  enacts its answer.
* ``kernel``: the event loop, which calls all of the above.

The kernel is the one long function, on purpose: it inlines the end of an
attempt that is done, the start of a first run or a retry (its lateness judged
with the policy's own ``Speculation.deadline``) and the calendar's ``post``, with
the names they read bound to locals, because that code runs for nearly every
event and every start, where a call and attribute reads would be a large share
of a run's cost on CPython. ``reference=True`` runs the slow reference path
instead: every attempt starts and ends through the named parts, and every hook of
the policy is called (none skipped as the base class's);
tests/sim/test_sim_reference.py compares the two, event for event.

Cost
====

Each task costs a handful of heap operations: O(log n) for the policy's queue,
O(log N) to find the lowest free node among N, and for its events a calendar of
buckets of simulated time: an event is appended to its bucket's list, a bucket
is sorted once when the run reaches it, and only the buckets' numbers sit in a
heap (O(log b) a bucket for b buckets, ~64 events each), so that a cluster with
tens of thousands of running attempts does not pay a cache miss per level of a
heap of their times. The width changes no schedule
(tests/sim/test_sim_properties.py runs the same workloads at four widths). Nothing
scans all tasks or all running attempts per decision. Learning costs an O(1)
observation per finished task and, at the cadence above, a prediction and a push
per waiting task of the stage that became due (per-stage waiting sets; nothing
else is scanned).
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
from array import array
from collections import deque
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from itertools import repeat
from operator import attrgetter, eq
from typing import Any, NamedTuple

import numpy as np

from daskjobs.policies.base import Policy
from daskjobs.policies.durations import Estimator
from daskjobs.policies.speculation import Copy, Speculation, SpeculationDecision
from daskjobs.sim.fates import FATES, check_seed, draw_fates
from daskjobs.sim.model import Attempt, Cluster, Task, topological_order
from daskjobs.sim.schedule import Schedule

__all__ = ["simulate"]

_DONE, _FAIL, _CHECK, _TICK, _RECLAIM = 0, 1, 2, 3, 4
_SUSPECT = 1.25  # believed slow-down above which idle capacity re-judges a node's attempts


_INF = math.inf
_RUNS = itertools.count(1)  # run stamps, see _Engine._set_tasks
_Event = tuple[float, int, int, Attempt]  # (time, kind, sequence number, attempt)
_PER_BUCKET = 64  # events a bucket of the event calendar holds on a busy cluster (width)


class _Offer:
    """A free node offered to a pending copy (a ``Speculation.Candidate``)."""

    __slots__ = ("cores", "free", "index")
    copies = 0
    same_host = False  # a simulated node is its own host

    def __init__(self, index: int, free: int, cores: int) -> None:
        self.index = index
        self.free = free
        self.cores = cores

    @property
    def name(self) -> str:
        return f"node {self.index}"


class _Loser(NamedTuple):
    """A killed copy whose thread runs on (a ``Speculation.Loser``)."""

    node: int
    key: Hashable
    released: float
    estimate: float


class _Node:
    """A node as the policy sees it when the driver offers its free cores."""

    __slots__ = ("base", "cores", "free", "freeheap", "index")

    def __init__(self, index: int, cores: int) -> None:
        self.index = index
        self.cores = cores
        self.free = cores
        self.base = index * cores
        # free cores (global ids) as a stack: pop() gives the lowest first, then the last
        # freed; ``free`` is its length
        self.freeheap = list(range(self.base + cores - 1, self.base - 1, -1))

    @property
    def core(self) -> int:
        """Global id of the lowest free core (the optional field ``node.core``, for
        per-core policies), -1 if none: worked out when read. A policy that declares it
        reads it (``capabilities.reads``) is offered :class:`_CoreNode` instead."""
        return self.freeheap[-1] if self.freeheap else -1

    def __repr__(self) -> str:
        return f"<node {self.index} free={self.free}/{self.cores}>"


class _CoreNode(_Node):
    """A node whose ``core`` the engine keeps as it starts and ends attempts (a slot, not
    the property): for a policy that declares it reads ``node.core``, which it reads at
    every pop."""

    __slots__ = ("core",)

    def __init__(self, index: int, cores: int) -> None:
        super().__init__(index, cores)
        self.core = self.base  # type: ignore[misc]  # the slot, not the property


def _validate(tasks: Sequence[Task], cluster: Cluster) -> None:
    """Check ``tasks`` against ``cluster``.

    One pass per check, in C where it can be (``map`` over attribute getters,
    a set of the ids: hashing a million ids costs half as much as building the
    ``{tid: position}`` dict, which only a graph with edges needs); a slow loop
    runs only to name the offending task."""
    if not set(map(type, tasks)) <= {Task}:
        for t in tasks:
            if not isinstance(t, Task):
                raise TypeError(
                    f"expected daskjobs.sim.Task objects, got {type(t).__name__}: {t!r}"
                )
    if len(set(map(_get_tid, tasks))) != len(tasks):
        seen: set[Hashable] = set()
        for t in tasks:
            if t.tid in seen:
                raise ValueError(f"duplicate task id {t.tid!r}")
            seen.add(t.tid)
    cpn = cluster.cores_per_node
    if tasks and max(map(_get_cores, tasks)) > cpn:
        t = next(t for t in tasks if t.cores > cpn)
        raise ValueError(
            f"task {t.tid!r} needs {t.cores} cores but a node has only {cpn}: it can never run"
        )


def _positions(tasks: Sequence[Task]) -> dict[Hashable, int]:
    """``{tid: position in tasks}``."""
    return dict(zip(map(_get_tid, tasks), range(len(tasks)), strict=True))


def _records(
    attempts: list[Attempt],
    n: int,
    t_start: array[float],
    t_end: array[float],
    att_ti: array[int],
    att_start: array[float],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per task, from the attempts (in start order): first start, end and node
    of the winning attempt, attempts made, and whether it finished.
    ``t_start`` / ``t_end`` hold the times of tasks that never ran (cached);
    ``att_ti`` / ``att_start`` each attempt's task position and start, appended as it
    started (read back from the attempts, each a pointer to a scattered int or float,
    they cost a cache miss an attempt).

    Done once after the run, in numpy, instead of four scattered writes per
    attempt inside the event loop; each field read in C (``map`` of an attribute
    getter), over every attempt: nearly all of them won, and a list of the winners
    would cost a pass of its own."""
    m = len(attempts)
    ti = np.frombuffer(att_ti, dtype=np.int64, count=m)
    st = np.frombuffer(att_start, dtype=float, count=m)
    won = np.fromiter(map(eq, map(_get_outcome, attempts), repeat("done")), dtype=bool, count=m)
    start = np.array(t_start, dtype=float)
    end = np.array(t_end, dtype=float)
    node = np.full(n, -1, dtype=np.int64)
    made = np.bincount(ti, minlength=n)  # attempts a task made
    if m:
        # the first attempt of each task: a task of one attempt (nearly all) has it
        # there; only the attempts of the others are sorted (np.unique of every
        # attempt sorts a million of them to find the few tasks that ran twice)
        again = made[ti] > 1
        first = np.flatnonzero(~again)
        if again.any():
            rerun = np.flatnonzero(again)
            first = np.concatenate([first, rerun[np.unique(ti[rerun], return_index=True)[1]]])
        start[ti[first]] = st[first]
        w = np.flatnonzero(won)
        end[ti[w]] = np.fromiter(map(_get_end, attempts), dtype=float, count=m)[w]
        node[ti[w]] = np.fromiter(map(_get_node, attempts), dtype=np.int64, count=m)[w]
    finished = np.zeros(n, dtype=bool)
    finished[ti[won]] = True
    return start, end, node, made.astype(np.int64), finished


#: The slots of a Task, copied onto a re-estimated one (see _Engine.estimate).
_TASK_SLOTS: tuple[str, ...] = tuple(Task.__slots__)
_get_tid = attrgetter("tid")
_get_submit = attrgetter("submit")
_set_ti = Task.__dict__["_ti"].__set__  # the slot's setter (a frozen Task refuses setattr)
_get_cores = attrgetter("cores")
_get_deps = attrgetter("deps")
_get_estimated = attrgetter("estimated")
_get_speculate = attrgetter("speculate")
_get_end = attrgetter("end")
_get_node = attrgetter("node")
_get_outcome = attrgetter("outcome")
_aid = attrgetter("aid")


def _prune(order: Sequence[Task], cached: set[Hashable]) -> set[Hashable]:
    """Tasks not cached whose every reader is cached or pruned (and that have readers)."""
    readers: dict[Hashable, list[Hashable]] = {}
    for t in order:
        for d in t.deps:
            readers.setdefault(d, []).append(t.tid)
    pruned: set[Hashable] = set()
    for t in reversed(order):
        r = readers.get(t.tid)
        if t.tid in cached or not r:
            continue
        if all(x in cached or x in pruned for x in r):
            pruned.add(t.tid)
    return pruned


def _learner(learn: bool | Estimator) -> Estimator | None:
    """The estimator ``simulate(..., learn=...)`` learns into (None: learning off)."""
    if isinstance(learn, Estimator):
        return learn
    if learn is True:
        return Estimator(default=1.0)  # a task with nothing learned keeps its own default
    if learn is False or learn is None:
        return None
    raise TypeError(
        f"learn must be True, False or a daskjobs.policies.durations.Estimator, "
        f"got {type(learn).__name__} {learn!r}"
    )


def _predict(
    learner: Estimator, stage: str, params: Sequence[Mapping[str, Any] | None]
) -> list[float] | None:
    """The estimated seconds of each task of ``stage`` with these ``params``, as
    :meth:`Estimator.predict <daskjobs.policies.durations.Estimator.predict>` answers
    without an annotation (a model, else the stage's median), with one matrix product for
    the batch; None: nothing measured of the stage yet (each task keeps its default)."""
    preds = learner.models.predict_many(stage, params if learner.learn else [None] * len(params))
    if preds is None:
        return None
    return [p.seconds for p in preds]


def simulate(
    tasks: Iterable[Task],
    cluster: Cluster,
    policy: Policy,
    spec: Speculation | None = None,
    cache: Collection[Hashable] | None = None,
    seed: int = 0,
    check_phase: float = 0.0,
    reference: bool = False,
    learn: bool | Estimator = False,
    not_before: Mapping[Hashable, float] | None = None,
) -> Schedule:
    """Simulate ``tasks`` on ``cluster`` under ``policy``; see the module docs.

    ``spec`` turns on backup copies of late attempts; ``cache`` holds the ids
    of tasks whose results are stored (hits take no time); ``seed`` seeds the
    failure draws. A policy object keeps state: pass a fresh one per run.
    With ``spec.interval`` > 0, running attempts are judged on a periodic
    check at ``check_phase + k * interval`` (as the plugin judges them; a
    replay passes the recorded run's phase), not at once, and a copy that waits
    for a free slot is placed at a check, as the plugin places it.

    ``reference=True`` runs the slow reference path: where the engine's kernel inlines
    the start and the end of an attempt for speed, or skips a hook the policy leaves as
    the base class has it (``speed``, ``urgent``, ``started``, ``ended``), it calls the
    engine's part and the hook instead. Same schedule, event for event
    (tests/sim/test_sim_reference.py).

    ``learn=True`` estimates the tasks without an estimate (``estimated=False``) from the
    durations the run measures, and re-ranks them as it learns (module docs, "Learning
    estimates"); pass an :class:`~daskjobs.policies.durations.Estimator` instead to start
    from its history (a later sweep), to keep stage medians only (``learn=False`` on
    it), or to read its models after the run (``schedule.estimator`` is it).

    ``not_before`` maps task ids to times: such a task's attempts (not its copies) start
    no sooner, a node the policy gave it earlier held for it until then (a replay of a
    recorded run on its recorded timeline: ``replay(..., placement="recorded")`` passes
    when each task started). An attempt is judged late or urgent only once it started.
    """
    learner = _learner(learn)
    gc_was_on = gc.isenabled()
    gc.disable()  # millions of small acyclic records: the cyclic GC only costs time here
    try:
        return _simulate(
            list(tasks),
            cluster,
            policy,
            spec,
            cache,
            seed,
            check_phase,
            reference,
            learner,
            not_before,
        )
    finally:
        if gc_was_on:
            gc.enable()


def _simulate(
    tasks: list[Task],
    cluster: Cluster,
    policy: Policy,
    spec: Speculation | None,
    cache: Collection[Hashable] | None,
    seed: int,
    check_phase: float = 0.0,
    reference: bool = False,
    learner: Estimator | None = None,
    not_before: Mapping[Hashable, float] | None = None,
) -> Schedule:
    if not isinstance(cluster, Cluster):
        raise TypeError(f"cluster must be a daskjobs.sim.Cluster, got {type(cluster).__name__}")
    if not isinstance(policy, Policy):
        raise TypeError(
            f"policy must be a daskjobs policy object (e.g. LPT()), got {type(policy).__name__}"
        )
    seed = check_seed(seed)
    if spec is not None and not isinstance(spec, Speculation):
        raise TypeError(f"spec must be a Speculation or None, got {type(spec).__name__}")
    run = _Engine(
        tasks, cluster, policy, spec, cache, seed, check_phase, reference, learner, not_before
    )
    run.kernel()
    return run.result()


class _Engine:
    """One simulation: its state as attributes, its parts as methods (module docs,
    "The engine"). Built once per run; :meth:`kernel` runs it, :meth:`result` reads it."""

    def __init__(
        self,
        tasks: list[Task],
        cluster: Cluster,
        policy: Policy,
        spec: Speculation | None,
        cache: Collection[Hashable] | None,
        seed: int,
        check_phase: float,
        reference: bool,
        learner: Estimator | None,
        not_before: Mapping[Hashable, float] | None = None,
    ) -> None:
        self.cluster = cluster
        self.policy = policy
        self.spec = spec
        self.seed = seed
        self.reference = reference
        self.learner = learner
        order = self._set_tasks(tasks, cluster, cache)
        self._set_speculation(spec)
        self._set_learning(learner)
        self._set_submissions(order)
        self._set_cluster(cluster, policy, seed)
        self._set_not_before(not_before)
        self._set_calendar(cluster, spec, check_phase)
        self._set_hooks(policy, spec, reference)

    # -- set up ---------------------------------------------------------------------------
    def _set_tasks(
        self, tasks: list[Task], cluster: Cluster, cache: Collection[Hashable] | None
    ) -> Sequence[Task]:
        """The tasks as the run keeps them: cached hits and pruned tasks known, each
        stamped with its position, durations and estimates in flat arrays, the graph as
        counts of inputs and lists of readers. Returns the tasks in topological order."""
        _validate(tasks, cluster)
        self.has_deps = has_deps = any(map(_get_deps, tasks))
        order = topological_order(tasks) if has_deps else tasks
        self.cached_ids = cached_ids = set(cache) if cache else set()
        self.pruned = pruned = _prune(order, cached_ids) if (cached_ids and has_deps) else set()
        if pruned:
            tasks = [t for t in tasks if t.tid not in pruned]
            order = [t for t in order if t.tid not in pruned]
        self.tasks = tasks
        self.n = n = len(tasks)
        # Each task also carries its position, so that the task a policy returns is
        # found without a lookup in a million-entry dict (a cache miss per task when
        # tasks come back in estimate order). The position is stamped with a number
        # unique to this run: a stamp another simulation of the same Task objects
        # wrote (another thread, an earlier run) falls outside this run's range and
        # the dict answers instead.
        self.stamp = stamp = next(_RUNS) << 32
        if n >= 1 << 32:
            raise ValueError(f"at most 2**32 - 1 tasks per simulation, got {n}")
        # (the slot's own setter mapped over the tasks, consumed in C: no bytecode per task)
        deque(map(_set_ti, tasks, range(stamp, stamp + n)), maxlen=0)
        # Per-task state lives in flat arrays (8 bytes or 1 byte a task), not in
        # lists of Python objects: a policy such as LPT returns tasks in an order
        # unrelated to their index, and on a million tasks every pointer chased to
        # a scattered float costs a cache miss. Flat arrays stay dense enough to
        # be served from cache (docs/benchmarks.md: with the stamps above and the
        # float event heap of the time, LPT ran 1.3x faster on a million tasks).
        self.dur = dur = array("d", [t.duration for t in tasks])
        self.est = est = array("d", [t.estimate for t in tasks])
        # ... and the two side by side, task i's at 2i and 2i + 1, for the start of an
        # attempt, which reads both (with backups): one scattered read, not two
        pair = np.empty((n, 2))
        pair[:, 0] = np.frombuffer(dur, dtype=float, count=n)
        pair[:, 1] = np.frombuffer(est, dtype=float, count=n)
        self.dur_est = array("d", pair.tobytes())
        del pair
        self.is_cached = is_cached = (
            bytearray(t.tid in cached_ids for t in tasks) if cached_ids else bytearray(n)
        )
        self.waiting = waiting = array("q", bytes(8 * n))
        # {tid: position}: for the graph's edges, and for a task a policy returns that
        # does not carry this run's stamp (built on first need)
        self.index: dict[Hashable, int] | None = _positions(tasks) if has_deps else None
        self.dependents: list[Sequence[int]]
        if has_deps:
            index = self.index
            assert index is not None
            readers: list[list[int]] = [[] for _ in range(n)]
            for i, t in enumerate(tasks):
                if not is_cached[i]:
                    deps = set(t.deps)
                    waiting[i] = len(deps)
                    for d in deps:
                        readers[index[d]].append(i)
            self.dependents = list(readers)
        else:
            self.dependents = [()] * n
        self.submitted = bytearray(n)
        self.done = bytearray(n)
        # first start and end of the tasks that never run (cached); the others'
        # come from the attempts once the run is over
        self.t_start = array("d", [math.nan]) * n
        self.t_end = array("d", [math.nan]) * n
        return order

    def _set_speculation(self, spec: Speculation | None) -> None:
        """Which tasks may ever get a copy, and the bookkeeping of the copies asked for."""
        n = self.n
        tasks = self.tasks
        # the running attempts of the tasks that have (had) a backup, in start order: only
        # copies run side by side, so the tasks without one need no entry at all (a
        # million-entry array read at every start and end costs a cache miss each)
        self.copies: dict[int, list[Attempt]] = {}
        self.backup_asked = bytearray(n)
        # which tasks may ever get a copy: the policy's rule (Speculation.may_copy), once
        if spec is None:
            copyable = bytearray(n)
        elif (
            type(spec).may_copy is Speculation.may_copy
            and all(map(_get_estimated, tasks))
            and False not in set(map(_get_speculate, tasks))
        ):  # the plain rule, and no task it refuses (asked in C: no call per task)
            copyable = bytearray(b"\x01") * n
        else:
            copyable = bytearray(map(bool, map(spec.may_copy, tasks)))
        self.copyable = copyable
        self.copy_all = spec is not None and all(copyable)  # no need to read it per start
        # every copy decision is the policy's one call (Speculation.decide): the engine
        # only notices when to ask it (a deadline reached, a speed belief changed, a
        # periodic check, a free slot for a waiting copy) and enacts its answer
        self.decide = spec.decide if spec is not None else None
        self.speculating = spec is not None  # (a bool: the kernel tests it for every attempt)
        self.ahead: set[Attempt] = set()  # pending copies allowed ahead of queued work
        # attempts started so far, of the tasks that may start again (a failure, or a
        # copy past the first): a task absent has started none (or one, if a backup starts)
        self.again: dict[int, int] = {}

    def _set_learning(self, learner: Estimator | None) -> None:
        """Learning estimates (module docs): the tasks the learner estimates (no estimate
        of their own, a stage, not cached), each one's stage, and per stage the learned
        tasks submitted and not started yet (insertion-ordered: submission order)."""
        self.learned = bytearray(self.n)
        self.stage_at: list[str | None] = []
        self.waiting_of: dict[str, dict[int, None]] = {}
        if learner is not None:
            is_cached = self.is_cached
            self.stage_at = [t.stage for t in self.tasks]
            self.learned = bytearray(
                not t.estimated and t.stage is not None and not is_cached[i]
                for i, t in enumerate(self.tasks)
            )

    def _set_submissions(self, order: Sequence[Task]) -> None:
        """The submissions, in topological order within each submit time."""
        tasks = self.tasks
        n = self.n
        first_submit = tasks[0].submit if n else 0.0
        # (every submit time compared with the first in C: a million tasks, no bytecode each)
        if not self.has_deps and all(map(eq, map(_get_submit, tasks), repeat(first_submit))):
            subs: Sequence[int] = range(n)
        else:
            subs = sorted(range(n), key=lambda i: tasks[i].submit)
            if self.has_deps:
                pos = {t.tid: k for k, t in enumerate(order)}
                subs.sort(key=lambda i: (tasks[i].submit, pos[tasks[i].tid]))
        self.subs = subs
        self.sub_ptr = 0
        self.t_sub = tasks[subs[0]].submit if n else _INF  # the next submission's time
        # a sweep submitted at once, without inputs to wait for, nothing cached and nothing
        # to learn: one batch of every task, built without a step per task
        self.one_batch = type(subs) is range and not self.cached_ids and self.learner is None

    def _set_cluster(self, cluster: Cluster, policy: Policy, seed: int) -> None:
        """The nodes as the policy sees them, the dispatcher, and the fates of attempts."""
        # node.core kept as attempts start and end, for a policy that declares it reads it;
        # any other policy reading it gets it worked out (the same value)
        self.keep_core = "node.core" in policy.capabilities.reads
        node_cls = _CoreNode if self.keep_core else _Node
        self.nodes = nodes = [node_cls(k, cluster.cores_per_node) for k in range(cluster.nodes)]
        self.speeds = cluster.speeds
        self.overhead = cluster.overhead
        # one dispatcher for the cluster: each start takes `gap` seconds of it, in turn
        self.gap = 1.0 / cluster.dispatch_rate if cluster.dispatch_rate else 0.0
        self.dispatcher_free = -math.inf
        for nd in nodes:
            policy.add_node(nd.index, nd.cores)
        self.free_heap = list(range(cluster.nodes))  # nodes with free cores (lazy)
        self.in_heap = [True] * cluster.nodes
        self.rate = rate = cluster.failure_rate
        self.rng = rng = np.random.default_rng(seed)
        self.draws: list[float] = []
        self.draw_ptr = 0
        self.fails: list[dict[int, float]] = []
        if rate:
            # the fates of the first attempts of every task, up front (common random
            # numbers); attempts past the first few (rare) draw in start order
            self.fails = draw_fates(rng, self.n, rate)
        self.first_fates = self.fails[0] if self.fails else {}  # of the first attempts

    def _set_not_before(self, not_before: Mapping[Hashable, float] | None) -> None:
        """The earliest start of the tasks that have one (``simulate(not_before=...)``), by
        position; empty (the common case: one test per start) without."""
        self.not_before: dict[int, float] = {}
        if not not_before:
            return
        if self.index is None:
            self.index = _positions(self.tasks)
        index = self.index
        for tid, when in not_before.items():
            if not (isinstance(when, int | float) and math.isfinite(when)):
                raise ValueError(f"not_before[{tid!r}] must be a finite time, got {when!r}")
            i = index.get(tid)
            if i is not None:
                self.not_before[i] = float(when)

    def _set_calendar(self, cluster: Cluster, spec: Speculation | None, check_phase: float) -> None:
        """The event calendar, the attempts' records, and the bookkeeping of copies, periodic
        checks and the end game."""
        # The event queue: a calendar of buckets of ``width`` seconds of simulated time.
        # An event ``(time, kind, seq, attempt)`` goes into the list of its bucket
        # (``int(time / width)``, a dict entry); a heap holds the buckets' numbers. The
        # earliest bucket, once reached, is sorted (``cur``, latest first, popped from the
        # end); an event posted into it or an earlier one (a time at or near ``now``) goes
        # to the small heap ``soon``. Events run in (time, kind, seq) order, exactly as one
        # heap of tuples would run them. The width holds about ``_PER_BUCKET`` events of a
        # busy cluster: a bucket is sorted in C at once, and the heap of buckets is that
        # many times smaller than a heap of every event (with 38,400 running attempts, a
        # heap of their times costs a cache miss per level; docs/benchmarks.md).
        n = self.n
        speeds = self.speeds
        mean_run = (float(np.frombuffer(self.dur, dtype=float).mean()) if n else 0.0) * (
            sum(speeds) / len(speeds)
        ) + self.overhead
        width = _PER_BUCKET * mean_run / cluster.total_cores if mean_run > 0 else 1.0
        if not math.isfinite(width):
            width = 1.0
        # at least a nanosecond: with tasks of subnormal length, a bucket's number for a
        # time of seconds (time / width) would overflow a float
        width = max(width, 1e-9)
        self.inv_width = 1.0 / width
        self.far: dict[int, list[_Event]] = {}  # bucket number -> its events, unsorted
        self.buckets: list[int] = []  # heap of the numbers of the buckets in `far`
        self.cur_b = -(1 << 62)  # the current bucket's number (the kernel holds the bucket)
        self.soon: list[_Event] = []  # heap: events posted into the current bucket or before
        self.seq = 0
        self.attempts: list[Attempt] = []
        # each attempt's task position and start, in start order (for _records)
        self.att_ti = array("q")
        self.att_start = array("d")
        self.pending: list[Attempt] = []  # primaries waiting for a backup slot
        self.slots = slots = cluster.total_cores
        # losers that hold their cores (a cluster that cannot stop them, as dask cannot)
        self.holds = not cluster.stops_losers
        self.held: dict[Attempt, None] = {}
        self.cap = spec.cap(slots) if spec else 0
        self.backups_running = 0
        self.backups_launched = 0
        self.backups_won = 0
        self.suspects: set[int] = set()
        self.n_events = 0
        # A periodic check (spec.interval > 0, as the plugin runs one): a late attempt is
        # seen at the first check past its deadline, and urgency is judged at every check
        # for the running primaries (``watch``, in start order), not at events.
        self.interval = spec.interval if spec is not None else 0.0
        if not math.isfinite(check_phase):
            raise ValueError(f"check_phase must be a finite number of seconds, got {check_phase!r}")
        self.check_phase = check_phase
        self.tick_at = _INF  # the next periodic check queued
        self.watch: dict[Attempt, None] = {}
        # The end game (Speculation.endgame): once no task waits to start (every task
        # submitted and started once, the policy's queue empty), the idle nodes are offered
        # to the policy for copies of the running primaries (``watch`` holds them, as it
        # does for a periodic check): after every event, or with a periodic check at each
        # check.
        self.endgame = spec is not None and spec.endgame
        # the live tasks made runnable so far (counted where they become so, not at each
        # start): with all of them runnable and the policy's queue empty, every task has
        # started at least once (what the queue held was popped, and what is popped starts)
        self.n_ready = 0
        self.n_live = n - self.is_cached.count(1)
        self.ticked = False  # a periodic check ran at this time

    def _set_hooks(self, policy: Policy, spec: Speculation | None, reference: bool) -> None:
        """The policy's hooks the engine calls, and which of them it may skip or inline
        (none on the reference path)."""
        self.push = policy.push
        cls = type(policy)
        self.started = policy.started if reference or cls.started is not Policy.started else None
        self.ended = policy.ended if reference or cls.ended is not Policy.ended else None
        interval = self.interval
        # which attempts run on each node: only needed to re-judge them for backups at
        # once (only a policy that learns speeds, through `ended`, ever re-judges them;
        # with a periodic check, `watch` holds the running primaries instead)
        self.track = self.ended is not None and spec is not None and not interval
        # idle capacity rescues attempts on suspect nodes (judged at once: no periodic check)
        self.rescues = spec is not None and not interval
        # the attempt each core started last (with `track`): a node's running attempts are
        # those of its cores without an outcome yet, as a core runs one attempt at a time (a
        # store per start, not a set's add and discard per attempt)
        self.on_core: list[Attempt | None] = [None] * self.cluster.total_cores if self.track else []
        self.p_speed = p_speed = policy.speed
        p_urgent = policy.urgent
        # hooks a policy leaves as the base class has them are skipped in the hot path
        self.urgent_hook = p_urgent if cls.urgent is not Policy.urgent else None
        self.speed_hook = p_speed if cls.speed is not Policy.speed else None
        # the policy's lateness rule (Speculation.deadline), called as it is by the kernel
        # and by `judge_lateness`: the engine keeps no copy of it
        self.deadline = spec.deadline if spec is not None else None
        # an attempt that is done ends through `finish`, not the kernel's inlined copy of
        # it, on the reference path and when learning (which then learns from it: not the
        # benchmarked path, so its one test per attempt is not paid by every run)
        self.slow_done = reference or self.learner is not None
        # `started` answers the node's speed (not on the reference path, which asks `speed`)
        self.started_speed = policy.capabilities.started_speed and self.speed_hook is not None
        # below this believed slow-down of its node an attempt is not urgent (the policy's
        # own bound, Policy.calm_below): the kernel asks `urgent` only at or above it
        self.calm = policy.calm_below() if self.urgent_hook is not None else -math.inf
        if reference:
            self.urgent_hook = p_urgent
            self.speed_hook = p_speed
            self.started_speed = False
            self.calm = -math.inf

    # -- events ---------------------------------------------------------------------------
    def post(self, when: float, e: _Event) -> None:
        """Queue event ``e`` (its first item is ``when``) at ``when``; an event at
        infinity never runs (the loop ends first) and is not queued."""
        if when == _INF:
            return
        b = int(when * self.inv_width)
        if b > self.cur_b:
            x = self.far.get(b)
            if x is None:
                self.far[b] = [e]
                heapq.heappush(self.buckets, b)
            else:
                x.append(e)
        else:
            heapq.heappush(self.soon, e)

    def queue(self, when: float, kind: int, a: Attempt) -> None:
        """Queue an event of ``kind`` for attempt ``a`` at ``when``, numbered in turn."""
        self.seq += 1
        self.post(when, (when, kind, self.seq, a))

    def on_check(self, t: float) -> float:
        """The time the driver sees ``t``: ``t`` itself, or the first periodic check at or
        after it."""
        interval = self.interval
        if not interval:
            return t
        k = math.ceil((t - self.check_phase) / interval)
        at = self.check_phase + k * interval
        return at if at >= t else at + interval

    def queue_tick(self, now: float, a: Attempt) -> None:
        """A primary started at ``now`` with no periodic check queued: queue the next."""
        tick_at = self.on_check(now)
        if tick_at == now:
            tick_at += self.interval  # this check ran before the start
        self.tick_at = tick_at
        self.queue(tick_at, _TICK, a)

    # -- submit ---------------------------------------------------------------------------
    def submit(self, now: float) -> float:
        """The submissions at ``now``: added to the policy's graph, the runnable ones
        pushed. Returns the time of the next submission."""
        tasks = self.tasks
        n = self.n
        policy = self.policy
        if self.one_batch:
            self.sub_ptr = n
            policy.add_graph(tasks[:])
            self.submitted[:] = b"\x01" * n
            self.n_ready += n
            policy.push_many(tasks[:])
        else:
            subs = self.subs
            sub_ptr = self.sub_ptr
            batch = []
            while sub_ptr < n and tasks[subs[sub_ptr]].submit == now:
                batch.append(subs[sub_ptr])
                sub_ptr += 1
            self.sub_ptr = sub_ptr
            if self.learner is not None:
                self.submit_learned(batch)
            is_cached = self.is_cached
            policy.add_graph([tasks[i] for i in batch if not is_cached[i]])
            runnable: list[Task] = []
            submitted = self.submitted
            waiting = self.waiting
            for i in batch:
                submitted[i] = 1
                if not waiting[i]:
                    self.ready(i, now, runnable)
            self.n_ready += len(runnable)
            policy.push_many(runnable)
        sub_ptr = self.sub_ptr
        return tasks[self.subs[sub_ptr]].submit if sub_ptr < n else _INF

    def ready(self, i: int, now: float, batch: list[Task] | None = None) -> None:
        """Task ``i`` can run: push it (or add it to ``batch``), or complete it
        at once if cached."""
        if self.is_cached[i]:
            self.t_start[i] = now
            self.t_end[i] = now
            self.done[i] = 1
            waiting = self.waiting
            submitted = self.submitted
            for j in self.dependents[i]:
                waiting[j] -= 1
                if not waiting[j] and submitted[j]:
                    self.ready(j, now, batch)
        elif batch is not None:
            batch.append(self.tasks[i])  # counted with its batch
        else:
            self.n_ready += 1
            self.push(self.tasks[i])

    def find(self, tv: Any) -> int:
        """The position of a task a policy returned without this run's stamp."""
        if self.index is None:
            self.index = _positions(self.tasks)
        return self.index[tv.tid]

    # -- start ----------------------------------------------------------------------------
    def dispatched(self, now: float) -> float:
        """When an attempt asked to start at ``now`` starts: once the dispatcher has served
        it (each start takes ``gap`` seconds of it, in turn); its slot is held meanwhile."""
        t = (now if now > self.dispatcher_free else self.dispatcher_free) + self.gap
        self.dispatcher_free = t
        return t

    def draw_fate(self) -> float | None:
        """The fate of an attempt past the first ``FATES`` of its task, drawn now (in start
        order): the fraction of its run at which it fails, or None."""
        if self.draw_ptr + 2 > len(self.draws):
            self.draws = self.rng.random(4096).tolist()
            self.draw_ptr = 0
        p = self.draw_ptr
        self.draw_ptr = p + 2
        draws = self.draws
        return draws[p + 1] if draws[p] < self.rate else None

    def start(self, i: int, task: Task, nd: _Node, now: float, primary: Attempt | None) -> None:
        """Start an attempt of task ``i`` on ``nd``: a backup of ``primary``, or (None)
        a first run or a retry (on the reference path; the kernel inlines it)."""
        backup = primary is not None
        if self.gap:
            now = self.dispatched(now)
        if not backup and self.not_before:
            now = max(now, self.not_before.get(i, now))  # the node is held until then
        c = task.cores
        stack = nd.freeheap
        if c == 1:
            cores: tuple[int, ...] = (stack.pop(),)
        else:
            cores = tuple(stack.pop() for _ in range(c))
        nd.free -= c
        if self.keep_core:
            nd.core = stack[-1] if stack else -1  # type: ignore[misc]
        a = Attempt(len(self.attempts), task, nd.index, cores, now, backup, i)
        self.attempts.append(a)
        self.att_ti.append(i)
        self.att_start.append(now)
        if self.track:
            for x in cores:
                self.on_core[x] = a
        copies = self.copies
        if primary is not None:  # copies of one task only run side by side with a backup
            r = copies.get(i)
            if r is None:
                copies[i] = [primary, a]
            else:
                r.append(a)
        elif copies:
            r = copies.get(i)
            if r is not None:
                r.append(a)
        actual = self.dur[i] * self.speeds[nd.index] + self.overhead
        kind = _DONE
        when = now + actual
        if self.rate:
            again = self.again
            # attempt k of task i: a backup's primary was (at least) the first
            k = again.get(i, 1 if backup else 0) if (again or backup) else 0
            # common random numbers: the fate of attempt k of task i drawn up front
            frac = self.fails[k].get(i) if k < FATES else self.draw_fate()
            if frac is not None:
                kind = _FAIL
                when = now + actual * frac
            if kind or k:  # it may start again: after this failure, or as another copy
                again[i] = k + 1
        self.queue(when, kind, a)
        if backup:
            self.backups_running += 1
            self.backups_launched += 1
        at_speed = self.started(a, now) if self.started is not None else None
        if self.speculating and not backup and (self.copy_all or self.copyable[i]):
            if at_speed is None or not self.started_speed:
                at_speed = self.speed_hook(nd.index) if self.speed_hook is not None else 1.0
            self.judge_lateness(a, now, when, at_speed)

    def judge_lateness(self, a: Attempt, now: float, when: float, speed: float) -> None:
        """Primary ``a`` started at ``now`` on a node believed ``speed`` times slow, to end
        (or fail) at ``when``: its deadline is the policy's (``Speculation.deadline``);
        it is watched for a periodic check or the end game, its deadline's check queued
        if it still runs then, and the policy asked whether it is urgent."""
        assert self.deadline is not None
        a.check_at = self.deadline(now, self.est[a.ti], speed)
        interval = self.interval
        if self.endgame and not interval:  # a candidate for the end game's copies
            self.watch[a] = None
        if interval:  # judged at every periodic check, as live (no deadline event)
            self.watch[a] = None
            if self.tick_at == _INF:
                self.queue_tick(now, a)
        elif when > a.check_at:
            # Only an attempt still running at its deadline needs the check: one
            # that ends (or fails) first would find it a no-op, so the event is not
            # queued at all. No policy sees this; it only spares the event queue.
            # (A deadline moved earlier by a new speed belief is queued afresh.)
            self.queue(a.check_at, _CHECK, a)
        if self.urgent_hook is not None and not interval and self.urgent_hook(a, now):
            self.judge((a,), now)  # the policy wants a copy at once (if it may have one)

    # -- finish, fail, release ------------------------------------------------------------
    def free_cores(self, a: Attempt) -> None:
        """Give ``a``'s cores back to its node."""
        nd = self.nodes[a.node]
        stack = nd.freeheap
        stack.extend(a.cores)
        nd.free += len(a.cores)
        if self.keep_core:
            nd.core = stack[-1]  # type: ignore[misc]
        k = nd.index
        if not self.in_heap[k]:
            self.in_heap[k] = True
            heapq.heappush(self.free_heap, k)

    def finish(self, a: Attempt, now: float, outcome: str, hold: bool = False) -> None:
        """End attempt ``a`` (the kernel inlines this for an attempt that is done).
        With ``hold`` (a loser on a cluster that cannot stop it) its cores stay taken
        until it would have ended, or until the policy reclaims its thread."""
        a.end = now
        a.outcome = outcome
        if hold:
            self.held[a] = None
            assert self.spec is not None
            self.queue(self.spec.reclaim_at(now, self.est[a.ti]), _RECLAIM, a)
        else:
            self.free_cores(a)
        if self.watch:
            self.watch.pop(a, None)
        if a.backup:
            self.backups_running -= 1
        if self.ended is not None and self.ended(a, now):
            self.rejudge(a.node, now)

    def fail(self, a: Attempt, now: float) -> None:
        """Attempt ``a`` failed: its task is retried from the start, unless another copy
        runs on."""
        self.finish(a, now, "failed")
        if not self.speculating:
            self.push(a.task)  # retry from the start
            return
        i = a.ti
        copies = self.copies
        r = copies.get(i) if copies else None
        if r is not None:
            r.remove(a)  # another copy may run on
            if not r:
                del copies[i]
        if not r:
            self.backup_asked[i] = 0
            self.push(a.task)  # retry from the start

    def release(self, a: Attempt, now: float, reclaim: bool) -> None:
        """A held loser's thread returns (its natural end), or (``reclaim``) the policy
        is asked whether to take it for returned now (``Speculation.decide``)."""
        if reclaim:
            assert self.decide is not None
            view = _Loser(a.node, a.task.tid, a.end, self.est[a.ti])
            if not self.decide(now, self.policy, losers=(view,)).reclaimed:
                return
        del self.held[a]
        a.end = now  # the core-time it held counts as waste
        self.free_cores(a)

    # -- copies ---------------------------------------------------------------------------
    def ask(self, c: Copy) -> None:
        """Enact a copy the policy wants (``Speculation.decide``): it waits for a slot,
        ahead of queued work if the decision says so (otherwise it takes a slot no
        queued task wants). Where it goes is decided again when a slot frees."""
        a = c.attempt
        self.backup_asked[a.ti] = 1
        if c.ahead:
            self.ahead.add(a)
        self.pending.append(a)

    def judge(self, batch: Sequence[Attempt], now: float) -> SpeculationDecision:
        """Ask the policy about the running primaries ``batch`` (none asked for a copy
        yet), and enact: a copy asked for each it wants one for."""
        assert self.decide is not None
        d = self.decide(now, self.policy, judge=batch)
        for c in d.copies:
            self.ask(c)
        return d

    def check(self, a: Attempt, now: float) -> None:
        """Primary ``a``'s deadline: the policy judges it (late: a copy asked for)."""
        i = a.ti
        if a.check_at != now or self.done[i] or self.backup_asked[i]:
            return  # a stale check
        (v,) = self.judge((a,), now).verdicts
        if v.why is None:  # its deadline moved (a new speed belief): check then
            a.check_at = d = v.deadline
            self.queue(d, _CHECK, a)

    def running_on(self, k: int) -> list[Attempt]:
        """The attempts running on node ``k`` (with ``track``), in start order."""
        nd = self.nodes[k]
        here = {a: None for a in self.on_core[nd.base : nd.base + nd.cores] if a is not None}
        return sorted((a for a in here if a.outcome is None), key=_aid)

    def rejudge(self, node: int, now: float) -> None:
        """The policy's belief of ``node``'s speed changed: re-judge its attempts."""
        s = self.p_speed(node)
        if s >= _SUSPECT:
            self.suspects.add(node)
        else:
            self.suspects.discard(node)
        if self.spec is None or self.interval:  # with a periodic check: judged at the next
            return
        copyable, backup_asked, done = self.copyable, self.backup_asked, self.done
        judged = [
            b
            for b in self.running_on(node)
            if not b.backup and copyable[b.ti] and not backup_asked[b.ti] and not done[b.ti]
        ]
        if not judged:
            return
        for v in self.judge(judged, now).verdicts:
            b = v.attempt
            if v.why is None and v.deadline < b.check_at:  # sooner now: checked then
                b.check_at = v.deadline
                self.queue(b.check_at, _CHECK, b)

    def rescue(self, now: float) -> None:
        """Idle capacity and nothing queued: the policy judges the attempts running on the
        nodes it suspects slow."""
        copyable, backup_asked = self.copyable, self.backup_asked
        for k in sorted(self.suspects):
            judged = [
                b
                for b in self.running_on(k)
                if not b.backup and copyable[b.ti] and not backup_asked[b.ti]
            ]
            if judged:
                self.judge(judged, now)

    def take_backup(self, nd: _Node, ahead_only: bool, now: float) -> Attempt | None:
        """A pending backup request that may run on ``nd``: the oldest one for which
        the policy's placement rule (``Speculation.choose``) accepts the node; with
        ``ahead_only`` (queued work wants the slot) only one allowed ahead of it.

        With a periodic check, as live: a copy that may not go ahead of queued work is
        placed only at a check (the plugin places copies when it checks, on the slots
        free then; a slot that frees between two checks waits for the next one); one
        allowed ahead was placed at its check on a busy node, and takes its slot there
        when one frees."""
        ahead = self.ahead
        if self.backups_running >= self.cap or (ahead_only and not ahead):
            return None
        if self.interval and not self.ticked:
            if not ahead:
                return None
            ahead_only = True
        decide = self.decide
        assert decide is not None
        offer = (_Offer(nd.index, nd.free, nd.cores),)
        pending, done, backup_asked = self.pending, self.done, self.backup_asked
        k = 0
        while k < len(pending):
            p = pending[k]
            i = p.ti
            if p.outcome is not None or done[i]:
                pending.pop(k)
                ahead.discard(p)
                if not done[i]:
                    backup_asked[i] = 0  # primary failed: it is retried, not backed up
                continue
            if (not ahead_only or p in ahead) and decide(
                now,
                self.policy,
                asked=(p,),
                candidates=offer,
                running=self.backups_running,
                slots=self.slots,
            ).placed:
                pending.pop(k)
                ahead.discard(p)
                return p
            k += 1
        return None

    # -- tick -----------------------------------------------------------------------------
    def tick(self, now: float, a: Attempt) -> None:
        """The periodic check, as the plugin runs it: every running primary is judged
        afresh (late? urgent?), and a copy that found no place yet is asked for again or
        withdrawn, and may go ahead of queued work only if the policy says so now (the
        horizon has moved since it was asked)."""
        self.tick_at = _INF
        self.ticked = True
        assert self.decide is not None
        done, backup_asked, pending, ahead = self.done, self.backup_asked, self.pending, self.ahead
        watch = self.watch
        judged = [
            b
            for b in watch
            if not done[b.ti] and (not backup_asked[b.ti] or b in pending) and b.start <= now
        ]
        dec = self.decide(now, self.policy, judge=judged)
        wanted = {w.attempt: w for w in dec.copies}
        for b in judged:
            want = wanted.get(b)
            if not backup_asked[b.ti]:
                if want is not None:
                    self.ask(want)
            elif want is None:  # asked, not placed yet, and no longer wanted
                pending.remove(b)
                ahead.discard(b)
                backup_asked[b.ti] = 0
            elif want.ahead:  # ahead of queued work only if the policy says so now
                ahead.add(b)
            else:
                ahead.discard(b)
        # Live, the check places a copy allowed ahead on a busy node, where it takes the
        # next slot; one the cap refuses is asked for again at the next check. So only as
        # many as the cap has room for now wait ahead; the others wait for the next check.
        room = self.cap - self.backups_running
        for p in pending:
            if p in ahead:
                if room > 0:
                    room -= 1
                else:
                    ahead.discard(p)
        if watch:
            self.tick_at = now + self.interval
            self.queue(self.tick_at, _TICK, a)

    def spare(self, now: float) -> bool:
        """The end game: nothing waits to start, and nodes are idle. Ask the policy
        (``Speculation.decide`` with ``waiting=0``) about the running primaries without a
        copy, with the idle nodes as candidates, and enact: each copy placed on an idle
        node starts there now; one wanted elsewhere (an urgent or late attempt) is asked
        for as any copy is."""
        assert self.decide is not None
        nodes = self.nodes
        offers = [
            _Offer(k, nodes[k].free, nodes[k].cores)
            for k in sorted(set(self.free_heap))
            if nodes[k].free
        ]
        if not offers:
            return False
        done, backup_asked = self.done, self.backup_asked
        judged = [
            b for b in self.watch if not done[b.ti] and not backup_asked[b.ti] and b.start <= now
        ]
        if not judged:
            return False
        d = self.decide(
            now,
            self.policy,
            judge=judged,
            candidates=offers,
            running=self.backups_running,
            slots=self.slots,
            waiting=0,
        )
        for c in d.copies:
            b = c.attempt
            if c.target is None or c.queued:
                self.ask(c)
            else:
                backup_asked[b.ti] = 1
                self.start(b.ti, b.task, nodes[c.target.index], now, b)
        return True

    def endgame_due(self, n_events: int, spared: int) -> bool:
        """May the end game be asked now? Nothing waits to start (every task submitted
        and started, the policy's queue empty), nodes are idle, copies may run, and (without
        a periodic check) enough events have passed since the last ask: each ask judges
        every running primary, and in the end game nearly every event frees a core, so a
        tail of R attempts asked after every event would cost O(R^2) (38,400 cores: 10^9);
        asked again only ``1 + running / 64`` events after the last, it costs about 64 asks
        per halving of the running."""
        interval = self.interval
        return bool(
            (self.ticked or not interval)
            and self.free_heap
            and self.backups_running < self.cap
            and self.sub_ptr >= self.n
            and self.n_ready == self.n_live
            and not len(self.policy)
            and (interval or n_events - spared >= 1 + (len(self.watch) >> 6))
        )

    # -- learning -------------------------------------------------------------------------
    def estimate(self, stage: str, idx: Sequence[int]) -> list[int]:
        """Estimate the learned tasks ``idx`` of ``stage`` afresh: their views in ``tasks``
        (a new frozen Task each, carrying this run's stamp) and ``est`` are replaced;
        returns those whose estimate changed."""
        assert self.learner is not None
        tasks = self.tasks
        preds = _predict(self.learner, stage, [tasks[i].params for i in idx])
        if preds is None:
            return []
        changed = []
        setattr_ = object.__setattr__
        for i, sec in zip(idx, preds, strict=True):
            t = tasks[i]
            if t.estimated and sec == t.estimate:
                continue
            # dataclasses.replace, without its keyword plumbing and checks (a model's
            # estimate is a finite number > 0): a tenth of the cost, on every waiting task
            v = object.__new__(Task)
            for name in _TASK_SLOTS:
                setattr_(v, name, getattr(t, name))
            setattr_(v, "estimate", sec)
            setattr_(v, "estimated", True)
            setattr_(v, "_ti", self.stamp + i)
            tasks[i] = v
            self.est[i] = sec
            self.dur_est[2 * i + 1] = sec
            changed.append(i)
        return changed

    def submit_learned(self, batch: Sequence[int]) -> None:
        """A submitted batch: its learned tasks get the estimates known now."""
        by_stage: dict[str, list[int]] = {}
        for i in batch:
            if self.learned[i]:
                st = self.stage_at[i]
                assert st is not None
                by_stage.setdefault(st, []).append(i)
        for st, idx in by_stage.items():
            self.estimate(st, idx)
            self.waiting_of.setdefault(st, {}).update(dict.fromkeys(idx))

    def unwait(self, i: int) -> None:
        """Learned task ``i`` starts (its first attempt, popped from the queue): it waits
        no longer, so it is never re-estimated."""
        w = self.waiting_of.get(self.stage_at[i])  # type: ignore[arg-type]
        if w:
            w.pop(i, None)

    def learn_from(self, i: int) -> None:
        """Task ``i`` finished: its stage learns its true (nominal) duration; when the
        stage is due, its waiting learned tasks are estimated afresh and the runnable
        ones among them pushed again (their old entries are skipped when popped)."""
        learner = self.learner
        assert learner is not None
        st = self.stage_at[i]
        if st is None:
            return
        # not scored here (a refit per observation): Schedule.within scores the estimates
        # the tasks started with
        learner.observe(st, self.tasks[i].params, self.dur[i], score=False)
        w = self.waiting_of.get(st)
        if not learner.due(st, len(w) if w else 0):
            return
        learner.mark(st)
        if not w:
            return
        changed = self.estimate(st, list(w))
        tasks, submitted, waiting = self.tasks, self.submitted, self.waiting
        runnable = [tasks[j] for j in changed if submitted[j] and not waiting[j]]
        if runnable:
            self.policy.push_many(runnable)

    # -- the kernel -----------------------------------------------------------------------
    def kernel(self) -> None:
        """The event loop: the one long function of the engine, on purpose.

        It runs the events in (time, kind, sequence) order and, after each time's events,
        offers the free nodes to waiting copies and to the policy. Inlined here, with the
        names they read bound to locals: the end of an attempt that is done, the start of
        a first run or a retry (its lateness judged with the policy's own
        ``Speculation.deadline``) and the calendar's ``post``. They run for nearly every
        event and every start, where a call and attribute reads would be a large share of
        a run's cost on CPython. Everything else is a call to a named part. The reference
        path (``reference=True``) starts and ends every attempt through the parts
        (:meth:`start`, :meth:`finish`) and calls every hook of the policy instead;
        tests/sim/test_sim_reference.py compares the two, event for event."""
        # hot names bound to locals (a local is one load; `self.x` several steps)
        tasks, n, stamp, nodes = self.tasks, self.n, self.stamp, self.nodes
        far, buckets, soon = self.far, self.buckets, self.soon
        cur: list[_Event] = []  # the current bucket's events, sorted, latest first
        cur_b = self.cur_b  # (kept equal to self.cur_b, which `post` reads)
        inv_width = self.inv_width
        attempts, ti_append, start_append = (
            self.attempts,
            self.att_ti.append,
            self.att_start.append,
        )
        dur_est, speeds, overhead = self.dur_est, self.speeds, self.overhead
        done, waiting, submitted, dependents = (
            self.done,
            self.waiting,
            self.submitted,
            self.dependents,
        )
        has_deps, copies, copyable, copy_all = (
            self.has_deps,
            self.copies,
            self.copyable,
            self.copy_all,
        )
        pending, held, watch, holds = self.pending, self.held, self.watch, self.holds
        free_heap, in_heap, on_core = self.free_heap, self.in_heap, self.on_core
        rate, again, first_fates, fails = self.rate, self.again, self.first_fates, self.fails
        gap, keep_core, track, not_before = self.gap, self.keep_core, self.track, self.not_before
        learner, learned, reference = self.learner, self.learned, self.reference
        speculating, slow_done, endgame = self.speculating, self.slow_done, self.endgame
        interval, cap, rescues, suspects = self.interval, self.cap, self.rescues, self.suspects
        deadline = self.deadline
        started, ended, started_speed = self.started, self.ended, self.started_speed
        speed_hook, urgent_hook, calm = self.speed_hook, self.urgent_hook, self.calm
        policy = self.policy
        pop, qlen = policy.pop, policy.__len__
        finish, rejudge, ready, judge = self.finish, self.rejudge, self.ready, self.judge
        take_backup, start = self.take_backup, self.start
        heappush, heappop = heapq.heappush, heapq.heappop
        inf = _INF
        n_events = 0
        spared = -(1 << 62)  # n_events at the end game's last ask
        t_sub = self.t_sub  # the next submission's time
        while True:
            if cur and not soon:  # the common case: the current bucket's next event
                t_ev = cur[-1][0]
            else:
                if not cur and not soon and buckets:  # the next bucket becomes the current one
                    cur_b = self.cur_b = heappop(buckets)
                    cur = far.pop(cur_b)
                    cur.sort(reverse=True)
                if soon and (not cur or soon[0] < cur[-1]):
                    t_ev = soon[0][0]
                else:
                    t_ev = cur[-1][0] if cur else inf
            if t_ev < t_sub:
                now = t_ev
            elif t_sub == inf:
                break  # no event and no submission left
            else:  # the submissions at `now`, before its events
                now = t_sub
                t_sub = self.submit(now)
            while True:  # the events at `now`, in (time, kind, seq) order
                if soon:
                    if cur and cur[-1] < soon[0]:
                        if cur[-1][0] != now:
                            break
                        _, kind, _, a = cur.pop()
                    else:
                        if soon[0][0] != now:
                            break
                        _, kind, _, a = heappop(soon)
                elif cur:
                    x = cur[-1]
                    if x[0] != now:
                        break
                    cur.pop()
                    _, kind, _, a = x
                elif buckets:
                    cur_b = self.cur_b = heappop(buckets)
                    cur = far.pop(cur_b)
                    cur.sort(reverse=True)
                    continue
                else:
                    break
                n_events += 1
                if kind == _TICK:
                    self.tick(now, a)
                    continue
                if a.outcome is not None:
                    if held and kind != _CHECK and a in held:  # a held loser's thread
                        self.release(a, now, kind == _RECLAIM)
                    continue  # killed earlier, or a stale check
                i = a.ti
                if kind == _DONE:
                    if slow_done:  # the reference path, or learning: the part inlined below
                        finish(a, now, "done")
                        if learner is not None:
                            self.learn_from(i)
                    else:
                        # finish(a, now, "done"), inlined: the end of nearly every attempt
                        a.end = now
                        a.outcome = "done"
                        k = a.node
                        nd = nodes[k]
                        stack = nd.freeheap
                        stack.extend(a.cores)
                        nd.free = len(stack)
                        if keep_core:
                            nd.core = stack[-1]  # type: ignore[misc]
                        if watch:
                            watch.pop(a, None)
                        if not in_heap[k]:
                            in_heap[k] = True
                            heappush(free_heap, k)
                        if a.backup:
                            self.backups_running -= 1
                        if ended is not None and ended(a, now):
                            rejudge(k, now)
                    if speculating:  # the race: a backup won, the other copies lose
                        done[i] = 1
                        if a.backup:
                            self.backups_won += 1
                        if copies:
                            r = copies.pop(i, None)
                            if r is not None:
                                for b in r:
                                    if b is not a and b.outcome is None:
                                        finish(b, now, "killed", holds)
                    if has_deps:
                        for j in dependents[i]:
                            waiting[j] -= 1
                            if not waiting[j] and submitted[j]:
                                ready(j, now)
                elif kind == _FAIL:
                    self.fail(a, now)
                else:  # _CHECK
                    self.check(a, now)
            # Dispatch: the free nodes, lowest index first, to waiting copies and the policy;
            # idle capacity with nothing queued: rescue attempts on suspect nodes, then again.
            rescued = False
            while True:
                declined: list[int] | None = None
                while free_heap:
                    if pending:
                        queued = qlen()
                        if not queued and self.backups_running >= cap:
                            break
                    k = free_heap[0]
                    nd = nodes[k]
                    if not nd.free:
                        heappop(free_heap)
                        in_heap[k] = False
                        continue
                    if pending:
                        p = take_backup(nd, queued > 0, now)
                        if p is not None:
                            start(p.ti, p.task, nd, now, p)
                            continue
                        tv = pop(nd, now) if queued else None
                    else:
                        # no copy waits: the policy is asked first, its queue's length only
                        # when it has nothing for the slot (an empty queue answers None too):
                        # one call per start fewer on the loop's commonest path
                        tv = pop(nd, now)
                        if tv is None:
                            queued = qlen()
                            if not queued:
                                break
                    if tv is None:
                        if queued and pending:  # a slot no queued task wants: a copy may
                            p = take_backup(nd, False, now)
                            if p is not None:
                                start(p.ti, p.task, nd, now, p)
                                continue
                        heappop(free_heap)
                        if declined is None:
                            declined = [k]
                        else:
                            declined.append(k)
                        continue
                    try:
                        ti = tv._ti - stamp  # type: ignore[attr-defined]
                    except AttributeError:
                        ti = -1
                    if not 0 <= ti < n:  # not stamped by this run: found by its id
                        ti = self.find(tv)
                        tv = tasks[ti]
                        if learner is not None and learned[ti]:
                            self.unwait(ti)
                    elif learner is not None:
                        if tasks[ti] is not tv:
                            continue  # an entry re-ranking left behind: skipped
                        if learned[ti]:
                            self.unwait(ti)
                    if reference:
                        start(ti, tv, nd, now, None)  # type: ignore[arg-type]
                        continue
                    # start(ti, tv, nd, now, None), inlined: the start of nearly every
                    # attempt (a first run or a retry; copies start through the part). The
                    # same steps in the same order; `t0` is `now` once dispatched.
                    t0 = self.dispatched(now) if gap else now
                    if not_before:  # not before its time: the node is held until then
                        t0 = max(t0, not_before.get(ti, t0))
                    c = tv.cores
                    stack = nd.freeheap
                    if c == 1:
                        cores: tuple[int, ...] = (stack.pop(),)
                    else:
                        cores = tuple([stack.pop() for _ in range(c)])
                    nd.free -= c
                    if keep_core:
                        nd.core = stack[-1] if stack else -1  # type: ignore[misc]
                    a = Attempt(len(attempts), tv, k, cores, t0, False, ti)  # type: ignore[arg-type]
                    attempts.append(a)
                    ti_append(ti)
                    start_append(t0)
                    if track:
                        for cx in cores:
                            on_core[cx] = a
                    if copies:
                        r = copies.get(ti)
                        if r is not None:
                            r.append(a)
                    ti2 = ti + ti  # (dur_est: its duration, then its estimate)
                    actual = dur_est[ti2] * speeds[k] + overhead
                    kind = _DONE
                    when = t0 + actual
                    if rate:
                        nth = again.get(ti, 0)  # this attempt's number
                        if not nth:  # the first: its fate drawn up front (common random numbers)
                            frac = first_fates.get(ti)
                        elif nth < FATES:  # ... and the next few attempts' likewise
                            frac = fails[nth].get(ti)
                        else:
                            frac = self.draw_fate()
                        if frac is not None:
                            kind = _FAIL
                            when = t0 + actual * frac
                        if kind or nth:  # it may start again
                            again[ti] = nth + 1
                    seq = self.seq + 1
                    self.seq = seq
                    e = (when, kind, seq, a)
                    bn = int(when * inv_width)  # post(when, e), inlined
                    if bn > cur_b:
                        bucket = far.get(bn)
                        if bucket is None:
                            far[bn] = [e]
                            heappush(buckets, bn)
                        else:
                            bucket.append(e)
                    else:
                        heappush(soon, e)
                    at_speed = started(a, t0) if started is not None else None
                    if speculating and (copy_all or copyable[ti]):
                        # judge_lateness(a, t0, when, speed) inlined: the speed `started` gave
                        # (a policy declaring `started_speed`: one call, not two), else asked
                        if at_speed is None or not started_speed:
                            at_speed = speed_hook(k) if speed_hook is not None else 1.0
                        speed = at_speed
                        a.check_at = deadline(t0, dur_est[ti2 + 1], speed)  # type: ignore[misc]
                        if endgame and not interval:  # a candidate for the end game's copies
                            watch[a] = None
                        if interval:  # judged at every periodic check (no deadline event)
                            watch[a] = None
                            if self.tick_at == inf:
                                self.queue_tick(t0, a)
                        elif when > a.check_at:  # a check only for an attempt still running
                            self.queue(a.check_at, _CHECK, a)
                        if (
                            not speed < calm  # (below: not urgent, the policy says)
                            and urgent_hook is not None
                            and not interval
                            and urgent_hook(a, t0)
                        ):
                            judge((a,), t0)  # the policy wants a copy at once
                    if not nd.free and not pending:  # the node is full: off the heap now
                        heappop(free_heap)
                        in_heap[k] = False
                if declined is not None:
                    for k in declined:
                        heappush(free_heap, k)  # still free: offer again after the next event
                if rescued or not free_heap or not (rescues and suspects and not len(policy)):
                    break
                self.rescue(now)  # idle capacity: rescue attempts on slow nodes
                if not pending:
                    break
                rescued = True
            if endgame and self.endgame_due(n_events, spared) and self.spare(now):
                spared = n_events
            self.ticked = False  # (read by the end game above and by take_backup)
        self.n_events = n_events

    # -- the result -----------------------------------------------------------------------
    def result(self) -> Schedule:
        """The schedule of the run (an error if the policy left runnable work)."""
        n, tasks = self.n, self.tasks
        start_, end_, node_, n_attempts, finished = _records(
            self.attempts, n, self.t_start, self.t_end, self.att_ti, self.att_start
        )
        cached = np.frombuffer(self.is_cached, dtype=np.uint8).astype(bool)
        finished |= cached
        never = n - int(np.count_nonzero(finished))
        if never:
            stuck = [tasks[i].tid for i in np.flatnonzero(~finished)[:5].tolist()]
            raise RuntimeError(
                f"simulation ended with {never} tasks never run (e.g. {stuck}); "
                f"policy {self.policy.name!r} left runnable work unscheduled"
            )
        learner = self.learner
        return Schedule(
            tasks=tasks,
            cluster=self.cluster,
            policy=self.policy.name,
            attempts=self.attempts,
            start=start_,
            end=end_,
            node=node_,
            n_attempts=n_attempts,
            cached=np.frombuffer(self.is_cached, dtype=np.uint8).astype(bool),
            pruned=[t for t in self.pruned],
            backups_launched=self.backups_launched,
            backups_won=self.backups_won,
            events=self.n_events,
            seed=self.seed,
            estimator=learner,
            learned=np.frombuffer(self.learned, dtype=np.uint8).astype(bool)
            if learner is not None
            else None,
        )
