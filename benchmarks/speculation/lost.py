"""Where the grid's lost slot-time went, and the load at the end of each run.

The grid's runs (:mod:`speculation.grid`) read through :mod:`daskjobs.timeline`: the
lost slot-time of the median run per workload split into ramp-up, dispatch round trips
(releases x the median refill gap), idle slots while work waited, the tail, losing
copies, overrun and the rest, in seconds of makespan (slot-equivalent seconds divided
by the slot-equivalents, so the parts add up to ``makespan - work / slot-equivalents``);
and the last three tenths of each run, where longest-first leaves its shortest tasks:
task starts a second, the fast workers' threads idle, the machine's CPUs busy.
"""

from __future__ import annotations

import os
from typing import Any

from harness import Chart

from speculation.grid import best

KEYS = ("ramp", "dispatch", "waited", "tail", "copies", "overrun", "other")
LABELS = {
    "ramp": "ramp-up",
    "dispatch": "dispatch",
    "waited": "idle while work waited",
    "tail": "tail",
    "copies": "losing copies",
    "overrun": "overrun",
    "other": "other",
}


def lost_table(rows: list[dict[str, Any]], config: str) -> str:
    """The decomposition of ``config``'s median run per workload, with the sum."""
    out = [
        "| workload | makespan - work/slots (s) | "
        + " | ".join(
            LABELS[k] + (" (releases x median gap)" if k == "dispatch" else "") for k in KEYS
        )
        + " |",
        "|---|---:|" + "---:|" * len(KEYS),
    ]
    tot = dict.fromkeys(KEYS, 0.0)
    for row in rows:
        case = row["case"]
        r = best(row["runs"][config])
        se = case.slot_equivalents
        cells = [case.label(), f"{r['lost'] / se:.3f}"]
        for k in KEYS:
            v = r[k] / se
            tot[k] += v
            cell = f"{v:.3f}"
            if k == "dispatch":
                cell += f" ({r['releases']:.0f} x {r['gap_ms']:.1f} ms)"
            cells.append(cell)
        out.append("| " + " | ".join(cells) + " |")
    out.append(
        "| **sum over workloads** | "
        + f"{sum(tot.values()):.3f} | "
        + " | ".join(f"{tot[k]:.3f}" for k in KEYS)
        + " |"
    )
    return "\n".join(out)


def end_table(rows: list[dict[str, Any]]) -> str:
    """The machine in the last three tenths of each run, plain dask and the full plugin
    (the median run per workload)."""
    out = [
        f"The machine has {os.cpu_count()} CPUs shared by the scheduler, the client and "
        "every worker process; over the last three tenths of each run: task starts a "
        "second, fast workers' threads idle, the machine's CPUs busy (all processes):\n",
        "| workload | starts/s, plain / plugin | threads idle, plain / plugin "
        "| CPUs busy, plain / plugin |",
        "|---|---:|---:|---:|",
    ]
    for row in rows:
        p = best(row["runs"]["plain"])
        a = best(row["runs"]["aware"])
        out.append(
            f"| {row['case'].label()} | {p['end_starts']:.0f} / {a['end_starts']:.0f} | "
            f"{p['end_idle']:.0%} / {a['end_idle']:.0%} | "
            f"{p['end_cpus']:.2f} / {a['end_cpus']:.2f} |"
        )
    return "\n".join(out)


def lost_chart(rows: list[dict[str, Any]]) -> Chart:
    """The lost time summed over the workloads, by part, plain dask and the full plugin."""
    sums = {
        config: [
            sum(best(row["runs"][config])[k] / row["case"].slot_equivalents for row in rows)
            for k in KEYS
        ]
        for config in ("plain", "aware")
    }
    return Chart(
        "Lost time, summed over the workloads",
        "seconds of makespan",
        [LABELS[k] for k in KEYS],
        {"plain dask": sums["plain"], "full plugin": sums["aware"]},
    )
