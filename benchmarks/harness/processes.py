"""Clusters of real processes for the benchmarks: ``dask scheduler`` and ``dask worker``.

The benchmarks that run on real processes use the test suite's harness
(``tests/helpers/realcluster.py``: loopback, dask's defaults, each process's log scanned for
broken invariants, SIGKILL on cue), reached through this module only, so that the day
it moves into the package, one import changes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
BENCHMARKS = ROOT / "benchmarks"


def realcluster() -> Any:
    """The module of the real-process harness (``RealCluster``, ``in_thread``, ...)."""
    helpers = str(ROOT / "tests" / "helpers")
    if helpers not in sys.path:
        sys.path.append(helpers)
    import realcluster

    return realcluster


def realtasks() -> Any:
    """The task module of the real-process tests (``tests/helpers/realtasks.py``: tasks that
    import on worker processes and slow down the workers named in ``DASKJOBS_TEST_SLOW``)."""
    realcluster()  # puts tests/helpers/ on the path
    import realtasks

    return realtasks


def worker_path() -> dict[str, str]:
    """The environment that lets worker processes import the benchmarks' task modules,
    the harness's own (tests/helpers/) and this checkout's daskjobs."""
    path = [str(BENCHMARKS), str(ROOT / "tests" / "helpers"), str(ROOT)]
    path.append(os.environ.get("PYTHONPATH", ""))
    return {"PYTHONPATH": os.pathsep.join(p for p in path if p)}
