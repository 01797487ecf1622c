"""daskjobs.forecast (daskjobs/forecasting.py) and the snapshot it reads
(plugin/observe/snapshot.py)."""

from __future__ import annotations

import time
from typing import Any

import dask
import pytest
from conftest import plugin_cluster
from distributed import Client, Event

import daskjobs
from daskjobs.forecasting import (
    ANNOTATION_TEAM,
    MODEL_ERROR,
    SPEED_PRIOR,
    PolicyNotInstalled,
    build,
    forecast,
    forecast_snapshot,
)
from daskjobs.plugin import JobsPlugin
from daskjobs.policies import LPT, registry


def snapshot_by_hand() -> dict[str, Any]:
    """Two one-thread workers, w1 twice as slow; a (estimate 4) has run 1 s on w0, b
    (estimate 2) 1 s on w1; c waits; d (team t2) reads c. c and d are sweep x."""
    cols = {
        "key": ["a", "b", "c", "d"],
        "stage": ["s"] * 4,
        "team": ["default", "default", "default", "t2"],
        "estimate": [4.0, 2.0, 2.0, 2.0],
        "source": ["annotation"] * 4,
        "band": [None] * 4,
        "samples": [0] * 4,
        "cores": [1] * 4,
        "state": ["processing", "processing", "queued", "waiting"],
        "deps": [[], [], [], [2]],
        "worker": ["w0", "w1", None, None],
        "position": [0, 0, None, None],
        "elapsed": [1.0, 1.0, None, None],
        "sweep": [None, None, "x", "x"],
        "speculate": [True] * 4,
    }
    workers = [  # (measured on no task: slow-downs as given, no prior to take out)
        {"address": "w0", "name": "0", "threads": 1, "speed": 1.0, "samples": 0},
        {"address": "w1", "name": "1", "threads": 1, "speed": 2.0, "samples": 0},
    ]
    return {
        "version": 1,
        "time": 100.0,
        "policy": "fifo",
        "policy_settings": {},
        "teams": {},
        "speculation": None,
        "default_estimate": 1.0,
        "default_team": "default",
        "workers": workers,
        "tasks": cols,
    }


def test_build_and_forecast_a_snapshot_by_hand() -> None:
    b = build(snapshot_by_hand())
    # a: 4 - 1 = 3 s left on w0; b: 2 - 1/2 = 1.5 nominal s left, on w1 (2x: 3 s)
    assert [(t.tid, t.duration, t.deps) for t in b.tasks] == [
        ("a", 3.0, ()),
        ("b", 1.5, ()),
        ("c", 2.0, ()),
        ("d", 2.0, ("c",)),
    ]
    assert b.placement == {"a": (0, 0.0), "b": (1, 0.0)} and b.running == [0, 1]
    assert b.cluster.nodes == 2 and b.cluster.speeds == (1.0, 2.0)
    # both workers free at 3; c on w0 (lowest index first) until 5, then d until 7
    f = forecast_snapshot(snapshot_by_hand(), draws=0)
    assert (f.remaining.p10, f.remaining.p50, f.remaining.p90) == (7.0, 7.0, 7.0)
    assert f.end.p50 == 107.0 and f.tasks == 4 and f.running == 2 and f.draws == 0
    assert f.teams["default"].p50 == 5.0 and f.teams["t2"].p50 == 7.0
    assert f.sweeps == {"x": f.remaining}
    assert forecast_snapshot(snapshot_by_hand(), draws=0, keys=["c"]).remaining.p50 == 5.0
    # a waiting task's expected start, for the keys asked (a running one has started)
    starts = forecast_snapshot(snapshot_by_hand(), draws=0, keys=["a", "c", "d"]).starts
    assert {k: r.p50 for k, r in starts.items()} == {"c": 3.0, "d": 5.0}
    assert f.starts == {}  # none asked
    # one more worker: c starts at once on it (0-2), d 2-4; a ends at 3
    assert forecast_snapshot(snapshot_by_hand(), draws=0, workers=+1).remaining.p50 == 4.0
    # one fewer (w1 goes): b waits again and runs whole (2 s) after a; c, d after it
    assert forecast_snapshot(snapshot_by_hand(), draws=0, workers=-1).remaining.p50 == 9.0


