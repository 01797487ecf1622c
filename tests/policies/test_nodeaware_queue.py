"""The node-aware policy's queue against a plain list (hypothesis).

``_Ladder`` keeps batch pushes in a sorted run with a skip structure and single
pushes in a sorted list; whatever mix of operations, every query must answer
exactly what a scan of the live entries would answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskjobs.policies.nodeaware import _Ladder


@dataclass(frozen=True)
class T:
    tid: int
    estimate: float
    cores: int = 1


estimates = st.sampled_from([0.5, 1.0, 1.1, 2.0, 3.0, 3.0, 7.5, 10.0, 60.0, 61.0, 3600.0])
ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), estimates),
        st.tuples(st.just("batch"), st.lists(estimates, min_size=1, max_size=12)),
        st.tuples(st.just("sorted"), st.lists(estimates, min_size=1, max_size=12)),
        st.tuples(st.just("quantile"), st.sampled_from([0.0, 0.05, 0.5, 0.99])),
        st.tuples(st.just("below"), st.sampled_from([0.0, 1.0, 2.5, 3.0, 9.0, 59.0, 1e4])),
        st.tuples(st.just("head"), st.none()),
        st.tuples(st.just("low"), st.none()),
        st.tuples(st.just("fit"), st.sampled_from([0.0, 1.0, 2.5, 3.0, 9.0, 59.0, 1e4])),
        st.tuples(st.just("find"), st.integers(0, 100)),
    ),
    max_size=80,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(ops)
def test_queue_answers_like_a_scan(program: list[tuple[str, object]]) -> None:
    q = _Ladder()
    live: dict[int, tuple[float, T]] = {}  # seq -> (estimate, task)
    seq = 0
    middle = 0  # tasks taken from the middle of a run (count_below may still count them)
    for op, arg in program:
        if op == "push":
            assert isinstance(arg, float)
            t = T(seq, arg)
            q.push(arg, seq, t)
            live[seq] = (arg, t)
            seq += 1
        elif op == "batch":
            assert isinstance(arg, list)
            entries = []
            for est in arg:
                t = T(seq, est)
                entries.append((-est, seq, t))
                live[seq] = (est, t)
                seq += 1
            q.push_many(entries)
        elif op == "sorted":  # a batch sorted by numpy (the sweep's path)
            assert isinstance(arg, list)
            tasks = [T(seq + k, est) for k, est in enumerate(arg)]
            q.push_batch(tasks, list(arg), seq)
            for t in tasks:
                live[t.tid] = (t.estimate, t)
            seq += len(tasks)
        elif op == "below":
            assert isinstance(arg, float)
            exact = sum(1 for e, _ in live.values() if e < arg)
            assert exact <= q.count_below(arg) <= exact + middle
            continue
        else:
            if op == "head":
                got = q.head()
                want = min(live, key=lambda s: (-live[s][0], s)) if live else None
                if want is None:
                    assert got is None
                else:
                    assert got is not None and got[1][1] == want  # longest, then pushed first
            elif op == "quantile":
                assert isinstance(arg, float)
                got = q.quantile(arg)
                if got is not None:  # a live entry of the run
                    assert isinstance(got[0], int) and got[1][1] in live
            elif op == "find":  # a given task, wherever it is (NodeAware.discard)
                assert isinstance(arg, int)
                if not live:
                    continue
                want_t = live[sorted(live)[arg % len(live)]][1]
                got = q.find(want_t)
                assert got is not None and got[1][2] is want_t
            elif op == "low":
                got = q.low()
                if not live:
                    assert got is None
                else:
                    assert got is not None and -got[1][0] == min(e for e, _ in live.values())
            else:
                assert isinstance(arg, float)
                got = q.fit(arg)
                fits = [s for s in live if live[s][0] <= arg]
                if not fits or arg <= 0:
                    assert got is None
                else:  # the longest that fits, pushed first among equals
                    want = min(fits, key=lambda s: (-live[s][0], s))
                    assert got is not None and got[1][1] == want
            if got is not None:  # take what was found: the queue must drop exactly it
                middle += isinstance(got[0], int)
                task = q.take(*got)
                est, t = live.pop(got[1][1])
                assert task is t
                assert q.find(t) is None  # taken: not found again
        assert q.n == len(live)
    # drain: every live task comes out exactly once, longest first
    out = []
    while (got := q.head()) is not None:
        out.append(q.take(*got))
    assert sorted(t.tid for t in out) == sorted(live)
    assert [t.estimate for t in out] == sorted((e for e, _ in live.values()), reverse=True)


def test_discard_drops_a_queued_task_and_its_work() -> None:
    from daskjobs.policies import NodeAware

    @dataclass(frozen=True)
    class Node:
        index: int
        cores: int = 1
        free: int = 1

    p = NodeAware()
    p.add_node(0, 1)
    batch = [T(i, e) for i, e in enumerate([1.0, 2.0, 2.0, 2.0, 5.0])]
    p.push_many(batch)
    single = T(9, 2.0)
    p.push(single)
    assert p.horizon(0.0) == pytest.approx(14.0)
    p.discard(batch[2])  # the middle one of three equal estimates in the run
    p.discard(single)
    p.discard(batch[2])  # not queued any more: ignored
    p.discard(T(99, 2.0))  # never queued: ignored
    assert len(p) == 4 and p.horizon(0.0) == pytest.approx(10.0)
    out = [p.pop(Node(0), 0.0) for _ in range(5)]
    assert out[-1] is None and sorted(t.tid for t in out[:-1] if t is not None) == [0, 1, 3, 4]
