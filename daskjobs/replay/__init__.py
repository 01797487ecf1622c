"""Replay recorded runs in the simulator, calibrated against the recording.

``load(trace)`` turns a trace written by the recording plugin (``docs/reference/trace-format.md``)
into simulator tasks and a cluster, with what dask adds (per-task overhead,
start-up latency, per-worker speed) fitted from the trace itself;
``replay(trace, policy=...)`` simulates it, as recorded or under a what-if;
``from_task_stream(records)`` loads a ``client.get_task_stream()`` dump instead.
See ``docs/explanation/replay.md``. Nothing here imports ``distributed``.
"""

from __future__ import annotations

from daskjobs.replay.load import SPEED_NOISE, Fit, Loaded, ReplayError, WorkerInfo, load
from daskjobs.replay.run import (
    POLICIES,
    CopyRace,
    ReplayResult,
    make_cluster,
    replay,
    what_ifs,
)
from daskjobs.replay.stream import from_task_stream, read_task_stream

__all__ = [
    "POLICIES",
    "SPEED_NOISE",
    "CopyRace",
    "Fit",
    "Loaded",
    "ReplayError",
    "ReplayResult",
    "WorkerInfo",
    "from_task_stream",
    "load",
    "make_cluster",
    "read_task_stream",
    "replay",
    "what_ifs",
]
