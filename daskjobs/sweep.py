"""Sweeps: stages over parameter grids, built as content-keyed Dask graphs.

A sweep is described once, in the order one thinks about it::

    from daskjobs import Sweep, grid
    from daskjobs.examples import crossover_backtest, rolling_features, synthetic_prices

    sweep = Sweep("backtests", team="quant")
    prices = sweep.stage(synthetic_prices, over=grid(slice=range(8)), params={"bars": 20_000})
    features = sweep.stage(
        rolling_features,
        inputs={"prices": prices},
        params={"windows": (5, 10, 20, 50, 100)},
        estimate=0.5,
    )
    backtests = sweep.stage(
        crossover_backtest,
        inputs={"features": features},
        over=grid(fast=[5, 10, 20], slow=[50, 100]),
        params={"cost_bps": 5.0},
        estimate=lambda p: 0.0002 * p["slow"],
    )
    result = sweep.run(client)        # or daskjobs.run(sweep, client)
    result.table()                    # a column per label and per field of the result

(the README's example, run by its tests.)

How stages fan out
------------------
Each stage is expanded into *nodes* (one function call each) as soon as it is declared:

* ``over=`` is the stage's own grid: :func:`grid` for a cartesian product, :func:`cases` for an
  explicit list of points, ``grid(...) * cases(...)`` and ``+`` to combine them.
  ``params=`` are fixed keyword arguments shared by every node.
* ``inputs=`` maps the function's argument names to upstream stages. The upstream nodes are
  combined by a natural join on their *labels* (the swept parameters they carry): a backtest
  reading ``features`` (one per ``slice``) and ``prices`` (one per ``slice``) gets the pair with
  the same ``slice``; inputs with no label in common are crossed. Then the result is crossed with
  the stage's own grid.
* A node's labels are its upstream labels plus its own swept parameters; they label the results.
  A swept parameter may not reuse an upstream label's name (that would be ambiguous).

Every node's Dask key is its content key (:mod:`daskjobs.cache.keys`), so a feature read by a
hundred backtests is one node, computed once.

What reaches the scheduler
--------------------------
:meth:`Sweep.to_dask` returns :class:`SweepGraph`, an ordinary Dask collection
(``dask.compute``, ``client.compute``, and ``client.get(graph.__dask_graph__(), graph.keys)``
all accept it). Its graph is a ``HighLevelGraph`` with one layer per stage and kind, whose layer
annotations reach ``TaskState.annotations`` on the scheduler: ``stage`` (the stage name),
``estimate`` (seconds, if given), ``params`` (the node's labels and parameters, which the
scheduler's duration model learns from), ``team``, ``resources``, ``retries``, ``speculate``
and ``cache``; loads from the store also carry ``load: True``.

Caching
-------
Before the graph is built the store is consulted once (one listing). A cacheable node whose key
is stored becomes a *load* task with no dependencies, and every upstream node needed only by
loads is left out of the graph. Computed nodes commit their result to the store from the worker
that computed them. If a load finds its entry corrupt or gone, it is removed and the load task
recomputes the value itself (loading or recomputing its inputs the same way), so a bad entry
costs time, never a wrong or missing result. In a store the workers cannot write, a corrupt
entry is recomputed all the same and not written back.

A store that cannot be written never fails a stage: the value is returned, the worker logs the
first failure (later ones at DEBUG), and :func:`run` warns once per sweep with the count
(:attr:`SweepResult.store_errors`).

Running on a cluster
--------------------
:func:`run` checks first that the scheduler and the workers can import the modules of the stage
functions, and stops with :class:`ClusterImportError` naming them and the fix (install them on
the cluster, or ``cloudpickle.register_pickle_by_value(module)``, which sweeps honour for stage
functions and parameters) before anything is submitted: dask would otherwise leave a graph the
scheduler cannot read pending forever, or lose every worker that receives a task it cannot
unpickle. Then it waits until every output has settled, however often: an output whose worker
died after it finished is recomputed by dask, and waited for. The counts in
:class:`SweepResult` are what the workers report having done (through dask's event topic
``daskjobs.cache``), not what was planned: a stage whose input failed, or that dask found
already in memory, did not run and is not counted.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import io
import itertools
import logging
import math
import os
import pickle
import sys
import threading
import time
import traceback
import uuid
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from daskjobs.cache.claims import Claims
from daskjobs.cache.keys import (
    code_hash,
    stage_key,
    tokenize_param,
    validate_stage_name,
)
from daskjobs.cache.store import ResultStore
from daskjobs.config import configure_logging
from daskjobs.errors import SubmissionRefused

if TYPE_CHECKING:
    from distributed import Client

__all__ = [
    "ClusterImportError",
    "Grid",
    "Node",
    "Stage",
    "StageError",
    "StageFailure",
    "Sweep",
    "SweepGraph",
    "SweepInterrupted",
    "SweepResult",
    "cases",
    "grid",
    "quiet_workers",
    "run",
]

logger = logging.getLogger("daskjobs.sweep")
# a worker that runs a stage imports this module: its daskjobs lines in dask's format too
configure_logging()

EVENT_TOPIC = "daskjobs.cache"


# -- grids ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grid:
    """A list of parameter points (dicts). ``a * b`` is the product, ``a + b`` the union."""

    points: tuple[Mapping[str, Any], ...]

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        return iter(self.points)

    def __len__(self) -> int:
        return len(self.points)

    def __mul__(self, other: Grid) -> Grid:
        if not isinstance(other, Grid):
            return NotImplemented
        points = []
        for a, b in itertools.product(self.points, other.points):
            clash = set(a) & set(b)
            if clash:
                raise ValueError(f"cannot multiply grids that share parameters {sorted(clash)}")
            points.append({**a, **b})
        return Grid(tuple(points))

    def __add__(self, other: Grid) -> Grid:
        if not isinstance(other, Grid):
            return NotImplemented
        return Grid(self.points + other.points)

    @property
    def names(self) -> tuple[str, ...]:
        """Parameter names, in order of first appearance."""
        return tuple(dict.fromkeys(name for p in self.points for name in p))


def grid(**axes: Iterable[Any]) -> Grid:
    """The cartesian product of the given axes: ``grid(fast=[5, 10], slow=[50, 100])``."""
    names = list(axes)
    values = []
    for name in names:
        axis = axes[name]
        if isinstance(axis, (str, bytes)) or not isinstance(axis, Iterable):
            raise TypeError(
                f"grid axis {name!r} must be a list of values, got {type(axis).__name__}; "
                f"for a fixed value use params={{{name!r}: ...}} or grid({name}=[value])"
            )
        values.append(list(axis))
    return Grid(tuple(dict(zip(names, combo, strict=True)) for combo in itertools.product(*values)))


def cases(*points: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> Grid:
    """An explicit list of points: ``cases({"fast": 5, "slow": 50}, {"fast": 10, "slow": 200})``
    (or one list of dicts)."""
    if len(points) == 1 and not isinstance(points[0], Mapping):
        points = tuple(points[0])
    out = []
    for p in points:
        if not isinstance(p, Mapping):
            raise TypeError(f"cases() takes dicts of parameters, got {type(p).__name__}")
        out.append(dict(p))
    return Grid(tuple(out))


def _as_grid(over: Grid | Mapping[str, Iterable[Any]] | Iterable[Mapping[str, Any]] | None) -> Grid:
    if over is None:
        return Grid(({},))
    if isinstance(over, Grid):
        return over
    if isinstance(over, Mapping):
        return grid(**over)
    return cases(list(over))


# -- the graph's nodes --------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """One call of a stage's function: its content key, labels, parameters and inputs."""

    key: str
    stage: str
    labels: Mapping[str, Any]
    params: Mapping[str, Any]
    inputs: Mapping[str, str]  # argument name -> upstream key
    label_tokens: Mapping[str, str] = field(repr=False)
    estimate: float | None = None


