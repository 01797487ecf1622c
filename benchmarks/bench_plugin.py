"""The scheduler plugin on a real (local) dask cluster: its cost, and what it buys.

Usage::

    python benchmarks/bench_plugin.py            # full run (hours on 2 CPUs)
    python benchmarks/bench_plugin.py --quick    # 300 tasks, 1 rep, one seed of 400 tasks
    python benchmarks/bench_plugin.py --tasks 20000 --workers 2 128 --no-sweep
    python benchmarks/bench_plugin.py --tasks 20000 --no-sweep --clock   # + per hook

Two experiments:

1. **Scheduler throughput, flat in workers?** ``client.map(inc, range(100_000))`` then
   ``gather`` on ``LocalCluster(n_workers=W, threads_per_worker=1, processes=False,
   memory_limit=0)`` for W = 2, 32 and 128 (in-process workers: the scheduler's share
   of the cost is what is measured; without ``memory_limit=0`` 128 workers split the
   machine's memory and pause), with no plugin, with ``JobsPlugin(policy=p)`` for every
   policy the plugin runs (``client.register_plugin``), and with node-aware plus
   speculation, in turns, the order rotating each rep. Each run has a fresh cluster in
   a fresh interpreter (this script again, with a hidden ``--run``): on one cluster
   plain dask's own time grows rep after rep (benchmarks/NOTES.md), which turns and
   rotation only half cancel. In the child, a warm-up of
   1,000 tasks, then the heap collected and frozen (``gc.freeze``), then the timed run.
   Reported per worker count, with
   the load average: the median wall time per configuration, the throughput ratio
   ``median(plain) / median(plugin)`` and the paired ratios (plain / plugin within each
   rep: median and range); target >= 0.95. Then one more rep of ``--profile`` (default
   node-aware + speculation) under cProfile of the scheduler's thread (in-process, the
   event loop's thread runs the scheduler and the workers' comms), and the daskjobs
   entries of that profile by own time. With ``--clock``, one more run of each
   configuration with the plugin's hooks clocked (``benchmarks/_hook_clock.py``: the
   event loop thread's CPU in each hook, the clock's own cost taken out, collections
   apart): microseconds per task for a new graph, a task's end, its start, its other
   transitions, the worker plugins' reports and the periodic callbacks, beside the event
   loop's whole CPU per task and the collector's, plain dask's on the same run shape
   (``DASKJOBS_CLOCK_PARTS=1``: each part's transitions clocked too, inside the hook's).
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

import argparse
import cProfile
import gc
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _hook_clock
import dask
import harness
from distributed import Client, LocalCluster
from harness.machine import load_average

from daskjobs.plugin import JobsPlugin
from daskjobs.sim import workloads

SLOTS = (4, 8)  # workers x threads
#: The throughput with the plugin over plain dask's that the plugin aims for.
TARGET = 0.95


def inc(x: int) -> int:
    return x + 1


def nap(seconds: float) -> tuple[float, float]:
    t0 = time.time()
    time.sleep(seconds)
    return t0, time.time()


# -- 1. throughput ------------------------------------------------------------------------

#: Worker counts of the throughput runs (in-process workers, one thread each).
WORKERS = (2, 32, 128)
#: The throughput configurations: name -> the plugin's keywords (None: plain dask).
SPECULATION = {"enabled": True}


def configs() -> dict[str, dict[str, Any] | None]:
    """Plain dask, every policy the plugin runs, and node-aware with speculation."""
    from daskjobs.config import policy_names

    out: dict[str, dict[str, Any] | None] = {"plain dask": None}
    for name in policy_names():
        out[name] = {"policy": name}
    out["node-aware +speculation"] = {"policy": "node-aware", "speculation": SPECULATION}
    return out


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


#: The scheduler thread's profile while a profiled rep runs (in-process: one loop).
_PROFILE: list[cProfile.Profile] = []


def _profile(dask_scheduler: Any, on: bool) -> None:
    # run on the scheduler through cloudpickle, which copies this script's globals by
    # value: reach the script's own list through its module (in-process, the same one)
    store = sys.modules[__name__]._PROFILE
    if on:
        store[:] = [cProfile.Profile()]
        store[0].enable()
    elif store:
        store[0].disable()


def one_rep(
    client: Client,
    n: int,
    overrides: dict[str, Any] | None,
    profile: bool = False,
    clock: dict[str, Any] | None = None,
) -> float:
    """``n`` trivial tasks, mapped and gathered, with the plugin ``overrides`` make (None:
    plain dask); with ``clock`` (a dict), the plugin's hooks clocked (:mod:`_hook_clock`) and
    the event loop's CPU, into it."""
    if overrides is not None:
        client.register_plugin(JobsPlugin(**overrides))
    if clock is not None:
        client.run_on_scheduler(_hook_clock.wrap_periodic)
    try:
        if profile:
            client.run_on_scheduler(_profile, on=True)
        # the heap the earlier reps left (dask's bounded logs filling up, the futures of
        # the last rep) is collected and frozen: otherwise each full collection in this
        # rep scans all of it, and a rep's time grows with the reps before it
        gc.collect()
        gc.freeze()
        if clock is not None:
            _hook_clock.reset()
            cpu0 = client.run_on_scheduler(time.thread_time)
        t0 = time.perf_counter()
        futs = client.map(inc, range(n))
        client.gather(futs)
        seconds = time.perf_counter() - t0
        if clock is not None:
            clock["loop_cpu"] = client.run_on_scheduler(time.thread_time) - cpu0
            clock.update(_hook_clock.reading())
        if profile:
            client.run_on_scheduler(_profile, on=False)
        del futs
    finally:
        if overrides is not None:
            client.run_on_scheduler(_close_plugin)
            client.unregister_scheduler_plugin("daskjobs")
    _wait_idle(client)
    return seconds


