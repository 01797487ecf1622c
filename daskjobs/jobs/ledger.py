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
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import pathlib
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from daskjobs.jobs.model import (
    ATTEMPT_MOVES,
    ATTEMPT_STATES,
    JOB_MOVES,
    LIVE_ATTEMPTS,
    AttemptRecord,
    JobRecord,
    JobSpec,
    StaleTransition,
)

__all__ = ["SCHEMA_VERSION", "Fenced", "Ledger", "LedgerError"]

#: The schema this code writes; :meth:`Ledger.migrate` brings older ledgers up to it.
SCHEMA_VERSION = 2


class LedgerError(RuntimeError):
    """The ledger cannot do what was asked (a bad URL, a newer schema, an unknown job)."""


class Fenced(LedgerError):
    """A newer scheduler took over this ledger: the writer's epoch is stale."""

    def __init__(self, epoch: int, current: int) -> None:
        self.epoch = epoch
        self.current = current
        super().__init__(
            f"the ledger's scheduler epoch is {current}, this writer holds {epoch}: "
            "a newer scheduler took over, so this one may no longer write"
        )


_md = sa.MetaData()
meta_t = sa.Table(
    "daskjobs_meta",
    _md,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)
jobs_t = sa.Table(
    "daskjobs_jobs",
    _md,
    sa.Column("job_id", sa.String(255), primary_key=True),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("team", sa.String(200), nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("spec", sa.Text, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("submitted", sa.Float, nullable=False),
    sa.Column("updated", sa.Float, nullable=False),
    sa.Column("reason", sa.Text),
    # failed attempts that end before this time do not count against the retries
    sa.Column("retried", sa.Float, nullable=False, server_default="0"),
    sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
    # (version 2) the job's parts, and how many are committed: a commit knows at once
    # whether it was the last (counting a job's outputs per commit is quadratic)
    sa.Column("parts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("committed", sa.Integer, nullable=False, server_default="0"),
)
parts_t = sa.Table(
    "daskjobs_parts",
    _md,
    sa.Column("job_id", sa.String(255), primary_key=True),
    sa.Column("part", sa.Integer, primary_key=True),
    sa.Column("token", sa.Integer, nullable=False),  # the latest attempt's token (0: none yet)
    # the latest checkpoint committed by an attempt holding the part (a training job's)
    sa.Column("checkpoint", sa.Text),
    sa.Column("checkpoint_token", sa.Integer),
)
attempts_t = sa.Table(
    "daskjobs_attempts",
    _md,
    sa.Column("attempt_id", sa.String(64), primary_key=True),
    sa.Column("job_id", sa.String(255), nullable=False, index=True),
    sa.Column("part", sa.Integer, nullable=False),
    sa.Column("token", sa.Integer, nullable=False),
    sa.Column("state", sa.String(16), nullable=False, index=True),
    sa.Column("worker", sa.String(255)),
    sa.Column("lease_until", sa.Float),
    sa.Column("started", sa.Float, nullable=False),
    sa.Column("updated", sa.Float, nullable=False),
    sa.Column("epoch", sa.Integer, nullable=False),
    sa.Column("reason", sa.Text),
)
outputs_t = sa.Table(
    "daskjobs_outputs",
    _md,
    sa.Column("job_id", sa.String(255), primary_key=True),
    sa.Column("part", sa.Integer, primary_key=True),
    sa.Column("token", sa.Integer, nullable=False),
    sa.Column("location", sa.Text, nullable=False),
    sa.Column("committed", sa.Float, nullable=False),
    # (version 2) a small output kept in the ledger itself: its pickle; None when the
    # output is in the store at ``location``
    sa.Column("value", sa.LargeBinary),
)
transitions_t = sa.Table(
    "daskjobs_transitions",
    _md,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),  # job | attempt | output | epoch
    sa.Column("ref", sa.String(255), nullable=False, index=True),
    sa.Column("from_state", sa.String(16)),
    sa.Column("to_state", sa.String(16)),
    sa.Column("reason", sa.Text),
    sa.Column("epoch", sa.Integer, nullable=False),
)

#: The index of a part's attempts (version 2): ``runnable`` asks, for each part, whether
#: it has a live attempt, and a commit finds the attempt holding a token; on the job's
#: index alone each is a scan of the job's attempts (quadratic in a job's parts).
_attempts_by_part = sa.Index(
    "ix_daskjobs_attempts_part", attempts_t.c.job_id, attempts_t.c.part, attempts_t.c.token
)


def _first_schema(conn: Connection) -> None:
    # (a table is created with the indexes declared on it: a new ledger gets version 2's
    # index here already, and step 1 -> 2 finds it there)
    _md.create_all(conn, tables=[meta_t, jobs_t, parts_t, attempts_t, outputs_t, transitions_t])


def _second_schema(conn: Connection) -> None:
    _attempts_by_part.create(conn, checkfirst=True)
    inspect = sa.inspect(conn)
    if "value" not in {c["name"] for c in inspect.get_columns(outputs_t.name)}:
        kind = "BYTEA" if conn.dialect.name == "postgresql" else "BLOB"
        conn.exec_driver_sql(f"ALTER TABLE {outputs_t.name} ADD COLUMN value {kind}")
    if "committed" not in {c["name"] for c in inspect.get_columns(jobs_t.name)}:
        for column in ("parts", "committed"):
            conn.exec_driver_sql(
                f"ALTER TABLE {jobs_t.name} ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0"
            )
        conn.execute(
            jobs_t.update().values(
                parts=sa.select(sa.func.count())
                .select_from(parts_t)
                .where(parts_t.c.job_id == jobs_t.c.job_id)
                .scalar_subquery(),
                committed=sa.select(sa.func.count())
                .select_from(outputs_t)
                .where(outputs_t.c.job_id == jobs_t.c.job_id)
                .scalar_subquery(),
            )
        )


#: Numbered schema steps: ``MIGRATIONS[n]`` brings version ``n`` to ``n + 1``.
MIGRATIONS: Sequence[Callable[[Connection], None]] = (
    _first_schema,  # 0 -> 1: the first schema
    _second_schema,  # 1 -> 2: a part's attempts indexed; small outputs kept in the ledger
)


def default_url(store_root: str | os.PathLike[str] = ".daskjobs-cache") -> str:
    """The default ledger: an SQLite file beside the result store."""
    return "sqlite:///" + os.path.abspath(os.path.join(os.fspath(store_root), "ledger.sqlite"))


class Ledger:
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

    # -- schema -----------------------------------------------------------------------
    def version(self) -> int:
        with self.engine.connect() as conn:
            if not sa.inspect(conn).has_table(meta_t.name):
                return 0
            v = conn.execute(
                sa.select(meta_t.c.value).where(meta_t.c.key == "schema_version")
            ).scalar()
            return int(v) if v is not None else 0

    def migrate(self) -> int:
        """Bring the schema up to :data:`SCHEMA_VERSION`, one step at a time (each in its
        own transaction); a ledger written by a newer daskjobs is refused. The version."""
        current = self.version()
        if current > SCHEMA_VERSION:
            raise LedgerError(
                f"daskjobs ledger {self.url}: schema version {current} is newer than this "
                f"daskjobs understands ({SCHEMA_VERSION}); upgrade daskjobs"
            )
        while current < SCHEMA_VERSION:
            with self.engine.connect() as conn, conn.execution_options(daskjobs_write=True).begin():
                MIGRATIONS[current](conn)
                current += 1
                _put_meta(conn, "schema_version", str(current))
                if current == 1:
                    _put_meta(conn, "epoch", "0")
        self._ready = True
        return current

    # -- schedulers ---------------------------------------------------------------------
    def epoch(self) -> int:
        with self.engine.connect() as conn:
            return _epoch(conn)

    def touch(self, epoch: int) -> float:
        """Record that the scheduler holding ``epoch`` is alive (``meta.service_seen``);
        how long the write took (the jobs service's probe of the database)."""
        began = time.monotonic()
        with self._write(epoch) as conn:
            _put_meta(conn, "service_seen", repr(self.clock()))
        return time.monotonic() - began

    def acquire_epoch(self, owner: str = "") -> int:
        """Take the next scheduler epoch: every writer holding an older one is fenced."""
        with self._write() as conn:
            new = _epoch(conn, exclusive=True) + 1
            conn.execute(meta_t.update().where(meta_t.c.key == "epoch").values(value=str(new)))
            self._log(conn, "epoch", owner or "scheduler", None, str(new), "took over", new)
            return new

    # -- jobs -----------------------------------------------------------------------------
    def submit(self, spec: JobSpec, epoch: int | None) -> JobRecord:
        """Record ``spec`` as a queued job, or return the job already recorded under its
        identity (submitting the same job twice is one job)."""
        now = self.clock()
        job_id = spec.job_id
        with self._write(epoch) as conn:
            row = conn.execute(sa.select(jobs_t).where(jobs_t.c.job_id == job_id)).first()
            if row is None:
                conn.execute(
                    jobs_t.insert().values(
                        job_id=job_id,
                        name=spec.name,
                        team=spec.team,
                        kind=spec.kind,
                        priority=spec.priority,
                        spec=json.dumps(spec.to_json(), sort_keys=True),
                        state="queued",
                        submitted=now,
                        updated=now,
                        parts=spec.parts,
                    )
                )
                _insert_many(
                    conn,
                    parts_t,
                    [{"job_id": job_id, "part": p, "token": 0} for p in range(spec.parts)],
                )
                self._log(conn, "job", job_id, None, "queued", "submitted", epoch or 0)
                row = conn.execute(sa.select(jobs_t).where(jobs_t.c.job_id == job_id)).one()
        return _job(row)

    def job(self, job_id: str) -> JobRecord:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(jobs_t).where(jobs_t.c.job_id == job_id)).first()
        if row is None:
            raise LedgerError(f"daskjobs ledger: no job {job_id!r}")
        return _job(row)

    def jobs(self, *, team: str | None = None, state: str | None = None) -> list[JobRecord]:
        q = sa.select(jobs_t).order_by(jobs_t.c.submitted, jobs_t.c.job_id)
        if team is not None:
            q = q.where(jobs_t.c.team == team)
        if state is not None:
            q = q.where(jobs_t.c.state == state)
        with self.engine.connect() as conn:
            return [_job(r) for r in conn.execute(q)]

    def move_job(
        self, job_id: str, expected: str, new: str, epoch: int | None, reason: str = ""
    ) -> bool:
        """``expected -> new``; True if it moved now, False if it was already ``new``
        (idempotent); :class:`StaleTransition` if it is elsewhere."""
        if new not in JOB_MOVES.get(expected, frozenset()):
            raise ValueError(f"a job cannot move from {expected!r} to {new!r}")
        with self._write(epoch) as conn:
            res = conn.execute(
                jobs_t.update()
                .where(jobs_t.c.job_id == job_id, jobs_t.c.state == expected)
                .values(state=new, updated=self.clock(), reason=reason or None)
            )
            if res.rowcount == 1:
                self._log(conn, "job", job_id, expected, new, reason, epoch or 0)
                return True
            current = conn.execute(
                sa.select(jobs_t.c.state).where(jobs_t.c.job_id == job_id)
            ).scalar()
        if current == new:
            return False
        raise StaleTransition(f"job {job_id!r}", expected, current)

    def jobs_running(self, job_ids: Sequence[str], epoch: int) -> list[str]:
        """Queued jobs whose first attempts started -> ``running``, in one transaction
        (a statement per few hundred); those moved."""
        moved: list[str] = []
        if not job_ids:
            return moved
        now = self.clock()
        with self._write(epoch) as conn:
            for chunk in _chunks(list(job_ids)):
                queued = [
                    r.job_id
                    for r in conn.execute(
                        sa.select(jobs_t.c.job_id).where(
                            jobs_t.c.job_id.in_(chunk), jobs_t.c.state == "queued"
                        )
                    )
                ]
                if not queued:
                    continue
                conn.execute(
                    jobs_t.update()
                    .where(jobs_t.c.job_id.in_(queued), jobs_t.c.state == "queued")
                    .values(state="running", updated=now, reason="an attempt started")
                )
                self._log_many(
                    conn,
                    [("job", j, "queued", "running", "an attempt started") for j in queued],
                    epoch,
                )
                moved.extend(queued)
        return moved

    def cancel(self, job_id: str, epoch: int | None = None, reason: str = "cancelled") -> bool:
        """A queued or running job -> ``cancelled`` and its live attempts -> ``cancelled``
        (one transaction; their workers see it at their next heartbeat and their commits
        are refused). False if it had ended already."""
        now = self.clock()
        with self._write(epoch) as conn:
            state = conn.execute(
                sa.select(jobs_t.c.state).where(jobs_t.c.job_id == job_id)
            ).scalar()
            if state is None:
                raise LedgerError(f"daskjobs ledger: no job {job_id!r}")
            if state not in ("queued", "running"):
                return False
            conn.execute(
                jobs_t.update()
                .where(jobs_t.c.job_id == job_id, jobs_t.c.state == state)
                .values(state="cancelled", updated=now, reason=reason)
            )
            self._log(conn, "job", job_id, state, "cancelled", reason, epoch or 0)
            self._end_live(conn, job_id, "cancelled", reason, epoch or 0, now)
        return True

    def retry(self, job_id: str, epoch: int | None = None, reason: str = "retried") -> bool:
        """A failed or cancelled job -> ``queued`` with a fresh budget of retries: its
        missing parts run again. False if it is queued or running already; refused
        (:class:`StaleTransition`) once it succeeded."""
        now = self.clock()
        with self._write(epoch) as conn:
            state = conn.execute(
                sa.select(jobs_t.c.state).where(jobs_t.c.job_id == job_id)
            ).scalar()
            if state is None:
                raise LedgerError(f"daskjobs ledger: no job {job_id!r}")
            if state in ("queued", "running"):
                return False
            if state == "succeeded":
                raise StaleTransition(f"job {job_id!r}", "failed or cancelled", state)
            conn.execute(
                jobs_t.update()
                .where(jobs_t.c.job_id == job_id, jobs_t.c.state == state)
                .values(state="queued", updated=now, reason=reason, retried=now)
            )
            self._log(conn, "job", job_id, state, "queued", reason, epoch or 0)
        return True

    def end_attempt(
        self, attempt_id: str, token: int, new: str, epoch: int | None, reason: str = ""
    ) -> bool:
        """A live attempt (whatever its live state) -> ``new`` (failed, lost, fenced or
        cancelled); False if it had ended already or the token is stale."""
        if new not in ("failed", "lost", "fenced", "cancelled"):
            raise ValueError(f"an attempt ends failed, lost, fenced or cancelled, not {new!r}")
        now = self.clock()
        with self._write(epoch) as conn:
            row = conn.execute(
                sa.select(attempts_t.c.state).where(
                    attempts_t.c.attempt_id == attempt_id, attempts_t.c.token == token
                )
            ).first()
            if row is None or row.state not in LIVE_ATTEMPTS:
                return False
            res = conn.execute(
                attempts_t.update()
                .where(attempts_t.c.attempt_id == attempt_id, attempts_t.c.state == row.state)
                .values(state=new, updated=now, reason=reason or None)
            )
            if res.rowcount == 1:
                self._log(conn, "attempt", attempt_id, row.state, new, reason, epoch or 0)
            return res.rowcount == 1

    def _end_live(
        self, conn: Connection, job_id: str, new: str, reason: str, epoch: int, now: float
    ) -> None:
        rows = conn.execute(
            sa.select(attempts_t.c.attempt_id, attempts_t.c.state)
            .where(attempts_t.c.job_id == job_id, attempts_t.c.state.in_(sorted(LIVE_ATTEMPTS)))
            .order_by(attempts_t.c.attempt_id)  # the order every writer locks attempts in
        ).all()
        for r in rows:
            conn.execute(
                attempts_t.update()
                .where(attempts_t.c.attempt_id == r.attempt_id, attempts_t.c.state == r.state)
                .values(state=new, updated=now, reason=reason)
            )
            self._log(conn, "attempt", r.attempt_id, r.state, new, reason, epoch)

    # -- attempts -------------------------------------------------------------------------
    def start_attempt(
        self,
        job_id: str,
        part: int,
        worker: str | None,
        lease: float,
        epoch: int,
        *,
        state: str = "launching",
    ) -> AttemptRecord:
        """A new attempt of ``part`` with the part's next fencing token and a lease of
        ``lease`` seconds. Refused (:class:`StaleTransition`) while another attempt of
        the part is live (launching, running, or unknown: a launch whose outcome is not
        known is reconciled before a second one starts), or once the part's output is
        committed."""
        if state not in ("launching", "running"):
            raise ValueError(f"an attempt starts launching or running, not {state!r}")
        with self._write(epoch) as conn:
            return self._start(conn, job_id, part, worker, lease, epoch, state, self.clock())

    def start_attempts(
        self, parts: Sequence[tuple[str, int]], lease: float, epoch: int
    ) -> list[AttemptRecord]:
        """:meth:`start_attempt` (launching, no worker yet) for many parts in one
        transaction; a part refused is left out of the result (someone else holds it).
        Set-based: a few statements per few hundred parts, whatever their number."""
        out: list[AttemptRecord] = []
        now = self.clock()
        with self._write(epoch) as conn:
            for chunk in _chunks(list(dict.fromkeys(parts))):
                out.extend(self._start_many(conn, chunk, lease, epoch, now))
        return out

    def _start_many(
        self,
        conn: Connection,
        parts: Sequence[tuple[str, int]],
        lease: float,
        epoch: int,
        now: float,
    ) -> list[AttemptRecord]:
        q = sa.select(parts_t.c.job_id, parts_t.c.part, parts_t.c.token).where(
            _of_parts(parts_t, parts)
        )
        if conn.dialect.name == "postgresql":  # the parts' rows: the lock their writers take
            q = q.order_by(parts_t.c.job_id, parts_t.c.part).with_for_update()
        tokens = {(r.job_id, r.part): r.token for r in conn.execute(q)}
        busy = {
            (r.job_id, r.part)
            for r in conn.execute(
                sa.select(attempts_t.c.job_id, attempts_t.c.part).where(
                    _of_parts(attempts_t, parts),
                    attempts_t.c.state.in_(sorted(LIVE_ATTEMPTS)),
                )
            )
        }
        busy |= {
            (r.job_id, r.part)
            for r in conn.execute(
                sa.select(outputs_t.c.job_id, outputs_t.c.part).where(_of_parts(outputs_t, parts))
            )
        }
        todo = [jp for jp in parts if jp in tokens and jp not in busy]
        if not todo:
            return []
        conn.execute(
            parts_t.update().where(_of_parts(parts_t, todo)).values(token=parts_t.c.token + 1)
        )
        rows = [
            {
                "attempt_id": uuid.uuid4().hex,
                "job_id": job_id,
                "part": part,
                "token": tokens[job_id, part] + 1,
                "state": "launching",
                "worker": None,
                "lease_until": now + lease,
                "started": now,
                "updated": now,
                "epoch": epoch,
                "reason": None,
            }
            for job_id, part in todo
        ]
        _insert_many(conn, attempts_t, rows)
        self._log_many(
            conn,
            [
                (
                    "attempt",
                    r["attempt_id"],
                    None,
                    "launching",
                    f"part {r['part']} token {r['token']}",
                )
                for r in rows
            ],
            epoch,
        )
        return [AttemptRecord(**{k: v for k, v in r.items() if k != "epoch"}) for r in rows]

    def _start(
        self,
        conn: Connection,
        job_id: str,
        part: int,
        worker: str | None,
        lease: float,
        epoch: int,
        state: str,
        now: float,
    ) -> AttemptRecord:
        # the part's row is the lock every writer of the part takes first (on SQLite the
        # transaction already holds the database's write lock): concurrent starts and
        # commits of one part queue here, so the checks below see their writes
        q = sa.select(parts_t.c.token).where(parts_t.c.job_id == job_id, parts_t.c.part == part)
        if conn.dialect.name == "postgresql":
            q = q.with_for_update()
        current = conn.execute(q).scalar()
        if current is None:
            raise LedgerError(f"daskjobs ledger: job {job_id!r} has no part {part}")
        live = conn.execute(
            sa.select(attempts_t.c.attempt_id, attempts_t.c.state).where(
                attempts_t.c.job_id == job_id,
                attempts_t.c.part == part,
                attempts_t.c.state.in_(sorted(LIVE_ATTEMPTS)),
            )
        ).first()
        if live is not None:
            raise StaleTransition(
                f"part {part} of job {job_id!r}",
                "no live attempt",
                live.state,
                f"attempt {live.attempt_id} holds it; reconcile it first",
            )
        done = conn.execute(
            sa.select(outputs_t.c.token).where(
                outputs_t.c.job_id == job_id, outputs_t.c.part == part
            )
        ).first()
        if done is not None:
            raise StaleTransition(f"part {part} of job {job_id!r}", "not committed", "committed")
        token = current + 1
        conn.execute(
            parts_t.update()
            .where(parts_t.c.job_id == job_id, parts_t.c.part == part)
            .values(token=token)
        )
        attempt_id = uuid.uuid4().hex
        values = {
            "attempt_id": attempt_id,
            "job_id": job_id,
            "part": part,
            "token": token,
            "state": state,
            "worker": worker,
            "lease_until": now + lease,
            "started": now,
            "updated": now,
            "epoch": epoch,
            "reason": None,
        }
        conn.execute(attempts_t.insert().values(**values))
        self._log(conn, "attempt", attempt_id, None, state, f"part {part} token {token}", epoch)
        return AttemptRecord(**{k: v for k, v in values.items() if k != "epoch"})

    def move_attempt(
        self,
        attempt_id: str,
        token: int,
        expected: str,
        new: str,
        epoch: int,
        reason: str = "",
        *,
        worker: str | None = None,
    ) -> bool:
        """``expected -> new`` for the attempt holding ``token``; idempotent as
        :meth:`move_job`."""
        if new not in ATTEMPT_MOVES.get(expected, frozenset()):
            raise ValueError(f"an attempt cannot move from {expected!r} to {new!r}")
        values: dict[str, Any] = {"state": new, "updated": self.clock(), "reason": reason or None}
        if worker is not None:
            values["worker"] = worker
        with self._write(epoch) as conn:
            res = conn.execute(
                attempts_t.update()
                .where(
                    attempts_t.c.attempt_id == attempt_id,
                    attempts_t.c.token == token,
                    attempts_t.c.state == expected,
                )
                .values(**values)
            )
            if res.rowcount == 1:
                self._log(conn, "attempt", attempt_id, expected, new, reason, epoch)
                return True
            row = conn.execute(
                sa.select(attempts_t.c.state, attempts_t.c.token).where(
                    attempts_t.c.attempt_id == attempt_id
                )
            ).first()
        if row is not None and row.token == token and row.state == new:
            return False
        raise StaleTransition(
            f"attempt {attempt_id}",
            expected,
            row.state if row is not None else None,
            "" if row is None or row.token == token else f"token {token} is stale",
        )

    def ack(self, attempt_id: str, token: int, worker: str, lease: float) -> bool:
        """A worker reports that it runs the attempt: ``launching`` or ``unknown`` ->
        ``running``, with a fresh lease. True if it moved now or was running already;
        False if the attempt may no longer run (lost, fenced, cancelled, finished, or a
        stale token): the worker should stop it. A worker's write: fenced by its token,
        not by the scheduler's epoch."""
        return self.ack_many([(attempt_id, token, worker)], lease) == [True]

    def ack_many(self, attempts: Sequence[tuple[str, int, str]], lease: float) -> list[bool]:
        """:meth:`ack` for many ``(attempt_id, token, worker)`` in one transaction."""
        if not attempts:
            return []
        now = self.clock()
        out = []
        with self._write() as conn:
            for attempt_id, token, worker in attempts:
                row = conn.execute(
                    sa.select(attempts_t.c.state, attempts_t.c.token).where(
                        attempts_t.c.attempt_id == attempt_id
                    )
                ).first()
                if row is None or row.token != token or row.state not in LIVE_ATTEMPTS:
                    out.append(False)
                    continue
                res = conn.execute(
                    attempts_t.update()
                    .where(
                        attempts_t.c.attempt_id == attempt_id,
                        attempts_t.c.token == token,
                        attempts_t.c.state == row.state,
                    )
                    .values(state="running", worker=worker, lease_until=now + lease, updated=now)
                )
                out.append(res.rowcount == 1)
                if res.rowcount == 1 and row.state != "running":
                    reason = (
                        "worker started it"
                        if row.state == "launching"
                        else "its worker reported it"
                    )
                    self._log(
                        conn, "attempt", attempt_id, row.state, "running", f"{reason} ({worker})", 0
                    )
        return out

    def renew(self, attempt_id: str, token: int, lease: float, epoch: int | None = None) -> bool:
        """Extend a live attempt's lease by ``lease`` seconds from now; False if it is no
        longer live under ``token`` (lost, fenced, cancelled, finished): its owner should
        stop. ``epoch`` None: a worker's heartbeat (fenced by its token)."""
        return self.renew_many([(attempt_id, token)], lease, epoch) == 1

    def renew_many(
        self, attempts: Sequence[tuple[str, int]], lease: float, epoch: int | None = None
    ) -> int:
        """:meth:`renew` for many ``(attempt_id, token)`` in one transaction (a statement
        per few hundred); how many were live and renewed."""
        if not attempts:
            return 0
        now = self.clock()
        renewed = 0
        with self._write(epoch) as conn:
            for chunk in _chunks(list(attempts)):
                res = conn.execute(
                    attempts_t.update()
                    .where(
                        attempts_t.c.attempt_id.in_([a for a, _ in chunk]),  # the index
                        sa.tuple_(attempts_t.c.attempt_id, attempts_t.c.token).in_(chunk),
                        _still_live(),
                    )
                    .values(lease_until=now + lease)
                )
                renewed += res.rowcount
        return renewed

    def renew_each(
        self, attempts: Sequence[tuple[str, int]], lease: float, epoch: int | None = None
    ) -> list[bool]:
        """:meth:`renew_many`, saying for each attempt whether it was renewed."""
        if not attempts:
            return []
        now = self.clock()
        out = []
        with self._write(epoch) as conn:
            for attempt_id, token in attempts:
                res = conn.execute(
                    attempts_t.update()
                    .where(
                        attempts_t.c.attempt_id == attempt_id,
                        attempts_t.c.token == token,
                        attempts_t.c.state.in_(sorted(LIVE_ATTEMPTS)),
                    )
                    .values(lease_until=now + lease)
                )
                out.append(res.rowcount == 1)
        return out

    def expire(
        self, epoch: int, now: float | None = None, *, patience: float | None = None
    ) -> list[AttemptRecord] | None:
        """Mark every live attempt (launching, running, unknown) whose lease ran out
        ``lost``; the attempts marked. Its part may then start again with a higher token.

        With ``patience``: None, and nothing expired, if the write had to wait longer
        than that for the database (locked, slow): nobody could renew meanwhile."""
        asked = time.monotonic()
        with self._write(epoch) as conn:
            if patience is not None and time.monotonic() - asked > patience:
                return None
            now = self.clock() if now is None else now
            rows = conn.execute(
                sa.select(attempts_t)
                .where(
                    attempts_t.c.state.in_(sorted(LIVE_ATTEMPTS)),
                    attempts_t.c.lease_until < now,
                )
                # rows locked in the order a batch of commits locks them (PostgreSQL):
                # an expiry and a commit of the same attempts never wait on each other
                .order_by(attempts_t.c.attempt_id)
            ).all()
            out = []
            for r in rows:
                res = conn.execute(
                    attempts_t.update()
                    .where(
                        attempts_t.c.attempt_id == r.attempt_id,
                        attempts_t.c.state == r.state,
                        attempts_t.c.token == r.token,
                        attempts_t.c.lease_until < now,
                    )
                    .values(state="lost", updated=now, reason="lease expired")
                )
                if res.rowcount == 1:
                    self._log(
                        conn, "attempt", r.attempt_id, r.state, "lost", "lease expired", epoch
                    )
                    out.append(r)
        return [
            dataclasses.replace(_attempt(r), state="lost", updated=now, reason="lease expired")
            for r in out
        ]

    def attempts(self, job_id: str) -> list[AttemptRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(attempts_t)
                .where(attempts_t.c.job_id == job_id)
                .order_by(attempts_t.c.part, attempts_t.c.token)
            ).all()
        return [_attempt(r) for r in rows]

    def job_status(self, job_id: str) -> dict[str, Any]:
        """What :meth:`Job.status` shows, read on one connection: ``job`` (the record),
        ``attempts`` (each as a dict of :class:`AttemptRecord`'s fields but ``job_id``, by
        part and token), ``outputs`` (part -> location) and ``missing`` (parts without a
        committed output). Dicts straight from the rows: a finished job of 10,000 parts is
        read in about half the time :meth:`attempts` and :meth:`missing_parts` take."""
        fields: tuple[str, ...] = ("attempt_id", "part", "token", "state", "worker")
        fields += ("lease_until", "started", "updated", "reason")
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(jobs_t).where(jobs_t.c.job_id == job_id)).first()
            if row is None:
                raise LedgerError(f"daskjobs ledger: no job {job_id!r}")
            attempts = [
                dict(zip(fields, r, strict=True))
                for r in conn.execute(
                    sa.select(*(attempts_t.c[f] for f in fields))
                    .where(attempts_t.c.job_id == job_id)
                    .order_by(attempts_t.c.part, attempts_t.c.token)
                )
            ]
            outputs = {
                r.part: r.location
                for r in conn.execute(
                    sa.select(outputs_t.c.part, outputs_t.c.location).where(
                        outputs_t.c.job_id == job_id
                    )
                )
            }
            missing = list(
                conn.execute(
                    sa.select(parts_t.c.part)
                    .select_from(
                        parts_t.outerjoin(
                            outputs_t,
                            sa.and_(
                                outputs_t.c.job_id == parts_t.c.job_id,
                                outputs_t.c.part == parts_t.c.part,
                            ),
                        )
                    )
                    .where(parts_t.c.job_id == job_id, outputs_t.c.job_id.is_(None))
                    .order_by(parts_t.c.part)
                ).scalars()
            )
        return {"job": _job(row), "attempts": attempts, "outputs": outputs, "missing": missing}

    def analyze(self) -> None:
        """Refresh PostgreSQL's statistics of the attempts, parts and outputs (a no-op on
        SQLite). After a burst of inserts (a job of ten thousand parts starting) the
        planner, still believing the tables empty, chose nested loops that made
        :meth:`runnable` take seconds; autovacuum analyses only a minute or so later."""
        if self.engine.dialect.name != "postgresql":
            return
        with self.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            for t in (attempts_t, parts_t, outputs_t):
                conn.exec_driver_sql(f"ANALYZE {t.name}")

    def live_leases(self) -> dict[str, tuple[str, float | None]]:
        """``attempt_id -> (state, lease_until)`` of every live attempt (what the jobs
        service reads each tick: three columns, no records)."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(
                    attempts_t.c.attempt_id, attempts_t.c.state, attempts_t.c.lease_until
                ).where(attempts_t.c.state.in_(sorted(LIVE_ATTEMPTS)))
            ).all()
        return {r[0]: (r[1], r[2]) for r in rows}

    def live_attempts(self) -> list[AttemptRecord]:
        """Attempts that hold (or may hold) a part: launching, running, unknown."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(attempts_t).where(attempts_t.c.state.in_(sorted(LIVE_ATTEMPTS)))
            ).all()
        return [_attempt(r) for r in rows]

    # -- outputs --------------------------------------------------------------------------
    def commit_output(
        self, job_id: str, part: int, token: int, location: str, epoch: int | None = None
    ) -> bool:
        """Make ``part``'s output at ``location`` visible, once, and mark the attempt
        holding ``token`` succeeded (one transaction). True if this call committed it;
        False if the same token committed it already (a repeated call); refused
        (:class:`StaleTransition`) if ``token`` is not the part's current one (a newer
        attempt exists), its attempt is no longer live (its lease expired: ``lost``; or
        ``fenced``, ``cancelled``), or another attempt's output was committed first.
        When the last part is committed a running job moves to ``succeeded``.

        ``epoch`` is None for a worker's commit (workers are fenced by their token, not by
        the scheduler's epoch)."""
        (result,) = self.commit_outputs([(job_id, part, token, location)], epoch)
        if isinstance(result, StaleTransition):
            raise result
        return result

    def commit_outputs(
        self,
        outputs: Sequence[tuple[str, int, int, str]],
        epoch: int | None = None,
        values: Sequence[bytes | None] | None = None,
        workers: Sequence[str | None] | None = None,
    ) -> list[bool | StaleTransition]:
        """:meth:`commit_output` for many ``(job_id, part, token, location)`` in one
        transaction (a worker process's finished parts, committed together): for each,
        True (committed now), False (committed by this token already) or the
        :class:`StaleTransition` that refused it, recorded in the same transaction. Each
        is decided on its own; a refused one does not hold the others back. ``values``:
        an output kept in the ledger itself (a small one: its pickle), else None.
        ``workers``: the worker that ran each (recorded on its attempt). An attempt that
        ends before its worker acknowledged it (a short part) is recorded as it ran:
        ``launching -> running -> succeeded``, with its worker. Set-based: a few
        statements per few hundred outputs."""
        if not outputs:
            return []
        now = self.clock()
        results: dict[int, bool | StaleTransition] = {}
        finished: collections.Counter[str] = collections.Counter()
        # in (job, part) order: PostgreSQL writers lock part rows in one order, no deadlock
        order = sorted(range(len(outputs)), key=lambda i: (outputs[i][0], outputs[i][1]))
        with self._write(epoch) as conn:
            if conn.dialect.name == "postgresql":
                # lock order on PostgreSQL, as a cancel or a failure takes it: the jobs'
                # rows, then parts, then attempts by id - no two writers wait on each other
                conn.execute(
                    sa.select(jobs_t.c.job_id)
                    .where(jobs_t.c.job_id.in_(sorted({o[0] for o in outputs})))
                    .order_by(jobs_t.c.job_id)
                    .with_for_update()
                ).all()
            for chunk in _chunks(order):
                finished.update(
                    self._commit_many(conn, outputs, values, chunk, epoch, now, results, workers)
                )
            for job_id, count in sorted(finished.items()):
                self._count_committed(conn, job_id, count, epoch, now)
        return [results[i] for i in range(len(outputs))]

    def _commit_many(
        self,
        conn: Connection,
        outputs: Sequence[tuple[str, int, int, str]],
        values: Sequence[bytes | None] | None,
        chunk: Sequence[int],
        epoch: int | None,
        now: float,
        results: dict[int, bool | StaleTransition],
        workers: Sequence[str | None] | None = None,
    ) -> list[str]:
        """One chunk of :meth:`commit_outputs`; the job of each output committed."""
        pg = conn.dialect.name == "postgresql"
        parts = sorted({(outputs[i][0], outputs[i][1]) for i in chunk})
        held = sorted({(outputs[i][0], outputs[i][1], outputs[i][2]) for i in chunk})
        # the parts' rows are the lock every writer of a part takes (start_attempts updates
        # them), so the tokens read here stay current until the commit ends; on SQLite the
        # transaction holds the database's write lock already
        q = sa.select(parts_t.c.job_id, parts_t.c.part, parts_t.c.token).where(
            _of_parts(parts_t, parts)
        )
        if pg:
            q = q.order_by(parts_t.c.job_id, parts_t.c.part).with_for_update()
        current = {(r.job_id, r.part): r.token for r in conn.execute(q)}
        existing = {
            (r.job_id, r.part): r.token
            for r in conn.execute(
                sa.select(outputs_t.c.job_id, outputs_t.c.part, outputs_t.c.token).where(
                    _of_parts(outputs_t, parts)
                )
            )
        }
        hq = sa.select(
            attempts_t.c.attempt_id,
            attempts_t.c.job_id,
            attempts_t.c.part,
            attempts_t.c.token,
            attempts_t.c.state,
        ).where(
            _of_parts(attempts_t, [(j, p) for j, p, _ in held]),
            sa.tuple_(attempts_t.c.part, attempts_t.c.token).in_([(p, t) for _, p, t in held]),
        )
        if pg:  # an expiry waits for this commit (and then finds the attempt succeeded)
            hq = hq.order_by(attempts_t.c.attempt_id).with_for_update()
        holders = {(r.job_id, r.part, r.token): r for r in conn.execute(hq)}
        won: list[tuple[int, Any]] = []
        log: list[tuple[str, str, str | None, str | None, str]] = []
        for i in chunk:
            job_id, part, token, _ = outputs[i]
            what = f"output of part {part} of job {job_id!r}"
            try:
                if (job_id, part) not in current:
                    raise LedgerError(f"daskjobs ledger: job {job_id!r} has no part {part}")
                before = existing.get((job_id, part))
                if before is not None:
                    if before == token:
                        results[i] = False
                        continue
                    raise StaleTransition(
                        what,
                        "not committed",
                        "committed",
                        f"token {before} committed it; token {token} may not",
                    )
                if token != current[job_id, part]:
                    raise StaleTransition(
                        what,
                        f"token {current[job_id, part]}",
                        f"token {token}",
                        "a newer attempt holds the part: this one's output is stale",
                    )
                holder = holders.get((job_id, part, token))
                if holder is None or holder.state not in LIVE_ATTEMPTS:
                    raise StaleTransition(
                        what,
                        "a live attempt",
                        holder.state if holder is not None else None,
                        f"the attempt holding token {token} may no longer commit",
                    )
            except StaleTransition as e:
                log.append(("output", f"{job_id}/{part}", None, "refused", f"token {token}: {e}"))
                results[i] = e
                continue
            existing[job_id, part] = token  # a second item of this part in the batch
            won.append((i, holder))
            worker = workers[i] if workers is not None else None
            before = holder.state
            if before != "running":  # it ran before anyone said so: the step, as it was
                where = f" ({worker})" if worker else ""
                log.append(
                    ("attempt", holder.attempt_id, before, "running", f"worker ran it{where}")
                )
                before = "running"
            log.append(("attempt", holder.attempt_id, before, "succeeded", "output committed"))
            log.append(("output", f"{job_id}/{part}", None, "committed", f"token {token}"))
        if won:
            ids = [h.attempt_id for _, h in won]
            by_worker: dict[str, list[str]] = {}
            for i, h in won:
                w = workers[i] if workers is not None else None
                if w:
                    by_worker.setdefault(w, []).append(h.attempt_id)
            for w, wids in sorted(by_worker.items()):  # the worker that ran it, if unknown
                conn.execute(
                    attempts_t.update()
                    .where(attempts_t.c.attempt_id.in_(wids), attempts_t.c.worker.is_(None))
                    .values(worker=w)
                )
            res = conn.execute(
                attempts_t.update()
                .where(attempts_t.c.attempt_id.in_(ids), _still_live())
                .values(state="succeeded", updated=now, reason="output committed")
            )
            if res.rowcount != len(ids):  # cannot happen under the locks taken above
                raise LedgerError(
                    f"daskjobs ledger: {len(ids) - res.rowcount} attempt(s) moved while "
                    "committing; nothing of this batch was committed"
                )
            _insert_many(
                conn,
                outputs_t,
                [
                    {
                        "job_id": outputs[i][0],
                        "part": outputs[i][1],
                        "token": outputs[i][2],
                        "location": outputs[i][3],
                        "value": None if values is None else values[i],
                        "committed": now,
                    }
                    for i, _ in won
                ],
            )
            for i, _ in won:
                results[i] = True
        # refusals are logged with epoch 0: a worker's write, or a replayed one
        self._log_many(conn, log, epoch or 0, refused_epoch=0)
        return [outputs[i][0] for i, _ in won]

    def _count_committed(
        self, conn: Connection, job_id: str, count: int, epoch: int | None, now: float
    ) -> None:
        """``count`` more of the job's parts committed; a running job whose every part is
        committed -> ``succeeded``."""
        conn.execute(
            jobs_t.update()
            .where(jobs_t.c.job_id == job_id)
            .values(committed=jobs_t.c.committed + count)
        )
        done = conn.execute(
            jobs_t.update()
            .where(
                jobs_t.c.job_id == job_id,
                jobs_t.c.state == "running",
                jobs_t.c.committed >= jobs_t.c.parts,
            )
            .values(state="succeeded", updated=now, reason="every part committed")
        )
        if done.rowcount == 1:
            self._log(
                conn, "job", job_id, "running", "succeeded", "every part committed", epoch or 0
            )

    def commit_checkpoint(self, job_id: str, part: int, token: int, location: str) -> None:
        """Record ``location`` as ``part``'s latest checkpoint, written by the live attempt
        holding ``token``; refused (:class:`StaleTransition`) for any other token, so an
        attempt that lost its part cannot overwrite its successor's checkpoint."""
        what = f"checkpoint of part {part} of job {job_id!r}"
        with self._write() as conn:
            holder = conn.execute(
                sa.select(attempts_t.c.state)
                .select_from(
                    parts_t.join(
                        attempts_t,
                        sa.and_(
                            attempts_t.c.job_id == parts_t.c.job_id,
                            attempts_t.c.part == parts_t.c.part,
                            attempts_t.c.token == parts_t.c.token,
                        ),
                    )
                )
                .where(parts_t.c.job_id == job_id, parts_t.c.part == part, parts_t.c.token == token)
            ).scalar()
            if holder not in LIVE_ATTEMPTS:
                raise StaleTransition(
                    what, "the live attempt holding the part", holder, f"token {token} is stale"
                )
            res = conn.execute(
                parts_t.update()
                .where(parts_t.c.job_id == job_id, parts_t.c.part == part, parts_t.c.token == token)
                .values(checkpoint=location, checkpoint_token=token)
            )
            if res.rowcount != 1:
                raise StaleTransition(what, f"token {token}", None, "a newer attempt took the part")
            self._log(
                conn, "checkpoint", f"{job_id}/{part}", None, "committed", f"token {token}", 0
            )

    def checkpoint(self, job_id: str, part: int) -> str | None:
        """The location of ``part``'s latest committed checkpoint, or None."""
        with self.engine.connect() as conn:
            return conn.execute(
                sa.select(parts_t.c.checkpoint).where(
                    parts_t.c.job_id == job_id, parts_t.c.part == part
                )
            ).scalar()

    def runnable(self, limit: int = 1000) -> list[tuple[JobRecord, int, int]]:
        """Parts of queued and running jobs that need an attempt: no committed output and
        no live attempt. ``(job, part, failures)`` with ``failures`` the part's failed
        attempts since the job's last retry, highest priority and oldest job first.

        Anti-joins and one grouped count, not a subquery per part: PostgreSQL planned the
        correlated form as a scan of the attempts per part (2 s for a job of 10,000)."""
        active = sa.select(jobs_t.c.job_id).where(jobs_t.c.state.in_(("queued", "running")))
        live = (
            sa.select(attempts_t.c.job_id, attempts_t.c.part)
            .where(
                attempts_t.c.state.in_(sorted(LIVE_ATTEMPTS)),
                attempts_t.c.job_id.in_(active),
            )
            .group_by(attempts_t.c.job_id, attempts_t.c.part)
            .subquery("live")
        )
        failed = (
            sa.select(attempts_t.c.job_id, attempts_t.c.part, sa.func.count().label("n"))
            .select_from(attempts_t.join(jobs_t, jobs_t.c.job_id == attempts_t.c.job_id))
            .where(
                attempts_t.c.state == "failed",
                attempts_t.c.updated >= jobs_t.c.retried,
                jobs_t.c.state.in_(("queued", "running")),
            )
            .group_by(attempts_t.c.job_id, attempts_t.c.part)
            .subquery("failed")
        )

        def on(t: Any) -> Any:
            return sa.and_(t.c.job_id == parts_t.c.job_id, t.c.part == parts_t.c.part)

        q = (
            sa.select(jobs_t, parts_t.c.part, sa.func.coalesce(failed.c.n, 0).label("failures"))
            .select_from(
                parts_t.join(jobs_t, jobs_t.c.job_id == parts_t.c.job_id)
                .outerjoin(live, on(live))
                .outerjoin(outputs_t, on(outputs_t))
                .outerjoin(failed, on(failed))
            )
            .where(
                jobs_t.c.state.in_(("queued", "running")),
                live.c.job_id.is_(None),
                outputs_t.c.job_id.is_(None),
            )
            .order_by(jobs_t.c.priority.desc(), jobs_t.c.submitted, jobs_t.c.job_id, parts_t.c.part)
            .limit(limit)
        )
        records: dict[str, JobRecord] = {}  # a job's row read once: its spec parsed once
        out = []
        with self.engine.connect() as conn:
            for r in conn.execute(q):
                job = records.get(r.job_id)
                if job is None:
                    job = records[r.job_id] = _job(r)
                out.append((job, r.part, r.failures))
        return out

    def metrics(self) -> dict[str, dict[str, Any]]:
        """Per team: ``jobs`` and ``attempts`` by state, ``retries`` (attempts beyond the
        first of each part), ``lost`` attempts, of which ``expired`` (their lease ran out),
        ``refused`` commits (fenced: a stale token or an attempt no longer live), and
        ``queue_delay``: the mean from a job's submission to a part's first attempt
        (seconds) over ``queue_delay_count`` parts. Aggregates over the tables: the
        plugin's ``/metrics`` reads them at most every few seconds, in a thread."""
        out: dict[str, dict[str, Any]] = {}

        def team(name: str) -> dict[str, Any]:
            return out.setdefault(
                name,
                {
                    "jobs": {},
                    "attempts": {},
                    "retries": 0,
                    "lost": 0,
                    "expired": 0,
                    "refused": 0,
                    "queue_delay": None,
                    "queue_delay_count": 0,
                },
            )

        with self.engine.connect() as conn:
            for r in conn.execute(
                sa.select(jobs_t.c.team, jobs_t.c.state, sa.func.count()).group_by(
                    jobs_t.c.team, jobs_t.c.state
                )
            ):
                team(r[0])["jobs"][r[1]] = r[2]
            for r in conn.execute(
                sa.select(jobs_t.c.team, attempts_t.c.state, sa.func.count())
                .select_from(attempts_t.join(jobs_t, jobs_t.c.job_id == attempts_t.c.job_id))
                .group_by(jobs_t.c.team, attempts_t.c.state)
            ):
                t = team(r[0])
                t["attempts"][r[1]] = r[2]
                if r[1] == "lost":
                    t["lost"] = r[2]
            for r in conn.execute(
                sa.select(jobs_t.c.team, sa.func.count())
                .select_from(attempts_t.join(jobs_t, jobs_t.c.job_id == attempts_t.c.job_id))
                .where(attempts_t.c.state == "lost", attempts_t.c.reason == "lease expired")
                .group_by(jobs_t.c.team)
            ):
                team(r[0])["expired"] = r[1]
            for r in conn.execute(
                sa.select(jobs_t.c.team, sa.func.count())
                .select_from(attempts_t.join(jobs_t, jobs_t.c.job_id == attempts_t.c.job_id))
                .where(attempts_t.c.token > 1)
                .group_by(jobs_t.c.team)
            ):
                team(r[0])["retries"] = r[1]
            first = (
                sa.select(attempts_t.c.job_id, sa.func.min(attempts_t.c.started).label("first"))
                .group_by(attempts_t.c.job_id, attempts_t.c.part)
                .subquery()
            )
            for r in conn.execute(
                sa.select(
                    jobs_t.c.team,
                    sa.func.avg(first.c.first - jobs_t.c.submitted),
                    sa.func.count(),
                )
                .select_from(first.join(jobs_t, jobs_t.c.job_id == first.c.job_id))
                .group_by(jobs_t.c.team)
            ):
                t = team(r[0])
                t["queue_delay"] = float(r[1]) if r[1] is not None else None
                t["queue_delay_count"] = int(r[2])
            refused = conn.execute(
                sa.select(transitions_t.c.ref).where(
                    transitions_t.c.kind == "output", transitions_t.c.to_state == "refused"
                )
            ).scalars()
            teams = dict(conn.execute(sa.select(jobs_t.c.job_id, jobs_t.c.team)).all())
            for ref in refused:
                name = teams.get(ref.rsplit("/", 1)[0])
                if name is not None:
                    team(name)["refused"] += 1
        return out

    def settle(self, epoch: int | None) -> list[str]:
        """Queued or running jobs whose every part is committed -> ``succeeded`` (a job
        retried or resubmitted after its last part committed); their ids."""
        now = self.clock()
        missing = (
            sa.select(sa.literal(1))
            .select_from(parts_t)
            .where(
                parts_t.c.job_id == jobs_t.c.job_id,
                ~sa.select(sa.literal(1))
                .select_from(outputs_t)
                .where(outputs_t.c.job_id == parts_t.c.job_id, outputs_t.c.part == parts_t.c.part)
                .exists(),
            )
            .exists()
        )
        with self._write(epoch) as conn:
            rows = conn.execute(
                sa.select(jobs_t.c.job_id, jobs_t.c.state).where(
                    jobs_t.c.state.in_(("queued", "running")), ~missing
                )
            ).all()
            for r in rows:
                conn.execute(
                    jobs_t.update()
                    .where(jobs_t.c.job_id == r.job_id, jobs_t.c.state == r.state)
                    .values(state="succeeded", updated=now, reason="every part committed")
                )
                self._log(
                    conn, "job", r.job_id, r.state, "succeeded", "every part committed", epoch or 0
                )
        return [r.job_id for r in rows]

    def fail(self, job_id: str, epoch: int, reason: str) -> bool:
        """A queued or running job -> ``failed`` (a part used up its retries); its live
        attempts are cancelled. False if it had ended already."""
        now = self.clock()
        with self._write(epoch) as conn:
            state = conn.execute(
                sa.select(jobs_t.c.state).where(jobs_t.c.job_id == job_id)
            ).scalar()
            if state not in ("queued", "running"):
                return False
            conn.execute(
                jobs_t.update()
                .where(jobs_t.c.job_id == job_id, jobs_t.c.state == state)
                .values(state="failed", updated=now, reason=reason)
            )
            self._log(conn, "job", job_id, state, "failed", reason, epoch)
            self._end_live(conn, job_id, "cancelled", "its job failed", epoch, now)
        return True

    def outputs(self, job_id: str) -> dict[int, str]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(outputs_t.c.part, outputs_t.c.location).where(
                    outputs_t.c.job_id == job_id
                )
            ).all()
        return {r.part: r.location for r in rows}

    def output_values(self, job_id: str) -> dict[int, bytes]:
        """The outputs of ``job_id`` kept in the ledger itself (small ones: their pickles),
        by part; an output in the store is not here (its location says where it is)."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(outputs_t.c.part, outputs_t.c.value).where(
                    outputs_t.c.job_id == job_id, outputs_t.c.value.is_not(None)
                )
            ).all()
        return {r.part: bytes(r.value) for r in rows}

    def state(self, job_id: str) -> tuple[str, str | None]:
        """A job's state and reason (one row: what a waiting client polls)."""
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(jobs_t.c.state, jobs_t.c.reason).where(jobs_t.c.job_id == job_id)
            ).first()
        if row is None:
            raise LedgerError(f"daskjobs ledger: no job {job_id!r}")
        return row.state, row.reason

    def progress(self, job_id: str) -> dict[str, Any]:
        """How far a job is: ``state``, ``reason``, ``parts``, ``committed`` (parts with a
        visible output) and ``running`` (attempts a worker acknowledged and still runs).
        Two short statements on indexed keys (what :meth:`Job.wait` with ``progress``
        polls)."""
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(
                    jobs_t.c.state, jobs_t.c.reason, jobs_t.c.parts, jobs_t.c.committed
                ).where(jobs_t.c.job_id == job_id)
            ).first()
            if row is None:
                raise LedgerError(f"daskjobs ledger: no job {job_id!r}")
            running = conn.execute(
                sa.select(sa.func.count())
                .select_from(attempts_t)
                .where(attempts_t.c.job_id == job_id, attempts_t.c.state == "running")
            ).scalar()
        return {
            "state": row.state,
            "reason": row.reason,
            "parts": int(row.parts),
            "committed": int(row.committed),
            "running": int(running or 0),
        }

    def missing_parts(self, job_id: str) -> list[int]:
        """Parts of ``job_id`` with no committed output (what a resubmission must run)."""
        with self.engine.connect() as conn:
            parts = conn.execute(
                sa.select(parts_t.c.part).where(parts_t.c.job_id == job_id).order_by(parts_t.c.part)
            ).scalars()
            done = set(
                conn.execute(
                    sa.select(outputs_t.c.part).where(outputs_t.c.job_id == job_id)
                ).scalars()
            )
            return [p for p in parts if p not in done]

    def history(self, ref: str | None = None) -> list[dict[str, Any]]:
        """The transitions (of one job, attempt or ``job/part`` output), oldest first."""
        q = sa.select(transitions_t).order_by(transitions_t.c.id)
        if ref is not None:
            q = q.where(transitions_t.c.ref == ref)
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(q)]

    # -- plumbing -------------------------------------------------------------------------
    @contextmanager
    def _write(self, epoch: int | None = None) -> Iterator[Connection]:
        """A write transaction; with ``epoch``, refused if a newer scheduler took over.
        The longest wait for the database's write lock is kept for :meth:`take_waited`."""
        if not self._ready:
            current = self.version()
            if current != SCHEMA_VERSION:
                raise LedgerError(
                    f"daskjobs ledger {self.url}: schema version {current}, this daskjobs "
                    f"writes {SCHEMA_VERSION}: call Ledger.migrate() (or `daskjobs ledger migrate`)"
                )
            self._ready = True
        asked = time.monotonic()
        with self.engine.connect() as conn:
            conn.execution_options(daskjobs_write=True)  # SQLite: BEGIN IMMEDIATE
            with conn.begin():
                if epoch is not None:
                    current = _epoch(conn)
                    if current != epoch:
                        raise Fenced(epoch, current)
                self._waited = max(self._waited, time.monotonic() - asked)
                yield conn

    def take_waited(self) -> float:
        """The longest a write waited to begin (seconds) since the last call: how long
        the database was locked or unreachable-but-answering for this writer."""
        waited, self._waited = self._waited, 0.0
        return waited

    def _log_many(
        self,
        conn: Connection,
        rows: Sequence[tuple[str, str, str | None, str | None, str]],
        epoch: int,
        *,
        refused_epoch: int | None = None,
    ) -> None:
        """:meth:`_log` for many ``(kind, ref, before, after, reason)``, one statement."""
        if not rows:
            return
        at = self.clock()
        _insert_many(
            conn,
            transitions_t,
            [
                {
                    "at": at,
                    "kind": kind,
                    "ref": ref,
                    "from_state": before,
                    "to_state": after,
                    "reason": reason or None,
                    "epoch": refused_epoch
                    if after == "refused" and refused_epoch is not None
                    else epoch,
                }
                for kind, ref, before, after, reason in rows
            ],
        )

    def _log(
        self,
        conn: Connection,
        kind: str,
        ref: str,
        before: str | None,
        after: str | None,
        reason: str,
        epoch: int,
    ) -> None:
        conn.execute(
            transitions_t.insert().values(
                at=self.clock(),
                kind=kind,
                ref=ref,
                from_state=before,
                to_state=after,
                reason=reason or None,
                epoch=epoch,
            )
        )


