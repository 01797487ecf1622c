"""docs/how-to/deploy.md's recipes, checked against dask, dask-jobqueue and a real scheduler.

* the operator's ``daskjobs.yaml``: dask's own config loader reads it and
  ``daskjobs.config.settings()`` accepts it, with every value the page says it sets;
* plain ``dask scheduler --preload daskjobs.preload`` with that file in ``DASK_CONFIG`` and a
  ``dask worker`` without a preload, as real processes: ``daskjobs status`` shows the policy,
  shares and quotas;
* dask-jobqueue: the page's ``SLURMCluster`` block, run: its scheduler carries the preload and runs
  the plugin with the page's settings; its job script activates the environment and starts plain
  workers (no scheduler preload);
* the Kubernetes operator: the page's manifest parses; the scheduler container names the preload,
  its environment variables and the mounted ConfigMap together give the same settings as the
  operator's file, and the workers have no preload.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import pytest
import yaml
from deploypage import PAGE, block
from repo import ROOT

from daskjobs.config import Settings, settings


def operator_yaml() -> str:
    return block("yaml", "# daskjobs.yaml")


def read_with_dask(files: dict[str, str], directory: Path) -> list[dict[str, Any]]:
    """What dask reads from a config directory holding ``files`` (dask.config.collect_yaml)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    return list(dask.config.collect_yaml(paths=[str(directory)]))


@contextlib.contextmanager
def dask_config(*configs: dict[str, Any]) -> Iterator[None]:
    """dask's config with ``configs`` merged over it, as a process that read them (in place:
    ``dask.config.get`` holds the config object it was defined with); restored after."""
    saved = copy.deepcopy(dask.config.config)
    for config in configs:
        dask.config.update(dask.config.config, copy.deepcopy(config), priority="new")
    try:
        yield
    finally:
        dask.config.config.clear()
        dask.config.config.update(saved)


def settings_with(*configs: dict[str, Any]) -> Settings:
    with dask_config(*configs):
        return settings()


def check_operator_settings(s: Settings) -> None:
    """What the page's table and comments say the operator's file sets."""
    assert s.policy == "fair-share"
    assert dict(s.teams.targets) == {"quant": 2.0, "ml": 1.0, "research": 1.0}
    assert dict(s.teams.quotas) == {"research": 16}
    assert s.teams.default == "research" and s.teams.strict and s.teams.half_life == 3600
    assert s.speculation.enabled
    assert s.speculation.late_factor == 2.5 and s.speculation.max_fraction == 0.1
    assert s.history_path == "/srv/daskjobs/history.json"
    assert s.record_dir == "/srv/daskjobs/traces" and s.record is None
    assert s.clients.record and not s.clients.replace_plugin


def test_the_operators_yaml_is_read_by_dask_and_accepted(tmp_path: Path) -> None:
    configs = read_with_dask({"daskjobs.yaml": operator_yaml()}, tmp_path / "etc-dask")
    assert [list(c) for c in configs] == [["daskjobs"]]
    check_operator_settings(settings_with(*configs))


def test_every_key_the_page_names_is_a_daskjobs_key() -> None:
    """The keys column of the page's table names keys of daskjobs.yaml (the defaults), so the
    page cannot name a key the plugin does not read."""
    defaults = yaml.safe_load((ROOT / "daskjobs" / "daskjobs.yaml").read_text())["daskjobs"]
    table = PAGE.read_text().split("## The operator's settings", 1)[1].split("```yaml", 1)[0]
    rows = [line.split("|") for line in table.splitlines() if line.startswith("| ")]
    assert rows[0][2].strip() == "keys" and len(rows) > 5
    named = [k for row in rows[1:] for k in re.findall(r"`([a-z.-]+)(?::[^`]*)?`", row[2])]
    section = "daskjobs"
    for key in named:
        parts = key.split(".")
        if len(parts) == 2:
            section = parts[0]
            assert parts[1] in defaults[parts[0]], key
        elif key not in defaults:  # written without its section, after one that named it
            assert key in defaults[section], key


# -- plain dask scheduler / dask worker ---------------------------------------------------------


