"""``simulate(not_before=...)``: a task's attempts start no sooner than its time, the node
the policy gave it held for it until then; copies are not held. Exact numbers, worked out
by hand from the engine's rules (first fit, lowest node first; FIFO in push order)."""

from __future__ import annotations

import math

import pytest

from daskjobs.sim import FIFO, Cluster, Speculation, Task, simulate


def starts(schedule):
    return {a.task.tid: (a.node, a.start) for a in schedule.attempts if not a.backup}


@pytest.mark.parametrize("reference", [False, True])
def test_a_task_starts_no_sooner_than_its_time_and_holds_its_node(reference):
    # one slot: a runs 0-1; b is popped at 1 but held until 3 (the slot with it); c after
    tasks = [Task("a", 1.0), Task("b", 1.0), Task("c", 1.0)]
    s = simulate(tasks, Cluster(1, 1), FIFO(), not_before={"b": 3.0}, reference=reference)
    assert starts(s) == {"a": (0, 0.0), "b": (0, 3.0), "c": (0, 4.0)}
    assert s.makespan == 5.0
    # a time already past changes nothing, and an unknown id is ignored
    s = simulate(tasks, Cluster(1, 1), FIFO(), not_before={"b": 0.5, "x": 9.0})
    assert starts(s) == {"a": (0, 0.0), "b": (0, 1.0), "c": (0, 2.0)}


def test_not_before_must_be_finite():
    with pytest.raises(ValueError, match="not_before"):
        simulate([Task("a", 1.0)], Cluster(1, 1), FIFO(), not_before={"a": math.nan})


@pytest.mark.parametrize("reference", [False, True])
def test_a_held_attempt_is_judged_from_its_start_and_its_copy_is_not_held(reference):
    # node 0 is 10x slow; a (estimate 1) is popped there at 0 and held until 0.5: late at
    # 0.5 + 2 x 1 = 2.5, judged at the check of 3 (every 1 s), copied to node 1 at once
    # (not held: its time is the primary's), where it ends at 4 and wins
    spec = Speculation(late_factor=2.0, interval=1.0, ahead="always")
    s = simulate(
        [Task("a", 1.0)],
        Cluster(2, 1, slow={0: 10.0}),
        FIFO(),
        spec=spec,
        not_before={"a": 0.5},
        reference=reference,
    )
    (primary,) = [a for a in s.attempts if not a.backup]
    (copy,) = [a for a in s.attempts if a.backup]
    assert (primary.node, primary.start) == (0, 0.5)
    assert (copy.node, copy.start, copy.end) == (1, 3.0, 4.0)
    assert s.backups_won == 1


@pytest.mark.parametrize("reference", [False, True])
def test_a_copy_the_cap_refused_at_a_check_waits_for_the_next_check(reference):
    # node 0 (2 slots, 10x slow) runs a and b (estimate 1, late at 2); node 1 (2 slots)
    # runs c and d until 2.5. At the check of 2 both want a copy allowed ahead of queued
    # work, but the cap is one copy: a's waits for node 1's next slot (2.5) and wins at
    # 3.5; b's was refused and, as live, is asked for again at the next check after the
    # cap has room (4), not at the slot that frees at 3.5 between two checks.
    spec = Speculation(late_factor=2.0, interval=1.0, max_fraction=0.25, ahead="always")
    tasks = [Task("a", 1.0), Task("b", 1.0), Task("c", 2.5), Task("d", 2.5)]
    s = simulate(tasks, Cluster(2, 2, slow={0: 10.0}), FIFO(), spec=spec, reference=reference)
    copies = {a.task.tid: (a.node, a.start, a.end) for a in s.attempts if a.backup}
    assert copies == {"a": (1, 2.5, 3.5), "b": (1, 4.0, 5.0)}
    assert s.backups_launched == 2 and s.backups_won == 2 and s.makespan == 5.0
