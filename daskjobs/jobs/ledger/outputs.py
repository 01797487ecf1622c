"""Committing outputs and checkpoints, fenced by the part's token.

An output is committed once per part, only by the live attempt holding the part's
current token (:meth:`OutputCommits.commit_outputs`, set-based, decided item by item);
the last part committed moves a running job to ``succeeded``. A checkpoint is recorded
only for the live attempt holding the part (:meth:`OutputCommits.commit_checkpoint`).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from daskjobs.jobs.ledger.core import LedgerCore
from daskjobs.jobs.ledger.errors import LedgerError
from daskjobs.jobs.ledger.rows import _chunks, _insert_many, _of_parts, _still_live
from daskjobs.jobs.ledger.schema import attempts_t, jobs_t, outputs_t, parts_t
from daskjobs.jobs.model import (
    LIVE_ATTEMPTS,
    StaleTransition,
)


class OutputCommits(LedgerCore):
    """Writes that commit outputs and checkpoints (module docs)."""

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
