"""The ``daskjobs simulate`` command: JSON shape, ordering sanity, figures, bad input.

A chapter over seeds with its output redirected prints each run's line as the run is
computed.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from repo import ROOT

from daskjobs.cli import main

CHAPTER_POLICIES = {"fifo", "lpt", "work-stealing", "node-aware"}
ROW_KEYS = {
    "policy",
    "backups",
    "makespan_h",
    "node_hours",
    "backups_launched",
    "waste_core_h",
    "failures",
    "vs_lower_bound",
    "vs_speed_bound",
    "published_makespan_h",
}


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, ["simulate", *args], catch_exceptions=False)


@pytest.fixture(scope="module")
def chapter_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """One chapter run (seed 0) with --json and --plot, shared by the tests below."""
    out = tmp_path_factory.mktemp("plots")
    result = invoke("chapter", "--json", "--plot", str(out))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), out


@pytest.mark.slow
def test_chapter_json_shape(chapter_run: tuple[dict[str, Any], Path]) -> None:
    report, _ = chapter_run
    for key in ("seed", "tasks", "work_core_h", "lower_bound_h", "speed_bound_h", "rows"):
        assert key in report
    assert report["seed"] == 0 and report["tasks"] == 10_000
    assert report["speed_bound_h"] > report["lower_bound_h"] > 9
    seen = {(r["policy"], r["backups"]) for r in report["rows"]}
    for policy in CHAPTER_POLICIES:
        assert (policy, False) in seen and (policy, True) in seen, policy
    assert ("lpt-no-slow-node", False) in seen
    for row in report["rows"]:
        assert set(row) >= ROW_KEYS
        assert row["makespan_h"] >= report["lower_bound_h"] * 0.999
        assert row["backups"] or row["backups_launched"] == 0
    published = {(r["policy"], r["backups"]): r["published_makespan_h"] for r in report["rows"]}
    assert published[("fifo", False)] == 19.79
    assert published[("node-aware", True)] is None


def test_chapter_ordering_seed0(chapter_run: tuple[dict[str, Any], Path]) -> None:
    report, _ = chapter_run
    m = {(r["policy"], r["backups"]): r["makespan_h"] for r in report["rows"]}
    assert m[("fifo", False)] > m[("lpt", True)]
    assert m[("node-aware", True)] < m[("lpt", True)]


def test_chapter_plot_writes_pngs(chapter_run: tuple[dict[str, Any], Path]) -> None:
    report, out = chapter_run
    for name in ("chapter-utilisation.png", "chapter-makespan.png"):
        png = out / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert str(png) in report["figures"]


def test_chapter_human_table() -> None:
    result = invoke("chapter", "--tasks", "2000", "--failure-rate", "0.02")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "2,000 tasks" in out and "failure rate 0.02" in out
    assert "lower bound (LB)" in out and "speed bound (SB)" in out
    for policy in (*CHAPTER_POLICIES, "lpt-no-slow-node"):
        assert policy in out
    assert "chapter sweep" not in out  # progress goes to stderr
    assert "chapter sweep" in result.stderr


def test_chapter_failure_bound_column(chapter_run: tuple[dict[str, Any], Path]) -> None:
    report, _ = chapter_run
    assert report["failure_bound_h"] >= report["speed_bound_h"]
    for row in report["rows"]:
        ratio = row["vs_failure_bound"]
        assert 0 < ratio <= row["vs_speed_bound"]
        if not row["backups"]:  # a true bound for schedules that restart failed tasks
            assert ratio >= 1.0 - 1e-9, row


def test_chapter_seeds_json() -> None:
    result = invoke("chapter", "--seeds", "0-2,1", "--tasks", "1000", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["seeds"] == [0, 1, 2]
    assert len(report["speed_bound_h"]) == len(report["failure_bound_h"]) == 3
    # each row's spread is the spread of the single-seed runs
    single = [
        json.loads(invoke("chapter", "--seed", str(k), "--tasks", "1000", "--json").stdout)
        for k in (0, 1, 2)
    ]
    for j, row in enumerate(report["rows"]):
        got = sorted(s["rows"][j]["makespan_h"] for s in single)
        assert row["makespan_h"]["min"] == got[0]
        assert row["makespan_h"]["median"] == got[1]
        assert row["makespan_h"]["max"] == got[2]
        within = sum(s["rows"][j]["vs_speed_bound"] <= 1.012 for s in single)
        assert row["within_1_2pct_of_speed_bound"] == within


def test_chapter_seeds_table() -> None:
    result = invoke("chapter", "--seeds", "0,1", "--tasks", "500")
    assert result.exit_code == 0, result.output
    assert "2 seeds" in result.stdout and "median (min-max)" in result.stdout
    assert "node-aware" in result.stdout


def test_a_redirected_chapter_over_seeds_prints_each_run_as_it_is_computed():
    result = CliRunner().invoke(
        main, ["simulate", "chapter", "--seeds", "0-1", "--tasks", "500"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.stderr.splitlines() if " done: " in ln]
    total = int(re.search(r"/(\d+) done", lines[-1]).group(1))  # type: ignore[union-attr]
    assert total >= 2 and len(lines) == total
    assert [int(re.search(r": (\d+)/", ln).group(1)) for ln in lines] == list(  # type: ignore[union-attr]
        range(1, total + 1)
    )
    assert "makespan h: median" in result.stdout


def test_chapter_endgame_runs_the_backups_with_the_end_game() -> None:
    args = ("chapter", "--seed", "2", "--tasks", "1000", "--policy", "fifo", "--json")
    plain = json.loads(invoke(*args).stdout)
    end = json.loads(invoke(*args, "--endgame").stdout)
    assert plain["endgame"] is False and end["endgame"] is True
    # the same rows; only the runs with backups may differ, and there the end game copies
    no, yes = plain["rows"], end["rows"]
    assert no[0] == yes[0]  # without backups: the same run
    assert yes[1]["backups_launched"] > no[1]["backups_launched"]
    assert "backups with the end game" in invoke(*args[:-1], "--endgame").stdout


def test_fairshare_json(tmp_path: Path) -> None:
    result = invoke("fairshare", "--json", "--plot", str(tmp_path))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    rows = {r["policy"]: r for r in report["rows"]}
    assert set(rows) == {"fifo", "fair-share"}
    fifo_b = rows["fifo"]["teams"]["b"]["median_wait_h"]
    fair_b = rows["fair-share"]["teams"]["b"]["median_wait_h"]
    assert fair_b < fifo_b
    assert (tmp_path / "fairshare-waits.png").exists()


def test_graph_json() -> None:
    result = invoke("graph", "--json", "--tasks", "2000")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    modes = {r["mode"] for r in report["rows"]}
    assert modes == {"recompute", "graph", "cached"}
    core_h = {(r["mode"], r["policy"]): r["core_h"] for r in report["rows"]}
    assert core_h[("graph", "lpt")] < core_h[("recompute", "lpt")]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["chapter", "--seed", "-1"], "--seed"),
        (["chapter", "--failure-rate", "-0.1"], "--failure-rate"),
        (["chapter", "--failure-rate", "1"], "--failure-rate"),
        (["chapter", "--tasks", "0"], "--tasks"),
        (["chapter", "--slow-node", "24"], "slow node 24 is not a node index"),
        (["graph", "--tasks", "150"], "multiple of 100"),
        (["chapter", "--seeds", "3-1"], "empty range '3-1'"),
        (["chapter", "--seeds", "0,x"], "'x' is not a seed"),
        (["chapter", "--seeds", "0-1", "--seed", "2"], "either --seed or --seeds"),
        (["chapter", "--seeds", "0-1", "--plot", "somewhere"], "without --seeds"),
    ],
)
def test_bad_input(args: list[str], message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in result.output


def test_plot_without_matplotlib(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    result = invoke("fairshare", "--plot", str(tmp_path))
    assert result.exit_code == 2
    assert 'pip install "daskjobs[plot]"' in result.output
    assert not list(tmp_path.iterdir())


# -- what the figures show (read back through matplotlib's API) -------------------------------


def _legend_labels(ax: Any) -> list[str]:
    legend = ax.get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend is not None else []


def test_chapter_makespan_figure_labels_both_axes_and_tells_the_bounds_apart(
    chapter_run: tuple[dict[str, Any], Path], tmp_path: Path
) -> None:
    from daskjobs.sim import plot

    report, _ = chapter_run
    fig = plot._chapter_makespans_figure(report)
    (ax,) = fig.axes
    (near,) = ax.child_axes  # the inset near the bounds
    assert ax.get_xlabel().startswith("policy") and ax.get_ylabel() == "makespan (hours)"
    lower, speed = report["lower_bound_h"], report["speed_bound_h"]
    labels = _legend_labels(ax)
    assert f"lower bound {lower:.2f} h" in labels and f"speed bound {speed:.2f} h" in labels
    assert "published" in labels
    # at the full scale the two lines are ~1% of the height apart; in the inset, over 5%
    full = ax.get_ylim()[1] - ax.get_ylim()[0]
    bottom, top = near.get_ylim()
    assert (speed - lower) / full < 0.02 and (speed - lower) / (top - bottom) > 0.05
    assert bottom < lower < speed < top
    plot._save(fig, tmp_path / "m.png", plot._published_note(report))
    (note,) = [t.get_text() for t in fig.texts]
    assert note.startswith("published (black marks): ") and "docs/explanation/chapter.md" in note


@pytest.fixture(scope="module")
def fairshare_report() -> dict[str, Any]:
    result = invoke("fairshare", "--json")
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def _overlaps(fig: Any, ax: Any) -> list[str]:
    """Labels of ``ax`` that a published mark (a horizontal segment) is drawn through."""
    from matplotlib.collections import LineCollection

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    crossed = []
    for text in ax.texts:
        box = text.get_window_extent(renderer)
        for lines in (c for c in ax.collections if isinstance(c, LineCollection)):
            for segment in lines.get_segments():
                (x0, y), (x1, _) = ax.transData.transform(segment)
                if box.y0 < y < box.y1 and x0 < box.x1 and x1 > box.x0:
                    crossed.append(text.get_text())
    return crossed


def test_fairshare_figure_shows_the_columns_the_table_prints(
    fairshare_report: dict[str, Any],
) -> None:
    from daskjobs.sim import plot

    fig = plot._fairshare_figure(fairshare_report)
    left, right = fig.axes
    assert [t.get_text() for t in left.get_xticklabels()] == ["median wait", "max wait (all done)"]
    assert left.get_ylabel() == "hours after team b's submission (1 h in)"
    assert right.get_ylabel() == "hours from the start"
    rows = fairshare_report["rows"]
    heights = [round(p.get_height(), 6) for p in left.patches]
    for row in rows:
        b = row["teams"]["b"]
        assert round(b["median_wait_h"], 6) in heights and round(b["max_wait_h"], 6) in heights
        # the bar the table calls "max wait h", with the table's "end h" beside it
        said = [t.get_text() for t in left.texts]
        assert f"{b['max_wait_h']:.2f}\nends {b['end_h']:.2f} h" in said
    assert [round(p.get_height(), 6) for p in right.patches] == [
        round(r["a_end_h"], 6) for r in rows
    ]
    assert "published" in _legend_labels(left)
    assert _overlaps(fig, left) == [] and _overlaps(fig, right) == []


def test_graph_figure_has_one_quantity_per_axis_and_no_mark_through_a_label() -> None:
    from daskjobs.sim import plot

    result = invoke("graph", "--json", "--tasks", "2000")
    report = json.loads(result.stdout)
    fig = plot._graph_figure(report)
    makespan, core_h = fig.axes
    assert makespan.get_ylabel() == "makespan (hours)"
    assert core_h.get_ylabel() == "core-hours (every attempt)"
    assert len(makespan.texts) == len(core_h.texts) == 0  # values are read off the axes
    assert "published" in _legend_labels(makespan)


def test_replay_busy_never_exceeds_the_slots_and_the_legend_stays_off_the_curves() -> None:
    from daskjobs.replay import load, replay
    from daskjobs.replay.plot import _busy_figure, recorded_busy, recorded_slots
    from daskjobs.replay.run import busy_over_time

    loaded = load(ROOT / "examples/data/replay_small.jsonl")
    slots = recorded_slots(loaded)
    assert slots == 6 == sum(w.nthreads for w in loaded.workers)
    step = loaded.recorded.makespan / 4000
    _, raw = busy_over_time(loaded.recorded.intervals, step)
    assert raw.max() == slots + 1  # a start heard before the end it follows (the cause)
    _, busy = recorded_busy(loaded, step)
    assert busy.max() == slots and (busy == raw).mean() > 0.99
    fig = _busy_figure(loaded, replay(loaded))
    (ax,) = fig.axes
    for line in ax.get_lines()[:2]:
        assert max(line.get_ydata()) <= slots
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert legend.y1 < ax.get_window_extent().y0  # below the axes, off the curves
    assert "6 slots (3 workers)" in _legend_labels(ax)


@pytest.mark.slow
def test_gangs_json_rows_are_the_seeds_spread() -> None:
    result = invoke("gangs", "--seeds", "0,1,2", "--hours", "4", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["seeds"] == [0, 1, 2] and len(report["per_seed"]) == 3
    assert [r["reservation"] for r in report["rows"]] == [False, True]
    for i, row in enumerate(report["rows"]):
        got = sorted(s["rows"][i]["gang_wait_max_s"] for s in report["per_seed"])
        assert (row["gang_wait_max_s_min"], row["gang_wait_max_s"]) == (got[0], got[1])
        assert row["gang_wait_max_s_max"] == got[2]
        assert 0 < row["utilisation"] <= 1 and 0 <= row["fragmentation_share"] <= 1
    off, on = report["rows"]
    assert on["gang_wait_max_s"] < off["gang_wait_max_s"]
    assert report["workload"]["nodes"] == 16 and report["workload"]["hours"] == 4


def test_gangs_table_and_bad_input() -> None:
    result = invoke("gangs", "--seeds", "0", "--hours", "2", "--load", "0.7")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "2 h of arrivals at load 0.7" in lines[0] and "seeds [0]" in lines[0]
    assert lines[2].split()[:4] == ["reservation", "gang", "p50", "h"]
    assert [ln.split()[0] for ln in lines[4:6]] == ["off", "on"]
    bad = invoke("gangs", "--nodes", "4")  # 2 A100 nodes cannot hold a 32-GPU A100 gang
    assert bad.exit_code == 2 and "invalid workload: gang_max_gpus 32" in bad.output
    assert invoke("gangs", "--seeds", "x").exit_code == 2
