"""Every private piece of dask.distributed the plugin relies on, in one place.

daskjobs supports dask and distributed from :data:`LOWEST_SUPPORTED` on, with no
upper bound (pyproject.toml's lower bounds; CI runs the plugin's tests on that
release and on the newest one). At start the plugin calls :func:`check_scheduler`:
an older release, or one that lacks an attribute below, stops the plugin with a
:class:`DaskInternalsError` naming the installed versions, the lowest supported one
and each missing piece, instead of failing later inside a hook.

The lowest release is :data:`LOWEST_SUPPORTED`: every piece below is in releases from
2024.12.0 on (``GraphNode.substitute`` is new in it), but before 2025.4.0 dask read a string
argument equal to a task's key as a reference to that task (a graph cycle), and the
plugin's tests fail there.

No other module of daskjobs touches a private attribute of dask's ``Scheduler``,
``TaskState`` or ``WorkerState`` (tests/project/test_dask_boundary.py scans for it; that test
says what counts as private). They call the *verbs* here instead, each named for what
it does to dask and each with a small behavioural self-check that
:func:`check_scheduler` runs at start (:data:`SELF_CHECKS`: dask's own method on a
stand-in, its own heap on two probes, its own slot count on a worker it makes), so a
release that changes what a verb relies on is named at start, with the verb:

* :func:`wrap_priorities` / :func:`unwrap_priorities` / :func:`set_priority` - ranking (and
  which client sent each graph: :class:`NewGraph`);
* :func:`watch_clients` / :func:`unwatch_clients` and :func:`peer_names` - each client's
  certificate, read as it connects, where teams are bound to identity (checked at start only
  there: :func:`check_identity_verbs`);
* :func:`task_call` and :func:`references` - what a task calls (``TaskState.run_spec``'s
  function, arguments and keywords, read only), the stage and parameters of a plain task;
* :func:`wrap_stream_handler` / :func:`unwrap_stream_handler` - the start reports;
* :func:`wrap_graph_handler` and :func:`refuse_unread` - admission limits: a client's graph
  weighed before dask reads it, and refused without being read;
* :func:`reprioritize` - re-ranking a stage's waiting tasks as its estimates improve, in
  dask's queue and (through the worker plugin and its sibling module
  :mod:`daskjobs.plugin.surgery._worker_internals`, whose verbs a worker checks at setup) in the
  workers' ready heaps;
* :func:`queued_tasks`, :func:`promote`, :func:`idle_workers`, :func:`free_slots`,
  :func:`withhold_slots`, :func:`restore_slots` - the release gate;
* :func:`fail_tasks` - a refused submission's tasks err with the refusal;
* :func:`ensure_client`, :func:`has_worker_plugin`, :func:`install_worker_plugin`,
  :func:`remove_worker_plugin`, :func:`closing`, :func:`http_router` - clients, worker plugins,
  pages;
* :func:`add_copy` and :func:`redirect` - speculation (below).

What is used, and why (see docs/how-to/load-the-plugin.md and the research notes):

* ``Scheduler._set_priorities(*, internal_priority, submitting_task, user_priority,
  fifo_timeout, start, tasks)`` - wrapped on the instance so that estimate-based
  priorities are in place *before* the scheduler sorts the first recommendations
  of a new graph; a rewrite in the public ``update_graph`` hook comes too late for
  the first slots. ``Scheduler._create_taskstate_from_graph(*, client, ...)``, which calls
  it synchronously, is wrapped too, to know the graph's client there.
* ``Scheduler.handlers["register-client"]`` (``add_client(comm, client, versions)``, which
  serves the client's stream while it is connected) - wrapped where teams are bound to
  certificates: the connection's ``extra_info["peercert"]`` is read as the client connects,
  and the connection's ``read`` is wrapped so that an ``update-graph`` message names the
  stream's own client (dask's ``handle_stream`` lets a message's keys override the stream's).
* ``TaskState.priority`` - a tuple of numbers, lower runs first; dask's own is
  ``(-user_priority, generation, order)``. The plugin makes it
  ``(-user_priority, policy_key, generation, order)``.
* ``Scheduler.queued`` (a ``HeapSet`` keyed on priority) and
  ``Scheduler.idle_task_count`` - fair share promotes the one task the policy
  chose (``discard`` then ``add`` with a smaller priority, which the heap's lazy
  deletion handles; a demotion would not be safe and is never done) when a slot
  is about to be filled. The release gate reads that set as dask does (the least
  busy worker, ``len(processing) / nthreads``, gets the head of the queue; free slots
  as ``_task_slots_available`` counts them), promotes one task per free slot in that
  order, and *removes* a worker from ``idle_task_count`` when the policy leaves its
  slots idle (a worker measured slow), only while a task end is being handled, before
  dask counts the free slots: dask fills only the slots of workers in that set. It
  puts refused workers back with dask's own ``check_idle_saturated`` at the next task
  end (then asks again), when nothing is held, and when nothing runs anywhere.
* ``TaskState.annotations``, ``.dependencies``, ``.key``, ``.prefix.name``,
  ``.state``, ``.group`` - read only.
* ``Scheduler.stream_handlers["log-event"]`` - wrapped (and passed through) so that
  the start reporter's events are read with the address of the worker stream they
  came on; a client's ``log_event`` on the same topic is not taken for one.

Backup copies (:mod:`daskjobs.plugin.enact.speculation`) are ordinary dask tasks, so
that the scheduler's own state knows about them: their inputs are pinned on
their worker while they run (the active memory manager never drops a replica a
processing dependent needs), their thread is counted, work stealing and the
dashboard see them. Two functions here change the task graph, both through the
scheduler's own objects and transitions:

* :func:`add_copy` - ``Scheduler.new_task`` for the copy's key with the task's
  ``run_spec`` re-keyed (``GraphNode.substitute``), the same dependencies
  (``TaskState.add_dependency``), a hard worker restriction and the task's
  resource restrictions, a priority one step ahead of the task's; wanted by the
  comm-less client :data:`COPIES_CLIENT` (``Scheduler.client_desires_keys``, as
  dask does for published datasets) and sent on with ``Scheduler.transitions``; the spans extension
  (``observe_tasks``) files it under a span, as workers report metrics per span.
* :func:`redirect` - once the copy is in memory and the task is not, the task
  becomes an ``Alias`` of the copy: its dependencies are replaced by the copy
  (``dependencies``/``dependents``/``waiters``/``waiting_on``, as dask's own
  transitions keep them), it is loosely restricted to the copy's worker, and
  ``Scheduler.transitions`` releases it from its old worker (dask sends
  ``free-keys``; a stale result from there is dropped by dask's ``run_id``
  check) and runs the alias where the copy's result is. Inputs nobody else waits
  for are released as dask releases them after a task finishes.
  ``Scheduler.client_releases_keys`` drops the copies client's claim: the copy's
  result stays while the alias needs it, then is released as an intermediate.

Resources and gangs (:mod:`daskjobs.plugin.enact.gangs`) hold a task by giving it a worker
restriction no worker has (``TaskState.worker_restrictions``, ``host_restrictions``
cleared, ``loose_restrictions`` false: dask keeps it in ``no-worker``), and place it by
restricting it to the chosen worker and recommending ``processing`` through
``Scheduler.transitions``; all members of a gang in one call.
"""

from __future__ import annotations

import functools
import heapq
import inspect
import math
import re
from collections.abc import Callable, Collection, Container, Hashable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from dask.typing import Key
    from distributed.scheduler import Recs, Scheduler, TaskState, WorkerState

__all__ = [
    "COPIES_CLIENT",
    "LOWEST_SUPPORTED",
    "PREEMPTION_CHECKS",
    "REQUIRED_SCHEDULER_ATTRS",
    "SELF_CHECKS",
    "DaskInternalsError",
    "NewGraph",
    "Pinned",
    "add_copy",
    "ask_to_yield",
    "check_identity_verbs",
    "check_preemption_verbs",
    "check_scheduler",
    "check_versions",
    "closing",
    "compute_seconds",
    "ensure_client",
    "fail_tasks",
    "free_slots",
    "has_worker_plugin",
    "hold",
    "http_router",
    "idle_workers",
    "install_worker_plugin",
    "peer_names",
    "pending_count",
    "pin",
    "pinned",
    "place",
    "priorities_wrapped",
    "promote",
    "queued_tasks",
    "redirect",
    "references",
    "refuse_unread",
    "release",
    "remove_worker_plugin",
    "reprioritize",
    "restore_slots",
    "set_priority",
    "state_count",
    "steal_in_order",
    "task_call",
    "unpin",
    "unwatch_clients",
    "unwrap_priorities",
    "unwrap_stream_handler",
    "watch_clients",
    "withhold_slots",
    "wrap_graph_handler",
    "wrap_priorities",
    "wrap_stream_handler",
]

#: The oldest dask and distributed release daskjobs runs on (also pyproject.toml's lower
#: bounds and the release .ci/run tests; tests/project/test_packaging.py checks they agree).
LOWEST_SUPPORTED = "2025.4.0"

#: The (comm-less) client that wants backup copies while their race runs.
COPIES_CLIENT = "daskjobs-copies"

#: Scheduler attributes the plugin needs, with what it uses them for.
REQUIRED_SCHEDULER_ATTRS: dict[str, str] = {
    "_set_priorities": "estimate-based priorities before the first dispatch",
    "tasks": "task states by key",
    "workers": "worker states by address",
    "log_event": "the audit trail",
    "handlers": "the plugin's RPC handlers (explain, status)",
    "periodic_callbacks": "periodic history saves",
    "queued": "fair share: promote the task the policy chose to the head of the queue",
    "idle_task_count": "are slots free right now? (a slot the policy leaves idle: not)",
    "check_idle_saturated": "a worker the policy left idle goes back among the free slots",
    "stream_handlers": "start reports read from the workers' own streams ('log-event')",
    "new_task": "speculation: a backup copy is a task of its own",
    "client_desires_keys": "speculation: the copies client wants a running copy",
    "client_releases_keys": "speculation: a settled copy is no longer wanted",
    "transitions": "speculation: run a copy; redirect a task to its winning copy",
    "extensions": "speculation: move tasks off a worker where a losing copy's thread still runs",
    "stream_comms": "preemption and gangs: ask running tasks to yield; re-ranking on workers",
    "register_worker_plugin": "the start and inventory reporters on every worker",
    "client_comms": "admission: tell a client its graph was refused unread",
}

