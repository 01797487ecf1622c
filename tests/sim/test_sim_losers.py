"""Losers that hold their cores (``Cluster(stops_losers=False)``, as dask cannot stop a
thread), and the policy's reclaim rule (``Speculation.reclaim_at``) in the simulator."""

from __future__ import annotations

import pytest

from daskjobs.policies import FIFO, Speculation
from daskjobs.sim import Cluster, Task, simulate

# t runs on node 0 (10x slow: 100 s), late at 20, its copy on node 1 wins at 30; v
# arrives at 40
TASKS = [Task("t", 10.0), Task("v", 5.0, submit=40.0)]


def _rows(s):
    return [(a.task.tid, a.node, a.start, a.end, a.outcome, a.backup) for a in s.attempts]


def test_a_killed_loser_frees_its_core_at_once() -> None:
    s = simulate(TASKS, Cluster(2, 1, slow={0: 10.0}), FIFO(), spec=Speculation(late_factor=2.0))
    assert _rows(s)[:3] == [
        ("t", 0, 0.0, 30.0, "killed", False),
        ("t", 1, 20.0, 30.0, "done", True),
        ("v", 0, 40.0, 55.0, "killed", False),  # node 0 is free again: v starts there
    ]


def test_a_loser_that_runs_on_holds_its_core_until_its_natural_end() -> None:
    cluster = Cluster(2, 1, slow={0: 10.0}, stops_losers=False)
    s = simulate(TASKS, cluster, FIFO(), spec=Speculation(late_factor=2.0))
    assert _rows(s) == [
        ("t", 0, 0.0, 100.0, "killed", False),  # its thread ran to the end: 100 s of waste
        ("t", 1, 20.0, 30.0, "done", True),
        ("v", 1, 40.0, 45.0, "done", False),  # node 0 is still held at 40
    ]
    assert s.waste == 100.0 and s.makespan == 45.0


def test_the_policy_takes_a_loser_s_thread_for_returned_after_its_timeout() -> None:
    # reclaimed 10 s after its release (30 + 10 = 40, before its natural end at 100)
    cluster = Cluster(2, 1, slow={0: 10.0}, stops_losers=False)
    spec = Speculation(late_factor=2.0, reclaim_after=10.0, reclaim_factor=0.0)
    assert _rows(simulate(TASKS, cluster, FIFO(), spec=spec))[:3] == [
        ("t", 0, 0.0, 40.0, "killed", False),
        ("t", 1, 20.0, 30.0, "done", True),
        ("v", 0, 40.0, 65.0, "killed", False),  # node 0 free at 40 again; v's loser held to 65
    ]


def test_stops_losers_is_checked() -> None:
    with pytest.raises(TypeError, match="stops_losers"):
        Cluster(2, 1, stops_losers="no")  # type: ignore[arg-type]
    assert not Cluster(2, 1, slow={0: 2.0}, stops_losers=False).without_slow().stops_losers
