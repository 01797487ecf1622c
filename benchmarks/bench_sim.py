"""Simulator throughput: how many tasks per second ``simulate`` gets through.

Usage::

    python benchmarks/bench_sim.py                 # chapter sweep + the million-task sweep
    python benchmarks/bench_sim.py --quick         # chapter sweep + a 100,000-task sweep
    python benchmarks/bench_sim.py --runs 3        # best of 3 fresh interpreters per case
    python benchmarks/bench_sim.py --against /tmp/sim-old   # old code side by side
    python benchmarks/bench_sim.py --against /tmp/sim-old --paired --runs 4  # ... at once
    python benchmarks/bench_sim.py --profile node-aware:backups   # cProfile one case

Two workloads from :mod:`daskjobs.sim.workloads`, every policy (FIFO, LPT, critical
path, work stealing, fair share, node-aware) with and without backups:

* the chapter sweep (10,000 tasks, 384 cores); target: well under a second per
  run (each run is repeated, ``--repeat``, best of, because it is short);
* a sweep of 1,000,000 tasks on 38,400 cores (2,400 nodes x 16;
  ``chapter(n=1_000_000, n_long=4000, nodes=2400, cores_per_node=16)``);
  target: >= 100,000 tasks/s for every policy, with and without backups.

Each case runs in a fresh interpreter (this script again, with a hidden
``--case`` option): a run of a million tasks leaves a heap of a million freed
records behind, and a case measured after another would pay for its
predecessor's garbage. ``--runs N`` starts N interpreters per case and keeps the
best (other work on the machine only ever slows a run down). Only ``simulate``
is timed (wall clock, ``time.perf_counter``), not task generation; a fresh
policy object per run.

``--against DIR`` runs every case a second time with the ``daskjobs`` package of
``DIR`` (a checkout of older code, e.g. ``git worktree add /tmp/sim-old
<commit>``), interleaved with the current code's runs so that both see the same
load, and adds the old rate and the ratio new / old to the table. On a shared machine
whose speed moves by 10-30% within minutes, interleaving is not enough for changes of a
few percent: ``--paired`` runs the two at the same time instead, each child pinned to a
CPU of its own (CPUs 0 and 1, swapped every run), and adds the median of the runs' ratios
and their range (four runs: a spread of a few percent where sequential best-of runs
moved by ten). Paired times share the memory bus and the caches, so they are slower than
a lone run's: read the ratio, not the rates, in that mode.

Prints a markdown table and the machine, date and command. With FIFO among the
policies, a column gives each rate over FIFO's measured in the same run (same
workload, same backups setting), and with ``--against`` the old code's likewise:
absolute rates move with the machine's load, these ratios much less. A case that misses
its target is marked ``MISS``; with ``--profile POLICY[:backups]`` (or
``--profile-misses``) it is run again under cProfile and the top functions by
own time are printed.

This is a script, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness

POLICIES = ("fifo", "lpt", "critical-path", "work-stealing", "fair-share", "node-aware")
BIG_TARGET = 100_000.0  # tasks/s, every policy, with and without backups
CHAPTER_TARGET_S = 1.0
HERE = Path(__file__).resolve()
REPO = HERE.parent.parent


# -- one case, in this (fresh) interpreter ---------------------------------------------------
def _workload(kind: str, seed: int) -> Any:
    try:
        from daskjobs.sim import workloads
    except ImportError:  # --against a checkout from before workloads moved under sim/
        from daskjobs import workloads  # type: ignore[no-redef]

    if kind == "chapter":
        return workloads.chapter(seed)
    n, n_long, nodes = {
        "big": (1_000_000, 4000, 2400),
        "quick": (100_000, 400, 240),
    }[kind]
    return workloads.chapter(seed, n=n, n_long=n_long, nodes=nodes, cores_per_node=16)


def _policy(name: str, team: str) -> Any:
    from daskjobs.policies import FairShare, make_policy

    if name == "fair-share":  # one team: the sweep's
        return FairShare({team: 1.0})
    return make_policy(name)


def run_case(
    kind: str, name: str, backups: bool, seed: int, repeat: int, prof: bool
) -> dict[str, Any]:
    """Simulate one case ``repeat`` times (best of); the figures as a dict."""
    import gc
    import time

    from daskjobs.sim import simulate

    t0 = time.perf_counter()
    w = _workload(kind, seed)
    gen = time.perf_counter() - t0
    spec = w.spec if backups else None
    team = w.tasks[0].team
    best = float("inf")
    makespan_h, events = float("nan"), 0
    profile_text = ""
    for _ in range(repeat):
        policy = _policy(name, team)
        gc.collect()  # start each run from a clean heap: no garbage of the previous one
        if prof:
            import cProfile
            import io
            import pstats

            p = cProfile.Profile()
            p.enable()
        t0 = time.perf_counter()
        s = simulate(w.tasks, w.cluster, policy, spec=spec, seed=w.seed)
        best = min(best, time.perf_counter() - t0)
        if prof:
            p.disable()
            out = io.StringIO()
            pstats.Stats(p, stream=out).sort_stats("tottime").print_stats(20)
            profile_text = out.getvalue()
        makespan_h, events = s.makespan_h, s.events
        del s, policy
    import daskjobs

    return {
        "tasks": len(w.tasks),
        "cores": w.cluster.total_cores,
        "seconds": best,
        "makespan_h": makespan_h,
        "events": events,
        "generate_s": gen,
        "package": str(Path(daskjobs.__file__).parent),
        "profile": profile_text,
    }


# -- the driver -------------------------------------------------------------------------------
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
    old_seconds: float | None = None
    same: bool | None = None  # the old code's makespan and event count equal
    paired: list[float] = field(default_factory=list)  # --paired: old s / new s per round

    @property
    def rate(self) -> float:
        return self.tasks / self.seconds if self.seconds else float("inf")

    @property
    def old_rate(self) -> float | None:
        if self.old_seconds is None:
            return None
        return self.tasks / self.old_seconds if self.old_seconds else float("inf")

    @property
    def ok(self) -> bool:
        if self.target is None:
            return self.seconds < CHAPTER_TARGET_S
        return self.rate >= self.target


def _child_cmd(
    kind: str,
    name: str,
    backups: bool,
    seed: int,
    repeat: int,
    *,
    package_dir: str | None = None,
    prof: bool = False,
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of a child running one case; ``package_dir``
    puts another checkout's ``daskjobs`` first on the path."""
    env = dict(os.environ)
    if package_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [package_dir, *filter(None, [env.get("PYTHONPATH", "")])]
        )
    cmd = [
        sys.executable,
        str(HERE),
        "--case",
        f"{kind}:{name}:{int(backups)}",
        "--seed",
        str(seed),
        "--repeat",
        str(repeat),
    ]
    if prof:
        cmd.append("--case-profile")
    return cmd, env


