"""Exact makespans on small hand-drawn cases.

Every number here is worked out by hand from the rules in the module
docstrings of :mod:`daskjobs.sim.engine` (first-fit dispatch, lowest node
first) and of the policies (ties in push order), as the estee simulator's
tests do (``assert 17 == makespan``).
"""

from __future__ import annotations

import math
import statistics

import pytest

from daskjobs.sim import (
    FIFO,
    LPT,
    Cluster,
    CriticalPath,
    FairShare,
    NodeAware,
    Schedule,
    Speculation,
    Task,
    WorkStealing,
    failure_bound,
    lower_bound,
    simulate,
    speed_bound,
    utilisation,
    workloads,
)


def flat(durations: list[float], **kw: object) -> list[Task]:
    return [Task(i, float(d), **kw) for i, d in enumerate(durations)]  # type: ignore[arg-type]


def running_at(schedule: Schedule, t: float, team: str | None = None) -> int:
    """Cores busy at time ``t`` (attempts with start <= t < end), optionally of one team."""
    return sum(
        len(a.cores)
        for a in schedule.attempts
        if a.start <= t < a.end and (team is None or a.task.team == team)
    )


# -- Graham's example -----------------------------------------------------------------------


def test_graham_lpt_gives_seven_on_two_cores():
    s = simulate(flat([3, 3, 2, 2, 2]), Cluster(1, 2), LPT())
    assert s.makespan == 7.0
    # the two 3s start at zero, the 2s fill in: 0-3, 0-3, 3-5, 3-5, 5-7
    assert sorted((a.start, a.end) for a in s.attempts) == [
        (0, 3),
        (0, 3),
        (3, 5),
        (3, 5),
        (5, 7),
    ]


def test_graham_optimum_is_six():
    tasks = flat([3, 3, 2, 2, 2])
    assert lower_bound(tasks, 2) == 6.0
    # a list order reaching the bound: 3 and 2 start, then 2, 3, 2 -> {3, 3} | {2, 2, 2}
    s = simulate(flat([3, 2, 2, 3, 2]), Cluster(1, 2), FIFO())
    assert s.makespan == 6.0
    assert s.makespan == lower_bound(tasks, 2)


def test_graham_lpt_within_four_thirds_bound():
    m = 2
    s = simulate(flat([3, 3, 2, 2, 2]), Cluster(1, m), LPT())
    assert s.makespan <= (4 / 3 - 1 / (3 * m)) * 6.0 + 1e-9


# -- FIFO against LPT ------------------------------------------------------------------------


def test_fifo_runs_long_task_last_lpt_first():
    tasks = flat([1, 1, 1, 1, 1, 1, 6])  # a grid submits its largest parameter last
    fifo = simulate(tasks, Cluster(1, 2), FIFO())
    lpt = simulate(tasks, Cluster(1, 2), LPT())
    # FIFO: three rounds of short pairs (0-3), then the 6 alone: 3 + 6
    assert fifo.makespan == 9.0
    assert fifo.record(6).start == 3.0
    # LPT: the 6 on one core from zero, the six 1s on the other
    assert lpt.makespan == 6.0
    assert lpt.record(6).start == 0.0
    assert lpt.makespan < fifo.makespan
    assert lpt.makespan == lower_bound(tasks, 2)


def test_fifo_orders_by_submission_time_then_input_order():
    tasks = [Task("late", 1.0, submit=0.5), Task("a", 2.0), Task("b", 2.0)]
    s = simulate(tasks, Cluster(1, 1), FIFO())
    assert [s.record(t).start for t in ("a", "b", "late")] == [0.0, 2.0, 4.0]


def test_lpt_uses_estimates_not_true_durations():
    # the estimate says the 1 s task is the long one: LPT believes it
    tasks = [Task("short-looking", 10.0, estimate=1.0), Task("long-looking", 1.0, estimate=10.0)]
    s = simulate(tasks, Cluster(1, 1), LPT())
    assert s.record("long-looking").start == 0.0
    assert s.record("short-looking").start == 1.0
    assert s.makespan == 11.0


# -- dependencies ---------------------------------------------------------------------------


@pytest.mark.parametrize("nodes,cores", [(1, 1), (1, 4), (8, 8)])
def test_chain_takes_sum_of_durations_whatever_the_cores(nodes, cores):
    tasks = [Task("a", 1.0), Task("b", 2.0, deps=("a",)), Task("c", 3.0, deps=("b",))]
    s = simulate(tasks, Cluster(nodes, cores), LPT())
    assert s.makespan == 6.0
    assert [(s.record(t).start, s.record(t).end) for t in "abc"] == [(0, 1), (1, 3), (3, 6)]


