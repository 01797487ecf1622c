"""The jobs service: a scheduler plugin that runs the ledger's jobs as dask tasks.

dask stays the engine: every attempt is an ordinary dask task (key
``daskjobs-attempt-<job>-p<part>-t<token>``, submitted by a client the service opens
on its own scheduler), placed and run by dask. The service only decides *which*
attempts exist, with the ledger as the source of truth:

* every ``interval`` it applies what dask reported (an attempt's task erred: the
  attempt failed), keeps the leases of attempts dask still holds (queued or handed to
  a worker), marks ``unknown`` a launch its worker has not acknowledged within
  ``launch-timeout`` of dask handing it over, expires leases, fails a job whose part
  used up its retries, and starts and launches an attempt of every part that needs one;
* after a restart it takes the next scheduler epoch (an older scheduler still running
  is fenced off) and reconciles: a launch of the older scheduler is ``unknown`` (its
  worker may or may not run it) until its worker reports it or its lease runs out;
  running attempts keep their leases (adopted: their workers may still commit); the
  rest runs again;
* all ledger work runs in one thread beside the event loop: scheduling never waits for
  the database. While the database is unreachable dask goes on scheduling (running
  attempts finish; their workers retry their commits), the service queues what dask
  reports (at most ``backlog`` entries; a dropped one is recovered by the lease rule),
  reports the outage in :meth:`status`, and catches up when the database is back.
  No lease expires until the database has answered promptly for a whole lease
  (:func:`daskjobs.jobs.model.may_expire`): workers could not renew meanwhile.

The rules of what to do with an attempt are :func:`daskjobs.jobs.model.next_step`'s;
this module enacts them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import hashlib
import json
import logging
import pickle
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import dask
import sqlalchemy as sa
from distributed.diagnostics.plugin import SchedulerPlugin

from daskjobs.cache.store import ResultStore, default_store_url
from daskjobs.config import JobsSettings, jobs_settings
from daskjobs.errors import SubmissionRefused, over_limit
from daskjobs.jobs.ledger import Fenced, Ledger, LedgerError, default_url, reason, safe_url
from daskjobs.jobs.model import (
    AttemptRecord,
    JobSpec,
    StaleTransition,
    may_expire,
    next_step,
    responsive,
)
from daskjobs.jobs.runner import Order, Prepare, run_attempt
from daskjobs.plugin.ranking import UnknownTeam
from daskjobs.plugin.surgery._internals import install_worker_plugin, peer_names

__all__ = ["JobsService", "attempt_key"]

logger = logging.getLogger("daskjobs.jobs")

#: errors that mean "the database is not reachable now" (retry later), not a bug
UNREACHABLE = (sa.exc.OperationalError, sa.exc.InterfaceError, OSError)


#: The key of an RPC answer that carries the client's error (pickled, as dask sends one).
REFUSED = "daskjobs-refused"


def attempt_key(job_id: str, part: int, token: int) -> str:
    return f"daskjobs-attempt-{job_id}-p{part}-t{token}"


@dataclass
class _Plan:
    """What one tick decided, for the event loop to enact."""

    launch: list[tuple[AttemptRecord, JobSpec]] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)  # keys of attempts the ledger ended
    more: bool = False  # parts left to start: another start pass once dask wants them


#: The operations that write to the ledger: refused once the service is fenced.
WRITES = frozenset({"submit", "cancel", "retry"})

#: Submissions within this many seconds share one start pass (the first of a burst
#: wakes one at once; the rest share the next, this long after).
SUBMIT_WINDOW = 0.05
#: Refresh the database's statistics after this many attempts started (Ledger.analyze),
#: or as many as were started before the last refresh if more (1,000, 2,000, 4,000...: a
#: planner's estimates need the tables' sizes within a factor, not exact, and each
#: ANALYZE costs the database server), or a minute after a start.
ANALYZE_AFTER = 1000
#: Parts started per tick at most: a job of ten thousand parts starts its first thousand
#: while the ledger records the next (dask runs the first while the next are written).
LAUNCH_BATCH = 1000
#: Parts left to start start in the next pass once at most this many attempts launched
#: here wait in dask's queue (not yet handed to a worker): a job of ten thousand parts
#: starts a batch as dask drains the last, not all of them in its first seconds (when the
#: passes' ledger work competed with dask's for the scheduler's CPU and slowed it most).
LOW_WATER = LAUNCH_BATCH // 2


class JobsService(SchedulerPlugin):
    """Runs the jobs of a ledger on this scheduler (module docs).

    ``ledger``: an SQLAlchemy URL (default ``daskjobs.ledger.url``, else an SQLite file
    in the store directory); ``store``: where outputs and checkpoints go (default the
    sweeps' store, ``daskjobs.store``); other keywords override ``daskjobs.jobs``
    (``lease="5s"``, ``launch_timeout=...``, ``interval=...``, ``backlog=...``).
    """

    name = "daskjobs-jobs"

    def __init__(self, ledger: str | None = None, store: str | None = None, **jobs: Any) -> None:
        self._ledger_url = ledger
        self._store = store
        self._overrides = jobs
        self.settings: JobsSettings = jobs_settings(jobs=jobs) if jobs else jobs_settings()
        self.ledger: Ledger | None = None
        self.epoch: int | None = None
        self.scheduler: Any = None
        self.client: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        self._prepare: asyncio.Future[None] | None = None
        self._wake: asyncio.Event | None = None
        self._closing = False
        self._attempts: dict[str, AttemptRecord] = {}  # key -> attempt launched here
        self._futures: dict[str, Any] = {}
        self._handed: dict[str, float] = {}  # key -> when dask gave it to a worker
        self._waiting: set[str] = set()  # keys launched here not yet handed to a worker
        self._more = False  # parts left to start once fewer than LOW_WATER wait in dask
        self._last_seen: dict[str, float] = {}  # worker -> its last heartbeat to dask
        self._dirty = True  # a start pass is wanted at the next tick
        self._soon = False  # a wake-up is scheduled (SUBMIT_WINDOW)
        self._kicked = 0.0  # time.monotonic() of the last wake-up a request asked for
        self._inserted = 0  # attempts started since the ledger's statistics were refreshed
        self._analyzed = time.monotonic()
        self._before_analyze = 0  # attempts started here before the last refresh
        self._next_full = 0.0  # time.monotonic() of the next full pass
        self._events: collections.deque[tuple[str, str, str]] = collections.deque()
        self.dropped = 0
        self.unreachable_since: float | None = None
        #: set once a newer scheduler took the ledger (:meth:`_fence`): what the service
        #: says about it (its status, its refusals); the service then stops ticking
        self.fenced: dict[str, Any] | None = None
        self.last_error = ""
        self.launched = 0
        self.ticks = 0
        # since when the ledger answered every write promptly (None: not now); leases
        # expire only once it has for a whole lease (model.may_expire)
        self._reachable_since: float | None = None

    # -- life cycle ----------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self._ledger_url or self.settings.ledger_url or default_url(self._store_root())

    @property
    def ledger_name(self) -> str:
        """The ledger's URL without its password (for logs and status)."""
        return _safe(self.url)

    def _store_root(self) -> str:
        url = self.store_url
        return url if "://" not in url else ".daskjobs-cache"

    @property
    def store_url(self) -> str:
        return ResultStore(self._store or default_store_url()).url

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        # the admission limits are the scheduler's: a client that registers the service
        # does not bring its own
        self.settings = dataclasses.replace(self.settings, admission=jobs_settings().admission)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="daskjobs-ledger")
        # the ledger opened and this scheduler's epoch taken before anything is served: a
        # ledger that cannot be used stops the scheduler, naming the setting (an outage
        # once it runs does not: dask goes on scheduling)
        try:
            await self._ledger_call(self._open_ledger)
        except Exception as e:
            self._pool.shutdown(wait=False)
            raise ValueError(f"{self._setting()}: {e}") from None
        self._wake = asyncio.Event()
        scheduler.handlers["daskjobs_jobs"] = self._rpc
        self._task = asyncio.ensure_future(self._run())
        self._prepare = asyncio.ensure_future(self._prepare_workers())
        logger.info("daskjobs jobs service on ledger %s", _safe(self.url))

    def _open_ledger(self) -> None:
        """Open (make, migrate) the ledger and take the next scheduler epoch; raises
        :class:`~daskjobs.jobs.ledger.LedgerError` naming the URL and what is wrong."""
        url = self.url
        try:
            if self.ledger is None:
                self.ledger = Ledger(url, busy_timeout=5.0)
            if self.epoch is None:
                before = self.ledger.holder()
                self.epoch = self.ledger.acquire_epoch(self._owner())
                self._tell_takeover(before)
                self._reconcile_start(self.ledger, self.epoch)
        except LedgerError:
            raise
        except (sa.exc.SQLAlchemyError, OSError) as e:
            raise LedgerError(f"cannot use the jobs ledger {_safe(url)}: {reason(e)}") from e

    def _owner(self) -> str:
        return f"scheduler {self.scheduler.address}"

    def _tell_takeover(self, before: Any) -> None:
        """Say at start whose epoch this scheduler took: a scheduler still running on the
        ledger (heard from within a lease) is fenced now and says so in its own log."""
        if not before.epoch:
            return
        now = time.time()
        recent = before.seen is not None and now - before.seen < self.settings.lease
        (logger.warning if recent else logger.info)(
            "daskjobs jobs service took over the ledger %s at epoch %d from %s%s",
            _safe(self.url),
            self.epoch,
            before.describe(now),
            ": that scheduler still ran a moment ago; it is fenced now, stops launching "
            "jobs and says so in its log (two schedulers on one ledger: the last one "
            "started owns it)"
            if recent
            else "",
        )

    def _setting(self) -> str:
        """The setting that chose the ledger, as the operator wrote it."""
        if self._ledger_url is None and self.settings.ledger_url is None:
            return "daskjobs.ledger.url (not set: the default ledger in the store directory)"
        if self._ledger_url is None or self._ledger_url == self.settings.ledger_url:
            return "daskjobs.ledger.url"
        return "JobsService(ledger=...)"

    async def _prepare_workers(self) -> None:
        """Install :class:`~daskjobs.jobs.runner.Prepare` on every worker, present and
        future (not awaited by :meth:`start`: a scheduler starts without waiting for its
        workers' imports)."""
        try:
            plugin = pickle.dumps(Prepare(self.url, self.store_url))
            await install_worker_plugin(self.scheduler, Prepare.name, plugin)
        except Exception:  # an optimisation: the first attempts import what they need
            logger.debug("daskjobs jobs: preparing the workers failed", exc_info=True)

    async def close(self) -> None:
        self._closing = True
        if self._prepare is not None and not self._prepare.done():
            self._prepare.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()
        if self._pool is not None:
            ledger = self.ledger
            if ledger is not None:
                self._pool.submit(ledger.close)
            self._pool.shutdown(wait=False)

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        # cheap: one dict lookup for every task that is not an attempt
        if key not in self._attempts:
            return
        try:
            if finish in ("processing", "memory", "erred", "forgotten"):
                self._waiting.discard(key)
                if self._more and len(self._waiting) <= LOW_WATER:
                    self._more = False
                    self._dirty = True
                    if self._wake is not None:
                        self._wake.set()
            if finish == "processing":
                self._handed[key] = time.time()
            elif finish == "erred":
                ts = self.scheduler.tasks.get(key)
                text = getattr(ts, "exception_text", "") or "the task erred"
                self._queue("erred", key, str(text)[:500])
            # a task that ended well is not reported: its commit (by its worker, in the
            # ledger) says how it ended, and the next tick drops it; waking a tick for each
            # of ten thousand short parts would read the ledger ten thousand times
        except Exception:
            logger.exception("daskjobs jobs: transition of %r", key)

    def _queue(self, kind: str, key: str, detail: str) -> None:
        if self.fenced is not None:  # the ledger's holder reconciles them
            return
        if len(self._events) >= self.settings.backlog:
            self._events.popleft()
            self.dropped += 1
        self._events.append((kind, key, detail))
        self._dirty = True
        if self._wake is not None:
            self._wake.set()

    # -- the loop -------------------------------------------------------------------------
    async def _run(self) -> None:
        assert self._wake is not None
        while not self._closing:
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Fenced as e:  # a newer scheduler took the ledger: said once, then stop
                await self._fence(e)
                return
            except Exception as e:  # never fatal to the scheduler
                self.last_error = f"{type(e).__name__}: {e}"
                logger.exception("daskjobs jobs service: tick failed")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.interval)
            self._wake.clear()

    async def _fence(self, e: Fenced) -> None:
        """A newer scheduler took the ledger (``e``): log one ERROR naming its epoch and
        holder, and stop. From here the service neither launches nor renews nor expires
        (the holder does), :meth:`status` says ``fenced`` and every submission, cancel
        and retry is refused with the same message. Idempotent."""
        if self.fenced is not None:
            return
        holder = None
        with contextlib.suppress(Exception):  # the message names what it can
            assert self.ledger is not None
            holder = await self._ledger_call(self.ledger.holder)
        now = time.time()
        newer = holder.describe(now) if holder is not None else f"epoch {e.current}"
        message = (
            f"daskjobs jobs service on this scheduler is fenced: the ledger {_safe(self.url)} "
            f"was taken over by a newer scheduler ({newer}; this one held epoch {e.epoch}). "
            "It no longer launches, renews or expires attempts and refuses submissions, "
            "cancels and retries: the scheduler that holds the ledger runs its jobs. Restart "
            "this scheduler to take the ledger back (it then fences the other)."
        )
        self.fenced = {
            "epoch": e.epoch,
            "by_epoch": holder.epoch if holder is not None else e.current,
            "holder": holder.holder if holder is not None else None,
            "since": now,
            "message": message,
        }
        self.last_error = message
        self._events.clear()
        logger.error("%s", message)

    def _refusal(self) -> Fenced:
        assert self.fenced is not None
        return Fenced(self.fenced["epoch"], self.fenced["by_epoch"], self.fenced["message"])

    async def _ledger_call(self, fn: Any, *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, fn, *args)

    async def _tick(self) -> None:
        if self.client is None:
            from distributed import Client

            self.client = await Client(
                self.scheduler.address, asynchronous=True, name="daskjobs-jobs"
            )
            # the service's own client launches attempts of jobs whose team was decided at
            # submission: the plugin takes their team annotations as they are
            teams = getattr(self.scheduler.plugins.get("daskjobs"), "identities", None)
            if teams is not None:
                teams.trust(self.client.id)
        tasks = self.scheduler.tasks
        workers = self.scheduler.workers
        # every tick applies dask's reports, probes the database and expires leases; the
        # full pass (every attempt's ledger state against dask's: drops, renewals, unknown
        # launches) runs every sixth of a lease (or after a cancel); parts start in a full
        # pass and whenever something asks for it (a submission, a retry, a failure, a
        # lost lease, parts left to start) - a stream of submissions costs no full passes
        full = time.monotonic() >= self._next_full
        start = full or self._dirty or (self._more and len(self._waiting) <= LOW_WATER)
        self._dirty = False
        snapshot: dict[str, str | None] = {}
        seen: dict[str, float] = {}
        if full:
            self._next_full = time.monotonic() + max(
                self.settings.interval, self.settings.lease / 6
            )
            for key in self._attempts:
                ts = tasks.get(key)
                snapshot[key] = ts.state if ts is not None else None
                ws = ts.processing_on if ts is not None else None
                if ws is not None:
                    seen[key] = ws.last_seen
        self._last_seen = {addr: ws.last_seen for addr, ws in workers.items()}
        events = list(self._events)
        try:
            plan = await self._ledger_call(
                self._tick_sync, events, snapshot, dict(self._handed), seen, full, start
            )
        except UNREACHABLE as e:
            self._owe(full, start)
            self._reachable_since = None
            if self.unreachable_since is None:
                self.unreachable_since = time.time()
                logger.warning(
                    "daskjobs ledger %s unreachable (%s): scheduling goes on; %d report(s) "
                    "queued until it is back",
                    _safe(self.url),
                    getattr(e, "orig", e),
                    len(self._events),
                )
            self.last_error = f"ledger unreachable: {getattr(e, 'orig', e)}"
            return
        except BaseException:
            self._owe(full, start)
            raise
        for _ in events:  # applied: the reports that came meanwhile stay queued
            if self._events:
                self._events.popleft()
        if self.unreachable_since is not None:
            logger.warning(
                "daskjobs ledger %s reachable again after %.1fs",
                _safe(self.url),
                time.time() - self.unreachable_since,
            )
            self.unreachable_since = None
        self.ticks += 1
        for key in plan.drop:
            self._forget(key)
        if plan.launch:
            try:
                self._launch(plan.launch)
            except Exception:  # their leases run out and their parts run again
                logger.exception("daskjobs jobs: launching %d attempt(s) failed", len(plan.launch))
        if start:
            self._more = False  # this pass said whether parts are left (plan.more)
        if plan.more and len(self._waiting) <= LOW_WATER and self._wake is not None:
            self._dirty = True
            self._wake.set()
        elif plan.more:
            self._more = True  # the next pass when dask has drained its queue to LOW_WATER

    def _owe(self, full: bool, start: bool) -> None:
        """A tick that failed still owes its passes: the next tick makes them."""
        self._dirty = self._dirty or start
        if full:
            self._next_full = 0.0

    def _forget(self, key: str) -> None:
        self._attempts.pop(key, None)
        self._handed.pop(key, None)
        self._waiting.discard(key)
        future = self._futures.pop(key, None)
        if future is not None:
            future.release()

    def _launch(self, launch: list[tuple[AttemptRecord, JobSpec]]) -> None:
        """Submit attempts as dask tasks: one graph per job (one message to the
        scheduler, not one per attempt)."""
        where = responsive(self._last_seen, time.time(), self.settings.lease)
        # once per launch, not per order: each property builds a ResultStore
        ledger_url, store_url = self.url, self.store_url
        by_job: dict[str, list[tuple[AttemptRecord, JobSpec]]] = {}
        for attempt, spec in launch:
            by_job.setdefault(attempt.job_id, []).append((attempt, spec))
        for group in by_job.values():
            spec = group[0][1]
            keys = [attempt_key(a.job_id, a.part, a.token) for a, _ in group]
            orders = [
                Order(
                    ledger_url=ledger_url,
                    store_url=store_url,
                    job_id=a.job_id,
                    part=a.part,
                    parts=spec.parts,
                    token=a.token,
                    attempt_id=a.attempt_id,
                    target=spec.target,
                    params=dict(spec.params),
                    lease=self.settings.lease,
                    checkpoint_every=spec.checkpoint_every,
                )
                for a, _ in group
            ]
            for key, (a, _) in zip(keys, group, strict=True):
                self._attempts[key] = a
            self._waiting.update(keys)
            # the job's team as the tasks' team annotation: the scheduler plugin's fair
            # share and quotas count a job's attempts for its team, as any task of it
            # (and its class: an interactive job's attempts take resources back from
            # best-effort tasks when the plugin's preemption is on)
            # (and what their workers must have: the plugin's resource placement)
            team = {"team": spec.team} if spec.team is not None else {}
            with dask.annotate(**team, job_class=spec.job_class, **spec.placement()):
                futures = self.client.map(
                    run_attempt,
                    orders,
                    key=keys,
                    pure=False,
                    priority=spec.priority,
                    resources=dict(spec.resources) or None,
                    workers=where,
                    retries=0,
                )
            self._futures.update(zip(keys, futures, strict=True))
            self.launched += len(group)

    # -- one tick in the ledger's thread ----------------------------------------------------
    def _tick_sync(
        self,
        events: list[tuple[str, str, str]],
        snapshot: dict[str, str | None],
        handed: dict[str, float],
        seen: dict[str, float],
        full: bool = True,
        start: bool = True,
    ) -> _Plan:
        if self.ledger is None:
            self.ledger = Ledger(self.url, busy_timeout=5.0)
        ledger = self.ledger
        if self.epoch is None:
            self.epoch = ledger.acquire_epoch(self._owner())
            self._reconcile_start(ledger, self.epoch)
        epoch = self.epoch
        plan = _Plan()
        now = ledger.clock()
        for kind, key, detail in events:
            attempt = self._attempts.get(key)
            if attempt is None:
                continue
            if kind == "erred":
                ledger.end_attempt(attempt.attempt_id, attempt.token, "failed", epoch, detail)
        if full:
            self._reconcile(ledger, epoch, plan, snapshot, handed, seen, now)
        self._probe_and_expire(ledger, epoch)
        if start:
            self._start(ledger, epoch, plan)
        return plan

    def _reconcile(
        self,
        ledger: Ledger,
        epoch: int,
        plan: _Plan,
        snapshot: dict[str, str | None],
        handed: dict[str, float],
        seen: dict[str, float],
        now: float,
    ) -> None:
        """Every attempt launched here against the ledger and dask (``next_step``)."""
        live = ledger.live_leases()
        renew = []
        for key, mine in self._attempts.items():
            state, lease_until = live.get(mine.attempt_id, (None, None))
            step = next_step(
                state,
                task_state=snapshot.get(key),
                handed=handed.get(key),
                now=now,
                launch_timeout=self.settings.launch_timeout,
                worker_seen=seen.get(key),
                lease=self.settings.lease,
            )
            if step == "drop":
                plan.drop.append(key)
            elif step == "renew":
                # every third of a lease (a tick renewing every queued attempt would
                # rewrite them all, each tick)
                if (lease_until or 0.0) - now < self.settings.lease * 2 / 3:
                    renew.append((mine.attempt_id, mine.token))
            elif step == "unknown":
                with contextlib.suppress(StaleTransition):  # its worker reported meanwhile
                    ledger.move_attempt(
                        mine.attempt_id,
                        mine.token,
                        "launching",
                        "unknown",
                        epoch,
                        f"not acknowledged {self.settings.launch_timeout:g}s after dask gave it "
                        "to a worker; reconciling",
                    )
                renew.append((mine.attempt_id, mine.token))
        ledger.renew_many(renew, self.settings.lease, epoch)

    def _start(self, ledger: Ledger, epoch: int, plan: _Plan) -> None:
        """Start attempts of the parts that need one (at most ``LAUNCH_BATCH``)."""
        ledger.settle(epoch)
        wanted = []
        runnable = ledger.runnable(limit=LAUNCH_BATCH)
        plan.more = len(runnable) == LAUNCH_BATCH
        for job, part, failures in runnable:
            if failures > job.spec.retries:
                ledger.fail(
                    job.job_id,
                    epoch,
                    f"part {part} failed {failures} time(s) (retries: {job.spec.retries})",
                )
                continue
            wanted.append((job, part))
        if wanted:
            specs = {job.job_id: job for job, _ in wanted}
            started = ledger.start_attempts(
                [(j.job_id, p) for j, p in wanted], self.settings.lease, epoch
            )
            ledger.jobs_running(
                sorted({a.job_id for a in started if specs[a.job_id].state == "queued"}), epoch
            )
            plan.launch = [(a, specs[a.job_id].spec) for a in started]
            self._inserted += len(started)
        if self._inserted >= max(ANALYZE_AFTER, self._before_analyze) or (
            self._inserted and time.monotonic() - self._analyzed >= 60
        ):
            ledger.analyze()
            self._before_analyze += self._inserted
            self._inserted, self._analyzed = 0, time.monotonic()

    def _probe_and_expire(self, ledger: Ledger, epoch: int) -> None:
        """Probe the database; expire leases once it has answered promptly for a lease."""
        ledger.touch(epoch)
        patience = self.settings.lease / 3  # a write waiting longer: locked or hanging
        waited = ledger.take_waited()
        if waited > patience or self._reachable_since is None:
            self._reachable_since = ledger.clock()
        if may_expire(ledger.clock(), self._reachable_since, self.settings.lease):
            lost = ledger.expire(epoch, patience=patience)
            if lost is None:
                self._reachable_since = ledger.clock()
            elif lost:
                self._dirty = True  # their parts may start again: a full pass next tick

    def _reconcile_start(self, ledger: Ledger, epoch: int) -> None:
        """A new epoch: launches of an older scheduler are unknown until their workers
        report them or their leases run out; running attempts are adopted."""
        for a in ledger.live_attempts():
            if a.state == "launching":
                with contextlib.suppress(StaleTransition):  # its worker reported meanwhile
                    ledger.move_attempt(
                        a.attempt_id,
                        a.token,
                        "launching",
                        "unknown",
                        epoch,
                        f"the scheduler that launched it is gone (epoch {epoch} took over)",
                    )

    # -- the RPC ------------------------------------------------------------------------------
    async def _rpc(self, comm: Any, action: str, **kw: Any) -> Any:
        op = action
        if op == "status":
            return self.status()
        fn = getattr(self, f"_op_{op}", None)
        if fn is None:
            raise ValueError(f"daskjobs jobs: unknown operation {op!r}")
        if self.fenced is not None and op in WRITES:
            return {REFUSED: pickle.dumps(self._refusal())}
        try:
            if op == "submit":  # its team, decided here, where the plugin is
                kw = self._decide_team(comm, kw)
            result = await self._ledger_call(self._with_ledger, fn, kw)
        except Fenced as e:
            await self._fence(e)
            return {REFUSED: pickle.dumps(self._refusal())}
        except (ValueError, TypeError, LedgerError) as e:
            # the client's own input (a refused job, a bad spec, an unknown job): its error,
            # not a traceback in the scheduler's log (dask logs what an RPC handler raises)
            logger.info("daskjobs jobs: %s refused: %s", op, e)
            return {REFUSED: pickle.dumps(e)}
        except sa.exc.SQLAlchemyError as e:
            # never the database's own error and SQL text: one line naming the ledger
            logger.warning("daskjobs jobs: %s failed in the ledger: %s", op, reason(e))
            error = LedgerError(f"daskjobs ledger {_safe(self.url)}: {op} failed: {reason(e)}")
            return {REFUSED: pickle.dumps(error)}
        if op in ("submit", "retry", "cancel") and self._wake is not None:
            self._dirty = True
            if op == "cancel":  # release its attempts' tasks at once: a full pass
                self._next_full = 0.0
            now = time.monotonic()
            if not self._soon and now - self._kicked >= SUBMIT_WINDOW:
                # the first request in a while: its start pass at once
                self._kicked = now
                self._wake.set()
            elif not self._soon:
                # a start pass in a moment: a burst of submissions shares one (each
                # submission waits for the ledger's thread, which a pass per job would hold)
                self._soon = True
                asyncio.get_running_loop().call_later(SUBMIT_WINDOW, self._wake_soon)
        return result

    def _decide_team(self, comm: Any, kw: dict[str, Any]) -> dict[str, Any]:
        """``kw`` of a submission with its job's team decided: the team it names, else its
        client's (``client_id``: the submitting client's id), as the scheduler's daskjobs plugin
        sees it (teams bound to certificates: the request's connection decides, and a job
        naming another team is refused: :meth:`ClientTeams.job_team
        <daskjobs.plugin.identity.ClientTeams.job_team>`); ``by``: the identity that
        submitted it."""
        kw = dict(kw)
        client = kw.pop("client_id", None)
        spec = dict(kw["spec"])
        teams = getattr(self.scheduler.plugins.get("daskjobs"), "identities", None)
        names = peer_names(comm)
        if teams is not None:
            name = str(spec.get("name"))
            spec["team"] = teams.job_team(client, names, spec.get("team"), name)
            identity = teams.whose(names)[0]
        else:
            identity = names[0] if names else None
        if spec.get("team") is None:
            from daskjobs.jobs.ledger.jobs import _default_team

            spec["team"] = _default_team()
        kw["spec"] = spec
        kw["by"] = identity
        return kw

    def _wake_soon(self) -> None:
        self._soon = False
        self._kicked = time.monotonic()
        if self._wake is not None:
            self._wake.set()

    def _with_ledger(self, fn: Any, kw: dict[str, Any]) -> Any:
        if self.ledger is None:
            self.ledger = Ledger(self.url)
        return fn(self.ledger, **kw)

    def _op_submit(
        self,
        ledger: Ledger,
        spec: dict[str, Any],
        function: bytes | None = None,
        attach: list[Any] | None = None,
        by: str | None = None,
    ) -> Any:
        self._admit(spec, function, attach)
        job = JobSpec.from_json(spec)  # every field checked, before anything is stored
        limit = self.settings.admission.job_parts
        if limit is not None and job.parts > limit:
            raise over_limit(
                f"job {job.name!r}'s parts",
                job.parts,
                "daskjobs.admission.job-parts",
                limit,
                "parts",
                "Submit it as several jobs of fewer parts, or ask the operator to raise the limit.",
            )
        if attach is not None:
            # a submitted sweep's pickle (daskjobs.jobs.sweeps), under a key naming its
            # content: the first one of that content is kept
            key, blob = str(attach[0]), bytes(attach[1])
            if not key.startswith("daskjobs-sweep-") or len(key) > 80:
                raise ValueError(f"daskjobs jobs: cannot attach {key!r}")
            store = ResultStore(self.store_url)
            if not store.contains(key):
                store.put(key, blob, stage="daskjobs-sweep")
        if function is not None:
            # kept as the pickled bytes: unpickled by the worker that runs it, never here
            key = "daskjobs-fn-" + hashlib.blake2b(function, digest_size=16).hexdigest()
            store = ResultStore(self.store_url)
            if not store.contains(key):
                store.put(key, bytes(function), stage="daskjobs-function")
            job = JobSpec.from_json({**job.to_json(), "target": f"store:{key}"})
        if not job.target:
            raise ValueError(
                f"daskjobs job {job.name!r}: nothing to run (give a function or "
                "target='module:function')"
            )
        # its attempts will be tasks of its team: a scheduler plugin with strict teams
        # would refuse every one of them; refuse the job now, naming the teams
        plugin = self.scheduler.plugins.get("daskjobs") if self.scheduler is not None else None
        teams = getattr(getattr(plugin, "settings", None), "teams", None)
        if teams is not None and teams.strict and job.team not in teams.targets:
            raise UnknownTeam(
                f"daskjobs job {job.name!r}: team {job.team!r} is not configured on this "
                f"scheduler and teams are strict (daskjobs.teams.targets has: "
                f"{', '.join(sorted(teams.targets)) or 'no teams'})"
            )
        if plugin is not None and hasattr(plugin, "check_submission"):
            # any other refusal of its attempts (a resource request no worker can ever
            # meet): refused now, naming it, rather than each attempt failing in turn
            annotations = {"team": job.team, "job_class": job.job_class, **job.placement()}
            try:
                plugin.check_submission(
                    attempt_key(job.job_id, 0, 0), annotations, dict(job.resources) or None
                )
            except SubmissionRefused as e:
                raise type(e)(f"daskjobs job {job.name!r}: its attempts are refused: {e}") from None
        record = ledger.submit(job, self.epoch, by=by)
        return _job_json(record)

    def _admit(self, spec: Any, function: Any, attach: Any) -> None:
        """The submission's bytes against ``daskjobs.admission.job-bytes`` (its spec as
        JSON, its pickled function, a sweep's pickle), before anything is read from it."""
        limit = self.settings.admission.job_bytes
        if limit is None:
            return
        try:
            size = len(json.dumps(spec, default=str))
        except (TypeError, ValueError, RecursionError):
            size = 0  # not JSON: JobSpec.from_json names the field
        for blob in (function, *(attach or ())[1:2]):
            if isinstance(blob, bytes | bytearray | memoryview):
                size += len(blob)
        if size > limit:
            name = spec.get("name") if isinstance(spec, dict) else None
            raise over_limit(
                f"job {name!r}'s submission (its spec as JSON and its pickled function or sweep)",
                size,
                "daskjobs.admission.job-bytes",
                limit,
                "bytes",
                "Pass large inputs through the store or a file the job reads, not as "
                "parameters or in the function's closure.",
            )

    def _op_job(self, ledger: Ledger, job_id: str) -> Any:
        status = ledger.job_status(job_id)
        return {
            **_job_json(status["job"]),
            "attempts": status["attempts"],
            "outputs": {str(p): loc for p, loc in status["outputs"].items()},
            "missing": status["missing"],
            "store": self.store_url,
        }

    def _op_state(self, ledger: Ledger, job_id: str) -> Any:
        state, reason = ledger.state(job_id)
        return {"state": state, "reason": reason}

    def _op_progress(self, ledger: Ledger, job_id: str) -> Any:
        return ledger.progress(job_id)

    def _op_values(self, ledger: Ledger, job_id: str) -> Any:
        return {str(p): v for p, v in ledger.output_values(job_id).items()}

    def _op_list(self, ledger: Ledger, team: str | None = None, state: str | None = None) -> Any:
        return [_job_json(j) for j in ledger.jobs(team=team, state=state)]

    def _op_cancel(self, ledger: Ledger, job_id: str) -> Any:
        return ledger.cancel(job_id, self.epoch, "cancelled by a client")

    def _op_retry(self, ledger: Ledger, job_id: str) -> Any:
        return ledger.retry(job_id, self.epoch, "retried by a client")

    def _op_history(self, ledger: Ledger, job_id: str) -> Any:
        refs = [job_id, *[a.attempt_id for a in ledger.attempts(job_id)]]
        out = []
        for ref in refs:
            out.extend(ledger.history(ref))
        for p in range(ledger.job(job_id).spec.parts):
            out.extend(ledger.history(f"{job_id}/{p}"))
        return sorted(out, key=lambda h: h["id"])

    def _op_metrics(self, ledger: Ledger) -> Any:
        return ledger.metrics()

    def status(self) -> dict[str, Any]:
        if self.fenced is not None:
            state = "fenced"
        elif self.unreachable_since is not None or self.ledger is None:
            state = "unreachable"
        else:
            state = "serving"
        return {
            "state": state,
            "fenced": dict(self.fenced) if self.fenced is not None else None,
            "ledger": _safe(self.url),
            "store": self.store_url,
            "epoch": self.epoch,
            "reachable": self.unreachable_since is None and self.ledger is not None,
            "unreachable_since": self.unreachable_since,
            "queued_reports": len(self._events),
            "dropped_reports": self.dropped,
            "attempts_here": len(self._attempts),
            "launched": self.launched,
            "ticks": self.ticks,
            "last_error": self.last_error,
        }


_safe = safe_url


def _job_json(j: Any) -> dict[str, Any]:
    return {
        "job_id": j.job_id,
        "spec": j.spec.to_json(),
        "state": j.state,
        "submitted": j.submitted,
        "updated": j.updated,
        "reason": j.reason,
    }
