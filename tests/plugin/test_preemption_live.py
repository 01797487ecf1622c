"""Preemption live on dask: interactive (``job_class="te"``) tasks take GPUs back from
best-effort tasks that checkpoint (docs/explanation/preemption.md, "Live on dask").

Order, causality and counts only: a TE task starts before the best-effort work it
displaced ends; the displaced tasks resume from their checkpoints and return what an
unpreempted run returns."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import pytest
from conftest import VALIDATE, plugin_cluster
from distributed import Client

import daskjobs
from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.client import status

STEPS = 20
STEP_S = 0.05


def train(i: int, steps: int = STEPS, step_s: float = STEP_S) -> dict[str, Any]:
    """A best-effort task: ``steps`` steps, a checkpoint after each; yields when asked."""
    state = daskjobs.restore(default={"step": 0, "acc": 0, "runs": 0, "resumed_at": []})
    state["runs"] += 1
    state["resumed_at"].append(state["step"])
    while state["step"] < steps:
        time.sleep(step_s)
        state["acc"] += i * state["step"]
        state["step"] += 1
        daskjobs.checkpoint(state)
        if daskjobs.preempted():
            raise daskjobs.Preempted()
    state["end"] = time.time()
    return state


def stubborn(seconds: float) -> float:
    """A best-effort task that never asks whether it is preempted."""
    time.sleep(seconds)
    return time.time()


def probe(i: int) -> float:
    """An interactive task: when did it start?"""
    return time.time()


def once_interrupted(n: int) -> tuple[int, list[int]]:
    """Counts to ``n``, a checkpoint a step; yields once, half way (first run only)."""
    state = daskjobs.restore(default={"i": 0, "restored": []})
    state["restored"].append(state["i"])
    while state["i"] < n:
        state["i"] += 1
        daskjobs.checkpoint(state)
        if state["i"] == n // 2 and len(state["restored"]) == 1:
            raise daskjobs.Preempted()
    return state["i"] * 10, state["restored"]


def expected_acc(i: int, steps: int = STEPS) -> int:
    return i * sum(range(steps))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Path]:
    with dask.config.set({"daskjobs.store": str(tmp_path / "store")}):
        yield tmp_path / "store"


def _gpu_cluster(plugin: JobsPlugin) -> Any:
    return plugin_cluster(plugin, n_workers=2, threads_per_worker=4, resources={"GPU": 2})


def _wait_running(plugin: JobsPlugin, n: int, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while plugin.preemptor is None or len(plugin.preemptor.runs) < n:
        assert time.time() < deadline, "the best-effort tasks did not all start"
        time.sleep(0.02)


PREEMPTION = {"enabled": True, "min_runtime": 0, "grace": "10s", "interval": "20ms"}


@pytest.mark.parametrize("policy", ["fifo", "fair-share"])  # a heap policy and a popper
def test_interactive_tasks_take_gpus_from_checkpointing_best_effort_ones(
    store: Path, policy: str
) -> None:
    plugin = JobsPlugin(policy=policy, preemption=PREEMPTION)
    with dask.config.set(VALIDATE), _gpu_cluster(plugin) as cl, Client(cl) as c:
        with dask.annotate(resources={"GPU": 1}):
            be = [c.submit(train, i, key=f"train-{i}") for i in range(4)]
        _wait_running(plugin, 4)  # all 4 GPUs busy with best-effort work
        with dask.annotate(resources={"GPU": 1}, job_class="te"):
            te = [c.submit(probe, i, key=f"probe-{i}") for i in range(2)]
        te_start = c.gather(te)
        results = c.gather(be)
        st = status(c)["preemption"]
        assert status(c)["errors"] == {}
    ends = sorted(r["end"] for r in results)
    # each TE task started while best-effort work it displaced was still to finish
    assert max(te_start) < ends[-1]
    assert st["requested"] >= 2 and st["yielded"] >= 2 and st["ignored"] == 0
    assert st["requested"] == st["yielded"] + st["finished_first"] and st["asked"] == []
    resumed = [r for r in results if r["runs"] > 1]
    assert len(resumed) >= 2
    # the displaced tasks resumed from their checkpoints (work lost: at most one step)
    assert all(r["resumed_at"][-1] > 0 for r in resumed)
    # and return what an unpreempted run returns
    assert [(r["step"], r["acc"]) for r in results] == [(STEPS, expected_acc(i)) for i in range(4)]
    # a finished task's checkpoint is removed
    assert not list((store / "daskjobs-store-v1" / "checkpoints").glob("*"))


def test_without_preemption_interactive_tasks_wait_for_best_effort_ones(store: Path) -> None:
    plugin = JobsPlugin(policy="fifo")
    with dask.config.set(VALIDATE), _gpu_cluster(plugin) as cl, Client(cl) as c:
        with dask.annotate(resources={"GPU": 1}):
            be = [c.submit(train, i, key=f"train-{i}") for i in range(4)]
        deadline = time.time() + 30
        while sum(c.run(lambda dask_worker: len(dask_worker.state.executing)).values()) < 4:
            assert time.time() < deadline, "the best-effort tasks did not all start"
            time.sleep(0.02)
        with dask.annotate(resources={"GPU": 1}, job_class="te"):
            te = [c.submit(probe, i, key=f"probe-{i}") for i in range(2)]
        te_start = c.gather(te)
        results = c.gather(be)
    assert min(te_start) >= min(r["end"] for r in results)  # a GPU came free first
    assert all(r["runs"] == 1 for r in results)


def test_a_task_that_never_checks_keeps_its_gpu_and_is_counted(store: Path) -> None:
    plugin = JobsPlugin(policy="fifo", preemption={**PREEMPTION, "grace": "200ms"})
    with dask.config.set(VALIDATE), _gpu_cluster(plugin) as cl, Client(cl) as c:
        with dask.annotate(resources={"GPU": 2}):
            be = [c.submit(stubborn, 1.5, key=f"stubborn-{i}") for i in range(2)]
        _wait_running(plugin, 2)
        with dask.annotate(resources={"GPU": 1}, job_class="te"):
            te = c.submit(probe, 0, key="probe-0")
        started = te.result()
        ends = c.gather(be)
        st = status(c)["preemption"]
    assert started >= min(ends)  # it waited for a GPU to come free
    # each stubborn task was asked once and, past the grace period, counted and left alone
    assert st["requested"] == 2 and st["ignored"] == 2 and st["yielded"] == 0


def test_a_checkpoint_round_trip_across_a_reschedule(store: Path) -> None:
    """No plugin needed: a task that checkpoints and raises Preempted is run again by
    dask and restores its state; its result equals an uninterrupted run's."""
    with plugin_cluster(None) as cl, Client(cl) as c:
        assert c.submit(once_interrupted, 8, key="once").result() == (80, [0, 4])
    # without the plugin's worker plugin nobody removes it (docs/explanation/preemption.md)
    assert len(list((store / "daskjobs-store-v1" / "checkpoints").glob("*"))) == 1
    assert not daskjobs.preempted() and daskjobs.restore("outside") == "outside"
    with pytest.raises(TypeError, match="inside a dask task"):
        daskjobs.checkpoint(1)


