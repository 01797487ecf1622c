"""Observability: Prometheus metrics on the scheduler's /metrics and ``daskjobs status``.

``daskjobs status`` prints the settings and speculation's figures as text, never as JSON;
given what is not a scheduler's address (a bare word, the dashboard's URL or port, a port
that refuses, a server that never answers) it says so in one line, soon.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import threading
import time
import urllib.request
from typing import Any

import dask
import pytest
from click.testing import CliRunner
from conftest import plugin_cluster
from distributed import Client

from daskjobs.cli import main
from daskjobs.config import settings
from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.client import explain
from daskjobs.plugin.client.cli import render
from daskjobs.plugin.observe.metrics import install_metrics, installed, uninstall_metrics

pytest.importorskip("prometheus_client")


def cluster(plugin=None, threads=2):
    return plugin_cluster(plugin, threads_per_worker=threads)


def nap(i, seconds=0.3):
    time.sleep(seconds)
    return i


def install(dask_scheduler):
    install_metrics(dask_scheduler.plugins["daskjobs"], dask_scheduler)
    install_metrics(dask_scheduler.plugins["daskjobs"], dask_scheduler)  # idempotent
    return installed(dask_scheduler)


def scrape(cl) -> str:
    port = cl.scheduler.http_server.port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def value(text: str, name: str, **labels: str) -> float:
    """The value of one sample of ``name`` with exactly ``labels``."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    braces = r"\{" + re.escape(want) + r"\}" if labels else ""
    pattern = "^" + re.escape(name) + braces + r" (\S+)$"
    found = [float(m.group(1)) for m in re.finditer(pattern, text, flags=re.M)]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_metrics_on_the_dashboard_while_teams_wait_and_after():
    plugin = JobsPlugin(
        policy="fair-share",
        teams={"targets": {"a": 3, "b": 1}, "quotas": {"a": 1}},
        default_estimate="2s",
    )
    with cluster(plugin) as cl, Client(cl) as c:
        assert c.run_on_scheduler(install) is True
        parts = []
        for i in range(8):
            ann = {"team": "ab"[i % 2]}
            if i < 5:
                ann["estimate"] = 0.5
            with dask.annotate(**ann):
                parts.append(dask.delayed(nap)(i, dask_key_name=f"job-{i}"))
        futs = c.compute(parts)
        deadline = time.time() + 10
        while time.time() < deadline:
            text = scrape(cl)
            if "dask_daskjobs_queued_tasks{" in text:
                break
            time.sleep(0.05)
        # while tasks wait: per-team fair-share state and queue delay
        assert value(text, "dask_daskjobs_team_share", team="a") == pytest.approx(0.75)
        assert value(text, "dask_daskjobs_team_quota_slots", team="a") == 1
        running = value(text, "dask_daskjobs_team_running_slots", team="a")
        running += value(text, "dask_daskjobs_team_running_slots", team="b")
        assert running >= 1
        queued = sum(
            value(text, "dask_daskjobs_queued_tasks", team=t)
            for t in ("a", "b")
            if f'dask_daskjobs_queued_tasks{{team="{t}"}}' in text
        )
        assert queued >= 1
        assert "dask_daskjobs_queue_delay_seconds{" in text
        assert "dask_daskjobs_team_usage{" in text
        assert c.gather(futs) == list(range(8))
        text = scrape(cl)
        assert value(text, "dask_daskjobs_ranked_graphs_total") == 1
        assert value(text, "dask_daskjobs_ranked_tasks_total") == 8
        assert value(text, "dask_daskjobs_estimates_total", source="annotation") == 5
        assert value(text, "dask_daskjobs_estimates_total", source="default") == 3
        assert "dask_daskjobs_queued_tasks{" not in text  # nothing waits any more
        # dask's own metrics are still there beside ours
        assert "dask_scheduler_clients" in text

        # a swallowed hook error is counted by hook
        def break_policy(dask_scheduler):
            def boom(task):
                raise RuntimeError("injected")

            dask_scheduler.plugins["daskjobs"].ranker.policy.key = boom

        c.run_on_scheduler(break_policy)
        assert c.compute(dask.delayed(nap)(9, 0.0, dask_key_name="after"), sync=True) == 9
        text = scrape(cl)
        assert value(text, "dask_daskjobs_hook_errors_total", hook="rank") == 1
        assert value(text, "dask_daskjobs_ranked_graphs_total") == 1

        c.run_on_scheduler(lambda dask_scheduler: uninstall_metrics(dask_scheduler))
        assert "dask_daskjobs_" not in scrape(cl)
        assert c.run_on_scheduler(lambda dask_scheduler: installed(dask_scheduler)) is False