def plugin_profile(top: int = 8) -> list[tuple[str, int, float, float]]:
    """The profiled rep's entries of daskjobs' code: (function, calls, own seconds,
    cumulative seconds), by own time."""
    if not _PROFILE:
        return []
    st = pstats.Stats(_PROFILE[0])
    rows = [
        (f"{Path(f).name}:{line}({fn})", nc, tt, ct)
        for (f, line, fn), (_, nc, tt, ct, _) in st.stats.items()  # type: ignore[attr-defined]
        if "daskjobs" in f
    ]
    return sorted(rows, key=lambda r: -r[2])[:top]


def run_one(n: int, workers: int, config: str, profile: bool, clocked: bool) -> dict[str, Any]:
    """In a child: ``n`` trivial tasks with ``config`` on a fresh cluster of ``workers``
    in-process workers (no memory limit: 128 workers would split the machine's memory
    and pause), after a warm-up of imports and connections; with ``profile``, under
    cProfile of the scheduler's thread; with ``clocked``, the plugin's hooks clocked."""
    if clocked:
        _hook_clock.install(parts_too=os.environ.get("DASKJOBS_CLOCK_PARTS", "0") != "0")
        _hook_clock.calibrate()
    clock: dict[str, Any] | None = {} if clocked else None
    with (
        LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=False,
            dashboard_address=":0",
            memory_limit=0,
        ) as cl,
        Client(cl) as client,
    ):
        client.wait_for_workers(workers)
        one_rep(client, min(n, 1000), None)
        seconds = one_rep(client, n, configs()[config], profile=profile, clock=clock)
    return {"seconds": seconds, "profile": plugin_profile() if profile else [], "clock": clock}


def child(
    n: int, workers: int, config: str, profile: bool = False, clocked: bool = False
) -> dict[str, Any]:
    """:func:`run_one` in a fresh interpreter (this script with ``--run``)."""
    cmd = [sys.executable, __file__, "--run", config, "--tasks", str(n)]
    cmd += ["--workers", str(workers), *(["--run-profile"] if profile else [])]
    cmd += ["--run-clock"] if clocked else []
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{config} on {workers} workers failed:\n{out.stderr[-3000:]}")
    got: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


def throughput(
    n: int,
    reps: int,
    workers: int,
    profile: str | None,
    only: list[str] | None = None,
    clocked: bool = False,
) -> dict[str, Any]:
    """Wall time of ``n`` trivial tasks per configuration (``only`` those, plain dask
    always), ``reps`` runs each, the configurations in turns (the order rotating every
    rep), each run a :func:`child`. With ``profile`` (a configuration's name), one more
    run of it under cProfile of the scheduler's thread. With ``clocked``, one more run of
    each configuration with its hooks clocked (:mod:`_hook_clock`; apart from the timed
    reps, which the clock's own cost would slow)."""
    cfg = {k: v for k, v in configs().items() if only is None or k in only or v is None}
    load = load_average()
    times = harness.alternate(
        {name: (lambda name=name: float(child(n, workers, name)["seconds"])) for name in cfg},
        reps,
        show=lambda name, rep, s: f"{workers} workers, rep {rep} {name}: {s:.2f} s",
    )
    clocks: dict[str, Any] = {}
    if clocked:
        for name in cfg:
            print(f"{workers} workers, clocked {name} ...", file=sys.stderr)
            clocks[name] = child(n, workers, name, clocked=True)["clock"]
    prof: list[tuple[str, int, float, float]] = []
    if profile is not None:
        prof = [tuple(r) for r in child(n, workers, profile, profile=True)["profile"]]  # type: ignore[misc]
    plain = statistics.median(times["plain dask"])
    rows = []
    for c in cfg:
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
    return {"workers": workers, "rows": rows, "load": load, "profile": prof, "clocks": clocks}


