"""The client side of jobs: ``daskjobs.jobs.submit(client, ...)`` and the :class:`Job`
handle.

Every call goes to the scheduler's jobs service (:class:`daskjobs.jobs.JobsService`)
through one RPC handler; a scheduler without the service gets it registered on the
first :func:`submit` (a laptop ``LocalCluster`` needs nothing else; an operator loads it
with the preload and ``daskjobs.jobs.enabled``)."""

from __future__ import annotations

import pickle
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import cloudpickle

from daskjobs.jobs.model import JobInfo, JobSpec, JobSpecError, Progress
from daskjobs.jobs.runner import INLINE
from daskjobs.jobs.service import REFUSED

__all__ = ["Job", "JobFailed", "list_jobs", "submit"]

#: The function of a sweep submitted as a job (daskjobs.jobs.sweeps).
SWEEP_TARGET = "daskjobs.jobs.sweeps:run_sweep"


class JobFailed(RuntimeError):
    """The job failed (a part used up its retries) or was cancelled."""


def _call(client: Any, op: str, **kw: Any) -> Any:
    result = client.sync(client.scheduler.daskjobs_jobs, action=op, **kw)
    if isinstance(result, dict) and REFUSED in result:  # the client's own input
        raise pickle.loads(result[REFUSED])
    if result is None and op == "status":
        raise RuntimeError(
            "the daskjobs jobs service is not loaded on this scheduler: daskjobs.jobs.submit "
            "registers it, or start the scheduler with --preload daskjobs.preload and "
            "daskjobs.jobs.enabled: true"
        )
    return result


def _has_service(dask_scheduler: Any) -> bool:
    return "daskjobs-jobs" in dask_scheduler.plugins


#: schedulers (by their id) known to run the service: asked once per scheduler, not once
#: per submission (a new scheduler has a new id)
_serving: set[str] = set()


def _ensure_service(client: Any, ledger: str | None, store: str | None) -> None:
    # asked without calling the service's handler: a scheduler without it would log
    # the unknown operation as an error
    scheduler_id = str(client.scheduler_info().get("id", ""))
    if scheduler_id and scheduler_id in _serving:
        return
    if not client.run_on_scheduler(_has_service):
        from daskjobs.jobs.service import JobsService

        client.register_plugin(JobsService(ledger=ledger, store=store))
    if scheduler_id:
        _serving.add(scheduler_id)


def submit(
    client: Any,
    spec: JobSpec | str,
    function: Callable[..., Any] | None = None,
    *,
    ledger: str | None = None,
    store: str | None = None,
    **spec_kwargs: Any,
) -> Job:
    """Submit a job and return its handle.

    ``spec`` is a :class:`JobSpec` or a job name (then ``spec_kwargs`` are the rest of
    the spec: ``kind=``, ``parts=``, ``params=``, ``team=``, ``retries=``, ...); a job that
    names no team is its client's (the team it stated, or its certificate's where teams are
    bound to identity: docs/how-to/teams.md). What runs
    is ``function`` (pickled into the store; the job then depends on this pickle) or the
    spec's ``target`` (``"module:function"``, importable on the workers: resubmitting
    from a new session gives the same job). It is called as
    ``function(attempt, **params)`` once per part; see :class:`daskjobs.jobs.Attempt`.

    Submitting the same job again returns the same job: only its missing parts run.
    ``ledger`` and ``store`` apply when this call registers the service.
    """
    if isinstance(spec, str):
        spec = JobSpec.from_json({"name": spec, **spec_kwargs})  # a field it lacks: named
    elif not isinstance(spec, JobSpec):
        raise JobSpecError(
            "name",
            f"JobSpec.name: expected a job name (a string) or a JobSpec, got {type(spec).__name__}",
        )
    elif spec_kwargs:
        raise TypeError("give either a JobSpec or a name with keywords, not both")
    if function is None and not spec.target:
        raise JobSpecError(
            "target",
            f"daskjobs job {spec.name!r}: nothing to run (give a function or "
            "target='module:function')",
        )
    if function is not None and not callable(function):
        raise TypeError(f"daskjobs job {spec.name!r}: {function!r} is not callable")
    if function is None:
        _check_target(client, spec)  # before the ledger records anything
    _ensure_service(client, ledger, store)
    payload = cloudpickle.dumps(function) if function is not None else None
    # the client's id: a job that names no team is its client's (the scheduler decides)
    record = _call(client, "submit", spec=spec.to_json(), function=payload, client_id=client.id)
    return Job(client, record["job_id"])


