"""The ledger's tables and their numbered migrations.

Six tables (meta, jobs, parts, attempts, outputs, transitions) in SQLAlchemy Core.
``MIGRATIONS[n]`` brings schema version ``n`` to ``n + 1`` (:meth:`Ledger.migrate` runs
them, one transaction each); :data:`SCHEMA_VERSION` is the version this code writes. The
``meta`` table holds the schema version and the scheduler epoch (:func:`_epoch`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from daskjobs.jobs.ledger.errors import LedgerError

#: The schema this code writes; :meth:`Ledger.migrate` brings older ledgers up to it.
SCHEMA_VERSION = 2


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
