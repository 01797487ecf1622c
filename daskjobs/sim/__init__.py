"""An offline cluster simulator for task graphs (see :mod:`daskjobs.sim.engine`).

The simulator and the scheduler plugin run the same policy objects, so what
the simulator ranks best is what the cluster runs.
"""

from __future__ import annotations

from daskjobs.policies import (
    FIFO,
    LPT,
    CriticalPath,
    FairShare,
    NodeAware,
    Policy,
    Speculation,
    WorkStealing,
    make_policy,
)
from daskjobs.sim.engine import simulate
from daskjobs.sim.model import Attempt, Cluster, CycleError, Task, topological_order
from daskjobs.sim.schedule import (
    Schedule,
    TaskRecord,
    TeamStats,
    failure_bound,
    lower_bound,
    speed_bound,
    utilisation,
)

__all__ = [
    "FIFO",
    "LPT",
    "Attempt",
    "Cluster",
    "CriticalPath",
    "CycleError",
    "FairShare",
    "NodeAware",
    "Policy",
    "Schedule",
    "Speculation",
    "Task",
    "TaskRecord",
    "TeamStats",
    "WorkStealing",
    "failure_bound",
    "lower_bound",
    "make_policy",
    "simulate",
    "speed_bound",
    "topological_order",
    "utilisation",
]
