"""Gangs among a stream of small GPU tasks: reservation and backfill off and on.

Usage::

    python benchmarks/bench_gangs.py                     # the simulator part (the default)
    python benchmarks/bench_gangs.py --sim --seeds 5 --hours 72 --loads 0.7,0.9
    python benchmarks/bench_gangs.py --json              # one JSON object instead
    python benchmarks/bench_gangs.py --live              # live on a LocalCluster (~5 min)
    python benchmarks/bench_gangs.py --sim --live        # both
    python benchmarks/bench_gangs.py --quick             # the simulator, 1 seed x 24 h

``--sim``: the documented mixed workload of docs/explanation/resources.md
(:func:`daskjobs.sim.gangs.synthetic_gangs`: 16 nodes x 8 GPUs, half A100 80 GB, half V100
32 GB; a Poisson stream of 1- and 2-GPU tasks and gangs of 2-8 members x 1-8 GPUs, 40% of
the gangs A100 only; half the offered GPU load from gangs) at scale - ``--hours`` of
arrivals (72 h: about 10,000 demands per seed), every seed of ``--seeds``, at each load of
``--loads`` - under ``GangPolicy(reservation=False)`` and ``GangPolicy(reservation=True)``
side by side on the same demands. Per load and policy: gang wait p50 / p95 / max, single-
task wait p50 / p95 (hours, arrival to start), GPU utilisation over the makespan and over
the hours of arrivals, fragmentation (free GPUs no waiting request fits: time average, and
its share of the free GPU-time while work waited), each as the median over the seeds with
its range; and the simulator's wall time per run (``time.perf_counter`` around
``simulate_gangs`` only).

``--live``: the same workload shrunk to a laptop and run on dask - a ``LocalCluster``
in this process, 4 workers of 4 GPUs (``--resources GPU=4``; inventories from
``daskjobs.inventory``: workers 0-1 A100 80 GB, 2-3 V100 32 GB), sleep tasks of the
workload's run times with time scaled by ``--scale`` (default 1/1200: a simulated hour
is 3 s), ``--live-hours`` of arrivals (default 12: about 36 s), submitted at their
arrival times from a thread with their requests as annotations (``resources``,
``accelerator``, ``gpu_memory``, ``gang``/``gang_size``, ``estimate``). Three runs per
seed of ``--live-seeds``, on fresh clusters: plain dask (dask's own resource counts
only: it knows neither accelerator types nor gangs), the plugin's placer without and
with the reservation. Per run: gang wait (arrival to the start of its first member; for
plain dask also to its last member's start, when the whole gang runs), the spread of a
gang's member starts, single-task wait p50 / p95, GPU utilisation (GPU-seconds the
tasks ran over 16 GPUs x first arrival to last end), fragmentation (the placer's
GPU-seconds free that no waiting request fitted, as an average in GPUs), the members
and tasks that ran on a GPU type they did not ask for; and what the simulator predicts
for the same demands (scaled times). Waits in seconds of the live run.

Prints markdown with the command and the machine (``--markdown``/``--plot`` write it and
a PNG: gang wait p95 by load, reservation off and on). With ``--quick``, the defaults
shrink (``--seeds 1 --hours 24``; live ``--live-seeds 1 --live-hours 4``). This is a
script, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import harness
import numpy as np

from daskjobs.policies.resources import GangPolicy
from daskjobs.sim.gangs import gang_metrics, simulate_gangs, synthetic_gangs

REPO = Path(__file__).resolve().parent.parent

#: (metric, column title, scale): waits in hours.
COLUMNS = (
    ("gang_wait_p50_s", "gang p50 h", 1 / 3600),
    ("gang_wait_p95_s", "gang p95 h", 1 / 3600),
    ("gang_wait_max_s", "gang max h", 1 / 3600),
    ("single_wait_p50_s", "task p50 h", 1 / 3600),
    ("single_wait_p95_s", "task p95 h", 1 / 3600),
    ("utilisation", "util", 1.0),
    ("utilisation_arrivals", "util (arrivals)", 1.0),
    ("fragmentation_units", "frag GPUs", 1.0),
    ("fragmentation_share", "frag share", 1.0),
    ("seconds", "sim s/run", 1.0),
)


def sim_part(seeds: Sequence[int], hours: float, loads: Sequence[float]) -> dict[str, Any]:
    """Every (load, seed): both policies on the same demands."""
    runs: list[dict[str, Any]] = []
    for load in loads:
        for seed in seeds:
            w = synthetic_gangs(seed, hours=hours, load=load)
            for reservation in (False, True):
                t0 = time.perf_counter()
                run = simulate_gangs(w.nodes, w.demands, GangPolicy(reservation=reservation))
                seconds = time.perf_counter() - t0
                m = gang_metrics(w.demands, run, until=hours * 3600.0)
                runs.append(
                    {
                        "load": load,
                        "seed": seed,
                        "reservation": reservation,
                        "demands": len(w.demands),
                        "gangs_count": w.description["gangs"],
                        "seconds": seconds,
                        **m,
                    }
                )
                print(
                    f"load {load:g} seed {seed} reservation {'on' if reservation else 'off'}: "
                    f"{len(w.demands):,} demands in {seconds:.1f} s",
                    file=sys.stderr,
                )
    return {"hours": hours, "seeds": list(seeds), "loads": list(loads), "runs": runs}


def _spread(values: list[float], scale: float) -> str:
    v = np.array(values) * scale
    return f"{np.median(v):.2f} ({v.min():.2f}-{v.max():.2f})"


def sim_markdown(report: dict[str, Any]) -> str:
    runs = report["runs"]
    lines = [
        f"### Simulator: {report['hours']:g} h of arrivals, seeds {report['seeds']}",
        "",
        "Median over the seeds (min-max). Waits from arrival to start, in hours.",
        "",
    ]
    for load in report["loads"]:
        here = [r for r in runs if r["load"] == load]
        demands = [r["demands"] for r in here if not r["reservation"]]
        gangs = [r["gangs_count"] for r in here if not r["reservation"]]
        lines += [
            f"Load {load:g}: {min(demands):,}-{max(demands):,} demands per seed "
            f"({min(gangs)}-{max(gangs)} gangs).",
            "",
            "| reservation | " + " | ".join(title for _, title, _ in COLUMNS) + " |",
            "|---|" + "---:|" * len(COLUMNS),
        ]
        for reservation in (False, True):
            rows = [r for r in here if r["reservation"] is reservation]
            cells = [_spread([r[key] for r in rows], scale) for key, _, scale in COLUMNS]
            lines.append(f"| {'on' if reservation else 'off'} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


# -- live on a LocalCluster -------------------------------------------------------------

LIVE_NODES, LIVE_GPUS = 4, 4
LIVE_INVENTORY = {
    "by-name": {
        str(i): {
            "accelerator": "A100" if i < LIVE_NODES // 2 else "V100",
            "gpus": LIVE_GPUS,
            "gpu_memory": "80GB" if i < LIVE_NODES // 2 else "32GB",
        }
        for i in range(LIVE_NODES)
    }
}


def _run_task(seconds: float) -> tuple[float, float, str]:
    from distributed import get_worker

    t0 = time.time()
    time.sleep(seconds)
    return t0, time.time(), str(get_worker().name)


def _annotations(req: Any) -> dict[str, Any]:
    ann: dict[str, Any] = {"resources": dict(req.resources)}
    if req.accelerator:
        ann["accelerator"] = list(req.accelerator)
    if req.gpu_memory:
        ann["gpu_memory"] = req.gpu_memory
    return ann


def live_run(demands: Sequence[Any], scale: float, config: str) -> dict[str, Any]:
    """One run of ``demands`` (times scaled) on a fresh LocalCluster under ``config``:
    ``plain`` (no plugin), ``off`` / ``on`` (the placer without / with reservation)."""
    import threading

    import dask
    from distributed import Client, LocalCluster

    from daskjobs.plugin import JobsPlugin

    plugins = []
    if config != "plain":
        plugins.append(
            JobsPlugin(
                policy="fifo",
                resources={"enabled": True, "reservation": config == "on", "interval": "50ms"},
            )
        )
    with (
        dask.config.set({"daskjobs.inventory": LIVE_INVENTORY}),
        LocalCluster(
            n_workers=LIVE_NODES,
            threads_per_worker=2 * LIVE_GPUS,
            processes=False,
            resources={"GPU": LIVE_GPUS},
            dashboard_address=":0",
            scheduler_kwargs={"plugins": plugins},
        ) as cluster,
        Client(cluster) as c,
    ):
        if plugins:
            deadline = time.time() + 60
            while True:
                st = c.run_on_scheduler(
                    lambda dask_scheduler: dask_scheduler.plugins["daskjobs"].placer.status()
                )
                if sum(w["reported"] for w in st["workers"].values()) == LIVE_NODES:
                    break
                if time.time() > deadline:
                    raise RuntimeError("the workers did not report their inventories")
                time.sleep(0.05)
        futures: dict[str, list[Any]] = {}
        submitted: dict[str, float] = {}
        t0 = time.time() + 0.5

        def submit_all() -> None:
            for d in sorted(demands, key=lambda d: d.arrival):
                delay = t0 + d.arrival * scale - time.time()
                if delay > 0:
                    time.sleep(delay)
                est = None if d.estimate is None else d.estimate * scale
                did = str(d.did)
                submitted[did] = time.time()
                fs = []
                for m, req in enumerate(d.requests):
                    ann = _annotations(req)
                    if est is not None:
                        ann["estimate"] = est
                    if d.gang:
                        ann.update(gang=did, gang_size=len(d.requests))
                    with dask.annotate(**ann):
                        key = f"{did}-{m}" if d.gang else did
                        fs.append(c.submit(_run_task, d.duration * scale, key=key, pure=False))
                futures[did] = fs

        thread = threading.Thread(target=submit_all, daemon=True)
        thread.start()
        thread.join()
        results = {did: c.gather(fs) for did, fs in futures.items()}
        placer = None
        if plugins:
            placer = c.run_on_scheduler(
                lambda dask_scheduler: dask_scheduler.plugins["daskjobs"].placer.status()
            )
    by_did = {str(d.did): d for d in demands}
    gang_first, gang_all, spreads, singles = [], [], [], []
    busy = 0.0
    wrong = 0
    a100_workers = {str(i) for i in range(LIVE_NODES // 2)}
    for did, res in results.items():
        d = by_did[did]
        starts = [r[0] for r in res]
        for (s0, s1, worker), req in zip(res, d.requests, strict=True):
            busy += req.resources.get("GPU", 0.0) * (s1 - s0)
            if req.accelerator and (worker in a100_workers) != ("A100" in req.accelerator):
                wrong += 1
        if d.gang:
            gang_first.append(min(starts) - submitted[did])
            gang_all.append(max(starts) - submitted[did])
            spreads.append(max(starts) - min(starts))
        else:
            singles.append(starts[0] - submitted[did])
    first = min(submitted.values())
    last = max(r[1] for res in results.values() for r in res)
    span = last - first
    return {
        "config": config,
        "gangs": len(gang_first),
        "singles": len(singles),
        "gang_wait_p50_s": float(np.percentile(gang_first, 50)),
        "gang_wait_p95_s": float(np.percentile(gang_first, 95)),
        "gang_wait_max_s": float(max(gang_first)),
        "gang_whole_max_s": float(max(gang_all)),
        "gang_spread_max_s": float(max(spreads)),
        "single_wait_p50_s": float(np.percentile(singles, 50)),
        "single_wait_p95_s": float(np.percentile(singles, 95)),
        "utilisation": busy / (LIVE_NODES * LIVE_GPUS * span),
        "fragmentation_gpus": (placer["fragmented_seconds"] / span) if placer else None,
        "wrong_type": wrong,
        "placer_errors": None if placer is None else placer.get("refused", 0),
        "makespan_s": span,
    }


def live_part(seeds: Sequence[int], hours: float, scale: float) -> dict[str, Any]:
    """Per seed: plain dask, the placer without and with reservation, live; and the
    simulator's prediction for the same demands (scaled)."""
    runs = []
    for seed in seeds:
        w = synthetic_gangs(
            seed, hours=hours, nodes=LIVE_NODES, gpus_per_node=LIVE_GPUS, gang_max_gpus=8
        )
        predicted = {}
        for reservation in (False, True):
            run = simulate_gangs(w.nodes, w.demands, GangPolicy(reservation=reservation))
            m = gang_metrics(w.demands, run)
            predicted["on" if reservation else "off"] = {
                "gang_wait_max_s": m["gang_wait_max_s"] * scale,
                "gang_wait_p95_s": m["gang_wait_p95_s"] * scale,
                "utilisation": m["utilisation"],
            }
        for config in ("plain", "off", "on"):
            r = live_run(w.demands, scale, config)
            r.update(seed=seed, demands=len(w.demands), predicted=predicted.get(config))
            runs.append(r)
            print(
                f"live seed {seed} {config}: gang max wait {r['gang_wait_max_s']:.2f} s, "
                f"utilisation {r['utilisation']:.2f}",
                file=sys.stderr,
            )
    return {"hours": hours, "scale": scale, "seeds": list(seeds), "runs": runs}


