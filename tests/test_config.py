"""The ``daskjobs`` config section: spelled the dask way, every bad value named.

A task's estimate, annotated or a sweep stage's, reads a duration as the section does,
and a bad one names its task.

dask reads ``DASK_*`` variables and YAML files when it is imported, before daskjobs
registers its defaults, so an operator's ``DASK_DASKJOBS__DEFAULT_ESTIMATE=10s``
lands in dask's config as ``default_estimate`` (dask keeps the first spelling it
saw). :func:`dask_loads` builds the section exactly that way, with dask's own
functions, and a subprocess test checks it against a fresh interpreter.

The preload tests start an in-process ``Scheduler`` with the preload named in its
arguments, the path dask takes when the preload comes from dask's config rather
than the ``dask scheduler`` command line (``tests/real/test_real_config.py`` covers that).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import dask.config
import pytest
import yaml
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from repo import ROOT

import daskjobs.config
from daskjobs.config import MIN_INTERVAL, POLICIES, settings
from daskjobs.policies import HeapPolicy, registry
from daskjobs.policies.fairshare import FairShare
from daskjobs.policies.speculation import Speculation

DEFAULTS = yaml.safe_load((ROOT / "daskjobs" / "daskjobs.yaml").read_text())


def dask_loads(env: dict[str, str]) -> dict[str, Any]:
    """The ``daskjobs`` section dask holds after reading ``env`` at import and then
    daskjobs's defaults (dask.config.update_defaults), in that order."""
    cfg = dask.config.collect_env(env)
    dask.config.update_defaults(DEFAULTS, config=cfg, defaults=[])
    return cfg["daskjobs"]


@pytest.fixture
def dask_section(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any], None]:
    """Replace the ``daskjobs`` section of dask's global config for one test."""

    def use(section: Any) -> None:
        monkeypatch.setitem(dask.config.config, "daskjobs", section)

    return use


# -- the dask spellings -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "get", "expected"),
    [
        ({"DASK_DASKJOBS__DEFAULT_ESTIMATE": "10s"}, lambda s: s.default_estimate, 10.0),
        (
            {"DASK_DASKJOBS__SPECULATION__LATE_FACTOR": "2"},
            lambda s: s.speculation.late_factor,
            2.0,
        ),
        (
            {"DASK_DASKJOBS__SPECULATION__MAX_FRACTION": "0.5"},
            lambda s: s.speculation.max_fraction,
            0.5,
        ),
        (
            {"DASK_DASKJOBS__SPECULATION__MIN_RUNTIME": "3s"},
            lambda s: s.speculation.min_runtime,
            3.0,
        ),
        ({"DASK_DASKJOBS__SPECULATION__ENABLED": "true"}, lambda s: s.speculation.enabled, True),
        ({"DASK_DASKJOBS__SPECULATION__ENABLED": "yes"}, lambda s: s.speculation.enabled, True),
        ({"DASK_DASKJOBS__SPECULATION__ENABLED": "no"}, lambda s: s.speculation.enabled, False),
        ({"DASK_DASKJOBS__SPECULATION__ENABLED": "off"}, lambda s: s.speculation.enabled, False),
        ({"DASK_DASKJOBS__AUDIT_EVENTS": "5"}, lambda s: s.audit_events, 5),
        ({"DASK_DASKJOBS__HISTORY__SAMPLES": "8"}, lambda s: s.history_samples, 8),
        ({"DASK_DASKJOBS__TEAMS__HALF_LIFE": "30m"}, lambda s: s.teams.half_life, 1800.0),
        ({"DASK_DASKJOBS__TEAMS__STRICT": "on"}, lambda s: s.teams.strict, True),
        ({"DASK_DASKJOBS__POLICY": "node-aware"}, lambda s: s.policy, "node-aware"),
        # a team name is data, not a key: dask lower-cases it, daskjobs keeps its underscores
        (
            {"DASK_DASKJOBS__TEAMS__TARGETS__ML_RESEARCH": "2"},
            lambda s: dict(s.teams.targets),
            {"ml_research": 2.0},
        ),
    ],
)
def test_snake_case_environment_variables_as_dask_reads_them(
    dask_section: Callable[[Any], None], env: dict[str, str], get: Any, expected: Any
) -> None:
    dask_section(dask_loads(env))
    value = get(settings())
    assert value == expected and type(value) is type(expected)


