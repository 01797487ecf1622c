"""Two clusters sharing a result store compute a shared stage once (daskjobs.cache.claims).

Each test releases the feature stage only once the second cluster's task is waiting on
the first one's claim, so the claim, not luck, decides who computes.
"""

from __future__ import annotations

from pathlib import Path

import dask
import pytest
from claim_tasks import backtest, features, markers
from distributed import Client, LocalCluster
from realcluster import in_thread
from waiting import until

from daskjobs import ResultStore, Sweep, grid
from daskjobs.cache.claims import Claims


def build(folder: Path) -> Sweep:
    sweep = Sweep("claims")
    feats = sweep.stage(features, over=grid(slice=[0]), params={"folder": str(folder)})
    sweep.stage(backtest, inputs={"features": feats}, over=grid(fast=[1, 2, 3]))
    return sweep


def feature_processing(client: Client) -> bool:
    """Whether the cluster of ``client`` runs a features task (here: waits on a claim)."""
    return any("features" in str(key) for keys in client.processing().values() for key in keys)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["local", "memory"])
def test_two_clusters_sharing_a_store_compute_a_shared_stage_once(tmp_path, kind):
    folder = tmp_path / "marks"
    folder.mkdir()
    url = str(tmp_path / "store") if kind == "local" else f"memory://claims-{tmp_path.name}"
    store = ResultStore(url)
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
        ) as ca,
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
        ) as cb,
        Client(ca, set_as_default=False) as a,
        Client(cb, set_as_default=False) as b,
    ):
        ta, ra = in_thread(lambda: build(folder).run(a, store=store, progress=False))
        until(lambda: markers(str(folder), "started"), "cluster a to start the feature stage")
        tb, rb = in_thread(lambda: build(folder).run(b, store=store, progress=False))
        until(lambda: feature_processing(b), "cluster b's feature task")
        latest = until(lambda: Claims(store).ls(), "cluster a's claim")[0]
        assert latest.token == 1 and latest.live() and latest.cluster == ca.scheduler.address
        (folder / "release").touch()
        ta.join(120)
        tb.join(120)
    assert "error" not in ra and "error" not in rb, (ra.get("error"), rb.get("error"))
    first, second = ra["result"], rb["result"]
    assert first.ok and second.ok
    assert len(markers(str(folder), "started")) == 1  # computed once, by cluster a
    assert first.by_stage["features"] == {"computed": 1, "hits": 0, "in_memory": 0}
    assert second.by_stage["features"] == {"computed": 0, "hits": 1, "in_memory": 0}
    # the backtests too: each computed once over both clusters, by whichever claimed it first
    # (a's, dispatched as its feature stage ended, race b's, dispatched once b saw the commit),
    # and loaded by the other
    backtests = [first.by_stage["backtest"], second.by_stage["backtest"]]
    assert sum(b["computed"] for b in backtests) == 3, backtests
    assert sum(b["hits"] for b in backtests) == 3, backtests
    assert sorted(r["value"]["sharpe"] for r in first.records) == sorted(
        r["value"]["sharpe"] for r in second.records
    )
    assert Claims(store).ls() == []  # committed: no claim left behind
    stored = store.keys()
    assert len([k for k in stored if k.startswith("features")]) == 1 and len(stored) == 4


@pytest.mark.realcluster
def test_the_owning_worker_killed_mid_stage_the_other_cluster_takes_over(tmp_path, real_cluster):
    folder = tmp_path / "marks"
    folder.mkdir()
    store = ResultStore(tmp_path / "store")
    rc = real_cluster(n_workers=1, nthreads=2, preload=None)
    with (
        dask.config.set({"daskjobs.claims.lease": "1s"}),
        rc.client() as a,
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
        ) as cb,
        Client(cb, set_as_default=False) as b,
    ):
        ta, ra = in_thread(lambda: build(folder).run(a, store=store, progress=False))
        until(lambda: markers(str(folder), "started"), "cluster a to start the feature stage")
        tb, rb = in_thread(lambda: build(folder).run(b, store=store, progress=False))
        until(lambda: feature_processing(b), "cluster b's feature task")
        rc.kill_worker("w0")  # SIGKILL: its claim stops being renewed
        (folder / "release").touch()
        tb.join(120)
        assert "error" not in rb, rb.get("error")
        # cluster b took the claim over (token 2) once the lease ran out, and computed it
        assert rb["result"].ok and rb["result"].by_stage["features"] == {
            "computed": 1,
            "hits": 0,
            "in_memory": 0,
        }
        assert len(markers(str(folder), "finished")) == 1
        # cluster a gets a worker again: its task now finds the entry and loads it
        rc.start_worker("w1")
        ta.join(120)
    assert "error" not in ra, ra.get("error")
    assert ra["result"].ok and ra["result"].by_stage["features"] == {
        "computed": 0,
        "hits": 1,
        "in_memory": 0,
    }
    assert len(markers(str(folder), "started")) == 2  # a's killed attempt and b's
    assert len(markers(str(folder), "finished")) == 1  # one computation completed
    stored = store.keys()
    assert len([k for k in stored if k.startswith("features")]) == 1
    assert Claims(store).ls() == []
    assert sorted(r["value"]["sharpe"] for r in ra["result"].records) == sorted(
        r["value"]["sharpe"] for r in rb["result"].records
    )
    assert not rc.problems(ignore=["w0"]), rc.problems(ignore=["w0"])
