"""When will it finish: the rest of the work, simulated from the scheduler's live state.

(``daskjobs.forecast`` is the function :func:`forecast` of this module: a module of that
name would shadow the function once imported.)

:func:`forecast` asks the scheduler plugin for a snapshot of what is not finished
(:mod:`daskjobs.plugin.observe.snapshot`: one read-only pass on the scheduler) and simulates the
rest *here, on the client*, with the simulator (:func:`daskjobs.sim.simulate`) under the
policy in force, made from the registry by its name and settings, as the plugin made it,
with speculation's settings if it is on. It answers the remaining time as a distribution
(p10, p50, p90 seconds from the snapshot), overall, per team and per ``sweep``
annotation.

How the snapshot becomes a simulation (:func:`build`):

* every worker is a node of the simulated cluster with its threads as cores and its
  measured slow-down (run time / estimate over the tasks it ran, as the plugin measured
  it, without the learner's prior: :data:`SPEED_PRIOR`) as the node's slow-down; the
  policy's speed beliefs start from the plugin's (with the prior). A draw draws the
  node's slow-down around the measure: a worker measured on few tasks may be slower or
  faster than measured. Workers of unequal threads: every thread is a node of one core.
* a task that runs (dask assigned it to a worker, within the worker's threads) starts at
  once on that worker: its remaining time is its duration drawn from its band *given that
  it has already run* ``elapsed`` seconds (at least :data:`FLOOR` of its estimate); the
  policy sees the estimate of what remains. A task dask assigned beyond the threads waits
  on that worker, in dask's order. Replay's recorded placement
  (:class:`daskjobs.replay.run.Placed`) pins both; everything else is the policy's.
* a task that waits gets its estimate, and a duration drawn around it: lognormal, its
  mean the estimate (the independent errors of many tasks sum to their estimates), its
  10-90% range the band where the duration model has one. Errors that move many tasks
  alike are factors of median 1 drawn once per draw: its stage's (the model's own error,
  shrinking with the observations it rests on down to :data:`MODEL_ERROR`: a stage whose
  every task is underestimated moves the end; independent errors of 10^4 tasks cancel),
  and for an annotated estimate its team's (:data:`ANNOTATION_TEAM`). Without a band:
  :data:`SPREAD` by where the estimate came from.

Each draw is one simulation; the quantiles are over the draws (``draws``, seeded:
the same snapshot and seed give the same forecast). What it cannot know: work that is
not submitted yet, workers that will join or leave, a worker's slow-down that changes,
tasks that fail. Cost: O(n) to build, one simulation (~10^5 tasks a second) per draw.

A large snapshot (tasks x draws beyond :data:`SIMULATED`) is simulated once, with the
estimates, and its draws are computed from that run (:func:`_computed`) rather than
simulated: 30 simulations of 10^5 tasks take half a minute, and what they spread is
mostly not the schedule's detail. The work left ends about when the work ending by
then, over the cluster's capacity, says: each time the forecast answers (the end of all,
of a team, a sweep, a task's start) is scaled, per sample, by the work that ended by it
in the central run with its stages' and teams' factors drawn (a stage's tasks move as
one), plus its tasks' own errors (independent: their sum is a normal of their summed
variances, whose width shrinks as sqrt(n) against the work's n), and by the capacity
with each worker's slow-down drawn. Exact for work that keeps every thread busy to the
end (a bag of tasks much larger than the cluster); what it leaves out is what a few
tasks do: the last ones' own errors at the end (a draw's end is a little later than the
central run's, the more so the fewer the tasks), a chain that
becomes critical in one draw and not in another, backup copies that win. Cost: one
simulation, and O(n + (answers + samples) x (stage, team) pairs) for the band.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

from daskjobs.config import SpeculationSettings
from daskjobs.policies import Policy, registry
from daskjobs.policies.speculation import Speculation
from daskjobs.sim.engine import simulate
from daskjobs.sim.model import Cluster, Task

__all__ = [
    "ANNOTATION_TEAM",
    "FLOOR",
    "MAX_STARTS",
    "MODEL_ERROR",
    "SPEED_PRIOR",
    "SPREAD",
    "Built",
    "Forecast",
    "PolicyNotInstalled",
    "Remaining",
    "build",
    "forecast",
    "forecast_snapshot",
]

#: Above this share of unfinished tasks whose duration nothing has measured yet (the
#: default estimate, a prior from an argument, or a stage none of whose tasks has
#: finished: an annotation is the user's guess), the forecast says it is rough.
ROUGH_SHARE = 0.2
ROUGH = (
    "{guessed} of {n} unfinished tasks have no measured duration yet (a stage none of whose "
    "tasks has finished): a rough forecast until some of each stage have run"
)
#: Keys asked for (``keys=``) up to which :attr:`Forecast.starts` gives each one's
#: expected start.
MAX_STARTS = 1000
#: A running task's remaining time is at least this share of its estimate (it may be
#: overdue: it still takes a moment to finish).
FLOOR = 0.05
#: Spread of a duration around an estimate without a band, by where the estimate came
#: from: (per task, per stage) as the sigma of a lognormal (0.3: 10-90% about 0.7x-1.5x).
SPREAD = {
    "annotation": (0.3, 0.1),
    "model": (0.3, 0.15),
    "history": (0.3, 0.15),
    "prior": (0.5, 0.5),
    "default": (0.5, 0.5),
}
#: The least sigma of a stage's common factor where a duration model gives the band. The
#: band's residuals say how far one task falls from the fit, and the error of the fit's mean
#: shrinks as 1/sqrt(observations) only if the fit's form is right: a form off by a few
#: percent (a power law where the cost is not quite one; the tasks left are not those it
#: was fitted on, and longest first leaves the shortest for last) moves the stage's
#: remaining tasks alike however many observations it rests on.
MODEL_ERROR = 0.05
#: Sigma of a factor common to the annotated estimates of one team, beside each stage's
#: own: the people who write a team's estimates err alike across its stages. A factor
#: common to every estimate is measured already, by the workers' slow-downs (run time /
#: estimate); one per team is not.
ANNOTATION_TEAM = 0.1
#: A worker's believed slow-down is the geometric mean of run time / estimate over the
#: tasks it measured, with the learner's prior of this many samples of 1
#: (:class:`~daskjobs.policies.NodeAware`'s ``prior``). The prior keeps the policy from
#: acting on a few tasks' noise; the forecast wants the likeliest slow-down, so it takes
#: the prior out (a worker 3x slow measured on 13 tasks is believed 2.3x, measured 2.6x),
#: and draws its log with sigma / sqrt(samples), for a task's sigma (the median of the
#: snapshot's): a worker measured on 3 tasks is drawn wider than one measured on 300. A
#: worker measured on none keeps its figure (1.0), drawn with sigma / sqrt(SPEED_PRIOR).
SPEED_PRIOR = 2.0
#: Task simulations (tasks x draws) a forecast's draws may take: beyond, it simulates once,
#: with the estimates, and computes the band from that run (``band="computed"``).
SIMULATED = 100_000
#: Samples of the computed band (fewer where its (stage, team) pairs are many).
SAMPLES = 1000
#: How a forecast's band may be made: ``auto`` (drawn up to :data:`SIMULATED`, computed
#: beyond), ``drawn`` (every draw a simulation), ``computed`` (one simulation).
BANDS = ("auto", "drawn", "computed")
COMPUTED = (
    "{n} tasks: simulated once, with the estimates; the range is computed from that run "
    "(band='drawn' simulates every draw)"
)
_Z90 = NormalDist().inv_cdf(0.9)  # a 10-90% range is 2 x 1.2816 sigmas wide
_NORMAL = NormalDist()


class PolicyNotInstalled(LookupError):
    """The scheduler runs a policy this client does not have registered."""


@dataclass(frozen=True)
class Remaining:
    """Seconds from the snapshot until the work ends: 10th, 50th and 90th percentile."""

    p10: float
    p50: float
    p90: float

    def at(self, t0: float) -> Remaining:
        """The same as times (``t0`` plus each)."""
        return Remaining(t0 + self.p10, t0 + self.p50, t0 + self.p90)


@dataclass(frozen=True)
class Forecast:
    """What :func:`forecast` answers (module docstring)."""

    remaining: Remaining
    end: Remaining  # the scheduler's clock (time.time() there) at the end
    teams: dict[str, Remaining]
    sweeps: dict[str, Remaining]
    tasks: int  # unfinished tasks simulated
    running: int  # of which running
    workers: int
    policy: str
    speculation: bool
    draws: int
    seed: int
    time: float  # the scheduler's clock at the snapshot
    seconds_taken: float  # on this client: the snapshot's round trip and the draws
    notes: tuple[str, ...] = field(default=())
    #: a waiting task's expected start, seconds from the snapshot, for each key asked for
    #: (``keys=``, at most :data:`MAX_STARTS` of them) that had not started
    starts: dict[str, Remaining] = field(default_factory=dict)
    #: how the range was made: ``drawn`` (a simulation per draw), ``computed`` (from one
    #: simulation, on a large snapshot), ``none`` (no draws: p10 = p50 = p90)
    band: str = "drawn"

    def as_dict(self) -> dict[str, Any]:
        def q(r: Remaining) -> dict[str, float]:
            return {"p10": r.p10, "p50": r.p50, "p90": r.p90}

        return {
            "remaining": q(self.remaining),
            "end": q(self.end),
            "teams": {t: q(r) for t, r in self.teams.items()},
            "sweeps": {s: q(r) for s, r in self.sweeps.items()},
            "tasks": self.tasks,
            "running": self.running,
            "workers": self.workers,
            "policy": self.policy,
            "speculation": self.speculation,
            "draws": self.draws,
            "seed": self.seed,
            "time": self.time,
            "seconds_taken": self.seconds_taken,
            "notes": list(self.notes),
            "starts": {k: q(r) for k, r in self.starts.items()},
            "band": self.band,
        }


@dataclass
class Built:
    """A snapshot as the simulator's input (:func:`build`); ``draw`` fills durations."""

    tasks: list[Task]
    cluster: Cluster
    placement: dict[Hashable, tuple[int, float]]  # pinned: tid -> (node, order)
    speeds: dict[int, float]  # node -> believed slow-down (the policy's)
    measured: dict[int, float]  # node -> measured slow-down (the prior taken out: the truth's)
    samples: dict[int, int]  # node -> the finished tasks it rests on
    speed_sigma: dict[int, float]  # node -> lognormal sigma of its slow-down (the truth's)
    worker_of: dict[int, int]  # node -> its worker's number (a worker's threads: one speed)
    teams: list[str]
    sweeps: list[str | None]
    running: list[int]  # rows that run now
    elapsed: np.ndarray  # per row: seconds run (running rows; 0 else)
    slow: np.ndarray  # per row: the slow-down of its worker (running rows; 1 else)
    estimate: np.ndarray  # per row: the estimate (whole task)
    sigma: np.ndarray  # per row: lognormal sigma of a task
    stage_sigma: np.ndarray  # per row: lognormal sigma of its stage's factor
    stage: np.ndarray  # per row: stage number
    team: np.ndarray  # per row: team number
    team_sigma: np.ndarray  # per row: lognormal sigma of its team's factor (annotated; 0 else)
    node: np.ndarray  # per row: the node it runs on (running rows; -1 else)
    notes: list[str]


