"""A job-level cluster simulator for preemption (docs/explanation/preemption.md).

Jobs hold ``gpus`` GPUs of one node for their run: *trial-and-error* (``te``) jobs are
short and small, *best-effort* (``be``) jobs long, checkpointing every
``checkpoint`` seconds of work. A preempted job keeps its GPUs for ``grace`` seconds
after the signal, then loses the work done since its last checkpoint; when it runs
again it first spends ``restore`` seconds reading that checkpoint. Every decision -
which waiting job goes first, where it goes, whom to preempt - is the policy's
(:mod:`daskjobs.policies.preemption`); this module only enacts it and measures.

:func:`synthetic` builds the documented workload from a seed; :func:`simulate` runs it
under a policy; :func:`metrics` gives per class the slowdown ``(end - arrival) / run
time alone`` at p50/p95/p99, the queueing delay, preemptions per job, GPU-seconds lost
and the utilisation.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from daskjobs.policies.preemption import Placement, PreemptionPolicy

__all__ = [
    "PUBLISHED",
    "Cluster",
    "Job",
    "Workload",
    "compare",
    "metrics",
    "run_preemption",
    "simulate",
    "synthetic",
]

#: FitGpp against FIFO on its own workload (Yabuuchi, Taniwaki, Omura, OpML 2019,
#: arXiv 1902.01613): relative change of each slowdown. Its full setup is not available.
PUBLISHED = {
    "te_slowdown_p95": -0.966,
    "be_slowdown_p50": 0.180,
    "be_slowdown_p95": 0.239,
}


@dataclass(frozen=True)
class Job:
    jid: int
    cls: str  # "te" or "be"
    arrival: float
    gpus: int
    duration: float  # run time alone (seconds)
    checkpoint: float | None = None  # seconds of work between checkpoints (None: none)

    def __post_init__(self) -> None:
        if self.cls not in ("te", "be"):
            raise ValueError(f"job {self.jid}: class must be 'te' or 'be', got {self.cls!r}")
        for name in ("arrival", "duration"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"job {self.jid}: {name} must be finite and >= 0, got {v!r}")
        if self.gpus < 1:
            raise ValueError(f"job {self.jid}: gpus must be >= 1, got {self.gpus!r}")


@dataclass(frozen=True)
class Cluster:
    nodes: int = 8
    gpus_per_node: int = 8
    grace: float = 30.0  # seconds between the preemption signal and the freed GPUs
    restore: float = 60.0  # seconds a resumed job spends reading its checkpoint


@dataclass(frozen=True)
class Workload:
    cluster: Cluster
    jobs: tuple[Job, ...]
    description: dict[str, Any] = field(default_factory=dict)


def synthetic(
    seed: int = 0,
    *,
    hours: float = 168.0,
    nodes: int = 8,
    gpus_per_node: int = 8,
    load: float = 1.0,
    te_share: float = 0.05,
    be_median: float = 4 * 3600.0,
    be_sigma: float = 1.0,
    te_median: float = 600.0,
    te_sigma: float = 0.8,
    checkpoint: float = 1800.0,
    grace: float = 30.0,
    restore: float = 60.0,
) -> Workload:
    """The synthetic workload of docs/explanation/preemption.md, in the spirit of FitGpp's: Poisson
    arrivals over ``hours``; best-effort jobs of 1, 2 or 4 GPUs (probabilities 0.4,
    0.35, 0.25), log-normal run times (median ``be_median``, ``be_sigma``),
    checkpointing every ``checkpoint`` seconds; trial-and-error jobs of 1 or 2 GPUs
    (0.7, 0.3), median ``te_median``; arrival rates set so that the offered GPU load is
    ``load`` of the cluster, ``te_share`` of it from trial-and-error jobs."""
    rng = np.random.default_rng(seed)
    capacity = nodes * gpus_per_node
    horizon = hours * 3600.0

    def mean_gpu_seconds(sizes: Sequence[int], p: Sequence[float], med: float, sig: float) -> float:
        return float(np.dot(sizes, p)) * med * math.exp(sig**2 / 2)

    be_sizes, be_p = (1, 2, 4), (0.4, 0.35, 0.25)
    te_sizes, te_p = (1, 2), (0.7, 0.3)
    be_rate = (
        load * (1 - te_share) * capacity / mean_gpu_seconds(be_sizes, be_p, be_median, be_sigma)
    )
    te_rate = load * te_share * capacity / mean_gpu_seconds(te_sizes, te_p, te_median, te_sigma)
    jobs: list[tuple[float, str, int, float]] = []
    for cls, rate, sizes, p, med, sig in (
        ("be", be_rate, be_sizes, be_p, be_median, be_sigma),
        ("te", te_rate, te_sizes, te_p, te_median, te_sigma),
    ):
        t = 0.0
        while True:
            t += float(rng.exponential(1 / rate))
            if t >= horizon:
                break
            gpus = int(rng.choice(sizes, p=p))
            duration = float(med * math.exp(sig * rng.standard_normal()))
            jobs.append((t, cls, gpus, duration))
    jobs.sort()
    out = tuple(
        Job(i, cls, t, g, d, checkpoint if cls == "be" else None)
        for i, (t, cls, g, d) in enumerate(jobs)
    )
    desc = {
        "seed": seed,
        "hours": hours,
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "load": load,
        "te_share": te_share,
        "be_median_s": be_median,
        "te_median_s": te_median,
        "checkpoint_s": checkpoint,
        "grace_s": grace,
        "restore_s": restore,
        "jobs": len(out),
        "te_jobs": sum(j.cls == "te" for j in out),
    }
    return Workload(Cluster(nodes, gpus_per_node, grace, restore), out, desc)


# -- the driver ------------------------------------------------------------------------------


class _Node:
    def __init__(self, index: int, gpus: int) -> None:
        self.index = index
        self.gpus = gpus
        self.free = gpus
        self.promised = 0  # GPUs freed (or freeing) for a job that preempted

    @property
    def available(self) -> int:
        return self.free - self.promised


class _Run:
    """A job's current run (a running view for the policy: job, node, started,
    preemptions, end, group, lost_at)."""

    group = None  # the simulator has no gangs

    def __init__(self, job: Job, node: int, start: float, saved: float, restore: float) -> None:
        self.job = job
        self.node = node
        self.started = start
        self.saved = saved  # work committed by checkpoints before this run
        self.restore = restore  # seconds of this run spent reading the checkpoint
        self.preemptions = 0
        self.end = start + restore + (job.duration - saved)

    def done_at(self, t: float) -> float:
        """Work done at ``t`` (checkpointed or not)."""
        return self.saved + max(0.0, t - self.started - self.restore)

    def checkpointed_at(self, t: float) -> float:
        done = min(self.done_at(t), self.job.duration)
        c = self.job.checkpoint
        return self.saved if not c else max(self.saved, math.floor(done / c) * c)

    def lost_at(self, t: float, restore: float = 0.0) -> float:
        """GPU-seconds lost if freed at ``t``: work since the last checkpoint, this
        run's own restore, and the next run's restore."""
        work = self.done_at(t) - self.checkpointed_at(t) + min(t - self.started, self.restore)
        return self.job.gpus * (work + restore)


class _Waiting:
    """A waiting job (a waiting view for the policy: jid, cls, gpus, arrival,
    preemptions, promised, node, where, end_at)."""

    __slots__ = (
        "arrival",
        "cls",
        "gpus",
        "jid",
        "job",
        "preemptions",
        "promised",
        "restore",
        "saved",
    )
    node = None  # the simulator queues a job nowhere before it starts
    where = None  # any node

    def __init__(self, job: Job, saved: float, restore: float, preemptions: int) -> None:
        self.job = job
        self.jid = job.jid
        self.cls = job.cls
        self.gpus = job.gpus
        self.arrival = job.arrival
        self.saved = saved
        self.restore = restore if saved > 0 else 0.0
        self.preemptions = preemptions
        self.promised: int | None = None  # the node its victims are freeing

    def end_at(self, t: float) -> float:
        """Its end if it started at ``t`` (as :class:`_Run` has it)."""
        return t + self.restore + (self.job.duration - self.saved)


@dataclass
class _State:
    first_start: dict[int, float] = field(default_factory=dict)
    end: dict[int, float] = field(default_factory=dict)
    preemptions: dict[int, int] = field(default_factory=dict)
    lost: float = 0.0
    busy: float = 0.0  # GPU-seconds held
    preempted: list[dict[str, Any]] = field(default_factory=list)


def simulate(workload: Workload, policy: PreemptionPolicy) -> dict[str, Any]:
    """Run ``workload`` under ``policy``; per job: first start, end, preemptions; and the
    GPU-seconds lost to preemption and held in all (see :func:`metrics`)."""
    cl = workload.cluster
    nodes = [_Node(i, cl.gpus_per_node) for i in range(cl.nodes)]
    for j in workload.jobs:
        if j.gpus > cl.gpus_per_node:
            raise ValueError(
                f"job {j.jid} needs {j.gpus} GPUs; a node has {cl.gpus_per_node}: it can never run"
            )
    events: list[tuple[float, int, str, Any]] = []
    seq = 0

    def push(t: float, kind: str, payload: Any) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, payload))
        seq += 1

    for j in workload.jobs:
        push(j.arrival, "arrive", j)
    waiting: dict[int, _Waiting] = {}
    saved: dict[int, float] = {}  # work checkpointed, per job (resumes from here)
    running: dict[int, _Run] = {}
    signalled: set[int] = set()  # running jobs asked to yield
    st = _State()
    now = 0.0

    def start(job: Job, node: _Node, t: float) -> None:
        s = saved.get(job.jid, 0.0)
        run = _Run(job, node.index, t, s, cl.restore if s > 0 else 0.0)
        run.preemptions = st.preemptions.get(job.jid, 0)
        node.free -= job.gpus
        running[job.jid] = run
        st.first_start.setdefault(job.jid, t)
        waiting.pop(job.jid, None)
        push(run.end, "finish", (job.jid, run))

    def schedule(t: float) -> None:
        """One round of the policy's decision, enacted in the order it was made."""
        decision = policy.decide(waiting.values(), running.values(), nodes, t, signalled)
        for act in decision.steps():
            w = act.job
            if isinstance(act, Placement):
                node = nodes[act.node]
                if act.kept:  # its victims have left: the promise is kept
                    node.promised -= w.gpus
                start(w.job, node, t)
                continue
            nodes[act.node].promised += w.gpus
            w.promised = act.node
            for v in (*act.victims, *act.group):
                signalled.add(v.job.jid)
                push(t + cl.grace, "release", (v.job.jid, running[v.job.jid]))

    def wait(job: Job) -> None:
        s = saved.get(job.jid, 0.0)
        waiting[job.jid] = _Waiting(job, s, cl.restore, st.preemptions.get(job.jid, 0))

    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            wait(payload)
        elif kind == "finish":
            jid, mine = payload
            r = running.get(jid)
            if r is None or r is not mine:
                continue  # preempted before it ended
            del running[jid]
            signalled.discard(jid)
            nodes[r.node].free += r.job.gpus
            st.busy += r.job.gpus * (now - r.started)
            st.end[jid] = now
        elif kind == "release":
            jid, mine = payload
            r = running.get(jid)
            if r is None or r is not mine:
                continue  # it ended during the grace period
            del running[jid]
            signalled.discard(jid)
            nodes[r.node].free += r.job.gpus
            st.busy += r.job.gpus * (now - r.started)
            lost = r.lost_at(now, cl.restore)
            st.lost += lost
            saved[jid] = r.checkpointed_at(now)
            st.preempted.append(
                {
                    "job": jid,
                    "node": r.node,
                    "signal": now - cl.grace,
                    "ran": now - cl.grace - r.started,  # since this run started
                    "gpu_seconds_lost": lost,
                }
            )
            st.preemptions[jid] = st.preemptions.get(jid, 0) + 1
            wait(r.job)
        schedule(now)
    if waiting or running:
        raise RuntimeError(f"simulation ended with {len(waiting)} job(s) waiting")
    return {
        "first_start": st.first_start,
        "end": st.end,
        "preemptions": st.preemptions,
        "gpu_seconds_lost": st.lost,
        "gpu_seconds_busy": st.busy,
        "makespan": now,
        "preempted": st.preempted,
    }


