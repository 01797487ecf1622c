"""Turn a recorded trace (``docs/reference/trace-format.md``) into simulator tasks and a cluster.

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
* ``attempt_overhead`` (seconds per attempt): what an attempt adds to its own
  compute on the scheduler's clock, ``finished - started - duration``, the median
  over the attempts that ended a task (the reports' round trip). A replay on the
  recorded placement starts each task when it started (``replay(...,
  placement="recorded")``): the capacity lost between attempts is in those starts,
  and each attempt adds only this. Spread as ``overhead`` instead, a stall that held
  every worker at once live delays a fast worker, which runs many attempts, by more
  than the stall, and a slow one by less (tens of milliseconds by the end of a
  4 s run).
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

import math
import os
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from typing import Any

from daskjobs.policies.speculation import Speculation
from daskjobs.replay.attempts import (
    _begin,
    _cores,
    _done,
    _duration,
    _final,
    _median,
    _order_key,
    _prefix,
)
from daskjobs.replay.checks import _checked_settings, _refuse_cycles
from daskjobs.replay.fitting import _dep_latency, _lost_capacity, _speeds
from daskjobs.replay.races import (
    _backup_counts,
    _check_phase,
    _Race,
    _races,
    _speculation,
    _split_races,
)
from daskjobs.sim.model import Cluster, Task
from daskjobs.trace import (
    CLOCK_TOLERANCE,
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
    # seconds an attempt adds to its compute (the median): replayed on the recorded timeline
    attempt_overhead: float = 0.0

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
            "attempt_overhead_s": self.attempt_overhead,
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


def load(
    trace: Trace | str | os.PathLike[str],
    *,
    overhead: float | None = None,
    startup: float | None = None,
    speeds: bool = True,
) -> Loaded:
    """Read ``trace`` (a path or a :class:`Trace`) into tasks, a cluster and a fit.

    ``overhead`` and ``startup`` override the fitted values (seconds; ``overhead``
    stands for ``attempt_overhead`` too); ``speeds=False`` takes every worker as
    nominal. Raises :class:`ReplayError` when the trace has no finished attempt, naming
    the file.
    """
    if not isinstance(trace, Trace):
        trace = read_trace(trace)
    path = trace.path
    notes = _trace_notes(trace)
    settings = _checked_settings(trace)
    default_estimate = float(settings.get("default_estimate") or 1.0)
    recorded_spec = _speculation(settings, notes)

    # -- backup copies: the winner's end to the winner, the loser apart ------------------
    trace, races, losers, copies_started = _split_copies(trace)
    if races and recorded_spec is None:
        notes.append(
            "the trace has backup copies but no speculation settings: replayed without speculation"
        )

    # -- the tasks that ended, without those whose inputs never did --------------------------
    ended, keep = _ended(path, trace, notes)
    stage_of: dict[Hashable, str] = {}
    for t, _, _ in ended:
        stage_of[t.key] = t.stage or _prefix(t.key)

    # -- workers ---------------------------------------------------------------------------
    workers, threads, cpn, slow = _workers(trace, ended, losers, keep, stage_of, speeds, notes)
    speed_of = {w.address: w.speed for w in workers}

    # -- the fit ---------------------------------------------------------------------------
    slots = len(workers) * cpn  # the replayed cluster's slots
    losers = [(a, end) for a, end in losers if a.key in keep]
    fit = _fit(trace, ended, keep, losers, slots, threads, cpn, overhead, startup)

    # -- the recorded run ------------------------------------------------------------------
    recorded = _recorded(trace, ended, keep, losers, races, copies_started)
    t0, n_att, n_fail = recorded.t0, recorded.attempts, recorded.failed_attempts
    placement = _placement(ended, workers, t0)

    # -- simulator tasks, in the order dask ran ties: the recorded priority ---------------
    ended.sort(key=_order_key)
    sim_tasks, compute, annotated = _sim_tasks(
        ended, keep, stage_of, speed_of, default_estimate, cpn, t0, fit.startup
    )
    _note_tasks(trace, ended, recorded.makespan, notes)
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


def _trace_notes(trace: Trace) -> list[str]:
    """What the trace says of itself that a replay should say too: a missing footer, a
    cut last line, records dropped or of unknown types, the reader's own notes."""
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
    return notes


def _split_copies(
    trace: Trace,
) -> tuple[Trace, dict[Hashable, list[_Race]], list[tuple[TraceAttempt, float]], int]:
    """The backup copies' races told apart (:func:`_split_races`): the trace with each
    raced task's attempts as replayed (the winner's end to the winner), the races by task,
    the losing copies with the time they ended, and how many copies started."""
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
    return trace, races, losers, copies_started


def _ended(
    path: str, trace: Trace, notes: list[str]
) -> tuple[list[tuple[TraceTask, TraceAttempt, float]], set[Hashable]]:
    """The tasks that ended, each with its final attempt and that attempt's duration, and
    their keys, less those whose inputs never finished (a crashed run), transitively.
    Raises :class:`ReplayError` if none ended, and refuses a cycle; the tasks left out
    go to ``notes``."""
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
    return ended, keep


