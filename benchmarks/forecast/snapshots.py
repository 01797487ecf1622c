"""Hand-made snapshots (the columns of :mod:`daskjobs.plugin.observe.snapshot`) of any size, for
timing the forecast without a scheduler (``bench_forecast_time.py``).

:func:`sweep` is a parameter sweep as the plugin would hand it over: ``stages`` stages,
alternately annotated (the user's estimate, no band) and learned (a duration model's
estimate with its 10-90% band, fitted on 64 tasks), each task's estimate following its
grid point (0.2 s to 5 s, log-uniform); every second learned stage reads, task for task,
the stage before it (fit, then score); two teams; ``workers`` workers of ``threads``
threads, one 2x slow, measured on 20-200 tasks; the first task of each thread runs,
0.1 s to 2 s in. Seeded: the same arguments give the same snapshot.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def sweep(
    n: int,
    *,
    stages: int = 50,
    workers: int = 8,
    threads: int = 4,
    policy: str = "lpt",
    seed: int = 0,
) -> dict[str, Any]:
    """A snapshot of ``n`` unfinished tasks (module docstring)."""
    rng = np.random.default_rng(seed)
    per = max(1, -(-n // stages))
    stage_of = [min(i // per, stages - 1) for i in range(n)]
    est = np.exp(rng.uniform(np.log(0.2), np.log(5.0), n)).round(4).tolist()
    learned = [s % 2 == 1 for s in stage_of]
    running = workers * threads
    deps: list[list[int]] = []
    for i, s in enumerate(stage_of):
        reads = s % 4 == 3 and i - per >= 0 and stage_of[i - per] == s - 1
        deps.append([i - per] if reads and i >= running + per else [])
    addrs = [f"tcp://10.0.0.{j}:4000" for j in range(workers)]
    worker: list[str | None] = [None] * n
    position: list[int | None] = [None] * n
    elapsed: list[float | None] = [None] * n
    for k in range(min(running, n)):
        worker[k], position[k] = addrs[k // threads], k % threads
        elapsed[k] = round(float(rng.uniform(0.1, 2.0)), 3)
    cols = {
        "key": [f"stage{s}-{i}" for i, s in enumerate(stage_of)],
        "stage": [f"stage{s}" for s in stage_of],
        "team": ["alice" if s % 3 else "bob" for s in stage_of],
        "estimate": est,
        "source": ["model" if x else "annotation" for x in learned],
        "band": [
            [round(e * 0.8, 4), round(e * 1.25, 4)] if x else None
            for e, x in zip(est, learned, strict=True)
        ],
        "samples": [64 if x else 0 for x in learned],
        "cores": [1] * n,
        "state": [
            "processing" if w else ("waiting" if d else "queued")
            for w, d in zip(worker, deps, strict=True)
        ],
        "deps": deps,
        "worker": worker,
        "position": position,
        "elapsed": elapsed,
        "sweep": [f"sweep{s % 5}" for s in stage_of],
        "speculate": [True] * n,
    }
    ws = [
        {
            "address": a,
            "name": str(j),
            "threads": threads,
            "speed": 2.0 if j == workers - 1 else round(float(rng.uniform(0.9, 1.1)), 3),
            "samples": int(rng.integers(20, 200)),
        }
        for j, a in enumerate(addrs)
    ]
    teams = {"targets": {"alice": 1, "bob": 1}} if policy == "fair-share" else {}
    return {
        "version": 1,
        "time": 1000.0,
        "policy": policy,
        "policy_settings": teams,
        "teams": teams,
        "speculation": None,
        "default_estimate": 1.0,
        "default_team": "default",
        "workers": ws,
        "tasks": cols,
    }
