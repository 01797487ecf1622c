"""Sweeps as Dask graphs: shape, annotations, caching across runs, failures, the example.

A stage whose function cannot be named asks for ``name=``; one that cannot be sent to the
workers (a lock it closes over or reaches through globals, a parameter that cannot be
pickled) is named before anything is submitted; a failed stage is logged once; and the
clusters ``run`` starts close without a heartbeat traceback.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import SchedulerPlugin
from filetree import read_only, snapshot
from repo import FOLDERS, HELPERS, ROOT

from daskjobs import Sweep, cases, grid, run
from daskjobs.cache.store import ResultStore
from daskjobs.sweep import SweepGraph


class Calls:
    """Counts stage calls (an object, so the stage's code hash does not depend on its state)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def hit(self, name: str) -> None:
        with self.lock:
            self.counts[name] += 1

    def snapshot(self) -> Counter[str]:
        with self.lock:
            return Counter(self.counts)


CALLS = Calls()


def make_prices(slice: int, days: int = 300) -> np.ndarray:
    CALLS.hit("make_prices")
    rng = np.random.default_rng(slice)
    return 100 * np.exp(np.cumsum(rng.normal(0, 0.01, size=days)))


def moving_averages(prices: np.ndarray, windows: tuple[int, ...] = (5, 10, 20, 50, 100)) -> dict:
    CALLS.hit("moving_averages")
    kernel = {w: np.convolve(prices, np.ones(w) / w, mode="same") for w in windows}
    return kernel


def crossover(moving_averages: dict, prices: np.ndarray, fast: int, slow: int) -> float:
    CALLS.hit("crossover")
    if fast >= slow:
        raise ValueError(f"fast window {fast} must be shorter than slow window {slow}")
    signal = np.sign(moving_averages[fast] - moving_averages[slow])[:-1]
    returns = np.diff(np.log(prices))
    pnl = signal * returns
    return float(pnl.mean() / (pnl.std() + 1e-12) * np.sqrt(252))


def build(slow: list[int], slices: int = 3, fail_fast: bool = False) -> Sweep:
    sweep = Sweep("test", team="quant")
    prices = sweep.stage(make_prices, over=grid(slice=range(slices)), estimate=0.1)
    feats = sweep.stage(
        moving_averages, inputs={"prices": prices}, estimate=lambda p: 0.5 + p["slice"]
    )
    fast = [5, 10, 50] if fail_fast else [5, 10]
    sweep.stage(
        crossover,
        inputs={"moving_averages": feats, "prices": prices},
        over=grid(fast=fast, slow=slow),
        retries=0,
        resources={"GPU": 1},
        speculate=False,
    )
    return sweep


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=False,
            dashboard_address=":0",
            resources={"GPU": 1},
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


@pytest.fixture(autouse=True)
def _idle_scheduler(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests share a cluster and content keys; a key still in cluster memory would be reused
    (that is dask's rule for equal keys), so each test waits for the previous one's to go."""
    yield
    if "client" in request.fixturenames:
        c = request.getfixturevalue("client")
        deadline = time.monotonic() + 10
        while c.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)):
            assert time.monotonic() < deadline, "the scheduler kept tasks after the test"
            time.sleep(0.02)


def _wait_forgotten(client: Client, keys: list[str]) -> None:
    """Wait until the scheduler has released ``keys`` (releases are asynchronous)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        held = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.tasks))
        if not set(keys) & set(held):
            return
        time.sleep(0.02)
    raise AssertionError("the scheduler still holds the keys of the previous graph")


def scheduler_annotations(dask_scheduler: Any) -> dict[str, dict]:
    return {str(k): dict(ts.annotations) for k, ts in dask_scheduler.tasks.items()}


# -- building --------------------------------------------------------------------------------


def test_grid_and_cases() -> None:
    g = grid(a=[1, 2], b=["x", "y", "z"])
    assert len(g) == 6 and g.points[0] == {"a": 1, "b": "x"} and g.names == ("a", "b")
    c = cases({"a": 9, "b": "q"}, {"a": 8, "b": "r"})
    assert (g + c).points[-1] == {"a": 8, "b": "r"} and len(g + c) == 8
    assert len(grid(a=[1, 2]) * cases([{"b": 1}, {"b": 2}, {"b": 3}])) == 6
    with pytest.raises(TypeError, match="grid axis 'a' must be a list"):
        grid(a="abc")
    with pytest.raises(ValueError, match="share parameters"):
        grid(a=[1]) * grid(a=[2])


def test_shared_stage_is_one_node_however_many_read_it() -> None:
    sweep = build(slow=[20, 50])
    graph = sweep.to_dask(store=False)
    dsk = dict(graph.__dask_graph__())
    stages = Counter(k.split("-")[0] for k in dsk)
    assert stages == {"make_prices": 3, "moving_averages": 3, "crossover": 12}
    readers = Counter(dep for task in dsk.values() for dep in task.dependencies)
    for key in sweep.stages["moving_averages"].keys:
        assert readers[key] == 4  # 2 fast x 2 slow backtests read each feature node
    for key in sweep.stages["make_prices"].keys:
        assert readers[key] == 5  # its feature stage and its 4 backtests


def test_inputs_are_joined_on_shared_labels_and_crossed_otherwise() -> None:
    sweep = build(slow=[20])
    prices = sweep.stages["make_prices"]
    feats = sweep.stages["moving_averages"]
    by_slice = {n.labels["slice"]: n.key for n in prices}
    feat_by_slice = {n.labels["slice"]: n.key for n in feats}
    for node in sweep.stages["crossover"]:
        s = node.labels["slice"]
        assert node.inputs == {"moving_averages": feat_by_slice[s], "prices": by_slice[s]}
        assert set(node.labels) == {"slice", "fast", "slow"}

    crossed = Sweep()
    a = crossed.stage(_ident, over=grid(x=[1, 2]), name="a")
    b = crossed.stage(_ident, over=grid(y=[1, 2, 3]), name="b")
    both = crossed.stage(_pair, inputs={"left": a, "right": b})
    assert len(both) == 6
    assert {(n.labels["x"], n.labels["y"]) for n in both} == {
        (x, y) for x in (1, 2) for y in (1, 2, 3)
    }


def _ident(**kwargs: Any) -> dict:
    return kwargs


def _pair(left: Any, right: Any) -> tuple:
    return left, right


def test_building_errors_name_the_problem() -> None:
    sweep = Sweep()
    a = sweep.stage(_ident, over=grid(x=[1, 2]), name="a")
    with pytest.raises(ValueError, match="same name as a label of an upstream stage"):
        sweep.stage(_ident, inputs={"up": a}, over=grid(x=[3]), name="b")
    with pytest.raises(ValueError, match="already has a stage named 'a'"):
        sweep.stage(_ident, name="a")
    with pytest.raises(ValueError, match="'x' is given twice"):
        sweep.stage(_ident, over=grid(x=[1]), params={"x": 2}, name="c")
    with pytest.raises(ValueError, match="estimate of stage 'd'"):
        sweep.stage(_ident, estimate=lambda p: "soon", name="d")
    other = Sweep()
    with pytest.raises(ValueError, match="is not a stage of sweep"):
        other.stage(_ident, inputs={"up": a}, name="e")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), -1.0, True, "soon"])
