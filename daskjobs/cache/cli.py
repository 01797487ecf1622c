"""``daskjobs cache``: look into a result store and keep it tidy.

``ls`` lists entries with their parameters, filtered by stage and parameter values (and the
claims of keys a cluster computes now, with owner and expiry: docs/explanation/cache.md), ``info
KEY`` prints one manifest, ``gc`` removes expired entries, entries by age and by total size (and
abandoned uncommitted payloads), ``verify`` re-reads every payload and checks
its checksum, removing the corrupt ones. Every subcommand takes ``--store URL`` (default:
``$DASKJOBS_STORE``, the dask config key ``daskjobs.store``, then ``./.daskjobs-cache``) and
``--json`` for one JSON object on stdout.

``gc`` and ``verify`` print counts, not one line per entry, unless ``--verbose``: ``gc`` the
entries removed counted by reason and the bytes freed, ``verify`` the corrupt entries and the
count of the sound ones (``verify --json`` too: ``"ok"`` is a count, ``"ok_keys"`` with
``--verbose``).

``ls``, ``info``, ``gc --dry-run`` and ``verify --keep`` only look: they never change the store,
whatever they find. A store path that is a file or does not exist, and a store that cannot be
written, are one-line errors (exit status 1), never tracebacks.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import click

from daskjobs._options import json_option
from daskjobs._text import table


def _store(url: str | None) -> Any:
    """The store at ``url``, checked: a path that is a file or missing is a usage error."""
    from daskjobs.cache.store import ResultStore

    store = ResultStore(url)
    with _errors():
        store.check_location()
    return store


@contextmanager
def _errors() -> Iterator[None]:
    """Filesystem errors (a read-only store, a path that is a file) as one-line messages."""
    from daskjobs.cache.store import StoreAccessError

    try:
        yield
    except StoreAccessError as err:
        raise click.ClickException(str(err)) from None
    except OSError as err:
        raise click.ClickException(f"{type(err).__name__}: {err}") from None


store_option = click.option(
    "--store",
    "url",
    metavar="URL",
    default=None,
    help="Store directory or fsspec URL [default: $DASKJOBS_STORE or ./.daskjobs-cache].",
)


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def _age(seconds: float) -> str:
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds / span:.1f}{unit}"
    return f"{seconds:.0f}s"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cache() -> None:
    """Inspect and tidy the result store (content-keyed stage results)."""


#: Longest text of one value, and of all parameters, in the params column of ``cache ls``.
_VALUE_TEXT = 24
_PARAMS_TEXT = 60


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _params_text(params: Mapping[str, Any]) -> str:
    """An entry's parameters in one compact cell: ``slice=0 fast=5 name=ma``."""
    cells = []
    for name, value in params.items():
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        if isinstance(value, bool) or value is None:
            text = repr(value)
        elif isinstance(value, list):
            text = ", ".join(json.dumps(v, default=str) for v in value).join("[]")
        cells.append(f"{name}={_short(text, _VALUE_TEXT)}")
    return _short(" ".join(cells), _PARAMS_TEXT) or "-"


def _param_filter(
    ctx: click.Context, param: click.Parameter, given: tuple[str, ...]
) -> list[tuple[str, Any]]:
    """``--param NAME=VALUE``: the value as JSON where it reads as JSON (``5``, ``1.5``,
    ``[5, 10]``, ``true``), True/False/None as Python writes them, else the text."""
    out = []
    for item in given:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise click.BadParameter(f"{item!r} is not NAME=VALUE (e.g. slice=0)", ctx, param)
        value: Any
        if text in ("True", "False", "None"):
            value = {"True": True, "False": False, "None": None}[text]
        else:
            try:
                value = json.loads(text)
            except ValueError:
                value = text
        out.append((name.strip(), value))
    return out


def _matches(params: Mapping[str, Any], wanted: list[tuple[str, Any]]) -> bool:
    """Whether an entry's recorded parameters have every wanted value (a text value also
    matches a recorded one that reads the same: an object recorded as its repr)."""
    for name, value in wanted:
        if name not in params:
            return False
        have = params[name]
        same = have == value and isinstance(have, bool) == isinstance(value, bool)
        if not same and not (isinstance(value, str) and str(have) == value):
            return False
    return True


