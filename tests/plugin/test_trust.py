"""The trust model (docs/how-to/load-the-plugin.md#trust): the operator's configuration wins,
recordings stay in their directory, and the plugin's own records come only from the plugin and its
workers.

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
from daskjobs.plugin.workers.worker import RETURNED_TOPIC, STARTED_TOPIC
from daskjobs.trace import read_trace


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


# -- recordings a client asks for stay in daskjobs.record-dir --------------------------------


def _plugin_with_dir(tmp_path, **kw):
    return JobsPlugin(policy="lpt", record_dir=str(tmp_path / "traces"), **kw)


def test_a_clients_recording_stays_in_the_record_dir(tmp_path):
    (tmp_path / "traces").mkdir()
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    (tmp_path / "traces" / "link.jsonl").symlink_to(outside)
    (tmp_path / "traces" / "old.jsonl").write_text("an earlier trace")
    with plugin_cluster(_plugin_with_dir(tmp_path)) as cl, Client(cl) as c:
        for path, problem in [
            (str(outside), "inside"),  # absolute, elsewhere
            ("../precious.txt", "inside"),  # climbing out
            ("link.jsonl", "symbolic link"),  # a symlink planted in the directory
            ("old.jsonl", "exists"),  # never overwrite
        ]:
            with (
                pytest.raises((PermissionError, OSError), match=problem),
                daskjobs.record(c, path),
            ):
                pass
        with daskjobs.record(c, "run.jsonl") as written:
            c.compute([dask.delayed(nap)(i) for i in range(3)], sync=True)
    assert outside.read_text() == "keep me"
    assert (tmp_path / "traces" / "old.jsonl").read_text() == "an earlier trace"
    assert written == str(tmp_path / "traces" / "run.jsonl")
    mode = (tmp_path / "traces" / "run.jsonl").stat().st_mode & 0o777
    assert mode & 0o007 == 0 and mode & 0o600 == 0o600  # 0640 under the usual umasks
    assert len(read_trace(written).tasks) == 3


def test_the_operators_recording_cannot_be_stopped_by_a_client(tmp_path):
    plugin = JobsPlugin(policy="lpt", record=str(tmp_path / "operator.jsonl"))
    with plugin_cluster(plugin) as cl, Client(cl) as c:
        with pytest.raises(PermissionError, match="operator's"):
            c.sync(c.scheduler.daskjobs_record, action="stop")
        assert cl.scheduler.plugins["daskjobs"].view.recorder is not None


def test_clients_may_be_refused_recording(tmp_path):
    plugin = JobsPlugin(policy="lpt", clients={"record": False})
    with (
        plugin_cluster(plugin) as cl,
        Client(cl) as c,
        pytest.raises(PermissionError, match=r"daskjobs\.clients\.record is false"),
        daskjobs.record(c, "run.jsonl"),
    ):
        pass


# -- the operator's plugin is not silently replaced ----------------------------------------


def test_a_client_cannot_silently_replace_the_operators_plugin():
    operator = JobsPlugin(policy="fair-share", teams={"targets": {"a": 3, "b": 1}})
    with plugin_cluster(operator) as cl, Client(cl) as c:
        with pytest.raises(PermissionError, match="replace-plugin"):
            c.register_plugin(JobsPlugin(policy="fifo", teams={"targets": {"mine": 1}}))
        st = status(c)
        assert st["policy"] == "fair-share"
        assert {r["team"] for r in st["teams"]} >= {"a", "b"}
        # under another name it would rank every graph just the same: refused too
        with pytest.raises(PermissionError, match="replace-plugin"):
            c.register_plugin(JobsPlugin(policy="lpt"), name="my-own")
        assert "my-own" not in cl.scheduler.plugins
        assert status(c)["policy"] == "fair-share"


@pytest.mark.filterwarnings("ignore:Scheduler already contains a plugin:UserWarning")
def test_the_operator_can_allow_replacement():
    operator = JobsPlugin(policy="fair-share", clients={"replace_plugin": True})
    with plugin_cluster(operator) as cl, Client(cl) as c:
        c.register_plugin(JobsPlugin(policy="lpt"))
        assert status(c)["policy"] == "lpt"


def test_a_clients_keywords_cannot_widen_the_trust_settings(tmp_path):
    with (
        dask.config.set({"daskjobs.record-dir": str(tmp_path)}),
        plugin_cluster(None) as cl,
        Client(cl) as c,
    ):
        c.register_plugin(JobsPlugin(policy="lpt", record_dir="/", clients={"record": True}))
        plugin = cl.scheduler.plugins["daskjobs"]
        assert plugin.from_client and plugin.settings.record_dir == str(tmp_path)
        with (
            pytest.raises(PermissionError, match="inside"),
            daskjobs.record(c, "/etc/daskjobs-test.jsonl"),
        ):
            pass


def test_a_clients_plugin_forecasts_as_often_as_the_operator_allows():
    """The scheduler's forecast spends the scheduler's CPU: a client's plugin takes
    daskjobs.forecast from the scheduler's config, not from its keywords."""
    with (
        dask.config.set({"daskjobs.forecast.interval": None}),
        plugin_cluster(None) as cl,
        Client(cl) as c,
    ):
        c.register_plugin(JobsPlugin(policy="lpt", forecast={"interval": "1s", "draws": 500}))
        plugin = cl.scheduler.plugins["daskjobs"]
        assert plugin.from_client and plugin.settings.forecast.interval is None
        assert plugin.settings.forecast.draws == 10  # the scheduler's default
