"""The history file: measured durations that outlive a scheduler.

The plugin's duration models (:mod:`daskjobs.policies.durations`) learn from every task that
finishes. Kept in memory only, they die with the scheduler, and a laptop starts a scheduler
with every ``LocalCluster``: every notebook session would start with nothing learned. So the
observations are kept in a JSON file (``daskjobs.history.path``):

* ``auto`` (the default): ``history.json`` in the user's cache directory, the platform's
  convention (``$XDG_CACHE_HOME/daskjobs`` or ``~/.cache/daskjobs`` on Linux,
  ``~/Library/Caches/daskjobs`` on macOS, ``%LOCALAPPDATA%\\daskjobs\\Cache`` on Windows);
  ``$DASKJOBS_HISTORY`` names another file;
* a path: that file (an operator's shared scheduler);
* null: memory only.

The file holds, per stage, its latest observations (``history.samples`` of them, each a task's
parameters and its measured seconds) and when the stage last gained some; at most
``history.max-stages`` stages, the least recently measured dropped first. A task has at most
:data:`daskjobs.plugin.features.MAX_FEATURES` parameters of bounded size, so the file's size is
bounded too.

**Shared safely.** Two schedulers on one machine (two notebooks) may use one file. A save takes
an exclusive lock on ``<file>.lock`` (waiting at most :data:`LOCK_WAIT`; a save that cannot get
it is tried again at the next one), reads what the file holds now, appends the observations made
here since the last save to each stage's, and replaces the file atomically (a temporary file,
then a rename), so neither scheduler's measurements overwrite the other's and a reader never
sees half a file.

**Never a crash or a hang.** A file that is not JSON, or JSON of another program, is moved
aside (``<file>.corrupt``) with a warning; a file of a newer daskjobs (a higher ``version``) is
left as it is, with a warning, and this scheduler keeps its measurements in memory; a file
larger than :data:`MAX_BYTES` is not read; a file or directory that cannot be written is a
warning once, and the measurements stay in memory.

Pure Python (json, os, fcntl where the platform has it); nothing here imports ``distributed``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "AUTO",
    "LOCK_WAIT",
    "MAX_BYTES",
    "VERSION",
    "NewerHistory",
    "default_path",
    "read",
    "resolve",
    "write",
]

logger = logging.getLogger("daskjobs.plugin")

#: The file format's version (a version-1 file, durations per stage, is read too).
VERSION = 2
#: The setting that means "the user's cache directory".
AUTO = "auto"
#: A history file larger than this is not read (it is not one of ours).
MAX_BYTES = 256 * 2**20
#: Longest a save waits for another scheduler's lock on the file.
LOCK_WAIT = 2.0

#: A row: a task's parameters (JSON-able) and its measured seconds.
Row = list[Any]


class NewerHistory(ValueError):
    """The history file was written by a newer daskjobs (left as it is)."""


def default_path() -> str:
    """The history file in the user's cache directory (module docstring)."""
    override = os.environ.get("DASKJOBS_HISTORY")
    if override:
        return os.path.expanduser(override)
    home = os.path.expanduser("~")
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.path.join(home, "AppData", "Local")
        folder = os.path.join(base, "daskjobs", "Cache")
    elif sys.platform == "darwin":
        folder = os.path.join(home, "Library", "Caches", "daskjobs")
    else:
        base = os.environ.get("XDG_CACHE_HOME") or ""
        if not os.path.isabs(base):  # the XDG spec: a relative value is to be ignored
            base = os.path.join(home, ".cache")
        folder = os.path.join(base, "daskjobs")
    return os.path.join(folder, "history.json")


def resolve(setting: str | None) -> str | None:
    """The file ``daskjobs.history.path`` names: ``auto`` the user's cache directory's,
    a path (``~`` expanded), None for memory only."""
    if setting is None:
        return None
    if setting == AUTO:
        return default_path()
    return os.path.expanduser(setting)


def read(path: str) -> tuple[dict[str, list[Row]], dict[str, float]] | None:
    """``(rows per stage, last measured time per stage)`` of the file; None if there is no
    file. Raises :class:`NewerHistory` for a newer version's file, ``ValueError`` naming
    the file and the problem for anything else it cannot use, and ``OSError`` if it cannot
    be read at all (permissions)."""
    try:
        size = os.path.getsize(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if size > MAX_BYTES:
        raise ValueError(f"history file {path}: {size} bytes, more than a history holds")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except ValueError as e:  # not JSON (UnicodeDecodeError is one too)
        raise ValueError(f"history file {path}: {e}") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"history file {path}: not a JSON object")
    version = data.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
        raise NewerHistory(
            f"history file {path} was written by a newer daskjobs (version {version}; "
            f"this one reads {VERSION})"
        )
    stages = data.get("stages")
    if not isinstance(stages, Mapping):
        raise ValueError(f"history file {path}: no 'stages' object")
    out: dict[str, list[Row]] = {}
    if version == 1:  # durations only
        for stage, values in stages.items():
            if not isinstance(values, list):
                raise ValueError(f"history file {path}: stage {stage!r} is not a list")
            out[str(stage)] = [[{}, v] for v in values]
    elif version == VERSION:
        for stage, rows in stages.items():
            if not isinstance(rows, list):
                raise ValueError(f"history file {path}: stage {stage!r} is not a list")
            out[str(stage)] = rows
    else:
        raise ValueError(f"history file {path}: unknown version {version!r}")
    touched: dict[str, float] = {}
    raw = data.get("touched")
    if isinstance(raw, Mapping):
        for stage, t in raw.items():
            if isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t):
                touched[str(stage)] = float(t)
    return out, touched


@contextlib.contextmanager
def _locked(path: str, wait: float) -> Iterator[bool]:
    """Hold an exclusive lock on ``path`` (created if need be) for the block; yields False
    if it could not be had within ``wait`` seconds. Without ``fcntl`` (Windows) no lock is
    taken (the rename still keeps the file whole)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield True
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.01)
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def write(
    path: str,
    rows: Mapping[str, list[Row]],
    fresh: Mapping[str, int],
    window: int,
    max_stages: int,
    now: float | None = None,
) -> bool:
    """Merge this scheduler's observations into the file (module docstring): for each
    stage of ``rows`` (its observations here, oldest first), its last ``fresh[stage]``
    rows are appended to what the file holds of it (all of ``rows[stage]`` if the file has
    none), keeping the last ``window``; at most ``max_stages`` stages, those measured
    longest ago dropped. False if the lock could not be had (nothing written); raises
    ``OSError`` if the file cannot be written."""
    now = time.time() if now is None else now
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with _locked(path + ".lock", LOCK_WAIT) as ok:
        if not ok:
            return False
        try:
            on_disk = read(path)
        except NewerHistory:
            raise
        except ValueError:
            on_disk = None  # not a history now: ours replaces it
        stages, touched = on_disk if on_disk is not None else ({}, {})
        for stage, mine in rows.items():
            n = fresh.get(stage, 0)
            if n <= 0:
                continue
            there = stages.get(stage)
            merged = [*there, *mine[-n:]] if there else list(mine)
            stages[stage] = merged[-window:]
            touched[stage] = now
        if len(stages) > max_stages:
            keep = sorted(stages, key=lambda s: touched.get(s, 0.0))[-max_stages:]
            stages = {s: stages[s] for s in keep}
        data = {
            "version": VERSION,
            "stages": stages,
            "touched": {s: touched[s] for s in stages if s in touched},
        }
        fd, tmp = tempfile.mkstemp(prefix=".daskjobs-history-", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return True
