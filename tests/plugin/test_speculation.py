"""Backup copies of late tasks, live: a slow worker, races both ways, failures, the cap.

A failed attempt's seconds are counted for its team, never as a copy's waste.
"""

from __future__ import annotations

import time

import dask
import pytest
from conftest import VALIDATE, plugin_cluster
from distributed import Client, LocalCluster

from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.client import status

FAST = {"late_factor": 2.0, "min_runtime": "100ms", "interval": "50ms", "enabled": True}


def work(i, seconds, fail_on=None):
    """Ten times slower on the worker named 0; raises on the worker named ``fail_on``."""
    from distributed import get_worker

    name = get_worker().name
    if fail_on is not None and name == fail_on:
        raise RuntimeError(f"boom on worker {name}")
    time.sleep(seconds * (10 if name == 0 else 1))
    return (i, name)


def cluster(spec=None, n_workers=2, threads=1):
    plugin = JobsPlugin(policy="lpt", speculation={**FAST, **(spec or {})})
    return plugin_cluster(plugin, n_workers=n_workers, threads_per_worker=threads)


def address_of(client, name):
    return next(a for a, w in client.scheduler_info()["workers"].items() if w["name"] == name)


def pinned(client, name, i, seconds, estimate, **extra):
    """A task loosely pinned to the worker called ``name``."""
    with dask.annotate(
        workers=[address_of(client, name)], allow_other_workers=True, estimate=estimate, **extra
    ):
        return dask.delayed(work)(i, seconds, extra.pop("fail_on", None), dask_key_name=f"w-{i}")


def healthy(client, n_workers=2):
    """No worker lost, no failed scheduler transition, no swallowed plugin error."""
    assert len(client.scheduler_info()["workers"]) == n_workers
    failed = [e for _, e in client.get_events("transitions")]
    assert not [e for e in failed if e.get("action") == "scheduler-transition-failed"]
    st = status(client)
    assert st["errors"] == {}, st["errors"]
    return st["speculation"]


@pytest.mark.slow
def test_a_task_on_a_slow_worker_finishes_from_its_backup():
    with dask.config.set(VALIDATE), cluster() as cl, Client(cl) as c:
        # 2 s on the slow worker 0: the result comes from the copy on worker 1
        assert c.compute(pinned(c, 0, 1, 0.2, 0.2), sync=True) == (1, 1)
        sp = healthy(c)
        assert sp["launched"] == 1 and sp["won"] == 1 and sp["running"] == 0
        assert sp["waste_seconds"]["default"] > 0
        actions = [e["action"] for _, e in c.get_events("daskjobs")]
        assert "backup-launched" in actions and "backup-won" in actions


@pytest.mark.slow
def test_the_primary_can_win_and_the_copy_is_released():
    with dask.config.set(VALIDATE), cluster() as cl, Client(cl) as c:
        # 0.5 s on the fast worker, estimated at 0.05 s: late at 0.1 s, copied to the slow one
        assert c.compute(pinned(c, 1, 2, 0.5, 0.05), sync=True) == (2, 1)
        sp = healthy(c)
        assert sp["launched"] == 1 and sp["lost"] == 1 and sp["won"] == 0


def test_a_failing_backup_never_fails_the_task():
    with dask.config.set(VALIDATE), cluster() as cl, Client(cl) as c:
        x = pinned(c, 1, 3, 0.5, 0.05, fail_on=0)
        assert c.compute(x, sync=True) == (3, 1)
        sp = healthy(c)
        assert sp["launched"] == 1 and sp["failed"] == 1


def test_speculate_false_is_respected():
    with dask.config.set(VALIDATE), cluster() as cl, Client(cl) as c:
        assert c.compute(pinned(c, 0, 4, 0.05, 0.05, speculate=False), sync=True) == (4, 0)
        assert healthy(c)["launched"] == 0


