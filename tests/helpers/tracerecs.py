"""Records of a hand-made trace (the format of daskjobs.trace) for the replay tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def finished_runs(
    runs: Sequence[tuple[Any, str, float, float]], duration: Callable[[Any, str], float]
) -> list[dict[str, Any]]:
    """The records of attempts that ran to the end: ``(key, worker, started, finished)``
    each, its run id its place in ``runs``, ``duration(key, worker)`` the seconds the worker
    says it computed."""
    recs: list[dict[str, Any]] = []
    for run_id, (key, w, start, stop) in enumerate(runs):
        recs.append({"type": "assigned", "time": start, "key": key, "worker": w})
        recs.append({"type": "started", "time": start, "key": key, "worker": w, "run_id": run_id})
        recs.append(
            {
                "type": "finished",
                "time": stop,
                "key": key,
                "worker": w,
                "run_id": run_id,
                "outcome": "memory",
                "state": "memory",
                "duration": duration(key, w),
            }
        )
    return recs
