"""Read a trace written by the recording plugin (``docs/reference/trace-format.md``) into Python
objects.

:func:`read_trace` checks every line and joins the records: one
:class:`TraceTask` per key (its graph record and its attempts in order), one
:class:`TraceWorker` per worker arrival, and each :class:`TraceAttempt`
assembled from its ``assigned``, ``started`` and ``finished`` records. Keys
written as JSON arrays (dask's tuple keys) come back as tuples.

A trace whose footer is missing (the scheduler died, or the file is still being
written) is read anyway and has ``complete == False``; an unterminated last line
of such a trace (a write cut short, possibly in the middle of a UTF-8 character)
is skipped and flagged in ``truncated``. Record types this reader does not know
are counted in ``skipped`` and otherwise ignored, so that a version-1 reader keeps
reading traces that gained record types; a different ``version`` is refused.

What is checked
===============

A trace is read by people and programs that will believe its numbers (the replay
turns them into a makespan), so a value that cannot be true is refused, with a
:class:`TraceError` naming the file, the line and the field, rather than replayed.
Every check is O(1) per record.

* **Form.** Each line is UTF-8 text holding one JSON object (``NaN`` and
  ``Infinity`` are not JSON; the recorder writes ``null``), with a string
  ``type``; the header comes first, once; nothing follows the footer. Each field
  this reader uses has its type: keys are strings, numbers or arrays of them,
  ``deps`` an array of keys, resources an object of numbers >= 0, and so on.
* **Magnitudes.** Times (``time``, ``submit``, ``started``, ``finished``, and the
  worker's ``worker_time``, ``compute_start``, ``compute_stop``) are seconds since
  the epoch between 0 and :data:`MAX_TIME` (1e10, the year 2286). Durations
  (``duration``, ``transfer``, ``compute_stop - compute_start``) are between 0 and
  :data:`MAX_SECONDS` (1e7 s, 116 days). Counts (``run_id``, ``nbytes``,
  ``memory_limit``, the footer's) are integers >= 0; ``nthreads`` is between 1
  and :data:`MAX_THREADS`. An estimate is a finite number >= 0 (what the plugin
  accepts); one above ``MAX_SECONDS`` is kept and noted.
* **The scheduler's clock.** Records are written in the order the scheduler's
  event loop emitted them, each stamped with ``time.time()``, so their ``time``
  never decreases, and none is before the header's ``started`` or after the
  footer's ``finished``. A step back of at most :data:`CLOCK_TOLERANCE` (1 s: the
  system clock stepped) is allowed and noted; a longer one is refused (one of the
  two lines named is wrong), as is a jump forward by more than ``MAX_SECONDS``
  between consecutive records. A graph's ``submit`` is not after its record's
  ``time``, and, unless the task was already on the scheduler when recording
  started (``existing``), not before the recording started.
* **Attempts.** The worker's clock may be offset from the scheduler's, so a worker
  time is never checked against a scheduler time; differences on one clock are:
  ``compute_start <= compute_stop``; ``duration`` (the sum of the compute
  intervals) at most ``compute_stop - compute_start``; and neither longer than the
  attempt lasted on the scheduler's clock (from its ``assigned`` record, else from
  its graph's ``submit``, to its ``finished`` record) plus ``CLOCK_TOLERANCE``;
  ``transfer`` (fetches summed, possibly overlapping) at most that per input.
  A task has one ``finished`` record per run id and one ``started`` record per run
  id and worker. A task does not depend on itself. An event's time is its record's.

What is noted, not refused (:attr:`Trace.notes`): small steps back of the
scheduler's clock, worker clocks more than :data:`SKEW_NOTE` seconds from the
scheduler's, a worker added twice without a removal, estimates above
``MAX_SECONDS``, a footer whose record count differs from the lines read (lines
lost or added after the run) or that counts records lost to errors.

This module does not import ``distributed``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

__all__ = [
    "CLOCK_TOLERANCE",
    "MAX_SECONDS",
    "MAX_THREADS",
    "MAX_TIME",
    "READ_VERSIONS",
    "SKEW_NOTE",
    "Trace",
    "TraceAttempt",
    "TraceError",
    "TraceTask",
    "TraceWorker",
    "read_trace",
]

#: Trace versions this reader understands.
READ_VERSIONS = (1,)

#: Latest time accepted, seconds since the epoch (the year 2286).
MAX_TIME = 1e10
#: Longest duration accepted (task compute, transfer, a gap between records): 116 days.
MAX_SECONDS = 1e7
#: Most threads a worker may have.
MAX_THREADS = 100_000
#: Seconds the scheduler's clock may step back between records (noted), and times may
#: stray before the header's ``started`` or after the footer's ``finished``.
CLOCK_TOLERANCE = 1.0
#: Seconds between a worker time and the scheduler's time of the same record above
#: which the worker's clock is noted as offset (the replay uses no worker time alone).
SKEW_NOTE = 60.0


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
    line: int | None = None  # line of the (last) graph record, for messages
    # the parameters the plugin read from the task's own call (its function's literal
    # arguments: the graph record's ``params``), for a task without a ``params`` annotation
    arguments: dict[str, Any] | None = None

    @property
    def params(self) -> dict[str, Any] | None:
        """The task's parameters, what a duration model learns from: its ``params``
        annotation (which a sweep gives each task: its labels and parameters), else what
        the plugin read from its call (:attr:`arguments`); None without."""
        p = self.annotations.get("params")
        if isinstance(p, Mapping):
            return dict(p)
        return dict(self.arguments) if self.arguments else None


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
    notes: list[str] = field(default_factory=list)  # suspicious but possible (module docs)
    header_line: int = 1

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


def _show(value: Any) -> str:
    """``repr(value)``, cut to one short line (a garbage value can be huge)."""
    r = repr(value)
    return r if len(r) <= 60 else f"{r[:40]}... ({len(r)} characters)"


def _key(value: Any) -> Hashable:
    if isinstance(value, list):
        return tuple(_key(v) for v in value)
    return value


def _real(v: Any) -> bool:
    """A JSON number that is finite as a float (a huge integer is not)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    if isinstance(v, int):
        return -(2**1023) < v < 2**1023
    return math.isfinite(v)


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63


