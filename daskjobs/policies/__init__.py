"""Scheduling policies: pure Python, shared by the simulator, the plugin and replay.

Nothing here imports ``distributed`` (a test enforces it). See
:mod:`daskjobs.policies.base` for the interface and docs/how-to/write-a-policy.md for writing
one. Policies are known by name through :mod:`daskjobs.policies.registry`; the
built-in ones are registered here, a user's with :func:`register` or an entry point
of group ``daskjobs.policies``.
"""

from __future__ import annotations

from typing import Any

from daskjobs.policies import registry
from daskjobs.policies.base import (
    AttemptView,
    Capabilities,
    HeapPolicy,
    NodeView,
    Policy,
    TaskView,
)
from daskjobs.policies.durations import DurationModels, Estimator
from daskjobs.policies.fairshare import FairShare
from daskjobs.policies.nodeaware import NodeAware
from daskjobs.policies.order import FIFO, LPT, CriticalPath
from daskjobs.policies.registry import PolicySpec, register
from daskjobs.policies.speculation import Speculation
from daskjobs.policies.stealing import WorkStealing

__all__ = [
    "FIFO",
    "LPT",
    "AttemptView",
    "Capabilities",
    "CriticalPath",
    "DurationModels",
    "Estimator",
    "FairShare",
    "HeapPolicy",
    "NodeAware",
    "NodeView",
    "Policy",
    "PolicySpec",
    "Speculation",
    "TaskView",
    "WorkStealing",
    "make_policy",
    "register",
    "registry",
]

# The built-in policies, in the order the configuration lists them.
for _name, _factory in (
    ("fifo", FIFO),
    ("lpt", LPT),
    ("critical-path", CriticalPath),
    ("fair-share", FairShare),
    ("node-aware", NodeAware),
):
    registry._builtin(_name, _factory)
# Dealing tasks to per-core deques only means something where the policy decides which
# core runs a task; live, dask picks the worker of a released task, and dask's own
# work-stealing extension already does this (docs/how-to/write-a-policy.md#work-stealing).
registry._builtin("work-stealing", WorkStealing, live=False)
del _name, _factory


def make_policy(name: str, **settings: Any) -> Policy:
    """A fresh policy by its registered name (``fair-share`` needs ``targets=``);
    :func:`daskjobs.policies.registry.make`."""
    return registry.make(name, **settings)
