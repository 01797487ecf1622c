"""The simulator's throughput shortcuts decide exactly what the plain paths decide.

* A policy may answer ``speed`` from ``started`` and promise through ``urgent_from``
  that ``urgent`` is False on nodes believed faster (daskjobs/policies/base.py); the
  simulator then skips those calls. The same policy answering the old way (``started``
  returns None, no promise) must give the same simulation, attempt for attempt.
* Work stealing notes a deque's length only when it grows; the victim it finds must
  still be the fullest deque, lowest core on ties, after any mix of pushes, own pops
  and steals (checked against a scan of every deque).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskjobs import workloads
from daskjobs.policies import NodeAware, Policy, Speculation, WorkStealing
from daskjobs.sim import Cluster, Task, simulate


class _Counted(NodeAware):
    """NodeAware counting the questions the simulator asks it; with ``eager``, it also
    asks for a copy of every attempt of a task whose estimate is an odd number of
    seconds, started on a node it believes slow (``urgent`` stays False below
    ``urgent_from``, as promised), so that urgent starts happen."""

    def __init__(self, eager: bool = False) -> None:
        super().__init__()
        self.eager = eager
        self.asked = {"speed": 0, "urgent": 0, "yes": 0}

    def speed(self, node: int) -> float:
        self.asked["speed"] += 1
        return super().speed(node)

    def urgent(self, attempt: Any, now: float) -> bool:
        self.asked["urgent"] += 1
        if self.eager and NodeAware.speed(self, attempt.node) >= self.slow_threshold:
            yes = int(attempt.task.estimate) % 2 == 1
        else:
            yes = super().urgent(attempt, now)
        self.asked["yes"] += yes
        return yes


class _OldPath(_Counted):
    """The same policy answering as a policy without the new hooks does."""

    def started(self, attempt: Any, now: float) -> None:  # type: ignore[override]
        super().started(attempt, now)

    @property
    def urgent_from(self) -> float:
        return -math.inf


def _attempts(s: Any) -> list[tuple[Any, ...]]:
    return [
        (a.task.tid, a.node, a.cores, a.start.hex(), a.end.hex(), a.outcome, a.backup)
        for a in s.attempts
    ]


def _mixed() -> list[Task]:
    # two core sizes, uncopyable and default-estimate tasks, a late wave
    return [
        Task(
            f"t{i}",
            60.0 * (1 + (i * 7919) % 97) * (30.0 if i % 151 == 0 else 1.0),
            60.0 * (1 + (i * 7919) % 97) * (1 + ((i * 31) % 11 - 5) / 20),
            cores=1 + (i % 13 == 0),
            speculate=i % 17 != 0,
            estimated=i % 19 != 0,
            submit=0.0 if i < 900 else 3600.0,
        )
        for i in range(1200)
    ]


_CASES = {
    "chapter": lambda: (workloads.chapter(3, n=4000, n_long=16, nodes=24).tasks, None),
    "mixed": lambda: (_mixed(), Cluster(6, 8, slow={0: 4.0, 4: 2.0}, failure_rate=0.03)),
}
_SPECS = {
    "always": Speculation(ahead="always"),
    "horizon": Speculation(ahead="past-horizon"),
    "periodic": Speculation(ahead="past-horizon", interval=300.0),
    "none": None,
}


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("spec", list(_SPECS))
@pytest.mark.parametrize("case", list(_CASES))
def test_speed_from_started_and_urgent_from_change_nothing(
    case: str, spec: str, eager: bool
) -> None:
    tasks, cluster = _CASES[case]()
    if cluster is None:
        cluster = workloads.chapter(3, n=4000, n_long=16, nodes=24).cluster
    new, old = _Counted(eager), _OldPath(eager)
    a = simulate(tasks, cluster, new, spec=_SPECS[spec], seed=7)
    b = simulate(tasks, cluster, old, spec=_SPECS[spec], seed=7)
    assert _attempts(a) == _attempts(b)
    assert (a.events, a.backups_launched, a.backups_won) == (
        b.events,
        b.backups_launched,
        b.backups_won,
    )
    assert new.describe() == old.describe()
    if spec in ("always", "horizon"):  # judged at each start: the shortcut is taken
        assert a.backups_launched > 0
        assert new.asked["speed"] < old.asked["speed"]
        assert new.asked["urgent"] < old.asked["urgent"]
        if eager:  # and copies were asked for through the shortcut
            assert new.asked["yes"] == old.asked["yes"] > 0


def test_a_policy_without_the_hooks_promises_nothing() -> None:
    p = Policy()
    assert p.urgent_from == -math.inf
    assert p.started(None, 0.0) is None  # type: ignore[arg-type]
    assert NodeAware(slow_threshold=2.0).urgent_from == 2.0


@dataclass(frozen=True)
class _T:
    tid: int
    estimate: float = 1.0
    cores: int = 1
    team: str = "default"
    submit: float = 0.0
    deps: tuple[int, ...] = ()


@dataclass
class _Slot:
    index: int
    core: int
    free: int = 1
    cores: int = 1


def _fullest_by_scan(ws: WorkStealing) -> int | None:
    best = max(ws._deques.items(), key=lambda kv: (len(kv[1]), -kv[0]))
    return best[0] if best[1] else None


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(1, 3)),
        st.tuples(st.just("batch"), st.integers(0, 40)),
        st.tuples(st.just("pop"), st.integers(0, 7)),
    ),
    max_size=300,
)


@settings(max_examples=300, deadline=None)
@given(_OPS)
def test_stealing_victim_is_the_fullest_deque(ops: list[tuple[str, int]]) -> None:
    ws = WorkStealing()
    ws.add_node(0, 4)
    ws.add_node(1, 4)
    made = 0
    for op, k in ops:
        if op == "push":
            for _ in range(k):
                ws.push(_T(made))
                made += 1
        elif op == "batch":
            ws.push_many([_T(made + j) for j in range(k)])
            made += k
        else:
            node = k // 4
            expected = _fullest_by_scan(ws)
            assert ws._fullest() == expected
            own = ws._deques[k]
            head = own[0] if own else None
            tail = ws._deques[expected][-1] if expected is not None else None
            got = ws.pop(_Slot(node, k), 0.0)
            assert got is (head if head is not None else tail)
        assert len(ws) == sum(map(len, ws._deques.values()))


def test_stealing_finds_deques_that_shrank_below_their_notes() -> None:
    ws = WorkStealing()
    ws.add_node(0, 3)
    tasks = [_T(j) for j in range(9)]
    ws.push_many(tasks)  # dealt: core 0 gets 0, 3, 6; core 1 gets 1, 4, 7; core 2 2, 5, 8
    assert ws.pop(_Slot(0, 1), 0.0) is tasks[1]  # core 1: 4, 7 left (noted 3)
    for j in (2, 5, 8):
        assert ws.pop(_Slot(0, 2), 0.0) is tasks[j]  # core 2 empty (noted 3)
    assert ws.pop(_Slot(0, 2), 0.0) is tasks[6]  # steals core 0's tail: 0, 3 left
    # cores 0 and 1 both hold 2 now, both noted 3: the lower core is the victim
    assert ws.pop(_Slot(0, 2), 0.0) is tasks[3]
    assert ws.pop(_Slot(0, 2), 0.0) is tasks[7]  # core 1 is the longer now
    assert ws.steals == 3
