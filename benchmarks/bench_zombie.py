"""What a losing copy's thread costs, and what ``daskjobs.cancelled()`` gives back.

dask cannot stop a running thread. When a backup copy wins, the primary keeps
running on its worker until it returns; the scheduler does not see it and offers
its thread to new work, which waits behind it. This measures the effect on a
batch submitted right after a race:

- one worker of two (1 thread each) runs the *race* task 10x slower: 0.3 s
  estimated, 3 s there; its copy on the other worker wins after ~0.5 s;
- then a batch of 12 tasks of 0.1 s is submitted; its makespan is measured.

Three runs side by side: without speculation (the primary is a normal task: the
scheduler knows the thread is busy), with speculation and a loser that runs to
its end (a *zombie*), and with speculation and a loser that checks
``daskjobs.cancelled()`` between steps.

The three alternate, their order rotating every rep.

    python benchmarks/bench_zombie.py [--reps 3]
    python benchmarks/bench_zombie.py --quick    # one rep
"""

from __future__ import annotations

import statistics
import sys
import time

import dask
import harness
from distributed import Client, LocalCluster, get_worker

import daskjobs
from daskjobs import JobsPlugin

SPEC = {"enabled": True, "late_factor": 1.5, "min_runtime": "100ms", "interval": "50ms"}


def race(cooperative: bool) -> str:
    """30 steps of 0.01 s, ten times slower on the worker named 0."""
    name = get_worker().name
    for _ in range(30):
        if cooperative and daskjobs.cancelled():
            return "stopped"
        time.sleep(0.01 * (10 if name == 0 else 1))
    return f"done on {name}"


def nap(i: int) -> tuple[int, float, float]:
    t0 = time.time()
    time.sleep(0.1)
    return (i, t0, time.time())


def run(mode: str) -> dict[str, float]:
    plugin = JobsPlugin(policy="lpt", speculation=SPEC if mode != "plain" else None)
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=False,
            dashboard_address=":0",
            scheduler_kwargs={"plugins": [plugin]},
        ) as cl,
        Client(cl) as c,
    ):
        slow = next(a for a, w in c.scheduler_info()["workers"].items() if w["name"] == 0)
        with dask.annotate(workers=[slow], allow_other_workers=True, estimate=0.3):
            r = dask.delayed(race)(mode == "cooperative", dask_key_name="race")
        t0 = time.time()
        c.compute(r, sync=True)
        race_s = time.time() - t0
        batch = []
        for i in range(12):
            with dask.annotate(estimate=0.1):
                batch.append(dask.delayed(nap)(i, dask_key_name=f"b-{i:02d}"))
        res = c.compute(batch, sync=True)
        makespan = max(e for _, _, e in res) - min(s for _, s, _ in res)
        return {"race": race_s, "batch": makespan}


MODES = ("plain", "zombie", "cooperative")


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--reps", type=int, default=None, help="reps (default 3; quick 1)")
    args = ap.parse_args(argv)
    reps = args.reps or (1 if args.quick else 3)
    got = harness.alternate(
        {m: (lambda m=m: run(m)) for m in MODES},
        reps,
        show=lambda m, rep, r: f"rep {rep} {m}: batch {r['batch']:.2f} s",
    )
    report = harness.Report("A losing copy's thread", __file__, argv)
    rows = []
    for m in MODES:
        batches = [g["batch"] for g in got[m]]
        rows.append(
            [
                m,
                f"{statistics.median(g['race'] for g in got[m]):.2f}",
                ", ".join(f"{b:.2f}" for b in batches),
                f"{statistics.median(batches):.2f}",
            ]
        )
    report.section(
        None,
        harness.table(
            ["run", "race task (s)", "next batch makespan (s), each rep", "median"],
            rows,
            align="lrlr",
        ),
    )
    report.chart(
        harness.Chart(
            "The batch after a race",
            "makespan (s), median of the reps",
            list(MODES),
            {"next batch": [statistics.median(g["batch"] for g in got[m]) for m in MODES]},
        )
    )
    report.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