def _sigmas(source: str, band: Sequence[float] | None, samples: int) -> tuple[float, float]:
    """(per task, per stage) lognormal sigmas of an estimate from ``source`` with ``band``
    resting on ``samples`` observations (module docstring)."""
    if band is not None and band[0] > 0 and band[1] >= band[0]:
        s = (math.log(band[1]) - math.log(band[0])) / (2 * _Z90)
        s = max(s, 0.02)
        return s, max(s / math.sqrt(max(samples, 1)), MODEL_ERROR)
    return SPREAD.get(source, SPREAD["default"])


def _sigma_columns(
    sources: Sequence[str], bands: Sequence[Sequence[float] | None], samples: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_sigmas` of every row, as two columns (the same numbers: the logs are
    Python's, the rest IEEE arithmetic numpy does alike)."""
    n = len(sources)
    sigma, stage_sigma = np.empty(n), np.empty(n)
    banded = np.array(
        [b is not None and b[0] > 0 and b[1] >= b[0] for b in bands], dtype=bool
    ).reshape(n)
    rows = np.flatnonzero(banded)
    if len(rows):
        width = np.array([math.log(bands[i][1]) - math.log(bands[i][0]) for i in rows.tolist()])
        s = np.maximum(width / (2 * _Z90), 0.02)
        k = np.maximum(np.array([samples[i] for i in rows.tolist()], dtype=float), 1.0)
        sigma[rows] = s
        stage_sigma[rows] = np.maximum(s / np.sqrt(k), MODEL_ERROR)
    for i in np.flatnonzero(~banded).tolist():
        sigma[i], stage_sigma[i] = SPREAD.get(sources[i], SPREAD["default"])
    return sigma, stage_sigma


def _tasks(
    cols: Mapping[str, Any],
    est: np.ndarray,
    running: list[int],
    elapsed: np.ndarray,
    slow: np.ndarray,
    cores_max: int,
) -> list[Task]:
    """The simulator's Tasks of the snapshot's rows: a running task's duration and estimate
    what remains of it, without inputs (they are done: it runs); a waiting one's its
    estimate. ``Task(...)`` checks every field (three quarters of a build of 10^5 tasks):
    the caller checked the values at once (finite estimates >= 0, ids unique) and cores
    are clamped here, so each Task is made as the simulator makes its re-estimated ones,
    a field at a time through its slot, column by column."""
    n = len(est)
    keys = cols["key"]
    e = np.maximum(est, 1e-9)
    rest = e.copy()
    if running:
        r = np.asarray(running)
        rest[r] = np.maximum(e[r] - elapsed[r] / slow[r], FLOOR * e[r])
    all_deps = cols["deps"]
    deps: list[tuple[Hashable, ...]] = [
        tuple([keys[d] for d in ds]) if ds else () for ds in all_deps
    ]
    for i in running:  # its inputs are done (it runs); the policy sees what remains
        deps[i] = ()
    rest_list = rest.tolist()
    columns: dict[str, Sequence[Any]] = {
        "tid": keys,
        "duration": rest_list,
        "estimate": rest_list,
        "cores": [min(int(c), cores_max) for c in cols["cores"]],
        "deps": deps,
        "team": cols["team"],
        "speculate": [bool(x) for x in cols["speculate"]],
        "estimated": [src not in ("default", "prior") for src in cols["source"]],
        "stage": cols["stage"],
    }
    new_task = object.__new__
    tasks = [new_task(Task) for _ in range(n)]
    for name, f in Task.__dataclass_fields__.items():
        put = getattr(Task, name).__set__  # the slot's own setter (Task is frozen)
        if name in columns:
            for _ in map(put, tasks, columns[name]):
                pass
        else:
            value = -1 if name == "_ti" else f.default
            for t in tasks:
                put(t, value)
    return tasks


def _measured(belief: float, samples: int) -> float:
    """A worker's slow-down as measured, from the learner's ``belief`` resting on
    ``samples`` tasks: the prior of :data:`SPEED_PRIOR` samples of 1 taken out."""
    if samples <= 0 or belief <= 0:
        return belief
    return math.exp(math.log(belief) * (samples + SPEED_PRIOR) / samples)


def build(snap: Mapping[str, Any], workers: int = 0) -> Built:
    """The simulator's tasks and cluster for snapshot ``snap``, with ``workers`` more
    (nominal, of the most common thread count) or fewer (the last ones; their tasks wait
    again). Durations are the estimates (the central case); :meth:`draw` draws them."""
    cols = snap["tasks"]
    ws = list(snap["workers"])
    notes: list[str] = []
    if workers < 0:
        if -workers >= len(ws):
            raise ValueError(f"workers={workers}: the scheduler has {len(ws)} worker(s)")
        ws = ws[:workers]
    gone = {w["address"] for w in snap["workers"]} - {w["address"] for w in ws}
    threads = [int(w["threads"]) for w in ws]
    common = max(set(threads), key=threads.count) if threads else 1
    ws = ws + [{"address": f"what-if-{i}", "threads": common, "speed": 1.0, "samples": 0}
               for i in range(max(workers, 0))]  # fmt: skip
    if not ws:
        raise ValueError("the scheduler has no workers: nothing to forecast on")
    threads = [int(w["threads"]) for w in ws]
    uniform = len(set(threads)) == 1
    nodes_of: dict[str, list[int]] = {}
    speeds: dict[int, float] = {}
    samples: dict[int, int] = {}
    worker_of: dict[int, int] = {}
    k = 0
    for number, w in enumerate(ws):
        count = 1 if uniform else int(w["threads"])
        nodes_of[w["address"]] = list(range(k, k + count))
        for j in range(k, k + count):
            speeds[j] = float(w.get("speed") or 1.0)
            samples[j] = int(w.get("samples") or 0)
            worker_of[j] = number
        k += count
    if not uniform:
        notes.append("workers of unequal threads: every thread simulated as a node of one core")
    measured = {j: _measured(s, samples[j]) for j, s in speeds.items()}
    cluster = Cluster(
        nodes=k,
        cores_per_node=threads[0] if uniform else 1,
        slow={j: s for j, s in measured.items() if s != 1.0} or None,
    )
    n = len(cols["key"])
    keys = cols["key"]
    placement: dict[Hashable, tuple[int, float]] = {}
    running: list[int] = []
    elapsed = np.zeros(n)
    slow = np.ones(n)
    est = np.array(cols["estimate"], dtype=float) if n else np.zeros(0)
    sigma, stage_sigma = _sigma_columns(cols["source"], cols["band"], cols["samples"])
    stage_no: dict[str, int] = {}
    stage = np.array([stage_no.setdefault(s, len(stage_no)) for s in cols["stage"]], np.int64)
    node_of = np.full(n, -1, dtype=np.int64)
    threads_of = {w["address"]: int(w["threads"]) for w in ws}
    for i, addr in enumerate(cols["worker"]):
        if addr is None or addr in gone or addr not in nodes_of:
            continue
        pos = int(cols["position"][i] or 0)
        mine = nodes_of[addr]
        node = mine[pos % len(mine)]
        placement[keys[i]] = (node, float(pos))
        if pos < threads_of[addr]:  # within its threads: it runs now
            running.append(i)
            elapsed[i] = float(cols["elapsed"][i] or 0.0)
            slow[i] = measured[node]
            node_of[i] = node
    if gone:
        notes.append(f"{len(gone)} worker(s) taken away: their tasks wait again")
    cores_max = cluster.cores_per_node
    if len(set(keys)) != n:
        raise ValueError("the snapshot names a task twice")
    if n and not (np.isfinite(est).all() and (est >= 0).all()):
        raise ValueError("the snapshot holds an estimate that is not a finite number >= 0")
    tasks = _tasks(cols, est, running, elapsed, slow, cores_max)
    if any(int(c) > cores_max for c in cols["cores"]):
        notes.append(f"tasks wanting more than {cores_max} core(s) simulated on {cores_max}")
    source_col, team_col = cols["source"], cols["team"]
    guessed = sum(
        1
        for src, k in zip(source_col, cols["samples"], strict=True)
        if src in ("default", "prior") or not k
    )
    if guessed > ROUGH_SHARE * n:
        notes.append(ROUGH.format(guessed=guessed, n=n))
    team_no: dict[str, int] = {}
    team = np.array([team_no.setdefault(t, len(team_no)) for t in team_col], dtype=np.int64)
    team_sigma = np.where(np.array(source_col) == "annotation", ANNOTATION_TEAM, 0.0)
    task_sigma = float(np.median(sigma)) if n else SPREAD["default"][0]
    speed_sigma = {j: task_sigma / math.sqrt(c or SPEED_PRIOR) for j, c in samples.items()}
    return Built(
        tasks=tasks,
        cluster=cluster,
        placement=placement,
        speeds=speeds,
        measured=measured,
        samples=samples,
        speed_sigma=speed_sigma,
        worker_of=worker_of,
        teams=list(cols["team"]),
        sweeps=list(cols["sweep"]),
        running=running,
        elapsed=elapsed,
        slow=slow,
        estimate=est,
        sigma=sigma,
        stage_sigma=stage_sigma,
        stage=stage,
        team=team,
        team_sigma=team_sigma,
        node=node_of,
        notes=notes,
    )


def draw(built: Built, rng: np.random.Generator | None) -> None:
    """Give every task of ``built`` a duration and every node a slow-down: drawn (module
    docstring) with ``rng``, or the estimates and the measured slow-downs (``None``: the
    central case).
    A running task's duration is what remains, drawn from its duration's distribution
    given the time it has already run.

    A task's own factor has mean 1 (``exp(sigma z - sigma^2 / 2)``): the independent
    errors of many tasks sum to their estimates, so the draws' median is the central case's
    end, not ``exp(sigma^2 / 2)`` beyond it. The common factors (stage, team, a node's
    slow-down) have median 1: the end is as likely before as after the one they move. A
    running task's stage and team move it too.

    The tasks are this forecast's own objects: their ``duration`` slot is set in place
    (10^5 frozen Tasks rebuilt per draw would cost more than the simulation's start)."""
    n = len(built.tasks)
    speeds = dict(built.measured)
    if rng is not None:
        g = rng.standard_normal(max(built.worker_of.values(), default=0) + 1).tolist()
        for j in speeds:
            speeds[j] *= math.exp(built.speed_sigma[j] * g[built.worker_of[j]])
    built.cluster = dataclasses.replace(
        built.cluster, slow={j: s for j, s in speeds.items() if s != 1.0} or None
    )
    if not n:
        return
    est = np.maximum(built.estimate, 1e-9)
    sigma = built.sigma
    if rng is None:
        dur = est.copy()
    else:
        stage_f = rng.standard_normal(int(built.stage.max()) + 1)
        team_f = rng.standard_normal(int(built.team.max()) + 1)
        common = np.exp(
            built.stage_sigma * stage_f[built.stage] + built.team_sigma * team_f[built.team]
        )
        est = est * common  # each task's expected duration in this draw
        z = rng.standard_normal(n)
        dur = est * np.exp(sigma * z - 0.5 * sigma * sigma)
    setattr_ = object.__setattr__
    for i in built.running:  # what remains, given that it ran `elapsed` (on its worker)
        e = float(est[i])
        ran = float(built.elapsed[i] / speeds[int(built.node[i])])  # nominal seconds run
        if rng is None:
            total = max(e, ran)
        else:
            s = float(sigma[i])
            lo = _NORMAL.cdf((math.log(ran / e) + 0.5 * s * s) / s) if ran > 0 else 0.0
            u = lo + (1.0 - lo) * float(rng.random())
            u = min(max(u, 1e-12), 1 - 1e-12)
            total = e * math.exp(s * _NORMAL.inv_cdf(u) - 0.5 * s * s)
        dur[i] = max(total - ran, FLOOR * float(built.estimate[i]))
    for t, d in zip(built.tasks, dur.tolist(), strict=True):
        setattr_(t, "duration", d)


def _policy(snap: Mapping[str, Any], name: str | None) -> Policy:
    in_force = snap["policy"]
    name = name or in_force
    try:
        spec = registry.get(name)
    except ValueError as e:
        raise PolicyNotInstalled(
            f"the scheduler runs policy {name!r}, which this client does not have: install "
            "the package that provides it here (it registers the name through an entry point "
            "of group 'daskjobs.policies'), or register it before forecasting "
            f"(daskjobs.policies.register({name!r}, ...)); or forecast under a policy this "
            f"client has, e.g. policy='lpt' ({e})"
            if name == in_force
            else str(e)
        ) from e
    if name == in_force:
        settings = dict(snap.get("policy_settings") or {})
    elif name == "fair-share":
        settings = dict(snap.get("teams") or {})
    else:
        settings = {}
    return spec.make(**settings)


def _speeds_seeded(learner: Any, built: Built) -> None:
    """Start ``learner``'s beliefs (a NodeAware, or any with ``relearn``) from the live ones
    when the simulator adds each node."""
    relearn = getattr(learner, "relearn", None)
    prior = float(getattr(learner, "prior", 0.0))
    if relearn is None:
        return
    add = learner.add_node

    def add_node(index: int, cores: int) -> None:
        add(index, cores)
        s, n = built.speeds.get(index, 1.0), built.samples.get(index, 0)
        if n > 0 and s > 0:
            relearn(index, (math.log(s) * (n + prior), n))

    learner.add_node = add_node


def _pinned(inner: Policy, placement: Mapping[Hashable, tuple[int, float]]) -> Policy:
    """Replay's recorded placement (:class:`daskjobs.replay.run.Placed`) for the tasks dask
    has assigned to workers, with the rest pushed in batches and popped straight from the
    policy once every pinned task has started (it is told of 10^5 tasks, pins a few)."""
    from daskjobs.replay.run import Placed

    class Pinned(Placed):
        def push_many(self, tasks: Sequence[Any]) -> None:
            placed, taken = self.placed, self.taken
            rest = []
            for t in tasks:
                if t.tid in placed and t.tid not in taken:
                    self.push(t)
                else:
                    rest.append(t)
            self.others += len(rest)
            self.inner.push_many(rest)

        def pop(self, node: Any, now: float) -> Any:
            if self.ready:
                return super().pop(node, now)
            got = self.inner.pop(node, now)  # no pinned task waits: the policy's choice
            if got is not None:
                self.others -= 1
            return got

    return Pinned(inner, placement)


def _run(
    snap: Mapping[str, Any], built: Built, name: str | None, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """One simulation: each task's end and start, in ``built.tasks``' order."""
    from daskjobs.replay.run import PluginSpeeds

    sp = snap.get("speculation")
    spec: Speculation | None = None
    if sp:
        spec = SpeculationSettings(**{k: v for k, v in sp.items() if k != "enabled"}).policy()
    pol = _policy(snap, name)
    learns = pol.capabilities.learns_speeds
    if learns:
        _speeds_seeded(pol, built)
    run: Policy = _pinned(pol, built.placement) if built.placement else pol
    if spec is not None and not learns:
        wrapped = PluginSpeeds(run)
        _speeds_seeded(wrapped.learner, built)
        run = wrapped
    schedule = simulate(built.tasks, built.cluster, run, spec=spec, seed=seed)
    ends = np.asarray(schedule.ends)
    if len(ends) != len(built.tasks):  # (nothing is cached: no task is pruned)
        raise RuntimeError("the simulation lost tasks")
    return ends, np.asarray(schedule.starts)


def _computed(
    built: Built, ends: np.ndarray, central: Sequence[float], rng: np.random.Generator
) -> np.ndarray:
    """The draws of a large snapshot, computed from its central simulation instead of
    simulated (module docstring): for each of ``central``'s times (an end, a start) in
    each of :data:`SAMPLES` samples, that time scaled by the work that ended by it in
    the central run, its stage and team factors drawn (their work's sum moved as one) and
    its tasks' own errors summed (a normal of their variances, mean 0), over the
    cluster's capacity with each worker's slow-down drawn. ``ends``: each task's end in
    the central run. Rows: ``central``'s times; columns: the samples. Memory: (times + 1)
    x (stage, team) pairs, and samples x pairs."""
    times = np.asarray(central, dtype=float)
    work = np.fromiter((t.duration for t in built.tasks), float, len(built.tasks))
    # (stage, team) pairs: a stage's factor and its team's move the pair's work as one
    pair = built.stage * (int(built.team.max()) + 1) + built.team
    pairs, combo = np.unique(pair, return_inverse=True)
    k = len(pairs)
    weight = np.bincount(combo, weights=work, minlength=k)
    safe = np.where(weight > 0, weight, 1.0)
    stage_s = np.bincount(combo, weights=work * built.stage_sigma, minlength=k) / safe
    team_s = np.bincount(combo, weights=work * built.team_sigma, minlength=k) / safe
    pair_stage = np.zeros(k, dtype=np.int64)
    pair_team = np.zeros(k, dtype=np.int64)
    pair_stage[combo], pair_team[combo] = built.stage, built.team
    # the work of each pair that ended by each time: rows binned by the first time >= end
    order = np.argsort(times, kind="stable")
    sorted_times = times[order]
    slot = np.searchsorted(sorted_times, ends, side="left")
    q = len(times)
    done = np.bincount(slot * k + combo, weights=work, minlength=(q + 1) * k)
    done = np.cumsum(done.reshape(q + 1, k)[:q], axis=0)
    variance = work * work * np.expm1(built.sigma * built.sigma)
    spread = np.sqrt(np.cumsum(np.bincount(slot, weights=variance, minlength=q + 1)[:q]))
    m = max(min(SAMPLES, 4_000_000 // max(k, q, 1)), 100)
    z_stage = rng.standard_normal((int(built.stage.max()) + 1, m))
    z_team = rng.standard_normal((int(built.team.max()) + 1, m))
    factor = np.exp(stage_s[:, None] * z_stage[pair_stage] + team_s[:, None] * z_team[pair_team])
    total = done.sum(axis=1)
    moved = done @ factor + spread[:, None] * rng.standard_normal((q, m))
    ratio = np.where(total[:, None] > 0, moved / np.where(total > 0, total, 1.0)[:, None], 1.0)
    nodes = sorted(built.measured)
    belief = np.array([built.measured[j] for j in nodes])
    g = rng.standard_normal((max(built.worker_of.values(), default=0) + 1, m))
    sig = np.array([built.speed_sigma[j] for j in nodes])
    drawn = belief[:, None] * np.exp(sig[:, None] * g[[built.worker_of[j] for j in nodes]])
    capacity = (1.0 / belief).sum() / (1.0 / drawn).sum(axis=0)  # > 1: slower than believed
    out = np.empty((q, m))
    out[order] = sorted_times[:, None] * np.maximum(ratio, 0.0) * capacity[None, :]
    return out


def _quantiles(xs: Iterable[float]) -> Remaining:
    a = np.asarray(list(xs), dtype=float)
    if not len(a):
        return Remaining(0.0, 0.0, 0.0)
    p10, p50, p90 = np.quantile(a, [0.1, 0.5, 0.9])
    return Remaining(float(p10), float(p50), float(p90))


@dataclass(frozen=True)
class _Asked:
    """What a forecast answers about, as masks over the rows: the end of the tasks asked for
    (all of them without ``keys``), of each team and each sweep, and the expected start
    of the waiting tasks asked for by key (:data:`MAX_STARTS` of them at most)."""

    wanted: np.ndarray | None
    teams: dict[str, np.ndarray]
    sweeps: dict[str, np.ndarray]
    starts: list[int]

    @classmethod
    def of(cls, built: Built, keys: Iterable[Hashable] | None) -> _Asked:
        wanted: np.ndarray | None = None
        asked: list[int] = []  # the tasks asked for by key that wait: their expected start
        if keys is not None:
            ks = {str(k) for k in keys}
            wanted = np.array([t.tid in ks for t in built.tasks], dtype=bool)
            if len(ks) <= MAX_STARTS:
                running = set(built.running)
                asked = [i for i in np.flatnonzero(wanted).tolist() if i not in running]
        teams = np.array(built.teams, dtype=object)
        sweeps = np.array(built.sweeps, dtype=object)
        return cls(
            wanted,
            {t: teams == t for t in sorted(set(built.teams))},
            {s: sweeps == s for s in sorted({s for s in built.sweeps if s is not None})},
            asked,
        )

    def times(self, ends: np.ndarray, begins: np.ndarray) -> list[float]:
        """One simulation's answers, in order: the end of what was asked, each team's end,
        each sweep's, each asked task's start."""
        sel = ends if self.wanted is None else ends[self.wanted]
        out = [float(sel.max()) if len(sel) else 0.0]
        out += [float(ends[m].max()) for m in self.teams.values()]
        out += [float(ends[m].max()) for m in self.sweeps.values()]
        return out + [float(begins[i]) for i in self.starts]


def forecast_snapshot(
    snap: Mapping[str, Any],
    *,
    keys: Iterable[Hashable] | None = None,
    workers: int = 0,
    policy: str | None = None,
    draws: int = 30,
    seed: int = 0,
    budget: float | None = None,
    band: str = "auto",
) -> Forecast:
    """The forecast of a snapshot (what :func:`forecast` does once it has one)."""
    t0 = time.perf_counter()
    if snap.get("version") != 1:
        raise ValueError(f"unknown snapshot version {snap.get('version')!r} (this client: 1)")
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 0:
        raise ValueError(f"draws must be an integer >= 0 (0: the estimates only), got {draws!r}")
    if band not in BANDS:
        raise ValueError(f"band must be one of {', '.join(BANDS)}, got {band!r}")
    name = policy or snap["policy"]
    now = float(snap["time"])
    n = len(snap["tasks"]["key"])
    spec_on = bool(snap.get("speculation"))
    _policy(snap, policy)  # a policy not installed: the error, before any work
    if n == 0:
        zero = Remaining(0.0, 0.0, 0.0)
        return Forecast(zero, zero.at(now), {}, {}, 0, 0, len(snap["workers"]), name, spec_on,
                        0, seed, now, time.perf_counter() - t0, band="none")  # fmt: skip
    built = build(snap, workers)
    asked = _Asked.of(built, keys)
    rng = np.random.default_rng(seed)
    computed = draws > 1 and (band == "computed" or (band == "auto" and n * draws > SIMULATED))
    runs: list[list[float]] = []
    if computed:
        draw(built, None)
        ends, begins = _run(snap, built, policy, seed)
        got = _computed(built, ends, asked.times(ends, begins), rng)
        built.notes.append(COMPUTED.format(n=n))
    else:
        for d in range(max(draws, 1)):
            draw(built, rng if draws else None)
            runs.append(asked.times(*_run(snap, built, policy, seed + d)))
            if budget is not None and d >= 2 and time.perf_counter() - t0 > budget:
                break
        got = np.array(runs).T
    q = [_quantiles(row) for row in got]
    rem, k = q[0], 1
    teams = dict(zip(asked.teams, q[k : k + len(asked.teams)], strict=True))
    k += len(asked.teams)
    sweeps = dict(zip(asked.sweeps, q[k : k + len(asked.sweeps)], strict=True))
    k += len(asked.sweeps)
    starts = {str(built.tasks[i].tid): r for i, r in zip(asked.starts, q[k:], strict=True)}
    return Forecast(
        remaining=rem,
        end=rem.at(now),
        teams=teams,
        sweeps=sweeps,
        starts=starts,
        tasks=n,
        running=len(built.running),
        workers=built.cluster.nodes if built.cluster.cores_per_node > 1 else len(snap["workers"]),
        policy=name,
        speculation=spec_on,
        draws=(1 if computed else len(runs)) if draws else 0,
        seed=seed,
        time=now,
        seconds_taken=time.perf_counter() - t0,
        notes=tuple(built.notes),
        band="computed" if computed else "drawn" if draws else "none",
    )


def snapshot(client: Any, keys: Iterable[Hashable] | None = None, limit: int | None = None) -> Any:
    """The plugin's snapshot (:mod:`daskjobs.plugin.observe.snapshot`) through ``client``."""
    from daskjobs.plugin.client import _call

    ks = None if keys is None else [list(k) if isinstance(k, tuple) else k for k in keys]
    snap = _call(client, "daskjobs_snapshot", keys=ks, limit=limit)
    if "refused" in snap:
        raise RuntimeError(f"the scheduler refused the forecast's snapshot: {snap['refused']}")
    if "error" in snap:
        raise RuntimeError(snap["error"])
    return snap


def forecast(
    client: Any,
    keys: Iterable[Hashable] | None = None,
    *,
    workers: int = 0,
    policy: str | None = None,
    draws: int = 30,
    seed: int = 0,
    budget: float | None = None,
    band: str = "auto",
) -> Forecast:
    """When will the work on ``client``'s scheduler be done? (module docstring)

    ``keys``: the tasks to forecast the end of (default: every unfinished task; the
    others still compete for the workers). ``workers=+8`` / ``workers=-2``: the same
    forecast with eight more nominal workers, or two fewer; ``policy="lpt"``: under
    another registered policy. ``draws`` simulations with durations drawn from their
    bands (0: one, with the estimates as they are), seeded by ``seed``; ``budget``
    seconds: stop drawing once spent (after three draws at least). ``band``: ``auto``
    simulates each draw while tasks x draws is at most :data:`SIMULATED`, and beyond
    simulates once and computes the range from that run; ``drawn``, ``computed``: always
    the one, always the other.

    Raises ``RuntimeError`` if the scheduler does not run the daskjobs plugin, and
    :class:`PolicyNotInstalled` if it runs a policy this client does not have.
    """
    t0 = time.perf_counter()
    snap = snapshot(client)
    out = forecast_snapshot(
        snap,
        keys=keys,
        workers=workers,
        policy=policy,
        draws=draws,
        seed=seed,
        budget=budget,
        band=band,
    )
    return _with_taken(out, time.perf_counter() - t0)


def _with_taken(f: Forecast, seconds: float) -> Forecast:
    return dataclasses.replace(f, seconds_taken=seconds)
