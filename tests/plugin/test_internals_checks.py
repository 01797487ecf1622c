"""The verbs of daskjobs.plugin.surgery._internals check at start that dask still behaves as they
rely on: the installed release passes, and a scheduler changed in one place is refused
naming the verb and what changed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from types import MethodType
from typing import Any

import pytest
from distributed import Scheduler
from distributed.collections import HeapSet

from daskjobs.plugin.surgery import _internals


@pytest.fixture(scope="module")
def scheduler() -> Iterator[Scheduler]:
    async def make() -> Scheduler:
        return Scheduler(dashboard_address=":0", validate=True)  # not started: no loop needed

    yield asyncio.run(make())


class Changed:
    """A scheduler whose attribute ``name`` is ``value``; the real one's otherwise."""

    def __init__(self, real: Scheduler, **changes: Any) -> None:
        self._real = real
        self._changes = changes

    def __getattr__(self, name: str) -> Any:
        changes = self.__dict__["_changes"]
        return changes[name] if name in changes else getattr(self.__dict__["_real"], name)


def problems(sched: Any) -> list[str]:
    return _internals._self_check(sched)


def test_every_verb_has_a_self_check() -> None:
    verbs = {
        "wrap_priorities",
        "set_priority",
        "wrap_stream_handler",
        "promote",
        "queued_tasks",
        "idle_workers",
        "free_slots",
        "withhold_slots",
        "restore_slots",
        "fail_tasks",
        "ensure_client",
        "has_worker_plugin",
        "install_worker_plugin",
        "remove_worker_plugin",
        "closing",
        "wrap_graph_handler",
        "refuse_unread",
    }
    assert verbs <= set(_internals.SELF_CHECKS)
    assert all(name in _internals.__all__ for name in verbs)


def test_the_installed_dask_passes_every_self_check(scheduler: Scheduler) -> None:
    assert problems(scheduler) == []
    _internals.check_scheduler(scheduler)  # and the whole start check


def test_a_queue_that_does_not_reorder_on_promotion_is_named(scheduler: Scheduler) -> None:
    class FifoSet(HeapSet):  # type: ignore[type-arg]
        def peek(self) -> Any:  # oldest first, whatever the key
            return next(v for _, _, ref in sorted(self._heap, key=lambda e: e[1]) if (v := ref()))

        def pop(self) -> Any:
            v = self.peek()
            self.discard(v)
            return v

    queued = FifoSet(key=scheduler.queued.key)
    found = problems(Changed(scheduler, queued=queued))
    assert [p.split(" (")[0] for p in found] == ["promote", "queued_tasks", "reprioritize"]
    assert "is not first" in found[0]


def test_a_queue_not_ordered_by_priority_is_named(scheduler: Scheduler) -> None:
    queued = HeapSet(key=lambda ts: ts.key)
    found = problems(Changed(scheduler, queued=queued))
    assert found and "not ordered by priority" in found[0]


def test_a_priority_of_another_shape_is_named(scheduler: Scheduler) -> None:
    def reordered(self: Any, *, internal_priority: Any, tasks: Any, **kwargs: Any) -> None:
        for ts in tasks:
            ts.priority = (internal_priority[ts.key],)

    found = problems(Changed(scheduler, _set_priorities=MethodType(reordered, scheduler)))
    found = [p for p in found if p.startswith(("wrap_priorities", "set_priority"))]
    assert len(found) == 2 and "not (-user priority, generation, order)" in found[0]


def test_a_stream_handler_of_another_signature_is_named(scheduler: Scheduler) -> None:
    handlers = {**scheduler.stream_handlers, "log-event": lambda event: None}
    found = problems(Changed(scheduler, stream_handlers=handlers))
    assert [p.split(" (")[0] for p in found] == ["wrap_stream_handler"]


