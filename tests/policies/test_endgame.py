"""The end game (``Speculation(endgame=True)``): once nothing waits to start, idle nodes
take copies of the running attempts expected to end last, in the simulator as the policy
decides them (``Speculation.decide(..., waiting=0)``)."""

from __future__ import annotations

import pytest

from daskjobs.policies import FIFO, Speculation
from daskjobs.sim import Cluster, Task, simulate


def _copies(s):
    return [(a.task.tid, a.node, a.start, a.end, a.outcome) for a in s.attempts if a.backup]


def test_an_idle_node_copies_the_attempt_on_a_slow_node_once_nothing_waits() -> None:
    # node 0 is 4x slow and nobody knows: "a" runs 400 s there. "b" ends at 10 s and
    # "c" arrives at 50 s: node 1 is idle from 10 to 50 s, but a task is still to come
    tasks = [Task("a", 100.0, 100.0), Task("b", 10.0, 10.0), Task("c", 10.0, 10.0, submit=50.0)]
    cluster = Cluster(2, 1, slow={0: 4.0})
    late = simulate(tasks, cluster, FIFO(), spec=Speculation(late_factor=2.5))
    assert _copies(late) == [("a", 1, 250.0, 350.0, "done")]  # late at 2.5 x 100 s
    assert late.makespan == 350.0
    end = simulate(tasks, cluster, FIFO(), spec=Speculation(late_factor=2.5, endgame=True))
    # "c" ends at 60 s: nothing waits, node 1 is idle, "a" gets its copy there
    assert _copies(end) == [("a", 1, 60.0, 160.0, "done")]
    assert end.makespan == 160.0 and end.backups_launched == 1 and end.backups_won == 1
    # the same with a periodic check: the copy starts at the first check past 60 s
    tick = simulate(
        tasks, cluster, FIFO(), spec=Speculation(late_factor=2.5, interval=25.0, endgame=True)
    )
    assert _copies(tick) == [("a", 1, 75.0, 175.0, "done")]


def test_the_end_game_copies_at_most_once_per_task_and_loses_to_a_healthy_primary() -> None:
    # one long task on a nominal node, three idle nodes: one copy, never a second
    tasks = [Task("long", 100.0, 100.0)] + [Task(f"s{i}", 5.0, 5.0) for i in range(3)]
    s = simulate(tasks, Cluster(4, 1), FIFO(), spec=Speculation(endgame=True))
    assert _copies(s) == [("long", 1, 5.0, 100.0, "killed")]
    assert s.makespan == 100.0 and s.backups_won == 0


def test_a_replay_runs_the_end_game_as_the_recorded_run_had_it() -> None:
    from daskjobs.replay.races import _speculation

    on = _speculation({"speculation": {"enabled": True, "endgame": True}}, [])
    before = _speculation({"speculation": {"enabled": True}}, [])  # a trace from before
    assert on is not None and on.endgame
    assert before is not None and not before.endgame


def test_the_plugin_setting_is_checked_and_said_at_start() -> None:
    from daskjobs.config import settings, summary

    on = settings(speculation={"enabled": True, "endgame": "yes"})
    assert on.speculation.endgame is True
    assert "max-fraction 0.1, end game)" in summary(on)
    off = settings(speculation={"enabled": True})
    assert off.speculation.endgame is False and "end game" not in summary(off)
    with pytest.raises(ValueError, match=r"daskjobs\.speculation\.endgame"):
        settings(speculation={"endgame": "maybe"})
