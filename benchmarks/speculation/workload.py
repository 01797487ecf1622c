"""The sweeps of the speculation benchmark, and the tasks that time themselves.

Every sweep is the laptop-scaled chapter sweep: sleep tasks with durations from
:func:`daskjobs.sim.workloads.chapter` (median 0.1 s, sigma 0.76, the :data:`N_LONG`
longest at 30x the median and submitted last), estimates with ``exp(noise z)`` error as
``estimate`` annotations, submitted as one graph of ``dask.delayed`` calls whose keys are
named so that plain dask's order is the submission order (dask runs independent tasks in
descending key order). A slow worker is emulated in the task: it sleeps
``duration x SLOW_FACTOR`` when it runs on a worker named slow, so a copy of the same
task on a fast worker is fast.

The tasks are defined here, in a module the workers import by name, not in the script
(``__main__``): in one process they append their attempts to :data:`SPANS`; in worker
processes they append them to a file (:func:`nap_file`, :func:`read_spans`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import dask
from distributed import get_worker

from daskjobs.sim import workloads
from daskjobs.timeline import Slots, Span

SLOW_FACTOR = 4.0
N_LONG = 4
#: The chapter sweep's cluster: workers x threads (32 slots, one worker slow).
SLOTS = (4, 8)
#: The plugin's speculation settings in every configuration with backup copies.
SPECULATION: dict[str, Any] = {
    "enabled": True,
    "late_factor": 2.5,
    "min_runtime": "100ms",
    "interval": "50ms",
}
#: Settings of the grid's node-aware policy (``--policy-option KEY=VALUE``), live and in
#: the simulator alike; empty: its defaults.
POLICY_OPTIONS: dict[str, Any] = {}


def speculation_config() -> dict[str, Any]:
    """:data:`SPECULATION` as dask config (kebab-case keys), for a preloaded plugin."""
    return {k.replace("_", "-"): v for k, v in SPECULATION.items()}


#: The median task of every sweep unless a workload is lengthened (seconds).
MEDIAN = 0.1


def chapter_workload(seed: int, n: int, noise: float = 0.3, median: float = MEDIAN) -> Any:
    return workloads.chapter(
        seed, n=n, n_long=N_LONG, median=median, sigma=0.76, estimate_noise=noise
    )


# -- tasks ----------------------------------------------------------------------------------


def nap(seconds: float, slow_worker: Any, slow_factor: float) -> tuple[float, float, str]:
    """Sleep ``seconds``, ``slow_factor`` times longer on the worker named ``slow_worker``."""
    name = get_worker().name
    factor = slow_factor if name == slow_worker else 1.0
    t0 = time.time()
    time.sleep(seconds * factor)
    return t0, time.time(), str(name)


def nap_value(
    i: int, seconds: float, slow_worker: Any, slow_factor: float
) -> tuple[int, float, float, str]:
    """:func:`nap` with a value that depends only on the task (compared across runs)."""
    t0, t1, name = nap(seconds, slow_worker, slow_factor)
    return i * i + 7, t0, t1, name


#: Every attempt's (task index, worker name, start, end), appended by the thread that ran
#: it when its sleep returns: losing copies and beaten primaries included (a cluster in
#: this process only).
SPANS: list[Span] = []


def nap_logged(
    i: int, seconds: float, slow: tuple[str, ...], slow_factor: float
) -> tuple[float, float, str]:
    """Sleep ``seconds`` (``slow_factor`` times longer on a worker named in ``slow``) and
    log the attempt in :data:`SPANS`."""
    name = str(get_worker().name)
    t0 = time.time()
    time.sleep(seconds * (slow_factor if name in slow else 1.0))
    t1 = time.time()
    SPANS.append((i, name, t0, t1))
    return t0, t1, name


def nap_file(
    i: int, seconds: float, slow: tuple[str, ...], slow_factor: float, path: str
) -> tuple[float, float, str]:
    """:func:`nap_logged` for worker processes: the attempt is appended to the file
    ``path`` (one line per attempt; small appends do not interleave)."""
    name = str(get_worker().name)
    t0 = time.time()
    time.sleep(seconds * (slow_factor if name in slow else 1.0))
    t1 = time.time()
    with open(path, "a") as f:
        f.write(f"{i} {name} {t0!r} {t1!r}\n")
    return t0, t1, name


def read_spans(path: str, t_submit: float) -> list[Span]:
    """The attempts :func:`nap_file` logged to ``path`` since ``t_submit``."""
    spans = []
    with open(path) as f:
        for line in f:
            i, name, t0, t1 = line.split()
            if float(t0) >= t_submit:
                spans.append((int(i), name, float(t0), float(t1)))
    return spans


def worker_prefix(spans: list[Span]) -> str:
    """How the spans name workers: ``w0``, ``w1``, ... for ``dask worker`` processes,
    ``0``, ``1``, ... for a ``LocalCluster``'s."""
    return "w" if any(str(w).startswith("w") for _, w, _, _ in spans) else ""


# -- the chapter sweep ------------------------------------------------------------------------


def chapter_graph(
    seed: int, n: int, *, priorities: bool, slow_worker: Any, slow_factor: float
) -> tuple[list[Any], list[float]]:
    """The chapter sweep for a ``LocalCluster`` in this process; with ``priorities``,
    hand-set longest-first priorities (``dask.annotate(priority=...)`` ranked by
    estimate)."""
    w = chapter_workload(seed, n)
    order = sorted(range(len(w.tasks)), key=lambda i: w.tasks[i].estimate)
    rank = {i: r for r, i in enumerate(order)}
    parts, durations = [], []
    last = len(w.tasks) - 1
    for i, t in enumerate(w.tasks):
        ann: dict[str, Any] = {"estimate": float(t.estimate)}
        if priorities:
            ann["priority"] = rank[i]
        with dask.annotate(**ann):
            parts.append(
                dask.delayed(nap)(
                    float(t.duration), slow_worker, slow_factor, dask_key_name=f"bt-{last - i:06d}"
                )
            )
        durations.append(float(t.duration))
    return parts, durations


