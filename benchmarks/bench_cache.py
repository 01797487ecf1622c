"""Benchmark: shared feature stages as content-keyed graph nodes, and the result store.

The SPEC's task-graph case ("a hundred feature stages of 20 minutes, each read by a hundred
backtests") scaled to a laptop: F feature stages, each read by R backtests, with sleeps standing
in for work (feature 40 ms, backtest 30 ms by default: the SPEC's 20 : 15 minutes), on a
LocalCluster whose threads play the cores. Three runs, side by side:

(a) features recomputed inside every backtest (no shared stage: what a flat ``client.map``
    over the grid does);
(b) the sweep as a graph: each feature stage once, read by its R backtests; results committed
    to a fresh store;
(c) the next sweep (new backtest parameters) with the store warm: every feature stage loaded.

For each: wall time, and task-seconds (the sum of task compute times from dask's task stream).

Then the per-stage overhead of daskjobs' bookkeeping, against ``dask.base.tokenize`` of the same
parameters: computing a node's content key while the sweep is built, a store hit (``get`` of a
small result and of a 1 MB array), ``contains`` and ``put``.

    python benchmarks/bench_cache.py                # 100 x 100, about two minutes on 2 cores
    python benchmarks/bench_cache.py --quick        # 10 x 10
    python benchmarks/bench_cache.py --json

Prints markdown with the command and the machine (``--markdown``/``--plot`` write it and a
PNG). A script, not a test: nothing here asserts.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import harness
import numpy as np

FEATURE_SECONDS = 0.04
BACKTEST_SECONDS = 0.03


def feature(slice: int, seconds: float) -> dict[str, float]:
    time.sleep(seconds)
    return {"slice": float(slice), "level": 100.0 + slice}


def backtest(feature: dict[str, float], param: int, variant: int, seconds: float) -> float:
    time.sleep(seconds)
    return feature["level"] * 0.001 + param * 1e-4 + variant


def feature_and_backtest(
    slice: int, param: int, variant: int, feature_seconds: float, seconds: float
) -> float:
    """(a): the feature computed again inside every backtest."""
    return backtest(feature(slice, feature_seconds), param, variant, seconds)


def build_graph(features: int, readers: int, variant: int, fs: float, bs: float) -> Any:
    from daskjobs import Sweep, grid

    sweep = Sweep("bench")
    feats = sweep.stage(
        feature, over=grid(slice=range(features)), params={"seconds": fs}, estimate=fs
    )
    sweep.stage(
        backtest,
        inputs={"feature": feats},
        over=grid(param=range(readers)),
        params={"variant": variant, "seconds": bs},
        estimate=bs,
    )
    return sweep


def build_flat(features: int, readers: int, fs: float, bs: float) -> Any:
    from daskjobs import Sweep, grid

    sweep = Sweep("bench-flat")
    sweep.stage(
        feature_and_backtest,
        over=grid(slice=range(features), param=range(readers)),
        params={"variant": 0, "feature_seconds": fs, "seconds": bs},
        estimate=fs + bs,
        cache=False,
    )
    return sweep


def timed_run(client: Any, sweep: Any, store: Any) -> dict[str, float]:
    from distributed import get_task_stream

    _wait_idle(client)
    with get_task_stream(client) as ts:
        result = sweep.run(client, store=store, progress=False)
    assert result.ok, result.summary()
    task_seconds = sum(
        ss["stop"] - ss["start"]
        for t in ts.data
        for ss in t["startstops"]
        if ss["action"] == "compute"
    )
    return {
        "wall_seconds": round(result.seconds, 2),
        "task_seconds": round(task_seconds, 1),
        "computed": result.computed,
        "hits": result.hits,
    }


def _wait_idle(client: Any) -> None:
    while client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)):
        time.sleep(0.05)


def per_call(fn: Callable[[], object], repeat: int) -> float:
    """Median of 5 batches, in microseconds per call."""
    batches = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        batches.append((time.perf_counter() - start) / repeat * 1e6)
    return round(statistics.median(batches), 1)


def overheads(directory: str) -> dict[str, float]:
    from dask.base import tokenize

    from daskjobs import ResultStore, Sweep, grid

    params = {"slice": 7, "fast": 20, "slow": 100, "cost_bps": 5.0, "universe": "SPX"}
    n = 2000

    def build() -> None:
        sweep = Sweep()
        sweep.stage(
            backtest,
            over=grid(param=range(n)),
            params={"feature": None, "variant": 1, "seconds": 0.0},
        )

    start = time.perf_counter()
    for _ in range(3):
        build()
    key_us = (time.perf_counter() - start) / (3 * n) * 1e6

    store = ResultStore(os.path.join(directory, "overhead-store"))
    small = {"sharpe": 1.23, "annual_return": 0.08, "max_drawdown": 0.12}
    big = np.random.default_rng(0).normal(size=131_072)  # 1 MB
    store.put("small-1", small)
    store.put("big-1", big)
    counter = iter(range(10**9))
    return {
        "tokenize_params_us": per_call(lambda: tokenize(params, ensure_deterministic=True), 2000),
        "content_key_per_node_us": round(key_us, 1),
        "store_contains_us": per_call(lambda: store.contains("small-1"), 500),
        "store_hit_small_us": per_call(lambda: store.get("small-1"), 300),
        "store_hit_1MB_us": per_call(lambda: store.get("big-1"), 100),
        "store_put_small_us": per_call(lambda: store.put(f"p-{next(counter)}", small), 100),
    }


RUNS = (
    ("a_recompute_in_every_backtest", "(a) features inside every backtest", "a"),
    ("b_graph", "(b) graph, shared features", "b"),
    ("c_graph_store_warm", "(c) graph, store warm", "c"),
)


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--features", type=int, default=None, help="feature stages (100; quick 10)")
    ap.add_argument(
        "--readers", type=int, default=None, help="backtests per feature (100; quick 10)"
    )
    ap.add_argument("--feature-seconds", type=float, default=FEATURE_SECONDS)
    ap.add_argument("--backtest-seconds", type=float, default=BACKTEST_SECONDS)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=8, help="threads per worker ('cores')")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = ap.parse_args(argv)

    from distributed import Client, LocalCluster

    from daskjobs import ResultStore

    f = args.features or (10 if args.quick else 100)
    r = args.readers or (10 if args.quick else 100)
    fs, bs = args.feature_seconds, args.backtest_seconds
    cores = args.workers * args.threads
    out: dict[str, Any] = {
        "cluster": f"LocalCluster {args.workers} workers x {args.threads} threads",
        "features": f,
        "backtests": f * r,
        "feature_seconds": fs,
        "backtest_seconds": bs,
        "ideal_seconds": {
            "a": round(f * r * (fs + bs) / cores, 2),
            "b": round((f * fs + f * r * bs) / cores, 2),
            "c": round(f * r * bs / cores, 2),
        },
    }
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(
            n_workers=args.workers, threads_per_worker=args.threads, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        store = ResultStore(os.path.join(tmp, "store"))
        out["a_recompute_in_every_backtest"] = timed_run(
            client, build_flat(f, r, fs, bs), store=False
        )
        out["b_graph"] = timed_run(client, build_graph(f, r, 0, fs, bs), store)
        out["c_graph_store_warm"] = timed_run(client, build_graph(f, r, 1, fs, bs), store)
        out["overhead"] = overheads(tmp)

    if args.json:
        print(json.dumps(out))
        return 0
    report = harness.Report("Shared feature stages and the result store", __file__, argv)
    report.note(f"cluster: {out['cluster']}")
    rows = []
    for name, label, ideal in RUNS:
        row = out[name]
        rows.append(
            [
                label,
                f"{row['wall_seconds']:.2f}",
                f"{out['ideal_seconds'][ideal]:.2f}",
                f"{row['task_seconds']:.1f}",
                row["computed"],
                row["hits"],
            ]
        )
    a, b, c = (out[name]["wall_seconds"] for name, _, _ in RUNS)
    report.section(
        f"{f} feature stages ({fs * 1e3:.0f} ms) each read by {r} backtests ({bs * 1e3:.0f} ms)",
        harness.table(["run", "wall s", "ideal s", "task-s", "computed", "hits"], rows)
        + f"\n\nWall time: (b)/(a) = {b / a:.2f}, (c)/(a) = {c / a:.2f}, (c)/(b) = {c / b:.2f}.",
    )
    report.section(
        "Per-stage overhead",
        harness.table(
            ["operation", "microseconds per call"],
            [[k.removesuffix("_us"), f"{v:.1f}"] for k, v in out["overhead"].items()],
        ),
    )
    report.chart(
        harness.Chart(
            "Wall time of the three runs",
            "seconds",
            [label for _, label, _ in RUNS],
            {
                "measured": [out[name]["wall_seconds"] for name, _, _ in RUNS],
                "ideal": [out["ideal_seconds"][k] for _, _, k in RUNS],
            },
        )
    )
    report.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
