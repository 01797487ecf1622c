"""Jobs' states: submitting, moving, cancelling, retrying, failing and settling jobs.

Each change is a conditional update (``WHERE state = :expected``) in one write
transaction; a job that ends takes its live attempts with it (:meth:`JobMoves._end_live`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from daskjobs.jobs.ledger.core import LedgerCore
from daskjobs.jobs.ledger.errors import LedgerError
from daskjobs.jobs.ledger.rows import _chunks, _insert_many, _job
from daskjobs.jobs.ledger.schema import attempts_t, jobs_t, outputs_t, parts_t
from daskjobs.jobs.model import (
    JOB_MOVES,
    LIVE_ATTEMPTS,
    JobRecord,
    JobSpec,
    StaleTransition,
)


def _default_team() -> str:
    """``daskjobs.teams.default`` of dask's config."""
    import dask.config

    import daskjobs.config  # noqa: F401 - registers the defaults

    return str(dask.config.get("daskjobs.teams.default"))


class JobMoves(LedgerCore):
    """Writes that move jobs (module docs)."""

    def submit(self, spec: JobSpec, epoch: int | None, by: str | None = None) -> JobRecord:
        """Record ``spec`` as a queued job, or return the job already recorded under its
        identity (submitting the same job twice is one job). A spec that names no team is
        listed under ``daskjobs.teams.default`` (the jobs service decides a submitted job's
        team before it gets here). ``by``: who submitted it (a client's certificate
        identity), written in the job's first transition."""
        now = self.clock()
        job_id = spec.job_id
        with self._write(epoch) as conn:
            row = conn.execute(sa.select(jobs_t).where(jobs_t.c.job_id == job_id)).first()
            if row is None:
                conn.execute(
                    jobs_t.insert().values(
                        job_id=job_id,
                        name=spec.name,
                        team=spec.team or _default_team(),
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
                reason = "submitted" if by is None else f"submitted by {by}"
                self._log(conn, "job", job_id, None, "queued", reason, epoch or 0)
                row = conn.execute(sa.select(jobs_t).where(jobs_t.c.job_id == job_id)).one()
        return _job(row)

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

    def _end_live(
        self, conn: Connection, job_id: str, new: str, reason: str, epoch: int, now: float
    ) -> None:
        q = (
            sa.select(attempts_t.c.attempt_id, attempts_t.c.state)
            .where(attempts_t.c.job_id == job_id, attempts_t.c.state.in_(sorted(LIVE_ATTEMPTS)))
            .order_by(attempts_t.c.attempt_id)  # the order every writer locks attempts in
        )
        if conn.dialect.name == "postgresql":
            # locked as read: an attempt acknowledged meanwhile (launching -> running) is
            # ended too, not skipped by the update's state condition
            q = q.with_for_update()
        rows = conn.execute(q).all()
        for r in rows:
            conn.execute(
                attempts_t.update()
                .where(attempts_t.c.attempt_id == r.attempt_id, attempts_t.c.state == r.state)
                .values(state=new, updated=now, reason=reason)
            )
            self._log(conn, "attempt", r.attempt_id, r.state, new, reason, epoch)
