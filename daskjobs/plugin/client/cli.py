"""``daskjobs status ADDRESS``: what the plugin on a running scheduler is doing.

Connects a client to the scheduler, asks the plugin for its status (the
``daskjobs_status`` handler, as :func:`daskjobs.plugin.client.status` does) and
prints the policy, the teams table (fair share), each team's expected end (a
forecast made here from the plugin's snapshot: :func:`expected_ends`; not with
``--no-forecast``), the measured stages, the counters and the errors the plugin
swallowed. ``--json`` prints the status as one JSON object instead. Exits with
status 1 and a one-line message naming the problem when the scheduler cannot be
reached within ``--timeout`` or does not run the plugin, and with status 2 when
ADDRESS is not a scheduler address: a bare word, a path, an unknown scheme, or the
dashboard (its ``http://`` URL or its port: the message names the scheduler behind
it when the dashboard answers). A refused connection is reported at once (dask's
own connect retries it for the whole timeout), and a server that accepts but never
sends dask's handshake is not waited for beyond ``--timeout``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import click

from daskjobs._options import count_option, json_option, seed_option, timeout_option

# keys of plugin.status() printed in their own sections; any other is a counter
_SECTIONS = ("policy", "teams", "workers", "stages", "errors", "settings", "forecast")


def _num(x: Any, fmt: str = ".3g") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return format(x, fmt) if isinstance(x, float) else str(x)


# dask's default ports (``dask scheduler --port 8786 --dashboard-address :8787``)
SCHEDULER_PORT = 8786
DASHBOARD_PORT = 8787
# how long a server that accepted the connection may stay silent before we ask whether it
# speaks HTTP (a dask server writes its handshake as soon as it accepts)
_HANDSHAKE_WAIT = 1.0


class AddressError(click.ClickException):
    """ADDRESS is not a scheduler address: one line, exit status 2 (a usage error)."""

    exit_code = 2


def _seconds(timeout: str) -> float:
    from dask.utils import parse_timedelta

    try:
        seconds = parse_timedelta(timeout, default="seconds")
    except (TypeError, ValueError, KeyError):
        seconds = None
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise click.BadParameter(
            f"expected a duration such as '10s', got {timeout!r}", param_hint="--timeout"
        )
    return float(seconds)


def scheduler_address(text: str) -> tuple[str, bool]:
    """``text`` as a scheduler address dask connects to (``tcp://`` added to ``HOST:PORT``, a
    trailing ``/`` dropped), and whether it was written as a web URL (``http://``, e.g. the
    dashboard's, whose host and port are then tried: see :func:`fetch_status`); or
    :class:`AddressError` saying what is wrong with it."""
    import dask
    from distributed.comm import registry
    from distributed.comm.addressing import parse_host_port

    address = text.strip()
    example = f"tcp://10.0.0.5:{SCHEDULER_PORT}"
    if not address:
        raise AddressError(f"no address given: give the scheduler's address, e.g. {example}")
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = str(dask.config.get("distributed.comm.default-scheme")), address
    scheme = scheme.lower()
    url = scheme in ("http", "https")
    if url:
        rest = rest.split("/", 1)[0]  # the dashboard's page: /status, ...
    elif scheme not in registry.backends:
        known = ", ".join(f"{s}://" for s in registry.backends)
        raise AddressError(
            f"{text!r} is not a scheduler address: unknown scheme {scheme + '://'!r} "
            f"(dask knows {known}); e.g. {example}"
        )
    elif scheme == "inproc":
        return f"{scheme}://{rest}", False
    loc = rest.rstrip("/")
    if "/" in loc:
        raise AddressError(
            f"{text!r} is not a scheduler address: it has a path; give SCHEME://HOST:PORT, "
            f"e.g. {example}"
        )
    try:
        host, _ = parse_host_port(loc)
    except ValueError:
        if url:
            raise AddressError(_dashboard_message(text)) from None
        host = loc.rsplit(":", 1)[0] if loc.count(":") == 1 else loc
        raise AddressError(
            f"{text!r} is not a scheduler address: no port; give HOST:PORT, e.g. "
            f"{scheme}://{host or '10.0.0.5'}:{SCHEDULER_PORT} (dask's default scheduler port)"
        ) from None
    if not host:
        raise AddressError(f"{text!r} is not a scheduler address: no host; e.g. {example}")
    return f"{'tcp' if url else scheme}://{loc}", url


def _dashboard_message(text: str, scheduler: str | None = None) -> str:
    lead = f"{text!r} looks like the dashboard URL; give the scheduler's tcp:// address"
    if scheduler:
        return f"{lead}: this dashboard's scheduler is {scheduler}"
    return (
        f"{lead} (dask's defaults: the scheduler on port {SCHEDULER_PORT}, the dashboard on "
        f"{DASHBOARD_PORT}), e.g. tcp://HOST:{SCHEDULER_PORT}"
    )


def _dashboard_scheduler(host: str, port: int, seconds: float) -> str | None:
    """If ``host:port`` answers HTTP, the address of the scheduler whose dashboard it is (from
    ``/json/identity.json``; ``""`` if it does not say); else None. Only asked of a server that
    stayed silent on connecting: a dask server would read the request as a huge message."""
    import urllib.error
    import urllib.request

    where = f"[{host}]" if ":" in host else host
    try:
        with urllib.request.urlopen(
            f"http://{where}:{port}/json/identity.json", timeout=seconds
        ) as response:
            body = response.read(1 << 20)
    except urllib.error.HTTPError:
        return ""  # an HTTP server, without dask's JSON routes
    except (OSError, ValueError):
        return None
    try:
        found = json.loads(body).get("address")
    except (ValueError, AttributeError):
        return ""
    return found if isinstance(found, str) else ""


async def _handshake(address: str, seconds: float, text: str, url: bool) -> str | None:
    """Connect to ``address`` once (no retries) and complete dask's handshake: ``None`` if a
    dask server answered, else why not, in a few words; :class:`AddressError` if it is a
    dashboard (or ``text`` was a web URL and no scheduler answers there either).

    A dask server writes its handshake as soon as it accepts a connection; one that stays
    silent for :data:`_HANDSHAKE_WAIT` seconds is asked whether it speaks HTTP (the dashboard,
    on whose port dask's own ``connect`` would wait for a handshake for ever)."""
    import asyncio

    from distributed.comm import registry
    from distributed.comm.addressing import get_address_host_port, parse_address
    from distributed.security import Security

    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    scheme, loc = parse_address(address)
    try:
        connector = registry.get_backend(scheme).get_connector()
    except (ValueError, ImportError) as e:  # e.g. ucx:// without ucx installed
        return str(e)
    args = Security().get_connection_args("client")
    try:
        comm = await asyncio.wait_for(connector.connect(loc, deserialize=False, **args), seconds)
    except (TimeoutError, OSError) as e:
        if url:
            raise AddressError(_dashboard_message(text)) from None
        if isinstance(e, TimeoutError):
            return f"no answer within {seconds:g} s"
        cause = e.__cause__ or e.__context__ or e
        return f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
    try:
        read = asyncio.ensure_future(comm.read())
        done, _ = await asyncio.wait({read}, timeout=min(_HANDSHAKE_WAIT, seconds))
        if not done and scheme in ("tcp", "ws"):
            host, port = get_address_host_port(address)
            found = await loop.run_in_executor(None, _dashboard_scheduler, host, port, 1.0)
            if found is not None:
                read.cancel()
                raise AddressError(_dashboard_message(text, found))
        try:
            await asyncio.wait_for(read, max(0.0, deadline - loop.time()))
        except (TimeoutError, OSError) as e:
            if url:
                raise AddressError(_dashboard_message(text)) from None
            if isinstance(e, TimeoutError):
                return f"it accepted the connection but sent no dask handshake within {seconds:g} s"
            return f"it closed the connection without a dask handshake ({type(e).__name__})"
        await comm.write(comm.handshake_info())
        return None
    finally:
        if comm.closed():
            comm.abort()
        else:
            await comm.close()


def connect(address: str, timeout: str) -> tuple[Any, str]:
    """A client of the scheduler at ``address``, and its address; a one-line
    :class:`click.ClickException` naming the problem if the address is not one (exit status
    2) or it cannot be reached within ``timeout``."""
    import asyncio

    from distributed import Client

    seconds = _seconds(timeout)
    target, url = scheduler_address(address)
    why = asyncio.run(_handshake(target, seconds, address, url))
    if why is not None:
        raise click.ClickException(f"cannot reach a dask scheduler at {target!r}: {why}")
    try:
        return Client(target, timeout=seconds, set_as_default=False), target
    except (OSError, TimeoutError) as e:
        raise click.ClickException(
            f"cannot reach a dask scheduler at {target!r} within {timeout}: {e}"
        ) from None


def fetch_status(address: str, timeout: str, forecast: bool = False) -> dict[str, Any]:
    """The plugin's status on the scheduler at ``address``, with each team's expected end
    under ``"forecast"`` if asked (:func:`expected_ends`); a one-line
    :class:`click.ClickException` naming the problem if the address is not one (exit status
    2), it cannot be reached within ``timeout``, or its scheduler does not run the plugin."""
    from daskjobs.plugin.client import status

    client, target = connect(address, timeout)
    try:
        st = status(client)
        if forecast:
            st["forecast"] = expected_ends(client, [row["team"] for row in st.get("teams") or []])
        return st
    except RuntimeError as e:  # the plugin is not loaded
        raise click.ClickException(f"scheduler {target}: {e}") from None
    finally:
        client.close()


#: Simulations ``daskjobs status`` draws for its expected ends, and the seconds it may
#: spend on them (three draws at least): a status is asked often, a forecast is not.
STATUS_DRAWS = 10
STATUS_BUDGET = 2.0


def expected_ends(client: Any, known: Sequence[str] = ()) -> dict[str, Any]:
    """Each team's expected end and all the work's, from :func:`daskjobs.forecast`'s
    simulation here, on this machine (:data:`STATUS_DRAWS` draws, at most
    :data:`STATUS_BUDGET` seconds), of at most ``daskjobs.forecast.max-tasks`` unfinished
    tasks (as the scheduler's own forecast). Plain data: ``state`` (``ok``; ``done``:
    nothing unfinished; ``off`` or ``failed``, with ``why``), ``remaining`` and ``teams``
    (``{"p10", "p50", "p90"}`` seconds from now; zeros for a team of ``known`` with nothing
    unfinished), ``tasks``, ``running``, ``draws``, ``seconds_taken``, ``notes``."""
    import time

    from daskjobs.config import settings
    from daskjobs.forecasting import PolicyNotInstalled, forecast_snapshot
    from daskjobs.plugin.client import _call

    out: dict[str, Any] = {"state": "failed", "why": "", "remaining": None, "teams": {}}
    try:
        limit = settings().forecast.max_tasks
    except ValueError as e:  # this machine's daskjobs config
        return {**out, "why": str(e)}
    t0 = time.monotonic()
    snap = _call(client, "daskjobs_snapshot", keys=None, limit=limit)
    if "refused" in snap:
        why = (
            f"more than {limit} unfinished tasks (daskjobs.forecast.max-tasks): not forecast "
            "here; `daskjobs forecast ADDRESS` forecasts them all"
        )
        return {**out, "state": "off", "why": why}
    if "error" in snap:
        return {**out, "why": str(snap["error"])}
    try:
        f = forecast_snapshot(snap, draws=STATUS_DRAWS, budget=STATUS_BUDGET)
    except (PolicyNotInstalled, ValueError) as e:  # a policy not here; no workers
        return {**out, "why": str(e)}
    age = time.monotonic() - t0  # the answer is this much older than the snapshot

    def q(r: Any) -> dict[str, float]:
        return {p: max(0.0, getattr(r, p) - age) for p in ("p10", "p50", "p90")}

    zero = {"p10": 0.0, "p50": 0.0, "p90": 0.0}
    teams = {t: zero for t in known} | {t: q(r) for t, r in f.teams.items()}
    return {
        "state": "ok" if f.tasks else "done",
        "why": "",
        "remaining": q(f.remaining) if f.tasks else zero,
        "teams": dict(sorted(teams.items())),
        "tasks": f.tasks,
        "running": f.running,
        "draws": f.draws,
        "seconds_taken": age,
        "notes": list(f.notes),
    }


def _pairs(d: Any, prefix: str = "") -> list[str]:
    """``name value`` words of a (nested) mapping, nested names joined by dots; seconds
    and floats written short. Never JSON: status is read by people."""
    out: list[str] = []
    if not isinstance(d, dict):
        return [f"{prefix} {_num(d)}"] if prefix else [_num(d)]
    for k, v in d.items():
        name = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.extend(_pairs(v, name) if v else [f"{name} -"])
        elif isinstance(v, list | tuple):
            out.append(f"{name} {', '.join(map(_num, v)) or '-'}")
        else:
            out.append(f"{name} {_num(v)}")
    return out


def _seconds_text(x: Any) -> str:
    return "-" if x is None else f"{_num(float(x), '.6g')} s"


#: Settings shown as seconds (the others as they are), by their name in the configuration.
_SECONDS_SETTINGS = frozenset(
    {"default-estimate", "teams.half-life", "speculation.min-runtime", "speculation.interval"}
)


def _setting_rows(section: dict[str, Any], prefix: str, names: str) -> list[tuple[str, str]]:
    """``(prefix.name, value)`` of each kebab-case name of ``names`` (separated by spaces),
    the value read from ``section`` under its snake-case key."""
    rows = []
    for name in names.split():
        label = f"{prefix}.{name}" if prefix else name
        show = _seconds_text if label in _SECONDS_SETTINGS else _num
        rows.append((label, show(section.get(name.replace("-", "_")))))
    return rows


def _settings_lines(settings: dict[str, Any]) -> list[str]:
    """What the plugin runs with, in the configuration's own words (kebab-case)."""
    sp = settings.get("speculation") or {}
    rows = _setting_rows(settings, "", "default-estimate")
    rows += _setting_rows(settings.get("teams") or {}, "teams", "strict half-life default within")
    rows += _setting_rows(sp, "speculation", "enabled")
    if sp.get("enabled"):
        rows += _setting_rows(
            sp, "speculation", "late-factor min-runtime max-fraction interval ahead endgame"
        )
    fc = settings.get("forecast") or {}
    if fc:
        interval = fc.get("interval")
        rows.append(
            ("forecast.interval", "null (off)" if interval is None else _seconds_text(interval))
        )
        rows += _setting_rows(fc, "forecast", "max-tasks draws")
    rows += _setting_rows(settings, "", "record record-dir")
    rows.append(("history.path", _num(settings.get("history_path"))))
    for name in ("preemption", "resources"):
        rows += _setting_rows(settings.get(name) or {}, name, "enabled")
    return [f"  {k:<26} {v}" for k, v in rows]


def _speculation_lines(sp: dict[str, Any]) -> list[str]:
    counts = ("launched", "won", "lost", "failed", "abandoned", "running", "peak")
    lines = ["  copies          " + "  ".join(f"{k} {sp.get(k, 0)}" for k in counts)]
    waste = sp.get("waste_seconds") or {}
    failed = sp.get("failed_seconds") or {}
    lines.append(
        "  copy waste (s)  "
        + (", ".join(f"{t} {_num(float(v), '.1f')}" for t, v in sorted(waste.items())) or "0")
    )
    lines.append(
        "  failed (s)      "
        + (", ".join(f"{t} {_num(float(v), '.1f')}" for t, v in sorted(failed.items())) or "0")
    )
    lines += [
        "  copy waste: seconds the losing side of each race ran (a losing copy, or a primary",
        "  its copy beat); failed: attempts that failed or died with their worker, no copy.",
    ]
    return lines


def _forecast_lines(fc: dict[str, Any]) -> list[str]:
    """Each team's expected end (:func:`expected_ends`), as a time from now."""
    from daskjobs._text import ahead

    state = fc.get("state")
    if state not in ("ok", "done"):
        return [f"expected end: - ({fc.get('why') or state})"]
    lines = [
        "expected end, from now: median (10th to 90th percentile)",
        f"  {'all work':<20} {ahead(fc.get('remaining'))}",
    ]
    for team, q in (fc.get("teams") or {}).items():
        lines.append(f"  {'team ' + team:<20} {ahead(q)}")
    if state == "ok":
        lines.append(
            f"  ({fc['tasks']} unfinished task(s), {fc['running']} running; simulated here, "
            f"{fc['draws']} draw(s) in {fc['seconds_taken']:.2f} s)"
        )
    lines.extend(f"  note: {n}" for n in fc.get("notes") or ())
    return lines


def render(st: dict[str, Any], address: str) -> str:
    """The status as text: policy, settings, teams, workers, stages, speculation,
    recording, counters, errors. No section is printed as JSON (``--json`` is for that)."""
    lines = [f"scheduler {address}", f"policy    {st.get('policy')}"]
    overrides = st.get("overrides") or {}
    if overrides:
        lines.append("overrides " + ", ".join(_pairs(overrides)))
    settings = st.get("settings") or {}
    if settings:
        lines += ["", "settings", *_settings_lines(settings)]
    teams = st.get("teams") or []
    lines.append("")
    if teams:
        lines.append(
            f"{'team':<20} {'share':>7} {'usage':>10} {'threads':>8} {'copies':>7} "
            f"{'assigned':>9} {'booked (core-s)':>16} {'queued':>8} {'quota':>6}"
        )
        for row in teams:
            lines.append(
                f"{row['team']:<20} {_num(row.get('share'), '.2f'):>7} "
                f"{_num(row.get('usage')):>10} {_num(row.get('running')):>8} "
                f"{_num(row.get('copies')):>7} {_num(row.get('assigned')):>9} "
                f"{_num(row.get('booked'), '.1f'):>16} "
                f"{_num(row.get('queued')):>8} {_num(row.get('quota')):>6}"
            )
        lines += [
            "threads: worker threads the team's tasks and copies hold now (never more than",
            "  exist); copies: of which backup copies; assigned: its tasks dask sent to workers,",
            "  running or waiting there (what fair share counts as held); booked: core-seconds",
            "  so far. A task several teams' graphs want is split equally among them.",
        ]
    else:
        lines.append("teams: none (fair share is off; policy orders tasks by estimate)")
    fc = st.get("forecast")
    if fc is not None:
        lines += ["", *_forecast_lines(fc)]
    workers = st.get("workers") or []
    lines.append("")
    if workers:
        lines.append(f"{'worker':<40} {'slow-down':>9} {'samples':>8}")
        for w in workers:
            label = w["worker"] if w.get("present", True) else f"{w['worker']} (gone)"
            lines.append(f"{label:<40} {_num(w['speed'], '.2f'):>9} {w['samples']:>8}")
        lines += [
            "slow-down: run time / estimate of the tasks that finished there (geometric mean,",
            "  pulled to 1 until a few did): the worker and the estimates together; compare",
            "  workers with each other. A worker that left keeps what was learned of it.",
        ]
    else:
        lines.append("workers: no finished task with an estimate yet")
    stages = st.get("stages") or {}
    lines.append("")
    if stages:
        lines.append(f"{'stage':<32} {'samples':>8} {'median (s)':>11}")
        for name, row in stages.items():
            lines.append(f"{name:<32} {row['samples']:>8} {_num(row['median'], '.4g'):>11}")
    else:
        lines.append("stages: none measured yet")
    sp = st.get("speculation")
    lines.append("")
    if sp:
        lines += ["speculation", *_speculation_lines(sp)]
    else:
        lines.append("speculation: off")
    rec = st.get("recording")
    lines.append("recording: " + (", ".join(_pairs(rec)) if rec else "off"))
    for name in ("preemption", "resources"):
        section = st.get(name)
        if section:
            lines.append(f"{name}: " + ", ".join(_pairs(section)))
    counters = {
        k: v
        for k, v in st.items()
        if k not in _SECTIONS
        and k not in ("speculation", "recording", "overrides")
        and k not in ("preemption", "resources")
    }
    lines.append("")
    for k, v in sorted(counters.items()):
        shown = ", ".join(_pairs(v)) if isinstance(v, dict) else _num(v)
        lines.append(f"{k:<16} {shown}")
    errors = st.get("errors") or {}
    if errors:
        lines.append("errors (exceptions swallowed by plugin hooks; see the scheduler log):")
        for hook, n in sorted(errors.items()):
            lines.append(f"  {hook:<14} {n}")
    else:
        lines.append("errors           none")
    return "\n".join(lines)


@click.command("status", short_help="What the daskjobs plugin on a scheduler is doing.")
@click.argument("address")
@click.option(
    "--no-forecast",
    "no_forecast",
    is_flag=True,
    help="Leave out each team's expected end (a simulation of the unfinished work, here: "
    "at most 2 s).",
)
@timeout_option
@json_option
def status_command(address: str, no_forecast: bool, timeout: str, as_json: bool) -> None:
    """Policy, teams and their expected end, measured stages and counters of the daskjobs
    plugin on ADDRESS.

    ADDRESS is the scheduler's address, e.g. tcp://10.0.0.5:8786 (HOST:PORT means
    tcp://HOST:PORT); not the dashboard's http:// URL. The expected ends are a forecast
    made here (daskjobs.forecast, 10 draws) of at most daskjobs.forecast.max-tasks
    unfinished tasks; --no-forecast leaves it out.
    """
    st = fetch_status(address, timeout, forecast=not no_forecast)
    if as_json:
        click.echo(json.dumps({"address": address, **st}, sort_keys=True, default=str))
    else:
        click.echo(render(st, address))


def _key(text: str) -> Any:
    """A task key as typed: a tuple key as Python writes it (``"('x-1a2b', 0)"``), else
    the text itself."""
    import ast

    if text.startswith("(") and text.endswith(")"):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text
        if isinstance(value, tuple):
            return value
    return text


@click.command("explain", short_help="Why a task waits, or where it ran, and its estimate.")
@click.argument("address")
@click.argument("key")
@click.option(
    "--forecast",
    is_flag=True,
    help="Also the expected start of a task that waits (a simulation of the rest, here).",
)
@timeout_option
@json_option
def explain_command(address: str, key: str, forecast: bool, timeout: str, as_json: bool) -> None:
    """What the daskjobs plugin on ADDRESS knows of task KEY (daskjobs.explain): its
    state, estimate and where it came from, priority, team and place in the queue.

    ADDRESS is the scheduler's address, e.g. tcp://10.0.0.5:8786. KEY is the task's key as
    dask shows it; a tuple key as Python writes it, e.g. "('x-1a2b', 0)".
    """
    from daskjobs.plugin.client import explain

    client, target = connect(address, timeout)
    try:
        try:
            info = explain(client, _key(key), forecast=forecast)
        except RuntimeError as e:  # the plugin is not loaded
            raise click.ClickException(f"scheduler {target}: {e}") from None
    finally:
        client.close()
    if as_json:
        click.echo(json.dumps(info, sort_keys=True, default=str))
        return
    for name, value in info.items():
        click.echo(f"{name:<18} {value}")


def _span(r: Any) -> str:
    return f"{r.p50:.1f} s (p10 {r.p10:.1f} s, p90 {r.p90:.1f} s)"


@click.command("forecast", short_help="When the work on a scheduler will be done.")
@click.argument("address")
@click.option(
    "--workers",
    type=int,
    default=0,
    show_default=True,
    metavar="N",
    help="What if: N more nominal workers (negative: fewer).",
)
@click.option(
    "--policy",
    default=None,
    metavar="NAME",
    help="What if: under this registered policy (default: the one the scheduler runs).",
)
@count_option(
    "--draws",
    minimum=0,
    default=30,
    metavar=None,
    help="Simulations with durations drawn from their bands (0: one, estimates as they are).",
)
@seed_option("Seed of the draws.", metavar=None)
@click.option(
    "--band",
    type=click.Choice(["auto", "drawn", "computed"]),
    default="auto",
    show_default=True,
    help="The range from a simulation per draw (drawn), or computed from one simulation "
    "(computed); auto: computed past 100,000 task simulations (tasks x draws).",
)
@timeout_option
@json_option
def forecast_command(
    address: str,
    workers: int,
    policy: str | None,
    draws: int,
    seed: int,
    band: str,
    timeout: str,
    as_json: bool,
) -> None:
    """When will the work on the scheduler at ADDRESS be done (daskjobs.forecast)? The
    plugin hands over what is not finished, and this machine simulates the rest under the
    policy in force: the remaining time as a median and a 10-90% band, overall and per team.

    ADDRESS is the scheduler's address, e.g. tcp://10.0.0.5:8786.
    """
    from daskjobs.forecasting import PolicyNotInstalled, forecast

    client, target = connect(address, timeout)
    try:
        try:
            f = forecast(client, workers=workers, policy=policy, draws=draws, seed=seed, band=band)
        except PolicyNotInstalled as e:
            raise click.ClickException(str(e)) from None
        except RuntimeError as e:  # the plugin is not loaded, or the snapshot was refused
            raise click.ClickException(f"scheduler {target}: {e}") from None
    finally:
        client.close()
    if as_json:
        click.echo(json.dumps(f.as_dict(), sort_keys=True, default=str))
        return
    what_if = []
    if workers:
        what_if.append(f"{workers:+d} workers")
    if policy:
        what_if.append(f"policy {policy}")
    head = f"forecast of {target}: {f.tasks} unfinished task(s), {f.running} running, "
    head += f"{f.workers} worker(s), policy {f.policy}"
    lines = [head + (f" (what if: {', '.join(what_if)})" if what_if else "")]
    lines.append(f"{'remaining':<12} {_span(f.remaining)}")
    for team, r in sorted(f.teams.items()):
        lines.append(f"{'team ' + team:<12} {_span(r)}")
    for sweep, r in sorted(f.sweeps.items()):
        lines.append(f"{'sweep ' + sweep:<12} {_span(r)}")
    lines.extend(f"note: {n}" for n in f.notes)
    how = "" if f.band != "computed" else ", the range computed from it"
    lines.append(f"({f.draws} draw(s){how}, {f.seconds_taken:.2f} s on this machine)")
    click.echo("\n".join(lines))


@click.command("start-rate", short_help="How many tasks a second a scheduler starts.")
@click.argument("address")
@count_option("--tasks", minimum=2, default=2000, metavar=None, help="Tasks to time.")
@click.option(
    "--seconds",
    default=0.02,
    show_default=True,
    type=click.FloatRange(min=0),
    help="How long each task sleeps.",
)
@timeout_option
def start_rate_command(address: str, tasks: int, seconds: float, timeout: str) -> None:
    """Time TASKS tasks of SECONDS each on the cluster at ADDRESS: the tasks its scheduler
    starts a second when every thread wants one (daskjobs.start_rate), and the node-aware
    dispatch-rate setting to go with it (a little less).

    ADDRESS is the scheduler's address, e.g. tcp://10.0.0.5:8786. The tasks run on the
    cluster's workers like any others: time it when the cluster is otherwise idle.
    """
    from daskjobs.plugin.client import start_rate

    if not math.isfinite(seconds):
        raise click.BadParameter(f"{seconds!r} is not a finite number", param_hint="'--seconds'")
    client, target = connect(address, timeout)
    try:
        threads = sum(client.nthreads().values())
        if not threads:
            raise click.ClickException(f"scheduler {target} has no workers to run the tasks on")
        rate = start_rate(client, tasks=tasks, seconds=seconds)
    finally:
        client.close()
    shown = round(rate)  # the setting is 0.8 of the rate as printed, rounded down
    click.echo(
        f"{shown:,} tasks started a second on {threads} threads "
        f"({tasks} tasks of {seconds:g} s, scheduler {target})"
    )
    click.echo(f"node-aware: policy-options: {{dispatch-rate: {math.floor(0.8 * shown)}}}")
