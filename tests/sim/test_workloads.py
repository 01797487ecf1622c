"""The SPEC's reference workloads: shape, calibration and reproducibility."""

from __future__ import annotations

import math

import numpy as np
import pytest

from daskjobs.sim import (
    FIFO,
    LPT,
    Cluster,
    Speculation,
    lower_bound,
    simulate,
    speed_bound,
    workloads,
)

LONG = 30 * 15 * 60.0  # 7.5 h


@pytest.fixture(scope="module")
def chapter0() -> workloads.Workload:
    return workloads.chapter(0)


# -- chapter --------------------------------------------------------------------------------


def test_chapter_same_seed_same_tasks():
    a, b = workloads.chapter(5), workloads.chapter(5)
    assert a.tasks == b.tasks
    assert a.cluster == b.cluster
    assert a.spec == b.spec
    assert a.seed == b.seed == 5


def test_chapter_different_seed_different_durations():
    a, b = workloads.chapter(0), workloads.chapter(1)
    assert [t.duration for t in a.tasks] != [t.duration for t in b.tasks]


def test_chapter_has_ten_thousand_unique_one_core_tasks(chapter0):
    tasks = chapter0.tasks
    assert len(tasks) == 10_000
    assert len({t.tid for t in tasks}) == 10_000
    assert all(t.cores == 1 and t.deps == () and t.submit == 0.0 for t in tasks)
    assert {t.team for t in tasks} == {"default"}


def test_chapter_forty_long_tasks_submitted_last(chapter0):
    tasks = chapter0.tasks
    assert [t.duration for t in tasks[-40:]] == [LONG] * 40 == [27_000.0] * 40
    assert all(t.duration < LONG for t in tasks[:-40])
    # a grid submits its largest parameters last: the 40 longest are the last 40
    longest = sorted(range(len(tasks)), key=lambda i: tasks[i].duration)[-40:]
    assert sorted(longest) == list(range(9_960, 10_000))


def test_chapter_short_durations_log_normal_median_15_min(chapter0):
    d = np.array([t.duration for t in chapter0.tasks[:-40]])
    assert np.median(d) == pytest.approx(900.0, rel=0.03)
    assert np.std(np.log(d)) == pytest.approx(0.76, abs=0.02)
    assert d.min() > 0


def test_chapter_estimates_off_by_exp_point_three_z(chapter0):
    ratio = np.log([t.estimate / t.duration for t in chapter0.tasks])
    assert np.std(ratio) == pytest.approx(0.3, abs=0.01)
    assert abs(np.mean(ratio)) < 0.01
    assert not np.allclose(ratio, 0)  # the policy never sees the truth


def test_chapter_total_work_near_3649_core_hours(chapter0):
    # expected: 9960 x 900 s x exp(0.76^2 / 2) + 40 x 7.5 h = 3624 core-hours; one
    # draw's sum has a standard deviation of about 0.9%
    expected = (9_960 * 900 * math.exp(0.76**2 / 2) + 40 * LONG) / 3600
    assert expected == pytest.approx(3649, rel=0.01)
    assert chapter0.work / 3600 == pytest.approx(3649, rel=0.02)
    works = [workloads.chapter(s).work / 3600 for s in range(1, 6)]
    assert all(w == pytest.approx(3649, rel=0.03) for w in works)
    assert np.mean(works) == pytest.approx(expected, rel=0.015)


def test_chapter_work_property_counts_cores():
    wl = workloads.chapter(0, n=10, n_long=0)
    assert wl.work == sum(t.duration for t in wl.tasks)


def test_chapter_cluster_is_24_by_16_with_last_node_4x_slow(chapter0):
    c = chapter0.cluster
    assert (c.nodes, c.cores_per_node, c.total_cores) == (24, 16, 384)
    assert dict(c.slow) == {23: 4.0}
    assert c.speeds == (1.0,) * 23 + (4.0,)
    assert c.effective_cores == 23 * 16 + 16 / 4 == 372
    assert c.failure_rate == 0.01
    assert chapter0.spec == Speculation(late_factor=2.5, ahead="always")


def test_chapter_bounds_match_spec(chapter0):
    assert lower_bound(chapter0.tasks, 384) / 3600 == pytest.approx(9.50, rel=0.02)
    assert speed_bound(chapter0.tasks, chapter0.cluster) / 3600 == pytest.approx(9.81, rel=0.02)
    # the slow node costs 384 / 372 - 1 = 3.2% of the bound
    ratio = speed_bound(chapter0.tasks, chapter0.cluster) / lower_bound(chapter0.tasks, 384)
    assert ratio == pytest.approx(384 / 372, rel=1e-9)


