"""Where a run's slot-time went: a timeline of attempts, read.

A run of independent tasks on a cluster is, seen from the tasks, a list of attempts:
``(task, worker, start, end)``, one per attempt that ran (losing copies and beaten
primaries included). Tasks can log that much themselves, so a live dask run and a
plain-dask run are measured by the same ruler, whatever ran the scheduling. From it:

* :func:`run_end`: when the last task's result was in (each task ends with its first
  attempt to end; a losing copy's thread may sleep on after it: dask cannot stop a
  thread);
* :func:`decompose`: the cluster's capacity over the run (slot-equivalents x makespan)
  split into the work and the lost slot-time: ramp-up, dispatch round trips, idle slots
  while work waited, the tail, losing copies, overrun; the lost parts add up to
  ``makespan - work / slot-equivalents`` (in seconds of makespan, once divided by the
  slot-equivalents);
* :func:`end_load`: the last three tenths of a run, where longest-first leaves its
  shortest tasks: task starts a second, the fast workers' threads idle, and the
  machine's CPUs busy from a :class:`CpuSampler`. Together they tell a run short of
  decisions (threads idle, CPUs idle) from one short of CPU (threads idle, CPUs busy).

Workers are named as the spans name them; :class:`Slots` gives each its threads and its
slow-down (a worker 4x slow offers a quarter of a slot-equivalent per thread, so a
task's slot-time is its nominal duration wherever it ran). The cost is
O(attempts x threads) per run: an analysis after the fact, not a hot path.
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: One attempt: (task index, worker name, start, end), times in seconds.
Span = tuple[int, str, float, float]


@dataclass(frozen=True)
class Slots:
    """The cluster the spans ran on: ``threads`` per worker and each worker's slow-down
    (1.0: full speed; 4.0: every task runs 4x longer there)."""

    threads: int
    slowdown: Mapping[str, float]

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"Slots: threads must be at least 1, got {self.threads}")
        bad = {w: s for w, s in self.slowdown.items() if not s >= 1.0}
        if bad:
            raise ValueError(f"Slots: a slow-down is at least 1.0, got {bad}")

    def weight(self, worker: str) -> float:
        """A thread of ``worker`` in slot-equivalents."""
        return 1.0 / self.slowdown[worker]

    @property
    def slot_equivalents(self) -> float:
        return sum(self.threads / s for s in self.slowdown.values())

    @property
    def fast(self) -> list[str]:
        """The workers at full speed."""
        return [w for w, s in self.slowdown.items() if s == 1.0]


def run_end(spans: Iterable[Span]) -> float:
    """When the last task's result was in: the latest of each task's first attempt to
    end."""
    first_end: dict[int, float] = {}
    for i, _, _, e in spans:
        cur = first_end.get(i)
        first_end[i] = e if cur is None or e < cur else cur
    return max(first_end.values())


def decompose(spans: list[Span], durations: list[float], slots: Slots) -> dict[str, float]:
    """Where the slot-time of a run went, in slot-equivalent seconds.
    ``capacity = slot_equivalents x makespan`` splits into the work, and the lost
    slot-time:

    * ``ramp``: each slot idle from the first start until its first task;
    * ``dispatch``: refills of a freed slot while work waited, at the median refill gap
      each (the round trip of handing the next task to a free thread), so also
      ``releases`` (their count) and ``gap_ms`` (that median);
    * ``waited``: the rest of the idle slot-time while work waited (a slot idle longer
      than a round trip while tasks had not started: held back, or queued elsewhere);
    * ``tail``: idle slot-time after the last task started (nothing left to start);
    * ``copies``: slot-time of losing attempts (losing copies and beaten primaries);
    * ``overrun``: winners' slot-time beyond their nominal duration (sleep overshoot,
      the GIL);
    * ``other``: what remains (rounding, threads over-filled by the threads of released
      copies that still run).

    ``durations[i]`` is task ``i``'s nominal duration (on a full-speed thread).
    """
    weight = {w: slots.weight(w) for w in slots.slowdown}
    t0 = min(s for _, _, s, _ in spans)
    # the first attempt to end per task wins (its result is the task's); the others lost
    winner: dict[int, Span] = {}
    for sp in spans:
        cur = winner.get(sp[0])
        if cur is None or sp[3] < cur[3]:
            winner[sp[0]] = sp
    # the run ends when the last result is in: a losing attempt's thread that sleeps on
    # is slot-time lost to copies, not a later end
    t_end = run_end(spans)
    spans = [(i, w, s, min(e, t_end)) for i, w, s, e in spans if s < t_end]
    makespan = t_end - t0
    capacity = slots.slot_equivalents * makespan
    work = sum(durations)
    busy_win = sum(weight[w] * (e - s) for _, w, s, e in winner.values())
    busy_all = sum(weight[w] * (e - s) for _, w, s, e in spans)
    first_start: dict[int, float] = {}
    for i, _, s, _ in spans:
        first_start[i] = min(s, first_start.get(i, s))
    last_start = max(first_start.values())  # after this, no task is left to start
    ramp = dispatch = waited = tail = waited_slow = 0.0
    gaps: list[float] = []
    per_worker_gaps: dict[str, list[float]] = {}
    nt = slots.threads
    for w in weight:
        mine = [(s, e) for _, ww, s, e in spans if ww == w]
        starts = sorted(s for s, _ in mine)
        ends = sorted(e for _, e in mine)
        # ramp: slot k idle until the k-th start on the worker
        ramp_w = sum(starts[k] - t0 for k in range(min(nt, len(starts))))
        ramp_w += max(nt - len(starts), 0) * makespan
        # idle integral over time, split at last_start, after each slot's first start
        events = sorted([(s, 1) for s in starts] + [(e, -1) for e in ends])
        running = 0
        idle_before = idle_after = 0.0
        prev = t0
        for t, d in [*events, (t_end, 0)]:
            if t > prev:
                idle = max(nt - running, 0)
                # idle slots during the ramp are counted by ramp_w already: the j-th
                # slot is in its ramp until starts[j]
                ramping = sum(1 for k in range(min(nt, len(starts))) if starts[k] > prev)
                ramping += max(nt - len(starts), 0)
                idle = max(idle - ramping, 0)
                a, b = prev, t
                if b <= last_start:
                    idle_before += idle * (b - a)
                elif a >= last_start:
                    idle_after += idle * (b - a)
                else:
                    idle_before += idle * (last_start - a)
                    idle_after += idle * (b - last_start)
            running += d
            prev = t
        # refills: the (nt + j)-th start needed the j-th end to free a thread
        wg = [max(s - e, 0.0) for e, s in zip(ends, starts[nt:], strict=False) if s <= last_start]
        per_worker_gaps[w] = wg
        gaps.extend(wg)
        ramp += weight[w] * ramp_w
        waited += weight[w] * idle_before
        if weight[w] < 1:
            waited_slow += weight[w] * idle_before
        tail += weight[w] * idle_after
    gap = statistics.median(gaps) if gaps else 0.0
    for w, wg in per_worker_gaps.items():
        dispatch += weight[w] * sum(min(g, gap) for g in wg)
    waited = max(waited - dispatch, 0.0)
    copies = busy_all - busy_win
    overrun = busy_win - work
    lost = capacity - work
    other = lost - (ramp + dispatch + waited + tail + copies + overrun)
    return {
        "makespan": makespan,
        "capacity": capacity,
        "work": work,
        "lost": lost,
        "ramp": ramp,
        "dispatch": dispatch,
        "waited": waited,
        "tail": tail,
        "copies": copies,
        "overrun": overrun,
        "other": other,
        "waited_slow": waited_slow,
        "releases": float(len(gaps)),
        "gap_ms": gap * 1000,
    }


def cpu_times() -> tuple[float, float] | None:
    """The machine's CPU time so far, all CPUs and every process: ``(total, idle)`` in
    seconds, from ``/proc/stat`` (Linux: user, nice, system, idle, iowait, irq, softirq,
    steal; guest time is inside user already); None where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [float(x) for x in fields[1:9]]
    hz = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0.0)
    return sum(ticks) / hz, idle / hz


