"""Every ``daskjobs`` subcommand's help, walked: every option described, no reStructuredText
markup in what a terminal shows, and one wording for the options several commands share
(``--json``, ``--timeout``: daskjobs/_options.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import click
from click.testing import CliRunner

from daskjobs._options import JSON_HELP
from daskjobs.cli import main

#: Markup a terminal would show as it is.
REST = re.compile(r"``[^`]*``|:(func|class|mod|meth|attr|data):`[^`]*`")


def commands(
    cmd: click.Command = main, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    yield path, cmd
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd)
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None, name
            yield from commands(sub, (*path, name))


def test_every_option_is_described_and_no_help_shows_markup() -> None:
    undescribed, markup = [], []
    for path, cmd in commands():
        texts = [cmd.help or "", cmd.short_help or ""]
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden:
                if not p.help:
                    undescribed.append(f"daskjobs {' '.join(path)} {p.opts[0]}")
                texts.append(p.help or "")
        markup += [
            f"daskjobs {' '.join(path)}: {m.group(0)}" for t in texts for m in REST.finditer(t)
        ]
    assert not undescribed, f"options without a description: {undescribed}"
    assert not markup, f"reST markup in help: {markup}"


def test_shared_options_have_one_wording() -> None:
    seen: dict[str, set[tuple[str, str]]] = {"--json": set(), "--timeout": set()}
    for _, cmd in commands():
        for p in cmd.params:
            if isinstance(p, click.Option) and p.opts[0] in seen:
                seen[p.opts[0]].add((p.help or "", p.metavar or ""))
    assert seen["--json"] == {(JSON_HELP, "")}
    assert len(seen["--timeout"]) == 1 and next(iter(seen["--timeout"]))[1] == "DURATION"


def test_every_help_page_renders() -> None:
    for path, _ in commands():
        result = CliRunner().invoke(main, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert REST.search(result.output) is None, (path, result.output)
