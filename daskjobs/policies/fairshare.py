"""Fair share between teams.

Each team has a target share (any positive weights; they are normalised). The
next free slot goes to a queued task of the team whose *usage per unit of
share* is lowest. Within a team, tasks keep an inner order (FIFO by default,
or longest-first).

Usage comes in two flavours:

* ``half_life=None`` (the default, and the reference workload's rule): usage is the number of
  cores a team holds *right now*. Two teams with equal targets converge to half
  the cluster each as soon as slots free; a team that arrives late is served
  first until it holds its share. This is max-min fairness on running slots.
* ``half_life=h`` seconds: usage is core-seconds consumed, decayed with
  half-life ``h`` (Slurm's ``PriorityDecayHalfLife``). A team that used the
  cluster heavily in the last hours waits behind one that did not, even after
  its jobs finished. Usage is integrated exactly between events: with ``R``
  cores running and decay rate ``l = ln 2 / h``, ``dU/dt = R - l U``, so
  ``U(t) = R/l + (U0 - R/l) exp(-l (t - t0))``.

Quotas (``quotas={team: max_cores}``) cap the cores a team holds *while another
team waits*: a free slot never goes to a team at its quota if a team below its
quota has a task that fits. When no such team waits, the team at its quota may
*borrow* the idle slot (work-conserving, as Kueue lets a queue borrow a cohort's
unused quota): a quota never leaves the cluster idle. Borrowed slots are not taken
back from running tasks; they return to the other teams as those tasks end. This
is the one quota rule, decided here in :meth:`FairShare.pop`, so the simulator and
the live plugin (which releases exactly what ``pop`` chooses) enact the same one.

Live bookkeeping: a team is known from its first task, whichever call sees it
first (``add_graph``, ``push``, ``started``), so usage and running counts are
right by construction; :meth:`FairShare.discard` drops a queued task that left
without being popped (the live scheduler ran or dropped it), lazily, in O(1);
:meth:`FairShare.reconcile` resets running counts and queues from the
scheduler's state after a driver failed to report something.

Shared stages (one task wanted by several teams): two teams' sweeps that share a stage
get one task for it (its content key is the same, which is the point of content keys),
so someone must pay for it. The rule: **a shared task's cores are split equally among
the teams that want it, for as long as it runs**. A task view may carry ``teams``
(every team whose graphs want it, the submitter first); each of those teams holds
``cores / len(teams)`` of its slots in its accounts (running cores and usage) and is
booked that share of its core-seconds. When a team's graph starts wanting a task that
already runs, the driver says so (:meth:`FairShare.reshare`) and the split changes from
that moment: the submitter paid alone until then. Why split, not charge the submitter:
the submitter would pay for work the second team then reads for free, and fair share
would hold the submitter back for it; splitting charges each team what its graphs
asked for, and a stage wanted by all teams costs each of them the same. Why equally,
not by share: every team that wants the stage would have had to run all of it alone.
:meth:`FairShare.booked` is the core-seconds booked to a team (not decayed).

Starvation: every target is positive and usage of an idle team only decays, so
a team with queued work is served once every busier team's usage per share
rises above its own, which happens within one task length of each running
team.

Cost per ``pop``: O(T + log n) for T teams (the team scan is over teams, never
over tasks). Ties between teams: the order of ``targets``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from daskjobs.policies.base import (
    AttemptView,
    Capabilities,
    HeapPolicy,
    NodeView,
    Policy,
    TaskView,
)
from daskjobs.policies.order import FIFO, LPT

__all__ = ["FairShare"]

_INNER: dict[str, type[HeapPolicy]] = {"fifo": FIFO, "lpt": LPT}
#: A slot any task fits in: the live release gate's (``ANY_NODE``), and what
#: :meth:`FairShare.why_waiting` asks about.
_ANY = 1 << 30


class FairShare(Policy):
    """Serve the team furthest below its target share.

    Parameters
    ----------
    targets:
        team -> target share (positive; normalised to sum to 1).
    within:
        Order inside a team: ``"fifo"`` (default) or ``"lpt"``.
    half_life:
        ``None`` to share running cores; else seconds of usage decay.
    quotas:
        team -> maximum cores held at once.
    strict:
        If True (default), a task of a team without a target is an error;
        otherwise such a team gets ``default_share``.
    """

    name = "fair-share"
    capabilities = Capabilities(
        pops=True, team_accounts=True, reconciles=True, reads=frozenset({"task.teams"})
    )

    def __init__(
        self,
        targets: Mapping[str, float],
        *,
        within: str = "fifo",
        half_life: float | None = None,
        quotas: Mapping[str, int] | None = None,
        strict: bool = True,
        default_share: float = 1.0,
    ) -> None:
        if not targets:
            raise ValueError("FairShare needs at least one team in targets")
        for team, share in targets.items():
            if not (isinstance(share, int | float) and math.isfinite(share) and share > 0):
                raise ValueError(f"fair-share target of team {team!r} must be > 0, got {share!r}")
        if within not in _INNER:
            raise ValueError(f"unknown order within teams {within!r}; choose one of {list(_INNER)}")
        if half_life is not None and not (half_life > 0 and math.isfinite(half_life)):
            raise ValueError(f"half_life must be a positive number of seconds, got {half_life!r}")
        for team, q in (quotas or {}).items():
            if team not in targets and strict:
                raise ValueError(f"quota for team {team!r}, which has no fair-share target")
            if not (isinstance(q, int) and q >= 1):
                raise ValueError(f"quota of team {team!r} must be an integer >= 1, got {q!r}")
        self.within = within
        self.half_life = half_life
        self.strict = strict
        self.default_share = float(default_share)
        self.quotas = dict(quotas or {})
        self._inner_key = _INNER[within]().key
        self._raw_targets = dict(targets)
        self._teams: list[str] = []
        self._share: dict[str, float] = {}
        self._queues: dict[str, HeapPolicy] = {}
        self._running: dict[str, float] = {}  # cores held (a shared task's are split)
        self._usage: dict[str, float] = {}
        self._stamp: dict[str, float] = {}
        # core-seconds booked (not decayed), kept as an offset: booked up to t is
        # running * t + offset, so a start or an end moves the offset by the change of
        # cores held times its time (one update; nothing integrated per team per change)
        self._offset: dict[str, float] = {}
        self._last = 0.0  # the latest time an end or a reconcile was told
        # one team and no decay: pop serves its queue's head (``_solo``, or None)
        self._solo: HeapPolicy | None = None
        self._solo_team = ""
        # running attempts of shared tasks -> the teams paying for them (a task paid by its
        # own team alone has no entry)
        self._payers: dict[Any, tuple[str, ...]] = {}
        self._lambda = math.log(2) / half_life if half_life else 0.0
        self._n = 0
        # team -> ids discarded while still in the team's queue (dropped when they surface)
        self._gone: dict[str, set[Hashable]] = {}
        for team in targets:
            self._add_team(team, targets[team])

    # -- teams ------------------------------------------------------------------
    def _add_team(self, team: str, share: float) -> None:
        self._teams.append(team)
        self._raw_targets[team] = share
        total = sum(self._raw_targets.values())
        self._share = {t: s / total for t, s in self._raw_targets.items()}
        self._queues[team] = _INNER[self.within]()
        self._set_solo()
        self._running[team] = 0
        self._usage[team] = 0.0
        self._stamp[team] = 0.0
        self._offset[team] = 0.0

    def _set_solo(self) -> None:
        """Note the one team's queue, if there is one team and usage does not decay."""
        if len(self._teams) == 1 and self.half_life is None:
            self._solo_team = self._teams[0]
            self._solo = self._queues[self._solo_team]
        else:
            self._solo = None

    def _team_of(self, task: TaskView) -> str:
        team = task.team
        if team not in self._queues:
            if self.strict:
                known = ", ".join(map(repr, self._teams))
                raise ValueError(
                    f"task {task.tid!r} belongs to team {team!r}, which has no fair-share "
                    f"target (known teams: {known})"
                )
            self._add_team(team, self.default_share)
        return team

    def _advance(self, team: str, now: float) -> None:
        """Integrate decayed usage of ``team`` up to ``now``."""
        dt = now - self._stamp[team]
        if dt > 0:
            r = self._running[team]
            lam = self._lambda
            u0 = self._usage[team]
            decay = math.exp(-lam * dt)
            self._usage[team] = r / lam + (u0 - r / lam) * decay
        self._stamp[team] = now

    def _hold(self, team: str, cores: float, now: float) -> None:
        """``team`` holds ``cores`` more (fewer, if negative) from ``now``."""
        if self.half_life is not None:
            self._advance(team, now)
        was = self._running[team]
        held = was + cores
        # split shares (thirds) leave float dust when they all end: nothing is held then
        held = held if held > 1e-9 else 0.0
        self._running[team] = held
        self._offset[team] += (was - held) * now  # what is booked up to now stays
        if now > self._last:
            self._last = now

    def payers(self, task: TaskView) -> tuple[str, ...]:
        """The teams that pay for ``task``: its ``teams`` (the teams whose graphs want it),
        else its own team. Each pays ``cores / len(payers)``."""
        teams = getattr(task, "teams", ())
        if not teams or len(teams) == 1:
            return (self._team_of(task),)
        out = tuple(dict.fromkeys(teams))
        for team in out:
            if team not in self._queues:
                self._team_of(_TeamOnly(team))
        return out

    def booked(self, team: str, now: float | None = None) -> float:
        """Core-seconds booked to ``team`` so far: up to ``now`` if given and later than
        the latest end the policy was told of, else up to that one. Each of its
        tasks' run time times its cores, a shared task's split among its payers. Not
        decayed (what the team was charged, not what weighs on its priority)."""
        t = self._last if now is None or now < self._last else now
        return self._running[team] * t + self._offset[team]

    def usage(self, team: str, now: float | None = None) -> float:
        """Current usage of ``team``: running cores, or decayed core-seconds."""
        if self.half_life is None:
            return float(self._running[team])
        if now is not None:
            self._advance(team, now)
        return self._usage[team]

    def share(self, team: str) -> float:
        return self._share[team]

    def running(self, team: str) -> float:
        """Cores ``team`` holds now (a shared task's split among the teams paying for it:
        the teams' figures add up to the cores in use)."""
        return self._running[team]

    def teams(self) -> list[str]:
        """The teams known so far, in the order they became known (targets first)."""
        return list(self._teams)

    def knows(self, team: str) -> bool:
        return team in self._queues

    def queued(self, team: str) -> int:
        return len(self._queues[team]) - len(self._gone.get(team, ()))

    # -- the policy interface ---------------------------------------------------
    def add_graph(self, tasks: Sequence[TaskView]) -> None:
        queues = self._queues
        for t in tasks:  # fail early, before anything runs
            if t.team not in queues:  # (the test _team_of starts with, without its call)
                self._team_of(t)

    def push(self, task: TaskView) -> None:
        self._queues[self._team_of(task)].push(task)
        self._n += 1

    def push_many(self, tasks: Sequence[TaskView]) -> None:
        """As many :meth:`push` calls, in order: each team's tasks go to its queue as
        one batch (a sorted run, not a heap push per task)."""
        by_team: dict[str, list[TaskView]] = {}
        team_of = self._team_of
        queues = self._queues
        for t in tasks:
            team = t.team
            if team not in queues:  # (the test _team_of starts with, without its call)
                team = team_of(t)
            got = by_team.get(team)
            if got is None:
                by_team[team] = [t]
            else:
                got.append(t)
        for team, batch in by_team.items():
            queues[team].push_many(batch)
        self._n += len(tasks)

    def hold_key(self, task: TaskView) -> float:
        """The order inside a team (FIFO: submission; LPT: longest estimate first)."""
        return float(self._inner_key(task))

    def discard(self, task: TaskView) -> None:
        """``task`` (pushed, not popped) left the queue some other way: the live
        scheduler ran it (a quota's idle slots) or dropped it. O(1): its entry is
        skipped when it reaches the head of its team's queue."""
        team = task.team
        if team not in self._queues:
            return
        gone = self._gone.setdefault(team, set())
        if task.tid not in gone:
            gone.add(task.tid)
            self._n -= 1

    def _head(self, team: str, free: int) -> TaskView | None:
        q = self._queues[team]
        head = q.peek(free)
        gone = self._gone.get(team)
        while head is not None and gone and head.tid in gone:
            q.pop(_Free(free), 0.0)  # a discarded entry surfaced: drop it now
            gone.discard(head.tid)
            head = q.peek(free)
        return head

    def _over_quota(self, team: str, cores: float) -> bool:
        """The quota rule: one more task of ``cores`` would take ``team`` past its quota."""
        quota = self.quotas.get(team)
        return quota is not None and self._running[team] + cores > quota

    def _choose(self, free: int, now: float) -> tuple[str | None, bool]:
        """The team whose queue's head the next slot of ``free`` cores goes to, and whether
        it borrows the slot over its quota (no team under its quota waits). The one rule:
        :meth:`pop` acts on it, :meth:`why_waiting` explains it."""
        best_team = None
        best_score = math.inf
        borrower = None  # the best team at its quota, if no team below it waits
        borrower_score = math.inf
        for team in self._teams:
            q = self._queues[team]
            if not q:
                continue
            head = self._head(team, free)
            if head is None:
                continue
            score = self.usage(team, now) / self._share[team]
            if self._over_quota(team, head.cores):
                if score < borrower_score:
                    borrower, borrower_score = team, score
                continue
            if score < best_score:
                best_team, best_score = team, score
        if best_team is None:
            return borrower, borrower is not None  # nobody below quota waits: borrow
        return best_team, False

    def pop(self, node: NodeView, now: float) -> TaskView | None:
        if not self._n:
            return None
        solo = self._solo
        # One team (under any quota: alone, it borrows every idle slot) whose usage is its
        # running cores: the loop in _choose would serve its queue's head
        if solo is not None and not self._gone.get(self._solo_team):
            task = solo.pop(node, now)
            if task is not None:
                self._n -= 1
            return task
        team, _ = self._choose(node.free, now)
        if team is None:
            return None
        self._n -= 1
        return self._queues[team].pop(node, now)

    def why_waiting(self, task: TaskView, now: float) -> str | None:
        """Why queued ``task`` is not started yet, in plain words, by the rule :meth:`pop`
        applies (:meth:`_choose`, on the heads of the teams' queues, with a slot of any
        size): its team's quota on the next task of its team, another team further below
        its share, or its own team's tasks ahead of it; or that it is the task the next
        free slot gets. O(T) for T teams."""
        team = task.team
        if team not in self._queues:
            return f"team {team!r} has not been seen by fair share yet"
        head = self._head(team, _ANY)
        if head is None:
            return f"fair share holds no task of team {team!r} yet"
        chosen, borrowed = self._choose(_ANY, now)
        lend = " (lent an idle slot over its quota: no team under its quota waits)"
        if chosen == team:
            served = f"team {team!r} is next by fair share{lend if borrowed else ''}"
            if head.tid == task.tid:
                return f"{served}, and this is its first task: it starts at the next free slot"
            return f"{served}; its tasks ahead of this one in its queue start first"
        if self._over_quota(team, head.cores):  # the quota test _choose applied to the head
            held = f"team {team!r} holds {self._running[team]:g} core(s) and its quota is "
            if head.tid != task.tid:
                held = f"its team's next task needs {head.cores:g} core(s); {held}"
            if borrowed:  # every team that waits is at its quota: the furthest below goes
                return (
                    f"{held}{self.quotas[team]:g}; no team under its quota waits, and the "
                    f"idle slot is lent to team {chosen!r}, further below its share"
                )
            return (
                f"{held}{self.quotas[team]:g}: it waits while a team under its quota has "
                f"work (now {chosen!r}), and is lent idle slots when none has"
            )
        usage, share = self.usage(team, now), self._share[team]
        other = f"team {chosen!r}" if chosen is not None else "another team"
        return (
            f"waiting for fair share: team {team!r} uses {usage:.3g} per share {share:.3g}; "
            f"{other} is further below its share and goes first"
        )

    def started(self, attempt: AttemptView, now: float) -> None:
        task = attempt.task
        team = task.team
        if team not in self._queues:  # not known yet (or an error): the one rule
            team = self._team_of(task)
        try:  # getattr(task, "teams", ()), without the call: views mostly have the field
            teams = task.teams  # type: ignore[attr-defined]
        except AttributeError:
            teams = ()
        if teams and len(teams) > 1:  # a shared task: split among the teams that want it
            payers = self.payers(task)
            self._payers[attempt] = payers
            cores = task.cores / len(payers)
            for t in payers:
                self._hold(t, cores, now)
            return
        # _hold(team, task.cores, now), inlined: once a task start
        if self.half_life is not None:
            self._advance(team, now)
        cores = task.cores
        self._running[team] += cores
        self._offset[team] -= cores * now

    def ended(self, attempt: AttemptView, now: float) -> bool:
        task = attempt.task
        if self._payers:
            payers = self._payers.pop(attempt, None)
            if payers is not None:
                cores = task.cores / len(payers)
                for t in payers:
                    self._hold(t, -cores, now)
                return False
        team = task.team
        if team not in self._queues:
            team = self._team_of(task)
        # _hold(team, -task.cores, now), inlined: once a task end
        if self.half_life is not None:
            self._advance(team, now)
        running = self._running
        was = running[team]
        held = was - task.cores
        if held > 1e-9:
            running[team] = held
            self._offset[team] += task.cores * now
        else:  # float dust of split shares: nothing is held
            running[team] = 0.0
            self._offset[team] += was * now
        self._last = now
        return False

    def reshare(self, attempt: AttemptView, teams: Sequence[str], now: float) -> None:
        """The teams that want ``attempt``'s task changed while it runs (a team's graph
        came to want it): from ``now`` on it is split among ``teams``. O(teams)."""
        task = attempt.task
        old = self._payers.pop(attempt, None) or (self._team_of(task),)
        new = tuple(dict.fromkeys(teams)) or (self._team_of(task),)
        for t in new:
            if t not in self._queues:
                self._team_of(_TeamOnly(t))
        for t in old:
            self._hold(t, -task.cores / len(old), now)
        for t in new:
            self._hold(t, task.cores / len(new), now)
        if len(new) > 1:
            self._payers[attempt] = new

    def reconcile(
        self, running: Mapping[str, float], queued: Sequence[TaskView], now: float
    ) -> None:
        """Reset from the driver's ground truth: cores each team holds now and the
        tasks waiting (in order). Usage integrated so far is kept; the running attempts'
        payers are forgotten (a shared attempt running now is then closed as its own
        team's). O(T + n log n)."""
        for team in list(running):
            if team not in self._queues:
                self._team_of(_TeamOnly(team))
        for t in queued:
            self._team_of(t)
        for team in self._teams:
            if self.half_life is not None:
                self._advance(team, now)
            held = float(running.get(team, 0))
            self._offset[team] += (self._running[team] - held) * now  # booked so far stays
            self._running[team] = held
        if now > self._last:
            self._last = now
            self._queues[team] = _INNER[self.within]()
        self._set_solo()
        self._payers.clear()
        self._gone.clear()
        self._n = 0
        for t in queued:
            self.push(t)

    def __len__(self) -> int:
        return self._n

    def describe(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "targets": dict(self._share),
            "within": self.within,
            "half_life": self.half_life,
            "quotas": dict(self.quotas),
            "shared": "split equally among the teams that want a task while it runs",
        }


class _Free:
    """A node view with ``free`` slots (to drop a discarded queue head)."""

    __slots__ = ("free",)
    index = -1
    cores = 1 << 30

    def __init__(self, free: int) -> None:
        self.free = free


class _TeamOnly:
    """A task view that only names a team (for :meth:`FairShare.reconcile`)."""

    __slots__ = ("team",)
    tid = None
    estimate = 0.0
    cores = 1
    submit = 0.0
    deps = ()

    def __init__(self, team: str) -> None:
        self.team = team
