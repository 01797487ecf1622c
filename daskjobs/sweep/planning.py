"""Planning a sweep: which nodes are computed, which loaded, and the graph of their tasks.

:func:`_plan` consults the store once (one listing), turns every stored cacheable node into
a load task with no dependencies, leaves out upstream nodes that only loads needed, decides
for each stage whether its function and parameters travel by value
(:mod:`daskjobs.sweep.shipping`), and builds the :class:`~daskjobs.sweep.graph.SweepGraph`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from daskjobs.sweep.graph import SweepGraph, _annotations
from daskjobs.sweep.shipping import _module_by_reference
from daskjobs.sweep.worker import _Call, _compute_stage, _Context, _load_stage, _Recipe

if TYPE_CHECKING:
    from daskjobs.sweep.stages import Node, Sweep


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
