"""The daskjobs scheduler plugin (imports ``distributed``; the policies do not)."""

from __future__ import annotations

from daskjobs.plugin.plugin import JobsPlugin, UnknownTeam

__all__ = ["JobsPlugin", "UnknownTeam"]
