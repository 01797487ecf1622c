"""Where a live task's estimated duration comes from.

In order (:class:`daskjobs.policies.durations.Estimator`, the object the simulator and
replay use too):

1. the task's ``estimate`` annotation (seconds, or ``"10s"``); a bad one refuses the
   submission (:class:`BadEstimate`);
2. the *duration model* of the task's stage over its ``params`` annotation (a sweep
   passes each task's labels and parameters there): log-duration regressed on the
   parameters, with a 10-90% band (:mod:`daskjobs.policies.durations`);
3. the median of the stage's measured durations (``history``: the stage's tasks carry
   no parameters, or learning is off);
4. the configured ``default-estimate``.

A task's *stage* is its ``stage`` annotation, else dask's key prefix
(``"backtest-<hash>"`` is stage ``"backtest"``). What is learned is the compute time the
worker reports for each finished task (``startstops``), taken as measured: a worker's
speed figure (:mod:`daskjobs.plugin.speeds`) measures the worker and the estimates
together, so dividing by it would feed the estimates back into themselves. The
observations are saved as JSON where ``history.path`` is configured (version 2;
version-1 files of durations per stage are read as parameter-less observations), so a
restarted scheduler or the next sweep starts with them.

Pure Python: nothing here imports ``distributed``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from typing import Any

from daskjobs.errors import SubmissionRefused
from daskjobs.policies.durations import Estimate, Estimator, Prediction

__all__ = [
    "BadEstimate",
    "Estimate",
    "Estimator",
    "LiveEstimator",
    "check_estimate",
    "make_estimator",
    "params_of",
    "predict_stage",
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


def make_estimator(default: float, samples: int, path: str | None, learn: bool) -> Estimator:
    """The plugin's estimator. A history file that cannot be read does not stop the
    scheduler: it is moved aside (``*.corrupt``) with a warning, and the plugin starts
    with an empty history."""
    try:
        return LiveEstimator(default, samples, path, learn=learn)
    except ValueError as e:
        assert path is not None
        bad = path + ".corrupt"
        logger.warning("daskjobs: %s; moved to %s, starting with no history", e, bad)
        with contextlib.suppress(OSError):
            os.replace(path, bad)
        keep = path if not os.path.exists(path) else None
        return LiveEstimator(default, samples, keep, learn=learn)


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
        d = estimator.default
        return [Estimate(d, d, d, "default")] * len(params)
    out: list[Estimate] = []
    last: Any = None
    e: Estimate | None = None
    for p in preds:
        if p is not last:  # a stage's median is one prediction shared by every task
            last = p
            e = Estimate(
                p.seconds, p.low, p.high, "model" if p.source == "model" else "history", p.samples
            )
        assert e is not None
        out.append(e)
    return out
