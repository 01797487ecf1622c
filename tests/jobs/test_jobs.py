"""Jobs on a dask cluster (in-process LocalCluster, both ledger backends): submit,
results, identities, retries, cancellation, checkpoints, fencing of late attempts,
restart of the service on the same ledger, and an unreachable database. The same
scenarios with real processes killed and paused are in tests/real/test_real_jobs.py."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from distributed import Client, LocalCluster
from ledgeroutage import outage

import daskjobs.jobs as jobs
from daskjobs.jobs import JobFailed, JobSpec, JobsService, Ledger
from daskjobs.jobs.model import JobSpecError


def marks(d: Path) -> list[str]:
    return sorted(os.listdir(d)) if d.exists() else []


@pytest.fixture
def cluster(ledger_url: str, tmp_path: Path) -> Iterator[tuple[Client, JobsService]]:
    service = JobsService(
        ledger=ledger_url, store=str(tmp_path / "store"), lease="2s", interval="50ms"
    )
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=2,
            processes=False,
            dashboard_address=":0",
            scheduler_kwargs={"plugins": [service]},
        ) as lc,
        Client(lc) as client,
    ):
        yield client, service


@pytest.mark.slow
def test_inference_job_runs_every_part_once(cluster: Any, tmp_path: Path) -> None:
    client, service = cluster
    m = tmp_path / "marks"
    job = jobs.submit(
        client,
        "score",
        kind="inference",
        parts=4,
        target="jobtasks:score",
        params={"marks": str(m)},
    )
    assert job.result(timeout=60) == [0, 10, 20, 30]
    st = job.status()
    assert st["state"] == "succeeded" and st["missing"] == []
    assert [a["state"] for a in st["attempts"]] == ["succeeded"] * 4
    assert len(marks(m)) == 4
    # the same job again: the same identity, nothing runs
    again = jobs.submit(
        client,
        "score",
        kind="inference",
        parts=4,
        target="jobtasks:score",
        params={"marks": str(m)},
    )
    assert again.job_id == job.job_id and again.state == "succeeded"
    time.sleep(0.3)
    assert len(marks(m)) == 4
    assert [j.job_id for j in jobs.list(client)] == [job.job_id]
    assert service.status()["reachable"] is True


@pytest.mark.slow
def test_a_function_and_its_failures(cluster: Any) -> None:
    client, _ = cluster

    def double(attempt: Any, x: int) -> int:
        return 2 * x

    assert jobs.submit(client, "double", double, params={"x": 21}).result(timeout=60) == 42
    flaky = jobs.submit(
        client, "flaky", target="jobtasks:flaky", params={"fail_times": 2}, retries=2
    )
    assert flaky.result(timeout=60) == "ok after 3"
    states = [a["state"] for a in flaky.attempts()]
    assert states == ["failed", "failed", "succeeded"]
    assert "ValueError('flaky: attempt with token 1 fails')" in flaky.attempts()[0]["reason"]
    doomed = jobs.submit(
        client, "doomed", target="jobtasks:flaky", params={"fail_times": 5}, retries=1
    )
    with pytest.raises(JobFailed, match="failed: part 0 failed 2 time"):
        doomed.result(timeout=60)
    assert doomed.retry() is True  # a fresh budget: attempts 3 and 4 fail, 5 would not
    with pytest.raises(JobFailed):
        doomed.result(timeout=60)
    assert [a["token"] for a in doomed.attempts()] == [1, 2, 3, 4]
    assert "failed -> queued (retried by a client)" in doomed.explain()


def test_bad_submissions_are_named(cluster: Any) -> None:
    client, _ = cluster
    with pytest.raises(ValueError, match="nothing to run"):
        jobs.submit(client, "nothing")
    with pytest.raises(ValueError, match=r"JobSpec\.kind"):
        jobs.submit(client, "x", kind="batch", target="m:f")
    # a target the workers cannot import is refused before it is recorded (as a sweep's
    # missing module is), not recorded to fail its attempts one by one
    with pytest.raises(JobSpecError, match="No module named 'nosuchmodule'"):
        jobs.submit(client, "bad", target="nosuchmodule:f", retries=0)
    assert jobs.list(client) == []


@pytest.mark.slow
def test_cancel_stops_and_fences(cluster: Any, tmp_path: Path) -> None:
    client, _ = cluster
    gate = tmp_path / "gate"
    job = jobs.submit(
        client,
        "wait",
        kind="inference",
        parts=2,
        target="jobtasks:until_file",
        params={"path": str(gate)},
    )
    deadline = time.monotonic() + 30
    while [a["state"] for a in job.attempts()] != ["running", "running"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert job.cancel() is True
    gate.touch()  # the threads finish now; their commits must be refused
    with pytest.raises(JobFailed, match="cancelled"):
        job.result(timeout=30)
    deadline = time.monotonic() + 30
    while True:
        m = jobs.submit(client, "m", target="jobtasks:score")  # keeps the loop busy
        refused = sum(1 for h in job.history() if h["to_state"] == "refused")
        if refused == 2:
            break
        assert time.monotonic() < deadline, job.explain()
        time.sleep(0.1)
    assert m.result(timeout=30) == 0
    assert job.status()["outputs"] == {}


@pytest.mark.slow
def test_training_resumes_from_its_checkpoint(ledger_url: str, tmp_path: Path) -> None:
    """An attempt that lost its part stops at its next step (its heartbeat is refused);
    the next attempt resumes from the last committed checkpoint. (The first attempt's
    loop is long enough to run until it is stopped, whenever that comes.)"""
    led = Ledger(ledger_url)
    spec = JobSpec(
        "train",
        kind="training",
        target="jobtasks:train",
        params={"steps": 200, "step_seconds": 0.02},
        checkpoint_every=0.1,
    )
    e = led.acquire_epoch()
    job = led.submit(spec, e).job_id
    first = led.start_attempt(job, 0, None, 30, e)
    import threading

    from daskjobs.jobs.runner import Order, run_attempt

    order = Order(
        ledger_url=ledger_url,
        store_url=str(tmp_path / "store"),
        job_id=job,
        part=0,
        parts=1,
        token=first.token,
        attempt_id=first.attempt_id,
        target=spec.target,
        params={**spec.params, "steps": 10**6},
        lease=0.3,
        checkpoint_every=0.1,
    )
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.update(r=run_attempt(order, wait=30)))
    t.start()
    deadline = time.monotonic() + 30
    while led.checkpoint(job, 0) is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    led.end_attempt(first.attempt_id, first.token, "lost", e, "test: worker left")
    t.join(30)
    assert out["r"]["state"] == "fenced"
    # its last checkpoint: the lost attempt's later ones were refused
    from daskjobs.cache.store import ResultStore

    location = led.checkpoint(job, 0)
    assert location is not None
    saved = ResultStore(order.store_url).get(location)["step"]
    assert saved > 0
    second = led.start_attempt(job, 0, None, 30, e)
    resumed = run_attempt(
        Order(
            **{
                **order.__dict__,
                "token": second.token,
                "attempt_id": second.attempt_id,
                "params": {**spec.params, "steps": saved + 20},
            }
        ),
        wait=30,
    )
    assert resumed["state"] == "succeeded"
    import pickle

    assert resumed["location"].startswith("ledger:")  # small: kept in the ledger's row
    value = pickle.loads(led.output_values(job)[0])
    assert value == {"step": saved + 20, "resumed_from": saved}
    assert led.outputs(job) == {0: resumed["location"]}


@pytest.mark.slow
def test_a_new_scheduler_on_the_same_ledger_finishes_every_job(
    ledger_url: str, tmp_path: Path
) -> None:
    """The first scheduler stops mid-run (its attempts' threads go on and try to commit);
    a second one on the same ledger takes the next epoch, reconciles, and every job ends
    with each part's output visible exactly once."""
    store = str(tmp_path / "store")
    m = tmp_path / "marks"
    gate = tmp_path / "gate"

    def cluster() -> LocalCluster:
        service = JobsService(ledger=ledger_url, store=store, lease="1s", interval="50ms")
        return LocalCluster(
            n_workers=2,
            threads_per_worker=3,
            processes=False,
            dashboard_address=":0",
            scheduler_kwargs={"plugins": [service]},
        )

    with cluster() as lc, Client(lc) as client:
        held = jobs.submit(
            client,
            "held",
            kind="inference",
            parts=3,
            target="jobtasks:until_file",
            params={"path": str(gate), "marks": str(m)},
        )
        quick = jobs.submit(
            client,
            "quick",
            kind="inference",
            parts=5,
            target="jobtasks:score",
            params={"seconds": 0.05, "marks": str(m)},
        )
        deadline = time.monotonic() + 30
        while sum(a["state"] == "running" for a in held.attempts()) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # the held attempts finish while the first scheduler closes: their commits land
        # with no scheduler to hear of them (their tokens are still current)
        threading.Timer(0.5, gate.touch).start()
    # the first scheduler recorded a launch and died before dask got it (written once it
    # is gone, with its epoch: a live service would start the job's part itself first)
    led = Ledger(ledger_url)
    assert led.epoch() == 1
    orphan = led.submit(JobSpec("orphan", target="jobtasks:score"), 1).job_id
    led.start_attempt(orphan, 0, None, 1.0, 1)
    led.close()
    ids = (held.job_id, quick.job_id, orphan)
    with cluster() as lc, Client(lc) as client:
        for job_id in ids:
            status = jobs.Job(client, job_id).wait(timeout=60)
            assert status["state"] == "succeeded", jobs.Job(client, job_id).explain()
        again = jobs.submit(
            client,
            "quick",
            kind="inference",
            parts=5,
            target="jobtasks:score",
            params={"seconds": 0.05, "marks": str(m)},
        )
        assert again.job_id == quick.job_id
        assert again.result(timeout=30) == [0, 10, 20, 30, 40]
        assert jobs.Job(client, held.job_id).result(timeout=30) == [
            f"released part {p}" for p in range(3)
        ]
        story = jobs.Job(client, orphan).explain()
        assert "launching -> unknown (the scheduler that launched it is gone" in story, story
        assert "unknown -> lost (lease expired)" in story, story
    led = Ledger(ledger_url)
    assert led.epoch() == 2
    for job_id, parts in ((held.job_id, 3), (quick.job_id, 5), (orphan, 1)):
        outputs = led.outputs(job_id)
        assert sorted(outputs) == list(range(parts))
        committed = [
            h
            for h in led.history()
            if h["kind"] == "output"
            and h["to_state"] == "committed"
            and h["ref"].startswith(job_id)
        ]
        assert len(committed) == parts  # each part exactly once
        for a in led.attempts(job_id):
            assert a.state in ("succeeded", "lost", "fenced", "cancelled"), a
            if a.state != "succeeded":
                assert a.reason, a  # the ledger says why
    led.close()


@pytest.mark.slow
def test_scheduling_goes_on_while_the_ledger_is_unreachable(
    ledger_url: str, tmp_path: Path
) -> None:
    store = str(tmp_path / "store")
    service = JobsService(ledger=ledger_url, store=store, lease="2s", interval="50ms")
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=2,
            processes=False,
            dashboard_address=":0",
            scheduler_kwargs={"plugins": [service]},
        ) as lc,
        Client(lc) as client,
    ):
        job = jobs.submit(
            client,
            "score",
            kind="inference",
            parts=6,
            target="jobtasks:score",
            params={"seconds": 0.3},
        )
        with outage(ledger_url):
            # plain dask work is scheduled and finishes meanwhile
            assert client.gather(client.map(lambda x: x + 1, range(50))) == list(range(1, 51))
            if ledger_url.startswith("postgresql"):
                deadline = time.monotonic() + 30
                while service.status()["reachable"]:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
                st = service.status()
                assert st["unreachable_since"] is not None
                assert "ledger unreachable" in st["last_error"]
            time.sleep(1.0)
        assert job.result(timeout=60) == [0, 10, 20, 30, 40, 50]
        assert service.status()["reachable"] is True
        led = Ledger(ledger_url)
        assert sorted(led.outputs(job.job_id)) == list(range(6))
        led.close()


