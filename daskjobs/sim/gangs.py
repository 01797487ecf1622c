"""A discrete-event simulator of resource vectors and gangs (docs/explanation/resources.md).

What it models
--------------
Nodes with inventories (:class:`Node`: GPUs of one accelerator type with their memory,
dask resource counts) and *demands* (:class:`Demand`): a single task, or a gang of
several members that must start together, each member asking a
:class:`~daskjobs.policies.resources.Request` (``{"GPU": 2}``, an accelerator type,
memory per device). A demand arrives, waits, starts (every member at the same instant,
on the nodes the policy names), holds its resources for its true ``duration`` and ends.

Who decides
-----------
Every decision is :meth:`GangPolicy.decide <daskjobs.policies.resources.GangPolicy.decide>`'s,
the object the live plugin runs: which waiting demands start now and where (feasibility
by :func:`~daskjobs.policies.resources.why_not` inside it, all-or-nothing packing), and
the reservation for the first demand that cannot start, with EASY backfill behind it.
This module builds the views the policy documents - a demand's ``did``, ``requests``,
``arrival``, ``order``, ``estimate`` (never its true duration); a node's ``index``,
``host``, ``inventory``, ``free``; a running member's ``node``, ``resources`` and
expected ``end`` (start + estimate) - enacts ``Decision.starts`` at once and measures.
It holds no placement rule of its own; it only checks each placement (every member on a
feasible node with room) and raises if the policy broke that, as a driver arbitrates.

The event loop
--------------
A heap of (time, sequence) events: arrivals and ends. All events of one instant are
applied together (ends free their resources, arrivals join the waiting set), then the
policy decides once; so the order in which simultaneous events were pushed never
matters, only the policy's ``order_key``. Starts are enacted in the order of
``Decision.starts``, which is also the order of :attr:`GangRun.starts` among demands
that start at the same instant. A demand whose requests no node can ever satisfy is
refused before the run, with :func:`~daskjobs.policies.resources.unsatisfiable`'s
reason. Cost per event: one ``decide`` (the policy's cost: a sort of the waiting
demands and one packing attempt each, plus the reservation's walk over running ends)
and one fragmentation measure (nodes x distinct waiting requests; the synthetic workload
shares its request objects, so that is a handful).

Measures
--------
Wait (start - arrival) of gangs and of single tasks; utilisation of one resource
("GPU"): allocated unit-seconds / (capacity x makespan); fragmentation: the free units
of that resource that no waiting request fits
(:func:`~daskjobs.policies.resources.fragmentation`), integrated over time, as an
average in units and as a fraction of the free units. A free GPU is fragmentation when
something waits that cannot use it (a piece too small for any waiting member, or of the
wrong accelerator type); it is a shortage when nothing is free.

:func:`synthetic_gangs` builds the documented mixed workload from a seed;
:func:`run_gangs` runs it with reservation off and on over several seeds.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from daskjobs.policies.resources import (
    Allocation,
    GangPolicy,
    Inventory,
    Request,
    RequestError,
    fragmentation,
    unsatisfiable,
    why_not,
)

__all__ = [
    "Demand",
    "GangRun",
    "GangWorkload",
    "Node",
    "gang_metrics",
    "run_gangs",
    "simulate_gangs",
    "synthetic_gangs",
]


@dataclass(frozen=True, slots=True)
class Node:
    """A node of the simulated cluster: its ``index`` (what placements name), its
    ``host`` (nodes of one host count as one place for topology) and its inventory."""

    index: int
    host: Any
    inventory: Inventory


@dataclass(frozen=True, slots=True)
class Demand:
    """One task (one request) or a gang (several requests, all started together).

    ``duration`` is the true run time, which the policy never sees; ``estimate`` is what
    it sees (None: unknown). ``order``: lower first (the live plugin passes dask's
    priority); arrival and then ``str(did)`` break ties (``GangPolicy.order_key``)."""

    did: Any
    arrival: float
    requests: tuple[Request, ...]
    duration: float
    estimate: float | None = None
    order: tuple[Any, ...] = (0,)

    def __post_init__(self) -> None:
        if not self.requests:
            raise RequestError(f"demand {self.did!r}: no requests (a task asks for one)")
        for name in ("arrival", "duration"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise RequestError(f"demand {self.did!r}: {name} must be a number, got {v!r}")
            if not (math.isfinite(v) and v >= 0):
                raise RequestError(f"demand {self.did!r}: {name} must be finite and >= 0")
        e = self.estimate
        if e is not None and (isinstance(e, bool) or not isinstance(e, int | float) or e < 0):
            raise RequestError(f"demand {self.did!r}: estimate must be None or >= 0, got {e!r}")

    @property
    def gang(self) -> bool:
        return len(self.requests) > 1


@dataclass(frozen=True, slots=True)
class _DemandView:
    """What the policy sees of a demand (no true duration)."""

    did: Any
    requests: tuple[Request, ...]
    arrival: float
    order: tuple[Any, ...]
    estimate: float | None


@dataclass(slots=True)
class _NodeState:
    """A node's view for the policy: ``free`` is what is not allocated now."""

    index: int
    host: Any
    inventory: Inventory
    free: dict[str, float]