#: TaskState attributes read or written by add_copy / redirect.
REQUIRED_TASK_ATTRS = (
    "run_spec",
    "dependencies",
    "dependents",
    "waiters",
    "waiting_on",
    "worker_restrictions",
    "loose_restrictions",
    "resource_restrictions",
    "host_restrictions",
    "priority",
    "run_id",
    "who_has",
    "add_dependency",
)


class DaskInternalsError(RuntimeError):
    """The running dask.distributed lacks something the plugin relies on."""


def _release(version: str) -> tuple[int, ...]:
    """``(year, month, patch)`` of a dask CalVer string; a development build
    (``2026.8.0+12.g1234abc``, ``2026.9.0.dev3``) counts as its release."""
    parts = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if parts is None:
        raise ValueError(f"not a dask version: {version!r}")
    return tuple(int(p or 0) for p in parts.groups())


def check_versions(dask_version: str, distributed_version: str) -> list[str]:
    """What is wrong with these versions of dask and distributed: a list of phrases,
    empty if both are :data:`LOWEST_SUPPORTED` or newer."""
    lowest = _release(LOWEST_SUPPORTED)
    return [
        f"{name} {version} is older than {LOWEST_SUPPORTED}"
        for name, version in (("dask", dask_version), ("distributed", distributed_version))
        if _release(version) < lowest
    ]


def check_scheduler(scheduler: Any, identities: bool = False) -> None:
    """Raise :class:`DaskInternalsError` if the installed dask or distributed is older than
    :data:`LOWEST_SUPPORTED` or lacks anything the plugin uses, naming the installed
    versions, the lowest supported one and each missing attribute. ``identities``: the
    identity verbs too (teams bound to certificates: :func:`check_identity_verbs`)."""
    import dask
    import distributed

    too_old = check_versions(dask.__version__, distributed.__version__)
    missing = [
        f"Scheduler.{name} ({why})"
        for name, why in REQUIRED_SCHEDULER_ATTRS.items()
        if not hasattr(scheduler, name)
    ]
    from distributed.scheduler import TaskState as _TS

    slots = {s for c in _TS.__mro__ for s in getattr(c, "__slots__", ())}
    missing += [
        f"TaskState.{name} (speculation)"
        for name in REQUIRED_TASK_ATTRS
        if name not in slots and not hasattr(_TS, name)
    ]
    try:
        from dask._task_spec import Alias, GraphNode

        if not hasattr(GraphNode, "substitute"):
            missing.append("dask._task_spec.GraphNode.substitute (speculation)")
        del Alias
    except ImportError:
        missing.append("dask._task_spec.Alias (speculation)")
    if not missing:
        missing += check_speculation_verbs(scheduler)
    if not (too_old or missing):
        # every attribute is there: does each verb still behave as it relies on?
        missing += _self_check(scheduler)
        missing += check_preemption_verbs(scheduler)
        if identities:
            missing += check_identity_verbs(scheduler)
    if not (too_old or missing):
        return
    from daskjobs import __version__

    installed = f"distributed {distributed.__version__} (dask {dask.__version__})"
    problems = too_old + ([f"missing {'; '.join(missing)}"] if missing else [])
    if too_old:
        advice = f"install dask and distributed {LOWEST_SUPPORTED} or newer"
    else:  # a newer release changed something daskjobs relies on
        advice = (
            "this release changed what daskjobs relies on: please report it to daskjobs, "
            "and meanwhile install an earlier release of dask and distributed "
            f"({LOWEST_SUPPORTED} or newer)"
        )
    raise DaskInternalsError(
        f"daskjobs {__version__} cannot run on {installed}: {'; '.join(problems)}. "
        f"daskjobs supports dask and distributed {LOWEST_SUPPORTED} and newer; {advice}."
    )


def add_copy(
    sched: Scheduler,
    ts: TaskState,
    copy_key: Key,
    worker: str,
    stimulus_id: str,
    annotations: dict[str, Any] | None = None,
) -> TaskState:
    """Create the backup copy of ``ts`` as a task ``copy_key`` that may run only on
    ``worker``, and send it there (see the module docstring)."""
    spec = ts.run_spec
    assert spec is not None
    cts = sched.new_task(copy_key, spec.substitute({}, key=copy_key), "released")
    for dts in ts.dependencies:
        cts.add_dependency(dts)
    cts.annotations = dict(annotations or {})
    cts.worker_restrictions = {worker}
    cts.loose_restrictions = False
    if ts.resource_restrictions:
        cts.resource_restrictions = dict(ts.resource_restrictions)
    p = ts.priority
    assert p is not None
    cts.priority = (p[0] - 1, *p[1:])  # ahead of the task on the copy's worker
    spans = sched.extensions.get("spans")
    if spans is not None:  # workers report metrics per span: the copy needs one
        spans.observe_tasks([cts], code=(), span_metadata={})
    sched.client_desires_keys(keys=[copy_key], client=COPIES_CLIENT)
    sched.transitions({copy_key: "waiting"}, stimulus_id)
    return cts


def redirect(sched: Scheduler, ts: TaskState, cts: TaskState, stimulus_id: str) -> None:
    """Make ``ts`` an alias of its copy ``cts`` (in memory) and run it where the copy's
    result is (see the module docstring). ``ts`` is waiting, queued, no-worker or
    processing; its former inputs stay with the copy (its lineage)."""
    from dask._task_spec import Alias

    assert cts.who_has, "the copy's result is not in memory"
    state = ts.state
    recs: Recs = {}
    for dts in list(ts.dependencies):
        if dts is cts:
            continue
        ts.dependencies.discard(dts)
        dts.dependents.discard(ts)
        if dts.waiters:
            dts.waiters.discard(ts)
        if ts.waiting_on:
            ts.waiting_on.discard(dts)
        if dts.state != "released" and not dts.waiters and not dts.who_wants:
            recs[dts.key] = "released"  # nobody needs it now, as after a task's end
    ts.add_dependency(cts)
    if cts.waiters is None:
        cts.waiters = set()
    cts.waiters.add(ts)
    ts.run_spec = Alias(ts.key, cts.key)
    ts.worker_restrictions = {ws.address for ws in cts.who_has}
    ts.loose_restrictions = True  # anywhere if that worker is gone
    # the copy may be recomputed anywhere if its result is lost later
    cts.worker_restrictions = None
    cts.loose_restrictions = False
    if state == "waiting":
        if not ts.waiting_on:
            recs[ts.key] = "processing"
    else:
        if state != "queued":
            ts.priority = cts.priority  # first on the copy's worker
        recs[ts.key] = "released"  # then waiting -> processing, by dask's own transitions
    sched.transitions(recs, stimulus_id)
    sched.client_releases_keys(keys=[cts.key], client=COPIES_CLIENT, stimulus_id=stimulus_id)


# -- the verbs --------------------------------------------------------------------------------
#
# Each verb below is the only place its piece of dask is touched, and each has a self-check
# (registered with ``@_checks``) that ``check_scheduler`` runs at start: a small experiment
# on dask's own classes, or on a stand-in, that fails if the behaviour the verb relies on
# changed. A self-check never changes the live scheduler.

#: verb name -> its self-check (raises, with what is wrong, if dask changed)
SELF_CHECKS: dict[str, Callable[[Any], None]] = {}


def _registrar(
    table: dict[str, Callable[[Any], None]], *verbs: str
) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    """A decorator that files a self-check in ``table`` under each of ``verbs``."""

    def register(check: Callable[[Any], None]) -> Callable[[Any], None]:
        for verb in verbs:
            table[verb] = check
        return check

    return register


def _checks(*verbs: str) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    return _registrar(SELF_CHECKS, *verbs)


def _run_checks(table: dict[str, Callable[[Any], None]], scheduler: Any) -> list[str]:
    """Run each self-check of ``table`` once; a phrase per verb that failed."""
    out: list[str] = []
    done: dict[Callable[[Any], None], str | None] = {}
    for verb, check in table.items():
        if check not in done:
            try:
                check(scheduler)
                done[check] = None
            except Exception as e:
                done[check] = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        problem = done[check]
        if problem is not None:
            out.append(f"{verb} ({problem})")
    return out


def _self_check(scheduler: Any) -> list[str]:
    """Run each verb's self-check once; a phrase per verb that failed."""
    return _run_checks(SELF_CHECKS, scheduler)


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(what)


# ---- ranking: estimate-based priorities before the first dispatch -----------------------------


class NewGraph(NamedTuple):
    """What :func:`wrap_priorities` tells of each new graph: the tasks dask just gave their
    priorities, the id of the client that sent it (None if dask did not say), and the key
    of the task that submitted it from a worker (``worker_client``), if any."""

    tasks: Iterable[TaskState]
    client: str | None
    submitting_task: Key | None


