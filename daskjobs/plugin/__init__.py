"""The daskjobs scheduler plugin (imports ``distributed``; the policies do not).

``JobsPlugin``, ``UnknownTeam`` and ``TeamRefused`` are imported on first use (PEP 562), so that
``daskjobs.plugin.client.cli`` and ``daskjobs --help`` do not load ``distributed``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from daskjobs.plugin.identity import TeamRefused
    from daskjobs.plugin.plugin import JobsPlugin, UnknownTeam

__all__ = ["JobsPlugin", "TeamRefused", "UnknownTeam"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        import importlib

        home = "identity" if name == "TeamRefused" else "plugin"
        value = getattr(importlib.import_module(f"daskjobs.plugin.{home}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'daskjobs.plugin' has no attribute {name!r}")
