"""The reference experiments (docs/explanation/chapter.md, "The reference workload"), as plain
dicts.

Each ``*_report`` function generates a reference workload from a seed, runs it
under the policies the published study compares, and returns a JSON-able dict of hours,
counts and ratios, with the published figure beside each measured one (``None``
where the study publishes none). Nothing here prints or draws: the CLI
(:mod:`daskjobs.sim.cli`) formats these dicts and :mod:`daskjobs.sim.plot`
draws them.

Every run uses a fresh policy object (policies keep state) and the same seed,
so all policies of one report face the same tasks and the same failures
(common random numbers, see :mod:`daskjobs.sim.engine`).

The ``run_*`` variants also return the :class:`~daskjobs.sim.schedule.Schedule`
of every run (for figures) and take a ``progress`` callback, called once after
each run with the run's label; ``*_RUNS`` give the number of runs up front.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from daskjobs.policies import FairShare, make_policy
from daskjobs.sim import workloads
from daskjobs.sim.engine import simulate
from daskjobs.sim.schedule import Schedule, failure_bound, lower_bound, speed_bound

__all__ = [
    "CHAPTER_RUNS",
    "ESTIMATE_WORKLOADS",
    "FAIRSHARE_RUNS",
    "GRAPH_RUNS",
    "PUBLISHED_CHAPTER",
    "PUBLISHED_FAIRSHARE",
    "PUBLISHED_GRAPH",
    "chapter_report",
    "chapter_runs",
    "chapter_seeds_report",
    "fairshare_report",
    "graph_report",
    "graph_runs",
    "run_chapter",
    "run_estimates",
    "run_fairshare",
    "run_graph",
]

Progress = Callable[[str], None]
_H = 3600.0

#: The chapter experiment's runs, as reported: (row name, policy name, backups, drop the slow node).
CHAPTER_RUNS: tuple[tuple[str, str, bool, bool], ...] = (
    ("fifo", "fifo", False, False),
    ("fifo", "fifo", True, False),
    ("lpt", "lpt", False, False),
    ("lpt", "lpt", True, False),
    ("work-stealing", "work-stealing", False, False),
    ("work-stealing", "work-stealing", True, False),
    ("lpt-no-slow-node", "lpt", False, True),
    ("node-aware", "node-aware", False, False),
    ("node-aware", "node-aware", True, False),
)

#: Fair-share runs: FIFO, then equal-target fair share (no backups, as published).
FAIRSHARE_RUNS: tuple[str, ...] = ("fifo", "fair-share")

#: Fair share's targets in the fair-share experiment (the published study's equal shares).
FAIRSHARE_TARGETS = {"a": 1, "b": 1}

#: Graph runs: (mode, policy), every one with backups.
GRAPH_RUNS: tuple[tuple[str, str], ...] = tuple(
    (mode, policy)
    for mode in ("recompute", "graph", "cached")
    for policy in ("lpt", "critical-path", "node-aware")
)

#: The published study's table (hours; node-hours; backups launched); docs/explanation/chapter.md.
PUBLISHED_CHAPTER: dict[str, Any] = {
    "source": "the published study behind the reference workload, one random draw "
    "(docs/explanation/chapter.md)",
    "work_core_h": 3649.0,
    "lower_bound_h": 9.50,
    "speed_bound_h": 9.81,
    "waste_core_h": [91.0, 130.0],
    "rows": [
        {
            "policy": "fifo",
            "backups": False,
            "makespan_h": 19.79,
            "node_hours": 475.0,
            "backups_launched": None,
        },
        {
            "policy": "fifo",
            "backups": True,
            "makespan_h": 20.32,
            "node_hours": 487.6,
            "backups_launched": 152,
        },
        {
            "policy": "lpt",
            "backups": False,
            "makespan_h": 11.80,
            "node_hours": 283.3,
            "backups_launched": None,
        },
        {
            "policy": "lpt",
            "backups": True,
            "makespan_h": 10.02,
            "node_hours": 240.4,
            "backups_launched": 105,
        },
        {
            "policy": "work-stealing",
            "backups": False,
            "makespan_h": 16.33,
            "node_hours": 391.9,
            "backups_launched": None,
        },
        {
            "policy": "work-stealing",
            "backups": True,
            "makespan_h": 16.40,
            "node_hours": 393.5,
            "backups_launched": 145,
        },
        {
            "policy": "lpt-no-slow-node",
            "backups": False,
            "makespan_h": 10.32,
            "node_hours": 247.6,
            "backups_launched": None,
        },
    ],
}

#: The published fair-share figures: hours from submission; team a's last end.
PUBLISHED_FAIRSHARE: dict[str, Any] = {
    "source": "the published study behind the reference workload, one random draw "
    "(docs/explanation/chapter.md)",
    "fifo": {"b_median_wait_h": 8.28, "b_max_wait_h": 11.4, "a_end_h": 19.79},
    "fair-share": {"b_median_wait_h": 0.59, "b_max_wait_h": 2.64, "a_end_h": 16.68},
}

#: The published task-graph and cache figures (per mode; the study names no policy).
PUBLISHED_GRAPH: dict[str, Any] = {
    "source": "the published study behind the reference workload, one random draw "
    "(docs/explanation/chapter.md)",
    "recompute": {"core_h": 6922.0, "makespan_h": 19.3},
    "graph": {"core_h": 3514.0, "makespan_h": 11.4},
    "cached": {"core_h": 3475.0, "makespan_h": 10.3},
}


def _published_makespan(policy: str, backups: bool) -> float | None:
    for row in PUBLISHED_CHAPTER["rows"]:
        if row["policy"] == policy and row["backups"] == backups:
            return float(row["makespan_h"])
    return None


def _label(policy: str, backups: bool) -> str:
    return f"{policy}{' +backups' if backups else ''}"


def chapter_runs(policies: Sequence[str] | None = None) -> tuple[tuple[str, str, bool, bool], ...]:
    """:data:`CHAPTER_RUNS`, or each of ``policies`` (any registered name) without and
    with backups."""
    if policies is None:
        return CHAPTER_RUNS
    return tuple((p, p, backups, False) for p in policies for backups in (False, True))


def _make(name: str) -> Any:
    """A fresh policy of the fair-share experiment (fair share at equal targets)."""
    if name == "fair-share":
        return FairShare(FAIRSHARE_TARGETS)
    return make_policy(name)


def run_chapter(
    seed: int = 0,
    progress: Progress | None = None,
    policies: Sequence[str] | None = None,
    **workload_kwargs: Any,
) -> tuple[dict[str, Any], dict[tuple[str, bool], Schedule]]:
    """:func:`chapter_report` plus the schedule of each run, keyed by (row name, backups).
    ``policies``: rows for these (registered names) instead of the published table's."""
    w = workloads.chapter(seed, **workload_kwargs)
    nominal = lower_bound(w.tasks, w.cluster.total_cores)
    weighted = speed_bound(w.tasks, w.cluster)
    with_failures = failure_bound(w.tasks, w.cluster, seed)
    rows: list[dict[str, Any]] = []
    schedules: dict[tuple[str, bool], Schedule] = {}
    for row_name, policy, backups, no_slow in chapter_runs(policies):
        cluster = w.cluster.without_slow() if no_slow else w.cluster
        s = simulate(
            w.tasks,
            cluster,
            make_policy(policy),
            spec=w.spec if backups else None,
            seed=seed,
        )
        schedules[(row_name, backups)] = s
        own_bound = speed_bound(w.tasks, cluster) if no_slow else weighted
        own_fb = failure_bound(w.tasks, cluster, seed) if no_slow else with_failures
        rows.append(
            {
                "policy": row_name,
                "backups": backups,
                "makespan_h": s.makespan_h,
                "node_hours": s.node_hours,
                "backups_launched": s.backups_launched,
                "waste_core_h": s.waste_core_h,
                "failures": s.failures,
                "vs_lower_bound": s.makespan / nominal if nominal else None,
                "vs_speed_bound": s.makespan / own_bound if own_bound else None,
                "vs_failure_bound": s.makespan / own_fb if own_fb else None,
                "published_makespan_h": _published_makespan(row_name, backups),
            }
        )
        if progress is not None:
            progress(_label(row_name, backups))
    report = {
        "experiment": "chapter",
        "seed": seed,
        "tasks": len(w.tasks),
        "nodes": w.cluster.nodes,
        "cores": w.cluster.total_cores,
        "slow_nodes": {str(k): s for k, s in enumerate(w.cluster.speeds) if s != 1.0},
        "failure_rate": w.cluster.failure_rate,
        "endgame": w.spec.endgame,
        "work_core_h": w.work / _H,
        "lower_bound_h": nominal / _H,
        "speed_bound_h": weighted / _H,
        "failure_bound_h": with_failures / _H,
        "rows": rows,
        "published": PUBLISHED_CHAPTER,
    }
    return report, schedules


