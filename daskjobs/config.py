"""The ``daskjobs`` section of dask's configuration.

Defaults live in ``daskjobs.yaml`` beside this module and are registered with
:func:`dask.config.update_defaults` on import, so ``dask.config.get("daskjobs.policy")``
works anywhere daskjobs is imported, and users override them the dask way (YAML under
``~/.config/dask``, ``DASK_DASKJOBS__...`` environment variables, ``dask.config.set``).

Spelling
--------
Keys are kebab-case in the YAML (``late-factor``). dask treats ``_`` and ``-`` in a key
alike, and its environment variables can only produce the snake_case spelling
(``DASK_DASKJOBS__SPECULATION__LATE_FACTOR=2`` is read as ``late_factor: 2``). dask
reads the environment and the user's YAML when it is imported, *before* daskjobs
registers its defaults, and keeps the first spelling it saw: so the section it holds
may say ``late_factor``. :func:`settings` therefore reads every key of the section in
either spelling, and keyword overrides (``JobsPlugin(default_estimate="10s")``) the
same way. Team names (the keys under ``teams.targets`` and ``teams.quotas``) are data,
not keys, and keep their spelling (dask lower-cases those that come from the
environment).

Checks
------
Every value is checked, and a bad one is a :class:`ValueError` with one line naming
the key, the value and what is expected (``daskjobs.teams.targets.a: expected a
finite number > 0, got inf``); never a ``TypeError`` from deep inside the plugin.
Booleans accept ``true/false``, ``yes/no``, ``on/off``, ``1/0`` (any case; dask's
environment parsing turns only ``true``/``false`` into booleans). Numbers may be
written as strings (``"2.5"``); durations as dask writes them (``"30s"``, ``"200ms"``,
or seconds). Periodic work has a floor: ``speculation.interval`` is at least
:data:`MIN_INTERVAL` (10 ms), since a periodic callback every microsecond keeps an
idle scheduler's event loop busy. Sizes have ceilings that keep memory bounded
(:data:`MAX_AUDIT_EVENTS`, :data:`MAX_HISTORY_SAMPLES`).
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import dask.config
from dask.utils import parse_bytes, parse_timedelta

from daskjobs import _defaults as _yaml
from daskjobs._text import shown

if TYPE_CHECKING:
    from daskjobs.policies.speculation import Speculation

__all__ = [
    "MAX_AUDIT_EVENTS",
    "MAX_HISTORY_SAMPLES",
    "MAX_HISTORY_STAGES",
    "MIN_INTERVAL",
    "AdmissionSettings",
    "ClaimSettings",
    "ClientSettings",
    "ForecastSettings",
    "JobsSettings",
    "Settings",
    "SpeculationSettings",
    "TeamSettings",
    "claim_settings",
    "client_team",
    "configure_logging",
    "jobs_settings",
    "policy_names",
    "policy_settings",
    "settings",
    "summary",
]

# The defaults, as written in daskjobs.yaml (the one place a default is written).
_defaults = _yaml.defaults()


def _not_mappings(key: str, given: Any, known: Mapping[str, Any]) -> dict[str, Any]:
    """Values given where the defaults have a mapping (``teams: 3``), by key."""
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        return {key: given}
    found: dict[str, Any] = {}
    for k, v in given.items():
        name = k.replace("_", "-") if isinstance(k, str) else k
        if isinstance(known.get(name), Mapping):
            found.update(_not_mappings(f"{key}.{name}", v, known[name]))
    return found


# dask read the operator's YAML and DASK_ variables when it was imported. update_defaults
# silently replaces a value that is not a mapping where the defaults have one (`teams: 3`,
# `targets: [1, 2]`) by the defaults: remember those values, and the mappings dask put in
# their place, so that settings() names the operator's value while dask's config still
# holds that stand-in (dask.config.set or refresh replace it, and are then checked as usual).
_given = _not_mappings("daskjobs", dask.config.config.get("daskjobs"), _defaults["daskjobs"])
dask.config.update_defaults(_defaults)
#: key -> (the operator's value, the mapping dask's config holds in its place)
_REPLACED = {key: (value, dask.config.get(key, default=None)) for key, value in _given.items()}


# -- logging, the way distributed configures its own ----------------------------------------

#: The level of the ``daskjobs`` loggers unless the operator's dask config says otherwise
#: (distributed's own loggers default to INFO the same way).
LOG_LEVEL = "info"


def configure_logging(config: dict[str, Any] | None = None) -> None:
    """Configure the ``daskjobs`` loggers from dask's logging config, as distributed
    configures its own when it is imported (``distributed.config.initialize_logging``).

    dask's config names loggers and levels under ``logging:`` (or
    ``distributed.logging:``), e.g. ``logging: {daskjobs: debug, daskjobs.jobs:
    warning}``; ``daskjobs`` defaults to :data:`LOG_LEVEL`. Like distributed, the
    ``daskjobs`` logger then gets a handler to stderr in dask's format
    (``distributed.admin.log-format``: time, logger name, level, message) and does not
    propagate, unless the application configured logging itself (the root logger has
    handlers: then daskjobs' records go there). A full configuration in
    ``logging:`` (``version: 1``, :func:`logging.config.dictConfig`) or
    ``logging-file-config`` is the operator's, and left alone. Idempotent.
    """
    import logging
    import sys

    cfg = dask.config.config if config is None else config
    dist = cfg.get("distributed") or {}
    base = dist if {"logging", "logging-file-config"} & set(dist) else cfg
    named = base.get("logging") or {}
    if "logging-file-config" in base or not isinstance(named, Mapping) or "version" in named:
        return
    levels: dict[str, Any] = {"daskjobs": LOG_LEVEL}
    levels.update({k: v for k, v in named.items() if k == "daskjobs" or k.startswith("daskjobs.")})
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level.upper() if isinstance(level, str) else level)
    top = logging.getLogger("daskjobs")
    if top.handlers or logging.getLogger().handlers:
        return  # ours, the operator's (distributed gives a named logger one), or the app's
    fmt = dask.config.get("distributed.admin.log-format", default=_LOG_FORMAT, config=cfg)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    top.addHandler(handler)
    top.propagate = False


#: distributed's ``distributed.admin.log-format``, should its config not be loaded
_LOG_FORMAT = "%(asctime)s - %(name)s - %(levelname)s - %(message)s"

configure_logging()


def summary(s: Settings, ledger: str | None = None) -> str:
    """One line of what the plugin runs with (logged at INFO when it starts):
    policy, teams, speculation, preemption, resources, recording and the ledger."""
    t = s.teams
    targets = ", ".join(f"{k}={v:g}" for k, v in sorted(t.targets.items())) or "none"
    teams = f"teams {targets}" + (" (strict)" if t.strict else "")
    sp = s.speculation
    spec = (
        f"speculation on (late-factor {sp.late_factor:g}, min-runtime "
        f"{_duration_text(sp.min_runtime)}, max-fraction {sp.max_fraction:g}"
        f"{', end game' if sp.endgame else ''})"
        if sp.enabled
        else "speculation off"
    )
    pr = s.preemption
    pre = f"preemption on ({pr.policy}, resource {pr.resource})" if pr.enabled else "preemption off"
    res = "resources on" if s.resources.enabled else "resources off"
    rec = f"recording to {s.record}" if s.record else "recording off"
    if s.record_dir:
        rec += f" (clients' traces under {s.record_dir})"
    led = f"ledger {ledger}" if ledger else "no jobs ledger"
    return (
        f"daskjobs plugin: policy {s.policy}, default estimate "
        f"{_duration_text(s.default_estimate)}; {teams}; {spec}; {pre}; {res}; {rec}; {led}"
    )


def policy_names() -> tuple[str, ...]:
    """The policies ``daskjobs.policy`` may name: every policy of the registry
    (:mod:`daskjobs.policies.registry`) the plugin can run, built-in ones first."""
    from daskjobs.policies import registry

    return registry.names(live=True)


def __getattr__(name: str) -> Any:
    # POLICIES (kept for callers: policy_names()) reads the registry when asked for, so a
    # policy registered later counts too
    if name == "POLICIES":
        return policy_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Shortest period (seconds) of the plugin's periodic work (``speculation.interval``).
MIN_INTERVAL = 0.01
#: Most policy decisions kept for ``explain`` (``audit-events``); each is a few hundred bytes.
MAX_AUDIT_EVENTS = 10_000_000
#: Most measured durations kept per stage (``history.samples``), the duration model's window.
MAX_HISTORY_SAMPLES = 100_000
#: Most stages a history may keep (``history.max-stages``).
MAX_HISTORY_STAGES = 100_000
#: Shortest period (seconds) of the scheduler's forecast (``forecast.interval``): each
#: refresh is a simulation of the unfinished work.
MIN_FORECAST_INTERVAL = 1.0
#: Most simulations a refresh of the scheduler's forecast may draw (``forecast.draws``).
MAX_FORECAST_DRAWS = 1000

#: Keys whose values are mappings keyed by team name (or, for identities, by a certificate
#: identity): their keys are data, kept as given.
_TEAM_MAPPINGS = frozenset(
    {"daskjobs.teams.targets", "daskjobs.teams.quotas", "daskjobs.teams.identities"}
)
#: What a client whose certificate maps to no team gets (``teams.unmapped``).
UNMAPPED = ("default", "refuse")
#: The policy's own settings: keys are its keyword names, and a mapping given replaces
#: the one below it (options belong to one policy: they are not merged across sources).
_OPTIONS = "daskjobs.policy-options"
_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


# Every default of the dataclasses below is read from daskjobs.yaml (``_yaml.default``,
# durations in seconds as settings() reads them): ``Settings()`` is what settings() makes
# of the YAML alone (tests/test_defaults.py checks it), never a second copy of a value.
_default = _yaml.default
_default_seconds = _yaml.seconds


@dataclass(frozen=True)
class TeamSettings:
    default: str = _default("teams.default")
    targets: Mapping[str, float] = field(default_factory=lambda: _default("teams.targets"))
    quotas: Mapping[str, int] = field(default_factory=lambda: _default("teams.quotas"))
    strict: bool = _default("teams.strict")
    half_life: float | None = _default_seconds("teams.half-life")
    within: str = _default("teams.within")
    #: certificate identity -> team (teams bound to identity when this or ``admins`` is set)
    identities: Mapping[str, str] = field(default_factory=lambda: _default("teams.identities"))
    #: identities that may act for any team
    admins: tuple[str, ...] = field(default_factory=lambda: tuple(_default("teams.admins")))
    #: what a client whose certificate maps to no team gets: "default" or "refuse"
    unmapped: str = _default("teams.unmapped")

    @property
    def bound(self) -> bool:
        """Are teams bound to certificate identities (``identities`` or ``admins`` set)?"""
        return bool(self.identities or self.admins)

    def policy_settings(self) -> dict[str, Any]:
        """The keyword settings of the ``fair-share`` policy this section describes."""
        return {
            "targets": dict(self.targets) or {self.default: 1.0},
            "within": self.within,
            "half_life": self.half_life,
            "quotas": dict(self.quotas),
            "strict": self.strict,
        }


@dataclass(frozen=True)
class SpeculationSettings:
    enabled: bool = _default("speculation.enabled")
    late_factor: float = float(_default("speculation.late-factor"))
    min_runtime: float = _default_seconds("speculation.min-runtime") or 0.0
    max_fraction: float = float(_default("speculation.max-fraction"))
    interval: float = _default_seconds("speculation.interval") or MIN_INTERVAL
    ahead: str = _default("speculation.ahead")
    endgame: bool = _default("speculation.endgame")

    def policy(self) -> Speculation:
        """The speculation policy these settings describe: the one object the plugin
        runs live and replay runs on a recorded run's settings."""
        from daskjobs.policies.speculation import Speculation

        return Speculation(
            self.late_factor,
            self.min_runtime,
            self.max_fraction,
            self.ahead,
            self.interval,
            endgame=self.endgame,
        )

    @classmethod
    def recorded(cls, given: Mapping[str, Any]) -> SpeculationSettings:
        """The settings a trace recorded (``late_factor``, ..., as the plugin writes them
        in its header), checked as the operator's config is; a setting left out (or
        null) is the default. Raises ValueError naming a bad one."""
        raw = {
            name.replace("_", "-"): given[name]
            for name in ("late_factor", "min_runtime", "max_fraction", "interval", "ahead")
            if given.get(name) not in (None, "")
        }
        # the end game as the run had it (a trace from before the setting: off)
        raw["endgame"] = given.get("endgame") is True
        return _speculation({**_defaults["daskjobs"]["speculation"], "enabled": True, **raw})


@dataclass(frozen=True)
class PreemptionSettings:
    enabled: bool = _default("preemption.enabled")
    policy: str = _default("preemption.policy")
    resource: str = _default("preemption.resource")
    min_runtime: float = _default_seconds("preemption.min-runtime") or 0.0
    max_preemptions: int = _default("preemption.max-preemptions")
    grace: float = _default_seconds("preemption.grace") or 0.0
    interval: float = _default_seconds("preemption.interval") or MIN_INTERVAL
    reservation: bool = _default("preemption.reservation")


@dataclass(frozen=True)
class ResourcesSettings:
    enabled: bool = _default("resources.enabled")
    reservation: bool = _default("resources.reservation")
    refuse_unsatisfiable: bool = _default("resources.refuse-unsatisfiable")
    interval: float = _default_seconds("resources.interval") or MIN_INTERVAL


@dataclass(frozen=True)
class ClientSettings:
    """What clients may change on an operator's scheduler (docs/how-to/load-the-plugin.md#trust)."""

    replace_plugin: bool = _default("clients.replace-plugin")
    record: bool = _default("clients.record")


@dataclass(frozen=True)
class ForecastSettings:
    """The forecast the scheduler keeps for its page and metrics (``daskjobs.forecast``):
    refreshed every ``interval`` seconds (None: never) while there is unfinished work, up
    to ``max_tasks`` unfinished tasks, over ``draws`` simulations."""

    interval: float | None = _default_seconds("forecast.interval")
    max_tasks: int = _default("forecast.max-tasks")
    draws: int = _default("forecast.draws")


@dataclass(frozen=True)
class AdmissionSettings:
    """Checked admission limits (``daskjobs.admission``; None: no limit): what one
    client may submit to a shared scheduler (bytes for every size)."""

    graph_tasks: int | None = _default("admission.graph-tasks")
    graph_bytes: int | None = _yaml.size("admission.graph-bytes")
    client_tasks: int | None = _default("admission.client-tasks")
    job_parts: int | None = _default("admission.job-parts")
    job_bytes: int | None = _yaml.size("admission.job-bytes")


@dataclass(frozen=True)
class JobsSettings:
    """Checked settings of the jobs ledger and service (seconds for every duration)."""

    ledger_url: str | None = _default("ledger.url")
    enabled: bool = _default("jobs.enabled")
    lease: float = _default_seconds("jobs.lease") or 0.0
    launch_timeout: float = _default_seconds("jobs.launch-timeout") or 0.0
    interval: float = _default_seconds("jobs.interval") or MIN_INTERVAL
    backlog: int = _default("jobs.backlog")
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)


