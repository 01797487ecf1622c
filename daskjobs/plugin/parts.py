"""The plugin's parts: one concern each, behind one protocol, composed from the settings.

:class:`~daskjobs.plugin.JobsPlugin` receives dask's hooks and runs each over its parts
in order (:func:`compose` makes the list), every call under one guard: an exception is
logged at WARNING with the key, counted under the part's ``name`` in ``plugin.errors``
and swallowed, and the next part runs. A part implements only the hooks it needs (the
plugin loops only over the parts that override a hook, so a transition costs one call
per interested part):

====================  ===============================================================
``start``             the plugin starts on a scheduler (async)
``check_graph``       a new graph (``new``, and ``graph``: who sent it), before
                      ranking: may refuse it (the client's error)
``graph(new)``        the same graph, once ranked
``transition(step)``  a task changed state (:class:`Step`; O(1) each)
``wants(start, end)`` whether ``transition`` acts on that pair (asked once per pair)
``worker_added``      a worker joined (its ``WorkerState``)
``worker_removed``    a worker left (its address)
``report(r)``         the plugin's worker plugin reported (:class:`Report`)
``report_delay()``    how late start reports may come for this part (None: not needed)
``status()``          the part's entries of ``status``
``explain(key)``      the part's entries of ``explain(key)``
``close``             the plugin stops (async)
====================  ===============================================================

Order: the admission limits first (:mod:`daskjobs.plugin.admission`: a graph over one is
refused before any other part looks at it); then each graph's team is decided before any other
check (:class:`~daskjobs.plugin.identity.IdentityPart`, after recording, acts on nothing else).
The transition order is the list's: recording (it tells a trace the transition before
speculation settles anything), then speculation (which marks a copy's or an alias's end as
nothing to learn from: :attr:`Step.learn`), preemption, resources, the learner, the release
gate, and ranking last (it forgets a forgotten task). The scheduler's forecast
(:mod:`daskjobs.plugin.observe.live_forecast`) is a part of no hook:
it starts and stops with the rest.
Where one part's answer feeds another, the link is made here, once: speculation tells
recording which task a copy's start belongs to; recording asks speculation under which
key a transition is recorded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from daskjobs.plugin.audit import Audit
from daskjobs.plugin.periodic import every
from daskjobs.plugin.ranking import PENDING
from daskjobs.plugin.surgery import _internals as dask_internals
from daskjobs.plugin.workers.inventory import INVENTORY_NAME, INVENTORY_TOPIC, inventory_bytes
from daskjobs.plugin.workers.worker import (
    REORDER_OP,
    REORDER_TOPIC,
    REORDERER_NAME,
    REPORTER_NAME,
    RETURNED_TOPIC,
    STARTED_TOPIC,
    reorderer_bytes,
    reporter_bytes,
)
from daskjobs.tasks import CHECKPOINT_TOPIC

if TYPE_CHECKING:
    from dask.typing import Key

    from daskjobs.config import Settings
    from daskjobs.plugin.admission import AdmissionPart
    from daskjobs.plugin.enact.gangs import Placer
    from daskjobs.plugin.enact.preemption import Preemptor
    from daskjobs.plugin.enact.speculation import Speculator
    from daskjobs.plugin.identity import ClientTeams
    from daskjobs.plugin.observe.recording import Recording
    from daskjobs.plugin.ranking import Ranker
    from daskjobs.plugin.release import ReleaseGate
    from daskjobs.plugin.speeds import WorkerSpeeds

__all__ = [
    "WORKER_TOPICS",
    "Composed",
    "Part",
    "Report",
    "Reporters",
    "Step",
    "Transitions",
    "compose",
    "run_reports",
]

logger = logging.getLogger("daskjobs.plugin")

#: The sources of an estimate a task's end is scored against (its stage's model gave it).
_MODELLED = frozenset({"model", "history"})

#: The topics of the plugin's worker plugins, read from the workers' own streams.
WORKER_TOPICS = (STARTED_TOPIC, RETURNED_TOPIC, CHECKPOINT_TOPIC, INVENTORY_TOPIC, REORDER_TOPIC)


@dataclass(slots=True)
class Step:
    """One transition, as the parts see it in turn. ``learn``: does its end teach the
    estimates and speeds (False for a backup copy or a task standing in for its copy)."""

    key: Key
    start: str
    finish: str
    kwargs: dict[str, Any]
    learn: bool = True


@dataclass(slots=True)
class Report:
    """One report of the plugin's worker plugins: a task's start (``age`` seconds ago if
    delayed), its thread's return, a checkpoint, or (``key`` None) a worker's inventory."""

    worker: str
    topic: str
    key: Any
    msg: dict[str, Any]
    age: float = 0.0

    @property
    def when(self) -> float:
        """The time the worker gave, else now."""
        t = self.msg.get("time")
        return float(t) if isinstance(t, int | float) else time.time()


def _reports(worker: str, topic: str, msg: dict[str, Any], audit: Audit) -> Iterator[Report]:
    if topic in (INVENTORY_TOPIC, REORDER_TOPIC):
        yield Report(worker, topic, None, msg)
        return
    starts = msg.get("starts") if topic == STARTED_TOPIC else None
    if starts is None:
        if msg.get("key") is not None:
            yield Report(worker, topic, msg["key"], msg)
        return
    for row in starts:  # a delayed report: [key, run_id, worker time, age] each
        try:
            key, run_id, when, age = row
            age = float(age)
        except (TypeError, ValueError):
            audit.failed("worker-report")  # the others in it still count
            continue
        if key is not None:
            yield Report(worker, topic, key, {"key": key, "run_id": run_id, "time": when}, age)


def run_reports(
    parts: Sequence[Part], audit: Audit, worker: str, topic: str, msg: dict[str, Any]
) -> None:
    """Hand each report in a worker plugin's message to the parts that read reports."""
    for r in _reports(worker, topic, msg, audit):
        for part in parts:
            try:
                part.report(r)
            except Exception:
                audit.failed(part.name, r.key)


