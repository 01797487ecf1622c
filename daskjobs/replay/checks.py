"""What a trace must hold to be replayed: the header's settings that the replay uses
(the default estimate, the fair-share targets, quotas and half-life), and a graph without
a dependency cycle. Each refusal is a :class:`~daskjobs.trace.TraceError` naming the line.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator
from typing import Any

from daskjobs.trace import (
    MAX_SECONDS,
    Trace,
    TraceAttempt,
    TraceError,
    TraceTask,
)


def _checked_settings(trace: Trace) -> dict[str, Any]:
    """The header's settings, with what the replay uses from them checked: the default
    estimate and the fair-share targets, quotas and half-life (speculation settings that
    cannot be replayed are noted and turned off, :func:`_speculation`)."""
    settings = trace.header.get("settings") or {}
    where = f"{trace.path}:{trace.header_line}: 'header' record: field 'settings."

    def fail(name: str, expected: str, value: Any) -> TraceError:
        r = repr(value)
        r = r if len(r) <= 60 else f"{r[:40]}... ({len(r)} characters)"
        return TraceError(f"{where}{name}' expected {expected}, got {r}")

    def number(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and _finite(v)

    est = settings.get("default_estimate")
    if est is not None and not (number(est) and 0 < est <= MAX_SECONDS):
        raise fail("default_estimate", f"seconds > 0 and at most {MAX_SECONDS:g}", est)
    teams = settings.get("teams")
    if teams is None:
        return dict(settings)
    if not isinstance(teams, dict):
        raise fail("teams", "a JSON object", teams)
    targets = teams.get("targets")
    if targets is not None and not (
        isinstance(targets, dict) and all(number(v) and v > 0 for v in targets.values())
    ):
        raise fail("teams.targets", "an object of shares > 0", targets)
    quotas = teams.get("quotas")
    if quotas is not None and not (
        isinstance(quotas, dict)
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in quotas.values())
    ):
        raise fail("teams.quotas", "an object of integers >= 1", quotas)
    half_life = teams.get("half_life")
    if half_life is not None and not (number(half_life) and half_life > 0):
        raise fail("teams.half_life", "seconds > 0", half_life)
    return dict(settings)


def _finite(v: float) -> bool:
    try:
        return math.isfinite(v)
    except OverflowError:  # an integer beyond any float
        return False


def _refuse_cycles(path: str, ended: list[tuple[TraceTask, TraceAttempt, float]]) -> None:
    """A :class:`TraceError` naming a graph record on a dependency cycle (the recorded
    graph cannot have one: dask refuses cyclic graphs). O(tasks + dependencies)."""
    tasks = {t.key: t for t, _, _ in ended}
    state: dict[Hashable, int] = {}  # 1: on the current path, 2: done
    end = object()
    for root in tasks:
        if root in state:
            continue
        state[root] = 1
        stack: list[tuple[Hashable, Iterator[Hashable]]] = [(root, iter(tasks[root].deps))]
        while stack:
            key, deps = stack[-1]
            dep = next(deps, end)
            if dep is end:
                state[key] = 2
                stack.pop()
            elif dep in tasks and state.get(dep) == 1:
                path_keys = [k for k, _ in stack]
                cycle = [*path_keys[path_keys.index(dep) :], dep]
                shown = " -> ".join(repr(k) for k in cycle[:6])
                raise TraceError(
                    f"{path}:{tasks[key].line or '?'}: 'graph' record: field 'deps' closes a "
                    f"dependency cycle ({shown}{' ...' if len(cycle) > 6 else ''}): dask "
                    "graphs have none"
                )
            elif dep in tasks and dep not in state:
                state[dep] = 1
                stack.append((dep, iter(tasks[dep].deps)))
