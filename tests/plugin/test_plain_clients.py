"""dask code as people already write it, on a scheduler running the plugin: no daskjobs API in
the workload, no annotation. A task's stage is its function, its parameters its literal
arguments (daskjobs/plugin/features.py), the history outlives the cluster, and the long tasks of
a grid start first from the first run (the prior of a size-like argument) and on the next
cluster (the measured model)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time

import dask
import pytest
import realtasks
from conftest import VALIDATE, plugin_cluster
from distributed import Client, Event
from repo import ROOT

from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.client import explain, status
from daskjobs.plugin.features import MAX_FEATURES

GRID = [1, 2, 3, 4, 5, 6, 7, 8]  # submitted small to large, as a grid lists them
STAGE = "realtasks.work"


def started_order(results):
    """The ``n`` of each result, in the order the tasks started."""
    return [n for _, n in sorted(results)]


def gate(name):
    Event(name).wait(timeout=120)
    return "open"


def known(client, keys):
    """Wait until the scheduler holds ``keys`` (a graph travels on the client's stream; an
    RPC such as explain may arrive before it)."""
    deadline = time.monotonic() + 60
    while any(explain(client, k)["state"] == "unknown" for k in keys):
        assert time.monotonic() < deadline, "the scheduler never got the graph"
        time.sleep(0.01)


def lpt_cluster(history, **kw):
    plugin = JobsPlugin(policy="lpt", history={"path": str(history)}, **kw)
    return plugin_cluster(plugin)


def test_a_plain_map_starts_its_largest_arguments_first_and_the_next_cluster_knows_why(tmp_path):
    history = tmp_path / "h.json"
    with dask.config.set(VALIDATE), lpt_cluster(history) as cl, Client(cl) as c:
        futs = c.map(realtasks.work, GRID, unit=0.005)
        assert started_order(c.gather(futs)) == sorted(GRID, reverse=True)
        info = explain(c, futs[0].key)
        assert info["stage"] == STAGE and info["params"] == {"n": 1, "unit": 0.005}
        assert status(c)["stages"][STAGE]["samples"] == len(GRID)
    rows = json.loads(history.read_text())["stages"][STAGE]
    assert sorted(r[0]["n"] for r in rows) == GRID
    # a new cluster, other key names: the same stage, its measured model from the first task
    with dask.config.set(VALIDATE), lpt_cluster(history) as cl, Client(cl) as c:
        futs = [c.submit(realtasks.work, n, 0.005, key=f"run-{n}") for n in (2, 7)]
        c.gather(futs)
        small, large = explain(c, "run-2"), explain(c, "run-7")
        assert small["stage"] == large["stage"] == STAGE
        assert small["estimate_source"] == large["estimate_source"] == "model"
        assert large["estimate"] > 2 * small["estimate"]
        assert "duration model" in large["estimate_from"]


def test_a_first_run_is_ranked_by_the_prior_and_explain_says_so(tmp_path):
    with (
        dask.config.set(VALIDATE),
        lpt_cluster(tmp_path / "h.json") as cl,
        Client(cl) as c,
    ):
        held = c.submit(gate, "prior-gate", key="gate")  # holds the one thread
        futs = c.map(realtasks.work, GRID, unit=0.005)
        known(c, [f.key for f in futs])
        info = explain(c, futs[-1].key)
        assert info["estimate_source"] == "prior"
        assert "size-like" in info["estimate_from"]
        assert info["estimate"] == pytest.approx(8 * explain(c, futs[0].key)["estimate"])
        Event("prior-gate", client=c).set()
        held.result()
        assert started_order(c.gather(futs)) == sorted(GRID, reverse=True)


def test_a_submit_loop_is_ordered_like_one_graph(tmp_path):
    with (
        dask.config.set(VALIDATE),
        lpt_cluster(tmp_path / "h.json") as cl,
        Client(cl) as c,
    ):
        held = c.submit(gate, "loop-gate", key="gate")
        # one graph per task; units far apart, so that the first two measurements cannot
        # invert the fit under load (a sleep overshoots by tens of ms at load 10)
        futs = [c.submit(realtasks.work, n, 0.1) for n in GRID]
        known(c, [f.key for f in futs])
        # dask sends a task of a small group straight to a worker, before the rest of the
        # loop exists (only a larger group waits in the scheduler's queue)
        sent = [
            n for n, f in zip(GRID, futs, strict=True) if explain(c, f.key)["state"] != "queued"
        ]
        Event("loop-gate", client=c).set()
        held.result()
        order = started_order(c.gather(futs))
        # those first, largest first among themselves (the worker runs them by priority);
        # then the rest, held on the scheduler, largest first, as in one graph
        assert len(sent) < len(GRID) - 2
        queued = sorted(set(GRID) - set(sent), reverse=True)
        assert order == sorted(sent, reverse=True) + queued, (order, sent)


def prepare(size):
    return list(range(size))


def simulate(prepared, n, unit=0.0):
    start = time.time()
    time.sleep(n * unit)
    return start, n


def test_a_delayed_graph_with_a_shared_stage_runs_its_long_tasks_first(tmp_path):
    with (
        dask.config.set(VALIDATE),
        lpt_cluster(tmp_path / "h.json") as cl,
        Client(cl) as c,
    ):
        shared = dask.delayed(prepare)(1000)
        parts = [dask.delayed(simulate)(shared, n, 0.005) for n in GRID]
        futs = c.compute(parts)
        assert started_order(c.gather(futs)) == sorted(GRID, reverse=True)
        info = explain(c, futs[3].key)
        # the input (another task's output) is never read: the size-like argument is
        assert info["params"] == {"n": 4, "unit": 0.005}
        assert info["stage"] == "test_plain_clients.simulate"


def test_a_wrong_guess_is_undone_by_the_first_measurements(tmp_path):
    """Arguments that grow as the cost falls: the prior starts the cheapest first, the
    first measurements show the fall, and the rest runs most expensive first."""
    with (
        dask.config.set(VALIDATE),
        lpt_cluster(tmp_path / "h.json") as cl,
        Client(cl) as c,
    ):
        futs = c.map(cheaper, list(range(1, 21)))
        order = started_order(c.gather(futs))
        # the prior: the largest first, until the measurements span enough sizes to show
        # the fall (PRIOR_WEIGHT); then the smallest arguments (the most expensive) first
        guessed = next(i for i, n in enumerate(order) if n == 1)
        assert order[:guessed] == list(range(20, 20 - guessed, -1)), order
        assert order[guessed:] == list(range(1, 21 - guessed)), order
        assert guessed <= 10, order


def cheaper(n):
    start = time.time()
    time.sleep(0.004 * (21 - n))
    return start, n


class Shape:
    @property
    def shape(self):
        raise RuntimeError("a property that raises")


def wide(*args, **kwargs):
    return len(args) + len(kwargs)


def test_huge_and_unreadable_arguments_cost_a_bounded_read(tmp_path):
    with (
        dask.config.set(VALIDATE),
        lpt_cluster(tmp_path / "h.json") as cl,
        Client(cl) as c,
    ):
        big = list(range(10**6))
        unhashable = {"a": [1, 2], "b": {3}}
        fut = c.submit(
            wide, big, unhashable, Shape(), *range(100), **{f"k{i}": i for i in range(50)}
        )
        assert fut.result() == 103 + 50
        info = explain(c, fut.key)
        assert info["stage"] == "test_plain_clients.wide"
        params = info["params"]
        assert len(params) == MAX_FEATURES
        assert params["len(arg0)"] == 10**6 and params["len(arg1)"] == 2  # never the items
        assert not any("arg2" in name for name in params)  # a property that raised
        assert status(c)["errors"] == {}


def test_history_that_cannot_be_written_is_a_warning_once_and_tasks_run(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with (
        caplog.at_level(logging.WARNING, logger="daskjobs.plugin"),
        dask.config.set(VALIDATE),
        lpt_cluster(blocker / "h.json") as cl,
        Client(cl) as c,
    ):
        assert sorted(n for _, n in c.gather(c.map(realtasks.work, GRID, unit=0.0))) == GRID
        assert status(c)["stages"][STAGE]["samples"] == len(GRID)
    warnings = [r for r in caplog.records if "could not save measured durations" in r.message]
    assert len(warnings) == 1


def test_a_newer_history_file_is_left_as_it_is(tmp_path, caplog):
    history = tmp_path / "h.json"
    newer = json.dumps({"version": 99, "stages": {}})
    history.write_text(newer)
    with (
        caplog.at_level(logging.WARNING, logger="daskjobs.plugin"),
        dask.config.set(VALIDATE),
        lpt_cluster(history) as cl,
        Client(cl) as c,
    ):
        c.gather(c.map(realtasks.work, GRID, unit=0.0))
    assert history.read_text() == newer
    assert "newer daskjobs" in caplog.text


def test_arguments_off_keeps_the_key_prefix_and_no_parameters(tmp_path):
    with (
        dask.config.set(VALIDATE),
        lpt_cluster(tmp_path / "h.json", estimates={"arguments": False}) as cl,
        Client(cl) as c,
    ):
        fut = c.submit(realtasks.work, 3, 0.0, key="run-3")
        fut.result()
        info = explain(c, "run-3")
        assert info["stage"] == "run" and info["params"] is None


@pytest.mark.realcluster
def test_real_processes_keep_a_plain_maps_history_in_the_users_cache(real_cluster, tmp_path):
    """dask's own scheduler and worker processes, the preload, dask's defaults but the
    history's (``auto``: the user's cache directory, here ``$XDG_CACHE_HOME``): a plain
    ``client.map`` is learned, saved there as the scheduler closes, and the next scheduler
    ranks the same function's tasks by it from the first task."""
    cache = tmp_path / "cache"
    env = {"DASK_DASKJOBS__HISTORY__PATH": "auto", "XDG_CACHE_HOME": str(cache)}
    env["DASKJOBS_HISTORY"] = ""
    rc = real_cluster(n_workers=1, nthreads=1, env=env)
    with rc.client() as c:
        futs = c.map(realtasks.work, GRID, unit=0.01)
        assert started_order(c.gather(futs)) == sorted(GRID, reverse=True)
    rc.close()
    assert rc.problems() == []
    saved = cache / "daskjobs" / "history.json"
    rows = json.loads(saved.read_text())["stages"][STAGE]
    assert sorted(r[0]["n"] for r in rows) == GRID

    rc2 = real_cluster(n_workers=1, nthreads=1, env=env)
    with rc2.client() as c:
        futs = c.map(realtasks.work, [3, 1, 6, 2], unit=0.01, key=[f"x-{i}" for i in range(4)])
        assert started_order(c.gather(futs)) == [6, 3, 2, 1]
        info = explain(c, "x-2")
        assert info["estimate_source"] == "model" and info["stage"] == STAGE
    rc2.close()
    assert rc2.problems() == []


