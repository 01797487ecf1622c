"""Invariants of the simulator on random task graphs (hypothesis).

Whatever the graph, cluster, policy, speculation, failures or cache, a
schedule must respect the bounds, run every task exactly once, never put two
attempts on one core at once, respect dependencies and submission times, and
be reproducible from its seed.
"""

from __future__ import annotations

import functools
import os
import random
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daskjobs.sim import (
    FIFO,
    LPT,
    Cluster,
    CriticalPath,
    FairShare,
    NodeAware,
    Policy,
    Schedule,
    Speculation,
    Task,
    WorkStealing,
    lower_bound,
    simulate,
    speed_bound,
    utilisation,
)

# DASKJOBS_HYPOTHESIS_EXAMPLES=5000 for a deep run; 150 keeps the file under ~25 CPU-s
SETTINGS = settings(
    max_examples=int(os.environ.get("DASKJOBS_HYPOTHESIS_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

POLICIES = ("fifo", "lpt", "critical-path", "work-stealing", "fair-share", "fair-share-decay")
POLICIES_ALL = (*POLICIES, "node-aware")
EPS = 1e-9


def make_policy(name: str) -> Policy:
    if name == "fifo":
        return FIFO()
    if name == "lpt":
        return LPT()
    if name == "critical-path":
        return CriticalPath()
    if name == "work-stealing":
        return WorkStealing()
    if name == "fair-share":
        return FairShare({"a": 1, "b": 2})
    if name == "fair-share-decay":
        return FairShare({"a": 3, "b": 1}, half_life=5.0, within="lpt")
    if name == "node-aware":
        return NodeAware()
    raise AssertionError(name)


@dataclass
class Scenario:
    tasks: list[Task]
    cluster: Cluster
    policy: str
    spec: Speculation | None = None
    cache: set[str] = field(default_factory=set)
    seed: int = 0

    def run(self) -> Schedule:
        return simulate(
            self.tasks,
            self.cluster,
            make_policy(self.policy),
            spec=self.spec,
            cache=self.cache or None,
            seed=self.seed,
        )


# Seconds: zero, whole numbers (many exact ties) and arbitrary floats down to
# subnormal sizes (a tiny estimate once made NodeAware's learned speed overflow).
durations = st.one_of(
    st.just(0.0),
    st.integers(1, 10).map(float),
    st.floats(0.0, 20.0, allow_nan=False, allow_infinity=False),
)


# The strategies the composites draw from are built once, not at every draw (hypothesis
# validates and labels each new strategy: a quarter of this file's time); the examples
# drawn are the same. Most of what is left is hypothesis drawing: a simulation of these
# graphs takes a tenth of an example's time.
_INTS = functools.cache(st.integers)
_SAMPLED = functools.cache(st.sampled_from)  # of a tuple
_DEPS = functools.cache(lambda i: st.lists(_INTS(0, i - 1), unique=True, max_size=3))
_ESTIMATES = st.one_of(st.none(), durations)
_SUBMITS = st.one_of(st.just(0.0), durations)
_TEAMS = st.sampled_from(["a", "b"])
_SLOWS = st.sampled_from([0.5, 1.5, 2.0, 4.0, 10.0])
_RATES = st.sampled_from([0.0, 0.0, 0.2, 0.5])


@st.composite
def clusters(draw: st.DrawFn, slow: bool | None = None) -> Cluster:
    nodes = draw(_INTS(1, 3))
    cpn = draw(_INTS(1, 3))
    has_slow = draw(st.booleans()) if slow is None else slow
    slow_map = None
    if has_slow:
        node = draw(_INTS(0, nodes - 1))
        slow_map = {node: draw(_SLOWS)}
    rate = draw(_RATES)
    return Cluster(nodes, cpn, slow=slow_map, failure_rate=rate)


@st.composite
def task_lists(
    draw: st.DrawFn, cores_per_node: int, max_tasks: int = 12, submit_zero: bool = False
) -> list[Task]:
    n = draw(_INTS(1, max_tasks))
    cores = _INTS(1, cores_per_node)
    tasks = []
    for i in range(n):
        deps = draw(_DEPS(i)) if i else []
        estimate = draw(_ESTIMATES)
        submit = 0.0 if submit_zero else draw(_SUBMITS)
        tasks.append(
            Task(
                f"t{i}",
                draw(durations),
                estimate,
                cores=draw(cores),
                deps=tuple(f"t{d}" for d in deps),
                team=draw(_TEAMS),
                submit=submit,
                speculate=draw(st.booleans()),
            )
        )
    return tasks


specs = st.one_of(
    st.none(),
    st.builds(
        Speculation,
        late_factor=st.sampled_from([1.5, 2.0, 2.5]),
        min_runtime=st.sampled_from([0.0, 1.0]),
        max_fraction=st.sampled_from([0.1, 0.5, 1.0]),
    ),
)


@st.composite
def scenarios(
    draw: st.DrawFn,
    policies: tuple[str, ...] = POLICIES_ALL,
    cache: bool = True,
    submit_zero: bool = False,
    slow: bool | None = None,
) -> Scenario:
    cluster = draw(clusters(slow))
    tasks = draw(task_lists(cluster.cores_per_node, submit_zero=submit_zero))
    cached: set[str] = set()
    if cache:
        cached = set(draw(st.lists(st.sampled_from([t.tid for t in tasks]), max_size=3)))
    return Scenario(
        tasks=tasks,
        cluster=cluster,
        policy=draw(_SAMPLED(policies)),
        spec=draw(specs),
        cache=cached,
        seed=draw(_INTS(0, 2**16)),
    )


def effective_tasks(s: Schedule) -> list[Task]:
    """The simulated tasks (pruned ones dropped), a cache hit counting as no work."""
    out = []
    for t, r in zip(s.task_list, s.tasks, strict=True):
        if r.cached:
            out.append(Task(t.tid, 0.0, cores=t.cores, submit=t.submit))
        else:
            out.append(t)
    return out


def attempts_by_task(s: Schedule) -> dict:
    by: dict = defaultdict(list)
    for a in s.attempts:
        by[a.task.tid].append(a)
    return by


# -- bounds --------------------------------------------------------------------------------


@pytest.mark.slow
@SETTINGS
@given(scenarios())
def test_last_end_is_at_least_the_speed_weighted_bound(sc: Scenario):
    s = sc.run()
    last_end = max(r.end for r in s.tasks)
    # the bound counts from time zero, so compare the last end (not the makespan)
    assert last_end >= speed_bound(effective_tasks(s), sc.cluster) - EPS
    if not sc.cluster.slow or min(sc.cluster.speeds) >= 1.0:
        assert last_end >= lower_bound(effective_tasks(s), sc.cluster.total_cores) - EPS


@SETTINGS
@given(scenarios(cache=False, submit_zero=True))
def test_makespan_is_at_least_the_bound_when_all_submitted_at_zero(sc: Scenario):
    s = sc.run()
    assert min(r.start for r in s.tasks) == 0.0
    assert s.makespan >= speed_bound(sc.tasks, sc.cluster) - EPS


@pytest.mark.slow
@SETTINGS
@given(scenarios())
def test_each_task_ends_after_its_inputs_plus_its_own_run_time(sc: Scenario):
    s = sc.run()
    fastest = min(sc.cluster.speeds)
    end = {r.tid: r.end for r in s.tasks}
    for t, r in zip(s.task_list, s.tasks, strict=True):
        if r.cached:
            continue
        ready = max([t.submit, *(end[d] for d in t.deps)])
        assert r.end >= ready + t.duration * fastest - EPS


# -- every task once, no double booking -----------------------------------------------------


@pytest.mark.slow
@SETTINGS
@given(scenarios())
def test_every_task_done_exactly_once(sc: Scenario):
    s = sc.run()
    by = attempts_by_task(s)
    cached = {r.tid for r in s.tasks if r.cached}
    assert cached == sc.cache & {t.tid for t in s.task_list}
    assert {r.tid for r in s.tasks} | set(s.pruned) == {t.tid for t in sc.tasks}
    for r in s.tasks:
        mine = by.get(r.tid, [])
        if r.cached:
            assert mine == []
            assert r.start == r.end == r.submit
            continue
        outcomes = [a.outcome for a in mine]
        assert outcomes.count("done") == 1, (r.tid, outcomes)
        assert set(outcomes) <= {"done", "failed", "killed"}
        winner = next(a for a in mine if a.outcome == "done")
        assert r.end == winner.end
        assert r.node == winner.node
        assert r.start == min(a.start for a in mine)
        assert r.attempts == len(mine)
        # nothing of a task runs past its winning copy
        assert all(a.end <= winner.end for a in mine)
    for p in s.pruned:
        assert p not in by


@pytest.mark.slow
@SETTINGS
@given(scenarios())
def test_no_core_runs_two_attempts_at_once(sc: Scenario):
    s = sc.run()
    cpn = sc.cluster.cores_per_node
    per_core: dict[int, list] = defaultdict(list)
    for a in s.attempts:
        assert len(a.cores) == a.task.cores == len(set(a.cores))
        assert all(a.node * cpn <= c < (a.node + 1) * cpn for c in a.cores)
        assert a.start <= a.end
        for c in a.cores:
            per_core[c].append(a)
    for runs in per_core.values():
        runs.sort(key=lambda a: (a.start, a.end))
        for prev, nxt in pairwise(runs):
            assert prev.end <= nxt.start, (prev, nxt)


@pytest.mark.slow
@SETTINGS
@given(scenarios())
def test_dependencies_and_submission_times_respected(sc: Scenario):
    s = sc.run()
    end = {r.tid: r.end for r in s.tasks}
    for a in s.attempts:
        assert a.start >= a.task.submit
        for d in a.task.deps:
            assert a.start >= end[d], (a, d, end[d])


@pytest.mark.slow
@SETTINGS
@given(scenarios())
def test_attempt_run_times_follow_node_speed(sc: Scenario):
    s = sc.run()
    for a in s.attempts:
        full = a.task.duration * sc.cluster.speeds[a.node]
        if a.outcome == "done":
            assert abs((a.end - a.start) - full) <= EPS * max(1.0, full)
        else:
            assert a.end - a.start <= full + EPS


@pytest.mark.slow
@SETTINGS
@given(scenarios())
def test_backups_and_failures_only_when_enabled(sc: Scenario):
    s = sc.run()
    by = attempts_by_task(s)
    if sc.spec is None:
        assert s.backups_launched == 0
        assert not any(a.backup or a.outcome == "killed" for a in s.attempts)
    if sc.cluster.failure_rate == 0:
        assert s.failures == 0
    assert s.backups_launched == sum(a.backup for a in s.attempts)
    assert s.backups_won == sum(a.backup and a.outcome == "done" for a in s.attempts)
    for mine in by.values():
        for b in mine:
            if not b.backup:
                continue
            assert b.task.speculate
            # a backup runs on another node than any copy running beside it
            for a in mine:
                if a is not b and a.start <= b.start < a.end:
                    assert a.node != b.node
    waste = sum((a.end - a.start) * len(a.cores) for a in s.attempts if a.outcome != "done")
    assert abs(s.waste - waste) <= EPS * max(1.0, waste)


# -- determinism and completion -------------------------------------------------------------


def fingerprint(s: Schedule) -> list[tuple]:
    return [
        (a.aid, a.task.tid, a.node, a.cores, a.start, a.end, a.outcome, a.backup)
        for a in s.attempts
    ]


@pytest.mark.slow
@SETTINGS
@given(scenarios())
def test_same_seed_gives_identical_schedule(sc: Scenario):
    a, b = sc.run(), sc.run()
    assert fingerprint(a) == fingerprint(b)
    assert a.tasks == b.tasks
    assert a.pruned == b.pruned


@pytest.mark.slow
@SETTINGS
@given(scenarios(policies=POLICIES_ALL))
def test_every_policy_finishes_the_run(sc: Scenario):
    s = sc.run()  # raises RuntimeError if a policy left runnable work unscheduled
    assert len(s.tasks) + len(s.pruned) == len(sc.tasks)
    assert all(r.end >= r.start >= r.submit for r in s.tasks)


# -- extreme but valid inputs ------------------------------------------------------------------


def tiny_estimate_tasks() -> list[Task]:
    return [Task("t0", 1.0, 1e-221, team="a"), *(Task(f"z{i}", 0.0, team="a") for i in range(4))]


@pytest.mark.parametrize("policy", POLICIES)
def test_tiny_estimates_are_accepted(policy: str):
    s = simulate(tiny_estimate_tasks(), Cluster(1, 1), make_policy(policy))
    assert s.makespan == 1.0


def test_tiny_estimates_are_accepted_by_node_aware():
    s = simulate(tiny_estimate_tasks(), Cluster(1, 1), NodeAware())
    assert s.makespan == 1.0


@pytest.mark.slow
@SETTINGS
@given(scenarios())
def test_retry_bound_is_a_bound(sc: Scenario):
    s = sc.run()
    assert max(r.end for r in s.tasks) >= s.retry_bound - EPS


@st.composite
def slow_cluster_scenarios(draw: st.DrawFn) -> Scenario:
    """Bigger graphs on clusters with a slow node: where learning policies may idle."""
    nodes = draw(_INTS(2, 4))
    cpn = draw(_INTS(1, 4))
    slow = {draw(_INTS(0, nodes - 1)): draw(_SAMPLED((2.0, 4.0, 10.0)))}
    cluster = Cluster(nodes, cpn, slow=slow, failure_rate=draw(_SAMPLED((0.0, 0.1))))
    tasks = draw(task_lists(cpn, max_tasks=40))
    return Scenario(
        tasks=tasks,
        cluster=cluster,
        policy=draw(_SAMPLED(POLICIES_ALL)),
        spec=draw(specs),
        seed=draw(_INTS(0, 2**16)),
    )


@pytest.mark.slow
@SETTINGS
@given(slow_cluster_scenarios())
def test_bigger_graphs_on_slow_clusters_finish_within_bounds(sc: Scenario):
    s = sc.run()
    assert len(s.tasks) == len(sc.tasks)
    assert max(r.end for r in s.tasks) >= speed_bound(sc.tasks, sc.cluster) - EPS
    by = attempts_by_task(s)
    assert all([a.outcome for a in by[t.tid]].count("done") == 1 for t in sc.tasks)


@pytest.mark.slow
@SETTINGS
@given(scenarios())
def test_utilisation_never_exceeds_the_cluster(sc: Scenario):
    s = sc.run()
    _, busy = utilisation(s, step=0.5)
    assert busy.min() >= 0
    assert busy.max() <= sc.cluster.total_cores


# -- batch pushes: the sorted-run fast path pops exactly as single pushes ---------------------


HEAP_POLICIES = {"fifo": FIFO, "lpt": LPT, "critical-path": CriticalPath}


@st.composite
def batch_ops(draw: st.DrawFn) -> tuple[list[Task], list[tuple[str, object]]]:
    """A batch big enough for the run path (>= 256), then pops and pushes interleaved.

    Drawn from a seeded ``random.Random`` (cheap for hundreds of tasks; hypothesis
    still varies and replays the seed and the sizes)."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    ties = [1.0, 2.0, 3.0]  # estimates: many ties
    n = draw(st.integers(256, 320))
    tasks = [
        Task(
            f"t{i}",
            1.0,
            rng.choice(ties),
            cores=rng.choice([1, 1, 1, 2, 3]),
            submit=rng.choice([0.0, 0.0, 1.0]),
        )
        for i in range(n)
    ]
    ops: list[tuple[str, object]] = []
    for k in range(draw(st.integers(0, 400))):
        r = rng.random()
        if r < 0.2:
            ops.append(("push", Task(f"late{k}", 1.0, rng.choice(ties), cores=rng.randint(1, 3))))
        elif r < 0.22:
            ops.append(("batch", [Task(f"b{k}-{j}", 1.0, rng.choice(ties)) for j in range(260)]))
        else:
            ops.append(("pop", rng.randint(1, 3)))
    return tasks, ops


@dataclass
class _Free:
    free: int
    index: int = 0


@pytest.mark.slow
@SETTINGS
@given(batch_ops(), st.sampled_from(sorted(HEAP_POLICIES)))
def test_push_many_pops_in_the_same_order_as_single_pushes(case, name: str):
    tasks, ops = case
    fast, slow = HEAP_POLICIES[name](), HEAP_POLICIES[name]()
    for p in (fast, slow):
        p.add_graph(tasks)
    fast.push_many(tasks)
    for t in tasks:
        slow.push(t)

    def pops(free: int) -> tuple:
        a = fast.pop(_Free(free), 0.0)
        b = slow.pop(_Free(free), 0.0)
        return (a.tid if a else None), (b.tid if b else None)

    for op, arg in ops:
        if op == "pop":
            got_fast, got_slow = pops(arg)  # type: ignore[arg-type]
            assert got_fast == got_slow
        elif op == "push":
            fast.push(arg)  # type: ignore[arg-type]
            slow.push(arg)  # type: ignore[arg-type]
        else:
            fast.add_graph(arg)  # type: ignore[arg-type]
            slow.add_graph(arg)  # type: ignore[arg-type]
            fast.push_many(arg)  # type: ignore[arg-type]
            for t in arg:  # type: ignore[attr-defined]
                slow.push(t)
        assert len(fast) == len(slow)
    while len(slow):
        got_fast, got_slow = pops(3)
        assert got_fast == got_slow
    assert len(fast) == 0


class _OneByOne(LPT):
    """LPT without the batch fast path."""

    def push_many(self, tasks):  # type: ignore[no-untyped-def]
        for t in tasks:
            self.push(t)


def test_batch_fast_path_gives_identical_simulation():
    from daskjobs.sim import workloads

    wl = workloads.chapter(4, n=700, n_long=6, nodes=3, cores_per_node=4, failure_rate=0.05)
    a = simulate(wl.tasks, wl.cluster, LPT(), spec=wl.spec, seed=wl.seed)
    b = simulate(wl.tasks, wl.cluster, _OneByOne(), spec=wl.spec, seed=wl.seed)
    assert a.failures > 0
    assert fingerprint(a) == fingerprint(b)


# -- speculation rules ------------------------------------------------------------------------


@pytest.mark.slow
@SETTINGS
@given(scenarios(policies=POLICIES_ALL))
def test_concurrent_backups_stay_within_the_cap(sc: Scenario):
    s = sc.run()
    if sc.spec is None:
        return
    cap = sc.spec.cap(sc.cluster.total_cores)
    backups = [a for a in s.attempts if a.backup]
    for b in backups:
        # backups running at the moment b starts (b included)
        assert sum(1 for x in backups if x.start <= b.start < x.end or x is b) <= cap


@pytest.mark.slow
@SETTINGS
@given(scenarios(policies=POLICIES))
def test_backup_starts_no_earlier_than_the_lateness_deadline(sc: Scenario):
    # these policies never learn speeds nor call attempts urgent: the deadline is
    # start + max(min_runtime, late_factor x estimate)
    s = sc.run()
    if sc.spec is None:
        return
    by = attempts_by_task(s)
    for mine in by.values():
        for b in mine:
            if not b.backup:
                continue
            primaries = [a for a in mine if not a.backup and a.start <= b.start < a.end]
            assert len(primaries) == 1, (b, mine)
            p = primaries[0]
            deadline = sc.spec.deadline(p.start, p.task.estimate)
            assert b.start >= deadline - EPS


# -- the event calendar ----------------------------------------------------------------------
# The engine files events in buckets of simulated time (engine._PER_BUCKET events of a busy
# cluster each) and sorts a bucket once it is reached. The width is a cost setting only:
# buckets a millionth of an event wide (a bucket per event), one event, the default, or
# every event of the run in one bucket must all give the same run, attempt by attempt.
# (tests/sim/test_sim_golden.py pins the default width's runs themselves, ties included.)
CALENDAR_WIDTHS = (1e-6, 1.0, 64.0, 1e12)


def run_with_width(per_bucket: float, *args, **kwargs) -> tuple:
    from unittest import mock

    from daskjobs.sim import engine

    with mock.patch.object(engine, "_PER_BUCKET", per_bucket):
        s = simulate(*args, **kwargs)
    return fingerprint(s), s.events, s.backups_launched, s.backups_won


@pytest.mark.slow
@SETTINGS
@given(scenarios(policies=POLICIES_ALL), st.sampled_from(CALENDAR_WIDTHS))
def test_the_event_calendars_width_never_changes_a_run(sc: Scenario, per_bucket: float):
    args = (sc.tasks, sc.cluster)
    kwargs = {"spec": sc.spec, "cache": sc.cache or None, "seed": sc.seed}
    default = run_with_width(64.0, *args, make_policy(sc.policy), **kwargs)
    assert run_with_width(per_bucket, *args, make_policy(sc.policy), **kwargs) == default


@pytest.mark.parametrize("interval", [0.0, 0.05])
@pytest.mark.parametrize("policy", ["fifo", "node-aware"])
def test_the_event_calendars_width_never_changes_a_chapter_run(policy: str, interval: float):
    """A sweep with a slow node, failures, backups (judged at once or on a periodic check),
    a dispatcher and a second graph submitted mid-run: the same run at every width."""
    from dataclasses import replace

    from daskjobs.sim import workloads

    w = workloads.chapter(3, n=1500, n_long=8, median=0.1, nodes=4, cores_per_node=8, slow_node=1)
    late = [replace(t, tid=f"late-{t.tid}", submit=1.5) for t in w.tasks[:300]]
    cluster = Cluster(4, 8, slow={1: 4.0}, failure_rate=0.05, overhead=0.002, dispatch_rate=900)
    spec = Speculation(late_factor=2.0, min_runtime=0.05, interval=interval)
    runs = {
        width: run_with_width(
            width, w.tasks + late, cluster, make_policy(policy), spec=spec, seed=7
        )
        for width in CALENDAR_WIDTHS
    }
    fingerprints = list(runs.values())
    assert fingerprints[0][1] > 1800  # events: every task ran, with retries and copies
    assert fingerprints[0][2] > 0  # copies were launched
    assert all(f == fingerprints[0] for f in fingerprints)


def test_tasks_of_subnormal_length_get_a_calendar_they_fit():
    """Buckets sized from a mean run of 5e-324 s would number a time of seconds past
    the largest float; the width has a floor, and such a run completes as any other."""
    tasks = [Task(f"t{i}", 5e-324, submit=20.0 * (i % 3)) for i in range(20)]
    s = simulate(tasks, Cluster(2, 2), FIFO())
    assert s.events == 20
    assert max(r.end for r in s.tasks) == 40.0
