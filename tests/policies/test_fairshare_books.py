"""Fair share's core-second books (``FairShare.booked``): exact on small hand-made runs,
through starts, ends, shared tasks, a reshare and a reconcile; and the same at epoch-sized
times as the live plugin's clock gives."""

from __future__ import annotations

import pytest

from daskjobs.policies import FairShare
from daskjobs.sim.model import Attempt, Task


def _attempt(tid: str, team: str, cores: int = 1, teams: tuple[str, ...] = ()) -> Attempt:
    return Attempt(0, Task(tid, 1.0, cores=cores, team=team, teams=teams), 0, (0,), 0.0, False)


@pytest.mark.parametrize("t0", [0.0, 1.7e9])
def test_booked_is_cores_times_seconds_held(t0: float) -> None:
    fs = FairShare({"a": 1.0, "b": 1.0})
    x, y = _attempt("x", "a", cores=2), _attempt("y", "a")
    fs.started(x, t0 + 0.0)
    fs.started(y, t0 + 1.0)
    assert fs.booked("a", t0 + 2.0) == pytest.approx(2 * 2.0 + 1 * 1.0)
    fs.ended(x, t0 + 3.0)
    # without now: up to the latest end the policy was told of
    assert fs.booked("a") == pytest.approx(2 * 3.0 + 1 * 2.0)
    assert fs.booked("a", t0 + 1.0) == pytest.approx(8.0)  # not before that end either
    fs.ended(y, t0 + 5.0)
    assert fs.booked("a") == pytest.approx(10.0)
    assert fs.booked("a", t0 + 100.0) == pytest.approx(10.0)  # nothing held: nothing added
    assert fs.running("a") == 0.0
    assert fs.booked("b", t0 + 100.0) == 0.0


@pytest.mark.parametrize("t0", [0.0, 1.7e9])
def test_shared_task_reshare_and_reconcile_keep_what_was_booked(t0: float) -> None:
    fs = FairShare({"a": 1.0, "b": 1.0, "c": 1.0})
    s = _attempt("s", "a", cores=2, teams=("a", "b"))
    fs.started(s, t0)  # 1 core each
    fs.reshare(s, ("a", "b", "c"), t0 + 3.0)  # 2/3 core each from now
    fs.ended(s, t0 + 6.0)
    assert fs.booked("a") == pytest.approx(3.0 + 2.0)
    assert fs.booked("b") == pytest.approx(3.0 + 2.0)
    assert fs.booked("c") == pytest.approx(2.0)
    assert fs.running("a") == 0.0  # the thirds' float dust is nothing held
    # a reconcile from the scheduler's state: what is booked so far stays
    x = _attempt("x", "c")
    fs.started(x, t0 + 6.0)
    fs.reconcile({"c": 3}, [], t0 + 8.0)
    assert fs.booked("c", t0 + 8.0) == pytest.approx(2.0 + 2.0)
    assert fs.booked("c", t0 + 9.0) == pytest.approx(4.0 + 3.0)
