"""The scheduler's own forecast (daskjobs/plugin/observe/live_forecast.py), on its page and
/metrics.

Work is held unfinished with a ``threading.Event`` (in-process workers), so the forecast
always has something to simulate while a test looks; every wait polls for the thing it
waits for, with a deadline, never a sleep of a guessed length.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
import types
import urllib.request
from collections.abc import Iterator
from typing import Any

import dask
import pytest
from conftest import plugin_cluster
from distributed import Client
from waiting import until

import daskjobs.forecasting as forecasting
import daskjobs.plugin.observe.live_forecast as live_forecast
import daskjobs.plugin.observe.snapshot as snapshot_module
from daskjobs.forecasting import Forecast, Remaining
from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.observe.live_forecast import NAME, THREAD, ForecastPart, Reading

GATE = threading.Event()
FAST = {"interval": "1s"}  # the first forecast a second after work appears
TEAMS = {"targets": {"a": 1, "b": 1, "idle": 1}}


def held(i: int) -> int:
    GATE.wait(60)
    return i


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    GATE.clear()
    yield GATE
    GATE.set()


def submit(c: Client, n: int = 6) -> list[Any]:
    """``n`` held tasks of team a (estimate 2 s) and ``n`` of team b (estimate 1 s)."""
    futures = []
    for team, estimate in (("a", 2.0), ("b", 1.0)):
        with dask.annotate(team=team, estimate=estimate):
            futures += c.map(held, range(n), key=[f"{team}-{i}" for i in range(n)])
    return futures


def reading(cl: Any) -> Reading | None:
    return cl.scheduler.plugins["daskjobs"].view.forecast()


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of metric ``name``: its labels (sorted pairs) -> value."""
    out = {}
    for m in re.finditer("^" + re.escape(name) + r"(?:\{([^}]*)\})? (\S+)$", text, flags=re.M):
        labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m.group(1) or "")))
        out[labels] = float(m.group(2))
    return out


class Spy:
    """Where the snapshot and the simulation ran (thread), and a hold on the simulation."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.snapshots: list[int] = []
        self.simulations: list[tuple[int, str]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()
        snapshot, simulate = live_forecast.snapshot_async, forecasting.forecast_snapshot

        async def spy_snapshot(*args: Any, **kwargs: Any) -> Any:
            self.snapshots.append(threading.get_ident())
            return await snapshot(*args, **kwargs)

        def spy_simulate(*args: Any, **kwargs: Any) -> Any:
            self.simulations.append((threading.get_ident(), threading.current_thread().name))
            self.entered.set()
            self.release.wait(30)
            return simulate(*args, **kwargs)

        monkeypatch.setattr(live_forecast, "snapshot_async", spy_snapshot)
        monkeypatch.setattr(forecasting, "forecast_snapshot", spy_simulate)


def loop_thread(c: Client) -> int:
    """The thread of the scheduler's event loop (where run_on_scheduler runs a function)."""
    return c.run_on_scheduler(lambda dask_scheduler: threading.get_ident())


def test_the_simulation_runs_in_its_thread_while_the_event_loop_answers(monkeypatch, gate):
    spy = Spy(monkeypatch)
    spy.release.clear()  # the first simulation waits until the loop has answered
    plugin = JobsPlugin(policy="fair-share", teams=TEAMS, forecast=FAST)
    with plugin_cluster(plugin, n_workers=2) as cl, Client(cl) as c:
        assert NAME in cl.scheduler.periodic_callbacks
        futures = submit(c)
        assert spy.entered.wait(30), "no forecast was made"
        # the simulation is held in its thread: the scheduler still answers, at once
        t0 = time.monotonic()
        assert c.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) == 12
        assert time.monotonic() - t0 < 25  # (held on the loop, it would wait 30 s)
        assert reading(cl).state == "waiting"  # nothing to show until it ends
        spy.release.set()
        r = until(lambda: reading(cl).state == "ok" and reading(cl), "a forecast")
        loop = loop_thread(c)
        gate.set()
        c.gather(futures)
    assert spy.snapshots[0] == loop  # the snapshot reads the scheduler: on its loop
    ident, name = spy.simulations[0]
    assert name == THREAD and ident != loop
    f = r.forecast
    assert f.tasks == 12 and f.draws == 10  # daskjobs.forecast.draws
    assert set(r.teams) == {"a", "b"}
    assert r.snapshot_seconds > 0 and r.cpu_seconds > 0


