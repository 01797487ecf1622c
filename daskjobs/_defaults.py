"""The defaults of the ``daskjobs`` settings, read once from ``daskjobs.yaml``.

The YAML beside this module is the one place a default is written. This module only
reads it (with PyYAML, which dask depends on; it imports no dask), so that every layer
takes its defaults from the same values:

* :mod:`daskjobs.config` registers them with dask's config
  (``dask.config.update_defaults``) and builds the defaults of its settings dataclasses
  (``Settings()``, ``SpeculationSettings()``) from them;
* the policy core, which imports neither ``distributed`` nor dask's config machinery
  (``tests/project/test_layering.py``), takes ``Speculation``'s ``late_factor`` and
  ``max_fraction`` from here;
* replay takes from here what a recorded header leaves out.

``tests/test_defaults.py`` checks that they agree.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import yaml

__all__ = ["PATH", "default", "defaults", "seconds", "size"]

#: The file of defaults (shipped as package data).
PATH = os.path.join(os.path.dirname(__file__), "daskjobs.yaml")

with open(PATH, encoding="utf-8") as _f:
    _DEFAULTS: dict[str, Any] = yaml.safe_load(_f)


def defaults() -> dict[str, Any]:
    """A fresh copy of the whole file, ``{"daskjobs": {...}}``, as written (kebab-case
    keys, durations as strings)."""
    return copy.deepcopy(_DEFAULTS)


def default(key: str) -> Any:
    """The default of ``key``, a dotted kebab-case path inside the ``daskjobs`` section,
    as written: ``default("speculation.late-factor") == 2.5``. KeyError if there is none."""
    node: Any = _DEFAULTS["daskjobs"]
    for part in key.split("."):
        node = node[part]
    return copy.deepcopy(node)


def seconds(key: str) -> float | None:
    """The default of the duration ``key`` in seconds, read as :mod:`daskjobs.config`
    reads durations (``dask.utils.parse_timedelta``): ``seconds("speculation.interval")
    == 0.2``; None where the default is ``null``."""
    value = default(key)
    if value is None:
        return None
    from dask.utils import parse_timedelta  # only here: the policy core never asks

    return float(parse_timedelta(value, default="seconds"))


def size(key: str) -> int | None:
    """The default of the size ``key`` in bytes, read as :mod:`daskjobs.config` reads
    sizes (``dask.utils.parse_bytes``): ``size("admission.job-bytes") == 16 * 2**20``;
    None where the default is ``null``."""
    value = default(key)
    if value is None:
        return None
    from dask.utils import parse_bytes  # only here: the policy core never asks

    return int(parse_bytes(value))