def test_chapter_slow_node_options():
    assert dict(workloads.chapter(0, n=10, n_long=1, slow_node=0).cluster.slow) == {0: 4.0}
    assert workloads.chapter(0, n=10, n_long=1, slow_factor=1.0).cluster.slow is None
    small = workloads.chapter(0, n=10, n_long=1, nodes=3, cores_per_node=2, failure_rate=0.0)
    assert small.cluster == Cluster(3, 2, slow={2: 4.0})


def test_chapter_sizes_adjustable():
    wl = workloads.chapter(3, n=50, n_long=5, long_factor=10.0, median=60.0, prefix="x")
    assert len(wl.tasks) == 50
    assert [t.duration for t in wl.tasks[-5:]] == [600.0] * 5
    assert wl.tasks[0].tid == "x-0"


@pytest.mark.parametrize("n_long", [-1, 11])
def test_chapter_rejects_bad_n_long(n_long):
    with pytest.raises(ValueError, match=r"n_long must be in \[0, n\]"):
        workloads.chapter(0, n=10, n_long=n_long)


def test_chapter_policies_rank_as_published(chapter0):
    # FIFO runs the 7.5 h tasks last; LPT first. Ordering, not exact values.
    wl = chapter0
    lpt = simulate(wl.tasks, wl.cluster, LPT(), spec=wl.spec, seed=wl.seed)
    fifo = simulate(wl.tasks, wl.cluster, FIFO(), spec=wl.spec, seed=wl.seed)
    bound = speed_bound(wl.tasks, wl.cluster)
    assert bound <= lpt.makespan < 1.15 * bound
    assert fifo.makespan > 1.4 * lpt.makespan
    # waste 2.5-3.6% of the sweep in the published runs; same magnitude here
    assert 0.01 < lpt.waste / wl.work < 0.06


# -- fairshare ------------------------------------------------------------------------------


def test_fairshare_adds_500_team_b_tasks_an_hour_later():
    wl = workloads.fairshare(0)
    a = [t for t in wl.tasks if t.team == "a"]
    b = [t for t in wl.tasks if t.team == "b"]
    assert len(wl.tasks) == 10_500
    assert (len(a), len(b)) == (10_000, 500)
    assert wl.tasks[-500:] == b
    assert all(t.submit == 3600.0 for t in b)
    assert all(t.submit == 0.0 for t in a)
    assert len({t.tid for t in wl.tasks}) == 10_500
    assert np.median([t.duration for t in b]) == pytest.approx(900.0, rel=0.1)
    assert all(t.duration < LONG for t in b)


def test_fairshare_team_a_is_the_chapter_sweep():
    wl = workloads.fairshare(2)
    base = workloads.chapter(2)
    a = [t for t in wl.tasks if t.team == "a"]
    assert [(t.duration, t.estimate) for t in a] == [(t.duration, t.estimate) for t in base.tasks]
    assert wl.cluster == base.cluster
    assert wl.spec == base.spec


def test_fairshare_reproducible_and_resizable():
    kw = dict(n=100, n_long=2, nodes=2, cores_per_node=4, n_b=7, b_submit=60.0)
    a, b = workloads.fairshare(1, **kw), workloads.fairshare(1, **kw)
    assert a.tasks == b.tasks
    assert len(a.tasks) == 107
    assert a.cluster.nodes == 2
    assert {t.submit for t in a.tasks if t.team == "b"} == {60.0}


# -- feature graph --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph() -> workloads.Workload:
    return workloads.feature_graph(0)


def test_feature_graph_has_100_features_each_read_by_100(graph):
    features = [t for t in graph.tasks if t.tid.startswith("feat-")]
    backtests = [t for t in graph.tasks if not t.tid.startswith("feat-")]
    assert len(features) == 100
    assert len(backtests) == 10_000
    assert all(t.duration == 1200.0 and t.deps == () for t in features)
    readers: dict[str, int] = {}
    for t in backtests:
        assert len(t.deps) == 1
        readers[t.deps[0]] = readers.get(t.deps[0], 0) + 1
    assert readers == {f"feat-{k}": 100 for k in range(100)}
    assert graph.cache == frozenset()
    assert graph.name == "graph"