def _insert_many(conn: Connection, table: sa.Table, rows: Sequence[dict[str, Any]]) -> None:
    """``conn.execute(table.insert(), rows)`` for rows of plain values (str, int, float,
    bytes, None), handed to the driver's ``executemany`` as tuples: SQLAlchemy's own
    executemany builds each row's parameters in Python (2-3 us a row, the largest share of
    a batch of starts or commits); other dialects take the usual way."""
    if not rows:
        return
    mark = {"qmark": "?", "format": "%s", "pyformat": "%s"}.get(conn.dialect.paramstyle)
    if mark is None or conn.dialect.name not in ("sqlite", "postgresql"):
        conn.execute(table.insert(), list(rows))
        return
    columns = list(rows[0])
    quote = conn.dialect.identifier_preparer.quote
    sql = (
        f"INSERT INTO {quote(table.name)} ({', '.join(quote(c) for c in columns)}) "
        f"VALUES ({', '.join([mark] * len(columns))})"
    )
    conn.exec_driver_sql(sql, [tuple(row[c] for c in columns) for row in rows])


#: Attempt states that hold no part any more.
_ENDED = sorted(set(ATTEMPT_STATES) - LIVE_ATTEMPTS)


def _still_live() -> Any:
    """``state NOT IN (ended states)``: "live" as ``state IN (live states)`` says it (the
    states are closed), for a statement that picks attempts by id. No index serves it, so
    none is chosen over the id's: SQLite, without statistics, drove ``attempt_id IN (...)
    AND state IN (...)`` by the state index - a scan of every live attempt (10,000 in a big
    job) for each batch of commits or renewals."""
    return attempts_t.c.state.not_in(_ENDED)


