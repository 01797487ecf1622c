"""The grid benchmark's reading of a run's last three tenths (benchmarks/bench_speculation.py:
``end_load`` and ``CpuSampler``): the figures docs/benchmarks.md quotes for why 64-slot runs
idle at the end, checked on timelines whose answers are known."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_speculation as bs


def test_end_load_counts_the_last_three_tenths_of_the_fast_workers() -> None:
    case = bs.Case(10, 2, 2, 1, 0.0, 1)  # worker "0" slow, worker "1" fast with 2 threads
    spans = [
        (0, "1", 0.0, 10.0),  # one fast thread busy the whole run
        (1, "1", 0.0, 7.0),  # the other idle from 7 on
        (2, "0", 7.5, 8.0),  # a start on the slow worker counts as a start ...
        (3, "1", 8.0, 9.0),  # ... and this fast one fills [8, 9] of the idle thread
    ]
    got = bs.end_load(spans, case, None)
    assert got["end_starts"] == pytest.approx(2 / 3.0)  # two starts in [7, 10]
    # fast threads over [7, 10]: 2 x 3 slot-seconds, busy 3 + 1
    assert got["end_idle"] == pytest.approx(1 - 4 / 6)
    assert math.isnan(got["end_cpus"])


def test_end_load_names_workers_of_real_processes() -> None:
    case = bs.Case(10, 2, 1, 1, 0.0, 1)
    spans = [(0, "w1", 0.0, 10.0), (1, "w0", 0.0, 10.0)]  # w0 is the slow one
    assert bs.end_load(spans, case, None)["end_idle"] == pytest.approx(0.0)
    assert bs.end_load([(0, "w0", 0.0, 10.0), (1, "w1", 0.0, 1.0)], case, None)[
        "end_idle"
    ] == pytest.approx(1.0)


def test_cpu_sampler_averages_busy_cpus_between_two_times() -> None:
    cpus = psutil.cpu_count() or 1
    s = bs.CpuSampler()
    # (time, total CPU-seconds, idle CPU-seconds): from 1 to 3, 4 of 8 CPU-seconds idle
    s.samples = [(0.0, 0.0, 0.0), (1.0, 2.0, 1.0), (2.0, 6.0, 3.0), (3.0, 10.0, 5.0)]
    assert s.busy(1.0, 3.0) == pytest.approx(cpus * 0.5)
    assert math.isnan(s.busy(2.5, 2.9))  # fewer than two samples inside
    with bs.CpuSampler(every=0.01) as live:
        sum(range(10**6))
    assert len(live.samples) >= 2
    busy = live.busy(live.samples[0][0], live.samples[-1][0])
    assert math.isnan(busy) or 0.0 <= busy <= cpus
