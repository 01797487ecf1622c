"""Replay a recorded run with interactive and best-effort tasks under preemption policies.

A run recorded with the plugin (``record=``; docs/reference/trace-format.md) carries what the
job-level simulator (:mod:`daskjobs.sim.preemption`) needs: each task's class (its ``job_class``
annotation), its need of the managed resource (its ``resources`` annotation), its submission,
its runs (a preempted run ends ``released``), the workers' resources, and the preemptions the
plugin asked for (``preempt-requested`` audit events). :func:`workload_from_trace` turns those
into the simulator's jobs and cluster:

* a job per task that needs the resource (``daskjobs.preemption.resource`` of the recorded
  settings, default ``GPU``), arriving at its submission (seconds from the first);
* its run time alone: the computing of its last run plus what its preempted runs did. A
  preempted run's work since its last checkpoint was done again, so this overstates the run
  time by that much (at most one checkpoint interval per preemption);
* its checkpoint interval (best-effort tasks): the median time between a task's consecutive
  recorded checkpoints (``checkpoint`` events, which the plugin records); for a trace without
  them, twice the mean work a preemption lost (the ``lost_seconds`` of the recorded
  ``preempt-requested`` events per victim: a preemption lands, on average, half way between
  two checkpoints); None when neither is there;
* the cluster: the workers that supplied the resource (each the same amount), and as the
  grace between a preemption's signal and the freed resource, the median time a recorded
  victim took to give it back (0 without preemptions); no restore cost (a restore is part of
  the run's computing).

:func:`replay_preemption` simulates that workload under each policy and puts the recorded
run's own figures beside them: every round of it is the policy's
:meth:`~daskjobs.policies.preemption.PreemptionPolicy.decide`, the one call the live plugin
makes too (the simulator only enacts it). Nothing here imports ``distributed``.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence
from typing import Any

from daskjobs.policies.preemption import make_preemption_policy
from daskjobs.sim.preemption import Cluster, Job, Workload, metrics, simulate
from daskjobs.trace import Trace, read_trace

__all__ = ["recorded_metrics", "replay_preemption", "workload_from_trace"]


def _trace(trace: Trace | str | os.PathLike[str]) -> Trace:
    return trace if isinstance(trace, Trace) else read_trace(trace)


def _resource(trace: Trace, resource: str | None) -> str:
    if resource is not None:
        return resource
    pre = (trace.header.get("settings") or {}).get("preemption") or {}
    return str(pre.get("resource") or "GPU")


def workload_from_trace(
    trace: Trace | str | os.PathLike[str], resource: str | None = None
) -> Workload:
    """The simulator's jobs and cluster from a recorded run (see the module docs)."""
    tr = _trace(trace)
    res = _resource(tr, resource)
    tasks = [t for t in tr.tasks.values() if (t.resources or {}).get(res)]
    if not tasks:
        raise ValueError(
            f"{tr.path}: no recorded task needs the resource {res!r} "
            "(annotate them with resources={...}; or pass resource=)"
        )
    supply = {w.address: w.resources.get(res, 0) for w in tr.workers if w.resources.get(res)}
    if not supply:
        raise ValueError(f"{tr.path}: no recorded worker supplies the resource {res!r}")
    sizes = set(supply.values())
    if len(sizes) != 1:
        raise ValueError(
            f"{tr.path}: the workers supply different amounts of {res!r} ({sorted(sizes)}); "
            "the simulator's nodes are all alike"
        )
    per_node = int(sizes.pop())
    submits = [t.submit for t in tasks if t.submit is not None]
    if not submits:
        raise ValueError(f"{tr.path}: the tasks that need {res!r} have no submission time")
    t0 = min(submits)
    lost: list[float] = []  # resource-seconds lost per victim
    asked: dict[str, float] = {}  # victim -> when it was asked
    last: dict[str, float] = {}  # task -> its last checkpoint
    between: list[float] = []  # time between a task's consecutive checkpoints
    for ev in tr.events:
        if ev.get("action") == "checkpoint" and isinstance(ev.get("time"), int | float):
            k, when = str(ev.get("key")), float(ev["time"])
            if k in last and when > last[k]:
                between.append(when - last[k])
            last[k] = when
            continue
        if ev.get("action") != "preempt-requested":
            continue
        victims = ev.get("victims") or []
        if victims and isinstance(ev.get("lost_seconds"), int | float):
            lost += [float(ev["lost_seconds"]) / len(victims)] * len(victims)
        for v in victims:
            asked.setdefault(str(v), float(ev.get("time", 0.0)))
    jobs = []
    gaps = []
    for i, t in enumerate(sorted(tasks, key=lambda t: (t.submit or t0, str(t.key)))):
        need = math.ceil(float((t.resources or {})[res]))
        ran = 0.0
        for a in t.attempts:
            if a.outcome == "memory":
                if a.duration is not None:
                    ran += a.duration
                elif a.started is not None and a.finished is not None:
                    ran += a.finished - a.started
            elif a.started is not None and a.finished is not None:
                ran += a.finished - a.started  # a run that gave its slot back
                signal = asked.get(str(t.key))
                if signal is not None and a.started <= signal <= a.finished:
                    gaps.append(a.finished - signal)
        cls = "te" if t.annotations.get("job_class") == "te" else "be"
        arrival = (t.submit if t.submit is not None else t0) - t0
        jobs.append(Job(i, cls, arrival, need, max(ran, 1e-6), None))
    if between:
        checkpoint: float | None = statistics.median(between)
    else:
        checkpoint = 2 * statistics.mean(lost) if lost else None
    if checkpoint:
        jobs = [
            Job(j.jid, j.cls, j.arrival, j.gpus, j.duration, checkpoint if j.cls == "be" else None)
            for j in jobs
        ]
    grace = statistics.median(gaps) if gaps else 0.0
    cluster = Cluster(len(supply), per_node, grace=grace, restore=0.0)
    return Workload(
        cluster,
        tuple(jobs),
        {"trace": tr.path, "resource": res, "checkpoint": checkpoint, "grace": grace},
    )


