"""Faults on a cluster of real processes: what happens, and what the user sees.

Usage::

    python benchmarks/bench_chaos.py            # every fault, about two minutes
    python benchmarks/bench_chaos.py --quick    # one fault: a worker killed mid-sweep
    python benchmarks/bench_chaos.py --only scheduler-restart

Each fault runs on a fresh cluster of real processes (the harness of
``tests/helpers/realcluster.py``, through ``harness.processes``):
``dask scheduler --preload plugins/daskjobs_scheduler.py`` and three ``dask worker``
processes of two threads, dask's default configuration plus dask's state validation,
a result store in a temporary directory. The sweep: 6 feature stages (200 kB each)
read by 20 backtests each (126 stages). Faults are SIGKILLs (no clean shutdown, as
when a node is lost). For each fault the script prints one row: the fault, what
happened (measured: results returned, stages recomputed or loaded, workers alive,
log lines that show a broken invariant) and what the user saw (the first line of
``SweepResult.summary()`` or the exception). The rows go to ``docs/explanation/reliability.md``.
A script, not a test: nothing here asserts.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import chaos_tasks
import harness
from harness.processes import realcluster, worker_path

from daskjobs import Sweep, grid
from daskjobs.plugin.client import status

_rc = realcluster()
RealCluster = _rc.RealCluster
in_thread = _rc.in_thread
SPECULATION = _rc.SPECULATION_CONFIG


def cluster(work: Path, slow: str = "", **kwargs: Any) -> Any:
    """A cluster of real processes under ``work``; ``slow`` names slowed workers
    (``"w0=8"``)."""
    env = worker_path()
    if slow:
        env["DASKJOBS_BENCH_SLOW"] = slow
    return RealCluster(work / "c", env=env, **kwargs)


def sweep_of(seconds: float = 0.3) -> Sweep:
    sweep = Sweep("chaos")
    feats = sweep.stage(chaos_tasks.features, over=grid(slice=range(6)), estimate=0.02)
    sweep.stage(
        chaos_tasks.backtest,
        inputs={"features": feats},
        over=grid(fast=range(20)),
        params={"seconds": seconds},
        estimate=seconds,
    )
    return sweep


def _seen(box: dict[str, Any]) -> str:
    if "error" in box:
        err = box["error"]
        return f"`{type(err).__name__}: {str(err).splitlines()[0][:160]}`"
    return f"`{box['result'].summary().splitlines()[0]}`"


def _happened(rc: RealCluster, box: dict[str, Any], extra: str = "") -> str:
    parts = []
    r = box.get("result") or getattr(box.get("error"), "partial", None)
    if r is not None:
        parts.append(
            f"{len(r.records) - len(r.failures)}/{len(r.records)} results, "
            f"{r.computed} stages computed ({r.reruns} ran twice), {r.hits} loaded"
        )
    alive = sum(rc.alive(f"w{i}") for i in range(rc.n_workers))
    parts.append(f"{alive}/{rc.n_workers} worker processes alive")
    problems = rc.problems()
    parts.append(f"{len(problems)} log lines showing a broken invariant")
    if extra:
        parts.append(extra)
    return "; ".join(parts)


def worker_killed_mid_sweep(work: Path) -> tuple[str, str, str]:
    rc = cluster(work, n_workers=3).start()
    store = str(work / "store")
    try:
        with rc.client() as c:
            t, box = in_thread(lambda: sweep_of().run(c, store=store, progress=False))
            time.sleep(1.5)
            rc.kill_worker("w1")
            t.join(180)
        return (
            "worker killed mid-sweep (SIGKILL, no nanny)",
            _happened(rc, box),
            _seen(box),
        )
    finally:
        rc.close()


def _race(rc: RealCluster, victim: str) -> tuple[str, str]:
    import dask

    with rc.client() as c:
        w0 = rc.worker_address(c, "w0")
        with dask.annotate(workers=[w0], allow_other_workers=True, estimate=0.5):
            x = dask.delayed(chaos_tasks.where)(1, 0.5, dask_key_name="race-1")
        fut = c.compute(x)
        deadline = time.time() + 30
        races: dict[str, Any] = {}
        while time.time() < deadline and "race-1" not in races:
            races = c.run_on_scheduler(
                lambda dask_scheduler: {
                    str(k): (r.worker, r.primary)
                    for k, r in dask_scheduler.plugins["daskjobs"].speculator.races.items()
                    if not r.redirected
                }
            )
            time.sleep(0.02)
        copy_worker, primary = races["race-1"]
        names = {a: w["name"] for a, w in c.scheduler_info()["workers"].items()}
        doomed = names[copy_worker if victim == "copy" else primary]
        t0 = time.time()
        rc.kill_worker(doomed)
        try:
            value = fut.result(timeout=60)
            seen = f"the task's result `{value!r}` {time.time() - t0:.1f} s after the kill"
        except Exception as err:
            seen = f"`{type(err).__name__}: {err}`"
        sp = status(c)["speculation"]
        happened = (
            f"copies launched {sp['launched']}, won {sp['won']}, adopted {sp['adopted']}, "
            f"abandoned {sp['abandoned']}; plugin errors {sum(status(c)['errors'].values())}"
        )
    return happened, seen


def worker_killed_running_copy(work: Path) -> tuple[str, str, str]:
    rc = cluster(work, "w0=8", n_workers=3, nthreads=1, config=SPECULATION).start()
    try:
        happened, seen = _race(rc, "copy")
        return ("worker killed while running a backup copy", _happened(rc, {}, happened), seen)
    finally:
        rc.close()


def worker_killed_running_primary(work: Path) -> tuple[str, str, str]:
    rc = cluster(work, "w0=8", n_workers=3, nthreads=1, config=SPECULATION).start()
    try:
        happened, seen = _race(rc, "primary")
        return (
            "worker killed while running a task that has a copy",
            _happened(rc, {}, happened),
            seen,
        )
    finally:
        rc.close()


def speculation_sweep_with_amm(work: Path) -> tuple[str, str, str]:
    rc = cluster(
        work,
        "w0=4",
        n_workers=3,
        config={
            **SPECULATION,
            "distributed": {"scheduler": {"active-memory-manager": {"interval": "50ms"}}},
        },
    ).start()
    try:
        with rc.client() as c:
            _, box = in_thread(
                lambda: sweep_of(0.05).run(c, store=str(work / "store"), progress=False)
            )
            _.join(180)
            sp = status(c)["speculation"]
        return (
            "backup copies with the active memory manager every 50 ms, one worker 4x slow",
            _happened(rc, box, f"copies launched {sp['launched']}, won {sp['won']}"),
            _seen(box),
        )
    finally:
        rc.close()


def scheduler_restart(work: Path) -> tuple[str, str, str]:
    rc = cluster(work, n_workers=3).start()
    store = str(work / "store")
    try:
        with rc.client() as c:
            t, box = in_thread(lambda: sweep_of().run(c, store=store, progress=False))
            time.sleep(2.0)
            rc.restart_scheduler()
            t.join(180)
        alive_after = sum(rc.alive(f"w{i}") for i in range(3))
        for i in range(3):  # dask workers do not reconnect: start new ones, as a deployment would
            rc.kill(f"w{i}")
            rc.start_worker(f"w{i}")
        rc.wait_for_workers(3)
        with rc.client() as c:
            again = sweep_of().run(c, store=store, progress=False)
        happened = (
            _happened(rc, box).split("; ")[0]
            + f"; {alive_after}/3 workers still running after the restart (dask workers shut "
            "down when their scheduler goes; new ones were started); the next run: "
            f"{again.computed} computed, {again.hits} loaded from the store, "
            f"{len(again.failures)} failed"
        )
        return ("scheduler killed mid-sweep and restarted", happened, _seen(box))
    finally:
        rc.close()


FAULTS: dict[str, Callable[[Path], tuple[str, str, str]]] = {
    "worker-mid-sweep": worker_killed_mid_sweep,
    "worker-running-copy": worker_killed_running_copy,
    "worker-running-primary": worker_killed_running_primary,
    "amm-and-copies": speculation_sweep_with_amm,
    "scheduler-restart": scheduler_restart,
}


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--only", choices=sorted(FAULTS), action="append")
    args = ap.parse_args(argv)
    names = args.only or (["worker-mid-sweep"] if args.quick else list(FAULTS))
    rows = []
    for name in names:
        work = Path(tempfile.mkdtemp(prefix=f"chaos-{name}-"))
        try:
            t0 = time.time()
            rows.append(FAULTS[name](work))
            print(f"  {name}: {time.time() - t0:.1f} s", file=sys.stderr)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    report = harness.Report("Faults on real processes", __file__, argv)
    report.section(
        None, harness.table(["fault", "what happens (measured)", "what the user sees"], rows, "lll")
    )
    report.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
