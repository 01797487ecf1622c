"""Jobs and attempts: identities, immutable specifications and the state machines.

A **job** is what a user submits: an immutable :class:`JobSpec` (its name, team,
kind, resources, priority, deadline, retries, checkpoint policy, and what to run)
with an identity derived from its content, so that resubmitting the same job gives
the same identity back and only what is missing runs. A job has one or more
**parts** (the single task of a training or evaluation job, the partitions of a
batch-inference job). An **attempt** is one execution of one part on one worker:
mutable, with its own id, a lease and a **fencing token**. Every attempt of a part
gets a higher token than the one before; an output is committed with its attempt's
token and refused if a later attempt exists, so a worker that finishes after its
part was given to another cannot make its output visible (Kleppmann, "How to do
distributed locking", 2016; Temporal fences stale owners the same way).

The state machines (every change is a conditional update in the ledger, applied
once; repeating a change that already happened is a no-op)::

    job:      queued ──> running ──> succeeded
                 │          │ └────> failed ──> queued   (retry)
                 │          └──────> queued               (a part lost, re-queued)
                 └──> cancelled <────┘ (from queued or running)    cancelled ──> queued

    attempt:  launching ──> running ──> succeeded | failed | lost | fenced | cancelled
                  │ └──> unknown ──> running | lost      (a launch whose reply was lost:
                  └──> lost | cancelled                   reconciled before any retry)

``unknown`` is the state of a launch that timed out: its outcome is not known, so
no second attempt of that part starts until it is reconciled (asked the worker,
read the ledger and the store). ``fenced`` is an attempt whose owner lost its
right to write (a newer scheduler epoch, or a newer attempt of its part).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from daskjobs._text import shown
from daskjobs.errors import SubmissionRefused

__all__ = [
    "ATTEMPT_MOVES",
    "ATTEMPT_STATES",
    "JOB_MOVES",
    "JOB_STATES",
    "KINDS",
    "AttemptRecord",
    "JobInfo",
    "JobRecord",
    "JobSpec",
    "JobSpecError",
    "Progress",
    "StaleTransition",
    "may_expire",
    "next_step",
    "responsive",
]

#: What a job does: a gang of workers with checkpoints, replayable partitions, or
#: low-priority evaluation.
KINDS = ("training", "inference", "evaluation")

JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled")
#: Allowed job transitions: state -> states it may move to.
JOB_MOVES: Mapping[str, frozenset[str]] = {
    "queued": frozenset({"running", "cancelled"}),
    "running": frozenset({"succeeded", "failed", "queued", "cancelled"}),
    "failed": frozenset({"queued"}),
    "cancelled": frozenset({"queued"}),
    "succeeded": frozenset(),
}

ATTEMPT_STATES = (
    "launching",
    "running",
    "unknown",
    "succeeded",
    "failed",
    "lost",
    "fenced",
    "cancelled",
)
#: (an output committed by an attempt never acknowledged - a part that ended before its
#: worker's first report, or whose report was lost - is its report: launching or unknown
#: -> succeeded)
ATTEMPT_MOVES: Mapping[str, frozenset[str]] = {
    "launching": frozenset(
        {"running", "unknown", "succeeded", "lost", "cancelled", "fenced", "failed"}
    ),
    "unknown": frozenset({"running", "succeeded", "lost", "fenced", "cancelled"}),
    "running": frozenset({"succeeded", "failed", "lost", "fenced", "cancelled"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "lost": frozenset(),
    "fenced": frozenset(),
    "cancelled": frozenset(),
}
#: Attempt states that still hold (or may hold) a part: no second attempt may start.
LIVE_ATTEMPTS = frozenset({"launching", "running", "unknown"})


class StaleTransition(RuntimeError):
    """A conditional transition did not apply: the record is not in the expected state
    (someone else moved it), or the caller's token or epoch is stale."""

    def __init__(self, what: str, expected: str, current: str | None, detail: str = "") -> None:
        self.what = what
        self.expected = expected
        self.current = current
        super().__init__(
            f"{what}: expected state {expected!r}, found {current!r}"
            + (f" ({detail})" if detail else "")
        )


