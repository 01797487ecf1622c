"""The live half of resources and gangs (docs/explanation/resources.md, "Live on dask").

With ``daskjobs.resources.enabled`` the plugin places every task that asks for a worker
resource (dask's ``resources={"GPU": 2}``), an accelerator type, GPU memory or a
constraint, or that belongs to a gang (``dask.annotate(gang="train-7", gang_size=4)``).
Every decision is :class:`~daskjobs.policies.resources.GangPolicy`'s, the object the gang
simulator (:mod:`daskjobs.sim.gangs`) runs: which worker can ever run a task (the
feasibility filter), which waiting task or gang starts now and where (all members or
none, packed on the fewest workers), which workers are held for the first one that
cannot start and which smaller tasks may still use them (reservation and backfill).
This driver adapts dask's state into the policy's views and enacts the answers:

* **hold**: a placed task gets a worker restriction no worker has (:data:`HELD`), so
  dask keeps it in ``no-worker`` once its inputs are in (tasks with restrictions are
  never in dask's queue). A task that also names workers (``workers=``) may run only
  there: that is part of its request's feasibility;
* **release**: a decision restricts each member to the worker the policy chose and
  sends all members of the decision on in one ``Scheduler.transitions`` call;
* **capacity**: a worker's allocatable amount of a resource is what dask lets it supply
  (``dask worker --resources GPU=2``), for ``GPU`` at most the accelerators its
  inventory reports (:mod:`daskjobs.plugin.workers.inventory`): a worker that loses a device is
  reconciled at once. What this driver placed there holds its resources until it leaves
  ``processing``; nothing is placed on capacity that is not free, so a shrunk worker
  takes nothing new until enough of its tasks end (never double-allocated). Measured
  use (the worker's executing tasks) is reported apart from the allocation;
* **refuse**: a request that no known worker can ever satisfy fails its submission,
  naming what is missing (``daskjobs.resources.refuse-unsatisfiable``);
* **restart**: a gang member that leaves its worker without finishing (its worker died,
  it was rescheduled) stops the whole gang: the members still running are asked to
  yield (``daskjobs.preempted()`` turns True; they checkpoint and raise
  ``daskjobs.Preempted``), and the gang is placed again as one once every member waits;
* **preempt** (with preemption on): interactive demands that did not start get victims
  from one decision of the preemption policy, over the views of
  :mod:`daskjobs.plugin.enact.preemption`, enacted, counted and audited by its
  :class:`~daskjobs.plugin.enact.preemption.Enactor` (a victim's gang yields whole).

Hooks are O(1) per transition; decisions run soon after (coalesced), off dask's
transition loop, and on a periodic callback.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from daskjobs.errors import SubmissionRefused
from daskjobs.plugin.enact.preemption import _Job, _Run, _Waiting
from daskjobs.plugin.enact.preemption import _Node as _Units
from daskjobs.plugin.periodic import every
from daskjobs.plugin.surgery._internals import ask_to_yield, hold, place
from daskjobs.plugin.workers.worker import PREEMPT_OP
from daskjobs.policies.resources import (
    Allocation,
    GangPolicy,
    Inventory,
    Request,
    RequestError,
    fragmentation,
    unsatisfiable,
    why_not,
)

if TYPE_CHECKING:
    from dask.typing import Key
    from distributed.scheduler import Scheduler

    from daskjobs.plugin.audit import Audit
    from daskjobs.plugin.enact.preemption import Enactor
    from daskjobs.plugin.views import LiveTask

__all__ = ["HELD", "Placer", "ResourceRequestError"]

decisions = logging.getLogger("daskjobs.decisions")
logger = logging.getLogger("daskjobs.plugin.gangs")

#: The worker restriction of a task the placer holds (no worker has this address).
HELD = "daskjobs-held://waiting-for-placement"
#: The resource whose capacity the inventory's accelerator count caps.
ACCELERATOR_RESOURCE = "GPU"
_GATING = ("accelerator", "gpu_memory", "constraint", "gang")


class ResourceRequestError(SubmissionRefused):
    """A task's resource request or gang annotation is malformed or can never be met."""

    #: the members of a refused gang submitted before, waiting: they fail with it
    waiting: tuple[Any, ...] = ()


