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
    "MAX_STAGES",
    "PRIOR_RANGE",
    "PRIOR_SIGMA",
    "PRIOR_SLOPE_SD",
    "REFIT_EVERY",
    "RERANK_MIN_SECONDS",
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
#: A size-like parameter's assumed effect (before measurements tell it apart) is limited to
#: this factor either way of the value it was measured at.
PRIOR_RANGE = 1000.0
_PRIOR_LOG = math.log(PRIOR_RANGE)
#: A size-like parameter's slope (log-duration over log-size) is assumed 1 (proportional
#: cost) give or take this much, before measurements (a normal prior of this deviation).
PRIOR_SLOPE_SD = 1.0
#: The spread of log-durations around a stage's fit assumed before measurements say it (the
#: SPEC's estimate noise, exp(0.3 z)), weighing as :data:`NOISE_PSEUDO` observations.
PRIOR_NOISE = 0.3
NOISE_PSEUDO = 2.0
#: Stages kept in memory (the least recently observed is dropped past it).
MAX_STAGES = 256
#: A driver leaves out the re-ranks of a stage with parameters whose typical task (the
#: median of its observations) is shorter than this: reordering tasks of a few milliseconds
#: cannot move the end of a run by more than a few of them, and a re-rank visits every
#: waiting task of the stage.
RERANK_MIN_SECONDS = 0.005
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

    __slots__ = ("_fit", "_obs", "_since_fit", "grows", "seen", "window")

    def __init__(self, window: int = WINDOW, grows: frozenset[str] = frozenset()) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        self.window = window
        #: parameters assumed to grow the cost in proportion until measured (the prior)
        self.grows = grows
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

    def typical(self) -> float:
        """The median of the durations kept (0.0 without any); O(window)."""
        return float(np.median([s for _, s in self._obs])) if self._obs else 0.0

    def _current(self) -> _Fit | None:
        if not self._obs:
            return None
        if self._fit is None or self._since_fit:
            self._fit = _Fit(self._obs, self.grows)
            self._since_fit = 0
        return self._fit

    def expect(self, grows: frozenset[str]) -> None:
        """Assume the parameters ``grows`` grow the cost too (the next fit reads them)."""
        if not grows <= self.grows:
            self.grows = self.grows | grows
            self._fit = None

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
        return fit.shared() if fit.flat else fit.predict([params or {}])[0]

    def predict_many(self, params: Sequence[Mapping[str, Any] | None]) -> list[Prediction] | None:
        """:meth:`predict` for a batch, with one matrix product."""
        fit = self._current()
        if fit is None:
            return None
        return fit.predict([p or {} for p in params])


