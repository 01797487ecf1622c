"""The forecast's snapshot: what the scheduler holds that is not finished, compactly.

``daskjobs.forecast`` (:mod:`daskjobs.forecast`) simulates the rest of the work on the
*client*: the scheduler only answers this snapshot (the ``daskjobs_snapshot`` RPC), a
read-only pass that never runs a simulation on its event loop. It holds:

* per unfinished task (``waiting``, ``queued``, ``no-worker``, ``processing``; a backup
  copy is its task's, not a task of its own): its key as text, stage, team, estimate and
  where it came from, the estimate's 10-90% band and the observations behind it, cores,
  dask state, its inputs among the unfinished tasks (row numbers), and its ``sweep``
  annotation if any; a task dask assigned to a worker also its worker, its place in that
  worker's line (executing first, then by priority) and, executing, the seconds it has
  run (the worker's start report if the speculation driver has it, else dask's
  ``WorkerState.executing`` at the worker's last heartbeat, plus the time since it);
* per worker: address, name, threads, believed slow-down (run time / estimate, 1.0
  nominal) and the finished tasks it rests on;
* the policy's name and the settings it was made with, the teams' (fair share's) settings,
  speculation's settings (None when off), the default estimate and team, and the
  scheduler's ``time()`` when the workers' lines were read.

Columns, not a dict per task: lists of numbers and text, what msgpack sends cheaply.
Cost: one pass over the scheduler's tasks (a state test each; O(1) more per unfinished
task) and one over each worker's assigned tasks, a few microseconds per unfinished task.

In slices. The scheduler's event loop is every user's: at 10^5 unfinished tasks one pass
would hold it for about half a second. :func:`snapshot_async` (the RPC's handler and the
scheduler's own forecast, :mod:`daskjobs.plugin.observe.live_forecast`) gives the loop back
(``await asyncio.sleep(0)``) whenever it has held it :data:`SLICE` seconds, looking at
the clock every :data:`CHUNK` tasks; :func:`snapshot` takes the same steps at once. Both
run one generator, :func:`_steps`, so they build the same columns. Tasks change state
while a sliced snapshot waits; what it guarantees then:

* every row is a task that was unfinished when its row was read (a task that finished or
  was forgotten before is left out, one that finishes after keeps the row read before);
  a task that appears after the first pass is not in it;
* inputs (``deps``) name rows of this snapshot only: an input that is not a row (finished,
  dropped) is left out, as a finished one always was;
* each worker's line is read in one slice, after every row, and only a worker still on the
  scheduler then is read; a task in a line has its row's ``state`` read again with it;
  a worker gone before the last slice (the one that lists the workers) leaves its tasks
  without a worker, so the forecast lets them wait again.

Beyond ``limit`` unfinished tasks it refuses (``{"refused": ...}``) rather than hold the
event loop; any error becomes ``{"error": ...}`` (counted in the plugin's errors as
``snapshot``), never an exception into dask.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from daskjobs.config import policy_settings

if TYPE_CHECKING:
    from daskjobs.plugin.observe.explain import Source

__all__ = [
    "CHUNK",
    "LIMIT",
    "SLICE",
    "UNFINISHED",
    "VERSION",
    "Cost",
    "snapshot",
    "snapshot_async",
]

#: Snapshot format version (the client checks it).
VERSION = 1
#: Unfinished tasks a snapshot holds at most unless the caller asks for more.
LIMIT = 1_000_000
#: The dask states of a task that is not finished (and not given up on).
UNFINISHED = frozenset({"waiting", "queued", "no-worker", "processing"})
#: Tasks (rows, inputs, places in a line) between two looks at the clock.
CHUNK = 256
#: Seconds a sliced snapshot holds the event loop before it gives it back.
SLICE = 0.010

_COLUMNS = (
    "key",
    "stage",
    "team",
    "estimate",
    "source",
    "band",
    "samples",
    "cores",
    "state",
    "deps",
    "worker",
    "position",
    "elapsed",
    "sweep",
    "speculate",
)

#: :func:`_steps`: it yields None after each chunk (a caller may give the loop back
#: there) and returns the snapshot.
Steps = Generator[None, None, dict[str, Any]]


@dataclass(slots=True)
class Cost:
    """What a sliced snapshot cost the event loop: seconds held in all (``seconds``), the
    longest slice, and how many slices."""

    seconds: float = 0.0
    longest: float = 0.0
    slices: int = 0


def snapshot(plugin: Source, keys: Any = None, limit: Any = None) -> dict[str, Any]:
    """The snapshot of ``plugin``'s scheduler in one pass (module docstring); never
    raises. It holds the event loop throughout: on the loop, :func:`snapshot_async`."""
    try:
        steps = _steps(plugin, keys, _limit(limit))
        while True:
            next(steps)
    except StopIteration as done:
        return done.value
    except Exception as e:
        return _failed(plugin, e)


async def snapshot_async(
    plugin: Source, keys: Any = None, limit: Any = None, cost: Cost | None = None
) -> dict[str, Any]:
    """The snapshot of ``plugin``'s scheduler, giving the event loop back every
    :data:`SLICE` seconds (module docstring: what it guarantees then); never raises.
    ``cost``, if given, receives what it held the loop."""
    cost = Cost() if cost is None else cost
    clock = time.perf_counter
    t0 = clock()
    try:
        steps = _steps(plugin, keys, _limit(limit))
        while True:
            next(steps)
            held = clock() - t0
            if held >= SLICE:
                cost.seconds += held
                cost.longest = max(cost.longest, held)
                cost.slices += 1
                await asyncio.sleep(0)
                t0 = clock()
    except StopIteration as done:
        return done.value
    except Exception as e:
        return _failed(plugin, e)
    finally:
        held = clock() - t0
        cost.seconds += held
        cost.longest = max(cost.longest, held)
        cost.slices += 1


def _limit(limit: Any) -> int:
    return LIMIT if limit is None else int(limit)


def _failed(plugin: Source, e: Exception) -> dict[str, Any]:
    plugin.audit.failed("snapshot")
    return {"error": f"the daskjobs snapshot failed on the scheduler: {type(e).__name__}: {e}"}


def _refusal(limit: int) -> str:
    return (
        f"more than {limit} unfinished tasks on the scheduler: the snapshot is "
        "refused rather than hold its event loop; pass keys= to forecast part "
        "of the work, or limit= to allow more"
    )


def _unfinished(
    sched: Any, keys: Any, limit: int, is_copy: Any
) -> Generator[None, None, list[Any] | str]:
    """The unfinished tasks (of ``keys`` and their unfinished inputs, if given), or
    the refusal's text beyond ``limit``; yields every :data:`CHUNK` tasks looked at."""
    tasks = sched.tasks
    out: list[Any] = []
    append = out.append
    chunk = CHUNK
    if keys is None:  # a copy: the scheduler's dict may change while this yields
        todo: list[Any] = list(tasks.values())
    else:  # the given keys, and every unfinished task they (transitively) wait for
        todo = []
        seen: set[Any] = set()
        stack = [tasks.get(tuple(k) if isinstance(k, list) else k) for k in keys]
        n = 0
        while stack:
            ts = stack.pop()
            n += 1
            if n % chunk == 0:
                yield
            if ts is None or ts.key in seen or ts.state not in UNFINISHED:
                continue
            seen.add(ts.key)
            todo.append(ts)
            stack.extend(ts.dependencies)
    unfinished = UNFINISHED
    for start in range(0, len(todo), chunk):
        for ts in todo[start : start + chunk]:
            if ts.state in unfinished and not (is_copy is not None and is_copy(ts.key)):
                append(ts)
        if len(out) > limit:
            return _refusal(limit)
        yield
    return out


