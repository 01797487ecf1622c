"""dask's ordering promises, kept by the plugin under its default configuration
(docs/explanation/dask-promises.md): ``priority=`` first; a later ``compute``/``persist`` never
starving an earlier one of the same priority; dask's own order among tasks without
estimates. distributed's own tests of them run with the preload through
``benchmarks/dask_suite.py``; these are ours."""

from __future__ import annotations

import time

import dask
from conftest import VALIDATE, plugin_cluster
from distributed import Client, Event

from daskjobs.plugin import JobsPlugin


def stamp(i):
    t = time.time()
    time.sleep(0.01)
    return (t, i)


def wait_for(event_name):
    Event(event_name).wait()
    return "released"


def priorities(c, keys):
    """The scheduler's priority of each key, once all have reached it (a compute is
    sent asynchronously)."""

    def get(dask_scheduler, keys=keys):
        tasks = dask_scheduler.tasks
        if not all(k in tasks and tasks[k].priority for k in keys):
            return None
        return {k: tuple(tasks[k].priority) for k in keys}

    while (out := c.run_on_scheduler(get)) is None:
        time.sleep(0.01)
    return out


def test_user_priority_first_whatever_the_estimates():
    """A task of priority 10 starts before any of priority 0, though the policy would
    rank the others first (longer estimates), on one thread held until all are in. (One
    task group, ``t``, so that all wait in dask's queue: a task of a small group of its
    own goes to a worker at once, in dask as with the plugin.)"""
    with dask.config.set(VALIDATE), plugin_cluster(JobsPlugin()) as cl, Client(cl) as c:
        block = c.submit(wait_for, "go", key="block")
        parts = []
        for i in range(5):
            with dask.annotate(estimate=100.0 + i):
                parts.append(dask.delayed(stamp)(i, dask_key_name=f"t-{i}"))
        with dask.annotate(priority=10, estimate=0.1):
            parts.append(dask.delayed(stamp)(99, dask_key_name="t-99"))
        with dask.annotate(priority=-1, estimate=1000.0):
            parts.append(dask.delayed(stamp)(-1, dask_key_name="t-100"))
        futs = c.compute(parts)
        Event("go", client=c).set()
        block.result()
        order = [i for _, i in sorted(c.gather(futs))]
        assert order[0] == 99 and order[-1] == -1, order
        assert order[1:-1] == [4, 3, 2, 1, 0]  # the policy's order within priority 0


def test_a_graph_without_estimates_runs_in_dasks_order():
    """The graph of distributed's test_repeated_persists_same_priority: without
    estimates the default policy (critical path) would run every x before any y (all
    of the same default estimate, the x's on the longer path); kept, every task has
    the same rank and dask's order interleaves them."""
    with dask.config.set(VALIDATE), plugin_cluster(JobsPlugin()) as cl, Client(cl) as c:
        xs = [dask.delayed(stamp)(f"x{i}", dask_key_name=f"x{i}") for i in range(5)]
        ys = [dask.delayed(stamp)(x, dask_key_name=f"y{i}") for i, x in enumerate(xs)]
        block = c.submit(wait_for, "go2", key="block2")
        futs = c.compute(ys, optimize_graph=False)
        keys = [f"x{i}" for i in range(5)] + [f"y{i}" for i in range(5)]
        prio = priorities(c, keys)
        assert len({p[:2] for p in prio.values()}) == 1  # one rank, one user priority
        Event("go2", client=c).set()
        block.result()
        c.gather(futs)
        # dask's order alone decides: depth first, each y right after its x
        by_dask = sorted(keys, key=lambda k: prio[k])
        assert [by_dask.index(f"y{i}") - by_dask.index(f"x{i}") for i in range(5)] == [1] * 5


def test_two_persists_of_the_same_priority_interleave():
    """Two persists that dask counts as submitted together (one generation): the
    second's tasks share the first's rank, so dask's order interleaves them."""
    with dask.config.set(VALIDATE), plugin_cluster(JobsPlugin()) as cl, Client(cl) as c:
        xs = [dask.delayed(stamp)(f"x{i}", dask_key_name=f"x{i}") for i in range(4)]
        ys = [dask.delayed(stamp)(x, dask_key_name=f"y{i}") for i, x in enumerate(xs)]
        zs = [dask.delayed(stamp)(x, dask_key_name=f"z{i}") for i, x in enumerate(xs)]
        ys = c.persist(ys, optimize_graph=False)
        zs = c.persist(zs, optimize_graph=False)
        prio = priorities(c, ["y0", "z0", "y3", "z3"])
        assert prio["y0"][:3] == prio["z0"][:3] and prio["y3"][:3] == prio["z3"][:3]
        c.gather(ys + zs)


def test_a_later_graph_overtakes_an_earlier_one_only_by_its_gain():
    """An earlier graph of estimate 0.1 s, then (0.5 s later, a new generation: the
    ``fifo_timeout`` of 0 s) a graph of 0.3 s: the later one gains 0.2 s by its
    estimate but came 0.5 s later, so it sorts after; a later graph whose estimate
    gains more than the time between them sorts first (the policy's own order). No
    later graph overtakes an earlier one that has waited longer than the gain: it
    cannot starve it."""
    with dask.config.set(VALIDATE), plugin_cluster(JobsPlugin()) as cl, Client(cl) as c:
        with dask.annotate(estimate=0.1):
            a = c.persist(dask.delayed(stamp)("a", dask_key_name="a"))
        time.sleep(0.5)
        with dask.annotate(estimate=0.3):
            b = c.persist(dask.delayed(stamp)("b", dask_key_name="b"), fifo_timeout="0s")
        with dask.annotate(estimate=60.0):
            big = c.persist(dask.delayed(stamp)("big", dask_key_name="big"), fifo_timeout="0s")
        prio = priorities(c, ["a", "b", "big"])
        assert prio["a"] < prio["b"]  # waited 0.5 s > 0.2 s gained
        assert prio["big"] < prio["a"]  # gains 59.9 s: the policy's longest first
        assert prio["a"][2] < prio["b"][2] < prio["big"][2]  # three dask generations
        c.gather([a, b, big])