@dataclass(frozen=True)
class ClaimSettings:
    """Checked settings of the store's claims (seconds for every duration)."""

    enabled: bool = _default("claims.enabled")
    lease: float = _default_seconds("claims.lease") or 60.0
    max_wait: float = _default_seconds("claims.max-wait") or 0.0


@dataclass(frozen=True)
class Settings:
    """Checked plugin settings (seconds for every duration)."""

    policy: str = _default("policy")
    #: keyword settings of the policy's factory (snake_case), checked against it
    policy_options: Mapping[str, Any] = field(default_factory=lambda: _default("policy-options"))
    default_estimate: float = _default_seconds("default-estimate") or 0.0
    history_path: str | None = _default("history.path")
    history_samples: int = _default("history.samples")
    #: most stages kept, in memory and in the history file (the least recently measured go)
    history_max_stages: int = _default("history.max-stages")
    #: learn a duration model per stage over the tasks' parameters, and re-rank (estimates.learn)
    learn_estimates: bool = _default("estimates.learn")
    #: read each plain task's function and literal arguments as its stage and parameters
    #: (estimates.arguments)
    estimates_from_arguments: bool = _default("estimates.arguments")
    teams: TeamSettings = field(default_factory=TeamSettings)
    audit_events: int = _default("audit-events")
    record: str | None = _default("record")
    speculation: SpeculationSettings = field(default_factory=SpeculationSettings)
    preemption: PreemptionSettings = field(default_factory=PreemptionSettings)
    resources: ResourcesSettings = field(default_factory=ResourcesSettings)
    record_dir: str | None = _default("record-dir")
    clients: ClientSettings = field(default_factory=ClientSettings)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    forecast: ForecastSettings = field(default_factory=ForecastSettings)


