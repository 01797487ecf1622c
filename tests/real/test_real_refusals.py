"""A refused submission reaches its caller on real processes (tests/plugin/test_refusals.py
in-process): ``dask scheduler --preload daskjobs.preload`` with strict teams in its
config, ``dask worker`` processes, a client in this process. The refusal is unpickled
on the client as its own type; nothing hangs; dask's invariants hold (the logs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dask
import pytest
from realcluster import in_thread

from daskjobs import SubmissionRefused, Sweep, jobs
from daskjobs.plugin.estimates import BadEstimate
from daskjobs.plugin.ranking import UnknownTeam

#: Long enough for anything here on a loaded 2-core machine; only a hang exceeds it.
HANG = 60.0

CONFIG = {
    "daskjobs": {
        "policy": "fair-share",
        "teams": {"strict": True, "targets": {"quant": 1, "default": 1}},
        "jobs": {"enabled": True},
    }
}


def inc(x: int) -> int:
    return x + 1


def _raised(fn: Any) -> BaseException:
    thread, box = in_thread(fn)
    thread.join(HANG)
    assert not thread.is_alive(), "the refused submission hangs"
    assert "error" in box, f"no error: {box.get('result')!r}"
    return box["error"]


@pytest.mark.realcluster
def test_refusals_reach_the_client_from_a_real_scheduler(real_cluster: Any, tmp_path: Path) -> None:
    rc = real_cluster(
        n_workers=2,
        preload="daskjobs.preload",
        config={**CONFIG, "daskjobs": {**CONFIG["daskjobs"], "store": str(tmp_path / "store")}},
        env={"DASK_DASKJOBS__LEDGER__URL": f"sqlite:///{tmp_path / 'ledger.sqlite'}"},
    )
    with rc.client() as c:
        kept = Sweep("kept", team="quant")
        kept.stage(inc, over={"x": [1]})
        assert kept.run(c, store=tmp_path / "store", progress=False).computed == 1

        sweep = Sweep("typo", team="quantt")
        sweep.stage(inc, over={"x": [1, 2]})
        err = _raised(lambda: sweep.run(c, store=tmp_path / "store"))
        assert isinstance(err, UnknownTeam), repr(err)
        assert "nothing of it ran" in str(err)
        assert "belongs to team 'quantt', which is not configured" in str(err)

        with dask.annotate(team="quant", estimate="soon"):
            future = c.submit(inc, 1, key="bad-estimate")
        err = _raised(future.result)
        assert isinstance(err, BadEstimate) and isinstance(err, SubmissionRefused), repr(err)
        assert "estimate must be a duration" in str(err) and "got str 'soon'" in str(err)

        err = _raised(
            lambda: jobs.submit(c, "x", kind="inference", team="quantt", target="jobtasks:score")
        )
        assert isinstance(err, UnknownTeam), repr(err)
        assert "team 'quantt' is not configured on this scheduler" in str(err)

        again = kept.run(c, store=tmp_path / "store", progress=False)
        assert (again.hits, again.computed) == (1, 0)
    assert rc.problems() == []