def _json(value: Any) -> Any:
    """``value`` as plain JSON (sorted keys), for identities and the ledger's columns."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


@dataclass(frozen=True)
class JobSpec:
    """What a user asks to run; never changes once submitted.

    ``name`` names the job for people and, with the rest of the spec, makes its
    identity (:attr:`job_id`). ``parts`` is the number of parts (1 for training and
    evaluation, the partitions of an inference job). ``target`` says what runs: a
    string the runner resolves (``"module:function"``), kept as text so that the
    ledger never stores pickles. ``params`` are its JSON-able arguments.
    """

    name: str
    kind: str = "evaluation"
    #: None: the team of the client that submits it (its certificate's, or the team it
    #: stated, else ``daskjobs.teams.default``), decided by the scheduler at submission
    team: str | None = None
    parts: int = 1
    target: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)
    resources: Mapping[str, float] = field(default_factory=dict)
    priority: int = 0
    deadline: float | None = None  # seconds since the epoch
    retries: int = 2
    checkpoint_every: float | None = None  # seconds of work between checkpoints
    #: "te": interactive work a person waits for (the plugin's preemption serves it first,
    #: docs/explanation/preemption.md); "be": best-effort, the default
    job_class: str = "be"
    #: what each attempt's worker must have (docs/explanation/resources.md; placed by the plugin
    #: when ``daskjobs.resources.enabled``): an accelerator type or list of types, memory per
    #: device (``"40GB"``), a constraint over the worker's inventory
    accelerator: str | tuple[str, ...] | None = None
    gpu_memory: str | float | None = None
    constraint: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.accelerator, list):
            object.__setattr__(self, "accelerator", tuple(self.accelerator))
        _check_spec(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "team": self.team,
            "parts": self.parts,
            "target": self.target,
            "params": _json(dict(self.params)),
            "resources": _json(dict(self.resources)),
            "priority": self.priority,
            "deadline": self.deadline,
            "retries": self.retries,
            "checkpoint_every": self.checkpoint_every,
            # only when not the default: a best-effort job keeps the identity it had
            **({"job_class": self.job_class} if self.job_class != "be" else {}),
            # only when asked: a job without them keeps the identity it had
            **_json(self.placement()),
        }

    def placement(self) -> dict[str, Any]:
        """The attempts' placement annotations (accelerator, gpu_memory, constraint) that
        are set."""
        out: dict[str, Any] = {}
        if self.accelerator is not None:
            acc = self.accelerator
            out["accelerator"] = acc if isinstance(acc, str) else list(acc)
        if self.gpu_memory is not None:
            out["gpu_memory"] = self.gpu_memory
        if self.constraint is not None:
            out["constraint"] = self.constraint
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobSpec:
        """The spec of :meth:`to_json`'s dict, checked as a new one is (a field it does
        not know is a :class:`JobSpecError` too)."""
        if not isinstance(data, Mapping):
            raise JobSpecError("spec", f"JobSpec: expected a mapping of fields, got {_show(data)}")
        unknown = sorted(str(k) for k in data if k not in _FIELDS)
        if unknown:
            raise JobSpecError(
                unknown[0],
                f"JobSpec: unknown field(s) {', '.join(map(_show, unknown))} (its fields: "
                f"{', '.join(_FIELDS)})",
            )
        return cls(**{str(k): v for k, v in data.items()})

    @classmethod
    def from_record(cls, data: Mapping[str, Any]) -> JobSpec:
        """The spec of a job the ledger holds, as recorded: checked as :meth:`from_json`
        does, else (a job recorded by an earlier daskjobs, whose checks were looser) read
        as it is, so that listing a ledger never fails on an old record."""
        try:
            return cls.from_json(data)
        except JobSpecError:
            spec = object.__new__(cls)
            for f in dataclasses.fields(cls):
                if f.name in data:
                    value = data[f.name]
                elif f.default is not dataclasses.MISSING:
                    value = f.default
                else:
                    value = f.default_factory()  # type: ignore[operator]
                object.__setattr__(spec, f.name, value)
            return spec

    @property
    def job_id(self) -> str:
        """``name-<hash of the whole spec>``: the same spec is the same job."""
        digest = hashlib.blake2b(
            json.dumps(self.to_json(), sort_keys=True).encode(), digest_size=8
        ).hexdigest()
        return f"{self.name}-{digest}"


class JobSpecError(SubmissionRefused):
    """A field of a :class:`JobSpec` that cannot be used: its message names the field
    (``field``), the value given and what is expected. Raised where the spec is made (on
    the client) and again by the scheduler's jobs service, before the ledger records
    anything."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field

    def __reduce__(self) -> tuple[Any, ...]:  # pickled to the client by the jobs service
        return (type(self), (self.field, str(self)))


