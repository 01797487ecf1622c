"""The simulator and the policies never touch ``distributed``.

Policies run in three places (simulator, scheduler plugin, replay); the
offline simulator must import and run without a dask cluster. An AST scan of
every module under ``daskjobs/policies`` and ``daskjobs/sim`` (including
imports inside functions), followed through every ``daskjobs`` module they
import, plus a fresh interpreter that imports them and looks at
``sys.modules``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import daskjobs

ROOT = Path(daskjobs.__file__).resolve().parent
LAYERS = ("policies", "sim")
FORBIDDEN_PACKAGES = ("distributed",)
FORBIDDEN_DASKJOBS = ("daskjobs.plugin", "daskjobs.cache")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, imported module) for every import in ``source``, relative ones resolved.

    ``from a import b`` yields both ``a`` and ``a.b`` (``b`` may be a module).
    """
    package = module if is_package else module.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            out.extend((node.lineno, f"{mod}.{alias.name}") for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.append((node.lineno, node.args[0].value))
    return out


def is_forbidden(mod: str) -> bool:
    parts = mod.split(".")
    if parts[0] in FORBIDDEN_PACKAGES or mod == "dask.distributed":
        return True
    if mod.startswith("dask.distributed."):
        return True
    return mod.startswith(FORBIDDEN_DASKJOBS)  # daskjobs.plugin*, daskjobs.cache*


def module_path(mod: str) -> Path | None:
    """The source file of daskjobs module ``mod``, or None if it is not one."""
    if mod != "daskjobs" and not mod.startswith("daskjobs."):
        return None
    rel = Path(*mod.split("."))
    for candidate in (ROOT.parent / rel / "__init__.py", ROOT.parent / rel.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def layer_files() -> list[Path]:
    files = sorted(p for layer in LAYERS for p in (ROOT / layer).rglob("*.py"))
    assert files, "no modules found under daskjobs/policies or daskjobs/sim"
    return files


def violations(start: list[Path]) -> list[str]:
    """Forbidden imports in ``start`` and in every daskjobs module they reach."""
    found: list[str] = []
    seen: set[Path] = set()
    todo = list(start)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        mod = module_name(path)
        for line, imported in imports_of(
            path.read_text(encoding="utf-8"), mod, path.name == "__init__.py"
        ):
            if is_forbidden(imported):
                found.append(f"{path.relative_to(ROOT.parent)}:{line} imports {imported}")
            target = module_path(imported)
            if target is not None:
                todo.append(target)
            # importing a submodule runs its parents' __init__ too
            parts = imported.split(".")
            for k in range(1, len(parts)):
                parent = module_path(".".join(parts[:k]))
                if parent is not None:
                    todo.append(parent)
    return found


# -- the checker itself catches what it must --------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "import distributed",
        "import distributed.scheduler as s",
        "from distributed import Client",
        "from distributed.diagnostics.plugin import SchedulerPlugin",
        "from dask import distributed",
        "import dask.distributed",
        "def f():\n    from distributed import Client\n",
        "import importlib\nimportlib.import_module('distributed')",
        "from daskjobs.plugin import Plugin",
        "from daskjobs import plugin",
        "from daskjobs.cache import Store",
        "from ..cache import Store",
        "from .. import plugin",
    ],
)
def test_checker_flags_forbidden_import(source):
    found = [m for _, m in imports_of(source, "daskjobs.sim.engine", False) if is_forbidden(m)]
    assert found, source


@pytest.mark.parametrize(
    "source",
    [
        "import dask",
        "import numpy as np",
        "from daskjobs.policies.base import Policy",
        "from . import model",
        "from ..policies import FIFO",
        "import heapq",
    ],
)
def test_checker_allows_other_imports(source):
    found = [m for _, m in imports_of(source, "daskjobs.sim.engine", False) if is_forbidden(m)]
    assert not found, source


def test_relative_imports_are_resolved():
    got = [m for _, m in imports_of("from ..policies import FIFO", "daskjobs.sim.engine", False)]
    assert got == ["daskjobs.policies", "daskjobs.policies.FIFO"]
    got = [m for _, m in imports_of("from .engine import simulate", "daskjobs.sim", True)]
    assert got == ["daskjobs.sim.engine", "daskjobs.sim.engine.simulate"]