@dataclass(frozen=True)
class StageOptions:
    """Per-stage scheduling and caching options (the annotations the scheduler sees)."""

    estimate: float | str | Callable[[Mapping[str, Any]], float | str] | None = None
    team: str | None = None
    resources: Mapping[str, float] | None = None
    retries: int | None = None
    cache: bool = True
    speculate: bool = True
    version: str | None = None
    job_class: str = "be"


class Stage:
    """A declared stage: one function, its options, and its expanded nodes.

    Returned by :meth:`Sweep.stage`; pass it in ``inputs=`` of later stages.
    """

    def __init__(
        self,
        name: str,
        func: Callable[..., Any],
        code: str,
        options: StageOptions,
        inputs: Mapping[str, Stage],
        nodes: Sequence[Node],
    ) -> None:
        self.name = name
        self.func = func
        self.code = code
        self.options = options
        self.inputs = dict(inputs)
        self.nodes = tuple(nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    @property
    def keys(self) -> list[str]:
        return [n.key for n in self.nodes]

    def __repr__(self) -> str:
        return f"<Stage {self.name!r}: {len(self.nodes)} nodes>"


# -- running one stage on a worker --------------------------------------------------------------


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
class _Call:
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

    def __reduce__(self) -> tuple[Any, ...]:
        func: Any = self.func
        params: Any = self.params
        if self.by_value:
            func = _shipped(func)
            params = _ByValue(_cloudpickle_dumps(dict(params))) if params else params
        fields = (self.key, self.stage, func, params, self.labels, self.input_names)
        return (_Call, (*fields, self.code, self.cache, self.by_value))


class _ByValue:
    """A cloudpickle blob that unpickles as the object it holds."""

    __slots__ = ("blob",)

    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    def __reduce__(self) -> tuple[Any, ...]:
        return (pickle.loads, (self.blob,))


def _cloudpickle_dumps(obj: object) -> bytes:
    import cloudpickle

    return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _shipped(func: Callable[..., Any]) -> _ByValue:
    """One blob per function, so a graph's pickle holds it once (pickle memoizes by identity)."""
    try:
        return _shipped_cached(func)
    except TypeError:  # an unhashable callable object
        return _ByValue(_cloudpickle_dumps(func))


@functools.lru_cache(maxsize=256)
def _shipped_cached(func: Callable[..., Any]) -> _ByValue:
    return _ByValue(_cloudpickle_dumps(func))


def _registered_by_value(module: str) -> bool:
    import cloudpickle

    return any(
        module == m or module.startswith(m + ".")
        for m in cloudpickle.list_registry_pickle_by_value()
    )


def _module_by_reference(func: Any) -> str | None:
    """The module a process must import to unpickle ``func``; ``None`` if it travels by value
    (``__main__``, lambdas, local functions, modules registered with cloudpickle)."""
    while isinstance(func, functools.partial):
        func = func.func
    target: Any
    if inspect.ismethod(func):
        owner = func.__self__
        target = owner if inspect.isclass(owner) else type(owner)
    elif inspect.isfunction(func) or inspect.isclass(func) or inspect.isbuiltin(func):
        target = func
    else:
        target = type(func)  # a callable object: its class
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None)
    if not module or not qualname or module == "__main__" or _registered_by_value(module):
        return None
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return module if found is target else None


@dataclass(frozen=True)
class _Recipe:
    """A node and, recursively, its inputs: how a load task recomputes a bad entry."""

    call: _Call
    inputs: tuple[_Recipe, ...]