def chapter_report(seed: int = 0, **workload_kwargs: Any) -> dict[str, Any]:
    """The chapter sweep under every policy of the published table, with and without backups.

    ``workload_kwargs`` go to :func:`daskjobs.sim.workloads.chapter` (e.g.
    ``slow_node=0``, ``failure_rate=0.02``, ``n=20_000``). Rows, in order: fifo,
    lpt, work-stealing (backups off, on), ``lpt-no-slow-node`` (LPT on the
    cluster without its slow node, backups off), node-aware (off, on).
    ``vs_lower_bound``, ``vs_speed_bound`` and ``vs_failure_bound`` are
    makespan / bound ratios; the speed and failure bounds are those of the
    run's own cluster (so for ``lpt-no-slow-node`` the speed bound equals the
    nominal lower bound). The failure bound
    (:func:`~daskjobs.sim.schedule.failure_bound`) adds what this seed's
    failures cost any schedule that restarts failed tasks.
    """
    return run_chapter(seed, **workload_kwargs)[0]


def chapter_seeds_report(
    seeds: Sequence[int],
    progress: Progress | None = None,
    policies: Sequence[str] | None = None,
    **workload_kwargs: Any,
) -> dict[str, Any]:
    """The chapter experiment's table over many seeds: how each row is distributed.

    The published table is one random draw; a single seed of ours is another.
    Whether a 7.5 h task lands on the slow node or fails late decides much of
    a row (docs/explanation/chapter.md), so this runs :func:`run_chapter` for every seed
    and gives, per row, the median, minimum and maximum of the makespan and of
    its ratios to the speed bound and to the failure bound, and on how many
    seeds the ratio to each bound is within 1.2%. ``progress`` is called once
    per simulation (``len(seeds) * len(CHAPTER_RUNS)`` times).
    """
    seeds = list(seeds)
    if not seeds:
        raise ValueError("no seeds given")
    per_seed = [
        run_chapter(seed, progress=progress, policies=policies, **workload_kwargs)[0]
        for seed in seeds
    ]
    rows = []
    for j, (row_name, _, backups, _) in enumerate(chapter_runs(policies)):
        got = [r["rows"][j] for r in per_seed]

        def spread(key: str, got: list[dict[str, Any]] = got) -> dict[str, float]:
            xs = np.array([g[key] for g in got], dtype=float)
            return {
                "median": float(np.median(xs)),
                "min": float(xs.min()),
                "max": float(xs.max()),
            }

        rows.append(
            {
                "policy": row_name,
                "backups": backups,
                "makespan_h": spread("makespan_h"),
                "vs_lower_bound": spread("vs_lower_bound"),
                "vs_speed_bound": spread("vs_speed_bound"),
                "vs_failure_bound": spread("vs_failure_bound"),
                "within_1_2pct_of_speed_bound": sum(g["vs_speed_bound"] <= 1.012 for g in got),
                "within_1_2pct_of_failure_bound": sum(g["vs_failure_bound"] <= 1.012 for g in got),
                "published_makespan_h": _published_makespan(row_name, backups),
            }
        )
    first = per_seed[0]
    return {
        "experiment": "chapter-seeds",
        "seeds": seeds,
        "tasks": first["tasks"],
        "nodes": first["nodes"],
        "cores": first["cores"],
        "slow_nodes": first["slow_nodes"],
        "failure_rate": first["failure_rate"],
        "endgame": first["endgame"],
        "lower_bound_h": [r["lower_bound_h"] for r in per_seed],
        "speed_bound_h": [r["speed_bound_h"] for r in per_seed],
        "failure_bound_h": [r["failure_bound_h"] for r in per_seed],
        "rows": rows,
        "published": PUBLISHED_CHAPTER,
    }


