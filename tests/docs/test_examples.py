"""Examples are part of the documentation: each one runs here."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from repo import ROOT

EXAMPLES = ROOT / "examples"


def test_simulate_policies_example_runs_and_ranks_policies() -> None:
    mod = runpy.run_path(str(EXAMPLES / "simulate_policies.py"))
    rows = mod["main"](seed=0)
    assert len(rows) == 8
    by = {(r["policy"], r["backups"]): r for r in rows}
    # the speed-aware policy with backups beats FIFO and stays near the bound
    assert by["node-aware", True]["makespan_h"] < by["fifo", False]["makespan_h"]
    assert by["node-aware", True]["vs_speed_bound"] < 1.15
    assert all(r["vs_speed_bound"] >= 1.0 for r in rows)


def test_simulate_policies_example_as_a_script() -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "simulate_policies.py"), "--seed", "1"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "node-aware" in out.stdout and "speed-weighted bound" in out.stdout


@pytest.mark.slow
def test_job_examples_run(tmp_path: Path) -> None:
    """The three job shapes of docs/explanation/jobs.md, each as its example runs them."""
    store = str(tmp_path / "store")
    train = runpy.run_path(str(EXAMPLES / "jobs_training.py"))["main"](store=store)
    assert train["step"] == 300 and 0 < train["resumed_from"] < 300  # resumed, not restarted
    assert train["loss"] < 0.05
    again = runpy.run_path(str(EXAMPLES / "jobs_training.py"))["main"](store=store)
    assert again == train  # the finished job, from the ledger
    outputs = runpy.run_path(str(EXAMPLES / "jobs_inference.py"))["main"](store=store)
    assert [o["partition"] for o in outputs] == list(range(8))
    assert all(o["mse"] < 0.05 for o in outputs)
    evaluation = runpy.run_path(str(EXAMPLES / "jobs_evaluation.py"))["main"](store=store)
    assert evaluation["rounds"] == 20 and evaluation["mse"] < 0.05
    from daskjobs.jobs import Ledger

    led = Ledger(f"sqlite:///{store}/ledger.sqlite")
    states = {j.spec.name: j.state for j in led.jobs()}
    assert states == {
        "train-linear": "succeeded",
        "score-batch": "succeeded",
        "evaluate": "succeeded",
        "score-small": "succeeded",
        "evaluate-long": "cancelled",
    }
    led.close()