def recorded_metrics(
    trace: Trace | str | os.PathLike[str], resource: str | None = None
) -> dict[str, float]:
    """The recorded run's own per-class slowdowns (p50, p95), as :func:`metrics` has them
    for a simulated one: (last end - submission) / run time alone."""
    tr = _trace(trace)
    res = _resource(tr, resource)
    wl = workload_from_trace(tr, res)
    tasks = sorted(
        (t for t in tr.tasks.values() if (t.resources or {}).get(res)),
        key=lambda t: (t.submit or 0.0, str(t.key)),
    )
    t0 = min(t.submit for t in tasks if t.submit is not None)
    out: dict[str, float] = {}
    for cls in ("te", "be"):
        slow = []
        for job, t in zip(wl.jobs, tasks, strict=True):
            ends = [a.finished for a in t.attempts if a.outcome == "memory" and a.finished]
            if job.cls == cls and ends:
                slow.append((max(ends) - t0 - job.arrival) / job.duration)
        if slow:
            slow.sort()
            for q in (50, 95):
                out[f"{cls}_slowdown_p{q}"] = _percentile(slow, q)
    return out


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(sorted_values, q))


def replay_preemption(
    trace: Trace | str | os.PathLike[str],
    policies: Sequence[str] = ("fifo", "te-first", "naive", "fit-resume"),
    resource: str | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """One row per policy: the recorded run's workload simulated under it (``options``
    go to every policy that takes them, e.g. ``min_runtime`` for fit-resume), then a
    ``recorded`` row with the run's own slowdowns."""
    tr = _trace(trace)
    wl = workload_from_trace(tr, resource)
    rows = []
    for name in policies:
        kwargs = {k: v for k, v in options.items() if name == "fit-resume"}
        rows.append(
            {"policy": name, **metrics(wl, simulate(wl, make_preemption_policy(name, **kwargs)))}
        )
    rows.append({"policy": "recorded", **recorded_metrics(tr, resource)})
    return rows
