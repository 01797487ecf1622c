"""Errors a user meets across daskjobs' parts (light: imports nothing)."""

from __future__ import annotations

__all__ = ["SubmissionRefused"]


class SubmissionRefused(ValueError):
    """The scheduler refused a submission for its own input: a team unknown while teams
    are strict, a bad annotation, a resource request or gang no worker can ever hold.

    dask fails the refused tasks with it (each new task of the submission is ``erred``,
    as a task whose function raised): their futures raise it, ``Sweep.run`` and
    ``daskjobs.jobs.submit`` raise it, and nothing of the submission runs. What existed
    before the submission (a result in memory, in the store) is untouched.
    """
