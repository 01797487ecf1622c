"""Errors a user meets across daskjobs' parts (light: imports nothing)."""

from __future__ import annotations

__all__ = ["REFUSED_REASON", "AdmissionRefused", "SubmissionRefused", "refusal_of"]

#: The reason of the futures of a graph the scheduler refused unread and cancelled (one of
#: more keys than it tells one by one); their error's message is the refusal's.
REFUSED_REASON = "refused by daskjobs"


class SubmissionRefused(ValueError):
    """The scheduler refused a submission for its own input: a team unknown while teams
    are strict, a bad annotation, a resource request or gang no worker can ever hold.

    dask fails the refused tasks with it (each new task of the submission is ``erred``,
    as a task whose function raised): their futures raise it, ``Sweep.run`` and
    ``daskjobs.jobs.submit`` raise it, and nothing of the submission runs. What existed
    before the submission (a result in memory, in the store) is untouched.
    """


class AdmissionRefused(SubmissionRefused):
    """A submission over one of the scheduler's admission limits (``daskjobs.admission``):
    too many tasks or parts, too many bytes, or too many of the client's tasks unfinished.
    Refused before the scheduler allocated or recorded anything of it; the scheduler goes on
    serving every other client.

    ``key`` is the limit's config key (``daskjobs.admission.graph-tasks``), ``limit`` its
    value on the scheduler and ``size`` what the submission asked for.
    """

    def __init__(self, message: str, key: str = "", limit: int = 0, size: int = 0) -> None:
        super().__init__(message)
        self.key = key
        self.limit = limit
        self.size = size

    def __reduce__(self) -> tuple[object, ...]:  # travels to the client pickled
        return (type(self), (str(self), self.key, self.limit, self.size))


def _amount(n: int, unit: str) -> str:
    if unit != "bytes":
        return f"{n:,} {unit}"
    for name, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {name} ({n:,} bytes)"
    return f"{n:,} bytes"


def over_limit(
    what: str, size: int, key: str, limit: int, unit: str, advice: str
) -> AdmissionRefused:
    """The refusal of a submission of ``size`` (tasks, parts, bytes: ``unit``) over the
    admission limit ``key`` of value ``limit``; ``what`` says what was counted."""
    return AdmissionRefused(
        f"daskjobs refused the submission: {what}: {_amount(size, unit)}, over the "
        f"scheduler's limit {key} = {_amount(limit, unit)}; nothing of it was accepted. "
        f"{advice}",
        key,
        limit,
        size,
    )


def refusal_of(error: BaseException) -> AdmissionRefused | None:
    """The refusal a cancelled future's error carries (dask's ``FutureCancelledError`` of a
    graph the scheduler refused unread), or None for any other error."""
    reason, msg = getattr(error, "reason", None), getattr(error, "msg", None)
    if isinstance(reason, str) and reason.startswith(REFUSED_REASON) and msg:
        return AdmissionRefused(str(msg))
    return None
