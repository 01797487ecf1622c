"""The daskjobs scheduler plugin: dask's scheduler, steered by the shared policy core.

How it orders work
==================

dask runs the runnable task with the lowest ``TaskState.priority`` first: in the
scheduler's queue of root-ish tasks, and in each worker's ready heap. Its own
priority is ``(-user_priority, generation, dask.order position)``. The plugin
inserts the policy's sort key after the user's priority::

    (-user_priority, policy.key(task), generation, dask.order position)

so a user's ``priority=`` still dominates, the policy decides everything else,
and dask's order breaks ties. The key comes from the *same policy object* the
simulator runs (:class:`~daskjobs.policies.LPT`,
:class:`~daskjobs.policies.CriticalPath`, :class:`~daskjobs.policies.FIFO`);
the plugin only adapts each ``TaskState`` to a task view (key, estimate, team,
dependencies) and writes the answer back.

Timing matters: dask sorts a new graph's first recommendations by priority
before the public ``update_graph`` hook runs, so rewriting priorities there
misorders the first ``~1.1 x threads`` tasks. The plugin therefore wraps the
scheduler's private ``_set_priorities`` (see :mod:`daskjobs.plugin._internals`)
and ranks each new graph right after dask prioritised it, before anything is
dispatched.

Estimates come from :class:`~daskjobs.plugin.estimates.Estimator`: the task's
``estimate`` annotation, else the measured median of its stage, else a default.

Fair share between teams
========================

With ``policy: fair-share`` the decision "which waiting task gets the next free
slot" is :meth:`FairShare.pop <daskjobs.policies.FairShare.pop>`, the same call
the simulator makes. dask hands free slots to the head of its queue of waiting
root tasks (``scheduler.queued``, ordered by priority) one slot at a time, and
calls the plugin's ``transition`` hook after each. The plugin keeps every queued
task *held* (ranked by the team-internal order, FIFO or longest first) and
*releases* exactly one: the task ``FairShare.pop`` chooses, promoted to the head
of dask's queue. The choice is made when a slot is about to be filled (a task
has just ended, or a worker has free slots), so it sees usage as it is then.
Usage (running slots, decayed with the configured half-life) is kept by the
policy from ``started``/``ended`` calls the plugin makes as tasks start and
finish. The quota rule is the policy's (:class:`~daskjobs.policies.FairShare`):
a team at its quota is not released while a team below its quota waits, and
borrows the idle slot otherwise; the plugin releases exactly what ``pop``
chooses, so the simulator and the live cluster follow one rule. Tasks that do not wait in
dask's queue (tasks with inputs, or with resource restrictions, which dask sends
to a worker as soon as they are runnable) are counted in usage but ordered by
the held rank on their worker.

Safety
======

The plugin runs inside a shared scheduler. Every hook is guarded: an exception
is logged at WARNING with the key, counted in ``plugin.errors`` and swallowed;
dask carries on with its own order. Hooks cost O(1) per transition; ranking a
graph costs O(n log n) once per graph. The only errors that reach a client are
about its own input (a non-numeric or NaN ``estimate``, an unknown team when
teams are strict): they fail that client's graph submission, with a message
naming the task and the problem, before any of its tasks run.

Recording
=========

With ``record: run.jsonl`` in the config, ``JobsPlugin(record=...)`` or, for a
while, :func:`daskjobs.record`, the plugin writes a trace of the run (the graph,
the workers, every attempt) as JSON Lines; the schema is in ``docs/trace.md``.
The hooks only hand small dicts to a bounded queue
(:class:`~daskjobs.plugin.recorder.TraceRecorder`); a thread writes them. True
start times come from :class:`~daskjobs.plugin.worker.StartReporter`, a worker
plugin the plugin installs itself on current and future workers while recording.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from daskjobs.config import Settings, policy_settings, settings
from daskjobs.plugin._internals import COPIES_CLIENT, check_scheduler, compute_seconds
from daskjobs.plugin.estimates import BadEstimate, Estimator
from daskjobs.plugin.metrics import install_metrics, uninstall_metrics
from daskjobs.plugin.recorder import TraceRecorder
from daskjobs.plugin.speculation import Speculator
from daskjobs.plugin.worker import REPORTER_NAME, RETURNED_TOPIC, STARTED_TOPIC, reporter_bytes
from daskjobs.policies import (
    FIFO,
    FairShare,
    HeapPolicy,
    NodeAware,
    Policy,
    Speculation,
    TaskView,
    registry,
)

__all__ = ["JobsPlugin", "UnknownTeam"]

logger = logging.getLogger("daskjobs.plugin")

EVENT_TOPIC = "daskjobs"
_WORKER_TOPICS = (STARTED_TOPIC, RETURNED_TOPIC)


class UnknownTeam(ValueError):
    """A task's team has no target while teams are strict."""


class _RankFailed(Exception):
    """Ranking a graph failed on ``key``: the graph keeps dask's own order."""

    def __init__(self, key: Hashable, what: str = "") -> None:
        super().__init__(what or key)
        self.key = key


