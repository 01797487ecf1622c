"""The scheduler's own forecast: each team's expected end, for the dashboard page and /metrics.

``daskjobs.forecast`` (:mod:`daskjobs.forecasting`) simulates the unfinished work on a
client. The page and Prometheus are served by the scheduler, so the scheduler keeps a
forecast of its own, made the same way, never on its event loop:

* every :data:`TICK` seconds a periodic callback (``daskjobs-forecast`` in
  ``scheduler.periodic_callbacks``) counts the unfinished tasks from dask's per-prefix
  state counts (O(task prefixes)); nothing unfinished: the reading is "done", and nothing
  else is done;
* while there is unfinished work, once every ``daskjobs.forecast.interval`` (the first
  one an interval after work appears), it takes the plugin's snapshot
  (:mod:`daskjobs.plugin.observe.snapshot`) on the event loop (it reads the scheduler's state:
  one pass over its tasks, as a coroutine that gives the loop back every 10 ms) and
  hands it to a daemon thread, :data:`THREAD`, which runs
  :func:`daskjobs.forecasting.forecast_snapshot` with ``daskjobs.forecast.draws``
  simulations (fewer past :data:`BUDGET` seconds, three at least; one, the range
  computed from it, where tasks x draws pass
  :data:`daskjobs.forecasting.SIMULATED`) and hands the result back to the loop. One
  refresh at a time, from its snapshot to its simulation's end; the snapshot is plain
  data, shared with nothing;
* above ``daskjobs.forecast.max-tasks`` unfinished tasks it takes no snapshot: the
  reading says the forecast is off and why.

A failed refresh is counted in the plugin's errors (``forecast``) and logged at WARNING
once (then at DEBUG); the next interval tries again. The page and the metrics read the
latest :class:`Reading` (``plugin.view.forecast()``), aged to the moment they are read:
the remaining time of a forecast made ``age`` seconds ago is its remaining time minus
``age`` (at least 0).

Cost on the event loop: the snapshot, once an interval: one pass over the scheduler's tasks
and O(1) per unfinished task (a few microseconds each: ``max-tasks`` bounds it), in slices
of about 10 ms (:data:`daskjobs.plugin.observe.snapshot.SLICE`), and the check every tick,
O(task prefixes). The simulation's CPU is its thread's, each draw at the simulator's
speed (about 10^5 tasks a second; at most 10^5 task simulations, then one); it holds the
GIL between Python's switches (every 5 ms), so the loop runs on meanwhile, a little later
at each switch.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from daskjobs.plugin.observe.snapshot import UNFINISHED, Cost, snapshot_async
from daskjobs.plugin.parts import Part
from daskjobs.plugin.periodic import Periodic, every
from daskjobs.plugin.surgery import _internals as dask_internals

if TYPE_CHECKING:
    from daskjobs.forecasting import Forecast
    from daskjobs.plugin.audit import Audit

__all__ = ["BUDGET", "NAME", "THREAD", "TICK", "ForecastPart", "Reading"]

logger = logging.getLogger("daskjobs.plugin")

#: Name of the periodic callback in ``scheduler.periodic_callbacks``.
NAME = "daskjobs-forecast"
#: Name of the thread a refresh simulates in.
THREAD = "daskjobs-forecast"
#: Seconds between two looks at the unfinished work.
TICK = 1.0
#: Seconds of drawing a refresh may take before it stops (after three draws at least).
BUDGET = 2.0

_ZERO = (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Reading:
    """What the scheduler's forecast says, or why it says nothing.

    ``state``: ``ok`` (``forecast`` holds one), ``done`` (nothing unfinished), ``waiting``
    (unfinished work, no forecast yet: the first one comes an interval after work
    appears), ``off`` (``why``: switched off, or too many unfinished tasks) or ``failed``
    (``why``: the last refresh's error)."""

    state: str
    why: str = ""
    forecast: Forecast | None = None
    #: seconds the snapshot held the event loop (its slices' sum), and CPU seconds of the
    #: simulation thread
    snapshot_seconds: float = 0.0
    cpu_seconds: float = 0.0
    #: teams whose end the forecast gives (those with unfinished tasks)
    teams: tuple[str, ...] = field(default=())

    def age(self, now: float) -> float | None:
        """Seconds since the forecast's snapshot (``now``: the scheduler's ``time.time()``)."""
        return None if self.forecast is None else max(0.0, now - self.forecast.time)

    def remaining(self, now: float, team: str | None = None) -> tuple[float, float, float] | None:
        """Seconds from ``now`` until the work (of ``team``) ends: p10, p50, p90, each at
        least 0; zeros where nothing of it is unfinished; None without a forecast."""
        if self.state == "done":
            return _ZERO
        f = self.forecast
        if self.state != "ok" or f is None:
            return None
        r = f.remaining if team is None else f.teams.get(team)
        if r is None:
            return _ZERO
        age = max(0.0, now - f.time)
        return (max(0.0, r.p10 - age), max(0.0, r.p50 - age), max(0.0, r.p90 - age))

    def as_dict(self, now: float) -> dict[str, Any]:
        """Plain JSON types: state, why, age, the remaining time overall and per team
        (``{"p10", "p50", "p90"}`` seconds from ``now``), and what it cost."""
        f = self.forecast

        def q(r: tuple[float, float, float] | None) -> dict[str, float] | None:
            return None if r is None else dict(zip(("p10", "p50", "p90"), r, strict=True))

        return {
            "state": self.state,
            "why": self.why,
            "age": self.age(now),
            "remaining": q(self.remaining(now)),
            "teams": {t: q(self.remaining(now, t)) for t in self.teams},
            "tasks": f.tasks if f is not None else 0,
            "draws": f.draws if f is not None else 0,
            "snapshot_seconds": self.snapshot_seconds,
            "cpu_seconds": self.cpu_seconds,
        }


TOO_MANY = (
    "{n} unfinished tasks, more than daskjobs.forecast.max-tasks ({limit}): the scheduler "
    "does not forecast them (too much of its event loop and CPU); `daskjobs forecast "
    "ADDRESS` forecasts them on a client"
)


class ForecastPart(Part):
    """The refresher (module docstring); its latest :attr:`reading` is what the page and
    the metrics show. The plugin it belongs to is the one whose ``parts`` hold it: once no
    plugin of the scheduler does (unregistered: dask does not call ``close`` then), it
    stops."""

    name = "forecast"

    def __init__(self, audit: Audit) -> None:
        self.audit = audit
        self.reading = Reading("waiting")
        self.scheduler: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.periodic: Periodic | None = None
        self.busy = False  # a refresh is under way: its snapshot, or its simulation
        self.pending: asyncio.Task[None] | None = None  # the snapshot, while it is taken
        self.since: float | None = None  # (monotonic) unfinished work seen since then
        self.last = -math.inf  # (monotonic) the last refresh's snapshot
        self.owned = False  # a plugin of the scheduler held this part once
        self.failures = 0
        self.refreshes = 0

    async def start(self, scheduler: Any) -> None:
        # imported here, on the event loop at start, not by the thread (the import lock)
        import daskjobs.forecasting
        import daskjobs.replay.run  # noqa: F401  (the forecast's pinned placement)

        self.scheduler = scheduler
        self.loop = asyncio.get_running_loop()
        self.periodic = every(scheduler, NAME, TICK, self.tick)

    async def close(self) -> None:
        self.stop()

    def stop(self) -> None:
        if self.periodic is not None:
            self.periodic.stop()
            self.periodic = None
        if self.pending is not None:
            self.pending.cancel()

    def _owner(self) -> Any:
        for p in list(getattr(self.scheduler, "plugins", {}).values()):
            if any(part is self for part in getattr(p, "parts", ())):
                return p
        return None

    def tick(self) -> None:
        try:
            self._tick()
        except Exception:
            self.audit.failed(self.name)

    def _tick(self) -> None:
        plugin = self._owner()
        if plugin is None:
            if self.owned:  # unregistered
                self.stop()
            return
        self.owned = True
        fs = plugin.settings.forecast  # the scheduler's own (trust: plugin/trust.py)
        if fs.interval is None:
            self.reading = Reading("off", "daskjobs.forecast.interval is null")
            return
        now = time.monotonic()
        n = dask_internals.state_count(self.scheduler, UNFINISHED)  # -1: unknown
        if n == 0:
            self.since = None
            if self.reading.state != "done":
                self.reading = Reading("done")
            return
        if self.since is None:
            self.since = now
        if n > fs.max_tasks:
            self.reading = Reading("off", TOO_MANY.format(n=n, limit=fs.max_tasks))
            return
        if self.reading.state in ("done", "off"):
            self.reading = Reading("waiting")
        if self.busy or now - max(self.since, self.last) < fs.interval:
            return
        loop = self.loop
        if loop is None:  # not started
            return
        self.last = now
        self.busy = True
        self.pending = loop.create_task(self._refresh(plugin, fs.max_tasks, fs.draws))

    async def _refresh(self, plugin: Any, max_tasks: int, draws: int) -> None:
        """On the loop: the snapshot, in slices; then the simulation, in its thread."""
        started = False
        try:
            cost = Cost()
            snap = await snapshot_async(plugin, limit=max_tasks, cost=cost)
            started = self.periodic is not None and self._hand_over(snap, draws, cost.seconds)
        except Exception:
            self.audit.failed(self.name)
        finally:
            self.pending = None
            if not started:
                self.busy = False

    def _hand_over(self, snap: dict[str, Any], draws: int, took: float) -> bool:
        """The snapshot to the simulation's thread (True), or the reading that says why
        not (False)."""
        if "tasks" not in snap:  # refused (beyond the limit), failed, or removed
            why = snap.get("refused") or snap.get("error") or "the plugin was removed"
            self.reading = Reading("off" if "refused" in snap else "failed", str(why))
            return False
        if not snap["tasks"]["key"]:
            self.reading = Reading("done")
            return False
        if not snap["workers"]:
            self.reading = Reading("waiting", "the scheduler has no workers to forecast on")
            return False
        threading.Thread(
            target=self._simulate, args=(snap, draws, took), name=THREAD, daemon=True
        ).start()
        return True

    def _simulate(self, snap: dict[str, Any], draws: int, took: float) -> None:
        """In :data:`THREAD`: the simulation, its result handed back to the loop."""
        from daskjobs.forecasting import forecast_snapshot

        c0 = time.thread_time()
        out: Reading | None = None
        error: BaseException | None = None
        try:
            f = forecast_snapshot(snap, draws=draws, budget=BUDGET)
            teams = tuple(sorted(f.teams))
            out = Reading("ok", "", f, took, time.thread_time() - c0, teams)
        except Exception as e:
            error = e
        loop = self.loop
        try:
            if loop is not None:
                loop.call_soon_threadsafe(self._finished, out, error)
        except RuntimeError:  # the loop closed meanwhile: nobody reads it any more
            pass

    def _finished(self, out: Reading | None, error: BaseException | None) -> None:
        """On the loop: the thread's result."""
        self.busy = False
        if self.periodic is None:  # stopped meanwhile
            return
        if out is not None:
            self.refreshes += 1
            if self.reading.state in ("waiting", "ok", "failed"):  # not done/off since
                self.reading = out
            return
        self.failures += 1
        self.audit.errors[self.name] = self.audit.errors.get(self.name, 0) + 1
        log = logger.warning if self.failures == 1 else logger.debug
        log(
            "daskjobs: the scheduler's forecast failed (the first failure is logged at "
            "WARNING, the next ones at DEBUG; each is counted in the plugin's errors)",
            exc_info=(type(error), error, error.__traceback__) if error is not None else None,
        )
        self.reading = Reading("failed", f"{type(error).__name__}: {error}")
