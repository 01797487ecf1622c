"""Scheduling policies: pure Python, shared by the simulator and the plugin.

Nothing here imports ``distributed`` (a test enforces it). See
:mod:`daskjobs.policies.base` for the interface.
"""

from __future__ import annotations

from typing import Any

from daskjobs.policies.base import AttemptView, HeapPolicy, NodeView, Policy, TaskView
from daskjobs.policies.fairshare import FairShare
from daskjobs.policies.nodeaware import NodeAware
from daskjobs.policies.order import FIFO, LPT, CriticalPath
from daskjobs.policies.speculation import Speculation
from daskjobs.policies.stealing import WorkStealing

__all__ = [
    "FIFO",
    "LPT",
    "AttemptView",
    "CriticalPath",
    "FairShare",
    "HeapPolicy",
    "NodeAware",
    "NodeView",
    "Policy",
    "Speculation",
    "TaskView",
    "WorkStealing",
    "make_policy",
]

_BY_NAME: dict[str, type[Policy]] = {
    "fifo": FIFO,
    "lpt": LPT,
    "critical-path": CriticalPath,
    "work-stealing": WorkStealing,
    "node-aware": NodeAware,
}


def make_policy(name: str, **kwargs: Any) -> Policy:
    """A fresh policy by its configuration name (``fair-share`` needs ``targets=``)."""
    if name == "fair-share":
        return FairShare(**kwargs)
    try:
        cls = _BY_NAME[name]
    except KeyError:
        known = ", ".join(sorted([*_BY_NAME, "fair-share"]))
        raise ValueError(f"unknown policy {name!r}; choose one of: {known}") from None
    return cls(**kwargs)
