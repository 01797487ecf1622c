"""The ``daskjobs`` section of dask's configuration.

Defaults live in ``daskjobs.yaml`` beside this module and are registered with
:func:`dask.config.update_defaults` on import, so ``dask.config.get("daskjobs.policy")``
works anywhere daskjobs is imported, and users override them the dask way (YAML under
``~/.config/dask``, ``DASK_DASKJOBS__...`` environment variables, ``dask.config.set``).
Keys are kebab-case. :func:`settings` reads the section, applies keyword overrides
(snake_case or kebab-case) and checks every value, naming the key of any bad one.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import dask.config
import yaml
from dask.utils import parse_timedelta

__all__ = ["POLICIES", "Settings", "SpeculationSettings", "TeamSettings", "settings"]

_fn = os.path.join(os.path.dirname(__file__), "daskjobs.yaml")
with open(_fn) as _f:
    _defaults = yaml.safe_load(_f)
dask.config.update_defaults(_defaults)

POLICIES = ("fifo", "lpt", "critical-path", "fair-share", "node-aware")


@dataclass(frozen=True)
class TeamSettings:
    default: str = "default"
    targets: Mapping[str, float] = field(default_factory=dict)
    quotas: Mapping[str, int] = field(default_factory=dict)
    strict: bool = False
    half_life: float | None = 3600.0
    within: str = "fifo"


@dataclass(frozen=True)
class SpeculationSettings:
    enabled: bool = False
    late_factor: float = 2.5
    min_runtime: float = 1.0
    max_fraction: float = 0.1
    interval: float = 0.2


@dataclass(frozen=True)
class Settings:
    """Checked plugin settings (seconds for every duration)."""

    policy: str = "critical-path"
    default_estimate: float = 1.0
    history_path: str | None = None
    history_samples: int = 64
    teams: TeamSettings = field(default_factory=TeamSettings)
    audit_events: int = 10_000
    record: str | None = None
    speculation: SpeculationSettings = field(default_factory=lambda: SpeculationSettings())


def _seconds(key: str, value: Any, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    try:
        seconds = parse_timedelta(value, default="seconds")
    except (TypeError, ValueError, KeyError):
        raise ValueError(
            f"daskjobs.{key}: expected a duration such as '30s' or 2.5, got {value!r}"
        ) from None
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"daskjobs.{key}: expected a non-negative duration, got {value!r}")
    return float(seconds)


def _kebab(mapping: Mapping[str, Any]) -> dict[str, Any]:
    return {k.replace("_", "-"): v for k, v in mapping.items()}


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in _kebab(over).items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


def _check_keys(section: str, given: Mapping[str, Any], known: Mapping[str, Any]) -> None:
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(
            f"unknown key(s) in {section}: {', '.join(unknown)} (known: {', '.join(sorted(known))})"
        )


def settings(**overrides: Any) -> Settings:
    """The ``daskjobs`` config section with ``overrides`` applied, checked."""
    raw = _merge(dask.config.get("daskjobs", default={}) or {}, overrides)
    _check_keys("daskjobs", raw, _defaults["daskjobs"])
    policy = raw.get("policy")
    if policy not in POLICIES:
        raise ValueError(f"daskjobs.policy: unknown policy {policy!r}; choose one of {POLICIES}")
    history = raw.get("history") or {}
    _check_keys("daskjobs.history", history, _defaults["daskjobs"]["history"])
    samples = history.get("samples", 64)
    if not (isinstance(samples, int) and not isinstance(samples, bool) and samples >= 1):
        raise ValueError(f"daskjobs.history.samples: expected an integer >= 1, got {samples!r}")
    teams = raw.get("teams") or {}
    _check_keys("daskjobs.teams", teams, _defaults["daskjobs"]["teams"])
    targets = dict(teams.get("targets") or {})
    for team, share in targets.items():
        if not (isinstance(share, int | float) and not isinstance(share, bool) and share > 0):
            raise ValueError(f"daskjobs.teams.targets.{team}: expected a share > 0, got {share!r}")
    quotas = dict(teams.get("quotas") or {})
    for team, q in quotas.items():
        if not (isinstance(q, int) and not isinstance(q, bool) and q >= 1):
            raise ValueError(f"daskjobs.teams.quotas.{team}: expected an integer >= 1, got {q!r}")
    within = teams.get("within", "fifo")
    if within not in ("fifo", "lpt"):
        raise ValueError(f"daskjobs.teams.within: expected 'fifo' or 'lpt', got {within!r}")
    half_life = _seconds("teams.half-life", teams.get("half-life"), allow_none=True)
    if half_life == 0:
        half_life = None
    audit = raw.get("audit-events", 10_000)
    if not (isinstance(audit, int) and not isinstance(audit, bool) and audit >= 0):
        raise ValueError(f"daskjobs.audit-events: expected an integer >= 0, got {audit!r}")
    default_estimate = _seconds("default-estimate", raw.get("default-estimate"))
    assert default_estimate is not None
    path = history.get("path")
    spec = raw.get("speculation") or {}
    _check_keys("daskjobs.speculation", spec, _defaults["daskjobs"]["speculation"])
    late = spec.get("late-factor", 2.5)
    if isinstance(late, bool) or not isinstance(late, int | float) or not late > 1:
        raise ValueError(f"daskjobs.speculation.late-factor: expected a number > 1, got {late!r}")
    fraction = spec.get("max-fraction", 0.1)
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
        raise ValueError(
            f"daskjobs.speculation.max-fraction: expected a number in (0, 1], got {fraction!r}"
        )
    min_runtime = _seconds("speculation.min-runtime", spec.get("min-runtime", "1s"))
    interval = _seconds("speculation.interval", spec.get("interval", "200ms"))
    if not interval:
        raise ValueError("daskjobs.speculation.interval: expected a positive duration")
    speculation = SpeculationSettings(
        enabled=bool(spec.get("enabled", False)),
        late_factor=float(late),
        min_runtime=float(min_runtime or 0.0),
        max_fraction=float(fraction),
        interval=float(interval),
    )
    record = raw.get("record")
    if record is not None and not (isinstance(record, str | os.PathLike) and os.fspath(record)):
        raise ValueError(
            f"daskjobs.record: expected the path of a trace file (a string) or null, got {record!r}"
        )
    return Settings(
        policy=policy,
        default_estimate=default_estimate,
        history_path=os.fspath(path) if path else None,
        history_samples=samples,
        teams=TeamSettings(
            default=str(teams.get("default", "default")),
            targets=targets,
            quotas=quotas,
            strict=bool(teams.get("strict", False)),
            half_life=half_life,
            within=within,
        ),
        audit_events=audit,
        record=os.fspath(record) if record is not None else None,
        speculation=speculation,
    )
