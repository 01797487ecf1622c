"""Tasks for the forecast benchmark's worker processes (imported there by name: the
harness puts benchmarks/ on the workers' ``PYTHONPATH``).

A slow worker is emulated in the task: on a worker named in the environment variable
``DASKJOBS_BENCH_SLOW`` (``"w0=3"``) every sleep is that many times longer, so that a
backup copy of the same task on another worker is not.
"""

from __future__ import annotations

import os
import time

#: Seconds of sleep per unit of :func:`work`'s size.
UNIT = 0.01
_SLOW: dict[str, float] | None = None


def slowdown() -> float:
    """This worker's slow-down factor (1.0 unless ``DASKJOBS_BENCH_SLOW`` names it)."""
    global _SLOW
    if _SLOW is None:
        _SLOW = {}
        for part in os.environ.get("DASKJOBS_BENCH_SLOW", "").split(","):
            if "=" in part:
                name, factor = part.split("=", 1)
                _SLOW[name.strip()] = float(factor)
    from distributed import get_worker

    return _SLOW.get(str(get_worker().name), 1.0)


def nap(i: int, seconds: float) -> tuple[int, float]:
    """Sleep ``seconds`` (times this worker's slow-down); ``i`` and when it ended."""
    time.sleep(seconds * slowdown())
    return i, time.time()


def cost(n: int) -> float:
    """:func:`work`'s nominal seconds for size ``n``: ``n`` units, give or take 15%
    (a fixed jitter per size, as real tasks of one size are not all alike)."""
    jitter = 0.85 + 0.3 * ((n * 0.6180339887) % 1.0)
    return n * UNIT * jitter


def work(n: int) -> float:
    """A task whose cost follows its size-like argument (:func:`cost`); when it ended."""
    time.sleep(cost(n) * slowdown())
    return time.time()
