"""The full plugin against plain dask on a grid of workloads, side by side.

The full plugin (``JobsPlugin(policy="node-aware", speculation=SPECULATION)``) against
plain dask, alternating (the order flips every workload), on a fresh cluster per run, on
the workloads of :data:`speculation.workload.GRID`: 400 to 3,200 sleep tasks, 16 to 64
slots (4 or 8 workers of 4 or 8 threads), one or two workers 4x slow, estimates with
``exp(0.3 z)`` noise or exact, the sweep submitted as one graph. Three ways to run it:

* a ``LocalCluster`` with worker processes (the default, as a user starts one: the
  scheduler and the client in this process, each worker a process of its own);
* all in this process (``processes=False``): every worker thread shares one interpreter
  with the scheduler, so a task's sleep ends late by its wait for the GIL (the
  decomposition's *overrun*), a cost no cluster of worker processes pays;
* ``dask scheduler`` and ``dask worker`` processes with dask's default configuration.

For each run: makespan (first task start to last task end, a task ending with its first
attempt to end: a losing copy's thread sleeping on is slot-time lost to copies, not a
later end) over the speed bound ``max(work / slot-equivalents, longest task)``, the time
from ``client.compute`` to the first task start and from the last task end to the
results in the client's hands, where the lost slot-time went
(:func:`daskjobs.timeline.decompose`) and the load in the run's last three tenths
(:func:`daskjobs.timeline.end_load`), all read from the timeline of every attempt, which
the tasks log themselves, so plain dask and the plugin are measured by the same ruler.
Beside each workload, the simulator's ratio for the same policy and workload
(:func:`speculation.model.sim_ratio`), without overhead and with plain dask's median
refill gap of that run as every attempt's overhead.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from distributed import Client, LocalCluster
from harness import Chart
from harness.processes import realcluster, worker_path

from daskjobs.plugin import JobsPlugin
from daskjobs.timeline import CpuSampler, Span, decompose, end_load, run_end
from speculation import workload
from speculation.model import sim_ratio
from speculation.workload import (
    SPECULATION,
    Case,
    grid_graph,
    read_spans,
    scheduler_status,
    speculation_config,
    worker_prefix,
)

GRID_CONFIGS = ("plain", "aware")
#: The makespan over the bound that the full plugin aims for on every workload.
GRID_TARGET = 1.05


def _plugin(config: str) -> JobsPlugin | None:
    if config != "aware":
        return None
    return JobsPlugin(
        policy="node-aware",
        policy_options=dict(workload.POLICY_OPTIONS),
        speculation=dict(SPECULATION),
    )


def run_grid_case(case: Case, config: str, spans_dir: str | None = None) -> dict[str, Any]:
    """One run of ``case`` on a fresh ``LocalCluster``: all in this process, or with
    ``spans_dir``, the workers as processes of their own logging their attempts to a
    file under ``spans_dir``."""
    plugin = _plugin(config)
    processes = spans_dir is not None
    spans_file = None
    if spans_dir is not None:
        spans_file = os.path.join(spans_dir, f"spans-{case.seed}-{config}-{time.time()}.txt")
    parts, durations = grid_graph(case, spans_file, prefix="")
    with (
        LocalCluster(
            n_workers=case.workers,
            threads_per_worker=case.threads,
            processes=processes,
            dashboard_address=":0",
            scheduler_kwargs={"plugins": [plugin] if plugin else []},
        ) as cl,
        Client(cl) as client,
    ):
        client.wait_for_workers(case.workers)
        workload.SPANS.clear()
        t_submit = time.time()
        cpu0 = time.process_time()
        with CpuSampler() as machine_cpu:
            out = client.compute(parts, sync=True)
        t_results = time.time()
        cpu = time.process_time() - cpu0
        status = client.run_on_scheduler(scheduler_status) if plugin else None
        if spans_file is not None:
            spans = read_spans(spans_file, t_submit)
        else:
            # a zombie thread of an earlier run's cluster may still append: not this run's
            spans = [sp for sp in workload.SPANS if sp[2] >= t_submit]
    # CPU seconds of this process (client, scheduler, and in process the workers)
    return grid_result(
        spans, durations, case, t_submit, t_results, len(out), status, machine_cpu, cpu=cpu
    )


def run_grid_case_real(case: Case, config: str, workdir: str) -> dict[str, Any]:
    """One run of ``case`` on a fresh cluster of real processes: ``dask scheduler`` (the
    plugin preloaded for the full plugin) and ``case.workers`` ``dask worker`` processes
    of ``case.threads`` threads, dask's defaults."""
    conf = None
    if config == "aware":
        conf = {
            "daskjobs": {
                "policy": "node-aware",
                "policy-options": dict(workload.POLICY_OPTIONS),
                "speculation": speculation_config(),
            }
        }
    here = Path(workdir) / f"{case.seed}-{case.workers}x{case.threads}-{config}-{time.time()}"
    rc = realcluster().RealCluster(
        here,
        n_workers=case.workers,
        nthreads=case.threads,
        preload=None if config == "plain" else "plugins/daskjobs_scheduler.py",
        config=conf,
        validate=False,  # dask's defaults, as on a production cluster
        env=worker_path(),
    )
    spans_file = str(here / "spans.txt")
    parts, durations = grid_graph(case, spans_file)
    with rc, rc.client() as client:
        t_submit = time.time()
        with CpuSampler() as machine_cpu:
            out = client.compute(parts, sync=True)
        t_results = time.time()
        status = client.run_on_scheduler(scheduler_status) if config != "plain" else None
    spans = read_spans(spans_file, t_submit)
    return grid_result(
        spans,
        durations,
        case,
        t_submit,
        t_results,
        len(out),
        status,
        machine_cpu,
        cpu=float("nan"),  # spread over the processes
        problems=rc.problems(),
    )


