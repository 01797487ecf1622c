"""docs/how-to/deploy.md's dask-jobqueue recipe on a real Slurm: its workers are ``sbatch`` jobs.

The page's ``SLURMCluster`` block is run as written, with this node's values for what a site
sets (the queue stays the page's ``normal``; cores, memory, the environment and the log
directory are this machine's; the dashboard on a free port): its scheduler, in this process as
on a login node, runs the daskjobs preload and its workers run in Slurm jobs. Then:

* a sweep runs to the end on two worker jobs, and a second run loads it from the store;
* ``scancel`` of a worker's job while a stage runs on it loses nothing: every result is
  returned and every output already stored is loaded, not computed again;
* the jobs ledger on PostgreSQL survives the scheduler's restart: a new ``SLURMCluster`` on
  the same ledger finishes the job, and the parts committed before it are not run again.

Events, not sleeps, order each step (gate and mark files, the ledger's rows, the scheduler's
state). Tests marked ``slurm`` need a Slurm (``.ci/slurm-up``; tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dask
import pytest
import realtasks_sweep
from deploypage import PAGE, block
from realcluster import in_thread
from repo import FOLDERS, ROOT
from waiting import until

import daskjobs.jobs as jobs
from daskjobs import Sweep, grid
from daskjobs.examples import build_sweep
from daskjobs.jobs import Ledger
from daskjobs.sweep import run

pytestmark = pytest.mark.slurm

#: Seconds a step may take on a loaded 2-CPU machine; only a hang exceeds it.
WAIT = 90.0


def on_this_node(tmp_path: Path) -> dict[str, Any]:
    """What a site sets in the page's block, for this machine's one-node Slurm."""
    return {
        "cores": 2,  # a job: one worker of 2 threads (the node has 2 CPUs, shared 4 ways)
        "processes": 1,
        "memory": "2GB",
        "walltime": "00:15:00",
        "python": sys.executable,  # the environment running these tests, daskjobs in it
        # the page's job_script_prologue activates the site's environment; here, this
        # checkout (and the tests' folders, for the stage functions: tests/helpers/repo.py) on
        # the workers' path
        "job_script_prologue": [f"export PYTHONPATH={os.pathsep.join(map(str, [ROOT, *FOLDERS]))}"],
        "log_directory": str(tmp_path / "slurm-logs"),  # the jobs' output, not the cwd
    }


@pytest.fixture
def slurm_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """``slurm_cluster(*preload_argv)``: the page's block run, its scheduler's preload given
    ``preload_argv`` too; every cluster made is closed (its jobs cancelled) at teardown."""
    dask_jobqueue = pytest.importorskip("dask_jobqueue", reason="the test extra installs it")
    made: list[Any] = []

    def make(*preload_argv: str) -> Any:
        documented: list[dict[str, Any]] = []

        def slurm_cluster_here(**kwargs: Any) -> Any:
            documented.append(kwargs)
            options = dict(kwargs["scheduler_options"])
            options["preload_argv"] = [*options["preload_argv"], *preload_argv]
            options["dashboard_address"] = ":0"  # several tests at once on one machine
            kwargs = {**kwargs, **on_this_node(tmp_path), "scheduler_options": options}
            cluster = real(**kwargs)
            made.append(cluster)
            return cluster

        real = dask_jobqueue.SLURMCluster
        namespace: dict[str, Any] = {}
        with monkeypatch.context() as m, contextlib.redirect_stdout(io.StringIO()):
            m.setattr(dask_jobqueue, "SLURMCluster", slurm_cluster_here)
            code = block("python", "from dask_jobqueue import SLURMCluster")
            exec(compile(code, f"{PAGE}:SLURMCluster", "exec"), namespace)
        (page,) = documented
        assert page["queue"] == "normal" and page["scheduler_options"]["preload"] == [
            "daskjobs.preload"
        ]
        cluster = namespace["cluster"]
        assert "daskjobs" in cluster.scheduler.plugins  # the preload ran, here
        assert "preload" not in cluster.job_script()  # the workers are plain
        return cluster

    yield make
    for cluster in made:
        jobs_of = [job.job_id for job in cluster.workers.values() if job.job_id]
        cluster.close()
        if jobs_of:  # closed clusters cancel their jobs; a failed close must not leave any
            subprocess.run(["scancel", *jobs_of], check=False, capture_output=True)


def slurm_workers(client: Any, cluster: Any, n: int) -> dict[str, str]:
    """Once ``n`` workers are up: each worker's name and the Slurm job it runs in, which is
    one of the cluster's jobs, running in Slurm's queue."""
    client.wait_for_workers(n, timeout=WAIT)
    job_of = client.run(lambda: os.environ.get("SLURM_JOB_ID"))
    names = {a: w["name"] for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}
    by_name = {str(names[a]): job for a, job in job_of.items()}
    submitted = {job.job_id for job in cluster.workers.values()}
    assert set(by_name.values()) <= submitted, (by_name, submitted)
    queue = subprocess.run(
        ["squeue", "-h", "-t", "RUNNING", "-o", "%i"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert set(by_name.values()) <= set(queue), (by_name, queue)
    return by_name


def test_the_pages_slurmcluster_runs_a_sweep_on_sbatch_workers(
    slurm_cluster: Callable[..., Any], tmp_path: Path
) -> None:
    from distributed import Client

    cluster = slurm_cluster()
    cluster.scale(jobs=2)
    with Client(cluster) as client:
        assert len(slurm_workers(client, cluster, 2)) == 2
        sweep = build_sweep(
            slices=2, bars=2_000, fast=[5, 10], slow=[50], costs=[0.0, 5.0], team="quant"
        )
        store = tmp_path / "store"
        first = sweep.run(client, store=store, progress=False)
        assert first.ok, first.failures
        assert first.by_stage == {
            "synthetic_prices": {"computed": 2, "hits": 0, "in_memory": 0},
            "rolling_features": {"computed": 2, "hits": 0, "in_memory": 0},
            "crossover_backtest": {"computed": 8, "hits": 0, "in_memory": 0},
        }
        assert len(first.records) == 8 and first.hits == 0
        # the plugin ranked the sweep's graph in the scheduler jobqueue started here
        assert cluster.scheduler.plugins["daskjobs"].settings.policy == "fair-share"
        again = sweep.run(client, store=store, progress=False)
        assert again.ok and again.computed == 0
        assert (again.hits, again.pruned) == (8, 4)  # the backtests loaded, nothing upstream
        assert sorted(map(repr, again.values)) == sorted(map(repr, first.values))


def test_scancel_of_a_worker_job_mid_sweep_loses_nothing(
    slurm_cluster: Callable[..., Any], tmp_path: Path
) -> None:
    from distributed import Client

    marks = tmp_path / "marks"
    marks.mkdir()
    sweep = Sweep("scancel")
    shorts = sweep.stage(
        realtasks_sweep.short, over=grid(x=range(12)), params={"marks": str(marks)}
    )
    longs = sweep.stage(realtasks_sweep.long, params={"marks": str(marks)})
    graph = sweep.to_dask(store=tmp_path / "store")
    short_keys = shorts.keys
    (long_key,) = longs.keys

    cluster = slurm_cluster()
    cluster.scale(jobs=2)
    with Client(cluster) as client:
        job_of = slurm_workers(client, cluster, 2)
        thread, box = in_thread(lambda: run(graph, client, progress=False))

        # 1. The long stage has started on a worker (its mark names it) and every short
        #    output is stored and in some worker's memory.
        def settled() -> Any:
            if not (marks / "long-started").exists():
                return None
            states = client.run_on_scheduler(realtasks_sweep.key_states, keys=short_keys)
            if all(s == "memory" for s, _ in states.values()):
                return states
            return None

        states = until(settled, "the long stage started and every short output in memory", WAIT)
        running_long = (marks / "long-started").read_text()
        # 2. scancel the job of the worker holding the most outputs that only it holds
        held = {w: sorted(k for k, (_, ws) in states.items() if ws == [w]) for w in job_of}
        victim = max(sorted(held), key=lambda w: len(held[w]))
        assert held[victim], held
        subprocess.run(["scancel", job_of[victim]], check=True)
        until(
            lambda: victim not in {w["name"] for w in client.scheduler_info()["workers"].values()},
            "the scheduler lost the cancelled job's worker",
            WAIT,
        )
        # 3. The long stage finishes (rerun on the survivor if it ran on the victim); then a
        #    rerun of a short output that computed instead of loading may go on too.
        (marks / "long-gate").touch()
        until(
            lambda: (
                not thread.is_alive()
                or client.run_on_scheduler(realtasks_sweep.key_states, keys=[long_key])[long_key][0]
                == "memory"
            ),
            "the long output in memory (or the run returned)",
            WAIT,
        )
        (marks / "rerun-gate").touch()
        thread.join(WAIT)
        assert not thread.is_alive(), "the sweep did not return"
        assert "error" not in box, repr(box.get("error"))
        result = box["result"]
        assert len(client.scheduler_info()["workers"]) == 1  # the survivor only

    squeue = subprocess.run(
        ["squeue", "-h", "-j", job_of[victim], "-o", "%T"], capture_output=True, text=True
    )
    assert "RUNNING" not in squeue.stdout  # Slurm ended the job
    assert result.ok, result.failures
    values = {r["x"]: r["value"] for r in result.records if r["stage"] == "short"}
    assert values == {x: x * x for x in range(12)}
    assert [r["value"] for r in result.records if r["stage"] == "long"] == ["long done"]
    # Every short stage ran once: the outputs lost with the victim's memory were in the
    # store, and dask's reruns of their tasks loaded them.
    assert all(len(realtasks_sweep.runs_of(marks, x)) == 1 for x in range(12))
    assert result.computed == 13 and result.hits == 0
    assert running_long in job_of


def test_the_jobs_ledger_on_postgresql_survives_the_schedulers_restart(
    postgres_url: str, slurm_cluster: Callable[..., Any], tmp_path: Path
) -> None:
    from distributed import Client

    store, marks = tmp_path / "store", tmp_path / "marks"
    settings = {"lease": "2s", "launch-timeout": "1s", "interval": "100ms"}
    params = {"seconds": 0.5, "marks": str(marks)}
    led = Ledger(postgres_url)
    with dask.config.set({"daskjobs.store": str(store), "daskjobs.jobs": settings}):
        # the login node's first session: some parts committed, then the scheduler goes
        cluster = slurm_cluster("--daskjobs-ledger", postgres_url)
        cluster.scale(jobs=2)
        with Client(cluster) as client:
            slurm_workers(client, cluster, 2)
            job = jobs.submit(
                client, "score", kind="inference", parts=12, target="jobtasks:score", params=params
            )
            until(lambda: len(led.outputs(job.job_id)) >= 2, "two parts committed", WAIT)
        cluster.close()  # the scheduler stops and jobqueue cancels the worker jobs
        before = led.outputs(job.job_id)
        assert 2 <= len(before) < 12, before
        # a new session on the login node: a new scheduler on the same ledger, new jobs
        cluster = slurm_cluster("--daskjobs-ledger", postgres_url)
        cluster.scale(jobs=2)
        with Client(cluster) as client:
            slurm_workers(client, cluster, 2)
            again = jobs.submit(
                client, "score", kind="inference", parts=12, target="jobtasks:score", params=params
            )
            assert again.job_id == job.job_id  # the job's identity back from the ledger
            assert again.result(timeout=WAIT) == [10 * p for p in range(12)]
    assert led.epoch() == 2
    outputs = led.outputs(job.job_id)
    assert sorted(outputs) == list(range(12))
    assert {p: outputs[p] for p in before} == before  # kept, not committed again
    runs = {p: len(list(marks.glob(f"run-{job.job_id}-p{p}-*"))) for p in range(12)}
    assert all(runs[p] == 1 for p in before), runs  # a committed part never ran again
    # the attempts the first scheduler left running expired with their leases
    ended = {(a.state, a.reason) for a in led.attempts(job.job_id)}
    assert ended <= {("succeeded", "output committed"), ("lost", "lease expired")}, ended
    led.close()