def test_two_schedulers_in_one_process_are_labelled_by_address():
    with cluster(JobsPlugin(policy="lpt")) as c1, cluster(JobsPlugin(policy="fifo")) as c2:
        for cl in (c1, c2):
            install_metrics(cl.scheduler.plugins["daskjobs"], cl.scheduler)
        try:
            with Client(c1) as c:
                c.compute(dask.delayed(nap)(1, 0.0), sync=True)
            text = scrape(c1)
            addr1, addr2 = c1.scheduler.address, c2.scheduler.address
            assert value(text, "dask_daskjobs_ranked_graphs_total", scheduler=addr1) == 1
            assert value(text, "dask_daskjobs_ranked_graphs_total", scheduler=addr2) == 0
            assert text.count("# TYPE dask_daskjobs_ranked_graphs_total counter") == 1
        finally:
            uninstall_metrics(c1.scheduler)
            uninstall_metrics(c2.scheduler)


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_status_command_prints_policy_teams_stages_and_counters():
    plugin = JobsPlugin(policy="fair-share", teams={"targets": {"quant": 2, "ml": 1}})
    with cluster(plugin) as cl, Client(cl) as c:
        with dask.annotate(team="quant", stage="backtest"):
            parts = [dask.delayed(nap)(i, 0.01) for i in range(4)]
        c.compute(parts, sync=True)
        code, out, _ = invoke("status", cl.scheduler.address)
        assert code == 0, out
        assert "policy    fair-share" in out
        # team, share, usage, threads, copies, assigned, booked, queued, quota
        assert re.search(r"^quant\s+0\.67\s+\S+\s+0\s+0\s+0\s+\S+\s+0\s+-$", out, flags=re.M), out
        assert re.search(r"^backtest\s+4\s+", out, flags=re.M), out
        assert re.search(r"^ranked_graphs\s+1$", out, flags=re.M), out
        assert "errors           none" in out
        code, out, _ = invoke("status", cl.scheduler.address, "--json")
        data = json.loads(out)
        assert code == 0 and data["policy"] == "fair-share"
        assert data["stages"]["backtest"]["samples"] == 4
        assert {row["team"] for row in data["teams"]} == {"quant", "ml"}


def test_explain_command_says_where_a_tasks_estimate_came_from():
    with cluster(JobsPlugin(policy="lpt")) as cl, Client(cl) as c:
        with dask.annotate(estimate=2.5):
            fut = c.compute(dask.delayed(nap)(1, 0.0, dask_key_name=("job", 3)))
        fut.result()
        code, out, _ = invoke("explain", cl.scheduler.address, "('job', 3)")
        assert code == 0, out
        assert re.search(r"^estimate_source\s+annotation$", out, flags=re.M), out
        assert re.search(r"^state\s+memory$", out, flags=re.M), out
        code, out, _ = invoke("explain", cl.scheduler.address, "('job', 3)", "--json")
        data = json.loads(out)
        assert code == 0 and data["estimate"] == 2.5 and data["key"] == ["job", 3]
        code, out, _ = invoke("explain", cl.scheduler.address, "nothing-like-it")
        assert code == 0 and "the scheduler does not know this key" in out
    with cluster() as cl:
        code, _, err = invoke("explain", cl.scheduler.address, "x")
    assert code == 1 and "not loaded" in err


