"""Reading a recorded task's attempts for replay: which one ended the task, how long it
computed, when it began, its cores, its stage, and the order dask broke ties in.

Helpers of :func:`daskjobs.replay.load.load`; this module does not import ``distributed``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Iterable

from daskjobs.trace import (
    TraceAttempt,
    TraceTask,
)


def _done(a: TraceAttempt) -> bool:
    return a.finished is not None and a.outcome is not None


def _final(task: TraceTask) -> TraceAttempt | None:
    """The attempt whose end is the task's end: the last finished one with a duration."""
    for a in reversed(task.attempts):
        if _done(a) and a.outcome in ("memory", "erred") and a.state != "released":
            return a
    return None


def _duration(a: TraceAttempt) -> float | None:
    if a.duration is not None:
        return float(a.duration)
    if a.compute_start is not None and a.compute_stop is not None:
        return max(0.0, a.compute_stop - a.compute_start)
    return None


def _begin(a: TraceAttempt) -> float | None:
    """When an attempt started, on the scheduler's clock (best known)."""
    if a.started is not None:
        return a.started
    if a.assigned is not None:
        return a.assigned
    return None


def _cores(task: TraceTask) -> int:
    res = task.resources or {}
    for name in ("cores", "CPU", "cpu", "threads"):
        v = res.get(name)
        if isinstance(v, int | float) and not isinstance(v, bool) and v >= 1:
            return math.ceil(v)
    return 1


def _median(xs: Iterable[float]) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else math.nan


def _prefix(key: Hashable) -> str:
    """dask's own key prefix (``dask.utils.key_split``): ``"fit-3"`` -> ``"fit"``, a
    ``dask.delayed`` key ``"work-fcfcf0ab-ddfb-..."`` -> ``"work"``, ``("x", 0)`` -> ``"x"``:
    the stage the scheduler groups a task under."""
    from dask.utils import key_split

    return str(key_split(key))


def _order_key(item: tuple[TraceTask, TraceAttempt, float]) -> tuple[float, tuple[float, ...]]:
    """Submission time, then dask's own order: the recorded priority tuple
    ``(-user_priority, policy key, generation, dask.order position)`` without the
    policy's key, so that a what-if policy does not inherit the recorded one's order."""
    t = item[0]
    raw = list(t.priority or ())
    if len(raw) >= 4:
        raw = [raw[0], *raw[2:]]
    prio = tuple(
        float(x) if isinstance(x, int | float) and not isinstance(x, bool) else 0.0 for x in raw
    )
    return (t.submit if t.submit is not None else -math.inf, prio)