def wrap_priorities(
    sched: Scheduler,
    after: Callable[[NewGraph], bool],
    built: Callable[[str, Mapping[Key, Any], Collection[Key]], BaseException | None] | None = None,
) -> None:
    """Call ``after(graph)`` (a :class:`NewGraph`) each time dask has given a new graph's
    tasks their priorities (``Scheduler._set_priorities``), before it sorts their first
    recommendations. The graph's client is the ``client`` dask's
    ``Scheduler._create_taskstate_from_graph`` was called with (synchronous: it calls
    ``_set_priorities`` within the same call, and nothing else runs in between).
    ``after`` returning False unwraps (a plugin unregistered without ``close``). A wrap of
    an earlier registration is undone first. O(1) added per graph.

    ``built(client, dsk, keys)``, if given, sees each graph dask has read and ordered but
    not yet turned into tasks (``dsk``: its tasks, ``keys``: those the client asks for)
    and returns None (dask goes on) or the error that refuses it: dask then creates none
    of its tasks, and the client hears of it as of a graph refused unread
    (:func:`refuse_unread`), so a refusal costs one message, however large the graph. An
    exception ``built`` raises lets the graph through."""
    unwrap_priorities(sched)
    original = sched._set_priorities
    create = sched._create_taskstate_from_graph
    signature = inspect.signature(original)
    sending: list[str | None] = [None]  # the client of the graph dask is creating, innermost last

    def _create_taskstate_from_graph(*args: Any, **kwargs: Any) -> Any:
        client, dsk, keys = kwargs.get("client"), kwargs.get("dsk"), kwargs.get("keys")
        if built is not None and dsk is not None and keys:
            try:
                verdict = built(str(client), dsk, keys)
            except Exception:  # a failing check never stops dask taking graphs
                verdict = None
            if isinstance(verdict, BaseException):
                refuse_unread(sched, str(client), keys, verdict)
                return {"tasks": len(dsk), "new_tasks": 0, "key_collisions": 0}  # dask's metrics
        sending.append(kwargs.get("client"))
        try:
            return create(*args, **kwargs)
        finally:
            sending.pop()

    def _set_priorities(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs).arguments
        graph = NewGraph(bound["tasks"], sending[-1], bound.get("submitting_task"))
        if after(graph) is False and sched._set_priorities is _set_priorities:
            unwrap_priorities(sched)

    sched._set_priorities = _set_priorities  # type: ignore[method-assign]
    sched._create_taskstate_from_graph = _create_taskstate_from_graph  # type: ignore[method-assign]
    sched._daskjobs_wrapped = original  # type: ignore[attr-defined]
    sched._daskjobs_wrapped_create = create  # type: ignore[attr-defined]


def unwrap_priorities(sched: Scheduler) -> bool:
    """Undo :func:`wrap_priorities`; False if nothing was wrapped."""
    original = getattr(sched, "_daskjobs_wrapped", None)
    if original is None:
        return False
    sched._set_priorities = original  # type: ignore[method-assign]
    sched._daskjobs_wrapped = None  # type: ignore[attr-defined]
    create = getattr(sched, "_daskjobs_wrapped_create", None)
    if create is not None:
        sched._create_taskstate_from_graph = create  # type: ignore[method-assign]
        sched._daskjobs_wrapped_create = None  # type: ignore[attr-defined]
    return True


def priorities_wrapped(sched: Scheduler) -> bool:
    return getattr(sched, "_daskjobs_wrapped", None) is not None


def set_priority(ts: TaskState, priority: tuple[float, ...]) -> None:
    """Give ``ts`` a priority of the plugin's (lower runs first), while it is not in
    dask's queue (a queued task moves with :func:`promote`)."""
    ts.priority = priority


def pending_count(sched: Scheduler, states: Iterable[str]) -> int:
    """How many of the scheduler's tasks are in one of ``states`` now, from the state
    counts dask keeps per task group (``TaskGroup.states``): O(task groups), never a
    scan of the tasks. -1 (matches no count) if this release keeps no such counts."""
    return _counted(getattr(sched, "task_groups", None), states)


def state_count(sched: Scheduler, states: Iterable[str]) -> int:
    """How many of the scheduler's tasks are in one of ``states`` now, from the state counts
    dask keeps per task prefix (``TaskPrefix.states``, a function's name: a handful, where a
    ``client.map`` makes a task group per task): O(prefixes). -1 if this release keeps none."""
    return _counted(getattr(sched, "task_prefixes", None), states)


def _counted(groups: Any, states: Iterable[str]) -> int:
    """The sum of ``states``' counts over ``groups`` (task groups or prefixes, by name), or
    -1 if there are none or one keeps no ``states`` counts."""
    if groups is None:
        return -1
    wanted = tuple(states)
    total = 0
    for group in list(groups.values()):
        counts = getattr(group, "states", None)
        if counts is None:
            return -1
        for s in wanted:
            total += counts.get(s, 0)
    return total


class _Probe:
    """A task-like stand-in for the self-checks (weak-referenceable, as dask's heap needs)."""

    __slots__ = ("__weakref__", "annotations", "key", "priority", "run_spec")

    def __init__(self, key: str, priority: Any = None) -> None:
        self.key = key
        self.priority = priority
        self.annotations: dict[str, Any] = {}
        self.run_spec = None


class _SchedulerStub:
    """What dask's ``_set_priorities`` reads of its scheduler, for the self-check."""

    def __init__(self) -> None:
        self.tasks: dict[Any, Any] = {}
        self.generation = 0
        self._last_time = 0.0
        self.validate = False


@_checks("wrap_priorities", "set_priority")
def _check_priorities(sched: Any) -> None:
    # dask's own method on a stand-in: a new graph's task gets (-user priority, generation,
    # dask.order position), the shape ranking reads (len 3 = not ranked yet; [2] = position)
    probe = _Probe("daskjobs-check")
    bound = getattr(sched, "_daskjobs_wrapped", None) or sched._set_priorities  # dask's own
    method = getattr(bound, "__func__", None)
    if method is None:
        raise AssertionError("Scheduler._set_priorities is not a method")
    params = inspect.signature(method).parameters
    _expect("tasks" in params, "Scheduler._set_priorities takes no 'tasks'")
    method(
        _SchedulerStub(),
        internal_priority={probe.key: 7},
        submitting_task=None,
        user_priority=3,
        fifo_timeout=0,
        start=1.0,
        tasks={probe},
    )
    p = probe.priority
    _expect(
        isinstance(p, tuple) and len(p) == 3 and p[0] == -3 and p[2] == 7,
        f"a new task's priority is {p!r}, not (-user priority, generation, order)",
    )
    _expect("submitting_task" in params, "Scheduler._set_priorities takes no 'submitting_task'")
    _check_graph_client(sched)


class _Reached(Exception):
    """The stand-in's ``_set_priorities`` was called (with these keywords)."""


class _GraphStub:
    """What dask's ``_create_taskstate_from_graph`` reads of its scheduler before it sets
    priorities, for the self-check: an idle scheduler that makes no tasks."""

    def __init__(self) -> None:
        self.is_idle = True
        self.computations: list[Any] = []
        self.extensions: dict[str, Any] = {}

    def _generate_taskstates(self, **kwargs: Any) -> tuple[Any, ...]:
        if "dependencies" in kwargs:  # releases before 2025.12: (runnable, touched, new, n)
            return set(), set(), set(), 0
        return set(), set(), 0

    def _apply_annotations(self, **kwargs: Any) -> set[Any]:
        return set()

    def _set_priorities(self, **kwargs: Any) -> None:
        raise _Reached(kwargs)


def _check_graph_client(sched: Any) -> None:
    # the graph's client is the keyword dask's own _create_taskstate_from_graph takes, and
    # that method sets the new graph's priorities within the call (what the wrap relies on)
    bound = getattr(sched, "_daskjobs_wrapped_create", None) or sched._create_taskstate_from_graph
    method = getattr(bound, "__func__", None)
    if method is None:
        raise AssertionError("Scheduler._create_taskstate_from_graph is not a method")
    params = inspect.signature(method).parameters
    for name in ("client", "dsk", "keys"):
        _expect(
            name in params and params[name].kind == inspect.Parameter.KEYWORD_ONLY,
            f"Scheduler._create_taskstate_from_graph takes no keyword {name!r}",
        )
    kwargs: dict[str, Any] = dict(
        start=0.0,
        dsk={},
        keys=set(),
        ordered={},
        client="daskjobs-check",
        annotations_by_type={},
        global_annotations=None,
        stimulus_id="daskjobs-check",
        submitting_task="daskjobs-check-parent",
        span_metadata={},
    )
    if "dependencies" in inspect.signature(method).parameters:  # (releases before 2025.12)
        kwargs["dependencies"] = {}
    try:
        method(_GraphStub(), **kwargs)
    except _Reached as e:
        (given,) = e.args
        _expect(
            given.get("submitting_task") == "daskjobs-check-parent",
            "the graph's submitting task does not reach _set_priorities",
        )
        return
    raise AssertionError("Scheduler._create_taskstate_from_graph does not set priorities")


# ---- ranking: what a task calls ----------------------------------------------------------------


@functools.cache
def references() -> tuple[type, ...]:
    """The types that stand for another task's output (or a nested call) in the arguments
    :func:`task_call` gives."""
    from dask._task_spec import GraphNode, TaskRef

    return (TaskRef, GraphNode)


def task_call(ts: TaskState) -> tuple[Any, tuple[Any, ...], dict[str, Any]] | None:
    """``(function, args, kwargs)`` of the call ``ts`` runs, as the client wrote it (an
    input that is another task's output appears as an instance of :func:`references`);
    None for a task that calls nothing (an alias, data) or a run spec of another kind.
    Read only, O(1): the arguments are dask's own objects, never copied."""
    spec = getattr(ts, "run_spec", None)
    func = getattr(spec, "func", None)
    if func is None:
        return None
    args = getattr(spec, "args", ())
    kwargs = getattr(spec, "kwargs", None)
    return func, args if isinstance(args, tuple) else tuple(args), kwargs or {}


@_checks("task_call")
def _check_task_call(sched: Any) -> None:
    from dask._task_spec import Alias, Task, TaskRef

    def f(n: int, window: int = 1) -> int:
        return n

    probe: Any = _Probe("daskjobs-check")
    probe.run_spec = Task("daskjobs-check", f, 5, TaskRef("other"), window=3)
    got = task_call(probe)
    _expect(got is not None, "a Task run spec has no func")
    assert got is not None
    func, args, kwargs = got
    _expect(func is f, "Task.func is not the function")
    _expect(args[0] == 5 and len(args) == 2, f"Task.args is {args!r}, not (5, TaskRef)")
    _expect(isinstance(args[1], references()), "an input is not a TaskRef")
    _expect(kwargs == {"window": 3}, f"Task.kwargs is {kwargs!r}, not {{'window': 3}}")
    probe.run_spec = Alias("daskjobs-check", "other")
    _expect(task_call(probe) is None, "an Alias calls a function")


