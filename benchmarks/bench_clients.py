"""dask code as people already write it, with and without the plugin: no daskjobs API in the
workload, no annotation.

Usage::

    python benchmarks/bench_clients.py --quick            # one seed, small sizes
    python benchmarks/bench_clients.py                    # the sizes docs/benchmarks.md reports
    python benchmarks/bench_clients.py --part grids --seeds 5
    python benchmarks/bench_clients.py --part collections --reps 5

``grids`` (:mod:`clients.grids`): a grid sweep of real CPU work (numpy, not sleep) whose cost
follows one argument, submitted small to large as a grid lists its largest settings last: most
tasks short, a few (the "long share") forty times longer, each task's cost jittered by the seed.
Three ways of writing it, none with an annotation: ``client.map(simulate, steps)``; a loop of
``client.submit(simulate, n)`` (one graph per task); one ``dask.delayed`` graph whose tasks all
read one shared stage. On 2 worker processes of one thread, every configuration on a fresh
cluster, side by side: plain dask; the plugin's first run (``daskjobs.local_cluster()``, an empty
history file); its second run (a **new** ``local_cluster()`` reading the history the first
saved); and the prior's wrong guess (the same tasks called with ``10000000 / steps`` and listed
small to large: its large arguments are its cheap tasks, so dask's order is longest first and
the prior's guess cheapest first) beside plain dask on it. Reported: makespan (first
task start to last task end, measured in the tasks) over the bound ``max(work / slots,
longest)`` of that run's own measured durations; median and range over seeds and shapes.

``collections`` (:mod:`clients.collections_`): a ``dask.array`` and a ``dask.dataframe``
reduction, plain dask and the plugin alternated rep by rep on fresh clusters (2 worker
processes x 2 threads): the plugin's time over plain dask's, and its workers' peak memory over
plain dask's, paired by rep.

``search`` (:mod:`clients.search`): scikit-learn's ``GridSearchCV`` (an SVC over a grid of
``C`` and ``gamma``) through joblib's dask backend, alternated the same way: plain dask's time
over the plugin's (a throughput ratio) and whether the results are identical.

Nothing here asserts.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile

import harness
from clients import collections_, grids, search

PARTS = ("grids", "collections", "search")


def _grids(args, report: harness.Report) -> None:
    seeds = harness.seeds(args, 3)
    forms = args.client or list(grids.CLIENTS)
    shapes = [(60, 0.05)] if args.quick else [(60, 0.05), (100, 0.08), (140, 0.03)]
    unit = 15 if args.quick else 25
    results: dict[tuple[str, str], list[float]] = {}
    for form in forms:
        for seed in seeds:
            for n, share in shapes:
                steps = grids.grid(seed, n, share, unit)
                with tempfile.TemporaryDirectory() as tmp:
                    history = os.path.join(tmp, "history.json")
                    for config in grids.CONFIGS:
                        r = grids.one(form, steps, config, history, reverse=False)
                        results.setdefault((form, config), []).append(r)
                        print(f"{form} seed {seed} n {n}: {config} {r:.3f}", file=sys.stderr)
                if form == "delayed":
                    continue
                with tempfile.TemporaryDirectory() as tmp:
                    history = os.path.join(tmp, "history.json")
                    for config in ("plain dask", "plugin, first run"):
                        r = grids.one(form, steps, config, history, reverse=True)
                        name = f"{config}, wrong guess"
                        results.setdefault((form, name), []).append(r)
                        print(f"{form} seed {seed} n {n}: {name} {r:.3f}", file=sys.stderr)
    rows = []
    for (form, config), xs in results.items():
        s = harness.spread(xs)
        rows.append([form, config, f"{s.median:.3f}", f"{s.lo:.3f}-{s.hi:.3f}", s.n])
    configs = list(dict.fromkeys(config for _, config in results))
    report.chart(
        harness.Chart(
            "A grid written the usual way",
            "makespan / bound (median)",
            forms,
            {
                c: [
                    harness.spread(results[(f, c)]).median if (f, c) in results else 0.0
                    for f in forms
                ]
                for c in configs
            },
            reference=1.0,
        )
    )
    report.section(
        "A grid written the usual way: makespan over the bound max(work / slots, longest)",
        harness.table(["client", "configuration", "median", "range", "runs"], rows, "llrrr")
        + f"\n\n{grids.WORKERS} worker processes x {grids.THREADS} thread; shapes (tasks, long "
        f"share): {', '.join(f'({n}, {s})' for n, s in shapes)}; seeds {seeds}. The long tasks "
        f"are {grids.LONG:g}x the rest and submitted last; 'wrong guess': the same tasks called "
        "with 10000000 / steps, listed small to large (large arguments are cheap: dask's order is "
        "longest first there).",
    )


def _collections(args, report: harness.Report) -> None:
    reps = args.reps or (2 if args.quick else 5)
    rows = []
    for workload in collections_.WORKLOADS:
        got = harness.alternate(
            {
                "plain": lambda w=workload: collections_.run(w, False, args.quick),
                "plugin": lambda w=workload: collections_.run(w, True, args.quick),
            },
            reps,
            show=lambda name, rep, r, w=workload: (
                f"{w} {name} rep {rep}: {r[0]:.2f} s, peak {r[1] / 2**20:.0f} MiB"
            ),
        )
        plain, plugin = got["plain"], got["plugin"]
        time_ratio = harness.spread(
            harness.paired_ratios([p[0] for p in plain], [q[0] for q in plugin])
        )
        mem_ratio = harness.spread(
            harness.paired_ratios([q[1] for q in plugin], [p[1] for p in plain])
        )
        same = all(str(p[2]) == str(q[2]) for p, q in zip(plain, plugin, strict=True))
        rows.append(
            [
                workload,
                f"{statistics.median(p[0] for p in plain):.2f}",
                f"{time_ratio.median:.3f} ({time_ratio.lo:.3f}-{time_ratio.hi:.3f})",
                f"{mem_ratio.median:.3f} ({mem_ratio.lo:.3f}-{mem_ratio.hi:.3f})",
                "yes" if same else "NO",
            ]
        )
    report.chart(
        harness.Chart(
            "dask collections",
            "plugin / plain dask (median)",
            list(collections_.WORKLOADS),
            {
                "throughput": [float(r[2].split()[0]) for r in rows],
                "peak memory": [float(r[3].split()[0]) for r in rows],
            },
            reference=1.0,
        )
    )
    report.section(
        "dask collections: throughput and the workers' peak memory",
        harness.table(
            [
                "workload",
                "plain dask (s)",
                "throughput, plugin / plain",
                "peak memory, plugin / plain",
                "same result",
            ],
            rows,
            "lrrrl",
        )
        + f"\n\n{collections_.WORKERS} worker processes x {collections_.THREADS} threads, fresh "
        f"clusters, {reps} reps alternated; throughput = plain time / plugin time, paired by rep.",
    )


def _search(args, report: harness.Report) -> None:
    reps = args.reps or (2 if args.quick else 5)
    rows = []
    for pre in ("2*n_jobs", "all"):
        got = harness.alternate(
            {
                "plain": lambda p=pre: search.run(False, args.quick, p),
                "plugin": lambda p=pre: search.run(True, args.quick, p),
            },
            reps,
            show=lambda name, rep, r, p=pre: (
                f"GridSearchCV pre_dispatch={p} {name} rep {rep}: {r[0]:.2f} s"
            ),
        )
        plain, plugin = got["plain"], got["plugin"]
        ratio = harness.spread(harness.paired_ratios([p[0] for p in plain], [q[0] for q in plugin]))
        same = all(p[1] == q[1] for p, q in zip(plain, plugin, strict=True))
        rows.append(
            [
                f"pre_dispatch={pre}",
                f"{statistics.median(p[0] for p in plain):.2f}",
                f"{ratio.median:.3f} ({ratio.lo:.3f}-{ratio.hi:.3f})",
                "yes" if same else "NO",
            ]
        )
    report.section(
        "GridSearchCV through joblib's dask backend",
        harness.table(
            ["search", "plain dask (s)", "throughput, plugin / plain", "identical results"],
            rows,
            "lrrl",
        )
        + f"\n\n{search.WORKERS} worker processes x {search.THREADS} thread, fresh clusters, "
        f"{reps} reps alternated.",
    )


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, seeds=3)
    ap.add_argument("--part", action="append", choices=PARTS, help="only this part (repeatable)")
    ap.add_argument(
        "--client", action="append", choices=grids.CLIENTS, help="grids: only this form"
    )
    ap.add_argument("--reps", type=int, default=0, help="collections and search: reps")
    args = ap.parse_args(argv)
    report = harness.Report("dask code as people write it", __file__, argv)
    parts = args.part or list(PARTS)
    if "grids" in parts:
        _grids(args, report)
    if "collections" in parts:
        _collections(args, report)
    if "search" in parts:
        _search(args, report)
    report.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
