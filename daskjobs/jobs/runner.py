"""What runs on a worker: one attempt of one part of a job.

The jobs service launches each attempt as a dask task calling :func:`run_attempt`
with an :class:`Order`. On the worker the attempt

1. calls the job's function with an :class:`Attempt` (its part, parameters,
   checkpoints) and writes the value into the result store under a key that names the
   attempt's fencing token;
2. hands the output to the process's **reporter** thread, which **commits** it in the
   ledger with that token (:meth:`Ledger.commit_outputs`): only the part's current
   attempt, still live, may; a late or duplicate attempt's output stays invisible.

The reporter (one thread per worker process) speaks to the ledger for every attempt
the process runs, in one transaction per round: the outputs finished since the last
round (group commit: a thousand short parts cost a few transactions, not a thousand),
the **acknowledgements** of attempts running for ``ACK_AFTER`` seconds or a third of
their lease (``launching`` or ``unknown`` -> ``running``, :meth:`Ledger.ack_many`;
a part that ends sooner is reported by its commit alone), and the **renewals** of
acknowledged attempts' leases every third of the lease. An acknowledgement or a
renewal the ledger refuses (the attempt was lost, cancelled or fenced) sets
:attr:`Attempt.stop_requested`, so a long function that checks it stops early (dask
cannot stop a running thread); its output will be refused.

No worker thread waits for the database: the task returns ``{"state": "committing"}``
once its output is in the store, and the reporter retries what the database could not
take (unreachable, locked) with backoff, each ledger on its own: one out of reach holds
back no other ledger's reports. A process that dies first leaves its attempts to their
leases (they run again; the ledger keeps the output visible once).
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import cloudpickle
import sqlalchemy as sa
from distributed.diagnostics.plugin import WorkerPlugin

from daskjobs.cache.store import ResultStore
from daskjobs.jobs.ledger import Ledger, safe_url
from daskjobs.jobs.model import StaleTransition

__all__ = ["INLINE", "INLINE_LIMIT", "Attempt", "Order", "Prepare", "output_key", "run_attempt"]

logger = logging.getLogger("daskjobs.jobs")

T = TypeVar("T")


@dataclass(frozen=True)
class Order:
    """Everything a worker needs to run one attempt (sent with the launch)."""

    ledger_url: str
    store_url: str
    job_id: str
    part: int
    parts: int
    token: int
    attempt_id: str
    target: str
    params: dict[str, Any] = field(default_factory=dict)
    lease: float = 30.0
    checkpoint_every: float | None = None


#: An output whose pickle is at most this many bytes is kept in the ledger's row itself,
#: committed in the same transaction (a short part then costs no store write); a larger
#: one goes to the store under :func:`output_key`.
INLINE_LIMIT = 64 * 1024
#: The location of an output kept in the ledger: ``"ledger:" + output_key(...)``.
INLINE = "ledger:"


def output_key(job_id: str, part: int, token: int) -> str:
    """The store key of an attempt's output: one per token, so attempts never collide;
    the ledger says which one is visible."""
    return f"daskjobs-job-{job_id}-p{part}-t{token}"


class Attempt:
    """What the job's function gets: ``fn(attempt, **params)``.

    ``part`` (0-based) of ``parts``, ``token`` (the attempt's fencing token),
    ``attempt_id``; :meth:`restore` / :meth:`checkpoint` for resumable work;
    :attr:`stop_requested` once the attempt lost its part."""

    def __init__(self, order: Order, ledger: Ledger, store: ResultStore) -> None:
        self.job_id = order.job_id
        self.part = order.part
        self.parts = order.parts
        self.token = order.token
        self.attempt_id = order.attempt_id
        self.params = dict(order.params)
        self._order = order
        self._ledger = ledger
        self._store = store
        self._stop = threading.Event()
        self._worker = ""
        self._last_checkpoint = time.monotonic()
        self.checkpoints = 0

    @property
    def stop_requested(self) -> bool:
        """True once the ledger refused this attempt's heartbeat (its lease was lost, the
        job cancelled, or a newer attempt took the part): its output will be refused."""
        return self._stop.is_set()

    def checkpoint_due(self) -> bool:
        """Whether ``checkpoint_every`` seconds passed since the last checkpoint (False
        for a job without a checkpoint policy)."""
        every = self._order.checkpoint_every
        return every is not None and time.monotonic() - self._last_checkpoint >= every

    def restore(self) -> Any:
        """The latest committed checkpoint of this part (any earlier attempt's), or None."""
        location = _patient(lambda: self._ledger.checkpoint(self.job_id, self.part))
        return None if location is None else self._store.get(location)

    def checkpoint(self, state: Any) -> None:
        """Save ``state`` and commit it as this part's latest checkpoint, with this
        attempt's token: refused (:class:`StaleTransition`) if the attempt lost its part."""
        self.checkpoints += 1
        key = f"{output_key(self.job_id, self.part, self.token)}-c{self.checkpoints}"
        self._store.put(key, state, stage="daskjobs-checkpoint")
        _patient(lambda: self._ledger.commit_checkpoint(self.job_id, self.part, self.token, key))
        self._last_checkpoint = time.monotonic()


def run_attempt(order: Order, wait: float = 0.0) -> dict[str, Any]:
    """Run one attempt (module docs); a small report: ``state`` (``committing``: the
    output is in the store and its commit with the reporter; with ``wait`` seconds, the
    commit's outcome once known: ``succeeded`` or ``fenced``; ``fenced`` too when a
    checkpoint was refused), ``location`` and ``reason``."""
    ledger = _ledger(order.ledger_url)
    store = _store(order.store_url)
    attempt = Attempt(order, ledger, store)
    attempt._worker = _worker_name()
    reporter = _reporter()
    reporter.add(attempt, ledger, order.lease)
    key = output_key(order.job_id, order.part, order.token)
    handed = False
    try:
        fn = _function(order.target, store)
        value = fn(attempt, **order.params)
        blob = cloudpickle.dumps(value, protocol=5)
        if len(blob) <= INLINE_LIMIT:
            key, data = INLINE + key, blob
        else:
            store.put(key, value, stage="daskjobs-job")
            data = None
        outcome = reporter.commit(attempt, key, data)
        handed = True
    except StaleTransition as e:  # a checkpoint on the way was refused
        attempt._stop.set()
        logger.info("daskjobs: %s", e)  # expected after a cancel or a lost lease; recorded
        return {"state": "fenced", "location": key, "reason": str(e)}
    finally:
        if not handed:
            reporter.remove(attempt)
    if wait > 0 and outcome.wait(wait):
        return {"state": outcome.state, "location": key, "reason": outcome.reason}
    return {"state": "committing", "location": key, "reason": ""}


class Prepare(WorkerPlugin):
    """Readies a worker for attempts when it joins, not when its first attempt arrives.

    The jobs service installs it on every worker (present and future). Unpickling it
    imports this module (the ledger's SQLAlchemy layer, the result store, cloudpickle:
    0.1-0.3 s on a fresh worker process, which a job's first attempts otherwise waited
    for); :meth:`setup` makes the process's ledger object (its database driver imported,
    no connection opened) and store object."""

    name = "daskjobs-jobs-prepare"

    def __init__(self, ledger_url: str, store_url: str) -> None:
        self.ledger_url = ledger_url
        self.store_url = store_url

    def setup(self, worker: Any) -> None:
        try:
            _ledger(self.ledger_url)
            _store(self.store_url)
        except Exception:  # never fatal to a worker: the first attempt will say what fails
            logger.debug("daskjobs: preparing the worker for jobs failed", exc_info=True)


def _ack_many(ledger: Ledger, attempts: list[Attempt]) -> list[bool]:
    """The workers' reports that they run these attempts (a separate function: the
    chaos tests drop it, as a lost launch reply)."""
    return ledger.ack_many(
        [(a.attempt_id, a.token, a._worker) for a in attempts], attempts[0]._order.lease
    )


def _function(target: str, store: ResultStore) -> Callable[..., Any]:
    """:func:`_resolve`, once per process: a job's thousand parts share one function
    (a ``store:`` target is immutable: its key is its content's hash)."""
    key = (store.url, target)
    fn = _functions.get(key)
    if fn is None:
        fn = _functions[key] = _resolve(target, store)
    return fn


_functions: dict[tuple[str, str], Callable[..., Any]] = {}
_stores: dict[str, ResultStore] = {}


def _store(url: str) -> ResultStore:
    """One store object per URL and worker process."""
    store = _stores.get(url)
    if store is None:
        store = _stores[url] = ResultStore(url)
    return store


def _resolve(target: str, store: ResultStore) -> Callable[..., Any]:
    """``module:function`` imported, or ``store:KEY``, a function kept in the store."""
    if target.startswith("store:"):
        fn = cloudpickle.loads(store.get(target[len("store:") :]))
    else:
        module, sep, name = target.partition(":")
        if not sep or not module or not name:
            raise ValueError(f"daskjobs job target {target!r}: expected 'module:function'")
        fn = importlib.import_module(module)
        for attr in name.split("."):
            fn = getattr(fn, attr)
    if not callable(fn):
        raise TypeError(f"daskjobs job target {target!r} is not callable")
    return fn


def _worker_name() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except ValueError:  # not in a worker (a test calling run_attempt directly)
        return f"{socket.gethostname()}:{os.getpid()}"


_ledgers: dict[str, Ledger] = {}
_ledgers_lock = threading.Lock()


def _ledger(url: str) -> Ledger:
    """One ledger (engine, connection pool) per URL and worker process."""
    with _ledgers_lock:
        led = _ledgers.get(url)
        if led is None:
            # a locked SQLite file counts as unreachable after 1s: the heartbeat thread
            # takes over the write and the worker's thread goes back to work
            led = _ledgers[url] = Ledger(url, migrate=False, busy_timeout=1.0)
        return led


#: How long a checkpoint or restore waits for an unreachable database before failing.
PATIENCE = 600.0
#: errors that mean "the database is not reachable now"
UNREACHABLE = (sa.exc.OperationalError, sa.exc.InterfaceError)


def _patient(write: Callable[[], T], patience: float | None = None) -> T:
    """``write()``, retried with backoff while the database is unreachable."""
    deadline = time.monotonic() + (PATIENCE if patience is None else patience)
    delay = 0.05
    while True:
        try:
            return write()
        except UNREACHABLE as e:
            if time.monotonic() + delay > deadline:
                raise
            logger.warning("daskjobs ledger unreachable (%s); retrying in %.1fs", e.orig, delay)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


#: A running attempt is acknowledged once it ran this long (or a third of its lease):
#: parts that end sooner are reported by their commit alone.
ACK_AFTER = 0.5


#: How long the reporter waits after a commit arrives before it writes, so that the
#: parts finishing meanwhile share the transaction (group commit).
LINGER = 0.1
#: The reporter retries a ledger it could not reach after this long, doubling up to
#: ``RETRY_MOST`` while it stays unreachable (a ledger that is back takes a round at most
#: ``RETRY_MOST`` late; one that is gone for good costs a connection attempt that often).
RETRY_FIRST = 0.05
RETRY_MOST = 2.0


class _Outcome:
    """A commit handed to the reporter: ``wait()`` for its ``state``."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self.state = "committing"
        self.reason = ""

    def set(self, state: str, reason: str = "") -> None:
        self.state, self.reason = state, reason
        self._done.set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)


@dataclass(eq=False)
class _Entry:
    attempt: Attempt
    ledger: Ledger
    lease: float
    began: float
    acked: bool = False
    renewed: float = 0.0
    output: str | None = None  # the location whose commit is pending
    value: bytes | None = None  # the output itself, if kept in the ledger
    outcome: _Outcome | None = None


class _Reporter:
    """One thread per worker process: acknowledgements, renewals and commits of the
    attempts it runs, in one transaction per ledger and round (module docs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        # id(ledger) -> (when its next round may try it, the delay after that): a ledger
        # the last round could not reach, retried with backoff, the others unaffected
        self._backoff: dict[int, tuple[float, float]] = {}

    def add(self, attempt: Attempt, ledger: Ledger, lease: float) -> None:
        with self._lock:
            self._entries[attempt.attempt_id] = _Entry(attempt, ledger, lease, time.monotonic())
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="daskjobs-reporter", daemon=True
                )
                self._thread.start()

    def commit(self, attempt: Attempt, key: str, value: bytes | None = None) -> _Outcome:
        outcome = _Outcome()
        with self._lock:
            entry = self._entries[attempt.attempt_id]
            entry.output, entry.value, entry.outcome = key, value, outcome
        self._wake.set()
        return outcome

    def remove(self, attempt: Attempt) -> None:
        with self._lock:
            self._entries.pop(attempt.attempt_id, None)

    def _run(self) -> None:
        while True:
            if self._wake.wait(self._next_due()):
                # a commit came: let the parts finishing meanwhile join its transaction
                time.sleep(LINGER)
            self._wake.clear()
            try:
                self.round()
            except Exception:  # never let the thread die: the next round tries again
                logger.exception("daskjobs reporter")

    def _next_due(self) -> float:
        now = time.monotonic()
        due = 1.0
        with self._lock:
            for e in self._entries.values():
                retry = self._backoff.get(id(e.ledger))
                if retry is not None:  # unreachable: its next try
                    due = min(due, retry[0] - now)
                elif e.output is not None:
                    return 0.05  # a commit the database did not take yet
                elif e.acked:
                    due = min(due, e.renewed + e.lease / 3 - now)
                else:
                    due = min(due, e.began + min(ACK_AFTER, e.lease / 3) - now)
        return max(0.005, due)

    def round(self) -> None:
        """One round: every ledger's due commits, acknowledgements and renewals.

        Each ledger on its own: one that cannot be reached (down, locked, or its database
        gone while an attempt of it still ran) is retried with backoff (``RETRY_FIRST``
        doubling to ``RETRY_MOST``) while the attempts of every other ledger this process
        runs are reported as usual."""
        now = time.monotonic()
        with self._lock:
            entries = list(self._entries.values())
        by_ledger: dict[int, list[_Entry]] = {}
        for e in entries:
            by_ledger.setdefault(id(e.ledger), []).append(e)
        for key in [k for k in self._backoff if k not in by_ledger]:
            del self._backoff[key]  # its attempts are gone
        for key, group in by_ledger.items():
            retry = self._backoff.get(key)
            if retry is not None and now < retry[0]:
                continue
            ledger = group[0].ledger
            try:
                self._report(ledger, group, now)
            except UNREACHABLE as err:  # keep working; a later round tries again
                if retry is None:
                    logger.warning(
                        "daskjobs reporter: ledger %s unreachable (%s); %d attempt(s) report "
                        "when it is back",
                        safe_url(ledger.url),
                        getattr(err, "orig", err),
                        len(group),
                    )
                delay = RETRY_FIRST if retry is None else min(retry[1] * 2, RETRY_MOST)
                self._backoff[key] = (time.monotonic() + delay, delay)
                continue
            if retry is not None:
                del self._backoff[key]
                logger.warning("daskjobs reporter: ledger %s reachable again", safe_url(ledger.url))

    def _report(self, ledger: Ledger, group: list[_Entry], now: float) -> None:
        commits = [e for e in group if e.output is not None]
        if commits:
            results = ledger.commit_outputs(
                [
                    (e.attempt.job_id, e.attempt.part, e.attempt.token, e.output or "")
                    for e in commits
                ],
                values=[e.value for e in commits],
                workers=[e.attempt._worker or None for e in commits],
            )
            for e, r in zip(commits, results, strict=True):
                assert e.outcome is not None
                if isinstance(r, StaleTransition):
                    logger.info("daskjobs: %s", r)  # after a cancel or a lost lease; recorded
                    e.attempt._stop.set()
                    e.outcome.set("fenced", str(r))
                else:
                    e.outcome.set("succeeded")
                self.remove(e.attempt)
        pending = [e for e in group if e.output is None and not e.attempt.stop_requested]
        acks = [e for e in pending if not e.acked and now - e.began >= min(ACK_AFTER, e.lease / 3)]
        if acks:
            for e, ok in zip(acks, _ack_many(ledger, [e.attempt for e in acks]), strict=True):
                e.acked, e.renewed = True, now
                if not ok:
                    self._stop(e, "its acknowledgement was refused")
        acked_now = {id(e) for e in acks}
        renew = [
            e
            for e in pending
            if e.acked and id(e) not in acked_now and now - e.renewed >= e.lease / 3
        ]
        if renew:
            lease = min(e.lease for e in renew)
            for e, ok in zip(
                renew,
                ledger.renew_each([(e.attempt.attempt_id, e.attempt.token) for e in renew], lease),
                strict=True,
            ):
                e.renewed = now
                if not ok and e.output is None:
                    self._stop(e, "its lease was refused")

    def _stop(self, e: _Entry, why: str) -> None:
        a = e.attempt
        logger.info(
            "daskjobs: attempt %s of %s part %d lost its part (%s); stop requested",
            a.attempt_id,
            a.job_id,
            a.part,
            why,
        )
        a._stop.set()


_reporter_: _Reporter | None = None


def _reporter() -> _Reporter:
    global _reporter_
    with _ledgers_lock:
        if _reporter_ is None:
            _reporter_ = _Reporter()
        return _reporter_
