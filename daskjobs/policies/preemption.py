"""Preemption policies: which waiting job is placed first, and which running jobs make room.

Interactive work first (docs/explanation/preemption.md): *trial-and-error* (``te``) jobs, short
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

A driver asks all of it in **one call**, :meth:`PreemptionPolicy.decide`, once per round
(the simulator at every event, the live plugin every ``preemption.interval``, replay
through the simulator), and only enacts the :class:`PreemptionDecision` it gets: the
jobs placed, the victims asked to yield for each interactive job that fits nowhere
(:class:`Preemption`), the node held for the first best-effort job that waits
(:class:`Hold`), and why each waiting job that got none of these waits (:class:`Wait`).
Every record carries its reason, in words, for ``explain()`` and the audit trail, and its
``step``: the round's decisions in the order they were made (a driver enacts them in that
order). The round, in ``order_key`` order: a job whose victims are yielding starts once
its promised node has the room (``promised``); a job that fits is placed (on the node it
is queued on when that has room, else ``place``), best-effort jobs kept off a held node;
the first best-effort job that fits nowhere holds a node (``reserve``); an interactive
job that fits nowhere gets victims (``victims``: only runs not already ``signalled``; a
victim's ``group``, a gang, yields whole), and the units they free are promised to it.
Its cost: one sort of the waiting jobs, then per job what ``place``, ``reserve`` and
``victims`` cost (``victims`` is the expensive one: at most ``max_candidates`` runs of a
node weighed in combinations, for interactive jobs that fit nowhere only).

Views (any object with these attributes, :class:`WaitingJob`, :class:`RunningJob`,
:class:`NodeView`): a **waiting job** - ``jid``, ``cls`` (``"te"`` or ``"be"``),
``gpus``, ``arrival``, ``preemptions`` (of the job so far), ``promised`` (the node its
victims are freeing, or None), ``node`` (the node it is queued on, or None: the
simulator queues nothing), ``where`` (the node indices it may use at all, or None: any),
``end_at(t)`` (its expected end if it started at ``t``; ``math.inf`` when unknown); a
**running job** - ``job`` (with ``jid``, ``cls``, ``gpus``) plus ``node``, ``started``
(this run's start), ``preemptions``, ``end`` (its expected end), ``group`` (its gang, or
None), ``lost_at(t)`` (GPU-seconds lost if its resources were freed at ``t``: work since
its last checkpoint and the restore a new run pays); a **node** - ``index``, ``gpus``,
``free`` (not held by a running job), ``promised`` (freed, or freeing, for a job that
preempted for it) and ``available`` (``free - promised``). :meth:`order_key`,
:meth:`place`, :meth:`victims` and :meth:`reserve` read only the fields named in their
docs; they are the parts a policy refines.

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
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

__all__ = [
    "PREEMPTION_POLICIES",
    "Fifo",
    "FitResume",
    "Hold",
    "NaivePreemption",
    "NodeView",
    "Placement",
    "Preemption",
    "PreemptionDecision",
    "PreemptionPolicy",
    "RunningJob",
    "TeFirst",
    "Wait",
    "WaitingJob",
    "make_preemption_policy",
    "preemption_options",
]


class WaitingJob(Protocol):
    """A job waiting for a place, as :meth:`PreemptionPolicy.decide` reads it."""

    jid: Any
    cls: str
    gpus: float
    arrival: float
    preemptions: int
    promised: int | None
    node: int | None
    where: Collection[int] | None

    def end_at(self, t: float) -> float: ...


class RunningJob(Protocol):
    """A job's current run, as :meth:`PreemptionPolicy.decide` reads it."""

    job: Any  # jid, cls, gpus
    node: int
    started: float
    preemptions: int
    end: float
    group: Any

    def lost_at(self, t: float) -> float: ...


class NodeView(Protocol):
    """A node (a worker) with the managed resource."""

    index: int
    gpus: float
    free: float
    promised: float


class Placement(NamedTuple):
    """``job`` starts on ``node`` now (``kept``: the promise its victims made room for)."""

    step: int
    job: Any
    node: int
    reason: str
    kept: bool = False


class Preemption(NamedTuple):
    """``victims`` (running views, all on ``node``) are asked to yield for ``job``, and
    the units they free are promised to it; ``group`` are the other running members of
    the victims' gangs, which yield with them. ``lost``: GPU-seconds the victims lose."""

    step: int
    job: Any
    node: int
    victims: tuple[Any, ...]
    group: tuple[Any, ...]
    lost: float
    reason: str


