"""The jobs ledger's cost on scheduler throughput, and jobs submitted per second.

Usage::

    python benchmarks/bench_jobs.py                 # 10,000 tasks, SQLite and PostgreSQL
    python benchmarks/bench_jobs.py --quick         # 300 tasks, 50 jobs, SQLite only
    python benchmarks/bench_jobs.py --postgres URL  # another PostgreSQL server
    python benchmarks/bench_jobs.py --processes     # workers in their own processes

On ``LocalCluster(n_workers=2, threads_per_worker=1, processes=False)`` (the plugin
throughput setup: scheduler, workers, the jobs service and the workers' reporter threads
share one process and its GIL), or with ``--processes`` two worker processes (as on a
cluster: the reporters' ledger work runs beside the workers, not in the scheduler's
process), side by side in one run, per backend:

1. **plain dask** - ``client.map(inc, range(n))`` then ``gather``;
2. **one job of n parts** - an inference job whose n parts each add one (every part
   an attempt: started in the ledger 1,000 at a time, its output committed with its
   token by its worker process's reporter, in batches, kept in the ledger's row);
3. **n jobs of one part** - n evaluation jobs submitted one by one (the submission
   rate is reported), then waited for (``--jobs M``: M jobs; the ratio then compares
   with plain dask's time scaled to M tasks).

Reported: wall time, the throughput ratio ``plain / ledger`` (target for the one-job
case: >= 0.9) and submissions per second. A script, not a test: nothing asserts.
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from typing import Any

import harness


def inc(x: int) -> int:
    return x + 1


def part(attempt: Any) -> int:
    return attempt.part + 1


def one(attempt: Any, i: int) -> int:
    return i + 1


def run(url: str, n: int, store: str, processes: bool = False, m: int = 0) -> dict[str, float]:
    from distributed import Client, LocalCluster

    import daskjobs.jobs as jobs

    service = jobs.JobsService(ledger=url, store=store)  # the default settings
    out: dict[str, float] = {}
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=processes,
            dashboard_address=":0",
            scheduler_kwargs={"plugins": [service]},
        ) as lc,
        Client(lc) as client,
    ):
        client.gather(client.map(inc, range(100)))  # warm up
        t = time.perf_counter()
        client.gather(client.map(inc, range(n), key=[f"inc-{uuid.uuid4().hex}" for _ in range(n)]))
        out["plain"] = time.perf_counter() - t

        t = time.perf_counter()
        job = jobs.submit(client, f"bench-{uuid.uuid4().hex[:6]}", part, kind="inference", parts=n)
        status = job.wait(poll=0.05)
        out["one job"] = time.perf_counter() - t
        assert status["state"] == "succeeded", status["state"]

        t = time.perf_counter()
        handles = [
            jobs.submit(client, f"b{i}", one, params={"i": i}, kind="evaluation")
            for i in range(m or n)
        ]
        out["submit"] = time.perf_counter() - t
        for h in handles:
            h.wait(poll=0.05)
        out["n jobs"] = time.perf_counter() - t
    return out


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("-n", type=int, default=None, help="tasks (default 10,000; quick 300)")
    ap.add_argument("--processes", action="store_true", help="two worker processes")
    ap.add_argument(
        "--jobs", type=int, default=None, help="jobs of one part in case 3 (default: n; quick 50)"
    )
    ap.add_argument(
        "--postgres",
        default=None,
        help="PostgreSQL server (a fresh database is made and dropped; default "
        "postgresql+psycopg://postgres@127.0.0.1:5432, none with --quick); 'none' to skip",
    )
    args = ap.parse_args(argv)
    n = args.n or (300 if args.quick else 10_000)
    postgres = args.postgres or (
        "none" if args.quick else "postgresql+psycopg://postgres@127.0.0.1:5432"
    )
    m = args.jobs or (50 if args.quick else n)
    backends = ["sqlite"] + ([] if postgres == "none" else ["postgresql"])
    rows, charts = [], {}
    for backend in backends:
        with tempfile.TemporaryDirectory() as d:
            drop = None
            if backend == "sqlite":
                url = f"sqlite:///{d}/ledger.sqlite"
            else:
                import sqlalchemy as sa

                name = "daskjobs_bench_" + uuid.uuid4().hex[:8]
                admin = sa.create_engine(postgres + "/postgres", isolation_level="AUTOCOMMIT")
                with admin.connect() as c:
                    c.exec_driver_sql(f'CREATE DATABASE "{name}"')
                url = f"{postgres}/{name}"

                def drop(admin: Any = admin, name: str = name) -> None:
                    with admin.connect() as c:
                        c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

            try:
                r = run(url, n, f"{d}/store", args.processes, m)
            finally:
                if drop is not None:
                    drop()
        print(f"  {backend}: {r}", file=sys.stderr)
        rows.append(
            [
                backend,
                f"{r['plain']:.2f} s",
                f"{r['one job']:.2f} s",
                f"{r['plain'] / r['one job']:.2f}",
                f"{r['n jobs']:.2f} s",
                f"{r['plain'] * m / n / r['n jobs']:.2f}",
                f"{m / r['submit']:.0f}",
            ]
        )
        charts[backend] = [r["plain"] / r["one job"], r["plain"] * m / n / r["n jobs"]]
    report = harness.Report("Jobs ledger overhead", __file__, argv)
    report.note(
        "cluster: LocalCluster, 2 workers x 1 thread, "
        + ("worker processes" if args.processes else "one process (processes=False)")
    )
    report.section(
        None,
        harness.table(
            [
                "backend",
                "plain dask",
                "one job of n parts",
                "ratio",
                "n jobs",
                "ratio",
                "submits/s",
            ],
            rows,
        )
        + f"\n\n{n:,} tasks; {m:,} jobs of one part; target for one job of n parts: >= 0.9.",
    )
    report.chart(
        harness.Chart(
            "Throughput with the ledger over plain dask's",
            "plain dask's time / the ledger's",
            ["one job of n parts", "n jobs of one part"],
            charts,
            reference=0.9,
        )
    )
    report.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
