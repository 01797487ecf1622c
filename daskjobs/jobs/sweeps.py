"""A sweep as a job: its whole graph run inside one attempt, its stages in the store.

``submit_sweep(client, sweep)`` records one job whose single part runs
``sweep.run(...)`` from a worker (through a client of the same scheduler). The job's
identity is a hash of the sweep's content keys (the keys of every node: functions'
code, parameters, inputs), so resubmitting the same sweep, even from a new session,
returns the same job. The sweep's stages write their results to the result store as
usual: an attempt lost with its worker, or a scheduler that died, is followed by a new
attempt whose ``sweep.run`` loads every stage already finished and runs only the rest.
The job's value is a small summary (the result table and the counts of
:class:`daskjobs.SweepResult`), committed exactly once like any job's output.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import cloudpickle

from daskjobs.cache.store import ResultStore, default_store_url
from daskjobs.jobs.api import SWEEP_TARGET, Job, _call, _ensure_service
from daskjobs.jobs.model import JobSpec

if TYPE_CHECKING:
    from daskjobs.jobs.runner import Attempt
    from daskjobs.sweep import Sweep

__all__ = ["run_sweep", "submit_sweep", "sweep_identity"]

#: Prefix of the store key under which a submitted sweep's pickle is kept.
PREFIX = "daskjobs-sweep-"


def sweep_identity(sweep: Sweep, outputs: Iterable[str] | None = None) -> str:
    """A hash of the sweep's content keys (and of the output stages asked for)."""
    h = hashlib.blake2b(digest_size=16)
    for key in sorted(sweep.nodes):
        h.update(key.encode())
        h.update(b"\0")
    for name in sorted(outputs or ()):
        h.update(b"out:" + name.encode() + b"\0")
    return h.hexdigest()


def submit_sweep(
    client: Any,
    sweep: Sweep,
    *,
    name: str | None = None,
    outputs: Iterable[str] | None = None,
    store: str | None = None,
    kind: str = "inference",
    ledger: str | None = None,
    job_store: str | None = None,
    **spec_kwargs: Any,
) -> Job:
    """Submit ``sweep`` as one job (module docs); its :class:`~daskjobs.jobs.Job`.

    ``name`` defaults to the sweep's name; ``outputs`` names the stages whose results
    the job returns (default: the sweep's last stages, as :meth:`Sweep.run`); ``store``
    is the sweeps' result store as the workers see it (default ``daskjobs.store``);
    ``kind`` and the other keywords (``team=``, ``priority=``, ``retries=``, ...) go to
    the :class:`~daskjobs.jobs.JobSpec`; ``ledger`` and ``job_store`` apply when this
    call registers the jobs service. ``job.result()`` is a dict: ``table`` (the
    result's :meth:`~daskjobs.SweepResult.table`), ``computed``, ``hits``, ``reruns``,
    ``failures`` (one line each) and ``seconds``.
    """
    from daskjobs.sweep import Sweep

    if not isinstance(sweep, Sweep):
        raise TypeError(f"submit_sweep expects a daskjobs.Sweep, got {type(sweep).__name__}")
    if not sweep.stages:
        raise ValueError(f"sweep {sweep.name!r} has no stages: nothing to run")
    wanted = sorted(outputs) if outputs is not None else None
    for stage in wanted or ():
        if stage not in sweep.stages:
            raise ValueError(
                f"sweep {sweep.name!r} has no stage {stage!r} (its stages: "
                f"{', '.join(sweep.stages)})"
            )
    key = PREFIX + sweep_identity(sweep, wanted)
    spec = JobSpec(
        name or sweep.name,
        kind=kind,
        parts=1,
        target=SWEEP_TARGET,
        params={
            "sweep": key,
            "store": ResultStore(store or default_store_url()).url,
            "outputs": wanted,
        },
        **spec_kwargs,
    )
    _ensure_service(client, ledger, job_store)
    record = _call(
        client,
        "submit",
        spec=spec.to_json(),
        attach=[key, cloudpickle.dumps(sweep)],
        client_id=client.id,
    )
    return Job(client, record["job_id"])


def run_sweep(
    attempt: Attempt, sweep: str, store: str, outputs: list[str] | None = None
) -> dict[str, Any]:
    """The job's function: load the sweep, run it from this worker, summarise it."""
    from distributed import worker_client

    loaded = cloudpickle.loads(attempt._store.get(sweep))
    stages = None if outputs is None else [loaded.stages[name] for name in outputs]
    with worker_client() as client:  # leaves the worker's thread to the sweep's tasks
        result = loaded.run(client, store=store, outputs=stages, progress=False)
    return {
        "table": result.table(),
        "computed": result.computed,
        "hits": result.hits,
        "reruns": result.reruns,
        "failures": [str(f) for f in result.failures],
        "seconds": result.seconds,
    }