def test_estimates_must_be_finite_seconds(bad: Any) -> None:
    sweep = Sweep()
    with pytest.raises(ValueError, match="estimate of stage 'f' must be a duration"):
        sweep.stage(_ident, estimate=bad, name="f")
    with pytest.raises(ValueError, match="estimate of stage 'g' must be a duration"):
        sweep.stage(_ident, over=grid(x=[1, 2]), estimate=lambda p: bad, name="g")
    assert sweep.stages == {}


# -- the graph reaches dask ----------------------------------------------------------------


def test_annotations_reach_the_scheduler(client: Client, tmp_path: Path) -> None:
    sweep = build(slow=[20])
    graph = sweep.to_dask(store=tmp_path / "store")
    futures = client.get(graph.__dask_graph__(), graph.keys, sync=False)
    client.gather(futures)
    ann = client.run_on_scheduler(scheduler_annotations)
    for node in sweep.stages["moving_averages"]:
        assert ann[node.key] == {
            "stage": "moving_averages",
            "estimate": 0.5 + node.labels["slice"],
            "params": {"slice": node.labels["slice"]},
            "team": "quant",
            "cache": True,
            "speculate": True,
            "sweep": f"test:{graph.run_id[:8]}",
        }
    for node in sweep.stages["crossover"]:
        assert ann[node.key] == {
            "stage": "crossover",
            "params": {k: node.labels[k] for k in ("slice", "fast", "slow")},
            "team": "quant",
            "cache": True,
            "speculate": False,
            "resources": {"GPU": 1},
            "retries": 0,
            "sweep": f"test:{graph.run_id[:8]}",
        }
    del futures
    _wait_forgotten(client, graph.keys)
    # A second graph loads the outputs: loads are annotated as such.
    again = sweep.to_dask(store=tmp_path / "store")
    assert set(again.loaded) == set(graph.keys) and again.computed == ()
    futures = client.get(again.__dask_graph__(), again.keys, sync=False)
    client.gather(futures)
    ann = client.run_on_scheduler(scheduler_annotations)
    assert ann[again.keys[0]]["load"] is True and ann[again.keys[0]]["stage"] == "crossover"
    del futures


def test_parameters_for_the_duration_model_are_small_and_plain() -> None:
    from daskjobs.sweep.graph import _MODEL_PARAMS, _model_params

    sweep = Sweep("p")
    stage = sweep.stage(
        make_prices,
        over=grid(slice=[1]),
        params={"universe": ("a", "b"), "long": "x" * 500, "nan": float("nan"), "flag": True},
    )
    (node,) = stage.nodes
    got = _model_params(node)
    assert got == {
        "slice": 1,
        "universe": "('a', 'b')",
        "long": "x" * 64,
        "nan": "nan",
        "flag": True,
    }
    many = Sweep("m").stage(
        make_prices, over=grid(slice=[1]), params={f"p{i}": i for i in range(99)}
    )
    assert len(_model_params(many.nodes[0])) == _MODEL_PARAMS


def test_collection_protocol(client: Client, tmp_path: Path) -> None:
    sweep = build(slow=[20, 50])
    graph = sweep.to_dask(store=False)
    assert isinstance(graph, SweepGraph)
    (local,) = dask.compute(graph, scheduler="threads")
    (distributed,) = dask.compute(graph)  # the default client
    from_client = client.compute(graph).result()
    from_get = client.get(graph.__dask_graph__(), graph.keys)
    assert len(local) == 12
    assert local == distributed == from_client == list(from_get)


