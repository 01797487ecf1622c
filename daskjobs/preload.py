"""Preload for shared clusters: ``dask scheduler --preload daskjobs.preload``.

Loads :class:`daskjobs.JobsPlugin` into the scheduler. Options after the preload
override the ``daskjobs`` section of dask's config::

    dask scheduler --preload daskjobs.preload --daskjobs-policy lpt \\
        --daskjobs-history /shared/daskjobs-history.json

(``plugins/daskjobs_scheduler.py`` is the same preload as a file.) Workers need
nothing: the plugin installs its worker plugin itself.

A scheduler that cannot run the plugin as configured does not start
-----------------------------------------------------------------------
An operator who loads the plugin relies on it: a scheduler that serves plain dask
after logging an error would be worse than one that stops. So every setting is
checked before the scheduler serves anyone:

* ``dask scheduler --preload ...``: dask parses the options after ``--preload``
  while it reads its command line; :class:`_SetupCommand` then also checks the
  whole ``daskjobs`` configuration, so a bad option (click's ``Invalid value``
  message, exit code 2) or a bad setting (``Error: daskjobs.<key>: expected ...``,
  exit code 1) ends the command before the scheduler is created.
  ``--daskjobs-policy`` takes any name and leaves the check to
  :func:`daskjobs.config.settings`, which names the policies the plugin can run: dask
  imports every ``--preload`` module before it parses these options, so a policy that
  another preload registers, before or after this one, is known by then (a list of
  names taken when this module was imported would refuse it).
* a preload named in dask's config (``distributed.scheduler.preload``) or passed to
  ``Scheduler(preload=...)``: dask runs ``dask_setup`` while the scheduler starts and
  only *logs* an exception raised there (distributed 2026.8,
  ``preloading.PreloadManager.start``), so ``dask_setup`` does not raise: it adds a
  plugin whose ``start`` raises the error. dask fails a scheduler whose plugin fails
  to start (``Scheduler failed to start``, caused by the ``ValueError`` naming the
  key): the scheduler closes and ``dask scheduler`` exits non-zero.
"""

from __future__ import annotations

import logging
from typing import Any

import click
from distributed.diagnostics.plugin import SchedulerPlugin

from daskjobs.config import jobs_settings, settings

__all__ = ["dask_setup"]

logger = logging.getLogger("daskjobs.preload")

#: the parameter that carries an error of the options to ``dask_setup`` (see make_context)
_ERROR = "daskjobs_error"


def _overrides(params: dict[str, Any]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    if params.get("daskjobs_policy"):
        overrides["policy"] = params["daskjobs_policy"]
    if params.get("daskjobs_history"):
        overrides["history"] = {"path": params["daskjobs_history"]}
    if params.get("daskjobs_record"):
        overrides["record"] = params["daskjobs_record"]
    return overrides


def _jobs_overrides(params: dict[str, Any]) -> dict[str, Any]:
    if params.get("daskjobs_ledger"):
        return {"ledger": {"url": params["daskjobs_ledger"]}, "jobs": {"enabled": True}}
    return {}


def _path(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and (not value or "\x00" in value):
        raise click.BadParameter(f"expected a file path, got {value!r}")
    return value


class _SetupCommand(click.Command):
    """``dask_setup``'s command: checks the configuration with the options."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        try:
            settings(**_overrides(ctx.params))
            jobs_settings(**_jobs_overrides(ctx.params))
        except ValueError as e:
            message = str(e)
            if ctx.params.get("daskjobs_policy") and message.startswith("daskjobs.policy:"):
                # the option names the policy (it overrides the config): its usage error
                (param,) = [p for p in self.params if p.name == "daskjobs_policy"]
                raise click.BadParameter(message, ctx=ctx, param=param) from None
            raise click.ClickException(message) from None
        return rest

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        # dask calls this while the scheduler starts and swallows what it raises (then
        # runs plain dask): hand the error to the callback instead, which refuses.
        given = list(args)  # click consumes the list it parses
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.ClickException as e:
            ctx = click.Context(self, info_name=info_name, parent=parent, **extra)
            message = e.format_message()
            if isinstance(e, click.UsageError) and not message.startswith("daskjobs"):
                message = f"daskjobs preload options {' '.join(given)}: {message}"
            ctx.params = {_ERROR: message}
            return ctx


class _Refusal(SchedulerPlugin):
    """A scheduler plugin whose start fails, so that the scheduler does not start."""

    name = "daskjobs"

    def __init__(self, message: str) -> None:
        self.message = message

    async def start(self, scheduler: Any) -> None:
        raise ValueError(self.message)


@click.command(cls=_SetupCommand)
@click.option(
    "--daskjobs-policy",
    type=str,
    default=None,
    metavar="NAME",
    help="how the scheduler orders runnable tasks: any registered policy the plugin can run "
    "(default: daskjobs.policy in dask's config)",
)
@click.option(
    "--daskjobs-history",
    default=None,
    callback=_path,
    help="JSON file of measured stage durations, kept across restarts",
)
@click.option(
    "--daskjobs-record",
    default=None,
    callback=_path,
    help="write a trace of the run (JSON Lines) to this file",
)
@click.option(
    "--daskjobs-ledger",
    default=None,
    metavar="URL",
    help="run the jobs service on this ledger (sqlite:///PATH or postgresql+psycopg://...); "
    "default: daskjobs.ledger.url, with daskjobs.jobs.enabled",
)
def dask_setup(scheduler: Any, **params: Any) -> None:
    """Add :class:`daskjobs.JobsPlugin` (and, when jobs are enabled, the jobs service
    :class:`daskjobs.jobs.JobsService`) to ``scheduler``, or make its start fail."""
    message = params.get(_ERROR)
    service: Any = None
    if message is None:
        from daskjobs.plugin import JobsPlugin

        try:
            plugin: Any = JobsPlugin(**_overrides(params))
            jobs = jobs_settings(**_jobs_overrides(params))
            if jobs.enabled:
                from daskjobs.jobs.service import JobsService

                service = JobsService(ledger=jobs.ledger_url)
        except ValueError as e:
            message = str(e)
    if message is not None:
        logger.error("daskjobs: the scheduler will not start: %s", message)
        plugin = _Refusal(message)
    scheduler.add_plugin(plugin)
    if service is not None:
        scheduler.add_plugin(service)
