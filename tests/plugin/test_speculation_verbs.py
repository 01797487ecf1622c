"""The speculation driver's verbs on dask's state, and their self-checks at start."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from distributed.stealing import WorkStealing

from daskjobs.plugin.surgery import _internals
from daskjobs.plugin.surgery._internals import (
    REQUIRED_SCHEDULER_ATTRS,
    DaskInternalsError,
    check_scheduler,
    check_speculation_verbs,
)


def _scheduler(stealing: object) -> SimpleNamespace:
    """Every attribute check_scheduler looks for, and the pieces the verbs call."""
    attrs = dict.fromkeys(REQUIRED_SCHEDULER_ATTRS)
    attrs["extensions"] = {"stealing": stealing}
    attrs["client_releases_keys"] = lambda keys, client, stimulus_id=None: None
    return SimpleNamespace(**attrs)


class _Stealing:
    def move_task_request(self, ts, victim, thief):  # as WorkStealing has it
        return "ok"


class _RenamedStealing:
    def move_task_request(self, key, source, destination):  # a release that renamed them
        return "ok"


def test_the_verbs_behave_on_the_installed_dask() -> None:
    assert check_speculation_verbs(_scheduler(_Stealing())) == []
    # the real extension's method, as the plugin calls it
    params = WorkStealing.move_task_request.__code__.co_varnames[1:4]
    assert params == ("ts", "victim", "thief")


def test_a_changed_stealing_request_stops_the_plugin_at_start() -> None:
    assert check_speculation_verbs(_scheduler(_RenamedStealing())) == [
        "move_waiting (speculation: its self-check failed)"
    ]
    with pytest.raises(DaskInternalsError, match="move_waiting"):
        check_scheduler(_scheduler(_RenamedStealing()))


@pytest.mark.parametrize(
    ("verb", "broken"),
    [
        ("free_threads", lambda ws: ws.nthreads),  # ignores what dask sent there
        ("may_run_on", lambda ts, ws: True),  # ignores restrictions and resources
        ("runs_on", lambda ts, worker, run_id: ts is not None),  # ignores the run
        ("wanted", lambda ts: False),
        ("is_running", lambda ws: True),
        ("can_copy", lambda ts: True),  # would copy an alias
    ],
)
def test_a_verb_whose_answer_changed_is_named(monkeypatch, verb, broken) -> None:
    monkeypatch.setattr(_internals, verb, broken)
    problems = check_speculation_verbs(_scheduler(_Stealing()))
    assert problems and all(p.startswith(verb) for p in problems), problems