def _child_result(stdout: str, package_dir: str | None) -> dict[str, Any]:
    got: dict = json.loads(stdout.strip().splitlines()[-1])
    if package_dir is not None and not got["package"].startswith(str(Path(package_dir).resolve())):
        raise RuntimeError(f"--against {package_dir}: the child imported {got['package']}")
    return got


def child(*case: Any, package_dir: str | None = None, prof: bool = False) -> dict[str, Any]:
    """Run one case (``kind, name, backups, seed, repeat``, as :func:`_child_cmd` takes
    them) in a fresh interpreter; ``package_dir`` puts another checkout's ``daskjobs``
    first on the path."""
    cmd, env = _child_cmd(*case, package_dir=package_dir, prof=prof)
    # run from outside the repository, so that `package_dir` (not the working
    # tree on the path of a script run from the repo root) provides daskjobs
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd="/")
    return _child_result(out.stdout, package_dir)


def paired_children(
    kind: str, name: str, backups: bool, seed: int, repeat: int, package_dir: str, swap: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The new code and the code in ``package_dir`` on the same case *at the same time*,
    each child pinned to a CPU of its own (CPU 0 and 1, swapped with ``swap``): both
    see the same load, so their ratio holds still where sequential runs on a shared
    machine move by 10-30%. Their absolute times are not a single run's (the two share
    the memory bus and the caches)."""
    cpus = (1, 0) if swap else (0, 1)
    procs = []
    for cpu, pkg in zip(cpus, (None, package_dir), strict=True):
        cmd, env = _child_cmd(kind, name, backups, seed, repeat, package_dir=pkg)
        procs.append(
            (
                subprocess.Popen(
                    cmd,
                    env=env,
                    cwd="/",
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    preexec_fn=lambda cpu=cpu: os.sched_setaffinity(0, {cpu}),  # type: ignore[misc]
                ),
                pkg,
            )
        )
    got = []
    try:
        for proc, pkg in procs:
            out, err = proc.communicate()
            if proc.returncode:
                raise subprocess.CalledProcessError(proc.returncode, proc.args, out, err)
            got.append(_child_result(out, pkg))
    finally:
        for proc, _ in procs:  # one failed: do not leave the other running
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return got[0], got[1]


def _vs_fifo(rows: list[Row], old: bool = False) -> dict[int, float]:
    """Each row's rate over FIFO's in the same workload and backups setting (rows of
    this run only: FIFO measured beside the policy), by row position."""
    rate = (lambda r: r.old_rate) if old else (lambda r: r.rate)
    fifo = {(r.workload, r.backups): rate(r) for r in rows if r.policy == "fifo"}
    out = {}
    for k, r in enumerate(rows):
        base = fifo.get((r.workload, r.backups))
        if base and rate(r):
            out[k] = rate(r) / base
    return out


def table(rows: list[Row], against: bool) -> str:
    vs = _vs_fifo(rows)
    vs_old = _vs_fifo(rows, old=True) if against else {}
    head = "| workload | tasks | cores | policy | backups | simulate s | tasks/s "
    rule = "|---|---:|---:|---|---|---:|---:"
    if vs:
        head += "| / FIFO "
        rule += "|---:"
    if against:
        head += "| old tasks/s " + ("| old / FIFO " if vs else "") + "| new / old "
        rule += "|---:" + ("|---:" if vs else "") + "|---:"
    paired = any(r.paired for r in rows)
    if paired:
        head += "| paired new / old "
        rule += "|---:"
    head += "| makespan h | events | target |"
    rule += "|---:|---:|---|"
    lines = [head, rule]
    for k, r in enumerate(rows):
        target = f"< {CHAPTER_TARGET_S:g} s" if r.target is None else f">= {r.target:,.0f}/s"
        mark = "ok" if r.ok else "MISS"
        line = (
            f"| {r.workload} | {r.tasks:,} | {r.cores:,} | {r.policy} | "
            f"{'yes' if r.backups else 'no'} | {r.seconds:.3f} | {r.rate:,.0f} "
        )
        if vs:
            line += f"| {vs[k]:.2f} " if k in vs else "| - "
        if against:
            old = r.old_rate
            ratio = f"{r.rate / old:.2f}x" if old else "-"
            if r.same is False:
                ratio += " (schedule differs!)"
            line += f"| {old:,.0f} " if old else "| - "
            if vs:
                line += f"| {vs_old[k]:.2f} " if k in vs_old else "| - "
            line += f"| {ratio} " if old else "| - "
        if paired:
            line += f"| {_paired_text(r.paired)} "
        line += f"| {r.makespan_h:.2f} | {r.events:,} | {target} {mark} |"
        lines.append(line)
    return "\n".join(lines)


def chart(rows: list[Row]) -> harness.Chart:
    """Tasks a second per policy, one bar per workload and backups setting."""
    policies = list(dict.fromkeys(r.policy for r in rows))
    series: dict[str, list[float]] = {}
    for r in rows:
        label = f"{r.workload}{', backups' if r.backups else ''}"
        series.setdefault(label, [0.0] * len(policies))[policies.index(r.policy)] = r.rate / 1e3
    return harness.Chart("simulate() throughput", "thousand tasks/s", policies, series)


def _paired_text(ratios: list[float]) -> str:
    """Median of the paired rounds' speed-ups, and their range."""
    if not ratios:
        return "-"
    med = statistics.median(ratios)
    if len(ratios) == 1:
        return f"{med:.3f}x"
    return f"{med:.3f}x ({min(ratios):.3f}-{max(ratios):.3f})"


