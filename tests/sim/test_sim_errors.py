"""Bad input fails early with an exception that names the problem."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from daskjobs.sim import (
    FIFO,
    LPT,
    Cluster,
    CriticalPath,
    CycleError,
    FairShare,
    Speculation,
    Task,
    lower_bound,
    make_policy,
    simulate,
    topological_order,
    utilisation,
)

# -- the task graph ---------------------------------------------------------------------------


def test_cycle_raises_cycle_error_showing_the_cycle():
    tasks = [
        Task("ok", 1.0),
        Task("a", 1.0, deps=("c", "ok")),
        Task("b", 1.0, deps=("a",)),
        Task("c", 1.0, deps=("b",)),
    ]
    with pytest.raises(CycleError, match=r"dependency cycle: 'a' -> 'c' -> 'b' -> 'a'"):
        simulate(tasks, Cluster(1, 1), FIFO())


CYCLE_SCRIPT = """
from daskjobs.sim import Cluster, CycleError, FIFO, Task, simulate
tasks = [Task("ok", 1), Task("a", 1, deps=("c", "ok")), Task("b", 1, deps=("a",)),
         Task("c", 1, deps=("b",))]
try:
    simulate(tasks, Cluster(1, 1), FIFO())
except CycleError as e:
    print(e)
"""


def test_cycle_message_does_not_depend_on_hash_seed():
    out = set()
    for hash_seed in ("0", "1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        run = subprocess.run(
            [sys.executable, "-c", CYCLE_SCRIPT], env=env, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        out.add(run.stdout.strip())
    assert out == {"dependency cycle: 'a' -> 'c' -> 'b' -> 'a'"}


def test_two_task_cycle_is_named():
    tasks = [Task("x", 1.0, deps=("y",)), Task("y", 1.0, deps=("x",))]
    with pytest.raises(CycleError, match=r"'x' -> 'y' -> 'x'"):
        topological_order(tasks)


def test_cycle_error_is_a_value_error():
    assert issubclass(CycleError, ValueError)


def test_cycle_downstream_of_healthy_tasks_still_found():
    tasks = [Task("root", 1.0), Task("p", 1.0, deps=("root", "q")), Task("q", 1.0, deps=("p",))]
    with pytest.raises(CycleError, match=r"'p' -> 'q' -> 'p'|'q' -> 'p' -> 'q'"):
        simulate(tasks, Cluster(1, 1), CriticalPath())


def test_self_dependency_rejected_at_construction():
    with pytest.raises(ValueError, match=r"task 'a' depends on itself"):
        Task("a", 1.0, deps=("a",))


def test_unknown_dependency_is_named():
    tasks = [Task("a", 1.0), Task("b", 1.0, deps=("a", "ghost"))]
    with pytest.raises(ValueError, match=r"task 'b' depends on unknown task 'ghost'"):
        simulate(tasks, Cluster(1, 1), FIFO())


def test_lower_bound_also_rejects_unknown_dependency():
    with pytest.raises(ValueError, match=r"unknown task 'ghost'"):
        lower_bound([Task("b", 1.0, deps=("ghost",))], 4)


def test_duplicate_task_ids_rejected():
    with pytest.raises(ValueError, match=r"duplicate task id 'a'"):
        simulate([Task("a", 1.0), Task("b", 1.0), Task("a", 2.0)], Cluster(1, 1), FIFO())


@pytest.mark.parametrize("bad", [("a", 1.0), {"tid": "a", "duration": 1.0}, "a", 3.0])
def test_non_task_input_rejected(bad):
    with pytest.raises(TypeError, match=r"expected daskjobs.sim.Task objects, got"):
        simulate([Task("ok", 1.0), bad], Cluster(1, 1), FIFO())


# -- task fields ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [-1.0, -1e-9, math.nan, math.inf, -math.inf, "5", None])
def test_bad_duration_names_the_field_and_task(value):
    with pytest.raises(ValueError, match=r"task 'a': duration must be a finite number >= 0"):
        Task("a", value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [-2.0, math.nan, math.inf, "5"])
def test_bad_estimate_names_the_field_and_task(value):
    with pytest.raises(ValueError, match=r"task 'a': estimate must be a finite number >= 0"):
        Task("a", 1.0, estimate=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_bad_submit_time_named(value):
    with pytest.raises(ValueError, match=r"task 'a': submit must be a finite number >= 0"):
        Task("a", 1.0, submit=value)


@pytest.mark.parametrize("cores", [0, -1, 1.5, "2"])
def test_bad_core_request_named(cores):
    with pytest.raises(ValueError, match=r"task 'a': cores must be an integer >= 1"):
        Task("a", 1.0, cores=cores)  # type: ignore[arg-type]


def test_task_needing_more_cores_than_any_node_has():
    tasks = [Task("small", 1.0, cores=4), Task("big", 1.0, cores=5)]
    with pytest.raises(ValueError, match=r"task 'big' needs 5 cores but a node has only 4"):
        simulate(tasks, Cluster(8, 4), FIFO())


# -- the cluster ------------------------------------------------------------------------------


@pytest.mark.parametrize("nodes", [0, -1, 1.5, "2"])
def test_bad_node_count(nodes):
    with pytest.raises(ValueError, match=r"nodes must be an integer >= 1"):
        Cluster(nodes, 4)  # type: ignore[arg-type]


@pytest.mark.parametrize("cpn", [0, -3, 2.0])
def test_bad_cores_per_node(cpn):
    with pytest.raises(ValueError, match=r"cores_per_node must be an integer >= 1"):
        Cluster(2, cpn)  # type: ignore[arg-type]


@pytest.mark.parametrize("rate", [1.0, -0.1, 2.0, math.nan])
def test_bad_failure_rate(rate):
    with pytest.raises(ValueError, match=r"failure_rate must be in \[0, 1\)"):
        Cluster(2, 2, failure_rate=rate)


@pytest.mark.parametrize("node", [2, -1, "0"])
def test_slow_node_must_be_a_node_index(node):
    with pytest.raises(ValueError, match=r"slow node .* is not a node index in \[0, 2\)"):
        Cluster(2, 2, slow={node: 4.0})


@pytest.mark.parametrize("factor", [0, -4.0, math.nan, math.inf])
def test_slow_down_factor_must_be_positive_and_finite(factor):
    with pytest.raises(ValueError, match=r"slow-down factor of node 1 must be > 0"):
        Cluster(2, 2, slow={1: factor})


def test_simulate_rejects_non_cluster():
    with pytest.raises(TypeError, match=r"cluster must be a daskjobs.sim.Cluster, got tuple"):
        simulate([Task("a", 1.0)], (1, 1), FIFO())  # type: ignore[arg-type]


# -- policies and speculation -----------------------------------------------------------------


def test_simulate_rejects_policy_name_string():
    with pytest.raises(TypeError, match=r"policy must be a daskjobs policy object .* got str"):
        simulate([Task("a", 1.0)], Cluster(1, 1), "lpt")  # type: ignore[arg-type]


def test_simulate_rejects_policy_class_instead_of_instance():
    with pytest.raises(TypeError, match=r"policy must be a daskjobs policy object"):
        simulate([Task("a", 1.0)], Cluster(1, 1), LPT)  # type: ignore[arg-type]


def test_simulate_rejects_bad_spec():
    with pytest.raises(TypeError, match=r"spec must be a Speculation or None, got float"):
        simulate([Task("a", 1.0)], Cluster(1, 1), FIFO(), spec=2.5)  # type: ignore[arg-type]


def test_unknown_policy_name_lists_the_choices():
    with pytest.raises(ValueError, match=r"unknown policy 'nope'; choose one of: critical-path"):
        make_policy("nope")


def test_fair_share_unknown_team_is_named_before_anything_runs():
    tasks = [Task("a1", 1.0, team="a"), Task("x1", 1.0, team="x")]
    policy = FairShare({"a": 1.0, "b": 1.0})
    with pytest.raises(
        ValueError,
        match=r"task 'x1' belongs to team 'x', which has no fair-share target "
        r"\(known teams: 'a', 'b'\)",
    ):
        simulate(tasks, Cluster(1, 1), policy)


def test_fair_share_not_strict_admits_unknown_team():
    tasks = [Task("a1", 1.0, team="a"), Task("x1", 1.0, team="x")]
    policy = FairShare({"a": 1.0}, strict=False, default_share=2.0)
    s = simulate(tasks, Cluster(1, 2), policy)
    assert s.makespan == 1.0
    assert policy.share("x") == pytest.approx(2 / 3)


def test_fair_share_needs_targets():
    with pytest.raises(ValueError, match=r"FairShare needs at least one team in targets"):
        FairShare({})


@pytest.mark.parametrize("share", [0, -1.0, math.nan, math.inf])
def test_fair_share_target_must_be_positive(share):
    with pytest.raises(ValueError, match=r"fair-share target of team 'a' must be > 0"):
        FairShare({"a": share})


def test_fair_share_unknown_inner_order():
    with pytest.raises(ValueError, match=r"unknown order within teams 'random'"):
        FairShare({"a": 1}, within="random")


@pytest.mark.parametrize("half_life", [0, -5.0, math.inf, math.nan])
def test_fair_share_bad_half_life(half_life):
    with pytest.raises(ValueError, match=r"half_life must be a positive number of seconds"):
        FairShare({"a": 1}, half_life=half_life)


def test_fair_share_quota_for_unknown_team():
    with pytest.raises(ValueError, match=r"quota for team 'b', which has no fair-share target"):
        FairShare({"a": 1}, quotas={"b": 4})


@pytest.mark.parametrize("quota", [0, -1, 2.5])
def test_fair_share_bad_quota(quota):
    with pytest.raises(ValueError, match=r"quota of team 'a' must be an integer >= 1"):
        FairShare({"a": 1}, quotas={"a": quota})


@pytest.mark.parametrize("late", [1.0, 0.5, -2.0, math.nan, math.inf])
def test_speculation_bad_late_factor(late):
    with pytest.raises(ValueError, match=r"late_factor must be a finite number > 1"):
        Speculation(late_factor=late)


@pytest.mark.parametrize("runtime", [-1.0, math.nan, math.inf])
def test_speculation_bad_min_runtime(runtime):
    with pytest.raises(ValueError, match=r"min_runtime must be >= 0 seconds"):
        Speculation(min_runtime=runtime)


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5, math.nan])
def test_speculation_bad_max_fraction(fraction):
    with pytest.raises(ValueError, match=r"max_fraction must be in \(0, 1\]"):
        Speculation(max_fraction=fraction)


# -- measurements -----------------------------------------------------------------------------


@pytest.mark.parametrize("cores", [0, -4])
def test_lower_bound_needs_positive_cores(cores):
    with pytest.raises(ValueError, match=r"total_cores must be positive"):
        lower_bound([Task("a", 1.0)], cores)


@pytest.mark.parametrize("step", [0, -1.0, math.nan, math.inf])
def test_utilisation_needs_positive_step(step):
    s = simulate([Task("a", 1.0)], Cluster(1, 1), FIFO())
    with pytest.raises(ValueError, match=r"step must be a positive number of seconds"):
        utilisation(s, step=step)


# -- booleans and strings are not numbers --------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Task("a", True), r"task 'a': duration must be a finite number"),
        (lambda: Task("a", 1.0, estimate=False), r"task 'a': estimate must be a finite number"),
        (lambda: Task("a", 1.0, cores=True), r"task 'a': cores must be an integer >= 1"),
        (lambda: Cluster(True, 2), r"nodes must be an integer >= 1"),
        (lambda: Cluster(2, True), r"cores_per_node must be an integer >= 1"),
        (lambda: Cluster(2, 2, failure_rate="0.1"), r"failure_rate must be in \[0, 1\)"),
        (lambda: Cluster(2, 2, slow={0: True}), r"slow-down factor of node 0 must be > 0"),
    ],
)
def test_booleans_and_strings_are_rejected_as_numbers(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("field", ["late_factor", "min_runtime", "max_fraction"])
def test_speculation_rejects_non_numbers_naming_the_field(field):
    with pytest.raises(TypeError, match=rf"{field} must be a number, got str"):
        Speculation(**{field: "2"})
