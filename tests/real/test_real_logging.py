"""daskjobs logs the way dask does: a real ``dask scheduler --preload daskjobs.preload``
started with a YAML config writes daskjobs' lines in distributed's format (time, logger
name, level), at the levels dask's ``logging:`` config names, INFO included, and one
INFO line of what the plugin runs with."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import dask
import pytest

from daskjobs import SubmissionRefused, Sweep

#: distributed's log format (``distributed.admin.log-format``), as a pattern
TIME = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"


def inc(x: int) -> int:
    return x + 1


def warn_from_the_worker() -> None:
    import logging

    logging.getLogger("daskjobs.sweep").warning("a warning on a worker")


def _line(log: str, name: str, level: str, message: str) -> str | None:
    pattern = f"{TIME} - {re.escape(name)} - {level} - {message}"
    found = re.search(pattern, log, re.MULTILINE)
    return found.group(0) if found else None


@pytest.mark.realcluster
def test_a_schedulers_log_shows_daskjobs_lines_in_dasks_format(
    real_cluster: Any, tmp_path: Path
) -> None:
    ledger = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    trace = tmp_path / "trace.jsonl"
    config = {
        "daskjobs": {
            "policy": "fair-share",
            "teams": {"strict": True, "targets": {"quant": 2, "default": 1}},
            "speculation": {"enabled": True, "late-factor": 3, "min-runtime": "2s"},
            "record": str(trace),
            "jobs": {"enabled": True},
            "ledger": {"url": ledger},
        },
        # dask's own logging config: daskjobs' loggers are named there like distributed's
        "logging": {"daskjobs.preload": "warning"},
    }
    rc = real_cluster(n_workers=1, preload="daskjobs.preload", config=config)
    with rc.client() as c:
        with dask.annotate(team="quantt"):
            future = c.submit(inc, 1, key="typo")
        with pytest.raises(SubmissionRefused):
            future.result(timeout=60)
    log = rc.log("scheduler")
    summary = _line(log, "daskjobs.plugin", "INFO", r"daskjobs plugin: .*$")
    assert summary is not None, log[-4000:]
    assert summary.endswith(
        "daskjobs plugin: policy fair-share, default estimate 1s; teams default=1, quant=2 "
        "(strict); speculation on (late-factor 3, min-runtime 2s, max-fraction 0.1); "
        f"preemption off; resources off; recording to {trace}; ledger {ledger}"
    ), summary
    assert len(re.findall(r"daskjobs plugin: policy", log)) == 1
    # INFO lines of other daskjobs loggers are not lost
    assert _line(
        log, "daskjobs.jobs", "INFO", re.escape(f"daskjobs jobs service on ledger {ledger}")
    )
    assert _line(log, "daskjobs.plugin", "INFO", r"daskjobs refused a submission: .*'quantt'")
    # every daskjobs line is in dask's format: no bare message, level or name missing
    for text in log.splitlines():
        if "daskjobs" in text and " - daskjobs" not in text and text.startswith("daskjobs"):
            pytest.fail(f"a daskjobs line not in dask's format: {text!r}")


@pytest.mark.realcluster
def test_a_worker_that_ran_a_sweep_logs_the_dask_way(real_cluster: Any, tmp_path: Path) -> None:
    """Plain dask (no plugin, no jobs): a worker imports daskjobs only to run a sweep's
    stages, and its daskjobs lines are in dask's format too."""
    rc = real_cluster(n_workers=1, preload=None)
    with rc.client() as c:
        sweep = Sweep("logs")
        sweep.stage(inc, over={"x": [1]})
        assert sweep.run(c, progress=False, store=tmp_path / "store").computed == 1
        c.run(warn_from_the_worker)
    worker = rc.log("w0")
    assert _line(worker, "daskjobs.sweep", "WARNING", "a warning on a worker"), worker[-3000:]