def test_a_fresh_interpreter_reads_snake_case_environment_variables() -> None:
    """The real order: dask reads the environment at import, daskjobs's defaults come after."""
    code = (
        "import dataclasses, json, daskjobs.config as c; "
        "print(json.dumps(dataclasses.asdict(c.settings())))"
    )
    env = {
        "DASK_DASKJOBS__DEFAULT_ESTIMATE": "10s",
        "DASK_DASKJOBS__SPECULATION__LATE_FACTOR": "2",
        "DASK_DASKJOBS__SPECULATION__ENABLED": "false",
        "DASK_DASKJOBS__TEAMS__HALF_LIFE": "null",
        "DASK_DASKJOBS__TEAMS__TARGETS__ML_A": "3",
        "DASK_CONFIG": "/nonexistent",  # only the environment, not the user's YAML
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["default_estimate"] == 10.0
    assert got["speculation"]["late_factor"] == 2.0 and got["speculation"]["enabled"] is False
    assert got["teams"]["half_life"] is None and got["teams"]["targets"] == {"ml_a": 3.0}


@pytest.mark.parametrize(
    ("yaml_text", "env", "says"),
    [
        ("daskjobs:\n  teams: 3\n", {}, "daskjobs.teams: expected a mapping of settings, got 3"),
        (
            "daskjobs:\n  teams:\n    targets: [1, 2]\n",
            {},
            "daskjobs.teams.targets: expected a mapping of team name to value, got [1, 2]",
        ),
        (
            "",
            {"DASK_DASKJOBS__SPECULATION": "5"},
            "daskjobs.speculation: expected a mapping of settings, got 5",
        ),
        ("daskjobs: 3\n", {}, "daskjobs: expected a mapping of settings, got 3"),
    ],
)
def test_a_value_dask_replaces_by_the_defaults_is_still_an_error(
    tmp_path: Path, yaml_text: str, env: dict[str, str], says: str
) -> None:
    """dask.config.update_defaults silently puts the defaults where an operator's file
    has a non-mapping (``teams: 3``); daskjobs still names the operator's value."""
    (tmp_path / "user.yaml").write_text(yaml_text)
    code = (
        "import daskjobs.config as c\n"
        "try:\n    c.settings()\nexcept ValueError as e:\n    print(e)\n"
        "else:\n    print('accepted')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"DASK_CONFIG": str(tmp_path), "PATH": "/usr/bin:/bin", **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(says), out.stdout
    assert "replaced" in out.stdout  # says what dask did with it


def test_snake_case_keys_in_dask_config_and_in_keywords(
    dask_section: Callable[[Any], None],
) -> None:
    # a YAML file read before the defaults keeps the user's spelling in dask's config
    cfg = {"daskjobs": {"default_estimate": "10s", "speculation": {"late_factor": 3}}}
    dask.config.update_defaults(DEFAULTS, config=cfg, defaults=[])
    dask_section(cfg["daskjobs"])
    s = settings(speculation={"min_runtime": "2s"}, audit_events=7)
    assert s.default_estimate == 10.0 and s.speculation.late_factor == 3.0
    assert s.speculation.min_runtime == 2.0 and s.audit_events == 7
    # and a keyword overrides a setting whichever way either is spelled
    assert settings(speculation={"late-factor": 4}).speculation.late_factor == 4.0


def test_both_spellings_of_one_key_with_different_values_are_rejected(
    dask_section: Callable[[Any], None],
) -> None:
    dask_section({"default_estimate": "10s", "default-estimate": "20s"})
    with pytest.raises(ValueError, match=r"daskjobs.default-estimate: given twice"):
        settings()


def test_team_names_keep_their_spelling() -> None:
    s = settings(teams={"targets": {"ml_a": 1, "ml-b": 2}, "quotas": {"ml_a": 3}})
    assert dict(s.teams.targets) == {"ml_a": 1.0, "ml-b": 2.0}
    assert dict(s.teams.quotas) == {"ml_a": 3}


def test_an_empty_section_means_the_defaults(dask_section: Callable[[Any], None]) -> None:
    # `speculation:` with nothing under it is None in YAML
    dask_section(dask_loads({}))
    defaults = settings()
    dask_section({"speculation": None, "teams": {}})
    assert settings(history=None) == defaults
    assert defaults.speculation.late_factor == DEFAULTS["daskjobs"]["speculation"]["late-factor"]


# -- values are checked strictly ----------------------------------------------------------------

TRUE = ("true", "yes", "1", "on", "True", "YES", "On", True, 1)
FALSE = ("false", "no", "0", "off", "False", "NO", "Off", False, 0)


@pytest.mark.parametrize("value", TRUE + FALSE)
def test_booleans_from_strings(value: Any) -> None:
    expected = value in TRUE
    assert settings(speculation={"enabled": value}).speculation.enabled is expected
    assert settings(teams={"strict": value}).teams.strict is expected


@pytest.mark.parametrize("value", ["maybe", "", "t", 2, -1, 0.5, [], {}, "none"])
def test_anything_else_is_not_a_boolean(value: Any) -> None:
    with pytest.raises(ValueError) as err:
        settings(speculation={"enabled": value})
    msg = str(err.value)
    assert msg.startswith("daskjobs.speculation.enabled: expected true or false")
    assert repr(value) in msg
    with pytest.raises(ValueError, match=r"^daskjobs.teams.strict: expected true or false"):
        settings(teams={"strict": value})


@pytest.mark.parametrize("value", ["1us", "9ms", 0.001, 0, "0s"])
def test_the_speculation_interval_has_a_floor(value: Any) -> None:
    with pytest.raises(ValueError) as err:
        settings(speculation={"interval": value})
    msg = str(err.value)
    assert msg.startswith("daskjobs.speculation.interval: expected a duration of at least 10ms")
    assert repr(value) in msg


def test_the_floor_itself_is_accepted() -> None:
    assert MIN_INTERVAL == 0.01
    assert settings(speculation={"interval": "10ms"}).speculation.interval == MIN_INTERVAL


@pytest.mark.parametrize("share", [math.inf, -math.inf, math.nan, 0, -1, "x", True, None, [1]])
def test_shares_are_positive_finite_numbers(share: Any) -> None:
    with pytest.raises(ValueError) as err:
        settings(teams={"targets": {"a": share}})
    msg = str(err.value)
    assert msg.startswith("daskjobs.teams.targets.a: expected a finite number > 0")
    assert repr(share) in msg


def test_shares_must_sum_to_a_finite_number() -> None:
    with pytest.raises(ValueError, match=r"^daskjobs.teams.targets: .*sum"):
        settings(teams={"targets": {"a": 1e308, "b": 1e308}})


@pytest.mark.parametrize("quota", [0, -1, 1.5, math.inf, math.nan, "x", True, None])
def test_quotas_are_integers_of_at_least_one(quota: Any) -> None:
    with pytest.raises(ValueError) as err:
        settings(teams={"quotas": {"a": quota}})
    msg = str(err.value)
    assert msg.startswith("daskjobs.teams.quotas.a: expected an integer >= 1")
    assert repr(quota) in msg


def test_numbers_written_as_strings_are_read() -> None:
    s = settings(
        speculation={"late_factor": "2.5", "max_fraction": "0.2"},
        teams={"targets": {"a": "2"}, "quotas": {"a": "3"}},
        history={"samples": "16"},
    )
    assert (s.speculation.late_factor, s.speculation.max_fraction) == (2.5, 0.2)
    assert s.teams.targets == {"a": 2.0} and s.teams.quotas == {"a": 3}
    assert s.history_samples == 16


def test_an_estimate_reads_durations_as_the_configuration_does():
    from daskjobs.config import settings
    from daskjobs.plugin.estimates import check_estimate
    from daskjobs.sweep import Sweep

    assert settings(default_estimate="10s").default_estimate == 10.0
    assert check_estimate("k", "10s") == 10.0
    assert check_estimate("k", "2 minutes") == 120.0
    assert check_estimate("k", 2.5) == 2.5
    sweep = Sweep()
    stage = sweep.stage(lambda x: x, over={"x": [1, 2]}, estimate="10s", name="s")
    assert {n.estimate for n in stage.nodes} == {10.0}
    per = sweep.stage(lambda x: x, over={"x": [1]}, estimate=lambda p: "150ms", name="t")
    assert [n.estimate for n in per.nodes] == [0.15]


@pytest.mark.parametrize("bad", ["soon", -1, float("nan"), True])
def test_a_bad_estimate_still_names_the_task(bad):
    from daskjobs.plugin.estimates import BadEstimate, check_estimate

    with pytest.raises(BadEstimate, match=r"task 'k': estimate must be a duration"):
        check_estimate("k", bad)


@pytest.mark.parametrize(
    ("overrides", "key", "value"),
    [
        ({"teams": 3}, "daskjobs.teams", 3),
        ({"teams": {"targets": [1, 2]}}, "daskjobs.teams.targets", [1, 2]),
        ({"teams": {"quotas": 5}}, "daskjobs.teams.quotas", 5),
        ({"teams": {"quotas": {"a": "x"}}}, "daskjobs.teams.quotas.a", "x"),
        ({"teams": {"targets": {3: 1}}}, "daskjobs.teams.targets", 3),
        ({"teams": {"default": 3}}, "daskjobs.teams.default", 3),
        ({"teams": {"default": ""}}, "daskjobs.teams.default", ""),
        ({"teams": {"within": ["fifo"]}}, "daskjobs.teams.within", ["fifo"]),
        ({"teams": {"half_life": "-1s"}}, "daskjobs.teams.half-life", "-1s"),
        ({"teams": {"half_life": math.inf}}, "daskjobs.teams.half-life", math.inf),
        ({"history": "x"}, "daskjobs.history", "x"),
        ({"history": {"samples": 2.0}}, "daskjobs.history.samples", 2.0),
        ({"history": {"samples": 10**9}}, "daskjobs.history.samples", 10**9),
        ({"history": {"path": 3}}, "daskjobs.history.path", 3),
        ({"speculation": 5}, "daskjobs.speculation", 5),
        ({"speculation": {"late_factor": math.inf}}, "daskjobs.speculation.late-factor", math.inf),
        ({"speculation": {"late_factor": "x"}}, "daskjobs.speculation.late-factor", "x"),
        ({"speculation": {"max_fraction": 0}}, "daskjobs.speculation.max-fraction", 0),
        ({"speculation": {"min_runtime": [1]}}, "daskjobs.speculation.min-runtime", [1]),
        ({"speculation": {"interval": ""}}, "daskjobs.speculation.interval", ""),
        ({"policy": 3}, "daskjobs.policy", 3),
        ({"policy": None}, "daskjobs.policy", None),
        ({"default_estimate": [1]}, "daskjobs.default-estimate", [1]),
        ({"default_estimate": True}, "daskjobs.default-estimate", True),
        ({"default_estimate": 10**400}, "daskjobs.default-estimate", 10**400),
        ({"default_estimate": math.nan}, "daskjobs.default-estimate", math.nan),
        ({"audit_events": -1}, "daskjobs.audit-events", -1),
        ({"audit_events": 10**100}, "daskjobs.audit-events", 10**100),
        ({"record": 3}, "daskjobs.record", 3),
        ({"record": ""}, "daskjobs.record", ""),
        ({"record": "a\x00b"}, "daskjobs.record", "a\x00b"),
        ({"store": 3}, "daskjobs.store", 3),
    ],
)
def test_each_bad_value_gets_one_message_naming_key_value_and_expectation(
    overrides: dict[str, Any], key: str, value: Any
) -> None:
    with pytest.raises(ValueError) as err:
        settings(**overrides)
    msg = str(err.value)
    assert msg.startswith(key + ":"), msg
    assert repr(value)[:15] in msg and "expected" in msg, msg
    assert "\n" not in msg


def test_a_section_that_is_not_a_mapping_is_named(dask_section: Callable[[Any], None]) -> None:
    dask_section(3)
    with pytest.raises(ValueError, match=r"^daskjobs: expected a mapping of settings, got 3"):
        settings()


def test_a_strict_quota_needs_a_target() -> None:
    with pytest.raises(ValueError, match=r"^daskjobs.teams.quotas.b: .*targets"):
        settings(teams={"strict": True, "targets": {"a": 1}, "quotas": {"b": 2}})
    # not strict: a team without a target gets the default share, and may have a quota
    assert settings(teams={"targets": {"a": 1}, "quotas": {"b": 2}}).teams.quotas == {"b": 2}


def test_unknown_keys_are_still_named() -> None:
    with pytest.raises(ValueError, match=r"unknown key\(s\) in daskjobs.speculation: late"):
        settings(speculation={"late": 2})
    with pytest.raises(ValueError, match=r"unknown key\(s\) in daskjobs: polcy"):
        settings(polcy="lpt")


# -- the policy and its own settings: whatever the registry holds ------------------------------


class Deepest(HeapPolicy):
    """A user's policy: ``depth`` is its one setting."""

    name = "deepest"

    def __init__(self, depth: int = 1, *, mode: str = "x") -> None:
        super().__init__()
        self.depth, self.mode = depth, mode

    def key(self, task: Any) -> float:
        return -task.estimate * self.depth


@pytest.fixture
def deepest() -> Iterator[None]:
    registry.register("deepest", Deepest)
    try:
        yield
    finally:
        registry.unregister("deepest")


def test_the_policies_offered_are_the_registry_s_live_ones(deepest: None) -> None:
    assert POLICIES == ("fifo", "lpt", "critical-path", "fair-share", "node-aware")
    assert daskjobs.config.policy_names() == (*POLICIES, "deepest")
    assert daskjobs.config.policy_names() == daskjobs.config.POLICIES


@pytest.mark.parametrize(
    "word, meant",
    [
        ("longest-first", "lpt"),
        ("Longest_First", "lpt"),
        ("cp", "critical-path"),
        ("fair", "fair-share"),
    ],
)
def test_a_policy_called_by_another_name_gets_a_did_you_mean(word: str, meant: str) -> None:
    """The docs say "longest-first"; the policy is lpt: the error says so."""
    with pytest.raises(ValueError, match=f"unknown policy '{word}'.*; did you mean {meant}\\?$"):
        settings(policy=word)


def test_a_registered_policy_validates_and_an_unregistered_one_names_the_known_ones() -> None:
    with pytest.raises(ValueError) as err:
        settings(policy="deepest")
    assert str(err.value) == (
        "daskjobs.policy: unknown policy 'deepest'; expected one of fifo, lpt, critical-path, "
        "fair-share, node-aware"
    )
    registry.register("deepest", Deepest)
    try:
        assert settings(policy="deepest").policy == "deepest"
        with dask.config.set({"daskjobs.policy": "deepest"}):
            assert settings().policy == "deepest"
        with pytest.raises(ValueError, match=r"expected one of fifo, .*, node-aware, deepest$"):
            settings(policy="nope")
    finally:
        registry.unregister("deepest")


def test_a_simulator_only_policy_is_refused_saying_so() -> None:
    with pytest.raises(ValueError) as err:
        settings(policy="work-stealing")
    msg = str(err.value)
    assert msg.startswith("daskjobs.policy: 'work-stealing' runs in the simulator only"), msg
    assert msg.endswith("expected one of fifo, lpt, critical-path, fair-share, node-aware"), msg


def test_policy_options_default_to_none_and_reach_the_policy(deepest: None) -> None:
    assert settings().policy_options == {}
    s = settings(policy="deepest", policy_options={"depth": 3})
    assert s.policy_options == {"depth": 3}
    made = registry.make(s.policy, **daskjobs.config.policy_settings(s))
    assert isinstance(made, Deepest) and made.depth == 3
    # kebab-case as in the YAML, snake_case from DASK_ variables
    assert settings(policy="node-aware", policy_options={"slow-threshold": 2}).policy_options == {
        "slow_threshold": 2
    }
    section = dask_loads(
        {"DASK_DASKJOBS__POLICY": "deepest", "DASK_DASKJOBS__POLICY_OPTIONS__DEPTH": "4"}
    )
    with dask.config.set({"daskjobs": section}):
        assert settings().policy_options == {"depth": 4}


def test_options_follow_their_policy(deepest: None) -> None:
    with dask.config.set({"daskjobs.policy": "deepest", "daskjobs.policy-options": {"depth": 2}}):
        assert settings().policy_options == {"depth": 2}
        assert settings(policy="deepest").policy_options == {"depth": 2}
        # a keyword that changes the policy does not hand it the other policy's options
        assert settings(policy="lpt").policy_options == {}
        assert settings(policy_options={"mode": "y"}).policy_options == {"mode": "y"}


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"policy_options": 3}, r"^daskjobs.policy-options: expected a mapping of setting names"),
        ({"policy_options": [1]}, r"^daskjobs.policy-options: expected a mapping"),
        (
            {"policy_options": {"depth": 2}},
            r"^daskjobs.policy-options.depth: policy 'critical-path' has no setting 'depth' "
            r"\(it takes none\)",
        ),
        (
            {"policy": "deepest", "policy_options": {"dept": 2}},
            r"^daskjobs.policy-options.dept: policy 'deepest' has no setting 'dept' "
            r"\(it takes: depth, mode\)",
        ),
        (
            {"policy": "deepest", "policy_options": {3: 2}},
            r"^daskjobs.policy-options: expected setting names as strings, got 3",
        ),
        (
            {"policy": "fair-share", "policy_options": {"targets": {"a": 1}}},
            r"^daskjobs.policy-options.targets: fair-share takes it from daskjobs.teams",
        ),
    ],
)
def test_bad_policy_options_are_named(deepest: None, overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        settings(**overrides)


def test_fair_share_takes_its_settings_from_the_teams_section() -> None:
    s = settings(
        policy="fair-share",
        teams={"targets": {"a": 2}, "quotas": {"a": 3}, "within": "lpt", "half_life": None},
        policy_options={"default_share": 0.5},
    )
    made = registry.make("fair-share", **daskjobs.config.policy_settings(s))
    assert isinstance(made, FairShare)
    assert made.quotas == {"a": 3} and made.within == "lpt" and made.half_life is None
    assert made.default_share == 0.5 and made.share("a") == 1.0
    assert daskjobs.config.policy_settings(settings(policy="fair-share"))["targets"] == {
        "default": 1.0
    }


# -- random junk anywhere: a ValueError naming the key, or settings the plugin can start with ---

#: every key of the section, sections included (``("teams",)``, ``("teams", "quotas")``)
PATHS = [(k,) for k in DEFAULTS["daskjobs"]] + [
    (k, sub) for k, v in DEFAULTS["daskjobs"].items() if isinstance(v, dict) for sub in v
]

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(
        [
            *("false", "no", "yes", "on", "off", "0", "1", "2", "", "a", "b", "default"),
            *("fifo", "lpt", "fair-share", "inf", "-inf", "nan", ".inf", "1e999"),
            *("-1s", "0s", "1us", "9ms", "10ms", "10s", "1h"),
        ]
    ),
)
#: keys of junk mappings: random, or the section's own keys in either spelling
KEYS = st.one_of(
    st.text(max_size=5),
    st.integers(),
    st.none(),
    st.sampled_from(sorted({p[-1] for p in PATHS} | {p[-1].replace("-", "_") for p in PATHS})),
)
JUNK = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(KEYS, children, max_size=3),
    max_leaves=8,
)


