"""The live plugin's estimates: duration models over each task's parameters, learned from
finished tasks, persisted in the history file, and re-ranking a stage's waiting tasks as
its first tasks finish (daskjobs/plugin/estimates.py, Ranker.reestimate)."""

from __future__ import annotations

import json
import time

import dask
import pytest
from conftest import VALIDATE, plugin_cluster
from distributed import Client

from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.client import explain, status


def nap(i, seconds):
    """Record when the task really started (on the worker), then sleep."""
    t = time.time()
    time.sleep(seconds)
    return (t, i)


def pause():
    """A task without arguments: nothing to read as parameters."""
    return time.time()


def sweep(ns, name="job", unit=0.02, annotate_estimate=False, first=0, start=0):
    """One task per parameter value ``n`` (duration ``unit * n``), keys ``name-i``, with
    ``params={"n": n}`` as a sweep passes them (no ``estimate`` annotation); the ``first``
    tasks with a user priority of 1 (they run first, whatever the estimates)."""
    parts = []
    for i, n in enumerate(ns):
        ann = {"params": {"n": n}}
        if annotate_estimate:
            ann["estimate"] = unit * n
        if i < first:
            ann["priority"] = 1
        with dask.annotate(**ann):
            parts.append(dask.delayed(nap)(i, unit * n, dask_key_name=f"{name}-{start + i}"))
    return parts


def plugin_of(client):
    return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["daskjobs"])


def test_a_finished_stage_teaches_the_model_and_new_tasks_get_its_estimates(tmp_path):
    history = tmp_path / "h.json"
    kw = {"policy": "lpt", "history": {"path": str(history)}}
    with dask.config.set(VALIDATE), plugin_cluster(JobsPlugin(**kw)) as cl, Client(cl) as c:
        c.compute(sweep([1, 2, 4, 8, 1, 2, 4, 8], unit=0.01), sync=True)
        st = status(c)
        assert st["stages"]["job"]["samples"] == 8
        assert st["errors"] == {}
    saved = json.loads(history.read_text())
    assert saved["version"] == 2
    assert sorted(row[0]["n"] for row in saved["stages"]["job"]) == [1, 1, 2, 2, 4, 4, 8, 8]
    # a new scheduler starts with the history: parameters decide the order at once
    with dask.config.set(VALIDATE), plugin_cluster(JobsPlugin(**kw)) as cl, Client(cl) as c:
        futs = c.compute(sweep([1, 8, 1, 8, 2, 4], name="job", unit=0.01))
        order = [i for _, i in sorted(c.gather(futs))]
        assert order[:2] in ([1, 3], [3, 1])  # the two n=8 tasks first
        info = explain(c, "job-1")
        assert info["estimate_source"] == "model"
        long, short = explain(c, "job-1")["estimate"], explain(c, "job-0")["estimate"]
        assert long > 3 * short


def test_a_version_one_history_file_is_read(tmp_path):
    history = tmp_path / "h.json"
    history.write_text(json.dumps({"version": 1, "stages": {"slow": [5.0, 5.0, 5.0]}}))
    # stage "slow" is the key prefix (the task's arguments are not read)
    kw = {"policy": "lpt", "history": {"path": str(history)}, "estimates": {"arguments": False}}
    with dask.config.set(VALIDATE), plugin_cluster(JobsPlugin(**kw)) as cl, Client(cl) as c:
        fut = c.compute(dask.delayed(nap)(0, 0.0, dask_key_name="slow-0"))
        fut.result()
        info = explain(c, "slow-0")
        assert info["estimate_source"] == "history" and info["estimate"] == pytest.approx(5.0)
    assert json.loads(history.read_text())["version"] == 2  # written back as version 2


