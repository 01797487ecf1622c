"""Gangs among a stream of small GPU tasks: reservation and backfill off and on.

Usage::

    python benchmarks/bench_gangs.py                     # the simulator part (the default)
    python benchmarks/bench_gangs.py --sim --seeds 5 --hours 72 --loads 0.7,0.9
    python benchmarks/bench_gangs.py --json              # one JSON object instead

``--sim``: the documented mixed workload of docs/resources.md
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

Prints markdown with the command, date and machine. This is a script, not a test:
nothing here asserts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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


#: The parts of this benchmark: name -> (run, markdown).
PARTS: dict[str, tuple[Callable[[argparse.Namespace], dict[str, Any]], Callable[..., str]]] = {
    "sim": (lambda a: sim_part(range(a.seeds), a.hours, a.loads), sim_markdown),
}


def machine() -> str:
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):  # pragma: no cover - not a checkout
        commit = "?"
    try:
        load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - not on every platform
        load = "?"
    return (
        f"- date: {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, code at {commit}\n"
        f"- python {platform.python_version()} ({platform.python_implementation()}), "
        f"numpy {np.__version__}\n"
        f"- platform: {platform.platform()}\n"
        f"- processor: {platform.processor() or platform.machine()}, "
        f"CPUs: {os.cpu_count()}, load average at the end {load}"
    )


def _loads(text: str) -> list[float]:
    try:
        loads = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected loads such as 0.7,0.9") from None
    if not all(0 < x <= 1.5 for x in loads):
        raise argparse.ArgumentTypeError(f"{text!r}: every load must be in (0, 1.5]")
    return loads


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sim", action="store_true", help="the simulator part (the default)")
    ap.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (default 5)")
    ap.add_argument("--hours", type=float, default=72.0, help="hours of arrivals (default 72)")
    ap.add_argument(
        "--loads", type=_loads, default=[0.7, 0.9], help="offered GPU loads (default 0.7,0.9)"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = ap.parse_args(argv)
    chosen = [name for name in PARTS if getattr(args, name)] or ["sim"]
    reports = {name: PARTS[name][0](args) for name in chosen}
    if args.json:
        print(json.dumps(reports, indent=2))
        return 0
    print("## Gangs: reservation and backfill off and on\n")
    print(f"- command: python benchmarks/bench_gangs.py {' '.join(argv or sys.argv[1:])}".rstrip())
    print(machine())
    print()
    for name in chosen:
        print(PARTS[name][1](reports[name]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
