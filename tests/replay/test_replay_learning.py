"""Replay with learned estimates (docs/explanation/replay.md): a run recorded without estimate
annotations replays with the simulator's learner, fed each task's recorded stage and
``params`` annotation, within the calibration error replay meets."""

from __future__ import annotations

import random
import time

import dask
import pytest
from conftest import plugin_cluster
from distributed import Client

from daskjobs.plugin import JobsPlugin
from daskjobs.policies.durations import Estimator
from daskjobs.replay import load, replay
from daskjobs.replay.run import unannotated
from daskjobs.trace import read_trace

# live recordings compared with their replays: under -n, with no other test beside them
pytestmark = pytest.mark.alone

TOLERANCE = 0.10  # the calibration of tests/replay/test_replay.py


def _sleep(size, window):
    time.sleep(0.006 * size)
    return size


def _sweep(n=64, seed=3):
    """A sweep of ``n`` points, no estimates: each sleeps 6 ms x ``size`` (2 to 12),
    its ``window`` explains nothing; the points in random order (so dask's order, what
    the recorded plugin ran without estimates, is not longest-first)."""
    rng = random.Random(seed)
    sizes = [2 + 10 * (k / (n - 1)) for k in range(n)]
    rng.shuffle(sizes)
    out = []
    for i, size in enumerate(sizes):
        params = {"size": round(size, 3), "window": (20, 60, 120)[i % 3]}
        with dask.annotate(stage="backtest", params=params):
            out.append(dask.delayed(_sleep)(size, params["window"], dask_key_name=f"bt-{i}"))
    return out


@pytest.fixture(scope="module")
def sweep_trace(tmp_path_factory):
    import daskjobs

    path = tmp_path_factory.mktemp("replay-learning") / "sweep.jsonl"
    plugin = JobsPlugin(policy="lpt")
    with (
        plugin_cluster(plugin, n_workers=2, threads_per_worker=2) as cl,
        Client(cl) as c,
    ):
        # warm first: a cold start's one-off costs would be a large share of a short run
        c.compute(
            [dask.delayed(_sleep)(0, 0, dask_key_name=f"warm-{k}") for k in range(8)], sync=True
        )
        deadline = time.time() + 5
        while c.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)):
            if time.time() > deadline:
                break
            time.sleep(0.01)
        with daskjobs.record(c, str(path)):
            c.compute(_sweep(), sync=True)
    return path


def _assert_calibrated(loaded, makespan):
    """As tests/replay/test_replay.py states it: within 10% of the recorded makespan plus the
    longest replayed task (two greedy schedules of the same work differ by at most the
    longest task at the end)."""
    recorded = loaded.recorded.makespan
    tail = max(t.duration for t in loaded.tasks) * max(loaded.cluster.speeds)
    margin = TOLERANCE * recorded + tail
    assert abs(makespan - recorded) <= margin, (makespan, recorded, margin, loaded.fit)


def test_the_trace_records_each_tasks_stage_and_params(sweep_trace):
    trace = read_trace(sweep_trace)
    sweep = [t for t in trace.tasks.values() if str(t.key).startswith("bt-")]
    assert len(sweep) == 64
    for t in sweep:
        assert t.stage == "backtest"
        assert set(t.params) == {"size", "window"}
        assert t.estimate_source != "annotation"
    loaded = load(sweep_trace)
    assert not loaded.annotated
    by_tid = {t.tid: t for t in loaded.tasks}
    assert by_tid["bt-0"].stage == "backtest"
    assert by_tid["bt-0"].params == trace.tasks["bt-0"].params


def test_a_run_without_annotations_replays_with_learned_estimates(sweep_trace):
    loaded = load(sweep_trace)
    plain = replay(loaded)
    learned = replay(loaded, learn=True)
    _assert_calibrated(loaded, plain.makespan)
    _assert_calibrated(loaded, learned.makespan)
    s = learned.schedule
    # every task was the learner's, and it learned the stage from the recorded params:
    # after the first completions, the tasks start on the model's estimates
    assert {t.tid for t in s.learned} == {t.tid for t in loaded.tasks}
    model = s.estimator.models.model("backtest")
    assert model is not None and len(model) == 64
    assert s.estimator.predict("backtest", {"size": 12.0, "window": 20}).source == "model"
    started_on_model = [t for t in s.learned if t.estimated]
    assert len(started_on_model) >= 56  # all but the first wave of 4 slots, and a few
    assert s.within() >= 0.8
    # the replay is deterministic, learning included
    again = replay(loaded, learn=True)
    assert [(a.task.tid, a.start) for a in again.schedule.attempts] == [
        (a.task.tid, a.start) for a in s.attempts
    ]


def test_a_replay_can_learn_from_a_history(sweep_trace):
    loaded = load(sweep_trace)
    history = Estimator(1.0)
    for t in loaded.tasks:
        history.observe(t.stage, t.params, t.duration, score=False)
    r = replay(loaded, learn=history)
    assert r.schedule.estimator is history
    assert all(t.estimated for t in r.schedule.learned)  # none started on the default
    _assert_calibrated(loaded, r.makespan)


def test_unannotated_keeps_annotations_and_resets_the_rest(sweep_trace):
    loaded = load(sweep_trace)
    tasks = unannotated(loaded)
    default = float(loaded.settings.get("default_estimate") or 1.0)
    assert all(t.estimate == default and not t.estimated for t in tasks)
    with pytest.raises(TypeError, match="learn must be True, False or"):
        replay(loaded, learn="yes")  # type: ignore[arg-type]
