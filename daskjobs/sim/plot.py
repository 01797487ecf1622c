"""Figures of the reference experiments (PNG files; matplotlib, Agg backend).

matplotlib is an optional extra (``pip install "daskjobs[plot]"``) and is
imported inside each function, so importing this module costs nothing and
works without it. :func:`require_matplotlib` raises :class:`PlotError` with the
install command when it is missing.

Each function takes the dicts (and schedules) of :mod:`daskjobs.sim.report`
and returns the path of the PNG it wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from daskjobs.sim.schedule import Schedule, utilisation

__all__ = [
    "INSTALL_HINT",
    "PlotError",
    "chapter_makespans",
    "chapter_utilisation",
    "fairshare_waits",
    "graph_costs",
    "require_matplotlib",
]

INSTALL_HINT = 'pip install "daskjobs[plot]"'
_H = 3600.0


class PlotError(RuntimeError):
    """A figure cannot be drawn (matplotlib is missing)."""


def require_matplotlib() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or :class:`PlotError` saying how to install it."""
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotError(
            f"drawing figures needs matplotlib, which is not installed; install it with: "
            f"{INSTALL_HINT}"
        ) from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return out


def chapter_utilisation(
    schedules: Mapping[str, Schedule], out: Path | str, step: float = 600.0
) -> Path:
    """Busy cores over time (log y), one line per labelled schedule, sampled every ``step`` s."""
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    cores = 0
    for label, s in schedules.items():
        times, busy = utilisation(s, step)
        cores = max(cores, s.cluster.total_cores)
        # log scale: an idle sample would vanish, so show it at 0.5 cores
        ax.step(
            times / _H,
            [b if b > 0 else 0.5 for b in busy],
            where="post",
            label=f"{label} ({s.makespan_h:.2f} h)",
        )
    ax.set_yscale("log")
    ax.axhline(cores, color="grey", linestyle=":", linewidth=1, label=f"{cores} cores")
    ax.axhline(cores / 10, color="grey", linestyle="--", linewidth=1, label="a tenth of them")
    ax.set_xlabel("hours since the first start")
    ax.set_ylabel(f"busy cores (sampled every {step / 60:g} min)")
    ax.set_title("Chapter sweep: busy cores over time")
    ax.legend(loc="lower left", fontsize="small")
    return _save(fig, Path(out))


def chapter_makespans(report: Mapping[str, Any], out: Path | str) -> Path:
    """Makespan by policy, backups off/on side by side, bounds as horizontal lines."""
    plt = require_matplotlib()
    names: list[str] = []
    for row in report["rows"]:
        if row["policy"] not in names:
            names.append(row["policy"])
    by = {(r["policy"], r["backups"]): r for r in report["rows"]}
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.38
    for k, backups in enumerate((False, True)):
        xs = [i + (k - 0.5) * width for i, n in enumerate(names) if (n, backups) in by]
        ys = [by[(n, backups)]["makespan_h"] for n in names if (n, backups) in by]
        ax.bar(xs, ys, width, label="with backups" if backups else "no backups")
        pubs = [
            (x, by[(n, backups)]["published_makespan_h"])
            for x, n in zip(xs, [n for n in names if (n, backups) in by], strict=True)
            if by[(n, backups)]["published_makespan_h"] is not None
        ]
        if pubs:
            ax.scatter(
                [p[0] for p in pubs],
                [p[1] for p in pubs],
                marker="_",
                s=300,
                color="black",
                zorder=3,
                label="published" if backups else None,
            )
    ax.axhline(report["lower_bound_h"], color="tab:red", linestyle="--", label="lower bound")
    ax.axhline(report["speed_bound_h"], color="tab:purple", linestyle=":", label="speed bound")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=15)
    ax.set_ylabel("makespan (hours)")
    ax.set_title(f"Chapter sweep, seed {report['seed']}: makespan by policy")
    ax.legend(fontsize="small")
    return _save(fig, Path(out))


def fairshare_waits(report: Mapping[str, Any], out: Path | str) -> Path:
    """Team b's median and maximum wait, and team a's end, under each policy."""
    plt = require_matplotlib()
    rows = report["rows"]
    metrics = [
        ("b median wait", lambda r: r["teams"]["b"]["median_wait_h"], "b_median_wait_h"),
        ("b all done", lambda r: r["teams"]["b"]["max_wait_h"], "b_max_wait_h"),
        ("a sweep ends", lambda r: r["a_end_h"], "a_end_h"),
    ]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(rows)
    for k, row in enumerate(rows):
        xs = [i + (k - (len(rows) - 1) / 2) * width for i in range(len(metrics))]
        ax.bar(xs, [get(row) for _, get, _ in metrics], width, label=row["policy"])
        pub = row.get("published")
        if pub:
            ax.scatter(
                xs,
                [pub[key] for _, _, key in metrics],
                marker="_",
                s=300,
                color="black",
                zorder=3,
                label="published" if k == 0 else None,
            )
    ax.set_xticks(range(len(metrics)))
    ax.set_xticklabels([m[0] for m in metrics])
    ax.set_ylabel("hours")
    ax.set_title(f"Fair share, seed {report['seed']}: team b submits an hour in")
    ax.legend(fontsize="small")
    return _save(fig, Path(out))


def graph_costs(report: Mapping[str, Any], out: Path | str) -> Path:
    """Makespan by mode and policy (bars) with core-hours annotated."""
    plt = require_matplotlib()
    rows = report["rows"]
    modes: list[str] = []
    policies: list[str] = []
    for r in rows:
        if r["mode"] not in modes:
            modes.append(r["mode"])
        if r["policy"] not in policies:
            policies.append(r["policy"])
    by = {(r["mode"], r["policy"]): r for r in rows}
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(policies)
    for k, policy in enumerate(policies):
        xs = [i + (k - (len(policies) - 1) / 2) * width for i in range(len(modes))]
        ys = [by[(m, policy)]["makespan_h"] for m in modes]
        bars = ax.bar(xs, ys, width, label=policy)
        for bar, m in zip(bars, modes, strict=True):
            ax.annotate(
                f"{by[(m, policy)]['core_h']:,.0f}",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize="x-small",
            )
    ax.scatter(
        range(len(modes)),
        [by[(m, policies[0])]["published_makespan_h"] for m in modes],
        marker="_",
        s=600,
        color="black",
        zorder=3,
        label="published",
    )
    ax.set_xticks(range(len(modes)))
    ax.set_xticklabels(modes)
    ax.set_ylabel("makespan (hours); labels: core-hours")
    ax.set_title(f"Feature graph and cache, seed {report['seed']} (with backups)")
    ax.legend(fontsize="small")
    return _save(fig, Path(out))
