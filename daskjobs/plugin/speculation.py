"""Backup copies of late tasks on a live dask cluster.

dask keeps one ``TaskState`` per key with one ``processing_on`` worker and
cannot stop a running thread, so there is no public way to run a task twice.
This module does it the way the research prototype did, and guards every step:

1. **True starts.** The :class:`~daskjobs.plugin.worker.StartReporter` worker
   plugin (installed by the scheduler plugin itself) reports when a task really
   starts executing; the start is kept only if it comes from the task's current
   worker with its current ``run_id``.
2. **Late.** Every ``interval`` a periodic callback checks the started tasks:
   a task is late once it has run ``late_factor x estimate x believed slow-down
   of its worker`` (:class:`~daskjobs.policies.Speculation`, the object the
   simulator uses; speeds from the plugin's :class:`~daskjobs.policies.NodeAware`
   learner), and at least ``min_runtime``. It is copied at once, deadline or
   not, when :meth:`NodeAware.urgent <daskjobs.policies.NodeAware.urgent>` says
   so: its worker is measured slow and a fresh copy on a nominal worker would
   finish well before it (the simulator's rule; the live plugin keeps no
   horizon, so "the run's end" is now, and an idle thread is the only price).
   Tasks annotated ``speculate=False`` and tasks whose estimate is only the
   configured default are never copied.
3. **Backup.** A late task gets one copy on another worker with an idle thread
   (another host where there is one; the fastest believed first), within a cap
   of ``max_fraction`` of all threads: the scheduler's ``compute-task`` message
   for the task, sent to that worker under the *same* ``run_id``. Scheduler
   state is not touched.
4. **First finisher wins.** The scheduler's ``task-finished`` and ``task-erred``
   stream handlers are wrapped. If the backup finishes first the task is moved
   to the backup's worker (as work stealing moves a task: ``processing_on``, the
   workers' processing sets and resources) before dask's own handler sees the
   result, so dependents and the client get the winner's data; the primary is
   told to release the key. If the primary finishes first, the backup is
   released. A failing backup never fails the task while the primary runs; a
   primary that errs while its backup runs follows the task's retries and the
   backup is released.
5. **Losers.** dask cannot stop the losing thread: it runs to its end and its
   result is dropped. Its elapsed time is counted as waste per team.

Private dask internals used here are listed in :mod:`daskjobs.plugin._internals`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from daskjobs.policies import Speculation

logger = logging.getLogger("daskjobs.plugin")

__all__ = ["Speculator"]


@dataclass(slots=True)
class _Backup:
    worker: str  # the copy's worker
    primary: str  # the task's worker when the copy was launched
    run_id: int
    launched: float
    started: bool = False  # the copy's worker reported it executing


class Speculator:
    """Launch and settle backup copies for one :class:`~daskjobs.plugin.JobsPlugin`."""

    def __init__(self, plugin: Any, spec: Speculation, interval: float) -> None:
        self.plugin = plugin
        self.spec = spec
        self.interval = interval
        self.starts: dict[Hashable, tuple[str, float, int]] = {}  # key -> (worker, t, run_id)
        self.backups: dict[Hashable, _Backup] = {}
        self.copied: set[Hashable] = set()  # one copy per task, whatever became of it
        self.counts = {
            "launched": 0,
            "won": 0,
            "lost": 0,
            "failed": 0,
            "abandoned": 0,
            "adopted": 0,
        }
        self.peak = 0  # most copies running at once
        # released losers whose threads still run: worker -> keys (until the worker says
        # the thread returned); the scheduler offers those threads as free
        self.zombies: dict[str, set[Hashable]] = {}
        self._zombie_until: dict[tuple[str, Hashable], float] = {}
        self.moved = 0  # tasks moved off a worker whose thread a zombie holds
        # copies whose primary's worker died: adopted if they finish first
        self.orphans: dict[Hashable, _Backup] = {}
        self.waste: dict[str, float] = {}  # team -> seconds of losing copies
        self._originals: dict[str, Callable[..., Any]] = {}
        self._pc: Any = None

    # -- lifecycle -----------------------------------------------------------------
    def start(self, scheduler: Any) -> None:
        from tornado.ioloop import PeriodicCallback

        self.scheduler = scheduler
        for op, wrapper in (
            ("task-finished", self._task_finished),
            ("task-erred", self._task_erred),
        ):
            self._originals[op] = scheduler.stream_handlers[op]
            scheduler.stream_handlers[op] = wrapper
        self._pc = PeriodicCallback(self._tick, self.interval * 1000)
        scheduler.periodic_callbacks["daskjobs-speculation"] = self._pc
        self._pc.start()

    def close(self) -> None:
        sched = getattr(self, "scheduler", None)
        if sched is None:
            return
        for op, original in self._originals.items():
            sched.stream_handlers[op] = original
        self._originals.clear()
        if self._pc is not None:
            self._pc.stop()
            sched.periodic_callbacks.pop("daskjobs-speculation", None)

    def stats(self) -> dict[str, Any]:
        return {
            **self.counts,
            "zombies": sum(len(k) for k in self.zombies.values()),
            "moved_off_zombies": self.moved,
            "running": len(self.backups),
            "peak": self.peak,
            "late_factor": self.spec.late_factor,
            "waste_seconds": dict(self.waste),
        }

    # -- observations ----------------------------------------------------------------
    def started(self, key: Hashable, worker: str | None, run_id: Any) -> None:
        """A worker reports that ``key`` really started executing."""
        b = self.backups.get(key)
        if b is not None and worker == b.worker:
            b.started = True
            return
        ts = self.scheduler.tasks.get(key)
        if (
            worker
            and ts is not None
            and ts.state == "processing"
            and ts.processing_on is not None
            and ts.processing_on.address == worker
            and run_id == ts.run_id
            and key not in self.starts
        ):
            self.starts[key] = (worker, time.time(), int(run_id))

    def left_processing(self, key: Hashable, finish: str) -> None:
        """``key`` left ``processing`` (done, erred, released, ...): settle its copy."""
        st = self.starts.pop(key, None)
        if st is not None and finish != "memory":  # a failed or lost attempt: its time is waste
            self._waste(key, time.time() - st[1])
        self.copied.discard(key)
        b = self.backups.pop(key, None)
        sched = self.scheduler
        if (
            b is not None
            and finish == "released"
            and b.primary not in sched.workers
            and b.worker in sched.workers
        ):
            # the primary's worker died mid-race: keep the copy running; if it finishes
            # before dask's fresh attempt, its result is adopted (_settle_finished)
            self.orphans[key] = b
            self.plugin._event("backup-orphaned", key=str(key), backup=b.worker)
            return
        o = self.orphans.pop(key, None) if finish != "waiting" else None
        for stale in (b, o):
            if stale is not None:  # settled elsewhere than in our handlers: release the copy
                self._release(stale.worker, key, "daskjobs-backup-abandoned")
                self.counts["abandoned"] += 1
                self._waste(key, time.time() - stale.launched)

    def returned(self, key: Hashable, worker: str | None) -> None:
        """``worker`` reports that the thread of a released ``key`` has returned."""
        keys = self.zombies.get(worker or "")
        self._zombie_until.pop((worker or "", key), None)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.zombies[worker or ""]

    def _zombie(self, worker: str, key: Hashable) -> None:
        self.zombies.setdefault(worker, set()).add(key)
        v = self.plugin.tasks.get(key)
        # if the worker's "returned" report never comes, stop counting the thread as held
        self._zombie_until[(worker, key)] = time.time() + 60.0 + 3 * (v.estimate if v else 0.0)

    def _drain_zombies(self) -> None:
        """Tasks waiting on a worker whose thread a zombie holds go to a worker with an
        idle thread (through the work-stealing extension, which moves only tasks that
        have not started)."""
        now = time.time()
        for (worker, key), until in list(self._zombie_until.items()):
            if now > until:
                self.returned(key, worker)
        sched = self.scheduler
        stealing = sched.extensions.get("stealing")
        if stealing is None or not self.zombies:
            return
        idle = [
            ws
            for ws in sched.workers.values()
            if ws.address not in self.zombies
            and ws.status.name == "running"
            and len(ws.processing) < ws.nthreads
        ]
        for address, keys in list(self.zombies.items()):
            ws = sched.workers.get(address)
            if ws is None:
                del self.zombies[address]
                continue
            started = sum(1 for ts in ws.processing if ts.key in self.starts)
            free = ws.nthreads - len(keys) - started
            waiting = sorted(
                (ts for ts in ws.processing if ts.key not in self.starts),
                key=lambda ts: ts.priority,
            )
            for ts in waiting[max(free, 0) :]:
                if not idle:
                    return
                thief = idle[0]
                stealing.move_task_request(ts, ws, thief)
                self.moved += 1
                if len(thief.processing) + 1 >= thief.nthreads:
                    idle.pop(0)

    def worker_removed(self, worker: str) -> None:
        for key, o in list(self.orphans.items()):
            if o.worker == worker:
                del self.orphans[key]
        for key, b in list(self.backups.items()):
            if b.worker == worker:  # the copy's worker died: the primary carries on
                del self.backups[key]
                self.counts["abandoned"] += 1
                self.plugin._event("backup-lost-worker", key=str(key), worker=worker)

    # -- late tasks ------------------------------------------------------------------
    def _tick(self) -> None:
        try:
            self._check(time.time())
            if self.zombies:
                self._drain_zombies()
        except Exception:
            self.plugin._failed("speculation")

    def _slots(self) -> int:
        return sum(ws.nthreads for ws in self.scheduler.workers.values())

    def _check(self, now: float) -> None:
        from daskjobs.plugin.plugin import LiveAttempt  # the plugin module imports this one

        if not self.starts:
            return
        cap = self.spec.cap(self._slots())
        if len(self.backups) >= cap:
            return
        plugin = self.plugin
        sched = self.scheduler
        horizon: float | None = None
        for key, (worker, t0, run_id) in list(self.starts.items()):
            if key in self.copied:
                continue
            ts = sched.tasks.get(key)
            if ts is None or ts.state != "processing" or ts.run_id != run_id:
                self.starts.pop(key, None)
                continue
            v = plugin.tasks.get(key)
            if v is None or v.source == "default":
                continue  # no real estimate: nothing to be late against
            if (ts.annotations or {}).get("speculate") is False:
                continue
            node = plugin._node(worker)
            speed = plugin.speeds.speed(node)
            late = now >= self.spec.deadline(t0, v.estimate, speed)
            urgent = not late and plugin.speeds.urgent(LiveAttempt(v, node, t0), now)
            if not (late or urgent):
                continue
            # a copy may queue on a busy worker only if the task would otherwise end
            # after the projected end of the run (the simulator's horizon rule)
            allow_busy = False
            if urgent:
                if horizon is None:
                    horizon = self._horizon(now)
                left = max(t0 + v.estimate * speed - now, 0.5 * v.estimate * speed)
                allow_busy = now + left > horizon
            target = self._target(ts, worker, allow_busy=allow_busy)
            if target is None:
                continue
            self._launch(ts, target, now)
            if len(self.backups) >= cap:
                return

    def _horizon(self, now: float) -> float:
        """Projected end of the work the scheduler holds: estimated seconds of the queued
        and running tasks over the workers' threads weighted by believed speed. O(tasks
        queued or running), once per check that needs it."""
        sched = self.scheduler
        plugin = self.plugin
        tasks = plugin.tasks
        work = 0.0
        for ts in sched.queued:
            v = tasks.get(ts.key)
            if v is not None:
                work += v.estimate
        capacity = 0.0
        for ws in sched.workers.values():
            speed = plugin.speeds.speed(plugin._node(ws.address))
            capacity += ws.nthreads / max(speed, 1e-9)
            for ts in ws.processing:
                v = tasks.get(ts.key)
                if v is not None:
                    work += v.estimate * 0.5  # about half of a running task is left
        return now + work / capacity if capacity > 0 else now

    def _target(self, ts: Any, primary: str, allow_busy: bool = False) -> Any:
        """Another worker with an idle thread: another host first, then the fastest.

        With ``allow_busy`` (a task stuck on a worker measured slow) and no idle
        thread anywhere, a busy worker faster than the primary's will do, if it
        holds no other copy: the copy carries the task's priority into that
        worker's queue, so it starts at the worker's next free thread, ahead of
        lower-priority work, instead of waiting for the tail of the run.
        """
        sched = self.scheduler
        pws = sched.workers.get(primary)
        busy: dict[str, int] = {}
        for b in self.backups.values():
            busy[b.worker] = busy.get(b.worker, 0) + 1
        best = None
        best_rank: tuple[Any, ...] | None = None
        speeds = self.plugin.speeds
        primary_speed = speeds.speed(self.plugin._node(primary))
        for ws in sched.workers.values():
            if ws.address == primary or ws.status.name != "running":
                continue
            load = len(ws.processing) + busy.get(ws.address, 0)
            idle = load < ws.nthreads
            if not idle:
                if not allow_busy or busy.get(ws.address, 0):
                    continue
                if speeds.speed(self.plugin._node(ws.address)) >= primary_speed:
                    continue
            if ts.resource_restrictions and any(
                ws.resources.get(r, 0) < need for r, need in ts.resource_restrictions.items()
            ):
                continue
            same_host = pws is not None and ws.host == pws.host
            speed = speeds.speed(self.plugin._node(ws.address))
            rank = (not idle, same_host, speed, load / ws.nthreads, ws.address)
            if best_rank is None or rank < best_rank:
                best, best_rank = ws, rank
        return best

    def _launch(self, ts: Any, ws: Any, now: float) -> None:
        sched = self.scheduler
        run_id = ts.run_id
        msg = sched._task_to_msg(ts)  # assigns a fresh run_id: put the current one back
        ts.run_id = run_id
        msg["run_id"] = run_id
        msg["stimulus_id"] = f"daskjobs-backup-{now}"
        primary = ts.processing_on.address
        self.backups[ts.key] = _Backup(ws.address, primary, run_id, now)
        self.copied.add(ts.key)
        self.peak = max(self.peak, len(self.backups))
        sched.worker_send(ws.address, msg)
        self.counts["launched"] += 1
        self.plugin._event(
            "backup-launched",
            key=str(ts.key),
            primary=primary,
            backup=ws.address,
            late_by=round(now - self.starts[ts.key][1], 3),
        )

    # -- settling a race -------------------------------------------------------------
    def _release(self, worker: str, key: Hashable, stimulus_id: str) -> None:
        if worker in self.scheduler.workers:
            self.scheduler.worker_send(
                worker, {"op": "free-keys", "keys": [key], "stimulus_id": stimulus_id}
            )

    def _waste(self, key: Hashable, seconds: float) -> None:
        v = self.plugin.tasks.get(key)
        team = v.team if v is not None else "default"
        self.waste[team] = self.waste.get(team, 0.0) + max(seconds, 0.0)

    def _learn_from_loser(self, key: Hashable, worker: str, now: float) -> None:
        """A primary beaten by its copy ran at least ``now - start``: tell the speed
        learner, or a worker whose every task is rescued would never be measured."""
        start = self.starts.pop(key, None)
        v = self.plugin.tasks.get(key)
        if start is None or v is None or not v.estimate > 0:
            return
        elapsed = now - start[1]
        if elapsed > v.estimate:  # only as evidence of slowness (a lower bound)
            self.plugin._learn_speed(v, worker, elapsed)

    def _rehome(self, ts: Any, new_ws: Any) -> None:
        """Make ``new_ws`` the task's worker, as a confirmed steal would."""
        sched = self.scheduler
        old_ws = ts.processing_on
        old_ws.remove_from_processing(ts)
        sched.release_resources(ts, old_ws)
        new_ws.add_to_processing(ts)
        sched.acquire_resources(ts, new_ws)
        ts.processing_on = new_ws
        sched.check_idle_saturated(old_ws)
        sched.check_idle_saturated(new_ws)

    def _task_finished(self, key: Hashable, worker: str, stimulus_id: str, **msg: Any) -> None:
        original = self._originals["task-finished"]
        try:
            self._settle_finished(key, worker, msg)
        except Exception:
            self.plugin._failed("speculation-finished", key)
        return original(key=key, worker=worker, stimulus_id=stimulus_id, **msg)

    def _settle_finished(self, key: Hashable, worker: str, msg: dict[str, Any]) -> None:
        o = self.orphans.get(key)
        if o is not None and worker == o.worker and msg.get("run_id") == o.run_id:
            self._adopt(key, o, worker, msg)
            return
        b = self.backups.get(key)
        if b is None:
            return
        sched = self.scheduler
        ts = sched.tasks.get(key)
        if ts is None or ts.state != "processing" or msg.get("run_id") != b.run_id:
            return
        now = time.time()
        if (
            worker == b.worker
            and ts.processing_on is not None
            and ts.processing_on.address != worker
        ):
            new_ws = sched.workers.get(worker)
            if new_ws is None:
                return
            loser = ts.processing_on.address
            self._rehome(ts, new_ws)
            del self.backups[key]
            self._release(loser, key, f"daskjobs-backup-won-{now}")
            self._zombie(loser, key)
            self.counts["won"] += 1
            self._learn_from_loser(key, loser, now)
            self._waste(key, now - b.launched)  # the primary ran at least this long, uselessly
            self.plugin._event("backup-won", key=str(key), winner=worker, loser=loser)
        elif ts.processing_on is not None and worker == ts.processing_on.address:
            del self.backups[key]
            self._release(b.worker, key, f"daskjobs-backup-lost-{now}")
            if b.started:  # a copy still queued on its worker is simply dropped
                self._zombie(b.worker, key)
            self.counts["lost"] += 1
            self._waste(key, now - b.launched)
            self.plugin._event("backup-lost", key=str(key), winner=worker, loser=b.worker)

    def _adopt(self, key: Hashable, o: _Backup, worker: str, msg: dict[str, Any]) -> None:
        """A copy whose primary died finished: make it the task's result."""
        sched = self.scheduler
        del self.orphans[key]
        ts = sched.tasks.get(key)
        new_ws = sched.workers.get(worker)
        if ts is None or new_ws is None or ts.state != "processing" or ts.processing_on is None:
            return  # dask holds the task elsewhere (queued, waiting): its handler frees this
        now = time.time()
        loser = ts.processing_on.address
        if loser != worker:
            self._rehome(ts, new_ws)
            self._release(loser, key, f"daskjobs-orphan-adopted-{now}")
        msg["run_id"] = ts.run_id  # the result of the copy stands for the current attempt
        self.counts["adopted"] += 1
        self.plugin._event("backup-adopted", key=str(key), worker=worker, loser=loser)

    def _task_erred(self, key: Hashable, stimulus_id: str, **msg: Any) -> None:
        original = self._originals["task-erred"]
        try:
            if self._settle_erred(key, msg):
                return None  # a failing backup: swallowed while the primary runs
        except Exception:
            self.plugin._failed("speculation-erred", key)
        return original(key=key, stimulus_id=stimulus_id, **msg)

    def _settle_erred(self, key: Hashable, msg: dict[str, Any]) -> bool:
        o = self.orphans.get(key)
        if o is not None and msg.get("worker") == o.worker:
            del self.orphans[key]  # the orphaned copy failed: dask's fresh attempt goes on
            self.counts["failed"] += 1
            return True
        b = self.backups.get(key)
        if b is None:
            return False
        worker = msg.get("worker")
        now = time.time()
        if worker == b.worker:
            del self.backups[key]
            self._release(b.worker, key, f"daskjobs-backup-failed-{now}")
            self.counts["failed"] += 1
            self._waste(key, now - b.launched)
            self.plugin._event("backup-failed", key=str(key), worker=worker)
            return True
        # the primary erred: the task follows its retries; the copy is released
        del self.backups[key]
        self.starts.pop(key, None)
        self._release(b.worker, key, f"daskjobs-primary-erred-{now}")
        self.counts["abandoned"] += 1
        self._waste(key, now - b.launched)
        return False
