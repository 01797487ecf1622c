"""daskjobs: finish dask.distributed sweeps and ML jobs sooner and more fairly.

Nothing heavy is imported here: ``import daskjobs`` stays cheap, and the
offline simulator (:mod:`daskjobs.sim`) never imports ``distributed``.
"""

from __future__ import annotations

__version__ = "0.1.0.dev0"

__all__ = ["__version__"]
