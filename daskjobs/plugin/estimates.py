"""Where a task's estimated duration comes from.

In order: the task's ``estimate`` annotation (seconds); else the median of the
measured durations of recent tasks of the same *stage* (the ``stage``
annotation, or dask's key prefix: ``"backtest-<hash>"`` is stage
``"backtest"``); else the configured default. Measured durations are the
compute time the worker reports for each finished task (``startstops``),
kept per stage in a bounded window, and saved as JSON where a history path is
configured so that a restarted scheduler starts with them.

Pure Python: nothing here imports ``distributed``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
from collections import deque
from collections.abc import Mapping
from typing import Any

from daskjobs.errors import SubmissionRefused

__all__ = ["BadEstimate", "Estimator"]

logger = logging.getLogger("daskjobs.plugin")

HISTORY_VERSION = 1


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


class Estimator:
    """Estimates from annotations, measured history, or a default."""

    def __init__(self, default: float, samples: int = 64, path: str | None = None) -> None:
        self.default = float(default)
        self.samples = samples
        self.path = path
        self._history: dict[str, deque[float]] = {}
        self._median: dict[str, float] = {}
        self.dirty = False
        if path:
            self.load()

    def estimate(
        self, key: object, annotations: Mapping[str, Any] | None, stage: str
    ) -> tuple[float, str]:
        """``(seconds, source)`` with source ``annotation``, ``history`` or ``default``."""
        if annotations and "estimate" in annotations:
            return check_estimate(key, annotations["estimate"]), "annotation"
        m = self.median(stage)
        if m is not None:
            return m, "history"
        return self.default, "default"

    def median(self, stage: str) -> float | None:
        m = self._median.get(stage)
        if m is None:
            h = self._history.get(stage)
            if not h:
                return None
            s = sorted(h)
            n = len(s)
            m = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
            self._median[stage] = m
        return m

    def observe(self, stage: str, seconds: float) -> None:
        """A task of ``stage`` computed for ``seconds``."""
        if not (seconds >= 0 and math.isfinite(seconds)):
            return
        h = self._history.get(stage)
        if h is None:
            h = self._history[stage] = deque(maxlen=self.samples)
        h.append(float(seconds))
        self._median.pop(stage, None)
        self.dirty = True

    def stages(self) -> dict[str, dict[str, float]]:
        """Per stage: samples kept and their median."""
        return {
            s: {"samples": len(h), "median": self.median(s) or 0.0}
            for s, h in sorted(self._history.items())
        }

    # -- persistence ----------------------------------------------------------------
    def load(self) -> None:
        """Read the history file; a missing file is an empty history, a broken
        one is reported and set aside (renamed ``*.corrupt``), never fatal."""
        assert self.path
        try:
            with open(self.path) as f:
                data = json.load(f)
            if data.get("version") != HISTORY_VERSION:
                raise ValueError(f"unknown history version {data.get('version')!r}")
            for stage, values in data["stages"].items():
                h = deque((float(v) for v in values), maxlen=self.samples)
                self._history[str(stage)] = h
        except FileNotFoundError:
            return
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            bad = self.path + ".corrupt"
            logger.warning(
                "daskjobs: history file %s is unreadable (%s); moved to %s", self.path, e, bad
            )
            with contextlib.suppress(OSError):
                os.replace(self.path, bad)
            self._history.clear()
        self._median.clear()

    def save(self) -> None:
        """Write the history atomically (temporary file, then rename)."""
        if not self.path:
            return
        data = {
            "version": HISTORY_VERSION,
            "stages": {s: list(h) for s, h in self._history.items()},
        }
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".daskjobs-history-", dir=folder)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.dirty = False
