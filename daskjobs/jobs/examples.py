"""The three job shapes of docs/explanation/jobs.md, importable on every worker.

A job names its function as ``"module:function"`` so that any worker can import it and a
resubmission from a new session is the same job (docs/explanation/jobs.md). These are small but
real: a model trained by gradient descent with checkpoints, a batch of partitions
scored with it, and an evaluation that stops when asked.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

__all__ = ["evaluate", "score", "train"]

#: The true weights of the synthetic regression problem.
TRUE_W = np.array([2.0, -1.0, 0.5])


def _data(seed: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, TRUE_W.size))
    return x, x @ TRUE_W + rng.normal(scale=0.1, size=rows)


def train(attempt: Any, steps: int = 300, lr: float = 0.05, step_seconds: float = 0.0) -> dict:
    """A training job (one part): gradient descent on a linear model, resumed from the
    part's latest checkpoint, checkpointing whenever ``checkpoint_every`` seconds have
    passed; stops early when its attempt lost its part. Returns the final state."""
    x, y = _data(0, 2_000)
    state = attempt.restore() or {"step": 0, "w": [0.0] * TRUE_W.size}
    state["resumed_from"] = state["step"]
    w = np.array(state["w"])
    for step in range(state["step"], steps):
        if attempt.stop_requested:
            break
        grad = 2 * x.T @ (x @ w - y) / len(y)
        w -= lr * grad
        time.sleep(step_seconds)
        state.update(step=step + 1, w=w.tolist(), loss=float(np.mean((x @ w - y) ** 2)))
        if attempt.checkpoint_due():
            attempt.checkpoint(dict(state))
    return state


def score(attempt: Any, weights: list[float], rows: int = 10_000) -> dict:
    """One partition of a batch-inference job: partition ``attempt.part`` of
    ``attempt.parts``, deterministic (a replay computes the same output)."""
    x, y = _data(100 + attempt.part, rows)
    pred = x @ np.array(weights)
    return {
        "partition": attempt.part,
        "rows": rows,
        "mean_prediction": float(pred.mean()),
        "mse": float(np.mean((pred - y) ** 2)),
    }


def evaluate(
    attempt: Any, weights: list[float], rounds: int = 20, round_seconds: float = 0.05
) -> dict:
    """An evaluation job: low priority work that checks ``stop_requested`` between
    rounds, so a cancelled or preempted attempt ends at once."""
    errors = []
    for r in range(rounds):
        if attempt.stop_requested:
            break
        x, y = _data(1_000 + r, 1_000)
        errors.append(float(np.mean((x @ np.array(weights) - y) ** 2)))
        time.sleep(round_seconds)
    return {"rounds": len(errors), "mse": float(np.mean(errors)) if errors else None}
