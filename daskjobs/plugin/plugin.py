"""The daskjobs scheduler plugin: dask's scheduler, steered by the shared policy core.

``JobsPlugin`` makes one decision of its own, each new graph's ``TaskState.priority`` from the
policy (:mod:`~daskjobs.plugin.ranking`, before anything is dispatched), and runs every other hook
of dask's over its *parts* (:mod:`daskjobs.plugin.parts`: the admission limits, the trace,
speculation, preemption, resources and gangs, learning, the release gate, shared stages; one
concern each, behind one protocol, every call under one guard), composed from the settings and what
the policy declares it does (:attr:`~daskjobs.policies.Policy.capabilities`). ``explain``,
``status``, the dashboard page and the metrics read it through a read-only view (``plugin.view``,
:mod:`~daskjobs.plugin.observe.explain`). Every private piece of distributed the parts touch is a
verb of :mod:`daskjobs.plugin.surgery._internals`, checked at start.

Safety: the plugin runs inside a shared scheduler. An exception in a part's hook is logged at
WARNING with the key, counted in ``plugin.errors`` under the part's name and swallowed; dask
carries on with its own order. Hooks cost O(1) per transition and part; ranking a graph O(n log n)
once per graph. The only errors that reach a client are about its own input (a bad ``estimate``, a
team it may not name, an impossible resource request, a graph over an admission limit). Trust:
docs/how-to/load-the-plugin.md#trust; teams: plugin/identity.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin

from daskjobs.config import Settings, settings, summary
from daskjobs.errors import SubmissionRefused
from daskjobs.plugin import parts as _parts
from daskjobs.plugin.audit import Audit
from daskjobs.plugin.observe.dashboard import install_dashboard, uninstall_dashboard
from daskjobs.plugin.observe.explain import PluginView
from daskjobs.plugin.observe.metrics import install_metrics, uninstall_metrics
from daskjobs.plugin.observe.recording import Recording
from daskjobs.plugin.ranking import Ranker, UnknownTeam
from daskjobs.plugin.release import ReleaseGate
from daskjobs.plugin.speeds import WorkerSpeeds
from daskjobs.plugin.surgery import _internals as dask_internals
from daskjobs.plugin.trust import apply_trust
from daskjobs.plugin.views import LiveAttempt, LiveTask

if TYPE_CHECKING:
    from dask.typing import Key

    from daskjobs.plugin.enact.gangs import Placer
    from daskjobs.plugin.enact.preemption import Preemptor
    from daskjobs.plugin.enact.speculation import Speculator

__all__ = ["JobsPlugin", "LiveAttempt", "LiveTask", "UnknownTeam"]

_REMOVED = {"daskjobs": "removed"}  #: the handlers' answer once unregistered (dask keeps them)


class JobsPlugin(SchedulerPlugin):
    """Estimate-based priorities for dask's scheduler, from the shared policy core.

    Configure through the ``daskjobs`` section of dask's config (``daskjobs.yaml``);
    keywords override it: ``JobsPlugin(policy="lpt", default_estimate="10s")``.

    Load it with ``client.register_plugin(JobsPlugin())``, :func:`daskjobs.local_cluster`
    (``LocalCluster(scheduler_kwargs={"plugins": [JobsPlugin()]})``) or, on a shared
    cluster, ``dask scheduler --preload daskjobs.preload``.
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
        self.events, self.errors = self.audit.events, self.audit.errors
        self.ranker = Ranker(self.settings, self.audit)
        self.tasks: dict[Key, LiveTask] = self.ranker.tasks
        self.speeds = WorkerSpeeds(self.audit, self.ranker.learner, self.ranker.urgent)
        self.gate: ReleaseGate | None = None
        if self.ranker.popper is not None:  # the policy pops slot by slot
            self.gate = ReleaseGate(self.ranker.popper, self.tasks, self.speeds, self.audit)
        self.recording = Recording(self.settings, self.audit, self.tasks)
        made = _parts.compose(
            self.settings, self.audit, self.ranker, self.speeds, self.recording, self.gate
        )
        self.parts: list[_parts.Part] = made.parts
        self.speculator: Speculator | None = made.speculator
        self.preemptor: Preemptor | None = made.preemptor
        self.placer: Placer | None = made.placer
        self.identities = made.identities  # each client's team (plugin/identity.py)
        self.admission = made.admission
        self.admission.registered = self._registered  # it steps aside once unregistered
        self.reporters = _parts.Reporters(self.parts, self.audit)
        self.recording.reporters_changed = self.reporters.refresh
        self.view = PluginView(self)
        self._log_event: tuple[Any, Any, Any] | None = None  # the wrapped stream handler
        self._starting = False
        # per hook, the parts that implement it (a transition calls only those)
        self._hooks = {h: [p for p in self.parts if _parts.overrides(p, h)] for h in _parts.HOOKS}
        self.transitions = _parts.Transitions(self._hooks["transition"], self.audit)
        # dask calls plugin.transition at every transition of every task: the bound method
        # of the parts' loop itself, without a frame of the plugin's in between
        self.transition = self.transitions.hook  # type: ignore[method-assign]

    # -- pickling: only the configuration travels -------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {"overrides": self.overrides}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state["overrides"])  # type: ignore[misc]
        self.from_client = True  # pickled: a client registered it (not the operator's)

    # -- lifecycle --------------------------------------------------------------------
    async def start(self, scheduler: Any) -> None:
        self._starting = True
        try:
            self.settings = apply_trust(self, scheduler, JobsPlugin)
            dask_internals.check_scheduler(scheduler, identities=self.settings.teams.bound)
            self.admission.limits = self.settings.admission  # the scheduler's own
            self.recording.settings = self.identities.settings = self.settings
            self.scheduler = scheduler  # and the objects the parts share, before any await
            for shared in (self.audit, self.recording, self.ranker, self.speeds, self.gate):
                if shared is not None:
                    shared.scheduler = scheduler
            self.reporters.scheduler = scheduler
            dask_internals.wrap_priorities(scheduler, self._new_graph, self.admission.built)
            dask_internals.steal_in_order(scheduler, still=self._registered)  # dask#8992
            for name in ("explain", "status", "record"):
                scheduler.handlers[f"daskjobs_{name}"] = getattr(self, f"_rpc_{name}")
            scheduler.handlers["daskjobs_snapshot"] = self.view.snapshot_async  # in slices
            self._log_event = dask_internals.wrap_stream_handler(
                scheduler, "log-event", self._log_event_from_worker
            )
            s = self.settings
            self.audit.event("started", policy=s.policy, default_estimate=s.default_estimate)
            install_metrics(self, scheduler)  # never raises; a no-op without prometheus_client
            install_dashboard(self, scheduler)  # never raises; a no-op without bokeh
            if s.record:  # keywords of a client's plugin are the client's request: confined
                by_client = self.from_client and "record" in self.overrides
                await self.recording.start(s.record, by_client=by_client)
            for part in self.parts:
                await part.start(scheduler)
            await self.reporters.refresh()
            ledger = getattr(scheduler.plugins.get("daskjobs-jobs"), "ledger_name", None)
            logging.getLogger("daskjobs.plugin").info(summary(s, ledger))  # what it runs with
        finally:
            self._starting = False

    async def close(self) -> None:
        for part in self.parts:
            try:
                await part.close()
            except Exception:
                self.audit.failed(part.name)
        sched = self.scheduler
        if sched is not None:
            dask_internals.unwrap_priorities(sched)
            dask_internals.steal_in_order(sched, False)
            uninstall_metrics(sched, self)
            uninstall_dashboard(sched, self)
            dask_internals.unwrap_stream_handler(sched, self._log_event)
            self._log_event = None

    def _registered(self) -> bool:
        sched = self.scheduler
        return sched is not None and any(p is self for p in sched.plugins.values())

    # -- dask's hooks, over the parts ---------------------------------------------------
    def _new_graph(self, graph: dask_internals.NewGraph) -> bool:
        """A new graph, prioritised by dask: checked by the parts (its team first), ranked,
        told to the parts; False steps aside (unregistered: dask does not call close() then)."""
        if not self._registered():
            uninstall_metrics(self.scheduler, self)
            return False
        new = self.ranker.unranked(graph.tasks)
        try:
            for part in self._hooks["check_graph"]:
                try:
                    part.check_graph(new, graph)
                except part.refusals:
                    raise
                except Exception:
                    self.audit.failed(part.name)
            self.ranker.rank(new)
        except SubmissionRefused as e:  # the client's own input: its new tasks err with it
            self.ranker.refuse(graph.tasks, e)
            return True
        self._each("graph", new)
        return True

    def check_submission(
        self, key: Key, annotations: dict[str, Any], resources: dict[str, float] | None = None
    ) -> None:
        """Raise the :class:`~daskjobs.SubmissionRefused` that a task ``key`` with these
        annotations and resources would be refused with, if any (the jobs service asks
        before it records a job whose every attempt would be refused)."""
        self.ranker.check_one(key, annotations, resources, self.placer)

    def _each(self, hook: str, *args: Any, key: Any = None) -> None:
        for part in self._hooks[hook]:
            try:
                getattr(part, hook)(*args)
            except Exception:
                self.audit.failed(part.name, key)

    def update_graph(self, scheduler: Any, *, client: str = "", tasks: Any = (), **_: Any) -> None:
        self._each("update_graph", client, tasks)

    def add_worker(self, scheduler: Any, worker: str) -> None:
        self._each("worker_added", scheduler.workers.get(worker), key=worker)

    def remove_worker(self, scheduler: Any, worker: str, *, stimulus_id: str, **kw: Any) -> None:
        self._each("worker_removed", worker, stimulus_id, key=worker)

    def _log_event_from_worker(self, worker: str, topic: Any, msg: Any, **kwargs: Any) -> bool:
        """A worker's ``log_event`` arrives on its batched stream with the worker's address
        (which a client cannot claim; a client's arrives as an RPC): the plugin reads its
        worker topics here, before dask publishes them, so a client cannot forge a start
        or a returned thread. False steps aside (the plugin was unregistered)."""
        if topic in _parts.WORKER_TOPICS and isinstance(msg, dict):
            # while start() runs, dask has not added the plugin yet: the reports are ours
            if not (self._starting or self._registered()):
                return False
            try:
                _parts.run_reports(self.parts, self.audit, worker, topic, msg)
            except Exception:
                self.audit.failed("worker-report")
        return True

    # -- what it tells (daskjobs.plugin.observe.explain) -----------------------------------------
    def explain(self, key: Key) -> dict[str, Any]:
        """Why ``key`` waits, or where it ran: estimate, priority, team, place in queue."""
        return self.view.explain(key)

    def status(self) -> dict[str, Any]:
        return self.view.status()

    # -- RPC handlers -----------------------------------------------------------------
    def _rpc_explain(self, key: Any = None) -> dict[str, Any]:
        key = tuple(key) if isinstance(key, list) else key  # lists: msgpack
        return self.explain(key) if self._registered() else _REMOVED

    def _rpc_status(self) -> dict[str, Any]:
        return self.status() if self._registered() else _REMOVED

    async def _rpc_record(self, action: str = "status", path: Any = None) -> dict[str, Any]:
        return (await self.recording.rpc(action, path)) if self._registered() else _REMOVED
