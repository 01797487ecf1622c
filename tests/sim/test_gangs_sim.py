"""The gang simulator (daskjobs.sim.gangs): exact small scenarios, all-or-nothing starts,
feasibility, reservation against starvation, refusal of impossible demands, fragmentation,
metrics."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import pytest

from daskjobs.policies.resources import (
    Decision,
    GangPolicy,
    Inventory,
    Placement,
    Request,
    RequestError,
    fragmentation,
)
from daskjobs.sim.gangs import (
    Demand,
    GangRun,
    Node,
    gang_metrics,
    simulate_gangs,
    synthetic_gangs,
)


def node(i: int, gpus: int = 2, acc: str = "A100", host: str | None = None) -> Node:
    mem = {"A100": 80e9, "V100": 32e9}.get(acc, 16e9)
    inv = Inventory(resources={"GPU": float(gpus)}, accelerator=acc, gpus=gpus, gpu_memory=mem)
    return Node(i, host or f"h{i}", inv)


def gpu(n: float, acc: str | None = None) -> Request:
    return Request(resources={"GPU": n}, accelerator=(acc,) if acc else ())


def demand(
    did: str, at: float, reqs: list[Request], dur: float, est: float | None = None
) -> Demand:
    return Demand(did, at, tuple(reqs), dur, dur if est is None else est)


class Spy(GangPolicy):
    """GangPolicy that records every decision it made."""

    def __init__(self, reservation: bool = True) -> None:
        super().__init__(reservation)
        self.decisions: list[tuple[float, Decision]] = []

    def decide(self, waiting: Any, nodes: Any, running: Any, now: float) -> Decision:
        d = super().decide(waiting, nodes, running, now)
        self.decisions.append((now, d))
        return d


# -- exact scenarios -------------------------------------------------------------------------


def test_exact_small_scenario() -> None:
    """2 nodes x 2 GPUs. a (2 GPUs, 0-10) takes node 0 (most room, lowest index); the
    gang b (2 x 1 GPU) arrives at 1 and packs both members on node 1 (1-6); c (2 GPUs)
    waits for node 1 (6-9); d (1 GPU, arrived at 3) is behind c and starts when c ends
    (9-10), before node 0 frees at 10."""
    nodes = [node(0), node(1)]
    demands = [
        demand("a", 0, [gpu(2)], 10),
        demand("b", 1, [gpu(1), gpu(1)], 5),
        demand("c", 2, [gpu(2)], 3),
        demand("d", 3, [gpu(1)], 1),
    ]
    for reservation in (False, True):
        run = simulate_gangs(nodes, demands, GangPolicy(reservation=reservation))
        assert run.starts == ["a", "b", "c", "d"]
        assert run.start == {"a": 0, "b": 1, "c": 6, "d": 9}
        assert run.end == {"a": 10, "b": 6, "c": 9, "d": 10}
        assert run.nodes == {"a": (0,), "b": (1, 1), "c": (1,), "d": (1,)}
        assert run.makespan == 10


@pytest.mark.slow
def test_starts_follow_the_decisions_in_order() -> None:
    """Every start is the policy's, in the order of Decision.starts (ties at one instant
    included), and the policy sees estimates, never true durations."""
    w = synthetic_gangs(3, hours=2, nodes=8)
    spy = Spy()
    run = simulate_gangs(w.nodes, w.demands, spy)
    seen = [p.demand.did for _, d in spy.decisions for p in d.starts]
    assert run.starts == seen and len(seen) == len(w.demands)
    for now, d in spy.decisions:
        for p in d.starts:
            assert run.start[p.demand.did] == now
            assert not hasattr(p.demand, "duration")
    truth = {d.did: d for d in w.demands}
    assert all(run.end[k] == pytest.approx(run.start[k] + truth[k].duration) for k in truth)


def test_simultaneous_events_give_one_decision_by_order_key() -> None:
    """Arrivals at one instant are decided together: the lower ``order`` first, whatever
    the order they were given in."""
    nodes = [node(0, gpus=1)]
    demands = [
        Demand("late", 0.0, (gpu(1),), 1.0, 1.0, order=(1,)),
        Demand("first", 0.0, (gpu(1),), 1.0, 1.0, order=(0,)),
    ]
    spy = Spy()
    run = simulate_gangs(nodes, demands, spy)
    assert run.starts == ["first", "late"]
    assert run.start == {"first": 0.0, "late": 1.0}
    assert [now for now, _ in spy.decisions] == [0.0, 1.0]


# -- all or nothing ----------------------------------------------------------------------------


def _usage_never_exceeds(run: GangRun, demands: list[Demand], nodes: list[Node]) -> None:
    """Replay every start and end: no node ever holds more GPUs than it has, and every
    member is on a feasible node."""
    by_index = {n.index: n for n in nodes}
    events: list[tuple[float, int, str]] = []
    for d in demands:
        events.append((run.start[d.did], 1, d.did))
        events.append((run.end[d.did], 0, d.did))  # ends first at one instant
    truth = {d.did: d for d in demands}
    used: dict[int, float] = defaultdict(float)
    for _, kind, did in sorted(events):
        d = truth[did]
        assert len(run.nodes[did]) == len(d.requests)
        for req, idx in zip(d.requests, run.nodes[did], strict=True):
            inv = by_index[idx].inventory
            if req.accelerator:
                assert inv.accelerator in req.accelerator
            used[idx] += req.resources["GPU"] if kind else -req.resources["GPU"]
            assert used[idx] <= inv.resources["GPU"]


@pytest.mark.slow
@pytest.mark.parametrize("reservation", [False, True])
def test_gangs_start_whole_and_never_overfill_a_node(reservation: bool) -> None:
    w = synthetic_gangs(1, hours=3)
    run = simulate_gangs(w.nodes, w.demands, GangPolicy(reservation=reservation))
    assert set(run.start) == {d.did for d in w.demands}
    _usage_never_exceeds(run, list(w.demands), list(w.nodes))


class Partial(GangPolicy):
    """A broken policy: starts a gang with a node for its first member only."""

    def decide(self, waiting: Any, nodes: Any, running: Any, now: float) -> Decision:
        d = super().decide(waiting, nodes, running, now)
        return Decision([Placement(p.demand, p.nodes[:1]) for p in d.starts], None)


def test_the_driver_refuses_a_partial_gang() -> None:
    nodes = [node(0, gpus=4)]
    with pytest.raises(RuntimeError, match=r"1 node\(s\) for the 3 member\(s\) of 'g'"):
        simulate_gangs(nodes, [demand("g", 0, [gpu(1)] * 3, 1)], Partial())


# -- feasibility -------------------------------------------------------------------------------


def test_an_a100_request_never_runs_on_a_v100_node() -> None:
    """The V100 node has more room (packing prefers the most room), but is no candidate:
    the three A100 tasks queue on the small A100 node, one after the other."""
    nodes = [node(0, gpus=8, acc="V100"), node(1, gpus=1, acc="A100")]
    demands = [demand(f"t{i}", 0, [gpu(1, "A100")], 2) for i in range(3)]
    demands.append(demand("any", 0, [gpu(1)], 2))
    run = simulate_gangs(nodes, demands, GangPolicy())
    assert [run.nodes[f"t{i}"] for i in range(3)] == [(1,), (1,), (1,)]
    assert [run.start[f"t{i}"] for i in range(3)] == [0, 2, 4]
    assert run.nodes["any"] == (0,) and run.start["any"] == 0


def test_synthetic_a100_gangs_only_on_a100_nodes() -> None:
    w = synthetic_gangs(2, hours=3)
    run = simulate_gangs(w.nodes, w.demands, GangPolicy())
    acc = {n.index: n.inventory.accelerator for n in w.nodes}
    asked = [d for d in w.demands if d.requests[0].accelerator == ("A100",)]
    assert asked and all(d.gang for d in asked)
    for d in asked:
        assert {acc[i] for i in run.nodes[d.did]} == {"A100"}


def test_unsatisfiable_demands_are_refused_up_front() -> None:
    nodes = [node(0, gpus=8), node(1, gpus=8, acc="V100")]
    ok = demand("ok", 0, [gpu(1)], 1)
    with pytest.raises(RequestError, match=r"demand 'h' can never start: needs .*H100"):
        simulate_gangs(nodes, [ok, demand("h", 5, [gpu(1, "H100")], 1)], GangPolicy())
    with pytest.raises(RequestError, match=r"demand 'big' can never start: its 3 members"):
        simulate_gangs(nodes, [ok, demand("big", 5, [gpu(8)] * 3, 1)], GangPolicy())
    with pytest.raises(RequestError, match=r"demand 'x' can never start: needs GPU=9"):
        simulate_gangs(nodes, [demand("x", 0, [gpu(9)], 1)], GangPolicy())


def test_bad_demands() -> None:
    with pytest.raises(RequestError, match="no requests"):
        Demand("e", 0, (), 1)
    with pytest.raises(RequestError, match="duration must be finite"):
        Demand("e", 0, (gpu(1),), math.inf)
    with pytest.raises(ValueError, match="'a' appears twice"):
        simulate_gangs([node(0)], [demand("a", 0, [gpu(1)], 1)] * 2, GangPolicy())


# -- reservation against starvation ----------------------------------------------------------


def _stream_and_gang() -> tuple[list[Node], list[Demand]]:
    """One node of 4 GPUs; 1-GPU tasks of 2 s arrive every second from 0 to 19 (two run
    at any time, so 2 GPUs are free, never 4); a gang of 2 members x 2 GPUs (3 s)
    arrives at 0.5."""
    stream = [demand(f"s{k:02d}", k, [gpu(1)], 2) for k in range(20)]
    return [node(0, gpus=4)], [*stream, demand("g", 0.5, [gpu(2), gpu(2)], 3)]


def test_without_reservation_the_gang_starves_behind_the_stream() -> None:
    nodes, demands = _stream_and_gang()
    run = simulate_gangs(nodes, demands, GangPolicy(reservation=False))
    # 4 GPUs free only after the last task (19-21) ends
    assert run.start["g"] == 21 and run.starts[-1] == "g"
    assert all(run.start[f"s{k:02d}"] == k for k in range(20))  # the stream never waits


def test_with_reservation_the_gang_starts_when_the_first_task_ends() -> None:
    nodes, demands = _stream_and_gang()
    spy = Spy(reservation=True)
    run = simulate_gangs(nodes, demands, spy)
    # at 1 the gang holds the node (task s00 ends at 2); s01 would end at 3: held back
    assert run.start["g"] == 2 and run.nodes["g"] == (0, 0)
    assert run.start["s01"] == 5  # after the gang (2-5)
    now, first = next((t, d) for t, d in spy.decisions if d.reservation is not None)
    assert now == 0.5 and first.reservation is not None
    assert first.reservation.at == 2 and first.reservation.nodes == (0, 0)
    assert any(d.held_back for _, d in spy.decisions)
    m = gang_metrics(demands, run)
    assert m["gang_wait_max_s"] == 1.5
    m_off = gang_metrics(demands, simulate_gangs(nodes, demands, GangPolicy(reservation=False)))
    assert m_off["gang_wait_max_s"] == 20.5


def test_overdue_running_task_reserves_from_now() -> None:
    """A running task past its expected end is taken to end now, never in the past."""
    p = GangPolicy()
    view = Demand("g", 0, (gpu(2),), 1, 1)
    n = [type("N", (), {"index": 0, "host": "h", "inventory": node(0).inventory})()]
    n[0].free = {"GPU": 1.0}  # type: ignore[attr-defined]
    late = type("A", (), {"node": 0, "resources": {"GPU": 1.0}, "end": 3.0})()
    r = p.reserve(view, n, [late], now=7.0)
    assert r is not None and r.at == 7.0 and r.nodes == (0,)


@pytest.mark.slow
def test_synthetic_reservation_bounds_gang_waits() -> None:
    """On the documented workload (shorter), the reservation cuts the gangs' worst wait."""
    w = synthetic_gangs(0, hours=8)
    until = 8 * 3600.0
    off = gang_metrics(
        w.demands, simulate_gangs(w.nodes, w.demands, GangPolicy(False)), until=until
    )
    on = gang_metrics(w.demands, simulate_gangs(w.nodes, w.demands, GangPolicy(True)), until=until)
    assert on["gang_wait_max_s"] < off["gang_wait_max_s"] / 2
    assert on["gang_wait_p95_s"] < off["gang_wait_p95_s"]
    assert on["fragmentation_share"] < off["fragmentation_share"]
    assert on["utilisation_arrivals"] > 0.6


