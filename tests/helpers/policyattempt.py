"""An attempt as a policy sees it (an ``AttemptView``), for tests that drive a policy's
hooks by hand."""

from __future__ import annotations

import math
from dataclasses import dataclass

from daskjobs.sim import Task


@dataclass(eq=False)  # attempts hash by identity, as the simulator's and the plugin's do
class Attempt:
    task: Task
    node: int
    start: float
    end: float = math.nan
    outcome: str | None = None
    backup: bool = False
