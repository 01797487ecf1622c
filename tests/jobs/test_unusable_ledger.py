"""A jobs ledger that cannot be used stops the scheduler, naming the setting (as a bad
``record`` path does; docs/explanation/configuration.md): the service opens it and takes its epoch
before the scheduler serves. An outage once it runs does not (tests/jobs/test_jobs.py)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
from distributed import Scheduler
from realcluster import RealCluster

from daskjobs.jobs.service import JobsService

#: ledgers no scheduler can use: a file that cannot be made (/proc holds no files), a
#: directory that cannot be made, a PostgreSQL database that does not exist
UNUSABLE = {
    "file": ("sqlite:////proc/daskjobs-ledger.sqlite", "unable to open database file"),
    "directory": (
        "sqlite:////proc/daskjobs-nowhere/ledger.sqlite",
        "cannot make its directory: No such file or directory: /proc/daskjobs-nowhere",
    ),
    "database": (
        "postgresql+psycopg://root@127.0.0.1:5432/daskjobs_no_such_database",
        'database "daskjobs_no_such_database" does not exist',
    ),
}


async def _start(service: JobsService) -> BaseException:
    with pytest.raises(RuntimeError, match="Scheduler failed to start") as info:
        async with Scheduler(dashboard_address=":0", plugins=[service]):
            pass
    return info.value


@pytest.mark.parametrize("which", sorted(UNUSABLE))
def test_an_unusable_ledger_stops_the_scheduler(which: str, tmp_path: Path) -> None:
    url, says = UNUSABLE[which]
    service = JobsService(ledger=url, store=str(tmp_path / "store"))
    error = asyncio.run(_start(service)).__cause__
    assert isinstance(error, ValueError)
    assert str(error).startswith("JobsService(ledger=...): ")
    assert url in str(error) and says in str(error), str(error)


def test_the_ledger_setting_is_named(tmp_path: Path) -> None:
    import dask

    url, says = UNUSABLE["file"]
    with dask.config.set({"daskjobs.ledger.url": url}):
        service = JobsService(store=str(tmp_path / "store"))
        error = asyncio.run(_start(service)).__cause__
    assert str(error).startswith(f"daskjobs.ledger.url: cannot use the jobs ledger {url}: {says}")


@pytest.mark.realcluster
def test_a_real_scheduler_with_an_unusable_ledger_exits_naming_it(tmp_path: Path) -> None:
    url, says = UNUSABLE["file"]
    rc = RealCluster(
        tmp_path,
        n_workers=0,
        preload="daskjobs.preload",
        config={"daskjobs": {"jobs": {"enabled": True}, "ledger": {"url": url}}},
    )
    try:
        try:
            rc.start_scheduler(timeout=60)
        except RuntimeError as e:
            assert "dask scheduler exited" in str(e), e
        try:
            code = rc.procs["scheduler"].wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the scheduler serves:\n{rc.log('scheduler')[-3000:]}")
        log = rc.log("scheduler")
    finally:
        rc.close()
    assert code != 0
    assert f"daskjobs.ledger.url: cannot use the jobs ledger {url}: {says}" in log
    assert "scheduling goes on" not in log
