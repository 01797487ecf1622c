"""Preemption policies: which waiting job is placed first, and which running jobs make room.

Interactive work first (docs/preemption.md): *trial-and-error* (``te``) jobs, short
experiments a person waits for, should start at once; *best-effort* (``be``) jobs, long
training runs that checkpoint, should pay as little as possible for it. A policy answers
three questions, asked by a driver (today the job-level simulator,
:mod:`daskjobs.sim.preemption`) that never decides anything itself:

* :meth:`PreemptionPolicy.order_key` - the order in which waiting jobs are offered a
  place (lower first);
* :meth:`PreemptionPolicy.place` - on which node a job that fits goes (best fit: the
  node left with the fewest free GPUs, ties by index);
* :meth:`PreemptionPolicy.victims` - for a job that does not fit anywhere, the running
  jobs of one node to preempt so that it will (None: wait). Only a preempting policy
  answers;
* :meth:`PreemptionPolicy.reserve` - for the first best-effort job that waits, a node
  held for it: no later best-effort job is placed there until it starts (fit-resume:
  the node where it could start first; the others reserve nothing).

Views (any object with these attributes): a **job** - ``jid``, ``cls`` (``"te"`` or
``"be"``), ``gpus``, ``arrival``; a **running job** - ``job`` plus ``node``,
``started`` (this run's start), ``preemptions`` (of the job so far), ``lost_at(t)``
(GPU-seconds lost if its resources were freed at ``t``: work since its last checkpoint
and the restore a new run pays); a **node** - ``index``, ``gpus``, ``available``
(free and not promised to a job that preempted for it).

The four policies of the issue: :class:`Fifo`, :class:`TeFirst` (no preemption),
:class:`NaivePreemption` (the youngest best-effort jobs until the job fits, as Slurm,
YARN and Kueue choose: no notion of fit or checkpoints) and :class:`FitResume`, in the
spirit of FitGpp (Yabuuchi, Taniwaki, Omura, OpML 2019): victims on one node whose freed
GPUs make the waiting job fit, losing the least work (GPU-seconds since their last
checkpoints, plus restores), then freeing the fewest GPUs beyond the need, then the fewest
victims; never a job that has run less than ``min_runtime`` since it (re)started, never
one preempted ``max_preemptions`` times already.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

__all__ = [
    "PREEMPTION_POLICIES",
    "Fifo",
    "FitResume",
    "NaivePreemption",
    "PreemptionPolicy",
    "TeFirst",
    "make_preemption_policy",
    "preemption_options",
]


class PreemptionPolicy:
    """FIFO placement without preemption (the base every policy refines)."""

    name = "fifo"
    preempts = False
    #: Are trial-and-error jobs offered a place before best-effort ones? (The live plugin
    #: ranks TE tasks ahead within a user priority when so.)
    te_first = False

    def order_key(self, job: Any) -> tuple[Any, ...]:
        if self.te_first:
            return (job.cls != "te", job.arrival, job.jid)
        return (job.arrival, job.jid)

    def place(self, job: Any, nodes: Sequence[Any]) -> int | None:
        best: tuple[int, int] | None = None
        for node in nodes:
            left = node.available - job.gpus
            if left >= 0 and (best is None or (left, node.index) < best):
                best = (left, node.index)
        return None if best is None else best[1]

    def victims(
        self, job: Any, nodes: Sequence[Any], running: Sequence[Any], now: float
    ) -> tuple[int, list[Any]] | None:
        return None

    def reserve(
        self, job: Any, nodes: Sequence[Any], running: Sequence[Any], now: float
    ) -> int | None:
        """The node held for ``job``, the first best-effort job that does not fit (no
        later best-effort job is placed there until it starts); None: no reservation."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"policy": self.name}


class Fifo(PreemptionPolicy):
    """Jobs in arrival order; a job that does not fit waits and later ones may start."""


class TeFirst(PreemptionPolicy):
    """Trial-and-error jobs before best-effort ones (each in arrival order); no
    preemption: a TE job waits for running jobs to end."""

    name = "te-first"
    te_first = True


class NaivePreemption(TeFirst):
    """TE first; a TE job that does not fit preempts the youngest best-effort jobs
    (latest started first, whatever their size or checkpoints) until one node has room."""

    name = "naive"
    preempts = True

    def victims(
        self, job: Any, nodes: Sequence[Any], running: Sequence[Any], now: float
    ) -> tuple[int, list[Any]] | None:
        freed = {n.index: n.available for n in nodes}
        chosen: dict[int, list[Any]] = {n.index: [] for n in nodes}
        be = [r for r in running if r.job.cls == "be"]
        for r in sorted(be, key=lambda r: (-r.started, r.job.jid)):
            chosen[r.node].append(r)
            freed[r.node] += r.job.gpus
            if freed[r.node] >= job.gpus:
                return r.node, chosen[r.node]
        return None


