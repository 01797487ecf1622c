"""The worker half of recording: tell the scheduler when a task really starts.

The scheduler only knows when it *assigned* a task to a worker; the task may then
wait in the worker's ready heap for a long time. :class:`StartReporter` is a
``WorkerPlugin`` that sends one ``daskjobs-started`` event (``Worker.log_event``,
carried on the worker's batched stream) when a task enters ``executing``, with
the worker's wall-clock time and the task's ``run_id``. The scheduler plugin's
``log_event`` hook turns it into a ``started`` trace record.

Users never register it: :class:`~daskjobs.plugin.JobsPlugin` installs it on
every current and future worker while recording is on (:func:`reporter_bytes`
pickles it *by value*, so workers need ``distributed`` but not ``daskjobs``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

__all__ = ["REPORTER_NAME", "RETURNED_TOPIC", "STARTED_TOPIC", "StartReporter", "reporter_bytes"]

#: Event topic of the start reports.
STARTED_TOPIC = "daskjobs-started"
# a released task's thread has returned (dask cannot stop it; until then it holds a thread)
RETURNED_TOPIC = "daskjobs-returned"
_RETURNED_FROM = ("released", "memory", "error", "forgotten", "missing", "rescheduled")
#: Name the reporter is installed under on the workers.
REPORTER_NAME = "daskjobs-start-reporter"
#: The scheduler's message asking running tasks' slots back (preemption; daskjobs.preempted).
PREEMPT_OP = "daskjobs-preempt"
# worker attributes shared with daskjobs.tasks (which the reporter does not import)
_PREEMPT_ATTR = "_daskjobs_preempt"  # keys whose slot the scheduler asked back
_CHECKPOINTED_ATTR = "_daskjobs_checkpointed"  # key -> store of its checkpoint


class StartReporter(WorkerPlugin):
    """Report each task's transition to ``executing`` to the scheduler (O(1) per task)."""

    idempotent = False

    def __init__(self) -> None:
        self.worker: Any = None
        self.failures = 0

    def setup(self, worker: Any) -> None:
        self.worker = worker
        asked: set[Any] = getattr(worker, _PREEMPT_ATTR, None) or set()
        setattr(worker, _PREEMPT_ATTR, asked)

        def preempt(keys: Any = (), **kwargs: Any) -> None:
            # only a task running here now can be asked; its next run starts unasked
            asked.update(k for k in keys if k in worker.state.tasks)

        worker.stream_handlers[PREEMPT_OP] = preempt

    def teardown(self, worker: Any) -> None:
        worker.stream_handlers.pop(PREEMPT_OP, None)
        self.worker = None

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if start == "executing":
            self._left_executing(key, finish)
        if start == "cancelled" and finish in _RETURNED_FROM:
            try:
                self.worker.log_event(RETURNED_TOPIC, {"key": key, "time": time.time()})
            except Exception:
                self.failures += 1
            return
        if finish != "executing":
            return
        try:
            worker = self.worker
            ts = worker.state.tasks.get(key)
            msg = {
                "key": key,
                "run_id": getattr(ts, "run_id", None),
                "time": time.time(),
            }
            worker.log_event(STARTED_TOPIC, msg)
        except Exception:
            self.failures += 1
            logging.getLogger("daskjobs.plugin.worker").warning(
                "daskjobs: reporting the start of %r failed", key, exc_info=True
            )

    def _left_executing(self, key: Any, finish: str) -> None:
        """A run ended: it is no longer asked to yield; a task whose result is in no
        longer needs its checkpoint (``daskjobs.tasks`` kept which store holds it)."""
        worker = self.worker
        try:
            getattr(worker, _PREEMPT_ATTR, set()).discard(key)
            stores = getattr(worker, _CHECKPOINTED_ATTR, None)
            if stores and key in stores:
                store = stores.pop(key)
                if finish == "memory":
                    import sys

                    tasks = sys.modules.get("daskjobs.tasks")
                    if tasks is not None:
                        tasks.forget_checkpoint(key, store=store)
        except Exception:
            self.failures += 1


def reporter_bytes() -> bytes:
    """A pickled :class:`StartReporter`, by value, for ``register_worker_plugin``."""
    import sys

    import cloudpickle

    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(StartReporter())
    finally:
        cloudpickle.unregister_pickle_by_value(module)
