"""Deferred re-ranks (daskjobs/plugin/ranking.py, Ranker.reestimate / settle / current): a
stage without ``params`` that is all that waits shares one estimate, so a re-rank could change
no order; it waits until something could be ordered against the stage (a new graph, a task
back to wait, a worker change) or reads its views (explain, status, metrics), and a task that
stops waiting takes the estimate the re-rank would have given it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import dask
import realtasks
from conftest import VALIDATE, plugin_cluster
from distributed import Client, Event
from waiting import until

from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.client import explain

GATE = "deferred-rerank-gate"
N = 30
HELD = 10  # A-10 waits for the gate: ten of the stage's tasks have ended by then


def step(i: int, gate: str | None) -> int:
    if gate is not None:
        Event(gate).wait(timeout=120)
    time.sleep(0.01)
    return i


def stage_a() -> list[Any]:
    return [
        dask.delayed(step)(i, GATE if i == HELD else None, dask_key_name=f"A-{i}") for i in range(N)
    ]


@contextlib.contextmanager
def lpt_client() -> Iterator[Client]:
    """A client of an in-process cluster (one worker, one thread) whose scheduler runs the
    plugin with ``lpt`` and dask's validation on. Tasks are staged by key prefix, without
    parameters (``estimates.arguments`` off: ``step``'s arguments would be parameters)."""
    with (
        dask.config.set(VALIDATE),
        plugin_cluster(JobsPlugin(policy="lpt", estimates={"arguments": False})) as cl,
        Client(cl) as c,
    ):
        yield c


def plugin_of(client: Client) -> Any:
    return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["daskjobs"])


def waiting_views(p: Any) -> list[Any]:
    return [p.ranker.tasks[k] for k in p.ranker.waiting.get("A", {}) if k != f"A-{HELD}"]


def held_until_deferred(c: Client) -> tuple[Any, list[Any]]:
    """Stage A runs until A-10 holds the one thread; by then its re-ranks were deferred."""
    futs = c.compute(stage_a())
    p = plugin_of(c)
    until(lambda: p.ranker.deferrals > 0 and len(waiting_views(p)) < N - HELD, "a deferral")

    def ended(dask_scheduler: Any) -> int:
        return sum(dask_scheduler.tasks[f"A-{i}"].state == "memory" for i in range(N))

    until(lambda: c.run_on_scheduler(ended) >= HELD, "ten ends")
    assert p.ranker.reestimated == 0  # no waiting task was visited
    e = p.ranker.deferred["A"]
    assert e.source == "history" and e.seconds < 0.5  # 10 ms tasks; the default is 1 s
    stale = waiting_views(p)
    assert stale and {v.source for v in stale} == {"default"}  # not given yet
    return futs, stale


def ranks_agree(c: Client, p: Any) -> None:
    """Every waiting task of A has the stage's learned estimate, and dask's priority holds
    the rank lpt gives that estimate, aged by its generation (as an eager re-rank sets)."""

    def ranks(dask_scheduler: Any) -> list[tuple[float, float, float, str]]:
        # read in one call on the scheduler's loop: a task that ends meanwhile cannot
        # leave the views and the priorities read at different moments
        r = dask_scheduler.plugins["daskjobs"].ranker
        out = []
        for k in r.waiting.get("A", {}):
            if k != f"A-{HELD}":
                prio, view = dask_scheduler.tasks[k].priority, r.tasks[k]
                out.append((prio[1], r._ages[prio[2]], view.estimate, view.source))
        return out

    read = c.run_on_scheduler(ranks)
    assert read and {source for *_, source in read} == {"history"}
    for rank, age, estimate, _ in read:
        assert abs(rank - (age - estimate)) < 1e-9


def test_one_stage_alone_defers_and_explain_settles():
    with lpt_client() as c:
        futs, stale = held_until_deferred(c)
        p = plugin_of(c)
        info = explain(c, stale[-1].tid)  # reads a waiting task: settles first
        assert info["estimate_source"] == "history"
        assert p.ranker.deferred == {} and p.ranker.reestimated >= len(stale)
        ranks_agree(c, p)
        Event(GATE, client=c).set()
        c.gather(futs)
        assert p.errors == {}


def test_a_new_graph_settles_the_deferred_stage_before_it_is_ranked():
    with lpt_client() as c:
        futs, _ = held_until_deferred(c)
        p = plugin_of(c)
        with dask.annotate(estimate=0.2):
            other = [dask.delayed(step)(i, None, dask_key_name=f"B-{i}") for i in range(3)]
        more = c.compute(other)
        until(lambda: p.ranker.ranked_graphs >= 2, "the second graph ranked")
        assert p.ranker.deferred == {}
        ranks_agree(c, p)
        Event(GATE, client=c).set()
        c.gather(futs + more)
        assert p.errors == {}


