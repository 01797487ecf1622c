"""The policy interface shared by the simulator, the scheduler plugin and replay.

A policy is written once and runs in three places. It never imports
``distributed`` and never sees true durations: it reads narrow *views* and
answers with *decisions*.

Views (structural protocols, so any object with these attributes will do):

* :class:`TaskView` - ``tid``, ``estimate`` (seconds), ``cores``, ``team``,
  ``submit`` (seconds), ``deps`` (ids of the tasks it reads).
* :class:`NodeView` - ``index``, ``cores`` (slots), ``free`` (slots free now).
* :class:`AttemptView` - ``task`` (a TaskView), ``node`` (index), ``start``,
  ``end`` and ``outcome`` once ended, ``backup`` (is it a speculative copy).

Beyond those, a driver may give a view the *optional fields* of :data:`OPTIONAL_FIELDS`
(``task.estimated``, ``task.speculate``, ``task.job_class``, ``task.teams``, ``task.band``,
``node.waiting``, ``node.core``, ``attempt.policy_state``); a policy reads one with its default
there (:func:`field`) and names those it reads in its capabilities.

Capabilities
============

A policy declares what it does and needs in :attr:`Policy.capabilities`
(:class:`Capabilities`): whether it *pops* slot by slot or ranks by a static key, whether
it *learns speeds*, whether it *speculates* (asks for backups itself), whether it keeps
per-team accounts (*team accounts*: cores held and usage per team) or can *reconcile* them,
and which optional view fields it *reads*. The drivers (the simulator, the plugin,
replay) ask the declaration, never the policy's class: a user's registered policy that
declares a capability gets what a built-in one with it gets.

The life of a task, as a policy sees it::

    add_graph([tasks])         once per submitted batch, before any push
    push(task)                 the task is runnable (submitted, inputs ready)
    pop(node, now) -> task     a slot is free on ``node``: which task runs there?
    started(attempt, now)      an attempt began (a first run, a retry or a backup)
    ended(attempt, now)        it ended: done, failed or killed

``pop`` is the one decision every policy makes. It must return a task whose
``cores`` fit in ``node.free``, or ``None`` to leave the slot idle for now (the
driver offers it again when something changes). The driver never scans the
queue for the policy: each policy keeps its own incremental structures (heaps,
per-team queues, per-core deques) so a decision costs O(log n) in the number of
queued tasks, never O(n). A policy that holds a queued task back says why when asked
(``why_waiting(task, now)``, by the rule ``pop`` applies); ``explain`` repeats its answer.

Two optional questions support speculation (backup copies of late attempts):
``speed(node)`` is the policy's belief of how much slower than nominal a node
runs (1.0 = nominal; only policies that learn speeds answer anything else), and
``urgent(attempt, now)`` asks whether an attempt should get a backup *now*,
before the lateness deadline of :class:`~daskjobs.policies.speculation.Speculation`.

Determinism: policies hold no randomness of their own; ties are broken by a
push counter (earlier push sorts first), documented on each policy.
"""

from __future__ import annotations

import heapq
import itertools
import math
import warnings
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "OPTIONAL_FIELDS",
    "AttemptView",
    "Capabilities",
    "HeapPolicy",
    "NodeView",
    "Policy",
    "SpeedLearner",
    "TaskView",
    "TeamAccounts",
    "field",
]


@runtime_checkable
class TaskView(Protocol):
    """What a policy may know about a task: never its true duration.

    A driver may add ``teams``: every team whose graphs want the task when several do
    (one task for a stage two teams' sweeps share), the task's own team among them.
    A policy reads it with ``getattr(task, "teams", ())``; fair share splits the task's
    cores among them (docs/fairshare.md).
    """

    @property
    def tid(self) -> Hashable: ...
    @property
    def estimate(self) -> float: ...
    @property
    def cores(self) -> int: ...
    @property
    def team(self) -> str: ...
    @property
    def submit(self) -> float: ...
    @property
    def deps(self) -> Sequence[Hashable]: ...


