"""Read a trace written by the recording plugin (``docs/trace.md``) into Python objects.

:func:`read_trace` checks every line and joins the records: one
:class:`TraceTask` per key (its graph record and its attempts in order), one
:class:`TraceWorker` per worker arrival, and each :class:`TraceAttempt`
assembled from its ``assigned``, ``started`` and ``finished`` records. Keys
written as JSON arrays (dask's tuple keys) come back as tuples.

A malformed line raises :class:`TraceError` naming the file, the line number and
the field. A trace whose footer is missing (the scheduler died, or the file is
still being written) is read anyway and has ``complete == False``; an
unterminated last line of such a trace (a write cut short) is skipped and
flagged in ``truncated``. Record types this reader does not know are counted in
``skipped`` and otherwise ignored, so that a version-1 reader keeps reading
traces that gained record types; a different ``version`` is refused.

This module does not import ``distributed``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "READ_VERSIONS",
    "Trace",
    "TraceAttempt",
    "TraceError",
    "TraceTask",
    "TraceWorker",
    "read_trace",
]

#: Trace versions this reader understands.
READ_VERSIONS = (1,)


class TraceError(ValueError):
    """A trace file that cannot be read: names the file, line and field."""


@dataclass(slots=True)
class TraceAttempt:
    """One run of a task on a worker. Times are scheduler wall-clock seconds
    unless prefixed ``worker_`` or ``compute_`` (the worker's clock)."""

    key: Hashable
    worker: str | None = None
    assigned: float | None = None  # the scheduler sent it to ``worker``
    started: float | None = None  # the scheduler heard it really started
    worker_start: float | None = None  # ... at this time on the worker's clock
    started_run_id: int | None = None
    finished: float | None = None  # the scheduler heard the attempt ended
    run_id: int | None = None  # dask's run id, from the finished record
    state: str | None = None  # the task's state after the attempt
    outcome: str | None = None  # memory | erred | released | ... (None: no end recorded)
    compute_start: float | None = None
    compute_stop: float | None = None
    duration: float | None = None  # compute seconds measured by the worker
    transfer: float | None = None
    nbytes: int | None = None
    error: str | None = None

    @property
    def wait(self) -> float | None:
        """Seconds between assignment and the true start (both scheduler times)."""
        if self.assigned is None or self.started is None:
            return None
        return self.started - self.assigned


@dataclass(slots=True)
class TraceTask:
    """A task's graph record and its attempts, in order."""

    key: Hashable
    deps: tuple[Hashable, ...] = ()
    annotations: dict[str, Any] = field(default_factory=dict)
    estimate: float | None = None
    estimate_source: str | None = None
    team: str | None = None
    stage: str | None = None
    resources: dict[str, Any] | None = None
    user_priority: float = 0
    priority: tuple[Any, ...] | None = None
    submit: float | None = None
    existing: bool = False  # already on the scheduler when recording started
    in_graph: bool = True  # False: attempts seen without a graph record
    attempts: list[TraceAttempt] = field(default_factory=list)

    @property
    def outcome(self) -> str | None:
        """Outcome of the last attempt (``None`` if it never ran or did not end)."""
        return self.attempts[-1].outcome if self.attempts else None


@dataclass(slots=True)
class TraceWorker:
    """One arrival of a worker (a worker that reconnects appears again)."""

    address: str
    name: Any = None
    host: str | None = None
    nthreads: int = 0
    resources: dict[str, Any] = field(default_factory=dict)
    memory_limit: int | None = None
    added: float | None = None
    removed: float | None = None
    existing: bool = False  # already connected when recording started


@dataclass
class Trace:
    """A whole trace. ``complete`` is False when the footer is missing."""

    path: str
    header: dict[str, Any]
    tasks: dict[Hashable, TraceTask] = field(default_factory=dict)
    workers: list[TraceWorker] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    footer: dict[str, Any] | None = None
    truncated: bool = False
    skipped: dict[str, int] = field(default_factory=dict)
    records: int = 0  # records read, header and footer excluded

    @property
    def version(self) -> int:
        return int(self.header["version"])

    @property
    def complete(self) -> bool:
        return self.footer is not None

    @property
    def dropped(self) -> int | None:
        """Records the recorder dropped (queue full); ``None`` without a footer."""
        return None if self.footer is None else int(self.footer.get("dropped", 0))

    def attempts(self) -> Iterator[TraceAttempt]:
        for task in self.tasks.values():
            yield from task.attempts


# -- checking fields ------------------------------------------------------------------------


def _key(value: Any) -> Hashable:
    if isinstance(value, list):
        return tuple(_key(v) for v in value)
    return value


class _Line:
    def __init__(self, path: str, lineno: int, rec: dict[str, Any]) -> None:
        self.where = f"{path}:{lineno}"
        self.rec = rec
        self.type: str = rec["type"]  # checked to be a string by the caller

    def fail(self, name: str, problem: str) -> TraceError:
        return TraceError(f"{self.where}: {self.type!r} record: field {name!r} {problem}")

    def get(self, name: str, kind: str, *, required: bool = True) -> Any:
        rec = self.rec
        if name not in rec or rec[name] is None:
            if required:
                raise self.fail(name, "is missing")
            return None
        value = rec[name]
        ok = _CHECKS[kind](value)
        if not ok:
            raise self.fail(name, f"expected {_KIND[kind]}, got {value!r}")
        return value


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


_CHECKS: dict[str, Any] = {
    "number": _is_number,
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "list": lambda v: isinstance(v, list),
    "dict": lambda v: isinstance(v, dict),
    "key": lambda v: isinstance(v, str | int | float | list) and not isinstance(v, bool),
}

_KIND = {
    "number": "a finite number",
    "int": "an integer",
    "str": "a string",
    "list": "a JSON array",
    "dict": "a JSON object",
    "key": "a task key (string, number or array)",
}


# -- reading --------------------------------------------------------------------------------


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and check the trace at ``path`` (see the module docs)."""
    path = os.fspath(path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.split("\n")
    last_unterminated = not text.endswith("\n")
    if not last_unterminated:
        lines.pop()  # the empty string after the final newline
    trace: Trace | None = None
    open_attempt: dict[Hashable, TraceAttempt] = {}
    open_worker: dict[str, TraceWorker] = {}
    for i, raw in enumerate(lines):
        lineno = i + 1
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError as e:
            if lineno == len(lines) and last_unterminated and trace is not None:
                trace.truncated = True  # a write cut short: only ever the last line
                break
            raise TraceError(f"{path}:{lineno}: not valid JSON ({e})") from None
        if not isinstance(rec, dict):
            raise TraceError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
        if not isinstance(rec.get("type"), str):
            raise TraceError(f"{path}:{lineno}: field 'type' is missing or not a string")
        line = _Line(path, lineno, rec)
        if trace is None:
            trace = _header(line, path)
            continue
        if trace.footer is not None:
            raise TraceError(f"{path}:{lineno}: a {line.type!r} record after the footer")
        if line.type == "footer":
            line.get("records", "int")
            line.get("dropped", "int")
            trace.footer = rec
            continue
        handler = _HANDLERS.get(line.type)
        if handler is None:
            trace.skipped[line.type] = trace.skipped.get(line.type, 0) + 1
            continue
        line.get("time", "number")
        handler(trace, line, open_attempt, open_worker)
        trace.records += 1
    if trace is None:
        raise TraceError(f"{path}: empty file, expected a daskjobs trace header on line 1")
    return trace


def _header(line: _Line, path: str) -> Trace:
    if line.type != "header":
        raise TraceError(
            f"{line.where}: expected the trace header first, got a {line.type!r} record "
            "(is this a daskjobs trace?)"
        )
    version = line.get("version", "int")
    if version not in READ_VERSIONS:
        raise TraceError(
            f"{line.where}: trace version {version} is not supported; this daskjobs reads "
            f"version(s) {', '.join(map(str, READ_VERSIONS))}"
        )
    return Trace(path=path, header=line.rec)


def _task(trace: Trace, key: Hashable) -> TraceTask:
    task = trace.tasks.get(key)
    if task is None:
        task = trace.tasks[key] = TraceTask(key, in_graph=False)
    return task


def _graph(trace: Trace, line: _Line, *_: Any) -> None:
    key = _key(line.get("key", "key"))
    deps = line.get("deps", "list")
    ann = line.get("annotations", "dict", required=False) or {}
    estimate = line.get("estimate", "number", required=False)
    resources = line.get("resources", "dict", required=False)
    user_priority = line.get("user_priority", "number", required=False) or 0
    priority = line.get("priority", "list", required=False)
    submit = line.get("submit", "number", required=False)
    rec = line.rec
    task = _task(trace, key)
    task.deps = tuple(_key(d) for d in deps)
    task.annotations = ann
    task.estimate = estimate
    task.estimate_source = rec.get("estimate_source")
    task.team = rec.get("team")
    task.stage = rec.get("stage")
    task.resources = resources
    task.user_priority = user_priority
    task.priority = tuple(priority) if priority is not None else None
    task.submit = submit
    task.existing = bool(rec.get("existing", False))
    task.in_graph = True


def _assigned(
    trace: Trace, line: _Line, open_attempt: dict[Hashable, TraceAttempt], *_: Any
) -> None:
    key = _key(line.get("key", "key"))
    att = TraceAttempt(
        key, worker=line.get("worker", "str", required=False), assigned=line.rec["time"]
    )
    _task(trace, key).attempts.append(att)
    open_attempt[key] = att  # an unfinished previous attempt stays as it is (its end was lost)


def _started(
    trace: Trace, line: _Line, open_attempt: dict[Hashable, TraceAttempt], *_: Any
) -> None:
    key = _key(line.get("key", "key"))
    run_id = line.get("run_id", "int", required=False)
    att = open_attempt.get(key)
    if att is None or att.started is not None:  # no assignment recorded (or a second start)
        att = TraceAttempt(key)
        _task(trace, key).attempts.append(att)
        open_attempt[key] = att
    att.started = line.rec["time"]
    att.worker_start = line.get("worker_time", "number", required=False)
    att.started_run_id = run_id
    att.worker = line.get("worker", "str", required=False) or att.worker


def _finished(
    trace: Trace, line: _Line, open_attempt: dict[Hashable, TraceAttempt], *_: Any
) -> None:
    key = _key(line.get("key", "key"))
    att = open_attempt.pop(key, None)
    if att is None:
        att = TraceAttempt(key)
        _task(trace, key).attempts.append(att)
    att.finished = line.rec["time"]
    att.outcome = line.get("outcome", "str")
    att.state = line.get("state", "str", required=False)
    att.run_id = line.get("run_id", "int", required=False)
    att.worker = line.get("worker", "str", required=False) or att.worker
    att.compute_start = line.get("compute_start", "number", required=False)
    att.compute_stop = line.get("compute_stop", "number", required=False)
    att.duration = line.get("duration", "number", required=False)
    att.transfer = line.get("transfer", "number", required=False)
    att.nbytes = line.get("nbytes", "int", required=False)
    att.error = line.rec.get("error")


def _worker_added(trace: Trace, line: _Line, _a: Any, open_worker: dict[str, TraceWorker]) -> None:
    rec = line.rec
    w = TraceWorker(
        address=line.get("worker", "str"),
        name=rec.get("name"),
        host=line.get("host", "str", required=False),
        nthreads=line.get("nthreads", "int"),
        resources=line.get("resources", "dict", required=False) or {},
        memory_limit=line.get("memory_limit", "int", required=False),
        added=rec["time"],
        existing=bool(rec.get("existing", False)),
    )
    trace.workers.append(w)
    open_worker[w.address] = w


def _worker_removed(
    trace: Trace, line: _Line, _a: Any, open_worker: dict[str, TraceWorker]
) -> None:
    address = line.get("worker", "str")
    w = open_worker.pop(address, None)
    if w is not None:
        w.removed = line.rec["time"]


def _event(trace: Trace, line: _Line, *_: Any) -> None:
    event = line.get("event", "dict")
    trace.events.append({"time": line.rec["time"], **event})


_HANDLERS: Mapping[str, Any] = {
    "graph": _graph,
    "assigned": _assigned,
    "started": _started,
    "finished": _finished,
    "worker-added": _worker_added,
    "worker-removed": _worker_removed,
    "event": _event,
}
