"""The numbers ``daskjobs replay`` prints: recorded vs replayed, then the what-ifs.

:func:`replay_report` returns one JSON-able dict (what ``--json`` prints);
:func:`format_report` turns it into the aligned text table. Times are seconds,
node-hours hours.

This module does not import ``distributed``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from daskjobs._text import table
from daskjobs.policies import Speculation
from daskjobs.replay.load import Loaded
from daskjobs.replay.run import (
    ReplayResult,
    _recorded_policy,
    make_cluster,
    make_replay_policy,
    replay,
    what_ifs,
)
from daskjobs.replay.scale import stage_summary, synthetic_sweep
from daskjobs.sim.engine import simulate
from daskjobs.sim.schedule import speed_bound

__all__ = ["ClusterSpec", "format_report", "replay_report"]

#: (nodes, cores_per_node, no_slow); None keeps the recorded value.
ClusterSpec = tuple[int | None, int | None, bool]


def _recorded(loaded: Loaded) -> dict[str, Any]:
    rec = loaded.recorded
    return {
        "policy": loaded.policy,
        "makespan_s": rec.makespan,
        "node_hours": loaded.cluster.nodes * rec.makespan / 3600.0,
        "attempts": rec.attempts,
        "failed_attempts": rec.failed_attempts,
        "waste_core_s": rec.waste,
        "teams": {
            team: {"median_wait_s": rec.team_wait[team], "last_end_s": rec.team_last[team]}
            for team in rec.team_wait
        },
    }


def replay_report(
    loaded: Loaded,
    policies: Sequence[str],
    clusters: Sequence[ClusterSpec],
    speculation: float | None = None,
    seed: int = 0,
    scale: int | None = None,
) -> tuple[dict[str, Any], ReplayResult, list[ReplayResult]]:
    """The report dict, the as-recorded replay, and the what-if results."""
    t = time.perf_counter()
    base = replay(loaded, seed=seed)
    rows = what_ifs(loaded, policies, clusters, speculation=speculation, seed=seed)
    report: dict[str, Any] = {
        "trace": loaded.path,
        "complete": loaded.complete,
        "notes": list(loaded.notes),
        "tasks": len(loaded.tasks),
        "cluster": {
            "nodes": loaded.cluster.nodes,
            "cores_per_node": loaded.cluster.cores_per_node,
            "failure_rate": loaded.cluster.failure_rate,
        },
        "workers": [
            {
                "address": w.address,
                "node": w.node,
                "nthreads": w.nthreads,
                "slowdown": w.speed,
                "measured_slowdown": w.measured,
                "attempts": w.attempts,
            }
            for w in loaded.workers
        ],
        "fit": loaded.fit.as_dict(),
        "recorded": _recorded(loaded),
        "replayed": {**base.row(), "error": base.error},
        "what_if": [r.row() for r in rows],
        "stages": [s.as_dict() for s in stage_summary(loaded)],
        "seed": seed,
    }
    if scale is not None:
        report["scale"] = _scale(loaded, scale, policies, clusters, speculation, seed)
    report["seconds"] = time.perf_counter() - t
    return report, base, rows


def _scale(
    loaded: Loaded,
    n: int,
    policies: Sequence[str],
    clusters: Sequence[ClusterSpec],
    speculation: float | None,
    seed: int,
) -> dict[str, Any]:
    tasks = synthetic_sweep(loaded, n, seed)
    spec = Speculation(late_factor=speculation) if speculation is not None else None
    rows = []
    for nodes, cores, no_slow in clusters:
        cluster = make_cluster(loaded, nodes, cores, no_slow)
        for p in policies:
            s = simulate(tasks, cluster, make_replay_policy(p, loaded), spec=spec, seed=seed)
            rows.append(
                {
                    "policy": p,
                    "nodes": cluster.nodes,
                    "cores_per_node": cluster.cores_per_node,
                    "makespan_s": s.makespan,
                    "node_hours": s.node_hours,
                    "lower_bound_s": speed_bound(tasks, cluster),
                    "backups": s.backups_launched,
                    "waste_core_s": s.waste,
                }
            )
    return {"tasks": n, "rows": rows}


# -- text ------------------------------------------------------------------------------------


def _secs(x: float) -> str:
    if x >= 3600:
        return f"{x / 3600:.2f} h"
    if x >= 60:
        return f"{x / 60:.1f} min"
    return f"{x:.3f} s"


def _teams(teams: dict[str, dict[str, float]]) -> str:
    return " ".join(
        f"{k}:{_secs(v['median_wait_s'])}/{_secs(v['last_end_s'])}"
        for k, v in sorted(teams.items())
    )


def _row(r: dict[str, Any], label: str | None = None) -> list[str]:
    slow = ",".join(f"{k}:{v:.2g}x" for k, v in r.get("slow", {}).items()) or "-"
    spec = r.get("speculation")
    return [
        label or r["policy"],
        str(r["nodes"]),
        str(r["cores_per_node"]),
        slow,
        "off" if spec is None else f"{spec:g}x",
        _secs(r["makespan_s"]),
        f"{r['node_hours']:.4g}",
        _secs(r["lower_bound_s"]),
        str(r.get("backups", 0)),
        f"{r.get('waste_core_s', 0.0):.3g}",
        _teams(r.get("teams", {})),
    ]


_HEAD = [
    "run",
    "nodes",
    "cores",
    "slow",
    "spec",
    "makespan",
    "node-h",
    "bound",
    "backups",
    "waste core-s",
    "teams median/last",
]


def format_report(report: dict[str, Any]) -> str:
    """The aligned text ``daskjobs replay`` prints."""
    rec, rep, fit, cl = report["recorded"], report["replayed"], report["fit"], report["cluster"]
    slow = [w for w in report["workers"] if w["slowdown"] != 1.0]
    lines = [
        f"trace {report['trace']}: {report['tasks']} tasks, {cl['nodes']} workers x "
        f"{cl['cores_per_node']} threads, policy {rec['policy'] or '(not recorded)'}"
        + ("" if report["complete"] else " [INCOMPLETE]"),
        f"fitted: {fit['overhead_s'] * 1e3:.2f} ms per task ({fit['lost_slot_s']:.3g} slot-s "
        f"lost while work waited, over {fit['overhead_samples']} tasks), "
        f"start-up {fit['startup_s'] * 1e3:.1f} ms; slow workers: "
        + (", ".join(f"{w['address']} {w['slowdown']:.2f}x" for w in slow) or "none")
        + f"; failure rate {cl['failure_rate']:.3g}",
    ]
    share = fit["compute_share"]
    if share is not None and share < 0.5:
        lines.append(
            f"note: slots computed {share:.0%} of the time: the run was bound by dask's "
            "per-task costs, replayed per slot (a what-if on more slots is optimistic)"
        )
    if fit["dep_latency_samples"] or fit["transfer_tasks"]:
        lat = fit["dep_latency_s"]
        lines.append(
            "dependencies: "
            + (
                f"input done -> start {lat * 1e3:.1f} ms median "
                f"({fit['dep_latency_samples']} samples, not replayed: "
                "the per-task overhead stands in for it); "
                if lat is not None
                else ""
            )
            + f"transfers {fit['transfer_s']:.3f} s over {fit['transfer_tasks']} tasks "
            "(off the slots: inside the lost capacity)"
        )
    lines += [f"note: {n}" for n in report["notes"]]
    lines += [
        "",
        f"recorded makespan  {_secs(rec['makespan_s'])}",
        f"replayed makespan  {_secs(rep['makespan_s'])} ({rep['policy']}, same cluster): "
        f"error {rep['error'] * 100:+.1f}%",
        "",
        "what-if:",
        table(_HEAD, [_row(r) for r in report["what_if"]]),
        "",
        "stages (nominal worker):",
        table(
            ["stage", "tasks", "median", "log spread"],
            [
                [s["stage"], str(s["tasks"]), _secs(s["median_s"]), f"{s['log_spread']:.2f}"]
                for s in report["stages"]
            ],
        ),
    ]
    if "scale" in report:
        sc = report["scale"]
        lines += [
            "",
            f"synthetic sweep of {sc['tasks']:,} tasks with the measured distributions:",
            table(
                ["policy", "nodes", "cores", "makespan", "node-h", "bound", "backups"],
                [
                    [
                        r["policy"],
                        str(r["nodes"]),
                        str(r["cores_per_node"]),
                        _secs(r["makespan_s"]),
                        f"{r['node_hours']:.4g}",
                        _secs(r["lower_bound_s"]),
                        str(r["backups"]),
                    ]
                    for r in sc["rows"]
                ],
            ),
        ]
    return "\n".join(lines)


def recorded_policy(loaded: Loaded) -> str:
    """The policy the trace ran under, as a replay policy name (``fifo`` if unknown)."""
    return _recorded_policy(loaded)
