"""Backup copies of late tasks on a live dask cluster.

dask keeps one ``TaskState`` per key with one ``processing_on`` worker and
cannot stop a running thread. A backup copy is therefore a task of its own,
created in the scheduler's state so that everything dask does keeps working:

1. **True starts.** The :class:`~daskjobs.plugin.workers.worker.StartReporter` worker
   plugin (installed by the scheduler plugin itself) reports when a task really
   starts executing; the start is kept only if it comes from the task's current
   worker with its current ``run_id``.
2. **Late.** Every ``interval`` a periodic callback checks the started tasks:
   a task is late once it has run ``late_factor x estimate x believed slow-down
   of its worker`` (:class:`~daskjobs.policies.Speculation`, the object the
   simulator uses; speeds from the plugin's :class:`~daskjobs.policies.NodeAware`
   learner), and at least ``min_runtime``; a learned estimate's band moves that out
   when it is wide (the view's ``band``: the policy's rule). It is copied at once, deadline or
   not, when :meth:`NodeAware.urgent <daskjobs.policies.NodeAware.urgent>` says
   so: its worker is measured slow and a fresh copy on a nominal worker would
   finish well before it. Tasks annotated ``speculate=False``, actors, tasks
   whose estimate is only the configured default and copies are never copied.
   With ``speculation.endgame`` on, a task is also copied when nothing waits to
   start (no task in dask's ``waiting``, ``queued`` or ``no-worker`` states, kept
   as a count by the transition hook in O(1), and none sent to a worker without
   its start reported) and a worker has an idle thread: the end game of
   :class:`~daskjobs.policies.Speculation`, the tasks expected to end last first.
3. **Backup.** A late task gets one copy on another worker with an idle thread
   (another host where there is one; the fastest believed first), within a cap
   of ``max_fraction`` of all threads. The copy is the task ``("daskjobs-copy",
   key)`` with the same function, arguments and inputs, restricted to that
   worker, one priority step ahead of the task, wanted by the comm-less client
   ``daskjobs-copies`` (:func:`~daskjobs.plugin.surgery._internals.add_copy`). The
   scheduler sends it, counts its thread, and keeps its inputs on that worker
   while it runs: the active memory manager never drops a replica that a
   processing task needs, which is what a copy sent behind the scheduler's back
   could not promise.
4. **First finisher wins.** If the task finishes first, the copy is no longer
   wanted and dask releases it (``free-keys`` to its worker). If the copy
   finishes first, the task is redirected to it
   (:func:`~daskjobs.plugin.surgery._internals.redirect`): it becomes an ``Alias`` of the
   copy, released from its old worker and run, instantly, where the copy's
   result is; dependents and clients then read the copy's result under the
   task's key. dask's own ``run_id`` check drops the old worker's result if it
   still arrives. Either way the result becomes visible once, under the task's
   key. A failing copy never fails the task; a task that errs releases its
   copy; a copy whose worker dies is dropped, and a copy that outlives its
   task's worker still wins if it finishes first.
5. **Losers.** dask cannot stop the losing thread: it runs to its end (or
   returns early if it calls :func:`daskjobs.cancelled`) and its result is
   dropped. Its elapsed time is counted as backup waste per team (only races count:
   an attempt that fails or dies with its worker is counted apart, as failed
   seconds). Until its worker says
   the thread returned (or the policy's reclaim timeout passes), the thread counts
   as held: a copy is not placed on it, and tasks waiting on that worker beyond its
   free threads move to idle workers.

Every decision - late or urgent, where a copy goes, which losers' threads are
reclaimed, which waiting tasks move where - is the policy's one call,
:meth:`Speculation.decide <daskjobs.policies.Speculation.decide>`, made on each
periodic check; this module adapts dask's state to its views and enacts the answer,
and its reasons are what ``explain()`` and the audit trail report.

Every private piece of dask used here is in :mod:`daskjobs.plugin.surgery._internals`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from daskjobs.plugin.audit import Audit
from daskjobs.plugin.periodic import every
from daskjobs.plugin.speeds import WorkerSpeeds
from daskjobs.plugin.surgery import _internals
from daskjobs.plugin.views import LiveAttempt, LiveTask
from daskjobs.plugin.workers.worker import COPY_PREFIX  # first element of a copy's key
from daskjobs.policies import Speculation
from daskjobs.policies.speculation import Horizon

if TYPE_CHECKING:
    from dask.typing import Key
    from distributed.scheduler import Scheduler

logger = logging.getLogger("daskjobs.plugin")
#: dask's states of a task that waits to start: for its inputs, in the scheduler's queue,
#: for a worker that can run it (a task sent to a worker waits until its start is reported)
_WAITS = frozenset({"waiting", "queued", "no-worker"})
#: Each copy decision and its reason, at DEBUG (as distributed's memory manager logs).
decisions = logging.getLogger("daskjobs.decisions")


@dataclass(slots=True)
class _Worker:
    """A worker as a candidate for a copy (a ``Speculation.Candidate``)."""

    ws: Any
    index: int
    free: int
    cores: int
    copies: int
    same_host: bool

    @property
    def name(self) -> str:
        return str(self.ws.address)


@dataclass(frozen=True, slots=True)
class _Loser:
    """A released loser whose thread still runs (a ``Speculation.Loser``)."""

    node: int
    key: Any
    released: float
    estimate: float
    worker: str


@dataclass(frozen=True, slots=True)
class _Waiting:
    """A task the scheduler sent to ``ws`` that has not started there."""

    ts: Any
    ws: Any
    cores: int = 1  # a dask task takes one thread


@dataclass(frozen=True, slots=True)
class _Held:
    """A worker losers' threads may hold (a ``Speculation.Held``)."""

    index: int
    cores: int
    started: int
    waiting: list[_Waiting]
    ws: Any


