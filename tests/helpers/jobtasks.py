"""Functions that jobs run in the tests (importable on real worker processes too: the
harness puts tests/helpers/ on their ``PYTHONPATH``). Each execution leaves a file in the
directory ``params["marks"]`` (when given), so tests count executions across
processes."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any


def _mark(attempt: Any, marks: str | None, what: str = "run") -> None:
    if marks:
        os.makedirs(marks, exist_ok=True)
        name = f"{what}-{attempt.job_id}-p{attempt.part}-t{attempt.token}-{uuid.uuid4().hex[:6]}"
        with open(os.path.join(marks, name), "w") as f:
            f.write(str(os.getpid()))


def score(attempt: Any, seconds: float = 0.0, marks: str | None = None, **_: Any) -> int:
    """An inference partition: sleeps, returns part * 10."""
    _mark(attempt, marks)
    time.sleep(seconds)
    return attempt.part * 10


def flaky(attempt: Any, fail_times: int = 1, marks: str | None = None, **_: Any) -> str:
    """Fails its first ``fail_times`` attempts (by token), then succeeds."""
    _mark(attempt, marks)
    if attempt.token <= fail_times:
        raise ValueError(f"flaky: attempt with token {attempt.token} fails")
    return f"ok after {attempt.token}"


def train(
    attempt: Any, steps: int = 10, step_seconds: float = 0.01, marks: str | None = None, **_: Any
) -> dict[str, int]:
    """A resumable training loop: restores the latest checkpoint, checkpoints every
    step it is due, stops early when asked."""
    _mark(attempt, marks)
    state = attempt.restore() or {"step": 0, "resumed_from": 0}
    state["resumed_from"] = state["step"]
    start = state["step"]
    for step in range(start, steps):
        if attempt.stop_requested:
            break
        time.sleep(step_seconds)
        state["step"] = step + 1
        if attempt.checkpoint_due() or step + 1 == steps:
            attempt.checkpoint(dict(state))
    return state


def until_file(attempt: Any, path: str, marks: str | None = None, **_: Any) -> str:
    """Runs until ``path`` exists (a test releases it), then returns."""
    _mark(attempt, marks)
    while not os.path.exists(path):
        time.sleep(0.02)
    return f"released part {attempt.part}"


def worker_name(attempt: Any, **_: Any) -> str:
    """The name of the worker the attempt ran on."""
    from distributed import get_worker

    return str(get_worker().name)
