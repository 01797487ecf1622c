"""The simulator's cost in instructions, new code against old: a count load barely moves.

Usage::

    git worktree add /tmp/sim-old <commit>
    python benchmarks/bench_sim_instructions.py --against /tmp/sim-old   # chapter, 10,000 tasks
    python benchmarks/bench_sim_instructions.py --against /tmp/sim-old --size 100000
    python benchmarks/bench_sim_instructions.py --against /tmp/sim-old --quick  # 2 policies

On a shared 2-CPU machine the wall time of a run moves by 10-40% between
interpreters (benchmarks/NOTES.md), so ``bench_sim.py --against`` cannot tell a change
of a few percent. This script counts what the code does instead: each case of
``bench_sim.py`` (a policy, with or without backups) runs under valgrind's callgrind
in two fresh interpreters, one that builds the workload and simulates it once and one that
simulates it twice; the difference is the instructions of one ``simulate`` in the steady
state (callgrind's ``Ir``; the first run also pays for lazy imports, whose cost moves with
``sys.path``). With the same seed and ``PYTHONHASHSEED=0`` the count moves much less than
wall time, but it is not fixed: the same case in two interpreters started together has
differed by a few tenths of a percent, and the same code's counts in invocations an hour apart
by several percent (figures in benchmarks/NOTES.md; the cause is not known: something the
seed does not fix, such as the heap's layout). ``--check`` counts the first case twice:
read a ratio as a difference only beyond that spread. An instruction count does not see
cache misses or memory stalls: read it beside ``bench_sim.py``'s times, not instead of them.

Each column: instructions a task (``Ir`` / tasks), for the new code and for the code in
``--against``, their ratio (below 1: the new code does less), and whether the two
schedules are the same (makespan and event count). Needs ``valgrind`` on the path.
Cases run ``--jobs`` at a time (default: one per CPU).

This is a script, not a test: nothing here asserts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import harness

POLICIES = ("fifo", "lpt", "critical-path", "work-stealing", "fair-share", "node-aware")
BENCH_SIM = Path(__file__).resolve().parent / "bench_sim.py"
_COLLECTED = re.compile(r"Collected : (\d+)")


def count(size: str, policy: str, backups: bool, seed: int, repeat: int, pkg: str | None) -> dict:
    """One interpreter under callgrind: ``bench_sim.py``'s child for the case, with
    ``repeat`` simulations (0: only the workload); its JSON line and its ``Ir``."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    if pkg is not None:
        env["PYTHONPATH"] = os.pathsep.join([pkg, *filter(None, [env.get("PYTHONPATH", "")])])
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={tmp}/cg.out",
            sys.executable,  # the interpreter itself, not a shim valgrind would not follow
            str(BENCH_SIM),
            "--case",
            f"{size}:{policy}:{int(backups)}",
            "--seed",
            str(seed),
            "--repeat",
            str(repeat),
        ]
        # from outside the repository, so that PYTHONPATH (not the script's tree) provides
        # daskjobs, as bench_sim's own children do
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd="/")
    if run.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{run.stderr[-3000:]}")
    got: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    if pkg is not None and not got["package"].startswith(str(Path(pkg).resolve())):
        raise RuntimeError(f"--against {pkg}: the child imported {got['package']}")
    m = _COLLECTED.findall(run.stderr)
    if not m:
        raise RuntimeError(f"no instruction count in callgrind's output:\n{run.stderr[-2000:]}")
    got["ir"] = int(m[-1])
    return got


def case(size: str, policy: str, backups: bool, seed: int, pkg: str | None) -> dict:
    """The instructions of one ``simulate`` of the case: an interpreter that simulates
    twice minus one that simulates once. The first run pays for what the code imports
    lazily (a policy's modules), whose cost moves with ``sys.path``; the second is the
    steady state both codes are compared in."""
    once = count(size, policy, backups, seed, 1, pkg)
    twice = count(size, policy, backups, seed, 2, pkg)
    return {**twice, "sim_ir": twice["ir"] - once["ir"], "base_ir": once["ir"]}


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)  # --quick: FIFO and node-aware only
    ap.add_argument("--against", metavar="DIR", required=True, help="a checkout of older code")
    ap.add_argument(
        "--size",
        type=int,
        choices=(10_000, 100_000),
        default=10_000,
        help="the chapter sweep (10,000 tasks) or the 100,000-task sweep of bench_sim --quick",
    )
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated policies")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="cases at a time")
    ap.add_argument("--check", action="store_true", help="also count the first case twice")
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        ap.error("valgrind is not on the path (apt-get install valgrind)")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if args.quick:
        policies = [p for p in policies if p in ("fifo", "node-aware")] or policies[:1]
    size = "chapter" if args.size == 10_000 else "quick"
    cases = [(p, b) for p in policies for b in (False, True)]
    jobs = [(p, b, pkg) for p, b in cases for pkg in (None, args.against)]
    if args.check:
        jobs.append((*cases[0], None))
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = [pool.submit(case, size, p, b, args.seed, pkg) for p, b, pkg in jobs]
        results = [f.result() for f in futures]
    new = {(p, b): r for (p, b, pkg), r in zip(jobs, results, strict=True) if pkg is None}
    old = {(p, b): r for (p, b, pkg), r in zip(jobs, results, strict=True) if pkg is not None}

    rows = []
    ratios = []
    for p, b in cases:
        n, o = new[(p, b)], old[(p, b)]
        tasks = n["tasks"]
        ratio = n["sim_ir"] / o["sim_ir"]
        ratios.append(ratio)
        same = (n["makespan_h"], n["events"]) == (o["makespan_h"], o["events"])
        rows.append(
            [
                p,
                "yes" if b else "no",
                f"{n['sim_ir'] / tasks:,.0f}",
                f"{o['sim_ir'] / tasks:,.0f}",
                f"{ratio:.3f}",
                "yes" if same else "NO",
            ]
        )
    report = harness.Report("Simulator instructions, new against old", __file__, argv)
    report.note(
        f"the chapter sweep of {args.size:,} tasks, seed {args.seed}; against {args.against}"
    )
    report.note(
        "instructions of one simulate() (callgrind Ir, an interpreter that simulates twice minus "
        "one that simulates once), PYTHONHASHSEED=0"
    )
    if args.check:
        again = results[-1]["sim_ir"]
        first = new[cases[0]]["sim_ir"]
        report.note(f"the same case counted twice: {first:,} and {again:,} instructions")
    ordered = sorted(ratios)
    median = (
        ordered[len(ordered) // 2]
        if len(ordered) % 2
        else sum(ordered[len(ordered) // 2 - 1 : len(ordered) // 2 + 1]) / 2
    )
    report.note(f"new / old: median {median:.3f}, range {ordered[0]:.3f}-{ordered[-1]:.3f}")
    report.section(
        None,
        harness.table(
            ["policy", "backups", "new Ir / task", "old Ir / task", "new / old", "same schedule"],
            rows,
            align="llrrrl",
        ),
    )
    labels = [f"{p}{', backups' if b else ''}" for p, b in cases]
    report.chart(
        harness.Chart(
            "simulate() instructions, new / old",
            "new / old (Ir)",
            labels,
            {"new / old": ratios},
            1.0,
        )
    )
    report.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