@dataclass(frozen=True)
class _Context:
    store: ResultStore | None
    run_id: str
    #: the store's claims (daskjobs.cache.claims), None when off or without a store
    claims: Claims | None = None


def _event(ctx: _Context, kind: str, call: _Call, detail: str = "") -> None:
    """Tell the client what this task did (kinds: ``computed``, ``loaded``, ``fenced``,
    ``recomputed``, ``recomputed-input``, ``store-error``); :class:`_RunLog` collects them."""
    msg = {"run": ctx.run_id, "kind": kind, "key": call.key, "stage": call.stage, "detail": detail}
    try:
        from distributed import get_worker

        get_worker().log_event(EVENT_TOPIC, msg)
    except (ImportError, ValueError):
        pass  # not on a distributed worker (e.g. dask's threaded scheduler)


_STORE_WARNED: dict[tuple[str, str], None] = {}  # (run, store) this process warned about
_STORE_WARNED_LOCK = threading.Lock()


def _store_failed(ctx: _Context, call: _Call, err: BaseException) -> None:
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


def _claim(call: _Call, ctx: _Context) -> tuple[bool, Any, Any]:
    """Take ``call``'s claim on the store (daskjobs.cache.claims) before computing it:
    ``(True, value, None)`` if another cluster computed it meanwhile, else
    ``(False, None, claim)`` with the claim to release (None: compute without one)."""
    if ctx.claims is None or ctx.store is None or not call.cache:
        return False, None, None
    store = ctx.store
    try:
        state, claim = ctx.claims.acquire(call.key, lambda: store.contains(call.key))
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


def _call(call: _Call, ctx: _Context, values: Sequence[Any]) -> Any:
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
        _event(ctx, "computed", call)
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
                        params={**call.labels, **call.params},
                        code_hash=call.code,
                        compute_seconds=seconds,
                    )
                    committed = True
                except Exception as err:  # a full disk must not lose the computed value
                    _store_failed(ctx, call, err)
        return value
    finally:
        if claim is not None:
            claim.release(committed)


def _compute_stage(call: _Call, ctx: _Context, *values: Any) -> Any:
    """The task of a computed node: call the function, commit the result, return it."""
    return _call(call, ctx, values)


def _load_stage(recipe: _Recipe, ctx: _Context) -> Any:
    """The task of a cache hit: load the entry, or recompute it if it is corrupt or gone."""
    assert ctx.store is not None
    return _resolve(recipe, ctx, {}, top=True)


def _resolve(recipe: _Recipe, ctx: _Context, memo: dict[str, Any], top: bool = False) -> Any:
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


# -- the sweep --------------------------------------------------------------------------------