@pytest.mark.slow
def test_dependents_receive_the_winners_data():
    with dask.config.set(VALIDATE), cluster() as cl, Client(cl) as c:
        slow = pinned(c, 0, 5, 0.2, 0.2)
        total = dask.delayed(lambda r: (r[0] * 10, r[1]))(slow, dask_key_name="after")
        assert c.compute(total, sync=True) == (50, 1)
        assert healthy(c)["won"] == 1


@pytest.mark.slow
def test_the_cap_on_concurrent_backups_holds():
    with (
        dask.config.set(VALIDATE),
        cluster({"max_fraction": 0.01}, n_workers=3, threads=2) as cl,
        Client(cl) as c,
    ):
        parts = [pinned(c, 0, i, 0.2, 0.2) for i in (6, 7)]
        assert sorted(r[0] for r in c.compute(parts, sync=True)) == [6, 7]
        sp = healthy(c, 3)
        assert sp["launched"] >= 1 and sp["peak"] == 1


def test_speculation_settings_are_checked():
    with pytest.raises(ValueError, match=r"daskjobs.speculation.late-factor"):
        JobsPlugin(speculation={"late_factor": 0.5})
    with pytest.raises(ValueError, match=r"unknown key\(s\) in daskjobs.speculation: late"):
        JobsPlugin(speculation={"late": 2})


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["backup", "primary"])
def test_a_worker_dying_mid_race_leaves_the_task_completing(victim):
    with dask.config.set(VALIDATE), cluster(n_workers=3) as cl, Client(cl) as c:
        # 0.5 s of work estimated at 0.2 s: late at 0.4 s; the copy then runs 0.5 s
        # (5 s on the slow worker 0), a window to catch the race in
        fut = c.compute(pinned(c, 0, 8, 0.5, 0.2))
        deadline = time.time() + 30
        backups: dict = {}
        while "w-8" not in backups and time.time() < deadline:
            backups = c.run_on_scheduler(
                lambda dask_scheduler: {
                    str(k): (b.worker, b.primary)
                    for k, b in dask_scheduler.plugins["daskjobs"].speculator.backups.items()
                }
            )
            time.sleep(0.01)
        copy_worker, primary_worker = backups["w-8"]
        doomed = copy_worker if victim == "backup" else primary_worker
        names = {a: w["name"] for a, w in c.scheduler_info()["workers"].items()}
        time.sleep(0.1)  # the copy gets a head start on any fresh attempt
        c.sync(cl.scheduler.remove_worker, address=doomed, stimulus_id="test-kill", close=True)
        i, ran_on = fut.result(timeout=30)
        assert i == 8 and ran_on != names[doomed]
        if victim == "primary":  # the surviving copy's result is the task's
            assert ran_on == names[copy_worker]
        failed = [e for _, e in c.get_events("transitions")]
        assert not [e for e in failed if e.get("action") == "scheduler-transition-failed"]
        assert status(c)["errors"] == {}


@pytest.mark.slow
def test_a_task_on_a_worker_measured_slow_is_copied_before_its_deadline():
    with dask.config.set(VALIDATE), cluster(n_workers=2, threads=2) as cl, Client(cl) as c:
        # teach the plugin that worker 0 is slow: short tasks there take 10x their estimate
        warm = [pinned(c, 0, i, 0.02, 0.02, speculate=False) for i in range(10, 16)]
        c.compute(warm, sync=True)
        speeds = {w["worker"]: w["speed"] for w in status(c)["workers"]}
        assert speeds[address_of(c, 0)] > 2
        # 0.3 s estimated, 3 s on the slow worker: the deadline (2 x 0.3 x slow-down) is
        # seconds away, but a copy on the fast worker finishes far sooner
        assert c.compute(pinned(c, 0, 20, 0.3, 0.3), sync=True) == (20, 1)
        sp = healthy(c)
        assert sp["won"] >= 1
        launched = [e for _, e in c.get_events("daskjobs") if e["action"] == "backup-launched"]
        deadline = 2.0 * 0.3 * speeds[address_of(c, 0)]  # late_factor x estimate x slow-down
        assert launched and launched[-1]["late_by"] < deadline  # copied for being on a slow worker


