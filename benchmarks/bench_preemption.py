"""Preemption live on dask: interactive tasks among checkpointing best-effort ones.

A LocalCluster (``processes=False``) of 4 workers x 4 threads with 2 GPUs each (8 GPUs, dask's
worker resources). The workload (seeded, ``workload(seed)``): 24 best-effort (BE) tasks of one
GPU (probability 0.7) or two (0.3), log-normal run time (median 2 s, at most 4 s), in steps of
0.1 s with a checkpoint after each (``daskjobs.checkpoint``; they yield when
``daskjobs.preempted()``), arriving uniformly over the first 6 s (a two-GPU task that waits is
passed by one-GPU tasks that arrive after it: what the reservation is for), so that the GPUs
stay full; and 12 interactive (TE, ``job_class="te"``) tasks of one GPU, log-normal run time
(median 0.2 s), arriving as a Poisson process over the first 3 s. Each task's ``estimate``
annotation is its run time. Sleeps stand in for work. Side by side, a fresh cluster each:

* ``plain dask``: no plugin;
* ``plugin, no preemption``: ``JobsPlugin(policy="fifo")``;
* ``fit-resume, no reservation``: ``JobsPlugin(policy="fifo", preemption={"enabled": True,
  "policy": "fit-resume", "min_runtime": "300ms", "grace": "2s", "interval": "50ms",
  "reservation": False})``: victims for TE tasks, no worker held for a waiting BE task;
* ``fit-resume``: the same with the reservation enacted (the default): the first BE task that
  fits nowhere is pinned, ahead of the other BE tasks, to the worker where it starts first.

Measured in the tasks: TE wait (arrival to start) and slowdown ((end - arrival) / run time
alone) p50 / p95, BE slowdown p50 / p95, preemptions and work lost (``status()``). Predicted:
the same jobs in the job-level simulator (:mod:`daskjobs.sim.preemption`, the policy objects
the plugin runs: ``Fifo`` for the first two, ``FitResume(min_runtime=0.3, reservation=...)``
for the others;
checkpoints every 0.1 s, no restore cost, and as the grace between the signal and the freed GPU
the live latency on average: half the plugin's check interval plus half a victim's step, 75 ms),
TE and BE p95 slowdown predicted beside measured. Replayed: the plugin's runs are recorded
(``record=``) and replayed under the policy they ran (:func:`daskjobs.replay.preemption.
replay_preemption`: the jobs, checkpoint interval and grace estimated from the trace itself).

Usage::

    python benchmarks/bench_preemption.py [--seeds 3] [--json]
    python benchmarks/bench_preemption.py --quick      # one seed

Prints markdown with the command and the machine (``--markdown``/``--plot`` write it and
a PNG: TE and BE slowdown p95 per configuration). A script, not a test.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from typing import Any

import dask
import harness
import numpy as np

import daskjobs

STEP = 0.1
INTERVAL = 0.05  # the plugin's preemption check
N_BE, N_TE = 24, 12
BE_SPREAD = 6.0  # best-effort tasks arrive over the first 6 s
WORKERS, GPUS = 4, 2


def be_task(i: int, seconds: float, gpus: int) -> dict[str, float]:
    state = daskjobs.restore(default={"done": 0.0, "start": time.time(), "runs": 0})
    state["runs"] += 1
    while state["done"] < seconds - 1e-9:
        step = min(STEP, seconds - state["done"])
        time.sleep(step)
        state["done"] += step
        daskjobs.checkpoint(state)
        if state["done"] < seconds - 1e-9 and daskjobs.preempted():
            raise daskjobs.Preempted()
    return {"start": state["start"], "end": time.time(), "runs": state["runs"]}


def te_task(i: int, seconds: float) -> dict[str, float]:
    start = time.time()
    time.sleep(seconds)
    return {"start": start, "end": time.time()}


def workload(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    be = [min(4.0, round(rng.lognormvariate(np.log(2.0), 0.4), 1)) for _ in range(N_BE)]
    te = [min(0.6, rng.lognormvariate(np.log(0.2), 0.4)) for _ in range(N_TE)]
    t, arrivals = 0.2, []
    for _ in range(N_TE):
        t += rng.expovariate(N_TE / 3.0)
        arrivals.append(t)
    gpus = [2 if rng.random() < 0.3 else 1 for _ in range(N_BE)]
    be_arrivals = sorted(rng.uniform(0.0, BE_SPREAD) for _ in range(N_BE))
    return {"be": be, "te": te, "arrivals": arrivals, "be_gpus": gpus, "be_arrivals": be_arrivals}


def run(config: str, w: dict[str, Any], trace: str | None = None) -> dict[str, Any]:
    from distributed import Client, LocalCluster

    plugins = []
    if config != "plain dask":
        extra: dict[str, Any] = {}
        if config.startswith("fit-resume"):
            extra["preemption"] = {
                "enabled": True,
                "policy": "fit-resume",
                "min_runtime": "300ms",
                "grace": "2s",
                "interval": INTERVAL,
                "reservation": config == "fit-resume",
            }
        if trace is not None:
            extra["record"] = trace
        plugins = [daskjobs.JobsPlugin(policy="fifo", **extra)]
    with (
        tempfile.TemporaryDirectory() as store,
        dask.config.set({"daskjobs.store": store}),
        LocalCluster(
            n_workers=WORKERS,
            threads_per_worker=4,
            resources={"GPU": GPUS},
            processes=False,
            dashboard_address=":0",
            scheduler_kwargs={"plugins": plugins},
        ) as cl,
        Client(cl) as c,
    ):
        arrivals = [(a, "be", i) for i, a in enumerate(w["be_arrivals"])]
        arrivals += [(a, "te", i) for i, a in enumerate(w["arrivals"])]
        arrivals.sort()
        t0 = time.time()
        be, te = [], []
        for a, cls, i in arrivals:
            time.sleep(max(0.0, t0 + a - time.time()))
            if cls == "be":
                d, g = w["be"][i], w["be_gpus"][i]
                with dask.annotate(resources={"GPU": g}, estimate=d):
                    be.append((time.time(), d, c.submit(be_task, i, d, g, key=f"be-{i}")))
            else:
                d = w["te"][i]
                with dask.annotate(resources={"GPU": 1}, job_class="te", estimate=d):
                    te.append((time.time(), d, c.submit(te_task, i, d, key=f"te-{i}")))
        te_out = [(arr, d, f.result()) for arr, d, f in te]
        be_out = [(arr, d, f.result()) for arr, d, f in be]
        st = daskjobs.status(c) if plugins else {}
    pre = (st.get("preemption") or {}) if st else {}
    te_wait = [o["start"] - arr for arr, _, o in te_out]
    te_slow = [(o["end"] - arr) / d for arr, d, o in te_out]
    be_slow = [(o["end"] - arr) / d for arr, d, o in be_out]
    return {
        "config": config,
        "te_wait_p50": float(np.percentile(te_wait, 50)),
        "te_wait_p95": float(np.percentile(te_wait, 95)),
        "te_slowdown_p50": float(np.percentile(te_slow, 50)),
        "te_slowdown_p95": float(np.percentile(te_slow, 95)),
        "be_slowdown_p50": float(np.percentile(be_slow, 50)),
        "be_slowdown_p95": float(np.percentile(be_slow, 95)),
        "makespan": max(o["end"] for _, _, o in be_out) - t0,
        "preempted": pre.get("yielded", 0),
        "holds": pre.get("holds", 0),
        "ignored": pre.get("ignored", 0),
        "lost_s": pre.get("lost_seconds", 0.0),
        "resumed": sum(o["runs"] > 1 for _, _, o in be_out),
    }


def predict(w: dict[str, Any], config: str) -> dict[str, float]:
    """TE and BE p95 slowdown of the same jobs in the job-level simulator."""
    from daskjobs.policies.preemption import Fifo, FitResume
    from daskjobs.sim.preemption import Cluster, Job, Workload, metrics, simulate

    jobs = [
        Job(i, "be", a, g, d, STEP)
        for i, (a, d, g) in enumerate(zip(w["be_arrivals"], w["be"], w["be_gpus"], strict=True))
    ]
    jobs += [
        Job(N_BE + i, "te", a, 1, d, None)
        for i, (a, d) in enumerate(zip(w["arrivals"], w["te"], strict=True))
    ]
    wl = Workload(Cluster(WORKERS, GPUS, grace=(INTERVAL + STEP) / 2, restore=0.0), tuple(jobs))
    p = (
        FitResume(min_runtime=0.3, reservation=config == "fit-resume")
        if config.startswith("fit-resume")
        else Fifo()
    )
    m = metrics(wl, simulate(wl, p))
    return {"te": float(m["te_slowdown_p95"]), "be": float(m["be_slowdown_p95"])}


def _opt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


CONFIGS = ("plain dask", "plugin, no preemption", "fit-resume, no reservation", "fit-resume")


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 3; quick 1)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead")
    args = ap.parse_args(argv)
    seeds = args.seeds or (1 if args.quick else 3)
    rows = []
    from daskjobs.replay.preemption import replay_preemption
    from daskjobs.trace import TraceError

    out = tempfile.mkdtemp(prefix="daskjobs-preemption-")
    for seed in range(seeds):
        w = workload(seed)
        for n, config in enumerate(CONFIGS):
            trace = None if config == "plain dask" else f"{out}/{seed}-{n}.jsonl"
            row = run(config, w, trace)
            row["seed"] = seed
            predicted = predict(w, config)
            row["predicted_te_slowdown_p95"] = predicted["te"]
            row["predicted_be_slowdown_p95"] = predicted["be"]
            row["replayed_te_slowdown_p95"] = None
            if trace is not None:  # the recorded run, replayed under the policy it ran
                policy = "fit-resume" if config.startswith("fit-resume") else "fifo"
                opts = {"min_runtime": 0.3, "reservation": config == "fit-resume"}
                try:
                    (replayed, _) = replay_preemption(trace, [policy], **opts)
                except TraceError as e:  # a recording the reader refuses: shown, not fatal
                    print(f"seed {seed}, {config}: replay refused the recording: {e}")
                else:
                    row["replayed_te_slowdown_p95"] = replayed["te_slowdown_p95"]
            rows.append(row)
            print(f"seed {seed}, {config}: done", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    report = harness.Report("Preemption live", __file__, argv)
    header = [
        "seed",
        "configuration",
        "TE wait p50 / p95 (s)",
        "TE slowdown p50 / p95",
        "predicted TE p95",
        "replayed TE p95",
        "BE slowdown p50 / p95",
        "predicted BE p95",
        "makespan (s)",
        "preempted / ignored",
        "holds",
        "work lost (GPU-s)",
    ]
    cells = [
        [
            r["seed"],
            r["config"],
            f"{r['te_wait_p50']:.2f} / {r['te_wait_p95']:.2f}",
            f"{r['te_slowdown_p50']:.2f} / {r['te_slowdown_p95']:.2f}",
            f"{r['predicted_te_slowdown_p95']:.2f}",
            _opt(r["replayed_te_slowdown_p95"]),
            f"{r['be_slowdown_p50']:.2f} / {r['be_slowdown_p95']:.2f}",
            f"{r['predicted_be_slowdown_p95']:.2f}",
            f"{r['makespan']:.2f}",
            f"{r['preempted']} / {r['ignored']}",
            r["holds"],
            f"{r['lost_s']:.2f}",
        ]
        for r in rows
    ]
    report.section(None, harness.table(header, cells, "rl" + "r" * 10))
    medians = {
        config: [
            float(np.median([r[k] for r in rows if r["config"] == config]))
            for k in ("te_slowdown_p95", "be_slowdown_p95")
        ]
        for config in CONFIGS
    }
    by = {(r["seed"], r["config"]): r for r in rows}
    ratios = [
        by[s, "fit-resume"]["be_slowdown_p95"]
        / by[s, "fit-resume, no reservation"]["be_slowdown_p95"]
        for s in range(seeds)
    ]
    report.section(
        None,
        harness.table(
            ["configuration", "TE slowdown p95, median over seeds", "BE slowdown p95, median"],
            [[c, f"{te:.2f}", f"{be:.2f}"] for c, (te, be) in medians.items()],
        )
        + "\n\nBE p95 with the reservation / without, per seed: "
        + ", ".join(f"{x:.2f}" for x in ratios)
        + f" (median {float(np.median(ratios)):.2f})",
    )
    report.chart(
        harness.Chart(
            "Slowdown p95 (median over seeds)",
            "(end - arrival) / run time alone",
            list(CONFIGS),
            {
                "interactive (TE)": [medians[c][0] for c in CONFIGS],
                "best-effort (BE)": [medians[c][1] for c in CONFIGS],
            },
            reference=1.0,
        )
    )
    report.emit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
