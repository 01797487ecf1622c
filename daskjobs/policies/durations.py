"""Duration models: how long a task of a stage takes, given its parameters.

Why a model
===========

Every ordering, lateness and preemption rule runs on estimates, and researchers
rarely annotate them. Within one stage of a sweep the durations follow the
parameters: a longer lookback, a bigger universe, a busier data slice. A per-stage
median ranks every task of the stage alike, so longest-first without annotations
is first-in-first-out in disguise on exactly the sweeps it should help, and a
backup-copy rule judges a task "late" that is only long. 3Sigma (EuroSys'18) found
8-23% of history-based point estimates off by 2x or more and schedules on the
distribution; this module gives a point *and* a band.

The model
=========

Per stage, log-duration is regressed on the task's parameters:

* a numeric parameter ``x`` (int or float, not bool) contributes ``log x`` while
  every value seen is > 0, else ``x``: durations are often a power of a size
  (proportional: ``log d = log x + c``; quadratic; or flat), and a power law
  extrapolates gently where a line in ``x`` would grow exponentially in ``log d``;
* any other parameter (a string, a bool, a tuple, a number that was once a
  string) is categorical: one column per value seen, an effect per value;
* the columns are standardised over the observations, and the coefficients are
  fitted by ridge regression (``(X'X + lambda I) b = X'y``) on ``y = log d - m``,
  where ``m`` is the median log-duration of the stage. The penalty is
  *shrinkage toward the stage median*: with few observations, or a parameter
  that does not explain anything, the prediction stays near the median; with
  many observations that follow a parameter, the parameter wins.

The band is the prediction times ``exp(q)`` for the 10% and 90% quantiles ``q``
of the fit's residuals, widened by ``sqrt(1 + (p + 1) / n)`` for ``p`` columns
and ``n`` observations (few observations, a wider band); with fewer than three
observations the band comes from :data:`PRIOR_SIGMA` (the spread of log-durations
of the SPEC's reference sweep, 0.76, rounded up).

Prediction outside what was seen: an unseen categorical value adds nothing (the
stage's typical effect); a numeric value beyond the observed range extrapolates
along the fitted line, but its standardised value is limited to
:data:`EXTRAPOLATE` observed spans beyond the range, so one wild parameter cannot
predict a day for a sweep of seconds.

Cost
====

``observe`` is O(1) (an append to a bounded window of :data:`WINDOW` samples).
A fit costs O(n p^2 + p^3) for ``n <= WINDOW`` observations and ``p`` columns
(tens), done lazily at the next prediction after new observations, and never
more often than :meth:`DurationModels.due` allows a driver to re-rank: when the
stage's observations *ever made* (not only those its window keeps) reach 1, 2, 4,
8, ... and, once they pass the window, every window's worth (the window is then
a fit of wholly new observations), or every ``w / RERANK_VISITS`` observations if
the stage has more waiting tasks ``w`` than a window's worth of observations pays
for. So a stage of ``n`` observations is re-ranked at most
``log2(WINDOW) + 1 + n / WINDOW`` times: its fits cost O(p^2) amortised per
observation, and past the doublings its re-estimates visit at most
:data:`RERANK_VISITS` waiting tasks per observation, however long its queue (a
re-rank every window's worth over a queue of ``w`` would cost ``w / 512`` visits an
observation: on a map of 10^5 tasks, two hundred per finished task).
``predict_many`` predicts a batch with one matrix product.

Pure Python and numpy: nothing here imports ``distributed``. The simulator, the
plugin and replay share it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

__all__ = [
    "EXTRAPOLATE",
    "PRIOR_SIGMA",
    "REFIT_EVERY",
    "RERANK_VISITS",
    "SOURCES",
    "WINDOW",
    "DurationModels",
    "Estimate",
    "Estimator",
    "Prediction",
    "StageModel",
    "within_factor",
]

#: Observations kept per stage (the most recent).
WINDOW = 512
#: Log-spread of durations assumed before three observations (the band's width).
PRIOR_SIGMA = 0.8
#: Ridge penalty, in units of observations: with ``n`` observations a parameter's
#: effect is shrunk by about ``n / (n + SHRINK)`` toward the stage median.
SHRINK = 2.0
#: How far beyond the observed range (in observed spans) a numeric parameter extrapolates.
EXTRAPOLATE = 2.0
#: After the first doublings, a driver re-ranks a stage every this many observations
#: (the window: the model is then a fit of observations it had not seen at the last).
REFIT_EVERY = WINDOW
#: Past the first doublings, a re-rank that visits ``w`` waiting tasks of a stage comes at
#: most once every ``w / RERANK_VISITS`` observations: at most this many visits per
#: observation, amortised, however long the stage's queue.
RERANK_VISITS = 16
#: The band's quantiles of the residuals.
BAND = (0.1, 0.9)
_Z90 = 1.2815515655446004  # the standard normal's 90% quantile
_NUMBER = (int, float)  # (made once: ``int | float`` in a hot isinstance is made per call)
#: The parameters of an observation without any (one read-only mapping for all of them).
_NO_PARAMS: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Prediction:
    """A predicted duration in seconds with its band (10% and 90% quantiles).

    ``source`` is ``"model"`` (the stage's parameters explain it), ``"median"``
    (the stage's median: no parameters, or too few observations to fit them).
    ``samples`` is the number of observations behind it.
    """

    seconds: float
    low: float
    high: float
    samples: int
    source: str


def within_factor(
    predicted: Iterable[float], actual: Iterable[float], factor: float = 2.0
) -> float:
    """Share of predictions within ``factor`` of the truth (3Sigma's measure), in [0, 1]."""
    p = np.asarray(list(predicted), dtype=float)
    a = np.asarray(list(actual), dtype=float)
    if p.shape != a.shape:
        raise ValueError(f"{p.size} predictions for {a.size} actual durations")
    if not p.size:
        return float("nan")
    ok = (p > 0) & (a > 0)
    ratio = np.ones_like(p)
    ratio[ok] = p[ok] / a[ok]
    good = ok & (ratio <= factor) & (ratio >= 1.0 / factor)
    # both zero counts as exact; one zero and the other not as a miss
    good |= (p == 0) & (a == 0)
    return float(good.mean())


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float | np.integer | np.floating) and not isinstance(
        v, bool | np.bool_
    )


def _category(v: Any) -> Hashable:
    """A parameter value as a category: None, strings, bools and numbers as they are,
    anything else by its text (so a tuple and its JSON round trip are one category)."""
    if v is None or isinstance(v, str | bool):
        return v
    if _is_number(v):
        f = float(v)
        return "nan" if math.isnan(f) else f
    return repr(v)


class StageModel:
    """The duration model of one stage (see the module docstring)."""

    __slots__ = ("_fit", "_obs", "_since_fit", "seen", "window")

    def __init__(self, window: int = WINDOW) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        self.window = window
        self._obs: deque[tuple[Mapping[str, Any], float]] = deque(maxlen=window)
        self._fit: _Fit | None = None
        self._since_fit = 0
        #: observations ever made (the window keeps the latest ``window`` of them)
        self.seen = 0

    def __len__(self) -> int:
        return len(self._obs)

    def observe(self, params: Mapping[str, Any] | None, seconds: float) -> None:
        """A task of this stage with ``params`` computed for ``seconds`` (speed-normalised).
        A duration that is not a finite number > 0 is ignored."""
        if not (isinstance(seconds, _NUMBER) and math.isfinite(seconds) and seconds > 0):
            return
        # (no parameters: one shared empty mapping, never written to)
        self._obs.append((dict(params) if params else _NO_PARAMS, float(seconds)))
        self._since_fit += 1
        self.seen += 1

    def observations(self) -> list[tuple[dict[str, Any], float]]:
        return [(dict(p), s) for p, s in self._obs]

    def _current(self) -> _Fit | None:
        if not self._obs:
            return None
        if self._fit is None or self._since_fit:
            self._fit = _Fit(self._obs)
            self._since_fit = 0
        return self._fit

    def predict(self, params: Mapping[str, Any] | None) -> Prediction | None:
        """The predicted duration of a task with ``params``; None before any observation."""
        fit = self._current()
        if fit is None:
            return None
        return fit.predict([params or {}])[0]

    def latest(self, params: Mapping[str, Any] | None) -> Prediction | None:
        """What the latest fit predicts for ``params``, without fitting the observations
        made since (O(parameters)); None before any fit."""
        fit = self._fit
        if fit is None:
            return None
        return fit.shared() if not fit.columns else fit.predict([params or {}])[0]

    def predict_many(self, params: Sequence[Mapping[str, Any] | None]) -> list[Prediction] | None:
        """:meth:`predict` for a batch, with one matrix product."""
        fit = self._current()
        if fit is None:
            return None
        return fit.predict([p or {} for p in params])


class _Fit:
    """One ridge fit of a stage's observations (immutable once made)."""

    __slots__ = ("_one", "beta", "center", "columns", "cut", "hi", "lo", "median", "n", "scale")

    def __init__(self, obs: Iterable[tuple[Mapping[str, Any], float]]) -> None:
        rows = list(obs)
        self.n = n = len(rows)
        self._one: Prediction | None = None  # without columns: the one prediction, made once
        y = np.log(np.fromiter((s for _, s in rows), dtype=float, count=n))
        self.median = float(np.median(y))
        # the columns: (name, kind, value) with kind "x", "log" or "cat"
        numeric: dict[str, bool] = {}
        positive: dict[str, bool] = {}
        cats: dict[str, set[Hashable]] = {}
        for p, _ in rows:
            for name, v in p.items():
                if _is_number(v) and math.isfinite(float(v)):
                    numeric.setdefault(name, True)
                    positive[name] = positive.get(name, True) and float(v) > 0
                else:
                    numeric[name] = False
                cats.setdefault(name, set()).add(_category(v))
        columns: list[tuple[str, str, Hashable]] = []
        for name in sorted(numeric, key=str):
            if numeric[name]:
                columns.append((name, "log" if positive[name] else "x", None))
            else:
                for value in sorted(cats[name], key=repr):
                    columns.append((name, "cat", value))
        raw = self._raw(columns, [p for p, _ in rows])
        if columns:
            center = raw.mean(axis=0)
            scale = raw.std(axis=0)
            keep = scale > 1e-12 * np.maximum(1.0, np.abs(center))  # constant columns say nothing
            columns = [c for c, k in zip(columns, keep, strict=True) if k]
            raw, center, scale = raw[:, keep], center[keep], scale[keep]
        else:
            center = scale = np.zeros(0)
        self.columns = columns
        self.center = center
        self.scale = scale
        yc = y - self.median
        if columns:
            x = (raw - center) / scale
            # how far a standardised value may go: EXTRAPOLATE spans beyond the seen range
            lo = x.min(axis=0)
            hi = x.max(axis=0)
            span = hi - lo
            self.cut = (lo - EXTRAPOLATE * span, hi + EXTRAPOLATE * span)
            width = x.shape[1]
            gram = x.T @ x + SHRINK * np.eye(width)
            # the intercept is fitted too, shrunk toward the median like every effect
            offset = float(yc.mean()) * n / (n + SHRINK)
            self.beta = np.linalg.solve(gram, x.T @ (yc - offset))
            self.median += offset
            resid = yc - offset - x @ self.beta
        else:
            width = 0
            self.cut = (np.zeros(0), np.zeros(0))
            self.beta = np.zeros(0)
            resid = yc
        if n >= 3:
            widen = math.sqrt(1.0 + (width + 1) / n)
            q_lo, q_hi = np.quantile(resid, BAND)
            self.lo = float(min(q_lo, 0.0)) * widen
            self.hi = float(max(q_hi, 0.0)) * widen
        else:
            self.lo = -_Z90 * PRIOR_SIGMA
            self.hi = _Z90 * PRIOR_SIGMA

    @staticmethod
    def _raw(
        columns: Sequence[tuple[str, str, Hashable]], params: Sequence[Mapping[str, Any]]
    ) -> np.ndarray:
        out = np.zeros((len(params), len(columns)))
        for j, (name, kind, value) in enumerate(columns):
            for i, p in enumerate(params):
                v: Any = p.get(name)
                if kind == "cat":
                    out[i, j] = 1.0 if v is not None and _category(v) == value else 0.0
                elif _is_number(v) and math.isfinite(float(v)):
                    f = float(v)
                    if kind == "x":
                        out[i, j] = f
                    else:
                        out[i, j] = math.log(f) if f > 0 else np.nan
                else:
                    out[i, j] = np.nan  # missing or not a number: the stage's typical value
        return out

    def shared(self) -> Prediction:
        """The prediction of a fit without columns (the stage's median, for every task),
        made once."""
        one = self._one
        if one is None:
            med = self.median
            one = self._one = Prediction(
                seconds=math.exp(med),
                low=math.exp(med + self.lo),
                high=math.exp(med + self.hi),
                samples=self.n,
                source="median",
            )
        return one

    def predict(self, params: Sequence[Mapping[str, Any]]) -> list[Prediction]:
        k = len(params)
        if self.columns:
            x = (self._raw(self.columns, params) - self.center) / self.scale
            x = np.where(np.isnan(x), 0.0, x)  # centred: 0 is the observed mean
            # an unseen category is 0 already; limit extrapolation of numbers
            x = np.clip(x, self.cut[0], self.cut[1])
            logd = self.median + x @ self.beta
            source = "model"
        else:  # the stage's median for every task: one prediction, shared
            return [self.shared()] * k
        out: list[Prediction] = []
        for v in logd.tolist():
            out.append(
                Prediction(
                    seconds=math.exp(v),
                    low=math.exp(v + self.lo),
                    high=math.exp(v + self.hi),
                    samples=self.n,
                    source=source,
                )
            )
        return out


class DurationModels:
    """Duration models by stage, with the re-ranking cadence and (de)serialisation.

    ``observe(stage, params, seconds)`` after each finished task (seconds
    normalised by the worker's speed); ``predict(stage, params)`` for a task;
    ``due(stage)`` tells a driver when the waiting tasks of ``stage`` deserve
    new estimates (then :meth:`mark` once it re-estimated them).
    """

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self._stages: dict[str, StageModel] = {}
        self._marked: dict[str, int] = {}

    def __contains__(self, stage: object) -> bool:
        return stage in self._stages

    def stages(self) -> list[str]:
        return sorted(self._stages)

    def model(self, stage: str) -> StageModel | None:
        return self._stages.get(stage)

    def observe(self, stage: str, params: Mapping[str, Any] | None, seconds: float) -> None:
        m = self._stages.get(stage)
        if m is None:
            m = self._stages[stage] = StageModel(self.window)
        m.observe(params, seconds)

    def predict(self, stage: str, params: Mapping[str, Any] | None) -> Prediction | None:
        m = self._stages.get(stage)
        return None if m is None else m.predict(params)

    def predict_many(
        self, stage: str, params: Sequence[Mapping[str, Any] | None]
    ) -> list[Prediction] | None:
        m = self._stages.get(stage)
        return None if m is None else m.predict_many(params)

    def due(self, stage: str, waiting: int = 0) -> bool:
        """Whether ``stage`` has gained enough observations since it was last
        :meth:`mark`-ed to re-estimate its ``waiting`` tasks: when the observations ever
        made of it (:attr:`StageModel.seen`, the window's and those it dropped) have
        doubled since the mark (1, 2, 4, 8, ...), or grown by a window
        (:data:`REFIT_EVERY`, the model's window) if that comes first; once past the
        window, by at least ``waiting / RERANK_VISITS`` too, so that re-ranking a long
        queue costs O(1) visits per observation (module docstring). O(1)."""
        m = self._stages.get(stage)
        if m is None:
            return False
        n = m.seen
        last = self._marked.get(stage, 0)
        grown = n - last
        if grown < 1 or (grown < last and grown < m.window):
            return False  # (below the least step there is: most calls end here)
        step = max(1, min(last, m.window))
        if last >= m.window:
            step = max(step, -(-waiting // RERANK_VISITS))
        return n > last and n - last >= step

    def mark(self, stage: str) -> None:
        m = self._stages.get(stage)
        if m is not None:
            self._marked[stage] = m.seen

    # -- (de)serialisation: JSON-able, parameters that JSON cannot hold kept as text ----------
    def to_dict(self) -> dict[str, list[list[Any]]]:
        return {
            stage: [[_jsonable(p), s] for p, s in m.observations()]
            for stage, m in sorted(self._stages.items())
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], window: int = WINDOW) -> DurationModels:
        """The inverse of :meth:`to_dict`; raises ``ValueError`` naming what is malformed."""
        models = cls(window)
        if not isinstance(data, Mapping):
            raise ValueError(f"duration models: expected an object, got {type(data).__name__}")
        for stage, rows in data.items():
            if not isinstance(rows, list):
                raise ValueError(f"duration models: stage {stage!r} is not a list")
            for row in rows:
                if not (isinstance(row, list) and len(row) == 2 and isinstance(row[0], Mapping)):
                    raise ValueError(f"duration models: stage {stage!r} has a bad row {row!r}")
                models.observe(str(stage), row[0], row[1])
        return models


def _jsonable(params: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in params.items():
        if v is None or isinstance(v, bool | str):
            out[str(k)] = v
        elif _is_number(v):
            f = float(v)
            out[str(k)] = (
                (int(v) if isinstance(v, int | np.integer) else f) if math.isfinite(f) else repr(v)
            )
        else:
            out[str(k)] = repr(v)
    return out


# -- where an estimate comes from ---------------------------------------------------------------

#: The sources of an estimate, in the order they are tried.
SOURCES = ("annotation", "model", "history", "default")
HISTORY_VERSION = 2


@dataclass(frozen=True, slots=True)
class Estimate:
    """A task's estimated duration, its band and where it came from: ``annotation`` (the
    user's ``estimate``; the band is the estimate itself), ``model`` (the stage's duration
    model over the task's parameters), ``history`` (the stage's median: no parameters
    that explain anything yet), ``default`` (nothing measured: the configured default)."""

    seconds: float
    low: float
    high: float
    source: str
    samples: int = 0


class Estimator:
    """Estimates from annotations, duration models learned from measured durations, or a
    default; with the models' record of how good their predictions were.

    ``predict(stage, params, annotated)`` answers for a task; ``observe(stage, params,
    seconds)`` learns from a finished one (seconds normalised by the worker's speed) and
    scores the prediction the model would have made for it before learning it (the
    share within 2x, 3Sigma's measure, per stage). ``learn=False`` keeps stage medians
    only (every task of a stage alike, the behaviour before duration models).
    Persistence (``save``/``load``, JSON) is pure Python; a version-1 file (durations per
    stage, no parameters) is read as parameter-less observations.
    """

    def __init__(
        self,
        default: float,
        samples: int = WINDOW,
        path: str | None = None,
        *,
        learn: bool = True,
    ) -> None:
        self.default = float(default)
        self.samples = int(samples)
        self.path = path
        self.learn = learn
        self.models = DurationModels(self.samples)
        self._scored: dict[str, list[int]] = {}  # stage -> [within 2x, predictions scored]
        self.dirty = False
        if path:
            self.load()

    def predict(
        self, stage: str, params: Mapping[str, Any] | None, annotated: float | None = None
    ) -> Estimate:
        if annotated is not None:
            return Estimate(annotated, annotated, annotated, "annotation")
        p = self.models.predict(stage, params if self.learn else None)
        if p is None:
            d = self.default
            return Estimate(d, d, d, "default")
        source = "model" if p.source == "model" else "history"
        return Estimate(p.seconds, p.low, p.high, source, p.samples)

    def observe(
        self,
        stage: str,
        params: Mapping[str, Any] | None,
        seconds: float,
        *,
        score: bool = True,
    ) -> None:
        """Learn that a task of ``stage`` with ``params`` computed for ``seconds``.
        ``score=False`` skips scoring the prediction made before learning it (scoring
        refits the stage's model, O(window x columns) a call: the simulator scores the
        estimates its tasks started with instead)."""
        if not (isinstance(seconds, _NUMBER) and math.isfinite(seconds) and seconds > 0):
            return
        if self.learn and score:
            before = self._before(stage, params)
            if before is not None:
                tally = self._scored.setdefault(stage, [0, 0])
                tally[0] += 0.5 <= before.seconds / seconds <= 2.0
                tally[1] += 1
        self.models.observe(stage, params if self.learn else None, seconds)
        self.dirty = True

    def _before(self, stage: str, params: Mapping[str, Any] | None) -> Prediction | None:
        """The prediction a finished task is scored against: here the stage's model as it
        is now (fitted again if it learned since its last fit)."""
        return self.models.predict(stage, params)

    def due(self, stage: str, waiting: int = 0) -> bool:
        """Whether the ``waiting`` tasks of ``stage`` deserve new estimates now
        (:meth:`DurationModels.due`); the driver re-estimates them, then :meth:`mark`."""
        return self.learn and self.models.due(stage, waiting)

    def mark(self, stage: str) -> None:
        self.models.mark(stage)

    def stages(self) -> dict[str, dict[str, Any]]:
        """Per stage: samples kept, their median, and the share of the model's predictions
        within 2x of what was measured (None before any was scored)."""
        out: dict[str, dict[str, Any]] = {}
        for stage in self.models.stages():
            m = self.models.model(stage)
            assert m is not None
            durations = [s for _, s in m.observations()]
            scored = self._scored.get(stage)
            out[stage] = {
                "samples": len(durations),
                "median": float(np.median(durations)) if durations else 0.0,
                "within_2x": (scored[0] / scored[1]) if scored and scored[1] else None,
                "scored": scored[1] if scored else 0,
            }
        return out

    # -- persistence ----------------------------------------------------------------------
    def load(self) -> None:
        """Read the history file: a missing file is an empty history; a broken one
        raises ``ValueError`` naming the file and the problem (the caller decides what
        to do with it)."""
        assert self.path
        import json

        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            raise ValueError(f"history file {self.path}: {e}") from None
        if not isinstance(data, Mapping):
            raise ValueError(f"history file {self.path}: not a JSON object")
        version = data.get("version")
        stages = data.get("stages")
        if not isinstance(stages, Mapping):
            raise ValueError(f"history file {self.path}: no 'stages' object")
        if version == 1:  # durations only
            rows = {}
            for stage, values in stages.items():
                if not isinstance(values, list):
                    raise ValueError(f"history file {self.path}: stage {stage!r} is not a list")
                rows[str(stage)] = [[{}, v] for v in values]
            stages = rows
        elif version != HISTORY_VERSION:
            raise ValueError(f"history file {self.path}: unknown version {version!r}")
        try:
            models = DurationModels.from_dict(stages, self.samples)
        except ValueError as e:
            raise ValueError(f"history file {self.path}: {e}") from None
        if not self.learn:  # stage medians only: the parameters are not read
            plain = DurationModels(self.samples)
            for stage in models.stages():
                m = models.model(stage)
                assert m is not None
                for _, seconds in m.observations():
                    plain.observe(stage, None, seconds)
            models = plain
        self.models = models

    def save(self) -> None:
        """Write the history atomically (a temporary file, then a rename)."""
        if not self.path:
            return
        import contextlib
        import json
        import os
        import tempfile

        data = {"version": HISTORY_VERSION, "stages": self.models.to_dict()}
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".daskjobs-history-", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.dirty = False
