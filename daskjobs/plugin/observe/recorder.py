"""Write a trace of a live run to a JSON Lines file, off the scheduler's hot path.

The scheduler plugin hands small ``dict`` records to :meth:`TraceRecorder.emit`
from the scheduler's event loop. ``emit`` only appends to an in-memory queue: it
never serialises, never touches the file, never waits for a lock held by the
writer and never blocks.

Which records may be dropped
============================

A trace without its graph cannot be replayed (no estimates, teams, dependencies
or submission times), and the plugin emits a graph's records all at once, one per
task, inside one ``update_graph`` call: the writer thread cannot drain any of
them before the call returns. So **graph records are never dropped**: they do
not count against the bound. They cost memory in proportion to the tasks the
scheduler holds anyway (a ``TaskState`` each, much larger than a record), and
only until the writer's next pass.

The other records (one or two per transition, starts, workers, events) arrive
spread over the run; at most ``max_queue`` of them wait for the writer. When
more arrive before it has drained them (the disk is slower than the run, or the
writer thread is starved of the GIL by a scheduler busy with a storm of
transitions), the new ones are dropped and counted (``dropped``, the footer's
``dropped``, :meth:`TraceRecorder.stats`), so memory stays bounded whatever the
disk does. The writer logs one WARNING the first time it sees drops, with the
count so far; the total is in the footer.

Producer and consumer each keep their own counters (``emit`` the records it
queued, the writer those it took), so the number of bounded records waiting is
a difference of two integers each written by one thread only: no lock.

A daemon thread wakes every ``flush_interval`` seconds, drains the queue in
chunks (serialising a chunk, writing it, so a graph of a million records never
becomes one string in memory), and flushes the file. Records are written in the
order they were emitted: the scheduler's clock order that
:func:`~daskjobs.trace.read_trace` checks. :meth:`TraceRecorder.close`
drains what is left and writes the footer with the counts. A crashed run leaves
a file without a footer (and possibly one unterminated last line), which
:func:`daskjobs.trace.read_trace` reads and flags as incomplete.

Serialisation happens in the writer thread: tuples become JSON arrays, values
JSON cannot hold (sets, bytes, arbitrary objects) are written as their ``str``,
non-finite floats as ``null``, and mapping keys that are not strings as their
``str``. The schema is documented in ``docs/reference/trace-format.md``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["TRACE_VERSION", "TraceRecorder", "jsonable"]

logger = logging.getLogger("daskjobs.plugin.recorder")

#: Version of the trace format written by this module (``docs/reference/trace-format.md``).
TRACE_VERSION = 1

#: Record types that are never dropped (see the module docs).
KEPT_TYPES = frozenset({"graph"})

#: Records serialised and written per step of the writer.
CHUNK = 8192


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

    ``emit(record)`` is O(1) and never blocks. Graph records are always queued;
    when ``max_queue`` other records wait for the writer, new ones are dropped
    and counted in ``dropped`` (module docs). The file is opened (and truncated)
    and the header written when the recorder is created, so a bad path fails
    here, with the path named. ``header`` adds fields to the header line.

    Meant for a single producer (the scheduler's event loop): each counter is a
    plain integer written by one thread only.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_queue: int = 65_536,
        flush_interval: float = 0.2,
        header: Mapping[str, Any] | None = None,
        exclusive: bool = False,
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
        self._bounded_in = 0  # droppable records queued (written by emit only)
        self._bounded_out = 0  # droppable records taken off the queue (by the writer only)
        self._warned = False
        self.written = 0  # records written, header and footer excluded
        self.errors = 0  # records that could not be written (serialisation or I/O)
        self.failed: str | None = None  # the I/O error that stopped writing, if any
        self.closed = False
        # created 0640 (umask permitting), never through a symlink at the last component;
        # with ``exclusive`` (a client's recording) an existing file is never overwritten
        flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        flags |= getattr(os, "O_CLOEXEC", 0) | (os.O_EXCL if exclusive else os.O_TRUNC)
        try:
            fd = os.open(self.path, flags, 0o640)
            self._file = os.fdopen(fd, "w", encoding="utf-8")  # closed in close()
        except OSError as e:
            if os.path.islink(self.path):
                why = "it is a symbolic link (traces are never written through one)"
            elif isinstance(e, FileExistsError):
                why = "the file exists (a recording never overwrites one; choose another name)"
            else:
                why = str(e)
            raise OSError(f"cannot write the daskjobs trace to {self.path!r}: {why}") from e
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

        A graph record is never dropped while recording; another one is when
        ``max_queue`` others wait for the writer. The record must not be changed
        afterwards: the writer thread reads it later.
        """
        if self.closed:
            self.dropped += 1
            return False
        if record.get("type") not in KEPT_TYPES:
            if self._bounded_in - self._bounded_out >= self.max_queue:
                self.dropped += 1
                return False
            self._bounded_in += 1
        self._queue.append(record)
        self.accepted += 1
        return True

    def emit_many(self, records: Iterable[Mapping[str, Any]]) -> int:
        """:meth:`emit` each of ``records``, in order; the number queued."""
        return sum(self.emit(r) for r in records)

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
            "max_queue": self.max_queue,
        }

    # -- the writer thread --------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval):
            self._drain()
        self._drain()

    def _drain(self) -> None:
        q = self._queue
        wrote = False
        while q:
            lines: list[str] = []
            while q and len(lines) < CHUNK:
                rec = q.popleft()
                if rec.get("type") not in KEPT_TYPES:
                    self._bounded_out += 1
                try:
                    lines.append(_dumps(rec) + "\n")
                except Exception:
                    self.errors += 1
                    logger.warning("daskjobs trace: cannot serialise a %r record", rec.get("type"))
            if self.failed is not None:
                self.errors += len(lines)  # the file is unusable: keep memory bounded, count
                continue
            try:
                self._file.writelines(lines)
                self.written += len(lines)
                wrote = True
            except Exception as e:
                self.failed = str(e)
                self.errors += len(lines)
                logger.warning(
                    "daskjobs trace: writing %s failed, recording stops: %s", self.path, e
                )
        if wrote and self.failed is None:
            try:
                self._file.flush()
            except Exception as e:
                self.failed = str(e)
                logger.warning(
                    "daskjobs trace: writing %s failed, recording stops: %s", self.path, e
                )
        if self.dropped and not self._warned:
            self._warned = True
            logger.warning(
                "daskjobs trace: %d record(s) dropped so far while writing %s: more than "
                "%d transition records waited for the writer (a disk slower than the run, "
                "or a scheduler too busy to let the writer thread run); the trace has gaps. "
                "Graph records are never dropped; the total is in the footer's 'dropped' "
                "and daskjobs.status()['recording']",
                self.dropped,
                self.path,
                self.max_queue,
            )

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