@dataclass(frozen=True, slots=True)
class LiveTask:
    """A ``TaskState`` as the policies see it (a :class:`~daskjobs.policies.TaskView`)."""

    tid: Hashable
    estimate: float
    cores: int
    team: str
    submit: float
    deps: tuple[Hashable, ...]
    source: str  # where the estimate came from
    stage: str
    speculate: bool = True  # the task's ``speculate`` annotation

    @property
    def estimated(self) -> bool:
        """A real estimate (annotation or measured history), not the configured default."""
        return self.source != "default"


@dataclass(slots=True, eq=False)
class LiveAttempt:
    """One run of a task on a worker (an :class:`~daskjobs.policies.AttemptView`)."""

    task: LiveTask
    node: int
    start: float
    end: float = float("nan")
    outcome: str | None = None
    backup: bool = False


class _AnyNode:
    """The slot a released task will take: dask picks the worker, so any fits."""

    index = -1
    cores = 1 << 30
    free = 1 << 30


_ANY_NODE = _AnyNode()


class _PopperGraphs(FIFO):
    """What the ranking calls ``policy`` while a popper picks (fair-share, node-aware or
    any policy that is not a HeapPolicy): it tells the popper of each new graph and of
    each forgotten task, and names it in audit events. Its key is not used (held tasks
    are ranked by ``JobsPlugin._held_key``)."""

    def __init__(self, popper: Policy) -> None:
        super().__init__()
        self.popper = popper
        self.name = popper.name

    def add_graph(self, tasks: Sequence[TaskView]) -> None:
        self.popper.add_graph(tasks)

    def forget(self, tid: Hashable) -> None:
        self.popper.forget(tid)


class _Slot:
    """One free thread on the worker the policies call node ``index``."""

    __slots__ = ("index",)
    cores = 1
    free = 1

    def __init__(self, index: int) -> None:
        self.index = index


#: What the RPC handlers answer once the plugin was unregistered (dask keeps handlers).
_REMOVED = {"daskjobs": "removed"}

_RELEASED = -1e12  # released tasks sort before every held one (held keys are within +-1e11)
_OUTCOME = {"memory": "done", "erred": "failed"}


def _stage(ts: Any) -> str:
    ann = ts.annotations
    if ann and "stage" in ann:
        return str(ann["stage"])
    return str(ts.prefix.name)


