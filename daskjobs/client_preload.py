"""Client preload: every new ``Client`` states its team, ``daskjobs.team`` of its dask config.

Name it in the client's dask config, with the team::

    export DASK_DISTRIBUTED__CLIENT__PRELOAD='["daskjobs.client_preload"]'
    export DASK_DASKJOBS__TEAM=quant

or in YAML (``~/.config/dask/daskjobs.yaml``)::

    distributed:
      client:
        preload: [daskjobs.client_preload]
    daskjobs:
      team: quant

Each ``Client`` then tells the scheduler its team as it connects (as
:func:`daskjobs.set_team` does), before it sends anything, so every graph it sends without
a ``team`` annotation is that team's: plain ``client.map`` and ``dask.delayed`` code, joblib
and dask collections included, without a line of daskjobs in it.

A client is never stopped by it: no ``daskjobs.team`` set, a scheduler without the daskjobs
plugin, or a team the scheduler refuses (a certificate bound to another team) is a warning
on the ``daskjobs.client_preload`` logger, and the client works as it would without it.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["dask_setup"]

logger = logging.getLogger("daskjobs.client_preload")


async def dask_setup(client: Any) -> None:
    """State ``client``'s team (``daskjobs.team``) to the scheduler's daskjobs plugin."""
    from daskjobs.config import client_team

    try:
        team = client_team()
    except ValueError as e:
        logger.warning("daskjobs: this client's team is not stated: %s", e)
        return
    if team is None:
        logger.warning(
            "daskjobs: the client preload states no team: daskjobs.team is not set "
            "(DASK_DASKJOBS__TEAM=<team>)"
        )
        return
    try:
        answer = await client.scheduler.daskjobs_team(client_id=client.id, team=team)
    except Exception as e:  # the client works without it
        logger.warning("daskjobs: could not state this client's team %r: %s", team, e)
        return
    if not isinstance(answer, dict) or answer.get("daskjobs") == "removed":
        logger.warning(
            "daskjobs: team %r not stated: the daskjobs plugin is not loaded on this scheduler",
            team,
        )
    elif "refused" in answer:
        logger.warning("daskjobs: team %r not stated: %s", team, answer["refused"])
    else:
        logger.info(
            "daskjobs: this client's graphs are team %r's (%s)", answer["team"], answer["source"]
        )