@dataclass
class GangRun:
    """The outcome of :func:`simulate_gangs`.

    ``starts``: the dids in the order they started (at one instant, in the order of
    ``Decision.starts``); ``start``/``end``/``nodes``: per did, its start, end and the
    node index of each member. The rest feeds :func:`gang_metrics`."""

    starts: list[Any] = field(default_factory=list)
    start: dict[Any, float] = field(default_factory=dict)
    end: dict[Any, float] = field(default_factory=dict)
    nodes: dict[Any, tuple[int, ...]] = field(default_factory=dict)
    makespan: float = 0.0
    resource: str = "GPU"
    capacity: float = 0.0  # units of ``resource`` in the cluster
    busy: float = 0.0  # unit-seconds of ``resource`` allocated
    fragmented: float = 0.0  # unit-seconds free that no waiting request fits
    free: float = 0.0  # unit-seconds free (while something waits or not)
    free_waiting: float = 0.0  # unit-seconds free while something waits
    decisions: int = 0
    held_back: int = 0  # backfills the reservation refused, summed over decisions


def _check_nodes(nodes: Sequence[Node]) -> None:
    seen: set[int] = set()
    for n in nodes:
        if n.index in seen:
            raise ValueError(f"node index {n.index} appears twice")
        seen.add(n.index)


def _check_demands(demands: Sequence[Demand], nodes: Sequence[Node]) -> None:
    inventories = {f"node {n.index}": n.inventory for n in nodes}
    seen: set[Any] = set()
    verdicts: dict[tuple[int, ...], str | None] = {}  # by the requests' identities
    for d in demands:
        if d.did in seen:
            raise ValueError(f"demand {d.did!r} appears twice")
        seen.add(d.did)
        key = tuple(id(r) for r in d.requests)
        if key not in verdicts:
            verdicts[key] = unsatisfiable(d.requests, inventories) if nodes else "no nodes"
        reason = verdicts[key]
        if reason is not None:
            raise RequestError(f"demand {d.did!r} can never start: {reason}")