STOPPED: list[tuple[object, int]] = []


def stepwise(i, steps, step_seconds):
    """A long task that stops early once its result is no longer wanted."""
    from distributed import get_worker

    import daskjobs

    name = get_worker().name
    for step in range(steps):
        if daskjobs.cancelled():
            STOPPED.append((name, step))
            return None
        time.sleep(step_seconds * (10 if name == 0 else 1))
    return (i, name)


def test_a_losing_copy_can_stop_early_with_cancelled():
    import daskjobs

    assert daskjobs.cancelled() is False  # outside a task
    STOPPED.clear()
    with dask.config.set(VALIDATE), cluster() as cl, Client(cl) as c:
        with dask.annotate(workers=[address_of(c, 0)], allow_other_workers=True, estimate=0.2):
            x = dask.delayed(stepwise)(9, 20, 0.01, dask_key_name="step-9")
        assert c.compute(x, sync=True) == (9, 1)  # the copy on the fast worker won
        deadline = time.time() + 5
        while not STOPPED and time.time() < deadline:
            time.sleep(0.02)
        # the slow primary noticed and returned after a step, not after its 2 s
        assert STOPPED and STOPPED[0][0] == 0 and STOPPED[0][1] < 20
        assert healthy(c)["won"] == 1


@pytest.mark.slow
def test_backups_and_waste_are_exported_as_metrics():
    import urllib.request

    with cluster() as cl, Client(cl) as c:
        # 2 s on the slow worker, late at 0.4 s: the copy on worker 1 nearly always wins,
        # but on a loaded machine the primary may (seen once in CI). The metrics must say
        # which, and agree with the plugin's own counts either way.
        i, ran_on = c.compute(pinned(c, 0, 30, 0.2, 0.2), sync=True)
        assert i == 30 and ran_on in (0, 1)
        sp = healthy(c)
        deadline = time.monotonic() + 30
        while sp["running"] and time.monotonic() < deadline:  # a race settles after its end
            time.sleep(0.05)
            sp = healthy(c)
        port = cl.scheduler.http_server.port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    assert sp["launched"] == 1 and sp["won"] == (ran_on == 1)
    for outcome in ("launched", "won", "lost", "failed", "abandoned"):
        assert f'dask_daskjobs_backups_total{{outcome="{outcome}"}} {float(sp[outcome])}' in text
    assert 'dask_daskjobs_waste_seconds_total{team="default"}' in text


#: (x, worker name) of each call of :func:`doubled` that has slept its time
DOUBLED: list[tuple[int, object]] = []


def doubled(x):
    """A sweep stage that takes ten times longer on the worker named 0."""
    from distributed import get_worker

    name = get_worker().name
    time.sleep(0.3 * (10 if name == 0 else 1))
    DOUBLED.append((x, name))
    return 2 * x


@pytest.mark.slow
def test_two_copies_of_a_cached_stage_leave_exactly_one_store_entry(tmp_path):
    from daskjobs import ResultStore, Sweep, grid

    store = ResultStore(str(tmp_path / "store"))
    sweep = Sweep("copies")
    stage = sweep.stage(doubled, over=grid(x=[1, 2]), estimate=0.3)
    DOUBLED.clear()
    with dask.config.set(VALIDATE), cluster() as cl, Client(cl) as c:
        result = sweep.run(c, store=store, progress=False)
        assert sorted(r["value"] for r in result.records) == [2, 4]
        assert healthy(c)["won"] == 1  # the task on the slow worker was won by its copy
        # the losing copy finishes its 3 s and tries to commit too: wait until it has slept,
        # then until its worker reports its thread returned (the commit is in that thread)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            any(name == 0 for _, name in DOUBLED) and healthy(c)["running_losers"] == 0
        ):
            time.sleep(0.05)
        assert any(name == 0 for _, name in DOUBLED) and healthy(c)["running_losers"] == 0
    keys = sorted(store.keys())
    assert keys == sorted(stage.keys)  # one entry per key, however many copies committed
    report = store.verify()
    assert not report.corrupt and sorted(report.ok) == keys
    assert sorted(store.get(k) for k in keys) == [2, 4]


