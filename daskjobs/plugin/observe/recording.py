"""Recording a run as a trace (schema: docs/reference/trace-format.md).

With ``record: run.jsonl`` in the config, ``JobsPlugin(record=...)`` or, for a
while, :func:`daskjobs.record`, the plugin writes the graph, the workers and every
attempt as JSON Lines. The hooks only hand small dicts to a bounded queue
(:class:`~daskjobs.plugin.observe.recorder.TraceRecorder`); a thread writes them. True
start times come from :class:`~daskjobs.plugin.workers.worker.StartReporter`, the worker
plugin the plugin installs. A recording a client asks for is confined to
``daskjobs.record-dir`` (the trust model, docs/how-to/load-the-plugin.md#trust).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from daskjobs.config import Settings
from daskjobs.plugin.audit import Audit
from daskjobs.plugin.observe.recorder import TraceRecorder
from daskjobs.plugin.views import LiveTask, stage_of

if TYPE_CHECKING:
    from dask.typing import Key
    from distributed.scheduler import Scheduler

__all__ = ["Recording"]


async def _nothing() -> None:
    return None


class Recording:
    """The current recording (``recorder``, None while not recording) and its records.

    ``is_copy(key)`` tells backup copies apart (they are told as their task's attempt);
    ``reporters_changed`` is awaited when a recording starts or stops (the start reporter
    is installed while a recording runs).
    """

    def __init__(self, settings: Settings, audit: Audit, tasks: Mapping[Key, LiveTask]) -> None:
        self.settings = settings
        self.audit = audit
        self.tasks = tasks
        self.reporters_changed: Callable[[], Awaitable[None]] = _nothing
        self.scheduler: Scheduler = None  # type: ignore[assignment]  # set at start
        self.recorder: TraceRecorder | None = None
        self.by_client = False
        self.is_copy: Callable[[Key], bool] = lambda key: False
        self._running: dict[Key, str | None] = {}  # key -> worker, while processing

    # -- starting and stopping ------------------------------------------------------
    def client_path(self, path: str) -> str:
        """Where a client's recording goes: inside ``daskjobs.record-dir`` (default: the
        scheduler's working directory), or a clear refusal."""
        if not self.settings.clients.record:
            raise PermissionError(
                "daskjobs: clients may not record on this scheduler "
                "(daskjobs.clients.record is false); ask the operator"
            )
        base = os.path.realpath(self.settings.record_dir or os.getcwd())
        full = os.path.abspath(os.path.join(base, os.path.expanduser(path)))
        parent = os.path.realpath(os.path.dirname(full))
        if os.path.commonpath([base, parent]) != base or os.path.basename(full) in ("", ".", ".."):
            raise PermissionError(
                f"daskjobs: a client's trace must be written inside {base!r} "
                f"(daskjobs.record-dir on the scheduler); {path!r} is outside it"
            )
        return os.path.join(parent, os.path.basename(full))

    async def start(self, path: str, by_client: bool = False) -> TraceRecorder:
        if self.recorder is not None:
            raise RuntimeError(
                f"daskjobs is already recording to {self.recorder.path!r}; stop that first"
            )
        sched = self.scheduler
        if by_client:
            path = self.client_path(path)
        rec = TraceRecorder(
            path,
            exclusive=by_client,
            header={
                "policy": self.settings.policy,
                "settings": dataclasses.asdict(self.settings),
                "scheduler": getattr(sched, "address", None),
                "clock": "time.time() of the scheduler, seconds; worker_* fields: the worker's",
            },
        )
        self.recorder = self.audit.recorder = rec
        self.by_client = by_client
        now = time.time()
        for ws in list(sched.workers.values()):
            rec.emit(self.worker_record(ws, now, existing=True))
        if sched.tasks:  # recording starts mid-run: what is already there, once
            self.graph(list(sched.tasks.values()), existing=True)
        await self.reporters_changed()
        self.audit.event("recording", path=rec.path)
        return rec

    async def stop(self) -> dict[str, Any] | None:
        rec = self.recorder
        if rec is None:
            return None
        self.audit.event("recording-stopped", path=rec.path)
        self.recorder = self.audit.recorder = None
        self._running.clear()
        await self.reporters_changed()
        await asyncio.to_thread(rec.close)
        return rec.stats()

    async def rpc(self, action: str = "status", path: Any = None) -> dict[str, Any]:
        """``daskjobs.record``'s request (a client's): start, stop or status."""
        if action == "start":
            if not path:
                raise ValueError("daskjobs.record: give the path of the trace file to write")
            rec = await self.start(str(path), by_client=True)
            return {"recording": True, **rec.stats()}
        if action == "stop":
            if self.recorder is not None and not self.by_client:
                raise PermissionError(
                    f"daskjobs: the recording to {self.recorder.path!r} is the "
                    "operator's (daskjobs.record); a client cannot stop it"
                )
            return {"recording": False, "stats": await self.stop()}
        if action == "status":
            cur = self.recorder
            return {"recording": cur is not None, "stats": cur.stats() if cur else None}
        raise ValueError(f"daskjobs_record: unknown action {action!r} (start, stop, status)")

    # -- records ------------------------------------------------------------------
    @staticmethod
    def worker_record(ws: Any, now: float, existing: bool = False) -> dict[str, Any]:
        rec = {
            "type": "worker-added",
            "time": now,
            "worker": ws.address,
            "name": ws.name,
            "host": ws.host,
            "nthreads": ws.nthreads,
            "resources": dict(ws.resources),
            "memory_limit": ws.memory_limit,
        }
        if existing:
            rec["existing"] = True
        return rec

    def graph(self, new: Sequence[Any], existing: bool = False) -> None:
        rec = self.recorder
        if rec is None:
            return
        now = time.time()
        default_team = self.settings.teams.default
        for ts in new:
            if self.is_copy(ts.key):
                continue  # a backup copy is told in the trace as its task's attempt
            try:
                v = self.tasks.get(ts.key)
                ann = ts.annotations or {}
                p = ts.priority
                r = {
                    "type": "graph",
                    "time": now,
                    "key": ts.key,
                    "deps": [d.key for d in ts.dependencies],
                    "annotations": dict(ann),
                    "estimate": v.estimate if v else None,
                    "estimate_source": v.source if v else None,
                    "team": v.team if v else str(ann.get("team", default_team)),
                    "stage": v.stage if v else stage_of(ts),
                    "resources": dict(ts.resource_restrictions or {}) or None,
                    "user_priority": -p[0] if p else 0,
                    "priority": list(p) if p else None,
                    "submit": v.submit if v else now,
                }
                if v is not None and v.params and "params" not in ann:
                    r["params"] = dict(v.params)  # read from the task's own call
                if existing:
                    r["existing"] = True
                    r["state"] = ts.state
                rec.emit(r)
            except Exception:
                self.audit.failed("record", ts.key)

    def transition(self, key: Key, start: str, finish: str, kwargs: dict[str, Any]) -> None:
        rec = self.recorder
        assert rec is not None
        now = time.time()
        stimulus = kwargs.get("stimulus_id")
        if finish == "processing":
            ts = self.scheduler.tasks.get(key)
            ws = ts.processing_on if ts is not None else None
            addr = ws.address if ws is not None else None
            self._running[key] = addr
            r0 = {"type": "assigned", "time": now, "key": key, "worker": addr}
            r0["stimulus_id"] = stimulus
            rec.emit(r0)
            return
        # leaving processing: the attempt is over
        worker = self._running.pop(key, None)
        worker = kwargs.get("worker") or worker
        ts = self.scheduler.tasks.get(key)
        if finish in ("memory", "erred"):
            outcome = finish
        elif isinstance(stimulus, str) and stimulus.startswith("task-erred"):
            outcome = "erred"  # an error dask retries (processing -> waiting)
        else:
            outcome = finish
        c_start = c_stop = None
        compute = transfer = 0.0
        seen = False
        for ss in kwargs.get("startstops") or ():
            action = ss.get("action")
            if action == "compute":
                seen = True
                compute += ss["stop"] - ss["start"]
                c_start = ss["start"] if c_start is None else min(c_start, ss["start"])
                c_stop = ss["stop"] if c_stop is None else max(c_stop, ss["stop"])
            elif action == "transfer":
                transfer += ss["stop"] - ss["start"]
        r: dict[str, Any] = {
            "type": "finished",
            "time": now,
            "key": key,
            "worker": worker,
            "run_id": getattr(ts, "run_id", None),
            "state": finish,
            "outcome": outcome,
            "compute_start": c_start,
            "compute_stop": c_stop,
            "duration": compute if seen else None,
            "transfer": transfer,
            "nbytes": kwargs.get("nbytes"),
            "stimulus_id": stimulus,
        }
        if outcome == "erred" and kwargs.get("exception_text"):
            r["error"] = str(kwargs["exception_text"])[:500]
        rec.emit(r)

    def started(self, key: Key, worker: str, msg: Mapping[str, Any]) -> None:
        rec = self.recorder
        if rec is None:
            return
        rec.emit(
            {
                "type": "started",
                "time": time.time(),
                "key": key,
                "worker": worker,
                "run_id": msg.get("run_id"),
                "worker_time": msg.get("time"),
            }
        )

    def worker_added(self, ws: Any) -> None:
        if self.recorder is not None and ws is not None:
            self.recorder.emit(self.worker_record(ws, time.time()))

    def worker_removed(self, worker: str, stimulus_id: str) -> None:
        if self.recorder is not None:
            self.recorder.emit(
                {
                    "type": "worker-removed",
                    "time": time.time(),
                    "worker": worker,
                    "stimulus_id": stimulus_id,
                }
            )