def test_learning_off_keeps_stage_medians(tmp_path):
    history = tmp_path / "h.json"
    rows = [[{"n": n}, 0.01 * n] for n in (1, 2, 4, 8, 1, 2, 4, 8)]
    history.write_text(json.dumps({"version": 2, "stages": {"job": rows}}))
    kw = {"policy": "lpt", "history": {"path": str(history)}, "estimates": {"learn": False}}
    with dask.config.set(VALIDATE), plugin_cluster(JobsPlugin(**kw)) as cl, Client(cl) as c:
        futs = c.compute(sweep([1, 8, 2, 4], unit=0.0))
        c.gather(futs)
        est = {k: explain(c, f"job-{k}") for k in range(4)}
        assert {e["estimate_source"] for e in est.values()} == {"history"}
        assert len({e["estimate"] for e in est.values()}) == 1  # every task alike
        p = plugin_of(c)
        assert p.ranker.reestimated == 0 and p.ranker.waiting == {}


def test_learning_switch_is_checked():
    with pytest.raises(ValueError, match=r"daskjobs\.estimates\.learn"):
        JobsPlugin(estimates={"learn": "maybe"})
    with dask.config.set({"daskjobs.estimates.learn": "off"}):
        assert JobsPlugin().settings.learn_estimates is False


def test_a_bad_estimate_annotation_is_still_refused():
    from daskjobs.plugin.estimates import BadEstimate

    with dask.config.set(VALIDATE), plugin_cluster(JobsPlugin(policy="lpt")) as cl, Client(cl) as c:
        with dask.annotate(estimate="soon", params={"n": 1}):
            bad = dask.delayed(nap)(0, 0.0, dask_key_name="job-0")
        with pytest.raises(BadEstimate, match="job-0"):
            c.compute(bad, sync=True)


@pytest.mark.parametrize("policy", ["lpt", "critical-path"])
def test_after_the_first_completions_long_parameter_tasks_run_before_short_ones(policy):
    """One thread; nothing known of the stage: dask's order first. After the stage's
    first two tasks finish (n=1, then n=2: the model's cadence re-ranks at 1 and 2
    observations), the waiting n=8 tasks run before the waiting n=1 ones."""
    ns = [1, 2] + [1, 8] * 6
    with (
        dask.config.set(VALIDATE),
        plugin_cluster(JobsPlugin(policy=policy)) as cl,
        Client(cl) as c,
    ):
        res = c.compute(sweep(ns, unit=0.03, first=2), sync=True)
        order = [i for _, i in sorted(res)]
        assert sorted(order[:2]) == [0, 1]
        # dask hands the one-thread worker 2 tasks at a time: the one assigned before
        # the second completion keeps its place (dask's order); the rest run longest first
        rest = [ns[i] for i in order[3:]]
        assert rest == sorted(rest, reverse=True), rest
        assert rest.count(8) >= 4
        p = plugin_of(c)
        assert p.ranker.reestimated > 0
        assert p.errors == {}
        events = [e for _, e in c.get_events("daskjobs") if e.get("action") == "reestimated"]
        assert events and events[0]["stage"] == "job"


def test_waiting_sets_follow_transitions_and_are_emptied():
    with dask.config.set(VALIDATE), plugin_cluster(JobsPlugin(policy="lpt")) as cl, Client(cl) as c:
        futs = c.compute(sweep([1, 2, 3, 4, 5, 6], unit=0.01))
        c.gather(futs)
        p = plugin_of(c)
        assert p.ranker.waiting.get("job", {}) == {}
        del futs
        # annotated tasks are never tracked (their estimate is the user's)
        c.compute(sweep([1, 2, 3], name="ann", annotate_estimate=True, unit=0.0), sync=True)
        assert "ann" not in p.ranker.waiting


def test_a_failing_reestimate_is_logged_not_fatal(monkeypatch):
    with dask.config.set(VALIDATE), plugin_cluster(JobsPlugin(policy="lpt")) as cl, Client(cl) as c:
        p = cl.scheduler.plugins["daskjobs"]

        def broken(stage):
            raise RuntimeError("boom")

        monkeypatch.setattr(p.ranker, "reestimate", broken)
        res = c.compute(sweep([1, 2, 3, 4], unit=0.0), sync=True)
        assert len(res) == 4
        assert p.errors.get("learning", 0) >= 1  # counted under the learning part


