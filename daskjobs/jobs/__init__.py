"""ML jobs on dask: job and attempt identities, leases, fencing and a durable ledger.

:mod:`daskjobs.jobs.model` holds the immutable job specification and the state
machines; :mod:`daskjobs.jobs.ledger` keeps jobs, attempts, committed outputs and
every transition in a database (SQLite by default, PostgreSQL for shared clusters).
See docs/explanation/jobs.md.

The ledger and the model are imported here; the names that need ``distributed`` (the
client API, the runner, the service, sweeps as jobs) are imported on first use (module
``__getattr__``, PEP 562), so ``daskjobs ledger ...`` and a script that only reads a
ledger do not load ``distributed`` (about a second). Type checkers read
``__init__.pyi`` beside this file (tests/project/test_packaging.py checks that the two agree).
"""

from __future__ import annotations

from typing import Any

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
    JobSpecError,
    Progress,
    StaleTransition,
    next_step,
)

# Public names imported lazily on first attribute access: name -> (module, its name there).
_LAZY: dict[str, tuple[str, str]] = {
    "Job": ("daskjobs.jobs.api", "Job"),
    "JobFailed": ("daskjobs.jobs.api", "JobFailed"),
    "list_jobs": ("daskjobs.jobs.api", "list_jobs"),
    #: ``daskjobs.jobs.list(client)``: the ledger's jobs (:func:`list_jobs`).
    "list": ("daskjobs.jobs.api", "list_jobs"),
    "submit": ("daskjobs.jobs.api", "submit"),
    "Attempt": ("daskjobs.jobs.runner", "Attempt"),
    "JobsService": ("daskjobs.jobs.service", "JobsService"),
    "submit_sweep": ("daskjobs.jobs.sweeps", "submit_sweep"),
}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'daskjobs.jobs' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(where[0]), where[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
    "JobSpecError",
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
