"""Replay a ``client.get_task_stream()`` dump: no plugin needed.

dask's task stream keeps one record per finished task attempt: ``key``,
``worker``, ``thread``, ``status`` (``OK`` or ``error``) and ``startstops``
(``compute`` and ``transfer`` actions, with start and stop on the worker's
clock). :func:`from_task_stream` maps each record to an attempt of a task
(duration: the ``compute`` seconds; transfer: the ``transfer`` seconds), builds
a :class:`~daskjobs.trace.Trace` from them and loads it like a recorded
trace (:func:`daskjobs.replay.load.load`), so the overhead, worker speeds and
everything else are fitted the same way.

What a task stream lacks, and what is used instead (also in
:attr:`~daskjobs.replay.load.Loaded.notes`):

* **estimates**: each task's estimate is its stage's median measured compute
  time (what the plugin's history would give after one run);
* **teams**: every task is in team ``default``;
* **dependencies**: none unless the graph is given (``deps=``, a mapping key ->
  input keys, or the dask collection that ran); without them the tasks replay
  as independent, which under-estimates a DAG's makespan;
* **submit times**: every task is taken as submitted when the *busy stretch* it
  started in began (the cluster computing without a break since; no start-up
  latency). Work submitted during a stretch cannot be told from work submitted at its
  start, but work never waits through an idle cluster, so the idle hours between a
  day's submissions are neither read as dask's per-task overhead nor dropped from the
  replay;
* **threads per worker**: counted from the thread ids seen (``nthreads=``
  overrides);
* **the policy** that ran: replayed as ``fifo`` unless another is asked;
* **lost attempts** (worker died, stolen) are not in a task stream, and times
  are each worker's own clock.

This module does not import ``distributed``.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Hashable, Iterable, Mapping
from pathlib import Path
from typing import Any

from daskjobs.replay.load import Loaded, ReplayError, _prefix, load
from daskjobs.trace import Trace, TraceAttempt, TraceTask, TraceWorker

__all__ = ["LACKS", "from_task_stream", "read_task_stream"]

#: What a task stream does not hold (printed by ``daskjobs replay --task-stream``).
LACKS = (
    "task stream: no estimates (each task's is its stage's median measured duration), "
    "no teams (all 'default'), no submit times (each taken as the start of the busy stretch "
    "it ran in; start-up 0), no policy (replayed as fifo), no lost or stolen attempts"
)


def _busy_stretch_starts(
    attempts: Mapping[Hashable, list[TraceAttempt]], order: list[Hashable]
) -> dict[Hashable, float]:
    """Per task (``order``: by first start), the start of the busy stretch its first
    attempt started in: the cluster computed without a break from then until that start
    (a task waiting while nothing computed would have started). O(n log n)."""
    spans = sorted(
        (a.compute_start, a.compute_start + (a.duration or 0.0))
        for atts in attempts.values()
        for a in atts
        if a.compute_start is not None
    )
    out: dict[Hashable, float] = {}
    i = 0
    stretch = busy_until = -math.inf
    for key in order:
        first = attempts[key][0].compute_start or 0.0
        while i < len(spans) and spans[i][0] <= first:
            begin, end = spans[i]
            if begin > busy_until:  # the cluster was idle before this start
                stretch = begin
            busy_until = max(busy_until, end)
            i += 1
        out[key] = stretch if stretch > -math.inf else first
    return out


def _key(value: Any) -> Hashable:
    if isinstance(value, list | tuple):
        return tuple(_key(v) for v in value)
    return value


def _number(where: str, rec: Mapping[str, Any], name: str) -> float:
    v = rec.get(name)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ReplayError(f"{where}: field {name!r} must be a finite number, got {v!r}")
    return float(v)


def read_task_stream(
    path: str | os.PathLike[str],
) -> tuple[list[dict[str, Any]], dict[Hashable, tuple[Hashable, ...]] | None]:
    """Read a task-stream dump: a JSON list of records (``json.dump(records, f,
    default=str)``), or an object ``{"task_stream": [...], "deps": ...}`` where
    ``deps`` maps each key to its input keys (an object for string keys, or a
    list of ``[key, [input, ...]]`` pairs for tuple keys)."""
    p = str(path)
    try:
        data = json.loads(Path(path).read_bytes())
    except (ValueError, RecursionError) as exc:  # also not UTF-8, or nested too deeply
        raise ReplayError(f"{p}: not JSON: {' '.join(str(exc).split())[:200]}") from None
    except OSError as exc:
        raise ReplayError(f"{p}: cannot read: {exc.strerror or exc}") from None
    deps: dict[Hashable, tuple[Hashable, ...]] | None = None
    if isinstance(data, dict):
        if "task_stream" not in data:
            raise ReplayError(
                f"{p}: expected a JSON list of task-stream records or an object with "
                f"'task_stream', got an object with {sorted(data)[:5]}"
            )
        raw = data.get("deps")
        if raw is not None:
            pairs = raw.items() if isinstance(raw, dict) else raw
            try:
                deps = {_key(k): tuple(_key(d) for d in v) for k, v in pairs}
            except (TypeError, ValueError):
                raise ReplayError(
                    f"{p}: 'deps' must map each key to a list of keys "
                    "(an object, or a list of [key, [input, ...]] pairs)"
                ) from None
        data = data["task_stream"]
    if not isinstance(data, list):
        raise ReplayError(f"{p}: the task stream must be a JSON list, got {type(data).__name__}")
    return data, deps


def _graph_deps(graph: Any) -> dict[Hashable, tuple[Hashable, ...]]:
    """Input keys of every task of a mapping or of a dask collection (optimised as
    ``compute`` optimises it, so fused keys match the task stream's)."""
    if isinstance(graph, Mapping):
        return {_key(k): tuple(_key(d) for d in v) for k, v in graph.items()}
    colls = list(graph) if isinstance(graph, list | tuple) else [graph]
    if colls and all(hasattr(c, "__dask_graph__") for c in colls):
        import dask
        from dask.core import get_deps

        merged: dict[Hashable, Any] = {}
        for opt in dask.optimize(*colls):
            merged.update(dict(opt.__dask_graph__()))
        dependencies, _ = get_deps(merged)  # type: ignore[arg-type]
        return {k: tuple(v) for k, v in dependencies.items()}
    raise TypeError(
        "deps must be a mapping key -> input keys, or the dask collection(s) that ran, "
        f"got {type(graph).__name__}"
    )


def from_task_stream(
    records: Iterable[Mapping[str, Any]] | str | os.PathLike[str],
    deps: Mapping[Hashable, Iterable[Hashable]] | Any | None = None,
    *,
    nthreads: int | None = None,
    path: str | None = None,
) -> Loaded:
    """Load task-stream records (``client.get_task_stream()``, or a file written with
    ``json.dump(records, f, default=str)``) for replay. ``deps`` gives the graph
    (a mapping key -> input keys, or the dask collection(s) that ran); ``nthreads``
    the threads per worker (default: the thread ids seen). See the module for
    what a task stream lacks."""
    file_deps = None
    if isinstance(records, str | os.PathLike):
        path = path or str(records)
        records, file_deps = read_task_stream(records)
    where = path or "<task stream>"
    graph = _graph_deps(deps) if deps is not None else file_deps

    attempts: dict[Hashable, list[TraceAttempt]] = {}
    threads: dict[str, set[Any]] = {}
    skipped = 0
    for i, rec in enumerate(records):
        here = f"{where}: record {i}"
        if not isinstance(rec, Mapping):
            raise ReplayError(f"{here}: expected an object, got {type(rec).__name__}")
        for name in ("key", "worker", "startstops"):
            if name not in rec:
                raise ReplayError(f"{here}: field {name!r} is missing")
        worker = rec["worker"]
        if not isinstance(worker, str):
            raise ReplayError(f"{here}: field 'worker' must be a string, got {worker!r}")
        ss = rec["startstops"]
        if not isinstance(ss, list | tuple):
            raise ReplayError(f"{here}: field 'startstops' must be a list, got {ss!r}")
        compute = transfer = 0.0
        start = stop = math.nan
        for j, s in enumerate(ss):
            if not isinstance(s, Mapping) or "action" not in s:
                raise ReplayError(f"{here}: startstops[{j}] must be an object with 'action'")
            a, b = (_number(f"{here}: startstops[{j}]", s, n) for n in ("start", "stop"))
            if s["action"] == "compute":
                compute += max(0.0, b - a)
                start = a if math.isnan(start) else min(start, a)
                stop = b if math.isnan(stop) else max(stop, b)
            elif s["action"] == "transfer":
                transfer += max(0.0, b - a)
        if math.isnan(start):  # no compute action: nothing ran
            skipped += 1
            continue
        key = _key(rec["key"])
        ok = rec.get("status", "OK") == "OK"
        threads.setdefault(worker, set()).add(rec.get("thread"))
        attempts.setdefault(key, []).append(
            TraceAttempt(
                key,
                worker=worker,
                started=start,
                worker_start=start,
                finished=stop,
                state="memory" if ok else "erred",
                outcome="memory" if ok else "erred",
                compute_start=start,
                compute_stop=stop,
                duration=compute,
                transfer=transfer or None,
            )
        )
    if not attempts:
        raise ReplayError(
            f"{where}: no task-stream record with a 'compute' action "
            f"({skipped} records without one): nothing to replay"
        )
    for atts in attempts.values():
        atts.sort(key=lambda a: a.compute_start or 0.0)
    t0 = min(a.compute_start or 0.0 for atts in attempts.values() for a in atts)
    by_stage: dict[str, list[float]] = {}
    for key, atts in attempts.items():
        by_stage.setdefault(_prefix(key), []).append(atts[-1].duration or 0.0)
    stage_median = {s: statistics.median(ds) for s, ds in by_stage.items()}
    order = sorted(attempts, key=lambda k: attempts[k][0].compute_start or 0.0)
    submitted = _busy_stretch_starts(attempts, order)
    trace = Trace(
        path=where,
        header={"type": "header", "version": 1, "policy": None, "settings": {}},
        footer={"type": "footer", "dropped": 0, "records": len(order)},
    )
    for n, key in enumerate(order):
        stage = _prefix(key)
        trace.tasks[key] = TraceTask(
            key,
            deps=tuple(graph.get(key, ())) if graph else (),
            estimate=stage_median[stage],
            estimate_source="history",
            team="default",
            stage=stage,
            priority=(0, 0, 0, n),
            submit=submitted[key],
            attempts=attempts[key],
        )
    for addr, ids in sorted(threads.items()):
        trace.workers.append(
            TraceWorker(addr, nthreads=nthreads or len(ids), added=t0, existing=False)
        )
    loaded = load(trace)
    notes = [LACKS]
    if graph is None:
        notes.append(
            "no graph given: dependencies unknown, tasks replayed as independent "
            "(a DAG replays short)"
        )
    notes.append(
        "threads per worker "
        + (f"{nthreads} (given)" if nthreads else "counted from the thread ids seen")
    )
    if skipped:
        notes.append(f"{skipped} record(s) without a 'compute' action skipped")
    loaded.notes[:0] = notes
    return loaded
