"""One run of a workload, with forecasts at the checkpoints, and the figures over runs.

A fresh cluster per run: ``dask scheduler --preload daskjobs.preload`` configured for the
workload and :data:`forecast.workloads.WORKERS` ``dask worker`` processes (the harness of
tests/helpers/realcluster.py, through ``harness.processes``), dask's defaults otherwise. The
client polls its futures; once :data:`CHECKPOINTS` of the tasks are done it takes
``daskjobs.forecast(client)`` (timed; as its snapshot and ``forecast_snapshot``), the
same snapshot's forecast with the band computed from one simulation
(``band="computed"``, as on a large snapshot) and what dask's rate extrapolation says at that
moment: ``remaining tasks / (done tasks / elapsed since submission)``, and the same by
work (the nominal seconds the benchmark knows and dask does not). The actual end is the
latest end the tasks report; a checkpoint's actual remaining time is that end minus the
forecast's snapshot time (the rate's: minus the moment it was read).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from harness.processes import realcluster, worker_path

from daskjobs.forecasting import forecast_snapshot, snapshot
from forecast.workloads import THREADS, WORKERS, Workload

CHECKPOINTS = (0.10, 0.25, 0.50, 0.75)
POLL = 0.02


def run(wl: Workload, seed: int, quick: bool, workdir: Path, draws: int) -> list[dict[str, Any]]:
    """The checkpoints of one run (see the module docstring), each a dict of figures."""
    env = {**worker_path(), "DASKJOBS_BENCH_SLOW": wl.slow}
    rc = realcluster().RealCluster(
        workdir / f"{wl.name}-{seed}",
        n_workers=WORKERS,
        nthreads=THREADS,
        preload="daskjobs.preload",
        config={"daskjobs": wl.config},
        validate=False,
        env=env,
    )
    with rc, rc.client() as client:
        if wl.teach is not None:
            wl.teach(client, seed, quick)
        t_submit = time.time()
        sub = wl.submit(client, seed, quick)
        cps = _checkpoints(client, sub.futures, sub.seconds, t_submit, seed, draws)
        results = client.gather(sub.futures)
        problems = rc.problems()
    ends = [r[1] if isinstance(r, tuple) else r for r in results]
    t_end = max(ends)
    team_end: dict[str, float] = {}
    for team, e in zip(sub.teams, ends, strict=False):
        team_end[team] = max(team_end.get(team, 0.0), e)
    for cp in cps:
        cp["actual"] = t_end - cp["time"]
        cp["rate_actual"] = t_end - cp["read"]
        cp["team_actual"] = {t: e - cp["time"] for t, e in team_end.items()}
        cp["problems"] = len(problems)
        cp["total"] = t_end - t_submit
    return cps


def _checkpoints(
    client: Any, futures: list[Any], seconds: list[float], t_submit: float, seed: int, draws: int
) -> list[dict[str, Any]]:
    n = len(futures)
    work = sum(seconds)
    out: list[dict[str, Any]] = []
    k = 0
    while True:
        done = [f.done() for f in futures]
        count = sum(done)
        if count == n:
            return out
        if k < len(CHECKPOINTS) and count >= CHECKPOINTS[k] * n:
            read = time.time()
            elapsed = read - t_submit
            work_done = sum(s for s, d in zip(seconds, done, strict=True) if d)
            t0 = time.perf_counter()
            snap = snapshot(client)  # daskjobs.forecast(client, ...) in two steps
            f = forecast_snapshot(snap, draws=draws, seed=seed)
            wall = time.perf_counter() - t0
            t1 = time.perf_counter()
            c = forecast_snapshot(snap, draws=draws, seed=seed, band="computed")
            c_wall = time.perf_counter() - t1
            out.append(
                {
                    "checkpoint": CHECKPOINTS[k],
                    "done": count / n,
                    "read": read,
                    "time": f.time,
                    "p10": f.remaining.p10,
                    "p50": f.remaining.p50,
                    "p90": f.remaining.p90,
                    "teams": {t: r.p50 for t, r in f.teams.items()},
                    "rate": (n - count) * elapsed / count,
                    "rate_work": (work - work_done) * elapsed / work_done,
                    "wall": wall,
                    "tasks": f.tasks,
                    "band": f.band,
                    "c_p10": c.remaining.p10,
                    "c_p50": c.remaining.p50,
                    "c_p90": c.remaining.p90,
                    "c_wall": c_wall,
                }
            )
            k += 1
            continue
        time.sleep(POLL)


def error(cp: dict[str, Any], field: str = "p50") -> float:
    """The signed error of ``field`` as a share of the actual remaining time."""
    actual = cp["rate_actual"] if field.startswith("rate") else cp["actual"]
    return (cp[field] - actual) / actual


def covers(cp: dict[str, Any], prefix: str = "") -> bool:
    """Whether the band (``prefix="c_"``: the computed one) holds the actual end."""
    return bool(cp[f"{prefix}p10"] <= cp["actual"] <= cp[f"{prefix}p90"])


def summary(cps: list[dict[str, Any]]) -> dict[str, Any]:
    """Median |error| of p50, of the rate and of the rate by work (shares of the actual
    remaining time), the band's coverage and the forecast's median wall time; the same
    for the band computed from one simulation (``computed_...``)."""
    if not cps:
        return {}
    return {
        "checkpoints": len(cps),
        "p50_abs_error": statistics.median(abs(error(c)) for c in cps),
        "coverage": sum(covers(c) for c in cps) / len(cps),
        "rate_abs_error": statistics.median(abs(error(c, "rate")) for c in cps),
        "rate_work_abs_error": statistics.median(abs(error(c, "rate_work")) for c in cps),
        "forecast_seconds": statistics.median(c["wall"] for c in cps),
        "computed_p50_abs_error": statistics.median(abs(error(c, "c_p50")) for c in cps),
        "computed_coverage": sum(covers(c, "c_") for c in cps) / len(cps),
        "computed_seconds": statistics.median(c["c_wall"] for c in cps),
    }