def test_a_ledger_out_of_reach_holds_back_no_other_ledgers_commits(
    ledger_url: str, tmp_path: Path
) -> None:
    """A worker process has one reporter for every ledger its attempts write to. While
    one ledger cannot be reached (here ``ledger_url``; in the test suite, a test's
    PostgreSQL database dropped while an attempt of it still ran), the attempts of the
    others still commit; the first commits once it is back."""
    from daskjobs.jobs.runner import Order, run_attempt

    def order(url: str, name: str) -> tuple[Ledger, str, Order]:
        led = Ledger(url)
        epoch = led.acquire_epoch()
        spec = JobSpec(name, target="jobtasks:score")
        job = led.submit(spec, epoch).job_id
        a = led.start_attempt(job, 0, None, 30, epoch)
        return (
            led,
            job,
            Order(
                ledger_url=url,
                store_url=str(tmp_path / "store"),
                job_id=job,
                part=0,
                parts=1,
                token=a.token,
                attempt_id=a.attempt_id,
                target=spec.target,
            ),
        )

    away, away_job, away_order = order(ledger_url, "away")
    here, here_job, here_order = order(f"sqlite:///{tmp_path / 'here.sqlite'}", "here")
    with outage(ledger_url):
        # the away ledger's commit first: the reporter's first group in its rounds
        assert run_attempt(away_order)["state"] == "committing"
        assert run_attempt(here_order, wait=30)["state"] == "succeeded"
        assert here.outputs(here_job) == {0: f"ledger:daskjobs-job-{here_job}-p0-t1"}
    deadline = time.monotonic() + 30
    while not away.outputs(away_job):  # back: retried within the reporter's backoff
        assert time.monotonic() < deadline
        time.sleep(0.05)
    away.close()
    here.close()


