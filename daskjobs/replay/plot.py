"""Figures of a replay (PNG; matplotlib imported inside each function, Agg backend).

:func:`busy_slots` draws busy slots over time, recorded against replayed;
:func:`what_if_bars` the makespan of each what-if row beside the recorded one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from daskjobs.replay.load import Loaded
from daskjobs.replay.run import ReplayResult, busy_over_time, replayed_intervals
from daskjobs.sim.plot import require_matplotlib

__all__ = ["busy_slots", "recorded_busy", "recorded_slots", "what_if_bars"]


from daskjobs.sim.plot import _save  # one way to write a figure


def recorded_slots(loaded: Loaded) -> int:
    """The recorded cluster's slots: every worker's threads."""
    return sum(w.nthreads for w in loaded.workers) or loaded.cluster.total_cores


def recorded_busy(loaded: Loaded, step: float) -> tuple[np.ndarray, np.ndarray]:
    """Busy slots of the recorded run every ``step`` seconds, never above its slots.

    The trace times an attempt from when the scheduler heard it start to when it heard it end.
    A worker reports the start of its next task in the same batch as, and just before, the end
    of the task that freed the thread, so the two intervals overlap by the time the scheduler
    takes between the two messages (at most 0.15 ms in examples/data/replay_small.jsonl): a
    sample that falls there counts one slot twice. Those counts are capped at the slots.
    """
    times, busy = busy_over_time(loaded.recorded.intervals, step)
    return times, np.minimum(busy, recorded_slots(loaded))


def busy_slots(loaded: Loaded, result: ReplayResult, out: Path | str) -> Path:
    """Busy slots over time: the recorded run and its replay, on one axis."""
    return _save(_busy_figure(loaded, result), Path(out))


def _busy_figure(loaded: Loaded, result: ReplayResult) -> Any:
    plt = require_matplotlib()
    span = max(loaded.recorded.makespan, result.makespan, 1e-9)
    step = span / 400
    fig, ax = plt.subplots(figsize=(8, 4.6))
    t, b = recorded_busy(loaded, step)
    ax.step(t, b, where="post", label=f"recorded ({loaded.recorded.makespan:.3g} s)")
    t, b = busy_over_time(replayed_intervals(result), step)
    ax.step(t, b, where="post", label=f"replayed, {result.policy} ({result.makespan:.3g} s)")
    slots = recorded_slots(loaded)
    workers = len(loaded.workers)
    ax.axhline(slots, color="grey", linestyle=":", label=f"{slots} slots ({workers} workers)")
    if loaded.cluster.total_cores != slots:
        ax.axhline(
            loaded.cluster.total_cores,
            color="grey",
            linestyle="--",
            label=f"{loaded.cluster.total_cores} slots replayed",
        )
    ax.set_ylim(0, max(slots, loaded.cluster.total_cores) * 1.1)
    ax.set_xlabel("seconds since the first submission")
    ax.set_ylabel("busy slots")
    ax.set_title(f"Recorded vs replayed: {Path(loaded.path).name}")
    # below the axes: inside, it would cover the curves' start or their end
    ax.legend(
        loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize="small", frameon=False
    )
    return fig


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
    ax.set_xlabel("policy; nodes x slots per node")
    ax.set_ylabel("makespan (s)")
    ax.set_title("What-if: policy x cluster")
    ax.legend(fontsize="small")
    return _save(fig, Path(out))
