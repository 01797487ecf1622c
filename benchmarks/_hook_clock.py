"""What the plugin's hooks cost on the scheduler's event loop, for ``bench_plugin.py``'s children.

:func:`install` wraps, at class level and before any plugin is made (a benchmark child runs
one configuration in a fresh interpreter, so nothing else sees the wrappers), every place where
the scheduler's event loop runs daskjobs' code:

- ``graph``: a new graph's checks and ranking (``JobsPlugin._new_graph``, called inside dask's
  ``_create_taskstate_from_graph``) and the ``built`` admission count;
- ``update_graph``: the plugin's ``update_graph`` hook;
- ``transition <start>-><finish>``: the plugin's transition hook (the loop over the parts that
  want that pair), by pair: ``processing->memory`` is a task's end, where the plugin learns;
  with ``parts_too``, each part's own ``transition`` too (``part:<name>``, inside those);
- ``reports``: the worker plugins' reports (starts, returned threads, inventories);
- ``periodic:<name>``: each of the plugin's periodic callbacks (``daskjobs-...`` in
  ``scheduler.periodic_callbacks``; coroutines timed step by step, not across their awaits),
  wrapped by :func:`wrap_periodic` once the plugin has started;
- ``forecast-snapshot``: the scheduler's forecast's snapshot on the loop (its steps), and
  ``forecast-thread``: its simulation's CPU in its own thread (not the loop's, but the GIL's).

Time is the loop thread's CPU time (``thread_time_ns``) around each call: a wall clock would
count the time the thread waits for the GIL or for the CPU, which on a loaded 2-core machine is
most of it. Reading it costs a system call (~0.8 us here); the clock's own cost is measured in
the same process (:func:`calibrate`: a wrapped no-op against a bare one) and taken out: from
each entry its calls times what a call's timer adds to its own reading, and from the
transitions also the whole cost of the parts' clocks inside them (``parts_too``; an estimate:
inside the scheduler a nested clock costs more than in the calibration's hot loop, so the
transitions read high then). The collector is clocked apart, through ``gc.callbacks``: a
collection runs in whichever call allocates past the threshold, dask's or the plugin's, so its
CPU is taken out of the call it interrupted and given, with the number of collections, under
``gc`` (what the plugin's allocations cost shows there, as more collections than plain dask's
on the same work). :func:`reading` gives totals in seconds and
call counts; :func:`reset` zeroes them.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Generator
from functools import wraps
from typing import Any

import harness

#: The clock (module docstring).
_now = time.thread_time_ns
#: name -> [nanoseconds, calls]
CLOCK: dict[str, list[int]] = {}
_GC: dict[str, float] = {"seconds": 0.0, "collections": 0}
#: per thread: the collector's CPU in it so far, and when its running collection started
_GC_NS: defaultdict[int, int] = defaultdict(int)
_GC_START: dict[int, int] = {}
_ident = threading.get_ident


def _add(name: str, ns: int) -> None:
    got = CLOCK.get(name)
    if got is None:
        CLOCK[name] = [ns, 1]
    else:
        got[0] += ns
        got[1] += 1


def _timed(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    @wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        me = _ident()
        g0 = _GC_NS[me]
        t0 = _now()
        try:
            return fn(*args, **kwargs)
        finally:
            _add(name, _now() - t0 - (_GC_NS[me] - g0))

    return call


class _Steps:
    """An awaitable timing each step of the coroutine it drives (not the time it waits)."""

    def __init__(self, coro: Any, name: str) -> None:
        self.coro, self.name = coro, name

    def __await__(self) -> Generator[Any, Any, Any]:
        gen = self.coro.__await__()
        send: Any = None
        throw: BaseException | None = None
        while True:
            me = _ident()
            g0 = _GC_NS[me]
            t0 = _now()
            try:
                out = gen.send(send) if throw is None else gen.throw(throw)
            except StopIteration as stop:
                _add(self.name, _now() - t0 - (_GC_NS[me] - g0))
                return stop.value
            _add(self.name, _now() - t0 - (_GC_NS[me] - g0))
            try:
                send, throw = (yield out), None
            except BaseException as e:  # cancelled while it waited: into the coroutine
                send, throw = None, e


def _steps(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    @wraps(fn)
    async def call(*args: Any, **kwargs: Any) -> Any:
        return await _Steps(fn(*args, **kwargs), name)

    return call


def _by_pair(hook: Callable[..., Any]) -> Callable[..., Any]:
    """The transition hook, clocked under ``transition <start>-><finish>``."""
    names: dict[tuple[str, str], str] = {}

    @wraps(hook)
    def call(self: Any, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> Any:
        me = _ident()
        g0 = _GC_NS[me]
        t0 = _now()
        try:
            return hook(self, key, start, finish, *args, **kwargs)
        finally:
            ns = _now() - t0 - (_GC_NS[me] - g0)
            name = names.get((start, finish))
            if name is None:
                name = names[start, finish] = f"transition {start}->{finish}"
            _add(name, ns)

    return call


def _maybe_steps(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A callback that may return a coroutine: its call timed, and the coroutine's steps."""

    def call() -> Any:
        me = _ident()
        g0 = _GC_NS[me]
        t0 = _now()
        out = fn()
        _add(name, _now() - t0 - (_GC_NS[me] - g0))
        if hasattr(out, "__await__"):
            return _Steps(out, name)
        return out

    return call


