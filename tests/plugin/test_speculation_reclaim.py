"""Live: the policy's reclaim rule (``Speculation.reclaim_at``) takes a loser's thread for
returned when its worker has not said so in time, as ``Speculation.decide`` decides."""

from __future__ import annotations

import dataclasses
import threading
import time

import dask
import pytest
from conftest import VALIDATE, plugin_cluster
from distributed import Client

from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.client import status

FAST = {"late_factor": 1.5, "min_runtime": "100ms", "interval": "50ms", "enabled": True}
RETURNED: list[tuple[object, float]] = []
#: Set by the test once it has checked the reclaim: the loser then returns, so that the
#: cluster does not wait out its whole run when it closes (workers join their threads).
STOP = threading.Event()


def racer(steps):
    """Ten times slower on the worker named 0; never checks cancelled(): a loser
    that holds its thread (it stops early only when the test, in this process, sets ``STOP``)."""
    from distributed import get_worker

    name = get_worker().name
    for _ in range(steps):
        if STOP.wait(0.01 * (10 if name == 0 else 1)):
            break
    RETURNED.append((name, time.time()))
    return "done"


@pytest.mark.slow
def test_a_loser_s_thread_is_reclaimed_after_the_policy_s_timeout():
    RETURNED.clear()
    STOP.clear()
    plugin = JobsPlugin(policy="lpt", speculation=FAST)
    with (
        dask.config.set(VALIDATE),
        plugin_cluster(plugin, n_workers=2, threads_per_worker=1) as cl,
        Client(cl) as c,
    ):
        try:
            check_reclaim(plugin, c)
        finally:
            STOP.set()  # the loser returns: the cluster closes without waiting 10 s for it


def check_reclaim(plugin, c):
    """The race, the reclaim by the policy's rule, and the audit trail."""
    sp = plugin.speculator
    assert sp is not None and sp.spec.reclaim_after == 60.0  # the default: a minute
    sp.spec = dataclasses.replace(sp.spec, reclaim_after=0.0, reclaim_factor=0.0)
    w0 = next(a for a, w in c.scheduler_info()["workers"].items() if w["name"] == 0)
    with dask.annotate(workers=[w0], allow_other_workers=True, estimate=0.3):
        r = dask.delayed(racer)(100, dask_key_name="race")  # 10 s on worker 0, 1 s on 1
    assert c.compute(r, sync=True) == "done"  # the copy won on worker 1
    deadline = time.time() + 30
    while status(c)["speculation"]["losers_reclaimed"] < 1 and time.time() < deadline:
        time.sleep(0.05)
    st = status(c)["speculation"]
    # taken back by the policy's rule, not by the worker's report: the loser still runs
    assert st["losers_reclaimed"] == 1 and st["running_losers"] == 0
    assert not [t for name, t in RETURNED if name == 0]
    events = [e for _, e in c.get_events("daskjobs") if e["action"] == "loser-reclaimed"]
    assert [e["key"] for e in events] == ["race"]
    assert "taken for returned" in events[0]["reason"]
    # the copy's audit event carries the policy's reason for it, as decided
    w1 = next(a for a, w in c.scheduler_info()["workers"].items() if w["name"] == 1)
    (launched,) = [e for _, e in c.get_events("daskjobs") if e["action"] == "backup-launched"]
    assert launched["reason"] in (f"late: copied to {w1}", f"urgent: copied to {w1}")
    assert status(c)["errors"] == {}
