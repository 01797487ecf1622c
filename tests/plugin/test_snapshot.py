"""The forecast's snapshot (daskjobs/plugin/observe/snapshot.py): in slices, as in one pass.

The sliced snapshot gives the event loop back between chunks; here a chunk is one task
and every chunk ends a slice (``CHUNK = 1``, ``SLICE = 0``), so every step of it can be
interleaved with the scheduler's work. Tasks are held with ``distributed.Event``s; a test
waits for what it waits for (polling, with a deadline), never for a guessed time.
"""

from __future__ import annotations

import asyncio
import threading
import time
import types
from typing import Any

import dask
import pytest
from conftest import plugin_cluster
from distributed import Client, Event
from waiting import until

import daskjobs.plugin.observe.snapshot as snapshot_module
from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.observe.snapshot import LIMIT, Cost, snapshot, snapshot_async


def held(name: str, i: int) -> int:
    Event(name).wait(60)
    return i


def after(i: int, gate: int) -> int:
    return i + gate


async def _both(dask_scheduler: Any) -> tuple[Any, ...]:
    """On the scheduler: one pass, in slices, one pass again; and of one key's work."""
    p = dask_scheduler.plugins["daskjobs"]
    cost = Cost()
    first = snapshot(p)
    in_slices = await snapshot_async(p, cost=cost)
    again = snapshot(p)
    part = snapshot(p, keys=["leaf-0"]), await snapshot_async(p, keys=["leaf-0"])
    return first, in_slices, again, cost, part


