"""The Dask collection a sweep becomes, and the annotations its layers carry.

:class:`SweepGraph` is an ordinary Dask collection over a ``HighLevelGraph`` with one layer
per stage and kind (compute or load). :func:`stage_annotations` writes each layer's annotations:
``stage``, ``estimate``, ``params`` (what the scheduler's duration model learns from,
:func:`_model_params`), ``team``, ``resources``, ``retries``, ``speculate``, ``cache``,
``job_class`` and ``load``; values that differ by key are :class:`_PerKey` callables.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from daskjobs.cache.store import ResultStore
from daskjobs.sweep.worker import Call

if TYPE_CHECKING:
    from daskjobs.sweep.stages import Node, Stage


def stage_annotations(
    stage: Stage, nodes: Sequence[Node], load: bool, sweep: str | None = None
) -> dict[str, Any]:
    opts = stage.options
    ann: dict[str, Any] = {"stage": stage.name, "cache": opts.cache, "speculate": opts.speculate}
    if sweep is not None:  # which run a task is of: daskjobs.forecast groups by it
        ann["sweep"] = sweep
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
    else as a short text; at most :data:`_MODEL_PARAMS` of them. Each is a value dask can
    send to a worker with the task (an integer within 64 bits, text that is UTF-8)."""
    out: dict[str, Any] = {}
    for name, value in itertools.chain(node.labels.items(), node.params.items()):
        if len(out) >= _MODEL_PARAMS:
            break
        if value is None or isinstance(value, bool):
            v: Any = value
        elif isinstance(value, int):
            v = value if -(2**63) <= value < 2**63 else repr(value)[:_MODEL_TEXT]
        elif isinstance(value, str):
            v = value[:_MODEL_TEXT].encode("utf-8", "backslashreplace").decode("utf-8")
        elif isinstance(value, float):
            v = value if math.isfinite(value) else repr(value)
        else:
            v = repr(value)[:_MODEL_TEXT]
        out[str(name).encode("utf-8", "backslashreplace").decode("utf-8")] = v
    return out


@dataclass(frozen=True)
class _PerKey:
    """A per-key annotation value; dask calls it with each key of the layer."""

    values: Mapping[str, Any]

    def __call__(self, key: str) -> Any:
        return self.values.get(key)


class SweepGraph:
    """A planned sweep as a Dask collection; computing it gives the outputs' values in order.

    ``keys`` are the output keys; ``computed`` and ``loaded`` the keys planned to run and to be
    loaded from the store; ``replace`` maps the stored keys this run recomputes and
    overwrites to why (``"refresh"``, ``"expired"``, or ``"input"``: it reads one of those);
    ``pruned`` counts nodes left out because only loads needed them;
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
        calls: tuple[Call, ...] = (),
        modules: Mapping[str, Sequence[str]] | None = None,
        replace: Mapping[str, str] | None = None,
        label: str | None = None,
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
        self.replace = dict(replace or {})
        #: the ``sweep`` annotation of every task of this run (``name:run``)
        self.label = label
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
