"""A callback run every so often on a dask server (the scheduler, or a worker), written once.

dask keeps a server's periodic callbacks by name in ``server.periodic_callbacks`` (its own
heartbeats and balancers are there, and a closing server stops them all); a daskjobs callback
goes there too, under a ``daskjobs-...`` name, so that it shows up where an operator looks and
stops with its server. :func:`every` starts one; :meth:`Periodic.stop` stops it and removes its
entry, unless a newer callback has taken the name since.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["Periodic", "every"]


class Periodic:
    """A started periodic callback, by name on its server (:func:`every`)."""

    __slots__ = ("_pc", "name", "server")

    def __init__(self, server: Any, name: str, pc: Any) -> None:
        self.server = server
        self.name = name
        self._pc = pc

    @property
    def running(self) -> bool:
        return self._pc is not None

    def stop(self) -> None:
        """Stop it and drop its entry (idempotent)."""
        pc, self._pc = self._pc, None
        if pc is None:
            return
        pc.stop()
        callbacks = getattr(self.server, "periodic_callbacks", None)
        if callbacks is not None and callbacks.get(self.name) is pc:
            del callbacks[self.name]


def every(
    server: Any, name: str, seconds: float, callback: Callable[[], Awaitable[Any] | None]
) -> Periodic:
    """Run ``callback`` every ``seconds`` on ``server``'s event loop, listed as ``name`` in
    its ``periodic_callbacks``; started now."""
    from tornado.ioloop import PeriodicCallback

    pc = PeriodicCallback(callback, seconds * 1000)
    server.periodic_callbacks[name] = pc
    pc.start()
    return Periodic(server, name, pc)
