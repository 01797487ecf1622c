"""The live half of preemption: interactive (TE) tasks take resources back from
best-effort (BE) ones that checkpoint (docs/explanation/preemption.md, "Live on dask").

Every decision is the preemption policy's, the object the job-level simulator runs:
every ``interval`` this driver adapts dask's state into the policy's views and asks
:meth:`~daskjobs.policies.preemption.PreemptionPolicy.decide` once (the waiting tasks
that need the resource, TE and BE; the runs holding it; the workers' free and promised
units; the victims already asked), then enacts the decision in the order it was made,
through the verbs of :mod:`daskjobs.plugin.surgery._internals`:

* a task's resource need is its ``resources={NAME: n}`` restriction for the configured
  resource (``daskjobs.preemption.resource``, default ``GPU``: dask's own worker
  resources, ``dask worker --resources GPU=2``); its class is its ``job_class``
  annotation (``te``; anything else is ``be``, the default);
* a worker's free amount is what it supplies less what the tasks *executing* there hold
  (dask's ``used_resources`` also counts tasks only queued on it); its promised amount
  is what victims yielding there free for a TE task;
* **placements**: a waiting task placed on the worker it is queued on is left to it; one
  placed elsewhere is sent there (:func:`~daskjobs.plugin.surgery._internals.pin`, a worker
  restriction it had not got from its user, removed once it starts). A task with its
  user's own restrictions may use only those workers (the view's ``where``);
* **preemptions**: the victims are told through their worker (the worker plugin's
  ``daskjobs-preempt`` message): ``daskjobs.preempted()`` turns True in the task, which
  checkpoints and raises ``daskjobs.Preempted`` (dask's ``Reschedule``): dask runs it
  again later and ``daskjobs.restore()`` gives it its state. Until its thread returns,
  its resources stay held (dask releases them only then): nothing is oversubscribed
  while it winds down. The units they free are promised to the TE task, which is sent to
  their worker;
* **the reservation**: the worker held for the first BE task that fits nowhere gets it
  pinned there with a priority ahead of every BE task of its user priority (behind the
  TE ones): a dask worker starts its resource-constrained tasks in priority order and
  none past a head that does not fit, so no later BE task takes the units it waits for
  there until it starts (then its own restriction and priority are put back);
* a victim that has not yielded ``grace`` seconds after it was asked is counted as
  ignoring the signal (dask cannot stop a thread): it keeps its slot, is never asked
  again in this run, and the TE task's promise is dropped so that another choice can be
  made.

Each decision's reasons are kept for ``explain()`` (:meth:`Preemptor.why`) and go to the
audit trail with the events (``preempt-requested``, ``preempt-hold``). Hooks are O(1)
per transition; the decision runs on a periodic callback, off dask's transition loop.

The call of the policy and the enactment of its preemptions (the promises, the victims
asked, the grace, the counts and the audit) are one :class:`Enactor`, which this driver
extends with dask's own state and the placements; with resources on, the placer
(:mod:`daskjobs.plugin.enact.gangs`) places every resource task itself and hands each decision's
preemptions to an :class:`Enactor` of its own, over the same views.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from daskjobs.plugin.periodic import every
from daskjobs.plugin.surgery._internals import Pinned, ask_to_yield, pin, pinned, release, unpin
from daskjobs.plugin.workers.worker import PREEMPT_OP
from daskjobs.policies.preemption import Placement

if TYPE_CHECKING:
    from dask.typing import Key
    from distributed.scheduler import Scheduler

    from daskjobs.plugin.audit import Audit
    from daskjobs.plugin.views import LiveTask
    from daskjobs.policies.preemption import Hold, Preemption, PreemptionDecision, PreemptionPolicy

__all__ = ["Enactor", "Preemptor"]

decisions = logging.getLogger("daskjobs.decisions")

#: How far ahead of its user priority a held best-effort task goes: past every best-effort
#: task (0), behind the interactive ones (ranking puts them 0.5 ahead).
HOLD_AHEAD = 0.25


@dataclass(frozen=True, slots=True)
class _Job:
    """A task as the preemption policy sees a job (``jid``, ``cls``, ``gpus``)."""

    jid: Any
    cls: str
    gpus: float
    arrival: float


@dataclass(frozen=True, slots=True)
class _Waiting:
    """A waiting task, as the policy's waiting view."""

    jid: Any
    cls: str
    gpus: float
    arrival: float
    preemptions: int
    promised: int | None
    node: int | None
    where: frozenset[int] | None
    estimate: float | None

    def end_at(self, t: float) -> float:
        return math.inf if self.estimate is None else t + self.estimate