def run_fairshare(
    seed: int = 0,
    progress: Progress | None = None,
    policies: Sequence[str] | None = None,
    **workload_kwargs: Any,
) -> tuple[dict[str, Any], dict[str, Schedule]]:
    """:func:`fairshare_report` plus the schedule of each run, keyed by policy name.
    ``policies``: these (registered names) instead of :data:`FAIRSHARE_RUNS`."""
    w = workloads.fairshare(seed, **workload_kwargs)
    rows: list[dict[str, Any]] = []
    schedules: dict[str, Schedule] = {}
    for name in FAIRSHARE_RUNS if policies is None else policies:
        s = simulate(w.tasks, w.cluster, _make(name), seed=seed)
        schedules[name] = s
        teams = s.teams()
        rows.append(
            {
                "policy": name,
                "makespan_h": s.makespan_h,
                "a_end_h": teams["a"].last_end / _H,
                "teams": {
                    team: {
                        "tasks": st.tasks,
                        "median_wait_h": st.median_wait / _H,
                        "max_wait_h": st.max_wait / _H,
                        "end_h": st.last_end / _H,
                    }
                    for team, st in sorted(teams.items())
                },
                "published": PUBLISHED_FAIRSHARE.get(name),
            }
        )
        if progress is not None:
            progress(name)
    b_submit = min(t.submit for t in w.tasks if t.team == "b")
    report = {
        "experiment": "fairshare",
        "seed": seed,
        "tasks": len(w.tasks),
        "teams": {
            "a": sum(t.team == "a" for t in w.tasks),
            "b": sum(t.team == "b" for t in w.tasks),
        },
        "b_submit_h": b_submit / _H,
        "targets": dict(FAIRSHARE_TARGETS),
        "rows": rows,
        "published": PUBLISHED_FAIRSHARE,
    }
    return report, schedules