@pytest.mark.slow
def test_a_sweep_as_a_job(cluster: Any, tmp_path: Path) -> None:
    """A sweep submitted as one job: the same table as running it directly, the same job
    for the same sweep, and a grown sweep (one more cost level) loads what is stored."""
    from daskjobs.examples import build_sweep

    client, _ = cluster
    store = str(tmp_path / "sweeps")
    sweep = build_sweep(2, 2_000, fast=[5, 10], slow=[50], costs=[0.0])
    job = jobs.submit_sweep(client, sweep, store=store, team="quant")
    out = job.result(timeout=120)
    direct = sweep.run(client, store=str(tmp_path / "direct"), progress=False)
    assert out["table"] == direct.table()
    assert out["failures"] == [] and out["hits"] == 0
    assert out["computed"] == direct.computed == 2 + 2 + 4  # prices, features, backtests
    status = job.status()
    assert status["spec"]["team"] == "quant" and status["spec"]["kind"] == "inference"

    # the same sweep, built again: the same job, finished, nothing runs
    rebuilt = build_sweep(2, 2_000, fast=[5, 10], slow=[50], costs=[0.0])
    again = jobs.submit_sweep(client, rebuilt, store=store, team="quant")
    assert again.job_id == job.job_id and len(again.attempts()) == 1

    # one more cost level: a new job; prices and features come from the store
    grown = jobs.submit_sweep(
        client, build_sweep(2, 2_000, fast=[5, 10], slow=[50], costs=[0.0, 5.0]), store=store
    )
    assert grown.job_id != job.job_id
    more = grown.result(timeout=120)
    assert len(more["table"]["cost_bps"]) == 8
    assert more["computed"] == 4  # only the new backtests ran
    assert more["hits"] >= 2  # the features (and what else the plan loads) from the store


