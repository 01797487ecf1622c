"""Explain and status: why a task waits or where it ran, and what the plugin knows.

Read-only views over the plugin's parts. A copy decision's reason is the one the
speculation driver recorded when it decided (``explain(...)["copy"]``); the
fair-share reason reads the policy's books as they are now.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from daskjobs.plugin import _internals as dask_internals

if TYPE_CHECKING:
    from dask.typing import Key

    from daskjobs.plugin.plugin import JobsPlugin

__all__ = ["explain", "status", "team_row", "teams"]


def explain(plugin: JobsPlugin, key: Key) -> dict[str, Any]:
    """Why ``key`` waits, or where it ran: estimate, priority, team, place in queue."""
    sched = plugin.scheduler
    ts = sched.tasks.get(key)
    if ts is None:
        return {"key": key, "state": "unknown", "why": "the scheduler does not know this key"}
    v = plugin.tasks.get(key)
    fair = plugin.fair
    out: dict[str, Any] = {
        "key": key,
        "state": ts.state,
        "priority": list(ts.priority) if ts.priority else None,
        "policy": plugin.settings.policy,
        "estimate": v.estimate if v else None,
        "estimate_source": v.source if v else None,
        "stage": v.stage if v else None,
        "team": v.team if v else None,
        "user_priority": -ts.priority[0] if ts.priority else None,
    }
    if fair is not None and v is not None:
        out["team_state"] = team_row(plugin, v.team)
    if ts.state == "queued":
        queued = dask_internals.queued_tasks(sched)
        ahead = sum(1 for other in queued if other.priority < ts.priority)
        out["queue_position"] = ahead
        out["why"] = f"queued behind {ahead} task(s) of higher priority; no free slot yet"
        gate = plugin.gate
        if fair is not None and v is not None:
            row = out["team_state"]
            if gate is not None and key == gate.released:
                out["why"] = "next in line: fair share chose it for the next free slot"
            elif row["quota"] is not None and row["running"] >= row["quota"]:
                out["why"] = (
                    f"team {v.team!r} holds {row['running']} slot(s), its quota; "
                    "it runs when no team below its quota waits"
                )
            else:
                out["why"] = (
                    f"waiting for fair share: team {v.team!r} uses {row['usage']:.3g} "
                    f"per share {row['share']:.3g}; teams further below their share go first"
                )
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
    known = plugin.worker_speeds_by_address()
    speeds = {ws.address: known[ws.address] for ws in where if ws.address in known}
    if speeds:
        out["worker_speed"] = speeds
    sp = plugin.speculator
    if sp is not None and key in sp.reasons:  # the speculation driver's recorded reason
        out["copy"] = sp.reasons[key]
    return out


def team_row(plugin: JobsPlugin, team: str) -> dict[str, Any]:
    fair = plugin.fair
    assert fair is not None
    if not fair.knows(team):  # a team never seen yet
        return {
            "team": team,
            "share": None,
            "usage": 0.0,
            "running": 0,
            "queued": 0,
            "quota": plugin.settings.teams.quotas.get(team),
        }
    return {
        "team": team,
        "share": fair.share(team),
        "usage": fair.usage(team, time.time()),
        "running": fair.running(team),
        "queued": fair.queued(team),
        "quota": fair.quotas.get(team),
    }


def teams(plugin: JobsPlugin) -> list[dict[str, Any]]:
    """Per team: target share, decayed usage, running slots, queued, quota."""
    if plugin.fair is None:
        return []
    return [team_row(plugin, t) for t in plugin.fair.teams()]


def status(plugin: JobsPlugin) -> dict[str, Any]:
    est = plugin.estimator
    rec = plugin.recorder
    return {
        "speculation": plugin.speculator.stats() if plugin.speculator is not None else None,
        "preemption": plugin.preemptor.status() if plugin.preemptor is not None else None,
        "resources": plugin.placer.status() if plugin.placer is not None else None,
        "teams": teams(plugin),
        "workers": plugin.worker_speeds(),
        "policy": plugin.settings.policy,
        "ranked_graphs": plugin.ranked_graphs,
        "tasks": len(plugin.tasks),
        "errors": dict(plugin.errors),
        "stages": est.stages() if est else {},
        "settings": dataclasses.asdict(plugin.settings),  # what is in force
        "overrides": dict(plugin.overrides),  # the keywords it was made with
        "from_client": plugin.from_client,
        "recording": rec.stats() if rec is not None else None,
    }
