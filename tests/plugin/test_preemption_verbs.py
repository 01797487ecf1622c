"""The preemption and gang verbs of plugin/surgery/_internals.py: each does what the drivers
rely on, on dask's own objects, and their self-checks pass on this dask and name the verb when what
they rely on is gone."""

from __future__ import annotations

import asyncio
from typing import Any

from distributed import Scheduler

from daskjobs.plugin.surgery._internals import (
    PREEMPTION_CHECKS,
    _stand_in_task,
    ask_to_yield,
    check_preemption_verbs,
    hold,
    pinned,
    unpin,
)


def _with_scheduler(fn: Any) -> Any:
    async def run() -> Any:
        async with Scheduler(dashboard_address=":0", validate=True) as s:
            return fn(s)

    return asyncio.run(run())


def test_every_verb_passes_its_self_check_on_this_dask() -> None:
    assert set(PREEMPTION_CHECKS) >= {"ask_to_yield", "hold", "place", "pin", "unpin", "release"}
    assert _with_scheduler(check_preemption_verbs) == []


def test_hold_leaves_no_valid_worker_and_unpin_puts_back_what_the_task_had() -> None:
    def run(s: Any) -> tuple[Any, Any, Any]:
        ts = _stand_in_task(s, "probe")
        ts.loose_restrictions = True
        saved = pinned(ts)
        hold(ts, "daskjobs-held://nowhere")
        held = (set(ts.worker_restrictions), ts.loose_restrictions, s.valid_workers(ts))
        unpin(ts, saved)
        return held, (ts.worker_restrictions, ts.loose_restrictions), s.valid_workers(ts)

    held, back, valid = _with_scheduler(run)
    assert held == ({"daskjobs-held://nowhere"}, False, set())
    assert back == (None, True) and valid is None


def test_asking_a_worker_without_a_stream_says_so() -> None:
    assert _with_scheduler(lambda s: ask_to_yield(s, "tcp://gone:1", ["k"], "op")) is False


class _Broken:
    """A scheduler whose stream comms and restrictions changed shape."""

    def __init__(self) -> None:
        self.stream_comms: list[Any] = []  # no longer a dict of worker streams

    def valid_workers(self, ts: Any) -> Any:
        return None  # a restriction to no worker no longer holds the task

    def transitions(self, recommendations: Any, stimulus_id: str) -> None:
        pass


def test_a_changed_dask_is_named_verb_by_verb() -> None:
    problems = check_preemption_verbs(_Broken())
    first = "ask_to_yield (AssertionError: Scheduler.stream_comms"
    assert any(p.startswith(first) for p in problems)
    assert any(p.startswith("hold (AssertionError: a task restricted to no") for p in problems)
    # the worker's head-of-line rule is dask's worker's, not this scheduler's: still there
    assert not any(p.startswith("pin (the BE reservation)") for p in problems)