# ---- start reports: a worker stream handler, wrapped ------------------------------------------


def wrap_stream_handler(
    sched: Scheduler, name: str, before: Callable[..., bool]
) -> tuple[Any, Any, Any]:
    """Wrap dask's handler of the worker stream message ``name``: ``before(worker=...,
    **msg)`` sees each message first (with the address of the worker stream it came on);
    it returning False unwraps. dask's handler always runs. Returns the handle for
    :func:`unwrap_stream_handler`."""
    original = sched.stream_handlers[name]

    def handler(*args: Any, **kwargs: Any) -> Any:
        if before(*args, **kwargs) is False and sched.stream_handlers.get(name) is handler:
            sched.stream_handlers[name] = original  # step aside
        return original(*args, **kwargs)

    sched.stream_handlers[name] = handler
    return (name, original, handler)


def unwrap_stream_handler(sched: Scheduler, handle: tuple[Any, Any, Any] | None) -> None:
    """Undo :func:`wrap_stream_handler` (if the wrapper is still the handler)."""
    if handle is None:
        return
    name, original, handler = handle
    if sched.stream_handlers.get(name) is handler:
        sched.stream_handlers[name] = original


@_checks("wrap_stream_handler")
def _check_stream_handler(sched: Any) -> None:
    handler = sched.stream_handlers.get("log-event")
    _expect(callable(handler), "no stream handler 'log-event'")
    inspect.signature(handler).bind(worker="tcp://w:1", topic="t", msg={})


# ---- admission: a client's graph, before dask reads it ----------------------------------------

#: A refused graph of at most this many keys fails each key's future with the refusal (one
#: message a key, as dask reports a graph it cannot read); a larger one is cancelled in one
#: message carrying the refusal's text (one message a key would cost as much as the graph).
ERR_EACH = 1000


def wrap_graph_handler(
    sched: Scheduler, before: Callable[[str, int, int], BaseException | bool | None]
) -> tuple[Any, Any, Any]:
    """Wrap dask's handler of a client's ``update-graph`` message: ``before(client, keys,
    nbytes)`` sees each graph before dask deserialises or builds it (``keys``: how many keys
    the client asks for; ``nbytes``: the size of the graph as sent, pickled) and returns None
    (dask goes on), False (step aside: unwrap) or the error that refuses the graph, which
    dask then never reads: :func:`refuse_unread` tells the client. An exception ``before``
    raises lets the graph through. O(1) per graph. Returns the handle for
    :func:`unwrap_stream_handler`."""
    name = "update-graph"
    original = sched.stream_handlers[name]

    async def handler(**msg: Any) -> Any:
        client = msg.get("client")
        keys = msg.get("keys") or ()
        try:
            verdict = before(str(client), len(keys), _graph_bytes(msg.get("expr_ser")))
        except Exception:  # a failing check never stops dask taking graphs
            verdict = None
        if verdict is False:
            if sched.stream_handlers.get(name) is handler:
                sched.stream_handlers[name] = original
        elif isinstance(verdict, BaseException):
            refuse_unread(sched, str(client), keys, verdict)
            return None
        return await original(**msg)

    handler.__wrapped__ = original  # type: ignore[attr-defined]  # its signature: dask's
    sched.stream_handlers[name] = handler
    return (name, original, handler)


def _graph_bytes(expr_ser: Any) -> int:
    """The size of a graph as the client sent it (dask's ``Serialized``: header, frames)."""
    frames = getattr(expr_ser, "frames", None)
    if not frames:
        return 0
    return sum(memoryview(f).nbytes for f in frames)


def refuse_unread(sched: Scheduler, client: str, keys: Iterable[Key], error: BaseException) -> None:
    """Tell ``client`` that its graph of ``keys`` was refused with ``error`` and never read:
    each key's future raises ``error`` (up to :data:`ERR_EACH` keys; a larger graph's
    futures are cancelled, their ``FutureCancelledError`` carrying the error's text). A key
    the client already holds (a result it asked for again) is left as it is. Only that
    client hears of it (dask's ``Scheduler.report`` would tell every client holding a key)."""
    comm = sched.client_comms.get(client)
    if comm is None:
        return
    cs = sched.clients.get(client)
    held = {ts.key for ts in cs.wants_what} if cs is not None and cs.wants_what else set()
    if isinstance(keys, set | frozenset | list | tuple) and len(keys) <= ERR_EACH:
        from distributed.core import error_message

        msg = error_message(error)
        for key in keys:
            if key not in held:
                comm.send(
                    {
                        "op": "task-erred",
                        "key": key,
                        "exception": msg["exception"],
                        "traceback": msg["traceback"],
                    }
                )
        return
    rest = [k for k in keys if k not in held] if held else list(keys)
    from daskjobs.errors import REFUSED_REASON

    reason = f"{REFUSED_REASON} ({type(error).__name__})"
    comm.send({"op": "cancelled-keys", "keys": rest, "reason": reason, "msg": str(error)})


@_checks("wrap_graph_handler", "refuse_unread")
def _check_graph_handler(sched: Any) -> None:
    handler = sched.stream_handlers.get("update-graph")
    _expect(inspect.iscoroutinefunction(handler), "'update-graph' is not a coroutine handler")
    params = inspect.signature(handler).parameters
    for name in ("client", "expr_ser", "keys"):
        _expect(name in params, f"dask's update-graph takes no {name!r}")
    from distributed.protocol.serialize import Serialized

    probe = Serialized({}, [b"ab", memoryview(b"cde")])
    _expect(_graph_bytes(probe) == 5, "a Serialized graph has no frames")
    _expect(isinstance(sched.client_comms, dict), "Scheduler.client_comms is not a dict")
    _expect(isinstance(sched.clients, dict), "Scheduler.clients is not a dict")
    from distributed.client import Client
    from distributed.scheduler import ClientState

    _expect(hasattr(ClientState("daskjobs-check"), "wants_what"), "ClientState has no wants_what")
    inspect.signature(Client._handle_task_erred).bind(None, key="k", exception=None, traceback=None)
    inspect.signature(Client._handle_cancelled_keys).bind(None, keys=[], reason="r", msg="m")


# ---- the release gate: promotion in dask's queue, slots withheld ------------------------------


def queued_tasks(sched: Scheduler) -> Iterable[TaskState]:
    """dask's queue of root tasks waiting for a slot (unordered; ``priority`` orders it)."""
    return getattr(sched, "queued", ())


def promote(sched: Scheduler, ts: TaskState, rank: float) -> None:
    """Move queued ``ts`` ahead in dask's queue: its priority's second element (the
    plugin's rank) becomes ``rank``, smaller than before. dask's queue is a heap with
    lazy deletion: ``discard`` then ``add`` with a smaller key is safe (a demotion would
    leave the old entry ahead, and is never done)."""
    p = ts.priority
    assert p is not None
    queued = sched.queued
    queued.discard(ts)
    ts.priority = (p[0], rank, *p[2:])
    queued.add(ts)


@_checks("promote", "queued_tasks")
def _check_queue(sched: Any) -> None:
    queued = sched.queued
    for method in ("add", "discard", "peek", "pop", "__iter__"):
        _expect(hasattr(queued, method), f"Scheduler.queued has no {method}")
    a, b = _Probe("a", (0, 1.0)), _Probe("b", (0, 2.0))
    _expect(queued.key(a) == a.priority, "Scheduler.queued is not ordered by priority")
    heap = type(queued)(key=queued.key)
    heap.add(a)
    heap.add(b)
    heap.discard(b)
    b.priority = (0, 0.5)
    heap.add(b)
    order = [heap.peek()]
    order += [heap.pop(), heap.pop()]
    _expect(
        order == [b, b, a] and not heap,
        "a task promoted in Scheduler.queued (discard, smaller priority, add) is not first",
    )


def reprioritize(
    sched: Scheduler,
    changes: Iterable[tuple[TaskState, tuple[Any, ...]]],
    on_workers: Container[str] = (),
    op: str = "",
) -> int:
    """Give each task of ``changes`` that has not started its new priority (lower runs
    first), up or down, where it waits:

    * in dask's queue: taken out and put back under its new priority;
    * not yet runnable (``released``, ``waiting``, ``no-worker``): it just gets it (dask
      reads it when the task becomes runnable);
    * assigned to a worker (``processing``) whose address is in ``on_workers`` (its
      worker plugin takes the message ``op``): the scheduler's copy changes (work
      stealing and a retry send that one) and the worker gets the new priorities of its
      tasks in one ``op`` message on its stream, which the worker plugin enacts in its
      ready heaps (:func:`daskjobs.plugin.surgery._worker_internals.reorder`; a task that
      started there is skipped). A task on any other worker keeps its place.

    dask's queue is a heap with lazy deletion, where an entry left behind by a demoted
    task would still pop it at its old place: after any demotion the queue's stale
    entries are dropped in one pass (a list filter and ``heapify``, O(queued), at C
    speed). Returns the number of tasks whose priority changed. O(changes log queued),
    plus that pass when something moved back, plus one message per worker."""
    queued = sched.queued
    demoted = False
    n = 0
    sends: dict[str, list[Any]] = {}
    for ts, priority in changes:
        old = ts.priority
        if old == priority:
            continue
        if ts.state == "processing":
            ws = ts.processing_on
            if ws is None or ws.address not in on_workers:
                continue
            ts.priority = priority
            sends.setdefault(ws.address, []).append([ts.key, list(priority)])
        elif ts in queued:
            queued.discard(ts)
            ts.priority = priority
            queued.add(ts)
            demoted = demoted or (old is not None and priority > old)
        else:
            ts.priority = priority
        n += 1
    if demoted:
        _drop_stale_entries(queued)
    for address, rows in sends.items():
        comm = sched.stream_comms.get(address)
        if comm is not None:
            comm.send({"op": op, "priorities": rows})
    return n