def _is_key(v: Any, depth: int = 0) -> bool:
    if isinstance(v, str):
        return True
    if isinstance(v, bool):
        return False
    if isinstance(v, int | float):
        return _real(v)
    if isinstance(v, list) and depth < 16:
        return all(_is_key(x, depth + 1) for x in v)
    return False


def _numbers_finite(v: Any, depth: int = 0) -> bool:
    """Every number inside ``v`` (arrays nested) converts to a finite float."""
    if isinstance(v, list):
        return depth < 16 and all(_numbers_finite(x, depth + 1) for x in v)
    if isinstance(v, int | float) and not isinstance(v, bool):
        return _real(v)
    return True


_CHECKS: dict[str, Callable[[Any], bool]] = {
    "number": _real,
    "time": lambda v: _real(v) and 0 <= v <= MAX_TIME,
    "seconds": lambda v: _real(v) and 0 <= v <= MAX_SECONDS,
    "estimate": lambda v: _real(v) and v >= 0,
    "count": _integer,
    "threads": lambda v: _integer(v) and 1 <= v <= MAX_THREADS,
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "list": lambda v: isinstance(v, list),
    "dict": lambda v: isinstance(v, dict),
    "key": _is_key,
    "keys": lambda v: isinstance(v, list) and all(_is_key(x) for x in v),
    "amounts": lambda v: isinstance(v, dict) and all(_real(x) and x >= 0 for x in v.values()),
    "priority": lambda v: isinstance(v, list) and _numbers_finite(v),
}

