"""Turn a recorded trace (``docs/trace.md``) into simulator tasks and a cluster.

What comes from where
=====================

* **Tasks** (:class:`daskjobs.sim.Task`): one per key that has a finished
  attempt. ``duration`` is the worker-measured compute time of the attempt that
  produced the result (the last one), divided by the measured speed of the
  worker that ran it (so it is the time on a nominal worker), plus the fitted
  per-task ``overhead`` (below). The recorded ``transfer`` time (fetching
  inputs from other workers) is *not* added: dask fetches on the worker's event
  loop, not on an executor thread, so a transfer holds no slot; when a slot did
  wait for one, the wait is inside the gaps the overhead is fitted from.
  ``estimate`` is what the plugin
  estimated at the time (``null`` estimates fall back to the plugin's
  ``default_estimate``); ``team``, ``deps`` and ``submit`` (seconds after the
  first submission, plus the fitted ``startup`` latency) come from the graph
  records, and so do ``stage`` (the recorded stage, else dask's key prefix) and
  ``params`` (the ``params`` annotation: what a replay that learns estimates,
  ``replay(..., learn=True)``, learns from). ``cores`` is the task's
  ``cores``/``CPU``/``threads`` resource if it has one, else 1. ``speculate``
  follows the ``speculate`` annotation. Tasks are listed by submission time,
  then by dask's own order (the recorded priority tuple without the plugin
  policy's key), so the simulator's ties (FIFO within a submission, equal
  estimates) break the way dask breaks them, and a what-if policy does not
  inherit the recorded policy's order.
* **Cluster** (:class:`daskjobs.sim.Cluster`): one node per worker that ran an
  attempt, with ``nthreads`` slots (the most common value if workers differ;
  the simulator's nodes are all alike). Nodes are ordered fastest first, so
  the simulator's first-fit ties go to the faster worker. Each worker's
  measured slow-down becomes the node's ``slow`` factor, and the share of
  attempts that failed (``erred``, or lost with their worker) the
  ``failure_rate``.

What dask adds, fitted from the trace
=====================================

* ``overhead`` (seconds per task): the slot capacity dask lost while work
  waited, spread over the tasks. On the scheduler's clock, a task *waits* from
  when the simulator could start it (its submission plus ``startup``, its
  inputs finished) until its first attempt starts, and a slot *computes*
  during ``[finished - duration, finished]`` of each attempt; at each moment
  ``min(free slots, waiting tasks)`` slots are lost (the simulator, with one
  central queue, would have started that many tasks there), and the integral
  over the run, ``lost``, divided by the number of tasks is the overhead. It
  holds whatever kept a free slot from waiting work: the scheduler round trip,
  a root task held in dask's queue, a task assigned eagerly to another
  worker's queue, a transfer, the event loop or the GIL being busy. Free slots
  with nothing waiting are idle (the shape of the graph), not lost. Adding the
  overhead to every task gives back, in the replay, the slot-seconds the
  recording lost. ``compute_share`` is the share of the recorded slot-seconds
  spent computing: well under 1/2 means the run was bound by dask's per-task
  costs rather than by compute, and a what-if on a bigger cluster is then
  optimistic (the overhead is replayed per slot; on a LocalCluster it is one
  event loop for everyone).
* ``dep_latency`` (diagnostic, not replayed): from a task's last input
  finishing to its start (both scheduler-clock report arrivals), for
  dependents whose worker had a free slot then; the median. In the replay a
  dependent may start as soon as its inputs end, and its ``overhead`` stands in
  for the latency; a latency well above the overhead means a deep chain of
  dependents replays short by about depth x the difference.
* ``startup`` (seconds per graph submission): from a graph's arrival to the
  first ``started`` report of one of its tasks (both on the scheduler's clock),
  the median over submissions. It shifts every submission time.
* ``speed`` (per worker): the median, over the worker's successful attempts, of
  ``duration / reference``, where the reference is the task's annotated
  estimate (when the user gave one) or else the median duration of its stage,
  divided by the same median over all workers. Values within
  :data:`SPEED_NOISE` of 1 are taken as 1 (the measurement cannot tell them
  apart on small traces).

A trace without a footer (a crashed run) is read for what it holds: tasks that
never finished are left out, with their dependents, and the loss is listed in
:attr:`Loaded.notes`.

This module does not import ``distributed``.
"""

from __future__ import annotations

import bisect
import math
import os
import statistics
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from daskjobs import _defaults
from daskjobs.policies.speculation import Speculation
from daskjobs.sim.model import Cluster, Task
from daskjobs.trace import (
    CLOCK_TOLERANCE,
    MAX_SECONDS,
    Trace,
    TraceAttempt,
    TraceError,
    TraceTask,
    read_trace,
)

