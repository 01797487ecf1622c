"""The simulator's cost in instructions, new code against old: a count load barely moves.

Usage::

    git worktree add /tmp/sim-old <commit>
    python benchmarks/bench_sim_instructions.py --against /tmp/sim-old   # chapter, 10,000 tasks
    python benchmarks/bench_sim_instructions.py --against /tmp/sim-old --size 100000
    python benchmarks/bench_sim_instructions.py --against /tmp/sim-old --quick  # 2 policies
    python benchmarks/bench_sim_instructions.py --quick   # this checkout's counts alone

On a shared 2-CPU machine the wall time of a run moves by 10-40% between
interpreters (benchmarks/NOTES.md), so ``bench_sim.py --against`` cannot tell a change
of a few percent. This script counts what the code does instead: each case of
``bench_sim.py`` (a policy, with or without backups) runs under valgrind's callgrind in
a fresh interpreter that builds the workload and simulates it ``--runs`` times, each
``simulate`` call between two calls of ``time.perf_counter_ns``, which nothing else
calls: callgrind dumps its counters at each (``--dump-before``), so a dump holds the
instructions of one ``simulate`` alone (callgrind's ``Ir``), without the interpreter's
start, the imports or the workload. The first run also pays for what the code imports
lazily; the figure is the median of the others (the steady state both codes are compared
in). With ``PYTHONHASHSEED=0`` the counts are the same in every interpreter, to the
instruction; from one run to the next within an interpreter they move by 0.1-0.3% (the
state of the heap the previous run left), which ``--check`` prints (the first case's
runs). A change in the code moves the heap's layout by as much, so read a ratio as a
difference only beyond that. An instruction count does not see cache misses or memory
stalls: read it beside ``bench_sim.py``'s times, not instead of them.

Each column: instructions a task (``Ir`` / tasks), for the new code and for the code in
``--against``, their ratio (below 1: the new code does less), and whether the two
schedules are the same (makespan and event count); without ``--against``, this
checkout's instructions a task and its schedule's figures alone. Needs ``valgrind`` on the path.
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
_SUMMARY = re.compile(r"^summary: (\d+)", re.M)

# The child: bench_sim's workload and policy for the case, each simulate() between two
# perf_counter_ns() calls (the markers callgrind dumps at), then the schedule's figures.
_CHILD = """
import gc, json, sys, time
sys.path.insert(0, sys.argv[1])
import bench_sim
import daskjobs
from daskjobs.sim import simulate
kind, name, backups, seed, runs = sys.argv[2:7]
w = bench_sim._workload(kind, int(seed))
spec = w.spec if backups == "1" else None
team = w.tasks[0].team
for _ in range(int(runs)):
    policy = bench_sim._policy(name, team)
    gc.collect()
    time.perf_counter_ns()
    s = simulate(w.tasks, w.cluster, policy, spec=spec, seed=w.seed)
    time.perf_counter_ns()
print(json.dumps({"tasks": len(w.tasks), "makespan_h": s.makespan / 3600,
                  "events": s.events, "package": daskjobs.__file__}))
"""


def count(size: str, policy: str, backups: bool, seed: int, runs: int, pkg: str | None) -> dict:
    """One interpreter under callgrind: the case simulated ``runs`` times; its JSON line,
    and ``irs``, the instructions of each ``simulate``."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    if pkg is not None:
        env["PYTHONPATH"] = os.pathsep.join([pkg, *filter(None, [env.get("PYTHONPATH", "")])])
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--dump-before=time_perf_counter_ns",
            f"--callgrind-out-file={tmp}/cg.out",
            sys.executable,  # the interpreter itself, not a shim valgrind would not follow
            "-c",
            _CHILD,
            str(BENCH_SIM.parent),
            size,
            policy,
            str(int(backups)),
            str(seed),
            str(runs),
        ]
        # from outside the repository, so that PYTHONPATH (not the script's tree) provides
        # daskjobs, as bench_sim's own children do
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd="/")
        if run.returncode:
            raise RuntimeError(f"{' '.join(cmd[:5])} ... failed:\n{run.stderr[-3000:]}")
        # dump k holds what ran since dump k - 1: the even ones are the simulate() calls
        dumps = sorted(Path(tmp).glob("cg.out.*"), key=lambda p: int(p.suffix[1:]))
        irs = []
        for d in dumps:
            if int(d.suffix[1:]) % 2 == 0:
                m = _SUMMARY.search(d.read_text(errors="replace"))
                if m is None:
                    raise RuntimeError(f"no instruction count in {d.name}")
                irs.append(int(m.group(1)))
    got: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    if len(irs) != runs:
        raise RuntimeError(f"{runs} simulate() runs, {len(irs)} counted: is the marker called?")
    if pkg is not None and not got["package"].startswith(str(Path(pkg).resolve())):
        raise RuntimeError(f"--against {pkg}: the child imported {got['package']}")
    got["irs"] = irs
    return got


