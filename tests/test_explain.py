"""explain() says why a queued task waits with the policy's own answer, the one its ``pop``
acts on: it never derives a rule of its own beside the policy's.

The plugin is read through its view over a stand-in scheduler that holds only what explain
reads of dask (the tasks, their states and priorities, the queue, the workers); the policy
is the plugin's own, its books set as a running plugin would have set them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.views import ANY_NODE, LiveAttempt, LiveTask


def _plugin(**teams: Any) -> JobsPlugin:
    plugin = JobsPlugin(policy="fair-share", teams={"half-life": None, **teams})
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
