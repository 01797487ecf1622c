"""Speculative copies of late tasks on a live dask cluster with slow workers.

Usage::

    python benchmarks/bench_speculation.py            # the grid: 16 workloads (~8 minutes)
    python benchmarks/bench_speculation.py --quick    # 4 workloads of the grid
    python benchmarks/bench_speculation.py --in-process  # the grid, all in one process
    python benchmarks/bench_speculation.py --real-grid   # ... on dask scheduler/worker processes
    python benchmarks/bench_speculation.py --reps 3   # each run 3 times
    python benchmarks/bench_speculation.py --chapter  # the chapter table below (3 seeds)
    python benchmarks/bench_speculation.py --real     # ... and on real processes

**The grid** (issue 16, the default): the full plugin (``JobsPlugin(policy=
"node-aware", speculation=...)``) against plain dask, side by side (alternating, a
fresh ``LocalCluster`` per run, as a user starts one: the scheduler and the client in
this process, each worker a process of its own), on 16 workloads (:data:`GRID`): 400
to 3,200 sleep tasks (median 0.1 s, sigma 0.76, the 4 longest at 30x the median submitted last),
16 to 64 slots (4 or 8 workers of 4 or 8 threads), one or two workers 4x slow,
estimates with ``exp(0.3 z)`` noise or exact, seeds other than the chapter table's,
the sweep submitted as one graph of ``dask.delayed`` calls. For each run: makespan
(first task start to last task end, a task ending with its first attempt to end, as
the chapter table's results do: a losing copy's thread sleeping on is slot-time lost
to copies, not a later end) over the speed bound ``max(work / slot
equivalents, longest task)``, the time from ``client.compute`` to the first task
start and from the last task end to the results in the client's hands, and where the
lost slot-time went (:func:`decompose`: ramp-up, dispatch round trips, idle slots
while work waited, tail, losing copies, tasks overrunning their sleep), read from the
timeline of every attempt (copies and beaten primaries included), which the tasks
log themselves, so that plain dask and the plugin are measured by the same ruler.
Beside each workload, the simulator's ratio for the same policy, speculation settings
and workload (:func:`sim_ratio`), without overhead and with plain dask's median refill
gap of that run as every attempt's overhead: what the policy's decisions reach, and what
they reach once the machine's cost per task is paid. And for the last three tenths of
each run (:func:`end_load`), where longest-first leaves its shortest tasks: task starts
a second, the fast workers' threads idle and the machine's CPUs busy
(:class:`CpuSampler`), which tell a run short of decisions from one short of CPU. Target
(issue 16): the full plugin at or below 1.05x the bound on every workload, and its fixed
costs within 0.1 s of plain dask's. ``--in-process`` runs the same grid with
``processes=False``: the scheduler, the client and every worker thread share one
interpreter, so on a small machine a task's sleep ends late by its wait for the GIL (the
decomposition's *overrun*, 2-4% of the bound at 32 slots): the harness's cost, which no
cluster of worker processes pays. ``--real-grid`` runs it on ``dask scheduler`` and
``dask worker`` processes with dask's default configuration.

**The chapter table** (``--chapter``, issue 5): the laptop-scaled chapter sweep of
``benchmarks/bench_plugin.py`` (32 slots as 4 workers x 8 threads, ``processes=False``,
sleep tasks with durations from
:func:`daskjobs.sim.workloads.chapter` with ``n=832, n_long=4, median=0.1``, the 4
longest at 30x the median and submitted last, estimates with ``exp(0.3 z)`` noise
as ``estimate`` annotations, the sweep submitted as one graph, keys named so that
plain dask's order is the submission order), now with one of the 4 workers 4x
slower: the task sleeps ``duration x 4`` when it runs on that worker
(``distributed.get_worker().name``), so a copy of the same task on a fast worker
is fast.

The cluster delivers ``24 + 8 / 4 = 26`` slot-equivalents, so no schedule beats
``max(work / 26, longest task)``. Makespan (first task start to last task end,
measured inside the tasks; for a task won by a copy, the winning copy's times)
over that bound, on a fresh cluster per run, for:

1. plain dask;
2. plain dask with hand-set longest-first priorities (``dask.annotate(priority=...)``
   ranked by estimate, no plugin);
3. ``JobsPlugin(policy="lpt")``, no speculation;
4. ``JobsPlugin(policy="lpt", speculation={"enabled": True, "late_factor": 2.5,
   "min_runtime": "100ms", "interval": "50ms"})``: backup copies of late tasks, with
   the plugin's learned worker speeds (the slow-worker awareness of today's plugin:
   a task is late after ``late_factor x estimate x believed slow-down`` of its
   worker, and copies go to the fastest believed worker with an idle thread).

With ``--real`` the same sweeps run on a cluster of real processes, as an operator
runs it: ``dask scheduler --preload plugins/daskjobs_scheduler.py`` (the plugin
configured through a dask YAML file) and 4 ``dask worker`` processes of 8 threads
(``w0`` 4x slow), dask's default configuration (active memory manager on), a fresh
cluster per run (``tests/realcluster.py``). Configurations: plain dask (no
preload), plugin LPT, and the full plugin (node-aware + speculation). Each run also
checks what a shared cluster needs: every worker alive at the end, no line in any
process log showing a broken invariant (``realcluster.PROBLEMS``), no swallowed
plugin error, and the sweep's values identical to plain dask's.

Also reported: which worker ran the 4 long tasks (from the task results) and, for
run 4, the plugin's ``status()["speculation"]`` (launched, won, lost, waste) and
its backup events. Target (issue 5): run 4 at or below 1.10x the bound on every
seed. Prints markdown with the command, date and machine. A script, not a test:
nothing here asserts.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import dask
from bench_plugin import SLOTS, machine  # benchmarks/ is on sys.path when run as a script
from distributed import Client, LocalCluster, get_worker

from daskjobs.plugin import JobsPlugin
from daskjobs.sim import workloads

SLOW_WORKER = 0  # the LocalCluster worker name (0..3) that runs 4x slower
SLOW_FACTOR = 4.0
N_LONG = 4
SPECULATION = {"enabled": True, "late_factor": 2.5, "min_runtime": "100ms", "interval": "50ms"}
#: Settings of the grid's node-aware policy (``--policy-option KEY=VALUE``), live and in the
#: simulator column alike; empty: its defaults.
POLICY_OPTIONS: dict[str, Any] = {}
CONFIGS = ("plain", "hand", "lpt", "spec", "aware")
LABELS = {
    "plain": "plain dask",
    "hand": "plain dask, hand-set longest-first priorities",
    "lpt": "plugin LPT, no speculation",
    "spec": "plugin LPT + speculation",
    "aware": "plugin node-aware + speculation",
}
TARGET = 1.10


def nap(seconds: float, slow_worker: int, slow_factor: float) -> tuple[float, float, str]:
    """Sleep ``seconds``, ``slow_factor`` times longer on the slow worker."""
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


def real_graph(seed: int, n: int) -> tuple[list[Any], list[float]]:
    """The sweep of :func:`sweep_graph` for real workers (named ``w0``..``w3``)."""
    w = workloads.chapter(seed, n=n, n_long=N_LONG, median=0.1, sigma=0.76, estimate_noise=0.3)
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


REAL_CONFIGS = ("plain", "lpt", "aware")


def run_sweep_real(seed: int, n: int, config: str, workdir: str) -> dict[str, Any]:
    """One sweep on real processes with dask's defaults; see the module docstring."""
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "tests"))
    from realcluster import RealCluster

    workers, threads = SLOTS
    daskjobs_conf: dict[str, Any] = {}
    if config == "lpt":
        daskjobs_conf = {"policy": "lpt"}
    elif config == "aware":
        spec = {k.replace("_", "-"): v for k, v in SPECULATION.items()}
        daskjobs_conf = {"policy": "node-aware", "speculation": spec}
    path = os.pathsep.join(
        [str(root / "benchmarks"), str(root / "tests"), str(root), os.environ.get("PYTHONPATH", "")]
    )
    rc = RealCluster(
        Path(workdir) / f"seed{seed}-{config}",
        n_workers=workers,
        nthreads=threads,
        preload=None if config == "plain" else "plugins/daskjobs_scheduler.py",
        config={"daskjobs": daskjobs_conf} if daskjobs_conf else None,
        validate=False,  # dask's defaults, as on a production cluster
        env={"PYTHONPATH": path},
    )
    parts, durations = real_graph(seed, n)
    with rc:
        with rc.client() as client:
            t0 = time.time()
            out = client.compute(parts, sync=True)
            wall = time.time() - t0
            status = client.run_on_scheduler(_status) if config != "plain" else None
            alive_seen = len(client.scheduler_info()["workers"])
        alive = sum(rc.alive(f"w{i}") for i in range(workers))
    problems = rc.problems()
    start = min(s for _, s, _, _ in out)
    makespan = max(e for _, _, e, _ in out) - start
    slots = (workers - 1) * threads + threads / SLOW_FACTOR
    bound = max(sum(durations) / slots, max(durations))
    result: dict[str, Any] = {
        "makespan": makespan,
        "wall": wall,
        "bound": bound,
        "ratio": makespan / bound,
        "work": sum(durations),
        "values": [v for v, _, _, _ in out],
        "workers_alive": min(alive, alive_seen),
        "problems": problems,
        "errors": (status or {}).get("errors", {}),
    }
    if status is not None:
        result["speculation"] = status.get("speculation")
    return result


