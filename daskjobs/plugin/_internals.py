"""Every private piece of dask.distributed the plugin relies on, in one place.

The plugin is tested against the distributed versions pinned in pyproject.toml.
At start it calls :func:`check_scheduler`, which names any attribute that a
newer or older dask no longer has, instead of failing later inside a hook.

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
  is about to be filled.
* ``TaskState.annotations``, ``.dependencies``, ``.key``, ``.prefix.name``,
  ``.state``, ``.group`` - read only.
"""

from __future__ import annotations

from typing import Any

__all__ = ["REQUIRED_SCHEDULER_ATTRS", "DaskInternalsError", "check_scheduler"]

#: Scheduler attributes the plugin needs, with what it uses them for.
REQUIRED_SCHEDULER_ATTRS: dict[str, str] = {
    "_set_priorities": "estimate-based priorities before the first dispatch",
    "tasks": "task states by key",
    "workers": "worker states by address",
    "log_event": "the audit trail",
    "handlers": "the plugin's RPC handlers (explain, status)",
    "periodic_callbacks": "periodic history saves",
    "queued": "fair share: promote the task the policy chose to the head of the queue",
    "idle_task_count": "fair share: are slots free right now?",
    "stream_handlers": "speculation: settle task-finished / task-erred races",
    "_task_to_msg": "speculation: the compute-task message for a backup copy",
    "worker_send": "speculation: send a backup copy, release a losing copy",
    "release_resources": "speculation: move a task to the worker whose copy won",
    "acquire_resources": "speculation: move a task to the worker whose copy won",
    "check_idle_saturated": "speculation: move a task to the worker whose copy won",
}


class DaskInternalsError(RuntimeError):
    """The running dask.distributed lacks something the plugin relies on."""


def check_scheduler(scheduler: Any) -> None:
    """Raise :class:`DaskInternalsError` naming each missing attribute."""
    missing = [
        f"Scheduler.{name} ({why})"
        for name, why in REQUIRED_SCHEDULER_ATTRS.items()
        if not hasattr(scheduler, name)
    ]
    if missing:
        import distributed

        raise DaskInternalsError(
            f"daskjobs cannot run on distributed {distributed.__version__}: missing "
            + "; ".join(missing)
            + ". Install a distributed version listed in daskjobs' pyproject.toml."
        )