def test_a_task_that_ends_under_a_deferral_takes_its_estimate():
    """What the speeds learn from, and what the view of an ended task says, is the estimate
    the deferred re-rank would have given it, not the one it was submitted with."""
    with lpt_client() as c:
        futs, stale = held_until_deferred(c)
        p = plugin_of(c)
        Event(GATE, client=c).set()
        c.gather(futs)
        assert p.ranker.deferrals > 1  # more re-ranks deferred after the gate opened
        assert p.ranker.reestimated == 0  # and none of them visited the waiting tasks
        ended = [p.ranker.tasks[v.tid] for v in stale]
        assert {v.source for v in ended} == {"history"}
        assert all(v.samples > 0 for v in ended)  # learned from ended tasks
        assert p.errors == {}


def test_a_parameter_stage_is_never_deferred():
    """A stage whose tasks carry ``params`` has a model that tells them apart: its waiting
    tasks are re-ranked at once (tests/plugin/test_estimates_live.py has the order)."""
    with lpt_client() as c:
        parts = []
        for i in range(20):
            with dask.annotate(params={"n": i % 4}):
                parts.append(dask.delayed(step)(i, None, dask_key_name=f"P-{i}"))
        c.compute(parts, sync=True)
        p = plugin_of(c)
        assert p.ranker.deferrals == 0 and p.ranker.reestimated > 0
        assert p.errors == {}


# -- real processes ------------------------------------------------------------------------


def _deferral(dask_scheduler: Any) -> dict[str, Any]:
    r = dask_scheduler.plugins["daskjobs"].ranker
    return {
        "deferrals": r.deferrals,
        "deferred": sorted(r.deferred),
        "reorders": len(r.reorders),
        "workers": len(dask_scheduler.workers),
        "ended": sum(ts.state == "memory" for ts in dask_scheduler.tasks.values()),
        "errors": dict(dask_scheduler.plugins["daskjobs"].errors),
    }


def _sources(dask_scheduler: Any) -> dict[str, str]:
    r = dask_scheduler.plugins["daskjobs"].ranker
    return {k: r.tasks[k].source for k in r.waiting.get("K", {})}


def _holding(dask_scheduler: Any, key: str) -> str:
    ts = dask_scheduler.tasks[key]
    return ts.processing_on.name if ts.processing_on is not None else ""


def test_a_worker_killed_under_a_deferral_on_real_processes(real_cluster):
    """A real scheduler (validate on) and two worker processes of one thread: a stage of
    10 ms tasks runs until two gated tasks hold both threads, every re-rank deferred; then
    one worker is SIGKILLed. Its gated task comes back to wait, which gives the deferred
    re-rank before that task is ranked again: the waiting tasks hold the learned estimate.
    The gate opens, the survivor runs everything, and every result is there once."""
    n, gates = 40, (10, 11)
    rc = real_cluster(
        n_workers=2,
        nthreads=1,
        config={"daskjobs": {"policy": "lpt", "estimates": {"arguments": False}}},
    )
    with rc.client() as c:
        until(lambda: c.run_on_scheduler(_deferral)["reorders"] == 2, "both workers reorder")
        parts = [
            dask.delayed(realtasks.gated_nap if i in gates else realtasks.started_nap)(
                i, 0.01, dask_key_name=f"K-{i}"
            )
            for i in range(n)
        ]
        futs = c.compute(parts)
        until(lambda: c.run_on_scheduler(_deferral)["ended"] >= gates[0], "ten ends")
        until(
            lambda: all(c.run_on_scheduler(_holding, key=f"K-{g}") for g in gates),
            "both threads held",
        )
        before = c.run_on_scheduler(_deferral)
        assert before["deferrals"] > 0 and before["deferred"] == ["K"], before
        assert set(c.run_on_scheduler(_sources).values()) == {"default"}  # not given yet

        victim = c.run_on_scheduler(_holding, key=f"K-{gates[1]}")
        rc.kill_worker(victim)
        until(lambda: c.run_on_scheduler(_deferral)["workers"] == 1, "the kill seen")
        # nothing ended since (both gates hold): no new deferral, the old one was given
        after = c.run_on_scheduler(_deferral)
        assert after["deferred"] == [] and after["errors"] == {}, after
        assert set(c.run_on_scheduler(_sources).values()) == {"history"}

        Event(realtasks.GATE, client=c).set()
        results = c.gather(futs)
        assert sorted(i for _, i in results) == list(range(n))
        assert c.run_on_scheduler(_deferral)["errors"] == {}
    assert rc.problems() == []
