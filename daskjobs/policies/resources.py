"""Resource vectors, accelerator types and gangs: feasibility first, then placement.

docs/explanation/resources.md. Two rules, both made here and enacted by two drivers (the live
plugin, :mod:`daskjobs.plugin.enact.gangs`, and the simulator, :mod:`daskjobs.sim.gangs`):

* **Feasibility** (:func:`why_not`): a worker that lacks what a task asks for (its
  accelerator type, memory per device, a resource count, a constraint expression) is not
  a low-scoring candidate, it is not a candidate. The filter runs before any preference,
  and a request that no worker's inventory can ever satisfy is refused at submission
  with the reason (:func:`unsatisfiable`).
* **Placement** (:class:`GangPolicy`): a *demand* (one task, or a gang of several that
  must start together) starts only when every member has a place now (all or nothing;
  members packed on the fewest workers, then hosts). Demands are offered places in
  order (``order_key``: priority, then arrival). With ``reservation`` (the default) the
  first demand that cannot start holds the workers where it will fit first, as their
  running tasks end (Slurm's reservation for its top job, EASY backfilling): a later
  demand may start on those workers only if its estimate ends before the reservation is
  needed, or if it fits in what the reservation leaves spare there. Without it, smaller
  demands take every unit that frees and a gang can wait for ever.

Views (any objects with these attributes): a **demand** - ``did``, ``requests`` (one
:class:`Request` per member), ``arrival``, ``order`` (a sortable tuple: lower first;
the live driver passes dask's priority), ``estimate`` (seconds, or None when unknown);
a **node** - ``index``, ``host``, ``inventory`` (:class:`Inventory`), ``free`` (a
mapping resource -> units not allocated now); a **running allocation** - ``node``,
``resources`` (mapping), ``end`` (expected end; ``math.inf`` when unknown).

Nothing here imports ``distributed``.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CONSTRAINT_NAMES",
    "Allocation",
    "Constraint",
    "Decision",
    "GangPolicy",
    "Inventory",
    "Placement",
    "Request",
    "RequestError",
    "Reservation",
    "fragmentation",
    "parse_size",
    "unsatisfiable",
    "why_not",
]


class RequestError(ValueError):
    """A malformed resource request, gang annotation or inventory."""


def parse_size(value: Any, what: str) -> float:
    """Bytes from a number or a size string (``"40GB"``, ``"40 GiB"``)."""
    if isinstance(value, bool):
        raise RequestError(f"{what}: expected a size such as '40GB' or a number of bytes")
    if isinstance(value, int | float):
        if not (math.isfinite(value) and value >= 0):
            raise RequestError(f"{what}: expected a size >= 0, got {value!r}")
        return float(value)
    if isinstance(value, str):
        from dask.utils import parse_bytes

        try:
            size = float(parse_bytes(value))
        except (ValueError, TypeError, OverflowError):
            raise RequestError(f"{what}: {value!r} is not a size such as '40GB'") from None
        if not (math.isfinite(size) and size >= 0):  # "-5GB", "1e999GB"
            raise RequestError(f"{what}: expected a size >= 0, got {value!r}")
        return size
    raise RequestError(f"{what}: expected a size such as '40GB', got {type(value).__name__}")


def _count(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(f"{what}: expected a number, got {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise RequestError(f"{what}: expected a number >= 0, got {value!r}")
    return float(value)


def _size_text(n: float) -> str:
    from dask.utils import format_bytes

    return format_bytes(int(n))


# -- inventories --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Inventory:
    """What a worker has: threads, memory, dask resources (the allocatable counts dask
    itself enforces, ``dask worker --resources GPU=2``), and its accelerators (type,
    count, memory per device). ``version`` grows when the worker reports a change."""

    cpus: float = 0.0
    memory: float = 0.0
    resources: Mapping[str, float] = field(default_factory=dict)
    accelerator: str | None = None
    gpus: int = 0
    gpu_memory: float = 0.0
    version: int = 0
    #: where it is (the live driver sets the worker's address and host; a request's
    #: ``where`` is checked against them)
    address: str | None = None
    host: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, what: str = "inventory") -> Inventory:
        """From a report or configuration: ``{"accelerator": "A100", "gpus": 2,
        "gpu_memory": "40GB", "cpus": 8, "memory": "64GB", "resources": {"GPU": 2},
        "version": 3}`` (every key optional)."""
        if not isinstance(d, Mapping):
            raise RequestError(f"{what}: expected a mapping, got {type(d).__name__}")
        known = {"cpus", "memory", "resources", "accelerator", "gpus", "gpu_memory", "version"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise RequestError(f"{what}: unknown field(s) {unknown}; known: {sorted(known)}")
        res = d.get("resources") or {}
        if not isinstance(res, Mapping):
            raise RequestError(f"{what}.resources: expected a mapping of name -> count")
        acc = d.get("accelerator")
        if acc is not None and not isinstance(acc, str):
            raise RequestError(f"{what}.accelerator: expected a name such as 'A100'")
        gpus = _count(d.get("gpus", 0), f"{what}.gpus")
        return cls(
            cpus=_count(d.get("cpus", 0), f"{what}.cpus"),
            memory=parse_size(d.get("memory", 0), f"{what}.memory"),
            resources={str(k): _count(v, f"{what}.resources.{k}") for k, v in res.items()},
            accelerator=acc or None,
            gpus=int(gpus),
            gpu_memory=parse_size(d.get("gpu_memory", 0), f"{what}.gpu_memory"),
            version=int(_count(d.get("version", 0), f"{what}.version")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpus": self.cpus,
            "memory": self.memory,
            "resources": dict(self.resources),
            "accelerator": self.accelerator,
            "gpus": self.gpus,
            "gpu_memory": self.gpu_memory,
            "version": self.version,
        }

    def names(self) -> dict[str, Any]:
        """The values a constraint expression reads."""
        return {
            "accelerator": self.accelerator,
            "gpus": self.gpus,
            "gpu_memory": self.gpu_memory,
            "cpus": self.cpus,
            "memory": self.memory,
            "resources": dict(self.resources),
        }


# -- constraint expressions ----------------------------------------------------------------

#: The names a constraint expression may read (an inventory's fields).
CONSTRAINT_NAMES = ("accelerator", "gpus", "gpu_memory", "cpus", "memory", "resources")
_SIZED = {"gpu_memory", "memory"}
_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


class Constraint:
    """A boolean expression over a worker's inventory, e.g.
    ``"accelerator in ('A100', 'H100') and gpu_memory >= '40GB'"``.

    Allowed: the names of :data:`CONSTRAINT_NAMES`, ``resources['GPU']``, numbers,
    strings, tuples/lists of them, comparisons, ``and``/``or``/``not``. A string compared
    with ``memory`` or ``gpu_memory`` is a size. Anything else (calls, attributes, other
    names) is refused when the expression is parsed, never evaluated.
    """

    __slots__ = ("_fn", "text")

    def __init__(self, text: str) -> None:
        if not isinstance(text, str) or not text.strip():
            raise RequestError('constraint: expected an expression such as "gpus >= 2"')
        self.text = text
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError as e:
            raise RequestError(f"constraint {text!r}: not an expression ({e.msg})") from None
        self._fn = self._compile(tree.body)

    def __repr__(self) -> str:
        return f"Constraint({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Constraint) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __call__(self, inventory: Inventory) -> bool:
        try:
            return bool(self._fn(inventory.names()))
        except TypeError:  # e.g. None < 2: this worker does not have the value
            return False

    def _bad(self, node: ast.AST) -> RequestError:
        return RequestError(
            f"constraint {self.text!r}: {ast.unparse(node)!r} is not allowed (use the names "
            f"{', '.join(CONSTRAINT_NAMES)}, constants, comparisons, and/or/not)"
        )

    def _compile(self, node: ast.AST) -> Callable[[dict[str, Any]], Any]:
        if isinstance(node, ast.BoolOp):
            parts = [self._compile(v) for v in node.values]
            if isinstance(node.op, ast.And):
                return lambda env: all(p(env) for p in parts)
            return lambda env: any(p(env) for p in parts)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner = self._compile(node.operand)
            return lambda env: not inner(env)
        if isinstance(node, ast.Compare):
            return self._compare(node)
        return self._value(node, sized=False)

    def _compare(self, node: ast.Compare) -> Callable[[dict[str, Any]], Any]:
        sized = any(
            isinstance(n, ast.Name) and n.id in _SIZED for n in [node.left, *node.comparators]
        )
        terms = [self._value(n, sized) for n in [node.left, *node.comparators]]
        ops = []
        for op in node.ops:
            fn = _COMPARE.get(type(op))
            if fn is None:
                raise self._bad(node)
            ops.append(fn)

        def compare(env: dict[str, Any]) -> bool:
            left = terms[0](env)
            for fn, term in zip(ops, terms[1:], strict=True):
                right = term(env)
                if not fn(left, right):
                    return False
                left = right
            return True

        return compare

    def _value(self, node: ast.AST, sized: bool) -> Callable[[dict[str, Any]], Any]:
        if isinstance(node, ast.Name):
            if node.id not in CONSTRAINT_NAMES:
                raise RequestError(
                    f"constraint {self.text!r}: unknown name {node.id!r}; known: "
                    f"{', '.join(CONSTRAINT_NAMES)}"
                )
            name = node.id
            return lambda env: env[name]
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float | str):
            value: Any = node.value
            if sized and isinstance(value, str):
                value = parse_size(value, f"constraint {self.text!r}")
            return lambda env: value
        if isinstance(node, ast.Tuple | ast.List):
            items = [self._value(e, sized) for e in node.elts]
            return lambda env: tuple(i(env) for i in items)
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "resources"
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            res = node.slice.value
            return lambda env: env["resources"].get(res, 0.0)
        raise self._bad(node)


# -- requests -------------------------------------------------------------------------------

#: The annotations a request is read from (dask's own ``resources`` among them).
REQUEST_ANNOTATIONS = ("resources", "accelerator", "gpu_memory", "constraint")


@dataclass(frozen=True, slots=True)
class Request:
    """What one task (one gang member) needs from the worker it runs on."""

    resources: Mapping[str, float] = field(default_factory=dict)
    accelerator: tuple[str, ...] = ()  # any of these types; () any (or none)
    gpu_memory: float = 0.0  # per device, bytes
    constraint: Constraint | None = None
    #: the worker addresses or hosts it may run on at all (its user's ``workers=``
    #: restriction); None: any
    where: frozenset[str] | None = None
    #: what it asks, as a hashable value (equal requests, equal shapes); set once
    shape: tuple[Any, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        c = self.constraint
        shape = (
            tuple(sorted(self.resources.items())),
            self.accelerator,
            self.gpu_memory,
            None if c is None else c.text,
            self.where,
        )
        object.__setattr__(self, "shape", shape)

    @classmethod
    def from_annotations(cls, ann: Mapping[str, Any], *, what: str = "task") -> Request | None:
        """The request of a task's annotations, or None when it asks for nothing
        (``resources={"GPU": 2}``, ``accelerator="A100"`` or ``["A100", "H100"]``,
        ``gpu_memory="40GB"``, ``constraint="..."``)."""
        if not any(ann.get(k) is not None for k in REQUEST_ANNOTATIONS):
            return None
        res = ann.get("resources") or {}
        if not isinstance(res, Mapping):
            raise RequestError(f"{what}: resources: expected a mapping such as {{'GPU': 2}}")
        acc = ann.get("accelerator")
        if acc is None:
            types: tuple[str, ...] = ()
        elif isinstance(acc, str) and acc:
            types = (acc,)
        elif isinstance(acc, list | tuple) and acc and all(isinstance(a, str) and a for a in acc):
            types = tuple(acc)
        else:
            raise RequestError(
                f"{what}: accelerator: expected a type such as 'A100' or a list of types, "
                f"got {acc!r}"
            )
        mem = ann.get("gpu_memory")
        text = ann.get("constraint")
        constraint = None
        if text is not None:
            try:
                constraint = Constraint(text)
            except RequestError as e:
                raise RequestError(f"{what}: {e}") from None
        return cls(
            resources={str(k): _count(v, f"{what}: resources[{k!r}]") for k, v in res.items()},
            accelerator=types,
            gpu_memory=0.0 if mem is None else parse_size(mem, f"{what}: gpu_memory"),
            constraint=constraint,
        )

    def describe(self) -> str:
        parts = [f"{k}={v:g}" for k, v in sorted(self.resources.items())]
        if self.accelerator:
            parts.append("accelerator=" + "|".join(self.accelerator))
        if self.gpu_memory:
            parts.append(f"gpu_memory={_size_text(self.gpu_memory)}")
        if self.constraint is not None:
            parts.append(f"constraint={self.constraint.text!r}")
        return ", ".join(parts) or "nothing"


def _feasible(request: Request, inventory: Inventory) -> bool:
    """``why_not(request, inventory) is None``, without building the reason (the
    packing loops ask this for every node of every waiting member)."""
    if request.accelerator and inventory.accelerator not in request.accelerator:
        return False
    if request.gpu_memory and inventory.gpu_memory < request.gpu_memory:
        return False
    have = inventory.resources
    for name, need in request.resources.items():
        if have.get(name, 0.0) < need:
            return False
    if request.where is not None and not _placed_in(request.where, inventory):
        return False
    return request.constraint is None or request.constraint(inventory)


def _placed_in(where: frozenset[str], inventory: Inventory) -> bool:
    return inventory.address in where or inventory.host in where


def why_not(request: Request, inventory: Inventory) -> str | None:
    """Why a worker with ``inventory`` can never run a task asking ``request`` (None: it
    can, once enough of its resources are free). The hard filter: no policy scores a
    worker this answers for."""
    if _feasible(request, inventory):  # the hot path: no message to build
        return None
    missing = []
    if request.accelerator and inventory.accelerator not in request.accelerator:
        have = inventory.accelerator or "no accelerator"
        missing.append(f"accelerator {'|'.join(request.accelerator)} (it has {have})")
    if request.gpu_memory and inventory.gpu_memory < request.gpu_memory:
        missing.append(
            f"gpu_memory {_size_text(request.gpu_memory)} per device (it has "
            f"{_size_text(inventory.gpu_memory)})"
        )
    for name, need in request.resources.items():
        have_n = inventory.resources.get(name, 0.0)
        if have_n < need:
            missing.append(f"{name}={need:g} (it has {have_n:g})")
    if request.constraint is not None and not request.constraint(inventory):
        missing.append(f"constraint {request.constraint.text!r} is false")
    if request.where is not None and not _placed_in(request.where, inventory):
        missing.append("it is not one of the workers the task names (workers=...)")
    return "; ".join(missing) or None


def unsatisfiable(requests: Sequence[Request], inventories: Mapping[str, Inventory]) -> str | None:
    """Why no set of the known workers can ever run these requests (the members of one
    demand), or None. Each member needs a feasible worker; the members of a gang together
    need the summed resources on feasible workers."""
    if not inventories:
        return None  # nothing known yet: wait for workers, do not refuse
    for i, req in enumerate(requests):
        reasons = {name: why_not(req, inv) for name, inv in inventories.items()}
        if all(r is not None for r in reasons.values()):
            shown = "; ".join(f"{w}: {r}" for w, r in sorted(reasons.items())[:4])
            more = f" (and {len(reasons) - 4} more workers)" if len(reasons) > 4 else ""
            who = f"member {i} " if len(requests) > 1 else ""
            return f"{who}needs {req.describe()}; no worker has it: {shown}{more}"
    if len(requests) > 1:
        # all members at once, on their feasible workers' total resources
        nodes = [
            _Free(i, name, inv, dict(inv.resources))
            for i, (name, inv) in enumerate(sorted(inventories.items()))
        ]
        if _pack(requests, nodes) is None:
            return (
                f"its {len(requests)} members need {requests[0].describe()} each at once; "
                "the known workers together cannot hold them"
            )
    return None


# -- placement ------------------------------------------------------------------------------


@dataclass(slots=True)
class _Free:
    index: int
    host: Any
    inventory: Inventory
    free: dict[str, float]


def _fits(req: Request, free: Mapping[str, float]) -> bool:
    # a loop, not all(genexpr): packing asks this per node per member per decision
    for k, v in req.resources.items():  # noqa: SIM110 - twice as fast as all() here
        if free.get(k, 0.0) < v:
            return False
    return True


def _pack(
    requests: Sequence[Request],
    nodes: Sequence[_Free],
    feasible: dict[int, list[_Free]] | None = None,
) -> list[int] | None:
    """A node index per member, every member on a feasible node with room, or None.

    Packing (topology preference, after feasibility): the largest members first; each on
    a node already used by this demand when one has room, else on the host already used,
    else on the feasible node with the most room (ties: lowest index). ``feasible``:
    id(request) -> its feasible nodes among ``nodes``, a cache a caller may share between
    calls on the same ``nodes`` (requests alive meanwhile)."""
    free = {n.index: dict(n.free) for n in nodes}
    by_index = {n.index: n for n in nodes}
    if feasible is None:
        feasible = {}
    order = sorted(range(len(requests)), key=lambda i: -sum(requests[i].resources.values()))
    chosen: list[int] = [0] * len(requests)
    used: list[int] = []
    hosts: set[Any] = set()
    for i in order:
        req = requests[i]
        cands = feasible.get(id(req))
        if cands is None:
            cands = [n for n in nodes if _feasible(req, n.inventory)]
            feasible[id(req)] = cands
        best: tuple[Any, ...] | None = None
        for n in cands:
            f = free[n.index]
            if not _fits(req, f):
                continue
            room = sum(f.values())
            score = (n.index not in used, n.host not in hosts, -room, n.index)
            if best is None or score < best:
                best = score
        if best is None:
            return None
        idx = best[-1]
        chosen[i] = idx
        for k, v in req.resources.items():
            free[idx][k] = free[idx].get(k, 0.0) - v
        if idx not in used:
            used.append(idx)
            hosts.add(by_index[idx].host)
    return chosen


@dataclass(frozen=True, slots=True)
class Placement:
    """A demand that starts now: the node index of each member."""

    demand: Any
    nodes: tuple[int, ...]


@dataclass(slots=True)
class Reservation:
    """Nodes held for the first demand that cannot start: it will fit at ``at`` (as
    running tasks end) on ``nodes``; ``spare`` is what those nodes have beyond its need
    then, which backfill that would outlast ``at`` may still take."""

    demand: Any
    at: float
    nodes: tuple[int, ...]
    spare: dict[int, dict[str, float]]


@dataclass(slots=True)
class Decision:
    starts: list[Placement]
    reservation: Reservation | None
    #: demands that could start but were kept off reserved nodes (backfill refused)
    held_back: int = 0


class GangPolicy:
    """All-or-nothing placement with a reservation for the first demand that waits.

    ``reservation=False``: every demand that fits starts, in order (first fit); a gang
    whose members never find room at the same moment starves behind smaller tasks.
    """

    name = "gang"

    def __init__(self, reservation: bool = True) -> None:
        self.reservation = bool(reservation)

    def order_key(self, demand: Any) -> tuple[Any, ...]:
        return (demand.order, demand.arrival, str(demand.did))

    def place(self, demand: Any, nodes: Sequence[Any]) -> tuple[int, ...] | None:
        """Where each member of ``demand`` goes if it starts now (None: not all fit)."""
        free = [_Free(n.index, n.host, n.inventory, dict(n.free)) for n in nodes]
        got = _pack(demand.requests, free)
        return None if got is None else tuple(got)

    def reserve(
        self, demand: Any, nodes: Sequence[Any], running: Iterable[Any], now: float
    ) -> Reservation | None:
        """When and where ``demand`` fits first as running allocations end (by their
        expected ends); None if it never does on these nodes."""
        free = {n.index: _Free(n.index, n.host, n.inventory, dict(n.free)) for n in nodes}
        ends = sorted((r for r in running if r.node in free), key=lambda r: r.end)
        at = now
        i = 0
        feasible: dict[int, list[_Free]] = {}
        order = list(free.values())
        while True:
            got = _pack(demand.requests, order, feasible)
            if got is not None:
                need: dict[int, dict[str, float]] = {}
                for idx, req in zip(got, demand.requests, strict=True):
                    d = need.setdefault(idx, {})
                    for k, v in req.resources.items():
                        d[k] = d.get(k, 0.0) + v
                spare = {
                    idx: {k: free[idx].free.get(k, 0.0) - v for k, v in d.items()}
                    for idx, d in need.items()
                }
                return Reservation(demand, at, tuple(got), spare)
            if i >= len(ends):
                return None
            at = max(now, ends[i].end)  # one past its expected end is taken to end now
            # every allocation ending by then frees its resources
            while i < len(ends) and ends[i].end <= at:
                f = free[ends[i].node].free
                for k, v in ends[i].resources.items():
                    f[k] = f.get(k, 0.0) + v
                i += 1

    def may_backfill(
        self, demand: Any, placed: Sequence[int], reservation: Reservation, now: float
    ) -> bool:
        """May ``demand`` start on ``placed`` while ``reservation`` holds? Yes if it
        touches no reserved node, or ends (by its estimate) before the reservation is
        needed, or fits in what the reservation leaves spare on each reserved node."""
        touched = [i for i in set(placed) if i in reservation.spare]
        if not touched:
            return True
        est = demand.estimate
        if est is not None and math.isfinite(est) and now + est <= reservation.at:
            return True
        taken: dict[int, dict[str, float]] = {}  # the members' sum per reserved node
        for req, idx in zip(demand.requests, placed, strict=True):
            if idx in reservation.spare:
                t = taken.setdefault(idx, {})
                for k, v in req.resources.items():
                    t[k] = t.get(k, 0.0) + v
        for i, t in taken.items():
            spare = reservation.spare[i]
            for k, v in t.items():
                if k in spare and spare[k] < v:
                    return False
        return True

    def _pack_around(
        self, demand: Any, free: Sequence[_Free], reservation: Reservation, feasible: Any
    ) -> list[int] | None:
        """A packing of ``demand`` that leaves ``reservation`` whole: reserved nodes
        offer only what it leaves spare there (other nodes all they have free)."""
        capped = []
        for n in free:
            spare = reservation.spare.get(n.index)
            f = n.free
            if spare is not None:
                f = dict(f)
                for k, v in spare.items():
                    f[k] = min(f.get(k, 0.0), max(v, 0.0))
            capped.append(_Free(n.index, n.host, n.inventory, f))
        return _pack(demand.requests, capped, feasible)

    def decide(
        self,
        waiting: Iterable[Any],
        nodes: Sequence[Any],
        running: Iterable[Any],
        now: float,
    ) -> Decision:
        """The demands that start now, and the reservation that holds (one pass over the
        waiting demands in ``order_key`` order)."""
        free = [_Free(n.index, n.host, n.inventory, dict(n.free)) for n in nodes]
        by_index = {n.index: n for n in free}
        running = list(running)
        starts: list[Placement] = []
        reservation: Reservation | None = None
        held_back = 0
        feasible: dict[int, list[_Free]] = {}  # shared by every packing on ``free``
        # shapes that found no room in this pass: free room only shrinks as the pass
        # starts demands, so an equal demand later in it finds none either (a queue of
        # thousands of equal tasks costs one packing, not thousands)
        unfit: set[tuple[Any, ...]] = set()
        for demand in sorted(waiting, key=self.order_key):
            reqs = demand.requests
            shape = reqs[0].shape if len(reqs) == 1 else tuple(r.shape for r in reqs)
            if shape in unfit:
                continue
            got = _pack(demand.requests, free, feasible)
            if got is None:
                unfit.add(shape)
            if got is not None and reservation is not None:
                if not self.may_backfill(demand, got, reservation, now):
                    # the packing's first choice outlasts the reservation on a reserved
                    # node: the demand may still start off those nodes, or in their spare
                    got = self._pack_around(demand, free, reservation, feasible)
                    if got is None:
                        held_back += 1
                        continue
                est = demand.estimate
                outlasts = est is None or not math.isfinite(est) or now + est > reservation.at
                if outlasts:  # it takes from the reservation's spare
                    for req, idx in zip(demand.requests, got, strict=True):
                        spare = reservation.spare.get(idx)
                        if spare is not None:
                            for k, v in req.resources.items():
                                if k in spare:
                                    spare[k] -= v
            if got is not None:
                starts.append(Placement(demand, tuple(got)))
                end = math.inf if demand.estimate is None else now + demand.estimate
                for req, idx in zip(demand.requests, got, strict=True):
                    f = by_index[idx].free
                    for k, v in req.resources.items():
                        f[k] = f.get(k, 0.0) - v
                    running.append(Allocation(idx, dict(req.resources), end))
                continue
            if self.reservation and reservation is None:
                reservation = self.reserve(demand, free, running, now)
        return Decision(starts, reservation, held_back)

    def describe(self) -> dict[str, Any]:
        return {"policy": self.name, "reservation": self.reservation}


@dataclass(frozen=True, slots=True)
class Allocation:
    """A running member as :meth:`GangPolicy.decide` and :meth:`GangPolicy.reserve` read
    it (the drivers build these): its node, the resources it holds, its expected end
    (start + estimate; ``math.inf`` when unknown)."""

    node: int
    resources: Mapping[str, float]
    end: float


def fragmentation(waiting: Iterable[Any], nodes: Sequence[Any], resource: str) -> float:
    """Free units of ``resource`` that no waiting member could use: on nodes where no
    waiting request fits (0 when nothing waits: idle capacity with nothing waiting is not
    fragmentation). Separates fragmentation (free units in
    pieces too small or of the wrong type) from a true shortage (no free units)."""
    if not any(n.free.get(resource, 0.0) > 0 for n in nodes):
        return 0.0  # nothing free: a shortage, not fragmentation
    requests = list({r.shape: r for d in waiting for r in d.requests}.values())
    if not requests:
        return 0.0
    lost = 0.0
    for n in nodes:
        units = n.free.get(resource, 0.0)
        if units <= 0:
            continue
        if not any(_fits(r, n.free) and _feasible(r, n.inventory) for r in requests):
            lost += units
    return lost
