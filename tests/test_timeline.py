"""daskjobs.timeline: a run's attempts read into where its slot-time went and the load at
its end (the speculation benchmark's rulers), checked on timelines whose answers are known."""

from __future__ import annotations

import math
import os

import pytest

from daskjobs.timeline import CpuSampler, Slots, cpu_times, decompose, end_load, run_end


def test_end_load_counts_the_last_three_tenths_of_the_fast_workers() -> None:
    slots = Slots(2, {"0": 4.0, "1": 1.0})  # worker "0" slow, worker "1" fast with 2 threads
    spans = [
        (0, "1", 0.0, 10.0),  # one fast thread busy the whole run
        (1, "1", 0.0, 7.0),  # the other idle from 7 on
        (2, "0", 7.5, 8.0),  # a start on the slow worker counts as a start ...
        (3, "1", 8.0, 9.0),  # ... and this fast one fills [8, 9] of the idle thread
    ]
    got = end_load(spans, slots, None)
    assert got["end_starts"] == pytest.approx(2 / 3.0)  # two starts in [7, 10]
    # fast threads over [7, 10]: 2 x 3 slot-seconds, busy 3 + 1
    assert got["end_idle"] == pytest.approx(1 - 4 / 6)
    assert math.isnan(got["end_cpus"])


def test_end_load_reads_workers_by_the_names_the_spans_use() -> None:
    slots = Slots(1, {"w0": 4.0, "w1": 1.0})  # w0 is the slow one
    assert end_load([(0, "w1", 0.0, 10.0), (1, "w0", 0.0, 10.0)], slots, None)[
        "end_idle"
    ] == pytest.approx(0.0)
    assert end_load([(0, "w0", 0.0, 10.0), (1, "w1", 0.0, 1.0)], slots, None)[
        "end_idle"
    ] == pytest.approx(1.0)


def test_decompose_splits_idle_slots_into_dispatch_and_tail() -> None:
    # two single-thread workers; b's thread idles 0.5 s between its two tasks while task 2
    # waits (a refill: the median gap), then a idles after the last start (the tail)
    slots = Slots(1, {"a": 1.0, "b": 1.0})
    spans = [(0, "a", 0.0, 2.0), (1, "b", 0.0, 1.0), (2, "b", 1.5, 2.5)]
    d = decompose(spans, [2.0, 1.0, 1.0], slots)
    assert d["makespan"] == pytest.approx(2.5)
    assert d["capacity"] == pytest.approx(5.0) and d["work"] == pytest.approx(4.0)
    assert d["lost"] == pytest.approx(1.0)
    assert d["releases"] == 1 and d["gap_ms"] == pytest.approx(500.0)
    assert d["dispatch"] == pytest.approx(0.5) and d["tail"] == pytest.approx(0.5)
    for k in ("ramp", "waited", "copies", "overrun", "other"):
        assert d[k] == pytest.approx(0.0), k


def test_decompose_counts_a_beaten_primary_as_copies_and_ends_with_the_winner() -> None:
    # task 0's primary runs on a (2x slow) until 2.0; its copy on b wins at 1.5: the run
    # ends at 1.5 and a's thread until then is slot-time lost to the race
    slots = Slots(1, {"a": 2.0, "b": 1.0})
    spans = [(0, "a", 0.0, 2.0), (1, "b", 0.0, 0.5), (0, "b", 0.5, 1.5)]
    assert run_end(spans) == pytest.approx(1.5)
    d = decompose(spans, [1.0, 0.5], slots)
    assert d["makespan"] == pytest.approx(1.5)
    assert slots.slot_equivalents == pytest.approx(1.5)
    assert d["lost"] == pytest.approx(1.5 * 1.5 - 1.5)
    assert d["copies"] == pytest.approx(0.75)  # 1.5 s of a half-speed thread
    for k in ("ramp", "dispatch", "waited", "tail", "overrun", "other"):
        assert d[k] == pytest.approx(0.0), k


def test_slots_refuse_a_worker_faster_than_full_speed() -> None:
    with pytest.raises(ValueError, match=r"slow-down is at least 1\.0"):
        Slots(2, {"w0": 0.5})
    with pytest.raises(ValueError, match="threads must be at least 1"):
        Slots(0, {"w0": 1.0})


def test_cpu_sampler_averages_busy_cpus_between_two_times() -> None:
    cpus = os.cpu_count() or 1
    s = CpuSampler()
    # (time, total CPU-seconds, idle CPU-seconds): from 1 to 3, 4 of 8 CPU-seconds idle
    s.samples = [(0.0, 0.0, 0.0), (1.0, 2.0, 1.0), (2.0, 6.0, 3.0), (3.0, 10.0, 5.0)]
    assert s.busy(1.0, 3.0) == pytest.approx(cpus * 0.5)
    assert math.isnan(s.busy(2.5, 2.9))  # fewer than two samples inside
    if cpu_times() is None:
        pytest.skip("no /proc/stat on this platform: the sampler takes no samples")
    with CpuSampler(every=0.01) as live:
        sum(range(10**6))
    assert len(live.samples) >= 2
    busy = live.busy(live.samples[0][0], live.samples[-1][0])
    assert math.isnan(busy) or 0.0 <= busy <= cpus


def test_cpu_times_reads_what_psutil_reads() -> None:
    psutil = pytest.importorskip("psutil")
    got = cpu_times()
    if got is None:
        pytest.skip("no /proc/stat on this platform")
    t = psutil.cpu_times()
    total, idle = got
    # read a moment apart: at most a few CPU-seconds of the machine's time between them
    assert idle == pytest.approx(t.idle + getattr(t, "iowait", 0.0), abs=2.0)
    assert total == pytest.approx(
        sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0), abs=2.0
    )
