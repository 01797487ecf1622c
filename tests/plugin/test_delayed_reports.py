"""Start reports sent late and together, when speculation alone needs them.

A start report per task is one more message on every worker's stream and on the
scheduler's (about a tenth of the scheduler's rate of starts on a sweep of short tasks,
docs/how-to/load-the-plugin.md). Speculation judges nothing late before ``min-runtime``, so the
plugin lets the workers report a start up to half of it late (and within one check), together
with the others, and not at all for a task that ended by then. These tests pin what
that must keep: every task still running is reported, once, with its true start; a
backup copy at once; recording (and preemption, resources) at once, as before.
"""

from __future__ import annotations

import time
from typing import Any

import dask
import pytest
from conftest import VALIDATE, plugin_cluster
from distributed import Client

from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.client.record import record
from daskjobs.plugin.enact.speculation import copy_key
from daskjobs.plugin.workers.worker import REPORTER_NAME, STARTED_TOPIC, StartReporter

# -- the reporter on its own, with a worker stand-in: what it sends, and when -----------------


class _Loop:
    def __init__(self) -> None:
        self.timers: list[tuple[float, Any]] = []

    def call_later(self, delay: float, callback: Any) -> None:
        self.timers.append((delay, callback))


class _Task:
    def __init__(self, run_id: int) -> None:
        self.run_id = run_id


class _State:
    def __init__(self) -> None:
        self.tasks: dict[Any, _Task] = {}


class _Worker:
    def __init__(self) -> None:
        self.loop = _Loop()
        self.state = _State()
        self.stream_handlers: dict[str, Any] = {}
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def log_event(self, topic: str, msg: dict[str, Any]) -> None:
        self.sent.append((topic, msg))


def _reporter(delay: float) -> tuple[StartReporter, _Worker]:
    worker = _Worker()
    rep = StartReporter(delay)
    rep.setup(worker)
    return rep, worker


def _start(rep: StartReporter, worker: _Worker, key: Any, run_id: int) -> None:
    worker.state.tasks[key] = _Task(run_id)
    rep.transition(key, "ready", "executing")


def test_a_delayed_report_carries_the_tasks_still_running_with_their_age() -> None:
    rep, worker = _reporter(0.2)
    _start(rep, worker, "short", 1)
    _start(rep, worker, "long", 2)
    _start(rep, worker, ("sweep", 3), 3)
    _start(rep, worker, "seceded", 5)
    assert worker.sent == []  # nothing at once
    assert [d for d, _ in worker.loop.timers] == [0.2]  # one timer for all
    rep.transition("short", "executing", "memory")  # ended before the report: never sent
    rep.transition("seceded", "executing", "long-running")  # still running: reported
    time.sleep(0.01)
    worker.loop.timers[0][1]()  # the timer fires
    assert len(worker.sent) == 1
    topic, msg = worker.sent[0]
    assert topic == STARTED_TOPIC
    rows = {tuple(r[0]) if isinstance(r[0], tuple) else r[0]: r for r in msg["starts"]}
    assert set(rows) == {"long", ("sweep", 3), "seceded"}
    now = time.time()
    for key, run_id, began, age in msg["starts"]:
        assert run_id == worker.state.tasks[key].run_id
        assert 0.01 <= age < 5 and began <= now - age + 1e-6
    # the next start arms a new timer; the reported ones are not sent again
    _start(rep, worker, "later", 4)
    assert len(worker.loop.timers) == 2
    worker.loop.timers[1][1]()
    assert [r[0] for r in worker.sent[1][1]["starts"]] == ["later"]
    assert rep.reports == 2 and rep.failures == 0


def test_a_copy_and_an_undelayed_reporter_report_at_once() -> None:
    rep, worker = _reporter(0.2)
    ck = copy_key("task-1")
    _start(rep, worker, ck, 7)
    assert worker.loop.timers == []
    assert [(t, m["key"], m["run_id"]) for t, m in worker.sent] == [(STARTED_TOPIC, ck, 7)]
    rep0, worker0 = _reporter(0.0)
    _start(rep0, worker0, "a", 1)
    assert worker0.loop.timers == [] and [m["key"] for _, m in worker0.sent] == ["a"]