__all__ = ["SPEED_NOISE", "Fit", "Loaded", "ReplayError", "WorkerInfo", "load"]

#: Measured slow-downs within this factor of 1 are treated as 1.
SPEED_NOISE = 1.15


class ReplayError(TraceError):
    """A trace that cannot be replayed (valid JSON, but nothing usable in it)."""


@dataclass(frozen=True, slots=True)
class Fit:
    """What dask adds on top of the compute time, fitted from the trace."""

    overhead: float  # seconds per task: slot capacity lost while work waited, per task
    overhead_samples: int  # tasks the lost capacity is spread over
    startup: float  # seconds from graph arrival to the first start
    startup_samples: int
    lost: float = 0.0  # slot-seconds no task computed on while some task waited
    compute_share: float = math.nan  # share of the recorded slot-seconds spent computing
    dep_latency: float = math.nan  # diagnostic: last input's end -> dependent's start
    dep_latency_samples: int = 0
    transfer: float = 0.0  # recorded input-transfer seconds (not replayed on a slot)
    transfer_tasks: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "overhead_s": self.overhead,
            "overhead_samples": self.overhead_samples,
            "lost_slot_s": self.lost,
            "compute_share": None if math.isnan(self.compute_share) else self.compute_share,
            "startup_s": self.startup,
            "startup_samples": self.startup_samples,
            "dep_latency_s": None if math.isnan(self.dep_latency) else self.dep_latency,
            "dep_latency_samples": self.dep_latency_samples,
            "transfer_s": self.transfer,
            "transfer_tasks": self.transfer_tasks,
        }


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A recorded worker as replayed: node index, threads, measured slow-down."""

    address: str
    node: int
    nthreads: int
    speed: float  # measured slow-down (1.0 nominal, 2.0 twice as slow)
    measured: float  # the raw measurement before the noise band
    attempts: int


@dataclass
class Recorded:
    """How the recorded run went (scheduler clock, seconds from the first submission)."""

    makespan: float
    t0: float  # scheduler time of the first submission
    attempts: int
    failed_attempts: int
    waste: float  # slot-seconds of attempts that failed
    busy: float  # slot-seconds of all attempts (started -> finished)
    intervals: list[tuple[float, float]] = field(repr=False, default_factory=list)
    team_wait: dict[str, float] = field(default_factory=dict)  # median end - submit
    team_last: dict[str, float] = field(default_factory=dict)
    # backup copies the plugin ran (its audit events): launched, won, lost, failed, started
    backups: dict[str, int] = field(default_factory=dict)


@dataclass
class Loaded:
    """A trace ready to replay: tasks, cluster, the recorded run and the fit."""

    path: str
    policy: str | None  # the policy the plugin ran (None: not recorded)
    settings: dict[str, Any]
    tasks: list[Task]
    cluster: Cluster
    workers: list[WorkerInfo]
    fit: Fit
    recorded: Recorded
    complete: bool
    notes: list[str] = field(default_factory=list)
    stages: dict[Hashable, str] = field(default_factory=dict, repr=False)  # tid -> stage
    compute: dict[Hashable, float] = field(default_factory=dict, repr=False)  # nominal seconds
    # the recorded run's speculation settings (None: off), replayed as recorded
    speculation: Speculation | None = None
    # where each task's first attempt ran and when it started: (node, start), by tid
    placement: dict[Hashable, tuple[int, float]] = field(default_factory=dict, repr=False)
    # when the plugin's periodic speculation check ran, as seconds from the first
    # submission modulo ``speculation.interval`` (0 if the trace does not say)
    check_phase: float = 0.0
    # the recorded backup copies: task id -> how its last race ended ("won": the copy
    # won, "lost", "failed", "unsettled": still running when recording stopped)
    copies: dict[Hashable, str] = field(default_factory=dict, repr=False)
    # the tasks whose estimate was the user's annotation (the others' a replay that
    # learns estimates afresh: ``replay(..., learn=True)``)
    annotated: frozenset[Hashable] = field(default_factory=frozenset, repr=False)

    @property
    def nodes(self) -> int:
        return self.cluster.nodes

    @property
    def cores_per_node(self) -> int:
        return self.cluster.cores_per_node


def _done(a: TraceAttempt) -> bool:
    return a.finished is not None and a.outcome is not None


def _final(task: TraceTask) -> TraceAttempt | None:
    """The attempt whose end is the task's end: the last finished one with a duration."""
    for a in reversed(task.attempts):
        if _done(a) and a.outcome in ("memory", "erred") and a.state != "released":
            return a
    return None


def _duration(a: TraceAttempt) -> float | None:
    if a.duration is not None:
        return float(a.duration)
    if a.compute_start is not None and a.compute_stop is not None:
        return max(0.0, a.compute_stop - a.compute_start)
    return None


