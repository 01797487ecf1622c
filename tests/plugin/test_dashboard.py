"""The daskjobs page on the scheduler's dashboard: served, listed, live, removed, and safe.

The teams' running figures, in ``status`` and in the page's series, never exceed the
threads there are while copies run, and worker-speed events do not crowd the page's
audit table.

A fair-share run of two teams with a speculation race (worker 0 is ten times slower)
feeds the page; it is fetched as HTML, as its Bokeh document and as JSON, and once
in a real headless browser (Debian's chromium, driven over the DevTools protocol:
Bokeh draws inside shadow roots, which ``chromium --dump-dom`` leaves out, so the
test reads the rendered text through them). The browser test runs in CI (.ci/run
installs chromium); on a machine without chromium it is skipped outside CI only.
``DASKJOBS_DASHBOARD_PNG=docs/img/dashboard.png`` keeps its screenshot.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import dask
import pytest
from conftest import plugin_cluster
from distributed import Client, LocalCluster

from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.client import status
from daskjobs.plugin.observe import dashboard as dashboard_module
from daskjobs.plugin.observe.dashboard import NAME, Dashboard, QueueClock, installed

pytest.importorskip("bokeh")  # the [dashboard] extra; installed by the test extra

FAST = {"late_factor": 2.0, "min_runtime": "100ms", "interval": "50ms", "enabled": True}
TEAMS = {"targets": {"a": 2, "b": 1}}


def work(i, seconds):
    """Ten times slower on the worker named 0."""
    from distributed import get_worker

    time.sleep(seconds * (10 if get_worker().name == 0 else 1))
    return i


def jobs_plugin(**speculation: Any) -> JobsPlugin:
    return JobsPlugin(policy="fair-share", teams=TEAMS, speculation={**FAST, **speculation})


def submit(c: Client, n: int, seconds: float = 0.2, gap: float = 0.0) -> list[Any]:
    """``n`` tasks of each team, a first (b ``gap`` seconds later), estimated right (late
    only on worker 0)."""
    futures = []
    for team in ("a", "b"):
        if team == "b" and gap:
            time.sleep(gap)
        with dask.annotate(team=team, estimate=seconds):
            tasks = [dask.delayed(work)(i, seconds, dask_key_name=f"{team}-{i}") for i in range(n)]
        futures += c.compute(tasks)
    return futures


def base_url(cl: Any) -> str:
    return f"http://127.0.0.1:{cl.scheduler.http_server.port}"


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def data(cl: Any) -> dict[str, Any]:
    status, body = get(base_url(cl) + "/daskjobs/data.json")
    assert status == 200, body
    return json.loads(body)


def wait_for(cond: Any, timeout: float = 10.0) -> Any:
    deadline = time.time() + timeout
    while True:
        value = cond()
        if value:
            return value
        assert time.time() < deadline, "timed out"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def ran() -> Any:
    """A cluster that ran the two teams' work to the end (shared by read-only tests).

    Sampled every 200 ms, not every second: the run lasts about two seconds, and on a
    loaded machine a one-second sampler can miss the moments a team's tasks waited.
    A copy goes ahead of queued work ('always'): with the default ('past-horizon') the
    late task on worker 0 is copied only once a slot frees at the end, and on a loaded
    machine that moment can come too late for a copy to pay (no race to show)."""
    every = dashboard_module.INTERVAL_MS
    dashboard_module.INTERVAL_MS = 200
    try:
        with plugin_cluster(jobs_plugin(ahead="always"), n_workers=3) as cl, Client(cl) as c:
            assert sorted(c.gather(submit(c, 10))) == sorted(list(range(10)) * 2)
            done = time.time()
            wait_for(lambda: data(cl)["history"]["time"][-1] > done)  # a sample after the end
            yield cl
    finally:
        dashboard_module.INTERVAL_MS = every


@pytest.mark.slow
def test_the_page_is_served_and_in_the_navigation_and_sitemap(ran):
    base = base_url(ran)
    status, html = get(base + "/daskjobs")
    assert status == 200
    assert "<h2>daskjobs</h2>" in html and 'href="daskjobs/data.json"' in html
    assert 'href="daskjobs">Daskjobs</a>' in html  # in the navigation bar, as every page
    status, html = get(base + "/status")
    assert status == 200 and 'href="daskjobs">Daskjobs</a>' in html
    status, body = get(base + "/sitemap.json")
    assert status == 200, body  # distributed's own answers 500 with Bokeh >= 3.3
    paths = json.loads(body)["paths"]
    assert "/daskjobs" in paths and "/daskjobs/data.json" in paths
    assert "/status" in paths and "/metrics" in paths  # distributed's, still listed


def test_the_json_holds_teams_backups_speeds_and_events(ran):
    d = data(ran)
    assert d["page"] == "daskjobs" and d["policy"] == "fair-share" and d["errors"] == {}
    teams = {r["team"]: r for r in d["teams"]}
    assert set(teams) == {"a", "b"}
    assert teams["a"]["target"] == pytest.approx(2 / 3) and teams["b"]["target"] == pytest.approx(
        1 / 3
    )
    assert all(r["running"] == 0 and r["queued"] == 0 for r in teams.values())  # all done
    b = d["backups"]
    assert b["launched"] >= 1 and b["won"] + b["lost"] >= 1 and b["waste_total"] > 0
    assert b["waste_total"] == pytest.approx(sum(b["waste_seconds"].values()))
    speeds = {w["name"]: w["speed"] for w in d["workers"]}
    assert set(speeds) == {"0", "1", "2"}
    assert speeds["0"] > 1.5 > max(speeds["1"], speeds["2"])  # worker 0 is the slow one
    actions = [e["action"] for e in d["events"]]
    assert "backup-launched" in actions and "ranked-graph" in actions
    assert d["events"][0]["time"] >= d["events"][-1]["time"]  # newest first
    # over time: both teams ran, and waited in dask's queue (three slots, twenty tasks)
    h = d["history"]
    assert len(h["time"]) >= 2 and h["time"] == sorted(h["time"])
    for team in ("a", "b"):
        assert max(v or 0 for v in h["teams"][team]["running"]) >= 1
        assert max(v or 0 for v in h["teams"][team]["queue_delay"]) > 0
    assert h["launched"][-1] == b["launched"]


@pytest.mark.slow
def test_the_bokeh_document_carries_the_sections_and_data(ran):
    from bokeh.client import pull_session
    from bokeh.models import Div, Plot

    with pull_session(url=base_url(ran) + "/daskjobs") as session:
        doc = session.document
        titles = {p.title.text for p in doc.select({"type": Plot})}
        text = " ".join(div.text for div in doc.select({"type": Div}))
    assert titles == {
        "Share of the threads held: now vs target",
        "Threads held per team (copies included)",
        "Queue delay per team (s): longest wait in dask's queue",
        "Backup copies (cumulative)",
        "Worker slow-down (run time / estimate; compare workers)",
    }
    for part in ("<h3>Teams</h3>", "<h3>Backups</h3>", "<h3>Workers</h3>", "backup-launched"):
        assert part in text
    assert "policy <b>fair-share</b>" in text and "launched <b>" in text


def test_a_url_prefix_is_followed():
    plugin = jobs_plugin()
    with LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=False,
        dashboard_address=":0",
        scheduler_kwargs={"plugins": [plugin], "http_prefix": "/dask"},
    ) as cl:
        assert get(base_url(cl) + "/dask/daskjobs")[0] == 200
        assert get(base_url(cl) + "/dask/daskjobs/data.json")[0] == 200
        assert get(base_url(cl) + "/daskjobs")[0] == 404


@pytest.mark.slow
def test_the_page_goes_with_the_plugin():
    with plugin_cluster(jobs_plugin()) as cl, Client(cl) as c:
        sched = cl.scheduler
        base = base_url(cl)
        assert installed(sched) is not None and NAME in sched.periodic_callbacks
        plugin = sched.plugins["daskjobs"]
        # the queue clock is fed by the plugin's own hook: no scheduler plugin of its own
        assert installed(sched).clock in plugin.transitions.parts and NAME not in sched.plugins
        # unregistered: dask does not call close(); the sampler notices within a tick
        c.unregister_scheduler_plugin("daskjobs")
        wait_for(lambda: installed(sched) is None, timeout=5)
        assert not any(isinstance(p, QueueClock) for p in plugin.transitions.parts)
        assert get(base + "/daskjobs")[0] == 404
        assert get(base + "/daskjobs/data.json")[0] == 404
        assert 'href="daskjobs"' not in get(base + "/status")[1]
        assert NAME not in sched.plugins and NAME not in sched.periodic_callbacks
        assert c.submit(lambda: 1).result() == 1
        # registered again: back, once
        c.register_plugin(jobs_plugin())
        wait_for(lambda: get(base + "/daskjobs")[0] == 200)
        assert get(base + "/status")[1].count('href="daskjobs"') == 1
    assert installed(sched) is None  # closed with the scheduler


def test_closing_the_plugin_removes_the_page():
    with plugin_cluster(jobs_plugin()) as cl:
        sched = cl.scheduler
        plugin = sched.plugins["daskjobs"]
        cl.sync(plugin.close)
        assert installed(sched) is None
        assert get(base_url(cl) + "/daskjobs")[0] == 404
        assert NAME not in sched.plugins and NAME not in sched.periodic_callbacks


def test_without_bokeh_the_plugin_runs_without_the_page(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "bokeh", None)  # import bokeh raises ImportError
    monkeypatch.setattr(dashboard_module, "_missing_logged", False)
    with caplog.at_level(logging.DEBUG, logger="daskjobs.plugin"):
        for _ in range(2):
            with plugin_cluster(jobs_plugin()) as cl, Client(cl) as c:
                assert c.submit(lambda: 2).result() == 2
                assert installed(cl.scheduler) is None
                assert get(base_url(cl) + "/daskjobs")[0] == 404
    said = [r for r in caplog.records if "no dashboard page" in r.getMessage()]
    # once per process, and at DEBUG: a laptop without the extra did not ask for the page
    assert len(said) == 1 and said[0].levelno == logging.DEBUG
    assert "daskjobs[dashboard]" in said[0].getMessage()


def test_without_a_dashboard_there_is_no_page(monkeypatch):
    monkeypatch.setattr(dashboard_module, "_missing_logged", False)
    kwargs = {"plugins": [jobs_plugin()], "dashboard": False, "dashboard_address": ":0"}
    with (
        LocalCluster(n_workers=1, processes=False, scheduler_kwargs=kwargs) as cl,
        Client(cl) as c,
    ):
        assert installed(cl.scheduler) is None
        assert c.submit(lambda: 3).result() == 3


def test_a_failing_summary_never_breaks_the_scheduler(monkeypatch):
    with plugin_cluster(jobs_plugin()) as cl, Client(cl) as c:
        plugin = cl.scheduler.plugins["daskjobs"]

        def boom(self):
            raise RuntimeError("boom")

        monkeypatch.setattr(type(plugin.view), "teams", boom)  # the view the page reads
        status, body = get(base_url(cl) + "/daskjobs/data.json")
        assert status == 500 and "failed" in json.loads(body)["error"]
        assert get(base_url(cl) + "/daskjobs")[0] == 200  # the page says it failed
        wait_for(lambda: plugin.errors.get("dashboard", 0) >= 1)  # the sampler's ticks
        assert sum(c.gather(c.map(lambda i: i, range(5)))) == 10
        monkeypatch.undo()
        assert data(cl)["teams"] is not None  # and recovers


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

    from daskjobs.plugin.observe.dashboard import installed

    if installed(cl.scheduler) is None:
        return []
    url = f"http://127.0.0.1:{cl.scheduler.http_server.port}/daskjobs/data.json"
    with urllib.request.urlopen(url, timeout=10) as r:
        h = json.load(r)["history"]
    teams = h["teams"].values()
    return [sum(t["running"][i] or 0 for t in teams) for i in range(len(h["time"]))]


def test_the_dashboards_audit_table_is_not_flooded_by_worker_speed_events():
    events: deque[dict[str, Any]] = deque()
    events.append({"time": 1.0, "action": "ranked-graph", "tasks": 3})
    for i in range(200):
        events.append({"time": 2.0 + i, "action": "worker-speed", "worker": "w", "speed": 1.0})
    events.append({"time": 300.0, "action": "backup-launched", "key": "k"})
    dash = Dashboard(SimpleNamespace(events=events), None, None)  # type: ignore[arg-type]
    shown = dash.events(25)
    assert [e["action"] for e in shown] == ["backup-launched", "ranked-graph"]


# -- once in a real browser ---------------------------------------------------------------

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

#: The text a person sees: text nodes, through every (open) shadow root, without styles.
RENDERED_TEXT = r"""(() => {
  const out = [];
  const walk = (n) => {
    if (n.shadowRoot) walk(n.shadowRoot);
    for (const c of n.childNodes) {
      if (c.nodeName === 'STYLE' || c.nodeName === 'SCRIPT') continue;
      if (c.nodeType === 3) out.push(c.textContent); else walk(c);
    }
  };
  walk(document.body);
  return out.join(' ').replace(/\s+/g, ' ');
})()"""


async def render(url: str, ready: Any, png: Path, tmp: Path, size=(1400, 1300)) -> str:
    """Open ``url`` in headless chromium, wait until ``ready(text)``, save a screenshot.

    Chromium's DevTools protocol over tornado's websocket client: no driver to install.
    """
    from tornado.websocket import websocket_connect

    chromium = shutil.which("chromium")
    assert chromium is not None
    profile = tmp / "chromium-profile"
    proc = subprocess.Popen(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            f"--window-size={size[0]},{size[1]}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.time() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None, "chromium exited"
            assert time.time() < deadline, "chromium did not open its DevTools port"
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.loads(r.read()) if t["type"] == "page")
        ws = await websocket_connect(page["webSocketDebuggerUrl"], max_message_size=1 << 26)
        calls = 0

        async def call(method: str, **params: Any) -> dict[str, Any]:
            nonlocal calls
            calls += 1
            await ws.write_message(json.dumps({"id": calls, "method": method, "params": params}))
            while True:
                msg = json.loads(await ws.read_message())
                if msg.get("id") == calls:
                    assert "error" not in msg, msg
                    return msg["result"]

        await call(
            "Emulation.setDeviceMetricsOverride",
            width=size[0],
            height=size[1],
            deviceScaleFactor=1,
            mobile=False,
        )
        await call("Page.navigate", url=url)
        text = ""
        while time.time() < deadline:
            res = await call("Runtime.evaluate", expression=RENDERED_TEXT, returnByValue=True)
            text = res["result"].get("value") or ""
            if ready(text):
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.3)  # let the last update paint
        shot = await call("Page.captureScreenshot", format="png")
        png.write_bytes(base64.b64decode(shot["data"]))
        ws.close()
        return text
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def rendered_teams(text: str) -> dict[str, list[float]]:
    """The teams table as the browser drew it: team -> threads held, of which copies,
    assigned, booked, queued, share, target, queue delay, copy waste, failed (the expected
    end, between queued and share, is left out: a dash before the scheduler's first
    forecast; the quota column is blank here, and the identities column a dash: no
    certificates)."""
    num = r"(\d+(?:\.\d+)?)"
    cells = " ".join([num] * 5)
    end = r"(?:in [^()]+\([^()]+\)|done|–)"
    rows = re.findall(rf"\b([ab]) {cells} {end} {cells} –(?= [ab] | Threads held:)", text)
    return {r[0]: [float(x) for x in r[1:]] for r in rows}


def rendered_backups(text: str) -> int:
    m = re.search(r"Backups launched (\d+) · won \d+", text)
    return int(m.group(1)) if m else -1


@pytest.mark.slow
def test_a_headless_browser_renders_live_data_during_a_run(tmp_path):
    if shutil.which("chromium") is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs it (apt-get install -y chromium)")
        pytest.skip("no chromium here (apt-get install -y chromium); CI runs this test")
    png = tmp_path / "dashboard.png"
    keep = os.environ.get("DASKJOBS_DASHBOARD_PNG")  # the picture for docs: more history
    samples, n, gap = (12, 120, 2.0) if keep else (0, 60, 0.0)

    def live(text: str) -> bool:  # both teams still queue work, and a backup launched
        teams = rendered_teams(text)
        return (
            set(teams) == {"a", "b"}
            and sum(t[4] for t in teams.values()) > 0
            and rendered_backups(text) >= 1
            and "backup-launched" in text
        )

    def ready(text: str) -> bool:
        return live(text) and len(data(cl)["history"]["time"]) >= samples

    # a copy goes ahead of queued work at once ('always'): backups while both teams queue
    with (
        plugin_cluster(jobs_plugin(ahead="always"), n_workers=3, protocol="tcp") as cl,
        Client(cl) as c,
    ):
        futures = submit(c, n, 0.25, gap)  # 15 s of work or more: cancelled once seen
        # the page is opened at once and updates itself each second until ready
        text = asyncio.run(render(base_url(cl) + "/daskjobs", ready, png, tmp_path))
        left = sum(f.status == "pending" for f in futures)
        c.cancel(futures)
    # what the browser drew (Bokeh renders it there, from the live document): the teams
    # table with both teams and work still queued, the backups, workers and audit trail
    assert live(text), text
    assert left > 0
    teams = rendered_teams(text)
    assert teams["a"][6] == pytest.approx(0.67) and teams["b"][6] == pytest.approx(0.33)
    assert all(t[0] <= 3 for t in teams.values())  # threads held: never more than exist
    assert "Worker Slow-down (measured) Samples" in text and "policy fair-share" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    if keep:
        shutil.copyfile(png, keep)
