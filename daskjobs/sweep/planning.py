"""Planning a sweep: which nodes are computed, which loaded, and the graph of their tasks.

:func:`plan` consults the store once (one listing), turns every stored cacheable node into
a load task with no dependencies, leaves out upstream nodes that only loads needed, decides
for each stage whether its function and parameters travel by value
(:mod:`daskjobs.sweep.shipping`), and builds the :class:`~daskjobs.sweep.graph.SweepGraph`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from daskjobs.sweep.graph import SweepGraph, stage_annotations
from daskjobs.sweep.shipping import module_by_reference
from daskjobs.sweep.worker import Call, Context, Recipe, compute_stage, load_stage

if TYPE_CHECKING:
    from daskjobs.cache.store import ResultStore
    from daskjobs.sweep.stages import Node, Sweep


def plan(
    sweep: Sweep,
    out_nodes: Sequence[Node],
    ctx: Context,
    refresh: frozenset[str] = frozenset(),
) -> SweepGraph:
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

    replace = _forced(sweep, reachable, stored, store, refresh)
    stored.difference_update(replace)

    import cloudpickle

    # Modules registered with cloudpickle travel by value (see Call); one may hide in a
    # stage's function or in its parameters.
    registry = bool(cloudpickle.list_registry_pickle_by_value())
    ship_func = {
        name: registry and module_by_reference(stage.func) is None
        for name, stage in sweep.stages.items()
    }
    calls: dict[str, Call] = {}

    def call_of(node: Node) -> Call:
        if node.key not in calls:
            stage = sweep.stages[node.stage]
            calls[node.key] = Call(
                key=node.key,
                stage=node.stage,
                func=stage.func,
                params=dict(node.params),
                labels=dict(node.labels),
                input_names=tuple(node.inputs),
                code=stage.code,
                cache=stage.options.cache,
                by_value=ship_func[node.stage] or (registry and bool(node.params)),
                ignored=stage.options.ignore,
                hide_ignored=stage.options.ignore_labels,
                max_age=stage.options.max_age,
                replace=replace.get(node.key, ""),
            )
        return calls[node.key]

    recipes: dict[str, Recipe] = {}

    def recipe_of(key: str) -> Recipe:
        if key not in recipes:
            node = nodes[key]
            subs = tuple(recipe_of(k) for k in node.inputs.values())
            recipes[key] = Recipe(call_of(node), subs)
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
    run_label = f"{sweep.name}:{ctx.run_id[:8]}"  # the sweep's name and its run
    for stage in sweep.stages.values():  # declaration order is a topological order
        for kind, chosen in (("compute", computed), ("load", loaded)):
            stage_nodes = [n for n in stage.nodes if n.key in chosen]
            if not stage_nodes:
                continue
            name = f"{stage.name}-{kind}"
            tasks = {}
            for n in stage_nodes:
                if kind == "load":
                    tasks[n.key] = Task(n.key, load_stage, recipe_of(n.key), ctx)
                else:
                    refs = [TaskRef(k) for k in n.inputs.values()]
                    tasks[n.key] = Task(n.key, compute_stage, call_of(n), ctx, *refs)
                layer_of[n.key] = name
            load = kind == "load"
            layers[name] = MaterializedLayer(
                tasks, annotations=stage_annotations(stage, stage_nodes, load, run_label)
            )
            deps[name] = {layer_of[k] for n in stage_nodes if not load for k in n.inputs.values()}
    graph = HighLevelGraph(layers, deps)
    modules: dict[str, list[str]] = {}
    for stage in sweep.stages.values():
        module = module_by_reference(stage.func)
        if module is not None and any(n.key in computed or n.key in loaded for n in stage.nodes):
            modules.setdefault(module, []).append(stage.name)
    # the stages in declaration order (a summary lists them the same way every run)
    by_stage: dict[str, dict[str, int]] = {
        name: {"computed": 0, "hits": 0}
        for name, stage in sweep.stages.items()
        if any(n.key in computed or n.key in loaded for n in stage.nodes)
    }
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
        replace=replace,
        label=run_label,
    )


def _forced(
    sweep: Sweep,
    reachable: Mapping[str, None],
    stored: set[str],
    store: ResultStore | None,
    refresh: frozenset[str],
) -> dict[str, str]:
    """The stored nodes this run recomputes and overwrites, each with its reason:
    ``"refresh"`` (its stage is refreshed), ``"expired"`` (its entry is older than its
    stage's ``max_age``) or ``"input"`` (it reads a node recomputed for one of these
    reasons, whose new value its entry would otherwise hide: its key did not change).

    One manifest read per stored node of a stage with ``max_age``; none otherwise."""
    nodes = sweep.nodes
    aged = [k for k in reachable if k in stored and sweep.stages[nodes[k].stage].options.max_age]
    if not refresh and not aged:
        return {}
    expired: set[str] = set()
    if aged and store is not None:
        now = time.time()
        for key, info in store.infos(aged).items():
            max_age = sweep.stages[nodes[key].stage].options.max_age
            if max_age is not None and now - info.created > max_age:
                expired.add(key)
    forced: set[str] = set()
    out: dict[str, str] = {}
    for stage in sweep.stages.values():  # declaration order is a topological order
        for node in stage.nodes:
            if node.key not in reachable:
                continue
            if stage.name in refresh:
                why = "refresh"
            elif node.key in expired:
                why = "expired"
            elif any(k in forced for k in node.inputs.values()):
                why = "input"
            else:
                continue
            forced.add(node.key)
            if node.key in stored:
                out[node.key] = why
    return out
