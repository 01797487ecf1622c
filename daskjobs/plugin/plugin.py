"""The daskjobs scheduler plugin: dask's scheduler, steered by the shared policy core.

One object per concern, each a module with one job; this class composes them,
receives dask's hooks and hands each to the parts that care:

* :mod:`~daskjobs.plugin.ranking` - each new graph's ``TaskState.priority`` from
  the policy (``key``, or ``hold_key`` for a policy that picks slot by slot), ranked
  before anything is dispatched (the plugin wraps the scheduler's private
  ``_set_priorities``: dask sorts a new graph's first recommendations before the
  public ``update_graph`` hook runs).
* :mod:`~daskjobs.plugin.release` - the release gate: under a policy that picks slot
  by slot (fair share, node-aware, ...), dask's free slots get what ``pop`` chooses.
* :mod:`~daskjobs.plugin.speeds` - workers as the policies' nodes, and the speed
  learner.
* :mod:`~daskjobs.plugin.speculation` - backup copies of late tasks, as dask tasks.
* :mod:`~daskjobs.plugin.recording` - the trace of a run (docs/trace.md).
* :mod:`~daskjobs.plugin.explain` - ``explain`` and ``status``.
* :mod:`~daskjobs.plugin.audit` - the audit trail, and the guard every hook runs in.

Every scheduling decision is a policy's (:mod:`daskjobs.policies`); these parts
adapt dask's state into the policies' views and enact the answers. Every private
piece of distributed they touch is in :mod:`daskjobs.plugin._internals`, checked
at start.

Safety: the plugin runs inside a shared scheduler. Every hook is guarded: an
exception is logged at WARNING with the key, counted in ``plugin.errors`` and
swallowed; dask carries on with its own order. Hooks cost O(1) per transition;
ranking a graph O(n log n) once per graph. The only errors that reach a client are
about its own input (a bad ``estimate``, an unknown team when teams are strict).

Trust (docs/plugin.md#trust): the operator's plugin is not replaced by a client's;
a client's plugin reads the settings that guard the operator's setup from the
scheduler's config; the start reporter's events are read from the workers' own
streams.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin

from daskjobs.config import Settings, settings
from daskjobs.plugin import _internals as dask_internals
from daskjobs.plugin import explain as _explain
from daskjobs.plugin._internals import COPIES_CLIENT, check_scheduler, compute_seconds
from daskjobs.plugin.audit import Audit, guarded
from daskjobs.plugin.dashboard import install_dashboard, uninstall_dashboard
from daskjobs.plugin.gangs import Placer
from daskjobs.plugin.inventory import INVENTORY_NAME, INVENTORY_TOPIC, inventory_bytes
from daskjobs.plugin.metrics import install_metrics, uninstall_metrics
from daskjobs.plugin.preemption import Preemptor
from daskjobs.plugin.ranking import Ranker, UnknownTeam
from daskjobs.plugin.recorder import TraceRecorder
from daskjobs.plugin.recording import Recording
from daskjobs.plugin.release import ReleaseGate
from daskjobs.plugin.speculation import Speculator
from daskjobs.plugin.speeds import WorkerSpeeds
from daskjobs.plugin.views import LiveAttempt, LiveTask
from daskjobs.plugin.worker import REPORTER_NAME, RETURNED_TOPIC, STARTED_TOPIC, reporter_bytes
from daskjobs.policies import FairShare, HeapPolicy, Policy, Speculation
from daskjobs.policies.preemption import make_preemption_policy, preemption_options
from daskjobs.policies.resources import GangPolicy
from daskjobs.tasks import CHECKPOINT_TOPIC

if TYPE_CHECKING:
    from dask.typing import Key

__all__ = ["JobsPlugin", "LiveAttempt", "LiveTask", "UnknownTeam"]

logger = logging.getLogger("daskjobs.plugin")

_WORKER_TOPICS = (STARTED_TOPIC, RETURNED_TOPIC, CHECKPOINT_TOPIC, INVENTORY_TOPIC)

#: What the RPC handlers answer once the plugin was unregistered (dask keeps handlers).
_REMOVED = {"daskjobs": "removed"}


class JobsPlugin(SchedulerPlugin):
    """Estimate-based priorities for dask's scheduler, from the shared policy core.

    Configure through the ``daskjobs`` section of dask's config (see
    ``daskjobs/daskjobs.yaml``); keyword arguments override it, e.g.
    ``JobsPlugin(policy="lpt", default_estimate="10s")``.

    Load it one of three ways: ``client.register_plugin(JobsPlugin())``;
    ``LocalCluster(scheduler_kwargs={"plugins": [JobsPlugin()]})`` (or
    :func:`daskjobs.local_cluster`); or ``dask scheduler --preload
    daskjobs.preload`` on a shared cluster.
    """

    name = "daskjobs"
    idempotent = False

    def __init__(self, **overrides: Any) -> None:
        self.overrides = dict(overrides)
        # checked here, on the client: the policy is one the registry holds and the plugin
        # can run (daskjobs.config.policy_names()), with settings it takes
        self.settings: Settings = settings(**overrides)
        self.scheduler: Any = None
        self.from_client = False  # set when unpickled: a client registered this plugin
        self.audit = Audit(self.settings.audit_events)
        self.ranker = Ranker(self.settings, self.audit)
        self.speeds = WorkerSpeeds(self.audit, self.ranker.learner)
        self.gate: ReleaseGate | None = None
        if self.ranker.popper is not None:
            self.gate = ReleaseGate(self.ranker.popper, self.ranker.tasks, self.speeds, self.audit)
        self.recording = Recording(
            self.settings,
            self.audit,
            self.ranker.tasks,
            self._ensure_reporter,
            self._drop_reporter,
        )
        self.speculator: Speculator | None = None
        self._reporter_delay: float | None = None  # the installed start reporter's delay
        self.preemptor: Preemptor | None = None
        pr = self.settings.preemption
        if pr.enabled:
            # the object the job-level simulator runs, with the operator's settings
            self.preemption_policy = make_preemption_policy(pr.policy, **preemption_options(pr))
            self.ranker.te_first = self.preemption_policy.te_first
        self.placer: Placer | None = None
        rs = self.settings.resources
        if rs.enabled:
            # with both on, the placer enacts preemption too (it places every resource task)
            self.placer = Placer(
                GangPolicy(reservation=rs.reservation),
                refuse_unsatisfiable=rs.refuse_unsatisfiable,
                interval=rs.interval,
                audit=self.audit,
                tasks=self.ranker.tasks,
                preemption=self.preemption_policy if pr.enabled else None,
                preempt_resource=pr.resource,
                grace=pr.grace,
            )
        # the scheduler's "log-event" stream handler and the plugin's wrapper of it
        self._log_event_original: tuple[Any, Any, Any] | None = None
        self._starting = False

    # -- the parts, as the rest of daskjobs and the tests read them -----------------------
    @property
    def tasks(self) -> dict[Key, LiveTask]:
        return self.ranker.tasks

    @property
    def policy(self) -> HeapPolicy:
        return self.ranker.policy

    @property
    def popper(self) -> Policy | None:
        return self.ranker.popper

    @property
    def fair(self) -> FairShare | None:
        return self.ranker.fair

    @property
    def estimator(self) -> Any:
        return self.ranker.estimator

    @property
    def ranked_graphs(self) -> int:
        return self.ranker.ranked_graphs

    @property
    def ranked_tasks(self) -> int:
        return self.ranker.ranked_tasks

    @property
    def estimate_sources(self) -> dict[str, int]:
        return self.ranker.estimate_sources

    @property
    def events(self) -> Any:
        return self.audit.events

    @property
    def errors(self) -> dict[str, int]:
        return self.audit.errors

    @property
    def recorder(self) -> TraceRecorder | None:
        return self.recording.recorder

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
        self.recording.settings = self.settings
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
        self._starting = True
        try:
            await self._start(scheduler)
        finally:
            self._starting = False

    async def _start(self, scheduler: Any) -> None:
        check_scheduler(scheduler)
        self._apply_trust(scheduler)
        self.scheduler = scheduler
        for part in (self.audit, self.ranker, self.speeds, self.gate, self.recording):
            if part is not None:
                part.scheduler = scheduler
        s = self.settings

        def new_graph(tasks: Any) -> bool:
            if not self._registered():
                # unregistered (dask does not call close() then) or replaced: step aside
                uninstall_metrics(scheduler, self)
                return False
            placed = self._check_resources(tasks) if self.placer is not None else None
            new = self.ranker.unranked(tasks) if self.recorder is not None else None
            self.ranker.rank(tasks)
            if placed:
                self._admit_resources(placed)
            if new:  # after ranking: estimates and teams are known (a rejected graph raised)
                self.recording.graph(new)
            return True

        # a replaced registration's wrap is undone first
        dask_internals.wrap_priorities(scheduler, new_graph)
        scheduler.handlers["daskjobs_explain"] = self._rpc_explain
        scheduler.handlers["daskjobs_status"] = self._rpc_status
        scheduler.handlers["daskjobs_record"] = self._rpc_record
        self._install_worker_reports(scheduler)
        if s.history_path:
            from tornado.ioloop import PeriodicCallback

            save = self.audit.guard("save-history", self._save_history)
            pc = PeriodicCallback(save, 30_000)
            scheduler.periodic_callbacks["daskjobs-history"] = pc
            pc.start()
        self.audit.event("started", policy=s.policy, default_estimate=s.default_estimate)
        install_metrics(self, scheduler)  # never raises; a no-op without prometheus_client
        install_dashboard(self, scheduler)  # never raises; a no-op without bokeh
        if s.record:
            # keywords of a client's plugin are the client's request: confined like one
            client_path = self.from_client and "record" in self.overrides
            await self.recording.start(s.record, by_client=client_path)
        if s.speculation.enabled:
            sp = s.speculation
            self.speculator = Speculator(
                Speculation(sp.late_factor, sp.min_runtime, sp.max_fraction, sp.ahead, sp.interval),
                self.audit,
                self.ranker.tasks,
                self.speeds,
            )
            self.recording.is_copy = self.speculator.is_copy
            dask_internals.ensure_client(scheduler, COPIES_CLIENT)
            self.speculator.start(scheduler)
            await self._ensure_reporter()
            self.audit.event(
                "speculation", late_factor=sp.late_factor, max_fraction=sp.max_fraction
            )
        pr = s.preemption
        if pr.enabled and self.placer is None:
            self.preemptor = Preemptor(
                self.preemption_policy,
                pr.resource,
                pr.grace,
                pr.interval,
                self.audit,
                self.ranker.tasks,
            )
            self.preemptor.start(scheduler)
            await self._ensure_reporter()
            self.audit.event("preemption", **self.preemption_policy.describe())
        if self.placer is not None:
            self.placer.start(scheduler)
            await self._ensure_reporter()  # true starts; a gang's stop signal
            await self._ensure_inventory()
            self.audit.event("resources", **self.placer.policy.describe())
            if pr.enabled:  # enacted by the placer: it places every resource task
                self.audit.event("preemption", **self.preemption_policy.describe())

    def _check_resources(self, tasks: Any) -> list[Any]:
        """The new tasks the placer places; a malformed or impossible request fails the
        submission, naming it (as a bad estimate does), and leaves nothing behind."""
        from daskjobs.plugin.gangs import ResourceRequestError

        assert self.placer is not None
        new = self.ranker.unranked(tasks)
        try:
            return self.placer.check(new)
        except ResourceRequestError as e:
            self.audit.event("rejected-graph", error=str(e), tasks=len(new))
            keys = [ts.key for ts in new]
            cleanup = self.audit.guard("cleanup", self.ranker._forget_rejected)
            asyncio.get_running_loop().call_soon(cleanup, keys)
            raise
        except Exception:
            self.audit.failed("resources")
            return []

    @guarded("resources")
    def _admit_resources(self, placed: list[Any]) -> None:
        assert self.placer is not None
        self.placer.admit(placed)

    async def _ensure_inventory(self) -> None:
        """The worker plugin that reports each worker's inventory (resources need it)."""
        sched = self.scheduler
        if dask_internals.has_worker_plugin(sched, INVENTORY_NAME):
            return
        try:
            await dask_internals.install_worker_plugin(sched, INVENTORY_NAME, inventory_bytes())
        except Exception:
            self.audit.failed("inventory-install")

    def _report_delay(self) -> float:
        """How late the workers may report starts (``StartReporter``'s ``delay``): at once
        for recording, preemption and resources (each start matters to them); for
        speculation alone, within half of ``min-runtime`` (no task is judged late sooner,
        so no decision changes) and within one check ``interval``."""
        if (
            self.speculator is None
            or self.recording.recorder is not None
            or self.preemptor is not None
            or self.placer is not None
        ):
            return 0.0
        sp = self.settings.speculation
        return min(sp.min_runtime / 2, sp.interval)

    async def _ensure_reporter(self) -> None:
        """The worker plugin that reports true starts (recording and speculation need it),
        with the delay the plugin's parts allow now (installed again when that changes)."""
        sched = self.scheduler
        delay = self._report_delay()
        if dask_internals.has_worker_plugin(sched, REPORTER_NAME) and delay == self._reporter_delay:
            return
        try:
            await dask_internals.install_worker_plugin(sched, REPORTER_NAME, reporter_bytes(delay))
            self._reporter_delay = delay
        except Exception:
            self.audit.failed("reporter-install")

    async def _drop_reporter(self) -> None:
        """Recording stopped: remove the start reporter unless speculation still needs it
        (then it may report late again)."""
        sched = self.scheduler
        needed = (
            self.speculator is not None or self.preemptor is not None or self.placer is not None
        )
        if needed:
            await self._ensure_reporter()
        elif dask_internals.has_worker_plugin(sched, REPORTER_NAME):
            try:
                await dask_internals.remove_worker_plugin(sched, REPORTER_NAME)
            except Exception:
                logger.debug("daskjobs: removing the start reporter failed", exc_info=True)

    async def close(self) -> None:
        if self.speculator is not None:
            try:
                self.speculator.close()
            except Exception:
                self.audit.failed("speculation")
        if self.preemptor is not None:
            try:
                self.preemptor.close()
            except Exception:
                self.audit.failed("preemption")
        if self.placer is not None:
            try:
                self.placer.close()
            except Exception:
                self.audit.failed("resources")
        self.audit.guard("save-history", self._save_history)()
        try:
            await self.recording.stop()
        except Exception:
            self.audit.failed("record")
        sched = self.scheduler
        if sched is not None and dask_internals.unwrap_priorities(sched):
            pc = sched.periodic_callbacks.pop("daskjobs-history", None)
            if pc is not None:
                pc.stop()
        if sched is not None:
            uninstall_metrics(sched, self)
            uninstall_dashboard(sched, self)
            self._uninstall_worker_reports(sched)

    def _save_history(self) -> None:
        est = self.ranker.estimator
        if est.dirty:
            est.save()

    def _registered(self) -> bool:
        sched = self.scheduler
        return sched is not None and any(p is self for p in sched.plugins.values())

    # -- compatibility shims for the rest of daskjobs ---------------------------------
    def _event(self, action: str, **msg: Any) -> None:
        self.audit.event(action, **msg)

    def _failed(self, where: str, key: object = None) -> None:
        self.audit.failed(where, key)

    # -- reports from the plugin's own worker plugin ---------------------------------
    def _install_worker_reports(self, scheduler: Any) -> None:
        """Take the start reporter's events from the workers' own streams.

        A worker's ``log_event`` arrives on its batched stream as a ``log-event``
        message, handled with the worker's address (which a client cannot claim);
        a client's ``log_event`` arrives as an RPC. The plugin reads its worker
        topics here, before dask publishes them, and ignores them on the public
        topic, so a client cannot forge a start or a returned thread.
        """

        def log_event_from_worker(worker: str, topic: Any, msg: Any, **kwargs: Any) -> bool:
            if topic in _WORKER_TOPICS and isinstance(msg, dict):
                # while start() runs, dask has not added the plugin yet: the workers'
                # first reports (inventories, at once) are ours already
                if not (self._starting or self._registered()):
                    return False  # step aside
                self._worker_report(worker, topic, msg)
            return True

        self._log_event_original = dask_internals.wrap_stream_handler(
            scheduler, "log-event", log_event_from_worker
        )

    def _uninstall_worker_reports(self, scheduler: Any) -> None:
        dask_internals.unwrap_stream_handler(scheduler, self._log_event_original)
        self._log_event_original = None

    @guarded("worker-report")
    def _worker_report(self, worker: str, topic: str, msg: dict[str, Any]) -> None:
        if topic == INVENTORY_TOPIC:
            if self.placer is not None:
                self.placer.inventory_report(worker, msg)
            return
        starts = msg.get("starts") if topic == STARTED_TOPIC else None
        if starts is not None:  # a delayed report: [key, run_id, worker time, age] each
            for row in starts:
                try:
                    key, run_id, when, age = row
                    age = float(age)
                except (TypeError, ValueError):
                    self.audit.failed("worker-report")  # the others in it still count
                    continue
                self._report(worker, topic, {"key": key, "run_id": run_id, "time": when}, age)
            return
        self._report(worker, topic, msg)

    def _report(self, worker: str, topic: str, msg: dict[str, Any], age: float = 0.0) -> None:
        """One task's report: its start (``age`` seconds ago, if delayed), its thread's
        return, or its checkpoint."""
        key = msg.get("key")
        if key is None:
            return
        started_as: Any = key
        if self.placer is not None and topic == STARTED_TOPIC:
            when = msg.get("time")
            self.placer.started(key, float(when) if isinstance(when, int | float) else time.time())
        if self.preemptor is not None:
            self._preemption_report(worker, topic, key, msg)
        if topic == CHECKPOINT_TOPIC:
            if self.placer is not None:
                when = msg.get("time")
                when = when if isinstance(when, int | float) else time.time()
                self.placer.checkpointed(key, when)
            self._record_checkpoint(worker, key, msg)
            return
        if self.speculator is not None:
            if topic == STARTED_TOPIC:
                started_as = self.speculator.started(key, worker, msg.get("run_id"), age)
            else:
                self.speculator.returned(key, worker)
        if topic == STARTED_TOPIC and started_as is not None:
            self.recording.started(started_as, worker, msg)

    @guarded("record", key_arg=1)
    def _record_checkpoint(self, worker: str, key: Key, msg: dict[str, Any]) -> None:
        """A task's checkpoint, into the trace only (not the audit log: one a step):
        replay estimates the checkpoint interval from them."""
        rec = self.audit.recorder
        if rec is not None:
            when = msg.get("time")
            when = float(when) if isinstance(when, int | float) else time.time()
            event = {"action": "checkpoint", "key": str(key), "worker": worker}
            rec.emit({"type": "event", "time": when, "event": event})

    @guarded("preemption", key_arg=2)
    def _preemption_report(self, worker: str, topic: str, key: Key, msg: dict[str, Any]) -> None:
        pe = self.preemptor
        assert pe is not None
        when = msg.get("time")
        when = float(when) if isinstance(when, int | float) else time.time()
        if topic == STARTED_TOPIC:
            pe.started(key, worker, msg.get("run_id"), when)
        elif topic == CHECKPOINT_TOPIC:
            pe.checkpointed(key, when)

    # -- per-transition hook: O(1) ------------------------------------------------------
    def transition(self, key: Key, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        sp = self.speculator
        if self.recorder is not None and (finish == "processing" or start == "processing"):
            self._record_transition(key, start, finish, kwargs)
        learn = True
        if sp is not None:
            learn = self._speculation_transition(key, start, finish, kwargs)
        if self.preemptor is not None:
            self._preemption_transition(key, start, finish, kwargs.get("stimulus_id") or "")
        if self.placer is not None:
            self._resources_transition(key, start, finish)
        self._task_transition(key, start, finish, kwargs, learn)

    @guarded("preemption", key_arg=0)
    def _preemption_transition(self, key: Key, start: str, finish: str, stimulus: str) -> None:
        assert self.preemptor is not None
        self.preemptor.transition(key, start, finish, stimulus)

    @guarded("resources", key_arg=0)
    def _resources_transition(self, key: Key, start: str, finish: str) -> None:
        assert self.placer is not None
        self.placer.transition(key, start, finish)

    @guarded("record", key_arg=0)
    def _record_transition(self, key: Key, start: str, finish: str, kwargs: Any) -> None:
        sp = self.speculator
        as_key = sp.recorded_as(key, start, finish) if sp is not None else key
        if as_key is not None:
            self.recording.transition(as_key, start, finish, kwargs)

    def _speculation_transition(
        self, key: Key, start: str, finish: str, kwargs: dict[str, Any]
    ) -> bool:
        """Tell the speculation driver; False for a copy, or a task standing in for its
        winning copy (nothing to learn from those)."""
        sp = self.speculator
        assert sp is not None
        try:
            learn = not (sp.is_copy(key) or sp.is_alias(key))
            sp.transition(key, start, finish, kwargs)
            return learn
        except Exception:
            self.audit.failed("speculation", key)
            return True

    @guarded("transition", key_arg=0)
    def _task_transition(
        self, key: Key, start: str, finish: str, kwargs: dict[str, Any], learn: bool
    ) -> None:
        if learn and start == "processing" and finish == "memory":
            v = self.ranker.tasks.get(key)
            seconds = compute_seconds(kwargs.get("startstops", ()))
            if v is not None and seconds is not None:
                self.ranker.estimator.observe(v.stage, seconds)
                self.speeds.learn(v, kwargs.get("worker"), seconds)
        if self.gate is not None:
            self.gate.transition(key, start, finish)
        if finish == "forgotten":
            self.ranker.forget(key)

    # -- worker hooks: O(1), guarded ------------------------------------------------------
    @guarded("record", key_arg=1)
    def add_worker(self, scheduler: Any, worker: str) -> None:
        self.recording.worker_added(scheduler.workers.get(worker))

    def remove_worker(self, scheduler: Any, worker: str, *, stimulus_id: str, **kw: Any) -> None:
        self._speeds_worker_removed(worker)
        if self.speculator is not None:
            self._speculation_worker_removed(worker)
        if self.preemptor is not None:
            self._preemption_worker_removed(worker)
        if self.placer is not None:
            self._resources_worker_removed(worker)
        self._record_worker_removed(worker, stimulus_id)

    @guarded("speeds", key_arg=0)
    def _speeds_worker_removed(self, worker: str) -> None:
        self.speeds.forget(worker)

    @guarded("speculation", key_arg=0)
    def _speculation_worker_removed(self, worker: str) -> None:
        assert self.speculator is not None
        self.speculator.worker_removed(worker)

    @guarded("preemption", key_arg=0)
    def _preemption_worker_removed(self, worker: str) -> None:
        assert self.preemptor is not None
        self.preemptor.worker_removed(worker)

    @guarded("resources", key_arg=0)
    def _resources_worker_removed(self, worker: str) -> None:
        assert self.placer is not None
        self.placer.worker_removed(worker)

    @guarded("record", key_arg=0)
    def _record_worker_removed(self, worker: str, stimulus_id: str) -> None:
        self.recording.worker_removed(worker, stimulus_id)

    # -- explain and status (daskjobs.plugin.explain) ---------------------------------
    def explain(self, key: Key) -> dict[str, Any]:
        """Why ``key`` waits, or where it ran: estimate, priority, team, place in queue."""
        return _explain.explain(self, key)

    def teams(self) -> list[dict[str, Any]]:
        """Per team: target share, decayed usage, running slots, queued, quota."""
        return _explain.teams(self)

    def status(self) -> dict[str, Any]:
        return _explain.status(self)

    def worker_speeds(self) -> list[dict[str, Any]]:
        """Per worker: believed slow-down (1.0 nominal) and the attempts it rests on."""
        return self.speeds.rows()

    def worker_speeds_by_address(self) -> dict[str, float]:
        learner = self.speeds.learner
        return {a: learner.speed(n) for a, n in self.speeds.nodes.items()}

    # -- RPC handlers -----------------------------------------------------------------
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

    async def _rpc_record(self, action: str = "status", path: Any = None) -> dict[str, Any]:
        if not self._registered():
            return _REMOVED
        recording = self.recording
        if action == "start":
            if not path:
                raise ValueError("daskjobs.record: give the path of the trace file to write")
            rec = await recording.start(str(path), by_client=True)
            return {"recording": True, **rec.stats()}
        if action == "stop":
            if recording.recorder is not None and not recording.by_client:
                raise PermissionError(
                    f"daskjobs: the recording to {recording.recorder.path!r} is the "
                    "operator's (daskjobs.record); a client cannot stop it"
                )
            return {"recording": False, "stats": await recording.stop()}
        if action == "status":
            cur = recording.recorder
            return {"recording": cur is not None, "stats": cur.stats() if cur else None}
        raise ValueError(f"daskjobs_record: unknown action {action!r} (start, stop, status)")
