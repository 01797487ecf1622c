"""Observability: Prometheus metrics on the scheduler's /metrics and ``daskjobs status``."""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request

import dask
import pytest
from click.testing import CliRunner
from conftest import plugin_cluster
from distributed import Client

from daskjobs.cli import main
from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.metrics import install_metrics, installed, uninstall_metrics

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


def test_status_command_without_the_plugin_says_how_to_load_it():
    with cluster() as cl:
        code, _, err = invoke("status", cl.scheduler.address)
    assert code == 1 and "not loaded" in err and "register_plugin" in err


def test_status_command_names_an_unreachable_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    code, _, err = invoke("status", f"tcp://127.0.0.1:{port}", "--timeout", "1s")
    assert code == 1 and "cannot reach a dask scheduler" in err and str(port) in err
    code, _, err = invoke("status", "tcp://127.0.0.1:1", "--timeout", "soon")
    assert code == 2 and "--timeout" in err


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