def real_table(rows: list[dict[str, Any]], n: int) -> str:
    workers, threads = SLOTS
    out = [
        "| seed | bound (s) | plain dask | plugin LPT | node-aware + speculation | "
        "copies launched / won / lost / waste | workers alive | log problems | "
        "plugin errors | values = plain dask's |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        cells = [str(r["seed"]), f"{r['plain']['bound']:.2f}"]
        for c in REAL_CONFIGS:
            cells.append(f"{r[c]['makespan']:.2f} s, {r[c]['ratio']:.2f}x")
        a = r["aware"]
        cells.append(_spec_cell(a))
        cells.append(f"{min(r[c]['workers_alive'] for c in REAL_CONFIGS)} / {workers}")
        cells.append(str(sum(len(r[c]["problems"]) for c in REAL_CONFIGS)))
        cells.append(str(sum(sum(r[c]["errors"].values()) for c in REAL_CONFIGS)))
        same = all(r[c]["values"] == r["plain"]["values"] for c in REAL_CONFIGS)
        cells.append("yes" if same else "NO")
        out.append("| " + " | ".join(cells) + " |")
    med = {c: statistics.median(r[c]["ratio"] for r in rows) for c in REAL_CONFIGS}
    worst = {c: max(r[c]["ratio"] for r in rows) for c in REAL_CONFIGS}
    out.append(
        f"\n{n:,} tasks per sweep on {workers} `dask worker` processes x {threads} threads "
        f"(w0 {SLOW_FACTOR:g}x slow), `dask scheduler --preload plugins/daskjobs_scheduler.py`, "
        "dask's default configuration. Makespan / bound, median (worst): "
        + ", ".join(f"{c} {med[c]:.2f} ({worst[c]:.2f})" for c in REAL_CONFIGS)
        + "."
    )
    for r in rows:
        for c in REAL_CONFIGS:
            for line in r[c]["problems"][:5]:
                out.append(f"- seed {r['seed']} {c}: `{line}`")
    return "\n".join(out)


def sweep_real(seeds: list[int], n: int) -> list[dict[str, Any]]:
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-spec-real-") as tmp:
        for seed in seeds:
            row: dict[str, Any] = {"seed": seed}
            for config in REAL_CONFIGS:
                r = run_sweep_real(seed, n, config, tmp)
                row[config] = r
                print(
                    f"  seed {seed} {config} (real processes): {r['makespan']:.2f} s, "
                    f"{r['ratio']:.2f}x, workers alive {r['workers_alive']}, "
                    f"problems {len(r['problems'])}",
                    file=sys.stderr,
                )
            rows.append(row)
    return rows


def sweep_graph(
    seed: int, n: int, *, priorities: bool, slow_worker: int, slow_factor: float
) -> tuple[list[Any], list[float]]:
    w = workloads.chapter(seed, n=n, n_long=N_LONG, median=0.1, sigma=0.76, estimate_noise=0.3)
    # hand-set longest-first: dask runs higher priorities first; rank by estimate
    order = sorted(range(len(w.tasks)), key=lambda i: w.tasks[i].estimate)
    rank = {i: r for r, i in enumerate(order)}
    parts, durations = [], []
    last = len(w.tasks) - 1
    for i, t in enumerate(w.tasks):  # the 4 long tasks come last
        ann: dict[str, Any] = {"estimate": float(t.estimate)}
        if priorities:
            ann["priority"] = rank[i]
        # keys named so that dask's own order is the submission order (bench_plugin.py)
        with dask.annotate(**ann):
            parts.append(
                dask.delayed(nap)(
                    float(t.duration), slow_worker, slow_factor, dask_key_name=f"bt-{last - i:06d}"
                )
            )
        durations.append(float(t.duration))
    return parts, durations


def _backup_events(dask_scheduler: Any) -> list[dict[str, Any]]:
    plugin = dask_scheduler.plugins.get("daskjobs")
    if plugin is None:
        return []
    return [dict(e) for e in plugin.events if str(e.get("action", "")).startswith("backup-")]


def _status(dask_scheduler: Any) -> dict[str, Any] | None:
    plugin = dask_scheduler.plugins.get("daskjobs")
    return None if plugin is None else plugin.status()


def run_sweep(
    seed: int, n: int, config: str, slow_worker: int, slow_factor: float
) -> dict[str, Any]:
    workers, threads = SLOTS
    plugin = None
    if config == "lpt":
        plugin = JobsPlugin(policy="lpt")
    elif config == "spec":
        plugin = JobsPlugin(policy="lpt", speculation=dict(SPECULATION))
    elif config == "aware":
        plugin = JobsPlugin(policy="node-aware", speculation=dict(SPECULATION))
    parts, durations = sweep_graph(
        seed, n, priorities=config == "hand", slow_worker=slow_worker, slow_factor=slow_factor
    )
    with (
        LocalCluster(
            n_workers=workers,
            threads_per_worker=threads,
            processes=False,
            dashboard_address=":0",
            scheduler_kwargs={"plugins": [plugin] if plugin else []},
        ) as cl,
        Client(cl) as client,
    ):
        client.wait_for_workers(workers)
        names = {a: str(w["name"]) for a, w in client.scheduler_info()["workers"].items()}
        t0 = time.time()
        spans = client.compute(parts, sync=True)
        wall = time.time() - t0
        status = client.run_on_scheduler(_status) if plugin else None
        events = client.run_on_scheduler(_backup_events) if plugin else []
    start = min(s for s, _, _ in spans)
    makespan = max(e for _, e, _ in spans) - start
    slots = (workers - 1) * threads + threads / slow_factor
    bound = max(sum(durations) / slots, max(durations))
    longest = sorted(range(len(durations)), key=lambda i: -durations[i])[:N_LONG]
    long_tasks = [
        {
            "duration": durations[i],
            "worker": spans[i][2],
            "start": spans[i][0] - start,
            "end": spans[i][1] - start,
        }
        for i in sorted(longest)
    ]
    out: dict[str, Any] = {
        "makespan": makespan,
        "wall": wall,
        "bound": bound,
        "ratio": makespan / bound,
        "work": sum(durations),
        "long": long_tasks,
    }
    if status is not None:
        out["speculation"] = status.get("speculation")
        out["speeds"] = {
            names.get(w["worker"], w["worker"]): w["speed"]
            for w in status.get("workers", [])
            if "worker" in w
        }
        out["events"] = [
            {
                "action": e["action"],
                "t": e["time"] - start,
                **{
                    k: names.get(e[k], e[k])
                    for k in ("primary", "backup", "winner", "loser")
                    if k in e
                },
                **({"late_by": e["late_by"]} if "late_by" in e else {}),
                "key": e.get("key"),
            }
            for e in events
        ]
    return out


def sweep(seeds: list[int], n: int, slow_worker: int, slow_factor: float) -> list[dict[str, Any]]:
    rows = []
    for seed in seeds:
        row: dict[str, Any] = {"seed": seed}
        for config in CONFIGS:
            r = run_sweep(seed, n, config, slow_worker, slow_factor)
            row[config] = r
            where = ",".join(t["worker"] for t in r["long"])
            print(
                f"  seed {seed} {config}: {r['makespan']:.2f} s, {r['ratio']:.2f}x "
                f"(long tasks on workers {where})",
                file=sys.stderr,
            )
        rows.append(row)
    return rows


def _spec_cell(r: dict[str, Any]) -> str:
    s = r.get("speculation") or {}
    waste = sum((s.get("waste_seconds") or {}).values())
    return (
        f"{s.get('launched', 0)} / {s.get('won', 0)} / {s.get('lost', 0)} / "
        f"{waste:.2f} s ({waste / r['work']:.1%} of work)"
    )


def _long_cell(r: dict[str, Any], slow_worker: int) -> str:
    cells = []
    for t in r["long"]:
        w = t["worker"]
        mark = "*" if w == str(slow_worker) else ""
        cells.append(f"{w}{mark} {t['start']:.1f}-{t['end']:.1f}")
    return ", ".join(cells)


def table(rows: list[dict[str, Any]], n: int, slow_worker: int, slow_factor: float) -> str:
    out = [
        "| seed | bound (s) | plain dask (s) | / bound | hand-set priorities (s) | / bound | "
        "plugin LPT (s) | / bound | LPT + speculation (s) | / bound | "
        "node-aware + speculation (s) | / bound | "
        "copies launched / won / lost / waste (LPT + spec; node-aware + spec) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        cells = [str(r["seed"]), f"{r['plain']['bound']:.2f}"]
        for c in CONFIGS:
            ok = ""
            if c in ("spec", "aware"):
                ok = " ok" if r[c]["ratio"] <= TARGET else " MISS"
            cells += [f"{r[c]['makespan']:.2f}", f"{r[c]['ratio']:.2f}{ok}"]
        cells.append(f"{_spec_cell(r['spec'])}; {_spec_cell(r['aware'])}")
        out.append("| " + " | ".join(cells) + " |")
    med = {c: statistics.median(r[c]["ratio"] for r in rows) for c in CONFIGS}
    workers, threads = SLOTS
    slots = (workers - 1) * threads + threads / slow_factor
    out.append(
        f"\n{n:,} tasks per sweep on {workers} workers x {threads} threads, worker "
        f"{slow_worker} {slow_factor:g}x slow ({slots:g} slot-equivalents); bound = "
        f"max(work / {slots:g}, longest task). Median makespan / bound: "
        + ", ".join(f"{LABELS[c]} {med[c]:.2f}" for c in CONFIGS)
        + f". Target: LPT + speculation <= {TARGET:.2f} on every seed."
    )
    out.append(
        "\nWhere the 4 long tasks ran (worker name, start-end in s from the first start; "
        f"* = the slow worker {slow_worker}):\n"
    )
    out.append("| seed | configuration | long tasks |")
    out.append("|---|---|---|")
    for r in rows:
        for c in CONFIGS:
            out.append(f"| {r['seed']} | {LABELS[c]} | {_long_cell(r[c], slow_worker)} |")
    out.append("\nLPT + speculation, backup events and learned worker speeds:\n")
    for r in rows:
        s = r["spec"]
        speeds = ", ".join(f"{w}: {v:.2f}" for w, v in sorted(s.get("speeds", {}).items()))
        out.append(f"- seed {r['seed']}: believed slow-down at the end {{{speeds}}}")
        for e in s.get("events", []):
            extra = ", ".join(
                f"{k} {e[k]}" for k in ("primary", "backup", "winner", "loser", "late_by") if k in e
            )
            out.append(f"  - t={e['t']:.2f} s {e['action']} {e['key']} ({extra})")
        if not s.get("events"):
            out.append("  - no backup copies")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------
# The grid (issue 16): the full plugin against plain dask on many workloads, side by side
# ---------------------------------------------------------------------------------------

#: Every attempt's (task index, worker name, start, end), appended by the thread that ran
#: it when its sleep returns: losing copies and beaten primaries included. The cluster
#: runs in this process (``processes=False``) and :func:`nap_logged` is imported from
#: this module by name, so the workers append to this very list.
SPANS: list[tuple[int, str, float, float]] = []


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


@dataclass(frozen=True)
class Case:
    """One workload of the grid."""

    n: int
    workers: int
    threads: int
    slow: int  # how many workers run SLOW_FACTOR x slower (the first ones)
    noise: float  # sigma of the estimates' exp(noise z) error; 0: exact estimates
    seed: int

    @property
    def slots(self) -> int:
        return self.workers * self.threads

    @property
    def slot_equivalents(self) -> float:
        return (self.workers - self.slow) * self.threads + self.slow * self.threads / SLOW_FACTOR

    def label(self) -> str:
        est = f"noise {self.noise:g}" if self.noise else "exact"
        return (
            f"{self.n} x {self.workers}x{self.threads}, {self.slow} slow, {est}, seed {self.seed}"
        )


#: 16 workloads: 400-3,200 tasks, 16-64 slots, one or two slow workers, estimates with
#: and without noise, other seeds than the chapter table's. Sizes go with slot counts so
#: that every run is a few seconds (the median task stays 0.1 s, as in the issue).
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
QUICK = (GRID[1], GRID[3], GRID[10], GRID[14])
GRID_CONFIGS = ("plain", "aware")
GRID_TARGET = 1.05


def grid_graph(
    case: Case, spans_file: str | None = None, prefix: str = "w"
) -> tuple[list[Any], list[float]]:
    """The sweep of ``case`` as one graph of ``dask.delayed`` calls (the 4 longest last);
    with ``spans_file``, for worker processes (named ``{prefix}0``, ``{prefix}1``, ...:
    ``w0`` for ``dask worker`` processes, ``0`` for a ``LocalCluster``'s), the attempts
    are logged to that file."""
    w = workloads.chapter(
        case.seed, n=case.n, n_long=N_LONG, median=0.1, sigma=0.76, estimate_noise=case.noise
    )
    import bench_speculation  # by name, so the tasks log into this module's SPANS

    fn: Any = bench_speculation.nap_logged
    slow = tuple(str(i) for i in range(case.slow))
    extra: tuple[Any, ...] = ()
    if spans_file is not None:
        fn = bench_speculation.nap_file
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


def run_end(spans: list[tuple[int, str, float, float]]) -> float:
    """When the last task's result was in: the latest of each task's first attempt to
    end (a losing copy or beaten primary may sleep on after it; dask cannot stop a
    thread)."""
    first_end: dict[int, float] = {}
    for i, _, _, e in spans:
        cur = first_end.get(i)
        first_end[i] = e if cur is None or e < cur else cur
    return max(first_end.values())


def _worker_prefix(spans: list[tuple[int, str, float, float]]) -> str:
    """How the spans name workers: ``w0``, ``w1``, ... for ``dask worker`` processes,
    ``0``, ``1``, ... for a ``LocalCluster``'s."""
    return "w" if any(str(w).startswith("w") for _, w, _, _ in spans) else ""


def decompose(
    spans: list[tuple[int, str, float, float]], durations: list[float], case: Case
) -> dict[str, float]:
    """Where the slot-time of a run went, in slot-equivalent seconds (a slow worker's
    slot counts ``1 / SLOW_FACTOR``, so a task's slot-time is its nominal duration
    wherever it ran). ``capacity = slot_equivalents x makespan`` splits into the work,
    and the lost slot-time:

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
    * ``other``: what remains (rounding, threads over-filled by zombie threads).
    """
    # workers by name: 0, 1, ... in process; w0, w1, ... as real processes
    prefix = _worker_prefix(spans)
    weight = {
        f"{prefix}{w}": (1 / SLOW_FACTOR if w < case.slow else 1.0) for w in range(case.workers)
    }
    t0 = min(s for _, _, s, _ in spans)
    # the first attempt to end per task wins (its result is the task's); the others lost
    winner: dict[int, tuple[int, str, float, float]] = {}
    for sp in spans:
        cur = winner.get(sp[0])
        if cur is None or sp[3] < cur[3]:
            winner[sp[0]] = sp
    # the run ends when the last result is in: a losing attempt's thread that sleeps on
    # (dask cannot stop a thread) is slot-time lost to copies, not a later end
    t_end = run_end(spans)
    spans = [(i, w, s, min(e, t_end)) for i, w, s, e in spans if s < t_end]
    makespan = t_end - t0
    capacity = case.slot_equivalents * makespan
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
    for w in weight:
        mine = [(s, e) for _, ww, s, e in spans if ww == w]
        starts = sorted(s for s, _ in mine)
        ends = sorted(e for _, e in mine)
        nt = case.threads
        # ramp: slot k idle until the k-th start on the worker
        ramp_w = sum(starts[k] - t0 for k in range(min(nt, len(starts))))
        ramp_w += max(nt - len(starts), 0) * makespan
        # idle integral over time, split at last_start, after each slot's first start
        events = [(s, 1) for s in starts] + [(e, -1) for e in ends]
        events.sort()
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


def run_grid_case(case: Case, config: str, spans_dir: str | None = None) -> dict[str, Any]:
    """One run of ``case`` on a fresh ``LocalCluster``: all in this process
    (``processes=False``), or with ``spans_dir``, the workers as processes of their own
    (``LocalCluster``'s default; the scheduler stays in this process), logging their
    attempts to a file under ``spans_dir``; see :func:`grid`."""
    plugin = None
    if config == "aware":
        plugin = JobsPlugin(
            policy="node-aware",
            policy_options=dict(POLICY_OPTIONS),
            speculation=dict(SPECULATION),
        )
    processes = spans_dir is not None
    spans_file = None
    if processes:
        assert spans_dir is not None
        spans_file = os.path.join(spans_dir, f"spans-{case.seed}-{config}-{time.time()}.txt")
    parts, durations = grid_graph(case, spans_file, prefix="")
    with (
        LocalCluster(
            n_workers=case.workers,
            threads_per_worker=case.threads,
            processes=processes,
            dashboard_address=":0",
            scheduler_kwargs={"plugins": [plugin] if plugin else []},
        ) as cl,
        Client(cl) as client,
    ):
        client.wait_for_workers(case.workers)
        import bench_speculation  # the module the tasks log into (not __main__)

        log = bench_speculation.SPANS
        log.clear()
        t_submit = time.time()
        cpu0 = time.process_time()
        with CpuSampler() as machine_cpu:
            out = client.compute(parts, sync=True)
        t_results = time.time()
        cpu = time.process_time() - cpu0
        status = client.run_on_scheduler(_status) if plugin else None
        if spans_file is not None:
            spans = _read_spans(spans_file, t_submit)
        else:
            # a zombie thread of an earlier run's cluster may still append: not this run's
            spans = [sp for sp in log if sp[2] >= t_submit]
    # CPU seconds of this process (client, scheduler, and in process the workers)
    return _grid_result(
        spans, durations, case, t_submit, t_results, len(out), status, machine_cpu, cpu=cpu
    )


def _read_spans(path: str, t_submit: float) -> list[tuple[int, str, float, float]]:
    """The attempts :func:`nap_file` logged to ``path`` since ``t_submit``."""
    spans = []
    with open(path) as f:
        for line in f:
            i, name, t0, t1 = line.split()
            if float(t0) >= t_submit:
                spans.append((int(i), name, float(t0), float(t1)))
    return spans


class CpuSampler:
    """The machine's CPUs busy over time: ``psutil.cpu_times()`` (all CPUs, every
    process, a dependency of distributed) sampled every ``every`` seconds in a thread
    while the ``with`` block runs. On a small machine the scheduler, the workers'
    processes and the client share the CPUs, so a run that asks for more task starts a
    second than the machine can make shows as CPUs near all busy while threads idle."""

    def __init__(self, every: float = 0.05) -> None:
        import threading

        self.every = every
        self.samples: list[tuple[float, float, float]] = []  # (time, total, idle) CPU-s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="cpu-sampler")

    def _sample(self) -> None:
        import psutil

        t = psutil.cpu_times()
        idle = t.idle + getattr(t, "iowait", 0.0)
        self.samples.append((time.time(), sum(t), idle))

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
        import psutil

        return (psutil.cpu_count() or 1) * (1.0 - idle / total)


def end_load(
    spans: list[tuple[int, str, float, float]], case: Case, cpu: CpuSampler | None
) -> dict[str, float]:
    """The last three tenths of a run (first start to the last end, of every attempt):
    task starts a second, the fast workers' threads idle (a fraction), and the machine's
    CPUs busy (NaN without a sampler)."""
    t0 = min(s for _, _, s, _ in spans)
    t1 = max(e for *_, e in spans)
    a = t0 + 0.7 * (t1 - t0)
    span = t1 - a
    prefix = _worker_prefix(spans)
    slow = {f"{prefix}{i}" for i in range(case.slow)}
    busy = sum(max(0.0, min(t1, e) - max(a, s)) for _, w, s, e in spans if w not in slow)
    fast = (case.workers - case.slow) * case.threads
    return {
        "end_starts": sum(1 for _, _, s, _ in spans if s >= a) / span if span > 0 else 0.0,
        "end_idle": 1.0 - busy / (fast * span) if span > 0 else 0.0,
        "end_cpus": cpu.busy(a, t1) if cpu is not None else math.nan,
    }


def _grid_result(
    spans: list[tuple[int, str, float, float]],
    durations: list[float],
    case: Case,
    t_submit: float,
    t_results: float,
    results: int,
    status: dict[str, Any] | None,
    machine_cpu: CpuSampler | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One run's figures: the decomposition, the ratio to the bound, the fixed costs,
    the load in the run's last three tenths (:func:`end_load`)."""
    d = decompose(spans, durations, case)
    d.update(end_load(spans, case, machine_cpu))
    first = min(s for _, _, s, _ in spans)
    last = run_end(spans)
    bound = max(sum(durations) / case.slot_equivalents, max(durations))
    r: dict[str, Any] = {
        **d,
        "bound": bound,
        "ratio": d["makespan"] / bound,
        "wall": t_results - t_submit,
        "to_first": first - t_submit,
        "after_last": t_results - last,
        "results": results,
        **extra,
    }
    if status is not None:
        r["speculation"] = status.get("speculation")
    return r


def run_grid_case_real(case: Case, config: str, workdir: str) -> dict[str, Any]:
    """One run of ``case`` on a fresh cluster of real processes: ``dask scheduler``
    (the plugin preloaded for the full plugin) and ``case.workers`` ``dask worker``
    processes of ``case.threads`` threads, dask's defaults; see :func:`grid`."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "tests"))
    from realcluster import RealCluster

    conf = None
    if config == "aware":
        spec = {k.replace("_", "-"): v for k, v in SPECULATION.items()}
        conf = {
            "daskjobs": {
                "policy": "node-aware",
                "policy-options": dict(POLICY_OPTIONS),
                "speculation": spec,
            }
        }
    path = os.pathsep.join(
        [str(root / "benchmarks"), str(root / "tests"), str(root), os.environ.get("PYTHONPATH", "")]
    )
    here = Path(workdir) / f"{case.seed}-{case.workers}x{case.threads}-{config}-{time.time()}"
    rc = RealCluster(
        here,
        n_workers=case.workers,
        nthreads=case.threads,
        preload=None if config == "plain" else "plugins/daskjobs_scheduler.py",
        config=conf,
        validate=False,  # dask's defaults, as on a production cluster
        env={"PYTHONPATH": path},
    )
    spans_file = str(here / "spans.txt")
    parts, durations = grid_graph(case, spans_file)
    with rc, rc.client() as client:
        t_submit = time.time()
        with CpuSampler() as machine_cpu:
            out = client.compute(parts, sync=True)
        t_results = time.time()
        status = client.run_on_scheduler(_status) if config != "plain" else None
    spans = _read_spans(spans_file, t_submit)
    return _grid_result(
        spans,
        durations,
        case,
        t_submit,
        t_results,
        len(out),
        status,
        machine_cpu,
        cpu=float("nan"),  # spread over the processes
        problems=rc.problems(),
    )


def grid(
    cases: tuple[Case, ...], reps: int, real: str | None = None, processes: str | None = None
) -> list[dict[str, Any]]:
    """Each case, plugin and plain dask alternating (the order flips every case), on a
    fresh cluster per run: of real processes under the directory ``real``, a
    ``LocalCluster`` with worker processes logging under the directory ``processes``,
    else a ``LocalCluster`` in this process."""
    rows = []
    for k, case in enumerate(cases):
        row: dict[str, Any] = {"case": case, "runs": {c: [] for c in GRID_CONFIGS}}
        for rep in range(reps):
            order = GRID_CONFIGS if (k + rep) % 2 == 0 else GRID_CONFIGS[::-1]
            for config in order:
                if real is not None:
                    r = run_grid_case_real(case, config, real)
                else:
                    r = run_grid_case(case, config, processes)
                row["runs"][config].append(r)
                print(
                    f"  {case.label()} {config}: {r['makespan']:.2f} s, {r['ratio']:.3f}x, "
                    f"first start {r['to_first']:.3f} s, wall {r['wall']:.2f} s, "
                    f"CPU {r['cpu']:.2f} s, last 3 tenths: {r['end_starts']:.0f} starts/s, "
                    f"{r['end_idle']:.0%} fast threads idle, {r['end_cpus']:.2f} CPUs busy",
                    file=sys.stderr,
                )
        rows.append(row)
    return rows


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median run by ratio (the upper median with an even count)."""
    return sorted(runs, key=lambda r: r["ratio"])[len(runs) // 2]


def _ratios(runs: list[dict[str, Any]]) -> str:
    return "/".join(f"{r['ratio']:.3f}" for r in runs)


def sim_ratio(case: Case, overhead: float, dispatch_rate: float = 0.0) -> float:
    """The same policy and speculation settings on the same workload in the simulator
    (the workload's true durations, its slow workers as slow nodes), every attempt
    holding its slot ``overhead`` seconds longer (dask's cost per task) and, with a
    ``dispatch_rate``, waiting for a scheduler that starts that many tasks a second:
    what the policy's decisions reach without the live cluster's other costs."""
    from dask.utils import parse_timedelta

    from daskjobs.policies import NodeAware
    from daskjobs.policies.speculation import Speculation
    from daskjobs.sim.engine import simulate
    from daskjobs.sim.model import Cluster

    w = workloads.chapter(
        case.seed, n=case.n, n_long=N_LONG, median=0.1, sigma=0.76, estimate_noise=case.noise
    )
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
    schedule = simulate(w.tasks, cluster, NodeAware(**POLICY_OPTIONS), spec)
    durations = [t.duration for t in w.tasks]
    bound = max(sum(durations) / case.slot_equivalents, max(durations))
    return schedule.makespan / bound


def model_table(rates: list[float]) -> str:
    """The grid in the simulator alone, under a scheduler that starts ``rate`` tasks a
    second (``Cluster.dispatch_rate``; 0: unlimited): the full plugin's policy and
    speculation settings, with ``--policy-option`` settings, by slot count."""
    lines = [
        "| dispatch capacity (tasks/s) | 16 slots | 32 slots | 64 slots | median "
        "| at or below 1.05x |",
        "|---|---|---|---|---:|---:|",
    ]
    for rate in rates:
        ratios = [sim_ratio(case, 0.0, rate) for case in GRID]
        by_slots: dict[int, list[float]] = {}
        for case, r in zip(GRID, ratios, strict=True):
            by_slots.setdefault(case.slots, []).append(r)
        cells = [f"{min(v):.3f}-{max(v):.3f}" for _, v in sorted(by_slots.items())]
        ok = sum(r <= GRID_TARGET for r in ratios)
        label = f"{rate:,.0f}" if rate else "unlimited"
        lines.append(
            f"| {label} | {' | '.join(cells)} | {statistics.median(ratios):.3f} | "
            f"{ok} of {len(ratios)} |"
        )
    return "\n".join(lines)


def grid_table(rows: list[dict[str, Any]], reps: int) -> str:
    out = [
        "| workload (tasks x workers x threads, slow, estimates, seed) | bound (s) | "
        "plain dask / bound | full plugin / bound | simulator / bound, no overhead / "
        "plain dask's refill gap per task | submit to first start, plain / plugin (s) | "
        "last end to results, plain / plugin (s) | wall, plain / plugin (s) | "
        "copies launched / won / lost |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        case = row["case"]
        p = _best(row["runs"]["plain"])
        a = _best(row["runs"]["aware"])
        runs = row["runs"]
        mark = " ok" if max(r["ratio"] for r in row["runs"]["aware"]) <= GRID_TARGET else " MISS"
        s = a.get("speculation") or {}
        gap = statistics.median(r["gap_ms"] for r in runs["plain"]) / 1000
        sim = f"{sim_ratio(case, 0.0):.3f} / {sim_ratio(case, gap):.3f}"
        out.append(
            f"| {case.label()} | {a['bound']:.2f} | {_ratios(runs['plain'])} | "
            f"{_ratios(runs['aware'])}{mark} | {sim} | "
            f"{p['to_first']:.3f} / {a['to_first']:.3f} | "
            f"{p['after_last']:.3f} / {a['after_last']:.3f} | "
            f"{p['wall']:.2f} / {a['wall']:.2f} | "
            f"{s.get('launched', 0)} / {s.get('won', 0)} / {s.get('lost', 0)} |"
        )
    allr = {c: [r["ratio"] for row in rows for r in row["runs"][c]] for c in GRID_CONFIGS}
    fixed = {
        c: [r["to_first"] + r["after_last"] for row in rows for r in row["runs"][c]]
        for c in GRID_CONFIGS
    }
    out.append(
        f"\nMakespan / bound over {len(rows)} workloads x {reps} run(s): full plugin median "
        f"{statistics.median(allr['aware']):.3f}, worst {max(allr['aware']):.3f} "
        f"(target <= {GRID_TARGET:.2f}: "
        f"{sum(r <= GRID_TARGET for r in allr['aware'])} of {len(allr['aware'])} runs); "
        f"plain dask median {statistics.median(allr['plain']):.3f}, worst "
        f"{max(allr['plain']):.3f}. Fixed costs (submission to first start + last end to "
        f"results), median: plain {statistics.median(fixed['plain']):.3f} s, plugin "
        f"{statistics.median(fixed['aware']):.3f} s."
    )
    out.append(
        "\nLost slot-time of the full plugin's runs (the median run per workload), in seconds "
        "of makespan (slot-equivalent seconds / slot-equivalents; they add up to makespan "
        "- work / slot-equivalents):\n"
    )
    out.append(
        "| workload | makespan - work/slots (s) | ramp-up | dispatch (releases x median gap) | "
        "idle while work waited | tail | losing copies | overrun | other |"
    )
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    keys = ("ramp", "dispatch", "waited", "tail", "copies", "overrun", "other")
    tot = {k: 0.0 for k in keys}
    for row in rows:
        case = row["case"]
        a = _best(row["runs"]["aware"])
        se = case.slot_equivalents
        cells = [case.label(), f"{a['lost'] / se:.3f}"]
        for k in keys:
            v = a[k] / se
            tot[k] += v
            cell = f"{v:.3f}"
            if k == "dispatch":
                cell += f" ({a['releases']:.0f} x {a['gap_ms']:.1f} ms)"
            cells.append(cell)
        out.append("| " + " | ".join(cells) + " |")
    out.append(
        "| **sum over workloads** | "
        + f"{sum(tot.values()):.3f} | "
        + " | ".join(f"{tot[k]:.3f}" for k in keys)
        + " |"
    )
    out.append("\nThe same for plain dask (median run per workload):\n")
    out.append(
        "| workload | makespan - work/slots (s) | ramp-up | dispatch | idle while work waited "
        "| tail | losing copies | overrun | other |"
    )
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        case = row["case"]
        p = _best(row["runs"]["plain"])
        se = case.slot_equivalents
        out.append(
            "| "
            + " | ".join(
                [case.label(), f"{p['lost'] / se:.3f}"]
                + [
                    f"{p[k] / se:.3f}"
                    + (f" ({p['releases']:.0f} x {p['gap_ms']:.1f} ms)" if k == "dispatch" else "")
                    for k in keys
                ]
            )
            + " |"
        )
    out.append(end_table(rows))
    return "\n".join(out)


def end_table(rows: list[dict[str, Any]]) -> str:
    """The machine in the last three tenths of each run (:func:`end_load`), plain dask
    and the full plugin (the median run per workload): where longest-first leaves its
    shortest tasks, the load that decides whether the threads can be kept busy."""
    import psutil

    out = [
        f"\nThe last three tenths of each run (median run per workload; the machine has "
        f"{psutil.cpu_count()} CPUs shared by the scheduler, the client and every worker "
        "process): task starts a second, fast workers' threads idle, the machine's CPUs "
        "busy (all processes, `psutil.cpu_times`):\n",
        "| workload | starts/s, plain / plugin | threads idle, plain / plugin "
        "| CPUs busy, plain / plugin |",
        "|---|---:|---:|---:|",
    ]
    for row in rows:
        p = _best(row["runs"]["plain"])
        a = _best(row["runs"]["aware"])
        out.append(
            f"| {row['case'].label()} | {p['end_starts']:.0f} / {a['end_starts']:.0f} | "
            f"{p['end_idle']:.0%} / {a['end_idle']:.0%} | "
            f"{p['end_cpus']:.2f} / {a['end_cpus']:.2f} |"
        )
    return "\n".join(out)


def submit_probe(n: int, reps: int) -> dict[str, list[float]]:
    """Submission to first task start of one sweep of ``n`` tasks (4 workers x 8
    threads, one slow), three ways, alternating on one cluster each: plain dask and the
    full plugin given the graph of ``dask.delayed`` calls (``client.compute``), and the
    full plugin given the same sweep through the sweep API (``Sweep.run``, no store).
    The time includes building nothing on the client but what each call builds itself
    (``Sweep.run`` plans its graph inside the call)."""
    from daskjobs.sweep import Sweep

    case = Case(n, 4, 8, 1, 0.3, 99)
    w = workloads.chapter(case.seed, n=n, n_long=N_LONG, median=0.1, sigma=0.76)
    estimates = {i: float(t.estimate) for i, t in enumerate(w.tasks)}
    import bench_speculation

    log = bench_speculation.SPANS
    out: dict[str, list[float]] = {"plain": [], "plugin": [], "plugin, Sweep.run": []}
    for rep in range(reps):
        for how in out if rep % 2 == 0 else list(out)[::-1]:
            plugin = None
            if how != "plain":
                plugin = JobsPlugin(policy="node-aware", speculation=dict(SPECULATION))
            with (
                LocalCluster(
                    n_workers=case.workers,
                    threads_per_worker=case.threads,
                    processes=False,
                    dashboard_address=":0",
                    scheduler_kwargs={"plugins": [plugin] if plugin else []},
                ) as cl,
                Client(cl) as client,
            ):
                client.wait_for_workers(case.workers)
                if how == "plugin, Sweep.run":
                    sweep = Sweep("probe")
                    sweep.stage(
                        bench_speculation.nap_logged,
                        over=[
                            {"i": i, "seconds": float(t.duration)} for i, t in enumerate(w.tasks)
                        ],
                        params={"slow": ("0",), "slow_factor": SLOW_FACTOR},
                        estimate=lambda p: estimates[p["i"]],
                        cache=False,
                        name="nap",
                    )
                    log.clear()
                    t0 = time.time()
                    sweep.run(client, store=False, progress=False)
                else:
                    parts, _ = grid_graph(case)
                    log.clear()
                    t0 = time.time()
                    client.compute(parts, sync=True)
                first = min(sp[2] for sp in log if sp[2] >= t0)
            out[how].append(first - t0)
            print(f"  submit probe {how}: first start {first - t0:.3f} s", file=sys.stderr)
    return out


def submit_table(out: dict[str, list[float]], n: int) -> str:
    lines = [
        f"Submission to first task start, {n} tasks on 4 workers x 8 threads "
        f"({len(next(iter(out.values())))} runs each, alternating):\n",
        "| submitted as | median (s) | min - max (s) |",
        "|---|---:|---:|",
    ]
    for how, xs in out.items():
        lines.append(f"| {how} | {statistics.median(xs):.3f} | {min(xs):.3f} - {max(xs):.3f} |")
    return "\n".join(lines)


def revision() -> str:
    """The commit measured, and any uncommitted change to the package at run time."""
    root = __file__.rsplit("/benchmarks/", 1)[0] if "/benchmarks/" in __file__ else "."
    try:
        head = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--", "daskjobs"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return "- daskjobs revision: unknown (not a git checkout)"
    changed = [line[3:] for line in dirty if line.strip()]
    extra = f", uncommitted changes in {', '.join(changed)}" if changed else ""
    return f"- daskjobs revision: {head}{extra}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 workloads of the grid (one seed)")
    ap.add_argument("--reps", type=int, default=1, help="runs per workload and configuration")
    ap.add_argument("--cases", default=None, help="grid rows to run, e.g. 0,3,10 (default all)")
    ap.add_argument(
        "--chapter", action="store_true", help="the chapter table (5 configurations) instead"
    )
    ap.add_argument("--sweep-tasks", type=int, default=832, help="tasks per chapter sweep")
    ap.add_argument("--seeds", type=int, default=None, help="chapter seeds (default 3)")
    ap.add_argument("--slow-worker", type=int, default=SLOW_WORKER, help="slow worker's name")
    ap.add_argument("--slow-factor", type=float, default=SLOW_FACTOR)
    ap.add_argument(
        "--real",
        action="store_true",
        help="the chapter table, also on real dask scheduler/worker processes",
    )
    ap.add_argument("--only-real", action="store_true", help="only the real-process runs")
    ap.add_argument(
        "--real-grid",
        action="store_true",
        help="the grid on real dask scheduler/worker processes (dask's defaults)",
    )
    ap.add_argument(
        "--policy-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the grid's node-aware policy (a number), e.g. interleave=0.25 or "
        "dispatch_rate=600; repeatable",
    )
    ap.add_argument(
        "--model",
        default=None,
        metavar="RATES",
        help="only the grid in the simulator, for each dispatch capacity in RATES (tasks "
        "started a second, comma-separated; 0: unlimited), e.g. 0,600,800,1200",
    )
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="the grid on LocalClusters all in this process (processes=False), not with "
        "worker processes (LocalCluster's default, the grid's)",
    )
    ap.add_argument(
        "--submit",
        type=int,
        default=0,
        metavar="REPS",
        help="also time submission to first start (plain, plugin, Sweep.run), REPS runs each",
    )
    args = ap.parse_args(argv)
    for item in args.policy_option:
        key, sep, value = item.partition("=")
        try:
            POLICY_OPTIONS[key.strip().replace("-", "_")] = float(value)
        except ValueError:
            ap.error(f"--policy-option wants KEY=NUMBER, got {item!r}")
        if not sep or not key.strip():
            ap.error(f"--policy-option wants KEY=NUMBER, got {item!r}")
    seeds = list(range(args.seeds or (1 if args.quick else 3)))
    n = args.sweep_tasks
    command = f"- command: python benchmarks/bench_speculation.py {' '.join(sys.argv[1:])}"
    # how many tasks dask keeps on a worker per thread decides the refill round trips
    # (docs/benchmarks.md): say which value ran, and where a non-default one came from
    saturation = dask.config.get("distributed.scheduler.worker-saturation")
    env = os.environ.get("DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION")
    command += f"\n- distributed.scheduler.worker-saturation: {saturation}" + (
        " (DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION)" if env else ""
    )
    if args.only_real:
        real = sweep_real(seeds, n)
        print("## Speculation on real processes\n")
        print(machine())
        print(revision())
        print(command)
        print()
        print(real_table(real, n))
        return 0
    if args.model is not None:
        try:
            rates = [float(x) for x in args.model.split(",")]
        except ValueError:
            ap.error(f"--model wants dispatch capacities (numbers >= 0), got {args.model!r}")
        if not all(math.isfinite(r) and r >= 0 for r in rates):
            ap.error(f"--model wants dispatch capacities (numbers >= 0), got {args.model!r}")
        print("## Speculation: the grid in the simulator, by dispatch capacity\n")
        print(machine())
        print(revision())
        print(command.rstrip())
        print()
        print(model_table(rates))
        return 0
    if not (args.chapter or args.real):
        cases = QUICK if args.quick else GRID
        if args.cases:
            cases = tuple(GRID[int(k)] for k in args.cases.split(","))
        print(f"grid: {len(cases)} workloads x {args.reps} run(s) ...", file=sys.stderr)
        if args.in_process and not args.real_grid:
            rows = grid(cases, args.reps)
        else:
            import tempfile

            with tempfile.TemporaryDirectory(prefix="bench-spec-") as tmp:
                if args.real_grid:
                    rows = grid(cases, args.reps, real=tmp)
                else:
                    rows = grid(cases, args.reps, processes=tmp)
        where = (
            " (real dask scheduler and worker processes)"
            if args.real_grid
            else " (LocalCluster, all in one process)"
            if args.in_process
            else " (LocalCluster with worker processes)"
        )
        print(
            "## Speculation: the full plugin against plain dask on a grid of workloads"
            + where
            + "\n"
        )
        print(machine())
        print(revision())
        print(command.rstrip())
        print()
        print(grid_table(rows, args.reps))
        if args.submit:
            print()
            print(submit_table(submit_probe(800, args.submit), 800))
        return 0
    print(f"chapter sweep with a slow worker: {n} tasks, seeds {seeds} ...", file=sys.stderr)
    rows = sweep(seeds, n, args.slow_worker, args.slow_factor)

    print("## Speculation\n")
    print(machine())
    print(revision())
    print(command.rstrip())
    print("\n### The chapter sweep on 32 slots, one worker 4x slow: makespan over the bound\n")
    print(table(rows, n, args.slow_worker, args.slow_factor))
    if args.real:
        real = sweep_real(seeds, n)
        print("\n### The same sweeps on real processes, dask's default configuration\n")
        print(real_table(real, n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
