"""The daskjobs page on the scheduler's dashboard: ``/daskjobs``, and its data as JSON.

What it shows
-------------
Per team: the worker threads its tasks hold now (backup copies included, and how many
of them are copies: never more than the threads that exist; see
:func:`daskjobs.plugin.observe.explain.running_slots`), the tasks dask assigned to workers
(running or waiting there: what fair share counts as held), the core-seconds booked to it (a
task several teams' graphs want split among them), tasks queued, the share of the
threads it holds beside its target share, and its *queue delay* (the longest wait so
far of a task of the team in dask's queue), now and over the last ten minutes, and its
*expected end*: when its last unfinished task is expected to end, a median and a 10-90%
band from now, from the scheduler's own forecast (:mod:`daskjobs.plugin.observe.live_forecast`,
refreshed every ``daskjobs.forecast.interval`` off the event loop), with its age. Backup
copies launched, won, lost, and *copy waste*: the seconds the losing side of each race
ran (a losing copy, or a primary its copy beat); attempts that failed or died with
their worker are counted apart (failed seconds), never as copy waste. Each worker's
measured slow-down. The latest audit events, without the routine ``worker-speed``
updates (one a finished task; the workers table holds what they say). The same data
is served as JSON at ``/daskjobs/data.json`` for tests and operators (``curl``, a
notebook).

How it is served
----------------
The page is a Bokeh application, as distributed's own pages are, on the
scheduler's own web server: :func:`install_dashboard` (called by
``JobsPlugin.start``) makes a second Bokeh server application with distributed's
own factory (``distributed.dashboard.core.BokehApplication``: the same
websocket-origin and session settings, the same prefix), and adds it and a small
tornado application for the JSON to the scheduler's HTTP router
(``scheduler.http_application.add_application``, the hook distributed uses for
its Jupyter server). The router asks its applications in turn, so ``/daskjobs``
is ours and every other path stays distributed's; ``/sitemap.json`` lists both.
The page extends distributed's template (its navigation bar), and ``daskjobs`` is
added to the bar's pages (``template_variables(scheduler)["pages"]``, the list
every page of the scheduler renders). :func:`uninstall_dashboard` (called by
``JobsPlugin.close``) undoes each step; a plugin unregistered without ``close``
(dask does not call it then) is noticed by the sampler within a tick.

Cost
----
One sampler per scheduler (a ``PeriodicCallback`` in
``scheduler.periodic_callbacks``, every second) reads the plugin's public
summaries - ``view.teams()``, ``view.worker_speeds()``, ``speculator.stats()`` - and keeps a
ring of samples: O(teams + workers + tasks assigned to workers) per tick (the threads
each team holds are counted over the workers' assigned tasks, at most
``worker-saturation`` times the threads), never a scan over queued or waiting tasks. Each open
page streams the new samples and redraws its tables from the latest one:
O(teams + workers + shown events) per tick. The queue delay needs the oldest
queued task of each team, which no summary holds: a :class:`QueueClock`, a
scheduler plugin of O(1) per transition, keeps each team's queued tasks in the
order they entered dask's queue (the first one is the oldest), seeded once from
``scheduler.queued`` when the page is installed. Tasks with inputs never wait in
dask's queue (dask sends them to a worker as soon as they are runnable) and do
not count; neither do tasks while ``distributed.scheduler.worker-saturation`` is
``inf`` (no queue at all).

Safety
------
Nothing here may break the scheduler or the plugin: install and uninstall never
raise (a failure is logged at WARNING); every tick, page update and request is
guarded, and a failing page shows a message instead of data. Without Bokeh, or
with the dashboard switched off, there is no page: logged once at INFO, and the
plugin runs as before (``pip install 'daskjobs[dashboard]'``).
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from html import escape
from itertools import islice
from typing import TYPE_CHECKING, Any, NamedTuple

from daskjobs._text import ahead
from daskjobs.plugin.observe.live_forecast import Reading
from daskjobs.plugin.periodic import every
from daskjobs.plugin.surgery import _internals as dask_internals

if TYPE_CHECKING:
    from dask.typing import Key
    from distributed.scheduler import Scheduler

__all__ = [
    "DATA_PATH",
    "PAGE",
    "Dashboard",
    "QueueClock",
    "install_dashboard",
    "installed",
    "uninstall_dashboard",
]

logger = logging.getLogger("daskjobs.plugin")

#: The page's name in the dashboard's navigation bar and its path (under the prefix).
PAGE = "daskjobs"
#: The JSON with the page's data (under the dashboard's prefix).
DATA_PATH = "daskjobs/data.json"
#: Name of the sampler in ``scheduler.periodic_callbacks``.
NAME = "daskjobs-dashboard"
#: How often the sampler and each open page update, in milliseconds.
INTERVAL_MS = 1000
#: Samples kept (ten minutes at one a second).
HISTORY = 600
#: Audit events shown on the page and in the JSON.
EVENTS = 25
#: Audit actions left out of the page's table (routine, one per finished task).
ROUTINE = frozenset({"worker-speed"})
#: The most audit events read to find the latest ``EVENTS`` that are not routine.
SCAN = 2000
#: Backup-copy outcomes, as ``Speculator.stats()`` counts them.
OUTCOMES = ("launched", "won", "lost", "failed", "abandoned", "running", "peak")

_missing_logged = False


def _log_missing(reason: str) -> None:
    """DEBUG once per process: the plugin runs, only the page is absent (a laptop without
    the dashboard extra did not ask for it)."""
    global _missing_logged
    if not _missing_logged:
        _missing_logged = True
        logger.debug("daskjobs: no dashboard page: %s", reason)


class QueueClock:
    """When each task of each team entered dask's queue; O(1) per transition.

    State: ``entered`` {team: OrderedDict{key: time entered}} in entry order (the
    first entry of a team is its oldest queued task), ``team_of`` {key: team} of the
    tasks in the queue now. A task's team is the plugin's (its ``team``
    annotation), else the default team. A part of the plugin's transitions
    (``plugin.transitions.add``), called for the transitions into and out of dask's
    queue: one scheduler plugin fewer for dask to call at every transition.
    """

    def __init__(self, plugin: Any) -> None:
        self.plugin = plugin
        self.entered: dict[str, OrderedDict[Key, float]] = {}
        self.team_of: dict[Key, str] = {}

    def _team(self, key: Key) -> str:
        v = self.plugin.tasks.get(key)
        return v.team if v is not None else self.plugin.settings.teams.default

    def enter(self, key: Key, now: float) -> None:
        team = self._team(key)
        self.team_of[key] = team
        q = self.entered.get(team)
        if q is None:
            q = self.entered[team] = OrderedDict()
        q[key] = now

    def leave(self, key: Key) -> None:
        team = self.team_of.pop(key, None)
        if team is not None:
            self.entered[team].pop(key, None)

    def seed(self, queued: Iterable[Any], now: float) -> None:
        """Tasks already queued when the clock starts: their wait counts from now. O(n) once."""
        for ts in queued:
            self.enter(ts.key, now)

    name = "dashboard"  # where the plugin counts its errors

    def wants(self, start: str, finish: str) -> bool:
        return finish == "queued" or start == "queued"

    def transition(self, step: Any) -> None:
        if step.finish == "queued":
            self.enter(step.key, time.time())
        elif step.start == "queued":
            self.leave(step.key)

    def oldest(self, team: str, now: float) -> float:
        """Seconds the oldest queued task of ``team`` has waited (0.0 if none). O(1)."""
        q = self.entered.get(team)
        if not q:
            return 0.0
        return max(0.0, now - next(iter(q.values())))

    def waiting(self, team: str) -> int:
        q = self.entered.get(team)
        return len(q) if q else 0


class TeamPoint(NamedTuple):
    running: float  # threads held now (copies included; at most the threads that exist)
    queued: int
    share: float  # of the threads held, now
    delay: float  # seconds, longest wait in dask's queue


class Sample(NamedTuple):
    """One tick of the sampler."""

    seq: int
    time: float
    teams: dict[str, TeamPoint]
    launched: int
    won: int
    waste: float  # seconds run by the losing side of backup races, all teams


#: The columns of a team row the plugin has not (a team only the queue or the forecast names).
_NO_ROW = ("share", "usage", "running", "copies", "assigned", "booked", "queued", "quota")


def _quantiles(r: tuple[float, float, float] | None) -> dict[str, float] | None:
    return None if r is None else {"p10": r[0], "p50": r[1], "p90": r[2]}


def _finite(x: Any) -> Any:
    """A JSON-safe number: NaN and infinities become None."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _jsonable(obj: Any, depth: int = 0) -> Any:
    """Plain JSON types for an audit event (keys may be tuples, values anything)."""
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        return _finite(obj)
    if depth > 4:
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [_jsonable(v, depth + 1) for v in obj]
    return str(obj)


