"""``dask jobs ...``: the ``daskjobs`` command as part of dask's own CLI.

dask adds every click command of the ``dask_cli`` entry point group to ``dask``
(``dask.cli.run_cli``); daskjobs declares ``jobs = daskjobs.cli:jobs``. The commands
under ``dask jobs`` are the very objects under ``daskjobs``. Because ``dask`` loads
the entry point each time it runs (``dask scheduler`` too), importing
``daskjobs.cli`` must not import the subcommands' modules.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

import daskjobs
from daskjobs.cli import COMMANDS, jobs, main

BIN = Path(sys.executable).parent
SUBCOMMANDS = [
    "cache",
    "estimates",
    "explain",
    "forecast",
    "ledger",
    "replay",
    "simulate",
    "start-rate",
    "status",
]


def dask(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "dask"), *args], capture_output=True, text=True, timeout=timeout
    )


def test_the_entry_point_is_declared_and_loads_the_jobs_group() -> None:
    (ep,) = [ep for ep in entry_points(group="dask_cli") if ep.name == "jobs"]
    assert ep.value == "daskjobs.cli:jobs"
    group = ep.load()
    assert group is jobs and isinstance(group, click.Group) and group.name == "jobs"


@pytest.mark.slow
def test_dask_jobs_help_lists_the_subcommands() -> None:
    top = dask("--help")
    assert top.returncode == 0, top.stderr
    assert "jobs " in top.stdout and "Warning" not in top.stderr, top.stderr
    run = dask("jobs", "--help")
    assert run.returncode == 0, run.stderr
    listed = run.stdout.split("Commands:", 1)[1].split()
    for name in SUBCOMMANDS:
        assert name in listed, run.stdout
    assert "Usage: dask jobs" in run.stdout


@pytest.mark.slow
def test_dask_jobs_version_is_daskjobs_version() -> None:
    run = dask("jobs", "--version")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"daskjobs, version {daskjobs.__version__}"


def test_both_groups_hold_the_same_command_objects() -> None:
    ctx = click.Context(main)
    assert main.list_commands(ctx) == jobs.list_commands(ctx) == SUBCOMMANDS == sorted(COMMANDS)
    for name in SUBCOMMANDS:
        command = main.get_command(ctx, name)
        assert isinstance(command, click.Command) and command.name == name
        assert jobs.get_command(ctx, name) is command


def test_a_subcommand_runs_the_same_under_both_names(tmp_path: Path) -> None:
    trace = tmp_path / "missing.jsonl"
    outs = [
        CliRunner().invoke(group, ["replay", str(trace)], prog_name=prog)
        for group, prog in ((main, "daskjobs"), (jobs, "dask jobs"))
    ]
    assert [o.exit_code for o in outs] == [2, 2]
    assert outs[0].output.replace("daskjobs", "X") == outs[1].output.replace("dask jobs", "X")


IMPORT_CHECK = """
import sys
import daskjobs.cli
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("distributed", "numpy", "yaml")
               or m == "importlib.metadata"
               or m.startswith(("daskjobs.sim", "daskjobs.replay", "daskjobs.cache",
                                "daskjobs.plugin", "daskjobs.policies")))
print(",".join(heavy))
"""


def test_loading_the_entry_point_imports_no_subcommand() -> None:
    run = subprocess.run(
        [sys.executable, "-c", IMPORT_CHECK], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "", f"imported by daskjobs.cli: {run.stdout.strip()}"


STATUS_IMPORTS = """
import sys
from daskjobs.plugin.client.cli import fetch_status
from click import ClickException
try:  # nothing listens there: the command's whole import path runs, then it fails to connect
    fetch_status("tcp://127.0.0.1:9", "1s")
except ClickException:
    pass
print(",".join(sorted(m for m in sys.modules if m.startswith("daskjobs"))))
"""


def test_status_loads_distributed_and_nothing_of_the_plugin() -> None:
    """``daskjobs status`` is a client call: most of its time is importing distributed (2-3 s
    on a loaded 2-CPU machine); the plugin's modules (its estimates, ranking, numpy work) are
    not loaded on top."""
    run = subprocess.run(
        [sys.executable, "-c", STATUS_IMPORTS], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    loaded = set(run.stdout.strip().split(","))
    assert "daskjobs.plugin.client" in loaded, loaded  # the call was made
    assert loaded <= {
        "daskjobs",
        "daskjobs.plugin",
        "daskjobs.plugin.client",
        "daskjobs.plugin.client.cli",
        "daskjobs._options",
        "daskjobs._text",
    }, loaded


@pytest.mark.slow
def test_an_unknown_subcommand_is_a_usage_error() -> None:
    run = dask("jobs", "nope")
    assert run.returncode == 2
    assert "No such command 'nope'" in run.stderr


@pytest.mark.slow
def test_dask_jobs_status_answers_against_a_real_scheduler_with_the_plugin(
    real_cluster: Any,
) -> None:
    rc = real_cluster(
        n_workers=1, preload="daskjobs.preload", preload_args=["--daskjobs-policy", "lpt"]
    )
    with rc.client() as c:
        assert c.submit(sum, [1, 2], pure=False).result() == 3
    run = dask("jobs", "status", rc.address, "--json")
    assert run.returncode == 0, run.stderr
    st = json.loads(run.stdout)
    assert st["address"] == rc.address and st["policy"] == "lpt" and st["errors"] == {}
    text = dask("jobs", "status", rc.address)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"scheduler {rc.address}\npolicy    lpt")
    assert rc.problems() == []
