"""Each default is written once, in ``daskjobs/daskjobs.yaml``, and every layer reads it.

The plugin's settings (``daskjobs.config``: ``settings()`` and the ``Settings()``
dataclasses), the simulator's ``Speculation()`` (its late factor and cap on copies)
and replay's reading of a trace header that leaves a speculation setting out all take
their defaults from the YAML. The policy core reads it without importing dask
(``daskjobs._defaults`` uses PyYAML only), so the layering rule holds and the
simulator stays free of dask.

The strongest check edits the YAML of a copy of the package and sees every layer
follow: a default written a second time anywhere would not.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import dask.config
import pytest
import yaml
from dask.utils import parse_timedelta

import daskjobs
from daskjobs.config import Settings, SpeculationSettings, settings
from daskjobs.policies import Speculation
from daskjobs.replay.races import _speculation

PACKAGE = Path(daskjobs.__file__).resolve().parent
YAML = yaml.safe_load((PACKAGE / "daskjobs.yaml").read_text(encoding="utf-8"))
SPEC = YAML["daskjobs"]["speculation"]


def _seconds(value: Any) -> float:
    return float(parse_timedelta(value, default="seconds"))


@pytest.fixture
def yaml_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """dask's ``daskjobs`` section as the YAML writes it, and nothing else."""
    monkeypatch.setitem(dask.config.config, "daskjobs", copy.deepcopy(YAML["daskjobs"]))


def test_the_settings_dataclasses_default_to_what_settings_makes_of_the_yaml(
    yaml_only: None,
) -> None:
    assert Settings() == settings()
    assert SpeculationSettings() == settings().speculation


def test_the_speculation_defaults_agree_everywhere(yaml_only: None) -> None:
    late, fraction = float(SPEC["late-factor"]), float(SPEC["max-fraction"])
    floor = _seconds(SPEC["min-runtime"])
    live = settings().speculation
    assert (live.late_factor, live.min_runtime, live.max_fraction) == (late, floor, fraction)
    # the simulator: the plugin's late factor and cap; no floor (Speculation's docstring)
    assert Speculation() == Speculation(late_factor=late, min_runtime=0.0, max_fraction=fraction)
    # replay, for a header that says speculation was on and nothing else: the plugin's
    notes: list[str] = []
    # (and the live check's interval: the replay judges attempts as often as the plugin did)
    replayed = _speculation({"speculation": {"enabled": True}}, notes)
    every = _seconds(SPEC["interval"])
    assert replayed == Speculation(late, floor, fraction, interval=every)
    assert notes == []
    # one constructor: the object the plugin runs live is the one replay builds
    assert live.policy() == replayed
    # a recorded setting the config refuses is noted and replayed without speculation
    assert _speculation({"speculation": {"enabled": True, "late_factor": 0.5}}, notes) is None
    assert len(notes) == 1 and "late-factor" in notes[0], notes
    notes.clear()
    # what the header says wins, a recorded 0 floor included
    given = {"enabled": True, "late_factor": 2.0, "min_runtime": 0.0, "max_fraction": 0.5}
    given["interval"] = 0.05
    assert _speculation({"speculation": given}, notes) == Speculation(2.0, 0.0, 0.5, interval=0.05)


EDITED = {
    "policy": "lpt",
    "default-estimate": "5s",
    "audit-events": 123,
    "teams": {"half-life": "2h", "within": "lpt"},
    "speculation": {
        "late-factor": 3.5,
        "min-runtime": "7s",
        "max-fraction": 0.25,
        "interval": "3s",
    },
    "clients": {"record": False},
}

CHECK = """
import dask.config
from daskjobs import _defaults
from daskjobs.config import Settings, settings
from daskjobs.policies import Speculation
from daskjobs.replay.races import _speculation

s = Settings()
assert s.policy == "lpt" and s.default_estimate == 5.0 and s.audit_events == 123, s
assert s.teams.half_life == 7200.0 and s.teams.within == "lpt", s.teams
assert s.speculation.late_factor == 3.5, s.speculation
assert s.speculation.min_runtime == 7.0 and s.speculation.max_fraction == 0.25, s.speculation
assert s.clients.record is False, s.clients
dask.config.config["daskjobs"] = _defaults.defaults()["daskjobs"]
assert settings() == s, (settings(), s)
assert Speculation() == Speculation(3.5, 0.0, 0.25), Speculation()
assert s.speculation.interval == 3.0, s.speculation
replayed = _speculation({"speculation": {"enabled": True}}, [])
assert replayed == Speculation(3.5, 7.0, 0.25, interval=3.0), replayed
print("ok")
"""


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(base[k], v) if isinstance(v, dict) else v
    return out


@pytest.mark.slow
def test_an_edited_yaml_changes_every_default(tmp_path: Path) -> None:
    """A copy of the package with other values in its YAML: every layer takes them."""
    shutil.copytree(PACKAGE, tmp_path / "daskjobs", ignore=shutil.ignore_patterns("__pycache__"))
    edited = {"daskjobs": _merged(YAML["daskjobs"], EDITED)}
    (tmp_path / "daskjobs" / "daskjobs.yaml").write_text(yaml.safe_dump(edited))
    (tmp_path / "dask-config").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    env["PYTHONPATH"] = str(tmp_path)
    env["DASK_CONFIG"] = str(tmp_path / "dask-config")
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHECK)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"


READ_WITHOUT_DASK = """
import sys
import daskjobs.sim
from daskjobs.policies import Speculation
print(Speculation().late_factor, Speculation().max_fraction)
print(",".join(sorted(m for m in sys.modules if m == "dask" or m.startswith("dask."))))
"""


def test_the_policy_core_reads_its_defaults_without_importing_dask() -> None:
    run = subprocess.run(
        [sys.executable, "-c", READ_WITHOUT_DASK], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    values, loaded = [*run.stdout.splitlines(), ""][:2]
    assert values == f"{float(SPEC['late-factor'])} {float(SPEC['max-fraction'])}"
    assert loaded == "", f"the simulator imported {loaded}"