def _update(source: Any, data: dict[str, list[Any]]) -> None:
    """Put ``data`` into a Bokeh source in place, as distributed's pages do (a table
    redraws on the columns' change events), and only when it changed."""
    if source.data != data:
        source.data.update(data)


def _worker_label(w: dict[str, Any]) -> str:
    name = w.get("name")
    return f"{name} ({w['worker']})" if name not in (None, "", w["worker"]) else str(w["worker"])


def _details(event: dict[str, Any], limit: int = 160) -> str:
    text = ", ".join(f"{k}={v}" for k, v in event.items() if k not in ("time", "action"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Dashboard:
    """The page's data for one scheduler: the sampler, the queue clock and the served apps.

    ``plugin`` is the :class:`~daskjobs.plugin.JobsPlugin` whose public summaries it
    reads (replaced when another plugin is installed on the same scheduler).
    """

    def __init__(self, plugin: Any, scheduler: Scheduler, clock: QueueClock) -> None:
        self.plugin = plugin
        self.scheduler = scheduler
        self.clock = clock
        self.samples: deque[Sample] = deque(maxlen=HISTORY)
        self.seq = 0
        self.prefix = "/"
        self.apps: list[Any] = []  # what was added to the scheduler's HTTP router
        self.bokeh_app: Any = None
        self.sitemap: list[tuple[Any, Any]] = []  # (rule, distributed's handler) replaced
        self.sampler: Any = None
        self.active = True

    # -- reading the plugin: O(teams + workers) ---------------------------------------
    def teams(self, now: float) -> list[dict[str, Any]]:
        """Per team: the plugin's row, the share of running slots it holds, queue delay."""
        plugin = self.plugin
        rows = [dict(r) for r in plugin.view.teams()]
        clock = self.clock
        seen = {r["team"] for r in rows}
        # teams with queued tasks the policy does not know (no fair share: one team), and
        # teams with unfinished work the scheduler's forecast names
        for team in clock.entered:
            if team not in seen and clock.waiting(team):
                seen.add(team)
                rows.append(dict.fromkeys(_NO_ROW) | {"team": team, "queued": clock.waiting(team)})
        reading = plugin.view.forecast()
        for team in reading.teams if reading is not None else ():
            if team not in seen:
                seen.add(team)
                rows.append(dict.fromkeys(_NO_ROW) | {"team": team})
        total = sum(r["running"] or 0 for r in rows)
        sp = plugin.speculator
        st = sp.stats() if sp is not None else {}
        waste = st.get("waste_seconds", {})
        failed = st.get("failed_seconds", {})
        out = []
        for r in rows:
            running = r["running"]
            out.append(
                {
                    "team": r["team"],
                    "running": running,
                    "copies": r.get("copies"),
                    "assigned": r.get("assigned"),
                    "booked": _finite(r.get("booked")),
                    "queued": r["queued"],
                    "share": (running or 0) / total if total else 0.0,
                    "target": r["share"],
                    "quota": r["quota"],
                    "usage": _finite(r["usage"]),
                    "queue_delay": clock.oldest(r["team"], now),
                    "in_queue": clock.waiting(r["team"]),
                    "waste_seconds": float(waste.get(r["team"], 0.0)),
                    "failed_seconds": float(failed.get(r["team"], 0.0)),
                    # the certificate identities of the clients charged to it (teams bound)
                    "identities": list(r.get("identities") or ()),
                    # seconds from now until its work ends (p10, p50, p90), from the
                    # scheduler's forecast; zeros: nothing of it unfinished; None: none
                    "expected_end": _quantiles(
                        reading.remaining(now, r["team"]) if reading is not None else None
                    ),
                }
            )
        return out

    def forecast(self, now: float) -> dict[str, Any]:
        """The scheduler's forecast (:mod:`daskjobs.plugin.observe.live_forecast`), aged to
        ``now``."""
        reading = self.plugin.view.forecast()
        if reading is None:
            reading = Reading("off", "daskjobs.forecast.interval is null")
        return reading.as_dict(now)

    def backups(self) -> dict[str, Any] | None:
        sp = self.plugin.speculator
        if sp is None:
            return None
        st = sp.stats()
        out: dict[str, Any] = {k: st.get(k, 0) for k in OUTCOMES}
        waste = {str(t): float(s) for t, s in st.get("waste_seconds", {}).items()}
        out["waste_seconds"] = waste
        out["waste_total"] = sum(waste.values())
        failed = {str(t): float(s) for t, s in st.get("failed_seconds", {}).items()}
        out["failed_seconds"] = failed
        out["failed_total"] = sum(failed.values())
        return out

    def workers(self) -> list[dict[str, Any]]:
        return [
            {**w, "speed": _finite(float(w["speed"]))}
            for w in self.plugin.view.worker_speeds()
            if w.get("present", True)
        ]

    def events(self, n: int = EVENTS) -> list[dict[str, Any]]:
        """The latest ``n`` audit events, newest first, without the routine ones
        (:data:`ROUTINE`: a ``worker-speed`` update per finished task would flood the
        table; the workers table shows what they say). Looks at most ``SCAN`` events."""
        latest = islice(reversed(self.plugin.events), SCAN)
        kept = (e for e in latest if e.get("action") not in ROUTINE)
        return [_jsonable(e) for e in islice(kept, n)]

    # -- the sampler ------------------------------------------------------------------
    def sample(self) -> Sample:
        """Read the plugin once and keep the point. O(teams + workers)."""
        now = time.time()
        teams = {
            r["team"]: TeamPoint(r["running"] or 0, r["queued"] or 0, r["share"], r["queue_delay"])
            for r in self.teams(now)
        }
        b = self.backups()
        self.seq += 1
        s = Sample(
            self.seq,
            now,
            teams,
            b["launched"] if b else 0,
            b["won"] if b else 0,
            b["waste_total"] if b else 0.0,
        )
        self.samples.append(s)
        return s

    def since(self, seq: int) -> list[Sample]:
        """The samples after ``seq``, oldest first. O(new samples)."""
        new = self.seq - seq
        if new <= 0:
            return []
        return list(islice(reversed(self.samples), min(new, len(self.samples))))[::-1]

    def tick(self) -> None:
        if not self.active:
            return
        try:
            if not self._plugin_registered():
                # unregistered: dask does not call close() then; step aside
                uninstall_dashboard(self.scheduler, self.plugin)
                return
            self.sample()
        except Exception:
            self.plugin.audit.failed("dashboard")

    def _plugin_registered(self) -> bool:
        plugins = getattr(self.scheduler, "plugins", {})
        return any(p is self.plugin for p in plugins.values())

    # -- the JSON ---------------------------------------------------------------------
    def data(self) -> dict[str, Any]:
        """Everything the page shows, now and over time, as plain JSON types."""
        now = time.time()
        plugin = self.plugin
        history: dict[str, Any] = {"time": [], "teams": {}, "launched": [], "won": [], "waste": []}
        samples = list(self.samples)
        names: dict[str, None] = {}
        for s in samples:
            names.update(dict.fromkeys(s.teams))
        series: dict[str, dict[str, list[Any]]] = {
            t: {"running": [], "queued": [], "share": [], "queue_delay": []} for t in names
        }
        for s in samples:
            history["time"].append(s.time)
            history["launched"].append(s.launched)
            history["won"].append(s.won)
            history["waste"].append(s.waste)
            for t, cols in series.items():
                p = s.teams.get(t)
                cols["running"].append(p.running if p else None)
                cols["queued"].append(p.queued if p else None)
                cols["share"].append(p.share if p else None)
                cols["queue_delay"].append(p.delay if p else None)
        history["teams"] = series
        return {
            "page": PAGE,
            "time": now,
            "scheduler": str(getattr(self.scheduler, "address", "")),
            "policy": plugin.settings.policy,
            "tasks": len(plugin.tasks),
            "ranked_graphs": plugin.view.ranked_graphs,
            "teams": self.teams(now),
            "backups": self.backups(),
            "workers": self.workers(),
            "events": self.events(),
            "errors": dict(plugin.errors),
            "forecast": self.forecast(now),
            "interval": INTERVAL_MS / 1000,
            "history": history,
        }


# -- the Bokeh page -----------------------------------------------------------------------


def _bokeh(*names: str) -> list[Any]:
    """``bokeh.<name>`` modules, untyped: Bokeh's own annotations describe its property
    system, not the values a page assigns (and Bokeh is an optional dependency)."""
    return [importlib.import_module(f"bokeh.{n}") for n in names]


#: distributed's page template (its navigation bar) with a heading served as HTML: what
#: the page is and where its JSON is, readable before the Bokeh document arrives.
_TEMPLATE = """{% extends "simple.html" %}
{% block content %}
<div id="daskjobs-intro" style="padding: 0 1em">
<h2>daskjobs</h2>
<p>Fair share per team, queue delay, backup copies, worker speeds and the latest audit
events of the daskjobs scheduler plugin. The same data as JSON:
<a href="daskjobs/data.json">daskjobs/data.json</a>.</p>
</div>
{{ super() }}
{% endblock %}
"""


def _page_doc(dash: Dashboard, scheduler: Any, extra: dict[str, Any], doc: Any) -> None:
    """One browser session's document (Bokeh calls it for each page load)."""
    from distributed.dashboard.components.scheduler import BOKEH_THEME, env

    (models,) = _bokeh("models")

    doc.title = "Dask: daskjobs"
    try:
        page = _Page(dash)
        page.update()
        doc.add_root(page.root)
        page.callback = doc.add_periodic_callback(page.tick, INTERVAL_MS)
        page.doc = doc
    except Exception:
        logger.warning("daskjobs: the dashboard page failed", exc_info=True)
        doc.add_root(
            models.Div(text="<p>daskjobs: this page failed; the scheduler log says why.</p>")
        )
    doc.template = env.from_string(_TEMPLATE)
    doc.template_variables.update(extra)
    doc.theme = BOKEH_THEME


#: Tables are HTML in a Bokeh ``Div``: Bokeh 3.9's ``DataTable`` stops redrawing after its
#: first update (bokeh#15328, fixed after 3.9.2), and a few rows need no grid widget.
_CSS = """
table { border-collapse: collapse; width: 100%; font-size: 12px; }
th { text-align: left; border-bottom: 1px solid #888; padding: 3px 8px; font-weight: 600; }
td { padding: 2px 8px; border-bottom: 1px solid #e3e3e3; white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.wrap { white-space: normal; word-break: break-all; }
h3 { margin: 4px 0; font-size: 14px; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 5px; }
.scroll { max-height: 260px; overflow-y: auto; }
.note { color: #555; font-size: 11px; margin: 3px 0; white-space: normal; }
"""


def _num(x: Any, fmt: str = "{:.2f}") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return ""
    return fmt.format(x) if isinstance(x, float) else str(x)


#: What the teams table's figures count, under it.
_TEAM_NOTE = (
    '<p class="note">Threads held: worker threads the team\'s tasks and backup copies hold '
    "now (a worker holding more tasks than threads shares them out), never more than the "
    "threads that exist. Assigned: its tasks dask sent to workers, running or waiting "
    "there (what fair share counts as held). Booked: core-seconds so far. A task several teams' "
    "graphs want is split equally among them. Expected end: when the team's last "
    "unfinished task is expected to end, from now, median (10th to 90th percentile), from "
    "the scheduler's own forecast (made every daskjobs.forecast.interval); done: nothing of "
    "it unfinished. Copy waste: seconds the losing side of backup races ran. Failed: "
    "seconds of attempts that failed or died with their worker.</p>"
)


def _expected(forecast: dict[str, Any]) -> str:
    """The header's line of the scheduler's forecast (:meth:`Dashboard.forecast`)."""
    state, why = forecast["state"], forecast.get("why") or ""
    if state == "ok":
        return (
            f"expected to end {ahead(forecast['remaining'])} (forecast {forecast['age']:.0f} s ago)"
        )
    if state == "done":
        return "nothing unfinished"
    if state == "waiting":
        return "forecast to come" + (f" ({why})" if why else "")
    return f"forecast {state}: {why}"


#: What the workers table's figure is, under it.
_SPEED_NOTE = (
    '<p class="note">Slow-down: run time / estimate of the tasks that finished there '
    "(geometric mean, pulled to 1 until a few did). It measures the worker and the "
    "estimates together: compare workers with each other. A worker that left keeps "
    "its figure and gets it back when it returns under the same name.</p>"
)


def _table(title: str, head: list[str], rows: list[list[str]], numeric: set[int]) -> str:
    """An HTML table; cells are escaped by the caller (they may carry markup)."""

    def cls(i: int) -> str:
        return ' class="num"' if i in numeric else ""

    ths = "".join(f"<th{cls(i)}>{h}</th>" for i, h in enumerate(head))
    trs = "".join(
        "<tr>" + "".join(f"<td{cls(i)}>{c}</td>" for i, c in enumerate(r)) + "</tr>" for r in rows
    )
    return f"<h3>{title}</h3><table><thead><tr>{ths}</tr></thead><tbody>{trs}</tbody></table>"


class _Page:
    """The Bokeh models of one open page and their update (O(teams + workers + events))."""

    def __init__(self, dash: Dashboard) -> None:
        layouts, models, palettes, plotting = _bokeh("layouts", "models", "palettes", "plotting")
        column, row, figure = layouts.column, layouts.row, plotting.figure
        ColumnDataSource, Div = models.ColumnDataSource, models.Div
        FactorRange, Range1d = models.FactorRange, models.Range1d

        self.dash = dash
        self.palette = palettes.Category10_10
        self.colors: dict[str, str] = {}
        self.lines: dict[str, Any] = {}  # team -> its time-series source
        self.seen = 0  # last sample streamed
        self.callback: Any = None
        self.doc: Any = None

        def div(**kw: Any) -> Any:
            return Div(text="", stylesheets=[_CSS], sizing_mode="stretch_width", **kw)

        self.header = div()
        self.team_div = div()
        self.share_src = ColumnDataSource({"x": [], "top": [], "color": []})
        self.share_fig = figure(
            title="Share of the threads held: now vs target",
            x_range=FactorRange(),
            y_range=Range1d(0, 1.05),
            height=220,
            sizing_mode="stretch_width",
            toolbar_location=None,
            tools="",
        )
        self.share_fig.vbar(x="x", top="top", color="color", width=0.8, source=self.share_src)
        self.share_fig.xgrid.grid_line_color = None

        def timeseries(title: str) -> Any:
            return figure(
                title=title,
                x_axis_type="datetime",
                height=220,
                sizing_mode="stretch_width",
                toolbar_location="above",
                tools="pan,wheel_zoom,box_zoom,reset",
            )

        self.running_fig = timeseries("Threads held per team (copies included)")
        self.delay_fig = timeseries("Queue delay per team (s): longest wait in dask's queue")
        self.backup_src = ColumnDataSource({"time": [], "launched": [], "won": [], "waste": []})
        self.backup_fig = timeseries("Backup copies (cumulative)")
        for field, color in (("launched", "#1f77b4"), ("won", "#2ca02c")):
            self.backup_fig.line(
                "time", field, source=self.backup_src, color=color, line_width=2, legend_label=field
            )
        self.backup_fig.legend.location = "top_left"
        self.backup_div = div()
        self.worker_src = ColumnDataSource({"label": [], "speed": [], "color": []})
        self.worker_fig = figure(
            title="Worker slow-down (run time / estimate; compare workers)",
            y_range=FactorRange(),
            height=220,
            sizing_mode="stretch_width",
            toolbar_location=None,
            tools="",
        )
        self.worker_fig.hbar(
            y="label", right="speed", height=0.7, color="color", source=self.worker_src
        )
        self.worker_fig.ygrid.grid_line_color = None
        self.worker_div = div()
        self.event_div = div()
        self.root = column(
            self.header,
            row(self.team_div, self.share_fig, sizing_mode="stretch_width"),
            row(self.running_fig, self.delay_fig, sizing_mode="stretch_width"),
            row(
                column(self.backup_div, self.backup_fig, sizing_mode="stretch_width"),
                column(self.worker_fig, self.worker_div, sizing_mode="stretch_width"),
                sizing_mode="stretch_width",
            ),
            self.event_div,
            sizing_mode="stretch_width",
        )

    def color(self, team: str) -> str:
        c = self.colors.get(team)
        if c is None:
            c = self.colors[team] = self.palette[len(self.colors) % len(self.palette)]
        return c

    def _team_line(self, team: str) -> Any:
        src = self.lines.get(team)
        if src is None:
            (models,) = _bokeh("models")
            data: dict[str, list[Any]] = {"time": [], "running": [], "delay": []}
            src = self.lines[team] = models.ColumnDataSource(data)
            c = self.color(team)
            for f, y in ((self.running_fig, "running"), (self.delay_fig, "delay")):
                f.line("time", y, source=src, color=c, line_width=2, legend_label=team)
                f.legend.location = "top_left"
        return src

    def tick(self) -> None:
        dash = self.dash
        if not dash.active:
            if self.doc is not None and self.callback is not None:
                self.doc.remove_periodic_callback(self.callback)
                self.callback = None
            return
        try:
            self.update()
        except Exception:
            dash.plugin.audit.failed("dashboard")

    def update(self) -> None:
        dash = self.dash
        plugin = dash.plugin
        now = time.time()
        teams = dash.teams(now)
        backups = dash.backups()
        workers = dash.workers()
        clock = time.strftime("%H:%M:%S", time.localtime(now))
        forecast = dash.forecast(now)
        _set(
            self.header,
            f"<p>policy <b>{escape(str(plugin.settings.policy))}</b> · {len(teams)} team(s) · "
            f"{len(workers)} worker(s) measured · {len(plugin.tasks)} task(s) tracked · "
            f"{sum(plugin.errors.values())} hook error(s) · updated {clock}</p>"
            f"<p>all work: <b>{escape(_expected(forecast))}</b></p>",
        )
        self._teams(teams, forecast)
        self._series()
        self._backups(backups)
        self._workers(workers)
        self._events(dash.events())

    def _teams(self, teams: list[dict[str, Any]], forecast: dict[str, Any]) -> None:
        rows = [
            [
                f'<span class="swatch" style="background:{self.color(r["team"])}"></span>'
                + escape(str(r["team"])),
                _num(r["running"]),
                _num(r["copies"]),
                _num(r["assigned"]),
                _num(r["booked"], "{:.1f}"),
                _num(r["queued"]),
                escape(ahead(r["expected_end"], "–")),
                _num(r["share"]),
                _num(r["target"]),
                _num(r["quota"]),
                _num(r["queue_delay"], "{:.1f}"),
                _num(r["waste_seconds"], "{:.1f}"),
                _num(r["failed_seconds"], "{:.1f}"),
                escape(", ".join(r["identities"])) or "–",
            ]
            for r in teams
        ]
        head = [
            "Team",
            "Threads held",
            "of which copies",
            "Assigned",
            "Booked (core-s)",
            "Queued",
            "Expected end"
            + (f" (forecast {forecast['age']:.0f} s ago)" if forecast["age"] is not None else ""),
            "Share now",
            "Target",
            "Quota",
            "Queue delay (s)",
            "Copy waste (s)",
            "Failed (s)",
            "Identities",
        ]
        _set(self.team_div, _table("Teams", head, rows, set(range(1, 13))) + _TEAM_NOTE)
        factors = [(r["team"], what) for r in teams for what in ("now", "target")]
        if list(self.share_fig.x_range.factors) != factors:
            self.share_fig.x_range.factors = factors
        _update(
            self.share_src,
            {
                "x": factors,
                "top": [v for r in teams for v in (r["share"], r["target"] or 0.0)],
                "color": [c for r in teams for c in (self.color(r["team"]), "#bbbbbb")],
            },
        )

    def _series(self) -> None:
        """Stream the samples taken since the last update: O(teams) per new sample."""
        new = self.dash.since(self.seen)
        if not new:
            return
        self.seen = new[-1].seq
        rows: dict[str, dict[str, list[Any]]] = {}
        for s in new:
            for team, p in s.teams.items():
                r = rows.setdefault(team, {"time": [], "running": [], "delay": []})
                r["time"].append(s.time * 1000)
                r["running"].append(p.running)
                r["delay"].append(p.delay)
        for team, r in rows.items():
            self._team_line(team).stream(r, rollover=HISTORY)
        self.backup_src.stream(
            {
                "time": [s.time * 1000 for s in new],
                "launched": [s.launched for s in new],
                "won": [s.won for s in new],
                "waste": [s.waste for s in new],
            },
            rollover=HISTORY,
        )

    def _backups(self, b: dict[str, Any] | None) -> None:
        if b is None:
            _set(self.backup_div, "<h3>Backups</h3><p>speculation is off</p>")
            return
        _set(
            self.backup_div,
            "<h3>Backups</h3><p>"
            + " · ".join(
                f"{k} <b>{b[k]}</b>" for k in ("launched", "won", "lost", "failed", "running")
            )
            + f" · copy waste <b>{b['waste_total']:.1f} s</b> (what the losing side of "
            "each race ran) · failed or lost attempts, apart "
            f"<b>{b['failed_total']:.1f} s</b></p>",
        )

    def _workers(self, workers: list[dict[str, Any]]) -> None:
        labels = [_worker_label(w) for w in workers]
        if list(self.worker_fig.y_range.factors) != labels:
            self.worker_fig.y_range.factors = labels
        speeds = [w["speed"] if w["speed"] is not None else math.nan for w in workers]
        _update(
            self.worker_src,
            {
                "label": labels,
                "speed": speeds,
                "color": ["#d62728" if (s or 0) > 1.5 else "#1f77b4" for s in speeds],
            },
        )
        rows = [[escape(str(w["worker"])), _num(w["speed"]), _num(w["samples"])] for w in workers]
        head = ["Worker", "Slow-down (measured)", "Samples"]
        table = _table("Workers", head, rows, {1, 2}) + _SPEED_NOTE
        _set(self.worker_div, f'<div class="scroll">{table}</div>')

    def _events(self, events: list[dict[str, Any]]) -> None:
        rows = [
            [
                time.strftime("%H:%M:%S", time.localtime(e["time"])) if e.get("time") else "",
                escape(str(e.get("action", ""))),
                f'<span class="wrap">{escape(_details(e))}</span>',
            ]
            for e in events
        ]
        _set(
            self.event_div,
            _table("Latest audit events", ["Time", "Action", "Details"], rows, set()),
        )


def _set(div: Any, text: str) -> None:
    if div.text != text:
        div.text = text


# -- the JSON handler ----------------------------------------------------------------------


def _data_handler() -> type:
    from tornado import web

    class DataHandler(web.RequestHandler):
        """``GET /daskjobs/data.json``: :meth:`Dashboard.data` as JSON."""

        def initialize(self, dashboard: Dashboard) -> None:
            self.dashboard = dashboard

        def get(self) -> None:
            self.set_header("Content-Type", "application/json")
            self.set_header("Cache-Control", "no-store")
            try:
                body = json.dumps(self.dashboard.data(), default=str)
            except Exception:
                logger.warning("daskjobs: the dashboard data failed", exc_info=True)
                self.set_status(500)
                body = json.dumps({"error": "daskjobs: the dashboard data failed; see the log"})
            self.write(body)

    return DataHandler


# -- the sitemap -----------------------------------------------------------------------------


def _sitemap_handler() -> type:
    from bokeh.server.tornado import BokehTornado
    from distributed.http.routing import DirectoryHandler, _descend_routes

    class SitemapHandler(DirectoryHandler):
        """distributed's ``/sitemap.json``, listing a Bokeh application by its paths.

        distributed's own handler takes an application for Bokeh's when ``"bokeh"`` is in
        its ``str()``; with Bokeh >= 3.3 the dashboard is a ``DaskBokehTornado`` (no
        lower-case "bokeh" in its name), so it crawls its routes, meets a static-file
        route without a ``path`` and answers 500. This one asks ``isinstance``.
        """

        def get(self) -> None:
            out: set[str] = set()
            routers: set[Any] = set()
            router: Any = self.application
            for app in [*router.applications, router]:
                if isinstance(app, BokehTornado) or "bokeh" in str(app):
                    out.update(app.app_paths)
                else:
                    _descend_routes(app.default_router, routers, out)
                    _descend_routes(app.wildcard_router, routers, out)
            self.write({"paths": sorted(out)})

    return SitemapHandler


def _replace_sitemap(router: Any, handler: type) -> list[tuple[Any, Any]]:
    """Point the router's ``/sitemap.json`` rules at ``handler``; the replaced
    ``(rule, target)`` pairs, to put back. Only rules one level down (where
    ``Application.add_handlers`` puts them) are looked at."""
    from distributed.http.routing import DirectoryHandler
    from tornado.routing import PathMatches

    swapped = []
    for top in (router.default_router, router.wildcard_router):
        for outer in top.rules:
            for rule in getattr(outer.target, "rules", ()):
                target = rule.target
                if (
                    isinstance(rule.matcher, PathMatches)
                    and rule.matcher.regex.pattern.rstrip("$") == "/sitemap.json"
                    and isinstance(target, type)
                    and issubclass(target, DirectoryHandler)
                ):
                    swapped.append((rule, target))
                    rule.target = handler
    return swapped


# -- install / uninstall -------------------------------------------------------------------

_DASHBOARDS: dict[int, Dashboard] = {}


def _distributed_bokeh(scheduler: Any) -> Any:
    """The dashboard's own Bokeh application on the scheduler's router, or None."""
    router = dask_internals.http_router(scheduler)
    if router is None:
        return None
    try:
        from distributed.dashboard.core import DaskBokehTornado
    except ImportError:  # a Bokeh distributed does not accept: it serves no dashboard either
        return None
    for app in getattr(router, "applications", ()):
        if isinstance(app, DaskBokehTornado) and "/status" in app.app_paths:
            return app
    return None


def install_dashboard(plugin: Any, scheduler: Scheduler) -> Dashboard | None:
    """Serve the daskjobs page and its JSON on ``scheduler``'s dashboard; idempotent.

    Installing again for the same scheduler makes the page read ``plugin`` (a
    re-registered plugin), never adds a second page. Never raises: without Bokeh or
    with the dashboard off it logs once at INFO and returns None; any other failure
    is logged at WARNING and undone.
    """
    dash = _DASHBOARDS.get(id(scheduler))
    if dash is not None and dash.scheduler is scheduler and dash.active:
        dash.plugin = plugin
        dash.clock.plugin = plugin
        plugin.transitions.add(dash.clock)
        return dash
    try:
        import bokeh  # noqa: F401
    except ImportError:
        _log_missing("Bokeh is not installed (pip install 'daskjobs[dashboard]')")
        return None
    dash = None
    try:
        main = _distributed_bokeh(scheduler)
        router = dask_internals.http_router(scheduler)
        if main is None:
            _log_missing("the scheduler serves no Bokeh dashboard (dashboard off, or no Bokeh)")
            return None
        from distributed.dashboard.core import BokehApplication
        from distributed.dashboard.scheduler import template_variables
        from tornado import web
        from tornado.ioloop import IOLoop

        clock = QueueClock(plugin)
        dash = Dashboard(plugin, scheduler, clock)
        _DASHBOARDS[id(scheduler)] = dash
        prefix = str(main.prefix or "/")
        if not prefix.endswith("/"):
            prefix += "/"
        dash.prefix = prefix
        clock.seed(dask_internals.queued_tasks(scheduler), time.time())
        plugin.transitions.add(clock)  # told of transitions by the plugin's hook
        tv = template_variables(scheduler)
        app = BokehApplication(
            {f"/{PAGE}": functools.partial(_page_doc, dash)},
            scheduler,
            prefix=prefix,
            template_variables=tv,
        )
        app.initialize(IOLoop.current())
        # a route is a regex: the dot matches itself too (as distributed's "/sitemap.json")
        json_app = web.Application([(prefix + DATA_PATH, _data_handler(), {"dashboard": dash})])
        dash.bokeh_app = app
        for a in (json_app, app):
            router.add_application(a)
            dash.apps.append(a)
        app.start()
        dash.sitemap = _replace_sitemap(router, _sitemap_handler())
        pages = tv["pages"]  # the list every page of this scheduler renders in its bar
        if PAGE not in pages:
            pages.insert(pages.index("info") if "info" in pages else len(pages), PAGE)
        dash.sample()
        dash.sampler = every(scheduler, NAME, INTERVAL_MS / 1000, dash.tick)
        logger.info("daskjobs: dashboard page at %s%s", prefix, PAGE)
        return dash
    except Exception:
        logger.warning("daskjobs: installing the dashboard page failed", exc_info=True)
        if dash is not None:
            uninstall_dashboard(scheduler)
        return None


def uninstall_dashboard(scheduler: Scheduler, plugin: Any = None) -> None:
    """Remove the daskjobs page of ``scheduler`` (no-op if not installed); never raises.

    With ``plugin``, only if the page still reads that plugin: a replaced plugin
    closing after its successor started leaves the new one's page.
    """
    dash = _DASHBOARDS.get(id(scheduler))
    if dash is None or dash.scheduler is not scheduler:
        return
    if plugin is not None and dash.plugin is not plugin:
        return
    del _DASHBOARDS[id(scheduler)]
    dash.active = False
    steps = (
        ("sampler", _stop_sampler),
        ("routes", _remove_apps),
        ("navigation", _remove_page_link),
        ("queue clock", _remove_clock),
    )
    for what, step in steps:
        try:
            step(dash)
        except Exception:
            logger.warning("daskjobs: removing the dashboard %s failed", what, exc_info=True)


def _stop_sampler(dash: Dashboard) -> None:
    pc, dash.sampler = dash.sampler, None
    if pc is not None:
        pc.stop()


def _remove_apps(dash: Dashboard) -> None:
    router = dask_internals.http_router(dash.scheduler)
    for a in dash.apps:
        if a in router.applications:
            router.applications.remove(a)
    dash.apps.clear()
    for rule, original in dash.sitemap:
        rule.target = original
    dash.sitemap = []
    if dash.bokeh_app is not None:
        dash.bokeh_app.stop()
        dash.bokeh_app = None


def _remove_page_link(dash: Dashboard) -> None:
    from distributed.dashboard.scheduler import template_variables

    pages = template_variables(dash.scheduler)["pages"]
    while PAGE in pages:
        pages.remove(PAGE)


def _remove_clock(dash: Dashboard) -> None:
    transitions = getattr(dash.plugin, "transitions", None)
    if transitions is not None:
        transitions.remove(dash.clock)


def installed(scheduler: Any) -> Dashboard | None:
    """The daskjobs page served on ``scheduler``, if any."""
    dash = _DASHBOARDS.get(id(scheduler))
    return dash if dash is not None and dash.scheduler is scheduler else None
