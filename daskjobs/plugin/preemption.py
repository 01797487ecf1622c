"""The live half of preemption: interactive (TE) tasks take resources back from
best-effort (BE) ones that checkpoint (docs/preemption.md, "Live on dask").

Every decision is the preemption policy's, the object the job-level simulator runs
(:mod:`daskjobs.policies.preemption`): which waiting TE task is served first
(``order_key``), on which worker a TE task that fits goes (``place``), and which running
BE tasks of one worker make room for one that does not (``victims``: fit, least work lost
since their last checkpoints, exempt time, at most so many preemptions per task). This
driver adapts dask's state into the policy's views, and enacts the answer:

* a task's resource need is its ``resources={NAME: n}`` restriction for the configured
  resource (``daskjobs.preemption.resource``, default ``GPU``: dask's own worker
  resources, ``dask worker --resources GPU=2``); its class is its ``job_class``
  annotation (``te``; anything else is ``be``, the default);
* a worker's free amount is what it supplies less what the tasks *executing* there hold
  (dask's ``used_resources`` also counts tasks only queued on it) and less what is
  promised to a TE task whose victims are yielding;
* victims are told through their worker (the worker plugin's ``daskjobs-preempt``
  message): ``daskjobs.preempted()`` turns True in the task, which checkpoints and raises
  ``daskjobs.Preempted`` (dask's ``Reschedule``): dask runs it again later and
  ``daskjobs.restore()`` gives it its state. Until its thread returns, its resources stay
  held (dask releases them only then): nothing is oversubscribed while it winds down;
* the TE task is moved to the victims' worker if dask queued it elsewhere (a worker
  restriction it had not got from its user, removed once it starts);
* a victim that has not yielded ``grace`` seconds after it was asked is counted as
  ignoring the signal (dask cannot stop a thread): it keeps its slot, is never asked
  again in this run, and the TE task's promise is dropped so that another choice can be
  made.

Hooks are O(1) per transition; the choice runs on a periodic callback, off dask's
transition loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from daskjobs.plugin.worker import PREEMPT_OP

if TYPE_CHECKING:
    from dask.typing import Key
    from distributed.scheduler import Scheduler

    from daskjobs.plugin.audit import Audit
    from daskjobs.plugin.views import LiveTask
    from daskjobs.policies.preemption import PreemptionPolicy

__all__ = ["Preemptor"]

decisions = logging.getLogger("daskjobs.decisions")


@dataclass(frozen=True, slots=True)
class _Job:
    """A task as the preemption policy sees a job."""

    jid: Any
    cls: str
    gpus: float
    arrival: float


@dataclass(frozen=True, slots=True)
class _Node:
    index: int
    gpus: float
    available: float


@dataclass(slots=True, eq=False)
class _Run:
    """A run of a task that holds the resource, from its true start."""

    job: _Job
    node: int
    worker: str
    started: float
    run_id: int
    preemptions: int
    last: float  # its last checkpoint (or its start)

    def lost_at(self, t: float) -> float:
        """Resource-seconds lost if it yielded at ``t``: the work since its checkpoint."""
        return max(t - self.last, 0.0) * self.job.gpus


@dataclass(slots=True)
class _Promise:
    """Resources of ``worker`` promised to a TE task while its victims yield."""

    worker: str
    gpus: float
    victims: list[Key]
    asked: float


@dataclass
class PreemptionStats:
    requested: int = 0  # victims asked to yield
    yielded: int = 0  # ... that gave their slot back (raised daskjobs.Preempted)
    finished_first: int = 0  # ... that ended before they yielded
    ignored: int = 0  # ... that had not yielded after the grace period
    lost_with_worker: int = 0  # ... whose worker left before they yielded
    moved: int = 0  # TE tasks moved to the worker their victims free
    lost_seconds: float = 0.0  # resource-seconds of work since the victims' checkpoints
    preemptions: dict[str, int] = field(default_factory=dict)  # task -> times preempted

    def to_dict(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "yielded": self.yielded,
            "finished_first": self.finished_first,
            "ignored": self.ignored,
            "lost_with_worker": self.lost_with_worker,
            "moved": self.moved,
            "lost_seconds": round(self.lost_seconds, 3),
            "max_per_task": max(self.preemptions.values(), default=0),
        }


class Preemptor:
    """Drives preemption for the plugin (see the module docs)."""

    def __init__(
        self,
        policy: PreemptionPolicy,
        resource: str,
        grace: float,
        interval: float,
        audit: Audit,
        tasks: Mapping[Key, LiveTask],
    ) -> None:
        self.policy = policy
        self.resource = resource
        self.grace = grace
        self.interval = interval
        self.audit = audit
        self.tasks = tasks  # the ranked tasks' views (job_class)
        self.scheduler: Scheduler = None  # type: ignore[assignment]  # set at start
        self.runs: dict[Key, _Run] = {}  # tasks executing with the resource
        self.waiting: dict[Key, float] = {}  # TE tasks waiting for the resource -> since
        self.arrived: dict[Key, float] = {}  # TE task -> when it first waited
        self.promises: dict[Key, _Promise] = {}  # TE task -> what its victims free
        self.asked: dict[Key, float] = {}  # victim -> when it was asked
        self.ignoring: set[Key] = set()  # victims that kept their slot past the grace
        self.moved: dict[Key, Any] = {}  # TE task -> its own worker restrictions
        self.checkpoints: dict[Key, float] = {}  # task -> its last checkpoint
        self.stats = PreemptionStats()
        self._pc: Any = None

    # -- lifecycle ---------------------------------------------------------------------
    def start(self, scheduler: Any) -> None:
        from tornado.ioloop import PeriodicCallback

        self.scheduler = scheduler
        self._pc = PeriodicCallback(self._tick, self.interval * 1000)
        scheduler.periodic_callbacks["daskjobs-preemption"] = self._pc
        self._pc.start()

    def close(self) -> None:
        if self._pc is not None:
            self._pc.stop()
            if self.scheduler is not None:
                self.scheduler.periodic_callbacks.pop("daskjobs-preemption", None)

    # -- what the plugin tells it --------------------------------------------------------
    def _need(self, ts: Any) -> float:
        rr = ts.resource_restrictions if ts is not None else None
        return float(rr.get(self.resource, 0.0)) if rr else 0.0

    def _class(self, key: Key) -> str:
        v = self.tasks.get(key)
        return v.job_class if v is not None else "be"

    def transition(self, key: Key, start: str, finish: str, stimulus_id: str = "") -> None:
        """Every scheduler transition (O(1))."""
        if finish in ("processing", "no-worker"):
            if start not in ("processing", "no-worker") and self._class(key) == "te":
                ts = self.scheduler.tasks.get(key)
                if self._need(ts) > 0:
                    since = self.arrived.setdefault(key, time.time())
                    self.waiting.setdefault(key, since)
            return
        if start not in ("processing", "no-worker"):
            if finish == "forgotten":
                self.arrived.pop(key, None)
                self.checkpoints.pop(key, None)
                self.moved.pop(key, None)
            return
        self.runs.pop(key, None)
        if not (key in self.moved and finish in ("released", "waiting")):  # not our move
            self.waiting.pop(key, None)
            self.promises.pop(key, None)
            if finish in ("memory", "erred", "forgotten"):
                self._unmove(key)
                self.arrived.pop(key, None)
        asked = self.asked.pop(key, None)
        if asked is None:
            return
        self.ignoring.discard(key)
        if finish in ("released", "waiting") and not stimulus_id.startswith("reschedule"):
            self.stats.lost_with_worker += 1  # its worker went first: not a yield
        elif finish in ("released", "waiting"):  # rescheduled: it raised Preempted
            st = self.stats
            st.yielded += 1
            name = str(key)
            st.preemptions[name] = st.preemptions.get(name, 0) + 1
            self.audit.event("preempt-yielded", key=name)
        else:
            self.stats.finished_first += 1

    def started(self, key: Key, worker: str, run_id: Any, when: float) -> None:
        """A worker reports a true start (the reporter's ``daskjobs-started`` event)."""
        ts = self.scheduler.tasks.get(key)
        need = self._need(ts)
        if need <= 0 or ts is None or ts.state != "processing":
            return
        if ts.processing_on is None or ts.processing_on.address != worker:
            return
        self.waiting.pop(key, None)
        self.promises.pop(key, None)
        self._unmove(key)
        cls = self._class(key)
        job = _Job(key, cls, need, when)
        last = max(self.checkpoints.get(key, when), when)
        self.runs[key] = _Run(
            job, -1, worker, when, int(run_id or 0), self.stats.preemptions.get(str(key), 0), last
        )

    def checkpointed(self, key: Key, when: float) -> None:
        self.checkpoints[key] = when
        run = self.runs.get(key)
        if run is not None and when > run.last:
            run.last = when

    # -- the periodic choice ---------------------------------------------------------------
    def _tick(self) -> None:
        try:
            self.check(time.time())
        except Exception:
            self.audit.failed("preemption")

    def _nodes(self) -> tuple[list[Any], list[_Node], dict[str, int]]:
        """Workers that supply the resource (address order), their views, and indices."""
        res = self.resource
        workers = sorted(
            (
                ws
                for ws in self.scheduler.workers.values()
                if ws.resources.get(res, 0) > 0 and ws.status.name == "running"
            ),
            key=lambda ws: ws.address,
        )
        index = {ws.address: i for i, ws in enumerate(workers)}
        held = {a: 0.0 for a in index}
        for r in self.runs.values():
            if r.worker in held:
                held[r.worker] += r.job.gpus
        promised = {a: 0.0 for a in index}
        for p in self.promises.values():
            if p.worker in promised:
                promised[p.worker] += p.gpus
        nodes = [
            _Node(i, float(ws.resources[res]), float(ws.resources[res]) - held[a] - promised[a])
            for i, (a, ws) in enumerate((ws.address, ws) for ws in workers)
        ]
        return workers, nodes, index

    def check(self, now: float) -> None:
        self._expire(now)
        if not self.waiting:
            return
        sched = self.scheduler
        workers, nodes, index = self._nodes()
        if not workers:
            return
        jobs = []
        for key, since in self.waiting.items():
            if key in self.promises:
                continue
            ts = sched.tasks.get(key)
            if ts is None:
                continue
            jobs.append((_Job(key, "te", self._need(ts), since), ts))
        policy = self.policy
        jobs.sort(key=lambda j: policy.order_key(j[0]))
        for job, ts in jobs:
            on = ts.processing_on.address if ts.processing_on is not None else None
            here = next((n for n in nodes if on is not None and index.get(on) == n.index), None)
            if here is not None and here.available >= job.gpus:
                continue  # it starts on its worker as soon as the worker gets to it
            fit = policy.place(job, nodes)
            if fit is not None:
                self._move(ts, workers[fit], "fits")
                nodes = self._nodes()[1]
                continue
            running = []
            for r in self.runs.values():
                jid = r.job.jid
                if r.worker in index and jid not in self.asked and jid not in self.ignoring:
                    r.node = index[r.worker]
                    running.append(r)
            choice = policy.victims(job, nodes, running, now)
            if choice is None:
                decisions.debug("%s: waits, no victims fit (%s)", job.jid, policy.name)
                continue
            node, victims = choice
            ws = workers[node]
            self._ask(job, ws, victims, now)
            nodes = self._nodes()[1]

    def _ask(self, job: _Job, ws: Any, victims: list[_Run], now: float) -> None:
        keys = [v.job.jid for v in victims]
        freed = sum(v.job.gpus for v in victims)
        lost = sum(v.lost_at(now) for v in victims)
        self.promises[job.jid] = _Promise(ws.address, freed, keys, now)
        for v in victims:
            self.asked[v.job.jid] = now
        st = self.stats
        st.requested += len(victims)
        st.lost_seconds += lost
        by_worker: dict[str, list[Key]] = {}
        for v in victims:
            by_worker.setdefault(v.worker, []).append(v.job.jid)
        for address, ks in by_worker.items():
            comm = self.scheduler.stream_comms.get(address)
            if comm is not None:
                comm.send({"op": PREEMPT_OP, "keys": ks})
        decisions.debug(
            "%s: preempts %s on %s (%.1f resource-seconds since their checkpoints)",
            job.jid,
            keys,
            ws.address,
            lost,
        )
        self.audit.event(
            "preempt-requested",
            key=str(job.jid),
            worker=ws.address,
            victims=[str(k) for k in keys],
            lost_seconds=round(lost, 3),
        )
        ts = self.scheduler.tasks.get(job.jid)
        if ts is not None:
            self._move(ts, ws, "victims")

    def _expire(self, now: float) -> None:
        """Victims that kept their slot past the grace period: counted, never asked
        again; the TE task's promise goes so that another choice can be made."""
        for te, p in list(self.promises.items()):
            if now - p.asked < self.grace:
                continue
            late = [k for k in p.victims if k in self.asked]
            if not late:
                continue
            for k in late:
                self.asked.pop(k, None)
                self.ignoring.add(k)
            self.stats.ignored += len(late)
            del self.promises[te]
            self.audit.event(
                "preempt-ignored", key=str(te), victims=[str(k) for k in late], grace=self.grace
            )

    def worker_removed(self, address: str) -> None:
        """A worker left (dask has moved its tasks already): what was promised there is
        void, and a TE task moved there is let go wherever dask can run it."""
        for te, p in list(self.promises.items()):
            if p.worker == address:
                del self.promises[te]
        for key in list(self.moved):
            ts = self.scheduler.tasks.get(key)
            if ts is None or ts.worker_restrictions != {address}:
                continue
            self._unmove(key)
            if ts.state == "no-worker":
                self.scheduler.transitions({key: "released"}, stimulus_id="daskjobs-unmove")

    # -- moving a waiting TE task to the worker with room ----------------------------------
    def _move(self, ts: Any, ws: Any, why: str) -> None:
        """Send waiting TE task ``ts`` to worker ``ws`` (dask queued it elsewhere)."""
        if ts.state not in ("processing", "no-worker"):
            return
        if ts.processing_on is ws:
            return
        if ts.key not in self.moved:
            if ts.worker_restrictions:  # its user's restriction: not ours to change
                return
            self.moved[ts.key] = (set(), ts.loose_restrictions)
        ts.worker_restrictions = {ws.address}
        ts.loose_restrictions = False
        self.stats.moved += 1
        decisions.debug("%s: moved to %s (%s)", ts.key, ws.address, why)
        self.scheduler.transitions({ts.key: "released"}, stimulus_id=f"daskjobs-preempt-{why}")

    def _unmove(self, key: Key) -> None:
        """A moved TE task started (or left): its restriction was ours, it goes."""
        saved = self.moved.pop(key, None)
        if saved is None:
            return
        ts = self.scheduler.tasks.get(key)
        if ts is not None:
            ts.worker_restrictions = saved[0] or None
            ts.loose_restrictions = saved[1]

    def status(self) -> dict[str, Any]:
        return {
            "policy": self.policy.describe(),
            "resource": self.resource,
            "grace": self.grace,
            **self.stats.to_dict(),
            "waiting_te": len(self.waiting),
            "running": len(self.runs),
            "asked": sorted(str(k) for k in self.asked),
        }