def _drop_stale_entries(heap: Any) -> None:
    """Drop the entries of a ``HeapSet`` whose item is gone or was re-added under another
    key: what remains pops in the order of the items' current keys."""
    key = heap.key
    data = heap._data
    kept = []
    for entry in heap._heap:
        item = entry[2]()
        if item is not None and item in data and entry[0] == key(item):
            kept.append(entry)
    heapq.heapify(kept)
    heap._heap = kept
    heap._sorted = False


@_checks("reprioritize")
def _check_reprioritize(sched: Any) -> None:
    queued = sched.queued
    for name in ("_heap", "_data", "_sorted", "key"):
        _expect(hasattr(queued, name), f"Scheduler.queued has no {name}")
    heap = type(queued)(key=queued.key)
    a, b, c = _Probe("a", (0, 1.0)), _Probe("b", (0, 2.0)), _Probe("c", (0, 3.0))
    for p in (a, b, c):
        heap.add(p)
    # a moves back behind c, c ahead of b: the order is the new priorities'
    heap.discard(a)
    a.priority = (0, 4.0)
    heap.add(a)
    heap.discard(c)
    c.priority = (0, 0.5)
    heap.add(c)
    _drop_stale_entries(heap)
    order = [heap.pop(), heap.pop(), heap.pop()]
    _expect(
        order == [c, b, a] and not heap,
        "a task moved back in Scheduler.queued (discard, larger priority, add, stale "
        "entries dropped) does not pop at its new place",
    )


@_checks("reprioritize (on workers)")
def _check_reprioritize_on_workers(sched: Any) -> None:
    from daskjobs.plugin.surgery._worker_internals import check_worker_verbs

    _expect(isinstance(sched.stream_comms, dict), "Scheduler.stream_comms is not a dict")
    problems = check_worker_verbs()
    _expect(not problems, "; ".join(problems))


def idle_workers(sched: Scheduler) -> set[WorkerState]:
    """The workers whose free slots dask fills from its queue next (``idle_task_count``);
    the least busy takes the head of the queue."""
    return sched.idle_task_count


def free_slots(sched: Scheduler, ws: WorkerState) -> int:
    """Free slots of ``ws`` as dask counts them when it fills slots from its queue
    (``_task_slots_available``; every free thread without queuing)."""
    saturation = getattr(sched, "WORKER_SATURATION", 1.0)
    if math.isinf(saturation):
        return max(ws.nthreads - len(ws.processing), 0)
    cap = max(math.ceil(saturation * ws.nthreads), 1)
    return cap - (len(ws.processing) - len(getattr(ws, "long_running", ())))


def withhold_slots(sched: Scheduler, ws: WorkerState) -> None:
    """Leave ``ws``'s free slots idle: out of ``idle_task_count`` until
    :func:`restore_slots`. Only while a task end is handled, before dask counts the free
    slots (a worker taken out while dask fills them would leave a counted slot without
    a worker)."""
    sched.idle_task_count.discard(ws)


def restore_slots(sched: Scheduler, address: str) -> None:
    """Put a withheld worker back where dask's own rule puts it (``check_idle_saturated``:
    among the free slots if it runs and is not full)."""
    ws = sched.workers.get(address)
    if ws is not None:
        sched.check_idle_saturated(ws)


@_checks("idle_workers", "free_slots", "withhold_slots", "restore_slots")
def _check_slots(sched: Any) -> None:
    from distributed.core import Status
    from distributed.scheduler import WorkerState, _task_slots_available

    _expect(isinstance(sched.idle_task_count, set), "Scheduler.idle_task_count is not a set")
    inspect.signature(sched.check_idle_saturated).bind(None)
    ws = WorkerState(
        address="tcp://daskjobs-check:1",
        status=Status.running,
        pid=0,
        name="daskjobs-check",
        nthreads=3,
        memory_limit=0,
        local_directory="",
        nanny=None,
        server_id="daskjobs-check",
    )
    busy = [_Probe(f"p{i}") for i in range(2)]
    ws.processing.update(busy)  # type: ignore[arg-type]  # dask counts them only
    ws.long_running.add(busy[0])  # type: ignore[arg-type]

    class _Saturated:
        WORKER_SATURATION = 1.5

    ours, dasks = free_slots(_Saturated(), ws), _task_slots_available(ws, 1.5)  # type: ignore[arg-type]
    _expect(ours == dasks, f"dask counts {dasks} free slot(s) where daskjobs counts {ours}")


# ---- ranking: a refused submission fails the way dask fails a task -----------------------------


def fail_tasks(
    sched: Scheduler,
    tasks: Iterable[TaskState],
    error: BaseException,
    stimulus_id: str,
    waiting: Iterable[Key] = (),
) -> None:
    """Err ``tasks`` with ``error``, as dask errs a task whose function raised: each is
    blamed on itself and holds the pickled error, so the futures of its clients raise it
    and its dependents err with it; dask forgets it once they are released. ``tasks`` are
    a new graph's, released and wanted by no one yet (called before dask recommends
    anything); ``waiting`` are keys submitted before that wait for them (no-worker,
    queued, waiting or released), failed with them."""
    from distributed.core import error_message

    msg = error_message(error)
    failing = list(tasks)
    earlier = [sched.tasks[k] for k in waiting if k in sched.tasks]
    for ts in failing + earlier:
        # what dask's update_graph reports for a graph it cannot read (a Serialize)
        ts.exception, ts.traceback = msg["exception"], msg["traceback"]  # type: ignore[assignment]
        ts.exception_text, ts.traceback_text = msg["exception_text"], msg["traceback_text"]
        ts.exception_blame = ts
    recs: Recs = {ts.key: "erred" for ts in failing}
    recs.update({ts.key: "erred" for ts in earlier if ts.state in ("released", "waiting")})
    sched.transitions(recs, stimulus_id=stimulus_id)
    for ts in earlier:
        if ts.state in ("no-worker", "queued"):  # dask's own failure, blamed on itself
            r, cmsgs, wmsgs = sched._transition(ts.key, "erred", stimulus_id, cause=ts.key)
            sched._transitions(r, cmsgs, wmsgs, stimulus_id)
            sched.send_all(cmsgs, wmsgs)


@_checks("fail_tasks")
def _check_fail_tasks(sched: Any) -> None:
    from distributed.core import error_message
    from distributed.scheduler import TaskState

    slots = {s for c in TaskState.__mro__ for s in getattr(c, "__slots__", ())}
    for name in ("exception", "traceback", "exception_text", "traceback_text", "exception_blame"):
        _expect(name in slots, f"TaskState.{name} is gone")
    table = sched._TRANSITIONS_TABLE
    for start in ("released", "no-worker", "queued"):
        _expect((start, "erred") in table, f"dask has no {start} -> erred transition")
    inspect.signature(sched.transitions).bind({}, stimulus_id="daskjobs-check")
    inspect.signature(sched._transition).bind("k", "erred", "daskjobs-check", cause="k")
    inspect.signature(sched._transitions).bind({}, {}, {}, "daskjobs-check")
    inspect.signature(sched.send_all).bind({}, {})
    msg = error_message(ValueError("daskjobs-check"))
    for key in ("exception", "traceback", "exception_text", "traceback_text"):
        _expect(key in msg, f"distributed.core.error_message gives no {key!r}")


# ---- clients and worker plugins ----------------------------------------------------------------


def ensure_client(sched: Scheduler, name: str) -> None:
    """A comm-less client ``name`` that can want keys (as dask's published datasets)."""
    if name not in sched.clients:
        from distributed.scheduler import ClientState

        sched.clients[name] = ClientState(name)


def has_worker_plugin(sched: Scheduler, name: str) -> bool:
    return name in getattr(sched, "worker_plugins", {})


def closing(sched: Scheduler) -> bool:
    """Is the scheduler closing (or closed)? It takes its workers with it then."""
    return getattr(getattr(sched, "status", None), "name", "") in ("closing", "closed")


async def install_worker_plugin(sched: Scheduler, name: str, plugin: bytes) -> None:
    """Install the pickled worker plugin on every worker, now and joining later."""
    await sched.register_worker_plugin(None, plugin, name=name, idempotent=False)


async def remove_worker_plugin(sched: Scheduler, name: str) -> None:
    await sched.unregister_worker_plugin(None, name)


@_checks(
    "ensure_client", "has_worker_plugin", "install_worker_plugin", "remove_worker_plugin", "closing"
)
def _check_clients(sched: Any) -> None:
    from distributed.core import Status
    from distributed.scheduler import ClientState

    _expect({"closing", "closed"} <= set(Status.__members__), "Status has no closing/closed")
    _expect(isinstance(sched.status, Status), "Scheduler.status is not a distributed Status")

    _expect(isinstance(sched.clients, dict), "Scheduler.clients is not a dict")
    _expect(ClientState("daskjobs-check").client_key == "daskjobs-check", "ClientState changed")
    _expect(isinstance(sched.worker_plugins, dict), "Scheduler.worker_plugins is not a dict")
    inspect.signature(sched.register_worker_plugin).bind(None, b"", name="n", idempotent=False)
    inspect.signature(sched.unregister_worker_plugin).bind(None, "n")


# ---- clients' identities: who sent a graph ------------------------------------------------------
#
# Teams bound to identity (daskjobs.plugin.identity) need the certificate of each client's
# connection, which dask keeps on the connection only: ``Scheduler.add_client(comm, client,
# versions)``, dask's handler of ``register-client``, has it and serves the client's stream for
# as long as the client is connected; over TLS ``comm.extra_info["peercert"]`` is the peer's
# certificate as :meth:`ssl.SSLSocket.getpeercert` gives it (distributed/comm/tcp.py, ``TLS``).
# These verbs are checked only where the operator binds teams to identities
# (:func:`check_identity_verbs`): a scheduler that does not runs without them.

