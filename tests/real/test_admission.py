"""The admission limits (``daskjobs.admission``, :mod:`daskjobs.plugin.admission`) on a
real ``dask scheduler --preload daskjobs.preload``: a graph over a limit (its keys, its
bytes, all its tasks once built, its client's unfinished tasks) is refused with the limit
named, before dask reads it where the limit allows, and the scheduler goes on serving that
client and every other; nothing in its log but one line a refusal. How fast and at what
memory a 10^7-task graph and a 10^9-part job are refused: benchmarks/bench_admission.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import dask.bag as db
import pytest
from distributed import Event, wait
from distributed.client import FutureCancelledError
from realcluster import PROBLEMS, RealCluster
from realtasks import held

from daskjobs import AdmissionRefused, Sweep
from daskjobs.plugin.admission import UnsendableTask, unsendable
from daskjobs.plugin.surgery._internals import ERR_EACH

LIMITS = {"graph-tasks": 500, "graph-bytes": "1MiB", "client-tasks": 800}


def inc(x: int) -> int:
    return x + 1


def _admission(c: Any) -> dict[str, Any]:
    return c.run_on_scheduler(
        lambda dask_scheduler: dask_scheduler.plugins["daskjobs"].status()["admission"]
    )


def _made(prefixes: tuple[str, ...], dask_scheduler: Any) -> int:
    """How many tasks the scheduler holds whose key starts with one of ``prefixes``."""
    return sum(1 for k in dask_scheduler.tasks if str(k).startswith(prefixes))


def test_graphs_over_the_limits_are_refused_and_the_scheduler_serves_on(
    real_cluster: Callable[..., RealCluster], tmp_path: Path
) -> None:
    rc = real_cluster(
        n_workers=1,
        nthreads=2,
        preload="daskjobs.preload",
        config={"daskjobs": {"admission": LIMITS}},
    )
    with rc.client() as c, rc.client() as other:
        # more keys than graph-tasks (a client.map): refused before dask reads the graph,
        # each future raising the refusal
        with pytest.raises(AdmissionRefused) as info:
            c.gather(c.map(inc, range(800), pure=False))
        err = info.value
        assert (err.key, err.limit, err.size) == ("daskjobs.admission.graph-tasks", 500, 800)
        assert "the keys the graph asks for: 800 tasks" in str(err)
        # more keys than dask can be told of one by one: cancelled, carrying the refusal
        assert ERR_EACH < 5000
        with pytest.raises(FutureCancelledError, match=r"daskjobs\.admission\.graph-tasks = 500"):
            c.gather(c.map(inc, range(5000), pure=False))
        # more bytes than graph-bytes
        with pytest.raises(AdmissionRefused, match=r"daskjobs\.admission\.graph-bytes = 1\.0 MiB"):
            c.submit(len, b"x" * 2_000_000, pure=False).result()
        # few keys, many tasks: refused once dask built it, before the plugin ranks it
        bag = db.from_sequence(range(2000), npartitions=1000).map(inc).sum()
        with pytest.raises(AdmissionRefused, match=r"the graph's tasks: [0-9,]{5} tasks"):
            c.compute(bag).result()
        # keys within the limit, tasks over it: refused before dask makes any of its tasks;
        # tasks the scheduler holds already are not the graph's new ones
        feats = [dask.delayed(inc)(i, dask_key_name=f"feat-{i}") for i in range(2)]
        tests = [dask.delayed(inc)(feats[j % 2], dask_key_name=f"bt-{j}") for j in range(499)]
        with pytest.raises(AdmissionRefused, match=r"the graph's tasks: 501 tasks"):
            c.gather(c.compute(tests))
        assert c.run_on_scheduler(_made, ("feat-", "bt-")) == 0
        held_feats = c.persist(feats)
        wait(held_feats)
        again = [dask.delayed(inc)(feats[j % 2], dask_key_name=f"ok-{j}") for j in range(499)]
        assert sum(c.gather(c.compute(again))) == sum(j % 2 + 2 for j in range(499))
        del held_feats
        # an annotation dask cannot send to a worker (it would break the worker's stream)
        with dask.annotate(note=2**70):
            bad = dask.delayed(inc)(1, dask_key_name="unsendable")
        with pytest.raises(
            UnsendableTask,
            match=r"annotation 'note' cannot be sent to a worker \(the integer 1.18e\+21 is beyond",
        ):
            c.compute(bad).result()
        # a sweep whose graph is refused unread says so (its many outputs were cancelled)
        sweep = Sweep("wide")
        sweep.stage(inc, over={"x": list(range(ERR_EACH + 200))})
        with pytest.raises(AdmissionRefused, match=r"refused sweep run .*graph-tasks = 500"):
            sweep.run(c, store=tmp_path / "store", progress=False)
        # a client's unfinished tasks: 400 held, 300 more would make 700 <= 800, 500 not
        release = Event("daskjobs-test-release", client=c)
        waiting = c.map(held, range(400), pure=False)
        more = c.map(held, range(400, 700), pure=False)
        with pytest.raises(AdmissionRefused, match=r"unfinished tasks \(700\)"):
            c.gather(c.map(inc, range(200), pure=False))
        # ... another client's graph is taken (it runs once the held tasks free the threads)
        others = other.map(inc, range(300), pure=False)
        also = other.compute(dask.delayed(inc)(1))
        release.set()
        assert c.gather(waiting + more) == list(range(700))
        assert other.gather(others) == list(range(1, 301)) and also.result() == 2
        # the tasks ended: the client may submit again
        assert c.gather(c.map(inc, range(400), pure=False)) == list(range(1, 401))
        status = _admission(c)
        assert status["refused"] == 8 and status["unfinished"] == 0, status
    log = rc.log("scheduler")
    assert log.count("daskjobs refused a submission") == 8
    problems = [ln for ln in log.splitlines() if PROBLEMS.search(ln)]
    assert problems == [], problems


def test_a_client_cannot_lift_the_operators_limits(
    real_cluster: Callable[..., RealCluster], tmp_path: Path
) -> None:
    """The limits are the scheduler's own config: a client's plugin keywords do not
    change them (the trust model), and a client's config is not read."""
    from daskjobs import JobsPlugin

    rc = real_cluster(
        n_workers=1,
        preload="daskjobs.preload",
        config={"daskjobs": {"admission": LIMITS, "clients": {"replace-plugin": True}}},
    )
    with rc.client() as c:
        c.register_plugin(JobsPlugin(admission={"graph-tasks": None}), name="daskjobs")
        assert _admission(c)["limits"]["graph_tasks"] == 500
        with pytest.raises(AdmissionRefused, match="graph-tasks"):
            c.gather(c.map(inc, range(800), pure=False))


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (2**64, "beyond 64 bits"),
        (-(2**63) - 1, "beyond 64 bits"),
        ({"a": [1, {"b": 2**70}]}, "beyond 64 bits"),
        ("\ud800", "not UTF-8"),
        ({"\udc80": 1}, "not UTF-8"),
        (__import__("threading").Lock(), "cannot be pickled"),
    ],
)
def test_what_dask_cannot_send_to_a_worker_is_named(value: Any, why: str) -> None:
    assert why in (unsendable(value) or "")


def test_what_dask_sends_passes() -> None:
    deep: Any = 1
    for _ in range(20):
        deep = [deep]
    for value in (
        None,
        True,
        2**64 - 1,
        -(2**63),
        1.5,
        float("nan"),
        "é",
        b"\xff",
        (1, "a"),
        {1, 2},
        {"k": deep},
        frozenset({1}),
        Path("x"),
    ):
        assert unsendable(value) is None, value
    nested: Any = 1
    for _ in range(40):
        nested = [nested]
    assert "nested" in (unsendable(nested) or "")