def _cores(task: TraceTask) -> int:
    res = task.resources or {}
    for name in ("cores", "CPU", "cpu", "threads"):
        v = res.get(name)
        if isinstance(v, int | float) and not isinstance(v, bool) and v >= 1:
            return math.ceil(v)
    return 1


def _median(xs: Iterable[float]) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else math.nan


def _speeds(
    tasks: list[tuple[TraceTask, TraceAttempt, float]],
    stage_of: dict[Hashable, str],
    losers: Sequence[tuple[TraceAttempt, float]] = (),
) -> dict[str, float]:
    """Raw slow-down per worker: median duration / reference, normalised to all workers.

    A worker that finished nothing, every task of it beaten by a backup copy, is
    measured from its losing attempts: ``elapsed until the race was settled /
    reference`` is a lower bound of its slow-down (as the live plugin learns it)."""
    by_stage: dict[str, list[float]] = {}
    for t, _a, d in tasks:
        by_stage.setdefault(stage_of[t.key], []).append(d)
    stage_median = {s: _median(ds) for s, ds in by_stage.items()}
    ratios: dict[str, list[float]] = {}
    for t, a, d in tasks:
        if a.outcome != "memory" or a.worker is None:
            continue
        ref = _reference(t, stage_median, stage_of)
        if ref > 0 and d > 0:
            ratios.setdefault(a.worker, []).append(d / ref)
    every = [r for rs in ratios.values() for r in rs]
    if not every:
        return {}
    overall = _median(every)
    out = {w: _median(rs) / overall for w, rs in ratios.items()}
    ref_of = {t.key: _reference(t, stage_median, stage_of) for t, _a, _d in tasks}
    bounds: dict[str, list[float]] = {}
    for a, end in losers:
        b = _begin(a)
        ref = ref_of.get(a.key, math.nan)
        if a.worker is None or a.worker in out or b is None or not ref > 0:
            continue
        if end > b:
            bounds.setdefault(a.worker, []).append((end - b) / ref)
    for w, rs in bounds.items():
        out[w] = max(1.0, _median(rs) / overall)
    return out


def _reference(
    t: TraceTask, stage_median: dict[str, float], stage_of: dict[Hashable, str]
) -> float:
    if t.estimate_source == "annotation" and t.estimate:
        return float(t.estimate)
    return stage_median[stage_of[t.key]]


