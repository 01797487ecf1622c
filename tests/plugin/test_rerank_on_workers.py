"""Re-ranking reaches tasks waiting on a worker: dask sends a task with inputs to a worker
as soon as it is runnable, so a stage read from a feature task sits in the worker's ready
heap before any of it finishes. When the stage's model learns, the scheduler sends those
tasks' new priorities to their worker, whose worker plugin re-orders its heaps
(daskjobs/plugin/surgery/_worker_internals.py, Ranker.reestimate, the verb ``reprioritize``)."""

from __future__ import annotations

import contextlib
import time

import dask
import pytest
import realtasks
from conftest import VALIDATE, plugin_cluster
from distributed import Client, Event

from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.surgery import _worker_internals as wi
from daskjobs.plugin.workers.worker import REORDERER_NAME

#: The event that holds the stage's third task (tests/helpers/realtasks.py: its tasks run on real
#: worker processes too, which import them by name).
GATE = realtasks.GATE


def two_stage(
    ns, unit, fn_nap=realtasks.started_nap, fn_gate=realtasks.gated_nap, feature_workers=None
):
    """Five feature tasks read by every task of a stage, one per ``n`` (duration ``unit *
    n``, ``params={"n": n}``, no estimate). Five inputs: dask does not take the stage for
    root tasks (those wait in its queue), so it sends the whole stage to the worker once
    the features are done. The first two run first (user priorities 3 and 2) and teach
    the model; the third (priority 1, a stage of its own) holds the only thread until the test
    lets it go."""
    with dask.annotate(**({"workers": feature_workers} if feature_workers else {})):
        feat = [dask.delayed(fn_nap)(-1 - k, 0.0, dask_key_name=f"feat-{k}") for k in range(5)]
    parts = []
    for i, n in enumerate(ns):
        ann = {"params": {"n": n}}
        if i < 3:
            ann["priority"] = 3 - i
        if i == 2:  # its time is the test's hold: a stage of its own, or it would teach the
            ann["stage"] = "gate"  # model that n=1 is slow (and a loaded machine re-ranks)
        fn = fn_gate if i == 2 else fn_nap
        with dask.annotate(**ann):
            parts.append(dask.delayed(fn)(i, unit * n, *feat, dask_key_name=f"job-{i}"))
    return parts