class Hold:
    """``asyncio.sleep`` for the snapshot module: its first call waits (on the scheduler's
    loop, which runs on meanwhile) until :func:`_let_go` runs there."""

    current: Hold

    def __init__(self) -> None:
        self.calls = 0
        self.held = threading.Event()
        self.go = asyncio.Event()
        self.sleep_ = asyncio.sleep

    async def sleep(self, delay: float) -> None:
        self.calls += 1
        if self.calls == 1:
            self.held.set()
            await self.go.wait()
        else:
            await self.sleep_(delay)


def _let_go(dask_scheduler: Any) -> None:
    Hold.current.go.set()


def test_one_snapshot_at_a_time_and_the_loop_runs_while_it_waits(monkeypatch, gate):
    spy = Spy(monkeypatch)
    hold = Hold()
    monkeypatch.setattr(Hold, "current", hold, raising=False)
    monkeypatch.setattr(snapshot_module, "CHUNK", 1)  # a slice per task
    monkeypatch.setattr(snapshot_module, "SLICE", 0.0)
    monkeypatch.setattr(snapshot_module, "asyncio", types.SimpleNamespace(sleep=hold.sleep))
    ticks: list[int] = []
    tick = ForecastPart._tick
    monkeypatch.setattr(ForecastPart, "_tick", lambda self: (ticks.append(1), tick(self))[1])
    plugin = JobsPlugin(policy="fair-share", teams=TEAMS, forecast=FAST)
    with plugin_cluster(plugin, n_workers=2) as cl, Client(cl) as c:
        futures = submit(c)
        assert hold.held.wait(30), "no snapshot was taken"
        n = len(ticks)
        until(lambda: len(ticks) >= n + 3, "three more ticks")  # past an interval, twice
        assert len(spy.snapshots) == 1 and spy.simulations == []  # the one in flight
        assert reading(cl).state == "waiting"
        c.run_on_scheduler(_let_go)
        r = until(lambda: reading(cl).state == "ok" and reading(cl), "a forecast")
        gate.set()
        c.gather(futures)
    assert r.forecast.tasks == 12 and len(spy.simulations) >= 1
    assert hold.calls > 12  # it gave the loop back after every task, at least


def test_the_page_and_metrics_show_each_teams_expected_end(gate):
    pytest.importorskip("prometheus_client")
    plugin = JobsPlugin(policy="fair-share", teams=TEAMS, forecast=FAST)
    with plugin_cluster(plugin, n_workers=2) as cl, Client(cl) as c:
        base = f"http://127.0.0.1:{cl.scheduler.http_server.port}"
        futures = submit(c)

        def metrics() -> str | None:
            text = get(base + "/metrics")
            return text if "dask_daskjobs_forecast_remaining_seconds{" in text else None

        text = until(metrics, "the forecast's gauges")
        per_team = samples(text, "dask_daskjobs_forecast_remaining_seconds")
        q = {
            team: [per_team[(("quantile", p), ("team", team))] for p in ("0.1", "0.5", "0.9")]
            for team in ("a", "b", "idle")
        }
        overall = samples(text, "dask_daskjobs_forecast_overall_remaining_seconds")
        every = [overall[(("quantile", p),)] for p in ("0.1", "0.5", "0.9")]
        for team in ("a", "b"):
            assert 0 < q[team][0] <= q[team][1] <= q[team][2], q
            # all the work ends with the last team's: never before either
            assert all(t <= e for t, e in zip(q[team], every, strict=True)), (q, every)
        assert q["idle"] == [0.0, 0.0, 0.0]  # a team with nothing unfinished: done
        assert samples(text, "dask_daskjobs_forecast_age_seconds")[()] >= 0
        assert samples(text, "dask_daskjobs_forecast_cpu_seconds")[()] > 0

        d = json.loads(get(base + "/daskjobs/data.json"))
        assert d["forecast"]["state"] == "ok" and d["forecast"]["age"] >= 0
        rows = {r["team"]: r for r in d["teams"]}
        for team in ("a", "b"):
            e = rows[team]["expected_end"]
            assert 0 <= e["p10"] <= e["p50"] <= e["p90"], e
        assert rows["idle"]["expected_end"] == {"p10": 0.0, "p50": 0.0, "p90": 0.0}

        pytest.importorskip("bokeh")
        from daskjobs.plugin.observe import dashboard

        page = dashboard._Page(dashboard.installed(cl.scheduler))
        page.update()
        assert re.search(r"Expected end \(forecast \d+ s ago\)", page.team_div.text)
        cell = r'<td class="num">in [\d.]+ s \([\d.]+ s to [\d.]+ s\)</td>'
        assert re.search(cell, page.team_div.text), page.team_div.text
        assert '<td class="num">done</td>' in page.team_div.text  # team idle
        assert "all work: <b>expected to end in " in page.header.text

        gate.set()
        c.gather(futures)
        until(lambda: reading(cl).state == "done", "the forecast to say done")
        text = get(base + "/metrics")
        overall = samples(text, "dask_daskjobs_forecast_overall_remaining_seconds")
        assert set(overall.values()) == {0.0}
        assert "dask_daskjobs_forecast_age_seconds" not in text  # no forecast to age