def nested(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out: Any = value
    for part in reversed(path):
        out = {part: out}
    return out


def put(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """The default section with ``value`` at ``path``."""
    section = json.loads(json.dumps(DEFAULTS["daskjobs"]))
    at = section
    for part in path[:-1]:
        at = at[part]
    at[path[-1]] = value
    return section


def named(msg: str, key: str) -> bool:
    """``msg`` names ``key`` (or a key inside it: a team, an unknown key)."""
    return msg.startswith(key) or f"in {key}:" in msg or f"in {key}." in msg


def startable(s: daskjobs.config.Settings) -> None:
    """What JobsPlugin.start builds from the settings must accept them."""
    assert s.policy in POLICIES
    registry.make(s.policy, **daskjobs.config.policy_settings(s))
    sp = s.speculation
    Speculation(sp.late_factor, sp.min_runtime, sp.max_fraction)
    assert sp.interval >= MIN_INTERVAL and isinstance(sp.enabled, bool)
    teams = s.teams
    FairShare(
        dict(teams.targets) or {teams.default: 1.0},
        within=teams.within,
        half_life=teams.half_life,
        quotas=teams.quotas,
        strict=teams.strict,
    )
    assert isinstance(teams.strict, bool) and isinstance(teams.default, str)
    assert s.default_estimate >= 0 and math.isfinite(s.default_estimate)
    assert isinstance(s.audit_events, int) and isinstance(s.history_samples, int)


@pytest.mark.slow
@hsettings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PATHS), JUNK, st.booleans())
def test_random_junk_in_any_key_is_a_value_error_naming_it(
    path: tuple[str, ...], junk: Any, through_config: bool
) -> None:
    given_ = nested(path, junk)
    key = "daskjobs." + ".".join(path)
    try:
        if through_config:
            old = dask.config.config.get("daskjobs")
            dask.config.config["daskjobs"] = put(path, junk)
            try:
                s = settings()
            finally:
                dask.config.config["daskjobs"] = old
        else:
            s = settings(**given_)
    except ValueError as e:
        msg = str(e)
        assert named(msg, key), msg
        assert "\n" not in msg
    else:
        startable(s)


