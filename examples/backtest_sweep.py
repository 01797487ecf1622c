"""A backtest sweep with a shared feature stage, run twice against the result store.

Each data slice is a synthetic series of 5-minute bars (a geometric random walk whose drift
and volatility change by regime). One *feature* stage per slice computes what every backtest of
that slice reads: moving averages for each window in the grid, a rolling volatility, and a
two-session rolling median and quantile band of the price (the expensive part). Then a
moving-average crossover backtest runs for every (fast, slow, cost) point of the grid,
volatility-targeted, with transaction costs, and reports its annualised Sharpe ratio.

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

BARS_PER_DAY = 78  # 5-minute bars in a 6.5-hour session
BARS_PER_YEAR = 252 * BARS_PER_DAY
TREND_WINDOW = 2 * BARS_PER_DAY  # two sessions


def synthetic_prices(slice: int, bars: int) -> np.ndarray:
    """5-minute closes of one synthetic instrument: drift and volatility change by regime."""
    rng = np.random.default_rng([2024, slice])
    regime = 20 * BARS_PER_DAY
    drift = np.repeat(rng.normal(0.0, 1.5e-5, size=bars // regime + 1), regime)[:bars]
    vol = np.repeat(rng.uniform(6e-4, 2.5e-3, size=bars // BARS_PER_DAY + 1), BARS_PER_DAY)
    returns = drift + vol[:bars] * rng.standard_t(df=4, size=bars) / np.sqrt(2)
    return 100.0 * np.exp(np.cumsum(returns))


def _rolling_mean(x: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean; NaN until a full window is available."""
    c = np.cumsum(np.insert(x, 0, 0.0))
    out = np.full(x.shape, np.nan)
    out[window - 1 :] = (c[window:] - c[:-window]) / window
    return out


def rolling_features(prices: np.ndarray, windows: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Everything the backtests of one slice share (computed once per slice)."""
    logret = np.diff(np.log(prices), prepend=np.log(prices[0]))
    features: dict[str, np.ndarray] = {f"ma{w}": _rolling_mean(prices, w) for w in windows}
    var = _rolling_mean(logret**2, TREND_WINDOW) - _rolling_mean(logret, TREND_WINDOW) ** 2
    features["vol"] = np.sqrt(np.maximum(var, 0.0) * BARS_PER_YEAR)
    view = np.lib.stride_tricks.sliding_window_view(prices, TREND_WINDOW)
    band = np.quantile(view, [0.2, 0.5, 0.8], axis=1)
    for name, row in zip(("band_lo", "trend", "band_hi"), band, strict=True):
        series = np.full(prices.shape, np.nan)
        series[TREND_WINDOW - 1 :] = row
        features[name] = series
    features["logret"] = logret
    return {name: series.astype(np.float32) for name, series in features.items()}


def crossover_backtest(
    features: dict[str, np.ndarray], fast: int, slow: int, cost_bps: float
) -> dict[str, float]:
    """Long when the fast average is above the slow one and the price is above its one-day
    two-session median, short when both are below, flat inside the 20-80% band; sized to 10% annual
    volatility; costs in basis points on every change of position."""
    ma_fast, ma_slow = features[f"ma{fast}"], features[f"ma{slow}"]
    above_trend = np.sign(features["ma5"] - features["trend"])
    raw = np.where(np.sign(ma_fast - ma_slow) == above_trend, above_trend, 0.0)
    inside = (features["ma5"] > features["band_lo"]) & (features["ma5"] < features["band_hi"])
    raw = np.where(inside, 0.0, raw)
    size = np.clip(0.10 / np.maximum(features["vol"], 1e-3), 0.0, 3.0)
    position = np.nan_to_num(raw * size)
    position = np.concatenate([[0.0], position[:-1]])  # trade on the next day's return
    costs = np.abs(np.diff(position, prepend=0.0)) * cost_bps / 1e4
    pnl = position * features["logret"].astype(np.float64) - costs
    equity = np.cumsum(pnl)
    drawdown = float(np.max(np.maximum.accumulate(equity) - equity))
    std = pnl.std()
    sharpe = float(pnl.mean() / std * np.sqrt(BARS_PER_YEAR)) if std > 0 else 0.0
    return {
        "sharpe": round(sharpe, 4),
        "annual_return": round(float(pnl.mean() * BARS_PER_YEAR), 4),
        "max_drawdown": round(drawdown, 4),
    }


def build_sweep(slices: int, bars: int, fast: list[int], slow: list[int], costs: list[float]):
    from daskjobs import Sweep, grid

    windows = tuple(sorted({5, *fast, *slow}))
    sweep = Sweep("ma-crossover")
    prices = sweep.stage(
        synthetic_prices, over=grid(slice=range(slices)), params={"bars": bars}, estimate=0.05
    )
    features = sweep.stage(
        rolling_features, inputs={"prices": prices}, params={"windows": windows}, estimate=0.5
    )
    sweep.stage(
        crossover_backtest,
        inputs={"features": features},
        over=grid(fast=fast, slow=slow, cost_bps=costs),
        estimate=0.01,
    )
    return sweep


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

    store = ResultStore(args.store)
    sweep = build_sweep(args.slices, args.bars, args.fast, args.slow, args.cost_bps)
    start = time.perf_counter()
    cluster_kwargs = {"n_workers": args.workers, "threads_per_worker": 1, "dashboard_address": ":0"}
    if args.policy == "none":
        cluster_cm = LocalCluster(**cluster_kwargs)
    else:
        cluster_cm = local_cluster(JobsPlugin(policy=args.policy), **cluster_kwargs)
    with cluster_cm as cluster, Client(cluster) as client:
        result = sweep.run(client, store=store, progress=not args.json)
    total = time.perf_counter() - start

    table = result.table()
    ok = [i for i, e in enumerate(table["error"]) if e is None]
    best = max(ok, key=lambda i: table["sharpe"][i]) if ok else None
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
        else {k: table[k][best] for k in ("slice", "fast", "slow", "cost_bps", "sharpe")},
    }
    if args.json:
        print(json.dumps(summary))
        return 0 if result.ok else 1

    print(f"\nSharpe ratio by (fast, slow), mean over {args.slices} slices, per cost level:")
    for cost in args.cost_bps:
        print(f"\n  cost {cost:g} bp   " + "".join(f"slow={s:<6d}" for s in args.slow))
        for f in args.fast:
            cells = []
            for s in args.slow:
                vals = [
                    table["sharpe"][i]
                    for i in ok
                    if (table["fast"][i], table["slow"][i], table["cost_bps"][i]) == (f, s, cost)
                ]
                cells.append(f"{np.mean(vals):+.3f}    " if vals else "   -      ")
            print(f"  fast={f:<3d}        " + "".join(cells))
    if summary["best"]:
        print(f"\nbest: {summary['best']}")
    for failure in result.failures:
        print(f"FAILED {failure}", file=sys.stderr)
    print(
        f"\ncomputed {result.computed} stages, loaded {result.hits} from the store "
        f"({feats['hits']}/{args.slices} feature stages loaded, {feats['computed']} computed; "
        f"{result.pruned} upstream stages not needed); "
        f"wall time {result.seconds:.2f} s ({total:.2f} s with cluster start)"
    )
    print(f"store: {store.url}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
