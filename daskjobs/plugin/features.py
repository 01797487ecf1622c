"""What a plain dask task says about its own duration: its function and literal arguments.

Most tasks on a shared cluster come from ``client.map``, ``client.submit``, ``dask.delayed``
or a dask collection, not from a :class:`~daskjobs.Sweep`: they carry no ``stage`` and no
``params`` annotation. dask's scheduler holds each task's call all the same (its run spec: the
function and the arguments the client wrote, with a reference in place of each input that
is another task's output). This module reads that call, within a fixed budget, into what the
duration model of :mod:`daskjobs.policies.durations` learns from:

* the task's **stage**: the function's identity, ``module.qualified_name``
  (``"__main__.backtest"``, ``"mylib.fit.Model.score"``; a lambda also its first line), so
  that the same function under another key name (``client.submit(f, x, key="run-7")``)
  shares what was learned; None for a function of dask's own, of the libraries dask
  collections call (dask, distributed, numpy, pandas, the standard library's ``operator``
  and ``functools``, toolz) or of daskjobs (a job's attempt, a sweep's stage, which name their
  stage otherwise): those tasks keep their key prefix as their stage, as before;
* the task's **parameters**, named by the function's parameter names (``arg2`` past them
  or where the function has none to read): a number or a boolean by value, a string of at
  most :data:`MAX_TEXT` characters and an ``Enum`` member as a category, the length of a
  list, tuple, set, dict, range or bytes (``len(xs)``), and the number of elements of
  anything with an integer ``shape`` (a numpy array, a pandas frame: ``size(x)``). At most
  :data:`MAX_FEATURES` of them, from the first :data:`MAX_ARGS` arguments; never a
  container's items, never an input's data (a reference to another task is skipped), so
  the cost per task is bounded whatever it was called with.
* which parameters are **size-like**: an integer > 0, a length or a size whose name is not
  one a seed or an index goes by (:data:`NOT_SIZES`). The model assumes, until its
  measurements say otherwise, that a task's cost grows in proportion to them
  (:class:`~daskjobs.policies.durations.StageModel`'s ``grows``).

Pure Python: nothing here imports ``distributed``; the surgery module hands over the call
(:func:`daskjobs.plugin.surgery._internals.task_call`).
"""

from __future__ import annotations

import enum
import functools
import math
import types
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAX_ARGS",
    "MAX_FEATURES",
    "MAX_TEXT",
    "NOT_SIZES",
    "OWN_MODULES",
    "Call",
    "read",
    "read_call",
]

#: Most parameters read from one task.
MAX_FEATURES = 16
#: Most arguments looked at (positional and keyword together).
MAX_ARGS = 32
#: Longest string taken as a category (a longer one is data, not a setting).
MAX_TEXT = 64
#: Top-level modules whose functions are dask's own or what dask collections call: their
#: tasks keep their key prefix as their stage and carry no parameters.
OWN_MODULES = frozenset(
    {
        "dask",
        "distributed",
        "daskjobs",
        "numpy",
        "pandas",
        "pyarrow",
        "builtins",
        "operator",
        "_operator",
        "functools",
        "_functools",
        "itertools",
        "toolz",
        "tlz",
        "cytoolz",
        "xarray",
        "scipy",
        "sklearn",
        "joblib",
    }
)
#: Names of integer parameters that are not sizes: seeds, indexes and ids.
NOT_SIZES = frozenset(
    {
        "i",
        "j",
        "k",
        "idx",
        "index",
        "id",
        "key",
        "seed",
        "random_state",
        "rng",
        "trial",
        "rep",
        "fold",
        "part",
        "partition",
        "shard",
        "rank",
        "worker",
        "port",
    }
)

_NUMBERS = (int, float)
_SIZED = (list, tuple, dict, set, frozenset, range, bytes, bytearray)


