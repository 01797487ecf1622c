"""Backup copies in a recorded trace: the races the plugin's speculation ran, told apart.

The plugin's audit events (``backup-launched``, ``backup-won/lost/failed``) give the races
(:func:`_races`); the trace reader joins a copy's records to its task by key, so
:func:`_split_races` gives the end to the attempt on the winning worker and sets the
losing copy apart (neither a failure nor a retry). :func:`_speculation` reads the
recorded speculation settings as the simulator's
:class:`~daskjobs.policies.speculation.Speculation`, and :func:`_check_phase` when its
periodic check ran.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from typing import Any

from daskjobs import _defaults
from daskjobs.policies.speculation import Speculation
from daskjobs.replay.attempts import _done
from daskjobs.trace import (
    Trace,
    TraceAttempt,
    TraceTask,
)

_SETTLED = {"backup-won": "won", "backup-lost": "lost", "backup-failed": "failed"}


@dataclass(frozen=True, slots=True)
class _Race:
    """One backup copy the plugin launched, from its audit events."""

    launched: float  # scheduler time of ``backup-launched``
    primary: str | None
    backup: str | None
    settled: float | None = None  # scheduler time of ``backup-won/lost/failed``
    outcome: str | None = None  # won | lost | failed


def _races(trace: Trace) -> dict[Hashable, list[_Race]]:
    """The backup copies of each task, in order, from the ``backup-*`` audit events
    (their ``key`` is the task key's ``str``)."""
    by_str: dict[str, Hashable] = {str(k): k for k in trace.tasks}
    races: dict[Hashable, list[_Race]] = {}
    for ev in trace.events:
        action = ev.get("action")
        if action != "backup-launched" and action not in _SETTLED:
            continue
        key = by_str.get(str(ev.get("key")))
        t = ev.get("time")
        if key is None or not isinstance(t, int | float):
            continue
        if action == "backup-launched":
            races.setdefault(key, []).append(_Race(float(t), ev.get("primary"), ev.get("backup")))
            continue
        open_ = [i for i, r in enumerate(races.get(key, [])) if r.outcome is None]
        if open_:
            i = open_[-1]
            races[key][i] = replace(races[key][i], settled=float(t), outcome=_SETTLED[action])
    return races


_END_FIELDS = (
    "finished",
    "run_id",
    "state",
    "outcome",
    "compute_start",
    "compute_stop",
    "duration",
    "transfer",
    "nbytes",
    "error",
)


def _without_end(a: TraceAttempt, worker: str | None) -> TraceAttempt:
    return replace(a, worker=worker or a.worker, **dict.fromkeys(_END_FIELDS))


def _with_end(a: TraceAttempt, end: TraceAttempt) -> TraceAttempt:
    return replace(a, worker=end.worker or a.worker, **{f: getattr(end, f) for f in _END_FIELDS})


def _split_races(
    task: TraceTask, races: list[_Race]
) -> tuple[list[TraceAttempt], list[tuple[TraceAttempt, float]], int]:
    """The task's attempts with each race told apart, the losing copies with the time
    the race was settled, and how many copies reported their start.

    ``read_trace`` joins records by key: the copy's ``started`` record (same run id, no
    ``assigned``) opens a second attempt, and the winner's ``finished`` record closes
    that one whichever worker won. Here the end goes to the attempt on the winning
    worker (``finished``'s worker); the other one lost the race (the plugin released
    it; its thread ran on). It is neither a failure nor a retry.
    """
    atts = list(task.attempts)
    losers: list[tuple[TraceAttempt, float]] = []
    started = 0
    for race in races:
        ci = next(
            (
                i
                for i, a in enumerate(atts)
                if i > 0
                and a.assigned is None
                and a.started is not None
                and a.started >= race.launched
                and (a.worker in (race.backup, race.primary) or a.worker is None)
            ),
            None,
        )
        if ci is None:
            continue  # the copy never reported its start (queued behind, or the race ended)
        before = [i for i in range(ci) if (atts[i].started or math.inf) < race.launched]
        pi = before[-1] if before else None
        if pi is None:
            continue
        started += 1
        p, c = atts[pi], atts[ci]
        if _done(c) and c.worker != race.backup:  # the primary's end, joined to the copy
            atts[pi] = _with_end(p, c)
            atts[ci] = _without_end(c, race.backup)
            end = atts[pi].finished
            loser = atts[ci]
        elif _done(c):  # the copy won
            atts[ci] = replace(c, worker=race.backup)
            end = c.finished
            loser = p
        elif _done(p):  # the primary ended before the copy's start was heard
            atts[ci] = _without_end(c, race.backup)
            end = p.finished
            loser = atts[ci]
        else:  # neither ended in the trace
            continue
        stop = race.settled if race.settled is not None else end
        if stop is not None:
            losers.append((loser, float(stop)))
    return atts, losers, started


def _backup_counts(races: dict[Hashable, list[_Race]], started: int) -> dict[str, int]:
    rs = [r for rr in races.values() for r in rr]
    out = {"launched": len(rs), "started": started}
    for outcome in ("won", "lost", "failed"):
        out[outcome] = sum(1 for r in rs if r.outcome == outcome)
    return out


def _check_phase(trace: Trace, spec: Speculation | None, t0: float) -> float:
    """When the plugin's periodic speculation check ran: it starts with the
    ``speculation`` audit event (recorded once, as the check starts) and runs every
    ``interval``; seconds from ``t0`` modulo the interval, 0 if not recorded."""
    if spec is None or not spec.interval:
        return 0.0
    for ev in trace.events:
        t = ev.get("time")
        if ev.get("action") == "speculation" and isinstance(t, int | float) and math.isfinite(t):
            return (float(t) - t0) % spec.interval
    return 0.0


def _speculation(settings: dict[str, Any], notes: list[str]) -> Speculation | None:
    """The recorded run's speculation settings as a simulator spec (None: off)."""
    spec = settings.get("speculation")
    if not isinstance(spec, dict) or not spec.get("enabled"):
        return None

    def recorded(name: str, key: str, read: Callable[[str], Any] = _defaults.default) -> float:
        # a setting the header leaves out (or null) is the plugin's default, read from the
        # one place defaults are written (daskjobs.yaml)
        value = spec.get(name)
        return float(read(key) if value is None else value)

    try:
        return Speculation(
            late_factor=recorded("late_factor", "speculation.late-factor"),
            min_runtime=recorded("min_runtime", "speculation.min-runtime", _defaults.seconds),
            max_fraction=recorded("max_fraction", "speculation.max-fraction"),
            # a trace from before the setting existed ran the live rule, past-horizon
            ahead=str(spec.get("ahead") or _defaults.default("speculation.ahead")),
            interval=recorded("interval", "speculation.interval", _defaults.seconds),
            # the end game, as the run had it (a trace from before the setting: off)
            endgame=spec.get("endgame") is True,
        )
    except (TypeError, ValueError, OverflowError) as exc:
        notes.append(f"the recorded speculation settings cannot be replayed ({exc}): off")
        return None