class Hold(NamedTuple):
    """``node`` is held for ``job``, the first best-effort job that fits nowhere: no
    later best-effort job is placed there (in this round) until it starts."""

    step: int
    job: Any
    node: int
    reason: str


class Wait(NamedTuple):
    """``job`` waits this round, and why."""

    step: int
    job: Any
    reason: str


@dataclass(frozen=True, slots=True)
class PreemptionDecision:
    """One round's answer (see the module docs); ``steps()`` gives the placements and
    preemptions in the order they were decided, which is the order a driver enacts."""

    placements: tuple[Placement, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    reservations: tuple[Hold, ...] = ()
    waits: tuple[Wait, ...] = ()

    def steps(self) -> list[Placement | Preemption]:
        out: list[Placement | Preemption] = [*self.placements, *self.preemptions]
        out.sort(key=lambda s: s.step)
        return out

    @property
    def victims(self) -> tuple[Any, ...]:
        """Every running view asked to yield (victims, then their gangs' members)."""
        return tuple(v for p in self.preemptions for v in (*p.victims, *p.group))

    def reasons(self) -> dict[Any, str]:
        """Job id -> why it starts, preempts, holds a node or waits (the last word of
        the round for each job)."""
        recs: list[Placement | Preemption | Hold | Wait] = [
            *self.placements,
            *self.preemptions,
            *self.reservations,
            *self.waits,
        ]
        recs.sort(key=lambda r: r.step)
        return {r.job.jid: r.reason for r in recs}


class _Room:
    """A node's units as the round changes them (``decide``'s working copy; ``available``
    an attribute kept equal to ``free - promised``, not a property: ``place`` reads it
    for every node, for every waiting job, at every event of the simulator)."""

    __slots__ = ("available", "free", "gpus", "index", "promised")

    def __init__(self, index: int, gpus: float, free: float, promised: float) -> None:
        self.index = index
        self.gpus = gpus
        self.free = free
        self.promised = promised
        self.available = free - promised

    def set(self, free: float, promised: float) -> None:
        self.free = free
        self.promised = promised
        self.available = free - promised


class _Started:
    """A job placed earlier in the round, as a running view for the rest of it."""

    __slots__ = ("end", "group", "job", "node", "preemptions", "started")

    def __init__(self, job: Any, node: int, now: float) -> None:
        self.job = job
        self.node = node
        self.started = now
        self.preemptions = job.preemptions
        self.end = job.end_at(now)
        self.group = None

    def lost_at(self, t: float) -> float:
        # nothing is lost of a run that starts now (no work, no restore yet)
        return 0.0 * self.job.gpus


def _fmt(x: float) -> str:
    return f"{x:g}"


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

    def decide(
        self,
        waiting: Iterable[Any],
        running: Iterable[Any],
        nodes: Sequence[Any],
        now: float,
        signalled: Collection[Any] = (),
    ) -> PreemptionDecision:
        """One round (see the module docs): the waiting jobs placed, the victims of the
        interactive ones that fit nowhere, the node held for the first best-effort job
        that fits nowhere, and why the rest wait. ``signalled``: ids of running jobs
        already asked to yield (never chosen again). Raises ``RuntimeError`` if
        :meth:`victims` answers victims that do not make room on one node."""
        rooms = [_Room(n.index, n.gpus, n.free, n.promised) for n in nodes]
        by_index = {r.index: r for r in rooms}
        runs: list[Any] = list(running)
        asked: set[Any] = set(signalled)
        placements: list[Placement] = []
        preemptions: list[Preemption] = []
        holds: list[Hold] = []
        waits: list[Wait] = []
        reserved: set[int] = set()  # nodes held for the first best-effort job that waits
        step = 0
        # the reasons, built once a round (a long queue waits at every event)
        nowhere = f"fits nowhere ({self.name})"
        no_victims = f"fits nowhere and no victims make room ({self.name})"
        fits, fits_here = f"fits ({self.name})", f"fits where it is queued ({self.name})"
        for job in sorted(waiting, key=self.order_key):
            step += 1
            gpus = job.gpus
            where = job.promised
            if where is not None:
                room = by_index.get(where)
                if room is None:
                    waits.append(Wait(step, job, f"its promised node {where} is gone"))
                elif room.free >= gpus:  # its victims have left: the promise is kept
                    room.set(room.free - gpus, room.promised - gpus)
                    runs.append(_Started(job, where, now))
                    placements.append(
                        Placement(step, job, where, "starts where its victims made room", True)
                    )
                else:
                    waits.append(Wait(step, job, f"its victims are yielding on node {where}"))
                continue
            allowed = job.where
            offer: Sequence[Any] = rooms
            if reserved and job.cls != "te":
                offer = [r for r in rooms if r.index not in reserved]
            if allowed is not None:
                offer = [r for r in offer if r.index in allowed]
            here = job.node
            room = by_index.get(here) if here is not None else None
            if room is not None and room in offer and room.available >= gpus:
                idx: int | None = here
                why = fits_here
            else:
                idx = self.place(job, offer)
                why = fits
            if idx is not None:
                room = by_index[idx]
                room.set(room.free - gpus, room.promised)
                runs.append(_Started(job, idx, now))
                placements.append(Placement(step, job, idx, why))
                continue
            said = False
            if job.cls == "be" and not reserved:
                mine = rooms if allowed is None else [r for r in rooms if r.index in allowed]
                r = self.reserve(job, mine, runs, now)
                if r is not None:
                    reserved.add(r)
                    holds.append(
                        Hold(
                            step,
                            job,
                            r,
                            f"holds node {r}: the first best-effort job that fits nowhere, "
                            f"it starts there first ({self.name})",
                        )
                    )
                    said = True
            if self.preempts and job.cls == "te":
                mine = rooms if allowed is None else [r for r in rooms if r.index in allowed]
                live = [r for r in runs if r.job.jid not in asked]
                choice = self.victims(job, mine, live, now)
                if choice is not None:
                    preemptions.append(
                        self._preemption(step, job, choice, by_index, runs, asked, now)
                    )
                    continue
                waits.append(Wait(step, job, no_victims))
                continue
            if not said:
                waits.append(Wait(step, job, nowhere))
        return PreemptionDecision(tuple(placements), tuple(preemptions), tuple(holds), tuple(waits))

    def _preemption(
        self,
        step: int,
        job: Any,
        choice: tuple[int, list[Any]],
        by_index: dict[int, _Room],
        runs: list[Any],
        asked: set[Any],
        now: float,
    ) -> Preemption:
        """Validate and record the victims :meth:`victims` chose for ``job``."""
        idx, victims = choice
        room = by_index.get(idx)
        freed = None if room is None else room.available + sum(v.job.gpus for v in victims)
        if (
            freed is None
            or freed < job.gpus
            or any(v.node != idx or v.job.jid in asked for v in victims)
        ):
            raise RuntimeError(f"policy {self.name}: victims do not make room on {idx}")
        assert room is not None
        room.set(room.free, room.promised + job.gpus)
        for v in victims:
            asked.add(v.job.jid)
        groups = {v.group for v in victims if v.group is not None}
        group: list[Any] = []
        if groups:  # a gang yields whole
            for r in runs:
                if r.group in groups and r.job.jid not in asked:
                    asked.add(r.job.jid)
                    group.append(r)
        lost = sum(v.lost_at(now) for v in victims)
        names = ", ".join(str(v.job.jid) for v in victims)
        reason = (
            f"fits nowhere: preempts {names} on node {idx} "
            f"({_fmt(freed)} units free then, {_fmt(lost)} GPU-seconds lost; {self.name})"
        )
        if group:
            reason += f"; with {len(group)} other member(s) of their gang(s)"
        return Preemption(step, job, idx, tuple(victims), tuple(group), lost, reason)

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
    more work on the documented workload, docs/explanation/preemption.md). A best-effort
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
    ``min_runtime``, ``max_preemptions`` and ``reservation`` for fit-resume, none for the
    others."""
    if PREEMPTION_POLICIES.get(settings.policy) is FitResume:
        return {
            "min_runtime": settings.min_runtime,
            "max_preemptions": settings.max_preemptions,
            "reservation": settings.reservation,
        }
    return {}


def make_preemption_policy(name: str, **options: Any) -> PreemptionPolicy:
    try:
        factory = PREEMPTION_POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown preemption policy {name!r}; known: {', '.join(PREEMPTION_POLICIES)}"
        ) from None
    return factory(**options)