def load(
    trace: Trace | str | os.PathLike[str],
    *,
    overhead: float | None = None,
    startup: float | None = None,
    speeds: bool = True,
) -> Loaded:
    """Read ``trace`` (a path or a :class:`Trace`) into tasks, a cluster and a fit.

    ``overhead`` and ``startup`` override the fitted values (seconds);
    ``speeds=False`` takes every worker as nominal. Raises :class:`ReplayError`
    when the trace has no finished attempt, naming the file.
    """
    if not isinstance(trace, Trace):
        trace = read_trace(trace)
    path = trace.path
    notes: list[str] = []
    if not trace.complete:
        notes.append(
            "the trace has no footer (the run crashed or was still recording): "
            "replaying what it holds"
        )
    if trace.truncated:
        notes.append("its last line was cut short and was skipped")
    if trace.dropped:
        notes.append(f"the recorder dropped {trace.dropped} records: some attempts may be missing")
    notes += trace.notes
    if trace.skipped:
        kinds = ", ".join(f"{k!r} x{n}" for k, n in sorted(trace.skipped.items()))
        notes.append(f"records of types this reader does not know were skipped: {kinds}")
    settings = _checked_settings(trace)
    default_estimate = float(settings.get("default_estimate") or 1.0)
    recorded_spec = _speculation(settings, notes)

    # -- backup copies: the winner's end to the winner, the loser apart ------------------
    races = _races(trace)
    losers: list[tuple[TraceAttempt, float]] = []
    copies_started = 0
    if races:
        tasks = dict(trace.tasks)
        for key, rs in races.items():
            atts, lost_races, n = _split_races(tasks[key], rs)
            tasks[key] = replace(tasks[key], attempts=atts)
            losers += lost_races
            copies_started += n
        trace = replace(trace, tasks=tasks)
        if recorded_spec is None:
            notes.append(
                "the trace has backup copies but no speculation settings: "
                "replayed without speculation"
            )

    # -- the tasks that ended --------------------------------------------------------------
    ended: list[tuple[TraceTask, TraceAttempt, float]] = []
    unfinished: list[Hashable] = []
    for t in trace.tasks.values():
        if not t.attempts:
            if not t.existing:
                unfinished.append(t.key)
            continue
        a = _final(t)
        d = _duration(a) if a is not None else None
        if a is None or d is None:
            unfinished.append(t.key)
            continue
        ended.append((t, a, d))
    if not ended:
        raise ReplayError(
            f"{path}: no finished attempt with a measured duration in this trace "
            f"({len(trace.tasks)} tasks, {sum(1 for _ in trace.attempts())} attempts): "
            "nothing to replay"
        )
    # drop tasks whose inputs never finished (a crashed run), transitively
    keep = {t.key for t, _, _ in ended}
    known = set(trace.tasks)
    lost = set(unfinished)
    changed = True
    while changed:
        changed = False
        for t, _, _ in ended:
            if t.key in keep and any(d in lost for d in t.deps):
                keep.discard(t.key)
                lost.add(t.key)
                changed = True
    ended = [x for x in ended if x[0].key in keep]
    _refuse_cycles(path, ended)
    if unfinished:
        notes.append(
            f"{len(unfinished)} task(s) never finished in the trace and are left out "
            f"(e.g. {unfinished[0]!r})"
        )

    stage_of: dict[Hashable, str] = {}
    for t, _, _ in ended:
        stage_of[t.key] = t.stage or _prefix(t.key)

    # -- workers ---------------------------------------------------------------------------
    threads: dict[str, int] = {}
    for w in trace.workers:
        threads[w.address] = max(threads.get(w.address, 0), w.nthreads)
    used: Counter[str] = Counter()
    for t in trace.tasks.values():
        for a in t.attempts:
            if _done(a) and a.worker is not None:
                used[a.worker] += 1
    for a, _end in losers:  # a worker whose every task lost its race still ran them
        if a.worker is not None and a.key in keep:
            used.setdefault(a.worker, 0)
    unannounced = sorted(a for a in used if a not in threads)
    for addr in unannounced:
        threads[addr] = 0
    if unannounced and threads.keys() - set(unannounced):
        notes.append(
            f"{len(unannounced)} worker(s) ran tasks without a worker-added record "
            f"(e.g. {unannounced[0]!r}): taken as nodes like the others"
        )
    known_threads = [n for a, n in threads.items() if a in used and n > 0]
    if not known_threads:
        known_threads = [n for n in threads.values() if n > 0] or [1]
        notes.append("no worker-added record for the workers that ran tasks: 1 slot each assumed")
    cpn = Counter(known_threads).most_common(1)[0][0]
    if len(set(known_threads)) > 1:
        notes.append(
            f"workers have different thread counts {sorted(set(known_threads))}: "
            f"replayed with {cpn} slots each"
        )
    for addr in threads:
        if threads[addr] <= 0:
            threads[addr] = cpn
    raw = _speeds(ended, stage_of, losers) if speeds else {}
    addrs = sorted(used, key=lambda w: (raw.get(w, 1.0), w)) or ["(unknown)"]
    workers: list[WorkerInfo] = []
    slow: dict[int, float] = {}
    for i, addr in enumerate(addrs):
        r = raw.get(addr, 1.0)
        s = r if (r > SPEED_NOISE or r < 1 / SPEED_NOISE) else 1.0
        workers.append(WorkerInfo(addr, i, threads.get(addr, cpn), s, r, used.get(addr, 0)))
        if s != 1.0:
            slow[i] = s
    speed_of = {w.address: w.speed for w in workers}

    # -- the fit ---------------------------------------------------------------------------
    submits: dict[float, float] = {}
    for t in trace.tasks.values():
        if t.submit is None or t.existing:
            continue
        for a in t.attempts:
            if a.started is None:
                continue
            lag = a.started - t.submit
            if lag >= 0 and lag < submits.get(t.submit, math.inf):
                submits[t.submit] = lag
            break
    fitted_startup = _median(submits.values()) if submits else 0.0
    if startup is None:
        startup = fitted_startup
    slots = len(workers) * cpn  # the replayed cluster's slots
    losers = [(a, end) for a, end in losers if a.key in keep]
    lost_s, computing = _lost_capacity(trace, ended, keep, float(startup), slots, losers)
    fitted_overhead = lost_s / len(ended)
    if overhead is None:
        overhead = fitted_overhead
    latency = _dep_latency(ended, threads, cpn)
    transfers = [a.transfer for _, a, _ in ended if a.transfer]
    fit = Fit(
        float(overhead),
        len(ended),
        float(startup),
        len(submits),
        lost=lost_s,
        compute_share=computing,
        dep_latency=_median(latency),
        dep_latency_samples=len(latency),
        transfer=float(sum(transfers)),
        transfer_tasks=len(transfers),
    )

    # -- the recorded run ------------------------------------------------------------------
    submit_times = [t.submit for t, _, _ in ended if t.submit is not None and not t.existing]
    first_start = min((a.started or a.assigned or a.finished or math.inf) for t, a, _ in ended)
    t0 = min(submit_times) if submit_times else first_start
    t_end = max(a.finished for _, a, _ in ended if a.finished is not None)
    intervals: list[tuple[float, float]] = []
    n_att = n_fail = 0
    waste = busy = 0.0
    for t in trace.tasks.values():
        if t.key not in keep:
            continue
        final = _final(t)
        for a in t.attempts:
            if not _done(a):
                continue
            n_att += 1
            assert a.finished is not None
            begin = a.started if a.started is not None else a.assigned
            if begin is None:
                begin = a.finished - (_duration(a) or 0.0)
            intervals.append((begin - t0, a.finished - t0))
            busy += a.finished - begin
            if a is not final:
                n_fail += 1
                waste += a.finished - begin
    for a, end in losers:  # a copy that lost its race: waste, not a failure
        begin = _begin(a)
        if begin is not None and end > begin:
            intervals.append((begin - t0, end - t0))
            busy += end - begin
            waste += end - begin
    team_ends: dict[str, list[float]] = {}
    team_last: dict[str, float] = {}
    for t, a, _ in ended:
        team = t.team or "default"
        sub = t.submit if t.submit is not None else t0
        assert a.finished is not None
        team_ends.setdefault(team, []).append(a.finished - sub)
        team_last[team] = max(team_last.get(team, 0.0), a.finished - t0)
    recorded = Recorded(
        makespan=t_end - t0,
        t0=t0,
        attempts=n_att,
        failed_attempts=n_fail,
        waste=waste,
        busy=busy,
        intervals=intervals,
        team_wait={k: _median(v) for k, v in team_ends.items()},
        team_last=team_last,
        backups=_backup_counts(races, copies_started),
    )

    # -- where dask put each task: its first attempt's worker, and when it started there ---
    node_of = {w.address: w.node for w in workers}
    placement: dict[Hashable, tuple[int, float]] = {}
    for t, a, _d in ended:
        first = t.attempts[0] if t.attempts else a
        node = node_of.get(first.worker or "")
        when = first.started if first.started is not None else first.assigned
        if node is not None and when is not None:
            placement[t.key] = (node, when - t0)

    # -- simulator tasks, in the order dask ran ties: the recorded priority ---------------
    ended.sort(key=_order_key)
    sim_tasks: list[Task] = []
    compute: dict[Hashable, float] = {}
    annotated: set[Hashable] = set()
    for t, a, d in ended:
        sp = speed_of.get(a.worker or "", 1.0)
        compute[t.key] = d / sp
        dur = d / sp  # the cluster adds the overhead to every attempt, not slowed down
        est = t.estimate if t.estimate is not None else default_estimate
        sub = (t.submit - t0) if (t.submit is not None and not t.existing) else 0.0
        spec = t.annotations.get("speculate", True)
        sim_tasks.append(
            Task(
                t.key,
                duration=dur,
                estimate=float(est),
                cores=min(_cores(t), cpn),
                deps=tuple(x for x in t.deps if x in keep),
                team=t.team or "default",
                submit=max(0.0, sub) + fit.startup,
                speculate=spec if isinstance(spec, bool) else True,
                # a default estimate teaches no speed and gets no copy, as live
                estimated=t.estimate is not None and t.estimate_source != "default",
                stage=stage_of[t.key],
                params=t.params,
            )
        )
        if t.estimate_source == "annotation":
            annotated.add(t.key)
    missing_graph = sum(1 for t, _, _ in ended if not t.in_graph)
    if missing_graph:
        notes.append(
            f"{missing_graph} task(s) ran without a graph record: estimate and team unknown"
        )
    dep_outside = sum(1 for t, _, _ in ended for x in t.deps if x not in known)
    if dep_outside:
        notes.append(f"{dep_outside} dependency(ies) on tasks outside the trace: taken as done")
    longer = [t.key for t, _, d in ended if d > recorded.makespan + CLOCK_TOLERANCE]
    if longer:
        notes.append(
            f"{len(longer)} task(s) computed longer than the recorded run (e.g. {longer[0]!r}): "
            "they started before recording did"
        )
    failure_rate = min(0.5, n_fail / n_att) if n_att else 0.0
    cluster = Cluster(len(workers), cpn, slow or None, failure_rate, fit.overhead)
    return Loaded(
        path=path,
        policy=trace.header.get("policy"),
        settings=settings,
        tasks=sim_tasks,
        cluster=cluster,
        workers=workers,
        fit=fit,
        recorded=recorded,
        complete=trace.complete,
        notes=notes,
        stages=stage_of,
        compute=compute,
        annotated=frozenset(annotated),
        speculation=recorded_spec,
        placement=placement,
        check_phase=_check_phase(trace, recorded_spec, recorded.t0),
        copies={k: rs[-1].outcome or "unsettled" for k, rs in races.items()},
    )


