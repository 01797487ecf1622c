"""Duration models over a stage's parameters (daskjobs.policies.durations)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from daskjobs.policies.durations import (
    REFIT_EVERY,
    RERANK_VISITS,
    WINDOW,
    DurationModels,
    StageModel,
    within_factor,
)


def noisy(rng: np.random.Generator, seconds: float, sigma: float = 0.2) -> float:
    return float(seconds * math.exp(sigma * rng.standard_normal()))


def test_a_duration_proportional_to_a_parameter_is_learned_and_extrapolated():
    rng = np.random.default_rng(1)
    m = StageModel()
    for _ in range(3):
        for lookback in (10, 20, 40, 80, 160):
            m.observe(
                {"lookback": lookback, "seed": int(rng.integers(100))}, noisy(rng, 0.01 * lookback)
            )
    for lookback, truth in ((10, 0.1), (160, 1.6), (640, 6.4)):
        p = m.predict({"lookback": lookback, "seed": 7})
        assert p is not None and p.source == "model"
        assert truth / 1.5 < p.seconds < truth * 1.5, (lookback, p)
        assert p.low <= p.seconds <= p.high
    # the stage median would put the largest lookback 4x too low: the model ranks it first
    big, small = m.predict({"lookback": 640}), m.predict({"lookback": 10})
    assert big is not None and small is not None and big.seconds > 20 * small.seconds


def test_categorical_effects():
    rng = np.random.default_rng(2)
    m = StageModel()
    for _ in range(6):
        m.observe({"universe": "sp500"}, noisy(rng, 1.0, 0.1))
        m.observe({"universe": "russell3000"}, noisy(rng, 8.0, 0.1))
    a = m.predict({"universe": "sp500"})
    b = m.predict({"universe": "russell3000"})
    assert a is not None and b is not None
    assert 0.6 < a.seconds < 1.6 and 5.0 < b.seconds < 12.0
    # an unseen value is the stage's typical task: between the two
    c = m.predict({"universe": "nasdaq"})
    assert c is not None and a.seconds < c.seconds < b.seconds


def test_few_observations_stay_near_the_median_and_have_a_wide_band():
    m = StageModel()
    m.observe({"x": 1}, 2.0)
    p = m.predict({"x": 1000})
    assert p is not None
    assert p.seconds == pytest.approx(2.0)  # one value: nothing to fit a slope on
    assert p.high / p.low > 5  # the prior's band
    rng = np.random.default_rng(3)
    many = StageModel()
    for i in range(200):
        many.observe({"x": i % 10}, noisy(rng, 2.0, 0.1))
    q = many.predict({"x": 3})
    assert q is not None and q.high / q.low < p.high / p.low


def test_a_parameter_that_explains_nothing_is_shrunk_away():
    rng = np.random.default_rng(4)
    m = StageModel()
    durations = []
    for i in range(40):
        d = noisy(rng, 3.0, 0.5)
        durations.append(d)
        m.observe({"seed": i}, d)
    med = float(np.median(durations))
    for seed in (0, 20, 39, 500):
        p = m.predict({"seed": seed})
        assert p is not None
        assert med / 1.6 < p.seconds < med * 1.6, (seed, p.seconds, med)


def test_extrapolation_is_limited():
    m = StageModel()
    for x in (1, 2, 3, 4, 5, 6, 7, 8):
        m.observe({"n": x}, float(x))
    far = m.predict({"n": 10**9})
    assert far is not None
    # at most EXTRAPOLATE spans beyond the range on the log column: nowhere near 1e9 s
    assert far.seconds < 1e4


def test_mixed_missing_and_odd_values_do_not_break_the_fit():
    m = StageModel()
    rows = [
        ({"a": 1, "b": "x", "c": [1, 2]}, 1.0),
        ({"a": -2.0, "b": None, "c": {"k": 1}}, 2.0),
        ({"a": "three", "b": True}, 3.0),
        ({}, 4.0),
        ({"a": float("nan")}, 5.0),
    ]
    for p, s in rows:
        m.observe(p, s)
    m.observe({"a": 1}, float("nan"))  # ignored
    m.observe({"a": 1}, -1.0)  # ignored
    m.observe({"a": 1}, 0.0)  # ignored: no log of zero
    assert len(m) == 5
    for p, _ in rows:
        got = m.predict(p)
        assert got is not None and math.isfinite(got.seconds) and got.seconds > 0
    batch = m.predict_many([p for p, _ in rows] + [None])
    assert batch is not None and len(batch) == 6
    assert [b.seconds for b in batch[:5]] == pytest.approx([m.predict(p).seconds for p, _ in rows])


def test_nothing_observed_predicts_nothing():
    assert StageModel().predict({"x": 1}) is None
    models = DurationModels()
    assert models.predict("backtest", {"x": 1}) is None
    assert not models.due("backtest")


def test_due_doubles_then_steps():
    models = DurationModels()
    fired = []
    for i in range(1, 3000):
        models.observe("s", {"i": i}, 1.0)
        if models.due("s"):
            fired.append(i)
            models.mark("s")
    doublings = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert fired[: len(doublings)] == doublings
    assert REFIT_EVERY == WINDOW == 512
    assert fired[len(doublings) :] == list(range(512 + REFIT_EVERY, 3000, REFIT_EVERY))


def test_due_keeps_firing_after_the_window_is_full():
    """The cadence counts the observations ever made, not the window's (which stops at
    its size): a stage keeps being re-estimated, a window's worth apart."""
    models = DurationModels(window=8)
    fired = []
    for i in range(1, 60):
        models.observe("s", {"i": i}, 1.0)
        if models.due("s"):
            fired.append(i)
            models.mark("s")
    assert len(models.model("s")) == 8
    assert fired == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56]


