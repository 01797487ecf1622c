"""Ranking each new graph: dask's ``TaskState.priority``, from the policy.

dask runs the runnable task with the lowest ``TaskState.priority`` first: in the
scheduler's queue of root-ish tasks and in each worker's ready heap. Its own
priority is ``(-user_priority, generation, dask.order position)``. The ranker
inserts the policy's rank after the user's priority::

    (-user_priority, rank, generation, dask.order position)

so a user's ``priority=`` still dominates, the policy decides everything else,
and dask's order breaks ties. What the rank is, the policy declares
(:attr:`~daskjobs.policies.Policy.capabilities`): a policy that ranks by a static key
(``pops`` false: a :class:`~daskjobs.policies.HeapPolicy`) gives its ``key``; a policy
that pops slot by slot (fair share, node-aware, a user's) gives its
:meth:`~daskjobs.policies.Policy.hold_key` (the order dask keeps its held tasks in) and
the release gate (:mod:`daskjobs.plugin.release`) promotes what ``pop`` chooses. The
first element is the policy layer's :func:`~daskjobs.policies.order.user_order`
(interactive work ahead of best-effort work of its user priority, under a preemption
policy that says so).

Two more of dask's promises are kept (docs/explanation/dask-promises.md): a graph none of whose
tasks has an estimate (annotated or measured) gets one rank for all its tasks, so it
runs in dask's own order; and every rank is offset by the seconds from the ranker's
start to the first graph of its dask generation (graphs dask counts as submitted
together share it), so a later ``compute``/``persist`` overtakes an earlier one of
the same priority only by as much as the policy's key gains over the seconds between
them: it can never starve it.

Estimates improve as a stage's tasks finish (:mod:`daskjobs.plugin.estimates`: a duration
model per stage over each task's ``params``). At the model's cadence (``Estimator.due``: when
the stage's observations ever made reach 1, 2, 4, ... 512, then every 512) the ranker gives the
stage's tasks without an ``estimate`` annotation that have not started their new estimates and
asks the policy for their keys again (``policy.reestimate`` first, for a key that reads more than
the task), each aged as before; :func:`~daskjobs.plugin.surgery._internals.reprioritize` enacts the
ranks
wherever the tasks wait: in dask's queue, not yet runnable, or on a worker. dask sends a task
with inputs to a worker as soon as it is runnable (only root tasks wait in its queue), so a stage
read from a feature stage sits in the workers' ready heaps before any of it finishes. Each
worker that runs the
plugin's :class:`~daskjobs.plugin.workers.worker.Reorderer` (installed while
re-ranking is on; it says
so once its self-check passed) gets one message with its tasks' new priorities and re-orders its
heaps; a task that started there is skipped. Then the work waiting on those workers is evened
out by its estimates (:func:`~daskjobs.policies.balance.rebalance` decides which waiting tasks
move where; work stealing's request moves them): dask placed the stage next to its inputs
before anything was known of it, and its own stealing sees every task of a stage alike, so
one worker can hold most of the long work while another runs short tasks and idles. Which
tasks wait is kept per stage as tasks move
(O(1) per transition), so a re-rank costs O(tasks of the stage not done), never a scan of all
tasks. Under a policy that pops slot by slot (fair share, node-aware) the policy's own queue
holds the views it was given: new graphs get the learned estimates, waiting tasks are not
re-estimated.

Why on the workers and not by holding the stage on the scheduler until slots free: holding
costs two more transitions per task of every graph with a stage that has no model yet (the
release gate's hold and place), takes dask's placement next to a task's inputs away for those
tasks, and changes what dask does for graphs whose users did not ask for anything; re-ordering a
worker's heap changes only the order of tasks the plugin ranked, costs nothing until a stage
learns, and is what dask's worker already does with a priority: run the lowest first.

A graph is ranked entirely or not at all, right after dask prioritised it and
before anything is dispatched (the plugin wraps ``Scheduler._set_priorities``,
see :mod:`daskjobs.plugin.surgery._internals`). O(n log n) per graph. The only errors
that reach a client are about its own input (a bad ``estimate``, an unknown
team when teams are strict): they fail that submission, naming the task.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from daskjobs.config import Settings, policy_settings
from daskjobs.errors import SubmissionRefused
from daskjobs.plugin.audit import Audit
from daskjobs.plugin.estimates import (
    BadEstimate,
    Estimate,
    check_estimate,
    make_estimator,
    params_of,
    predict_stage,
    predict_stage_seconds,
)
from daskjobs.plugin.features import read
from daskjobs.plugin.surgery import _internals as dask_internals
from daskjobs.plugin.views import LiveTask, stage_of
from daskjobs.policies import FIFO, Policy, TaskView, registry
from daskjobs.policies.balance import Backlog, movable, rebalance
from daskjobs.policies.base import SpeedLearner, TeamAccounts
from daskjobs.policies.durations import RERANK_MIN_SECONDS, SOURCES
from daskjobs.policies.order import user_order

if TYPE_CHECKING:
    from collections.abc import Hashable

    from dask.typing import Key
    from distributed.scheduler import Scheduler

logger = logging.getLogger("daskjobs.plugin")

__all__ = ["Ranker", "UnknownTeam"]


class UnknownTeam(SubmissionRefused):
    """A task's team has no target while teams are strict."""