LIVE_COLUMNS = (
    ("gang_wait_p50_s", "gang p50 s"),
    ("gang_wait_p95_s", "gang p95 s"),
    ("gang_wait_max_s", "gang max s"),
    ("gang_whole_max_s", "whole gang max s"),
    ("gang_spread_max_s", "member start spread max s"),
    ("single_wait_p50_s", "task p50 s"),
    ("single_wait_p95_s", "task p95 s"),
    ("utilisation", "util"),
    ("fragmentation_gpus", "frag GPUs"),
    ("wrong_type", "wrong GPU type"),
)
LIVE_NAMES = {"plain": "plain dask", "off": "placer, no reservation", "on": "placer, reservation"}


def live_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"### Live: LocalCluster, {LIVE_NODES} workers x {LIVE_GPUS} GPUs, "
        f"{report['hours']:g} simulated hours at a scale of {report['scale']:g}",
        "",
        "| seed | run | demands | gangs | "
        + " | ".join(t for _, t in LIVE_COLUMNS)
        + " | simulator: gang max s / util |",
        "|---|---|---:|---:|" + "---:|" * (len(LIVE_COLUMNS) + 1),
    ]
    for r in report["runs"]:
        cells = []
        for key, _ in LIVE_COLUMNS:
            v = r[key]
            cells.append("-" if v is None else (f"{v}" if isinstance(v, int) else f"{v:.2f}"))
        p = r["predicted"]
        pred = "-" if p is None else f"{p['gang_wait_max_s']:.2f} / {p['utilisation']:.2f}"
        lines.append(
            f"| {r['seed']} | {LIVE_NAMES[r['config']]} | {r['demands']} | {r['gangs']} | "
            + " | ".join(cells)
            + f" | {pred} |"
        )
    lines.append("")
    return "\n".join(lines)


