"""The plugin's worker half: tell the scheduler when a task really starts; re-order the
tasks waiting on a worker when the scheduler re-ranks them.

The scheduler only knows when it *assigned* a task to a worker; the task may then
wait in the worker's ready heap for a long time. :class:`StartReporter` is a
``WorkerPlugin`` that sends a ``daskjobs-started`` event (``Worker.log_event``,
carried on the worker's batched stream) when a task enters ``executing``, with
the worker's wall-clock time and the task's ``run_id``. The scheduler plugin's
``log_event`` hook turns it into a ``started`` trace record.

With a ``delay`` (speculation alone needs the starts: no recording, preemption or
resources), starts are reported late and together: the first start after a report
arms a timer of ``delay`` seconds, and when it fires one event carries every task
started since that is *still executing*, each with its age (seconds since its start,
on the worker's clock, so the scheduler places the start on its own clock without
trusting the worker's). A task that ends sooner is never reported: its start was
only needed to judge it late, and nothing is judged late before ``min-runtime``
(the plugin keeps ``delay`` at most half of it). A backup copy's start is reported at
once: the scheduler must know whether a copy it drops holds a thread. On a sweep of
short tasks this takes one message a task off every worker's stream and off the
scheduler's (docs/how-to/load-the-plugin.md: about a tenth of the scheduler's rate of starts).

Users never register it: :class:`~daskjobs.plugin.JobsPlugin` installs it on
every current and future worker while recording is on (:func:`reporter_bytes`
pickles it *by value*, so workers need ``distributed`` but not ``daskjobs``).

:class:`Reorderer` is the other half of re-ranking a stage as its estimates improve
(:mod:`daskjobs.plugin.ranking`): dask sends a task with inputs to a worker as soon as it
is runnable, where it waits in the worker's ready heap; the scheduler plugin sends the new
priorities of a worker's waiting tasks in one :data:`REORDER_OP` message, and the reorderer
re-orders the heap through the worker-side verbs of
:mod:`daskjobs.plugin.surgery._worker_internals`. Installed (by value, with that module) while the
plugin re-ranks.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import WorkerPlugin

from daskjobs.plugin.surgery import _worker_internals as worker_internals

if TYPE_CHECKING:
    from distributed import Worker

__all__ = [
    "REORDERER_NAME",
    "REORDER_OP",
    "REORDER_TOPIC",
    "REPORTER_NAME",
    "RETURNED_TOPIC",
    "STARTED_TOPIC",
    "Reorderer",
    "StartReporter",
    "reorderer_bytes",
    "reporter_bytes",
]

#: Event topic of the start reports.
STARTED_TOPIC = "daskjobs-started"
# a released task's thread has returned (dask cannot stop it; until then it holds a thread)
RETURNED_TOPIC = "daskjobs-returned"
_RETURNED_FROM = ("released", "memory", "error", "forgotten", "missing", "rescheduled")
#: Name the reporter is installed under on the workers.
REPORTER_NAME = "daskjobs-start-reporter"
#: First element of a backup copy's key (``daskjobs.plugin.enact.speculation.copy_key``); the
#: reporter cannot import daskjobs on a worker, so the name lives here.
COPY_PREFIX = "daskjobs-copy"
#: The scheduler's message asking running tasks' slots back (preemption; daskjobs.preempted).
PREEMPT_OP = "daskjobs-preempt"
# worker attributes shared with daskjobs.tasks (which the reporter does not import)
_PREEMPT_ATTR = "_daskjobs_preempt"  # keys whose slot the scheduler asked back
_CHECKPOINTED_ATTR = "_daskjobs_checkpointed"  # key -> store of its checkpoint
#: The scheduler's message giving tasks waiting on a worker new priorities (re-ranking).
REORDER_OP = "daskjobs-reprioritize"
#: The reorderer's event: this worker takes :data:`REORDER_OP` (``{"ready": bool}``).
REORDER_TOPIC = "daskjobs-reorders"
#: Name the reorderer is installed under on the workers.
REORDERER_NAME = "daskjobs-reorderer"


class StartReporter(WorkerPlugin):
    """Report each task's transition to ``executing`` to the scheduler (O(1) per task):
    at once, or with ``delay`` > 0 seconds, the starts of tasks still running after at
    most ``delay``, together (see the module docs)."""

    idempotent = False

    def __init__(self, delay: float = 0.0) -> None:
        if isinstance(delay, bool) or not (
            isinstance(delay, int | float) and 0 <= delay < float("inf")
        ):
            raise ValueError(f"delay must be a finite number of seconds >= 0, got {delay!r}")
        self.worker: Any = None
        self.failures = 0
        self.delay = float(delay)
        self._unsent: dict[Any, tuple[Any, float]] = {}  # key -> (run_id, start), delayed
        self._armed = False  # a report of the unsent starts is due
        self.reports = 0  # events sent with delayed starts (for tests and debugging)

    def setup(self, worker: Worker) -> None:
        self.worker = worker
        asked: set[Any] = getattr(worker, _PREEMPT_ATTR, None) or set()
        setattr(worker, _PREEMPT_ATTR, asked)

        def preempt(keys: Any = (), **kwargs: Any) -> None:
            # only a task running here now can be asked; its next run starts unasked
            asked.update(k for k in keys if k in worker.state.tasks)

        worker.stream_handlers[PREEMPT_OP] = preempt

    def teardown(self, worker: Worker) -> None:
        worker.stream_handlers.pop(PREEMPT_OP, None)
        self.worker = None
        self._unsent.clear()

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if start == "executing":
            if self._unsent and finish != "long-running":  # (a seceded task still runs)
                self._unsent.pop(key, None)  # ended before its report: never needed
            self._left_executing(key, finish)
        if start == "cancelled" and finish in _RETURNED_FROM:
            try:
                self.worker.log_event(RETURNED_TOPIC, {"key": key, "time": time.time()})
            except Exception:
                self.failures += 1
            return
        if finish != "executing":
            return
        if self.delay and not (isinstance(key, tuple) and key and key[0] == COPY_PREFIX):
            self._later(key)
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

    def _later(self, key: Any) -> None:
        """Keep ``key``'s start for the next delayed report; arm it if none is due."""
        try:
            worker = self.worker
            ts = worker.state.tasks.get(key)
            self._unsent[key] = (getattr(ts, "run_id", None), time.time())
            if not self._armed:
                worker.loop.call_later(self.delay, self._report)
                self._armed = True
        except Exception:
            self.failures += 1
            logging.getLogger("daskjobs.plugin.worker").warning(
                "daskjobs: keeping the start of %r failed", key, exc_info=True
            )

    def _report(self) -> None:
        """The delayed report: the starts of the tasks still executing, with their age."""
        self._armed = False
        unsent, self._unsent = self._unsent, {}
        worker = self.worker
        if not unsent or worker is None:
            return
        try:
            now = time.time()
            starts = [[key, run_id, t, now - t] for key, (run_id, t) in unsent.items()]
            worker.log_event(STARTED_TOPIC, {"starts": starts})
            self.reports += 1
        except Exception:
            self.failures += 1
            logging.getLogger("daskjobs.plugin.worker").warning(
                "daskjobs: reporting %d starts failed", len(unsent), exc_info=True
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


class Reorderer(WorkerPlugin):
    """Take the scheduler's new priorities for tasks waiting on this worker (a re-ranked
    stage, docs/how-to/estimates.md): the :data:`REORDER_OP` message, enacted by the verb
    :func:`~daskjobs.plugin.surgery._worker_internals.reorder` (O(r log r) a message for the
    ``r`` tasks waiting here). At setup it runs the verb's self-check on this worker's
    dask; only if it passes does it take the message and tell the scheduler so
    (a :data:`REORDER_TOPIC` event): the scheduler sends the message to no other worker
    (a worker's stream closes on a message it has no handler for)."""

    idempotent = False

    def __init__(self) -> None:
        self.worker: Any = None
        self.reordered = 0  # tasks given a new priority here (for tests and debugging)
        self.failures = 0
        self.problems: list[str] = []

    def setup(self, worker: Worker) -> None:
        self.problems = worker_internals.check_worker_verbs()
        if self.problems:
            logging.getLogger("daskjobs.plugin.worker").warning(
                "daskjobs: this worker's dask changed what re-ranking relies on (%s): "
                "tasks waiting here keep the priority they came with",
                "; ".join(self.problems),
            )
            return
        self.worker = worker

        def reprioritize(priorities: Any = (), **kwargs: Any) -> None:
            try:
                self.reordered += worker_internals.reorder(worker.state, priorities)
            except Exception:
                self.failures += 1
                logging.getLogger("daskjobs.plugin.worker").warning(
                    "daskjobs: re-ranking %d tasks failed", len(priorities), exc_info=True
                )

        worker.stream_handlers[REORDER_OP] = reprioritize
        worker.log_event(REORDER_TOPIC, {"ready": True})

    def teardown(self, worker: Worker) -> None:
        if self.worker is not None:
            worker.stream_handlers.pop(REORDER_OP, None)
            self.worker = None


def _by_value(plugin: WorkerPlugin) -> bytes:
    """``plugin`` pickled with this module and the worker verbs by value (workers need
    ``distributed``, not ``daskjobs``)."""
    import sys

    import cloudpickle

    modules = [sys.modules[__name__], worker_internals]
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(plugin)
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)


def reporter_bytes(delay: float = 0.0) -> bytes:
    """A pickled :class:`StartReporter` (reporting with ``delay``), by value, for
    ``register_worker_plugin``."""
    return _by_value(StartReporter(delay))


def reorderer_bytes() -> bytes:
    """A pickled :class:`Reorderer`, by value, for ``register_worker_plugin``."""
    return _by_value(Reorderer())