class NodeView(Protocol):
    """A node (in dask: a worker) as a policy sees it when offering slots.

    Optional fields (:data:`OPTIONAL_FIELDS`): ``waiting``, nominal seconds of work
    already on the node that starts before the offered slot's task (the plugin's slots
    have it: dask hands a worker more tasks than it has threads; the simulator's nodes
    queue nothing of their own); ``core``, the one core a slot is on (the simulator's,
    for policies that deal tasks to cores).
    """

    @property
    def index(self) -> int: ...
    @property
    def cores(self) -> int: ...
    @property
    def free(self) -> int: ...


class AttemptView(Protocol):
    """One execution of a task on one node.

    Optional field (:data:`OPTIONAL_FIELDS`): ``policy_state``, a writable attribute that is the
    policy's own (what its ``started`` keeps for its ``ended``); without it a policy
    keeps a dict by attempt. The simulator's and the plugin's attempts have it.
    """

    @property
    def task(self) -> TaskView: ...
    @property
    def node(self) -> int: ...
    @property
    def start(self) -> float: ...
    @property
    def end(self) -> float: ...
    @property
    def outcome(self) -> str | None: ...
    @property
    def backup(self) -> bool: ...


#: The optional view fields a driver may provide, by view, with the value a policy
#: takes when a view lacks one. ``task.estimated``: the estimate is a real one (an
#: annotation or measured history), not a configured default; ``task.speculate``: the
#: task may get a backup copy; ``task.job_class``: "te" (interactive) or "be"
#: (best-effort); ``task.band``: ``(low, high)``, the estimate's 10-90% band (a duration
#: model's; speculation judges lateness against its top), or None; ``node.waiting``:
#: nominal seconds queued on the node ahead of the
#: offered slot; ``node.core``: the core of a one-core slot; ``attempt.policy_state``: the
#: policy's own attribute on an attempt.
OPTIONAL_FIELDS: dict[str, Any] = {
    "task.estimated": True,
    "task.speculate": True,
    "task.job_class": "be",
    "task.teams": (),
    "task.band": None,
    "node.waiting": 0.0,
    "node.core": None,
    "attempt.policy_state": None,
}


#: Public names of this interface kept for one release under their old spelling, each with
#: its replacement (removed in the release after 0.1.0): using one warns with a
#: ``FutureWarning`` that names the new one.
RENAMED: dict[str, str] = {
    "TeamBooks": "TeamAccounts",
    "Capabilities.team_books": "Capabilities.team_accounts",
    "attempt.books": "attempt.policy_state",
}


def warn_renamed(old: str, stacklevel: int = 3) -> str:
    """Warn that ``old`` (a key of :data:`RENAMED`) is deprecated; return its new name."""
    new = RENAMED[old]
    warnings.warn(
        f"{old} is deprecated: use {new} (the old name goes in the release after 0.1.0)",
        FutureWarning,
        stacklevel=stacklevel,
    )
    return new


def renamed_attribute(old: str) -> property:
    """A deprecated attribute of a view (``old``, a key of :data:`RENAMED` such as
    ``"attempt.books"``): it reads and writes its new name, with :func:`warn_renamed`'s
    warning."""
    new = RENAMED[old].rsplit(".", 1)[-1]

    def get(self: Any) -> Any:
        warn_renamed(old)
        return getattr(self, new)

    def put(self: Any, value: Any) -> None:
        warn_renamed(old)
        setattr(self, new, value)

    return property(get, put, doc=f"Deprecated: ``{new}`` (a ``FutureWarning``; gone after 0.1.0).")


def field(view: object, name: str) -> Any:
    """``view``'s optional field ``name`` (``"node.waiting"``), or its default. Not for
    hot paths: a policy there reads ``getattr(view, "waiting", 0.0)`` itself, with the
    default of :data:`OPTIONAL_FIELDS`."""
    if name in RENAMED:  # an old spelling: the new one, with a warning
        name = warn_renamed(name)
    return getattr(view, name.partition(".")[2], OPTIONAL_FIELDS[name])


