"""The trust model (docs/plugin.md#trust): the operator's configuration wins, recordings stay
in their directory, and the plugin's own records come only from the plugin and its workers.

Every dask client can run code on the scheduler, so none of this is a sandbox: it keeps an
honest mistake or a stray event from changing what the operator set up."""

from __future__ import annotations

import time

import dask
import pytest
from conftest import VALIDATE, plugin_cluster
from distributed import Client

import daskjobs
from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.client import status
from daskjobs.plugin.trace import read_trace
from daskjobs.plugin.worker import RETURNED_TOPIC, STARTED_TOPIC


def nap(i):
    time.sleep(0.01)
    return i


def test_events_a_client_logs_on_the_plugins_topics_change_nothing(tmp_path):
    trace = tmp_path / "run.jsonl"
    plugin = JobsPlugin(policy="lpt", record=str(trace))
    with (
        dask.config.set(VALIDATE),
        plugin_cluster(plugin, threads_per_worker=2) as cl,
        Client(cl) as c,
    ):
        c.compute([dask.delayed(nap)(i) for i in range(4)], sync=True)
        # a client pretends to be the plugin's audit trail and a worker's start report
        c.log_event("daskjobs", {"action": "backup-won", "key": "forged", "winner": "x"})
        c.log_event(STARTED_TOPIC, {"key": "forged", "worker": "tcp://1.2.3.4:1", "run_id": 1})
        c.log_event(RETURNED_TOPIC, {"key": "forged", "worker": "tcp://1.2.3.4:1"})
        st = status(c)
        ours = list(cl.scheduler.plugins["daskjobs"].events)
    assert st["errors"] == {}
    assert not [e for e in ours if e.get("key") == "forged"]
    tr = read_trace(str(trace))
    assert "forged" not in tr.tasks
    assert not [e for e in tr.events if e.get("key") == "forged"]
    # the real start reports still arrive (from the workers' own streams)
    assert all(any(a.started is not None for a in t.attempts) for t in tr.tasks.values())


def test_status_after_unregistering_says_the_plugin_is_gone():
    with plugin_cluster(None) as cl, Client(cl) as c:
        c.register_plugin(JobsPlugin(policy="lpt"))
        assert status(c)["policy"] == "lpt"
        c.unregister_scheduler_plugin("daskjobs")
        with pytest.raises(RuntimeError, match="was removed from this scheduler"):
            status(c)
        with pytest.raises(RuntimeError, match="was removed from this scheduler"):
            daskjobs.explain(c, "x")
