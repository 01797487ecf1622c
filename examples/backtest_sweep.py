"""A backtest sweep with a shared feature stage, run twice against the result store.

Each data slice is a synthetic series of 5-minute bars (a geometric random walk whose drift
and volatility change by regime). One *feature* stage per slice computes what every backtest of
that slice reads: moving averages for each window in the grid, a rolling volatility, and a
two-session rolling median and quantile band of the price (the expensive part). Then a
moving-average crossover backtest runs for every (fast, slow, cost) point of the grid,
volatility-targeted, with transaction costs, and reports its annualised Sharpe ratio.

The stage functions live in :mod:`daskjobs.examples`, so a notebook can import them
(``from daskjobs.examples import build_sweep``) and gets the same content keys as this script.

The sweep is a Dask graph whose keys are content keys, so the feature stage of a slice is one
task however many backtests read it, and results are committed to the store as they finish::

    python examples/backtest_sweep.py                      # computes every stage
    python examples/backtest_sweep.py --cost-bps 0,5,10    # only the new cost level runs;
                                                           # every feature stage is loaded
    python examples/backtest_sweep.py --cost-bps 0,5,10    # nothing runs: all loaded

``--store URL`` picks the store (default: ``./.daskjobs-cache``, or ``$DASKJOBS_STORE``);
``--json`` prints one JSON object instead of the table. The LocalCluster's scheduler runs the
daskjobs plugin (``--policy``, default ``critical-path``: the stages with the longest estimated
path to the end of the sweep start first; ``--policy none`` runs plain dask).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from daskjobs.examples import build_sweep


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default=None, help="store URL (default: the local store)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--slices", type=int, default=16, help="data slices (default 16)")
    parser.add_argument("--bars", type=int, default=60_000, help="bars per slice (default 60000)")
    parser.add_argument("--fast", type=_ints, default=[5, 10, 20, 30], help="fast windows")
    parser.add_argument("--slow", type=_ints, default=[50, 100, 150, 200], help="slow windows")
    parser.add_argument("--cost-bps", type=_floats, default=[0.0, 5.0], help="costs, bp")
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument(
        "--policy",
        default="critical-path",
        choices=["critical-path", "lpt", "fifo", "fair-share", "none"],
        help="the scheduler plugin's policy, or none for plain dask",
    )
    args = parser.parse_args(argv)

    from distributed import Client, LocalCluster

    from daskjobs import JobsPlugin, ResultStore, local_cluster
    from daskjobs.sweep import quiet_workers

    store = ResultStore(args.store)
    sweep = build_sweep(args.slices, args.bars, args.fast, args.slow, args.cost_bps)
    start = time.perf_counter()
    cluster_kwargs = {"n_workers": args.workers, "threads_per_worker": 1, "dashboard_address": ":0"}
    if args.policy == "none":
        cluster_cm = LocalCluster(**cluster_kwargs)
    else:
        cluster_cm = local_cluster(JobsPlugin(policy=args.policy), **cluster_kwargs)
    with cluster_cm as cluster, Client(cluster) as client:
        try:
            result = sweep.run(client, store=store, progress=not args.json)
        finally:
            # workers closing while a heartbeat awaits the scheduler log a 25-line traceback
            # (a distributed race; see daskjobs.sweep.quiet_workers): stop their heartbeats
            quiet_workers(client)
    total = time.perf_counter() - start

    table = result.table()
    ok = [i for i, e in enumerate(table["error"]) if e is None]
    # the mean Sharpe ratio over the slices of each (fast, slow, cost) point: what the table
    # shows, and what "best" picks from
    by_point: dict[tuple[int, int, float], list[float]] = {}
    for i in ok:
        point = (table["fast"][i], table["slow"][i], table["cost_bps"][i])
        by_point.setdefault(point, []).append(table["sharpe"][i])
    means = {point: float(np.mean(values)) for point, values in by_point.items()}
    best = max(means, key=lambda point: (means[point], point)) if means else None
    feats = result.by_stage.get("rolling_features", {"computed": 0, "hits": 0})
    summary = {
        "computed": result.computed,
        "hits": result.hits,
        "seconds": round(result.seconds, 3),
        "seconds_with_cluster_start": round(total, 3),
        "backtests": len(result.records),
        "features": args.slices,
        "feature_hits": feats["hits"],
        "feature_computed": feats["computed"],
        "skipped_upstream": result.pruned,
        "failed": len(result.failures),
        "store": store.url,
        "policy": args.policy,
        "best": None
        if best is None
        else {
            "fast": best[0],
            "slow": best[1],
            "cost_bps": best[2],
            "mean_sharpe": round(means[best], 4),
            "slices": len(by_point[best]),
        },
    }
    if args.json:
        print(json.dumps(summary))
        return 0 if result.ok else 1

    from daskjobs._text import table as text_table

    print(f"\nSharpe ratio by (fast, slow) window, mean over {args.slices} slices, per cost:")
    for cost in args.cost_bps:
        rows = []
        for f in args.fast:
            cells = [f"fast={f}"]
            for s in args.slow:
                mean = means.get((f, s, cost))
                cells.append("-" if mean is None else f"{mean:+.3f}")
            rows.append(cells)
        headers = [f"cost {cost:g} bp", *(f"slow={s}" for s in args.slow)]
        print("\n" + text_table(headers, rows))
    if best is not None:
        fast, slow, cost = best
        spread = by_point[best]
        print(
            f"\nbest: fast={fast}, slow={slow} at cost {cost:g} bp, mean Sharpe "
            f"{means[best]:+.3f} over {len(spread)} slices "
            f"(from {min(spread):+.3f} to {max(spread):+.3f})"
        )
    for failure in result.failures:
        print(f"FAILED {failure}", file=sys.stderr)
    print(
        f"\ncomputed {result.computed} stages, loaded {result.hits} from the store "
        f"({feats['hits']}/{args.slices} feature stages loaded, {feats['computed']} computed; "
        f"{result.pruned} upstream stages skipped); "
        f"wall time {result.seconds:.2f} s ({total:.2f} s with cluster start)"
    )
    print(f"store: {store.url}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