def _of_parts(table: sa.Table, parts: Sequence[tuple[str, int]]) -> Any:
    """``(job_id, part) IN parts`` as ``job_id = :job AND part IN (...)`` per job: the
    primary key's index serves it on both backends (PostgreSQL scanned the table for a
    row-value IN list)."""
    by_job: dict[str, list[int]] = {}
    for job_id, part in parts:
        by_job.setdefault(job_id, []).append(part)
    if len(by_job) > 8:  # many jobs of few parts: the jobs by the index, then the pairs
        return sa.and_(
            table.c.job_id.in_(sorted(by_job)),
            sa.tuple_(table.c.job_id, table.c.part).in_(list(parts)),
        )
    return sa.or_(*(_parts_of_job(table, job_id, ps) for job_id, ps in sorted(by_job.items())))


def _parts_of_job(table: sa.Table, job_id: str, parts: Sequence[int]) -> Any:
    """``job_id = :job AND part IN (...)``, or ``part BETWEEN :lo AND :hi`` when the parts
    are one run (a big job's parts start in order): two parameters, not hundreds (an
    expanded IN list costs SQLAlchemy about 0.2 ms per hundred values to render)."""
    unique = sorted(set(parts))
    if len(unique) > 2 and unique[-1] - unique[0] + 1 == len(unique):
        return sa.and_(table.c.job_id == job_id, table.c.part.between(unique[0], unique[-1]))
    return sa.and_(table.c.job_id == job_id, table.c.part.in_(unique))


