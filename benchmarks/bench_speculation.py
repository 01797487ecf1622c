"""Speculative copies of late tasks on a live dask cluster with one slow worker.

Usage::

    python benchmarks/bench_speculation.py            # 3 seeds, 4 configurations (a few minutes)
    python benchmarks/bench_speculation.py --quick    # 1 seed

The laptop-scaled chapter sweep of ``benchmarks/bench_plugin.py`` (32 slots as 4
workers x 8 threads, ``processes=False``, sleep tasks with durations from
:func:`daskjobs.workloads.chapter` with ``n=832, n_long=4, median=0.1``, the 4
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
import statistics
import subprocess
import sys
import time
from typing import Any

import dask
from bench_plugin import SLOTS, machine  # benchmarks/ is on sys.path when run as a script
from distributed import Client, LocalCluster, get_worker

from daskjobs import workloads
from daskjobs.plugin import JobsPlugin

SLOW_WORKER = 0  # the LocalCluster worker name (0..3) that runs 4x slower
SLOW_FACTOR = 4.0
N_LONG = 4
SPECULATION = {"enabled": True, "late_factor": 2.5, "min_runtime": "100ms", "interval": "50ms"}
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
    ap.add_argument("--quick", action="store_true", help="one seed")
    ap.add_argument("--sweep-tasks", type=int, default=832, help="tasks per chapter sweep")
    ap.add_argument("--seeds", type=int, default=None, help="number of seeds (default 3)")
    ap.add_argument("--slow-worker", type=int, default=SLOW_WORKER, help="slow worker's name")
    ap.add_argument("--slow-factor", type=float, default=SLOW_FACTOR)
    ap.add_argument(
        "--real",
        action="store_true",
        help="also run on real dask scheduler/worker processes with dask's defaults",
    )
    ap.add_argument("--only-real", action="store_true", help="only the real-process runs")
    args = ap.parse_args(argv)
    seeds = list(range(args.seeds or (1 if args.quick else 3)))
    n = args.sweep_tasks
    if args.only_real:
        real = sweep_real(seeds, n)
        print("## Speculation on real processes\n")
        print(machine())
        print(revision())
        print(f"- command: python benchmarks/bench_speculation.py {' '.join(sys.argv[1:])}")
        print()
        print(real_table(real, n))
        return 0
    print(f"chapter sweep with a slow worker: {n} tasks, seeds {seeds} ...", file=sys.stderr)
    rows = sweep(seeds, n, args.slow_worker, args.slow_factor)

    print("## Speculation\n")
    print(machine())
    print(revision())
    print(f"- command: python benchmarks/bench_speculation.py {' '.join(sys.argv[1:])}".rstrip())
    print("\n### The chapter sweep on 32 slots, one worker 4x slow: makespan over the bound\n")
    print(table(rows, n, args.slow_worker, args.slow_factor))
    if args.real:
        real = sweep_real(seeds, n)
        print("\n### The same sweeps on real processes, dask's default configuration\n")
        print(real_table(real, n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