# -- the real modules -------------------------------------------------------------------------


@pytest.mark.parametrize("layer", LAYERS)
def test_layer_has_no_distributed_import(layer):
    files = sorted((ROOT / layer).rglob("*.py"))
    assert files
    bad = [
        f"{p.name}:{line} imports {m}"
        for p in files
        for line, m in imports_of(
            p.read_text(encoding="utf-8"), module_name(p), p.name == "__init__.py"
        )
        if is_forbidden(m)
    ]
    assert not bad, "\n".join(bad)


def test_no_daskjobs_module_reached_from_sim_or_policies_imports_distributed():
    assert not violations(layer_files()), "\n".join(violations(layer_files()))


def test_scan_reaches_the_modules_it_should():
    # the walk follows sim -> policies and up to daskjobs/__init__.py
    reached: set[str] = set()
    for p in layer_files():
        source = p.read_text(encoding="utf-8")
        for _, m in imports_of(source, module_name(p), p.name == "__init__.py"):
            if module_path(m) is not None:
                reached.add(m)
    assert "daskjobs.policies.base" in reached
    assert "daskjobs.sim.model" in reached


IMPORT_SCRIPT = """
import sys
import daskjobs.sim
import daskjobs.policies
import daskjobs.sim.workloads
from daskjobs.sim import simulate, Task, Cluster, LPT
simulate([Task("a", 1.0)], Cluster(1, 1), LPT())
bad = sorted(m for m in sys.modules if m == "distributed" or m.startswith("distributed.")
             or m.startswith("daskjobs.plugin") or m.startswith("daskjobs.cache"))
print(",".join(bad))
"""


def test_importing_the_simulator_does_not_load_distributed():
    run = subprocess.run(
        [sys.executable, "-c", IMPORT_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "", f"loaded: {run.stdout.strip()}"


# -- the plugin's rooms --------------------------------------------------------------------

PLUGIN = ROOT / "plugin"
#: The plugin's rooms (docs/explanation/architecture.md); its top level is the core.
ROOMS = frozenset({"surgery", "enact", "workers", "observe", "client"})


def _room(mod: str) -> str | None:
    """The room of daskjobs.plugin module ``mod`` (``core`` for its top level), else None."""
    parts = mod.split(".")
    if parts[:2] != ["daskjobs", "plugin"]:
        return None
    return parts[2] if len(parts) > 2 and parts[2] in ROOMS else "core"


def test_the_plugin_rooms_import_what_their_names_promise():
    """surgery/ imports no other room; workers/ (pickled by value onto the workers) only
    the worker surgery; enact/ is loaded only where a part is composed (no module outside
    it imports it at module level: TYPE_CHECKING blocks and function bodies are not)."""
    bad = []
    for path in sorted(PLUGIN.rglob("*.py")):
        mod, rel = module_name(path), path.relative_to(ROOT.parent)
        room = _room(mod)
        source = path.read_text(encoding="utf-8")
        for line, imported in imports_of(source, mod, path.name == "__init__.py"):
            if room == "surgery" and _room(imported) not in (None, "surgery"):
                bad.append(f"{rel}:{line} (surgery) imports {imported}")
            if room == "workers" and imported.startswith("daskjobs"):
                ok = (
                    _room(imported) == "workers"
                    or imported.startswith("daskjobs.plugin.surgery._worker_internals")
                    or imported == "daskjobs.plugin.surgery"
                )
                if not ok:
                    bad.append(f"{rel}:{line} (workers) imports {imported}")
        if room == "enact":
            continue
        for node in ast.parse(source).body:  # module level only
            if isinstance(node, ast.ImportFrom | ast.Import):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
                bad += [f"{rel}:{node.lineno} imports {n}" for n in names if _room(n) == "enact"]
    assert not bad, "\n".join(bad)
    assert {p.parent.name for p in PLUGIN.glob("*/__init__.py")} == ROOMS