def test_a_teardown_drops_what_was_not_reported() -> None:
    rep, worker = _reporter(0.2)
    _start(rep, worker, "a", 1)
    rep.teardown(worker)
    worker.loop.timers[0][1]()  # the timer still fires: nothing is sent, nothing fails
    assert worker.sent == [] and rep.failures == 0


@pytest.mark.parametrize("delay", [-1, float("nan"), float("inf"), True, "1s"])
def test_a_bad_delay_is_refused(delay: Any) -> None:
    with pytest.raises(ValueError, match="delay must be a finite number of seconds"):
        StartReporter(delay)


# -- live: the plugin chooses the delay, and a late report keeps the true start ---------------

SPEC = {"enabled": True, "late_factor": 2.0, "min_runtime": "1s", "interval": "400ms"}
BEGAN: dict[str, float] = {}  # key -> when the task really began (this process's clock)


def hold(key: str, seconds: float) -> str:
    BEGAN[key] = time.time()
    time.sleep(seconds)
    return key


def _delay(c: Client) -> set[float]:
    return set(c.run(lambda dask_worker: dask_worker.plugins[REPORTER_NAME].delay).values())


def _until_started(speculator: Any, key: str) -> None:
    """Wait until the speculation driver has heard ``key``'s start."""
    deadline = time.time() + 30
    while key not in speculator.starts and time.time() < deadline:
        time.sleep(0.01)


def test_speculation_alone_reports_late_and_recording_at_once(tmp_path: Any) -> None:
    plugin = JobsPlugin(policy="lpt", speculation=SPEC)
    with dask.config.set(VALIDATE), plugin_cluster(plugin, n_workers=2) as cl, Client(cl) as c:
        # half of min-runtime (0.5 s), at most one check interval (0.4 s)
        assert _delay(c) == {0.4}
        with record(c, str(tmp_path / "run.jsonl")):
            assert _delay(c) == {0.0}  # a trace wants every start, at once
            c.submit(hold, "recorded", 0.01, key="recorded").result()
        assert _delay(c) == {0.4}  # back once recording stops
        assert cl.scheduler.plugins["daskjobs"].audit.errors == {}


def test_a_late_report_places_the_start_when_the_task_began() -> None:
    BEGAN.clear()
    plugin = JobsPlugin(policy="lpt", speculation=SPEC)
    with dask.config.set(VALIDATE), plugin_cluster(plugin) as cl, Client(cl) as c:
        fut = c.submit(hold, "long", 1.5, key="long")
        sp = cl.scheduler.plugins["daskjobs"].speculator
        _until_started(sp, "long")
        seen_at = time.time()
        worker, began, _ = sp.starts["long"]
        assert worker in cl.scheduler.workers
        assert fut.result() == "long"
    # the report came about the delay (0.4 s) after the start, yet the speculator's start
    # is the task's own (same clock in this process), not the report's arrival
    assert seen_at - BEGAN["long"] >= 0.3
    assert abs(began - BEGAN["long"]) < 0.2
    assert cl.scheduler.plugins["daskjobs"].audit.errors == {}


def test_a_malformed_delayed_report_is_logged_and_changes_nothing() -> None:
    plugin = JobsPlugin(policy="lpt", speculation=SPEC)
    with dask.config.set(VALIDATE), plugin_cluster(plugin) as cl, Client(cl) as c:
        fut = c.submit(hold, "long", 1.5, key="long")
        sp = cl.scheduler.plugins["daskjobs"].speculator
        _until_started(sp, "long")
        sp.starts.clear()  # as if its report had not come yet: the bad report brings it

        def bad(dask_worker: Any) -> None:
            ts = dask_worker.state.tasks["long"]
            good = ["long", ts.run_id, time.time() - 0.5, 0.5]
            dask_worker.log_event(STARTED_TOPIC, {"starts": [["no-such-key"], good]})

        c.run(bad)
        errors = cl.scheduler.plugins["daskjobs"].audit.errors
        deadline = time.time() + 30
        while not errors and time.time() < deadline:
            time.sleep(0.01)
        assert errors == {"worker-report": 1}
        # the good row in the same report still counts; the scheduler carries on
        assert "long" in sp.starts
        assert fut.result() == "long"
        assert c.submit(hold, "after", 0.01, key="after").result() == "after"
