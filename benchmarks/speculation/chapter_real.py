"""The chapter sweep on real processes, as an operator runs it.

``dask scheduler --preload plugins/daskjobs_scheduler.py`` (the plugin configured
through a dask YAML file) and 4 ``dask worker`` processes of 8 threads (``w0`` 4x slow),
dask's default configuration (the active memory manager on), a fresh cluster per run.
Configurations: plain dask (no preload), the plugin's LPT, and the full plugin
(node-aware + speculation). Each run also checks what a shared cluster needs: every
worker alive at the end, no line in any process log showing a broken invariant, no
swallowed plugin error, and the sweep's values identical to plain dask's.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.processes import realcluster, worker_path

from speculation.chapter import spec_cell
from speculation.workload import (
    SLOTS,
    SLOW_FACTOR,
    chapter_graph_real,
    scheduler_status,
    speculation_config,
)

REAL_CONFIGS = ("plain", "lpt", "aware")


def run_sweep_real(seed: int, n: int, config: str, workdir: str) -> dict[str, Any]:
    """One sweep on a fresh cluster of real processes with dask's defaults."""
    workers, threads = SLOTS
    daskjobs_conf: dict[str, Any] = {}
    if config == "lpt":
        daskjobs_conf = {"policy": "lpt"}
    elif config == "aware":
        daskjobs_conf = {"policy": "node-aware", "speculation": speculation_config()}
    rc = realcluster().RealCluster(
        Path(workdir) / f"seed{seed}-{config}",
        n_workers=workers,
        nthreads=threads,
        preload=None if config == "plain" else "plugins/daskjobs_scheduler.py",
        config={"daskjobs": daskjobs_conf} if daskjobs_conf else None,
        validate=False,  # dask's defaults, as on a production cluster
        env=worker_path(),
    )
    parts, durations = chapter_graph_real(seed, n)
    with rc:
        with rc.client() as client:
            t0 = time.time()
            out = client.compute(parts, sync=True)
            wall = time.time() - t0
            status = client.run_on_scheduler(scheduler_status) if config != "plain" else None
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


def sweep_real(seeds: list[int], n: int) -> list[dict[str, Any]]:
    """Each configuration for each seed, in turn, on fresh clusters."""
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


def real_table(rows: list[dict[str, Any]], n: int) -> str:
    """Makespans over the bound and the shared-cluster checks, per seed."""
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
        cells.append(spec_cell(r["aware"]))
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
