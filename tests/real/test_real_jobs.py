"""Jobs on real ``dask scheduler`` / ``dask worker`` processes with faults, on both
ledger backends (the ``ledger_url`` fixture): the scheduler SIGKILLed mid-run and a new
one started on the same ledger; a worker paused (SIGSTOP) past its lease; a launch
whose reply is lost; the database unreachable for a while. In each, every job ends,
each part's output is committed exactly once, and the ledger says why every other
attempt ended."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ledgeroutage import outage
from realcluster import RealCluster
from realjobs import WAIT, clean_logs, committed_once, config, runs
from waiting import until

import daskjobs.jobs as jobs
from daskjobs.jobs import Ledger
from daskjobs.jobs.api import _call


def start(
    real_cluster: Callable[..., RealCluster], url: str, store: Path, **kw: Any
) -> RealCluster:
    return real_cluster(
        preload="daskjobs.preload",
        preload_args=["--daskjobs-ledger", url],
        config=kw.pop("config", None) or config(store),
        **kw,
    )


# (ledger_url comes before real_cluster in every signature: pytest tears fixtures down in
# reverse, so the cluster stops before its database is dropped)


def test_scheduler_killed_and_restarted_on_the_same_ledger(
    ledger_url: str, real_cluster: Callable[..., RealCluster], tmp_path: Path
) -> None:
    store, marks = tmp_path / "store", tmp_path / "marks"
    rc = start(real_cluster, ledger_url, store, n_workers=2, nthreads=2)
    with rc.client() as c:
        train = jobs.submit(
            c,
            "train",
            kind="training",
            target="jobtasks:train",
            params={"steps": 80, "step_seconds": 0.05},
            checkpoint_every=0.3,
            priority=1,
        )
        job = jobs.submit(
            c,
            "score",
            kind="inference",
            parts=12,
            target="jobtasks:score",
            params={"seconds": 1.0, "marks": str(marks)},
        )
        led = Ledger(ledger_url)
        until(
            lambda: len(led.outputs(job.job_id)) >= 2 and led.checkpoint(train.job_id, 0),
            "some parts committed and a checkpoint",
        )
    clean_logs(rc)  # the run until the fault
    rc.kill_scheduler()  # SIGKILL: no goodbye; the workers shut down with it
    for name in ("w0", "w1"):
        rc.kill(name)
    # (the workers' last words, dask's own heartbeat tracebacks, are expected)
    after = {name: len(rc.log(name)) for name in ("scheduler", "w0", "w1")}
    rc.start_scheduler()
    for name in ("w0", "w1"):
        rc.start_worker(name)
    rc.wait_for_workers(2)
    with rc.client() as c:
        again = jobs.submit(
            c,
            "score",
            kind="inference",
            parts=12,
            target="jobtasks:score",
            params={"seconds": 1.0, "marks": str(marks)},
        )
        assert again.job_id == job.job_id  # the job's identity back
        assert again.result(timeout=WAIT) == [10 * p for p in range(12)]
        state = jobs.Job(c, train.job_id).result(timeout=WAIT)
        assert state["step"] == 80 and state["resumed_from"] > 0  # resumed, not restarted
    assert led.epoch() == 2
    committed_once(led, job.job_id, 12)
    committed_once(led, train.job_id, 1)
    why = {
        a.reason
        for a in led.attempts(job.job_id) + led.attempts(train.job_id)
        if a.state != "succeeded"
    }
    assert why <= {"lease expired"}, why
    led.close()
    clean_logs(rc, since=after)


def test_a_paused_worker_cannot_commit_after_its_part_moved(
    ledger_url: str, real_cluster: Callable[..., RealCluster], tmp_path: Path
) -> None:
    store, marks, gate = tmp_path / "store", tmp_path / "marks", tmp_path / "gate"
    rc = start(real_cluster, ledger_url, store, n_workers=2, nthreads=2)
    led = Ledger(ledger_url)
    with rc.client() as c:
        job = jobs.submit(
            c,
            "held",
            kind="inference",
            parts=2,
            target="jobtasks:until_file",
            params={"path": str(gate), "marks": str(marks)},
        )
        first = until(
            lambda: [a for a in led.attempts(job.job_id) if a.state == "running" and a.part == 0],
            "part 0 running",
        )[0]
        name = next(n for n in ("w0", "w1") if rc.worker_address(c, n) == first.worker)
        rc.pause(name)
        try:
            until(
                lambda: any(
                    a.part == 0 and a.token == first.token + 1 and a.state == "running"
                    for a in led.attempts(job.job_id)
                ),
                "part 0 reassigned",
            )
            gate.touch()
            until(lambda: led.job(job.job_id).state == "succeeded", "the job to succeed")
        finally:
            rc.resume(name)
        # the paused attempt wakes, finishes, and its commit is refused
        until(
            lambda: [h for h in led.history(f"{job.job_id}/0") if h["to_state"] == "refused"],
            "the late commit refused",
        )
        assert job.result(timeout=WAIT) == ["released part 0", "released part 1"]
    committed_once(led, job.job_id, 2)
    old = next(a for a in led.attempts(job.job_id) if a.attempt_id == first.attempt_id)
    assert (old.state, old.reason) == ("lost", "lease expired")
    assert led.outputs(job.job_id)[0].endswith(f"-p0-t{first.token + 1}")
    assert runs(marks, job.job_id, 0) == 2
    led.close()
    clean_logs(rc)


def test_a_launch_whose_reply_is_lost_is_reconciled_not_run_twice(
    ledger_url: str, real_cluster: Callable[..., RealCluster], tmp_path: Path
) -> None:
    store, marks = tmp_path / "store", tmp_path / "marks"
    cfg = config(store)
    cfg["distributed"] = {"worker": {"preload": ["jobfaults"]}}
    rc = start(
        real_cluster,
        ledger_url,
        store,
        n_workers=2,
        nthreads=2,
        config=cfg,
        env={"DASKJOBS_TEST_DROP_ACK": "1"},
    )
    with rc.client() as c:
        job = jobs.submit(
            c,
            "score",
            kind="inference",
            parts=3,
            target="jobtasks:score",
            params={"seconds": 2.5, "marks": str(marks)},
        )
        assert job.result(timeout=WAIT) == [0, 10, 20]
        story = job.explain()
    led = Ledger(ledger_url)
    committed_once(led, job.job_id, 3)
    for p in range(3):
        assert runs(marks, job.job_id, p) == 1, story
    assert [a.token for a in led.attempts(job.job_id)] == [1, 1, 1], story
    assert story.count("launching -> unknown (not acknowledged") == 3, story
    led.close()
    clean_logs(rc)


def test_scheduling_goes_on_while_the_database_is_unreachable(
    ledger_url: str, real_cluster: Callable[..., RealCluster], tmp_path: Path
) -> None:
    store, marks = tmp_path / "store", tmp_path / "marks"
    rc = start(real_cluster, ledger_url, store, n_workers=2, nthreads=2)
    with rc.client() as c:
        job = jobs.submit(
            c,
            "score",
            kind="inference",
            parts=6,
            target="jobtasks:score",
            params={"seconds": 0.5, "marks": str(marks)},
        )
        led = Ledger(ledger_url)
        until(lambda: led.outputs(job.job_id), "a first commit")
        with outage(ledger_url):
            futures = c.map(lambda x: x * 2, range(40))
            assert c.gather(futures) == [x * 2 for x in range(40)]
            if ledger_url.startswith("postgresql"):
                until(lambda: not jobs.api._call(c, "status")["reachable"], "the outage seen")
            time.sleep(2.5)  # longer than a lease
        assert job.result(timeout=WAIT) == [10 * p for p in range(6)]
        assert jobs.api._call(c, "status")["reachable"] is True
        story = job.explain()
    committed_once(led, job.job_id, 6)
    for p in range(6):
        # no lease expired while nobody could renew: nothing ran twice
        assert runs(marks, job.job_id, p) == 1, story
    led.close()
    if ledger_url.startswith("postgresql"):
        assert "unreachable" in rc.log("scheduler") and "reachable again" in rc.log("scheduler")
    clean_logs(rc, "ledger unreachable")


def test_two_schedulers_on_one_ledger_the_fenced_one_says_so_once_and_stops(
    ledger_url: str, real_cluster: Callable[..., RealCluster], tmp_path: Path
) -> None:
    """Two schedulers started one after the other on one ledger: the second takes the
    ledger and says from whom at start; the first, fenced, logs one ERROR naming the
    newer epoch and its holder, stops ticking, says ``fenced`` in its status and its
    metrics, and refuses submissions with that message; the second runs jobs."""
    import urllib.request

    store = tmp_path / "store"
    first = start(real_cluster, ledger_url, store, n_workers=1)
    with first.client() as c:
        until(lambda: _call(c, "status")["ticks"] > 0, "the first service ticking")
        assert _call(c, "status")["epoch"] == 1
    second = start(real_cluster, ledger_url, store, n_workers=1)
    with first.client() as ca, second.client() as cb:
        took = [ln for ln in second.log("scheduler").splitlines() if "took over the ledger" in ln]
        assert len(took) == 1 and " - WARNING - " in took[0], took
        assert f"at epoch 2 from epoch 1, held by scheduler {first.address}" in took[0]
        assert "still ran a moment ago; it is fenced now" in took[0]
        st = until(
            lambda: (s := _call(ca, "status"))["state"] == "fenced" and s,
            "the first service fenced",
        )
        assert (st["fenced"]["epoch"], st["fenced"]["by_epoch"]) == (1, 2)
        assert st["fenced"]["holder"] == f"scheduler {second.address}"
        newer = f"epoch 2, held by scheduler {second.address}"
        with pytest.raises(jobs.Fenced, match=re.escape(newer)):
            jobs.submit(ca, "x", kind="inference", target="jobtasks:score")
        port = ca.scheduler_info()["services"]["dashboard"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            metrics = r.read().decode()
        assert "dask_daskjobs_jobs_service_fenced 1.0" in metrics
        # the holder serves: a job submitted through it runs; meanwhile it ticks on
        ticks = _call(cb, "status")["ticks"]
        assert jobs.submit(cb, "y", kind="inference", target="jobtasks:score").result(WAIT) == [0]
        until(lambda: _call(cb, "status")["ticks"] > ticks + 20, "twenty more ticks")
        assert _call(cb, "status")["state"] == "serving"
        assert _call(ca, "status")["ticks"] == st["ticks"]  # the fenced one stopped
    log = first.log("scheduler")
    said = [ln for ln in log.splitlines() if "is fenced" in ln]
    assert len(said) == 1 and " - ERROR - " in said[0], said
    assert newer in said[0] and "this one held epoch 1" in said[0]
    clean_logs(first)
    clean_logs(second)
