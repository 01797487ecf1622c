"""The chapter's two-team case, scaled to a laptop, live on dask: FIFO against fair share.

Team ``a`` submits 400 tasks of 50 ms; team ``b`` submits 40 more 0.5 s later. On one worker
with 8 threads, how long after its submission is team b's median (and last) task done, under
``JobsPlugin(policy="fifo")`` and under ``JobsPlugin(policy="fair-share")`` with equal targets?
The runs alternate (FIFO first in even reps, fair share first in odd ones); the ratio
compares the two runs of each rep. The chapter's published figures for the same case:
0.59 h against 8.28 h for team b's median (a ratio of 0.07).

    python benchmarks/bench_fairshare.py [--reps 3]
    python benchmarks/bench_fairshare.py --quick    # one rep
"""

from __future__ import annotations

import statistics
import sys
import time

import dask
import harness
from distributed import Client

from daskjobs import JobsPlugin, local_cluster


def job(team: str, i: int, seconds: float) -> tuple[str, int, float, float]:
    t0 = time.time()
    time.sleep(seconds)
    return (team, i, t0, time.time())


def run(plugin: JobsPlugin) -> dict[str, float]:
    with (
        local_cluster(
            plugin, n_workers=1, threads_per_worker=8, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        with dask.annotate(team="a"):
            fa = client.map(job, ["a"] * 400, range(400), [0.05] * 400, pure=False)
        time.sleep(0.5)
        tb = time.time()
        with dask.annotate(team="b"):
            fb = client.map(job, ["b"] * 40, range(40), [0.05] * 40, pure=False)
        waits = [end - tb for *_, end in client.gather(fb)]
        a_end = max(end for *_, end in client.gather(fa)) - tb
    return {"b_median": statistics.median(waits), "b_all": max(waits), "a_end": a_end}


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--reps", type=int, default=None, help="reps (default 3; quick 1)")
    args = ap.parse_args(argv)
    reps = args.reps or (1 if args.quick else 3)
    runs = harness.alternate(
        {
            "fifo": lambda: run(JobsPlugin(policy="fifo")),
            "fair": lambda: run(
                JobsPlugin(policy="fair-share", teams={"targets": {"a": 1, "b": 1}})
            ),
        },
        reps,
        show=lambda name, rep, r: f"rep {rep} {name}: b median {r['b_median']:.2f} s",
    )
    rows = []
    for rep, (fifo, fair) in enumerate(zip(runs["fifo"], runs["fair"], strict=True)):
        rows.append(
            [
                rep,
                f"{fifo['b_median']:.2f}",
                f"{fair['b_median']:.2f}",
                f"{fair['b_median'] / fifo['b_median']:.3f}",
                f"{fifo['b_all']:.2f}",
                f"{fair['b_all']:.2f}",
                f"{fifo['a_end']:.2f}",
                f"{fair['a_end']:.2f}",
            ]
        )
    ratios = harness.paired_ratios(
        [r["b_median"] for r in runs["fair"]], [r["b_median"] for r in runs["fifo"]]
    )
    report = harness.Report("Fair share, two teams, live (laptop scale)", __file__, argv)
    report.section(
        None,
        harness.table(
            [
                "rep",
                "FIFO b median s",
                "fair b median s",
                "ratio",
                "FIFO b all s",
                "fair b all s",
                "FIFO a end s",
                "fair a end s",
            ],
            rows,
        )
        + "\n\nTeam b's median wait, fair share over FIFO (paired by rep): "
        + harness.spread(ratios).text()
        + "; the chapter's published ratio: 0.07.",
    )
    report.chart(
        harness.Chart(
            "Team b's wait after its submission",
            "seconds (median of the reps)",
            ["b median", "b last", "a last"],
            {
                label: [
                    statistics.median(r[k] for r in runs[name])
                    for k in ("b_median", "b_all", "a_end")
                ]
                for name, label in (("fifo", "FIFO"), ("fair", "fair share"))
            },
        )
    )
    report.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
