"""``daskjobs replay TRACE``: a recorded run, replayed and asked what-if questions.

Prints the recorded makespan, the makespan replayed under the policy that ran
on the cluster that ran it (the calibration error), then one row per policy x
cluster: the recorded cluster, and the changed one when ``--nodes``,
``--cores-per-node`` or ``--no-slow`` is given. ``--json`` prints exactly one
JSON object instead; ``--plot DIR`` writes the figures; ``--scale N`` adds a
synthetic sweep of N tasks drawn from the trace's per-stage durations.

``--task-stream`` reads TRACE as a ``client.get_task_stream()`` dump instead (a
JSON list of records, or ``{"task_stream": [...], "deps": ...}``); what a task
stream lacks is printed as notes (``daskjobs.replay.stream``).

A bad trace is one line naming the file, line and field (``Error: cannot replay:
run.jsonl:17: 'finished' record: field 'duration' ...``) and exit status 2, never
a traceback; so is a file that cannot be read.

``--policy`` takes any registered policy (``daskjobs.policies.registry``): the
built-in ones, those of installed packages' ``daskjobs.policies`` entry points, and
those a module or file given with ``--import`` registers (docs/how-to/write-a-policy.md).
"""

from __future__ import annotations

from pathlib import Path

import click

from daskjobs._options import count_option, json_option, plot_option, seed_option
from daskjobs.replay.run import POLICIES
from daskjobs.sim.cli import IMPORT_OPTION, check_plotting, emit_report, policy_option


class BadTrace(click.ClickException):
    """A trace that cannot be replayed: its one-line message, exit status 2."""

    exit_code = 2


def _speculation(value: str | None) -> float | None:
    if value is None or value.lower() == "off":
        return None
    try:
        factor = float(value)
    except ValueError:
        raise click.BadParameter(
            f"expected a late factor > 1 (e.g. 2.5) or 'off', got {value!r}",
            param_hint="--speculation",
        ) from None
    if not factor > 1.0:
        raise click.BadParameter(
            f"the late factor must be > 1, got {value}", param_hint="--speculation"
        )
    return factor


@click.command(short_help="Replay a recorded trace in the simulator; ask what-if questions.")
@click.argument("trace", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@IMPORT_OPTION
@policy_option(
    "Policy of the what-if rows, any registered name (repeat for several; default: "
    f"the built-in ones, {', '.join(POLICIES)})."
)
@click.option(
    "--speculation",
    default=None,
    metavar="FACTOR|off",
    help="Back up attempts late by FACTOR x their estimate in the what-ifs (default off).",
)
@count_option("--nodes", help="What-if on N nodes (default: the recorded cluster's).")
@count_option(
    "--cores-per-node",
    metavar="C",
    help="What-if with C cores a node (default: the recorded cluster's).",
)
@click.option("--no-slow", is_flag=True, help="What-if without the slow workers.")
@count_option(
    "--scale", help="Also simulate a synthetic sweep of N tasks with the measured stage durations."
)
@seed_option("Seed of the replay's random draws (an integer >= 0).")
@click.option(
    "--task-stream",
    "task_stream",
    is_flag=True,
    help="TRACE is a client.get_task_stream() dump (JSON), not a recorded trace.",
)
@json_option
@plot_option('Write busy-slots and what-if figures into DIR (needs "daskjobs[plot]").')
def replay(
    trace: Path,
    policies: tuple[str, ...],
    speculation: str | None,
    nodes: int | None,
    cores_per_node: int | None,
    no_slow: bool,
    scale: int | None,
    seed: int,
    task_stream: bool,
    as_json: bool,
    plot_dir: Path | None,
) -> None:
    """Replay TRACE (a trace written by the recording plugin, docs/reference/trace-format.md).

    The replay is calibrated: per-task overhead, start-up latency and worker
    speeds are fitted from the trace (docs/explanation/replay.md). With --task-stream, TRACE
    is a client.get_task_stream() dump (no estimates, teams or submit times;
    dependencies only if the file gives them).
    """
    from daskjobs.replay.load import load
    from daskjobs.replay.report import format_report, replay_report
    from daskjobs.trace import TraceError

    factor = _speculation(speculation)
    check_plotting(plot_dir)
    try:
        if task_stream:
            from daskjobs.replay.stream import from_task_stream

            loaded = from_task_stream(trace)
        else:
            loaded = load(trace)
    except TraceError as exc:
        raise BadTrace(f"cannot replay: {exc}") from None
    except OSError as exc:
        raise BadTrace(f"cannot replay: cannot read {trace}: {exc.strerror or exc}") from None
    clusters: list[tuple[int | None, int | None, bool]] = [(None, None, False)]
    if nodes is not None or cores_per_node is not None or no_slow:
        clusters.append((nodes, cores_per_node, no_slow))
    try:
        report, base, _rows = replay_report(
            loaded, policies or POLICIES, clusters, factor, seed, scale
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    figures: list[Path] = []
    if plot_dir is not None:
        from daskjobs.replay.plot import busy_slots, what_if_bars

        figures = [
            busy_slots(loaded, base, plot_dir / "replay-busy.png"),
            what_if_bars(report, plot_dir / "replay-what-if.png"),
        ]
    emit_report(report, as_json, lambda: format_report(report), figures, default=str)