@pytest.fixture
def sliced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every task a chunk, every chunk a slice."""
    monkeypatch.setattr(snapshot_module, "CHUNK", 1)
    monkeypatch.setattr(snapshot_module, "SLICE", 0.0)


def test_sliced_and_one_pass_snapshots_are_the_same_on_a_quiet_scheduler(sliced, monkeypatch):
    # the snapshot's clock pinned: a running task's elapsed time is read against it
    pinned = time.time() + 100.0
    clock = types.SimpleNamespace(time=lambda: pinned, perf_counter=time.perf_counter)
    monkeypatch.setattr(snapshot_module, "time", clock)
    plugin = JobsPlugin(policy="lpt")
    with plugin_cluster(plugin, threads_per_worker=4) as cl, Client(cl) as c:
        for w in cl.workers.values():  # nothing changes the scheduler's state from now on
            w.periodic_callbacks["heartbeat"].stop()
        gate = c.submit(held, "quiet", -1, key="gate")
        with dask.annotate(team="a", estimate=2.0, sweep="s1"):
            roots = c.map(held, ["quiet"] * 7, range(7), key=[f"root-{i}" for i in range(7)])
        with dask.annotate(team="b"):
            leaves = c.map(after, range(5), gate=gate, key=[f"leaf-{i}" for i in range(5)])
        until(lambda: sum(w.state.executing_count for w in cl.workers.values()) == 4, "4 running")

        def states(dask_scheduler: Any) -> dict[str, int]:
            out: dict[str, int] = {}
            for ts in dask_scheduler.tasks.values():
                out[ts.state] = out.get(ts.state, 0) + 1
            return out

        until(lambda: states(cl.scheduler).get("waiting") == 5, "the leaves to wait")
        first, in_slices, again, cost, part = c.run_on_scheduler(_both)
        by_rpc = c.sync(c.scheduler.daskjobs_snapshot, keys=None, limit=None)
        Event("quiet").set()
        c.gather([gate, *roots, *leaves])
    assert first == again, "the scheduler was not quiet"
    assert in_slices == first and by_rpc == first
    cols = first["tasks"]
    assert len(cols["key"]) == 13 and set(cols) == set(in_slices["tasks"])
    assert {"processing", "waiting"} <= set(cols["state"])
    assert sum(x is not None for x in cols["worker"]) >= 4  # the running ones have a place
    assert cost.slices > 13  # it gave the loop back after every task, at least
    assert part[0] == part[1] and sorted(part[0]["tasks"]["key"]) == ["gate", "leaf-0"]


class Pause:
    """``asyncio.sleep`` for the snapshot module: at its ``at``-th call it waits until the
    test lets it go (on the scheduler's loop, which runs on meanwhile). The functions
    run on the scheduler find it as ``Pause.current`` (they travel pickled: by name)."""

    current: Pause

    def __init__(self, at: int) -> None:
        self.at = at
        self.calls = 0
        self.paused = threading.Event()
        self.go = asyncio.Event()
        self.sleep_ = asyncio.sleep
        self.box: dict[str, Any] = {}  # the snapshot once taken, and its asyncio task

    async def sleep(self, delay: float) -> None:
        self.calls += 1
        if self.calls == self.at:
            self.paused.set()
            await self.go.wait()
        else:
            await self.sleep_(delay)


def _start(dask_scheduler: Any) -> None:
    """On the scheduler: start the snapshot, as a task of its loop."""

    async def take() -> None:
        p = dask_scheduler.plugins["daskjobs"]
        Pause.current.box["snap"] = await snapshot_async(p, limit=LIMIT)

    Pause.current.box["task"] = asyncio.ensure_future(take())


def _go(dask_scheduler: Any) -> None:
    Pause.current.go.set()


@pytest.mark.parametrize(("read", "end"), [(0, "memory"), (2, "forgotten")])
def test_tasks_that_finish_while_the_snapshot_waits_are_not_left_unfinished(
    sliced, monkeypatch, read, end
):
    """Tasks ``b-*`` finish (and, ``forgotten``, are released) while the snapshot waits
    after its first pass and ``read`` rows: the rows read before keep them, the others
    leave them out; nothing fails, and every input names a row."""
    plugin = JobsPlugin(policy="lpt")
    with plugin_cluster(plugin, threads_per_worker=4) as cl, Client(cl) as c:
        bs = [c.submit(held, "b", i, key=f"b-{i}") for i in range(3)]  # one graph each:
        gate = c.submit(held, "gate", -1, key="gate")  # the scheduler holds them in order
        leaves = c.map(after, range(3), gate=gate, key=[f"leaf-{i}" for i in range(3)])
        sched = cl.scheduler
        until(lambda: len(sched.tasks) == 7, "the graph on the scheduler")
        assert list(sched.tasks)[:4] == ["b-0", "b-1", "b-2", "gate"]
        p = sched.plugins["daskjobs"]
        # the first pass yields once per task: pause after it and `read` rows
        pause = Pause(at=len(sched.tasks) + read)
        monkeypatch.setattr(snapshot_module, "asyncio", types.SimpleNamespace(sleep=pause.sleep))
        monkeypatch.setattr(Pause, "current", pause, raising=False)
        box = pause.box
        c.run_on_scheduler(_start)
        assert pause.paused.wait(30), "the snapshot did not pause"
        Event("b").set()
        assert c.gather(bs) == [0, 1, 2]
        if end == "forgotten":
            del bs
            until(lambda: not any(k.startswith("b-") for k in list(sched.tasks)), "b forgotten")
        else:
            assert all(sched.tasks[f"b-{i}"].state == "memory" for i in range(3))
        c.run_on_scheduler(_go)
        snap = until(lambda: box.get("snap"), "the snapshot")
        Event("gate").set()
        assert c.gather(leaves) == [-1, 0, 1]
    assert "error" not in snap and "snapshot" not in p.errors
    cols = snap["tasks"]
    kept_b = [f"b-{i}" for i in range(read)]  # read before they finished
    assert sorted(cols["key"]) == sorted([*kept_b, "gate", "leaf-0", "leaf-1", "leaf-2"])
    n = len(cols["key"])
    row = {k: i for i, k in enumerate(cols["key"])}
    for k, deps in zip(cols["key"], cols["deps"], strict=True):
        assert all(0 <= d < n for d in deps)
        assert deps == ([row["gate"]] if k.startswith("leaf-") else [])
    for k in kept_b:  # as read: unfinished, but no longer on any worker's line
        assert cols["state"][row[k]] == "processing" and cols["worker"][row[k]] is None
    assert cols["worker"][row["gate"]] is not None
    assert pause.calls > pause.at