def test_due_spaces_re_ranks_of_a_long_queue_by_its_length():
    """Past the doublings, a re-rank that visits ``waiting`` tasks comes at most once per
    ``waiting / RERANK_VISITS`` observations: a stage's re-ranks visit at most
    RERANK_VISITS waiting tasks per observation, however long its queue (a queue up to
    a window x RERANK_VISITS keeps the window's cadence)."""
    assert RERANK_VISITS == 16
    short, long_ = DurationModels(window=8), DurationModels(window=8)
    fired: dict[int, list[int]] = {8 * RERANK_VISITS: [], 8 * RERANK_VISITS * 5: []}
    for waiting, models in zip(fired, (short, long_), strict=True):
        for i in range(1, 300):
            models.observe("s", {"i": i}, 1.0)
            if models.due("s", waiting=waiting):
                fired[waiting].append(i)
                models.mark("s")
    # within window x RERANK_VISITS: the cadence of a stage with no queue
    assert fired[128] == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, *range(64, 300, 8)]
    # five times that queue: the doublings as before (a bounded number), then every 40
    assert fired[640] == [1, 2, 4, 8, *range(48, 300, 40)]
    for waiting, at in fired.items():
        spaced = [b - a for a, b in itertools.pairwise(at) if a >= 8]
        assert spaced and min(spaced) >= max(8, waiting // RERANK_VISITS)


def test_due_after_history_is_loaded_fires_once_then_a_window_later():
    history = DurationModels(window=8)
    for i in range(20):
        history.observe("s", {"i": i}, 1.0)
    models = DurationModels.from_dict(history.to_dict(), window=8)  # the window's 8 kept
    assert models.model("s").seen == 8
    fired = []
    for i in range(1, 30):
        models.observe("s", {"i": i}, 1.0)
        if models.due("s"):
            fired.append(i)
            models.mark("s")
    assert fired == [1, 9, 17, 25]  # the first new one, then every window


def test_round_trip_through_json_keeps_predictions():
    rng = np.random.default_rng(5)
    models = DurationModels()
    for i in range(30):
        models.observe(
            "bt", {"lookback": 10 * (1 + i % 5), "tag": ("a", i % 2)}, noisy(rng, 1.0 + i % 5)
        )
    models.observe("feat", {}, 0.5)
    text = json.dumps(models.to_dict())
    back = DurationModels.from_dict(json.loads(text))
    assert back.stages() == ["bt", "feat"]
    for params in ({"lookback": 30, "tag": ("a", 1)}, {"lookback": 500}):
        a, b = models.predict("bt", params), back.predict("bt", params)
        assert a is not None and b is not None
        # a tuple comes back as its text: the same category either way
        assert b.seconds == pytest.approx(a.seconds)


@pytest.mark.parametrize(
    "data",
    [[], {"s": 3}, {"s": [[1, 2]]}, {"s": [[{"a": 1}]]}],
)
def test_malformed_models_are_refused(data):
    with pytest.raises(ValueError, match="duration models"):
        DurationModels.from_dict(data)


def test_within_factor():
    assert within_factor([1, 2, 3], [1, 1, 1]) == pytest.approx(2 / 3)
    assert within_factor([0.5, 4], [1, 1]) == pytest.approx(0.5)
    assert within_factor([0, 1], [0, 0]) == pytest.approx(0.5)
    assert math.isnan(within_factor([], []))
    with pytest.raises(ValueError):
        within_factor([1], [1, 2])


# -- the estimator: where an estimate comes from ----------------------------------------------


def test_estimates_come_from_annotation_then_model_then_median_then_default():
    from daskjobs.policies.durations import Estimator

    est = Estimator(default=1.0)
    assert est.predict("bt", {"lookback": 10}).source == "default"
    assert est.predict("bt", {"lookback": 10}, annotated=7.0).seconds == 7.0
    assert est.predict("bt", {"lookback": 10}, annotated=7.0).source == "annotation"
    for lb in (10, 20, 40, 80):
        est.observe("bt", {"lookback": lb}, 0.1 * lb)
    got = est.predict("bt", {"lookback": 160})
    assert got.source == "model" and got.samples == 4 and got.low < got.seconds < got.high
    assert got.seconds > 8  # the model follows the lookback: the median (3 s) would not
    est.observe("feat", None, 2.0)
    assert est.predict("feat", None).source == "history"  # no parameters: the median
    flat = Estimator(default=1.0, learn=False)
    for lb in (10, 20, 40, 80):
        flat.observe("bt", {"lookback": lb}, 0.1 * lb)
    same = {flat.predict("bt", {"lookback": lb}).seconds for lb in (10, 160)}
    assert len(same) == 1 and flat.predict("bt", {}).source == "history"
    assert not flat.due("bt")


def test_the_estimator_scores_its_predictions():
    from daskjobs.policies.durations import Estimator

    est = Estimator(default=1.0)
    # predicted before each is learned: (none), 1 vs 10, 3.16 vs 1, 1 vs 3, 1.73 vs 1
    for seconds in (1.0, 10.0, 1.0, 3.0, 1.0):
        est.observe("x", None, seconds)
    stages = est.stages()["x"]
    assert stages["samples"] == 5 and stages["scored"] == 4
    assert stages["within_2x"] == pytest.approx(1 / 4)
    assert stages["median"] == pytest.approx(1.0)
    for lb in (10, 20, 40, 80, 160, 320):  # a model that follows its parameter
        est.observe("bt", {"lookback": lb}, 0.1 * lb)
    assert est.stages()["bt"]["within_2x"] == 1.0


def test_history_round_trips_and_reads_version_one(tmp_path):
    from daskjobs.policies.durations import Estimator

    path = str(tmp_path / "h.json")
    est = Estimator(default=1.0, path=path)
    for lb in (10, 20, 40):
        est.observe("bt", {"lookback": lb}, 0.1 * lb)
    est.save()
    again = Estimator(default=1.0, path=path)
    assert again.predict("bt", {"lookback": 80}).seconds == pytest.approx(
        est.predict("bt", {"lookback": 80}).seconds
    )
    old = tmp_path / "v1.json"
    old.write_text(json.dumps({"version": 1, "stages": {"bt": [1.0, 2.0, 3.0]}}))
    v1 = Estimator(default=9.0, path=str(old))
    assert v1.predict("bt", {"x": 1}).seconds == pytest.approx(2.0)
    for bad, why in (
        ("{", "history file"),
        ('{"version": 9, "stages": {}}', "written by a newer daskjobs"),
        ('{"version": "2", "stages": {}}', "unknown version"),
        ('{"version": 2, "stages": {"bt": 3}}', "not a list"),
        ("[]", "not a JSON object"),
    ):
        old.write_text(bad)
        with pytest.raises(ValueError, match=why):
            Estimator(default=1.0, path=str(old))


def test_a_stage_without_parameters_shares_one_prediction_and_one_empty_mapping():
    """A parameterless stage (``client.map(f, range(n))``) predicts its median for every
    task: the fit makes that prediction once, and its observations share one read-only
    empty mapping (what the scheduler's hook does per finished task stays O(1) and
    allocates nothing per task beyond the observation)."""
    m = StageModel()
    for s in (1.0, 2.0, 4.0):
        m.observe(None, s)
    m.observe({}, 3.0)
    first = m.predict(None)
    assert first is not None and first is m.predict({}) is m.latest(None)
    assert first.seconds == pytest.approx(m.predict_many([None, {}])[0].seconds)
    assert m.predict_many([None, None])[0] is first
    kept = [p for p, _ in m._obs]
    assert all(p is kept[0] for p in kept) and dict(kept[0]) == {}
    with pytest.raises(TypeError):
        kept[0]["x"] = 1  # type: ignore[index]
    copies = m.observations()  # a caller gets its own dicts
    copies[0][0]["x"] = 1
    assert dict(m._obs[0][0]) == {}
    m.observe(None, 8.0)  # a new observation: a new fit, a new shared prediction
    assert m.predict(None) is not first


# -- the prior of size-like parameters (a plain task's integer arguments) ------------------------


def test_a_size_like_parameter_seen_at_one_value_is_assumed_proportional():
    """Before the observations tell its values apart, a size-like parameter scales the
    prediction in proportion (calibrated by what was measured); a parameter not named
    size-like stays at the median, as before."""
    m = StageModel(grows=frozenset({"n"}))
    m.observe({"n": 10, "seed": 1}, 2.0)
    assert m.predict({"n": 10, "seed": 5}).seconds == pytest.approx(2.0)
    big = m.predict({"n": 400, "seed": 1})
    assert big.seconds == pytest.approx(80.0) and big.source == "model"
    assert StageModel().predict({"n": 400}) is None
    plain = StageModel()
    plain.observe({"n": 10}, 2.0)
    assert plain.predict({"n": 400}).seconds == pytest.approx(2.0)  # no prior: the median


def test_measurements_that_contradict_the_prior_replace_it():
    """A size-like parameter whose measured values differ is fitted like any other: large
    arguments that are cheap get small predictions (the prior's wrong guess is gone as soon
    as two values are measured)."""
    m = StageModel(grows=frozenset({"n"}))
    for n, s in ((100, 1.0), (200, 0.5), (400, 0.25), (800, 0.125)):
        m.observe({"n": n}, s)
    assert m.predict({"n": 1600}).seconds < m.predict({"n": 100}).seconds
    # and a size-like parameter that does grow extrapolates along its fit, beyond the
    # two observed spans a plain parameter is limited to
    g = StageModel(grows=frozenset({"n"}))
    flat = StageModel()
    for n in (10, 12, 14):
        g.observe({"n": n}, 0.1 * n)
        flat.observe({"n": n}, 0.1 * n)
    assert g.predict({"n": 1000}).seconds > 5 * flat.predict({"n": 1000}).seconds


def test_the_prior_of_a_stage_never_measured_scales_the_default():
    from daskjobs.policies.durations import PRIOR_RANGE, Estimator

    est = Estimator(default=2.0)
    batch = [{"n": n} for n in (10, 20, 40)]
    est.expect("f", frozenset({"n"}), batch)  # the reference: the batch's median, n=20
    got = [est.predict("f", p) for p in batch]
    assert [e.source for e in got] == ["prior"] * 3
    assert [e.seconds for e in got] == pytest.approx([1.0, 2.0, 4.0])
    assert est.predict("f", {"n": 10**9}).seconds == pytest.approx(2.0 * PRIOR_RANGE)
    assert est.predict("f", {}).seconds == pytest.approx(2.0)  # lacks it: the reference
    # the reference is kept: a later graph of one task is ranked against the first
    est.expect("f", frozenset({"n"}), [{"n": 400}])
    assert est.predict("f", {"n": 400}).seconds == pytest.approx(40.0)
    # once measured, the model (calibrated by the measurement) takes over
    est.observe("f", {"n": 20}, 0.5)
    e = est.predict("f", {"n": 40})
    assert e.source == "model" and e.seconds == pytest.approx(1.0)
    # learning off: no prior, every task the default
    off = Estimator(default=2.0, learn=False)
    off.expect("f", frozenset({"n"}), batch)
    assert off.predict("f", {"n": 40}).source == "default"


def test_stages_are_bounded_the_least_recently_observed_go_first():
    models = DurationModels(window=4, max_stages=3)
    for stage in ("a", "b", "c"):
        models.observe(stage, None, 1.0)
    models.observe("a", None, 1.0)  # a is the most recent now
    models.observe("d", None, 1.0)  # b goes
    assert models.stages() == ["a", "c", "d"]
    models.expect("e", frozenset({"n"}), [{"n": 1}])
    for stage in ("f", "g", "h"):
        models.expect(stage, frozenset({"n"}), [{"n": 1}])
    assert len(models._refs) <= 3
