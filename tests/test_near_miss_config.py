"""Near-miss configuration is named, with what was probably meant: a misspelt ``daskjobs``
section (which dask would keep and daskjobs never read), a misspelt policy, key or
choice. On a real scheduler the misspelt section stops it like any bad setting."""

from __future__ import annotations

from pathlib import Path

import dask
import pytest
from realconfig import refused

from daskjobs.config import jobs_settings, settings


@pytest.mark.parametrize(
    ("policy", "meant"), [("fairshare", "fair-share"), ("Fair_Share", "fair-share"), ("lpf", "lpt")]
)
def test_a_near_miss_policy_says_what_was_meant(policy: str, meant: str) -> None:
    with pytest.raises(ValueError) as err:
        settings(policy=policy)
    assert str(err.value) == (
        f"daskjobs.policy: unknown policy {policy!r}; expected one of fifo, lpt, critical-path, "
        f"fair-share, node-aware; did you mean {meant}?"
    )


def test_a_policy_far_from_any_gets_no_guess() -> None:
    with pytest.raises(ValueError) as err:
        settings(policy="deepest")
    assert "did you mean" not in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"polcy": "lpt"}, "unknown key(s) in daskjobs: polcy (known: "),
        ({"speculation": {"late_factr": 2}}, "unknown key(s) in daskjobs.speculation: late_factr"),
        ({"teams": {"targts": {"a": 1}}}, "unknown key(s) in daskjobs.teams: targts"),
    ],
)
def test_a_near_miss_key_says_what_was_meant(overrides: dict[str, object], says: str) -> None:
    meant = {"polcy": "policy", "late_factr": "late-factor", "targts": "targets"}
    (typo,) = [k for k in meant if k in repr(overrides)]
    with pytest.raises(ValueError) as err:
        settings(**overrides)
    assert str(err.value).startswith(says)
    assert str(err.value).endswith(f"; did you mean {meant[typo]}?")


def test_a_near_miss_choice_says_what_was_meant() -> None:
    with pytest.raises(ValueError, match=r"daskjobs.teams.within: .*; did you mean fifo\?$"):
        settings(teams={"within": "fifi"})


@pytest.mark.parametrize("section", ["daskjob", "dask-jobs", "daskjobs_", "dask_jobs", "DaskJobs"])
def test_a_misspelt_section_is_named(section: str) -> None:
    with dask.config.set({section: {"policy": "lpt"}}):
        for read in (settings, jobs_settings):
            with pytest.raises(ValueError) as err:
                read()
            assert str(err.value) == (
                f"dask config section {section!r} is not read by daskjobs: did you mean "
                "daskjobs? (its settings are ignored until they are under daskjobs:)"
            )


def test_a_single_underscore_environment_variable_is_named() -> None:
    """``DASK_DASKJOBS_POLICY=lpt`` (one underscore) makes dask's top-level key
    ``daskjobs_policy``: the setting meant is ``daskjobs.policy``."""
    with dask.config.set({"daskjobs_policy": "lpt"}), pytest.raises(ValueError) as err:
        settings()
    assert str(err.value) == (
        "dask config key 'daskjobs_policy' is not read by daskjobs: did you mean "
        "daskjobs.policy? (in the environment: DASK_DASKJOBS__POLICY, two underscores)"
    )


def test_sections_of_other_names_are_left_alone() -> None:
    with dask.config.set({"jobqueue": {"x": 1}, "dask": {"y": 1}, "jobs": {"z": 1}}):
        assert settings().policy == dask.config.get("daskjobs.policy")


@pytest.mark.realcluster
def test_a_real_scheduler_with_a_misspelt_section_does_not_start(tmp_path: Path) -> None:
    code, out = refused(tmp_path, preload="daskjobs.preload", env={"DASK_DASKJOB__POLICY": "lpt"})
    assert code != 0
    assert "dask config section 'daskjob' is not read by daskjobs: did you mean daskjobs?" in out
