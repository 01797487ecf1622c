"""The ledger commands on a ledger they cannot use: one line naming the URL and what is
wrong, a non-zero exit, and no ledger made by a command that only reads or changes one
(only ``migrate`` makes one). Run as the user runs them (a process: its whole output
counts, a traceback included)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from repo import ROOT

from daskjobs.jobs import Ledger

#: the commands that need an existing ledger, with their arguments
COMMANDS = [["ls"], ["show", "x"], ["cancel", "x"], ["retry", "x"]]


def daskjobs(*args: str, cwd: Path) -> tuple[int, list[str]]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "daskjobs.cli", "ledger", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, (proc.stdout + proc.stderr).splitlines()


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_missing_sqlite_ledger_is_named_and_not_made(command: list[str], tmp_path: Path) -> None:
    code, lines = daskjobs(*command, "--ledger", "sqlite:///typo.sqlite", cwd=tmp_path)
    assert code != 0
    assert lines == [
        f"Error: daskjobs ledger sqlite:///typo.sqlite: no such file ({tmp_path / 'typo.sqlite'}); "
        "`daskjobs ledger migrate --ledger URL` creates a ledger there"
    ]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_directory_that_cannot_hold_a_ledger_is_named(command: list[str], tmp_path: Path) -> None:
    """A directory no ledger can be in (/proc: nothing can be created there)."""
    url = "sqlite:////proc/daskjobs-nowhere/ledger.sqlite"
    code, lines = daskjobs(*command, "--ledger", url, cwd=tmp_path)
    assert code != 0
    assert len(lines) == 1 and lines[0].startswith(f"Error: daskjobs ledger {url}: no such file")
    assert not os.path.exists("/proc/daskjobs-nowhere")


@pytest.mark.slow
def test_migrate_where_no_ledger_can_be_made_is_one_line(tmp_path: Path) -> None:
    url = "sqlite:////proc/daskjobs-nowhere/ledger.sqlite"
    code, lines = daskjobs("migrate", "--ledger", url, cwd=tmp_path)
    assert code != 0
    assert lines == [
        f"Error: daskjobs ledger {url}: cannot make its directory: "
        "No such file or directory: /proc/daskjobs-nowhere"
    ]


@pytest.mark.slow
@pytest.mark.parametrize("command", [*COMMANDS, ["migrate"]], ids=lambda c: c[0])
def test_a_postgresql_database_that_does_not_exist_is_one_line(
    command: list[str], tmp_path: Path
) -> None:
    url = "postgresql+psycopg://root@127.0.0.1:5432/daskjobs_no_such_database"
    code, lines = daskjobs(*command, "--ledger", url, cwd=tmp_path)
    assert code != 0
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"Error: daskjobs ledger {url}: ")
    assert 'database "daskjobs_no_such_database" does not exist' in lines[0]


@pytest.mark.slow
def test_a_database_without_the_schema_is_named_and_left_alone(tmp_path: Path) -> None:
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    for command in COMMANDS:
        code, lines = daskjobs(*command, "--ledger", f"sqlite:///{empty}", cwd=tmp_path)
        assert code != 0
        assert lines == [
            f"Error: daskjobs ledger sqlite:///{empty}: not a daskjobs ledger (no schema); "
            "`daskjobs ledger migrate --ledger URL` creates one there"
        ]
    assert empty.read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.sqlite"]


@pytest.mark.slow
def test_ls_and_show_read_a_ledger_without_writing_it(tmp_path: Path) -> None:
    """A reader opens the ledger read-only: the file is the same bytes after it (SQLite
    may make the write-ahead log's side files beside it, as any reader of it does)."""
    path = tmp_path / "ledger.sqlite"
    url = f"sqlite:///{path}"
    ledger = Ledger(url)
    ledger.close()
    before = path.read_bytes()
    assert daskjobs("ls", "--ledger", url, cwd=tmp_path) == (0, ["no jobs"])
    code, lines = daskjobs("show", "nope", "--ledger", url, cwd=tmp_path)
    assert (code, lines) == (1, ["Error: no job 'nope' in the ledger"])
    assert path.read_bytes() == before