# -- caching across runs ---------------------------------------------------------------------


def test_second_run_computes_only_changed_backtests(client: Client, tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "store")
    before = CALLS.snapshot()
    first = build(slow=[20, 50]).run(client, store=store, progress=False)
    calls = CALLS.snapshot() - before
    assert first.ok and first.computed == 3 + 3 + 12 and first.hits == 0
    assert calls == {"make_prices": 3, "moving_averages": 3, "crossover": 12}
    assert len(store.keys()) == 18

    before = CALLS.snapshot()
    second = build(slow=[20, 50, 100]).run(client, store=store, progress=False)
    calls = CALLS.snapshot() - before
    assert calls == {"crossover": 6}  # only the new slow=100 backtests
    assert second.by_stage == {
        "make_prices": {"computed": 0, "hits": 3, "in_memory": 0},  # backtests read prices too
        "moving_averages": {"computed": 0, "hits": 3, "in_memory": 0},
        "crossover": {"computed": 6, "hits": 12, "in_memory": 0},
    }
    assert second.computed == 6 and second.hits == 18 and second.pruned == 0
    old = {(r["slice"], r["fast"], r["slow"]): r["value"] for r in first.records}
    new = {(r["slice"], r["fast"], r["slow"]): r["value"] for r in second.records}
    assert {k: new[k] for k in old} == old
    assert len(new) == 18

    before = CALLS.snapshot()
    third = build(slow=[20, 50, 100]).run(client, store=store, progress=False)
    assert CALLS.snapshot() - before == Counter()
    assert third.computed == 0 and third.hits == 18 and third.pruned == 6


def test_corrupt_entry_is_recomputed_never_returned(client: Client, tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "store")
    sweep = build(slow=[20])
    first = sweep.run(client, store=store, progress=False)
    victim = first.records[1]
    key = sweep.stages["crossover"].nodes[1].key
    path = Path(store.root) / store.info(key).payload
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))

    before = CALLS.snapshot()
    second = build(slow=[20]).run(client, store=store, progress=False)
    assert CALLS.snapshot() - before == {"crossover": 1}  # its features were loaded
    assert second.records[1]["value"] == victim["value"]
    assert second.values == first.values
    assert second.recomputed == 1
    assert store.verify().corrupt == () and store.contains(key)


