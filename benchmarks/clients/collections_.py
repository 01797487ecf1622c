"""``dask.array`` and ``dask.dataframe`` reductions, plain dask beside the plugin: time from
submission to result on a warmed cluster (the same reduction at its quick size first), and the
workers' peak memory (each run on a fresh cluster of worker processes, so that a process's peak
resident set is that run's)."""

from __future__ import annotations

import resource
import time
from typing import Any

from distributed import Client, LocalCluster

import daskjobs

WORKERS, THREADS = 2, 2


def _peak_rss() -> int:
    """This worker process's peak resident set, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def array_reduction(quick: bool) -> Any:
    import dask.array as da

    n = 4_000 if quick else 8_000
    x = da.random.RandomState(0).random((n, n), chunks=(1_000, 1_000))
    return ((x + x.T) * 2).mean(axis=0).std()


def dataframe_reduction(quick: bool) -> Any:
    import dask
    import dask.dataframe as dd  # noqa: F401 (dask.datasets needs it)

    end = "2000-01-11" if quick else "2000-01-31"
    df = dask.datasets.timeseries(start="2000-01-01", end=end, freq="1s", seed=0)
    by_name = df.groupby("name").agg({"x": "mean", "y": "std", "id": "count"})
    return by_name, df.x.quantile(0.9)


WORKLOADS = {"dask.array": array_reduction, "dask.dataframe": dataframe_reduction}


def run(workload: str, plugin: bool, quick: bool) -> tuple[float, int, Any]:
    """Seconds from submission to result, the largest peak RSS of the workers, the result."""
    kwargs: dict[str, Any] = dict(
        n_workers=WORKERS, threads_per_worker=THREADS, processes=True, dashboard_address=":0"
    )
    cluster = daskjobs.local_cluster(**kwargs) if plugin else LocalCluster(**kwargs)
    with cluster, Client(cluster) as client:
        client.wait_for_workers(WORKERS)
        # warm: the workers' imports, and the plugin's set-up on each worker (its worker
        # plugins arrive as the cluster starts), outside the time
        client.compute(WORKLOADS[workload](True), sync=True)
        graph = WORKLOADS[workload](quick)
        t0 = time.perf_counter()
        result = client.compute(graph, sync=True)
        seconds = time.perf_counter() - t0
        peak = max(client.run(_peak_rss).values())
    return seconds, peak, result