def fairshare_report(seed: int = 0, **workload_kwargs: Any) -> dict[str, Any]:
    """Team ``b``'s 500 backtests an hour into team ``a``'s sweep: FIFO vs equal fair share.

    Per policy and team: median and maximum wait (hours from each task's
    submission to its end) and the team's last end; ``a_end_h`` is when team
    ``a``'s sweep ended. No backups (the published figures have none).
    ``workload_kwargs`` go to :func:`daskjobs.sim.workloads.fairshare`.
    """
    return run_fairshare(seed, **workload_kwargs)[0]


def _graph_bound(w: workloads.Workload) -> float:
    """Nominal lower bound, counting cache hits as taking no time."""
    tasks = [replace(t, duration=0.0) if t.tid in w.cache else t for t in w.tasks]
    return lower_bound(tasks, w.cluster.total_cores)


def graph_runs(policies: Sequence[str] | None = None) -> tuple[tuple[str, str], ...]:
    """:data:`GRAPH_RUNS`, or every mode under each of ``policies`` (registered names)."""
    if policies is None:
        return GRAPH_RUNS
    return tuple((mode, p) for mode in ("recompute", "graph", "cached") for p in policies)


def run_graph(
    seed: int = 0,
    progress: Progress | None = None,
    policies: Sequence[str] | None = None,
    **workload_kwargs: Any,
) -> tuple[dict[str, Any], dict[tuple[str, str], Schedule]]:
    """:func:`graph_report` plus the schedule of each run, keyed by (mode, policy).
    ``policies``: every mode under these (registered names) instead of :data:`GRAPH_RUNS`."""
    rows: list[dict[str, Any]] = []
    schedules: dict[tuple[str, str], Schedule] = {}
    built: dict[str, workloads.Workload] = {}
    for mode, policy in graph_runs(policies):
        w = built.get(mode)
        if w is None:
            w = built[mode] = workloads.feature_graph(seed, mode=mode, **workload_kwargs)
        s = simulate(w.tasks, w.cluster, make_policy(policy), spec=w.spec, cache=w.cache, seed=seed)
        schedules[(mode, policy)] = s
        pub = PUBLISHED_GRAPH[mode]
        rows.append(
            {
                "mode": mode,
                "policy": policy,
                "backups": True,
                "tasks": len(w.tasks),
                "core_h": s.busy / _H,
                "makespan_h": s.makespan_h,
                "waste_core_h": s.waste_core_h,
                "backups_launched": s.backups_launched,
                "cache_hits": s.cache_hits,
                "pruned": len(s.pruned),
                "lower_bound_h": _graph_bound(w) / _H,
                "published_core_h": pub["core_h"],
                "published_makespan_h": pub["makespan_h"],
            }
        )
        if progress is not None:
            progress(f"{mode} / {policy}")
    return {
        "experiment": "graph",
        "seed": seed,
        "rows": rows,
        "published": PUBLISHED_GRAPH,
    }, schedules


