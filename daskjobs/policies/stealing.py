"""Work stealing.

Tasks are dealt round robin to per-core deques as they become runnable (in
push order). An idle core runs the head of its own deque; when that is empty
it steals the *tail* of the fullest deque (Blumofe and Leiserson's randomized
stealing, made deterministic: the fullest victim, lowest core index on ties).
Dealing ignores durations, so a core can end up with several long tasks while
others drain: stealing evens the counts, not the work, which is why it lands
between FIFO and longest-first on a skewed sweep.

The per-core deques live on the policy, so the driver must say which core a
slot is: the node view passed to :meth:`WorkStealing.pop` carries ``core``, a
global core index (the simulator's views do). Without it the node index is used,
which makes the deques per node (as dask's own stealing is per worker).

Cost: O(1) to pop the own head, O(1) amortized to push (plus O(log C) once per
deque a batch deals to), O(log C) amortized to find the fullest of C deques.

The fullest deque is found in a lazy max-heap of ``(-length, core)`` notes. A note
is written only when a deque *grows* (a push), never when it shrinks (a pop), so a
note may be higher than its deque is now, never lower than the deque's latest note:
every non-empty deque has a note at least its length. The top note is then checked
against its deque: equal, and no deque is longer (any longer one would have a higher
note) nor, at the same length, lower in index (its note would sort first), so it is
the victim; higher, and the note is replaced by the deque's length now (dropped if
the deque is empty) and the next top is checked; lower, and a later, higher note of
the same deque is in the heap, so it is dropped. Each replacement follows at least
one pop from that deque, so finding victims costs O(log C) amortized per pop, and
the pops of own heads, nearly all of them, touch no heap at all (the heap is
compacted when it holds more than 4 C notes).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from typing import Any

from daskjobs.policies.base import Capabilities, NodeView, Policy, TaskView

__all__ = ["WorkStealing"]


class WorkStealing(Policy):
    """Round-robin deal to per-core deques; idle cores steal from the fullest."""

    name = "work-stealing"
    capabilities = Capabilities(pops=True, reads=frozenset({"node.core"}))

    def __init__(self) -> None:
        self._deques: dict[int, deque[TaskView]] = {}
        self._order: list[int] = []  # core ids in dealing order
        self._next = 0
        # lazy max-heap of notes (-length, core), written when a deque grows (see above)
        self._lengths: list[tuple[int, int]] = []
        self._n = 0
        self._cores_per_node: dict[int, int] = {}
        self._base: dict[int, int] = {}
        self.steals = 0

    def add_node(self, index: int, cores: int) -> None:
        base = sum(self._cores_per_node.values())
        self._cores_per_node[index] = cores
        self._base[index] = base
        for c in range(base, base + cores):
            self._deques[c] = deque()
            self._order.append(c)

    def _slot(self, node: NodeView) -> int:
        core = getattr(node, "core", None)
        if core is not None:
            return int(core)
        if node.index not in self._base:  # no add_node: one deque per node
            self.add_node(node.index, 1)
        return self._base[node.index]

    def _note(self, core: int) -> None:
        heapq.heappush(self._lengths, (-len(self._deques[core]), core))
        if len(self._lengths) > 4 * len(self._deques) + 64:
            self._compact()

    def _compact(self) -> None:
        self._lengths = [(-len(d), c) for c, d in self._deques.items() if d]
        heapq.heapify(self._lengths)

    def push(self, task: TaskView) -> None:
        if not self._order:
            self.add_node(0, 1)
        core = self._order[self._next % len(self._order)]
        self._next += 1
        self._deques[core].append(task)
        self._n += 1
        self._note(core)

    def push_many(self, tasks: Sequence[TaskView]) -> None:
        """As many :meth:`push` calls: the same deal, round robin in push order, with
        one length note per dealt-to deque (the lazy heap needs only its last)."""
        if not tasks:
            return
        if not self._order:
            self.add_node(0, 1)
        order = self._order
        m = len(order)
        first = self._next
        deques = self._deques
        dealt = [order[(first + p) % m] for p in range(min(m, len(tasks)))]
        for p, core in enumerate(dealt):  # task j goes to order[(first + j) % m]
            deques[core].extend(tasks[p::m])
        self._next = first + len(tasks)
        self._n += len(tasks)
        for core in dealt:
            self._note(core)

    def _fullest(self) -> int | None:
        """The longest deque (lowest core on ties), or None if all are empty."""
        heap = self._lengths
        deques = self._deques
        while heap:
            neg, core = heap[0]
            m = len(deques[core])
            if m == -neg:
                return core
            if 0 < m < -neg:  # shorter than noted: note its length now
                heapq.heapreplace(heap, (-m, core))
            else:  # empty, or a later note (written when it grew) holds its length
                heapq.heappop(heap)
        return None

    def pop(self, node: NodeView, now: float) -> TaskView | None:
        if not self._n:
            return None
        core = getattr(node, "core", None)
        slot = core if type(core) is int else self._slot(node)
        own = self._deques.get(slot)
        if own and own[0].cores <= node.free:
            # the path of nearly every pop: a deque that shrinks needs no note
            self._n -= 1
            return own.popleft()
        victim = self._fullest()
        if victim is None:
            return None
        d = self._deques[victim]
        if d[-1].cores > node.free:
            return None
        self._n -= 1
        self.steals += 1
        return d.pop()

    def __len__(self) -> int:
        return self._n

    def describe(self) -> dict[str, Any]:
        return {"policy": self.name, "steals": self.steals}
