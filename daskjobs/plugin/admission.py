"""Admission limits: no single client's submission can stop a shared scheduler.

dask's scheduler takes whatever graph a client sends. A graph of ten million tasks, or of
gigabytes, is read, built, ordered and held, and a scheduler out of memory takes every
client's work with it. :class:`AdmissionPart` checks each graph against the operator's
limits (``daskjobs.admission``) twice:

* **when it arrives, before dask reads it** (the plugin wraps dask's ``update-graph``
  handler: :func:`daskjobs.plugin.surgery._internals.wrap_graph_handler`): the bytes of the graph
  as sent (``graph-bytes``), the keys it asks for (``graph-tasks``) and the client's
  unfinished tasks with those keys (``client-tasks``). O(1) a graph; a refused graph is
  never deserialised, built or ordered, and the client's futures of its keys fail with
  the refusal (:func:`~daskjobs.plugin.surgery._internals.refuse_unread`);
* **once dask has read and ordered it, before it makes any task of it** (:meth:`built`,
  through :func:`~daskjobs.plugin.surgery._internals.wrap_priorities`): the graph's new
  tasks against ``graph-tasks``, for a graph that asks for fewer keys than it brings tasks
  (an array's reduction, a sweep's shared stages). Refused, it is dropped as a graph
  refused unread is: its client told in one message (one a key up to 1,000 keys), no
  task made, so a refusal never costs
  the scheduler more than taking the graph would. ``check_graph`` counts the new tasks
  again once made (should that check have failed) and the plugin does no per-task work on
  a graph over the limit. Then each task's key and annotations must be what dask can send
  to a worker (:func:`unsendable`): dask 2026.8 sends a task's annotations to its worker, and
  an integer beyond 64 bits, text that is not UTF-8 or an object that cannot be pickled
  there breaks the scheduler's connection to that worker for good, and with it every
  client's work on the worker. Such a graph is refused (:class:`UnsendableTask`). O(tasks)
  a graph, each distinct annotation value walked once.

The refusal is a :class:`~daskjobs.errors.AdmissionRefused` naming the limit, its value
and its key. The client's unfinished tasks are counted as graphs are accepted (their new
tasks, which dask's ``update_graph`` hook attributes to the client) and as tasks end
(``memory``, ``erred`` or ``forgotten``: one dict lookup a transition). The count bounds
the next graph, so a client holds at most ``client-tasks`` plus one graph's tasks.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from daskjobs.errors import AdmissionRefused, SubmissionRefused, over_limit
from daskjobs.plugin.parts import Part, Step
from daskjobs.plugin.surgery import _internals as dask_internals

if TYPE_CHECKING:
    from dask.typing import Key

    from daskjobs.config import AdmissionSettings
    from daskjobs.plugin.audit import Audit

__all__ = ["AdmissionPart", "UnsendableTask", "unsendable"]

logger = logging.getLogger("daskjobs.plugin")

#: What the refusals of a graph advise.
_SPLIT = (
    "Submit the work in smaller graphs (as each part finishes, or in batches: "
    "distributed.as_completed), or ask the scheduler's operator to raise the limit."
)
_SMALLER = (
    "Load large data on the workers (dask.delayed of a loader, client.scatter), not inside "
    "the graph, or ask the scheduler's operator to raise the limit."
)
#: The ends of a task: its client no longer waits for it to run.
_ENDS = frozenset({"memory", "erred", "forgotten"})


def _over_tasks(tasks: int, limit: int) -> AdmissionRefused:
    """The refusal of a graph of ``tasks`` new tasks, over ``graph-tasks`` (``limit``)."""
    return over_limit(
        "the graph's tasks", tasks, "daskjobs.admission.graph-tasks", limit, "tasks", _SPLIT
    )


class UnsendableTask(SubmissionRefused):
    """A task whose key or annotations dask could not send to a worker (module docs)."""


#: The longest nesting of an annotation value walked (deeper: refused).
_DEPTH = 32


def unsendable(value: Any, depth: int = 0) -> str | None:
    """Why dask could not send ``value`` to a worker in a task message (msgpack for plain
    values, else pickle), or None: an integer beyond 64 bits, text that is not UTF-8
    (a lone surrogate), nesting deeper than 32, an object that cannot be pickled."""
    if value is None or isinstance(value, bool | float | bytes):
        return None
    if isinstance(value, int):
        return None if -(2**63) <= value < 2**64 else f"the integer {value:.3g} is beyond 64 bits"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return f"text that is not UTF-8 ({e.reason})"
        return None
    if depth >= _DEPTH:
        return f"values nested more than {_DEPTH} deep"
    if isinstance(value, list | tuple | set):
        for item in value:
            if (why := unsendable(item, depth + 1)) is not None:
                return why
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            if (why := unsendable(k, depth + 1) or unsendable(v, depth + 1)) is not None:
                return why
        return None
    try:  # anything else dask pickles
        pickle.dumps(value, protocol=5)
    except Exception as e:
        return f"a {type(value).__name__} that cannot be pickled ({type(e).__name__})"
    return None


def _plain(value: Any) -> bool:
    """A value dask sends as it is, judged at a glance (no call of :func:`unsendable`)."""
    t = type(value)
    if t is str:
        return bool(value.isascii())
    if t is int:
        return bool(-(2**63) <= value < 2**63)
    return value is None or t is float or t is bool


class AdmissionPart(Part):
    """The admission limits (module docs)."""

    name = "admission"
    refusals = (AdmissionRefused, UnsendableTask)

    def __init__(self, limits: AdmissionSettings, audit: Audit) -> None:
        self.limits = limits
        self.audit = audit
        #: is the plugin still registered (else a graph goes to dask unweighed)
        self.registered: Callable[[], bool] = lambda: True
        self._handle: tuple[Any, Any, Any] | None = None  # dask's wrapped graph handler
        self._scheduler: Any = None
        self.owner: dict[Key, str] = {}  # unfinished task -> the client whose graph made it
        self.unfinished: dict[str, int] = {}  # client -> its tasks in ``owner``
        self.refused = 0
        self._new: list[Key] = []  # the last accepted graph's new tasks, until update_graph

    def weighs(self) -> bool:
        """Is a graph weighed before dask reads it (a limit on its bytes, keys or client)?"""
        limits = self.limits
        return any(
            x is not None for x in (limits.graph_bytes, limits.graph_tasks, limits.client_tasks)
        )

    async def start(self, scheduler: Any) -> None:
        # (the plugin set the scheduler's own limits before the parts start)
        if self.weighs():
            self._scheduler = scheduler
            self._handle = dask_internals.wrap_graph_handler(scheduler, self._weigh)

    async def close(self) -> None:
        if self._scheduler is not None:
            dask_internals.unwrap_stream_handler(self._scheduler, self._handle)
            self._handle = self._scheduler = None

    # -- before dask reads a graph ----------------------------------------------------------
    def _weigh(self, client: str, keys: int, nbytes: int) -> BaseException | bool | None:
        """dask's graph handler asks: False steps aside (the plugin was unregistered)."""
        if not self.registered():
            return False
        try:
            return self.arriving(client, keys, nbytes)
        except Exception:  # never stops dask taking a graph
            self.audit.failed(self.name)
            return None

    def arriving(self, client: str, keys: int, nbytes: int) -> AdmissionRefused | None:
        """A graph of ``keys`` keys and ``nbytes`` bytes from ``client``, not read yet: the
        refusal of the first limit it is over, or None."""
        limits = self.limits
        error = None
        if limits.graph_bytes is not None and nbytes > limits.graph_bytes:
            error = over_limit(
                "the graph as sent (pickled)",
                nbytes,
                "daskjobs.admission.graph-bytes",
                limits.graph_bytes,
                "bytes",
                _SMALLER,
            )
        elif limits.graph_tasks is not None and keys > limits.graph_tasks:
            error = over_limit(
                "the keys the graph asks for",
                keys,
                "daskjobs.admission.graph-tasks",
                limits.graph_tasks,
                "tasks",
                _SPLIT,
            )
        elif limits.client_tasks is not None:
            have = self.unfinished.get(client, 0)
            if have + keys > limits.client_tasks:
                error = over_limit(
                    f"this client's unfinished tasks ({have:,}) with the graph's keys",
                    have + keys,
                    "daskjobs.admission.client-tasks",
                    limits.client_tasks,
                    "tasks",
                    "Wait for some of them to finish (or release their futures) first, or "
                    "ask the scheduler's operator to raise the limit.",
                )
        if error is not None:
            self._refused(error, client, keys)
            logger.info("daskjobs refused a submission of client %s: %s", client, error)
        return error

    # -- once dask has read a graph, before it makes its tasks ---------------------------
    def built(self, client: str, dsk: Mapping[Key, Any], keys: Collection[Key]) -> Any:
        """dask has read and ordered a graph of ``dsk`` asking for ``keys``, and asks before
        it makes any task of it: the refusal if its new tasks are over ``graph-tasks``,
        else None. O(1) a graph within the limit; over it, one lookup a task (the tasks the
        scheduler holds already are not new)."""
        limit = self.limits.graph_tasks
        if limit is None or not self.registered() or len(dsk) + len(keys) <= limit:
            return None
        tasks = self._scheduler.tasks if self._scheduler is not None else {}
        new = len(dsk) - sum(map(tasks.__contains__, dsk))
        new += sum(1 for k in keys if k not in dsk and k not in tasks)
        if new <= limit:
            return None
        error = _over_tasks(new, limit)
        self._refused(error, client, new)
        logger.info("daskjobs refused a submission of client %s: %s", client, error)
        return error

    # -- the plugin's hooks -------------------------------------------------------------------
    def check_graph(self, new: list[Any], graph: Any = None) -> None:
        limit = self.limits.graph_tasks
        if limit is not None and len(new) > limit:
            error = _over_tasks(len(new), limit)
            self._refused(error, None, len(new))
            raise error  # the plugin errs the graph's new tasks with it, and logs it
        self._check_sendable(new)

    def _check_sendable(self, new: list[Any]) -> None:
        """Refuse a graph with a task dask could not send to a worker (module docs). One
        loop over the tasks, the common values (ASCII text, small integers, flat dicts of
        them) judged inline; a layer's shared values walked once."""
        seen: set[int] = set()
        for ts in new:
            key = ts.key
            if (type(key) is str and key.isascii()) or (
                type(key) is tuple and all(map(_plain, key))
            ):
                why = None
            else:
                why = unsendable(key)
            where = "its key"
            ann = ts.annotations
            if why is None and ann:
                for name, value in ann.items():
                    if _plain(value) or id(value) in seen:
                        continue
                    if (
                        type(value) is dict
                        and all(map(_plain, value.values()))
                        and all(type(k) is str and k.isascii() for k in value)
                    ):
                        continue
                    why = unsendable(value)
                    if why is not None:
                        where = f"its annotation {name!r}"
                        break
                    seen.add(id(value))
            if why is not None:
                self.refused += 1
                self.audit.event("refused-graph", reason="unsendable", key=repr(key)[:80])
                raise UnsendableTask(
                    f"task {repr(key)[:80]}: {where} cannot be sent to a worker ({why}): "
                    "dask would break the scheduler's connection to that worker, and every "
                    "client's work there with it"
                )

    def graph(self, new: list[Any]) -> None:
        if self.limits.client_tasks is not None:
            self._new = [ts.key for ts in new]

    def update_graph(self, client: str | None, keys: Any) -> None:
        new, self._new = self._new, []
        if not new or not client:
            return
        owner = self.owner
        counted = 0
        for key in new:
            if key not in owner:
                owner[key] = client
                counted += 1
        self.unfinished[client] = self.unfinished.get(client, 0) + counted

    def wants(self, start: str, finish: str) -> bool:
        # (asked after start, when the limits are the scheduler's: a task's end counts only
        # while a client's unfinished tasks are limited)
        return self.limits.client_tasks is not None and finish in _ENDS

    def transition(self, step: Step) -> None:
        client = self.owner.pop(step.key, None)
        if client is not None:
            left = self.unfinished[client] - 1
            if left:
                self.unfinished[client] = left
            else:
                del self.unfinished[client]

    def status(self) -> dict[str, Any]:
        return {
            "admission": {
                "limits": dataclasses.asdict(self.limits),
                "refused": self.refused,
                "clients": len(self.unfinished),
                "unfinished": len(self.owner),
            }
        }

    def _refused(self, error: AdmissionRefused, client: str | None, size: int) -> None:
        self.refused += 1
        self.audit.event(
            "refused-graph", limit=error.key, value=error.limit, size=size, client=client
        )