def metrics(workload: Workload, run: dict[str, Any]) -> dict[str, Any]:
    """Per class: slowdown p50/p95/p99, mean queueing delay (arrival to first start),
    preemptions per job (mean, max); GPU-seconds lost; utilisation (GPU-seconds held /
    capacity over the makespan)."""
    out: dict[str, Any] = {}
    for cls in ("te", "be"):
        jobs = [j for j in workload.jobs if j.cls == cls]
        if not jobs:
            continue
        slow = np.array([(run["end"][j.jid] - j.arrival) / max(j.duration, 1e-9) for j in jobs])
        wait = np.array([run["first_start"][j.jid] - j.arrival for j in jobs])
        pre = np.array([run["preemptions"].get(j.jid, 0) for j in jobs])
        for q in (50, 95, 99):
            out[f"{cls}_slowdown_p{q}"] = float(np.percentile(slow, q))
        out[f"{cls}_wait_mean_s"] = float(wait.mean())
        out[f"{cls}_wait_p95_s"] = float(np.percentile(wait, 95))
        out[f"{cls}_preemptions_mean"] = float(pre.mean())
        out[f"{cls}_preemptions_max"] = int(pre.max())
    cl = workload.cluster
    out["preemptions_max"] = max(run["preemptions"].values(), default=0)
    out["preemptions_total"] = sum(run["preemptions"].values())
    out["gpu_seconds_lost"] = run["gpu_seconds_lost"]
    capacity = cl.nodes * cl.gpus_per_node * run["makespan"]
    out["utilisation"] = run["gpu_seconds_busy"] / capacity if capacity else 0.0
    return out


