"""The workers' start reports: each start arrives once, before its task's end.

Speculation, preemption, the resource placer and recording read a task's true start
from the :class:`~daskjobs.plugin.workers.worker.StartReporter`'s ``daskjobs-started``
event and rely on it reaching the scheduler before the task's end. Checked on the
scheduler, in the order it handles them, with tasks far shorter than a scheduler
tick; the real-process runs are in tests/real/test_real_speculation.py and
tests/plugin/test_preemption_live.py.
"""

from __future__ import annotations

import time
from typing import Any

import dask
from conftest import VALIDATE, plugin_cluster
from distributed import Client
from distributed.diagnostics.plugin import SchedulerPlugin

from daskjobs.plugin.workers.worker import STARTED_TOPIC, StartReporter


class ArrivalWatch(SchedulerPlugin):
    """What the scheduler handles, in order: each start report as dask publishes it,
    and each task leaving ``processing``."""

    name = "arrival-watch"

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []  # ("start", report) or ("end", key)

    def log_event(self, topic: str, msg: Any) -> None:
        if topic == STARTED_TOPIC and isinstance(msg, dict):
            self.events.append(("start", msg))

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kw: Any) -> None:
        if start == "processing":
            self.events.append(("end", key))


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_each_start_arrives_once_and_before_its_end() -> None:
    watch = ArrivalWatch()  # in the scheduler itself (a registered plugin is a copy)
    durations = [0.001] * 40 + [0.05] * 16
    with (
        dask.config.set(VALIDATE),
        plugin_cluster(watch, threads_per_worker=4) as cl,
        Client(cl) as c,
    ):
        c.register_plugin(StartReporter(), name="test-start-reporter")
        c.gather([c.submit(nap, d, key=f"nap-{i}") for i, d in enumerate(durations)])
    starts = [r for kind, r in watch.events if kind == "start"]
    assert sorted(r["key"] for r in starts) == sorted(f"nap-{i}" for i in range(56))
    assert all(isinstance(r["time"], float) and r["run_id"] is not None for r in starts)
    seen: set[str] = set()
    for kind, x in watch.events:
        if kind == "start":
            seen.add(x["key"])
        else:
            assert x in seen, f"{x} left processing before its start report arrived"
