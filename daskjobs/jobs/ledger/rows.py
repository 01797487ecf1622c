"""Set-based statements and rows: how the ledger writes and reads many parts at once.

A batch of starts, commits or renewals is a few statements per few hundred parts
(:func:`_chunks`), with ``(job_id, part)`` lists written so that the primary key's index
serves them (:func:`_of_parts`), inserted through the driver's ``executemany``
(:func:`_insert_many`). :func:`_job` and :func:`_attempt` read rows as records.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from daskjobs.jobs.ledger.schema import attempts_t
from daskjobs.jobs.model import (
    ATTEMPT_STATES,
    LIVE_ATTEMPTS,
    AttemptRecord,
    JobRecord,
    JobSpec,
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


def _job(row: Any) -> JobRecord:
    return JobRecord(
        job_id=row.job_id,
        spec=JobSpec.from_record(json.loads(row.spec)),
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