#: (scheduler id, target) pairs whose function the cluster was found to have: asked once
#: per scheduler and target, not once per submission
_resolved: set[tuple[str, str]] = set()


def _resolvable(target: str) -> str | None:
    """Run where the job will run: why ``target`` cannot be called there, or None."""
    import importlib

    module, _, name = target.partition(":")
    try:
        fn: Any = importlib.import_module(module)
        for attr in name.split("."):
            fn = getattr(fn, attr)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None if callable(fn) else f"{name} is a {type(fn).__name__}, not a function"


def _check_target(client: Any, spec: JobSpec) -> None:
    """Refuse a ``module:function`` target the cluster cannot call (its module does not
    import, or has no such function) before the job is recorded, as a sweep's stage
    modules are checked: asked of every worker, where attempts run. With no worker
    connected yet (a cluster that scales up) nothing is asked: the scheduler need not
    import the target, and a target no worker can call fails its attempts, naming why."""
    target = spec.target
    if target.startswith("store:"):
        return
    scheduler_id = str(client.scheduler_info().get("id", ""))
    if (scheduler_id, target) in _resolved:
        return
    workers = client.scheduler_info(n_workers=-1).get("workers", {})
    if not workers:
        return
    names = {addr: str(w.get("name", addr)) for addr, w in workers.items()}
    found = client.run(_resolvable, target, on_error="return")
    failed = {
        names.get(addr, addr): (f"{type(r).__name__}: {r}" if isinstance(r, BaseException) else r)
        for addr, r in found.items()
        if r is not None
    }
    if failed:
        where = sorted(failed)
        raise JobSpecError(
            "target",
            f"JobSpec.target: {target!r} cannot be called on this cluster ({failed[where[0]]} "
            f"on {', '.join(where[:5])}{' and others' if len(where) > 5 else ''}); nothing "
            "was recorded. Install its module where the workers run (the same environment "
            "as this client), or pass the function itself: jobs.submit(client, name, function)",
        )
    if scheduler_id:
        _resolved.add((scheduler_id, target))


def list_jobs(client: Any, *, team: str | None = None, state: str | None = None) -> list[JobInfo]:
    """The ledger's jobs (oldest first), optionally of one team or in one state: each a
    :class:`~daskjobs.jobs.model.JobInfo` (times as UTC datetimes)."""
    return [JobInfo.from_json(d) for d in _call(client, "list", team=team, state=state)]


#: What ``wait(progress=...)`` and ``result(progress=...)`` take: True (a line of text on
#: stderr at each change), a callable given each :class:`Progress`, or None/False.
ProgressArg = bool | Callable[[Progress], Any] | None


def _reporter(progress: ProgressArg, name: str) -> Callable[[Progress], Any] | None:
    if progress is None or progress is False:
        return None
    if progress is True:

        def line(p: Progress) -> None:
            # one line a change, flushed: readable in a terminal, a log or a notebook
            # (the sweep's progress without a terminal, and no tqdm)
            sys.stderr.write(p.line(name) + "\n")
            sys.stderr.flush()

        return line
    if callable(progress):
        return progress
    raise TypeError(f"progress: expected True, a callable or None, got {progress!r}")


