"""The benchmarks' shared harness: the machine, timing side by side, the command line,
markdown tables and plots.

A benchmark script (``benchmarks/bench_*.py``) imports it by name (``benchmarks/`` is
the first entry of ``sys.path`` when the script runs) and follows one shape::

    args = harness.parser(__doc__).parse_args(argv)
    report = harness.Report("Title", __file__)
    report.section("What was measured", harness.table(header, rows))
    report.chart(harness.Chart(...))
    report.emit(args)   # prints; writes --markdown and --plot

Nothing in benchmarks/ imports tests/, and nothing in tests/ imports benchmarks/
(tests/test_bench_layout.py): what both need lives in the package.
"""

from __future__ import annotations

from harness.machine import Machine, cpu_speed, describe, machine, revision
from harness.report import Chart, Report, command, parser, seeds, write_plot
from harness.tables import table
from harness.timing import Spread, alternate, order, paired_ratios, spread, timed

__all__ = [
    "Chart",
    "Machine",
    "Report",
    "Spread",
    "alternate",
    "command",
    "cpu_speed",
    "describe",
    "machine",
    "order",
    "paired_ratios",
    "parser",
    "revision",
    "seeds",
    "spread",
    "table",
    "timed",
    "write_plot",
]
