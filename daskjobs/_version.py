"""The version of daskjobs, written once.

pyproject.toml reads it when a wheel or an editable install is built (setuptools'
dynamic ``version = {attr = "daskjobs._version.__version__"}``, evaluated without
importing daskjobs); ``daskjobs.__version__`` is the *installed* distribution's
version (``importlib.metadata``), and this string only where daskjobs runs from a
source tree that was never installed. A release bumps this line and tags the commit.
"""

from __future__ import annotations

__version__ = "0.1.0.dev0"