class CpuSampler:
    """The machine's CPUs busy over time: :func:`cpu_times` (all CPUs, every process)
    sampled every ``every`` seconds in a thread while the ``with`` block runs. On a small
    machine the scheduler, the workers' processes and the client share the CPUs, so a
    run that asks for more task starts a second than the machine can make shows as CPUs
    near all busy while threads idle. Where :func:`cpu_times` cannot read the machine,
    no samples are taken and :meth:`busy` is NaN."""

    def __init__(self, every: float = 0.05) -> None:
        self.every = every
        self.samples: list[tuple[float, float, float]] = []  # (time, total, idle) CPU-s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="cpu-sampler")

    def _sample(self) -> None:
        got = cpu_times()
        if got is not None:
            self.samples.append((time.time(), *got))

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def __enter__(self) -> CpuSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def busy(self, a: float, b: float) -> float:
        """CPUs busy on average from ``a`` to ``b`` (the samples nearest inside; NaN if
        fewer than two fall there)."""
        inside = [x for x in self.samples if a <= x[0] <= b]
        if len(inside) < 2 or inside[-1][1] <= inside[0][1]:
            return math.nan
        total = inside[-1][1] - inside[0][1]
        idle = inside[-1][2] - inside[0][2]
        return (os.cpu_count() or 1) * (1.0 - idle / total)


def end_load(spans: list[Span], slots: Slots, cpu: CpuSampler | None) -> dict[str, float]:
    """The last three tenths of a run (first start to the last end, of every attempt):
    task starts a second (``end_starts``), the fast workers' threads idle (``end_idle``,
    a fraction), and the machine's CPUs busy (``end_cpus``; NaN without a sampler)."""
    t0 = min(s for _, _, s, _ in spans)
    t1 = max(e for *_, e in spans)
    a = t0 + 0.7 * (t1 - t0)
    span = t1 - a
    fast = set(slots.fast)
    busy = sum(max(0.0, min(t1, e) - max(a, s)) for _, w, s, e in spans if w in fast)
    threads = len(fast) * slots.threads
    return {
        "end_starts": sum(1 for _, _, s, _ in spans if s >= a) / span if span > 0 else 0.0,
        "end_idle": 1.0 - busy / (threads * span) if span > 0 and threads else 0.0,
        "end_cpus": cpu.busy(a, t1) if cpu is not None else math.nan,
    }
