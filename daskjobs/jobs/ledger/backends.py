"""The databases a ledger runs on: SQLite (a file, the default) and PostgreSQL.

:func:`_engine` makes the SQLAlchemy engine: on SQLite in WAL mode, with write
transactions begun ``IMMEDIATE`` and a busy timeout; read-only opens (SQLite's
``mode=ro``, PostgreSQL's read-only transactions). :func:`safe_url` and :func:`reason`
put a URL and a database error into one line of a message.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from daskjobs.jobs.ledger.errors import LedgerError


def default_url(store_root: str | os.PathLike[str] = ".daskjobs-cache") -> str:
    """The default ledger: an SQLite file beside the result store."""
    return "sqlite:///" + os.path.abspath(os.path.join(os.fspath(store_root), "ledger.sqlite"))


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
