"""ML jobs on dask: job and attempt identities, leases, fencing and a durable ledger.

:mod:`daskjobs.jobs.model` holds the immutable job specification and the state
machines; :mod:`daskjobs.jobs.ledger` keeps jobs, attempts, committed outputs and
every transition in a database (SQLite by default, PostgreSQL for shared clusters).
See docs/jobs.md.
"""

from daskjobs.jobs.api import Job, JobFailed, list_jobs, submit
from daskjobs.jobs.ledger import SCHEMA_VERSION, Fenced, Ledger, LedgerError, default_url
from daskjobs.jobs.model import (
    ATTEMPT_MOVES,
    ATTEMPT_STATES,
    JOB_MOVES,
    JOB_STATES,
    KINDS,
    LIVE_ATTEMPTS,
    AttemptRecord,
    JobInfo,
    JobRecord,
    JobSpec,
    Progress,
    StaleTransition,
    next_step,
)
from daskjobs.jobs.runner import Attempt
from daskjobs.jobs.service import JobsService
from daskjobs.jobs.sweeps import submit_sweep

#: ``daskjobs.jobs.list(client)``: the ledger's jobs (:func:`list_jobs`).
list = list_jobs

__all__ = [
    "ATTEMPT_MOVES",
    "ATTEMPT_STATES",
    "JOB_MOVES",
    "JOB_STATES",
    "KINDS",
    "LIVE_ATTEMPTS",
    "SCHEMA_VERSION",
    "Attempt",
    "AttemptRecord",
    "Fenced",
    "Job",
    "JobFailed",
    "JobInfo",
    "JobRecord",
    "JobSpec",
    "JobsService",
    "Ledger",
    "LedgerError",
    "Progress",
    "StaleTransition",
    "default_url",
    "list",
    "list_jobs",
    "next_step",
    "submit",
    "submit_sweep",
]
