"""Reading the ledger: jobs, attempts, outputs, what is runnable, and the metrics.

Reads run on a plain connection (no write lock). :meth:`LedgerQueries.runnable` (the
parts that need an attempt) and :meth:`LedgerQueries.metrics` (per-team aggregates) are
written as anti-joins and grouped counts, not a subquery per part.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from daskjobs.jobs.ledger.core import LedgerCore
from daskjobs.jobs.ledger.errors import LedgerError
from daskjobs.jobs.ledger.rows import _attempt, _job
from daskjobs.jobs.ledger.schema import attempts_t, jobs_t, outputs_t, parts_t, transitions_t
from daskjobs.jobs.model import (
    LIVE_ATTEMPTS,
    AttemptRecord,
    JobRecord,
)


class LedgerQueries(LedgerCore):
    """Reads (module docs)."""

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
