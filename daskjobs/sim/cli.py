"""``daskjobs simulate``: run the reference experiments (docs/explanation/chapter.md) from the
shell.

Subcommands ``chapter``, ``fairshare`` and ``graph`` each run one experiment of
:mod:`daskjobs.sim.report`, ``preemption`` the job-level preemption experiment of
:mod:`daskjobs.sim.preemption` (docs/explanation/preemption.md), ``gangs`` the resource-vector and
gang experiment of :mod:`daskjobs.sim.gangs` (docs/explanation/resources.md), ``estimates`` sweeps
without estimates under stage medians, the learner and true estimates
(:func:`daskjobs.sim.report.run_estimates`, docs/explanation/simulator.md); each prints an aligned
table, with the published figures beside the measured ones where there are any (``--json``:
exactly one JSON object on stdout instead). ``--plot DIR`` also writes PNG figures (needs the
``plot`` extra). Progress goes to stderr, so stdout stays clean for pipes.

``--policy NAME`` (repeat it) runs an experiment under those policies instead of
the reference set: any name of the policy registry (:mod:`daskjobs.policies.registry`),
including a user's, registered by an installed package's entry point or by a
module given with ``daskjobs simulate --import MODULE|FILE`` (docs/how-to/write-a-policy.md).

Follows dask's CLI conventions: click, ``-h/--help`` on every command, errors
as click usage errors naming the bad option.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import click

from daskjobs._options import (
    count_option,
    hours_option,
    json_option,
    load_option,
    plot_option,
    seed_option,
    seeds_option,
)
from daskjobs._text import table
from daskjobs.policies.preemption import PREEMPTION_POLICIES

F = TypeVar("F", bound=Callable[..., Any])

#: The chapter sweep's share of long tasks (40 of 10,000), kept when --tasks changes n.
_LONG_SHARE = 40 / 10_000
_N_FEATURES = 100


_WORKLOAD_SEEDS = "Seeds of the synthetic workload: N, N-M, or a comma-separated list of them."


def _common_options(f: F) -> F:
    """--seed, --json, --plot and the workload overrides shared by every subcommand."""
    options = [
        seed_option("Seed of the workload and of the failure draws (an integer >= 0)."),
        json_option,
        plot_option('Also write PNG figures into DIR (needs: pip install "daskjobs[plot]").'),
        count_option(
            "--slow-node",
            minimum=0,
            metavar="INDEX",
            help="Index of the 4x slow node (default: the last node; 0 = offered work first).",
        ),
        click.option(
            "--failure-rate",
            type=click.FloatRange(min=0.0, max=1.0, max_open=True),
            default=None,
            metavar="P",
            help="Probability that an attempt fails, in [0, 1) (default 0.01).",
        ),
        count_option(
            "--tasks",
            "n_tasks",
            help="Number of backtests (default 10,000); the long ones stay 0.4% of them.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _synthetic_options(
    seeds: str, hours: tuple[float, float], load: tuple[float, float, float]
) -> Callable[[F], F]:
    """--seeds, --hours and --load of a synthetic workload: the default seeds, ``hours`` as
    (minimum, default), ``load`` as (minimum, maximum, default)."""

    def decorate(f: F) -> F:
        return seeds_option(seeds, _WORKLOAD_SEEDS)(hours_option(*hours)(load_option(*load)(f)))

    return decorate


def import_policies(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> None:
    """``--import MODULE|FILE``: register the policies it defines (before ``--policy``)."""
    from daskjobs.policies import registry

    for spec in value:
        try:
            registry.import_policies(spec)
        except ValueError as e:
            raise click.BadParameter(str(e), ctx=ctx, param=param) from None


def policy_names(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> tuple[str, ...]:
    """``--policy NAME``: any registered name; an unknown one lists the known ones."""
    from daskjobs.policies import registry

    known = registry.names()
    for name in value:
        if name not in known:
            raise click.BadParameter(
                f"unknown policy {name!r}; choose one of: {', '.join(known)}",
                ctx=ctx,
                param=param,
            )
    return value


IMPORT_OPTION = click.option(
    "--import",
    "imports",
    multiple=True,
    metavar="MODULE|FILE",
    is_eager=True,
    expose_value=False,
    callback=import_policies,
    help="Import a module (or run a .py file) that registers policies; repeat for several.",
)


#: What --policy does in the simulate subcommands that take any registered policy.
_POLICY_HELP = "Run under this registered policy instead of the reference set (repeat for several)."


def policy_option(help: str = _POLICY_HELP) -> Callable[[F], F]:
    """--policy NAME (repeatable, ``policies``): any registered policy, checked by name."""
    return click.option(
        "--policy", "policies", multiple=True, metavar="NAME", callback=policy_names, help=help
    )


def _check_policies(policies: tuple[str, ...], make: Callable[[str], Any]) -> list[str] | None:
    """The policies of --policy (None: the reference set), each made once so that a policy that
    cannot be made here (one that needs settings) is a usage error naming it."""
    if not policies:
        return None
    for name in policies:
        try:
            make(name)
        except (TypeError, ValueError) as exc:
            raise click.BadParameter(str(exc), param_hint="--policy") from None
    return list(policies)


def _workload_kwargs(
    slow_node: int | None, failure_rate: float | None, n_tasks: int | None
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if slow_node is not None:
        kwargs["slow_node"] = slow_node
    if failure_rate is not None:
        kwargs["failure_rate"] = failure_rate
    if n_tasks is not None:
        kwargs["n"] = n_tasks
        kwargs["n_long"] = round(n_tasks * _LONG_SHARE)
    return kwargs


def check_plotting(plot_dir: Path | None) -> None:
    """Fail before any run if --plot was asked for and matplotlib is missing."""
    if plot_dir is None:
        return
    from daskjobs.sim.plot import PlotError, require_matplotlib

    try:
        require_matplotlib()
    except PlotError as exc:
        raise click.UsageError(f"--plot: {exc}") from None


@contextmanager
def _progress(label: str, runs: int) -> Iterator[Callable[[str], None]]:
    """A progress bar over ``runs`` simulations on stderr; yields the per-run callback.

    When stderr is not a terminal (redirected to a file or a pipe, as under ``nohup`` or
    a CI log) a bar cannot redraw, and click's writes nothing until the end: then each
    finished run is one line, written and flushed as it is computed."""
    if not _is_terminal(sys.stderr):
        done_runs = 0

        def line(done: str) -> None:
            nonlocal done_runs
            done_runs += 1
            sys.stderr.write(f"{label}: {done_runs}/{runs} done: {done}\n")
            sys.stderr.flush()

        yield line
        return
    bar: Any = click.progressbar(
        length=runs,
        label=label,
        file=sys.stderr,
        show_pos=True,
        show_eta=False,
        item_show_func=lambda done: f"done: {done}" if done else None,
    )
    with bar:

        def advance(done: str) -> None:
            bar.update(1, current_item=done)

        yield advance


def _is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def _run(
    runner: Callable[..., Any], label: str, runs: int, seed: Any, kwargs: dict[str, Any]
) -> Any:
    """Call a ``run_*`` function (``seed``: a seed, or a list of them for the
    ``*_seeds`` reports) under a progress bar; bad workload input is a usage error."""
    with _progress(label, runs) as advance:
        try:
            return runner(seed, progress=advance, **kwargs)
        except ValueError as exc:
            raise click.UsageError(f"invalid workload: {exc}") from None


def _num(x: float | None, fmt: str = ".2f") -> str:
    return "—" if x is None else format(x, fmt)


def emit_report(
    report: dict[str, Any],
    as_json: bool,
    text: str | Callable[[], str],
    figures: list[Path],
    default: Callable[[Any], Any] | None = None,
) -> None:
    """A report as one JSON object (``--json``; ``default`` as :func:`json.dumps` takes it)
    or as ``text`` (a callable is called only then), each figure written named after it."""
    if as_json:
        if figures:
            report = {**report, "figures": [str(p) for p in figures]}
        click.echo(json.dumps(report, indent=2, allow_nan=False, default=default))
        return
    click.echo(text if isinstance(text, str) else text())
    for p in figures:
        click.echo(f"wrote {p}")


def _report_text(head: str, headers: list[str], rows: list[list[str]], *notes: str) -> str:
    """A report as text: its head line, a blank line, the table, a blank line, the notes."""
    return "\n".join([head, "", table(headers, rows), "", *notes])


def emit_table(
    report: dict[str, Any],
    as_json: bool,
    head: str,
    headers: list[str],
    rows: list[list[str]],
    *notes: str,
    figures: Sequence[Path] = (),
) -> None:
    """:func:`emit_report` of a report whose text is a table (:func:`_report_text`)."""
    emit_report(report, as_json, _report_text(head, headers, rows, *notes), list(figures))


def _figure(plot_dir: Path | None, draw: str, report: dict[str, Any], name: str) -> list[Path]:
    """With --plot, ``[daskjobs.sim.plot.<draw>(report, plot_dir / name)]``, the figure it
    wrote; without, ``[]`` (the plotting module is imported only when asked for)."""
    if plot_dir is None:
        return []
    from daskjobs.sim import plot

    return [getattr(plot, draw)(report, plot_dir / name)]


#: The leading columns of the chapter tables: a run is a policy, without or with backups.
_RUN_COLUMNS = ["policy", "backups"]


def _run_cells(row: dict[str, Any]) -> list[str]:
    """The :data:`_RUN_COLUMNS` of a row of a chapter report."""
    return [row["policy"], "yes" if row["backups"] else "no"]


def _workload_line(report: dict[str, Any]) -> str:
    slow = ", ".join(f"node {k} {v:g}x slower" for k, v in report["slow_nodes"].items()) or "none"
    return (
        f"{report['tasks']:,} tasks on {report['nodes']} nodes / {report['cores']} cores; "
        f"slow: {slow}; failure rate {report['failure_rate']:g}; seed {report['seed']}"
        + ("; backups with the end game" if report.get("endgame") else "")
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@IMPORT_OPTION
def simulate() -> None:
    """Run the reference experiments in the offline simulator.

    The reference workload is the sweep of a published study of scheduling
    parameter sweeps (a book chapter, hence the command's name): 10,000 backtests on 24
    nodes x 16 cores, one node 4x slower (docs/explanation/chapter.md, "The reference
    workload"). Every policy of an experiment runs on the same generated tasks and faces
    the same failures (common random numbers), so differences are the policies'. The
    study's published figures (one random draw) are shown beside ours.
    """


class ExperimentOptions(NamedTuple):
    """What every experiment on the reference workload is given (:func:`experiment_command`)."""

    seed: int
    as_json: bool
    plot_dir: Path | None
    slow_node: int | None
    failure_rate: float | None
    n_tasks: int | None
    policies: tuple[str, ...]


def experiment_command(short_help: str) -> Callable[[Callable[..., None]], click.Command]:
    """A ``simulate`` subcommand on the reference workload: ``--seed``, ``--json``, ``--plot``,
    the workload overrides and ``--policy``, handed to the function as one
    :class:`ExperimentOptions` (its first argument); its own options follow as keywords."""

    def decorate(f: Callable[..., None]) -> click.Command:
        @functools.wraps(f)
        def command(**kwargs: Any) -> None:
            options = ExperimentOptions(**{k: kwargs.pop(k) for k in ExperimentOptions._fields})
            f(options, **kwargs)

        return simulate.command(short_help=short_help)(_common_options(policy_option()(command)))

    return decorate


def _parse_seeds(text: str) -> list[int]:
    """``"0-19"``, ``"0,3,5"`` or ``"0-4,9"`` -> the seeds, in order, once each."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not (lo.isdigit() and (not sep or hi.isdigit())):
            raise click.BadParameter(
                f"{part!r} is not a seed (N) or a range (N-M) of integers >= 0",
                param_hint="--seeds",
            )
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise click.BadParameter(f"empty range {part!r}", param_hint="--seeds")
        seeds.extend(x for x in range(a, b + 1) if x not in seeds)
    return seeds


@experiment_command("The reference sweep under every policy, with and without backups.")
@click.option(
    "--seeds",
    "seed_list",
    default=None,
    metavar="RANGE",
    help="Run every seed of RANGE (e.g. 0-19 or 0,3,5) and print each row's spread "
    "(median, min, max) instead of one seed's table.",
)
@click.option(
    "--endgame",
    is_flag=True,
    help="Backups with the end game: once nothing waits to start, idle nodes take "
    "copies of the running attempts expected to end last (Speculation(endgame=True)).",
)
def chapter(options: ExperimentOptions, seed_list: str | None, endgame: bool) -> None:
    """The published study's sweep: 10,000 backtests on 384 cores, one node 4x slow.

    Runs fifo, lpt, work-stealing and node-aware, each without and with
    backup copies of late attempts, and lpt on the cluster without its slow
    node; prints makespan, node-hours, backups launched, wasted core-hours and
    the ratios to the lower, speed-weighted and failure-aware bounds, beside
    the published makespan. With --seeds, the same over many seeds. With
    --policy, each of those policies without and with backups instead.
    """
    from daskjobs.policies import make_policy
    from daskjobs.sim.report import chapter_runs, run_chapter

    kwargs: dict[str, Any] = _workload_kwargs(
        options.slow_node, options.failure_rate, options.n_tasks
    )
    if endgame:
        kwargs["endgame"] = True
    kwargs["policies"] = _check_policies(options.policies, make_policy)
    runs = len(chapter_runs(kwargs["policies"]))
    if seed_list is not None:
        if options.plot_dir is not None:
            raise click.UsageError("--plot draws one seed's run: use it without --seeds")
        if options.seed:
            raise click.UsageError("give either --seed or --seeds, not both")
        _chapter_seeds(_parse_seeds(seed_list), options.as_json, kwargs, runs)
        return
    check_plotting(options.plot_dir)
    report, schedules = _run(run_chapter, "chapter sweep", runs, options.seed, kwargs)

    figures: list[Path] = []
    if options.plot_dir is not None:
        from daskjobs.sim import plot

        candidates = [r for r in report["rows"] if r["policy"] != "lpt-no-slow-node"]
        best = min(candidates, key=lambda r: r["makespan_h"])
        best_label = best["policy"] + (" +backups" if best["backups"] else "")
        first = report["rows"][0]["policy"]  # fifo, in the published table
        lines = {first: schedules[(first, False)]}
        if (best["policy"], best["backups"]) != (first, False):
            lines[best_label] = schedules[(best["policy"], best["backups"])]
        figures.append(
            plot.chapter_utilisation(lines, options.plot_dir / "chapter-utilisation.png")
        )
        figures.append(plot.chapter_makespans(report, options.plot_dir / "chapter-makespan.png"))

    headers = [
        *_RUN_COLUMNS,
        "makespan h",
        "published",
        "node-h",
        "launched",
        "waste core-h",
        "failures",
        "vs LB",
        "vs SB",
        "vs FB",
    ]
    rows = [
        [
            *_run_cells(r),
            _num(r["makespan_h"]),
            _num(r["published_makespan_h"]),
            _num(r["node_hours"], ".1f"),
            str(r["backups_launched"]),
            _num(r["waste_core_h"], ".1f"),
            str(r["failures"]),
            _num(r["vs_lower_bound"], ".3f"),
            _num(r["vs_speed_bound"], ".3f"),
            _num(r["vs_failure_bound"], ".3f"),
        ]
        for r in report["rows"]
    ]
    pub = report["published"]
    emit_table(
        report,
        options.as_json,
        _workload_line(report),
        headers,
        rows,
        f"work {report['work_core_h']:,.0f} core-h (published {pub['work_core_h']:,.0f})",
        f"lower bound (LB) {report['lower_bound_h']:.2f} h (published {pub['lower_bound_h']:.2f})",
        f"speed bound (SB) {report['speed_bound_h']:.2f} h "
        f"(published {pub['speed_bound_h']:.2f}); lpt-no-slow-node is measured against "
        "its own cluster's bounds",
        f"failure bound (FB) {report['failure_bound_h']:.2f} h: the speed bound plus what "
        "this seed's failures cost any schedule that restarts failed tasks",
        figures=figures,
    )


def _chapter_seeds(seeds: list[int], as_json: bool, kwargs: dict[str, Any], runs: int) -> None:
    from daskjobs.sim.report import chapter_seeds_report

    label = f"chapter sweep, {len(seeds)} seeds"
    report = _run(chapter_seeds_report, label, len(seeds) * runs, seeds, kwargs)
    n = len(seeds)

    def spread(d: dict[str, float], fmt: str) -> str:
        return f"{d['median']:{fmt}} ({d['min']:{fmt}}-{d['max']:{fmt}})"

    headers = [
        *_RUN_COLUMNS,
        "published",
        "makespan h: median (min-max)",
        "vs SB",
        "vs FB",
        "SB+1.2%",
        "FB+1.2%",
    ]
    rows = [
        [
            *_run_cells(r),
            _num(r["published_makespan_h"]),
            spread(r["makespan_h"], ".2f"),
            spread(r["vs_speed_bound"], ".3f"),
            spread(r["vs_failure_bound"], ".3f"),
            f"{r['within_1_2pct_of_speed_bound']}/{n}",
            f"{r['within_1_2pct_of_failure_bound']}/{n}",
        ]
        for r in report["rows"]
    ]
    first = {**report, "seed": f"{seeds[0]}..{seeds[-1]} ({n} seeds)"}
    emit_table(
        report,
        as_json,
        _workload_line(first),
        headers,
        rows,
        "SB: speed-weighted bound; FB: failure bound (SB plus what the seed's failures "
        "cost any schedule that restarts failed tasks).",
        "SB+1.2% / FB+1.2%: seeds on which the makespan is within 1.2% of that bound.",
    )


@experiment_command("A second team an hour in: FIFO against fair share.")
def fairshare(options: ExperimentOptions) -> None:
    """Two teams: b submits 500 backtests an hour into a's reference sweep.

    Compares FIFO with fair share at equal targets (no backups): team b's
    median and maximum wait from submission, and when team a's sweep ends.
    --tasks sets the size of team a's sweep; --policy runs those policies instead.
    """
    from daskjobs.sim.report import FAIRSHARE_RUNS, _make, run_fairshare

    check_plotting(options.plot_dir)
    kwargs: dict[str, Any] = _workload_kwargs(
        options.slow_node, options.failure_rate, options.n_tasks
    )
    kwargs["policies"] = _check_policies(options.policies, _make)
    runs = len(options.policies or FAIRSHARE_RUNS)
    report, _ = _run(run_fairshare, "fair share", runs, options.seed, kwargs)

    headers = [
        "policy",
        "team",
        "tasks",
        "median wait h",
        "published",
        "max wait h",
        "published",
        "end h",
        "published",
    ]
    rows: list[list[str]] = []
    for r in report["rows"]:
        pub = r["published"] or {}
        for team, st in r["teams"].items():
            is_b = team == "b"
            rows.append(
                [
                    r["policy"],
                    team,
                    str(st["tasks"]),
                    _num(st["median_wait_h"]),
                    _num(pub.get("b_median_wait_h") if is_b else None),
                    _num(st["max_wait_h"]),
                    _num(pub.get("b_max_wait_h") if is_b else None),
                    _num(st["end_h"]),
                    _num(pub.get("a_end_h") if team == "a" else None),
                ]
            )
    emit_table(
        report,
        options.as_json,
        f"team a: {report['teams']['a']:,} tasks at 0 h; "
        f"team b: {report['teams']['b']:,} tasks at {report['b_submit_h']:g} h; "
        f"equal targets; seed {report['seed']}",
        headers,
        rows,
        "waits are hours from each task's submission to its end; end is the team's last end",
        figures=_figure(options.plot_dir, "fairshare_waits", report, "fairshare-waits.png"),
    )


@experiment_command("Shared feature stages: recomputed, as a graph, cached.")
def graph(options: ExperimentOptions) -> None:
    """Shared feature stages: recomputed per backtest, as a graph, and cached.

    A hundred 20-minute feature stages, each read by a hundred backtests, under
    lpt, critical-path and node-aware with backups. Core-hours count every
    attempt (useful work and waste). --tasks must be a multiple of 100; --policy
    runs every mode under those policies instead.
    """
    from daskjobs.policies import make_policy
    from daskjobs.sim.report import graph_runs, run_graph

    check_plotting(options.plot_dir)
    kwargs: dict[str, Any] = _workload_kwargs(options.slow_node, options.failure_rate, None)
    kwargs["policies"] = _check_policies(options.policies, make_policy)
    if options.n_tasks is not None:
        if options.n_tasks % _N_FEATURES:
            raise click.BadParameter(
                f"{options.n_tasks} backtests cannot be split evenly over {_N_FEATURES} features; "
                f"use a multiple of {_N_FEATURES}",
                param_hint="--tasks",
            )
        kwargs["readers"] = options.n_tasks // _N_FEATURES
        kwargs["n_long"] = round(options.n_tasks * _LONG_SHARE)
    report, _ = _run(
        run_graph, "feature graph", len(graph_runs(kwargs["policies"])), options.seed, kwargs
    )

    headers = [
        "mode",
        "policy",
        "tasks",
        "core-h",
        "published",
        "makespan h",
        "published",
        "LB h",
        "waste core-h",
        "launched",
    ]
    rows = [
        [
            r["mode"],
            r["policy"],
            f"{r['tasks']:,}",
            f"{r['core_h']:,.0f}",
            f"{r['published_core_h']:,.0f}",
            _num(r["makespan_h"]),
            _num(r["published_makespan_h"]),
            _num(r["lower_bound_h"]),
            _num(r["waste_core_h"], ".1f"),
            str(r["backups_launched"]),
        ]
        for r in report["rows"]
    ]
    emit_table(
        report,
        options.as_json,
        f"feature graph, seed {report['seed']}, every run with backups",
        headers,
        rows,
        "core-h: core-time of every attempt; LB: nominal lower bound (cache hits take no time)",
        figures=_figure(options.plot_dir, "graph_costs", report, "graph-costs.png"),
    )


@simulate.command(short_help="Interactive jobs first: preemption policies on GPU jobs.")
@_synthetic_options("0-4", hours=(1.0, 168.0), load=(0.05, 2.0, 1.0))
@click.option(
    "--policy",
    "policies",
    multiple=True,
    type=click.Choice(list(PREEMPTION_POLICIES)),
    help="Run these policies (repeat the option; the first is the baseline of vs_fifo).",
)
@json_option
@plot_option("Also write the slowdown CDFs per class and policy as a PNG into DIR.")
def preemption(
    seeds: str,
    hours: float,
    load: float,
    policies: tuple[str, ...],
    as_json: bool,
    plot_dir: Path | None,
) -> None:
    """Trial-and-error (TE) jobs a person waits for, best-effort (BE) training runs
    that checkpoint, on 8 nodes of 8 GPUs (docs/explanation/preemption.md): FIFO, TE first, naive
    preemption (the youngest BE jobs) and the fit- and resume-aware policy. Slowdown
    is (end - arrival) / run time alone; medians over the seeds, their range in the
    JSON. The published figures are FitGpp's against FIFO on its own workload (OpML
    2019), shown beside ours.
    """
    from daskjobs.sim.preemption import run_preemption

    check_plotting(plot_dir)
    chosen = list(policies) or list(PREEMPTION_POLICIES)
    report = run_preemption(_parse_seeds(seeds), chosen, hours=hours, load=load)
    figures = _figure(plot_dir, "preemption_cdfs", report, "preemption-slowdowns.png")
    pub = report["published"]

    def pct(x: float) -> str:
        return f"{100 * x:+.1f}%"

    headers = [
        "policy",
        "TE p50",
        "TE p95",
        "vs FIFO",
        "BE p50",
        "vs FIFO",
        "BE p95",
        "vs FIFO",
        "preempt max",
        "GPU-h lost",
    ]
    rows = []
    for r in report["rows"]:
        v = r["vs_fifo"]
        rows.append(
            [
                r["policy"],
                f"{r['te_slowdown_p50']:.2f}",
                f"{r['te_slowdown_p95']:.2f}",
                pct(v["te_slowdown_p95"]),
                f"{r['be_slowdown_p50']:.2f}",
                pct(v["be_slowdown_p50"]),
                f"{r['be_slowdown_p95']:.2f}",
                pct(v["be_slowdown_p95"]),
                f"{r['preemptions_max']:.0f}",
                f"{r['gpu_seconds_lost'] / 3600:.1f}",
            ]
        )
    rows.append(
        [
            "published",
            "",
            "",
            pct(pub["te_slowdown_p95"]),
            "",
            pct(pub["be_slowdown_p50"]),
            "",
            pct(pub["be_slowdown_p95"]),
            "",
            "",
        ]
    )
    w = report["workload"]
    if as_json:
        report = {k: v for k, v in report.items() if k != "slowdowns"}
    emit_table(
        report,
        as_json,
        f"{w['nodes']} nodes x {w['gpus_per_node']} GPUs; {w['hours']:g} h of arrivals at "
        f"load {w['load']:g} ({100 * w['te_share']:g}% of it TE); checkpoint every "
        f"{w['checkpoint_s']:g} s, grace {w['grace_s']:g} s, restore {w['restore_s']:g} s; "
        f"seeds {report['seeds']}",
        headers,
        rows,
        "slowdowns and vs FIFO are medians over the seeds; published: FitGpp against FIFO "
        "on its own workload",
        figures=figures,
    )


@simulate.command(short_help="Gangs among 1-GPU tasks: reservation and backfill off and on.")
@_synthetic_options("0-2", hours=(0.5, 24.0), load=(0.05, 1.5, 0.9))
@count_option(
    "--nodes",
    minimum=2,
    default=16,
    metavar=None,
    help="Nodes of 8 GPUs: the first half A100 (80 GB), the rest V100 (32 GB).",
)
@json_option
def gangs(seeds: str, hours: float, load: float, nodes: int, as_json: bool) -> None:
    """Gangs (2-8 members x 1-8 GPUs, some A100 only) among a Poisson stream of 1- and
    2-GPU tasks on 16 nodes x 8 GPUs of two accelerator types (docs/explanation/resources.md),
    under GangPolicy with its reservation off and on. Waits are from arrival to start;
    utilisation is GPU-seconds allocated over capacity x makespan (and over the hours of
    arrivals only); fragmentation is free GPUs that no waiting request fits, averaged
    over time, and its share of the free GPU-time while something waited. Medians over
    the seeds; every seed and the ranges in the JSON.
    """
    from daskjobs.sim.gangs import run_gangs

    chosen = _parse_seeds(seeds)
    try:
        report = run_gangs(chosen, hours=hours, load=load, nodes=nodes)
    except ValueError as exc:
        raise click.UsageError(f"invalid workload: {exc}") from None

    def h(x: float | None) -> str:
        return "—" if x is None else f"{x / 3600:.2f}"

    headers = [
        "reservation",
        "gang p50 h",
        "gang p95 h",
        "gang max h",
        "task p50 h",
        "task p95 h",
        "util",
        "util arrivals",
        "frag GPUs",
        "frag share",
    ]
    rows = [
        [
            "on" if r["reservation"] else "off",
            h(r["gang_wait_p50_s"]),
            h(r["gang_wait_p95_s"]),
            h(r["gang_wait_max_s"]),
            h(r["single_wait_p50_s"]),
            h(r["single_wait_p95_s"]),
            f"{r['utilisation']:.3f}",
            f"{r['utilisation_arrivals']:.3f}",
            f"{r['fragmentation_units']:.1f}",
            f"{r['fragmentation_share']:.2f}",
        ]
        for r in report["rows"]
    ]
    w = report["workload"]
    demands = [s["demands"] for s in report["per_seed"]]
    gang_counts = [s["gangs"] for s in report["per_seed"]]
    emit_table(
        report,
        as_json,
        f"{w['nodes']} nodes x {w['gpus_per_node']} GPUs (half A100 80 GB, half V100 "
        f"32 GB); {w['hours']:g} h of arrivals at load {w['load']:g} "
        f"({100 * w['gang_share']:g}% of it gangs); seeds {report['seeds']}; "
        f"{min(demands):,}-{max(demands):,} demands, {min(gang_counts)}-{max(gang_counts)} "
        "gangs per seed",
        headers,
        rows,
        "waits (arrival to start) in hours, medians over the seeds; frag: free GPUs no "
        "waiting request fits (time average; share of the free GPU-time while work waited)",
    )


@simulate.command(short_help="Sweeps without estimates: stage medians, learned, true estimates.")
@seeds_option("0-4", "Seeds of the workloads: N, N-M, or a comma-separated list of them.")
@click.option(
    "--workload",
    "names",
    multiple=True,
    type=click.Choice(["lookback-grid", "chapter-params", "two-stage"]),
    help="Run this workload only (repeat for several; default: all three).",
)
@click.option(
    "--policy",
    default="lpt",
    show_default=True,
    metavar="NAME",
    callback=lambda ctx, param, value: policy_names(ctx, param, (value,))[0],
    help="The registered policy that ranks the tasks.",
)
@click.option(
    "--learn/--no-learn",
    default=True,
    show_default=True,
    help="Run the learner beside stage medians and true estimates (--no-learn: the two "
    "baselines only).",
)
@json_option
def estimates(seeds: str, names: tuple[str, ...], policy: str, learn: bool, as_json: bool) -> None:
    """Sweeps whose durations follow their parameters (a lookback grid with a heavy tail,
    the reference sweep's shape with its long tasks at the largest sizes, features read by
    backtests; docs/explanation/simulator.md), submitted without estimates, under one policy with
    three kinds of estimates: the stage's median (today's plugin without duration models:
    one submission ranks every task alike), learned online from the durations measured so
    far (simulate(..., learn=True): the duration models of the live plugin, re-ranking
    a stage's waiting tasks as it learns), and the true durations. Medians over the seeds
    of the makespans, of the share of the gain true estimates give over stage medians that
    learning gets, and of the share of the learner's predictions within 2x of the truth
    (3Sigma's measure); every seed in the JSON.
    """
    from daskjobs.sim.report import run_estimates

    chosen = _parse_seeds(seeds)
    n_work = len(names) or 3
    with _progress("sweeps without estimates", n_work * len(chosen)) as advance:
        try:
            report = run_estimates(
                chosen, names=names, policy=policy, progress=advance, learn=learn
            )
        except ValueError as exc:
            raise click.UsageError(f"invalid workload: {exc}") from None
    headers = [
        "workload",
        "tasks",
        "cores",
        "medians h",
        "learned h",
        "true h",
        "gain",
        "within 2x",
    ]
    rows = [
        [
            r["workload"],
            str(r["tasks"]),
            str(r["cores"]),
            _num(r["medians_h"]),
            _num(r["learned_h"]),
            _num(r["true_h"]),
            "—" if r["gain_share"] is None else f"{r['gain_share']:.0%}",
            "—" if r["within_2x"] is None else f"{r['within_2x']:.0%}",
        ]
        for r in report["workloads"]
    ]
    emit_table(
        report,
        as_json,
        f"policy {policy}; medians over seeds {seeds}",
        headers,
        rows,
        "gain: the share of the makespan true estimates save over stage medians that "
        "learning saves; within 2x: the learner's predictions within 2x of the truth",
    )
