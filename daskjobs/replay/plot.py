"""Figures of a replay (PNG; matplotlib imported inside each function, Agg backend).

:func:`busy_slots` draws busy slots over time, recorded against replayed;
:func:`what_if_bars` the makespan of each what-if row beside the recorded one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from daskjobs.replay.load import Loaded
from daskjobs.replay.run import ReplayResult, busy_over_time, replayed_intervals
from daskjobs.sim.plot import require_matplotlib

__all__ = ["busy_slots", "what_if_bars"]


from daskjobs.sim.plot import _save  # one way to write a figure


def busy_slots(loaded: Loaded, result: ReplayResult, out: Path | str) -> Path:
    """Busy slots over time: the recorded run and its replay, on one axis."""
    plt = require_matplotlib()
    span = max(loaded.recorded.makespan, result.makespan, 1e-9)
    step = span / 400
    fig, ax = plt.subplots(figsize=(8, 4))
    t, b = busy_over_time(loaded.recorded.intervals, step)
    ax.step(t, b, where="post", label=f"recorded ({loaded.recorded.makespan:.3g} s)")
    t, b = busy_over_time(replayed_intervals(result), step)
    ax.step(t, b, where="post", label=f"replayed, {result.policy} ({result.makespan:.3g} s)")
    ax.axhline(loaded.cluster.total_cores, color="grey", linestyle=":", label="slots")
    ax.set_xlabel("seconds since the first submission")
    ax.set_ylabel("busy slots")
    ax.set_title(f"Recorded vs replayed: {Path(loaded.path).name}")
    ax.legend(loc="lower left", fontsize="small")
    return _save(fig, Path(out))


def what_if_bars(report: dict[str, Any], out: Path | str) -> Path:
    """One bar per what-if row (makespan), the recorded makespan as a line."""
    plt = require_matplotlib()
    rows = report["what_if"]
    had_slow = any(w["slowdown"] != 1.0 for w in report["workers"])
    labels = [
        f"{r['policy']}\n{r['nodes']}x{r['cores_per_node']}"
        + (" no slow" if had_slow and not r["slow"] else "")
        + ("" if r["speculation"] is None else f"\nspec {r['speculation']:g}x")
        for r in rows
    ]
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(rows)), 4))
    ax.bar(range(len(rows)), [r["makespan_s"] for r in rows], color="tab:blue")
    ax.axhline(report["recorded"]["makespan_s"], color="tab:red", linestyle="--", label="recorded")
    ax.set_xticks(range(len(rows)), labels, fontsize="x-small")
    ax.set_ylabel("makespan (s)")
    ax.set_title("What-if: policy x cluster")
    ax.legend(fontsize="small")
    return _save(fig, Path(out))
