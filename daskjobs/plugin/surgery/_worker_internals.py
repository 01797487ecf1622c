"""Every private piece of a dask *worker* the plugin's worker half relies on, in one place.

The worker-side sibling of :mod:`daskjobs.plugin.surgery._internals`
(tests/project/test_dask_boundary.py fences both): the worker plugins
(:mod:`daskjobs.plugin.workers.worker`) call the verbs here and
touch nothing private of a ``Worker`` or its state machine themselves. Like the
scheduler's verbs, each has a behavioural self-check (:func:`check_worker_verbs`): a small
experiment on dask's own worker state machine, run where the verb will run (by the worker
plugin at setup, which stays silent and off if it fails) and by the scheduler plugin's
start checks, so a release that changes what a verb relies on is named, not silently
ignored.

This module is pickled *by value* with the worker plugins (workers need ``distributed``,
not ``daskjobs``): it imports nothing of daskjobs.

Re-ranking on a worker
======================

dask sends a task with inputs to a worker as soon as it is runnable (only root tasks wait
in the scheduler's queue), and the worker runs its runnable tasks lowest priority first
from two heaps of its state machine (``WorkerState.ready``, and ``constrained`` for tasks
with resource restrictions; ``distributed.collections.HeapSet`` keyed on
``TaskState.priority``). When the scheduler plugin re-ranks a stage whose tasks already
sit on workers, :func:`reorder` gives those tasks their new priorities there:

* a task still waiting on the worker (``waiting`` for its inputs, ``ready``,
  ``constrained``) takes its new priority; one that started (or left) is skipped;
* each heap a changed task is in is rebuilt with dask's own ``pop`` and ``add`` (every
  item popped, then added back under its current priority): a ``HeapSet`` keeps the key
  an item was added with, so an item moved back (a larger priority) would otherwise still
  pop at its old place. O(r log r) for the ``r`` tasks in that heap, once per message.

Nothing else changes: the worker picks its next task from the heaps when a thread frees.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed.worker_state_machine import WorkerState as WorkerMachine

__all__ = ["REORDERABLE", "check_worker_verbs", "reorder", "stop_heartbeats", "waiting_here"]

#: States of a task on a worker that has not started there: its priority still decides.
REORDERABLE = frozenset({"waiting", "ready", "constrained"})


def _key(key: Any) -> Any:
    """A key as the worker holds it (a tuple key may arrive as a list)."""
    return tuple(_key(k) for k in key) if isinstance(key, list) else key


def reorder(state: WorkerMachine, rows: Iterable[Any]) -> int:
    """Give each task of ``rows`` (``(key, priority)`` pairs) its new priority on the
    worker whose state machine is ``state`` (``Worker.state``), where it has not started;
    rebuild the ready heaps it is in (module docstring). Returns how many changed."""
    heaps = (state.ready, state.constrained)
    touched = [False, False]
    n = 0
    for key, priority in rows:
        ts = state.tasks.get(_key(key))
        if ts is None or ts.state not in REORDERABLE:
            continue
        p = tuple(priority)
        if ts.priority == p:
            continue
        for i, heap in enumerate(heaps):
            if not touched[i] and ts in heap:
                touched[i] = True
        ts.priority = p
        n += 1
    for heap, rebuild in zip(heaps, touched, strict=True):
        if rebuild:
            items = []
            while heap:
                items.append(heap.pop())
            for item in items:
                heap.add(item)
    return n


def waiting_here(state: WorkerMachine) -> int:
    """How many tasks wait on this worker for a thread (its ready heaps)."""
    return len(state.ready) + len(state.constrained)


async def stop_heartbeats(dask_worker: Any, timeout: float = 5.0) -> int:
    """Stop this worker's heartbeats and wait (at most ``timeout`` s) until the one in
    flight, if any, has its answer; returns how many 10 ms waits that took. A worker
    without the ``heartbeat`` callback or the pool's ``occupied`` map waits for nothing.

    (:func:`daskjobs.sweep.running.quiet_workers` runs it on every worker before closing
    a cluster it started: dask/distributed#6543.)"""
    import asyncio

    pc = getattr(dask_worker, "periodic_callbacks", {}).get("heartbeat")
    if pc is not None:
        pc.stop()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    occupied = getattr(getattr(dask_worker, "rpc", None), "occupied", {})

    def in_flight() -> bool:  # the heartbeat's pooled connection to the scheduler is in use
        return any(
            getattr(comm, "name", "") == "ConnectionPool.heartbeat_worker"
            for comms in occupied.values()
            for comm in comms
        )

    waits = 0
    while in_flight() and loop.time() < deadline:
        waits += 1
        await asyncio.sleep(0.01)
    return waits


def _check_heartbeats() -> list[str]:
    """:func:`stop_heartbeats` reads a worker's ``periodic_callbacks`` and its connection
    pool's ``occupied`` map (address -> comms in use): both must be what it expects."""
    from collections.abc import Mapping

    from distributed.core import ConnectionPool, Server

    pool = ConnectionPool()
    if not isinstance(getattr(pool, "occupied", None), Mapping):
        return ["stop_heartbeats (a ConnectionPool has no 'occupied' map of comms in use)"]
    server = Server({})
    if not isinstance(getattr(server, "periodic_callbacks", None), Mapping):
        return ["stop_heartbeats (a dask Server has no 'periodic_callbacks' map)"]
    return []


def check_worker_verbs() -> list[str]:
    """Run :func:`reorder` on a throwaway worker state machine of the installed dask: a
    one-thread worker with a running task and three waiting ones, two of which move (one
    back, one ahead); the next tasks to start must be in the new order. A phrase per
    verb whose experiment failed (empty if all behave)."""
    try:
        from distributed.worker_state_machine import (
            ComputeTaskEvent,
            Execute,
            ExecuteSuccessEvent,
            WorkerState,
        )

        ws = WorkerState(nthreads=1, validate=False)

        def started(*events: Any) -> list[Any]:
            return [i.key for i in ws.handle_stimulus(*events) if isinstance(i, Execute)]

        def task(key: str, priority: int) -> Any:
            return ComputeTaskEvent.dummy(key, priority=(priority,), stimulus_id=key)

        if started(task("run", 0), task("a", 1), task("b", 2), task("c", 3)) != ["run"]:
            return ["reorder (a one-thread worker did not start exactly one task)"]
        if waiting_here(ws) != 3:
            return [f"waiting_here (counted {waiting_here(ws)} of 3 waiting tasks)"]
        n = reorder(ws, [("a", (5,)), ("c", (-1,)), ("run", (9,)), ("gone", (0,))])
        if n != 2:
            return [f"reorder (changed {n} tasks, not the 2 waiting ones)"]
        order = []
        last = "run"
        for _ in range(3):
            got = started(ExecuteSuccessEvent.dummy(last, stimulus_id=f"done-{last}"))
            if len(got) != 1:
                return [f"reorder (a freed thread started {got})"]
            last = got[0]
            order.append(last)
        if order != ["c", "b", "a"]:
            return [f"reorder (the worker ran {order}, not the new order ['c', 'b', 'a'])"]
    except Exception as e:
        return [f"reorder (self-check raised {type(e).__name__}: {e})"]
    try:
        return _check_heartbeats()
    except Exception as e:
        return [f"stop_heartbeats (self-check raised {type(e).__name__}: {e})"]