class JobsPlugin(SchedulerPlugin):
    """Estimate-based priorities for dask's scheduler, from the shared policy core.

    Configure through the ``daskjobs`` section of dask's config (see
    ``daskjobs/daskjobs.yaml``); keyword arguments override it, e.g.
    ``JobsPlugin(policy="lpt", default_estimate="10s")``.

    Load it one of three ways: ``client.register_plugin(JobsPlugin())``;
    ``LocalCluster(scheduler_kwargs={"plugins": [JobsPlugin()]})`` (or
    :func:`daskjobs.local_cluster`); or ``dask scheduler --preload
    plugins/daskjobs_scheduler.py`` on a shared cluster.
    """

    name = "daskjobs"
    idempotent = False

    def __init__(self, **overrides: Any) -> None:
        self.overrides = dict(overrides)
        # checked here, on the client: the policy is one the registry holds and the plugin
        # can run (daskjobs.config.policy_names()), with settings it takes
        self.settings: Settings = settings(**overrides)
        self.scheduler: Any = None
        self.policy: HeapPolicy | None = None
        self.fair: FairShare | None = None
        # the policy that picks, slot by slot, which queued task runs next (fair share,
        # node-aware, any policy that is not a HeapPolicy); None for a HeapPolicy, whose
        # key only sets priorities
        self.popper: Policy | None = None
        self._t0 = time.time()
        self._held: set[Hashable] = set()  # queued in dask and in the fair-share queue
        self._released: Hashable | None = None
        self._release_seq = 0
        self._attempts: dict[Hashable, LiveAttempt] = {}
        self._workers: dict[str, int] = {}  # worker address -> node index of the policies
        # Worker speeds are learned by the simulator's NodeAware policy object, fed the
        # finished attempts (compute time against estimate); here it only learns.
        self.speeds = NodeAware()
        self.speculator: Speculator | None = None
        self.estimator: Estimator | None = None
        self.errors: dict[str, int] = {}
        self.events: deque[dict[str, Any]] = deque(maxlen=self.settings.audit_events)
        self.tasks: dict[Hashable, LiveTask] = {}
        self.ranked_graphs = 0
        self.ranked_tasks = 0
        self.estimate_sources = {"annotation": 0, "history": 0, "default": 0}
        self.recorder: TraceRecorder | None = None
        self._rec_running: dict[Hashable, str | None] = {}  # key -> worker, while processing
        self._reconcile_pending = False
        # the scheduler's "log-event" stream handler and the plugin's wrapper of it
        self._log_event_original: tuple[Any, Any] | None = None
        self.from_client = False  # set when unpickled: a client registered this plugin
        self._recording_by_client = False

    # -- pickling: only the configuration travels -------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {"overrides": self.overrides}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state["overrides"])  # type: ignore[misc]
        # it arrived pickled: a client registered it (client.register_plugin); the
        # operator's plugin is made on the scheduler (preload, Scheduler(plugins=...))
        self.from_client = True

    # -- lifecycle --------------------------------------------------------------------
    def _apply_trust(self, scheduler: Any) -> None:
        """The trust model (docs/plugin.md#trust): a client's plugin takes the settings
        that guard the operator's setup from the scheduler's own config, and may
        replace the operator's plugin only where the operator allows it."""
        if not self.from_client:
            return
        trusted = settings()  # the scheduler's dask config, no client keywords
        self.settings = dataclasses.replace(
            self.settings, record_dir=trusted.record_dir, clients=trusted.clients
        )
        # one JobsPlugin steers a scheduler (whatever name it is registered under, it
        # ranks every graph): a client's does not take over from the operator's
        for name, existing in scheduler.plugins.items():
            if (
                isinstance(existing, JobsPlugin)
                and not existing.from_client
                and not existing.settings.clients.replace_plugin
            ):
                raise PermissionError(
                    "daskjobs: this scheduler runs the daskjobs plugin its operator "
                    f"configured (policy {existing.settings.policy!r}); a client's "
                    "register_plugin does not replace it (daskjobs.clients.replace-plugin is "
                    "false on the scheduler). Ask the operator, or remove theirs on purpose "
                    f"first: client.unregister_scheduler_plugin({name!r})"
                )

    async def start(self, scheduler: Any) -> None:
        check_scheduler(scheduler)
        self._apply_trust(scheduler)
        if getattr(scheduler, "_daskjobs_wrapped", None) is not None:
            # a replaced registration: unwrap the previous plugin's hook first
            scheduler._set_priorities = scheduler._daskjobs_wrapped
        self.scheduler = scheduler
        s = self.settings
        # The policy comes from the registry, by name, with the settings of its own
        # (policy-options; fair-share's from the teams section): the object the simulator
        # and replay make. A HeapPolicy ranks each new graph by its key; any other policy
        # picks, slot by slot, which held root task dask runs next (docs/policies.md).
        made = registry.make(s.policy, **policy_settings(s))
        if isinstance(made, HeapPolicy):
            self.policy = made
        else:
            if isinstance(made, FairShare):
                self.fair = made  # explain and status report its teams
            if isinstance(made, NodeAware):
                self.speeds = made  # the learner of worker speeds picks per freed slot
            self.popper = made
            self.policy = _PopperGraphs(made)
        self.estimator = Estimator(s.default_estimate, s.history_samples, s.history_path)
        original = scheduler._set_priorities
        scheduler._daskjobs_wrapped = original

        def _set_priorities(**kwargs: Any) -> None:
            original(**kwargs)
            if not any(p is self for p in scheduler.plugins.values()):
                # unregistered (dask does not call close() then) or replaced: step aside
                if scheduler._set_priorities is _set_priorities:
                    scheduler._set_priorities = original
                    scheduler._daskjobs_wrapped = None
                    uninstall_metrics(scheduler, self)
                return
            tasks = kwargs["tasks"]
            new = self._unranked(tasks) if self.recorder is not None else None
            self._rank(tasks)
            if new:  # after ranking: estimates and teams are known (a rejected graph raised)
                self._record_graph(new)

        scheduler._set_priorities = _set_priorities
        scheduler.handlers["daskjobs_explain"] = self._rpc_explain
        scheduler.handlers["daskjobs_status"] = self._rpc_status
        scheduler.handlers["daskjobs_record"] = self._rpc_record
        self._install_worker_reports(scheduler)
        if s.history_path:
            from tornado.ioloop import PeriodicCallback

            pc = PeriodicCallback(self._guard("save-history", self._save_history), 30_000)
            scheduler.periodic_callbacks["daskjobs-history"] = pc
            pc.start()
        self._event("started", policy=s.policy, default_estimate=s.default_estimate)
        install_metrics(self, scheduler)  # never raises; a no-op without prometheus_client
        if s.record:
            # keywords of a client's plugin are the client's request: confined like one
            client_path = self.from_client and "record" in self.overrides
            await self._start_recording(s.record, by_client=client_path)
        if s.speculation.enabled:
            sp = s.speculation
            self.speculator = Speculator(
                self,
                Speculation(sp.late_factor, sp.min_runtime, sp.max_fraction),
                sp.interval,
            )
            if COPIES_CLIENT not in scheduler.clients:
                from distributed.scheduler import ClientState

                scheduler.clients[COPIES_CLIENT] = ClientState(COPIES_CLIENT)
            self.speculator.start(scheduler)
            await self._ensure_reporter()
            self._event("speculation", late_factor=sp.late_factor, max_fraction=sp.max_fraction)

    async def _ensure_reporter(self) -> None:
        """The worker plugin that reports true starts (recording and speculation need it)."""
        sched = self.scheduler
        if REPORTER_NAME in getattr(sched, "worker_plugins", {}):
            return
        try:
            await sched.register_worker_plugin(
                None, reporter_bytes(), name=REPORTER_NAME, idempotent=False
            )
        except Exception:
            self._failed("reporter-install")

    async def close(self) -> None:
        if self.speculator is not None:
            try:
                self.speculator.close()
            except Exception:
                self._failed("speculation")
        self._guard("save-history", self._save_history)()
        try:
            await self._stop_recording()
        except Exception:
            self._failed("record")
        sched = self.scheduler
        if sched is not None and getattr(sched, "_daskjobs_wrapped", None) is not None:
            sched._set_priorities = sched._daskjobs_wrapped
            sched._daskjobs_wrapped = None
            pc = sched.periodic_callbacks.pop("daskjobs-history", None)
            if pc is not None:
                pc.stop()
        if sched is not None:
            uninstall_metrics(sched, self)
            self._uninstall_worker_reports(sched)

    def _save_history(self) -> None:
        if self.estimator is not None and self.estimator.dirty:
            self.estimator.save()

    # -- safety -----------------------------------------------------------------------
    def _failed(self, where: str, key: object = None) -> None:
        self.errors[where] = self.errors.get(where, 0) + 1
        logger.warning(
            "daskjobs: %s failed%s", where, f" for {key!r}" if key else "", exc_info=True
        )

    def _guard(self, where: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception:
                self._failed(where)
                return None

        return guarded

    def _event(self, action: str, **msg: Any) -> None:
        """An audit record: kept for explain/status, written to the trace while
        recording, and published on dask's ``daskjobs`` topic for subscribers. The
        trace and ``self.events`` take records from here only, never from the topic
        (which any client may write to)."""
        msg = {"action": action, **msg}
        now = time.time()
        self.events.append({"time": now, **msg})
        rec = self.recorder
        if rec is not None:
            try:
                rec.emit({"type": "event", "time": now, "event": dict(msg)})
            except Exception:
                self._failed("record")
        try:
            self.scheduler.log_event(EVENT_TOPIC, msg)
        except Exception:
            self._failed("log_event")

    def _registered(self) -> bool:
        sched = self.scheduler
        return sched is not None and any(p is self for p in sched.plugins.values())

    # -- reports from the plugin's own worker plugin ---------------------------------
    def _install_worker_reports(self, scheduler: Any) -> None:
        """Take the start reporter's events from the workers' own streams.

        A worker's ``log_event`` arrives on its batched stream as a ``log-event``
        message, handled with the worker's address (which a client cannot claim);
        a client's ``log_event`` arrives as an RPC. The plugin reads its worker
        topics here, before dask publishes them, and ignores them on the public
        topic, so a client cannot forge a start or a returned thread.
        """
        original = scheduler.stream_handlers["log-event"]

        def log_event_from_worker(worker: str, topic: Any, msg: Any, **kwargs: Any) -> Any:
            if topic in _WORKER_TOPICS and isinstance(msg, dict):
                if self._registered():
                    try:
                        self._worker_report(worker, topic, msg)
                    except Exception:
                        self._failed("worker-report", msg.get("key"))
                elif scheduler.stream_handlers.get("log-event") is log_event_from_worker:
                    scheduler.stream_handlers["log-event"] = original  # step aside
            return original(worker=worker, topic=topic, msg=msg, **kwargs)

        scheduler.stream_handlers["log-event"] = log_event_from_worker
        self._log_event_original = (original, log_event_from_worker)

    def _uninstall_worker_reports(self, scheduler: Any) -> None:
        pair = getattr(self, "_log_event_original", None)
        if pair is not None and scheduler.stream_handlers.get("log-event") is pair[1]:
            scheduler.stream_handlers["log-event"] = pair[0]
        self._log_event_original = None

    def _worker_report(self, worker: str, topic: str, msg: dict[str, Any]) -> None:
        key = msg.get("key")
        started_as: Any = key
        if self.speculator is not None:
            if topic == STARTED_TOPIC:
                started_as = self.speculator.started(key, worker, msg.get("run_id"))
            else:
                self.speculator.returned(key, worker)
        rec = self.recorder
        if rec is not None and topic == STARTED_TOPIC and started_as is not None:
            rec.emit(
                {
                    "type": "started",
                    "time": time.time(),
                    "key": started_as,
                    "worker": worker,
                    "run_id": msg.get("run_id"),
                    "worker_time": msg.get("time"),
                }
            )

    # -- ranking a new graph ----------------------------------------------------------
    def _view(self, ts: Any, now: float) -> LiveTask:
        assert self.estimator is not None
        stage = _stage(ts)
        est, source = self.estimator.estimate(ts.key, ts.annotations, stage)
        teams = self.settings.teams
        team = str((ts.annotations or {}).get("team", teams.default))
        if teams.strict and team not in teams.targets:
            raise UnknownTeam(
                f"task {ts.key!r} belongs to team {team!r}, which is not configured "
                f"(daskjobs.teams.targets has: {', '.join(sorted(teams.targets)) or 'no teams'})"
            )
        deps = tuple(d.key for d in ts.dependencies)
        speculate = (ts.annotations or {}).get("speculate") is not False
        return LiveTask(ts.key, est, 1, team, now, deps, source, stage, speculate)

    @staticmethod
    def _unranked(tasks: Iterable[Any]) -> list[Any]:
        return [ts for ts in tasks if ts.priority is not None and len(ts.priority) == 3]

    def _rank(self, tasks: Iterable[Any]) -> None:
        new = self._unranked(tasks)
        if not new:
            return
        try:
            self._rank_new(new)
        except _RankFailed as e:  # dask's own order for the whole graph
            self._failed("rank", e.key)
        except (BadEstimate, UnknownTeam) as e:
            # the client's own input: fail its submission, naming the problem
            for ts in new:
                self.tasks.pop(ts.key, None)
            self._event("rejected-graph", error=str(e), tasks=len(new))
            keys = [ts.key for ts in new]
            asyncio.get_running_loop().call_soon(
                self._guard("cleanup", self._forget_rejected), keys
            )
            raise
        except Exception:
            self._failed("rank", new[0].key)

    def _rank_new(self, new: list[Any]) -> None:
        """Rank a new graph entirely or not at all: every view and key is computed
        before any priority changes; a failure names the task it failed on."""
        policy = self.policy
        assert policy is not None
        now = time.time()
        new.sort(key=lambda ts: ts.priority[2])  # dask.order: dependencies first
        views = []
        for ts in new:
            try:
                views.append(self._view(ts, now))
            except (BadEstimate, UnknownTeam):
                raise
            except Exception as e:
                raise _RankFailed(ts.key) from e
        try:
            policy.add_graph(views)  # a popper's too (fair share: every team known from here)
        except Exception as e:
            raise _RankFailed(new[0].key, "the graph") from e
        key = policy.key if self.popper is None else self._held_key
        ranks = []
        for ts, v in zip(new, views, strict=True):
            try:
                ranks.append(float(key(v)))
            except Exception as e:
                for w in views:
                    policy.forget(w.tid)
                raise _RankFailed(ts.key) from e
        sources = {"annotation": 0, "history": 0, "default": 0}
        for ts, v, rank in zip(new, views, ranks, strict=True):
            p = ts.priority
            ts.priority = (p[0], rank, p[1], p[2])
            self.tasks[ts.key] = v
            sources[v.source] += 1
        self.ranked_graphs += 1
        self.ranked_tasks += len(new)
        for src, count in sources.items():
            self.estimate_sources[src] += count
        self._event("ranked-graph", policy=policy.name, tasks=len(new), estimates=sources)

    def _forget_rejected(self, keys: list[Hashable]) -> None:
        """dask leaves the task states of a failed submission behind, released and
        wanted by nobody: forget them so a rejected graph leaves no trace."""
        sched = self.scheduler
        keyset = set(keys)
        recs: dict[Hashable, str] = {}
        for k in keys:
            ts = sched.tasks.get(k)
            if (
                ts is not None
                and ts.state == "released"
                and not ts.who_wants
                and all(d.key in keyset for d in ts.dependents)
            ):
                recs[k] = "forgotten"
        if recs:
            sched.transitions(recs, stimulus_id=f"daskjobs-rejected-{time.time()}")

    def _node(self, address: str) -> int:
        node = self._workers.get(address)
        if node is None:
            node = self._workers[address] = len(self._workers)
            ws = self.scheduler.workers.get(address) if self.scheduler is not None else None
            self.speeds.add_node(node, int(ws.nthreads) if ws is not None else 1)
        return node

    def _learn_speed(
        self, v: LiveTask, worker: str | None, seconds: float, outcome: str = "done"
    ) -> None:
        """An attempt of ``v`` ran ``seconds`` on ``worker``: finished (``done``), or beaten
        by its copy (``killed``). What teaches a speed is the learner's rule
        (:meth:`NodeAware.ended <daskjobs.policies.NodeAware.ended>`), not the plugin's."""
        if not worker:
            return
        att = LiveAttempt(v, self._node(worker), 0.0, seconds, outcome)
        if self.speeds.ended(att, seconds):  # the belief about this worker moved
            self._event(
                "worker-speed",
                worker=worker,
                speed=round(self.speeds.speed(att.node), 3),
                samples=self.speeds.samples(att.node),
            )

    def worker_speeds(self) -> list[dict[str, Any]]:
        """Per worker: believed slow-down (1.0 nominal) and the finished attempts it rests on."""
        sched = self.scheduler
        out = []
        for address, node in sorted(self._workers.items()):
            ws = sched.workers.get(address) if sched is not None else None
            out.append(
                {
                    "worker": address,
                    "name": str(ws.name) if ws is not None else None,
                    "speed": self.speeds.speed(node),
                    "samples": self.speeds.samples(node),
                    "present": ws is not None,
                }
            )
        return out

    def _held_key(self, v: LiveTask) -> float:
        """Rank of a held task: the team-internal order (FIFO: seconds since the
        plugin started; LPT: longest estimate first); under node-aware the shortest
        first (what an unmeasured or slow worker should take)."""
        if self.fair is None:
            return v.estimate
        if self.settings.teams.within == "lpt":
            return -v.estimate
        return v.submit - self._t0

    # -- fair share: release one queued task at a time --------------------------------
    def _release(self, node: Any = _ANY_NODE) -> None:
        """Promote the task the policy chooses for ``node``'s free slot to the head of
        dask's queue."""
        popper = self.popper
        sched = self.scheduler
        assert popper is not None
        now = time.time()
        while self._released is None and self._held:
            v = popper.pop(node, now)
            if v is None:
                return  # nothing the policy would run in this slot now
            if v.tid not in self._held:
                continue  # dask already ran or dropped it (a stale queue entry)
            ts = sched.tasks.get(v.tid)
            if ts is None or ts.state != "queued" or ts.priority is None:
                self._held.discard(v.tid)
                continue
            self._held.discard(v.tid)
            self._release_seq += 1
            p = ts.priority
            sched.queued.discard(ts)
            ts.priority = (p[0], _RELEASED + self._release_seq, *p[2:])
            sched.queued.add(ts)  # a promotion: safe with HeapSet's lazy deletion
            self._released = v.tid

    def _slot_view(self, node: int | None, idle: Any) -> Any:
        """The slot about to be filled, as the policy sees it: the worker a task just
        left, else one with free slots (only node-aware cares which)."""
        if self.popper is not self.speeds:
            return _ANY_NODE
        if node is None or node < 0:
            ws = min(idle, key=lambda w: w.address) if idle else None
            if ws is None:
                return _ANY_NODE
            node = self._node(ws.address)
        return _Slot(node)

    def _fair_transition(self, key: Hashable, start: str, finish: str) -> None:
        fair = self.popper
        assert fair is not None
        v = self.tasks.get(key)
        if v is None:
            return
        now = time.time()
        if finish == "queued":
            fair.push(v)
            self._held.add(key)
        elif start == "queued":
            if key == self._released:
                self._released = None
            elif key in self._held:  # dask ran or dropped it without our release
                fair.discard(v)
            self._held.discard(key)
        slot_opened: Any = None
        if finish == "processing":
            ts = self.scheduler.tasks.get(key)
            ws = ts.processing_on if ts is not None else None
            node = self._node(ws.address) if ws else -1
            att = LiveAttempt(v, node, now)
            fair.started(att, now)
            self._attempts[key] = att  # only once the policy counted it
        elif start == "processing":
            ended = self._attempts.pop(key, None)
            if ended is not None:
                ended.end = now
                # the node-aware learner learns from compute times (_learn_speed), not from
                # assignment-to-finish here: it only closes its books on this attempt
                ended.outcome = None if fair is self.speeds else _OUTCOME.get(finish, "killed")
                fair.ended(ended, now)
                slot_opened = ended.node
            else:
                slot_opened = -1
        # Decide when a slot is about to be filled, with usage as it is now: a
        # task just ended (dask fills its slot next), or slots are free already.
        if self._released is None and self._held:
            idle = self.scheduler.idle_task_count
            if slot_opened is not None or idle:
                self._release(self._slot_view(slot_opened, idle))

    def _schedule_reconcile(self) -> None:
        """After a failed hook: rebuild the held set, the running attempts and the
        policy's books from the scheduler's state, once, outside the transition."""
        if self._reconcile_pending:
            return
        self._reconcile_pending = True
        asyncio.get_running_loop().call_soon(self._guard("reconcile", self._reconcile))

    def _reconcile(self) -> None:
        """O(processing + queued log queued); runs only after a failure."""
        self._reconcile_pending = False
        sched = self.scheduler
        now = time.time()
        running: dict[str, int] = {}
        attempts: dict[Hashable, LiveAttempt] = {}
        for ws in sched.workers.values():
            for ts in ws.processing:
                v = self.tasks.get(ts.key)
                if v is None:
                    continue
                running[v.team] = running.get(v.team, 0) + v.cores
                old = self._attempts.get(ts.key)
                attempts[ts.key] = old or LiveAttempt(v, self._node(ws.address), now)
        self._attempts = attempts
        if self._released is not None:
            rts = sched.tasks.get(self._released)
            if rts is None or rts.state != "queued":
                self._released = None
        queued = sorted(
            (ts for ts in sched.queued if ts.key in self.tasks and ts.key != self._released),
            key=lambda ts: ts.priority,
        )
        held = [self.tasks[ts.key] for ts in queued]
        self._held = {v.tid for v in held}
        if self.fair is not None:
            self.fair.reconcile(running, held, now)
        self._event("reconciled", running=running, held=len(held))

    # -- per-transition hook: O(1) ------------------------------------------------------
    def transition(self, key: Hashable, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        sp = self.speculator
        if self.recorder is not None and (finish == "processing" or start == "processing"):
            try:
                as_key = sp.recorded_as(key, start, finish) if sp is not None else key
                if as_key is not None:
                    self._record_transition(as_key, start, finish, kwargs)
            except Exception:
                self._failed("record", key)
        learn = True
        if sp is not None:
            try:
                # a copy, or a task standing in for its winning copy: nothing to learn
                learn = not (sp.is_copy(key) or sp.is_alias(key))
                sp.transition(key, start, finish, kwargs)
            except Exception:
                self._failed("speculation", key)
        try:
            if learn and start == "processing" and finish == "memory":
                v = self.tasks.get(key)
                seconds = compute_seconds(kwargs.get("startstops", ()))
                if v is not None and seconds is not None and self.estimator is not None:
                    self.estimator.observe(v.stage, seconds)
                    self._learn_speed(v, kwargs.get("worker"), seconds)
            if self.popper is not None:
                try:
                    self._fair_transition(key, start, finish)
                except Exception:
                    self._failed("transition", key)
                    self._schedule_reconcile()
            if finish == "forgotten":
                self.tasks.pop(key, None)
                if self.policy is not None:
                    self.policy.forget(key)
        except Exception:
            self._failed("transition", key)

    # -- explain and status -----------------------------------------------------------
    def explain(self, key: Hashable) -> dict[str, Any]:
        """Why ``key`` waits, or where it ran: estimate, priority, team, place in queue."""
        sched = self.scheduler
        ts = sched.tasks.get(key)
        if ts is None:
            return {"key": key, "state": "unknown", "why": "the scheduler does not know this key"}
        v = self.tasks.get(key)
        out: dict[str, Any] = {
            "key": key,
            "state": ts.state,
            "priority": list(ts.priority) if ts.priority else None,
            "policy": self.settings.policy,
            "estimate": v.estimate if v else None,
            "estimate_source": v.source if v else None,
            "stage": v.stage if v else None,
            "team": v.team if v else None,
            "user_priority": -ts.priority[0] if ts.priority else None,
        }
        if self.fair is not None and v is not None:
            out["team_state"] = self._team_row(v.team)
        if ts.state == "queued":
            ahead = sum(1 for other in sched.queued if other.priority < ts.priority)
            out["queue_position"] = ahead
            out["why"] = f"queued behind {ahead} task(s) of higher priority; no free slot yet"
            if self.fair is not None and v is not None:
                row = out["team_state"]
                if key == self._released:
                    out["why"] = "next in line: fair share chose it for the next free slot"
                elif row["quota"] is not None and row["running"] >= row["quota"]:
                    out["why"] = (
                        f"team {v.team!r} holds {row['running']} slot(s), its quota; "
                        "it runs when the team is below quota or no other team waits"
                    )
                else:
                    out["why"] = (
                        f"waiting for fair share: team {v.team!r} uses {row['usage']:.3g} "
                        f"per share {row['share']:.3g}; teams further below their share go first"
                    )
        elif ts.state == "processing":
            out["worker"] = ts.processing_on.address if ts.processing_on else None
            out["why"] = "assigned to a worker"
        elif ts.state == "memory":
            out["workers"] = sorted(ws.address for ws in ts.who_has)
            out["why"] = "done"
        elif ts.state == "waiting":
            pending = sorted(str(d.key) for d in ts.waiting_on)[:10]
            out["waiting_on"] = pending
            out["why"] = f"waiting for {len(ts.waiting_on)} input(s)"
        else:
            out["why"] = f"in state {ts.state!r}"
        where = [ts.processing_on] if ts.processing_on else list(ts.who_has or ())
        speeds = {
            ws.address: self.speeds.speed(self._workers[ws.address])
            for ws in where
            if ws.address in self._workers
        }
        if speeds:
            out["worker_speed"] = speeds
        sp = self.speculator
        if sp is not None and key in sp.reasons:  # the speculation driver's recorded reason
            out["copy"] = sp.reasons[key]
        return out

    def _team_row(self, team: str) -> dict[str, Any]:
        fair = self.fair
        assert fair is not None
        if team not in fair._queues:  # a team never seen yet
            return {
                "team": team,
                "share": None,
                "usage": 0.0,
                "running": 0,
                "queued": 0,
                "quota": self.settings.teams.quotas.get(team),
            }
        return {
            "team": team,
            "share": fair.share(team),
            "usage": fair.usage(team, time.time()),
            "running": fair.running(team),
            "queued": fair.queued(team),
            "quota": fair.quotas.get(team),
        }

    def teams(self) -> list[dict[str, Any]]:
        """Per team: target share, decayed usage, running slots, queued, quota."""
        if self.fair is None:
            return []
        return [self._team_row(t) for t in self.fair._teams]

    def status(self) -> dict[str, Any]:
        est = self.estimator
        return {
            "speculation": self.speculator.stats() if self.speculator is not None else None,
            "teams": self.teams(),
            "workers": self.worker_speeds(),
            "policy": self.settings.policy,
            "ranked_graphs": self.ranked_graphs,
            "tasks": len(self.tasks),
            "errors": dict(self.errors),
            "stages": est.stages() if est else {},
            "settings": dataclasses.asdict(self.settings),  # what is in force
            "overrides": dict(self.overrides),  # the keywords it was made with
            "from_client": self.from_client,
            "recording": self.recorder.stats() if self.recorder is not None else None,
        }

    def _rpc_explain(self, key: Any = None) -> dict[str, Any]:
        if not self._registered():
            return _REMOVED
        if isinstance(key, list):  # tuple keys arrive as lists over msgpack
            key = tuple(key)
        return self.explain(key)

    def _rpc_status(self) -> dict[str, Any]:
        if not self._registered():
            return _REMOVED
        return self.status()

    # -- recording (docs/trace.md) ------------------------------------------------------
    def _client_trace_path(self, path: str) -> str:
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

    async def _start_recording(self, path: str, by_client: bool = False) -> TraceRecorder:
        if self.recorder is not None:
            raise RuntimeError(
                f"daskjobs is already recording to {self.recorder.path!r}; stop that first"
            )
        sched = self.scheduler
        if by_client:
            path = self._client_trace_path(path)
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
        self.recorder = rec
        self._recording_by_client = by_client
        now = time.time()
        for ws in list(sched.workers.values()):
            rec.emit(self._worker_record(ws, now, existing=True))
        if sched.tasks:  # recording starts mid-run: what is already there, once
            self._record_graph(list(sched.tasks.values()), existing=True)
        await self._ensure_reporter()
        self._event("recording", path=rec.path)
        return rec

    async def _stop_recording(self) -> dict[str, Any] | None:
        rec = self.recorder
        if rec is None:
            return None
        self._event("recording-stopped", path=rec.path)
        self.recorder = None
        self._rec_running.clear()
        sched = self.scheduler
        if self.speculator is None and REPORTER_NAME in getattr(sched, "worker_plugins", {}):
            try:
                await sched.unregister_worker_plugin(None, REPORTER_NAME)
            except Exception:
                logger.debug("daskjobs: removing the start reporter failed", exc_info=True)
        await asyncio.to_thread(rec.close)
        return rec.stats()

    async def _rpc_record(self, action: str = "status", path: Any = None) -> dict[str, Any]:
        if not self._registered():
            return _REMOVED
        if action == "start":
            if not path:
                raise ValueError("daskjobs.record: give the path of the trace file to write")
            rec = await self._start_recording(str(path), by_client=True)
            return {"recording": True, **rec.stats()}
        if action == "stop":
            if self.recorder is not None and not self._recording_by_client:
                raise PermissionError(
                    f"daskjobs: the recording to {self.recorder.path!r} is the operator's "
                    "(daskjobs.record); a client cannot stop it"
                )
            return {"recording": False, "stats": await self._stop_recording()}
        if action == "status":
            cur = self.recorder
            return {"recording": cur is not None, "stats": cur.stats() if cur else None}
        raise ValueError(f"daskjobs_record: unknown action {action!r} (start, stop, status)")

    def _worker_record(self, ws: Any, now: float, existing: bool = False) -> dict[str, Any]:
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

    def _record_graph(self, new: Sequence[Any], existing: bool = False) -> None:
        rec = self.recorder
        if rec is None:
            return
        now = time.time()
        default_team = self.settings.teams.default
        sp = self.speculator
        for ts in new:
            if sp is not None and sp.is_copy(ts.key):
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
                    "stage": v.stage if v else _stage(ts),
                    "resources": dict(ts.resource_restrictions or {}) or None,
                    "user_priority": -p[0] if p else 0,
                    "priority": list(p) if p else None,
                    "submit": v.submit if v else now,
                }
                if existing:
                    r["existing"] = True
                    r["state"] = ts.state
                rec.emit(r)
            except Exception:
                self._failed("record", ts.key)

    def _record_transition(
        self, key: Hashable, start: str, finish: str, kwargs: dict[str, Any]
    ) -> None:
        rec = self.recorder
        assert rec is not None
        now = time.time()
        stimulus = kwargs.get("stimulus_id")
        if finish == "processing":
            ts = self.scheduler.tasks.get(key)
            ws = ts.processing_on if ts is not None else None
            addr = ws.address if ws is not None else None
            self._rec_running[key] = addr
            r0 = {"type": "assigned", "time": now, "key": key, "worker": addr}
            r0["stimulus_id"] = stimulus
            rec.emit(r0)
            return
        # leaving processing: the attempt is over
        worker = self._rec_running.pop(key, None)
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

    # -- recording hooks: O(1), guarded, inert while not recording ----------------------
    def add_worker(self, scheduler: Any, worker: str) -> None:
        rec = self.recorder
        if rec is None:
            return
        try:
            ws = scheduler.workers.get(worker)
            if ws is not None:
                rec.emit(self._worker_record(ws, time.time()))
        except Exception:
            self._failed("record", worker)

    def remove_worker(self, scheduler: Any, worker: str, *, stimulus_id: str, **kw: Any) -> None:
        if self.speculator is not None:
            try:
                self.speculator.worker_removed(worker)
            except Exception:
                self._failed("speculation", worker)
        rec = self.recorder
        if rec is None:
            return
        try:
            rec.emit(
                {
                    "type": "worker-removed",
                    "time": time.time(),
                    "worker": worker,
                    "stimulus_id": stimulus_id,
                }
            )
        except Exception:
            self._failed("record", worker)
