"""Jobs you can watch (issue 38): attempts record their worker and go launching ->
running -> succeeded; wait()/result() report progress; the ledger's Prometheus metrics;
the ledger commands read well under ``daskjobs`` and ``dask jobs``; ``jobs.list()``
returns records with datetimes."""

from __future__ import annotations

import datetime as dt

from click.testing import CliRunner

from daskjobs.cli import jobs as dask_jobs
from daskjobs.cli import main
from daskjobs.jobs import JobSpec, Ledger


def _ledger(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    ledger = Ledger(url)
    ledger.migrate()
    e = ledger.acquire_epoch("test")
    ledger.submit(JobSpec("nightly-scores", team="ml"), e)
    return url


def test_the_ledger_commands_are_named_ledger_under_both_commands(tmp_path):
    url = _ledger(tmp_path)
    for group, prog in ((main, "daskjobs"), (dask_jobs, "dask jobs")):
        result = CliRunner().invoke(group, ["ledger", "ls", "--ledger", url], prog_name=prog)
        assert result.exit_code == 0, result.output
        assert "nightly-scores" in result.output
        helped = CliRunner().invoke(group, ["ledger", "--help"], prog_name=prog)
        assert f"Usage: {prog} ledger [OPTIONS] COMMAND" in helped.output, helped.output
        listed = CliRunner().invoke(group, ["--help"], prog_name=prog).output
        commands = listed.split("Commands:")[1].split()
        assert "ledger" in commands and "jobs" not in commands  # the old name is not offered


def test_the_old_name_still_works_and_says_it_is_deprecated(tmp_path):
    url = _ledger(tmp_path)
    result = CliRunner().invoke(main, ["jobs", "ls", "--ledger", url])
    assert result.exit_code == 0, result.output
    assert "nightly-scores" in result.stdout
    assert "'daskjobs jobs' is now 'daskjobs ledger'" in result.stderr


# -- live: a job on an in-process cluster -------------------------------------------------

import re  # noqa: E402
import urllib.request  # noqa: E402

import pytest  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

import daskjobs.jobs as jobs  # noqa: E402
from daskjobs.jobs import JobsService  # noqa: E402
from daskjobs.plugin import JobsPlugin  # noqa: E402


@pytest.fixture
def cluster(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    service = JobsService(ledger=url, store=str(tmp_path / "store"), lease="2s", interval="50ms")
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=False,
            dashboard_address=":0",
            scheduler_kwargs={"plugins": [JobsPlugin(), service]},
        ) as lc,
        Client(lc) as client,
    ):
        yield client, lc


def test_attempts_record_their_worker_and_go_launching_running_succeeded(cluster):
    client, lc = cluster
    job = jobs.submit(client, "quick", kind="inference", parts=3, target="jobtasks:score")
    assert job.result(timeout=60) == [0, 10, 20]
    workers = set(lc.scheduler.workers)
    attempts = job.attempts()
    assert len(attempts) == 3
    assert all(a["worker"] in workers for a in attempts), attempts
    history = job.history()
    for a in attempts:
        moves = [(h["from_state"], h["to_state"]) for h in history if h["ref"] == a["attempt_id"]]
        assert moves == [(None, "launching"), ("launching", "running"), ("running", "succeeded")]


def test_wait_and_result_report_progress(cluster, capsys):
    client, _ = cluster
    seen = []
    job = jobs.submit(
        client,
        "progress",
        kind="inference",
        parts=4,
        target="jobtasks:score",
        params={"seconds": 0.2},
    )
    assert job.result(timeout=60, progress=seen.append) == [0, 10, 20, 30]
    assert seen, "no progress was reported"
    assert seen[-1].committed == seen[-1].parts == 4 and seen[-1].state == "succeeded"
    assert [p.committed for p in seen] == sorted(p.committed for p in seen)  # never back
    # text progress, one line a change, as the sweep's bar writes without a terminal
    again = jobs.submit(client, "progress-2", kind="inference", parts=2, target="jobtasks:score")
    again.wait(timeout=60, progress=True)
    err = capsys.readouterr().err
    assert re.search(r"job progress-2-\S+: 2/2 parts committed \(succeeded\)", err), err


def test_the_ledger_metrics_are_on_the_schedulers_metrics(cluster):
    pytest.importorskip("prometheus_client")
    client, lc = cluster
    job = jobs.submit(
        client, "flaky", kind="inference", parts=2, target="jobtasks:flaky", retries=2
    )
    assert job.result(timeout=60) == ["ok after 2", "ok after 2"]
    port = lc.scheduler.http_server.port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()

    def value(name, **labels):
        lab = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        m = re.search(rf"^{name}\{{{lab}\}} (\S+)$", text, flags=re.M)
        assert m, (name, labels, [ln for ln in text.splitlines() if "daskjobs_job" in ln])
        return float(m.group(1))

    assert value("dask_daskjobs_jobs", team="default", state="succeeded") == 1
    assert value("dask_daskjobs_job_attempts", team="default", state="succeeded") == 2
    assert value("dask_daskjobs_job_attempts", team="default", state="failed") == 2
    assert value("dask_daskjobs_job_retries_total", team="default") == 2
    assert value("dask_daskjobs_job_lease_expiries_total", team="default") == 0
    assert value("dask_daskjobs_job_fenced_commits_total", team="default") == 0
    assert value("dask_daskjobs_job_queue_delay_seconds", team="default") >= 0
    assert "dask_daskjobs_ledger_metrics_age_seconds" in text


def test_jobs_list_returns_records_with_datetimes(cluster):
    client, _ = cluster
    job = jobs.submit(client, "listed", kind="inference", parts=1, target="jobtasks:score")
    job.wait(timeout=60)
    (rec,) = [r for r in jobs.list_jobs(client) if r.job_id == job.job_id]
    assert isinstance(rec, jobs.JobInfo)
    assert rec.name == "listed" and rec.state == "succeeded" and rec.team == "default"
    assert isinstance(rec.submitted, dt.datetime) and rec.submitted.tzinfo is not None
    assert rec.updated >= rec.submitted
