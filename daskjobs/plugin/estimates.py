"""Where a live task's estimated duration comes from.

In order (:class:`daskjobs.policies.durations.Estimator`, the object the simulator and
replay use too):

1. the task's ``estimate`` annotation (seconds, or ``"10s"``); a bad one refuses the
   submission (:class:`BadEstimate`);
2. the *duration model* of the task's stage over its parameters: its ``params`` annotation (a
   sweep passes each task's labels and parameters there), else what its own call carries
   (:mod:`daskjobs.plugin.features`: a plain ``client.map``/``submit``/``delayed`` task's
   literal arguments); log-duration regressed on the parameters, with a 10-90% band
   (:mod:`daskjobs.policies.durations`);
3. the median of the stage's measured durations (``history``: the stage's tasks carry
   no parameters, or learning is off);
4. ``prior``: nothing measured of the stage yet, the configured ``default-estimate`` scaled by
   the task's size-like arguments;
5. the configured ``default-estimate``.

A task's *stage* is its ``stage`` annotation, else the function it calls (``module.name``),
else dask's key prefix (``"backtest-<hash>"`` is stage ``"backtest"``). What is learned is the
compute time the worker reports for each finished task (``startstops``), taken as measured: a
worker's speed figure (:mod:`daskjobs.plugin.speeds`) measures the worker and the estimates
together, so dividing by it would feed the estimates back into themselves. The observations are
kept in the history file (:mod:`daskjobs.history`; by default the user's cache directory's), so
the next scheduler, the next ``LocalCluster`` and the next sweep start with them.

Pure Python: nothing here imports ``distributed``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from typing import Any

from daskjobs.errors import SubmissionRefused
from daskjobs.policies.durations import MAX_STAGES, Estimate, Estimator, Prediction

__all__ = [
    "BadEstimate",
    "Estimate",
    "Estimator",
    "LiveEstimator",
    "check_estimate",
    "make_estimator",
    "params_of",
    "predict_stage",
    "predict_stage_seconds",
]

logger = logging.getLogger("daskjobs.plugin")


class BadEstimate(SubmissionRefused):
    """An ``estimate`` annotation that is not a duration (seconds >= 0, or ``"10s"``)."""


def check_estimate(key: object, value: Any) -> float:
    """``value`` as seconds, read as the configuration reads durations (a number of
    seconds, ``"10s"``, ``"2 minutes"``: :func:`daskjobs.config.duration_seconds`), or
    :class:`BadEstimate` naming the task and value."""
    from daskjobs.config import duration_seconds

    try:
        return duration_seconds(f"task {key!r}: estimate", value)
    except ValueError:
        raise BadEstimate(
            f"task {key!r}: estimate must be a duration: seconds >= 0 (2.5) or a string "
            f"with a unit ('10s', '2 minutes'), got {type(value).__name__} {value!r}"
        ) from None


def params_of(annotations: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A task's ``params`` annotation when it is a mapping (what the model reads), else None."""
    if not annotations:
        return None
    p = annotations.get("params")
    return p if isinstance(p, Mapping) and p else None


class LiveEstimator(Estimator):
    """The plugin's :class:`Estimator`: its ``observe`` runs in the scheduler's transition
    hook, so it never fits. A finished task is scored against what the stage's latest fit
    predicts for it (the fit the scheduler last ranked or re-ranked with: the prediction it
    acted on), then appended; the model is fitted again at the next prediction (a new
    graph, or the stage's re-estimation at the model's cadence). O(parameters) a task,
    where the base class fits once per observation (milliseconds for 512 of them)."""

    def _before(self, stage: str, params: Mapping[str, Any] | None) -> Prediction | None:
        m = self.models.model(stage)
        return m.latest(params) if m is not None else None


def make_estimator(
    default: float,
    samples: int,
    path: str | None,
    learn: bool,
    max_stages: int = MAX_STAGES,
) -> Estimator:
    """The plugin's estimator, with the history file ``history.path`` names
    (:func:`daskjobs.history.resolve`: ``auto`` is the user's cache directory's). A file
    that cannot be used does not stop the scheduler: one of a newer daskjobs, or one it may
    not read, is left as it is and the plugin keeps its measurements in memory; any other
    (not JSON, another program's) is moved aside (``*.corrupt``); either way with a
    warning, and the plugin starts with no history."""
    from daskjobs import history

    file = history.resolve(path)
    try:
        return LiveEstimator(default, samples, file, learn=learn, max_stages=max_stages)
    except history.NewerHistory as e:
        logger.warning("daskjobs: %s; measured durations are kept in memory only", e)
        return LiveEstimator(default, samples, None, learn=learn, max_stages=max_stages)
    except OSError as e:  # cannot be read at all (permissions): not ours to move
        logger.warning(
            "daskjobs: cannot read the history file %s (%s); measured durations are kept in "
            "memory only",
            file,
            e,
        )
        return LiveEstimator(default, samples, None, learn=learn, max_stages=max_stages)
    except ValueError as e:
        assert file is not None
        bad = file + ".corrupt"
        logger.warning("daskjobs: %s; moved to %s, starting with no history", e, bad)
        with contextlib.suppress(OSError):
            os.replace(file, bad)
        keep = file if not os.path.exists(file) else None
        return LiveEstimator(default, samples, keep, learn=learn, max_stages=max_stages)


def predict_stage_seconds(
    estimator: Estimator, stage: str, params: list[Mapping[str, Any] | None]
) -> list[Estimate] | list[float]:
    """:func:`predict_stage`, but where the stage is not measured yet and its size-like
    parameters scale the default (the prior), each task's estimate as its seconds alone: a
    float ``s`` stands for ``Estimate(s, s, s, "prior")`` (the same seconds, without an
    object per task in a graph of a million)."""
    if params and estimator.learn:
        factors = estimator.models.prior_factors(stage, params)
        if factors is not None:
            d = estimator.default
            return [d * r for r in factors]
    return predict_stage(estimator, stage, params)


def predict_stage(
    estimator: Estimator, stage: str, params: list[Mapping[str, Any] | None]
) -> list[Estimate]:
    """:meth:`Estimator.predict` for many unannotated tasks of ``stage`` at once (one
    matrix product of the stage's model)."""
    if not params:
        return []
    asked = params if estimator.learn else [None] * len(params)
    preds = estimator.models.predict_many(stage, asked)
    if preds is None:
        return [estimator.estimate(None)] * len(params)
    out: list[Estimate] = []
    last: Any = None
    e: Estimate | None = None
    for p in preds:
        if p is not last:  # a stage's median is one prediction shared by every task
            last = p
            e = estimator.estimate(p)
        assert e is not None
        out.append(e)
    return out
