"""explain() says why a queued task waits with the policy's own answer, the one its ``pop``
acts on: it never derives a rule of its own beside the policy's.

The plugin is read through its view over a stand-in scheduler that holds only what explain
reads of dask (the tasks, their states and priorities, the queue, the workers); the policy
is the plugin's own, its books set as a running plugin would have set them."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.views import ANY_NODE, LiveAttempt, LiveTask


def _plugin(policy: str = "fair-share", **teams: Any) -> JobsPlugin:
    if policy == "fair-share":
        plugin = JobsPlugin(policy=policy, teams={"half-life": None, **teams})
    else:
        plugin = JobsPlugin(policy=policy)
    plugin.scheduler = SimpleNamespace(tasks={}, workers={}, queued=[])
    return plugin


def _view(key: str, team: str, cores: int = 1) -> LiveTask:
    return LiveTask(key, 1.0, cores, team, 0.0, (), "annotation", "stage")


def _running(plugin: JobsPlugin, key: str, team: str, cores: int = 1) -> None:
    """``key`` runs: the policy was told it started, as the release gate tells it."""
    v = _view(key, team, cores)
    plugin.ranker.made.started(LiveAttempt(v, 0, 0.0), 0.0)


def _queued(plugin: JobsPlugin, *views: LiveTask) -> None:
    """``views`` wait in dask's queue, in this order, and in the policy's queue."""
    sched = plugin.scheduler
    for i, v in enumerate(views):
        ts = SimpleNamespace(
            key=v.tid, state="queued", priority=(0, float(i), 0, i), processing_on=None, who_has=()
        )
        sched.tasks[v.tid] = ts
        sched.queued.append(ts)
        plugin.ranker.tasks[v.tid] = v
    plugin.ranker.made.push_many(list(views))


def test_a_team_held_by_its_quota_on_a_wide_task_is_told_so() -> None:
    """Team a (quota 2) holds 1 core, and the head of its queue asks for 2: fair share
    holds a back by its quota and serves b, though b uses more per share. A one-core task
    of a behind the wide one is told the quota holds its team, not that b is further below
    its share (a rule from the waiting task's cores, not the team's head's, said so)."""
    plugin = _plugin(targets={"a": 1, "b": 1}, quotas={"a": 2})
    _running(plugin, "a-run", "a")
    for i in range(3):
        _running(plugin, f"b-run-{i}", "b")
    _queued(plugin, _view("a-wide", "a", cores=2), _view("a-1", "a"), _view("b-1", "b"))
    why = plugin.explain("a-1")["why"]
    wide = plugin.explain("a-wide")["why"]
    served = plugin.ranker.made.pop(ANY_NODE, 1.0)
    assert served is not None and served.tid == "b-1"  # what the policy does
    for said in (why, wide):
        assert "its quota is 2" in said, said
        assert "further below its share" not in said, said  # b uses 3 per share 0.5, a 2


def test_the_task_fair_share_serves_next_is_told_it_starts_at_the_next_free_slot() -> None:
    """With no slot free, the head of the team fair share serves next is the task ``pop``
    returns next: it is told so, not that its team's tasks ahead of it start first."""
    plugin = _plugin(targets={"a": 1, "b": 1})
    _running(plugin, "a-run", "a")
    _queued(plugin, _view("a-1", "a"), _view("b-1", "b"), _view("b-2", "b"))
    first, second = plugin.explain("b-1")["why"], plugin.explain("b-2")["why"]
    other = plugin.explain("a-1")["why"]
    assert plugin.ranker.made.pop(ANY_NODE, 1.0).tid == "b-1"  # type: ignore[union-attr]
    assert "next free slot" in first and "ahead of this one" not in first, first
    assert "its tasks ahead of this one in its queue start first" in second, second
    assert "team 'b' is further below its share" in other, other


def test_a_task_node_aware_holds_is_told_node_aware_s_own_reason() -> None:
    """Node-aware (a popper that learns speeds): a task a worker measured slow leaves is
    told so by the policy; explain repeats that answer word for word."""
    plugin = _plugin("node-aware")
    na = plugin.ranker.made
    for node, speed in ((0, 1.0), (1, 4.0)):
        na.add_node(node, 1)
        na.relearn(node, (math.log(speed) * (3 + na.prior), 3))  # type: ignore[attr-defined]
    long = LiveTask("long", 8.0, 1, "default", 0.0, (), "annotation", "stage")
    _queued(plugin, long, _view("short", "default"))
    why = plugin.explain("long")["why"]
    assert why == na.why_waiting(long, 0.0), why  # no running task: the same at any time
    assert "1 worker(s) measured nominal take the longest queued task first" in why, why


def test_under_a_static_order_a_task_is_told_its_place_in_dask_s_queue() -> None:
    """A policy that holds nothing back (a static key written into dask's priorities)
    answers None: explain gives the task's place in dask's queue."""
    plugin = _plugin("lpt")
    assert plugin.gate is None
    plugin.scheduler.tasks.update(
        {
            k: SimpleNamespace(key=k, state="queued", priority=p, processing_on=None, who_has=())
            for k, p in (("first", (0, -2.0, 0, 0)), ("second", (0, -1.0, 0, 1)))
        }
    )
    plugin.scheduler.queued.extend(plugin.scheduler.tasks.values())
    plugin.ranker.tasks["second"] = _view("second", "default")
    assert plugin.ranker.made.why_waiting(_view("second", "default"), 0.0) is None
    why = plugin.explain("second")["why"]
    assert why == "queued behind 1 task(s) of higher priority; no free slot yet", why
