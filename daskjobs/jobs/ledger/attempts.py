"""Attempts, their fencing tokens and their leases.

Starting an attempt takes the part's next token (one at a time, :meth:`AttemptMoves.start_attempt`,
or set-based for many parts, :meth:`AttemptMoves.start_attempts`); a worker acknowledges
it (:meth:`AttemptMoves.ack_many`) and renews its lease with its heartbeats
(:meth:`AttemptMoves.renew_many`); :meth:`AttemptMoves.expire` marks attempts whose lease
ran out ``lost``.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from daskjobs.jobs.ledger.core import LedgerCore
from daskjobs.jobs.ledger.errors import LedgerError
from daskjobs.jobs.ledger.rows import _attempt, _chunks, _insert_many, _of_parts, _still_live
from daskjobs.jobs.ledger.schema import attempts_t, outputs_t, parts_t
from daskjobs.jobs.model import (
    ATTEMPT_MOVES,
    LIVE_ATTEMPTS,
    AttemptRecord,
    StaleTransition,
)


class AttemptMoves(LedgerCore):
    """Writes that start, move, renew and expire attempts (module docs)."""

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

    def end_attempt(
        self, attempt_id: str, token: int, new: str, epoch: int | None, reason: str = ""
    ) -> bool:
        """A live attempt (whatever its live state) -> ``new`` (failed, lost, fenced or
        cancelled); False if it had ended already or the token is stale."""
        if new not in ("failed", "lost", "fenced", "cancelled"):
            raise ValueError(f"an attempt ends failed, lost, fenced or cancelled, not {new!r}")
        now = self.clock()
        with self._write(epoch) as conn:
            q = sa.select(attempts_t.c.state).where(
                attempts_t.c.attempt_id == attempt_id, attempts_t.c.token == token
            )
            if conn.dialect.name == "postgresql":
                # locked as read: a worker's acknowledgement (launching -> running) that
                # commits meanwhile would otherwise leave the update below matching nothing
                q = q.with_for_update()
            row = conn.execute(q).first()
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
        out: dict[int, bool] = {}
        with self._write() as conn:
            pg = conn.dialect.name == "postgresql"
            # by attempt id, the order every writer locks attempts in (PostgreSQL: each row
            # locked as read, so that a move meanwhile - launching -> unknown by the service -
            # does not make the update below match nothing and refuse a live attempt)
            for i in sorted(range(len(attempts)), key=lambda i: attempts[i][0]):
                attempt_id, token, worker = attempts[i]
                q = sa.select(attempts_t.c.state, attempts_t.c.token).where(
                    attempts_t.c.attempt_id == attempt_id
                )
                if pg:
                    q = q.with_for_update()
                row = conn.execute(q).first()
                if row is None or row.token != token or row.state not in LIVE_ATTEMPTS:
                    out[i] = False
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
                out[i] = res.rowcount == 1
                if res.rowcount == 1 and row.state != "running":
                    reason = (
                        "worker started it"
                        if row.state == "launching"
                        else "its worker reported it"
                    )
                    self._log(
                        conn, "attempt", attempt_id, row.state, "running", f"{reason} ({worker})", 0
                    )
        return [out[i] for i in range(len(attempts))]

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