def chapter_graph_real(seed: int, n: int) -> tuple[list[Any], list[float]]:
    """The chapter sweep for ``dask worker`` processes (``w0`` slow); each value depends
    only on its task."""
    w = chapter_workload(seed, n)
    parts, durations = [], []
    last = len(w.tasks) - 1
    for i, t in enumerate(w.tasks):
        with dask.annotate(estimate=float(t.estimate)):
            parts.append(
                dask.delayed(nap_value)(
                    i, float(t.duration), "w0", SLOW_FACTOR, dask_key_name=f"bt-{last - i:06d}"
                )
            )
        durations.append(float(t.duration))
    return parts, durations


# -- the grid -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One workload of the grid."""

    n: int
    workers: int
    threads: int
    slow: int  # how many workers run SLOW_FACTOR x slower (the first ones)
    noise: float  # sigma of the estimates' exp(noise z) error; 0: exact estimates
    seed: int
    median: float = MEDIAN  # the median task's seconds (longer: fewer starts a second)

    @property
    def slots(self) -> int:
        return self.workers * self.threads

    @property
    def demand(self) -> float:
        """Task starts a second the sweep asks for: every slot starting a median task."""
        return self.slots / self.median

    @property
    def slot_equivalents(self) -> float:
        return (self.workers - self.slow) * self.threads + self.slow * self.threads / SLOW_FACTOR

    def cluster(self, prefix: str = "") -> Slots:
        """The case's workers as the spans name them (``{prefix}0``, ...)."""
        return Slots(
            self.threads,
            {f"{prefix}{w}": (SLOW_FACTOR if w < self.slow else 1.0) for w in range(self.workers)},
        )

    def label(self) -> str:
        est = f"noise {self.noise:g}" if self.noise else "exact"
        med = "" if self.median == MEDIAN else f", median {self.median:g} s"
        return (
            f"{self.n} x {self.workers}x{self.threads}, {self.slow} slow, {est}{med}, "
            f"seed {self.seed}"
        )


#: 16 workloads: 400-3,200 tasks, 16-64 slots, one or two slow workers, estimates with
#: and without noise, seeds other than the chapter table's. Sizes go with slot counts so
#: that every run is a few seconds (the median task stays 0.1 s).
GRID = (
    Case(400, 4, 4, 1, 0.3, 11),
    Case(400, 4, 4, 2, 0.0, 12),
    Case(800, 4, 4, 1, 0.3, 13),
    Case(800, 4, 8, 1, 0.3, 14),
    Case(800, 4, 8, 1, 0.3, 15),
    Case(800, 4, 8, 1, 0.3, 16),
    Case(800, 4, 8, 1, 0.0, 17),
    Case(800, 4, 8, 2, 0.3, 18),
    Case(1600, 4, 8, 1, 0.3, 19),
    Case(1600, 4, 8, 2, 0.0, 20),
    Case(1600, 8, 8, 1, 0.3, 21),
    Case(1600, 8, 8, 2, 0.3, 22),
    Case(1600, 8, 8, 1, 0.0, 23),
    Case(3200, 8, 8, 1, 0.3, 24),
    Case(3200, 8, 8, 2, 0.3, 25),
    Case(3200, 8, 8, 2, 0.0, 26),
)
#: ``--quick``: the smallest workload (a run of about five seconds).
QUICK = GRID[:1]


def grid_graph(
    case: Case, spans_file: str | None = None, prefix: str = "w"
) -> tuple[list[Any], list[float]]:
    """The sweep of ``case`` as one graph of ``dask.delayed`` calls (the longest last);
    with ``spans_file``, for worker processes (named ``{prefix}0``, ``{prefix}1``, ...:
    ``w0`` for ``dask worker`` processes, ``0`` for a ``LocalCluster``'s), the attempts
    are logged to that file, else to :data:`SPANS`."""
    w = chapter_workload(case.seed, case.n, case.noise, case.median)
    fn: Any = nap_logged
    slow = tuple(str(i) for i in range(case.slow))
    extra: tuple[Any, ...] = ()
    if spans_file is not None:
        fn = nap_file
        slow = tuple(f"{prefix}{i}" for i in range(case.slow))
        extra = (spans_file,)
    parts, durations = [], []
    last = len(w.tasks) - 1
    for i, t in enumerate(w.tasks):
        with dask.annotate(estimate=float(t.estimate)):
            parts.append(
                dask.delayed(fn)(
                    i,
                    float(t.duration),
                    slow,
                    SLOW_FACTOR,
                    *extra,
                    dask_key_name=f"bt-{last - i:06d}",
                )
            )
        durations.append(float(t.duration))
    return parts, durations


# -- reading the plugin -------------------------------------------------------------------


def scheduler_status(dask_scheduler: Any) -> dict[str, Any] | None:
    """The plugin's ``status()`` (run on the scheduler); None without the plugin."""
    plugin = dask_scheduler.plugins.get("daskjobs")
    return None if plugin is None else plugin.status()


def backup_events(dask_scheduler: Any) -> list[dict[str, Any]]:
    """The plugin's ``backup-*`` events (run on the scheduler)."""
    plugin = dask_scheduler.plugins.get("daskjobs")
    if plugin is None:
        return []
    return [dict(e) for e in plugin.events if str(e.get("action", "")).startswith("backup-")]