@pytest.mark.realcluster
def test_dask_scheduler_with_the_pages_yaml_runs_the_plugin_as_configured(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from realcluster import RealCluster

    from daskjobs.cli import main

    state = tmp_path / "srv-daskjobs"
    (state / "traces").mkdir(parents=True)
    rc = RealCluster(tmp_path / "cluster", n_workers=1, preload="daskjobs.preload")
    # the page's file as the operator installs it, its paths moved under tmp_path
    text = operator_yaml().replace("/srv/daskjobs", str(state))
    (rc.workdir / "dask-config" / "daskjobs.yaml").write_text(text)
    try:
        rc.start()
        run = CliRunner().invoke(main, ["status", rc.address, "--json"], catch_exceptions=False)
        assert run.exit_code == 0, run.output
        st = json.loads(run.stdout)
        assert st["policy"] == "fair-share"
        teams = {row["team"]: row for row in st["teams"]}
        assert {t: round(teams[t]["share"], 3) for t in teams} == {
            "quant": 0.5,
            "ml": 0.25,
            "research": 0.25,
        }
        assert teams["research"]["quota"] == 16 and teams["quant"]["quota"] is None
        assert "preload" not in rc.log("w0").lower()  # the worker runs no preload
        assert rc.problems() == []
    finally:
        rc.close()


# -- dask-jobqueue -------------------------------------------------------------------------------


def test_the_jobqueue_recipe_preloads_the_scheduler_and_starts_plain_workers(
    tmp_path: Path,
) -> None:
    pytest.importorskip("dask_jobqueue", reason="the test extra installs dask-jobqueue")
    # the operator's file on the login node, where jobqueue's scheduler runs
    configs = read_with_dask({"daskjobs.yaml": operator_yaml()}, tmp_path / "login-node")
    code = block("python", "from dask_jobqueue import SLURMCluster")
    namespace: dict[str, Any] = {}
    shown = io.StringIO()
    with dask_config(*configs), contextlib.redirect_stdout(shown):
        exec(compile(code, f"{PAGE}:SLURMCluster", "exec"), namespace)
    cluster = namespace["cluster"]
    try:
        options = cluster.scheduler_spec["options"]
        assert options["preload"] == ["daskjobs.preload"]
        assert options["preload_argv"] == ["--daskjobs-policy", "fair-share"]
        plugin = cluster.scheduler.plugins["daskjobs"]  # the scheduler runs the plugin
        check_operator_settings(plugin.settings)
        script = cluster.job_script()
        assert shown.getvalue().strip() == script.strip()
        assert "source /shared/envs/sweeps/bin/activate\n" in script
        python = "/shared/envs/sweeps/bin/python -m distributed.cli.dask_worker"
        assert f"{python} {cluster.scheduler.address} " in script
        assert "--nthreads 4" in script and "--nworkers 4" in script
        assert "preload" not in script  # plain workers: the preload is the scheduler's
    finally:
        cluster.close()


# -- the Kubernetes operator ---------------------------------------------------------------------


def manifest() -> dict[str, dict[str, Any]]:
    docs = list(yaml.safe_load_all(block("yaml", "# daskcluster.yaml")))
    return {d["kind"]: d for d in docs}


def test_the_kubernetes_manifest_parses_and_names_the_preload(tmp_path: Path) -> None:
    found = manifest()
    assert set(found) == {"ConfigMap", "DaskCluster"}
    cluster = found["DaskCluster"]
    assert cluster["apiVersion"] == "kubernetes.dask.org/v1"
    spec = cluster["spec"]
    (scheduler,) = spec["scheduler"]["spec"]["containers"]
    (worker,) = spec["worker"]["spec"]["containers"]
    assert scheduler["args"] == ["dask", "scheduler", "--preload", "daskjobs.preload"]
    assert worker["args"][:2] == ["dask", "worker"] and "--preload" not in worker["args"]
    assert scheduler["image"] == worker["image"]  # one environment, daskjobs in it
    assert {p["containerPort"] for p in scheduler["ports"]} == {8786, 8787}
    # the ConfigMap is mounted where dask reads config, the state volume where the paths point
    mounts = {m["name"]: m["mountPath"] for m in scheduler["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["scheduler"]["spec"]["volumes"]}
    assert mounts["daskjobs-config"] in dask.config.paths
    assert volumes["daskjobs-config"]["configMap"]["name"] == found["ConfigMap"]["metadata"]["name"]
    assert mounts["daskjobs-state"] == "/srv/daskjobs"
    selector = spec["scheduler"]["service"]["selector"]
    assert selector == {
        "dask.org/cluster-name": cluster["metadata"]["name"],
        "dask.org/component": "scheduler",
    }


def test_the_kubernetes_env_and_configmap_give_the_operators_settings(tmp_path: Path) -> None:
    found = manifest()
    (scheduler,) = found["DaskCluster"]["spec"]["scheduler"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in scheduler["env"]}
    assert env and all(name.startswith("DASK_DASKJOBS__") for name in env)
    files = found["ConfigMap"]["data"]
    assert all(name.endswith(".yaml") for name in files)  # dask reads *.yaml
    from_files = read_with_dask(files, tmp_path / "etc-dask")  # the pod's /etc/dask
    from_env = dask.config.collect_env(env)  # dask reads the environment last: it wins
    check_operator_settings(settings_with(*from_files, from_env))


# -- teams bound to certificates ------------------------------------------------------------


def _dask_keys(section: Any, prefix: str = "") -> set[str]:
    """Every key path of a nested mapping (``distributed.comm.tls.ca-file``)."""
    out: set[str] = set()
    for k, v in section.items():
        path = f"{prefix}{k}"
        out.add(path)
        if isinstance(v, dict):
            out |= _dask_keys(v, f"{path}.")
    return out


def test_the_tls_settings_are_dasks_own_keys_and_the_plugin_accepts_them(tmp_path: Path) -> None:
    """The nodes' ``tls.yaml`` and a user's: every ``distributed`` key is one of dask's own
    (its defaults name it), the ``daskjobs`` section binds teams to certificates and is
    accepted with the operator's ``daskjobs.yaml``."""
    import distributed  # noqa: F401 - registers dask's own defaults

    nodes = block("yaml", "# tls.yaml: the scheduler's")
    user = block("yaml", "# tls.yaml on a user's machine")
    known = _dask_keys({"distributed": dask.config.get("distributed")})
    for text in (nodes, user):
        named = _dask_keys({"distributed": yaml.safe_load(text)["distributed"]})
        assert named <= known, sorted(named - known)
    configs = read_with_dask(
        {"daskjobs.yaml": operator_yaml(), "tls.yaml": nodes}, tmp_path / "etc-dask"
    )
    s = settings_with(*[{"daskjobs": c["daskjobs"]} for c in configs])
    assert s.teams.bound and s.teams.unmapped == "refuse"
    assert s.teams.identities["bob@example.com"] == "ml"
    assert set(s.teams.identities.values()) <= set(s.teams.targets)  # strict: checked teams