GATE = threading.Event()


def gated(i):
    GATE.wait(60)
    return i


def test_forecast_command_gives_the_remaining_time_overall_and_per_team():
    """Six tasks of 2 s (annotated) on two threads, two of them held running: the forecast
    sees them all unfinished, and its band is ordered; after, nothing is left."""
    GATE.clear()
    plugin = JobsPlugin(policy="fair-share", teams={"targets": {"quant": 1}})
    with cluster(plugin) as cl, Client(cl) as c:
        with dask.annotate(team="quant", estimate=2.0):
            futs = c.compute([dask.delayed(gated)(i, dask_key_name=f"g-{i}") for i in range(6)])
        deadline = time.time() + 30
        while len(c.processing()[next(iter(c.processing()))]) < 2 and time.time() < deadline:
            time.sleep(0.01)
        code, out, err = invoke("forecast", cl.scheduler.address, "--draws", "5")
        assert code == 0, err
        assert "6 unfinished task(s)" in out and "policy fair-share" in out, out
        assert re.search(r"^remaining\s+\d+\.\d s \(p10 \d", out, flags=re.M), out
        assert re.search(r"^team quant\s+\d", out, flags=re.M), out
        # a queued task waits behind others of 2 s on two threads: its expected start
        # (fair share holds what it has not released in dask's queue: at least 3 of the 6)
        queued = c.run_on_scheduler(lambda dask_scheduler: [ts.key for ts in dask_scheduler.queued])
        waiting = queued[-1]
        info = explain(c, waiting, forecast=True)
        assert info["state"] == "queued", info
        start = info["expected_start"]
        assert 0 < start["p10"] <= start["p50"] <= start["p90"], start
        assert "expected_start" not in explain(c, waiting)  # only when asked
        code, out, _ = invoke("explain", cl.scheduler.address, waiting, "--forecast", "--json")
        assert code == 0 and json.loads(out)["expected_start"]["p50"] > 0
        code, out, _ = invoke("forecast", cl.scheduler.address, "--json", "--workers", "2")
        data = json.loads(out)
        assert code == 0 and data["tasks"] == 6 and data["workers"] == 3
        r = data["remaining"]
        assert 0 < r["p10"] <= r["p50"] <= r["p90"]
        assert data["band"] == "drawn"  # 6 tasks x 30 draws: a simulation a draw
        code, out, _ = invoke("forecast", cl.scheduler.address, "--band", "computed")
        assert code == 0 and "(1 draw(s), the range computed from it, " in out, out
        GATE.set()
        c.gather(futs)
        del futs
        deadline = time.time() + 30
        while c.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) and (
            time.time() < deadline
        ):
            time.sleep(0.01)
        code, out, _ = invoke("forecast", cl.scheduler.address, "--json")
        assert code == 0 and json.loads(out)["tasks"] == 0
    with cluster() as cl:
        code, _, err = invoke("forecast", cl.scheduler.address)
    assert code == 1 and "not loaded" in err


