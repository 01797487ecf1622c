"""Simulator throughput: how many tasks per second ``simulate`` gets through.

Usage::

    python benchmarks/bench_sim.py            # chapter sweep + the million-task sweep
    python benchmarks/bench_sim.py --quick    # chapter sweep + a 100,000-task sweep
    python benchmarks/bench_sim.py --profile lpt   # also cProfile one policy on the big sweep

Two workloads from :mod:`daskjobs.workloads`:

* the chapter sweep (10,000 tasks, 384 cores) under every policy, with and
  without backups; target: well under a second per run;
* a sweep of 1,000,000 tasks on 38,400 cores (2,400 nodes x 16;
  ``chapter(n=1_000_000, n_long=4000, nodes=2400, cores_per_node=16)``);
  targets: >= 100,000 tasks/s under FIFO and LPT, no policy below 50,000/s.

Only ``simulate`` is timed (wall clock, ``time.perf_counter``), not task
generation; a fresh policy object per run. Each chapter run is repeated
(``--repeat``, best of) because it is short. Prints a markdown table and the
machine it ran on. A run that misses its target is marked ``MISS``; with
``--profile POLICY`` (or ``--profile-misses``) it is re-run under cProfile and
the top functions by own time are printed.

This is a script, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import gc
import io
import math
import os
import platform
import pstats
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from daskjobs import workloads
from daskjobs.policies import FairShare, Policy, make_policy
from daskjobs.sim import simulate

POLICIES = ("fifo", "lpt", "critical-path", "work-stealing", "fair-share", "node-aware")
BIG_TARGET = {"fifo": 100_000.0, "lpt": 100_000.0}
BIG_FLOOR = 50_000.0
CHAPTER_TARGET_S = 1.0


def policy_factory(name: str, team: str) -> Callable[[], Policy]:
    """A fresh policy per call; fair share gets one team (the sweep's)."""
    if name == "fair-share":
        return lambda: FairShare({team: 1.0})
    return lambda: make_policy(name)


@dataclass
class Row:
    workload: str
    tasks: int
    cores: int
    policy: str
    backups: bool
    seconds: float
    makespan_h: float
    events: int
    target: float | None  # tasks/s, or None for a wall-time target

    @property
    def rate(self) -> float:
        return self.tasks / self.seconds if self.seconds else float("inf")

    @property
    def ok(self) -> bool:
        if self.target is None:
            return self.seconds < CHAPTER_TARGET_S
        return self.rate >= self.target


def run(w: workloads.Workload, name: str, backups: bool, repeat: int, target: float | None) -> Row:
    make = policy_factory(name, w.tasks[0].team)
    best = float("inf")
    makespan_h, events = math.nan, 0
    for _ in range(repeat):
        policy = make()
        gc.collect()  # start each run from a clean heap: no garbage of the previous one
        t0 = time.perf_counter()
        s = simulate(w.tasks, w.cluster, policy, spec=w.spec if backups else None, seed=w.seed)
        best = min(best, time.perf_counter() - t0)
        makespan_h, events = s.makespan_h, s.events
        del s, policy
    return Row(
        w.name,
        len(w.tasks),
        w.cluster.total_cores,
        name,
        backups,
        best,
        makespan_h,
        events,
        target,
    )


def profile(w: workloads.Workload, name: str, backups: bool, top: int = 18) -> str:
    """cProfile one run; the ``top`` functions by own time."""
    make = policy_factory(name, w.tasks[0].team)
    prof = cProfile.Profile()
    prof.enable()
    simulate(w.tasks, w.cluster, make(), spec=w.spec if backups else None, seed=w.seed)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def table(rows: list[Row]) -> str:
    lines = [
        "| workload | tasks | cores | policy | backups | simulate s | tasks/s | makespan h "
        "| events | target |",
        "|---|---:|---:|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if r.target is None:
            target = f"< {CHAPTER_TARGET_S:g} s"
        else:
            target = f">= {r.target:,.0f}/s"
        mark = "ok" if r.ok else "MISS"
        lines.append(
            f"| {r.workload} | {r.tasks:,} | {r.cores:,} | {r.policy} | "
            f"{'yes' if r.backups else 'no'} | {r.seconds:.3f} | {r.rate:,.0f} | "
            f"{r.makespan_h:.2f} | {r.events:,} | {target} {mark} |"
        )
    return "\n".join(lines)


def machine() -> str:
    try:
        import numpy

        np_version = numpy.__version__
    except ImportError:  # pragma: no cover
        np_version = "?"
    return (
        f"- date: {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}\n"
        f"- python {platform.python_version()} ({platform.python_implementation()}), "
        f"numpy {np_version}\n"
        f"- platform: {platform.platform()}\n"
        f"- processor: {platform.processor() or platform.machine()}, "
        f"CPUs: {os.cpu_count()}, load average at the end {_load()}"
    )


def _load() -> str:
    """1/5/15-minute load average: other work on the machine skews wall times."""
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - not on every platform
        return "n/a"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="big sweep of 100,000 tasks, not 1M")
    ap.add_argument("--repeat", type=int, default=3, help="chapter runs per policy (best of)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help="comma-separated policies for the big sweep (default: all)",
    )
    ap.add_argument("--no-backups-big", action="store_true", help="big sweep without backups only")
    ap.add_argument("--profile", action="append", default=[], metavar="POLICY")
    ap.add_argument("--profile-misses", action="store_true")
    args = ap.parse_args(argv)

    rows: list[Row] = []
    print(f"chapter sweep (seed {args.seed}) ...", file=sys.stderr)
    w = workloads.chapter(args.seed)
    for name in POLICIES:
        for backups in (False, True):
            rows.append(run(w, name, backups, args.repeat, None))
            print(f"  {name} backups={backups}: {rows[-1].seconds:.3f} s", file=sys.stderr)

    n, n_long, nodes = (100_000, 400, 240) if args.quick else (1_000_000, 4000, 2400)
    t0 = time.perf_counter()
    big = workloads.chapter(args.seed, n=n, n_long=n_long, nodes=nodes, cores_per_node=16)
    gen = time.perf_counter() - t0
    print(f"big sweep: {n:,} tasks generated in {gen:.1f} s", file=sys.stderr)
    big_rows: list[Row] = []
    for name in [p.strip() for p in args.policies.split(",") if p.strip()]:
        for backups in (False,) if args.no_backups_big else (False, True):
            r = run(big, name, backups, 1, BIG_TARGET.get(name, BIG_FLOOR))
            big_rows.append(r)
            print(
                f"  {name} backups={backups}: {r.seconds:.1f} s, {r.rate:,.0f}/s", file=sys.stderr
            )
    rows += big_rows

    print("## Simulator throughput\n")
    print(machine())
    print(f"- command: python benchmarks/bench_sim.py {' '.join(argv or sys.argv[1:])}".rstrip())
    print(f"- big sweep generation (not timed below): {gen:.1f} s\n")
    print(table(rows))

    to_profile = [(p, False) for p in args.profile]
    if args.profile_misses:
        to_profile += [(r.policy, r.backups) for r in big_rows if not r.ok]
    for name, backups in to_profile:
        print(f"\n### cProfile: {name}, backups={backups}, {n:,} tasks\n")
        print("```")
        print(profile(big, name, backups))
        print("```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