def _parse_profile(spec: str) -> tuple[str, bool]:
    name, _, flag = spec.partition(":")
    if name not in POLICIES or flag not in ("", "backups"):
        raise SystemExit(f"--profile: expected POLICY or POLICY:backups, got {spec!r}")
    return name, flag == "backups"


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)  # --quick: the big sweep of 100,000 tasks, not 1M
    ap.add_argument("--repeat", type=int, default=3, help="chapter runs per interpreter (best of)")
    ap.add_argument(
        "--runs", type=int, default=1, help="fresh interpreters per case (best of; default 1)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help="comma-separated policies (default: all)",
    )
    ap.add_argument("--no-backups-big", action="store_true", help="big sweep without backups only")
    ap.add_argument("--no-chapter", action="store_true", help="skip the chapter sweep")
    ap.add_argument(
        "--against",
        metavar="DIR",
        help="also run every case with the daskjobs package in DIR (old code), interleaved",
    )
    ap.add_argument(
        "--paired",
        action="store_true",
        help="with --against: run the new and the old code at the same time, one per CPU "
        "(CPUs 0 and 1, swapped each run), and report the median ratio of the rounds",
    )
    ap.add_argument(
        "--profile", action="append", default=[], metavar="POLICY[:backups]", type=_parse_profile
    )
    ap.add_argument("--profile-misses", action="store_true")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--case-profile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.case:  # a child: one case, its figures as one JSON line
        kind, name, backups = args.case.split(":")
        got = run_case(kind, name, backups == "1", args.seed, args.repeat, args.case_profile)
        print(json.dumps(got))
        return 0

    if args.paired:
        if not args.against:
            ap.error("--paired needs --against DIR (the code to pair the new code with)")
        getaff = getattr(os, "sched_getaffinity", None)
        if getaff is None or not {0, 1} <= getaff(0):
            ap.error("--paired needs CPUs 0 and 1 and os.sched_setaffinity (Linux)")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    big = "quick" if args.quick else "big"
    cases: list[tuple[str, str, bool]] = []
    if not args.no_chapter:
        cases += [("chapter", p, b) for p in policies for b in (False, True)]
    cases += [
        (big, p, b) for p in policies for b in ((False,) if args.no_backups_big else (False, True))
    ]
    new: dict[tuple[str, str, bool], dict] = {}
    old: dict[tuple[str, str, bool], dict] = {}
    pairs: dict[tuple[str, str, bool], list[float]] = {}  # --paired: old s / new s per run
    gen = 0.0
    for run in range(args.runs):
        for case in cases:
            kind, name, backups = case
            repeat = args.repeat if kind == "chapter" else 1
            versions: list[tuple[dict, str | None]] = [(new, None)]
            if args.against:
                versions.append((old, args.against))
            if run % 2:  # alternate which code runs first
                versions.reverse()
            if args.paired:
                a, b = paired_children(
                    kind, name, backups, args.seed, repeat, args.against, swap=bool(run % 2)
                )
                pairs.setdefault(case, []).append(b["seconds"] / a["seconds"])
                outcomes: list[tuple[dict, dict]] = [(new, a), (old, b)]
            else:
                outcomes = [
                    (store, child(kind, name, backups, args.seed, repeat, package_dir=pkg))
                    for store, pkg in versions
                ]
            for store, got in outcomes:
                if kind != "chapter":
                    gen = got["generate_s"]
                if case not in store or got["seconds"] < store[case]["seconds"]:
                    store[case] = got
            msg = f"  run {run + 1}: {kind} {name} backups={backups}: {new[case]['seconds']:.3f} s"
            if args.against:
                msg += f" (old {old[case]['seconds']:.3f} s)"
            print(msg, file=sys.stderr)

    rows: list[Row] = []
    for case in cases:
        kind, name, backups = case
        g = new[case]
        r = Row(
            "chapter" if kind == "chapter" else "chapter, 1M" if kind == "big" else "chapter, 100k",
            g["tasks"],
            g["cores"],
            name,
            backups,
            g["seconds"],
            g["makespan_h"],
            g["events"],
            None if kind == "chapter" else BIG_TARGET,
        )
        if args.against:
            o = old[case]
            r.old_seconds = o["seconds"]
            r.same = (o["makespan_h"], o["events"]) == (g["makespan_h"], g["events"])
            r.paired = pairs.get(case, [])
        rows.append(r)

    report = harness.Report("Simulator throughput", __file__, argv)
    report.note(
        f"every case in a fresh interpreter, best of {args.runs} "
        f"({'interleaved with the old code, ' if args.against else ''}"
        f"chapter runs best of {args.repeat} within it)"
    )
    if args.paired:
        report.note(
            "paired: each run, the new and the old code at the same time, one per CPU "
            "(swapped each run); the two share the memory bus and the caches, so their "
            "times are not a lone run's: read the paired ratio (median of the runs, range), "
            "not the rates, against the other code"
        )
    if gen:
        report.note(f"big sweep generation (not timed): {gen:.1f} s")
    report.section(None, table(rows, bool(args.against)))
    report.chart(chart(rows))
    to_profile = list(args.profile)
    if args.profile_misses:
        to_profile += [(r.policy, r.backups) for r in rows if r.target is not None and not r.ok]
    for name, backups in to_profile:
        got = child(big, name, backups, args.seed, 1, prof=True)
        report.section(
            f"cProfile: {name}, backups={backups}, {got['tasks']:,} tasks",
            "```\n" + got["profile"].rstrip() + "\n```",
        )
    report.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
