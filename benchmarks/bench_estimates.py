"""Estimates nobody writes: sweeps without estimate annotations, on a live cluster.

Usage::

    python benchmarks/bench_estimates.py            # full sizes (several minutes)
    python benchmarks/bench_estimates.py --quick    # small sizes, one seed
    python benchmarks/bench_estimates.py --quick --seeds 3 --workload two-stage

Three workloads whose durations follow their parameters (:mod:`daskjobs.sim.workloads`):
``lookback_grid`` (duration proportional to the lookback, growing with the universe: a
heavy tail, the largest lookbacks listed last), ``chapter_params`` (the chapter sweep's
shape: log-normal durations explained by a ``size`` parameter, the few 30x tasks last)
and ``two_stage`` (feature stages read by backtests). Each task sleeps its true duration
(scaled to a fraction of a second) and carries its parameters as a ``params`` annotation
and its stage as a ``stage`` annotation, never an ``estimate``. Keys are named so that
plain dask's own order is the workload's submission order.

Side by side in one run, each on a fresh ``LocalCluster`` with worker processes
(2 workers x 4 threads):

* plain dask;
* the plugin (``critical-path``) with learning off: stage medians (``estimates.learn:
  false``), nothing measured before the sweep;
* the plugin learning online: a fresh history, the first sweep;
* the plugin with history: the same sweep again, on a new scheduler that reads the
  history the first sweep saved;
* the plugin with the true durations as ``estimate`` annotations.

Reported per workload: makespan (first start to last end, measured in the tasks), the
share of the gain over plain dask each configuration gets relative to the true
annotations (``(plain - x) / (plain - true)``; 1.0 is as good as knowing every
duration), and the share of the scheduler's estimates within 2x of the measured duration
(3Sigma's measure: the estimate a task had when it was dispatched, read from the plugin's
task views after the run). This is a script, not a test: nothing here asserts.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from typing import Any

import dask
import harness
from distributed import Client, LocalCluster

from daskjobs.plugin import JobsPlugin
from daskjobs.policies.durations import within_factor
from daskjobs.sim import workloads

WORKERS, THREADS = 2, 4
CONFIGS = ("plain dask", "medians", "online", "history", "true estimates")
POLICY = "critical-path"
WORKLOADS = ("lookback-grid", "chapter-params", "two-stage")


def nap(seconds: float, *deps: Any) -> tuple[float, float]:
    t0 = time.time()
    time.sleep(seconds)
    return t0, time.time()


def build(quick: bool, seed: int) -> list[workloads.Workload]:
    """The three workloads, their durations in seconds of a laptop (median tens of ms)."""
    if quick:
        return [
            workloads.lookback_grid(seed, repeats=3, median=0.03),
            workloads.chapter_params(seed, n=240, n_long=3, median=0.04),
            workloads.two_stage(
                seed, slices=6, lookbacks=(10, 40, 160, 320), repeats=2, median=0.02
            ),
        ]
    return [
        workloads.lookback_grid(seed, repeats=8, median=0.05),
        workloads.chapter_params(seed, n=800, n_long=6, median=0.05),
        workloads.two_stage(seed, slices=12, repeats=4, median=0.03),
    ]


def graph(w: workloads.Workload, annotate: bool) -> tuple[list[Any], dict[str, float]]:
    """The workload as delayed tasks (dependencies included); ``annotate``: the true
    durations as ``estimate`` annotations. Keys: ``t-<n>`` numbered so that dask.order's
    descending key order among independent tasks is the submission order."""
    last = len(w.tasks) - 1
    keys = {t.tid: f"t-{last - i:06d}" for i, t in enumerate(w.tasks)}
    made: dict[str, Any] = {}
    durations: dict[str, float] = {}
    for t in w.tasks:
        ann: dict[str, Any] = {"stage": t.stage or "task", "params": dict(t.params or {})}
        if annotate:
            ann["estimate"] = float(t.duration)
        deps = [made[d] for d in t.deps]
        with dask.annotate(**ann):
            made[t.tid] = dask.delayed(nap)(float(t.duration), *deps, dask_key_name=keys[t.tid])
        durations[keys[t.tid]] = float(t.duration)
    return list(made.values()), durations


def _estimates(dask_scheduler: Any) -> dict[str, tuple[float, str]]:
    p = dask_scheduler.plugins.get("daskjobs")
    if p is None:
        return {}
    return {str(k): (v.estimate, v.source) for k, v in p.tasks.items()}


def run(w: workloads.Workload, config: str, history: str) -> dict[str, Any]:
    plugin: JobsPlugin | None = None
    memory = {"path": None}  # nothing measured before (not the user's cache: history.path auto)
    if config == "medians":
        plugin = JobsPlugin(policy=POLICY, estimates={"learn": False}, history=memory)
    elif config in ("online", "history"):
        plugin = JobsPlugin(policy=POLICY, history={"path": history})
    elif config == "true estimates":
        plugin = JobsPlugin(policy=POLICY, history=memory)
    parts, durations = graph(w, annotate=config == "true estimates")
    with (
        LocalCluster(
            n_workers=WORKERS,
            threads_per_worker=THREADS,
            processes=True,
            dashboard_address=":0",
            scheduler_kwargs={"plugins": [plugin] if plugin else []},
        ) as cl,
        Client(cl) as client,
    ):
        client.wait_for_workers(WORKERS)
        futs = client.compute(parts)
        spans = client.gather(futs)
        est = client.run_on_scheduler(_estimates)  # before the tasks are released
        del futs
    makespan = max(e for _, e in spans) - min(s for s, _ in spans)
    keys = [k for k in durations if k in est]
    within = (
        within_factor([est[k][0] for k in keys], [durations[k] for k in keys])
        if keys
        else float("nan")
    )
    sources: dict[str, int] = {}
    for k in keys:
        sources[est[k][1]] = sources.get(est[k][1], 0) + 1
    return {"makespan": makespan, "within": within, "sources": sources}


def one_workload(w: workloads.Workload) -> dict[str, dict[str, Any]]:
    """Every configuration on ``w``, in the order of :data:`CONFIGS` (history needs the
    online run's file first)."""
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        history = os.path.join(tmp, "history.json")
        for config in CONFIGS:
            out[config] = run(w, config, history)
            r = out[config]
            print(
                f"  {w.name}: {config}: makespan {r['makespan']:.2f} s, "
                f"within 2x {r['within']:.0%}",
                file=sys.stderr,
            )
    return out


def gain_share(plain: float, x: float, true: float) -> float:
    """The share of the true annotations' gain over plain dask that ``x`` gets."""
    gain = plain - true
    return (plain - x) / gain if gain > 0 else float("nan")


def _spread(values: list[float], fmt: str) -> str:
    """The median, and the least and greatest value when there are several."""
    ok = [v for v in values if v == v]  # (nan: no gain to share)
    if not ok:
        return "nan"
    med = fmt.format(statistics.median(ok))
    if len(values) == 1:
        return med
    lost = f", {len(values) - len(ok)} nan" if len(ok) < len(values) else ""
    return f"{med} ({fmt.format(min(ok))} to {fmt.format(max(ok))}{lost})"


def tables(results: dict[str, list[dict[str, dict[str, Any]]]], slots: int) -> str:
    header = ["workload", "configuration", "makespan (s)", "share of the gain", "within 2x"]
    rows = []
    for name, runs in results.items():
        for config in CONFIGS:
            ms = [r[config]["makespan"] for r in runs]
            shares = [
                gain_share(
                    r["plain dask"]["makespan"],
                    r[config]["makespan"],
                    r["true estimates"]["makespan"],
                )
                for r in runs
            ]
            within = [r[config]["within"] for r in runs]
            rows.append(
                [
                    name,
                    config,
                    f"{statistics.median(ms):.2f}",
                    "-" if config == "plain dask" else _spread(shares, "{:.2f}"),
                    "-" if config == "plain dask" else _spread(within, "{:.0%}"),
                ]
            )
    n = len(next(iter(results.values())))
    return harness.table(header, rows) + (
        f"\n\n{slots} slots ({WORKERS} worker processes x {THREADS} threads), policy {POLICY}; "
        f"median over {n} seed(s) (least to greatest). "
        "Share of the gain: (plain - x) / (plain - true estimates). "
        "Within 2x: the share of tasks whose estimate at dispatch was within 2x of its "
        "duration."
    )


def _median_share(runs: list[dict[str, dict[str, Any]]], config: str) -> float:
    shares = [
        gain_share(
            r["plain dask"]["makespan"], r[config]["makespan"], r["true estimates"]["makespan"]
        )
        for r in runs
    ]
    ok = [v for v in shares if v == v]
    return statistics.median(ok) if ok else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, seeds=3)
    ap.add_argument(
        "--workload",
        action="append",
        choices=WORKLOADS,
        help="only this workload (repeatable; default: all three)",
    )
    args = ap.parse_args(argv)
    seeds = harness.seeds(args, 3)
    only = set(args.workload or WORKLOADS)
    results: dict[str, list[dict[str, dict[str, Any]]]] = {}
    for seed in seeds:
        for w in build(args.quick, seed):
            if w.name not in only:
                continue
            print(
                f"{w.name}, seed {seed}: {len(w.tasks)} tasks, {w.work:.1f} s of work",
                file=sys.stderr,
            )
            r = one_workload(w)
            results.setdefault(w.name, []).append(r)
            plain, true = r["plain dask"]["makespan"], r["true estimates"]["makespan"]
            print(
                f"  {w.name}, seed {seed}: share of the gain "
                + ", ".join(
                    f"{c} {gain_share(plain, r[c]['makespan'], true):.2f}" for c in CONFIGS[1:4]
                ),
                file=sys.stderr,
            )
    report = harness.Report("Estimates nobody writes", __file__, argv)
    report.section(
        "Sweeps without estimate annotations: makespan and the share of the gain",
        tables(results, WORKERS * THREADS),
    )
    report.chart(
        harness.Chart(
            "Share of the true annotations' gain over plain dask",
            "share of the gain",
            list(results),
            {
                config: [_median_share(runs, config) for runs in results.values()]
                for config in CONFIGS[1:4]
            },
            reference=1.0,
        )
    )
    report.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
