"""The grid in the simulator: what the policy's decisions reach without the live
cluster's costs, and under a scheduler that starts only so many tasks a second.

:func:`sim_ratio` runs the full plugin's policy and speculation settings on a grid
workload (its true durations, its slow workers as slow nodes) in
:func:`daskjobs.sim.engine.simulate`, every attempt holding its slot ``overhead``
seconds longer (dask's cost per task) and, with a ``dispatch_rate``, waiting for a
scheduler that starts that many tasks a second. :func:`model_table` gives, for each
dispatch capacity, the range of those ratios by slot count over the whole grid.
"""

from __future__ import annotations

import statistics

from dask.utils import parse_timedelta
from harness import Chart

from daskjobs.policies import NodeAware
from daskjobs.policies.speculation import Speculation
from daskjobs.sim.engine import simulate
from daskjobs.sim.model import Cluster
from speculation import workload
from speculation.workload import GRID, SLOW_FACTOR, SPECULATION, Case, chapter_workload

#: The makespan over the bound the full plugin aims for (as in the live grid).
TARGET = 1.05


def sim_ratio(case: Case, overhead: float, dispatch_rate: float = 0.0) -> float:
    """The simulator's makespan over the bound for ``case``."""
    w = chapter_workload(case.seed, case.n, case.noise, case.median)
    cluster = Cluster(
        case.workers,
        case.threads,
        {i: SLOW_FACTOR for i in range(case.slow)},
        overhead=overhead,
        dispatch_rate=dispatch_rate,
    )
    spec = Speculation(
        late_factor=float(SPECULATION["late_factor"]),
        min_runtime=parse_timedelta(SPECULATION["min_runtime"]),
        interval=parse_timedelta(SPECULATION["interval"]),
    )
    schedule = simulate(w.tasks, cluster, NodeAware(**workload.POLICY_OPTIONS), spec)
    durations = [t.duration for t in w.tasks]
    bound = max(sum(durations) / case.slot_equivalents, max(durations))
    return float(schedule.makespan / bound)


def model_rows(
    rates: list[float], cases: tuple[Case, ...] = GRID
) -> list[tuple[float, list[float]]]:
    """Each dispatch capacity with the ratios of every case."""
    return [(rate, [sim_ratio(case, 0.0, rate) for case in cases]) for rate in rates]


def model_table(rows: list[tuple[float, list[float]]], cases: tuple[Case, ...] = GRID) -> str:
    """Per dispatch capacity (0: unlimited): the ratios' range by slot count, their
    median, and how many reach the target."""
    slot_counts = sorted({case.slots for case in cases})
    lines = [
        "| dispatch capacity (tasks/s) | "
        + " | ".join(f"{s} slots" for s in slot_counts)
        + f" | median | at or below {TARGET:.2f}x |",
        "|---|" + "---|" * len(slot_counts) + "---:|---:|",
    ]
    for rate, ratios in rows:
        by_slots: dict[int, list[float]] = {}
        for case, r in zip(cases, ratios, strict=True):
            by_slots.setdefault(case.slots, []).append(r)
        cells = [f"{min(v):.3f}-{max(v):.3f}" for _, v in sorted(by_slots.items())]
        ok = sum(r <= TARGET for r in ratios)
        label = f"{rate:,.0f}" if rate else "unlimited"
        lines.append(
            f"| {label} | {' | '.join(cells)} | {statistics.median(ratios):.3f} | "
            f"{ok} of {len(ratios)} |"
        )
    return "\n".join(lines)


def model_chart(rows: list[tuple[float, list[float]]]) -> Chart:
    """The median and the worst ratio per dispatch capacity."""
    return Chart(
        "The grid in the simulator, by dispatch capacity",
        "makespan / bound",
        [f"{rate:,.0f}/s" if rate else "unlimited" for rate, _ in rows],
        {
            "median": [statistics.median(r) for _, r in rows],
            "worst": [max(r) for _, r in rows],
        },
        reference=TARGET,
    )