def simulate_gangs(
    nodes: Sequence[Node],
    demands: Iterable[Demand],
    policy: GangPolicy,
    *,
    resource: str = "GPU",
) -> GangRun:
    """Run ``demands`` on ``nodes``; every start is ``policy.decide``'s.

    Raises :class:`~daskjobs.policies.resources.RequestError` (a ``ValueError``) naming
    the first demand that no node can ever run, and ``RuntimeError`` if the policy
    places a member where it does not fit or leaves work waiting with nothing running.
    ``resource`` is the one whose utilisation and fragmentation are measured."""
    demands = list(demands)
    _check_nodes(nodes)
    _check_demands(demands, nodes)
    state = [_NodeState(n.index, n.host, n.inventory, dict(n.inventory.resources)) for n in nodes]
    by_index = {s.index: s for s in state}
    run = GangRun(resource=resource)
    run.capacity = sum(s.free.get(resource, 0.0) for s in state)
    truth = {d.did: d for d in demands}

    events: list[tuple[float, int, str, Any]] = []
    seq = 0
    for d in sorted(demands, key=lambda d: d.arrival):
        events.append((float(d.arrival), seq, "arrive", d))
        seq += 1
    heapq.heapify(events)
    waiting: dict[Any, _DemandView] = {}
    running: dict[Any, list[Allocation]] = {}
    free_units = run.capacity
    frag_now = 0.0  # fragmentation since the last event
    last = 0.0
    now = 0.0
    while events:
        now = events[0][0]
        dt = now - last
        run.fragmented += frag_now * dt
        run.free += free_units * dt
        if waiting:
            run.free_waiting += free_units * dt
        last = now
        # every event of this instant, then one decision
        while events and events[0][0] == now:
            _, _, kind, payload = heapq.heappop(events)
            if kind == "arrive":
                d = payload
                waiting[d.did] = _DemandView(d.did, d.requests, d.arrival, d.order, d.estimate)
            else:  # "end"
                did = payload
                for req, idx in zip(truth[did].requests, run.nodes[did], strict=True):
                    f = by_index[idx].free
                    for k, v in req.resources.items():
                        f[k] += v
                    free_units += req.resources.get(resource, 0.0)
                del running[did]
                run.end[did] = now
        if waiting:
            allocs = [a for group in running.values() for a in group]
            decision = policy.decide(list(waiting.values()), state, allocs, now)
            run.decisions += 1
            run.held_back += decision.held_back
            for placement in decision.starts:
                view = placement.demand
                did = view.did
                if waiting.pop(did, None) is None:
                    raise RuntimeError(f"policy {policy.name}: started {did!r}, not waiting")
                d = truth[did]
                _enact(policy, d, placement.nodes, by_index)
                run.starts.append(did)
                run.start[did] = now
                run.nodes[did] = tuple(placement.nodes)
                end = math.inf if d.estimate is None else now + d.estimate
                running[did] = [
                    Allocation(idx, req.resources, end)
                    for req, idx in zip(d.requests, placement.nodes, strict=True)
                ]
                units = sum(r.resources.get(resource, 0.0) for r in d.requests)
                free_units -= units
                run.busy += units * d.duration
                heapq.heappush(events, (now + d.duration, seq, "end", did))
                seq += 1
            if waiting and not events:
                raise RuntimeError(
                    f"policy {policy.name}: {len(waiting)} demand(s) wait with nothing "
                    f"running or arriving (first: {next(iter(waiting))!r})"
                )
        frag_now = fragmentation(waiting.values(), state, resource) if waiting else 0.0
    run.makespan = now
    return run


def _enact(
    policy: GangPolicy, d: Demand, placed: Sequence[int], by_index: dict[int, _NodeState]
) -> None:
    """Allocate every member of ``d`` where the policy put it, after checking (the
    driver arbitrates) that each node exists, is feasible and has room."""
    if len(placed) != len(d.requests):
        raise RuntimeError(
            f"policy {policy.name}: {len(placed)} node(s) for the {len(d.requests)} "
            f"member(s) of {d.did!r}"
        )
    for req, idx in zip(d.requests, placed, strict=True):
        node = by_index.get(idx)
        if node is None:
            raise RuntimeError(f"policy {policy.name}: {d.did!r} placed on unknown node {idx}")
        reason = why_not(req, node.inventory)
        if reason is not None:
            raise RuntimeError(f"policy {policy.name}: {d.did!r} on node {idx}: {reason}")
        f = node.free
        for k, v in req.resources.items():
            if f.get(k, 0.0) < v:
                raise RuntimeError(
                    f"policy {policy.name}: {d.did!r} needs {k}={v:g} on node {idx}, "
                    f"{f.get(k, 0.0):g} free"
                )
            f[k] = f.get(k, 0.0) - v


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def gang_metrics(
    demands: Iterable[Demand], run: GangRun, *, until: float | None = None
) -> dict[str, Any]:
    """Waits (start - arrival, seconds) of gangs and of single tasks at p50/p95/max,
    utilisation of ``run.resource`` (allocated unit-seconds / capacity x makespan),
    fragmentation averaged over the makespan (units) and as a fraction of the free
    unit-seconds while something waited. With ``until`` (the end of the arrivals),
    also ``utilisation_arrivals``: the same over ``[0, until]`` only, while work still
    arrives (the drain after it, where a starved backlog runs alone, left out)."""
    gang: list[float] = []
    single: list[float] = []
    held = 0.0  # unit-seconds allocated in [0, until]
    for d in demands:
        start = run.start[d.did]
        (gang if d.gang else single).append(start - d.arrival)
        if until is not None:
            overlap = min(run.end[d.did], until) - start
            if overlap > 0:
                held += overlap * sum(r.resources.get(run.resource, 0.0) for r in d.requests)
    out: dict[str, Any] = {"gangs": len(gang), "singles": len(single)}
    for name, waits in (("gang", gang), ("single", single)):
        out[f"{name}_wait_p50_s"] = _pct(waits, 50)
        out[f"{name}_wait_p95_s"] = _pct(waits, 95)
        out[f"{name}_wait_max_s"] = max(waits) if waits else None
    span = run.makespan
    out["makespan_s"] = span
    out["utilisation"] = run.busy / (run.capacity * span) if run.capacity and span else 0.0
    if until is not None:
        out["utilisation_arrivals"] = held / (run.capacity * until) if run.capacity else 0.0
    out["fragmentation_units"] = run.fragmented / span if span else 0.0
    out["fragmentation_share"] = run.fragmented / run.free_waiting if run.free_waiting else 0.0
    out["held_back"] = run.held_back
    return out


