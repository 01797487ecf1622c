"""Preload for shared clusters: ``dask scheduler --preload plugins/daskjobs_scheduler.py``.

The same preload as ``dask scheduler --preload daskjobs.preload`` (the logic lives
there), as a file for operators who point ``--preload`` at a path. Options after
the preload (``--daskjobs-policy lpt``) override the ``daskjobs`` section of dask's
config; a bad option or setting stops the scheduler from starting.
"""

from __future__ import annotations

from daskjobs.preload import dask_setup

__all__ = ["dask_setup"]
