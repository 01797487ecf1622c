"""``daskjobs ledger ls|show|cancel|retry|migrate`` (also ``dask jobs ledger ...``).

The commands read and write the ledger directly (``--ledger URL``, default
``daskjobs.ledger.url``, else the SQLite file in the store directory), so they work
while no scheduler runs: a cancelled or retried job is picked up by the jobs service
at its next tick. Every change is the ledger's conditional update, so a command racing
the service cannot corrupt a job.
"""

from __future__ import annotations

import datetime
import json
import sys
from typing import Any

import click

from daskjobs._options import json_option

__all__ = ["jobs_command"]

_LEDGER = click.option(
    "--ledger",
    "url",
    default=None,
    metavar="URL",
    help="the ledger: sqlite:///PATH or postgresql+psycopg://USER@HOST/DB "
    "[default: daskjobs.ledger.url, else ledger.sqlite in the store directory]",
)


def _open(url: str | None, *, write: bool = False, migrate: bool = False) -> Any:
    """The ledger at ``url``: an existing one only (``migrate`` makes or upgrades one),
    read-only unless ``write``. Every error is one line naming the URL."""
    from daskjobs.cache.store import ResultStore, default_store_url
    from daskjobs.config import jobs_settings
    from daskjobs.jobs.ledger import Ledger, default_url

    if url is None:
        url = jobs_settings().ledger_url
    if url is None:
        store = ResultStore(default_store_url()).url
        url = default_url(store if "://" not in store else ".daskjobs-cache")
        if not migrate and not _exists(url):
            raise click.ClickException(f"no jobs ledger at {url} (give --ledger URL)")
    click.get_current_context().meta["daskjobs.ledger"] = url
    if migrate:
        return Ledger(url, migrate=True)
    return Ledger(url, create=False, read_only=not write)


class _LedgerCommands(click.Group):
    """Commands whose ledger errors are one line naming the ledger, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        import sqlalchemy as sa

        from daskjobs.jobs.ledger import LedgerError, reason, safe_url

        try:
            return super().invoke(ctx)
        except LedgerError as e:
            raise click.ClickException(str(e)) from None
        except (sa.exc.SQLAlchemyError, OSError) as e:
            url = ctx.meta.get("daskjobs.ledger")  # (shared with the subcommand's context)
            where = f"daskjobs ledger {safe_url(url)}" if url else "daskjobs ledger"
            raise click.ClickException(f"{where}: {reason(e)}") from None


def _exists(url: str) -> bool:
    import os

    import sqlalchemy as sa

    path = sa.engine.make_url(url).database
    return bool(path) and os.path.exists(str(path))


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _find(ledger: Any, job: str) -> Any:
    from daskjobs.jobs.ledger import LedgerError

    try:
        return ledger.job(job)
    except LedgerError:
        matches = [j for j in ledger.jobs() if j.job_id.startswith(job) or j.spec.name == job]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise click.ClickException(f"no job {job!r} in the ledger") from None
        ids = ", ".join(j.job_id for j in matches[:5])
        raise click.ClickException(f"{job!r} names {len(matches)} jobs: {ids}") from None


@click.group("ledger", cls=_LedgerCommands)
def jobs_command() -> None:
    """Jobs in the ledger: list, show, cancel, retry, migrate (docs/explanation/jobs.md).

    "daskjobs ledger ls" ("dask jobs ledger ls" as part of dask); the old name
    "daskjobs jobs" still works, with a deprecation message."""


@jobs_command.command("ls")
@_LEDGER
@click.option("--team", default=None, help="only this team's jobs")
@click.option("--state", default=None, help="only jobs in this state (queued, running, ...)")
@json_option
def ls(url: str | None, team: str | None, state: str | None, as_json: bool) -> None:
    """List the ledger's jobs, oldest first."""
    from daskjobs._text import table
    from daskjobs.jobs.model import JOB_STATES

    if state is not None and state not in JOB_STATES:
        raise click.BadParameter(
            f"expected one of {', '.join(JOB_STATES)}, got {state!r}", param_hint="--state"
        )
    ledger = _open(url)
    records = ledger.jobs(team=team, state=state)
    if as_json:
        out = [
            {
                "job_id": j.job_id,
                "state": j.state,
                "team": j.spec.team,
                "kind": j.spec.kind,
                "parts": j.spec.parts,
                "submitted": j.submitted,
                "reason": j.reason,
            }
            for j in records
        ]
        click.echo(json.dumps(out, indent=2))
        return
    if not records:
        click.echo("no jobs")
        return
    rows = []
    for j in records:
        done = len(ledger.outputs(j.job_id))
        rows.append(
            [
                j.job_id,
                j.spec.kind,
                j.spec.team,
                j.state,
                f"{done}/{j.spec.parts}",
                _when(j.submitted),
            ]
        )
    click.echo(table(["job", "kind", "team", "state", "parts done", "submitted"], rows))