class Call:
    """What :func:`read_call` found: ``stage`` (None: keep the key prefix), ``params``
    (None: nothing usable) and ``grows`` (the size-like parameters' names)."""

    __slots__ = ("grows", "params", "stage")

    def __init__(
        self, stage: str | None, params: dict[str, Any] | None, grows: frozenset[str]
    ) -> None:
        self.stage = stage
        self.params = params
        self.grows = grows

    def __repr__(self) -> str:
        return f"Call(stage={self.stage!r}, params={self.params!r}, grows={sorted(self.grows)})"


def _unwrap(func: Any) -> tuple[Any, tuple[Any, ...], Mapping[str, Any]]:
    """The function a ``functools.partial`` (nested or not) calls, with its bound
    arguments."""
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = {}
    depth = 0
    while isinstance(func, functools.partial) and depth < 4:
        args = (*func.args, *args)
        kwargs = {**func.keywords, **kwargs}
        func = func.func
        depth += 1
    return func, args, kwargs


def _identity(func: Any) -> tuple[str | None, tuple[str, ...], int]:
    """``(stage, positional parameter names, names to skip)`` of a callable; stage None
    for one of :data:`OWN_MODULES` or one without a module and name."""
    skip = 0
    names: tuple[str, ...] = ()
    if isinstance(func, types.MethodType):  # a bound method: its first name is self
        func, skip = func.__func__, 1
    if isinstance(func, types.FunctionType):
        module: Any = func.__module__
        name: Any = func.__qualname__
        code: Any = func.__code__
        names = code.co_varnames[: code.co_argcount]
        if name.endswith("<lambda>"):  # one stage per lambda, not one for every lambda
            name = f"{name}:{code.co_firstlineno}"
    elif isinstance(func, type | types.BuiltinFunctionType):
        module = getattr(func, "__module__", None)
        name = getattr(func, "__qualname__", None)
    else:  # an instance with __call__: its class names it
        cls = type(func)
        module = cls.__module__
        name = cls.__qualname__
        method: Any = cls.__call__  # (a callable instance's class has one)
        code = getattr(method, "__code__", None)
        if code is not None:
            names, skip = code.co_varnames[: code.co_argcount], 1
    if not isinstance(module, str) or not isinstance(name, str):
        return None, names, skip
    if module.partition(".")[0] in OWN_MODULES:
        return None, names, skip
    return f"{module}.{name}", names, skip


def _feature(value: Any, skip: type | tuple[type, ...]) -> tuple[str, Any] | None:
    """``(kind, value)`` of one argument: kind "" (as it is), "len" or "size"; None if it
    says nothing usable."""
    if isinstance(value, bool):
        return "", value
    if isinstance(value, _NUMBERS):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return "", value
    if isinstance(value, str):
        return ("", value) if len(value) <= MAX_TEXT else None
    if value is None or isinstance(value, skip):
        return None
    if isinstance(value, enum.Enum):
        return "", f"{type(value).__name__}.{value.name}"
    if isinstance(value, _SIZED):
        return "len", len(value)
    # numpy scalars and arrays, pandas frames: read without calling anything but getattr
    shape = getattr(type(value), "shape", None)
    if shape is not None:
        shape = getattr(value, "shape", None)
        if isinstance(shape, tuple) and len(shape) <= 32:
            if not shape:  # a numpy scalar
                item = getattr(value, "item", None)
                v = item() if callable(item) else None
                if isinstance(v, bool):
                    return "", v
                if isinstance(v, _NUMBERS) and math.isfinite(v):
                    return "", v
                return None
            size = 1
            for n in shape:
                if not isinstance(n, int):
                    return None
                size *= n
            return "size", size
    return None


def read_call(
    func: Any,
    args: tuple[Any, ...] | list[Any],
    kwargs: Mapping[str, Any] | None,
    skip: type | tuple[type, ...] = (),
) -> Call:
    """The stage, parameters and size-like parameters of a call of ``func`` (module
    docstring). ``skip``: the types of references to other tasks' outputs. Never raises
    for an odd argument: what cannot be read is left out."""
    stage, params, grows = read(func, args, kwargs, skip)
    return Call(stage, params, frozenset(grows))


