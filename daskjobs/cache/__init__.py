"""Content-keyed caching of sweep stages: content keys and the result store.

* :mod:`daskjobs.cache.keys`: how a stage's content key is computed (and what it ignores);
* :mod:`daskjobs.cache.store`: :class:`ResultStore`, results under their keys on any fsspec
  filesystem, with atomic commits and checksummed reads;
* :mod:`daskjobs.cache.claims`: :class:`Claims`, so that clusters sharing a store compute a
  stage once;
* :mod:`daskjobs.cache.cli`: the ``daskjobs cache`` command (``ls``, ``info``, ``gc``,
  ``verify``).

See ``docs/explanation/cache.md`` for the rules, the limits and the trust model of a shared store.
Names are imported on first use, so ``daskjobs cache --help`` does not import dask.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "Claims": "daskjobs.cache.claims",
    "NondeterministicParameterError": "daskjobs.cache.keys",
    "code_hash": "daskjobs.cache.keys",
    "stage_key": "daskjobs.cache.keys",
    "CorruptEntryError": "daskjobs.cache.store",
    "EntryInfo": "daskjobs.cache.store",
    "GCReport": "daskjobs.cache.store",
    "ResultStore": "daskjobs.cache.store",
    "StoreAccessError": "daskjobs.cache.store",
    "VerifyReport": "daskjobs.cache.store",
    "default_store_url": "daskjobs.cache.store",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'daskjobs.cache' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
