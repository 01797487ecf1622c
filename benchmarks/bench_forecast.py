"""When will it finish: ``daskjobs.forecast`` against the actual end, beside dask's rate
extrapolation, on three workloads on worker processes.

Usage::

    python benchmarks/bench_forecast.py --quick          # one seed, 30% of the sizes
    python benchmarks/bench_forecast.py                  # 3 seeds, the sizes the docs report
    python benchmarks/bench_forecast.py --seeds 5 --workload learned

Each workload (:mod:`forecast.workloads`: a grid sweep with a slow worker and backup copies;
an unannotated ``client.map`` sweep ranked by durations learned from a first sweep; two teams
under fair share) runs on a fresh ``dask scheduler --preload daskjobs.preload`` with 3
``dask worker`` processes x 2 threads. Once 10%, 25%, 50% and 75% of its tasks are done, the
client takes ``daskjobs.forecast(client)`` (30 draws) and dask's rate extrapolation (remaining
tasks / tasks done per second so far; and the same by work, which needs the durations dask
does not know), and afterwards the actual end (:mod:`forecast.measure`).

Reported per workload: each checkpoint's actual remaining time, the forecast's p10/p50/p90,
the error of p50 as a share of the actual remaining time, whether the p10-p90 band covers
the actual end, the rate extrapolation and its error, and the forecast's wall time on the
client; then the median |error| of p50 and of the rates, and the band's coverage, per
workload and over all (targets, issue 51: median |error| of p50 at most 10%, coverage at
least 80%), and the same for the snapshot forecast with its band computed from one
simulation (``band="computed"``, what a snapshot of more than ``SIMULATED / draws``
tasks gets). The last line printed is the summary as JSON.

Nothing here asserts.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import harness
from forecast import measure
from forecast.workloads import WORKLOADS

TARGET_ERROR, TARGET_COVERAGE = 0.10, 0.80


def _pct(x: float) -> str:
    return f"{100 * x:+.0f}%"


def _rows(seed: int, cps: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for c in cps:
        rows.append(
            [
                seed,
                f"{c['checkpoint']:.0%} ({c['done']:.0%})",
                f"{c['actual']:.1f}",
                f"{c['p10']:.1f} / {c['p50']:.1f} / {c['p90']:.1f}",
                _pct(measure.error(c)),
                "yes" if measure.covers(c) else "no",
                f"{c['rate']:.1f} ({_pct(measure.error(c, 'rate'))})",
                f"{c['rate_work']:.1f} ({_pct(measure.error(c, 'rate_work'))})",
                f"{c['wall']:.2f}",
            ]
        )
    return rows


HEADER = [
    "seed",
    "checkpoint (done)",
    "actual remaining s",
    "forecast p10 / p50 / p90 s",
    "p50 error",
    "band covers",
    "rate s (error)",
    "rate by work s (error)",
    "forecast s",
]


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, seeds=3)
    ap.add_argument("--workload", action="append", choices=list(WORKLOADS), help="(default: all)")
    ap.add_argument("--draws", type=int, default=30, help="the forecast's draws (default 30)")
    args = ap.parse_args(argv)
    seeds = harness.seeds(args, 3)
    names = args.workload or list(WORKLOADS)
    report = harness.Report("Forecasts against the actual end", __file__, argv)
    every: list[dict[str, Any]] = []
    summaries: dict[str, Any] = {}
    per_seed: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-forecast-") as tmp:
        for name in names:
            rows: list[list[Any]] = []
            cps_all: list[dict[str, Any]] = []
            for seed in seeds:
                cps = measure.run(WORKLOADS[name], seed, args.quick, Path(tmp), args.draws)
                s = measure.summary(cps)
                print(f"{name} seed {seed}: {json.dumps(s)}", file=sys.stderr, flush=True)
                per_seed.setdefault(name, []).append({"seed": seed, **s})
                rows += _rows(seed, cps)
                cps_all += cps
            s = measure.summary(cps_all)
            summaries[name] = s
            every += cps_all
            report.section(
                name,
                harness.table(HEADER, rows, "llrrrlrrr")
                + f"\n\nmedian |error| of p50 {s['p50_abs_error']:.1%}, band coverage "
                f"{s['coverage']:.0%} of {s['checkpoints']} checkpoints; rate extrapolation "
                f"{s['rate_abs_error']:.1%}, by work {s['rate_work_abs_error']:.1%}; forecast "
                f"{s['forecast_seconds']:.2f} s (median). The band computed from one "
                f"simulation: {s['computed_p50_abs_error']:.1%}, coverage "
                f"{s['computed_coverage']:.0%}, {s['computed_seconds']:.3f} s.",
            )
    overall = measure.summary(every)
    met = overall["p50_abs_error"] <= TARGET_ERROR and overall["coverage"] >= TARGET_COVERAGE
    report.note(f"seeds {seeds}; {args.draws} draws per forecast")
    report.chart(
        harness.Chart(
            "Median |error| of the remaining time",
            "share of the actual remaining time",
            names,
            {
                "forecast p50": [summaries[n]["p50_abs_error"] for n in names],
                "rate extrapolation": [summaries[n]["rate_abs_error"] for n in names],
            },
            reference=TARGET_ERROR,
        )
    )
    report.section(
        "Over all workloads",
        f"median |error| of p50 {overall['p50_abs_error']:.1%} (target at most "
        f"{TARGET_ERROR:.0%}), band coverage {overall['coverage']:.0%} (target at least "
        f"{TARGET_COVERAGE:.0%}), rate extrapolation {overall['rate_abs_error']:.1%}: targets "
        + ("met" if met else "NOT met")
        + f". The band computed from one simulation: {overall['computed_p50_abs_error']:.1%}, "
        f"coverage {overall['computed_coverage']:.0%}.",
    )
    report.emit(args)
    out = {"workloads": summaries, "seeds": per_seed, "overall": overall, "met": met}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