def test_entry_removed_after_planning_is_recomputed(
    client: Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``cache gc`` between planning and loading: the load recomputes, and says why."""
    store = ResultStore(tmp_path / "store")
    sweep = build(slow=[20])
    first = sweep.run(client, store=store, progress=False)
    graph = build(slow=[20]).to_dask(store=store)
    assert len(graph.loaded) == 6
    gone = graph.keys[2]
    assert store.delete(gone)
    with caplog.at_level(logging.WARNING, logger="daskjobs"):
        second = run(graph, client, progress=False)
    assert second.ok and second.values == first.values
    assert second.recomputed == 1 and second.computed == 1 and second.hits == 5 + 2
    assert f"store entry {gone} unusable (gone: removed since the sweep was planned)" in (
        caplog.text
    )
    assert store.contains(gone)  # committed again


def test_cache_false_stage_is_never_stored(client: Client, tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "store")
    sweep = Sweep()
    a = sweep.stage(make_prices, over=grid(slice=[1, 2]), cache=False)
    sweep.stage(moving_averages, inputs={"prices": a})
    sweep.run(client, store=store, progress=False)
    assert {k.split("-")[0] for k in store.keys()}  # noqa: SIM118 - a list == {"moving_averages"}
    again = sweep.to_dask(store=store)
    assert again.computed == () and len(again.loaded) == 2


# -- failures ------------------------------------------------------------------------------


def test_failing_stage_reports_params_and_commits_the_rest(client: Client, tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "store")
    sweep = build(slow=[20], fail_fast=True)  # fast=50 >= slow=20 raises
    result = sweep.run(client, store=store, progress=False)
    assert not result.ok and len(result.failures) == 3
    for failure in result.failures:
        assert failure.stage == "crossover" and failure.labels["fast"] == 50
        assert "ValueError: fast window 50 must be shorter" in failure.error
        assert "raise ValueError" in failure.traceback
    good = [r for r in result.records if r["error"] is None]
    bad = [r for r in result.records if r["error"] is not None]
    assert len(good) == 6 and len(bad) == 3
    assert all(isinstance(r["value"], float) for r in good)
    assert all(r["value"] is None and "fast=50" in r["error"] for r in bad)
    failed_keys = {f.key for f in result.failures}
    assert set(store.keys()) == set(sweep.nodes) - failed_keys  # everything else committed


def broken_features(prices: np.ndarray, slice_to_break: int = 1) -> dict:
    if int(prices[0] * 1000) % 7 == slice_to_break:  # deterministic, data-dependent
        raise RuntimeError("bad data")
    return moving_averages(prices)


def test_upstream_failure_names_the_failed_stage(client: Client, tmp_path: Path) -> None:
    sweep = Sweep()
    prices = sweep.stage(make_prices, over=grid(slice=range(6)))
    values = {n.labels["slice"]: int(make_prices(n.labels["slice"])[0] * 1000) % 7 for n in prices}
    feats = sweep.stage(broken_features, inputs={"prices": prices}, name="features")
    sweep.stage(
        crossover,
        inputs={"moving_averages": feats, "prices": prices},
        over=grid(fast=[5], slow=[20, 50]),
    )
    result = sweep.run(client, store=tmp_path / "store", progress=False)
    broken = sorted(s for s, v in values.items() if v == 1)
    assert broken and len(broken) < 6  # some slices fail, not all
    assert [f.labels["slice"] for f in result.failures] == broken
    assert all(
        f.stage == "features" and "RuntimeError: bad data" in f.error for f in result.failures
    )
    for r in result.records:
        assert (r["error"] is not None) == (r["slice"] in broken)


def test_computed_counts_the_stages_that_ran(client: Client, tmp_path: Path) -> None:
    sweep = Sweep()
    prices = sweep.stage(make_prices, over=grid(slice=range(6)))
    values = {n.labels["slice"]: int(make_prices(n.labels["slice"])[0] * 1000) % 7 for n in prices}
    broken = sum(1 for v in values.values() if v == 1)
    feats = sweep.stage(broken_features, inputs={"prices": prices}, name="features")
    sweep.stage(
        crossover,
        inputs={"moving_averages": feats, "prices": prices},
        over=grid(fast=[5], slow=[20, 50]),
    )
    planned = sweep.to_dask(store=tmp_path / "store")
    assert len(planned.computed) == 6 + 6 + 12
    result = run(planned, client, progress=False)
    assert 0 < broken < 6 and len(result.failures) == broken
    # The broken features raised and their backtests never ran: none of them is counted.
    assert result.by_stage == {
        "make_prices": {"computed": 6, "hits": 0, "in_memory": 0},
        "features": {"computed": 6 - broken, "hits": 0, "in_memory": 0},
        "crossover": {"computed": 2 * (6 - broken), "hits": 0, "in_memory": 0},
    }
    assert result.computed == 6 + 3 * (6 - broken) and result.reruns == 0
    assert len(ResultStore(tmp_path / "store").keys()) == result.computed


def test_a_rerun_of_results_the_cluster_holds_says_so(client: Client) -> None:
    """Outputs whose futures are still held (by this or another client) are handed over by
    dask without running anything: the summary says the cluster held them, not "computed 0,
    loaded 0" alone."""
    sweep = build(slow=[20], slices=2)
    first = sweep.run(client, store=False, progress=False)
    assert first.ok and first.in_memory == 0 and "already held" not in first.summary()
    planned = sweep.to_dask(store=False)
    held = client.get(planned.graph, planned.keys, sync=False)  # the outputs stay in memory
    client.gather(held)
    before = CALLS.snapshot()
    again = sweep.run(client, store=False, progress=False)
    assert CALLS.snapshot() - before == Counter()
    assert again.ok and again.computed == 0 and again.hits == 0
    assert again.in_memory == len(planned) == first.computed
    assert {s: c["in_memory"] for s, c in again.by_stage.items()} == {
        s: c["computed"] for s, c in first.by_stage.items()
    }
    assert f"{len(planned)} not run as the cluster already held results" in again.summary()
    assert [r["value"] for r in again.records] == [r["value"] for r in first.records]
    del held


def flaky(marker: str) -> str:
    path = Path(marker)
    if not path.exists():
        path.write_text("failed once")
        raise OSError("transient")
    return "ok"


@pytest.mark.parametrize("retries", [-1, 101, 11_429_141_488, 2.0, "3"])
def test_retries_out_of_bounds_are_refused_where_the_stage_is_declared(retries: Any) -> None:
    """A failing stage with 11,429,141,488 retries ran on for ever (the fuzz found it): the
    stage refuses retries outside 0 to MAX_RETRIES, naming them; the bound itself is taken."""
    from daskjobs.sweep.stages import MAX_RETRIES

    with pytest.raises(ValueError, match=r"retries must be a whole number from 0 to 100, got"):
        Sweep("r").stage(flaky, params={"marker": "m"}, retries=retries)
    assert MAX_RETRIES == 100
    Sweep("r").stage(flaky, params={"marker": "m"}, retries=MAX_RETRIES)


def test_retries_annotation_is_honoured(client: Client, tmp_path: Path) -> None:
    sweep = Sweep()
    sweep.stage(flaky, params={"marker": str(tmp_path / "marker")}, retries=1)
    result = sweep.run(client, store=False, progress=False)
    assert result.ok and result.values == ["ok"]

    once = Sweep()
    once.stage(flaky, params={"marker": str(tmp_path / "other")})
    result = once.run(client, store=False, progress=False)
    assert not result.ok and "OSError: transient" in result.failures[0].error


def test_missing_resources_are_warned_about(client: Client) -> None:
    from daskjobs.sweep.diagnosis import warn_missing_resources

    sweep = Sweep()
    sweep.stage(_ident, resources={"TPU": 1}, name="needs_tpu")
    graph = sweep.to_dask(store=False)
    with pytest.warns(RuntimeWarning, match=r"stage 'needs_tpu' needs resources \{'TPU': 1\}"):
        warn_missing_resources(graph, client)


# -- stores that cannot be written ----------------------------------------------------------


def _store_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if "daskjobs store" in str(w.message)]


