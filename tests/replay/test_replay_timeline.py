"""A replay on the recorded placement follows the recorded timeline: each task starts when
it started (not sooner), and each attempt adds the fitted ``attempt_overhead``, not the
per-task ``overhead`` that spreads every stall of the run over the attempts. Exact numbers
on a hand-drawn trace."""

from __future__ import annotations

import json

import pytest
from tracerecs import finished_runs

from daskjobs.replay import load, replay

T0 = 1000.0
S = 0.005  # from the submission to the first start
D0, D1 = 0.02, 0.08  # compute of a task on w0, on w1
G = 0.002  # what each attempt adds to its compute on the scheduler's clock
X = 0.05  # a stall of the scheduler that held both workers once


def _runs() -> list[tuple[str, str, float, float]]:
    """(key, worker, started, finished): w0 runs 8 tasks of D0 back to back, w1 2 of D1;
    each starts as the one before it ends, but for the stall of X after w0's 4th task and
    after w1's 1st (both workers, once)."""
    runs = []
    t = T0 + S
    for k in range(8):
        if k == 4:
            t += X
        runs.append((f"a-{k}", "w0", t, t + D0 + G))
        t += D0 + G
    t = T0 + S
    for k in range(2):
        if k == 1:
            t += X
        runs.append((f"b-{k}", "w1", t, t + D1 + G))
        t += D1 + G
    return runs


def _trace(path):
    recs: list[dict] = [
        {"type": "header", "version": 1, "started": T0, "policy": "fifo", "settings": {}},
        {"type": "worker-added", "time": T0, "worker": "w0", "nthreads": 1},
        {"type": "worker-added", "time": T0, "worker": "w1", "nthreads": 1},
    ]
    runs = _runs()
    for key, _w, _s, _f in runs:
        recs.append({"type": "graph", "time": T0, "key": key, "deps": [], "submit": T0})
    recs += finished_runs(runs, lambda key, w: D0 if w == "w0" else D1)
    recs.sort(key=lambda r: r.get("time", T0))  # the scheduler's clock order
    last = max(f for *_, f in runs)
    recs.append({"type": "footer", "records": len(recs) - 1, "dropped": 0, "finished": last})
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_the_recorded_placement_replays_the_recorded_timeline(tmp_path):
    loaded = load(_trace(tmp_path / "stall.jsonl"))
    assert not loaded.notes and loaded.cluster.speeds == (1.0, 1.0)
    # the stall is capacity lost while work waited: spread per task, it is 2X / 10 more
    # than what an attempt adds to its compute, which is G
    assert loaded.fit.attempt_overhead == pytest.approx(G)
    assert loaded.fit.overhead > G + X / 10
    r = replay(loaded, placement="recorded")
    assert r.cluster.overhead == pytest.approx(G)
    replayed = {a.task.tid: (a.node, a.start, a.end) for a in r.schedule.attempts}
    for key, w, start, stop in _runs():
        node, s, e = replayed[key]
        assert loaded.workers[node].address == w
        assert (s, e) == (pytest.approx(start - T0), pytest.approx(stop - T0)), key
    assert r.makespan == pytest.approx(loaded.recorded.makespan)
