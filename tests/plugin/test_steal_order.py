"""dask's work stealing moves a victim's best-ranked waiting task, not any
(``daskjobs.plugin.surgery._internals.steal_in_order``; the figures before and after:
``benchmarks/bench_steal_order.py``, docs/benchmarks.md)."""

from __future__ import annotations

import time

import dask
import pytest
from conftest import VALIDATE, plugin_cluster
from distributed import Client, Event

from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.surgery._internals import steal_in_order


def wait_for(name):
    Event(name).wait()
    return name


def echo(i):
    return i


def _steal(dask_scheduler, key):
    """Ask dask's stealing to move ``key`` from the worker running ``block`` to the
    other; return what this request moves."""
    stealing = dask_scheduler.extensions["stealing"]
    victim = dask_scheduler.tasks["block"].processing_on
    thief = next(ws for ws in dask_scheduler.workers.values() if ws is not victim)
    before = set(stealing.in_flight)
    stealing.move_task_request(dask_scheduler.tasks[key], victim, thief)
    return sorted(str(ts.key) for ts in set(stealing.in_flight) - before)


def _stealable(dask_scheduler, keys):
    stealable = dask_scheduler.extensions["stealing"].key_stealable
    return all(dask_scheduler.tasks[k] in stealable for k in keys)


def _in_order(dask_scheduler):
    stealing = dask_scheduler.extensions["stealing"]
    return "move_task_request" in vars(stealing)


@pytest.mark.parametrize("in_order", [True, False], ids=["plugin-order", "dask-order"])
def test_stealing_moves_the_best_ranked_waiting_task(in_order):
    config = {
        **VALIDATE,
        "distributed.scheduler.worker-saturation": float("inf"),  # all sent at once
        "distributed.scheduler.work-stealing-interval": "1h",  # balance when we say
    }
    with dask.config.set(config), plugin_cluster(JobsPlugin(policy="lpt")) as cl, Client(cl) as c:
        assert c.run_on_scheduler(_in_order)  # the plugin put it in place
        if not in_order:
            c.run_on_scheduler(lambda dask_scheduler: steal_in_order(dask_scheduler, False))
        block = c.submit(wait_for, "go", key="block", priority=10)  # runs first
        estimates = [3.0, 9.0, 1.0, 7.0, 5.0, 2.0, 8.0, 4.0, 6.0, 10.0, 0.5, 11.0]
        parts = []
        for i, e in enumerate(estimates):
            with dask.annotate(estimate=e):
                parts.append(dask.delayed(echo)(i, dask_key_name=f"t-{i:02d}"))
        futs = c.compute(parts)
        while len(c.run_on_scheduler(lambda dask_scheduler: dask_scheduler.tasks)) < 13:
            time.sleep(0.01)
        cl.scale(2)  # a thief
        c.wait_for_workers(2)
        deadline = time.monotonic() + 30
        while not c.run_on_scheduler(_stealable, keys=["block", "t-10", "t-11"]):
            assert time.monotonic() < deadline, "the tasks never became stealable"
            time.sleep(0.01)
        # dask's stealing asks for the worst-ranked task (0.5 s), then the running one
        first = c.run_on_scheduler(_steal, key="t-10")
        second = c.run_on_scheduler(_steal, key="block")
        if in_order:  # the best-ranked waiting tasks move instead: 11 s, then 10 s
            assert (first, second) == (["t-11"], ["t-09"])
        else:
            assert (first, second) == (["t-10"], ["block"])
        Event("go", client=c).set()
        assert c.gather(futs) == list(range(12)) and block.result() == "go"


def test_without_the_plugin_dask_keeps_its_own_stealing():
    with dask.config.set(VALIDATE), plugin_cluster(None) as cl, Client(cl) as c:
        assert not c.run_on_scheduler(_in_order)


def test_a_scheduler_without_stealing_is_left_alone():
    class NoStealing:
        def __init__(self):
            self.extensions = {}

    assert steal_in_order(NoStealing()) is False
