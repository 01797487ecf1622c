"""The stages of the README's backtest sweep, importable from an installed daskjobs.

``examples/backtest_sweep.py`` (the README's first command), ``examples/sweep.ipynb``, the
README's notebook snippet and docs/explanation/cache.md all build their sweep from these functions,
so they are one module that every process can import: the workers of a cluster unpickle a stage
function by module and name, and a function defined in a notebook or a script (``__main__``) would
have to travel by value and would get another content key (docs/explanation/cache.md, "What does not
invalidate"). Stages defined here get the same keys from the script and from a notebook: a notebook
sweep loads what the script stored.

The workload: each data slice is a synthetic series of 5-minute bars (a geometric random walk
whose drift and volatility change by regime); one *feature* stage per slice computes what every
backtest of that slice reads (moving averages for each window of the grid, a rolling volatility,
a two-session rolling median and quantile band of the price: the expensive part); then a
moving-average crossover backtest runs for every (fast, slow, cost) point of the grid,
volatility-targeted, with transaction costs, and reports its annualised Sharpe ratio, annual
return and maximum drawdown.

Only numpy is needed here; the sweep API is imported when :func:`build_sweep` runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from daskjobs.sweep import Sweep

__all__ = [
    "BARS_PER_DAY",
    "BARS_PER_YEAR",
    "TREND_WINDOW",
    "build_sweep",
    "crossover_backtest",
    "rolling_features",
    "synthetic_prices",
]

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
    """Everything the backtests of one slice share (computed once per slice).

    ``windows`` must hold every fast and slow window the backtests use, and 5."""
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


def build_sweep(
    slices: int,
    bars: int,
    fast: Iterable[int],
    slow: Iterable[int],
    costs: Iterable[float],
    *,
    name: str = "ma-crossover",
    team: str | None = None,
) -> Sweep:
    """The three stages: prices per slice, features per slice, a backtest per grid point."""
    from daskjobs import Sweep, grid

    fast, slow, costs = list(fast), list(slow), list(costs)
    windows = tuple(sorted({5, *fast, *slow}))
    sweep = Sweep(name, team=team)
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