# -- the synthetic workload --------------------------------------------------------------------


@dataclass(frozen=True)
class GangWorkload:
    nodes: tuple[Node, ...]
    demands: tuple[Demand, ...]
    description: dict[str, Any] = field(default_factory=dict)


#: The two accelerator types of the synthetic cluster: (type, memory per device).
ACCELERATORS = (("A100", 80e9), ("V100", 32e9))


def synthetic_gangs(
    seed: int = 0,
    *,
    hours: float = 24.0,
    nodes: int = 16,
    gpus_per_node: int = 8,
    load: float = 0.9,
    gang_share: float = 0.5,
    single_median: float = 900.0,
    single_sigma: float = 0.8,
    gang_median: float = 3600.0,
    gang_sigma: float = 0.6,
    gang_max_gpus: int = 32,
    a100_share: float = 0.4,
    estimate_sigma: float = 0.3,
) -> GangWorkload:
    """The mixed workload of docs/explanation/resources.md, from a seed.

    ``nodes`` nodes of ``gpus_per_node`` GPUs, the first half A100 (80 GB per device),
    the rest V100 (32 GB), one node per host. Two Poisson streams over ``hours``, whose
    offered GPU load is ``load`` of the cluster, ``gang_share`` of it from gangs:

    * single tasks of 1 GPU (probability 0.8) or 2 (0.2), any type, log-normal run time
      (median ``single_median`` s, ``single_sigma``);
    * gangs of 2-8 members (uniform) of 1, 2, 4 or 8 GPUs each (uniform; drawn again
      while the gang asks more than ``gang_max_gpus``), log-normal run time (median
      ``gang_median`` s, ``gang_sigma``); ``a100_share`` of them ask
      ``accelerator="A100"`` and 40 GB per device, so only A100 nodes can hold them.

    The policy sees an estimate: the true run time times ``exp(estimate_sigma * N(0, 1))``
    (over and under). Requests are shared objects (one per shape)."""
    if not load > 0:
        raise ValueError(f"load must be > 0, got {load!r}")
    if not 0 <= gang_share <= 1:
        raise ValueError(f"gang_share must be in [0, 1], got {gang_share!r}")
    if nodes < 2 or gpus_per_node < 1:
        raise ValueError("need at least 2 nodes of at least 1 GPU")
    rng = np.random.default_rng(seed)
    half = nodes // 2
    cluster = tuple(
        Node(
            i,
            f"host-{i}",
            Inventory(
                resources={"GPU": float(gpus_per_node)},
                accelerator=ACCELERATORS[i >= half][0],
                gpus=gpus_per_node,
                gpu_memory=ACCELERATORS[i >= half][1],
            ),
        )
        for i in range(nodes)
    )
    capacity = nodes * gpus_per_node
    a100_capacity = half * gpus_per_node
    if gang_max_gpus > a100_capacity:
        raise ValueError(f"gang_max_gpus {gang_max_gpus} > the {a100_capacity} A100 GPUs")
    horizon = hours * 3600.0
    shapes: dict[tuple[int, bool], Request] = {}

    def request(gpus: int, a100: bool) -> Request:
        key = (gpus, a100)
        if key not in shapes:
            shapes[key] = Request(
                resources={"GPU": float(gpus)},
                accelerator=("A100",) if a100 else (),
                gpu_memory=40e9 if a100 else 0.0,
            )
        return shapes[key]

    per_member = [g for g in (1, 2, 4, 8) if g <= gpus_per_node]

    def draw_gang() -> tuple[int, int]:
        while True:
            members = int(rng.integers(2, 9))
            gpus = int(rng.choice(per_member))
            if members * gpus <= gang_max_gpus:
                return members, gpus

    # mean GPU-seconds of a gang, by the same draw (Monte Carlo on a side generator)
    side = np.random.default_rng([seed, 1])
    sizes: list[int] = []
    while len(sizes) < 20_000:
        m, g = int(side.integers(2, 9)), int(side.choice(per_member))
        if m * g <= gang_max_gpus:
            sizes.append(m * g)
    gang_gpus = float(np.mean(sizes)) * gang_median * math.exp(gang_sigma**2 / 2)
    single_gpus = 1.2 * single_median * math.exp(single_sigma**2 / 2)
    rates = {
        "single": load * (1 - gang_share) * capacity / single_gpus,
        "gang": load * gang_share * capacity / gang_gpus,
    }
    drawn: list[tuple[float, str, tuple[Request, ...], float]] = []
    for kind in ("single", "gang"):
        rate = rates[kind]
        if rate <= 0:
            continue
        t = 0.0
        while True:
            t += float(rng.exponential(1 / rate))
            if t >= horizon:
                break
            if kind == "single":
                gpus = 1 if rng.random() < 0.8 else 2
                reqs: tuple[Request, ...] = (request(gpus, False),)
                dur = single_median * math.exp(single_sigma * rng.standard_normal())
            else:
                members, gpus = draw_gang()
                a100 = bool(rng.random() < a100_share)
                reqs = (request(gpus, a100),) * members
                dur = gang_median * math.exp(gang_sigma * rng.standard_normal())
            drawn.append((t, kind, reqs, float(dur)))
    drawn.sort(key=lambda x: x[0])
    demands = []
    for i, (t, kind, reqs, dur) in enumerate(drawn):
        est = dur * math.exp(estimate_sigma * rng.standard_normal())
        demands.append(Demand(f"{kind[0]}{i}", t, reqs, dur, est))
    desc = {
        "seed": seed,
        "hours": hours,
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "accelerators": {a: f"{m / 1e9:g} GB" for a, m in ACCELERATORS},
        "load": load,
        "gang_share": gang_share,
        "single_median_s": single_median,
        "gang_median_s": gang_median,
        "gang_max_gpus": gang_max_gpus,
        "a100_share": a100_share,
        "estimate_sigma": estimate_sigma,
        "demands": len(demands),
        "gangs": sum(d.gang for d in demands),
    }
    return GangWorkload(cluster, tuple(demands), desc)


