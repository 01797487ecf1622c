"""The start-demand rule: a workload the cluster can start, or a longer one.

A sweep asks its scheduler for ``slots / median task`` starts a second (its *start
demand*). When that comes near what the scheduler can start at all, threads wait for
the scheduler, whatever order it runs the tasks in: that measures the machine, not the
policy. So before the grid runs, this module measures the rate plain dask reaches on
each cluster shape of the grid (:func:`daskjobs.start_rate`, the same measurement as
``daskjobs start-rate``: every thread wanting a task, on an otherwise idle cluster of
the kind the runs use), and keeps a workload whose demand is at most ``share`` (70%)
of that rate; a workload above it is lengthened: its tasks scaled so that the median
task takes ``slots / (share x rate)`` (rounded up to a step of 50 ms), the same
shape, seed and estimates otherwise.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from distributed import Client, LocalCluster
from harness import table
from harness.processes import realcluster, worker_path

import daskjobs
from speculation.workload import Case

#: The share of plain dask's start rate a workload may ask for.
SHARE = 0.7
#: Lengthened medians are rounded up to a multiple of this (seconds).
STEP = 0.05


@dataclasses.dataclass(frozen=True)
class Restated:
    """A workload of the grid as the rule keeps or lengthens it."""

    case: Case  # what runs
    asked: Case  # the grid's workload
    rate: float  # starts a second plain dask reached on its cluster shape

    @property
    def lengthened(self) -> bool:
        return self.case.median != self.asked.median


def lengthen(case: Case, rate: float, share: float = SHARE) -> Case:
    """``case`` if its demand is within ``share`` of ``rate``, else the same workload
    with a longer median task."""
    if not rate > 0 or not math.isfinite(rate):
        raise ValueError(f"start rate must be a positive number of starts a second: {rate!r}")
    if case.demand <= share * rate:
        return case
    median = case.slots / (share * rate)
    median = math.ceil(median / STEP - 1e-9) * STEP
    return dataclasses.replace(case, median=round(median, 6))


def restate(
    cases: Iterable[Case], rates: dict[tuple[int, int], float], share: float = SHARE
) -> list[Restated]:
    """Every case kept or lengthened by the rate of its cluster shape."""
    out = []
    for case in cases:
        rate = rates[(case.workers, case.threads)]
        out.append(Restated(lengthen(case, rate, share), case, rate))
    return out


def _rate_local(workers: int, threads: int, processes: bool, tasks: int) -> float:
    with (
        LocalCluster(
            n_workers=workers,
            threads_per_worker=threads,
            processes=processes,
            dashboard_address=":0",
        ) as cl,
        Client(cl) as client,
    ):
        client.wait_for_workers(workers)
        return daskjobs.start_rate(client, tasks=tasks)


def _rate_real(workers: int, threads: int, tasks: int) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-rate-") as tmp:
        rc = realcluster().RealCluster(
            Path(tmp),
            n_workers=workers,
            nthreads=threads,
            preload=None,
            validate=False,
            env=worker_path(),
        )
        with rc, rc.client() as client:
            return daskjobs.start_rate(client, tasks=tasks)


def measure_rates(
    cases: Iterable[Case], kind: str = "processes", tasks: int = 2000, reps: int = 2
) -> dict[tuple[int, int], float]:
    """Plain dask's start rate on each cluster shape of ``cases`` (the best of ``reps``):
    ``kind`` ``"processes"`` (a ``LocalCluster`` with worker processes), ``"in-process"``
    or ``"real"`` (``dask scheduler`` and ``dask worker`` processes)."""
    rates: dict[tuple[int, int], float] = {}
    for shape in sorted({(c.workers, c.threads) for c in cases}):
        got = []
        for _ in range(reps):
            if kind == "real":
                got.append(_rate_real(*shape, tasks))
            else:
                got.append(_rate_local(*shape, kind == "processes", tasks))
        rates[shape] = max(got)
        print(
            f"  start rate {shape[0]}x{shape[1]}: {', '.join(f'{r:.0f}' for r in got)} a second",
            file=sys.stderr,
        )
    return rates


def restate_table(restated: list[Restated], share: float = SHARE) -> str:
    """Which workloads the rule kept and which it lengthened."""
    rows: list[list[Any]] = []
    for r in restated:
        a = r.asked
        rows.append(
            [
                a.label(),
                f"{r.rate:.0f}",
                f"{a.demand:.0f} ({a.demand / r.rate:.0%})",
                f"lengthened: median {r.case.median:g} s, {r.case.demand:.0f} a second"
                if r.lengthened
                else "kept",
            ]
        )
    return (
        f"Start demand (slots / median task) against plain dask's start rate on the same "
        f"cluster shape (`daskjobs.start_rate`, 2,000 tasks of 20 ms, best of two): a "
        f"workload asking more than {share:.0%} of the rate runs with longer tasks.\n\n"
        + table(["workload", "start rate (/s)", "demand (/s, share)", "runs"], rows, "lrrl")
    )