# -- backup copies (speculation) -------------------------------------------------------------

_SETTLED = {"backup-won": "won", "backup-lost": "lost", "backup-failed": "failed"}


@dataclass(frozen=True, slots=True)
class _Race:
    """One backup copy the plugin launched, from its audit events."""

    launched: float  # scheduler time of ``backup-launched``
    primary: str | None
    backup: str | None
    settled: float | None = None  # scheduler time of ``backup-won/lost/failed``
    outcome: str | None = None  # won | lost | failed


def _check_phase(trace: Trace, spec: Speculation | None, t0: float) -> float:
    """When the plugin's periodic speculation check ran: it starts with the
    ``speculation`` audit event (recorded once, as the check starts) and runs every
    ``interval``; seconds from ``t0`` modulo the interval, 0 if not recorded."""
    if spec is None or not spec.interval:
        return 0.0
    for ev in trace.events:
        t = ev.get("time")
        if ev.get("action") == "speculation" and isinstance(t, int | float) and math.isfinite(t):
            return (float(t) - t0) % spec.interval
    return 0.0


def _races(trace: Trace) -> dict[Hashable, list[_Race]]:
    """The backup copies of each task, in order, from the ``backup-*`` audit events
    (their ``key`` is the task key's ``str``)."""
    by_str: dict[str, Hashable] = {str(k): k for k in trace.tasks}
    races: dict[Hashable, list[_Race]] = {}
    for ev in trace.events:
        action = ev.get("action")
        if action != "backup-launched" and action not in _SETTLED:
            continue
        key = by_str.get(str(ev.get("key")))
        t = ev.get("time")
        if key is None or not isinstance(t, int | float):
            continue
        if action == "backup-launched":
            races.setdefault(key, []).append(_Race(float(t), ev.get("primary"), ev.get("backup")))
            continue
        open_ = [i for i, r in enumerate(races.get(key, [])) if r.outcome is None]
        if open_:
            i = open_[-1]
            races[key][i] = replace(races[key][i], settled=float(t), outcome=_SETTLED[action])
    return races