def test_a_bad_job_class_is_refused_at_submission() -> None:
    plugin = JobsPlugin(policy="fifo", preemption=PREEMPTION)
    with plugin_cluster(plugin) as cl, Client(cl) as c:
        with dask.annotate(job_class="urgent"):
            fut = c.submit(probe, 0, key="probe-bad")
        with pytest.raises(Exception, match="job_class 'urgent'"):
            fut.result(timeout=30)


@pytest.mark.slow
def test_a_victims_worker_dying_mid_preemption_loses_nothing(store: Path) -> None:
    """The worker of a victim that was asked to yield dies before it does: its tasks run
    again elsewhere (from their checkpoints), the interactive task runs, every result is
    an unpreempted run's, and the plugin swallowed no error."""
    plugin = JobsPlugin(policy="fifo", preemption=PREEMPTION)
    with dask.config.set(VALIDATE), _gpu_cluster(plugin) as cl, Client(cl) as c:
        with dask.annotate(resources={"GPU": 1}):
            be = [c.submit(train, i, 6, 0.3, key=f"train-{i}") for i in range(4)]
        _wait_running(plugin, 4)
        with dask.annotate(resources={"GPU": 1}, job_class="te"):
            te = c.submit(probe, 0, key="probe-0")
        pe = plugin.preemptor
        assert pe is not None
        deadline = time.time() + 30
        while not pe.asked:  # a victim was asked; its step lasts 0.3 s
            assert time.time() < deadline, "no victim was asked"
            time.sleep(0.005)
        victim = next(iter(pe.asked))
        doomed = pe.runs[victim].worker
        c.sync(cl.scheduler.remove_worker, address=doomed, stimulus_id="test-kill", close=True)
        te.result(timeout=60)
        results = c.gather(be)
        assert status(c)["errors"] == {}
        st = status(c)["preemption"]
    assert [(r["step"], r["acc"]) for r in results] == [(6, expected_acc(i, 6)) for i in range(4)]
    # every victim asked is accounted for once
    settled = st["yielded"] + st["finished_first"] + st["ignored"] + st["lost_with_worker"]
    assert st["requested"] == settled and st["asked"] == []


