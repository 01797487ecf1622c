"""Submission to results: what the plugin adds to a sweep's fixed cost, on worker processes.

A sweep's time from ``client.compute`` to its results is the schedule (first task start to
last task end) plus a fixed cost: the lead (the graph sent, ordered, ranked, its first tasks
sent to the workers and started) and the tail (the last result back to the client). The
plugin should buy a shorter schedule without a longer fixed cost.

The sweep: ``--tasks`` (800) independent sleep tasks, log-normal durations (median 0.1 s,
spread 0.76, at most 2 s), each annotated with its duration as its estimate, keys named so
that dask's own order is the submission order; 4 ``dask worker`` processes x 8 threads,
worker ``w0`` ``--slow`` (2) times slower. Two clusters of real processes live side by side
(``tests/helpers/realcluster.py`` through ``harness.processes``, dask's defaults, validation
on): plain dask, and ``dask scheduler --preload daskjobs.preload`` with its defaults. Each is
warmed up by a small map, then the reps alternate between them (the order swapping each rep),
each rep a new graph of the same shape (new keys, the same durations: the plugin's second
sweep has learned nothing it could not read from the annotations).

Per rep and cluster: submission to results, the schedule (from the tasks' own clocks: every
process is on this machine), the lead and the tail. The table gives the medians, and the
fixed cost with the plugin minus plain dask's, paired by rep (target: at most 0.1 s), with
the schedule with the plugin over plain dask's.

Usage::

    python benchmarks/bench_submit.py [--reps 5] [--tasks 800] [--seeds 1]
    python benchmarks/bench_submit.py --quick   # 200 tasks, 2 reps
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from harness.processes import realcluster, realtasks, worker_path

#: Workers x threads.
SLOTS = (4, 8)
#: The plugin's fixed cost over plain dask's that the plugin aims for, in seconds.
TARGET = 0.1


def sweep(n: int, seed: int, prefix: str) -> list[Any]:
    rt = realtasks()
    return rt.nap_graph(  # type: ignore[no-any-return]
        n, seed=seed, mu=-2.3, sigma=0.76, cap=2.0, prefix=prefix, fn=rt.timed
    )


def one(client: Any, n: int, seed: int, prefix: str) -> dict[str, float]:
    graph = sweep(n, seed, prefix)
    t0 = time.time()
    got = client.compute(graph, sync=True)
    t1 = time.time()
    first = min(s for _, s, _ in got)
    last = max(e for _, _, e in got)
    return {
        "total": t1 - t0,
        "schedule": last - first,
        "lead": first - t0,
        "tail": t1 - last,
        "fixed": (t1 - t0) - (last - first),
    }


def run(n: int, reps: int, seed: int, slow: float) -> dict[str, list[dict[str, float]]]:
    rc = realcluster()
    workers, threads = SLOTS
    env = {"DASKJOBS_TEST_SLOW": f"w0={slow:g}", **worker_path()}
    with tempfile.TemporaryDirectory(prefix="bench-submit-") as tmp:
        clusters = {
            name: rc.RealCluster(
                Path(tmp) / name.replace(" ", "-"),
                n_workers=workers,
                nthreads=threads,
                preload=preload,
                env=env,
            )
            for name, preload in (("plain dask", None), ("plugin", "daskjobs.preload"))
        }
        try:
            clients = {}
            for name, cl in clusters.items():
                cl.start()
                clients[name] = cl.client()
                clients[name].wait_for_workers(workers)
                clients[name].gather(clients[name].map(rt_inc(), range(4 * n // 10)))
            out: dict[str, list[dict[str, float]]] = {name: [] for name in clusters}
            for rep in range(reps):
                for name in harness.order(list(clusters), rep):
                    r = one(clients[name], n, seed, f"bt-r{rep}")
                    out[name].append(r)
                    print(
                        f"  rep {rep} {name}: total {r['total']:.2f} s, schedule "
                        f"{r['schedule']:.2f} s, lead {r['lead']:.3f} s, tail {r['tail']:.3f} s",
                        file=sys.stderr,
                    )
            for name, cl in clusters.items():
                clients[name].close()
                problems = cl.problems(shutdown=False)
                if problems:
                    print(f"  {name}: problems in the logs: {problems[:3]}", file=sys.stderr)
        finally:
            for cl in clusters.values():
                cl.close()
    return out


def rt_inc() -> Any:
    return realtasks().started_at


def table(runs: dict[int, dict[str, list[dict[str, float]]]], n: int, slow: float) -> str:
    rows = []
    for seed, got in runs.items():
        plain, plug = got["plain dask"], got["plugin"]
        for name, rs in got.items():
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            extra = "-"
            ratio = "-"
            if name == "plugin":
                extra = harness.spread(
                    p["fixed"] - q["fixed"] for p, q in zip(plug, plain, strict=True)
                ).text("+.3f")
                ratio = harness.spread(
                    p["schedule"] / q["schedule"] for p, q in zip(plug, plain, strict=True)
                ).text(".3f")
            rows.append(
                [
                    str(seed),
                    name,
                    f"{med['total']:.2f}",
                    f"{med['schedule']:.2f}",
                    f"{med['lead']:.3f}",
                    f"{med['tail']:.3f}",
                    f"{med['fixed']:.3f}",
                    extra,
                    ratio,
                ]
            )
    workers, threads = SLOTS
    return harness.table(
        [
            "seed",
            "cluster",
            "submission to results (s)",
            "schedule (s)",
            "lead (s)",
            "tail (s)",
            "fixed cost (s)",
            "fixed cost - plain's, paired (s)",
            "schedule / plain's, paired",
        ],
        rows,
        align="llrrrrrrr",
    ) + (
        f"\n\n{n:,} tasks on {workers} worker processes x {threads} threads, w0 {slow:g}x "
        f"slower; medians over the reps; target: the fixed cost at most {TARGET:.1f} s over "
        "plain dask's."
    )


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, seeds=1)
    ap.add_argument("--tasks", type=int, default=None, help="tasks per sweep (800)")
    ap.add_argument("--reps", type=int, default=None, help="reps per cluster (5)")
    ap.add_argument("--slow", type=float, default=2.0, help="w0's slow-down (2)")
    args = ap.parse_args(argv)
    n = args.tasks or (200 if args.quick else 800)
    reps = args.reps or (2 if args.quick else 5)
    runs = {}
    for seed in harness.seeds(args, 1):
        print(f"seed {seed}: {n} tasks x {reps} reps ...", file=sys.stderr)
        runs[seed] = run(n, reps, seed, args.slow)
    report = harness.Report("Submission to results", __file__, argv)
    report.section("Submission to results: plain dask and the plugin", table(runs, n, args.slow))
    report.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
