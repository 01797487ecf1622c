"""What a run's outcome says: failed stages, a refused graph, interrupted runs.

:class:`StageFailure` records one stage that raised (:func:`output_records` builds one record per
output, :func:`_failure_of` the failure of an erred or cancelled output).
:func:`await_accepted` waits until the scheduler holds the graph or has rejected it, and
:func:`raise_rejected` turns a rejection into :class:`~daskjobs.SubmissionRefused` or
:class:`~daskjobs.sweep.shipping.ClusterImportError` naming the modules behind it.
:func:`warn_missing_resources` warns of a stage asking for resources no worker offers;
:class:`SweepInterrupted` is raised when a run stops before its outputs finished: its outputs
were cancelled (:class:`SweepCancelled`) or Ctrl-C interrupted it
(:class:`SweepKeyboardInterrupt`).
"""

from __future__ import annotations

import time
import traceback
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import CancelledError
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from daskjobs.errors import SubmissionRefused, refusal_of
from daskjobs.sweep.graph import SweepGraph
from daskjobs.sweep.shipping import (
    ClusterImportError,
    import_message,
    missing_on_cluster,
    referenced_modules,
)
from daskjobs.sweep.worker import StageError

if TYPE_CHECKING:
    from distributed import Client

    from daskjobs.sweep.running import SweepResult
    from daskjobs.sweep.stages import Node


@dataclass(frozen=True)
class StageFailure:
    """A stage that raised: its name, key, labels, the error and the traceback text."""

    stage: str
    key: str
    labels: Mapping[str, Any]
    error: str
    traceback: str

    def __str__(self) -> str:
        labels = ", ".join(f"{k}={v!r}" for k, v in self.labels.items())
        return f"{self.stage}({labels}): {self.error}"


@dataclass(frozen=True)
class _Failed:
    failure: StageFailure
    exception: BaseException | None
    cancelled: bool = False  # dask cancelled the output (not the stage's own error)


def output_records(
    graph: SweepGraph,
    futures: Sequence[Any],
    values: Mapping[str, Any],
    lost: OSError | None = None,
) -> tuple[list[dict[str, Any]], dict[str, _Failed]]:
    """One record per output; a gathered value wins over a later status (the output may have
    been lost again after it was gathered: the value is still the right one). With ``lost``
    (gather broke off: the scheduler went away) an output without a value is cancelled."""
    failures: dict[str, _Failed] = {}
    records: list[dict[str, Any]] = []
    for node, fut in zip(graph.output_nodes, futures, strict=True):
        record: dict[str, Any] = {**node.labels, "stage": node.stage}
        value = values.get(fut.key)
        if lost is not None and fut.key not in values:
            error = f"not gathered: the connection to the scheduler broke ({lost!r})"
            failure = StageFailure(node.stage, node.key, dict(node.labels), error, "")
            failures.setdefault(failure.key, _Failed(failure, lost, cancelled=True))
            record["value"] = None
            record["error"] = error
        elif value is not None or fut.status not in ("error", "cancelled"):
            record["value"] = value
            record["error"] = None
        else:
            failure, exc = _failure_of(node, fut)
            failures.setdefault(
                failure.key, _Failed(failure, exc, cancelled=fut.status == "cancelled")
            )
            record["value"] = None
            record["error"] = str(failure)
        records.append(record)
    return records, failures


def warn_missing_resources(graph: SweepGraph, client: Client) -> None:
    """Warn when a stage asks for resources no current worker has: its tasks would wait."""
    wanted = {}
    for layer in graph.graph.layers.values():
        resources = (layer.annotations or {}).get("resources")
        if resources:
            wanted[layer.annotations["stage"]] = resources
    if not wanted:
        return
    workers = client.scheduler_info(n_workers=-1).get("workers", {}).values()
    offered = [w.get("resources") or {} for w in workers]
    for stage, resources in wanted.items():
        if not any(all(o.get(r, 0) >= n for r, n in resources.items()) for o in offered):
            warnings.warn(
                f"stage {stage!r} needs resources {resources} that no worker of this cluster "
                "offers; its tasks will wait until such a worker joins",
                RuntimeWarning,
                stacklevel=3,
            )


def _failure_of(node: Node, fut: Any) -> tuple[StageFailure, BaseException | None]:
    """The failure of a settled output (erred or cancelled) and its exception."""
    exc: BaseException | None
    try:
        exc = fut.exception()  # settled: returns at once
    except Exception as err:  # cancelled (the exception is the cancellation)
        exc = err
    if isinstance(exc, StageError):
        failure = StageFailure(exc.stage, exc.key, exc.labels, exc.error, exc.traceback)
        return failure, exc
    if exc is None:  # not an error after all: say what dask reported
        error = f"no result: the output's status is {fut.status!r}"
        return StageFailure(node.stage, node.key, dict(node.labels), error, ""), None
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    error = f"{type(exc).__name__}: {exc}"
    return StageFailure(node.stage, node.key, dict(node.labels), error, tb), exc


