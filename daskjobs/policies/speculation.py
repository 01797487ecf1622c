"""Speculative execution: when does a running attempt get a backup copy?

An attempt is *late* once it has run ``late_factor`` times its estimate, scaled
by the believed slow-down of the node it runs on (1.0 unless the policy learns
node speeds), and at least ``min_runtime`` seconds. A late attempt gets one
backup copy on another node; the first copy to finish wins and the other is
killed (its core-time is waste).

Why 2.5: if estimates are the true duration times ``exp(0.3 z)`` with ``z``
standard normal, a healthy attempt passes ``2.5 x`` its estimate only when
``exp(-0.3 z) > 2.5``, i.e. ``z < -ln(2.5) / 0.3 = -3.05``: probability
0.11%. Ten thousand healthy tasks then launch about eleven needless backups,
while any attempt slowed 2.5x or more (a slow node, a sick disk) is caught.

At most ``max_fraction`` of all slots (at least one) run backups at once, as
Hadoop caps speculative tasks at 10% of running ones.

A policy may also ask for a backup before the deadline, through
:meth:`~daskjobs.policies.base.Policy.urgent` (for instance when it has learned
that the attempt's node is slow and a copy elsewhere would finish first).

The same object drives the simulator and, later, the scheduler plugin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Speculation"]


@dataclass(frozen=True, slots=True)
class Speculation:
    """When to launch backup copies of late attempts."""

    late_factor: float = 2.5
    min_runtime: float = 0.0
    max_fraction: float = 0.1

    def __post_init__(self) -> None:
        for name in ("late_factor", "min_runtime", "max_fraction"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise TypeError(f"{name} must be a number, got {type(value).__name__}: {value!r}")
        if not (math.isfinite(self.late_factor) and self.late_factor > 1.0):
            raise ValueError(f"late_factor must be a finite number > 1, got {self.late_factor!r}")
        if not (math.isfinite(self.min_runtime) and self.min_runtime >= 0):
            raise ValueError(f"min_runtime must be >= 0 seconds, got {self.min_runtime!r}")
        if not (0 < self.max_fraction <= 1):
            raise ValueError(f"max_fraction must be in (0, 1], got {self.max_fraction!r}")

    def deadline(self, start: float, estimate: float, speed: float = 1.0) -> float:
        """Time at which an attempt started at ``start`` counts as late."""
        return start + max(self.min_runtime, self.late_factor * estimate * speed)

    def cap(self, total_slots: int) -> int:
        """Most backups running at once on a cluster of ``total_slots``."""
        return max(1, int(self.max_fraction * total_slots))