_END_FIELDS = (
    "finished",
    "run_id",
    "state",
    "outcome",
    "compute_start",
    "compute_stop",
    "duration",
    "transfer",
    "nbytes",
    "error",
)


def _without_end(a: TraceAttempt, worker: str | None) -> TraceAttempt:
    return replace(a, worker=worker or a.worker, **dict.fromkeys(_END_FIELDS))


def _with_end(a: TraceAttempt, end: TraceAttempt) -> TraceAttempt:
    return replace(a, worker=end.worker or a.worker, **{f: getattr(end, f) for f in _END_FIELDS})


def _split_races(
    task: TraceTask, races: list[_Race]
) -> tuple[list[TraceAttempt], list[tuple[TraceAttempt, float]], int]:
    """The task's attempts with each race told apart, the losing copies with the time
    the race was settled, and how many copies reported their start.

    ``read_trace`` joins records by key: the copy's ``started`` record (same run id, no
    ``assigned``) opens a second attempt, and the winner's ``finished`` record closes
    that one whichever worker won. Here the end goes to the attempt on the winning
    worker (``finished``'s worker); the other one lost the race (the plugin released
    it; its thread ran on). It is neither a failure nor a retry.
    """
    atts = list(task.attempts)
    losers: list[tuple[TraceAttempt, float]] = []
    started = 0
    for race in races:
        ci = next(
            (
                i
                for i, a in enumerate(atts)
                if i > 0
                and a.assigned is None
                and a.started is not None
                and a.started >= race.launched
                and (a.worker in (race.backup, race.primary) or a.worker is None)
            ),
            None,
        )
        if ci is None:
            continue  # the copy never reported its start (queued behind, or the race ended)
        before = [i for i in range(ci) if (atts[i].started or math.inf) < race.launched]
        pi = before[-1] if before else None
        if pi is None:
            continue
        started += 1
        p, c = atts[pi], atts[ci]
        if _done(c) and c.worker != race.backup:  # the primary's end, joined to the copy
            atts[pi] = _with_end(p, c)
            atts[ci] = _without_end(c, race.backup)
            end = atts[pi].finished
            loser = atts[ci]
        elif _done(c):  # the copy won
            atts[ci] = replace(c, worker=race.backup)
            end = c.finished
            loser = p
        elif _done(p):  # the primary ended before the copy's start was heard
            atts[ci] = _without_end(c, race.backup)
            end = p.finished
            loser = atts[ci]
        else:  # neither ended in the trace
            continue
        stop = race.settled if race.settled is not None else end
        if stop is not None:
            losers.append((loser, float(stop)))
    return atts, losers, started