#: The longest name and team (the ledger's columns hold 200 characters).
MAX_NAME = 200
#: The ledger's integer columns (parts, priority) hold 32-bit signed integers.
MAX_INT32 = 2**31 - 1
#: The most retries a part may have: each is an attempt recorded in the ledger.
MAX_RETRIES = 1000
#: The longest target text (``module:function``, ``store:KEY``).
MAX_TARGET = 1000


def _show(value: Any) -> str:
    """``repr(value)``, shortened: a bad field can be huge."""
    return shown(value, 60)


def _bad(name: str, expected: str, value: Any) -> JobSpecError:
    return JobSpecError(name, f"JobSpec.{name}: expected {expected}, got {_show(value)}")


def _text(name: str, value: Any, longest: int) -> None:
    """A non-empty printable string of at most ``longest`` characters."""
    if not (isinstance(value, str) and value and len(value) <= longest and value.isprintable()):
        raise _bad(name, f"a non-empty printable string of at most {longest} characters", value)


def _integer(name: str, value: Any, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _bad(name, f"an integer from {lo} to {hi}", value)


def _positive_or_none(name: str, value: Any) -> None:
    if value is None:
        return
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and value > 0):
        raise _bad(name, "a positive number of seconds or None", value)


def _is_dotted(text: str) -> bool:
    return all(part.isidentifier() for part in text.split("."))


def _check_target(target: Any) -> None:
    """``""`` (a function is given instead), ``module:function`` (dotted names) or a
    function kept in the store (``store:KEY``, what the service records for one)."""
    if target == "":
        return
    if not isinstance(target, str) or len(target) > MAX_TARGET:
        raise _bad("target", "a 'module:function' string", target)
    module, sep, name = target.partition(":")
    if module == "store" and sep and name.startswith("daskjobs-fn-") and name.isprintable():
        return
    if not (sep and _is_dotted(module) and _is_dotted(name)):
        raise _bad("target", "a 'module:function' string (dotted Python names)", target)


