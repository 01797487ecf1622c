"""Worker speeds: dask's workers as the policies' nodes, and what is believed of them.

The beliefs are the simulator's :class:`~daskjobs.policies.NodeAware` learner (or,
under ``policy: node-aware``, the very policy object that picks tasks), fed the
attempts the plugin sees end; which attempts teach a speed is the learner's own
rule (:meth:`NodeAware.ended <daskjobs.policies.NodeAware.ended>`). This object
only maps worker addresses to node indices and announces belief changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from daskjobs.plugin.audit import Audit
from daskjobs.plugin.views import LiveAttempt, LiveTask
from daskjobs.policies import NodeAware

if TYPE_CHECKING:
    from distributed.scheduler import Scheduler

__all__ = ["WorkerSpeeds"]


class WorkerSpeeds:
    """``address -> node index`` for the policies, and the speed learner."""

    def __init__(self, audit: Audit, learner: NodeAware | None = None) -> None:
        self.audit = audit
        self.learner = learner if learner is not None else NodeAware()
        self.nodes: dict[str, int] = {}  # worker address -> node index of the policies
        self.addresses: dict[int, str] = {}  # node index -> address, of present workers
        self._next = 0  # node indices are never reused
        self.gone: dict[str, int] = {}  # workers that left: their index, for status rows
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
        return node

    def forget(self, address: str) -> None:
        """The worker left: its slots no longer count in the learner's capacity."""
        node = self.nodes.pop(address, None)
        if node is not None:
            self.addresses.pop(node, None)
            self.gone[address] = node
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
        """Per worker: believed slow-down (1.0 nominal) and the attempts it rests on."""
        sched = self.scheduler
        out = []
        for address, node in sorted({**self.gone, **self.nodes}.items()):
            ws = sched.workers.get(address) if sched is not None else None
            out.append(
                {
                    "worker": address,
                    "name": str(ws.name) if ws is not None else None,
                    "speed": self.learner.speed(node),
                    "samples": self.learner.samples(node),
                    "present": ws is not None,
                }
            )
        return out