@dataclass(frozen=True, slots=True)
class _Node:
    index: int
    gpus: float
    free: float
    promised: float

    @property
    def available(self) -> float:
        return self.free - self.promised


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
    end: float = math.inf  # its expected end (start + estimate)
    group: Any = None  # its gang: a victim's gang yields whole
    lost: float | None = None  # what yielding loses, when more than its own work (a gang's)

    def lost_at(self, t: float) -> float:
        """Resource-seconds lost if it yielded at ``t``: the work since its checkpoint (for
        a gang member, ``lost``: the whole gang's)."""
        if self.lost is not None:
            return self.lost
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
    moved: int = 0  # waiting tasks sent to the worker the policy placed them on
    holds: int = 0  # best-effort tasks pinned to the worker held for them
    gangs_preempted: int = 0  # gangs a victim belonged to (each yields whole)
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
            "holds": self.holds,
            "gangs_preempted": self.gangs_preempted,
            "lost_seconds": round(self.lost_seconds, 3),
            "max_per_task": max(self.preemptions.values(), default=0),
        }


class Enactor:
    """The one live enactor of preemption decisions: one call of the policy a round, the
    record of its preemptions (the units promised to each interactive task, the victims
    asked and those ignoring the request), one schema of counts, one audit.

    A driver adapts its own state into the views (:class:`_Waiting`, :class:`_Run`,
    :class:`_Node`), asks :meth:`decide`, enacts each preemption with :meth:`ask`, and
    tells that record what happens to the victims (:meth:`left`, :meth:`expire`,
    :meth:`worker_removed`). Two drivers: :class:`Preemptor`, from dask's own state, and
    with resources on the placer (:class:`daskjobs.plugin.enact.gangs.Placer`), which places
    every resource task itself."""

    def __init__(self, policy: PreemptionPolicy, resource: str, grace: float, audit: Audit) -> None:
        self.policy = policy
        self.resource = resource
        self.grace = grace
        self.audit = audit
        self.scheduler: Scheduler = None  # type: ignore[assignment]  # set at start
        self.promises: dict[Key, _Promise] = {}  # TE task -> what its victims free
        self.asked: dict[Key, float] = {}  # victim -> when it was asked
        self.ignoring: set[Key] = set()  # victims that kept their slot past the grace
        self.reasons: dict[Key, str] = {}  # task -> the last decision's reason about it
        self.last: PreemptionDecision | None = None
        self.stats = PreemptionStats()

    def preempted(self, key: Key) -> int:
        """How many times ``key`` yielded so far."""
        return self.stats.preemptions.get(str(key), 0)

    def promised_on(self, addresses: Iterable[str]) -> dict[str, float]:
        """The units promised on each of ``addresses``."""
        promised = dict.fromkeys(addresses, 0.0)
        for p in self.promises.values():
            if p.worker in promised:
                promised[p.worker] += p.gpus
        return promised

    def why(self, key: Key) -> str | None:
        """The last decision's reason about ``key`` (for ``explain``)."""
        return self.reasons.get(key)

    # -- one decision, enacted ------------------------------------------------------------
    def decide(
        self, waiting: list[_Waiting], running: list[_Run], nodes: list[_Node], now: float
    ) -> PreemptionDecision:
        """One call of the policy over the views; the runs already asked (or ignoring the
        request) are never chosen again. The waiting tasks' reasons are kept."""
        signalled = set(self.asked) | self.ignoring
        decision = self.policy.decide(waiting, running, nodes, now, signalled)
        self.last = decision
        for w in decision.waits:
            self.reasons[w.job.jid] = w.reason
        return decision

    def ask(
        self,
        act: Preemption,
        address: str,
        keys: list[Key],
        units: float,
        where: Callable[[Key], str | None],
        now: float,
    ) -> None:
        """Enact ``act``: ``keys`` (its victims and those that yield with them) are asked to
        yield, each through the worker ``where`` names (none: it has not started, there is
        nothing to tell), and ``units`` of ``address`` are promised to its task."""
        job = act.job
        self.promises[job.jid] = _Promise(address, units, keys, now)
        for k in keys:
            self.asked[k] = now
            self.reasons[k] = f"asked to yield for {job.jid!r}"
        self.reasons[job.jid] = act.reason
        st = self.stats
        st.requested += len(keys)
        st.lost_seconds += act.lost
        st.gangs_preempted += len({v.group for v in act.victims if v.group is not None})
        by_worker: dict[str, list[Key]] = {}
        for k in keys:
            at = where(k)
            if at is not None:
                by_worker.setdefault(at, []).append(k)
        for worker, ks in by_worker.items():
            ask_to_yield(self.scheduler, worker, ks, PREEMPT_OP)
        decisions.debug("%s: %s", job.jid, act.reason)
        self.audit.event(
            "preempt-requested",
            key=str(job.jid),
            worker=address,
            victims=[str(k) for k in keys],
            lost_seconds=round(act.lost, 3),
            reason=act.reason,
        )

    # -- what happens to the victims --------------------------------------------------------
    def left(self, key: Key, finish: str, stimulus_id: str) -> None:
        """``key`` left ``processing`` for ``finish``: if it was asked to yield, how. A run
        that ignored the request is not asked again; once it ends, a new run may be."""
        self.ignoring.discard(key)
        asked = self.asked.pop(key, None)
        if asked is None:
            return
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

    def expire(self, now: float) -> None:
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
        """What was promised on ``address`` is void."""
        for te, p in list(self.promises.items()):
            if p.worker == address:
                del self.promises[te]

    def status(self) -> dict[str, Any]:
        return {
            "policy": self.policy.describe(),
            "resource": self.resource,
            "grace": self.grace,
            **self.stats.to_dict(),
            "asked": sorted(str(k) for k in self.asked),
        }