def grid_result(
    spans: list[Span],
    durations: list[float],
    case: Case,
    t_submit: float,
    t_results: float,
    results: int,
    status: dict[str, Any] | None,
    machine_cpu: CpuSampler | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One run's figures: the decomposition, the ratio to the bound, the fixed costs,
    the load in the run's last three tenths."""
    slots = case.cluster(worker_prefix(spans))
    d = decompose(spans, durations, slots)
    d.update(end_load(spans, slots, machine_cpu))
    first = min(s for _, _, s, _ in spans)
    bound = max(sum(durations) / case.slot_equivalents, max(durations))
    r: dict[str, Any] = {
        **d,
        "bound": bound,
        "ratio": d["makespan"] / bound,
        "wall": t_results - t_submit,
        "to_first": first - t_submit,
        "after_last": t_results - run_end(spans),
        "results": results,
        **extra,
    }
    if status is not None:
        r["speculation"] = status.get("speculation")
    return r


def grid(
    cases: tuple[Case, ...], reps: int, real: str | None = None, processes: str | None = None
) -> list[dict[str, Any]]:
    """Each case, plugin and plain dask alternating (the order flips every case), on a
    fresh cluster per run: of real processes under the directory ``real``, a
    ``LocalCluster`` with worker processes logging under the directory ``processes``,
    else a ``LocalCluster`` in this process."""
    rows = []
    for k, case in enumerate(cases):
        row: dict[str, Any] = {"case": case, "runs": {c: [] for c in GRID_CONFIGS}}
        for rep in range(reps):
            order = GRID_CONFIGS if (k + rep) % 2 == 0 else GRID_CONFIGS[::-1]
            for config in order:
                if real is not None:
                    r = run_grid_case_real(case, config, real)
                else:
                    r = run_grid_case(case, config, processes)
                row["runs"][config].append(r)
                print(
                    f"  {case.label()} {config}: {r['makespan']:.2f} s, {r['ratio']:.3f}x, "
                    f"first start {r['to_first']:.3f} s, wall {r['wall']:.2f} s, "
                    f"CPU {r['cpu']:.2f} s, last 3 tenths: {r['end_starts']:.0f} starts/s, "
                    f"{r['end_idle']:.0%} fast threads idle, {r['end_cpus']:.2f} CPUs busy",
                    file=sys.stderr,
                )
        rows.append(row)
    return rows


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median run by ratio (the upper median with an even count)."""
    return sorted(runs, key=lambda r: r["ratio"])[len(runs) // 2]


def _ratios(runs: list[dict[str, Any]]) -> str:
    return "/".join(f"{r['ratio']:.3f}" for r in runs)


def grid_table(rows: list[dict[str, Any]], reps: int) -> str:
    """Makespan over the bound per workload, plain dask and the full plugin, beside the
    simulator's, with the fixed costs and the copies."""
    out = [
        "| workload (tasks x workers x threads, slow, estimates, seed) | bound (s) | "
        "plain dask / bound | full plugin / bound | simulator / bound, no overhead / "
        "plain dask's refill gap per task | submit to first start, plain / plugin (s) | "
        "last end to results, plain / plugin (s) | wall, plain / plugin (s) | "
        "copies launched / won / lost |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        case = row["case"]
        runs = row["runs"]
        p, a = best(runs["plain"]), best(runs["aware"])
        mark = " ok" if max(r["ratio"] for r in runs["aware"]) <= GRID_TARGET else " MISS"
        s = a.get("speculation") or {}
        gap = statistics.median(r["gap_ms"] for r in runs["plain"]) / 1000
        sim = f"{sim_ratio(case, 0.0):.3f} / {sim_ratio(case, gap):.3f}"
        out.append(
            f"| {case.label()} | {a['bound']:.2f} | {_ratios(runs['plain'])} | "
            f"{_ratios(runs['aware'])}{mark} | {sim} | "
            f"{p['to_first']:.3f} / {a['to_first']:.3f} | "
            f"{p['after_last']:.3f} / {a['after_last']:.3f} | "
            f"{p['wall']:.2f} / {a['wall']:.2f} | "
            f"{s.get('launched', 0)} / {s.get('won', 0)} / {s.get('lost', 0)} |"
        )
    allr = {c: [r["ratio"] for row in rows for r in row["runs"][c]] for c in GRID_CONFIGS}
    fixed = {
        c: [r["to_first"] + r["after_last"] for row in rows for r in row["runs"][c]]
        for c in GRID_CONFIGS
    }
    out.append(
        f"\nMakespan / bound over {len(rows)} workloads x {reps} run(s): full plugin median "
        f"{statistics.median(allr['aware']):.3f}, worst {max(allr['aware']):.3f} "
        f"(target <= {GRID_TARGET:.2f}: "
        f"{sum(r <= GRID_TARGET for r in allr['aware'])} of {len(allr['aware'])} runs); "
        f"plain dask median {statistics.median(allr['plain']):.3f}, worst "
        f"{max(allr['plain']):.3f}. Fixed costs (submission to first start + last end to "
        f"results), median: plain {statistics.median(fixed['plain']):.3f} s, plugin "
        f"{statistics.median(fixed['aware']):.3f} s."
    )
    return "\n".join(out)


def grid_chart(rows: list[dict[str, Any]]) -> Chart:
    """Makespan over the bound per workload (the median run), plain dask and the full
    plugin, with the simulator's for the same policy."""
    return Chart(
        "Makespan over the bound, per workload",
        "makespan / bound",
        [row["case"].label().split(", seed")[0] for row in rows],
        {
            "plain dask": [best(row["runs"]["plain"])["ratio"] for row in rows],
            "full plugin": [best(row["runs"]["aware"])["ratio"] for row in rows],
            "simulator": [sim_ratio(row["case"], 0.0) for row in rows],
        },
        reference=GRID_TARGET,
    )