class Sweep:
    """A set of stages over parameter grids; see the module docstring for a walk-through.

    ``team`` is the default ``team`` annotation of every stage.
    """

    def __init__(self, name: str = "sweep", *, team: str | None = None) -> None:
        self.name = name
        self.team = team
        self.stages: dict[str, Stage] = {}
        self.nodes: dict[str, Node] = {}

    def __repr__(self) -> str:
        parts = ", ".join(f"{s.name}×{len(s)}" for s in self.stages.values())
        return f"<Sweep {self.name!r}: {parts or 'empty'}>"

    def stage(
        self,
        func: Callable[..., Any],
        over: Grid | Mapping[str, Iterable[Any]] | Iterable[Mapping[str, Any]] | None = None,
        *,
        inputs: Mapping[str, Stage] | Stage | None = None,
        params: Mapping[str, Any] | None = None,
        name: str | None = None,
        estimate: float | str | Callable[[Mapping[str, Any]], float | str] | None = None,
        team: str | None = None,
        resources: Mapping[str, float] | None = None,
        retries: int | None = None,
        cache: bool = True,
        speculate: bool = True,
        version: str | None = None,
        track: Iterable[Callable[..., Any]] = (),
        job_class: str = "be",
    ) -> Stage:
        """Declare a stage: ``func`` called once per point of ``over`` and combination of inputs.

        ``func`` receives the point's parameters, ``params`` and one keyword argument per entry
        of ``inputs`` (a single :class:`Stage` is passed under its own name). ``estimate`` is in
        seconds, a number or a callable of the node's labels and parameters (a dict).
        ``version`` replaces hashing the code with an explicit version; ``track`` adds helpers
        from other modules to the code hash. ``cache=False`` never loads or stores this stage.
        ``speculate`` lets the scheduler plugin run a backup copy of a late task of this stage
        (default True: a stage is a pure function by contract, its result is cached by content
        key, so a second copy is harmless and the store keeps exactly one entry); pass False for
        a stage with side effects. ``job_class="te"`` marks the stage's tasks interactive:
        with the plugin's preemption on they take a worker resource back from best-effort
        tasks (docs/preemption.md); the default is ``"be"``.
        """
        if not callable(func):
            where = f"stage {name!r}" if name else f"sweep {self.name!r}"
            raise TypeError(f"{where}: {func!r} is not callable")
        if name is None:
            name = _default_stage_name(func)
        stage_name = validate_stage_name(name)
        if stage_name in self.stages:
            raise ValueError(
                f"sweep {self.name!r} already has a stage named {stage_name!r}; "
                "pass name=... to tell them apart"
            )
        if isinstance(inputs, Stage):
            inputs = {inputs.name: inputs}
        inputs = dict(inputs or {})
        for arg, upstream in inputs.items():
            if not isinstance(upstream, Stage) or self.stages.get(upstream.name) is not upstream:
                raise ValueError(
                    f"input {arg!r} of stage {stage_name!r} is not a stage of sweep {self.name!r}"
                )
        points = _as_grid(over)
        fixed = dict(params or {})
        swept = set(points.names)
        twice = (swept & set(fixed)) | (swept & set(inputs)) | (set(fixed) & set(inputs))
        if twice:
            raise ValueError(
                f"stage {stage_name!r}: {sorted(twice)[0]!r} is given twice "
                "(among over=, params= and inputs=)"
            )
        if retries is not None and (not isinstance(retries, int) or retries < 0):
            raise ValueError(f"stage {stage_name!r}: retries must be a whole number >= 0")
        if job_class not in ("te", "be"):
            raise ValueError(
                f"stage {stage_name!r}: job_class must be 'te' (interactive) or 'be' "
                f"(best-effort), got {job_class!r}"
            )
        options = StageOptions(
            estimate=estimate,
            team=team if team is not None else self.team,
            resources=dict(resources) if resources else None,
            retries=retries,
            cache=cache,
            speculate=speculate,
            version=version,
            job_class=job_class,
        )
        code = code_hash(func, version=version, track=track)
        fixed_tokens = {k: tokenize_param(stage_name, k, v) for k, v in fixed.items()}

        nodes: dict[str, Node] = {}
        for combo in _join_inputs(stage_name, inputs):
            up_labels: dict[str, Any] = {}
            up_tokens: dict[str, str] = {}
            for node in combo.values():
                up_labels.update(node.labels)
                up_tokens.update(node.label_tokens)
            for point in points:
                clash = set(point) & set(up_labels)
                if clash:
                    name_ = sorted(clash)[0]
                    raise ValueError(
                        f"parameter {name_!r} of stage {stage_name!r} has the same name as a "
                        "label of an upstream stage; rename one of them"
                    )
                point_tokens = {k: tokenize_param(stage_name, k, v) for k, v in point.items()}
                key = stage_key(
                    stage_name,
                    code,
                    {**fixed_tokens, **point_tokens},
                    {arg: n.key for arg, n in combo.items()},
                )
                if key in nodes:
                    continue
                labels = {**up_labels, **point}
                all_params = {**fixed, **point}
                nodes[key] = Node(
                    key=key,
                    stage=stage_name,
                    labels=labels,
                    params=all_params,
                    inputs={arg: n.key for arg, n in combo.items()},
                    label_tokens={**up_tokens, **point_tokens},
                    estimate=_estimate(stage_name, estimate, {**labels, **all_params}),
                )
        stage = Stage(stage_name, func, code, options, inputs, list(nodes.values()))
        self.stages[stage_name] = stage
        self.nodes.update(nodes)
        return stage

    @property
    def outputs(self) -> list[Stage]:
        """Stages that no other stage reads: what :meth:`run` returns by default."""
        read = {up.name for s in self.stages.values() for up in s.inputs.values()}
        return [s for name, s in self.stages.items() if name not in read]

    def to_dask(
        self,
        store: ResultStore | str | os.PathLike[str] | bool | None = None,
        outputs: Iterable[Stage] | None = None,
        *,
        run_id: str | None = None,
    ) -> SweepGraph:
        """The sweep as a Dask collection, with stored results replaced by loads.

        ``store``: a :class:`ResultStore` or URL; ``None`` or ``True`` for the default store;
        ``False`` to neither load nor store anything.
        """
        if store is False:
            result_store = None
        elif store is None or store is True:
            result_store = ResultStore()
        elif isinstance(store, ResultStore):
            result_store = store
        else:
            result_store = ResultStore(store)
        out_stages = list(outputs) if outputs is not None else self.outputs
        for s in out_stages:
            if self.stages.get(s.name) is not s:
                raise ValueError(f"{s!r} is not a stage of sweep {self.name!r}")
        out_nodes = [n for s in out_stages for n in s.nodes]
        claims = None
        if result_store is not None:
            from daskjobs.config import claim_settings

            cs = claim_settings()
            if cs.enabled:
                claims = Claims(result_store, cs.lease, cs.max_wait)
        ctx = _Context(result_store, run_id or uuid.uuid4().hex, claims)
        return _plan(self, out_nodes, ctx)

    def run(
        self,
        client: Client | None = None,
        *,
        store: ResultStore | str | os.PathLike[str] | bool | None = None,
        outputs: Iterable[Stage] | None = None,
        progress: bool = True,
        cluster_kwargs: Mapping[str, Any] | None = None,
    ) -> SweepResult:
        """Compute the sweep; see :func:`run`."""
        return run(
            self,
            client,
            store=store,
            outputs=outputs,
            progress=progress,
            cluster_kwargs=cluster_kwargs,
        )


def _default_stage_name(func: Callable[..., Any]) -> str:
    """The function's ``__name__`` as a stage name, or ``ValueError`` asking for ``name=``
    (a lambda, a ``functools.partial``, a callable object, a name a key cannot carry)."""
    fname = getattr(func, "__name__", None)
    if isinstance(fname, str):
        try:
            return validate_stage_name(fname)
        except ValueError:
            pass
    kind = type(func)
    if fname == "<lambda>":
        what, example = "a lambda", "sweep.stage(lambda x: x + 1, over=..., name='plus_one')"
    else:
        module = kind.__module__
        named = kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
        what = f"a {named} object" if fname is None else f"{fname!r}"
        example = "sweep.stage(func, over=..., name='score')"
    raise ValueError(
        f"this stage's function is {what}, which does not name a stage: pass name=..., "
        f"e.g. {example} (letters, digits and underscores; the name prefixes the Dask keys "
        "and labels the stage in results, logs and the plugin's status)"
    )


