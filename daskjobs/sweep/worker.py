"""What runs on a worker: one stage's task.

:func:`compute_stage` (a computed node) and :func:`load_stage` (a cache hit) are the
functions of a sweep's Dask tasks. They take the node's claim on the store
(daskjobs.cache.claims), call the stage's function, commit its result, load an entry or
recompute a corrupt one, and tell the client what they did through dask's event topic
:data:`EVENT_TOPIC` (collected by :mod:`daskjobs.sweep.running`). A stage that raises raises
:class:`StageError`, carrying its labels and traceback.

The logger is ``daskjobs.sweep`` (not this module's name): the name the workers' log lines
carry and logging configurations select.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from daskjobs.cache.claims import Claims
from daskjobs.cache.store import ResultStore
from daskjobs.config import configure_logging
from daskjobs.sweep.shipping import ByValue, cloudpickle_dumps, shipped

logger = logging.getLogger("daskjobs.sweep")
# a worker that runs a stage imports this module: its daskjobs lines in dask's format too
configure_logging()

EVENT_TOPIC = "daskjobs.cache"


class StageError(Exception):
    """A stage's function raised; carries the stage, its key, labels and the traceback text."""

    def __init__(
        self, stage: str, key: str, labels: Mapping[str, Any], error: str, tb: str
    ) -> None:
        super().__init__(stage, key, dict(labels), error, tb)
        self.stage = stage
        self.key = key
        self.labels = dict(labels)
        self.error = error
        self.traceback = tb

    def __str__(self) -> str:
        labels = ", ".join(f"{k}={v!r}" for k, v in self.labels.items())
        return f"stage {self.stage!r} ({labels}) failed: {self.error}"

    def __repr__(self) -> str:  # short: distributed logs it for every failed attempt
        return f"StageError({str(self)!r})"


@dataclass(frozen=True)
class Call:
    """What a worker needs to run one node (pickled into the task).

    With ``by_value`` the function and parameters travel as cloudpickle blobs: dask pickles a
    graph with :mod:`pickle`, which ignores ``cloudpickle.register_pickle_by_value``, so this is
    how a module registered there reaches a cluster that cannot import it.
    """

    key: str
    stage: str
    func: Callable[..., Any]
    params: Mapping[str, Any]
    labels: Mapping[str, Any]
    input_names: tuple[str, ...]
    code: str
    cache: bool
    by_value: bool = False
    #: parameters the key leaves out, recorded in the entry (``ignore=``)
    ignored: tuple[str, ...] = ()
    #: the ignored parameters are left out of the entry's parameters (``ignore_labels=``)
    hide_ignored: bool = False
    #: the stage's ``max_age`` in seconds, recorded in the entry
    max_age: float | None = None
    #: why a stored entry is recomputed and overwritten ("refresh", "expired", "input"), or ""
    replace: str = ""

    def __reduce__(self) -> tuple[Any, ...]:
        func: Any = self.func
        params: Any = self.params
        if self.by_value:
            func = shipped(func)
            params = ByValue(cloudpickle_dumps(dict(params))) if params else params
        fields = (self.key, self.stage, func, params, self.labels, self.input_names)
        cache = (self.ignored, self.hide_ignored, self.max_age, self.replace)
        return (Call, (*fields, self.code, self.cache, self.by_value, *cache))

    def recorded_params(self) -> dict[str, Any]:
        """The parameters the stored entry records: labels and parameters, less the
        ignored ones with ``ignore_labels``."""
        params = {**self.labels, **self.params}
        if self.hide_ignored:
            for name in self.ignored:
                params.pop(name, None)
        return params


@dataclass(frozen=True)
class Recipe:
    """A node and, recursively, its inputs: how a load task recomputes a bad entry."""

    call: Call
    inputs: tuple[Recipe, ...]


@dataclass(frozen=True)
class Context:
    store: ResultStore | None
    run_id: str
    #: the store's claims (daskjobs.cache.claims), None when off or without a store
    claims: Claims | None = None


def _event(ctx: Context, kind: str, call: Call, detail: str = "") -> None:
    """Tell the client what this task did (kinds: ``computed``, ``loaded``, ``fenced``,
    ``recomputed``, ``recomputed-input``, ``store-error``); :class:`_RunLog` collects them.
    A ``computed`` event's detail is why a stored entry was recomputed, if it was
    (``refresh``, ``expired``, ``input``)."""
    msg = {"run": ctx.run_id, "kind": kind, "key": call.key, "stage": call.stage, "detail": detail}
    try:
        from distributed import get_worker

        get_worker().log_event(EVENT_TOPIC, msg)
    except (ImportError, ValueError):
        pass  # not on a distributed worker (e.g. dask's threaded scheduler)


_STORE_WARNED: dict[tuple[str, str], None] = {}  # (run, store) this process warned about
_STORE_WARNED_LOCK = threading.Lock()


