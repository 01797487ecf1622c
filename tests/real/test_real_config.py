"""Configuration on a real ``dask scheduler`` process, as an operator starts it.

A bad ``daskjobs`` setting must stop the scheduler from starting (non-zero exit,
the key named in its output), never leave a scheduler serving plain dask; good
settings spelled the way dask's environment variables spell them (snake_case)
must reach the plugin.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from realconfig import refused
from repo import FOLDERS, ROOT

import daskjobs

SHIM = "plugins/daskjobs_scheduler.py"
MODULE = "daskjobs.preload"


@pytest.mark.realcluster
@pytest.mark.parametrize("preload", [SHIM, MODULE])
@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"DASK_DASKJOBS__POLICY": "nope"}, "daskjobs.policy: unknown policy 'nope'"),
        (
            {"DASK_DASKJOBS__SPECULATION__INTERVAL": "1us"},
            "daskjobs.speculation.interval: expected a duration of at least 10ms, got '1us'",
        ),
        (
            {"DASK_DASKJOBS__SPECULATION__ENABLED": "maybe"},
            "daskjobs.speculation.enabled: expected true or false",
        ),
    ],
)
def test_a_bad_setting_stops_the_scheduler(
    tmp_path: Path, preload: str, env: dict[str, str], says: str
) -> None:
    code, log = refused(tmp_path, preload=preload, env=env)
    assert code != 0 and says in log, log
    assert "Scheduler at:" not in log  # refused before it listened


@pytest.mark.realcluster
@pytest.mark.parametrize("preload", [SHIM, MODULE])
def test_a_bad_preload_option_is_a_usage_error(tmp_path: Path, preload: str) -> None:
    code, log = refused(tmp_path, preload=preload, preload_args=["--daskjobs-policy", "nope"])
    assert code == 2, log
    assert (
        "Error: Invalid value for '--daskjobs-policy': daskjobs.policy: unknown policy 'nope'; "
        "expected one of fifo, lpt, critical-path, fair-share, node-aware"
    ) in log, log


#: A user's policy module, passed as a second --preload (it has no dask_setup).
LATE_POLICIES = """
from daskjobs.policies import HeapPolicy, register


class ShortestFirst(HeapPolicy):
    name = "shortest-first"

    def key(self, task):
        return task.estimate


register("shortest-first", ShortestFirst)
"""


@pytest.mark.realcluster
@pytest.mark.parametrize("preload", [SHIM, MODULE])
def test_a_policy_another_preload_registers_after_daskjobs_s_is_taken(
    real_cluster: Any, tmp_path: Path, preload: str
) -> None:
    """``--preload daskjobs.preload --preload mypolicies --daskjobs-policy NAME``: the
    policy is registered after the daskjobs preload was imported, and still accepted."""
    (tmp_path / "mypolicies.py").write_text(LATE_POLICIES)
    path = [str(tmp_path), *map(str, FOLDERS), str(ROOT)]
    rc = real_cluster(
        n_workers=1,
        preload=preload,
        preload_args=["--preload", "mypolicies", "--daskjobs-policy", "shortest-first"],
        env={"PYTHONPATH": os.pathsep.join(path)},
    )
    with rc.client() as c:
        assert c.run_on_scheduler(scheduler_settings).policy == "shortest-first"
        assert c.submit(sum, [1, 2, 3]).result() == 6
        assert daskjobs.status(c)["policy"] == "shortest-first"
        ranked = [e for _, e in c.get_events("daskjobs") if e.get("action") == "ranked-graph"]
        assert ranked and ranked[-1]["policy"] == "shortest-first"  # the user's object ranked it
    assert rc.problems() == []


@pytest.mark.realcluster
def test_a_preload_from_dask_config_refuses_too(tmp_path: Path) -> None:
    """Preload named in ``distributed.scheduler.preload``: dask swallows a failing
    ``dask_setup``; the plugin still stops the scheduler from starting."""
    config = {"distributed": {"scheduler": {"preload": [MODULE]}}}
    env = {"DASK_DASKJOBS__TEAMS__TARGETS__A": "1e999"}  # dask reads 1e999 as inf
    code, log = refused(tmp_path, preload=None, config=config, env=env)
    assert code != 0, log
    assert "daskjobs.teams.targets.a: expected a finite number > 0, got inf" in log, log
    assert "Scheduler failed to start" in log


@pytest.mark.realcluster
def test_a_section_dask_would_silently_replace_stops_the_scheduler(tmp_path: Path) -> None:
    config = {"daskjobs": {"teams": {"targets": [1, 2]}}}
    code, log = refused(tmp_path, preload=SHIM, config=config)
    assert code != 0, log
    assert "daskjobs.teams.targets: expected a mapping of team name to value, got [1, 2]" in log


def scheduler_settings(dask_scheduler: Any) -> Any:
    return dask_scheduler.plugins["daskjobs"].settings


@pytest.mark.realcluster
@pytest.mark.parametrize("preload", [SHIM, MODULE])
def test_snake_case_environment_variables_reach_the_plugin(real_cluster: Any, preload: str) -> None:
    env = {
        "DASK_DASKJOBS__DEFAULT_ESTIMATE": "10s",
        "DASK_DASKJOBS__SPECULATION__LATE_FACTOR": "2",
        "DASK_DASKJOBS__SPECULATION__ENABLED": "yes",
        "DASK_DASKJOBS__SPECULATION__INTERVAL": "50ms",
        "DASK_DASKJOBS__TEAMS__STRICT": "off",
    }
    rc = real_cluster(
        n_workers=1, preload=preload, preload_args=["--daskjobs-policy", "node-aware"], env=env
    )
    with rc.client() as c:
        s = c.run_on_scheduler(scheduler_settings)
        assert s.policy == "node-aware" and s.default_estimate == 10.0
        assert s.speculation.enabled is True and s.speculation.late_factor == 2.0
        assert s.speculation.interval == 0.05 and s.teams.strict is False
        assert c.submit(sum, [1, 2, 3]).result() == 6
        st = daskjobs.status(c)
        assert st["policy"] == "node-aware" and st["speculation"] is not None
    assert rc.problems() == []
