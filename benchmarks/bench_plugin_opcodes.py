"""The plugin's hooks in bytecodes a task, new code against old: a count load barely moves.

Usage::

    git worktree add /tmp/plugin-old <commit>
    python benchmarks/bench_plugin_opcodes.py --against /tmp/plugin-old
    python benchmarks/bench_plugin_opcodes.py --quick     # this checkout alone, 2 configurations

``bench_plugin.py`` times the plugin against plain dask, and on a shared 2-CPU machine
those times move by several percent from run to run (garbage collection, the other
threads holding the GIL), more than one change to a hook saves. This script counts what
the hooks do instead: ``client.map(inc, range(n))`` then ``gather`` on
``LocalCluster(n_workers=W, threads_per_worker=1, processes=False)`` with the plugin of
each configuration of ``bench_plugin.py``, in a fresh interpreter per configuration and
per code (``PYTHONHASHSEED=0``), the bytecodes run inside the plugin's transition hook
(and, in code older than the hook's parts loop, the dashboard queue clock's own
scheduler plugin), inside the ranking of the new graph and inside the worker reports'
handler counted with ``sys.settrace`` (``f_trace_opcodes``), by transition (start ->
finish). Columns: bytecodes a task in the hooks (new, old, new / old: below 1 the new
code does less), and in ranking the graph. A count does not see what a bytecode costs
(a dict of 10^5 keys, a collection of the heap): read it beside ``bench_plugin.py``'s
times, not instead of them. The counts depend a little on timing (which worker dask
picks, when a re-rank comes): run to run they move by about 1%.

This is a script, not a test: nothing here asserts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import harness

HERE = Path(__file__).resolve().parent
CODE = HERE.parent  # this checkout

# The child: the plugin's hooks wrapped to count the bytecodes they run, one configuration.
_CHILD = r"""
import collections, json, sys
sys.path.insert(0, sys.argv[1])
from distributed import Client, LocalCluster
import daskjobs.plugin.parts as parts
import daskjobs.plugin.plugin as plugin_module
from daskjobs.plugin import JobsPlugin

overrides, n, workers = json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
counts, calls, where = collections.Counter(), collections.Counter(), [None]

def tracer(frame, event, arg):
    frame.f_trace_opcodes = True
    if event == "opcode":
        counts[where[0]] += 1
    return tracer

def counted(fn, label):
    def run(*a, **kw):
        where[0] = label(*a, **kw)
        calls[where[0]] += 1
        old = sys.gettrace()
        sys.settrace(tracer)
        try:
            return fn(*a, **kw)
        finally:
            sys.settrace(old)
    return run

pair = lambda self, key, start, finish, *a, **kw: f"{start} -> {finish}"
loop = getattr(getattr(parts, "Transitions", None), "hook", None)
if loop is not None:  # the parts' loop is dask's hook (the queue clock one of its parts)
    parts.Transitions.hook = counted(loop, pair)
else:  # older code: the plugin's own method, and the queue clock's scheduler plugin
    plugin_module.JobsPlugin.transition = counted(plugin_module.JobsPlugin.transition, pair)
    import daskjobs.plugin.observe.dashboard as dashboard
    dashboard.QueueClock.transition = counted(dashboard.QueueClock.transition, pair)
plugin_module.JobsPlugin._new_graph = counted(
    plugin_module.JobsPlugin._new_graph, lambda *a, **kw: "graph")
plugin_module.JobsPlugin._log_event_from_worker = counted(
    plugin_module.JobsPlugin._log_event_from_worker, lambda *a, **kw: "reports")

def inc(x):
    return x + 1

with LocalCluster(n_workers=workers, threads_per_worker=1, processes=False,
                  dashboard_address=":0", memory_limit=0) as cluster, Client(cluster) as client:
    client.wait_for_workers(workers)
    client.register_plugin(JobsPlugin(**overrides))
    client.gather(client.map(inc, range(n)))
print(json.dumps({"counts": dict(counts), "calls": dict(calls)}))
"""


def count(code: Path, overrides: dict[str, Any], n: int, workers: int) -> dict[str, Any]:
    """One configuration's counts with the code in ``code``, in a fresh interpreter."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(code)}
    cmd = [sys.executable, "-c", _CHILD, str(code), json.dumps(overrides), str(n), str(workers)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=code)
    if out.returncode != 0:
        raise RuntimeError(f"{overrides} with {code} failed:\n{out.stderr[-3000:]}")
    got: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


def per_task(got: dict[str, Any], n: int) -> tuple[float, float]:
    """Bytecodes a task in the transition hooks (with the reports), and in ranking."""
    counts = got["counts"]
    hooks = sum(v for k, v in counts.items() if k != "graph")
    return hooks / n, counts.get("graph", 0) / n


def configs() -> dict[str, dict[str, Any]]:
    """Every configuration of bench_plugin.py's throughput runs but plain dask."""
    from daskjobs.config import policy_names

    out: dict[str, dict[str, Any]] = {name: {"policy": name} for name in policy_names()}
    out["node-aware +speculation"] = {"policy": "node-aware", "speculation": {"enabled": True}}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--against", type=Path, default=None, help="a checkout of the old code")
    ap.add_argument("--tasks", type=int, default=None, help="trivial tasks (default 3,000)")
    ap.add_argument("--workers", type=int, default=8, help="in-process workers (default 8)")
    args = ap.parse_args(argv)
    if args.against is not None and not (args.against / "daskjobs" / "plugin").is_dir():
        ap.error(f"--against {args.against}: not a checkout of daskjobs (no daskjobs/plugin)")
    n = args.tasks or (500 if args.quick else 3000)
    cfg = configs()
    if args.quick:
        cfg = {k: cfg[k] for k in ("fifo", "node-aware +speculation")}
    rows = []
    chart_rows: list[tuple[str, float, float | None]] = []
    for name, overrides in cfg.items():
        print(f"{name} ...", file=sys.stderr)
        new_hooks, new_graph = per_task(count(CODE, overrides, n, args.workers), n)
        row = [name, f"{new_hooks:,.0f}"]
        if args.against is not None:
            old_hooks, old_graph = per_task(count(args.against, overrides, n, args.workers), n)
            row += [f"{old_hooks:,.0f}", f"{new_hooks / old_hooks:.2f}"]
            row += [f"{new_graph:,.0f}", f"{old_graph:,.0f}"]
            chart_rows.append((name, new_hooks, old_hooks))
        else:
            row += [f"{new_graph:,.0f}"]
            chart_rows.append((name, new_hooks, None))
        rows.append(row)
    if args.against is not None:
        head = ["configuration", "hooks, new", "hooks, old", "new / old", "graph, new", "old"]
    else:
        head = ["configuration", "hooks", "graph"]
    report = harness.Report("The plugin's hooks in bytecodes", __file__, argv)
    report.section(
        f"Bytecodes a task: {n:,} trivial tasks, {args.workers} in-process workers",
        harness.table(head, rows),
    )
    series: dict[str, Sequence[float]] = {"new": [r[1] for r in chart_rows]}
    if args.against is not None:
        series["old"] = [r[2] or 0.0 for r in chart_rows]
    chart = harness.Chart(
        "The plugin's hooks: bytecodes a task",
        "bytecodes a task",
        [r[0] for r in chart_rows],
        series,
    )
    report.chart(chart)
    report.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
