"""dask's task and worker states as the policies see them.

The plugin adapts each ``TaskState`` to a :class:`LiveTask` (a
:class:`~daskjobs.policies.TaskView`), each run on a worker to a
:class:`LiveAttempt` (an :class:`~daskjobs.policies.AttemptView`), and a free slot
to a node view; the policies never see dask's objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dask.typing import Key

__all__ = ["ANY_NODE", "OUTCOME", "LiveAttempt", "LiveTask", "Slot", "stage_of"]


@dataclass(frozen=True, slots=True)
class LiveTask:
    """A ``TaskState`` as the policies see it (a :class:`~daskjobs.policies.TaskView`)."""

    tid: Key
    estimate: float
    cores: int
    team: str
    submit: float
    deps: tuple[Key, ...]
    source: str  # where the estimate came from
    stage: str
    speculate: bool = True  # the task's ``speculate`` annotation
    job_class: str = "be"  # the task's ``job_class`` annotation: "te" (interactive) or "be"

    @property
    def estimated(self) -> bool:
        """A real estimate (annotation or measured history), not the configured default."""
        return self.source != "default"


@dataclass(slots=True, eq=False)
class LiveAttempt:
    """One run of a task on a worker (an :class:`~daskjobs.policies.AttemptView`)."""

    task: LiveTask
    node: int
    start: float
    end: float = float("nan")
    outcome: str | None = None
    backup: bool = False


class _AnyNode:
    """The slot a released task will take: dask picks the worker, so any fits."""

    index = -1
    cores = 1 << 30
    free = 1 << 30


ANY_NODE = _AnyNode()


class Slot:
    """One free thread on the worker the policies call node ``index``."""

    __slots__ = ("index",)
    cores = 1
    free = 1

    def __init__(self, index: int) -> None:
        self.index = index


#: The outcome an attempt has, for the policies, by the state its task left processing for.
OUTCOME = {"memory": "done", "erred": "failed"}


def stage_of(ts: Any) -> str:
    """A task's stage: its ``stage`` annotation, else dask's task prefix."""
    ann = ts.annotations
    if ann and "stage" in ann:
        return str(ann["stage"])
    return str(ts.prefix.name)
