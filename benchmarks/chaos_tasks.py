"""The tasks of bench_chaos.py, importable on its worker processes (the harness puts
benchmarks/ on their ``PYTHONPATH``): a sweep's stages (features read by backtests) and
a task that says where it ran, each slowed on the workers named in the environment
variable ``DASKJOBS_BENCH_SLOW`` (``"w0=4,w2=2"``)."""

from __future__ import annotations

import os
import time
from typing import Any

_SLOW: dict[str, float] | None = None


def slowdown() -> float:
    """How many times slower this worker runs every task (1.0 outside a worker)."""
    global _SLOW
    if _SLOW is None:
        _SLOW = {}
        for part in os.environ.get("DASKJOBS_BENCH_SLOW", "").split(","):
            if "=" in part:
                name, factor = part.split("=", 1)
                _SLOW[name.strip()] = float(factor)
    try:
        from distributed import get_worker

        return _SLOW.get(str(get_worker().name), 1.0)
    except ValueError:
        return 1.0


def where(i: int, seconds: float, *deps: Any) -> tuple[int, str]:
    """Sleep ``seconds`` (times this worker's slowdown); say which worker ran it."""
    from distributed import get_worker

    time.sleep(seconds * slowdown())
    return (i, str(get_worker().name))


def features(slice: int) -> bytes:
    """A feature table: ~200 kB, so the memory manager sees real replicas."""
    time.sleep(0.02 * slowdown())
    return bytes([slice % 251]) * 200_000


def backtest(features: bytes, fast: int, seconds: float) -> dict[str, Any]:
    """Read the features and take ``seconds`` (times the worker's slowdown)."""
    time.sleep(seconds * slowdown())
    return {"sharpe": (len(features) % 997) / 1000 + fast, "first": features[0]}