#: verb -> its self-check (raises AssertionError, saying what changed)
IDENTITY_CHECKS: dict[str, Callable[[Any], None]] = {}


def _identity_check(*verbs: str) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    return _registrar(IDENTITY_CHECKS, *verbs)


def check_identity_verbs(scheduler: Any) -> list[str]:
    """Run each identity verb's self-check once; a phrase per failing verb."""
    return _run_checks(IDENTITY_CHECKS, scheduler)


def peer_names(comm: Any) -> tuple[str, ...] | None:
    """The names the peer certificate of connection ``comm`` gives: its subject common name,
    then its subject alternative names (their values: ``alice@example.com``,
    ``node-7.example.com``), in the certificate's order, each once; None for a connection
    without a verified certificate (not TLS); ``()`` for a certificate whose names cannot be
    read."""
    extra = getattr(comm, "extra_info", None)
    cert = extra.get("peercert") if isinstance(extra, dict) else None
    if not cert or not isinstance(cert, dict):
        return None
    names: list[str] = []
    try:
        for rdn in cert.get("subject", ()):
            for attr, value in rdn:
                if attr == "commonName" and value:
                    names.append(str(value))
        for _kind, value in cert.get("subjectAltName", ()):
            if value:
                names.append(str(value))
    except (TypeError, ValueError):  # a shape ssl does not give: no name to trust
        return ()
    return tuple(dict.fromkeys(names))


def watch_clients(
    sched: Scheduler,
    connected: Callable[[str, tuple[str, ...] | None], bool],
    left: Callable[[str], None],
) -> tuple[Any, Any]:
    """Wrap dask's ``register-client`` handler: ``connected(client, names)`` hears of each
    client as it connects, with :func:`peer_names` of its connection, and ``left(client)``
    once dask is done with its stream (neither may raise); ``connected`` returning False
    refuses the client (its connection is closed before dask registers it). Each
    client's stream then carries graphs of that client only: dask takes an
    ``update-graph`` message's own ``client`` over the stream's, so such a message is
    given the stream's client. O(messages) on clients' streams. Returns the handle for
    :func:`unwatch_clients`."""
    original = sched.handlers["register-client"]

    async def register_client(
        comm: Any, client: Any = None, versions: Any = None, **kwargs: Any
    ) -> Any:
        if connected(client, peer_names(comm)) is False:
            await comm.close()
            return None
        if isinstance(client, str):
            _pin_stream(comm, client)
        try:
            return await original(comm, client=client, versions=versions, **kwargs)
        finally:
            left(client)

    sched.handlers["register-client"] = register_client
    return original, register_client


def unwatch_clients(sched: Scheduler, handle: tuple[Any, Any] | None) -> None:
    """Undo :func:`watch_clients` (if the wrapper is still the handler). Clients connected
    meanwhile keep their pinned streams."""
    if handle is None:
        return
    original, wrapper = handle
    if sched.handlers.get("register-client") is wrapper:
        sched.handlers["register-client"] = original


def _pin_stream(comm: Any, client: str) -> None:
    """Each ``update-graph`` message read from ``comm`` names ``client``."""
    read = comm.read

    async def read_own(*args: Any, **kwargs: Any) -> Any:
        msgs = await read(*args, **kwargs)
        for msg in msgs if isinstance(msgs, list | tuple) else (msgs,):
            if isinstance(msg, dict) and msg.get("op") == "update-graph":
                msg["client"] = client
        return msgs

    comm.read = read_own


class _StreamStub:
    """A server whose ``update-graph`` stream handler notes the client it is given."""

    def __init__(self) -> None:
        self.stream_handlers = {"update-graph": self.graph}
        self.clients: list[Any] = []

    def graph(self, **msg: Any) -> None:
        self.clients.append(msg.get("client"))


class _CommStub:
    """A connection that delivers one batch of messages, then is closed."""

    peer_address = "daskjobs-check://client"

    def __init__(self, msgs: list[dict[str, Any]]) -> None:
        self._batches = [msgs]
        self._closed = False

    async def read(self, deserializers: Any = None) -> Any:
        from distributed.comm.core import CommClosedError

        if not self._batches:
            raise CommClosedError("daskjobs-check")
        return self._batches.pop()

    async def close(self) -> None:
        self._closed = True

    def closed(self) -> bool:
        return self._closed


def _drive(coro: Any, steps: int = 100) -> None:
    """Run a coroutine that waits on nothing but ``asyncio.sleep(0)`` to its end."""
    try:
        for _ in range(steps):
            coro.send(None)
    except StopIteration:
        return
    coro.close()
    raise AssertionError("dask's handle_stream did not end once its connection closed")


@_identity_check("watch_clients", "unwatch_clients")
def _check_watch_clients(sched: Any) -> None:
    import logging

    from distributed.core import Server

    handler = sched.handlers.get("register-client")
    _expect(callable(handler), "no handler 'register-client'")
    params = list(inspect.signature(handler).parameters)
    _expect(
        params[:1] == ["comm"] and {"client", "versions"} <= set(params),
        f"the 'register-client' handler takes {params}, not (comm, client, versions)",
    )
    # dask's own stream loop on a stand-in: a pinned connection's update-graph reaches the
    # handler with the stream's client, whatever client the message names
    stub = _StreamStub()
    comm = _CommStub([{"op": "update-graph", "client": "daskjobs-check-other"}])
    _pin_stream(comm, "daskjobs-check")
    quiet = logging.getLogger("distributed.core")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # its "established connection" lines are the check's
    try:
        stream = Server.handle_stream(
            stub,  # type: ignore[arg-type]
            comm=comm,  # type: ignore[arg-type]
            extra={"client": "daskjobs-check"},
        )
        _drive(stream)
    finally:
        quiet.setLevel(level)
    _expect(
        stub.clients == ["daskjobs-check"],
        f"a client's update-graph reached dask's handler as client {stub.clients!r}",
    )


@_identity_check("peer_names")
def _check_peer_names(sched: Any) -> None:
    from types import SimpleNamespace

    from distributed.comm.tcp import TLS

    cert = {
        "subject": ((("organizationName", "daskjobs"),), (("commonName", "alice"),)),
        "subjectAltName": (("email", "alice@example.com"), ("DNS", "alice")),
    }
    socket = SimpleNamespace(getpeercert=lambda: cert, cipher=lambda: ("c", "TLSv1.3", 256))
    stand_in = SimpleNamespace(_extra={}, _peer_addr="tls://x:1", stream=SimpleNamespace())
    stand_in.stream.socket = socket
    TLS._read_extra(stand_in)  # type: ignore[arg-type]  # dask's own: what TLS keeps of its peer
    extra = TLS.extra_info.fget(stand_in)  # type: ignore[attr-defined]
    got = peer_names(SimpleNamespace(extra_info=extra))
    _expect(
        got == ("alice", "alice@example.com"),
        f"a TLS connection's peer certificate gives the names {got!r}",
    )
    _expect(peer_names(SimpleNamespace(extra_info={})) is None, "a plain connection has names")


def http_router(sched: Scheduler) -> Any:
    """The scheduler's HTTP router (where distributed mounts its pages), or None."""
    return getattr(sched, "http_application", None)


def compute_seconds(startstops: Any) -> float | None:
    """Seconds a finished attempt computed, from the ``startstops`` dask passes with the
    ``processing -> memory`` transition (a list in process, a tuple over TCP); None if
    it has no compute entry."""
    total = 0.0
    seen = False
    for ss in startstops or ():
        if ss.get("action") == "compute":
            total += ss["stop"] - ss["start"]
            seen = True
    return total if seen else None


# -- preemption and gangs --------------------------------------------------------------------
#
# The preemption driver (plugin/enact/preemption.py) and the resource placer (plugin/enact/gangs.py)
# steer dask through the verbs below and touch no private piece of dask themselves. Each
# verb has a behavioural self-check in :data:`PREEMPTION_CHECKS`, which
# :func:`check_scheduler` runs at start: a small experiment on dask's own classes (never on
# the live scheduler's state) that fails, naming the verb, if what it relies on changed.
#
# * :func:`ask_to_yield` - ``Scheduler.stream_comms[address].send`` of the worker plugin's
#   ``daskjobs-preempt`` message (the worker sets the flag ``daskjobs.preempted()`` reads).
# * :func:`pin` / :func:`unpin` - a waiting task is sent to one worker: a hard worker
#   restriction (``worker_restrictions``, ``host_restrictions`` cleared,
#   ``loose_restrictions`` false), optionally a priority of the driver's, and
#   ``Scheduler.transitions`` to ``released`` (dask places it again, on that worker, with
#   that priority in its ``compute-task`` message); ``unpin`` puts back what the task had.
#   The BE reservation rests on it: a worker runs its resource-constrained tasks strictly
#   in priority order and starts none past a head that does not fit
#   (``WorkerState._next_ready_task``), so the task pinned to the held worker with a
#   priority ahead of every best-effort task keeps later best-effort tasks off the units it
#   waits for, until it starts.
# * :func:`hold` / :func:`place` - the placer keeps a task in ``no-worker`` with a worker
#   restriction no worker has (``Scheduler.valid_workers`` answers none), and places tasks
#   by restricting each to its worker and recommending ``processing``, all in one
#   ``Scheduler.transitions`` call.
# * :func:`release` - ``Scheduler.transitions`` to ``released`` (a task let go of a worker
#   that left: dask places it anew).

#: verb -> its self-check (raises AssertionError, saying what changed)
PREEMPTION_CHECKS: dict[str, Callable[[Any], None]] = {}


def _preemption_check(*verbs: str) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    return _registrar(PREEMPTION_CHECKS, *verbs)