def test_feature_graph_backtests_are_the_chapter_sweep(graph):
    base = workloads.chapter(0)
    backtests = graph.tasks[100:]
    assert [(t.tid, t.duration, t.estimate) for t in backtests] == [
        (t.tid, t.duration, t.estimate) for t in base.tasks
    ]
    assert graph.cluster == base.cluster


def test_feature_graph_recompute_adds_feature_time_to_every_backtest():
    rec = workloads.feature_graph(0, mode="recompute")
    base = workloads.chapter(0)
    assert len(rec.tasks) == 10_000
    assert all(t.deps == () for t in rec.tasks)
    assert [t.duration for t in rec.tasks] == [t.duration + 1200.0 for t in base.tasks]
    assert [t.estimate for t in rec.tasks] == [t.estimate + 1200.0 for t in base.tasks]
    # SPEC: 6,922 core-hours recomputing; as a graph, the sweep plus 100 x 20 min
    assert rec.work / 3600 == pytest.approx(6922, rel=0.02)
    graph_work = workloads.feature_graph(0).work
    assert graph_work == pytest.approx(base.work + 100 * 1200.0, rel=1e-12)
    assert rec.work - graph_work == pytest.approx(9_900 * 1200.0, rel=1e-9)


def test_feature_graph_cached_mode_caches_the_features():
    wl = workloads.feature_graph(0, mode="cached")
    assert wl.cache == frozenset(f"feat-{k}" for k in range(100))
    assert [t.tid for t in wl.tasks] == [t.tid for t in workloads.feature_graph(0).tasks]


def test_feature_graph_cached_run_skips_features():
    kw = dict(n_features=5, readers=8, nodes=2, cores_per_node=4, n_long=2)
    graph = workloads.feature_graph(0, **kw)
    cached = workloads.feature_graph(0, mode="cached", **kw)
    g = simulate(graph.tasks, graph.cluster, LPT(), cache=graph.cache, seed=graph.seed)
    c = simulate(cached.tasks, cached.cluster, LPT(), cache=cached.cache, seed=cached.seed)
    assert c.cache_hits == 5
    assert g.cache_hits == 0
    assert not any(a.task.tid.startswith("feat-") for a in c.attempts)
    assert c.pruned == []
    assert {r.tid for r in c.tasks if not r.cached} == {t.tid for t in cached.tasks[5:]}
    assert c.busy < g.busy


def test_feature_graph_rejects_unknown_mode():
    with pytest.raises(ValueError, match=r"mode must be 'recompute', 'graph' or 'cached'"):
        workloads.feature_graph(0, mode="inline")


# -- sweeps whose durations follow their parameters -------------------------------------------


@pytest.mark.parametrize(
    "make", [workloads.lookback_grid, workloads.chapter_params, workloads.two_stage]
)
def test_parameter_sweeps_are_seeded_and_carry_stage_and_params(make):
    a, b, c = make(0), make(0), make(1)
    assert [t.duration for t in a.tasks] == [t.duration for t in b.tasks]
    assert [t.duration for t in a.tasks] != [t.duration for t in c.tasks]
    assert all(t.stage and t.params for t in a.tasks)
    bare = workloads.without_estimates(a, default=2.0)
    assert all(t.estimate == 2.0 and not t.estimated for t in bare.tasks)
    assert [t.duration for t in bare.tasks] == [t.duration for t in a.tasks]


def test_the_durations_follow_the_parameters_and_the_longest_come_last():
    from daskjobs.policies.durations import DurationModels, within_factor

    wl = workloads.chapter_params(0)
    longest = sorted(wl.tasks, key=lambda t: t.duration)[-8:]
    assert {t.tid for t in longest} == {t.tid for t in wl.tasks[-8:]}
    # a model fitted on a twentieth of the tasks predicts the rest within 2x far more
    # often than the stage median does
    models = DurationModels()
    for t in wl.tasks[::20]:
        models.observe(t.stage, t.params, t.duration)
    rest = [t for i, t in enumerate(wl.tasks) if i % 20]
    predicted = [models.predict("backtest", t.params).seconds for t in rest]
    median = float(np.median([t.duration for t in wl.tasks[::20]]))
    truth = [t.duration for t in rest]
    assert within_factor(predicted, truth) > 0.9 > within_factor([median] * len(rest), truth)
