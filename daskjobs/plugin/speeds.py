"""Worker speeds: dask's workers as the policies' nodes, and what is believed of them.

The beliefs are the policy's own when it declares that it learns speeds
(``capabilities.learns_speeds``: ``node-aware``, or a user's), else a
:class:`~daskjobs.policies.NodeAware` that only learns; either is fed the attempts
the plugin sees end, and which attempts teach a speed is the learner's own rule
(its ``ended``). A policy that declares that it speculates but does not learn speeds
answers ``urgent`` for that learner: the speculation driver asks the learner, so a
user's speculating policy is asked live as in the simulator. This object only maps
worker addresses to node indices and announces belief changes.

What the figure is: a worker's *slow-down* is the geometric mean of ``run time /
estimate`` over the tasks that finished on it, pulled towards 1 by the learner's
prior (a few samples of 1) until some have. It measures the worker and the estimates
together: 1 means tasks took what they were estimated to take there; two identical
workers running tasks that take a tenth of their estimates both read about 0.1. Only
the ratio between workers says one is slower than another.

A worker that leaves keeps what was learned of it (shown as gone), and a worker that
joins under the same name (or, without one, the same address) starts from it: it is
the same machine, and its next tasks refine the belief rather than start it again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from daskjobs.plugin.audit import Audit
from daskjobs.plugin.views import LiveAttempt, LiveTask
from daskjobs.policies import NodeAware
from daskjobs.policies.base import SpeedLearner

if TYPE_CHECKING:
    from distributed.scheduler import Scheduler

__all__ = ["WorkerSpeeds"]


class _AskingLearner(NodeAware):
    """The plugin's learner when the policy speculates without learning speeds:
    NodeAware's beliefs, the policy's ``urgent``."""

    def __init__(self, urgent: Callable[[Any, float], bool]) -> None:
        super().__init__()
        self._urgent = urgent

    def urgent(self, attempt: Any, now: float) -> bool:
        return bool(self._urgent(attempt, now))


class WorkerSpeeds:
    """``address -> node index`` for the policies, and the speed learner."""

    def __init__(
        self,
        audit: Audit,
        learner: SpeedLearner | None = None,
        urgent: Callable[[Any, float], bool] | None = None,
    ) -> None:
        self.audit = audit
        if learner is None:
            learner = NodeAware() if urgent is None else _AskingLearner(urgent)
        self.learner: SpeedLearner = learner
        self.nodes: dict[str, int] = {}  # worker address -> node index of the policies
        self.addresses: dict[int, str] = {}  # node index -> address, of present workers
        self._next = 0  # node indices are never reused
        self.gone: dict[str, int] = {}  # workers that left: their index, for status rows
        # what was learned of workers that left, by name (else address): restored when a
        # worker of that name joins again
        self.kept: dict[str, tuple[float, int]] = {}
        self._kept_rows: dict[str, tuple[float, int]] = {}  # gone address -> its belief
        self.names: dict[str, str] = {}  # address -> the worker's name (else address)
        self.scheduler: Scheduler = None  # type: ignore[assignment]  # set at start

    def node(self, address: str) -> int:
        """The policies' index of the worker at ``address`` (new workers are added)."""
        node = self.nodes.get(address)
        if node is None:
            node = self.nodes[address] = self._next
            self.addresses[node] = address
            self._next += 1
            sched = self.scheduler
            ws = sched.workers.get(address) if sched is not None else None
            self.learner.add_node(node, int(ws.nthreads) if ws is not None else 1)
            named = getattr(ws, "name", None)
            name = str(named) if named not in (None, "") else address
            self.names[address] = name
            learned = self.kept.pop(name, None)
            if learned is not None:  # the same worker again: what was learned still holds
                self.learner.relearn(node, learned)
                self.gone.pop(address, None)
                self._kept_rows.pop(address, None)
        return node

    def forget(self, address: str) -> None:
        """The worker left: its slots no longer count in the learner's capacity."""
        node = self.nodes.pop(address, None)
        if node is not None:
            self.addresses.pop(node, None)
            self.gone[address] = node
            learned = self.learner.learned(node)
            if learned is not None and learned[1] > 0:
                self.kept[self.names.get(address, address)] = learned
                self._kept_rows[address] = (self.learner.speed(node), learned[1])
            self.learner.remove_node(node)

    def speed(self, address: str) -> float:
        return self.learner.speed(self.node(address))

    def learn(self, v: LiveTask, worker: str | None, seconds: float, outcome: str = "done") -> None:
        """An attempt of ``v`` ran ``seconds`` on ``worker``: finished (``done``) or beaten
        by its copy (``killed``); the learner's rule decides what it teaches."""
        if not worker:
            return
        att = LiveAttempt(v, self.node(worker), 0.0, seconds, outcome)
        if self.learner.ended(att, seconds):  # the belief about this worker moved
            self.audit.event(
                "worker-speed",
                worker=worker,
                speed=round(self.learner.speed(att.node), 3),
                samples=self.learner.samples(att.node),
            )

    def rows(self) -> list[dict[str, Any]]:
        """Per worker: measured slow-down (run time / estimate, module docs) and the
        finished tasks it rests on; a worker that left keeps what was learned of it."""
        sched = self.scheduler
        out = []
        for address, node in sorted({**self.gone, **self.nodes}.items()):
            ws = sched.workers.get(address) if sched is not None else None
            speed, samples = self.learner.speed(node), self.learner.samples(node)
            if address not in self.nodes and address in self._kept_rows:
                speed, samples = self._kept_rows[address]
            out.append(
                {
                    "worker": address,
                    "name": str(ws.name) if ws is not None else self.names.get(address),
                    "speed": speed,
                    "samples": samples,
                    "present": ws is not None,
                }
            )
        return out
