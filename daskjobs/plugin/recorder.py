"""Write a trace of a live run to a JSON Lines file, off the scheduler's hot path.

The scheduler plugin hands small ``dict`` records to :meth:`TraceRecorder.emit`
from the scheduler's event loop. ``emit`` only appends to a bounded in-memory
queue: it never serialises, never touches the file, never waits for a lock held
by the writer and never blocks. When the queue is full the record is dropped
and counted (``dropped``), so memory stays bounded however slow the disk is.

A daemon thread wakes every ``flush_interval`` seconds, drains the queue, turns
the records into JSON lines and flushes the file. :meth:`TraceRecorder.close`
drains what is left and writes the footer with the counts. A crashed run leaves
a file without a footer (and possibly one unterminated last line), which
:func:`daskjobs.plugin.trace.read_trace` reads and flags as incomplete.

Serialisation happens in the writer thread: tuples become JSON arrays, values
JSON cannot hold (sets, bytes, arbitrary objects) are written as their ``str``,
non-finite floats as ``null``, and mapping keys that are not strings as their
``str``. The schema is documented in ``docs/trace.md``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

__all__ = ["TRACE_VERSION", "TraceRecorder", "jsonable"]

logger = logging.getLogger("daskjobs.plugin.recorder")

#: Version of the trace format written by this module (``docs/trace.md``).
TRACE_VERSION = 1


def jsonable(value: Any) -> Any:
    """``value`` with everything JSON cannot represent replaced (see module docs)."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k if isinstance(k, str) else str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, set | frozenset):
        try:
            return [jsonable(v) for v in sorted(value)]
        except TypeError:
            return [jsonable(v) for v in value]
    return str(value)


def _dumps(record: Mapping[str, Any]) -> str:
    try:
        return json.dumps(record, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return json.dumps(jsonable(record), separators=(",", ":"), allow_nan=False)


class TraceRecorder:
    """Append JSON records to ``path`` from a background thread.

    ``emit(record)`` is O(1) and never blocks; when more than ``max_queue``
    records wait for the writer, new ones are dropped and counted in
    ``dropped``. The file is opened (and truncated) and the header written when
    the recorder is created, so a bad path fails here, with the path named.
    ``header`` adds fields to the header line.

    Meant for a single producer (the scheduler's event loop): the counters are
    plain integers updated without locks.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_queue: int = 65_536,
        flush_interval: float = 0.2,
        header: Mapping[str, Any] | None = None,
    ) -> None:
        if not (isinstance(max_queue, int) and not isinstance(max_queue, bool) and max_queue >= 1):
            raise ValueError(f"max_queue: expected an integer >= 1, got {max_queue!r}")
        if not (isinstance(flush_interval, int | float) and flush_interval > 0):
            raise ValueError(f"flush_interval: expected seconds > 0, got {flush_interval!r}")
        self.path = os.path.abspath(os.fspath(path))
        self.max_queue = max_queue
        self.flush_interval = float(flush_interval)
        self.accepted = 0  # records queued by emit
        self.dropped = 0  # records refused because the queue was full (or after close)
        self.written = 0  # records written, header and footer excluded
        self.errors = 0  # records that could not be written (serialisation or I/O)
        self.failed: str | None = None  # the I/O error that stopped writing, if any
        self.closed = False
        try:
            self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115  (closed in close())
        except OSError as e:
            raise OSError(f"cannot write the daskjobs trace to {self.path!r}: {e}") from e
        import distributed

        import daskjobs

        head: dict[str, Any] = {
            "type": "header",
            "version": TRACE_VERSION,
            "daskjobs": daskjobs.__version__,
            "distributed": distributed.__version__,
            "started": time.time(),
        }
        head.update(header or {})
        head["type"], head["version"] = "header", TRACE_VERSION
        self._file.write(_dumps(head) + "\n")
        self._file.flush()
        self._queue: deque[Mapping[str, Any]] = deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="daskjobs-trace-writer", daemon=True)
        self._thread.start()

    # -- the producer side: O(1), never blocks ------------------------------------------
    def emit(self, record: Mapping[str, Any]) -> bool:
        """Queue ``record`` for writing; ``False`` (and counted) if it was dropped.

        The record must not be changed afterwards: the writer thread reads it later.
        """
        if self.closed or len(self._queue) >= self.max_queue:
            self.dropped += 1
            return False
        self._queue.append(record)
        self.accepted += 1
        return True

    @property
    def pending(self) -> int:
        """Records queued but not written yet."""
        return len(self._queue)

    def stats(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "written": self.written,
            "pending": self.pending,
            "dropped": self.dropped,
            "errors": self.errors,
            "failed": self.failed,
            "closed": self.closed,
        }

    # -- the writer thread --------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval):
            self._drain()
        self._drain()

    def _drain(self) -> None:
        q = self._queue
        if not q:
            return
        lines: list[str] = []
        while q:
            rec = q.popleft()
            try:
                lines.append(_dumps(rec) + "\n")
            except Exception:
                self.errors += 1
                logger.warning("daskjobs trace: cannot serialise a %r record", rec.get("type"))
        if self.failed is not None:
            self.errors += len(lines)  # the file is unusable: keep memory bounded, count
            return
        try:
            self._file.writelines(lines)
            self._file.flush()
            self.written += len(lines)
        except Exception as e:
            self.failed = str(e)
            self.errors += len(lines)
            logger.warning("daskjobs trace: writing %s failed, recording stops: %s", self.path, e)

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, then the footer, and close the file (idempotent).

        Blocks until the writer thread has drained the queue (at most ``timeout``
        seconds); call it from a thread, not the scheduler's event loop, when the
        queue may be long.
        """
        if self.closed:
            return
        self.closed = True
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():  # a stuck disk: never write concurrently with it
            logger.warning("daskjobs trace: writer of %s did not finish; no footer", self.path)
            return
        footer = {
            "type": "footer",
            "records": self.written,
            "dropped": self.dropped,
            "errors": self.errors,
            "finished": time.time(),
        }
        try:
            if self.failed is None:
                self._file.write(_dumps(footer) + "\n")
            self._file.close()
        except Exception as e:
            self.failed = self.failed or str(e)
            logger.warning("daskjobs trace: closing %s failed: %s", self.path, e)

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
