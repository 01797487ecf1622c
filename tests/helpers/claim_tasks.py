"""Stages for the claims tests (tests/cache/test_claims_clusters.py), importable by worker
processes.

``features`` writes a marker file when it starts, waits until the test creates the
``release`` file in the same folder, then writes a ``finished`` marker: the test sees
who computed what, and decides when a computation may end.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path


def features(folder: str, slice: int) -> dict[str, float]:
    base = Path(folder)
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    (base / f"started-{slice}-{tag}").touch()
    deadline = time.monotonic() + 120
    while not (base / "release").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never released the feature stage")
        time.sleep(0.02)
    (base / f"finished-{slice}-{tag}").touch()
    return {"slice": slice, "mean": 0.5 + slice}


def backtest(features: dict[str, float], fast: int) -> dict[str, float]:
    return {"sharpe": features["mean"] * fast}


def markers(folder: str, kind: str) -> list[str]:
    return sorted(p.name for p in Path(folder).glob(f"{kind}-*"))