class Part:
    """One concern of the plugin (module docstring); every hook optional."""

    #: Where its exceptions are counted (``plugin.errors``).
    name = "part"
    #: What its ``check_graph`` raises about the client's own input: the submission fails
    #: with it (any other exception is counted and swallowed, as in every hook).
    refusals: tuple[type[Exception], ...] = ()

    async def start(self, scheduler: Any) -> None:
        """The plugin starts on ``scheduler``."""

    def check_graph(self, new: list[Any], graph: Any = None) -> None:
        """A new graph's tasks, before ranking (``graph``: the graph as dask gave it, with
        its client); raising a ``ValueError`` of the client's input refuses the
        submission."""

    def graph(self, new: list[Any]) -> None:
        """A new graph's tasks, ranked."""

    def update_graph(self, client: str | None, keys: Any) -> None:
        """A client's graph wants ``keys`` (dask's ``update_graph``, after ranking)."""

    def transition(self, step: Step) -> None:
        """A task changed state."""

    def wants(self, start: str, finish: str) -> bool:
        """Does :meth:`transition` act on a transition from ``start`` to ``finish``? The
        plugin asks once per pair and calls the part only for those (a transition costs
        nothing for a part that ignores it). Answer for the part's whole life."""
        return True

    def worker_added(self, ws: Any) -> None:
        """A worker joined."""

    def worker_removed(self, worker: str, stimulus_id: str) -> None:
        """The worker at ``worker`` left."""

    def report(self, r: Report) -> None:
        """A report of the plugin's worker plugins."""

    def report_delay(self) -> float | None:
        """How late start reports may come for this part; None if it reads none."""
        return None

    def status(self) -> dict[str, Any]:
        """This part's entries of ``status()``."""
        return {}

    def explain(self, key: Key) -> dict[str, Any]:
        """This part's entries of ``explain(key)``."""
        return {}

    async def close(self) -> None:
        """The plugin stops."""