def _estimate(
    stage: str,
    estimate: float | str | Callable[[Mapping[str, Any]], float | str] | None,
    params: dict,
) -> float | None:
    """Seconds, read as the configuration reads durations (2.5, ``"10s"``, ``"2 minutes"``)."""
    from daskjobs.config import duration_seconds

    if estimate is None:
        return None
    value = estimate(params) if callable(estimate) else estimate
    try:
        return duration_seconds(f"estimate of stage {stage!r}", value)
    except ValueError:
        raise ValueError(
            f"estimate of stage {stage!r} must be a duration: seconds >= 0 (2.5) or a string "
            f"with a unit ('10s', '2 minutes'), got {value!r}"
        ) from None


def _join_inputs(stage: str, inputs: Mapping[str, Stage]) -> list[dict[str, Node]]:
    """Combine upstream nodes by a natural join on shared labels (a cross product otherwise)."""
    combos: list[tuple[dict[str, Node], dict[str, str]]] = [({}, {})]
    for arg, upstream in inputs.items():
        if not upstream.nodes:
            raise ValueError(f"input {arg!r} of stage {stage!r} has no nodes")
        index: dict[tuple[str, ...], dict[tuple[str, ...], list[Node]]] = {}
        names = frozenset(n for node in upstream.nodes for n in node.label_tokens)
        new: list[tuple[dict[str, Node], dict[str, str]]] = []
        for chosen, tokens in combos:
            for node in _matching(upstream, tokens, index, names):
                merged = dict(tokens)
                merged.update(node.label_tokens)
                new.append(({**chosen, arg: node}, merged))
        if not new:
            raise ValueError(
                f"stage {stage!r}: no node of input {arg!r} agrees with the other inputs on "
                "their shared labels, so the stage would have no nodes"
            )
        combos = new
    return [chosen for chosen, _ in combos]


def _matching(
    upstream: Stage,
    tokens: Mapping[str, str],
    index: dict[tuple[str, ...], dict[tuple[str, ...], list[Node]]],
    names: frozenset[str],
) -> list[Node]:
    shared = tuple(sorted(names & set(tokens)))
    if not shared:
        return list(upstream.nodes)
    if shared not in index:
        table: dict[tuple[str, ...], list[Node]] = {}
        for node in upstream.nodes:
            if all(n in node.label_tokens for n in shared):
                table.setdefault(tuple(node.label_tokens[n] for n in shared), []).append(node)
        index[shared] = table
    return index[shared].get(tuple(tokens[n] for n in shared), [])


# -- planning: cache hits become loads; the graph --------------------------------------------


def _annotations(stage: Stage, nodes: Sequence[Node], load: bool) -> dict[str, Any]:
    opts = stage.options
    ann: dict[str, Any] = {"stage": stage.name, "cache": opts.cache, "speculate": opts.speculate}
    if opts.team is not None:
        ann["team"] = opts.team
    if opts.resources:
        ann["resources"] = dict(opts.resources)
    if opts.retries is not None:
        ann["retries"] = opts.retries
    if opts.job_class != "be":
        ann["job_class"] = opts.job_class
    if load:
        ann["load"] = True
    else:
        params = {n.key: _model_params(n) for n in nodes}
        if any(params.values()):
            ann["params"] = _PerKey(params)
        estimates = {n.key: n.estimate for n in nodes if n.estimate is not None}
        values = set(estimates.values())
        if len(values) == 1 and len(estimates) == len(nodes):
            ann["estimate"] = values.pop()
        elif estimates:
            ann["estimate"] = _PerKey(estimates)
    return ann


#: Most parameters of a node passed to the scheduler's duration model, and longest text.
_MODEL_PARAMS = 32
_MODEL_TEXT = 64


def _model_params(node: Node) -> dict[str, Any]:
    """What the scheduler's duration model (daskjobs.policies.durations) learns from: the
    node's labels and parameters, numbers, strings, bools and None as they are, anything
    else as a short text; at most :data:`_MODEL_PARAMS` of them."""
    out: dict[str, Any] = {}
    for name, value in itertools.chain(node.labels.items(), node.params.items()):
        if len(out) >= _MODEL_PARAMS:
            break
        if value is None or isinstance(value, bool | int | str):
            v: Any = value if not isinstance(value, str) else value[:_MODEL_TEXT]
        elif isinstance(value, float):
            v = value if math.isfinite(value) else repr(value)
        else:
            v = repr(value)[:_MODEL_TEXT]
        out[str(name)] = v
    return out


@dataclass(frozen=True)
class _PerKey:
    """A per-key annotation value; dask calls it with each key of the layer."""

    values: Mapping[str, Any]

    def __call__(self, key: str) -> Any:
        return self.values.get(key)


