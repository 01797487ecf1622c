"""The chapter sweep on 32 slots with one worker 4x slow, five configurations.

The laptop-scaled chapter sweep (:mod:`speculation.workload`: 832 sleep tasks by
default, the 4 longest at 30x the median and submitted last) on a ``LocalCluster`` of
4 workers x 8 threads in this process (``processes=False``), worker 0 4x slow. The
cluster delivers ``24 + 8 / 4 = 26`` slot-equivalents, so no schedule beats
``max(work / 26, longest task)``. Makespan (first task start to last task end, measured
inside the tasks; for a task won by a copy, the winning copy's times) over that bound,
on a fresh cluster per run, for:

1. plain dask;
2. plain dask with hand-set longest-first priorities (no plugin);
3. ``JobsPlugin(policy="lpt")``, no speculation;
4. ``JobsPlugin(policy="lpt", speculation=SPECULATION)``: backup copies of late tasks,
   with the plugin's learned worker speeds;
5. ``JobsPlugin(policy="node-aware", speculation=SPECULATION)``.

Also: which worker ran the long tasks, and for run 4 the plugin's speculation counts,
its backup events and the worker speeds it learned.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

from distributed import Client, LocalCluster
from harness import Chart

from daskjobs.plugin import JobsPlugin
from speculation.workload import (
    N_LONG,
    SLOTS,
    SPECULATION,
    backup_events,
    chapter_graph,
    scheduler_status,
)

CONFIGS = ("plain", "hand", "lpt", "spec", "aware")
LABELS = {
    "plain": "plain dask",
    "hand": "plain dask, hand-set longest-first priorities",
    "lpt": "plugin LPT, no speculation",
    "spec": "plugin LPT + speculation",
    "aware": "plugin node-aware + speculation",
}
#: The makespan over the bound that the configurations with copies aim for.
TARGET = 1.10


def _plugin(config: str) -> JobsPlugin | None:
    if config == "lpt":
        return JobsPlugin(policy="lpt")
    if config == "spec":
        return JobsPlugin(policy="lpt", speculation=dict(SPECULATION))
    if config == "aware":
        return JobsPlugin(policy="node-aware", speculation=dict(SPECULATION))
    return None


def run_sweep(
    seed: int, n: int, config: str, slow_worker: int, slow_factor: float
) -> dict[str, Any]:
    """One run of the sweep in ``config`` on a fresh cluster."""
    workers, threads = SLOTS
    plugin = _plugin(config)
    parts, durations = chapter_graph(
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
        status = client.run_on_scheduler(scheduler_status) if plugin else None
        events = client.run_on_scheduler(backup_events) if plugin else []
    start = min(s for s, _, _ in spans)
    makespan = max(e for _, e, _ in spans) - start
    slots = (workers - 1) * threads + threads / slow_factor
    bound = max(sum(durations) / slots, max(durations))
    longest = sorted(range(len(durations)), key=lambda i: -durations[i])[:N_LONG]
    out: dict[str, Any] = {
        "makespan": makespan,
        "wall": wall,
        "bound": bound,
        "ratio": makespan / bound,
        "work": sum(durations),
        "long": [
            {
                "duration": durations[i],
                "worker": spans[i][2],
                "start": spans[i][0] - start,
                "end": spans[i][1] - start,
            }
            for i in sorted(longest)
        ],
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
    """Every configuration for each seed, in turn."""
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


def spec_cell(r: dict[str, Any]) -> str:
    """Copies launched / won / lost and the slot-time they wasted."""
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
    """The makespans over the bound, where the long tasks ran, and the copies."""
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
        cells.append(f"{spec_cell(r['spec'])}; {spec_cell(r['aware'])}")
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
        f"\nWhere the {N_LONG} long tasks ran (worker name, start-end in s from the first "
        f"start; * = the slow worker {slow_worker}):\n"
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


def chart(rows: list[dict[str, Any]]) -> Chart:
    """Makespan over the bound, per seed and configuration."""
    return Chart(
        "The chapter sweep, one worker 4x slow",
        "makespan / bound",
        [f"seed {r['seed']}" for r in rows],
        {LABELS[c]: [r[c]["ratio"] for r in rows] for c in CONFIGS},
        reference=TARGET,
    )
