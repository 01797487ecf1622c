"""Timing side by side: configurations alternated within one run, compared pairwise.

On a shared machine the speed moves by 10-30% within minutes, so two configurations
timed one after the other compare the machine's two moments as much as the code.
Each benchmark therefore runs its configurations in turns, rep after rep, the order
rotated every rep so that each goes first equally often (two configurations: A B,
B A, A B, ...), and compares rep by rep: the ratio of A's and B's runs of the same rep
(:func:`paired_ratios`), reported as the median and the range (:class:`Spread`).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


def order(names: Sequence[str], rep: int) -> list[str]:
    """The configurations' order in rep ``rep``: ``names`` rotated by ``rep``."""
    k = rep % len(names) if names else 0
    return [*names[k:], *names[:k]]


def alternate(
    runs: Mapping[str, Callable[[], T]],
    reps: int,
    *,
    show: Callable[[str, int, T], str] | None = None,
) -> dict[str, list[T]]:
    """Call each of ``runs`` ``reps`` times, in turns (:func:`order`); each
    configuration's results in rep order. ``show(name, rep, result)`` gives a progress
    line for stderr."""
    out: dict[str, list[T]] = {name: [] for name in runs}
    for rep in range(reps):
        for name in order(list(runs), rep):
            got = runs[name]()
            out[name].append(got)
            if show is not None:
                print(f"  {show(name, rep, got)}", file=sys.stderr)
    return out


def timed(fn: Callable[[], object]) -> Callable[[], float]:
    """``fn`` as a run that returns its wall time in seconds (``time.perf_counter``)."""

    def run() -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    return run


def paired_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """``a[i] / b[i]`` for each rep: the two measured at the same moment of the machine."""
    if len(a) != len(b):
        raise ValueError(f"paired runs need as many of each: {len(a)} and {len(b)}")
    return [x / y for x, y in zip(a, b, strict=True)]


@dataclass(frozen=True)
class Spread:
    """The median of some figures and their range."""

    median: float
    lo: float
    hi: float
    n: int

    def text(self, fmt: str = ".3f", unit: str = "") -> str:
        """``1.020x (0.980-1.050)``; a single figure without its range."""
        if self.n == 1:
            return f"{self.median:{fmt}}{unit}"
        return f"{self.median:{fmt}}{unit} ({self.lo:{fmt}}-{self.hi:{fmt}})"


def spread(xs: Iterable[float]) -> Spread:
    """The :class:`Spread` of ``xs`` (at least one)."""
    values = list(xs)
    if not values:
        raise ValueError("spread of no figures")
    return Spread(statistics.median(values), min(values), max(values), len(values))
