"""The scheduler plugin on a real (local) dask cluster: its cost, and what it buys.

Usage::

    python benchmarks/bench_plugin.py            # full run (a few minutes)
    python benchmarks/bench_plugin.py --quick    # 500 tasks, 3 reps, one seed of 400 tasks

Two experiments:

1. **Scheduler throughput.** ``client.map(inc, range(10_000))`` then ``gather``
   on ``LocalCluster(n_workers=2, threads_per_worker=1, processes=False)`` (the
   setup of the research notes, section 8), with no plugin, with
   ``JobsPlugin(policy="critical-path")`` and with ``JobsPlugin(policy="fair-share")``,
   alternating in one cluster: each rep registers the plugin
   (``client.register_plugin``), runs, closes it and unregisters it
   (``client.unregister_scheduler_plugin``; dask does not call ``close`` on
   unregister, so the script does, restoring dask's ``_set_priorities``). The
   order of the three configurations rotates each rep. Reported: the median
   wall time per configuration, the throughput ratio ``median(plain) /
   median(plugin)`` and the paired ratios (plain / plugin within each rep: median
   and range); target >= 0.90.
2. **The chapter sweep on a laptop.** 32 slots (4 workers x 8 threads,
   ``processes=False``: ``time.sleep`` releases the GIL), sleep tasks with
   log-normal durations (median 0.1 s, sigma 0.76) from
   :func:`daskjobs.sim.workloads.chapter`, the 4 longest at 30x the median and
   submitted last, estimates with ``exp(0.3 z)`` noise passed as ``estimate``
   annotations. dask.order runs independent tasks in descending key order, so
   the keys are named to make plain dask's order the submission order (the
   chapter's FIFO). The whole sweep is one graph (a list of delayed tasks computed
   together), so the plugin ranks it before anything runs. Makespan (first
   task start to last task end, measured in the tasks) over the lower bound
   ``max(work / slots, longest task)``; plain dask vs the plugin's LPT, on a
   fresh cluster per run, for 3 seeds.

Prints markdown tables with the command and the machine (``--markdown``/``--plot``
write them and a PNG). This is a script, not a test: nothing here asserts.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import dask
import harness
from distributed import Client, LocalCluster

from daskjobs.plugin import JobsPlugin
from daskjobs.sim import workloads

SLOTS = (4, 8)  # workers x threads
#: The throughput with the plugin over plain dask's that the plugin aims for.
TARGET = 0.90


def inc(x: int) -> int:
    return x + 1


def nap(seconds: float) -> tuple[float, float]:
    t0 = time.time()
    time.sleep(seconds)
    return t0, time.time()


# -- 1. throughput ------------------------------------------------------------------------


async def _close_plugin(dask_scheduler: Any) -> None:
    plugin = dask_scheduler.plugins.get("daskjobs")
    if plugin is not None:
        await plugin.close()


def _wait_idle(client: Client) -> None:
    deadline = time.time() + 30
    while time.time() < deadline:
        if client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) == 0:
            return
        time.sleep(0.05)


def one_rep(client: Client, n: int, policy: str | None) -> float:
    if policy is not None:
        client.register_plugin(JobsPlugin(policy=policy))
    try:
        t0 = time.perf_counter()
        futs = client.map(inc, range(n))
        client.gather(futs)
        seconds = time.perf_counter() - t0
        del futs
    finally:
        if policy is not None:
            client.run_on_scheduler(_close_plugin)
            client.unregister_scheduler_plugin("daskjobs")
    _wait_idle(client)
    return seconds


def throughput(n: int, reps: int) -> list[dict[str, Any]]:
    """Wall time of ``n`` trivial tasks per configuration, ``reps`` runs each, the
    configurations in turns (the order rotating every rep) on one cluster."""
    configs = {"plain dask": None, "critical-path": "critical-path", "fair-share": "fair-share"}
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cl,
        Client(cl) as client,
    ):
        one_rep(client, min(n, 1000), None)  # warm up imports and connections
        times = harness.alternate(
            {name: (lambda p=policy: one_rep(client, n, p)) for name, policy in configs.items()},
            reps,
            show=lambda name, rep, s: f"rep {rep} {name}: {s:.2f} s",
        )
    plain = statistics.median(times["plain dask"])
    rows = []
    for c in configs:
        med = statistics.median(times[c])
        rows.append(
            {
                "config": c,
                "times": times[c],
                "median": med,
                "rate": n / med,
                "ratio": plain / med,
                "paired": harness.spread(harness.paired_ratios(times["plain dask"], times[c])),
            }
        )
    return rows


def throughput_table(rows: list[dict[str, Any]], n: int) -> str:
    body = harness.table(
        [
            "configuration",
            "wall times (s)",
            "median (s)",
            "tasks/s",
            "throughput vs plain",
            "paired, median (range)",
        ],
        [
            [
                r["config"],
                ", ".join(f"{t:.2f}" for t in r["times"]),
                f"{r['median']:.2f}",
                f"{r['rate']:,.0f}",
                f"{r['ratio']:.2f}"
                + (
                    ""
                    if r["config"] == "plain dask"
                    else (" ok" if r["ratio"] >= TARGET else " MISS")
                ),
                "-" if r["config"] == "plain dask" else r["paired"].text(".2f"),
            ]
            for r in rows
        ],
        align="llrrrr",
    )
    return body + f"\n\n{n:,} trivial tasks per rep; target ratio >= {TARGET:.2f}."


def throughput_chart(rows: list[dict[str, Any]]) -> harness.Chart:
    return harness.Chart(
        "Scheduler throughput, trivial tasks",
        "throughput / plain dask's",
        [r["config"] for r in rows],
        {"median of the paired runs": [r["paired"].median for r in rows]},
        reference=TARGET,
    )


# -- 2. the chapter sweep -----------------------------------------------------------------


def sweep_graph(seed: int, n: int) -> tuple[list[Any], list[float]]:
    w = workloads.chapter(seed, n=n, n_long=4, median=0.1, sigma=0.76, estimate_noise=0.3)
    parts, durations = [], []
    last = len(w.tasks) - 1
    for i, t in enumerate(w.tasks):  # the 4 long tasks come last
        # dask.order runs independent tasks in descending key order: name them so that
        # dask's own order is the submission order
        with dask.annotate(estimate=float(t.estimate)):
            parts.append(dask.delayed(nap)(float(t.duration), dask_key_name=f"bt-{last - i:06d}"))
        durations.append(float(t.duration))
    return parts, durations


def run_sweep(seed: int, n: int, plugin: JobsPlugin | None) -> dict[str, float]:
    workers, threads = SLOTS
    parts, durations = sweep_graph(seed, n)
    with (
        LocalCluster(
            n_workers=workers,
            threads_per_worker=threads,
            processes=False,
            dashboard_address=":0",
            scheduler_kwargs={"plugins": [plugin] if plugin else []},
        ) as cl,
        Client(cl) as client,
    ):
        client.wait_for_workers(workers)
        t0 = time.time()
        spans = client.compute(parts, sync=True)
        wall = time.time() - t0
    makespan = max(e for _, e in spans) - min(s for s, _ in spans)
    bound = max(sum(durations) / (workers * threads), max(durations))
    return {"makespan": makespan, "wall": wall, "bound": bound, "ratio": makespan / bound}


def sweep(seeds: list[int], n: int) -> list[dict[str, Any]]:
    """Plain dask and the plugin's LPT on each seed, their order alternating by seed."""
    rows = []
    for k, seed in enumerate(seeds):
        got = {}
        for name in harness.order(["plain", "lpt"], k):
            got[name] = run_sweep(seed, n, JobsPlugin(policy="lpt") if name == "lpt" else None)
        plain, lpt = got["plain"], got["lpt"]
        print(
            f"  seed {seed}: plain {plain['ratio']:.2f}x, plugin LPT {lpt['ratio']:.2f}x",
            file=sys.stderr,
        )
        rows.append({"seed": seed, "plain": plain, "lpt": lpt})
    return rows


