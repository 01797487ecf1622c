"""Declaring a sweep: :class:`Sweep`, its stages and their nodes.

:meth:`Sweep.stage` expands a stage into :class:`Node` objects (one function call each) as it
is declared: the upstream nodes combined by a natural join on their labels
(:func:`_join_inputs`), crossed with the stage's own grid, each keyed by its content key
(:mod:`daskjobs.cache.keys`). :meth:`Sweep.to_dask` plans it (:mod:`daskjobs.sweep.planning`)
and :meth:`Sweep.run` runs it (:mod:`daskjobs.sweep.running`).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from daskjobs._text import shown
from daskjobs.cache.claims import Claims
from daskjobs.cache.keys import code_hash, stage_key, tokenize_param, validate_stage_name
from daskjobs.cache.store import ResultStore
from daskjobs.sweep.graph import SweepGraph
from daskjobs.sweep.grids import Grid, as_grid
from daskjobs.sweep.planning import plan
from daskjobs.sweep.running import SweepResult, run
from daskjobs.sweep.worker import Context

if TYPE_CHECKING:
    from distributed import Client

#: The most retries a stage may ask for: beyond it a failing stage would retry for hours.
MAX_RETRIES = 100


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
    #: parameters left out of the content key (``ignore=``)
    ignore: tuple[str, ...] = ()
    #: the ignored parameters are left out of the labels and the entry's parameters too
    ignore_labels: bool = False
    #: seconds after which a stored result is not loaded but recomputed (``max_age=``)
    max_age: float | None = None
    #: every run recomputes this stage (and what reads it), overwriting its entries
    refresh: bool = False


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


class Sweep:
    """A set of stages over parameter grids; see :mod:`daskjobs.sweep` for a walk-through.

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
        ignore: Iterable[str] = (),
        ignore_labels: bool = False,
        max_age: float | str | timedelta | None = None,
        refresh: bool = False,
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
        tasks (docs/explanation/preemption.md); the default is ``"be"``.

        Cache controls (docs/explanation/cache.md): ``ignore`` names parameters left out of the
        content key (a ``verbose`` flag, a log path): they are still passed, recorded in the stored
        entry and, if swept, kept as labels, unless ``ignore_labels=True`` leaves them out
        of the labels and of the entry too. ``max_age`` (a duration: ``"7d"``, ``3600``) is
        how old a stored result may be and still be loaded; an older one is recomputed and
        overwritten, and ``daskjobs cache gc`` removes it. ``refresh=True`` recomputes the
        stage on every run (and what reads it), overwriting its entries; :meth:`run`'s
        ``refresh=`` does that for one run.
        """
        stage_name = self._stage_name(func, name)
        inputs = self._stage_inputs(stage_name, inputs)
        points = as_grid(over)
        fixed = dict(params or {})
        swept = set(points.names)
        twice = (swept & set(fixed)) | (swept & set(inputs)) | (set(fixed) & set(inputs))
        if twice:
            raise ValueError(
                f"stage {stage_name!r}: {sorted(twice)[0]!r} is given twice "
                "(among over=, params= and inputs=)"
            )
        if retries is not None and (
            not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES
        ):
            raise ValueError(
                f"stage {stage_name!r}: retries must be a whole number from 0 to "
                f"{MAX_RETRIES}, got {shown(retries)} (a stage that fails more often than "
                "that needs a fix, not more tries: its run would not end)"
            )
        if job_class not in ("te", "be"):
            raise ValueError(
                f"stage {stage_name!r}: job_class must be 'te' (interactive) or 'be' "
                f"(best-effort), got {job_class!r}"
            )
        ignored = _check_ignore(stage_name, func, ignore, set(fixed) | swept, inputs)
        hidden = frozenset(ignored) if ignore_labels else frozenset()
        expiry = _check_max_age(stage_name, max_age)
        for flag, value in (("ignore_labels", ignore_labels), ("refresh", refresh)):
            if not isinstance(value, bool):
                raise TypeError(
                    f"stage {stage_name!r}: {flag} must be True or False, got {value!r}"
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
            ignore=ignored,
            ignore_labels=ignore_labels,
            max_age=expiry,
            refresh=refresh,
        )
        code = code_hash(func, version=version, track=track)
        # an ignored parameter is never tokenized for the key: it may have no token at all
        fixed_tokens = {
            k: tokenize_param(stage_name, k, v) for k, v in fixed.items() if k not in ignored
        }
        nodes = _expand(
            stage_name, code, inputs, points, fixed, fixed_tokens, ignored, hidden, estimate
        )
        stage = Stage(stage_name, func, code, options, inputs, list(nodes.values()))
        self.stages[stage_name] = stage
        self.nodes.update(nodes)
        return stage

    def _stage_name(self, func: Callable[..., Any], name: str | None) -> str:
        """The name of a stage of ``func`` (``name``, else the function's), checked and not
        taken yet in this sweep; ``func`` checked callable first, to name it in the error."""
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
        return stage_name

    def _stage_inputs(
        self, stage_name: str, inputs: Mapping[str, Stage] | Stage | None
    ) -> dict[str, Stage]:
        """A stage's ``inputs`` as {argument: upstream stage}, each a stage of this sweep
        (a single :class:`Stage` is passed under its own name)."""
        if isinstance(inputs, Stage):
            inputs = {inputs.name: inputs}
        inputs = dict(inputs or {})
        for arg, upstream in inputs.items():
            if not isinstance(upstream, Stage) or self.stages.get(upstream.name) is not upstream:
                raise ValueError(
                    f"input {arg!r} of stage {stage_name!r} is not a stage of sweep {self.name!r}"
                )
        return inputs

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
        refresh: bool | str | Stage | Iterable[str | Stage] | None = None,
    ) -> SweepGraph:
        """The sweep as a Dask collection, with stored results replaced by loads.

        ``store``: a :class:`ResultStore` or URL; ``None`` or ``True`` for the default store;
        ``False`` to neither load nor store anything. ``refresh``: ``True`` for every stage,
        or stage names (or :class:`Stage` objects) whose stored results are recomputed and
        overwritten, with every stage that reads them (see docs/explanation/cache.md).
        """
        refreshed = _refresh_stages(self, refresh)
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
        ctx = Context(result_store, run_id or uuid.uuid4().hex, claims)
        return plan(self, out_nodes, ctx, refreshed)

    def run(
        self,
        client: Client | None = None,
        *,
        store: ResultStore | str | os.PathLike[str] | bool | None = None,
        outputs: Iterable[Stage] | None = None,
        progress: bool = True,
        cluster_kwargs: Mapping[str, Any] | None = None,
        refresh: bool | str | Stage | Iterable[str | Stage] | None = None,
    ) -> SweepResult:
        """Compute the sweep; see :func:`run`."""
        return run(
            self,
            client,
            store=store,
            outputs=outputs,
            progress=progress,
            cluster_kwargs=cluster_kwargs,
            refresh=refresh,
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


def _meant(given: str, choices: list[str]) -> str | None:
    """The near miss among ``choices`` that ``given`` was probably meant to be."""
    from daskjobs.config import _meant as meant

    return meant(given, choices)


def _check_ignore(
    stage: str,
    func: Callable[..., Any],
    ignore: Iterable[str],
    given: set[str],
    inputs: Mapping[str, Stage],
) -> tuple[str, ...]:
    """The names of ``ignore=``, each one a parameter the stage is given or its function
    takes; ``ValueError`` (``TypeError`` for a wrong type) naming the problem otherwise."""
    if isinstance(ignore, (str, bytes)) or not isinstance(ignore, Iterable):
        raise TypeError(
            f"stage {stage!r}: ignore= takes parameter names, e.g. ignore=('verbose',); "
            f"got {ignore!r}"
        )
    names = tuple(dict.fromkeys(ignore))
    try:
        signature: inspect.Signature | None = inspect.signature(func)
    except (TypeError, ValueError):  # a builtin, say: only the given parameters are known
        signature = None
    takes: list[str] = []
    anything = signature is None
    for p in signature.parameters.values() if signature is not None else ():
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            takes.append(p.name)
        elif p.kind is p.VAR_KEYWORD:
            anything = True
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"stage {stage!r}: ignore= takes parameter names, got {name!r}")
        if name in inputs:
            raise ValueError(
                f"stage {stage!r}: {name!r} is an input, which enters the key by its own "
                "content key; ignore= names parameters (of over= or params=)"
            )
        if name in given or (name in takes and name not in inputs):
            continue
        choices = sorted(given | set(takes) - set(inputs))
        meant = _meant(name, choices)
        guess = f"; did you mean {meant!r}?" if meant is not None else ""
        if anything:
            raise ValueError(
                f"stage {stage!r}: ignore= names {name!r}, which is not a parameter of the "
                f"stage (over= and params= give {', '.join(sorted(given)) or 'none'}){guess}"
            )
        fname = getattr(func, "__name__", "the stage's function")
        raise ValueError(
            f"stage {stage!r}: ignore= names {name!r}, which {fname}() does not take "
            f"(it takes {', '.join(takes) or 'no keyword arguments'}){guess}"
        )
    return names


def _check_max_age(stage: str, value: float | str | timedelta | None) -> float | None:
    """``max_age=`` in seconds (> 0), read as the configuration reads durations."""
    from daskjobs.config import duration_seconds

    if value is None:
        return None
    seconds = None
    if not isinstance(value, bool):
        with contextlib.suppress(ValueError):
            seconds = duration_seconds(f"max_age of stage {stage!r}", value)
    if seconds is None or seconds <= 0:
        raise ValueError(
            f"max_age of stage {stage!r} must be a duration above 0: seconds (3600) or a "
            f"string with a unit ('7d', '12h'), got {value!r}"
        )
    return seconds


def _check_shared_key(
    stage: str, node: Node, shown: Mapping[str, Any], label_tokens: Mapping[str, str]
) -> None:
    """Two points of a stage share a key only when they differ in ignored parameters: with
    those kept as labels, one result would stand under two labels. Say which."""
    if dict(node.label_tokens) == dict(label_tokens):
        return
    name = next(k for k in shown if node.label_tokens.get(k) != label_tokens.get(k))
    raise ValueError(
        f"stage {stage!r}: the points {name}={node.labels[name]!r} and {name}={shown[name]!r} "
        f"differ only in the ignored parameter {name!r}, so they share one key and one "
        "result; pass ignore_labels=True to leave it out of the labels too (one result "
        "stands for both), or stop ignoring it"
    )


def _refresh_stages(
    sweep: Sweep, refresh: bool | str | Stage | Iterable[str | Stage] | None
) -> frozenset[str]:
    """The names of the stages a run recomputes: ``refresh=`` and the stages declared with
    ``refresh=True``. An unknown stage is a ``ValueError``, before anything is planned."""
    declared = {name for name, s in sweep.stages.items() if s.options.refresh}
    if refresh is None or refresh is False:
        return frozenset(declared)
    if refresh is True:
        return frozenset(sweep.stages)
    wrong = TypeError(
        "refresh= takes True, a stage name, a Stage or a list of them (the stages whose "
        f"stored results this run recomputes); got {refresh!r}"
    )
    if isinstance(refresh, (str, Stage)):
        items: list[Any] = [refresh]
    elif isinstance(refresh, Iterable):
        items = list(refresh)
    else:
        raise wrong
    for item in items:
        if isinstance(item, Stage):
            if sweep.stages.get(item.name) is not item:
                raise ValueError(
                    f"refresh names {item!r}, which is not a stage of sweep {sweep.name!r}"
                )
            declared.add(item.name)
        elif isinstance(item, str):
            if item not in sweep.stages:
                meant = _meant(item, list(sweep.stages))
                guess = f"; did you mean {meant!r}?" if meant is not None else ""
                raise ValueError(
                    f"refresh names stage {item!r}, which sweep {sweep.name!r} does not have "
                    f"(its stages: {', '.join(sweep.stages) or 'none'}){guess}"
                )
            declared.add(item)
        else:
            raise wrong
    return frozenset(declared)


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


def _expand(
    stage_name: str,
    code: str,
    inputs: Mapping[str, Stage],
    points: Grid,
    fixed: Mapping[str, Any],
    fixed_tokens: Mapping[str, str],
    ignored: tuple[str, ...],
    hidden: frozenset[str],
    estimate: float | str | Callable[[Mapping[str, Any]], float | str] | None,
) -> dict[str, Node]:
    """A stage's nodes by content key: the upstream nodes joined on their labels
    (:func:`_join_inputs`), crossed with the stage's own grid ``points``; ``fixed`` are its
    ``params=`` (``fixed_tokens`` their tokens, the ``ignored`` left out), ``hidden`` the
    parameters left out of the labels. Points that share a key are one node
    (:func:`_check_shared_key`)."""
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
            shown = {k: v for k, v in point.items() if k not in hidden}
            point_tokens = {k: tokenize_param(stage_name, k, v) for k, v in shown.items()}
            key = stage_key(
                stage_name,
                code,
                {
                    **fixed_tokens,
                    **{k: t for k, t in point_tokens.items() if k not in ignored},
                },
                {arg: n.key for arg, n in combo.items()},
            )
            label_tokens = {**up_tokens, **point_tokens}
            if key in nodes:
                _check_shared_key(stage_name, nodes[key], shown, label_tokens)
                continue
            labels = {**up_labels, **shown}
            all_params = {**fixed, **point}
            nodes[key] = Node(
                key=key,
                stage=stage_name,
                labels=labels,
                params=all_params,
                inputs={arg: n.key for arg, n in combo.items()},
                label_tokens=label_tokens,
                estimate=_estimate(stage_name, estimate, {**labels, **all_params}),
            )
    return nodes


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
