"""Team fair share and quotas, live on a dask cluster, driven by the simulator's FairShare."""

from __future__ import annotations

import time

import dask
import pytest
from conftest import VALIDATE, plugin_cluster
from distributed import Client

from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.client import explain, status


def job(team, i, seconds):
    t0 = time.time()
    time.sleep(seconds)
    return (team, i, t0, time.time())


def cluster(plugin=None, threads=8):
    return plugin_cluster(plugin, threads_per_worker=threads)


def mixed_graph(counts, seconds):
    """One graph holding ``counts[team]`` tasks per team, interleaved."""
    parts = []
    for team, n in counts.items():
        for i in range(n):
            with dask.annotate(team=team):
                parts.append(dask.delayed(job)(team, i, seconds, dask_key_name=f"{team}-{i}"))
    return parts


def running_at(records, team, t):
    return sum(1 for tm, _, s, e in records if tm == team and s <= t < e)


@pytest.mark.slow
def test_running_slots_split_in_proportion_to_targets():
    plugin = JobsPlugin(policy="fair-share", teams={"targets": {"a": 3, "b": 1}, "half-life": None})
    # saturation 1.0: dask assigns exactly one task per thread, so the slots the
    # policy shares are the threads that run (with 1.1 a ninth task waits on the
    # worker and the executing split wobbles between 6:2 and 5:3)
    config = {**VALIDATE, "distributed.scheduler.worker-saturation": 1.0}
    with dask.config.set(config), cluster(plugin) as cl, Client(cl) as c:
        recs = c.compute(mixed_graph({"a": 120, "b": 120}, 0.05), sync=True)
    # while both teams have work queued (until a's queue drains), 8 slots split 6:2: each
    # freed slot goes to the team below its share, so (equal durations) 3 of every 4 starts
    # after the first fill are a's. Counted in start order, not sampled in time.
    order = [tm for tm, _, s, _ in sorted(recs, key=lambda r: r[2])]
    a_done = max(i for i, tm in enumerate(order) if tm == "a")
    window = order[8:a_done]  # after the first fill of the 8 threads
    assert len(window) > 60
    assert window.count("a") / len(window) == pytest.approx(0.75, abs=0.1)