@dataclass(frozen=True, init=False)
class Capabilities:
    """What a policy does and needs, as the drivers read it (module docstring).

    ``pops``: it chooses each free slot's task itself (:meth:`Policy.pop`); live, the
    plugin then holds dask's queue and releases its choices slot by slot (the release
    gate). False: a static key ranks every task (:meth:`HeapPolicy.key`), and the plugin
    writes it into dask's priorities.

    ``learns_speeds``: its ``ended`` learns how fast each node runs and ``speed(node)``
    answers it (with ``samples(node)``, the attempts a belief rests on, and ``capacity()``,
    the effective cores: :class:`SpeedLearner`); live, it is
    then the plugin's one speed learner (every finished attempt is told to it) and the
    slots it is offered name their worker.

    ``speculates``: ``urgent(attempt, now)`` may ask for a backup copy before the
    lateness deadline (drivers that speculate ask it).

    ``team_accounts``: it keeps per-team accounts that ``explain`` and ``status`` report
    (:class:`TeamAccounts`).

    ``reconciles``: it can rebuild its accounts from the live scheduler's state after a
    failure (``reconcile(running, held, now)``); otherwise the plugin hands it the tasks
    it lacks.

    ``reads``: the optional view fields it reads (keys of :data:`OPTIONAL_FIELDS`).

    ``started_speed``: ``started(attempt, now)`` returns ``speed(attempt.node)`` as it
    stands then, so a driver that needs the speed of every attempt it starts (the
    simulator, for the lateness deadline) asks no second time; a driver may ignore the
    answer (None: ask ``speed``).

    Deprecated for one release (:data:`RENAMED`, with a ``FutureWarning``): the keyword and
    attribute ``team_books`` (``team_accounts``), and ``attempt.books`` in ``reads``
    (``attempt.policy_state``).
    """

    pops: bool = True
    learns_speeds: bool = False
    speculates: bool = False
    team_accounts: bool = False
    reconciles: bool = False
    reads: frozenset[str] = frozenset()
    started_speed: bool = False

    def __init__(
        self,
        pops: bool = True,
        learns_speeds: bool = False,
        speculates: bool = False,
        team_accounts: bool = False,
        reconciles: bool = False,
        reads: Iterable[str] = frozenset(),
        started_speed: bool = False,
        *,
        team_books: bool | None = None,
    ) -> None:
        # written out (not the dataclass's) for the one deprecated keyword, team_books
        if team_books is not None:
            warn_renamed("Capabilities.team_books")
            team_accounts = team_books
        fields = set()
        for name in reads:  # an old spelling (RENAMED) is read as the new one, with a warning
            fields.add(warn_renamed(name) if name in RENAMED else name)
        unknown = sorted(fields - set(OPTIONAL_FIELDS))
        if unknown:
            raise ValueError(
                f"Capabilities.reads names no optional view field: {', '.join(unknown)} "
                f"(known: {', '.join(OPTIONAL_FIELDS)})"
            )
        for name, value in (
            ("pops", pops),
            ("learns_speeds", learns_speeds),
            ("speculates", speculates),
            ("team_accounts", team_accounts),
            ("reconciles", reconciles),
            ("reads", frozenset(fields)),
            ("started_speed", started_speed),
        ):
            object.__setattr__(self, name, value)

    @property
    def team_books(self) -> bool:
        """Deprecated: :attr:`team_accounts`."""
        warn_renamed("Capabilities.team_books")
        return self.team_accounts


class SpeedLearner(Protocol):
    """What a policy that declares ``learns_speeds`` answers (beside the hooks every policy
    has: ``add_node``, ``remove_node``, ``ended``)."""

    def speed(self, node: int) -> float: ...
    def samples(self, node: int) -> int: ...
    def capacity(self) -> float: ...
    def add_node(self, index: int, cores: int) -> None: ...
    def remove_node(self, index: int) -> None: ...
    def ended(self, attempt: AttemptView, now: float) -> bool: ...
    def learned(self, node: int) -> tuple[float, int] | None: ...
    def relearn(self, node: int, learned: tuple[float, int]) -> None: ...


