"""Small inconsistencies (issue 38): durations read one way everywhere, a redirected
``simulate`` prints as it goes, ``cache ls`` columns line up, tables of zero rows."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from daskjobs._text import table
from daskjobs.cli import main


def test_an_estimate_reads_durations_as_the_configuration_does():
    from daskjobs.config import settings
    from daskjobs.plugin.estimates import check_estimate
    from daskjobs.sweep import Sweep

    assert settings(default_estimate="10s").default_estimate == 10.0
    assert check_estimate("k", "10s") == 10.0
    assert check_estimate("k", "2 minutes") == 120.0
    assert check_estimate("k", 2.5) == 2.5
    sweep = Sweep()
    stage = sweep.stage(lambda x: x, over={"x": [1, 2]}, estimate="10s", name="s")
    assert {n.estimate for n in stage.nodes} == {10.0}
    per = sweep.stage(lambda x: x, over={"x": [1]}, estimate=lambda p: "150ms", name="t")
    assert [n.estimate for n in per.nodes] == [0.15]


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


def test_a_table_of_zero_rows_is_its_header():
    assert table(["a", "bb"], []).splitlines() == ["a  bb", "-  --"]


def test_cache_ls_columns_line_up(tmp_path):
    from daskjobs.cache.store import ResultStore

    store = ResultStore(str(tmp_path / "store"))
    store.put("k-short", 1, stage="s")
    store.put("k-" + "x" * 70, list(range(1000)), stage="a-rather-long-stage-name-indeed")
    result = CliRunner().invoke(main, ["cache", "ls", "--store", str(tmp_path / "store")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = lines[0]
    rows = [ln for ln in lines if ln.startswith("k-")]
    assert header.startswith("key") and len(rows) == 2
    for word in ("stage", "writer"):  # left-aligned: every row's cell starts there
        col = header.index(f" {word}") + 1
        assert all(r[col - 1] == " " and r[col] != " " for r in rows), (word, lines)
    for word in ("size", "age", "compute"):  # right-aligned: every row's cell ends there
        end = header.index(f" {word}") + len(word)
        assert all(r[end] != " " and r[end + 1] == " " for r in rows), (word, lines)


@pytest.mark.parametrize("bad", ["soon", -1, float("nan"), True])
def test_a_bad_estimate_still_names_the_task(bad):
    from daskjobs.plugin.estimates import BadEstimate, check_estimate

    with pytest.raises(BadEstimate, match=r"task 'k': estimate must be a duration"):
        check_estimate("k", bad)


def _stream(batches, per_batch=8, seconds=1.0, gap=3600.0):
    """Task-stream records: ``batches`` batches of ``per_batch`` one-second tasks on two
    one-thread workers, back to back within a batch, ``gap`` seconds of idleness between
    batches (a day of work submitted now and then)."""
    recs = []
    t = 1000.0
    for b in range(batches):
        for i in range(per_batch):
            w = i % 2
            start = t + (i // 2) * seconds
            recs.append(
                {
                    "key": f"work-{b}-{i}",
                    "worker": f"tcp://w{w}:1",
                    "thread": w,
                    "status": "OK",
                    "startstops": [{"action": "compute", "start": start, "stop": start + seconds}],
                }
            )
        t += (per_batch // 2) * seconds + gap
    return recs


def test_replay_does_not_read_idle_gaps_between_submissions_as_overhead():
    from daskjobs.replay import replay
    from daskjobs.replay.stream import from_task_stream

    loaded = from_task_stream(_stream(6))
    # back to back within each batch: nothing was lost to dask while work waited
    assert loaded.fit.overhead == pytest.approx(0.0, abs=1e-9)
    assert loaded.fit.lost == pytest.approx(0.0, abs=1e-9)
    # and the replay keeps the idle hours: each batch starts when it ran
    r = replay(loaded)
    assert r.makespan == pytest.approx(loaded.recorded.makespan)
