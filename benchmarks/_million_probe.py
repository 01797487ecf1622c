"""The scheduler preload of ``benchmarks/bench_million.py``: what the scheduler did, from inside.

Loaded through dask's config (``distributed.scheduler.preload``) beside or without
``daskjobs.preload``, it records on the scheduler's own clock:

- the event loop's blocks: a tornado ``PeriodicCallback`` every 10 ms; a gap between two of
  its calls past 10 ms is the loop busy with something else (the longest gaps, their end
  times, and what the scheduler held then);
- the moment the scheduler holds the expected number of tasks
  (``DASKJOBS_MILLION_EXPECT``), at which it creates the flag file
  (``DASKJOBS_MILLION_FLAG``) that releases the benchmark's gate task;
- the time spent in ``Scheduler._set_priorities`` (dask's own, or the plugin's wrapper of it
  with the ranking), in the plugin's ``update_graph`` hook and in each periodic callback:
  the plugin's own blocks of the loop, apart from dask's.

The benchmark reads it all with ``client.run_on_scheduler(probe_state)``.
"""

from __future__ import annotations

import os
import time
from functools import wraps
from typing import Any

#: The probe's period in seconds.
PERIOD = 0.01
#: How many of the longest gaps are kept.
KEEP = 8


def _timed(fn: Any, where: dict[str, list[float]], name: str) -> Any:
    @wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            where.setdefault(name, []).append(time.perf_counter() - t0)

    return call


def dask_setup(scheduler: Any) -> None:
    from tornado.ioloop import PeriodicCallback

    expect = int(os.environ.get("DASKJOBS_MILLION_EXPECT", "0"))
    flag = os.environ.get("DASKJOBS_MILLION_FLAG", "")
    state: dict[str, Any] = {"gaps": [], "held": None, "calls": {}, "wrapped": False}
    last = [time.perf_counter()]

    def wrap() -> None:
        # after every preload ran (the plugin wraps _set_priorities at its start)
        calls = state["calls"]
        scheduler._set_priorities = _timed(scheduler._set_priorities, calls, "_set_priorities")
        plugin = scheduler.plugins.get("daskjobs")
        if plugin is not None:
            plugin.update_graph = _timed(plugin.update_graph, calls, "plugin.update_graph")
        for name, pc in scheduler.periodic_callbacks.items():
            if name != "million-probe":
                pc.callback = _timed(pc.callback, calls, f"periodic:{name}")
        state["wrapped"] = True

    def tick() -> None:
        now = time.perf_counter()
        gap = now - last[0] - PERIOD
        last[0] = now
        if not state["wrapped"] and scheduler.status.name == "running":
            wrap()
        if gap > 0.02:
            gaps = state["gaps"]
            gaps.append((gap, time.time(), len(scheduler.tasks)))
            gaps.sort(reverse=True)
            del gaps[KEEP:]
        if state["held"] is None and expect and len(scheduler.tasks) >= expect:
            state["held"] = time.time()
            if flag:
                with open(flag, "w"):
                    pass

    pc = PeriodicCallback(tick, PERIOD * 1000)
    scheduler.periodic_callbacks["million-probe"] = pc
    pc.start()
    scheduler.million_probe = state


def probe_state(dask_scheduler: Any) -> dict[str, Any]:
    """The probe's record, for ``client.run_on_scheduler``: the longest gaps
    ``(seconds, end time, tasks held)``, the time the expected tasks were all held, and per
    timed call its count, total and longest seconds."""
    import daskjobs

    s = dask_scheduler.million_probe
    calls = {k: (len(v), sum(v), max(v)) for k, v in s["calls"].items() if v}
    return {
        "gaps": list(s["gaps"]),
        "held": s["held"],
        "calls": calls,
        "plugin": "daskjobs" in dask_scheduler.plugins,
        "daskjobs_file": daskjobs.__file__,
        "tasks": len(dask_scheduler.tasks),
    }
