"""A jobs ledger's database made unreachable for a while, on either backend."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def outage(ledger_url: str) -> Any:
    """A context manager making the ledger's database unreachable: PostgreSQL refuses
    connections and drops the open ones; SQLite is locked by another writer."""
    import sqlalchemy as sa

    @contextlib.contextmanager
    def pg() -> Iterator[None]:
        name = sa.engine.make_url(ledger_url).database
        admin = sa.create_engine(
            ledger_url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT"
        )
        with admin.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
            conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
            )
        try:
            yield
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')
            admin.dispose()

    @contextlib.contextmanager
    def sqlite() -> Iterator[None]:
        import sqlite3

        path = sa.engine.make_url(ledger_url).database
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()

    return pg() if ledger_url.startswith("postgresql") else sqlite()
