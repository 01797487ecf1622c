"""What the tests of jobs on real processes share: their settings, waits and checks of the
ledger, the logs and the marks the tasks leave."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from realcluster import PROBLEMS, RealCluster

from daskjobs.jobs import Ledger

#: seconds a test waits for a state before failing
WAIT = 90


def config(store: Path, **jobs_settings: Any) -> dict[str, Any]:
    settings = {"lease": "2s", "launch-timeout": "1s", "interval": "100ms", **jobs_settings}
    return {"daskjobs": {"store": str(store), "jobs": settings}}


def committed_once(led: Ledger, job_id: str, parts: int) -> None:
    """Each part's output committed exactly once; every attempt that did not commit
    ended with a reason."""
    commits = [
        h
        for h in led.history()
        if h["kind"] == "output"
        and h["to_state"] == "committed"
        and h["ref"].rsplit("/", 1)[0] == job_id
    ]
    assert sorted(int(h["ref"].rsplit("/", 1)[1]) for h in commits) == list(range(parts))
    for a in led.attempts(job_id):
        assert a.state in ("succeeded", "lost", "fenced", "cancelled", "failed"), a
        if a.state != "succeeded":
            assert a.reason, a


def clean_logs(rc: RealCluster, *expected: str, since: dict[str, int] | None = None) -> None:
    """No traceback, invariant failure or lost worker in any process's log (after
    ``since[name]`` characters of it), but the ``expected`` patterns."""
    problems = []
    for name, text in rc.logs().items():
        for line in text[(since or {}).get(name, 0) :].splitlines():
            if PROBLEMS.search(line) and not any(re.search(p, line) for p in expected):
                problems.append(f"{name}: {line}")
    assert problems == [], "\n".join(problems)


def runs(marks: Path, job_id: str, part: int) -> int:
    return (
        sum(1 for n in os.listdir(marks) if n.startswith(f"run-{job_id}-p{part}-"))
        if marks.exists()
        else 0
    )
