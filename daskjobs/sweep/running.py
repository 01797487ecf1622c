"""Running a sweep on a cluster: :func:`run`, its :class:`SweepResult`, and closing quietly.

:func:`run` starts a LocalCluster when given no client, checks that the stages can be
pickled and imported on the cluster, submits the graph, waits for every output to settle and
counts what the workers report having done (their events on
:data:`~daskjobs.sweep.worker.EVENT_TOPIC`, collected by :class:`_RunLog`).
:func:`quiet_workers` stops a cluster's heartbeats before it closes.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from daskjobs.cache.store import ResultStore
from daskjobs.plugin._worker_internals import stop_heartbeats
from daskjobs.sweep.diagnosis import (
    StageFailure,
    SweepInterrupted,
    _await_accepted,
    _raise_rejected,
    _records,
    _rejected,
    _warn_missing_resources,
)
from daskjobs.sweep.graph import SweepGraph
from daskjobs.sweep.shipping import _check_importable, _check_picklable
from daskjobs.sweep.worker import EVENT_TOPIC

if TYPE_CHECKING:
    from distributed import Client

    from daskjobs.sweep.stages import Stage, Sweep


@dataclass(frozen=True)
class SweepResult:
    """The outcome of :func:`run`.

    ``records`` holds one dict per output node: its labels, ``stage``, ``value`` (``None`` if it
    failed) and ``error`` (``None`` if it succeeded). The counts are what the workers did, not
    what was planned (the plan is on :class:`SweepGraph`): ``computed`` counts the stage nodes
    whose function ran to completion (once each, however often it ran), ``reruns`` the extra
    runs (dask recomputing a result lost with its worker, or a backup copy), ``hits`` the nodes
    loaded from the store; ``recomputed`` counts loads that found their entry unusable and
    computed it instead; ``by_stage`` splits ``computed`` and ``hits`` by stage. ``pruned``
    counts nodes left out of the graph because only loads needed them. ``store_errors`` counts
    results that could not be written to the store (they are returned all the same).
    ``seconds`` is the wall time of the run.
    """

    records: tuple[dict[str, Any], ...]
    failures: tuple[StageFailure, ...]
    computed: int
    hits: int
    pruned: int
    recomputed: int
    seconds: float
    by_stage: Mapping[str, Mapping[str, int]]
    store: str | None
    reruns: int = 0
    store_errors: int = 0

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def values(self) -> list[Any]:
        return [r["value"] for r in self.records]

    def table(self, expand: bool = True) -> dict[str, list[Any]]:
        """Columns of the records; with ``expand``, dict values become one column per field."""
        rows = []
        for r in self.records:
            row = {k: v for k, v in r.items() if k != "value"}
            value = r["value"]
            if expand and isinstance(value, Mapping):
                row.update(value)
            elif r["error"] is None:
                row["value"] = value
            rows.append(row)
        names = list(dict.fromkeys(k for row in rows for k in row))
        return {n: [row.get(n) for row in rows] for n in names}

    def to_pandas(self, expand: bool = True) -> Any:
        """The table as a pandas DataFrame (pandas is optional; this needs it installed)."""
        try:
            pd = importlib.import_module("pandas")
        except ImportError as err:
            raise ImportError("SweepResult.to_pandas needs pandas: pip install pandas") from err
        return pd.DataFrame(self.table(expand=expand))

    def summary(self) -> str:
        lines = [
            f"{len(self.records)} results, {len(self.failures)} failed stages; "
            f"computed {self.computed} stages, loaded {self.hits} from the store "
            f"({self.pruned} upstream stages skipped); {self.seconds:.2f} s"
        ]
        if self.reruns:
            lines.append(f"  {self.reruns} stages ran again (results lost with a worker, copies)")
        if self.store_errors:
            lines.append(
                f"  WARNING {self.store_errors} results could not be written to the store "
                f"{self.store}"
            )
        for name, counts in self.by_stage.items():
            lines.append(f"  {name}: computed {counts['computed']}, loaded {counts['hits']}")
        lines.extend(f"  FAILED {f}" for f in self.failures)
        if self.failures:
            lines.append("  (each failure's traceback: .failures[i].traceback)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def run(
    sweep: Sweep | SweepGraph,
    client: Client | None = None,
    *,
    store: ResultStore | str | os.PathLike[str] | bool | None = None,
    outputs: Iterable[Stage] | None = None,
    progress: bool = True,
    cluster_kwargs: Mapping[str, Any] | None = None,
) -> SweepResult:
    """Compute a sweep (or an already planned :class:`SweepGraph`, whose store is then used
    and ``store``/``outputs`` ignored) and return its results labelled by their parameters.

    ``client``: a ``distributed.Client``; without one a LocalCluster is started (one
    single-threaded worker process per core, at most four, dashboard on a free port; threads
    in one process for a ``memory://`` store) and closed at the end. ``cluster_kwargs``
    override its settings.
    ``progress`` shows dask's progress bar (a widget in notebooks, text in terminals).

    A failing stage does not stop the others: every result that was computed is committed to
    the store and returned, and :attr:`SweepResult.failures` names each failed stage with its
    labels and traceback. Each failure is logged once, by the worker that ran it (dask's
    "Compute Failed" record, whose traceback ends in the stage function's frames), and listed
    once in :meth:`SweepResult.summary`.

    A stage function or parameter that cannot be pickled (one closing over a lock, say) stops
    the run before anything starts, with a ``TypeError`` naming the stage, what cannot be
    pickled and the fix.
    """
    start = time.perf_counter()
    if isinstance(sweep, SweepGraph):
        graph = sweep
    else:
        graph = sweep.to_dask(store=store, outputs=outputs)
    _check_picklable(graph)  # before a cluster starts or anything is submitted
    if client is not None:
        return _run_with(graph, client, progress, start)

    from distributed import Client, LocalCluster

    local_memory = graph.store is not None and graph.store.url.startswith("memory://")
    n = max(1, min(4, os.cpu_count() or 1))
    kwargs: dict[str, Any] = {
        "n_workers": 1 if local_memory else n,
        "threads_per_worker": n if local_memory else 1,
        "processes": not local_memory,
        "dashboard_address": ":0",  # any free port: never clashes with another cluster
    }
    kwargs.update(cluster_kwargs or {})
    with LocalCluster(**kwargs) as cluster, Client(cluster) as own_client:
        try:
            return _run_with(graph, own_client, progress, start)
        finally:
            quiet_workers(own_client)


# -- closing a cluster quietly ------------------------------------------------------------------


def quiet_workers(client: Client) -> None:
    """Prepare a cluster you are about to close so that its workers close quietly.

    A worker closing while its heartbeat waits for the scheduler's answer aborts that
    heartbeat itself (``Worker.close`` stops the heartbeat callback, then closes its connection
    pool under the request) and logs it as an ERROR with a 25-line traceback, "Failed to
    communicate with scheduler during heartbeat" (dask/distributed#6543). It happens when the
    scheduler answers slowly as the cluster closes: a loaded machine, a busy scheduler. This
    stops every worker's heartbeats and waits for the answers in flight; call it just before
    closing a cluster you started (:func:`run` does, for the cluster it starts). Never raises.
    """
    with contextlib.suppress(Exception):  # a cluster already closing: nothing to quiet
        client.run(stop_heartbeats)


def _run_with(graph: SweepGraph, client: Client, progress: bool, start: float) -> SweepResult:
    _warn_missing_resources(graph, client)
    _check_importable(client, graph)  # before anything reaches the cluster
    with _listen(client, graph.run_id) as log:
        futures = client.get(graph.graph, graph.keys, sync=False)
        try:
            rejection = _await_accepted(client, futures)
            if rejection is None:
                if progress and futures:
                    from distributed import progress as show_progress

                    try:
                        show_progress(futures)  # a widget in notebooks, text in terminals
                    except ImportError:  # a notebook without ipywidgets
                        show_progress(futures, notebook=False)
                # gather waits for every output to settle, including one whose worker died
                # after it finished (dask recomputes it: "lost", then "finished" again)
                keyed = dict(zip(graph.keys, futures, strict=True))
                lost: OSError | None = None
                try:
                    values = client.gather(keyed, errors="skip")
                except OSError as exc:
                    # the connection to the scheduler broke while gather fetched the outputs
                    # (CommClosedError is an OSError): what finished was stored by its stage,
                    # and the run is interrupted like one whose futures were cancelled
                    values, lost = {}, exc.with_traceback(None)  # its frames hold futures
                del keyed
                records, failures = _records(graph, futures, values, lost)
                errors = [f.exception for f in failures.values()]
                rejection = next((e for e in errors if _rejected(e)), None)
        finally:
            # Before raising: the client's state of a key is shared by all its futures, and a
            # future kept alive by a traceback would make the next run of the key look failed.
            del futures
        if rejection is not None:
            _raise_rejected(client, graph, rejection)
        counts = log.counts()
    store_url = graph.store.url if graph.store is not None else None
    cancelled = [k for k, f in failures.items() if f.cancelled]
    if counts.store_errors:
        n = len(counts.store_errors)
        first = next(iter(counts.store_errors.values()))
        warnings.warn(
            f"could not write {n} result{'s' if n != 1 else ''} to the daskjobs store "
            f"{store_url} ({first}); they are returned, but not stored, so the next run "
            "computes them again",
            RuntimeWarning,
            stacklevel=3,
        )
    result = SweepResult(
        records=tuple(records),
        failures=tuple(f.failure for f in failures.values()),
        computed=len(counts.computed),
        hits=len(counts.loaded - counts.computed.keys()),
        pruned=graph.pruned,
        recomputed=len(counts.recomputed),
        seconds=time.perf_counter() - start,
        by_stage=counts.by_stage(graph.by_stage),
        store=store_url,
        reruns=sum(counts.computed.values()) - len(counts.computed),
        store_errors=len(counts.store_errors),
    )
    if cancelled:
        where = (
            f"they were committed to the store {store_url}: run the sweep again and it loads them"
            if store_url
            else "this run had no store, so a new run computes them again"
        )
        raise SweepInterrupted(
            f"{len(cancelled)} of {len(records)} outputs of sweep run {graph.run_id} were "
            "cancelled before they finished: the scheduler was lost (killed or restarted, "
            "or the client's connection dropped) or the futures were cancelled. "
            f"{result.computed} stage(s) ran to completion and {where}. "
            "SweepInterrupted.partial holds what was gathered.",
            result,
        )
    return result


# -- what the workers report: one event per stage run, load and store failure ----------------


class _RunLog:
    """The events of one run (:func:`_event`), collected on the client as they arrive."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.computed: Counter[str] = Counter()  # key -> runs that returned
        self.loaded: set[str] = set()
        self.recomputed: set[str] = set()
        self.store_errors: dict[str, str] = {}  # key -> the first error
        self.stage_of: dict[str, str] = {}

    def add(self, msg: Mapping[str, Any]) -> None:
        kind, key = msg.get("kind"), str(msg.get("key"))
        with self._lock:
            self.stage_of.setdefault(key, str(msg.get("stage", "")))
            if kind == "computed":
                self.computed[key] += 1
            elif kind == "loaded":
                self.loaded.add(key)
            elif kind == "recomputed":
                self.recomputed.add(key)
            elif kind == "store-error":
                self.store_errors.setdefault(key, str(msg.get("detail", "")))

    def counts(self) -> _RunLog:
        """A copy, safe to read while late events still arrive."""
        out = _RunLog()
        with self._lock:
            out.computed = Counter(self.computed)
            out.loaded = set(self.loaded)
            out.recomputed = set(self.recomputed)
            out.store_errors = dict(self.store_errors)
            out.stage_of = dict(self.stage_of)
        return out

    def by_stage(self, planned: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
        """``{stage: {"computed": n, "hits": n}}``, the planned stages first, in plan order."""
        out = {stage: {"computed": 0, "hits": 0} for stage in planned}
        for key in self.computed:
            out.setdefault(self.stage_of[key], {"computed": 0, "hits": 0})["computed"] += 1
        for key in self.loaded - self.computed.keys():  # a lost result reloaded is no hit
            out.setdefault(self.stage_of[key], {"computed": 0, "hits": 0})["hits"] += 1
        return out


_RUNS: dict[str, _RunLog] = {}  # run id -> its log, while the run lasts
_LISTENING: dict[str, int] = {}  # client id -> runs listening through it
_RUNS_LOCK = threading.Lock()


def _on_event(event: tuple[float, Any]) -> None:
    msg = event[1]
    if isinstance(msg, dict):
        log = _RUNS.get(str(msg.get("run")))
        if log is not None:
            log.add(msg)


@contextlib.contextmanager
def _listen(client: Client, run_id: str) -> Iterator[_RunLog]:
    """Collect the run's events while it lasts.

    The subscription goes to the scheduler before the graph, on the same stream, so no event
    is missed; a worker sends a task's events before the task's result, so the events of every
    stage an output needed arrive before the output is known to be done. (dask keeps only the
    last 1000 events of a topic for ``get_events``: a subscription sees them all.)
    """
    log = _RunLog()
    with _RUNS_LOCK:
        _RUNS[run_id] = log
        if not _LISTENING.get(client.id):
            client.subscribe_topic(EVENT_TOPIC, _on_event)
        _LISTENING[client.id] = _LISTENING.get(client.id, 0) + 1
    try:
        yield log
    finally:
        with _RUNS_LOCK:
            del _RUNS[run_id]
            _LISTENING[client.id] -= 1
            if not _LISTENING[client.id]:
                del _LISTENING[client.id]
                with contextlib.suppress(Exception):  # a closed client: nothing to undo
                    client.unsubscribe_topic(EVENT_TOPIC)
