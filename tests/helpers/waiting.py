"""Waiting in a test on a condition, never on a sleep of a guessed length."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def until(check: Callable[[], Any], what: str, timeout: float = 120.0, every: float = 0.02) -> Any:
    """Call ``check()`` until it returns something true, and return that; fail naming
    ``what`` after ``timeout`` seconds. The timeout is generous (a loaded 2-CPU machine is
    slow, and a test that passes never waits it out)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)