#: The last callable read, and what :func:`_identity` and :func:`_unwrap` said of it: the
#: tasks of one graph share their function object (dask unpickles it once a graph).
_last: tuple[Any, tuple[Any, ...]] | None = None
_ARG_NAMES = tuple(f"arg{i}" for i in range(MAX_ARGS))
#: name -> is it size-like when its value is an integer > 0 (memo, cleared when large)
_SIZE_NAMES: dict[str, bool] = {}


def read(
    func: Any,
    args: tuple[Any, ...] | list[Any],
    kwargs: Mapping[str, Any] | None,
    skip: type | tuple[type, ...] = (),
) -> tuple[str | None, dict[str, Any] | None, tuple[str, ...]]:
    """:func:`read_call` as a plain tuple ``(stage, params, grows)``, the form the plugin
    reads per task (a few microseconds a task: the tasks of a graph share what is read of
    their function; an integer, a float, a string and a boolean argument are read inline)."""
    global _last
    try:
        last = _last
        if last is not None and last[0] is func:
            stage, names, offset, bound_args, bound_kwargs = last[1]
        else:
            unwrapped, bound_args, bound_kwargs = _unwrap(func)
            stage, names, offset = _identity(unwrapped)
            _last = (func, (stage, names, offset, bound_args, bound_kwargs))
        if stage is None:  # dask's own callables, or what collections call: as before
            return None, None, ()
        if bound_args:
            args = (*bound_args, *args)
        if bound_kwargs:
            kwargs = {**bound_kwargs, **(kwargs or {})}
        params: dict[str, Any] = {}
        grows: list[str] = []
        n_names = len(names)
        looked = 0
        sizes = _SIZE_NAMES
        for i, value in enumerate(args):
            if looked >= MAX_ARGS or len(params) >= MAX_FEATURES:
                break
            looked += 1
            j = i + offset
            name = names[j] if j < n_names else _ARG_NAMES[i]
            if type(value) is int:  # the commonest argument, inline (as _add reads it)
                params[name] = value
                if value > 0 and (sizes.get(name) or _size_name(name)):
                    grows.append(name)
            else:
                _add(params, grows, name, value, skip)
        if kwargs and looked < MAX_ARGS and len(params) < MAX_FEATURES:
            for name, value in kwargs.items():
                if looked >= MAX_ARGS or len(params) >= MAX_FEATURES:
                    break
                looked += 1
                if type(name) is str:
                    _add(params, grows, name, value, skip)
        return stage, params or None, tuple(grows)
    except Exception:
        return None, None, ()


def _size_name(name: str) -> bool:
    """Is an integer argument called ``name`` size-like (not a seed, an index, an id)?"""
    got = _SIZE_NAMES.get(name)
    if got is None:
        low = name.lower()
        got = low not in NOT_SIZES and "seed" not in low
        if len(_SIZE_NAMES) > 4096:
            _SIZE_NAMES.clear()
        _SIZE_NAMES[name] = got
    return got


def _add(
    params: dict[str, Any],
    grows: list[str],
    name: str,
    value: Any,
    skip: type | tuple[type, ...],
) -> None:
    t = type(value)
    if t is int:  # the common cases first, inline
        params[name] = value
        if value > 0 and _size_name(name):
            grows.append(name)
        return
    if t is float:
        if math.isfinite(value):
            params[name] = value
        return
    if t is bool:
        params[name] = value
        return
    if t is str:
        if len(value) <= MAX_TEXT:
            params[name] = value
        return
    if skip and isinstance(value, skip):  # another task's output (what _feature skips)
        return
    try:
        got = _feature(value, skip)
    except Exception:  # an argument that raises when read says nothing
        return
    if got is None:
        return
    kind, v = got
    if kind:
        name = f"{kind}({name})"
        params[name] = v
        if v > 0:
            grows.append(name)
        return
    params[name] = v
    if type(v) is int and v > 0 and _size_name(name):
        grows.append(name)