# -- messages ------------------------------------------------------------------------------------


def _show(value: Any) -> str:
    """``repr(value)``, shortened: junk in a config can be huge."""
    return shown(value, 80)


def _norm(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def _meant(given: Any, choices: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The choice ``given`` is a near miss of (spelling, case, ``-``/``_`` or a typo
    away), or None."""
    if not isinstance(given, str) or not given:
        return None
    choices = list(choices)
    same = [c for c in choices if _norm(c) == _norm(given)]
    if same:
        return same[0]
    by_norm = {_norm(c): c for c in choices}
    close = difflib.get_close_matches(_norm(given), list(by_norm), n=1, cutoff=cutoff)
    return by_norm[close[0]] if close else None


def _guess(given: Any, choices: Iterable[str]) -> str:
    """``"; did you mean X?"`` for a near miss, else ``""``."""
    meant = _meant(given, choices)
    return f"; did you mean {meant}?" if meant is not None else ""


def _check_sections(config: Mapping[str, Any] | None = None) -> None:
    """A top-level section of dask's config that is a near miss of ``daskjobs``
    (``daskjob:``, ``dask-jobs:``, ``DASK_DASKJOB__POLICY``) would be kept by dask and
    never read: name it. So is a key made by a single-underscore environment variable
    (``DASK_DASKJOBS_POLICY`` is the top-level key ``daskjobs_policy``)."""
    cfg = dask.config.config if config is None else config
    for name in cfg:
        if not isinstance(name, str) or name == "daskjobs":
            continue
        norm = _norm(name)
        if norm == "daskjobs" or _meant(name, ["daskjobs"], cutoff=0.8) == "daskjobs":
            raise ValueError(
                f"dask config section {name!r} is not read by daskjobs: did you mean "
                "daskjobs? (its settings are ignored until they are under daskjobs:)"
            )
        if name.lower().startswith("daskjobs") and name[8:9] in ("_", "-"):
            rest = name[9:].lstrip("_-")
            env = rest.upper().replace("-", "_")
            raise ValueError(
                f"dask config key {name!r} is not read by daskjobs: did you mean "
                f"daskjobs.{rest.replace('_', '-')}? (in the environment: "
                f"DASK_DASKJOBS__{env}, two underscores)"
            )


def _bad(key: str, expected: str, value: Any) -> ValueError:
    return ValueError(f"{key}: expected {expected}, got {_show(value)}")


# -- reading the section in either spelling ------------------------------------------------------


def _keys(key: str, given: Any, known: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` (a section) with its keys spelled as in ``known`` (kebab-case)."""
    if not isinstance(given, Mapping):
        raise _bad(key, "a mapping of settings", given)
    out: dict[str, Any] = {}
    spelled: dict[str, Any] = {}
    unknown = []
    for k, v in given.items():
        name = k.replace("_", "-") if isinstance(k, str) else k
        if name not in known:
            plain = isinstance(k, str) and k.isprintable() and k and k.strip() == k
            unknown.append(k if plain else _show(k))
            continue
        if name in out and out[name] != v:
            raise ValueError(
                f"{key}.{name}: given twice, as {spelled[name]!r} = {_show(out[name])} and "
                f"{k!r} = {_show(v)}; expected one value (dask reads '_' and '-' alike)"
            )
        out[name], spelled[name] = v, k
    if unknown:
        first = sorted(unknown)[0]
        raise ValueError(
            f"unknown key(s) in {key}: {', '.join(sorted(unknown))} "
            f"(known: {', '.join(sorted(known))}){_guess(first, known)}"
        )
    return out


def _merge(key: str, base: dict[str, Any], over: Any, known: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` applied on ``base`` (both sections described by ``known``, the defaults)."""
    out = dict(base)
    for k, v in _keys(key, over, known).items():
        sub = f"{key}.{k}"
        if sub == _OPTIONS:
            out[k] = {} if v is None else v  # checked with the policy (_policy_options)
        elif sub in _TEAM_MAPPINGS:
            if v is None:
                v = {}
            if not isinstance(v, Mapping):
                raise _bad(sub, _mapping_of(sub), v)
            out[k] = {**(out.get(k) or {}), **v}
        elif isinstance(known[k], Mapping):
            if v is not None:  # an empty section in YAML (`speculation:`) keeps the defaults
                out[k] = _merge(sub, out.get(k) or {}, v, known[k])
        else:
            out[k] = v
    return out


def _raw(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults, then dask's ``daskjobs`` section, then ``overrides``: kebab-case keys.

    Options follow their policy: overrides that name another policy than dask's config
    and no ``policy-options`` start that policy from none (the config's are another's)."""
    known = _defaults["daskjobs"]
    base = _merge("daskjobs", {}, known, known)
    section = dask.config.get("daskjobs", default=None)
    if section is not None:
        base = _merge("daskjobs", base, section, known)
    raw = _merge("daskjobs", base, overrides, known)
    given = _keys("daskjobs", overrides, known)
    if "policy" in given and "policy-options" not in given and raw["policy"] != base["policy"]:
        raw["policy-options"] = {}
    return raw


# -- values --------------------------------------------------------------------------------------


def _boolean(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    raise _bad(key, "true or false (also yes/no, on/off, 1/0)", value)


def _number(key: str, value: Any, expected: str, ok: Any) -> float:
    """A finite float for which ``ok(x)`` holds; numbers may be written as strings."""
    x: float | None = None
    if isinstance(value, str):
        try:
            x = float(value.strip())
        except ValueError:
            x = None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        try:
            x = float(value)
        except OverflowError:
            x = None
    if x is None or not math.isfinite(x) or not ok(x):
        raise _bad(key, expected, value)
    return x


def _integer(key: str, value: Any, lo: int, hi: float = math.inf) -> int:
    expected = f"an integer >= {lo}" + (f" and <= {int(hi):_}" if math.isfinite(hi) else "")
    n: int | None = None
    if isinstance(value, str):
        try:
            n = int(value.strip())
        except ValueError:  # also an integer of more digits than Python converts
            n = None
    elif isinstance(value, int) and not isinstance(value, bool):
        n = value
    if n is None or not lo <= n <= hi:
        raise _bad(key, expected, value)
    return n


def _seconds(key: str, value: Any, *, floor: float = 0.0, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if floor:
        expected = f"a duration of at least {_duration_text(floor)}"
    else:
        expected = "a duration such as '30s' or 2.5 (seconds, >= 0)"
    seconds: Any = None
    if isinstance(value, str | int | float | timedelta) and not isinstance(value, bool):
        try:
            seconds = parse_timedelta(value, default="seconds")
        except Exception:  # KeyError, ValueError, IndexError or OverflowError, by input
            seconds = None
    if (
        not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds < 0
        or seconds < floor
    ):
        raise _bad(key, expected, value)
    return float(seconds)


def duration_seconds(what: str, value: Any) -> float:
    """Seconds from a duration written as the configuration writes them: a number of
    seconds (``2.5``), a string with a unit (``"10s"``, ``"2 minutes"``, ``"150ms"``) or
    a ``timedelta``; >= 0 and finite. A :class:`ValueError` names ``what`` and the value
    otherwise. The one parser of durations: configuration, ``estimate=`` of a sweep's
    stage and the ``estimate`` annotation all read durations with it."""
    seconds = _seconds(what, value)
    assert seconds is not None
    return seconds


def _size(key: str, value: Any) -> int | None:
    """A number of bytes >= 1 (``"256MiB"``, ``"1 GB"`` or an integer), or None."""
    if value is None:
        return None
    n: Any = None
    if isinstance(value, str):
        try:
            n = parse_bytes(value.strip())
        except Exception:  # ValueError or a unit it does not know, by input
            n = None
    elif isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        n = int(value)
    if not isinstance(n, int) or n < 1:
        raise _bad(key, "a size such as '256MiB' or a number of bytes >= 1, or null", value)
    return n


def _limit(key: str, value: Any) -> int | None:
    return None if value is None else _integer(key, value, 1)


def _admission(a: Mapping[str, Any]) -> AdmissionSettings:
    key = "daskjobs.admission"
    return AdmissionSettings(
        graph_tasks=_limit(f"{key}.graph-tasks", a["graph-tasks"]),
        graph_bytes=_size(f"{key}.graph-bytes", a["graph-bytes"]),
        client_tasks=_limit(f"{key}.client-tasks", a["client-tasks"]),
        job_parts=_limit(f"{key}.job-parts", a["job-parts"]),
        job_bytes=_size(f"{key}.job-bytes", a["job-bytes"]),
    )


def _duration_text(seconds: float) -> str:
    return f"{seconds * 1000:g}ms" if seconds < 1 else f"{seconds:g}s"


def _path(key: str, value: Any, what: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value or "\x00" in value:
        raise _bad(key, f"{what} (a non-empty string) or null", value)
    return value


def _team(key: str, name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise _bad(key, "team names as non-empty strings (quote numbers in YAML)", name)
    return name


def _part(name: str) -> str:
    """A team name as part of a key in a one-line message: as written, or its repr if
    it would break the line (``daskjobs.teams.targets.'\\n': ...``)."""
    return name if name.isprintable() else repr(name)


def _mapping_of(key: str) -> str:
    if key == "daskjobs.teams.identities":
        return "a mapping of certificate identity to team"
    return "a mapping of team name to value"


def _identities(key: str, t: Mapping[str, Any]) -> tuple[dict[str, str], tuple[str, ...], str]:
    """``identities``, ``admins`` and ``unmapped`` of the teams section, checked."""
    identities: dict[str, str] = {}
    for name, team in t["identities"].items():
        if not isinstance(name, str) or not name.strip():
            raise _bad(f"{key}.identities", "identities as non-empty strings", name)
        identities[name] = _team(f"{key}.identities.{_part(name)}", team)
    admins = t["admins"]
    if admins is None:
        admins = []
    if isinstance(admins, str) or not isinstance(admins, Iterable):
        raise _bad(f"{key}.admins", "a list of certificate identities", admins)
    admins = tuple(admins)
    for name in admins:
        if not isinstance(name, str) or not name.strip():
            raise _bad(f"{key}.admins", "identities as non-empty strings", name)
    unmapped = _choice(f"{key}.unmapped", t["unmapped"], UNMAPPED)
    return identities, admins, unmapped


def _teams(t: Mapping[str, Any]) -> TeamSettings:
    key = "daskjobs.teams"
    targets: dict[str, float] = {}
    for team, share in t["targets"].items():
        _team(f"{key}.targets", team)
        targets[team] = _number(
            f"{key}.targets.{_part(team)}", share, "a finite number > 0", _positive
        )
    if not math.isfinite(sum(targets.values())):
        raise ValueError(
            f"{key}.targets: expected shares whose sum is finite, got shares summing to "
            f"{sum(targets.values())} ({_show(targets)}); use smaller weights"
        )
    quotas: dict[str, int] = {}
    for team, q in t["quotas"].items():
        _team(f"{key}.quotas", team)
        quotas[team] = _integer(f"{key}.quotas.{_part(team)}", q, 1)
    strict = _boolean(f"{key}.strict", t["strict"])
    default = _team(f"{key}.default", t["default"])
    identities, admins, unmapped = _identities(key, t)
    if strict:
        known = targets or {default: 1.0}
        named = [("quotas", team, team) for team in quotas]
        named += [("identities", name, team) for name, team in identities.items()]
        for sub, name, team in named:
            if team not in known:
                raise ValueError(
                    f"{key}.{sub}.{_part(name)}: expected a team listed in {key}.targets "
                    f"({', '.join(map(_part, known))}) since {key}.strict is true, got {team!r}"
                )
    within = t["within"]
    if within not in ("fifo", "lpt"):
        err = _bad(f"{key}.within", "'fifo' or 'lpt'", within)
        raise ValueError(f"{err}{_guess(within, ('fifo', 'lpt'))}")
    half_life = _seconds(f"{key}.half-life", t["half-life"], allow_none=True)
    return TeamSettings(
        default=default,
        targets=targets,
        quotas=quotas,
        strict=strict,
        half_life=half_life or None,  # 0 counts running slots only, as null does
        within=within,
        identities=identities,
        admins=admins,
        unmapped=unmapped,
    )


def _speculation(sp: Mapping[str, Any]) -> SpeculationSettings:
    from daskjobs.policies.speculation import AHEAD  # the policy's own list of choices

    key = "daskjobs.speculation"
    return SpeculationSettings(
        enabled=_boolean(f"{key}.enabled", sp["enabled"]),
        late_factor=_number(
            f"{key}.late-factor", sp["late-factor"], "a finite number > 1", lambda x: x > 1
        ),
        min_runtime=_seconds(f"{key}.min-runtime", sp["min-runtime"]) or 0.0,
        max_fraction=_number(
            f"{key}.max-fraction", sp["max-fraction"], "a number in (0, 1]", lambda x: 0 < x <= 1
        ),
        interval=_seconds(f"{key}.interval", sp["interval"], floor=MIN_INTERVAL) or MIN_INTERVAL,
        ahead=_choice(f"{key}.ahead", sp["ahead"], AHEAD),
        endgame=_boolean(f"{key}.endgame", sp["endgame"]),
    )


def _preemption(pr: Mapping[str, Any]) -> PreemptionSettings:
    from daskjobs.policies.preemption import PREEMPTION_POLICIES  # the policies' own list

    key = "daskjobs.preemption"
    resource = pr["resource"]
    if not isinstance(resource, str) or not resource:
        raise _bad(f"{key}.resource", "the name of a worker resource (e.g. GPU)", resource)
    return PreemptionSettings(
        enabled=_boolean(f"{key}.enabled", pr["enabled"]),
        policy=_choice(f"{key}.policy", pr["policy"], tuple(PREEMPTION_POLICIES)),
        resource=resource,
        min_runtime=_seconds(f"{key}.min-runtime", pr["min-runtime"]) or 0.0,
        max_preemptions=_integer(f"{key}.max-preemptions", pr["max-preemptions"], 0, 1_000_000),
        grace=_seconds(f"{key}.grace", pr["grace"]) or 0.0,
        interval=_seconds(f"{key}.interval", pr["interval"], floor=MIN_INTERVAL) or MIN_INTERVAL,
        reservation=_boolean(f"{key}.reservation", pr["reservation"]),
    )


def _resources(rs: Mapping[str, Any]) -> ResourcesSettings:
    key = "daskjobs.resources"
    return ResourcesSettings(
        enabled=_boolean(f"{key}.enabled", rs["enabled"]),
        reservation=_boolean(f"{key}.reservation", rs["reservation"]),
        refuse_unsatisfiable=_boolean(f"{key}.refuse-unsatisfiable", rs["refuse-unsatisfiable"]),
        interval=_seconds(f"{key}.interval", rs["interval"], floor=MIN_INTERVAL) or MIN_INTERVAL,
    )


def _forecast(fc: Mapping[str, Any]) -> ForecastSettings:
    key = "daskjobs.forecast"
    return ForecastSettings(
        interval=_seconds(
            f"{key}.interval", fc["interval"], floor=MIN_FORECAST_INTERVAL, allow_none=True
        ),
        max_tasks=_integer(f"{key}.max-tasks", fc["max-tasks"], 1),
        draws=_integer(f"{key}.draws", fc["draws"], 1, MAX_FORECAST_DRAWS),
    )


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    if isinstance(value, str) and value in choices:
        return value
    err = _bad(key, f"one of {', '.join(choices)}", value)
    raise ValueError(f"{err}{_guess(value, choices)}")


#: What people call the built-in policies, in the docs' words and others' (for "did you mean").
_POLICY_WORDS = {
    "longest-first": "lpt",
    "longest": "lpt",
    "ljf": "lpt",
    "first-in-first-out": "fifo",
    "fcfs": "fifo",
    "critical": "critical-path",
    "cp": "critical-path",
    "fair": "fair-share",
    "fairshare": "fair-share",
    "node": "node-aware",
    "speed-aware": "node-aware",
}


def _policy(policy: Any) -> str:
    from daskjobs.policies import registry

    live = registry.names(live=True)
    if isinstance(policy, str) and policy in live:
        return policy
    expected = f"expected one of {', '.join(live)}"
    if isinstance(policy, str) and policy in registry.names():
        raise ValueError(
            f"daskjobs.policy: {policy!r} runs in the simulator only, not in the plugin "
            f"(docs/how-to/write-a-policy.md); {expected}"
        )
    guess = _guess(policy, live)
    if not guess and isinstance(policy, str):
        word = next((w for k, w in _POLICY_WORDS.items() if _norm(k) == _norm(policy)), None)
        guess = f"; did you mean {word}?" if word in live else ""
    raise ValueError(f"daskjobs.policy: unknown policy {_show(policy)}; {expected}{guess}")


def _policy_options(policy: str, value: Any, teams: TeamSettings) -> dict[str, Any]:
    """``policy-options`` as the keywords of ``policy``'s factory: snake_case names it
    takes (its values are checked by the policy itself, when it is made)."""
    from daskjobs.policies import registry

    key = _OPTIONS
    if not isinstance(value, Mapping):
        raise _bad(key, "a mapping of setting names to values", value)
    options: dict[str, Any] = {}
    for k, v in value.items():
        if not (isinstance(k, str) and k.isprintable() and k.strip()):
            raise _bad(key, "setting names as strings", k)
        name = k.replace("-", "_")
        if name in options and options[name] != v:
            raise ValueError(
                f"{key}.{name}: given twice, with values {_show(options[name])} and "
                f"{_show(v)}; expected one value (dask reads '_' and '-' alike)"
            )
        options[name] = v
    try:
        spec = registry.get(policy)  # an entry point is imported here: errors name it
    except ValueError as e:
        raise ValueError(f"daskjobs.policy: {e}") from None
    from_teams = teams.policy_settings() if policy == "fair-share" else {}
    for name in options:
        if name in from_teams:
            raise ValueError(
                f"{key}.{name}: fair-share takes it from daskjobs.teams "
                f"(set daskjobs.teams.{name.replace('_', '-')}); expected other settings"
            )
    try:
        registry.check_settings(spec, {**from_teams, **options})
    except registry.PolicySettingError as e:
        raise ValueError(f"{key}.{e.setting}: {e}") from None
    return options


def policy_settings(s: Settings) -> dict[str, Any]:
    """The keywords the plugin makes ``s.policy`` with: ``policy-options``, and for
    ``fair-share`` the ``teams`` section."""
    from_teams = s.teams.policy_settings() if s.policy == "fair-share" else {}
    return {**from_teams, **s.policy_options}


def _positive(x: float) -> bool:
    return x > 0


def _check_replaced() -> None:
    for key, (value, stand_in) in _REPLACED.items():
        if stand_in is not None and dask.config.get(key, default=None) is stand_in:
            what = _mapping_of(key) if key in _TEAM_MAPPINGS else "a mapping of settings"
            raise ValueError(
                f"{_bad(key, what, value)} (dask's config replaced it by the defaults)"
            )


def settings(**overrides: Any) -> Settings:
    """The ``daskjobs`` config section with ``overrides`` applied, checked.

    Keys may be spelled kebab-case or snake_case, in dask's config and in
    ``overrides`` alike; a bad value raises :class:`ValueError` naming its key.
    """
    _check_sections()
    _check_replaced()
    raw = _raw(overrides)
    policy = _policy(raw["policy"])
    teams = _teams(raw["teams"])
    history = raw["history"]
    if raw["store"] != "":  # read by the sweep API, where "" means the default store
        _path("daskjobs.store", raw["store"], "a directory or fsspec URL")
    return Settings(
        policy=policy,
        policy_options=_policy_options(policy, raw["policy-options"], teams),
        default_estimate=_seconds("daskjobs.default-estimate", raw["default-estimate"]) or 0.0,
        history_path=_path("daskjobs.history.path", history["path"], "the path of a JSON file"),
        history_samples=_integer(
            "daskjobs.history.samples", history["samples"], 1, MAX_HISTORY_SAMPLES
        ),
        history_max_stages=_integer(
            "daskjobs.history.max-stages", history["max-stages"], 1, MAX_HISTORY_STAGES
        ),
        learn_estimates=_boolean("daskjobs.estimates.learn", raw["estimates"]["learn"]),
        estimates_from_arguments=_boolean(
            "daskjobs.estimates.arguments", raw["estimates"]["arguments"]
        ),
        teams=teams,
        audit_events=_integer("daskjobs.audit-events", raw["audit-events"], 0, MAX_AUDIT_EVENTS),
        record=_path("daskjobs.record", raw["record"], "the path of a trace file"),
        speculation=_speculation(raw["speculation"]),
        preemption=_preemption(raw["preemption"]),
        resources=_resources(raw["resources"]),
        record_dir=_path("daskjobs.record-dir", raw["record-dir"], "a directory"),
        clients=ClientSettings(
            replace_plugin=_boolean(
                "daskjobs.clients.replace-plugin", raw["clients"]["replace-plugin"]
            ),
            record=_boolean("daskjobs.clients.record", raw["clients"]["record"]),
        ),
        admission=_admission(raw["admission"]),
        forecast=_forecast(raw["forecast"]),
    )


def client_team(team: Any = None) -> str | None:
    """The team a client states: ``team`` if given, else ``daskjobs.team`` of this process's
    dask config (``DASK_DASKJOBS__TEAM``); None if neither names one. Raises
    :class:`ValueError` naming the key for a value that is not a team name."""
    if team is not None:
        return _team("team", team)
    _check_sections()
    value = _raw({})["team"]
    return None if value is None else _team("daskjobs.team", value)


def claim_settings(**overrides: Any) -> ClaimSettings:
    """The ``daskjobs.claims`` section with ``overrides`` (``claims={"lease": "10s"}``),
    checked."""
    raw = _raw(overrides)["claims"]
    return ClaimSettings(
        enabled=_boolean("daskjobs.claims.enabled", raw["enabled"]),
        lease=_seconds("daskjobs.claims.lease", raw["lease"], floor=MIN_INTERVAL) or 0.0,
        max_wait=_seconds("daskjobs.claims.max-wait", raw["max-wait"]) or 0.0,
    )


def jobs_settings(**overrides: Any) -> JobsSettings:
    """The ``daskjobs.ledger`` and ``daskjobs.jobs`` sections with ``overrides`` (as
    :func:`settings` takes them: ``jobs={"lease": "5s"}``, ``ledger={"url": ...}``),
    checked."""
    _check_sections()
    raw = _raw(overrides)
    url = raw["ledger"]["url"]
    if url is not None and (not isinstance(url, str) or not url or "\x00" in url):
        raise _bad("daskjobs.ledger.url", "an SQLAlchemy URL or null", url)
    jobs = raw["jobs"]
    return JobsSettings(
        ledger_url=url,
        enabled=_boolean("daskjobs.jobs.enabled", jobs["enabled"]),
        lease=_seconds("daskjobs.jobs.lease", jobs["lease"], floor=MIN_INTERVAL) or 0.0,
        launch_timeout=_seconds(
            "daskjobs.jobs.launch-timeout", jobs["launch-timeout"], floor=MIN_INTERVAL
        )
        or 0.0,
        interval=_seconds("daskjobs.jobs.interval", jobs["interval"], floor=MIN_INTERVAL)
        or MIN_INTERVAL,
        backlog=_integer("daskjobs.jobs.backlog", jobs["backlog"], 1, 10_000_000),
        admission=_admission(raw["admission"]),
    )
