"""Fixtures shared by the test files.

* :func:`plugin_cluster` - an in-process ``LocalCluster`` whose scheduler runs a
  given :class:`~daskjobs.plugin.JobsPlugin` (or plain dask with ``None``).
* ``real_cluster`` - a factory of real ``dask scheduler`` / ``dask worker``
  processes (:class:`realcluster.RealCluster`); tests that use it are marked
  ``realcluster`` and their process logs are printed when they fail.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from realcluster import RealCluster

VALIDATE = {"distributed.scheduler.validate": True, "distributed.worker.validate": True}


def plugin_cluster(plugin: Any = None, **kwargs: Any) -> Any:
    """A ``LocalCluster`` in this process whose scheduler runs ``plugin``.

    Defaults: one worker with one thread, no dashboard port clash; any
    ``LocalCluster`` keyword overrides them.
    """
    from distributed import LocalCluster

    kwargs.setdefault("n_workers", 1)
    kwargs.setdefault("threads_per_worker", 1)
    kwargs.setdefault("processes", False)
    kwargs.setdefault("dashboard_address", ":0")
    plugins = [plugin] if plugin is not None else []
    return LocalCluster(scheduler_kwargs={"plugins": plugins}, **kwargs)


@pytest.fixture(autouse=True, scope="session")
def _record_into_pytest_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Clients' recordings are confined to ``daskjobs.record-dir`` (the trust model):
    in-process schedulers of this suite record into pytest's temporary directory."""
    import dask

    with dask.config.set({"daskjobs.record-dir": str(tmp_path_factory.getbasetemp())}):
        yield


@pytest.fixture
def real_cluster(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., RealCluster]]:
    """``real_cluster(n_workers=3, preload=..., preload_args=[...], config={...})``
    starts a cluster of real processes and returns it; all are stopped at teardown."""
    started: list[RealCluster] = []

    def make(**kwargs: Any) -> RealCluster:
        rc = RealCluster(tmp_path / f"cluster{len(started)}", **kwargs)
        started.append(rc)
        return rc.start()

    yield make
    for rc in started:
        rc.close()
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        for rc in started:
            for name, text in rc.logs().items():
                print(f"----- {name} ({rc.workdir}) -----")
                print(text[-6000:])


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    if rep.when == "call":
        item.rep_call = rep  # type: ignore[attr-defined]
    return rep


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "real_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.realcluster)