def test_switched_off_nothing_is_computed(monkeypatch, gate):
    spy = Spy(monkeypatch)
    plugin = JobsPlugin(policy="fair-share", teams=TEAMS, forecast={"interval": None})
    with plugin_cluster(plugin, n_workers=2) as cl, Client(cl) as c:
        assert NAME not in cl.scheduler.periodic_callbacks
        futures = submit(c)
        # the page's sampler has ticked a few times with the work unfinished
        dash = pytest.importorskip("daskjobs.plugin.observe.dashboard").installed(cl.scheduler)
        if dash is not None:
            seq = dash.seq
            until(lambda: dash.seq >= seq + 3, "three ticks of the page's sampler")
            d = dash.data()
            assert d["forecast"]["state"] == "off" and "interval is null" in d["forecast"]["why"]
            assert all(r["expected_end"] is None for r in d["teams"])
        assert reading(cl) is None
        gate.set()
        c.gather(futures)
    assert spy.snapshots == [] and spy.simulations == []


def test_above_max_tasks_the_page_says_it_is_off_and_why(monkeypatch, gate):
    spy = Spy(monkeypatch)
    plugin = JobsPlugin(policy="fair-share", teams=TEAMS, forecast={**FAST, "max_tasks": 5})
    with plugin_cluster(plugin, n_workers=2) as cl, Client(cl) as c:
        futures = submit(c)
        r = until(lambda: reading(cl).state == "off" and reading(cl), "the forecast to be off")
        assert "12 unfinished tasks" in r.why and "max-tasks (5)" in r.why, r.why
        gate.set()
        c.gather(futures)
        until(lambda: reading(cl).state == "done", "the forecast to say done")
    assert spy.snapshots == [] and spy.simulations == []


def test_a_failing_forecast_is_logged_once_counted_and_never_fatal(monkeypatch, gate, caplog):
    calls = []

    def broken(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        raise RuntimeError("injected")

    monkeypatch.setattr(forecasting, "forecast_snapshot", broken)
    plugin = JobsPlugin(policy="fair-share", teams=TEAMS, forecast=FAST)
    with (
        caplog.at_level(logging.DEBUG, logger="daskjobs.plugin"),
        plugin_cluster(plugin, n_workers=2) as cl,
        Client(cl) as c,
    ):
        futures = submit(c)
        errors = cl.scheduler.plugins["daskjobs"].errors
        until(lambda: errors.get("forecast", 0) >= 2, "two failed refreshes")
        r = reading(cl)
        assert r.state == "failed" and "RuntimeError: injected" in r.why
        gate.set()
        assert sorted(c.gather(futures)) == sorted(list(range(6)) * 2)
    failed = [rec for rec in caplog.records if "the scheduler's forecast failed" in rec.message]
    assert [rec.levelno for rec in failed][:2] == [logging.WARNING, logging.DEBUG]
    assert sum(rec.levelno == logging.WARNING for rec in failed) == 1
    assert len(calls) >= 2


def test_a_reading_is_aged_to_the_moment_it_is_read():
    def rem(p10: float, p50: float, p90: float) -> Remaining:
        return Remaining(p10, p50, p90)

    f = Forecast(
        remaining=rem(10.0, 20.0, 30.0),
        end=rem(110.0, 120.0, 130.0),
        teams={"a": rem(4.0, 8.0, 12.0), "b": rem(10.0, 20.0, 30.0)},
        sweeps={},
        tasks=5,
        running=1,
        workers=1,
        policy="fifo",
        speculation=False,
        draws=10,
        seed=0,
        time=100.0,
        seconds_taken=0.1,
    )
    r = Reading("ok", forecast=f, teams=("a", "b"))
    assert r.age(106.0) == 6.0
    assert r.remaining(106.0) == (4.0, 14.0, 24.0)
    assert r.remaining(106.0, "a") == (0.0, 2.0, 6.0)  # never below 0
    assert r.remaining(106.0, "idle") == (0.0, 0.0, 0.0)  # nothing of it unfinished
    d = r.as_dict(106.0)
    assert d["teams"]["a"] == {"p10": 0.0, "p50": 2.0, "p90": 6.0} and d["tasks"] == 5
    assert Reading("done").remaining(0.0, "a") == (0.0, 0.0, 0.0)
    for state in ("waiting", "off", "failed"):
        assert Reading(state, "why").remaining(0.0) is None