@pytest.mark.slow
def test_node_aware_keeps_long_tasks_off_a_worker_measured_slow():
    """The simulator's NodeAware.pop(worker) picks what each freed slot runs: short work
    until a worker is measured, the longest on fast workers, short work on slow ones."""

    def run(policy):
        plugin = JobsPlugin(policy=policy)
        parts = []
        for i in range(42):
            seconds = 0.5 if i >= 40 else 0.02  # the two long tasks come last
            with dask.annotate(estimate=seconds):
                parts.append(dask.delayed(work)(i, seconds, dask_key_name=f"t-{i}"))
        with (
            dask.config.set(VALIDATE),
            LocalCluster(
                n_workers=2,
                threads_per_worker=2,
                processes=False,
                dashboard_address=":0",
                scheduler_kwargs={"plugins": [plugin]},
            ) as cl,
            Client(cl) as c,
        ):
            results = c.compute(parts, sync=True)
            assert status(c)["errors"] == {}
        return {i: name for i, name in results}

    ran_on = run("node-aware")
    assert ran_on[40] == 1 and ran_on[41] == 1  # both long tasks on the fast worker
    ran_on_lpt = run("lpt")
    assert 0 in (ran_on_lpt[40], ran_on_lpt[41])  # LPT starts them first, one per worker


RACER_RETURNED: list[tuple[object, float]] = []


def racer(steps):
    """Ten times slower on the worker named 0; never checks cancelled(): a loser that
    holds its thread."""
    from distributed import get_worker

    name = get_worker().name
    for _ in range(steps):
        time.sleep(0.01 * (10 if name == 0 else 1))
    RACER_RETURNED.append((name, time.time()))
    return "done"


def napper(i):
    from distributed import get_worker

    t0 = time.time()
    time.sleep(0.1)
    return (i, t0, time.time(), get_worker().name)


@pytest.mark.slow
def test_tasks_waiting_behind_a_running_loser_move_to_idle_workers():
    spec = {"late_factor": 1.5}
    RACER_RETURNED.clear()
    with dask.config.set(VALIDATE), cluster(spec) as cl, Client(cl) as c:
        with dask.annotate(workers=[address_of(c, 0)], allow_other_workers=True, estimate=0.3):
            r = dask.delayed(racer)(30, dask_key_name="race")
        c.compute(r, sync=True)  # the copy wins; the primary's thread runs on for ~2 s
        assert status(c)["speculation"]["running_losers"] == 1
        batch = []
        for i in range(12):
            with dask.annotate(estimate=0.1):
                batch.append(dask.delayed(napper)(i, dask_key_name=f"b-{i:02d}"))
        res = c.compute(batch, sync=True)
        sp = healthy(c)
        assert sp["moved_off_losers"] >= 1
        deadline = time.time() + 10
        while status(c)["speculation"]["running_losers"] and time.time() < deadline:
            time.sleep(0.05)
        assert (
            status(c)["speculation"]["running_losers"] == 0
        )  # the worker said its thread returned
    loser_returned = max(t for name, t in RACER_RETURNED if name == 0)
    # the batch did not wait behind the loser's thread: all of it (1.2 s of work on the one
    # usable thread) was done before the loser (2.4 s of its 3 s left) returned
    assert max(e for _, _, e, _ in res) < loser_returned
    assert all(s >= loser_returned for _, s, _, w in res if w == 0)