def test_bad_sweep_submissions_are_named(cluster: Any) -> None:
    from daskjobs import Sweep
    from daskjobs.examples import build_sweep

    client, _ = cluster
    with pytest.raises(TypeError, match=r"expects a daskjobs\.Sweep, got dict"):
        jobs.submit_sweep(client, {})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sweep 'empty' has no stages"):
        jobs.submit_sweep(client, Sweep("empty"))
    sweep = build_sweep(1, 500, fast=[5], slow=[50], costs=[0.0])
    with pytest.raises(ValueError, match=r"has no stage 'nope' \(its stages: synthetic_prices"):
        jobs.submit_sweep(client, sweep, outputs=["nope"])


def _attempts_annotated(client: Any, name: str, n: int) -> dict[str, Any]:
    """Annotation ``name`` of the job attempts on the scheduler, once ``n`` are there."""

    def annotated(dask_scheduler: Any) -> dict[str, Any]:
        return {
            str(k): ts.annotations.get(name)
            for k, ts in dask_scheduler.tasks.items()
            if str(k).startswith("daskjobs-attempt-")
        }

    deadline = time.monotonic() + 30
    while len(seen := client.run_on_scheduler(annotated)) < n:
        assert time.monotonic() < deadline, seen
        time.sleep(0.05)
    return seen


@pytest.mark.slow
def test_a_jobs_attempts_carry_its_team(cluster: Any) -> None:
    """The attempts of a job are tasks annotated with the job's team, so the scheduler
    plugin's fair share and quotas count them for that team."""
    client, _ = cluster
    job = jobs.submit(
        client,
        "scored",
        kind="inference",
        parts=2,
        team="quant",
        target="jobtasks:score",
        params={"seconds": 1.0},
    )
    seen = _attempts_annotated(client, "team", 2)
    assert set(seen.values()) == {"quant"}, seen
    assert job.result(timeout=60) == [0, 10]


