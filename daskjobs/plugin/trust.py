"""The trust model (docs/how-to/load-the-plugin.md#trust), as the plugin applies it at start."""

from __future__ import annotations

import dataclasses
from typing import Any

from daskjobs.config import Settings, settings

__all__ = ["apply_trust"]


def apply_trust(plugin: Any, scheduler: Any, plugin_class: Any) -> Settings:
    """The settings ``plugin`` runs with on ``scheduler``: a client's plugin (one that
    arrived pickled) takes the settings that guard the operator's setup (``record-dir``,
    ``clients``, ``admission``, ``forecast``, the teams bound to certificates) from the
    scheduler's own config, and may replace the operator's plugin (any ``plugin_class`` the
    scheduler runs) only where the operator allows it (``PermissionError`` otherwise)."""
    if not plugin.from_client:
        return plugin.settings
    trusted = settings()  # the scheduler's dask config, no client keywords
    # teams bound to certificates are the operator's too: who maps to which team, who acts
    # for any team, what an unmapped certificate gets
    teams = dataclasses.replace(
        plugin.settings.teams,
        identities=trusted.teams.identities,
        admins=trusted.teams.admins,
        unmapped=trusted.teams.unmapped,
    )
    ours = dataclasses.replace(
        plugin.settings,
        record_dir=trusted.record_dir,
        clients=trusted.clients,
        admission=trusted.admission,
        forecast=trusted.forecast,  # the scheduler's CPU: the operator's to spend
        teams=teams,
    )
    # one JobsPlugin steers a scheduler (whatever name it is registered under, it ranks
    # every graph): a client's does not take over from the operator's
    for name, existing in scheduler.plugins.items():
        if (
            isinstance(existing, plugin_class)
            and not existing.from_client
            and not existing.settings.clients.replace_plugin
        ):
            raise PermissionError(
                "daskjobs: this scheduler runs the daskjobs plugin its operator "
                f"configured (policy {existing.settings.policy!r}); a client's "
                "register_plugin does not replace it (daskjobs.clients.replace-plugin is "
                "false on the scheduler). Ask the operator, or remove theirs on purpose "
                f"first: client.unregister_scheduler_plugin({name!r})"
            )
    return ours
