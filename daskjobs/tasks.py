"""Helpers for code running *inside* a task on a dask worker."""

from __future__ import annotations

__all__ = ["cancelled"]

_GONE = ("cancelled", "released", "forgotten")


def cancelled() -> bool:
    """True when the task calling this no longer needs to finish.

    dask cannot stop a running thread: when a task's backup copy wins the race
    (or the client releases the result), the losing thread runs on and its
    result is dropped. A long task can call ``daskjobs.cancelled()`` between
    steps and return early, giving its thread back::

        for chunk in chunks:
            if daskjobs.cancelled():
                return None   # nobody will read this result
            process(chunk)

    Cheap (a dictionary lookup on the worker) and safe to call anywhere: outside
    a dask task it returns False.
    """
    try:
        from distributed.worker import get_worker, thread_state
    except ImportError:  # pragma: no cover - distributed is a dependency
        return False
    key = getattr(thread_state, "key", None)
    if key is None:
        return False
    try:
        worker = get_worker()
    except ValueError:
        return False
    ts = worker.state.tasks.get(key)
    return ts is None or ts.state in _GONE
