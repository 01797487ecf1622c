"""The options several ``daskjobs`` subcommands share, written once: one name, one type and
one wording each wherever they appear (tests/test_cli_help.py walks every command's help)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

__all__ = [
    "JSON_HELP",
    "count_option",
    "hours_option",
    "json_option",
    "load_option",
    "plot_option",
    "seed_option",
    "seeds_option",
    "timeout_option",
]

F = TypeVar("F", bound=Callable[..., Any])

#: What ``--json`` does, in every command that has it.
JSON_HELP = "Print one JSON object instead of the text."

#: ``--json``: the command's output as one JSON object on stdout.
json_option = click.option("--json", "as_json", is_flag=True, help=JSON_HELP)

#: ``--timeout`` of the commands that connect to a scheduler.
timeout_option = click.option(
    "--timeout",
    default="10s",
    show_default=True,
    metavar="DURATION",
    help="Give up connecting to a scheduler after this long.",
)


def count_option(
    *names: str, help: str, minimum: int = 1, default: int | None = None, metavar: str | None = "N"
) -> Callable[[F], F]:
    """An option that takes a count (or an index): an integer >= ``minimum``. ``default``
    None means the command's own choice, which ``help`` says; any other default is shown.
    ``metavar`` None lets click name the type (``INTEGER RANGE``)."""
    return click.option(
        *names,
        type=click.IntRange(min=minimum),
        default=default,
        show_default=None if default is None else True,
        metavar=metavar,
        help=help,
    )


def seed_option(help: str, metavar: str | None = "N") -> Callable[[F], F]:
    """``--seed N``: one seed (an integer >= 0), 0 by default."""
    return count_option("--seed", minimum=0, default=0, metavar=metavar, help=help)


def seeds_option(default: str, help: str) -> Callable[[F], F]:
    """``--seeds LIST``: N, N-M, or a comma-separated list of them."""
    return click.option("--seeds", default=default, show_default=True, metavar="LIST", help=help)


def plot_option(help: str) -> Callable[[F], F]:
    """``--plot DIR``: write figures into DIR (``plot_dir``, None by default)."""
    return click.option(
        "--plot",
        "plot_dir",
        type=click.Path(file_okay=False, dir_okay=True, writable=True, path_type=Path),
        default=None,
        metavar="DIR",
        help=help,
    )


def hours_option(minimum: float, default: float) -> Callable[[F], F]:
    """``--hours``: hours of arrivals of a synthetic workload."""
    return click.option(
        "--hours",
        type=click.FloatRange(min=minimum),
        default=default,
        show_default=True,
        help="Hours of arrivals.",
    )


def load_option(minimum: float, maximum: float, default: float) -> Callable[[F], F]:
    """``--load``: the offered GPU load of a synthetic workload."""
    return click.option(
        "--load",
        type=click.FloatRange(min=minimum, max=maximum),
        default=default,
        show_default=True,
        help="Offered GPU load (1.0: arrivals ask for the whole cluster on average).",
    )