def case(size: str, policy: str, backups: bool, seed: int, runs: int, pkg: str | None) -> dict:
    """The instructions of one ``simulate`` of the case: the median of the runs after the
    first (which pays for lazy imports)."""
    got = count(size, policy, backups, seed, runs, pkg)
    steady = sorted(got["irs"][1:])
    k = len(steady)
    median = steady[k // 2] if k % 2 else (steady[k // 2 - 1] + steady[k // 2]) // 2
    return {**got, "sim_ir": median}


def _alone(cases: list[tuple[str, bool]], new: dict) -> str:
    """The table of this checkout's counts, without a checkout to compare against."""
    rows = [
        [
            p,
            "yes" if b else "no",
            f"{new[(p, b)]['sim_ir'] / new[(p, b)]['tasks']:,.0f}",
            f"{new[(p, b)]['sim_ir']:,}",
            f"{new[(p, b)]['makespan_h']:.2f}",
            f"{new[(p, b)]['events']:,}",
        ]
        for p, b in cases
    ]
    return harness.table(
        ["policy", "backups", "Ir / task", "Ir", "makespan h", "events"], rows, align="llrrrr"
    )


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)  # --quick: FIFO and node-aware only
    ap.add_argument(
        "--against", metavar="DIR", help="a checkout of older code (without: this one's alone)"
    )
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
    ap.add_argument(
        "--runs", type=int, default=3, help="simulate() runs a case (>= 2: the first is left out)"
    )
    ap.add_argument("--check", action="store_true", help="print the first case's counts run by run")
    args = ap.parse_args(argv)
    if args.runs < 2:
        ap.error("--runs must be at least 2 (the first run pays for lazy imports)")
    if shutil.which("valgrind") is None:
        ap.error("valgrind is not on the path (apt-get install valgrind)")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if args.quick:
        policies = [p for p in policies if p in ("fifo", "node-aware")] or policies[:1]
    size = "chapter" if args.size == 10_000 else "quick"
    cases = [(p, b) for p in policies for b in (False, True)]
    pkgs = (None, args.against) if args.against else (None,)
    jobs = [(p, b, pkg) for p, b in cases for pkg in pkgs]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = [pool.submit(case, size, p, b, args.seed, args.runs, pkg) for p, b, pkg in jobs]
        results = [f.result() for f in futures]
    new = {(p, b): r for (p, b, pkg), r in zip(jobs, results, strict=True) if pkg is None}
    old = {(p, b): r for (p, b, pkg), r in zip(jobs, results, strict=True) if pkg is not None}
    title = "Simulator instructions, new against old" if old else "Simulator instructions"
    report = harness.Report(title, __file__, argv)
    against = f"; against {args.against}" if old else ""
    report.note(f"the chapter sweep of {args.size:,} tasks, seed {args.seed}{against}")
    report.note(
        f"instructions of one simulate() (callgrind Ir between markers, the median of runs 2-"
        f"{args.runs} in one interpreter), PYTHONHASHSEED=0"
    )
    if args.check:
        irs = ", ".join(f"{x:,}" for x in new[cases[0]]["irs"])
        report.note(f"{cases[0][0]}: the new code's runs one by one: {irs} instructions")
    labels = [f"{p}{', backups' if b else ''}" for p, b in cases]
    if not old:
        report.section(None, _alone(cases, new))
        per_task = [new[c]["sim_ir"] / new[c]["tasks"] for c in cases]
        report.chart(
            harness.Chart("simulate() instructions", "Ir / task", labels, {"Ir": per_task})
        )
        report.emit(args)
        return 0

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