def test_draws_are_seeded_and_ordered() -> None:
    snap = snapshot_by_hand()
    snap["tasks"]["band"] = [[2.0, 6.0], [1.0, 3.0], [1.0, 3.0], [1.0, 3.0]]
    snap["tasks"]["source"] = ["model"] * 4
    f = forecast_snapshot(snap, draws=20, seed=3)
    assert f.draws == 20 and f.remaining.p10 <= f.remaining.p50 <= f.remaining.p90
    assert f.remaining.p10 < f.remaining.p90  # the bands spread it
    assert forecast_snapshot(snap, draws=20, seed=3).remaining == f.remaining


def many_waiting(
    n: int,
    *,
    stages: int = 1,
    source: str = "model",
    band: tuple[float, float] | None = (0.5, 2.0),
    samples: int = 64,
    workers: tuple[int, ...] = (1000, 1000),
) -> dict[str, Any]:
    """``n`` waiting tasks of one second (estimate and band from ``source``, resting on
    ``samples`` observations) in ``stages`` stages, team t, on one-thread workers measured
    nominal on ``workers`` tasks each."""
    snap = snapshot_by_hand()
    snap["tasks"] = {
        "key": [f"k{i}" for i in range(n)],
        "stage": [f"s{i % stages}" for i in range(n)],
        "team": ["t"] * n,
        "estimate": [1.0] * n,
        "source": [source] * n,
        "band": [list(band) if band else None] * n,
        "samples": [samples] * n,
        "cores": [1] * n,
        "state": ["queued"] * n,
        "deps": [[] for _ in range(n)],
        "worker": [None] * n,
        "position": [None] * n,
        "elapsed": [None] * n,
        "sweep": [None] * n,
        "speculate": [True] * n,
    }
    snap["workers"] = [
        {"address": f"w{j}", "name": str(j), "threads": 1, "speed": 1.0, "samples": k}
        for j, k in enumerate(workers)
    ]
    return snap


def width(f: Any) -> float:
    """A forecast's p90 over its p10."""
    return float(f.remaining.p90 / f.remaining.p10)


def test_the_draws_median_is_the_central_case() -> None:
    """A task's own factor has mean 1: 400 tasks of 1 s whose 10-90% band is 0.5-2 s
    (sigma 0.54) sum to their estimates, not to 15% (exp(sigma^2 / 2)) more."""
    snap = many_waiting(400)
    central = forecast_snapshot(snap, draws=0).remaining.p50
    assert central == 200.0
    f = forecast_snapshot(snap, draws=30, seed=1)
    assert abs(f.remaining.p50 / central - 1) < 0.04, f.remaining


def test_a_learned_stage_keeps_a_band_however_many_samples() -> None:
    """A model fitted on 64 tasks of a 10% band is not sure of its stage to 1.2%
    (0.078 / sqrt(64)): its form may be off by a few percent, moving every task alike."""
    snap = many_waiting(400, band=(0.9, 1.1), samples=64)
    b = build(snap)
    assert b.stage_sigma.min() == MODEL_ERROR
    # the stage's factor (sigma 0.05) spreads the end by 13% from p10 to p90
    assert width(forecast_snapshot(snap, draws=40, seed=2)) > 1.08


def test_annotated_estimates_of_a_team_move_together() -> None:
    """Ten annotated stages of one team: their stage factors (sigma 0.1) would cancel to
    0.03 over the team; the team's own (sigma 0.1) keeps its end's 10-90% range over 20%."""
    snap = many_waiting(400, stages=10, source="annotation", band=None)
    b = build(snap)
    assert set(b.team_sigma.tolist()) == {ANNOTATION_TEAM}
    assert set(build(many_waiting(4)).team_sigma.tolist()) == {0.0}  # a model's: none
    f = forecast_snapshot(snap, draws=40, seed=3)
    assert f.teams["t"].p90 / f.teams["t"].p10 > 1.2, f.teams


def test_a_worker_measured_on_few_tasks_is_drawn_wider() -> None:
    """One worker's slow-down measured on 3 tasks spreads the end more than on 300: its
    log is drawn with sigma (a task's sigma) / sqrt(samples); on none, / sqrt(the
    learner's prior)."""
    from daskjobs.policies import NodeAware

    assert NodeAware().prior == SPEED_PRIOR
    few, many = many_waiting(200, workers=(3,)), many_waiting(200, workers=(300,))
    sigma = build(few).sigma[0]
    assert build(few).speed_sigma == {0: pytest.approx(sigma / 3**0.5)}
    none = many_waiting(200, workers=(0,))
    assert build(none).speed_sigma == {0: pytest.approx(sigma / SPEED_PRIOR**0.5)}
    f_few = forecast_snapshot(few, draws=40, seed=4)
    f_many = forecast_snapshot(many, draws=40, seed=4)
    assert width(f_few) > 1.4 > 1.25 > width(f_many), (f_few.remaining, f_many.remaining)


