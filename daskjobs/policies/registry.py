"""The policy registry: one name, one policy, for the simulator, the plugin and replay.

Every place that takes a policy by name reads this registry: the ``daskjobs.policy``
setting (:mod:`daskjobs.config`), the plugin (:class:`daskjobs.JobsPlugin`), replay's
what-ifs (:func:`daskjobs.replay.replay`) and the ``daskjobs simulate`` and
``daskjobs replay`` commands. A name maps to a :class:`PolicySpec`: a *factory* (a
policy class, or any callable taking keyword settings and returning a fresh
:class:`~daskjobs.policies.Policy`), a one-line description, the settings it takes
(read from its signature: keyword -> default, :data:`REQUIRED` for none) and whether
the live plugin can run it.

Three ways in
=============

* the built-in policies, registered by :mod:`daskjobs.policies` when it is imported;
* :func:`register` in code, e.g. at the top of the module that defines a policy::

      from daskjobs.policies import HeapPolicy, register

      class ShortestFirst(HeapPolicy):
          name = "shortest-first"
          def key(self, task):
              return task.estimate

      register("shortest-first", ShortestFirst)

* an entry point of group ``daskjobs.policies`` in an installed package's metadata
  (``pyproject.toml``: ``[project.entry-points."daskjobs.policies"]``,
  ``shortest-first = "mypkg.policies:ShortestFirst"``). Entry points are listed the
  first time a name is looked up, and each is imported only when its own name is
  asked for: a broken one (a missing module, a wrong attribute) is an error naming
  it, its group and what failed, on use of that name only; the other names work.

A built-in name cannot be taken by an entry point (it is skipped, with a warning);
two entry points of one name: the first listed wins, with a warning. Registering in
code a name an entry point declares takes the code's factory when it is the entry
point's own target (the module that registers itself when the entry point imports
it), else needs ``replace=True``.

Settings
========

:func:`make` checks settings against the factory's signature before calling it: an
unknown one is ``policy 'lpt' has no setting 'depth' (it takes none)``, a missing
one ``policy 'fair-share' needs the setting 'targets'``; both are
:class:`PolicySettingError`, a ``ValueError`` and a ``TypeError`` (what calling the
class with a wrong keyword raised before). A ``ValueError`` the factory raises
itself is re-raised with the policy's name in front. A factory whose signature
takes ``**kwargs`` (or that has none Python can read) accepts any keyword.

Nothing here imports ``distributed``; the registry is a dict and lookups are O(1).
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from types import MappingProxyType
from typing import Any

from daskjobs.policies.base import Policy

__all__ = [
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "REQUIRED",
    "PolicySettingError",
    "PolicySpec",
    "check_settings",
    "get",
    "import_policies",
    "make",
    "names",
    "register",
    "unregister",
]

logger = logging.getLogger("daskjobs.policies")

#: The entry point group packages declare their policies in.
ENTRY_POINT_GROUP = "daskjobs.policies"
#: ``PolicySpec.origin`` of the policies daskjobs itself registers.
BUILTIN = "daskjobs"

#: A policy name: lower-case letters, digits, and ``-``, ``_`` or ``.`` between them
#: (names appear in YAML, environment variables and command lines).
_NAME = re.compile(r"[a-z0-9]+(?:[-_.][a-z0-9]+)*")
_MAX_NAME = 64


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: The default of a setting the factory cannot do without.
REQUIRED: Any = _Required()


class PolicySettingError(ValueError, TypeError):
    """A setting a policy does not take, or one it needs and did not get.

    ``policy`` and ``setting`` name them (``setting`` is None when the problem is not
    one setting)."""

    def __init__(self, message: str, policy: str, setting: str | None = None) -> None:
        super().__init__(message)
        self.policy = policy
        self.setting = setting


@dataclass(frozen=True)
class PolicySpec:
    """One registered policy."""

    name: str
    factory: Callable[..., Policy]
    description: str = ""
    #: keyword -> default (:data:`REQUIRED` if it has none), in signature order
    settings: Mapping[str, Any] = field(default_factory=dict)
    #: the factory also takes keywords not listed (``**kwargs``, or no readable signature)
    open: bool = False
    #: can the live plugin run it (``JobsPlugin(policy=name)``)?
    live: bool = True
    #: ``"daskjobs"`` (built in), ``"register"`` or ``"entry point NAME = module:attr"``
    origin: str = "register"

    def make(self, **settings: Any) -> Policy:
        """A fresh policy with ``settings`` (checked first; see :func:`make`)."""
        check_settings(self, settings)
        try:
            policy = self.factory(**settings)
        except PolicySettingError:
            raise
        except ValueError as e:
            raise ValueError(f"policy {self.name!r}: {e}") from e
        if not isinstance(policy, Policy):
            raise TypeError(
                f"policy {self.name!r}: the factory made {type(policy).__name__}, not a "
                "daskjobs.policies.Policy (subclass Policy or HeapPolicy)"
            )
        return policy


# -- the registry's state ---------------------------------------------------------------------

_entries: dict[str, PolicySpec] = {}
#: entry points listed but not imported yet, by name; None until listed
_pending: dict[str, EntryPoint] | None = None


def _check_name(name: object) -> str:
    if not (isinstance(name, str) and len(name) <= _MAX_NAME and _NAME.fullmatch(name)):
        raise ValueError(
            "policy name must be lower-case letters and digits, with '-', '_' or '.' "
            f"between them (at most {_MAX_NAME} characters), got {name!r}"
        )
    return name


def _schema(factory: Callable[..., Any]) -> tuple[dict[str, Any], bool]:
    """The keyword settings ``factory`` takes (name -> default) and whether it takes more."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or extension without a signature
        return {}, True
    settings: dict[str, Any] = {}
    more = False
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            more = True
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            settings[p.name] = REQUIRED if p.default is p.empty else p.default
        elif p.kind is p.POSITIONAL_ONLY and p.default is p.empty:
            raise TypeError(
                f"a policy factory takes keyword settings only; {factory!r} needs the "
                f"positional argument {p.name!r}"
            )
    return settings, more


