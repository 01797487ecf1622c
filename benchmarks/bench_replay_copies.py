"""Replay of recordings with speculation: the copies launched and won, recorded vs replayed.

Each run records a sweep with the plugin's speculation on and one worker several times
slower, then replays the recording under the settings that ran (the policy, its options
and the speculation recorded) twice: on the recorded placement (``placement="recorded"``,
each task's first attempt on the worker and in the order it ran: the replay comparable
race by race, which the copies are held to) and on the simulated placement
(``replay(loaded)``, where which tasks reach the slow worker is the simulator's own
decision, so other tasks get the copies). The table gives, per run, the copies launched /
won in the recording and in each replay, and the tasks copied by one and not the other.

The sweep: ``--tasks`` (200) independent tasks, log-normal durations (median 60 ms,
spread 0.6, at most 0.4 s), each annotated with its duration as its estimate; 3
workers x 2 threads, worker 0 four times slower; speculation with late factor 2.0,
``min-runtime`` 100 ms, ``interval`` 50 ms. Clusters: ``threads`` (a LocalCluster in
this process, ``processes=False``) and ``processes`` (a ``dask scheduler`` with the
plugin preloaded and three ``dask worker`` processes: the harness of
tests/helpers/realcluster.py, through ``harness.processes``). Policies: ``lpt`` and
``node-aware``. Seeds: ``--seeds`` (3) each.

Usage::

    python benchmarks/bench_replay_copies.py [--seeds 3] [--tasks 200] [--out DIR]
    python benchmarks/bench_replay_copies.py --quick   # threads, lpt, one seed, 80 tasks
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

SLOW = 4.0
SPECULATION = {"enabled": True, "late-factor": 2.0, "min-runtime": "100ms", "interval": "50ms"}
CLUSTERS = ("threads", "processes")
POLICIES = ("lpt", "node-aware")


def _nap(i: int, d: float) -> int:
    from distributed import get_worker

    time.sleep(d * (SLOW if get_worker().name == 0 else 1.0))
    return i


def durations(n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [min(0.4, rng.lognormvariate(-2.8, 0.6)) for _ in range(n)]


def graph(n: int, seed: int, fn: Any) -> list[Any]:
    out = []
    for i, d in enumerate(durations(n, seed)):
        with dask.annotate(estimate=d):
            out.append(dask.delayed(fn)(i, d, dask_key_name=f"t-{i}"))
    return out


def record_threads(path: Path, policy: str, n: int, seed: int) -> None:
    from distributed import Client, LocalCluster

    from daskjobs.plugin import JobsPlugin

    spec = {k.replace("-", "_"): v for k, v in SPECULATION.items()}
    plugin = JobsPlugin(policy=policy, record=str(path), speculation=spec)
    with (
        LocalCluster(
            n_workers=3,
            threads_per_worker=2,
            processes=False,
            dashboard_address=":0",
            scheduler_kwargs={"plugins": [plugin]},
        ) as cl,
        Client(cl) as c,
    ):
        c.compute(graph(n, seed, _nap), sync=True)


def record_processes(path: Path, policy: str, n: int, seed: int) -> None:
    config = {"daskjobs": {"policy": policy, "speculation": SPECULATION, "record": str(path)}}
    nap = realtasks().nap
    with realcluster().RealCluster(
        path.parent / f"{path.stem}-cluster",
        config=config,
        env={"DASKJOBS_TEST_SLOW": f"w0={SLOW:g}"},
    ) as rc:
        with rc.client() as c:
            c.compute(graph(n, seed, nap), sync=True)
        rc.close()  # the trace is complete once the scheduler stops


def compare(path: Path) -> dict[str, Any]:
    loaded = load(path)
    rec = loaded.copies  # tid -> "won" / "lost" / ...
    row: dict[str, Any] = {
        "recorded": (loaded.recorded.backups["launched"], loaded.recorded.backups["won"]),
        "slow": max(loaded.cluster.speeds),
    }
    for name, placement in (("simulated", "simulated"), ("placed", "recorded")):
        r = replay(loaded, placement=placement)
        got = {c.tid for c in r.copies() if c.replayed is not None}
        row[name] = {
            "copies": (r.schedule.backups_launched, r.schedule.backups_won),
            "only_recorded": sorted(str(t) for t in set(rec) - got),
            "only_replayed": sorted(str(t) for t in got - set(rec)),
        }
    return row


def within_one(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return abs(a[0] - b[0]) <= 1 and abs(a[1] - b[1]) <= 1


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, seeds=3)
    ap.add_argument("--tasks", type=int, default=None, help="tasks per run (200; quick 80)")
    ap.add_argument("--out", type=Path, default=None, help="keep the traces in this directory")
    ap.add_argument("--cluster", choices=CLUSTERS, action="append", help="(default: both)")
    ap.add_argument("--policy", choices=POLICIES, action="append", help="(default: both)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = ap.parse_args(argv)
    n = args.tasks or (80 if args.quick else 200)
    clusters = args.cluster or (["threads"] if args.quick else list(CLUSTERS))
    policies = args.policy or (["lpt"] if args.quick else list(POLICIES))
    out = args.out or Path(tempfile.mkdtemp(prefix="daskjobs-replay-copies-"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for cluster in clusters:
        for policy in policies:
            for seed in harness.seeds(args, 3):
                path = out / f"{cluster}-{policy}-{seed}.jsonl"
                rec = record_threads if cluster == "threads" else record_processes
                rec(path, policy, n, seed)
                rows.append({"cluster": cluster, "policy": policy, "seed": seed, **compare(path)})
                rows[-1]["trace"] = str(path)
                if not args.json:
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    report = harness.Report("Replay copies", __file__, argv)
    ok = sum(within_one(r["recorded"], r["simulated"]["copies"]) for r in rows)
    ok_placed = sum(within_one(r["recorded"], r["placed"]["copies"]) for r in rows)
    report.section(
        f"Copies launched / won, {n} tasks, worker 0 {SLOW:g}x slow",
        _table(rows) + f"\n\nwithin one of the recording: {ok} of {len(rows)} replays (simulated "
        f"placement), {ok_placed} of {len(rows)} (recorded placement)",
    )
    report.chart(
        harness.Chart(
            "Copies launched, recorded and replayed",
            "copies",
            [f"{r['cluster'][0]}-{r['policy']}-{r['seed']}" for r in rows],
            {
                "recorded": [r["recorded"][0] for r in rows],
                "replayed, recorded placement": [r["placed"]["copies"][0] for r in rows],
                "replayed, simulated placement": [r["simulated"]["copies"][0] for r in rows],
            },
        )
    )
    report.emit(args)
    return 0


def _pair(p: tuple[int, int]) -> str:
    return f"{p[0]} / {p[1]}"


def _table(rows: list[dict[str, Any]]) -> str:
    header = [
        "cluster",
        "policy",
        "seed",
        "slow measured",
        "recorded",
        "replayed, simulated placement",
        "only recorded / only replayed",
        "replayed, recorded placement",
        "only recorded / only replayed",
    ]
    cells = []
    for r in rows:
        cells.append(
            [
                r["cluster"],
                r["policy"],
                r["seed"],
                f"{r['slow']:.2f}x",
                _pair(r["recorded"]),
                _pair(r["simulated"]["copies"])
                + ("" if within_one(r["recorded"], r["simulated"]["copies"]) else " (NO)"),
                f"{', '.join(r['simulated']['only_recorded']) or '-'} / "
                f"{', '.join(r['simulated']['only_replayed']) or '-'}",
                _pair(r["placed"]["copies"])
                + ("" if within_one(r["recorded"], r["placed"]["copies"]) else " (NO)"),
                f"{', '.join(r['placed']['only_recorded']) or '-'} / "
                f"{', '.join(r['placed']['only_replayed']) or '-'}",
            ]
        )
    return harness.table(header, cells, "lllrrrlrl")


if __name__ == "__main__":
    sys.exit(main())