FLAKY_SEEN: set[int] = set()


def flaky(i):
    """Fails on its first run, succeeds on the retry."""
    time.sleep(0.1)
    if i not in FLAKY_SEEN:
        FLAKY_SEEN.add(i)
        raise RuntimeError("first attempt fails")
    return i


def test_failed_attempts_count_as_failed_seconds_for_their_team_not_as_copy_waste():
    FLAKY_SEEN.clear()
    # no copy may be judged due: a loaded machine stretches the 0.1 s attempt past twice its
    # estimate, and a copy's waste would then be counted rightly
    with dask.config.set(VALIDATE), cluster({"late_factor": 1000.0}) as cl, Client(cl) as c:
        with dask.annotate(team="quant", retries=1, estimate=0.1):
            x = dask.delayed(flaky)(1, dask_key_name="flaky-1")
        assert c.compute(x, sync=True) == 1
        sp = status(c)["speculation"]
        assert sp["failed_seconds"].get("quant", 0) >= 0.09  # the failed first attempt's 0.1 s
        assert sp["launched"] == 0 and sp["waste_seconds"].get("quant", 0) == 0  # no copy ran


def fail_after(seconds):
    time.sleep(seconds)
    raise RuntimeError("this attempt fails")


def test_a_failed_attempt_is_not_backup_waste():
    plugin = JobsPlugin(
        policy="fair-share", teams={"targets": {"a": 1}}, speculation={**FAST, "late_factor": 50}
    )
    with plugin_cluster(plugin) as cl, Client(cl) as c:
        with dask.annotate(team="a", estimate=10.0):
            f = c.submit(fail_after, 0.4, key="fails")
        with pytest.raises(RuntimeError):
            f.result()
        sp = status(c)["speculation"]
    assert sp["launched"] == 0
    assert sp["waste_seconds"] == {}  # no copy ran: no copy waste
    assert sp["failed_seconds"]["a"] >= 0.3  # the failed attempt is counted, apart


def feed(i):
    """An input of ~100 kB: a real replica the memory manager could move."""
    return bytes([i]) * 100_000


def consume(data, seconds):
    from distributed import get_worker

    name = get_worker().name
    time.sleep(seconds * (10 if name == 0 else 1))
    return (len(data), name)


def _race_state(dask_scheduler):
    """The scheduler's own view of every running copy (for the test below)."""
    plugin = dask_scheduler.plugins["daskjobs"]
    out = {}
    for key, race in plugin.speculator.races.items():
        cts = dask_scheduler.tasks.get(race.copy)
        if cts is None:
            continue
        out[str(key)] = {
            "copy_state": cts.state,
            "copy_on": cts.processing_on.address if cts.processing_on else None,
            "race_worker": race.worker,
            "in_processing": cts.processing_on is not None and cts in cts.processing_on.processing,
            "pins_inputs": all(cts in (d.waiters or ()) for d in cts.dependencies),
            "inputs": len(cts.dependencies),
            "wanted_by": sorted(cs.client_key for cs in cts.who_wants or ()),
        }
    return out