class _Fit:
    """One ridge fit of a stage's observations (immutable once made)."""

    __slots__ = (
        "_one",
        "beta",
        "center",
        "columns",
        "cut",
        "flat",
        "hi",
        "lo",
        "median",
        "n",
        "prior",
        "scale",
    )

    def __init__(
        self, obs: Iterable[tuple[Mapping[str, Any], float]], grows: frozenset[str] = frozenset()
    ) -> None:
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
        #: size-like parameters the observations cannot tell apart (one value seen):
        #: (name, log of that value); the cost is assumed proportional to them
        self.prior: list[tuple[str, float]] = []
        if columns:
            center = raw.mean(axis=0)
            scale = raw.std(axis=0)
            keep = scale > 1e-12 * np.maximum(1.0, np.abs(center))  # constant columns say nothing
            for (name, kind, _), k, c in zip(columns, keep, center.tolist(), strict=True):
                if not k and kind == "log" and name in grows and math.isfinite(c):
                    self.prior.append((name, c))
            columns = [c for c, k in zip(columns, keep, strict=True) if k]
            raw, center, scale = raw[:, keep], center[keep], scale[keep]
        else:
            center = scale = np.zeros(0)
        self.columns = columns
        #: every task of the stage gets one prediction (no column, no prior)
        self.flat = not (columns or self.prior)
        self.center = center
        self.scale = scale
        yc = y - self.median
        if columns:
            x = (raw - center) / scale
            # how far a standardised value may go: EXTRAPOLATE spans beyond the seen range
            lo = x.min(axis=0)
            hi = x.max(axis=0)
            span = hi - lo
            beyond = EXTRAPOLATE * span
            width = x.shape[1]
            # the intercept is fitted too, shrunk toward the median like every effect
            offset = float(yc.mean()) * n / (n + SHRINK)
            # every effect is shrunk toward 0 (the stage's median)
            gram = x.T @ x + SHRINK * np.eye(width)
            self.beta = np.linalg.solve(gram, x.T @ (yc - offset))
            sized = [
                j for j, (name, kind, _) in enumerate(columns) if kind == "log" and name in grows
            ]
            if sized:
                self.beta = self._sized(x, yc - offset, gram, sized, scale)
                for j in sized:  # extrapolates along its fit, up to PRIOR_RANGE
                    beyond[j] = max(beyond[j], _PRIOR_LOG / float(scale[j]))
            self.cut = (lo - beyond, hi + beyond)
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

    def _sized(
        self,
        x: np.ndarray,
        y: np.ndarray,
        gram: np.ndarray,
        sized: list[int],
        scale: np.ndarray,
    ) -> np.ndarray:
        """The fit again, a size-like parameter's slope shrunk toward 1 instead of 0: the
        posterior mean under a normal prior of slope 1 give or take
        :data:`PRIOR_SLOPE_SD`, with the noise of the first fit's residuals (and
        :data:`PRIOR_NOISE` as :data:`NOISE_PSEUDO` observations). Over a narrow or noisy
        range of sizes the prior holds; over a wide one, or where the measurements follow
        the size closely, the measurements decide (cost falling as the size grows
        included)."""
        resid = y - x @ self.beta
        n = len(y)
        noise = (float(resid @ resid) + NOISE_PSEUDO * PRIOR_NOISE**2) / (n + NOISE_PSEUDO)
        gram = gram.copy()
        toward = np.zeros(x.shape[1])
        for j in sized:
            s_j = float(scale[j])
            weight = noise / (PRIOR_SLOPE_SD * s_j) ** 2  # in standardised units
            gram[j, j] += weight - SHRINK
            toward[j] = weight * s_j  # a slope of 1 is s_j per standardised unit
        return np.linalg.solve(gram, x.T @ y + toward)

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
        if self.flat:  # the stage's median for every task: one prediction, shared
            return [self.shared()] * k
        if self.columns:
            x = (self._raw(self.columns, params) - self.center) / self.scale
            x = np.where(np.isnan(x), 0.0, x)  # centred: 0 is the observed mean
            # an unseen category is 0 already; limit extrapolation of numbers
            x = np.clip(x, self.cut[0], self.cut[1])
            logd = self.median + x @ self.beta
        else:
            logd = np.full(k, self.median)
        if self.prior:
            logd = logd + _growth(self.prior, params)
        source = "model"
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


