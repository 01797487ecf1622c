"""``sweep.run`` on a cluster of real processes: outputs lost with a killed worker are
waited for and returned, and a sweep the cluster cannot import fails at once, naming the
module and the fix, instead of hanging or killing workers.

The order of events is fixed with gate files (see ``tests/helpers/realtasks_sweep.py``), not
with sleeps."""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import cloudpickle
import pytest
import realtasks_sweep
from realcluster import in_thread

from daskjobs import Sweep, grid
from daskjobs.sweep import ClusterImportError, run

#: Long enough for anything these tests do on a loaded 2-core machine; only a hang exceeds it.
HANG = 90.0


def poll(what: str, check: Callable[[], Any]) -> Any:
    """``check()`` until it returns something true; fail (not hang) if it never does."""
    deadline = time.monotonic() + HANG
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


def short_and_long(tmp_path: Path, name: str) -> tuple[Path, Sweep, Any, Any]:
    """Twelve quick outputs and one long one, steered through gate files in ``marks``."""
    marks = tmp_path / "marks"
    marks.mkdir()
    sweep = Sweep(name)
    shorts = sweep.stage(
        realtasks_sweep.short, over=grid(x=range(12)), params={"marks": str(marks)}
    )
    longs = sweep.stage(realtasks_sweep.long, params={"marks": str(marks)})
    return marks, sweep, shorts, longs


def test_outputs_lost_with_a_killed_worker_are_reloaded_and_returned(
    real_cluster: Any, tmp_path: Path
) -> None:
    marks, sweep, shorts, longs = short_and_long(tmp_path, "lost-outputs")
    graph = sweep.to_dask(store=tmp_path / "store")
    short_keys = shorts.keys
    (long_key,) = longs.keys
    x_of = {n.key: n.labels["x"] for n in shorts}

    rc = real_cluster(n_workers=3, nthreads=2)
    with rc.client() as c:
        thread, box = in_thread(lambda: run(graph, c, progress=False))

        # 1. Every short output is in memory and the long stage runs on some worker.
        def settled() -> Any:
            states = c.run_on_scheduler(realtasks_sweep.key_states, keys=short_keys)
            holder = c.run_on_scheduler(realtasks_sweep.processing_on, key=long_key)
            if holder and all(s == "memory" for s, _ in states.values()):
                return states, holder
            return None

        states, holder = poll("short outputs in memory while the long stage runs", settled)
        # 2. Kill a worker that holds finished outputs (not the one running the long stage).
        victim = sorted({w for _, ws in states.values() for w in ws} - {holder})[0]
        lost = sorted(x_of[k] for k, (_, ws) in states.items() if ws == [victim])
        assert lost
        rc.kill_worker(victim)
        # 3. Let the long stage finish while dask reruns the lost outputs' tasks (a rerun
        #    that computed would wait for the rerun gate; one that loads does not).
        (marks / "long-gate").touch()
        #    Once every lost output has been reloaded the run may return (and release its
        #    keys) before a look at the scheduler sees the long output in memory: either
        #    is the long stage done. A rerun that computed would hold the run back here.
        poll(
            "the long output in memory (or the run returned)",
            lambda: (
                not thread.is_alive()
                or c.run_on_scheduler(realtasks_sweep.key_states, keys=[long_key])[long_key][0]
                == "memory"
            ),
        )
        (marks / "rerun-gate").touch()
        thread.join(HANG)
        assert not thread.is_alive(), "sweep.run did not return"
        assert "error" not in box, repr(box.get("error"))
        result = box["result"]
        assert len(c.scheduler_info()["workers"]) == 2

    assert result.ok, result.failures
    values = {r["x"]: r["value"] for r in result.records if r["stage"] == "short"}
    assert values == {x: x * x for x in range(12)}
    assert [r["value"] for r in result.records if r["stage"] == "long"] == ["long done"]
    # The outputs lost with the victim were committed to the store before it died: dask's
    # rerun of each finds the entry (daskjobs.cache.claims) and loads it, so every short
    # stage ran exactly once, and a reloaded result counts neither as a hit nor a rerun.
    assert all(len(realtasks_sweep.runs_of(marks, x)) == 1 for x in range(12))
    assert result.computed == 13 and result.reruns == 0 and result.hits == 0
    assert not rc.alive(victim) and all(rc.alive(w) for w in ("w0", "w1", "w2") if w != victim)
    assert rc.problems() == []


@pytest.fixture
def client_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """A module that only this (the client) process can import."""
    name = f"client_only_{tmp_path.name.replace('-', '_')}"
    d = tmp_path / "client-only"
    d.mkdir()
    (d / f"{name}.py").write_text(
        "class Factor:\n"
        "    def __init__(self, value):\n"
        "        self.value = value\n"
        "    def __dask_tokenize__(self):\n"
        "        return ('Factor', self.value)\n"
        "\n"
        "def cube(x):\n"
        "    return x ** 3\n"
    )
    monkeypatch.syspath_prepend(str(d))
    module = importlib.import_module(name)
    yield module
    sys.modules.pop(name, None)
    if name in cloudpickle.list_registry_pickle_by_value():
        cloudpickle.unregister_pickle_by_value(module)