class BadJobClass(SubmissionRefused):
    """A task's ``job_class`` annotation is neither "te" nor "be"."""


#: The states of a task that waits for a worker (its rank still decides when it runs).
_WAITING = frozenset({"released", "waiting", "queued", "no-worker"})
#: ... or for a thread of the worker dask sent it to (it may have started there: the
#: worker skips a re-ranked task that did).
PENDING = _WAITING | {"processing"}

#: A task's stage, its parameters (None: none usable), the size-like ones among them, and
#: whether it is dask's own plumbing (a dask collection's task: a function of dask's or of the
#: libraries its collections call, or no call at all).
Described = tuple[str, Mapping[str, Any] | None, tuple[str, ...], bool]

#: The estimate sources that give a band (the view's ``band``).
_BANDED = ("model", "history")
#: The annotations of a task without any.
_NO_ANNOTATIONS: Mapping[str, Any] = MappingProxyType({})


def _holds(v: LiveTask, e: Estimate) -> bool:
    """Has view ``v`` estimate ``e`` already (its seconds and band)?"""
    if e.seconds != v.estimate:
        return False
    band = v.band
    if e.source in _BANDED:
        return band is not None and band[0] == e.low and band[1] == e.high
    return band is None


#: The job classes of docs/explanation/preemption.md: trial-and-error (interactive) and best-effort.
JOB_CLASSES = ("te", "be")


def _rank_of(ts: Any) -> Any:
    return ts.priority or ()


def _order_of(ts: Any) -> Any:
    return ts.priority[2]


#: The size of a graph from which its ranking pauses the garbage collector (:meth:`Ranker.rank`).
PAUSE_GC_FROM = 10_000


class _RankFailed(Exception):
    """Ranking a graph failed on ``key``: the graph keeps dask's own order."""

    def __init__(self, key: Key, what: str = "") -> None:
        super().__init__(what or key)
        self.key = key


class _PopperGraphs(FIFO):
    """What the ranking calls ``policy`` while a popper picks (a policy that declares
    ``pops``): it tells the popper of each new graph and of each forgotten task, and
    names it in audit events; its rank is the popper's ``hold_key``."""

    def __init__(self, popper: Policy) -> None:
        super().__init__()
        self.popper = popper
        self.name = popper.name

    def key(self, task: TaskView) -> Any:
        return self.popper.hold_key(task)

    def add_graph(self, tasks: Sequence[TaskView]) -> None:
        self.popper.add_graph(tasks)

    def forget(self, tid: Hashable) -> None:
        self.popper.forget(tid)


