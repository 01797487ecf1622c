"""What dask adds, fitted from a trace: per-worker slow-downs (:func:`_speeds`), the slot
capacity lost while work waited (:func:`_lost_capacity`, from which the per-task
``overhead`` is fitted) and the dependency latency (:func:`_dep_latency`, a diagnostic).

What each measures and why is in :mod:`daskjobs.replay.load` (``What dask adds, fitted
from the trace``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable, Sequence

from daskjobs.replay.attempts import _begin, _done, _duration, _median
from daskjobs.trace import (
    Trace,
    TraceAttempt,
    TraceTask,
)


def _speeds(
    tasks: list[tuple[TraceTask, TraceAttempt, float]],
    stage_of: dict[Hashable, str],
    losers: Sequence[tuple[TraceAttempt, float]] = (),
) -> dict[str, float]:
    """Raw slow-down per worker: median duration / reference, normalised to all workers.

    A worker that finished nothing, every task of it beaten by a backup copy, is
    measured from its losing attempts: ``elapsed until the race was settled /
    reference`` is a lower bound of its slow-down (as the live plugin learns it)."""
    by_stage: dict[str, list[float]] = {}
    for t, _a, d in tasks:
        by_stage.setdefault(stage_of[t.key], []).append(d)
    stage_median = {s: _median(ds) for s, ds in by_stage.items()}
    ratios: dict[str, list[float]] = {}
    for t, a, d in tasks:
        if a.outcome != "memory" or a.worker is None:
            continue
        ref = _reference(t, stage_median, stage_of)
        if ref > 0 and d > 0:
            ratios.setdefault(a.worker, []).append(d / ref)
    every = [r for rs in ratios.values() for r in rs]
    if not every:
        return {}
    overall = _median(every)
    out = {w: _median(rs) / overall for w, rs in ratios.items()}
    ref_of = {t.key: _reference(t, stage_median, stage_of) for t, _a, _d in tasks}
    bounds: dict[str, list[float]] = {}
    for a, end in losers:
        b = _begin(a)
        ref = ref_of.get(a.key, math.nan)
        if a.worker is None or a.worker in out or b is None or not ref > 0:
            continue
        if end > b:
            bounds.setdefault(a.worker, []).append((end - b) / ref)
    for w, rs in bounds.items():
        out[w] = max(1.0, _median(rs) / overall)
    return out


def _reference(
    t: TraceTask, stage_median: dict[str, float], stage_of: dict[Hashable, str]
) -> float:
    if t.estimate_source == "annotation" and t.estimate:
        return float(t.estimate)
    return stage_median[stage_of[t.key]]


def _lost_capacity(
    trace: Trace,
    ended: list[tuple[TraceTask, TraceAttempt, float]],
    keep: set[Hashable],
    startup: float,
    slots: int,
    losers: Sequence[tuple[TraceAttempt, float]] = (),
) -> tuple[float, float]:
    """Slot-seconds lost while work waited, and the share of slot-seconds computing.

    Scheduler clock throughout. A task *waits* from when it could run in the
    simulator (its submission plus the start-up latency, and its inputs finished)
    until its first attempt started; a slot *computes* during ``[finished -
    duration, finished]`` of every attempt. At each moment, ``min(free slots,
    waiting tasks)`` slots are lost to dask: the simulator would have started
    that many tasks there. Free slots with nothing waiting are idle (the graph's
    shape), not lost. A copy that lost its race computes from its start until the
    race was settled, as the simulator kills it then; its thread really ran on, and
    while it did its slot counts as free (the simulator would have used it).
    """
    finished = {t.key: a.finished for t, a, _ in ended}
    events: list[tuple[float, int, int]] = []  # (time, 0 waiting / 1 computing, +1/-1)
    compute = 0.0
    for t in trace.tasks.values():
        if t.key not in keep or t.existing:
            continue
        ready = (t.submit + startup) if t.submit is not None else -math.inf
        for dep in t.deps:
            f = finished.get(dep)
            if f is not None:
                ready = max(ready, f)
        begin = next((b for b in map(_begin, t.attempts) if b is not None), None)
        if begin is not None and ready != -math.inf and begin > ready:
            events += [(ready, 0, 1), (begin, 0, -1)]
        for a in t.attempts:
            d = _duration(a)
            if _done(a) and a.finished is not None and d:
                events += [(a.finished - d, 1, 1), (a.finished, 1, -1)]
                compute += d
    for a, end in losers:
        b = _begin(a)
        if b is not None and end > b:
            events += [(b, 1, 1), (end, 1, -1)]
            compute += end - b
    if not events:
        return 0.0, math.nan
    events.sort()
    lost = 0.0
    waiting = busy = 0
    last = events[0][0]
    for x, kind, step in events:
        lost += min(max(0, slots - busy), waiting) * (x - last)
        last = x
        if kind == 0:
            waiting += step
        else:
            busy += step
    span = events[-1][0] - events[0][0]
    return lost, (compute / (slots * span) if span > 0 else math.nan)


def _dep_latency(
    ended: list[tuple[TraceTask, TraceAttempt, float]], threads: dict[str, int], cpn: int
) -> list[float]:
    """Seconds from a task's last input finishing to its start (scheduler clock: both are
    report arrivals), for dependents whose worker had a free slot at that moment."""
    fin = {t.key: a for t, a, _ in ended}
    spans: dict[str, tuple[list[float], list[float]]] = {}
    for _t, a, _ in ended:
        b = _begin(a)
        if a.worker is not None and b is not None and a.finished is not None:
            starts, ends = spans.setdefault(a.worker, ([], []))
            starts.append(b)
            ends.append(a.finished)
    for starts, ends in spans.values():
        starts.sort()
        ends.sort()
    out: list[float] = []
    for t, a, _ in ended:
        begin = _begin(a)
        inputs = [fin[d].finished for d in t.deps if d in fin and fin[d].finished is not None]
        if not inputs or begin is None or a.worker is None:
            continue
        x = max(x for x in inputs if x is not None)
        starts, ends = spans.get(a.worker, ([], []))
        busy = bisect.bisect_right(starts, x) - bisect.bisect_right(ends, x)
        if busy < threads.get(a.worker, cpn) and begin >= x:
            out.append(begin - x)
    return out
