"""The jobs ledger: durable job and attempt state that outlives the scheduler process.

dask keeps every task's state in the scheduler's memory; when that process dies,
every job, attempt and decision dies with it. The ledger keeps jobs, their parts,
attempts, committed outputs and every transition in a database through SQLAlchemy
2 Core: an SQLite file by default (embedded, nothing to run; ``sqlite:///path``),
PostgreSQL for a shared deployment (``postgresql+psycopg://user@host/db``).

Every change is a **conditional update** applied once: ``UPDATE ... WHERE state =
:expected`` (and, for an attempt, ``AND token = :token``). A change that already
happened is a no-op (idempotent: a retried write after a timeout does no harm); a
change whose precondition no longer holds raises :class:`StaleTransition` naming
what was found. Three guards make a result visible at most once:

* **fencing tokens** - each attempt of a part gets the part's next token; an output
  is committed only with the part's current token, once per part
  (:meth:`Ledger.commit_output`);
* **leases** - a running attempt holds a lease renewed by its heartbeats; one whose
  lease expired is marked ``lost`` (:meth:`Ledger.expire`) and its token is stale as
  soon as the next attempt starts;
* **scheduler epochs** - a scheduler takes the next epoch when it starts on a ledger
  (:meth:`Ledger.acquire_epoch`); every write names the writer's epoch and is refused
  (:class:`Fenced`) if a newer scheduler took over.

The schema is versioned (``meta.schema_version``) and brought up to date by
:meth:`Ledger.migrate`, one numbered step at a time.

Costs: each call is one short transaction (a handful of statements on indexed
keys). On SQLite, write transactions begin ``IMMEDIATE`` (writers queue on the file
lock instead of failing mid-transaction) in WAL mode; on PostgreSQL a write takes a
shared lock on the epoch row (an epoch change takes it exclusively), so writes run
concurrently and a takeover waits for them.

Layout: :mod:`~daskjobs.jobs.ledger.schema` (tables and migrations),
:mod:`~daskjobs.jobs.ledger.backends` (SQLite and PostgreSQL engines),
:mod:`~daskjobs.jobs.ledger.rows` (set-based statements, rows as records),
:mod:`~daskjobs.jobs.ledger.core` (the write path, epochs, the transition log), then one
module per concern that :class:`Ledger` is composed of: jobs
(:mod:`~daskjobs.jobs.ledger.jobs`), attempts and leases
(:mod:`~daskjobs.jobs.ledger.attempts`), outputs and fencing
(:mod:`~daskjobs.jobs.ledger.outputs`), queries and metrics
(:mod:`~daskjobs.jobs.ledger.queries`). The bases share no method name: their order only
orders the generated reference (the last base's methods first).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from daskjobs.jobs.ledger.attempts import AttemptMoves
from daskjobs.jobs.ledger.backends import _check_exists, _engine, default_url, reason, safe_url
from daskjobs.jobs.ledger.errors import Fenced, LedgerError
from daskjobs.jobs.ledger.jobs import JobMoves
from daskjobs.jobs.ledger.outputs import OutputCommits
from daskjobs.jobs.ledger.queries import LedgerQueries
from daskjobs.jobs.ledger.schema import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "Fenced", "Ledger", "LedgerError"]


class Ledger(LedgerQueries, OutputCommits, AttemptMoves, JobMoves):
    """Jobs, parts, attempts, outputs and transitions in a database (module docs).

    ``url`` is an SQLAlchemy URL (``sqlite:///path`` or ``postgresql+psycopg://...``);
    ``clock`` gives the time (seconds since the epoch; tests pass their own);
    ``migrate=False`` leaves the schema alone (a writer then refuses to write to an
    out-of-date one); ``busy_timeout`` is how long an SQLite writer waits for another's
    lock before the database counts as unreachable (workers wait less than the service,
    so that their threads go back to work).

    ``create=False`` opens an existing ledger only: no file or directory is made, and a
    database without the ledger's schema is refused (:class:`LedgerError`, one line
    naming the URL and what is wrong); ``read_only=True`` also opens it for reading
    only (SQLite's ``mode=ro``, PostgreSQL's read-only transactions). The command
    line's ``ls`` and ``show`` open a ledger both ways.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        clock: Callable[[], float] = time.time,
        migrate: bool = True,
        busy_timeout: float = 30.0,
        create: bool = True,
        read_only: bool = False,
    ) -> None:
        self.url = url or default_url()
        self.clock = clock
        if not create:
            migrate = False
            _check_exists(self.url)
        try:
            self.engine: Engine = _engine(self.url, busy_timeout, create, read_only)
        except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ImportError) as e:
            raise LedgerError(
                f"daskjobs ledger: cannot use {self.url!r}: {e} (expected sqlite:///PATH or "
                "postgresql+psycopg://USER@HOST/DB)"
            ) from e
        except OSError as e:  # the directory of an SQLite file cannot be made
            raise LedgerError(
                f"daskjobs ledger {safe_url(self.url)}: cannot make its directory: {reason(e)}"
            ) from e
        self._ready = False
        self._waited = 0.0
        if migrate:
            self.migrate()
        elif not create:
            try:
                version = self.version()
            except sa.exc.SQLAlchemyError as e:
                self.engine.dispose()
                raise LedgerError(f"daskjobs ledger {safe_url(self.url)}: {reason(e)}") from e
            if version == 0:
                self.engine.dispose()
                raise LedgerError(
                    f"daskjobs ledger {safe_url(self.url)}: not a daskjobs ledger (no schema); "
                    "`daskjobs ledger migrate --ledger URL` creates one there"
                )

    def close(self) -> None:
        self.engine.dispose()