class Ranker:
    """The policy the settings name, the task views, and the ranking of new graphs.

    ``made`` is the policy the settings name; ``policy`` ranks (``made`` when it ranks by
    a static key, else the popper's stand-in); ``popper`` is ``made`` when it pops slot by
    slot; ``fair`` is it when it keeps per-team accounts (explain and status report its teams);
    ``learner`` when it learns speeds (the plugin's speed learner then); ``tasks`` maps
    each ranked key to its :class:`~daskjobs.plugin.views.LiveTask`. All from the
    policy's declared capabilities, never its class.
    """

    def __init__(self, settings: Settings, audit: Audit) -> None:
        self.settings = settings
        self.audit = audit
        self.scheduler: Scheduler = None  # type: ignore[assignment]  # set at start
        s = settings
        # The policy comes from the registry, by name, with the settings of its own
        # (policy-options; fair-share's from the teams section): the object the simulator
        # and replay make (docs/how-to/write-a-policy.md).
        made = registry.make(s.policy, **policy_settings(s))
        self.made: Policy = made  # the policy the settings name
        caps = made.capabilities
        self.popper: Policy | None = made if caps.pops else None
        self.fair: TeamAccounts | None = made if caps.team_accounts else None  # type: ignore[assignment]
        self.learner: SpeedLearner | None = made if caps.learns_speeds else None  # type: ignore[assignment]
        # a policy that speculates without learning speeds answers the learner's urgent
        self.urgent = made.urgent if caps.speculates and not caps.learns_speeds else None
        self.policy: Any = _PopperGraphs(made) if caps.pops else made
        if not (caps.pops or callable(getattr(made, "key", None))):
            raise TypeError(
                f"policy {s.policy!r} declares that it does not pop (capabilities.pops is "
                "False) but has no key(task) to rank by: subclass HeapPolicy, or declare pops"
            )
        self.estimator = make_estimator(
            s.default_estimate,
            s.history_samples,
            s.history_path,
            s.learn_estimates,
            s.history_max_stages,
        )
        # read each task's own call for its stage and parameters (estimates.arguments)
        self.arguments = s.learn_estimates and s.estimates_from_arguments
        self.tasks: dict[Key, LiveTask] = {}
        # TE tasks ahead of BE ones: the preemption policy's declaration
        # (PreemptionPolicy.te_first), ordered by the policy layer's user_order
        self.te_first = False
        self.ranked_graphs = 0
        # seconds from the ranker's start to the first graph of each recent dask generation
        self.started = time.time()
        self._ages: dict[Any, float] = {}
        self.ranked_tasks = 0
        self.estimate_sources = dict.fromkeys(SOURCES, 0)
        self.just_ranked: list[Key] = []  # the keys the latest graph brought (for share)
        self.just_ranked_teams: frozenset[str] = frozenset()  # ... and their teams
        self.client_teams: dict[str, frozenset[str]] = {}  # client -> its graphs' teams
        # -- teams from identity (plugin/identity.py): the team of the graph being ranked's
        # tasks without a ``team`` annotation, its client's; None: teams.default
        self.graph_team: str | None = None
        # per stage, its ranked tasks without an ``estimate`` annotation that wait (not
        # assigned to a worker, not done): re-estimated as the stage's model learns, kept
        # in O(1) per transition (track). Only under a policy that ranks by a static key
        # and with learning on (a popper keeps its own queue: module docstring).
        self.reranks = s.learn_estimates and self.popper is None
        self.waiting: dict[str, dict[Key, None]] = {}
        self.reestimated = 0  # tasks given a new estimate and rank so far
        # the workers whose worker plugin takes new priorities of tasks waiting there
        # (they said so: daskjobs.plugin.workers.worker.Reorderer), and the message's name
        self.reorders: set[str] = set()
        self.reorder_op = ""
        self.reranked_on_workers = 0  # re-ranked tasks that waited on a worker
        self.moved = 0  # waiting tasks moved between workers to even out the work
        # Deferred re-ranks (module docstring): per stage, the estimate its waiting tasks
        # would have been given at its latest due re-rank, not given yet because it could
        # not change the order of anything waiting. ``lazy``: no part reads the views of
        # waiting tasks as they change (compose turns it off for speculation's horizon,
        # preemption and gangs); stages some of whose tasks carry ``params``: never
        # deferred (their tasks' estimates differ).
        self.lazy = True
        self.deferred: dict[str, Estimate] = {}
        self.deferrals = 0  # re-ranks deferred so far
        self.short_skips = 0  # re-ranks of stages of very short tasks left out
        self._param_stages: set[str] = set()
        self._refs: tuple[type, ...] | None = None  # dask_internals.references(), once
        # while a graph is ranked: each tuple of dependencies seen, so that the views of
        # tasks that read the same inputs (a map over one input, a sweep's backtests of
        # one feature) share one tuple
        self._deps: dict[tuple[Key, ...], tuple[Key, ...]] | None = None

    def describe(self, ts: Any) -> Described:
        """``(stage, params, grows, own)`` of ``ts``: its ``stage`` and ``params``
        annotations where it has them, else what its own call says
        (:mod:`daskjobs.plugin.features`: the function's identity, its literal arguments,
        the size-like ones among them), else its key prefix and no parameters; ``own``: a
        task of dask's own functions (or of no call), whose graph keeps dask's order
        (:meth:`_keep_dask_promises`). A sweep's load task (annotated ``load``) is stage
        ``"<stage>:load"``: reading a result is not a sample of computing it."""
        ann = ts.annotations
        stage: Any = None
        params = None
        if ann:
            stage = ann.get("stage")
            params = params_of(ann)
            if ann.get("load"):
                return f"{stage if stage is not None else stage_of(ts)}:load", None, (), False
        grows: tuple[str, ...] = ()
        own = False
        if params is None and self.arguments:
            call = dask_internals.task_call(ts)
            if call is None:
                own = stage is None  # an alias, data: dask's plumbing
            else:
                refs = self._refs
                if refs is None:
                    refs = self._refs = dask_internals.references()
                named, params, grows = read(call[0], call[1], call[2], refs)
                if stage is None:
                    stage = named
                    own = named is None
        if stage is None:
            stage = ts.prefix.name
        return str(stage), params, grows, own

    def view(
        self,
        ts: Any,
        now: float,
        e: Estimate | float | None = None,
        d: Described | None = None,
    ) -> LiveTask:
        """The task view of ``ts``; ``e``: its estimate, if the caller predicted it already
        (a graph's unannotated tasks are predicted per stage in one batch; a float ``s`` is
        ``Estimate(s, s, s, "prior")``: :func:`~.estimates.predict_stage_seconds`); ``d``: what
        :meth:`describe` said of it, if the caller asked already."""
        stage, params, _, _ = self.describe(ts) if d is None else d
        ann = ts.annotations or _NO_ANNOTATIONS
        if params is not None and stage not in self._param_stages:
            self._param_stages.add(stage)
        if e is None:
            annotated = check_estimate(ts.key, ann["estimate"]) if "estimate" in ann else None
            e = self.estimator.predict(stage, params, annotated)
        teams = self.settings.teams
        team = str(ann.get("team", self.graph_team or teams.default))  # graph_team: __init__
        if teams.strict and team not in teams.targets:
            raise UnknownTeam(
                f"task {ts.key!r} belongs to team {team!r}, which is not configured "
                f"(daskjobs.teams.targets has: {', '.join(sorted(teams.targets)) or 'no teams'})"
            )
        speculate, job_class = True, "be"
        if ann:
            speculate = ann.get("speculate") is not False
            job_class = ann.get("job_class", "be")
            if job_class not in JOB_CLASSES:
                raise BadJobClass(
                    f"task {ts.key!r} has job_class {job_class!r}: expected 'te' (interactive "
                    "work a person waits for) or 'be' (best-effort, the default)"
                )
        deps: tuple[Key, ...] = ()
        if ts.dependencies:
            deps = tuple([dts.key for dts in ts.dependencies])
            shared = self._deps
            if shared is not None:
                deps = shared.setdefault(deps, deps)
        if type(e) is float:  # the prior's seconds (predict_stage_seconds)
            return LiveTask(
                ts.key, e, 1, team, now, deps, "prior", stage, speculate, job_class,
                params=params,
            )  # fmt: skip
        assert isinstance(e, Estimate)
        band = (e.low, e.high) if e.source in _BANDED else None
        return LiveTask(
            ts.key,
            e.seconds,
            1,
            team,
            now,
            deps,
            e.source,
            stage,
            speculate,
            job_class,
            band=band,
            samples=e.samples,
            params=params,
        )

    @staticmethod
    def unranked(tasks: Iterable[Any]) -> list[Any]:
        return [ts for ts in tasks if ts.priority is not None and len(ts.priority) == 3]

    def rank(self, tasks: Iterable[Any]) -> None:
        new = self.unranked(tasks)
        if not new:
            return
        self.settle()  # the new tasks are ranked against the waiting ones as they are now
        # A graph's ranking makes a view per task that lives as long as the task: with the
        # collector on, a graph of 10^6 tasks (about four objects each, on a heap that holds
        # dask's own ten or so a task) set off full collections of the scheduler's heap while
        # it was ranked, a third of the ranking's time. Paused for big graphs; the objects
        # are looked at once, by the next young collection, as dask's own are.
        paused = len(new) >= PAUSE_GC_FROM and gc.isenabled()
        if paused:
            gc.disable()
        try:
            self._rank_new(new)
        except _RankFailed as e:  # dask's own order for the whole graph
            self.audit.failed("rank", e.key)
        except (BadEstimate, UnknownTeam, BadJobClass) as e:
            # the client's own input: its submission is refused (refuse), naming the problem
            for ts in new:
                self.tasks.pop(ts.key, None)
            self.audit.event("rejected-graph", error=str(e), tasks=len(new))
            raise
        except Exception:
            self.audit.failed("rank", new[0].key)
        finally:
            if paused:
                gc.enable()

    def _rank_new(self, new: list[Any]) -> None:
        """Rank a new graph entirely or not at all: every view and key is computed
        before any priority changes; a failure names the task it failed on. One pass per
        step over the graph's tasks, each with its lookups in locals: it runs on the
        scheduler's event loop for every task of a graph (10^6 for a big map)."""
        policy = self.policy
        now = time.time()
        new.sort(key=_order_of)  # dask.order: dependencies first
        described = []
        describe = self.describe
        for ts in new:
            try:
                described.append(describe(ts))
            except Exception as e:
                raise _RankFailed(ts.key) from e
        predicted = self._predict_graph(new, described)
        views = []
        view = self.view
        self._deps = {}
        try:
            for ts, d, est in zip(new, described, predicted, strict=True):
                try:
                    views.append(view(ts, now, est, d))
                except (BadEstimate, UnknownTeam, BadJobClass):
                    raise
                except Exception as exc:
                    raise _RankFailed(ts.key) from exc
        finally:
            self._deps = None
        try:
            policy.add_graph(views)  # a popper's too (fair share: every team known from here)
        except Exception as e:
            raise _RankFailed(new[0].key, "the graph") from e
        ranks = []
        key = policy.key
        for ts, v in zip(new, views, strict=True):
            try:
                ranks.append(float(key(v)))
            except Exception as e:
                for w in views:
                    policy.forget(w.tid)
                raise _RankFailed(ts.key) from e
        ranks = self._keep_dask_promises(new, views, ranks, now, [d[3] for d in described])
        sources = dict.fromkeys(SOURCES, 0)
        te_ahead = self.te_first
        tasks = self.tasks
        set_priority = dask_internals.set_priority
        for ts, v, rank in zip(new, views, ranks, strict=True):
            p = ts.priority
            # interactive work first, within a user priority (whole numbers): the resources
            # a preempted task gives back go to a waiting TE task. Only tasks with resource
            # restrictions: they wait on workers, never in dask's queue, whose order the
            # release gate keeps for a popper (a boost there would pass its released task).
            first = user_order(p[0], v.job_class, te_ahead) if ts.resource_restrictions else p[0]
            set_priority(ts, (first, rank, p[1], p[2]))
            tasks[ts.key] = v
            sources[v.source] += 1
        self.ranked_graphs += 1
        self.ranked_tasks += len(new)
        self.just_ranked = [ts.key for ts in new]
        self.just_ranked_teams = frozenset({v.team for v in views})
        for src, count in sources.items():
            self.estimate_sources[src] += count
        self.audit.event("ranked-graph", policy=policy.name, tasks=len(new), estimates=sources)

    def _predict_graph(
        self, new: list[Any], described: list[Described]
    ) -> list[Estimate | float | None]:
        """The estimates of a graph's tasks without an ``estimate`` annotation, one batch
        per stage (one matrix product each: a sweep of 10,000 tasks is predicted in about
        a tenth of the time task by task), in the order of ``new``; None for an annotated
        task (left to :meth:`view`); a float for the prior's seconds
        (:func:`~daskjobs.plugin.estimates.predict_stage_seconds`). The size-like parameters
        of a stage's tasks are told to its model first
        (:meth:`~daskjobs.policies.durations.Estimator.expect`)."""
        by_stage: dict[str, tuple[list[int], list[Any], set[str]]] = {}
        for i, (ts, (stage, params, grows, _)) in enumerate(zip(new, described, strict=True)):
            ann = ts.annotations
            if not (ann and "estimate" in ann):
                group = by_stage.get(stage)
                if group is None:
                    group = by_stage[stage] = ([], [], set())
                group[0].append(i)
                group[1].append(params)
                if grows:
                    group[2].update(grows)
        out: list[Estimate | float | None] = [None] * len(new)
        est = self.estimator
        for stage, (at, params_list, grows_all) in by_stage.items():
            if grows_all:
                est.expect(stage, frozenset(grows_all), params_list)
            preds: list[Any] = predict_stage_seconds(est, stage, params_list)
            for i, e in zip(at, preds, strict=True):
                out[i] = e
        return out

    def _keep_dask_promises(
        self,
        new: list[Any],
        views: list[LiveTask],
        ranks: list[float],
        now: float,
        own: list[bool],
    ) -> list[float]:
        """dask's order inside a graph without estimates, or of dask's own tasks (a dask
        collection's: ``own``, measured or not) without an ``estimate`` annotation: one rank
        for all its tasks; and every rank aged by its generation's first submission (module
        docstring)."""
        if all(
            v.source == "default" or (mine and v.source != "annotation")
            for v, mine in zip(views, own, strict=True)
        ):
            ranks = [0.0] * len(ranks)
        generation = new[0].priority[1]
        age = self._ages.get(generation)
        if age is None:
            age = self._ages[generation] = now - self.started
            if len(self._ages) > 64:  # generations only grow: the oldest is done with
                del self._ages[next(iter(self._ages))]
        return [r + age for r in ranks]

    def refuse(self, tasks: Iterable[Any], error: SubmissionRefused) -> None:
        """Fail a refused submission the way dask fails a task: each of its new tasks
        (released, wanted by no one yet) errs with ``error`` before dask recommends
        anything, so their futures raise it and their dependents err with it; dask
        forgets them once their futures are released. Tasks submitted before that wait
        for the refused ones (``error.waiting``: a gang's first members) fail with them.
        What existed before otherwise (in memory, running for another graph) is untouched."""
        logger.info("daskjobs refused a submission: %s", error)
        also: Iterable[Key] = getattr(error, "waiting", ())
        new = [ts for ts in tasks if ts.state == "released" and not ts.who_wants]
        stimulus = f"daskjobs-refused-{time.time()}"
        dask_internals.fail_tasks(self.scheduler, new, error, stimulus, waiting=also)

    def share(self, client: str | None, keys: Iterable[Key]) -> list[LiveTask]:
        """A graph of ``client`` wants ``keys`` (dask's ``update_graph`` hook, right after
        ranking): the tasks it did not bring (another team's graph did) are now wanted by
        this graph's teams too. This graph's teams are those of the tasks it brought, else
        (it brought none: every key existed) the teams of the client's earlier graphs, else
        the default team. Returns the views whose ``teams`` grew (``self.tasks`` holds the
        new views); fair share splits their cores among their teams. O(keys)."""
        new, mine = self.just_ranked, self.just_ranked_teams
        self.just_ranked, self.just_ranked_teams = [], frozenset()
        tasks = self.tasks
        if mine and client:
            self.client_teams[client] = mine
        elif not mine:
            fallback = self.graph_team or self.settings.teams.default  # the client's team
            mine = self.client_teams.get(client or "") or frozenset({fallback})
        fresh = set(new)
        sched = self.scheduler
        grown: list[LiveTask] = []
        if fresh.issuperset(keys):  # it brought every key it wants (one pass in C, not Python)
            return grown
        for key in keys:
            if key in fresh:
                continue
            v = tasks.get(key)
            if v is None:
                continue
            ts = sched.tasks.get(key) if sched is not None else None
            if ts is not None and ts.state in ("memory", "erred", "forgotten"):
                continue  # done: nothing more to pay for
            have = v.teams or (v.team,)
            more = sorted(mine.difference(have))
            if more:
                tasks[key] = w = dataclasses.replace(v, teams=(*have, *more))
                grown.append(w)
        return grown

    def check_one(
        self,
        key: Key,
        annotations: dict[str, Any],
        resources: dict[str, float] | None,
        placer: Any = None,
    ) -> None:
        """Raise the :class:`~daskjobs.SubmissionRefused` a task ``key`` with these
        annotations and resources would be refused with, if any, without submitting it:
        its view is made as for a graph's task, and ``placer`` (resources on) checks it."""
        from types import SimpleNamespace

        ts = SimpleNamespace(
            key=key,
            annotations=dict(annotations),
            resource_restrictions=dict(resources or {}) or None,
            worker_restrictions=None,
            host_restrictions=None,
            dependencies=(),
            prefix=SimpleNamespace(name=str(key)),
        )
        self.view(ts, time.time())
        if placer is not None:
            placer.check([ts])

    def forget(self, key: Key) -> None:
        """``key`` was forgotten by the scheduler."""
        v = self.tasks.pop(key, None)
        if v is not None:
            w = self.waiting.get(v.stage)
            if w is not None:
                w.pop(key, None)
        self.policy.forget(key)

    # -- re-ranking as a stage's estimates improve ------------------------------------------
    def track(self, key: Key, finish: str, start: str = "") -> None:
        """Keep the set of each stage's unannotated tasks that wait, on the scheduler or
        on a worker (O(1)); with a re-rank deferred, a task that leaves the waiting set
        takes its view as that re-rank would have left it (:meth:`current`), and a task
        that comes back to wait (a lost result, a retry) settles every deferred re-rank
        first (it would be ranked against the others)."""
        if not self.reranks:
            return
        if finish in PENDING:
            if self.deferred and start and start not in PENDING:
                self.settle()
            v = self.tasks.get(key)
            if v is None or v.source == "annotation":
                return
            w = self.waiting.get(v.stage)
            if w is None:
                w = self.waiting[v.stage] = {}
            w[key] = None
            return
        v = self.tasks.get(key)
        if v is None:
            return
        w = self.waiting.get(v.stage)
        if w is None or key not in w:
            return
        if self.deferred:
            self.current(key)  # it stops waiting: it takes the deferred re-rank now
        del w[key]

    def reestimate(
        self, stage: str, done: Key | None = None
    ) -> list[tuple[LiveTask, LiveTask, str]]:
        """If the stage's model is due (:meth:`Estimator.due`: module docstring), give
        each task of ``stage`` that waits (on the scheduler, or on a worker that takes new
        priorities: :attr:`reorders`) its new estimate, and the rank the policy's ``key``
        gives it with it (after ``policy.reestimate``), aged as it was; the verb
        :func:`~daskjobs.plugin.surgery._internals.reprioritize` enacts the ranks. Returns
        ``(old view, new view, dask state)`` of each task whose estimate changed.
        O(waiting tasks of the stage x log queued), at the model's cadence, which spaces
        the re-ranks of a long queue by its length: O(1) visits per finished task.

        A re-rank that could change no order waits (:meth:`_alone`; ``done``: the task
        whose end brought this call, no longer waiting in dask's counts): its estimate is
        kept in :attr:`deferred`, a task that stops waiting takes it then
        (:meth:`current`), and :meth:`settle` gives it to the rest before anything could
        be ordered against them. So a sweep of one stage without ``params`` pays O(1) per
        task for its re-ranks, not the ~26 visits of each waiting task."""
        est = self.estimator
        keys = self.waiting.get(stage)
        if not (self.reranks and est.due(stage, len(keys) if keys else 0)):
            return []
        est.mark(stage)
        sched = self.scheduler
        if not keys or sched is None:
            return []
        if stage in self._param_stages and est.typical(stage) < RERANK_MIN_SECONDS:
            # tasks this short (client.map(inc, range(n))) cannot move the end of a run by
            # more than a few of them whatever their order: their re-rank is not worth its
            # visits of every waiting task
            self.short_skips += 1
            return []
        if self._alone(stage, len(keys) - (done in keys), sched):
            # every waiting task would move by one offset: nothing changes order
            (self.deferred[stage],) = predict_stage(est, stage, [None])
            self.deferrals += 1
            return []
        self.deferred.pop(stage, None)  # this re-rank gives every waiting task its estimate
        return self._rerank(stage, keys, sched, None)

    def _alone(self, stage: str, waiting: int, sched: Any) -> bool:
        """May the re-rank of ``stage`` wait (:meth:`reestimate`)? Yes when the stage's
        tasks share one estimate (no ``params``), they are all the tasks that wait
        anywhere (dask's counts per task group: O(groups)), every worker takes new
        priorities, and no part reads waiting views (:attr:`lazy`): the re-rank would
        add one offset to every waiting rank, which changes no order."""
        if not self.lazy or stage in self._param_stages:
            return False
        reorders = self.reorders
        if not reorders or any(a not in reorders for a in sched.workers):
            return False
        return dask_internals.pending_count(sched, PENDING) == waiting

    def settle(self) -> list[tuple[LiveTask, LiveTask, str]]:
        """Give every deferred re-rank now (what :meth:`reestimate` would have done at
        its due time, with that time's estimate), before anything is ranked against the
        waiting tasks or reads their views: a new graph, a task that comes back to wait,
        a worker that joins or leaves or changes whether it takes new priorities,
        ``explain``, the status and metrics pages. O(waiting tasks of those stages)."""
        if not self.deferred:
            return []
        deferred, self.deferred = self.deferred, {}
        sched = self.scheduler
        changed: list[tuple[LiveTask, LiveTask, str]] = []
        for stage, e in deferred.items():
            keys = self.waiting.get(stage)
            if keys and sched is not None:
                changed += self._rerank(stage, keys, sched, e)
        return changed

    def current(self, key: Key) -> LiveTask | None:
        """The view of ``key``, as the re-ranks so far have left it: a task of a stage
        whose re-rank is deferred that still waits takes that re-rank's estimate and rank
        now (O(1)). Call it before reading a waiting task's estimate."""
        v = self.tasks.get(key)
        if v is None or not self.deferred:
            return v
        e = self.deferred.get(v.stage)
        if e is None or _holds(v, e):
            return v
        keys = self.waiting.get(v.stage)
        sched = self.scheduler
        if keys is None or key not in keys or sched is None:
            return v
        ts = sched.tasks.get(key)
        if ts is None or ts.priority is None or len(ts.priority) != 4:
            return v
        new = self._reranked(ts, v, e, None)
        return v if new is None else new

    def _reranked(
        self,
        ts: Any,
        v: LiveTask,
        e: Estimate,
        changes: list[tuple[Any, tuple[Any, ...]]] | None,
    ) -> LiveTask | None:
        """Give one ranked task its new estimate ``e``: its new view (stored), and its new
        rank, aged as it was, appended to ``changes`` (None: the estimate did not
        change). Without ``changes`` to append to, the rank is set in place (a task that
        no longer waits in dask's queue)."""
        if _holds(v, e):
            return None
        band = (e.low, e.high) if e.source in _BANDED else None
        new = v.reestimated(e.seconds, e.source, band, e.samples)
        p = ts.priority
        policy = self.policy
        was = float(policy.key(v))
        reestimate = getattr(policy, "reestimate", None)
        if reestimate is not None:
            reestimate(v, new)
        rank = float(policy.key(new))
        if rank != was:  # (a key the estimate does not move, fifo's: the rank stays)
            age = self._ages.get(p[2])
            if age is None:  # an old generation: its age is what the rank holds beyond the key
                age = p[1] - was
            prio = (p[0], rank + age, p[2], p[3])
            if changes is None:
                dask_internals.set_priority(ts, prio)
            else:
                changes.append((ts, prio))
        self.tasks[ts.key] = new
        return new

    def _rerank(
        self, stage: str, keys: dict[Key, None], sched: Any, shared: Estimate | None
    ) -> list[tuple[LiveTask, LiveTask, str]]:
        """The re-rank of :meth:`reestimate`: with the model's estimates now, or with
        ``shared`` (a deferred re-rank's, for every task)."""
        todo = []
        reorders = self.reorders
        for key in list(keys):
            ts = sched.tasks.get(key)
            v = self.tasks.get(key)
            if ts is None or v is None or ts.state not in PENDING:
                keys.pop(key, None)
                continue
            if ts.state == "processing" and dask_internals.processing_worker(ts) not in reorders:
                continue  # its worker cannot take a new priority: it keeps its place
            if ts.priority is not None and len(ts.priority) == 4:  # ranked by us
                todo.append((ts, v))
        if not todo:
            return []
        if shared is None:
            preds = predict_stage(self.estimator, stage, [v.params for _, v in todo])
        else:
            preds = [shared] * len(todo)
        changes: list[tuple[Any, tuple[Any, ...]]] = []
        changed: list[tuple[LiveTask, LiveTask, str]] = []
        for (ts, v), e in zip(todo, preds, strict=True):
            new = self._reranked(ts, v, e, changes)
            if new is not None:
                changed.append((v, new, ts.state))
        moved = dask_internals.reprioritize(sched, changes, reorders, self.reorder_op)
        on_workers = sum(1 for _, _, state in changed if state == "processing")
        self.reestimated += len(changed)
        self.reranked_on_workers += on_workers
        # spread only after a re-rank by a parameter model (balance.movable)
        modelled = any(movable(new.source, False) for _, new, _ in changed)
        spread = self._rebalance(sched) if on_workers and modelled else 0
        if changed:
            self.audit.event(
                "reestimated",
                stage=stage,
                tasks=len(changed),
                reranked=moved,
                on_workers=on_workers,
                moved=spread,
                samples=changed[0][1].samples,
            )
        return changed

    def _rebalance(self, sched: Any) -> int:
        """Ask :func:`~daskjobs.policies.balance.rebalance` how to even out the estimated
        work waiting on the workers that take new priorities, and enact its moves through
        dask's work stealing (:func:`~daskjobs.plugin.surgery._internals.move_waiting`: a task
        that started meanwhile is not moved). Each worker's backlog is the tasks dask sent
        it, in priority order, with their estimates (the default for a task not ranked);
        a task with restrictions counts but does not move. O(tasks on those workers x
        log), at the re-ranking cadence."""
        reorders = self.reorders
        if len(reorders) < 2 or not dask_internals.can_move(sched):
            return 0
        tasks = self.tasks
        default = self.settings.default_estimate
        backlogs = []
        workers = {}
        for ws in sched.workers.values():
            if ws.address not in reorders:
                continue
            workers[ws.address] = ws
            held = sorted(ws.processing, key=_rank_of)
            backlogs.append(
                Backlog(
                    ws.address,
                    ws.nthreads,
                    [
                        (
                            ts.key,
                            v.estimate if (v := tasks.get(ts.key)) is not None else default,
                            movable(
                                None if v is None else v.source,
                                bool(
                                    ts.worker_restrictions
                                    or ts.host_restrictions
                                    or ts.resource_restrictions
                                ),
                            ),
                        )
                        for ts in held
                    ],
                )
            )
        n = 0
        for m in rebalance(backlogs):
            ts = sched.tasks.get(m.task)
            if ts is None or dask_internals.processing_worker(ts) != m.source:
                continue
            if dask_internals.move_waiting(sched, ts, workers[m.source], workers[m.target]):
                n += 1
        self.moved += n
        return n
