"""Figures that say what they count (issues 37 and 38): per-team running figures never
exceed the threads that exist, backup waste is the copies' only, a worker's slow-down
survives its departure, status speaks text, the audit table is not flooded."""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from types import SimpleNamespace
from typing import Any

import dask
import pytest
from conftest import plugin_cluster
from distributed import Client

from daskjobs.config import settings
from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.audit import Audit
from daskjobs.plugin.cli import render
from daskjobs.plugin.client import status
from daskjobs.plugin.dashboard import Dashboard
from daskjobs.plugin.speeds import WorkerSpeeds
from daskjobs.plugin.views import LiveTask

FAST = {"late_factor": 2.0, "min_runtime": "100ms", "interval": "50ms", "enabled": True}


def work(i, seconds):
    """Ten times slower on the worker named 0."""
    from distributed import get_worker

    time.sleep(seconds * (10 if get_worker().name == 0 else 1))
    return i


@pytest.mark.slow
def test_running_figures_never_exceed_the_threads_with_copies_running():
    # four one-thread workers: dask's default worker-saturation (1.1) hands each two tasks,
    # so eight are "processing"; worker 0 is ten times slower, so copies run as well
    plugin = JobsPlugin(
        policy="fair-share",
        teams={"targets": {"a": 1, "b": 1}},
        speculation={**FAST, "ahead": "always"},
    )
    samples = []
    with plugin_cluster(plugin, n_workers=4) as cl, Client(cl) as c:
        futures = []
        for team in ("a", "b"):
            with dask.annotate(team=team, estimate=0.3):
                futures += c.compute(
                    [dask.delayed(work)(i, 0.3, dask_key_name=f"{team}-{i}") for i in range(12)]
                )
        while not all(f.done() for f in futures):
            samples.append(status(c)["teams"])
            time.sleep(0.02)
        c.gather(futures)
        launched = status(c)["speculation"]["launched"]
        history = _dashboard_history(cl)
    assert launched >= 1
    for total in history:  # the dashboard's series: the same figures, sampled each second
        assert total <= 4 + 1e-9, history
    assert len(samples) > 10
    for rows in samples:
        assert sum(r["running"] for r in rows) <= 4 + 1e-9, rows
        assert all(0 <= r["copies"] <= r["running"] + 1e-9 for r in rows), rows
    # what dask assigned to workers is more than the threads: that figure is labelled apart
    assert max(sum(r["assigned"] for r in rows) for rows in samples) > 4
    assert any(r["copies"] > 0 for rows in samples for r in rows), "no copy was seen running"


def _dashboard_history(cl: Any) -> list[float]:
    """Per dashboard sample, the threads held by all teams (empty without the page)."""
    import json
    import urllib.request

    from daskjobs.plugin.dashboard import installed

    if installed(cl.scheduler) is None:
        return []
    url = f"http://127.0.0.1:{cl.scheduler.http_server.port}/daskjobs/data.json"
    with urllib.request.urlopen(url, timeout=10) as r:
        h = json.load(r)["history"]
    teams = h["teams"].values()
    return [sum(t["running"][i] or 0 for t in teams) for i in range(len(h["time"]))]


def fail_after(seconds):
    time.sleep(seconds)
    raise RuntimeError("this attempt fails")


def test_a_failed_attempt_is_not_backup_waste():
    plugin = JobsPlugin(
        policy="fair-share", teams={"targets": {"a": 1}}, speculation={**FAST, "late_factor": 50}
    )
    with plugin_cluster(plugin) as cl, Client(cl) as c:
        with dask.annotate(team="a", estimate=10.0):
            f = c.submit(fail_after, 0.4, key="fails")
        with pytest.raises(RuntimeError):
            f.result()
        sp = status(c)["speculation"]
    assert sp["launched"] == 0
    assert sp["waste_seconds"] == {}  # no copy ran: no copy waste
    assert sp["failed_seconds"]["a"] >= 0.3  # the failed attempt is counted, apart


def _view(key):
    return LiveTask(key, 1.0, 1, "a", 0.0, (), "annotation", "s")


def test_a_worker_keeps_its_measured_slow_down_across_leaving_and_returning():
    sched = SimpleNamespace(workers={})
    speeds = WorkerSpeeds(Audit(100))
    speeds.scheduler = sched
    sched.workers["tcp://h:1"] = SimpleNamespace(nthreads=1, name="w0")
    for i in range(6):
        speeds.learn(_view(f"k{i}"), "tcp://h:1", 4.0)  # four times its estimates
    before = speeds.speed("tcp://h:1")
    assert before > 2.5
    # it leaves: the row keeps what was learned, marked gone
    del sched.workers["tcp://h:1"]
    speeds.forget("tcp://h:1")
    (row,) = speeds.rows()
    assert (row["present"], row["samples"]) == (False, 6)
    assert row["speed"] == pytest.approx(before)
    # it returns under its name at another address: it starts from what was learned
    sched.workers["tcp://h:2"] = SimpleNamespace(nthreads=1, name="w0")
    assert speeds.speed("tcp://h:2") == pytest.approx(before)
    rows = {r["worker"]: r for r in speeds.rows()}
    assert rows["tcp://h:2"]["samples"] == 6 and rows["tcp://h:2"]["present"]


def test_status_prints_settings_and_speculation_as_text_with_strict_half_life_record_dir():
    s = settings(
        policy="fair-share",
        teams={"targets": {"a": 1}, "strict": True, "half-life": "2h"},
        speculation={"enabled": True},
        record_dir="/var/traces",
    )
    st: dict[str, Any] = {
        "policy": "fair-share",
        "overrides": {"teams": {"targets": {"a": 1}}},
        "settings": dataclasses.asdict(s),
        "teams": [],
        "workers": [],
        "stages": {},
        "speculation": {
            "launched": 2,
            "won": 1,
            "lost": 1,
            "failed": 0,
            "abandoned": 0,
            "running": 0,
            "peak": 1,
            "waste_seconds": {"a": 1.5},
            "failed_seconds": {"a": 0.5},
        },
        "recording": {"path": "/var/traces/x.jsonl", "events": 10},
        "errors": {},
    }
    text = render(st, "tcp://s:8786")
    assert "{" not in text and "}" not in text, text  # no raw JSON anywhere
    assert "teams.strict               True" in text
    assert "teams.half-life            7200 s" in text
    assert "record-dir                 /var/traces" in text
    assert "copy waste (s)  a 1.5" in text and "failed (s)      a 0.5" in text
    assert "recording: path /var/traces/x.jsonl, events 10" in text


def test_the_dashboards_audit_table_is_not_flooded_by_worker_speed_events():
    events: deque[dict[str, Any]] = deque()
    events.append({"time": 1.0, "action": "ranked-graph", "tasks": 3})
    for i in range(200):
        events.append({"time": 2.0 + i, "action": "worker-speed", "worker": "w", "speed": 1.0})
    events.append({"time": 300.0, "action": "backup-launched", "key": "k"})
    dash = Dashboard(SimpleNamespace(events=events), None, None)  # type: ignore[arg-type]
    shown = dash.events(25)
    assert [e["action"] for e in shown] == ["backup-launched", "ranked-graph"]