@hsettings(max_examples=100, deadline=None)
@given(JUNK)
@example({"teams": {None: None}})  # "unknown key(s) in daskjobs.teams: None"
def test_random_junk_as_the_whole_section_is_a_value_error(junk: Any) -> None:
    old = dask.config.config.get("daskjobs")
    dask.config.config["daskjobs"] = junk
    try:
        startable(settings())
    except ValueError as e:
        assert named(str(e), "daskjobs"), str(e)
    finally:
        dask.config.config["daskjobs"] = old


# -- the preload --------------------------------------------------------------------------------


def test_the_preload_offers_every_policy() -> None:
    """``--daskjobs-policy`` is no list taken at import: any policy the plugin runs."""
    from daskjobs.preload import dask_setup

    (option,) = [p for p in dask_setup.params if p.name == "daskjobs_policy"]
    assert not isinstance(option.type, click.Choice)
    for name in daskjobs.config.policy_names():
        parse(["--daskjobs-policy", name])


def test_the_preload_takes_a_policy_registered_after_it_was_imported(
    dask_section: Callable[[Any], None],
) -> None:
    import daskjobs.preload  # noqa: F401 - imported first, as a first --preload is

    dask_section(dask_loads({}))
    with pytest.raises(click.BadParameter, match=r"unknown policy 'deepest'"):
        parse(["--daskjobs-policy", "deepest"])
    registry.register("deepest", Deepest)  # as another preload or a late entry point would
    try:
        parse(["--daskjobs-policy", "deepest"])
        s = start_scheduler(
            preload="daskjobs.preload", preload_argv=["--daskjobs-policy", "deepest"]
        )
        assert s is not None and s.policy == "deepest"
    finally:
        registry.unregister("deepest")


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("nope", "unknown policy 'nope'"),
        ("work-stealing", "'work-stealing' runs in the simulator only, not in the plugin"),
    ],
)
def test_a_bad_preload_policy_is_refused_naming_the_known_ones(name: str, says: str) -> None:
    with pytest.raises(click.BadParameter) as err:
        parse(["--daskjobs-policy", name])
    assert err.value.exit_code == 2
    message = err.value.format_message()
    assert message.startswith(f"Invalid value for '--daskjobs-policy': daskjobs.policy: {says}")
    assert message.endswith("expected one of fifo, lpt, critical-path, fair-share, node-aware")