def test_explain_says_where_each_estimate_came_from():
    with dask.config.set(VALIDATE), plugin_cluster(JobsPlugin(policy="lpt")) as cl, Client(cl) as c:
        # nothing known: the default
        first = c.compute(sweep([1], name="fresh", unit=0.0))
        first[0].result()
        info = explain(c, "fresh-0")
        assert info["estimate_source"] == "default"
        assert info["estimate_band"] is None and "configured default" in info["estimate_from"]
        c.compute(sweep([1, 2, 4, 8, 16], unit=0.005), sync=True)
        held = c.compute(
            sweep([3, 5], unit=0.0, start=10) + sweep([2], name="ann", annotate_estimate=True)
        )
        c.gather(held)
        model = explain(c, "job-11")
        assert model["estimate_source"] == "model"
        low, high = model["estimate_band"]
        assert low <= model["estimate"] <= high
        assert model["estimate_samples"] in (5, 6, 7)  # at ranking, or re-ranked
        assert "duration model" in model["estimate_from"]
        assert f"{model['estimate_samples']} observation" in model["estimate_from"]
        ann = explain(c, "ann-0")
        assert ann["estimate_source"] == "annotation" and ann["estimate"] == pytest.approx(0.04)
        assert "annotation" in ann["estimate_from"]
        # a stage whose tasks carry no parameters: the median of what was measured
        # (the futures are held: a released key has nothing to explain)
        plains = c.compute([dask.delayed(pause)(dask_key_name=f"plain-{i}") for i in range(3)])
        last = c.compute(dask.delayed(pause)(dask_key_name="plain-9"))
        last.result()
        plain = explain(c, "plain-9")
        assert plain["estimate_source"] in ("history", "default")
        if plain["estimate_source"] == "history":
            assert "median" in plain["estimate_from"]
        del plains, last


def test_the_live_estimator_never_fits_in_the_hook_and_scores_what_it_acted_on():
    from daskjobs.plugin.estimates import LiveEstimator

    est = LiveEstimator(1.0, 512)
    for n in (1, 2, 4, 8):
        est.observe("job", {"n": n}, 0.1 * n)
    assert est.stages()["job"]["scored"] == 0  # nothing was predicted yet: nothing acted on
    fitted = est.predict("job", {"n": 16})  # a graph ranked: the model is fitted
    assert fitted.source == "model"
    fit = est.models.model("job")._fit
    for n in (16, 32, 1, 2):
        est.observe("job", {"n": n}, 0.1 * n)
    assert est.models.model("job")._fit is fit  # observing never fitted again
    st = est.stages()["job"]
    assert st["scored"] == 4 and st["samples"] == 8
    assert st["within_2x"] >= 0.5
    est.predict("job", {"n": 3})
    assert est.models.model("job")._fit is not fit  # the next prediction fits


def test_status_reports_the_share_within_2x_so_far():
    with dask.config.set(VALIDATE), plugin_cluster(JobsPlugin(policy="lpt")) as cl, Client(cl) as c:
        c.compute(sweep([1, 2, 4, 8, 16] * 3, unit=0.01), sync=True)
        st = status(c)["stages"]["job"]
        assert st["samples"] == 15
        assert st["scored"] >= 1 and st["within_2x"] is not None


def test_critical_path_reestimate_moves_the_tasks_own_part_of_its_path():
    from daskjobs.plugin.views import LiveTask
    from daskjobs.policies.order import CriticalPath

    cp = CriticalPath()
    a = LiveTask("a", 2.0, 1, "t", 0.0, (), "history", "s")
    b = LiveTask("b", 3.0, 1, "t", 0.0, ("a",), "history", "s")
    cp.add_graph([a, b])
    assert cp.key(a) == -5.0 and cp.key(b) == -3.0
    longer = LiveTask("a", 7.0, 1, "t", 0.0, (), "model", "s")
    cp.reestimate(a, longer)
    assert cp.key(longer) == -10.0  # its own 7 s and the 3 s below it
    assert cp.key(b) == -3.0
