"""Learned estimates across processes: a sweep's measured durations, with its parameters,
reach the scheduler from real worker processes, are saved by a ``dask scheduler --preload``
process and read by the next one, whose ranking of an unannotated sweep follows them."""

from __future__ import annotations

import json

import dask
import pytest
import realtasks

from daskjobs.plugin.client import explain, status


def sweep(ns, first, unit=0.02, fn=realtasks.nap):
    parts = []
    for i, n in enumerate(ns, start=first):
        with dask.annotate(params={"n": n}):
            parts.append(dask.delayed(fn)(i, unit * n, dask_key_name=f"job-{i}"))
    return parts


@pytest.mark.realcluster
def test_history_learned_on_real_processes_ranks_the_next_schedulers_sweep(real_cluster, tmp_path):
    history = tmp_path / "history.json"
    config = {"daskjobs": {"policy": "critical-path", "history": {"path": str(history)}}}
    rc = real_cluster(n_workers=1, nthreads=1, config=config)
    with rc.client() as c:
        c.compute(sweep([1, 2, 4, 8, 1, 2, 4, 8], first=0), sync=True)
        assert status(c)["stages"]["job"]["samples"] == 8
    rc.close()  # the scheduler saves its history as it closes
    assert rc.problems() == []
    rows = json.loads(history.read_text())["stages"]["job"]
    assert sorted(r[0]["n"] for r in rows) == [1, 1, 2, 2, 4, 4, 8, 8]

    rc2 = real_cluster(n_workers=1, nthreads=1, config=config)
    with rc2.client() as c:
        ns = [1, 1, 1, 8, 1, 1, 8, 1]
        futs = c.compute(sweep(ns, first=100, unit=0.01, fn=realtasks.timed))
        starts = [start for _, start, _ in c.gather(futs)]
        order = [100 + i for i in sorted(range(len(ns)), key=starts.__getitem__)]
        # one thread: the two tasks predicted longest run first, from the first task on
        assert sorted(order[:2]) == [103, 106], order
        info = explain(c, "job-103")
        assert info["estimate_source"] == "model"
        assert info["estimate"] > 3 * explain(c, "job-100")["estimate"]
        low, high = info["estimate_band"]
        assert low <= info["estimate"] <= high
    rc2.close()
    assert rc2.problems() == []
