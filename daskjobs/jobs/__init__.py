"""ML jobs on dask: job and attempt identities, leases, fencing and a durable ledger.

:mod:`daskjobs.jobs.model` holds the immutable job specification and the state
machines; :mod:`daskjobs.jobs.ledger` keeps jobs, attempts, committed outputs and
every transition in a database (SQLite by default, PostgreSQL for shared clusters).
See docs/jobs.md.
"""

from daskjobs.jobs.ledger import SCHEMA_VERSION, Fenced, Ledger, LedgerError, default_url
from daskjobs.jobs.model import (
    ATTEMPT_MOVES,
    ATTEMPT_STATES,
    JOB_MOVES,
    JOB_STATES,
    KINDS,
    LIVE_ATTEMPTS,
    AttemptRecord,
    JobRecord,
    JobSpec,
    StaleTransition,
)

__all__ = [
    "ATTEMPT_MOVES",
    "ATTEMPT_STATES",
    "JOB_MOVES",
    "JOB_STATES",
    "KINDS",
    "LIVE_ATTEMPTS",
    "SCHEMA_VERSION",
    "AttemptRecord",
    "Fenced",
    "JobRecord",
    "JobSpec",
    "Ledger",
    "LedgerError",
    "StaleTransition",
    "default_url",
]
