"""The simulator's throughput shortcuts decide exactly what the plain paths decide.

* Work stealing notes a deque's length only when it grows; the victim it finds must
  still be the fullest deque, lowest core on ties, after any mix of pushes, own pops
  and steals (checked against a scan of every deque).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from daskjobs.policies import WorkStealing


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
