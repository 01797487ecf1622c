"""Jobs on test hosts (``tests/helpers/netns.py``): a worker partitioned mid-job for longer
than its lease, on both ledger backends. The scheduler and each worker run in a
network namespace of their own; a PostgreSQL ledger is reached over the test network
(through the forwarder on the test process's host), an SQLite ledger is a file every
host shares (a partition of the network does not cut it, as a file on a shared
filesystem that stays mounted)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from netns import Hosts
from realcluster import RealCluster
from realjobs import WAIT, clean_logs, committed_once, config, runs
from waiting import until

import daskjobs.jobs as jobs
from daskjobs.jobs import Ledger

LEASE = 5

#: What a partitioned worker's process logs about its scheduler, expected here.
PARTITION_LOGS = (
    r"failed to heartbeat",
    r"Failed to communicate with scheduler during heartbeat",
    r"Worker .* failed to heartbeat",
)


def url_on_hosts(ledger_url: str, hosts: Hosts) -> str:
    """The ledger's URL as the test hosts reach it: PostgreSQL through the forwarder."""
    if ledger_url.startswith("postgresql"):
        return ledger_url.replace("127.0.0.1:5432", hosts.forward(5432))
    return ledger_url


def test_a_worker_partitioned_past_its_lease_is_fenced(
    ledger_url: str,
    net_hosts: Hosts,
    real_cluster: Callable[..., RealCluster],
    tmp_path: Path,
) -> None:
    store, marks, gate = tmp_path / "store", tmp_path / "marks", tmp_path / "gate"
    rc = real_cluster(
        preload="daskjobs.preload",
        preload_args=["--daskjobs-ledger", url_on_hosts(ledger_url, net_hosts)],
        # a lease of 5 s: leases expire only while the database answers every write
        # within a third of one, which the forwarder on a loaded machine may not in 0.7 s
        config=config(store, lease=f"{LEASE}s"),
        n_workers=2,
        nthreads=2,
        hosts=net_hosts,
    )
    led = Ledger(ledger_url)
    postgres = ledger_url.startswith("postgresql")
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
        # part 1 runs on the other worker, or on this one too (new attempts go only to
        # the workers heard from lately: on a loaded machine that may be one of the two)
        other = until(
            lambda: [a for a in led.attempts(job.job_id) if a.state == "running" and a.part == 1],
            "part 1 running",
        )[0]
        cut_at = time.monotonic()
        with net_hosts.partitioned(name):
            if postgres:
                # the worker cannot renew its lease: the part runs again elsewhere
                again = until(
                    lambda: [
                        a
                        for a in led.attempts(job.job_id)
                        if a.part == 0 and a.token == first.token + 1 and a.state == "running"
                    ],
                    "part 0 reassigned",
                )[0]
                moved_after = time.monotonic() - cut_at
                assert again.worker != first.worker
                gate.touch()
                until(lambda: led.job(job.job_id).state == "succeeded", "the job to succeed")
            else:
                # the file is not cut: the worker renews its lease through it, and the
                # part is not run twice (2 leases pass while it is cut off)
                time.sleep(2 * LEASE)
                assert [a.token for a in led.attempts(job.job_id) if a.part == 0] == [1]
                gate.touch()
                # its commit goes to the file too: the job ends while the link is cut
                until(lambda: led.job(job.job_id).state == "succeeded", "the job to succeed")
        if postgres:
            # the partitioned worker is back: its attempt's late commit is refused
            until(
                lambda: [h for h in led.history(f"{job.job_id}/0") if h["to_state"] == "refused"],
                "the late commit refused",
            )
        assert job.result(timeout=WAIT) == ["released part 0", "released part 1"]
    committed_once(led, job.job_id, 2)
    old = next(a for a in led.attempts(job.job_id) if a.attempt_id == first.attempt_id)
    refused = [h for h in led.history(f"{job.job_id}/0") if h["to_state"] == "refused"]
    if postgres:
        assert (old.state, old.reason) == ("lost", "lease expired")
        assert led.outputs(job.job_id)[0].endswith(f"-p0-t{first.token + 1}")
        assert runs(marks, job.job_id, 0) == 2 and len(refused) == 1
        print(f"netns: part 0 ran again {moved_after:.1f} s after the cut (lease {LEASE} s)")
    else:
        assert old.state == "succeeded"
        assert runs(marks, job.job_id, 0) == 1 and refused == []
    # a part on the cut worker ran again elsewhere (PostgreSQL: cut off from its ledger);
    # one on the other worker ran once
    cut_off = postgres and other.worker == first.worker
    assert runs(marks, job.job_id, 1) == (2 if cut_off else 1)
    led.close()
    clean_logs(rc, *PARTITION_LOGS)
