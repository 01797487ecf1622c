"""Content keys: what a stage's result depends on, reduced to one deterministic string.

A stage's content key is a hash of

* the **function's identity**: its module and qualified name, plus either its *code* (see below)
  or an explicit ``version=`` string that the user bumps by hand;
* its **parameters**, each tokenized with :func:`dask.base.tokenize` in deterministic mode;
* the **content keys of its inputs** (a Merkle chain: an input's key already covers everything
  upstream of it, so the inputs' data is never hashed).

The key is also the stage's Dask key (``"<stage>-<32 hex digits>"``), so Dask's own
one-task-per-key rule makes a stage shared by a hundred consumers a single node, and a result
stored under the key is reused by any later graph that computes the same thing.

What "the code" means
---------------------
Source text is a poor identity: editing a comment or re-indenting a line would change it and
turn every lookup into a miss. Instead we hash the function's *code object* with the parts that
only describe where the code sits left out:

hashed
    bytecode, constants (nested code objects recursively, e.g. lambdas and comprehensions),
    names, local variable names, argument counts and flags, default values, closure cells,
    the Python minor version (bytecode differs between versions), and every global the code
    refers to, resolved as follows:

    * plain data (numbers, strings, bytes, ``None``, and tuples, lists, sets and dicts of those,
      numpy arrays and scalars) by **value**, so changing a module constant changes the key;
    * functions defined in the **same module** by their code, recursively (cycles are cut);
    * modules, and functions or classes from **other modules**, by name plus the version of the
      package they belong to (``numpy`` 2.1 -> 2.2 changes the key);
    * anything else by its type's name only.

left out
    file name, line numbers, the line table (so comments, blank lines and whitespace do not
    matter) and the docstring.

Limits, and what to do about them
---------------------------------
* A helper in **another module** of your own project is identified by name, not code: editing
  it does not change the key. List it in the stage's ``track=`` to hash its code too, or set
  ``version=`` and bump it when behaviour changes.
* Data a stage reads from outside its parameters (files, databases, environment variables) is
  invisible. Pass what matters as a parameter (e.g. a file's checksum, a snapshot date).
* A function's module is part of its identity, so a function defined in a script has module
  ``__main__`` when the script runs and a different one when imported.
* With ``version=`` set the code is not hashed at all (and neither is the Python version): you
  promise that equal versions compute equal results.

A parameter with no deterministic token (an open file, a lock, an object whose pickle changes
from run to run) is an error, :class:`NondeterministicParameterError`, naming the parameter;
tokenize's default, a random token, would silently make every lookup a miss.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dask.base import tokenize
from dask.tokenize import TokenizationError

__all__ = [
    "NondeterministicParameterError",
    "code_hash",
    "stage_key",
    "tokenize_param",
    "validate_stage_name",
]

_STAGE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLAIN_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_MAX_PLAIN_ITEMS = 10_000


class NondeterministicParameterError(TypeError):
    """A stage parameter (or closure value) has no deterministic token."""


def validate_stage_name(name: str) -> str:
    """Return ``name`` if it can prefix a Dask key and name a file, else raise ``ValueError``."""
    if not isinstance(name, str) or not _STAGE_NAME.match(name):
        raise ValueError(
            f"stage name {name!r} is not valid: use letters, digits and underscores, "
            "starting with a letter or underscore (it prefixes the Dask key and names files)"
        )
    return name


def tokenize_param(stage: str, name: str, value: object) -> str:
    """Deterministic token of one parameter value; the error names the stage and parameter."""
    try:
        return tokenize(value, ensure_deterministic=True)
    except (TokenizationError, RuntimeError, TypeError) as err:
        raise NondeterministicParameterError(
            f"parameter {name!r} of stage {stage!r} has no deterministic token "
            f"(a {type(value).__module__}.{type(value).__qualname__}), so the stage cannot be "
            "content-keyed: pass plain data (numbers, strings, tuples, dicts, numpy arrays, "
            "dataclasses of those) or give the object a __dask_tokenize__ method. "
            f"Detail: {err}"
        ) from err


def stage_key(
    stage: str, code: str, param_tokens: Mapping[str, str], input_keys: Mapping[str, str]
) -> str:
    """The content key of one stage call: ``"<stage>-<hash>"``.

    ``code`` is :func:`code_hash` of the function (or its explicit version), ``param_tokens``
    maps parameter names to :func:`tokenize_param` tokens and ``input_keys`` maps argument
    names to the content keys of the stages that feed them.
    """
    token = tokenize(
        "daskjobs-stage-v1",
        stage,
        code,
        sorted(param_tokens.items()),
        sorted(input_keys.items()),
        ensure_deterministic=True,
    )
    return f"{stage}-{token}"


def code_hash(
    func: Callable[..., Any], *, version: str | None = None, track: Iterable[Callable] = ()
) -> str:
    """Hash of a callable's identity and code (see the module docstring for the rule).

    With ``version`` set, only the identity and the version are hashed. ``track`` lists extra
    functions (helpers in other modules) whose code is hashed as well.
    """
    module, qualname = _identity(func)
    if version is not None:
        return tokenize("version", module, qualname, str(version), ensure_deterministic=True)
    hasher = _CodeHasher(home=module)
    parts: list[object] = [sys.version_info[:2], hasher.callable(func)]
    parts.extend(hasher.function_code(t) for t in track)
    return tokenize("code", module, qualname, parts, ensure_deterministic=True)


def _identity(func: object) -> tuple[str, str]:
    target = func.func if isinstance(func, functools.partial) else func
    module = getattr(target, "__module__", None) or type(target).__module__
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    return str(module), str(qualname)


@functools.lru_cache(maxsize=256)
def _package_version(module_name: str) -> str:
    top = module_name.partition(".")[0]
    mod = sys.modules.get(top)
    version = getattr(mod, "__version__", None)
    if isinstance(version, str):
        return version
    try:
        return importlib.metadata.version(top)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return ""


def _is_plain(value: object, depth: int = 0) -> bool:
    if isinstance(value, _PLAIN_SCALARS):
        return True
    if depth > 5:
        return False
    if isinstance(value, (tuple, list, set, frozenset)):
        return len(value) <= _MAX_PLAIN_ITEMS and all(_is_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return len(value) <= _MAX_PLAIN_ITEMS and all(
            _is_plain(k, depth + 1) and _is_plain(v, depth + 1) for k, v in value.items()
        )
    return type(value).__module__ == "numpy" and type(value).__name__ != "ufunc"


class _CodeHasher:
    """Turns a callable into a nested tuple of deterministic parts; cycles are cut by name."""

    def __init__(self, home: str) -> None:
        self.home = home  # functions of this module are hashed by code, others by name
        self._in_progress: set[int] = set()

    def callable(self, func: object) -> object:
        if isinstance(func, functools.partial):
            return (
                "partial",
                self.callable(func.func),
                tuple(self.value(a) for a in func.args),
                tuple(sorted((k, self.value(v)) for k, v in func.keywords.items())),
            )
        if isinstance(func, types.MethodType):
            state = self.state(func.__self__, "the instance of bound method")
            return ("method", self.callable(func.__func__), state)
        if isinstance(func, types.FunctionType):
            return self.function_code(func)
        if isinstance(func, type):
            return ("class", *_identity(func), _package_version(func.__module__))
        call = getattr(type(func), "__call__", None)  # noqa: B004 - we want the class attribute
        if isinstance(call, types.FunctionType):
            # A callable object: its class's __call__ code and the object's own state.
            state = self.state(func, "callable object")
            return ("callable-object", self.function_code(call), state)
        # Builtins and C functions: identity and package version.
        module, qualname = _identity(func)
        return ("builtin", module, qualname, _package_version(module))

    def function_code(self, func: Callable[..., Any]) -> object:
        if not isinstance(func, types.FunctionType):
            return self.callable(func)
        if id(func) in self._in_progress:
            return ("recursive", func.__module__, func.__qualname__)
        self._in_progress.add(id(func))
        try:
            code = func.__code__
            return (
                "function",
                func.__module__,
                func.__qualname__,
                self.code(code, docstring=func.__doc__),
                tuple(self.value(v) for v in func.__defaults__ or ()),
                tuple(sorted((k, self.value(v)) for k, v in (func.__kwdefaults__ or {}).items())),
                tuple(self.value(c.cell_contents) for c in func.__closure__ or ()),
                self.globals_of(func, code),
            )
        finally:
            self._in_progress.discard(id(func))

    def code(self, code: types.CodeType, docstring: str | None = None) -> object:
        consts: list[object] = []
        for i, const in enumerate(code.co_consts):
            if i == 0 and docstring is not None and const == docstring:
                consts.append("<docstring>")
            elif isinstance(const, types.CodeType):
                consts.append(self.code(const))
            else:
                consts.append(tokenize(const, ensure_deterministic=True))
        return (
            code.co_name,
            code.co_code,
            tuple(consts),
            code.co_names,
            code.co_varnames,
            code.co_freevars,
            code.co_cellvars,
            code.co_argcount,
            code.co_posonlyargcount,
            code.co_kwonlyargcount,
            code.co_flags,
            getattr(code, "co_exceptiontable", b""),
        )

    def globals_of(self, func: types.FunctionType, code: types.CodeType) -> tuple[object, ...]:
        names: dict[str, None] = {}
        stack = [code]
        while stack:
            co = stack.pop()
            names.update(dict.fromkeys(co.co_names))
            stack.extend(c for c in co.co_consts if isinstance(c, types.CodeType))
        out = []
        for name in names:
            if name not in func.__globals__:
                continue  # a builtin, or an attribute name
            out.append((name, self.value(func.__globals__[name])))
        return tuple(out)

    def value(self, value: object) -> object:
        """A global, closure cell or default value (see the module docstring for the rule)."""
        if _is_plain(value):
            try:
                return ("data", tokenize(value, ensure_deterministic=True))
            except (TokenizationError, RuntimeError, TypeError):
                pass
        if isinstance(value, types.ModuleType):
            return ("module", value.__name__, _package_version(value.__name__))
        if isinstance(value, types.FunctionType) and value.__module__ == self.home:
            return self.function_code(value)
        if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
            return ("callable", *_identity(value), _package_version(value.__module__))
        if isinstance(value, functools.partial):
            return self.callable(value)
        module = type(value).__module__
        return ("opaque", module, type(value).__qualname__, _package_version(module))

    def state(self, obj: object, what: str) -> str:
        """Token of the state of a callable object or a bound method's instance."""
        try:
            return tokenize(obj, ensure_deterministic=True)
        except (TokenizationError, RuntimeError, TypeError) as err:
            raise NondeterministicParameterError(
                f"{what} {type(obj).__qualname__!r} has no deterministic token, so the stage "
                f"cannot be content-keyed; set version= on the stage. Detail: {err}"
            ) from err
