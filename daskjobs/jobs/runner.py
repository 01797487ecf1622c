"""What runs on a worker: one attempt of one part of a job.

The jobs service launches each attempt as a dask task calling :func:`run_attempt`
with an :class:`Order`. On the worker the attempt

1. **acknowledges** it in the ledger (``launching`` or ``unknown`` -> ``running``,
   :meth:`Ledger.ack`); an attempt the ledger no longer lets run (lost, cancelled,
   fenced) does not start;
2. is **renewed** by the process's heartbeat thread (one per worker process, every third
   of the lease); a renewal the ledger refuses sets :attr:`Attempt.stop_requested`, so a
   long function that checks it stops early (dask cannot stop a running thread);
3. calls the job's function with an :class:`Attempt` (its part, parameters,
   checkpoints) and writes the value into the result store under a key that names the
   attempt's fencing token;
4. **commits** it in the ledger with that token (:meth:`Ledger.commit_output`): only the
   part's current attempt, still live, may; a late or duplicate attempt's output stays
   invisible and the task returns ``{"state": "fenced", ...}``.

Ledger writes from the worker retry while the database is unreachable (a blip must
not lose a finished result), up to ``patience`` seconds.
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

from daskjobs.cache.store import ResultStore
from daskjobs.jobs.ledger import Ledger
from daskjobs.jobs.model import StaleTransition

__all__ = ["Attempt", "Order", "output_key", "run_attempt"]

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
        self._committing = False
        self._acked = False
        self._worker = ""
        self._pending: str | None = None  # an output key whose commit the thread retries
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


def run_attempt(order: Order) -> dict[str, Any]:
    """Run one attempt (module docs); a small report: ``state`` (``succeeded``,
    ``fenced``, ``refused``, or ``committing``: the database was unreachable, the
    process's heartbeat thread commits when it is back), ``location`` and ``reason``.

    No worker thread waits for the database: an acknowledgement or a commit that cannot
    reach it is left to the heartbeat thread, which retries it with the renewals (the
    token still fences it)."""
    ledger = _ledger(order.ledger_url)
    store = ResultStore(order.store_url)
    worker = _worker_name()
    attempt = Attempt(order, ledger, store)
    try:
        if not _ack(ledger, order, worker):
            return {"state": "refused", "reason": "the ledger no longer lets this attempt run"}
        attempt._acked = True
    except UNREACHABLE as e:
        logger.warning(
            "daskjobs: ledger unreachable at the start of %s (%s); running it",
            order.attempt_id,
            getattr(e, "orig", e),
        )
    attempt._worker = worker
    beats = _heartbeats()
    beats.add(attempt, ledger, order.lease)
    key = output_key(order.job_id, order.part, order.token)
    handed = False
    try:
        fn = _resolve(order.target, store)
        value = fn(attempt, **order.params)
        store.put(key, value, stage="daskjobs-job")
        attempt._committing = True  # a renewal refused from here on is the commit's doing
        try:
            ledger.commit_output(order.job_id, order.part, order.token, key)
        except UNREACHABLE as e:
            logger.warning(
                "daskjobs: ledger unreachable at the commit of %s (%s); the "
                "heartbeat thread commits it when it is back",
                order.attempt_id,
                getattr(e, "orig", e),
            )
            attempt._pending = key
            handed = True
            return {"state": "committing", "location": key, "reason": str(getattr(e, "orig", e))}
    except StaleTransition as e:  # its commit, or a checkpoint on the way, was refused
        attempt._stop.set()
        logger.info("daskjobs: %s", e)  # expected after a cancel or a lost lease; recorded
        return {"state": "fenced", "location": key, "reason": str(e)}
    finally:
        if not handed:
            beats.remove(attempt)
    return {"state": "succeeded", "location": key, "reason": ""}


def _ack(ledger: Ledger, order: Order, worker: str) -> bool:
    """The worker's report that it runs the attempt (a separate function: the chaos
    tests drop it, as a lost launch reply)."""
    return ledger.ack(order.attempt_id, order.token, worker, order.lease)


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


class _Heartbeats:
    """One thread per worker process renewing the leases of the attempts it runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._attempts: dict[str, tuple[Attempt, Ledger, float]] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, attempt: Attempt, ledger: Ledger, lease: float) -> None:
        with self._lock:
            self._attempts[attempt.attempt_id] = (attempt, ledger, lease)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="daskjobs-heartbeats", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def remove(self, attempt: Attempt) -> None:
        with self._lock:
            self._attempts.pop(attempt.attempt_id, None)

    def _run(self) -> None:
        while True:
            with self._lock:
                current = list(self._attempts.values())
            if not current:
                period = 1.0
            else:
                period = max(0.01, min(lease for _, _, lease in current) / 3)
            self._wake.wait(period)
            self._wake.clear()
            for attempt, ledger, lease in current:
                try:
                    self._beat(attempt, ledger, lease)
                except UNREACHABLE as e:  # keep working; try again at the next beat
                    logger.warning(
                        "daskjobs heartbeat of %s: ledger unreachable (%s)",
                        attempt.attempt_id,
                        getattr(e, "orig", e),
                    )
                except Exception:
                    logger.exception("daskjobs heartbeat of %s", attempt.attempt_id)

    def _beat(self, attempt: Attempt, ledger: Ledger, lease: float) -> None:
        if attempt.stop_requested:
            self.remove(attempt)
            return
        if not attempt._acked:
            if not _ack(ledger, attempt._order, attempt._worker):
                attempt._stop.set()
                return
            attempt._acked = True
        if attempt._pending is not None:
            try:
                ledger.commit_output(attempt.job_id, attempt.part, attempt.token, attempt._pending)
            except StaleTransition as e:
                logger.info("daskjobs: %s", e)
                attempt._stop.set()
            self.remove(attempt)
            return
        if not ledger.renew(attempt.attempt_id, attempt.token, lease) and not attempt._committing:
            logger.info(
                "daskjobs: attempt %s of %s part %d lost its part; stop requested",
                attempt.attempt_id,
                attempt.job_id,
                attempt.part,
            )
            attempt._stop.set()


_beats: _Heartbeats | None = None


def _heartbeats() -> _Heartbeats:
    global _beats
    with _ledgers_lock:
        if _beats is None:
            _beats = _Heartbeats()
        return _beats