@cache.command("ls")
@store_option
@click.option("--stage", default=None, metavar="NAME", help="Only entries of this stage.")
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="NAME=VALUE",
    callback=_param_filter,
    help="Only entries computed with this parameter value (e.g. slice=0); repeat for several.",
)
@json_option
def ls_command(
    url: str | None, stage: str | None, params: list[tuple[str, Any]], as_json: bool
) -> None:
    """List the entries of a store, oldest first, with their parameters (changes nothing,
    even if some are corrupt)."""
    store = _store(url)
    with _errors():
        found, corrupt = store.scan()
    entries = [
        e
        for e in found
        if (stage is None or e.stage == stage) and (not params or _matches(e.params, params))
    ]
    total = sum(e.nbytes for e in entries)
    now = time.time()
    claims = _claims(store, now)
    if as_json:
        out = {
            "store": store.url,
            "entries": [asdict(e) for e in entries],
            "bytes": total,
            "corrupt": corrupt,
            "claims": claims,
        }
        click.echo(json.dumps(out, default=str))
        return
    rows = [
        [
            e.key,
            e.stage,
            _size(e.nbytes),
            _age(now - e.created),
            f"{e.compute_seconds:.2f}s",
            _params_text(e.params),
            str(e.writer),
        ]
        for e in entries
    ]
    # columns as wide as their widest cell: a long key or stage never shifts the others
    header = ["key", "stage", "size", "age", "compute", "params", "writer"]
    click.echo(table(header, rows, "llrrrll"))
    click.echo(f"{_entries(len(entries))}, {_size(total)} in {store.url}")
    if claims:
        live = sum(1 for c in claims if c["state"] == "live")
        click.echo(f"claims ({live} live: a cluster computes that key now; others wait for it):")
        crows = [
            [
                c["key"],
                str(c["token"]),
                c["state"],
                c["owner"],
                (f"in {_age(c['expires'] - now)}" if c["expires"] >= now else "")
                or f"{_age(now - c['expires'])} ago",
                c["cluster"] or "-",
            ]
            for c in claims
        ]
        click.echo(table(["key", "token", "state", "owner", "expires", "cluster"], crows, "lrllrl"))
    if corrupt:
        n = len(corrupt)
        click.echo(
            f"{n} {'entry looks' if n == 1 else 'entries look'} corrupt (an unreadable manifest, "
            f"or a payload missing or not of the size recorded), not listed: {', '.join(corrupt)}"
            " (`daskjobs cache verify` checks and removes them)"
        )


def _claims(store: Any, now: float) -> list[dict[str, Any]]:
    """The latest claim of every key that has one, with its state: ``live`` (its owner
    computes the key now), ``expired`` (its owner died or stopped renewing: the next task
    takes over) or ``released`` (its owner gave it up without an entry). Read only."""
    from daskjobs.cache.claims import Claims

    with _errors():
        found = Claims(store).ls()
    out = []
    for c in found:
        state = "released" if c.released else ("live" if c.live(now) else "expired")
        out.append({**c.to_json(), "state": state})
    return out


@cache.command("info")
@click.argument("key")
@store_option
def info_command(key: str, url: str | None) -> None:
    """Print the manifest (metadata) of the entry stored under KEY, as JSON."""
    from daskjobs.cache.store import CorruptEntryError

    store = _store(url)
    try:
        with _errors():
            info = store.info(key)
    except CorruptEntryError as err:
        raise click.ClickException(
            f"entry {key!r} in store {store.url} is corrupt: {err.reason}"
        ) from None
    except (KeyError, ValueError):
        raise click.ClickException(f"no entry {key!r} in store {store.url}") from None
    click.echo(json.dumps(info.to_json(), indent=2, sort_keys=True, default=str))


def _entries(n: int) -> str:
    return f"{n} {'entry' if n == 1 else 'entries'}"


verbose_option = click.option(
    "-v", "--verbose", is_flag=True, help="List every entry concerned, not only the counts."
)