def _gc_phase(phase: str, info: dict[str, Any]) -> None:
    me = _ident()
    if phase == "start":
        _GC_START[me] = _now()
    elif me in _GC_START:
        ns = _now() - _GC_START.pop(me)
        _GC_NS[me] += ns
        _GC["seconds"] += ns / 1e9
        _GC["collections"] += 1


def install(parts_too: bool = True) -> None:
    """Wrap the plugin's code on the loop (module docstring); once, before any plugin. Without
    ``parts_too``, the parts' own transitions are not clocked apart (``transition`` then
    carries no nested clock's cost to take out)."""
    from daskjobs.plugin import parts
    from daskjobs.plugin.admission import AdmissionPart
    from daskjobs.plugin.observe.live_forecast import ForecastPart
    from daskjobs.plugin.plugin import JobsPlugin

    JobsPlugin._new_graph = _timed(JobsPlugin._new_graph, "graph")  # type: ignore[method-assign]
    AdmissionPart.built = _timed(AdmissionPart.built, "graph")  # type: ignore[method-assign]
    JobsPlugin.update_graph = _timed(JobsPlugin.update_graph, "update_graph")  # type: ignore[method-assign]
    parts.Transitions.hook = _by_pair(parts.Transitions.hook)  # type: ignore[method-assign]
    parts.run_reports = _timed(parts.run_reports, "reports")
    for cls in _subclasses(parts.Part) if parts_too else ():
        if "transition" in vars(cls):
            label = f"part:{cls.name}"
            cls.transition = _timed(vars(cls)["transition"], label)  # type: ignore[method-assign]
    ForecastPart._refresh = _steps(ForecastPart._refresh, "forecast-snapshot")  # type: ignore[method-assign]
    simulate = ForecastPart._simulate

    def _simulate(self: Any, *args: Any) -> None:
        c0 = _now()
        try:
            simulate(self, *args)
        finally:
            _add("forecast-thread", _now() - c0)

    ForecastPart._simulate = _simulate  # type: ignore[method-assign]
    gc.callbacks.append(_gc_phase)


def wrap_periodic(dask_scheduler: Any) -> list[str]:
    """Time the plugin's periodic callbacks now on ``dask_scheduler`` (their names)."""
    names = []
    for name, pc in list(dask_scheduler.periodic_callbacks.items()):
        if name.startswith("daskjobs") and not getattr(pc.callback, "_clocked", False):
            pc.callback = _maybe_steps(pc.callback, f"periodic:{name}")
            pc.callback._clocked = True
            names.append(name)
    return names


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_subclasses(sub))
    return out


#: The clock's cost per call, in ns (:func:`calibrate`): what it adds to its own reading, and
#: in all (what a clocked call inside another clocked call adds to the outer reading).
OWN = {"recorded": 0.0, "full": 0.0}


def calibrate(n: int = 100_000) -> dict[str, float]:
    """Measure :data:`OWN` in this process, best of five rounds of ``n`` calls: a clocked
    no-op's reading against a bare no-op's cost (``recorded``), and a clocked call's reading
    with a clocked no-op inside against one with a bare no-op inside (``full``)."""

    def noop() -> None:
        return None

    inner = _timed(noop, "_inner")
    with_bare = _timed(noop, "_bare")
    with_clocked = _timed(inner, "_outer")
    recorded = full = float("inf")
    for _ in range(5):
        for k in ("_inner", "_bare", "_outer"):
            CLOCK.pop(k, None)
        t0 = _now()
        for _ in range(n):
            noop()
        bare = (_now() - t0) / n
        for _ in range(n):
            with_bare()
        for _ in range(n):
            with_clocked()
        recorded = min(recorded, CLOCK["_bare"][0] / n - bare)
        full = min(full, (CLOCK["_outer"][0] - CLOCK["_bare"][0]) / n)
    for k in ("_inner", "_bare", "_outer"):
        CLOCK.pop(k, None)
    OWN.update(recorded=max(0.0, recorded), full=max(0.0, full))
    return dict(OWN)


