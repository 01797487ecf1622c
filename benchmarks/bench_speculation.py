"""Speculative copies of late tasks on a live dask cluster with slow workers.

Usage::

    python benchmarks/bench_speculation.py               # the grid: 16 workloads (~8 minutes)
    python benchmarks/bench_speculation.py --quick       # one workload of the grid
    python benchmarks/bench_speculation.py --in-process  # the grid, all in one process
    python benchmarks/bench_speculation.py --real-grid   # ... on dask scheduler/worker processes
    python benchmarks/bench_speculation.py --reps 3      # each run 3 times
    python benchmarks/bench_speculation.py --submit 5    # ... and the fixed costs, 5 runs each
    python benchmarks/bench_speculation.py --chapter     # the chapter sweep (3 seeds)
    python benchmarks/bench_speculation.py --chapter --quick   # 400 tasks, one seed
    python benchmarks/bench_speculation.py --real        # ... and on real processes
    python benchmarks/bench_speculation.py --model 0,600,1200   # the grid in the simulator
    python benchmarks/bench_speculation.py --start-share 0      # the grid as written

**The grid** (the default, :mod:`speculation.grid`): the full plugin (node-aware with
speculation) against plain dask, side by side, on workloads of 400 to 3,200 sleep tasks
on 16 to 64 slots with one or two workers 4x slow, each within what the cluster can
start (:mod:`speculation.demand`: plain dask's start rate is measured first on each
cluster shape, and a workload asking more than 70% of it runs with longer tasks):
makespan over the speed bound, fixed
costs, the simulator's ratio for the same policy beside it; where the lost slot-time went
and the load at the end of each run (:mod:`speculation.lost`).

**The chapter sweep** (``--chapter``, :mod:`speculation.chapter`): 832 tasks on 4 workers
x 8 threads with one worker 4x slow, five configurations (plain dask, hand-set
priorities, LPT, LPT with copies, node-aware with copies); with ``--real`` also on
``dask scheduler`` and ``dask worker`` processes (:mod:`speculation.chapter_real`).

**The model** (``--model RATES``, :mod:`speculation.model`): the grid in the simulator
under a scheduler that starts so many tasks a second. **Fixed costs** (``--submit REPS``,
:mod:`speculation.probe`): submission to the first task start.

Prints markdown with the command and the machine (``--markdown``/``--plot`` write it and
a PNG). A script, not a test: nothing here asserts.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile

import dask
import harness
from speculation import workload
from speculation.workload import GRID, QUICK


def _policy_options(items: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or not key.strip() or not math.isfinite(number):
            raise SystemExit(f"--policy-option wants KEY=NUMBER, got {item!r}")
        out[key.strip().replace("-", "_")] = number
    return out


def _rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",")]
    except ValueError:
        rates = [math.nan]
    if not all(math.isfinite(r) and r >= 0 for r in rates):
        raise SystemExit(f"--model wants dispatch capacities (numbers >= 0), got {text!r}")
    return rates


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, seeds=3)
    ap.add_argument("--reps", type=int, default=1, help="runs per workload and configuration")
    ap.add_argument("--cases", default=None, help="grid rows to run, e.g. 0,3,10 (default all)")
    ap.add_argument("--chapter", action="store_true", help="the chapter sweep instead")
    ap.add_argument(
        "--sweep-tasks", type=int, default=None, help="tasks per chapter sweep (832; quick 400)"
    )
    ap.add_argument("--slow-worker", type=int, default=0, help="the chapter's slow worker")
    ap.add_argument("--slow-factor", type=float, default=workload.SLOW_FACTOR)
    ap.add_argument("--real", action="store_true", help="the chapter, also on real processes")
    ap.add_argument("--only-real", action="store_true", help="only the real-process runs")
    ap.add_argument("--real-grid", action="store_true", help="the grid on real processes")
    ap.add_argument("--in-process", action="store_true", help="the grid all in this process")
    ap.add_argument(
        "--policy-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the grid's node-aware policy (a number), e.g. interleave=0.25; "
        "repeatable",
    )
    ap.add_argument("--model", default=None, metavar="RATES", help="the grid in the simulator")
    ap.add_argument("--submit", type=int, default=0, metavar="REPS", help="also fixed costs")
    ap.add_argument(
        "--start-share",
        type=float,
        default=None,
        metavar="SHARE",
        help="the share of plain dask's start rate a grid workload may ask for; one asking "
        "more runs with longer tasks (default 0.7; 0: run the grid as written)",
    )
    args = ap.parse_args(argv)
    workload.POLICY_OPTIONS.update(_policy_options(args.policy_option))
    seeds = harness.seeds(args, 3)
    n = args.sweep_tasks or (400 if args.quick else 832)
    report = harness.Report("Speculation", __file__, argv)
    # how many tasks dask keeps on a worker per thread decides the refill round trips
    saturation = dask.config.get("distributed.scheduler.worker-saturation")
    env = os.environ.get("DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION")
    report.note(
        f"distributed.scheduler.worker-saturation: {saturation}"
        + (" (DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION)" if env else "")
    )
    if workload.POLICY_OPTIONS:
        report.note(f"node-aware policy options: {workload.POLICY_OPTIONS}")

    if args.only_real or args.chapter or args.real:
        from speculation import chapter, chapter_real

        if not args.only_real:
            rows = chapter.sweep(seeds, n, args.slow_worker, args.slow_factor)
            report.title = "Speculation: the chapter sweep, one worker 4x slow"
            report.section(
                "Makespan over the bound on 32 slots",
                chapter.table(rows, n, args.slow_worker, args.slow_factor),
            )
            report.chart(chapter.chart(rows))
        if args.real or args.only_real:
            real = chapter_real.sweep_real(seeds, n)
            report.section(
                "The same sweeps on real processes, dask's default configuration",
                chapter_real.real_table(real, n),
            )
        report.emit(args)
        return 0

    if args.model is not None:
        from speculation import model

        cases = QUICK if args.quick else GRID
        rows_m = model.model_rows(_rates(args.model), cases)
        report.title = "Speculation: the grid in the simulator, by dispatch capacity"
        report.section(None, model.model_table(rows_m, cases))
        report.chart(model.model_chart(rows_m))
        report.emit(args)
        return 0

    from speculation import demand, grid, lost, probe

    cases = QUICK if args.quick else GRID
    if args.cases:
        cases = tuple(GRID[int(k)] for k in args.cases.split(","))
    share = demand.SHARE if args.start_share is None else args.start_share
    restated = None
    if share > 0:
        kind = "real" if args.real_grid else "in-process" if args.in_process else "processes"
        print(f"start rates ({kind}) ...", file=sys.stderr)
        restated = demand.restate(cases, demand.measure_rates(cases, kind), share)
        cases = tuple(r.case for r in restated)
    print(f"grid: {len(cases)} workloads x {args.reps} run(s) ...", file=sys.stderr)
    if args.in_process and not args.real_grid:
        rows = grid.grid(cases, args.reps)
        where = "LocalCluster, all in one process"
    else:
        with tempfile.TemporaryDirectory(prefix="bench-spec-") as tmp:
            if args.real_grid:
                rows = grid.grid(cases, args.reps, real=tmp)
                where = "real dask scheduler and worker processes"
            else:
                rows = grid.grid(cases, args.reps, processes=tmp)
                where = "LocalCluster with worker processes"
    report.title = f"Speculation: the full plugin against plain dask ({where})"
    if restated is not None:
        report.section("Workloads the cluster can start", demand.restate_table(restated, share))
    report.section("Makespan over the bound", grid.grid_table(rows, args.reps))
    report.section(
        "Where the full plugin's lost time went (median run per workload)",
        lost.lost_table(rows, "aware"),
    )
    report.section("The same for plain dask", lost.lost_table(rows, "plain"))
    report.section("The last three tenths of each run", lost.end_table(rows))
    report.chart(grid.grid_chart(rows))
    report.chart(lost.lost_chart(rows))
    if args.submit:
        report.section(
            "Submission to first task start",
            probe.submit_table(probe.submit_probe(800, args.submit), 800),
        )
    report.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
