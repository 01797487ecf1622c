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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from daskjobs.cache.store import ResultStore
from daskjobs.plugin.surgery._worker_internals import stop_heartbeats
from daskjobs.sweep.diagnosis import (
    StageFailure,
    SweepCancelled,
    SweepKeyboardInterrupt,
    await_accepted,
    output_records,
    raise_rejected,
    rejected,
    warn_missing_resources,
)
from daskjobs.sweep.graph import SweepGraph
from daskjobs.sweep.shipping import check_importable, check_picklable
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
    computed it instead; ``in_memory`` counts the planned nodes that neither ran nor loaded
    because the cluster already held their results, or results computed from them (a future
    of the same content key kept by this or another client: dask hands over what it holds and
    runs nothing upstream of it); it is counted on runs without failures, where a node that
    did not run cannot be one a failure stopped. ``by_stage``
    splits ``computed``, ``hits`` and ``in_memory`` by stage. ``pruned``
    counts nodes left out of the graph because only loads needed them. ``store_errors`` counts
    results that could not be written to the store (they are returned all the same).
    ``replaced`` counts, by stage and reason, the stored results this run recomputed on
    purpose and overwrote (``"refresh"``, ``"expired"``, or ``"input"``: they read one of
    those); they are counted in ``computed`` too.
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
    in_memory: int = 0
    replaced: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

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
            f"computed {self.computed} stages, loaded {self.hits} from the store"
            + (
                f", {self.in_memory} not run as the cluster already held results"
                if self.in_memory
                else ""
            )
            + f" ({self.pruned} upstream stages skipped); {self.seconds:.2f} s"
        ]
        if self.reruns:
            lines.append(f"  {self.reruns} stages ran again (results lost with a worker, copies)")
        if self.store_errors:
            lines.append(
                f"  WARNING {self.store_errors} results could not be written to the store "
                f"{self.store}"
            )
        for name, counts in self.by_stage.items():
            line = f"  {name}: computed {counts['computed']}, loaded {counts['hits']}"
            held = counts.get("in_memory", 0)
            if held:
                line += f", already held {held}"
            why = self.replaced.get(name, {})
            if why:
                line += "; " + ", ".join(
                    f"recomputed {n} ({_REPLACED[reason]})" for reason, n in why.items()
                )
            lines.append(line)
        lines.extend(f"  FAILED {f}" for f in self.failures)
        if self.failures:
            lines.append("  (each failure's traceback: .failures[i].traceback)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


#: How a summary says why stored results were recomputed (SweepResult.replaced's reasons).
_REPLACED = {"refresh": "refresh", "expired": "expired", "input": "an input was recomputed"}


def run(
    sweep: Sweep | SweepGraph,
    client: Client | None = None,
    *,
    store: ResultStore | str | os.PathLike[str] | bool | None = None,
    outputs: Iterable[Stage] | None = None,
    progress: bool = True,
    cluster_kwargs: Mapping[str, Any] | None = None,
    refresh: bool | str | Stage | Iterable[str | Stage] | None = None,
) -> SweepResult:
    """Compute a sweep (or an already planned :class:`SweepGraph`, whose store is then used
    and ``store``/``outputs`` ignored) and return its results labelled by their parameters.

    ``refresh``: ``True``, or the names (or :class:`Stage` objects) of stages whose stored
    results this run recomputes and overwrites, with every stage that reads them
    (:attr:`SweepResult.replaced` counts them; docs/explanation/cache.md). An unknown stage is a
    ``ValueError`` before anything runs.

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
        if refresh is not None and refresh is not False:
            raise ValueError(
                "this sweep was planned already, so there is nothing left to refresh: "
                "pass refresh= to sweep.to_dask() or to sweep.run()"
            )
        graph = sweep
    else:
        graph = sweep.to_dask(store=store, outputs=outputs, refresh=refresh)
    check_picklable(graph)  # before a cluster starts or anything is submitted
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
    with (
        _QuietTeardown() as teardown,
        LocalCluster(**kwargs) as cluster,
        Client(cluster) as own_client,
    ):
        try:
            return _run_with(graph, own_client, progress, start)
        except SweepKeyboardInterrupt:
            teardown.quiet(own_client)  # a stage still running: its thread is cut short
            raise
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
    warn_missing_resources(graph, client)
    check_importable(client, graph)  # before anything reaches the cluster
    if graph.replace:
        _check_not_in_memory(client, graph)
    interrupted = False
    with _listen(client, graph.run_id) as log:
        futures: list[Any] = []
        try:
            futures = client.get(graph.graph, graph.keys, sync=False)
            rejection = await_accepted(client, futures)
            if rejection is None:
                if progress and futures:
                    from distributed import progress as show_progress

                    _say_forecast(client, graph)
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
                records, failures = output_records(graph, futures, values, lost)
                errors = [f.exception for f in failures.values()]
                rejection = next((e for e in errors if rejected(e)), None)
        except KeyboardInterrupt:  # Ctrl-C: the run's work stops; what finished is stored
            interrupted = True
            _cancel(client, futures)
        finally:
            # Before raising: the client's state of a key is shared by all its futures, and a
            # future kept alive by a traceback would make the next run of the key look failed.
            del futures
        if interrupted:
            # one error saying what is safe, without the frames of the progress bar or of
            # gather the interrupt landed in
            raise _interruption(graph) from None
        if rejection is not None:
            raise_rejected(client, graph, rejection)
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
    by_stage = counts.by_stage(graph.by_stage)
    in_memory = 0
    if not failures:  # a node that did not run was not stopped by a failure: dask had it
        for stage, plan in graph.by_stage.items():
            done = by_stage[stage]
            held = plan["computed"] + plan["hits"] - done["computed"] - done["hits"]
            done["in_memory"] = max(0, held)
            in_memory += done["in_memory"]
    result = SweepResult(
        records=tuple(records),
        failures=tuple(f.failure for f in failures.values()),
        computed=len(counts.computed),
        hits=len(counts.loaded - counts.computed.keys()),
        pruned=graph.pruned,
        recomputed=len(counts.recomputed),
        seconds=time.perf_counter() - start,
        by_stage=by_stage,
        store=store_url,
        reruns=sum(counts.computed.values()) - len(counts.computed),
        store_errors=len(counts.store_errors),
        in_memory=in_memory,
        replaced=counts.replaced_by_stage(graph.by_stage),
    )
    if cancelled:
        where = (
            f"they were committed to the store {store_url}: run the sweep again and it loads them"
            if store_url
            else "this run had no store, so a new run computes them again"
        )
        raise SweepCancelled(
            f"{len(cancelled)} of {len(records)} outputs of sweep run {graph.run_id} were "
            "cancelled before they finished: the scheduler was lost (killed or restarted, "
            "or the client's connection dropped) or the futures were cancelled. "
            f"{result.computed} stage(s) ran to completion and {where}. "
            "SweepCancelled.partial holds what was gathered.",
            result,
        )
    return result


def _check_not_in_memory(client: Client, graph: SweepGraph) -> None:
    """A result to recompute must not be in this client's memory: dask would hand it back as
    it is (its key is the same) and nothing would run.

    The futures of a previous run are released on the client's event loop, after the run
    returned: one round trip through the loop sends those releases to the scheduler before
    this run's graph. A key still held then is held by a future the caller keeps: a
    ``ValueError`` says so, before anything is submitted."""
    import asyncio

    with contextlib.suppress(Exception):  # an asynchronous client: nothing pending here
        client.sync(asyncio.sleep, 0)
    held = [key for key in graph.replace if key in client.futures]
    if held:
        raise ValueError(
            f"{len(held)} of the results this run would recompute ({held[0]}, ...) are held "
            "in this client's memory by futures you keep, and dask would return them as they "
            "are instead of recomputing them: release those futures (del them, or "
            "client.cancel(...)) and run again"
        )


# -- when the run will end ---------------------------------------------------------------------

#: Seconds of the client's time the forecast before a run's progress bar may take.
_FORECAST_BUDGET = 1.0


def _say_forecast(client: Client, graph: SweepGraph) -> None:
    """One line before the progress bar: when the run is expected to end, from
    :func:`daskjobs.forecast` (the plugin's learned durations, the policy, the workers).
    Nothing on a scheduler without the plugin, or if the forecast fails: the run goes on."""
    try:
        # asked first: a scheduler without the plugin would log its missing handler
        if not client.run_on_scheduler(lambda dask_scheduler: "daskjobs" in dask_scheduler.plugins):
            return
        from daskjobs.forecasting import forecast

        f = forecast(client, draws=10, budget=_FORECAST_BUDGET)
    except Exception:  # a policy this client lacks, a refused snapshot, run refused
        return
    r = f.sweeps.get(graph.label or "", f.remaining) if f.tasks else None
    if r is None:
        return
    rough = any("no measured duration yet" in n for n in f.notes)
    print(
        f"sweep run {graph.label}: expected to end in {r.p50:.1f} s "
        f"(p10 {r.p10:.1f} s, p90 {r.p90:.1f} s; daskjobs.forecast"
        + ("; rough: most of its tasks are not measured yet)" if rough else ")"),
        flush=True,
    )


# -- an interrupted run: Ctrl-C ---------------------------------------------------------------

#: Seconds a run interrupted by Ctrl-C waits for the scheduler to release its outputs.
_RELEASE_PATIENCE = 5.0


def _cancel(client: Client, futures: list[Any]) -> None:
    """Cancel an interrupted run's outputs and wait (a few seconds at most) until the
    scheduler has released them: a cluster closed right after then loses no result it
    still holds (dask warns of each such loss), and the client holds no future of them.
    A second Ctrl-C stops the wait."""
    if not futures:
        return
    keys = [f.key for f in futures]
    with contextlib.suppress(Exception):  # a client already closing: nothing to release
        client.cancel(futures, reason="the sweep run was interrupted (Ctrl-C)")
        scheduler = client.scheduler
        assert scheduler is not None
        deadline = time.monotonic() + _RELEASE_PATIENCE
        delay = 0.01
        while time.monotonic() < deadline:
            states = client.sync(scheduler.get_task_status, keys=keys)
            if all(s in (None, "released", "forgotten", "erred") for s in states.values()):
                return
            time.sleep(delay)
            delay = min(2 * delay, 0.2)


#: What dask logs while the cluster :func:`run` started closes with a stage still running
#: (its thread cannot be stopped): the worker's cancelled execution and the nanny's kill.
_TEARDOWN_LOGGERS = ("distributed.worker.state_machine", "distributed.nanny")


def _quiet_loggers(names: Iterable[str]) -> None:
    """Run on a worker: these loggers say only errors from now on (it is closing)."""
    import logging

    for name in names:
        logging.getLogger(name).setLevel(logging.ERROR)


class _QuietTeardown:
    """Closing the cluster :func:`run` started for a run interrupted by Ctrl-C: dask's
    warnings about the stage it cuts short are not the user's news (the interrupt's message
    is). Entered before the cluster, so that the levels come back once it has closed."""

    def __init__(self) -> None:
        self._saved: dict[str, int] = {}

    def __enter__(self) -> _QuietTeardown:
        return self

    def quiet(self, client: Client) -> None:
        import logging

        for name in _TEARDOWN_LOGGERS:
            logger = logging.getLogger(name)
            self._saved.setdefault(name, logger.level)
            logger.setLevel(logging.ERROR)
        with contextlib.suppress(Exception):
            client.run(_quiet_loggers, list(_TEARDOWN_LOGGERS))

    def __exit__(self, *exc: object) -> None:
        import logging

        for name, level in self._saved.items():
            logging.getLogger(name).setLevel(level)


def _interruption(graph: SweepGraph) -> SweepKeyboardInterrupt:
    """The error of a run interrupted by Ctrl-C: how many of its stages are in the store
    (a rerun loads them) and how many a rerun computes."""
    planned = list(dict.fromkeys([*graph.computed, *graph.loaded]))
    store = graph.store
    stored: int | None = None
    if store is None:
        where = "this run had no store, so a rerun computes every stage again"
    else:
        try:
            stored = len(store.contains_many(planned))
        except Exception as e:  # the store could not be listed: say so, do not fail here
            where = f"the store {store.url} could not be read ({type(e).__name__}: {e})"
        else:
            rest = len(planned) - stored
            where = (
                f"{stored} of its {len(planned)} stages are in the store {store.url}: run the "
                f"sweep again and it loads them ({rest} still to compute)"
            )
    return SweepKeyboardInterrupt(
        f"sweep run {graph.run_id} interrupted (Ctrl-C): {where}. Its work on the cluster "
        "was cancelled.",
        stored=stored,
        stages=len(planned),
    )


# -- what the workers report: one event per stage run, load and store failure ----------------


class _RunLog:
    """The events of one run (:func:`_event`), collected on the client as they arrive."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.computed: Counter[str] = Counter()  # key -> runs that returned
        self.loaded: set[str] = set()
        self.recomputed: set[str] = set()
        self.store_errors: dict[str, str] = {}  # key -> the first error
        self.replaced: dict[str, str] = {}  # key -> why its stored result was recomputed
        self.stage_of: dict[str, str] = {}

    def add(self, msg: Mapping[str, Any]) -> None:
        kind, key = msg.get("kind"), str(msg.get("key"))
        with self._lock:
            self.stage_of.setdefault(key, str(msg.get("stage", "")))
            if kind == "computed":
                self.computed[key] += 1
                why = str(msg.get("detail", ""))
                if why in _REPLACED:
                    self.replaced.setdefault(key, why)
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
            out.replaced = dict(self.replaced)
            out.stage_of = dict(self.stage_of)
        return out

    def replaced_by_stage(
        self, planned: Mapping[str, Mapping[str, int]]
    ) -> dict[str, dict[str, int]]:
        """``{stage: {reason: n}}`` of the stored results recomputed on purpose, stages in
        plan order and reasons in :data:`_REPLACED`'s."""
        counts = Counter((self.stage_of[key], why) for key, why in self.replaced.items())
        stages = [*planned, *sorted({stage for stage, _ in counts} - set(planned))]
        out = {}
        for stage in stages:
            why = {r: counts[stage, r] for r in _REPLACED if counts[stage, r]}
            if why:
                out[stage] = why
        return out

    def by_stage(self, planned: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
        """``{stage: {"computed": n, "hits": n, "in_memory": 0}}``, the planned stages first,
        in plan order (``in_memory`` is filled in by the run, which knows its failures)."""

        def zero() -> dict[str, int]:
            return {"computed": 0, "hits": 0, "in_memory": 0}

        out = {stage: zero() for stage in planned}
        for key in self.computed:
            out.setdefault(self.stage_of[key], zero())["computed"] += 1
        for key in self.loaded - self.computed.keys():  # a lost result reloaded is no hit
            out.setdefault(self.stage_of[key], zero())["hits"] += 1
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