def _speculation(settings: dict[str, Any], notes: list[str]) -> Speculation | None:
    """The recorded run's speculation settings as a simulator spec (None: off)."""
    spec = settings.get("speculation")
    if not isinstance(spec, dict) or not spec.get("enabled"):
        return None

    def recorded(name: str, key: str, read: Callable[[str], Any] = _defaults.default) -> float:
        # a setting the header leaves out (or null) is the plugin's default, read from the
        # one place defaults are written (daskjobs.yaml)
        value = spec.get(name)
        return float(read(key) if value is None else value)

    try:
        return Speculation(
            late_factor=recorded("late_factor", "speculation.late-factor"),
            min_runtime=recorded("min_runtime", "speculation.min-runtime", _defaults.seconds),
            max_fraction=recorded("max_fraction", "speculation.max-fraction"),
            # a trace from before the setting existed ran the live rule, past-horizon
            ahead=str(spec.get("ahead") or _defaults.default("speculation.ahead")),
            interval=recorded("interval", "speculation.interval", _defaults.seconds),
        )
    except (TypeError, ValueError, OverflowError) as exc:
        notes.append(f"the recorded speculation settings cannot be replayed ({exc}): off")
        return None


def _checked_settings(trace: Trace) -> dict[str, Any]:
    """The header's settings, with what the replay uses from them checked: the default
    estimate and the fair-share targets, quotas and half-life (speculation settings that
    cannot be replayed are noted and turned off, :func:`_speculation`)."""
    settings = trace.header.get("settings") or {}
    where = f"{trace.path}:{trace.header_line}: 'header' record: field 'settings."

    def fail(name: str, expected: str, value: Any) -> TraceError:
        r = repr(value)
        r = r if len(r) <= 60 else f"{r[:40]}... ({len(r)} characters)"
        return TraceError(f"{where}{name}' expected {expected}, got {r}")

    def number(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and _finite(v)

    est = settings.get("default_estimate")
    if est is not None and not (number(est) and 0 < est <= MAX_SECONDS):
        raise fail("default_estimate", f"seconds > 0 and at most {MAX_SECONDS:g}", est)
    teams = settings.get("teams")
    if teams is None:
        return dict(settings)
    if not isinstance(teams, dict):
        raise fail("teams", "a JSON object", teams)
    targets = teams.get("targets")
    if targets is not None and not (
        isinstance(targets, dict) and all(number(v) and v > 0 for v in targets.values())
    ):
        raise fail("teams.targets", "an object of shares > 0", targets)
    quotas = teams.get("quotas")
    if quotas is not None and not (
        isinstance(quotas, dict)
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in quotas.values())
    ):
        raise fail("teams.quotas", "an object of integers >= 1", quotas)
    half_life = teams.get("half_life")
    if half_life is not None and not (number(half_life) and half_life > 0):
        raise fail("teams.half_life", "seconds > 0", half_life)
    return dict(settings)


def _finite(v: float) -> bool:
    try:
        return math.isfinite(v)
    except OverflowError:  # an integer beyond any float
        return False


def _refuse_cycles(path: str, ended: list[tuple[TraceTask, TraceAttempt, float]]) -> None:
    """A :class:`TraceError` naming a graph record on a dependency cycle (the recorded
    graph cannot have one: dask refuses cyclic graphs). O(tasks + dependencies)."""
    tasks = {t.key: t for t, _, _ in ended}
    state: dict[Hashable, int] = {}  # 1: on the current path, 2: done
    end = object()
    for root in tasks:
        if root in state:
            continue
        state[root] = 1
        stack: list[tuple[Hashable, Iterator[Hashable]]] = [(root, iter(tasks[root].deps))]
        while stack:
            key, deps = stack[-1]
            dep = next(deps, end)
            if dep is end:
                state[key] = 2
                stack.pop()
            elif dep in tasks and state.get(dep) == 1:
                path_keys = [k for k, _ in stack]
                cycle = [*path_keys[path_keys.index(dep) :], dep]
                shown = " -> ".join(repr(k) for k in cycle[:6])
                raise TraceError(
                    f"{path}:{tasks[key].line or '?'}: 'graph' record: field 'deps' closes a "
                    f"dependency cycle ({shown}{' ...' if len(cycle) > 6 else ''}): dask "
                    "graphs have none"
                )
            elif dep in tasks and dep not in state:
                state[dep] = 1
                stack.append((dep, iter(tasks[dep].deps)))


def _backup_counts(races: dict[Hashable, list[_Race]], started: int) -> dict[str, int]:
    rs = [r for rr in races.values() for r in rr]
    out = {"launched": len(rs), "started": started}
    for outcome in ("won", "lost", "failed"):
        out[outcome] = sum(1 for r in rs if r.outcome == outcome)
    return out


