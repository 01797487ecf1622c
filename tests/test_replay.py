"""Replay (docs/replay.md): recorded runs into the simulator, calibrated against the recording."""

from __future__ import annotations

import random
import time

import dask
import pytest
from distributed import Client, LocalCluster, get_worker

from daskjobs.plugin import JobsPlugin
from daskjobs.replay import load, replay

TOLERANCE = 0.10


def _work(i, d, *deps):
    time.sleep(d)
    return i


def _slow_work(i, d, *deps):
    time.sleep(d * (3.0 if get_worker().name == 0 else 1.0))
    return i


def _graph(fn, n=40, seed=1):
    """``n`` independent fits of log-normal duration, then a DAG: 4 features, 8 models
    reading two features each, one summary."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        d = min(0.12, rng.lognormvariate(-3.4, 0.6))
        with dask.annotate(estimate=d, team="quant" if i % 2 else "ml"):
            out.append(dask.delayed(fn)(i, d, dask_key_name=f"fit-{i}"))
    with dask.annotate(estimate=0.03, team="ml"):
        feats = [dask.delayed(fn)(i, 0.03, dask_key_name=f"feat-{i}") for i in range(4)]
        models = [
            dask.delayed(fn)(i, 0.02, feats[i % 4], feats[(i + 1) % 4], dask_key_name=f"model-{i}")
            for i in range(8)
        ]
        out.append(dask.delayed(fn)(0, 0.01, *models, dask_key_name="summary"))
    return out


def _record(path, policy="lpt", fn=_work, n_workers=2, threads=2):
    plugin = JobsPlugin(policy=policy, record=str(path))
    with (
        LocalCluster(
            n_workers=n_workers,
            threads_per_worker=threads,
            processes=False,
            dashboard_address=":0",
            scheduler_kwargs={"plugins": [plugin]},
        ) as cl,
        Client(cl) as c,
    ):
        c.compute(_graph(fn), sync=True)
    return path


@pytest.fixture(scope="module")
def lpt_trace(tmp_path_factory):
    return _record(tmp_path_factory.mktemp("replay") / "lpt.jsonl")


@pytest.fixture(scope="module")
def slow_trace(tmp_path_factory):
    return _record(tmp_path_factory.mktemp("replay") / "slow.jsonl", policy="fifo", fn=_slow_work)


# -- round trip ---------------------------------------------------------------------------------


def test_round_trip_within_tolerance(lpt_trace):
    loaded = load(lpt_trace)
    assert loaded.policy == "lpt" and loaded.complete and not loaded.notes
    assert len(loaded.tasks) == 53
    assert loaded.cluster.nodes == 2 and loaded.cluster.cores_per_node == 2
    assert loaded.fit.overhead_samples > 10 and 0 <= loaded.fit.overhead < 0.05
    summary = next(t for t in loaded.tasks if t.tid == "summary")
    assert set(summary.deps) == {f"model-{i}" for i in range(8)}
    r = replay(loaded)
    assert r.policy == "lpt"
    assert abs(r.error) < TOLERANCE, (r.makespan, loaded.recorded.makespan, loaded.fit)


def test_slow_worker_is_measured_and_replayed(slow_trace):
    loaded = load(slow_trace)
    slow = [w for w in loaded.workers if w.speed != 1.0]
    assert len(slow) == 1 and 2.0 < slow[0].speed < 4.0, loaded.workers
    assert loaded.cluster.slow == {1: slow[0].speed}  # fastest first: the slow one is last
    r = replay(loaded)
    assert r.policy == "fifo"
    assert abs(r.error) < TOLERANCE, (r.makespan, loaded.recorded.makespan, loaded.fit)
    assert replay(loaded, no_slow=True).makespan < r.makespan
