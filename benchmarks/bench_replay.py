"""Replay benchmarks: calibration on recorded runs, and replay speed on 100,000 tasks.

Calibration: runs are recorded on a LocalCluster (threads, ``processes=False``;
sleeps stand in for work) and replayed under the policy that ran, on the cluster
that ran them; the table gives recorded vs replayed makespan and the error.

1. ``fifo``: 120 independent tasks of log-normal duration, the plugin with ``fifo``
   (dask's own order).
2. ``lpt``: the same tasks, the plugin with ``lpt``.
3. ``lpt-slow``: the same tasks with worker 0 three times slower (the live plugin
   has no speculation; speculation is a what-if of the replay).
4. ``dag-1`` ... ``dag-K``: a ``dask.array`` tree reduction
   (``(x + x.T).mean(axis=0).sum()`` over 16 x 16 chunks) with the plugin's
   ``critical-path``, recorded ``--dag-runs`` times (default 5): its millisecond
   numpy tasks make the run bound by dask's per-task costs, which vary from one
   recording to the next, so each recording is replayed and listed.
4b. ``lpt-spec``: 80 independent tasks (median 80 ms, estimates exact) with worker 0
   four times slower, the plugin with ``lpt`` and speculation on (late factor 2.0,
   ``min_runtime`` 100 ms, ``interval`` 50 ms): backup copies race on the live cluster,
   and the replay runs with the recorded speculation; recorded vs replayed backups
   launched / won are listed.
5. ``dag-small``: the same reduction over 8 x 8 chunks (164 tasks of 0.5 ms): the
   slots compute under 10% of the time.

Copies, race by race (``--copies N``): the ``lpt-spec`` run recorded N times on a
LocalCluster in one process and N times on real processes (``dask scheduler`` and
three ``dask worker`` processes, the plugin preloaded, w0 4x slow; the harness of
tests/helpers/realcluster.py, through ``harness.processes``), each replayed with
``placement="recorded"`` (the replay asks the same ``Speculation.decide`` the plugin
asked): the copies launched and won, recorded vs replayed, whether both are within
one, the tasks copied by one and not the other, and the races both ran with the same
winner (with the closest race's margin).

Speed: a synthetic trace of 100,000 finished tasks on 64 workers x 8 threads is
written, then loaded and replayed (``lpt``); the times of each step are printed.

Usage::

    python benchmarks/bench_replay.py [--out DIR] [--tasks 100000] [--dag-runs 5] [--json]
    python benchmarks/bench_replay.py --copies 8 --skip-calibration --skip-speed
    python benchmarks/bench_replay.py --quick     # one DAG recording, 10,000 tasks for speed

Prints markdown with the command and the machine (``--markdown``/``--plot`` write it and
a PNG: recorded against replayed makespan per calibration run).
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import dask
import harness
from harness.processes import realcluster, realtasks

from daskjobs.replay import load, replay


def _work(i: int, d: float, *deps: Any) -> int:
    time.sleep(d)
    return i


def _slow_work(i: int, d: float, *deps: Any) -> int:
    from distributed import get_worker

    time.sleep(d * (3.0 if get_worker().name == 0 else 1.0))
    return i


def _slow4_work(i: int, d: float, *deps: Any) -> int:
    from distributed import get_worker

    time.sleep(d * (4.0 if get_worker().name == 0 else 1.0))
    return i


SPECULATION = {"enabled": True, "late_factor": 2.0, "min_runtime": "100ms", "interval": "50ms"}


def spec_sweep(n: int = 80, seed: int = 7) -> list[Any]:
    """``n`` independent tasks, log-normal (median 80 ms, spread 0.5, at most 0.25 s)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        d = min(0.25, rng.lognormvariate(-2.5, 0.5))
        with dask.annotate(estimate=d):
            out.append(dask.delayed(_slow4_work)(i, d, dask_key_name=f"bt-{i}"))
    return out