def test_a_graph_handler_of_another_shape_is_named(scheduler: Scheduler) -> None:
    async def update_graph(client: str, graph: Any) -> None:  # no expr_ser, no keys
        return None

    def synchronous(client: str, expr_ser: Any, keys: Any) -> None:
        return None

    for handler in (update_graph, synchronous):
        handlers = {**scheduler.stream_handlers, "update-graph": handler}
        found = problems(Changed(scheduler, stream_handlers=handlers))
        assert sorted(p.split(" (")[0] for p in found) == ["refuse_unread", "wrap_graph_handler"]


def test_the_graph_handler_keeps_dask_s_signature_once_wrapped(scheduler: Scheduler) -> None:
    handle = _internals.wrap_graph_handler(scheduler, lambda client, keys, nbytes: None)
    try:
        assert problems(scheduler) == []  # a second plugin's check sees dask's handler
    finally:
        _internals.unwrap_stream_handler(scheduler, handle)
    assert scheduler.stream_handlers["update-graph"] == scheduler.update_graph


def test_a_different_count_of_free_slots_is_named(
    scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    import distributed.scheduler

    def counted(ws: Any, saturation: float) -> int:
        return ws.nthreads - len(ws.processing)  # long-running tasks count again

    monkeypatch.setattr(distributed.scheduler, "_task_slots_available", counted)
    found = problems(scheduler)
    assert found and all("free slot" in p for p in found)
    assert {p.split(" (")[0] for p in found} == {
        "idle_workers",
        "free_slots",
        "withhold_slots",
        "restore_slots",
    }


@pytest.mark.parametrize(
    ("change", "verb"),
    [
        ({"idle_task_count": []}, "withhold_slots"),
        ({"transitions": lambda recs: None}, "fail_tasks"),
        ({"register_worker_plugin": lambda plugin: None}, "install_worker_plugin"),
        ({"clients": []}, "ensure_client"),
    ],
)
def test_each_changed_piece_is_named(
    scheduler: Scheduler, change: dict[str, Callable[..., Any]], verb: str
) -> None:
    found = problems(Changed(scheduler, **change))
    assert any(p.startswith(verb) for p in found), found


def test_check_scheduler_refuses_a_changed_behaviour_naming_it(scheduler: Scheduler) -> None:
    handlers = {**scheduler.stream_handlers, "log-event": lambda event: None}
    with pytest.raises(_internals.DaskInternalsError) as err:
        _internals.check_scheduler(Changed(scheduler, stream_handlers=handlers))
    msg = str(err.value)
    assert "missing wrap_stream_handler (" in msg and "please report it" in msg


def test_a_graph_whose_client_dask_no_longer_names_is_named(scheduler: Scheduler) -> None:
    def create(self: Any, *, start: Any, dsk: Any, keys: Any, **kwargs: Any) -> None:
        return None  # takes no 'client' keyword, sets no priorities

    found = problems(Changed(scheduler, _create_taskstate_from_graph=MethodType(create, scheduler)))
    found = [p for p in found if p.startswith(("wrap_priorities", "set_priority"))]
    assert len(found) == 2 and "no keyword 'client'" in found[0]


def test_the_identity_verbs_are_checked_and_a_changed_register_client_is_named(
    scheduler: Scheduler,
) -> None:
    assert _internals.check_identity_verbs(scheduler) == []
    handlers = {**scheduler.handlers, "register-client": lambda client: None}
    found = _internals.check_identity_verbs(Changed(scheduler, handlers=handlers))
    assert [p.split(" (")[0] for p in found] == ["watch_clients", "unwatch_clients"]
    assert "not (comm, client, versions)" in found[0]


def test_a_stream_that_keeps_a_messages_own_client_is_named(
    scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_internals, "_pin_stream", lambda comm, client: None)
    found = _internals.check_identity_verbs(scheduler)
    assert found and found[0].startswith("watch_clients")
    assert "reached dask's handler as client ['daskjobs-check-other']" in found[0]