def _growth(prior: Sequence[tuple[str, float]], params: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """The prior's term of each task's log-duration: for each size-like parameter, the log
    of its value over the value it was measured at (proportional cost), limited to
    :data:`PRIOR_RANGE` either way; 0 where a task lacks it."""
    out = np.zeros(len(params))
    nan = math.nan
    log_size = _log_size
    for name, ref in prior:
        # each task's log size (NaN: none), then its term limited either way, in arrays: a
        # graph of 10^6 tasks is predicted on the scheduler's event loop (the same floats as
        # min(max(x - ref, -L), L) task by task, added in the same order)
        xs = [nan if (x := log_size(p.get(name))) is None else x for p in params]
        terms = np.clip(np.asarray(xs, dtype=float) - ref, -_PRIOR_LOG, _PRIOR_LOG)
        out += np.where(np.isnan(terms), 0.0, terms)
    return out


def _log_size(v: Any) -> float | None:
    """The log of ``v`` if it is a finite number > 0 (a size), else None."""
    if type(v) is int:  # the commonest size, without the checks below
        return math.log(float(v)) if v > 0 else None
    if not _is_number(v):
        return None
    f = float(v)
    return math.log(f) if f > 0 and math.isfinite(f) else None


class DurationModels:
    """Duration models by stage, with the re-ranking cadence and (de)serialisation.

    ``observe(stage, params, seconds)`` after each finished task (seconds
    normalised by the worker's speed); ``predict(stage, params)`` for a task;
    ``due(stage)`` tells a driver when the waiting tasks of ``stage`` deserve
    new estimates (then :meth:`mark` once it re-estimated them).
    """

    def __init__(self, window: int = WINDOW, max_stages: int = MAX_STAGES) -> None:
        self.window = window
        self.max_stages = max_stages
        # least recently observed first (an observation moves its stage to the end)
        self._stages: dict[str, StageModel] = {}
        self._marked: dict[str, int] = {}
        # stage -> size-like parameter -> the log of its reference value (its median over
        # the first tasks that named it): the prior of a stage not measured yet
        self._refs: dict[str, dict[str, float]] = {}

    def __contains__(self, stage: object) -> bool:
        return stage in self._stages

    def stages(self) -> list[str]:
        return sorted(self._stages)

    def items(self) -> list[tuple[str, StageModel]]:
        """Each stage and its model, the least recently observed first."""
        return list(self._stages.items())

    def model(self, stage: str) -> StageModel | None:
        return self._stages.get(stage)

    def expect(
        self, stage: str, grows: frozenset[str], params: Sequence[Mapping[str, Any] | None]
    ) -> None:
        """Assume the cost of ``stage``'s tasks grows in proportion to their parameters
        ``grows`` (size-like: a count, a length) until its measurements tell them apart;
        ``params``: the tasks about to be predicted, whose median value of each new name is
        the reference a task of the default estimate has. O(tasks x names), names new to
        the stage only."""
        if not grows:
            return
        refs = self._refs.get(stage)
        if refs is None:
            if len(self._refs) >= self.max_stages:
                del self._refs[next(iter(self._refs))]
            refs = self._refs[stage] = {}
        for name in grows:
            if name in refs:
                continue
            logs = [x for p in params if p and (x := _log_size(p.get(name))) is not None]
            if logs:
                refs[name] = float(np.median(logs))
        m = self._stages.get(stage)
        if m is not None:
            m.expect(frozenset(refs))

    def observe(self, stage: str, params: Mapping[str, Any] | None, seconds: float) -> None:
        stages = self._stages
        m = stages.pop(stage, None)
        if m is None:
            refs = self._refs.get(stage)
            m = StageModel(self.window, frozenset(refs) if refs else frozenset())
            if len(stages) >= self.max_stages:  # the least recently observed goes
                gone = next(iter(stages))
                del stages[gone]
                self._marked.pop(gone, None)
                self._refs.pop(gone, None)
        stages[stage] = m
        m.observe(params, seconds)

    def predict(self, stage: str, params: Mapping[str, Any] | None) -> Prediction | None:
        m = self._stages.get(stage)
        if m is None:
            return self._prior(stage, [params])[0] if stage in self._refs else None
        return m.predict(params)

    def predict_many(
        self, stage: str, params: Sequence[Mapping[str, Any] | None]
    ) -> list[Prediction] | None:
        m = self._stages.get(stage)
        if m is None:
            return self._prior(stage, params) if stage in self._refs else None
        return m.predict_many(params)

    def _prior(self, stage: str, params: Sequence[Mapping[str, Any] | None]) -> list[Prediction]:
        """Before any measurement of ``stage``: each task's duration relative to a task at
        the reference values (1.0), by the prior alone (source ``"prior"``)."""
        return [
            Prediction(seconds=r, low=r, high=r, samples=0, source="prior")
            for r in self._prior_factors(stage, params)
        ]

    def prior_factors(
        self, stage: str, params: Sequence[Mapping[str, Any] | None]
    ) -> list[float] | None:
        """What :meth:`predict_many` predicts for a stage not measured yet whose size-like
        parameters are known (:meth:`expect`), as each task's factor alone (the
        predictions' ``seconds``, all with source ``"prior"``); None for any other stage.
        A graph of many tasks is ranked without a prediction object per task."""
        if stage in self._stages or stage not in self._refs:
            return None
        return self._prior_factors(stage, params)

    def _prior_factors(self, stage: str, params: Sequence[Mapping[str, Any] | None]) -> list[float]:
        refs = self._refs[stage]
        logs = _growth(list(refs.items()), [p or _NO_PARAMS for p in params])
        exp = math.exp
        return [exp(v) for v in logs.tolist()]

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
    def from_dict(
        cls, data: Mapping[str, Any], window: int = WINDOW, max_stages: int = MAX_STAGES
    ) -> DurationModels:
        """The inverse of :meth:`to_dict`; raises ``ValueError`` naming what is malformed.
        Past ``max_stages`` stages, the last ones in ``data`` are kept."""
        models = cls(window, max_stages)
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
SOURCES = ("annotation", "model", "history", "prior", "default")
#: The history file's version (:data:`daskjobs.history.VERSION`).
HISTORY_VERSION = 2


@dataclass(frozen=True, slots=True)
class Estimate:
    """A task's estimated duration, its band and where it came from: ``annotation`` (the
    user's ``estimate``; the band is the estimate itself), ``model`` (the stage's duration
    model over the task's parameters), ``history`` (the stage's median: no parameters
    that explain anything yet), ``prior`` (nothing measured, but the task's size-like
    parameters scale the configured default: :meth:`DurationModels.expect`), ``default``
    (nothing measured: the configured default)."""

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
        max_stages: int = MAX_STAGES,
    ) -> None:
        self.default = float(default)
        self.samples = int(samples)
        self.path = path
        self.learn = learn
        self.max_stages = max_stages
        self.models = DurationModels(self.samples, max_stages)
        self._scored: dict[str, list[int]] = {}  # stage -> [within 2x, predictions scored]
        self._saved: dict[str, int] = {}  # stage -> its observations ever made, at the last save
        self.dirty = False
        if path:
            self.load()

    def predict(
        self, stage: str, params: Mapping[str, Any] | None, annotated: float | None = None
    ) -> Estimate:
        if annotated is not None:
            return Estimate(annotated, annotated, annotated, "annotation")
        p = self.models.predict(stage, params if self.learn else None)
        return self.estimate(p)

    def estimate(self, p: Prediction | None) -> Estimate:
        """The estimate a model's prediction ``p`` gives (None: nothing measured)."""
        if p is None:
            d = self.default
            return Estimate(d, d, d, "default")
        if p.source == "prior":  # relative to a task at the reference sizes
            d = self.default * p.seconds
            return Estimate(d, d, d, "prior")
        source = "model" if p.source == "model" else "history"
        return Estimate(p.seconds, p.low, p.high, source, p.samples)

    def expect(
        self, stage: str, grows: frozenset[str], params: Sequence[Mapping[str, Any] | None]
    ) -> None:
        """:meth:`DurationModels.expect` (nothing when learning is off)."""
        if self.learn and grows:
            self.models.expect(stage, grows, params)

    def observe(
        self,
        stage: str,
        params: Mapping[str, Any] | None,
        seconds: float,
        *,
        score: bool = True,
        predicted: float | None = None,
    ) -> None:
        """Learn that a task of ``stage`` with ``params`` computed for ``seconds``.
        ``score=False`` skips scoring the prediction made before learning it (scoring
        refits the stage's model, O(window x columns) a call: the simulator scores the
        estimates its tasks started with instead); ``predicted``: the model's prediction the
        driver acted on, scored instead of asking the model again (O(1))."""
        if not (isinstance(seconds, _NUMBER) and math.isfinite(seconds) and seconds > 0):
            return
        if self.learn and score:
            if predicted is None:
                before = self._before(stage, params)
                predicted = before.seconds if before is not None else None
            if predicted is not None:
                scored = self._scored
                if stage not in scored and len(scored) >= 2 * self.max_stages:
                    for gone in [s for s in scored if s not in self.models]:
                        del scored[gone]  # stages the models dropped
                tally = scored.get(stage)
                if tally is None:
                    tally = scored[stage] = [0, 0]
                tally[0] += 0.5 <= predicted / seconds <= 2.0
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

    def typical(self, stage: str) -> float:
        """The median of ``stage``'s observations kept (0.0 without any); O(window)."""
        m = self.models.model(stage)
        return m.typical() if m is not None else 0.0

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

    # -- persistence (daskjobs.history: the file, its lock and its merge) ------------------
    def load(self) -> None:
        """Read the history file: a missing file is an empty history; one that cannot be
        used raises ``ValueError`` naming the file and the problem
        (:class:`daskjobs.history.NewerHistory` for a newer version's), and the caller
        decides what to do with it."""
        assert self.path
        from daskjobs import history

        got = history.read(self.path)
        if got is None:
            return
        stages, touched = got
        # least recently measured first: the order the models drop stages in
        order = sorted(stages, key=lambda s: touched.get(s, 0.0))
        try:
            models = DurationModels.from_dict(
                {s: stages[s] for s in order}, self.samples, self.max_stages
            )
        except ValueError as e:
            raise ValueError(f"history file {self.path}: {e}") from None
        if not self.learn:  # stage medians only: the parameters are not read
            plain = DurationModels(self.samples, self.max_stages)
            for stage in order:
                m = models.model(stage)
                if m is None:
                    continue
                for _, seconds in m.observations():
                    plain.observe(stage, None, seconds)
            models = plain
        self.models = models
        self._saved = {stage: m.seen for stage, m in models.items()}

    def pending(self) -> HistorySave | None:
        """What a save would write now (the observations of each stage that gained some
        since the last save), or None with nothing new; O(observations of those stages).
        :meth:`HistorySave.write` writes it (in a thread, if the caller likes: it shares
        nothing with this object), then :meth:`saved` records that it did."""
        if not self.path or not self.dirty:
            return None
        rows: dict[str, list[list[Any]]] = {}
        fresh: dict[str, int] = {}
        seen: dict[str, int] = {}
        for stage, m in self.models.items():
            n = m.seen - self._saved.get(stage, 0)
            if n > 0:
                rows[stage] = [[_jsonable(p), s] for p, s in m.observations()]
                fresh[stage] = min(n, len(rows[stage]))
                seen[stage] = m.seen
        self.dirty = False  # observations from here on make it dirty again
        if not rows:
            return None
        return HistorySave(self.path, rows, fresh, seen, self.samples, self.max_stages)

    def saved(self, job: HistorySave, ok: bool) -> None:
        """``job`` was written (``ok``), or not: then its observations are due again."""
        if ok:
            self._saved.update(job.seen)
        else:
            self.dirty = True

    def save(self) -> bool:
        """Merge the observations made since the last save into the history file, now
        (:func:`daskjobs.history.write`); False if another scheduler held the file's lock
        too long (they are saved next time)."""
        job = self.pending()
        if job is None:
            return True
        ok = False
        try:
            ok = job.write()
        finally:
            self.saved(job, ok)
        return ok


class HistorySave:
    """One save of the history file, made by :meth:`Estimator.pending`: a snapshot, so that
    :meth:`write` may run in another thread while the scheduler keeps learning."""

    __slots__ = ("fresh", "max_stages", "path", "rows", "seen", "window")

    def __init__(
        self,
        path: str,
        rows: dict[str, list[list[Any]]],
        fresh: dict[str, int],
        seen: dict[str, int],
        window: int,
        max_stages: int,
    ) -> None:
        self.path = path
        self.rows = rows
        self.fresh = fresh
        self.seen = seen
        self.window = window
        self.max_stages = max_stages

    def write(self) -> bool:
        from daskjobs import history

        return history.write(self.path, self.rows, self.fresh, self.window, self.max_stages)
