"""Client-side helpers: a laptop cluster with the plugin, explain, status."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from daskjobs.plugin.plugin import JobsPlugin

__all__ = ["explain", "local_cluster", "status"]


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
