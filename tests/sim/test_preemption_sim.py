"""Preemption in the job-level simulator (docs/explanation/preemption.md): victim choice on
hand-built cases, exact accounting of lost work on a tiny cluster, and invariants of
every policy on the synthetic workload."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from daskjobs.policies.preemption import (
    FitResume,
    NaivePreemption,
    TeFirst,
    make_preemption_policy,
)
from daskjobs.sim.preemption import Cluster, Job, Workload, metrics, simulate, synthetic


@dataclass
class N:
    index: int
    available: int
    gpus: int = 8


@dataclass
class R:
    job: Job
    node: int
    started: float
    lost: float
    preemptions: int = 0

    def lost_at(self, t: float) -> float:
        return self.lost


def be(jid: int, gpus: int) -> Job:
    return Job(jid, "be", 0.0, gpus, 10_000.0, 1800.0)


TE2 = Job(99, "te", 5000.0, 2, 300.0)


def test_fit_resume_prefers_the_least_work_lost_then_the_least_excess() -> None:
    nodes = [N(0, 0), N(1, 0)]
    running = [
        R(be(1, 2), 0, 0.0, lost=3000.0),  # far from its checkpoint
        R(be(2, 2), 0, 0.0, lost=200.0),  # just checkpointed
        R(be(3, 4), 1, 0.0, lost=100.0),  # least lost, but 2 GPUs more than needed
        R(be(4, 2), 1, 0.0, lost=100.0),  # as little lost, an exact fit
    ]
    node, victims = FitResume(min_runtime=0).victims(TE2, nodes, running, 5000.0)
    assert (node, [v.job.jid for v in victims]) == (1, [4])


def test_fit_resume_exempts_young_and_often_preempted_jobs() -> None:
    nodes = [N(0, 0)]
    young = R(be(1, 2), 0, started=4900.0, lost=0.0)  # ran 100 s < min_runtime
    tired = R(be(2, 2), 0, started=0.0, lost=0.0, preemptions=3)  # the cap
    policy = FitResume(min_runtime=600, max_preemptions=3)
    assert policy.victims(TE2, nodes, [young, tired], 5000.0) is None
    ok = R(be(3, 2), 0, started=0.0, lost=5000.0, preemptions=2)
    assert policy.victims(TE2, nodes, [young, tired, ok], 5000.0) == (0, [ok])


def test_fit_resume_needs_one_node_with_room() -> None:
    # 1 + 1 GPUs on two nodes do not make 2 on one
    nodes = [N(0, 0), N(1, 0)]
    running = [R(be(1, 1), 0, 0.0, 0.0), R(be(2, 1), 1, 0.0, 0.0)]
    assert FitResume(min_runtime=0).victims(TE2, nodes, running, 5000.0) is None
    # a node with one GPU free needs one more
    nodes = [N(0, 1)]
    running = [R(be(1, 1), 0, 0.0, 50.0), R(be(2, 4), 0, 0.0, 10.0)]
    assert FitResume(min_runtime=0).victims(TE2, nodes, running, 5000.0) == (0, [running[1]])


def test_naive_takes_the_youngest_whatever_they_lose() -> None:
    nodes = [N(0, 0), N(1, 0)]
    running = [
        R(be(1, 4), 0, started=100.0, lost=1.0),
        R(be(2, 1), 1, started=4000.0, lost=9000.0),
        R(be(3, 1), 1, started=4500.0, lost=9000.0),
    ]
    node, victims = NaivePreemption().victims(TE2, nodes, running, 5000.0)
    assert (node, sorted(v.job.jid for v in victims)) == (1, [2, 3])


def test_te_first_never_preempts_and_orders_te_first() -> None:
    assert TeFirst().victims(TE2, [N(0, 0)], [R(be(1, 8), 0, 0.0, 0.0)], 5000.0) is None
    jobs = [be(1, 1), Job(2, "te", 10.0, 1, 5.0), Job(3, "be", -0.0, 1, 5.0, 1.0)]
    assert [j.jid for j in sorted(jobs, key=TeFirst().order_key)] == [2, 1, 3]


def test_lost_work_and_resume_from_the_checkpoint_exactly() -> None:
    """One node of 2 GPUs: a best-effort job (2 GPUs, 10,000 s, a checkpoint every
    1,000 s) is preempted at 2,500 s by a TE job of 1 GPU: it keeps its GPUs for the
    grace period (30 s), loses the 530 s since its checkpoint at 2,000 s, waits for the
    TE job, then restores (60 s) and runs the remaining 8,000 s."""
    cl = Cluster(nodes=1, gpus_per_node=2, grace=30.0, restore=60.0)
    w = Workload(cl, (Job(0, "be", 0.0, 2, 10_000.0, 1000.0), Job(1, "te", 2500.0, 1, 100.0)))
    run = simulate(w, FitResume(min_runtime=0))
    assert run["first_start"] == {0: 0.0, 1: 2530.0}
    assert run["end"][1] == 2630.0
    assert run["end"][0] == pytest.approx(2630.0 + 60.0 + 8000.0)
    assert run["preemptions"] == {0: 1}
    assert run["gpu_seconds_lost"] == pytest.approx(2 * (530.0 + 60.0))
    (p,) = run["preempted"]
    assert p["ran"] == 2500.0 and p["node"] == 0
    # without preemption the TE job waits for the whole best-effort job
    fifo = simulate(w, make_preemption_policy("fifo"))
    assert fifo["first_start"][1] == 10_000.0 and fifo["gpu_seconds_lost"] == 0.0


@pytest.mark.parametrize("name", ["fifo", "te-first", "naive", "fit-resume"])
def test_every_policy_finishes_every_job(name: str) -> None:
    w = synthetic(3, hours=48)
    run = simulate(w, make_preemption_policy(name))
    assert set(run["end"]) == {j.jid for j in w.jobs}
    for j in w.jobs:
        assert run["end"][j.jid] - run["first_start"][j.jid] >= j.duration - 1e-6
        if not run["preemptions"].get(j.jid):  # never preempted: one uninterrupted run
            assert run["end"][j.jid] - run["first_start"][j.jid] == pytest.approx(j.duration)
    m = metrics(w, run)
    assert 0 < m["utilisation"] <= 1
    if name in ("fifo", "te-first"):
        assert run["preemptions"] == {} and run["gpu_seconds_lost"] == 0
    if name == "fit-resume":
        assert m["preemptions_max"] <= 3
        assert all(p["ran"] >= 600 for p in run["preempted"])  # the exempt time
    assert simulate(w, make_preemption_policy(name)) == run  # deterministic


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="unknown preemption policy 'lifo'; known: fifo"):
        make_preemption_policy("lifo")
    with pytest.raises(ValueError, match="job 7: class must be 'te' or 'be', got 'x'"):
        Job(7, "x", 0.0, 1, 1.0)
    with pytest.raises(ValueError, match="job 7: duration must be finite and >= 0, got nan"):
        Job(7, "be", 0.0, 1, float("nan"))
    with pytest.raises(ValueError, match="min_runtime: expected seconds >= 0"):
        FitResume(min_runtime=-1)
    w = Workload(Cluster(nodes=2, gpus_per_node=4), (Job(0, "be", 0.0, 8, 10.0),))
    with pytest.raises(ValueError, match="job 0 needs 8 GPUs; a node has 4: it can never run"):
        simulate(w, make_preemption_policy("fifo"))


@dataclass
class Ending:
    job: Job
    node: int
    end: float


def test_fit_resume_reserves_the_node_where_a_waiting_job_starts_first() -> None:
    big = be(1, 6)
    nodes = [N(0, available=2), N(1, available=0), N(2, available=1, gpus=4)]
    running = [Ending(be(2, 4), 0, 900.0), Ending(be(3, 8), 1, 300.0), Ending(be(4, 3), 2, 10.0)]
    # node 0 has room at 900 (2 free + 4), node 1 at 300 (8), node 2 never has 6 GPUs
    assert FitResume().reserve(big, nodes, running, 0.0) == 1
    assert FitResume(reservation=False).reserve(big, nodes, running, 0.0) is None
    assert TeFirst().reserve(big, nodes, running, 0.0) is None


def test_a_reservation_keeps_smaller_later_jobs_off_a_waiting_jobs_node() -> None:
    """One node of 4 GPUs: A (2 GPUs, 100 s) runs; B (4 GPUs) waits for it; C (2 GPUs,
    1000 s) arrives and would fit beside A. Without a reservation C takes the two free
    GPUs and B waits until C ends; with one, B starts when A ends, then C."""
    jobs = (
        Job(0, "be", 0.0, 2, 100.0, 1800.0),
        Job(1, "be", 1.0, 4, 50.0, 1800.0),
        Job(2, "be", 2.0, 2, 1000.0, 1800.0),
    )
    wl = Workload(Cluster(1, 4, grace=0.0, restore=0.0), jobs)
    held = simulate(wl, FitResume())["first_start"]
    assert (held[1], held[2]) == (100.0, 150.0)
    free = simulate(wl, FitResume(reservation=False))["first_start"]
    assert (free[2], free[1]) == (2.0, 1002.0)


@pytest.mark.slow
def test_the_fit_resume_policy_loses_less_than_naive_at_equal_te_benefit() -> None:
    """The issue's comparison on two seeds of the documented workload (the figures over
    five seeds are in docs/explanation/preemption.md)."""
    from daskjobs.sim.preemption import run_preemption

    report = run_preemption(seeds=(0, 1), policies=("fifo", "naive", "fit-resume"))
    rows: dict[str, Any] = {r["policy"]: r for r in report["rows"]}
    naive, fit = rows["naive"], rows["fit-resume"]
    assert fit["vs_fifo"]["te_slowdown_p95"] < -0.9
    assert abs(fit["te_slowdown_p95"] - naive["te_slowdown_p95"]) < 0.1  # equal TE benefit
    assert fit["gpu_seconds_lost_max"] < naive["gpu_seconds_lost_min"]
    assert fit["preemptions_max_max"] < naive["preemptions_max_min"]


def test_the_command_line(tmp_path: Any) -> None:
    import json

    from click.testing import CliRunner

    from daskjobs.cli import main

    run = CliRunner().invoke(
        main, ["simulate", "preemption", "--seeds", "0", "--hours", "24", "--json"]
    )
    assert run.exit_code == 0, run.output
    report = json.loads(run.stdout)
    assert [r["policy"] for r in report["rows"]] == ["fifo", "te-first", "naive", "fit-resume"]
    for row in report["rows"]:
        for key in (
            "te_slowdown_p50",
            "te_slowdown_p95",
            "be_slowdown_p50",
            "be_slowdown_p95",
            "preemptions_max",
            "gpu_seconds_lost",
        ):
            assert isinstance(row[key], float | int), key
        assert set(row["vs_fifo"]) >= {"te_slowdown_p95", "be_slowdown_p50", "be_slowdown_p95"}
    assert report["rows"][0]["vs_fifo"]["te_slowdown_p95"] == 0.0
    assert report["published"]["te_slowdown_p95"] == -0.966
    text = CliRunner().invoke(main, ["simulate", "preemption", "--seeds", "0", "--hours", "24"])
    assert text.exit_code == 0 and "published" in text.output and "fit-resume" in text.output
    bad = CliRunner().invoke(main, ["simulate", "preemption", "--seeds", "x"])
    assert bad.exit_code == 2 and "'x' is not a seed" in bad.output
    bad = CliRunner().invoke(main, ["simulate", "preemption", "--policy", "lifo"])
    assert bad.exit_code == 2 and "'lifo' is not one of" in bad.output
