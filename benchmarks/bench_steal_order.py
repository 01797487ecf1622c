"""Does dask's work stealing undo the plugin's order? Steals against it, before and after.

dask's work stealing picks which task to move from a busy worker to an idle one
without looking at priorities (dask/distributed#8992). On a sweep with a slow worker,
that can start a short task on an idle fast worker while a long one, ranked ahead of
it by the plugin, waits on the slow worker. This counts such steals, with dask's own
choice ("before") and with the plugin's (``daskjobs.plugin.surgery._internals.steal_in_order``,
on by default: the victim's best-ranked waiting task moves instead), side by side in
one run.

A steal is *against the plugin's order* when the stolen task started on the thief
before a task of better rank (lower ``TaskState.priority``) that then ran on the victim
started there: the victim held a better task that could have moved instead.

The sweep: ``--tasks`` independent tasks with lognormal durations (median 0.05 s,
sigma 1), each annotated with its exact estimate, on a ``LocalCluster`` of 4 workers x
2 threads in this process; worker 0 runs every task 4x slower. The plugin runs its
default policy (critical path: longest first on a flat sweep). Each configuration runs
with dask's default ``worker-saturation`` (1.1: root tasks wait in the scheduler's
queue) and with queuing off (``inf``: every task is sent to a worker at once, where
stealing has the most to move).

    python benchmarks/bench_steal_order.py [--tasks 400] [--reps 3]
    python benchmarks/bench_steal_order.py --quick     # 200 tasks, one run each

Prints markdown with the command and the machine (``--markdown``/``--plot`` write it and
a PNG). A script, not a test.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from typing import Any

import dask
import harness
from distributed import Client, LocalCluster, get_worker

from daskjobs import JobsPlugin
from daskjobs.plugin.surgery import _internals

SLOW = {"0": 4.0}


def work(i: int, seconds: float) -> tuple[int, float, str]:
    """Sleep ``seconds`` (4x on worker 0); return when it started and where."""
    name = str(get_worker().name)
    t0 = time.time()
    time.sleep(seconds * SLOW.get(name, 1.0))
    return i, t0, name


def _order(dask_scheduler: Any, enabled: bool) -> bool:
    return _internals.steal_in_order(dask_scheduler, enabled)


def _priorities(dask_scheduler: Any, keys: list[str]) -> dict[str, tuple[float, ...]]:
    return {k: tuple(dask_scheduler.tasks[k].priority) for k in keys}


def run(n: int, seed: int, saturation: float, in_order: bool) -> dict[str, Any]:
    rng = random.Random(seed)
    durations = [min(rng.lognormvariate(-3.0, 1.0), 1.0) for _ in range(n)]
    config = {"distributed.scheduler.worker-saturation": saturation}
    with (
        dask.config.set(config),
        LocalCluster(
            n_workers=4,
            threads_per_worker=2,
            processes=False,
            dashboard_address=":0",
            scheduler_kwargs={"plugins": [JobsPlugin()]},
        ) as cluster,
        Client(cluster) as c,
    ):
        assert c.run_on_scheduler(_order, enabled=in_order) == in_order
        names = {a: str(w["name"]) for a, w in c.scheduler_info()["workers"].items()}
        parts = []
        for i, d in enumerate(durations):
            with dask.annotate(estimate=d):
                parts.append(dask.delayed(work)(i, d, dask_key_name=f"t-{i:05d}"))
        futs = c.compute(parts)
        out = c.gather(futs)
        prio = c.run_on_scheduler(_priorities, keys=[f.key for f in futs])
        events = c.get_events("stealing")
    started = {f"t-{i:05d}": (t0, name) for i, t0, name in out}
    confirms = [e for _, e in events if isinstance(e, tuple | list) and e and e[0] == "confirm"]
    against = 0
    for _, key, _state, victim, _thief, *_ in confirms:
        key = str(key)
        t_start, _ = started[key]
        victim_name = names.get(victim, victim)
        if any(
            name == victim_name and prio[k] < prio[key] and t0 > t_start
            for k, (t0, name) in started.items()
        ):
            against += 1
    makespan = max(t0 for t0, _ in started.values()) - min(t0 for t0, _ in started.values())
    return {"steals": len(confirms), "against": against, "makespan": makespan}


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--tasks", type=int, default=None, help="tasks per sweep (400; quick 200)")
    ap.add_argument("--reps", type=int, default=None, help="runs per configuration (3; quick 1)")
    args = ap.parse_args(argv)
    n = args.tasks or (200 if args.quick else 400)
    reps = args.reps or (1 if args.quick else 3)
    rows = []
    for saturation in (1.1, float("inf")):
        for in_order in (False, True):
            runs = []
            for seed in range(reps):
                r = run(n, seed, saturation, in_order)
                runs.append(r)
                print(
                    f"  saturation {saturation} {'plugin order' if in_order else 'dask order'} "
                    f"seed {seed}: {r}",
                    file=sys.stderr,
                )
            rows.append((saturation, in_order, runs))
    report = harness.Report("Work stealing and the plugin's order", __file__, argv)
    report.note(f"{n} tasks, {reps} run(s) per configuration")
    lines = []
    for saturation, in_order, runs in rows:
        steals = [r["steals"] for r in runs]
        against = [r["against"] for r in runs]
        share = sum(against) / max(sum(steals), 1)
        picks = "the plugin (best-ranked waiting task)" if in_order else "dask (any)"
        lines.append(
            [
                f"{saturation:g}",
                picks,
                ", ".join(map(str, steals)),
                ", ".join(map(str, against)),
                f"{share:.0%}",
                f"{statistics.median(r['makespan'] for r in runs):.2f}",
            ]
        )
    header = [
        "worker-saturation",
        "stealing picks",
        "steals (per run)",
        "against the plugin's order (per run)",
        "share",
        "makespan median (s)",
    ]
    report.section(None, harness.table(header, lines, "llllrr"))
    groups = [f"saturation {s:g}" for s in (1.1, float("inf"))]
    report.chart(
        harness.Chart(
            "Steals against the plugin's order",
            "steals per run (median)",
            groups,
            {
                label: [
                    statistics.median(r["against"] for r in runs)
                    for _s, o, runs in rows
                    if o == in_order
                ]
                for in_order, label in ((False, "dask picks"), (True, "the plugin picks"))
            },
        )
    )
    report.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
