"""Client-side helpers: a laptop cluster with the plugin, explain, status, a client's team."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: `daskjobs status` does not load the plugin
    from daskjobs.plugin.plugin import JobsPlugin

__all__ = ["explain", "local_cluster", "set_team", "start_rate", "status"]


def local_cluster(plugin: JobsPlugin | None = None, **cluster_kwargs: Any) -> Any:
    """A ``distributed.LocalCluster`` whose scheduler runs the daskjobs plugin.

    ``plugin`` defaults to ``JobsPlugin()`` configured from dask's config; other
    keyword arguments go to ``LocalCluster`` (``n_workers``, ``threads_per_worker``,
    ``processes``, ...). Use it as a context manager, like LocalCluster itself.
    """
    import multiprocessing

    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # a worker process dask started is importing the user's script again (the spawn
        # start method): without a main guard, the script would start a cluster of its own
        raise RuntimeError(MAIN_GUARD)
    from distributed import LocalCluster

    from daskjobs.plugin.plugin import JobsPlugin

    scheduler_kwargs = dict(cluster_kwargs.pop("scheduler_kwargs", None) or {})
    plugins = list(scheduler_kwargs.pop("plugins", None) or [])
    plugins.append(plugin if plugin is not None else JobsPlugin())
    scheduler_kwargs["plugins"] = plugins
    return LocalCluster(scheduler_kwargs=scheduler_kwargs, **cluster_kwargs)


#: What a script that starts a cluster without a main guard is told.
MAIN_GUARD = (
    "daskjobs.local_cluster() was called while one of its worker processes imported your "
    "script: dask starts worker processes by importing the main module again. Put the code "
    "that starts the cluster, and everything after it, under 'if __name__ == \"__main__\":' "
    "(or pass processes=False to run the workers as threads of this process)"
)


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


def explain(client: Any, key: Hashable, *, forecast: bool = False) -> dict[str, Any]:
    """Why is ``key`` waiting, or where did it run? Its estimate (and where the
    estimate came from), priority, team and place in the queue.

    With ``forecast=True``, a task that has not started also gets ``expected_start``:
    ``{"p10", "p50", "p90"}`` seconds from now, from :func:`daskjobs.forecast` (a
    simulation of the rest of the work, here on the client: about a second per 10^5
    unfinished tasks)."""
    info = _call(client, "daskjobs_explain", key=key)
    if forecast and info.get("state") in ("released", "waiting", "queued", "no-worker"):
        from daskjobs.forecasting import forecast as _forecast

        starts = _forecast(client, keys=[key], draws=10).starts
        r = starts.get(str(key))
        if r is not None:
            info["expected_start"] = {"p10": r.p10, "p50": r.p50, "p90": r.p90}
    return info


def status(client: Any) -> dict[str, Any]:
    """The plugin's policy, measured stages, counters and errors."""
    return _call(client, "daskjobs_status")


def set_team(client: Any, team: str | None = None) -> dict[str, Any]:
    """State ``client``'s team once: every graph it sends from now on without a ``team``
    annotation is that team's (``compute``, ``persist``, ``submit``, ``map``, a ``Sweep``,
    ``daskjobs.jobs.submit``, joblib), as long as the client stays connected.

    ``team`` defaults to ``daskjobs.team`` of this process's dask config
    (``DASK_DASKJOBS__TEAM=quant``). The client preload does this for every new client:
    ``distributed.client.preload: [daskjobs.client_preload]``. Returns what the scheduler
    makes of the client: its ``team``, its certificate ``identity`` (None without TLS),
    whether it is an ``admin`` and where the team comes from (``source``: ``stated``,
    ``certificate`` or ``default``).

    Without client certificates the stated team is trusted. On a cluster whose operator
    binds teams to certificates (``daskjobs.teams.identities``), the certificate decides:
    stating another team raises :class:`~daskjobs.plugin.TeamRefused` naming the client's
    identity and its team, unless the identity is an admin's (docs/how-to/teams.md).
    """
    from daskjobs.config import client_team
    from daskjobs.plugin.identity import TeamRefused

    stated = client_team(team)
    if stated is None:
        raise ValueError(
            "daskjobs.set_team: no team given, and daskjobs.team is not set in dask's config "
            "(DASK_DASKJOBS__TEAM=<team>, or set_team(client, '<team>'))"
        )
    answer = _call(client, "daskjobs_team", client_id=client.id, team=stated)
    if "refused" in answer:
        raise TeamRefused(answer["refused"])
    return dict(answer)


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
    (docs/how-to/load-the-plugin.md): tasks shorter than ``threads / rate`` seconds are then paced
    over a run instead of left to its end.
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