def test_a_recorded_preemption_run_replays_under_preemption_policies(
    store: Path, tmp_path: Path
) -> None:
    """The run recorded (job classes, resources, preempted runs, the plugin's preempt
    events) becomes the job-level simulator's workload: its jobs, its cluster, and the
    checkpoint interval and grace estimated from the trace; replayed, preemption beats
    waiting for the interactive tasks, as it did live."""
    from daskjobs.replay.preemption import replay_preemption, workload_from_trace

    trace = tmp_path / "run.jsonl"
    plugin = JobsPlugin(policy="fifo", preemption=PREEMPTION, record=str(trace))
    with dask.config.set(VALIDATE), _gpu_cluster(plugin) as cl, Client(cl) as c:
        with dask.annotate(resources={"GPU": 1}):
            be = [c.submit(train, i, key=f"train-{i}") for i in range(4)]
        _wait_running(plugin, 4)
        with dask.annotate(resources={"GPU": 1}, job_class="te"):
            te = [c.submit(probe, i, key=f"probe-{i}") for i in range(2)]
        c.gather(te)
        c.gather(be)
        yielded = status(c)["preemption"]["yielded"]
    assert yielded >= 2
    wl = workload_from_trace(trace)
    assert sorted(j.cls for j in wl.jobs) == ["be"] * 4 + ["te"] * 2
    assert (wl.cluster.nodes, wl.cluster.gpus_per_node) == (2, 2)
    assert all(j.gpus == 1 for j in wl.jobs)
    ckpt = wl.description["checkpoint"]  # from the recorded checkpoints: one a step
    assert ckpt is not None and STEP_S * 0.8 <= ckpt <= STEP_S * 3
    assert 0 < wl.cluster.grace < 5  # the victims gave their GPUs back
    rows = {r["policy"]: r for r in replay_preemption(trace, min_runtime=0)}
    assert set(rows) == {"fifo", "te-first", "naive", "fit-resume", "recorded"}
    assert rows["fit-resume"]["te_slowdown_p95"] < rows["fifo"]["te_slowdown_p95"]
    with pytest.raises(ValueError, match="no recorded task needs the resource 'TPU'"):
        workload_from_trace(trace, resource="TPU")