#: The rows of :func:`run_gangs`: reservation off, then on.
RESERVATION = (False, True)
_SPREAD = (
    "gang_wait_p50_s",
    "gang_wait_p95_s",
    "gang_wait_max_s",
    "single_wait_p50_s",
    "single_wait_p95_s",
    "utilisation",
    "utilisation_arrivals",
    "fragmentation_units",
    "fragmentation_share",
)


def run_gangs(seeds: Sequence[int] = (0, 1, 2), **workload: Any) -> dict[str, Any]:
    """``GangPolicy(reservation=False)`` and ``GangPolicy(reservation=True)`` on the
    synthetic workload of each seed (``workload``: keywords of :func:`synthetic_gangs`).
    Rows: per policy, the median over seeds of each metric with its range (``*_min``,
    ``*_max``); ``per_seed``: every seed's metrics."""
    per_seed: list[dict[str, Any]] = []
    desc: dict[str, Any] = {}
    for seed in seeds:
        w = synthetic_gangs(seed, **workload)
        desc = {k: v for k, v in w.description.items() if k not in ("seed", "demands", "gangs")}
        rows = []
        for reservation in RESERVATION:
            run = simulate_gangs(w.nodes, w.demands, GangPolicy(reservation=reservation))
            m = gang_metrics(w.demands, run, until=w.description["hours"] * 3600.0)
            rows.append({"reservation": reservation, **m})
        per_seed.append(
            {"seed": seed, "demands": len(w.demands), "gangs": w.description["gangs"], "rows": rows}
        )
    out_rows = []
    for i, reservation in enumerate(RESERVATION):
        row: dict[str, Any] = {"reservation": reservation}
        for key in _SPREAD:
            vals = [s["rows"][i][key] for s in per_seed if s["rows"][i][key] is not None]
            if not vals:
                row[key] = row[key + "_min"] = row[key + "_max"] = None
                continue
            row[key] = float(np.median(vals))
            row[key + "_min"], row[key + "_max"] = float(min(vals)), float(max(vals))
        out_rows.append(row)
    return {
        "experiment": "gangs",
        "seeds": list(seeds),
        "workload": desc,
        "rows": out_rows,
        "per_seed": per_seed,
    }