def reset() -> None:
    CLOCK.clear()
    _GC.update(seconds=0.0, collections=0)


def reading() -> dict[str, Any]:
    """``{"hooks": {name: [seconds, calls]}, "gc": {"seconds", "collections"}, "own":
    OWN}``, the clock's own cost taken out (module docstring)."""
    nested = sum(calls for k, (_, calls) in CLOCK.items() if k.startswith("part:"))
    total = sum(calls for k, (_, calls) in CLOCK.items() if k.startswith("transition "))
    hooks = {}
    for k, (ns, calls) in sorted(CLOCK.items()):
        if k != "forecast-thread":  # a thread's CPU, not a clocked call
            ns -= calls * OWN["recorded"]
            if k.startswith("transition ") and total:  # the parts' clocks, spread by calls
                ns -= nested * OWN["full"] * calls / total
        hooks[k] = [max(0.0, ns) / 1e9, calls]
    return {
        "hooks": hooks,
        "gc": {"seconds": _GC["seconds"], "collections": int(_GC["collections"])},
        "own": dict(OWN),
    }


# -- the table of bench_plugin.py --clock ---------------------------------------------------

#: The plugin's microseconds of the event loop's CPU a task, at most, in its default
#: configuration.
HOOK_BUDGET = 20.0


#: The clocked hooks, grouped for the table: column -> does a clock's name belong to it.
HOOK_COLUMNS: dict[str, Callable[[str], bool]] = {
    "graph": lambda k: k in ("graph", "update_graph"),
    "end": lambda k: k.startswith("transition processing->") and not k.endswith("->processing"),
    "start": lambda k: k.startswith("transition ") and k.endswith("->processing"),
    "other transitions": lambda k: (
        k.startswith("transition ")
        and not k.startswith("transition processing->")
        and not k.endswith("->processing")
    ),
    "reports": lambda k: k == "reports",
    "periodic": lambda k: k.startswith("periodic:") or k == "forecast-snapshot",
}


def hook_rows(clock: dict[str, Any], n: int) -> dict[str, float]:
    """One clocked run's figures in microseconds per task (the table's columns)."""
    hooks = clock["hooks"]
    out = {
        col: sum(sec for k, (sec, _) in hooks.items() if belongs(k)) / n * 1e6
        for col, belongs in HOOK_COLUMNS.items()
    }
    out["plugin"] = sum(out.values())
    out["forecast thread"] = hooks.get("forecast-thread", [0.0, 0])[0] / n * 1e6
    out["loop"] = clock["loop_cpu"] / n * 1e6
    out["gc"] = clock["gc"]["seconds"] / n * 1e6
    out["collections"] = clock["gc"]["collections"] / n * 1000
    return out


def hooks_table(runs: list[dict[str, Any]], n: int) -> str:
    cols = list(HOOK_COLUMNS)
    body = []
    for run in runs:
        for name, clock in run["clocks"].items():
            r = hook_rows(clock, n)
            body.append(
                [str(run["workers"]), name]
                + [
                    "-" if not clock["hooks"] else f"{r[c]:.1f}"
                    for c in [*cols, "plugin", "forecast thread"]
                ]
                + [f"{r['loop']:.0f}", f"{r['gc']:.0f}"]
                + [f"{r['collections']:.0f}"]
            )
    if not body:
        return ""
    return (
        harness.table(
            [
                "workers",
                "configuration",
                *cols,
                "plugin (loop)",
                "forecast thread",
                "event loop",
                "collector",
                "collections / 10^3 tasks",
            ],
            body,
            align="ll" + "r" * (len(cols) + 5),
        )
        + f"\n\nMicroseconds of CPU per task, one clocked run of {n:,} trivial tasks per "
        "configuration: the plugin's hooks on the scheduler's event loop (a new graph's ranking "
        "and ``update_graph``; a task's end, where it learns; its start; its other "
        "transitions; the worker plugins' reports; the periodic callbacks), their sum, the "
        "scheduler's forecast in its own thread, the event loop's whole CPU (dask's scheduler, "
        "the in-process workers' comms and the client), and the collector's CPU with its "
        f"collections (target for the default configuration: at most {HOOK_BUDGET:.0f} us "
        "in the plugin)."
    )
