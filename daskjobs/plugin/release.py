"""The release gate: dask's free slots get the task the policy's ``pop`` chooses.

Under a policy that picks slot by slot (one that declares ``pops`` in its
:attr:`~daskjobs.policies.Policy.capabilities`: fair share, node-aware, a user's), the
decision "which waiting task gets the next free slot" is ``popper.pop``, the same call
the simulator makes.
dask hands free slots to the head of its queue of waiting root tasks
(``scheduler.queued``, ordered by priority) one slot at a time, and calls the
plugin's ``transition`` hook after each. The gate keeps every queued task *held*
(ranked by the policy's ``hold_key``) and *releases* exactly one: the task
``pop`` chooses, promoted to the head of dask's queue. The choice is made when a
slot is about to be filled (a task has just ended, or a worker has free slots),
so it sees usage as it is then. The policy keeps its accounts from the
``started``/``ended`` calls the gate makes as tasks start and finish. Every rule
(which team goes next, quotas, which task a slow worker takes) is the policy's.

Tasks dask queues are handed to the policy in batches: a graph's tasks enter dask's
queue in one burst while the workers are full (no slot opens inside it), and the
gate keeps them in ``pending`` until the policy is next asked (``pop``, or a
``discard``) or the scheduler is done with that stimulus, whichever comes first,
then pushes them at once with ``push_many``, in the order dask queued
them: the call the simulator makes for a batch that became runnable together. A
policy then sees a submitted sweep as the simulator does (``NodeAware`` sorts it
once and measures a new worker with a task from the batch's short end, not the very
shortest), at O(1) per queued transition instead of a sorted insertion each.

A graph that arrives while slots are free: dask sends the first of its root tasks, by
priority, straight to those slots without queuing them, so the gate pushes the graph's
root tasks to the policy when it arrives (ranked, before dask sends anything: one
``push_many``, as the simulator pushes a submitted graph), asks ``pop`` once per free
slot in dask's order and puts each choice ahead of every held rank
(:meth:`ReleaseGate.first_wave`); the rest are held when dask queues them.

Which worker a slot is on: dask gives the task at the head of its queue to the least
busy worker of its ``idle_task_count`` (``decide_worker_rootish_queuing_enabled``), so
when a task ends the gate walks the free slots in that order, before dask counts them,
and asks the policy about each: a chosen task is promoted (one per slot, in order); a
worker the policy leaves idle (``pop`` answers None for it) leaves ``idle_task_count``,
so its slots stay idle (:meth:`ReleaseGate._offer`). Refused workers are offered again
at a later task end (at most every ``reoffer_interval``, 50 ms) and put back when
nothing is held or nothing runs; the simulator idles the slot the same way and offers
it again when something changes. Without this, dask would fill a refused worker's free
slots from its queue (the shortest held tasks): a worker measured slow would take the
last tasks of a sweep, slower than a free fast thread would run them, and a worker with
nothing running the task chosen for another.

Tasks that do not wait in dask's queue (tasks with inputs, or with resource
restrictions, which dask sends to a worker as soon as they are runnable) are
counted in the policy's accounts but ordered by the held rank on their worker.

Cost: O(1) per transition plus the policy's ``pop`` (and its ``push_many`` of the
tasks queued since the last one); a reconcile from the
scheduler's state, O(processing + queued log queued), only after a failure.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from daskjobs.plugin.audit import Audit
from daskjobs.plugin.speeds import WorkerSpeeds
from daskjobs.plugin.surgery import _internals as dask_internals
from daskjobs.plugin.views import ANY_NODE, OUTCOME, LiveAttempt, LiveTask, Slot
from daskjobs.policies import Capabilities, Policy

if TYPE_CHECKING:
    from dask.typing import Key
    from distributed.scheduler import Scheduler

__all__ = ["ReleaseGate"]

#: A released task sorts before every held one (held ranks stay within +-1e11).
_RELEASED = -1e12


def _next_worker(idle: Any) -> Any:
    """The worker dask gives the head of its queue to: the least busy with a free slot
    (``decide_worker_rootish_queuing_enabled``; the same ``min`` over the same set, so
    the same worker on ties)."""
    return min(idle, key=_load) if idle else None


def _load(ws: Any) -> float:
    return len(ws.processing) / ws.nthreads


def _emptied(popper: Any) -> bool:
    """True if ``popper`` says it holds nothing (then every ``pop`` answers None: the
    policy contract); False if it cannot say (no ``__len__``)."""
    try:
        return not len(popper)
    except Exception:
        return False


class ReleaseGate:
    """Holds dask's queued root tasks and releases, slot by slot, what ``popper`` picks.

    State: ``held`` (keys queued in dask and in the policy's queue, or in
    ``pending``: queued in dask, not yet pushed to the policy), ``promoted`` (the keys
    promoted to the head of dask's queue and not yet taken, in order; ``released`` is
    the first), ``attempts`` (the running attempt per key, as the policy was told of
    it), ``refused`` (workers the policy left idle, out of dask's ``idle_task_count``
    until offered again).
    """

    def __init__(
        self,
        popper: Policy,
        tasks: Mapping[Key, LiveTask],
        speeds: WorkerSpeeds,
        audit: Audit,
    ) -> None:
        self.popper = popper
        # what the policy declares (a bare popper that declares nothing: the defaults)
        caps: Capabilities = getattr(popper, "capabilities", None) or Capabilities()
        # a policy that learns speeds is offered each free slot on its worker (and may
        # leave a slow worker's slots idle); one that reads node.waiting sees its worker
        self.learns = caps.learns_speeds
        self.by_worker = caps.learns_speeds or "node.waiting" in caps.reads
        self.reconciles = caps.reconciles
        self.tasks = tasks
        self.speeds = speeds
        self.audit = audit
        self.scheduler: Scheduler = None  # type: ignore[assignment]  # set at start
        self.held: set[Key] = set()
        # keys promoted to the head of dask's queue, not yet taken, in promotion order
        self.promoted: dict[Key, None] = {}
        self.pending: list[LiveTask] = []  # queued since the policy was last asked
        self.kept_idle = 0  # slots the policy left idle that dask would have filled
        self.refused: set[str] = set()  # workers taken out of idle_task_count (addresses)
        # refused workers are asked again at a task end at most this often (seconds): with
        # many refused workers, asking each at every task end would cost O(refused) a task
        self.reoffer_interval = 0.05
        self._reoffered = 0.0
        self._seq = 0
        self.attempts: dict[Key, LiveAttempt] = {}
        self._reconcile_pending = False
        # a new graph's root tasks pushed to the policy when it arrived with slots free
        # (first_wave), not yet queued by dask; and those the policy chose for the slots
        self.early: set[Key] = set()
        self.chosen: set[Key] = set()

    def _flush(self) -> None:
        """Hand the tasks queued since the policy was last asked to it, as one batch."""
        pending = self.pending
        if pending:
            self.pending = []
            self.popper.push_many(pending)

    def _schedule_flush(self) -> None:
        """Flush once the scheduler is done with the stimulus at hand (a graph, a batch
        of finished tasks), so that status and explain count every queued task."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on an event loop (a bare scheduler in a test)
            return  # flushed at the next pop or discard
        loop.call_soon(self._flush_guarded)

    def settle(self) -> None:
        """Hand the policy the tasks dask queued since it was last asked, now (explain
        asks the policy about its queue as its next ``pop`` would see it)."""
        if self.pending:
            self._flush_guarded()

    def _flush_guarded(self) -> None:
        try:
            self._flush()
        except Exception:
            self.audit.failed("release")
            self._schedule_reconcile()

    @property
    def released(self) -> Key | None:
        """The key dask takes next from its queue (promoted by the policy), or None."""
        return next(iter(self.promoted), None)

    def _release(self, node: Any = ANY_NODE) -> bool:
        """Promote the task the policy chooses for ``node``'s free slot to the head of
        dask's queue (after any promoted before it); False if the policy chose none."""
        if self.pending:
            self._flush()
        popper = self.popper
        now = time.time()
        while self.held:
            v = popper.pop(node, now)
            if v is None:
                return False  # nothing the policy would run in this slot now
            if self._promote(v):
                return True
        return False

    def _promote(self, v: Any) -> bool:
        """Promote held ``v`` to the head of dask's queue (after those promoted before
        it); False for a stale entry (dask already ran or dropped it)."""
        if v.tid not in self.held:
            return False
        self.held.discard(v.tid)
        sched = self.scheduler
        ts = sched.tasks.get(v.tid)
        if ts is None or ts.state != "queued" or ts.priority is None:
            return False
        self._seq += 1
        dask_internals.promote(sched, ts, _RELEASED + self._seq)
        self.promoted[v.tid] = None
        return True

    def first_wave(self, new: list[Any]) -> None:
        """A new graph arrives (ranked, before dask sends anything) while slots are free:
        dask sends the first of its root tasks, by priority, straight to those slots
        without queuing them. So that ``pop`` chooses those too, as the simulator's
        first pops do after a graph's ``push_many``: push the graph's root tasks now, in
        one batch, ask ``pop`` for each free slot in dask's order (the least busy worker
        first), and put each chosen task ahead of every held rank. The others are held
        when dask queues them (already pushed); one it sends on without queuing leaves
        the policy's queue (``discard``). O(free slots) pops; nothing without free slots."""
        sched = self.scheduler
        idle = dask_internals.idle_workers(sched)
        if not idle:
            return
        tasks = self.tasks
        roots = [
            tasks[ts.key]
            for ts in new
            if not ts.dependencies and not ts.resource_restrictions and ts.key in tasks
        ]
        if not roots:
            return
        # dask's order of the free slots: the least busy worker, (processing + taken) /
        # threads, the first in the set's order on ties. A heap of (load, place in the
        # set's order) gives the worker a `min` over the free workers gives, in O(log k)
        # a slot (the `min` made a wave O(k^2) in k free workers: a one-task graph on 128
        # idle workers cost ~8,400 key calls). A worker's free slots are counted when it
        # is first reached (one with none leaves the heap: the others keep their order).
        heap = [(len(ws.processing) / ws.nthreads, j, ws) for j, ws in enumerate(idle)]
        heapq.heapify(heap)
        free: dict[Any, int] = {}
        while heap and (n := dask_internals.free_slots(sched, heap[0][2])) <= 0:
            heapq.heappop(heap)  # no free slot on the least busy: not a slot of the wave
        if not heap:
            return
        free[heap[0][2]] = n
        if self.pending:
            self._flush()
        popper = self.popper
        popper.push_many(roots)
        early = self.early
        early.update(v.tid for v in roots)
        taken: dict[Any, int] = {}
        now = time.time()
        while heap:
            ws = heap[0][2]
            left = free.get(ws)
            if left is None:
                left = free[ws] = dask_internals.free_slots(sched, ws)
                if left <= 0:
                    heapq.heappop(heap)
                    continue
            if _emptied(popper):
                # every pop left answers None (Policy.pop): no slot gets a task
                self._meet(heap, free)
                break
            slot = (
                Slot(self.speeds.node(ws.address), ws, tasks, taken.get(ws, 0))
                if self.by_worker
                else ANY_NODE
            )
            v = popper.pop(slot, now)
            if v is None:
                heapq.heappop(heap)  # nothing for this worker now (a later end offers again)
                continue
            if v.tid in early:
                early.discard(v.tid)
                ts = sched.tasks.get(v.tid)
                if ts is None or ts.priority is None:
                    continue
                self._seq += 1
                p = ts.priority
                dask_internals.set_priority(ts, (p[0], _RELEASED + self._seq, *p[2:]))
                self.chosen.add(v.tid)
                # started now, as the simulator starts what it pops: the next pop of this
                # wave counts it (a team's quota, a worker's load)
                att = LiveAttempt(tasks[v.tid], self.speeds.node(ws.address), now)
                popper.started(att, now)
                self.attempts[v.tid] = att
            elif not self._promote(v):
                continue  # a stale entry: not a slot's task
            n = taken[ws] = taken.get(ws, 0) + 1
            free[ws] -= 1
            if free[ws] <= 0:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, ((len(ws.processing) + n) / ws.nthreads, heap[0][1], ws))

    def _meet(self, heap: list[Any], free: dict[Any, int]) -> None:
        """The wave's pops end with the policy's queue empty: each worker still in the
        ``heap`` would have been asked (and answered None), its slot naming it, so a
        worker not yet seen is made known to the speed learner (``WorkerSpeeds.node``:
        its cores count in the capacity) in the order the asks would have come (the
        least busy first, with a free slot). O(workers left) lookups; the sort only for
        workers never seen."""
        if not self.by_worker:
            return
        nodes = self.speeds.nodes
        unseen = [e for e in heap if e[2].address not in nodes]
        if not unseen:
            return
        sched = self.scheduler
        for _, _, ws in sorted(unseen, key=lambda e: e[:2]):
            left = free.get(ws)
            if left is None:
                left = dask_internals.free_slots(sched, ws)
            if left > 0:
                self.speeds.node(ws.address)

    def _wave(self, key: Key, v: LiveTask, finish: str) -> bool:
        """A transition of a task of a first wave; True if it was queued (and is held or
        promoted already: not to be pushed again)."""
        if finish == "waiting":  # on its way: released -> waiting -> queued or processing
            return False
        if key in self.chosen:
            self.chosen.discard(key)
            if finish == "processing":
                return False  # it took its slot (its attempt started at the pop)
            att = self.attempts.pop(key, None)
            if att is not None:  # no slot after all: the attempt counted at the pop ends
                att.end = time.time()
                self.popper.ended(att, att.end)
            if finish == "queued":  # first in dask's queue
                self.promoted[key] = None
                return True
            return False
        self.early.discard(key)
        if finish == "queued":
            self.held.add(key)
            return True
        self.popper.discard(v)  # sent on (or dropped) without queuing: out of the queue
        return False

    def _slot_view(self, idle: Any) -> Any:
        """The slot about to be filled, as the policy sees it: on the worker dask will
        give the head of its queue to (only a policy that learns speeds or reads what waits
        on a worker cares which)."""
        if not self.by_worker:
            return ANY_NODE
        ws = _next_worker(idle)
        return ANY_NODE if ws is None else Slot(self.speeds.node(ws.address), ws, self.tasks)

    def transition(self, key: Key, start: str, finish: str) -> None:
        """Every transition of a ranked task (O(1) plus ``pop``); after a failure the
        policy's accounts are rebuilt from the scheduler's state."""
        try:
            self._transition(key, start, finish)
        except Exception:
            self.audit.failed("release", key)
            self._schedule_reconcile()

    def _transition(self, key: Key, start: str, finish: str) -> None:
        popper = self.popper
        v = self.tasks.get(key)
        if v is None:
            # a task the policy does not rank (a speculative copy, another client's task)
            # freed a slot: dask fills it from its queue next, so the policy is asked
            if start == "processing" and self.learns and self.held:
                self._offer()
            return
        if (key in self.early or key in self.chosen) and self._wave(key, v, finish):
            pass  # a first wave's task, queued: held or promoted already
        elif finish == "queued":
            if not self.pending:  # the burst ends with the scheduler's current stimulus
                self._schedule_flush()
            self.pending.append(v)  # pushed with the rest of its burst (_flush)
            self.held.add(key)
        elif start == "queued":
            if key in self.promoted:
                del self.promoted[key]
            elif key in self.held:  # dask ran or dropped it without our release
                if self.pending:
                    self._flush()
                popper.discard(v)
            self.held.discard(key)
        slot_opened = False  # a task left processing: dask fills free slots next
        if finish == "processing":
            if key not in self.attempts:  # else started at its first-wave pop
                ts = self.scheduler.tasks.get(key)
                ws = ts.processing_on if ts is not None else None
                node = self.speeds.node(ws.address) if ws else -1
                now = time.time()
                att = LiveAttempt(v, node, now)
                popper.started(att, now)
                self.attempts[key] = att  # only once the policy counted it
        elif start == "processing":
            ended = self.attempts.pop(key, None)
            if ended is not None:
                ended.end = now = time.time()
                # a learner of speeds learns from compute times (WorkerSpeeds.learn), not
                # from assignment-to-finish here: it only closes its record of this attempt
                ended.outcome = None if self.learns else OUTCOME.get(finish, "killed")
                popper.ended(ended, now)
            slot_opened = True
        # Decide when a slot is about to be filled, with usage as it is now: a
        # task just ended (dask fills the free slots next), or slots are free already.
        if self.held and slot_opened and self.learns:
            self._offer()  # with promotions pending too: this end may free another worker
        elif not self.promoted and self.held:
            idle = dask_internals.idle_workers(self.scheduler)
            if slot_opened or idle:
                self._release(self._slot_view(idle))
        elif self.refused and not self.held:
            self._readmit()  # nothing left to refuse for

    def reshare(self, v: LiveTask) -> None:
        """The teams that want ``v`` grew (another team's graph came to want it): a
        running attempt of it is split among them from now on (the policy's
        ``reshare``, if it has one); a waiting one starts with them."""
        att = self.attempts.get(v.tid)
        if att is None:
            return
        att.task = v
        reshare = getattr(self.popper, "reshare", None)
        if reshare is not None:
            reshare(att, v.teams, time.time())

    def _offer(self) -> None:
        """A task just ended, and dask fills the free slots of the workers in
        ``idle_task_count`` right after this transition
        (``stimulus_queue_slots_maybe_opened``), each time with the head of its queue on
        the least busy of them. Walk those slots in dask's order and ask the policy
        about each: a task it chooses is promoted (dask takes the promoted tasks in
        order, each to the worker it was chosen for); a worker it leaves idle (``pop``
        answers None: on a worker measured slow, nothing would end before the projected
        end of the run) leaves the set, so dask leaves its slots alone. Workers refused
        earlier are put back first (dask's own ``check_idle_saturated``) and asked again,
        at most every ``reoffer_interval`` (a refused worker whose own task ends is back
        in dask's set at once, and asked). Only here, before dask counts free slots,
        never while it fills them (it counted them already: a worker taken out then
        would leave a counted slot without a worker). Tasks promoted before this end
        and not taken yet (several slots opening in one stimulus: a copy's win releases
        its primary) stay ahead: dask hands them out first, so a slot may get another
        worker's choice, but a refused worker never gets a task. One ``pop`` per free
        slot, as dask's filling would ask, plus one per refused worker at most every
        ``reoffer_interval``."""
        sched = self.scheduler
        if self.refused:
            now = time.monotonic()
            if now - self._reoffered >= self.reoffer_interval:
                self._reoffered = now
                self._readmit()
        idle = dask_internals.idle_workers(sched)
        # dask's walk: each slot to the least busy worker, (processing + taken) / threads,
        # the first in the set's order on ties. A heap of (load, place in the set's order)
        # gives the same worker as a `min` over the set for each slot, in O(log k) a slot
        # instead of O(k) (the walk of k free workers was O(k^2) a task end). A worker's
        # load changes here only by the tasks taken for it in this walk.
        heap = [(len(ws.processing) / ws.nthreads, j, ws) for j, ws in enumerate(idle)]
        heapq.heapify(heap)
        free: dict[Any, int] = {}  # free slots left, counted when a worker is first reached
        taken: dict[Any, int] = {}
        while self.held and heap:
            _, j, ws = heap[0]
            left = free.get(ws)
            if left is None:
                left = dask_internals.free_slots(sched, ws)
            n = taken.get(ws, 0)
            slot = Slot(self.speeds.node(ws.address), ws, self.tasks, n)
            if self._release(slot):
                taken[ws] = n + 1
                free[ws] = left - 1
                if left - 1 <= 0:
                    heapq.heappop(heap)
                else:
                    heapq.heapreplace(heap, ((len(ws.processing) + n + 1) / ws.nthreads, j, ws))
                continue
            heapq.heappop(heap)
            # left idle: out of dask's free slots, unless the policy chose a task for one
            # of its slots in this walk (dask will hand that task out to it)
            if self.held and ws not in taken:
                dask_internals.withhold_slots(sched, ws)
                self.refused.add(ws.address)
                self.kept_idle += 1
        if (
            (self.held or self.promoted)
            and not idle
            and not any(w.processing for w in sched.workers.values())
        ):
            # the policy refused every worker with nothing running anywhere: no task
            # end would offer them again; dask fills them from its queue (held order)
            self._readmit()

    def _readmit(self) -> None:
        """Put the refused workers back into dask's ``idle_task_count`` (dask's own
        rule: running and not full)."""
        sched = self.scheduler
        refused, self.refused = self.refused, set()
        for address in refused:
            dask_internals.restore_slots(sched, address)

    def _schedule_reconcile(self) -> None:
        """After a failed hook: rebuild the held set, the running attempts and the
        policy's accounts from the scheduler's state, once, outside the transition."""
        if self._reconcile_pending:
            return
        self._reconcile_pending = True
        asyncio.get_running_loop().call_soon(self.audit.guard("reconcile", self.reconcile))

    def reconcile(self) -> None:
        """O(processing + queued log queued); runs only after a failure."""
        self._reconcile_pending = False
        self._readmit()
        if self.reconciles:
            self.pending = []  # its accounts are rebuilt below from dask's queue
        else:
            self._flush()  # the policy keeps its own queue: hand it what it lacks
        sched = self.scheduler
        now = time.time()
        running: dict[str, float] = {}
        attempts: dict[Key, LiveAttempt] = {}
        for ws in sched.workers.values():
            for ts in ws.processing:
                v = self.tasks.get(ts.key)
                if v is None:
                    continue
                payers = v.teams or (v.team,)  # a shared task's cores, split
                for team in payers:
                    running[team] = running.get(team, 0) + v.cores / len(payers)
                old = self.attempts.get(ts.key)
                attempts[ts.key] = old or LiveAttempt(v, self.speeds.node(ws.address), now)
        self.attempts = attempts
        for key in list(self.promoted):
            rts = sched.tasks.get(key)
            if rts is None or rts.state != "queued":
                del self.promoted[key]
        queued = sorted(
            (
                ts
                for ts in dask_internals.queued_tasks(sched)
                if ts.key in self.tasks and ts.key not in self.promoted
            ),
            key=lambda ts: ts.priority or (),
        )
        held = [self.tasks[ts.key] for ts in queued]
        self.held = {v.tid for v in held}
        if self.reconciles:
            self.popper.reconcile(running, held, now)  # type: ignore[attr-defined]
        self.audit.event("reconciled", running=running, held=len(held))
