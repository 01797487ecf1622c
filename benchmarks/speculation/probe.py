"""Fixed costs: submission to the first task start, three ways.

One sweep of ``n`` tasks (4 workers x 8 threads, one slow, in this process), alternating
on a fresh cluster per run: plain dask and the full plugin given the graph of
``dask.delayed`` calls (``client.compute``), and the full plugin given the same sweep
through the sweep API (``Sweep.run``, no store). The time includes building nothing on
the client but what each call builds itself (``Sweep.run`` plans its graph inside the
call).
"""

from __future__ import annotations

import statistics
import sys
import time

from distributed import Client, LocalCluster
from harness import order, table

from daskjobs.plugin import JobsPlugin
from daskjobs.sim import workloads
from daskjobs.sweep import Sweep
from speculation import workload
from speculation.workload import N_LONG, SLOW_FACTOR, SPECULATION, Case, grid_graph

HOWS = ("plain", "plugin", "plugin, Sweep.run")


def submit_probe(n: int, reps: int) -> dict[str, list[float]]:
    """Seconds from submission to the first task start, ``reps`` runs of each way."""
    case = Case(n, 4, 8, 1, 0.3, 99)
    w = workloads.chapter(case.seed, n=n, n_long=N_LONG, median=0.1, sigma=0.76)
    estimates = {i: float(t.estimate) for i, t in enumerate(w.tasks)}
    out: dict[str, list[float]] = {how: [] for how in HOWS}
    for rep in range(reps):
        for how in order(HOWS, rep):
            plugin = None
            if how != "plain":
                plugin = JobsPlugin(policy="node-aware", speculation=dict(SPECULATION))
            with (
                LocalCluster(
                    n_workers=case.workers,
                    threads_per_worker=case.threads,
                    processes=False,
                    dashboard_address=":0",
                    scheduler_kwargs={"plugins": [plugin] if plugin else []},
                ) as cl,
                Client(cl) as client,
            ):
                client.wait_for_workers(case.workers)
                if how == "plugin, Sweep.run":
                    sweep = Sweep("probe")
                    sweep.stage(
                        workload.nap_logged,
                        over=[
                            {"i": i, "seconds": float(t.duration)} for i, t in enumerate(w.tasks)
                        ],
                        params={"slow": ("0",), "slow_factor": SLOW_FACTOR},
                        estimate=lambda p: estimates[p["i"]],
                        cache=False,
                        name="nap",
                    )
                    workload.SPANS.clear()
                    t0 = time.time()
                    sweep.run(client, store=False, progress=False)
                else:
                    parts, _ = grid_graph(case)
                    workload.SPANS.clear()
                    t0 = time.time()
                    client.compute(parts, sync=True)
                first = min(sp[2] for sp in workload.SPANS if sp[2] >= t0)
            out[how].append(first - t0)
            print(f"  submit probe {how}: first start {first - t0:.3f} s", file=sys.stderr)
    return out


def submit_table(out: dict[str, list[float]], n: int) -> str:
    """Median and range per way of submitting."""
    runs = len(next(iter(out.values())))
    return f"{n} tasks on 4 workers x 8 threads ({runs} runs each, alternating):\n\n" + table(
        ["submitted as", "median (s)", "min - max (s)"],
        [
            [how, f"{statistics.median(xs):.3f}", f"{min(xs):.3f} - {max(xs):.3f}"]
            for how, xs in out.items()
        ],
    )