#: The parts of this benchmark: name -> (run, markdown).
PARTS: dict[str, tuple[Callable[[argparse.Namespace], dict[str, Any]], Callable[..., str]]] = {
    "sim": (lambda a: sim_part(range(a.seeds), a.hours, a.loads), sim_markdown),
    "live": (lambda a: live_part(range(a.live_seeds), a.live_hours, a.scale), live_markdown),
}


def _loads(text: str) -> list[float]:
    try:
        loads = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected loads such as 0.7,0.9") from None
    if not all(0 < x <= 1.5 for x in loads):
        raise argparse.ArgumentTypeError(f"{text!r}: every load must be in (0, 1.5]")
    return loads


def chart(sim: dict[str, Any]) -> harness.Chart:
    """Gang wait p95 (hours, median over the seeds) per load, reservation off and on."""
    loads = sim["loads"]
    return harness.Chart(
        "Gang wait p95, simulator",
        "hours (median over seeds)",
        [f"load {x:g}" for x in loads],
        {
            f"reservation {'on' if res else 'off'}": [
                float(
                    np.median(
                        [
                            r["gang_wait_p95_s"] / 3600
                            for r in sim["runs"]
                            if r["load"] == x and r["reservation"] is res
                        ]
                    )
                )
                for x in loads
            ]
            for res in (False, True)
        },
    )


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--sim", action="store_true", help="the simulator part (the default)")
    ap.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 5; quick 1)")
    ap.add_argument("--hours", type=float, default=None, help="hours of arrivals (72; quick 24)")
    ap.add_argument(
        "--loads", type=_loads, default=[0.7, 0.9], help="offered GPU loads (default 0.7,0.9)"
    )
    ap.add_argument("--live", action="store_true", help="live on a LocalCluster")
    ap.add_argument("--live-seeds", type=int, default=None, help="live seeds 0..N-1 (2; quick 1)")
    ap.add_argument(
        "--live-hours", type=float, default=None, help="simulated hours of arrivals, live (12; 4)"
    )
    ap.add_argument(
        "--scale", type=float, default=1 / 1200, help="live seconds per simulated second"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = ap.parse_args(argv)
    for name, full, quick in (
        ("seeds", 5, 1),
        ("hours", 72.0, 24.0),
        ("live_seeds", 2, 1),
        ("live_hours", 12.0, 4.0),
    ):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    chosen = [name for name in PARTS if getattr(args, name)] or ["sim"]
    reports = {name: PARTS[name][0](args) for name in chosen}
    if args.json:
        print(json.dumps(reports, indent=2))
        return 0
    report = harness.Report("Gangs: reservation and backfill off and on", __file__, argv)
    for name in chosen:
        report.section(None, PARTS[name][1](reports[name]))
    if "sim" in reports:
        report.chart(chart(reports["sim"]))
    report.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