class TeamAccounts(Protocol):
    """What a policy that declares ``team_accounts`` answers (and, with ``reconciles``,
    ``reconcile``)."""

    quotas: Any

    def teams(self) -> list[str]: ...
    def knows(self, team: str) -> bool: ...
    def share(self, team: str) -> float: ...
    def usage(self, team: str, now: float) -> float: ...
    def running(self, team: str) -> int: ...
    def queued(self, team: str) -> int: ...
    def booked(self, team: str, now: float | None = None) -> float: ...


class Policy:
    """Base class of every policy: no-op hooks and the interface's contract.

    Subclasses implement :meth:`push`, :meth:`pop` and :meth:`__len__`; the
    other hooks are optional. A subclass declares what it does in
    :attr:`capabilities` (the default: it pops, and nothing more).
    """

    #: The name the CLI, reports and the plugin's configuration use.
    name: str = "policy"
    #: What it does and needs (:class:`Capabilities`); the drivers read this.
    capabilities: ClassVar[Capabilities] = Capabilities()

    def add_node(self, index: int, cores: int) -> None:
        """A node joined (in the simulator: all nodes, before the first task)."""

    def remove_node(self, index: int) -> None:
        """A node left."""

    def add_graph(self, tasks: Sequence[TaskView]) -> None:
        """A batch of tasks was submitted (topologically ordered); before any push."""

    def push(self, task: TaskView) -> None:
        """``task`` is runnable now."""
        raise NotImplementedError

    def push_many(self, tasks: Sequence[TaskView]) -> None:
        """Several tasks became runnable at once (a submitted batch); in order."""
        for t in tasks:
            self.push(t)

    def pop(self, node: NodeView, now: float) -> TaskView | None:
        """Choose a queued task that fits in ``node.free`` slots, or ``None``. A driver
        may ask with nothing queued (the simulator asks before it asks ``len``): the
        answer is then ``None``."""
        raise NotImplementedError

    def why_waiting(self, task: TaskView, now: float) -> str | None:
        """Why queued ``task`` is not started yet, in plain words, by the rule :meth:`pop`
        applies (the policy says why it holds a task back; a driver repeats the answer and
        never derives one of its own). None: nothing of the policy's holds it (a static
        order: the driver says where it stands in that order). Not on a hot path: asked
        when someone asks (live, ``explain``); it must not change what ``pop`` answers."""
        return None

    def started(self, attempt: AttemptView, now: float) -> float | None:
        """An attempt started running. A policy that declares ``started_speed`` returns
        its belief of the node's speed (:meth:`speed`); otherwise None."""
        return None

    def ended(self, attempt: AttemptView, now: float) -> bool:
        """An attempt ended. Return True if the policy's belief of the speed of
        ``attempt.node`` changed enough that deadlines on it should be re-judged."""
        return False

    def hold_key(self, task: TaskView) -> float:
        """Lower first: the order in which a driver that cannot ask :meth:`pop` for every
        slot keeps this policy's waiting tasks (live, dask's own queue dispatches them
        into slots the plugin did not see free). Default: submission order."""
        return float(task.submit)

    def discard(self, task: TaskView) -> None:
        """``task`` was pushed and left the queue without being popped (the live
        scheduler ran or dropped it). Policies whose queue counts are reported
        (fair share) drop its entry; the default keeps it, and a driver skips a
        popped task it no longer holds."""

    def forget(self, tid: Hashable) -> None:
        """``tid`` is gone for good (the live scheduler forgot it): drop its state."""

    def reestimate(self, old: TaskView, new: TaskView) -> None:
        """A waiting task's estimate changed (``old`` and ``new`` are its views: the
        driver learned a better one, docs/how-to/estimates.md); before the driver asks ``key``
        of ``new``. A policy whose key reads more than the task (critical path's
        remaining path) updates what it keeps; the default keeps nothing to update."""

    def speed(self, node: int) -> float:
        """Believed slow-down factor of ``node`` (1.0 = nominal)."""
        return 1.0

    def horizon(self, now: float) -> float:
        """The projected end of the run, as far as the policy knows (see
        :func:`~daskjobs.policies.speculation.projected_end`); ``inf`` when it does not
        keep the sums (nothing then counts as ending past it)."""
        return math.inf

    def urgent(self, attempt: AttemptView, now: float) -> bool:
        """Should ``attempt`` get a backup copy now, whatever its deadline says?"""
        return False

    def calm_below(self) -> float:
        """A believed slow-down below which :meth:`urgent` answers False: a driver may
        skip asking it about an attempt whose node the policy believed faster than this
        as the attempt started (``speed``, or what ``started`` answered), and before
        anything else changed. The simulator asks this once a run and then asks
        ``urgent`` of the attempts on slow nodes only (a call per start spared on the
        rest). Default -inf: no such bound, ask every time."""
        return -math.inf

    def __len__(self) -> int:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """A JSON-able description, for reports and audit events."""
        return {"policy": self.name}