def test_a_stage_module_the_cluster_cannot_import_fails_at_once_and_names_the_fix(
    real_cluster: Any, client_module: ModuleType
) -> None:
    rc = real_cluster(n_workers=2, nthreads=1)
    sweep = Sweep("client-only")
    sweep.stage(client_module.cube, over=grid(x=range(4)))
    with rc.client() as c:
        thread, box = in_thread(lambda: sweep.run(c, store=False, progress=True))
        thread.join(HANG)
        assert not thread.is_alive(), "sweep.run hung"
        err = box.get("error")
        assert isinstance(err, ClusterImportError), repr(box)
        text = str(err)
        assert client_module.__name__ in text and "'cube'" in text
        assert "scheduler" in text and "w0" in text and "w1" in text
        assert f"cloudpickle.register_pickle_by_value({client_module.__name__})" in text
        assert "install" in text
        assert err.modules == [client_module.__name__]
        # Nothing reached the cluster: no worker died of a task it could not unpickle.
        assert len(c.scheduler_info()["workers"]) == 2

        # The fix the message names works.
        cloudpickle.register_pickle_by_value(client_module)
        result = sweep.run(c, store=False, progress=True)
        assert result.ok, result.failures
        assert result.values == [0, 1, 8, 27] and result.computed == 4
    assert rc.alive("w0") and rc.alive("w1")
    assert rc.problems() == []


def test_a_parameter_the_scheduler_cannot_unpickle_fails_at_once_naming_its_module(
    real_cluster: Any, client_module: ModuleType
) -> None:
    rc = real_cluster(n_workers=1, nthreads=1)
    sweep = Sweep("client-only-param")
    sweep.stage(
        realtasks_sweep.scale, over=grid(x=range(3)), params={"factor": client_module.Factor(2)}
    )
    with rc.client() as c:
        thread, box = in_thread(lambda: sweep.run(c, store=False, progress=True))
        thread.join(HANG)
        assert not thread.is_alive(), "sweep.run hung"
        err = box.get("error")
        assert isinstance(err, ClusterImportError), repr(box)
        assert err.modules == [client_module.__name__]
        assert "could not read" in str(err) and client_module.__name__ in str(err)

        cloudpickle.register_pickle_by_value(client_module)
        result = sweep.run(c, store=False, progress=True)
        assert result.ok, result.failures
        assert result.values == [0, 2, 4]
    assert rc.alive("w0")
    # The scheduler logged the graph it could not read; nothing else went wrong.
    unexpected = rc.problems(
        ignore=[
            "ModuleNotFoundError: No module named 'client_only_",
            r"Traceback \(most recent call last\)",
            "RuntimeError: Error during deserialization of the task graph",
        ]
    )
    assert unexpected == []


def test_a_scheduler_lost_mid_sweep_is_one_clear_error_and_the_next_run_loads_what_ran(
    real_cluster: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from daskjobs.sweep import SweepInterrupted

    marks, sweep, shorts, _ = short_and_long(tmp_path, "scheduler-lost")
    store = tmp_path / "store"
    rc = real_cluster(n_workers=2, nthreads=2)
    with rc.client() as c:
        thread, box = in_thread(lambda: sweep.run(c, store=store, progress=False))
        poll(
            "every short output stored while the long stage runs",
            lambda: (
                (marks / "long-started").exists()
                and all(
                    s == "memory"
                    for s, _ in c.run_on_scheduler(
                        realtasks_sweep.key_states, keys=shorts.keys
                    ).values()
                )
            ),
        )
        with caplog.at_level("ERROR", logger="daskjobs.sweep"):
            rc.restart_scheduler()  # the workers shut down with it: dask does not reconnect
            thread.join(HANG)
    assert not thread.is_alive(), "sweep.run did not return"
    err = box.get("error")
    assert isinstance(err, SweepInterrupted), repr(err)
    msg = str(err)
    assert "cancelled" in msg and "run the sweep again" in msg and str(store) in msg
    assert err.partial.computed >= 12  # what ran before the loss is counted, and stored
    assert not [r for r in caplog.records if "stage failed" in r.getMessage()]  # one error
    # a fresh cluster (new workers) loads every short output from the store
    for name in ("w0", "w1"):
        rc.kill(name)
        rc.start_worker(name)
    rc.wait_for_workers(2)
    (marks / "long-gate").touch()
    with rc.client() as c:
        again = sweep.run(c, store=store, progress=False)
    assert again.ok and again.hits == 12 and again.computed == 1
    assert [r["value"] for r in again.records if r["stage"] == "long"] == ["long done"]