def test_a_workers_threads_are_drawn_one_speed() -> None:
    """Workers of unequal threads are simulated a node per thread: a draw gives the
    threads of one worker one slow-down."""
    import numpy as np

    from daskjobs.forecasting import draw

    snap = many_waiting(10, workers=(3, 3))
    snap["workers"][0]["threads"] = 2
    b = build(snap)
    assert b.cluster.nodes == 3 and b.worker_of == {0: 0, 1: 0, 2: 1}
    draw(b, np.random.default_rng(5))
    speeds = b.cluster.speeds
    assert speeds[0] == speeds[1] != 1.0 and speeds[2] not in (1.0, speeds[0])
    draw(b, None)  # the central case: the beliefs
    assert b.cluster.speeds == (1.0, 1.0, 1.0)


def test_a_policy_the_client_does_not_have() -> None:
    snap = snapshot_by_hand()
    snap["policy"] = "nowhere-installed"
    with pytest.raises(PolicyNotInstalled, match=r"'nowhere-installed'.*register"):
        forecast_snapshot(snap)
    # ... and a what-if under a policy it has answers
    assert forecast_snapshot(snap, policy="lpt", draws=0).remaining.p50 == 7.0


def test_empty_scheduler() -> None:
    with plugin_cluster(JobsPlugin()) as cl, Client(cl) as c:
        f = daskjobs.forecast(c)
        assert f.tasks == 0 and f.remaining.p90 == 0.0 and f.teams == {}
        assert f.end.p50 == f.time


def test_scheduler_without_the_plugin() -> None:
    with plugin_cluster() as cl, Client(cl) as c, pytest.raises(RuntimeError, match="not loaded"):
        forecast(c)


def test_policy_registered_on_the_scheduler_only() -> None:
    # one process: the scheduler made its policy, then this "client" forgets the name
    registry.register("forecast-test-lpt", LPT)
    try:
        with plugin_cluster(JobsPlugin(policy="forecast-test-lpt")) as cl, Client(cl) as c:
            registry.unregister("forecast-test-lpt")
            with pytest.raises(PolicyNotInstalled, match="forecast-test-lpt"):
                forecast(c)
    finally:
        if "forecast-test-lpt" in registry.names():
            registry.unregister("forecast-test-lpt")


def wait_for(ev: str, i: int) -> int:
    Event(ev).wait()
    return i


def test_a_worker_lost_mid_run() -> None:
    with plugin_cluster(JobsPlugin(), n_workers=2) as cl, Client(cl) as c:
        ev = Event("forecast-lost")
        with dask.annotate(estimate=1.0):
            futs = c.map(wait_for, ["forecast-lost"] * 6, range(6), pure=False)
        while sum(len(p) for p in c.processing().values()) < 2:
            time.sleep(0.01)
        before = daskjobs.forecast(c, draws=0)
        assert before.tasks == 6 and before.running == 2
        lost = sorted(cl.workers)[0]
        c.sync(cl.workers[lost].close)  # gone, with the task it ran
        while len(c.scheduler_info()["workers"]) > 1:
            time.sleep(0.01)
        after = daskjobs.forecast(c, draws=0)
        assert after.tasks == 6 and after.workers == 1 and after.running == 1
        # six tasks of one second on one thread, the running one just started
        assert 5.0 <= after.remaining.p50 <= 6.5 and after.remaining.p50 > before.remaining.p50
        ev.set()
        assert sorted(c.gather(futs)) == list(range(6))


def nap(i: int) -> int:
    time.sleep(0.2)
    return i


def test_forecast_of_a_known_workload() -> None:
    with plugin_cluster(JobsPlugin(), n_workers=2) as cl, Client(cl) as c:
        with dask.annotate(estimate=0.2):
            futs = c.map(nap, range(20), pure=False)
        while sum(f.done() for f in futs) < 4:
            time.sleep(0.01)
        t0 = time.time()
        f = daskjobs.forecast(c, draws=10)
        assert 10 <= f.tasks <= 16 and f.draws == 10
        assert f.remaining.p10 <= f.remaining.p50 <= f.remaining.p90
        c.gather(futs)
        actual = time.time() - t0
        assert actual / 2 <= f.remaining.p50 <= actual * 2, (f, actual)


