"""``daskjobs.record``: record a stretch of a run on a scheduler that has the plugin.

::

    with daskjobs.record(client, "run.jsonl") as path:
        client.compute(graph, sync=True)
    trace = daskjobs.trace.read_trace(path)

The path is opened *by the scheduler*, on the scheduler's machine (a relative
path is relative to the scheduler's working directory); ``path`` is the absolute
path the scheduler wrote. The other two ways to record, for the whole life of a
scheduler, are the ``daskjobs.record`` config key and ``JobsPlugin(record=...)``
(see ``docs/reference/trace-format.md``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from daskjobs.plugin.client import _call

__all__ = ["record"]


@contextmanager
def record(client: Any, path: str | os.PathLike[str]) -> Iterator[str]:
    """Record a trace to ``path`` on the scheduler while the block runs.

    Raises ``RuntimeError`` if the daskjobs plugin is not loaded on the scheduler
    or is already recording, and ``OSError`` if the scheduler cannot write
    ``path``. On exit the trace is flushed and closed (with its footer), also
    when the block raised.
    """
    info = _call(client, "daskjobs_record", action="start", path=os.fspath(path))
    try:
        yield info["path"]
    finally:
        _call(client, "daskjobs_record", action="stop")
