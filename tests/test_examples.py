"""Examples are part of the documentation: each one runs here."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


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
