"""The ``daskjobs`` command.

Follows dask's own CLI conventions (click, one group, subcommands). Each
subcommand imports what it needs when it runs, so ``daskjobs --help`` is fast.
"""

from __future__ import annotations

import click

from daskjobs import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="daskjobs")
def main() -> None:
    """Finish dask sweeps sooner and more fairly: simulate, cache, schedule."""


def _register() -> None:
    from daskjobs.cache.cli import cache
    from daskjobs.plugin.cli import status_command
    from daskjobs.replay.cli import replay
    from daskjobs.sim.cli import simulate

    main.add_command(simulate)
    main.add_command(cache)
    main.add_command(status_command)
    main.add_command(replay)


_register()

if __name__ == "__main__":  # pragma: no cover
    main()