def _fit(
    trace: Trace,
    ended: list[tuple[TraceTask, TraceAttempt, float]],
    keep: set[Hashable],
    losers: list[tuple[TraceAttempt, float]],
    slots: int,
    threads: dict[str, int],
    cpn: int,
    overhead: float | None,
    startup: float | None,
) -> Fit:
    """What dask adds, fitted from the trace (module docstring) on a replayed cluster of
    ``slots``; ``overhead`` (per task and per attempt) and ``startup``, if given, instead
    of the fitted values."""
    given = overhead
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
    lost_s, computing = _lost_capacity(trace, ended, keep, float(startup), slots, losers)
    fitted_overhead = lost_s / len(ended)
    if overhead is None:
        overhead = fitted_overhead
    latency = _dep_latency(ended, threads, cpn)
    transfers = [a.transfer for _, a, _ in ended if a.transfer]
    held = [
        max(0.0, a.finished - a.started - d)
        for _, a, d in ended
        if a.started is not None and a.finished is not None
    ]
    attempt = given if given is not None else (_median(held) if held else 0.0)
    return Fit(
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
        attempt_overhead=float(attempt),
    )


def _placement(
    ended: list[tuple[TraceTask, TraceAttempt, float]], workers: list[WorkerInfo], t0: float
) -> dict[Hashable, tuple[int, float]]:
    """Where dask put each task: its first attempt's node, and when it started there
    (seconds from the first submission ``t0``)."""
    node_of = {w.address: w.node for w in workers}
    placement: dict[Hashable, tuple[int, float]] = {}
    for t, a, _d in ended:
        first = t.attempts[0] if t.attempts else a
        node = node_of.get(first.worker or "")
        when = first.started if first.started is not None else first.assigned
        if node is not None and when is not None:
            placement[t.key] = (node, when - t0)
    return placement


def _sim_tasks(
    ended: list[tuple[TraceTask, TraceAttempt, float]],
    keep: set[Hashable],
    stage_of: dict[Hashable, str],
    speed_of: dict[str, float],
    default_estimate: float,
    cpn: int,
    t0: float,
    startup: float,
) -> tuple[list[Task], dict[Hashable, float], set[Hashable]]:
    """The simulator's tasks, in the order of ``ended`` (module docstring), with each
    one's compute time on a nominal worker and the keys whose estimate was annotated."""
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
                submit=max(0.0, sub) + startup,
                speculate=spec if isinstance(spec, bool) else True,
                # a default estimate teaches no speed and gets no copy, as live
                estimated=t.estimate is not None and t.estimate_source != "default",
                stage=stage_of[t.key],
                params=t.params,
            )
        )
        if t.estimate_source == "annotation":
            annotated.add(t.key)
    return sim_tasks, compute, annotated


def _note_tasks(
    trace: Trace,
    ended: list[tuple[TraceTask, TraceAttempt, float]],
    makespan: float,
    notes: list[str],
) -> None:
    """What the replayed tasks lack, to ``notes``: a graph record, inputs in the trace, a
    start after recording did (a task that computed longer than the recorded run)."""
    known = set(trace.tasks)
    missing_graph = sum(1 for t, _, _ in ended if not t.in_graph)
    if missing_graph:
        notes.append(
            f"{missing_graph} task(s) ran without a graph record: estimate and team unknown"
        )
    dep_outside = sum(1 for t, _, _ in ended for x in t.deps if x not in known)
    if dep_outside:
        notes.append(f"{dep_outside} dependency(ies) on tasks outside the trace: taken as done")
    longer = [t.key for t, _, d in ended if d > makespan + CLOCK_TOLERANCE]
    if longer:
        notes.append(
            f"{len(longer)} task(s) computed longer than the recorded run (e.g. {longer[0]!r}): "
            "they started before recording did"
        )


def _workers(
    trace: Trace,
    ended: list[tuple[TraceTask, TraceAttempt, float]],
    losers: list[tuple[TraceAttempt, float]],
    keep: set[Hashable],
    stage_of: dict[Hashable, str],
    speeds: bool,
    notes: list[str],
) -> tuple[list[WorkerInfo], dict[str, int], int, dict[int, float]]:
    """The workers that ran attempts, as replayed nodes (fastest first): their
    :class:`WorkerInfo`, threads by address, the slots per node and the slow-down of each
    slowed node; what had to be assumed goes to ``notes``."""
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
    return workers, threads, cpn, slow


def _recorded(
    trace: Trace,
    ended: list[tuple[TraceTask, TraceAttempt, float]],
    keep: set[Hashable],
    losers: list[tuple[TraceAttempt, float]],
    races: dict[Hashable, list[_Race]],
    copies_started: int,
) -> Recorded:
    """How the recorded run went: its makespan, attempts, failures and waste, and each
    team's waits, on the scheduler's clock from the first submission."""
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
    return Recorded(
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
