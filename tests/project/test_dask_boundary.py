"""Only ``daskjobs/plugin/surgery/_internals.py`` touches distributed's scheduler state privately.

The plugin steers dask through a handful of private pieces of distributed (wrapped
methods, queue promotion, slots withheld, task surgery). Each lives in one module,
:mod:`daskjobs.plugin.surgery._internals`, as a named verb checked at start, so that a dask
release that changes one is named there and nowhere else breaks silently. This test
is that promise's fence, the way tests/project/test_layering.py fences the imports: an AST
scan of every module under ``daskjobs/``.

What "private" means here
=========================

An access to an attribute of a dask ``Scheduler``, ``TaskState`` or ``WorkerState``
is private unless it is on :data:`PUBLIC`, the allowlist of what distributed documents
for plugins to read (docs "Scheduling State": a task's ``key``, ``state``,
``priority``, dependencies, restrictions, who has or wants it; a worker's address,
threads, processing set; the scheduler's ``tasks``, ``workers``, ``plugins``,
``address``, its ``log_event`` and worker-plugin registration) plus the two registries
dask's own extensions register into (``handlers`` and ``periodic_callbacks``, whose
items a plugin may add and remove). So:

* any attribute not on the list (every ``_name``, and public-looking scheduler
  machinery such as ``queued``, ``idle_task_count``, ``transitions``, ``new_task``,
  ``stream_handlers``, ``clients``) is private, read or written;
* any *write* to a listed attribute is private (``ts.priority = ...``,
  ``ts.worker_restrictions = ...``, ``del``, ``+=``), and so is changing a listed
  container in place (``ts.dependencies.discard(...)``, ``sched.workers[a] = ...``),
  except the items of a registry;
* ``getattr``/``hasattr``/``setattr``/``delattr`` with a constant name count as the
  access they spell.

Which expressions are dask objects: the house names (docs/STYLE: ``ts``/``ws`` for task
and worker states in scheduler-facing code): ``sched``, ``scheduler``,
``dask_scheduler`` (a bare name or the last attribute: ``self.scheduler``) for the
scheduler; ``ts``, ``dts``, ``cts``, ``rts``, ``qts``, ``sts`` for a task; ``ws``,
``pws`` for a worker (a parameter annotated otherwise is not one; ``client.scheduler``
is a client's RPC handle, not the scheduler); any parameter annotated
``Scheduler``, ``TaskState`` or ``WorkerState``; and what they lead to
(``sched.tasks[k]`` and ``sched.tasks.get(k)`` are tasks, ``sched.workers[a]`` and
``.get(a)`` and ``ts.processing_on`` workers). A module that names them otherwise is
not followed: the names are the house style, and the checker's own tests below pin
what it must flag and allow.

:data:`TO_MOVE` lists the modules whose accesses are still being moved into verbs
(each by the tree that owns it); every other module passes now.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import daskjobs

ROOT = Path(daskjobs.__file__).resolve().parent

#: The one module allowed to touch dask's scheduler privately.
SURGERY = "plugin/surgery/_internals.py"
#: Its worker-side sibling: the one module allowed to touch a dask worker privately (it is
#: pickled by value with the worker plugins, so it cannot live in ``_internals.py``).
WORKER_SURGERY = "plugin/surgery/_worker_internals.py"
SURGERY_MODULES = frozenset({SURGERY, WORKER_SURGERY})

#: Modules still to move their private accesses into verbs of ``_internals.py``: the
#: preemption and gang drivers (the preempt tree) and the speculation driver (the spec
#: tree) move theirs in their own work on issue 32. Remove a line when its module passes.
#: The worker-side fence (Worker, its state machine) found ``sweep/running.py``'s quiet
#: shutdown reading a worker's heartbeat callback and its connection pool: to move into
#: verbs of ``_worker_internals.py``.
TO_MOVE: frozenset[str] = frozenset()

#: Read-only attributes distributed documents for plugins, per class.
PUBLIC: dict[str, frozenset[str]] = {
    "Scheduler": frozenset(
        {
            "tasks",
            "workers",
            "plugins",
            "address",
            "log_event",
            "add_plugin",
            "remove_plugin",
            "handlers",
            "periodic_callbacks",
        }
    ),
    "TaskState": frozenset(
        {
            "key",
            "state",
            "priority",
            "annotations",
            "dependencies",
            "dependents",
            "waiting_on",
            "waiters",
            "who_has",
            "who_wants",
            "processing_on",
            "prefix",
            "group",
            "resource_restrictions",
            "worker_restrictions",
            "host_restrictions",
            "loose_restrictions",
            "retries",
            "nbytes",
            "run_id",
            "exception_text",
            "traceback_text",
            "metadata",
        }
    ),
    "WorkerState": frozenset(
        {
            "address",
            "name",
            "host",
            "nthreads",
            "memory_limit",
            "resources",
            "used_resources",
            "processing",
            "long_running",
            "executing",
            "has_what",
            "status",
            "last_seen",
            "nanny",
            "pid",
        }
    ),
    # the worker side: a ``distributed.Worker`` (``dask_worker``, ``get_worker()``, or a
    # parameter annotated ``Worker``), its state machine (``Worker.state``, here
    # "WorkerMachine") and that machine's tasks ("WorkerTask")
    "Worker": frozenset(
        {
            "address",
            "name",
            "id",
            "nthreads",
            "state",
            "plugins",
            "log_event",
            "loop",
            "handlers",
            "stream_handlers",
        }
    ),
    "WorkerMachine": frozenset({"tasks", "nthreads", "total_resources"}),
    "WorkerTask": frozenset(
        {"key", "state", "priority", "run_id", "annotations", "dependencies", "dependents"}
    ),
}

#: Scheduler and worker attributes whose items a plugin may add and remove (dask's
#: extensions and worker plugins do).
REGISTRIES = frozenset({"handlers", "periodic_callbacks", "stream_handlers"})

#: Methods that change a container in place.
MUTATORS = frozenset(
    {
        "add",
        "discard",
        "remove",
        "pop",
        "popitem",
        "clear",
        "update",
        "append",
        "extend",
        "insert",
        "setdefault",
        "difference_update",
        "intersection_update",
        "symmetric_difference_update",
        "__setitem__",
        "__delitem__",
    }
)

_SCHEDULER_NAMES = frozenset({"sched", "scheduler", "dask_scheduler"})
_TASK_NAMES = frozenset({"ts", "dts", "cts", "rts", "qts", "sts"})
_WORKER_NAMES = frozenset({"ws", "pws"})
_WORKER_PROCESS_NAMES = frozenset({"dask_worker"})
_CLASSES = frozenset(PUBLIC)


@dataclass(frozen=True)
class Finding:
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.line}: {self.what}"


def _annotation_class(node: ast.expr | None) -> str | None:
    """``Scheduler``/``TaskState``/``WorkerState`` if the annotation names one of them
    (``Scheduler``, ``distributed.scheduler.Scheduler``, ``"Scheduler | None"``)."""
    if node is None:
        return None
    text = node.value if isinstance(node, ast.Constant) else ast.unparse(node)
    if not isinstance(text, str):
        return None
    for word in re.findall(r"[A-Za-z_][A-Za-z_0-9.]*", text):
        last = word.rsplit(".", 1)[-1]
        if last in _CLASSES:
            return last
    return None


def _is_any(node: ast.expr) -> bool:
    """``Any`` (or ``"Any"``) tells nothing: the house name decides."""
    text = node.value if isinstance(node, ast.Constant) else ast.unparse(node)
    return text in ("Any", "typing.Any")


def _is_client(node: ast.expr) -> bool:
    """``client.scheduler`` is a client's RPC handle, not the scheduler."""
    return isinstance(node, ast.Name) and node.id in ("client", "c")