def test_the_shim_is_the_package_preload() -> None:
    from distributed.utils import import_file

    import daskjobs.preload

    (shim,) = import_file(str(ROOT / "plugins" / "daskjobs_scheduler.py"))
    assert shim.dask_setup is daskjobs.preload.dask_setup


def parse(args: list[str]) -> None:
    """What ``dask scheduler`` does with the options after ``--preload`` before it starts."""
    from daskjobs.preload import dask_setup

    dask_setup.parse_args(click.Context(dask_setup, allow_extra_args=False), args)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--daskjobs-policy", "nope"], r"Invalid value for '--daskjobs-policy'"),
        (["--daskjobs-record", ""], r"Invalid value for '--daskjobs-record'"),
        (["--daskjobs-history", ""], r"Invalid value for '--daskjobs-history'"),
        (["--daskjobs-polcy", "lpt"], r"No such option"),
    ],
)
def test_bad_preload_options_are_rejected_by_click(args: list[str], match: str) -> None:
    with pytest.raises(click.UsageError) as err:
        parse(args)
    assert re.search(match, err.value.format_message()), err.value.format_message()


def test_a_bad_config_is_rejected_when_the_command_line_is_read(
    dask_section: Callable[[Any], None],
) -> None:
    dask_section(dask_loads({"DASK_DASKJOBS__SPECULATION__INTERVAL": "1us"}))
    with pytest.raises(click.ClickException, match=r"daskjobs.speculation.interval: expected"):
        parse([])
    dask_section(dask_loads({"DASK_DASKJOBS__SPECULATION__INTERVAL": "10ms"}))
    parse(["--daskjobs-policy", "node-aware"])