def sweep(fn: Any = _work, n: int = 120, seed: int = 7) -> list[Any]:
    """``n`` independent tasks, log-normal durations (median 40 ms, spread 0.7), two teams."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        d = min(0.4, rng.lognormvariate(-3.2, 0.7))
        with dask.annotate(estimate=d, team="quant" if i % 3 else "ml"):
            out.append(dask.delayed(fn)(i, d, dask_key_name=f"backtest-{i}"))
    return out


def array_reduction(n: int = 4000) -> Any:
    import dask.array as da

    x = da.random.RandomState(0).random((n, n), chunks=(250, 250))
    return (x + x.T).mean(axis=0).sum()


def record(
    path: Path,
    policy: str,
    graph: Any,
    n_workers: int = 3,
    threads: int = 2,
    speculation: dict[str, Any] | None = None,
) -> float:
    """Run ``graph`` on a LocalCluster with the plugin recording to ``path``; wall seconds."""
    from distributed import Client, LocalCluster

    from daskjobs.plugin import JobsPlugin

    extra = {"speculation": speculation} if speculation is not None else {}
    plugin = JobsPlugin(policy=policy, record=str(path), **extra)
    with (
        LocalCluster(
            n_workers=n_workers,
            threads_per_worker=threads,
            processes=False,
            dashboard_address=":0",
            scheduler_kwargs={"plugins": [plugin]},
        ) as cl,
        Client(cl) as c,
    ):
        t = time.perf_counter()
        c.compute(graph, sync=True)
        return time.perf_counter() - t


RUNS = {
    "fifo": ("fifo", lambda: sweep()),
    "lpt": ("lpt", lambda: sweep()),
    "lpt-slow": ("lpt", lambda: sweep(_slow_work)),
    "lpt-spec": ("lpt", spec_sweep),
    "dag-small": ("critical-path", lambda: array_reduction(2000)),
    "dag": ("critical-path", array_reduction),
}


def calibration(out: Path, dag_runs: int = 5) -> list[dict[str, Any]]:
    rows = []
    runs = [(name, name, policy, make) for name, (policy, make) in RUNS.items()]
    if dag_runs != 1:
        dag = runs.pop()
        runs += [(f"{dag[0]}-{k + 1}", *dag[1:]) for k in range(dag_runs)]
    for name, _kind, policy, make in runs:
        path = out / f"{name}.jsonl"
        record(path, policy, make(), speculation=SPECULATION if name == "lpt-spec" else None)
        loaded = load(path)
        r = replay(loaded)
        rows.append(
            {
                "run": name,
                "policy": r.policy,
                "tasks": len(loaded.tasks),
                "workers": f"{loaded.cluster.nodes}x{loaded.cluster.cores_per_node}",
                "slow": {
                    w.address.rsplit("/", 1)[-1]: round(w.speed, 2)
                    for w in loaded.workers
                    if w.speed != 1.0
                },
                "overhead_ms": loaded.fit.overhead * 1e3,
                "compute_share": loaded.fit.compute_share,
                "dep_latency_ms": (
                    None if loaded.fit.dep_latency_samples == 0 else loaded.fit.dep_latency * 1e3
                ),
                "transfer_s": loaded.fit.transfer,
                "recorded_s": loaded.recorded.makespan,
                "replayed_s": r.makespan,
                "error_pct": r.error * 100,
                "backups_recorded": (
                    f"{loaded.recorded.backups['launched']} / {loaded.recorded.backups['won']}"
                    if loaded.speculation is not None
                    else "-"
                ),
                "backups_replayed": (
                    f"{r.schedule.backups_launched} / {r.schedule.backups_won}"
                    if loaded.speculation is not None
                    else "-"
                ),
                "trace": str(path),
            }
        )
    return rows


def record_real(path: Path, graph: Any, speculation: dict[str, Any]) -> float:
    """Run ``graph`` on real processes (a ``dask scheduler`` with the plugin preloaded,
    3 ``dask worker`` processes of 2 threads, w0 4x slow), recording to ``path``."""
    settings = {k.replace("_", "-"): v for k, v in speculation.items()}
    config = {"daskjobs": {"policy": "lpt", "speculation": settings, "record": str(path)}}
    with (
        realcluster().RealCluster(
            path.parent / f"{path.stem}-cluster", config=config, env={"DASKJOBS_TEST_SLOW": "w0=4"}
        ) as rc,
        rc.client() as c,
    ):
        t = time.perf_counter()
        c.compute(graph, sync=True)
        return time.perf_counter() - t


def real_spec_sweep(n: int = 80, seed: int = 7) -> list[Any]:
    """:func:`spec_sweep` with tasks that import on worker processes (tests/helpers/realtasks.py,
    which slows down the workers named in ``DASKJOBS_TEST_SLOW``)."""
    nap = realtasks().nap
    rng = random.Random(seed)
    out = []
    for i in range(n):
        d = min(0.25, rng.lognormvariate(-2.5, 0.5))
        with dask.annotate(estimate=d):
            out.append(dask.delayed(nap)(i, d, dask_key_name=f"bt-{i}"))
    return out


def copies(out: Path, runs: int) -> list[dict[str, Any]]:
    """The ``lpt-spec`` run recorded ``runs`` times in one process and ``runs`` times on
    real processes, each replayed on its recorded placement, compared race by race."""
    rows = []
    for kind in ("one process", "real processes"):
        for k in range(runs):
            path = out / f"copies-{kind.split()[0]}-{k}.jsonl"
            if kind == "one process":
                record(path, "lpt", spec_sweep(), speculation=SPECULATION)
            else:
                record_real(path, real_spec_sweep(), SPECULATION)
            r = replay(load(path), placement="recorded")
            races = r.copies()
            both = [c for c in races if c.recorded in ("won", "lost") and c.replayed]
            launched = sum(c.recorded is not None for c in races)
            won = sum(c.recorded == "won" for c in races)
            rows.append(
                {
                    "cluster": kind,
                    "run": k + 1,
                    "recorded": f"{launched} / {won}",
                    "replayed": f"{r.schedule.backups_launched} / {r.schedule.backups_won}",
                    "within_one": abs(r.schedule.backups_launched - launched) <= 1
                    and abs(r.schedule.backups_won - won) <= 1,
                    "only_recorded": [str(c.tid) for c in races if c.replayed is None],
                    "only_replayed": [str(c.tid) for c in races if c.recorded is None],
                    "races": len(both),
                    "same_winner": sum(c.same for c in both),
                    "closest_ms": min((abs(c.margin or 0) * 1e3 for c in both), default=None),
                }
            )
    return rows


def synthetic_trace(path: Path, n: int, workers: int = 64, threads: int = 8, seed: int = 0) -> None:
    """A trace of ``n`` finished tasks laid out slot by slot (as a recorder would write it)."""
    rng = random.Random(seed)
    t0 = 1_700_000_000.0
    recs: list[dict[str, Any]] = [{"type": "header", "version": 1, "policy": "lpt"}]
    addrs = [f"tcp://10.0.0.{w}:9000" for w in range(workers)]
    recs += [{"type": "worker-added", "time": t0, "worker": a, "nthreads": threads} for a in addrs]
    free = [t0 + 0.01] * (workers * threads)
    for i in range(n):
        d = rng.lognormvariate(0.0, 0.76)
        key = f"bt-{i}"
        recs.append(
            {
                "type": "graph",
                "time": t0,
                "key": key,
                "deps": [],
                "estimate": d * rng.lognormvariate(0, 0.3),
                "estimate_source": "annotation",
                "team": "a" if i % 2 else "b",
                "stage": "bt",
                "submit": t0,
                "priority": [0, 0, 1, i],
            }
        )
    events: list[tuple[float, dict[str, Any]]] = []
    for i in range(n):
        s = min(range(len(free)), key=free.__getitem__) if i < len(free) else i % len(free)
        start = free[s] + 0.001
        d = rng.lognormvariate(0.0, 0.76)
        stop = start + d
        free[s] = stop
        w = addrs[s // threads]
        key = f"bt-{i}"
        events.append((start, {"type": "assigned", "time": start, "key": key, "worker": w}))
        events.append(
            (start, {"type": "started", "time": start, "key": key, "worker": w, "run_id": i})
        )
        events.append(
            (
                stop,
                {
                    "type": "finished",
                    "time": stop,
                    "key": key,
                    "worker": w,
                    "run_id": i,
                    "outcome": "memory",
                    "state": "memory",
                    "compute_start": start,
                    "compute_stop": stop,
                    "duration": d,
                },
            )
        )
    events.sort(key=lambda e: e[0])
    recs += [e for _, e in events]
    recs.append({"type": "footer", "time": t0, "records": len(recs) - 1, "dropped": 0})
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def speed(out: Path, n: int) -> dict[str, Any]:
    path = out / f"synthetic-{n}.jsonl"
    synthetic_trace(path, n)
    t = time.perf_counter()
    loaded = load(path)
    t_load = time.perf_counter() - t
    t = time.perf_counter()
    r = replay(loaded, "lpt")
    t_sim = time.perf_counter() - t
    return {
        "tasks": n,
        "trace_mb": path.stat().st_size / 1e6,
        "load_s": t_load,
        "replay_s": t_sim,
        "total_s": t_load + t_sim,
        "error_pct": r.error * 100,
    }


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--out", type=Path, default=None, help="keep the traces in this directory")
    ap.add_argument(
        "--tasks", type=int, default=None, help="tasks of the speed trace (100,000; quick 10,000)"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    ap.add_argument("--skip-calibration", action="store_true")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument(
        "--copies",
        type=int,
        default=0,
        help="record lpt-spec this many times per cluster kind and compare copies race by race",
    )
    ap.add_argument(
        "--dag-runs", type=int, default=None, help="recordings of the DAG run (5; quick 1)"
    )
    args = ap.parse_args(argv)
    tasks = args.tasks or (10_000 if args.quick else 100_000)
    dag_runs = args.dag_runs or (1 if args.quick else 5)
    out = args.out or Path(tempfile.mkdtemp(prefix="daskjobs-replay-"))
    out.mkdir(parents=True, exist_ok=True)
    rows = [] if args.skip_calibration else calibration(out, dag_runs)
    races = copies(out, args.copies) if args.copies else []
    sp = None if args.skip_speed else speed(out, tasks)
    if args.json:
        print(json.dumps({"calibration": rows, "copies": races, "speed": sp}, indent=2))
        return 0
    report = harness.Report("Replay", __file__, argv)
    if races:
        ok = sum(c["within_one"] for c in races)
        report.section(
            "Copies, race by race",
            _copies_table(races) + f"\n\nlaunched and won within one: {ok} of {len(races)} "
            "recordings",
        )
    if rows:
        worst = max(rows, key=lambda r: abs(r["error_pct"]))
        report.section(
            "Calibration: recorded against replayed",
            _calibration_table(rows)
            + f"\n\nlargest error: {worst['run']} {worst['error_pct']:+.1f}%",
        )
        report.chart(
            harness.Chart(
                "Makespan, recorded and replayed",
                "seconds",
                [r["run"] for r in rows],
                {
                    "recorded": [r["recorded_s"] for r in rows],
                    "replayed": [r["replayed_s"] for r in rows],
                },
            )
        )
    if sp is not None:
        report.section(
            None,
            f"Replay speed: {sp['tasks']:,} tasks ({sp['trace_mb']:.0f} MB trace): "
            f"load {sp['load_s']:.2f} s + replay {sp['replay_s']:.2f} s = {sp['total_s']:.2f} s",
        )
        report.chart(
            harness.Chart(
                f"Replay speed, {sp['tasks']:,} tasks",
                "seconds",
                ["load", "replay", "total"],
                {"time": [sp["load_s"], sp["replay_s"], sp["total_s"]]},
            )
        )
    report.emit(args)
    return 0


def _copies_table(races: list[dict[str, Any]]) -> str:
    header = [
        "cluster",
        "run",
        "copies launched / won: recorded",
        "replayed",
        "within one",
        "only recorded",
        "only replayed",
        "races both ran: same winner",
        "closest (ms)",
    ]
    cells = [
        [
            c["cluster"],
            c["run"],
            c["recorded"],
            c["replayed"],
            "yes" if c["within_one"] else "NO",
            ", ".join(c["only_recorded"]) or "-",
            ", ".join(c["only_replayed"]) or "-",
            f"{c['same_winner']} of {c['races']}",
            "-" if c["closest_ms"] is None else f"{c['closest_ms']:.1f}",
        ]
        for c in races
    ]
    return harness.table(header, cells, "lrrrlllrr")


def _calibration_table(rows: list[dict[str, Any]]) -> str:
    header = [
        "run",
        "policy",
        "tasks",
        "workers",
        "slow worker",
        "overhead (ms/task)",
        "computing",
        "input -> start (ms)",
        "recorded (s)",
        "replayed (s)",
        "error",
        "backups launched / won: recorded",
        "replayed",
    ]
    cells = []
    for r in rows:
        lat = "-" if r["dep_latency_ms"] is None else f"{r['dep_latency_ms']:.1f}"
        cells.append(
            [
                r["run"],
                r["policy"],
                r["tasks"],
                r["workers"],
                ", ".join(f"{k}: {v}x" for k, v in r["slow"].items()) or "-",
                f"{r['overhead_ms']:.2f}",
                f"{r['compute_share']:.0%}",
                lat,
                f"{r['recorded_s']:.3f}",
                f"{r['replayed_s']:.3f}",
                f"{r['error_pct']:+.1f}%",
                r["backups_recorded"],
                r["backups_replayed"],
            ]
        )
    return harness.table(header, cells, "lllll" + "r" * 8)


if __name__ == "__main__":
    sys.exit(main())