class SweepInterrupted(BaseException):
    """A sweep run stopped before its outputs finished; every stage that finished was
    committed to the store, so running the sweep again loads it. ``except SweepInterrupted``
    catches both of its kinds: :class:`SweepCancelled` (the scheduler was lost, or the
    futures cancelled: a ``RuntimeError``) and :class:`SweepKeyboardInterrupt` (Ctrl-C: a
    ``KeyboardInterrupt``, which ``except Exception`` does not swallow)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


class SweepCancelled(SweepInterrupted, RuntimeError):
    """Outputs of the sweep were cancelled before they finished: the scheduler was lost
    (killed, restarted, the client's connection dropped) or someone cancelled the
    futures. ``partial`` is the :class:`SweepResult` of what was gathered."""

    def __init__(self, message: str, partial: SweepResult) -> None:
        super().__init__(message)
        self.partial = partial


class SweepKeyboardInterrupt(SweepInterrupted, KeyboardInterrupt):
    """:func:`~daskjobs.run` was interrupted by Ctrl-C (a ``KeyboardInterrupt``): its
    outputs were cancelled and released; ``stored`` of its ``stages`` are in the store
    (None if it has none, or it could not be read), and the message says so. Raised once,
    in place of the interrupt (not on top of dask's progress bar)."""

    def __init__(self, message: str, stored: int | None = None, stages: int = 0) -> None:
        super().__init__(message)
        self.stored = stored
        self.stages = stages


def await_accepted(client: Client, futures: Sequence[Any]) -> BaseException | None:
    """Return once the scheduler holds the graph (``None``) or has rejected it (the error).

    dask reports a graph it cannot deserialize as an error of every output, but its progress
    bar waits for the outputs to appear on the scheduler, for ever: so wait for one or the
    other first (a few round trips). A graph the daskjobs plugin refused is on the
    scheduler, its tasks erred with the refusal (:class:`~daskjobs.SubmissionRefused`):
    that is returned too. Nothing is raised here (see :func:`_run_with`).
    """
    if not futures:
        return None
    first = futures[0]
    scheduler = client.scheduler
    assert scheduler is not None
    delay = 0.002
    while not first.done():
        state = client.sync(scheduler.get_task_status, keys=[first.key]).get(first.key)
        if state == "erred":  # its report to this client is on its way
            first.exception(timeout=_REPORT_PATIENCE)
            break
        if state is not None:
            return None
        time.sleep(delay)
        delay = min(2 * delay, 0.1)
    if first.status == "error":
        exc = first.exception()
        return exc if rejected(exc) else None
    if first.status == "cancelled":  # a large graph refused unread: cancelled, with the refusal
        try:
            first.result(timeout=_REPORT_PATIENCE)
        except CancelledError as e:
            return refusal_of(e)
        except Exception:  # any other outcome is read with the outputs
            return None
    return None


#: Seconds the scheduler's report of an erred output may take to reach this client.
_REPORT_PATIENCE = 30.0


def rejected(exc: BaseException | None) -> bool:
    if isinstance(exc, SubmissionRefused):
        return True
    return isinstance(exc, RuntimeError) and "deserialization of the task graph" in str(exc)


def raise_rejected(client: Client, graph: SweepGraph, rejection: BaseException) -> None:
    """The scheduler refused the graph (raise the refusal, naming the sweep run), or could
    not read it: name the modules behind it (its error does not)."""
    if isinstance(rejection, SubmissionRefused):
        lead = f"the scheduler refused sweep run {graph.run_id}; nothing of it ran: "
        try:
            refused = type(rejection)(lead + str(rejection))
        except Exception:  # a refusal type that takes other arguments
            refused = SubmissionRefused(lead + str(rejection))
        raise refused from None
    candidates = referenced_modules(graph._calls)
    missing = missing_on_cluster(client, sorted(candidates)) if candidates else {}
    lead = "the scheduler could not read this sweep's graph; nothing ran:"
    if not missing:
        raise ClusterImportError(
            f"{lead}\n  {rejection}\nThe scheduler's log names the module it could not "
            "import: install it there (the same environment as this client).",
            [],
        ) from rejection
    message = import_message(missing, graph.modules, lead)
    raise ClusterImportError(message, list(missing)) from rejection