def _order_key(item: tuple[TraceTask, TraceAttempt, float]) -> tuple[float, tuple[float, ...]]:
    """Submission time, then dask's own order: the recorded priority tuple
    ``(-user_priority, policy key, generation, dask.order position)`` without the
    policy's key, so that a what-if policy does not inherit the recorded one's order."""
    t = item[0]
    raw = list(t.priority or ())
    if len(raw) >= 4:
        raw = [raw[0], *raw[2:]]
    prio = tuple(
        float(x) if isinstance(x, int | float) and not isinstance(x, bool) else 0.0 for x in raw
    )
    return (t.submit if t.submit is not None else -math.inf, prio)


def _prefix(key: Hashable) -> str:
    """dask's own key prefix (``dask.utils.key_split``): ``"fit-3"`` -> ``"fit"``, a
    ``dask.delayed`` key ``"work-fcfcf0ab-ddfb-..."`` -> ``"work"``, ``("x", 0)`` -> ``"x"``:
    the stage the scheduler groups a task under."""
    from dask.utils import key_split

    return str(key_split(key))


def _begin(a: TraceAttempt) -> float | None:
    """When an attempt started, on the scheduler's clock (best known)."""
    if a.started is not None:
        return a.started
    if a.assigned is not None:
        return a.assigned
    return None


def _lost_capacity(
    trace: Trace,
    ended: list[tuple[TraceTask, TraceAttempt, float]],
    keep: set[Hashable],
    startup: float,
    slots: int,
    losers: Sequence[tuple[TraceAttempt, float]] = (),
) -> tuple[float, float]:
    """Slot-seconds lost while work waited, and the share of slot-seconds computing.

    Scheduler clock throughout. A task *waits* from when it could run in the
    simulator (its submission plus the start-up latency, and its inputs finished)
    until its first attempt started; a slot *computes* during ``[finished -
    duration, finished]`` of every attempt. At each moment, ``min(free slots,
    waiting tasks)`` slots are lost to dask: the simulator would have started
    that many tasks there. Free slots with nothing waiting are idle (the graph's
    shape), not lost. A copy that lost its race computes from its start until the
    race was settled, as the simulator kills it then; its thread really ran on, and
    while it did its slot counts as free (the simulator would have used it).
    """
    finished = {t.key: a.finished for t, a, _ in ended}
    events: list[tuple[float, int, int]] = []  # (time, 0 waiting / 1 computing, +1/-1)
    compute = 0.0
    for t in trace.tasks.values():
        if t.key not in keep or t.existing:
            continue
        ready = (t.submit + startup) if t.submit is not None else -math.inf
        for dep in t.deps:
            f = finished.get(dep)
            if f is not None:
                ready = max(ready, f)
        begin = next((b for b in map(_begin, t.attempts) if b is not None), None)
        if begin is not None and ready != -math.inf and begin > ready:
            events += [(ready, 0, 1), (begin, 0, -1)]
        for a in t.attempts:
            d = _duration(a)
            if _done(a) and a.finished is not None and d:
                events += [(a.finished - d, 1, 1), (a.finished, 1, -1)]
                compute += d
    for a, end in losers:
        b = _begin(a)
        if b is not None and end > b:
            events += [(b, 1, 1), (end, 1, -1)]
            compute += end - b
    if not events:
        return 0.0, math.nan
    events.sort()
    lost = 0.0
    waiting = busy = 0
    last = events[0][0]
    for x, kind, step in events:
        lost += min(max(0, slots - busy), waiting) * (x - last)
        last = x
        if kind == 0:
            waiting += step
        else:
            busy += step
    span = events[-1][0] - events[0][0]
    return lost, (compute / (slots * span) if span > 0 else math.nan)


def _dep_latency(
    ended: list[tuple[TraceTask, TraceAttempt, float]], threads: dict[str, int], cpn: int
) -> list[float]:
    """Seconds from a task's last input finishing to its start (scheduler clock: both are
    report arrivals), for dependents whose worker had a free slot at that moment."""
    fin = {t.key: a for t, a, _ in ended}
    spans: dict[str, tuple[list[float], list[float]]] = {}
    for _t, a, _ in ended:
        b = _begin(a)
        if a.worker is not None and b is not None and a.finished is not None:
            starts, ends = spans.setdefault(a.worker, ([], []))
            starts.append(b)
            ends.append(a.finished)
    for starts, ends in spans.values():
        starts.sort()
        ends.sort()
    out: list[float] = []
    for t, a, _ in ended:
        begin = _begin(a)
        inputs = [fin[d].finished for d in t.deps if d in fin and fin[d].finished is not None]
        if not inputs or begin is None or a.worker is None:
            continue
        x = max(x for x in inputs if x is not None)
        starts, ends = spans.get(a.worker, ([], []))
        busy = bisect.bisect_right(starts, x) - bisect.bisect_right(ends, x)
        if busy < threads.get(a.worker, cpn) and begin >= x:
            out.append(begin - x)
    return out