SCRIPT = """
import sys, time
from distributed import Client
import daskjobs
from daskjobs import JobsPlugin

def grid_task(n):
    start = time.time()
    time.sleep(0.01 * n)
    return start, n

if __name__ == "__main__":
    plugin = JobsPlugin(policy="lpt", history={"path": sys.argv[1]})
    with daskjobs.local_cluster(plugin, n_workers=1, threads_per_worker=1, processes=True,
                                dashboard_address=":0") as cluster, Client(cluster) as client:
        futs = client.map(grid_task, [1, 2, 3, 4])
        order = [n for _, n in sorted(client.gather(futs))]
        info = daskjobs.explain(client, futs[0].key)
        print("ORDER", order, "STAGE", info["stage"], "SOURCE", info["estimate_source"])
"""


def test_a_function_defined_in_main_is_a_stage_across_sessions(tmp_path):
    """A notebook's or script's own function (module ``__main__``, pickled by value onto
    worker processes): its stage is ``__main__.<name>`` in every session, so the second
    session starts from the first one's measurements."""
    script = tmp_path / "grid.py"
    script.write_text(textwrap.dedent(SCRIPT))
    history = tmp_path / "h.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)])
    outs = []
    for _ in range(2):
        run = subprocess.run(
            [sys.executable, str(script), str(history)],
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        outs.append(next(line for line in run.stdout.splitlines() if line.startswith("ORDER")))
    assert outs[0].startswith("ORDER [4, 3, 2, 1] STAGE __main__.grid_task SOURCE ")
    assert outs[1] == "ORDER [4, 3, 2, 1] STAGE __main__.grid_task SOURCE model"


# -- dask collections and joblib: results as plain dask gives them -------------------------------


def test_dask_array_and_dataframe_reductions_give_plain_dasks_results(tmp_path):
    """Tasks of dask's own functions: key-prefix stages, no parameters read, dask's order;
    results identical to plain dask's on worker processes."""
    import dask.array as da
    import numpy as np
    import pandas as pd

    x = da.random.RandomState(0).random((600, 600), chunks=(100, 100))
    array = ((x + x.T) * 2).mean(axis=0).std()
    df = dask.datasets.timeseries(start="2000-01-01", end="2000-01-03", freq="10s", seed=1)
    frame = df.groupby("name").agg({"x": "mean", "id": "count"})
    expected = dask.compute(array, frame, scheduler="sync")
    plugin = JobsPlugin(history={"path": str(tmp_path / "h.json")})
    with (
        dask.config.set(VALIDATE),
        plugin_cluster(plugin, n_workers=2, threads_per_worker=2, processes=True) as cl,
        Client(cl) as c,
    ):
        got_array, got_frame = c.compute([array, frame], sync=True)
        st = status(c)
        stages = st["stages"]
    assert np.isclose(got_array, expected[0])
    pd.testing.assert_frame_equal(got_frame.sort_index(), expected[1].sort_index())
    assert stages and not any("." in s for s in stages)  # key prefixes, no function names
    assert st["errors"] == {}


def test_grid_search_through_joblibs_dask_backend_gives_identical_results():
    import joblib
    from sklearn.datasets import make_classification
    from sklearn.model_selection import GridSearchCV
    from sklearn.svm import SVC

    x, y = make_classification(n_samples=200, n_features=8, random_state=0)
    grid = {"C": [0.1, 1.0, 10.0], "gamma": [0.01, 0.1]}
    expected = GridSearchCV(SVC(), grid, cv=3).fit(x, y).cv_results_["mean_test_score"]
    with (
        dask.config.set(VALIDATE),
        plugin_cluster(JobsPlugin(), n_workers=2, threads_per_worker=1, processes=True) as cl,
        Client(cl) as c,
        joblib.parallel_backend("dask"),
    ):
        search = GridSearchCV(SVC(), grid, cv=3, n_jobs=-1).fit(x, y)
        assert status(c)["errors"] == {}
    assert list(search.cv_results_["mean_test_score"]) == list(expected)


def test_a_dask_collections_graph_keeps_dasks_order_once_its_stages_are_measured(tmp_path):
    """The second array reduction on a scheduler that measured the first one's task
    prefixes: its tasks have estimates now (the stages' medians), and still one rank for
    all of them, so dask.order (memory-friendly) decides inside it; a graph of the user's
    own functions is ranked by its estimates."""
    import dask.array as da

    def reduction(seed):
        x = da.random.RandomState(seed).random((400, 400), chunks=(100, 100))
        return (x + x.T).sum(axis=0).mean()

    with (
        dask.config.set(VALIDATE),
        lpt_cluster(tmp_path / "h.json") as cl,
        Client(cl) as c,
    ):
        c.compute(reduction(0), sync=True)
        held = c.submit(gate, "own-gate", key="gate")
        fut = c.compute(reduction(1))
        known(c, [fut.key])  # (a graph arrives whole)
        p = cl.scheduler.plugins["daskjobs"]
        keys = [k for k in list(cl.scheduler.tasks) if k != "gate" and k in p.ranker.tasks]
        views = [p.ranker.tasks[k] for k in keys]
        assert len(views) > 20
        assert any(v.source == "history" for v in views)  # measured in the first run
        ranks = {cl.scheduler.tasks[k].priority[1] for k in keys}
        assert len(ranks) == 1, ranks
        Event("own-gate", client=c).set()
        held.result()
        fut.result()
