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
(tests/project/test_bench_layout.py): what both need lives in the package.

Measured durations are kept in memory in every benchmark (``daskjobs.history.path: null``, for
the schedulers a script starts in its own process and, through the environment, in the
processes it starts): by default the plugin keeps them in the user's cache directory, and one
configuration's or rep's measurements would then rank the next one's tasks. A benchmark that
measures the history names its own file.
"""

from __future__ import annotations

import os

import dask

from harness.machine import Machine, cpu_speed, describe, machine, revision
from harness.report import Chart, Report, command, parser, seeds, write_plot
from harness.tables import table
from harness.timing import Spread, alternate, order, paired_ratios, spread, timed

os.environ["DASK_DASKJOBS__HISTORY__PATH"] = "None"  # processes this script starts
dask.config.set({"daskjobs.history.path": None})  # (dask read the environment already)

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
