"""examples/sweep.ipynb runs top to bottom on a kernel of this environment, as in Jupyter.

nbclient executes a copy of the notebook in a temporary working directory (the notebook writes
only into a directory of its own): a sweep on a LocalCluster with the plugin, the plugin's status
and ``explain``, a recorded run replayed under other policies, and two figures. Any cell that
raises fails the test with the cell's traceback; the figures must come out as images.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from repo import ROOT

NOTEBOOK = ROOT / "examples" / "sweep.ipynb"


@pytest.mark.slow
def test_the_example_notebook_runs(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat", reason="the test extra: pip install -e '.[test]'")
    nbclient = pytest.importorskip("nbclient", reason="the test extra: pip install -e '.[test]'")
    pytest.importorskip("matplotlib", reason="the notebook draws figures: the plot extra")

    nb = nbformat.read(NOTEBOOK, as_version=4)
    # the kernel's environment: this one without DASK_/DASKJOBS_ settings (the defaults only)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DASK_", "DASKJOBS_"))}
    env["MPLBACKEND"] = "Agg"
    start = time.perf_counter()
    client = nbclient.NotebookClient(
        nb,
        timeout=120,  # per cell
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    try:
        client.execute(env=env)
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail(f"{NOTEBOOK.name}: a cell failed:\n{e}")
    seconds = time.perf_counter() - start

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "results, 0 failed stages" in text
    assert "recorded makespan" in text and "what-if:" in text
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2, "the what-if bars and the busy-slots figure"
    assert list(tmp_path.iterdir()) == [], "the notebook writes only into its own directory"
    assert seconds < 90, f"the notebook took {seconds:.0f} s; keep it near half a minute"