def _steps(plugin: Source, keys: Any, limit: int) -> Steps:
    """The snapshot (module docstring), yielding between chunks: the one path of
    :func:`snapshot` and :func:`snapshot_async`."""
    sched = plugin.scheduler
    s = plugin.settings
    sp = plugin.speculator
    found = yield from _unfinished(sched, keys, limit, sp.is_copy if sp is not None else None)
    if isinstance(found, str):
        return {"refused": found}
    plugin.ranker.settle()
    cols: dict[str, list[Any]] = {c: [] for c in _COLUMNS}
    row: dict[Any, int] = {}
    kept = yield from _rows(plugin, found, cols, row)
    yield from _inputs(kept, row, cols["deps"])
    now = time.time()
    lined = yield from _lines(sched, sp.starts if sp is not None else {}, row, cols, now)
    # the last slice: the workers, and no task on a worker gone since its line was read
    speeds = {r["worker"]: r for r in plugin.speeds.rows()}
    workers = []
    for ws in list(sched.workers.values()):
        r = speeds.get(ws.address, {})
        workers.append(
            {
                "address": ws.address,
                "name": str(ws.name),
                "threads": int(ws.nthreads),
                "speed": float(r.get("speed", 1.0)),
                "samples": int(r.get("samples", 0)),
            }
        )
    present = {w["address"] for w in workers}
    for address, rows in lined.items():
        if address not in present:
            for i in rows:
                cols["worker"][i] = cols["position"][i] = cols["elapsed"][i] = None
    spec = s.speculation
    return {
        "version": VERSION,
        "time": now,
        "policy": s.policy,
        "policy_settings": policy_settings(s),
        "teams": s.teams.policy_settings(),  # for a what-if under fair-share
        "speculation": dataclasses.asdict(spec) if spec.enabled else None,
        "default_estimate": float(s.default_estimate),
        "default_team": s.teams.default,
        "workers": workers,
        "tasks": cols,
    }