def test_preemption_on_real_processes_with_daskjobs_defaults(
    real_cluster: Any, tmp_path: Path
) -> None:
    """The plugin preloaded into a real ``dask scheduler``, two ``dask worker`` processes
    with 2 GPUs each, dask's default configuration and validation on: interactive tasks
    take GPUs back, the displaced tasks resume on whichever worker from the shared store,
    results equal an unpreempted run's, and no log line shows a broken invariant."""
    import realtasks

    config = {
        "daskjobs": {
            "policy": "fifo",
            "store": str(tmp_path / "store"),
            "preemption": {
                "enabled": True,
                "min-runtime": "0s",
                "grace": "10s",
                "interval": "20ms",
            },
        }
    }
    rc = real_cluster(n_workers=2, nthreads=4, config=config, worker_resources="GPU=2")
    with rc.client() as c:
        with dask.annotate(resources={"GPU": 1}):
            be = [c.submit(realtasks.train, i, 20, 0.05, key=f"train-{i}") for i in range(4)]
        deadline = time.time() + 60
        while (status(c)["preemption"] or {}).get("running", 0) < 4:
            assert time.time() < deadline, status(c)["preemption"]
            time.sleep(0.05)
        with dask.annotate(resources={"GPU": 1}, job_class="te"):
            te = [c.submit(realtasks.started_at, i, key=f"probe-{i}") for i in range(2)]
        c.gather(te)
        results = c.gather(be)
        st = status(c)
    assert st["errors"] == {}
    pre = st["preemption"]
    assert pre["yielded"] >= 2 and pre["requested"] == pre["yielded"] + pre["finished_first"]
    assert sum(r["runs"] > 1 for r in results) >= 2
    assert [(r["step"], r["acc"]) for r in results] == [(20, expected_acc(i, 20)) for i in range(4)]
    assert all(rc.alive(f"w{i}") for i in range(2))
    assert rc.problems() == []


# -- the enactor's books, without a cluster ---------------------------------------------------


class _Scheduler:
    """What the enactor reaches of a scheduler: the workers' streams and the event log."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.stream_comms = {"w0": _Stream("w0", self.sent)}
        self.logged: list[dict[str, Any]] = []

    def log_event(self, topic: str, msg: dict[str, Any]) -> None:
        self.logged.append(msg)


class _Stream:
    def __init__(self, address: str, sent: list[tuple[str, dict[str, Any]]]) -> None:
        self.address, self.out = address, sent

    def send(self, msg: dict[str, Any]) -> None:
        self.out.append((self.address, msg))


def _enactor(grace: float = 1.0) -> tuple[Any, _Scheduler]:
    from daskjobs.plugin.audit import Audit
    from daskjobs.plugin.enact.preemption import Enactor
    from daskjobs.policies.preemption import FitResume

    audit = Audit(100)
    sched = _Scheduler()
    audit.scheduler = sched  # type: ignore[assignment]
    en = Enactor(FitResume(min_runtime=0), "GPU", grace, audit)
    en.scheduler = sched  # type: ignore[assignment]
    return en, sched


def _one_victim(en: Any, now: float) -> None:
    from daskjobs.plugin.enact.preemption import _Job, _Run
    from daskjobs.policies.preemption import Preemption

    run = _Run(_Job("be-0", "be", 2.0, 0.0), 0, "w0", 0.0, 0, 0, 0.0)
    act = Preemption(1, _Job("te-0", "te", 1.0, 1.0), 0, (run,), (), 2.0, "fits nowhere")
    en.ask(act, "w0", ["be-0"], 1.0, lambda k: "w0", now)


def test_a_victim_ignoring_a_request_is_counted_once_and_may_be_asked_in_its_next_run() -> None:
    """Past the grace a victim that did not yield is counted, audited and never asked again
    in this run (the promise goes, so another choice can be made); once that run ends it is
    no longer held as ignoring: a later run of the task may be asked, and a long-lived
    scheduler keeps no record of every task that once ignored a request."""
    en, sched = _enactor(grace=1.0)
    _one_victim(en, now=0.0)
    assert sched.sent == [("w0", {"op": "daskjobs-preempt", "keys": ["be-0"]})]
    assert en.asked == {"be-0": 0.0} and "te-0" in en.promises
    en.expire(0.5)  # within the grace: nothing changes
    assert en.asked == {"be-0": 0.0} and not en.ignoring
    en.expire(1.0)
    assert not en.asked and en.ignoring == {"be-0"} and not en.promises
    assert en.stats.ignored == 1
    ignored = [m for m in sched.logged if m["action"] == "preempt-ignored"]
    assert ignored == [
        {"action": "preempt-ignored", "key": "te-0", "victims": ["be-0"], "grace": 1.0}
    ]
    en.left("be-0", "memory", "task-finished-1")  # its run ended: not a yield
    assert not en.ignoring and en.stats.finished_first == 0 and en.stats.yielded == 0
