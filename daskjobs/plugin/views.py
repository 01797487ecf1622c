"""dask's task and worker states as the policies see them.

The plugin adapts each ``TaskState`` to a :class:`LiveTask` (a
:class:`~daskjobs.policies.TaskView`), each run on a worker to a
:class:`LiveAttempt` (an :class:`~daskjobs.policies.AttemptView`), and a free slot
to a node view; the policies never see dask's objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from daskjobs.policies.base import renamed_attribute

if TYPE_CHECKING:
    from dask.typing import Key

__all__ = ["ANY_NODE", "OUTCOME", "LiveAttempt", "LiveTask", "Slot", "stage_of"]


@dataclass(slots=True, unsafe_hash=True)
class LiveTask:
    """A ``TaskState`` as the policies see it (a :class:`~daskjobs.policies.TaskView`).

    Never changed once made: a new estimate is a new view (:meth:`reestimated`). Not
    ``frozen``, all the same (hashed and compared as a frozen one, ``params`` left
    out): a frozen dataclass sets each of its fourteen fields through a call to
    ``object.__setattr__``, and the scheduler's hooks make a view per task."""

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
    # every team whose graphs want the task, when several do (its own team first); empty:
    # its own team alone. Fair share splits its cores among them (Ranker.share)
    teams: tuple[str, ...] = ()
    # the estimate's 10-90% band (seconds), when a duration model or history gave it
    # (TaskView's optional field ``band``: speculation judges lateness against its top)
    band: tuple[float, float] | None = None
    # the observations behind a model's or history's estimate
    samples: int = 0
    # the task's ``params`` annotation (what its stage's duration model reads)
    params: Mapping[str, Any] | None = field(default=None, compare=False)

    @property
    def estimated(self) -> bool:
        """A real estimate (annotation or measured history), not the configured default
        (nor the default scaled by a size-like argument's prior)."""
        return self.source != "default" and self.source != "prior"

    def reestimated(
        self, estimate: float, source: str, band: tuple[float, float] | None, samples: int
    ) -> LiveTask:
        """This view with a new estimate (``dataclasses.replace`` of those four fields,
        written out: a stage's re-estimate makes one per waiting task, and ``replace``
        costs five times as much)."""
        return LiveTask(
            self.tid,
            estimate,
            self.cores,
            self.team,
            self.submit,
            self.deps,
            source,
            self.stage,
            self.speculate,
            self.job_class,
            self.teams,
            band,
            samples,
            self.params,
        )


@dataclass(slots=True, eq=False)
class LiveAttempt:
    """One run of a task on a worker (an :class:`~daskjobs.policies.AttemptView`)."""

    task: LiveTask
    node: int
    start: float
    end: float = float("nan")
    outcome: str | None = None
    backup: bool = False
    policy_state: Any = None  # the policy's own (AttemptView.policy_state)

    books = renamed_attribute("attempt.books")


class _AnyNode:
    """The slot a released task will take: dask picks the worker, so any fits."""

    index = -1
    cores = 1 << 30
    free = 1 << 30


ANY_NODE = _AnyNode()


class Slot:
    """One free slot on the worker the policies call node ``index``.

    With ``worker`` (dask's ``WorkerState``), ``tasks`` (the ranked tasks' views) and
    ``taken`` (tasks already chosen for that worker's other slots in the same walk), the
    slot also tells a policy how much work waits on the worker ahead of it
    (:attr:`waiting`): dask hands a worker ``ceil(worker-saturation x threads)`` tasks,
    so a slot beyond its threads starts only once the tasks ahead of it have.
    """

    __slots__ = ("_taken", "_tasks", "_worker", "index")
    cores = 1
    free = 1

    def __init__(
        self,
        index: int,
        worker: Any = None,
        tasks: Mapping[Key, LiveTask] | None = None,
        taken: int = 0,
    ) -> None:
        self.index = index
        self._worker = worker
        self._tasks = tasks
        self._taken = taken

    @property
    def waiting(self) -> float:
        """Nominal seconds of work (estimates) on the worker waiting for its threads ahead
        of this slot's task: the tasks it holds beyond its threads, each at the mean
        estimate of the ranked tasks it holds (which of them still wait is the worker's
        to know). 0 with a free thread. O(tasks on the worker), computed when asked."""
        ws = self._worker
        if ws is None or self._tasks is None:
            return 0.0
        beyond = len(ws.processing) + self._taken - ws.nthreads
        if beyond <= 0:
            return 0.0
        tasks = self._tasks
        total = 0.0
        counted = 0
        for ts in ws.processing:
            v = tasks.get(ts.key)
            if v is not None:
                total += v.estimate * v.cores
                counted += 1
        return beyond * total / counted if counted else 0.0


#: The outcome an attempt has, for the policies, by the state its task left processing for.
OUTCOME = {"memory": "done", "erred": "failed"}


def stage_of(ts: Any) -> str:
    """A task's stage: its ``stage`` annotation, else dask's task prefix."""
    ann = ts.annotations
    if ann and "stage" in ann:
        return str(ann["stage"])
    return str(ts.prefix.name)