#: The hooks the plugin runs over the parts that implement them.
HOOKS = (
    "check_graph",
    "graph",
    "update_graph",
    "transition",
    "worker_added",
    "worker_removed",
)


def overrides(part: Part, hook: str) -> bool:
    """Does ``part`` implement ``hook`` (not the protocol's no-op)?"""
    return getattr(type(part), hook) is not getattr(Part, hook)


class Transitions:
    """dask's ``transition`` hook over the parts that implement it, each called only for
    the pairs (start, finish) it :meth:`~Part.wants` (asked once per pair, in order).
    :meth:`add` and :meth:`remove` take in or let go a part that joins later (the
    dashboard's queue clock)."""

    def __init__(self, parts: Sequence[Part], audit: Audit) -> None:
        self.parts = list(parts)
        self.audit = audit
        self._pairs: dict[tuple[str, str], list[Part]] = {}  # {(start, finish): parts}

    def add(self, part: Any) -> None:
        """``part`` (``name``, ``wants`` and ``transition`` of a :class:`Part`) is told
        of transitions from now on, after the others."""
        if part not in self.parts:
            self.parts.append(part)
            self._pairs = {}

    def remove(self, part: Any) -> None:
        if part in self.parts:
            self.parts.remove(part)
            self._pairs = {}

    def hook(self, key: Key, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        """dask's ``SchedulerPlugin.transition`` (the plugin's, bound to this)."""
        parts = self._pairs.get((start, finish))
        if parts is None:  # a pair not seen yet
            parts = self._pairs[start, finish] = self._wanting(start, finish)
        if not parts:
            return
        step = Step(key, start, finish, kwargs)
        for part in parts:
            try:
                part.transition(step)
            except Exception:
                self.audit.failed(part.name, key)

    def _wanting(self, start: str, finish: str) -> list[Part]:
        out = []
        for part in self.parts:
            try:
                wanted = part.wants(start, finish)
            except Exception:
                self.audit.failed(part.name)
                wanted = True  # called at every such transition, as if it had not said
            if wanted:
                out.append(part)
        return out


# -- the parts --------------------------------------------------------------------------------


class RecordingPart(Part):
    """The trace of a run (:mod:`daskjobs.plugin.observe.recording`)."""

    name = "record"

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        #: the key a transition is recorded under (speculation's rule), or None
        self.recorded_as: Callable[[Key, str, str], Key | None] = lambda key, start, finish: key
        self.starts_mapped = False  # speculation tells the starts (which task a copy's is)

    def graph(self, new: list[Any]) -> None:
        if self.recording.recorder is not None:
            self.recording.graph(new)

    def wants(self, start: str, finish: str) -> bool:
        return start == "processing" or finish == "processing"

    def transition(self, step: Step) -> None:
        if self.recording.recorder is None or "processing" not in (step.start, step.finish):
            return
        as_key = self.recorded_as(step.key, step.start, step.finish)
        if as_key is not None:
            self.recording.transition(as_key, step.start, step.finish, step.kwargs)

    def worker_added(self, ws: Any) -> None:
        self.recording.worker_added(ws)

    def worker_removed(self, worker: str, stimulus_id: str) -> None:
        self.recording.worker_removed(worker, stimulus_id)

    def report(self, r: Report) -> None:
        if r.topic == STARTED_TOPIC and not self.starts_mapped:
            self.recording.started(r.key, r.worker, r.msg)
        elif r.topic == CHECKPOINT_TOPIC:
            self.checkpoint(r)

    def started(self, key: Key, r: Report) -> None:
        """A start speculation mapped to its task (``key``)."""
        self.recording.started(key, r.worker, r.msg)

    def checkpoint(self, r: Report) -> None:
        """A task's checkpoint, into the trace only (not the audit log: one a step):
        replay estimates the checkpoint interval from them."""
        rec = self.recording.recorder
        if rec is not None:
            event = {"action": "checkpoint", "key": str(r.key), "worker": r.worker}
            rec.emit({"type": "event", "time": r.when, "event": event})

    def report_delay(self) -> float | None:
        return 0.0 if self.recording.recorder is not None else None

    def status(self) -> dict[str, Any]:
        rec = self.recording.recorder
        return {"recording": rec.stats() if rec is not None else None}

    async def close(self) -> None:
        await self.recording.stop()


class SpeculationPart(Part):
    """Backup copies of late tasks (:mod:`daskjobs.plugin.enact.speculation`)."""

    name = "speculation"

    def __init__(self, speculator: Speculator, audit: Audit, recording: RecordingPart) -> None:
        self.speculator = speculator
        self.audit = audit
        self.recording = recording
        recording.recorded_as = speculator.recorded_as
        recording.starts_mapped = True
        recording.recording.is_copy = speculator.is_copy

    async def start(self, scheduler: Any) -> None:
        sp = self.speculator
        dask_internals.ensure_client(scheduler, dask_internals.COPIES_CLIENT)
        sp.start(scheduler)
        self.audit.event(
            "speculation", late_factor=sp.spec.late_factor, max_fraction=sp.spec.max_fraction
        )

    def wants(self, start: str, finish: str) -> bool:
        return start != finish  # (dask's waiting -> waiting: nothing moved)

    def transition(self, step: Step) -> None:
        sp = self.speculator
        if step.start == "processing":  # an end: does it teach (read before it settles)
            key = step.key
            learn = not (sp.is_copy(key) or sp.is_alias(key))
            sp.transition(key, step.start, step.finish, step.kwargs)
            step.learn = learn
        else:
            sp.transition(step.key, step.start, step.finish, step.kwargs)

    def report(self, r: Report) -> None:
        if r.topic == STARTED_TOPIC:
            started_as = self.speculator.started(r.key, r.worker, r.msg.get("run_id"), r.age)
            if started_as is not None:
                self.recording.started(started_as, r)
        elif r.topic == RETURNED_TOPIC:
            self.speculator.returned(r.key, r.worker)

    def worker_removed(self, worker: str, stimulus_id: str) -> None:
        self.speculator.worker_removed(worker)

    def report_delay(self) -> float | None:
        # within half of min-runtime (no task is judged late sooner) and one check interval
        spec = self.speculator.spec
        return min(spec.min_runtime / 2, spec.interval)

    def status(self) -> dict[str, Any]:
        return {"speculation": self.speculator.stats()}

    def explain(self, key: Key) -> dict[str, Any]:
        reason = self.speculator.reasons.get(key)  # recorded when it decided
        return {"copy": reason} if reason is not None else {}

    async def close(self) -> None:
        self.speculator.close()


class PreemptionPart(Part):
    """Preemption of best-effort work for interactive work
    (:mod:`daskjobs.plugin.enact.preemption`)."""

    name = "preemption"

    def __init__(self, preemptor: Preemptor, describe: dict[str, Any], audit: Audit) -> None:
        self.preemptor = preemptor
        self.describe = describe
        self.audit = audit

    async def start(self, scheduler: Any) -> None:
        self.preemptor.start(scheduler)
        self.audit.event("preemption", **self.describe)

    def transition(self, step: Step) -> None:
        stimulus = step.kwargs.get("stimulus_id") or ""
        self.preemptor.transition(step.key, step.start, step.finish, stimulus)

    def report(self, r: Report) -> None:
        if r.topic == STARTED_TOPIC:
            self.preemptor.started(r.key, r.worker, r.msg.get("run_id"), r.when)
        elif r.topic == CHECKPOINT_TOPIC:
            self.preemptor.checkpointed(r.key, r.when)

    def worker_removed(self, worker: str, stimulus_id: str) -> None:
        self.preemptor.worker_removed(worker)

    def report_delay(self) -> float | None:
        return 0.0

    def status(self) -> dict[str, Any]:
        return {"preemption": self.preemptor.status()}

    def explain(self, key: Key) -> dict[str, Any]:
        why = self.preemptor.why(key)  # the decision's own reason (placed, held, ...)
        return {"preemption": why} if why is not None else {}

    async def close(self) -> None:
        self.preemptor.close()


class ResourcesPart(Part):
    """Resources and gangs (:mod:`daskjobs.plugin.enact.gangs`); with preemption on, the placer
    enacts it too (it places every resource task)."""

    name = "resources"

    def __init__(
        self, placer: Placer, ranker: Ranker, audit: Audit, preemption: dict[str, Any] | None
    ) -> None:
        self.placer = placer
        self.ranker = ranker
        self.audit = audit
        self.preemption = preemption  # its description, when the placer enacts it
        self._placed: list[Any] = []
        from daskjobs.plugin.enact.gangs import ResourceRequestError

        self.refusals = (ResourceRequestError,)

    async def start(self, scheduler: Any) -> None:
        self.placer.start(scheduler)
        if not dask_internals.has_worker_plugin(scheduler, INVENTORY_NAME):
            try:  # each worker's inventory (the placer needs it)
                await dask_internals.install_worker_plugin(
                    scheduler, INVENTORY_NAME, inventory_bytes()
                )
            except Exception:
                self.audit.failed("inventory-install")
        self.audit.event("resources", **self.placer.policy.describe())
        if self.preemption is not None:
            self.audit.event("preemption", **self.preemption)

    def check_graph(self, new: list[Any], graph: Any = None) -> None:
        """A malformed or impossible request fails the submission, naming it (as a bad
        estimate does), and leaves nothing behind."""
        self._placed = []
        try:
            self._placed = self.placer.check(new)
        except self.refusals as e:  # the plugin errs the graph's tasks with it
            self.audit.event("rejected-graph", error=str(e), tasks=len(new))
            raise

    def graph(self, new: list[Any]) -> None:
        placed, self._placed = self._placed, []
        if placed:
            self.placer.admit(placed)

    def transition(self, step: Step) -> None:
        stimulus = step.kwargs.get("stimulus_id") or ""
        self.placer.transition(step.key, step.start, step.finish, stimulus)

    def report(self, r: Report) -> None:
        if r.topic == INVENTORY_TOPIC:
            self.placer.inventory_report(r.worker, r.msg)
        elif r.topic == STARTED_TOPIC:
            self.placer.started(r.key, r.when)
        elif r.topic == CHECKPOINT_TOPIC:
            self.placer.checkpointed(r.key, r.when)

    def worker_removed(self, worker: str, stimulus_id: str) -> None:
        self.placer.worker_removed(worker)

    def report_delay(self) -> float | None:
        return 0.0  # true starts; a gang's stop signal

    def status(self) -> dict[str, Any]:
        out = {"resources": self.placer.status()}
        if self.placer.preemption is not None:  # the one enactor's schema, as without resources
            out["preemption"] = self.placer.preemption.status()
        return out

    def explain(self, key: Key) -> dict[str, Any]:
        why = self.placer.why(key)  # the preemption decision's reason, as the placer enacts it
        return {"preemption": why} if why is not None else {}

    async def close(self) -> None:
        self.placer.close()


def _write_history(job: Any) -> str:
    """Write one save of the history file (in a thread): "ok", "busy" (another scheduler
    held the file's lock), "newer" (a newer daskjobs wrote it) or "failed: <why>"."""
    from daskjobs import history

    try:
        return "ok" if job.write() else "busy"
    except history.NewerHistory as e:
        logger.debug("daskjobs: %s", e)
        return "newer"
    except OSError as e:
        return f"failed: {type(e).__name__}: {e}"


class LearningPart(Part):
    """Estimates and worker speeds learnt from finished attempts; the history file; the
    worker plugin that takes a re-ranked stage's new priorities on the workers
    (:class:`~daskjobs.plugin.workers.worker.Reorderer`, installed while the ranker re-ranks)."""

    name = "learning"

    def __init__(self, ranker: Ranker, speeds: WorkerSpeeds, audit: Audit) -> None:
        self.ranker = ranker
        self.speeds = speeds
        self.audit = audit
        self._pc: Any = None
        self._saving = False  # a save of the history file runs (in a thread)
        self._warned = False  # a save failed and said so
        # who else keeps sums of estimates: told of each re-estimated batch
        # ((old view, new view, dask state) each)
        self.reestimated: list[Callable[[list[tuple[Any, Any, str]]], None]] = []

    async def start(self, scheduler: Any) -> None:
        ranker = self.ranker
        if ranker.reranks:
            ranker.reorder_op = REORDER_OP
            try:  # installed anew: each worker tells this plugin it takes the message
                await dask_internals.install_worker_plugin(
                    scheduler, REORDERER_NAME, reorderer_bytes()
                )
            except Exception:
                self.audit.failed("reorderer-install")
        if ranker.estimator.path:
            self._pc = every(scheduler, "daskjobs-history", 30.0, self.save)

    def wants(self, start: str, finish: str) -> bool:
        return start == "processing" and finish == "memory"

    def transition(self, step: Step) -> None:
        if step.learn:  # (processing -> memory: what it wants)
            ranker = self.ranker
            v = ranker.current(step.key)  # its estimate as the re-ranks left it
            if v is None:
                return
            kwargs = step.kwargs
            seconds = dask_internals.compute_seconds(kwargs.get("startstops", ()))
            if seconds is not None:
                # scored against the estimate the scheduler acted on, when the stage's model
                # (or median) gave it: O(1), where asking the model again costs a prediction
                if v.source in _MODELLED:
                    ranker.estimator.observe(v.stage, v.params, seconds, predicted=v.estimate)
                else:
                    ranker.estimator.observe(v.stage, v.params, seconds, score=False)
                self.speeds.learn(v, kwargs.get("worker"), seconds)
                changed = ranker.reestimate(v.stage, step.key)  # at the model's cadence
                if changed:
                    for tell in self.reestimated:
                        tell(changed)

    def report(self, r: Report) -> None:
        if r.topic == REORDER_TOPIC:
            self.ranker.settle()  # which workers take new priorities changes
            if r.msg.get("ready") is True:
                self.ranker.reorders.add(r.worker)
            else:
                self.ranker.reorders.discard(r.worker)

    def worker_added(self, ws: Any) -> None:
        self.ranker.settle()  # it takes no new priorities until it says so

    def worker_removed(self, worker: str, stimulus_id: str) -> None:
        self.ranker.settle()
        self.speeds.forget(worker)
        self.ranker.reorders.discard(worker)

    async def save(self) -> None:
        """Merge the observations made since the last save into the history file
        (:mod:`daskjobs.history`), in a thread: the file's lock, read and write never hold
        the event loop. One save at a time; a file that cannot be written is a warning
        once (the measurements stay in memory), one of a newer daskjobs stops the saves."""
        if self._saving:
            return
        est = self.ranker.estimator
        try:
            job = est.pending()
        except Exception:
            self.audit.failed("save-history")
            return
        if job is None:
            return
        self._saving = True
        try:
            try:
                outcome = await asyncio.to_thread(_write_history, job)
            except RuntimeError as e:
                # a script's cluster closed as the interpreter exits: no new threads then,
                # and nothing else waits on the loop; written here, not lost
                if "after shutdown" not in str(e) and "interpreter shutdown" not in str(e):
                    raise
                outcome = _write_history(job)
        except Exception:
            outcome = "failed"
            self.audit.failed("save-history")
        finally:
            self._saving = False
        est.saved(job, outcome == "ok")
        if outcome == "newer":
            est.path = None  # a newer daskjobs owns the file: never overwrite it
        if outcome not in ("ok", "busy") and not self._warned:
            self._warned = True
            logger.warning(
                "daskjobs: could not save measured durations to %s (%s); they are kept "
                "in memory (daskjobs.history.path names the file)",
                job.path,
                "a newer daskjobs wrote it" if outcome == "newer" else outcome,
            )

    async def close(self) -> None:
        await self.save()
        ranker = self.ranker
        sched = self.speeds.scheduler
        if ranker.reorder_op and sched is not None:
            ranker.reorders.clear()  # no message from here on, before the handlers go
            ranker.reorder_op = ""
            # a scheduler that is closing takes its workers with it (a batch system may be
            # cancelling their jobs now): asking each to drop the reorderer then only logs
            # failed broadcasts
            try:
                if not dask_internals.closing(sched) and dask_internals.has_worker_plugin(
                    sched, REORDERER_NAME
                ):
                    await dask_internals.remove_worker_plugin(sched, REORDERER_NAME)
            except Exception:
                logger.debug("daskjobs: removing the reorderer failed", exc_info=True)
        pc, self._pc = self._pc, None
        if pc is not None:
            pc.stop()


class GatePart(Part):
    """The release gate (:mod:`daskjobs.plugin.release`), under a policy that pops."""

    name = "release"

    def __init__(self, gate: ReleaseGate) -> None:
        self.gate = gate

    def graph(self, new: list[Any]) -> None:
        self.gate.first_wave(new)

    def wants(self, start: str, finish: str) -> bool:
        # a task on its way to dask's queue (released -> waiting -> waiting) changes
        # nothing the gate keeps, and frees or fills no slot (its next step does)
        # (nor does a finished task's result that is released or forgotten)
        return not ((finish == "waiting" and start in ("released", "waiting")) or start == "memory")

    def transition(self, step: Step) -> None:
        self.gate.transition(step.key, step.start, step.finish)


class RankingPart(Part):
    """The ranked tasks' views: a forgotten task is forgotten by the policy too."""

    name = "ranking"

    def __init__(self, ranker: Ranker) -> None:
        self.ranker = ranker

    def wants(self, start: str, finish: str) -> bool:
        # a task that goes on waiting (waiting -> queued -> processing) stays in the set it
        # entered on leaving "released" (where a new task starts)
        return finish == "forgotten" or (
            self.ranker.reranks
            and not (start in PENDING and start != "released" and finish in PENDING)
        )

    def transition(self, step: Step) -> None:
        if step.finish == "forgotten":  # (it leaves the waiting set with its view)
            self.ranker.forget(step.key)
        else:
            self.ranker.track(step.key, step.finish, step.start)


class SharePart(Part):
    """Tasks another team's graph brought and this graph wants too (a shared stage): their
    cores are split among the teams that want them (docs/how-to/load-the-plugin.md). O(keys of the
    graph)."""

    name = "share"

    def __init__(self, ranker: Ranker, gate: ReleaseGate | None, audit: Audit) -> None:
        self.ranker = ranker
        self.gate = gate
        self.audit = audit

    def update_graph(self, client: str | None, keys: Any) -> None:
        grown = self.ranker.share(client, keys)
        if not grown:
            return
        if self.gate is not None:
            for v in grown:
                self.gate.reshare(v)
        teams = sorted({t for v in grown for t in v.teams})  # one event a graph
        self.audit.event("shared", tasks=len(grown), first=str(grown[0].tid), teams=teams)


# -- composing the parts from the settings ---------------------------------------------------


class Composed(NamedTuple):
    """The parts in order, and the drivers among them (None when off)."""

    parts: list[Part]
    speculator: Speculator | None
    preemptor: Preemptor | None
    placer: Placer | None
    identities: ClientTeams
    admission: AdmissionPart


def compose(
    settings: Settings,
    audit: Audit,
    ranker: Ranker,
    speeds: WorkerSpeeds,
    recording: Recording,
    gate: ReleaseGate | None,
) -> Composed:
    """The parts the settings switch on, in the order of the module docstring."""
    from daskjobs.plugin.admission import AdmissionPart
    from daskjobs.plugin.identity import ClientTeams, IdentityPart

    # always there: a client's plugin takes the operator's limits at start (the trust model)
    admission = AdmissionPart(settings.admission, audit)
    identities = ClientTeams(settings.teams, audit)
    recorder = RecordingPart(recording)
    parts: list[Part] = [admission, recorder, IdentityPart(identities, ranker)]
    speculator = preemptor = placer = None
    if settings.speculation.enabled:
        from daskjobs.plugin.enact.speculation import Speculator

        speculator = Speculator(settings.speculation.policy(), audit, ranker.tasks, speeds)
        parts.append(SpeculationPart(speculator, audit, recorder))
    pr, rs = settings.preemption, settings.resources
    described = None
    if pr.enabled:
        from daskjobs.policies.preemption import make_preemption_policy, preemption_options

        # the object the job-level simulator runs, with the operator's settings
        preemption = make_preemption_policy(pr.policy, **preemption_options(pr))
        ranker.te_first = preemption.te_first
        described = preemption.describe()
        if not rs.enabled:
            from daskjobs.plugin.enact.preemption import Preemptor

            preemptor = Preemptor(
                preemption, pr.resource, pr.grace, pr.interval, audit, ranker.tasks
            )
            parts.append(PreemptionPart(preemptor, described, audit))
    if rs.enabled:  # with both on, the placer enacts preemption too
        from daskjobs.plugin.enact.gangs import Placer
        from daskjobs.plugin.enact.preemption import Enactor
        from daskjobs.policies.resources import GangPolicy

        placer = Placer(
            GangPolicy(reservation=rs.reservation),
            refuse_unsatisfiable=rs.refuse_unsatisfiable,
            interval=rs.interval,
            audit=audit,
            tasks=ranker.tasks,
            preemption=Enactor(preemption, pr.resource, pr.grace, audit) if pr.enabled else None,
        )
        parts.append(ResourcesPart(placer, ranker, audit, described))
    learning = LearningPart(ranker, speeds, audit)
    # these parts read the views of waiting tasks as their estimates change
    ranker.lazy = speculator is None and preemptor is None and placer is None
    if speculator is not None:  # its horizon sums count the queued tasks' estimates
        learning.reestimated.append(speculator.reestimated)
    parts.append(learning)
    if gate is not None:
        parts.append(GatePart(gate))
    parts.append(RankingPart(ranker))
    if ranker.fair is not None:  # who pays for a shared stage: what the per-team accounts answer
        parts.append(SharePart(ranker, gate, audit))
    if settings.forecast.interval is not None:  # each team's expected end, for the pages
        from daskjobs.plugin.observe.live_forecast import ForecastPart

        parts.append(ForecastPart(audit))
    return Composed(parts, speculator, preemptor, placer, identities, admission)


# -- the start reporter ----------------------------------------------------------------------


@dataclass
class Reporters:
    """The worker plugin that reports true starts: installed with the delay the parts
    allow now (the least of their ``report_delay``), installed again when that changes,
    removed when no part reads starts."""

    parts: Sequence[Part]
    audit: Audit
    scheduler: Any = None
    delay: float | None = None  # the installed reporter's

    def wanted(self) -> float | None:
        delays = [d for p in self.parts if (d := p.report_delay()) is not None]
        return min(delays) if delays else None

    async def refresh(self) -> None:
        sched = self.scheduler
        if sched is None:
            return
        delay = self.wanted()
        installed = dask_internals.has_worker_plugin(sched, REPORTER_NAME)
        if delay is None:
            if installed:
                try:
                    await dask_internals.remove_worker_plugin(sched, REPORTER_NAME)
                except Exception:
                    logger.debug("daskjobs: removing the start reporter failed", exc_info=True)
            return
        if installed and delay == self.delay:
            return
        try:
            await dask_internals.install_worker_plugin(sched, REPORTER_NAME, reporter_bytes(delay))
            self.delay = delay
        except Exception:
            self.audit.failed("reporter-install")