# -- fragmentation and metrics -----------------------------------------------------------------


def test_fragmentation_on_a_hand_built_state() -> None:
    class View:
        def __init__(self, n: Node, free: float) -> None:
            self.index, self.host, self.inventory = n.index, n.host, n.inventory
            self.free = {"GPU": free}

    nodes = [View(node(0, 8), 1), View(node(1, 8, "V100"), 3), View(node(2, 8), 4)]
    waiting = [demand("g", 0, [gpu(2, "A100")] * 2, 1)]
    # node 0: 1 free, too small; node 1: wrong type; node 2: a member fits
    assert fragmentation(waiting, nodes, "GPU") == 4
    assert fragmentation([], nodes, "GPU") == 0  # idle with nothing waiting: not fragmented
    small = [demand("s", 0, [gpu(1)], 1)]
    assert fragmentation(small, nodes, "GPU") == 0  # a 1-GPU task fits everywhere


def test_metrics_of_a_hand_computed_run() -> None:
    """2 nodes x 2 GPUs. a (1 GPU, 0-4) takes node 0; the gang b (2 x 2 GPUs) waits
    until 4 and runs 4-5. Over 0-4 one GPU (node 0's spare) is free and too small for a
    member of b: 4 GPU-s fragmented of 12 free while b waited; 8 GPU-s allocated of
    4 x 5."""
    nodes = [node(0), node(1)]
    demands = [demand("a", 0, [gpu(1)], 4), demand("b", 0, [gpu(2), gpu(2)], 1)]
    run = simulate_gangs(nodes, demands, GangPolicy())
    assert run.start == {"a": 0, "b": 4} and run.nodes["b"] == (0, 1)
    m = gang_metrics(demands, run, until=2.0)
    assert (m["gangs"], m["singles"]) == (1, 1)
    assert m["gang_wait_p50_s"] == m["gang_wait_max_s"] == 4
    assert m["single_wait_p95_s"] == 0
    assert m["makespan_s"] == 5
    assert m["utilisation"] == pytest.approx(8 / 20)
    assert m["utilisation_arrivals"] == pytest.approx(2 / 8)  # a alone over 0-2
    assert m["fragmentation_units"] == pytest.approx(4 / 5)
    assert m["fragmentation_share"] == pytest.approx(4 / 12)


