"""The daskjobs scheduler plugin (imports ``distributed``; the policies do not).

``JobsPlugin`` and ``UnknownTeam`` are imported on first use (PEP 562), so that
``daskjobs.plugin.cli`` and ``daskjobs --help`` do not load ``distributed``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from daskjobs.plugin.plugin import JobsPlugin, UnknownTeam

__all__ = ["JobsPlugin", "UnknownTeam"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from daskjobs.plugin import plugin

        value = getattr(plugin, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'daskjobs.plugin' has no attribute {name!r}")
