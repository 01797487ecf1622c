"""Speculative execution: when does a running attempt get a backup copy?

An attempt is *late* once it has run ``late_factor`` times its estimate, scaled
by the believed slow-down of the node it runs on (1.0 unless the policy learns
node speeds), and at least ``min_runtime`` seconds. A late attempt gets one
backup copy on another node; the first copy to finish wins and the other is
killed (its core-time is waste).

Why 2.5: if estimates are the true duration times ``exp(0.3 z)`` with ``z``
standard normal, a healthy attempt passes ``2.5 x`` its estimate only when
``exp(-0.3 z) > 2.5``, i.e. ``z < -ln(2.5) / 0.3 = -3.05``: probability
0.11%. Ten thousand healthy tasks then launch about eleven needless backups,
while any attempt slowed 2.5x or more (a slow node, a sick disk) is caught.

A task whose estimate comes with a band (a duration model's 10-90% band over the
task's parameters: the optional view field ``band`` of
:data:`~daskjobs.policies.base.OPTIONAL_FIELDS`) is judged against its own band:
``late_factor`` is calibrated for estimates within
``exp(0.3 z)`` of the truth, whose band tops out at :data:`BAND_TOP` (1.47) times the
estimate, so the deadline is ``late_factor x max(estimate, top of the band / BAND_TOP)``:
a band as narrow as that noise changes nothing; a wider one (a model unsure of this
task, few observations) moves the deadline out in proportion. A task predicted long is
not late for being long: its estimate is long. Without a band (an annotation, the
simulator's views) the rule is the one above.

At most ``max_fraction`` of all slots (at least one) run backups at once, as
Hadoop caps speculative tasks at 10% of running ones.

The end game (``endgame=True``, off by default). Once no task waits to start (the
driver says ``waiting=0``: nothing queued, nothing waiting for inputs), idle capacity
has nothing else to do: the running attempts that want no copy are ranked by expected
end (start + estimate x believed slow-down, never less than half of it still to come:
:func:`expected_left`), latest first, and each takes a free slot of a node that
:meth:`choose` accepts (not believed slower than its own, never a busy one), one copy
per attempt, within the cap. The first copy to finish wins. A copy runs the task's own
work, so it ends first only where the primary's node is slower than believed or the
primary fails after the copy started (a restart would begin later): it is insurance
bought with capacity nothing else wanted. An attempt that merely runs over its
estimate runs as long on the copy, so the end game cannot shorten that tail.

A policy may also ask for a backup before the deadline, through
:meth:`~daskjobs.policies.base.Policy.urgent` (for instance when it has learned
that the attempt's node is slow and a copy elsewhere would finish first).

Every decision about copies is made here, and the simulator, the live plugin and
replay only adapt their state and enact the answer:

* :meth:`Speculation.may_copy` - which tasks may ever be copied: those not
  annotated ``speculate=False`` whose estimate is real (an annotation or a measured
  history, not a configured default: there is nothing to be late against).
* :meth:`Speculation.verdict` - does a running attempt want a copy now, and why:
  ``"late"`` (past its deadline) or ``"urgent"`` (the policy says so), else None.
* :meth:`Speculation.may_queue` - may its copy wait on a busy node: only if the
  attempt would otherwise end after the projected end of the run (the horizon).
* :meth:`Speculation.choose` - where the copy goes: candidate nodes in (the driver
  filters what cannot run it at all: resources, restrictions, dead workers), the
  best one out, with a reason for each refusal.
* :meth:`Speculation.reclaimed` - losers' threads: dask cannot stop a thread, so a
  losing copy (or a beaten primary) runs on and holds its slot until its worker
  reports that it returned. A thread with no such report ``reclaim_after +
  reclaim_factor x estimate`` seconds after its release (60 s + 3 x the estimate by
  default: three times as long as the task should take, plus a minute for a slow
  report) is taken for returned, so that a lost report cannot hold a slot for ever.
* :meth:`Speculation.moves` - tasks assigned to a node whose threads losers hold, and
  that would not find a thread there (those beyond its slots less the losers less the
  attempts running), move to the fastest believed node with an idle slot, one per
  idle slot.

:meth:`Speculation.decide` asks all of these in one call, as
:meth:`GangPolicy.decide <daskjobs.policies.resources.GangPolicy.decide>` does for
gangs, and answers with a :class:`SpeculationDecision`: the verdict and deadline of
every attempt judged, where each wanted copy goes (or why nowhere), which losers'
threads are taken back and which waiting tasks move where, each with its reason.
The simulator, the live plugin and replay call it and only enact the answer; the
reasons are what ``explain()`` and the audit trail report.

Cost: ``verdict`` and ``may_queue`` O(1); ``choose`` O(candidates); ``decide``
O(judged x candidates + losers + moved tasks x idle nodes), and in the end game
O(judged log judged) more for the ranking.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

from daskjobs import _defaults

_tuple = tuple.__new__  # a NamedTuple record built without its Python-level constructor

__all__ = [
    "AHEAD",
    "BAND_TOP",
    "SIMILAR",
    "Candidate",
    "Copy",
    "Held",
    "Horizon",
    "Loser",
    "Move",
    "Reclaim",
    "Speculation",
    "SpeculationDecision",
    "Verdict",
    "expected_left",
    "projected_end",
]

# The defaults of late_factor and max_fraction are the plugin's, read from the one place
# they are written (daskjobs.yaml, ``daskjobs.speculation``): a simulated or replayed
# backup follows the live rule unless told otherwise. _defaults reads the YAML with
# PyYAML only, so the policy core still imports neither distributed nor dask's config.
_LATE_FACTOR = float(_defaults.default("speculation.late-factor"))
_MAX_FRACTION = float(_defaults.default("speculation.max-fraction"))
_AHEAD = str(_defaults.default("speculation.ahead"))
#: The values of ``Speculation.ahead``.
AHEAD = ("past-horizon", "always")

#: The top (90% quantile) of the band of an estimate within ``exp(0.3 z)`` of the truth, as a
#: multiple of the estimate: the noise ``late_factor`` is calibrated for (module docstring).
BAND_TOP = math.exp(0.3 * 1.2815515655446004)

#: Believed speeds within this factor of each other count as the same speed: the
#: learner's own noise (a node believed 1.02 is not slower than one believed 1.0).
SIMILAR = 1.2


def expected_left(start: float, estimate: float, speed: float, now: float) -> float:
    """What is left of an attempt: its estimate scaled to its node, less what has run,
    but never below half of it (an attempt past its expected end is not about to
    finish: it is evidence that the node, or the estimate, is worse)."""
    scaled = estimate * speed
    left = start + scaled - now
    half = 0.5 * scaled
    return left if left > half else half


def projected_end(now: float, work: float, capacity: float) -> float:
    """The horizon: the earliest the run could end, ``now + work / capacity``, with
    ``work`` the queued and expected remaining running seconds and ``capacity`` the
    effective cores (``sum(cores / believed slow-down)``)."""
    return now + work / capacity if capacity > 0 else math.inf


class Horizon:
    """The sums behind :func:`projected_end`, kept in O(1) per event, for a driver or a
    wrapper policy that sees tasks queue, start and end (the live plugin, replay): the
    estimated work queued, and for each running attempt its cores and expected end
    (start + estimate x the node's believed slow-down). :class:`NodeAware` keeps the
    same sums inside its own queue."""

    __slots__ = ("_run", "queued", "run_cores", "run_end")

    def __init__(self) -> None:
        self.queued = 0.0  # estimated core-seconds queued
        self.run_cores = 0
        self.run_end = 0.0  # sum of cores x expected end of the running attempts
        self._run: dict[Any, tuple[int, float]] = {}

    def push(self, estimate: float, cores: int = 1) -> None:
        self.queued += estimate * cores

    def pop(self, estimate: float, cores: int = 1) -> None:
        self.queued = max(self.queued - estimate * cores, 0.0)

    def started(self, attempt: Any, cores: int, end: float) -> None:
        self._run[attempt] = (cores, end)
        self.run_cores += cores
        self.run_end += cores * end

    def ended(self, attempt: Any) -> None:
        got = self._run.pop(attempt, None)
        if got is not None:
            self.run_cores -= got[0]
            self.run_end -= got[0] * got[1]

    def value(self, now: float, capacity: float) -> float:
        remaining = self.run_end - now * self.run_cores
        return projected_end(now, self.queued + (remaining if remaining > 0 else 0.0), capacity)


class Candidate(Protocol):
    """A node a copy could go to, as the driver sees it now."""

    @property
    def index(self) -> int: ...
    @property
    def free(self) -> int: ...  # free slots now
    @property
    def cores(self) -> int: ...
    @property
    def copies(self) -> int: ...  # copies running or queued there now
    @property
    def same_host(self) -> bool: ...  # on the primary's host (a worse place for a copy)
    @property
    def name(self) -> str: ...  # how reasons name it (a worker's address, "node 3")


C = TypeVar("C", bound=Candidate)


class Loser(Protocol):
    """A losing attempt whose thread still runs: dask cannot stop a thread, so the
    driver released it at ``released`` and waits for its worker to say it returned."""

    @property
    def node(self) -> int: ...
    @property
    def key(self) -> Hashable: ...
    @property
    def released(self) -> float: ...
    @property
    def estimate(self) -> float: ...


class Held(Protocol):
    """A node some losers' threads may hold, as the driver sees it now."""

    @property
    def index(self) -> int: ...
    @property
    def cores(self) -> int: ...  # its slots
    @property
    def started(self) -> int: ...  # attempts running there (not losers)
    @property
    def waiting(self) -> Sequence[Any]: ...  # assigned there, not started, in start order


# The records of a decision are NamedTuples: the simulator asks for one at every deadline
# and every slot a waiting copy is offered, and a tuple is built in a tenth of the time a
# frozen dataclass takes (its fields set through object.__setattr__). Reasons are
# properties, formatted only when read (by explain, the audit trail, a log).


class Verdict(NamedTuple):
    """A running attempt judged: ``why`` is ``"late"`` (past ``deadline``), ``"urgent"``
    (the policy asks for a copy before it) or None (judged again at ``deadline``, or
    never: ``deadline`` is ``inf`` for a task that may not be copied)."""

    attempt: Any
    deadline: float
    why: str | None
    now: float  # when it was judged

    @property
    def reason(self) -> str:
        if self.why == "urgent":
            return "urgent: the policy wants a copy before its deadline"
        start = self.attempt.start
        if self.why == "late":
            return f"late: ran {self.now - start:.3g} s, deadline {self.deadline - start:.3g} s"
        if self.deadline == math.inf:
            return "never copied (speculate=False, or no real estimate)"
        return f"on time until {self.deadline - start:.3g} s"


class Copy(NamedTuple):
    """A copy wanted for ``attempt`` (``why``: "late", "urgent", "endgame" for a spare
    copy on an idle node once nothing waits, or "asked" for a copy asked earlier that
    waits for a place): on ``target`` (a candidate; ``queued``: it
    waits there for a slot, ahead of the work queued there), or nowhere yet (None;
    ``refusal`` says why). ``ahead``: it may go ahead of queued work
    (:meth:`Speculation.may_queue`)."""

    attempt: Any
    why: str
    target: Any | None
    ahead: bool
    refusal: str = ""
    queued: bool = False

    @property
    def reason(self) -> str:
        if self.why == "endgame" and self.target is not None:
            return f"endgame: nothing waits; a spare copy on idle {self.target.name}"
        if self.target is None:
            return f"{self.why}, not copied: {self.refusal}"
        ahead = ", ahead of its queued work" if self.queued else ""
        return f"{self.why}: copied to {self.target.name}{ahead}"


class Reclaim(NamedTuple):
    """A loser's thread taken for returned (its worker never said so in time) at ``at``."""

    loser: Any
    at: float

    @property
    def reason(self) -> str:
        lo = self.loser
        return (
            f"the thread of {lo.key} on node {lo.node} taken for returned: "
            f"no word from its worker {self.at - lo.released:.0f} s after its release"
        )


class Move(NamedTuple):
    """A task waiting on node ``source`` behind ``losers`` threads (``free`` threads left
    there), moved to ``target`` (a candidate with an idle slot)."""

    task: Any
    source: int
    target: Any
    losers: int
    free: int

    @property
    def reason(self) -> str:
        return (
            f"waited on node {self.source} behind {self.losers} loser thread(s) "
            f"({self.free} free): moved to {self.target.name}"
        )


class _Decision(NamedTuple):
    verdicts: tuple[Verdict, ...] = ()
    copies: tuple[Copy, ...] = ()
    reclaimed: tuple[Reclaim, ...] = ()
    moves: tuple[Move, ...] = ()


class SpeculationDecision(_Decision):
    """What :meth:`Speculation.decide` answers: enact it, do not re-derive it.

    ``verdicts``: every attempt judged, in the order given; ``copies``: every copy
    wanted (the late and urgent judged, then the asked), placed or not; ``reclaimed``:
    losers' threads taken back; ``moves``: waiting tasks moved off held nodes.
    Checked on construction: one copy per attempt, never on the attempt's own node; a
    move never to its own source. A NamedTuple, as its records: built at every
    question the simulator asks.
    """

    __slots__ = ()

    def __new__(
        cls,
        verdicts: tuple[Verdict, ...] = (),
        copies: tuple[Copy, ...] = (),
        reclaimed: tuple[Reclaim, ...] = (),
        moves: tuple[Move, ...] = (),
    ) -> SpeculationDecision:
        return _checked(verdicts, copies, reclaimed, moves, cls)

    @property
    def late(self) -> tuple[Verdict, ...]:
        """The attempts that want a copy now (late or urgent)."""
        return tuple(v for v in self.verdicts if v.why is not None)

    @property
    def placed(self) -> tuple[Copy, ...]:
        """The copies that go somewhere now."""
        copies = self.copies
        if len(copies) == 1:  # the simulator's question at a free slot: one copy
            return copies if copies[0].target is not None else ()
        return tuple([c for c in copies if c.target is not None])


def _checked(
    verdicts: tuple[Verdict, ...],
    copies: tuple[Copy, ...],
    reclaimed: tuple[Reclaim, ...],
    moves: tuple[Move, ...],
    cls: type[SpeculationDecision] = SpeculationDecision,
) -> SpeculationDecision:
    """A decision, checked: one copy per attempt, never on the attempt's own node; a move
    never to its own source. (A function, not only the class's constructor: decide
    builds one at every question the simulator asks, and a call of a class costs more
    than a call of a function.)"""
    if copies:
        if len(copies) > 1 and len({id(c.attempt) for c in copies}) < len(copies):
            raise ValueError("two copies of one attempt in a decision")
        for c in copies:
            if c.target is not None and c.target.index == c.attempt.node:
                raise ValueError(f"a copy on its primary's own node {c.attempt.node}")
    for m in moves:
        if m.target.index == m.source:
            raise ValueError(f"a move from node {m.source} to itself")
    return _tuple(cls, (verdicts, copies, reclaimed, moves))


@dataclass(frozen=True, slots=True)
class Speculation:
    """When to launch backup copies of late attempts.

    ``late_factor`` and ``max_fraction`` default to the plugin's defaults
    (``daskjobs.speculation`` in daskjobs.yaml). ``min_runtime`` defaults to no floor,
    not to the plugin's ``min-runtime``: that floor guards a live scheduler, whose starts
    and deadlines are seen by a periodic check, against copying sub-second tasks;
    simulated times are exact and often stand for hours. A replay of a recorded run
    takes the run's floor (the plugin's default if the trace does not say).
    """

    late_factor: float = _LATE_FACTOR
    min_runtime: float = 0.0
    max_fraction: float = _MAX_FRACTION
    #: When a copy may go ahead of queued work: "past-horizon" or "always" (see may_queue).
    ahead: str = _AHEAD
    #: How often running attempts are judged (late? urgent?), seconds. The plugin judges
    #: them on a periodic check (``speculation.interval``); a replay takes the recorded
    #: interval, so that its copies are noticed when the live ones were. 0 (the
    #: simulator's default): at once, a late attempt at its deadline and urgency at each
    #: event that can change it.
    interval: float = 0.0
    #: A loser's thread with no word from its worker this many seconds plus
    #: ``reclaim_factor`` x its estimate after its release is taken for returned.
    reclaim_after: float = 60.0
    reclaim_factor: float = 3.0
    #: The end game (module docstring): when no task waits to start (``decide(...,
    #: waiting=0)``), idle nodes take copies of the running attempts expected to end
    #: last. Off by default.
    endgame: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.endgame, bool):
            raise TypeError(f"endgame must be True or False, got {self.endgame!r}")
        if self.ahead not in AHEAD:
            raise ValueError(f"ahead must be one of {', '.join(AHEAD)}, got {self.ahead!r}")
        for name in (
            "late_factor",
            "min_runtime",
            "max_fraction",
            "interval",
            "reclaim_after",
            "reclaim_factor",
        ):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise TypeError(f"{name} must be a number, got {type(value).__name__}: {value!r}")
        if not (math.isfinite(self.late_factor) and self.late_factor > 1.0):
            raise ValueError(f"late_factor must be a finite number > 1, got {self.late_factor!r}")
        if not (math.isfinite(self.min_runtime) and self.min_runtime >= 0):
            raise ValueError(f"min_runtime must be >= 0 seconds, got {self.min_runtime!r}")
        if not (0 < self.max_fraction <= 1):
            raise ValueError(f"max_fraction must be in (0, 1], got {self.max_fraction!r}")
        if not (math.isfinite(self.interval) and self.interval >= 0):
            raise ValueError(f"interval must be >= 0 seconds, got {self.interval!r}")
        if not (math.isfinite(self.reclaim_after) and self.reclaim_after >= 0):
            raise ValueError(f"reclaim_after must be >= 0 seconds, got {self.reclaim_after!r}")
        if not (math.isfinite(self.reclaim_factor) and self.reclaim_factor >= 0):
            raise ValueError(f"reclaim_factor must be >= 0, got {self.reclaim_factor!r}")

    def deadline(
        self, start: float, estimate: float, speed: float = 1.0, high: float | None = None
    ) -> float:
        """Time at which an attempt started at ``start`` counts as late; ``high``, the top
        of the estimate's band if it has one, moves it out when the band is wider than
        the noise ``late_factor`` is calibrated for (:data:`BAND_TOP`)."""
        if high is not None:
            estimate = self.banded(estimate, high)
        late = self.late_factor * estimate * speed
        floor = self.min_runtime
        return start + (late if late > floor else floor)  # max(floor, late), without a call

    @staticmethod
    def banded(estimate: float, high: float | None) -> float:
        """The estimate lateness is judged by: ``estimate``, or ``high / BAND_TOP`` when
        the band's top ``high`` is wider than the noise ``late_factor`` is calibrated for."""
        if high is not None and high > estimate * BAND_TOP:
            return high / BAND_TOP
        return estimate

    def cap(self, total_slots: int) -> int:
        """Most backups running at once on a cluster of ``total_slots``."""
        return max(1, int(self.max_fraction * total_slots))

    # -- the decisions ------------------------------------------------------------
    @staticmethod
    def may_copy(task: Any) -> bool:
        """May ``task`` ever get a copy? Not if annotated ``speculate=False``, and not
        if its estimate is only a configured default (``estimated`` False)."""
        return getattr(task, "speculate", True) is not False and getattr(task, "estimated", True)

    def verdict(self, attempt: Any, now: float, policy: Any) -> str | None:
        """``"late"`` past the deadline (scaled by the node's believed slow-down),
        ``"urgent"`` when the policy asks for a copy before it, else None."""
        return self._judge(attempt, now, policy, policy.speed(attempt.node))[1]

    def _judge(
        self, attempt: Any, now: float, policy: Any, speed: float
    ) -> tuple[float, str | None]:
        """``(deadline, verdict)`` of ``attempt`` on a node believed ``speed``."""
        task = attempt.task
        band = getattr(task, "band", None)
        # the band widens the estimate here, so that a subclass's deadline(start, estimate,
        # speed) (the extension point before bands) judges banded tasks too
        estimate = self.banded(task.estimate, band[1]) if band else task.estimate
        d = self.deadline(attempt.start, estimate, speed)
        if now >= d:
            return d, "late"
        if policy.urgent(attempt, now):
            return d, "urgent"
        return d, None

    def may_queue(self, attempt: Any, now: float, speed: float, horizon: float) -> bool:
        """May the copy go ahead of queued work (wait for a busy node's next slot before
        the tasks queued there)? With ``ahead="always"`` yes: the published model, which
        starts a backup as soon as an attempt is late and kills the loser. With
        ``"past-horizon"`` only if the attempt would otherwise end after the projected end
        of the run; other copies take slots no queued task wants. The live default is
        ``past-horizon`` because dask cannot stop a thread: a copy run ahead of queued work
        leaves the loser holding its thread until it ends."""
        if self.ahead == "always":
            return True
        return now + expected_left(attempt.start, attempt.task.estimate, speed, now) > horizon

    def choose(
        self,
        attempt: Any,
        candidates: Sequence[C],
        policy: Any,
        may_queue: bool = False,
    ) -> tuple[C | None, str]:
        """Where the copy of ``attempt`` goes: the best candidate and ``"ok"``, or None
        and why nothing fits.

        A candidate with free slots for the task qualifies unless it is the primary's
        node or believed slower than the primary's (beyond :data:`SIMILAR`), or the
        primary's node is believed slow and the candidate is not believed faster (by
        more than :data:`SIMILAR`: a copy there cannot end first); a busy
        one only with ``may_queue``, if it holds no other copy and is believed faster
        than the primary's (the copy then waits for that node's next free slot, ahead
        of its queued work). Best first: a free node before a busy one, another host
        before the primary's, the fastest believed, the least loaded, the lowest index
        (deterministic).
        """
        return self._choose(attempt, candidates, policy, may_queue, None)

    def _choose(
        self,
        attempt: Any,
        candidates: Sequence[C],
        policy: Any,
        may_queue: bool,
        taken: dict[int, list[int]] | None,
    ) -> tuple[C | None, str]:
        """:meth:`choose`, with ``taken`` {node: [slots taken, copies added]} by the
        decisions made earlier in the same :meth:`decide` (and the losers' threads)."""
        primary = policy.speed(attempt.node)
        cores = attempt.task.cores
        best = None
        best_rank: tuple[Any, ...] | None = None
        why = "no candidate node"
        for c in candidates:
            if c.index == attempt.node:
                continue
            speed = policy.speed(c.index)
            free = c.free
            copies = c.copies
            if taken:
                t = taken.get(c.index)
                if t is not None:
                    free -= t[0]
                    copies += t[1]
            busy = free < cores
            if busy:
                if not may_queue:
                    why = "no free slot on a node as fast as the primary's"
                    continue
                if copies or not speed < primary:
                    why = "no faster busy node without a copy"
                    continue
            elif speed > primary * SIMILAR:
                why = "only nodes believed slower than the primary's are free"
                continue
            elif primary > SIMILAR and not speed * SIMILAR < primary:
                # the primary's node is believed slow: a copy on a node as slow starts
                # later at the same pace, and would take the task's one copy from a
                # faster node that frees up later
                why = "only nodes as slow as the primary's are free"
                continue
            load = (c.cores - free) / c.cores if c.cores else 1.0
            rank = (busy, c.same_host, speed, load, c.index)
            if best_rank is None or rank < best_rank:
                best, best_rank = c, rank
        return (best, "ok") if best is not None else (None, why)

    # -- losers' threads -----------------------------------------------------------
    def reclaim_at(self, released: float, estimate: float) -> float:
        """When a loser's thread released at ``released`` is taken for returned."""
        return released + self.reclaim_after + self.reclaim_factor * estimate

    def reclaimed(self, losers: Iterable[Loser], now: float) -> list[Reclaim]:
        """The losers whose thread is taken for returned by ``now`` (no word from its
        worker by :meth:`reclaim_at`, ``now`` included)."""
        out = []
        for lo in losers:
            at = self.reclaim_at(lo.released, lo.estimate)
            if now >= at:
                out.append(Reclaim(lo, at))
        return out

    def moves(
        self,
        held: Iterable[Held],
        losers: dict[int, int],
        idle: Sequence[C],
        policy: Any,
        taken: dict[int, list[int]] | None = None,
    ) -> list[Move]:
        """The tasks waiting on a node whose threads ``losers`` {node: threads held}
        hold, beyond what its free threads will start, each to the fastest believed
        ``idle`` node with a free slot (least loaded, lowest index next) that losers
        do not hold; one task per free slot, until none is left."""
        taken = {} if taken is None else taken
        out: list[Move] = []
        for h in held:
            n = losers.get(h.index, 0)
            if not n:
                continue
            free = h.cores - n - h.started
            stay = free if free > 0 else 0
            for task in h.waiting[stay:]:
                best = None
                best_rank: tuple[Any, ...] | None = None
                for c in idle:
                    if c.index == h.index or losers.get(c.index):
                        continue
                    t = taken.get(c.index)
                    left = c.free - (t[0] if t is not None else 0)
                    if left < task.cores:
                        continue
                    load = (c.cores - left) / c.cores if c.cores else 1.0
                    rank = (policy.speed(c.index), load, c.index)
                    if best_rank is None or rank < best_rank:
                        best, best_rank = c, rank
                if best is None:
                    return out  # no idle slot anywhere: the rest wait where they are
                t = taken.setdefault(best.index, [0, 0])
                t[0] += task.cores
                out.append(Move(task, h.index, best, n, stay))
        return out

    # -- the one call ---------------------------------------------------------------
    def decide(
        self,
        now: float,
        policy: Any,
        *,
        judge: Iterable[Any] = (),
        asked: Iterable[Any] = (),
        candidates: Sequence[C] | Callable[[Any], Sequence[C]] = (),
        horizon: float | Callable[[], float] | None = None,
        running: int = 0,
        slots: int | None = None,
        losers: Iterable[Loser] = (),
        held: Iterable[Held] = (),
        idle: Sequence[C] = (),
        waiting: int | None = None,
    ) -> SpeculationDecision:
        """Every speculation decision a driver needs at ``now``, in one call.

        ``judge``: running primaries (attempt views: ``task``, ``node``, ``start``) to
        judge (:meth:`may_copy`, :meth:`verdict`); each that wants a copy gets one,
        placed on ``candidates`` (a sequence, or a function of the attempt for
        drivers whose candidates depend on the task: resources, restrictions) by
        :meth:`choose`, allowed ahead of queued work if :meth:`may_queue` says so
        against ``horizon`` (a number, a function called at most once, or None:
        ``policy.horizon(now)``). ``asked``: attempts judged earlier whose copy waits
        for a place: placed the same way, never ahead (a free slot only). At most
        :meth:`cap` of ``slots`` copies run, ``running`` already (no cap without
        ``slots``). Copies placed earlier in the call take their slot on their
        candidate; a candidate's threads held by losers are not free.

        ``losers``: losing attempts whose threads still run; those past
        :meth:`reclaim_at` are reclaimed (:meth:`reclaimed`), and tasks waiting behind
        the others on the ``held`` nodes move to ``idle`` nodes (:meth:`moves`).

        ``waiting``: the tasks that wait to start (queued, or waiting for their inputs;
        None: not known). With :attr:`endgame` on and ``waiting`` 0, the judged attempts
        that want no copy and have run ``min_runtime`` are ranked by expected end, latest
        first, and each takes a free slot on a candidate as :meth:`choose` places a copy
        (never a busy node), within the cap: the end game (module docstring). Only placed
        end-game copies are in the answer (``why`` ``"endgame"``); where no slot is free,
        none is wanted.
        """
        # Written for the simulator's sake: it asks at every deadline and every slot a
        # waiting copy is offered, so the common call (one attempt, no losers) builds
        # little beyond the records it returns: the records are built as the tuples they
        # are (``_tuple(Verdict, ...)``: what a NamedTuple's own constructor does, without
        # its Python-level call), and a decision with no copy and no move has nothing to
        # check (SpeculationDecision's checks are on those). The judging loop, which every
        # call runs, stays inline; what only some calls need (losers, placing wanted
        # copies, the end game) is a method of its own, one call where it is needed.
        taken: dict[int, list[int]] = {}  # node -> [slots taken, copies added]
        reclaims: tuple[Reclaim, ...] = ()
        holding: dict[int, int] | None = None  # node -> losers' threads still held there
        if losers:
            reclaims, holding = self._hold(losers, now, taken)
        verdicts: list[Verdict] = []
        wants: list[tuple[Any, str, bool]] = []  # (attempt, why, ahead), in order
        endgame = self.endgame and waiting == 0
        # end game: (-expected end, order, attempt); nothing is added without it
        spare: list[tuple[float, int, Any]] = []
        if judge:
            h: float | None = None
            for a in judge:
                if not self.may_copy(a.task):
                    verdicts.append(_tuple(Verdict, (a, math.inf, None, now)))
                    continue
                speed = policy.speed(a.node)
                d, why = self._judge(a, now, policy, speed)
                verdicts.append(_tuple(Verdict, (a, d, why, now)))
                if why is None:
                    if endgame and now - a.start >= self.min_runtime:
                        left = expected_left(a.start, a.task.estimate, speed, now)
                        spare.append((-(now + left), len(spare), a))
                    continue
                if h is None and self.ahead != "always":
                    if horizon is None:
                        h = policy.horizon(now)
                    else:
                        h = horizon() if callable(horizon) else horizon
                ahead = self.may_queue(a, now, speed, math.inf if h is None else h)
                wants.append((a, why, ahead))
        if asked:
            for a in asked:
                wants.append((a, "asked", False))
        if not wants and not spare:
            if holding is None:  # nothing placed, nothing moved: nothing to check
                return _tuple(SpeculationDecision, (tuple(verdicts), (), reclaims, ()))
            return _checked(
                tuple(verdicts), (), reclaims, self._moves(holding, held, idle, policy, taken)
            )
        copies: list[Copy] = []
        cap = None  # self.cap(slots), inlined
        if slots is not None:
            cap = int(self.max_fraction * slots)
            if cap < 1:
                cap = 1
        placed = 0
        if wants:
            placed = self._place(wants, copies, cap, running, candidates, policy, taken)
        if spare:
            self._endgame(spare, copies, cap, running, placed, candidates, policy, taken)
        if holding is None and len(copies) == 1:  # the common answer: _checked, inlined
            one = copies[0]
            if one.target is None or one.target.index != one.attempt.node:
                return _tuple(SpeculationDecision, (tuple(verdicts), (one,), reclaims, ()))
        return _checked(
            tuple(verdicts),
            tuple(copies),
            reclaims,
            self._moves(holding, held, idle, policy, taken) if holding else (),
        )

    def _hold(
        self, losers: Iterable[Loser], now: float, taken: dict[int, list[int]]
    ) -> tuple[tuple[Reclaim, ...], dict[int, int]]:
        """:meth:`decide`'s losers: those reclaimed by ``now``, and the threads the others
        still hold, by node (``holding``), each taken in ``taken`` (not free)."""
        holding: dict[int, int] = {}
        losers = list(losers)
        reclaims = tuple(self.reclaimed(losers, now))
        gone = {id(r.loser) for r in reclaims}
        for lo in losers:
            if id(lo) not in gone:
                holding[lo.node] = holding.get(lo.node, 0) + 1
        for node, n in holding.items():
            taken[node] = [n, 0]  # a loser's thread is not free, whatever dask says
        return reclaims, holding

    def _place(
        self,
        wants: list[tuple[Any, str, bool]],
        copies: list[Copy],
        cap: int | None,
        running: int,
        candidates: Sequence[C] | Callable[[Any], Sequence[C]],
        policy: Any,
        taken: dict[int, list[int]],
    ) -> int:
        """:meth:`decide`'s wanted copies (attempt, why, ahead), in order: each placed by
        :meth:`_choose` within the cap or refused with its reason, appended to ``copies``;
        a placed copy takes its slot in ``taken``. Answers how many were placed."""
        placed = 0
        for a, why, ahead in wants:
            if cap is not None and running + placed >= cap:
                copies.append(
                    _tuple(Copy, (a, why, None, ahead, f"{cap} copies run (the cap)", False))
                )
                continue
            cands = candidates(a) if callable(candidates) else candidates
            if not cands:  # (what _choose answers without a candidate)
                copies.append(_tuple(Copy, (a, why, None, ahead, "no candidate node", False)))
                continue
            target, refusal = self._choose(a, cands, policy, ahead, taken)
            if target is None:
                copies.append(_tuple(Copy, (a, why, None, ahead, refusal, False)))
                continue
            placed += 1
            cores = a.task.cores
            t = taken.get(target.index)
            if t is None:
                queued = target.free < cores
                taken[target.index] = [cores, 1]
            else:
                queued = target.free - t[0] < cores
                t[0] += cores
                t[1] += 1
            copies.append(_tuple(Copy, (a, why, target, ahead, "", queued)))
        return placed

    def _endgame(
        self,
        spare: list[tuple[float, int, Any]],
        copies: list[Copy],
        cap: int | None,
        running: int,
        placed: int,
        candidates: Sequence[C] | Callable[[Any], Sequence[C]],
        policy: Any,
        taken: dict[int, list[int]],
    ) -> None:
        """:meth:`decide`'s end game: the ``spare`` attempts (-expected end, order,
        attempt), latest expected end first, each take a free slot where :meth:`_choose`
        places a copy (never a busy node), within the cap (``running`` and the ``placed``
        of this call already count); appended to ``copies``, taken in ``taken``."""
        spare.sort()  # latest expected end first; the order given breaks ties
        # the free slots left on shared candidates (a callable's differ per attempt)
        room = None
        if not callable(candidates):
            room = 0
            for c in candidates:
                t = taken.get(c.index)
                left = c.free - (t[0] if t is not None else 0)
                room += left if left > 0 else 0
        refused: dict[tuple[int, int, int], Any] = {}
        for _, _, a in spare:
            if cap is not None and running + placed >= cap:
                break
            if room is not None and room < a.task.cores:
                if room <= 0:
                    break  # no idle slot left anywhere
                continue
            cands = candidates(a) if callable(candidates) else candidates
            # where a copy may go depends on the candidates, the primary's node and
            # the cores: once refused, the same question is not asked again until a
            # copy takes a slot (O(judged) a call, not O(judged x candidates))
            same = (id(cands), a.node, a.task.cores)
            if same in refused:
                continue
            target, _ = self._choose(a, cands, policy, False, taken)
            if target is None:
                refused[same] = cands  # kept alive: its id is not reused meanwhile
                continue
            refused.clear()
            placed += 1
            t = taken.get(target.index)
            if t is None:
                taken[target.index] = [a.task.cores, 1]
            else:
                t[0] += a.task.cores
                t[1] += 1
            if room is not None:
                room -= a.task.cores
            copies.append(Copy(a, "endgame", target, False))

    def _moves(
        self,
        holding: dict[int, int],
        held: Iterable[Held],
        idle: Sequence[C],
        policy: Any,
        taken: dict[int, list[int]],
    ) -> tuple[Move, ...]:
        return tuple(self.moves(held, holding, idle, policy, taken)) if holding else ()
