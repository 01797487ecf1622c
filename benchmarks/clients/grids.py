"""A grid sweep of real CPU work written three usual ways, plain dask beside the plugin
(the docstring of ``bench_clients.py`` says what is measured)."""

from __future__ import annotations

import time
from typing import Any

import dask
import numpy as np
from distributed import Client, LocalCluster

import daskjobs
from daskjobs.plugin import JobsPlugin

WORKERS, THREADS = 2, 1
CLIENTS = ("map", "submit", "delayed")
CONFIGS = ("plain dask", "plugin, first run", "plugin, second run")
LONG = 40.0  # how much longer the long tasks are


def simulate(steps: int, prepared: Any = None) -> tuple[float, float]:
    """CPU work proportional to ``steps`` (about a millisecond a step on this machine); the
    start and end of the computation, on the worker's clock."""
    t0 = time.time()
    rng = np.random.default_rng(steps)
    x = rng.standard_normal(50_000)
    if prepared is not None:
        x = x + prepared[: x.size]
    for _ in range(int(steps)):
        x = np.tanh(x * 1.0001 + 0.01)
    return t0, time.time()


def prepare(n: int) -> np.ndarray:
    """The shared stage of the ``delayed`` form."""
    x = np.zeros(50_000)
    for _ in range(n):
        x = np.sin(x + 0.1)
    return x


def grid(seed: int, n: int, long_share: float, unit: int) -> list[int]:
    """``n`` distinct step counts, small to large: the last ``long_share`` of them ``LONG``
    times the rest, every one jittered by up to 20% (distinct: ``client.map`` gives equal
    arguments one key)."""
    rng = np.random.default_rng(seed)
    n_long = max(1, round(n * long_share))
    base = [unit * (1.0 + 0.5 * i / n) for i in range(n - n_long)]
    base += [unit * LONG] * n_long
    out: list[int] = []
    seen: set[int] = set()
    for b in base:
        s = max(1, int(b * rng.uniform(0.8, 1.2)))
        while s in seen:
            s += 1
        seen.add(s)
        out.append(s)
    return out


#: The wrong guess's arguments: ``INVERSE / steps``, so that the larger the argument, the
#: cheaper the task (a step size, a tolerance's inverse, a number of parallel chunks).
INVERSE = 10_000_000


def inverse_simulate(arg: int) -> tuple[float, float]:
    """``simulate`` of ``INVERSE / arg`` steps: the larger the argument, the cheaper."""
    return simulate(max(1, round(INVERSE / arg)))


def run_client(client: Client, form: str, steps: list[int], reverse: bool) -> list[tuple]:
    if reverse:
        # the same costs as arguments that fall as the cost grows, listed small to large as
        # a grid lists them: dask's order is then longest first, the prior's cheapest first
        args = sorted(round(INVERSE / s) for s in steps)
        if form == "map":
            return client.gather(client.map(inverse_simulate, args))
        return client.gather([client.submit(inverse_simulate, a) for a in args])
    if form == "map":
        return client.gather(client.map(simulate, steps))
    if form == "submit":
        futs = [client.submit(simulate, s) for s in steps]
        return client.gather(futs)
    shared = dask.delayed(prepare)(200)
    parts = [dask.delayed(simulate)(s, shared) for s in steps]
    return list(client.compute(parts, sync=True))


def one(form: str, steps: list[int], config: str, history: str, reverse: bool) -> float:
    """Makespan over the bound of one run on a fresh cluster."""
    kwargs = dict(
        n_workers=WORKERS, threads_per_worker=THREADS, processes=True, dashboard_address=":0"
    )
    if config == "plain dask":
        cluster = LocalCluster(**kwargs)
    else:
        cluster = daskjobs.local_cluster(JobsPlugin(history={"path": history}), **kwargs)
    with cluster, Client(cluster) as client:
        client.wait_for_workers(WORKERS)
        client.run(lambda: simulate(1))  # warm: numpy imported on every worker
        spans = run_client(client, form, steps, reverse)
    durations = [e - s for s, e in spans]
    makespan = max(e for _, e in spans) - min(s for s, _ in spans)
    bound = max(sum(durations) / (WORKERS * THREADS), max(durations))
    return makespan / bound