class HeapPolicy(Policy):
    """A static-priority queue: ``key(task)`` lower runs first.

    Tasks are bucketed by their core request so that ``pop`` on a node with
    ``f`` free slots looks only at the head of each bucket that fits: the cost
    is O(b log n) with b the number of distinct core requests (usually 1).
    Ties on ``key`` are broken by push order (earlier first). It does not pop slot by
    slot as far as a driver needs to know (``capabilities.pops`` is False): its ``key``
    orders everything, so the plugin writes it into dask's priorities.

    Each bucket is a heap plus a *run*: a batch pushed at once
    (:meth:`push_many`, e.g. a whole sweep submitted together) is sorted once
    and popped from the end of a list in O(1), instead of paying a heap pop of
    O(log n) tuple comparisons per task. The next task is the smaller of the
    heap's head and the run's tail. The run is kept as three parallel lists
    (keys, push counters, tasks), not as a list of ``(key, counter, task)``
    tuples: a million tuples cost more to allocate than the sort itself.
    """

    capabilities: ClassVar[Capabilities] = Capabilities(pops=False)

    def __init__(self) -> None:
        self._buckets: dict[int, _Bucket] = {}
        self._sizes: list[int] = []  # distinct core requests, ascending
        self._counter = itertools.count()
        self._n = 0

    def key(self, task: TaskView) -> Any:
        """Sort key of ``task``; lower runs first."""
        raise NotImplementedError

    def keys(self, tasks: Sequence[TaskView]) -> list[Any]:
        """``[self.key(t) for t in tasks]``; override with a faster equivalent."""
        key = self.key
        return [key(t) for t in tasks]

    def _bucket(self, cores: int) -> _Bucket:
        bucket = self._buckets.get(cores)
        if bucket is None:
            bucket = self._buckets[cores] = ([], [], [], [])
            self._sizes.append(cores)
            self._sizes.sort()
        return bucket

    def push(self, task: TaskView) -> None:
        heapq.heappush(self._bucket(task.cores)[0], (self.key(task), next(self._counter), task))
        self._n += 1

    def push_many(self, tasks: Sequence[TaskView]) -> None:
        if len(tasks) < 256:
            for t in tasks:
                self.push(t)
            return
        # push counters in task order, exactly as single pushes would number them
        first = next(self._counter)
        self._counter = itertools.count(first + len(tasks))
        sizes = {t.cores for t in tasks}
        groups: list[tuple[int, Sequence[int] | None, Sequence[TaskView]]]
        if len(sizes) == 1:  # the usual case: one core request, no regrouping
            groups = [(sizes.pop(), None, tasks)]
        else:
            by_cores: dict[int, list[int]] = {}
            for pos, t in enumerate(tasks):
                by_cores.setdefault(t.cores, []).append(pos)
            groups = [(c, ps, [tasks[p] for p in ps]) for c, ps in by_cores.items()]
        for cores, positions, group in groups:
            heap, keys, seqs, run = self._bucket(cores)
            if run:  # an older run still pending: fold it into the heap
                heap.extend(zip(keys, seqs, run, strict=True))
                heapq.heapify(heap)
                keys.clear()
                seqs.clear()
                run.clear()
            # a stable descending order: the next task to run at the end of the lists
            run_keys, run_seqs, run_tasks = _sorted_run(self.keys(group), positions, first, group)
            keys.extend(run_keys)
            seqs.extend(run_seqs)
            run.extend(run_tasks)
        self._n += len(tasks)

    @staticmethod
    def _head(bucket: _Bucket) -> _HEntry | None:
        heap, keys, seqs, run = bucket
        if run:
            tail = (keys[-1], seqs[-1], run[-1])
            if heap and heap[0][:2] < tail[:2]:
                return heap[0]
            return tail
        return heap[0] if heap else None

    @staticmethod
    def _take(bucket: _Bucket) -> TaskView:
        heap, keys, seqs, run = bucket
        if run and not (heap and heap[0][:2] < (keys[-1], seqs[-1])):
            keys.pop()
            seqs.pop()
            return run.pop()
        return heapq.heappop(heap)[2]

    def _best_bucket(self, free: int) -> _Bucket | None:
        best = None
        best_head: _HEntry | None = None
        for c in self._sizes:
            if c > free:
                break
            b = self._buckets[c]
            h = self._head(b)
            if h is not None and (best_head is None or h[:2] < best_head[:2]):
                best, best_head = b, h
        return best

    def peek(self, free: int) -> TaskView | None:
        """The task ``pop`` would return on a node with ``free`` slots."""
        if len(self._sizes) == 1:  # fast path: one core size
            if self._sizes[0] > free:
                return None
            heap, keys, seqs, run = self._buckets[self._sizes[0]]
            if run and not (heap and heap[0][:2] < (keys[-1], seqs[-1])):
                return run[-1]
            return heap[0][2] if heap else None
        b = self._best_bucket(free)
        if b is None:
            return None
        h = self._head(b)
        return h[2] if h is not None else None

    def pop(self, node: NodeView, now: float) -> TaskView | None:
        if not self._n:
            return None
        if len(self._sizes) == 1:  # fast path: one core size
            if self._sizes[0] > node.free:
                return None
            heap, keys, seqs, run = self._buckets[self._sizes[0]]
            self._n -= 1
            if run and not (heap and heap[0][:2] < (keys[-1], seqs[-1])):
                keys.pop()
                seqs.pop()
                return run.pop()
            return heapq.heappop(heap)[2]
        else:
            found = self._best_bucket(node.free)
            if found is None:
                return None
            b = found
        self._n -= 1
        return self._take(b)

    def __len__(self) -> int:
        return self._n