@pytest.mark.slow
def test_a_copy_is_a_task_the_scheduler_knows_and_leaves_no_trace():
    with dask.config.set(VALIDATE), cluster(n_workers=3) as cl, Client(cl) as c:
        with dask.annotate(workers=[address_of(c, 1)], allow_other_workers=True):
            data = dask.delayed(feed)(7, dask_key_name="feed-7")
        with dask.annotate(workers=[address_of(c, 0)], allow_other_workers=True, estimate=0.2):
            x = dask.delayed(consume)(data, 0.2, dask_key_name="consume-7")
        fut = c.compute(x)
        deadline = time.time() + 10
        seen = {}
        while time.time() < deadline and not seen.get("consume-7", {}).get("copy_on"):
            seen = c.run_on_scheduler(_race_state)
            time.sleep(0.02)
        state = seen["consume-7"]
        # the copy is an ordinary task: processing on its worker, counted in that worker's
        # processing set, and a waiter of its input (so the memory manager keeps it there)
        assert state["copy_state"] == "processing"
        assert state["copy_on"] == state["race_worker"] != address_of(c, 0)
        assert state["in_processing"] and state["pins_inputs"] and state["inputs"] == 1
        assert state["wanted_by"] == ["daskjobs-copies"]
        nbytes, ran_on = fut.result(timeout=30)
        assert nbytes == 100_000 and ran_on != 0  # the copy's result, under the task's key
        del fut

        def leftovers(dask_scheduler):
            cs = dask_scheduler.clients["daskjobs-copies"]
            copies = [str(k) for k in dask_scheduler.tasks if "daskjobs-copy" in str(k)]
            return [str(ts.key) for ts in cs.wants_what], copies

        deadline = time.time() + 5
        wants, copies = c.run_on_scheduler(leftovers)
        while time.time() < deadline and copies:
            time.sleep(0.05)
            wants, copies = c.run_on_scheduler(leftovers)
        assert wants == [] and copies == []  # settled copies are forgotten with their task
        assert healthy(c, 3)["won"] == 1


def _held(name, seconds):
    from distributed import Event

    Event(name).wait(seconds)
    return seconds


def test_a_task_waiting_on_its_worker_counts_as_work_to_start_in_the_horizon():
    """dask hands a worker more tasks than it has threads (worker-saturation): the
    horizon counts such a task as queued work until its worker reports the true start,
    as the simulator (and replay) count it; nothing is left in the sums at the end."""
    from distributed import Event, wait

    plugin = JobsPlugin(policy="lpt", speculation={"enabled": True, "interval": "10s"})
    config = {**VALIDATE, "distributed.scheduler.worker-saturation": 2.0}
    with dask.config.set(config), plugin_cluster(plugin) as cl, Client(cl) as c:
        gate = Event("daskjobs-test-gate")
        futs = []
        for i, est in enumerate((3.0, 2.0, 1.0)):  # lpt: 3.0 runs, 2.0 waits on the worker
            with dask.annotate(estimate=est):
                futs.append(c.submit(_held, gate.name, 30 + i, key=f"held-{i}"))
        sp = plugin.speculator
        deadline = time.time() + 30
        # three submits may reach the scheduler in separate messages: wait for all three
        while (
            "held-0" not in sp.starts
            or len(sp.unstarted) != 1
            or "held-2" not in cl.scheduler.tasks
        ):
            assert time.time() < deadline, (sp.starts, sp.unstarted)
            time.sleep(0.02)
        assert sp.unstarted == {"held-1"}  # on the worker, not started
        assert sp.sums.run_cores == 1  # held-0 runs
        assert sp.sums.queued == pytest.approx(2.0 + 1.0)  # held-1 and the queued held-2
        gate.set()
        wait(futs)
        assert sp.unstarted == set() and sp.sums.run_cores == 0
        assert sp.sums.queued == pytest.approx(0.0)


@pytest.mark.slow
def test_the_end_game_gives_an_idle_worker_a_copy_once_nothing_waits():
    # worker 0 is 10x slow and nobody knows it yet; the deadline is far (late-factor 50):
    # only the end game copies the task, to idle worker 1, where the copy wins
    spec = {"late_factor": 50.0, "endgame": True}
    with dask.config.set(VALIDATE), cluster(spec) as cl, Client(cl) as c:
        assert c.compute(pinned(c, 0, 1, 0.3, 0.3), sync=True) == (1, 1)
        sp = healthy(c)
        assert sp["launched"] == 1 and sp["won"] == 1
        launched = [e for _, e in c.get_events("daskjobs") if e["action"] == "backup-launched"]
        assert [e["why"] for e in launched] == ["endgame"]
        assert "nothing waits" in launched[0]["reason"]
