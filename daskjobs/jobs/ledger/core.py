"""The ledger's write path: schema version, scheduler epochs and the transition log.

:class:`LedgerCore` is what every part of :class:`~daskjobs.jobs.ledger.Ledger` writes
through: :meth:`LedgerCore._write` opens one write transaction (refused with
:class:`Fenced` when a newer scheduler took the epoch, or when the schema is out of date)
and :meth:`LedgerCore._log` records each transition in it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from daskjobs.jobs.ledger.errors import Fenced, LedgerError
from daskjobs.jobs.ledger.rows import _insert_many
from daskjobs.jobs.ledger.schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    _epoch,
    _put_meta,
    meta_t,
    transitions_t,
)


class EpochHolder(NamedTuple):
    """The scheduler that holds a ledger's epoch (:meth:`LedgerCore.holder`): its
    ``epoch``, its name (``"scheduler tcp://host:port"``, None if never recorded), when it
    took the epoch and when the ledger last heard from it (seconds since the epoch, or
    None)."""

    epoch: int
    holder: str | None
    taken: float | None
    seen: float | None

    def describe(self, now: float) -> str:
        """``epoch 3, held by scheduler tcp://...:8786 since 12.0s ago (last seen 0.4s ago)``."""
        text = f"epoch {self.epoch}, held by {self.holder or 'an unnamed scheduler'}"
        if self.taken is not None:
            text += f" since {max(0.0, now - self.taken):.1f}s ago"
        if self.seen is not None:
            text += f" (last seen {max(0.0, now - self.seen):.1f}s ago)"
        return text


class LedgerCore:
    """The connection, the schema version, the scheduler epochs and the write path (module docs)."""

    url: str
    clock: Callable[[], float]
    engine: Engine
    _ready: bool
    _waited: float

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
        """Take the next scheduler epoch: every writer holding an older one is fenced.
        ``owner`` (``"scheduler tcp://..."``) is kept as the epoch's holder
        (:meth:`holder`)."""
        with self._write() as conn:
            new = _epoch(conn, exclusive=True) + 1
            conn.execute(meta_t.update().where(meta_t.c.key == "epoch").values(value=str(new)))
            _put_meta(conn, "epoch_holder", owner or "scheduler")
            _put_meta(conn, "epoch_taken", repr(self.clock()))
            self._log(conn, "epoch", owner or "scheduler", None, str(new), "took over", new)
            return new

    def holder(self) -> EpochHolder:
        """Who holds the ledger's scheduler epoch now, since when, and when it last
        wrote (:meth:`touch`). A ledger whose epoch was taken by an earlier daskjobs
        names its holder from the transition log."""
        with self.engine.connect() as conn:
            epoch = _epoch(conn)
            meta = {
                r.key: r.value
                for r in conn.execute(
                    sa.select(meta_t.c.key, meta_t.c.value).where(
                        meta_t.c.key.in_(("epoch_holder", "epoch_taken", "service_seen"))
                    )
                )
            }
            name, taken = meta.get("epoch_holder"), meta.get("epoch_taken")
            if name is None and epoch:  # once, when a service is fenced or starts
                row = conn.execute(
                    sa.select(transitions_t.c.ref, transitions_t.c.at)
                    .where(transitions_t.c.kind == "epoch", transitions_t.c.to_state == str(epoch))
                    .order_by(transitions_t.c.id.desc())
                    .limit(1)
                ).first()
                if row is not None:
                    name, taken = row.ref, repr(row.at)
        seen = meta.get("service_seen")
        return EpochHolder(
            epoch,
            name,
            float(taken) if taken is not None else None,
            float(seen) if seen is not None else None,
        )

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