_HEntry = tuple[Any, int, TaskView]  # (key, push counter, task)
# a bucket: (heap of entries, and the run as parallel lists: keys, counters, tasks)
_Bucket = tuple[list[_HEntry], list[Any], list[int], list[TaskView]]


def _sorted_run(
    keys: list[Any], positions: Sequence[int] | None, first: int, tasks: Sequence[TaskView]
) -> tuple[list[Any], list[int], list[TaskView]]:
    """``keys``, push counters (``first`` + position in the batch: ``positions[i]``,
    or ``i`` when None) and ``tasks``, in stable *descending* order of key: the
    task that sorts first at the end. numpy sorts plain floats."""
    if all(type(k) is float for k in keys):
        arr = np.asarray(keys, dtype=float)
        desc = np.argsort(arr, kind="stable")[::-1]
        pos = desc if positions is None else np.asarray(positions, dtype=np.int64)[desc]
        order: list[int] = desc.tolist()
        return arr[desc].tolist(), (pos + first).tolist(), list(map(tasks.__getitem__, order))
    order = sorted(range(len(keys)), key=keys.__getitem__)
    order.reverse()
    pos_list = order if positions is None else list(map(positions.__getitem__, order))
    return (
        list(map(keys.__getitem__, order)),
        [first + p for p in pos_list],
        list(map(tasks.__getitem__, order)),
    )


def __getattr__(name: str) -> Any:
    """The old names of :data:`RENAMED` at module level (``TeamBooks``), with a warning."""
    if name in RENAMED and "." not in name:
        return globals()[warn_renamed(name)]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
