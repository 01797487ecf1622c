"""The forecast's own time by the size of the work left, and its band drawn against computed.

Usage::

    python benchmarks/bench_forecast_time.py --quick                 # 10^3 and 10^4, 1 rep
    python benchmarks/bench_forecast_time.py --against /tmp/old      # old code side by side
    python benchmarks/bench_forecast_time.py --sizes 1000,100000 --reps 5 --policy node-aware

A hand-made snapshot (:func:`forecast.snapshots.sweep`: 50 stages alternately annotated and
learned, a quarter of them reading the stage before, two teams, 8 workers x 4 threads, one
2x slow, 32 tasks running) of each size is forecast as ``daskjobs.forecast`` does once it
has the snapshot (``forecast_snapshot(snap)``, 30 draws (``--draws``), the defaults; wall
and CPU time), each call in a
fresh interpreter, the snapshot made there and not timed. ``--against DIR`` times the
``daskjobs`` of DIR (an older checkout: ``git archive <commit> daskjobs | tar -x -C DIR``)
on the same snapshots, the two alternated rep by rep (the order rotated): the table gives
each one's median time and range, and the median and range of the reps' ratios new / old,
with the load average before and after.

Then, with the current code only, the band made both ways on the same snapshots up to
``--drawn-upto`` tasks (``band="drawn"``: 30 simulations; ``band="computed"``: one, the
range computed from it): p10 / p50 / p90 of the remaining time overall and per team, and
the computed ones over the drawn ones. Nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness

HERE = Path(__file__).resolve()
SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (1_000, 10_000)


def child(size: int, policy: str, band: str, draws: int) -> dict[str, Any]:
    """One forecast of a fresh snapshot of ``size`` tasks, timed (this interpreter)."""
    sys.path.insert(0, str(HERE.parent))
    from forecast.snapshots import sweep

    import daskjobs
    from daskjobs.forecasting import forecast_snapshot

    snap = sweep(size, policy=policy)
    kw: dict[str, Any] = {"draws": draws} if band == "auto" else {"draws": draws, "band": band}
    t0, c0 = time.perf_counter(), time.process_time()
    f = forecast_snapshot(snap, **kw)
    took, cpu = time.perf_counter() - t0, time.process_time() - c0
    q = {"p10": f.remaining.p10, "p50": f.remaining.p50, "p90": f.remaining.p90}
    teams = {t: [r.p10, r.p50, r.p90] for t, r in f.teams.items()}
    return {"seconds": took, "cpu": cpu, "draws": f.draws, "band": getattr(f, "band", "drawn"),
            "remaining": q, "teams": teams, "package": daskjobs.__file__}  # fmt: skip


def run_child(size: int, policy: str, band: str, draws: int, package: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    if package is not None:
        env["PYTHONPATH"] = os.pathsep.join([package, *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, str(HERE), "--child", f"{size}:{policy}:{band}:{draws}"]
    out = subprocess.run(cmd, env=env, cwd="/", check=True, capture_output=True, text=True)
    got: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if package is not None and not got["package"].startswith(str(Path(package).resolve())):
        raise RuntimeError(f"--against {package}: the child imported {got['package']}")
    return got


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def timing(args: Any, sizes: list[int], report: harness.Report) -> None:
    runs: dict[str, Any] = {"new": lambda s: run_child(s, args.policy, "auto", args.draws, None)}
    if args.against:
        runs["old"] = lambda s: run_child(s, args.policy, "auto", args.draws, args.against)
    header = ["tasks", "new s", "new CPU s", "new draws (band)"]
    if args.against:
        header += ["old s", "old CPU s", "old draws", "new / old"]
    header.append("load before / after")
    rows = []
    for size in sizes:
        before = _load()
        got = harness.alternate(
            {name: (lambda fn=fn, size=size: fn(size)) for name, fn in runs.items()},
            args.reps,
            show=lambda name, rep, r, size=size: f"{size} {name} rep {rep}: {r['seconds']:.2f} s",
        )
        new = got["new"]
        row = [f"{size:,}", harness.spread(r["seconds"] for r in new).text(".2f"),
               harness.spread(r["cpu"] for r in new).text(".2f"),
               f"{new[0]['draws']} ({new[0]['band']})"]  # fmt: skip
        if args.against:
            old = got["old"]
            ratios = harness.paired_ratios([r["seconds"] for r in new], [r["seconds"] for r in old])
            row += [harness.spread(r["seconds"] for r in old).text(".2f"),
                    harness.spread(r["cpu"] for r in old).text(".2f"), str(old[0]["draws"]),
                    harness.spread(ratios).text(".3f", "x")]  # fmt: skip
        rows.append([*row, f"{before} / {_load()}"])
    report.section(
        f"Forecast time ({args.policy}, {args.draws} draws asked, median and range of "
        f"{args.reps} reps)",
        harness.table(header, rows, "r" * len(header)),
    )


def bands(args: Any, sizes: list[int], report: harness.Report) -> None:
    rows = []
    for size in [s for s in sizes if s <= args.drawn_upto]:
        drawn = run_child(size, args.policy, "drawn", args.draws, None)
        comp = run_child(size, args.policy, "computed", args.draws, None)
        whats = [("all", drawn["remaining"], comp["remaining"])]
        whats += [(f"team {t}", dict(zip(("p10", "p50", "p90"), drawn["teams"][t], strict=True)),
                   dict(zip(("p10", "p50", "p90"), comp["teams"][t], strict=True)))
                  for t in sorted(drawn["teams"])]  # fmt: skip
        for what, d, c in whats:
            rows.append(
                [
                    f"{size:,}",
                    what,
                    " / ".join(f"{d[p]:.1f}" for p in ("p10", "p50", "p90")),
                    " / ".join(f"{c[p]:.1f}" for p in ("p10", "p50", "p90")),
                    " / ".join(f"{c[p] / d[p]:.3f}" for p in ("p10", "p50", "p90")),
                    f"{drawn['seconds']:.2f} / {comp['seconds']:.2f}",
                ]
            )
    report.section(
        f"The band drawn ({args.draws} simulations) and computed (one), {args.policy}",
        harness.table(
            [
                "tasks",
                "end of",
                "drawn p10 / p50 / p90 s",
                "computed p10 / p50 / p90 s",
                "computed / drawn",
                "seconds drawn / computed",
            ],
            rows,
            "rlrrrr",
        ),
    )


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--child", help=argparse.SUPPRESS)  # SIZE:POLICY:BAND, one forecast
    ap.add_argument("--against", metavar="DIR", help="also time the daskjobs package in DIR")
    ap.add_argument("--sizes", help="comma-separated task counts (default 1000,10000,100000)")
    ap.add_argument("--reps", type=int, default=3, help="reps per size and code (default 3)")
    ap.add_argument("--policy", default="lpt", help="the snapshot's policy (default lpt)")
    ap.add_argument("--draws", type=int, default=30, help="draws asked (default 30)")
    ap.add_argument(
        "--drawn-upto",
        type=int,
        default=10_000,
        help="sizes up to which the band is made both ways (default 10000)",
    )
    args = ap.parse_args(argv)
    if args.child:
        size, policy, band, draws = args.child.split(":")
        print(json.dumps(child(int(size), policy, band, int(draws))))
        return 0
    if args.sizes:
        sizes = [int(s) for s in args.sizes.split(",")]
    else:
        sizes = list(QUICK_SIZES if args.quick else SIZES)
    if args.quick:
        args.reps = 1
    report = harness.Report("The forecast's own time", __file__, argv)
    timing(args, sizes, report)
    bands(args, sizes, report)
    report.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