def _description(factory: Callable[..., Any]) -> str:
    doc = inspect.getdoc(factory) or ""
    return doc.strip().split("\n\n")[0].replace("\n", " ")


def _spec(name: str, factory: Any, description: str, live: bool, origin: str) -> PolicySpec:
    if not callable(factory):
        raise TypeError(
            f"the factory of policy {name!r} must be callable (a Policy class or a function "
            f"returning a Policy), got {factory!r}"
        )
    settings, more = _schema(factory)
    return PolicySpec(
        name=name,
        factory=factory,
        description=description or _description(factory),
        settings=MappingProxyType(settings),
        open=more,
        live=bool(live),
        origin=origin,
    )


def register(
    name: str,
    factory: Callable[..., Policy],
    *,
    description: str = "",
    replace: bool = False,
    live: bool = True,
) -> PolicySpec:
    """Make ``name`` mean the policy ``factory`` makes, everywhere a name is read.

    ``factory`` is a :class:`~daskjobs.policies.Policy` subclass or a callable taking
    keyword settings and returning a fresh policy (each run needs its own: policies
    keep state). ``description`` defaults to the first paragraph of its docstring.
    ``live=False`` marks a policy the plugin cannot run (it names it in its refusal).
    A name already registered needs ``replace=True``. Returns the new entry.
    """
    _check_name(name)
    spec = _spec(name, factory, description, live, "register")
    pending = _entry_points()
    old = _entries.get(name)
    if old is not None and not replace:
        raise ValueError(
            f"policy {name!r} is already registered ({old.origin}: {old.factory!r}); "
            "pass replace=True to replace it"
        )
    ep = pending.get(name)
    if ep is not None:
        if not replace and ep.value != _target(factory):
            raise ValueError(
                f"policy {name!r} is already registered (entry point {ep.value!r} of group "
                f"{ENTRY_POINT_GROUP!r}); pass replace=True to replace it"
            )
        del pending[name]
    _entries[name] = spec
    return spec


def _builtin(name: str, factory: Callable[..., Policy], *, live: bool = True) -> None:
    """Register one of daskjobs's own policies (at import: no entry point is listed)."""
    _entries[_check_name(name)] = _spec(name, factory, "", live, BUILTIN)


def unregister(name: str) -> None:
    """Forget ``name`` (a built-in too; :func:`register` it again to restore it)."""
    if _entries.pop(name, None) is None and _entry_points().pop(name, None) is None:
        raise _unknown(name)


def get(name: str) -> PolicySpec:
    """The entry of ``name``; an entry point of that name is imported now."""
    spec = _entries.get(name)
    if spec is not None:
        return spec
    ep = _entry_points().get(name) if isinstance(name, str) else None
    if ep is None:
        raise _unknown(name)
    return _load(ep)