def _nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_a_sweep_with_a_progress_bar_says_when_it_is_expected_to_end(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """With the plugin, ``sweep.run(progress=True)`` prints the forecast of its own run
    (its ``sweep`` annotation) before dask's bar; on plain dask it prints none."""
    import re

    sweep = daskjobs.Sweep("naps")
    sweep.stage(_nap, over=daskjobs.grid(seconds=[0.05, 0.1, 0.2, 0.3]), estimate=0.5)
    with plugin_cluster(JobsPlugin(policy="lpt"), threads_per_worker=2) as cl, Client(cl) as c:
        result = sweep.run(c, store=False, progress=True)
    assert result.ok
    out = capsys.readouterr().out
    m = re.search(r"^sweep run naps:[0-9a-f]{8}: expected to end in (\S+) s \(p10 (\S+) s, ", out,
                  flags=re.M)  # fmt: skip
    assert m, out
    # four tasks of 0.5 s estimated on two threads: about a second, as the estimates say
    assert 0.5 <= float(m.group(1)) <= 2.0 and float(m.group(2)) <= float(m.group(1))
    caplog.clear()
    with plugin_cluster(None, threads_per_worker=2) as cl, Client(cl) as c:
        assert sweep.run(c, store=False, progress=True).ok
    assert "expected to end" not in capsys.readouterr().out
    assert "daskjobs_snapshot" not in caplog.text  # plain dask was not asked for it


def test_a_running_tasks_time_is_aged_from_the_workers_last_heartbeat() -> None:
    """dask's ``WorkerState.executing`` is what the worker said at its last heartbeat: the
    snapshot adds the time since, so a task is never younger in it than in dask's own view,
    nor older than its time since submission."""
    from daskjobs.forecasting import snapshot

    ev_name = "aged-gate"
    with plugin_cluster(JobsPlugin(policy="lpt")) as cl, Client(cl) as c:
        gate = Event(ev_name)
        submitted = time.time()
        fut = c.submit(lambda: Event(ev_name).wait(60), key="long-one")

        def executing(dask_scheduler: Any) -> tuple[float, float]:
            ts = dask_scheduler.tasks.get("long-one")
            ws = ts.processing_on if ts is not None else None
            if ws is None or ts not in ws.executing:
                return -1.0, 0.0
            return float(ws.executing[ts]), float(ws.last_seen)

        deadline = time.time() + 30
        while (before := c.run_on_scheduler(executing))[0] <= 0 and time.time() < deadline:
            time.sleep(0.05)  # until a heartbeat has reported it executing
        ran, seen = before
        assert ran > 0
        time.sleep(0.2)  # (a heartbeat may come meanwhile: it ages the task as much)
        snap = snapshot(c)
        elapsed = snap["tasks"]["elapsed"][snap["tasks"]["key"].index("long-one")]
        assert ran + (snap["time"] - seen) - 0.05 <= elapsed, (ran, seen, snap["time"], elapsed)
        assert elapsed <= time.time() - submitted + 0.05, elapsed
        gate.set()
        fut.result()


def test_the_sigma_columns_are_the_per_row_rule() -> None:
    """:func:`_sigma_columns` (the build's column-wise path) gives :func:`_sigmas`' numbers,
    row by row: bands, no band, an empty band, every source, few and many samples."""
    from daskjobs.forecasting import _sigma_columns, _sigmas

    sources = ["model", "annotation", "default", "prior", "history", "model", "model", "odd"]
    bands = [[0.5, 2.0], None, None, None, [0.9, 1.3], [0.0, 1.0], [1.0, 1.0], [0.3, 0.31]]
    samples = [64, 0, 0, 0, 3, 5, 1, 0]
    sigma, stage_sigma = _sigma_columns(sources, bands, samples)
    rows = [_sigmas(s, b, k) for s, b, k in zip(sources, bands, samples, strict=True)]
    assert list(zip(sigma.tolist(), stage_sigma.tolist(), strict=True)) == rows


def test_a_large_snapshot_is_simulated_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond SIMULATED task simulations (tasks x draws) the forecast simulates once, with
    the estimates, and computes its range from that run; up to it, a simulation a draw."""
    import daskjobs.forecasting as fc

    calls: list[int] = []
    run = fc._run

    def counted(*args: Any) -> Any:
        calls.append(1)
        return run(*args)

    monkeypatch.setattr(fc, "_run", counted)
    monkeypatch.setattr(fc, "SIMULATED", 2000)
    snap = many_waiting(200, stages=4)
    small = forecast_snapshot(snap, draws=10, seed=1)  # 2,000 simulated: drawn
    assert (len(calls), small.draws, small.band) == (10, 10, "drawn")
    calls.clear()
    large = forecast_snapshot(snap, draws=11, seed=1)  # 2,200: computed
    assert (len(calls), large.draws, large.band) == (1, 1, "computed")
    assert any("simulated once" in note for note in large.notes)
    assert forecast_snapshot(snap, draws=0).band == "none"
    assert forecast_snapshot(snap, draws=3, band="computed").band == "computed"
    with pytest.raises(ValueError, match="band must be one of"):
        forecast_snapshot(snap, band="guessed")


def test_the_computed_band_holds_the_central_case_and_is_seeded() -> None:
    """The computed range holds the central simulation's end (overall, per team, per sweep,
    each asked start), p10 <= p50 <= p90; the same seed gives the same forecast."""
    snap = many_waiting(400, stages=10, source="annotation", band=None)
    snap["tasks"]["team"] = ["t" if i % 3 else "u" for i in range(400)]
    snap["tasks"]["sweep"] = ["x" if i % 2 else None for i in range(400)]
    asked = ["k5", "k200", "k399"]
    central = forecast_snapshot(snap, draws=0, keys=asked)
    f = forecast_snapshot(snap, draws=30, seed=7, band="computed", keys=asked)
    pairs = [(central.remaining, f.remaining)]
    pairs += [(central.teams[t], f.teams[t]) for t in ("t", "u")]
    pairs += [(central.sweeps["x"], f.sweeps["x"])]
    pairs += [(central.starts[k], f.starts[k]) for k in central.starts]
    assert len(pairs) == 4 + len(central.starts) and central.starts
    for c, r in pairs:
        assert r.p10 <= c.p50 <= r.p90 and r.p10 <= r.p50 <= r.p90, (c, r)
        assert r.p10 < r.p90 or c.p50 == 0.0
    again = forecast_snapshot(snap, draws=30, seed=7, band="computed", keys=asked)
    assert again.remaining == f.remaining and again.teams == f.teams
    assert forecast_snapshot(snap, draws=30, seed=8, band="computed").remaining != f.remaining


def test_the_computed_band_is_the_drawn_one_on_a_bag_of_tasks() -> None:
    """800 tasks in 8 annotated stages of one team on two workers measured on 3 tasks:
    the stage, team and speed factors spread the end; computed from one run, the range is
    within a few percent of the one 40 simulations draw."""
    snap = many_waiting(800, stages=8, source="annotation", band=None, workers=(3, 3))
    drawn = forecast_snapshot(snap, draws=40, seed=2, band="drawn").remaining
    comp = forecast_snapshot(snap, draws=40, seed=2, band="computed").remaining
    for p in ("p10", "p50", "p90"):
        assert abs(getattr(comp, p) / getattr(drawn, p) - 1) < 0.05, (drawn, comp)
    assert drawn.p90 / drawn.p10 > 1.2  # (a band worth comparing)


def test_a_workers_slow_down_is_simulated_as_measured() -> None:
    """The learner's belief is pulled towards 1 by its prior of SPEED_PRIOR samples (a
    worker 3x slow measured on 13 tasks is believed 2.28x); the simulated worker is as
    slow as measured (2.59x), the policy starts from the belief, and a worker measured on
    no task keeps its figure."""
    import math

    snap = many_waiting(100, workers=(13, 40, 0))
    snap["workers"][0]["speed"] = 2.28
    snap["workers"][1]["speed"] = 0.95
    b = build(snap)
    assert b.speeds == {0: 2.28, 1: 0.95, 2: 1.0}
    assert b.measured[0] == pytest.approx(math.exp(math.log(2.28) * 15 / 13))  # 2.59
    assert b.measured[1] == pytest.approx(math.exp(math.log(0.95) * 42 / 40))
    assert b.measured[2] == 1.0 and b.cluster.speeds == tuple(b.measured.values())
    # 100 tasks of 1 s on three one-thread workers, the first 2.59x slow: the central run
    # ends where the measured speeds say (the slow worker's last task ends about last)
    cap = sum(1 / s for s in b.measured.values())
    assert forecast_snapshot(snap, draws=0).remaining.p50 == pytest.approx(100 / cap, rel=0.05)