def throughput_table(runs: list[dict[str, Any]], n: int) -> str:
    body = harness.table(
        ["workers", "configuration", "median (s)", "tasks/s", "vs plain", "paired: median (range)"],
        [
            [
                str(run["workers"]),
                r["config"],
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
            for run in runs
            for r in run["rows"]
        ],
        align="llrrrr",
    )
    loads = "; ".join(f"{run['workers']} workers: {run['load']}" for run in runs)
    return body + (
        f"\n\n{n:,} trivial tasks per rep; target ratio >= {TARGET:.2f}. "
        f"Load average at the start of each worker count: {loads}."
    )


def profile_table(runs: list[dict[str, Any]], config: str) -> str:
    out = []
    for run in runs:
        if not run["profile"]:
            continue
        out.append(
            f"{run['workers']} workers, {config}:\n\n"
            + harness.table(
                ["function", "calls", "own s", "cumulative s"],
                [[f, str(nc), f"{tt:.3f}", f"{ct:.3f}"] for f, nc, tt, ct in run["profile"]],
                align="lrrr",
            )
        )
    return "\n\n".join(out)


def throughput_chart(runs: list[dict[str, Any]]) -> harness.Chart:
    names = [r["config"] for r in runs[0]["rows"]]
    return harness.Chart(
        "Scheduler throughput, trivial tasks",
        "throughput / plain dask's",
        names,
        {f"{run['workers']} workers": [r["paired"].median for r in run["rows"]] for run in runs},
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
    ap.add_argument(
        "--workers", type=int, nargs="+", default=None, help="worker counts (default 2 32 128)"
    )
    ap.add_argument(
        "--profile",
        default="node-aware +speculation",
        help="the configuration profiled once per worker count ('' for none)",
    )
    ap.add_argument("--sweep-tasks", type=int, default=None, help="tasks per chapter sweep")
    ap.add_argument("--no-sweep", action="store_true", help="throughput only")
    ap.add_argument(
        "--clock",
        action="store_true",
        help="one more run of each configuration with the plugin's hooks clocked: "
        "microseconds per task, per hook",
    )
    ap.add_argument(
        "--configs",
        default=None,
        help="comma-separated configurations to run beside plain dask (default: all)",
    )
    ap.add_argument("--run", help=argparse.SUPPRESS)
    ap.add_argument("--run-profile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--run-clock", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run:  # a child: one run, its figures as one JSON line
        got = run_one(args.tasks, args.workers[0], args.run, args.run_profile, args.run_clock)
        print(json.dumps(got))
        return 0
    n = args.tasks or (300 if args.quick else 100_000)
    reps = args.reps or (1 if args.quick else 3)
    workers = args.workers or list(WORKERS)
    profile = args.profile or None
    if profile is not None and profile not in configs():
        raise SystemExit(f"--profile: no configuration {profile!r}; one of {list(configs())}")
    only = [c.strip() for c in args.configs.split(",")] if args.configs else None
    unknown = [c for c in only or () if c not in configs()]
    if unknown:
        raise SystemExit(f"--configs: no configuration {unknown}; one of {list(configs())}")
    sweep_n = args.sweep_tasks or (400 if args.quick else 832)
    seeds = harness.seeds(args, 3)

    tp = []
    for w in workers:
        print(f"throughput: {n:,} tasks x {reps} reps on {w} workers ...", file=sys.stderr)
        tp.append(throughput(n, reps, w, profile, only, clocked=args.clock))
    report = harness.Report("Scheduler plugin", __file__, argv)
    report.section(
        "Scheduler throughput: trivial tasks, plugin vs plain dask", throughput_table(tp, n)
    )
    if args.clock:
        report.section("The plugin's cost per task, per hook", _hook_clock.hooks_table(tp, n))
    if profile is not None:
        report.section(
            "The scheduler thread's profile: the plugin's top entries", profile_table(tp, profile)
        )
    report.chart(throughput_chart(tp))
    if not args.no_sweep:
        print(f"chapter sweep: {sweep_n} tasks, seeds {seeds} ...", file=sys.stderr)
        sw = sweep(seeds, sweep_n)
        report.section(
            "The chapter sweep on 32 slots: makespan over the lower bound", sweep_table(sw, sweep_n)
        )
        report.chart(sweep_chart(sw))
    report.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