def _chunks(items: Sequence[Any], size: int = 300) -> Iterator[Sequence[Any]]:
    """Pieces of ``items`` small enough for one statement's parameters (SQLite's limit)."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


def safe_url(url: str) -> str:
    """The URL without its password."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<ledger>"


def reason(e: BaseException) -> str:
    """What went wrong, in one line: the database driver's own message without the
    SQL statement and SQLAlchemy's pointers."""
    inner = getattr(e, "orig", None) or e
    lines = [ln.strip() for ln in str(inner).splitlines() if ln.strip()]
    text = lines[0] if lines else type(inner).__name__
    if isinstance(inner, OSError) and inner.strerror:
        text = f"{inner.strerror}: {inner.filename}" if inner.filename else inner.strerror
    return text.removeprefix("connection failed: ")


def _sqlite_path(url: str) -> str | None:
    path = sa.engine.make_url(url).database
    return path if path and path != ":memory:" and not path.startswith("file:") else None


def _check_exists(url: str) -> None:
    """An SQLite ledger file that must be there already (not made by opening it)."""
    try:
        path = _sqlite_path(url) if url.startswith("sqlite") else None
    except sa.exc.ArgumentError:
        return  # Ledger names the bad URL
    if path is not None and not os.path.isfile(path):
        what = "no such file" if not os.path.exists(path) else "not a file"
        raise LedgerError(
            f"daskjobs ledger {safe_url(url)}: {what} ({os.path.abspath(path)}); "
            "`daskjobs ledger migrate --ledger URL` creates a ledger there"
        )