def test_corrupt_entry_in_a_read_only_store_is_recomputed_not_written(
    client: Client, tmp_path: Path
) -> None:
    store = ResultStore(tmp_path / "store")
    sweep = build(slow=[20])
    first = sweep.run(client, store=store, progress=False)
    key = sweep.stages["crossover"].nodes[1].key
    path = Path(store.root) / store.info(key).payload
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    before = snapshot(tmp_path / "store")

    with read_only(tmp_path / "store"), warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        second = build(slow=[20]).run(client, store=store, progress=False)
    assert second.ok, second.failures  # the stage did not fail...
    assert second.values == first.values and second.recomputed == 1  # ...it was recomputed
    assert second.store_errors == 1
    (message,) = _store_warnings(record)
    assert "could not write 1 result" in message and str(tmp_path / "store") in message
    assert snapshot(tmp_path / "store") == before  # and nothing was written or removed


def test_a_store_that_cannot_be_written_is_reported_once_and_results_returned(
    client: Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    afile = tmp_path / "a-file"
    afile.write_text("not a directory")
    sweep = build(slow=[20, 50])
    with (
        warnings.catch_warnings(record=True) as record,
        caplog.at_level(logging.DEBUG, logger="daskjobs"),
    ):
        warnings.simplefilter("always")
        result = sweep.run(client, store=afile, progress=False)
    assert result.ok and len(result.records) == 12
    assert result.computed == 18 and result.store_errors == 18
    (message,) = _store_warnings(record)  # one warning for the run, not one per stage
    assert f"could not write 18 results to the daskjobs store {afile}" in message
    assert "NotADirectoryError" in message or "FileExistsError" in message
    # Workers say it once too (one process here): the rest go to DEBUG.
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING and "could not" in r.msg]
    assert len(loud) == 1, [r.getMessage() for r in loud]


# -- running without a client ------------------------------------------------------------


def test_run_without_client_starts_and_closes_a_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import distributed

    started: list[LocalCluster] = []

    class Recording(LocalCluster):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            started.append(self)

    monkeypatch.setattr(distributed, "LocalCluster", Recording)
    url = f"memory://{tmp_path.name}"
    sweep = Sweep()
    prices = sweep.stage(make_prices, over=grid(slice=[7]))
    sweep.stage(moving_averages, inputs={"prices": prices}, over=grid(windows=[(5,), (5, 10)]))
    result = run(sweep, store=url, progress=True)
    assert result.ok and result.computed == 3
    assert len(started) == 1 and started[0].status.name == "closed"
    assert started[0].scheduler is not None
    assert len(ResultStore(url).keys()) == 3


# -- the example ---------------------------------------------------------------------------


@pytest.mark.slow
def test_example_second_run_loads_every_feature(tmp_path: Path) -> None:
    store = tmp_path / "store"
    cmd = [sys.executable, str(ROOT / "examples" / "backtest_sweep.py"), "--store", str(store)]
    # small (the counts are the point, not the sizes): one worker process starts faster
    small = ["--slices", "4", "--bars", "5000", "--fast", "5,10", "--slow", "50,100"]
    small += ["--workers", "1", "--json"]
    outs = []
    for costs in ("0,5", "0,5,10", "0,5,10"):
        proc = subprocess.run(
            [*cmd, *small, "--cost-bps", costs],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            check=True,
        )
        outs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first, second, third = outs
    per_cost = 4 * 2 * 2  # slices x fast x slow
    assert first["computed"] == 4 + 4 + 2 * per_cost and first["hits"] == 0
    assert second["feature_hits"] == second["features"] == 4  # every feature loaded
    assert second["feature_computed"] == 0
    assert second["computed"] == per_cost  # only the new cost level ran
    assert third["computed"] == 0 and third["hits"] == 3 * per_cost
    assert first["best"] == second["best"] == third["best"]
    assert {"computed", "hits", "seconds"} <= set(first)


