"""A real ``dask scheduler`` that must refuse to start (a bad ``daskjobs`` setting)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from realcluster import RealCluster


def refused(tmp_path: Path, **kwargs: Any) -> tuple[int, str]:
    """Start a scheduler that must refuse to: its exit code and output."""
    rc = RealCluster(tmp_path, n_workers=0, **kwargs)
    try:
        try:
            address = rc.start_scheduler(timeout=60)
        except RuntimeError as e:
            assert "dask scheduler exited" in str(e), e
        else:
            # It wrote its address: a preload named in dask's config fails the start only
            # after that (dask writes the scheduler file before it starts preloads and
            # plugins), so the scheduler must exit now rather than serve.
            try:
                rc.procs["scheduler"].wait(timeout=30)
            except subprocess.TimeoutExpired:
                log = rc.log("scheduler")[-3000:]
                pytest.fail(f"the scheduler started at {address} and serves:\n{log}")
        code = rc.procs["scheduler"].returncode
        return code, rc.log("scheduler")
    finally:
        rc.close()
