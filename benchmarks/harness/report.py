"""The common command line of the benchmarks and what they write.

Every benchmark takes the same options (:func:`parser`): ``--quick`` (small sizes, well
under a minute), ``--markdown PATH`` (the figures as markdown, for the benchmarks page to
include), ``--plot PATH`` (a PNG of the figures) and, where it has seeds, ``--seed`` (the
first) and ``--seeds`` (how many). It collects its tables and charts in a
:class:`Report`, which prints them under the command and the machine
(:func:`harness.machine.machine`) and writes the two files asked for: the page then shows
figures the script produced, never figures pasted by hand.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.machine import machine

#: Options that say where output goes, not what is measured: left out of the command shown.
_OUTPUT_OPTIONS = ("--markdown", "--plot")


def parser(doc: str | None, *, seeds: int | None = None) -> argparse.ArgumentParser:
    """An argument parser with the common options; ``doc``'s first paragraph describes it.
    With ``seeds`` (the default count), ``--seed`` and ``--seeds`` too."""
    ap = argparse.ArgumentParser(
        description=(doc or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--quick", action="store_true", help="small sizes (well under a minute)")
    ap.add_argument(
        "--markdown", metavar="PATH", type=Path, help="also write the figures as markdown here"
    )
    ap.add_argument("--plot", metavar="PATH", type=Path, help="also write a PNG of the figures")
    if seeds is not None:
        ap.add_argument("--seed", type=int, default=0, help="the first seed (default 0)")
        ap.add_argument("--seeds", type=int, default=None, help=f"how many seeds (default {seeds})")
    return ap


def seeds(args: argparse.Namespace, default: int, quick: int = 1) -> list[int]:
    """The seeds asked for: ``--seeds`` of them from ``--seed``, else ``default`` (or
    ``quick`` with ``--quick``)."""
    n = args.seeds if args.seeds is not None else (quick if args.quick else default)
    if n < 1:
        raise SystemExit(f"--seeds wants at least 1, got {n}")
    return list(range(args.seed, args.seed + n))


def command(script: str, argv: Sequence[str] | None = None) -> str:
    """How to run this again: ``python benchmarks/<script> <options>`` without the
    output options."""
    args = list(sys.argv[1:] if argv is None else argv)
    kept: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in _OUTPUT_OPTIONS:
            skip = True
            continue
        if a.startswith(tuple(f"{o}=" for o in _OUTPUT_OPTIONS)):
            continue
        kept.append(a)
    return " ".join(["python", f"benchmarks/{os.path.basename(script)}", *kept])


@dataclass(frozen=True)
class Chart:
    """Figures to plot as grouped bars: one group per entry of ``groups``, one bar per
    series (label -> a value per group); ``reference`` draws a horizontal line (a
    target, or 1.0 for a ratio to a bound)."""

    title: str
    ylabel: str
    groups: Sequence[str]
    series: dict[str, Sequence[float]]
    reference: float | None = None

    def __post_init__(self) -> None:
        for label, values in self.series.items():
            if len(values) != len(self.groups):
                raise ValueError(
                    f"series {label!r} has {len(values)} values for {len(self.groups)} groups"
                )


@dataclass
class Report:
    """A benchmark's output: a title, notes under the machine block, sections of
    markdown (tables and their sentences) and charts."""

    title: str
    script: str
    argv: Sequence[str] | None = None
    notes: list[str] = field(default_factory=list)
    sections: list[tuple[str | None, str]] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)

    def note(self, line: str) -> None:
        """A line of the list under the machine (a setting that ran, a caveat)."""
        self.notes.append(line)

    def section(self, heading: str | None, text: str) -> None:
        """A section: a ``###`` heading (or none) and its markdown."""
        self.sections.append((heading, text))

    def chart(self, chart: Chart) -> None:
        self.charts.append(chart)

    def body(self, machine_block: str | None = None) -> str:
        """The figures as the page includes them: command, machine, notes, sections."""
        lines = [f"- command: `{command(self.script, self.argv)}`"]
        lines.append(machine() if machine_block is None else machine_block)
        lines += [f"- {n}" for n in self.notes]
        out = ["\n".join(lines)]
        for heading, text in self.sections:
            if heading:
                out.append(f"### {heading}")
            out.append(text.strip("\n"))
        return "\n\n".join(out) + "\n"

    def emit(self, args: argparse.Namespace | None = None) -> str:
        """Print the report (title and body), write ``--markdown`` and ``--plot``;
        returns the body."""
        body = self.body()
        print(f"## {self.title}\n")
        print(body)
        markdown = getattr(args, "markdown", None)
        if markdown is not None:
            Path(markdown).parent.mkdir(parents=True, exist_ok=True)
            Path(markdown).write_text(body)
            print(f"wrote {markdown}", file=sys.stderr)
        plot = getattr(args, "plot", None)
        if plot is not None:
            write_plot(Path(plot), self.charts, self.title)
            print(f"wrote {plot}", file=sys.stderr)
        return body


def write_plot(path: Path, charts: Sequence[Chart], title: str = "") -> None:
    """A PNG of ``charts`` side by side (grouped bars), with matplotlib."""
    if not charts:
        raise SystemExit("--plot: this benchmark has no chart")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(charts), figsize=(5.5 * len(charts), 4), squeeze=False)
    for ax, chart in zip(axes[0], charts, strict=True):
        n = max(len(chart.series), 1)
        width = 0.8 / n
        for k, (label, values) in enumerate(chart.series.items()):
            xs = [g + (k - (n - 1) / 2) * width for g in range(len(chart.groups))]
            ax.bar(xs, list(values), width, label=label)
        if chart.reference is not None:
            ax.axhline(chart.reference, color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(chart.groups)))
        ax.set_xticklabels(chart.groups, rotation=20, ha="right", fontsize=8)
        ax.set_title(chart.title, fontsize=10)
        ax.set_ylabel(chart.ylabel)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