def _rows(
    plugin: Source, found: list[Any], cols: dict[str, list[Any]], row: dict[Any, int]
) -> Generator[None, None, list[Any]]:
    """Each task of ``found`` still unfinished, as a row of ``cols`` (all but ``deps``;
    no worker yet) and its row number in ``row`` (by key); the tasks kept, in row order.
    The kernel of the snapshot, run once per unfinished task: every column's ``append``
    is bound to a local, once."""
    s = plugin.settings
    views_get = plugin.ranker.tasks.get
    default_team = s.teams.default
    default_estimate = float(s.default_estimate)
    unfinished = UNFINISHED
    kept: list[Any] = []
    keep = kept.append
    key_, stage_, team_, estimate_, source_, band_, samples_, cores_, state_ = (
        cols[c].append for c in _COLUMNS[:9]
    )
    worker_, position_, elapsed_, sweep_, speculate_ = (cols[c].append for c in _COLUMNS[10:])
    chunk = CHUNK
    for start in range(0, len(found), chunk):
        for ts in found[start : start + chunk]:
            state = ts.state
            if state not in unfinished:  # finished or forgotten since the first pass
                continue
            key = ts.key
            v = views_get(key)
            ann = ts.annotations
            if v is not None:
                b = v.band
                stage_(v.stage)
                team_(v.team)
                estimate_(float(v.estimate))
                source_(v.source)
                band_([float(b[0]), float(b[1])] if b is not None else None)
                samples_(v.samples)
                cores_(v.cores)
                speculate_(bool(v.speculate))
            else:  # not ranked (the plugin came after the graph): the defaults
                a = ann or {}
                stage_(str(a.get("stage", ts.prefix.name)))
                team_(str(a.get("team", default_team)))
                estimate_(default_estimate)
                source_("default")
                band_(None)
                samples_(0)
                cores_(1)
                speculate_(bool(a.get("speculate", True)))
            sweep = ann.get("sweep") if ann else None
            key_(str(key))
            state_(state)
            worker_(None)
            position_(None)
            elapsed_(None)
            sweep_(str(sweep) if sweep is not None else None)
            row[key] = len(kept)
            keep(ts)
        yield
    return kept


def _inputs(kept: list[Any], row: dict[Any, int], deps: list[Any]) -> Generator[None, None, None]:
    """Each kept task's inputs that are rows (by row number), as read now."""
    append = deps.append
    chunk = CHUNK
    for start in range(0, len(kept), chunk):
        for ts in kept[start : start + chunk]:
            append([row[d.key] for d in ts.dependencies if d.key in row])
        yield


def _lines(
    sched: Any, starts: Any, row: dict[Any, int], cols: dict[str, list[Any]], now: float
) -> Generator[None, None, dict[str, list[int]]]:
    """Each worker's line (executing first, longest running first, then by priority),
    one worker a step, into the rows of its tasks; the rows per worker address."""
    lined: dict[str, list[int]] = {}
    workers = sched.workers
    state, worker, position, elapsed = (
        cols["state"],
        cols["worker"],
        cols["position"],
        cols["elapsed"],
    )
    done = 0
    for ws in list(workers.values()):
        if workers.get(ws.address) is not ws:  # gone since the list was taken
            continue
        executing = ws.executing
        address = ws.address
        # what the worker reported at its last heartbeat, aged to now (a second is the
        # heartbeat's interval on a small cluster: a forecast otherwise counts it as unrun)
        since = max(0.0, now - float(getattr(ws, "last_seen", now) or now))
        assigned = sorted(
            ws.processing,
            key=lambda ts: (ts not in executing, -executing.get(ts, 0.0), ts.priority or ()),
        )
        mine = lined.setdefault(address, [])
        for pos, ts in enumerate(assigned):
            i = row.get(ts.key)
            if i is None:  # not a row: a backup copy, or new since the rows were read
                continue
            ran: float | None = None
            st = starts.get(ts.key)
            if st is not None and st[0] == address:
                ran = max(0.0, now - st[1])
            elif ts in executing:
                ran = float(executing[ts]) + since
            state[i] = ts.state
            worker[i] = address
            position[i] = pos
            elapsed[i] = ran
            mine.append(i)
        done += len(assigned) + 1
        if done >= CHUNK:
            done = 0
            yield
    return lined