def _plan(sweep: Sweep, out_nodes: Sequence[Node], ctx: _Context) -> SweepGraph:
    from dask._task_spec import Task, TaskRef
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    nodes = sweep.nodes
    store = ctx.store
    reachable: dict[str, None] = {}
    stack = [n.key for n in out_nodes]
    while stack:
        key = stack.pop()
        if key not in reachable:
            reachable[key] = None
            stack.extend(nodes[key].inputs.values())
    cacheable = [k for k in reachable if sweep.stages[nodes[k].stage].options.cache]
    stored: set[str] = set()
    if store is not None and cacheable:
        try:
            stored = store.contains_many(cacheable)
        except OSError as err:  # e.g. the store's path is a file: compute everything
            warnings.warn(
                f"cannot read the daskjobs store {store.url} ({err}); every stage is computed",
                RuntimeWarning,
                stacklevel=4,
            )

    import cloudpickle

    # Modules registered with cloudpickle travel by value (see _Call); one may hide in a
    # stage's function or in its parameters.
    registry = bool(cloudpickle.list_registry_pickle_by_value())
    ship_func = {
        name: registry and _module_by_reference(stage.func) is None
        for name, stage in sweep.stages.items()
    }
    calls: dict[str, _Call] = {}

    def call_of(node: Node) -> _Call:
        if node.key not in calls:
            stage = sweep.stages[node.stage]
            calls[node.key] = _Call(
                key=node.key,
                stage=node.stage,
                func=stage.func,
                params=dict(node.params),
                labels=dict(node.labels),
                input_names=tuple(node.inputs),
                code=stage.code,
                cache=stage.options.cache,
                by_value=ship_func[node.stage] or (registry and bool(node.params)),
            )
        return calls[node.key]

    recipes: dict[str, _Recipe] = {}

    def recipe_of(key: str) -> _Recipe:
        if key not in recipes:
            node = nodes[key]
            subs = tuple(recipe_of(k) for k in node.inputs.values())
            recipes[key] = _Recipe(call_of(node), subs)
        return recipes[key]

    computed: dict[str, None] = {}
    loaded: dict[str, None] = {}
    stack = [n.key for n in out_nodes]
    while stack:
        key = stack.pop()
        if key in computed or key in loaded:
            continue
        if key in stored:
            loaded[key] = None
        else:
            computed[key] = None
            stack.extend(nodes[key].inputs.values())

    layers: dict[str, Any] = {}
    deps: dict[str, set[str]] = {}
    layer_of: dict[str, str] = {}
    for stage in sweep.stages.values():  # declaration order is a topological order
        for kind, chosen in (("compute", computed), ("load", loaded)):
            stage_nodes = [n for n in stage.nodes if n.key in chosen]
            if not stage_nodes:
                continue
            name = f"{stage.name}-{kind}"
            tasks = {}
            for n in stage_nodes:
                if kind == "load":
                    tasks[n.key] = Task(n.key, _load_stage, recipe_of(n.key), ctx)
                else:
                    refs = [TaskRef(k) for k in n.inputs.values()]
                    tasks[n.key] = Task(n.key, _compute_stage, call_of(n), ctx, *refs)
                layer_of[n.key] = name
            load = kind == "load"
            layers[name] = MaterializedLayer(
                tasks, annotations=_annotations(stage, stage_nodes, load)
            )
            deps[name] = {layer_of[k] for n in stage_nodes if not load for k in n.inputs.values()}
    graph = HighLevelGraph(layers, deps)
    modules: dict[str, list[str]] = {}
    for stage in sweep.stages.values():
        module = _module_by_reference(stage.func)
        if module is not None and any(n.key in computed or n.key in loaded for n in stage.nodes):
            modules.setdefault(module, []).append(stage.name)
    by_stage: dict[str, dict[str, int]] = {}
    for kind, chosen in (("computed", computed), ("hits", loaded)):
        for key in chosen:
            entry = by_stage.setdefault(nodes[key].stage, {"computed": 0, "hits": 0})
            entry[kind] += 1
    return SweepGraph(
        graph=graph,
        output_nodes=tuple(out_nodes),
        computed=tuple(computed),
        loaded=tuple(loaded),
        pruned=len(reachable) - len(computed) - len(loaded),
        by_stage=by_stage,
        store=store,
        run_id=ctx.run_id,
        calls=tuple(calls.values()),
        modules=modules,
    )


