"""The scheduler plugin on real dask clusters: loading, ordering, estimates, safety.

A worker's measured slow-down outlives its leaving and returning under the same name
(daskjobs/plugin/speeds.py). A script that starts ``daskjobs.local_cluster`` without a main
guard is told so.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import dask
import dask.array as da
import pytest
from conftest import VALIDATE, plugin_cluster
from distributed import Client
from repo import FOLDERS, ROOT

import daskjobs
from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.audit import Audit
from daskjobs.plugin.client import explain, local_cluster, status
from daskjobs.plugin.speeds import WorkerSpeeds
from daskjobs.plugin.surgery._internals import DaskInternalsError, check_scheduler
from daskjobs.plugin.views import LiveTask


def stamp(i):
    """Record when the task really started (on the worker), then take a moment."""
    t = time.time()
    time.sleep(0.01)
    return (t, i)


def start_order(results):
    return [i for _, i in sorted(results)]


def cluster(plugin=None, **kwargs):
    return plugin_cluster(plugin, **kwargs)


def plugin_of(client):
    return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["daskjobs"])


def annotated(n, estimate, name="t", fn=stamp):
    parts = []
    for i in range(n):
        with dask.annotate(estimate=estimate(i)):
            parts.append(dask.delayed(fn)(i, dask_key_name=f"{name}-{i}"))
    return parts


# -- loading ------------------------------------------------------------------------------------


def test_register_plugin_on_a_running_cluster():
    with dask.config.set(VALIDATE), cluster() as cl, Client(cl) as c:
        c.register_plugin(JobsPlugin(policy="lpt"))
        assert "daskjobs" in c.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))
        res = c.compute(annotated(8, lambda i: float(i)), sync=True)
        assert start_order(res) == list(range(7, -1, -1))
        st = status(c)
        assert st["policy"] == "lpt" and st["ranked_graphs"] == 1 and st["errors"] == {}


def test_local_cluster_convenience_and_scheduler_kwargs():
    with dask.config.set(VALIDATE):
        with (
            local_cluster(
                JobsPlugin(policy="lpt"),
                n_workers=1,
                threads_per_worker=1,
                processes=False,
                dashboard_address=":0",
            ) as cl,
            Client(cl) as c,
        ):
            assert isinstance(cl.scheduler.plugins["daskjobs"], JobsPlugin)
            res = c.compute(annotated(6, lambda i: float(i)), sync=True)
            assert start_order(res) == [5, 4, 3, 2, 1, 0]
        # and the lazy top-level names
        assert daskjobs.JobsPlugin is JobsPlugin
        assert daskjobs.local_cluster is local_cluster


def test_a_script_without_a_main_guard_is_told_so(tmp_path: Any) -> None:
    """A script that starts ``daskjobs.local_cluster`` at its top level: dask's worker
    processes import it again (spawn), and each stops with one message naming the main guard,
    instead of starting a scheduler of its own and failing inside multiprocessing."""
    import os
    import subprocess
    import sys

    from daskjobs.plugin.client import MAIN_GUARD

    (tmp_path / "script.py").write_text(
        "import daskjobs\n"
        "cluster = daskjobs.local_cluster(n_workers=1, threads_per_worker=1,"
        " dashboard_address=':0')\n"
        "print('started')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DASK_", "DASKJOBS_"))}
    env["DASK_DASKJOBS__HISTORY__PATH"] = "None"
    proc = subprocess.run(
        [sys.executable, "script.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode != 0
    assert "started" not in proc.stdout
    assert MAIN_GUARD in proc.stderr
    # the worker process did not start a scheduler (and a plugin) of its own
    assert proc.stderr.count("daskjobs plugin: policy") == 1, proc.stderr
    assert "bootstrapping phase" not in proc.stderr


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_dask_scheduler_cli_with_preload_and_worker_processes(tmp_path):
    port = _free_port()
    # the scheduler and worker import this test module to unpickle its functions
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *map(str, FOLDERS)])}
    history = tmp_path / "history.json"
    # their logs to files, not to pipes nobody reads (a full pipe would block a process)
    sched_log = open(tmp_path / "scheduler.log", "wb")  # noqa: SIM115
    worker_log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115
    sched = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "distributed.cli.dask_scheduler",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dashboard-address",
            ":0",
            "--no-show",
            "--preload",
            str(ROOT / "plugins" / "daskjobs_scheduler.py"),
            "--daskjobs-policy",
            "lpt",
            "--daskjobs-history",
            str(history),
        ],
        env=env,
        stdout=sched_log,
        stderr=subprocess.STDOUT,
    )
    worker = None
    try:
        addr = f"tcp://127.0.0.1:{port}"
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "distributed.cli.dask_worker",
                addr,
                "--nthreads",
                "1",
                "--nworkers",
                "1",
                "--no-nanny",
                "--dashboard-address",
                ":0",
            ],
            env=env,
            stdout=worker_log,
            stderr=subprocess.STDOUT,
        )
        with Client(addr, timeout="30s") as c:
            c.wait_for_workers(1, timeout=30)
            names = c.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))
            assert "daskjobs" in names
            res = c.compute(annotated(6, lambda i: float(i), fn=stamp), sync=True)
            assert start_order(res) == [5, 4, 3, 2, 1, 0]
            st = status(c)
            assert st["policy"] == "lpt"
            # measured per stage: the function the tasks call (its module and name)
            assert st["stages"]["test_plugin.stamp"]["samples"] == 6
            c.shutdown()
        sched.wait(timeout=30)
        saved = json.loads(history.read_text())["stages"]["test_plugin.stamp"]
        assert len(saved) == 6  # saved on close
    finally:
        for p in (worker, sched):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        sched_log.close()
        worker_log.close()


# -- ordering ------------------------------------------------------------------------------------


@pytest.mark.parametrize("saturation", [1.1, 1.0, float("inf")])
def test_twenty_independent_tasks_start_longest_first(saturation):
    config = {**VALIDATE, "distributed.scheduler.worker-saturation": saturation}
    with dask.config.set(config), cluster(JobsPlugin(policy="lpt")) as cl, Client(cl) as c:
        estimates = [(i * 7) % 20 + 1.0 for i in range(20)]  # distinct, shuffled
        res = c.compute(annotated(20, lambda i: estimates[i]), sync=True)
        expected = sorted(range(20), key=lambda i: -estimates[i])
        assert start_order(res) == expected


def test_without_the_plugin_dask_runs_submission_order():
    """The control: the same graph without the plugin does not run longest first."""
    with dask.config.set(VALIDATE), cluster() as cl, Client(cl) as c:
        res = c.compute(annotated(20, lambda i: float(i)), sync=True)
        assert start_order(res) != list(range(19, -1, -1))


def dag():
    """``feed`` (short) feeds ``long``; four medium tasks stand alone."""

    def step(x, *deps):
        t = time.time()
        time.sleep(0.01)
        return (t, x)

    with dask.annotate(estimate=1.0):
        feed = dask.delayed(step)("feed", dask_key_name="feed")
    with dask.annotate(estimate=10.0):
        long = dask.delayed(step)("long", feed, dask_key_name="long")
    mids = []
    for i in range(4):
        with dask.annotate(estimate=5.0):
            mids.append(dask.delayed(step)(f"mid{i}", dask_key_name=f"mid-{i}"))
    return [long, *mids, feed]


def test_critical_path_runs_the_feeder_of_a_long_task_first():
    plugin = JobsPlugin(policy="critical-path")
    with dask.config.set(VALIDATE), cluster(plugin) as cl, Client(cl) as c:
        order = [x for _, x in sorted(c.compute(dag(), sync=True))]
        # the feeder runs first; its dependent follows as soon as the scheduler
        # hears it is runnable (the one thread picks up a ready task meanwhile)
        assert order[0] == "feed" and order.index("long") <= 2
    with dask.config.set(VALIDATE), cluster(JobsPlugin(policy="lpt")) as cl, Client(cl) as c:
        order = [x for _, x in sorted(c.compute(dag(), sync=True))]
        assert order.index("feed") > 0  # LPT ranks the 1 s feeder below the 5 s tasks


def test_user_priority_still_dominates():
    with dask.config.set(VALIDATE), cluster(JobsPlugin(policy="lpt")) as cl, Client(cl) as c:
        parts = annotated(6, lambda i: float(i))
        with dask.annotate(priority=10, estimate=0.5):
            parts.append(dask.delayed(stamp)(99, dask_key_name="urgent"))
        res = c.compute(parts, sync=True)
        assert start_order(res)[0] == 99


# -- estimates ----------------------------------------------------------------------------------


def sleepy(i, seconds):
    t = time.time()
    time.sleep(seconds)
    return (t, i)


def test_measured_history_ranks_unannotated_tasks_and_survives_a_restart(tmp_path):
    history = tmp_path / "h.json"
    # stages by key prefix (a task's arguments are not read: estimates.arguments off)
    plugin_kwargs = {
        "policy": "lpt",
        "history": {"path": str(history)},
        "estimates": {"arguments": False},
    }
    with dask.config.set(VALIDATE), cluster(JobsPlugin(**plugin_kwargs)) as cl, Client(cl) as c:
        # teach it: stage "slow" takes ~0.1 s, stage "quick" ~0 s
        warm = [dask.delayed(sleepy)(i, 0.1, dask_key_name=f"slow-w{i}") for i in range(2)]
        warm += [dask.delayed(sleepy)(i, 0.0, dask_key_name=f"quick-w{i}") for i in range(2)]
        c.compute(warm, sync=True)
    assert json.loads(history.read_text())["stages"]["slow"]
    # a new scheduler reads the history: unannotated slow tasks now go first
    with dask.config.set(VALIDATE), cluster(JobsPlugin(**plugin_kwargs)) as cl, Client(cl) as c:
        parts = [dask.delayed(sleepy)(f"q{i}", 0.0, dask_key_name=f"quick-{i}") for i in range(3)]
        parts += [dask.delayed(sleepy)(f"s{i}", 0.01, dask_key_name=f"slow-{i}") for i in range(3)]
        futs = c.compute(parts)  # held: explain reads the tasks' states
        order = [x for _, x in sorted(c.gather(futs))]
        assert order[:3] == ["s0", "s1", "s2"] or sorted(order[:3]) == ["s0", "s1", "s2"]
        info = explain(c, "slow-0")
        assert info["estimate_source"] == "history" and info["stage"] == "slow"


def test_a_corrupt_history_file_is_set_aside_not_fatal(tmp_path):
    history = tmp_path / "h.json"
    history.write_text("{not json")
    with cluster(JobsPlugin(history={"path": str(history)})) as cl, Client(cl) as c:
        assert c.compute(dask.delayed(sum)([1, 2]), sync=True) == 3
    assert (tmp_path / "h.json.corrupt").exists()


# -- bad input and safety -----------------------------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), -1.0, "soon"])
def test_a_bad_estimate_fails_the_submission_with_a_clear_error(bad):
    with dask.config.set(VALIDATE), cluster(JobsPlugin()) as cl, Client(cl) as c:
        with dask.annotate(estimate=bad):
            x = dask.delayed(stamp)(1, dask_key_name="bad-est")
        future = c.compute(x)
        with pytest.raises(Exception, match=r"task 'bad-est': estimate must be") as info:
            future.result()
        # the scheduler goes on working; the refused task is erred while its future lives
        # (as dask keeps a failed task), and nothing is left behind once it is released
        assert c.compute(dask.delayed(sum)([1, 2]), sync=True) == 3
        info.value.with_traceback(None)  # the client's copy of the error: its frames hold it
        del future, info
        deadline = time.time() + 5
        while time.time() < deadline:
            keys = c.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.tasks))
            if "bad-est" not in keys:
                break
            time.sleep(0.05)
        assert "bad-est" not in keys


def test_unknown_team_with_strict_teams_is_an_error_for_that_client():
    plugin = JobsPlugin(teams={"strict": True, "targets": {"quant": 1, "ml": 1}})
    with dask.config.set(VALIDATE), cluster(plugin) as cl, Client(cl) as c:
        with dask.annotate(team="qaunt"):
            x = dask.delayed(stamp)(1, dask_key_name="typo")
        with pytest.raises(Exception, match=r"team 'qaunt', which is not configured.*ml, quant"):
            c.compute(x, sync=True)
        with dask.annotate(team="quant"):
            y = dask.delayed(stamp)(2, dask_key_name="fine")
        assert c.compute(y, sync=True)[1] == 2


def test_an_exception_in_the_policy_leaves_the_scheduler_running():
    with dask.config.set(VALIDATE), cluster(JobsPlugin(policy="lpt")) as cl, Client(cl) as c:

        def break_policy(dask_scheduler):
            def boom(task):
                raise RuntimeError("injected")

            dask_scheduler.plugins["daskjobs"].ranker.policy.key = boom

        c.run_on_scheduler(break_policy)
        res = c.compute(annotated(5, lambda i: float(i)), sync=True)
        assert sorted(i for _, i in res) == [0, 1, 2, 3, 4]
        assert status(c)["errors"] == {"rank": 1}


def test_results_are_identical_with_and_without_the_plugin():
    x = da.random.default_rng(0).random((300, 300), chunks=(100, 100))
    arr = (x @ x.T).sum(axis=0)

    @dask.delayed
    def inc(v):
        return v + 1

    tree = dask.delayed(sum)([inc(i) for i in range(50)])
    results = []
    for plugin in (None, JobsPlugin(policy="critical-path")):
        with cluster(plugin, threads_per_worker=2) as cl, Client(cl) as c:
            results.append(c.compute([arr, tree], sync=True))
    (a0, t0), (a1, t1) = results
    assert t0 == t1 == sum(range(1, 51))
    assert (a0 == a1).all()


def test_explain_says_why_a_task_waits_and_where_it_ran():
    with cluster(JobsPlugin(policy="lpt")) as cl, Client(cl) as c:
        parts = annotated(4, lambda i: float(i), fn=sleepy_short)
        futs = c.compute(parts)
        info = explain(c, "t-0")
        while info["state"] == "unknown":  # the graph is still on its way
            time.sleep(0.01)
            info = explain(c, "t-0")
        assert info["estimate"] == 0.0 and info["estimate_source"] == "annotation"
        assert info["policy"] == "lpt" and info["team"] == "default"
        c.gather(futs)
        done = explain(c, "t-3")
        assert done["state"] == "memory" and done["workers"]
        assert explain(c, "no-such-key")["state"] == "unknown"


def sleepy_short(i):
    time.sleep(0.05)
    return (time.time(), i)


def test_explain_without_the_plugin_says_how_to_load_it():
    with cluster() as cl, Client(cl) as c, pytest.raises(RuntimeError, match="not loaded"):
        explain(c, "x")


# -- configuration ------------------------------------------------------------------------------


def test_keyword_arguments_override_dask_config():
    with dask.config.set({"daskjobs.policy": "fifo", "daskjobs.default-estimate": "2m"}):
        p = JobsPlugin(policy="lpt")
        assert p.settings.policy == "lpt" and p.settings.default_estimate == 120.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"polcy": "lpt"}, r"unknown key\(s\) in daskjobs: polcy"),
        ({"policy": "random"}, r"daskjobs.policy: unknown policy 'random'"),
        ({"default_estimate": "soon"}, r"daskjobs.default-estimate: expected a duration"),
        ({"teams": {"quotas": {"a": 0}}}, r"daskjobs.teams.quotas.a: expected an integer >= 1"),
        ({"history": {"samples": 0}}, r"daskjobs.history.samples"),
    ],
)
def test_bad_configuration_is_rejected_naming_the_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        JobsPlugin(**kwargs)


def test_a_changed_dask_is_named_at_start():
    class Old:
        def __init__(self):
            self.tasks, self.workers, self.handlers, self.periodic_callbacks = {}, {}, {}, {}

        def log_event(self, *a):
            pass

    with pytest.raises(DaskInternalsError, match=r"Scheduler._set_priorities"):
        check_scheduler(Old())


def test_the_plugin_pickles_as_its_configuration():
    import pickle

    p = JobsPlugin(policy="lpt", default_estimate=3)
    q = pickle.loads(pickle.dumps(p))
    assert q.settings == p.settings and q.scheduler is None


def test_an_unregistered_plugin_stops_ranking():
    """dask does not call close() on unregister: the wrapper must step aside itself."""
    with cluster() as cl, Client(cl) as c:
        c.register_plugin(JobsPlugin(policy="lpt"))
        c.unregister_scheduler_plugin("daskjobs")
        estimates = [(i * 3) % 8 + 1.0 for i in range(8)]  # not the key order
        res = c.compute(annotated(8, lambda i: estimates[i]), sync=True)
        assert start_order(res) != sorted(range(8), key=lambda i: -estimates[i])
        wrapped = c.run_on_scheduler(lambda dask_scheduler: dask_scheduler._daskjobs_wrapped)
        assert wrapped is None


def slowed(i, base):
    """Runs four times longer on the worker named 0: a slow machine."""
    from distributed import get_worker

    time.sleep(base * (4 if get_worker().name == 0 else 1))
    return i


def test_the_plugin_learns_which_worker_is_slow():
    with (
        cluster(JobsPlugin(policy="lpt"), n_workers=2, threads_per_worker=2) as cl,
        Client(cl) as c,
    ):
        parts = []
        for i in range(32):
            with dask.annotate(estimate=0.05):
                parts.append(dask.delayed(slowed)(i, 0.05, dask_key_name=f"s-{i}"))
        futs = c.compute(parts)  # held, so that the results stay on the workers
        assert sorted(c.gather(futs)) == list(range(32))
        names = {addr: w["name"] for addr, w in c.scheduler_info()["workers"].items()}
        speeds = {names[w["worker"]]: w for w in status(c)["workers"]}
        assert speeds[0]["speed"] > 2.0 and speeds[0]["samples"] >= 3
        # relative: a loaded machine stretches every sleep alike
        assert speeds[0]["speed"] > 2.0 * speeds[1]["speed"]
        events = [e for _, e in c.get_events("daskjobs") if e["action"] == "worker-speed"]
        assert events  # the belief about the slow worker was announced
        done = explain(c, "s-0")
        assert all(v > 0 for v in done["worker_speed"].values())


def _view(key):
    return LiveTask(key, 1.0, 1, "a", 0.0, (), "annotation", "s")


def test_a_worker_keeps_its_measured_slow_down_across_leaving_and_returning():
    sched = SimpleNamespace(workers={})
    speeds = WorkerSpeeds(Audit(100))
    speeds.scheduler = sched
    sched.workers["tcp://h:1"] = SimpleNamespace(nthreads=1, name="w0")
    for i in range(6):
        speeds.learn(_view(f"k{i}"), "tcp://h:1", 4.0)  # four times its estimates
    before = speeds.speed("tcp://h:1")
    assert before > 2.5
    # it leaves: the row keeps what was learned, marked gone
    del sched.workers["tcp://h:1"]
    speeds.forget("tcp://h:1")
    (row,) = speeds.rows()
    assert (row["present"], row["samples"]) == (False, 6)
    assert row["speed"] == pytest.approx(before)
    # it returns under its name at another address: it starts from what was learned
    sched.workers["tcp://h:2"] = SimpleNamespace(nthreads=1, name="w0")
    assert speeds.speed("tcp://h:2") == pytest.approx(before)
    rows = {r["worker"]: r for r in speeds.rows()}
    assert rows["tcp://h:2"]["samples"] == 6 and rows["tcp://h:2"]["present"]


def test_explain_names_the_inputs_a_task_waits_for():
    def pause(x):
        time.sleep(0.3)
        return x

    with cluster(JobsPlugin()) as cl, Client(cl) as c:
        first = dask.delayed(pause)(1, dask_key_name="first")
        second = dask.delayed(pause)(first, dask_key_name="second")
        fut = c.compute(second)
        info = explain(c, "second")
        while info["state"] in ("unknown", "released"):
            time.sleep(0.01)
            info = explain(c, "second")
        assert info["state"] == "waiting"
        assert info["waiting_on"] == ["first"] and "waiting for 1 input" in info["why"]
        fut.result()


def test_a_plugin_registered_under_another_name_still_ranks():
    with cluster() as cl, Client(cl) as c:
        c.register_plugin(JobsPlugin(policy="lpt"), name="jobs-for-team-a")
        estimates = [(i * 3) % 8 + 1.0 for i in range(8)]
        res = c.compute(annotated(8, lambda i: estimates[i]), sync=True)
        assert start_order(res) == sorted(range(8), key=lambda i: -estimates[i])