def compare(workload: Workload, policies: Sequence[PreemptionPolicy]) -> list[dict[str, Any]]:
    """One row per policy (its metrics), with ``vs_fifo``: the relative change of each
    slowdown against the first policy (FIFO by convention)."""
    rows = []
    for p in policies:
        row = {"policy": p.name, **metrics(workload, simulate(workload, p))}
        rows.append(row)
    base = rows[0]
    for row in rows:
        row["vs_fifo"] = {
            k: (row[k] - base[k]) / base[k] if base[k] else 0.0 for k in row if "slowdown" in k
        }
    return rows


def run_preemption(
    seeds: Sequence[int] = (0, 1, 2, 3, 4),
    policies: Sequence[str] | None = None,
    **workload: Any,
) -> dict[str, Any]:
    """Every policy (default: all of ``PREEMPTION_POLICIES``, FIFO first) on the
    synthetic workload of each seed (``workload``: keywords of
    :func:`synthetic`). Rows: per policy, the median over seeds of each metric and of
    each ``vs_fifo`` change, with its range (``*_min``, ``*_max``); ``slowdowns``: per
    policy and class, every job's slowdown pooled over the seeds (for the CDFs)."""
    from daskjobs.policies.preemption import PREEMPTION_POLICIES, make_preemption_policy

    policies = list(PREEMPTION_POLICIES) if policies is None else list(policies)
    per_seed: list[dict[str, Any]] = []
    pooled: dict[str, dict[str, list[float]]] = {p: {"te": [], "be": []} for p in policies}
    desc: dict[str, Any] = {}
    for seed in seeds:
        w = synthetic(seed, **workload)
        desc = {k: v for k, v in w.description.items() if k not in ("seed", "jobs", "te_jobs")}
        rows: list[dict[str, Any]] = []
        for name in policies:
            result = simulate(w, make_preemption_policy(name))
            rows.append({"policy": name, **metrics(w, result)})
            for j in w.jobs:
                slowdown = (result["end"][j.jid] - j.arrival) / max(j.duration, 1e-9)
                pooled[name][j.cls].append(slowdown)
        base = rows[0]
        for one in rows:
            one["vs_fifo"] = {
                k: (one[k] - base[k]) / base[k] if base[k] else 0.0 for k in one if "slowdown" in k
            }
        per_seed.append({"seed": seed, "jobs": len(w.jobs), "rows": rows})
    out_rows = []
    for i, name in enumerate(policies):
        runs = [s["rows"][i] for s in per_seed]
        row: dict[str, Any] = {"policy": name}
        for key in runs[0]:
            if key in ("policy", "vs_fifo"):
                continue
            vals = [r[key] for r in runs]
            row[key] = float(np.median(vals))
            row[key + "_min"], row[key + "_max"] = float(min(vals)), float(max(vals))
        row["vs_fifo"] = {}
        for key in runs[0]["vs_fifo"]:
            vals = [r["vs_fifo"][key] for r in runs]
            row["vs_fifo"][key] = float(np.median(vals))
            row["vs_fifo"][key + "_min"] = float(min(vals))
            row["vs_fifo"][key + "_max"] = float(max(vals))
        out_rows.append(row)
    return {
        "experiment": "preemption",
        "seeds": list(seeds),
        "workload": desc,
        "published": PUBLISHED,
        "rows": out_rows,
        "per_seed": per_seed,
        "slowdowns": pooled,
    }