class SweepGraph:
    """A planned sweep as a Dask collection; computing it gives the outputs' values in order.

    ``keys`` are the output keys; ``computed`` and ``loaded`` the keys planned to run and to be
    loaded from the store; ``pruned`` counts nodes left out because only loads needed them;
    ``modules`` maps each module the cluster must import (stage functions pickled by
    reference) to the stages that need it.
    """

    def __init__(
        self,
        *,
        graph: Any,
        output_nodes: tuple[Node, ...],
        computed: tuple[str, ...],
        loaded: tuple[str, ...],
        pruned: int,
        by_stage: Mapping[str, Mapping[str, int]],
        store: ResultStore | None,
        run_id: str,
        calls: tuple[_Call, ...] = (),
        modules: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.graph = graph
        self.output_nodes = output_nodes
        self.keys = [n.key for n in output_nodes]
        self.computed = computed
        self.loaded = loaded
        self.pruned = pruned
        self.by_stage = {k: dict(v) for k, v in by_stage.items()}
        self.store = store
        self.run_id = run_id
        self.modules = {m: list(stages) for m, stages in (modules or {}).items()}
        self._calls = calls

    def __repr__(self) -> str:
        return (
            f"<SweepGraph: {len(self.keys)} outputs, {len(self.computed)} to compute, "
            f"{len(self.loaded)} to load, {self.pruned} pruned>"
        )

    def __len__(self) -> int:
        return len(self.computed) + len(self.loaded)

    # The dask collection protocol.
    def __dask_graph__(self) -> Any:
        return self.graph

    def __dask_keys__(self) -> list[str]:
        return list(self.keys)

    def __dask_layers__(self) -> tuple[str, ...]:
        return tuple(self.graph.layers)

    def __dask_tokenize__(self) -> object:
        return ("SweepGraph", tuple(self.keys), tuple(sorted(self.loaded)))

    def __dask_postcompute__(self) -> tuple[Callable[..., Any], tuple[()]]:
        return list, ()

    def __dask_postpersist__(self) -> Any:
        raise NotImplementedError("persist a sweep with client.get(graph, graph.keys) instead")

    @staticmethod
    def __dask_optimize__(dsk: Any, keys: Any, **kwargs: Any) -> Any:
        return dsk  # already minimal: every node in it is needed

    @staticmethod
    def __dask_scheduler__(dsk: Any, keys: Any, **kwargs: Any) -> Any:
        import dask.threaded

        return dask.threaded.get(dsk, keys, **kwargs)


# -- running ------------------------------------------------------------------------------


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


async def _stop_heartbeats(dask_worker: Any, timeout: float = 5.0) -> int:
    """Stop this worker's heartbeats and wait (at most ``timeout`` s) until the one in flight,
    if any, has its answer; returns how many 10 ms waits that took."""
    import asyncio

    pc = dask_worker.periodic_callbacks.get("heartbeat")
    if pc is not None:
        pc.stop()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout

    def in_flight() -> bool:  # the heartbeat's pooled connection to the scheduler is in use
        return any(
            getattr(comm, "name", "") == "ConnectionPool.heartbeat_worker"
            for comms in dask_worker.rpc.occupied.values()
            for comm in comms
        )

    waits = 0
    while in_flight() and loop.time() < deadline:
        waits += 1
        await asyncio.sleep(0.01)
    return waits


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
        client.run(_stop_heartbeats)


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


@dataclass(frozen=True)
class _Failed:
    failure: StageFailure
    exception: BaseException | None
    cancelled: bool = False  # dask cancelled the output (not the stage's own error)


def _records(
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


def _warn_missing_resources(graph: SweepGraph, client: Client) -> None:
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


# -- a stage that cannot be pickled ------------------------------------------------------------

_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def _check_picklable(graph: SweepGraph) -> None:
    """Stop before submitting if a stage's function or one of its parameters cannot be
    pickled, naming the stage, what cannot be pickled and the fix: dask's own error names
    neither ("Could not serialize object of type HLGExpr").

    Pickles each stage function once with cloudpickle (as dask does: by reference when its
    module can be imported, else by value with what it refers to) and each distinct parameter
    value that is not a plain scalar once; the culprit is looked for only after a failure.
    """
    import cloudpickle

    seen: set[int] = set()
    for call in graph._calls:
        if id(call.func) not in seen:
            seen.add(id(call.func))
            try:
                cloudpickle.dumps(call.func)
            except Exception as err:
                raise TypeError(_unpicklable_function(call.stage, call.func, err)) from err
        for name, value in call.params.items():
            if isinstance(value, _PLAIN) or id(value) in seen:
                continue
            seen.add(id(value))
            try:
                cloudpickle.dumps(value)
            except Exception as err:
                raise TypeError(
                    f"stage {call.stage!r} cannot be sent to the workers: its parameter "
                    f"{name!r} ({_kind(value)}) cannot be pickled ({type(err).__name__}: "
                    f"{err}). Fix: pass plain data (numbers, strings, arrays, dataclasses of "
                    "those) and build the object inside the stage function."
                ) from err


def _kind(value: object) -> str:
    kind = type(value)
    module = kind.__module__
    named = kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
    return f"a {named}"


def _refers_to(func: Any) -> list[tuple[str, object]]:
    """What pickling ``func`` by value takes along: (how it is referred to, the value)."""
    parts: list[tuple[str, object]] = []
    while isinstance(func, functools.partial):
        parts += [(f"the partial's argument {i}", v) for i, v in enumerate(func.args)]
        parts += [(f"the partial's keyword {k!r}", v) for k, v in func.keywords.items()]
        func = func.func
    if inspect.ismethod(func):
        parts.append(("the object it is a method of", func.__self__))
        func = func.__func__
    if inspect.isfunction(func):
        try:
            found = inspect.getclosurevars(func)
        except (TypeError, ValueError):
            return parts
        parts += [(f"the variable {n!r} it closes over", v) for n, v in found.nonlocals.items()]
        parts += [(f"the global {n!r}", v) for n, v in found.globals.items()]
        parts += [("a default argument", v) for v in func.__defaults__ or ()]
        parts += [(f"the default of {k!r}", v) for k, v in (func.__kwdefaults__ or {}).items()]
    elif not inspect.isclass(func) and hasattr(func, "__dict__"):  # a callable object
        parts += [(f"its attribute {k!r}", v) for k, v in vars(func).items()]
    return parts


def _culprit(func: Any, depth: int = 0) -> str | None:
    """``"refers to the global 'lock' (a _thread.lock)"``: the first thing ``func`` takes along
    that cannot be pickled, following functions it refers to (three deep)."""
    import cloudpickle

    for how, value in _refers_to(func):
        if inspect.ismodule(value):
            continue
        try:
            cloudpickle.dumps(value)
        except Exception:
            said = f"{how} ({_kind(value)})"
            if depth < 3 and callable(value) and not inspect.isclass(value):
                inner = _culprit(value, depth + 1)
                if inner is not None:
                    return f"{said}, which refers to {inner}"
            return said
    return None


def _unpicklable_function(stage: str, func: Any, err: BaseException) -> str:
    culprit = _culprit(func)
    named = getattr(func, "__qualname__", None) or _kind(func)
    lead = f"stage {stage!r} cannot be sent to the workers: its function {named}"
    if culprit:
        lead += f" refers to {culprit}, which cannot be pickled ({type(err).__name__}: {err})"
    else:
        lead += f" cannot be pickled ({type(err).__name__}: {err})"
    if _module_by_reference(func) is None:
        lead += (
            "; it is pickled by value, with everything it refers to, because the workers "
            "cannot import it (defined in __main__, a notebook or inside another function)"
        )
    return (
        f"{lead}. Fix: create the object inside the function, or pass plain data with params= "
        "or over=; for a lock shared by tasks use distributed.Lock('name'); or define the "
        "function in a module the workers can import (then it is pickled by reference, "
        "without its globals)."
    )


# -- a graph the cluster cannot import ----------------------------------------------------------


class SweepInterrupted(RuntimeError):
    """Outputs of the sweep were cancelled before they finished: the scheduler was lost
    (killed, restarted, the client's connection dropped) or someone cancelled the
    futures. ``partial`` is the :class:`SweepResult` of what was gathered; every stage
    that finished was committed to the store, so running the sweep again loads it."""

    def __init__(self, message: str, partial: SweepResult) -> None:
        super().__init__(message)
        self.partial = partial


class ClusterImportError(ImportError):
    """Modules this sweep needs cannot be imported on the cluster's scheduler or workers.

    ``modules`` lists them; the message says where each failed and how to fix it.
    """

    def __init__(self, message: str, modules: Sequence[str]) -> None:
        super().__init__(message)
        self.modules = list(modules)


def _unimportable(modules: Sequence[str]) -> dict[str, str]:
    """Run on the scheduler and the workers: the modules that fail to import there, and why."""
    out = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as err:
            out[name] = f"{type(err).__name__}: {err}"
    return out


def _missing_on_cluster(client: Client, modules: Sequence[str]) -> dict[str, dict[str, str]]:
    """``{module: {"scheduler" or a worker's name: error}}`` for the modules that fail."""
    out: dict[str, dict[str, str]] = {}
    try:
        found = client.run_on_scheduler(_unimportable, list(modules))
    except Exception as err:  # the probe itself could not be read: daskjobs is missing there
        found = {"daskjobs": f"{type(err).__name__}: {err}"}
    for module, error in found.items():
        out.setdefault(module, {})["scheduler"] = error
    names = {
        addr: str(w.get("name", addr))
        for addr, w in client.scheduler_info(n_workers=-1).get("workers", {}).items()
    }
    per_worker = client.run(_unimportable, list(modules), on_error="return")
    for addr, result in sorted(per_worker.items(), key=lambda item: names.get(item[0], item[0])):
        if isinstance(result, BaseException):
            result = {"daskjobs": f"{type(result).__name__}: {result}"}
        for module, error in result.items():
            out.setdefault(module, {})[names.get(addr, addr)] = error
    return out


def _import_message(
    missing: Mapping[str, Mapping[str, str]], stages: Mapping[str, Sequence[str]], lead: str
) -> str:
    lines = [lead]
    for module, where in missing.items():
        workers = [w for w in where if w != "scheduler"]
        at = ["the scheduler"] if "scheduler" in where else []
        if workers:
            at.append(f"worker{'s' if len(workers) > 1 else ''} {', '.join(workers)}")
        used = stages.get(module)
        by = f" (stage{'s' if len(used) > 1 else ''} {', '.join(map(repr, used))})" if used else ""
        error = next(iter(where.values()))
        lines.append(f"  module {module!r}{by} cannot be imported on {' and '.join(at)}: {error}")
    example = next(iter(missing))
    lines.append(
        f"Fix: install {', '.join(missing)} where the scheduler and the workers run (the same "
        "environment as this client), or send it with the sweep, by value (stage functions "
        f"and parameters):\n    import cloudpickle, {example}\n"
        f"    cloudpickle.register_pickle_by_value({example})"
    )
    return "\n".join(lines)


def _check_importable(client: Client, graph: SweepGraph) -> None:
    """Stop before submitting if the cluster cannot import a stage function's module: in dask
    2026.8 a scheduler that cannot read a graph leaves it pending for ever under a progress
    bar, and a worker that cannot unpickle a task dies of it."""
    if not graph.modules:
        return
    missing = _missing_on_cluster(client, sorted(graph.modules))
    if missing:
        lead = "this sweep cannot run on this cluster; nothing was submitted:"
        raise ClusterImportError(_import_message(missing, graph.modules, lead), list(missing))


def _await_accepted(client: Client, futures: Sequence[Any]) -> BaseException | None:
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
        return exc if _rejected(exc) else None
    return None


#: Seconds the scheduler's report of an erred output may take to reach this client.
_REPORT_PATIENCE = 30.0


def _rejected(exc: BaseException | None) -> bool:
    if isinstance(exc, SubmissionRefused):
        return True
    return isinstance(exc, RuntimeError) and "deserialization of the task graph" in str(exc)


def _raise_rejected(client: Client, graph: SweepGraph, rejection: BaseException) -> None:
    """The scheduler refused the graph (raise the refusal, naming the sweep run), or could
    not read it: name the modules behind it (its error does not)."""
    if isinstance(rejection, SubmissionRefused):
        lead = f"the scheduler refused sweep run {graph.run_id}; nothing of it ran: "
        try:
            refused = type(rejection)(lead + str(rejection))
        except Exception:  # a refusal type that takes other arguments
            refused = SubmissionRefused(lead + str(rejection))
        raise refused from None
    candidates = _referenced_modules(graph._calls)
    missing = _missing_on_cluster(client, sorted(candidates)) if candidates else {}
    lead = "the scheduler could not read this sweep's graph; nothing ran:"
    if not missing:
        raise ClusterImportError(
            f"{lead}\n  {rejection}\nThe scheduler's log names the module it could not "
            "import: install it there (the same environment as this client).",
            [],
        ) from rejection
    message = _import_message(missing, graph.modules, lead)
    raise ClusterImportError(message, list(missing)) from rejection


class _Recorder(pickle.Unpickler):
    """Unpickles, noting every module the stream imports from."""

    def __init__(self, data: bytes, found: set[str]) -> None:
        super().__init__(io.BytesIO(data))
        self.found = found

    def find_class(self, module: str, name: str) -> Any:
        self.found.add(module)
        return super().find_class(module, name)


def _referenced_modules(calls: Iterable[_Call]) -> set[str]:
    """Every module a process must import to unpickle these stage functions and parameters
    as dask pickles them (plain pickle first)."""
    found: set[str] = set()
    seen: set[int] = set()
    for call in calls:
        for obj in (call.func, call.params):
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            try:
                _Recorder(pickle.dumps(obj, protocol=5), found).load()
            except Exception:  # pickled by value (cloudpickle), or not at all: nothing to name
                continue
    return found