@pytest.mark.slow
def test_synthetic_is_deterministic_and_as_documented() -> None:
    a, b = synthetic_gangs(5, hours=4), synthetic_gangs(5, hours=4)
    assert a.demands == b.demands
    assert a.demands != synthetic_gangs(6, hours=4).demands
    assert len(a.nodes) == 16
    assert [n.inventory.accelerator for n in a.nodes] == ["A100"] * 8 + ["V100"] * 8
    for d in a.demands:
        g = [r.resources["GPU"] for r in d.requests]
        if d.gang:
            assert 2 <= len(g) <= 8 and g[0] in (1, 2, 4, 8) and sum(g) <= 32
        else:
            assert g in ([1.0], [2.0])
        assert d.estimate is not None and d.estimate > 0
    assert a.description["demands"] == len(a.demands)


def test_backfill_goes_around_the_reserved_node() -> None:
    """2 nodes x 4 GPUs: a (1 GPU) on node 0 and b (3 GPUs) on node 1 until 10; the gang
    g (2 x 2 GPUs) reserves node 0 for 10. c (1 GPU, outlasting 10) would go to node 0
    (the most room) and break the reservation there; it starts at once on node 1."""
    nodes = [node(0, gpus=4), node(1, gpus=4)]
    demands = [
        demand("a", 0, [gpu(1)], 10),
        demand("b", 0, [gpu(3)], 10),
        demand("g", 1, [gpu(2), gpu(2)], 5),
        demand("c", 2, [gpu(1)], 20),
    ]
    run = simulate_gangs(nodes, demands, GangPolicy())
    assert run.nodes == {"a": (0,), "b": (1,), "g": (0, 0), "c": (1,)}
    assert run.start == {"a": 0, "b": 0, "g": 10, "c": 2}
    assert run.starts == ["a", "b", "c", "g"]


def test_may_backfill_sums_the_members_on_a_reserved_node() -> None:
    from daskjobs.policies.resources import Reservation

    p = GangPolicy()
    r = Reservation(None, 10.0, (0,), {0: {"GPU": 1.0}})
    pair = demand("p", 0, [gpu(1), gpu(1)], 50)
    assert not p.may_backfill(pair, (0, 0), r, now=0.0)  # 2 GPUs in a spare of 1
    assert p.may_backfill(pair, (0, 1), r, now=0.0)
    assert p.may_backfill(demand("q", 0, [gpu(1), gpu(1)], 5), (0, 0), r, now=0.0)
