"""The pytest plugin of ``benchmarks/dask_suite.py`` (``-p _dask_suite_preload``).

The script puts ``daskjobs.preload`` in ``distributed.scheduler.preload`` through the
environment (``DASK_DISTRIBUTED__SCHEDULER__PRELOAD``: distributed's test harness resets
dask's config to what it was at import before every test, so a value set later would be
lost), so that every ``Scheduler`` a test makes (``gen_cluster``, ``LocalCluster``,
``Scheduler()``) loads daskjobs' plugin under the default configuration. This plugin
counts the schedulers that started and those that ran daskjobs' plugin: a scheduler
without it fails the session.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

_counts = {"schedulers": 0, "with_plugin": 0, "preloaded": True}


def pytest_configure(config: pytest.Config) -> None:
    import dask
    from distributed.scheduler import Scheduler

    import daskjobs.preload  # noqa: F401 - fail here, not in every scheduler, if it is broken

    # pytest-rerunfailures' mark, which distributed's CI uses on macOS only: known here,
    # and no test is rerun
    config.addinivalue_line("markers", "flaky: rerun by pytest-rerunfailures (not here)")
    # the TLS certificates of distributed's tests are in the checkout, not in the wheel
    import distributed.utils_test as utils_test

    utils_test.certs_dir = os.environ["DASKJOBS_DASK_SUITE_TESTS"]

    if "DASKJOBS_DASK_SUITE_TESTS" not in os.environ:
        raise pytest.UsageError("run through benchmarks/dask_suite.py")
    _counts["preloaded"] = "daskjobs.preload" in (
        dask.config.get("distributed.scheduler.preload") or []
    )

    start = Scheduler.start_unsafe

    async def counted_start(self: Any) -> Any:
        out = await start(self)
        _counts["schedulers"] += 1
        if any(type(p).__name__ == "JobsPlugin" for p in self.plugins.values()):
            _counts["with_plugin"] += 1
        return out

    Scheduler.start_unsafe = counted_start  # type: ignore[method-assign]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    n, with_plugin = _counts["schedulers"], _counts["with_plugin"]
    terminalreporter.write_line(
        f"daskjobs: {with_plugin} of {n} schedulers started with daskjobs' plugin"
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    short = _counts["with_plugin"] < _counts["schedulers"]
    if _counts["preloaded"] and short and session.exitstatus == 0:
        session.exitstatus = 1
