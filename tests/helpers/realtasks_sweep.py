"""Stage functions and scheduler probes for ``tests/real/test_real_sweep.py``, importable on
the real worker and scheduler processes (the harness puts tests/helpers/ on their
``PYTHONPATH``).

Tests steer these stages through files in a directory they pass as a parameter, so
that the order of events is fixed by the test, not by timing: a stage waits for a
*gate* file the test creates, and leaves a *mark* file when it has run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

#: How long a stage waits for a gate before giving up (a broken test must not hang).
GATE_TIMEOUT = 120.0


def _worker_name() -> str:
    from distributed import get_worker

    return str(get_worker().name)


def wait_for(path: str | os.PathLike[str], timeout: float = GATE_TIMEOUT) -> None:
    """Block until ``path`` exists."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {path} was never opened")
        time.sleep(0.01)


def _mark(directory: Path, name: str) -> None:
    tmp = directory / f".{name}.tmp"
    tmp.write_text(_worker_name())
    tmp.rename(directory / name)  # atomic: a reader never sees a half-written mark


def runs_of(directory: str | os.PathLike[str], x: int) -> list[str]:
    """Workers that completed ``short(x=x)``, in order."""
    d = Path(directory)
    names = sorted((p.name for p in d.glob(f"short-{x}-*")), key=lambda n: int(n.rsplit("-", 1)[1]))
    return [(d / n).read_text() for n in names]


def short(x: int, marks: str) -> int:
    """A quick output stage. Its first run returns at once; a rerun (dask recomputing a
    result lost with its worker) waits for the gate ``rerun-gate``."""
    d = Path(marks)
    n = len(list(d.glob(f"short-{x}-*")))
    if n:
        wait_for(d / "rerun-gate")
    _mark(d, f"short-{x}-{n}")
    return x * x


def long(marks: str) -> str:
    """A long output stage: says where it runs, then waits for the gate ``long-gate``."""
    d = Path(marks)
    _mark(d, "long-started")
    wait_for(d / "long-gate")
    return "long done"


def square(x: int) -> int:
    return x * x


def scale(x: int, factor: Any) -> int:
    """``factor`` may be any object with a ``value``."""
    return x * int(getattr(factor, "value", factor))


def key_states(dask_scheduler: Any, keys: list[str]) -> dict[str, tuple[str | None, list[str]]]:
    """For ``client.run_on_scheduler``: each key's state and the workers holding it."""
    out: dict[str, tuple[str | None, list[str]]] = {}
    for key in keys:
        ts = dask_scheduler.tasks.get(key)
        if ts is None:
            out[key] = (None, [])
        else:
            out[key] = (ts.state, sorted(str(ws.name) for ws in ts.who_has or ()))
    return out


def processing_on(dask_scheduler: Any, key: str) -> str | None:
    """For ``client.run_on_scheduler``: the worker running ``key``, if any."""
    ts = dask_scheduler.tasks.get(key)
    if ts is None or ts.processing_on is None:
        return None
    return str(ts.processing_on.name)