def sweep_table(rows: list[dict[str, Any]], n: int) -> str:
    out = [
        "| seed | lower bound (s) | plain dask makespan (s) | / bound | "
        "plugin LPT makespan (s) | / bound | LPT / plain |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p, q = r["plain"], r["lpt"]
        out.append(
            f"| {r['seed']} | {p['bound']:.2f} | {p['makespan']:.2f} | {p['ratio']:.2f} | "
            f"{q['makespan']:.2f} | {q['ratio']:.2f} | {q['makespan'] / p['makespan']:.2f} |"
        )
    mp = statistics.median(r["plain"]["ratio"] for r in rows)
    mq = statistics.median(r["lpt"]["ratio"] for r in rows)
    workers, threads = SLOTS
    return "\n".join(out) + (
        f"\n\n{n:,} tasks per sweep on {workers * threads} slots ({workers} workers x "
        f"{threads} threads); median makespan / bound: plain {mp:.2f}, plugin LPT {mq:.2f}."
    )


def sweep_chart(rows: list[dict[str, Any]]) -> harness.Chart:
    return harness.Chart(
        "The chapter sweep on 32 slots",
        "makespan / bound",
        [f"seed {r['seed']}" for r in rows],
        {
            "plain dask": [r["plain"]["ratio"] for r in rows],
            "plugin LPT": [r["lpt"]["ratio"] for r in rows],
        },
        reference=1.0,
    )


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, seeds=3)
    ap.add_argument("--tasks", type=int, default=None, help="trivial tasks per throughput rep")
    ap.add_argument("--reps", type=int, default=None, help="throughput reps per configuration")
    ap.add_argument("--sweep-tasks", type=int, default=None, help="tasks per chapter sweep")
    args = ap.parse_args(argv)
    n = args.tasks or (500 if args.quick else 10_000)
    reps = args.reps or (3 if args.quick else 5)
    sweep_n = args.sweep_tasks or (400 if args.quick else 832)
    seeds = harness.seeds(args, 3)

    print(f"throughput: {n:,} tasks x {reps} reps ...", file=sys.stderr)
    tp = throughput(n, reps)
    print(f"chapter sweep: {sweep_n} tasks, seeds {seeds} ...", file=sys.stderr)
    sw = sweep(seeds, sweep_n)

    report = harness.Report("Scheduler plugin", __file__, argv)
    report.section(
        "Scheduler throughput: trivial tasks, plugin vs plain dask", throughput_table(tp, n)
    )
    report.section(
        "The chapter sweep on 32 slots: makespan over the lower bound", sweep_table(sw, sweep_n)
    )
    report.chart(throughput_chart(tp))
    report.chart(sweep_chart(sw))
    report.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