def _check_params(params: Any) -> None:
    if not isinstance(params, Mapping):
        raise _bad("params", "a mapping of argument names to JSON-able values", params)
    for key in params:
        if not (isinstance(key, str) and key):
            raise _bad("params", "argument names as non-empty strings", key)
    try:
        json.dumps(dict(params), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise JobSpecError(
            "params", f"JobSpec.params: expected JSON-able values, finite numbers ({e})"
        ) from None


def _check_resources(resources: Any) -> None:
    if not isinstance(resources, Mapping):
        raise _bad("resources", "a mapping such as {'GPU': 1}", resources)
    for key, amount in resources.items():
        if not (isinstance(key, str) and key and key.isprintable()):
            raise _bad("resources", "resource names as non-empty strings", key)
        ok = isinstance(amount, int | float) and not isinstance(amount, bool)
        if not (ok and math.isfinite(amount) and amount >= 0):
            raise JobSpecError(
                "resources",
                f"JobSpec.resources[{key!r}]: expected a number >= 0, got {_show(amount)}",
            )


def _check_spec(spec: JobSpec) -> None:
    """Every field of ``spec``, type and range: a :class:`JobSpecError` naming the first
    one that cannot be used (nothing else reaches the ledger or the scheduler)."""
    _text("name", spec.name, MAX_NAME)
    if not (isinstance(spec.kind, str) and spec.kind in KINDS):
        raise _bad("kind", f"one of {', '.join(KINDS)}", spec.kind)
    if spec.team is not None:  # None: the submitting client's team (the scheduler decides)
        _text("team", spec.team, MAX_NAME)
    _integer("parts", spec.parts, 1, MAX_INT32)
    if spec.kind != "inference" and spec.parts != 1:
        raise JobSpecError(
            "parts", f"JobSpec.parts: a {spec.kind} job has one part, got {spec.parts}"
        )
    _check_target(spec.target)
    _check_params(spec.params)
    _check_resources(spec.resources)
    _integer("priority", spec.priority, -MAX_INT32 - 1, MAX_INT32)
    _positive_or_none("deadline", spec.deadline)
    _integer("retries", spec.retries, 0, MAX_RETRIES)
    _positive_or_none("checkpoint_every", spec.checkpoint_every)
    if not (isinstance(spec.job_class, str) and spec.job_class in ("te", "be")):
        raise JobSpecError(
            "job_class",
            "JobSpec.job_class: expected 'te' (interactive) or 'be' (best-effort), "
            f"got {_show(spec.job_class)}",
        )
    acc = spec.accelerator
    if acc is not None and not (
        (isinstance(acc, str) and acc)
        or (isinstance(acc, tuple) and acc and all(isinstance(a, str) and a for a in acc))
    ):
        raise _bad("accelerator", "a type such as 'A100', a list of types, or None", acc)
    mem = spec.gpu_memory
    if mem is not None and (isinstance(mem, bool) or not isinstance(mem, str | int | float)):
        raise _bad("gpu_memory", "a size such as '40GB', a number of bytes, or None", mem)
    if spec.constraint is not None and not isinstance(spec.constraint, str):
        raise _bad(
            "constraint", "an expression over the worker's inventory, or None", spec.constraint
        )
    if spec.placement():
        from daskjobs.policies.resources import Request, RequestError

        for name, value in spec.placement().items():  # each alone: the error names it
            try:
                Request.from_annotations({name: value}, what="JobSpec")
            except RequestError as e:
                raise JobSpecError(name, str(e)) from None


#: A spec's fields, in order (what :meth:`JobSpec.from_json` knows).
_FIELDS = tuple(f.name for f in dataclasses.fields(JobSpec))


@dataclass(frozen=True)
class JobRecord:
    """A job as the ledger holds it now."""

    job_id: str
    spec: JobSpec
    state: str
    submitted: float
    updated: float
    reason: str | None = None


@dataclass(frozen=True)
class JobInfo:
    """A job as :func:`daskjobs.jobs.list` returns it: the ledger's record with its times
    as timezone-aware datetimes (UTC) and the spec's name, team, kind and parts at hand."""

    job_id: str
    name: str
    team: str
    kind: str
    parts: int
    state: str
    submitted: datetime
    updated: datetime
    reason: str | None
    spec: JobSpec

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> JobInfo:
        """From the service's JSON of a job (epoch seconds, the spec as JSON)."""
        spec = JobSpec.from_record(d["spec"])
        return cls(
            job_id=str(d["job_id"]),
            name=spec.name,
            team=spec.team or "",
            kind=spec.kind,
            parts=spec.parts,
            state=str(d["state"]),
            submitted=datetime.fromtimestamp(float(d["submitted"]), tz=timezone.utc),
            updated=datetime.fromtimestamp(float(d["updated"]), tz=timezone.utc),
            reason=d.get("reason"),
            spec=spec,
        )


@dataclass(frozen=True)
class Progress:
    """How far a job is, as :meth:`Job.wait <daskjobs.jobs.Job.wait>` reports it: parts
    committed of ``parts``, attempts running now, and the job's state."""

    job_id: str
    state: str
    parts: int
    committed: int
    running: int

    def line(self, name: str | None = None) -> str:
        """One line of text: ``job NAME: 3/10 parts committed, 2 running (running)``."""
        running = f", {self.running} running" if self.running else ""
        return (
            f"job {name or self.job_id}: {self.committed}/{self.parts} parts committed"
            f"{running} ({self.state})"
        )


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt as the ledger holds it now."""

    attempt_id: str
    job_id: str
    part: int
    token: int  # the fencing token: higher than every earlier attempt of this part
    state: str
    worker: str | None
    lease_until: float | None
    started: float
    updated: float
    reason: str | None = None


#: dask task states in which dask still holds an attempt that no worker acknowledged
#: (queued in the scheduler, or handed to a worker): the service keeps its lease.
HELD_BY_DASK = frozenset({"released", "waiting", "queued", "no-worker", "processing"})


def next_step(
    state: str | None,
    *,
    task_state: str | None,
    handed: float | None,
    now: float,
    launch_timeout: float,
    worker_seen: float | None = None,
    lease: float = math.inf,
) -> str:
    """What the jobs service does with an attempt it launched, the one place this rule is
    written. ``state`` is the attempt's state in the ledger if it is still live (else None),
    ``task_state`` dask's state of its task (None: dask does not know it, e.g. after a
    restart), ``handed`` when dask gave it to a worker, ``worker_seen`` when that worker
    last sent dask a heartbeat.

    * ``"drop"`` - the ledger ended the attempt (succeeded, failed, lost, cancelled,
      fenced): release its dask task;
    * ``"unknown"`` - launching, handed to a worker more than ``launch_timeout`` ago and
      never acknowledged: its outcome is unknown (reconciled: kept while dask says a
      worker has it, adopted when the worker reports, lost when its lease runs out);
    * ``"renew"`` - not acknowledged by a worker yet and dask still holds it (queued,
      or handed to a worker that still sends heartbeats): the service holds its lease;
    * ``"wait"`` - acknowledged (its worker's heartbeats hold the lease), or dask no
      longer has it, or the worker it was handed to has been silent for a lease: the
      lease decides. The service never renews a running attempt, so a paused or
      partitioned worker loses its part when its lease runs out.
    """
    if state is None:
        return "drop"
    if state == "running" or task_state not in HELD_BY_DASK:
        return "wait"
    if task_state == "processing" and worker_seen is not None and now - worker_seen > lease:
        return "wait"
    if (
        state == "launching"
        and task_state == "processing"
        and handed is not None
        and now - handed > launch_timeout
    ):
        return "unknown"
    return "renew"


def may_expire(now: float, reachable_since: float | None, lease: float) -> bool:
    """Whether leases may expire now: only once the ledger has answered every write
    promptly for a whole lease (``reachable_since``; None while it does not). While the
    database is unreachable or locked, workers cannot renew either: losing their
    attempts then would run healthy work twice."""
    return reachable_since is not None and now - reachable_since >= lease


def responsive(last_seen: Mapping[str, float], now: float, lease: float) -> list[str] | None:
    """Where a new attempt may go: the workers whose last heartbeat to dask came within a
    third of a lease of the latest one, or None (anywhere) when all did. dask keeps a
    silent worker (paused, partitioned) until its own timeout and would hand it new work
    that never starts.

    A third, not a whole lease: an attempt's lease runs out a lease after its last
    renewal, and renewals come every third of a lease, so when a paused worker's
    attempt is lost that worker has been silent for at least two thirds of a lease -
    its part never goes back to it. (dask's workers send heartbeats every 0.5 s on
    clusters of up to 10 workers, 1-2 s up to 200, more beyond: keep the lease above
    three times that.)

    Against the latest heartbeat, not ``now``: a scheduler whose event loop is slow (a
    loaded machine) hears every worker late, the healthy ones too; measured from ``now``
    they would all look silent and the part could go back to the paused worker. ``now``
    only bounds the latest heartbeat (one stamped later counts as now)."""
    if not last_seen:
        return None
    latest = min(now, max(last_seen.values()))
    alive = sorted(a for a, seen in last_seen.items() if latest - seen <= lease / 3)
    if len(alive) == len(last_seen):
        return None
    return alive