@pytest.mark.slow
def test_example_table_is_aligned_and_best_is_the_best_mean_it_shows(tmp_path: Path) -> None:
    """The text output: each column's header sits over its values (they were about four
    columns off), and "best" is the highest mean of the table (it was one slice's Sharpe
    ratio, printed under a table of means)."""
    import re

    cmd = [
        sys.executable,
        str(ROOT / "examples" / "backtest_sweep.py"),
        *("--store", str(tmp_path / "store"), "--slices", "3", "--bars", "5000"),
        *("--fast", "5,10", "--slow", "50,100,150", "--cost-bps", "0,5", "--workers", "1"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stdout.splitlines()
    cells: dict[tuple[int, int, float], float] = {}
    heads = [i for i, line in enumerate(lines) if line.startswith("cost ")]
    assert len(heads) == 2
    for h in heads:
        header, rule, *rows = lines[h : h + 4]
        assert set(rule) <= {"-", " "}
        ends = [m.end() for m in re.finditer(r"slow=\d+", header)]
        assert len(ends) == 3
        cost = float(header.split()[1])
        for row in rows:
            values = list(re.finditer(r"[+-]\d+\.\d{3}", row))
            assert [m.end() for m in values] == ends, (header, row)  # right-aligned under
            fast = int(row.split()[0].removeprefix("fast="))
            for slow, m in zip((50, 100, 150), values, strict=True):
                cells[(fast, slow, cost)] = float(m.group())
    (best,) = [line for line in lines if line.startswith("best: ")]
    found = re.match(
        r"best: fast=(\d+), slow=(\d+) at cost (\S+) bp, mean Sharpe ([+-]\d+\.\d{3}) over 3 "
        r"slices \(from [+-]\d+\.\d{3} to [+-]\d+\.\d{3}\)$",
        best,
    )
    assert found, best
    point = (int(found[1]), int(found[2]), float(found[3]))
    assert cells[point] == float(found[4]) == max(cells.values())
    # the summary's words for what the sweep's own summary calls it (one name per idea)
    (counts,) = [line for line in lines if line.startswith("computed ")]
    assert "0 upstream stages skipped" in counts, counts


def test_a_connection_broken_while_gathering_is_an_interrupted_sweep(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler lost just as gather fetches the outputs: gather raises the connection's
    error (CommClosedError), not a cancellation. The run ends as one whose futures were
    cancelled (SweepInterrupted, with what ran counted), and the next run loads it all."""
    from distributed import wait
    from distributed.comm.core import CommClosedError

    from daskjobs.sweep import SweepInterrupted

    store = ResultStore(tmp_path / "store")

    def broken_gather(futures: Any, errors: str = "raise") -> Any:
        wait(list(futures.values()))  # every stage ran (and stored its output)
        raise CommClosedError("in <TCP (closed) ConnectionPool.gather local=... remote=...>")

    monkeypatch.setattr(client, "gather", broken_gather)
    with pytest.raises(SweepInterrupted, match="cancelled before they finished") as info:
        build(slow=[20]).run(client, store=store, progress=False)
    monkeypatch.undo()
    partial = info.value.partial
    del info  # its traceback: the first run's keys go once nothing holds their futures
    _wait_forgotten(client, build(slow=[20]).to_dask(store=store).keys)
    assert partial.computed == 3 + 3 + 6 and len(partial.failures) == 6
    assert all("connection to the scheduler broke" in f.error for f in partial.failures)
    again = build(slow=[20]).run(client, store=store, progress=False)
    assert again.ok and again.computed == 0 and again.hits == 6  # every output loaded


def test_a_stage_of_interactive_work_is_annotated_for_the_plugin() -> None:
    sweep = Sweep("interactive")
    sweep.stage(_ident, over=grid(a=[1, 2]), name="quick", job_class="te")
    sweep.stage(_ident, over=grid(b=[1]), name="long")
    graph = sweep.to_dask(store=False)
    classes = {
        (layer.annotations or {}).get("stage"): (layer.annotations or {}).get("job_class")
        for layer in graph.graph.layers.values()
    }
    assert classes == {"quick": "te", "long": None}  # "be" is the default, not written
    with pytest.raises(ValueError, match=r"job_class must be 'te' .* got 'urgent'"):
        Sweep("bad").stage(_ident, over=grid(a=[1]), job_class="urgent")


# -- Ctrl-C ------------------------------------------------------------------------------------

#: A script that runs a sweep on the cluster ``run`` starts (12 quick stages, one that waits
#: for a gate file), with dask's progress bar, as a user runs one from a terminal.
_CTRL_C = """
import sys
sys.path.insert(0, {helpers!r})
import realtasks_sweep
from daskjobs import Sweep, grid

if __name__ == "__main__":
    marks, store = sys.argv[1], sys.argv[2]
    sweep = Sweep("ctrl-c")
    sweep.stage(realtasks_sweep.short, over=grid(x=range(12)), params={{"marks": marks}})
    sweep.stage(realtasks_sweep.long, params={{"marks": marks}})
    result = sweep.run(store=store, progress=True, cluster_kwargs={{"n_workers": 2}})
    print("computed", result.computed, "loaded", result.hits)
"""


def _ctrl_c_sweep(tmp_path: Path) -> tuple[list[str], Path, Path]:
    script = tmp_path / "ctrl_c_sweep.py"
    script.write_text(_CTRL_C.format(helpers=str(HELPERS)))
    marks, store = tmp_path / "marks", tmp_path / "store"
    marks.mkdir()
    return [sys.executable, str(script), str(marks), str(store)], marks, store


@pytest.mark.slow
def test_ctrl_c_of_a_sweep_says_what_is_stored_once_and_a_rerun_loads_it(tmp_path: Path) -> None:
    """SIGINT to a process in ``sweep.run`` (its own cluster, the progress bar showing):
    one SweepKeyboardInterrupt saying how many stages are in the store and that a rerun
    loads them; no traceback of the progress bar or of gather, no warning of dask's about
    results lost as the cluster closes. The next run loads those stages."""
    import os
    import signal

    from realtasks_sweep import wait_for

    cmd, marks, store = _ctrl_c_sweep(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, [ROOT, *FOLDERS]))}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_for(marks / "long-started", timeout=120)  # the long stage runs ...
        for x in range(12):  # ... and every quick one finished
            wait_for(marks / f"short-{x}-0", timeout=120)
        deadline = time.monotonic() + 60
        while len(ResultStore(store).keys()) < 12:  # ... and stored its result
            assert time.monotonic() < deadline, "the quick stages were never stored"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode != 0
    said = [ln for ln in err.splitlines() if "SweepKeyboardInterrupt:" in ln]
    assert len(said) == 1, err
    assert "interrupted (Ctrl-C): 12 of its 13 stages are in the store" in said[0], err
    assert "run the sweep again and it loads them (1 still to compute)" in said[0], err
    assert err.count("Traceback") == 1, err  # the interrupt's own, three frames of daskjobs
    for noise in ("progressbar", "client.py", "During handling", "lose already computed"):
        assert noise not in err, err
    assert not [ln for ln in err.splitlines() if " - WARNING - " in ln or " - ERROR - " in ln]
    # the rerun loads what was stored and computes the one stage left
    (marks / "long-gate").touch()
    rerun = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert "computed 1 loaded 12" in rerun.stdout


@pytest.fixture
def _python_ctrl_c() -> Iterator[None]:
    """Python's own SIGINT handler for the test (a Ctrl-C raises KeyboardInterrupt): importing
    dask_jobqueue 0.9.0, as other tests of this process may, replaces it with one that raises
    SystemExit (dask/dask-jobqueue#696)."""
    import signal

    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, saved)


@pytest.mark.usefixtures("_python_ctrl_c")
def test_ctrl_c_with_a_client_releases_the_runs_futures(client: Client, tmp_path: Path) -> None:
    """Ctrl-C (an interrupt of the main thread, as SIGINT's handler raises it) while
    ``sweep.run`` waits on a cluster of the user's: the run's futures are cancelled and
    released (the client holds none, the scheduler forgets them), and the error says how
    many stages are in the store."""
    import _thread

    import realtasks_sweep
    from realtasks_sweep import wait_for

    from daskjobs.sweep import SweepInterrupted, SweepKeyboardInterrupt

    marks = tmp_path / "marks"
    marks.mkdir()
    sweep = Sweep("ctrl-c-client")
    sweep.stage(realtasks_sweep.short, over=grid(x=range(4)), params={"marks": str(marks)})
    sweep.stage(realtasks_sweep.long, params={"marks": str(marks)})
    graph = sweep.to_dask(store=tmp_path / "store")

    def interrupt() -> None:
        wait_for(marks / "long-started", timeout=60)
        _thread.interrupt_main()

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(SweepKeyboardInterrupt) as info:
        run(graph, client, progress=False)
    err = info.value
    assert isinstance(err, SweepInterrupted) and isinstance(err, KeyboardInterrupt)
    assert not isinstance(err, Exception)  # `except Exception` does not swallow a Ctrl-C
    assert err.stages == 5 and err.stored is not None and err.stored <= 4
    assert err.__cause__ is None and err.__suppress_context__
    del info, err
    assert not set(graph.keys) & set(client.futures)
    (marks / "long-gate").touch()  # the long stage's thread ends; its result is released
    _wait_forgotten(client, graph.keys)


def test_a_plan_lists_its_stages_in_declaration_order_whatever_the_hash_seed() -> None:
    """A run's summary lists its stages as the sweep declares them, every run (the plan
    walked a set of keys, whose order follows the interpreter's string hash seed)."""
    code = (
        f"import sys; sys.path[:0] = {list(map(str, FOLDERS))!r}; from test_sweep import build; "
        "print(list(build(slow=[20, 50]).to_dask(store=False).by_stage))"
    )
    seen = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr[-2000:]
        seen.add(out.stdout.strip())
    assert seen == {"['make_prices', 'moving_averages', 'crossover']"}


def test_every_task_of_a_run_names_its_sweep_and_run() -> None:
    """The ``sweep`` annotation (``name:run``) on every layer of a planned run: what the
    scheduler's snapshot groups a forecast by; two plans are two runs."""
    sweep = build(slow=[20])
    first, second = sweep.to_dask(store=False), sweep.to_dask(store=False)
    for planned in (first, second):
        labels = {layer.annotations["sweep"] for layer in planned.__dask_graph__().layers.values()}
        assert labels == {f"test:{planned.run_id[:8]}"}
    assert first.run_id != second.run_id


# -- stages that cannot be named or sent, a failure logged once ----------------------------------


def _same(x: int) -> int:
    return x


class Scorer:
    def __call__(self, x: int) -> int:
        return x


@pytest.mark.parametrize(
    ("func", "called"),
    [
        (lambda x: x, "a lambda"),
        (functools.partial(_same), "a functools.partial object"),
        (Scorer(), f"a {__name__}.Scorer object"),
    ],
)
def test_a_stage_without_a_usable_name_asks_for_name(func: Any, called: str) -> None:
    sweep = Sweep("s")
    with pytest.raises(ValueError, match="pass name=") as info:
        sweep.stage(func, over=grid(x=[1]))
    assert f"this stage's function is {called}, which does not name a stage" in str(info.value)
    assert sweep.stage(func, over=grid(x=[1]), name="plus").name == "plus"


def test_a_stage_that_is_not_callable_says_so() -> None:
    with pytest.raises(TypeError, match=r"sweep 's': 3 is not callable"):
        Sweep("s").stage(3)  # type: ignore[arg-type]


def _main_function(source: str, name: str) -> Any:
    """A function defined as if in a script's ``__main__`` (pickled by value)."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(source, namespace)
    return namespace[name]


@pytest.fixture(scope="module")
def tcp_client(dashboard_cluster: Any) -> Any:
    from distributed import Client

    with Client(dashboard_cluster) as c:
        yield c


def _submitted(client: Any) -> int:
    return int(client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)))


def test_a_stage_closing_over_a_lock_is_named_before_anything_is_submitted(tcp_client: Any) -> None:
    lock = threading.Lock()

    def guarded(x: int) -> int:
        with lock:
            return x

    sweep = Sweep("s")
    sweep.stage(guarded, over=grid(x=[1, 2]))
    with pytest.raises(TypeError) as info:
        sweep.run(tcp_client, store=False, progress=False)
    message = str(info.value)
    assert message.startswith("stage 'guarded' cannot be sent to the workers: its function ")
    assert "refers to the variable 'lock' it closes over (a _thread.lock)" in message
    assert "cannot pickle '_thread.lock' object" in message
    assert "distributed.Lock('name')" in message and "inside the function" in message
    assert "HLGExpr" not in message
    assert _submitted(tcp_client) == 0


def test_a_script_stage_using_a_global_lock_names_the_global_and_why_it_travels() -> None:
    guarded = _main_function(
        "import threading\nlock = threading.Lock()\n"
        "def guarded(x):\n    with lock:\n        return x\n",
        "guarded",
    )
    sweep = Sweep("s")
    sweep.stage(guarded, over=grid(x=[1]))
    start = time.perf_counter()
    with pytest.raises(TypeError) as info:
        run(sweep, store=False, progress=False)  # no client: raised before a cluster starts
    assert time.perf_counter() - start < 2
    message = str(info.value)
    assert "its function guarded refers to the global 'lock' (a _thread.lock)" in message
    assert "pickled by value" in message and "__main__" in message


def test_a_helper_holding_a_lock_is_followed_to_the_lock() -> None:
    stage = _main_function(
        "import threading\nlock = threading.Lock()\n"
        "def helper(x):\n    with lock:\n        return x\n"
        "def stage(x):\n    return helper(x)\n",
        "stage",
    )
    sweep = Sweep("s")
    sweep.stage(stage, over=grid(x=[1]))
    with pytest.raises(TypeError) as info:
        run(sweep, store=False, progress=False)
    assert (
        "refers to the global 'helper' (a function), which refers to the global 'lock' "
        "(a _thread.lock)" in str(info.value)
    )


class Handle:
    """Tokenizes (so the stage can be keyed) but cannot be pickled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __dask_tokenize__(self) -> str:
        return "handle"


def test_a_parameter_that_cannot_be_pickled_is_named(tcp_client: Any) -> None:
    sweep = Sweep("s")
    sweep.stage(_same, over=grid(x=[1]), params={"conn": Handle()}, name="with_conn")
    with pytest.raises(TypeError) as info:
        sweep.run(tcp_client, store=False, progress=False)
    message = str(info.value)
    assert "stage 'with_conn' cannot be sent to the workers: its parameter 'conn' " in message
    assert f"(a {__name__}.Handle) cannot be pickled" in message
    assert _submitted(tcp_client) == 0


def _fails_on_two(x: int) -> int:
    if x == 2:
        raise ValueError("two is not allowed")
    return x


def test_a_failed_stage_is_logged_once_and_listed_once(
    tcp_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sweep = Sweep("s")
    sweep.stage(_fails_on_two, over=grid(x=[1, 2, 3]))
    with caplog.at_level(logging.INFO):
        result = sweep.run(tcp_client, store=False, progress=False)
    told = [r for r in caplog.records if "two is not allowed" in r.getMessage()]
    assert len(told) == 1, [r.getMessage() for r in told]  # was 2: the worker's, then run()'s
    # the one record (dask's worker log) shows where the stage function raised
    assert 'in _fails_on_two\\n    raise ValueError("two is not allowed")' in told[0].getMessage()
    summary = result.summary()
    assert summary.count("two is not allowed") == 1
    assert "FAILED _fails_on_two(x=2): ValueError: two is not allowed" in summary
    assert "raise ValueError" in result.failures[0].traceback


# -- closing a cluster: no heartbeat traceback ---------------------------------------------------


class SlowHeartbeats(SchedulerPlugin):
    """A scheduler that takes a second to answer a worker's heartbeat (a loaded machine)."""

    name = "slow-heartbeats"

    async def start(self, scheduler: Any) -> None:
        answer = scheduler.handlers["heartbeat_worker"]

        async def slowly(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(1.0)
            return answer(*args, **kwargs)

        scheduler.handlers["heartbeat_worker"] = slowly


_BEATING: list[Any] = []


async def _beat(dask_worker: Any) -> None:
    _BEATING.append(asyncio.ensure_future(dask_worker.heartbeat()))  # in flight for a second


def _close_with_a_heartbeat_in_flight(quiet: bool, caplog: pytest.LogCaptureFixture) -> list[str]:
    from distributed import Client, LocalCluster

    from daskjobs.sweep import quiet_workers

    with (
        caplog.at_level(logging.ERROR, logger="distributed.worker"),
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=False,
            protocol="tcp://",
            dashboard_address=":0",
            scheduler_kwargs={"plugins": [SlowHeartbeats()]},
        ) as cluster,
        Client(cluster) as c,
    ):
        c.run(_beat)
        if quiet:
            quiet_workers(c)
    return [r.getMessage() for r in caplog.records if "during heartbeat" in r.getMessage()]


def test_a_worker_closing_under_its_own_heartbeat_logs_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The cause, shown: distributed's Worker.close aborts its own heartbeat in flight."""
    said = _close_with_a_heartbeat_in_flight(False, caplog)
    assert said and all("Failed to communicate with scheduler during heartbeat" in m for m in said)


def test_quiet_workers_closes_a_cluster_without_the_heartbeat_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert _close_with_a_heartbeat_in_flight(True, caplog) == []


def test_run_quiets_the_workers_of_the_cluster_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    import daskjobs.sweep.running

    quieted: list[Any] = []
    monkeypatch.setattr(daskjobs.sweep.running, "quiet_workers", quieted.append)
    sweep = Sweep("s")
    sweep.stage(_same, over=grid(x=[1]))
    result = run(sweep, store=False, progress=False, cluster_kwargs={"processes": False})
    assert result.ok and len(quieted) == 1
