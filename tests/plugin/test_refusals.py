"""A refused submission reaches its caller, never hangs (docs/explanation/reliability.md).

Each way the plugin refuses a submission (a team unknown while teams are strict, a bad
annotation, a resource request no worker can ever meet, a gang that can never start)
through each way of submitting (``Sweep.run``, ``client.compute``, ``persist``,
``submit``, ``daskjobs.jobs.submit``): one exception of the refusal's type naming the
problem, raised within the test's timeout (a hang fails the test rather than blocking),
and what was computed before stays: a result in memory, a result in the store.
In-process clusters with dask's validation on; tests/real/test_real_refusals.py does it once
on real processes."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dask
import pytest
from conftest import VALIDATE
from distributed import Client, LocalCluster

from daskjobs import SubmissionRefused, Sweep, jobs
from daskjobs.jobs.service import JobsService
from daskjobs.plugin import JobsPlugin
from daskjobs.plugin.enact.gangs import ResourceRequestError
from daskjobs.plugin.estimates import BadEstimate
from daskjobs.plugin.ranking import BadJobClass, UnknownTeam

#: how long a refusal may take to reach its caller (it takes a few round trips; a
#: refusal that does not travel hangs, and fails the test here)
PATIENCE = 20

STRICT = {"teams": {"strict": True, "targets": {"quant": 1, "default": 1}}}
RESOURCES = {"resources": {"enabled": True, "interval": "50ms"}}
INVENTORY = {"by-name": {"*": {"accelerator": "A100", "gpus": 2, "gpu_memory": "40GB"}}}

#: kind -> (plugin settings, annotations of the refused submission, its type, its message)
KINDS: dict[str, tuple[dict[str, Any], dict[str, Any], type[Exception], str]] = {
    "team": (
        STRICT,
        {"team": "quantt"},
        UnknownTeam,
        r"belongs to team 'quantt', which is not configured "
        r"\(daskjobs.teams.targets has: default, quant\)",
    ),
    "annotation": (
        {},
        {"estimate": "soon"},
        BadEstimate,
        r"estimate must be a duration: .* got str 'soon'",
    ),
    "job-class": (
        {},
        {"job_class": "urgent"},
        BadJobClass,
        r"has job_class 'urgent': expected 'te' \(interactive work a person waits for\) or 'be'",
    ),
    "resources": (
        RESOURCES,
        {"resources": {"GPU": 3}},
        ResourceRequestError,
        r"can never run: .*GPU=3 \(it has 2\)",
    ),
    "gang": (
        RESOURCES,
        {"resources": {"GPU": 1}, "gang": "big", "gang_size": 5},
        ResourceRequestError,
        r"gang 'big' can never start",
    ),
}


def inc(x: int) -> int:
    return x + 1


@contextmanager
def _client(kind: str, tmp_path: Path, service: bool = False) -> Iterator[Client]:
    """An in-process cluster of two workers of 2 GPUs whose plugin refuses ``kind``
    (and runs the jobs service, with ``service``), once every worker reported its
    inventory."""
    settings = KINDS[kind][0]
    plugins: list[Any] = [JobsPlugin(policy="fifo", **settings)]
    if service:
        ledger = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
        plugins.append(JobsService(ledger=ledger, store=str(tmp_path / "store"), interval="50ms"))
    with (
        dask.config.set({**VALIDATE, "daskjobs.inventory": INVENTORY}),
        LocalCluster(
            n_workers=2,
            threads_per_worker=2,
            processes=False,
            dashboard_address=":0",
            resources={"GPU": 2},
            scheduler_kwargs={"plugins": plugins},
        ) as cl,
        Client(cl) as c,
    ):
        if "resources" in settings:
            _wait_inventories(c, 2)
        yield c


def _wait_inventories(c: Client, n: int) -> None:
    def reported(dask_scheduler: Any) -> int:
        status = dask_scheduler.plugins["daskjobs"].placer.status()
        return sum(w["reported"] for w in status["workers"].values())

    deadline = time.monotonic() + 30
    while c.run_on_scheduler(reported) < n:
        assert time.monotonic() < deadline, "the workers did not report their inventories"
        time.sleep(0.02)


def _scheduler_tasks(c: Client) -> dict[str, str]:
    return c.run_on_scheduler(
        lambda dask_scheduler: {str(k): ts.state for k, ts in dask_scheduler.tasks.items()}
    )


def _plugin_errors(c: Client) -> dict[str, int]:
    return c.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["daskjobs"].errors)


def _members(annotations: dict[str, Any]) -> int:
    return int(annotations.get("gang_size", 1))


# -- the entry points: each submits work annotated ``annotations`` and waits for it --------


def _by_compute(c: Client, annotations: dict[str, Any], tmp_path: Path) -> Any:
    with dask.annotate(**annotations):
        parts = [
            dask.delayed(inc)(i, dask_key_name=f"new-{i}") for i in range(_members(annotations))
        ]
    return [f.result(timeout=PATIENCE) for f in c.compute(parts)]


def _by_persist(c: Client, annotations: dict[str, Any], tmp_path: Path) -> Any:
    with dask.annotate(**annotations):
        parts = [
            dask.delayed(inc)(i, dask_key_name=f"new-{i}") for i in range(_members(annotations))
        ]
    persisted = c.persist(parts)
    return [c.compute(p).result(timeout=PATIENCE) for p in persisted]


def _by_submit(c: Client, annotations: dict[str, Any], tmp_path: Path) -> Any:
    with dask.annotate(**annotations):
        futures = [c.submit(inc, i, key=f"new-{i}") for i in range(_members(annotations))]
    return [f.result(timeout=PATIENCE) for f in futures]


def _by_sweep(c: Client, annotations: dict[str, Any], tmp_path: Path) -> Any:
    sweep = Sweep("refused")
    sweep.stage(inc, over={"x": range(_members(annotations))})
    with dask.annotate(**annotations):
        return sweep.run(c, store=tmp_path / "store")


ENTRY_POINTS: dict[str, Callable[[Client, dict[str, Any], Path], Any]] = {
    "compute": _by_compute,
    "persist": _by_persist,
    "submit": _by_submit,
    "sweep.run": _by_sweep,
}


@pytest.mark.slow
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_refused_submission_raises_its_refusal(kind: str, entry: str, tmp_path: Path) -> None:
    """The refusal, as one exception of its type, naming the problem; a result computed
    before (in memory, held by a future; in the store) stays, and the refused tasks do not
    linger on the scheduler once their futures are gone."""
    _, annotations, error, message = KINDS[kind]
    with _client(kind, tmp_path) as c:
        before = Sweep("kept")
        before.stage(inc, over={"x": [10]})
        stored = before.run(c, store=tmp_path / "store", progress=False)
        assert stored.computed == 1
        held = c.submit(inc, 100, key="held")
        assert held.result(timeout=PATIENCE) == 101
        with pytest.raises(error, match=message) as info:
            ENTRY_POINTS[entry](c, annotations, tmp_path)
        assert isinstance(info.value, SubmissionRefused)
        assert held.status == "finished" and held.result() == 101
        again = before.run(c, store=tmp_path / "store", progress=False)
        assert (again.hits, again.computed) == (1, 0)
        assert _plugin_errors(c) == {}
        # the futures are gone: the raised exception is the one the client keeps for the
        # key, and its traceback's frames hold them (dask's way with any erred future)
        info.value.with_traceback(None)
        del info
        gc.collect()
        deadline = time.monotonic() + PATIENCE
        while any(k.startswith(("new-", "inc-")) for k in _scheduler_tasks(c)):
            assert time.monotonic() < deadline, _scheduler_tasks(c)
            time.sleep(0.02)


def test_a_refused_submission_beside_a_held_result_keeps_it() -> None:
    """A graph that asks again for a result in memory, beside a new task that is refused:
    only the new task fails; the future of the result in memory stays finished."""
    with _client("team", Path()) as c:
        held = c.submit(inc, 1, key="held")
        assert held.result(timeout=PATIENCE) == 2
        with dask.annotate(team="quantt"):
            both = c.get({"held": (inc, 1), "new-0": (inc, "held")}, ["held", "new-0"], sync=False)
        with pytest.raises(UnknownTeam, match="team 'quantt'"):
            both[1].result(timeout=PATIENCE)
        assert both[0].result(timeout=PATIENCE) == 2
        assert held.status == "finished" and held.result() == 2


def test_a_gang_completed_by_a_later_submission_that_can_never_start_fails_whole() -> None:
    """A gang's first members wait for the rest; the member that makes the gang one no
    set of workers can hold is refused, and the members that waited fail with it instead
    of waiting for ever."""
    with _client("gang", Path()) as c:
        with dask.annotate(resources={"GPU": 1}, gang="big", gang_size=5):
            first = [c.submit(inc, i, key=f"new-{i}") for i in range(4)]
            last = c.submit(inc, 4, key="new-4")
        for f in [last, *first]:
            with pytest.raises(ResourceRequestError, match="gang 'big' can never start"):
                f.result(timeout=PATIENCE)


# -- daskjobs.jobs.submit -------------------------------------------------------------------

#: kind -> (the job's spec keywords, the error, its message); a job has no gangs, and its
#: annotations are its spec's fields (checked as the spec is made)
JOB_KINDS: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "team": (
        {"team": "quantt"},
        UnknownTeam,
        r"team 'quantt' is not configured on this scheduler and teams are strict "
        r"\(daskjobs.teams.targets has: default, quant\)",
    ),
    "annotation": (
        {"job_class": "urgent"},
        ValueError,
        r"JobSpec.job_class: expected 'te' \(interactive\) or 'be' \(best-effort\), got 'urgent'",
    ),
    "resources": (
        {"resources": {"GPU": 3}},
        ResourceRequestError,
        r"job 'x'.* can never run: .*GPU=3 \(it has 2\)",
    ),
}


@pytest.mark.parametrize("kind", sorted(JOB_KINDS))
def test_a_refused_job_raises_at_submission(kind: str, tmp_path: Path) -> None:
    """``jobs.submit`` of a job the plugin would refuse every attempt of raises, naming
    the problem, and records nothing; a job the plugin accepts runs."""
    spec, error, message = JOB_KINDS[kind]
    with _client(kind, tmp_path, service=True) as c:
        with pytest.raises(error, match=message):
            jobs.submit(c, "x", kind="inference", parts=1, target="jobtasks:score", **spec)
        assert jobs.list(c) == []
        job = jobs.submit(c, "y", kind="inference", parts=2, team="quant", target="jobtasks:score")
        assert job.result(timeout=60) == [0, 10]