class _Scan(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found: list[Finding] = []
        # per function scope: parameter -> its dask class (None: annotated as something else)
        self.annotated: list[dict[str, str | None]] = [{}]

    # -- which expressions are dask objects ------------------------------------------
    def kind(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            for scope in reversed(self.annotated):
                if node.id in scope:
                    return scope[node.id]
            return self._by_name(node.id)
        if isinstance(node, ast.Attribute):
            inner = self.kind(node.value)
            if inner == "TaskState" and node.attr == "processing_on":
                return "WorkerState"
            if inner == "Worker" and node.attr == "state":
                return "WorkerMachine"
            if inner is None and node.attr in _SCHEDULER_NAMES and not _is_client(node.value):
                return "Scheduler"
            return None
        if isinstance(node, ast.Subscript):  # sched.tasks[k], sched.workers[a]
            return self._element(node.value)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
        ):
            return self._element(node.func.value)
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("get_worker"):
            return "Worker"
        return None

    def _element(self, container: ast.expr) -> str | None:
        if not isinstance(container, ast.Attribute):
            return None
        owner = self.kind(container.value)
        if owner == "Scheduler":
            return {"tasks": "TaskState", "workers": "WorkerState"}.get(container.attr)
        if owner == "WorkerMachine" and container.attr == "tasks":
            return "WorkerTask"
        return None

    @staticmethod
    def _by_name(name: str) -> str | None:
        if name in _SCHEDULER_NAMES:
            return "Scheduler"
        if name in _TASK_NAMES:
            return "TaskState"
        if name in _WORKER_NAMES:
            return "WorkerState"
        if name in _WORKER_PROCESS_NAMES:
            return "Worker"
        return None

    # -- scopes: annotated parameters ---------------------------------------------------
    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        scope: dict[str, str | None] = {}
        args = node.args
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            if a.annotation is not None and not _is_any(a.annotation):
                scope[a.arg] = _annotation_class(a.annotation)
        self.annotated.append(scope)
        self.generic_visit(node)
        self.annotated.pop()

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function
    visit_Lambda = _function

    def visit_Assign(self, node: ast.Assign) -> None:
        # ``scheduler = client.scheduler``: the name is the client's RPC handle here
        value = node.value
        if isinstance(value, ast.Attribute) and _is_client(value.value):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.annotated[-1][target.id] = None
        self.generic_visit(node)

    # -- accesses -----------------------------------------------------------------------
    def flag(self, node: ast.AST, what: str) -> None:
        self.found.append(Finding(getattr(node, "lineno", 0), what))

    def _access(self, node: ast.AST, obj: ast.expr, attr: str, write: bool) -> None:
        cls = self.kind(obj)
        if cls is None:
            return
        if attr not in PUBLIC[cls]:
            self.flag(node, f"{'writes' if write else 'reads'} private {cls}.{attr}")
        elif write:
            self.flag(node, f"writes {cls}.{attr}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._access(node, node.value, node.attr, isinstance(node.ctx, ast.Store | ast.Del))
        self.generic_visit(node)

    def _container_write(self, node: ast.AST, target: ast.expr, how: str) -> None:
        """``target`` (an attribute of a dask object) is changed in place."""
        if not isinstance(target, ast.Attribute):
            return
        cls = self.kind(target.value)
        if cls is None or target.attr not in PUBLIC[cls]:
            return  # not dask's, or flagged as a private read already
        if cls in ("Scheduler", "Worker") and target.attr in REGISTRIES:
            return
        self.flag(node, f"changes {cls}.{target.attr} in place ({how})")

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Store | ast.Del):
            self._container_write(node, node.value, "item assignment")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in MUTATORS:
            self._container_write(node, func.value, f".{func.attr}()")
        if (
            isinstance(func, ast.Name)
            and func.id in ("getattr", "hasattr", "setattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            write = func.id in ("setattr", "delattr")
            self._access(node, node.args[0], node.args[1].value, write)
        self.generic_visit(node)


def private_accesses(source: str) -> list[Finding]:
    """Every private access to a dask scheduler, task or worker state in ``source``."""
    scan = _Scan()
    scan.visit(ast.parse(source))
    return sorted(scan.found, key=lambda f: f.line)


def modules() -> dict[str, Path]:
    return {p.relative_to(ROOT).as_posix(): p for p in sorted(ROOT.rglob("*.py"))}


# -- the checker catches what it must --------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "sched._set_priorities = f",
        "scheduler._set_priorities(**kw)",
        "self.scheduler._daskjobs_wrapped = None",
        "x = getattr(sched, '_daskjobs_wrapped', None)",
        "setattr(scheduler, 'anything', 1)",
        "sched.queued.discard(ts)",
        "for ts in sched.queued: pass",
        "sched.idle_task_count.discard(ws)",
        "sched.check_idle_saturated(ws)",
        "sched.transitions(recs, 'stim')",
        "sched.stream_handlers['log-event'] = h",
        "sched.clients['x'] = c",
        "getattr(sched, 'WORKER_SATURATION', 1.0)",
        "ts.priority = (0, 1, 2)",
        "ts.priority += (1,)",
        "del ts.priority",
        "cts.worker_restrictions = {a}",
        "ts.dependencies.discard(dts)",
        "ts.waiters.add(other)",
        "ts.run_spec",
        "ts._queueable",
        "ws.processing.add(ts)",
        "ws.occupancy",
        "sched.tasks['k'].priority = p",
        "sched.tasks.get(k).priority = p",
        "sched.workers.get(a).processing.clear()",
        "ts.processing_on.occupancy",
        "sched.workers['a'] = ws",
        "self.scheduler.tasks.pop(k)",
        "def f(s: Scheduler):\n    s.queued.peek()\n",
        "def f(t: 'TaskState | None'):\n    t.priority = p\n",
        "def f(w: distributed.scheduler.WorkerState):\n    w.occupancy\n",
        "lambda dask_scheduler: dask_scheduler.queued",
        "def f(w: Worker):\n    w.state.ready.discard(x)\n",
        "def f(w: 'distributed.Worker'):\n    w.state.tasks['k'].priority = p\n",
        "def f(w: Worker):\n    w.state.tasks.get(k).priority = p\n",
        "dask_worker.state.constrained",
        "get_worker().state.ready.pop()",
        "def f(w: Worker):\n    w.batched_stream.send(m)\n",
    ],
)
def test_checker_flags_private_access(source: str) -> None:
    assert private_accesses(source), source


@pytest.mark.parametrize(
    "source",
    [
        "sched.tasks.get(k)",
        "ts = sched.tasks[k]\nts.state, ts.key, ts.priority, ts.annotations",
        "[d.key for d in ts.dependencies]",
        "ts.prefix.name",
        "ts.processing_on.address",
        "len(ws.processing) / ws.nthreads",
        "for ws in sched.workers.values(): ws.address",
        "sched.log_event('daskjobs', msg)",
        "sched.handlers['daskjobs_status'] = f",
        "sched.periodic_callbacks['daskjobs-history'] = pc",
        "sched.periodic_callbacks.pop('daskjobs-history', None)",
        "sched.plugins.items()",
        "getattr(sched, 'address', None)",
        "getattr(ts, 'run_id', None)",
        "self.tasks[k] = v",  # not dask's: the plugin's own map
        "self.held.discard(k)",
        "pts.add(x)",  # a name that is not a house name of a task state is not followed
        "stamp = t.start",
        "def f(x: int):\n    x.real\n",
        "def f(ts: LiveTask):\n    ts.estimate\n",
        "client.sync(client.scheduler.get_task_status, keys=[k])",
        "def f(client):\n    scheduler = client.scheduler\n    scheduler.get_task_status\n",
        "def f(w: Worker):\n    w.stream_handlers['op'] = h\n    w.log_event('t', {})\n",
        "def f(w: Worker):\n    w.stream_handlers.pop('op', None)\n",
        "def f(w: Worker):\n    t = w.state.tasks.get(k)\n    t.run_id, t.state\n",
        "dask_worker.plugins['daskjobs-reorderer'].reordered",
        "get_worker().address",
    ],
)
def test_checker_allows_public_reads(source: str) -> None:
    assert not private_accesses(source), source


def test_checker_names_the_line_and_the_access() -> None:
    found = private_accesses("x = 1\nsched.queued.discard(ts)\nts.priority = p\n")
    assert [str(f) for f in found] == [
        "2: reads private Scheduler.queued",
        "3: writes TaskState.priority",
    ]


# -- the real modules -------------------------------------------------------------------


@pytest.mark.slow
def test_only_the_internals_module_touches_dask_privately() -> None:
    mods = modules()
    assert SURGERY in mods and "plugin/plugin.py" in mods
    bad = [
        f"daskjobs/{name}:{f}"
        for name, path in mods.items()
        if name not in SURGERY_MODULES and name not in TO_MOVE
        for f in private_accesses(path.read_text(encoding="utf-8"))
    ]
    assert not bad, "private dask accesses outside the surgery modules:\n" + "\n".join(bad)


def test_the_modules_still_to_move_exist_and_still_need_to() -> None:
    """A module on TO_MOVE that no longer touches dask privately leaves the list."""
    mods = modules()
    for name in TO_MOVE:
        assert name in mods, f"{name} is on TO_MOVE but does not exist"
        assert private_accesses(mods[name].read_text(encoding="utf-8")), (
            f"daskjobs/{name} touches dask only through verbs now: remove it from TO_MOVE"
        )


def test_the_internals_module_is_where_the_accesses_are() -> None:
    found = private_accesses((ROOT / SURGERY).read_text(encoding="utf-8"))
    whats = {f.what for f in found}
    assert "writes TaskState.priority" in whats
    assert any("Scheduler._set_priorities" in w for w in whats)


def test_the_worker_internals_module_is_where_the_worker_accesses_are() -> None:
    found = private_accesses((ROOT / WORKER_SURGERY).read_text(encoding="utf-8"))
    whats = {f.what for f in found}
    assert "reads private WorkerMachine.ready" in whats
    assert "reads private WorkerMachine.constrained" in whats
    # (``ts = state.tasks.get(k)``: the house name ``ts`` is what the checker follows)
    assert whats & {"writes TaskState.priority", "writes WorkerTask.priority"}, whats
