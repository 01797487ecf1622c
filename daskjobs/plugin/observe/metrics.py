"""Prometheus metrics of the daskjobs plugin, on the scheduler's ``/metrics``.

dask's scheduler serves ``/metrics`` on its dashboard port by writing
``prometheus_client.generate_latest()`` of the process-wide default registry
(``distributed/http/scheduler/prometheus/core.py``). :func:`install_metrics`
adds a collector to that registry, so the daskjobs metrics appear beside
dask's own (``dask_scheduler_*``), named ``<namespace>_daskjobs_*`` with dask's
configured namespace (``distributed.dashboard.prometheus.namespace``, default
``dask``). :class:`JobsCollector` subclasses dask's ``PrometheusCollector``
for that naming.

Nothing here runs on the scheduler's hot path: every value is read from the
plugin's state (``teams()``, ``errors``, its ranking counters, ``tasks``)
and the scheduler's queue when Prometheus scrapes. A scrape costs
O(tasks the plugin tracks + queued tasks).

Metrics (with the default namespace):

* ``dask_daskjobs_team_running_slots{team}`` (worker threads the team's tasks and
  backup copies hold now: never more than the threads that exist, see
  :func:`daskjobs.plugin.observe.explain.running_slots`), ``..._team_copy_slots{team}`` (of
  which its copies'), ``..._team_assigned_tasks{team}`` (its tasks dask sent to workers,
  running or waiting there: what fair share counts as held), ``..._team_booked_core_seconds_total
  {team}`` (a task several teams' graphs want split equally among them),
  ``..._team_usage{team}`` (decayed slot-seconds, or assigned tasks without a
  half-life), ``..._team_queued_tasks{team}``, ``..._team_share{team}``,
  ``..._team_quota_slots{team}`` (teams with a quota) - fair share only;
* ``dask_daskjobs_clients{team,identity,source}`` (the clients the plugin knows, by the team
  their graphs are charged to, their certificate identity and whether the team comes from
  the certificate, a statement or the default), ``dask_daskjobs_team_refusals_total`` and
  ``dask_daskjobs_acted_for_total`` (teams from identity: docs/how-to/teams.md);
* ``dask_daskjobs_ranked_graphs_total``, ``dask_daskjobs_ranked_tasks_total`` and
  ``dask_daskjobs_estimates_total{source}`` (annotation, history, default);
* ``dask_daskjobs_tracked_tasks{source}``: tasks the plugin knows now, by the
  source of their estimate;
* ``dask_daskjobs_worker_speed{worker}``: believed slow-down of each worker,
  learned from finished attempts against their estimates;
* ``dask_daskjobs_backups_total{outcome}``, ``dask_daskjobs_backups_running``,
  ``dask_daskjobs_waste_seconds_total{team}`` (the seconds the losing side of each backup
  race ran: a losing copy, or a primary its copy beat; nothing else) and
  ``dask_daskjobs_failed_attempt_seconds_total{team}`` (attempts that failed or died with
  their worker, no copy involved) - speculation only;
* ``dask_daskjobs_forecast_remaining_seconds{team,quantile}`` (``quantile`` 0.1, 0.5,
  0.9: seconds from now until the team's last unfinished task is expected to end; 0 for a
  team with nothing unfinished), ``dask_daskjobs_forecast_overall_remaining_seconds
  {quantile}`` (all the work), ``dask_daskjobs_forecast_age_seconds``,
  ``dask_daskjobs_forecast_snapshot_seconds`` (the event loop's share of the last refresh)
  and ``dask_daskjobs_forecast_cpu_seconds`` (its simulation's, in a thread): the
  scheduler's own forecast (:mod:`daskjobs.plugin.observe.live_forecast`), refreshed every
  ``daskjobs.forecast.interval`` off the event loop, aged to the scrape; absent while
  there is none (switched off, too many tasks, not made yet);
* ``dask_daskjobs_hook_errors_total{hook}``: swallowed exceptions, labelled with the name of
  the part of the plugin that raised them (the keys of ``status()["errors"]``);
* ``dask_daskjobs_queued_tasks{team}``, ``dask_daskjobs_queue_delay_seconds{team}``
  (longest wait) and ``dask_daskjobs_queue_delay_seconds_sum{team}`` (summed
  waits) of the tasks waiting in dask's queue now, measured from the moment the
  plugin ranked them;
* the jobs ledger, when the jobs service runs on the scheduler (:data:`LEDGER_METRICS`):
  ``dask_daskjobs_jobs{team,state}``, ``dask_daskjobs_job_attempts{team,state}``,
  ``dask_daskjobs_job_retries_total{team}``, ``dask_daskjobs_job_lease_expiries_total
  {team}``, ``dask_daskjobs_job_fenced_commits_total{team}``,
  ``dask_daskjobs_job_queue_delay_seconds{team}`` (mean, submission to a part's first
  attempt) with ``..._count``, ``dask_daskjobs_ledger_metrics_age_seconds`` and
  ``dask_daskjobs_jobs_service_fenced`` (1 once a newer scheduler took the ledger). They are
  :meth:`Ledger.metrics <daskjobs.jobs.Ledger.metrics>`, aggregates over the ledger's
  tables: read in a thread of their own at most every ``LEDGER_REFRESH`` seconds, never
  on the event loop; a scrape serves the latest reading (the first waits up to a second).

Several schedulers in one process (tests, notebooks) share the registry: one
process-wide collector serves every installed scheduler, and labels each
sample with ``scheduler`` (the scheduler's address) only when more than one
is installed, so that ``/metrics`` never holds two families of one name.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from distributed.http.prometheus import PrometheusCollector

from daskjobs.plugin.surgery import _internals as dask_internals
from daskjobs.policies.durations import SOURCES

__all__ = ["JobsCollector", "install_metrics", "installed", "uninstall_metrics"]

logger = logging.getLogger("daskjobs.plugin")

_SOURCES = SOURCES
_QUANTILES = ("0.1", "0.5", "0.9")
_GONE = ("closing", "closed", "failed")


@dataclass
class _Family:
    """One metric family, before it becomes a prometheus_client family."""

    kind: str  # "gauge" | "counter"
    doc: str
    labels: tuple[str, ...] = ()
    samples: list[tuple[tuple[str, ...], float]] = field(default_factory=list)

    def add(self, values: Iterable[Any], value: float) -> None:
        self.samples.append((tuple(str(v) for v in values), float(value)))


class JobsCollector(PrometheusCollector):
    """The daskjobs metrics of one scheduler, computed when scraped."""

    def __init__(self, plugin: Any, scheduler: Any) -> None:
        super().__init__(scheduler)
        self.subsystem = "daskjobs"
        self.plugin = plugin

    def families(self) -> dict[str, _Family]:
        """Every daskjobs metric of this scheduler, by full name."""
        out: dict[str, _Family] = {}

        def fam(name: str, kind: str, doc: str, *labels: str) -> _Family:
            f = out[self.build_name(name)] = _Family(kind, doc, labels)
            return f

        self._forecast_families(fam, self._team_families(fam))
        self._identity_families(fam)
        self._ranking_families(fam)
        self._speed_and_backup_families(fam)
        self._error_and_queue_families(fam)
        self._ledger_families(fam)
        return out

    def _team_families(self, fam: Any) -> list[str]:
        """Fair share, one row per team; the teams' names."""
        plugin = self.plugin
        # fair share: one row per team
        teams = plugin.view.teams()
        running = fam(
            "team_running_slots",
            "gauge",
            "Worker threads a team's tasks and backup copies hold now (at most the threads "
            "that exist; a task several teams want is split among them)",
            "team",
        )
        copy_slots = fam(
            "team_copy_slots", "gauge", "Of a team's running slots, its backup copies'", "team"
        )
        assigned = fam(
            "team_assigned_tasks",
            "gauge",
            "A team's tasks dask sent to workers, running or waiting there (what fair share "
            "counts as held)",
            "team",
        )
        booked = fam(
            "team_booked_core_seconds",
            "counter",
            "Core-seconds booked to a team (a task several teams want split among them)",
            "team",
        )
        usage = fam(
            "team_usage",
            "gauge",
            "Fair-share usage of a team: slot-seconds decayed with the configured half-life "
            "(assigned tasks when there is no half-life)",
            "team",
        )
        queued = fam("team_queued_tasks", "gauge", "Tasks of a team held for fair share", "team")
        share = fam("team_share", "gauge", "Normalised target share of a team", "team")
        quota = fam("team_quota_slots", "gauge", "Most slots a team may hold at once", "team")
        for row in teams:
            running.add([row["team"]], row["running"])
            copy_slots.add([row["team"]], row.get("copies") or 0.0)
            assigned.add([row["team"]], row.get("assigned") or 0.0)
            booked.add([row["team"]], row.get("booked") or 0.0)
            usage.add([row["team"]], row["usage"])
            queued.add([row["team"]], row["queued"])
            if row["share"] is not None:
                share.add([row["team"]], row["share"])
            if row["quota"] is not None:
                quota.add([row["team"]], row["quota"])
        return [row["team"] for row in teams]

    def _identity_families(self, fam: Any) -> None:
        """Each client's team, refusals and acts for another team."""
        plugin = self.plugin
        # each client's team (plugin/identity.py): connected clients by team, certificate
        # identity and where the team comes from; refusals and acts for another team
        ids = plugin.identities
        clients = fam(
            "clients",
            "gauge",
            "Clients the plugin knows, by the team their graphs are charged to, their "
            "certificate identity and where the team comes from",
            "team",
            "identity",
            "source",
        )
        counted: dict[tuple[str, str, str], int] = {}
        for row in ids.rows():
            k = (str(row["team"]), str(row["identity"] or ""), str(row["source"]))
            counted[k] = counted.get(k, 0) + 1
        for k, n in sorted(counted.items()):
            clients.add(list(k), n)
        fam(
            "team_refusals",
            "counter",
            "Graphs, team statements, jobs and connections refused for their team or identity",
        ).add([], ids.refused)
        fam(
            "acted_for",
            "counter",
            "Graphs, team statements and jobs of admin identities charged to another team",
        ).add([], ids.acted_for)

    def _ranking_families(self, fam: Any) -> None:
        """The plugin's ranking totals and the estimates' sources."""
        plugin = self.plugin
        # ranking: the plugin's own running totals
        fam("ranked_graphs", "counter", "Graphs ranked by the plugin").add(
            [], plugin.view.ranked_graphs
        )
        fam("ranked_tasks", "counter", "Tasks ranked by the plugin").add(
            [], plugin.view.ranked_tasks
        )
        est = fam(
            "estimates", "counter", "Estimates of ranked tasks, by where they came from", "source"
        )
        for src, n in sorted(plugin.view.estimate_sources.items()):
            est.add([src], n)
        tracked = dict.fromkeys(_SOURCES, 0)
        plugin.ranker.settle()  # deferred re-ranks given first: the sources as they are
        for v in list(plugin.tasks.values()):
            tracked[v.source] = tracked.get(v.source, 0) + 1
        tr = fam(
            "tracked_tasks", "gauge", "Tasks the plugin tracks now, by estimate source", "source"
        )
        for src, n in sorted(tracked.items()):
            tr.add([src], n)

    def _speed_and_backup_families(self, fam: Any) -> None:
        """Measured worker speeds; backup copies and their waste."""
        plugin = self.plugin
        # worker speeds learned from finished attempts (1.0 = nominal)
        speed = fam(
            "worker_speed",
            "gauge",
            "Measured slow-down of a worker: run time / estimate of the tasks that finished "
            "there (geometric mean; the worker and the estimates together)",
            "worker",
        )
        for w in plugin.view.worker_speeds():
            if w["present"]:
                speed.add([w["worker"]], w["speed"])

        # speculation: copies by outcome, and the waste of losing copies per team
        spec = plugin.speculator.stats() if plugin.speculator is not None else None
        if spec is not None:
            copies = fam("backups", "counter", "Backup copies of late tasks, by outcome", "outcome")
            for outcome in ("launched", "won", "lost", "failed", "abandoned"):
                copies.add([outcome], spec[outcome])
            fam("backups_running", "gauge", "Backup copies running now").add([], spec["running"])
            waste = fam(
                "waste_seconds",
                "counter",
                "Seconds the losing side of backup races ran (a losing copy, or a primary its "
                "copy beat), per team",
                "team",
            )
            for team, seconds in sorted(spec["waste_seconds"].items()):
                waste.add([team], seconds)
            failed = fam(
                "failed_attempt_seconds",
                "counter",
                "Seconds run by attempts that failed or died with their worker (no copy), per team",
                "team",
            )
            for team, seconds in sorted(spec.get("failed_seconds", {}).items()):
                failed.add([team], seconds)

    def _error_and_queue_families(self, fam: Any) -> None:
        """Errors swallowed by the parts; the tasks in dask's queue and their waits."""
        plugin = self.plugin
        sched = self.server
        # safety
        said = "Exceptions swallowed, by the part that raised them"
        errs = fam("hook_errors", "counter", said, "hook")
        for hook, n in sorted(dict(plugin.errors).items()):
            errs.add([hook], n)

        # queue delay of the tasks waiting in dask's queue now
        now = time.time()
        count: dict[str, int] = {}
        oldest: dict[str, float] = {}
        total: dict[str, float] = {}
        default_team = plugin.settings.teams.default
        for ts in list(dask_internals.queued_tasks(sched)):
            v = plugin.tasks.get(ts.key)
            team = v.team if v is not None else default_team
            count[team] = count.get(team, 0) + 1
            if v is not None:
                wait = max(0.0, now - v.submit)
                oldest[team] = max(oldest.get(team, 0.0), wait)
                total[team] = total.get(team, 0.0) + wait
        qt = fam("queued_tasks", "gauge", "Tasks waiting in dask's queue for a slot", "team")
        qd = fam(
            "queue_delay_seconds",
            "gauge",
            "Longest wait so far of a task in dask's queue, since the plugin ranked it",
            "team",
        )
        qs = fam(
            "queue_delay_seconds_sum",
            "gauge",
            "Summed waits so far of the tasks in dask's queue",
            "team",
        )
        for team in sorted(count):
            qt.add([team], count[team])
            qd.add([team], oldest.get(team, 0.0))
            qs.add([team], total.get(team, 0.0))

    def _forecast_families(self, fam: Any, known: list[str]) -> None:
        """The scheduler's forecast (plugin/observe/live_forecast.py), aged to now: nothing while it
        has none (off, failed, or not made yet); zeros for the teams with nothing left."""
        reading = self.plugin.view.forecast()
        if reading is None or reading.state not in ("ok", "done"):
            return
        now = time.time()
        per_team = fam(
            "forecast_remaining_seconds",
            "gauge",
            "Seconds from now until a team's last unfinished task is expected to end, by "
            "quantile of the scheduler's forecast (0 when nothing of it is unfinished)",
            "team",
            "quantile",
        )
        overall = fam(
            "forecast_overall_remaining_seconds",
            "gauge",
            "Seconds from now until the last unfinished task is expected to end, by quantile",
            "quantile",
        )
        for team in sorted({*known, *reading.teams}):
            for quantile, x in zip(_QUANTILES, reading.remaining(now, team) or (), strict=False):
                per_team.add([team, quantile], x)
        for quantile, x in zip(_QUANTILES, reading.remaining(now) or (), strict=False):
            overall.add([quantile], x)
        if reading.forecast is None:
            return
        fam("forecast_age_seconds", "gauge", "Seconds since the forecast's snapshot").add(
            [], reading.age(now) or 0.0
        )
        fam(
            "forecast_snapshot_seconds",
            "gauge",
            "Seconds the last forecast's snapshot held the scheduler's event loop",
        ).add([], reading.snapshot_seconds)
        fam(
            "forecast_cpu_seconds",
            "gauge",
            "CPU seconds the last forecast's simulation took, in its own thread",
        ).add([], reading.cpu_seconds)

    def _ledger_families(self, fam: Any) -> None:
        """The jobs ledger's metrics, from the latest reading (module docs)."""
        service = _jobs_service(self.server)
        if service is None:
            return
        ledger = service.ledger
        fam(
            "jobs_service_fenced",
            "gauge",
            "1 once a newer scheduler took the jobs ledger and this one's service stopped",
        ).add([], 1 if getattr(service, "fenced", None) else 0)
        reading = LEDGER_METRICS.get(ledger)
        if reading is None:
            return
        taken, per_team = reading
        jobs = fam("jobs", "gauge", "Jobs in the ledger, by state", "team", "state")
        attempts = fam(
            "job_attempts", "gauge", "Job attempts in the ledger, by state", "team", "state"
        )
        retries = fam("job_retries", "counter", "Attempts beyond the first of each part", "team")
        expiries = fam(
            "job_lease_expiries",
            "counter",
            "Attempts lost because their lease ran out (no heartbeat)",
            "team",
        )
        fenced = fam(
            "job_fenced_commits",
            "counter",
            "Commits the ledger refused: a stale fencing token or an attempt no longer live",
            "team",
        )
        delay = fam(
            "job_queue_delay_seconds",
            "gauge",
            "Mean wait from a job's submission to a part's first attempt",
            "team",
        )
        delay_n = fam(
            "job_queue_delay_seconds_count",
            "gauge",
            "Parts the mean queue delay is over",
            "team",
        )
        for team, m in sorted(per_team.items()):
            for state, n in sorted(m["jobs"].items()):
                jobs.add([team, state], n)
            for state, n in sorted(m["attempts"].items()):
                attempts.add([team, state], n)
            retries.add([team], m["retries"])
            expiries.add([team], m.get("expired", 0))
            fenced.add([team], m["refused"])
            if m["queue_delay"] is not None:
                delay.add([team], m["queue_delay"])
                delay_n.add([team], m.get("queue_delay_count", 0))
        fam("ledger_metrics_age_seconds", "gauge", "Age of the ledger metrics served").add(
            [], max(0.0, time.monotonic() - taken)
        )

    def collect(self) -> Iterator[Any]:
        """prometheus_client's collector protocol (used when registered alone)."""
        return _families_to_prometheus({"": self})

    def describe(self) -> list[Any]:
        # no names up front: the registry must not call collect() at registration
        return []