@jobs_command.command("show")
@_LEDGER
@click.argument("job")
@json_option
def show(url: str | None, job: str, as_json: bool) -> None:
    """A job's spec, attempts and history (JOB: its id, a prefix of it, or its name)."""
    ledger = _open(url)
    record = _find(ledger, job)
    attempts = ledger.attempts(record.job_id)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "job_id": record.job_id,
                    "state": record.state,
                    "reason": record.reason,
                    "spec": record.spec.to_json(),
                    "outputs": {str(p): loc for p, loc in ledger.outputs(record.job_id).items()},
                    "attempts": [a.__dict__ for a in attempts],
                },
                indent=2,
            )
        )
        return
    from daskjobs._text import table

    spec = record.spec
    click.echo(
        f"job {record.job_id}: {record.state}" + (f" ({record.reason})" if record.reason else "")
    )
    click.echo(
        f"  {spec.kind}, team {spec.team}, {spec.parts} part(s), priority {spec.priority}, "
        f"retries {spec.retries}, target {spec.target}"
    )
    if attempts:
        rows = [
            [str(a.part), str(a.token), a.state, a.worker or "-", _when(a.started), a.reason or ""]
            for a in attempts
        ]
        click.echo(table(["part", "token", "state", "worker", "started", "why"], rows))
    missing = ledger.missing_parts(record.job_id)
    click.echo(f"missing parts: {', '.join(map(str, missing)) if missing else 'none'}")


@jobs_command.command("cancel")
@_LEDGER
@click.argument("job")
def cancel(url: str | None, job: str) -> None:
    """Cancel a queued or running job: no part starts again; running attempts are told
    to stop at their next heartbeat and their outputs are refused."""
    ledger = _open(url, write=True)
    record = _find(ledger, job)
    if ledger.cancel(record.job_id, None, "cancelled from the command line"):
        click.echo(f"cancelled {record.job_id}")
    else:
        click.echo(f"{record.job_id} is {record.state}: nothing to cancel")
        sys.exit(1)


@jobs_command.command("retry")
@_LEDGER
@click.argument("job")
def retry(url: str | None, job: str) -> None:
    """Queue a failed or cancelled job again: its missing parts run, with fresh retries."""
    from daskjobs.jobs.model import StaleTransition

    ledger = _open(url, write=True)
    record = _find(ledger, job)
    try:
        moved = ledger.retry(record.job_id, None, "retried from the command line")
    except StaleTransition:
        raise click.ClickException(f"{record.job_id} succeeded: nothing to retry") from None
    if moved:
        click.echo(f"queued {record.job_id} again")
    else:
        click.echo(f"{record.job_id} is {record.state} already")


@jobs_command.command("migrate")
@_LEDGER
def migrate(url: str | None) -> None:
    """Create the ledger or bring its schema up to this daskjobs."""
    ledger = _open(url, migrate=True)
    click.echo(f"ledger {ledger.url}: schema version {ledger.version()}")
