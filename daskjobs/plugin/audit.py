"""The plugin's audit trail and its safety net, shared by every part of the plugin.

* :meth:`Audit.event` - a decision worth explaining: kept for ``explain`` and
  ``status``, written to the trace while recording, published on dask's
  ``daskjobs`` topic. The trace and :attr:`Audit.events` take records from here
  only, never from the topic, which any client may write to.
* :meth:`Audit.failed` and :func:`guarded` - the plugin runs inside a shared
  scheduler: an exception in a hook is logged at WARNING with the key, counted in
  :attr:`Audit.errors` under the name of the part that raised it (``Part.name``: no two
  parts share one) or of the step that failed outside a part, and swallowed; dask
  carries on.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from distributed.scheduler import Scheduler

__all__ = ["EVENT_TOPIC", "Audit", "guarded"]

logger = logging.getLogger("daskjobs.plugin")

#: dask event-log topic of the plugin's audit records.
EVENT_TOPIC = "daskjobs"

F = TypeVar("F", bound=Callable[..., Any])


class Audit:
    """Audit records and swallowed-error counts. ``scheduler`` and ``recorder`` are set
    by the plugin as they come and go."""

    def __init__(self, maxlen: int) -> None:
        self.events: deque[dict[str, Any]] = deque(maxlen=maxlen)
        self.errors: dict[str, int] = {}
        self.scheduler: Scheduler = None  # type: ignore[assignment]  # set at start
        self.recorder: Any = None

    def event(self, action: str, **msg: Any) -> None:
        msg = {"action": action, **msg}
        now = time.time()
        self.events.append({"time": now, **msg})
        rec = self.recorder
        if rec is not None:
            try:
                rec.emit({"type": "event", "time": now, "event": dict(msg)})
            except Exception:
                self.failed("record")
        try:
            self.scheduler.log_event(EVENT_TOPIC, msg)
        except Exception:
            self.failed("log_event")

    def failed(self, where: str, key: object = None) -> None:
        """Count and log the exception being handled (call from an ``except`` block)."""
        self.errors[where] = self.errors.get(where, 0) + 1
        logger.warning(
            "daskjobs: %s failed%s", where, f" for {key!r}" if key else "", exc_info=True
        )

    def guard(self, where: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` with its exceptions counted under ``where`` and swallowed."""

        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception:
                self.failed(where)
                return None

        return run


def guarded(where: str, key_arg: int | None = None) -> Callable[[F], F]:
    """Decorate a method of an object with an ``audit`` attribute: an exception is
    counted under ``where`` (naming positional argument ``key_arg``, e.g. the task key)
    and swallowed, and the method returns None."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(self, *args, **kwargs)
            except Exception:
                key = args[key_arg] if key_arg is not None and len(args) > key_arg else None
                self.audit.failed(where, key)
                return None

        return run  # type: ignore[return-value]

    return wrap