def test_lower_bound_includes_longest_chain():
    tasks = [Task("a", 1.0), Task("b", 2.0, deps=("a",)), Task("c", 3.0, deps=("b",))]
    # work / cores = 6 / 100 and the longest task is 3, but the chain is 6
    assert lower_bound(tasks, 100) == 6.0
    assert speed_bound(tasks, Cluster(25, 4)) == 6.0


def test_lower_bound_is_max_of_work_longest_and_chain():
    tasks = flat([4, 4, 4, 4])
    assert lower_bound(tasks, 2) == 8.0  # work / cores
    assert lower_bound(tasks, 8) == 4.0  # longest task
    assert lower_bound([Task("w", 3.0, cores=4)], 2) == 6.0  # work counts cores


def short_feeds_long() -> list[Task]:
    """A 1 s task feeding a 10 s one, next to three independent 5 s tasks."""
    return [
        Task("x", 5.0),
        Task("y", 5.0),
        Task("z", 5.0),
        Task("a", 1.0),
        Task("b", 10.0, deps=("a",)),
    ]


def test_critical_path_beats_lpt_and_fifo_on_short_task_feeding_long():
    tasks = short_feeds_long()
    cluster = Cluster(1, 2)
    # LPT and FIFO: x, y at 0-5; z and a at 5; b at 6-16
    lpt = simulate(tasks, cluster, LPT())
    fifo = simulate(tasks, cluster, FIFO())
    assert lpt.makespan == 16.0
    assert fifo.makespan == 16.0
    assert lpt.record("b").start == 6.0
    # CriticalPath: a ranks 11 (1 + 10): a at 0-1, b at 1-11; x 0-5, y 5-10, z 10-15
    cp = simulate(tasks, cluster, CriticalPath())
    assert cp.makespan == 15.0
    assert cp.record("a").start == 0.0
    assert cp.record("b").start == 1.0
    assert cp.makespan < lpt.makespan


def test_critical_path_blevels():
    cp = CriticalPath()
    simulate(short_feeds_long(), Cluster(1, 2), cp)
    assert cp.blevel == {"x": 5.0, "y": 5.0, "z": 5.0, "a": 11.0, "b": 10.0}


def test_critical_path_is_lpt_on_a_flat_graph():
    tasks = flat([3, 3, 2, 2, 2, 7, 1])
    a = simulate(tasks, Cluster(1, 3), LPT())
    b = simulate(tasks, Cluster(1, 3), CriticalPath())
    assert [(x.task.tid, x.start, x.end) for x in a.attempts] == [
        (x.task.tid, x.start, x.end) for x in b.attempts
    ]


def test_dependent_waits_for_all_inputs():
    tasks = [Task("p", 2.0), Task("q", 5.0), Task("r", 1.0, deps=("p", "q"))]
    s = simulate(tasks, Cluster(1, 4), FIFO())
    assert s.record("r").start == 5.0
    assert s.makespan == 6.0


# -- multi-core tasks and nodes --------------------------------------------------------------


def test_multicore_task_holds_its_cores_on_one_node():
    tasks = [Task("big", 4.0, cores=3), Task("s1", 1.0), Task("s2", 1.0)]
    s = simulate(tasks, Cluster(2, 3), FIFO())
    big = next(a for a in s.attempts if a.task.tid == "big")
    assert big.node == 0
    assert big.cores == (0, 1, 2)
    # the small ones go to node 1 at time zero
    assert {a.node for a in s.attempts if a.task.tid != "big"} == {1}
    assert s.makespan == 4.0


def test_first_fit_fills_lowest_node_first():
    s = simulate(flat([1, 1, 1]), Cluster(3, 2), FIFO())
    assert [a.node for a in s.attempts] == [0, 0, 1]
    assert [a.core for a in s.attempts] == [0, 1, 2]


def test_slow_node_multiplies_run_time():
    s = simulate([Task("t", 3.0)], Cluster(2, 1, slow={0: 4.0}), FIFO())
    assert s.record("t").node == 0
    assert s.makespan == 12.0


