"""Client-side helpers: a laptop cluster with the plugin, explain, status."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from daskjobs.plugin.plugin import JobsPlugin

__all__ = ["explain", "local_cluster", "start_rate", "status"]


def local_cluster(plugin: JobsPlugin | None = None, **cluster_kwargs: Any) -> Any:
    """A ``distributed.LocalCluster`` whose scheduler runs the daskjobs plugin.

    ``plugin`` defaults to ``JobsPlugin()`` configured from dask's config; other
    keyword arguments go to ``LocalCluster`` (``n_workers``, ``threads_per_worker``,
    ``processes``, ...). Use it as a context manager, like LocalCluster itself.
    """
    from distributed import LocalCluster

    scheduler_kwargs = dict(cluster_kwargs.pop("scheduler_kwargs", None) or {})
    plugins = list(scheduler_kwargs.pop("plugins", None) or [])
    plugins.append(plugin if plugin is not None else JobsPlugin())
    scheduler_kwargs["plugins"] = plugins
    return LocalCluster(scheduler_kwargs=scheduler_kwargs, **cluster_kwargs)


_NOT_LOADED = (
    "the daskjobs plugin is not loaded on this scheduler: register it with "
    "client.register_plugin(daskjobs.JobsPlugin()) or start the scheduler with "
    "--preload daskjobs.preload"
)


_REMOVED = (
    "the daskjobs plugin was removed from this scheduler (unregistered); register it "
    "again with client.register_plugin(daskjobs.JobsPlugin()) to use it"
)


def _call(client: Any, handler: str, **kwargs: Any) -> Any:
    # a scheduler without the handler answers None (and logs the unknown operation)
    result = client.sync(getattr(client.scheduler, handler), **kwargs)
    if result is None:
        raise RuntimeError(_NOT_LOADED)
    if isinstance(result, dict) and result.get("daskjobs") == "removed":
        raise RuntimeError(_REMOVED)
    return result


def explain(client: Any, key: Hashable) -> dict[str, Any]:
    """Why is ``key`` waiting, or where did it run? Its estimate (and where the
    estimate came from), priority, team and place in the queue."""
    return _call(client, "daskjobs_explain", key=key)


def status(client: Any) -> dict[str, Any]:
    """The plugin's policy, measured stages, counters and errors."""
    return _call(client, "daskjobs_status")


def _stamp(seconds: float) -> tuple[float, float]:
    """Sleep ``seconds``; the worker's clock at the start and at the end."""
    import time

    t0 = time.time()
    if seconds:
        time.sleep(seconds)
    return t0, time.time()


def _rate(stamps: list[tuple[float, float]]) -> float:
    """Tasks a second over the time from the first start to the last end."""
    if len(stamps) < 2:
        raise ValueError(f"need at least 2 tasks' start and end times, got {len(stamps)}")
    span = max(e for _, e in stamps) - min(s for s, _ in stamps)
    if not span > 0:
        raise ValueError(
            f"{len(stamps)} tasks started and ended within {span!r} s of each other on the "
            "workers' clocks: too few tasks to time; run more"
        )
    return len(stamps) / span


def start_rate(client: Any, tasks: int = 2000, seconds: float = 0.02) -> float:
    """How many tasks a second this cluster's scheduler starts when every thread wants one.

    Runs ``tasks`` independent tasks of ``seconds`` each as one graph, and divides their
    count by the time from the first start to the last end, on the workers' clocks (on
    several machines, their clock offsets blur it by as much). The plugin, if loaded,
    releases them as it releases any sweep, so this is the rate with it. Every thread
    busy with short sleeps, as in a sweep, loads the workers' processes as a run does; a
    cluster with too few threads to ask for more starts than its scheduler makes reports
    about ``threads / seconds``. Set a little less as node-aware's ``dispatch-rate``
    (docs/plugin.md): tasks shorter than ``threads / rate`` seconds are then paced over a
    run instead of left to its end.
    """
    import uuid

    import dask

    if isinstance(tasks, bool) or not isinstance(tasks, int) or tasks < 2:
        raise ValueError(f"tasks must be an integer >= 2, got {tasks!r}")
    if isinstance(seconds, bool) or not (
        isinstance(seconds, int | float) and 0 <= seconds < float("inf")
    ):
        raise ValueError(f"seconds must be a finite number >= 0, got {seconds!r}")
    run = uuid.uuid4().hex[:8]
    graph = [
        dask.delayed(_stamp, pure=False)(seconds, dask_key_name=f"daskjobs-start-rate-{run}-{i}")
        for i in range(tasks)
    ]
    return _rate(list(client.compute(graph, sync=True)))
