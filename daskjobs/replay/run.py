"""Replay a loaded trace in the simulator, as recorded or under a what-if.

:func:`replay` runs one simulation: the policy that ran (from the trace's
header) or another, on the recorded cluster or a changed one, with or without
speculation. :func:`what_ifs` runs the grid policy x cluster that
``daskjobs replay`` prints. Every run is deterministic: same trace, same
arguments, same seed, same numbers.

The replayed makespan is measured like the recorded one: from the first graph
submission to the end of the last task (the simulator's own
:attr:`~daskjobs.sim.Schedule.makespan` starts at the first task's start).

This module does not import ``distributed``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from daskjobs.plugin.trace import Trace
from daskjobs.policies import FairShare, Policy, Speculation, make_policy
from daskjobs.replay.load import Loaded, load
from daskjobs.sim.engine import simulate
from daskjobs.sim.model import Cluster
from daskjobs.sim.schedule import Schedule, speed_bound

__all__ = ["POLICIES", "ReplayResult", "make_cluster", "make_replay_policy", "replay", "what_ifs"]

#: Policies a trace can be replayed under.
POLICIES = ("fifo", "lpt", "critical-path", "work-stealing", "node-aware", "fair-share")


@dataclass
class ReplayResult:
    """One replayed run and how it compares with the recorded one."""

    loaded: Loaded
    schedule: Schedule
    policy: str
    speculation: float | None  # late factor, None: off
    cluster: Cluster

    @property
    def makespan(self) -> float:
        """Seconds from the first submission to the last task's end."""
        return float(max((r.end for r in self.schedule.tasks), default=0.0))

    @property
    def node_hours(self) -> float:
        return self.cluster.nodes * self.makespan / 3600.0

    @property
    def error(self) -> float:
        """Relative error of the replayed makespan against the recorded one."""
        rec = self.loaded.recorded.makespan
        return (self.makespan - rec) / rec if rec > 0 else math.nan

    @property
    def lower_bound(self) -> float:
        return float(speed_bound(self.loaded.tasks, self.cluster))

    def teams(self) -> dict[str, dict[str, float]]:
        return {
            team: {"median_wait_s": s.median_wait, "last_end_s": s.last_end}
            for team, s in self.schedule.teams().items()
        }

    def row(self) -> dict[str, Any]:
        """The what-if row as a JSON-able dict (seconds, hours for node-hours)."""
        return {
            "policy": self.policy,
            "speculation": self.speculation,
            "nodes": self.cluster.nodes,
            "cores_per_node": self.cluster.cores_per_node,
            "slow": {str(k): v for k, v in (self.cluster.slow or {}).items()},
            "makespan_s": self.makespan,
            "node_hours": self.node_hours,
            "lower_bound_s": self.lower_bound,
            "backups": self.schedule.backups_launched,
            "waste_core_s": self.schedule.waste,
            "failures": self.schedule.failures,
            "teams": self.teams(),
        }


def make_replay_policy(name: str, loaded: Loaded) -> Policy:
    """A fresh policy by name; ``fair-share`` takes its targets from the trace's settings
    (every team present weighing 1 if none were set)."""
    if name == "fair-share":
        teams = loaded.settings.get("teams") or {}
        targets = dict(teams.get("targets") or {})
        present = sorted({t.team for t in loaded.tasks})
        if not targets:
            targets = dict.fromkeys(present, 1.0)
        half_life = teams.get("half_life")
        quotas = {k: int(v) for k, v in (teams.get("quotas") or {}).items() if k in targets}
        within = teams.get("within")
        return FairShare(
            targets,
            within=within if within in ("fifo", "lpt") else "fifo",
            half_life=float(half_life) if half_life else None,
            quotas=quotas or None,
            strict=False,
        )
    return make_policy(name)


def make_cluster(
    loaded: Loaded,
    nodes: int | None = None,
    cores_per_node: int | None = None,
    no_slow: bool = False,
) -> Cluster:
    """The recorded cluster, changed: other node or core counts, or without its slow nodes.

    Slow nodes keep their index (the fastest nodes come first, so adding nodes adds
    nominal ones, and removing nodes removes the slowest first).
    """
    base = loaded.cluster
    n = base.nodes if nodes is None else nodes
    c = base.cores_per_node if cores_per_node is None else cores_per_node
    slow = None if no_slow else {i: f for i, f in (base.slow or {}).items() if i < n}
    need = max((t.cores for t in loaded.tasks), default=1)
    if c < need:
        raise ValueError(f"cores per node {c} is fewer than a recorded task needs ({need})")
    return Cluster(n, c, slow or None, base.failure_rate)


def replay(
    trace: Loaded | Trace | str | os.PathLike[str],
    policy: str | None = None,
    *,
    speculation: float | None = None,
    nodes: int | None = None,
    cores_per_node: int | None = None,
    no_slow: bool = False,
    seed: int = 0,
) -> ReplayResult:
    """Replay ``trace`` under ``policy`` (default: the one recorded, else ``fifo``).

    ``speculation`` is a late factor (e.g. 2.5) or ``None`` for no backups;
    ``nodes``/``cores_per_node``/``no_slow`` change the cluster; ``seed`` seeds
    the simulator's failure draws.
    """
    loaded = trace if isinstance(trace, Loaded) else load(trace)
    name = policy or _recorded_policy(loaded)
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose one of: {', '.join(POLICIES)}")
    cluster = make_cluster(loaded, nodes, cores_per_node, no_slow)
    spec = Speculation(late_factor=speculation) if speculation is not None else None
    schedule = simulate(
        loaded.tasks, cluster, make_replay_policy(name, loaded), spec=spec, seed=seed
    )
    return ReplayResult(loaded, schedule, name, speculation, cluster)


def _recorded_policy(loaded: Loaded) -> str:
    p = loaded.policy
    return p if p in POLICIES else "fifo"


def what_ifs(
    loaded: Loaded,
    policies: Sequence[str],
    clusters: Sequence[tuple[int | None, int | None, bool]],
    speculation: float | None = None,
    seed: int = 0,
) -> list[ReplayResult]:
    """Replay every policy on every cluster ``(nodes, cores_per_node, no_slow)``."""
    return [
        replay(
            loaded,
            p,
            speculation=speculation,
            nodes=n,
            cores_per_node=c,
            no_slow=ns,
            seed=seed,
        )
        for n, c, ns in clusters
        for p in policies
    ]


def busy_over_time(
    intervals: Sequence[tuple[float, float]], step: float
) -> tuple[np.ndarray, np.ndarray]:
    """Slots busy at each multiple of ``step`` seconds, from 0 to the last end."""
    if not intervals:
        return np.zeros(1), np.zeros(1)
    starts = np.sort(np.array([s for s, _ in intervals], dtype=float))
    ends = np.sort(np.array([e for _, e in intervals], dtype=float))
    times = np.arange(0.0, float(ends.max()) + step, step)
    busy = np.searchsorted(starts, times, side="right") - np.searchsorted(ends, times, side="right")
    return times, busy.astype(float)


def replayed_intervals(result: ReplayResult) -> list[tuple[float, float]]:
    """(start, end) of every simulated attempt, slot by slot (a k-core attempt counts k)."""
    out: list[tuple[float, float]] = []
    for a in result.schedule.attempts:
        out.extend([(a.start, a.end)] * len(a.cores))
    return out


def stage_of(loaded: Loaded, tid: Hashable) -> str:
    return loaded.stages.get(tid, "")