#: Seconds between two readings of a ledger's metrics (aggregates over its tables).
LEDGER_REFRESH = 10.0


def _jobs_service(scheduler: Any) -> Any:
    """The jobs service running on ``scheduler``, if any (the plugin whose ``ledger`` has
    ``metrics``: a capability, not a class)."""
    for p in list(getattr(scheduler, "plugins", {}).values()):
        ledger = getattr(p, "ledger", None)
        if ledger is not None and callable(getattr(ledger, "metrics", None)):
            return p
    return None


class _LedgerReadings:
    """The latest ``Ledger.metrics()`` of each ledger, read in a thread of its own at most
    every :data:`LEDGER_REFRESH` seconds; a scrape never waits for the database beyond
    the first reading (at most a second)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.readings: dict[int, tuple[float, dict[str, dict[str, Any]]]] = {}
        self.busy: dict[int, threading.Event] = {}

    def get(self, ledger: Any) -> tuple[float, dict[str, dict[str, Any]]] | None:
        key = id(ledger)
        with self.lock:
            got = self.readings.get(key)
            done = self.busy.get(key)
            due = got is None or time.monotonic() - got[0] >= LEDGER_REFRESH
            if due and done is None:
                done = self.busy[key] = threading.Event()
                threading.Thread(
                    target=self._read,
                    args=(ledger, done),
                    name="daskjobs-ledger-metrics",
                    daemon=True,
                ).start()
        if got is None and done is not None:
            done.wait(1.0)
            with self.lock:
                got = self.readings.get(key)
        return got

    def _read(self, ledger: Any, done: threading.Event) -> None:
        key = id(ledger)
        try:
            reading = (time.monotonic(), ledger.metrics())
            with self.lock:
                self.readings[key] = reading
        except Exception:
            logger.debug("daskjobs: reading the ledger's metrics failed", exc_info=True)
        finally:
            with self.lock:
                self.busy.pop(key, None)
            done.set()


LEDGER_METRICS = _LedgerReadings()


def _families_to_prometheus(collectors: dict[str, JobsCollector]) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    label = len(collectors) > 1
    merged: dict[str, _Family] = {}
    for address, coll in collectors.items():
        for name, f in coll.families().items():
            m = merged.get(name)
            if m is None:
                labels = (("scheduler",) if label else ()) + f.labels
                m = merged[name] = _Family(f.kind, f.doc, labels)
            for values, value in f.samples:
                m.samples.append((((address,) if label else ()) + values, value))
    for name, f in merged.items():
        if f.kind == "counter":
            c = CounterMetricFamily(name, f.doc, labels=list(f.labels))
            for values, value in f.samples:
                c.add_metric(list(values), value)
            yield c
        else:
            g = GaugeMetricFamily(name, f.doc, labels=list(f.labels))
            for values, value in f.samples:
                g.add_metric(list(values), value)
            yield g


class _Registry:
    """The one collector in prometheus_client's registry: every installed scheduler."""

    def __init__(self) -> None:
        self.collectors: dict[int, JobsCollector] = {}
        self.lock = threading.Lock()

    def collect(self) -> Iterator[Any]:
        with self.lock:
            # a scheduler that closed without the plugin's close() (dask skips it when a
            # plugin is unregistered) is dropped here, not served forever
            for key, c in list(self.collectors.items()):
                if getattr(getattr(c.server, "status", None), "name", "") in _GONE:
                    del self.collectors[key]
            colls = list(self.collectors.values())
        by_address = {str(getattr(c.server, "address", id(c.server))): c for c in colls}
        return _families_to_prometheus(by_address)

    def describe(self) -> list[Any]:
        return []