class Preemptor(Enactor):
    """Drives preemption for the plugin from dask's own state (see the module docs)."""

    def __init__(
        self,
        policy: PreemptionPolicy,
        resource: str,
        grace: float,
        interval: float,
        audit: Audit,
        tasks: Mapping[Key, LiveTask],
    ) -> None:
        super().__init__(policy, resource, grace, audit)
        self.interval = interval
        self.tasks = tasks  # the ranked tasks' views (job_class, estimate)
        self.runs: dict[Key, _Run] = {}  # tasks executing with the resource
        self.waiting: dict[Key, float] = {}  # tasks waiting for the resource -> since
        self.arrived: dict[Key, float] = {}  # task -> when it first waited
        self.moved: dict[Key, Pinned] = {}  # task -> what it had before this driver pinned it
        self.held: dict[Key, str] = {}  # the BE task the reservation holds a worker for
        self.sent: dict[Key, float] = {}  # waiting task -> when dask last sent it on
        self.checkpoints: dict[Key, float] = {}  # task -> its last checkpoint
        self._pc: Any = None

    # -- lifecycle ---------------------------------------------------------------------
    def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self._pc = every(scheduler, "daskjobs-preemption", self.interval, self._tick)

    def close(self) -> None:
        if self._pc is not None:
            self._pc.stop()

    # -- what the plugin tells it --------------------------------------------------------
    def _need(self, ts: Any) -> float:
        rr = ts.resource_restrictions if ts is not None else None
        return float(rr.get(self.resource, 0.0)) if rr else 0.0

    def _class(self, key: Key) -> str:
        v = self.tasks.get(key)
        return v.job_class if v is not None else "be"

    def _estimate(self, key: Key) -> float | None:
        v = self.tasks.get(key)
        return float(v.estimate) if v is not None and v.estimated else None

    def transition(self, key: Key, start: str, finish: str, stimulus_id: str = "") -> None:
        """Every scheduler transition (O(1))."""
        if finish in ("processing", "no-worker"):
            if start not in ("processing", "no-worker"):
                ts = self.scheduler.tasks.get(key)
                if self._need(ts) > 0:
                    since = self.arrived.setdefault(key, time.time())
                    self.waiting.setdefault(key, since)
                    self.sent[key] = time.time()
            return
        if start not in ("processing", "no-worker"):
            if finish == "forgotten":
                self.arrived.pop(key, None)
                self.checkpoints.pop(key, None)
                self.moved.pop(key, None)
                self.reasons.pop(key, None)
            return
        self.runs.pop(key, None)
        self.sent.pop(key, None)
        if not (key in self.moved and finish in ("released", "waiting")):  # not our move
            self.waiting.pop(key, None)
            self.promises.pop(key, None)
            if finish in ("memory", "erred", "forgotten"):
                self._unpin(key)
                self.arrived.pop(key, None)
                self.reasons.pop(key, None)
        self.left(key, finish, stimulus_id)

    def started(self, key: Key, worker: str, run_id: Any, when: float) -> None:
        """A worker reports a true start (the reporter's ``daskjobs-started`` event)."""
        ts = self.scheduler.tasks.get(key)
        need = self._need(ts)
        if need <= 0 or ts is None or ts.state != "processing":
            return
        if ts.processing_on is None or ts.processing_on.address != worker:
            return
        self.waiting.pop(key, None)
        self.sent.pop(key, None)
        self.promises.pop(key, None)
        self._unpin(key)
        self.reasons[key] = f"started on {worker}"
        job = _Job(key, self._class(key), need, when)
        last = max(self.checkpoints.get(key, when), when)
        est = self._estimate(key)
        self.runs[key] = _Run(
            job,
            -1,
            worker,
            when,
            int(run_id or 0),
            self.preempted(key),
            last,
            math.inf if est is None else when + est,
        )

    def checkpointed(self, key: Key, when: float) -> None:
        self.checkpoints[key] = when
        run = self.runs.get(key)
        if run is not None and when > run.last:
            run.last = when

    # -- the periodic decision --------------------------------------------------------------
    def _tick(self) -> None:
        try:
            self.check(time.time())
        except Exception:
            self.audit.failed("preemption")

    def _workers(self) -> list[Any]:
        """Workers that supply the resource, running, in address order (node indices)."""
        res = self.resource
        return sorted(
            (
                ws
                for ws in self.scheduler.workers.values()
                if ws.resources.get(res, 0) > 0 and ws.status.name == "running"
            ),
            key=lambda ws: ws.address,
        )

    def views(self, now: float) -> tuple[list[Any], list[_Waiting], list[_Run], list[_Node]] | None:
        """dask's state as the policy's views: workers (node order), waiting tasks, runs
        and nodes; None without a worker."""
        workers = self._workers()
        if not workers:
            return None
        index = {ws.address: i for i, ws in enumerate(workers)}
        held = dict.fromkeys(index, 0.0)
        running: list[_Run] = []
        for r in self.runs.values():
            i = index.get(r.worker)
            if i is not None:
                held[r.worker] += r.job.gpus
                r.node = i
                running.append(r)
        promised = self.promised_on(index)
        res = self.resource
        nodes = [
            _Node(i, float(ws.resources[res]), float(ws.resources[res]) - held[a], promised[a])
            for i, (a, ws) in enumerate((ws.address, ws) for ws in workers)
        ]
        sched = self.scheduler
        waiting = []
        for key, since in self.waiting.items():
            ts = sched.tasks.get(key)
            if ts is None:
                continue
            on = ts.processing_on
            promise = self.promises.get(key)
            where = None
            if ts.worker_restrictions and key not in self.moved:  # its user's: kept
                where = frozenset(index[a] for a in ts.worker_restrictions if a in index)
            waiting.append(
                _Waiting(
                    key,
                    self._class(key),
                    self._need(ts),
                    since,
                    self.preempted(key),
                    index.get(promise.worker) if promise is not None else None,
                    index.get(on.address) if on is not None else None,
                    where,
                    self._estimate(key),
                )
            )
        return workers, waiting, running, nodes

    def check(self, now: float) -> PreemptionDecision | None:
        """One decision of the policy, enacted (see the module docs)."""
        self.expire(now)
        if not self.waiting:
            self._drop_holds(())
            return None
        got = self.views(now)
        if got is None:
            return None
        workers, waiting, running, nodes = got
        decision = self.decide(waiting, running, nodes, now)
        for act in decision.steps():
            if isinstance(act, Placement):
                self._place(act, workers)
            else:
                self._ask(act, workers[act.node], now)
        for h in decision.reservations:
            self._hold(h, workers[h.node])
        self._drop_holds(tuple(h.job.jid for h in decision.reservations))
        return decision

    # -- enacting ------------------------------------------------------------------------------
    def _place(self, act: Placement, workers: list[Any]) -> None:
        job = act.job
        self.reasons[job.jid] = act.reason
        if act.node == job.node:
            return  # it starts on its worker as soon as the worker gets to it
        ts = self.scheduler.tasks.get(job.jid)
        if ts is not None:
            self._pin(ts, workers[act.node], "fits")

    def _ask(self, act: Preemption, ws: Any, now: float) -> None:
        keys = [v.job.jid for v in (*act.victims, *act.group)]
        # promised: what the victims free (the placer, as the simulator, promises what the
        # task needs; they differ where the victims free more)
        freed = sum(v.job.gpus for v in act.victims)
        # (a victim placed earlier in this round has not started: nothing to tell; only a
        # policy that offers best-effort jobs a place before interactive ones can choose one)
        self.ask(act, ws.address, keys, freed, self._running_on, now)
        ts = self.scheduler.tasks.get(act.job.jid)
        if ts is not None:
            self._pin(ts, ws, "victims", settled=True)

    def _running_on(self, key: Key) -> str | None:
        run = self.runs.get(key)
        return None if run is None else run.worker

    def _hold(self, h: Hold, ws: Any) -> None:
        """Pin the held BE task to ``ws`` ahead of every BE task of its user priority
        (see the module docs); a task already queued there is left as it is (sending it
        again for a new priority could catch it started since the decision's views)."""
        key = h.job.jid
        address: str = ws.address
        self.reasons[key] = h.reason
        ts = self.scheduler.tasks.get(key)
        if ts is None or ts.state not in ("processing", "no-worker") or ts.priority is None:
            return
        if ts.processing_on is not ws:
            if not self._settled(key):
                return
            if ts.worker_restrictions and key not in self.moved:
                return  # its user's restriction: not ours to change
            saved = self.moved.get(key)
            if saved is None:
                saved = self.moved[key] = pinned(ts)  # kept before the hook sees the move
            base = saved.priority or ts.priority
            ahead = (base[0] - HOLD_AHEAD, *base[1:])
            pin(self.scheduler, ts, address, "daskjobs-preempt-hold", ahead)
            self.stats.holds += 1
        if self.held.get(key) != address:
            self.held[key] = address
            decisions.debug("%s: %s", key, h.reason)
            self.audit.event("preempt-hold", key=str(key), worker=address, reason=h.reason)

    def _drop_holds(self, keep: tuple[Key, ...]) -> None:
        """Holds the last decision did not renew: the task's own restrictions and
        priority are put back (it stays queued where it is)."""
        for key in [k for k in self.held if k not in keep]:
            del self.held[key]
            self._unpin(key)

    def worker_removed(self, address: str) -> None:
        """A worker left (dask has moved its tasks already): what was promised there is
        void, and a task pinned there is let go wherever dask can run it."""
        super().worker_removed(address)
        self.held = {k: a for k, a in self.held.items() if a != address}
        for key in list(self.moved):
            ts = self.scheduler.tasks.get(key)
            if ts is None or ts.worker_restrictions != {address}:
                continue
            self._unpin(key)
            if ts.state == "no-worker":
                release(self.scheduler, key, "daskjobs-unmove")

    # -- pinning a waiting task to the worker the policy chose ------------------------------------
    def _pin(self, ts: Any, ws: Any, why: str, settled: bool = False) -> None:
        """Send waiting task ``ts`` to worker ``ws`` (dask queued it elsewhere)."""
        if ts.state not in ("processing", "no-worker"):
            return
        if ts.processing_on is ws or not (settled or self._settled(ts.key)):
            return
        if ts.key not in self.moved:
            if ts.worker_restrictions:
                return  # its user's restriction: not ours to change
            self.moved[ts.key] = pinned(ts)  # kept before the hook sees the move
        pin(self.scheduler, ts, ws.address, f"daskjobs-preempt-{why}")
        self.stats.moved += 1
        decisions.debug("%s: moved to %s (%s)", ts.key, ws.address, why)

    def _settled(self, key: Key) -> bool:
        """Was ``key`` sent to its worker at least one interval ago? A task dask sent on
        more recently may have started there without its start report in yet (it would
        be sent away while it runs): it is left where it is until then."""
        sent = self.sent.get(key)
        return sent is None or time.time() - sent >= self.interval

    def _unpin(self, key: Key) -> None:
        """A pinned task started (or left, or its hold ended): its restriction and priority
        were ours, they go."""
        self.held.pop(key, None)
        saved = self.moved.pop(key, None)
        if saved is None:
            return
        ts = self.scheduler.tasks.get(key)
        if ts is not None:
            unpin(ts, saved)

    def status(self) -> dict[str, Any]:
        counts = super().status()
        asked = counts.pop("asked")
        return {
            **counts,
            "waiting": len(self.waiting),
            "waiting_te": sum(self._class(k) == "te" for k in self.waiting),
            "running": len(self.runs),
            "asked": asked,
            "held": {str(k): a for k, a in self.held.items()},
        }