_KIND = {
    "number": "a finite number",
    "time": f"a time in seconds since the epoch, between 0 and {MAX_TIME:g}",
    "seconds": f"seconds between 0 and {MAX_SECONDS:g}",
    "estimate": "a finite number of seconds >= 0",
    "count": "an integer >= 0",
    "threads": f"an integer between 1 and {MAX_THREADS}",
    "int": "an integer",
    "str": "a string",
    "bool": "true or false",
    "list": "a JSON array",
    "dict": "a JSON object",
    "key": "a task key (string, number or array of them)",
    "keys": "a JSON array of task keys (strings, numbers or arrays of them)",
    "amounts": "a JSON object of finite numbers >= 0",
    "priority": "a JSON array of finite numbers",
}


class _Line:
    def __init__(self, path: str, lineno: int, rec: dict[str, Any]) -> None:
        self.where = f"{path}:{lineno}"
        self.lineno = lineno
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
        if not _CHECKS[kind](value):
            raise self.fail(name, f"expected {_KIND[kind]}, got {_show(value)}")
        return value


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number (the recorder writes null)")


# -- reading --------------------------------------------------------------------------------


class _Reader:
    """The state of one read: the trace so far and what the cross-record checks need."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.trace: Trace | None = None
        self.open_attempt: dict[Hashable, TraceAttempt] = {}
        self.open_worker: dict[str, tuple[TraceWorker, int]] = {}
        self.finished_runs: dict[tuple[Hashable, int], int] = {}  # -> line
        self.started_runs: dict[tuple[Hashable, int, str | None], int] = {}  # -> line
        self.began: float | None = None  # the header's 'started' (recording began)
        self.last_time: float | None = None  # the latest scheduler time so far
        self.last_what = ""  # where it was read, for messages
        self.back_steps = 0
        self.back_max = 0.0
        self.back_line = 0
        self.skew = 0.0
        self.skew_worker: str | None = None
        self.big_estimates = 0
        self.readded: list[str] = []

    # -- the scheduler's clock --------------------------------------------------------------
    def clock(self, line: _Line, t: float) -> None:
        last = self.last_time
        if last is None:
            pass
        elif t < last:
            back = last - t
            if back > CLOCK_TOLERANCE:
                raise line.fail(
                    "time",
                    f"{t!r} is {back:.3g} s before {self.last_what} ({last!r}): records are "
                    "written in the scheduler's time order, so one of the two lines is wrong",
                )
            self.back_steps += 1
            if back > self.back_max:
                self.back_max, self.back_line = back, line.lineno
            return
        elif t - last > MAX_SECONDS:
            raise line.fail(
                "time",
                f"{t!r} is {t - last:.3g} s after {self.last_what} ({last!r}): more than "
                f"{MAX_SECONDS:g} s between two records is taken as a corrupt time",
            )
        self.last_time = t
        self.last_what = f"line {line.lineno}'s 'time'"

    def worker_clock(self, worker: str | None, worker_time: float | None, t: float) -> None:
        if worker_time is not None and abs(worker_time - t) > self.skew:
            self.skew, self.skew_worker = abs(worker_time - t), worker

    # -- the lines ----------------------------------------------------------------------------
    def header(self, line: _Line) -> Trace:
        if line.type != "header":
            raise TraceError(
                f"{line.where}: expected the trace header first, got a {line.type!r} record "
                "(is this a daskjobs trace?)"
            )
        version = line.get("version", "int")
        if version not in READ_VERSIONS:
            raise TraceError(
                f"{line.where}: trace version {_show(version)} is not supported; this daskjobs "
                f"reads version(s) {', '.join(map(str, READ_VERSIONS))}"
            )
        started = line.get("started", "time", required=False)
        line.get("policy", "str", required=False)
        line.get("settings", "dict", required=False)
        if started is not None:
            self.began = self.last_time = started
            self.last_what = f"the header's 'started' (line {line.lineno})"
        self.trace = Trace(path=self.path, header=line.rec, header_line=line.lineno)
        return self.trace

    def footer(self, trace: Trace, line: _Line) -> None:
        records = line.get("records", "count")
        line.get("dropped", "count")  # reported by Trace.dropped
        errors = line.get("errors", "count", required=False)
        finished = line.get("finished", "time", required=False)
        last = self.last_time
        if finished is not None and last is not None and finished < last - CLOCK_TOLERANCE:
            raise line.fail(
                "finished",
                f"{finished!r} is {last - finished:.3g} s before {self.last_what} ({last!r}): "
                "a record after the recording stopped",
            )
        trace.footer = line.rec
        read = trace.records + sum(trace.skipped.values())
        if records != read:
            trace.notes.append(
                f"the footer counts {records} records but {read} were read: lines were lost "
                "or added after the run"
            )
        if errors:
            trace.notes.append(f"the recorder lost {errors} record(s) to write errors")

    def finish(self, trace: Trace) -> None:
        notes = trace.notes
        if self.back_steps:
            notes.append(
                f"the scheduler's clock went back {self.back_steps} time(s), by up to "
                f"{self.back_max:.3g} s (line {self.back_line}): times taken as written"
            )
        if self.skew > SKEW_NOTE:
            notes.append(
                f"a worker's clock is {self.skew:.3g} s off the scheduler's "
                f"({self.skew_worker}): worker times are used only as differences"
            )
        if self.big_estimates:
            notes.append(
                f"{self.big_estimates} estimate(s) above {MAX_SECONDS:g} s: replayed as "
                "the plugin saw them"
            )
        if self.readded:
            notes.append(
                f"{len(self.readded)} worker-added record(s) for a worker already there "
                f"without a removal (e.g. line {self.readded[0]})"
            )

    def task(self, trace: Trace, key: Hashable) -> TraceTask:
        task = trace.tasks.get(key)
        if task is None:
            task = trace.tasks[key] = TraceTask(key, in_graph=False)
        return task

    def graph(self, trace: Trace, line: _Line) -> None:
        key = _key(line.get("key", "key"))
        deps = tuple(_key(d) for d in line.get("deps", "keys"))
        if key in deps:
            raise line.fail("deps", f"names the task itself ({_show(key)})")
        ann = line.get("annotations", "dict", required=False) or {}
        estimate = line.get("estimate", "estimate", required=False)
        source = line.get("estimate_source", "str", required=False)
        team = line.get("team", "str", required=False)
        stage = line.get("stage", "str", required=False)
        arguments = line.get("params", "dict", required=False)
        resources = line.get("resources", "amounts", required=False)
        user_priority = line.get("user_priority", "number", required=False) or 0
        priority = line.get("priority", "priority", required=False)
        submit = line.get("submit", "time", required=False)
        existing = bool(line.get("existing", "bool", required=False))
        t = line.rec["time"]
        if submit is not None:
            if submit > t + CLOCK_TOLERANCE:
                raise line.fail("submit", f"{submit!r} is after the record's time {t!r}")
            start = self.began
            if not existing and start is not None and submit < start - CLOCK_TOLERANCE:
                raise line.fail(
                    "submit",
                    f"{submit!r} is {start - submit:.3g} s before the recording started "
                    f"({start!r}), for a task that was not on the scheduler then",
                )
        if estimate is not None and estimate > MAX_SECONDS:
            self.big_estimates += 1
        task = self.task(trace, key)
        task.deps = deps
        task.annotations = ann
        task.estimate = estimate
        task.estimate_source = source
        task.team = team
        task.stage = stage
        task.arguments = arguments
        task.resources = resources
        task.user_priority = user_priority
        task.priority = tuple(priority) if priority is not None else None
        task.submit = submit
        task.existing = existing
        task.in_graph = True
        task.line = line.lineno

    def assigned(self, trace: Trace, line: _Line) -> None:
        key = _key(line.get("key", "key"))
        att = TraceAttempt(
            key, worker=line.get("worker", "str", required=False), assigned=line.rec["time"]
        )
        self.task(trace, key).attempts.append(att)
        # an unfinished previous attempt stays as it is (its end was lost)
        self.open_attempt[key] = att

    def started(self, trace: Trace, line: _Line) -> None:
        key = _key(line.get("key", "key"))
        run_id = line.get("run_id", "count", required=False)
        worker = line.get("worker", "str", required=False)
        worker_time = line.get("worker_time", "time", required=False)
        t = line.rec["time"]
        if run_id is not None:
            first = self.started_runs.setdefault((key, run_id, worker), line.lineno)
            if first != line.lineno:
                raise line.fail(
                    "run_id",
                    f"{run_id}: a second start of this run of {_show(key)} on the same worker "
                    f"(the first is on line {first}; a duplicated line?)",
                )
        self.worker_clock(worker, worker_time, t)
        att = self.open_attempt.get(key)
        if att is None or att.started is not None:  # no assignment recorded (or a second start)
            att = TraceAttempt(key)
            self.task(trace, key).attempts.append(att)
            self.open_attempt[key] = att
        att.started = t
        att.worker_start = worker_time
        att.started_run_id = run_id
        att.worker = worker or att.worker

    def finished(self, trace: Trace, line: _Line) -> None:
        key = _key(line.get("key", "key"))
        outcome = line.get("outcome", "str")
        state = line.get("state", "str", required=False)
        run_id = line.get("run_id", "count", required=False)
        worker = line.get("worker", "str", required=False)
        c_start = line.get("compute_start", "time", required=False)
        c_stop = line.get("compute_stop", "time", required=False)
        duration = line.get("duration", "seconds", required=False)
        transfer = line.get("transfer", "seconds", required=False)
        nbytes = line.get("nbytes", "count", required=False)
        error = line.get("error", "str", required=False)
        t = line.rec["time"]
        if run_id is not None:
            first = self.finished_runs.setdefault((key, run_id), line.lineno)
            if first != line.lineno:
                raise line.fail(
                    "run_id",
                    f"{run_id}: a second end of this run of {_show(key)} (the first is on line "
                    f"{first}; a duplicated line?)",
                )
        hull = None
        if c_start is not None and c_stop is not None:
            hull = c_stop - c_start
            if hull < 0:
                raise line.fail("compute_stop", f"{c_stop!r} is before compute_start {c_start!r}")
            if hull > MAX_SECONDS:
                raise line.fail(
                    "compute_stop",
                    f"{c_stop!r} is {hull:.6g} s after compute_start: more than {MAX_SECONDS:g} s",
                )
            if duration is not None and duration > hull * (1 + 1e-9) + 1e-6:
                raise line.fail(
                    "duration",
                    f"{duration!r} is longer than compute_stop - compute_start ({hull!r})",
                )
        self.worker_clock(worker, c_stop, t)
        task = self.task(trace, key)
        att = self.open_attempt.pop(key, None)
        if att is None:
            att = TraceAttempt(key)
            task.attempts.append(att)
        since, what = att.assigned, "its assigned record"
        if since is None and task.in_graph and not task.existing and task.submit is not None:
            since, what = task.submit, "its graph was submitted"
        if since is not None:
            lasted = t - since
            for name, value in (("duration", duration), ("compute_stop", hull)):
                if value is not None and value > lasted + CLOCK_TOLERANCE:
                    raise line.fail(
                        name,
                        f"{value!r} s of computation in an attempt that lasted {lasted:.3g} s "
                        f"on the scheduler's clock (since {what})",
                    )
            # fetches of several inputs may overlap and are summed: one span per input
            inputs = max(1, len(task.deps)) if task.in_graph else None
            if transfer is not None and inputs and transfer > inputs * (lasted + CLOCK_TOLERANCE):
                raise line.fail(
                    "transfer",
                    f"{transfer!r} s of fetching {inputs} input(s) in an attempt that lasted "
                    f"{lasted:.3g} s on the scheduler's clock (since {what})",
                )
        att.finished = t
        att.outcome = outcome
        att.state = state
        att.run_id = run_id
        att.worker = worker or att.worker
        att.compute_start = c_start
        att.compute_stop = c_stop
        att.duration = duration
        att.transfer = transfer
        att.nbytes = nbytes
        att.error = error

    def worker_added(self, trace: Trace, line: _Line) -> None:
        rec = line.rec
        w = TraceWorker(
            address=line.get("worker", "str"),
            name=rec.get("name"),
            host=line.get("host", "str", required=False),
            nthreads=line.get("nthreads", "threads"),
            resources=line.get("resources", "amounts", required=False) or {},
            memory_limit=line.get("memory_limit", "count", required=False),
            added=rec["time"],
            existing=bool(line.get("existing", "bool", required=False)),
        )
        if w.address in self.open_worker:
            self.readded.append(str(line.lineno))
        trace.workers.append(w)
        self.open_worker[w.address] = (w, line.lineno)

    def worker_removed(self, trace: Trace, line: _Line) -> None:
        address = line.get("worker", "str")
        w = self.open_worker.pop(address, None)
        if w is not None:
            w[0].removed = line.rec["time"]

    def event(self, trace: Trace, line: _Line) -> None:
        event = line.get("event", "dict")
        trace.events.append({**event, "time": line.rec["time"]})


_HANDLERS: Mapping[str, Callable[[_Reader, Trace, _Line], None]] = {
    "graph": _Reader.graph,
    "assigned": _Reader.assigned,
    "started": _Reader.started,
    "finished": _Reader.finished,
    "worker-added": _Reader.worker_added,
    "worker-removed": _Reader.worker_removed,
    "event": _Reader.event,
}


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and check the trace at ``path`` (see the module docs)."""
    path = os.fspath(path)
    reader = _Reader(path)
    trace: Trace | None = None
    with open(path, "rb") as f:
        lineno = 0
        for raw in f:
            lineno += 1
            cut = not raw.endswith(b"\n")  # only ever the last line
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                if cut and trace is not None:
                    trace.truncated = True  # a write cut short inside a character
                    break
                raise TraceError(
                    f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column "
                    f"{e.start + 1}): is this a daskjobs trace?"
                ) from None
            if not text.strip():
                continue
            try:
                rec = json.loads(text, parse_constant=_no_constant)
            except (ValueError, RecursionError) as e:
                if cut and trace is not None:
                    trace.truncated = True  # a write cut short
                    break
                raise TraceError(f"{path}:{lineno}: not valid JSON ({_one_line(e)})") from None
            if not isinstance(rec, dict):
                raise TraceError(
                    f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}"
                )
            if not isinstance(rec.get("type"), str):
                raise TraceError(f"{path}:{lineno}: field 'type' is missing or not a string")
            line = _Line(path, lineno, rec)
            if trace is None:
                trace = reader.header(line)
                continue
            if trace.footer is not None:
                raise TraceError(f"{path}:{lineno}: a {line.type!r} record after the footer")
            if line.type == "header":
                raise TraceError(
                    f"{path}:{lineno}: a second header (the first is on line "
                    f"{trace.header_line}): two traces in one file?"
                )
            if line.type == "footer":
                reader.footer(trace, line)
                continue
            handler = _HANDLERS.get(line.type)
            if handler is None:
                trace.skipped[line.type] = trace.skipped.get(line.type, 0) + 1
                continue
            reader.clock(line, line.get("time", "time"))
            handler(reader, trace, line)
            trace.records += 1
    if trace is None:
        raise TraceError(f"{path}:1: empty file, expected a daskjobs trace header")
    reader.finish(trace)
    return trace


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:200]