@dataclass(slots=True, eq=False)
class _Task:
    key: Key
    request: Request
    gang: str | None
    arrival: int
    worker: str | None = None  # where it was placed (holds its resources there)
    placed: float = 0.0
    started: float | None = None
    done: bool = False


@dataclass(slots=True, eq=False)
class _Gang:
    gid: str
    size: int
    members: list[Key] = field(default_factory=list)
    running: bool = False  # placed, and not stopped since
    starts: int = 0
    restarts: int = 0


@dataclass(frozen=True, slots=True)
class _Demand:
    did: Any
    keys: tuple[Key, ...]
    requests: list[Request]
    arrival: int
    order: tuple[Any, ...]
    estimate: float | None


@dataclass(frozen=True, slots=True)
class _Node:
    index: int
    host: str
    inventory: Inventory
    free: dict[str, float]
    address: str


@dataclass
class PlacerStats:
    placed: int = 0  # tasks sent to a worker by a decision
    gangs_started: int = 0
    gang_restarts: int = 0
    decisions: int = 0
    held_back: int = 0  # tasks that fit but were kept off reserved workers
    refused: int = 0  # submissions refused (malformed or unsatisfiable)
    stopped: int = 0  # gang members asked to yield for a restart

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Placer:
    """Drives resource placement and gangs for the plugin (see the module docs)."""

    def __init__(
        self,
        policy: GangPolicy,
        *,
        refuse_unsatisfiable: bool,
        interval: float,
        audit: Audit,
        tasks: Mapping[Key, LiveTask],
        preemption: Enactor | None = None,
    ) -> None:
        self.policy = policy
        #: with preemption on: interactive tasks take the resource back from best-effort
        #: placed tasks (a gang is preempted whole); every choice the preemption policy's,
        #: enacted and counted by the one live enactor
        self.preemption = preemption
        self.checkpoints: dict[Key, float] = {}  # task -> its last checkpoint
        self.refuse = refuse_unsatisfiable
        self.interval = interval
        self.audit = audit
        self.views = tasks  # the ranked tasks' views (estimates)
        self.scheduler: Scheduler | None = None
        self.placed: dict[Key, _Task] = {}
        self.gangs: dict[str, _Gang] = {}
        self.inventories: dict[str, Inventory] = {}  # reported, by worker address
        self.invalid: dict[str, str] = {}  # worker -> why its report was refused
        self.used: dict[str, dict[str, float]] = {}  # worker -> allocated by this driver
        self.waiting: set[Key] = set()  # held in no-worker, runnable
        self.holding: dict[Key, _Task] = {}  # placed on a worker, holding its resources
        self._singles: dict[Key, _Demand] = {}  # the view of each waiting single task
        self.reservation: dict[str, Any] | None = None
        self.last_fragmentation = 0.0
        #: GPU-seconds free that no waiting request fitted, summed between decisions
        self.fragmented_seconds = 0.0
        self._measured_at: float | None = None
        self.stats = PlacerStats()
        #: the last starts, in the order the policy made them: (time, demand, workers)
        self.starts: deque[tuple[float, str, list[str]]] = deque(maxlen=10_000)
        self._index: dict[str, int] = {}
        self._arrivals = itertools.count()
        self._due = False
        self._pc: Any = None

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        if self.preemption is not None:
            self.preemption.scheduler = scheduler
        self._pc = every(scheduler, "daskjobs-resources", self.interval, self._tick)

    def close(self) -> None:
        if self._pc is not None:
            self._pc.stop()
        self._pc = None

    # -- submission ------------------------------------------------------------------------
    @staticmethod
    def wants(ts: Any) -> bool:
        ann = ts.annotations or {}
        return bool(ts.resource_restrictions) or any(ann.get(k) is not None for k in _GATING)

    def check(self, tasks: Iterable[Any]) -> list[tuple[Any, Request, str | None, int]]:
        """The new tasks this driver places, with their requests and gangs; raises
        :class:`ResourceRequestError` naming the problem (nothing is changed then)."""
        out: list[tuple[Any, Request, str | None, int]] = []
        sizes: dict[str, int] = {}
        counts: dict[str, int] = {}
        for ts in tasks:
            if ts.key in self.placed or not self.wants(ts):
                continue
            ann = dict(ts.annotations or {})
            ann["resources"] = dict(ts.resource_restrictions or {})
            try:
                req = Request.from_annotations(ann, what=f"task {ts.key!r}") or Request()
            except RequestError as e:
                raise ResourceRequestError(str(e)) from None
            own = set(ts.worker_restrictions or ()) | set(ts.host_restrictions or ())
            if own:  # its user's workers=: part of feasibility
                req = replace(req, where=frozenset(own))
            gid = ann.get("gang")
            size: Any = 1
            if gid is not None:
                if not isinstance(gid, str) or not gid:
                    raise ResourceRequestError(
                        f"task {ts.key!r}: gang: expected a name such as 'train-7', got {gid!r}"
                    )
                size = ann.get("gang_size")
                if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                    raise ResourceRequestError(
                        f"task {ts.key!r}: gang {gid!r} needs gang_size, the number of its "
                        f"members (an integer >= 1), got {size!r}"
                    )
                known = self.gangs.get(gid)
                expected = known.size if known is not None else sizes.get(gid, size)
                if size != expected:
                    raise ResourceRequestError(
                        f"task {ts.key!r}: gang {gid!r} has gang_size {expected}, this member "
                        f"says {size}"
                    )
                sizes[gid] = size
                counts[gid] = counts.get(gid, 0) + 1
                have = len(known.members) if known is not None else 0
                if have + counts[gid] > size:
                    raise ResourceRequestError(
                        f"task {ts.key!r}: gang {gid!r} has gang_size {size} but more members"
                    )
            out.append((ts, req, gid, size))
        if self.refuse:
            self._refuse_unsatisfiable(out)
        return out

    def _refuse_unsatisfiable(self, new: list[tuple[Any, Request, str | None, int]]) -> None:
        sched = self.scheduler
        if sched is None or not sched.workers:
            return  # no worker yet (a cluster that scales up): nothing to judge by
        if any(a not in self.inventories for a in sched.workers):
            return  # a worker has not reported what it has: it might
        inventories = {a: self._inventory(a) for a in sched.workers}
        gangs: dict[str, list[Request]] = {}
        for ts, req, gid, _size in new:
            if gid is None:
                why = unsatisfiable([req], inventories)
                if why is not None:
                    self.stats.refused += 1
                    raise ResourceRequestError(f"task {ts.key!r} can never run: {why}")
            else:
                gangs.setdefault(gid, []).append(req)
        for gid, reqs in gangs.items():
            known = self.gangs.get(gid)
            if known is not None:
                reqs = [self.placed[k].request for k in known.members if k in self.placed] + reqs
            if len(reqs) == known.size if known else len(reqs) == _size_of(new, gid):
                why = unsatisfiable(reqs, inventories)
                if why is not None:
                    self.stats.refused += 1
                    err = ResourceRequestError(f"gang {gid!r} can never start: {why}")
                    err.waiting = tuple(known.members) if known else ()  # fail with it
                    raise err

    def admit(self, checked: list[tuple[Any, Request, str | None, int]]) -> None:
        """Hold the checked tasks until a decision places them."""
        for ts, req, gid, size in checked:
            t = _Task(
                ts.key,
                req,
                gid,
                next(self._arrivals),
            )
            self.placed[ts.key] = t
            if gid is not None:
                g = self.gangs.get(gid)
                if g is None:
                    g = self.gangs[gid] = _Gang(gid, size)
                g.members.append(ts.key)
            _hold(ts)
            v = self.views.get(ts.key)
            if v is not None and v.speculate and isinstance(self.views, dict):
                # a copy would take the resource outside the placement: never copied
                self.views[ts.key] = replace(v, speculate=False)

    # -- hooks: O(1) -----------------------------------------------------------------------
    def transition(self, key: Key, start: str, finish: str, stimulus_id: str = "") -> None:
        t = self.placed.get(key)
        if t is None:
            return
        if finish == "no-worker":
            self.waiting.add(key)
            self._soon()
            return
        if start == "no-worker":
            self.waiting.discard(key)
            self._singles.pop(key, None)
            if self.preemption is not None:  # placed, or gone: a promise to it ends
                self.preemption.promises.pop(key, None)
        if start == "processing" and finish != "processing":
            self._free(t)
            if self.preemption is not None:
                self.preemption.left(key, finish, stimulus_id)
            if finish in ("memory", "erred"):
                t.done = True
                g = self.gangs.get(t.gang) if t.gang is not None else None
                if g is not None and all(self._done(k) for k in g.members):
                    g.running = False
            else:  # back to wait: its worker left, it was rescheduled or released
                ts = self.scheduler.tasks.get(key) if self.scheduler is not None else None
                if ts is not None:
                    _hold(ts)
                if t.gang is not None:
                    self._stop_gang(self.gangs[t.gang], key)
            self._soon()
        if finish == "forgotten":
            self._forget(t)
            self.checkpoints.pop(key, None)
            if self.preemption is not None:
                self.preemption.reasons.pop(key, None)

    def checkpointed(self, key: Key, when: float) -> None:
        self.checkpoints[key] = when

    def why(self, key: Key) -> str | None:
        """The preemption decision's last reason about ``key`` (for ``explain``)."""
        return None if self.preemption is None else self.preemption.why(key)

    def started(self, key: Key, when: float) -> None:
        t = self.placed.get(key)
        if t is not None and t.worker is not None:
            t.started = when

    def inventory_report(self, worker: str, msg: Mapping[str, Any]) -> None:
        sched = self.scheduler
        if sched is None or worker not in sched.workers:
            return
        raw = msg.get("inventory")
        version = msg.get("version", 0)
        try:
            if isinstance(raw, Mapping) and "invalid" in raw:
                raise RequestError(f"unreadable: {raw['invalid']}")
            inv = Inventory.from_dict(
                {**(raw or {}), "version": version}, what=f"inventory of {worker}"
            )
        except RequestError as e:
            self.invalid[worker] = str(e)
            # what dask knows of it stands in (no accelerator): never a guess
            inv = Inventory(version=int(version) if isinstance(version, int) else 0)
            logger.warning("daskjobs: worker %s reported a bad inventory: %s", worker, e)
            self.audit.event("bad-inventory", worker=worker, error=str(e))
        else:
            self.invalid.pop(worker, None)
        old = self.inventories.get(worker)
        self.inventories[worker] = inv
        self.audit.event(
            "inventory",
            worker=worker,
            version=inv.version,
            accelerator=inv.accelerator,
            gpus=inv.gpus,
            changed=old is not None,
        )
        self._soon()

    def worker_removed(self, worker: str) -> None:
        if self.preemption is not None:
            self.preemption.worker_removed(worker)
        self.inventories.pop(worker, None)
        self.invalid.pop(worker, None)
        self.used.pop(worker, None)
        for t in list(self.holding.values()):
            if t.worker == worker:
                t.worker = None
                self.holding.pop(t.key, None)
        self._soon()

    # -- the decision ------------------------------------------------------------------------
    def _soon(self) -> None:
        if self._due or self.scheduler is None:
            return
        self._due = True
        try:
            asyncio.get_running_loop().call_soon(self._run)
        except RuntimeError:  # no loop here (a test calling the hook directly)
            self._due = False

    def _tick(self) -> None:
        if self.waiting:
            self._run()

    def _run(self) -> None:
        self._due = False
        try:
            self.decide(time.time())
        except Exception:
            self.audit.failed("resources")

    def _inventory(self, address: str) -> Inventory:
        """What ``address`` can allocate: its report, with dask's resource counts (for
        GPU at most the accelerators it reported)."""
        ws = self.scheduler.workers[address]  # type: ignore[union-attr]
        inv = self.inventories.get(address)
        res = {str(k): float(v) for k, v in (ws.resources or {}).items()}
        if inv is None:
            return Inventory(
                cpus=ws.nthreads,
                memory=ws.memory_limit or 0,
                resources=res,
                address=address,
                host=ws.host,
            )
        if inv.gpus and ACCELERATOR_RESOURCE in res:
            res[ACCELERATOR_RESOURCE] = min(res[ACCELERATOR_RESOURCE], float(inv.gpus))
        return replace(inv, resources=res, address=address, host=ws.host)

    def _nodes(self) -> list[_Node]:
        sched = self.scheduler
        assert sched is not None
        nodes = []
        for address, ws in sched.workers.items():
            if ws.status.name != "running":
                continue
            idx = self._index.setdefault(address, len(self._index))
            inv = self._inventory(address)
            used = self.used.get(address, {})
            free = {k: v - used.get(k, 0.0) for k, v in inv.resources.items()}
            nodes.append(_Node(idx, ws.host, inv, free, address))
        return nodes

    def _estimate(self, key: Key) -> float | None:
        v = self.views.get(key)
        if v is None or not v.estimated:
            return None
        return float(v.estimate)

    def _demands(self) -> list[_Demand]:
        sched = self.scheduler
        assert sched is not None
        out: list[_Demand] = []
        seen: set[str] = set()
        singles = self._singles
        for key in self.waiting:
            d = singles.get(key)
            if d is not None:  # still waiting (its view goes when it leaves no-worker)
                out.append(d)
                continue
            t = self.placed[key]
            ts = sched.tasks.get(key)
            if ts is None or ts.state != "no-worker":
                continue
            if t.gang is None:
                d = self._singles.get(key)
                if d is None:
                    d = self._singles[key] = _Demand(
                        key, (key,), [t.request], t.arrival, ts.priority or (), self._estimate(key)
                    )
                out.append(d)
                continue
            if t.gang in seen:
                continue
            seen.add(t.gang)
            g = self.gangs[t.gang]
            if len(g.members) < g.size:
                continue  # not every member submitted yet
            left = [k for k in g.members if not self._done(k)]
            if not left or any(k not in self.waiting for k in left):
                continue  # a member still runs (or waits for its inputs)
            ests = [self._estimate(k) for k in left]
            est = None if any(e is None for e in ests) else max(e for e in ests if e is not None)
            first = min(left, key=lambda k: self.placed[k].arrival)
            out.append(
                _Demand(
                    ("gang", g.gid),
                    tuple(left),
                    [self.placed[k].request for k in left],
                    self.placed[first].arrival,
                    min(sched.tasks[k].priority or () for k in left),
                    est,
                )
            )
        return out

    def _running(self, nodes: list[_Node], now: float) -> list[Allocation]:
        index = {n.address: n.index for n in nodes}
        out = []
        for t in self.holding.values():
            if t.worker is None or t.worker not in index:
                continue
            est = self._estimate(t.key)
            began = t.started if t.started is not None else max(t.placed, now)
            end = math.inf if est is None else began + est
            out.append(Allocation(index[t.worker], t.request.resources, end))
        return out

    def decide(self, now: float) -> None:
        """One decision of the policy over every waiting demand, enacted."""
        sched = self.scheduler
        if self._measured_at is not None:
            self.fragmented_seconds += self.last_fragmentation * max(now - self._measured_at, 0)
        self._measured_at = now
        if self.preemption is not None:
            self.preemption.expire(now)
        if sched is None or not self.waiting:
            self.reservation = None
            self.last_fragmentation = 0.0
            return
        nodes = self._nodes()
        demands = self._demands()
        if not demands or not nodes:
            return
        decision = self.policy.decide(demands, nodes, self._running(nodes, now), now)
        self.stats.decisions += 1
        self.stats.held_back += decision.held_back
        by_index = {n.index: n for n in nodes}
        where: dict[Key, str] = {}
        for p in decision.starts:
            d: _Demand = p.demand
            for key, idx, req in zip(d.keys, p.nodes, d.requests, strict=True):
                address = by_index[idx].address
                t = self.placed[key]
                t.worker, t.placed, t.started = address, now, None
                self.holding[key] = t
                used = self.used.setdefault(address, {})
                for k, v in req.resources.items():
                    used[k] = used.get(k, 0.0) + v
                self.waiting.discard(key)
                self._singles.pop(key, None)
                where[key] = address
            self.stats.placed += len(d.keys)
            did = d.did[1] if isinstance(d.did, tuple) else str(d.did)
            self.starts.append((now, did, [by_index[i].address for i in p.nodes]))
            if isinstance(d.did, tuple):
                g = self.gangs[d.did[1]]
                g.running = True
                g.starts += 1
                self.stats.gangs_started += 1
                self.audit.event(
                    "gang-start",
                    gang=g.gid,
                    members=len(d.keys),
                    workers=sorted({by_index[i].address for i in p.nodes}),
                    restart=g.starts > 1,
                )
            if decisions.isEnabledFor(logging.DEBUG):
                decisions.debug("place %s on %s", d.did, [by_index[i].address for i in p.nodes])
        r = decision.reservation
        self.reservation = (
            None
            if r is None
            else {
                "for": str(r.demand.did),
                "at": r.at,
                "workers": sorted({by_index[i].address for i in r.nodes}),
            }
        )
        if where:
            place(sched, where, f"daskjobs-place-{now}")
        if self.preemption is not None:
            started_ids = {id(p.demand) for p in decision.starts}
            self._preempt([d for d in demands if id(d) not in started_ids], nodes, now)
        started = {id(p.demand) for p in decision.starts}
        self.last_fragmentation = fragmentation(
            [d for d in demands if id(d) not in started], self._nodes(), ACCELERATOR_RESOURCE
        )

    # -- preemption ---------------------------------------------------------------------------
    def _class(self, key: Key) -> str:
        v = self.views.get(key)
        return v.job_class if v is not None else "be"

    def _preempt(self, waiting: list[_Demand], nodes: list[_Node], now: float) -> None:
        """Interactive demands that did not start: one decision of the preemption policy,
        enacted by the one live enactor (:class:`~daskjobs.plugin.enact.preemption.Enactor`; the
        decision's placements are the gang policy's to make: only its victims are enacted);
        a victim in a gang stops its whole gang."""
        en = self.preemption
        assert en is not None
        res = en.resource
        promised = en.promised_on(n.address for n in nodes)
        pnodes = [
            _Units(
                n.index,
                n.inventory.resources.get(res, 0.0),
                n.free.get(res, 0.0),
                promised[n.address],
            )
            for n in nodes
            if n.inventory.resources.get(res, 0.0) > 0
        ]
        te = []
        for d in waiting:
            if len(d.keys) != 1 or d.requests[0].resources.get(res, 0.0) <= 0:
                continue
            key = d.keys[0]
            if self._class(key) != "te":
                continue
            promise = en.promises.get(key)
            te.append(
                _Waiting(
                    key,
                    "te",
                    d.requests[0].resources[res],
                    d.arrival,
                    en.preempted(key),
                    None if promise is None else self._index.get(promise.worker),
                    None,  # the placer queues nothing on a worker
                    frozenset(
                        n.index for n in nodes if why_not(d.requests[0], n.inventory) is None
                    ),
                    None,  # no expected end: the victims' policy does not read it here
                )
            )
        if not te:
            return
        index = {n.address: n.index for n in nodes}
        address = {n.index: n.address for n in nodes}
        decision = en.decide(te, self._victim_views(index, now), pnodes, now)
        for act in decision.preemptions:
            keys = self._whole_gangs([r.job.jid for r in (*act.victims, *act.group)])
            en.ask(act, address[act.node], keys, act.job.gpus, self._placed_on, now)

    def _victim_views(self, index: Mapping[str, int], now: float) -> list[_Run]:
        """Best-effort placed tasks as the preemption policy sees running jobs; a gang
        member loses its whole gang's work since their checkpoints."""
        assert self.preemption is not None
        asked, ignoring = self.preemption.asked, self.preemption.ignoring
        res = self.preemption.resource
        runs: list[_Run] = []
        gang_loss: dict[str, float] = {}
        for t in self.holding.values():
            if t.gang is not None and t.worker is not None:
                began = t.started if t.started is not None else t.placed
                last = max(self.checkpoints.get(t.key, began), began)
                lost = max(now - last, 0.0) * t.request.resources.get(res, 0.0)
                gang_loss[t.gang] = gang_loss.get(t.gang, 0.0) + lost
        for t in self.holding.values():
            gpus = t.request.resources.get(res, 0.0)
            if (
                t.worker is None
                or t.worker not in index
                or gpus <= 0
                or t.started is None  # not running yet: nothing to yield
                or t.key in asked
                or t.key in ignoring
                or self._class(t.key) != "be"
            ):
                continue
            last = max(self.checkpoints.get(t.key, t.started), t.started)
            runs.append(
                _Run(
                    _Job(t.key, "be", gpus, t.arrival),
                    index[t.worker],
                    t.worker,
                    t.started,
                    0,
                    self.preemption.preempted(t.key),
                    last,
                    math.inf,
                    t.gang,
                    gang_loss[t.gang] if t.gang is not None else None,
                )
            )
        return runs

    def _whole_gangs(self, keys: list[Key]) -> list[Key]:
        """``keys`` with every running member of their gangs (a gang yields whole)."""
        out = list(keys)
        seen = set(keys)
        for key in keys:
            t = self.placed.get(key)
            if t is None or t.gang is None:
                continue
            for m in self.gangs[t.gang].members:
                mt = self.placed.get(m)
                if m not in seen and mt is not None and mt.worker is not None and not mt.done:
                    out.append(m)
                    seen.add(m)
        return out

    def _placed_on(self, key: Key) -> str | None:
        t = self.placed.get(key)
        return None if t is None else t.worker

    # -- gangs -------------------------------------------------------------------------------
    def _stop_gang(self, g: _Gang, lost: Key) -> None:
        """A member left its worker unfinished: ask the others still running to yield;
        the gang is placed again, as one, once every unfinished member waits."""
        if not g.running:
            return
        g.running = False
        g.restarts += 1
        self.stats.gang_restarts += 1
        sched = self.scheduler
        assert sched is not None
        by_worker: dict[str, list[Key]] = {}
        for k in g.members:
            t = self.placed.get(k)
            if k == lost or t is None or t.done or t.worker is None:
                continue
            by_worker.setdefault(t.worker, []).append(k)
        for address, keys in by_worker.items():
            if ask_to_yield(sched, address, keys, PREEMPT_OP):
                self.stats.stopped += len(keys)
        self.audit.event("gang-stop", gang=g.gid, lost=str(lost), asked=self.stats.stopped)
        if decisions.isEnabledFor(logging.DEBUG):
            decisions.debug("stop gang %s (member %r left its worker)", g.gid, lost)

    def _done(self, key: Key) -> bool:
        t = self.placed.get(key)
        return t is None or t.done

    def _free(self, t: _Task) -> None:
        self.holding.pop(t.key, None)
        if t.worker is None:
            return
        used = self.used.get(t.worker)
        if used is not None:
            for k, v in t.request.resources.items():
                used[k] = used.get(k, 0.0) - v
        t.worker = None
        t.started = None

    def _forget(self, t: _Task) -> None:
        self._free(t)
        self.placed.pop(t.key, None)
        self.waiting.discard(t.key)
        self._singles.pop(t.key, None)
        if t.gang is not None:
            g = self.gangs.get(t.gang)
            if g is not None and all(k not in self.placed for k in g.members):
                del self.gangs[t.gang]

    # -- status ------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        sched = self.scheduler
        workers: dict[str, Any] = {}
        if sched is not None:
            for address, ws in sched.workers.items():
                inv = self._inventory(address)
                used = self.used.get(address, {})
                executing = sum(
                    sum((ts.resource_restrictions or {}).values())
                    for ts in getattr(ws, "executing", {}) or {}
                )
                workers[address] = {
                    "accelerator": inv.accelerator,
                    "gpu_memory": inv.gpu_memory,
                    "inventory_version": inv.version,
                    "capacity": dict(inv.resources),
                    "allocated": {k: v for k, v in used.items() if v},
                    "executing_units": executing,
                    "reported": address in self.inventories,
                    **({"invalid": self.invalid[address]} if address in self.invalid else {}),
                }
        return {
            "policy": self.policy.describe(),
            "workers": workers,
            "waiting": len(self.waiting),
            "gangs": {
                g.gid: {
                    "size": g.size,
                    "submitted": len(g.members),
                    "done": sum(self._done(k) for k in g.members),
                    "running": g.running,
                    "starts": g.starts,
                    "restarts": g.restarts,
                }
                for g in self.gangs.values()
            },
            "reservation": self.reservation,
            "fragmentation": self.last_fragmentation,
            "fragmented_seconds": round(self.fragmented_seconds, 3),
            **self.stats.to_dict(),
        }


def _size_of(new: list[tuple[Any, Request, str | None, int]], gid: str) -> int:
    return next(size for _, _, g, size in new if g == gid)


def _hold(ts: Any) -> None:
    """Keep ``ts`` in dask's ``no-worker`` until a decision places it."""
    hold(ts, HELD)
