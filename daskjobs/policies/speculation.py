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

At most ``max_fraction`` of all slots (at least one) run backups at once, as
Hadoop caps speculative tasks at 10% of running ones.

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

Cost: ``verdict`` and ``may_queue`` O(1); ``choose`` O(candidates).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from daskjobs import _defaults

__all__ = [
    "AHEAD",
    "SIMILAR",
    "Candidate",
    "Horizon",
    "Speculation",
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


C = TypeVar("C", bound=Candidate)


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

    def __post_init__(self) -> None:
        if self.ahead not in AHEAD:
            raise ValueError(f"ahead must be one of {', '.join(AHEAD)}, got {self.ahead!r}")
        for name in ("late_factor", "min_runtime", "max_fraction", "interval"):
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

    def deadline(self, start: float, estimate: float, speed: float = 1.0) -> float:
        """Time at which an attempt started at ``start`` counts as late."""
        return start + max(self.min_runtime, self.late_factor * estimate * speed)

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
        speed = policy.speed(attempt.node)
        if now >= self.deadline(attempt.start, attempt.task.estimate, speed):
            return "late"
        if policy.urgent(attempt, now):
            return "urgent"
        return None

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
        primary = policy.speed(attempt.node)
        cores = attempt.task.cores
        best = None
        best_rank: tuple[Any, ...] | None = None
        why = "no candidate node"
        for c in candidates:
            if c.index == attempt.node:
                continue
            speed = policy.speed(c.index)
            busy = c.free < cores
            if busy:
                if not may_queue:
                    why = "no free slot on a node as fast as the primary's"
                    continue
                if c.copies or not speed < primary:
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
            load = (c.cores - c.free) / c.cores if c.cores else 1.0
            rank = (busy, c.same_host, speed, load, c.index)
            if best_rank is None or rank < best_rank:
                best, best_rank = c, rank
        return (best, "ok") if best is not None else (None, why)