def test_status_command_gives_each_teams_expected_end():
    """Held tasks of two teams (quant's longer) under fair share, a third team idle: status
    forecasts each team's end from now, ordered, never after all the work's; the idle team is
    done; --no-forecast leaves it out; once the work is done, so is every team."""
    GATE.clear()
    plugin = JobsPlugin(policy="fair-share", teams={"targets": {"quant": 1, "ml": 1, "idle": 1}})
    with cluster(plugin) as cl, Client(cl) as c:
        address = cl.scheduler.address
        code, out, _ = invoke("status", address)  # nothing submitted yet
        assert code == 0 and re.search(r"^  all work\s+done$", out, flags=re.M), out
        futs = []
        for team, estimate in (("quant", 3.0), ("ml", 1.0)):
            with dask.annotate(team=team, estimate=estimate):
                futs += c.map(gated, range(4), key=[f"{team}-{i}" for i in range(4)])
        until_tasks(c, 8)
        try:
            code, out, _ = invoke("status", address, "--json")
            assert code == 0, out
            fc = json.loads(out)["forecast"]
            assert fc["state"] == "ok" and fc["tasks"] == 8 and fc["draws"] >= 3, fc
            every = fc["remaining"]
            assert 0 < every["p10"] <= every["p50"] <= every["p90"], every
            for team in ("quant", "ml"):
                q = fc["teams"][team]
                assert 0 < q["p10"] <= q["p50"] <= q["p90"], (team, q)
                assert all(q[p] <= every[p] for p in q), (team, q, every)  # it ends within
            assert fc["teams"]["idle"] == {"p10": 0.0, "p50": 0.0, "p90": 0.0}
            code, out, _ = invoke("status", address)
            assert code == 0, out
            span = r"in [\d.]+ s \([\d.]+ s to [\d.]+ s\)"
            assert re.search(r"^  all work\s+" + span + "$", out, flags=re.M), out
            assert re.search(r"^  team quant\s+" + span + "$", out, flags=re.M), out
            assert re.search(r"^  team idle\s+done$", out, flags=re.M), out
            assert "8 unfinished task(s), 2 running" in out, out
            assert out.index("expected end, from now") > out.index("quant ")  # after teams
            code, out, _ = invoke("status", address, "--no-forecast")
            assert code == 0 and "expected end" not in out and "policy    fair-share" in out
            code, out, _ = invoke("status", address, "--no-forecast", "--json")
            assert code == 0 and "forecast" not in json.loads(out)
        finally:
            GATE.set()
        c.gather(futs)
        del futs
        until_empty(c)
        code, out, _ = invoke("status", address, "--json")
        fc = json.loads(out)["forecast"]
        assert code == 0 and fc["state"] == "done" and fc["remaining"]["p90"] == 0.0
        assert set(fc["teams"]) == {"quant", "ml", "idle"}  # every one done


def until_tasks(c: Client, n: int) -> None:
    """Until the scheduler holds ``n`` tasks (a graph reaches it after ``map`` returns)."""
    deadline = time.time() + 30
    while c.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) != n:
        assert time.time() < deadline
        time.sleep(0.01)


def until_empty(c: Client) -> None:
    until_tasks(c, 0)


def test_status_command_over_max_tasks_says_it_did_not_forecast():
    GATE.clear()
    with cluster(JobsPlugin(policy="lpt")) as cl, Client(cl) as c:
        futs = c.map(gated, range(5))
        until_tasks(c, 5)
        try:
            with dask.config.set({"daskjobs.forecast.max-tasks": 3}):
                code, out, _ = invoke("status", cl.scheduler.address)
        finally:
            GATE.set()
        c.gather(futs)
    assert code == 0, out
    assert "expected end: - (more than 3 unfinished tasks (daskjobs.forecast.max-tasks)" in out


def test_status_command_without_the_plugin_says_how_to_load_it():
    with cluster() as cl:
        code, _, err = invoke("status", cl.scheduler.address)
        assert code == 1 and "not loaded" in err and "register_plugin" in err
        code, _, err = invoke("status", cl.scheduler.address, "--no-forecast")
    assert code == 1 and "not loaded" in err and "register_plugin" in err


def test_status_command_names_an_unreachable_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    code, _, err = invoke("status", f"tcp://127.0.0.1:{port}", "--timeout", "1s")
    assert code == 1 and "cannot reach a dask scheduler" in err and str(port) in err
    code, _, err = invoke("status", "tcp://127.0.0.1:1", "--timeout", "soon")
    assert code == 2 and "--timeout" in err


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