class FitResume(TeFirst):
    """TE first; victims on one node whose GPUs, with the node's free ones, fit the TE
    job, losing the least GPU-seconds (work since their last checkpoints, restores),
    then with the least excess, then the fewest victims (least excess first lost 3-4x
    more work on the documented workload, docs/preemption.md). A best-effort
    job is exempt for ``min_runtime`` seconds after it (re)starts and after
    ``max_preemptions`` preemptions; at most ``max_candidates`` jobs of a node are
    weighed (the longest-running first). With ``reservation`` (the default) the first
    best-effort job that waits holds the node where it could start first, so that
    smaller later jobs do not pass it for ever (BE p95 +44.9% without it, +16.8% with
    it, on the documented workload)."""

    name = "fit-resume"
    preempts = True

    def __init__(
        self,
        min_runtime: float = 600.0,
        max_preemptions: int = 3,
        max_candidates: int = 10,
        reservation: bool = True,
    ) -> None:
        self.reservation = bool(reservation)
        if not (math.isfinite(min_runtime) and min_runtime >= 0):
            raise ValueError(f"min_runtime: expected seconds >= 0, got {min_runtime!r}")
        if max_preemptions < 0:
            raise ValueError(f"max_preemptions: expected >= 0, got {max_preemptions!r}")
        self.min_runtime = float(min_runtime)
        self.max_preemptions = int(max_preemptions)
        self.max_candidates = int(max_candidates)

    def eligible(self, r: Any, now: float) -> bool:
        return (
            r.job.cls == "be"
            and now - r.started >= self.min_runtime
            and r.preemptions < self.max_preemptions
        )

    def victims(
        self, job: Any, nodes: Sequence[Any], running: Sequence[Any], now: float
    ) -> tuple[int, list[Any]] | None:
        by_node: dict[int, list[Any]] = {}
        for r in running:
            if self.eligible(r, now):
                by_node.setdefault(r.node, []).append(r)
        best: tuple[Any, ...] | None = None
        choice: tuple[int, list[Any]] | None = None
        for node in nodes:
            need = job.gpus - node.available
            cands = sorted(by_node.get(node.index, ()), key=lambda r: (r.started, r.job.jid))
            cands = cands[: self.max_candidates]
            if need <= 0 or sum(r.job.gpus for r in cands) < need:
                continue
            for size in range(1, len(cands) + 1):
                for combo in itertools.combinations(cands, size):
                    gpus = sum(r.job.gpus for r in combo)
                    if gpus < need:
                        continue
                    lost = sum(r.lost_at(now) for r in combo)
                    score = (lost, gpus - need, size, node.index)
                    if best is None or score < best:
                        best, choice = score, (node.index, list(combo))
        return choice

    def reserve(
        self, job: Any, nodes: Sequence[Any], running: Sequence[Any], now: float
    ) -> int | None:
        """The node where ``job`` could start first, as its running jobs end."""
        if not self.reservation:
            return None
        best: tuple[float, int] | None = None
        for node in nodes:
            if node.gpus < job.gpus:
                continue
            have = node.available
            when = now
            for r in sorted((r for r in running if r.node == node.index), key=lambda r: r.end):
                if have >= job.gpus:
                    break
                have += r.job.gpus
                when = r.end
            if have >= job.gpus and (best is None or (when, node.index) < best):
                best = (when, node.index)
        return None if best is None else best[1]

    def describe(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "min_runtime": self.min_runtime,
            "max_preemptions": self.max_preemptions,
            "reservation": self.reservation,
        }


#: name -> factory, for ``daskjobs simulate preemption --policy``
PREEMPTION_POLICIES = {
    "fifo": Fifo,
    "te-first": TeFirst,
    "naive": NaivePreemption,
    "fit-resume": FitResume,
}


def preemption_options(settings: Any) -> dict[str, Any]:
    """The options of the configured policy (``daskjobs.preemption``) its factory takes:
    ``min_runtime`` and ``max_preemptions`` for fit-resume, none for the others."""
    if PREEMPTION_POLICIES.get(settings.policy) is FitResume:
        return {"min_runtime": settings.min_runtime, "max_preemptions": settings.max_preemptions}
    return {}


def make_preemption_policy(name: str, **options: Any) -> PreemptionPolicy:
    try:
        factory = PREEMPTION_POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown preemption policy {name!r}; known: {', '.join(PREEMPTION_POLICIES)}"
        ) from None
    return factory(**options)