def _engine(
    url: str, busy_timeout: float = 30.0, create: bool = True, read_only: bool = False
) -> Engine:
    if url.startswith("sqlite"):
        path = _sqlite_path(url)
        if path is not None and create:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if path is not None and read_only:  # SQLite's read-only open: never makes the file
            file = pathlib.Path(os.path.abspath(path)).as_uri()
            url = f"sqlite:///{file}?mode=ro&uri=true"
        engine = sa.create_engine(url, connect_args={"timeout": busy_timeout})

        @sa.event.listens_for(engine, "connect")
        def _connect(dbapi_conn: Any, record: Any) -> None:
            dbapi_conn.isolation_level = None  # transactions begun explicitly, below
            cur = dbapi_conn.cursor()
            if create and not read_only:  # (persistent: a ledger made here is WAL already)
                cur.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: a commit survives the process (every fault the jobs service
            # handles); after a power loss the last commits may roll back, and those parts
            # run again (an output is visible once either way). FULL syncs every commit.
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
            cur.close()

        @sa.event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            # writers queue on the lock up front; readers never wait for it (WAL)
            write = conn.get_execution_options().get("daskjobs_write", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

        return engine
    if read_only and url.startswith("postgresql"):
        options = "-c default_transaction_read_only=on"
        return sa.create_engine(url, pool_pre_ping=True, connect_args={"options": options})
    return sa.create_engine(url, pool_pre_ping=True)


def _epoch(conn: Connection, exclusive: bool = False) -> int:
    q = sa.select(meta_t.c.value).where(meta_t.c.key == "epoch")
    if conn.dialect.name == "postgresql":
        q = q.with_for_update(read=not exclusive)
    v = conn.execute(q).scalar()
    if v is None:
        raise LedgerError("daskjobs ledger: no schema yet; call Ledger.migrate() first")
    return int(v)


def _put_meta(conn: Connection, key: str, value: str) -> None:
    res = conn.execute(meta_t.update().where(meta_t.c.key == key).values(value=value))
    if res.rowcount == 0:
        conn.execute(meta_t.insert().values(key=key, value=value))


def _job(row: Any) -> JobRecord:
    return JobRecord(
        job_id=row.job_id,
        spec=JobSpec.from_json(json.loads(row.spec)),
        state=row.state,
        submitted=row.submitted,
        updated=row.updated,
        reason=row.reason,
    )


def _attempt(row: Any) -> AttemptRecord:
    return AttemptRecord(
        attempt_id=row.attempt_id,
        job_id=row.job_id,
        part=row.part,
        token=row.token,
        state=row.state,
        worker=row.worker,
        lease_until=row.lease_until,
        started=row.started,
        updated=row.updated,
        reason=row.reason,
    )
