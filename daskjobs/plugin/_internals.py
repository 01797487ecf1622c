"""Every private piece of dask.distributed the plugin relies on, in one place.

daskjobs supports dask and distributed from :data:`LOWEST_SUPPORTED` on, with no
upper bound (pyproject.toml's lower bounds; CI runs the plugin's tests on that
release and on the newest one). At start the plugin calls :func:`check_scheduler`:
an older release, or one that lacks an attribute below, stops the plugin with a
:class:`DaskInternalsError` naming the installed versions, the lowest supported one
and each missing piece, instead of failing later inside a hook.

How the lowest release was found: the oldest release that has every piece below is
2024.12.0 (``GraphNode.substitute`` is new in it). The plugin,
speculation and fair-share tests fail on 2024.12.0, 2025.2.0 and 2025.3.0 (dask read a
string argument equal to a task's key as a reference to that task: a graph cycle) and
pass on 2025.4.0, 2025.5.0, 2025.12.0 and the newest release.

What is used, and why (see docs/plugin.md and the research notes):

* ``Scheduler._set_priorities(*, internal_priority, submitting_task, user_priority,
  fifo_timeout, start, tasks)`` - wrapped on the instance so that estimate-based
  priorities are in place *before* the scheduler sorts the first recommendations
  of a new graph; a rewrite in the public ``update_graph`` hook comes too late for
  the first slots.
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

Backup copies (:mod:`daskjobs.plugin.speculation`) are ordinary dask tasks, so
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

Resources and gangs (:mod:`daskjobs.plugin.gangs`) hold a task by giving it a worker
restriction no worker has (``TaskState.worker_restrictions``, ``host_restrictions``
cleared, ``loose_restrictions`` false: dask keeps it in ``no-worker``), and place it by
restricting it to the chosen worker and recommending ``processing`` through
``Scheduler.transitions``; all members of a gang in one call.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dask.typing import Key
    from distributed.scheduler import Recs, Scheduler, TaskState

__all__ = [
    "COPIES_CLIENT",
    "LOWEST_SUPPORTED",
    "REQUIRED_SCHEDULER_ATTRS",
    "DaskInternalsError",
    "add_copy",
    "check_scheduler",
    "check_versions",
    "compute_seconds",
    "redirect",
]

#: The oldest dask and distributed release daskjobs runs on (also pyproject.toml's lower
#: bounds and the release .ci/run tests; tests/test_packaging.py checks they agree).
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
    "extensions": "speculation: move tasks off a worker whose thread a zombie holds",
    "stream_comms": "preemption and gangs: ask running tasks to yield (daskjobs-preempt)",
    "register_worker_plugin": "the start and inventory reporters on every worker",
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


def check_scheduler(scheduler: Any) -> None:
    """Raise :class:`DaskInternalsError` if the installed dask or distributed is older than
    :data:`LOWEST_SUPPORTED` or lacks anything the plugin uses, naming the installed
    versions, the lowest supported one and each missing attribute."""
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
