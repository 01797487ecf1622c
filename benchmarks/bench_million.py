"""A million-task graph on a real scheduler process: the plugin's cost against plain dask.

Usage::

    python benchmarks/bench_million.py                          # 10^6 tasks, map and sweep, 2 reps
    python benchmarks/bench_million.py --tasks 100000 --reps 3  # the quick figures
    python benchmarks/bench_million.py --shapes map --to-end    # also run every task to its end

One ``dask scheduler`` process (``--preload daskjobs.preload`` for the plugin, nothing for
plain dask) and one ``dask worker`` of one thread, both started fresh for every run, plain and
plugin in turns (the order rotating each rep), each run in a fresh interpreter (this script
again, with a hidden ``--run``): the client holding a million futures is not reused. Two shapes:

- ``map``: ``client.map(work, range(n), g=gate)``, every task reading one gate task
  submitted just before;
- ``sweep``: a :class:`daskjobs.Sweep` of three stages, one gate node, ``n / 1000`` shared
  feature nodes that read it and 1,000 backtests of each feature (``store=False``), sent as
  one graph the way ``Sweep.run`` sends it (``client.get(graph.graph, graph.keys)``).

The gate task waits until the scheduler holds every task of the graph: a preload of the
benchmark's (``benchmarks/_million_probe.py``, the first ``--preload`` of both
configurations) creates the gate's flag file then. So a run times, from the moment
before the client's call (*submission*):

- **held**: until the scheduler holds every task (the probe's clock; ``sent``: the same from
  the moment the client's call returned, the scheduler's share);
- **first start**: until the first task after the gate started on the worker (the task's own
  clock): the graph held, the gate's end and the burst of a million dependents made runnable;
- **peak RSS**: the scheduler's resident memory, sampled every 50 ms with psutil from this
  process, its peak over the run minus its value before the submission;
- **longest block**: the longest gap past its 10 ms period of a callback the probe runs on the
  scheduler's event loop, and the plugin's own calls on that loop, timed by the probe:
  ``_set_priorities`` (dask's, which the plugin wraps to rank the graph), the plugin's
  ``update_graph`` hook and the periodic callbacks;
- **total** (``--to-end``): until every task is done (``distributed.wait``); else the run
  stops ``--after`` seconds after the first start.

Ratios are plugin over plain dask, paired by rep; the load average is printed beside each
run. This is a script, not a test: nothing here asserts.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

#: The configurations: name -> the scheduler's ``--preload`` (None: plain dask).
CONFIGS: dict[str, str | None] = {"plain": None, "plugin": "daskjobs.preload"}
#: Backtests of each shared feature in the sweep.
FAN = 1000

_SEEN: list[float] = []  # on the worker: the first task's start
_KEPT: list[Any] = []  # in a run: its client, never collected (see run_one)


def gate(flag: str) -> int:
    """Wait until ``flag`` exists (the probe creates it once the graph is held)."""
    while not os.path.exists(flag):
        time.sleep(0.005)
    return 0


def work(x: int, g: int = 0) -> int:
    if not _SEEN:
        _SEEN.append(time.time())
    return x


def opened(flag: str) -> int:
    return gate(flag)


def feature(i: int, opened: int) -> int:
    return i + opened


def backtest(j: int, feature: int) -> int:
    if not _SEEN:
        _SEEN.append(time.time())
    return j + feature


def first_start() -> float | None:
    return _SEEN[0] if _SEEN else None


def build_sweep(n: int, flag: str) -> Any:
    """The ``sweep`` shape: a gate node, ``n // FAN`` features, about ``FAN`` backtests each."""
    from daskjobs import Sweep

    features = max(1, n // FAN)
    # n tasks in all at most: the plugin's default admission limit refuses a graph of more
    # than 10^6 (``daskjobs.admission.graph-tasks``)
    fan = max(1, (n - 1 - features) // features)
    sweep = Sweep("million")
    g = sweep.stage(opened, params={"flag": flag}, speculate=False)
    f = sweep.stage(feature, {"i": range(features)}, inputs={"opened": g})
    sweep.stage(backtest, {"j": range(fan)}, inputs={"feature": f})
    return sweep.to_dask(store=False)


class Sampler:
    """The resident memory of process ``pid``, every ``period`` seconds, in a thread."""

    def __init__(self, pid: int, period: float = 0.05) -> None:
        import psutil

        self.proc = psutil.Process(pid)
        self.period = period
        self.base = self.proc.memory_info().rss
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except Exception:
                return

    def stop(self) -> float:
        """Stop; the peak's growth over the value at the start, in GB."""
        self._stop.set()
        self._thread.join()
        return (self.peak - self.base) / 1e9


def run_one(config: str, shape: str, n: int, to_end: bool, after: float) -> dict[str, Any]:
    """One run on a fresh scheduler and worker; its figures."""
    import bench_million as me  # the tasks by reference (this file runs as __main__)
    from distributed import wait
    from harness.machine import load_average
    from harness.processes import realcluster, worker_path

    rc_mod = realcluster()
    work_dir = Path(tempfile.mkdtemp(prefix="bench-million-"))
    flag = str(work_dir / "gate-open")
    graph = None
    if shape == "sweep":
        graph = me.build_sweep(n, flag)
        expect = len(graph)
    else:
        expect = n + 1
    probe = str(Path(__file__).resolve().parent / "_million_probe.py")
    env = worker_path()
    env.update(DASKJOBS_MILLION_EXPECT=str(expect), DASKJOBS_MILLION_FLAG=flag)
    rc = rc_mod.RealCluster(
        work_dir,
        n_workers=1,
        nthreads=1,
        preload=probe,  # and daskjobs.preload after it, for the plugin
        preload_args=["--preload", CONFIGS[config]] if CONFIGS[config] else [],
        env=env,
        validate=False,
    )
    load_before = load_average()
    rc.start()
    out: dict[str, Any] = {"config": config, "shape": shape, "tasks": expect}
    try:
        client = rc.client(timeout=120)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _million_probe import probe_state

        state = client.run_on_scheduler(probe_state)
        out["daskjobs_file"] = state["daskjobs_file"]
        out["plugin_loaded"] = state["plugin"]
        sampler = Sampler(rc.procs["scheduler"].pid)
        t0 = time.time()
        if graph is None:
            g = client.submit(me.gate, flag, pure=False)
            futures = client.map(me.work, range(n), g=g)
        else:
            futures = client.get(graph.graph, graph.keys, sync=False)
        sent = time.time()
        (wid,) = client.scheduler_info()["workers"]
        first = None
        while first is None:
            time.sleep(0.1)
            first = client.run(me.first_start, workers=[wid])[wid]
        if to_end:
            wait(futures)
            out["total"] = time.time() - t0
        else:
            time.sleep(after)
        state = client.run_on_scheduler(probe_state)
        out["rss_gb"] = sampler.stop()
        out["held"] = state["held"] - t0
        out["held_sent"] = state["held"] - sent
        out["send"] = sent - t0
        out["first_start"] = first - t0
        gaps = [gp for gp in state["gaps"] if gp[1] >= t0]
        out["block"] = max((gp[0] for gp in gaps), default=0.0)
        out["gaps"] = gaps
        out["calls"] = state["calls"]
        out["load"] = f"{load_before} -> {load_average()}"
        # the figures are taken: the scheduler releasing a million keys is not waited for
        # (the processes are stopped below)
        with contextlib.suppress(Exception):
            client.close(timeout=5)
        _KEPT.append(client)  # a client whose close timed out would wait for ever in __del__
    finally:
        rc.close()
    return out


def _child(config: str, shape: str, n: int, to_end: bool, after: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--run", config, "--shapes", shape, "--tasks", str(n)]
    cmd += ["--after", str(after)] + (["--to-end"] if to_end else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        raise RuntimeError(f"run {config} {shape} failed:\n{proc.stdout}\n{proc.stderr[-3000:]}")
    return dict(json.loads(lines[-1]))


def _show(name: str, rep: int, r: dict[str, Any]) -> str:
    plugin_calls = {k: f"{v[2] * 1000:.0f}ms max/{v[1]:.2f}s" for k, v in r["calls"].items()}
    total = f" total {r['total']:.1f}s" if "total" in r else ""
    return (
        f"rep {rep} {r['shape']} {name}: held {r['held']:.1f}s (sent+{r['held_sent']:.1f}s)"
        f" first start {r['first_start']:.1f}s rss +{r['rss_gb']:.2f}GB"
        f" block {r['block'] * 1000:.0f}ms{total} calls {plugin_calls} load {r['load']}"
    )


FIGURES = (
    ("held", "held (s)", ".1f"),
    ("held_sent", "held after the send (s)", ".1f"),
    ("first_start", "first start (s)", ".1f"),
    ("rss_gb", "peak RSS growth (GB)", ".2f"),
    ("block", "longest block (s)", ".2f"),
    ("total", "total (s)", ".1f"),
)


def _shown(call: str) -> bool:
    """The timed calls the table shows: dask's ``_set_priorities`` (the plugin ranks in it)
    and the plugin's own."""
    return call in ("_set_priorities", "plugin.update_graph") or call.startswith(
        "periodic:daskjobs"
    )


def summary(shape: str, runs: dict[str, list[dict[str, Any]]]) -> str:
    import harness

    rows = []
    for field, label, fmt in FIGURES:
        plain = [r.get(field) for r in runs["plain"]]
        plug = [r.get(field) for r in runs["plugin"]]
        if any(v is None for v in plain + plug):
            continue
        ratios = harness.paired_ratios(plug, plain) if all(plain) else []
        rows.append(
            [
                label,
                ", ".join(f"{v:{fmt}}" for v in plain),
                ", ".join(f"{v:{fmt}}" for v in plug),
                harness.spread(ratios).text(".2f") if ratios else "-",
            ]
        )
    for key in sorted({k for r in runs["plugin"] for k in r["calls"] if _shown(k)}):
        cells = [
            ", ".join(f"{r['calls'][key][2]:.2f}" if key in r["calls"] else "-" for r in rs)
            for rs in (runs["plain"], runs["plugin"])
        ]
        rows.append([f"`{key}`, longest (s)", *cells, ""])
    loads = "; ".join(f"{r['config']} {r['load']}" for name in runs for r in runs[name])
    table = harness.table(["per rep", "plain dask", "plugin", "plugin / plain"], rows)
    return f"{table}\n\n{shape}, {runs['plain'][0]['tasks']:,} tasks. Load: {loads}.\n"


def main(argv: list[str] | None = None) -> int:
    import harness

    ap = harness.parser(__doc__)
    ap.add_argument("--tasks", type=int, default=None, help="tasks (default 10^6)")
    ap.add_argument("--reps", type=int, default=None, help="reps of each (default 2)")
    ap.add_argument("--shapes", default="map,sweep", help="map, sweep or both")
    ap.add_argument("--to-end", action="store_true", help="also run every task to its end")
    ap.add_argument("--after", type=float, default=3.0, help="seconds after the first start")
    ap.add_argument("--run", default=None, help=argparse_hidden())
    args = ap.parse_args(argv)
    n = args.tasks or (10_000 if args.quick else 1_000_000)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if args.run:
        print(json.dumps(run_one(args.run, shapes[0], n, args.to_end, args.after)), flush=True)
        os._exit(0)  # no teardown of a million futures and a client that may not close
    reps = args.reps or (1 if args.quick else 2)
    report = harness.Report("A million-task graph on a real scheduler", __file__, argv)
    for shape in shapes:
        runs = harness.alternate(
            {
                name: (
                    lambda name=name, shape=shape: _child(name, shape, n, args.to_end, args.after)
                )
                for name in CONFIGS
            },
            reps,
            show=_show,
        )
        files = {r["daskjobs_file"] for rs in runs.values() for r in rs}
        report.note(f"{shape}: the scheduler imported daskjobs from {', '.join(sorted(files))}")
        report.section(shape, summary(shape, runs))
        block_ms = statistics.median(r["block"] for r in runs["plugin"]) * 1000
        print(f"{shape}: plugin's median longest block {block_ms:.0f} ms", file=sys.stderr)
    report.emit(args)
    return 0


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_million import main as _main

    raise SystemExit(_main())
