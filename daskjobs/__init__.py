"""daskjobs: finish dask.distributed sweeps and ML jobs sooner and more fairly.

Nothing heavy is imported here: ``import daskjobs`` stays cheap, and the
offline simulator (:mod:`daskjobs.sim`) never imports ``distributed``.
The sweep API (``daskjobs.Sweep``, ``grid``, ``cases``, ``run``) and the
result store (``daskjobs.ResultStore``) are imported on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0.dev0"

# Public names imported lazily on first attribute access (module __getattr__, PEP 562).
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
    "JobsPlugin": "daskjobs.plugin",
    "cancelled": "daskjobs.tasks",
    "explain": "daskjobs.plugin.client",
    "status": "daskjobs.plugin.client",
    "local_cluster": "daskjobs.plugin.client",
    "record": "daskjobs.plugin.record",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'daskjobs' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