_REGISTRY: _Registry | None = None
_REGISTRY_LOCK = threading.Lock()


def _registry() -> _Registry:
    global _REGISTRY
    with _REGISTRY_LOCK:
        if _REGISTRY is None:
            try:
                import prometheus_client
            except ModuleNotFoundError:
                raise ModuleNotFoundError(
                    "daskjobs metrics need prometheus_client, which dask's /metrics also "
                    "needs: pip install 'daskjobs[metrics]'"
                ) from None
            reg = _Registry()
            prometheus_client.REGISTRY.register(reg)
            _REGISTRY = reg
        return _REGISTRY


def install_metrics(plugin: Any, scheduler: Any) -> JobsCollector | None:
    """Serve ``plugin``'s metrics on ``scheduler``'s ``/metrics``; idempotent.

    Installing again for the same scheduler replaces the plugin the metrics read
    (a re-registered plugin), never adds a second collector. Never raises:
    metrics are never a reason for the plugin to fail. Without
    ``prometheus_client`` (dask's ``/metrics`` is then a stub as well) it logs at
    DEBUG and returns None; any other failure is logged at WARNING.
    """
    try:
        reg = _registry()
        with reg.lock:
            coll = reg.collectors.get(id(scheduler))
            if coll is None or coll.server is not scheduler:
                coll = reg.collectors[id(scheduler)] = JobsCollector(plugin, scheduler)
            elif coll.plugin is not plugin:
                coll.plugin = plugin  # a re-registered plugin: its counters start at 0
            return coll
    except ModuleNotFoundError as e:  # (the metrics extra, not installed: nobody asked)
        logger.debug("daskjobs: no metrics: %s", e)
    except Exception:
        logger.warning("daskjobs: installing the metrics failed", exc_info=True)
    return None


def uninstall_metrics(scheduler: Any, plugin: Any = None) -> None:
    """Stop serving the daskjobs metrics of ``scheduler`` (no-op if not installed).

    With ``plugin``, only if the installed metrics still read that plugin: a
    replaced plugin closing after its successor started leaves the new one's.
    """
    reg = _REGISTRY
    if reg is None:
        return
    with reg.lock:
        coll = reg.collectors.get(id(scheduler))
        if coll is not None and (plugin is None or coll.plugin is plugin):
            del reg.collectors[id(scheduler)]


def installed(scheduler: Any) -> bool:
    """Are daskjobs metrics served for ``scheduler``?"""
    reg = _REGISTRY
    return reg is not None and id(scheduler) in reg.collectors
