"""Preemption and gangs on test hosts (``tests/helpers/netns.py``): the link of a preemption
victim's worker cut while it is being asked to yield, and the link of a gang member's
worker cut mid-run. Both assert results (an unpreempted run's), the plugin's counts
(every victim asked accounted for once; a gang never partially started) and logs; the
figures are printed (``pytest -m netns -s``) and reported in docs/explanation/reliability.md."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import realtasks
from netns import Hosts
from realcluster import RealCluster
from waiting import until

from daskjobs.plugin.client import status

#: What dask logs about a peer it could not reach for a while, expected here.
CUT_LOGS = [r"failed to heartbeat", r"heartbeat"]


def members(dask_scheduler: Any, prefix: str) -> dict[str, str]:
    return {
        str(k): ts.processing_on.name
        for k, ts in dask_scheduler.tasks.items()
        if str(k).startswith(prefix) and ts.processing_on is not None
    }


def test_a_victims_link_cut_during_preemption(
    net_hosts: Hosts, real_cluster: Callable[..., RealCluster], tmp_path: Path
) -> None:
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
    rc = real_cluster(
        n_workers=2, nthreads=4, config=config, worker_resources="GPU=2", hosts=net_hosts
    )
    with rc.client() as c:
        w0, w1 = rc.worker_address(c, "w0"), rc.worker_address(c, "w1")
        # w1's GPUs held by interactive work (never a victim), w0's by best-effort work
        with dask.annotate(resources={"GPU": 1}, job_class="te", workers=[w1]):
            held = [c.submit(realtasks.nap, i, 12.0, key=f"held-{i}") for i in range(2)]
        with dask.annotate(resources={"GPU": 1}, workers=[w0], allow_other_workers=True):
            be = [c.submit(realtasks.train, i, 300, 0.05, key=f"train-{i}") for i in range(2)]
        # all four starts reported to the plugin: until then a GPU of w1 looks free to it,
        # and the probe is placed there instead of asking w0's best-effort work to yield
        until(lambda: (status(c)["preemption"] or {}).get("running", 0) >= 4, "4 running")
        until(lambda: len(c.run_on_scheduler(members, prefix="held-")) == 2, "w1 held")
        victim = "w0"
        net_hosts.cut(victim)  # the victim's request will wait on the cut link
        try:
            with dask.annotate(resources={"GPU": 1}, job_class="te"):
                te = c.submit(realtasks.started_at, 0, key="probe-0")
            until(lambda: status(c)["preemption"]["asked"], "a victim asked", timeout=60)
            time.sleep(5)  # the fault's length
        finally:
            net_hosts.restore(victim)
        restored = time.time()
        started = te.result(timeout=120)
        results = [f.result(timeout=120) for f in be]
        c.gather(held)
        st = status(c)
    assert st["errors"] == {}, st["errors"]
    pre = st["preemption"]
    settled = pre["yielded"] + pre["finished_first"] + pre["ignored"] + pre["lost_with_worker"]
    assert pre["requested"] == settled and not pre["asked"]
    expected = [(300, i * sum(range(300))) for i in range(2)]
    assert [(r["step"], r["acc"]) for r in results] == expected
    assert started > restored - 0.5  # not before the victim could hear it (clocks: one host)
    print(
        f"netns: victim {victim}'s link cut 5 s while asked to yield: the interactive task "
        f"started {started - restored:.1f} s after the link came back; requested "
        f"{pre['requested']}, yielded {pre['yielded']}, finished first "
        f"{pre['finished_first']}, ignored {pre['ignored']}, lost with worker "
        f"{pre['lost_with_worker']}; "
        f"reruns {sum(r['runs'] > 1 for r in results)}"
    )
    assert all(rc.alive(f"w{i}") for i in range(2))
    assert rc.problems(ignore=CUT_LOGS) == []


def test_a_gang_members_link_cut(
    net_hosts: Hosts, real_cluster: Callable[..., RealCluster], tmp_path: Path
) -> None:
    a100 = {"accelerator": "A100", "gpus": 2, "gpu_memory": "40GB"}
    config = {
        "daskjobs": {
            "policy": "fifo",
            "store": str(tmp_path / "store"),
            "resources": {"enabled": True, "interval": "50ms"},
            "inventory": {"by-name": {"*": a100}},
        }
    }
    rc = real_cluster(
        n_workers=3, nthreads=4, config=config, worker_resources="GPU=2", hosts=net_hosts
    )
    with rc.client() as c:
        until(
            lambda: sum(w["reported"] for w in status(c)["resources"]["workers"].values()) >= 3,
            "the workers' inventories",
        )
        with dask.annotate(resources={"GPU": 1}, gang="ddp", gang_size=4):
            fs = [c.submit(realtasks.train, i, 60, 0.05, key=f"ddp-{i}") for i in range(4)]
        on = until(
            lambda: (m := c.run_on_scheduler(members, prefix="ddp-")) and len(m) == 4 and m,
            "the gang started",
        )
        time.sleep(0.5)  # a few steps, checkpointed
        victim = on["ddp-0"]
        cut = time.time()
        with net_hosts.partitioned(victim):
            time.sleep(8)  # the fault's length
        results = [f.result(timeout=180) for f in fs]
        ended = time.time()
        st = status(c)
    assert st["errors"] == {}, st["errors"]
    g = st["resources"]["gangs"]["ddp"]
    assert g["starts"] >= 1 and g["starts"] == g["restarts"] + 1, g
    assert [(r["step"], r["acc"]) for r in results] == [(60, i * sum(range(60))) for i in range(4)]
    print(
        f"netns: gang member's worker {victim} cut 8 s mid-run: the gang ended "
        f"{ended - cut:.1f} s after the cut; starts {g['starts']}, restarts {g['restarts']}; "
        f"member runs {[r['runs'] for r in results]}"
    )
    assert all(rc.alive(f"w{i}") for i in range(3))
    assert rc.problems(ignore=CUT_LOGS) == []