def start_scheduler(**kwargs: Any) -> Any:
    """Start and close an in-process scheduler; its daskjobs plugin's settings, or raise."""
    from distributed import Scheduler

    async def run() -> Any:
        async with Scheduler(dashboard_address=":0", port=0, **kwargs) as s:
            plugin = s.plugins.get("daskjobs")
            return None if plugin is None else plugin.settings

    return asyncio.run(run())


PRELOADS = ["daskjobs.preload", str(ROOT / "plugins" / "daskjobs_scheduler.py")]


@pytest.mark.parametrize("preload", PRELOADS)
def test_a_scheduler_with_the_preload_runs_the_plugin(
    preload: str, dask_section: Callable[[Any], None]
) -> None:
    dask_section(dask_loads({"DASK_DASKJOBS__DEFAULT_ESTIMATE": "10s"}))
    s = start_scheduler(preload=preload, preload_argv=["--daskjobs-policy", "lpt"])
    assert s is not None and s.policy == "lpt" and s.default_estimate == 10.0


@pytest.mark.parametrize("preload", PRELOADS)
@pytest.mark.parametrize(
    ("env", "argv", "match"),
    [
        ({"DASK_DASKJOBS__POLICY": "nope"}, [], r"daskjobs.policy: unknown policy 'nope'"),
        ({"DASK_DASKJOBS__TEAMS__TARGETS__A": "1e999"}, [], r"daskjobs.teams.targets.a"),
        (
            {},
            ["--daskjobs-policy", "nope"],
            r"^daskjobs preload options --daskjobs-policy nope: Invalid value for '--daskjobs-pol",
        ),
    ],
)
def test_a_scheduler_refuses_to_start_on_a_bad_config(
    preload: str,
    env: dict[str, str],
    argv: list[str],
    match: str,
    dask_section: Callable[[Any], None],
) -> None:
    dask_section(dask_loads(env))
    with pytest.raises(RuntimeError, match="Scheduler failed to start") as err:
        start_scheduler(preload=preload, preload_argv=argv)
    cause = err.value.__cause__
    assert isinstance(cause, ValueError), cause
    assert re.search(match, str(cause)), str(cause)


@pytest.fixture(autouse=True)
def _no_leaked_config() -> Iterator[None]:
    before = json.dumps(dask.config.get("daskjobs", default=None), sort_keys=True, default=repr)
    yield
    after = json.dumps(dask.config.get("daskjobs", default=None), sort_keys=True, default=repr)
    assert before == after
