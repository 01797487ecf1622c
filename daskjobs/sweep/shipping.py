"""Shipping stage functions to the cluster, and checking that they can get there.

How a stage's function and parameters travel in a task: by reference (the cluster imports
their module) or, for modules registered with ``cloudpickle.register_pickle_by_value``, as
cloudpickle blobs (:class:`ByValue`; dask pickles a graph with plain :mod:`pickle`, which
ignores that registry). Before anything is submitted, :func:`check_picklable` names a stage
whose function or parameter cannot be pickled, and :func:`check_importable` asks the
scheduler and every worker to import the stage functions' modules, raising
:class:`ClusterImportError` with the fix when one cannot.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import io
import pickle
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed import Client

    from daskjobs.sweep.graph import SweepGraph
    from daskjobs.sweep.worker import Call


class ByValue:
    """A cloudpickle blob that unpickles as the object it holds."""

    __slots__ = ("blob",)

    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    def __reduce__(self) -> tuple[Any, ...]:
        return (pickle.loads, (self.blob,))


def cloudpickle_dumps(obj: object) -> bytes:
    import cloudpickle

    return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def shipped(func: Callable[..., Any]) -> ByValue:
    """One blob per function, so a graph's pickle holds it once (pickle memoizes by identity)."""
    try:
        return _shipped_cached(func)
    except TypeError:  # an unhashable callable object
        return ByValue(cloudpickle_dumps(func))


@functools.lru_cache(maxsize=256)
def _shipped_cached(func: Callable[..., Any]) -> ByValue:
    return ByValue(cloudpickle_dumps(func))


def _registered_by_value(module: str) -> bool:
    import cloudpickle

    return any(
        module == m or module.startswith(m + ".")
        for m in cloudpickle.list_registry_pickle_by_value()
    )


def module_by_reference(func: Any) -> str | None:
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


# -- a stage that cannot be pickled ------------------------------------------------------------

_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def check_picklable(graph: SweepGraph) -> None:
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
    if module_by_reference(func) is None:
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


def missing_on_cluster(client: Client, modules: Sequence[str]) -> dict[str, dict[str, str]]:
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


def import_message(
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


def check_importable(client: Client, graph: SweepGraph) -> None:
    """Stop before submitting if the cluster cannot import a stage function's module: in dask
    2026.8 a scheduler that cannot read a graph leaves it pending for ever under a progress
    bar, and a worker that cannot unpickle a task dies of it."""
    if not graph.modules:
        return
    missing = missing_on_cluster(client, sorted(graph.modules))
    if missing:
        lead = "this sweep cannot run on this cluster; nothing was submitted:"
        raise ClusterImportError(import_message(missing, graph.modules, lead), list(missing))


class _Recorder(pickle.Unpickler):
    """Unpickles, noting every module the stream imports from."""

    def __init__(self, data: bytes, found: set[str]) -> None:
        super().__init__(io.BytesIO(data))
        self.found = found

    def find_class(self, module: str, name: str) -> Any:
        self.found.add(module)
        return super().find_class(module, name)


def referenced_modules(calls: Iterable[Call]) -> set[str]:
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
