"""Content-keyed caching of sweep stages: content keys and the result store.

* :mod:`daskjobs.cache.keys`: how a stage's content key is computed (and what it ignores);
* :mod:`daskjobs.cache.store`: :class:`ResultStore`, results under their keys on any fsspec
  filesystem, with atomic commits and checksummed reads;
* :mod:`daskjobs.cache.cli`: the ``daskjobs cache`` command (``ls``, ``info``, ``gc``,
  ``verify``).

See ``docs/cache.md`` for the rules, the limits and the trust model of a shared store.
"""

from __future__ import annotations

from daskjobs.cache.keys import NondeterministicParameterError, code_hash, stage_key
from daskjobs.cache.store import (
    CorruptEntryError,
    EntryInfo,
    GCReport,
    ResultStore,
    VerifyReport,
    default_store_url,
)

__all__ = [
    "CorruptEntryError",
    "EntryInfo",
    "GCReport",
    "NondeterministicParameterError",
    "ResultStore",
    "VerifyReport",
    "code_hash",
    "default_store_url",
    "stage_key",
]