def graph_report(seed: int = 0, **workload_kwargs: Any) -> dict[str, Any]:
    """Shared feature stages: recomputed in every backtest, as a graph, and cached.

    Each mode runs under lpt, critical-path and node-aware, all with backups.
    ``core_h`` counts every attempt's core-time (useful work plus waste, the
    published "core-hours"). ``workload_kwargs`` go to
    :func:`daskjobs.sim.workloads.feature_graph`.
    """
    return run_graph(seed, **workload_kwargs)[0]


# -- estimates nobody writes: learning them within a sweep (docs/explanation/simulator.md) -------

#: The sweeps whose durations follow their parameters, by the name the CLI takes.
ESTIMATE_WORKLOADS: dict[str, Callable[..., workloads.Workload]] = {
    "lookback-grid": workloads.lookback_grid,
    "chapter-params": workloads.chapter_params,
    "two-stage": workloads.two_stage,
}


def run_estimates(
    seeds: Sequence[int],
    *,
    names: Sequence[str] | None = None,
    policy: str = "lpt",
    progress: Progress | None = None,
    learn: bool = True,
) -> dict[str, Any]:
    """Each sweep of :data:`ESTIMATE_WORKLOADS` (or ``names``) submitted without estimates,
    under ``policy`` with stage medians (the estimator with ``learn=False``: one
    submission ranks every task alike), learning online (``simulate(..., learn=True)``),
    and with the true durations as estimates; per workload, the median over ``seeds`` of
    each makespan (hours), of the share of the gain true estimates give over stage medians
    that learning gets, and of the share of the learner's predictions within 2x.
    ``learn=False`` runs the two baselines only (the learned figures are None)."""
    from daskjobs.policies.durations import Estimator

    chosen = list(names) if names else list(ESTIMATE_WORKLOADS)
    for name in chosen:
        if name not in ESTIMATE_WORKLOADS:
            raise ValueError(
                f"unknown workload {name!r}; choose one of: {', '.join(ESTIMATE_WORKLOADS)}"
            )
    if not seeds:
        raise ValueError("no seeds to run")
    make_policy(policy)  # a policy that cannot be made fails before any run
    out: dict[str, Any] = {"policy": policy, "seeds": list(seeds), "workloads": []}
    for name in chosen:
        per_seed = []
        for seed in seeds:
            w = ESTIMATE_WORKLOADS[name](seed)
            bare = workloads.without_estimates(w)
            medians = simulate(
                bare.tasks, w.cluster, make_policy(policy), learn=Estimator(1.0, learn=False)
            )
            true = simulate(w.tasks, w.cluster, make_policy(policy))
            gain = medians.makespan - true.makespan
            row: dict[str, Any] = {
                "seed": seed,
                "medians_h": medians.makespan_h,
                "learned_h": None,
                "true_h": true.makespan_h,
                "gain_share": None,
                "within_2x": None,
            }
            if learn:
                learned = simulate(bare.tasks, w.cluster, make_policy(policy), learn=True)
                row["learned_h"] = learned.makespan_h
                if gain:
                    row["gain_share"] = (medians.makespan - learned.makespan) / gain
                within = learned.within()
                row["within_2x"] = None if within != within else within
            per_seed.append(row)
            if progress is not None:
                progress(f"{name} seed {seed}")

        def median(field: str, rows: list[dict[str, Any]] = per_seed) -> float | None:
            xs = [r[field] for r in rows if r[field] is not None and r[field] == r[field]]
            return float(np.median(xs)) if xs else None

        w0 = ESTIMATE_WORKLOADS[name](seeds[0])
        out["workloads"].append(
            {
                "workload": name,
                "tasks": len(w0.tasks),
                "cores": w0.cluster.total_cores,
                "medians_h": median("medians_h"),
                "learned_h": median("learned_h"),
                "true_h": median("true_h"),
                "gain_share": median("gain_share"),
                "within_2x": median("within_2x"),
                "seeds": per_seed,
            }
        )
    return out