def check_preemption_verbs(scheduler: Any) -> list[str]:
    """Run each preemption and gang verb's self-check once; a phrase per failing verb."""
    return _run_checks(PREEMPTION_CHECKS, scheduler)


def ask_to_yield(sched: Scheduler, address: str, keys: list[Key], op: str) -> bool:
    """Send ``keys`` (running on ``address``) the worker plugin's message ``op``; False
    if that worker has no stream (it is leaving)."""
    comm = sched.stream_comms.get(address)
    if comm is None:
        return False
    comm.send({"op": op, "keys": list(keys)})
    return True


@_preemption_check("ask_to_yield")
def _check_ask_to_yield(sched: Any) -> None:
    from distributed.batched import BatchedSend

    comms = sched.stream_comms
    if not isinstance(comms, dict):
        raise AssertionError(f"Scheduler.stream_comms is a {type(comms).__name__}, not a dict")
    if not callable(getattr(BatchedSend, "send", None)):
        raise AssertionError("a worker's stream (BatchedSend) has no send")


class Pinned(NamedTuple):
    """What :func:`pin` changed of a task, for :func:`unpin` to put back."""

    worker_restrictions: Any
    host_restrictions: Any
    loose_restrictions: bool
    priority: Any


def pinned(ts: TaskState) -> Pinned:
    """What :func:`pin` changes of ``ts``, as it is now (for :func:`unpin`). A driver
    keeps it *before* it pins: the ``released`` transition reaches the plugin's hook
    while :func:`pin` runs."""
    return Pinned(ts.worker_restrictions, ts.host_restrictions, ts.loose_restrictions, ts.priority)


def pin(
    sched: Scheduler,
    ts: TaskState,
    address: str,
    stimulus_id: str,
    priority: tuple[Any, ...] | None = None,
) -> None:
    """Send waiting task ``ts`` (``processing`` or ``no-worker``) to the worker
    ``address`` only, with ``priority`` if given (:func:`pinned` first, to undo it)."""
    ts.worker_restrictions = {address}
    ts.host_restrictions = None
    ts.loose_restrictions = False
    if priority is not None:
        ts.priority = priority
    sched.transitions({ts.key: "released"}, stimulus_id=stimulus_id)


def unpin(ts: TaskState, saved: Pinned) -> None:
    """Put back what :func:`pin` changed (no transition: a running task stays put)."""
    ts.worker_restrictions = saved.worker_restrictions
    ts.host_restrictions = saved.host_restrictions
    ts.loose_restrictions = saved.loose_restrictions
    if saved.priority is not None:
        ts.priority = saved.priority


def release(sched: Scheduler, key: Key, stimulus_id: str) -> None:
    """Let dask place ``key`` anew (it goes back to ``released``, then on)."""
    sched.transitions({key: "released"}, stimulus_id=stimulus_id)


def hold(ts: TaskState, nowhere: str) -> None:
    """Keep ``ts`` in dask's ``no-worker`` until :func:`place` sends it on: a worker
    restriction to ``nowhere``, an address no worker has."""
    ts.worker_restrictions = {nowhere}
    ts.host_restrictions = None
    ts.loose_restrictions = False


def place(sched: Scheduler, where: dict[Key, str], stimulus_id: str) -> None:
    """Send each task of ``where`` to its worker, all in one ``transitions`` call."""
    recs: Recs = {}
    for key, address in where.items():
        ts = sched.tasks[key]
        ts.worker_restrictions = {address}
        ts.host_restrictions = None
        ts.loose_restrictions = False
        recs[key] = "processing"
    if recs:
        sched.transitions(recs, stimulus_id=stimulus_id)


def _stand_in_task(sched: Any, key: str) -> Any:
    """A dask TaskState the live scheduler does not know (for a read-only experiment)."""
    from distributed.scheduler import TaskGroup, TaskPrefix
    from distributed.scheduler import TaskState as _TS

    group = TaskGroup(key, TaskPrefix(key))
    return _TS(key, None, "released", group, validate=False)


@_preemption_check("hold", "place", "pin", "pinned", "unpin", "release")
def _check_restrictions(sched: Any) -> None:
    # dask reads a hard worker restriction as the only workers a task may go to: one that
    # names no known worker leaves none (the task waits in no-worker), and unpin restores
    ts = _stand_in_task(sched, "daskjobs-check-hold")
    before = ts.loose_restrictions
    hold(ts, "daskjobs-held://self-check")
    valid = sched.valid_workers(ts)
    if valid != set():
        raise AssertionError(
            f"a task restricted to no known worker may run on {valid!r} (dask's valid_workers)"
        )
    unpin(ts, Pinned(None, None, before, None))
    if ts.worker_restrictions or sched.valid_workers(ts) is not None:
        raise AssertionError("a task without restrictions is not free to run anywhere")
    import inspect

    params = inspect.signature(sched.transitions).parameters
    if not {"recommendations", "stimulus_id"} <= set(params):
        raise AssertionError(f"Scheduler.transitions takes {list(params)}")


@_preemption_check("pin (the BE reservation)")
def _check_head_of_line(sched: Any) -> None:
    # a worker starts its resource-constrained tasks in priority order and none past a
    # head that does not fit: the task pinned first holds the units it waits for
    from distributed.worker_state_machine import ComputeTaskEvent, Execute, WorkerState

    ws = WorkerState(nthreads=4, resources={"R": 2}, validate=False)

    def started(*events: Any) -> list[Any]:
        return [i.key for i in ws.handle_stimulus(*events) if isinstance(i, Execute)]

    def task(key: str, priority: int, units: int) -> Any:
        return ComputeTaskEvent.dummy(
            key, priority=(priority,), resource_restrictions={"R": units}, stimulus_id=key
        )

    if started(task("running", 5, 1)) != ["running"]:
        raise AssertionError("a worker did not start a constrained task that fits")
    got = started(task("held", 0, 2), task("later", 1, 1))
    if got:
        raise AssertionError(f"a worker started {got} past a constrained head that does not fit")
    if started(task("ahead", -1, 1)) != ["ahead"]:
        raise AssertionError("a worker did not start a constrained task ahead of its head")


# -- speculation -----------------------------------------------------------------------
# The verbs of the backup-copy driver (:mod:`daskjobs.plugin.enact.speculation`): every read
# and write of dask's scheduler state it makes beyond the public plugin hooks. Each verb
# has a behavioural self-check in :func:`check_speculation_verbs` (run by
# :func:`check_scheduler`): it builds a throwaway ``TaskState`` and ``WorkerState``, runs
# the verb on them and checks the answer, so that a release that renames or changes the
# meaning of a piece stops the plugin at start instead of silently changing what it does.


def can_copy(ts: TaskState) -> bool:
    """May ``ts`` run twice side by side: a ``dask._task_spec.Task`` (not an alias, data
    or a nested graph node) and not an actor (an actor lives on one worker)."""
    from dask._task_spec import Task

    return isinstance(ts.run_spec, Task) and not ts.actor


def runs_on(ts: TaskState | None, worker: str, run_id: Any) -> bool:
    """Is ``ts`` processing on ``worker`` in its run ``run_id`` (a start report is
    kept only if so: a report from an earlier run or another worker is stale)?"""
    return (
        ts is not None
        and ts.state == "processing"
        and ts.processing_on is not None
        and ts.processing_on.address == worker
        and run_id == ts.run_id
    )


def processing_worker(ts: TaskState | None) -> str | None:
    """The address of the worker ``ts`` is processing on, or None."""
    if ts is None or ts.processing_on is None:
        return None
    return str(ts.processing_on.address)


def wanted(ts: TaskState | None) -> bool:
    """Does a client or a dependent still want ``ts``'s result?"""
    return ts is not None and bool(ts.who_wants or ts.waiters)


def is_running(ws: Any) -> bool:
    """Does ``ws`` accept work (status ``running``: not paused, not closing)?"""
    return bool(ws.status.name == "running")


def free_threads(ws: Any) -> int:
    """Threads of ``ws`` the scheduler counts as free (its nthreads less the tasks it
    has sent there; a released loser's thread, which dask cannot stop, counts as free)."""
    free = ws.nthreads - len(ws.processing)
    return free if free > 0 else 0


def may_run_on(ts: TaskState, ws: Any) -> bool:
    """Could ``ts`` run on ``ws`` at all: the worker's resources cover its resource
    restrictions, and its hard worker and host restrictions (loose ones aside) allow it."""
    if ts.resource_restrictions and any(
        ws.resources.get(r, 0) < need for r, need in ts.resource_restrictions.items()
    ):
        return False
    if ts.loose_restrictions:
        return True
    if ts.worker_restrictions and ws.address not in ts.worker_restrictions:
        return False
    return not (ts.host_restrictions and ws.host not in ts.host_restrictions)


def placement(ts: TaskState) -> Hashable:
    """What decides where ``ts`` may run, as a hashable: its worker, host and resource
    restrictions and whether they are loose. Tasks with equal answers may run on the same
    workers (:func:`may_run_on` answers alike for them)."""
    wr, hr, rr = ts.worker_restrictions, ts.host_restrictions, ts.resource_restrictions
    return (
        frozenset(wr) if wr else None,
        frozenset(hr) if hr else None,
        tuple(sorted(rr.items())) if rr else None,
        bool(ts.loose_restrictions),
    )


def waiting_on(ws: Any, started: Any, skip: Any) -> list[TaskState]:
    """The tasks the scheduler sent to ``ws`` that have not started there (keys not in
    ``started``), not in ``skip``, not restricted to a worker (they could not move), in
    the order they would start (priority)."""
    out = [
        ts
        for ts in ws.processing
        if ts.key not in started and ts.key not in skip and not ts.worker_restrictions
    ]
    out.sort(key=_priority)
    return out


def _priority(ts: TaskState) -> Any:
    return ts.priority or ()