__all__ = ["COPY_PREFIX", "DEPRECATED_STATS", "Race", "Speculator", "copy_key"]

#: Keys of ``status()["speculation"]`` kept for one release under their old names, each with
#: the value of the key it names (removed in 0.2): ``running_losers`` (released losers whose
#: thread still runs), ``moved_off_losers`` (tasks moved off a worker such a thread holds),
#: ``losers_reclaimed`` (threads taken for returned by the policy's reclaim rule).
DEPRECATED_STATS = {
    "zombies": "running_losers",
    "moved_off_zombies": "moved_off_losers",
    "zombies_reclaimed": "losers_reclaimed",
}


def copy_key(key: Key) -> Key:
    """The key of ``key``'s backup copy."""
    return (COPY_PREFIX, key)


@dataclass(slots=True)
class Race:
    """A task and its backup copy, from the copy's launch until one of them wins."""

    key: Key  # the task
    copy: Key  # the copy's key
    worker: str  # the copy's worker
    primary: str  # the task's worker when the copy was launched
    launched: float
    started: bool = False  # the copy's worker reported it executing
    redirected: bool = False  # the copy won: the task is an alias of it until in memory
    end_recorded: bool = False  # the copy's end went to the trace under the task's key
    restrictions: tuple[Any, bool] = (None, False)  # the task's own, restored after


