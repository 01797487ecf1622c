"""Explain and status: why a task waits or where it ran, and what the plugin knows.

:class:`PluginView` is the read-only face of a running plugin: what ``explain``,
``status``, the dashboard page and the metrics read. It reads the plugin's parts
through the few attributes of :class:`Source` and never imports the plugin (so this
module and :mod:`daskjobs.plugin.plugin` do not import each other). A copy decision's
reason is the one the speculation driver recorded when it decided (its part's
``explain``); why a queued task waits is the policy's own answer
(:meth:`~daskjobs.policies.Policy.why_waiting`, by the rule its ``pop`` applies), never a
rule of this module's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from daskjobs.plugin.observe.snapshot import snapshot, snapshot_async
from daskjobs.plugin.surgery import _internals as dask_internals

if TYPE_CHECKING:
    from dask.typing import Key

    from daskjobs.config import Settings
    from daskjobs.plugin.audit import Audit
    from daskjobs.plugin.enact.speculation import Speculator
    from daskjobs.plugin.identity import ClientTeams
    from daskjobs.plugin.observe.live_forecast import Reading
    from daskjobs.plugin.observe.recorder import TraceRecorder
    from daskjobs.plugin.observe.recording import Recording
    from daskjobs.plugin.parts import Part
    from daskjobs.plugin.ranking import Ranker
    from daskjobs.plugin.release import ReleaseGate
    from daskjobs.plugin.speeds import WorkerSpeeds
    from daskjobs.plugin.views import LiveTask
    from daskjobs.policies import Policy
    from daskjobs.policies.base import TeamAccounts

__all__ = ["PluginView", "Source", "estimate_from"]


class Source(Protocol):
    """What the view reads of a plugin (JobsPlugin has these attributes)."""

    scheduler: Any
    settings: Settings
    overrides: dict[str, Any]
    from_client: bool
    audit: Audit
    ranker: Ranker
    speeds: WorkerSpeeds
    gate: ReleaseGate | None
    recording: Recording
    speculator: Speculator | None
    parts: list[Part]
    identities: ClientTeams


def estimate_from(v: LiveTask, default: float) -> str:
    """Where ``v``'s estimate came from, in a sentence: its annotation, its stage's duration
    model (with its 10-90% band and the observations behind it), the stage's median, or
    the configured default."""
    src = v.source
    if src == "annotation":
        return f"its estimate annotation: {v.estimate:.3g} s"
    band = f"10-90% band {v.band[0]:.3g}-{v.band[1]:.3g} s" if v.band is not None else "no band"
    if src == "model":
        return (
            f"the duration model of stage {v.stage!r} over its parameters: {v.estimate:.3g} s, "
            f"{band}, from {v.samples} observation(s)"
        )
    if src == "history":
        return (
            f"the median of the measured durations of stage {v.stage!r}: {v.estimate:.3g} s, "
            f"{band}, from {v.samples} observation(s)"
        )
    if src == "prior":
        return (
            f"the configured default ({default:.3g} s) scaled by its size-like arguments "
            f"({v.estimate:.3g} s): nothing measured of stage {v.stage!r} yet, and a count or "
            "size is assumed to grow the cost in proportion until measured"
        )
    return (
        f"the configured default ({default:.3g} s): nothing measured of stage {v.stage!r} yet; "
        "annotate estimate= to give one"
    )


class PluginView:
    """A running plugin, read only (module docstring)."""

    __slots__ = ("_p",)

    def __init__(self, plugin: Source) -> None:
        self._p = plugin

    # -- the plugin's state, as the pages read it ----------------------------------------
    @property
    def tasks(self) -> Mapping[Key, LiveTask]:
        """The ranked tasks' views, by key (deferred re-ranks given first)."""
        self._p.ranker.settle()
        return self._p.ranker.tasks

    @property
    def policy(self) -> Policy:
        """The policy the settings name (the object that ranks, or pops)."""
        return self._p.ranker.made

    @property
    def fair(self) -> TeamAccounts | None:
        """The policy, when it keeps per-team accounts (explain and status report its teams)."""
        return self._p.ranker.fair

    @property
    def estimator(self) -> Any:
        return self._p.ranker.estimator

    @property
    def ranked_graphs(self) -> int:
        return self._p.ranker.ranked_graphs

    @property
    def ranked_tasks(self) -> int:
        return self._p.ranker.ranked_tasks

    @property
    def estimate_sources(self) -> Mapping[str, int]:
        return self._p.ranker.estimate_sources

    @property
    def recorder(self) -> TraceRecorder | None:
        return self._p.recording.recorder

    @property
    def errors(self) -> Mapping[str, int]:
        return self._p.audit.errors

    # -- explain ----------------------------------------------------------------------
    def explain(self, key: Key) -> dict[str, Any]:
        """Why ``key`` waits, or where it ran: estimate, priority, team, place in queue."""
        p = self._p
        sched = p.scheduler
        ts = sched.tasks.get(key)
        if ts is None:
            return {"key": key, "state": "unknown", "why": "the scheduler does not know this key"}
        p.ranker.settle()  # its estimate and priority as every re-rank so far gave them
        v = p.ranker.tasks.get(key)
        fair = self.fair
        out: dict[str, Any] = {
            "key": key,
            "state": ts.state,
            "priority": list(ts.priority) if ts.priority else None,
            "policy": p.settings.policy,
            "estimate": v.estimate if v else None,
            "estimate_source": v.source if v else None,
            "stage": v.stage if v else None,
            "team": v.team if v else None,
            "user_priority": -ts.priority[0] if ts.priority else None,
        }
        if v is not None:
            out["estimate_band"] = list(v.band) if v.band is not None else None
            out["estimate_samples"] = v.samples
            out["estimate_from"] = estimate_from(v, p.settings.default_estimate)
            # what the stage's duration model reads of the task (params, or its arguments)
            out["params"] = dict(v.params) if v.params else None
            # who pays for it: a task several teams' graphs want is split equally among them
            payers = v.teams or (v.team,)
            out["paid_by"] = {t: 1 / len(payers) for t in payers}
        if fair is not None and v is not None:
            out["team_state"] = self.team_row(v.team)
        if ts.state == "queued":
            queued = dask_internals.queued_tasks(sched)
            ahead = sum(1 for other in queued if other.priority < ts.priority)
            out["queue_position"] = ahead
            out["why"] = f"queued behind {ahead} task(s) of higher priority; no free slot yet"
            if v is not None:
                out["why"] = self._why_queued(v, out["why"])
        elif ts.state == "processing":
            out["worker"] = ts.processing_on.address if ts.processing_on else None
            out["why"] = "assigned to a worker"
        elif ts.state == "memory":
            out["workers"] = sorted(ws.address for ws in ts.who_has)
            out["why"] = "done"
        elif ts.state == "waiting":
            pending = sorted(str(d.key) for d in ts.waiting_on)[:10]
            out["waiting_on"] = pending
            out["why"] = f"waiting for {len(ts.waiting_on)} input(s)"
        else:
            out["why"] = f"in state {ts.state!r}"
        where = [ts.processing_on] if ts.processing_on else list(ts.who_has or ())
        known = self.worker_speeds_by_address()
        speeds = {ws.address: known[ws.address] for ws in where if ws.address in known}
        if speeds:
            out["worker_speed"] = speeds
        for part in p.parts:
            out.update(part.explain(key))
        return out

    def _why_queued(self, v: LiveTask, otherwise: str) -> str:
        """Why queued ``v`` waits: the task the release gate promoted is next; else the
        policy's own answer (``Policy.why_waiting``, by the rule its ``pop`` applies, over
        its queue with every task dask queued so far); else, where the policy holds
        nothing back of its own accord (a static order), ``otherwise``."""
        p = self._p
        gate = p.gate
        if gate is not None:
            if v.tid == gate.released:
                return f"next in line: {p.settings.policy} chose it for the next free slot"
            gate.settle()  # the policy's queue as its next pop will see it
        ask = getattr(self.policy, "why_waiting", None)  # a bare popper may not answer
        said = ask(v, time.time()) if ask is not None else None
        return said if said else otherwise

    # -- teams and workers ------------------------------------------------------------
    def running_slots(self) -> tuple[dict[str, float], dict[str, float]]:
        """Per team: the worker threads its tasks hold now, and of those its backup copies'.

        What dask calls ``processing`` is a task *assigned* to a worker: it runs there or
        waits for a thread (dask hands a worker ``ceil(worker-saturation x threads)``
        tasks, 8 on four one-thread workers at the default 1.1), and a backup copy is a
        task of its own. So each worker's threads are shared out among the tasks assigned
        to it: all of them hold a thread while there are no more than threads; else each
        holds ``threads / assigned`` of one (dask's scheduler does not know which of them
        has started). A shared task's part is split among the teams that want it. The
        figures of all teams add up to at most the threads that exist. O(tasks assigned
        to workers): at most ``worker-saturation`` times the threads, never the queue."""
        p = self._p
        sched = p.scheduler
        tasks = p.ranker.tasks
        sp = p.speculator
        default = p.settings.teams.default
        slots: dict[str, float] = {}
        copies: dict[str, float] = {}
        if sched is None:
            return slots, copies
        for ws in list(sched.workers.values()):
            assigned = list(ws.processing)
            if not assigned:
                continue
            each = min(1.0, ws.nthreads / len(assigned))
            for ts in assigned:
                key = ts.key
                copy = sp is not None and sp.is_copy(key)
                if copy:
                    assert sp is not None
                    key = sp.copies[key]
                v = tasks.get(key)
                payers = (v.teams or (v.team,)) if v is not None else (default,)
                part = each / len(payers)
                for team in payers:
                    slots[team] = slots.get(team, 0.0) + part
                    if copy:
                        copies[team] = copies.get(team, 0.0) + part
        return slots, copies

    def team_row(
        self, team: str, slots: tuple[dict[str, float], dict[str, float]] | None = None
    ) -> dict[str, Any]:
        """One team's figures: ``running`` (threads its tasks and copies hold now, see
        :meth:`running_slots`), ``copies`` (of which its backup copies'), ``assigned``
        (what fair share counts as held: its tasks dask assigned to workers, running or
        waiting there, a shared task's split), ``booked`` (core-seconds booked to it so
        far), ``usage``, ``share``, ``queued``, ``quota``."""
        fair = self.fair
        assert fair is not None
        running, copies = self.running_slots() if slots is None else slots
        figures = {"running": running.get(team, 0.0), "copies": copies.get(team, 0.0)}
        if not fair.knows(team):  # a team never seen yet
            return {
                "team": team,
                "share": None,
                "usage": 0.0,
                **figures,
                "assigned": 0.0,
                "booked": 0.0,
                "queued": 0,
                "quota": self._p.settings.teams.quotas.get(team),
            }
        now = time.time()
        return {
            "team": team,
            "share": fair.share(team),
            "usage": fair.usage(team, now),
            **figures,
            "assigned": fair.running(team),
            "booked": fair.booked(team, now),
            "queued": fair.queued(team),
            "quota": fair.quotas.get(team),
        }

    def teams(self) -> list[dict[str, Any]]:
        """Per team: target share, usage, threads held now (copies included, at most the
        threads that exist), tasks assigned to workers, core-seconds booked, queued, quota
        (:meth:`team_row`), and the certificate identities of the connected clients charged
        to it (``identities``)."""
        fair = self.fair
        if fair is None:
            return []
        slots = self.running_slots()
        ids = self._p.identities.identities_by_team()
        return [{**self.team_row(t, slots), "identities": ids.get(t, [])} for t in fair.teams()]

    def worker_speeds(self) -> list[dict[str, Any]]:
        """Per worker: believed slow-down (1.0 nominal) and the attempts it rests on."""
        return self._p.speeds.rows()

    def worker_speeds_by_address(self) -> dict[str, float]:
        speeds = self._p.speeds
        return {a: speeds.learner.speed(n) for a, n in speeds.nodes.items()}

    # -- the forecast's snapshot --------------------------------------------------------
    def snapshot(self, keys: Any = None, limit: Any = None) -> dict[str, Any]:
        """What ``daskjobs.forecast`` simulates from (:mod:`daskjobs.plugin.observe.snapshot`) in
        one pass, or ``{"daskjobs": "removed"}`` once the plugin was unregistered (dask
        keeps the handler); the ``daskjobs_snapshot`` RPC is :meth:`snapshot_async`."""
        p = self._p
        sched = p.scheduler
        if sched is None or not any(q is p for q in sched.plugins.values()):
            return {"daskjobs": "removed"}
        return snapshot(p, keys, limit)

    async def snapshot_async(self, keys: Any = None, limit: Any = None) -> dict[str, Any]:
        """The RPC's handler: :meth:`snapshot` in slices that give the event loop back
        (:func:`daskjobs.plugin.observe.snapshot.snapshot_async`)."""
        p = self._p
        sched = p.scheduler
        if sched is None or not any(q is p for q in sched.plugins.values()):
            return {"daskjobs": "removed"}
        return await snapshot_async(p, keys, limit)

    def forecast(self) -> Reading | None:
        """The scheduler's own latest forecast (:mod:`daskjobs.plugin.observe.live_forecast`: each
        team's expected end, for the page and the metrics); None when it is switched off
        (``daskjobs.forecast.interval`` null when the plugin was made)."""
        for part in self._p.parts:
            reading = getattr(part, "reading", None)
            if reading is not None:
                return reading
        return None

    # -- status -----------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        p = self._p
        out: dict[str, Any] = {"speculation": None, "preemption": None, "resources": None}
        out.update(
            {
                "teams": self.teams(),
                "workers": self.worker_speeds(),
                "policy": p.settings.policy,
                "ranked_graphs": self.ranked_graphs,
                "tasks": len(self.tasks),
                "errors": dict(self.errors),
                "stages": self.estimator.stages(),
                "settings": dataclasses.asdict(p.settings),  # what is in force
                "overrides": dict(p.overrides),  # the keywords it was made with
                "from_client": p.from_client,
                "recording": None,
            }
        )
        for part in p.parts:
            out.update(part.status())
        return out