def _store_failed(ctx: Context, call: Call, err: BaseException) -> None:
    """A result could not be committed: the first failure of a run in a worker process is a
    warning, the others DEBUG (the client warns once per run with the count)."""
    assert ctx.store is not None
    seen = (ctx.run_id, ctx.store.url)
    with _STORE_WARNED_LOCK:
        first = seen not in _STORE_WARNED
        _STORE_WARNED[seen] = None
        if len(_STORE_WARNED) > 256:  # forget the oldest runs
            del _STORE_WARNED[next(iter(_STORE_WARNED))]
    if first:
        logger.warning(
            "could not write to the daskjobs store %s (%r); results are still returned but not "
            "stored; further failures of this sweep in this process are logged at DEBUG",
            ctx.store.url,
            err,
        )
    else:
        logger.debug("could not store %s in %s: %r", call.key, ctx.store.url, err)
    _event(ctx, "store-error", call, f"{type(err).__name__}: {err}")


def _claim(call: Call, ctx: Context) -> tuple[bool, Any, Any]:
    """Take ``call``'s claim on the store (daskjobs.cache.claims) before computing it:
    ``(True, value, None)`` if another cluster computed it meanwhile, else
    ``(False, None, claim)`` with the claim to release (None: compute without one)."""
    if ctx.claims is None or ctx.store is None or not call.cache:
        return False, None, None
    store = ctx.store

    def stored() -> bool:  # an entry recomputed on purpose does not count as stored
        return not call.replace and store.contains(call.key)

    try:
        state, claim = ctx.claims.acquire(call.key, stored)
    except Exception as err:  # a store that cannot hold claims computes as before
        logger.debug("no claim on %s in %s: %r", call.key, store.url, err)
        return False, None, None
    if state == "stored":
        try:
            value = store.get(call.key)
        except KeyError:  # corrupt and removed: compute it here
            return False, None, None
        _event(ctx, "loaded", call, "computed by another cluster sharing the store")
        return True, value, None
    return False, None, claim


def _call(call: Call, ctx: Context, values: Sequence[Any]) -> Any:
    done, value, claim = _claim(call, ctx)
    if done:
        return value
    committed = False
    try:
        kwargs = dict(call.params)
        kwargs.update(zip(call.input_names, values, strict=True))
        start = time.perf_counter()
        try:
            value = call.func(**kwargs)
        except Exception as err:
            # with the function's own frames: the worker's one log record of a failed task
            # ("Compute Failed") then shows where the stage raised, not this wrapper
            raise StageError(
                call.stage,
                call.key,
                call.labels,
                f"{type(err).__name__}: {err}",
                traceback.format_exc(),
            ).with_traceback(err.__traceback__) from err
        seconds = time.perf_counter() - start
        _event(ctx, "computed", call, call.replace)
        if ctx.store is not None and call.cache:
            if claim is not None and claim.lost:
                # fenced: our claim expired and another cluster took it over; its commit
                # is the visible one, and our value still goes to our own client
                logger.warning(
                    "%s: the claim on the store expired while computing and was taken over; "
                    "returning the result without storing it",
                    call.key,
                )
                _event(ctx, "fenced", call, f"claim token {claim.token} was superseded")
            else:
                try:
                    ctx.store.put(
                        call.key,
                        value,
                        stage=call.stage,
                        params=call.recorded_params(),
                        code_hash=call.code,
                        compute_seconds=seconds,
                        ignored=call.ignored,
                        max_age=call.max_age,
                        replace=bool(call.replace),  # atomically over the old entry
                    )
                    committed = True
                except Exception as err:  # a full disk must not lose the computed value
                    _store_failed(ctx, call, err)
        return value
    finally:
        if claim is not None:
            claim.release(committed)


def compute_stage(call: Call, ctx: Context, *values: Any) -> Any:
    """The task of a computed node: call the function, commit the result, return it."""
    return _call(call, ctx, values)


def load_stage(recipe: Recipe, ctx: Context) -> Any:
    """The task of a cache hit: load the entry, or recompute it if it is corrupt or gone."""
    assert ctx.store is not None
    return _resolve(recipe, ctx, {}, top=True)


def _resolve(recipe: Recipe, ctx: Context, memo: dict[str, Any], top: bool = False) -> Any:
    key = recipe.call.key
    if key in memo:
        return memo[key]
    if ctx.store is not None and recipe.call.cache:
        try:
            value = ctx.store.get(key)
        except KeyError as err:
            # Corrupt entries were reported (and removed, if the store can be written) by the
            # store; recompute below.
            reason = getattr(err, "reason", "") or "gone: removed since the sweep was planned"
            logger.warning("store entry %s unusable (%s); recomputing it", key, reason)
            _event(ctx, "recomputed" if top else "recomputed-input", recipe.call, reason)
            left = getattr(err, "left", None)
            if left:  # a read-only store: the new value cannot replace the corrupt entry
                detail = f"corrupt entry could not be removed: {left}"
                _event(ctx, "store-error", recipe.call, detail)
        else:
            _event(ctx, "loaded", recipe.call)
            memo[key] = value
            return value
    values = [_resolve(sub, ctx, memo) for sub in recipe.inputs]
    memo[key] = value = _call(recipe.call, ctx, values)
    return value
