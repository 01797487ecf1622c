"""``daskjobs status ADDRESS``: what the plugin on a running scheduler is doing.

Connects a client to the scheduler, asks the plugin for its status (the
``daskjobs_status`` handler, as :func:`daskjobs.plugin.client.status` does) and
prints the policy, the teams table (fair share), the measured stages, the
counters and the errors the plugin swallowed. ``--json`` prints the status as
one JSON object instead. Exits with status 1 and a message naming the problem
when the scheduler cannot be reached within ``--timeout`` or does not run the
plugin.
"""

from __future__ import annotations

import json
import math
from typing import Any

import click

# keys of plugin.status() printed in their own sections; any other is a counter
_SECTIONS = ("policy", "teams", "workers", "stages", "errors", "settings")


def _num(x: Any, fmt: str = ".3g") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return format(x, fmt) if isinstance(x, float) else str(x)


def fetch_status(address: str, timeout: str) -> dict[str, Any]:
    """The plugin's status on the scheduler at ``address``; :class:`click.ClickException`
    naming the problem if it cannot be reached or does not run the plugin."""
    from dask.utils import parse_timedelta
    from distributed import Client

    from daskjobs.plugin.client import status

    try:
        seconds = parse_timedelta(timeout, default="seconds")
    except (TypeError, ValueError, KeyError):
        raise click.BadParameter(
            f"expected a duration such as '10s', got {timeout!r}", param_hint="--timeout"
        ) from None
    try:
        client = Client(address, timeout=seconds, set_as_default=False)
    except (OSError, TimeoutError) as e:
        raise click.ClickException(
            f"cannot reach a dask scheduler at {address!r} within {timeout}: {e}"
        ) from None
    try:
        return status(client)
    except RuntimeError as e:  # the plugin is not loaded
        raise click.ClickException(f"scheduler {address}: {e}") from None
    finally:
        client.close()


def render(st: dict[str, Any], address: str) -> str:
    """The status as text: policy, teams, stages, counters, errors."""
    lines = [f"scheduler {address}", f"policy    {st.get('policy')}"]
    overrides = st.get("overrides") or {}
    if overrides:
        lines.append(f"overrides {json.dumps(overrides, sort_keys=True, default=str)}")
    teams = st.get("teams") or []
    lines.append("")
    if teams:
        lines.append(
            f"{'team':<20} {'share':>7} {'usage':>10} {'running':>8} {'queued':>8} {'quota':>6}"
        )
        for row in teams:
            lines.append(
                f"{row['team']:<20} {_num(row.get('share'), '.2f'):>7} "
                f"{_num(row.get('usage')):>10} {_num(row.get('running')):>8} "
                f"{_num(row.get('queued')):>8} {_num(row.get('quota')):>6}"
            )
    else:
        lines.append("teams: none (fair share is off; policy orders tasks by estimate)")
    workers = st.get("workers") or []
    lines.append("")
    if workers:
        lines.append(f"{'worker':<40} {'speed':>7} {'samples':>8}  (speed: slow-down, 1 = nominal)")
        for w in workers:
            label = w["worker"] if w.get("present", True) else f"{w['worker']} (gone)"
            lines.append(f"{label:<40} {_num(w['speed'], '.2f'):>7} {w['samples']:>8}")
    else:
        lines.append("workers: no finished task with an estimate yet")
    stages = st.get("stages") or {}
    lines.append("")
    if stages:
        lines.append(f"{'stage':<32} {'samples':>8} {'median (s)':>11}")
        for name, row in stages.items():
            lines.append(f"{name:<32} {row['samples']:>8} {_num(row['median'], '.4g'):>11}")
    else:
        lines.append("stages: none measured yet")
    counters = {k: v for k, v in st.items() if k not in _SECTIONS}
    lines.append("")
    for k, v in sorted(counters.items()):
        if isinstance(v, dict | list):
            shown = json.dumps(v, sort_keys=True, default=str)
        else:
            shown = "-" if v is None else str(v)
        lines.append(f"{k:<16} {shown}")
    errors = st.get("errors") or {}
    if errors:
        lines.append("errors (exceptions swallowed by plugin hooks; see the scheduler log):")
        for hook, n in sorted(errors.items()):
            lines.append(f"  {hook:<14} {n}")
    else:
        lines.append("errors           none")
    return "\n".join(lines)


@click.command("status", short_help="What the daskjobs plugin on a scheduler is doing.")
@click.argument("address")
@click.option(
    "--timeout",
    default="10s",
    show_default=True,
    metavar="DURATION",
    help="Give up connecting after this long.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status_command(address: str, timeout: str, as_json: bool) -> None:
    """Policy, teams, measured stages and counters of the daskjobs plugin on ADDRESS.

    ADDRESS is the scheduler's address, e.g. tcp://10.0.0.5:8786.
    """
    st = fetch_status(address, timeout)
    if as_json:
        click.echo(json.dumps({"address": address, **st}, sort_keys=True, default=str))
    else:
        click.echo(render(st, address))