def names(*, live: bool | None = None, builtin: bool | None = None) -> tuple[str, ...]:
    """Registered names: built-ins first, then in registration order, then entry points
    not imported yet. ``live=True``: only those the plugin can run (entry points count as
    live); ``builtin=True``: only daskjobs's own."""
    pending = _entry_points()
    out = [
        n
        for n, s in _entries.items()
        if (live is None or s.live == live)
        and (builtin is None or (s.origin == BUILTIN) == builtin)
    ]
    if live in (None, True) and builtin in (None, False):
        out.extend(n for n in pending if n not in _entries)
    return tuple(out)


def make(name: str, **settings: Any) -> Policy:
    """A fresh policy by name, with ``settings`` as keywords to its factory."""
    return get(name).make(**settings)


def check_settings(policy: str | PolicySpec, settings: Mapping[str, Any]) -> None:
    """Raise :class:`PolicySettingError` naming the first setting ``policy`` does not
    take, or the first it needs and ``settings`` lacks."""
    spec = policy if isinstance(policy, PolicySpec) else get(policy)
    known = spec.settings
    if not spec.open:
        for key in settings:
            if key not in known:
                takes = f"it takes: {', '.join(known)}" if known else "it takes none"
                raise PolicySettingError(
                    f"policy {spec.name!r} has no setting {key!r} ({takes})", spec.name, key
                )
    for key, default in known.items():
        if default is REQUIRED and key not in settings:
            raise PolicySettingError(
                f"policy {spec.name!r} needs the setting {key!r}", spec.name, key
            )


def import_policies(spec: str) -> None:
    """Import the module ``spec`` (``mypkg.policies``) or run the Python file ``spec``
    (``./my_policies.py``), so that the policies it registers are known: the
    ``--import`` option of ``daskjobs simulate`` and ``daskjobs replay``. Errors are a
    ``ValueError`` naming ``spec``."""
    import importlib
    import os
    import runpy
    import sys

    try:
        if spec.endswith(".py") or os.sep in spec:
            runpy.run_path(spec, run_name=f"daskjobs_policies_{len(sys.modules)}")
        else:
            importlib.import_module(spec)
    except Exception as e:
        raise ValueError(f"cannot import policies from {spec!r}: {type(e).__name__}: {e}") from e


def _unknown(name: object) -> ValueError:
    known = ", ".join(sorted(names()))
    return ValueError(f"unknown policy {name!r}; choose one of: {known}")


# -- entry points -----------------------------------------------------------------------------


def _target(factory: Any) -> str:
    return f"{getattr(factory, '__module__', '')}:{getattr(factory, '__qualname__', '')}"


def _entry_points() -> dict[str, EntryPoint]:
    """The entry points not imported yet, listed once (on the first lookup)."""
    global _pending
    if _pending is not None:
        return _pending
    found: dict[str, EntryPoint] = {}
    try:  # reads installed metadata only: nothing is imported until a name is asked for
        eps = list(entry_points(group=ENTRY_POINT_GROUP))
    except Exception as e:  # broken metadata of some installed package
        logger.warning("daskjobs: cannot list the %r entry points: %s", ENTRY_POINT_GROUP, e)
        eps = []
    for ep in eps:
        taken = _entries.get(ep.name)
        if taken is not None or ep.name in found:
            by = taken.origin if taken is not None else f"entry point {found[ep.name].value!r}"
            logger.warning(
                "daskjobs: entry point %r = %r of group %r ignored: policy %r is already "
                "registered (%s)",
                ep.name,
                ep.value,
                ENTRY_POINT_GROUP,
                ep.name,
                by,
            )
            continue
        try:
            _check_name(ep.name)
        except ValueError as e:
            logger.warning(
                "daskjobs: entry point %r of group %r ignored: %s", ep.name, ENTRY_POINT_GROUP, e
            )
            continue
        found[ep.name] = ep
    _pending = found
    return found


def _load(ep: EntryPoint) -> PolicySpec:
    """Import the entry point ``ep`` and register what it names (errors name it)."""
    what = f"entry point {ep.name!r} = {ep.value!r} of group {ENTRY_POINT_GROUP!r}"
    try:
        factory = ep.load()
        spec = _spec(ep.name, factory, "", True, f"entry point {ep.name} = {ep.value}")
    except Exception as e:
        raise ValueError(
            f"policy {ep.name!r}: {what} failed to load: {type(e).__name__}: {e}"
        ) from e
    assert _pending is not None
    _pending.pop(ep.name, None)
    # importing it may have registered it in code already: that entry stands
    return _entries.setdefault(ep.name, spec)