def until(what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


NS = [1, 2, 1] + [1, 8] * 4


def test_a_reranked_task_waiting_on_a_worker_runs_in_the_new_order():
    with (
        dask.config.set(VALIDATE),
        plugin_cluster(JobsPlugin(policy="critical-path")) as cl,
        Client(cl) as c,
    ):
        p = cl.scheduler.plugins["daskjobs"]
        until(lambda: len(p.ranker.reorders) == 1)  # the worker takes new priorities
        futs = c.compute(two_stage(NS, unit=0.01))
        # the sweep's tasks all went to the worker before any finished
        until(lambda: p.ranker.reranked_on_workers > 0)
        worker = next(iter(cl.workers.values()))
        reorderer = worker.plugins[REORDERER_NAME]
        until(lambda: reorderer.reordered > 0)

        def on_worker() -> list[int]:  # the waiting tasks' sizes in the worker's order
            tasks = worker.state.tasks
            waiting = [i for i in range(3, len(NS)) if f"job-{i}" in tasks]
            return [NS[i] for i in sorted(waiting, key=lambda i: tasks[f"job-{i}"].priority)]

        # a re-rank after the first observation alone has no slope to rank by: wait for
        # the one that has (it reaches the worker a message later, under load a while later)
        until(lambda: on_worker() == [8, 8, 8, 8, 1, 1, 1, 1])
        Event(GATE, client=c).set()
        order = [i for _, i in sorted(c.gather(futs))]
        assert order[:3] == [0, 1, 2]
        rest = [NS[i] for i in order[3:]]
        assert rest == [8, 8, 8, 8, 1, 1, 1, 1], rest  # longest first, as re-ranked
        assert p.errors == {} and reorderer.failures == 0
        events = [e for _, e in c.get_events("daskjobs") if e.get("action") == "reestimated"]
        assert any(e["on_workers"] > 0 for e in events)


def test_without_the_worker_plugin_tasks_on_workers_keep_their_place():
    """A worker that did not say it takes the message gets none (its stream would close
    on an unknown message): its tasks keep dask's order, and nothing breaks."""
    with (
        dask.config.set(VALIDATE),
        plugin_cluster(JobsPlugin(policy="critical-path")) as cl,
        Client(cl) as c,
    ):
        p = cl.scheduler.plugins["daskjobs"]
        until(lambda: len(p.ranker.reorders) == 1)
        p.ranker.reorders.clear()  # as if the worker's self-check had failed
        futs = c.compute(two_stage(NS, unit=0.01))

        def job_learned() -> bool:  # the stage's re-ranks were due (at its 1st and 2nd end)
            m = p.ranker.estimator.models.model("job")
            return m is not None and m.seen >= 2

        until(job_learned)
        Event(GATE, client=c).set()
        order = [i for _, i in sorted(c.gather(futs))]
        sent = {i: cl.scheduler.tasks[f"job-{i}"].priority for i in range(3, len(NS))}
        assert order[3:] == sorted(sent, key=sent.__getitem__)  # the priority they came with
        assert [NS[i] for i in order[3:]] != [8, 8, 8, 8, 1, 1, 1, 1]  # (not by chance)
        assert p.ranker.reranked_on_workers == 0 and p.errors == {}


def test_the_worker_verb_moves_tasks_both_ways_and_skips_started_ones():
    assert wi.check_worker_verbs() == []


def test_the_worker_self_check_fails_when_heaps_keep_old_places(monkeypatch):
    """Without rebuilding the heap, a task moved back still pops at its old place: the
    self-check names the verb."""
    real = wi.reorder

    def no_rebuild(state, rows):
        n = 0
        for key, priority in rows:
            ts = state.tasks.get(key)
            if ts is not None and ts.state in wi.REORDERABLE:
                ts.priority = tuple(priority)
                n += 1
        return n

    monkeypatch.setattr(wi, "reorder", no_rebuild)
    problems = wi.check_worker_verbs()
    assert problems and problems[0].startswith("reorder"), problems
    monkeypatch.setattr(wi, "reorder", real)


@pytest.mark.realcluster
def test_a_reranked_stage_on_real_worker_processes(real_cluster):
    rc = real_cluster(n_workers=1, nthreads=1, config={"daskjobs": {"policy": "critical-path"}})
    with rc.client() as c:
        from daskjobs.plugin.client import status

        until(lambda: c.run_on_scheduler(_reorders) == 1)
        futs = c.compute(two_stage(NS, 0.01))
        until(lambda: c.run_on_scheduler(_on_workers) > 0)
        until(lambda: sum(c.run(_reordered).values()) > 0)
        # the re-rank with a slope (after the second observation) has reached the worker
        until(lambda: list(c.run(_sizes_on_worker).values()) == [[8, 8, 8, 8, 1, 1, 1, 1]])
        Event(realtasks.GATE, client=c).set()
        order = [i for _, i in sorted(c.gather(futs))]
        assert order[:3] == [0, 1, 2]
        assert [NS[i] for i in order[3:]] == [8, 8, 8, 8, 1, 1, 1, 1]
        assert status(c)["errors"] == {}
    rc.close()
    assert rc.problems() == []


def _reorders(dask_scheduler):
    return len(dask_scheduler.plugins["daskjobs"].ranker.reorders)


def _on_workers(dask_scheduler):
    return dask_scheduler.plugins["daskjobs"].ranker.reranked_on_workers


def _reordered(dask_worker):
    return dask_worker.plugins[REORDERER_NAME].reordered


def _sizes_on_worker(dask_worker):
    """The sizes (``NS``) of the stage's tasks waiting on this worker, in its order."""
    tasks = dask_worker.state.tasks
    waiting = [i for i in range(3, len(NS)) if f"job-{i}" in tasks]
    return [NS[i] for i in sorted(waiting, key=lambda i: tasks[f"job-{i}"].priority)]


def where(i, seconds, *deps):
    from distributed import get_worker

    t = time.time()
    time.sleep(seconds)
    return (t, i, get_worker().name)


def gate_where(i, seconds, *deps):
    from distributed import get_worker

    t = time.time()
    assert Event(GATE).wait(timeout=60)
    return (t, i, get_worker().name)


@contextlib.contextmanager
def two_workers(arguments: bool = True):
    """Two in-process workers taking new priorities, dask's own balancing off (a stealing
    interval of an hour): the client, the plugin, the first worker's address, and each
    worker's name by address. ``arguments``: the plugin's ``estimates.arguments``."""
    cfg = {**VALIDATE, "distributed.scheduler.work-stealing-interval": "1h"}
    plugin = JobsPlugin(policy="critical-path", estimates={"arguments": arguments})
    with (
        dask.config.set(cfg),
        plugin_cluster(plugin, n_workers=2) as cl,
        Client(cl) as c,
    ):
        p = cl.scheduler.plugins["daskjobs"]
        until(lambda: len(p.ranker.reorders) == 2)
        first = sorted(cl.scheduler.workers)[0]
        yield c, p, first, {a: ws.name for a, ws in cl.scheduler.workers.items()}


def test_a_reranked_stage_held_by_one_worker_is_spread_by_its_estimates():
    """All of the stage waits on worker 0 (its inputs are there, and dask places a task
    with inputs only where they are; dask's own balancing is off: a stealing interval of
    an hour); worker 1 is idle. When the stage is re-ranked, the plugin moves waiting
    tasks to worker 1 by their estimates (daskjobs.policies.balance), which runs them:
    nothing else could have put a task of the stage there."""
    with two_workers() as (c, p, first, name):
        parts = two_stage(NS, 0.01, where, gate_where, feature_workers=[first])
        futs = c.compute(parts)
        until(lambda: p.ranker.moved > 0)
        Event(GATE, client=c).set()
        ran = {i: w for _, i, w in c.gather(futs)}
        elsewhere = sorted(i for i, w in ran.items() if w != name[first])
        assert 0 < len(elsewhere) <= p.ranker.moved, (ran, p.ranker.moved)
        assert p.errors == {}
        events = [e for _, e in c.get_events("daskjobs") if e.get("action") == "reestimated"]
        assert sum(e["moved"] for e in events) == p.ranker.moved


def test_a_stage_without_parameters_is_reranked_but_not_moved():
    """The same graph without ``params`` and with ``estimates.arguments`` off (so that its
    tasks' arguments are not parameters either): its stage's estimates move (the default,
    then the median measured), and the re-rank reaches the worker, but no parameter model
    ranks it, so nothing moves: a graph whose stage has no parameters keeps dask's
    placement (worker 1 stays idle with dask's balancing off)."""
    with two_workers(arguments=False) as (c, p, first, name):
        with dask.annotate(workers=[first]):
            feat = [dask.delayed(where)(-1 - k, 0.0, dask_key_name=f"feat-{k}") for k in range(5)]
        parts = []
        for i, n in enumerate(NS):
            fn = gate_where if i == 2 else where
            with dask.annotate(**({"priority": 3 - i} if i < 3 else {})):
                parts.append(dask.delayed(fn)(i, 0.01 * n, *feat, dask_key_name=f"job-{i}"))
        futs = c.compute(parts)
        until(lambda: p.ranker.reranked_on_workers > 0)
        Event(GATE, client=c).set()
        ran = {i: w for _, i, w in c.gather(futs)}
        assert set(ran.values()) == {name[first]}, ran
        assert p.ranker.moved == 0 and p.errors == {}
        events = [e for _, e in c.get_events("daskjobs") if e.get("action") == "reestimated"]
        assert events and all(e["moved"] == 0 for e in events)