@pytest.mark.slow
@pytest.mark.alone  # counts starts in a window of wall-clock time: no other test beside it
def test_a_late_small_team_gets_its_median_task_done_far_sooner_than_under_fifo():
    def run(plugin):
        """How many of a's tasks started after b arrived and before b's median task."""
        with dask.config.set(VALIDATE), cluster(plugin) as cl, Client(cl) as c:
            with dask.annotate(team="a"):
                fa = c.map(job, ["a"] * 400, range(400), [0.05] * 400, pure=False)
            time.sleep(0.4)  # the small team arrives later, as in the chapter
            tb = time.time()
            with dask.annotate(team="b"):
                fb = c.map(job, ["b"] * 40, range(40), [0.05] * 40, pure=False)
            b_starts = sorted(s for _, _, s, _ in c.gather(fb))
            a_starts = [s for _, _, s, _ in c.gather(fa)]
        median_b = b_starts[len(b_starts) // 2]
        return sum(1 for s in a_starts if tb <= s < median_b)

    fifo = run(JobsPlugin(policy="fifo"))
    fair = run(JobsPlugin(policy="fair-share", teams={"targets": {"a": 1, "b": 1}}))
    # FIFO runs nearly all of a's remaining tasks first; fair share interleaves the teams
    # (the chapter saw b's median wait at 0.59 h against 8.28 h under FIFO)
    assert fifo > 200 and fair < 0.3 * fifo, (fair, fifo)


@pytest.mark.alone  # team a's slots 0.15 s after b is done: no other test beside it
def test_a_quota_holds_while_other_teams_wait():
    plugin = JobsPlugin(
        policy="fair-share",
        teams={"targets": {"a": 1, "b": 1}, "quotas": {"a": 2}, "half-life": None},
    )
    with dask.config.set(VALIDATE), cluster(plugin) as cl, Client(cl) as c:
        recs = c.compute(mixed_graph({"a": 60, "b": 60}, 0.05), sync=True)
        st = status(c)
    b_last_start = max(s for tm, _, s, _ in recs if tm == "b")
    first = min(s for _, _, s, _ in recs)
    # every a-task that starts while b still has tasks waiting keeps a at <= 2 running
    a_starts = sorted(s for tm, _, s, _ in recs if tm == "a" and s < b_last_start)
    assert a_starts, "team a never ran while b waited"
    for s in a_starts:
        assert running_at(recs, "a", s + 1e-6) <= 2
    # and the quota does not idle the cluster once b is done: a then uses every slot
    # (at some start after b's last: a count over the run, not a reading at fixed instants,
    # which a loaded machine's slow dispatch can miss)
    after = [
        running_at(recs, "a", s + 1e-6) for tm, _, s, _ in recs if tm == "a" and s > b_last_start
    ]
    assert after and max(after) > 2
    assert first < b_last_start
    assert {row["team"]: row["quota"] for row in st["teams"]} == {"a": 2, "b": None}


def test_explain_gives_the_team_state_of_a_waiting_task():
    plugin = JobsPlugin(
        policy="fair-share", teams={"targets": {"a": 1, "b": 1}, "quotas": {"a": 1}}
    )
    with cluster(plugin, threads=2) as cl, Client(cl) as c:
        futs = c.compute(mixed_graph({"a": 10, "b": 2}, 0.2))
        deadline = time.time() + 10
        info = {"state": "unknown"}
        while info["state"] != "queued" and time.time() < deadline:
            for k in range(10):  # with a quota of 1, most of team a waits
                info = explain(c, f"a-{k}")
                if info["state"] == "queued":
                    break
        assert info["state"] == "queued"
        assert info["team"] == "a" and info["team_state"]["quota"] == 1
        assert "team 'a'" in info["why"] or "next in line" in info["why"]
        c.gather(futs)


def test_longest_first_within_a_team():
    teams = {"targets": {"a": 1}, "within": "lpt"}
    config = {**VALIDATE, "distributed.scheduler.worker-saturation": 1.0}
    plugin = JobsPlugin(policy="fair-share", teams=teams)
    estimates = [(i * 7) % 12 + 1.0 for i in range(12)]
    parts = []
    for i in range(12):
        with dask.annotate(team="a", estimate=estimates[i]):
            parts.append(dask.delayed(job)("a", i, 0.01, dask_key_name=f"a-{i}"))
    with dask.config.set(config), cluster(plugin, 1) as cl, Client(cl) as c:
        recs = c.compute(parts, sync=True)
    order = [i for _, i, _, _ in sorted(recs, key=lambda r: r[2])]
    assert order == sorted(range(12), key=lambda i: -estimates[i])


def test_an_unknown_within_order_is_rejected():
    with pytest.raises(ValueError, match=r"daskjobs.teams.within: expected 'fifo' or 'lpt'"):
        JobsPlugin(policy="fair-share", teams={"within": "random"})


# -- accounting that stays right (issue: fair share went negative) ---------------------------


def settled_teams(c, timeout=5.0):
    """The team rows once the scheduler has nothing running or queued."""
    deadline = time.time() + timeout
    rows = status(c)["teams"]
    while time.time() < deadline and any(r["running"] or r["queued"] for r in rows):
        time.sleep(0.05)
        rows = status(c)["teams"]
    return {r["team"]: r for r in rows}


def job_after(team, i, seconds, dep):
    return job(team, i, seconds)


def chain(team, n, seconds):
    """Tasks with an input each: dask sends them straight to a worker (never queued)."""
    with dask.annotate(team=team, estimate=seconds):
        root = dask.delayed(job)(team, -1, seconds, dask_key_name=f"{team}-root")
        return [
            dask.delayed(job_after)(team, i, seconds, root, dask_key_name=f"{team}-{i}")
            for i in range(n)
        ]


def test_a_team_without_a_target_is_counted_from_its_first_task():
    # default config: teams are not strict; team "zz" has no target and its tasks, having an
    # input, start without ever waiting in dask's queue
    plugin = JobsPlugin(policy="fair-share", teams={"targets": {"a": 1}, "half-life": "1h"})
    with dask.config.set(VALIDATE), cluster(plugin, threads=2) as cl, Client(cl) as c:
        c.compute(chain("zz", 6, 0.02) + mixed_graph({"a": 6}, 0.02), sync=True)
        rows = settled_teams(c)
        assert status(c)["errors"] == {}
    assert rows["zz"]["running"] == 0 and rows["a"]["running"] == 0
    assert rows["zz"]["usage"] > 0  # it ran, and its usage was counted, never negative
    assert rows["zz"]["share"] is not None


def test_tasks_dask_ran_past_a_quota_leave_the_team_queue():
    plugin = JobsPlugin(
        policy="fair-share",
        teams={"targets": {"a": 1, "b": 1}, "quotas": {"a": 1}, "half-life": None},
    )
    with dask.config.set(VALIDATE), cluster(plugin, threads=4) as cl, Client(cl) as c:
        c.compute(mixed_graph({"a": 40, "b": 2}, 0.01), sync=True)
        rows = settled_teams(c)
        port = cl.scheduler.http_server.port
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    assert rows["a"]["queued"] == 0 and rows["b"]["queued"] == 0
    assert 'dask_daskjobs_team_queued_tasks{team="a"} 0.0' in text


def test_a_failing_hook_leaves_the_accounting_reconciled():
    plugin = JobsPlugin(policy="fair-share", teams={"targets": {"a": 1, "b": 1}, "half-life": None})
    with dask.config.set(VALIDATE), cluster(plugin, threads=2) as cl, Client(cl) as c:
        fair = cl.scheduler.plugins["daskjobs"].view.fair
        original = fair.started
        calls = {"n": 0}

        def flaky_started(attempt, now):
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("injected failure in a hook")
            return original(attempt, now)

        fair.started = flaky_started
        c.compute(mixed_graph({"a": 10, "b": 10}, 0.02), sync=True)
        rows = settled_teams(c)
        st = status(c)
    assert st["errors"].get("release", 0) >= 1  # counted under the release gate, and logged
    assert rows["a"]["running"] == 0 and rows["b"]["running"] == 0
    assert rows["a"]["queued"] == 0 and rows["b"]["queued"] == 0


def test_a_graph_is_ranked_entirely_or_not_at_all_and_the_warning_names_the_task(caplog):
    plugin = JobsPlugin(policy="lpt")
    parts = [dask.delayed(job)("a", i, 0.01, dask_key_name=f"r-{i}") for i in range(6)]
    with dask.config.set(VALIDATE), cluster(plugin, threads=1) as cl, Client(cl) as c:
        policy = cl.scheduler.plugins["daskjobs"].ranker.policy
        original = policy.key

        def key(v):
            if v.tid == "r-3":
                raise RuntimeError("injected failure ranking one task")
            return original(v)

        policy.key = key
        with caplog.at_level("WARNING", logger="daskjobs.plugin"):
            fut = c.compute(parts)
            c.gather(fut)
            prios = c.run_on_scheduler(
                lambda dask_scheduler: {
                    k: list(dask_scheduler.tasks[k].priority)
                    for k in (f"r-{i}" for i in range(6))
                    if k in dask_scheduler.tasks
                }
            )
    assert {len(p) for p in prios.values()} == {3}  # dask's own order for the whole graph
    warned = [r.getMessage() for r in caplog.records if "rank" in r.getMessage()]
    assert warned and all("r-3" in m for m in warned), warned


# -- one quota rule: the simulator and the live plugin start the same teams in the same order --

GATES: dict[str, object] = {}
STARTED: list[str] = []


def gated(name):
    """Say it started, then wait until the test lets it end."""
    import threading

    gate = GATES.setdefault(name, threading.Event())
    STARTED.append(name)
    assert gate.wait(60), f"{name} was never released"
    return name


def test_quotas_give_the_same_team_order_in_the_simulator_and_live():
    from daskjobs.policies import FairShare
    from daskjobs.sim import Cluster, Task, simulate

    n, slots = 6, 2
    # one dask task group per team (key prefixes "a", "b"), larger than 2 x threads, so that
    # dask queues them as root tasks and the plugin holds and releases them
    a_keys = [f"a-{i}" for i in range(n)]
    b_keys = [f"b-{i}" for i in range(n)]
    # simulator: a's graph at 0, b's once a holds both slots. Equal durations, but the two
    # tasks of the first fill end apart, so that every end follows start order: the order
    # in which the live test releases them
    d, eps = 10.0, 0.01
    tasks = [Task(k, d + (eps if i == 1 else 0.0), team="a") for i, k in enumerate(a_keys)]
    tasks += [Task(k, d, team="b", submit=d / 2) for k in b_keys]
    targets = {"a": 1, "b": 1}
    s = simulate(tasks, Cluster(1, slots), FairShare(targets, quotas={"a": 1}))
    sim_order = [a.task.tid for a in sorted(s.attempts, key=lambda a: (a.start, a.end))]

    # live: one worker, two threads, dask runs exactly one task per thread
    GATES.clear()
    STARTED.clear()
    plugin = JobsPlugin(
        policy="fair-share", teams={"targets": targets, "quotas": {"a": 1}, "half-life": None}
    )
    config = {**VALIDATE, "distributed.scheduler.worker-saturation": 1.0}
    with dask.config.set(config), cluster(plugin, threads=slots) as cl, Client(cl) as c:

        def graph(team, keys):
            with dask.annotate(team=team):
                return [dask.delayed(gated)(k, dask_key_name=k) for k in keys]

        def wait_started(count):
            deadline = time.time() + 30
            while len(STARTED) < count and time.time() < deadline:
                time.sleep(0.005)
            assert len(STARTED) >= count, STARTED

        fa = c.compute(graph("a", a_keys))
        wait_started(slots)  # a alone holds both slots (it borrows over its quota)
        fb = c.compute(graph("b", b_keys))
        deadline = time.time() + 30
        while (
            c.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.queued)) < 2 * n - slots
            and time.time() < deadline
        ):
            time.sleep(0.005)
        released = 0
        while released < 2 * n:
            wait_started(min(released + slots, 2 * n))
            GATES.setdefault(STARTED[released], __import__("threading").Event())
            GATES[STARTED[released]].set()  # end the earliest started task still running
            released += 1
        c.gather(fa + fb)
        assert status(c)["errors"] == {}
    live_order = list(STARTED)
    # the team of each start, in order, is the policy's decision: the same in both drivers
    # (within a team, equal ranks keep dask's own order live, push order in the simulator)
    assert [k[0] for k in live_order] == [k[0] for k in sim_order], (live_order, sim_order)
    assert sorted(live_order) == sorted(sim_order)
    # and it is the quota rule: a borrows both slots alone; once b waits, a holds one at most
    # (two slots, a's quota 1: every slot a frees goes to b while b waits)
    assert "".join(k[0] for k in sim_order) == "aabababababb"


def test_the_ranked_graph_event_names_the_configured_policy():
    plugin = JobsPlugin(policy="fair-share", teams={"targets": {"a": 1}})
    with cluster(plugin, threads=2) as cl, Client(cl) as c:
        c.compute(mixed_graph({"a": 3}, 0.01), sync=True)
        ranked = [e for _, e in c.get_events("daskjobs") if e["action"] == "ranked-graph"]
    assert ranked and all(e["policy"] == "fair-share" for e in ranked)  # not the held FIFO