def status(*args: str) -> tuple[int, str, float]:
    """Exit code, stderr and seconds taken by ``daskjobs status ARGS``; an uncaught exception
    (a traceback) fails the test."""
    start = time.perf_counter()
    result = CliRunner().invoke(main, ["status", *args], catch_exceptions=False)
    return result.exit_code, result.stderr, time.perf_counter() - start


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("Error: "), err
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("notanaddress", "no port; give HOST:PORT, e.g. tcp://notanaddress:8786"),
        ("foo://h:1", "unknown scheme 'foo://'"),
        ("tcp://h:8786/status", "it has a path"),
        ("", "no address given"),
    ],
)
def test_status_of_something_not_an_address_is_one_line_at_once(address: str, says: str) -> None:
    code, err, seconds = status(address)
    assert code == 2 and says in one_line(err)
    assert seconds < 5  # was a traceback, then a 20 s hang closing the half-made client


def test_status_of_a_web_url_where_nothing_listens_says_it_is_the_dashboard_url() -> None:
    port = free_port()
    for url in (f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/status", "https://h/"):
        code, err, seconds = status(url, "--timeout", "3s")
        line = one_line(err)
        assert code == 2 and "looks like the dashboard URL" in line, line
        assert "give the scheduler's tcp:// address" in line and "8786" in line
        assert seconds < 5


def test_status_of_a_refused_port_is_one_line_without_waiting_for_the_timeout() -> None:
    port = free_port()
    code, err, seconds = status(f"tcp://127.0.0.1:{port}", "--timeout", "30s")
    line = one_line(err)
    assert code == 1 and "cannot reach a dask scheduler" in line and "refused" in line, line
    assert seconds < 10  # dask's connect retries a refused connection for the whole timeout


@pytest.mark.slow
def test_status_of_the_dashboard_names_the_scheduler_behind_it(dashboard_cluster: Any) -> None:
    scheduler = dashboard_cluster.scheduler.address
    port = dashboard_cluster.scheduler.http_server.port
    for given in (
        f"http://127.0.0.1:{port}/status",
        f"tcp://127.0.0.1:{port}",
        f"127.0.0.1:{port}",
    ):
        code, err, seconds = status(given, "--timeout", "20s")
        line = one_line(err)
        assert code == 2 and f"{given!r} looks like the dashboard URL" in line, line
        assert f"this dashboard's scheduler is {scheduler}" in line
        assert seconds < 10  # dask's connect waits for a handshake the dashboard never sends


def test_status_of_the_scheduler_written_as_a_url_reaches_it(dashboard_cluster: Any) -> None:
    host_port = dashboard_cluster.scheduler.address.removeprefix("tcp://")
    for given in (f"http://{host_port}", f"{host_port}/", f" tcp://{host_port} "):
        code, err, _ = status(given)
        line = one_line(err)  # plain dask: it is reached, and has no plugin
        assert code == 1 and f"scheduler tcp://{host_port}: " in line and "not loaded" in line


@pytest.mark.slow
def test_a_silent_server_is_not_waited_for_beyond_the_timeout() -> None:
    """A TCP server that accepts and never speaks (neither dask nor HTTP)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        held: list[socket.socket] = []

        def accept() -> None:
            try:
                while True:
                    held.append(server.accept()[0])
            except OSError:
                return

        threading.Thread(target=accept, daemon=True).start()
        code, err, seconds = status(f"tcp://127.0.0.1:{port}", "--timeout", "3s")
        for conn in held:
            conn.close()
    line = one_line(err)
    assert code == 1 and "sent no dask handshake within 3 s" in line, line
    assert seconds < 8


class WiredPlugin(JobsPlugin):
    """The plugin with the two lines its start and close are to call."""

    async def start(self, scheduler):
        await super().start(scheduler)
        install_metrics(self, scheduler)

    async def close(self):
        await super().close()
        uninstall_metrics(self.scheduler, self)


def test_installed_at_start_and_removed_at_close():
    with cluster(WiredPlugin(policy="lpt")) as cl, Client(cl) as c:
        c.compute(dask.delayed(nap)(1, 0.0), sync=True)
        assert value(scrape(cl), "dask_daskjobs_ranked_graphs_total") == 1
        sched = cl.scheduler
    assert not installed(sched)