class Job:
    """A handle on a job in the ledger: cheap to make, safe to pickle by its id."""

    def __init__(self, client: Any, job_id: str) -> None:
        self.client = client
        self.job_id = job_id

    def __repr__(self) -> str:
        return f"<daskjobs Job {self.job_id}>"

    def status(self) -> dict[str, Any]:
        """The job's state, spec, attempts, committed outputs and missing parts."""
        return dict(_call(self.client, "job", job_id=self.job_id))

    @property
    def state(self) -> str:
        return str(self.status()["state"])

    def attempts(self) -> list[dict[str, Any]]:
        return list(self.status()["attempts"])

    def history(self) -> list[dict[str, Any]]:
        """Every transition of the job, its attempts and outputs, oldest first."""
        return list(_call(self.client, "history", job_id=self.job_id))

    def explain(self) -> str:
        """The job's story, one line per transition: what moved, when, and why."""
        lines = []
        start = None
        for h in self.history():
            start = h["at"] if start is None else start
            what = h["kind"] if h["kind"] != "attempt" else f"attempt {h['ref'][:8]}"
            move = f"{h['from_state'] or '-'} -> {h['to_state']}"
            why = f" ({h['reason']})" if h["reason"] else ""
            lines.append(f"+{h['at'] - start:8.2f}s  {what:<17} {move}{why}")
        return "\n".join(lines)

    def cancel(self) -> bool:
        """Cancel the job: queued parts do not start, running attempts are told to stop
        and their outputs are refused. False if it had ended already."""
        return bool(_call(self.client, "cancel", job_id=self.job_id))

    def retry(self) -> bool:
        """Run a failed or cancelled job's missing parts again."""
        return bool(_call(self.client, "retry", job_id=self.job_id))

    def wait(
        self, timeout: float | None = None, poll: float = 0.2, progress: ProgressArg = None
    ) -> dict[str, Any]:
        """Wait until the job ends; its final status. ``progress``: True writes a line
        (``job NAME: 3/10 parts committed, 2 running (running)``) to stderr whenever it
        changes; a callable gets each changed :class:`~daskjobs.jobs.model.Progress`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        report = _reporter(progress, self.job_id)
        last: Progress | None = None
        while True:
            if report is None:
                light = _call(self.client, "state", job_id=self.job_id)  # one row
            else:
                light = _call(self.client, "progress", job_id=self.job_id)
                now = Progress(
                    self.job_id,
                    light["state"],
                    light["parts"],
                    light["committed"],
                    light["running"],
                )
                if now != last:
                    report(now)
                    last = now
            if light["state"] in ("succeeded", "failed", "cancelled"):
                return self.status()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"daskjobs job {self.job_id} still {light['state']}")
            time.sleep(poll)

    def result(self, timeout: float | None = None, progress: ProgressArg = None) -> Any:
        """The job's output once it succeeded: the value of its one part, or the list of
        its parts' values (an inference job; a sweep's job gives its summary). Raises
        :class:`JobFailed` if it failed or was cancelled. Small values come from the
        ledger; values in the store are read by a worker and sent back. ``progress`` as
        for :meth:`wait`."""
        status = self.wait(timeout, progress=progress)
        if status["state"] != "succeeded":
            raise JobFailed(
                f"daskjobs job {self.job_id} {status['state']}: {status['reason'] or ''}".rstrip(
                    ": "
                )
            )
        outputs: Mapping[str, str] = status["outputs"]
        parts = range(len(outputs))
        values: dict[int, Any] = {}
        if any(outputs[str(p)].startswith(INLINE) for p in parts):
            inline = _call(self.client, "values", job_id=self.job_id)
            values.update({int(p): pickle.loads(v) for p, v in inline.items()})
        stored = [p for p in parts if not outputs[str(p)].startswith(INLINE)]
        if stored:
            futures = self.client.map(
                _load,
                [status["store"]] * len(stored),
                [outputs[str(p)] for p in stored],
                pure=False,
            )
            values.update(zip(stored, self.client.gather(futures), strict=True))
        ordered = [values[p] for p in parts]
        spec = status["spec"]
        if spec["kind"] != "inference" or spec["target"] == SWEEP_TARGET:
            return ordered[0]
        return ordered


def _load(store_url: str, key: str) -> Any:
    from daskjobs.cache.store import ResultStore

    return ResultStore(store_url).get(key)