class Speculator:
    """Launch and settle backup copies for one :class:`~daskjobs.plugin.JobsPlugin`.

    State: ``starts`` {task key: (worker, start time, run_id)} of started primaries;
    ``races`` {task key: :class:`Race`} while a copy exists; ``copies`` {copy key:
    task key} for the hooks; ``running_losers`` {worker: keys released while their
    thread still runs}. Hooks are O(1) dict lookups; graph changes happen in callbacks on the
    event loop, outside dask's transition loop.
    """

    def __init__(
        self,
        spec: Speculation,
        audit: Audit,
        tasks: Mapping[Key, LiveTask],
        speeds: WorkerSpeeds,
    ) -> None:
        self.spec = spec
        self.interval = spec.interval  # the policy's: replay checks as often
        self.audit = audit
        self.tasks = tasks  # the ranked tasks' views
        self.speeds = speeds  # workers as nodes, and the speed learner
        self.sums = Horizon()  # the projected end's sums, fed by every transition
        self.starts: dict[Key, tuple[str, float, int]] = {}
        self.unstarted: set[Key] = set()  # assigned to a worker, its start not reported
        self.waits = 0  # tasks (not copies) in a state of _WAITS, kept by every transition
        self.races: dict[Key, Race] = {}
        self.copies: dict[Key, Key] = {}
        self.copied: set[Key] = set()  # one copy per attempt, whatever became of it
        self.reasons: dict[Key, str] = {}  # the latest copy decision per task
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
        self.running_losers: dict[str, set[Key]] = {}
        # (worker, key) -> (when released, the task's estimate): the policy's reclaim rule
        self._released: dict[tuple[str, Key], tuple[float, float]] = {}
        self.moved = 0  # tasks moved off a worker where a released loser's thread runs
        self.reclaimed = 0  # losers' threads the policy took for returned (no report in time)
        # team -> seconds run by the losing side of backup races (a losing copy, or a
        # primary its copy beat): what copies cost, and only that
        self.waste: dict[str, float] = {}
        # team -> seconds run by attempts that failed or were lost with their worker (no
        # copy involved): reported apart, never as backup waste
        self.failed_seconds: dict[str, float] = {}
        self._pc: Any = None
        self.scheduler: Scheduler = None  # type: ignore[assignment]  # set at start

    # -- lifecycle -----------------------------------------------------------------
    def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self._pc = every(scheduler, "daskjobs-speculation", self.interval, self._tick)

    def close(self) -> None:
        sched = self.scheduler
        if sched is None:
            return
        if self._pc is not None:
            self._pc.stop()
        for race in list(self.races.values()):
            if not race.redirected:
                self._drop(race, "abandoned", "daskjobs-speculation-closed")

    @property
    def backups(self) -> dict[Key, Race]:
        """The races with a copy running (not yet settled)."""
        return {k: r for k, r in self.races.items() if not r.redirected}

    def stats(self) -> dict[str, Any]:
        plain = {
            "running_losers": sum(len(k) for k in self.running_losers.values()),
            "moved_off_losers": self.moved,
            "losers_reclaimed": self.reclaimed,
        }
        return {
            **self.counts,
            **plain,
            **{old: plain[new] for old, new in DEPRECATED_STATS.items()},
            "running": sum(1 for r in self.races.values() if not r.redirected),
            "peak": self.peak,
            "late_factor": self.spec.late_factor,
            "waste_seconds": dict(self.waste),
            "failed_seconds": dict(self.failed_seconds),
        }

    # -- what the plugin asks ------------------------------------------------------
    def is_copy(self, key: Key) -> bool:
        return key in self.copies

    def is_alias(self, key: Key) -> bool:
        """``key`` runs as an alias of its winning copy (no real work: learn nothing)."""
        race = self.races.get(key)
        return race is not None and race.redirected

    def recorded_as(self, key: Key, start: str, finish: str) -> Key | None:
        """The key a transition is recorded under in a trace (docs/reference/trace-format.md), or
        None.

        The trace tells a race as it always has: the copy's start and, if it wins,
        its end, under the task's key; the redirect and the alias are bookkeeping
        and are not recorded; a losing copy's end is not recorded either.
        """
        task = self.copies.get(key)
        if task is not None:
            if start == "processing" and finish == "memory":
                ts = self.scheduler.tasks.get(task)
                race = self.races.get(task)
                if ts is not None and ts.state != "memory":
                    if race is not None:
                        race.end_recorded = True
                    return task
            return None
        race = self.races.get(key)
        if race is not None and (race.redirected or (race.end_recorded and start == "processing")):
            # the task stands in for its copy, or its primary ended just after the copy
            # (before the race was settled): the copy's end is the one recorded
            return None
        return key

    # -- observations ----------------------------------------------------------------
    def started(self, key: Key, worker: str | None, run_id: Any, age: float = 0.0) -> Key | None:
        """A worker reports that ``key`` really started executing, ``age`` seconds ago (a
        delayed report; the worker's clock measures the age, not the time). Returns the key
        the start belongs to (the task's, for a copy), or None for a stale report."""
        task = self.copies.get(key)
        if task is not None:
            race = self.races.get(task)
            if race is not None and worker == race.worker:
                race.started = True
                return task
            return None
        ts = self.scheduler.tasks.get(key)
        if worker and _internals.runs_on(ts, worker, run_id):
            began = time.time() - (age if 0.0 < age < math.inf else 0.0)
            v = self.tasks.get(key)
            if v is not None and key in self.unstarted:  # its work now runs: see transition
                self.unstarted.discard(key)
                self.sums.pop(v.estimate, v.cores)
                self.sums.started(key, v.cores, began + v.estimate * self.speeds.speed(worker))
            if key not in self.starts and key not in self.races:
                self.starts[key] = (worker, began, int(run_id))
        return key

    def reestimated(self, changed: list[tuple[Any, Any, str]]) -> None:
        """Waiting tasks got new estimates (``(old view, new view, dask state)`` each): the
        horizon's sums of queued work follow (O(changed))."""
        sums = self.sums
        unstarted = self.unstarted
        for old, new, state in changed:
            # a queued task, or one dask sent to a worker that has not reported its start
            if state == "queued" or (state == "processing" and new.tid in unstarted):
                sums.pop(old.estimate, old.cores)
                sums.push(new.estimate, new.cores)

    def transition(self, key: Key, start: str, finish: str, kwargs: dict[str, Any]) -> None:
        """Every scheduler transition (O(1)): keep the horizon's sums, and settle races
        as tasks and copies move."""
        task = self.copies.get(key)
        waits = (finish in _WAITS) - (start in _WAITS)
        if waits and task is None:
            self.waits += waits
        v = self.tasks.get(key)
        if v is not None:
            sums = self.sums
            if finish == "queued":
                sums.push(v.estimate, v.cores)
            elif start == "queued":
                sums.pop(v.estimate, v.cores)
            # A task dask assigned to a worker may wait there behind others (dask's
            # worker-saturation): it counts as work still to start until its worker
            # reports the true start (``started``), as the simulator counts it.
            if finish == "processing":
                sums.push(v.estimate, v.cores)
                self.unstarted.add(key)
            elif start == "processing":
                unstarted = self.unstarted
                if key in unstarted:
                    unstarted.discard(key)
                    sums.pop(v.estimate, v.cores)
                else:
                    sums.ended(key)
        if task is not None:
            self._copy_moved(task, key, start, finish, kwargs)
            return
        if finish == "forgotten":
            self.reasons.pop(key, None)
        if start == "processing":
            self.copied.discard(key)
            st = self.starts.pop(key, None)
            if st is not None and finish != "memory":  # a failed or lost attempt: no race
                self._waste(key, time.time() - st[1], self.failed_seconds)
        race = self.races.get(key)
        if race is None:
            return
        if race.redirected:
            if finish == "memory" or finish == "forgotten":
                self._restore(race)
            return
        if finish == "memory":  # the task won (its primary, or dask's fresh attempt)
            self._later(self._settle, race, "lost")
        elif finish in ("erred", "forgotten") or (finish == "released" and not self._wanted(key)):
            self._later(self._settle, race, "abandoned")

    def _copy_moved(
        self, task: Key, key: Key, start: str, finish: str, kwargs: dict[str, Any]
    ) -> None:
        if finish == "forgotten":
            del self.copies[key]
            return
        race = self.races.get(task)
        if race is None or race.redirected or start != "processing":
            return
        if finish == "memory":
            self._later(self._settle, race, "won")
            seconds = _internals.compute_seconds(kwargs.get("startstops"))
            v = self.tasks.get(task)
            worker = kwargs.get("worker")
            if seconds is not None and v is not None and worker:
                self.speeds.learn(v, worker, seconds)
        elif finish == "erred":  # the task carries on alone
            self._later(self._settle, race, "failed")
        else:  # its worker died: the task carries on, and may be copied again elsewhere
            self.copied.discard(task)
            self._later(self._settle, race, "abandoned")

    def _wanted(self, key: Key) -> bool:
        return _internals.wanted(self.scheduler.tasks.get(key))

    def returned(self, key: Key, worker: str | None) -> None:
        """``worker`` reports that the thread of a released ``key`` has returned."""
        keys = self.running_losers.get(worker or "")
        self._released.pop((worker or "", key), None)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.running_losers[worker or ""]

    def worker_removed(self, worker: str) -> None:
        for key in self.running_losers.pop(worker, ()):
            self._released.pop((worker, key), None)

    # -- settling, outside dask's transition loop ------------------------------------
    def _later(self, fn: Callable[..., None], *args: Any) -> None:
        def run() -> None:
            try:
                fn(*args)
            except Exception:
                self.audit.failed("speculation", args[0].key if args else None)

        asyncio.get_running_loop().call_soon(run)

    def _settle(self, race: Race, outcome: str) -> None:
        if self.races.get(race.key) is not race or race.redirected:
            return  # settled already
        sched = self.scheduler
        ts = sched.tasks.get(race.key)
        cts = sched.tasks.get(race.copy)
        now = time.time()
        if (
            outcome == "won"
            and ts is not None
            and cts is not None
            and cts.state == "memory"
            and ts.state in ("processing", "waiting", "queued", "no-worker")
        ):
            loser = _internals.processing_worker(ts)
            adopted = loser != race.primary
            race.redirected = True
            race.restrictions = _internals.restrictions(ts)
            if loser is not None:
                self._learn_from_loser(race.key, loser, now)
            self.starts.pop(race.key, None)
            _internals.redirect(sched, ts, cts, f"daskjobs-backup-won-{now}")
            self.counts["adopted" if adopted else "won"] += 1
            if loser is not None:
                self._note_running_loser(loser, race.key)
            self._waste(race.key, now - race.launched)  # the primary's time since launch
            self._decided(race.key, f"copy on {race.worker} won; the task reads its result")
            self.audit.event(
                "backup-adopted" if adopted else "backup-won",
                key=str(race.key),
                winner=race.worker,
                loser=loser,
            )
            if ts.state == "memory":  # pragma: no cover - dask finished it in one go
                self._restore(race)
            return
        if outcome == "won":  # the task got there first after all
            outcome = "lost"
        self._drop(race, outcome, f"daskjobs-backup-{outcome}-{now}")

    def _drop(self, race: Race, outcome: str, stimulus_id: str) -> None:
        """The race is over without the copy winning: forget the copy."""
        self.races.pop(race.key, None)
        sched = self.scheduler
        cts = sched.tasks.get(race.copy)
        if cts is not None and cts.state == "processing" and race.started:
            self._note_running_loser(race.worker, race.copy)  # its thread runs on
        self.counts[outcome] += 1
        self._decided(race.key, f"copy on {race.worker} {outcome}")
        self._waste(race.key, time.time() - race.launched)
        if cts is not None:
            _internals.release_copy(sched, race.copy, stimulus_id)
        self.audit.event(
            f"backup-{outcome}", key=str(race.key), worker=race.worker, primary=race.primary
        )

    def _restore(self, race: Race) -> None:
        """The redirected task is done: its own restrictions back, the race over."""
        self.races.pop(race.key, None)
        ts = self.scheduler.tasks.get(race.key)
        if ts is not None:
            _internals.restore_restrictions(ts, race.restrictions)

    # -- losers' threads ---------------------------------------------------------------
    def _note_running_loser(self, worker: str, key: Key) -> None:
        """A loser released on ``worker`` whose thread runs on: it holds a thread until
        the worker says it returned, or the policy reclaims it
        (:meth:`Speculation.reclaim_at <daskjobs.policies.Speculation.reclaim_at>`)."""
        self.running_losers.setdefault(worker, set()).add(key)
        v = self.tasks.get(self.copies.get(key, key))
        self._released[(worker, key)] = (time.time(), v.estimate if v is not None else 0.0)

    def _losers(self) -> list[_Loser]:
        out = []
        for (worker, key), (released, estimate) in self._released.items():
            out.append(_Loser(self.speeds.node(worker), key, released, estimate, worker))
        return out

    def _held(self, sched: Any) -> list[_Held]:
        """The workers losers' threads hold, with the tasks waiting there."""
        out = []
        for address in list(self.running_losers):
            ws = sched.workers.get(address)
            if ws is None:
                self.worker_removed(address)
                continue
            waiting = _internals.waiting_on(ws, self.starts, self.copies)
            out.append(
                _Held(
                    self.speeds.node(address),
                    ws.nthreads,
                    _internals.started_on(ws, self.starts),
                    [_Waiting(ts, ws) for ts in waiting],
                    ws,
                )
            )
        return out

    # -- the periodic check ----------------------------------------------------------
    def _tick(self) -> None:
        try:
            self._check(time.time())
        except Exception:
            self.audit.failed("speculation")

    def _slots(self) -> int:
        return sum(ws.nthreads for ws in self.scheduler.workers.values())

    def _running(self) -> int:
        return sum(1 for r in self.races.values() if not r.redirected)

    def _check(self, now: float) -> None:
        """Ask the policy (:meth:`Speculation.decide
        <daskjobs.policies.Speculation.decide>`) about the started tasks, the losers'
        threads and the tasks waiting behind them, and enact its decision. Every
        decision is the policy's: which tasks are late or urgent, where each copy goes,
        which losers' threads are taken for returned, which waiting tasks move where.
        This only adapts dask's state (true starts, workers, the work the scheduler
        holds) and enacts the answer."""
        if not self.starts and not self.running_losers:
            return
        sched = self.scheduler
        judge: list[LiveAttempt] = []
        of: dict[int, tuple[Any, str]] = {}  # id(attempt) -> (task state, worker)
        for key, (worker, t0, run_id) in list(self.starts.items()):
            if key in self.races or key in self.copied:
                continue
            ts = sched.tasks.get(key)
            if ts is None or not _internals.runs_on(ts, worker, run_id):
                self.starts.pop(key, None)
                continue
            v = self.tasks.get(key)
            if v is None or not _internals.can_copy(ts) or copy_key(key) in sched.tasks:
                continue  # no view, nothing to run twice, or an earlier copy still known
            attempt = LiveAttempt(v, self.speeds.node(worker), t0)
            judge.append(attempt)
            of[id(attempt)] = (ts, worker)
        movable = bool(self.running_losers) and _internals.can_move(sched)
        # one candidate list per primary worker and placement in a check: the end game may
        # ask for every running task, and tasks alike share their answer (and decide
        # does not ask again about a list it has refused until a copy is placed)
        lists: dict[tuple[str, Any], list[_Worker]] = {}

        def candidates(a: LiveAttempt) -> list[_Worker]:
            ts, worker = of[id(a)]
            k = (worker, _internals.placement(ts))
            got = lists.get(k)
            if got is None:
                got = lists[k] = self._candidates(ts, worker)
            return got

        decision = self.spec.decide(
            now,
            self.speeds.learner,  # the beliefs the policy's decisions read
            judge=judge,
            candidates=candidates,
            horizon=lambda: self._horizon(now),
            running=self._running(),
            slots=self._slots(),
            losers=self._losers(),
            held=self._held(sched) if movable else (),
            idle=self._idle(sched) if movable else (),
            waiting=self._waiting(),
        )
        for r in decision.reclaimed:
            self.returned(r.loser.key, r.loser.worker)
            self.reclaimed += 1
            decisions.debug("%s: %s", r.loser.key, r.reason)
            self.audit.event(
                "loser-reclaimed", key=str(r.loser.key), worker=r.loser.worker, reason=r.reason
            )
        for c in decision.copies:
            key = c.attempt.task.tid
            self._decided(key, c.reason)
            if c.target is not None:
                self._launch(of[id(c.attempt)][0], c.target.ws, now, c.why, c.reason)
        for m in decision.moves:
            if _internals.move_waiting(sched, m.task.ts, m.task.ws, m.target.ws):
                self.moved += 1
                decisions.debug("%s: %s", m.task.ts.key, m.reason)
                self.audit.event(
                    "moved-off-loser",
                    key=str(m.task.ts.key),
                    worker=m.task.ws.address,
                    thief=m.target.ws.address,
                    reason=m.reason,
                )

    def _waiting(self) -> int | None:
        """The tasks that wait to start (the policy's end game asks for none): those in a
        waiting state, and those sent to a worker whose start is not reported yet. None if
        the count went below zero (the plugin joined with tasks already waiting)."""
        n = self.waits + len(self.unstarted)
        return n if self.waits >= 0 else None

    def _decided(self, key: Key, reason: str) -> None:
        """Keep the latest decision about ``key`` for explain, and log it at DEBUG."""
        if self.reasons.get(key) != reason:
            self.reasons[key] = reason
            decisions.debug("%s: %s", key, reason)

    def _horizon(self, now: float) -> float:
        """The projected end of the work the scheduler holds: the policy's sums
        (:class:`~daskjobs.policies.speculation.Horizon`, fed by every transition, as
        replay feeds them) over the learner's effective capacity. O(1)."""
        return self.sums.value(now, self.speeds.learner.capacity())

    def _candidates(self, ts: Any, primary: str) -> list[_Worker]:
        """The workers that could run a copy of ``ts`` at all (running, with its
        resources, within its hard restrictions), as the policy's candidates."""
        sched = self.scheduler
        pws = sched.workers.get(primary)
        copies: dict[str, int] = {}
        for r in self.races.values():
            if not r.redirected:
                copies[r.worker] = copies.get(r.worker, 0) + 1
        return [
            _Worker(
                ws,
                self.speeds.node(ws.address),
                _internals.free_threads(ws),
                ws.nthreads,
                copies.get(ws.address, 0),
                pws is not None and ws.host == pws.host,
            )
            for ws in sched.workers.values()
            if _internals.is_running(ws) and _internals.may_run_on(ts, ws)
        ]

    def _idle(self, sched: Any) -> list[_Worker]:
        """The running workers with a free thread, where a task waiting behind a loser
        could move (the policy leaves out those losers hold)."""
        out = []
        for ws in sched.workers.values():
            free = _internals.free_threads(ws)
            if free and _internals.is_running(ws):
                out.append(_Worker(ws, self.speeds.node(ws.address), free, ws.nthreads, 0, False))
        return out

    def _launch(self, ts: Any, ws: Any, now: float, why: str, reason: str) -> None:
        sched = self.scheduler
        ck = copy_key(ts.key)
        primary = _internals.processing_worker(ts)
        race = Race(ts.key, ck, ws.address, primary or "", now)
        self.races[ts.key] = race
        self.copies[ck] = ts.key
        self.copied.add(ts.key)
        ann = ts.annotations or {}
        _internals.add_copy(
            sched,
            ts,
            ck,
            ws.address,
            f"daskjobs-backup-{now}",
            annotations={k: ann[k] for k in ("stage", "team") if k in ann} | {"copy_of": ts.key},
        )
        self.counts["launched"] += 1
        self.peak = max(self.peak, self._running())
        self.audit.event(
            "backup-launched",
            key=str(ts.key),
            primary=primary,
            backup=ws.address,
            late_by=round(now - self.starts[ts.key][1], 3),
            why=why,
            reason=reason,
        )

    # -- accounting ------------------------------------------------------------------
    def _waste(self, key: Key, seconds: float, into: dict[str, float] | None = None) -> None:
        """Count ``seconds`` for ``key``'s team in ``into`` (default: backup waste)."""
        totals = self.waste if into is None else into
        v = self.tasks.get(key)
        team = v.team if v is not None else "default"
        totals[team] = totals.get(team, 0.0) + max(seconds, 0.0)

    def _learn_from_loser(self, key: Key, worker: str, now: float) -> None:
        """A primary beaten by its copy ran ``now - start`` on ``worker``: the learner's
        rule decides what that teaches (a lower bound, once past its estimate)."""
        start = self.starts.pop(key, None)
        v = self.tasks.get(key)
        if start is None or v is None or start[0] != worker:
            return
        self.speeds.learn(v, worker, now - start[1], outcome="killed")