def test_under_strict_teams_a_job_of_an_unknown_team_is_refused(
    ledger_url: str, tmp_path: Path
) -> None:
    """With the scheduler plugin's teams strict, a job of a team it does not know is
    refused at submission (its attempts would each be refused); one of a known team runs
    and its attempts are fair share's tasks of that team."""
    from daskjobs.plugin import JobsPlugin

    plugin = JobsPlugin(policy="fair-share", teams={"targets": {"quant": 1}, "strict": True})
    service = JobsService(ledger=ledger_url, store=str(tmp_path / "store"), interval="50ms")
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=2,
            processes=False,
            dashboard_address=":0",
            scheduler_kwargs={"plugins": [plugin, service]},
        ) as lc,
        Client(lc) as client,
    ):
        with pytest.raises(
            ValueError,
            match=r"team 'research' is not configured on this scheduler and teams are strict "
            r"\(daskjobs.teams.targets has: quant\)",
        ):
            jobs.submit(
                client, "x", kind="inference", parts=1, team="research", target="jobtasks:score"
            )
        assert jobs.list(client) == []  # nothing recorded
        job = jobs.submit(
            client, "y", kind="inference", parts=2, team="quant", target="jobtasks:score"
        )
        assert job.result(timeout=60) == [0, 10]


def test_workers_are_prepared_for_attempts(cluster: Any, ledger_url: str) -> None:
    """The service installs its preparation on every worker, present and future: a
    worker imports the runner and makes its ledger object when it joins, not when its
    first attempt arrives."""
    from daskjobs.jobs import runner

    client, _ = cluster

    def prepared(dask_worker: Any) -> bool:
        return runner.Prepare.name in dask_worker.plugins

    deadline = time.monotonic() + 10
    while not all(client.run(prepared).values()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert ledger_url in runner._ledgers  # in process: the workers' module is this one
    client.cluster.scale(3)  # a worker that joins later is prepared as it joins
    client.wait_for_workers(3, timeout=30)
    while not all(client.run(prepared).values()):
        assert time.monotonic() < deadline + 20
        time.sleep(0.05)
    job = jobs.submit(client, "ready", kind="inference", parts=3, target="jobtasks:score")
    assert job.result(timeout=60) == [0, 10, 20]


@pytest.mark.slow
def test_a_big_job_starts_its_parts_as_dask_drains_them(
    cluster: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Parts start a batch at a time, the next batch once dask has handed all but
    LOW_WATER of the last to workers: never all of a big job's parts at once. Every part
    still runs once, and a job submitted meanwhile starts at once."""
    from daskjobs.jobs import service as service_module

    monkeypatch.setattr(service_module, "LAUNCH_BATCH", 10)
    monkeypatch.setattr(service_module, "LOW_WATER", 5)
    client, service = cluster
    m = tmp_path / "marks"
    job = jobs.submit(
        client,
        "big",
        kind="inference",
        parts=80,
        target="jobtasks:score",
        params={"seconds": 0.05, "marks": str(m)},
    )
    most, other = 0, None
    deadline = time.monotonic() + 60
    while job.state != "succeeded":
        assert time.monotonic() < deadline
        # launched and not yet handed to a worker: a batch and what was left of the last
        most = max(most, len(service._waiting))
        if other is None and 20 <= service.launched < 80:
            other = jobs.submit(client, "meanwhile", target="jobtasks:score")
            assert other.result(timeout=30) == 0  # not held back behind the big job
        time.sleep(0.01)
    assert 0 < most <= 15 and other is not None
    assert job.result(timeout=30) == [10 * p for p in range(80)]
    assert len(marks(m)) == 80


@pytest.mark.slow
def test_an_interactive_jobs_attempts_carry_its_class(cluster: Any) -> None:
    """``job_class="te"``: the attempts are annotated for the plugin's preemption; a
    best-effort job (the default) keeps the identity it had before the field existed."""
    from daskjobs.jobs.model import JobSpec

    client, _ = cluster
    job = jobs.submit(
        client,
        "quick",
        kind="inference",
        parts=2,
        job_class="te",
        target="jobtasks:score",
        params={"seconds": 1.0},
    )
    seen = _attempts_annotated(client, "job_class", 2)
    assert set(seen.values()) == {"te"}, seen
    assert job.result(timeout=60) == [0, 10]
    plain = JobSpec("same", target="m:f")
    assert "job_class" not in plain.to_json()
    assert plain.job_id == JobSpec("same", target="m:f", job_class="be").job_id
    assert JobSpec("same", target="m:f", job_class="te").job_id != plain.job_id
    with pytest.raises(ValueError, match=r"JobSpec\.job_class: expected 'te'"):
        JobSpec("same", target="m:f", job_class="urgent")
