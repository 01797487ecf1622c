"""daskjobs: finish dask.distributed sweeps and ML jobs sooner and more fairly.

Nothing heavy is imported here: ``import daskjobs`` stays cheap, and the
offline simulator (:mod:`daskjobs.sim`) never imports ``distributed``.
The sweep API (``daskjobs.Sweep``, ``grid``, ``cases``, ``run``), the result
store (``daskjobs.ResultStore``), the plugin and its client functions are
imported on first use (module ``__getattr__``, PEP 562). Type checkers read
``__init__.pyi`` beside this file instead, which imports each of them from its
module, so ``daskjobs.Sweep`` has its real type, not ``Any`` (the stub is the
scientific-python lazy-loading convention, SPEC 1: a ``TYPE_CHECKING`` block here
would name ``daskjobs.plugin`` in the module that the simulator's layering test
follows; tests/project/test_packaging.py checks that the stub and ``_LAZY`` agree).

``daskjobs.__version__`` is the installed distribution's version
(``importlib.metadata``, looked up on first use: it costs more than the rest of
this module), or :mod:`daskjobs._version`'s when running from a source tree that
was never installed.
"""

from __future__ import annotations

from typing import Any

# Public names imported lazily on first attribute access.
_LAZY = {
    "Sweep": "daskjobs.sweep",
    "SweepResult": "daskjobs.sweep",
    "grid": "daskjobs.sweep",
    "cases": "daskjobs.sweep",
    "run": "daskjobs.sweep",
    "ClusterImportError": "daskjobs.sweep",
    "ResultStore": "daskjobs.cache.store",
    "StoreAccessError": "daskjobs.cache.store",
    "SweepInterrupted": "daskjobs.sweep",
    "SweepCancelled": "daskjobs.sweep",
    "SweepKeyboardInterrupt": "daskjobs.sweep",
    "SubmissionRefused": "daskjobs.errors",
    "AdmissionRefused": "daskjobs.errors",
    "JobsPlugin": "daskjobs.plugin",
    "cancelled": "daskjobs.tasks",
    "checkpoint": "daskjobs.tasks",
    "restore": "daskjobs.tasks",
    "preempted": "daskjobs.tasks",
    "Preempted": "daskjobs.tasks",
    "explain": "daskjobs.plugin.client",
    "status": "daskjobs.plugin.client",
    "set_team": "daskjobs.plugin.client",
    "local_cluster": "daskjobs.plugin.client",
    "start_rate": "daskjobs.plugin.client",
    "record": "daskjobs.plugin.client.record",
    "forecast": "daskjobs.forecasting",
}

__all__ = ["__version__", *_LAZY]


def _installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("daskjobs")
    except PackageNotFoundError:  # a source tree on sys.path, never installed
        from daskjobs._version import __version__ as source

        return source


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value: Any = _installed_version()
    else:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'daskjobs' has no attribute {name!r}")
        import importlib

        value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
