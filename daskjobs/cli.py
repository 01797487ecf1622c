"""The ``daskjobs`` command, and the same commands as ``dask jobs``.

Follows dask's own CLI conventions (click, one group, subcommands). The
subcommands are the same click objects under both names: ``daskjobs status
ADDRESS`` and ``dask jobs status ADDRESS`` run one function.

``dask jobs`` comes from dask's ``dask_cli`` entry point group (pyproject.toml:
``[project.entry-points.dask_cli] jobs = "daskjobs.cli:jobs"``): ``dask``
(``dask.cli.run_cli``) loads *every* entry point of that group each time it runs,
``dask scheduler`` and ``dask worker`` included. So importing this module loads
only click and ``daskjobs`` itself; each subcommand's module is imported when that
subcommand is looked up (:class:`LazyGroup`), which also keeps ``daskjobs --help``
fast.
"""

from __future__ import annotations

import importlib

import click

import daskjobs

__all__ = ["COMMANDS", "LazyGroup", "jobs", "main"]

#: Subcommand name -> "module:attribute" of its click command.
COMMANDS: dict[str, str] = {
    "simulate": "daskjobs.sim.cli:simulate",
    "cache": "daskjobs.cache.cli:cache",
    "status": "daskjobs.plugin.client.cli:status_command",
    "explain": "daskjobs.plugin.client.cli:explain_command",
    "forecast": "daskjobs.plugin.client.cli:forecast_command",
    "estimates": "daskjobs.plugin.client.estimates_cli:estimates_command",
    "start-rate": "daskjobs.plugin.client.cli:start_rate_command",
    "replay": "daskjobs.replay.cli:replay",
    "ledger": "daskjobs.jobs.cli:jobs_command",
}

#: Old subcommand names: still run, with a one-line deprecation on stderr, and not listed
#: (``daskjobs jobs ls`` read ``dask jobs jobs ls`` as part of ``dask``).
DEPRECATED: dict[str, str] = {"jobs": "ledger"}

_CONTEXT = {"help_option_names": ["-h", "--help"]}


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"daskjobs, version {daskjobs.__version__}")
        ctx.exit()


#: ``--version``; the version (installed metadata) is looked up only when asked for.
_version_option = click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and exit.",
)


class LazyGroup(click.Group):
    """A click group whose subcommands (:data:`COMMANDS`) are imported on first lookup."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *super().list_commands(ctx)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        new = DEPRECATED.get(cmd_name)
        if new is not None and new in COMMANDS:
            prog = ctx.command_path
            click.echo(
                f"'{prog} {cmd_name}' is now '{prog} {new}' (the old name will be removed)",
                err=True,
            )
            cmd_name = new
        target = COMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, _, attr = target.partition(":")
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command), target
        return command


@click.group("daskjobs", cls=LazyGroup, context_settings=_CONTEXT)
@_version_option
def main() -> None:
    """Finish dask sweeps sooner and more fairly: simulate, cache, schedule."""


@click.group("jobs", cls=LazyGroup, context_settings=_CONTEXT)
@_version_option
def jobs() -> None:
    """daskjobs: simulate, replay, cache, plugin status.

    The `daskjobs` command as part of `dask`: `dask jobs status ADDRESS` is
    `daskjobs status ADDRESS`, and so on for each subcommand.
    """


if __name__ == "__main__":  # pragma: no cover
    main()
