"""Helpers for code running *inside* a task on a dask worker.

``cancelled()`` tells a losing copy to stop; ``preempted()``, ``checkpoint()``,
``restore()`` and :class:`Preempted` are the cooperative preemption API of best-effort
tasks (docs/explanation/preemption.md, "Live on dask"): a long task saves its state now and then,
asks whether the scheduler wants its slot back for interactive work, and if so raises
``Preempted``; dask runs it again later and ``restore()`` hands it the last state.
"""

from __future__ import annotations

import contextlib
import hashlib
import pickle
import time
import uuid
from typing import Any

from distributed import Reschedule

__all__ = ["Preempted", "cancelled", "checkpoint", "preempted", "restore"]

_GONE = ("cancelled", "released", "forgotten")
#: Event topic of a task's checkpoints (the scheduler plugin reads them: the work a
#: preemption would lose is the work since the last one).
CHECKPOINT_TOPIC = "daskjobs-checkpoint"
#: Worker attributes shared with the reporter (daskjobs.plugin.workers.worker): the keys whose
#: slot the scheduler asked back, and the store of each running task's checkpoint.
PREEMPT_ATTR = "_daskjobs_preempt"
CHECKPOINTED_ATTR = "_daskjobs_checkpointed"
_DIR = "checkpoints"


class Preempted(Reschedule):
    """Raise inside a task to give its slot back: dask runs the task again later,
    where and when its scheduler decides (it is ``distributed.Reschedule``).

    A best-effort task raises it when :func:`preempted` says so, after saving its state
    with :func:`checkpoint`; its next run starts from :func:`restore`::

        state = daskjobs.restore(default={"epoch": 0})
        while state["epoch"] < 100:
            state = train_one_epoch(state)
            daskjobs.checkpoint(state)
            if daskjobs.preempted():
                raise daskjobs.Preempted()
        return state
    """


def _current() -> tuple[Any, Any] | None:
    """``(worker, key)`` of the task running in this thread, or None outside a task."""
    try:
        from distributed.worker import get_worker, thread_state
    except ImportError:  # pragma: no cover - distributed is a dependency
        return None
    key = getattr(thread_state, "key", None)
    if key is None:
        return None
    try:
        return get_worker(), key
    except ValueError:
        return None


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
    cur = _current()
    if cur is None:
        return False
    worker, key = cur
    ts = worker.state.tasks.get(key)
    return ts is None or ts.state in _GONE


def preempted() -> bool:
    """True once the scheduler wants this task's slot back for interactive work.

    The scheduler plugin (with ``daskjobs.preemption.enabled``) picks best-effort
    victims with the same policy object the simulator runs and tells their workers; a
    task that sees True should :func:`checkpoint` and raise :class:`Preempted`. A task
    that never asks keeps its slot (the plugin counts it as ignoring the signal once
    the grace period has passed). Cheap; False outside a dask task.
    """
    cur = _current()
    if cur is None:
        return False
    worker, key = cur
    return key in getattr(worker, PREEMPT_ATTR, ())


def _store(store: Any = None) -> Any:
    """The result store checkpoints are kept in: ``store`` if given, else the default
    store (``DASKJOBS_STORE``, ``daskjobs.store``, ``./.daskjobs-cache``): a directory or
    an fsspec URL every worker can reach."""
    from daskjobs.cache.store import ResultStore

    return store if isinstance(store, ResultStore) else ResultStore(store)


def _path(store: Any, key: Any) -> str:
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:40]
    return f"{store.root}/{_DIR}/{digest}"


def _remember(worker: Any, key: Any, store: Any) -> None:
    """Note where ``key`` keeps its checkpoint: when its result is in, the worker's
    reporter removes it (only the run that ends in memory does)."""
    stores = getattr(worker, CHECKPOINTED_ATTR, None)
    if stores is None:
        stores = {}
        setattr(worker, CHECKPOINTED_ATTR, stores)
    stores[key] = store


def checkpoint(state: Any, *, store: Any = None) -> None:
    """Save ``state`` (anything picklable) as this task's checkpoint, replacing the last.

    Kept in the result store (``store``: a ``ResultStore``, a directory or an fsspec URL;
    by default the default store) under the task's key, written whole or not at all, so
    that a run of the task on another worker finds it (:func:`restore`); the scheduler
    is told when, so that a preemption loses as little work as possible. Outside a dask
    task: a TypeError.
    """
    cur = _current()
    if cur is None:
        raise TypeError("daskjobs.checkpoint() is called from inside a dask task")
    worker, key = cur
    st = _store(store)
    _remember(worker, key, st)
    fs, path = st.fs, _path(st, key)
    data = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    fs.pipe_file(tmp, data)
    fs.mv(tmp, path)  # a rename on a local disk: a reader sees the old state or the new
    with contextlib.suppress(Exception):  # saved; the scheduler learns of the next one
        worker.log_event(CHECKPOINT_TOPIC, {"key": key, "time": time.time()})


def restore(default: Any = None, *, store: Any = None) -> Any:
    """The state this task saved last with :func:`checkpoint`, or ``default`` if it has
    none (its first run). Outside a dask task: ``default``. A checkpoint that cannot be
    read back is an error naming it (delete the file to start the task over)."""
    cur = _current()
    if cur is None:
        return default
    st = _store(store)
    _remember(cur[0], cur[1], st)
    path = _path(st, cur[1])
    try:
        data = st.fs.cat_file(path)
    except FileNotFoundError:
        return default
    try:
        return pickle.loads(data)
    except Exception as err:
        raise RuntimeError(
            f"the checkpoint of task {cur[1]!r} at {path} cannot be read back "
            f"({type(err).__name__}: {err}); delete it to start the task from the beginning"
        ) from err


def forget_checkpoint(key: Any, *, store: Any = None) -> None:
    """Remove the checkpoint of task ``key`` (its result is in: it is not needed again)."""
    st = _store(store)
    with contextlib.suppress(FileNotFoundError):
        st.fs.rm_file(_path(st, key))