def test_submit_time_delays_start():
    s = simulate([Task("t", 2.0, submit=5.0)], Cluster(1, 1), FIFO())
    assert s.record("t").start == 5.0
    assert s.record("t").end == 7.0
    assert s.makespan == 2.0  # from the first start


# -- fair share -----------------------------------------------------------------------------


def two_teams(n: int, duration: float = 10.0) -> list[Task]:
    return [Task(f"{team}{i}", duration, team=team) for i in range(n) for team in ("a", "b")]


@pytest.mark.parametrize("cores", [4, 8])
def test_fair_share_splits_cores_three_to_one(cores):
    s = simulate(two_teams(40), Cluster(1, cores), FairShare({"a": 3, "b": 1}))
    # every round of 10 s starts together; a has 3/4 of the cores while both queue
    rounds = 0
    t = 5.0
    while True:
        a, b = running_at(s, t, "a"), running_at(s, t, "b")
        done_a = sum(1 for r in s.tasks if r.team == "a" and r.end <= t)
        done_b = sum(1 for r in s.tasks if r.team == "b" and r.end <= t)
        if done_a + a >= 40 or done_b + b >= 40:
            break  # one team has nothing left queued
        assert (a, b) == (3 * cores // 4, cores // 4), t
        rounds += 1
        t += 10.0
    assert rounds >= 5


def test_fair_share_equal_targets_alternate():
    s = simulate(two_teams(8), Cluster(1, 4), FairShare({"a": 1, "b": 1}))
    assert running_at(s, 5.0, "a") == 2
    assert running_at(s, 5.0, "b") == 2
    assert s.makespan == 40.0


def test_fair_share_without_competition_uses_whole_cluster():
    tasks = [Task(i, 10.0, team="a") for i in range(8)]
    s = simulate(tasks, Cluster(1, 4), FairShare({"a": 1, "b": 3}))
    assert running_at(s, 5.0, "a") == 4
    assert s.makespan == 20.0


def test_fair_share_quota_borrows_idle_slots_when_no_other_team_waits():
    # work-conserving quotas: alone, a team over its quota uses the idle cluster
    tasks = [Task(i, 10.0, team="a") for i in range(6)]
    s = simulate(tasks, Cluster(1, 4), FairShare({"a": 1, "b": 1}, quotas={"a": 2}))
    assert running_at(s, 5.0, "a") == 4
    assert running_at(s, 15.0, "a") == 2
    assert s.makespan == 20.0


def test_fair_share_quota_holds_while_another_team_waits():
    tasks = [Task(f"a{i}", 10.0, team="a") for i in range(8)]
    tasks += [Task(f"b{i}", 10.0, team="b", submit=5.0) for i in range(8)]
    s = simulate(tasks, Cluster(1, 4), FairShare({"a": 1, "b": 1}, quotas={"a": 1}))
    # alone, a borrows all four cores
    assert running_at(s, 2.0, "a") == 4
    # at 10 b waits: a gets no slot beyond its quota of 1 until b's queue is empty
    assert running_at(s, 15.0, "a") == 1 and running_at(s, 15.0, "b") == 3
    b_last_start = max(x.start for x in s.attempts if x.task.team == "b")
    starts = sorted({x.start for x in s.attempts if 10.0 <= x.start < b_last_start})
    assert max(running_at(s, t, "a") for t in starts) == 1
    # once b's last task has started, a borrows the slots b leaves
    assert running_at(s, 35.0, "a") == 2 and s.makespan == 40.0


def decay_case() -> list[Task]:
    """Team a uses the whole cluster for 100 s, then both teams submit."""
    tasks = [Task(f"a-early{i}", 100.0, team="a") for i in range(4)]
    tasks += [Task(f"a{i}", 10.0, team="a", submit=100.0) for i in range(4)]
    tasks += [Task(f"b{i}", 10.0, team="b", submit=100.0) for i in range(4)]
    return tasks


def test_fair_share_running_usage_splits_after_heavy_use():
    s = simulate(decay_case(), Cluster(1, 4), FairShare({"a": 1, "b": 1}))
    # usage = cores held now: at 100 both hold none, so they split 2:2
    assert running_at(s, 105.0, "a") == 2
    assert running_at(s, 105.0, "b") == 2
    assert sorted(s.record(f"b{i}").end for i in range(4)) == [110.0, 110.0, 120.0, 120.0]


def test_fair_share_decayed_usage_remembers_heavy_use():
    fs = FairShare({"a": 1, "b": 1}, half_life=1000.0)
    s = simulate(decay_case(), Cluster(1, 4), fs)
    # a consumed ~386 decayed core-seconds; b none: b takes every core first
    assert running_at(s, 105.0, "b") == 4
    assert running_at(s, 105.0, "a") == 0
    assert [s.record(f"b{i}").end for i in range(4)] == [110.0] * 4
    assert [s.record(f"a{i}").end for i in range(4)] == [120.0] * 4
    assert fs.usage("a", 120.0) > fs.usage("b", 120.0) > 0


def test_fair_share_decayed_usage_value_is_exact_integral():
    fs = FairShare({"a": 1, "b": 1}, half_life=50.0)
    tasks = [Task(f"a{i}", 100.0, team="a") for i in range(2)]
    simulate(tasks, Cluster(1, 2), fs)
    lam = math.log(2) / 50.0
    # dU/dt = 2 - lam U from 0 to 100, then pure decay
    u100 = 2 / lam * (1 - math.exp(-lam * 100.0))
    assert fs.usage("a", 100.0) == pytest.approx(u100, rel=1e-12)
    assert fs.usage("a", 150.0) == pytest.approx(u100 / 2, rel=1e-12)
    assert fs.usage("b", 150.0) == 0.0


def test_fair_share_late_team_served_first_on_fairshare_workload():
    kw = dict(n=1200, n_long=4, nodes=4, cores_per_node=8, n_b=60)
    wl = workloads.fairshare(3, **kw)
    fifo = simulate(wl.tasks, wl.cluster, FIFO(), seed=wl.seed)
    fair = simulate(wl.tasks, wl.cluster, FairShare({"a": 1, "b": 1}), seed=wl.seed)
    b_fifo = fifo.teams()["b"]
    b_fair = fair.teams()["b"]
    assert b_fair.tasks == b_fifo.tasks == 60
    # under FIFO team b waits until every task of team a has started
    last_a_start = max(r.start for r in fifo.tasks if r.team == "a")
    assert min(r.start for r in fifo.tasks if r.team == "b") >= last_a_start
    assert b_fair.median_wait < 0.25 * b_fifo.median_wait
    assert b_fair.max_wait < b_fifo.max_wait
    # and b's median task under fair share barely waits: within a few task lengths
    waits = [r.end - r.submit for r in fair.tasks if r.team == "b"]
    assert statistics.median(waits) < 3 * 3600


# -- work stealing --------------------------------------------------------------------------


def test_work_stealing_idle_core_steals_from_fullest():
    # dealt round robin: core 0 gets 10, 10, 10; core 1 gets 1, 1, 1
    ws = WorkStealing()
    s = simulate(flat([10, 1, 10, 1, 10, 1]), Cluster(1, 2), ws)
    # core 1 drains its 1s by 3, then steals core 0's tail (task 4) at 3-13;
    # core 0 runs tasks 0 (0-10) and 2 (10-20). Without stealing: 30.
    assert ws.steals == 1
    assert s.makespan == 20.0
    stolen = s.record(4)
    assert (stolen.start, stolen.end) == (3.0, 13.0)
    assert next(a for a in s.attempts if a.task.tid == 4).core == 1
    assert s.makespan < 30.0


def test_work_stealing_balanced_deal_never_steals():
    ws = WorkStealing()
    s = simulate(flat([2, 2, 2, 2]), Cluster(1, 2), ws)
    assert ws.steals == 0
    assert s.makespan == 4.0


# -- speculation: backups on a slow node -----------------------------------------------------


def test_backup_rescues_task_pinned_on_slow_node():
    cluster = Cluster(2, 1, slow={0: 10.0})
    tasks = [Task("t", 10.0)]
    s = simulate(tasks, cluster, FIFO(), spec=Speculation(late_factor=2.0))
    # first fit puts t on node 0 (100 s there); late at 2 x 10 = 20 s; the backup
    # on node 1 runs 20-30 and wins; the primary is killed at 30
    rec = s.record("t")
    assert rec.end == 30.0
    assert rec.node == 1
    assert rec.attempts == 2
    primary, backup = s.attempts
    assert (primary.node, primary.start, primary.end, primary.outcome, primary.backup) == (
        0,
        0.0,
        30.0,
        "killed",
        False,
    )
    assert (backup.node, backup.start, backup.end, backup.outcome, backup.backup) == (
        1,
        20.0,
        30.0,
        "done",
        True,
    )
    assert s.backups_launched == 1
    assert s.backups_won == 1
    assert s.waste == 30.0
    assert s.makespan == 30.0


def test_without_speculation_slow_node_takes_ten_times():
    s = simulate([Task("t", 10.0)], Cluster(2, 1, slow={0: 10.0}), FIFO())
    assert s.makespan == 100.0
    assert s.backups_launched == 0
    assert s.waste == 0.0


def test_backup_that_loses_is_killed_and_counted_as_waste():
    # the primary is only a little late: it wins and the backup is killed
    tasks = [Task("t", 25.0, estimate=10.0)]
    s = simulate(tasks, Cluster(2, 1), FIFO(), spec=Speculation(late_factor=2.0))
    primary, backup = s.attempts
    assert (primary.outcome, primary.end) == ("done", 25.0)
    assert (backup.outcome, backup.start, backup.end, backup.backup) == ("killed", 20.0, 25.0, True)
    assert s.backups_won == 0
    assert s.waste == 5.0


def test_no_backup_for_task_that_forbids_speculation():
    tasks = [Task("t", 10.0, speculate=False)]
    s = simulate(tasks, Cluster(2, 1, slow={0: 10.0}), FIFO(), spec=Speculation(late_factor=2.0))
    assert s.backups_launched == 0
    assert s.makespan == 100.0


def test_min_runtime_delays_backup():
    spec = Speculation(late_factor=2.0, min_runtime=50.0)
    s = simulate([Task("t", 10.0)], Cluster(2, 1, slow={0: 10.0}), FIFO(), spec=spec)
    assert s.attempts[1].start == 50.0
    assert s.makespan == 60.0


def test_a_periodic_check_sees_a_late_attempt_at_the_first_check_past_its_deadline():
    # late at 2 x 10 = 20 s; checked every 7 s (as the plugin checks every interval):
    # seen at 21, or at 24 with the checks at 3 + 7k (a replay passes the recorded phase)
    tasks = [Task("t", 10.0)]
    cluster = Cluster(2, 1, slow={0: 10.0})
    spec = Speculation(late_factor=2.0, interval=7.0)
    assert simulate(tasks, cluster, FIFO(), spec=spec).attempts[1].start == 21.0
    s = simulate(tasks, cluster, FIFO(), spec=spec, check_phase=3.0)
    assert s.attempts[1].start == 24.0 and s.makespan == 34.0
    assert simulate(tasks, cluster, FIFO(), spec=Speculation(late_factor=2.0)).makespan == 30.0


def test_a_periodic_check_places_a_copy_only_at_a_check_as_live():
    # t on node 0 (10x slow) is late at 20, seen at the check of 21; node 1 is busy with
    # b until 23. Judged at once, the copy takes node 1 as it frees (23, wins at 33);
    # judged every 7 s, it is placed where the plugin places it: at the next check with a
    # free slot, 28 (wins at 38). Not ahead of queued work: FIFO knows no horizon.
    tasks = [Task("t", 10.0), Task("b", 23.0)]
    cluster = Cluster(2, 1, slow={0: 10.0})
    once = simulate(tasks, cluster, FIFO(), spec=Speculation(late_factor=2.0))
    assert [(a.task.tid, a.start) for a in once.attempts if a.backup] == [("t", 23.0)]
    ticked = simulate(tasks, cluster, FIFO(), spec=Speculation(late_factor=2.0, interval=7.0))
    assert [(a.task.tid, a.start) for a in ticked.attempts if a.backup] == [("t", 28.0)]
    assert ticked.makespan == 38.0 and ticked.backups_won == 1


class _UrgentEarly(FIFO):
    """Asks for a copy of ``t`` while the clock is before 5 s."""

    def urgent(self, attempt, now):
        return attempt.task.tid == "t" and now < 5.0


def test_a_periodic_check_withdraws_a_copy_no_longer_wanted_before_it_found_a_slot():
    # t runs on node 0, long on node 1 until 8; t is urgent until 5 s. Judged at once,
    # the copy asked at 0 waits for node 1 and runs at 8 (and loses at 10); judged
    # every 2 s as live, it is asked at 2 and 4, withdrawn at 6, and never runs
    tasks = [Task("t", 10.0), Task("long", 8.0)]
    once = simulate(tasks, Cluster(2, 1), _UrgentEarly(), spec=Speculation(late_factor=5.0))
    assert once.backups_launched == 1 and once.attempts[2].start == 8.0
    ticked = simulate(
        tasks, Cluster(2, 1), _UrgentEarly(), spec=Speculation(late_factor=5.0, interval=2.0)
    )
    assert ticked.backups_launched == 0 and ticked.makespan == 10.0


def test_the_per_attempt_overhead_is_not_slowed_down_by_a_slow_node():
    cluster = Cluster(2, 1, slow={0: 4.0}, overhead=1.0)
    s = simulate([Task("a", 2.0), Task("b", 2.0)], cluster, FIFO())
    assert [(a.node, a.end) for a in s.attempts] == [(0, 9.0), (1, 3.0)]
    assert cluster.without_slow().overhead == 1.0
    with pytest.raises(ValueError, match="overhead"):
        Cluster(1, 1, overhead=-1.0)
    with pytest.raises(ValueError, match="interval"):
        Speculation(interval=math.nan)


# -- failures and retries --------------------------------------------------------------------


def test_failed_attempts_are_retried_and_waste_counted():
    tasks = flat([10.0] * 20)
    s = simulate(tasks, Cluster(1, 2, failure_rate=0.3), FIFO(), seed=1)
    failed = [a for a in s.attempts if a.outcome == "failed"]
    assert failed, "seed 1 at 30% should fail some attempts"
    assert s.failures == len(failed)
    for r in s.tasks:
        mine = [a for a in s.attempts if a.task.tid == r.tid]
        assert [a.outcome for a in mine].count("done") == 1
        assert mine[-1].outcome == "done"
        assert all(a.outcome == "failed" for a in mine[:-1])
        assert r.attempts == len(mine)
        assert r.end == mine[-1].end
    for a in failed:
        assert a.start <= a.end < a.start + 10.0
    assert s.waste == pytest.approx(sum(a.end - a.start for a in failed), rel=1e-12)
    assert s.busy == pytest.approx(200.0 + s.waste, rel=1e-12)


def test_failures_are_common_random_numbers_across_policies():
    tasks = flat([5.0, 3.0, 8.0, 1.0, 2.0, 9.0, 4.0, 6.0])
    cluster = Cluster(1, 2, failure_rate=0.4)
    a = simulate(tasks, cluster, FIFO(), seed=7)
    b = simulate(tasks, cluster, LPT(), seed=7)

    def fates(s: Schedule) -> dict:
        out: dict = {}
        for att in s.attempts:
            out.setdefault(att.task.tid, []).append(att.outcome)
        return out

    assert fates(a) == fates(b)


# -- cache hits and pruning ------------------------------------------------------------------


def cache_graph(submit: float = 0.0) -> list[Task]:
    return [
        Task("raw", 4.0, submit=submit),
        Task("feat", 10.0, deps=("raw",), submit=submit),
        Task("bt1", 3.0, deps=("feat",), submit=submit),
        Task("bt2", 3.0, deps=("feat",), submit=submit),
        Task("other", 2.0, submit=submit),
    ]


def test_cache_hit_takes_no_time_and_prunes_upstream():
    s = simulate(cache_graph(), Cluster(1, 2), FIFO(), cache={"feat"})
    feat = s.record("feat")
    assert feat.cached
    assert feat.start == feat.end == feat.submit == 0.0
    assert feat.node == -1
    assert all(a.task.tid != "feat" for a in s.attempts)
    assert s.pruned == ["raw"]
    assert "raw" not in {r.tid for r in s.tasks}
    # dependents still run, straight away. Submission (hence FIFO push) order is
    # topological: other (a root), then bt1, bt2 once feat hits the cache
    assert (s.record("other").start, s.record("other").end) == (0.0, 2.0)
    assert (s.record("bt1").start, s.record("bt1").end) == (0.0, 3.0)
    assert (s.record("bt2").start, s.record("bt2").end) == (2.0, 5.0)
    assert s.cache_hits == 1
    assert s.makespan == 5.0


def test_cache_hit_finishes_at_its_submission():
    s = simulate(cache_graph(submit=7.0), Cluster(1, 4), FIFO(), cache={"feat"})
    feat = s.record("feat")
    assert feat.start == feat.end == 7.0
    assert s.record("bt1").start == 7.0


def test_without_cache_graph_runs_in_full():
    s = simulate(cache_graph(), Cluster(1, 2), FIFO())
    assert s.pruned == []
    # raw 0-4 and other 0-2; feat 4-14; bt1, bt2 14-17
    assert s.makespan == 17.0


def test_cached_leaf_is_not_pruned_upstream_still_needed_elsewhere():
    tasks = [
        Task("raw", 4.0),
        Task("f1", 1.0, deps=("raw",)),
        Task("f2", 1.0, deps=("raw",)),
    ]
    s = simulate(tasks, Cluster(1, 1), FIFO(), cache={"f1"})
    assert s.pruned == []  # f2 still reads raw
    assert s.record("f2").start == 4.0


# -- node-aware ------------------------------------------------------------------------------


def test_node_aware_avoids_adversarial_slow_node():
    wl = workloads.chapter(1, n=2000, n_long=8, nodes=6, cores_per_node=8, slow_node=0)
    long_ids = {t.tid for t in wl.tasks[-8:]}
    assert all(t.duration == 30 * workloads.MEDIAN for t in wl.tasks[-8:])
    lpt = simulate(wl.tasks, wl.cluster, LPT(), spec=wl.spec, seed=wl.seed)
    policy = NodeAware()
    na = simulate(wl.tasks, wl.cluster, policy, spec=wl.spec, seed=wl.seed)
    bound = speed_bound(wl.tasks, wl.cluster)
    assert na.makespan < 0.75 * lpt.makespan
    assert na.makespan < 1.15 * bound
    assert all(na.record(t).node != 0 for t in long_ids)
    assert policy.speed(0) > 2.0
    assert policy.speed(1) < 1.5


def test_retry_bound_equals_end_of_a_task_restarted_after_failure():
    s = next(
        s
        for seed in range(100)
        if (s := simulate([Task("t", 10.0)], Cluster(1, 1, failure_rate=0.5), FIFO(), seed=seed))
        .record("t")
        .attempts
        == 2
    )
    failed, done = s.attempts
    assert failed.outcome == "failed"
    assert done.start == failed.end
    assert s.retry_bound == done.end == failed.end + 10.0


def test_retry_bound_ignores_failure_while_a_backup_runs_on():
    # primary on the 10x node fails after its backup (20-30) started: the backup
    # carries on and wins at 30, nothing restarts, so the failure bounds nothing
    cluster = Cluster(2, 1, slow={0: 10.0}, failure_rate=0.5)
    spec = Speculation(late_factor=2.0)
    for seed in range(200):
        s = simulate([Task("t", 10.0)], cluster, FIFO(), spec=spec, seed=seed)
        outcomes = [(a.outcome, a.backup) for a in s.attempts]
        if outcomes == [("failed", False), ("done", True)]:
            break
    else:
        raise AssertionError("no seed fails the primary while its backup runs")
    assert 20.0 < s.attempts[0].end < 30.0
    assert s.record("t").end == 30.0
    assert s.retry_bound <= s.record("t").end


def test_failure_bound_is_the_restart_chain_of_a_lone_task():
    # one task on one core: every failed attempt runs f x 10 s, then the task
    # restarts; the makespan *is* the bound, whatever the seed
    cluster = Cluster(1, 1, failure_rate=0.5)
    chains = 0
    for seed in range(40):
        s = simulate([Task("t", 10.0)], cluster, FIFO(), seed=seed)
        fb = failure_bound([Task("t", 10.0)], cluster, seed)
        if s.record("t").attempts <= 3:  # attempts past the third draw in start order
            assert fb == pytest.approx(s.makespan, rel=1e-12)
            chains += s.record("t").attempts > 1
        assert fb <= s.makespan + 1e-9
    assert chains >= 10  # the case was exercised, not only the failure-free one


def test_failure_bound_adds_failed_work_to_the_speed_bound():
    tasks = flat([10.0] * 400)
    quiet = Cluster(4, 2)
    assert failure_bound(tasks, quiet, seed=3) == speed_bound(tasks, quiet)
    noisy = Cluster(4, 2, slow={3: 2.0}, failure_rate=0.2)
    fb = failure_bound(tasks, noisy, seed=3)
    assert fb > speed_bound(tasks, noisy) * 1.05  # ~10% of the work is lost to failures
    for policy in (FIFO(), LPT(), WorkStealing(), NodeAware()):
        s = simulate(tasks, noisy, policy, seed=3)
        assert s.makespan >= fb - 1e-9, policy.name


# -- measurements ----------------------------------------------------------------------------


def test_utilisation_counts_busy_cores_over_time():
    s = simulate(flat([1, 1, 1, 1, 1, 1, 6]), Cluster(1, 2), FIFO())
    times, busy = utilisation(s, step=1.0)
    assert times.tolist() == [float(t) for t in range(10)]
    # two cores busy for the short tasks (0-3), then the 6 alone (3-9)
    assert busy.tolist() == [2, 2, 2, 1, 1, 1, 1, 1, 1, 0]


def test_utilisation_counts_every_core_of_a_multicore_attempt():
    s = simulate([Task("w", 2.0, cores=3)], Cluster(1, 4), FIFO())
    _, busy = utilisation(s, step=1.0)
    assert busy.tolist() == [3, 3, 0]


def test_team_stats_measure_from_submission():
    tasks = [Task("a1", 4.0, team="a"), Task("b1", 1.0, team="b", submit=1.0)]
    tasks += [Task("b2", 3.0, team="b", submit=1.0)]
    s = simulate(tasks, Cluster(1, 1), FIFO())
    teams = s.teams()
    # a1 0-4; b1 4-5 (wait 4); b2 5-8 (wait 7)
    assert teams["a"].median_wait == 4.0
    assert (teams["b"].tasks, teams["b"].median_wait, teams["b"].max_wait) == (2, 5.5, 7.0)
    assert teams["b"].last_end == 8.0


def test_summary_reports_headline_numbers_in_hours():
    s = simulate([Task("t", 7200.0)], Cluster(2, 1, slow={0: 10.0}), FIFO(), spec=Speculation())
    # late at 2.5 x 2 h = 5 h; the backup runs 5-7 h and wins; the primary is killed at 7 h
    summary = s.summary()
    assert summary["makespan_h"] == s.makespan / 3600 == 5.0 + 2.0
    assert summary["node_hours"] == 2 * 7.0
    assert summary["backups_launched"] == summary["backups_won"] == 1
    assert summary["waste_core_h"] == 7.0
    assert summary["attempts"] == 2


class _NestedLPT(LPT):
    """LPT that, on its first pop, simulates the same Task objects in reverse order."""

    def __init__(self, tasks: list[Task], cluster: Cluster) -> None:
        super().__init__()
        self.inner: tuple[list[Task], Cluster] | None = (tasks, cluster)

    def pop(self, node, now):  # type: ignore[no-untyped-def]
        if self.inner is not None:
            tasks, cluster = self.inner
            self.inner = None
            simulate(list(reversed(tasks)), cluster, FIFO(), seed=1)
        return super().pop(node, now)


def test_tasks_shared_with_a_simulation_running_inside_another():
    # The engine stamps each Task with its position in the running simulation;
    # a second simulation of the same objects restamps them mid-run. The outer
    # run must notice and still start the task the policy chose.
    w = workloads.chapter(0, n=500, n_long=2, nodes=4)
    plain = simulate(w.tasks, w.cluster, LPT(), seed=0)
    nested = simulate(w.tasks, w.cluster, _NestedLPT(w.tasks, w.cluster), seed=0)

    def trace(s: Schedule) -> list[tuple[object, ...]]:
        return [(a.task.tid, a.node, a.start, a.end, a.outcome) for a in s.attempts]

    assert trace(nested) == trace(plain)
    assert nested.makespan == plain.makespan


def test_node_aware_measures_with_short_tasks_but_keeps_the_shortest():
    from types import SimpleNamespace

    node = SimpleNamespace(index=0, cores=4, free=4)
    tasks = [Task(i, float(i + 1)) for i in range(100)]  # estimates 1..100 s

    def first_three(policy: NodeAware) -> list[float]:
        policy.add_node(0, 4)
        policy.push_many(tasks)
        return [policy.pop(node, 0.0).estimate for _ in range(3)]  # type: ignore[arg-type,union-attr]

    # the 5th percentile of what is queued, each time: 100 tasks -> position 5, then 4 ...
    assert first_three(NodeAware()) == [6.0, 5.0, 4.0]
    assert first_three(NodeAware(measure_quantile=0.0)) == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="measure_quantile"):
        NodeAware(measure_quantile=1.0)


@pytest.mark.parametrize("seed", [-1, 1.5, "0", True])
def test_a_bad_seed_is_named(seed: object) -> None:
    tasks, cluster = [Task("t", 1.0)], Cluster(1, 1, failure_rate=0.1)
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        simulate(tasks, cluster, FIFO(), seed=seed)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        failure_bound(tasks, cluster, seed=seed)  # type: ignore[arg-type]
