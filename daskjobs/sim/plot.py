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
    "PUBLISHED",
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


def _save(fig: Any, out: Path, note: str | None = None) -> Path:
    """Write ``fig`` as a PNG (``note``: a line of small print under the axes) and close it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if note:
        fig.text(0.01, 0.01, note, fontsize="x-small", color="dimgrey", ha="left", va="bottom")
        fig.tight_layout(rect=(0, 0.04, 1, 1))
    else:
        fig.tight_layout()
    fig.savefig(out, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return out


#: What "published" means in every figure that marks published figures.
PUBLISHED = (
    "published (black marks): the figures a published study reports for one random draw of this "
    "workload, which the simulator was built against (docs/explanation/chapter.md)"
)


def _published_note(report: Mapping[str, Any]) -> str:
    source = (report.get("published") or {}).get("source")
    if not source:
        return PUBLISHED
    return f"published (black marks): {source}"


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
    """Makespan by policy, backups off/on side by side, the two bounds labelled."""
    return _save(_chapter_makespans_figure(report), Path(out), _published_note(report))


def _chapter_makespans_figure(report: Mapping[str, Any]) -> Any:
    plt = require_matplotlib()
    names: list[str] = []
    for row in report["rows"]:
        if row["policy"] not in names:
            names.append(row["policy"])
    by = {(r["policy"], r["backups"]): r for r in report["rows"]}
    lower, speed = report["lower_bound_h"], report["speed_bound_h"]
    fig, ax = plt.subplots(figsize=(9.5, 5.2))
    # the bounds are a few pixels apart at the scale of the slowest policy: an inset shows the
    # makespans near them, where the bounds and the best policies can be told apart
    near = ax.inset_axes((0.6, 0.4, 0.38, 0.52))
    width = 0.38
    for k, backups in enumerate((False, True)):
        drawn = [n for n in names if (n, backups) in by]
        xs = [names.index(n) + (k - 0.5) * width for n in drawn]
        ys = [by[(n, backups)]["makespan_h"] for n in drawn]
        pubs = [
            (x, by[(n, backups)]["published_makespan_h"])
            for x, n in zip(xs, drawn, strict=True)
            if by[(n, backups)].get("published_makespan_h") is not None
        ]
        for axis in (ax, near):
            axis.bar(
                xs, ys, width, color=f"C{k}", label="with backups" if backups else "no backups"
            )
            if pubs:
                axis.hlines(
                    [p[1] for p in pubs],
                    [p[0] - width / 2 for p in pubs],
                    [p[0] + width / 2 for p in pubs],
                    color="black",
                    linewidth=2,
                    zorder=3,
                    label="published" if k == 0 else None,
                )
    for axis in (ax, near):
        axis.axhline(
            lower, color="tab:red", linestyle="--", linewidth=1, label=f"lower bound {lower:.2f} h"
        )
        axis.axhline(
            speed,
            color="tab:purple",
            linestyle=":",
            linewidth=1.5,
            label=f"speed bound {speed:.2f} h",
        )
    best = min(r["makespan_h"] for r in report["rows"])
    published = [r.get("published_makespan_h") for r in report["rows"]]
    top = max(
        [best * 1.25, speed * 1.12]
        + [1.02 * p for p in published if p is not None and p < best * 1.25]
    )
    near.set_ylim(lower - (top - lower) * 0.15, top)
    near.set_xlim(-0.6, len(names) - 0.4)
    near.set_xticks(range(len(names)))
    near.set_xticklabels([])
    near.tick_params(labelsize="x-small")
    near.set_title("near the bounds", fontsize="x-small")
    ax.indicate_inset_zoom(near, edgecolor="grey")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=15)
    ax.set_xlabel("policy (lower bound: work / cores; speed bound: the slow node at its speed)")
    ax.set_ylabel("makespan (hours)")
    ax.set_title(f"Chapter sweep, seed {report['seed']}: makespan by policy")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(0.19, 1.0))
    return fig


def _label_bars(ax: Any, labels: list[tuple[Any, str, float | None]]) -> None:
    """Write each bar's value above it, or above its published mark (``None``: none) when the
    mark would cross the label: no mark is drawn through a label. Sets the y limits."""
    top = max([bar.get_height() for bar, _, _ in labels] + [m or 0.0 for _, _, m in labels])
    ax.set_ylim(0, top * 1.2)
    fig = ax.get_figure()
    axes_px = ax.get_position().height * fig.get_figheight() * fig.dpi * 0.85  # after layout
    per_px = top * 1.2 / axes_px
    for bar, text, mark in labels:
        x, height = bar.get_x() + bar.get_width() / 2, bar.get_height()
        span = (14 * (text.count("\n") + 1) + 4) * per_px  # the label's height, in hours
        y = height
        if mark is not None and height - 2 * per_px <= mark <= height + span:
            y = mark
        ax.annotate(
            text,
            (x, y),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize="x-small",
        )


def fairshare_waits(report: Mapping[str, Any], out: Path | str) -> Path:
    """Team b's median and maximum wait (hours after its submission) and team a's end (hours
    from the start), under each policy: the columns the fairshare table prints."""
    return _save(_fairshare_figure(report), Path(out), _published_note(report))


def _fairshare_figure(report: Mapping[str, Any]) -> Any:
    plt = require_matplotlib()
    rows = report["rows"]
    b_at = report.get("b_submit_h", 1.0)
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(9.5, 4.8), gridspec_kw={"width_ratios": [2, 1]}
    )
    waits = [("median wait", "median_wait_h"), ("max wait (all done)", "max_wait_h")]
    width = 0.8 / len(rows)
    colors = [f"C{k}" for k in range(len(rows))]
    left_labels: list[tuple[Any, str, float | None]] = []
    right_labels: list[tuple[Any, str, float | None]] = []
    for k, row in enumerate(rows):
        b = row["teams"]["b"]
        pub = row.get("published") or {}
        xs = [i + (k - (len(rows) - 1) / 2) * width for i in range(len(waits))]
        bars = left.bar(
            xs, [b[key] for _, key in waits], width, color=colors[k], label=row["policy"]
        )
        for bar, (_, key) in zip(bars, waits, strict=True):
            text = f"{b[key]:.2f}"
            if key == "max_wait_h" and b.get("end_h") is not None:
                text += f"\nends {b['end_h']:.2f} h"
            left_labels.append((bar, text, pub.get(f"b_{key}")))
        (a_bar,) = right.bar([k], [row["a_end_h"]], 0.6, color=colors[k])
        right_labels.append((a_bar, f"{row['a_end_h']:.2f}", pub.get("a_end_h")))
        if pub:
            keys = ("b_median_wait_h", "b_max_wait_h")
            left.hlines(
                [pub[key] for key in keys],
                [x - width / 2 for x in xs],
                [x + width / 2 for x in xs],
                color="black",
                linewidth=2,
                zorder=3,
                label="published" if k == 0 else None,
            )
            right.hlines(pub["a_end_h"], k - 0.3, k + 0.3, color="black", linewidth=2, zorder=3)
    _label_bars(left, left_labels)
    _label_bars(right, right_labels)
    left.set_xticks(range(len(waits)))
    left.set_xticklabels([w[0] for w in waits])
    left.set_ylabel(f"hours after team b's submission ({b_at:g} h in)")
    left.set_title(f"team b: {report['teams']['b']:,} tasks", fontsize="medium")
    left.legend(fontsize="small", loc="upper left")
    right.set_xticks(range(len(rows)))
    right.set_xticklabels([r["policy"] for r in rows])
    right.set_ylabel("hours from the start")
    right.set_title(f"team a: {report['teams']['a']:,} tasks, sweep ends", fontsize="medium")
    fig.suptitle(f"Fair share, seed {report['seed']}: team b submits {b_at:g} h in")
    return fig


def graph_costs(report: Mapping[str, Any], out: Path | str) -> Path:
    """Makespan and core-hours by mode and policy, side by side, published marks per mode."""
    return _save(_graph_figure(report), Path(out), _published_note(report))


def _thousands(value: float, _: Any) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:g}"


def _graph_figure(report: Mapping[str, Any]) -> Any:
    plt = require_matplotlib()
    from matplotlib.ticker import FuncFormatter

    rows = report["rows"]
    modes: list[str] = []
    policies: list[str] = []
    for r in rows:
        if r["mode"] not in modes:
            modes.append(r["mode"])
        if r["policy"] not in policies:
            policies.append(r["policy"])
    by = {(r["mode"], r["policy"]): r for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
    width = 0.8 / len(policies)
    quantities = [
        ("makespan_h", "published_makespan_h", "makespan (hours)"),
        ("core_h", "published_core_h", "core-hours (every attempt)"),
    ]
    for ax, (key, published, label) in zip(axes, quantities, strict=True):
        for k, policy in enumerate(policies):
            xs = [i + (k - (len(policies) - 1) / 2) * width for i in range(len(modes))]
            ax.bar(xs, [by[(m, policy)][key] for m in modes], width, label=policy)
        marks = [
            (i, by[(m, policies[0])].get(published))
            for i, m in enumerate(modes)
            if by[(m, policies[0])].get(published) is not None
        ]
        if marks:  # one mark across each mode's group of bars
            ax.hlines(
                [v for _, v in marks],
                [i - 0.42 for i, _ in marks],
                [i + 0.42 for i, _ in marks],
                color="black",
                linewidth=2,
                zorder=3,
                label="published",
            )
        ax.set_xticks(range(len(modes)))
        ax.set_xticklabels(modes)
        ax.yaxis.set_major_formatter(
            FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 100 else f"{v:g}")
        )
        ax.set_xlabel("how the features are computed")
        ax.set_ylabel(label)
        ax.set_title(label.split(" (")[0], fontsize="medium")
    axes[0].legend(fontsize="small")
    fig.suptitle(f"Feature graph and cache, seed {report['seed']} (with backups)")
    return fig


def preemption_cdfs(report: Mapping[str, Any], out: Path | str) -> Path:
    """Slowdown CDFs per class (TE left, BE right), one line per policy, pooled over
    the seeds (``daskjobs simulate preemption --plot``)."""
    plt = require_matplotlib()
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), sharey=True)
    for ax, cls, title in (
        (axes[0], "te", "trial-and-error jobs"),
        (axes[1], "be", "best-effort jobs"),
    ):
        for policy, by_cls in report["slowdowns"].items():
            xs = np.sort(np.asarray(by_cls[cls], dtype=float))
            if len(xs) == 0:
                continue
            ys = np.arange(1, len(xs) + 1) / len(xs)
            ax.step(xs, ys, where="post", label=policy)
        ax.set_xscale("log")
        ax.set_xlabel("slowdown: (end - arrival) / run time alone (log)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("fraction of jobs")
    axes[1].legend(loc="lower right")
    seeds = report["seeds"]
    fig.suptitle(f"Preemption policies, seeds {seeds[0]}-{seeds[-1]} pooled")
    return _save(fig, Path(out))