def started_on(ws: Any, started: Any) -> int:
    """How many of the tasks processing on ``ws`` have keys in ``started``."""
    return sum(1 for ts in ws.processing if ts.key in started)


def can_move(sched: Scheduler) -> bool:
    """Is the work-stealing extension there to move a waiting task?"""
    return sched.extensions.get("stealing") is not None


def move_waiting(sched: Scheduler, ts: TaskState, victim: Any, thief: Any) -> bool:
    """Move ``ts``, waiting on ``victim``, to ``thief`` through work stealing's two-phase
    request (it moves only a task that has not started); False without the extension."""
    stealing = sched.extensions.get("stealing")
    if stealing is None:
        return False
    # dask's own method, past steal_in_order's choice: this task, and no other, moves
    type(stealing).move_task_request(stealing, ts, victim, thief)
    return True


def release_copy(sched: Scheduler, copy_key: Key, stimulus_id: str) -> None:
    """The copies client no longer wants ``copy_key``: dask releases it as it releases
    any unwanted key (``free-keys`` to its worker if it still runs there)."""
    sched.client_releases_keys(keys=[copy_key], client=COPIES_CLIENT, stimulus_id=stimulus_id)


def restrictions(ts: TaskState) -> tuple[Any, bool]:
    """``ts``'s worker restrictions and whether they are loose (saved by a race)."""
    return ts.worker_restrictions, bool(ts.loose_restrictions)


def restore_restrictions(ts: TaskState, saved: tuple[Any, bool]) -> None:
    """Put back what :func:`restrictions` saved (a redirected task's own, after the race)."""
    ts.worker_restrictions, ts.loose_restrictions = saved


def _check_verb(name: str, ok: bool, problems: list[str]) -> None:
    if not ok:
        problems.append(f"{name} (speculation: its self-check failed)")


def check_speculation_verbs(scheduler: Any) -> list[str]:
    """Run every speculation verb on throwaway scheduler objects; the verbs whose answer
    is not the expected one, as phrases (empty if all behave)."""
    import inspect

    problems: list[str] = []
    try:
        from dask._task_spec import Alias, Task
        from distributed.core import Status
        from distributed.scheduler import TaskGroup, TaskPrefix, WorkerState
        from distributed.scheduler import TaskState as _TS

        def ts_(key: str) -> Any:
            group = TaskGroup(key, TaskPrefix(key))
            return _TS(key, Task(key, len, ()), "released", group, False)

        def ws_(address: str) -> Any:
            return WorkerState(
                address=address,
                status=Status.running,
                pid=0,
                name=address,
                nthreads=2,
                memory_limit=0,
                local_directory="",
                nanny=None,
                server_id=address,
            )

        ts, other = ts_("daskjobs-check"), ts_("daskjobs-check-2")
        ws, ws2 = ws_("tcp://10.0.0.1:1"), ws_("tcp://10.0.0.2:1")
    except Exception as exc:  # the objects themselves changed
        return [f"TaskState/WorkerState construction (speculation self-check: {exc!r})"]
    try:
        ok = can_copy(ts)
        ts.run_spec = Alias("daskjobs-check", "daskjobs-check-2")
        _check_verb("can_copy", ok and not can_copy(ts), problems)
        _check_verb("is_running", is_running(ws), problems)
        ws.status = Status.paused
        _check_verb("is_running", not is_running(ws), problems)
        _check_verb("wanted", not wanted(ts), problems)
        ts.waiters = {other}
        _check_verb("wanted", wanted(ts), problems)
        _check_verb("placement", placement(ts) == (None, None, None, False), problems)
        ts.resource_restrictions = {"GPU": 1}
        ok = not may_run_on(ts, ws)
        ws.resources = {"GPU": 1.0}
        ok = ok and may_run_on(ts, ws)
        ts.worker_restrictions = {ws2.address}
        ts.loose_restrictions = False
        ok = ok and not may_run_on(ts, ws) and may_run_on(other, ws)
        ts.loose_restrictions = True
        _check_verb("may_run_on", ok and may_run_on(ts, ws), problems)
        got = placement(ts)
        ok = got == (frozenset({ws2.address}), None, (("GPU", 1),), True)
        _check_verb("placement", ok and hash(got) == hash(placement(ts)), problems)
        saved = restrictions(ts)
        restore_restrictions(ts, (None, False))
        ok = restrictions(ts) == (None, False)
        restore_restrictions(ts, saved)
        _check_verb("restrictions", ok and restrictions(ts) == ({ws2.address}, True), problems)
        other.priority = (0, 1)
        third = ts_("daskjobs-check-3")
        third.priority = (0, 0)
        ws.processing = {other, third, ts}  # ts is restricted: it could not move
        ok = free_threads(ws) == 0 and started_on(ws, {"daskjobs-check-3"}) == 1
        _check_verb("free_threads", ok, problems)
        _check_verb("waiting_on", waiting_on(ws, (), ()) == [third, other], problems)
        other.state = "processing"
        other.processing_on = ws
        other.run_id = 7
        ok = runs_on(other, ws.address, 7) and not runs_on(other, ws.address, 6)
        _check_verb("runs_on", ok and processing_worker(other) == ws.address, problems)
    except Exception as exc:
        problems.append(f"speculation verbs (self-check raised {exc!r})")
    # the verbs that act on a live scheduler: their signatures, as they call them
    stealing = scheduler.extensions.get("stealing") if hasattr(scheduler, "extensions") else None
    if stealing is not None:
        params = list(inspect.signature(stealing.move_task_request).parameters)
        _check_verb("move_waiting", params[:3] == ["ts", "victim", "thief"], problems)
    if hasattr(scheduler, "client_releases_keys"):
        params = list(inspect.signature(scheduler.client_releases_keys).parameters)
        ok = {"keys", "client", "stimulus_id"} <= set(params)
        _check_verb("release_copy", ok, problems)
    return problems


# -- work stealing in the plugin's order --------------------------------------------------
# (tests/plugin/test_steal_order.py, benchmarks/bench_steal_order.py)
#
# dask's work stealing (``distributed.stealing.WorkStealing.balance``) walks a victim's
# stealable tasks, a set per cost level, in the set's order, and steals the first one an
# idle thief can take: it ignores priorities (dask/distributed#8992). The stolen task
# starts at once on the idle thief while tasks of better rank wait on the victim, which
# undoes the plugin's order exactly where it matters: long tasks stuck behind a slow
# worker. :func:`steal_in_order` keeps dask's choice of *whether*, *from whom* and *to
# whom* to steal, and changes *which* task moves: the best-ranked task the victim holds
# at the same cost level that has not started there, that the thief may run and that is
# not already being moved. Used: ``Scheduler.extensions["stealing"]``, its
# ``move_task_request(ts, victim, thief)``, ``stealable`` (victim address -> one set of
# tasks per level), ``key_stealable`` (task -> (address, level)), ``in_flight``;
# ``WorkerState.executing``. Cost: one pass over the level's set per steal, which
# ``balance`` walks anyway.


def steal_in_order(
    sched: Any, enabled: bool = True, still: Callable[[], bool] | None = None
) -> bool:
    """Make dask's work stealing move a victim's best-ranked waiting task instead of
    any (``enabled=False`` restores dask's own); True if it is in place. ``still``: while
    it answers True (the plugin is registered); once False, dask's own is put back at the
    next steal. A scheduler without work stealing, or whose stealing lacks a piece used
    here, is left as it is (False)."""
    stealing = getattr(sched, "extensions", {}).get("stealing")
    if stealing is None:
        return False
    stealing.__dict__.pop("move_task_request", None)  # dask's own method again
    if not enabled:
        return False
    if not all(hasattr(stealing, a) for a in ("stealable", "key_stealable", "in_flight")):
        return False
    request = stealing.move_task_request

    def move_task_request(ts: TaskState, victim: Any, thief: Any) -> str:
        if still is not None and not still():  # the plugin is gone: dask's own again
            stealing.__dict__.pop("move_task_request", None)
            return str(request(ts, victim, thief))
        try:
            best = _best_to_steal(stealing, ts, victim)
        except Exception:  # never let the plugin break dask's stealing
            best = ts
        if best is not ts:
            # ``balance`` drops ``ts`` from its stealable set after this call: it stays
            # stealable (it did not move), so it goes back once ``balance`` is done
            import asyncio

            asyncio.get_running_loop().call_soon(_stealable_again, stealing, ts, victim)
        return str(request(best, victim, thief))

    stealing.move_task_request = move_task_request
    return True


def _best_to_steal(stealing: Any, ts: TaskState, victim: Any) -> TaskState:
    """The task of ``victim`` to move in place of ``ts``: of better rank, at ``ts``'s
    cost level, not started, not restricted, not in flight; ``ts`` if there is none."""
    where = stealing.key_stealable.get(ts)
    if where is None or ts.priority is None or ts.resource_restrictions:
        return ts
    candidates = stealing.stealable[where[0]][where[1]]
    # the victim runs its tasks best first: its ``nthreads`` best have most likely
    # started (``WorkerState.executing`` is as old as its last heartbeat), and a steal of
    # a started task is refused
    running = set(
        heapq.nsmallest(victim.nthreads, victim.processing, key=lambda t: t.priority or (math.inf,))
    )
    running.update(getattr(victim, "executing", {}))
    in_flight = stealing.in_flight
    best, best_priority = None, None
    for other in candidates:
        p = other.priority
        if (
            p is not None
            and (best_priority is None or p < best_priority)
            and other.processing_on is victim
            and other not in running
            and other not in in_flight
            and not other.worker_restrictions
            and not other.host_restrictions
            and not other.resource_restrictions
        ):
            best, best_priority = other, p
    if best is None or best_priority is None:
        return ts
    if ts not in running and ts.priority <= best_priority:
        return ts
    return best


def _stealable_again(stealing: Any, ts: TaskState, victim: Any) -> None:
    if ts.processing_on is victim and ts not in stealing.in_flight:
        stealing.put_key_in_stealable(ts)