@cache.command("gc")
@store_option
@click.option(
    "--older-than",
    metavar="DURATION",
    default=None,
    help='Remove entries created longer ago than this ("12h", "30d", seconds if bare).',
)
@click.option(
    "--max-size",
    metavar="BYTES",
    default=None,
    help='Then remove the oldest entries until the store holds at most this ("10GB").',
)
@click.option("--dry-run", is_flag=True, help="Report what would be removed; remove nothing.")
@verbose_option
@json_option
def gc_command(
    url: str | None,
    older_than: str | None,
    max_size: str | None,
    dry_run: bool,
    verbose: bool,
    as_json: bool,
) -> None:
    """Remove expired entries (older than the max_age their stage gave them), old entries,
    then the oldest ones above a total size, and abandoned writes.

    Prints what was (or, with --dry-run, would be) removed: counts by reason, bytes freed;
    --verbose lists each entry, --json gives every removed key.
    """
    from dask.utils import parse_bytes, parse_timedelta

    try:
        age = None if older_than is None else parse_timedelta(older_than, default="seconds")
    except (ValueError, KeyError, TypeError):
        raise click.BadParameter(
            f"{older_than!r} is not a duration (e.g. 30d, 12h, 3600)", param_hint="--older-than"
        ) from None
    try:
        size = None if max_size is None else parse_bytes(max_size)
    except (ValueError, KeyError, TypeError):
        raise click.BadParameter(
            f"{max_size!r} is not a size (e.g. 10GB, 500MB)", param_hint="--max-size"
        ) from None
    store = _store(url)
    with _errors():
        report = store.gc(older_than=age, max_bytes=size, dry_run=dry_run)
    if as_json:
        click.echo(json.dumps({"store": store.url, **asdict(report)}))
        return

    def why(reason: str) -> str:  # the store's reason, in the words of the options given
        if reason.startswith("older than") and older_than is not None:
            return f"older than {older_than}"
        if reason.startswith("store above") and max_size is not None:
            return f"oldest, to bring the store under {max_size}"
        return reason

    verb = "would remove" if dry_run else "removed"
    if verbose:
        for key in report.removed:
            click.echo(f"{verb} {key}: {why(report.reasons[key])}")
    click.echo(
        f"{verb} {_entries(len(report.removed))} ({_size(report.freed_bytes)}) and "
        f"{report.orphans} abandoned files; kept {_entries(report.kept)} "
        f"({_size(report.kept_bytes)}) in {store.url}"
    )
    by_reason = Counter(why(report.reasons[key]) for key in report.removed)
    for reason, n in by_reason.most_common():
        click.echo(f"  {n:>{len(str(len(report.removed)))}} {reason}")
    if report.removed and not verbose:
        click.echo("  (--verbose lists each entry)")


@cache.command("verify")
@store_option
@click.option("--keep", is_flag=True, help="Report corrupt entries without removing them.")
@verbose_option
@json_option
def verify_command(url: str | None, keep: bool, verbose: bool, as_json: bool) -> None:
    """Recompute every entry's checksum; remove (or with --keep, list) the corrupt ones.

    Lists the corrupt entries and counts the sound ones (--verbose lists those too; in --json,
    "ok" is their count and "ok_keys" their keys). Exits with status 1 if any entry was
    corrupt.
    """
    store = _store(url)
    with _errors():
        report = store.verify(remove=not keep)
    if as_json:
        out: dict[str, Any] = {
            "store": store.url,
            "checked": len(report.ok) + len(report.corrupt),
            "ok": len(report.ok),
            "corrupt": list(report.corrupt),
            "removed": report.removed,
            "not_removed": dict(report.not_removed),
        }
        if verbose:
            out["ok_keys"] = list(report.ok)
        click.echo(json.dumps(out))
    else:
        if verbose:
            for key in report.ok:
                click.echo(f"ok: {key}")
        action = "kept" if keep else "removed"
        for key in report.corrupt:
            failure = report.not_removed.get(key)
            done = action if failure is None else f"could not remove: {failure}"
            click.echo(f"corrupt: {key} ({done})")
        click.echo(f"{_entries(len(report.ok))} ok, {len(report.corrupt)} corrupt in {store.url}")
    if report.corrupt:
        raise SystemExit(1)
